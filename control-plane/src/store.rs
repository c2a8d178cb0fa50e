//! Queries, one module per table family. Every function takes the caller's
//! connection or transaction (`&mut AnyConnection`; a `Transaction` derefs to
//! one), so the caller decides what commits together: a visibility flip and
//! its audit entry, an incident update and its component changes.
//!
//! Rows are read by one `fn(&AnyRow)` per row type through a few helpers here
//! (`all`, `optional`, `one`, `inserted` for `INSERT … RETURNING id`, and
//! `change`, which fails with not found when it touched no row); each module's
//! `SELECT` of the columns its reader reads comes from one `select_macro!`.

/// Defines the macro `$name!(rest)`: a `SELECT` of `$columns` (every
/// column its module's row reader reads) from `$from`, then `rest`, as one
/// string literal. `$d` is a `$`, passed in because a macro cannot write
/// its own inner macro's metavariables otherwise.
#[rustfmt::skip] // rustfmt re-indents the inner macro on every run.
macro_rules! select_macro {
    ($d:tt $name:ident, $columns:literal, $from:literal) => {
        macro_rules! $name {
            ($d rest:literal) => {
                concat!("SELECT ", $columns, " FROM ", $from, " ", $d rest)
            };
        }
    };
}

pub mod accounts;
pub mod api_tokens;
pub mod audit;
pub mod batches;
pub mod configs;
pub mod files;
pub mod incidents;
pub mod models;
pub mod nodes;
pub mod operators;
pub mod routing;
pub mod usage;
pub mod views;

use crate::Error;
use bulkhead_control_api::Timestamp;
use sqlx::Row;
use sqlx::any::AnyRow;
use std::str::FromStr;

/// The connection type every query takes.
pub type Conn = sqlx::AnyConnection;

/// A query with its arguments bound, on either backend.
pub(crate) type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// How one row becomes a value.
pub(crate) type Read<T> = fn(&AnyRow) -> Result<T, Error>;

/// Every row `query` finds, each read by `read`.
pub(crate) async fn all<T>(c: &mut Conn, query: Query<'_>, read: Read<T>) -> Result<Vec<T>, Error> {
    let rows = query.fetch_all(&mut *c).await?;
    rows.iter().map(read).collect()
}

/// The row `query` finds, if any, read by `read`.
pub(crate) async fn optional<T>(
    c: &mut Conn,
    q: Query<'_>,
    read: Read<T>,
) -> Result<Option<T>, Error> {
    let row = q.fetch_optional(&mut *c).await?;
    row.as_ref().map(read).transpose()
}

/// Runs an `INSERT … RETURNING id`; the new row's id.
pub(crate) async fn inserted(c: &mut Conn, insert: Query<'_>) -> Result<i64, Error> {
    Ok(insert.fetch_one(&mut *c).await?.try_get("id")?)
}

/// The row `query` finds, read by `read`; `NotFound(what)` when there is none.
pub(crate) async fn one<T>(
    conn: &mut Conn,
    query: Query<'_>,
    read: Read<T>,
    what: impl FnOnce() -> String,
) -> Result<T, Error> {
    optional(conn, query, read)
        .await?
        .ok_or_else(|| Error::NotFound(what()))
}

/// Runs a change; `NotFound(what)` when it touched no row.
pub(crate) async fn change(
    conn: &mut Conn,
    query: Query<'_>,
    what: impl FnOnce() -> String,
) -> Result<(), Error> {
    match query.execute(&mut *conn).await?.rows_affected() {
        0 => Err(Error::NotFound(what())),
        _ => Ok(()),
    }
}

/// A `u64` from the wire as the database's `BIGINT`.
pub(crate) fn to_i64(v: u64, what: &str) -> Result<i64, Error> {
    i64::try_from(v).map_err(|_| Error::Invalid(format!("{what} {v} is too large")))
}

/// A non-negative `BIGINT` column as `u64`.
pub(crate) fn get_u64(row: &AnyRow, col: &str) -> Result<u64, Error> {
    let v: i64 = row.try_get(col)?;
    u64::try_from(v).map_err(|_| decode_error(col, &v.to_string()))
}

/// A `BIGINT` epoch-ms column as a timestamp.
pub(crate) fn get_time(row: &AnyRow, col: &str) -> Result<Timestamp, Error> {
    Ok(Timestamp::from_millis(row.try_get(col)?))
}

/// A nullable `BIGINT` epoch-ms column.
pub(crate) fn get_opt_time(row: &AnyRow, col: &str) -> Result<Option<Timestamp>, Error> {
    Ok(row
        .try_get::<Option<i64>, _>(col)?
        .map(Timestamp::from_millis))
}

/// A `TEXT` column holding one of an enumeration's wire names.
pub(crate) fn get_enum<T: FromStr>(row: &AnyRow, col: &str) -> Result<T, Error> {
    let s: String = row.try_get(col)?;
    s.parse().map_err(|_| decode_error(col, &s))
}

fn decode_error(col: &str, value: &str) -> Error {
    Error::from(sqlx::Error::Decode(
        format!("column {col} holds an unexpected value `{value}`").into(),
    ))
}

/// A fresh secret token that starts with `prefix`, and the sha256 (hex)
/// under which it is stored; only the hash is kept.
pub(crate) fn new_token(prefix: &str) -> Result<(String, String), Error> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    let token = format!("{prefix}{}", crate::ids::hex(&secret));
    let hash = token_hash(&token);
    Ok((token, hash))
}

/// The sha256 (hex) under which a token is stored.
pub(crate) fn token_hash(token: &str) -> String {
    use sha2::{Digest, Sha256};
    crate::ids::hex(&Sha256::digest(token.as_bytes()))
}

/// Rejects empty or oversized free text from a request.
pub(crate) fn require_text(what: &str, s: &str, max: usize) -> Result<(), Error> {
    if s.trim().is_empty() {
        return Err(Error::Invalid(format!("{what} must not be empty")));
    }
    if s.len() > max {
        return Err(Error::Invalid(format!("{what} is longer than {max} bytes")));
    }
    Ok(())
}
