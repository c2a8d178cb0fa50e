//! The public status page and feeds, on SQLite and on PostgreSQL: an
//! incident's timeline in the Statuspage JSON, Atom and RSS in order; the
//! feeds are well-formed XML (parsed with roxmltree); the JSON carries
//! Statuspage v2's field names and enumerations.

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use bulkhead_test_support::json::{items, strings, three};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use support::{Harness, SLUG, SLUG_PATH};

const HIDDEN: &str = "@cf/secret/never-public";

async fn setup(h: &Harness) -> anyhow::Result<()> {
    for (slug, vis) in [(SLUG, "public"), (HIDDEN, "private")] {
        h.create_model(slug, vis).await?;
    }
    Ok(())
}

/// Opens an incident and walks it to resolved; returns its admin view.
async fn timeline(h: &Harness) -> anyhow::Result<Value> {
    let v = h
        .post(
            "/admin/v1/incidents",
            &h.responder,
            Some(json!({
                "name": "Wrong answers from <SmolLM2> & friends",
                "impact": "major",
                "body": "Some responses may contain \"other\" data; model made private.",
                "components": [
                    {"model": SLUG, "status": "major_outage"},
                    {"model": HIDDEN, "status": "partial_outage"}
                ]
            })),
            StatusCode::CREATED,
        )
        .await?;
    let id = v["id"].as_i64().unwrap_or_default();
    let path = format!("/admin/v1/incidents/{id}/updates");
    for (status, body) in [
        (
            "identified",
            "KV pool smaller than the context window on prefill-3.",
        ),
        ("monitoring", "Config v2 rolled out."),
    ] {
        h.post(
            &path,
            &h.responder,
            Some(json!({"status": status, "body": body})),
            StatusCode::OK,
        )
        .await?;
    }
    let body = json!({"status": "postmortem", "body": "x"});
    let (code, err) = h.attempt(&path, &h.responder, body).await;
    assert_eq!(
        (code, err["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let resolved = h.post(&path, &h.responder, Some(json!({"status": "resolved", "body": "Fixed.", "postmortem": "Two faults lined up."})), StatusCode::OK)
        .await?;
    // A closed incident takes no more updates.
    let body = json!({"status": "identified", "body": "x"});
    let (code, _) = h.attempt(&path, &h.responder, body).await;
    assert_eq!(code, StatusCode::CONFLICT);
    Ok(resolved)
}

const ORDER: [&str; 4] = ["resolved", "monitoring", "identified", "investigating"];
const LABELS: [&str; 4] = ["Resolved", "Monitoring", "Identified", "Investigating"];

backend_test!(
    an_incident_timeline_appears_in_the_json_atom_and_rss_feeds_in_order,
    |h| {
        setup(&h).await?;
        let view = timeline(&h).await?;
        assert_eq!(view["status"], "postmortem");
        assert!(view["resolved_at"].is_string() && view["monitoring_at"].is_string());

        // Every step is in the audit log, with the model status it changed.
        let subject = format!("incident/{}", view["id"]);
        let log = h
            .get(&format!("/admin/v1/audit?subject={subject}"), &h.responder)
            .await?;
        let steps: Vec<(&str, &str, &str)> = items(&log)
            .map(|e| three(e, ["action", "before", "after"]))
            .collect();
        assert_eq!(
            steps,
            [
                ("incident.resolve", "monitoring", "postmortem"),
                ("incident.update", "identified", "monitoring"),
                ("incident.update", "investigating", "identified"),
                ("incident.open", "", "investigating"),
            ],
            "{log}"
        );
        let path = format!("/admin/v1/audit?subject={SLUG_PATH}");
        let log = h.get(&path, &h.responder).await?;
        let changes: Vec<(&str, &str, &str)> = items(&log)
            .filter(|e| e["action"] == "model.component_status")
            .map(|e| three(e, ["reason", "before", "after"]))
            .collect();
        assert_eq!(
            changes,
            [
                (subject.as_str(), "major_outage", "operational"),
                (subject.as_str(), "operational", "major_outage"),
            ],
            "{log}"
        );

        // JSON: newest update first, statuses in order, component changes kept.
        let (s, v) = h.public("/api/v2/incidents.json").await;
        assert_eq!(s, StatusCode::OK);
        let inc = &v["incidents"][0];
        let statuses: Vec<&str> = strings(&inc["incident_updates"], "status");
        assert_eq!(statuses, ORDER);
        let times: Vec<&str> = strings(&inc["incident_updates"], "created_at");
        assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
        let first = &inc["incident_updates"][3];
        assert_eq!(first["affected_components"][0]["name"], SLUG);
        assert_eq!(first["affected_components"][0]["old_status"], "operational");
        assert_eq!(
            first["affected_components"][0]["new_status"],
            "major_outage"
        );
        let last = &inc["incident_updates"][0];
        assert_eq!(
            last["affected_components"][0]["new_status"], "operational",
            "resolving restores components"
        );
        assert_eq!(inc["postmortem_body"], "Two faults lined up.");
        assert_eq!(
            inc["shortlink"],
            format!("http://status.test:8788/incidents/{}", view["id"])
        );
        // The model that was never public appears nowhere on the public side,
        // not even through an incident about it alone.
        h.post(
            "/admin/v1/incidents",
            &h.responder,
            Some(json!({
                "name": format!("{HIDDEN} answers slowly"),
                "impact": "critical",
                "body": "Only the never-public model.",
                "components": [{"model": HIDDEN, "status": "major_outage"}]
            })),
            StatusCode::CREATED,
        )
        .await?;
        for path in [
            "/api/v2/summary.json",
            "/api/v2/status.json",
            "/api/v2/incidents.json",
            "/api/v2/incidents/unresolved.json",
            "/api/v2/components.json",
            "/history.atom",
            "/history.rss",
            "/",
        ] {
            let (_, _, body) = h.raw(Method::GET, path, None, None).await;
            assert!(
                !body.contains("never-public") && !body.contains("answers slowly"),
                "{path}: {body}"
            );
        }
        let (_, status) = h.public("/api/v2/status.json").await;
        assert_eq!(
            status["status"]["indicator"], "none",
            "a hidden incident does not move the page"
        );
        let (_, v) = h.public("/api/v2/incidents.json").await;
        assert_eq!(v["incidents"].as_array().map(Vec::len), Some(1), "{v}");

        // Atom: one entry; its HTML lists the same updates in the same order.
        let (s, ctype, atom) = h.raw(Method::GET, "/history.atom", None, None).await;
        assert_eq!(s, StatusCode::OK);
        assert!(ctype.starts_with("application/atom+xml"), "{ctype}");
        let doc = roxmltree::Document::parse(&atom)?;
        let ns = "http://www.w3.org/2005/Atom";
        let root = doc.root_element();
        assert!(root.has_tag_name((ns, "feed")));
        assert_eq!(
            child_text(root, ns, "title"),
            Some("Bulkhead Status - Incident History")
        );
        assert_eq!(
            child_text(root, ns, "id"),
            Some("tag:status.test,2005:/history")
        );
        let entries: Vec<_> = root
            .children()
            .filter(|n| n.has_tag_name((ns, "entry")))
            .collect();
        assert_eq!(entries.len(), 1);
        let e = entries[0];
        assert_eq!(
            child_text(e, ns, "title"),
            Some("Wrong answers from <SmolLM2> & friends")
        );
        assert_eq!(
            child_text(e, ns, "id").map(|s| s.ends_with(&format!("Incident/{}", view["id"]))),
            Some(true)
        );
        let content = e
            .children()
            .find(|n| n.has_tag_name((ns, "content")))
            .ok_or_else(|| anyhow::anyhow!("no content"))?;
        assert_eq!(content.attribute("type"), Some("html"));
        assert_in_order(content.text().unwrap_or(""), &LABELS)?;
        assert!(
            content
                .text()
                .unwrap_or("")
                .contains("&quot;other&quot; data"),
            "body HTML-escaped inside the feed"
        );
        assert!(!atom.contains("never-public"));
        // The postmortem is in the feed, before the updates.
        assert!(
            content
                .text()
                .unwrap_or("")
                .starts_with("<p><strong>Postmortem</strong> - Two faults lined up.</p>"),
            "{atom}"
        );

        // RSS: same.
        let (s, ctype, rss) = h.raw(Method::GET, "/history.rss", None, None).await;
        assert_eq!(s, StatusCode::OK);
        assert!(ctype.starts_with("application/rss+xml"), "{ctype}");
        let doc = roxmltree::Document::parse(&rss)?;
        let rss_el = doc.root_element();
        assert!(rss_el.has_tag_name("rss") && rss_el.attribute("version") == Some("2.0"));
        let channel = rss_el
            .children()
            .find(|n| n.has_tag_name("channel"))
            .ok_or_else(|| anyhow::anyhow!("no channel"))?;
        assert_eq!(child_text(channel, "", "description"), Some("Statuspage"));
        // The channel names itself, as feed validators ask.
        let own = channel
            .children()
            .find(|n| n.has_tag_name((ns, "link")))
            .ok_or_else(|| anyhow::anyhow!("no atom:link in {rss}"))?;
        assert_eq!(own.attribute("rel"), Some("self"));
        assert_eq!(own.attribute("type"), Some("application/rss+xml"));
        assert_eq!(
            own.attribute("href"),
            Some("http://status.test:8788/history.rss")
        );
        let items: Vec<_> = channel
            .children()
            .filter(|n| n.has_tag_name("item"))
            .collect();
        assert_eq!(items.len(), 1);
        assert_in_order(
            child_text(items[0], "", "description").unwrap_or(""),
            &LABELS,
        )?;
        let pub_date = child_text(items[0], "", "pubDate").unwrap_or("");
        assert!(
            pub_date.ends_with(" +0000") && pub_date.as_bytes().get(3) == Some(&b','),
            "RFC 822: {pub_date}"
        );
        assert!(!rss.contains("never-public"));

        // The HTML page shows it too, escaped.
        let (s, ctype, html) = h.raw(Method::GET, "/", None, None).await;
        assert_eq!(s, StatusCode::OK);
        assert!(ctype.starts_with("text/html"));
        assert!(html.contains("Wrong answers from &lt;SmolLM2&gt; &amp; friends"));
        assert!(!html.contains("<SmolLM2>") && !html.contains("never-public"));
        let id = view["id"].as_i64().unwrap_or_default();
        let (s, _, page) = h
            .raw(Method::GET, &format!("/incidents/{id}"), None, None)
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_in_order(&page, &LABELS)?;
        assert!(page.contains("Two faults lined up."));
        // A page that is not there is a page, not JSON.
        for missing in ["/incidents/999999", "/incidents/abc", "/incidents/-1"] {
            let (s, ctype, page) = h.raw(Method::GET, missing, None, None).await;
            assert_eq!(s, StatusCode::NOT_FOUND, "{missing}");
            assert!(ctype.starts_with("text/html"), "{missing}: {ctype}");
            assert!(
                page.starts_with("<!DOCTYPE html>") && page.contains("Page not found"),
                "{missing}: {page}"
            );
        }
        Ok(())
    }
);

backend_test!(
    open_incidents_and_components_drive_summary_status_and_unresolved,
    |h| {
        setup(&h).await?;
        let (_, v) = h.public("/api/v2/status.json").await;
        assert_eq!(
            v["status"],
            json!({"indicator": "none", "description": "All Systems Operational"})
        );
        let opened = h.post("/admin/v1/incidents", &h.responder, Some(json!({"name": "Degraded", "impact": "minor", "body": "Slow.", "components": [{"model": SLUG, "status": "partial_outage"}]})), StatusCode::CREATED)
        .await?;
        let (_, v) = h.public("/api/v2/summary.json").await;
        assert_eq!(
            v["status"]["indicator"], "major",
            "partial_outage rolls up to major: {v}"
        );
        assert_eq!(v["status"]["description"], "Partial System Outage");
        assert_eq!(v["components"][0]["status"], "partial_outage");
        assert_eq!(v["incidents"].as_array().map(Vec::len), Some(1));
        let (_, v) = h.public("/api/v2/incidents/unresolved.json").await;
        assert_eq!(v["incidents"].as_array().map(Vec::len), Some(1));

        let id = opened["id"].as_i64().unwrap_or_default();
        h.post(
            &format!("/admin/v1/incidents/{id}/updates"),
            &h.responder,
            Some(json!({"status": "resolved", "body": "Done."})),
            StatusCode::OK,
        )
        .await?;
        let (_, v) = h.public("/api/v2/summary.json").await;
        assert_eq!(v["status"]["indicator"], "none");
        assert_eq!(v["components"][0]["status"], "operational");
        assert_eq!(v["incidents"], json!([]));
        let (_, v) = h.public("/api/v2/incidents/unresolved.json").await;
        assert_eq!(v["incidents"], json!([]));
        let (_, v) = h.public("/api/v2/incidents.json").await;
        assert_eq!(v["incidents"][0]["status"], "resolved");

        // A postmortem can follow days later, once.
        let pm = json!({"status": "resolved", "body": "Postmortem published.", "postmortem": "What happened."});
        let path = format!("/admin/v1/incidents/{id}/updates");
        let v = h
            .post(&path, &h.responder, Some(pm.clone()), StatusCode::OK)
            .await?;
        assert_eq!(
            (v["status"].as_str(), v["postmortem_body"].as_str()),
            (Some("postmortem"), Some("What happened."))
        );
        let (code, _) = h.attempt(&path, &h.responder, pm).await;
        assert_eq!(code, StatusCode::CONFLICT);

        // Resolving one incident leaves a model another open incident still names.
        let mut ids = Vec::new();
        for name in ["First", "Second"] {
            let v = h.post("/admin/v1/incidents", &h.responder, Some(json!({"name": name, "impact": "major", "body": "b", "components": [{"model": SLUG, "status": "major_outage"}]})), StatusCode::CREATED)
            .await?;
            ids.push(v["id"].as_i64().unwrap_or_default());
        }
        let resolve = json!({"status": "resolved", "body": "one down"});
        h.post(
            &format!("/admin/v1/incidents/{}/updates", ids[0]),
            &h.responder,
            Some(resolve.clone()),
            StatusCode::OK,
        )
        .await?;
        let (_, v) = h.public("/api/v2/components.json").await;
        assert_eq!(v["components"][0]["status"], "major_outage");
        h.post(
            &format!("/admin/v1/incidents/{}/updates", ids[1]),
            &h.responder,
            Some(resolve),
            StatusCode::OK,
        )
        .await?;
        let (_, v) = h.public("/api/v2/components.json").await;
        assert_eq!(v["components"][0]["status"], "operational");

        // A model flipped private stays listed (the public is told about it);
        // one that was never public is never listed.
        h.flip("private", "drill").await?;
        let (_, v) = h.public("/api/v2/components.json").await;
        let names: Vec<&str> = strings(&v["components"], "name");
        assert_eq!(names, vec![SLUG]);
        // Public routes write nothing.
        let (s, _) = h
            .call(
                Method::POST,
                "/api/v2/incidents.json",
                None,
                Some(json!({})),
            )
            .await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        Ok(())
    }
);

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

fn set(names: &[&'static str]) -> BTreeSet<&'static str> {
    names.iter().copied().collect()
}

backend_test!(
    the_json_carries_statuspage_v2_field_names_and_enumerations,
    |h| {
        setup(&h).await?;
        timeline(&h).await?;
        h.post("/admin/v1/incidents", &h.responder, Some(json!({"name": "Open one", "impact": "critical", "status": "identified", "body": "b", "components": [{"model": SLUG, "status": "major_outage"}]})), StatusCode::CREATED)
    .await?;
        let page = set(&["id", "name", "url", "time_zone", "updated_at"]);
        let component = set(&[
            "id",
            "name",
            "status",
            "created_at",
            "updated_at",
            "position",
            "description",
            "showcase",
            "start_date",
            "group_id",
            "page_id",
            "group",
            "only_show_if_degraded",
        ]);
        let incident = set(&[
            "id",
            "name",
            "status",
            "created_at",
            "updated_at",
            "monitoring_at",
            "resolved_at",
            "impact",
            "shortlink",
            "started_at",
            "page_id",
            "incident_updates",
            "components",
            "reminder_intervals",
            "postmortem_body",
            "postmortem_published_at",
        ]);
        let update = set(&[
            "id",
            "status",
            "body",
            "incident_id",
            "created_at",
            "updated_at",
            "display_at",
            "affected_components",
            "deliver_notifications",
            "custom_tweet",
            "tweet_id",
        ]);
        let affected = set(&["code", "name", "old_status", "new_status"]);

        let (_, summary) = h.public("/api/v2/summary.json").await;
        assert_eq!(
            keys(&summary),
            set(&[
                "page",
                "components",
                "incidents",
                "scheduled_maintenances",
                "status"
            ])
        );
        assert_eq!(keys(&summary["page"]), page);
        assert_eq!(summary["page"]["time_zone"], "Etc/UTC");
        assert_eq!(keys(&summary["status"]), set(&["indicator", "description"]));
        assert_eq!(summary["status"]["indicator"], "critical");
        assert_eq!(summary["status"]["description"], "Major Service Outage");
        let (_, status) = h.public("/api/v2/status.json").await;
        assert_eq!(keys(&status), set(&["page", "status"]));
        let (_, comps) = h.public("/api/v2/components.json").await;
        assert_eq!(keys(&comps), set(&["page", "components"]));
        for c in items(&comps["components"]) {
            assert_eq!(keys(c), component);
            assert!(
                [
                    "operational",
                    "degraded_performance",
                    "partial_outage",
                    "major_outage",
                    "under_maintenance"
                ]
                .contains(&c["status"].as_str().unwrap_or(""))
            );
        }
        let (_, all) = h.public("/api/v2/incidents.json").await;
        assert_eq!(keys(&all), set(&["page", "incidents"]));
        let incidents = all["incidents"].as_array().cloned().unwrap_or_default();
        assert_eq!(incidents.len(), 2);
        assert_eq!(incidents[0]["name"], "Open one", "newest first");
        for i in &incidents {
            assert_eq!(keys(i), incident);
            assert!(
                [
                    "investigating",
                    "identified",
                    "monitoring",
                    "resolved",
                    "postmortem"
                ]
                .contains(&i["status"].as_str().unwrap_or(""))
            );
            assert!(
                ["none", "minor", "major", "critical"]
                    .contains(&i["impact"].as_str().unwrap_or(""))
            );
            for c in items(&i["components"]) {
                assert_eq!(keys(c), component);
            }
            for u in items(&i["incident_updates"]) {
                assert_eq!(keys(u), update);
                assert_eq!(u["incident_id"], i["id"]);
                for a in items(&u["affected_components"]) {
                    assert_eq!(keys(a), affected);
                }
            }
        }
        let (_, unresolved) = h.public("/api/v2/incidents/unresolved.json").await;
        assert_eq!(unresolved["incidents"].as_array().map(Vec::len), Some(1));
        for path in [
            "/api/v2/scheduled-maintenances.json",
            "/api/v2/scheduled-maintenances/upcoming.json",
            "/api/v2/scheduled-maintenances/active.json",
        ] {
            let (s, v) = h.public(path).await;
            assert_eq!(s, StatusCode::OK);
            assert_eq!(keys(&v), set(&["page", "scheduled_maintenances"]));
        }
        Ok(())
    }
);

backend_test!(feeds_stay_well_formed_xml_whatever_responders_type, |h| {
    setup(&h).await?;
    let nasty = "]]> <![CDATA[ </content> &amp; &#0; \u{1} \u{7f} \u{fffe} 'quotes' \"double\" <script>alert(1)</script> é 漢字 🚨";
    h.post(
        "/admin/v1/incidents",
        &h.responder,
        Some(json!({"name": nasty, "impact": "minor", "body": nasty})),
        StatusCode::CREATED,
    )
    .await?;
    for (path, html_element) in [
        ("/history.atom", "content"),
        ("/history.rss", "description"),
    ] {
        let (_, _, xml) = h.raw(Method::GET, path, None, None).await;
        let doc =
            roxmltree::Document::parse(&xml).map_err(|e| anyhow::anyhow!("{path}: {e}\n{xml}"))?;
        // The title is text: it reads back exactly (minus what XML cannot carry).
        let title = doc
            .descendants()
            .filter(|n| n.tag_name().name() == "title")
            .filter_map(|n| n.text())
            .find(|t| t.contains("alert(1)"))
            .ok_or_else(|| anyhow::anyhow!("{path}: no incident title"))?;
        assert!(
            title.contains("<script>alert(1)</script>") && title.contains("漢字 🚨"),
            "{title}"
        );
        // The entry's HTML is escaped HTML: decoded once it is markup in
        // which the responder's text is still escaped, never a live tag.
        let html = doc
            .descendants()
            .filter(|n| n.tag_name().name() == html_element)
            .filter_map(|n| n.text())
            .find(|t| t.contains("alert(1)"))
            .ok_or_else(|| anyhow::anyhow!("{path}: no entry HTML"))?;
        assert!(html.contains("<strong>Investigating</strong>"), "{html}");
        assert!(
            !html.contains("<script>") && html.contains("&lt;script&gt;alert(1)&lt;"),
            "{html}"
        );
    }
    let (_, _, html) = h.raw(Method::GET, "/", None, None).await;
    assert!(
        !html.contains("<script>"),
        "HTML page escapes responder text"
    );
    Ok(())
});

fn child_text<'a>(node: roxmltree::Node<'a, 'a>, ns: &str, name: &str) -> Option<&'a str> {
    node.children()
        .find(|n| {
            if ns.is_empty() {
                n.has_tag_name(name)
            } else {
                n.has_tag_name((ns, name))
            }
        })
        .and_then(|n| n.text())
}

fn assert_in_order(haystack: &str, needles: &[&str]) -> anyhow::Result<()> {
    let mut at = 0;
    for n in needles {
        let strong = format!("<strong>{n}</strong>");
        let found = haystack[at..]
            .find(&strong)
            .ok_or_else(|| anyhow::anyhow!("{strong} not found after byte {at} in {haystack}"))?;
        at += found + strong.len();
    }
    Ok(())
}
