//! Atlassian Statuspage v2 JSON: `summary.json`, `status.json`,
//! `components.json`, `incidents.json`, `incidents/unresolved.json` and the
//! (always empty) scheduled-maintenance lists. Field names and enumerations
//! are Statuspage's, so existing status tooling reads them unchanged.

use super::Snapshot;
use crate::store::models::ModelRow;
use bulkhead_control_api::{ComponentStatus, Impact, IncidentStatus, IncidentView, Timestamp};
use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, Serialize)]
pub(crate) struct Page {
    id: String,
    name: String,
    url: String,
    time_zone: &'static str,
    updated_at: Timestamp,
}

#[derive(Debug, Serialize)]
pub(crate) struct Status {
    indicator: Impact,
    description: &'static str,
}

#[derive(Debug, Serialize)]
pub(crate) struct Component {
    id: String,
    name: String,
    status: ComponentStatus,
    created_at: Timestamp,
    updated_at: Timestamp,
    position: usize,
    description: Option<String>,
    showcase: bool,
    start_date: Option<String>,
    group_id: Option<String>,
    page_id: String,
    group: bool,
    only_show_if_degraded: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct Incident {
    id: String,
    name: String,
    status: IncidentStatus,
    created_at: Timestamp,
    updated_at: Timestamp,
    monitoring_at: Option<Timestamp>,
    resolved_at: Option<Timestamp>,
    impact: Impact,
    shortlink: String,
    started_at: Timestamp,
    page_id: String,
    incident_updates: Vec<IncidentUpdate>,
    components: Vec<Component>,
    reminder_intervals: Option<String>,
    postmortem_body: Option<String>,
    postmortem_published_at: Option<Timestamp>,
}

#[derive(Debug, Serialize)]
pub(crate) struct IncidentUpdate {
    id: String,
    status: IncidentStatus,
    body: String,
    incident_id: String,
    created_at: Timestamp,
    updated_at: Timestamp,
    display_at: Timestamp,
    affected_components: Option<Vec<AffectedComponent>>,
    deliver_notifications: bool,
    custom_tweet: Option<String>,
    tweet_id: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AffectedComponent {
    code: String,
    name: String,
    old_status: ComponentStatus,
    new_status: ComponentStatus,
}

/// `page` object.
pub(crate) fn page(s: &Snapshot) -> Page {
    Page {
        id: s.page_id(),
        name: s.name.clone(),
        url: s.url.clone(),
        time_zone: "Etc/UTC",
        updated_at: s.updated_at(),
    }
}

/// `status` object.
pub(crate) fn status(s: &Snapshot) -> Status {
    let indicator = s.indicator();
    Status {
        indicator,
        description: indicator.description(),
    }
}

fn component(s: &Snapshot, index: usize, m: &ModelRow) -> Component {
    Component {
        id: component_id(m),
        name: m.slug.to_string(),
        status: m.component_status,
        created_at: m.created_at,
        updated_at: m.updated_at,
        position: index + 1,
        description: (!m.description.is_empty()).then(|| m.description.clone()),
        showcase: true,
        start_date: None,
        group_id: None,
        page_id: s.page_id(),
        group: false,
        only_show_if_degraded: false,
    }
}

fn component_id(m: &ModelRow) -> String {
    format!("model{}", m.id)
}

fn components(s: &Snapshot) -> Vec<Component> {
    s.components
        .iter()
        .enumerate()
        .map(|(i, m)| component(s, i, m))
        .collect()
}

fn incident(s: &Snapshot, i: &IncidentView) -> Incident {
    let id = format!("incident{}", i.id);
    let updates = i
        .updates
        .iter()
        .map(|u| {
            let affected: Vec<AffectedComponent> = u
                .affected_components
                .iter()
                .filter_map(|a| {
                    let (_, m) = s.component(&a.model)?;
                    Some(AffectedComponent {
                        code: component_id(m),
                        name: m.slug.to_string(),
                        old_status: a.old_status,
                        new_status: a.new_status,
                    })
                })
                .collect();
            IncidentUpdate {
                id: format!("update{}", u.id),
                status: u.status,
                body: u.body.clone(),
                incident_id: id.clone(),
                created_at: u.created_at,
                updated_at: u.created_at,
                display_at: u.created_at,
                affected_components: (!affected.is_empty()).then_some(affected),
                deliver_notifications: true,
                custom_tweet: None,
                tweet_id: None,
            }
        })
        .collect();
    Incident {
        shortlink: s.incident_url(i.id),
        id,
        name: i.name.clone(),
        status: i.status,
        created_at: i.created_at,
        updated_at: i.updated_at,
        monitoring_at: i.monitoring_at,
        resolved_at: i.resolved_at,
        impact: i.impact,
        started_at: i.created_at,
        page_id: s.page_id(),
        incident_updates: updates,
        components: i
            .components
            .iter()
            .filter_map(|slug| s.component(slug).map(|(n, m)| component(s, n, m)))
            .collect(),
        reminder_intervals: None,
        postmortem_body: i.postmortem_body.clone(),
        postmortem_published_at: i.postmortem_published_at,
    }
}

fn incidents(s: &Snapshot, unresolved_only: bool) -> Vec<Incident> {
    s.incidents
        .iter()
        .filter(|i| !unresolved_only || !i.status.is_closed())
        .map(|i| incident(s, i))
        .collect()
}

/// `GET /api/v2/summary.json`.
pub(crate) fn summary(s: &Snapshot) -> Value {
    json!({
        "page": page(s),
        "components": components(s),
        "incidents": incidents(s, true),
        "scheduled_maintenances": [],
        "status": status(s),
    })
}

/// `GET /api/v2/status.json`.
pub(crate) fn status_json(s: &Snapshot) -> Value {
    json!({ "page": page(s), "status": status(s) })
}

/// `GET /api/v2/components.json`.
pub(crate) fn components_json(s: &Snapshot) -> Value {
    json!({ "page": page(s), "components": components(s) })
}

/// `GET /api/v2/incidents.json` and `incidents/unresolved.json`.
pub(crate) fn incidents_json(s: &Snapshot, unresolved_only: bool) -> Value {
    json!({ "page": page(s), "incidents": incidents(s, unresolved_only) })
}

/// `GET /api/v2/scheduled-maintenances*.json`: Bulkhead schedules none.
pub(crate) fn maintenances_json(s: &Snapshot) -> Value {
    json!({ "page": page(s), "scheduled_maintenances": [] })
}
