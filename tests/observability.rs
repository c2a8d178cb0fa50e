//! Observability from the outside: a platform started by `bulkhead up`
//! exports over OTLP (http/protobuf) to a small collector in this test, its
//! logs are captured from `up`, and every component's `/metrics` is
//! scraped.
//!
//! - one request makes one trace across the gateway, the decode worker, the
//!   transfer protocol and the prefill worker; the gateway's routing polls
//!   join the control plane's spans;
//! - every metric the dashboards query is exposed after a workload;
//! - a canary sent in prompts never shows in spans, logs or metric labels.

mod support;

use bulkhead_test_support::Request;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MODEL: &str = "@cf/huggingfacetb/smollm2-135m-instruct";

// ---------------------------------------------------------------- collector

/// What the collector received: each OTLP request's path and raw body.
#[derive(Clone, Default)]
struct Received(support::sink::Received);

impl Received {
    fn bodies(&self, path: &str) -> Vec<Vec<u8>> {
        self.0
            .all()
            .into_iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b)
            .collect()
    }

    fn all_bytes(&self) -> Vec<Vec<u8>> {
        self.0.all().into_iter().map(|(_, b)| b).collect()
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Span> {
        let mut out = Vec::new();
        for body in self.bodies("/v1/traces") {
            let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP traces");
            for rs in req.resource_spans {
                let service = service_name(rs.resource.as_ref());
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        let mut attrs: Vec<(String, String)> = s
                            .attributes
                            .iter()
                            .map(|a| {
                                (
                                    a.key.clone(),
                                    a.value.as_ref().map(text).unwrap_or_default(),
                                )
                            })
                            .collect();
                        let ints = s
                            .attributes
                            .iter()
                            .filter(|a| {
                                matches!(
                                    a.value.as_ref().and_then(|v| v.value.as_ref()),
                                    Some(any_value::Value::IntValue(_))
                                )
                            })
                            .map(|a| a.key.clone())
                            .collect();
                        for e in &s.events {
                            attrs.push(("event".into(), e.name.clone()));
                            for a in &e.attributes {
                                attrs.push((
                                    a.key.clone(),
                                    a.value.as_ref().map(text).unwrap_or_default(),
                                ));
                            }
                        }
                        out.push(Span {
                            service: service.clone(),
                            name: s.name.clone(),
                            trace: hex(&s.trace_id),
                            id: hex(&s.span_id),
                            parent: hex(&s.parent_span_id),
                            attrs,
                            ints,
                            seconds: s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano)
                                as f64
                                / 1e9,
                        });
                    }
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attrs: Vec<(String, String)>,
    /// Keys of the span's attributes that arrived as integers.
    ints: Vec<String>,
    /// From its start to its end.
    seconds: f64,
}

/// The `service.name` of an OTLP resource.
fn service_name(r: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    r.and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
        .and_then(|a| a.value.as_ref())
        .map(text)
        .unwrap_or_default()
}

fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(b: &[u8]) -> String {
    hex::encode(b)
}

/// An OTLP/HTTP receiver: every export answered 200 with an empty (valid)
/// protobuf response.
fn collector() -> (String, Received) {
    let (url, received) =
        support::sink::start(axum::http::StatusCode::OK, "application/x-protobuf");
    (url, Received(received))
}

// ----------------------------------------------------------------- platform

struct Platform {
    child: Child,
    dir: PathBuf,
    creds: Value,
    /// Every line `up` printed: its own, and every component's, prefixed.
    log: Arc<Mutex<Vec<String>>>,
}

impl Platform {
    fn account(&self, i: usize) -> (String, String) {
        let a = &self.creds["accounts"][i];
        (
            a["id"].as_str().unwrap().to_owned(),
            a["token"].as_str().unwrap().to_owned(),
        )
    }

    fn gateway(&self) -> String {
        self.creds["gateway_url"].as_str().unwrap().to_owned()
    }

    fn metrics_urls(&self) -> Vec<(String, String)> {
        self.creds["metrics"]
            .as_object()
            .expect("credentials.json lists metrics URLs")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect()
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Stops `up` with SIGTERM and waits: every component flushes its
    /// exporters on the way out.
    fn stop(&mut self) {
        bulkhead_test_support::process::terminate(&mut self.child, Duration::from_secs(20));
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tests share two cores: one platform at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn platform(otlp: &str) -> Platform {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("bulkhead-obs-{}-{nanos:x}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args("up --port 0 --threads 1 --kv-budget-mib 16 --context-window 512".split(' '))
        // One model: the dashboards' metrics need its components only; no
        // prober: its traffic would mix with the traces this test follows.
        .args([
            "--max-output",
            "128",
            "--models",
            "q4_1",
            "--no-prober",
            // Its workload generates; it embeds nothing.
            "--no-embeddings",
            "--data-dir",
        ])
        .arg(&dir)
        // Short prompts cross the transfer, whose spans the traces follow.
        .env("BULKHEAD_LOCAL_PREFILL_TOKENS", "0")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        // Everything our crates and their dependencies log, debug included.
        .env("RUST_LOG", "debug")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("BULKHEAD_LOG_FORMAT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bulkhead up starts");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let l = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    let l = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    let mut p = Platform {
        child,
        dir,
        creds: Value::Null,
        log,
    };
    support::platform::until_summary(&rx);
    p.creds = serde_json::from_str(
        &std::fs::read_to_string(p.dir.join("credentials.json")).expect("credentials"),
    )
    .expect("JSON");
    p
}

/// One exchange: status, headers (lowercase names) and body.
fn http(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, HashMap<String, String>, String) {
    let mut req = Request::at(method, url, path)
        .json(body)
        .timeout(Duration::from_secs(180));
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let r = req.send().expect("HTTP response");
    let headers = r
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    (r.status, headers, r.body)
}

fn run(p: &Platform, body: &Value) -> (u16, HashMap<String, String>, String) {
    let (id, token) = p.account(0);
    http(
        &p.gateway(),
        "POST",
        &format!("/client/v4/accounts/{id}/ai/run/{MODEL}"),
        &[("Authorization", &format!("Bearer {token}"))],
        &body.to_string(),
    )
}

fn openai(p: &Platform, path: &str, body: &Value) -> (u16, HashMap<String, String>, String) {
    let (_, token) = p.account(0);
    http(
        &p.gateway(),
        "POST",
        path,
        &[("Authorization", &format!("Bearer {token}"))],
        &body.to_string(),
    )
}

fn scrape(url: &str) -> String {
    let rest = url.trim_start_matches("http://");
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let (status, _, body) = http(&format!("http://{addr}"), "GET", path, &[], "");
    assert_eq!(status, 200, "GET {url}");
    body
}

/// Metric names in a Prometheus text exposition, with their sample lines.
fn exposed(text: &str) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = l.split(['{', ' ']).next().unwrap_or("").to_owned();
        out.entry(name).or_default().push(l.to_owned());
    }
    out
}

/// The value of the first sample of `name` whose labels contain every
/// `label="value"` in `having`.
fn sample(m: &HashMap<String, Vec<String>>, name: &str, having: &[&str]) -> Option<f64> {
    m.get(name)?
        .iter()
        .find(|l| having.iter().all(|h| l.contains(h)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the trace `trace` holds every span of a request through
/// gateway, decode and prefill (they arrive in separate batches), and
/// returns its spans.
fn whole_trace(c: &Received, trace: &str) -> Vec<Span> {
    wait_for(
        "one trace across gateway, decode and prefill",
        Duration::from_secs(30),
        || {
            let spans: Vec<Span> = c.spans().into_iter().filter(|s| s.trace == trace).collect();
            let services: BTreeSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
            let names: BTreeSet<&str> = spans.iter().map(|s| s.name.as_str()).collect();
            (["bulkhead-gateway", "bulkhead-decode", "bulkhead-prefill"]
                .iter()
                .all(|s| services.contains(s))
                            && [
                "upstream.generate",
                "POST /v1/generate",
                "kv.transfer",
                "generate",
                "prefill",
                "prefill.compute",
                "kv.transfer.send",
            ]
            .iter()
            .all(|n| names.contains(n))
            // The gateway's server span ends last, after the answer.
            && names.iter().any(|n| n.starts_with("POST /client/v4/")))
            .then_some(spans)
        },
    )
}

// -------------------------------------------------------------------- tests

#[test]
fn one_request_is_one_trace_across_gateway_decode_transfer_and_prefill() {
    let _one = serial();
    let (otlp, c) = collector();
    let p = platform(&otlp);

    // A tenant's own trace context is not trusted at the edge.
    let foreign = "0af7651916cd43dd8448eb211c80319c";
    let (account, token) = p.account(0);
    let (status, headers, body) = http(
        &p.gateway(),
        "POST",
        &format!("/client/v4/accounts/{account}/ai/run/{MODEL}"),
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("traceparent", &format!("00-{foreign}-b7ad6b7169203331-01")),
        ],
        &json!({"prompt": "What is the capital of France?", "max_tokens": 6, "temperature": 0})
            .to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let id = headers.get("x-request-id").expect("x-request-id").clone();
    assert_eq!(id.len(), 32, "the request id is the trace id: {id}");
    assert_ne!(id, foreign, "the gateway starts its own trace");

    let spans = whole_trace(&c, &id);
    let one = |service: &str, name: &str| -> &Span {
        spans
            .iter()
            .find(|s| s.service == service && s.name == name)
            .unwrap_or_else(|| panic!("no {name} span from {service} in {spans:#?}"))
    };
    let edge = one(
        "bulkhead-gateway",
        "POST /client/v4/accounts/{account_id}/ai/run/{*model}",
    );
    assert_eq!(edge.parent, "", "the gateway starts the trace");
    let upstream = one("bulkhead-gateway", "upstream.generate");
    assert_eq!(upstream.parent, edge.id);
    let served = one("bulkhead-decode", "POST /v1/generate");
    assert_eq!(served.parent, upstream.id, "decode joins over HTTP");
    let transfer = one("bulkhead-decode", "kv.transfer");
    let prefill = one("bulkhead-prefill", "prefill");
    assert_eq!(
        prefill.parent, transfer.id,
        "prefill joins through the transfer protocol's traceparent"
    );
    let send = one("bulkhead-prefill", "kv.transfer.send");
    assert_eq!(send.parent, prefill.id);
    one("bulkhead-prefill", "prefill.compute");
    let generate = one("bulkhead-decode", "generate");
    assert!(
        generate
            .attrs
            .iter()
            .any(|(k, v)| k == "gen_ai.usage.output_tokens" && v == "6"),
        "{generate:?}"
    );
    assert!(
        transfer
            .attrs
            .iter()
            .any(|(k, v)| k == "bulkhead.transfer.outcome" && v == "committed"),
        "{transfer:?}"
    );
    for s in [edge, served] {
        assert!(
            s.attrs.iter().any(|(k, v)| k == "request_id" && v == &id),
            "{s:?}"
        );
    }

    // Counts reach the backend as numbers, not as their text.
    for (span, key) in [
        (edge, "http.response.status_code"),
        (upstream, "bulkhead.attempt"),
        (upstream, "bulkhead.routing.version"),
        (generate, "gen_ai.usage.output_tokens"),
        (generate, "gen_ai.usage.input_tokens"),
        (prefill, "bulkhead.transfer.prompt_tokens"),
    ] {
        assert!(
            span.ints.iter().any(|k| k == key),
            "{key} is not an integer: {span:?}"
        );
    }

    // A streamed answer's server span and duration end with its body, not
    // its head: the span covers what the client waited for.
    let (account, token) = p.account(0);
    let started = Instant::now();
    let body = json!({"prompt": "Tell me a story about a lighthouse.", "max_tokens": 48,
                      "temperature": 0, "stream": true})
    .to_string();
    let mut s = Request::at(
        "POST",
        &p.gateway(),
        &format!("/client/v4/accounts/{account}/ai/run/{MODEL}"),
    )
    .bearer(&token)
    .json(&body)
    .timeout(Duration::from_secs(180))
    .stream()
    .expect("an answer");
    let head = started.elapsed().as_secs_f64();
    let text = s.read_until(|_| false).expect("the whole stream");
    let total = started.elapsed().as_secs_f64();
    assert!(s.status == 200 && text.contains("data: [DONE]"), "{text}");
    let id = s
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("x-request-id")
        .to_owned();
    let streamed = wait_for(
        "the streamed request's server span",
        Duration::from_secs(30),
        || {
            c.spans().into_iter().find(|s| {
                s.trace == id
                    && s.service == "bulkhead-gateway"
                    && s.name.starts_with("POST /client/v4/")
            })
        },
    );
    eprintln!(
        "streamed: head after {head:.3} s, body ended after {total:.3} s; server span {:.3} s",
        streamed.seconds
    );
    assert!(
        total - head > 0.2,
        "the stream must outlast its head for this check to mean anything: head {head:.3} s, total {total:.3} s"
    );
    assert!(
        streamed.seconds > head + (total - head) / 2.0 && streamed.seconds <= total + 0.05,
        "the server span ended at {:.3} s; head {head:.3} s, body end {total:.3} s",
        streamed.seconds
    );

    // Routine polls are not traced. First make sure there were polls and
    // heartbeats to trace: the control plane's own metrics count them
    // (heartbeats come every few seconds, so wait for one).
    let (_, cp) = p
        .metrics_urls()
        .into_iter()
        .find(|(k, _)| k.contains("control"))
        .expect("the control plane's metrics");
    wait_for(
        "a routing poll and a heartbeat served",
        Duration::from_secs(60),
        || {
            let served = exposed(&scrape(&cp));
            ["/admin/v1/routing", "/admin/v1/nodes/{id}/heartbeat"]
                .iter()
                .all(|route| {
                    sample(
                        &served,
                        "http_server_request_duration_seconds_count",
                        &[&format!("http_route=\"{route}\"")],
                    )
                    .is_some_and(|n| n >= 1.0)
                })
                .then_some(())
        },
    );
    // Give the batch exporter (100 ms here) time to send anything traced.
    std::thread::sleep(Duration::from_millis(500));
    let polls: Vec<String> = c
        .spans()
        .into_iter()
        .filter(|s| {
            s.name == "routing.poll"
                || s.name == "GET /admin/v1/routing"
                || s.name.ends_with("/heartbeat")
                || s.name == "GET /health"
        })
        .map(|s| format!("{} {}", s.service, s.name))
        .collect();
    assert!(polls.is_empty(), "traced polls: {polls:?}");

    // Logs: the gateway's and the decode worker's lines carry the id the
    // client got.
    let log = p.log_text();
    for component in ["[gateway]", "[decode worker]"] {
        assert!(
            log.lines()
                .any(|l| l.starts_with(component) && l.contains(&format!("request_id=\"{id}\""))),
            "no {component} log line with request_id {id}"
        );
    }
}

/// Every metric name a dashboard query reads: identifiers in each `expr`
/// that are not functions, keywords, label names or template variables.
fn dashboard_metrics() -> BTreeSet<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards");
    let mut names = BTreeSet::new();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).expect("dashboards/") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let d: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        // File provisioning does not substitute `__inputs`: the data source
        // is a variable, on every panel and query.
        assert!(d.get("__inputs").is_none(), "{path:?} has __inputs");
        let vars = d["templating"]["list"].as_array().expect("templating");
        assert!(
            vars.iter().any(|v| v["name"] == "datasource"
                && v["type"] == "datasource"
                && v["query"] == "prometheus"),
            "{path:?}: no datasource variable"
        );
        assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
        let mut exprs = 0;
        for panel in d["panels"].as_array().expect("panels") {
            if panel["type"] == "row" {
                continue;
            }
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{path:?} {panel}"
            );
            for t in panel["targets"].as_array().expect("targets") {
                assert_eq!(t["datasource"]["uid"], "${datasource}");
                let e = t["expr"].as_str().expect("expr");
                exprs += 1;
                names.extend(metric_names(e));
            }
        }
        assert!(exprs > 5, "{path:?} has {exprs} queries");
    }
    assert!(files >= 3, "dashboards/ holds {files} dashboards");
    for y in [
        "provisioning/dashboards/bulkhead.yaml",
        "provisioning/datasources/prometheus.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{dir}/{y}")).expect(y);
        assert!(text.contains("apiVersion: 1"), "{y}");
    }
    names
}

