//! The tenant context: what the gateway signs, per worker call, after it
//! authenticated the account. A worker takes the tenant from it and from
//! nothing else, and refuses a call whose context is missing, forged,
//! expired, replayed, for another model, or for more tokens than the
//! statement allows, before anything is allocated.
//!
//! The statement is JSON; the header is `v1.KID.PAYLOAD.MAC`, the payload
//! and the MAC in unpadded base64url, the MAC HMAC-SHA256 over
//! `v1.KID.PAYLOAD` with the key `KID` names in the platform's context key
//! ring ([`KeyRing`]). The gateway signs with the ring's first key; workers
//! accept any key in theirs, so a key is rotated by adding a new one first
//! everywhere, then dropping the old one.
//!
//! Gateways and workers share the ring, so a compromised worker could sign
//! contexts for other workers: it already holds its own tenants' data, and the
//! ring rotates.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header that carries the signed context to a worker.
pub const CONTEXT_HEADER: &str = "x-bulkhead-context";

/// How long a context is valid after the gateway signs it.
pub const CONTEXT_TTL: Duration = Duration::from_secs(30);

/// Clock difference between hosts tolerated for `issued_ms`.
const SKEW_MS: u64 = 5_000;

/// Longest header accepted.
const MAX_HEADER: usize = 4096;

/// What the gateway states about one worker call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantContext {
    /// The authenticated account (32 hex digits).
    pub account: String,
    /// The tenant number its KV pages are tagged with.
    pub tenant: u64,
    /// Unique per worker call (the request id and the attempt): a worker
    /// serves each at most once.
    pub request_id: String,
    /// The model slug the call is for.
    pub model: String,
    /// The active config version the gateway routed under.
    pub config_version: Option<u64>,
    /// Most tokens the call may generate.
    pub max_tokens: u64,
    /// The context window the call is held to (the model's configured one).
    pub context_limit: Option<u64>,
    /// When it was signed (ms since the Unix epoch).
    pub issued_ms: u64,
    /// When it stops being valid.
    pub expires_ms: u64,
}

/// Why a context was refused. The first three are 401 (not who it claims
/// to be); the rest 403 (who it claims, but not allowed this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// No header.
    #[error("no signed tenant context (x-bulkhead-context): only the gateway calls workers")]
    Missing,
    /// Not a context this platform signed (bad form, unknown key, wrong MAC).
    #[error("the tenant context is not signed by this platform's gateway")]
    Invalid,
    /// Past its expiry (or signed in the future).
    #[error("the tenant context has expired")]
    Expired,
    /// Its request id was served already.
    #[error("the tenant context was already used (request {0})")]
    Replayed(String),
    /// For another model than this worker serves.
    #[error("the tenant context is for {0}, not this worker's model")]
    WrongModel(String),
    /// The request asks for more than the context allows.
    #[error("the request exceeds the signed limits: {0}")]
    Limits(String),
}

impl ContextError {
    /// The HTTP status a worker answers with.
    pub fn status(&self) -> u16 {
        match self {
            ContextError::Missing | ContextError::Invalid | ContextError::Expired => 401,
            _ => 403,
        }
    }

    /// The error code in the API's format.
    pub fn code(&self) -> &'static str {
        match self {
            ContextError::Missing => "missing_context",
            ContextError::Invalid => "invalid_context",
            ContextError::Expired => "expired_context",
            ContextError::Replayed(_) => "replayed_context",
            ContextError::WrongModel(_) => "wrong_model",
            ContextError::Limits(_) => "limits_exceeded",
        }
    }
}

/// Why a key ring could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyRingError {
    /// The file could not be read or written.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A line is not `KID HEX-KEY` with a key of at least 32 bytes.
    #[error(
        "{0}: line {1} is not `KID HEX-KEY` (a key id of 1 to 32 letters, digits or -, and at least 32 bytes of key)"
    )]
    Format(String, usize),
    /// No key at all.
    #[error("{0}: no key")]
    Empty(String),
}

/// The platform's context keys: the first signs, every one verifies.
#[derive(Clone)]
pub struct KeyRing {
    keys: Vec<(String, hmac::Key)>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        let ids: Vec<&str> = self.keys.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KeyRing").field("kids", &ids).finish()
    }
}

