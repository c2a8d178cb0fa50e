//! The public status page: what the world is told. One read of the database
//! ([`Snapshot::load`]) feeds pure renderers for the Statuspage v2 JSON
//! (`statuspage`), the Atom and RSS feeds (`feeds`) and the HTML page
//! (`html`).
//!
//! Architecture invariant: only models that have been public at least once
//! are components here; a model created private is never named on the
//! public page, not even through an incident that touched it.

pub(crate) mod feeds;
pub(crate) mod html;
pub(crate) mod statuspage;
pub(crate) mod uptime;

use crate::store::models::ModelRow;
use crate::store::{Conn, incidents, models};
use crate::{Error, ModelId};
use bulkhead_control_api::{ComponentStatus, Impact, IncidentView, ModelSlug, Timestamp};
use std::collections::BTreeMap;

/// How many incidents the feeds and `incidents.json` carry.
pub(crate) const RECENT_INCIDENTS: u32 = 50;

/// Everything the status renderers read.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Page title.
    pub(crate) name: String,
    /// Base URL, no trailing slash.
    pub(crate) url: String,
    /// Listed models by slug; their position is their index + 1.
    pub(crate) components: Vec<ModelRow>,
    /// Recent incidents, newest first, limited to listed components.
    pub(crate) incidents: Vec<IncidentView>,
    /// Component changes of the last [`uptime::DAYS`] days by model,
    /// oldest first: (when, old status, new status).
    pub(crate) history: BTreeMap<ModelId, Vec<(Timestamp, ComponentStatus, ComponentStatus)>>,
    /// When it was read.
    pub(crate) now: Timestamp,
}

impl Snapshot {
    /// Reads the listed models, the recent incidents and every open one.
    /// An incident that touched only models never public is left out whole:
    /// its title and text would name them.
    pub(crate) async fn load(conn: &mut Conn, name: &str, url: &str) -> Result<Snapshot, Error> {
        let components: Vec<ModelRow> = models::list(conn)
            .await?
            .into_iter()
            .filter(|m| m.listed)
            .collect();
        let mut recent = incidents::list(conn, RECENT_INCIDENTS, false).await?;
        for open in incidents::list(conn, u32::MAX >> 1, true).await? {
            if !recent.iter().any(|i| i.id == open.id) {
                recent.push(open);
            }
        }
        recent.sort_by_key(|i| std::cmp::Reverse(i.id));
        let listed: BTreeMap<&ModelSlug, ()> = components.iter().map(|m| (&m.slug, ())).collect();
        recent.retain(|i| {
            i.components.is_empty() || i.components.iter().any(|s| listed.contains_key(s))
        });
        for i in &mut recent {
            i.components.retain(|s| listed.contains_key(s));
            for u in &mut i.updates {
                u.affected_components
                    .retain(|a| listed.contains_key(&a.model));
            }
        }
        let now = Timestamp::now();
        let since = Timestamp::start_of_day(now.day() - (uptime::DAYS - 1));
        let mut history: BTreeMap<ModelId, Vec<_>> = BTreeMap::new();
        for c in incidents::status_changes(conn, since).await? {
            history
                .entry(c.model)
                .or_default()
                .push((c.at, c.old, c.new));
        }
        history.retain(|id, _| components.iter().any(|m| m.id == *id));
        Ok(Snapshot {
            name: name.to_owned(),
            url: url.trim_end_matches('/').to_owned(),
            components,
            incidents: recent,
            history,
            now,
        })
    }

    /// The page's id: its name in lowercase letters and digits.
    pub(crate) fn page_id(&self) -> String {
        let id: String = self
            .name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if id.is_empty() {
            "status".to_owned()
        } else {
            id
        }
    }

    /// The latest change anywhere on the page.
    pub(crate) fn updated_at(&self) -> Timestamp {
        self.components
            .iter()
            .map(|m| m.updated_at)
            .chain(self.incidents.iter().map(|i| i.updated_at))
            .max()
            .unwrap_or(self.now)
    }

    /// Statuspage's roll-up: the worst component status and open incident impact.
    pub(crate) fn indicator(&self) -> Impact {
        self.components
            .iter()
            .map(|m| m.component_status.indicator())
            .chain(
                self.incidents
                    .iter()
                    .filter(|i| !i.status.is_closed())
                    .map(|i| i.impact),
            )
            .max()
            .unwrap_or(Impact::None)
    }

    /// A listed model by slug.
    pub(crate) fn component(&self, slug: &ModelSlug) -> Option<(usize, &ModelRow)> {
        self.components
            .iter()
            .enumerate()
            .find(|(_, m)| &m.slug == slug)
    }

    /// An incident's public URL.
    pub(crate) fn incident_url(&self, id: i64) -> String {
        format!("{}/incidents/{id}", self.url)
    }

    /// The URL's host without a port, for Atom `tag:` ids (RFC 4151).
    pub(crate) fn host(&self) -> &str {
        let rest = self
            .url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => authority.split(':').next().unwrap_or(authority),
        }
    }
}
