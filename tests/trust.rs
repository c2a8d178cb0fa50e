//! The workers' internal ports as an attacker on the network meets them,
//! over real sockets: a prefill worker's transfer port and HTTP port and a
//! decode worker's HTTP port each refuse, in the TLS handshake, a client
//! without a certificate, with another CA's, or of a role the port does not
//! admit; and a decode worker refuses every tenant context that is missing,
//! forged, expired, replayed, for another model or for more than it allows,
//! with nothing allocated. (The control plane's internal port:
//! tests/control_plane.rs; forged page frames: tests/disagg.rs.)

mod support;

use bulkhead_trust::Role as CertRole;
use bulkhead_worker_api::context::{CONTEXT_HEADER, SigningKey, TenantContext};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};
use support::{Present, Request, client_config, decode, prefill, stats, tls_call};

const SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";

/// A `GET /stats` (or the first frame on the transfer port): `Ok` with the
/// status when the port served the client at all.
fn probe(addr: &str, present: Present, server: CertRole) -> Result<u16, String> {
    let request = Request::new("GET", "/stats");
    tls_call(addr, client_config(present, server), server, request).map(|(s, _)| s)
}

/// Whether the server ended the connection with a TLS alert (a refused
/// certificate), not a timeout or an answer.
fn refused<T: std::fmt::Debug>(r: &Result<T, String>) -> bool {
    r.as_ref().is_err_and(|e| e.contains("alert"))
}

#[test]
fn every_worker_port_refuses_a_client_without_the_right_certificate() {
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    // (port, the role it serves as, a role it refuses although our CA issued it)
    for (addr, server, wrong) in [
        (d.addr("http"), CertRole::Decode, CertRole::Prefill),
        (p.addr("http"), CertRole::Prefill, CertRole::Decode),
    ] {
        for present in [
            Present::Nothing,
            Present::Foreign(CertRole::Operator),
            Present::Foreign(CertRole::Gateway),
            Present::Ours(wrong),
        ] {
            let r = probe(&addr, present, server);
            assert!(refused(&r), "{addr} ({server}) served {present:?}: {r:?}");
        }
        assert_eq!(
            probe(&addr, Present::Ours(CertRole::Operator), server),
            Ok(200)
        );
    }
    // The transfer port admits decode workers only: anything else is cut
    // in the handshake, before a frame (not even prefill's hello) is read.
    for present in [
        Present::Nothing,
        Present::Foreign(CertRole::Decode),
        Present::Ours(CertRole::Gateway),
        Present::Ours(CertRole::Operator),
    ] {
        let r = tls_call(
            &p.addr("transfer"),
            client_config(present, CertRole::Prefill),
            CertRole::Prefill,
            Request::new("GET", "/"),
        );
        assert!(refused(&r), "the transfer port served {present:?}: {r:?}");
    }
    let ps = stats(&p.addr("http"));
    assert_eq!(ps["transfer"]["requests"], 0, "{ps}");
    // Aborting every transfer is an operator's act: the gateway's
    // certificate, admitted to the port, may not.
    for (who, status) in [(CertRole::Gateway, 403), (CertRole::Operator, 202)] {
        let r = tls_call(
            &p.addr("http"),
            client_config(Present::Ours(who), CertRole::Prefill),
            CertRole::Prefill,
            Request::new("POST", "/admin/abort"),
        );
        assert_eq!(r.as_ref().map(|(s, _)| *s), Ok(status), "{who}: {r:?}");
    }
    // The decode worker is linked all along: its own certificate works.
    assert_eq!(
        stats(&d.addr("http"))["prefills"].as_array().map(Vec::len),
        Some(1)
    );
}

/// One generate call to `addr` with the gateway's certificate and the
/// context header `ctx`: status and body.
fn generate_with(addr: &str, ctx: Option<&str>, body: &Value) -> (u16, String) {
    let mut request = Request::new("POST", "/v1/generate")
        .header("x-bulkhead-tenant", "3")
        .json(&body.to_string());
    if let Some(c) = ctx {
        request = request.header(CONTEXT_HEADER, c);
    }
    tls_call(
        addr,
        client_config(Present::Ours(CertRole::Gateway), CertRole::Decode),
        CertRole::Decode,
        request,
    )
    .expect("the gateway's certificate is admitted")
}

fn statement(request_id: &str, max_tokens: u64, age: Duration) -> TenantContext {
    TenantContext::new(
        &"a".repeat(32),
        3,
        request_id.to_owned(),
        SLUG,
        Some(1),
        max_tokens,
        Some(2048),
        SystemTime::now() - age,
    )
}

fn code(body: &str) -> String {
    serde_json::from_str::<Value>(body).unwrap_or_default()["error"]["code"]
        .as_str()
        .unwrap_or("(not an error)")
        .to_owned()
}

