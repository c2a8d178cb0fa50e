//! Page checksums (CRC-32C, hardware-accelerated where the CPU has it) and
//! the whole-transfer digest (xxh3-64).

use bulkhead_kv::Generation;
use xxhash_rust::xxh3::Xxh3;

/// Whether page frames carry checksums and tags. Always `On` when serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksums {
    /// Every page is hashed (CRC-32C) and tagged under the transfer's key
    /// by the sender, and both are verified by the receiver.
    On,
    /// CRC-32C without tags: exists only so `bulkhead bench transfer` can
    /// measure what tags cost. No serving command can select it.
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

/// The checksum of one page payload (0 when checksums are off).
pub fn page_checksum(checksums: Checksums, payload: &[u8]) -> u64 {
    match checksums {
        Checksums::On | Checksums::CrcOnlyForBenchmark => u64::from(crc32c::crc32c(payload)),
        Checksums::OffForBenchmark => 0,
    }
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
