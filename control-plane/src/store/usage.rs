//! The usage ledger: one append-only event per worker call (`usage_events`,
//! keyed by the call's single-use id, so a report repeated after a lost
//! answer counts once) and its roll-up per account, model and UTC day
//! (`usage_daily`), moved in the same statement sequence as the event it
//! counts. The caller owns the transaction: a report commits whole or not
//! at all. Each event is priced when recorded, at its model's active
//! price, in micro-neurons.
//!
//! A call the gateway voids (its request answered the client an error)
//! bills nothing: its event, if already recorded, is reversed in the
//! roll-up and kept with no tokens and `finish = 'void'`; if not, a void
//! event takes its call id first, so its worker's report, whenever it
//! comes, counts as a duplicate.

use super::{Conn, configs, get_u64, models, to_i64};
use crate::Error;
use bulkhead_control_api::{
    ModelSlug, Price, Timestamp, UsageEvent, UsageRecorded, UsageRow, UsageVoid, UsageVoided,
};
use std::collections::HashMap;

/// The most events one report may carry.
pub const MAX_EVENTS: usize = 1000;

/// Records `events` reported by the worker named `node`. An event already
/// in the ledger (same call id) is counted once, whatever it says now.
pub async fn record(
    conn: &mut Conn,
    node: &str,
    events: &[UsageEvent],
) -> Result<UsageRecorded, Error> {
    record_keyed(conn, node, events, &vec![None; events.len()]).await
}

/// [`record`], each event with the billing key its signed context gave
/// (`keys[i]` for `events[i]`): an event whose key is in the ledger
/// already is a duplicate too, whatever its call id.
pub async fn record_keyed(
    conn: &mut Conn,
    node: &str,
    events: &[UsageEvent],
    keys: &[Option<String>],
) -> Result<UsageRecorded, Error> {
    if keys.len() != events.len() {
        return Err(Error::Internal("one billing key per event".to_owned()));
    }
    if events.len() > MAX_EVENTS {
        return Err(Error::Invalid(format!(
            "a usage report carries at most {MAX_EVENTS} events, not {}",
            events.len()
        )));
    }
    let mut out = UsageRecorded {
        recorded: 0,
        duplicates: 0,
    };
    let mut prices: HashMap<&ModelSlug, Price> = HashMap::new();
    for (e, key) in events.iter().zip(keys) {
        check(e)?;
        let day = e.at.day();
        let (prompt, completion) = (
            to_i64(e.prompt_tokens, "prompt_tokens")?,
            to_i64(e.completion_tokens, "completion_tokens")?,
        );
        let price = match prices.get(&e.model) {
            Some(p) => *p,
            None => {
                let p = price_of(conn, &e.model).await?;
                prices.insert(&e.model, p);
                p
            }
        };
        let cost = to_i64(
            price.micro_neurons(e.prompt_tokens, e.completion_tokens),
            "cost",
        )?;
        let row = Entry {
            call: e.call_id.as_str(),
            account: e.account_id.as_str(),
            model: e.model.as_str(),
            day,
            tokens: (prompt, completion),
            cost,
            finish: e.finish.as_str(),
            node,
            at: e.at.millis(),
            key: key.as_deref(),
        };
        if !insert_event(conn, &row).await? {
            if !replaces_cancelled(conn, &row).await? {
                out.duplicates += 1;
                continue;
            }
            out.recorded += 1;
            continue;
        }
        roll_up(conn, &row, 1).await?;
        out.recorded += 1;
    }
    Ok(out)
}

