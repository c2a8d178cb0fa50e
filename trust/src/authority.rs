//! The platform's CA and the role certificates it issues.
//!
//! [`init_dir`] is what `up` and `bulkhead tls init` run: it creates, in one
//! directory, the CA (`ca.pem`, `ca.key`) and a certificate and key for
//! every role (`ROLE.pem`, `ROLE.key`), each written 0600, and on a later
//! run reuses every file that is still valid, reissuing only a missing,
//! expired or foreign role certificate. Operators with their own PKI give
//! each component its files instead (`--tls-ca`, `--tls-cert`,
//! `--tls-key`); a role certificate is any certificate from their CA whose
//! subject alternative names hold the URI `urn:bulkhead:role:ROLE` (exactly
//! one such URI) and the DNS name `ROLE.bulkhead.internal` (what clients
//! send as SNI). The URI decides the role: a DNS name, wildcard or not,
//! never does.
//! [`init_scoped`] issues a worker certificate scoped to a model (and a
//! pool bound) beside them: `ROLE.KEY.pem`, `ROLE.KEY.key`.

use crate::{Identity, Role, Scope, TlsFiles, TrustError};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

/// How long a CA `init_dir` creates is valid.
const CA_DAYS: i64 = 3650;
/// How long a role certificate is valid; `init_dir` reissues expired ones.
const ROLE_DAYS: i64 = 365;

/// The CA that `init_dir` creates: its subject, so a reloaded key signs
/// with the same issuer name.
fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Bulkhead");
    dn.push(DnType::CommonName, "Bulkhead platform CA");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

/// What [`init_dir`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Created {
    /// Files written this time (the rest were reused).
    pub written: Vec<PathBuf>,
}

/// Makes sure `dir` holds a CA and a valid certificate for every role in
/// `roles`, creating what is missing.
pub fn init_dir(dir: &Path, roles: &[Role]) -> Result<Created, TrustError> {
    create_dir(dir)?;
    let mut created = Created::default();
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    // Half a CA is never silently replaced: a new CA would make every
    // certificate the old one issued (other hosts' too) untrusted.
    if ca_pem.exists() != ca_key.exists() {
        let (there, missing) = if ca_pem.exists() {
            (&ca_pem, &ca_key)
        } else {
            (&ca_key, &ca_pem)
        };
        return Err(TrustError::Certificate(format!(
            "{} is here but {} is not: refusing to create a new CA over it (every certificate \
             the old one issued would stop being trusted); restore the missing file, or move \
             the other away to start a new CA",
            there.display(),
            missing.display()
        )));
    }
    let key = if ca_pem.exists() && ca_key.exists() {
        let pem = std::fs::read_to_string(&ca_key).map_err(|source| TrustError::Io {
            path: ca_key.display().to_string(),
            source,
        })?;
        KeyPair::from_pem(&pem)?
    } else {
        let key = KeyPair::generate()?;
        let mut params = ca_params();
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(CA_DAYS);
        let cert = params.self_signed(&key)?;
        write(&ca_key, key.serialize_pem().as_bytes(), &mut created)?;
        write(&ca_pem, cert.pem().as_bytes(), &mut created)?;
        key
    };
    let issuer = Issuer::new(ca_params(), key);
    for role in roles {
        let files = TlsFiles::in_dir(dir, *role);
        issue(&issuer, &files, *role, &Scope::default(), &mut created)?;
    }
    Ok(created)
}

/// Makes sure `dir` (which [`init_dir`] made) holds a valid certificate
/// for `role` scoped to exactly `scope`, in the files
/// [`TlsFiles::scoped_in_dir`] names, issuing one if it is missing,
/// expired or scoped otherwise. Returns the files and what was written.
pub fn init_scoped(
    dir: &Path,
    role: Role,
    scope: &Scope,
) -> Result<(TlsFiles, Created), TrustError> {
    let ca_key = dir.join("ca.key");
    let pem = std::fs::read_to_string(&ca_key).map_err(|source| TrustError::Io {
        path: ca_key.display().to_string(),
        source,
    })?;
    let issuer = Issuer::new(ca_params(), KeyPair::from_pem(&pem)?);
    let files = TlsFiles::scoped_in_dir(dir, role, scope);
    let mut created = Created::default();
    issue(&issuer, &files, role, scope, &mut created)?;
    Ok((files, created))
}

/// Issues a certificate for `role` scoped to `scope` into `files`, unless
/// a valid one of exactly that role and scope is there already.
fn issue(
    issuer: &Issuer<'_, KeyPair>,
    files: &TlsFiles,
    role: Role,
    scope: &Scope,
    created: &mut Created,
) -> Result<(), TrustError> {
    if files.cert.exists()
        && files.key.exists()
        && Identity::load(files, role).is_ok_and(|id| id.scope() == scope)
    {
        return Ok(());
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![role.dns_name()])?;
    params
        .subject_alt_names
        .push(SanType::URI(role.urn().as_str().try_into()?));
    for uri in scope.uris() {
        params
            .subject_alt_names
            .push(SanType::URI(uri.as_str().try_into()?));
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Bulkhead");
    dn.push(DnType::CommonName, role.dns_name());
    params.distinguished_name = dn;
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(ROLE_DAYS);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, issuer)?;
    write(&files.key, key.serialize_pem().as_bytes(), created)?;
    write(&files.cert, cert.pem().as_bytes(), created)?;
    let loaded = Identity::load(files, role)?;
    if loaded.scope() != scope {
        return Err(TrustError::Certificate(format!(
            "{}: issued for {} but reads as {}",
            files.cert.display(),
            scope.describe(),
            loaded.scope().describe()
        )));
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), TrustError> {
    let io = |source| TrustError::Io {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

/// Writes `bytes` readable by the owner only (a new file is never briefly
/// world-readable).
fn write(path: &Path, bytes: &[u8], created: &mut Created) -> Result<(), TrustError> {
    use std::io::Write;
    let io = |source| TrustError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    created.written.push(path.to_path_buf());
    Ok(())
}
