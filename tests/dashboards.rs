//! A lint of `dashboards/`: what an operator loading them into Grafana
//! expects. Every panel says what it shows; every dashboard has the data
//! source, `job` and `instance` variables and scopes its queries by them;
//! queries are well bracketed and name only the data source variable; the
//! long-poll is out of latency panels; where no data means zero, the query
//! says zero; the data source works out of the box with the shipped compose
//! file; every query parses as PromQL by `promtool`. (Which metric names
//! exist is checked against a running platform in `tests/observability.rs`.)

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards")
}

fn dashboards() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir()).expect("dashboards/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).expect("readable");
            let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            out.push((path.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 3, "{} dashboards", out.len());
    out
}

/// Whether `(`/`)`, `{`/`}` and `[`/`]` nest properly outside strings.
fn balanced(expr: &str) -> bool {
    let mut stack = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in expr.chars() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '{' | '[' => stack.push(c),
            ')' | '}' | ']' => {
                let open = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                if stack.pop() != Some(open) {
                    return false;
                }
            }
            _ => {}
        }
    }
    stack.is_empty() && !quoted
}

/// Panels whose queries compare two components, so a job filter would
/// hide one side.
const CROSS_JOB: [&str; 2] = [
    "Routing-table version: published and applied per gateway",
    "Gateways behind the published version",
];

