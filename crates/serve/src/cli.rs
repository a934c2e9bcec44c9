//! The command line's start and end the operator's and the exporter's
//! binaries share: clap's arguments, logging, and the exit code.

use std::fmt::Display;
use std::process::ExitCode;

/// A binary's whole body, from its command line to its exit code: parses
/// the arguments into `A` (clap's message and exit code on bad ones, 0
/// after `--help` or `--version`), sets up logging with `init_logging`
/// (told whether stderr is a terminal, for colours), then runs `execute`:
/// exit 0 when it returns, 1 with its error logged as one line.
pub fn run_command_line<A: clap::Parser, E: Display>(
    init_logging: impl FnOnce(&A, bool),
    execute: impl FnOnce(A) -> Result<(), E>,
) -> ExitCode {
    let args = match A::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    init_logging(&args, std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match execute(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
