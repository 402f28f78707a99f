//! A striped file's extent (the logical bytes its members hold): growing
//! it before a write past it, under the placeholder's lock, without losing
//! bytes another program appended to the placeholder; and reading logical
//! bytes back with plain reads (DeepSpeed's `validate`, `deepnvme stripe cat`).

use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::file::open_raw;

use super::file::{err, fd_size, other, truncate, StripedFile};
use super::layout::Layout;
use super::manifest::Manifest;
use super::mark::{self, Locked, Mark};

/// A placeholder another program truncated below its striped extent: the
/// bytes past its new end are gone, so they are cut from the member files
/// and the mark records the new extent, so that they cannot come back when
/// the file grows again. The caller holds the placeholder's lock. Returns
/// the extent now.
fn cut_to_truncated_size(placeholder: RawFd, manifest: &Manifest, mark: &Mark, size: u64, logical: &Path) -> Result<u64> {
    let layout = manifest.layout();
    for (i, dir) in manifest.members.iter().enumerate() {
        let path = dir.join(&mark.relpath);
        let keep = layout.member_size(i, size);
        let fd = match open_raw(&path, libc::O_WRONLY, 0) {
            Ok(fd) => fd,
            // Nothing of it to cut.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(err(&path, "opening stripe member to cut it to its truncated size", e)),
        };
        let cut = cut_member(fd, keep, &path);
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(fd) };
        cut?;
    }
    let mark = Mark { extent: size, ..mark.clone() };
    mark::write(placeholder, &mark).map_err(|e| err(logical, "marking stripe placeholder", e))?;
    Ok(size)
}

/// Cuts the member file open on `fd` to `keep` bytes where it is longer.
fn cut_member(fd: RawFd, keep: u64, path: &Path) -> Result<()> {
    if fd_size(fd).map_err(|e| err(path, "fstat of", e))? > keep {
        truncate(fd, keep).map_err(|e| err(path, "cutting stripe member to its file's extent", e))?;
    }
    Ok(())
}

impl StripedFile {
    /// Before an op uses the file: a truncation by another program (the
    /// placeholder's `size` below the mark's extent) is made permanent
    /// (`cut_to_truncated_size`, under the placeholder's lock), and the op
    /// uses the extent that leaves. Where that cannot be done (no write
    /// permission, a read-only member) the op still uses the truncated size.
    pub(super) fn settle_truncation(&mut self, placeholder: RawFd, size: u64) -> Result<()> {
        if size >= self.mark.extent {
            return Ok(());
        }
        let logical = self.logical.clone();
        let cut = (|| {
            let _lock = Locked::take(placeholder).map_err(|e| err(&logical, "locking stripe placeholder", e))?;
            let now = mark::read(placeholder).ok().flatten().filter(|m| m.id == self.mark.id);
            let size = fd_size(placeholder).map_err(|e| err(&logical, "fstat of", e))?;
            match now {
                Some(now) if size < now.extent => {
                    cut_to_truncated_size(placeholder, &self.manifest, &now, size, &logical).map(|e| (e, true))
                }
                Some(now) => Ok((now.extent, false)),
                None => Ok((size.min(self.mark.extent), false)),
            }
        })();
        let said = format!(
            "{} was truncated to {size} bytes by another program after {} of its bytes were striped",
            logical.display(),
            self.mark.extent
        );
        self.extent = match cut {
            Ok((extent, cut)) => {
                if cut {
                    crate::rt::log::info(&format!("{said}; its striped bytes past that were cut from its members"));
                }
                extent
            }
            Err(e) => {
                crate::rt::log::info_once(
                    &format!("stripe-truncated-{}", logical.display()),
                    &format!("{said}; its striped bytes past that are dropped for this process (cutting them from the members failed: {e})"),
                );
                size
            }
        };
        Ok(())
    }

