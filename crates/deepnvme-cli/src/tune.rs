//! `deepnvme tune`: sweeps block size, queue depth, intra_op_parallelism,
//! single_submit and overlap_events over one file, ranks the points, and
//! prints the best configuration as a DeepSpeed `"aio": {...}` config block,
//! choosing it as DeepSpeed's `ds_nvme_tune` does (highest read + write GB/s).

use crate::args::{
    fmt_size, fmt_size_short, parse_bool_choice, parse_count, parse_list, parse_positive_size, Arg, Args, CliError,
};
use crate::bench::{knobs_json, knobs_line, path_str, summary_json};
use crate::core_api::Direction;
use crate::json::Json;
use crate::progress::{Progress, ProgressMode};
use crate::runner::{self, BenchFile, Common, IoBuffer, Knobs, Summary};

pub const DEFAULT_SIZE: u64 = 256 << 20;
const DEFAULT_BLOCKS: [usize; 4] = [128 << 10, 256 << 10, 1 << 20, 4 << 20];
const DEFAULT_DEPTHS: [usize; 3] = [8, 32, 128];
const DEFAULT_PARALLELISM: [usize; 4] = [1, 2, 4, 8];
const DEFAULT_TOP: usize = 10;

pub const USAGE: &str = "\
Usage: deepnvme tune [OPTIONS]

