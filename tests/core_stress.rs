//! Concurrency stress: many threads, several handles per thread (both
//! engines, different knobs), many async and sync ops of random sizes and
//! offsets, to distinct files and to disjoint (unaligned, page-sharing)
//! ranges of one file. Every byte is verified. Plus cross-handle sharing of
//! pinned memory. Deterministic seeds; a failure names the seed.
//!
//! A binary of its own (not a module of `tests/core/`): its tests together
//! lock more memory than a default RLIMIT_MEMLOCK allows, so they hold
//! SERIAL; sharing a binary, every test of the binary would have to hold it.

use deepnvme::test_support as common;

use std::path::Path;

use common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::{BufferDesc, FileTarget, IoHandle, PinnedMemoryManager};

const THREADS: usize = 8;

/// The tests here run one at a time: each already runs many threads, and
/// together they would lock more memory than a default RLIMIT_MEMLOCK
/// (8 MiB) allows a process without CAP_IPC_LOCK.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Memory for one op: a whole pinned region, a skewed narrow of one, or heap.
enum Buf {
    Pinned(Pinned),
    Narrow(Pinned, usize),
    Heap(Vec<u8>),
}

impl Buf {
    fn new(rng: &mut Rng, len: usize) -> Buf {
        match rng.range(0, 2) {
            0 => Buf::Pinned(Pinned::new(len)),
            1 => {
                let skew = rng.range(1, 600);
                Buf::Narrow(Pinned::new(len + skew), skew)
            }
            _ => Buf::Heap(vec![0; len]),
        }
    }
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Buf::Pinned(p) => p.as_mut_slice(),
            Buf::Narrow(p, s) => &mut p.as_mut_slice()[*s..],
            Buf::Heap(v) => v,
        }
    }
    fn desc(&mut self) -> BufferDesc {
        let b = self.bytes();
        // SAFETY: the memory outlives every op on this desc (each is waited for here).
        unsafe { BufferDesc::from_raw_parts(b.as_mut_ptr(), b.len()) }
    }
}

/// Handles of one thread: both engines, different knobs and parallelism.
fn thread_handles(t: usize) -> Vec<IoHandle> {
    let e = engines();
    vec![
        handle_with(e[t % e.len()], [4096, 1000, 65536, 1 << 20][t % 4], [1, 2, 32][t % 3], t % 2 == 0, t % 3 == 0, 1 + t % 4),
        handle_with(e[(t + 1) % e.len()], 8192, 8, t % 2 == 1, t % 2 == 0, 1 + (t + 1) % 3),
        handle_with(e[t % e.len()], 32 * 1024, 16, false, true, 1),
    ]
}

/// A random length in `lo..=hi`, rounded down to a multiple of `par` (at least `par`).
fn len_for(rng: &mut Rng, lo: usize, hi: usize, par: usize) -> usize {
    (rng.range(lo, hi) / par).max(1) * par
}

#[test]
fn stress_distinct_files() {
    let _g = serial();
    let dir = TempDir::new("stress-files");
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let dir = &dir;
            s.spawn(move || {
                let seed = 0x5EED_0000 + t as u64;
                let mut rng = Rng::new(seed);
                let hs = thread_handles(t);
                for round in 0..6 {
                    // A batch of async writes, each to its own new file, from random handles.
                    let mut batch = Vec::new();
                    for k in 0..4 {
                        let hi = rng.range(0, hs.len() - 1);
                        let par = hs[hi].config().intra_op_parallelism;
                        let len = len_for(&mut rng, 1, 200_000, par);
                        let off = [0, 1, 512, 4096, rng.range(0, 9000)][rng.range(0, 4)];
                        let mut buf = Buf::new(&mut rng, len);
                        rng.fill(buf.bytes());
                        let data = buf.bytes().to_vec();
                        let path = dir.file(&format!("t{t}-r{round}-k{k}.bin"));
                        assert_eq!(ds::pwrite(&hs[hi], buf.desc(), FileTarget::Path(&path), off as i64, true).unwrap(), 0);
                        batch.push((buf, data, path, off, hi));
                    }
                    let done: usize = hs.iter().map(|h| h.wait().unwrap()).sum();
                    assert_eq!(done, 4, "seed {seed:#x} round {round}: ops completed");
                    // Verify the files, then read them back through a different handle.
                    let batch: Vec<_> = batch.into_iter().map(|(_buf, data, path, off, hi)| (data, path, off, hi)).collect();
                    let mut reads = Vec::new();
                    for (data, path, off, hi) in &batch {
                        let file = read_file(path);
                        assert_eq!(file.len(), off + data.len(), "seed {seed:#x}: size of {}", path.display());
                        assert!(file[..*off].iter().all(|&b| b == 0));
                        assert_bytes_eq(&file[*off..], data, &format!("seed {seed:#x}: {}", path.display()));
                        let h = &hs[(hi + 1) % hs.len()];
                        let par = h.config().intra_op_parallelism;
                        let len = data.len() / par * par;
                        if len == 0 {
                            continue;
                        }
                        let mut dst = Buf::new(&mut rng, len);
                        ds::pread(h, dst.desc(), FileTarget::Path(path), *off as i64, true).unwrap();
                        reads.push((dst, &data[..len], h));
                    }
                    for h in &hs {
                        h.wait().unwrap();
                    }
                    for (mut dst, want, _) in reads {
                        assert_bytes_eq(dst.bytes(), want, &format!("seed {seed:#x}: read back"));
                    }
                    for (_, path, _, _) in &batch {
                        std::fs::remove_file(path).unwrap();
                    }
                }
            });
        }
    });
}

