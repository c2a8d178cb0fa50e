//! Config versions of a model, and activation: a version becomes active only
//! if context window + max output fits the measured KV pool of every live
//! node registered for the model.
//!
//! It must also be servable: every such node prefills the whole context window
//! within its deadline at the speed it registered. A refusal names the node and
//! the numbers (pool and window, or seconds and the longest prompt that fits).

use super::audit::{self, NewEntry};
use super::models::{self, ModelRow};
use super::{Conn, get_opt_time, get_time, get_u64, nodes, to_i64};
use crate::routability::{check_fits, is_live, prefill_shortfall};
use crate::{ConfigVersion, Error};
use bulkhead_control_api::{
    AuditEntry, ConfigSpec, ConfigView, KvBudget, Parallelism, Price, Properties, Timestamp,
};
use sqlx::Row;
use sqlx::any::AnyRow;
use std::time::Duration;

/// A stored config version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRow {
    /// Version.
    pub version: ConfigVersion,
    /// Content.
    pub spec: ConfigSpec,
    /// Who added it.
    pub created_by: String,
    /// When.
    pub created_at: Timestamp,
    /// Last activation.
    pub activated_at: Option<Timestamp>,
}

impl ConfigRow {
    /// The admin API's view.
    pub fn view(&self, active: Option<ConfigVersion>) -> ConfigView {
        ConfigView {
            version: self.version.get(),
            spec: self.spec.clone(),
            created_by: self.created_by.clone(),
            created_at: self.created_at,
            activated_at: self.activated_at,
            active: active == Some(self.version),
        }
    }
}

// `select_...!`: every column the row reader reads.
select_macro!(
    $ select_configs,
    "version, context_window, max_output, weights_file, weights_sha256, quantization, \
     page_size, prefill_kv_bytes, decode_kv_bytes, tensor_parallel, pipeline_parallel, input_neurons_per_mtok, output_neurons_per_mtok, \
     created_by, created_at, activated_at",
    "model_configs"
);

