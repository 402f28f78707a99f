//! Where a small `sync_pread` round trip goes, without Python: the Rust core
//! against plain syscalls on the same file, side by side in one run.
//!
//!     cargo run --release --example small_ops_bench -- --file /nvme/f.bin \
//!         [--op-bytes 4096,65536] [--seconds 2] [--rounds 4] [--json]
//!
//! Three ways to do one random, op-size-aligned O_DIRECT read into a locked
//! buffer, each timed for `--seconds` per round, the order rotated every
//! round (this disk favours whichever run comes later):
//!
//! * `core`: `IoHandle::read_into` with a path, which is DeepSpeed's
//!   `sync_pread` contract (open, statx, plan, read, close per call; small
//!   blocking ops run on the calling thread);
//! * `open_pread_close`: the same contract in bare syscalls (openat with
//!   O_DIRECT, pread, close): the floor for a call that opens its file;
//! * `pread`: the fd opened once, one pread per op: what fio's psync
//!   engine at queue depth 1 does.
//!
//! It prints round trips per second, CPU µs per op (getrusage, all threads)
//! and the per-round ratios core/open_pread_close and core/pread (median
//! and range). `benches/run.py` reports the Python call (through
//! DeepSpeed's loader) against fio; this splits that gap into what the
//! contract costs, what the core adds, and what is left for Python.
//! The file (256 MiB) is written first when it is missing or shorter.
//! No dependency beyond the core crate's own (libc).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use deepnvme::{FileTarget, HandleConfig, IoHandle, LockedBuffer};

mod common;
use common::Rng;

const FILE_BYTES: u64 = 256 << 20;
const WAYS: [&str; 3] = ["core", "open_pread_close", "pread"];

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn open_direct(path: &CString) -> std::io::Result<libc::c_int> {
    // SAFETY: a NUL-terminated path; the fd is closed by the caller.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC) };
    if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(fd) }
}

fn pread_all(fd: libc::c_int, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    // SAFETY: `buf` is valid for its length for the duration of the call.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) };
    match n {
        n if n < 0 => Err(std::io::Error::last_os_error()),
        n if n as usize != buf.len() => Err(std::io::Error::other(format!("short read at {offset}: {n}"))),
        _ => Ok(()),
    }
}

struct Run {
    ops_per_s: f64,
    cpu_us_per_op: f64,
}

