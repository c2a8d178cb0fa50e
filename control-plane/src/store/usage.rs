//! The usage ledger: one append-only event per worker call (`usage_events`,
//! keyed by the call's single-use id, so a report repeated after a lost
//! answer counts once) and its roll-up per account, model and UTC day
//! (`usage_daily`), moved in the same statement sequence as the event it
//! counts. The caller owns the transaction: a report commits whole or not
//! at all. Each event is priced when recorded, at its model's active
//! price, in micro-neurons.

use super::{Conn, configs, get_u64, models, to_i64};
use crate::Error;
use bulkhead_control_api::{ModelSlug, Price, Timestamp, UsageEvent, UsageRecorded, UsageRow};
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
    for e in events {
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
        let inserted = sqlx::query(
            "INSERT INTO usage_events (call_id, account_id, model, day, prompt_tokens, completion_tokens, finish, node, at, micro_neurons) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (call_id) DO NOTHING",
        )
        .bind(e.call_id.as_str())
        .bind(e.account_id.as_str())
        .bind(e.model.as_str())
        .bind(day)
        .bind(prompt)
        .bind(completion)
        .bind(e.finish.as_str())
        .bind(node)
        .bind(e.at.millis())
        .bind(cost)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if inserted == 0 {
            out.duplicates += 1;
            continue;
        }
        sqlx::query(
            "INSERT INTO usage_daily (account_id, model, day, requests, prompt_tokens, completion_tokens, micro_neurons) \
             VALUES ($1, $2, $3, 1, $4, $5, $6) ON CONFLICT (account_id, model, day) DO UPDATE SET \
             requests = usage_daily.requests + 1, \
             prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens, \
             completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens, \
             micro_neurons = usage_daily.micro_neurons + excluded.micro_neurons",
        )
        .bind(e.account_id.as_str())
        .bind(e.model.as_str())
        .bind(day)
        .bind(prompt)
        .bind(completion)
        .bind(cost)
        .execute(&mut *conn)
        .await?;
        out.recorded += 1;
    }
    Ok(out)
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
