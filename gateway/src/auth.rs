//! Tenant authentication: `Authorization: Bearer <token>` where the token is
//! a tenant API token (`bhk_…`, looked up by its sha256 in the routing
//! table) or a JWT (HS256 with a configured secret; RS256 or EdDSA with
//! configured public keys). Every refusal is the same [`AuthError`] to the
//! client: it never says which check failed.
//!
//! A JWT is checked only with a key of the family its `alg` names (an RSA
//! public key is never used as an HMAC secret; `none` is refused), then for
//! `exp`, `nbf`, the configured `iss` and `aud`, and its account claim.

use crate::table::Table;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// Who a request runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The account id (32 hex digits).
    pub account_id: String,
    /// The tenant number workers tag its KV pages with.
    pub tenant: u64,
    /// The batch the credential was made for, when the batch runner calls
    /// with it: its calls run in the batch class, each line billed once.
    pub batch: Option<String>,
}

/// A refused credential. The variants are for logs and tests; clients see
/// only "authentication failed".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No bearer token.
    #[error("missing bearer token")]
    Missing,
    /// A token that is not valid (for any reason).
    #[error("invalid token")]
    Invalid,
}

/// The key families a JWT may be checked with. A token is verified only
/// with a key of the family its `alg` names, so an RSA public key can never
/// be used as an HMAC secret (algorithm confusion), and `none` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    Ed,
}

/// Public keys for RS256 and EdDSA tokens, from a JWKS document.
#[derive(Clone, Default)]
pub struct JwtKeys {
    keys: Vec<(Option<String>, Family, DecodingKey)>,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKeys")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl JwtKeys {
    /// Parses a JWKS document; RSA and Ed25519 keys are kept, others
    /// (symmetric `oct` keys, EC) are skipped, so a shared secret can never
    /// arrive through a key set.
    pub fn from_jwks(json: &str) -> Result<JwtKeys, String> {
        let set: JwkSet =
            serde_json::from_str(json).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            let family = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Family::Rsa,
                AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
                _ => continue,
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable JWKS key: {e}"))?;
            keys.push((jwk.common.key_id.clone(), family, key));
        }
        if keys.is_empty() {
            return Err("the JWKS document holds no RSA or Ed25519 key".to_owned());
        }
        Ok(JwtKeys { keys })
    }

    fn find(&self, family: Family, kid: Option<&str>) -> Option<&DecodingKey> {
        let mut of_family = self.keys.iter().filter(|(_, f, _)| *f == family);
        match kid {
            Some(kid) => of_family
                .find(|(k, _, _)| k.as_deref() == Some(kid))
                .map(|(_, _, key)| key),
            None => {
                let first = of_family.next()?;
                // Without a `kid` the key must be unambiguous.
                of_family.next().is_none().then_some(&first.2)
            }
        }
    }
}

/// How JWTs are checked. Without a secret and without keys, JWTs are
/// refused and only API tokens work.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    hs256: Option<DecodingKey>,
    keys: JwtKeys,
    /// Required `iss`.
    pub issuer: Option<String>,
    /// Required `aud`.
    pub audience: Option<String>,
    /// The claim that names the account.
    pub account_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

impl JwtConfig {
    /// A configuration; `hs256_secret` must not be empty when given.
    pub fn new(hs256_secret: Option<&[u8]>, keys: JwtKeys) -> Result<JwtConfig, String> {
        let hs256 = match hs256_secret {
            Some(s) if s.len() < 32 => {
                return Err("the HS256 secret must be at least 32 bytes".to_owned());
            }
            Some(s) => Some(DecodingKey::from_secret(s).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(JwtConfig {
            hs256,
            keys,
            issuer: None,
            audience: None,
            account_claim: "account_id".to_owned(),
            leeway_secs: 30,
        })
    }

    /// Whether any JWT could be accepted.
    pub fn enabled(&self) -> bool {
        self.hs256.is_some() || !self.keys.keys.is_empty()
    }

    fn verify(&self, token: &str) -> Result<String, AuthError> {
        let header = decode_header(token).map_err(|_| AuthError::Invalid)?;
        let kid = header.kid.as_deref();
        let key = match header.alg {
            Algorithm::HS256 => self.hs256.as_ref(),
            Algorithm::RS256 => self.keys.find(Family::Rsa, kid),
            Algorithm::EdDSA => self.keys.find(Family::Ed, kid),
            _ => None,
        }
        .ok_or(AuthError::Invalid)?;
        let mut v = Validation::new(header.alg);
        v.algorithms = vec![header.alg];
        v.validate_nbf = true;
        v.leeway = self.leeway_secs;
        let mut required: HashSet<String> = HashSet::from(["exp".to_owned()]);
        match &self.issuer {
            Some(iss) => {
                v.set_issuer(&[iss]);
                required.insert("iss".to_owned());
            }
            None => v.iss = None,
        }
        match &self.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.insert("aud".to_owned());
            }
            None => v.validate_aud = false,
        }
        v.required_spec_claims = required;
        let data = decode::<serde_json::Value>(token, key, &v).map_err(|_| AuthError::Invalid)?;
        data.claims
            .get(&self.account_claim)
            .and_then(|a| a.as_str())
            .map(str::to_owned)
            .ok_or(AuthError::Invalid)
    }
}

/// The bearer token of an `Authorization` header value, if well formed.
pub fn bearer(header: Option<&str>) -> Result<&str, AuthError> {
    let value = header.ok_or(AuthError::Missing)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Invalid)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || token.len() > 8192
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(AuthError::Invalid);
    }
    Ok(token)
}

/// Prefix of tenant API tokens.
pub const API_TOKEN_PREFIX: &str = "bhk_";

/// Authenticates a bearer token against the routing table and JWT config.
pub fn authenticate(
    token: &str,
    table: &Table,
    jwt: Option<&JwtConfig>,
) -> Result<Principal, AuthError> {
    let (account, batch) = if token.starts_with(API_TOKEN_PREFIX) {
        let hash = hex::encode(Sha256::digest(token.as_bytes()));
        table.token_account(&hash).ok_or(AuthError::Invalid)?
    } else {
        let jwt = jwt.filter(|j| j.enabled()).ok_or(AuthError::Invalid)?;
        let id = jwt.verify(token)?;
        (table.account(&id).ok_or(AuthError::Invalid)?, None)
    };
    Ok(Principal {
        account_id: account.id.clone(),
        tenant: account.tenant,
        batch: batch.map(str::to_owned),
    })
}
