//! Block devices whose O_DIRECT memory alignment the kernel misreports.
//!
//! zram reports `dio_mem_align` 512 (its queue's `dma_alignment` is 511) but
//! moves the bytes of the page-rounded address for memory that is not
//! page-aligned: a direct write from `buffer + 512` stores the bytes at
//! `buffer + 4096` (Linux 6.18; docs/striping.md). For files on such a
//! device, or the device itself, memory must be page-aligned to go direct;
//! other memory goes through the file's buffered descriptor (the page
//! cache). The driver of a major number is learnt once from `/proc/devices`
//! and kept (lock-free, so fork-safe). Not seen through: zram under another
//! layer (overlayfs reports major 0; a loop device, device-mapper or md
//! report their own driver).

use std::sync::atomic::{AtomicU8, Ordering};

/// Block drivers whose direct I/O needs page-aligned memory, whatever
/// statx says.
const PAGE_ALIGNED_MEMORY_DRIVERS: [&str; 1] = ["zram"];

/// Majors with a cached answer (block majors are below 512 in practice).
const CACHED_MAJORS: usize = 4096;
const UNKNOWN: u8 = 0;
const PLAIN: u8 = 1;
const NEEDS_PAGE_ALIGNED_MEMORY: u8 = 2;

static BY_MAJOR: [AtomicU8; CACHED_MAJORS] = [const { AtomicU8::new(UNKNOWN) }; CACHED_MAJORS];

/// The memory alignment direct I/O really needs on the block device
/// `major` (a file's `st_dev` major, or a device node's `st_rdev` major)
/// when statx reported `reported`.
pub(crate) fn memory_alignment(major: u32, reported: usize) -> usize {
    if needs_page_aligned_memory(major) {
        reported.max(crate::pinned::page_size())
    } else {
        reported
    }
}

fn needs_page_aligned_memory(major: u32) -> bool {
    // Major 0: anonymous devices (tmpfs, overlayfs, btrfs subvolumes): no driver.
    if major == 0 {
        return false;
    }
    let cached = BY_MAJOR.get(major as usize);
    match cached.map(|c| c.load(Ordering::Relaxed)) {
        Some(PLAIN) => return false,
        Some(NEEDS_PAGE_ALIGNED_MEMORY) => return true,
        _ => {}
    }
    // Kept whatever the answer, an unreadable /proc/devices too: this runs
    // on every op's open, which must not read a file each time.
    let quirky = block_driver_of(major).is_some_and(|driver| PAGE_ALIGNED_MEMORY_DRIVERS.contains(&driver.as_str()));
    if let Some(c) = cached {
        c.store(if quirky { NEEDS_PAGE_ALIGNED_MEMORY } else { PLAIN }, Ordering::Relaxed);
    }
    quirky
}

/// The block driver registered for `major`, from /proc/devices (`None`
/// when it cannot be read, or names no such major).
fn block_driver_of(major: u32) -> Option<String> {
    let devices = std::fs::read_to_string("/proc/devices").ok()?;
    block_driver_in(&devices, major)
}

/// [`block_driver_of`] on the text of /proc/devices.
fn block_driver_in(devices: &str, major: u32) -> Option<String> {
    let block = devices.split("Block devices:").nth(1)?;
    block.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let number = fields.next()?.parse::<u32>().ok()?;
        (number == major).then(|| fields.next().map(str::to_string)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICES: &str = "Character devices:\n  1 mem\n253 zram-char\n\nBlock devices:\n  7 loop\n253 zram\n254 virtblk\n259 blkext\n";

    #[test]
    fn the_driver_comes_from_the_block_section() {
        assert_eq!(block_driver_in(DEVICES, 253).as_deref(), Some("zram"));
        assert_eq!(block_driver_in(DEVICES, 7).as_deref(), Some("loop"));
        assert_eq!(block_driver_in(DEVICES, 1), None, "a character major is not a block driver");
        assert_eq!(block_driver_in("garbage", 7), None);
    }
}