/// Each thread owns `[t * REGION, (t + 1) * REGION)` of one file; REGION is
/// odd, so neighbours share pages and file-system blocks at every boundary.
const REGION: usize = 700_001;

fn stress_one_file(path: &Path, seed_base: u64, rounds: usize) {
    let initial = pattern(seed_base, THREADS * REGION);
    write_file(path, &initial);
    let shadows: Vec<Vec<u8>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..THREADS)
            .map(|t| {
                let mut shadow = initial[t * REGION..(t + 1) * REGION].to_vec();
                s.spawn(move || {
                    let seed = seed_base + 1 + t as u64;
                    let mut rng = Rng::new(seed);
                    let hs = thread_handles(t);
                    let base = t * REGION;
                    for round in 0..rounds {
                        // Up to 3 async writes to disjoint slots of the region
                        // (slots touch the region's ends, next to neighbours' bytes).
                        let k = rng.range(1, 3);
                        let slot = REGION / k;
                        let mut inflight = Vec::new();
                        for j in 0..k {
                            let hi = rng.range(0, hs.len() - 1);
                            let par = hs[hi].config().intra_op_parallelism;
                            let slot_start = j * slot;
                            let slot_len = if j == k - 1 { REGION - slot_start } else { slot };
                            let len = len_for(&mut rng, 1, slot_len.min(200_000), par);
                            let start = match rng.range(0, 3) {
                                0 => slot_start,
                                1 => slot_start + slot_len - len,
                                _ => slot_start + rng.range(0, slot_len - len),
                            };
                            let mut buf = Buf::new(&mut rng, len);
                            rng.fill(buf.bytes());
                            shadow[start..start + len].copy_from_slice(&buf.bytes()[..]);
                            let is_async = rng.range(0, 3) > 0;
                            ds::pwrite(&hs[hi], buf.desc(), FileTarget::Path(path), (base + start) as i64, is_async).unwrap_or_else(
                                |e| panic!("seed {seed:#x} round {round}: write: {e}"),
                            );
                            inflight.push(buf);
                        }
                        for h in &hs {
                            h.wait().unwrap();
                        }
                        drop(inflight);
                        // Read back a random window of the region through a random handle.
                        let hi = rng.range(0, hs.len() - 1);
                        let par = hs[hi].config().intra_op_parallelism;
                        let len = len_for(&mut rng, 1, 250_000, par);
                        let start = rng.range(0, REGION - len);
                        let mut dst = Buf::new(&mut rng, len);
                        ds::pread(&hs[hi], dst.desc(), FileTarget::Path(path), (base + start) as i64, false).unwrap();
                        assert_bytes_eq(
                            dst.bytes(),
                            &shadow[start..start + len],
                            &format!("seed {seed:#x} round {round}: read of [{start}, {}) of region {t}", start + len),
                        );
                    }
                    shadow
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let want: Vec<u8> = shadows.concat();
    // Through the handle (O_DIRECT where aligned) ...
    let h = handle(engines()[0]);
    let mut got = vec![0u8; want.len()];
    ds::pread(&h, heap_desc(&mut got), FileTarget::Path(path), 0, false).unwrap();
    assert_bytes_eq(&got, &want, &format!("seed {seed_base:#x}: whole file through the handle"));
    // ... and through the page cache.
    assert_bytes_eq(&read_file(path), &want, &format!("seed {seed_base:#x}: whole file, buffered read"));
}

#[test]
fn stress_disjoint_ranges_of_one_file() {
    let _g = serial();
    let dir = TempDir::new("stress-one");
    stress_one_file(&dir.file("shared.bin"), 0xD15_0000, 40);
}

#[test]
fn pinned_memory_is_shared_across_handles_and_threads() {
    let _g = serial();
    let kinds = engines();
    let h1 = handle_with(kinds[0], 4096, 4, false, false, 2);
    let h2 = handle_with(*kinds.last().unwrap(), 1 << 20, 32, true, true, 4);
    let m = PinnedMemoryManager::shared();
    // One region from "handle 1's" manager, used by both handles.
    let len = THREADS * 64 * 1024;
    let base = h1.manager().alloc(len).unwrap().as_ptr();
    assert!(std::ptr::eq(h1.manager(), h2.manager()));
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(h2.is_pinned(&unsafe { BufferDesc::from_raw_parts(base, len) }));
    let dir = TempDir::new("cross");
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (h1, h2, dir) = (&h1, &h2, &dir);
            let base = base as usize;
            s.spawn(move || {
                let mine = (base + t * 64 * 1024) as *mut u8;
                // SAFETY: the memory outlives every op on this desc (each is waited for here).
                let buf = unsafe { BufferDesc::from_raw_parts(mine, 64 * 1024) };
                assert!(h1.is_pinned(&buf), "a narrow of a shared region goes direct");
                let data = pattern(t as u64 + 77, 64 * 1024);
                // SAFETY: writes inside this test's own live mapping, owned by this thread.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), mine, data.len()) };
                let path = dir.file(&format!("x{t}.bin"));
                let (w, r) = if t % 2 == 0 { (h1, h2) } else { (h2, h1) };
                for round in 0..5 {
                    ds::pwrite(w, buf, FileTarget::Path(&path), (round * 4096) as i64, false).unwrap();
                    // SAFETY: writes inside this test's own live mapping, owned by this thread.
                    unsafe { std::ptr::write_bytes(mine, 0, 64 * 1024) };
                    ds::pread(r, buf, FileTarget::Path(&path), (round * 4096) as i64, false).unwrap();
                    // SAFETY: bytes of this test's own live mapping, which nothing else writes meanwhile.
                    let got = unsafe { std::slice::from_raw_parts(mine, 64 * 1024) };
                    assert_bytes_eq(got, &data, &format!("thread {t} round {round}"));
                }
            });
        }
    });
    // Freed through the other handle's manager: no longer pinned for either.
    assert!(h2.manager().free(base));
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(!h1.is_pinned(&unsafe { BufferDesc::from_raw_parts(base, len) })
        // SAFETY: the memory outlives every op on this desc (each is waited for here).
        && !h2.is_pinned(&unsafe { BufferDesc::from_raw_parts(base, 1) }));
    assert!(!m.is_managed(base, 1));
}