impl KeyRing {
    /// Parses a ring file: one `KID HEX-KEY` per line, `#` comments.
    pub fn parse(text: &str, origin: &str) -> Result<KeyRing, KeyRingError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || KeyRingError::Format(origin.to_owned(), i + 1);
            let (kid, key_hex) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
            let kid_ok = !kid.is_empty()
                && kid.len() <= 32
                && kid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
            let key = hex::decode(key_hex.trim()).ok().filter(|k| k.len() >= 32);
            match (kid_ok, key) {
                (true, Some(key)) => {
                    keys.push((kid.to_owned(), hmac::Key::new(hmac::HMAC_SHA256, &key)));
                }
                _ => return Err(bad()),
            }
        }
        if keys.is_empty() {
            return Err(KeyRingError::Empty(origin.to_owned()));
        }
        Ok(KeyRing { keys })
    }

    /// A ring of one random key no one else holds: it verifies nothing any
    /// gateway signed (for a worker that serves no generate calls).
    pub fn ephemeral() -> KeyRing {
        let mut key = [0u8; 32];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key);
        KeyRing {
            keys: vec![(
                "ephemeral".to_owned(),
                hmac::Key::new(hmac::HMAC_SHA256, &key),
            )],
        }
    }

    /// Loads a ring file.
    pub fn load(path: &Path) -> Result<KeyRing, KeyRingError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| KeyRingError::Io(path.display().to_string(), e))?;
        KeyRing::parse(&text, &path.display().to_string())
    }

    /// Writes a new ring file with one random key (0600), unless one is
    /// there already. Returns whether it wrote.
    pub fn create(path: &Path) -> Result<bool, KeyRingError> {
        if path.exists() {
            return Ok(false);
        }
        let io = |e| KeyRingError::Io(path.display().to_string(), e);
        let mut key = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
            .map_err(|_| io(std::io::Error::other("no randomness")))?;
        let mut kid = [0u8; 4];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut kid)
            .map_err(|_| io(std::io::Error::other("no randomness")))?;
        let text = format!(
            "# Bulkhead tenant-context keys: `KID HEX-KEY`; the first signs.\n{} {}\n",
            hex::encode(kid),
            hex::encode(key)
        );
        write_private(path, text.as_bytes()).map_err(io)?;
        Ok(true)
    }

    /// Signs `ctx` with the first key: the header value.
    pub fn sign(&self, ctx: &TenantContext) -> String {
        let (kid, key) = &self.keys[0];
        let payload = B64.encode(serde_json::to_vec(ctx).unwrap_or_default());
        let signed = format!("v1.{kid}.{payload}");
        let tag = hmac::sign(key, signed.as_bytes());
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    }

    /// The statement in `header`, if one of this ring's keys signed it and
    /// it has not expired at `now`.
    pub fn verify(&self, header: &str, now: SystemTime) -> Result<TenantContext, ContextError> {
        if header.len() > MAX_HEADER {
            return Err(ContextError::Invalid);
        }
        let (signed, tag) = header.rsplit_once('.').ok_or(ContextError::Invalid)?;
        let mut parts = signed.splitn(3, '.');
        let (Some("v1"), Some(kid), Some(payload)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(ContextError::Invalid);
        };
        let key = self
            .keys
            .iter()
            .find(|(k, _)| k == kid)
            .map(|(_, key)| key)
            .ok_or(ContextError::Invalid)?;
        let tag = B64.decode(tag).map_err(|_| ContextError::Invalid)?;
        hmac::verify(key, signed.as_bytes(), &tag).map_err(|_| ContextError::Invalid)?;
        let json = B64.decode(payload).map_err(|_| ContextError::Invalid)?;
        let ctx: TenantContext =
            serde_json::from_slice(&json).map_err(|_| ContextError::Invalid)?;
        let now = millis(now);
        if now > ctx.expires_ms || ctx.issued_ms > now + SKEW_MS {
            return Err(ContextError::Expired);
        }
        Ok(ctx)
    }
}

