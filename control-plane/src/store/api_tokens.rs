//! Tenant API tokens: scoped to one account, revocable, stored as sha256.
//! The gateway authenticates them from the routing table's hashes.

use super::{Conn, get_opt_time, get_time};
use crate::ids::hex;
use crate::{AccountId, Error};
use bulkhead_control_api::{ApiTokenCreated, ApiTokenView, RoutedToken, Timestamp};
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::any::AnyRow;

/// Prefix of every tenant API token.
pub const TOKEN_PREFIX: &str = "bhk_";

/// The sha256 (hex) under which a token is stored.
pub fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// Creates a token for `account`.
pub async fn create(
    conn: &mut Conn,
    account: &AccountId,
    name: &str,
    now: Timestamp,
) -> Result<ApiTokenCreated, Error> {
    super::require_text("token name", name, 100)?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    let token = format!("{TOKEN_PREFIX}{}", hex(&secret));
    let row = sqlx::query(
        "INSERT INTO api_tokens (account_id, name, token_sha256, created_at) VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(account.as_str())
    .bind(name)
    .bind(token_hash(&token))
    .bind(now.millis())
    .fetch_one(&mut *conn)
    .await?;
    Ok(ApiTokenCreated {
        meta: ApiTokenView {
            id: row.try_get("id")?,
            account_id: account.to_string(),
            name: name.to_owned(),
            created_at: now,
            revoked_at: None,
        },
        token,
    })
}

/// An account's tokens, oldest first.
pub async fn list(conn: &mut Conn, account: &AccountId) -> Result<Vec<ApiTokenView>, Error> {
    let rows = sqlx::query(
        "SELECT id, account_id, name, created_at, revoked_at FROM api_tokens WHERE account_id = $1 ORDER BY id",
    )
    .bind(account.as_str())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(view).collect()
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
    let rows = sqlx::query(
        "SELECT token_sha256, account_id FROM api_tokens WHERE revoked_at IS NULL ORDER BY id",
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(RoutedToken {
                sha256: r.try_get("token_sha256")?,
                account_id: r.try_get("account_id")?,
            })
        })
        .collect()
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
