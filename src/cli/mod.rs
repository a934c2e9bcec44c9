//! Command line: parses arguments, runs one command, prints its result
//! document and turns its reason into the exit code. The argument
//! definitions (`args`, the only clap) are apart from what turns them into
//! the library's options (`config`), the dispatch to a command
//! (`dispatch`) and the delivery of its document (`deliver`).

mod args;
mod config;
mod deliver;
mod dispatch;

use std::process::ExitCode;

use clap::Parser;

use crate::error::Result;

pub use args::Cli;

/// Entry point: returns the process exit code.
pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors
            // print to stderr and exit 2.
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    init_tracing(&cli.global.log_level);
    match execute(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(e.reason.exit_code())
        }
    }
}

/// Diagnostics on stderr at `level` (or RUST_LOG), secrets masked; shared by
/// every binary of the package.
pub fn init_tracing(level: &str) {
    gpu_driver_contract::logging::init_tracing(
        level,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
}

/// Runs the command; `Err` only when the result itself cannot be delivered.
pub fn execute(cli: &Cli) -> Result<u8> {
    let g = &cli.global;
    crate::extract::set_limits(crate::extract::Limits {
        max_bytes: g.max_unpacked_size.saturating_mul(1 << 20),
        max_entries: g.max_unpacked_entries,
    });
    match dispatch::execute_tool(g, &cli.command)? {
        Some(code) => Ok(code),
        None => dispatch::execute_step(g, &cli.command),
    }
}
