//! Prefix-aware routing: which worker a request that continues a
//! conversation should go to, so it lands where its prefix is cached.
//!
//! A request's [`AffinityKey`] is a digest of the same signed fields that
//! name its tenant's prefix-cache namespace on a worker (account, tenant,
//! model, config version) and of what stays the same from one turn of a
//! conversation to the next: the `x-session-affinity` header when the
//! client sends one (Workers AI's), else the conversation's start (its
//! system messages and first other message; a prompt's first bytes). The
//! picker ranks workers by a hash of the key and each worker's id
//! (rendezvous hashing), among the workers whose load is close to the best.
//!
//! Invariant: a key never names anything outside its namespace. Another
//! tenant's identical prompt, or the same tenant under another model or
//! config version, has an unrelated key, so affinity cannot steer one
//! tenant's request toward another's cached prefix (which its namespace
//! could not read anyway) nor reveal where another tenant's conversation
//! lives.

use bulkhead_worker_api::GenerateBody;
use sha2::{Digest, Sha256};

/// The header a client names its session with (Workers AI's).
pub(crate) const SESSION_HEADER: &str = "x-session-affinity";

/// The most bytes of a session header or a prompt the key reads.
const PREFIX_BYTES: usize = 256;

/// Where a conversation's requests should go, by rendezvous hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AffinityKey([u8; 16]);

/// What names a tenant's cache namespace, as the gateway signs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Namespace<'a> {
    pub(crate) account: &'a str,
    pub(crate) tenant: u64,
    pub(crate) model: &'a str,
    pub(crate) config_version: Option<u64>,
}

impl AffinityKey {
    /// The key of a request in namespace `ns` with body `body` and the
    /// client's session header `session`; none when the request has no
    /// conversation to continue (no text at all).
    pub(crate) fn of(
        ns: Namespace<'_>,
        session: Option<&str>,
        body: &GenerateBody,
    ) -> Option<AffinityKey> {
        let mut h = Sha256::new();
        h.update(b"bulkhead routing affinity v1");
        let version = ns.config_version.unwrap_or(0);
        for part in [
            ns.account.as_bytes(),
            &ns.tenant.to_le_bytes(),
            ns.model.as_bytes(),
            &version.to_le_bytes(),
        ] {
            field(&mut h, part);
        }
        if let Some(s) = session.filter(|s| !s.is_empty()) {
            field(&mut h, b"session");
            field(&mut h, head(s.as_bytes()));
        } else if let Some(messages) = body.messages.as_deref().filter(|m| !m.is_empty()) {
            // Every system message, then the first other one: the same in
            // every turn of the conversation.
            field(&mut h, b"messages");
            let first = messages.iter().position(|m| m.role != "system");
            let end = first.map_or(messages.len(), |i| i + 1);
            for m in &messages[..end] {
                field(&mut h, m.role.as_bytes());
                field(&mut h, head(m.content.as_bytes()));
            }
        } else if let Some(text) = body.prompt.as_deref().or(body.raw.as_deref()) {
            field(&mut h, b"text");
            field(&mut h, head(text.as_bytes()));
        } else if let Some(tokens) = body.tokens.as_deref().filter(|t| !t.is_empty()) {
            field(&mut h, b"tokens");
            for t in tokens.iter().take(PREFIX_BYTES / 4) {
                h.update(t.to_le_bytes());
            }
        } else {
            return None;
        }
        let d = h.finalize();
        let mut k = [0u8; 16];
        k.copy_from_slice(&d[..16]);
        Some(AffinityKey(k))
    }

    /// The rendezvous weight of worker `node` for this key: the picker
    /// sends the request to the highest among the workers it considers.
    pub(crate) fn weight(&self, node: i64) -> u64 {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(node.to_le_bytes());
        let d = h.finalize();
        let mut w = [0u8; 8];
        w.copy_from_slice(&d[..8]);
        u64::from_le_bytes(w)
    }
}

/// At most [`PREFIX_BYTES`] of `b`.
fn head(b: &[u8]) -> &[u8] {
    &b[..b.len().min(PREFIX_BYTES)]
}

/// `part`, length-prefixed so no two lists of parts collide.
fn field(h: &mut Sha256, part: &[u8]) {
    h.update((part.len() as u64).to_le_bytes());
    h.update(part);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_worker_api::Message;

    fn ns(account: &str) -> Namespace<'_> {
        Namespace {
            account,
            tenant: 7,
            model: "@cf/org/model",
            config_version: Some(3),
        }
    }

    fn chat(turns: &[(&str, &str)]) -> GenerateBody {
        let mut b: GenerateBody = serde_json::from_value(serde_json::json!({})).unwrap();
        b.messages = Some(
            turns
                .iter()
                .map(|(role, content)| Message {
                    role: (*role).to_owned(),
                    content: (*content).to_owned(),
                    tool_calls: Vec::new(),
                    tool_call_id: None,
                })
                .collect(),
        );
        b
    }

    #[test]
    fn every_turn_of_a_conversation_has_the_key_of_its_first() {
        let first = chat(&[("system", "be brief"), ("user", "hello")]);
        let later = chat(&[
            ("system", "be brief"),
            ("user", "hello"),
            ("assistant", "hi"),
            ("user", "tell me more"),
        ]);
        let k = AffinityKey::of(ns("a"), None, &first);
        assert!(k.is_some());
        assert_eq!(k, AffinityKey::of(ns("a"), None, &later));
        let other = chat(&[("system", "be brief"), ("user", "goodbye")]);
        assert_ne!(k, AffinityKey::of(ns("a"), None, &other));
        // The session header names the conversation when sent.
        assert_eq!(
            AffinityKey::of(ns("a"), Some("s1"), &first),
            AffinityKey::of(ns("a"), Some("s1"), &other)
        );
        assert_ne!(
            AffinityKey::of(ns("a"), Some("s1"), &first),
            AffinityKey::of(ns("a"), Some("s2"), &first)
        );
    }

    #[test]
    fn another_namespace_never_shares_a_key() {
        let body = chat(&[("user", "the same prompt")]);
        let base = AffinityKey::of(ns("a"), Some("session"), &body);
        let mut others = vec![ns("b")];
        others.push(Namespace {
            tenant: 8,
            ..ns("a")
        });
        others.push(Namespace {
            model: "@cf/org/other",
            ..ns("a")
        });
        others.push(Namespace {
            config_version: Some(4),
            ..ns("a")
        });
        for other in others {
            assert_ne!(
                AffinityKey::of(other, Some("session"), &body),
                base,
                "{other:?}"
            );
            assert_ne!(
                AffinityKey::of(other, None, &body),
                AffinityKey::of(ns("a"), None, &body),
                "{other:?}"
            );
        }
    }
}
