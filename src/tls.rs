//! The TLS flags every internal component takes, and `bulkhead tls init`.
//!
//! A component finds its identity in `--tls-dir` (`ca.pem`, `ROLE.pem`,
//! `ROLE.key`, as `bulkhead tls init` and `up` write them) or in the three
//! files `--tls-ca`, `--tls-cert`, `--tls-key` (what the Kubernetes
//! manifests mount from Secrets). There is no flag to turn TLS off: a
//! component without an identity does not start.

use anyhow::Context;
use bulkhead_trust::{Identity, Role, TlsFiles};
use bulkhead_worker_api::context::{SigningKey, VerifyingKeys};
use clap::Args;
use std::path::PathBuf;

/// The tenant-context signing key's file name in a TLS directory (the
/// gateway's alone).
pub(crate) const CONTEXT_SIGN: &str = "context.sign";
/// The tenant-context verifying keys' file name in a TLS directory.
pub(crate) const CONTEXT_PUB: &str = "context.pub";

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
    /// The gateway's tenant-context signing key (`KID SEED`, Ed25519);
    /// default: `context.sign` in --tls-dir. Only gateways read it.
    #[arg(long, env = "BULKHEAD_CONTEXT_SIGN_KEY")]
    pub(crate) context_sign_key: Option<PathBuf>,
    /// The tenant-context verifying keys (lines `KID PUBLIC-KEY`; any
    /// verifies); default: `context.pub` in --tls-dir. Workers need it.
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

    /// The gateway's tenant-context signing key.
    pub(crate) fn signing_key(&self) -> anyhow::Result<SigningKey> {
        let path = match (&self.context_sign_key, &self.tls_dir) {
            (Some(p), _) => p.clone(),
            (None, Some(dir)) => dir.join(CONTEXT_SIGN),
            (None, None) => anyhow::bail!(
                "no tenant-context signing key: give --context-sign-key (`bulkhead tls init` \
                 writes context.sign) or --tls-dir"
            ),
        };
        Ok(SigningKey::load(&path)?)
    }

    /// The tenant-context verifying keys a worker accepts.
    pub(crate) fn verifying_keys(&self) -> anyhow::Result<VerifyingKeys> {
        let path = match (&self.context_keys, &self.tls_dir) {
            (Some(p), _) => p.clone(),
            (None, Some(dir)) => dir.join(CONTEXT_PUB),
            (None, None) => anyhow::bail!(
                "no tenant-context verifying keys: give --context-keys (`bulkhead tls init` \
                 writes context.pub) or --tls-dir"
            ),
        };
        Ok(VerifyingKeys::load(&path)?)
    }

    /// Loads and checks the identity of a component of `role`.
    pub(crate) fn load(&self, role: Role) -> anyhow::Result<Identity> {
        let files = self.files(role)?;
        Identity::load(&files, role).with_context(|| format!("loading the {role} TLS identity"))
    }

    /// Loads the identity of a worker of `role` serving `model`: a
    /// certificate scoped to other models is refused before anything is
    /// loaded or bound (the control plane and its peers would refuse it).
    pub(crate) fn load_worker(&self, role: Role, model: &str) -> anyhow::Result<Identity> {
        let id = self.load(role)?;
        if !id.scope().allows_model(model) {
            anyhow::bail!(
                "{}: this {role} certificate is for {}, not {model}",
                self.files(role)?.cert.display(),
                id.scope().describe()
            );
        }
        Ok(id)
    }
}

/// `bulkhead tls init`: the CA, a certificate for every role and the
/// tenant-context key ring; with `--model`, worker certificates scoped to
/// that model too.
#[derive(Debug, Args)]
pub(crate) struct TlsInitArgs {
    /// Directory to write (0700; files 0600). Existing valid files are kept.
    #[arg(long)]
    dir: PathBuf,
    /// Also issue prefill, decode and colocated certificates that may serve
    /// only this model (`ROLE.KEY.pem`, `ROLE.KEY.key`); repeatable.
    #[arg(long)]
    model: Vec<String>,
    /// With --model: the largest KV pool those certificates may register,
    /// in tokens (what a worker reports as `kv_pool_tokens`).
    #[arg(long, requires = "model")]
    max_kv_tokens: Option<u64>,
}

/// The roles whose certificates may be scoped to a model.
pub(crate) const WORKER_ROLES: [Role; 3] = [Role::Prefill, Role::Decode, Role::Colocated];

pub(crate) fn init(args: &TlsInitArgs) -> anyhow::Result<()> {
    let mut created = bulkhead_trust::authority::init_dir(&args.dir, &Role::ALL)
        .with_context(|| format!("creating TLS identities in {}", args.dir.display()))?;
    for model in &args.model {
        model
            .parse::<bulkhead_control_api::ModelSlug>()
            .map_err(|e| anyhow::anyhow!("--model {model}: {e}"))?;
        let scope = bulkhead_trust::Scope::model(model, args.max_kv_tokens);
        for role in WORKER_ROLES {
            let (_, more) = bulkhead_trust::authority::init_scoped(&args.dir, role, &scope)
                .with_context(|| format!("issuing the {role} certificate for {model}"))?;
            created.written.extend(more.written);
        }
    }
    created.written.extend(SigningKey::create(
        &args.dir.join(CONTEXT_SIGN),
        &args.dir.join(CONTEXT_PUB),
    )?);
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
