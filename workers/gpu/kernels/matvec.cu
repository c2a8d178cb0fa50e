// Quantized matrix times activations, in the GGUF block formats the CPU
// engine reads: one warp per (output row, activation row). Blocks are
// read byte by byte (a block's size is not a multiple of its alignment).
//
// Q4_1 block (20 bytes): f16 scale d, f16 minimum m, 16 bytes of nibbles;
// weight j is d * q_j + m, q_j the low nibble of byte j for j < 16 and the
// high nibble of byte j - 16 after. Q8_0 block (34 bytes): f16 scale d,
// 32 signed bytes; weight j is d * q_j.

// One warp per (output row, activation row): this thread's pair and lane,
// false past the last pair.
__device__ __forceinline__ bool warp_pair(u32 rows, u32 xs, u32* row, u32* xr, u32* lane)
{
    // 64-bit: a launch may have more than 2^32 threads.
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    *lane = threadIdx.x % 32;
    *row = (u32)(warp % rows);
    *xr = (u32)(warp / rows);
    return warp < (u64)rows * xs;
}

// The warp's sum of its lanes' partial dots, written by lane 0.
__device__ __forceinline__ void warp_store(float* out, float s, u32 rows, u32 row, u32 xr, u32 lane)
{
    s = warp_sum(s);
    if (lane == 0) {
        out[(u64)xr * rows + row] = s;
    }
}

struct Q4_1 {
    static constexpr u32 BYTES = 20;
    // One block's weights times its 32 activations.
    static __device__ __forceinline__ float dot(const u8* blk, const float* ab)
    {
        const float d = h2f(load_u16(blk));
        const float m = h2f(load_u16(blk + 2));
        float dot = 0.0f, sum = 0.0f;
        for (u32 j = 0; j < 16; j++) {
            const u8 q = blk[4 + j];
            dot += (float)(q & 0xF) * ab[j] + (float)(q >> 4) * ab[j + 16];
            sum += ab[j] + ab[j + 16];
        }
        return d * dot + m * sum;
    }
};

struct Q4_0 {
    static constexpr u32 BYTES = 18;
    // Q4_0 (18 bytes): f16 scale d, 16 bytes of nibbles; weight j is
    // d * (q_j - 8), nibbles as Q4_1's.
    static __device__ __forceinline__ float dot(const u8* blk, const float* ab)
    {
        const float d = h2f(load_u16(blk));
        float dot = 0.0f;
        for (u32 j = 0; j < 16; j++) {
            const u8 q = blk[2 + j];
            dot += ((float)(q & 0xF) - 8.0f) * ab[j] + ((float)(q >> 4) - 8.0f) * ab[j + 16];
        }
        return d * dot;
    }
};

struct Q8_0 {
    static constexpr u32 BYTES = 34;
    static __device__ __forceinline__ float dot(const u8* blk, const float* ab)
    {
        const float d = h2f(load_u16(blk));
        float dot = 0.0f;
        for (u32 j = 0; j < 32; j++) {
            dot += (float)(signed char)blk[2 + j] * ab[j];
        }
        return d * dot;
    }
};

// A block format's matvec: each lane sums every 32nd block of the row.
template <typename F>
__device__ __forceinline__ void matvec_blocks(float* out, const u8* w, const float* x, u32 rows, u32 cols, u32 xs)
{
    u32 row, xr, lane;
    if (!warp_pair(rows, xs, &row, &xr, &lane)) {
        return;
    }
    const u32 blocks = cols / 32;
    const u8* r = w + (u64)row * blocks * F::BYTES;
    const float* a = x + (u64)xr * cols;
    float s = 0.0f;
    for (u32 b = lane; b < blocks; b += 32) {
        s += F::dot(r + (u64)b * F::BYTES, a + b * 32);
    }
    warp_store(out, s, rows, row, xr, lane);
}

extern "C" __global__ void matvec_q4_0(float* out, const u8* w, const float* x, u32 rows, u32 cols, u32 xs)
{
    matvec_blocks<Q4_0>(out, w, x, rows, cols, xs);
}

extern "C" __global__ void matvec_q4_1(float* out, const u8* w, const float* x, u32 rows, u32 cols, u32 xs)
{
    matvec_blocks<Q4_1>(out, w, x, rows, cols, xs);
}

extern "C" __global__ void matvec_q8_0(float* out, const u8* w, const float* x, u32 rows, u32 cols, u32 xs)
{
    matvec_blocks<Q8_0>(out, w, x, rows, cols, xs);
}

// F32 weights (norms, and models stored unquantized).
extern "C" __global__ void matvec_f32(float* out, const float* w, const float* x, u32 rows, u32 cols, u32 xs)
{
    u32 row, xr, lane;
    if (!warp_pair(rows, xs, &row, &xr, &lane)) {
        return;
    }
    const float* r = w + (u64)row * cols;
    const float* a = x + (u64)xr * cols;
    float s = 0.0f;
    for (u32 c = lane; c < cols; c += 32) {
        s += r[c] * a[c];
    }
    warp_store(out, s, rows, row, xr, lane);
}
