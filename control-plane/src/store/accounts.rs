//! Tenant accounts (their API tokens arrive with the gateway).

use super::{Conn, get_time, get_u64, to_i64};
use crate::{AccountId, Error};
use bulkhead_control_api::{AccountView, Budget, Timestamp};
use sqlx::Row;

// `select_...!`: every column the row reader reads.
select_macro!(
    $ select_accounts,
    "id, name, created_at, sentinel, daily_budget_neurons, monthly_budget_neurons, \
         free_neurons_per_day",
    "accounts"
);

/// Creates a tenant account with a fresh random id.
pub async fn create(conn: &mut Conn, name: &str, now: Timestamp) -> Result<AccountView, Error> {
    insert(conn, name, false, now).await
}

/// Creates a sentinel account (the leak prober's) with a fresh random id.
pub async fn create_sentinel(
    conn: &mut Conn,
    name: &str,
    now: Timestamp,
) -> Result<AccountView, Error> {
    insert(conn, name, true, now).await
}

async fn insert(
    conn: &mut Conn,
    name: &str,
    sentinel: bool,
    now: Timestamp,
) -> Result<AccountView, Error> {
    super::require_text("account name", name, 200)?;
    let id = AccountId::random().map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    sqlx::query("INSERT INTO accounts (id, name, created_at, sentinel) VALUES ($1, $2, $3, $4)")
        .bind(id.as_str())
        .bind(name)
        .bind(now.millis())
        .bind(i64::from(sentinel))
        .execute(&mut *conn)
        .await?;
    Ok(AccountView {
        id: id.to_string(),
        name: name.to_owned(),
        created_at: now,
        sentinel,
        budget: Budget::default(),
    })
}

/// Every account, oldest first.
pub async fn list(conn: &mut Conn) -> Result<Vec<AccountView>, Error> {
    let q = sqlx::query(select_accounts!("ORDER BY created_at, id"));
    super::all(conn, q, view).await
}

/// One account, found by id.
pub async fn get(conn: &mut Conn, id: &AccountId) -> Result<AccountView, Error> {
    let q = sqlx::query(select_accounts!("WHERE id = $1"));
    super::one(conn, q.bind(id.as_str()), view, || {
        format!("account `{id}`")
    })
    .await
}

fn view(r: &sqlx::any::AnyRow) -> Result<AccountView, Error> {
    let opt = |col: &str| -> Result<Option<u64>, Error> {
        Ok(r.try_get::<Option<i64>, _>(col)?
            .map(|v| u64::try_from(v).unwrap_or(0)))
    };
    Ok(AccountView {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        created_at: get_time(r, "created_at")?,
        sentinel: r.try_get::<i64, _>("sentinel")? != 0,
        budget: Budget {
            daily_neurons: opt("daily_budget_neurons")?,
            monthly_neurons: opt("monthly_budget_neurons")?,
            free_neurons_per_day: get_u64(r, "free_neurons_per_day")?,
        },
    })
}

/// Replaces the budgets and free allowance of `id`; the account as it
/// was before.
pub async fn set_budget(
    conn: &mut Conn,
    id: &AccountId,
    budget: &Budget,
) -> Result<AccountView, Error> {
    let before = get(conn, id).await?;
    let opt = |v: Option<u64>, what: &str| v.map(|v| to_i64(v, what)).transpose();
    sqlx::query(
        "UPDATE accounts SET daily_budget_neurons = $1, monthly_budget_neurons = $2, \
         free_neurons_per_day = $3 WHERE id = $4",
    )
    .bind(opt(budget.daily_neurons, "daily_neurons")?)
    .bind(opt(budget.monthly_neurons, "monthly_neurons")?)
    .bind(to_i64(budget.free_neurons_per_day, "free_neurons_per_day")?)
    .bind(id.as_str())
    .execute(&mut *conn)
    .await?;
    Ok(before)
}

/// The account with this id, checked to exist.
pub async fn find(conn: &mut Conn, id: &str) -> Result<AccountId, Error> {
    let not_found = || {
        Error::NotFound(format!(
            "account `{}`",
            id.chars().take(64).collect::<String>()
        ))
    };
    let id = AccountId::parse(id).ok_or_else(not_found)?;
    let found = sqlx::query("SELECT id FROM accounts WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    match found {
        Some(_) => Ok(id),
        None => Err(not_found()),
    }
}
