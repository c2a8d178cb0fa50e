//! The control plane as operators run it: `bulkhead control-plane` as a
//! process over real sockets, the responder commands against it, and real
//! workers registering the KV pool they measured.

mod support;

use bulkhead_test_support::json::{items, three};
use bulkhead_trust::Role as CertRole;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use support::{Present, Request, Worker};

const SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";
const SLUG_PATH: &str = "%40cf%2Fhuggingfacetb%2Fsmollm2-135m-instruct";

fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("bulkhead-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn bulkhead(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bulkhead"));
    cmd.args(args)
        .env_remove("BULKHEAD_CONTROL_PLANE_URL")
        .env_remove("BULKHEAD_TOKEN")
        .env_remove("BULKHEAD_NODE_TOKEN")
        .env_remove("DATABASE_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("bulkhead runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn token(dir: &Path, name: &str, role: &str) -> String {
    let d = dir.to_str().expect("utf-8 path");
    ok(&bulkhead(
        &[
            "control-plane",
            "token",
            "create",
            "--name",
            name,
            "--role",
            role,
            "--data-dir",
            d,
        ],
        &[],
    ))
    .trim()
    .to_owned()
}

fn control_plane(dir: &Path) -> Worker {
    let d = dir.to_str().expect("utf-8 path");
    support::control_plane(d, &["--node-ttl-secs", "30", "--heartbeat-secs", "1"])
}

/// One call with a bearer token; status and JSON body (the text as a
/// JSON string when it is not JSON).
fn call(addr: &str, method: &str, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
    let body = body.map(Value::to_string).unwrap_or_default();
    let r = Request::at(method, addr, path)
        .bearer(token)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .expect("HTTP response");
    (
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::String(r.body)),
    )
}

fn config(context_window: u64, max_output: u64, sha: &str) -> Value {
    json!({
        "context_window": context_window,
        "max_output": max_output,
        "weights_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "weights_sha256": sha,
        "quantization": "q4_1",
        "page_size": 16,
        "kv_budget": {"prefill_bytes": 64u64 << 20, "decode_bytes": 64u64 << 20}
    })
}

