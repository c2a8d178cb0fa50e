//! Registered workers: what each measured after loading weights, and when it
//! was last heard from. Routability is computed from these rows on read
//! ([`super::views`]), never stored, so it cannot go stale.
//!
//! Registrations, re-registrations and removals are audited. Only the operator
//! that registered a name (or an admin) may replace it or keep it alive, and a
//! heartbeat cannot report more pages than the registered pool holds.

use super::operators::Operator;
use super::{Conn, get_enum, get_time, get_u64, models, to_i64};
use crate::{Error, ModelId, NodeId};
use bulkhead_control_api::{
    Heartbeat, ModelSlug, NodeLoad, Parallelism, PrefillFigures, RegisterNode, Role, Timestamp,
};
use sqlx::Row;
use sqlx::any::AnyRow;

/// A registered worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Id.
    pub id: NodeId,
    /// Its model.
    pub model_id: ModelId,
    /// What it registered last.
    pub registration: RegisterNode,
    /// Its last reported load.
    pub load: Option<NodeLoad>,
    /// First registration.
    pub registered_at: Timestamp,
    /// Last registration or heartbeat.
    pub last_seen_at: Timestamp,
}

// `select_...!`: every column the row reader reads.
select_macro!(
    $ select_nodes,
    "n.id, n.model_id, m.slug, n.name, n.role, n.address, n.transfer_address, n.kv_pool_tokens, \
     n.weights_sha256, n.quantization, n.page_size, n.kv_budget_bytes, n.tensor_parallel, n.pipeline_parallel, \
     n.free_pages, n.total_pages, n.queue_depth, n.registered_at, n.last_seen_at, \
     n.prefill_ns_per_token, n.prefill_ns_per_pair, n.prefill_deadline_ms",
    "nodes n JOIN models m ON m.id = n.model_id"
);

/// Registers a worker, or replaces the record of one with the same name
/// (after a restart with other weights, quantization or memory budget).
/// Only the operator that registered a name (or an admin) may replace it.
pub async fn register(
    conn: &mut Conn,
    reg: &RegisterNode,
    by: &Operator,
    now: Timestamp,
) -> Result<NodeId, Error> {
    super::require_text("node name", &reg.name, 200)?;
    super::require_text("address", &reg.address, 200)?;
    super::require_text("quantization", &reg.quantization, 50)?;
    if reg.page_size == 0 || reg.parallelism.tensor == 0 || reg.parallelism.pipeline == 0 {
        return Err(Error::Invalid(
            "page_size and parallelism degrees must be at least 1".to_owned(),
        ));
    }
    let model = models::find(conn, &reg.model).await?;
    let row = sqlx::query(
        "INSERT INTO nodes (name, role, model_id, address, transfer_address, kv_pool_tokens, weights_sha256, \
         quantization, page_size, kv_budget_bytes, tensor_parallel, pipeline_parallel, registered_at, last_seen_at, \
         operator_id, prefill_ns_per_token, prefill_ns_per_pair, prefill_deadline_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $16, $17, $18) \
         ON CONFLICT (name) DO UPDATE SET role = excluded.role, model_id = excluded.model_id, \
         address = excluded.address, transfer_address = excluded.transfer_address, \
         kv_pool_tokens = excluded.kv_pool_tokens, weights_sha256 = excluded.weights_sha256, \
         quantization = excluded.quantization, page_size = excluded.page_size, \
         kv_budget_bytes = excluded.kv_budget_bytes, tensor_parallel = excluded.tensor_parallel, \
         pipeline_parallel = excluded.pipeline_parallel, free_pages = NULL, total_pages = NULL, \
         queue_depth = NULL, last_seen_at = excluded.last_seen_at, operator_id = excluded.operator_id, \
         prefill_ns_per_token = excluded.prefill_ns_per_token, \
         prefill_ns_per_pair = excluded.prefill_ns_per_pair, \
         prefill_deadline_ms = excluded.prefill_deadline_ms \
         WHERE nodes.operator_id = excluded.operator_id OR $15 = 1 \
         RETURNING id",
    )
    .bind(reg.name.as_str())
    .bind(reg.role.as_str())
    .bind(model.id.get())
    .bind(reg.address.as_str())
    .bind(reg.transfer_address.as_deref())
    .bind(to_i64(reg.kv_pool_tokens, "kv_pool_tokens")?)
    .bind(reg.weights_sha256.to_ascii_lowercase())
    .bind(reg.quantization.as_str())
    .bind(i64::from(reg.page_size))
    .bind(to_i64(reg.kv_budget_bytes, "kv_budget_bytes")?)
    .bind(i64::from(reg.parallelism.tensor))
    .bind(i64::from(reg.parallelism.pipeline))
    .bind(now.millis())
    .bind(by.id.get())
    .bind(i64::from(by.role == Role::Admin))
    .bind(reg.prefill.map(|p| to_i64(p.ns_per_token, "ns_per_token")).transpose()?)
    .bind(reg.prefill.map(|p| to_i64(p.ns_per_pair, "ns_per_pair")).transpose()?)
    .bind(reg.prefill.map(|p| to_i64(p.deadline_ms, "deadline_ms")).transpose()?)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| Error::Conflict(format!("node name `{}` is registered by another operator", reg.name)))?;
    Ok(NodeId::from_db(row.try_get("id")?))
}

