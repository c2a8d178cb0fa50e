//! Tenant API tokens: scoped to one account, revocable, stored as sha256.
//! The gateway authenticates them from the routing table's hashes.

use super::{Conn, get_opt_time, get_time, token_hash};
use crate::{AccountId, Error};
use bulkhead_control_api::{ApiTokenCreated, ApiTokenView, RoutedToken, Timestamp};
use sqlx::Row;
use sqlx::any::AnyRow;

/// Prefix of every tenant API token.
pub const TOKEN_PREFIX: &str = "bhk_";

/// Creates a token for `account`.
pub async fn create(
    conn: &mut Conn,
    account: &AccountId,
    name: &str,
    now: Timestamp,
) -> Result<ApiTokenCreated, Error> {
    super::require_text("token name", name, 100)?;
    let (token, hash) = super::new_token(TOKEN_PREFIX)?;
    let q = sqlx::query(
        "INSERT INTO api_tokens (account_id, name, token_sha256, created_at) VALUES ($1, $2, $3, $4) RETURNING id",
    );
    let q = q.bind(account.as_str()).bind(name).bind(hash);
    let meta = ApiTokenView {
        id: super::inserted(conn, q.bind(now.millis())).await?,
        account_id: account.to_string(),
        name: name.to_owned(),
        created_at: now,
        revoked_at: None,
    };
    Ok(ApiTokenCreated { meta, token })
}

/// A token for the batch runner to call the gateway as `account` while it
/// runs batch `batch`; the batch's earlier tokens are revoked.
pub async fn create_for_batch(
    conn: &mut Conn,
    account: &str,
    batch: &str,
    now: Timestamp,
) -> Result<String, Error> {
    revoke_batch(conn, batch, now).await?;
    let (token, hash) = super::new_token(TOKEN_PREFIX)?;
    sqlx::query(
        "INSERT INTO api_tokens (account_id, name, token_sha256, created_at, batch_id) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(account)
    .bind(format!("batch runner: {batch}"))
    .bind(hash)
    .bind(now.millis())
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    Ok(token)
}

/// Revokes every live token made for batch `batch`.
pub async fn revoke_batch(conn: &mut Conn, batch: &str, now: Timestamp) -> Result<(), Error> {
    sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE batch_id = $2 AND revoked_at IS NULL")
        .bind(now.millis())
        .bind(batch)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// An account's tokens, oldest first.
pub async fn list(conn: &mut Conn, account: &AccountId) -> Result<Vec<ApiTokenView>, Error> {
    let q = sqlx::query(
        "SELECT id, account_id, name, created_at, revoked_at FROM api_tokens WHERE account_id = $1 ORDER BY id",
    );
    super::all(conn, q.bind(account.as_str()), view).await
}

/// Revokes one of an account's tokens.
pub async fn revoke(
    conn: &mut Conn,
    account: &AccountId,
    id: i64,
    now: Timestamp,
) -> Result<ApiTokenView, Error> {
    sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND account_id = $3 AND revoked_at IS NULL")
        .bind(now.millis())
        .bind(id)
        .bind(account.as_str())
        .execute(&mut *conn)
        .await?;
    list(conn, account)
        .await?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| Error::NotFound(format!("token {id} of account {account}")))
}

/// Every live token, as hashes, for the routing table.
pub async fn live(conn: &mut Conn) -> Result<Vec<RoutedToken>, Error> {
    let q = sqlx::query(
        "SELECT token_sha256, account_id, batch_id FROM api_tokens WHERE revoked_at IS NULL ORDER BY id",
    );
    super::all(conn, q, |r| {
        Ok(RoutedToken {
            sha256: r.try_get("token_sha256")?,
            account_id: r.try_get("account_id")?,
            batch_id: r.try_get("batch_id")?,
        })
    })
    .await
}

fn view(r: &AnyRow) -> Result<ApiTokenView, Error> {
    Ok(ApiTokenView {
        id: r.try_get("id")?,
        account_id: r.try_get("account_id")?,
        name: r.try_get("name")?,
        created_at: get_time(r, "created_at")?,
        revoked_at: get_opt_time(r, "revoked_at")?,
    })
}

/// The account a live token belongs to, if it is live.
pub async fn account_of(conn: &mut Conn, token: &str) -> Result<Option<String>, Error> {
    let row = sqlx::query(
        "SELECT account_id FROM api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(token_hash(token))
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| r.try_get("account_id")).transpose()?)
}
