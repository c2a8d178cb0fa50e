//! POLYVAL (RFC 8452), the universal hash under every page tag, at the
//! widest carry-less multiply the CPU has ([`Width`]).
//!
//! Every x86 path hashes 32 blocks (512 bytes) at a time with aggregated
//! reduction: block j of a chunk is multiplied by H^(32-j), the products
//! summed unreduced, and the sum reduced once per chunk (the running state
//! joins the first block). With AVX-512 and VPCLMULQDQ four blocks go to a
//! register (about 25 GB/s a core where measured); with VPCLMULQDQ on
//! 256-bit registers (AVX2 machines that have it) two; with PCLMULQDQ alone
//! (every x86-64 CPU since 2010) one. The `polyval` crate computes the same
//! function elsewhere; a test holds every width this CPU has equal to it on
//! random keys and lengths.
#![allow(unsafe_code)]

const BLOCK: usize = 16;
const CHUNK_BLOCKS: usize = 32;
const CHUNK: usize = CHUNK_BLOCKS * BLOCK;

/// The carry-less multiply a key hashes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Width {
    /// The `polyval` crate (no x86 carry-less multiply).
    Portable,
    /// PCLMULQDQ on 128-bit registers: one block per multiply.
    Clmul128,
    /// VPCLMULQDQ on 256-bit registers: two blocks per multiply.
    Vpclmul256,
    /// VPCLMULQDQ on 512-bit registers (AVX-512): four blocks per multiply.
    Vpclmul512,
}

/// The widest keys made from now on may use (test and bench builds: a
/// benchmark measures the narrower paths on a wider CPU).
#[cfg(feature = "test-hooks")]
static CAP: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(u8::MAX);

impl Width {
    /// The widest this CPU has (under the cap a test build may set).
    pub fn detected() -> Width {
        [Width::Vpclmul512, Width::Vpclmul256, Width::Clmul128]
            .into_iter()
            .filter(|w| w.allowed())
            .find(|w| w.available())
            .unwrap_or(Width::Portable)
    }

    /// Test and bench builds: keys made from now on hash at most this wide.
    #[cfg(feature = "test-hooks")]
    pub fn cap(width: Width) {
        CAP.store(width as u8, std::sync::atomic::Ordering::Relaxed);
    }

    fn allowed(self) -> bool {
        #[cfg(feature = "test-hooks")]
        return (self as u8) <= CAP.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(feature = "test-hooks"))]
        true
    }

    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let clmul = has!("pclmulqdq") && has!("sse2");
            match self {
                Width::Portable => true,
                Width::Clmul128 => clmul,
                Width::Vpclmul256 => clmul && has!("avx2") && has!("vpclmulqdq"),
                Width::Vpclmul512 => clmul && has!("avx2") && has!("avx512f") && has!("vpclmulqdq"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Width::Portable
        }
    }

    /// Its name, as benchmarks print it.
    pub fn name(self) -> &'static str {
        match self {
            Width::Portable => "portable",
            Width::Clmul128 => "pclmulqdq",
            Width::Vpclmul256 => "vpclmulqdq-256",
            Width::Vpclmul512 => "vpclmulqdq-512",
        }
    }
}

#[derive(Clone)]
/// A POLYVAL key, with its first 32 powers where an x86 path runs.
pub(crate) struct Key {
    h: [u8; 16],
    width: Width,
    /// `powers[j]` = H^(32 - j), so block j of a chunk multiplies `powers[j]`.
    powers: Option<Box<[[u8; 16]; CHUNK_BLOCKS]>>,
    /// For the 128-bit path's Karatsuba products: each power's two 64-bit
    /// halves XORed, in the low half.
    folded: Option<Box<[[u8; 16]; CHUNK_BLOCKS]>>,
}

impl Key {
    /// The key H (not printed anywhere), hashing at this CPU's widest.
    pub(crate) fn new(h: [u8; 16]) -> Key {
        Key::with_width(h, Width::detected())
    }

    /// The key H hashing at `width`, or the widest this CPU has below it.
    pub(crate) fn with_width(h: [u8; 16], width: Width) -> Key {
        let width = if width.available() {
            width
        } else {
            Width::detected().min(width)
        };
        let powers = (width != Width::Portable).then(|| {
            let mut p = Box::new([[0u8; 16]; CHUNK_BLOCKS]);
            let mut x = h;
            for j in (0..CHUNK_BLOCKS).rev() {
                p[j] = x;
                x = dot(&x, &h);
            }
            p
        });
        let folded = (width == Width::Clmul128)
            .then(|| powers.as_ref().map(|p| Box::new(p.map(fold_halves))))
            .flatten();
        Key {
            h,
            width,
            powers,
            folded,
        }
    }

