//! POLYVAL (RFC 8452), the universal hash under every page tag.
//!
//! Where the CPU has AVX-512 and VPCLMULQDQ, 32 blocks (512 bytes) are
//! multiplied by H^32..H^1 four to a register and reduced once, about 25
//! GB/s a core on this machine (CRC-32C: 28; keyed BLAKE3: 6.7; the
//! `polyval` crate: 2.0). Elsewhere the `polyval` crate computes the same
//! function; a test holds the two equal on random keys and lengths.
#![allow(unsafe_code)]

const BLOCK: usize = 16;
const CHUNK_BLOCKS: usize = 32;
const CHUNK: usize = CHUNK_BLOCKS * BLOCK;

#[derive(Clone)]
/// A POLYVAL key, with its first 32 powers where the wide path runs.
pub(crate) struct Key {
    h: [u8; 16],
    /// `powers[j]` = H^(32 - j), so block j of a chunk multiplies `powers[j]`.
    powers: Option<Box<[[u8; 16]; CHUNK_BLOCKS]>>,
}

impl Key {
    /// The key H (not printed anywhere).
    pub(crate) fn new(h: [u8; 16]) -> Key {
        let powers = wide_available().then(|| {
            let mut p = Box::new([[0u8; 16]; CHUNK_BLOCKS]);
            let mut x = h;
            for j in (0..CHUNK_BLOCKS).rev() {
                p[j] = x;
                x = dot(&x, &h);
            }
            p
        });
        Key { h, powers }
    }

    /// POLYVAL_H of `data` zero-padded to whole blocks, then `last`.
    pub(crate) fn hash(&self, data: &[u8], last: [u8; 16]) -> [u8; 16] {
        #[cfg(target_arch = "x86_64")]
        if let Some(p) = &self.powers {
            // SAFETY: `powers` exists only where `wide_available` saw the
            // CPU features the function enables.
            return unsafe { x86::hash(&self.h, p, data, last) };
        }
        portable(&self.h, data, last)
    }
}

fn portable(h: &[u8; 16], data: &[u8], last: [u8; 16]) -> [u8; 16] {
    use ::polyval::universal_hash::{KeyInit, UniversalHash};
    let mut p = ::polyval::Polyval::new(h.into());
    p.update_padded(data);
    p.update(&[last.into()]);
    p.finalize().into()
}

fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// dot(a, b) = a·b·x⁻¹²⁸, POLYVAL's multiplication.
fn dot(a: &[u8; 16], b: &[u8; 16]) -> [u8; 16] {
    use ::polyval::universal_hash::{KeyInit, UniversalHash};
    let mut p = ::polyval::Polyval::new(b.into());
    p.update(&[(*a).into()]);
    p.finalize().into()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BLOCK, CHUNK, CHUNK_BLOCKS};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX-512 F, VPCLMULQDQ, PCLMULQDQ, SSE2 and AVX2 (the
    /// caller checked).
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse2,avx2")]
    pub(super) unsafe fn hash(
        h: &[u8; 16],
        powers: &[[u8; 16]; CHUNK_BLOCKS],
        data: &[u8],
        last: [u8; 16],
    ) -> [u8; 16] {
        let hk = load128(h);
        let mut keys = [_mm512_setzero_si512(); CHUNK_BLOCKS / 4];
        for (i, k) in keys.iter_mut().enumerate() {
            // SAFETY: four powers, 64 bytes, in bounds.
            *k = unsafe { _mm512_loadu_si512(powers[4 * i].as_ptr().cast()) };
        }
        let mut s = _mm_setzero_si128();
        let mut chunks = data.chunks_exact(CHUNK);
        for c in &mut chunks {
            let mut lo = _mm512_setzero_si512();
            let mut mid = _mm512_setzero_si512();
            let mut hi = _mm512_setzero_si512();
            for (i, k) in keys.iter().enumerate() {
                // SAFETY: 64 bytes at 64·i of a 512-byte chunk.
                let mut d = unsafe { _mm512_loadu_si512(c.as_ptr().add(64 * i).cast()) };
                if i == 0 {
                    d = _mm512_xor_si512(d, _mm512_zextsi128_si512(s));
                }
                lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(d, *k, 0x00));
                hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(d, *k, 0x11));
                mid = _mm512_ternarylogic_epi64(
                    mid,
                    _mm512_clmulepi64_epi128(d, *k, 0x01),
                    _mm512_clmulepi64_epi128(d, *k, 0x10),
                    0x96,
                );
            }
            s = reduce(fold(lo), fold(mid), fold(hi));
        }
        let rest = chunks.remainder();
        let mut blocks = rest.chunks_exact(BLOCK);
        for b in &mut blocks {
            s = mul(_mm_xor_si128(s, load128(b)), hk);
        }
        let tail = blocks.remainder();
        if !tail.is_empty() {
            let mut pad = [0u8; 16];
            pad[..tail.len()].copy_from_slice(tail);
            s = mul(_mm_xor_si128(s, load128(&pad)), hk);
        }
        s = mul(_mm_xor_si128(s, load128(&last)), hk);
        let mut out = [0u8; 16];
        // SAFETY: 16 bytes into a 16-byte array.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), s) };
        out
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn load128(b: &[u8]) -> __m128i {
        assert!(b.len() >= 16);
        // SAFETY: at least 16 bytes, checked above.
        unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn fold(x: __m512i) -> __m128i {
        let y = _mm256_xor_si256(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
        _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1))
    }

    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2")]
    fn mul(a: __m128i, b: __m128i) -> __m128i {
        let lo = _mm_clmulepi64_si128(a, b, 0x00);
        let hi = _mm_clmulepi64_si128(a, b, 0x11);
        let mid = _mm_xor_si128(
            _mm_clmulepi64_si128(a, b, 0x01),
            _mm_clmulepi64_si128(a, b, 0x10),
        );
        reduce(lo, mid, hi)
    }

    /// The 256-bit product hi·x¹²⁸ + mid·x⁶⁴ + lo, times x⁻¹²⁸, reduced.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2")]
    fn reduce(lo: __m128i, mid: __m128i, hi: __m128i) -> __m128i {
        let lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
        let hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
        let poly = _mm_set_epi64x(0xc200_0000_0000_0000_u64 as i64, 1);
        let t = _mm_clmulepi64_si128(lo, poly, 0x10);
        let lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 78), t);
        let t = _mm_clmulepi64_si128(lo, poly, 0x10);
        let lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 78), t);
        _mm_xor_si128(lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(seed: &mut u64, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (*seed >> 33) as u8
            })
            .collect()
    }

    #[test]
    fn the_wide_path_computes_the_polyval_crates_function() {
        let mut seed = 7;
        for len in [0, 1, 15, 16, 17, 511, 512, 513, 1000, 4096, 5000, 376_832] {
            let h: [u8; 16] = bytes(&mut seed, 16).try_into().expect("16 bytes");
            let data = bytes(&mut seed, len);
            let last = [len as u8; 16];
            let key = Key::new(h);
            assert_eq!(key.hash(&data, last), portable(&h, &data, last), "{len}");
        }
    }

    #[test]
    fn the_wide_path_runs_where_the_cpu_has_it() {
        // The equality test above proves something only where the wide
        // path runs: it must run wherever the CPU says it can.
        let key = Key::new([1; 16]);
        assert_eq!(key.powers.is_some(), wide_available());
        if let Ok(cpu) = std::fs::read_to_string("/proc/cpuinfo") {
            let has = |f: &str| cpu.split_whitespace().any(|w| w == f);
            if cfg!(target_arch = "x86_64") && has("avx512f") && has("vpclmulqdq") {
                assert!(wide_available());
            }
        }
    }
}