/// Runs `one(offset)` on random aligned offsets for `seconds`.
fn timed(
    seconds: f64,
    op_bytes: u64,
    seed: u64,
    one: &mut dyn FnMut(u64) -> std::io::Result<()>,
) -> std::io::Result<Run> {
    let slots = FILE_BYTES / op_bytes;
    let mut rng = Rng(seed | 1);
    let budget = Duration::from_secs_f64(seconds);
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let mut ops = 0u64;
    while t0.elapsed() < budget {
        for _ in 0..64 {
            one(rng.next() % slots * op_bytes)?;
            ops += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(Run { ops_per_s: ops as f64 / secs, cpu_us_per_op: (cpu_seconds() - c0) / ops as f64 * 1e6 })
}

fn ensure_file(path: &Path) -> std::io::Result<()> {
    if std::fs::metadata(path).map(|m| m.len() >= FILE_BYTES).unwrap_or(false) {
        return Ok(());
    }
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut f = std::fs::File::create(path)?;
    for _ in 0..FILE_BYTES >> 20 {
        std::io::Write::write_all(&mut f, &chunk)?;
    }
    f.sync_all()
}

fn median_and_range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
    (median, v[0], v[v.len() - 1])
}

struct Args {
    file: PathBuf,
    op_bytes: Vec<u64>,
    seconds: f64,
    rounds: usize,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { file: PathBuf::new(), op_bytes: vec![4096, 65536], seconds: 2.0, rounds: 4, json: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--file" => args.file = PathBuf::from(value()?),
            "--op-bytes" => {
                args.op_bytes = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--op-bytes {s}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--json" => args.json = true,
            other => return Err(format!("unknown argument {other} (see the module doc)")),
        }
    }
    if args.file.as_os_str().is_empty() {
        return Err("--file is required (on the file system to measure: O_DIRECT)".into());
    }
    if args.rounds == 0 || args.op_bytes.iter().any(|&b| b == 0 || b % 4096 != 0 || b > FILE_BYTES) {
        return Err("--rounds must be positive and --op-bytes multiples of 4096 up to 256 MiB".into());
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| format!("small_ops_bench: {e}"))?;
    ensure_file(&args.file)?;
    let c_path = CString::new(args.file.as_os_str().as_bytes())?;
    let handle = IoHandle::new(HandleConfig { queue_depth: 32, intra_op_parallelism: 1, ..HandleConfig::default() })?;
    let target = || FileTarget::Path(args.file.as_path());
    let mut results = Vec::new();
    for &op_bytes in &args.op_bytes {
        let mut buf = LockedBuffer::new(op_bytes as usize)?;
        handle.read_into(&mut buf, target(), 0)?; // untimed: the inline engine and the page cache of the inode
        let kept_fd = open_direct(&c_path)?;
        // Per way: one Run per round.
        let mut runs: Vec<Vec<Run>> = WAYS.iter().map(|_| Vec::new()).collect();
        for round in 0..args.rounds {
            for k in 0..WAYS.len() {
                let way = (round + k) % WAYS.len();
                let seed = 0x9E37_79B9 + round as u64;
                let run = match WAYS[way] {
                    "core" => timed(args.seconds, op_bytes, seed, &mut |off| {
                        handle.read_into(&mut buf, target(), off).map(drop).map_err(std::io::Error::other)
                    }),
                    "open_pread_close" => timed(args.seconds, op_bytes, seed, &mut |off| {
                        let fd = open_direct(&c_path)?;
                        let read = pread_all(fd, &mut buf, off);
                        // SAFETY: our own fd, closed once.
                        unsafe { libc::close(fd) };
                        read
                    }),
                    _ => timed(args.seconds, op_bytes, seed, &mut |off| pread_all(kept_fd, &mut buf, off)),
                }?;
                runs[way].push(run);
            }
        }
        // SAFETY: our own fd, closed once.
        unsafe { libc::close(kept_fd) };
        let per_round = |a: usize, b: usize| -> Vec<f64> {
            runs[a].iter().zip(&runs[b]).map(|(x, y)| x.ops_per_s / y.ops_per_s).collect()
        };
        let median_of = |way: usize, f: &dyn Fn(&Run) -> f64| median_and_range(runs[way].iter().map(f).collect()).0;
        let ways: Vec<(String, f64, f64)> = (0..WAYS.len())
            .map(|w| (WAYS[w].to_string(), median_of(w, &|r| r.ops_per_s), median_of(w, &|r| r.cpu_us_per_op)))
            .collect();
        results.push((op_bytes, ways, median_and_range(per_round(0, 1)), median_and_range(per_round(0, 2))));
    }
    if args.json {
        let items: Vec<String> = results
            .iter()
            .map(|(op_bytes, ways, vs_open, vs_pread)| {
                let ways: Vec<String> = ways
                    .iter()
                    .map(|(name, ops, cpu)| {
                        format!("\"{name}\": {{\"ops_per_s\": {ops:.0}, \"cpu_us_per_op\": {cpu:.2}}}")
                    })
                    .collect();
                format!(
                    "{{\"op_bytes\": {op_bytes}, {}, \"core_over_open_pread_close\": [{:.3}, {:.3}, {:.3}], \
                     \"core_over_pread\": [{:.3}, {:.3}, {:.3}]}}",
                    ways.join(", "),
                    vs_open.0,
                    vs_open.1,
                    vs_open.2,
                    vs_pread.0,
                    vs_pread.1,
                    vs_pread.2
                )
            })
            .collect();
        println!("[{}]", items.join(", "));
        return Ok(());
    }
    let file = args.file.display();
    println!("{} rounds x {} s per way, random aligned O_DIRECT reads of {file}", args.rounds, args.seconds);
    for (op_bytes, ways, vs_open, vs_pread) in &results {
        println!("\nop {} KiB: round trips/s (CPU µs/op), medians", op_bytes / 1024);
        for (name, ops, cpu) in ways {
            println!("  {name:<17} {ops:>9.0}  ({cpu:.1})");
        }
        println!("  core / open_pread_close {:.2} [{:.2}-{:.2}]", vs_open.0, vs_open.1, vs_open.2);
        println!("  core / pread            {:.2} [{:.2}-{:.2}]", vs_pread.0, vs_pread.1, vs_pread.2);
    }
    Ok(())
}
