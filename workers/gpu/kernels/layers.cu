// The per-token layers of a LLaMA block: RMSNorm, rotary positions (the
// GGUF LLaMA layout: adjacent pairs), SwiGLU's gate, residual adds.

// One block per row; blockDim.x a power of two up to 1024.
extern "C" __global__ void rms_norm(float* out, const float* x, const float* weight, u32 cols, float eps)
{
    __shared__ float part[1024];
    const u32 row = blockIdx.x;
    const float* r = x + (u64)row * cols;
    float s = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        s += r[c] * r[c];
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (u32 stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            part[threadIdx.x] += part[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const float inv = rsqrtf(part[0] / cols + eps);
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        out[(u64)row * cols + c] = r[c] * inv * weight[c];
    }
}

// x: [rows][heads][head_dim]; each row's position in `position`.
extern "C" __global__ void rope(float* x, const u32* position, u32 rows, u32 heads, u32 head_dim, float theta)
{
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 half_dim = head_dim / 2;
    if (i >= (u64)rows * heads * half_dim) {
        return;
    }
    const u32 row = i / ((u64)heads * half_dim);
    const u32 pair = i % half_dim;
    const u64 base = (i / half_dim) * head_dim + 2 * pair;
    const float freq = powf(theta, -2.0f * pair / head_dim);
    float s, c;
    sincosf(position[row] * freq, &s, &c);
    const float a = x[base];
    const float b = x[base + 1];
    x[base] = a * c - b * s;
    x[base + 1] = a * s + b * c;
}

// gate = silu(gate) * up, elementwise.
extern "C" __global__ void silu_mul(float* gate, const float* up, u64 n)
{
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + __expf(-g)) * up[i];
    }
}

// x += y, elementwise.
extern "C" __global__ void add_in_place(float* x, const float* y, u64 n)
{
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] += y[i];
    }
}
