//! Does a memory copy beside the I/O slow the device? The probe behind the
//! bounce path's bound on a device whose "DMA" is itself a memory copy (a
//! VM's emulated disk), side by side in one run.
//!
//!     cargo run --release --example copy_contention_probe -- --file /disk/f.bin \
//!         [--write] [--parallelism 2] [--rounds 12]
//!
//! Three passes over a 256 MiB file in blocking 128 MiB ops (1 MiB blocks,
//! queue depth 32), the order rotated through all six every six rounds
//! (this disk favours whichever run comes later):
//!
//! * `locked`: a locked buffer, direct I/O into it (no copy);
//! * `plain`: unlocked memory, bounced: the core streams it through its
//!   windows and copies every byte once on the calling thread;
//! * `locked+copy`: the locked pass again, while another thread copies
//!   memory (streaming stores, as the bounce copy does, 64 MiB to 64 MiB)
//!   at the rate the plain pass last moved bytes, so it adds the plain
//!   pass's memory traffic and nothing of its pipeline.
//!
//! When `locked+copy / locked` comes out near `plain / locked`, the copy's
//! memory traffic, not the bounce pipeline, is what costs the plain pass.
//! It prints GB/s per pass and the per-round ratios (median and range).
//! The file is written first when it is missing or shorter. Use a multiple
//! of 6 rounds, so that every order comes up equally often.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deepnvme::{FileTarget, HandleConfig, IoHandle, LockedBuffer};

const FILE_BYTES: usize = 256 << 20;
const OP_BYTES: usize = 128 << 20;
const PASSES: [&str; 3] = ["locked", "plain", "locked+copy"];

struct Args {
    file: PathBuf,
    write: bool,
    parallelism: usize,
    rounds: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { file: PathBuf::new(), write: false, parallelism: 2, rounds: 12 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--file" => args.file = PathBuf::from(value()?),
            "--write" => args.write = true,
            "--parallelism" => args.parallelism = value()?.parse().map_err(|e| format!("--parallelism: {e}"))?,
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.file.as_os_str().is_empty() || args.rounds == 0 || args.parallelism == 0 {
        return Err("--file is required (on the file system to measure: O_DIRECT); --rounds and --parallelism > 0".into());
    }
    Ok(args)
}

/// Copies `src` to `dst` in 4 MiB steps at `gb_per_s` until `stop`, with
/// streaming stores where the CPU has them (as the bounce copy); says
/// `ready` before its first step. Returns the rate it kept.
fn paced_copy(src: &[u8], dst: &mut [u8], gb_per_s: f64, ready: &AtomicBool, stop: &AtomicBool) -> f64 {
    const STEP: usize = 4 << 20;
    let (t0, mut moved) = (Instant::now(), 0usize);
    ready.store(true, Ordering::Release);
    while !stop.load(Ordering::Relaxed) {
        let due = moved as f64 / (gb_per_s * 1e9);
        let now = t0.elapsed().as_secs_f64();
        if due > now {
            std::thread::sleep(Duration::from_secs_f64(due - now));
        }
        let at = moved % src.len();
        copy_streaming(&mut dst[at..at + STEP], &src[at..at + STEP]);
        moved += STEP;
    }
    moved as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: equal lengths (asserted), 16-byte aligned stores after the head.
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        assert_eq!(dst.len(), src.len());
        let head = ((16 - (dst.as_ptr() as usize & 15)) & 15).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let mut i = head;
        while i + 16 <= dst.len() {
            _mm_stream_si128(dst.as_mut_ptr().add(i) as *mut __m128i, _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i));
            i += 16;
        }
        _mm_sfence();
        dst[i..].copy_from_slice(&src[i..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

fn settle() {
    // SAFETY: sync() has no preconditions.
    unsafe { libc::sync() };
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    std::thread::sleep(Duration::from_millis(300));
}

fn median_range(mut xs: Vec<f64>) -> String {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    let median = if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 };
    format!("{median:.3} [{:.3}-{:.3}]", xs[0], xs[n - 1])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("copy_contention_probe: {e}");
            std::process::exit(2)
        }
    };
    let handle = IoHandle::new(HandleConfig {
        block_size: 1 << 20,
        queue_depth: 32,
        intra_op_parallelism: args.parallelism,
        ..HandleConfig::default()
    })?;
    let mut locked = LockedBuffer::new(OP_BYTES)?;
    locked.fill(0x5a);
    // Unlocked and off page alignment, as a torch tensor's storage is.
    let mut plain_storage = vec![0x5au8; OP_BYTES + 64];
    let plain = &mut plain_storage[64..64 + OP_BYTES];
    // The copy thread's memory, allocated and faulted in once: its pass
    // then adds only the paced copy's traffic.
    let copy_src = vec![1u8; 64 << 20];
    let mut copy_dst = vec![2u8; 64 << 20];
    let file = || FileTarget::Path(args.file.as_path());
    if std::fs::metadata(&args.file).map_or(0, |m| m.len() as usize) < FILE_BYTES {
        for off in (0..FILE_BYTES).step_by(OP_BYTES) {
            handle.write_from(&locked, file(), off as u64)?;
        }
    }
    let pass = |name: &str, locked: &mut LockedBuffer, plain: &mut [u8]| -> deepnvme::Result<f64> {
        let t0 = Instant::now();
        for off in (0..FILE_BYTES).step_by(OP_BYTES) {
            let off = off as u64;
            match (name, args.write) {
                ("plain", false) => handle.read_into(plain, file(), off)?,
                ("plain", true) => handle.write_from(plain, file(), off)?,
                (_, false) => handle.read_into(locked, file(), off)?,
                (_, true) => handle.write_from(locked, file(), off)?,
            };
        }
        Ok(FILE_BYTES as f64 / t0.elapsed().as_secs_f64() / 1e9)
    };
    // Untimed: a warm handle (rings, fixed buffers, bounce pool), and the
    // plain pass's first rate for the copy thread to match.
    pass("locked", &mut locked, plain)?;
    let mut plain_rate = pass("plain", &mut locked, plain)?;
    let (mut vs_plain, mut vs_copy) = (Vec::new(), Vec::new());
    let what = if args.write { "write" } else { "read" };
    for round in 0..args.rounds {
        let mut order: Vec<usize> = (0..3).cycle().skip(round % 3).take(3).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut gb = [0.0; 3];
        let mut copied = 0.0;
        for i in order {
            settle();
            if i != 2 {
                gb[i] = pass(PASSES[i], &mut locked, plain)?;
                if i == 1 {
                    plain_rate = gb[1];
                }
                continue;
            }
            let (ready, stop) = (AtomicBool::new(false), AtomicBool::new(false));
            let (src, dst) = (&copy_src[..], &mut copy_dst[..]);
            gb[2] = std::thread::scope(|s| {
                let copier = s.spawn(|| paced_copy(src, dst, plain_rate, &ready, &stop));
                while !ready.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let gb = pass(PASSES[2], &mut locked, plain);
                stop.store(true, Ordering::Relaxed);
                copied = copier.join().unwrap_or(f64::NAN);
                gb
            })?;
        }
        println!(
            "round {round}: {what} locked {:.3}, plain {:.3}, locked+copy {:.3} GB/s (the copy thread {copied:.2} GB/s)",
            gb[0], gb[1], gb[2]
        );
        vs_plain.push(gb[1] / gb[0]);
        vs_copy.push(gb[2] / gb[0]);
    }
    println!("{what}, parallelism {}: plain/locked {}", args.parallelism, median_range(vs_plain));
    println!("{what}, parallelism {}: locked+copy/locked {}", args.parallelism, median_range(vs_copy));
    Ok(())
}