    /// Makes logical bytes `[offset, offset + len)` part of the striped
    /// extent before a write to them is planned: grows the members and the
    /// placeholder to the new extent and records it in the mark, all under
    /// the placeholder's lock. Bytes another program appended to the
    /// placeholder between the old extent and `offset` are copied into the
    /// members first, so nothing it wrote is lost.
    pub fn extend_for_write(&mut self, placeholder: RawFd, offset: u64, len: usize) -> Result<()> {
        let end = offset + len as u64;
        if end <= self.extent {
            return Ok(());
        }
        let logical = self.logical.clone();
        let _lock = Locked::take(placeholder).map_err(|e| err(&logical, "locking stripe placeholder", e))?;
        let mark = match mark::read(placeholder) {
            Ok(Some(m)) if m.id == self.mark.id => m,
            Ok(_) | Err(_) => {
                let why = "its stripe mark changed while it was open (made again by another program?)".to_string();
                return Err(err(&logical, "extending striped file", other(why)));
            }
        };
        let size = fd_size(placeholder).map_err(|e| err(&logical, "fstat of", e))?;
        let mut extent = mark.extent;
        if size < extent {
            // Truncated by another program since the op opened it.
            extent = cut_to_truncated_size(placeholder, &self.manifest, &mark, size, &logical)?;
        }
        if end <= extent {
            self.extent = extent;
            return Ok(());
        }
        // Member bytes past the extent are stale (a truncation cut while a
        // write was still landing): they must read as zeros once it grows.
        for (i, m) in self.members.iter().enumerate() {
            cut_member(m.direct_fd.or(m.buffered_fd).unwrap_or(-1), self.layout.member_size(i, extent), &m.path)?;
        }
        let own_end = offset.min(size);
        if own_end > extent {
            self.adopt_appended(placeholder, extent, own_end)?;
        }
        for (i, m) in self.members.iter().enumerate() {
            let fd = m.direct_fd.or(m.buffered_fd).unwrap_or(-1);
            let want = self.layout.member_size(i, end);
            if fd_size(fd).map_err(|e| err(&m.path, "fstat of", e))? < want {
                truncate(fd, want).map_err(|e| err(&m.path, "extending stripe member", e))?;
            }
        }
        if size < end {
            truncate(placeholder, end).map_err(|e| err(&logical, "extending stripe placeholder", e))?;
        }
        let mark = Mark { extent: end, ..mark };
        mark::write(placeholder, &mark).map_err(|e| err(&logical, "marking stripe placeholder", e))?;
        self.mark = mark;
        self.extent = end;
        Ok(())
    }

    /// Copies the placeholder's own bytes `[from, to)` into the members
    /// (buffered, then synced so that later direct I/O finds no dirty page).
    fn adopt_appended(&mut self, placeholder: RawFd, from: u64, to: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let logical = self.logical.clone();
        let source = std::fs::File::open(format!("/proc/self/fd/{placeholder}"))
            .or_else(|_| std::fs::File::open(&logical))
            .map_err(|e| err(&logical, "opening stripe placeholder for read", e))?;
        let mut data = vec![0u8; (to - from) as usize];
        source.read_exact_at(&mut data, from).map_err(|e| err(&logical, "reading appended bytes of", e))?;
        let mut touched = vec![false; self.members.len()];
        for run in self.layout.runs(from, to) {
            let m = &self.members[run.member];
            let f = std::fs::OpenOptions::new().write(true).open(&m.path).map_err(|e| err(&m.path, "opening stripe member for write", e))?;
            let bytes = &data[(run.logical - from) as usize..(run.logical - from + run.len) as usize];
            f.write_all_at(bytes, run.member_offset).map_err(|e| err(&m.path, "writing appended bytes to stripe member", e))?;
            touched[run.member] = true;
        }
        for (i, m) in self.members.iter().enumerate().filter(|(i, _)| touched[*i]) {
            let f = std::fs::OpenOptions::new().write(true).open(&m.path).map_err(|e| err(&m.path, "opening stripe member for write", e))?;
            f.sync_data().map_err(|e| err(&m.path, "syncing stripe member", e))?;
            let _ = i;
        }
        crate::rt::log::info(&format!(
            "{}: {} bytes another program appended at offset {from} moved into its stripe members",
            logical.display(),
            to - from
        ));
        Ok(())
    }

    /// Reads logical bytes `[offset, offset + len)` with plain buffered
    /// reads of fresh descriptors (DeepSpeed's `validate`, tools).
    pub fn read_back(&self, placeholder: RawFd, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        read_logical(&self.layout, self.extent, &self.members.iter().map(|m| m.path.clone()).collect::<Vec<_>>(), placeholder, offset, len)
    }
}

/// Logical bytes `[offset, offset + len)` of a striped file whose member
/// files are `members` and whose placeholder is open on `placeholder`.
pub(crate) fn read_logical(
    layout: &Layout,
    extent: u64,
    members: &[PathBuf],
    placeholder: RawFd,
    offset: u64,
    len: usize,
) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut out = vec![0u8; len];
    let end = offset + len as u64;
    let mut files: Vec<Option<std::fs::File>> = members.iter().map(|_| None).collect();
    if offset < extent {
        for run in layout.runs(offset, end.min(extent)) {
            let f = match &mut files[run.member] {
                Some(f) => f,
                slot => slot.insert(std::fs::File::open(&members[run.member])?),
            };
            let at = (run.logical - offset) as usize;
            f.read_exact_at(&mut out[at..at + run.len as usize], run.member_offset)?;
        }
    }
    if end > extent {
        let from = offset.max(extent);
        let f = std::fs::File::open(format!("/proc/self/fd/{placeholder}"))?;
        let at = (from - offset) as usize;
        f.read_exact_at(&mut out[at..], from)?;
    }
    Ok(out)
}
