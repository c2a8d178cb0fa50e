//! Models: slug, task, visibility with its allowlist, and the status-page
//! component status. Visibility and allowlist changes write their audit
//! entry in the caller's transaction.

use super::audit::{self, NewEntry};
use super::{Conn, get_enum, get_time};
use crate::{AccountId, ConfigVersion, Error, ModelId};
use bulkhead_control_api::{
    AuditEntry, ComponentStatus, CreateModel, ModelSlug, Timestamp, Visibility,
};
use sqlx::Row;
use sqlx::any::AnyRow;

/// A model row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRow {
    /// Id.
    pub id: ModelId,
    /// Slug.
    pub slug: ModelSlug,
    /// Workers AI task.
    pub task: String,
    /// Description.
    pub description: String,
    /// Visibility.
    pub visibility: Visibility,
    /// Shown on the public status page (it has been public at least once).
    pub listed: bool,
    /// Component status.
    pub component_status: ComponentStatus,
    /// Active config.
    pub active_config: Option<ConfigVersion>,
    /// Created.
    pub created_at: Timestamp,
    /// Last changed.
    pub updated_at: Timestamp,
}

// `select_...!`: every column the row reader reads.
select_macro!(
    $ select_models,
    "id, slug, task, description, visibility, listed, component_status, active_config, created_at, updated_at",
    "models"
);

/// Creates a model without a config (see [`configs::add`]).
pub async fn create(conn: &mut Conn, m: &CreateModel, now: Timestamp) -> Result<ModelRow, Error> {
    super::require_text("task", &m.task, 100)?;
    if m.description.len() > 2000 {
        return Err(Error::Invalid(
            "description is longer than 2000 bytes".to_owned(),
        ));
    }
    if find_optional(conn, &m.slug).await?.is_some() {
        return Err(Error::Conflict(format!("model {} exists", m.slug)));
    }
    let listed = i64::from(m.visibility == Visibility::Public);
    sqlx::query(
        "INSERT INTO models (slug, task, description, visibility, listed, component_status, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
    )
    .bind(m.slug.as_str())
    .bind(m.task.as_str())
    .bind(m.description.as_str())
    .bind(m.visibility.as_str())
    .bind(listed)
    .bind(ComponentStatus::Operational.as_str())
    .bind(now.millis())
    .execute(&mut *conn)
    .await?;
    find(conn, &m.slug).await
}

/// The model with this slug.
pub async fn find(conn: &mut Conn, slug: &ModelSlug) -> Result<ModelRow, Error> {
    find_optional(conn, slug)
        .await?
        .ok_or_else(|| Error::NotFound(format!("model {slug}")))
}

/// The model with this slug, if any.
pub async fn find_optional(conn: &mut Conn, slug: &ModelSlug) -> Result<Option<ModelRow>, Error> {
    let q = sqlx::query(select_models!("WHERE slug = $1"));
    super::optional(conn, q.bind(slug.as_str()), model_row).await
}

/// The model with this id.
pub async fn get(conn: &mut Conn, id: ModelId) -> Result<ModelRow, Error> {
    let q = sqlx::query(select_models!("WHERE id = $1"));
    super::one(conn, q.bind(id.get()), model_row, || format!("model #{id}")).await
}

/// Every model, by slug (byte order on both backends).
pub async fn list(conn: &mut Conn) -> Result<Vec<ModelRow>, Error> {
    let q = sqlx::query(select_models!("ORDER BY slug"));
    let mut models = super::all(conn, q, model_row).await?;
    models.sort_by(|a, b| a.slug.cmp(&b.slug));
    Ok(models)
}

/// The accounts that may call a model while it is private.
pub async fn allowlist(conn: &mut Conn, id: ModelId) -> Result<Vec<String>, Error> {
    let rows = sqlx::query(
        "SELECT account_id FROM model_allowlist WHERE model_id = $1 ORDER BY account_id",
    )
    .bind(id.get())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(|r| Ok(r.try_get("account_id")?)).collect()
}

/// Who makes a change to a model's visibility, why, and when.
#[derive(Debug, Clone, Copy)]
pub struct Why<'a> {
    /// The operator's name.
    pub actor: &'a str,
    /// The reason the audit log records (required).
    pub reason: &'a str,
    /// When.
    pub now: Timestamp,
}

/// The model a change with `reason` is about, once the reason is given.
async fn reasoned(conn: &mut Conn, slug: &ModelSlug, reason: &str) -> Result<ModelRow, Error> {
    super::require_text("reason", reason, 2000)?;
    find(conn, slug).await
}

