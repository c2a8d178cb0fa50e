//! Where a started platform's time to first token goes, from its own
//! spans: the platform exports its traces (OTLP http/protobuf) to a
//! collector in this process, each request is found by the trace id its
//! gateway returns as `x-request-id`, and the interval from the client's
//! send to its first token is cut at the spans' starts and ends:
//!
//! - `edge`: the send to the gateway's server span (connection, parse);
//! - `gateway`: to the decode worker's server span (authentication,
//!   routing, the signed context, the hop);
//! - `to_prefill`: to the prefill worker's server span (decode admission,
//!   the grant, the link), for a prompt computed there;
//! - `prefill`: the prefill worker's queue and compute (`prefill.compute`);
//! - `last_mile`: from the prompt computed (at prefill, or from the decode
//!   worker's server span when it computed the prompt itself) to the first
//!   token at the client: the transfer's tail, the first decode step, the
//!   way back.
//!
//! Medians over a pass's requests, with how many landed their prompt from a
//! prefill worker.

use anyhow::Context;
use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde::Serialize;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// An OTLP trace receiver: what it was sent, in arrival order.
pub(super) struct Collector {
    /// `http://127.0.0.1:PORT/v1/traces`.
    pub(super) endpoint: String,
    listener: Option<std::net::TcpListener>,
    bodies: Option<mpsc::UnboundedReceiver<Bytes>>,
    /// Spans by trace id (hex), as decoded so far.
    spans: HashMap<String, Vec<Span>>,
}

/// One span: its name and start and end (Unix nanoseconds).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Span {
    pub(super) name: String,
    pub(super) start: u64,
    pub(super) end: u64,
}

/// What one request's client saw.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    /// The gateway's `x-request-id` (its trace id).
    pub(super) trace: String,
    /// Unix nanoseconds at the send.
    pub(super) sent: u64,
    /// Unix nanoseconds at the first token.
    pub(super) first: u64,
}

/// Medians of a pass's phases, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Breakdown {
    /// Requests whose spans were found.
    pub(crate) traced: usize,
    /// Of those, prompts landed from a prefill worker.
    pub(crate) landed: usize,
    pub(crate) edge_ms: f64,
    pub(crate) gateway_ms: f64,
    /// Over landed prompts only (0 when none).
    pub(crate) to_prefill_ms: f64,
    pub(crate) prefill_ms: f64,
    pub(crate) last_mile_ms: f64,
}

impl Collector {
    /// Binds the receiver's port (served once [`Collector::serve`] runs).
    pub(super) fn bind() -> anyhow::Result<Collector> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let endpoint = format!("http://{}/v1/traces", listener.local_addr()?);
        Ok(Collector {
            endpoint,
            listener: Some(listener),
            bodies: None,
            spans: HashMap::new(),
        })
    }

    /// Starts answering OTLP exports on the current runtime.
    pub(super) fn serve(&mut self) -> anyhow::Result<()> {
        let listener = self.listener.take().context("the collector serves once")?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (tx, rx) = mpsc::unbounded_channel();
        self.bodies = Some(rx);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(body);
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(())
    }

    /// Decodes what arrived, waiting up to `wait` for every request in
    /// `seen` to have its gateway's server span (the last to end).
    pub(super) async fn breakdown(&mut self, seen: &[Seen], wait: Duration) -> Option<Breakdown> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            self.drain();
            let complete = seen.iter().all(|s| {
                self.spans
                    .get(&s.trace)
                    .is_some_and(|v| v.iter().any(|x| is_gateway(&x.name)))
            });
            if complete || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        phases(seen, &self.spans)
    }

    fn drain(&mut self) {
        let Some(rx) = self.bodies.as_mut() else {
            return;
        };
        while let Ok(body) = rx.try_recv() {
            let Ok(req) = ExportTraceServiceRequest::decode(body) else {
                continue;
            };
            for rs in req.resource_spans {
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        self.spans
                            .entry(hex::encode(&s.trace_id))
                            .or_default()
                            .push(Span {
                                name: s.name,
                                start: s.start_time_unix_nano,
                                end: s.end_time_unix_nano,
                            });
                    }
                }
            }
        }
    }
}

