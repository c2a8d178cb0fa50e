//! `bulkhead`: the platform's single binary. `main` parses arguments once and
//! hands off to the subcommand's module.

mod bench;
mod bench_transfer;
mod cli;
mod control_plane;
mod gateway;
mod generate;
mod ops;
mod register;
mod serve;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
