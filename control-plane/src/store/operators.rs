//! Operator tokens. Only a token's sha256 is stored; the token itself is
//! shown once, when it is created.

use super::{Conn, get_enum, get_opt_time, get_time, token_hash};
use crate::{Error, OperatorId};
use bulkhead_control_api::{OperatorCreated, OperatorView, Role, Timestamp};
use sqlx::Row;
use sqlx::any::AnyRow;

/// The caller behind a valid token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// Id.
    pub id: OperatorId,
    /// Name, written to the audit log as the actor.
    pub name: String,
    /// What it may do.
    pub role: Role,
}

/// Prefix of every operator token, so leaked ones are easy to scan for.
pub const TOKEN_PREFIX: &str = "bho_";

/// Creates an operator and its token.
pub async fn create(
    conn: &mut Conn,
    name: &str,
    role: Role,
    now: Timestamp,
) -> Result<OperatorCreated, Error> {
    super::require_text("operator name", name, 100)?;
    let (token, hash) = super::new_token(TOKEN_PREFIX)?;
    let taken = sqlx::query("SELECT id FROM operators WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    if taken.is_some() {
        return Err(Error::Conflict(format!(
            "an operator named `{name}` exists"
        )));
    }
    let q = sqlx::query(
        "INSERT INTO operators (name, role, token_sha256, created_at) VALUES ($1, $2, $3, $4) RETURNING id",
    );
    let q = q.bind(name).bind(role.as_str()).bind(hash);
    let operator = OperatorView {
        id: super::inserted(conn, q.bind(now.millis())).await?,
        name: name.to_owned(),
        role,
        created_at: now,
        revoked_at: None,
    };
    Ok(OperatorCreated { operator, token })
}

/// The operator a presented token belongs to, if it is valid and not revoked.
pub async fn authenticate(conn: &mut Conn, token: &str) -> Result<Option<Operator>, Error> {
    if !token.starts_with(TOKEN_PREFIX) || token.len() > 200 {
        return Ok(None);
    }
    let row = sqlx::query(
        "SELECT id, name, role FROM operators WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(token_hash(token))
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| {
        Ok(Operator {
            id: OperatorId::from_db(r.try_get("id")?),
            name: r.try_get("name")?,
            role: get_enum(&r, "role")?,
        })
    })
    .transpose()
}

/// Every operator, oldest first.
pub async fn list(conn: &mut Conn) -> Result<Vec<OperatorView>, Error> {
    let q = sqlx::query("SELECT id, name, role, created_at, revoked_at FROM operators ORDER BY id");
    super::all(conn, q, view).await
}

fn view(r: &AnyRow) -> Result<OperatorView, Error> {
    Ok(OperatorView {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        role: get_enum(r, "role")?,
        created_at: get_time(r, "created_at")?,
        revoked_at: get_opt_time(r, "revoked_at")?,
    })
}

/// Revokes a token; its operator's name stays in the audit log.
pub async fn revoke(
    conn: &mut Conn,
    id: OperatorId,
    now: Timestamp,
) -> Result<OperatorView, Error> {
    sqlx::query("UPDATE operators SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
        .bind(now.millis())
        .bind(id.get())
        .execute(&mut *conn)
        .await?;
    list(conn)
        .await?
        .into_iter()
        .find(|o| o.id == id.get())
        .ok_or_else(|| Error::NotFound(format!("operator {id}")))
}
