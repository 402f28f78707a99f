//! `bare`: the limit of a benchmark cell. It moves the bytes a cell of
//! `benches/run.sh` moves, the way the cell moves them (one tensor-sized
//! buffer on huge pages, locked; O_DIRECT; ops of `--op-bytes` at increasing
//! offsets, each split over `--parallelism` workers in blocks of
//! `--block-size` with `--queue-depth` in flight; one untimed op first), with
//! the leanest loops there are and nothing of deepnvme or DeepSpeed in them:
//!
//! * `uring`: io_uring, one ring per worker, registered buffer and file;
//! * `psync`: `pread`/`pwrite` per block on as many threads as workers.
//!
//! It runs each engine named in `--engines`, in that order, and prints one
//! JSON object: each engine's GB/s (10^9 bytes/s) and CPU seconds per GB
//! (getrusage of the whole process over the timed loop), and the faster as
//! `best`/`gb_per_s`, the number the harness divides by.

mod buffer;
mod geometry;
mod psync;
mod uring;
mod workers;

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use serde_json::{json, Value};

use buffer::{Buffer, Pages};
use workers::Workers;

/// One worker's way of moving its slice of an op.
pub trait Mover {
    /// Moves this worker's slice of the op that starts at `file_offset`.
    fn op(&mut self, file_offset: u64) -> io::Result<()>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Direction {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Engine {
    Uring,
    Psync,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Uring => "uring",
            Engine::Psync => "psync",
        }
    }
}

#[derive(Parser, Debug)]
#[command(name = "bare", about = "The bare baseline of a benches/run.sh cell: the same bytes moved with the leanest loop")]
struct Args {
    /// The file (laid out already for reads; opened with O_DIRECT).
    #[arg(long)]
    file: PathBuf,
    #[arg(long, value_enum)]
    op: Direction,
    /// Bytes moved by the timed loop (a multiple of --op-bytes).
    #[arg(long, value_parser = parse_size)]
    size: usize,
    /// Bytes per op, the buffer's size [min(size, 128M)].
    #[arg(long, value_parser = parse_size)]
    op_bytes: Option<usize>,
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    block_size: usize,
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Engines to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "uring,psync")]
    engines: Vec<Engine>,
    /// The byte the buffer is filled with (one repeated byte: zram stores
    /// such pages without compressing them).
    #[arg(long, value_parser = parse_byte, default_value = "0x5a")]
    fill: u8,
    /// Timed passes over the file (each pass: --size bytes in ops of
    /// --op-bytes at increasing offsets).
    #[arg(long, default_value_t = 1)]
    passes: usize,
    /// No untimed op before the timed loop (a fresh process's first op is
    /// then timed too, as a harness that times every op sees it).
    #[arg(long)]
    no_warmup: bool,
    /// After the run, check that every byte of the buffer is this one (a
    /// read of a file laid out with it); exit 1 when not.
    #[arg(long, value_parser = parse_byte)]
    expect: Option<u8>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1usize << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (&t[..], 1),
    };
    let n: usize = num.parse().map_err(|_| format!("not a size: {s} (bytes, or with K, M or G)"))?;
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(|| format!("size out of range: {s}"))
}

fn parse_byte(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => t.parse(),
    };
    v.map_err(|_| format!("not a byte: {s}"))
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is valid to write.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(r.ru_utime) + t(r.ru_stime)
}

struct File(RawFd);

impl Drop for File {
    fn drop(&mut self) {
        // SAFETY: the descriptor this value owns.
        unsafe { libc::close(self.0) };
    }
}

fn open(path: &Path, op: Direction) -> io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let flags = libc::O_DIRECT
        | libc::O_CLOEXEC
        | match op {
            Direction::Read => libc::O_RDONLY,
            Direction::Write => libc::O_WRONLY | libc::O_CREAT,
        };
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(File(fd))
}

