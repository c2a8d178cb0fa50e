//! The summation orders of llama.cpp's f32 and f16 dot products as its
//! AVX-512 build runs them: which lane each element joins and the tree
//! that combines the lanes. Attention and the plain ops both sum in them.

/// The summation order of one of llama.cpp's f16 dot products, as its
/// AVX-512 build runs them. With f16-rounded inputs every product is exact
/// in f32, so following the same order gives bit-identical sums on any CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumOrder {
    /// tinyBLAS (llamafile sgemm), used for two or more query rows: element
    /// `i` goes to lane `i % 16`, lanes combined as `_mm512_reduce_add_ps`.
    Sgemm,
    /// `ggml_vec_dot_f16`, used for a single query row: element `i` goes to
    /// accumulator `(i % 64) / 16`, lane `i % 16`.
    VecDot,
}

/// Accumulator lanes a [`SumOrder`] needs at most.
pub const LANES: usize = 64;

/// `_mm512_reduce_add_ps` as GCC defines it: halves added pairwise, 256,
/// then 128 bits, then `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
pub fn reduce16(l: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|j| l[j + 8] + l[j]);
    let t6: [f32; 4] = std::array::from_fn(|j| t3[j + 4] + t3[j]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

impl SumOrder {
    /// Number of partial sums.
    pub fn lanes(self) -> usize {
        match self {
            SumOrder::Sgemm => 16,
            SumOrder::VecDot => 64,
        }
    }

    /// Combines partial sums `l[..self.lanes()]` in the library's order.
    #[inline(always)]
    pub fn combine(self, l: &[f32; LANES]) -> f32 {
        match self {
            SumOrder::Sgemm => reduce16(&std::array::from_fn(|j| l[j])),
            // GGML_F32x16_REDUCE: (acc0 + acc2) + (acc1 + acc3), then reduce.
            SumOrder::VecDot => reduce16(&std::array::from_fn(|j| {
                (l[j] + l[32 + j]) + (l[16 + j] + l[48 + j])
            })),
        }
    }
}
