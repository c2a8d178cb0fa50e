//! `bulkhead`: the platform's single binary. `main` parses arguments once and
//! hands off to the subcommand's module.

mod bench;
mod cli;
mod config;
mod generate;
mod gpu_check;
mod ops;
mod platform;
mod process;
mod tls;

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
