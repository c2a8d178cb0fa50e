//! The Kubernetes manifests against the binary they run: every file a
//! kustomization names exists; every flag and environment variable a
//! container passes is one `bulkhead <subcommand> --help` documents; every
//! container port is one the arguments bind; every probe, Service and
//! NetworkPolicy port is one the selected containers expose; and every probe
//! path answers 200 on the real component. (`deploy/kubernetes/validate.sh`
//! checks the manifests against the Kubernetes schemas.)

mod support;

use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every document of every YAML file under `dir`, with its file.
fn documents(dir: &Path) -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&p).expect("read");
                for doc in serde_yaml::Deserializer::from_str(&text) {
                    let v =
                        Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                    out.push((p.clone(), v));
                }
            }
        }
    }
    out
}

use serde::Deserialize;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn seq(v: &Value) -> Vec<Value> {
    v.as_sequence().cloned().unwrap_or_default()
}

/// A Deployment's pod labels and its containers.
struct Pods {
    name: String,
    labels: BTreeMap<String, String>,
    containers: Vec<Value>,
}

fn deployments(docs: &[(PathBuf, Value)]) -> Vec<Pods> {
    docs.iter()
        .filter(|(_, d)| s(&d["kind"]) == "Deployment")
        .map(|(_, d)| {
            let t = &d["spec"]["template"];
            Pods {
                name: s(&d["metadata"]["name"]).to_owned(),
                labels: t["metadata"]["labels"]
                    .as_mapping()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (s(k).to_owned(), s(v).to_owned()))
                            .collect()
                    })
                    .unwrap_or_default(),
                containers: seq(&t["spec"]["containers"]),
            }
        })
        .collect()
}

fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    selector.as_mapping().is_some_and(|m| {
        m.iter()
            .all(|(k, v)| labels.get(s(k)).is_some_and(|l| l == s(v)))
    })
}

/// Container ports: name → number.
fn ports(c: &Value) -> BTreeMap<String, u64> {
    seq(&c["ports"])
        .iter()
        .map(|p| {
            (
                s(&p["name"]).to_owned(),
                p["containerPort"].as_u64().expect("port"),
            )
        })
        .collect()
}

fn help(sub: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args([sub, "--help"])
        .output()
        .expect("help");
    assert!(out.status.success(), "bulkhead {sub} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kustomizations_name_files_that_exist() {
    for (file, doc) in documents(&root()) {
        if s(&doc["kind"]) != "Kustomization" {
            continue;
        }
        let dir = file.parent().expect("dir");
        for r in seq(&doc["resources"]) {
            let p = dir.join(s(&r));
            assert!(p.exists(), "{} names {}", file.display(), p.display());
        }
    }
}

#[test]
fn every_flag_port_and_env_exists_in_the_binary() {
    let docs = documents(&root().join("base"));
    let pods = deployments(&docs);
    assert!(
        pods.len() >= 7,
        "control plane, gateway, redis, two models' workers"
    );
    let mut checked = 0;
    for p in &pods {
        for c in &p.containers {
            if !s(&c["image"]).starts_with("bulkhead") {
                continue;
            }
            let args: Vec<String> = seq(&c["args"]).iter().map(|a| s(a).to_owned()).collect();
            let sub = args.first().expect("a subcommand");
            let text = help(sub);
            for a in args.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    text.contains(&format!("{a} ")) || text.contains(&format!("{a}\n")),
                    "{}: `bulkhead {sub}` has no flag {a}",
                    p.name
                );
            }
            for e in seq(&c["env"]) {
                let name = s(&e["name"]);
                if name.starts_with("BULKHEAD_") || name == "DATABASE_URL" || name == "REDIS_URL" {
                    assert!(
                        text.contains(&format!("[env: {name}")),
                        "{}: `bulkhead {sub}` reads no {name}",
                        p.name
                    );
                }
            }
            // Every exposed port is one an argument binds.
            for (name, port) in ports(c) {
                assert!(
                    args.iter().any(|a| a.ends_with(&format!(":{port}"))),
                    "{}: port {name} ({port}) is bound by no argument",
                    p.name
                );
            }
            // Probes name ports the container exposes.
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                let h = &c[probe]["httpGet"];
                if h.is_null() {
                    continue;
                }
                assert!(
                    ports(c).contains_key(s(&h["port"])),
                    "{}: {probe} port {:?}",
                    p.name,
                    h["port"]
                );
                assert_eq!(s(&h["path"]), "/health", "{}: {probe}", p.name);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 6, "every bulkhead container was checked");
    // Services and NetworkPolicies point at ports the selected pods expose.
    for (_, d) in &docs {
        let kind = s(&d["kind"]);
        let (selector, wanted): (&Value, Vec<Value>) = match kind {
            "Service" => (&d["spec"]["selector"], seq(&d["spec"]["ports"])),
            "NetworkPolicy" => (
                &d["spec"]["podSelector"]["matchLabels"],
                seq(&d["spec"]["ingress"])
                    .iter()
                    .flat_map(|i| seq(&i["ports"]))
                    .collect(),
            ),
            _ => continue,
        };
        let selected: Vec<&Pods> = pods
            .iter()
            .filter(|p| selects(selector, &p.labels))
            .collect();
        assert!(
            !selected.is_empty(),
            "{kind} {:?} selects no pod",
            d["metadata"]["name"]
        );
        let exposed: BTreeSet<String> = selected
            .iter()
            .flat_map(|p| p.containers.iter().flat_map(ports))
            .flat_map(|(n, p)| [n, p.to_string()])
            .collect();
        for port in wanted {
            let want = match kind {
                "Service" => &port["targetPort"],
                _ => &port["port"],
            };
            let key = want
                .as_u64()
                .map_or_else(|| s(want).to_owned(), |n| n.to_string());
            assert!(
                exposed.contains(&key),
                "{kind} {:?}: port {key} is not exposed by the pods it selects",
                d["metadata"]["name"]
            );
        }
    }
}

#[test]
fn probe_paths_answer_on_the_real_components() {
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-deploy-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    let data = dir.to_str().expect("utf-8");
    let cp = support::control_plane(data, &[]);
    let cp_addr = cp.addr("http");
    let token = support::platform::operator_token(data, "edge", "gateway");
    let cp_url = format!("https://{}", cp.addr("internal"));
    let gw = support::Worker::start(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--control-plane",
        &cp_url,
        "--gateway-token",
        &token,
    ]);
    let worker = support::prefill(&[]);
    for (what, url) in [
        ("control plane", format!("http://{cp_addr}")),
        ("gateway", format!("http://{}", gw.addr("http"))),
        // Workers' API is mutual TLS (a kubelet probe would use the
        // operator certificate, or a tcpSocket probe).
        ("worker", format!("https://{}", worker.addr("http"))),
    ] {
        let r = support::platform::try_call(&url, "GET", "/health", "", "");
        assert!(matches!(r, Ok((200, _))), "{what} /health: {r:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
