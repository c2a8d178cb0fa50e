//! The tenant context: what the gateway signs, per worker call, after it
//! authenticated the account. A worker takes the tenant from it and from
//! nothing else, and refuses a call whose context is missing, forged,
//! expired, replayed, for another model, or for more tokens than the
//! statement allows, before anything is allocated.
//!
//! The statement is JSON; the header is `v2.KID.PAYLOAD.SIGNATURE`, the
//! payload and the signature in unpadded base64url, the signature Ed25519
//! over `v2.KID.PAYLOAD` with the gateway's signing key ([`SigningKey`]).
//! Workers hold only public keys ([`VerifyingKeys`]), so no worker, however
//! compromised, can make a context another worker accepts. A context names
//! its audience (the model and the API it is for) and lives at most
//! [`CONTEXT_TTL`]; a decode worker forwards it to prefill, which takes the
//! tenant and the cache namespace from it alone.

mod keys;
mod replay;

pub use keys::{KeyFileError, SigningKey, VerifyingKeys};
pub use replay::{MAX_SEEN, ReplayGuard};

use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header that carries the signed context to a worker.
pub const CONTEXT_HEADER: &str = "x-bulkhead-context";

/// How long a context is valid after the gateway signs it.
pub const CONTEXT_TTL: Duration = Duration::from_secs(30);

/// Clock difference between hosts tolerated for `issued_ms`.
pub const SKEW_MS: u64 = 5_000;

/// Longest header accepted.
pub const MAX_HEADER: usize = 4096;

/// What a context is for: the worker API the gateway called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Audience {
    /// `POST /v1/generate` on a decode or colocated worker (and the prefill
    /// request a decode worker forwards it in).
    Generate,
    /// `POST /v1/embed` on an embedding worker.
    Embed,
}

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
    /// The model slug the call is for (with `audience`, who may act on it).
    pub model: String,
    /// The API the call is for.
    pub audience: Audience,
    /// Which of the request's `n` choices this call is: its worker bills
    /// the prompt only for choice 0, so a request's prompt is billed once.
    #[serde(default)]
    pub choice: u32,
    /// The active config version the gateway routed under.
    pub config_version: Option<u64>,
    /// Most tokens the call may generate.
    pub max_tokens: u64,
    /// The context window the call is held to (the model's configured one).
    pub context_limit: Option<u64>,
    /// Whether its prompt work goes before or after interactive work
    /// (OpenAI's `service_tier: "flex"` asks for after).
    #[serde(default, skip_serializing_if = "WorkClass::is_interactive")]
    pub class: WorkClass,
    /// The ledger key the call bills under beside its id, when one work
    /// item may be run more than once (a batch line after the batch
    /// runner restarted: `batch:<id>:<line>:<choice>`). The ledger counts
    /// one call per key, however many calls carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bill_as: Option<String>,
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
    /// For another API than the one called.
    #[error("the tenant context is for another API ({0:?})")]
    WrongAudience(Audience),
    /// A forwarded context names another tenant than the request.
    #[error("the request's tenant or cache scope differs from its signed context")]
    Mismatch,
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
            ContextError::WrongAudience(_) => "wrong_audience",
            ContextError::Mismatch => "context_mismatch",
            ContextError::Limits(_) => "limits_exceeded",
        }
    }
}

/// Whether a call's prompt work goes before or after interactive work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkClass {
    /// Served first.
    #[default]
    Interactive,
    /// Served from what interactive work leaves.
    Batch,
}

impl WorkClass {
    /// The default, left out of a signed statement.
    pub fn is_interactive(&self) -> bool {
        *self == WorkClass::Interactive
    }
}

impl TenantContext {
    /// A statement for an embedding call of at most `max_tokens` tokens,
    /// issued at `now`, valid for [`CONTEXT_TTL`].
    pub fn embed(
        account: &str,
        tenant: u64,
        request_id: String,
        model: &str,
        config_version: Option<u64>,
        max_tokens: u64,
        now: SystemTime,
    ) -> TenantContext {
        TenantContext {
            audience: Audience::Embed,
            ..TenantContext::new(
                account,
                tenant,
                request_id,
                model,
                config_version,
                max_tokens,
                None,
                now,
            )
        }
    }

