//! `deepnvme bench`: writes and then reads a file with one set of handle
//! knobs, and reports GB/s and CPU seconds per GB for each direction, as a
//! table or (`--json`) as one JSON object on stdout.

use std::path::Path;

use crate::args::{fmt_size, fmt_size_short, parse_count, parse_positive_size, Arg, Args, CliError};
use crate::core_api::Direction;
use crate::json::Json;
use crate::progress::{Progress, ProgressMode};
use crate::runner::{self, BenchFile, Common, IoBuffer, Knobs, Summary, GB};

pub const DEFAULT_SIZE: u64 = 1 << 30;
pub const DEFAULT_BUFFER: usize = 256 << 20;

pub const USAGE: &str = "\
Usage: deepnvme bench [OPTIONS]

Writes and then reads a file with O_DIRECT through a DeepNVMe handle and
locked buffers, and reports GB/s (1 GB = 10^9 bytes) and CPU seconds per GB
(user + system time of the whole process) for each direction. The transfer
is cut into ops of --buffer-size submitted at increasing offsets.

Handle knobs (defaults are DeepSpeed's aio_handle() defaults):
      --block-size SIZE        bytes per I/O request            [1M]
      --queue-depth N          requests in flight per worker    [128]
      --single-submit[=BOOL]   one submit syscall per request   [false]
      --overlap-events[=BOOL]  keep the queue topped up         [false]
      --parallelism N          intra_op_parallelism: workers    [1]
                               (alias --intra-op-parallelism)
      --no-single-submit, --no-overlap-events   set those to false
      --engine uring|psync     transfer engine [DEEPNVME_ENGINE, else
                               io_uring when it works, else psync]
  Note: the ZeRO-Infinity \"aio\" config section has other defaults
  (queue_depth 8, overlap_events true); pass them to measure those.

What to move:
  -s, --size SIZE              bytes per pass [1G; with --read-only on an
                               existing --file: the file's size]
      --buffer-size SIZE       bytes per op (and locked buffer) [256M, or
                               --size when smaller]
  -f, --file PATH              use this file: an existing one is
                               overwritten in place and never removed; a
                               new one is removed afterwards unless --keep
  -d, --dir DIR                put the temp file in DIR [current directory]
      --keep                   do not remove the file the tool created
  -n, --loops N                repeat the passes N times; report best and
                               mean [1]
      --read-only              only read
      --write-only             only write
      --no-prepare             time the first write into the new, empty
                               file (includes block allocation); by default
                               a file shorter than --size is first written
                               once, untimed, so timed writes overwrite

Output:
      --json                   one JSON object on stdout instead of the table
  -q, --quiet                  no progress on stderr
      --progress               progress even when stderr is not a terminal
  -h, --help                   this text

SIZE takes a suffix k, M, G or T (powers of 1024): 4k, 1M, 1.5G.
";

struct BenchOptions {
    knobs: Knobs,
    common: Common,
    no_prepare: bool,
}

fn parse(argv: Vec<String>) -> Result<Option<BenchOptions>, CliError> {
    let mut args = Args::new(argv, "bench");
    let mut knobs = Knobs::deepspeed_handle_defaults();
    let mut common = Common::new();
    let mut no_prepare = false;
    while let Some(arg) = args.next_arg() {
        let Arg::Flag { name, inline } = arg else { return Err(args.unknown(arg)) };
        match name.as_str() {
            "-h" | "--help" => return Ok(None),
            "--block-size" | "-b" => knobs.block_size = args.parsed(&name, inline, parse_positive_size)?,
            "--queue-depth" => knobs.queue_depth = args.parsed(&name, inline, parse_count)?,
            "--parallelism" | "--intra-op-parallelism" | "-p" => {
                knobs.parallelism = args.parsed(&name, inline, parse_count)?
            }
            "--single-submit" => knobs.single_submit = args.switch(&name, inline)?,
            "--overlap-events" => knobs.overlap_events = args.switch(&name, inline)?,
            "--no-single-submit" => {
                args.no_value(&name, &inline)?;
                knobs.single_submit = false
            }
            "--no-overlap-events" => {
                args.no_value(&name, &inline)?;
                knobs.overlap_events = false
            }
            "--no-prepare" => no_prepare = args.switch(&name, inline)?,
            _ => {
                if !common.parse_flag(&mut args, &name, inline)? {
                    return Err(args.unknown(Arg::Flag { name, inline: None }));
                }
            }
        }
    }
    common.validate(&args)?;
    knobs
        .handle_config(common.engine)
        .validate()
        .map_err(|e| args.error(e.to_string().trim_start_matches("invalid argument: ").to_string()))?;
    if no_prepare && common.read_only {
        return Err(args.error("--no-prepare has no meaning with --read-only (reads need a written file)"));
    }
    Ok(Some(BenchOptions { knobs, common, no_prepare }))
}

/// Runs `deepnvme bench` with the arguments after the subcommand.
pub fn main(argv: Vec<String>) -> Result<(), CliError> {
    let Some(opts) = parse(argv)? else {
        print!("{USAGE}");
        return Ok(());
    };
    let BenchOptions { knobs, common, no_prepare } = opts;
    runner::install_interrupt_handler();

    let file = BenchFile::open(common.file.as_deref(), common.dir.as_deref(), common.keep, "bench")?;
    let size = match common.size {
        Some(s) => s,
        None if common.read_only && file.existed() && file.len() > 0 => file.len(),
        None => DEFAULT_SIZE,
    };
    let op_bytes = common.buffer_size.unwrap_or(DEFAULT_BUFFER).min(usize::try_from(size).unwrap_or(usize::MAX));
    runner::check_split(size, op_bytes as u64, knobs.parallelism).map_err(|m| CliError::usage("bench", m))?;
    let short = file.len() < size;
    if common.read_only && short && file.existed() {
        return Err(CliError::Failed(format!(
            "{} holds {} bytes, fewer than the {} to read (--size)",
            file.path().display(),
            file.len(),
            size
        )));
    }
    // A file shorter than a pass is written once, untimed, first: reads
    // need data, and timed writes then overwrite allocated blocks (as NVMe
    // offload does in steady state, and as fio does on an existing file).
    let must_prepare = short && (common.read_only || !no_prepare);
    if common.do_write() || must_prepare {
        file.check_space(size)?;
    }

    let buffer = IoBuffer::new(op_bytes)?;
    if let Some(why) = buffer.lock_error() {
        crate::progress::info(&format!(
            "could not lock the {} buffer ({why}); benchmarking with unlocked page-aligned memory, \
             which O_DIRECT still reads and writes directly",
            fmt_size(op_bytes as u64)
        ));
    }
    let handle = knobs.open_handle(common.engine)?;
    let engine = handle.engine_kind().name();
    let mode = ProgressMode::detect(common.quiet, common.progress);

    if !common.json {
        print_header(&knobs, engine, &file, size, &buffer);
        if must_prepare {
            println!("file: shorter than a pass, so written once first (untimed)");
        }
    }
    if must_prepare {
        let mut progress = Progress::new(mode, "preparing (write)");
        runner::run_pass(&handle, &buffer, file.path(), size, Direction::Write, &mut progress)?;
        file.warn_if_sparse(size);
    }

    let mut writes = Summary { passes: Vec::new() };
    let mut reads = Summary { passes: Vec::new() };
    for round in 0..common.loops {
        let tag = if common.loops > 1 { format!(" {}/{}", round + 1, common.loops) } else { String::new() };
        if common.do_write() {
            let mut progress = Progress::new(mode, format!("write{tag}"));
            writes.passes.push(runner::run_pass(&handle, &buffer, file.path(), size, Direction::Write, &mut progress)?);
            if round == 0 {
                file.warn_if_sparse(size);
            }
        }
        if common.do_read() {
            let mut progress = Progress::new(mode, format!("read{tag}"));
            reads.passes.push(runner::run_pass(&handle, &buffer, file.path(), size, Direction::Read, &mut progress)?);
        }
    }
    drop(handle);

    if common.json {
        println!("{}", to_json(&knobs, engine, &file, size, &buffer, &common, &writes, &reads).render(2));
    } else {
        print_table(&writes, &reads, common.loops);
        if !file.removed_after() && !file.existed() {
            println!("kept {}", file.path().display());
        }
    }
    Ok(())
}

pub fn knobs_line(k: &Knobs) -> String {
    format!(
        "block_size {}, queue_depth {}, single_submit {}, overlap_events {}, intra_op_parallelism {}",
        fmt_size_short(k.block_size as u64),
        k.queue_depth,
        k.single_submit,
        k.overlap_events,
        k.parallelism
    )
}

fn print_header(k: &Knobs, engine: &str, file: &BenchFile, size: u64, buffer: &IoBuffer) {
    let fate = if file.removed_after() { "removed afterwards" } else { "kept" };
    println!("deepnvme bench: {} per pass, file {} ({fate})", fmt_size(size), file.path().display());
    println!("handle: engine {engine}, {}", knobs_line(k));
    println!(
        "buffer: {} per op, {}",
        fmt_size(buffer.len() as u64),
        if buffer.locked() { "locked (pinned memory manager)" } else { "NOT locked (RLIMIT_MEMLOCK too low)" }
    );
}

fn print_table(writes: &Summary, reads: &Summary, loops: usize) {
    println!();
    println!("{:<6} {:>10} {:>10} {:>10} {:>6}", "op", "GB/s best", "GB/s mean", "CPU s/GB", "loops");
    for (name, s) in [("write", writes), ("read", reads)] {
        if s.passes.is_empty() {
            continue;
        }
        println!(
            "{:<6} {:>10.3} {:>10.3} {:>10.3} {:>6}",
            name,
            s.best_gb_per_s(),
            s.mean_gb_per_s(),
            s.cpu_per_gb(),
            loops
        );
    }
    println!("(1 GB = 10^9 bytes; CPU = user + system time of all threads)");
}

#[allow(clippy::too_many_arguments)]
fn to_json(
    k: &Knobs,
    engine: &str,
    file: &BenchFile,
    size: u64,
    buffer: &IoBuffer,
    common: &Common,
    writes: &Summary,
    reads: &Summary,
) -> Json {
    let mut out = Json::object()
        .set("command", "bench")
        .set("version", env!("CARGO_PKG_VERSION"))
        .set("engine", engine)
        .set("file", path_str(file.path()))
        .set("file_removed", file.removed_after())
        .set("size_bytes", size)
        .set("buffer_bytes", buffer.len())
        .set("buffer_locked", buffer.locked())
        .set("loops", common.loops)
        .set("gb_bytes", GB as u64)
        .set("knobs", knobs_json(k));
    for (name, s) in [("write", writes), ("read", reads)] {
        if s.passes.is_empty() {
            continue;
        }
        out = out.set(name, summary_json(s));
    }
    out
}

pub fn knobs_json(k: &Knobs) -> Json {
    Json::object()
        .set("block_size", k.block_size)
        .set("queue_depth", k.queue_depth)
        .set("single_submit", k.single_submit)
        .set("overlap_events", k.overlap_events)
        .set("intra_op_parallelism", k.parallelism)
}

pub fn summary_json(s: &Summary) -> Json {
    Json::object()
        .set("gb_per_s_best", Json::rounded(s.best_gb_per_s(), 4))
        .set("gb_per_s_mean", Json::rounded(s.mean_gb_per_s(), 4))
        .set("cpu_s_per_gb", Json::rounded(s.cpu_per_gb(), 4))
        .set("seconds", Json::Arr(s.passes.iter().map(|p| Json::rounded(p.secs, 6)).collect()))
        .set("cpu_seconds", Json::Arr(s.passes.iter().map(|p| Json::rounded(p.cpu_secs, 6)).collect()))
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