Measures every combination of the handle knobs below on one file (write,
then read, per point), prints the points ranked by read + write GB/s, the
best for each direction, and the best overall as a DeepSpeed \"aio\" config
block (the criterion of DeepSpeed's ds_nvme_tune).

Grids (comma-separated lists):
      --block-size LIST        [128K,256K,1M,4M]
      --queue-depth LIST       [8,32,128]
      --parallelism LIST       intra_op_parallelism [1,2,4,8, capped at
                               twice the CPU count] (alias
                               --intra-op-parallelism)
      --single-submit[=CHOICE] true, false or both [both]
      --overlap-events[=CHOICE] true, false or both [both]
      --no-single-submit, --no-overlap-events   only false
      --engine uring|psync     transfer engine [process default]

What to move (per point):
  -s, --size SIZE              bytes per pass [256M]
      --buffer-size SIZE       bytes per op [256M, or --size when smaller]
  -f, --file PATH              use this file: an existing one is never
                               removed; a new one is unless --keep
  -d, --dir DIR                put the temp file in DIR [current directory]
      --keep                   do not remove the file the tool created
  -n, --loops N                measure each point N times, keep the best [1]
      --read-only              rank by read GB/s only
      --write-only             rank by write GB/s only

Output:
      --top N                  rows of the ranked table, 0 = all [10]
      --json                   one JSON object on stdout instead of text
  -q, --quiet                  no progress on stderr
      --progress               progress even when stderr is not a terminal
  -h, --help                   this text

A quick sweep: deepnvme tune --size 64M --block-size 1M --queue-depth 8,32
";

struct Grid {
    blocks: Vec<usize>,
    depths: Vec<usize>,
    parallelism: Vec<usize>,
    single_submit: Vec<bool>,
    overlap_events: Vec<bool>,
}

impl Grid {
    fn default_grid() -> Grid {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Grid {
            blocks: DEFAULT_BLOCKS.to_vec(),
            depths: DEFAULT_DEPTHS.to_vec(),
            parallelism: DEFAULT_PARALLELISM.iter().copied().filter(|&p| p == 1 || p <= 2 * cpus).collect(),
            single_submit: vec![false, true],
            overlap_events: vec![false, true],
        }
    }

    fn points(&self) -> Vec<Knobs> {
        let mut out = Vec::new();
        for &block_size in &self.blocks {
            for &queue_depth in &self.depths {
                for &parallelism in &self.parallelism {
                    for &single_submit in &self.single_submit {
                        for &overlap_events in &self.overlap_events {
                            out.push(Knobs { block_size, queue_depth, single_submit, overlap_events, parallelism });
                        }
                    }
                }
            }
        }
        out
    }
}

struct TuneOptions {
    grid: Grid,
    common: Common,
    top: usize,
}

fn parse(argv: Vec<String>) -> Result<Option<TuneOptions>, CliError> {
    let mut args = Args::new(argv, "tune");
    let mut grid = Grid::default_grid();
    let mut common = Common::new();
    let mut top = DEFAULT_TOP;
    let choice = |args: &Args, name: &str, inline: Option<String>| -> Result<Vec<bool>, CliError> {
        match inline {
            None => Ok(vec![true]),
            Some(v) => parse_bool_choice(&v).map_err(|why| args.error(format!("bad value {v:?} for {name}: {why}"))),
        }
    };
    while let Some(arg) = args.next_arg() {
        let Arg::Flag { name, inline } = arg else { return Err(args.unknown(arg)) };
        match name.as_str() {
            "-h" | "--help" => return Ok(None),
            "--block-size" | "--block-sizes" | "-b" => {
                grid.blocks = args.parsed(&name, inline, |v| parse_list(v, parse_positive_size))?
            }
            "--queue-depth" | "--queue-depths" => grid.depths = args.parsed(&name, inline, |v| parse_list(v, parse_count))?,
            "--parallelism" | "--intra-op-parallelism" | "-p" => {
                grid.parallelism = args.parsed(&name, inline, |v| parse_list(v, parse_count))?
            }
            "--single-submit" => grid.single_submit = choice(&args, &name, inline)?,
            "--overlap-events" => grid.overlap_events = choice(&args, &name, inline)?,
            "--no-single-submit" => {
                args.no_value(&name, &inline)?;
                grid.single_submit = vec![false]
            }
            "--no-overlap-events" => {
                args.no_value(&name, &inline)?;
                grid.overlap_events = vec![false]
            }
            "--top" => {
                top = args.parsed(&name, inline, |v| v.trim().parse::<usize>().map_err(|_| "expected a count".into()))?
            }
            _ => {
                if !common.parse_flag(&mut args, &name, inline)? {
                    return Err(args.unknown(Arg::Flag { name, inline: None }));
                }
            }
        }
    }
    common.validate(&args)?;
    for k in grid.points() {
        k.handle_config(common.engine)
            .validate()
            .map_err(|e| args.error(e.to_string().trim_start_matches("invalid argument: ").to_string()))?;
    }
    Ok(Some(TuneOptions { grid, common, top }))
}

/// One measured point: best pass of each direction.
struct Point {
    knobs: Knobs,
    write: Option<Summary>,
    read: Option<Summary>,
}

impl Point {
    fn write_gbps(&self) -> f64 {
        self.write.as_ref().map_or(0.0, Summary::best_gb_per_s)
    }
    fn read_gbps(&self) -> f64 {
        self.read.as_ref().map_or(0.0, Summary::best_gb_per_s)
    }
    /// ds_nvme_tune's criterion: read + write GB/s (one direction when only
    /// one is measured).
    fn score(&self) -> f64 {
        self.read_gbps() + self.write_gbps()
    }
}

/// Runs `deepnvme tune` with the arguments after the subcommand.
pub fn main(argv: Vec<String>) -> Result<(), CliError> {
    let Some(TuneOptions { grid, common, top }) = parse(argv)? else {
        print!("{USAGE}");
        return Ok(());
    };
    runner::install_interrupt_handler();
    let size = common.size.unwrap_or(DEFAULT_SIZE);
    let op_bytes = common.buffer_size.unwrap_or(crate::bench::DEFAULT_BUFFER).min(usize::try_from(size).unwrap_or(usize::MAX));
    for &p in &grid.parallelism {
        runner::check_split(size, op_bytes as u64, p).map_err(|m| CliError::usage("tune", m))?;
    }
    let points = grid.points();
    let file = BenchFile::open(common.file.as_deref(), common.dir.as_deref(), common.keep, "tune")?;
    if file.existed() && file.len() < size && !common.do_write() {
        return Err(CliError::Failed(format!(
            "{} holds {} bytes, fewer than the {} to read (--size)",
            file.path().display(),
            file.len(),
            size
        )));
    }
    file.check_space(size)?;
    let buffer = IoBuffer::new(op_bytes)?;
    if let Some(why) = buffer.lock_error() {
        crate::progress::info(&format!(
            "could not lock the {} buffer ({why}); tuning with unlocked page-aligned memory",
            fmt_size(op_bytes as u64)
        ));
    }
    let mode = ProgressMode::detect(common.quiet, common.progress);

    // Write the whole file once, untimed, so that no point pays for block
    // allocation and every read finds data.
    let defaults = Knobs::deepspeed_handle_defaults();
    let engine = {
        let handle = defaults.open_handle(common.engine)?;
        if file.len() < size {
            let mut progress = Progress::new(mode, "preparing (write)");
            runner::run_pass(&handle, &buffer, file.path(), size, Direction::Write, &mut progress)?;
        }
        file.warn_if_sparse(size);
        handle.engine_kind().name()
    };

    if !common.json {
        let fate = if file.removed_after() { "removed afterwards" } else { "kept" };
        println!(
            "deepnvme tune: {} points, {} per pass in ops of {}, engine {engine}, file {} ({fate})",
            points.len(),
            fmt_size(size),
            fmt_size(op_bytes as u64),
            file.path().display()
        );
    }

    let mut results: Vec<Point> = Vec::with_capacity(points.len());
    let width = points.len().to_string().len();
    for (i, knobs) in points.iter().enumerate() {
        let handle = knobs.open_handle(common.engine)?;
        let mut point = Point { knobs: *knobs, write: None, read: None };
        let label = format!("[{:>width$}/{}]", i + 1, points.len());
        for _ in 0..common.loops {
            if common.do_write() {
                let mut progress = Progress::new(mode, format!("{label} write"));
                let pass = runner::run_pass(&handle, &buffer, file.path(), size, Direction::Write, &mut progress)?;
                point.write.get_or_insert_with(|| Summary { passes: Vec::new() }).passes.push(pass);
            }
            if common.do_read() {
                let mut progress = Progress::new(mode, format!("{label} read"));
                let pass = runner::run_pass(&handle, &buffer, file.path(), size, Direction::Read, &mut progress)?;
                point.read.get_or_insert_with(|| Summary { passes: Vec::new() }).passes.push(pass);
            }
        }
        drop(handle);
        if !common.json {
            println!("{label} {}", point_cells(&point));
        }
        results.push(point);
    }

    // Rank: stable sort keeps grid order among equal scores.
    let mut ranked: Vec<&Point> = results.iter().collect();
    ranked.sort_by(|a, b| b.score().total_cmp(&a.score()));
    let best_read = results.iter().filter(|p| p.read.is_some()).max_by(|a, b| a.read_gbps().total_cmp(&b.read_gbps()));
    let best_write =
        results.iter().filter(|p| p.write.is_some()).max_by(|a, b| a.write_gbps().total_cmp(&b.write_gbps()));
    let Some(best) = ranked.first().copied() else {
        return Err(CliError::Failed("the sweep measured nothing".into()));
    };

    if common.json {
        let out = Json::object()
            .set("command", "tune")
            .set("version", env!("CARGO_PKG_VERSION"))
            .set("engine", engine)
            .set("file", path_str(file.path()))
            .set("file_removed", file.removed_after())
            .set("size_bytes", size)
            .set("buffer_bytes", buffer.len())
            .set("buffer_locked", buffer.locked())
            .set("loops", common.loops)
            .set("criterion", criterion(&common))
            .set("points", Json::Arr(ranked.iter().map(|p| point_json(p)).collect()))
            .set("best_read", best_read.map(point_json))
            .set("best_write", best_write.map(point_json))
            .set("best_overall", point_json(best))
            .set("aio", aio_block(&best.knobs));
        println!("{}", out.render(2));
        return Ok(());
    }

    let shown = if top == 0 { ranked.len() } else { top.min(ranked.len()) };
    println!();
    println!("Top {shown} of {} by {} (GB = 10^9 bytes; best of {} loop(s)):", ranked.len(), criterion(&common), common.loops);
    println!(
        "{:>4} {:>6} {:>5} {:>4} {:>7} {:>8} {:>10} {:>10} {:>8}",
        "rank", "block", "qd", "par", "single", "overlap", "read GB/s", "write GB/s", "sum"
    );
    for (i, p) in ranked.iter().take(shown).enumerate() {
        let k = &p.knobs;
        println!(
            "{:>4} {:>6} {:>5} {:>4} {:>7} {:>8} {:>10} {:>10} {:>8.3}",
            i + 1,
            fmt_size_short(k.block_size as u64),
            k.queue_depth,
            k.parallelism,
            k.single_submit,
            k.overlap_events,
            rate_cell(p.read.as_ref()),
            rate_cell(p.write.as_ref()),
            p.score()
        );
    }
    println!();
    if let Some(p) = best_read {
        println!("Best read:  {:.3} GB/s with {}", p.read_gbps(), knobs_line(&p.knobs));
    }
    if let Some(p) = best_write {
        println!("Best write: {:.3} GB/s with {}", p.write_gbps(), knobs_line(&p.knobs));
    }
    println!(
        "Best overall ({}): read = {}, write = {} GB/s",
        criterion(&common),
        rate_cell(best.read.as_ref()),
        rate_cell(best.write.as_ref())
    );
    println!("DeepSpeed config:");
    println!("{}", Json::object().set("aio", aio_block(&best.knobs)).render(2));
    Ok(())
}

fn criterion(common: &Common) -> &'static str {
    match (common.do_read(), common.do_write()) {
        (true, true) => "read + write GB/s",
        (true, false) => "read GB/s",
        _ => "write GB/s",
    }
}