    /// A statement for a generate call, issued at `now`, valid for
    /// [`CONTEXT_TTL`].
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
            audience: Audience::Generate,
            choice: 0,
            config_version,
            max_tokens,
            context_limit,
            class: WorkClass::Interactive,
            bill_as: None,
            issued_ms,
            expires_ms: issued_ms + CONTEXT_TTL.as_millis() as u64,
        }
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_seed("k1", &[seed; 32]).expect("key")
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
        let k = key(1);
        let v = k.verifying();
        let h = k.sign(&ctx(now));
        assert!(h.starts_with("v2.k1."));
        assert_eq!(v.verify(&h, now), Ok(ctx(now)));
        // Tampered payload (tenant 7 -> 8), same signature.
        let mut forged = ctx(now);
        forged.tenant = 8;
        let other = k.sign(&forged);
        let (_, sig) = h.rsplit_once('.').expect("sig");
        let (body, _) = other.rsplit_once('.').expect("sig");
        assert_eq!(
            v.verify(&format!("{body}.{sig}"), now),
            Err(ContextError::Invalid)
        );
        // Another platform's key under the same id.
        assert_eq!(
            key(2).verifying().verify(&h, now),
            Err(ContextError::Invalid)
        );
        // Expired, and issued too far ahead.
        let later = now + CONTEXT_TTL + Duration::from_secs(1);
        assert_eq!(v.verify(&h, later), Err(ContextError::Expired));
        let ahead = TenantContext::new(
            "a",
            7,
            "r".into(),
            "m",
            None,
            1,
            None,
            now + Duration::from_secs(60),
        );
        assert_eq!(v.verify(&k.sign(&ahead), now), Err(ContextError::Expired));
        // Longer-lived than any gateway signs.
        let mut long = ctx(now);
        long.expires_ms += 3_600_000;
        assert_eq!(v.verify(&k.sign(&long), now), Err(ContextError::Invalid));
        // Garbage, and the old HMAC form.
        for g in ["", "v2", "v2.k1.x.y", "v1.k1.e30.AAAA"] {
            assert_eq!(v.verify(g, now), Err(ContextError::Invalid), "{g}");
        }
    }

    #[test]
    fn what_a_worker_holds_cannot_sign_a_context() {
        let now = SystemTime::now();
        let gateway = key(1);
        let worker_file = gateway.public_line();
        let v = VerifyingKeys::parse(&worker_file, "context.pub").expect("keys");
        // Everything a worker has is the public key: used as a signing seed
        // (or as an HMAC key, the old form) it makes nothing that verifies.
        let (kid, public) = worker_file.split_once(' ').expect("line");
        let public: [u8; 32] = hex::decode(public).expect("hex").try_into().expect("32");
        let minted = SigningKey::from_seed(kid, &public)
            .expect("key")
            .sign(&ctx(now));
        assert_eq!(v.verify(&minted, now), Err(ContextError::Invalid));
        // A signing file is refused as a verifying file's key and vice versa
        // only by what it verifies: the gateway's own still verifies.
        assert!(v.verify(&gateway.sign(&ctx(now)), now).is_ok());
    }

    #[test]
    fn a_rotation_verifies_the_old_and_the_new_key() {
        let now = SystemTime::now();
        let (old, new) = (key(1), SigningKey::from_seed("k2", &[3; 32]).expect("key"));
        let both = new.verifying().and(&old.verifying());
        assert!(both.verify(&old.sign(&ctx(now)), now).is_ok());
        assert!(both.verify(&new.sign(&ctx(now)), now).is_ok());
        assert!(new.sign(&ctx(now)).starts_with("v2.k2."));
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
    fn a_full_replay_guard_sheds_expired_ids_then_the_oldest_and_never_refuses_fresh_ones() {
        let now = SystemTime::now();
        let mut g = ReplayGuard::with_limit(4);
        let at = |i: u64, t: SystemTime| {
            let mut c = ctx(t);
            c.request_id = format!("r{i}");
            c
        };
        for i in 0..4 {
            g.admit(&at(i, now), now).expect("room");
        }
        // Expired ones go first: nothing live is forgotten for them.
        let later = now + CONTEXT_TTL + Duration::from_secs(1);
        for i in 4..8 {
            g.admit(&at(i, later), later).expect("shed expired");
        }
        assert_eq!((g.len(), g.forgotten()), (4, 0));
        // A flood of live ones: the oldest are forgotten, each counted, and
        // every fresh id is still admitted.
        for i in 8..108 {
            g.admit(&at(i, later), later)
                .expect("a flood never refuses fresh ids");
        }
        assert_eq!((g.len(), g.forgotten()), (4, 100));
        // The newest are still remembered.
        assert!(g.admit(&at(107, later), later).is_err());
    }

    #[test]
    fn short_or_malformed_keys_are_refused() {
        assert!(VerifyingKeys::parse("k1 abcd\n", "t").is_err());
        assert!(VerifyingKeys::parse(&format!("bad/kid {}\n", "ab".repeat(32)), "t").is_err());
        assert!(VerifyingKeys::parse("# nothing\n", "t").is_err());
        assert!(SigningKey::parse(&format!("k1 {0}\nk2 {0}\n", "ab".repeat(32)), "t").is_err());
    }

    #[test]
    fn create_writes_a_signing_file_and_its_public_key_once() {
        let dir = std::env::temp_dir().join(format!("ctx-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let (sign, public) = (dir.join("context.sign"), dir.join("context.pub"));
        assert_eq!(SigningKey::create(&sign, &public).expect("create").len(), 2);
        assert!(
            SigningKey::create(&sign, &public)
                .expect("again")
                .is_empty()
        );
        let now = SystemTime::now();
        let h = SigningKey::load(&sign).expect("sign").sign(&ctx(now));
        assert!(
            VerifyingKeys::load(&public)
                .expect("pub")
                .verify(&h, now)
                .is_ok()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