/// Voids the calls `v` names, for its account alone, at `at`.
pub async fn void(conn: &mut Conn, v: &UsageVoid, at: Timestamp) -> Result<UsageVoided, Error> {
    if v.call_ids.len() > MAX_EVENTS {
        return Err(Error::Invalid(format!(
            "a void names at most {MAX_EVENTS} calls, not {}",
            v.call_ids.len()
        )));
    }
    let mut out = UsageVoided {
        reversed: 0,
        barred: 0,
    };
    for call in &v.call_ids {
        check(&UsageEvent {
            call_id: call.clone(),
            account_id: v.account_id.clone(),
            model: v.model.clone(),
            prompt_tokens: 0,
            completion_tokens: 0,
            context: String::new(),
            finish: VOID.to_owned(),
            at,
        })?;
        let marker = Entry {
            call: call.as_str(),
            account: v.account_id.as_str(),
            model: v.model.as_str(),
            day: at.day(),
            tokens: (0, 0),
            cost: 0,
            finish: VOID,
            node: "gateway",
            at: at.millis(),
            key: None,
        };
        let barred = insert_event(conn, &marker).await?;
        if barred {
            out.barred += 1;
            continue;
        }
        let row = sqlx::query(
            "SELECT account_id, model, day, prompt_tokens, completion_tokens, micro_neurons, finish \
             FROM usage_events WHERE call_id = $1",
        )
        .bind(call.as_str())
        .fetch_one(&mut *conn)
        .await?;
        use sqlx::Row;
        let (account, model, day): (String, String, i64) = (
            row.try_get("account_id")?,
            row.try_get("model")?,
            row.try_get("day")?,
        );
        if account != v.account_id || model != v.model.as_str() {
            return Err(Error::Invalid(format!(
                "call {call:?} was for another account or model"
            )));
        }
        let finish: String = row.try_get("finish")?;
        if finish == VOID {
            continue;
        }
        let (prompt, completion, cost): (i64, i64, i64) = (
            row.try_get("prompt_tokens")?,
            row.try_get("completion_tokens")?,
            row.try_get("micro_neurons")?,
        );
        let recorded = Entry {
            call: call.as_str(),
            account: account.as_str(),
            model: model.as_str(),
            day,
            tokens: (prompt, completion),
            cost,
            finish: VOID,
            node: "gateway",
            at: at.millis(),
            key: None,
        };
        roll_up(conn, &recorded, -1).await?;
        sqlx::query(
            "UPDATE usage_events SET prompt_tokens = 0, completion_tokens = 0, micro_neurons = 0, finish = $2 \
             WHERE call_id = $1",
        )
        .bind(call.as_str())
        .bind(VOID)
        .execute(&mut *conn)
        .await?;
        out.reversed += 1;
    }
    Ok(out)
}

/// The `finish` of a voided call.
const VOID: &str = "void";

/// One event of `usage_events`.
struct Entry<'a> {
    call: &'a str,
    account: &'a str,
    model: &'a str,
    day: i64,
    /// Prompt and output tokens.
    tokens: (i64, i64),
    cost: i64,
    finish: &'a str,
    node: &'a str,
    at: i64,
    /// The billing key beside the call id, if any.
    key: Option<&'a str>,
}