/// Stores a new version (not active yet).
pub async fn add(
    conn: &mut Conn,
    model: &ModelRow,
    spec: &ConfigSpec,
    actor: &str,
    now: Timestamp,
) -> Result<ConfigVersion, Error> {
    validate(spec)?;
    let last: Option<i64> =
        sqlx::query("SELECT MAX(version) AS v FROM model_configs WHERE model_id = $1")
            .bind(model.id.get())
            .fetch_one(&mut *conn)
            .await?
            .try_get("v")?;
    let next = u32::try_from(last.unwrap_or(0) + 1)
        .map_err(|_| Error::Conflict("too many config versions".to_owned()))?;
    let p = &spec.properties;
    sqlx::query(
        "INSERT INTO model_configs (model_id, version, context_window, max_output, weights_file, weights_sha256, \
         quantization, page_size, prefill_kv_bytes, decode_kv_bytes, tensor_parallel, pipeline_parallel, \
         input_neurons_per_mtok, output_neurons_per_mtok, created_by, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )
    .bind(model.id.get())
    .bind(i64::from(next))
    .bind(to_i64(p.context_window, "context_window")?)
    .bind(to_i64(p.max_output, "max_output")?)
    .bind(spec.weights_file.as_str())
    .bind(spec.weights_sha256.to_ascii_lowercase())
    .bind(spec.quantization.as_str())
    .bind(i64::from(spec.page_size))
    .bind(to_i64(spec.kv_budget.prefill_bytes, "kv_budget.prefill_bytes")?)
    .bind(to_i64(spec.kv_budget.decode_bytes, "kv_budget.decode_bytes")?)
    .bind(i64::from(spec.parallelism.tensor))
    .bind(i64::from(spec.parallelism.pipeline))
    .bind(to_i64(spec.price.input_neurons_per_mtok, "price")?)
    .bind(to_i64(spec.price.output_neurons_per_mtok, "price")?)
    .bind(actor)
    .bind(now.millis())
    .execute(&mut *conn)
    .await?;
    Ok(ConfigVersion::new(next))
}

/// One version of a model's config.
pub async fn get(
    conn: &mut Conn,
    model: &ModelRow,
    version: ConfigVersion,
) -> Result<ConfigRow, Error> {
    let q = sqlx::query(select_configs!("WHERE model_id = $1 AND version = $2"));
    let q = q.bind(model.id.get()).bind(i64::from(version.get()));
    super::one(conn, q, config_row, || {
        format!("config {version} of {}", model.slug)
    })
    .await
}

/// The model's active config, if any.
pub async fn active(conn: &mut Conn, model: &ModelRow) -> Result<Option<ConfigRow>, Error> {
    match model.active_config {
        Some(v) => Ok(Some(get(conn, model, v).await?)),
        None => Ok(None),
    }
}

/// Every version, oldest first.
pub async fn list(conn: &mut Conn, model: &ModelRow) -> Result<Vec<ConfigRow>, Error> {
    let q = sqlx::query(select_configs!("WHERE model_id = $1 ORDER BY version"));
    super::all(conn, q.bind(model.id.get()), config_row).await
}

/// Makes `version` the active config after checking it against every node
/// seen within `node_ttl` (its pool holds context window + max output, and
/// it prefills the context window within its deadline at the speed it
/// measured); the refusal names the first node it does not fit and the
/// numbers. Appends a `config.activate` audit entry.
pub async fn activate(
    conn: &mut Conn,
    model: &ModelRow,
    version: ConfigVersion,
    actor: &str,
    reason: &str,
    now: Timestamp,
    node_ttl: Duration,
) -> Result<AuditEntry, Error> {
    let config = get(conn, model, version).await?;
    let p = config.spec.properties;
    for node in nodes::list(conn, Some(model.id)).await? {
        let r = &node.registration;
        if !is_live(node.last_seen_at, now, node_ttl) {
            continue;
        }
        if let Some(why) = prefill_shortfall(r.prefill.as_ref(), p.context_window) {
            return Err(Error::ConfigTooSlow {
                model: model.slug.to_string(),
                version,
                node: r.name.clone(),
                role: r.role,
                why,
            });
        }
        if !check_fits(&p, r.kv_pool_tokens) {
            return Err(Error::ConfigDoesNotFit {
                model: model.slug.to_string(),
                version,
                node: r.name.clone(),
                role: r.role,
                pool: r.kv_pool_tokens,
                context_window: p.context_window,
                max_output: p.max_output,
                required: p.required_tokens(),
            });
        }
    }
    models::set_active_config(conn, model.id, version, now).await?;
    sqlx::query("UPDATE model_configs SET activated_at = $1 WHERE model_id = $2 AND version = $3")
        .bind(now.millis())
        .bind(model.id.get())
        .bind(i64::from(version.get()))
        .execute(&mut *conn)
        .await?;
    let before = model
        .active_config
        .map_or_else(|| "none".to_owned(), |v| v.to_string());
    let after = version.to_string();
    let entry = NewEntry::new(
        actor,
        "config.activate",
        model.slug.as_str(),
        (&before, &after),
    )
    .because(reason);
    audit::append(conn, entry, now).await
}

/// The highest price per million tokens: costs stay far inside `i64`
/// micro-neurons.
const MAX_PRICE: u64 = 1_000_000_000;

fn validate(spec: &ConfigSpec) -> Result<(), Error> {
    let p = &spec.properties;
    let bad = |m: &str| Err(Error::Invalid(m.to_owned()));
    // A model that generates nothing (an embedding model) has no output
    // and keeps no KV; every other model has both.
    let generates = p.max_output > 0;
    if p.context_window == 0 {
        return bad("context_window must be at least 1");
    }
    if spec.weights_sha256.len() != 64
        || !spec.weights_sha256.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return bad("weights_sha256 must be 64 hex digits");
    }
    super::require_text("weights_file", &spec.weights_file, 500)?;
    super::require_text("quantization", &spec.quantization, 50)?;
    if spec.page_size == 0 || spec.parallelism.tensor == 0 || spec.parallelism.pipeline == 0 {
        return bad("page_size and parallelism degrees must be at least 1");
    }
    if generates && (spec.kv_budget.prefill_bytes == 0 || spec.kv_budget.decode_bytes == 0) {
        return bad("kv_budget bytes must be at least 1 for a model with output");
    }
    if spec.price.input_neurons_per_mtok > MAX_PRICE
        || spec.price.output_neurons_per_mtok > MAX_PRICE
    {
        return bad("a price is at most 1000000000 neurons per million tokens");
    }
    Ok(())
}

fn config_row(r: &AnyRow) -> Result<ConfigRow, Error> {
    let small = |col: &str| -> Result<u32, Error> {
        u32::try_from(get_u64(r, col)?).map_err(|e| Error::from(sqlx::Error::Decode(e.into())))
    };
    Ok(ConfigRow {
        version: ConfigVersion::new(small("version")?),
        spec: ConfigSpec {
            properties: Properties {
                context_window: get_u64(r, "context_window")?,
                max_output: get_u64(r, "max_output")?,
            },
            weights_file: r.try_get("weights_file")?,
            weights_sha256: r.try_get("weights_sha256")?,
            quantization: r.try_get("quantization")?,
            page_size: small("page_size")?,
            kv_budget: KvBudget {
                prefill_bytes: get_u64(r, "prefill_kv_bytes")?,
                decode_bytes: get_u64(r, "decode_kv_bytes")?,
            },
            parallelism: Parallelism {
                tensor: small("tensor_parallel")?,
                pipeline: small("pipeline_parallel")?,
            },
            price: Price {
                input_neurons_per_mtok: get_u64(r, "input_neurons_per_mtok")?,
                output_neurons_per_mtok: get_u64(r, "output_neurons_per_mtok")?,
            },
        },
        created_by: r.try_get("created_by")?,
        created_at: get_time(r, "created_at")?,
        activated_at: get_opt_time(r, "activated_at")?,
    })
}
