//! Process plumbing every component shares: the shutdown signal, the
//! plain-HTTP metrics port, listeners without Nagle delay, binding.

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Where Prometheus scrapes a component without a certificate.
#[derive(Debug, Args)]
pub(crate) struct MetricsArgs {
    /// Plain-HTTP address of `GET /metrics` and `GET /health` alone, for
    /// Prometheus and probes (off when absent; the worker API's port serves
    /// them too, to an operator certificate).
    #[arg(long)]
    metrics_listen: Option<String>,
}

impl MetricsArgs {
    /// Binds and serves the metrics port, if asked; returns ` metrics=ADDR`
    /// for the listening line.
    pub(crate) async fn start(&self) -> anyhow::Result<String> {
        // Probes (a kubelet has no client certificate) read /health here.
        let ops = bulkhead_telemetry::metrics_app()
            .route("/health", axum::routing::get(|| async { "ok\n" }));
        metrics_port(self.metrics_listen.as_deref(), ops).await
    }
}

/// Binds `addr` (when given) and serves `app` there, the Prometheus port;
/// returns ` metrics=ADDR` for the listening line (empty without one).
pub(crate) async fn metrics_port(addr: Option<&str>, app: axum::Router) -> anyhow::Result<String> {
    let Some(addr) = addr else {
        return Ok(String::new());
    };
    let l = bind(addr).await?;
    let bound = l.local_addr()?;
    tokio::spawn(async move { axum::serve(nodelay(l), app).await });
    Ok(format!(" metrics={bound}"))
}

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

/// Binds `addr`, naming it in the error.
pub(crate) async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
}
