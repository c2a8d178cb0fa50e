//! What a worker certificate limits its holder to beyond its role: the
//! models it may serve and the largest KV pool it may claim.
//!
//! A scope travels in the certificate's subject alternative names as URIs
//! (`urn:bulkhead:model:SLUG`, one per model, and
//! `urn:bulkhead:kv-max-tokens:N`, in the tokens that routing and load
//! reports count), so it is signed by the platform CA like
//! the role. A certificate with no model URI may serve any model and one
//! with no pool URI may claim any pool: that is an operator's choice when
//! issuing; `up` and `bulkhead tls init --model` issue scoped ones.
//!
//! Who checks it: the control plane refuses a registration outside the
//! caller's scope; a client refuses, in the handshake, a server whose
//! certificate is scoped to none of the models it calls for (the gateway
//! per request model, a decode worker for its own model); a scoped server
//! refuses, in the handshake, a client scoped to none of its models.
//!
//! The control plane checks heartbeats too: a certificate keeps alive only
//! nodes of the models it may serve. A worker refuses to start with a
//! certificate scoped to another model than the one it loads. `up` issues every
//! worker a certificate scoped to its model and pool (`tls/ROLE.KEY.pem`);
//! `bulkhead tls init --model SLUG [--max-kv-tokens N]` issues them for
//! operators.

use rustls::pki_types::CertificateDer;

/// The URI prefix of a model a certificate may serve.
const MODEL_URN: &str = "urn:bulkhead:model:";
/// The URI prefix of the largest KV pool, in tokens, it may claim.
const KV_URN: &str = "urn:bulkhead:kv-max-tokens:";

/// A certificate's scope. The default is unscoped (any model, any pool).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    /// Models it may serve, by slug; empty: any.
    pub models: Vec<String>,
    /// The largest KV pool it may register, in tokens; `None`: any.
    pub max_kv_tokens: Option<u64>,
}

impl Scope {
    /// Scoped to one model, with a pool bound if given.
    pub fn model(slug: &str, max_kv_tokens: Option<u64>) -> Scope {
        Scope {
            models: vec![slug.to_owned()],
            max_kv_tokens,
        }
    }

    /// Whether it may serve `slug`.
    pub fn allows_model(&self, slug: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == slug)
    }

    /// Whether it may register a pool of `tokens`.
    pub fn allows_pool(&self, tokens: u64) -> bool {
        self.max_kv_tokens.is_none_or(|max| tokens <= max)
    }

    /// Whether a peer of this scope may serve at least one of `wanted`
    /// (always, when nothing is wanted or this scope names no model).
    pub fn serves_any(&self, wanted: &[String]) -> bool {
        wanted.is_empty() || wanted.iter().any(|w| self.allows_model(w))
    }

    /// The scope a certificate carries; `None` if it cannot be read, which
    /// every check refuses (a scope that cannot be read limits nothing
    /// that can be trusted).
    pub fn of(cert: &CertificateDer<'_>) -> Option<Scope> {
        let mut scope = Scope::default();
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let Some(san) = parsed.subject_alternative_name().ok()? else {
            return Some(scope);
        };
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                if let Some(slug) = uri.strip_prefix(MODEL_URN) {
                    scope.models.push(slug.to_owned());
                } else if let Some(n) = uri.strip_prefix(KV_URN) {
                    // An unreadable bound admits nothing rather than anything.
                    let n = n.parse().unwrap_or(0);
                    scope.max_kv_tokens = Some(scope.max_kv_tokens.map_or(n, |m: u64| m.min(n)));
                }
            }
        }
        Some(scope)
    }

    /// The URIs that carry it in a certificate.
    pub(crate) fn uris(&self) -> Vec<String> {
        let mut uris: Vec<String> = self
            .models
            .iter()
            .map(|m| format!("{MODEL_URN}{m}"))
            .collect();
        if let Some(n) = self.max_kv_tokens {
            uris.push(format!("{KV_URN}{n}"));
        }
        uris
    }

    /// A file-name-safe key for this scope's files (`ROLE.KEY.pem`): the
    /// models, readable, then a hash of their exact slugs (two slugs that
    /// read alike, such as `@cf/a-b/c` and `@cf/a/b-c`, differ in it).
    pub fn file_key(&self) -> String {
        let mut key = String::new();
        for m in &self.models {
            if !key.is_empty() {
                key.push('+');
            }
            let mut last_dash = true;
            for c in m.chars() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    key.push(c.to_ascii_lowercase());
                    last_dash = false;
                } else if !last_dash {
                    key.push('-');
                    last_dash = true;
                }
            }
            while key.ends_with('-') {
                key.pop();
            }
        }
        if key.is_empty() {
            key.push_str("any");
        }
        // FNV-1a over the slugs, each ended by a NUL: stable across builds.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for m in &self.models {
            for b in m.bytes().chain([0]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{key}-{:08x}", h >> 32)
    }

    /// How it reads in an error.
    pub fn describe(&self) -> String {
        let models = if self.models.is_empty() {
            "any model".to_owned()
        } else {
            self.models.join(", ")
        };
        match self.max_kv_tokens {
            Some(n) => format!("{models}, a KV pool of at most {n} tokens"),
            None => models,
        }
    }
}
