//! The gateway's context a decode worker forwards with a prefill request:
//! prefill verifies it and takes the tenant and the cache scope from it,
//! so a decode worker, however compromised, can neither tag pages for
//! another tenant nor ask whether another tenant's cache holds a prompt.

use bulkhead_kv::CacheScope;
use bulkhead_transfer::PrefillRequest;
use bulkhead_worker_api::context::{Audience, ContextError, SKEW_MS, TenantContext, VerifyingKeys};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long after the gateway signed it a forwarded context is still taken:
/// longer than a context's own life at decode (a request may wait there for
/// its landing pages under load), and bounded, so an old context a decode
/// host once saw soon opens nothing.
pub const FORWARD_AGE: Duration = Duration::from_secs(300);

/// The contexts a prefill worker accepts: signed under `keys`, for `model`.
#[derive(Debug, Clone, Default)]
pub struct ContextKeys {
    keys: VerifyingKeys,
    model: String,
}

impl ContextKeys {
    /// Contexts signed under `keys` for `model` (its slug).
    pub fn new(keys: VerifyingKeys, model: &str) -> ContextKeys {
        ContextKeys {
            keys,
            model: model.to_owned(),
        }
    }

    /// The verified context of `req`, if every claim decode made agrees
    /// with it: the tenant, the cache scope (none, or exactly the one the
    /// context derives), and the limits. Checked before anything is
    /// allocated.
    pub(crate) fn check(
        &self,
        req: &PrefillRequest,
        now: SystemTime,
    ) -> Result<(TenantContext, Option<CacheScope>), ContextError> {
        if req.context.is_empty() {
            return Err(ContextError::Missing);
        }
        let ctx = self.keys.statement(&req.context)?;
        let now_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let age_ms = u64::try_from(FORWARD_AGE.as_millis()).unwrap_or(u64::MAX);
        // Decode verified it fresh; here it must be no older than the
        // forwarding bound (and not from the future).
        if now_ms > ctx.issued_ms.saturating_add(age_ms) || ctx.issued_ms > now_ms + SKEW_MS {
            return Err(ContextError::Expired);
        }
        if ctx.model != self.model {
            return Err(ContextError::WrongModel(ctx.model));
        }
        if ctx.audience != Audience::Generate {
            return Err(ContextError::WrongAudience(ctx.audience));
        }
        let scope = crate::prefix::scope(&ctx);
        if ctx.tenant != req.tenant || req.cache.is_some_and(|c| c != scope) {
            return Err(ContextError::Mismatch);
        }
        if req.max_tokens > ctx.max_tokens {
            return Err(ContextError::Limits(format!(
                "max_tokens {} above the signed {}",
                req.max_tokens, ctx.max_tokens
            )));
        }
        let wanted = (req.prompt.len() as u64).saturating_add(req.max_tokens);
        if let Some(limit) = ctx.context_limit
            && wanted > limit
        {
            return Err(ContextError::Limits(format!(
                "{wanted} tokens above the signed window {limit}"
            )));
        }
        let cache = req.cache.map(|_| scope);
        Ok((ctx, cache))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_kv::TransferId;
    use bulkhead_worker_api::context::SigningKey;

    const MODEL: &str = "@cf/x/y";

    fn signed(key: &SigningKey, tenant: u64, now: SystemTime) -> (TenantContext, String) {
        let ctx = TenantContext::new(
            &"a".repeat(32),
            tenant,
            "r".into(),
            MODEL,
            Some(1),
            8,
            Some(64),
            now,
        );
        let h = key.sign(&ctx);
        (ctx, h)
    }

    fn request(tenant: u64, context: String, cache: Option<CacheScope>) -> PrefillRequest {
        PrefillRequest {
            transfer: TransferId::new(1),
            tenant,
            max_tokens: 8,
            prompt: vec![1; 16],
            slots: vec![],
            context,
            traceparent: None,
            key: [0; 32],
            cache,
        }
    }

    #[test]
    fn every_claim_of_decode_is_held_to_the_signed_context() {
        let now = SystemTime::now();
        let gateway = SigningKey::from_seed("k1", &[9; 32]).expect("key");
        let keys = ContextKeys::new(gateway.verifying(), MODEL);
        let (ctx, h) = signed(&gateway, 7, now);
        let own = crate::prefix::scope(&ctx);
        assert_eq!(
            keys.check(&request(7, h.clone(), Some(own)), now),
            Ok((ctx.clone(), Some(own)))
        );
        assert_eq!(
            keys.check(&request(7, h.clone(), None), now),
            Ok((ctx, None))
        );
        // Another tenant's pages or cache, under a good context.
        assert_eq!(
            keys.check(&request(8, h.clone(), Some(own)), now),
            Err(ContextError::Mismatch)
        );
        let (other, _) = signed(&gateway, 8, now);
        let theirs = crate::prefix::scope(&other);
        assert_eq!(
            keys.check(&request(7, h.clone(), Some(theirs)), now),
            Err(ContextError::Mismatch)
        );
        // More than signed.
        let mut greedy = request(7, h.clone(), None);
        greedy.max_tokens = 9;
        assert!(matches!(
            keys.check(&greedy, now),
            Err(ContextError::Limits(_))
        ));
        let mut long = request(7, h.clone(), None);
        long.prompt = vec![1; 57];
        assert!(matches!(
            keys.check(&long, now),
            Err(ContextError::Limits(_))
        ));
        // No context, a context decode made itself, another model's keys.
        assert_eq!(
            keys.check(&request(7, String::new(), None), now),
            Err(ContextError::Missing)
        );
        let decode_made = SigningKey::from_seed("k1", &[1; 32]).expect("key");
        let (_, forged) = signed(&decode_made, 7, now);
        assert_eq!(
            keys.check(&request(7, forged, None), now),
            Err(ContextError::Invalid)
        );
        // Older than the forwarding bound.
        let late = now + FORWARD_AGE + Duration::from_secs(1);
        assert_eq!(
            keys.check(&request(7, h.clone(), None), late),
            Err(ContextError::Expired)
        );
        // Past its own 30 s but within the bound: a request that waited at
        // decode for its pages is still computed.
        let waited = now + Duration::from_secs(60);
        assert!(keys.check(&request(7, h.clone(), None), waited).is_ok());
        let elsewhere = ContextKeys::new(gateway.verifying(), "@cf/x/z");
        assert!(matches!(
            elsewhere.check(&request(7, h, None), now),
            Err(ContextError::WrongModel(_))
        ));
        // Keys that verify nothing (the default) refuse everything.
        let (_, h) = signed(&gateway, 7, now);
        assert_eq!(
            ContextKeys::default().check(&request(7, h, None), now),
            Err(ContextError::Invalid)
        );
    }
}
