//! Reading a generation to its end, for the non-streaming answers.

use super::ends::finish_reason_of;
use super::*;
use bulkhead_worker_api::TokenLogprobs;

/// The end of a collected generation.
#[derive(Debug)]
pub(crate) struct Collected {
    pub(crate) text: String,
    /// Each token's log-probabilities, when the request asked for them.
    pub(crate) logprobs: Vec<TokenLogprobs>,
    pub(crate) finish_reason: String,
    pub(crate) usage: Usage,
}

/// Reads a generation to its end.
pub(crate) async fn collect(g: Generation) -> Result<Collected, GatewayError> {
    let (first, mut rest, held, mut ends) = g.into_parts();
    let mut line = Some(Ok(first));
    let mut answer = String::new();
    let mut logprobs = Vec::new();
    let result = loop {
        match line {
            Some(Ok(Line::Token {
                text, logprobs: l, ..
            })) => {
                ends.started = true;
                answer.push_str(&text);
                logprobs.extend(l);
                line = rest.next().await;
            }
            Some(Ok(Line::Finished {
                finish_reason,
                text,
                usage,
            })) => {
                answer.push_str(&text);
                ends.finished(usage);
                // The worker's body read to its end, beside the answer, so
                // its connection is kept for the next call.
                tokio::spawn(rest.finish());
                break Ok(Collected {
                    text: answer,
                    logprobs,
                    finish_reason: finish_reason_of(&finish_reason),
                    usage,
                });
            }
            Some(Ok(Line::Error { error })) => break Err(ends.worker_failed(&error)),
            Some(Err(e)) => break Err(ends.broke(e.into())),
            None => break Err(ends.broke(GatewayError::Upstream)),
        }
    };
    drop((held, ends));
    result
}
