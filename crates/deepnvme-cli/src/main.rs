//! The `deepnvme` command-line tool: benchmark (`bench`), knob sweep
//! (`tune`) and environment report (`info`) for the DeepNVMe core.
//!
//! This file owns the top-level usage text, subcommand dispatch and the exit
//! status: 0 on success, 1 when the work fails, 2 for a bad command line,
//! 130 after Ctrl-C. What each sibling module owns:
//! * `args`: hand-written parsing (sizes with suffixes, lists, switches);
//! * `bench`, `tune`, `info`: the subcommands;
//! * `runner`: the file, locked buffer, handle and timed pass they share;
//! * `core_api`: every item of the core crate the tool uses, in one place;
//! * `progress`: the progress line on stderr;
//! * `json`: the JSON writer for `--json` and the `"aio"` block.

mod args;
mod bench;
mod core_api;
mod info;
mod json;
mod progress;
mod runner;
mod tune;

use args::CliError;

const USAGE: &str = "\
Usage: deepnvme <COMMAND> [OPTIONS]

DeepSpeed DeepNVMe (async I/O of tensors to NVMe) in Rust: measure and tune
the handle knobs on this machine.

Commands:
  bench    write then read a file with O_DIRECT and locked buffers; report
           GB/s and CPU seconds per GB (default: 1 GiB temp file in the
           current directory, removed afterwards)
  tune     sweep block size, queue depth, parallelism, single_submit and
           overlap_events; print a ranked table and the best DeepSpeed
           \"aio\" config block
  info     engine in use, O_DIRECT alignment of a directory, RLIMIT_MEMLOCK
  help     this text, or `deepnvme help <COMMAND>`

Options:
  -h, --help       this text
  -V, --version    the version

`deepnvme <COMMAND> --help` lists a command's options.
Environment: DEEPNVME_ENGINE=uring|psync forces the engine;
DEEPNVME_LOG=quiet silences informational lines.
";

fn command_usage(command: &str) -> Option<&'static str> {
    match command {
        "bench" => Some(bench::USAGE),
        "tune" => Some(tune::USAGE),
        "info" => Some(info::USAGE),
        _ => None,
    }
}

fn run(argv: Vec<String>) -> Result<(), CliError> {
    let mut argv = argv.into_iter();
    let Some(command) = argv.next() else {
        eprint!("{USAGE}");
        return Err(CliError::usage("", "no command given"));
    };
    let rest: Vec<String> = argv.collect();
    match command.as_str() {
        "bench" => bench::main(rest),
        "tune" => tune::main(rest),
        "info" => info::main(rest),
        "help" | "-h" | "--help" => match rest.first() {
            None => {
                print!("{USAGE}");
                Ok(())
            }
            Some(c) => match command_usage(c) {
                Some(text) => {
                    print!("{text}");
                    Ok(())
                }
                None => Err(CliError::usage("", format!("no help for unknown command {c:?}"))),
            },
        },
        "-V" | "--version" | "version" => {
            println!("deepnvme {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        other if other.starts_with('-') => Err(CliError::usage("", format!("unknown option {other} (a command comes first)"))),
        other => Err(CliError::usage("", format!("unknown command {other:?} (expected bench, tune or info)"))),
    }
}

fn main() {
    let mut argv = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(bad) => {
                eprintln!("deepnvme: error: argument {bad:?} is not valid UTF-8");
                std::process::exit(2);
            }
        }
    }
    // `run` returns only after everything it owns (handle, buffer, temp
    // file) is dropped, so the temp file is gone before the exit.
    let code = match run(argv) {
        Ok(()) => 0,
        Err(CliError::Usage { msg, command }) => {
            eprintln!("deepnvme: error: {msg}");
            if command.is_empty() {
                eprintln!("Try 'deepnvme --help'.");
            } else {
                eprintln!("Try 'deepnvme {command} --help'.");
            }
            2
        }
        Err(CliError::Failed(msg)) => {
            eprintln!("deepnvme: error: {msg}");
            1
        }
        Err(CliError::Interrupted) => {
            eprintln!("deepnvme: interrupted");
            130
        }
    };
    std::process::exit(code);
}
