//! Direct I/O on zram from pinned memory that is 512-byte aligned but not
//! page-aligned (a slice of a locked tensor, as DeepSpeed's swap buffers pack
//! them at 1 KiB multiples). zram reports a memory alignment of 512 but moves
//! the bytes of the page-rounded address (`src/file/device_quirks.rs`), so
//! such memory must bounce there: every byte written is checked with
//! pread(2), every byte read against the source, on the device node itself
//! and on a file of ext4 on it.
//!
//! Needs root and zram (`/sys/class/zram-control`, or `modprobe zram`);
//! without them each test says why and returns. The ext4 half also needs
//! mkfs.ext4 and mount.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::zram::Zram;
use deepnvme::FileTarget;

/// Offsets into a page that are 512-byte aligned: the memory zram takes.
const SUB_PAGE_OFFSETS: [usize; 3] = [512, 1024, 3584];
const LEN: usize = 64 << 10;

/// Writes `LEN` bytes from each sub-page offset of pinned memory to offset 0
/// of `target`, checks them with pread(2), then reads them back into the
/// same offset of zeroed pinned memory.
fn round_trip_from_sub_page_memory(target: &Path, what: &str) {
    for engine in engines() {
        for parallelism in [1, 2] {
            let h = handle_with(engine, 1 << 20, 8, false, true, parallelism);
            for off in SUB_PAGE_OFFSETS {
                let case = format!("{what}, {engine:?}, parallelism {parallelism}, memory at page + {off}");
                let data = pattern(off as u64 + parallelism as u64, 2 * LEN);
                let src = Pinned::with(&data);
                let wrote = ds::pwrite(&h, src.narrow(off, LEN), FileTarget::Path(target), 0, false);
                assert_eq!(wrote.unwrap_or_else(|e| panic!("{case}: write: {e}")), 1);
                let mut got = vec![0u8; LEN];
                File::open(target).unwrap().read_exact_at(&mut got, 0).expect("pread(2) of the target");
                assert_bytes_eq(&got, &data[off..off + LEN], &format!("{case}: the bytes written"));

                let dst = Pinned::with(&vec![0u8; 2 * LEN]);
                let read = ds::pread(&h, dst.narrow(off, LEN), FileTarget::Path(target), 0, false);
                assert_eq!(read.unwrap_or_else(|e| panic!("{case}: read: {e}")), 1);
                assert_bytes_eq(&dst.as_slice()[off..off + LEN], &data[off..off + LEN], &format!("{case}: the bytes read"));
                assert!(dst.as_slice()[..off].iter().all(|&b| b == 0), "{case}: bytes before the slice were written");
            }
        }
    }
}

#[test]
fn sub_page_pinned_memory_moves_the_right_bytes_on_a_zram_device() {
    let Some(zram) = Zram::for_test("zram-dev") else { return };
    round_trip_from_sub_page_memory(&zram.device(), "the zram device node");
}

#[test]
fn sub_page_pinned_memory_moves_the_right_bytes_on_ext4_on_zram() {
    let Some(mut zram) = Zram::for_test("zram-ext4") else { return };
    let Some(mnt) = zram.mount_ext4() else { return };
    let file = mnt.join("f.bin");
    std::fs::write(&file, vec![0u8; 2 * LEN]).expect("laying out the file");
    round_trip_from_sub_page_memory(&file, "a file of ext4 on zram");
}
