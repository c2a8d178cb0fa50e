//! Batches: a tenant's batch input copied in at creation, its status, and
//! one answer per line written once. Every read and cancel names the
//! account as well as the id, so another account's batch is not found,
//! exactly as an unknown id is not. The runner's side (taking a batch,
//! recording answers, finishing it) is in [`run`].

pub mod run;

use super::{Conn, get_opt_time, get_time, get_u64, to_i64};
use crate::Error;
use bulkhead_control_api::{
    BATCH_ENDPOINTS, BatchCounts, BatchCreate, BatchError, BatchView, COMPLETION_WINDOW_MS,
    COMPLETION_WINDOWS, MAX_OPEN_BATCHES_PER_ACCOUNT, METADATA_BOUNDS, Timestamp,
};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;
use std::collections::{BTreeMap, HashSet};

/// The statuses of a batch that is not finished, as SQL (a macro, so that
/// queries stay literals).
macro_rules! open {
    () => {
        "('validating', 'in_progress', 'finalizing', 'cancelling')"
    };
}
use open;

/// The most batches one list answers.
pub const MAX_LIST: usize = 100;

select_macro!(
    $ select_batches,
    "b.id, b.account_id, b.input_file_id, b.endpoint, b.completion_window, b.metadata, \
     b.status, b.errors, b.total, b.output_file_id, b.error_file_id, b.created_at, \
     b.expires_at, b.in_progress_at, b.finalizing_at, b.completed_at, b.failed_at, \
     b.expired_at, b.cancelling_at, b.cancelled_at, \
     CAST(COALESCE(r.ok, 0) AS BIGINT) AS ok, CAST(COALESCE(r.bad, 0) AS BIGINT) AS bad",
    "batches b LEFT JOIN (SELECT batch_id, \
     SUM(CASE WHEN status_code < 400 THEN 1 ELSE 0 END) AS ok, \
     SUM(CASE WHEN status_code >= 400 THEN 1 ELSE 0 END) AS bad \
     FROM batch_results GROUP BY batch_id) r ON r.batch_id = b.id"
);

/// Creates a batch of `req.input_file_id`'s lines. An input whose lines do
/// not all call `req.endpoint` with a distinct `custom_id` makes a batch
/// that is `failed` at once, with one error per finding (as OpenAI's
/// validation does); a valid one waits for the runner (`validating`).
pub async fn create(
    conn: &mut Conn,
    req: &BatchCreate,
    now: Timestamp,
) -> Result<BatchView, Error> {
    let account = req.account_id.as_str();
    if crate::AccountId::parse(account).is_none() {
        return Err(Error::Invalid("account_id is 32 hex digits".to_owned()));
    }
    one_of("endpoint", &req.endpoint, BATCH_ENDPOINTS)?;
    one_of(
        "completion_window",
        &req.completion_window,
        COMPLETION_WINDOWS,
    )?;
    check_metadata(req.metadata.as_ref())?;
    let open = sqlx::query(concat!(
        "SELECT COUNT(*) AS n FROM batches WHERE account_id = $1 AND status IN ",
        open!()
    ))
    .bind(account)
    .fetch_one(&mut *conn)
    .await?;
    let open = get_u64(&open, "n")?;
    if open >= MAX_OPEN_BATCHES_PER_ACCOUNT {
        return Err(Error::Invalid(format!(
            "an account runs at most {MAX_OPEN_BATCHES_PER_ACCOUNT} batches at once \
             ({open} are unfinished): wait for one or cancel it"
        )));
    }
    let file = super::files::get(conn, account, &req.input_file_id).await?;
    if file.purpose != "batch" {
        return Err(Error::Invalid(format!(
            "file {} has purpose {}; a batch's input has purpose batch",
            file.id, file.purpose
        )));
    }
    let input = super::files::content(conn, account, &req.input_file_id).await?;
    let (total, errors) = check_lines(&input, &req.endpoint, account);
    let status = if errors.is_empty() {
        "validating"
    } else {
        "failed"
    };
    let id = new_id()?;
    let metadata = req
        .metadata
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| Error::Internal(format!("writing metadata: {e}")))?;
    let errors_text = serde_json::to_string(&errors)
        .map_err(|e| Error::Internal(format!("writing errors: {e}")))?;
    sqlx::query(
        "INSERT INTO batches (id, account_id, input_file_id, endpoint, completion_window, \
         metadata, status, errors, input, total, created_at, expires_at, failed_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(id.as_str())
    .bind(account)
    .bind(req.input_file_id.as_str())
    .bind(req.endpoint.as_str())
    .bind(req.completion_window.as_str())
    .bind(metadata)
    .bind(status)
    .bind(errors_text)
    .bind(input)
    .bind(to_i64(total, "total")?)
    .bind(now.millis())
    .bind(now.millis() + COMPLETION_WINDOW_MS)
    .bind((!errors.is_empty()).then_some(now.millis()))
    .execute(&mut *conn)
    .await?;
    get(conn, account, &id).await
}

