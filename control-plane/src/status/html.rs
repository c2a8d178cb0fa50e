//! The plain HTML status page and one page per incident. No scripts, no
//! external assets; every dynamic string is escaped.

use super::{Snapshot, escape};
use bulkhead_control_api::{ComponentStatus, IncidentView};
use std::fmt::Write;

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;color:#222}\
     .banner{padding:1rem;border-radius:6px;color:#fff;font-weight:600}\
     .none{background:#2e7d32}.minor{background:#f9a825}.major{background:#ef6c00}.critical{background:#c62828}\
     table{width:100%;border-collapse:collapse;margin:1rem 0}td{padding:.5rem;border-bottom:1px solid #ddd}\
     .st{text-align:right}.operational{color:#2e7d32}.degraded_performance,.under_maintenance{color:#f9a825}\
     .partial_outage{color:#ef6c00}.major_outage{color:#c62828}small{color:#666}";

/// `GET /`: overall status, components, open and recent incidents.
pub(crate) fn page(s: &Snapshot) -> String {
    let indicator = s.indicator();
    let mut h = head(&format!("{} Status", s.name));
    let _ = write!(
        h,
        "<h1>{} Status</h1><div class=\"banner {}\">{}</div>",
        escape(&s.name),
        indicator.as_str(),
        indicator.description()
    );
    h.push_str("<h2>Models</h2><table>");
    for m in &s.components {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"st {}\">{}</td></tr>",
            escape(m.slug.as_str()),
            m.component_status.as_str(),
            label(m.component_status)
        );
    }
    if s.components.is_empty() {
        h.push_str("<tr><td>No models listed.</td></tr>");
    }
    h.push_str("</table><h2>Incidents</h2>");
    if s.incidents.is_empty() {
        h.push_str("<p>No incidents reported.</p>");
    }
    for i in &s.incidents {
        let _ = write!(
            h,
            "<h3><a href=\"{}\">{}</a></h3>{}",
            escape(&s.incident_url(i.id)),
            escape(&i.name),
            timeline(i)
        );
    }
    let _ = writeln!(
        h,
        "<p><small>Feeds: <a href=\"{0}/history.atom\">Atom</a> · <a href=\"{0}/history.rss\">RSS</a> · \
         <a href=\"{0}/api/v2/summary.json\">JSON</a></small></p></body></html>",
        escape(&s.url)
    );
    h
}

/// `GET /incidents/{id}`.
pub(crate) fn incident(s: &Snapshot, i: &IncidentView) -> String {
    let mut h = head(&format!("{} - {} Status", i.name, s.name));
    let _ = write!(
        h,
        "<p><a href=\"{}/\">{} Status</a></p><h1>{}</h1><p>Impact: {}</p>{}",
        escape(&s.url),
        escape(&s.name),
        escape(&i.name),
        i.impact.as_str(),
        timeline(i)
    );
    if let Some(pm) = &i.postmortem_body {
        let _ = write!(h, "<h2>Postmortem</h2><p>{}</p>", escape(pm));
    }
    h.push_str("</body></html>\n");
    h
}

/// A page that is not there (an unknown or malformed incident id), as a
/// page a browser shows, not as JSON.
pub(crate) fn not_found(s: &Snapshot, what: &str) -> String {
    let mut h = head(&format!("Not found - {} Status", s.name));
    let _ = writeln!(
        h,
        "<h1>Page not found</h1><p>{}</p><p><a href=\"{}/\">Back to {} Status</a></p></body></html>",
        escape(what),
        escape(&s.url),
        escape(&s.name)
    );
    h
}

fn head(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{STYLE}</style></head><body>",
        escape(title)
    )
}

fn timeline(i: &IncidentView) -> String {
    let mut h = String::new();
    for u in &i.updates {
        let _ = write!(
            h,
            "<p><strong>{}</strong> - {}<br><small>{}</small></p>",
            u.status.label(),
            escape(&u.body),
            u.created_at.short()
        );
    }
    h
}

fn label(s: ComponentStatus) -> &'static str {
    s.label()
}