fn rate_cell(s: Option<&Summary>) -> String {
    s.map_or_else(|| "-".to_string(), |s| format!("{:.3}", s.best_gb_per_s()))
}

fn point_cells(p: &Point) -> String {
    let k = &p.knobs;
    let mut s = format!(
        "block {:>5} qd {:>4} par {:>2} single_submit {:<5} overlap_events {:<5}",
        fmt_size_short(k.block_size as u64),
        k.queue_depth,
        k.parallelism,
        k.single_submit,
        k.overlap_events
    );
    if p.write.is_some() {
        s.push_str(&format!("  write {:>7}", rate_cell(p.write.as_ref())));
    }
    if p.read.is_some() {
        s.push_str(&format!("  read {:>7}", rate_cell(p.read.as_ref())));
    }
    s
}

fn point_json(p: &Point) -> Json {
    let mut j = Json::object().set("knobs", knobs_json(&p.knobs)).set("score", Json::rounded(p.score(), 4));
    if let Some(w) = &p.write {
        j = j.set("write", summary_json(w));
    }
    if let Some(r) = &p.read {
        j = j.set("read", summary_json(r));
    }
    j
}

/// The DeepSpeed `"aio"` section for these knobs (its key names and order;
/// booleans as JSON booleans, which DeepSpeed's config parser expects).
fn aio_block(k: &Knobs) -> Json {
    Json::object()
        .set("block_size", k.block_size)
        .set("queue_depth", k.queue_depth)
        .set("intra_op_parallelism", k.parallelism)
        .set("single_submit", k.single_submit)
        .set("overlap_events", k.overlap_events)
        .set("use_gds", false)
}