/// One of `account`'s batches.
pub async fn get(conn: &mut Conn, account: &str, id: &str) -> Result<BatchView, Error> {
    let q = sqlx::query(select_batches!("WHERE b.id = $1 AND b.account_id = $2"));
    super::one(conn, q.bind(id).bind(account), view, || {
        format!("batch {id}")
    })
    .await
}

/// Up to `limit` of `account`'s batches, newest first, starting after the
/// batch `after` (OpenAI's cursor); and whether more follow.
pub async fn list(
    conn: &mut Conn,
    account: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<BatchView>, bool), Error> {
    let limit = limit.clamp(1, MAX_LIST);
    let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
    let rows = match after {
        Some(after) => {
            let cursor = get(conn, account, after).await?;
            let q = sqlx::query(select_batches!(
                "WHERE b.account_id = $1 AND (b.created_at < $2 OR (b.created_at = $2 AND b.id > $3)) \
                 ORDER BY b.created_at DESC, b.id LIMIT $4"
            ));
            let q = q.bind(account).bind(cursor.created_at.millis()).bind(after);
            super::all(conn, q.bind(fetch), view).await?
        }
        None => {
            let q = sqlx::query(select_batches!(
                "WHERE b.account_id = $1 ORDER BY b.created_at DESC, b.id LIMIT $2"
            ));
            super::all(conn, q.bind(account).bind(fetch), view).await?
        }
    };
    let more = rows.len() > limit;
    Ok((rows.into_iter().take(limit).collect(), more))
}

/// Asks one of `account`'s batches to stop: one the runner has not taken
/// is cancelled at once; one it runs becomes `cancelling`, and the runner
/// finishes it as `cancelled` with the answers it has. A finished batch
/// cannot be cancelled (a conflict).
pub async fn cancel(
    conn: &mut Conn,
    account: &str,
    id: &str,
    now: Timestamp,
) -> Result<BatchView, Error> {
    let batch = get(conn, account, id).await?;
    let q = match batch.status.as_str() {
        "validating" => sqlx::query(
            "UPDATE batches SET status = 'cancelled', cancelling_at = $1, cancelled_at = $1 \
             WHERE id = $2 AND status = 'validating'",
        ),
        "in_progress" => sqlx::query(
            "UPDATE batches SET status = 'cancelling', cancelling_at = $1 \
             WHERE id = $2 AND status = 'in_progress'",
        ),
        "cancelling" => return Ok(batch),
        other => {
            return Err(Error::Conflict(format!(
                "batch {id} is {other}: only a batch that is validating or in progress can be cancelled"
            )));
        }
    };
    let q = q.bind(now.millis()).bind(id);
    super::change(conn, q, || format!("batch {id} (it changed meanwhile)")).await?;
    get(conn, account, id).await
}

