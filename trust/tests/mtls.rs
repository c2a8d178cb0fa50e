//! Mutual TLS over real sockets: a port admits only certificates from the
//! platform CA naming a role it admits, refusing everything else during the
//! handshake, before the application reads a byte; a client accepts only a
//! server of the role it meant to reach.

use bulkhead_trust::connect::dial;
use bulkhead_trust::{Identity, Role, TlsFiles, TlsListener, authority};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bulkhead-trust-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn identity(dir: &std::path::Path, role: Role) -> Identity {
    Identity::load(&TlsFiles::in_dir(dir, role), role).expect("identity")
}

/// A server admitting `admit` that answers "ok" to whatever it reads, and
/// a count of the connections that reached it.
async fn server(
    id: &Identity,
    admit: &[Role],
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Option<Role>>) {
    server_with(id, admit, bulkhead_trust::listen::MAX_HANDSHAKES).await
}

/// As [`server`], running at most `handshakes` handshakes at once.
async fn server_with(
    id: &Identity,
    admit: &[Role],
    handshakes: usize,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Option<Role>>) {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let acceptor = id.acceptor(admit).expect("acceptor");
    let mut l = TlsListener::with_handshake_limit(tcp, acceptor, handshakes).expect("listener");
    let addr = l.local_addr().to_string();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await;
            let _ = tx.send(bulkhead_trust::listen::peer_role(&s));
            let mut b = [0u8; 5];
            if s.read_exact(&mut b).await.is_ok() {
                let _ = s.write_all(b"ok").await;
                let _ = s.shutdown().await;
            }
        }
    });
    (addr, rx)
}

/// What a client gets: Ok("ok") or the error.
async fn talk(
    tls: &tokio_rustls::TlsConnector,
    expect: Role,
    addr: &str,
) -> Result<String, String> {
    let mut s = dial(tls, expect, addr).await.map_err(|e| e.to_string())?;
    s.write_all(b"hello").await.map_err(|e| e.to_string())?;
    s.flush().await.map_err(|e| e.to_string())?;
    let mut b = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut b)).await {
        Ok(Ok(_)) if b == b"ok" => Ok("ok".to_owned()),
        Ok(Ok(_)) => Err(format!("closed after {} bytes", b.len())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".to_owned()),
    }
}