/// Inserts `r` unless its call id (or its billing key) is in the ledger
/// already; whether it was new.
async fn insert_event(conn: &mut Conn, r: &Entry<'_>) -> Result<bool, Error> {
    let inserted = sqlx::query(
        "INSERT INTO usage_events (call_id, account_id, model, day, prompt_tokens, completion_tokens, finish, node, at, micro_neurons, billing_key) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
    )
    .bind(r.call)
    .bind(r.account)
    .bind(r.model)
    .bind(r.day)
    .bind(r.tokens.0)
    .bind(r.tokens.1)
    .bind(r.finish)
    .bind(r.node)
    .bind(r.at)
    .bind(r.cost)
    .bind(r.key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// A keyed call whose key bills an earlier run that ended `cancelled` (its
/// client went away: a batch runner that died mid-line) replaces that
/// run: the line bills the run whose answer was delivered, once. Whether
/// it did.
async fn replaces_cancelled(conn: &mut Conn, r: &Entry<'_>) -> Result<bool, Error> {
    use sqlx::Row;
    let Some(key) = r.key else { return Ok(false) };
    if r.finish == "cancelled" {
        return Ok(false);
    }
    let Some(old) = sqlx::query(
        "SELECT call_id, account_id, model, day, prompt_tokens, completion_tokens, micro_neurons, finish \
         FROM usage_events WHERE billing_key = $1",
    )
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(false);
    };
    let (call, account, model, finish): (String, String, String, String) = (
        old.try_get("call_id")?,
        old.try_get("account_id")?,
        old.try_get("model")?,
        old.try_get("finish")?,
    );
    if finish != "cancelled" || call == r.call || account != r.account || model != r.model {
        return Ok(false);
    }
    let before = Entry {
        call: &call,
        account: &account,
        model: &model,
        day: old.try_get("day")?,
        tokens: (
            old.try_get("prompt_tokens")?,
            old.try_get("completion_tokens")?,
        ),
        cost: old.try_get("micro_neurons")?,
        finish: &finish,
        node: r.node,
        at: r.at,
        key: r.key,
    };
    roll_up(conn, &before, -1).await?;
    sqlx::query(
        "UPDATE usage_events SET call_id = $1, day = $2, prompt_tokens = $3, completion_tokens = $4, \
         finish = $5, node = $6, at = $7, micro_neurons = $8 WHERE billing_key = $9",
    )
    .bind(r.call)
    .bind(r.day)
    .bind(r.tokens.0)
    .bind(r.tokens.1)
    .bind(r.finish)
    .bind(r.node)
    .bind(r.at)
    .bind(r.cost)
    .bind(key)
    .execute(&mut *conn)
    .await?;
    roll_up(conn, r, 1).await?;
    Ok(true)
}

/// Moves `r`'s day of its account and model by its call: `sign` 1 counts
/// it, -1 takes it back.
async fn roll_up(conn: &mut Conn, r: &Entry<'_>, sign: i64) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO usage_daily (account_id, model, day, requests, prompt_tokens, completion_tokens, micro_neurons) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (account_id, model, day) DO UPDATE SET \
         requests = usage_daily.requests + excluded.requests, \
         prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens, \
         completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens, \
         micro_neurons = usage_daily.micro_neurons + excluded.micro_neurons",
    )
    .bind(r.account)
    .bind(r.model)
    .bind(r.day)
    .bind(sign)
    .bind(sign * r.tokens.0)
    .bind(sign * r.tokens.1)
    .bind(sign * r.cost)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Usage rows from UTC day `from` to `to` (inclusive), of one account or
/// all, oldest day first, then by account and model.
pub async fn daily(
    conn: &mut Conn,
    account: Option<&str>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Vec<UsageRow>, Error> {
    let rows = sqlx::query(
        "SELECT account_id, model, day, requests, prompt_tokens, completion_tokens, micro_neurons FROM usage_daily \
         WHERE ($1 = '' OR account_id = $1) AND day >= $2 AND day <= $3 \
         ORDER BY day, account_id, model",
    )
    .bind(account.unwrap_or(""))
    .bind(from.day())
    .bind(to.day())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            use sqlx::Row;
            let day: i64 = r.try_get("day")?;
            Ok(UsageRow {
                account_id: r.try_get("account_id")?,
                model: r.try_get("model")?,
                date: Timestamp::start_of_day(day).to_string()[..10].to_owned(),
                requests: get_u64(r, "requests")?,
                prompt_tokens: get_u64(r, "prompt_tokens")?,
                completion_tokens: get_u64(r, "completion_tokens")?,
                micro_neurons: get_u64(r, "micro_neurons")?,
            })
        })
        .collect()
}

/// The price of the model's active config now (free for a model unknown
/// or without one: its calls are still counted).
async fn price_of(conn: &mut Conn, slug: &ModelSlug) -> Result<Price, Error> {
    let model = match models::find(conn, slug).await {
        Ok(m) => m,
        Err(Error::NotFound(_)) => return Ok(Price::default()),
        Err(e) => return Err(e),
    };
    Ok(configs::active(conn, &model)
        .await?
        .map(|c| c.spec.price)
        .unwrap_or_default())
}

fn check(e: &UsageEvent) -> Result<(), Error> {
    let hex32 = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex32(&e.account_id) {
        return Err(Error::Invalid(
            "a usage event's account_id is 32 hex digits".to_owned(),
        ));
    }
    if e.call_id.is_empty() || e.call_id.len() > 128 {
        return Err(Error::Invalid(
            "a usage event's call_id is 1 to 128 characters".to_owned(),
        ));
    }
    if e.finish.len() > 32 {
        return Err(Error::Invalid(
            "a usage event's finish is at most 32 characters".to_owned(),
        ));
    }
    Ok(())
}
