//! Waiting until every worker is routable, and the window this machine
//! serves: when a worker cannot prefill its model's configured context
//! window within the deadline, the window is reduced to a quarter under the
//! longest prompt it prefills in time, and `up` says so. A restarted worker
//! measures itself again; if it finds itself slower than the window allows
//! (a busy moment on a shared machine), the window is reduced the same way,
//! so the platform serves again rather than holding an unroutable worker.

use super::*;
use bulkhead_control_api::{ConfigView, NodeView, Timestamp};
use bulkhead_trust::Role as CertRole;
use std::time::Duration;

/// Every worker `up` started must be routable before it says ready: a
/// config that does not fit their pools is an error, not a dead curl line.
pub(super) async fn check_routable(
    args: &UpArgs,
    creds: &CredentialsFile,
    internal: &Internal,
) -> anyhow::Result<()> {
    let client = bulkhead_control_api::Client::new(&bulkhead_control_api::Credentials {
        control_plane_url: creds.control_plane_url.clone(),
        operator_token: internal.admin.clone(),
    })?;
    // Asked with the operator certificate: worker ports are mutual TLS.
    let operator = bulkhead_trust::Identity::load(
        &bulkhead_trust::TlsFiles::in_dir(&args.data_dir.join("tls"), CertRole::Operator),
        CertRole::Operator,
    )?;
    let tls = operator.connector(&[CertRole::Decode])?;
    for served in args.served() {
        let names = worker_names(args, served);
        let workers = |nodes: &[NodeView]| -> anyhow::Result<Vec<NodeView>> {
            names
                .iter()
                .map(|name| {
                    nodes
                        .iter()
                        .find(|n| n.registration.name == *name)
                        .cloned()
                        .with_context(|| format!("{name} did not register"))
                })
                .collect()
        };
        let nodes: Vec<NodeView> = client.get("/admin/v1/nodes").await?;
        let mut ours = workers(&nodes)?;
        if reduce_window(&client, &served.slug(), &ours, true).await? {
            let nodes: Vec<NodeView> = client.get("/admin/v1/nodes").await?;
            ours = workers(&nodes)?;
        }
        for n in &ours {
            if let Some(why) = &n.unroutable_reason {
                anyhow::bail!(
                    "{} is not routable: {why} (adjust --kv-budget-mib, --context-window or --max-output)",
                    n.registration.name
                );
            }
        }
        // Ready means answering: every decode worker has linked to a
        // prefill worker (they learn of them through the control plane).
        for n in ours
            .iter()
            .filter(|n| n.registration.role == bulkhead_control_api::NodeRole::Decode)
        {
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while !linked(&tls, &n.registration.address).await {
                anyhow::ensure!(
                    std::time::Instant::now() < until,
                    "{} linked to no prefill worker within 30 s",
                    n.registration.name
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    if creds.embedding_model.is_some() {
        let nodes: Vec<NodeView> = client.get("/admin/v1/nodes").await?;
        let name = super::embedding::NODE_NAME;
        let node = nodes
            .iter()
            .find(|n| n.registration.name == name)
            .with_context(|| format!("{name} did not register"))?;
        if let Some(why) = &node.unroutable_reason {
            anyhow::bail!("{name} is not routable: {why}");
        }
    }
    Ok(())
}

/// Whether the decode worker at `address` is linked to a prefill worker
/// (its `/stats` lists one).
pub(super) async fn linked(
    tls: &bulkhead_trust::tokio_rustls::TlsConnector,
    address: &str,
) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = bulkhead_trust::connect::dial(tls, CertRole::Decode, address).await else {
        return false;
    };
    let req = format!("GET /stats HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let mut out = Vec::new();
    let read = async {
        s.write_all(req.as_bytes()).await?;
        s.flush().await?;
        s.read_to_end(&mut out).await
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), read).await,
        Ok(Ok(_))
    ) {
        return false;
    }
    let text = String::from_utf8_lossy(&out);
    let Some((_, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["prefills"].as_array().map(|a| !a.is_empty()))
        .unwrap_or(false)
}

/// A window this machine cannot prefill within the workers' deadline is
/// not advertised: activates a config with the longest one it can, says
/// why, and tells whether it did. A window that fits is served whole, and
/// (with `say_fit`) `up` says that too, with the time it takes.
pub(super) async fn reduce_window(
    client: &bulkhead_control_api::Client,
    slug: &str,
    ours: &[NodeView],
    say_fit: bool,
) -> anyhow::Result<bool> {
    let servable = ours
        .iter()
        .filter_map(|n| n.registration.prefill.map(|f| (f.max_prompt(), f)))
        .min_by_key(|(max, _)| *max);
    let path = format!("/admin/v1/models/{}/configs", urlencode(slug));
    let configs: Vec<ConfigView> = client.get(&path).await?;
    let (Some((max, figures)), Some(active)) = (servable, configs.iter().find(|c| c.active)) else {
        return Ok(false);
    };
    if active.spec.properties.context_window <= max {
        let window = active.spec.properties.context_window;
        if !say_fit {
            return Ok(false);
        }
        eprintln!(
            "bulkhead up: serving the whole {window}-token context window of {slug}: about {} s to prefill \
             here, within the {} s prefill deadline (this machine prefills up to {max} tokens in time)",
            figures.prompt_ms(window).div_ceil(1000),
            figures.deadline_ms / 1000,
        );
        return Ok(false);
    }
    // A quarter kept in hand: a worker restarted while the others are busy
    // measures itself slower, and must still fit the window to be routable.
    let window = (max * 3 / 4 / 256) * 256;
    anyhow::ensure!(
        window >= 256,
        "this machine prefills at most {max} tokens within {} s; no useful context window fits",
        figures.deadline_ms / 1000
    );
    let was = active.spec.properties.context_window;
    eprintln!(
        "bulkhead up: prefilling the {was}-token context window of {slug} would take about {} s here, over the \
         {} s prefill deadline; serving a {window}-token window, a quarter under the longest prompt prefilled \
         in time (raise --prefill-deadline-secs to serve more)",
        figures.prompt_ms(was).div_ceil(1000),
        figures.deadline_ms / 1000,
    );
    let mut spec = active.spec.clone();
    spec.properties.context_window = window;
    spec.properties.max_output = spec.properties.max_output.min(window);
    let added: ConfigView = client.post(&path, &spec).await?;
    let _: ConfigView = client
        .post(
            &format!("{path}/{}/activate", added.version),
            &serde_json::json!({"reason": format!("bulkhead up: the {was}-token window cannot be prefilled within the deadline here")}),
        )
        .await?;
    Ok(true)
}

/// Rechecks the window of each restarted worker's model (its node name,
/// and when it was started again), one at a time, until `up` stops.
pub(super) async fn recheck_after_restarts(
    args: &UpArgs,
    creds: &CredentialsFile,
    internal: &Internal,
    mut restarted: tokio::sync::mpsc::UnboundedReceiver<(String, Timestamp)>,
) {
    while let Some((node, at)) = restarted.recv().await {
        if let Err(e) = recheck(args, creds, internal, &node, at).await {
            eprintln!("bulkhead up: checking the window of {node} after its restart failed: {e:#}");
        }
    }
}

/// Once `node`, restarted at `at`, has registered again (its new
/// measurement of its prefill speed with it), reduces its model's window
/// if that measurement cannot prefill it in time.
async fn recheck(
    args: &UpArgs,
    creds: &CredentialsFile,
    internal: &Internal,
    node: &str,
    at: Timestamp,
) -> anyhow::Result<()> {
    let Some(served) = args
        .served()
        .into_iter()
        .find(|s| worker_names(args, *s).iter().any(|n| n == node))
    else {
        return Ok(());
    };
    let client = bulkhead_control_api::Client::new(&bulkhead_control_api::Credentials {
        control_plane_url: creds.control_plane_url.clone(),
        operator_token: internal.admin.clone(),
    })?;
    let names = worker_names(args, served);
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let nodes: Vec<NodeView> = client.get("/admin/v1/nodes").await?;
        // The process that died cannot have been seen since `at`.
        if nodes
            .iter()
            .any(|n| n.registration.name == node && n.last_seen_at.millis() >= at.millis())
        {
            let ours: Vec<NodeView> = nodes
                .into_iter()
                .filter(|n| names.contains(&n.registration.name))
                .collect();
            reduce_window(&client, &served.slug(), &ours, false).await?;
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < until,
            "it did not register again within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The node names of every worker `up` starts for `served`.
pub(super) fn worker_names(args: &UpArgs, served: Served) -> Vec<String> {
    if args.colocated {
        return (1..=args.decode_workers)
            .map(|i| served.node_name("serve", i))
            .collect();
    }
    let prefill = (1..=args.prefill_workers).map(|i| served.node_name("prefill", i));
    let decode = (1..=args.decode_workers).map(|i| served.node_name("decode", i));
    prefill.chain(decode).collect()
}

/// `@` and `/` escaped for a path segment.
pub(super) fn urlencode(s: &str) -> String {
    s.replace('@', "%40").replace('/', "%2F")
}