fn metric_names(expr: &str) -> Vec<String> {
    const WORDS: [&str; 11] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
    ];
    // Drop label matchers, range selectors and strings first.
    let mut cleaned = String::new();
    let mut depth = (0, 0);
    for ch in expr.chars() {
        match ch {
            '{' => depth.0 += 1,
            '}' => depth.0 -= 1,
            '[' => depth.1 += 1,
            ']' => depth.1 -= 1,
            _ if depth == (0, 0) => cleaned.push(ch),
            _ => {}
        }
    }
    let chars: Vec<char> = cleaned.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut after_grouping = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let call = j < chars.len() && chars[j] == '(';
            if WORDS.contains(&word.as_str()) {
                after_grouping = matches!(word.as_str(), "by" | "without" | "on" | "ignoring");
                continue;
            }
            // Aggregations may put `by (...)` before their parentheses.
            const AGGREGATIONS: [&str; 12] = [
                "sum",
                "min",
                "max",
                "avg",
                "count",
                "stddev",
                "stdvar",
                "topk",
                "bottomk",
                "quantile",
                "count_values",
                "group",
            ];
            let call = call || AGGREGATIONS.contains(&word.as_str());
            if !call && !word.starts_with('$') && !after_grouping {
                out.push(word);
            }
        } else {
            if c == ')' {
                after_grouping = false;
            }
            i += 1;
        }
    }
    out
}

