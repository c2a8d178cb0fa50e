//! `bulkhead`: the platform's single binary. `main` parses arguments once and
//! hands off to the subcommand's module.

mod bench;
mod bench_chaos;
mod bench_gateway;
mod bench_long;
mod bench_neighbours;
mod bench_prefix;
mod bench_serving;
mod bench_telemetry;
mod bench_transfer;
mod cli;
mod control_plane;
mod gateway;
mod generate;
mod ops;
mod prober;
mod register;
mod serve;
mod tls;
mod up;
mod up_child;
mod usage_report;

use clap::Parser;

/// A listener whose connections send small writes at once (no Nagle delay):
/// streamed tokens and short JSON answers must not wait for an ACK.
pub(crate) fn nodelay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

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
