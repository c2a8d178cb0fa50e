//! Usage metering at the source: the worker counts every call it served
//! from its signed tenant context (account, model, single-use call id) and
//! the engine's exact token counts, and hands one [`UsageRecord`] per call
//! to a [`UsageSink`] (the binary reports them to the control plane).
//!
//! The policy: the prompt is billed once the call has answered its first
//! token, output tokens as the engine emitted them, including a stream
//! whose client went away (the worker cancels the request and still reads
//! the engine's final count); a call whose client went away before its
//! first token is billed the prompt tokens computed by then; a call refused
//! at admission, or failed before its first token (a late refusal, a failed
//! KV transfer the gateway may retry elsewhere), costs nothing and is never
//! recorded.

use tokio::sync::mpsc;

/// One call's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRecord {
    /// The call's single-use id (its signed context's `request_id`).
    pub call_id: String,
    /// The account.
    pub account: String,
    /// The model slug.
    pub model: String,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens the engine emitted.
    pub completion_tokens: u64,
    /// The call's signed tenant context, as the gateway sent it: the
    /// control plane accepts the record only for its account, model and
    /// call id.
    pub context: String,
    /// How it ended: the engine's finish reason, or `error`.
    pub finish: String,
    /// When it ended (ms since the Unix epoch).
    pub at_ms: i64,
}

/// Where a worker's usage records go.
#[derive(Debug, Clone)]
pub struct UsageSink(mpsc::UnboundedSender<UsageRecord>);

impl UsageSink {
    /// A sink and the receiver its records arrive on.
    pub fn new() -> (UsageSink, mpsc::UnboundedReceiver<UsageRecord>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (UsageSink(tx), rx)
    }

    pub(crate) fn record(&self, r: UsageRecord) {
        crate::metrics::usage_recorded(&r.model, r.prompt_tokens, r.completion_tokens);
        let _ = self.0.send(r);
    }
}

/// Now, in ms since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