#[test]
fn the_dashboard_query_parser_finds_metric_names_only() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model=~\"$model\"}[$__rate_interval])))"
        ),
        vec!["gen_ai_server_time_to_first_token_seconds_bucket"]
    );
    assert_eq!(
        metric_names(
            "1 - sum by (node) (a_free{node=~\"$node\"}) / sum by (node) (b_total) or vector(0)"
        ),
        vec!["a_free", "b_total"]
    );
}

#[test]
fn every_metric_the_dashboards_query_is_exposed_by_a_component_after_a_workload() {
    let _one = serial();
    let wanted = dashboard_metrics();
    assert!(wanted.len() > 20, "{wanted:?}");
    let (otlp, c) = collector();
    let p = platform(&otlp);

    // Before any flip the control plane serves the flip histogram, empty,
    // and a scrape is never counted as a request in flight (the second
    // scrape would see the first, or itself).
    let cp = p.creds["metrics"]["control-plane"]
        .as_str()
        .unwrap()
        .to_owned();
    let _ = scrape(&cp);
    let m = exposed(&scrape(&cp));
    let flips = sample(
        &m,
        "bulkhead_control_plane_flip_propagation_seconds_count",
        &[],
    );
    assert_eq!(flips, Some(0.0), "the flip histogram before the first flip");
    let bucket = sample(
        &m,
        "bulkhead_control_plane_flip_propagation_seconds_bucket",
        &["le=\"+Inf\""],
    );
    assert_eq!(bucket, Some(0.0));
    // Only polls, heartbeats and scrapes reach it now (no prober), none of
    // them counted; the workers' registrations were, and have ended.
    let in_flight = m
        .get("http_server_active_requests")
        .expect("requests were counted");
    let busy: Vec<&String> = in_flight.iter().filter(|l| !l.ends_with(" 0")).collect();
    assert!(
        busy.is_empty(),
        "scrapes or polls counted in flight: {busy:?}"
    );

    // A workload that touches every path: plain and streamed answers in
    // both APIs, an over-long prompt refused at the worker's door, and a
    // responder's flip private and back. Each prompt is new past the
    // default system prompt by more than a decode worker finishes itself
    // (it would hold the system prompt's pages after the first), so each
    // takes a transfer.
    let more = "Then name three rivers and three mountains, one per line. ".repeat(4);
    let (s, _, b) = run(
        &p,
        &json!({"prompt": format!("Say hi. {more}"), "max_tokens": 4}),
    );
    assert_eq!(s, 200, "{b}");
    let (s, _, b) = run(
        &p,
        &json!({"prompt": format!("Count to ten. {more}"), "max_tokens": 8, "stream": true}),
    );
    assert_eq!(s, 200, "{b}");
    let (s, _, b) = openai(
        &p,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": format!("Hello. {more}")}], "max_tokens": 4}),
    );
    assert_eq!(s, 200, "{b}");
    let long = "word ".repeat(600);
    let (s, _, b) = run(&p, &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(s, 413, "{b}");
    let cp = p.creds["control_plane_url"].as_str().unwrap().to_owned();
    let op = format!("Bearer {}", p.creds["operator_token"].as_str().unwrap());
    for v in ["private", "public"] {
        let (s, _, b) = http(
            &cp,
            "POST",
            &format!(
                "/admin/v1/models/{}/visibility",
                MODEL.replace('@', "%40").replace('/', "%2F")
            ),
            &[("Authorization", &op)],
            &json!({"visibility": v, "reason": "observability test"}).to_string(),
        );
        assert_eq!(s, 200, "{b}");
    }

    let mut found: HashMap<String, Vec<String>> = HashMap::new();
    let mut per: HashMap<String, HashMap<String, Vec<String>>> = HashMap::new();
    // Observed instruments are read at scrape time; counters need the
    // workload's last request to have finished: scrape until the gateway
    // has all four generations.
    wait_for(
        "the workload in the gateway's metrics",
        Duration::from_secs(20),
        || {
            let m = exposed(&scrape(p.creds["metrics"]["gateway"].as_str().unwrap()));
            (sample(
                &m,
                "gen_ai_server_request_duration_seconds_count",
                &["error_type=\"context_length_exceeded\""],
            )
            .is_some()
                && m.get("gen_ai_server_time_to_first_token_seconds_count")
                    .is_some_and(|v| {
                        v.iter()
                            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                            .sum::<f64>()
                            >= 3.0
                    }))
            .then_some(())
        },
    );
    for (component, url) in p.metrics_urls() {
        let m = exposed(&scrape(&url));
        assert!(
            m.contains_key("http_server_request_duration_seconds_count") || component == "prefill",
            "{component} has no HTTP server metrics"
        );
        for (k, v) in &m {
            found
                .entry(k.clone())
                .or_default()
                .extend(v.iter().cloned());
        }
        per.insert(component, m);
    }
    assert_eq!(per.len(), 4, "{:?}", per.keys());
    let missing: Vec<&String> = wanted.iter().filter(|n| !found.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "dashboards query metrics nobody exposes: {missing:?}"
    );

    // The figures say what happened.
    let decode = &per["decode"];
    let gateway = &per["gateway"];
    assert!(sample(decode, "bulkhead_kv_transfers_completed_total", &[]).unwrap() >= 3.0);
    assert!(
        sample(
            decode,
            "bulkhead_kv_transfer_size_bytes_total",
            &["direction=\"received\""]
        )
        .unwrap()
            > 0.0
    );
    assert_eq!(
        sample(decode, "bulkhead_kv_owner_violations_total", &[]),
        Some(0.0)
    );
    assert_eq!(
        sample(decode, "bulkhead_kv_transfer_tag_mismatches_total", &[]),
        Some(0.0)
    );
    assert!(
        sample(
            decode,
            "bulkhead_admission_rejections_total",
            &["reason=\"context_window_exceeded\"", "role=\"decode\""]
        )
        .unwrap()
            >= 1.0,
        "the over-long prompt is counted at the decode worker's door"
    );
    assert!(
        sample(
            &per["prefill"],
            "bulkhead_kv_transfer_size_bytes_total",
            &["direction=\"sent\""]
        )
        .unwrap()
            > 0.0
    );
    assert!(
        sample(
            gateway,
            "gen_ai_client_token_usage_count",
            &["gen_ai_token_type=\"input\""]
        )
        .is_some()
    );
    assert!(
        sample(
            gateway,
            "gen_ai_client_token_usage_count",
            &["gen_ai_token_type=\"output\""]
        )
        .is_some()
    );
    assert!(
        gateway["http_server_request_duration_seconds_count"]
            .iter()
            .any(|l| l.contains("http_route=\"/client/v4/accounts/{account_id}/ai/run/{*model}\"")),
        "routes are templates, never raw paths"
    );
    assert!(
        !gateway["http_server_request_duration_seconds_count"]
            .iter()
            .any(|l| l.contains(MODEL))
    );
    // Metrics are never on the tenant port or the public status page.
    for public in [p.gateway(), cp] {
        let (s, _, _) = http(&public, "GET", "/metrics", &[], "");
        assert_eq!(s, 404, "{public}/metrics");
    }
    let cpm = &per["control-plane"];
    assert_eq!(
        sample(
            cpm,
            "bulkhead_control_plane_visibility_flips_total",
            &["visibility=\"private\""]
        ),
        Some(1.0)
    );
    let published = sample(cpm, "bulkhead_routing_version", &[]).unwrap();
    let applied = sample(
        gateway,
        "bulkhead_gateway_routing_version",
        &["gateway=\"up-"],
    )
    .unwrap();
    assert!(
        applied > 0.0 && applied <= published,
        "{applied} {published}"
    );

    // The same instruments leave over OTLP too.
    wait_for("metrics over OTLP", Duration::from_secs(20), || {
        let mut services = BTreeSet::new();
        for body in c.bodies("/v1/metrics") {
            let req = ExportMetricsServiceRequest::decode(body.as_slice()).expect("OTLP metrics");
            for rm in req.resource_metrics {
                let service = service_name(rm.resource.as_ref());
                if rm.scope_metrics.iter().any(|s| !s.metrics.is_empty()) {
                    services.insert(service);
                }
            }
        }
        (services.len() == 4).then_some(())
    });
}

#[test]
fn a_canary_in_prompts_never_reaches_spans_logs_or_metric_labels() {
    let _one = serial();
    let (otlp, c) = collector();
    let mut p = platform(&otlp);
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let canary = format!("Kanarie{}", hex(&b));

    // The canary in every place a tenant can put text.
    let said = format!("Repeat exactly: {canary}");
    let (s, h, body) = run(
        &p,
        &json!({"prompt": said, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(s, 200, "{body}");
    let last = h["x-request-id"].clone();
    let (s, _, body) = run(
        &p,
        &json!({"messages": [{"role": "system", "content": canary}, {"role": "user", "content": said}], "max_tokens": 8, "stream": true}),
    );
    assert_eq!(s, 200, "{body}");
    let (s, _, body) = openai(
        &p,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": said}], "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(s, 200, "{body}");
    let (s, _, body) = openai(
        &p,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": said, "max_tokens": 8}),
    );
    assert_eq!(s, 200, "{body}");
    // Refused ones: over the context window, and bodies whose error
    // messages could quote the canary back.
    let (s, _, body) = run(
        &p,
        &json!({"prompt": format!("{canary} ").repeat(200), "max_tokens": 4}),
    );
    assert_eq!(s, 413, "{body}");
    let (s, _, body) = openai(
        &p,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": format!("{canary} ").repeat(200)}], "max_tokens": 4}),
    );
    assert_eq!(s, 400, "{body}");
    let (s, _, body) = run(&p, &json!({"prompt": said, "max_tokens": canary}));
    assert_eq!(s, 400, "{body}");
    let (s, _, _) = openai(
        &p,
        "/v1/chat/completions",
        &json!({"model": canary, "messages": []}),
    );
    assert!(s >= 400);
    let (id, token) = p.account(0);
    let (s, _, _) = http(
        &p.gateway(),
        "POST",
        &format!("/client/v4/accounts/{id}/ai/run/{canary}"),
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("x-request-id", &canary),
            ("traceparent", &canary),
        ],
        &json!({"prompt": said}).to_string(),
    );
    assert!(s >= 400);

    // Everything exported for the first request has arrived; then every
    // component is stopped so the exporters flush the rest.
    whole_trace(&c, &last);
    let mut scraped = String::new();
    for (_, url) in p.metrics_urls() {
        scraped.push_str(&scrape(&url));
    }
    p.stop();

    // Non-vacuous: spans, metrics and logs of this traffic are all here.
    let spans = c.spans();
    assert!(spans.len() > 20, "{} spans", spans.len());
    assert!(!c.bodies("/v1/metrics").is_empty());
    assert!(scraped.contains("gen_ai_client_token_usage_count"));
    let log = p.log_text();
    assert!(log.contains(&last), "the logs were captured");
    assert!(
        log.lines().filter(|l| l.contains("DEBUG")).count() > 10,
        "debug logs were on"
    );

    let found = |haystack: &[u8]| {
        haystack
            .windows(canary.len())
            .any(|w| w == canary.as_bytes())
    };
    for (i, body) in c.all_bytes().iter().enumerate() {
        assert!(!found(body), "OTLP export #{i} carries the canary");
    }
    for s in &spans {
        assert!(!s.name.contains(&canary), "{s:?}");
        for (k, v) in &s.attrs {
            assert!(!k.contains(&canary) && !v.contains(&canary), "{s:?}");
        }
    }
    assert!(
        !scraped.contains(&canary),
        "a metric label carries the canary"
    );
    let leaked: Vec<&str> = log.lines().filter(|l| l.contains(&canary)).collect();
    assert!(leaked.is_empty(), "log lines carry the canary: {leaked:#?}");
}
