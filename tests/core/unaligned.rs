//! Unaligned sizes, offsets and buffer addresses on real O_DIRECT files,
//! with both engines, and the bounce path for memory that is not pinned.
//! Results must be exact: a 1000-byte write to a new file makes a
//! 1000-byte file; a write into a larger file keeps everything around it;
//! a read returns exactly the file's bytes and touches nothing else.

use crate::common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::{OpRequest, Staging};
use deepnvme::{BufferDesc, Direction, EngineKind, Error, FileTarget, IoHandle, Location};

const LENS: [usize; 8] = [0, 1, 511, 513, 1000, 4095, 4097, (1 << 20) + 3];
const OFFSETS: [usize; 4] = [0, 1, 511, 4097];

/// Memory for one transfer of `len` bytes.
enum Mem {
    /// A whole pinned region (page aligned).
    Pinned(Pinned),
    /// A narrow of a pinned region starting `skew` bytes in, with guard
    /// bytes on both sides.
    Narrow(Pinned, usize),
    /// Plain heap memory, with guard bytes on both sides.
    Heap(Vec<u8>),
}

const GUARD: u8 = 0xA5;
const GUARD_LEN: usize = 64;

impl Mem {
    fn new(kind: usize, len: usize) -> Mem {
        match kind {
            0 => Mem::Pinned(Pinned::new(len)),
            1 | 2 => {
                let skew = if kind == 1 { 1 } else { 3 };
                let mut p = Pinned::new(skew + len + GUARD_LEN);
                p.as_mut_slice().fill(GUARD);
                Mem::Narrow(p, skew)
            }
            _ => Mem::Heap(vec![GUARD; GUARD_LEN + len + GUARD_LEN]),
        }
    }
    fn label(&self) -> String {
        match self {
            Mem::Pinned(_) => "pinned".into(),
            Mem::Narrow(_, s) => format!("pinned+{s}"),
            Mem::Heap(_) => "heap".into(),
        }
    }
    fn desc(&mut self, len: usize) -> BufferDesc {
        match self {
            Mem::Pinned(p) => p.desc(),
            Mem::Narrow(p, s) => p.narrow(*s, len),
            // SAFETY: the memory outlives every op on this desc (each is waited for here).
            Mem::Heap(v) => unsafe { BufferDesc::from_raw_parts(v.as_mut_ptr().add(GUARD_LEN), len) },
        }
    }
    fn bytes(&mut self, len: usize) -> &mut [u8] {
        match self {
            Mem::Pinned(p) => &mut p.as_mut_slice()[..len],
            Mem::Narrow(p, s) => &mut p.as_mut_slice()[*s..*s + len],
            Mem::Heap(v) => &mut v[GUARD_LEN..GUARD_LEN + len],
        }
    }
    /// The bytes around the buffer are untouched.
    fn check_guards(&self, len: usize, what: &str) {
        let (before, after): (&[u8], &[u8]) = match self {
            Mem::Pinned(_) => return,
            Mem::Narrow(p, s) => (&p.as_slice()[..*s], &p.as_slice()[*s + len..]),
            Mem::Heap(v) => (&v[..GUARD_LEN], &v[GUARD_LEN + len..]),
        };
        assert!(before.iter().chain(after).all(|&b| b == GUARD), "{what}: bytes outside the buffer were written");
    }
}

fn check_unaligned(h: &IoHandle, dir: &TempDir, engine: EngineKind, len: usize, off: usize, mem_kind: usize, seed: u64) {
    let mut mem = Mem::new(mem_kind, len);
    let what = format!("{engine:?} len={len} off={off} mem={}", mem.label());
    let data = pattern(seed, len);
    mem.bytes(len).copy_from_slice(&data);

    // 1. A new file: exactly off + len bytes, zeros before the offset.
    let fresh = dir.file(&format!("new-{seed}.bin"));
    let n = ds::pwrite(h, mem.desc(len), FileTarget::Path(&fresh), off as i64, false).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(n, 1);
    let got = read_file(&fresh);
    // Writing nothing does not extend a file (as pwrite of 0 bytes).
    let want_size = if len == 0 { 0 } else { off + len };
    assert_eq!(got.len(), want_size, "{what}: size of a new file");
    assert!(got[..want_size.min(off)].iter().all(|&b| b == 0), "{what}: hole before the offset");
    assert_bytes_eq(&got[want_size.min(off)..], &data, &what);
    std::fs::remove_file(&fresh).unwrap();

    // 2. An existing larger file: only [off, off + len) changes.
    let existing = dir.file(&format!("old-{seed}.bin"));
    let mut want = pattern(seed ^ 0xFFFF, off + len + 4999);
    write_file(&existing, &want);
    ds::pwrite(h, mem.desc(len), FileTarget::Path(&existing), off as i64, false).unwrap();
    want[off..off + len].copy_from_slice(&data);
    assert_bytes_eq(&read_file(&existing), &want, &format!("{what}: write into a larger file"));
    mem.check_guards(len, &what);

    // 3. Read back: exactly the file's bytes, nothing outside the buffer.
    // Read a different window so stale buffer contents cannot pass.
    let roff = off + len.min(7);
    mem.bytes(len).fill(0x5A);
    ds::pread(h, mem.desc(len), FileTarget::Path(&existing), roff as i64, false).unwrap_or_else(|e| panic!("{what}: read: {e}"));
    assert_bytes_eq(mem.bytes(len), &want[roff..roff + len], &format!("{what}: read at {roff}"));
    mem.check_guards(len, &what);

    // 4. The unsplit synchronous path (`read`/`write`) gives the same.
    mem.bytes(len).copy_from_slice(&data);
    ds::transfer_inline(h, request(Direction::Write, FileTarget::Path(&existing), (off + 3) as i64, mem.desc(len))).unwrap();
    want[off + 3..off + 3 + len].copy_from_slice(&data);
    assert_bytes_eq(&read_file(&existing), &want, &format!("{what}: inline write"));
    mem.bytes(len).fill(0);
    ds::transfer_inline(h, request(Direction::Read, FileTarget::Path(&existing), off as i64, mem.desc(len))).unwrap();
    assert_bytes_eq(mem.bytes(len), &want[off..off + len], &format!("{what}: inline read"));
    mem.check_guards(len, &what);
    std::fs::remove_file(&existing).unwrap();
}

