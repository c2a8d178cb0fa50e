//! What page frames carry (tags when serving, CRC-32C only in a benchmark)
//! and the whole-transfer digest (xxh3-64).

use bulkhead_kv::Generation;
use xxhash_rust::xxh3::Xxh3;

/// Whether page frames carry checksums and tags. Always `On` when serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Checksums {
    /// Every page is tagged under the transfer's key by the sender (the
    /// header's checksum is the tag's first 64 bits) and the receiver
    /// verifies the tag, which catches corruption and forgery alike.
    On,
    /// CRC-32C without tags, the unkeyed check the protocol had before
    /// tags: exists only so `bulkhead bench transfer` can measure what tags
    /// cost. No serving command can select it.
    CrcOnlyForBenchmark,
    /// No hashing: exists only so `bulkhead bench transfer` can measure
    /// what checksums cost. No serving command can select it.
    OffForBenchmark,
}

impl Checksums {
    /// Whether frames carry tags.
    pub fn tags(self) -> bool {
        self == Checksums::On
    }
}

/// The CRC-32C of one page payload.
pub fn page_crc(payload: &[u8]) -> u64 {
    u64::from(crc32c::crc32c(payload))
}

/// The digest of a whole transfer: every page's (slot, generation,
/// checksum) in slot order, then the token count and the logits.
pub fn transfer_digest(pages: &[(Generation, u64)], tokens: u64, logits: &[f32]) -> u64 {
    let mut h = Xxh3::new();
    for (slot, (generation, checksum)) in pages.iter().enumerate() {
        h.update(&(slot as u64).to_le_bytes());
        h.update(&generation.get().to_le_bytes());
        h.update(&checksum.to_le_bytes());
    }
    h.update(&tokens.to_le_bytes());
    for x in logits {
        h.update(&x.to_le_bytes());
    }
    h.digest()
}
