//! What `up` writes to its data directory: `credentials.json` for people
//! and scripts, the tokens it runs the components with (private to the
//! directory), and the ready-to-paste lines it prints.

use super::*;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// What `up` writes for people and scripts.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CredentialsFile {
    pub(super) gateway_url: String,
    pub(super) control_plane_url: String,
    /// The control plane's internal (mutual TLS) URL, for workers and
    /// gateways started by hand with the identities in `tls/`.
    #[serde(default)]
    pub(super) internal_url: String,
    pub(super) status_url: String,
    pub(super) operator_token: String,
    pub(super) model: String,
    /// Every model served (the first is `model`).
    #[serde(default)]
    pub(super) models: Vec<String>,
    pub(super) accounts: Vec<DemoAccount>,
    /// Where each component serves `GET /metrics` for Prometheus.
    #[serde(default)]
    pub(super) metrics: std::collections::BTreeMap<String, String>,
    /// The embedding model served, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) embedding_model: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct DemoAccount {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) token: String,
}

/// The tokens `up` itself uses to run the components (kept private to the
/// data directory).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Internal {
    pub(super) admin: String,
    pub(super) gateway: String,
    pub(super) node: String,
    /// The leak prober's sentinel accounts.
    #[serde(default)]
    pub(super) sentinels: Vec<crate::platform::prober::Sentinel>,
}

/// Writes a secret file: created 0600, written in full, then renamed into
/// place, so it is never readable by others nor half written.
pub(super) fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub(super) fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

pub(super) fn announce(c: &CredentialsFile, dir: &Path) {
    let a = &c.accounts[0];
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "bulkhead up: ready");
    let _ = writeln!(out, "  gateway        {}", c.gateway_url);
    let _ = writeln!(
        out,
        "  control plane  {}  (status page and feeds: {}/ , {}/api/v2/summary.json)",
        c.control_plane_url, c.status_url, c.status_url
    );
    for m in &c.models {
        let _ = writeln!(out, "  model          {m}");
    }
    for acct in &c.accounts {
        let _ = writeln!(
            out,
            "  account {:<6} id {}  token {}",
            acct.name, acct.id, acct.token
        );
    }
    let _ = writeln!(out, "  operator token {}  (responder)", c.operator_token);
    for (component, url) in &c.metrics {
        let _ = writeln!(out, "  metrics        {component:<14} {url}");
    }
    let _ = writeln!(
        out,
        "  credentials    {}",
        dir.join("credentials.json").display()
    );
    let _ = writeln!(out, "try:");
    let _ = writeln!(
        out,
        "  curl -s {}/client/v4/accounts/{}/ai/run/{} -H 'Authorization: Bearer {}' -d '{}'",
        c.gateway_url, a.id, c.model, a.token, EXAMPLE_BODY
    );
    let _ = writeln!(out, "Ctrl-C stops everything.");
    let _ = out.flush();
}