/// The lines of a batch input, checked against `endpoint`: how many there
/// are, and what is wrong with them (at most 100 findings).
fn check_lines(input: &str, endpoint: &str, account: &str) -> (u64, Vec<BatchError>) {
    let run_prefix = format!("/client/v4/accounts/{account}/ai/run/");
    let url_fits = |url: &str| match endpoint {
        // A model slug's characters only: no query, no escape.
        "/ai/run" => url.strip_prefix(&run_prefix).is_some_and(|m| {
            !m.is_empty()
                && m.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"@/._-".contains(&b))
        }),
        _ => url == endpoint,
    };
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut error = |code: &str, message: String, line: u64| {
        if errors.len() < 100 {
            errors.push(BatchError {
                code: code.to_owned(),
                message,
                line: Some(line),
            });
        }
    };
    for (n, text) in input.lines().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        total += 1;
        let at = n as u64 + 1;
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            error("invalid_json", "the line is not JSON".to_owned(), at);
            continue;
        };
        match v.get("custom_id").and_then(Value::as_str) {
            Some(id) if !seen.insert(id.to_owned()) => error(
                "duplicate_custom_id",
                "custom_id is used by an earlier line".to_owned(),
                at,
            ),
            Some(_) => {}
            None => error(
                "missing_custom_id",
                "the line has no custom_id".to_owned(),
                at,
            ),
        }
        if !v.get("url").and_then(Value::as_str).is_some_and(url_fits) {
            error(
                "invalid_url",
                format!("the line's url must be the batch's endpoint, {endpoint}"),
                at,
            );
        }
        if v.get("method").and_then(Value::as_str) != Some("POST") {
            error(
                "invalid_method",
                "the line's method must be POST".to_owned(),
                at,
            );
        }
        if !v.get("body").is_some_and(Value::is_object) {
            error(
                "invalid_body",
                "the line's body must be an object".to_owned(),
                at,
            );
        }
    }
    (total, errors)
}

fn one_of(what: &str, value: &str, allowed: &[&str]) -> Result<(), Error> {
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} must be one of {}, not {value:?}",
            allowed.join(", ")
        )))
    }
}

fn check_metadata(m: Option<&BTreeMap<String, String>>) -> Result<(), Error> {
    let (pairs, key, value) = METADATA_BOUNDS;
    let Some(m) = m else { return Ok(()) };
    if m.len() > pairs || m.iter().any(|(k, v)| k.len() > key || v.len() > value) {
        return Err(Error::Invalid(format!(
            "metadata holds at most {pairs} pairs, keys of at most {key} bytes and values of at most {value}"
        )));
    }
    Ok(())
}

fn view(r: &AnyRow) -> Result<BatchView, Error> {
    let metadata: Option<String> = r.try_get("metadata")?;
    let errors: String = r.try_get("errors")?;
    let decode = |what: &str, e: serde_json::Error| Error::Internal(format!("batch {what}: {e}"));
    Ok(BatchView {
        id: r.try_get("id")?,
        account_id: r.try_get("account_id")?,
        endpoint: r.try_get("endpoint")?,
        input_file_id: r.try_get("input_file_id")?,
        completion_window: r.try_get("completion_window")?,
        status: r.try_get("status")?,
        errors: serde_json::from_str(&errors).map_err(|e| decode("errors", e))?,
        output_file_id: r.try_get("output_file_id")?,
        error_file_id: r.try_get("error_file_id")?,
        created_at: get_time(r, "created_at")?,
        expires_at: get_time(r, "expires_at")?,
        in_progress_at: get_opt_time(r, "in_progress_at")?,
        finalizing_at: get_opt_time(r, "finalizing_at")?,
        completed_at: get_opt_time(r, "completed_at")?,
        failed_at: get_opt_time(r, "failed_at")?,
        expired_at: get_opt_time(r, "expired_at")?,
        cancelling_at: get_opt_time(r, "cancelling_at")?,
        cancelled_at: get_opt_time(r, "cancelled_at")?,
        request_counts: BatchCounts {
            total: get_u64(r, "total")?,
            completed: get_u64(r, "ok")?,
            failed: get_u64(r, "bad")?,
        },
        metadata: metadata
            .map(|m| serde_json::from_str(&m))
            .transpose()
            .map_err(|e| decode("metadata", e))?,
    })
}

fn new_id() -> Result<String, Error> {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    Ok(format!("batch_{}", crate::ids::hex(&b)))
}
