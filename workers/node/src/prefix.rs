//! The prefix-cache scope of a worker call, derived from its signed tenant
//! context and nothing else: a tenant's namespace is a digest of the
//! account, its tenant number, the model and the config version the
//! gateway routed under, so a client can neither choose nor guess its way
//! into another tenant's cached pages (any `cache_salt` or similar field a
//! client sends never reaches here). Every tenant may also read the
//! model's shared namespace, where an operator's published prefix lives.

use bulkhead_engine::{Engine, EngineError, GenerateRequest, SamplingParams, SeqEvent};
use bulkhead_kv::{AdmissionError, CacheScope, Namespace, TenantId};
use bulkhead_worker_api::context::TenantContext;
use sha2::{Digest, Sha256};

/// Why an operator's shared prefix could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The text does not tokenize.
    #[error("the shared prefix does not tokenize: {0}")]
    Tokenize(String),
    /// Admission refused it (too long for the window, say).
    #[error("the shared prefix was refused: {0}")]
    Refused(#[from] AdmissionError),
    /// The engine failed it.
    #[error("the shared prefix was not computed: {0}")]
    Engine(#[from] EngineError),
    /// The engine stopped before it finished.
    #[error("the engine stopped before the shared prefix was computed")]
    Stopped,
}

/// Computes `text` (raw, as the model sees it: render a system prompt with
/// the chat template first) once, as the platform's own request, and
/// leaves its full pages in `model`'s shared namespace, which every
/// tenant's prompts read first. Returns the prefix's tokens; only whole
/// pages of it are reused.
pub fn publish_shared(engine: &Engine, model: &str, text: &str) -> Result<usize, PublishError> {
    let prompt = engine
        .tokenizer()
        .encode(text)
        .map_err(|e| PublishError::Tokenize(e.to_string()))?;
    let tokens = prompt.len();
    let request = GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(1),
        stop: Vec::new(),
        ignore_eos: true,
        cache: Some(CacheScope::new(shared(model), None)),
        class: bulkhead_engine::WorkClass::Interactive,
    };
    // Tenant 0 is the platform's own (no account maps to it).
    let mut handle = engine.submit(TenantId::new(0), request)?;
    while let Some(ev) = handle.blocking_next() {
        match ev {
            SeqEvent::Token { .. } => {}
            SeqEvent::Finished { .. } => return Ok(tokens),
            SeqEvent::Failed(e) => return Err(e.into()),
        }
    }
    Err(PublishError::Stopped)
}

/// The scope of a call whose signed context is `ctx`.
pub fn scope(ctx: &TenantContext) -> CacheScope {
    let version = ctx.config_version.unwrap_or(0).to_string();
    let own = namespace(&[
        "tenant",
        &ctx.account,
        &ctx.tenant.to_string(),
        &ctx.model,
        &version,
    ]);
    CacheScope::new(own, Some(shared(&ctx.model)))
}

/// The shared namespace of `model` on this worker: what an operator's
/// published prefix is cached under.
pub fn shared(model: &str) -> Namespace {
    namespace(&["shared", model])
}

/// A digest of `parts`, each length-prefixed so no two lists collide.
fn namespace(parts: &[&str]) -> Namespace {
    let mut h = Sha256::new();
    h.update(b"bulkhead prefix cache v1");
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    Namespace::from_digest(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(account: &str, tenant: u64, model: &str, version: Option<u64>) -> TenantContext {
        TenantContext {
            account: account.into(),
            tenant,
            request_id: "r".into(),
            model: model.into(),
            audience: bulkhead_worker_api::context::Audience::Generate,
            choice: 0,
            config_version: version,
            max_tokens: 16,
            context_limit: None,
            class: Default::default(),
            bill_as: None,
            issued_ms: 0,
            expires_ms: 1,
        }
    }

    #[test]
    fn each_signed_field_separates_namespaces() {
        let base = scope(&ctx("a", 1, "@cf/m", Some(1)));
        for other in [
            ctx("b", 1, "@cf/m", Some(1)),
            ctx("a", 2, "@cf/m", Some(1)),
            ctx("a", 1, "@cf/n", Some(1)),
            ctx("a", 1, "@cf/m", Some(2)),
        ] {
            assert_ne!(scope(&other).own(), base.own(), "{other:?}");
        }
        // The request id is not part of it: a tenant's calls share.
        let mut again = ctx("a", 1, "@cf/m", Some(1));
        again.request_id = "other".into();
        assert_eq!(scope(&again), base);
        assert_eq!(base.shared(), Some(shared("@cf/m")));
        assert!(!base.may_read(scope(&ctx("b", 1, "@cf/m", Some(1))).own()));
    }
}