/// Flips visibility and appends the audit entry; `None` when it already was.
pub async fn set_visibility(
    conn: &mut Conn,
    slug: &ModelSlug,
    to: Visibility,
    why: Why<'_>,
) -> Result<Option<AuditEntry>, Error> {
    let Why { actor, reason, now } = why;
    let m = reasoned(conn, slug, reason).await?;
    // Conditional update: of two racing flips to the same state, one wins.
    let changed = sqlx::query(
        "UPDATE models SET visibility = $1, updated_at = $2, \
         listed = CASE WHEN $1 = 'public' THEN 1 ELSE listed END \
         WHERE id = $3 AND visibility <> $1",
    )
    .bind(to.as_str())
    .bind(now.millis())
    .bind(m.id.get())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(None);
    }
    let before = match to {
        Visibility::Public => Visibility::Private,
        Visibility::Private => Visibility::Public,
    };
    let change = (before.as_str(), to.as_str());
    let entry = NewEntry::new(actor, "model.visibility", slug.as_str(), change).because(reason);
    Ok(Some(audit::append(conn, entry, now).await?))
}

/// Adds or removes an account on a model's allowlist, with its audit entry;
/// `None` when nothing changed.
pub async fn set_allowed(
    conn: &mut Conn,
    slug: &ModelSlug,
    (account, allowed): (&AccountId, bool),
    why: Why<'_>,
) -> Result<Option<AuditEntry>, Error> {
    let Why { actor, reason, now } = why;
    let m = reasoned(conn, slug, reason).await?;
    let changed = if allowed {
        sqlx::query(
            "INSERT INTO model_allowlist (model_id, account_id, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (model_id, account_id) DO NOTHING",
        )
        .bind(m.id.get())
        .bind(account.as_str())
        .bind(now.millis())
        .execute(&mut *conn)
        .await?
        .rows_affected()
    } else {
        sqlx::query("DELETE FROM model_allowlist WHERE model_id = $1 AND account_id = $2")
            .bind(m.id.get())
            .bind(account.as_str())
            .execute(&mut *conn)
            .await?
            .rows_affected()
    };
    if changed == 0 {
        return Ok(None);
    }
    sqlx::query("UPDATE models SET updated_at = $1 WHERE id = $2")
        .bind(now.millis())
        .bind(m.id.get())
        .execute(&mut *conn)
        .await?;
    let (before, after) = if allowed {
        ("absent", "allowed")
    } else {
        ("allowed", "absent")
    };
    let subject = format!("{slug} {account}");
    let entry = NewEntry::new(actor, "model.allowlist", &subject, (before, after)).because(reason);
    Ok(Some(audit::append(conn, entry, now).await?))
}

/// Sets a model's component status; returns the old one.
pub async fn set_component_status(
    conn: &mut Conn,
    id: ModelId,
    to: ComponentStatus,
    now: Timestamp,
) -> Result<ComponentStatus, Error> {
    let old = get(conn, id).await?.component_status;
    sqlx::query("UPDATE models SET component_status = $1, updated_at = $2 WHERE id = $3")
        .bind(to.as_str())
        .bind(now.millis())
        .bind(id.get())
        .execute(&mut *conn)
        .await?;
    Ok(old)
}

pub(crate) async fn set_active_config(
    conn: &mut Conn,
    id: ModelId,
    version: ConfigVersion,
    now: Timestamp,
) -> Result<(), Error> {
    sqlx::query("UPDATE models SET active_config = $1, updated_at = $2 WHERE id = $3")
        .bind(i64::from(version.get()))
        .bind(now.millis())
        .bind(id.get())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

fn model_row(r: &AnyRow) -> Result<ModelRow, Error> {
    let slug: String = r.try_get("slug")?;
    let active: Option<i64> = r.try_get("active_config")?;
    Ok(ModelRow {
        id: ModelId::from_db(r.try_get("id")?),
        slug: slug
            .parse()
            .map_err(|e: bulkhead_control_api::SlugError| sqlx::Error::Decode(e.into()))?,
        task: r.try_get("task")?,
        description: r.try_get("description")?,
        visibility: get_enum(r, "visibility")?,
        listed: r.try_get::<i64, _>("listed")? != 0,
        component_status: get_enum(r, "component_status")?,
        active_config: active
            .map(|v| u32::try_from(v).map(ConfigVersion::new))
            .transpose()
            .map_err(|e| sqlx::Error::Decode(e.into()))?,
        created_at: get_time(r, "created_at")?,
        updated_at: get_time(r, "updated_at")?,
    })
}
