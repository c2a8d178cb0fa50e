//! The batch runner's side of a batch: taking one no runner holds (a
//! compare-and-set on its lease, so two runners never hold one batch),
//! recording answers once per line, and finishing it into an output and
//! an error file. A runner that dies loses nothing: its lease runs out,
//! the next runner takes the batch and gets only the lines without an
//! answer.

use super::{Conn, get, open, to_i64};
use crate::Error;
use bulkhead_control_api::{
    BatchAnswer, BatchLease, BatchLine, BatchRecorded, BatchView, Timestamp,
};
use serde_json::{Value, json};
use sqlx::Row;

/// The most answers one call records.
pub const MAX_ANSWERS: usize = 100;

/// The oldest unfinished batch that no runner holds, now held by the
/// caller until `now + lease_ms`; `None` when there is none.
pub async fn take(
    conn: &mut Conn,
    now: Timestamp,
    lease_ms: i64,
) -> Result<Option<BatchLease>, Error> {
    let free = sqlx::query(concat!(
        "SELECT id, account_id FROM batches WHERE status IN ",
        open!(),
        " AND (lease_until IS NULL OR lease_until < $1) ORDER BY created_at, id LIMIT 1"
    ))
    .bind(now.millis())
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = free else { return Ok(None) };
    let (id, account): (String, String) = (row.try_get("id")?, row.try_get("account_id")?);
    let until = now.millis() + lease_ms;
    let took = sqlx::query(
        "UPDATE batches SET lease_until = $1, \
         status = CASE WHEN status = 'validating' THEN 'in_progress' ELSE status END, \
         in_progress_at = COALESCE(in_progress_at, $2) \
         WHERE id = $3 AND (lease_until IS NULL OR lease_until < $2)",
    )
    .bind(until)
    .bind(now.millis())
    .bind(id.as_str())
    .execute(&mut *conn)
    .await?;
    if took.rows_affected() == 0 {
        // Another runner took it between the two statements.
        return Ok(None);
    }
    let batch = get(conn, &account, &id).await?;
    let lines = if batch.status == "in_progress" && now < batch.expires_at {
        unanswered(conn, &id).await?
    } else {
        Vec::new()
    };
    let token = super::super::api_tokens::create_for_batch(conn, &account, &id, now).await?;
    Ok(Some(BatchLease {
        batch,
        lease_until: Timestamp::from_millis(until),
        token,
        lines,
    }))
}

