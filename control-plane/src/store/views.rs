//! What the admin API shows of models and nodes: the top layer of the
//! store, reading models, their configs and nodes together. A node's
//! routability is computed here on every read ([`crate::routability`]),
//! never stored, so it cannot go stale.

use super::models::{self, ModelRow};
use super::nodes::NodeRow;
use super::{Conn, configs};
use crate::routability::{self, ActiveConfig, NodeFacts, Routability};
use crate::{ConfigVersion, Error};
use bulkhead_control_api::{ModelView, NodeView, Timestamp};
use std::collections::HashMap;
use std::time::Duration;

/// The admin API's view of a model: allowlist and active limits included.
pub async fn model(conn: &mut Conn, m: &ModelRow) -> Result<ModelView, Error> {
    let allowlist = models::allowlist(conn, m.id).await?;
    let properties = match m.active_config {
        Some(v) => Some(configs::get(conn, m, v).await?.spec.properties),
        None => None,
    };
    Ok(ModelView {
        slug: m.slug.clone(),
        task: m.task.clone(),
        description: m.description.clone(),
        visibility: m.visibility,
        allowlist,
        properties,
        active_config: m.active_config.map(ConfigVersion::get),
        component_status: m.component_status,
        created_at: m.created_at,
        updated_at: m.updated_at,
    })
}

/// The admin API's views of `rows`, each with its routability now.
pub async fn nodes(
    conn: &mut Conn,
    rows: Vec<NodeRow>,
    now: Timestamp,
    ttl: Duration,
) -> Result<Vec<NodeView>, Error> {
    let mut active = HashMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for node in rows {
        if let std::collections::hash_map::Entry::Vacant(slot) = active.entry(node.model_id) {
            let model = models::get(conn, node.model_id).await?;
            slot.insert(configs::active(conn, &model).await?);
        }
        let config = active.get(&node.model_id).and_then(Option::as_ref);
        let (routable, unroutable_reason) = match routability::evaluate(
            NodeFacts {
                registration: &node.registration,
                last_seen_at: node.last_seen_at,
            },
            config.map(|c| ActiveConfig {
                version: c.version,
                spec: &c.spec,
            }),
            now,
            ttl,
        ) {
            Routability::Routable => (true, None),
            Routability::Unroutable(why) => (false, Some(why)),
        };
        out.push(NodeView {
            id: node.id.get(),
            registration: node.registration,
            load: node.load,
            registered_at: node.registered_at,
            last_seen_at: node.last_seen_at,
            routable,
            unroutable_reason,
        });
    }
    Ok(out)
}
