//! Incidents and their timestamped updates. An update may change the status
//! of affected models (their status-page components); each change is kept
//! with its old and new status, as Statuspage's `affected_components`.
//! Every update is in the audit log too, in the same transaction: one entry
//! for the incident (`incident.open`, `.update`, `.resolve`, `.postmortem`,
//! subject `incident/ID`) and one per model whose status it changed
//! (`model.component_status`, subject the slug).

use super::audit::{self, NewEntry};
use super::{Conn, get_enum, get_opt_time, get_time, models};
use crate::{Error, IncidentId, ModelId};
use bulkhead_control_api::{
    AffectedComponent, ComponentChange, ComponentStatus, Impact, IncidentStatus,
    IncidentUpdateView, IncidentView, ModelSlug, OpenIncident, Timestamp, UpdateIncident,
};
use sqlx::Row;
use std::collections::BTreeSet;

/// Opens an incident with its first update.
pub async fn open(
    conn: &mut Conn,
    req: &OpenIncident,
    actor: &str,
    now: Timestamp,
) -> Result<IncidentId, Error> {
    super::require_text("incident name", &req.name, 300)?;
    if req.status.is_closed() {
        return Err(Error::Invalid(
            "an incident opens as investigating, identified or monitoring".to_owned(),
        ));
    }
    let row = sqlx::query(
        "INSERT INTO incidents (name, status, impact, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) RETURNING id",
    )
    .bind(req.name.as_str())
    .bind(req.status.as_str())
    .bind(req.impact.as_str())
    .bind(now.millis())
    .fetch_one(&mut *conn)
    .await?;
    let id = IncidentId::from_db(row.try_get("id")?);
    let update = UpdateIncident {
        status: req.status,
        body: req.body.clone(),
        impact: None,
        components: req.components.clone(),
        postmortem: None,
    };
    write_update(conn, id, None, &update, actor, now).await?;
    Ok(id)
}

/// Adds an update. Resolving without component changes sets every model
/// the incident touched back to operational (unless another open incident
/// still names it); a postmortem (only when resolving, or later on a
/// resolved incident) is published with it and moves the incident to
/// `postmortem`.
pub async fn update(
    conn: &mut Conn,
    id: IncidentId,
    req: &UpdateIncident,
    actor: &str,
    now: Timestamp,
) -> Result<(), Error> {
    if req.status == IncidentStatus::Postmortem {
        return Err(Error::Invalid(
            "publish a postmortem by resolving with a postmortem text".to_owned(),
        ));
    }
    if req.postmortem.is_some() && req.status != IncidentStatus::Resolved {
        return Err(Error::Invalid(
            "a postmortem comes with a resolved update".to_owned(),
        ));
    }
    let before = get(conn, id).await?;
    let postmortem_only = before.status == IncidentStatus::Resolved && req.postmortem.is_some();
    if before.status.is_closed() && !postmortem_only {
        return Err(Error::Conflict(format!(
            "incident {id} is already {}",
            before.status
        )));
    }
    // Claim the row (a row lock on PostgreSQL) on the condition just
    // checked, so two racing resolves cannot both pass.
    let guard = if postmortem_only {
        "UPDATE incidents SET updated_at = $1 WHERE id = $2 AND status = 'resolved'"
    } else {
        "UPDATE incidents SET updated_at = $1 WHERE id = $2 AND status NOT IN ('resolved', 'postmortem')"
    };
    let claimed = sqlx::query(guard)
        .bind(now.millis())
        .bind(id.get())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if claimed == 0 {
        return Err(Error::Conflict(format!(
            "incident {id} changed concurrently; reload it"
        )));
    }
    let current = get(conn, id).await?;
    let mut req = req.clone();
    if req.status == IncidentStatus::Resolved && req.components.is_empty() && !postmortem_only {
        let mut still_open = BTreeSet::new();
        for other in list(conn, u32::MAX >> 1, true).await? {
            if other.id != id.get() {
                still_open.extend(other.components);
            }
        }
        for slug in &current.components {
            let m = models::find(conn, slug).await?;
            if m.component_status != ComponentStatus::Operational && !still_open.contains(slug) {
                req.components.push(ComponentChange {
                    model: slug.clone(),
                    status: ComponentStatus::Operational,
                });
            }
        }
    }
    write_update(conn, id, Some(before.status), &req, actor, now).await
}