#[test]
fn a_decode_worker_serves_only_a_fresh_signed_context_within_its_limits() {
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    let addr = d.addr("http");
    let ring = support::key_ring();
    let body = json!({"raw": "Hello", "max_tokens": 4, "context_limit": 2048});
    let foreign =
        SigningKey::parse(&format!("k1 {}\n", "6b".repeat(32)), "attacker").expect("ring");
    let tampered = {
        let good = ring.sign(&statement("t-good", 4, Duration::ZERO));
        let mut other = statement("t-good", 4, Duration::ZERO);
        other.tenant = 4;
        let forged = ring.sign(&other);
        let (_, tag) = good.rsplit_once('.').expect("tag");
        let (payload, _) = forged.rsplit_once('.').expect("payload");
        format!("{payload}.{tag}")
    };
    let mut other_model = statement("t-model", 4, Duration::ZERO);
    other_model.model = "@cf/huggingfacetb/smollm2-135m-instruct-q8".to_owned();
    let mut wider = statement("t-window", 4, Duration::ZERO);
    wider.context_limit = Some(1024);
    let cases = [
        (None, 401, "missing_context"),
        (
            Some(foreign.sign(&statement("t-foreign", 4, Duration::ZERO))),
            401,
            "invalid_context",
        ),
        (Some(tampered), 401, "invalid_context"),
        (
            Some(ring.sign(&statement("t-old", 4, Duration::from_secs(45)))),
            401,
            "expired_context",
        ),
        (Some(ring.sign(&other_model)), 403, "wrong_model"),
        (
            Some(ring.sign(&statement("t-limits", 3, Duration::ZERO))),
            403,
            "limits_exceeded",
        ),
        (Some(ring.sign(&wider)), 403, "limits_exceeded"),
    ];
    for (ctx, status, want) in cases {
        let (s, text) = generate_with(&addr, ctx.as_deref(), &body);
        assert_eq!((s, code(&text).as_str()), (status, want), "{ctx:?}: {text}");
    }
    let ds = stats(&addr);
    assert_eq!(ds["pool"]["allocations"], 0, "nothing allocated: {ds}");
    assert_eq!(ds["transfer"]["started"], 0, "nothing sent: {ds}");

    // A good context is served once; the same context again is refused.
    let once = ring.sign(&statement("t-once", 4, Duration::ZERO));
    let (s, text) = generate_with(&addr, Some(&once), &body);
    assert_eq!(s, 200, "{text}");
    let started = stats(&addr)["transfer"]["started"].clone();
    let (s, text) = generate_with(&addr, Some(&once), &body);
    assert_eq!(
        (s, code(&text).as_str()),
        (403, "replayed_context"),
        "{text}"
    );
    assert_eq!(
        stats(&addr)["transfer"]["started"],
        started,
        "the replay started nothing"
    );
}

/// The names of the files in `dir`, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn tls_init_gives_each_component_only_its_own_secrets_and_a_workers_bundle_is_never_the_gateway() {
    // `tls init` over the test CA (it reuses every valid file) writes the
    // bundles.
    let dir = support::tls_dir();
    support::tls_init(dir, &["--model", SLUG]);
    let bundles = dir.join("bundles");
    let own = |role: &str, extra: &[&str]| {
        let mut v: Vec<String> = [
            "ca.pem".to_owned(),
            format!("{role}.key"),
            format!("{role}.pem"),
        ]
        .into_iter()
        .chain(extra.iter().map(|s| (*s).to_owned()))
        .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&bundles.join("gateway")),
        own("gateway", &["context.pub", "context.sign"])
    );
    for role in ["control-plane", "prefill", "decode", "colocated"] {
        assert_eq!(
            names(&bundles.join(role)),
            own(role, &["context.pub"]),
            "{role}"
        );
    }
    assert_eq!(names(&bundles.join("operator")), own("operator", &[]));
    // The model-scoped worker certificates get bundles of their own.
    let scoped: Vec<String> = names(&bundles)
        .into_iter()
        .filter(|n| n.starts_with("decode."))
        .collect();
    assert_eq!(scoped.len(), 1, "{scoped:?}");
    assert_eq!(
        names(&bundles.join(&scoped[0])),
        own("decode", &["context.pub"])
    );
    // The CA key is in no bundle.
    for b in names(&bundles) {
        assert!(
            !bundles.join(&b).join("ca.key").exists(),
            "{b} holds the CA key"
        );
    }

    // A worker given only its bundle cannot start as the gateway...
    let decode_bundle = bundles.join("decode");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["gateway", "--listen", "127.0.0.1:0", "--control-plane"])
        .arg("https://127.0.0.1:9")
        .env("BULKHEAD_TLS_DIR", &decode_bundle)
        .env("BULKHEAD_GATEWAY_TOKEN", "bho_not_needed")
        .output()
        .expect("gateway runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the gateway started from a decode bundle"
    );
    assert!(err.contains("gateway"), "{err}");
    // ...nor is its certificate admitted where the gateway's is: a worker's
    // API port refuses it in the handshake.
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    // A `GET /stats` to the decode worker presenting `bundle`'s identity.
    let stats_as = |bundle: &std::path::Path, role: CertRole| {
        let id =
            bulkhead_trust::Identity::load(&bulkhead_trust::TlsFiles::in_dir(bundle, role), role)
                .expect("the bundle's own identity loads");
        let config = id.client_config(&[CertRole::Decode]).expect("config");
        let stats = support::Request::new("GET", "/stats");
        tls_call(&d.addr("http"), config, CertRole::Decode, stats)
    };
    let r = stats_as(&decode_bundle, CertRole::Decode);
    assert!(refused(&r), "{r:?}");
    // The gateway's bundle is.
    let r = stats_as(&bundles.join("gateway"), CertRole::Gateway);
    assert!(r.is_ok(), "{r:?}");
}