#[test]
fn the_bracket_check_finds_unbalanced_queries() {
    assert!(balanced(r#"sum by (a) (rate(m{x=~"(a|b"}[5m]))"#));
    assert!(!balanced("sum(rate(m[5m])"));
    assert!(!balanced("rate(m{x=\"y\")}"));
}

#[test]
fn every_dashboard_panel_is_described_scoped_and_well_formed() {
    for (name, d) in dashboards() {
        assert!(d.get("__inputs").is_none(), "{name}: __inputs");
        assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "{name}");
        assert!(
            d["description"].as_str().is_some_and(|t| !t.is_empty()),
            "{name}: no description"
        );
        let vars: Vec<&Value> = d["templating"]["list"]
            .as_array()
            .expect("templating")
            .iter()
            .collect();
        let var_names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        for wanted in ["datasource", "job", "instance"] {
            assert!(var_names.contains(&wanted), "{name}: no {wanted} variable");
        }
        for v in &vars {
            if v["type"] == "query" {
                assert_eq!(v["datasource"]["uid"], "${datasource}", "{name}: {v}");
                let q = v["query"]["query"].as_str().expect("a query");
                assert!(balanced(q), "{name}: {q}");
            }
        }
        let mut ids = BTreeSet::new();
        for p in d["panels"].as_array().expect("panels") {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(
                ids.insert(p["id"].as_i64().expect("id")),
                "{name}: duplicate id {title}"
            );
            assert!(
                p["gridPos"]["w"].as_i64().is_some(),
                "{name}: {title} has no place"
            );
            if p["type"] == "row" {
                continue;
            }
            assert!(
                p["description"].as_str().is_some_and(|t| t.len() > 20),
                "{name}: panel {title:?} has no description"
            );
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {title}");
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}: {title} has no query");
            let mut refs = BTreeSet::new();
            for t in targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}: {title}");
                assert!(
                    refs.insert(t["refId"].as_str().expect("refId")),
                    "{name}: {title}"
                );
                let e = t["expr"].as_str().expect("expr");
                assert!(balanced(e), "{name}: {title}: {e}");
                if !CROSS_JOB.contains(&title) {
                    assert!(
                        e.contains(r#"job=~"$job",instance=~"$instance""#),
                        "{name}: {title} is not scoped by job and instance: {e}"
                    );
                }
                // Latency excludes the routing long-poll, which waits by design.
                if e.contains("http_server_request_duration_seconds_bucket") {
                    assert!(
                        e.contains(r#"http_route!="/admin/v1/routing""#),
                        "{name}: {e}"
                    );
                }
                // A count of failures, refusals or guard events with no data
                // is zero, and must read as zero.
                let counts_failures = [
                    "violations",
                    "mismatches",
                    "dropped",
                    "rejections",
                    "refusals",
                    "failed",
                ]
                .iter()
                .any(|w| e.contains(w))
                    || e.contains(r#"=~"5.."#)
                    || e.contains(r#"=~"4.."#)
                    || e.contains(r#"error_type!="""#);
                if counts_failures {
                    assert!(e.ends_with(" or vector(0)"), "{name}: {title}: {e}");
                }
            }
        }
    }
}

#[test]
fn the_data_source_works_with_the_shipped_compose_file() {
    let ds = std::fs::read_to_string(dir().join("provisioning/datasources/prometheus.yaml"))
        .expect("data source");
    assert!(
        ds.contains("url: http://localhost:9090") && ds.contains("uid: prometheus"),
        "{ds}"
    );
    let compose = std::fs::read_to_string(dir().join("compose.yaml")).expect("compose.yaml");
    for needed in [
        "prometheus:",
        "grafana:",
        "network_mode: host",
        "./prometheus.yml:/etc/prometheus/prometheus.yml",
        "./provisioning/datasources:/etc/grafana/provisioning/datasources",
        "./provisioning/dashboards:/etc/grafana/provisioning/dashboards",
        "/var/lib/grafana/dashboards/bulkhead",
    ] {
        assert!(compose.contains(needed), "compose.yaml lacks {needed}");
    }
    // The dashboards provider reads where compose mounts them.
    let provider = std::fs::read_to_string(dir().join("provisioning/dashboards/bulkhead.yaml"))
        .expect("provider");
    assert!(
        provider.contains("path: /var/lib/grafana/dashboards/bulkhead"),
        "{provider}"
    );
}

/// Every query of every panel, as Grafana sends it.
fn queries() -> Vec<(String, String)> {
    fn walk(v: &Value, name: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(o) => {
                for t in o
                    .get("targets")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(e) = t["expr"].as_str() {
                        out.push((name.to_owned(), e.to_owned()));
                    }
                }
                o.values().for_each(|c| walk(c, name, out));
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, name, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (name, v) in dashboards() {
        walk(&v, &name, &mut out);
    }
    out
}

/// Every query parses as PromQL, by Prometheus's own parser: `promtool
/// check rules` over one recording rule per query, Grafana's variables
/// replaced as Grafana would (`$__rate_interval` by a range, the other
/// variables by the regex "everything").
#[test]
fn every_query_is_promql_that_promtool_accepts() {
    let Ok(version) = std::process::Command::new("promtool")
        .arg("--version")
        .output()
    else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool (Debian's prometheus package) is missing: in CI this test must run"
        );
        eprintln!("skipping: no promtool");
        return;
    };
    assert!(version.status.success());
    let queries = queries();
    assert!(queries.len() > 20, "{} queries", queries.len());
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, e))| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": grafana_substituted(e)}))
        .collect();
    // JSON is YAML: promtool reads it as a rules file.
    let file = std::env::temp_dir().join(format!(
        "bulkhead-dashboard-rules-{}.json",
        std::process::id()
    ));
    let doc = serde_json::json!({"groups": [{"name": "dashboards", "rules": rules}]});
    std::fs::write(&file, doc.to_string()).expect("rules file");
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool runs");
    let _ = std::fs::remove_file(&file);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool refused a query:\n{said}");
    assert!(
        said.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{said}"
    );
}

/// `expr` with Grafana's variables replaced: `$__rate_interval` and
/// `$__interval` by ranges, any other `$name` or `${name}` by `.*` (they
/// stand only in regex label matchers).
fn grafana_substituted(expr: &str) -> String {
    let e = expr
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m");
    let mut out = String::with_capacity(e.len());
    let mut chars = e.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        while chars
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
        {
            chars.next();
        }
        if braced {
            chars.next();
        }
        out.push_str(".*");
    }
    out
}

#[test]
fn grafana_variables_become_a_range_or_a_regex() {
    assert_eq!(
        grafana_substituted(r#"rate(x{job=~"$job",m=~"${model}"}[$__rate_interval])"#),
        r#"rate(x{job=~".*",m=~".*"}[5m])"#
    );
}