#[test]
fn unaligned_sizes_offsets_and_addresses_are_exact() {
    let dir = TempDir::new("unaligned");
    let mut seed = 1;
    for engine in engines() {
        // Small blocks so that the 1 MiB case runs many pieces per op.
        let h = handle_with(engine, 64 * 1024, 8, false, true, 1);
        for &len in &LENS {
            for &off in &OFFSETS {
                for mem_kind in 0..4 {
                    check_unaligned(&h, &dir, engine, len, off, mem_kind, seed);
                    seed += 1;
                }
            }
        }
    }
}

#[test]
fn unaligned_parallel_ops_are_exact() {
    let dir = TempDir::new("unaligned-par");
    let mut seed = 1000;
    for engine in engines() {
        for par in [2usize, 3, 4] {
            let h = handle_with(engine, 4096, 4, true, false, par);
            // Lengths divisible by par, straddling pages in odd ways.
            for len in [par, par * 171, par * 1367, par * 4097, par * 87_382 + par] {
                for off in [1usize, 511, 4097] {
                    check_unaligned(&h, &dir, engine, len, off, (seed % 4) as usize, seed);
                    seed += 1;
                }
            }
        }
    }
}

/// A strided "tensor": every other byte of `store`, copied by a caller-supplied
/// Staging (the torch glue does this for non-contiguous and device tensors).
struct EveryOther {
    store: *mut u8,
    len: usize,
}
// SAFETY: `store` is the test's own allocation, outliving the op; the
// handle calls the copier from one thread at a time.
unsafe impl Send for EveryOther {}
impl Staging for EveryOther {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> deepnvme::Result<()> {
        for (i, b) in bounce[..self.len].iter_mut().enumerate() {
            // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
            *b = unsafe { *self.store.add(2 * i) };
        }
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> deepnvme::Result<()> {
        for (i, &b) in bounce[..self.len].iter().enumerate() {
            // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
            unsafe { *self.store.add(2 * i) = b };
        }
        Ok(())
    }
}

#[test]
fn strided_and_device_buffers_bounce_through_their_copier() {
    let dir = TempDir::new("staging");
    let path = dir.file("f.bin");
    let len = 10_007;
    let data = pattern(5, len);
    for engine in engines() {
        let h = handle(engine);
        for is_host in [true, false] {
            // A non-contiguous pinned destination must really be written (the
            // C++ read it into a temporary that it never copied back).
            let mut store = Pinned::new(2 * len);
            for (i, b) in store.as_mut_slice().iter_mut().enumerate() {
                *b = if i % 2 == 0 { data[i / 2] } else { 0xCC };
            }
            let sp = store.ptr();
            let location = if is_host { Location::Host } else { Location::OtherDevice };
            // SAFETY: the memory outlives every op on this desc (each is waited for here).
            let buf = unsafe { BufferDesc::from_raw_parts(sp, len) }.located(location).contiguous(false).pinned(true);
            let req = |direction| OpRequest {
                direction,
                target: FileTarget::Path(&path),
                file_offset: 3,
                buffer: buf,
                staging: Some(Box::new(EveryOther { store: sp, len })),
                validate: false,
            };
            ds::submit(&h, req(Direction::Write), false).unwrap();
            let file = read_file(&path);
            assert_bytes_eq(&file[3..3 + len], &data, &format!("{engine:?} host={is_host} strided write"));
            for i in (0..2 * len).step_by(2) {
                store.as_mut_slice()[i] = 0;
            }
            ds::submit(&h, req(Direction::Read), false).unwrap();
            for i in 0..2 * len {
                let want = if i % 2 == 0 { data[i / 2] } else { 0xCC };
                assert_eq!(store.as_slice()[i], want, "{engine:?} host={is_host} strided read, byte {i}");
            }
            std::fs::remove_file(&path).unwrap();
        }
    }
}

#[test]
fn zero_length_ops() {
    let dir = TempDir::new("zero");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 2);
        let path = dir.file(&format!("{engine:?}.bin"));
        let p = Pinned::new(0);
        assert_eq!(ds::pwrite(&h, p.desc(), FileTarget::Path(&path), 0, false).unwrap(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "a zero-byte write creates an empty file");
        assert_eq!(ds::pread(&h, p.desc(), FileTarget::Path(&path), 0, false).unwrap(), 1, "a zero-byte read at EOF is fine");
        let e = ds::pread(&h, p.desc(), FileTarget::Path(&path), 1, false).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "zero bytes starting past EOF: {e}");
    }
}

