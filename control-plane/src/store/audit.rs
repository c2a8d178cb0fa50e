//! The append-only audit log. This module has no update or delete, and the
//! schema's triggers abort any that another client tries.

use super::{Conn, get_time};
use crate::Error;
use bulkhead_control_api::{AuditEntry, Timestamp};
use sqlx::Row;
use sqlx::any::AnyRow;

/// An entry to append.
#[derive(Debug, Clone, Copy)]
pub struct NewEntry<'a> {
    /// Operator name.
    pub actor: &'a str,
    /// `model.visibility`, `model.allowlist`, `config.activate`, `operator.create`, …
    pub action: &'a str,
    /// What it acted on.
    pub subject: &'a str,
    /// The operator's reason.
    pub reason: &'a str,
    /// State before.
    pub before: &'a str,
    /// State after.
    pub after: &'a str,
}

impl<'a> NewEntry<'a> {
    /// `actor` did `action` to `subject`, taking it from `before` to
    /// `after`, with no reason given.
    pub fn new(
        actor: &'a str,
        action: &'a str,
        subject: &'a str,
        change: (&'a str, &'a str),
    ) -> Self {
        Self {
            actor,
            action,
            subject,
            reason: "",
            before: change.0,
            after: change.1,
        }
    }

    /// The same entry with the operator's reason.
    pub fn because(self, reason: &'a str) -> Self {
        Self { reason, ..self }
    }
}

/// Appends `e` in `tx` and commits: a change and its audit record land
/// together or not at all (the one way an admin handler ends a change).
pub async fn commit_with(
    mut tx: sqlx::Transaction<'static, sqlx::Any>,
    e: NewEntry<'_>,
    now: Timestamp,
) -> Result<AuditEntry, Error> {
    let entry = append(&mut tx, e, now).await?;
    tx.commit().await?;
    Ok(entry)
}

/// Appends one entry.
pub async fn append(conn: &mut Conn, e: NewEntry<'_>, now: Timestamp) -> Result<AuditEntry, Error> {
    let row = sqlx::query(
        "INSERT INTO audit_log (at, actor, action, subject, reason, before, after) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(now.millis())
    .bind(e.actor)
    .bind(e.action)
    .bind(e.subject)
    .bind(e.reason)
    .bind(e.before)
    .bind(e.after)
    .fetch_one(&mut *conn)
    .await?;
    Ok(AuditEntry {
        id: row.try_get("id")?,
        at: now,
        actor: e.actor.to_owned(),
        action: e.action.to_owned(),
        subject: e.subject.to_owned(),
        reason: e.reason.to_owned(),
        before: e.before.to_owned(),
        after: e.after.to_owned(),
    })
}

/// Newest first, at most `limit`, optionally only about one subject.
pub async fn list(
    conn: &mut Conn,
    subject: Option<&str>,
    limit: u32,
) -> Result<Vec<AuditEntry>, Error> {
    let q = sqlx::query(
        "SELECT id, at, actor, action, subject, reason, before, after FROM audit_log \
         WHERE ($1 = '' OR subject = $1) ORDER BY id DESC LIMIT $2",
    );
    super::all(
        conn,
        q.bind(subject.unwrap_or("")).bind(i64::from(limit)),
        entry,
    )
    .await
}

fn entry(r: &AnyRow) -> Result<AuditEntry, Error> {
    Ok(AuditEntry {
        id: r.try_get("id")?,
        at: get_time(r, "at")?,
        actor: r.try_get("actor")?,
        action: r.try_get("action")?,
        subject: r.try_get("subject")?,
        reason: r.try_get("reason")?,
        before: r.try_get("before")?,
        after: r.try_get("after")?,
    })
}
