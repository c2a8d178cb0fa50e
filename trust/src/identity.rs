//! A component's identity: the platform CA it trusts, its certificate chain
//! and its private key, loaded once at start-up and checked then (the
//! certificate must chain to the CA and name the component's role), so a
//! wrong file is a clear error before any port is bound.

use crate::verify::{AdmitRoles, ExpectRoles};
use crate::{Role, Scope, TrustError};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a component's CA, certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The platform CA's certificate (PEM).
    pub ca: PathBuf,
    /// This component's certificate, then any intermediates (PEM).
    pub cert: PathBuf,
    /// This component's private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files `bulkhead tls init` writes for `role` in `dir`:
    /// `ca.pem`, `ROLE.pem`, `ROLE.key`.
    pub fn in_dir(dir: &Path, role: Role) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{role}.pem")),
            key: dir.join(format!("{role}.key")),
        }
    }

    /// The files [`crate::authority::init_scoped`] writes for `role`
    /// scoped to `scope` in `dir`: `ca.pem`, `ROLE.KEY.pem`,
    /// `ROLE.KEY.key` (`KEY` from the scope's models).
    pub fn scoped_in_dir(dir: &Path, role: Role, scope: &crate::Scope) -> TlsFiles {
        let key = scope.file_key();
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{role}.{key}.pem")),
            key: dir.join(format!("{role}.{key}.key")),
        }
    }
}