/// Records a heartbeat and the load it carries; only from the operator that
/// registered the node (or an admin).
pub async fn heartbeat(
    conn: &mut Conn,
    id: NodeId,
    by: &Operator,
    beat: &Heartbeat,
    now: Timestamp,
) -> Result<(), Error> {
    let load = beat.load;
    if let Some(l) = &load {
        // A node cannot claim more than the pool it registered.
        let node = get(conn, id).await?;
        let page = u64::from(node.registration.page_size);
        if l.free_pages > l.total_pages
            || l.total_pages.saturating_mul(page) > node.registration.kv_pool_tokens
        {
            return Err(Error::Invalid(format!(
                "load of {} free of {} pages does not fit the registered pool of {} tokens in {page}-token pages",
                l.free_pages, l.total_pages, node.registration.kv_pool_tokens
            )));
        }
    }
    let opt =
        |f: fn(&NodeLoad) -> u64, what: &str| load.as_ref().map(|l| to_i64(f(l), what)).transpose();
    let q = sqlx::query(
        "UPDATE nodes SET last_seen_at = $1, free_pages = $2, total_pages = $3, queue_depth = $4 \
         WHERE id = $5 AND (operator_id = $6 OR $7 = 1)",
    )
    .bind(now.millis())
    .bind(opt(|l| l.free_pages, "free_pages")?)
    .bind(opt(|l| l.total_pages, "total_pages")?)
    .bind(opt(|l| l.queue_depth, "queue_depth")?)
    .bind(id.get())
    .bind(by.id.get())
    .bind(i64::from(by.role == Role::Admin));
    super::change(conn, q, || format!("node {id}")).await
}

/// One node.
pub async fn get(conn: &mut Conn, id: NodeId) -> Result<NodeRow, Error> {
    let q = sqlx::query(select_nodes!("WHERE n.id = $1"));
    super::one(conn, q.bind(id.get()), node_row, || format!("node {id}")).await
}

/// Every node, or those of one model, by name (byte order on both backends).
pub async fn list(conn: &mut Conn, model: Option<ModelId>) -> Result<Vec<NodeRow>, Error> {
    let q = sqlx::query(select_nodes!(
        "WHERE ($1 = 0 OR n.model_id = $1) ORDER BY n.name"
    ));
    let mut nodes = super::all(conn, q.bind(model.map_or(0, ModelId::get)), node_row).await?;
    nodes.sort_by(|a, b| a.registration.name.cmp(&b.registration.name));
    Ok(nodes)
}

/// Removes a node's record (a worker taken out of service for good).
pub async fn remove(conn: &mut Conn, id: NodeId) -> Result<(), Error> {
    let q = sqlx::query("DELETE FROM nodes WHERE id = $1").bind(id.get());
    super::change(conn, q, || format!("node {id}")).await
}

fn node_row(r: &AnyRow) -> Result<NodeRow, Error> {
    let small = |col: &str| -> Result<u32, Error> {
        u32::try_from(get_u64(r, col)?).map_err(|e| Error::from(sqlx::Error::Decode(e.into())))
    };
    let slug: String = r.try_get("slug")?;
    let load = match (
        r.try_get::<Option<i64>, _>("free_pages")?,
        r.try_get::<Option<i64>, _>("total_pages")?,
        r.try_get::<Option<i64>, _>("queue_depth")?,
    ) {
        (Some(f), Some(t), Some(q)) => Some(NodeLoad {
            free_pages: u64::try_from(f).unwrap_or(0),
            total_pages: u64::try_from(t).unwrap_or(0),
            queue_depth: u64::try_from(q).unwrap_or(0),
        }),
        _ => None,
    };
    Ok(NodeRow {
        id: NodeId::from_db(r.try_get("id")?),
        model_id: ModelId::from_db(r.try_get("model_id")?),
        registration: RegisterNode {
            name: r.try_get("name")?,
            role: get_enum(r, "role")?,
            model: slug
                .parse::<ModelSlug>()
                .map_err(|e| sqlx::Error::Decode(e.into()))?,
            address: r.try_get("address")?,
            transfer_address: r.try_get("transfer_address")?,
            kv_pool_tokens: get_u64(r, "kv_pool_tokens")?,
            weights_sha256: r.try_get("weights_sha256")?,
            quantization: r.try_get("quantization")?,
            page_size: small("page_size")?,
            kv_budget_bytes: get_u64(r, "kv_budget_bytes")?,
            parallelism: Parallelism {
                tensor: small("tensor_parallel")?,
                pipeline: small("pipeline_parallel")?,
            },
            prefill: prefill_of(r)?,
        },
        load,
        registered_at: get_time(r, "registered_at")?,
        last_seen_at: get_time(r, "last_seen_at")?,
    })
}

/// The registered prefill figures, if the node sent them.
fn prefill_of(r: &AnyRow) -> Result<Option<PrefillFigures>, sqlx::Error> {
    let get = |c: &str| -> Result<Option<u64>, sqlx::Error> {
        Ok(r.try_get::<Option<i64>, _>(c)?
            .map(|v| u64::try_from(v).unwrap_or(0)))
    };
    Ok(
        match (
            get("prefill_ns_per_token")?,
            get("prefill_ns_per_pair")?,
            get("prefill_deadline_ms")?,
        ) {
            (Some(ns_per_token), Some(ns_per_pair), Some(deadline_ms)) => Some(PrefillFigures {
                ns_per_token,
                ns_per_pair,
                deadline_ms,
            }),
            _ => None,
        },
    )
}