#[tokio::test]
async fn a_port_admits_only_its_roles_from_the_platform_ca() {
    let (ours, theirs) = (dir("ours"), dir("theirs"));
    authority::init_dir(&ours, &Role::ALL).expect("our CA");
    authority::init_dir(&theirs, &Role::ALL).expect("another CA");
    let decode = identity(&ours, Role::Decode);
    let (addr, mut reached) = server(&decode, &[Role::Gateway, Role::Operator]).await;

    // The gateway, with our CA's certificate: served, and its role known.
    let gw = identity(&ours, Role::Gateway);
    let tls = gw.connector(&[Role::Decode]).expect("c");
    let ok = talk(&tls, Role::Decode, &addr).await;
    assert_eq!(ok.as_deref(), Ok("ok"));
    assert_eq!(reached.recv().await, Some(Some(Role::Gateway)));

    // No certificate, another CA's gateway certificate, our CA's prefill
    // certificate: each refused in the handshake; nothing reaches the app.
    let anonymous =
        tokio_rustls::TlsConnector::from(gw.anonymous_client_config(&[Role::Decode]).expect("c"));
    let foreign = tokio_rustls::TlsConnector::from(
        // Trusts our CA (so the client side completes) but presents theirs.
        mixed(&ours, &theirs, Role::Gateway),
    );
    let wrong_role = identity(&ours, Role::Prefill)
        .connector(&[Role::Decode])
        .expect("c");
    for (what, tls) in [
        ("no certificate", anonymous),
        ("another CA", foreign),
        ("wrong role", wrong_role),
    ] {
        let r = talk(&tls, Role::Decode, &addr).await;
        assert!(r.is_err(), "{what}: served: {r:?}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        reached.try_recv().is_err(),
        "a refused client reached the app"
    );

    // A client refuses a server of another role or another CA.
    let tls = gw.connector(&[Role::Prefill]).expect("c");
    let r = talk(&tls, Role::Prefill, &addr).await;
    assert!(r.as_ref().is_err_and(|e| e.contains("decode")), "{r:?}");
    let stranger = identity(&theirs, Role::Decode);
    let (addr2, _) = server(&stranger, &[Role::Gateway]).await;
    let tls = gw.connector(&[Role::Decode]).expect("c");
    let r = talk(&tls, Role::Decode, &addr2).await;
    assert!(r.is_err(), "a server from another CA was trusted: {r:?}");
    assert!(reached.try_recv().is_err());
}

/// A client config trusting `trust`'s CA and presenting `present`'s
/// certificate of `role`.
fn mixed(
    trust: &std::path::Path,
    present: &std::path::Path,
    role: Role,
) -> std::sync::Arc<rustls::ClientConfig> {
    let files = TlsFiles {
        ca: trust.join("ca.pem"),
        ..TlsFiles::in_dir(present, role)
    };
    // Loading checks the certificate against the CA, which it fails: build
    // the config by hand, as an attacker would.
    assert!(
        Identity::load(&files, role).is_err(),
        "a foreign certificate loaded"
    );
    presenting(&files)
}

/// An attacker's client config: presents the certificate and key in
/// `files`, accepts any server.
fn presenting(files: &TlsFiles) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_file_iter(&files.cert)
        .expect("cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&files.key).expect("key");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer(provider)))
        .with_client_auth_cert(chain, key)
        .expect("client auth");
    std::sync::Arc::new(cfg)
}

/// An attacker's client: accepts any server.
#[derive(Debug)]
struct AnyServer(std::sync::Arc<rustls::crypto::CryptoProvider>);

mod any_server {
    use super::AnyServer;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::CertificateDer as Cert;
    use rustls::{DigitallySignedStruct as Signed, Error, SignatureScheme, crypto};

    impl ServerCertVerifier for AnyServer {
        /// Whatever the server presents.
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(&self, m: &[u8], c: &Cert<'_>, d: &Signed) -> Valid {
            crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
        }

        fn verify_tls13_signature(&self, m: &[u8], c: &Cert<'_>, d: &Signed) -> Valid {
            crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    type Valid = Result<HandshakeSignatureValid, Error>;
}

#[tokio::test]
async fn init_dir_reuses_valid_files_and_writes_keys_owner_only() {
    let d = dir("reuse");
    let first = authority::init_dir(&d, &[Role::Gateway, Role::Decode]).expect("init");
    assert_eq!(first.written.len(), 6, "{first:?}");
    let again =
        authority::init_dir(&d, &[Role::Gateway, Role::Decode, Role::Prefill]).expect("init");
    assert_eq!(
        again.written,
        vec![d.join("prefill.key"), d.join("prefill.pem")],
        "only the new role is written"
    );
    #[cfg(unix)]
    for f in ["ca.key", "ca.pem", "gateway.key", "prefill.pem"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join(f))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // A certificate loaded as another role is refused at start-up.
    let e = Identity::load(&TlsFiles::in_dir(&d, Role::Gateway), Role::Decode)
        .expect_err("a gateway certificate is not a decode identity");
    assert!(e.to_string().contains("names gateway"), "{e}");
    // A CA whose key went missing is never silently replaced.
    std::fs::rename(d.join("ca.key"), d.join("ca.key.away")).expect("move");
    let e = authority::init_dir(&d, &[Role::Gateway]).expect_err("half a CA");
    assert!(e.to_string().contains("refusing to create a new CA"), "{e}");
    assert!(!d.join("ca.key").exists(), "no new CA key was written");
}

#[tokio::test]
async fn a_scoped_certificate_serves_only_its_model_and_meets_only_peers_of_it() {
    let d = dir("scoped");
    authority::init_dir(&d, &Role::ALL).expect("CA");
    let (a, b) = ("@cf/org/model-a", "@cf/org/model-b");
    let scoped = |role, model| {
        let scope = bulkhead_trust::Scope::model(model, Some(64 << 20));
        let (files, _) = authority::init_scoped(&d, role, &scope).expect("scoped");
        let id = Identity::load(&files, role).expect("identity");
        assert_eq!(
            id.scope(),
            &scope,
            "the scope reads back from the certificate"
        );
        id
    };
    let decode_a = scoped(Role::Decode, a);
    let decode_b = scoped(Role::Decode, b);
    assert!(decode_a.scope().allows_model(a) && !decode_a.scope().allows_model(b));
    assert!(decode_a.scope().allows_pool(64 << 20) && !decode_a.scope().allows_pool(65 << 20));
    // Reissued only when missing or scoped otherwise.
    let again = authority::init_scoped(&d, Role::Decode, decode_a.scope()).expect("again");
    assert!(again.1.written.is_empty(), "{:?}", again.1);
    let unscoped = identity(&d, Role::Decode);
    assert_eq!(unscoped.scope(), &bulkhead_trust::Scope::default());

    // The gateway calling for model A: A's worker and an unscoped one are
    // served; B's worker is refused in the handshake, before a byte is sent.
    let gw = identity(&d, Role::Gateway);
    let for_a = gw.connector_for_model(&[Role::Decode], a).expect("c");
    let (addr_a, mut reached_a) = server(&decode_a, &[Role::Gateway]).await;
    let (addr_b, mut reached_b) = server(&decode_b, &[Role::Gateway]).await;
    let (addr_any, _) = server(&unscoped, &[Role::Gateway]).await;
    assert_eq!(
        talk(&for_a, Role::Decode, &addr_a).await.as_deref(),
        Ok("ok")
    );
    assert!(reached_a.recv().await.is_some());
    assert_eq!(
        talk(&for_a, Role::Decode, &addr_any).await.as_deref(),
        Ok("ok")
    );
    let r = talk(&for_a, Role::Decode, &addr_b).await;
    assert!(
        r.as_ref().is_err_and(|e| e.contains(b) && e.contains(a)),
        "B's worker was reached for A: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(reached_b.try_recv().is_err(), "B's worker got a connection");

    // Worker to worker: A's prefill meets A's decode, refuses B's, both
    // ways.
    let prefill_a = scoped(Role::Prefill, a);
    let (addr_p, mut reached_p) = server(&prefill_a, &[Role::Decode]).await;
    let tls = decode_a.connector(&[Role::Prefill]).expect("c");
    let ok = talk(&tls, Role::Prefill, &addr_p).await;
    assert_eq!(ok.as_deref(), Ok("ok"));
    assert!(reached_p.recv().await.is_some());
    let tls = decode_b.connector(&[Role::Prefill]).expect("c");
    let r = talk(&tls, Role::Prefill, &addr_p).await;
    assert!(
        r.is_err(),
        "B's decode worker met A's prefill worker: {r:?}"
    );
    // The server decides on its own too: B's decode certificate, presented
    // by a client that would accept any server, is refused by A's prefill
    // worker in the handshake; A's is served.
    let tls = any_server_presenting(&d, Role::Decode, b);
    let r = talk(&tls, Role::Prefill, &addr_p).await;
    assert!(
        r.is_err(),
        "A's prefill worker served B's decode certificate: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        reached_p.try_recv().is_err(),
        "B's decode certificate reached A's prefill"
    );
    let tls = any_server_presenting(&d, Role::Decode, a);
    let r = talk(&tls, Role::Prefill, &addr_p).await;
    assert_eq!(r.as_deref(), Ok("ok"));
}

/// A client trusting any server, presenting the certificate of `role`
/// scoped to `model` (what the server-side check alone decides on).
fn any_server_presenting(
    d: &std::path::Path,
    role: Role,
    model: &str,
) -> tokio_rustls::TlsConnector {
    let scope = bulkhead_trust::Scope::model(model, Some(64 << 20));
    tokio_rustls::TlsConnector::from(presenting(&TlsFiles::scoped_in_dir(d, role, &scope)))
}

/// The platform CA of `dir`, as an issuer an operator's own tooling would
/// use (same subject, same key).
fn platform_ca(dir: &std::path::Path) -> rcgen::Issuer<'static, rcgen::KeyPair> {
    let key = std::fs::read_to_string(dir.join("ca.key")).expect("ca.key");
    let mut p = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "Bulkhead");
    dn.push(rcgen::DnType::CommonName, "Bulkhead platform CA");
    p.distinguished_name = dn;
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    rcgen::Issuer::new(p, rcgen::KeyPair::from_pem(&key).expect("key"))
}

/// Writes a certificate from `ca` with these subject alternative names
/// into `files`.
fn issue_with(ca: &rcgen::Issuer<'_, rcgen::KeyPair>, sans: Vec<rcgen::SanType>, files: &TlsFiles) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::default();
    p.subject_alt_names = sans;
    p.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    p.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    p.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    let cert = p.signed_by(&key, ca).expect("signed");
    std::fs::write(&files.cert, cert.pem()).expect("cert");
    std::fs::write(&files.key, key.serialize_pem()).expect("key");
}

#[tokio::test]
async fn a_role_comes_from_its_uri_never_from_a_dns_name_so_a_wildcard_is_no_gateway() {
    let d = dir("wildcard");
    authority::init_dir(&d, &Role::ALL).expect("init");
    let ca = platform_ca(&d);
    let dns = |n: &str| rcgen::SanType::DnsName(n.try_into().expect("dns"));
    let uri = |u: &str| rcgen::SanType::URI(u.try_into().expect("uri"));
    let worker = identity(&d, Role::Colocated);
    let (addr, mut reached) = server(&worker, &[Role::Gateway]).await;
    let cases = [
        // An ingress certificate from the same CA: every role's DNS name.
        ("wildcard", vec![dns("*.bulkhead.internal")]),
        // The gateway's DNS name without its role URI.
        ("dns-only", vec![dns("gateway.bulkhead.internal")]),
        // Two roles at once names none.
        (
            "two-roles",
            vec![
                dns("gateway.bulkhead.internal"),
                uri("urn:bulkhead:role:gateway"),
                uri("urn:bulkhead:role:operator"),
            ],
        ),
    ];
    for (name, sans) in cases {
        let files = TlsFiles {
            ca: d.join("ca.pem"),
            cert: d.join(format!("{name}.pem")),
            key: d.join(format!("{name}.key")),
        };
        issue_with(&ca, sans, &files);
        assert!(
            Identity::load(&files, Role::Gateway).is_err(),
            "{name}: loaded as a gateway"
        );
        let tls = tokio_rustls::TlsConnector::from(presenting(&files));
        let r = talk(&tls, Role::Colocated, &addr).await;
        assert!(r.is_err(), "{name}: admitted as a gateway: {r:?}");
    }
    assert!(reached.try_recv().is_err(), "no connection reached the app");
    // The CA's own gateway certificate, which carries the URI, is admitted.
    assert_gateway_served(&d, &addr).await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test]
async fn a_port_sheds_handshakes_past_its_limit_and_serves_again_when_they_end() {
    let d = dir("handshakes");
    authority::init_dir(&d, &Role::ALL).expect("init");
    let worker = identity(&d, Role::Colocated);
    let (addr, _reached) = server_with(&worker, &[Role::Gateway], 2).await;
    // Two connections that never say hello hold both slots...
    let idle: Vec<tokio::net::TcpStream> = vec![
        tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect"),
        tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect"),
    ];
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...so a third is closed at once, before any handshake.
    let mut third = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let mut b = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(2), third.read(&mut b)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the third connection was not shed: {read:?}"
    );
    // When the idle ones go, the gateway is served again.
    drop(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_gateway_served(&d, &addr).await;
    let _ = std::fs::remove_dir_all(&d);
}

/// The CA's own gateway certificate in `d` is served at `addr`.
async fn assert_gateway_served(d: &std::path::Path, addr: &str) {
    let gateway = identity(d, Role::Gateway);
    let tls = gateway.connector(&[Role::Colocated]).expect("connector");
    assert_eq!(talk(&tls, Role::Colocated, addr).await, Ok("ok".to_owned()));
}
