//! Keyed integrity of a transfer: a per-transfer key the decode worker
//! draws and sends in its prefill request (over the mutual-TLS connection),
//! and a tag under it on every page frame and on the transfer's digest. The
//! tag is the served path's only integrity check: it catches corruption
//! as a CRC does, and forgery, which a CRC does not, so a peer that speaks
//! the protocol (or a host that rewrites frames, or an RDMA path TLS does
//! not cover) cannot make decode accept a page prefill did not send.
//!
//! A page's tag is a Wegman-Carter MAC, as GMAC is: POLYVAL (RFC 8452)
//! under a hash key derived from the transfer's key, over the payload and
//! its length, XORed with a pad that keyed BLAKE3 draws from the frame's
//! slot and granted generation. Each (slot, generation) is tagged once per
//! transfer, so a pad is never reused, and a forgery succeeds with
//! probability at most (blocks + 1) / 2^128 (2^-113 for a 368 KB page).
//! POLYVAL runs at about 25 GB/s a core here ([`crate::polyhash`]), near
//! CRC-32C's 28 and four times keyed BLAKE3's 6.7, which an earlier
//! version used over the whole payload. The end's tag is keyed BLAKE3 over
//! the token count and the digest.

use bulkhead_kv::Generation;

use crate::polyhash::{Key, Stream};

/// Bytes of a transfer key.
pub const KEY_LEN: usize = 32;
/// Bytes of a tag.
pub const TAG_LEN: usize = 16;

/// A transfer's key, with the hash key derived from it. Never printed.
#[derive(Clone)]
pub struct FrameKey {
    key: [u8; KEY_LEN],
    hash: Key,
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(..)")
    }
}

/// Keys are equal when their bytes are (the hash key derives from them).
impl PartialEq for FrameKey {
    fn eq(&self, other: &FrameKey) -> bool {
        self.key == other.key
    }
}

impl Eq for FrameKey {}

impl std::hash::Hash for FrameKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl FrameKey {
    /// The key with these bytes.
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> FrameKey {
        let mut h = [0u8; 16];
        h.copy_from_slice(&blake3::keyed_hash(bytes, b"bulkhead page hash key").as_bytes()[..16]);
        FrameKey {
            key: *bytes,
            hash: Key::new(h),
        }
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
        let mut t = self.page_tagger(slot, generation);
        t.update(payload);
        t.finish().tag
    }

    /// The tag of a page frame computed as its payload arrives, piece by
    /// piece, while each piece is still in cache: equal to
    /// [`FrameKey::page_tag`] of the pieces joined.
    pub fn page_tagger(&self, slot: u32, generation: Generation) -> PageTagger<'_> {
        PageTagger {
            key: self,
            slot,
            generation,
            stream: self.hash.stream(),
            len: 0,
        }
    }

    /// The tag of a transfer's end: its token count and digest.
    pub fn done_tag(&self, tokens: u64, digest: u64) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"bulkhead done\0");
        h.update(&tokens.to_le_bytes());
        h.update(&digest.to_le_bytes());
        truncate(&h)
    }
}

/// A page tag in progress ([`FrameKey::page_tagger`]).
pub struct PageTagger<'k> {
    key: &'k FrameKey,
    slot: u32,
    generation: Generation,
    stream: Stream<'k>,
    len: u64,
}

impl std::fmt::Debug for PageTagger<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageTagger")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A finished page tag and what it covers: the slot, the generation and
/// the number of payload bytes fed (so a verifier can tell it covers the
/// frame it is checked against).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LandedTag {
    pub(crate) tag: [u8; TAG_LEN],
    pub(crate) slot: u32,
    pub(crate) generation: Generation,
    pub(crate) len: u64,
}

impl PageTagger<'_> {
    /// Feeds the next payload bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.len += bytes.len() as u64;
        self.stream.update(bytes);
    }

    /// The tag of everything fed.
    pub fn finish(self) -> LandedTag {
        let mut length = [0u8; 16];
        length[..8].copy_from_slice(&self.len.to_le_bytes());
        let mut tag = self.stream.finish(length);
        let mut h = blake3::Hasher::new_keyed(&self.key.key);
        h.update(b"bulkhead page pad\0");
        h.update(&self.slot.to_le_bytes());
        h.update(&self.generation.get().to_le_bytes());
        for (t, p) in tag.iter_mut().zip(truncate(&h)) {
            *t ^= p;
        }
        LandedTag {
            tag,
            slot: self.slot,
            generation: self.generation,
            len: self.len,
        }
    }
}

fn truncate(h: &blake3::Hasher) -> [u8; TAG_LEN] {
    let mut out = [0u8; TAG_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
    out
}

/// The 64 bits of a tag a page header also carries as its checksum, so
/// the transfer's digest covers every page's tag.
pub fn tag_checksum(tag: &[u8; TAG_LEN]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&tag[..8]);
    u64::from_le_bytes(b)
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
        let mut longer = page.clone();
        longer.push(0);
        assert!(!tags_equal(
            &t,
            &k.page_tag(3, Generation::from_wire(9), &longer)
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