/// Two handles hammer neighbouring ranges of one file whose boundary falls
/// inside a page: one op's buffered edge and the other's O_DIRECT body once
/// shared that page, and the page cache wrote stale bytes back over the
/// direct write (kernel: "Page cache invalidation failure on direct I/O").
/// Every write is read back at once (O_DIRECT where aligned).
#[test]
fn neighbouring_ops_sharing_a_page_do_not_corrupt_each_other() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _g = serial();
    let dir = TempDir::new("neighbours");
    for engine in engines() {
        let path = dir.file(&format!("{engine:?}.bin"));
        write_file(&path, &vec![0u8; 20_000]);
        let stop = AtomicBool::new(false);
        let bad: usize = std::thread::scope(|s| {
            let (stop, path) = (&stop, &path);
            // B: [10000, 20000), memory skewed like the file offset so that
            // its body can go direct and its head goes buffered.
            s.spawn(move || {
                let h = handle_with(engine, 1 << 20, 8, false, false, 1);
                let skew = 10_000 % 512;
                let mut p = Pinned::new(10_000 + skew);
                let mut rng = Rng::new(0xB);
                while !stop.load(Ordering::Relaxed) {
                    rng.fill(&mut p.as_mut_slice()[skew..]);
                    ds::pwrite(&h, p.narrow(skew, 10_000), FileTarget::Path(path), 10_000, false).unwrap();
                }
            });
            // A: [0, 10000), checked after every write.
            let a = s.spawn(move || {
                // Stops B even if this thread panics (else the scope never ends).
                struct StopOnDrop<'a>(&'a AtomicBool);
                impl Drop for StopOnDrop<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::Relaxed);
                    }
                }
                let _stop = StopOnDrop(stop);
                let h = handle_with(engine, 1 << 20, 8, false, false, 1);
                let mut p = Pinned::new(10_000);
                let q = Pinned::new(10_000);
                let mut rng = Rng::new(0xA);
                let mut bad = 0;
                for _ in 0..600 {
                    rng.fill(p.as_mut_slice());
                    ds::pwrite(&h, p.desc(), FileTarget::Path(path), 0, false).unwrap();
                    ds::pread(&h, q.desc(), FileTarget::Path(path), 0, false).unwrap();
                    bad += (q.as_slice() != p.as_slice()) as usize;
                }
                bad
            });
            a.join().unwrap()
        });
        assert_eq!(bad, 0, "{engine:?}: {bad} of 600 writes were corrupted by the neighbouring op");
    }
}
