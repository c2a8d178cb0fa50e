//! The routing table a gateway polls: models with visibility and limits,
//! nodes with routability, accounts with their tenant numbers, and live
//! token hashes, read in one transaction.

use super::{Conn, accounts, api_tokens, configs, models, nodes, views};
use crate::{AccountId, Error};
use bulkhead_control_api::{RoutedAccount, RoutedModel, RoutingTable, Timestamp};
use std::time::Duration;

/// The tenant number workers tag an account's KV pages with: the first 64
/// bits of its random id.
pub fn tenant_of(account: &AccountId) -> u64 {
    account
        .as_str()
        .get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

/// Reads the whole table (the caller stamps the version).
pub async fn table(
    conn: &mut Conn,
    version: u64,
    lease: Duration,
    node_ttl: Duration,
) -> Result<RoutingTable, Error> {
    let mut out_models = Vec::new();
    for m in models::list(conn).await? {
        let active = configs::active(conn, &m).await?;
        let config_version = active.as_ref().map(|c| u64::from(c.version.get()));
        let price = active.as_ref().map(|c| c.spec.price).unwrap_or_default();
        let properties = active.map(|c| c.spec.properties);
        out_models.push(RoutedModel {
            config_version,
            allowlist: models::allowlist(conn, m.id).await?,
            slug: m.slug,
            task: m.task,
            description: m.description,
            visibility: m.visibility,
            properties,
            price,
            created_at: m.created_at,
        });
    }
    let rows = nodes::list(conn, None).await?;
    let nodes = views::nodes(conn, rows, Timestamp::now(), node_ttl).await?;
    let accounts = accounts::list(conn)
        .await?
        .into_iter()
        .filter_map(|a| {
            let id = AccountId::parse(&a.id)?;
            Some(RoutedAccount {
                tenant: tenant_of(&id),
                id: a.id,
                name: a.name,
                budget: a.budget,
            })
        })
        .collect();
    Ok(RoutingTable {
        version,
        lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        models: out_models,
        nodes,
        accounts,
        tokens: api_tokens::live(conn).await?,
        planned_withdrawals: Vec::new(),
    })
}