/// A loaded identity. Cheap to clone.
#[derive(Clone)]
pub struct Identity {
    role: Role,
    scope: Scope,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Identity")
            .field("role", &self.role)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads and checks the identity of a component of `role`.
    pub fn load(files: &TlsFiles, role: Role) -> Result<Identity, TrustError> {
        let ca = read(&files.ca)?;
        let mut roots = RootCertStore::empty();
        let mut n = 0;
        for c in CertificateDer::pem_slice_iter(&ca) {
            let c = c.map_err(|e| pem(&files.ca, &e))?;
            roots.add(c).map_err(|e| TrustError::Pem {
                path: files.ca.display().to_string(),
                what: format!("not a usable CA certificate: {e}"),
            })?;
            n += 1;
        }
        if n == 0 {
            return Err(TrustError::Pem {
                path: files.ca.display().to_string(),
                what: "no certificate in the file".to_owned(),
            });
        }
        let chain = CertificateDer::pem_slice_iter(&read(&files.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem(&files.cert, &e))?;
        if chain.is_empty() {
            return Err(TrustError::Pem {
                path: files.cert.display().to_string(),
                what: "no certificate in the file".to_owned(),
            });
        }
        let key =
            PrivateKeyDer::from_pem_slice(&read(&files.key)?).map_err(|e| pem(&files.key, &e))?;
        let scope = Scope::of(&chain[0]).ok_or_else(|| TrustError::Pem {
            path: files.cert.display().to_string(),
            what: "its subject alternative names cannot be read".to_owned(),
        })?;
        let id = Identity {
            role,
            scope,
            roots: Arc::new(roots),
            chain,
            key: Arc::new(key),
            provider: Arc::new(provider()),
        };
        id.check(&files.cert)?;
        Ok(id)
    }

    /// The role this identity names.
    pub fn role(&self) -> Role {
        self.role
    }

    /// What its certificate limits it to beyond its role.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The configuration of a server that admits only clients whose
    /// certificate names one of `admit` (and, when this identity is scoped
    /// to models, is scoped to one of them too).
    pub fn server_config(&self, admit: &[Role]) -> Result<Arc<ServerConfig>, TrustError> {
        let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&self.roots),
            Arc::clone(&self.provider),
        )
        .build()
        .map_err(|e| TrustError::Certificate(e.to_string()))?;
        let verifier = Arc::new(AdmitRoles {
            inner,
            admit: admit.to_vec(),
            models: self.scope.models.clone(),
        });
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = Vec::new();
        Ok(Arc::new(config))
    }

    /// The configuration of a client that presents this identity and
    /// accepts only a server whose certificate names one of `expect` (and,
    /// when this identity is scoped to models, is scoped to one of them).
    pub fn client_config(&self, expect: &[Role]) -> Result<Arc<ClientConfig>, TrustError> {
        self.client_config_for(expect, &self.scope.models)
    }

    /// The configuration of a client that presents this identity and
    /// accepts only a server whose certificate names one of `expect` and
    /// may serve one of `models` (any server, when `models` is empty).
    pub fn client_config_for(
        &self,
        expect: &[Role],
        models: &[String],
    ) -> Result<Arc<ClientConfig>, TrustError> {
        let inner = self.server_verifier()?;
        let verifier = Arc::new(ExpectRoles {
            inner,
            expect: expect.to_vec(),
            models: models.to_vec(),
        });
        let config = ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())?;
        Ok(Arc::new(config))
    }

    /// A client configuration that presents no certificate (tests of the
    /// refusals; operators' tools reading a public port).
    pub fn anonymous_client_config(
        &self,
        expect: &[Role],
    ) -> Result<Arc<ClientConfig>, TrustError> {
        let verifier = Arc::new(ExpectRoles {
            inner: self.server_verifier()?,
            expect: expect.to_vec(),
            models: Vec::new(),
        });
        let config = ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// The acceptor of a server port that admits `admit`.
    pub fn acceptor(&self, admit: &[Role]) -> Result<tokio_rustls::TlsAcceptor, TrustError> {
        Ok(tokio_rustls::TlsAcceptor::from(self.server_config(admit)?))
    }

    /// The connector of a client that expects a server of `expect`.
    pub fn connector(&self, expect: &[Role]) -> Result<tokio_rustls::TlsConnector, TrustError> {
        Ok(tokio_rustls::TlsConnector::from(
            self.client_config(expect)?,
        ))
    }

    /// The connector of a client that expects a server of `expect` that
    /// may serve `model`.
    pub fn connector_for_model(
        &self,
        expect: &[Role],
        model: &str,
    ) -> Result<tokio_rustls::TlsConnector, TrustError> {
        Ok(tokio_rustls::TlsConnector::from(
            self.client_config_for(expect, &[model.to_owned()])?,
        ))
    }

    fn server_verifier(&self) -> Result<Arc<rustls::client::WebPkiServerVerifier>, TrustError> {
        rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::clone(&self.roots),
            Arc::clone(&self.provider),
        )
        .build()
        .map_err(|e| TrustError::Certificate(e.to_string()))
    }

    /// The certificate chains to the CA, is valid now and names the role.
    fn check(&self, path: &Path) -> Result<(), TrustError> {
        let verifier = self.server_verifier()?;
        let name = ServerName::try_from(self.role.dns_name())
            .map_err(|e| TrustError::Certificate(e.to_string()))?;
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(
                &self.chain[0],
                &self.chain[1..],
                &name,
                &[],
                UnixTime::now(),
            )
            .map_err(|e| {
                let named = crate::verify::role_of(&self.chain[0])
                    .map_or_else(String::new, |r| format!(" (it names {r})"));
                TrustError::Certificate(format!(
                    "{}: not a valid {} certificate from the platform CA{named}: {e}",
                    path.display(),
                    self.role
                ))
            })?;
        let named = crate::verify::role_of(&self.chain[0]);
        if named != Some(self.role) {
            return Err(TrustError::Certificate(format!(
                "{}: not a {} certificate: its subject alternative names {} (a role is the URI {})",
                path.display(),
                self.role,
                named.map_or_else(|| "name no role".to_owned(), |r| format!("name {r}")),
                self.role.urn()
            )));
        }
        Ok(())
    }
}

/// ring's suites, AES-128-GCM first: every hop is between our own
/// components, and it moves KV pages faster than AES-256 at the same
/// security margin for a connection's lifetime.
fn provider() -> CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    p
}

/// The name to send as SNI: the role the client expects first.
pub(crate) fn sni(expect: Role) -> ServerName<'static> {
    ServerName::try_from(expect.dns_name())
        .unwrap_or_else(|_| ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into()))
}

fn read(path: &Path) -> Result<Vec<u8>, TrustError> {
    std::fs::read(path).map_err(|source| TrustError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn pem(path: &Path, e: &rustls::pki_types::pem::Error) -> TrustError {
    TrustError::Pem {
        path: path.display().to_string(),
        what: e.to_string(),
    }
}
