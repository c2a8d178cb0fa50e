//! The TLS flags every internal component takes, and `bulkhead tls init`.
//!
//! A component finds its identity in `--tls-dir` (`ca.pem`, `ROLE.pem`,
//! `ROLE.key`: its bundle, `DIR/bundles/NAME`, as `bulkhead tls init` and
//! `up` write them) or in the three files `--tls-ca`, `--tls-cert`,
//! `--tls-key` (what the Kubernetes manifests mount from Secrets). There is
//! no flag to turn TLS off: a component without an identity does not start.
//!
//! A bundle holds one component's secrets and nothing else: its
//! certificate and key, the CA certificate, and the tenant-context
//! verifying keys (`context.pub`; the gateway's also the signing key,
//! `context.sign`). The CA key stays in the top directory, in no bundle.

use anyhow::Context;
use bulkhead_trust::{Identity, Role, TlsFiles};
use bulkhead_worker_api::context::{SigningKey, VerifyingKeys};
use clap::Args;
use std::path::{Path, PathBuf};

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
        let path = self.key_file(self.context_sign_key.as_ref(), CONTEXT_SIGN, "signing key")?;
        Ok(SigningKey::load(&path)?)
    }

    /// The tenant-context verifying keys a worker accepts.
    pub(crate) fn verifying_keys(&self) -> anyhow::Result<VerifyingKeys> {
        let path = self.key_file(self.context_keys.as_ref(), CONTEXT_PUB, "verifying keys")?;
        Ok(VerifyingKeys::load(&path)?)
    }

    /// A context key file: the flag's, else `name` in --tls-dir.
    fn key_file(&self, flag: Option<&PathBuf>, name: &str, what: &str) -> anyhow::Result<PathBuf> {
        match (flag, &self.tls_dir) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(dir)) => Ok(dir.join(name)),
            (None, None) => anyhow::bail!(
                "no tenant-context {what}: give their flag (`bulkhead tls init` writes {name} \
                 into each bundle that needs it) or --tls-dir"
            ),
        }
    }

    /// Loads and checks the identity of a component of `role`.
    pub(crate) fn load(&self, role: Role) -> anyhow::Result<Identity> {
        if let Some(dir) = &self.tls_dir
            && dir.join("ca.key").exists()
        {
            tracing::warn!(
                dir = %dir.display(),
                "this TLS directory holds the CA key (and every role's key): give each \
                 component only its bundle, DIR/bundles/{role}"
            );
        }
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

/// Where the bundle named `name` (a role, or `ROLE.KEY` for a scoped
/// worker certificate) lives in the TLS directory `dir`.
pub(crate) fn bundle_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join("bundles").join(name)
}

/// Writes (or refreshes) the bundle `name` of a component of `role` whose
/// certificate and key are `files`, from the TLS directory `dir`: the CA
/// certificate, the certificate and key as `ROLE.pem` and `ROLE.key`, and
/// the context keys the role uses. Returns its directory.
pub(crate) fn write_bundle(
    dir: &Path,
    name: &str,
    role: Role,
    files: &TlsFiles,
) -> anyhow::Result<PathBuf> {
    let out = bundle_dir(dir, name);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for d in [dir.join("bundles"), out.clone()] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("restricting {}", d.display()))?;
        }
    }
    let mut copies = vec![
        (files.ca.clone(), "ca.pem".to_owned()),
        (files.cert.clone(), format!("{role}.pem")),
        (files.key.clone(), format!("{role}.key")),
    ];
    match role {
        Role::Gateway => {
            copies.push((dir.join(CONTEXT_SIGN), CONTEXT_SIGN.to_owned()));
            copies.push((dir.join(CONTEXT_PUB), CONTEXT_PUB.to_owned()));
        }
        Role::ControlPlane | Role::Prefill | Role::Decode | Role::Colocated => {
            copies.push((dir.join(CONTEXT_PUB), CONTEXT_PUB.to_owned()));
        }
        Role::Operator | Role::BatchRunner => {}
    }
    for (from, to) in copies {
        let to = out.join(to);
        // Copied with the source's 0600 mode; replaced whole.
        let tmp = to.with_extension("tmp");
        std::fs::copy(&from, &tmp)
            .with_context(|| format!("copying {} into {}", from.display(), out.display()))?;
        std::fs::rename(&tmp, &to).with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(out)
}

/// Writes every role's bundle from the TLS directory `dir`.
pub(crate) fn write_role_bundles(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Role::ALL
        .into_iter()
        .map(|role| write_bundle(dir, role.as_str(), role, &TlsFiles::in_dir(dir, role)))
        .collect()
}

/// The roles whose certificates may be scoped to a model.
pub(crate) const WORKER_ROLES: [Role; 3] = [Role::Prefill, Role::Decode, Role::Colocated];

pub(crate) fn init(args: &TlsInitArgs) -> anyhow::Result<()> {
    let mut created = bulkhead_trust::authority::init_dir(&args.dir, &Role::ALL)
        .with_context(|| format!("creating TLS identities in {}", args.dir.display()))?;
    let mut scoped = Vec::new();
    for model in &args.model {
        model
            .parse::<bulkhead_control_api::ModelSlug>()
            .map_err(|e| anyhow::anyhow!("--model {model}: {e}"))?;
        let scope = bulkhead_trust::Scope::model(model, args.max_kv_tokens);
        for role in WORKER_ROLES {
            let (files, more) = bulkhead_trust::authority::init_scoped(&args.dir, role, &scope)
                .with_context(|| format!("issuing the {role} certificate for {model}"))?;
            created.written.extend(more.written);
            scoped.push((role, files));
        }
    }
    created.written.extend(SigningKey::create(
        &args.dir.join(CONTEXT_SIGN),
        &args.dir.join(CONTEXT_PUB),
    )?);
    let mut bundles = write_role_bundles(&args.dir)?;
    for (role, files) in &scoped {
        let name = files
            .cert
            .file_stem()
            .and_then(|s| s.to_str())
            .context("a certificate file name is UTF-8")?;
        bundles.push(write_bundle(&args.dir, name, *role, files)?);
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
    // What to hand each component: its bundle, never the directory.
    for b in &bundles {
        println!("bundle {}", b.display());
    }
    println!(
        "give each component only its bundle (--tls-dir BUNDLE); keep {} offline",
        args.dir.join("ca.key").display()
    );
    Ok(())
}