    /// POLYVAL_H of `data` zero-padded to whole blocks, then `last`.
    #[cfg(test)]
    pub(crate) fn hash(&self, data: &[u8], last: [u8; 16]) -> [u8; 16] {
        self.run([0; 16], data, Some(last))
    }

    /// A hash fed in pieces of any length ([`Stream::update`]), equal to
    /// [`Key::hash`] of their concatenation: for bytes hashed as they land.
    pub(crate) fn stream(&self) -> Stream<'_> {
        Stream {
            key: self,
            state: [0; 16],
            held: [0; CHUNK],
            held_len: 0,
        }
    }

    /// From running state `start`: `data` absorbed, then (with `last`) its
    /// zero-padded tail and `last`, the hash; without `last`, `data` is
    /// whole chunks and the result is the running state after them.
    fn run(&self, start: [u8; 16], data: &[u8], last: Option<[u8; 16]>) -> [u8; 16] {
        debug_assert!(last.is_some() || data.len().is_multiple_of(CHUNK));
        #[cfg(target_arch = "x86_64")]
        if let Some(p) = &self.powers {
            // SAFETY (each arm): `width` was checked available on this CPU
            // when the key was made, and each function enables no more.
            let job = x86::Job {
                h: &self.h,
                powers: p,
                data,
                start,
                last,
            };
            return unsafe {
                match (self.width, &self.folded) {
                    (Width::Vpclmul512, _) => x86::hash512(job),
                    (Width::Vpclmul256, _) => x86::hash256(job),
                    (_, Some(f)) => x86::hash128(job, f),
                    (_, None) => portable(&self.h, start, data, last),
                }
            };
        }
        portable(&self.h, start, data, last)
    }
}

/// A POLYVAL hash in progress: whole chunks are absorbed as they complete,
/// a partial one held until the next piece or the end.
pub(crate) struct Stream<'k> {
    key: &'k Key,
    state: [u8; 16],
    held: [u8; CHUNK],
    held_len: usize,
}

impl Stream<'_> {
    /// Feeds the next `data`.
    pub(crate) fn update(&mut self, mut data: &[u8]) {
        if self.held_len > 0 {
            let take = (CHUNK - self.held_len).min(data.len());
            self.held[self.held_len..self.held_len + take].copy_from_slice(&data[..take]);
            self.held_len += take;
            data = &data[take..];
            if self.held_len < CHUNK {
                return;
            }
            self.state = self.key.run(self.state, &self.held[..], None);
            self.held_len = 0;
        }
        let whole = data.len() - data.len() % CHUNK;
        if whole > 0 {
            self.state = self.key.run(self.state, &data[..whole], None);
        }
        let rest = &data[whole..];
        self.held[..rest.len()].copy_from_slice(rest);
        self.held_len = rest.len();
    }

    /// The hash of everything fed, zero-padded to whole blocks, then `last`.
    pub(crate) fn finish(self, last: [u8; 16]) -> [u8; 16] {
        self.key
            .run(self.state, &self.held[..self.held_len], Some(last))
    }
}

/// A power's two 64-bit halves XORed, in the low half (the Karatsuba
/// middle factor).
fn fold_halves(p: [u8; 16]) -> [u8; 16] {
    let mut f = [0u8; 16];
    for i in 0..8 {
        f[i] = p[i] ^ p[i + 8];
    }
    f
}

