//! A worker's usage reporter: the records its calls produced
//! (`bulkhead_node::usage`) go to the control plane's ledger in batches
//! (`POST /admin/v1/usage`), at most a second after the call ended. A batch
//! the control plane did not acknowledge is sent again, whole: the ledger
//! counts each call id once, so a repeat costs nothing. Records wait in
//! memory while the control plane is away (up to [`MAX_PENDING`], oldest
//! dropped past that, with an error logged).

use bulkhead_control_api::{
    Client, ModelSlug, Timestamp, UsageEvent, UsageRecorded, UsageReport, error_chain,
};
use bulkhead_node::usage::UsageRecord;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Records held while the control plane cannot be reached.
const MAX_PENDING: usize = 100_000;
/// Events per report.
const BATCH: usize = 500;

/// Reports every record from `rx` through `client` until `rx` closes
/// (then sends what is left, once).
pub(crate) async fn run(mut rx: UnboundedReceiver<UsageRecord>, client: Client) {
    let mut pending: VecDeque<UsageEvent> = VecDeque::new();
    let mut open = true;
    let mut backoff = Duration::from_millis(200);
    let mut last_tries = 3;
    while open || !pending.is_empty() {
        if pending.is_empty() {
            match rx.recv().await {
                Some(r) => pending.extend(event(r)),
                None => break,
            }
        }
        // Gather what else ended meanwhile (a short wait batches a burst).
        tokio::time::sleep(Duration::from_millis(50)).await;
        loop {
            match rx.try_recv() {
                Ok(r) => pending.extend(event(r)),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if pending.len() > MAX_PENDING {
            let dropped = pending.len() - MAX_PENDING;
            pending.drain(..dropped);
            tracing::error!(
                dropped,
                "usage records dropped: the control plane has been unreachable too long"
            );
        }
        let n = pending.len().min(BATCH);
        let report = UsageReport {
            events: pending.iter().take(n).cloned().collect(),
        };
        match client
            .post::<_, UsageRecorded>("/admin/v1/usage", &report)
            .await
        {
            Ok(_) => {
                pending.drain(..n);
                backoff = Duration::from_millis(200);
            }
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), pending = pending.len(), "usage report failed; retrying");
                if !open {
                    // Shutting down: a few more tries are all there is.
                    last_tries -= 1;
                    if last_tries == 0 {
                        tracing::error!(
                            lost = pending.len(),
                            "usage records not reported before shutdown"
                        );
                        return;
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

fn event(r: UsageRecord) -> Option<UsageEvent> {
    // The slug came from a context this platform signed for this worker's
    // model, so it parses.
    let model: ModelSlug = match r.model.parse() {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(model = %r.model, error = %e, "a usage record with no valid model");
            return None;
        }
    };
    Some(UsageEvent {
        call_id: r.call_id,
        account_id: r.account,
        model,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        context: r.context,
        finish: r.finish,
        at: Timestamp::from_millis(r.at_ms),
    })
}
