//! `bulkhead batch-runner`: runs tenants' batches. `up` starts and
//! supervises it.
//!
//! It takes one batch at a time from the control plane (over the internal
//! port, with the batch runner's certificate; no operator token), and calls
//! the gateway's public API for each line without an answer, as the
//! batch's account: with the API token the control plane made for this
//! taking, and the line's number in `bulkhead-batch-line`, so the gateway
//! runs it in the batch class (after interactive prompt work of every
//! tenant) and bills the line once however often it runs. Answers are
//! recorded as they come; the hold is renewed while it works (a cancel
//! seen then stops new lines); last the batch is finished into its output
//! and error files.
//!
//! It keeps nothing itself: killed at any point, the next runner (or this
//! one restarted) takes the batch once the hold lapses and runs only the
//! lines without an answer.

use anyhow::Context;
use bulkhead_control_api::{
    BatchAnswer, BatchAnswers, BatchLease, BatchLine, BatchView, Client, Credentials,
};
use bulkhead_trust::Role as CertRole;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use std::time::Duration;
use tokio::task::JoinSet;

/// Flags of `bulkhead batch-runner`.
#[derive(Debug, Args)]
pub(crate) struct BatchRunnerArgs {
    /// The control plane's internal URL, `https://HOST:PORT`.
    #[arg(long = "control-plane", env = "BULKHEAD_CONTROL_PLANE_URL")]
    control_plane: String,
    /// The gateway tenants call, `http://HOST:PORT`.
    #[arg(long, env = "BULKHEAD_GATEWAY_URL")]
    gateway: String,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
    /// Lines of a batch in flight at once.
    #[arg(long, env = "BULKHEAD_BATCH_CONCURRENCY", default_value_t = 4)]
    concurrency: usize,
    /// Seconds between looks for work while there is none.
    #[arg(long, default_value_t = 1.0)]
    poll_secs: f64,
}

/// How often a held batch is renewed (its hold lasts 30 s).
const RENEW: Duration = Duration::from_secs(10);
/// Answers recorded together.
const FLUSH: usize = 20;