/// The gateway's server span of a completion (the OpenAI routes
/// `bench serving` and other OpenAI clients call).
fn is_gateway(name: &str) -> bool {
    name == "POST /v1/completions" || name == "POST /v1/chat/completions"
}

/// Unix nanoseconds at `at`.
pub(super) fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The phases of every request in `seen` whose spans are all there.
fn phases(seen: &[Seen], spans: &HashMap<String, Vec<Span>>) -> Option<Breakdown> {
    let ms = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1e6;
    let (mut edge, mut gateway, mut to_prefill, mut prefill, mut last) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in seen {
        let Some(trace) = spans.get(&s.trace) else {
            continue;
        };
        let find = |name: &str| trace.iter().find(|x| x.name == name);
        let Some(gw) = trace.iter().find(|x| is_gateway(&x.name)) else {
            continue;
        };
        let Some(decode) = find("POST /v1/generate") else {
            continue;
        };
        edge.push(ms(s.sent, gw.start));
        gateway.push(ms(gw.start, decode.start));
        let computed = match (find("prefill"), find("prefill.compute")) {
            (Some(p), Some(c)) => {
                to_prefill.push(ms(decode.start, p.start));
                prefill.push(ms(p.start, c.end));
                c.end
            }
            _ => decode.start,
        };
        last.push(ms(computed, s.first));
    }
    if edge.is_empty() {
        return None;
    }
    Some(Breakdown {
        traced: edge.len(),
        landed: prefill.len(),
        edge_ms: median(edge),
        gateway_ms: median(gateway),
        to_prefill_ms: median(to_prefill),
        prefill_ms: median(prefill),
        last_mile_ms: median(last),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl std::fmt::Display for Breakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "edge {:.1} + gateway {:.1} + to prefill {:.1} + prefill {:.1} + last mile {:.1} ms \
             (medians of {} traced, {} landed from prefill)",
            self.edge_ms,
            self.gateway_ms,
            self.to_prefill_ms,
            self.prefill_ms,
            self.last_mile_ms,
            self.traced,
            self.landed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(name: &str, start: u64, end: u64) -> Span {
        Span {
            name: name.to_owned(),
            start: start * 1_000_000,
            end: end * 1_000_000,
        }
    }

    /// A landed prompt and one computed by the decode worker: each phase
    /// is the interval between the spans' edges, in milliseconds.
    #[test]
    fn phases_cut_the_interval_at_the_spans() {
        let mut spans = HashMap::new();
        spans.insert(
            "a".to_owned(),
            vec![
                span("POST /v1/completions", 2, 500),
                span("POST /v1/generate", 5, 490),
                span("prefill", 9, 300),
                span("prefill.compute", 10, 200),
            ],
        );
        spans.insert(
            "b".to_owned(),
            vec![
                span("POST /v1/completions", 1, 100),
                span("POST /v1/generate", 4, 90),
            ],
        );
        let seen = |trace: &str, sent: u64, first: u64| Seen {
            trace: trace.to_owned(),
            sent: sent * 1_000_000,
            first: first * 1_000_000,
        };
        let one = phases(&[seen("a", 0, 230)], &spans).expect("traced");
        assert_eq!(
            one,
            Breakdown {
                traced: 1,
                landed: 1,
                edge_ms: 2.0,
                gateway_ms: 3.0,
                to_prefill_ms: 4.0,
                prefill_ms: 191.0,
                last_mile_ms: 30.0,
            }
        );
        let local = phases(&[seen("b", 0, 24)], &spans).expect("traced");
        assert_eq!((local.landed, local.last_mile_ms), (0, 20.0));
        // A request whose trace never arrived is left out, not guessed.
        assert_eq!(phases(&[seen("c", 0, 10)], &spans), None);
    }
}