/// Batch `id`, whoever's it is (the runner's view).
pub async fn view(conn: &mut Conn, id: &str) -> Result<BatchView, Error> {
    let account: String = sqlx::query("SELECT account_id FROM batches WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| Error::NotFound(format!("batch {id}")))?
        .try_get("account_id")?;
    get(conn, &account, id).await
}

/// Extends the caller's hold on batch `id` to `now + lease_ms`.
pub async fn renew(conn: &mut Conn, id: &str, now: Timestamp, lease_ms: i64) -> Result<(), Error> {
    let q = sqlx::query(concat!(
        "UPDATE batches SET lease_until = $1 WHERE id = $2 AND status IN ",
        open!()
    ));
    let q = q.bind(now.millis() + lease_ms).bind(id);
    super::super::change(conn, q, || format!("unfinished batch {id}")).await
}

/// Writes `answers` to batch `id`; a line that has an answer keeps it.
pub async fn record(
    conn: &mut Conn,
    id: &str,
    answers: &[BatchAnswer],
) -> Result<BatchRecorded, Error> {
    if answers.len() > MAX_ANSWERS {
        return Err(Error::Invalid(format!(
            "at most {MAX_ANSWERS} answers a call, not {}",
            answers.len()
        )));
    }
    let batch = view(conn, id).await?;
    if batch.is_final() {
        return Err(Error::Conflict(format!(
            "batch {id} is {}: it takes no more answers",
            batch.status
        )));
    }
    let input = input(conn, id).await?;
    let mut done = BatchRecorded {
        recorded: 0,
        duplicates: 0,
    };
    for a in answers {
        let line = usize::try_from(a.index)
            .ok()
            .and_then(|i| input.get(i))
            .ok_or_else(|| Error::Invalid(format!("batch {id} has no line {}", a.index)))?;
        if !(100..=599).contains(&a.status_code) {
            return Err(Error::Invalid(format!(
                "status {} is not HTTP",
                a.status_code
            )));
        }
        let q = sqlx::query(
            "INSERT INTO batch_results (batch_id, line, custom_id, status_code, request_id, body) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (batch_id, line) DO NOTHING",
        )
        .bind(id)
        .bind(to_i64(a.index, "index")?)
        .bind(line.custom_id.as_str())
        .bind(i64::from(a.status_code))
        .bind(a.request_id.as_deref())
        .bind(a.body.as_str());
        match q.execute(&mut *conn).await?.rows_affected() {
            0 => done.duplicates += 1,
            _ => done.recorded += 1,
        }
    }
    Ok(done)
}

/// Finishes batch `id`: its answers become the output file (successes) and
/// the error file (failures), in input order, and it ends `cancelled` (if a
/// cancel was asked), `expired` (if its window ran out first) or
/// `completed`. A batch with unanswered lines and neither reason is not
/// finished (a conflict); a finished one is returned as it is.
pub async fn finish(conn: &mut Conn, id: &str, now: Timestamp) -> Result<BatchView, Error> {
    let batch = view(conn, id).await?;
    let account = batch.account_id.clone();
    if batch.is_final() {
        return Ok(batch);
    }
    let answered = batch.request_counts.completed + batch.request_counts.failed;
    let end = if batch.status == "cancelling" {
        "cancelled"
    } else if now >= batch.expires_at {
        "expired"
    } else if answered == batch.request_counts.total {
        "completed"
    } else {
        return Err(Error::Conflict(format!(
            "batch {id} has {} of {} lines answered",
            answered, batch.request_counts.total
        )));
    };
    let (ok, bad) = output_lines(conn, &batch).await?;
    let mut file = async |text: String, what: &str| -> Result<Option<String>, Error> {
        if text.is_empty() {
            return Ok(None);
        }
        let name = format!("{id}_{what}.jsonl");
        let made = super::super::files::insert_output(conn, &account, &name, &text, now).await?;
        Ok(Some(made.id))
    };
    let output = file(ok, "output").await?;
    let errors = file(bad, "error").await?;
    /// The finishing update, setting the time column `$c` of the end.
    macro_rules! finishing {
        ($c:literal) => {
            sqlx::query(concat!(
                "UPDATE batches SET status = $1, output_file_id = $2, error_file_id = $3, \
                 finalizing_at = $4, ",
                $c,
                " = $4, lease_until = NULL WHERE id = $5 AND status IN ",
                open!()
            ))
        };
    }
    let q = match end {
        "cancelled" => finishing!("cancelled_at"),
        "expired" => finishing!("expired_at"),
        _ => finishing!("completed_at"),
    };
    let q = q
        .bind(end)
        .bind(output)
        .bind(errors)
        .bind(now.millis())
        .bind(id);
    super::super::change(conn, q, || format!("unfinished batch {id}")).await?;
    super::super::api_tokens::revoke_batch(conn, id, now).await?;
    get(conn, &account, id).await
}

/// The output file's and the error file's text: one line per answer, in
/// input order, in OpenAI's batch output shape.
async fn output_lines(conn: &mut Conn, batch: &BatchView) -> Result<(String, String), Error> {
    let rows = sqlx::query(
        "SELECT line, custom_id, status_code, request_id, body FROM batch_results \
         WHERE batch_id = $1 ORDER BY line",
    )
    .bind(batch.id.as_str())
    .fetch_all(&mut *conn)
    .await?;
    let (mut ok, mut bad) = (String::new(), String::new());
    let hex = batch.id.trim_start_matches("batch_");
    for r in &rows {
        let line: i64 = r.try_get("line")?;
        let status: i64 = r.try_get("status_code")?;
        let body: String = r.try_get("body")?;
        let body = serde_json::from_str::<Value>(&body).unwrap_or(Value::String(body));
        let request_id: Option<String> = r.try_get("request_id")?;
        let custom_id: String = r.try_get("custom_id")?;
        let entry = json!({
            "id": format!("batch_req_{hex}_{line}"),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": null,
        });
        let out = if status < 400 { &mut ok } else { &mut bad };
        out.push_str(&entry.to_string());
        out.push('\n');
    }
    Ok((ok, bad))
}

/// A batch's input lines, in order.
async fn input(conn: &mut Conn, id: &str) -> Result<Vec<BatchLine>, Error> {
    let row = sqlx::query("SELECT input FROM batches WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| Error::NotFound(format!("batch {id}")))?;
    let text: String = row.try_get("input")?;
    Ok(parse_input(&text))
}

/// The lines of a batch input that passed the checks at creation.
fn parse_input(text: &str) -> Vec<BatchLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .zip(0u64..)
        .map(|(l, index)| {
            let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
            BatchLine {
                index,
                custom_id: v["custom_id"].as_str().unwrap_or_default().to_owned(),
                url: v["url"].as_str().unwrap_or_default().to_owned(),
                body: v["body"].to_string(),
            }
        })
        .collect()
}

/// The lines of batch `id` without an answer.
async fn unanswered(conn: &mut Conn, id: &str) -> Result<Vec<BatchLine>, Error> {
    let done: std::collections::HashSet<i64> =
        sqlx::query("SELECT line FROM batch_results WHERE batch_id = $1")
            .bind(id)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| r.try_get("line"))
            .collect::<Result<_, _>>()?;
    Ok(input(conn, id)
        .await?
        .into_iter()
        .filter(|l| i64::try_from(l.index).is_ok_and(|i| !done.contains(&i)))
        .collect())
}
