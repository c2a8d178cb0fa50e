//! What a generation settles when it ends, however it ends: its metrics
//! and its budget reservation.

use super::*;

/// What a generation holds until its answer ends (released when dropped).
pub(super) type Held = (Permit, NodeLease, crate::watch::Tracked);

impl Generation {
    /// The first line, the rest, what is held, and what settles at the end.
    pub(super) fn into_parts(self) -> (Line, LineStream, Held, Ends) {
        (self.first, self.rest, self.held, self.ends)
    }
}

/// What a generation settles when it ends: its metrics and its budget
/// reservation. A reservation it never settles (the worker failed
/// mid-answer, the client went away) stays whole when this is dropped.
#[derive(Debug)]
pub(super) struct Ends {
    pub(super) timer: Option<GenAiTimer>,
    pub(super) bill: Option<Bill>,
    /// A token has arrived: the worker computed something.
    pub(super) started: bool,
}

impl Ends {
    pub(super) fn new(timer: GenAiTimer, bill: Bill) -> Ends {
        Ends {
            timer: Some(timer),
            bill: Some(bill),
            started: false,
        }
    }

    /// A good end with the worker's count.
    pub(super) fn finished(&mut self, usage: Usage) {
        if let Some(t) = self.timer.take() {
            t.finished(usage.prompt_tokens, usage.completion_tokens);
        }
        if let Some(b) = self.bill.take() {
            b.settle(usage);
        }
    }

    /// The worker's own error line; before any token it refused the
    /// request, which then costs nothing.
    pub(super) fn worker_failed(
        &mut self,
        error: &bulkhead_worker_api::ErrorDetail,
    ) -> GatewayError {
        let e = GatewayError::from(crate::upstream::UpstreamError::Worker {
            status: crate::upstream::status_of(&error.code),
            code: error.code.clone(),
            message: error.message.clone(),
            overflow: error.overflow,
            retry_after_ms: error.retry_after_ms,
        });
        if !self.started
            && let Some(b) = self.bill.take()
        {
            b.refused();
        }
        self.broke(e)
    }

    /// Any other failed end (`kind` on the metrics).
    pub(super) fn broke(&mut self, e: GatewayError) -> GatewayError {
        self.gone(e.kind());
        e
    }

    /// The end, for the metrics, as `kind`.
    pub(super) fn gone(&mut self, kind: &'static str) {
        if let Some(t) = self.timer.take() {
            t.failed(kind);
        }
    }
}

/// OpenAI's finish reasons: `stop` or `length`.
pub(crate) fn finish_reason_of(worker: &str) -> String {
    match worker {
        "length" => "length".to_owned(),
        _ => "stop".to_owned(),
    }
}
