//! Batches (OpenAI's `/v1/batches`) as the gateway asks the control plane
//! for them, always naming the account it authenticated, and as it gets
//! them back (times in the control plane's milliseconds; the gateway
//! writes OpenAI's seconds).

use crate::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The endpoints a batch's lines may call: OpenAI's, and `/ai/run`, Workers
/// AI's queued requests, whose lines each call
/// `/client/v4/accounts/{account}/ai/run/{model}` of the batch's account.
pub const BATCH_ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/ai/run"];
/// The completion windows a batch may ask for.
pub const COMPLETION_WINDOWS: &[&str] = &["24h"];
/// How long a batch may take before it expires (its completion window).
pub const COMPLETION_WINDOW_MS: i64 = 24 * 3_600 * 1_000;
/// The most batches an account may have unfinished at once.
pub const MAX_OPEN_BATCHES_PER_ACCOUNT: u64 = 10;
/// The most metadata pairs, and the longest key and value, in bytes (as
/// OpenAI bounds them).
pub const METADATA_BOUNDS: (usize, usize, usize) = (16, 64, 512);

/// `POST /admin/v1/batches`: a batch for the account the gateway
/// authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchCreate {
    /// The account it is for.
    pub account_id: String,
    /// One of the account's files, purpose `batch`.
    pub input_file_id: String,
    /// One of [`BATCH_ENDPOINTS`]; every line's `url` must equal it.
    pub endpoint: String,
    /// One of [`COMPLETION_WINDOWS`].
    pub completion_window: String,
    /// The client's labels, returned as given.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// How many of a batch's lines there are and how many have an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCounts {
    /// Lines in the input.
    pub total: u64,
    /// Lines answered with a success.
    pub completed: u64,
    /// Lines answered with an error.
    pub failed: u64,
}

/// Why a batch's input was refused, one entry per finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchError {
    /// A short machine-readable code (`invalid_url`, `duplicate_custom_id`, ...).
    pub code: String,
    /// What is wrong.
    pub message: String,
    /// The input line (from 1), where one is at fault.
    pub line: Option<u64>,
}

/// A batch as its account sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchView {
    /// `batch_` and 24 hex digits.
    pub id: String,
    /// Whose it is.
    pub account_id: String,
    /// The endpoint its lines call.
    pub endpoint: String,
    /// The file it was created from.
    pub input_file_id: String,
    /// As asked.
    pub completion_window: String,
    /// `validating` (checked, waiting for the runner), `failed` (its input
    /// was refused), `in_progress`, `finalizing`, `completed`, `expired`,
    /// `cancelling` or `cancelled`.
    pub status: String,
    /// Why a `failed` batch was refused (empty otherwise).
    pub errors: Vec<BatchError>,
    /// The answers that succeeded, once finished.
    pub output_file_id: Option<String>,
    /// The answers that failed, once finished (absent when none did).
    pub error_file_id: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its completion window ends.
    pub expires_at: Timestamp,
    /// When the runner first took it.
    pub in_progress_at: Option<Timestamp>,
    /// When its last line was answered.
    pub finalizing_at: Option<Timestamp>,
    /// When its output was written.
    pub completed_at: Option<Timestamp>,
    /// When its input was refused.
    pub failed_at: Option<Timestamp>,
    /// When its window ran out.
    pub expired_at: Option<Timestamp>,
    /// When a cancel was asked.
    pub cancelling_at: Option<Timestamp>,
    /// When it stopped after a cancel.
    pub cancelled_at: Option<Timestamp>,
    /// Its lines and answers.
    pub request_counts: BatchCounts,
    /// As given at creation.
    pub metadata: Option<BTreeMap<String, String>>,
}

impl BatchView {
    /// Whether the batch will change no more.
    pub fn is_final(&self) -> bool {
        matches!(
            self.status.as_str(),
            "failed" | "completed" | "expired" | "cancelled"
        )
    }
}

/// A batch the runner took, with the lines that have no answer yet. The
/// lease lasts until `lease_until`; the runner renews it while it works.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchLease {
    /// The batch.
    pub batch: BatchView,
    /// Until when no other runner takes it.
    pub lease_until: Timestamp,
    /// An API token of the batch's account, made for this lease (the
    /// batch's earlier ones are revoked): the runner calls the gateway
    /// with it. Shown once; revoked when the batch finishes.
    pub token: String,
    /// Its unanswered lines, in input order (none when it is to be
    /// finished: cancelled, expired, or every line answered).
    pub lines: Vec<BatchLine>,
}

/// One input line to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchLine {
    /// Its place among the input's lines, from 0.
    pub index: u64,
    /// The client's id for it.
    pub custom_id: String,
    /// The gateway path it calls.
    pub url: String,
    /// The request body, as JSON text.
    pub body: String,
}

/// One line's answer, as the runner got it from the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAnswer {
    /// The line's place, from 0.
    pub index: u64,
    /// The HTTP status the gateway answered.
    pub status_code: u16,
    /// The gateway's request id for it, when it gave one.
    #[serde(default)]
    pub request_id: Option<String>,
    /// The answer's body, as JSON text.
    pub body: String,
}

/// `POST /admin/v1/batch-runs/{id}/answers`: answers of a leased batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAnswers {
    /// At most 100 answers.
    pub answers: Vec<BatchAnswer>,
}

/// What recording answers changed: answers new to the batch, and those it
/// had already (a line run again after a restart keeps its first answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRecorded {
    /// Answers written.
    pub recorded: u64,
    /// Answers the batch had already.
    pub duplicates: u64,
}

/// `GET /admin/v1/batches`: a page of an account's batches, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchList {
    /// The page.
    pub data: Vec<BatchView>,
    /// Whether older batches follow (ask again with `after` the last id).
    pub has_more: bool,
}
