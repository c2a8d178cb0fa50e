//! The TLS flags every internal component takes, and `bulkhead tls init`.
//!
//! A component finds its identity in `--tls-dir` (`ca.pem`, `ROLE.pem`,
//! `ROLE.key`, as `bulkhead tls init` and `up` write them) or in the three
//! files `--tls-ca`, `--tls-cert`, `--tls-key` (what the Kubernetes
//! manifests mount from Secrets). There is no flag to turn TLS off: a
//! component without an identity does not start.

use anyhow::Context;
use bulkhead_trust::{Identity, Role, TlsFiles};
use bulkhead_worker_api::context::KeyRing;
use clap::Args;
use std::path::PathBuf;

/// The key ring's file name in a TLS directory.
pub(crate) const CONTEXT_KEYS: &str = "context.keys";

/// Where this component's CA, certificate and key are.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TlsArgs {
    /// Directory with `ca.pem`, `ROLE.pem` and `ROLE.key` (as `bulkhead tls
    /// init` writes them).
    #[arg(long, env = "BULKHEAD_TLS_DIR")]
    pub(crate) tls_dir: Option<PathBuf>,
    /// The platform CA's certificate (PEM); with --tls-cert and --tls-key,
    /// instead of --tls-dir.
    #[arg(long, env = "BULKHEAD_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// This component's certificate (PEM), naming its role.
    #[arg(long, env = "BULKHEAD_TLS_CERT")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// This component's private key (PEM, readable by it alone).
    #[arg(long, env = "BULKHEAD_TLS_KEY")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The tenant-context key ring (lines `KID HEX-KEY`; the gateway signs
    /// with the first, workers accept any); default: `context.keys` in
    /// --tls-dir. Gateways and workers that generate need it.
    #[arg(long, env = "BULKHEAD_CONTEXT_KEYS")]
    pub(crate) context_keys: Option<PathBuf>,
}

impl TlsArgs {
    /// The files of a component of `role`.
    pub(crate) fn files(&self, role: Role) -> anyhow::Result<TlsFiles> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key, &self.tls_dir) {
            (Some(ca), Some(cert), Some(key), _) => Ok(TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None, None, Some(dir)) => Ok(TlsFiles::in_dir(dir, role)),
            (None, None, None, None) => anyhow::bail!(
                "no TLS identity for this {role}: every internal connection is mutual TLS; \
                 give --tls-dir (`bulkhead tls init --dir DIR` creates one) or \
                 --tls-ca, --tls-cert and --tls-key"
            ),
            _ => {
                anyhow::bail!("give all three of --tls-ca, --tls-cert and --tls-key, or --tls-dir")
            }
        }
    }

    /// The tenant-context key ring.
    pub(crate) fn key_ring(&self) -> anyhow::Result<KeyRing> {
        let path = match (&self.context_keys, &self.tls_dir) {
            (Some(p), _) => p.clone(),
            (None, Some(dir)) => dir.join(CONTEXT_KEYS),
            (None, None) => anyhow::bail!(
                "no tenant-context keys: give --context-keys (`bulkhead tls init` writes \
                 context.keys) or --tls-dir"
            ),
        };
        Ok(KeyRing::load(&path)?)
    }

    /// Loads and checks the identity of a component of `role`.
    pub(crate) fn load(&self, role: Role) -> anyhow::Result<Identity> {
        let files = self.files(role)?;
        Identity::load(&files, role).with_context(|| format!("loading the {role} TLS identity"))
    }
}

/// `bulkhead tls init`: the CA, a certificate for every role and the
/// tenant-context key ring.
#[derive(Debug, Args)]
pub(crate) struct TlsInitArgs {
    /// Directory to write (0700; files 0600). Existing valid files are kept.
    #[arg(long)]
    dir: PathBuf,
}

pub(crate) fn init(args: &TlsInitArgs) -> anyhow::Result<()> {
    let mut created = bulkhead_trust::authority::init_dir(&args.dir, &Role::ALL)
        .with_context(|| format!("creating TLS identities in {}", args.dir.display()))?;
    let keys = args.dir.join(CONTEXT_KEYS);
    if KeyRing::create(&keys)? {
        created.written.push(keys);
    }
    for f in &created.written {
        println!("wrote {}", f.display());
    }
    if created.written.is_empty() {
        println!(
            "{}: every identity is present and valid",
            args.dir.display()
        );
    }
    Ok(())
}
