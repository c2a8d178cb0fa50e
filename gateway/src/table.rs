//! The routing table as the gateway uses it: indexed by slug, account and
//! token hash. Built once per version the control plane sends.

use bulkhead_control_api::{
    ModelSlug, NodeRole, NodeView, RoutedAccount, RoutedModel, RoutingTable, Visibility,
};
use std::collections::{HashMap, HashSet};

/// One applied routing table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    version: u64,
    models: HashMap<ModelSlug, RoutedModel>,
    accounts: HashMap<String, RoutedAccount>,
    /// Token hash to its account and, for a batch runner's token, its batch.
    tokens: HashMap<String, (String, Option<String>)>,
    /// Routable generating workers (decode or colocated) per model.
    workers: HashMap<ModelSlug, Vec<NodeView>>,
    /// Models made private by a planned flip.
    planned: HashSet<ModelSlug>,
}

impl Table {
    /// Indexes a table from the control plane.
    pub fn new(t: RoutingTable) -> Table {
        let mut workers: HashMap<ModelSlug, Vec<NodeView>> = HashMap::new();
        for n in t.nodes {
            let generates = matches!(n.registration.role, NodeRole::Decode | NodeRole::Colocated);
            if n.routable && generates {
                workers
                    .entry(n.registration.model.clone())
                    .or_default()
                    .push(n);
            }
        }
        Table {
            version: t.version,
            models: t.models.into_iter().map(|m| (m.slug.clone(), m)).collect(),
            accounts: t.accounts.into_iter().map(|a| (a.id.clone(), a)).collect(),
            tokens: t
                .tokens
                .into_iter()
                .map(|k| (k.sha256, (k.account_id, k.batch_id)))
                .collect(),
            workers,
            planned: t.planned_withdrawals.into_iter().collect(),
        }
    }

    /// Whether a stream of `slug` for `account` must end under this table:
    /// the account may no longer call the model, and no responder planned
    /// the flip to let streams finish.
    pub fn ends_stream(&self, slug: &ModelSlug, account: &str) -> bool {
        self.visible(account, slug.as_str()).is_none() && !self.planned.contains(slug)
    }

    /// The control plane's version of this table.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The models whose visibility this table changes against `before`
    /// (a model `before` did not have counts as changed), by slug.
    pub fn visibility_changes(&self, before: &Table) -> Vec<(&ModelSlug, Visibility)> {
        let mut changed: Vec<(&ModelSlug, Visibility)> = self
            .models
            .iter()
            .filter(|(slug, m)| {
                before
                    .models
                    .get(*slug)
                    .is_none_or(|b| b.visibility != m.visibility)
            })
            .map(|(slug, m)| (slug, m.visibility))
            .collect();
        changed.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        changed
    }

    /// The account a token hash belongs to, and the batch it was made
    /// for if the batch runner holds it.
    pub fn token_account(&self, sha256: &str) -> Option<(&RoutedAccount, Option<&str>)> {
        let (account, batch) = self.tokens.get(sha256)?;
        Some((self.accounts.get(account)?, batch.as_deref()))
    }

    /// An account by id.
    pub fn account(&self, id: &str) -> Option<&RoutedAccount> {
        self.accounts.get(id)
    }

    /// The model `slug` if `account` may call it. A private model the
    /// account is not allowlisted for is `None`, exactly like a model that
    /// does not exist.
    pub fn visible(&self, account: &str, slug: &str) -> Option<&RoutedModel> {
        let slug: ModelSlug = slug.parse().ok()?;
        let m = self.models.get(&slug)?;
        match m.visibility {
            Visibility::Public => Some(m),
            Visibility::Private => m.allowlist.iter().any(|a| a == account).then_some(m),
        }
    }

    /// Every model `account` may call, by slug.
    pub fn visible_models(&self, account: &str) -> Vec<&RoutedModel> {
        let mut out: Vec<&RoutedModel> = self
            .models
            .values()
            .filter(|m| self.visible(account, m.slug.as_str()).is_some())
            .collect();
        out.sort_by(|a, b| a.slug.cmp(&b.slug));
        out
    }

    /// Routable workers that generate for `slug`.
    pub fn workers(&self, slug: &ModelSlug) -> &[NodeView] {
        self.workers.get(slug).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(version: u64, models: &[(&str, Visibility)]) -> Table {
        Table::new(RoutingTable {
            version,
            lease_ms: 6000,
            models: models
                .iter()
                .map(|(slug, visibility)| RoutedModel {
                    slug: slug.parse().expect("slug"),
                    task: "Text Generation".to_owned(),
                    description: String::new(),
                    visibility: *visibility,
                    allowlist: Vec::new(),
                    properties: None,
                    config_version: None,
                    price: Default::default(),
                    created_at: bulkhead_control_api::Timestamp::now(),
                })
                .collect(),
            nodes: Vec::new(),
            accounts: Vec::new(),
            tokens: Vec::new(),
            planned_withdrawals: Vec::new(),
        })
    }

    #[test]
    fn a_flip_and_a_new_model_are_visibility_changes_and_nothing_else_is() {
        use Visibility::{Private, Public};
        let before = table(1, &[("@cf/a/one", Public), ("@cf/a/two", Public)]);
        let after = table(
            2,
            &[
                ("@cf/a/one", Public),
                ("@cf/a/two", Private),
                ("@cf/a/three", Private),
            ],
        );
        let changes: Vec<(String, Visibility)> = after
            .visibility_changes(&before)
            .into_iter()
            .map(|(s, v)| (s.to_string(), v))
            .collect();
        assert_eq!(
            changes,
            [
                ("@cf/a/three".to_owned(), Private),
                ("@cf/a/two".to_owned(), Private)
            ]
        );
        assert!(after.visibility_changes(&after).is_empty());
    }
}
