// Paged attention for decode: one warp per (sequence, query head), over
// the sequence's pages in its page table. Every physical page carries an
// owner tag (tenant, request, generation). Before the warp reads a single
// byte of a page, lane 0 compares the page's tag with what the sequence's
// page-table entry expects; on a mismatch the sequence's error word is set
// (1 + the entry's index) and the warp returns having read nothing of that
// page. The request fails; the process and the other sequences go on.
//
// KV layout: pages[page][layer][k or v][kv_head][slot][head_dim], f16.
// Page tables: table[seq * max_pages + i] is a physical page index,
// want_gen[seq * max_pages + i] the generation it was mapped at;
// want_tenant[seq] and want_request[seq] the sequence's owner.

extern "C" __global__ void paged_attention_decode(
    float* out,                 // [seqs][heads][head_dim]
    const float* q,             // [seqs][heads][head_dim]
    const u16* kv,              // the pool
    const u64* tag_tenant,      // [pages]
    const u64* tag_request,     // [pages]
    const u64* tag_generation,  // [pages]
    const u32* table,           // [seqs][max_pages]
    const u64* want_gen,        // [seqs][max_pages]
    const u64* want_tenant,     // [seqs]
    const u64* want_request,    // [seqs]
    const u32* context,         // [seqs]: tokens to attend to
    u32* error,                 // [seqs]: 0, or 1 + the refused entry
    u32 seqs, u32 heads, u32 kv_heads, u32 head_dim,
    u32 layer, u32 layers, u32 page_size, u32 max_pages, float scale)
{
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const u32 lane = threadIdx.x % 32;
    if (warp >= (u64)seqs * heads) {
        return;
    }
    const u32 seq = (u32)(warp / heads);
    const u32 head = (u32)(warp % heads);
    const u32 kvh = head / (heads / kv_heads);
    const u32 per_lane = (head_dim + 31) / 32;
    const u64 page_elems = (u64)layers * 2 * kv_heads * page_size * head_dim;
    const u64 side = (u64)kv_heads * page_size * head_dim;

    float qv[4];
    float acc[4];
    for (u32 i = 0; i < 4; i++) {
        u32 d = lane + 32 * i;
        qv[i] = (i < per_lane && d < head_dim) ? q[((u64)seq * heads + head) * head_dim + d] : 0.0f;
        acc[i] = 0.0f;
    }
    float best = __int_as_float(0xff800000); // -infinity
    float total = 0.0f;
    const u32 n = context[seq];
    const u32 pages_used = (n + page_size - 1) / page_size;
    for (u32 e = 0; e < pages_used && e < max_pages; e++) {
        const u32 page = table[(u64)seq * max_pages + e];
        // The owner check, once per page, before any of its bytes.
        int ok = 1;
        if (lane == 0) {
            ok = tag_tenant[page] == want_tenant[seq]
                && tag_request[page] == want_request[seq]
                && tag_generation[page] == want_gen[(u64)seq * max_pages + e];
        }
        ok = __shfl_sync(0xffffffffu, ok, 0);
        if (!ok) {
            if (lane == 0) {
                atomicCAS(&error[seq], 0u, e + 1);
            }
            return;
        }
        const u16* k = kv + page * page_elems + ((u64)layer * 2 + 0) * side + (u64)kvh * page_size * head_dim;
        const u16* v = kv + page * page_elems + ((u64)layer * 2 + 1) * side + (u64)kvh * page_size * head_dim;
        const u32 slots = min(page_size, n - e * page_size);
        for (u32 s = 0; s < slots; s++) {
            float dot = 0.0f;
            for (u32 i = 0; i < per_lane && i < 4; i++) {
                u32 d = lane + 32 * i;
                if (d < head_dim) {
                    dot += qv[i] * h2f(k[(u64)s * head_dim + d]);
                }
            }
            const float score = warp_sum(dot) * scale;
            const float next = fmaxf(best, score);
            const float shrink = __expf(best - next);
            const float w = __expf(score - next);
            total = total * shrink + w;
            for (u32 i = 0; i < per_lane && i < 4; i++) {
                u32 d = lane + 32 * i;
                float vd = d < head_dim ? h2f(v[(u64)s * head_dim + d]) : 0.0f;
                acc[i] = acc[i] * shrink + w * vd;
            }
            best = next;
        }
    }
    for (u32 i = 0; i < per_lane && i < 4; i++) {
        u32 d = lane + 32 * i;
        if (d < head_dim) {
            out[((u64)seq * heads + head) * head_dim + d] = total > 0.0f ? acc[i] / total : 0.0f;
        }
    }
}

// Writes one token's keys and values into its page, after the same owner
// check: a write to a page the sequence does not own is refused, and
// nothing is written.
extern "C" __global__ void paged_kv_write(
    u16* kv,
    const float* k_new,         // [seqs][kv_heads][head_dim]
    const float* v_new,
    const u64* tag_tenant,
    const u64* tag_request,
    const u64* tag_generation,
    const u32* table,
    const u64* want_gen,
    const u64* want_tenant,
    const u64* want_request,
    const u32* position,        // [seqs]: the token's position
    u32* error,
    u32 seqs, u32 kv_heads, u32 head_dim,
    u32 layer, u32 layers, u32 page_size, u32 max_pages)
{
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 per_seq = (u64)kv_heads * head_dim;
    if (i >= seqs * per_seq) {
        return;
    }
    const u32 seq = i / per_seq;
    const u32 kvh = (i % per_seq) / head_dim;
    const u32 d = i % head_dim;
    const u32 e = position[seq] / page_size;
    const u32 slot = position[seq] % page_size;
    if (e >= max_pages) {
        atomicCAS(&error[seq], 0u, max_pages + 1);
        return;
    }
    const u32 page = table[(u64)seq * max_pages + e];
    if (tag_tenant[page] != want_tenant[seq] || tag_request[page] != want_request[seq]
        || tag_generation[page] != want_gen[(u64)seq * max_pages + e]) {
        atomicCAS(&error[seq], 0u, e + 1);
        return;
    }
    const u64 page_elems = (u64)layers * 2 * kv_heads * page_size * head_dim;
    const u64 side = (u64)kv_heads * page_size * head_dim;
    const u64 at = (u64)kvh * page_size * head_dim + (u64)slot * head_dim + d;
    kv[page * page_elems + ((u64)layer * 2) * side + at] = f2h(k_new[i]);
    kv[page * page_elems + ((u64)layer * 2 + 1) * side + at] = f2h(v_new[i]);
}

// Scrubs pages: every element of each listed page to zero (a freed page
// before it is lent again, as the CPU pool's scrub does).
extern "C" __global__ void scrub_pages(u16* kv, const u32* pages, u32 count, u64 page_elems)
{
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)count * page_elems) {
        return;
    }
    kv[(u64)pages[i / page_elems] * page_elems + i % page_elems] = 0;
}