/// [`Key::run`] with the `polyval` crate: from zero in one pass, else a
/// block at a time (S = (S ⊕ X)·H).
fn portable(h: &[u8; 16], start: [u8; 16], data: &[u8], last: Option<[u8; 16]>) -> [u8; 16] {
    use ::polyval::universal_hash::{KeyInit, UniversalHash};
    if let (true, Some(last)) = (start == [0; 16], last) {
        let mut p = ::polyval::Polyval::new(h.into());
        p.update_padded(data);
        p.update(&[last.into()]);
        return p.finalize().into();
    }
    let mut s = start;
    let step = |s: &mut [u8; 16], block: &[u8]| {
        let mut x = [0u8; 16];
        x[..block.len()].copy_from_slice(block);
        for (a, b) in x.iter_mut().zip(s.iter()) {
            *a ^= b;
        }
        *s = dot(&x, h);
    };
    for block in data.chunks(BLOCK) {
        step(&mut s, block);
    }
    if let Some(last) = last {
        step(&mut s, &last);
    }
    s
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

    /// One hash: the key, its powers, the data and the last block.
    #[derive(Clone, Copy)]
    pub(super) struct Job<'a> {
        pub(super) h: &'a [u8; 16],
        pub(super) powers: &'a [[u8; 16]; CHUNK_BLOCKS],
        pub(super) data: &'a [u8],
        /// The running state the data continues.
        pub(super) start: [u8; 16],
        /// The last block; none: `data` is whole chunks, and the running
        /// state after them is returned.
        pub(super) last: Option<[u8; 16]>,
    }

    /// # Safety
    /// The CPU has AVX-512 F, VPCLMULQDQ, PCLMULQDQ, SSE2 and AVX2 (the
    /// caller checked).
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse2,avx2")]
    pub(super) unsafe fn hash512(job: Job<'_>) -> [u8; 16] {
        let powers = job.powers;
        let mut keys = [_mm512_setzero_si512(); CHUNK_BLOCKS / 4];
        for (i, k) in keys.iter_mut().enumerate() {
            // SAFETY: four powers, 64 bytes, in bounds.
            *k = unsafe { _mm512_loadu_si512(powers[4 * i].as_ptr().cast()) };
        }
        drive(job, |c, s| {
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
            reduce(fold512(lo), fold512(mid), fold512(hi))
        })
    }

    /// # Safety
    /// The CPU has VPCLMULQDQ, PCLMULQDQ, SSE2 and AVX2 (the caller
    /// checked).
    #[target_feature(enable = "vpclmulqdq,pclmulqdq,sse2,avx2")]
    pub(super) unsafe fn hash256(job: Job<'_>) -> [u8; 16] {
        let powers = job.powers;
        drive(job, |c, s| {
            let mut lo = _mm256_setzero_si256();
            let mut mid = _mm256_setzero_si256();
            let mut hi = _mm256_setzero_si256();
            for i in 0..CHUNK_BLOCKS / 2 {
                // SAFETY: 32 bytes at 32·i of a 512-byte chunk, and two
                // powers (32 bytes) from 2·i of 32.
                let (mut d, k) = unsafe {
                    (
                        _mm256_loadu_si256(c.as_ptr().add(32 * i).cast()),
                        _mm256_loadu_si256(powers[2 * i].as_ptr().cast()),
                    )
                };
                if i == 0 {
                    d = _mm256_xor_si256(d, _mm256_inserti128_si256(_mm256_setzero_si256(), s, 0));
                }
                lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(d, k, 0x00));
                hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(d, k, 0x11));
                mid = _mm256_xor_si256(
                    mid,
                    _mm256_xor_si256(
                        _mm256_clmulepi64_epi128(d, k, 0x01),
                        _mm256_clmulepi64_epi128(d, k, 0x10),
                    ),
                );
            }
            reduce(fold256(lo), fold256(mid), fold256(hi))
        })
    }

    /// Three carry-less multiplies a block (Karatsuba): the middle term
    /// is (d₀⊕d₁)(k₀⊕k₁) ⊕ lo ⊕ hi, and since every term is linear the
    /// correction is made once per chunk, on the sums.
    ///
    /// # Safety
    /// The CPU has PCLMULQDQ and SSE2 (the caller checked).
    #[target_feature(enable = "pclmulqdq,sse2")]
    pub(super) unsafe fn hash128(job: Job<'_>, folded: &[[u8; 16]; CHUNK_BLOCKS]) -> [u8; 16] {
        let powers = job.powers;
        drive(job, |c, s| {
            let mut lo = _mm_setzero_si128();
            let mut cross = _mm_setzero_si128();
            let mut hi = _mm_setzero_si128();
            for (j, (k, kf)) in powers.iter().zip(folded).enumerate() {
                let mut d = load128(&c[BLOCK * j..]);
                if j == 0 {
                    d = _mm_xor_si128(d, s);
                }
                let (k, kf) = (load128(k), load128(kf));
                let df = _mm_xor_si128(d, _mm_shuffle_epi32(d, 0x4e));
                lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(d, k, 0x00));
                hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(d, k, 0x11));
                cross = _mm_xor_si128(cross, _mm_clmulepi64_si128(df, kf, 0x00));
            }
            let mid = _mm_xor_si128(cross, _mm_xor_si128(lo, hi));
            reduce(lo, mid, hi)
        })
    }

    /// POLYVAL_H of `data`, then `last`, from the job's running state:
    /// each whole chunk through `chunk` (given the running state, which
    /// joins its first block; one reduction), the rest through [`finish`];
    /// without `last`, the running state after the whole chunks. Inlined
    /// into each width's function, whose target features `chunk` runs with.
    #[inline(always)]
    fn drive(job: Job<'_>, mut chunk: impl FnMut(&[u8], __m128i) -> __m128i) -> [u8; 16] {
        // SAFETY: only called from the width functions, whose callers
        // checked the CPU has SSE2 and PCLMULQDQ.
        unsafe {
            let mut s = load128(&job.start);
            let mut chunks = job.data.chunks_exact(CHUNK);
            for c in &mut chunks {
                s = chunk(c, s);
            }
            match job.last {
                Some(last) => finish(s, load128(job.h), chunks.remainder(), last),
                None => {
                    let mut out = [0u8; 16];
                    // SAFETY: 16 bytes into a 16-byte array.
                    _mm_storeu_si128(out.as_mut_ptr().cast(), s);
                    out
                }
            }
        }
    }

    /// The blocks after the last whole chunk, one multiply each, the
    /// zero-padded tail, then `last`; the hash.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2")]
    fn finish(mut s: __m128i, hk: __m128i, rest: &[u8], last: [u8; 16]) -> [u8; 16] {
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
    fn fold512(x: __m512i) -> __m128i {
        fold256(_mm256_xor_si256(
            _mm512_castsi512_si256(x),
            _mm512_extracti64x4_epi64(x, 1),
        ))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold256(y: __m256i) -> __m128i {
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

    const WIDTHS: [Width; 4] = [
        Width::Portable,
        Width::Clmul128,
        Width::Vpclmul256,
        Width::Vpclmul512,
    ];

    #[test]
    fn every_width_this_cpu_has_computes_the_polyval_crates_function() {
        let mut seed = 7;
        for width in WIDTHS.into_iter().filter(|w| w.available()) {
            for len in [0, 1, 15, 16, 17, 511, 512, 513, 1000, 4096, 5000, 376_832] {
                let h: [u8; 16] = bytes(&mut seed, 16).try_into().expect("16 bytes");
                let data = bytes(&mut seed, len);
                let last = [len as u8; 16];
                let key = Key::with_width(h, width);
                assert_eq!(key.width, width, "{width:?} runs where available");
                assert_eq!(
                    key.hash(&data, last),
                    portable(&h, [0; 16], &data, Some(last)),
                    "{width:?}, {len} bytes"
                );
                // Fed in uneven pieces, as bytes land from a socket.
                let mut stream = key.stream();
                let mut rest = &data[..];
                let mut piece = 1 + len % 700;
                while !rest.is_empty() {
                    let n = piece.min(rest.len());
                    stream.update(&rest[..n]);
                    rest = &rest[n..];
                    piece = piece * 7 % 1531 + 1;
                }
                assert_eq!(
                    stream.finish(last),
                    key.hash(&data, last),
                    "{width:?}, {len} bytes streamed"
                );
            }
        }
    }

    #[test]
    fn each_width_runs_where_the_cpu_has_it() {
        // The equality test above proves something only where a path
        // runs: each must run wherever the CPU says it can, and a key asks
        // for no more than the CPU has.
        if let Ok(cpu) = std::fs::read_to_string("/proc/cpuinfo") {
            let has = |f: &str| cpu.split_whitespace().any(|w| w == f);
            if cfg!(target_arch = "x86_64") {
                assert_eq!(Width::Clmul128.available(), has("pclmulqdq"));
                assert_eq!(
                    Width::Vpclmul256.available(),
                    has("pclmulqdq") && has("avx2") && has("vpclmulqdq")
                );
                assert_eq!(
                    Width::Vpclmul512.available(),
                    has("pclmulqdq") && has("avx2") && has("avx512f") && has("vpclmulqdq")
                );
            }
        }
        for width in WIDTHS {
            let key = Key::with_width([1; 16], width);
            assert!(key.width <= width && key.width.available(), "{width:?}");
        }
        assert!(Key::new([1; 16]).width == Width::detected());
    }
}
