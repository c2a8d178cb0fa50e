//! Tenant accounts (their API tokens arrive with the gateway).

use super::{Conn, get_time};
use crate::{AccountId, Error};
use bulkhead_control_api::{AccountView, Timestamp};
use sqlx::Row;

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
    })
}

/// Every account, oldest first.
pub async fn list(conn: &mut Conn) -> Result<Vec<AccountView>, Error> {
    let rows =
        sqlx::query("SELECT id, name, created_at, sentinel FROM accounts ORDER BY created_at, id")
            .fetch_all(&mut *conn)
            .await?;
    rows.iter()
        .map(|r| {
            Ok(AccountView {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                created_at: get_time(r, "created_at")?,
                sentinel: r.try_get::<i64, _>("sentinel")? != 0,
            })
        })
        .collect()
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