impl TenantContext {
    /// A statement issued at `now`, valid for [`CONTEXT_TTL`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        account: &str,
        tenant: u64,
        request_id: String,
        model: &str,
        config_version: Option<u64>,
        max_tokens: u64,
        context_limit: Option<u64>,
        now: SystemTime,
    ) -> TenantContext {
        let issued_ms = millis(now);
        TenantContext {
            account: account.to_owned(),
            tenant,
            request_id,
            model: model.to_owned(),
            config_version,
            max_tokens,
            context_limit,
            issued_ms,
            expires_ms: issued_ms + CONTEXT_TTL.as_millis() as u64,
        }
    }
}

/// Request ids a worker has served, until their contexts expire: a context
/// is good for one call.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    seen: HashMap<String, u64>,
}

/// Most ids remembered; past it, the oldest expired ones go first, and a
/// worker that still has no room refuses (a flood of valid contexts can
/// only come from the gateway).
const MAX_SEEN: usize = 1 << 20;

impl ReplayGuard {
    /// Records `ctx`'s request id; refuses one seen before.
    pub fn admit(&mut self, ctx: &TenantContext, now: SystemTime) -> Result<(), ContextError> {
        let now = millis(now);
        if self.seen.len() >= MAX_SEEN / 2 {
            self.seen.retain(|_, expires| *expires >= now);
        }
        if self.seen.contains_key(&ctx.request_id) || self.seen.len() >= MAX_SEEN {
            return Err(ContextError::Replayed(ctx.request_id.clone()));
        }
        self.seen.insert(ctx.request_id.clone(), ctx.expires_ms);
        Ok(())
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        KeyRing::parse(&format!("k1 {}\n", "ab".repeat(32)), "test").expect("ring")
    }

    fn ctx(now: SystemTime) -> TenantContext {
        TenantContext::new(
            "a".repeat(32).as_str(),
            7,
            "r1".to_owned(),
            "@cf/x/y",
            Some(1),
            16,
            Some(2048),
            now,
        )
    }

    #[test]
    fn a_signed_context_verifies_and_every_change_is_refused() {
        let now = SystemTime::now();
        let r = ring();
        let h = r.sign(&ctx(now));
        assert_eq!(r.verify(&h, now), Ok(ctx(now)));
        // Tampered payload (tenant 7 -> 8), same MAC.
        let mut forged = ctx(now);
        forged.tenant = 8;
        let other = r.sign(&forged);
        let (_, tag) = h.rsplit_once('.').expect("tag");
        let (body, _) = other.rsplit_once('.').expect("tag");
        assert_eq!(
            r.verify(&format!("{body}.{tag}"), now),
            Err(ContextError::Invalid)
        );
        // Another platform's key.
        let theirs = KeyRing::parse(&format!("k1 {}\n", "cd".repeat(32)), "t").expect("ring");
        assert_eq!(theirs.verify(&h, now), Err(ContextError::Invalid));
        // Expired.
        let later = now + CONTEXT_TTL + Duration::from_secs(1);
        assert_eq!(r.verify(&h, later), Err(ContextError::Expired));
        // Garbage.
        for g in ["", "v1", "v1.k1.x.y", "v2.k1.e30.AAAA"] {
            assert_eq!(r.verify(g, now), Err(ContextError::Invalid), "{g}");
        }
    }

    #[test]
    fn a_rotated_ring_still_verifies_the_old_key() {
        let now = SystemTime::now();
        let old = ring();
        let h = old.sign(&ctx(now));
        let both = KeyRing::parse(
            &format!("k2 {}\nk1 {}\n", "ef".repeat(32), "ab".repeat(32)),
            "t",
        )
        .expect("ring");
        assert!(both.verify(&h, now).is_ok());
        assert!(both.sign(&ctx(now)).starts_with("v1.k2."));
    }

    #[test]
    fn a_request_id_is_served_once() {
        let now = SystemTime::now();
        let mut g = ReplayGuard::default();
        assert_eq!(g.admit(&ctx(now), now), Ok(()));
        assert!(matches!(
            g.admit(&ctx(now), now),
            Err(ContextError::Replayed(_))
        ));
    }

    #[test]
    fn short_or_malformed_keys_are_refused() {
        assert!(KeyRing::parse("k1 abcd\n", "t").is_err());
        assert!(KeyRing::parse(&format!("bad/kid {}\n", "ab".repeat(32)), "t").is_err());
        assert!(KeyRing::parse("# nothing\n", "t").is_err());
    }
}
