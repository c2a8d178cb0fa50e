//! Keyed integrity of a transfer: a per-transfer key the decode worker
//! draws and sends in its prefill request (over the mutual-TLS connection),
//! and a tag under it on every page frame and on the transfer's digest. A
//! CRC catches corruption; only the tag catches forgery, so a peer that
//! speaks the protocol (or a host that rewrites frames, or an RDMA path TLS
//! does not cover) cannot make decode accept a page prefill did not send.
//!
//! The tag is keyed BLAKE3 (the fastest of the MACs measured here: about
//! 4.5 GB/s a core against 1.3 for GMAC over associated data and 1.2 for
//! HMAC-SHA-256), truncated to 128 bits, over a domain label, the frame's
//! slot and granted generation (or the transfer's end) and its bytes.

use bulkhead_kv::Generation;

/// Bytes of a transfer key.
pub const KEY_LEN: usize = 32;
/// Bytes of a tag.
pub const TAG_LEN: usize = 16;

/// A transfer's key. Cheap to clone; never printed.
#[derive(Clone)]
pub struct FrameKey([u8; KEY_LEN]);

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(..)")
    }
}

impl FrameKey {
    /// The key with these bytes.
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> FrameKey {
        FrameKey(*bytes)
    }

    /// A fresh random key and its bytes.
    pub fn generate() -> ([u8; KEY_LEN], FrameKey) {
        let mut bytes = [0u8; KEY_LEN];
        // The OS's randomness; without it a transfer cannot be made safe.
        #[allow(clippy::expect_used)]
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        let key = FrameKey::from_bytes(&bytes);
        (bytes, key)
    }

    /// The tag of a page frame.
    pub fn page_tag(&self, slot: u32, generation: Generation, payload: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"bulkhead page\0");
        h.update(&slot.to_le_bytes());
        h.update(&generation.get().to_le_bytes());
        h.update(payload);
        truncate(&h)
    }

    /// The tag of a transfer's end: its token count and digest.
    pub fn done_tag(&self, tokens: u64, digest: u64) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"bulkhead done\0");
        h.update(&tokens.to_le_bytes());
        h.update(&digest.to_le_bytes());
        truncate(&h)
    }
}

fn truncate(h: &blake3::Hasher) -> [u8; TAG_LEN] {
    let mut out = [0u8; TAG_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
    out
}

/// Whether two tags are equal, in time independent of where they differ.
pub fn tags_equal(a: &[u8; TAG_LEN], b: &[u8; TAG_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_depends_on_the_key_the_slot_the_generation_and_every_byte() {
        let (_, k) = FrameKey::generate();
        let (_, other) = FrameKey::generate();
        let page = vec![7u8; 4096];
        let t = k.page_tag(3, Generation::from_wire(9), &page);
        assert!(tags_equal(
            &t,
            &k.page_tag(3, Generation::from_wire(9), &page)
        ));
        assert!(!tags_equal(
            &t,
            &other.page_tag(3, Generation::from_wire(9), &page)
        ));
        assert!(!tags_equal(
            &t,
            &k.page_tag(4, Generation::from_wire(9), &page)
        ));
        assert!(!tags_equal(
            &t,
            &k.page_tag(3, Generation::from_wire(10), &page)
        ));
        let mut flipped = page;
        flipped[4000] ^= 1;
        assert!(!tags_equal(
            &t,
            &k.page_tag(3, Generation::from_wire(9), &flipped)
        ));
        assert!(!tags_equal(&k.done_tag(1, 2), &k.done_tag(1, 3)));
    }
}