/// One engine's run: workers made, one untimed op at offset 0, then the
/// timed loop over `size` bytes.
fn run_engine(a: &Args, engine: Engine, fd: RawFd, buf: &Buffer, op_bytes: usize) -> io::Result<Value> {
    let slices = geometry::slices(op_bytes, a.parallelism);
    let base = buf.as_ptr() as usize;
    let (bs, qd, dir) = (a.block_size, a.queue_depth, a.op);
    let ring_flags = std::sync::Arc::new(std::sync::Mutex::new(None::<&'static str>));
    let flags_out = ring_flags.clone();
    let mut workers = Workers::start(a.parallelism, move |i| -> io::Result<Box<dyn Mover>> {
        let base = base as *mut u8;
        Ok(match engine {
            Engine::Uring => {
                let (u, flags) = uring::Uring::new(fd, base, slices[i], bs, qd, dir)?;
                *flags_out.lock().unwrap() = Some(flags);
                Box::new(u)
            }
            Engine::Psync => Box::new(psync::Psync::new(fd, base, slices[i], bs, dir)),
        })
    })?;
    if !a.no_warmup {
        workers.op(0)?;
    }
    let mut op_seconds = Vec::new();
    let (c0, t0) = (cpu_seconds(), Instant::now());
    for _ in 0..a.passes {
        for off in (0..a.size).step_by(op_bytes) {
            let t = Instant::now();
            workers.op(off as u64).map_err(|e| io::Error::new(e.kind(), format!("op at offset {off}: {e}")))?;
            op_seconds.push(t.elapsed().as_secs_f64());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - c0;
    drop(workers);
    let gb = (a.size * a.passes) as f64 / 1e9;
    let mut sorted = op_seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let median = if sorted.len() % 2 == 1 {
        sorted[sorted.len() / 2]
    } else {
        (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
    };
    let mut out = json!({"gb_per_s": gb / secs, "cpu_s_per_gb": cpu / gb, "seconds": secs,
                         "op_seconds": op_seconds, "gb_per_s_median_op": op_bytes as f64 / 1e9 / median});
    if let Some(f) = *ring_flags.lock().unwrap() {
        out["ring"] = json!(f);
    }
    Ok(out)
}

fn run(a: &Args) -> Result<Value, String> {
    let op_bytes = a.op_bytes.unwrap_or(a.size.min(128 << 20));
    if a.size % op_bytes != 0 {
        return Err(format!("--size {} is not a multiple of --op-bytes {op_bytes}", a.size));
    }
    if op_bytes % 4096 != 0 || a.block_size % 4096 != 0 || a.parallelism == 0 || a.queue_depth == 0 || a.passes == 0 {
        return Err("--op-bytes and --block-size must be multiples of 4096; --parallelism, --queue-depth and --passes at least 1".into());
    }
    let buf = Buffer::new(op_bytes, a.fill).map_err(|e| format!("a buffer of {op_bytes} bytes: {e}"))?;
    let file = open(&a.file, a.op).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let mut engines = serde_json::Map::new();
    let mut best: Option<(&str, f64, f64)> = None;
    for &e in &a.engines {
        let r = run_engine(a, e, file.0, &buf, op_bytes).map_err(|err| format!("{} {}: {err}", e.name(), a.file.display()))?;
        let (g, c) = (r["gb_per_s"].as_f64().unwrap_or(0.0), r["cpu_s_per_gb"].as_f64().unwrap_or(0.0));
        if best.is_none_or(|(_, bg, _)| g > bg) {
            best = Some((e.name(), g, c));
        }
        engines.insert(e.name().into(), r);
    }
    if let Some(want) = a.expect {
        if let Some(at) = buf.bytes().iter().position(|&b| b != want) {
            return Err(format!("buffer byte {at} is {:#04x}, not the expected {want:#04x}", buf.bytes()[at]));
        }
    }
    let (name, g, c) = best.ok_or("no --engines")?;
    Ok(json!({
        "op": match a.op { Direction::Read => "read", Direction::Write => "write" },
        "file": a.file.display().to_string(),
        "size_bytes": a.size, "op_bytes": op_bytes, "block_size": a.block_size,
        "queue_depth": a.queue_depth, "parallelism": a.parallelism,
        "buffer": {
            "bytes": buf.len(),
            "pages": match buf.pages { Pages::HugeTlb => "hugetlb", Pages::Thp => "thp" },
            "huge_bytes": buf.huge_bytes(),
            "locked": buf.locked,
        },
        "order": a.engines.iter().map(|e| e.name()).collect::<Vec<_>>(),
        "engines": engines,
        "best": name, "gb_per_s": g, "cpu_s_per_gb": c,
    }))
}

fn main() {
    let a = Args::parse();
    match run(&a) {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("bare: {e}");
            std::process::exit(1);
        }
    }
}
