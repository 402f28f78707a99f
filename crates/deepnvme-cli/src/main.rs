//! The `deepnvme` command-line tool: benchmark (`bench`), knob sweep
//! (`tune`), environment report (`info`), checks (`doctor`) and stripe
//! sets (`stripe`) for the DeepNVMe core.
//!
//! This file owns the top-level command (clap), subcommand dispatch and the
//! exit status: 0 on success, 1 when the work fails, 2 for a bad command
//! line (or input the command cannot start on), 130 after Ctrl-C. What each sibling module owns:
//! * `args`: the options `bench` and `tune` share, value parsers (sizes with
//!   suffixes, counts, switches), sizes for output, [`CliError`];
//! * `bench`, `tune`, `info`: the subcommands, their options and `--json`;
//! * `doctor`: the checks of `deepnvme doctor`, one module per concern;
//! * `stripe`: `deepnvme stripe` (create, inspect, remove, cat);
//! * `runner`: the file, locked buffer, handle and timed pass they share;
//! * `core_api`: every item of the core crate the tool uses, in one place;
//! * `progress`: the progress line (and informational lines) on stderr.

mod args;
mod bench;
mod core_api;
mod doctor;
mod info;
mod progress;
mod runner;
mod stripe;
mod tune;

use clap::{CommandFactory, Parser, Subcommand};

use args::CliError;

/// DeepSpeed DeepNVMe (async I/O of tensors to NVMe) in Rust: measure and
/// tune the handle knobs on this machine.
#[derive(Parser, Debug)]
#[command(
    name = "deepnvme",
    version,
    arg_required_else_help = true,
    args_override_self = true,
    subcommand_required = true,
    after_help = "\
`deepnvme <COMMAND> --help` lists a command's options.
Environment: DEEPNVME_ENGINE=uring|psync forces the engine;
DEEPNVME_LOG=quiet silences informational lines."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    #[command(about = bench::ABOUT, long_about = bench::LONG_ABOUT, after_help = bench::AFTER_HELP)]
    Bench(bench::BenchArgs),
    #[command(about = tune::ABOUT, long_about = tune::LONG_ABOUT, after_help = tune::AFTER_HELP)]
    Tune(tune::TuneArgs),
    #[command(about = info::ABOUT, long_about = info::LONG_ABOUT)]
    Info(info::InfoArgs),
    #[command(about = doctor::ABOUT, long_about = doctor::LONG_ABOUT, after_help = doctor::AFTER_HELP)]
    Doctor(doctor::DoctorArgs),
    #[command(about = stripe::ABOUT, long_about = stripe::LONG_ABOUT, after_help = stripe::AFTER_HELP)]
    Stripe(stripe::StripeArgs),
    /// The version (as --version)
    #[command(hide = true)]
    Version,
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Bench(a) => bench::main(a),
        Command::Tune(a) => tune::main(a),
        Command::Info(a) => info::main(a),
        Command::Doctor(a) => doctor::main(a),
        Command::Stripe(a) => stripe::main(a),
        Command::Version => {
            println!("deepnvme {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    }
}

/// A usage error found after parsing, shown as clap shows its own: the
/// message, the command's usage line and a pointer to `--help`.
fn usage_error(command: &str, msg: &str) -> clap::Error {
    let mut cmd = Cli::command();
    cmd.build();
    let cmd = cmd.find_subcommand_mut(command).expect("usage errors name a subcommand");
    cmd.error(clap::error::ErrorKind::ValueValidation, msg)
}

fn main() {
    // Help, --version and bad command lines exit here (0 or 2); nothing
    // has been created yet. `doctor --json` owes stdout a JSON document
    // even then.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if e.exit_code() != 0 && doctor::wants_json(std::env::args()) {
                doctor::print_json_error(e.render().to_string().trim());
            }
            e.exit()
        }
    };
    // `run` returns only after everything it owns (handle, buffer, temp
    // file) is dropped, so the temp file is gone before the exit.
    let code = match run(cli) {
        Ok(()) => 0,
        Err(CliError::Usage { msg, command }) => {
            let _ = usage_error(command, &msg).print();
            2
        }
        Err(CliError::Failed(msg)) => {
            eprintln!("deepnvme: error: {msg}");
            1
        }
        Err(CliError::NotRun(msg)) => {
            eprintln!("deepnvme: error: {msg}");
            2
        }
        Err(CliError::Interrupted) => {
            eprintln!("deepnvme: interrupted");
            130
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
