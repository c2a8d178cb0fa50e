//! Streaming a generation as server-sent events, each API rendering its own
//! chunks.

use super::ends::{Ends, finish_reason_of};
use super::*;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use bulkhead_worker_api::TokenLogprobs;
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// What a streaming renderer is given.
#[derive(Debug)]
pub(crate) enum StreamEvent<'a> {
    /// Generated text, and the log-probabilities of the tokens it
    /// completes (when asked for).
    Text(&'a str, &'a [TokenLogprobs]),
    /// The end.
    Finished { finish_reason: String, usage: Usage },
    /// The end, failed.
    Failed(GatewayError),
}

/// Streams a generation as server-sent events: each event the renderer
/// returns is one `data:` line, and `data: [DONE]` follows a good end. When
/// the client goes away the task ends, dropping the worker connection, and
/// the worker cancels the request.
pub(crate) fn sse<F>(g: Generation, mut render: F) -> Response
where
    F: FnMut(StreamEvent<'_>) -> Vec<String> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let (first, mut rest, held, ends) = g.into_parts();
        let mut stream = SseState {
            ends,
            held: Vec::new(),
        };
        let mut line: Option<Result<Line, UpstreamError>> = Some(Ok(first));
        let mut answered = false;
        loop {
            let (events, end) = stream.events(line, &mut render);
            if !send_events(&tx, events).await {
                stream.ends.gone("client_gone");
                break;
            }
            if let Some(ok) = end {
                if ok {
                    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                }
                answered = ok;
                break;
            }
            line = tokio::select! {
                l = rest.next() => l,
                () = tx.closed() => {
                    stream.ends.gone("client_gone");
                    break;
                }
            };
        }
        drop((stream, held));
        if answered {
            // The client's stream ends first; then the worker's body is
            // read to its end, so its connection is kept for the next call.
            drop(tx);
            rest.finish().await;
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}

/// Sends each event as one `data:` line; false once the client is gone.
async fn send_events(tx: &mpsc::Sender<Result<Bytes, Infallible>>, events: Vec<String>) -> bool {
    for e in events {
        if tx
            .send(Ok(Bytes::from(format!("data: {e}\n\n"))))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}

/// A stream between worker lines.
#[derive(Debug)]
struct SseState {
    ends: Ends,
    /// Log-probabilities of tokens whose text is held back, sent with the
    /// next text.
    held: Vec<TokenLogprobs>,
}

impl SseState {
    /// The events of one worker line, and whether the stream ends there
    /// (`Some(true)`: well).
    fn events<F>(
        &mut self,
        line: Option<Result<Line, UpstreamError>>,
        render: &mut F,
    ) -> (Vec<String>, Option<bool>)
    where
        F: FnMut(StreamEvent<'_>) -> Vec<String>,
    {
        match line {
            Some(Ok(Line::Token { text, logprobs, .. })) => {
                self.ends.started = true;
                self.held.extend(logprobs);
                if text.is_empty() {
                    return (Vec::new(), None);
                }
                if let Some(t) = &mut self.ends.timer {
                    t.first_token();
                }
                let events = render(StreamEvent::Text(&text, &self.held));
                self.held.clear();
                (events, None)
            }
            Some(Ok(Line::Finished {
                finish_reason,
                usage,
                text,
            })) => {
                let mut events = Vec::new();
                if !text.is_empty() || !self.held.is_empty() {
                    events.extend(render(StreamEvent::Text(&text, &self.held)));
                    self.held.clear();
                }
                events.extend(render(StreamEvent::Finished {
                    finish_reason: finish_reason_of(&finish_reason),
                    usage,
                }));
                self.ends.finished(usage);
                (events, Some(true))
            }
            Some(Ok(Line::Error { error })) => {
                let e = self.ends.worker_failed(&error);
                (render(StreamEvent::Failed(e)), Some(false))
            }
            Some(Err(e)) => {
                let e = self.ends.broke(e.into());
                (render(StreamEvent::Failed(e)), Some(false))
            }
            None => {
                let e = self.ends.broke(GatewayError::Upstream);
                (render(StreamEvent::Failed(e)), Some(false))
            }
        }
    }
}