#[test]
fn responder_commands_flip_visibility_run_incidents_and_read_the_audit_log() {
    let dir = temp_dir("responder");
    let admin = token(&dir, "ada", "admin");
    let responder = token(&dir, "rita", "responder");
    assert!(responder.starts_with("bho_") && responder != admin);
    let cp = control_plane(&dir);
    let addr = cp.addr("http");
    let url = format!("http://{addr}");
    let (s, v) = call(
        &addr,
        "POST",
        "/admin/v1/models",
        &admin,
        Some(&json!({"slug": SLUG, "task": "Text Generation", "visibility": "public"})),
    );
    assert_eq!(s, 201, "{v}");
    let d = dir.to_str().expect("utf-8 path");

    // Without credentials the commands say where they looked.
    let out = bulkhead(&["model", "list", "--data-dir", d], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("BULKHEAD_CONTROL_PLANE_URL") && err.contains("credentials.json"),
        "{err}"
    );

    // From the environment.
    let env = [
        ("BULKHEAD_CONTROL_PLANE_URL", url.as_str()),
        ("BULKHEAD_TOKEN", responder.as_str()),
    ];
    let list = ok(&bulkhead(&["model", "list"], &env));
    assert!(list.contains(SLUG) && list.contains("public"), "{list}");
    let flip = ok(&bulkhead(
        &["model", "private", SLUG, "--reason", "INC-1 canary seen"],
        &env,
    ));
    assert!(
        flip.contains("is now private (was public)") && flip.contains("rita"),
        "{flip}"
    );
    // No gateway runs here: the flip says so (and succeeds).
    assert!(flip.contains("no gateway is running"), "{flip}");
    // A typo gets the nearest registered slug.
    let typo = SLUG.replacen("instruct", "instrct", 1);
    assert_ne!(typo, SLUG);
    let out = bulkhead(&["model", "public", &typo, "--reason", "x"], &env);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no model {typo} is registered; did you mean {SLUG}?"
        )),
        "{err}"
    );
    // So does an audit query about a model nobody registered.
    let out = bulkhead(&["audit", "--subject", &typo], &env);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean"), "{err}");
    let out = bulkhead(&["audit", "--subject", "@cf/nobody/nothing-at-all"], &env);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no model @cf/nobody/nothing-at-all is registered (`bulkhead model list`"),
        "{err}"
    );
    let again = ok(&bulkhead(
        &["model", "private", SLUG, "--reason", "again"],
        &env,
    ));
    assert!(again.contains("already private"), "{again}");

    // From credentials.json in --data-dir, as `bulkhead up` writes it.
    std::fs::write(
        dir.join("credentials.json"),
        json!({"control_plane_url": url, "operator_token": responder, "gateway_url": "http://127.0.0.1:8787"}).to_string(),
    )
    .expect("write credentials");
    let opened: Value = serde_json::from_str(&ok(&bulkhead(
        &[
            "incident",
            "open",
            "--name",
            "Cross-tenant output",
            "--impact",
            "critical",
            "--body",
            "Model made private while we investigate.",
            "--component",
            &format!("{SLUG}=major_outage"),
            "--json",
            "--data-dir",
            d,
        ],
        &[],
    )))
    .expect("incident JSON");
    let id = opened["id"].as_i64().expect("incident id").to_string();
    assert_eq!(
        opened["updates"][0]["affected_components"][0]["new_status"],
        "major_outage"
    );
    let upd = ok(&bulkhead(
        &[
            "incident",
            "update",
            &id,
            "--status",
            "identified",
            "--body",
            "Pool smaller than context.",
            "--data-dir",
            d,
        ],
        &[],
    ));
    assert!(
        upd.contains(&format!("incident #{id}")) && upd.contains("identified"),
        "{upd}"
    );
    ok(&bulkhead(
        &[
            "model",
            "public",
            SLUG,
            "--reason",
            "fixed in config v2",
            "--data-dir",
            d,
        ],
        &[],
    ));
    let res = ok(&bulkhead(
        &[
            "incident",
            "resolve",
            &id,
            "--body",
            "Resolved.",
            "--postmortem",
            "Two faults lined up.",
            "--data-dir",
            d,
        ],
        &[],
    ));
    assert!(res.contains("postmortem"), "{res}");

    // The audit log has both flips, newest first, with actor and reason.
    let audit: Value =
        serde_json::from_str(&ok(&bulkhead(&["audit", "--json", "--data-dir", d], &[])))
            .expect("JSON");
    let flips: Vec<(&str, &str, &str)> = audit
        .as_array()
        .expect("array")
        .iter()
        .filter(|e| e["action"] == "model.visibility")
        .map(|e| three(e, ["after", "actor", "reason"]))
        .collect();
    assert_eq!(
        flips,
        vec![
            ("public", "rita", "fixed in config v2"),
            ("private", "rita", "INC-1 canary seen")
        ]
    );
    let human = ok(&bulkhead(
        &["audit", "--subject", SLUG, "--data-dir", d],
        &[],
    ));
    assert!(
        human.contains("public -> private (INC-1 canary seen)"),
        "{human}"
    );

    // The public feed tells the story without a token.
    let (s, v) = call(&addr, "GET", "/api/v2/incidents.json", "", None);
    assert_eq!(s, 200);
    let statuses: Vec<&str> = v["incidents"][0]["incident_updates"]
        .as_array()
        .expect("updates")
        .iter()
        .filter_map(|u| u["status"].as_str())
        .collect();
    assert_eq!(statuses, vec!["resolved", "identified", "investigating"]);

    // A wrong token is refused with the control plane's message.
    let bad = [
        ("BULKHEAD_CONTROL_PLANE_URL", url.as_str()),
        ("BULKHEAD_TOKEN", "bho_nope"),
    ];
    let out = bulkhead(&["model", "private", SLUG, "--reason", "x"], &bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("401") && err.contains("the token came from the environment (BULKHEAD_TOKEN)"),
        "{err}"
    );
    // ...and one from credentials.json names the file.
    let other = temp_dir("responder-bad");
    std::fs::write(
        other.join("credentials.json"),
        json!({"control_plane_url": url, "operator_token": "bho_nope"}).to_string(),
    )
    .expect("write credentials");
    let out = bulkhead(
        &[
            "model",
            "list",
            "--data-dir",
            other.to_str().expect("utf-8 path"),
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("401")
            && err.contains(&format!("{}", other.join("credentials.json").display())),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&other);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_registers_its_measured_pool_and_is_unroutable_after_restarting_smaller() {
    let golden: Value = support::golden();
    let sha = golden["sha256"].as_str().expect("sha256");
    let dir = temp_dir("register");
    let admin = token(&dir, "ada", "admin");
    let node = token(&dir, "fleet", "node");
    let cp = control_plane(&dir);
    let addr = cp.addr("http");
    let internal = cp.addr("internal");
    let url = format!("https://{internal}");
    let body = json!({"slug": SLUG, "task": "Text Generation", "visibility": "public", "config": config(2048, 512, sha)});
    let (s, v) = call(&addr, "POST", "/admin/v1/models", &admin, Some(&body));
    assert_eq!(s, 201, "{v}");

    let serve = |mib: &str| {
        Worker::start(&[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--kv-budget-mib",
            mib,
            "--threads",
            "1",
            "--control-plane",
            &url,
            "--node-token",
            &node,
            "--node-name",
            "colocated-0",
            // This test is about the pool; a generous deadline keeps the
            // prefill-speed check (tested in control-plane/tests) out of it.
            "--prefill-deadline-secs",
            "3600",
        ])
    };
    let node_view = || {
        let (s, v) = call(&addr, "GET", "/admin/v1/nodes", &admin, None);
        assert_eq!(s, 200, "{v}");
        v.as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == "colocated-0").cloned())
            .expect("registered node")
    };

    let mut worker = serve("64");
    let n = node_view();
    let measured = n["kv_pool_tokens"].as_u64().expect("pool");
    assert!(
        measured >= 2560,
        "64 MiB holds at least 2560 tokens of SmolLM2 KV: {n}"
    );
    assert_eq!(
        (
            n["role"].as_str(),
            n["quantization"].as_str(),
            n["weights_sha256"].as_str()
        ),
        (Some("colocated"), Some("q4_1"), Some(sha))
    );
    assert_eq!(n["routable"], true, "{n}");
    // The heartbeat reports the pool's load.
    std::thread::sleep(Duration::from_millis(1500));
    let n = node_view();
    assert!(
        n["load"]["total_pages"]
            .as_u64()
            .is_some_and(|t| t * 16 == measured),
        "{n}"
    );

    // A config larger than what this worker measured is refused, naming it.
    let cfg = format!("/admin/v1/models/{SLUG_PATH}/configs");
    let (s, _) = call(&addr, "POST", &cfg, &admin, Some(&config(measured, 1, sha)));
    assert_eq!(s, 201);
    let (s, v) = call(&addr, "POST", &format!("{cfg}/2/activate"), &admin, None);
    assert_eq!(s, 409, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("`colocated-0`")
            && msg.contains(&measured.to_string())
            && msg.contains(&(measured + 1).to_string()),
        "{msg}"
    );

    // Restarted with half the memory: same name, smaller pool, unroutable.
    worker.kill9();
    let _worker = serve("32");
    let n = node_view();
    let smaller = n["kv_pool_tokens"].as_u64().expect("pool");
    assert!(smaller < 2560, "{n}");
    assert_eq!(n["routable"], false, "{n}");
    let reason = n["unroutable_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&smaller.to_string()) && reason.contains("2560"),
        "{reason}"
    );

    // A heartbeat cannot claim more than the registered pool (a node token
    // alone cannot attract every request with an enormous free pool).
    let id = n["id"].as_i64().expect("id");
    let huge =
        json!({"load": {"free_pages": 1u64 << 30, "total_pages": 1u64 << 30, "queue_depth": 0}});
    let beat = |load: &Value| {
        let path = format!("/admin/v1/nodes/{id}/heartbeat");
        support::tls_call(
            &internal,
            support::client_config(Present::Ours(CertRole::Colocated), CertRole::ControlPlane),
            CertRole::ControlPlane,
            support::request("POST", &path, &node, &load.to_string()),
        )
        .expect("the internal port answers a worker")
    };
    let (s, v) = beat(&huge);
    assert_eq!(s, 400, "{v}");
    let lying = json!({"load": {"free_pages": 10, "total_pages": 5, "queue_depth": 0}});
    let (s, v) = beat(&lying);
    assert_eq!(s, 400, "{v}");
    let (s, v) = beat(&json!({"load": {"free_pages": 5, "total_pages": 5, "queue_depth": 0}}));
    assert_eq!(s, 200, "an honest heartbeat is taken: {v}");

    // Registrations, re-registrations and removals are audited.
    let (s, v) = call(
        &addr,
        "DELETE",
        &format!("/admin/v1/nodes/{id}"),
        &admin,
        None,
    );
    assert_eq!(s, 204, "{v}");
    let (s, v) = call(&addr, "GET", "/admin/v1/audit", &admin, None);
    assert_eq!(s, 200, "{v}");
    let actions: Vec<&str> = items(&v)
        .filter(|e| e["subject"] == "colocated-0")
        .filter_map(|e| e["action"].as_str())
        .collect();
    for a in ["node.register", "node.reregister", "node.remove"] {
        assert!(actions.contains(&a), "{a} in {actions:?}");
    }
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fake worker with a stolen node token: on the operators' port the token
/// alone registers nothing; on the internal port a client without a
/// certificate, with another CA's, or with an operator's is refused in the
/// handshake; a gateway's certificate may not register a node, nor a decode
/// certificate a prefill worker. Nothing it tried was registered, so the
/// gateway can never route to it.
#[test]
fn a_stolen_node_token_without_the_right_certificate_registers_nothing() {
    let dir = temp_dir("cp-mtls");
    let admin = token(&dir, "root", "admin");
    let node = token(&dir, "fleet", "node");
    let cp = control_plane(&dir);
    let (addr, internal) = (cp.addr("http"), cp.addr("internal"));
    // The model exists: without the certificate checks, each attempt below
    // would register.
    let sha = "a".repeat(64);
    let body = json!({"slug": SLUG, "task": "Text Generation", "visibility": "public", "config": config(2048, 512, &sha)});
    let (s, v) = call(&addr, "POST", "/admin/v1/models", &admin, Some(&body));
    assert_eq!(s, 201, "{v}");
    let fake = json!({"name": "fake", "role": "decode", "model": SLUG, "address": "127.0.0.1:1",
        "kv_pool_tokens": 1u64 << 40, "weights_sha256": "a".repeat(64), "quantization": "q4_1",
        "page_size": 16, "kv_budget_bytes": 1u64 << 40})
    .to_string();
    let register = support::request("POST", "/admin/v1/nodes", &node, &fake);

    // The operators' port: the token is known, but node calls need a certificate.
    let (s, v) = call(
        &addr,
        "POST",
        "/admin/v1/nodes",
        &node,
        serde_json::from_str(&fake).ok().as_ref(),
    );
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("internal port")),
        "{v}"
    );

    // The internal port: refused in the handshake.
    for present in [
        Present::Nothing,
        Present::Foreign(CertRole::Decode),
        Present::Ours(CertRole::Operator),
    ] {
        let r = support::tls_call(
            &internal,
            support::client_config(present, CertRole::ControlPlane),
            CertRole::ControlPlane,
            register.clone(),
        );
        assert!(r.is_err(), "{present:?} was served: {r:?}");
    }
    // Admitted to the port, but not a worker's certificate, or another role's.
    let as_role = |present: CertRole, body: &str| {
        support::tls_call(
            &internal,
            support::client_config(Present::Ours(present), CertRole::ControlPlane),
            CertRole::ControlPlane,
            support::request("POST", "/admin/v1/nodes", &node, body),
        )
        .expect("answered")
    };
    let (s, v) = as_role(CertRole::Gateway, &fake);
    assert_eq!(s, 403, "{v}");
    let as_prefill = fake.replace("\"decode\"", "\"prefill\"");
    let (s, v) = as_role(CertRole::Decode, &as_prefill);
    assert_eq!(s, 403, "{v}");
    assert!(v.contains("cannot register a prefill"), "{v}");
    // A client refuses a server that is not the control plane: the
    // internal port's certificate names control-plane, not decode.
    let r = support::tls_call(
        &internal,
        support::client_config(Present::Ours(CertRole::Decode), CertRole::Decode),
        CertRole::Decode,
        register,
    );
    assert!(r.is_err(), "{r:?}");

    // A worker certificate scoped to another model cannot register this
    // one; one scoped to this model cannot claim more pool than it names.
    // A call to the internal port with a decode certificate scoped to
    // `model` and a pool of `max_kv` tokens.
    let scoped = |model: &str, max_kv: u64, path: &str, body: &str| {
        let id = support::scoped_identity(CertRole::Decode, model, Some(max_kv));
        let config = id.client_config(&[CertRole::ControlPlane]).expect("config");
        let req = support::request("POST", path, &node, body);
        support::tls_call(&internal, config, CertRole::ControlPlane, req).expect("answered")
    };
    let as_scoped =
        |model: &str, max_kv: u64, body: &str| scoped(model, max_kv, "/admin/v1/nodes", body);
    let (s, v) = as_scoped("@cf/other/model", 1 << 40, &fake);
    assert_eq!(s, 403, "{v}");
    assert!(v.contains("cannot register a node of"), "{v}");
    // The pool bound is in tokens, what routing and load reports count: a
    // small byte budget beside a vast token count is still refused.
    let small_budget = {
        let mut v: Value = serde_json::from_str(&fake).expect("JSON");
        v["kv_budget_bytes"] = json!(1);
        v.to_string()
    };
    let (s, v) = as_scoped(SLUG, 4096, &small_budget);
    assert_eq!(s, 403, "{v}");
    assert!(v.contains("cannot claim a KV pool"), "{v}");

    // Nothing was registered; the routing table's reader is refused too.
    let (s, v) = call(&addr, "GET", "/admin/v1/nodes", &admin, None);
    assert_eq!((s, v.as_array().map(Vec::len)), (200, Some(0)), "{v}");
    let (s, _) = call(&addr, "GET", "/admin/v1/routing?gateway=x", &admin, None);
    assert_eq!(s, 403);

    // The same body with the right certificate is registered: the refusals
    // above were the certificate's, not the body's.
    let (s, v) = as_role(CertRole::Decode, &fake);
    assert_eq!(s, 200, "{v}");
    // And a certificate scoped to this model, within its pool, registers.
    let within = {
        let mut v: Value = serde_json::from_str(&fake).expect("JSON");
        v["name"] = json!("scoped");
        v["kv_pool_tokens"] = json!(4096);
        v["kv_budget_bytes"] = json!(4096u64 * 23_040);
        v.to_string()
    };
    let (s, v) = as_scoped(SLUG, 4096, &within);
    assert_eq!(s, 200, "{v}");
    // Only a certificate that may serve its model keeps that node alive.
    let id = serde_json::from_str::<Value>(&v).expect("JSON")["node"]["id"]
        .as_i64()
        .expect("node id");
    let beat = |model: &str| scoped(model, 4096, &format!("/admin/v1/nodes/{id}/heartbeat"), "");
    let (s, v) = beat("@cf/other/model");
    assert_eq!(s, 403, "{v}");
    assert!(!v.contains(SLUG), "the refusal names the node's model: {v}");
    let (s, v) = beat(SLUG);
    assert_eq!(s, 200, "{v}");
    // Nor can a certificate for another model take over a node of this
    // one by registering under its name.
    let takeover = within.replace(SLUG, "@cf/other/model");
    let (s, v) = as_scoped("@cf/other/model", 4096, &takeover);
    assert_eq!(s, 403, "{v}");
    assert!(v.contains("cannot replace it"), "{v}");
    // A certificate scoped to another model cannot report usage of this
    // one (it could bill a tenant for calls it never served); scoped to
    // this model, it can.
    // An event names its call's signed context; `signer` signs it for
    // `signed_for`, the event bills `billed`.
    let usage_of = |call: &str,
                    billed: &str,
                    signed_for: &str,
                    signer: &bulkhead_worker_api::context::SigningKey| {
        let ctx = bulkhead_worker_api::context::TenantContext::new(
            signed_for,
            1,
            call.to_owned(),
            SLUG,
            None,
            16,
            None,
            std::time::SystemTime::now(),
        );
        json!({"events": [{"call_id": call, "account_id": billed,
            "model": SLUG, "prompt_tokens": 3, "completion_tokens": 2, "finish": "stop",
            "context": signer.sign(&ctx), "at": "2026-12-01T10:00:00Z"}]})
        .to_string()
    };
    let (alice, bob) = ("a".repeat(32), "b".repeat(32));
    let gateway = support::key_ring();
    let usage = usage_of("scope-1", &alice, &alice, &gateway);
    let report = |model: &str| scoped(model, 4096, "/admin/v1/usage", &usage);
    let (s, v) = report("@cf/other/model");
    assert_eq!(s, 403, "{v}");
    assert!(v.contains("may not report usage of"), "{v}");
    let (s, v) = report(SLUG);
    assert_eq!(s, 200, "{v}");
    assert!(v.contains("\"recorded\":1"), "{v}");
    // Nor can a worker bill another account than its call's signed context
    // names, or with a context it made itself.
    let worker_made = bulkhead_worker_api::context::SigningKey::generate();
    for (body, why) in [
        (
            usage_of("scope-2", &bob, &alice, &gateway),
            "another account",
        ),
        (
            usage_of("scope-3", &bob, &bob, &worker_made),
            "a context the gateway never signed",
        ),
    ] {
        let (s, v) = scoped(SLUG, 4096, "/admin/v1/usage", &body);
        assert_eq!(s, 403, "{why}: {v}");
        assert!(v.contains("tenant context"), "{why}: {v}");
    }
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}
