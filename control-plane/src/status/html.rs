//! The HTML status page, one page per incident and the not-found page,
//! laid out as an Atlassian Statuspage page is: a header with the page's
//! name and last update, the overall banner, active incidents in boxes
//! coloured by impact, every model with its friendly name, status and 90
//! days of uptime bars, then past incidents by day.
//!
//! Rendered with minijinja from the templates beside this file, with HTML
//! auto-escaping on: no dynamic string reaches the page unescaped, and the
//! pages carry no scripts and no external assets.

use super::Snapshot;
use super::uptime::{self, Uptime};
use bulkhead_control_api::{ComponentStatus, IncidentView, ModelSlug, Timestamp};
use minijinja::Environment;
use serde::Serialize;
use std::sync::LazyLock;

/// How many days, today included, "Past incidents" lists.
const PAST_DAYS: i64 = 15;

/// `GET /`.
pub(crate) fn page(s: &Snapshot) -> String {
    let active = s
        .incidents
        .iter()
        .filter(|i| !i.status.is_closed())
        .map(|i| Incident::new(s, i))
        .collect();
    let components = s
        .components
        .iter()
        .map(|m| {
            let history = s.history.get(&m.id).map_or(&[][..], Vec::as_slice);
            Component::new(
                &m.slug,
                &m.description,
                m.component_status,
                &uptime::uptime(m.created_at, m.component_status, history, s.now),
            )
        })
        .collect();
    let today = s.now.day();
    let past = (0..PAST_DAYS)
        .map(|back| {
            let day = Timestamp::start_of_day(today - back);
            PastDay {
                label: day.date_label(),
                iso: day.to_string()[..10].to_owned(),
                incidents: s
                    .incidents
                    .iter()
                    .filter(|i| i.status.is_closed() && i.created_at.day() == today - back)
                    .map(|i| Incident::new(s, i))
                    .collect(),
            }
        })
        .collect();
    let indicator = s.indicator();
    render(
        "page.html",
        &PageContext {
            common: Common::new(s),
            indicator: indicator.as_str(),
            indicator_text: indicator.description(),
            active,
            components,
            past,
        },
    )
}

/// `GET /incidents/{id}`.
pub(crate) fn incident(s: &Snapshot, i: &IncidentView) -> String {
    render(
        "incident.html",
        &IncidentContext {
            common: Common::new(s),
            incident: Incident::new(s, i),
        },
    )
}

/// A page that is not there (an unknown or malformed incident id), as a
/// page a browser shows, not as JSON.
pub(crate) fn not_found(s: &Snapshot, message: &str) -> String {
    render(
        "not_found.html",
        &NotFoundContext {
            common: Common::new(s),
            message,
        },
    )
}

static TEMPLATES: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    for (name, source) in [
        ("base.html", include_str!("templates/base.html")),
        ("macros.html", include_str!("templates/macros.html")),
        ("page.html", include_str!("templates/page.html")),
        ("incident.html", include_str!("templates/incident.html")),
        ("not_found.html", include_str!("templates/not_found.html")),
        ("feed_entry.html", include_str!("templates/feed_entry.html")),
    ] {
        // The templates are part of the binary; a syntax error in one is
        // caught by every status test.
        if let Err(e) = env.add_template(name, source) {
            tracing::error!(template = name, error = %e, "status page template does not parse");
        }
    }
    env
});

pub(super) fn render<C: Serialize>(name: &str, ctx: &C) -> String {
    match TEMPLATES.get_template(name).and_then(|t| t.render(ctx)) {
        Ok(html) => html,
        Err(e) => {
            tracing::error!(template = name, error = %e, "status page did not render");
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Status</title></head>\
             <body><p>The status page could not be drawn; the JSON at /api/v2/summary.json has the same data.</p></body></html>\n"
                .to_owned()
        }
    }
}

/// What every page's frame shows.
#[derive(Serialize)]
struct Common {
    name: String,
    url: String,
    updated: String,
    updated_iso: String,
}

impl Common {
    fn new(s: &Snapshot) -> Common {
        let at = s.updated_at();
        Common {
            name: s.name.clone(),
            url: s.url.clone(),
            updated: at.short(),
            updated_iso: at.to_string(),
        }
    }
}

#[derive(Serialize)]
struct PageContext {
    #[serde(flatten)]
    common: Common,
    indicator: &'static str,
    indicator_text: &'static str,
    active: Vec<Incident>,
    components: Vec<Component>,
    past: Vec<PastDay>,
}

#[derive(Serialize)]
struct IncidentContext {
    #[serde(flatten)]
    common: Common,
    incident: Incident,
}

#[derive(Serialize)]
struct NotFoundContext<'a> {
    #[serde(flatten)]
    common: Common,
    message: &'a str,
}

#[derive(Serialize)]
struct Incident {
    url: String,
    name: String,
    impact: &'static str,
    status_label: &'static str,
    /// Friendly names of the affected listed models.
    models: Vec<String>,
    updates: Vec<Update>,
    postmortem: Option<String>,
}

impl Incident {
    fn new(s: &Snapshot, i: &IncidentView) -> Incident {
        Incident {
            url: s.incident_url(i.id),
            name: i.name.clone(),
            impact: i.impact.as_str(),
            status_label: i.status.label(),
            models: i
                .components
                .iter()
                .map(|slug| friendly(slug, s.component(slug).map_or("", |(_, m)| &m.description)))
                .collect(),
            updates: i
                .updates
                .iter()
                .map(|u| Update {
                    status: u.status.label(),
                    body: u.body.clone(),
                    at: u.created_at.short(),
                    iso: u.created_at.to_string(),
                })
                .collect(),
            postmortem: i.postmortem_body.clone(),
        }
    }
}

#[derive(Serialize)]
struct Update {
    status: &'static str,
    body: String,
    at: String,
    iso: String,
}

#[derive(Serialize)]
struct Component {
    slug: String,
    name: String,
    status: &'static str,
    status_label: &'static str,
    uptime: String,
    bars: Vec<Bar>,
}

impl Component {
    fn new(slug: &ModelSlug, description: &str, status: ComponentStatus, u: &Uptime) -> Component {
        Component {
            slug: slug.as_str().to_owned(),
            name: friendly(slug, description),
            status: status.as_str(),
            status_label: status.label(),
            // Two decimals, never rounded up to 100 while anything was down.
            uptime: format!("{:.2}", (u.percent * 100.0).floor() / 100.0),
            bars: u
                .days
                .iter()
                .map(|d| Bar {
                    class: d.worst.map_or("no-data", ComponentStatus::as_str),
                    title: format!(
                        "{}: {}",
                        d.start.date_label(),
                        d.worst.map_or("No data", ComponentStatus::label)
                    ),
                })
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct Bar {
    class: &'static str,
    title: String,
}

#[derive(Serialize)]
struct PastDay {
    label: String,
    iso: String,
    incidents: Vec<Incident>,
}

/// A model's name for people: its description ("SmolLM2 135M Instruct
/// (Q4_1), Apache-2.0"), or the slug when it has none.
fn friendly(slug: &ModelSlug, description: &str) -> String {
    let name = description.trim();
    if name.is_empty() {
        slug.as_str().to_owned()
    } else {
        name.to_owned()
    }
}
