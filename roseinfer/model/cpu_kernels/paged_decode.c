/* Paged decode attention for the CPU: one query token per sequence, reading
 * keys and values in place through the block table.
 *
 * The torch reference gathers every sequence's context into a fresh tensor
 * (a read and a write of all of it) and then runs SDPA over the copy (a second
 * read). This kernel reads each key and value once, straight from the cache
 * blocks, with an online softmax a block at a time, so a decode step moves a
 * third of the bytes. One call computes the (sequence, head) rows
 * [row_begin, row_end) of the num_seqs * num_heads rows, so the caller can
 * split a step across threads (ctypes releases the GIL).
 *
 * Layouts (C-contiguous): q, out [num_seqs, num_heads, head_dim];
 * k_cache, v_cache [num_blocks, block_size, num_heads, head_dim];
 * block_tables [num_seqs, max_blocks] int32; context_lens [num_seqs] int32.
 * Elements are fp32 or bf16 (bf16 is widened to fp32; all arithmetic is fp32).
 *
 * Compiled at first use by roseinfer.model.cpu_attention with
 * cc -O3 -march=native -fopenmp-simd: the simd pragmas vectorize the dot
 * products and the weighted sums without an OpenMP runtime, which would
 * compete with torch's own threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_HEAD_DIM 256
#define MAX_BLOCK_SIZE 256

static inline float load(const void *p, int64_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16; /* bf16 is fp32's top half */
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static inline void store(void *p, int64_t i, float x, int bf16) {
    if (!bf16) {
        ((float *)p)[i] = x;
        return;
    }
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u); /* round to nearest, ties to even */
    ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
}

/* `bf16` is a constant in each caller below, so the compiler builds one
 * specialised copy per element type with no branch left in the loops. */
static inline __attribute__((always_inline)) int paged_decode(
    const void *q, const void *k_cache, const void *v_cache, const int32_t *block_tables,
    const int32_t *context_lens, void *out, int64_t row_begin, int64_t row_end, int64_t num_heads,
    int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale, int bf16) {
    if (head_dim > MAX_HEAD_DIM || block_size > MAX_BLOCK_SIZE) return 1;
    const int64_t token_stride = num_heads * head_dim;
    float qf[MAX_HEAD_DIM], acc[MAX_HEAD_DIM], scores[MAX_BLOCK_SIZE];
    for (int64_t r = row_begin; r < row_end; ++r) {
        const int64_t seq = r / num_heads, head = r % num_heads;
        const int64_t context = context_lens[seq];
        const int32_t *table = block_tables + seq * max_blocks;
        for (int64_t d = 0; d < head_dim; ++d) qf[d] = load(q, r * head_dim + d, bf16) * scale;
        for (int64_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
        float running_max = -INFINITY, denom = 0.0f;
        for (int64_t start = 0; start < context; start += block_size) {
            const int64_t n = context - start < block_size ? context - start : block_size;
            const int64_t first = (int64_t)table[start / block_size] * block_size * token_stride
                                  + head * head_dim;
            float block_max = -INFINITY;
            for (int64_t t = 0; t < n; ++t) {
                const int64_t k = first + t * token_stride;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; ++d) dot += qf[d] * load(k_cache, k + d, bf16);
                scores[t] = dot;
                block_max = dot > block_max ? dot : block_max;
            }
            /* Online softmax: rescale what was summed under the old maximum. */
            const float new_max = block_max > running_max ? block_max : running_max;
            const float rescale = expf(running_max - new_max);
            denom *= rescale;
            for (int64_t d = 0; d < head_dim; ++d) acc[d] *= rescale;
            for (int64_t t = 0; t < n; ++t) {
                const float p = expf(scores[t] - new_max);
                const int64_t v = first + t * token_stride;
                denom += p;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * load(v_cache, v + d, bf16);
            }
            running_max = new_max;
        }
        const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) store(out, r * head_dim + d, acc[d] * inv, bf16);
    }
    return 0;
}

int paged_decode_f32(const void *q, const void *k_cache, const void *v_cache, const int32_t *block_tables,
                     const int32_t *context_lens, void *out, int64_t row_begin, int64_t row_end,
                     int64_t num_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks,
                     float scale) {
    return paged_decode(q, k_cache, v_cache, block_tables, context_lens, out, row_begin, row_end,
                        num_heads, head_dim, block_size, max_blocks, scale, 0);
}

int paged_decode_bf16(const void *q, const void *k_cache, const void *v_cache, const int32_t *block_tables,
                      const int32_t *context_lens, void *out, int64_t row_begin, int64_t row_end,
                      int64_t num_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks,
                      float scale) {
    return paged_decode(q, k_cache, v_cache, block_tables, context_lens, out, row_begin, row_end,
                        num_heads, head_dim, block_size, max_blocks, scale, 1);
}