pub(crate) fn run(args: &BatchRunnerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let gateway = args.gateway.trim_end_matches('/').to_owned();
    anyhow::ensure!(
        gateway.starts_with("http://"),
        "--gateway must be an http:// URL, not {gateway}"
    );
    let identity = args.tls.load(CertRole::BatchRunner)?;
    let cp = Client::with_identity(
        &Credentials {
            control_plane_url: args.control_plane.clone(),
            // The runner's routes take its certificate, not a token.
            operator_token: String::new(),
        },
        &identity,
    )?;
    let poll = Duration::from_secs_f64(args.poll_secs.clamp(0.05, 60.0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        println!(
            "bulkhead batch-runner: listening for batches control-plane={} gateway={gateway}",
            args.control_plane
        );
        let runner = Runner {
            cp,
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
            gateway,
            concurrency: args.concurrency,
        };
        // Doubled after each failure to reach the control plane, to 30 s.
        let mut backoff = poll;
        loop {
            let lease: Result<Option<BatchLease>, _> =
                runner.cp.post("/admin/v1/batch-runs/take", &json!({})).await;
            if lease.is_ok() {
                backoff = poll;
            }
            match lease {
                Ok(Some(lease)) => {
                    let id = lease.batch.id.clone();
                    match runner.batch(lease).await {
                        Ok(done) => tracing::info!(
                            batch = %id, status = %done.status,
                            completed = done.request_counts.completed,
                            failed = done.request_counts.failed, "batch finished"
                        ),
                        Err(e) => {
                            tracing::warn!(batch = %id, error = %format!("{e:#}"), "batch left for a later taking");
                            tokio::time::sleep(poll).await;
                        }
                    }
                }
                Ok(None) => tokio::time::sleep(poll).await,
                Err(e) => {
                    tracing::warn!(
                        error = %bulkhead_control_api::error_chain(&e),
                        retry_in_secs = backoff.as_secs_f64(),
                        "taking a batch"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
        }
    })
}

/// What running a batch needs.
struct Runner {
    cp: Client,
    http: HttpClient<HttpConnector, Full<Bytes>>,
    gateway: String,
    concurrency: usize,
}

impl Runner {
    /// Runs the lines of `lease`, recording answers as they come, and
    /// finishes the batch.
    async fn batch(&self, lease: BatchLease) -> anyhow::Result<BatchView> {
        let id = lease.batch.id.clone();
        let mut lines = lease.lines.into_iter();
        let (mut running, mut pending) = (JoinSet::new(), Vec::new());
        let mut renew = tokio::time::interval(RENEW);
        renew.tick().await;
        let mut stopped = lease.batch.status == "cancelling";
        let mut unanswered = false;
        loop {
            while running.len() < self.concurrency && !stopped {
                let Some(line) = lines.next() else { break };
                let call = Call {
                    http: self.http.clone(),
                    url: format!("{}{}", self.gateway, line.url),
                    token: lease.token.clone(),
                };
                running.spawn(async move { call.answer(line).await });
            }
            if running.is_empty() {
                break;
            }
            tokio::select! {
                Some(done) = running.join_next() => {
                    match done.context("a batch line's task")? {
                        Some(a) => pending.push(a),
                        None => unanswered = true,
                    }
                    if pending.len() >= FLUSH {
                        self.record(&id, &mut pending).await?;
                    }
                }
                _ = renew.tick() => {
                    self.record(&id, &mut pending).await?;
                    let view: BatchView = self
                        .cp
                        .post(&format!("/admin/v1/batch-runs/{id}/renew"), &json!({}))
                        .await?;
                    stopped |= view.status == "cancelling";
                }
            }
        }
        self.record(&id, &mut pending).await?;
        anyhow::ensure!(
            !unanswered || stopped,
            "the gateway could not be reached for some lines"
        );
        Ok(self
            .cp
            .post(&format!("/admin/v1/batch-runs/{id}/finish"), &json!({}))
            .await?)
    }

    /// Records `pending` answers of batch `id`, emptying it.
    async fn record(&self, id: &str, pending: &mut Vec<BatchAnswer>) -> anyhow::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let body = BatchAnswers {
            answers: std::mem::take(pending),
        };
        let _: serde_json::Value = self
            .cp
            .post(&format!("/admin/v1/batch-runs/{id}/answers"), &body)
            .await?;
        Ok(())
    }
}

/// One line's call to the gateway.
struct Call {
    http: HttpClient<HttpConnector, Full<Bytes>>,
    url: String,
    token: String,
}

impl Call {
    /// The gateway's answer to `line`, waiting out what asks to be waited
    /// out: a token the gateway has not seen yet (the routing table brings
    /// it within moments), and refusals with `retry-after`. `None` when
    /// the gateway cannot be reached: the line stays for a later taking.
    async fn answer(&self, line: BatchLine) -> Option<BatchAnswer> {
        let mut tries = 0u32;
        loop {
            tries += 1;
            let req = hyper::Request::post(&self.url)
                .header("authorization", format!("Bearer {}", self.token))
                .header("content-type", "application/json")
                .header(bulkhead_gateway::BATCH_LINE_HEADER, line.index.to_string())
                .body(Full::new(Bytes::from(line.body.clone())));
            let Ok(req) = req else {
                // The control plane checked every url; still, a line that
                // makes no request is answered, never retried for ever.
                let body = json!({"error": {"message": "the line's url is not a path", "type": "invalid_request_error"}});
                return Some(BatchAnswer {
                    index: line.index,
                    status_code: 400,
                    request_id: None,
                    body: body.to_string(),
                });
            };
            let resp = match self.http.request(req).await {
                Ok(r) => r,
                Err(e) if tries < 10 => {
                    tracing::debug!(error = %e, "the gateway, again in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(_) => return None,
            };
            let status = resp.status().as_u16();
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let request_id = header("x-request-id");
            let wait = match status {
                401 if tries <= 40 => Some(Duration::from_millis(250)),
                429 | 503 if tries <= 60 => Some(Duration::from_secs(
                    header("retry-after")
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(1)
                        .clamp(1, 30),
                )),
                _ => None,
            };
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
                continue;
            }
            return Some(BatchAnswer {
                index: line.index,
                status_code: status,
                request_id,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
    }
}
