//! Certificate verifiers that check a peer's role as well as its chain to
//! the platform CA. rustls' own verifiers check the chain (and, for servers,
//! the name the client dialled); these wrap them and decide by role.

use crate::{Role, Scope};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use std::sync::Arc;

/// The role a certificate names: exactly one `urn:bulkhead:role:ROLE` URI
/// in its subject alternative names (none, two, or an unknown one: no
/// role). DNS names decide nothing, so a wildcard certificate is never a
/// gateway. The chain is not checked here: only a certificate a verifier
/// accepted is asked.
pub(crate) fn role_of(cert: &CertificateDer<'_>) -> Option<Role> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    let mut named = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(uri) => uri.strip_prefix(crate::ROLE_URN),
        _ => None,
    });
    let role = Role::parse(named.next()?)?;
    named.next().is_none().then_some(role)
}

fn refused(what: String) -> Error {
    Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        RoleError(what),
    ))))
}

/// A certificate that chains to the CA but names a role this hop refuses.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RoleError(String);

fn roles(list: &[Role]) -> String {
    list.iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Server side: the client must present a certificate from the platform CA
/// naming one of `admit`, scoped to one of `models` if any are given.
#[derive(Debug)]
pub(crate) struct AdmitRoles {
    pub(crate) inner: Arc<dyn ClientCertVerifier>,
    pub(crate) admit: Vec<Role>,
    pub(crate) models: Vec<String>,
}

/// The refusal of a peer whose certificate is scoped to none of `models`.
fn check_scope(cert: &CertificateDer<'_>, models: &[String], who: &str) -> Result<(), Error> {
    let Some(scope) = Scope::of(cert) else {
        return Err(refused(format!(
            "the {who}'s certificate's subject alternative names cannot be read"
        )));
    };
    if scope.serves_any(models) {
        Ok(())
    } else {
        Err(refused(format!(
            "the {who}'s certificate is for {}, not {}",
            scope.describe(),
            models.join(" or ")
        )))
    }
}

/// The handshake-signature checks, left to the WebPKI verifier in `inner`:
/// a role is checked on top of the platform CA, never instead of it.
macro_rules! signatures_by_inner {
    () => {
        signatures_by_inner!(verify_tls12_signature, verify_tls13_signature);

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    };
    ($($check:ident),+) => {
        $(
            fn $check(
                &self,
                message: &[u8],
                cert: &CertificateDer<'_>,
                dss: &DigitallySignedStruct,
            ) -> Result<HandshakeSignatureValid, Error> {
                self.inner.$check(message, cert, dss)
            }
        )+
    };
}

impl ClientCertVerifier for AdmitRoles {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        match role_of(end_entity) {
            Some(r) if self.admit.contains(&r) => {
                check_scope(end_entity, &self.models, "client")?;
                Ok(verified)
            }
            Some(r) => Err(refused(format!(
                "a {r} certificate may not use this port (it admits {})",
                roles(&self.admit)
            ))),
            None => Err(refused(format!(
                "the certificate names no Bulkhead role (this port admits {})",
                roles(&self.admit)
            ))),
        }
    }

    signatures_by_inner!();
}

/// Client side: the server must present a certificate from the platform CA
/// naming one of `expect`, whatever address was dialled (workers are
/// reached by address; what matters is what they are), scoped to one of
/// `models` if any are given.
#[derive(Debug)]
pub(crate) struct ExpectRoles {
    pub(crate) inner: Arc<rustls::client::WebPkiServerVerifier>,
    pub(crate) expect: Vec<Role>,
    pub(crate) models: Vec<String>,
}

impl ServerCertVerifier for ExpectRoles {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let mut last = None;
        let named = role_of(end_entity);
        for role in &self.expect {
            let name =
                ServerName::try_from(role.dns_name()).map_err(|e| Error::General(e.to_string()))?;
            match self.inner.verify_server_cert(
                end_entity,
                intermediates,
                &name,
                ocsp_response,
                now,
            ) {
                // The chain and the name hold; the role is the URI's.
                Ok(v) if named == Some(*role) => {
                    check_scope(end_entity, &self.models, "server")?;
                    return Ok(v);
                }
                Ok(_) => last = Some(Error::InvalidCertificate(CertificateError::NotValidForName)),
                Err(e) => last = Some(e),
            }
        }
        match last {
            // Chains to the CA but names another role.
            Some(Error::InvalidCertificate(CertificateError::NotValidForName))
            | Some(Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                ..
            })) => Err(refused(format!(
                "the server's certificate names {}, not {}",
                role_of(end_entity).map_or("no Bulkhead role", Role::as_str),
                roles(&self.expect)
            ))),
            Some(e) => Err(e),
            None => Err(refused("no role expected".to_owned())),
        }
    }

    signatures_by_inner!();
}