async fn write_update(
    conn: &mut Conn,
    id: IncidentId,
    before: Option<IncidentStatus>,
    req: &UpdateIncident,
    actor: &str,
    now: Timestamp,
) -> Result<(), Error> {
    super::require_text("update body", &req.body, 10_000)?;
    if let Some(p) = &req.postmortem {
        super::require_text("postmortem", p, 100_000)?;
    }
    let mut seen = BTreeSet::new();
    let mut targets: Vec<(&ModelSlug, ModelId, ComponentStatus)> = Vec::new();
    for c in &req.components {
        if !seen.insert(c.model.clone()) {
            return Err(Error::Invalid(format!(
                "{} is named twice in one update",
                c.model
            )));
        }
        targets.push((&c.model, models::find(conn, &c.model).await?.id, c.status));
    }
    let row = sqlx::query(
        "INSERT INTO incident_updates (incident_id, status, body, actor, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(id.get())
    .bind(req.status.as_str())
    .bind(req.body.as_str())
    .bind(actor)
    .bind(now.millis())
    .fetch_one(&mut *conn)
    .await?;
    let update_id: i64 = row.try_get("id")?;
    let subject = format!("incident/{id}");
    for (slug, model, to) in targets {
        set_component(conn, update_id, slug, model, to, (actor, &subject), now).await?;
    }
    let status = match req.postmortem {
        Some(_) => IncidentStatus::Postmortem,
        None => req.status,
    };
    let action = match before {
        None => "incident.open",
        Some(b) if req.status == IncidentStatus::Resolved && !b.is_closed() => "incident.resolve",
        Some(_) if req.postmortem.is_some() => "incident.postmortem",
        Some(_) => "incident.update",
    };
    let reason: String = req.body.chars().take(300).collect();
    let change = (before.map_or("", IncidentStatus::as_str), status.as_str());
    let entry = NewEntry::new(actor, action, &subject, change).because(&reason);
    audit::append(conn, entry, now).await?;
    let at = |s: IncidentStatus| (req.status == s).then_some(now.millis());
    // COALESCE keeps the first time an incident reached monitoring or
    // resolved; the guard in `update` has already claimed the row.
    sqlx::query(
        "UPDATE incidents SET status = $1, impact = COALESCE($2, impact), updated_at = $3, \
         monitoring_at = COALESCE(monitoring_at, $4), resolved_at = COALESCE(resolved_at, $5), \
         postmortem_body = COALESCE($6, postmortem_body), \
         postmortem_published_at = COALESCE(postmortem_published_at, $7) WHERE id = $8",
    )
    .bind(status.as_str())
    .bind(req.impact.map(Impact::as_str))
    .bind(now.millis())
    .bind(at(IncidentStatus::Monitoring))
    .bind(at(IncidentStatus::Resolved))
    .bind(req.postmortem.as_deref())
    .bind(req.postmortem.as_ref().map(|_| now.millis()))
    .bind(id.get())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets one model's component status for an update, audited, and records
/// the change on the update (`who` is the actor and the incident subject).
async fn set_component(
    conn: &mut Conn,
    update_id: i64,
    slug: &ModelSlug,
    model: ModelId,
    to: ComponentStatus,
    who: (&str, &str),
    now: Timestamp,
) -> Result<(), Error> {
    let old = models::set_component_status(conn, model, to, now).await?;
    let change = (old.as_str(), to.as_str());
    let entry =
        NewEntry::new(who.0, "model.component_status", slug.as_str(), change).because(who.1);
    audit::append(conn, entry, now).await?;
    sqlx::query(
        "INSERT INTO incident_update_components (update_id, model_id, old_status, new_status) VALUES ($1, $2, $3, $4)",
    )
    .bind(update_id)
    .bind(model.get())
    .bind(old.as_str())
    .bind(to.as_str())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One incident with its timeline, newest update first.
pub async fn get(conn: &mut Conn, id: IncidentId) -> Result<IncidentView, Error> {
    let row = sqlx::query(
        "SELECT id, name, status, impact, created_at, updated_at, monitoring_at, resolved_at, \
         postmortem_body, postmortem_published_at FROM incidents WHERE id = $1",
    )
    .bind(id.get())
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| Error::NotFound(format!("incident {id}")))?;
    let updates = sqlx::query(
        "SELECT id, status, body, actor, created_at FROM incident_updates WHERE incident_id = $1 ORDER BY id DESC",
    )
    .bind(id.get())
    .fetch_all(&mut *conn)
    .await?;
    let changes = sqlx::query(
        "SELECT c.update_id, m.slug, c.old_status, c.new_status FROM incident_update_components c \
         JOIN incident_updates u ON u.id = c.update_id JOIN models m ON m.id = c.model_id \
         WHERE u.incident_id = $1 ORDER BY m.slug",
    )
    .bind(id.get())
    .fetch_all(&mut *conn)
    .await?;
    let mut components = BTreeSet::new();
    let mut affected: Vec<(i64, AffectedComponent)> = Vec::with_capacity(changes.len());
    for c in &changes {
        let slug: String = c.try_get("slug")?;
        let model: ModelSlug = slug
            .parse()
            .map_err(|e: bulkhead_control_api::SlugError| sqlx::Error::Decode(e.into()))?;
        components.insert(model.clone());
        affected.push((
            c.try_get("update_id")?,
            AffectedComponent {
                model,
                old_status: get_enum(c, "old_status")?,
                new_status: get_enum(c, "new_status")?,
            },
        ));
    }
    let updates = updates
        .iter()
        .map(|u| {
            let uid: i64 = u.try_get("id")?;
            Ok(IncidentUpdateView {
                id: uid,
                status: get_enum(u, "status")?,
                body: u.try_get("body")?,
                created_at: get_time(u, "created_at")?,
                actor: u.try_get("actor")?,
                affected_components: affected
                    .iter()
                    .filter(|(id, _)| *id == uid)
                    .map(|(_, a)| a.clone())
                    .collect(),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(IncidentView {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        status: get_enum(&row, "status")?,
        impact: get_enum(&row, "impact")?,
        created_at: get_time(&row, "created_at")?,
        updated_at: get_time(&row, "updated_at")?,
        monitoring_at: get_opt_time(&row, "monitoring_at")?,
        resolved_at: get_opt_time(&row, "resolved_at")?,
        postmortem_body: row.try_get("postmortem_body")?,
        postmortem_published_at: get_opt_time(&row, "postmortem_published_at")?,
        components: components.into_iter().collect(),
        updates,
    })
}

/// The `limit` most recent incidents, newest first; only open ones if asked.
pub async fn list(
    conn: &mut Conn,
    limit: u32,
    unresolved_only: bool,
) -> Result<Vec<IncidentView>, Error> {
    let rows = sqlx::query(
        "SELECT id FROM incidents WHERE ($1 = 0 OR status IN ('investigating', 'identified', 'monitoring')) \
         ORDER BY id DESC LIMIT $2",
    )
    .bind(i64::from(unresolved_only))
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(get(conn, IncidentId::from_db(r.try_get("id")?)).await?);
    }
    Ok(out)
}

/// One change of a model's status-page component, as an incident update
/// made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusChange {
    /// The model.
    pub model: ModelId,
    /// When the update was posted.
    pub at: Timestamp,
    /// Its status before.
    pub old: ComponentStatus,
    /// Its status after.
    pub new: ComponentStatus,
}

/// Every component change at or after `since`, oldest first: the history
/// the status page's uptime bars are drawn from.
pub async fn status_changes(conn: &mut Conn, since: Timestamp) -> Result<Vec<StatusChange>, Error> {
    let q = sqlx::query(
        "SELECT c.model_id, u.created_at, c.old_status, c.new_status \
         FROM incident_update_components c JOIN incident_updates u ON u.id = c.update_id \
         WHERE u.created_at >= $1 ORDER BY u.created_at, u.id",
    );
    super::all(conn, q.bind(since.millis()), |r| {
        Ok(StatusChange {
            model: ModelId::from_db(r.try_get("model_id")?),
            at: get_time(r, "created_at")?,
            old: get_enum(r, "old_status")?,
            new: get_enum(r, "new_status")?,
        })
    })
    .await
}
