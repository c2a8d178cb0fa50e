//! Queries, one module per table family. Every function takes the caller's
//! connection or transaction (`&mut AnyConnection`; a `Transaction` derefs to
//! one), so the caller decides what commits together: a visibility flip and
//! its audit entry, an incident update and its component changes.

pub mod accounts;
pub mod api_tokens;
pub mod audit;
pub mod configs;
pub mod incidents;
pub mod models;
pub mod nodes;
pub mod operators;
pub mod routing;
pub mod usage;

use crate::Error;
use bulkhead_control_api::Timestamp;
use sqlx::Row;
use sqlx::any::AnyRow;
use std::str::FromStr;

/// The connection type every query takes.
pub type Conn = sqlx::AnyConnection;

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
