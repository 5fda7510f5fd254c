/* Paged decode attention for the CPU: one query token per sequence, reading
 * keys and values in place through the block table.
 *
 * The torch reference gathers every sequence's context into a fresh tensor
 * (a read and a write of all of it) and then runs SDPA over the copy (a second
 * read). This kernel reads each key and value once, straight from the cache
 * blocks, with an online softmax a block at a time, so a decode step moves a
 * third of the bytes.
 *
 * The loops run over a *span of heads* of one cached token at a time: in the
 * cache a token's heads sit side by side ([..., num_heads, head_dim]), so the
 * span is one contiguous run of memory (768 elements for gpt2). The products
 * q*k and the update acc += p*v are then long, branch-free loops the compiler
 * vectorizes fully, and the per-head sums are independent of each other,
 * instead of one 64-element dot product whose result the next one waits on.
 * The exponentials of a whole block are taken in one vectorized loop too.
 *
 * One call computes sequences [seq_begin, seq_end) for heads [head_begin,
 * head_end), so the caller can split a step across threads by sequences or,
 * for a single sequence, by heads (ctypes releases the GIL).
 *
 * The step's new keys and values are written into the cache here too, each
 * piece its own sequence's heads just before it reads them: one pass instead
 * of two indexed copies a layer, and q, k and v are read straight out of the
 * QKV projection's output (a token's q, k, v side by side, `in_stride` apart).
 *
 * Grouped-query attention: the cache holds `num_kv_heads` heads a token, each
 * shared by `group` = num_heads / num_kv_heads consecutive query heads (query
 * head h reads KV head h / group, as transformers lays them out). A piece
 * spans whole KV heads and all their query heads, so each cached key and value
 * is read from memory once for the `group` query heads that share it: the bytes
 * a step moves shrink with the KV heads, which is what GQA is for.
 *
 * With fp32 keys and a head_dim that is a multiple of the vector width, each
 * score is a vector dot product summed across lanes by halves (sum_lanes), and
 * under GQA a block's values are summed a head at a time with the accumulator
 * in a register (add_block_values): per token, the scores' scalar reductions
 * and the accumulator's loads and stores had cost more than the products.
 *
 * Layouts: q [num_seqs, num_heads, head_dim] and new_k, new_v [num_seqs,
 * num_kv_heads, head_dim], all with a token stride of `in_stride` elements
 * (heads and head_dim contiguous); slots [num_seqs]
 * int64 (the new token's cache slot, < 0: write nothing; at or past num_slots: an
 * error, nothing written out of bounds); out
 * [num_seqs, num_heads, head_dim] C-contiguous;
 * k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim];
 * block_tables [num_seqs, max_blocks] int32; context_lens [num_seqs] int32.
 * Elements are fp32 or bf16 (bf16 is widened to fp32; all arithmetic is fp32).
 *
 * Compiled at first use by roseinfer.kernels.cpu.build with
 * cc -O3 -march=native -fopenmp-simd: the simd pragmas vectorize the loops
 * without an OpenMP runtime, which would compete with torch's own threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* With AVX512-BF16 (compiled with -march=native on a CPU that has it), bf16 keys meet the query
 * on the bf16 dot-product units: q and k are bf16 already, their products are exact in fp32. */
#if defined(__x86_64__) && defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define BF16_DOT 1
#else
#define BF16_DOT 0
#endif

/* Limits of one call (the caller checks them and splits the heads to fit). */
#define MAX_SPAN 4096      /* query heads x head_dim in one call */
#define MAX_SPAN_HEADS 64  /* query heads in one call */
#define MAX_BLOCK_SIZE 256 /* tokens in a cache block */
/* Status bits a call returns (the pieces' statuses are OR-ed): 0 is success. */
#define STATUS_LIMITS 1    /* a span, head count or block size over the limits above */
#define STATUS_BAD_SLOT 2  /* a new token's slot at or past the cache's end: nothing written there */
#define STATUS_BAD_TABLE 4 /* a context longer than its block-table row, or a block id outside the cache */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 1 /* blocks: one ahead measured as well as two on a shuffled cache */
#endif

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

/* exp(x) for x <= 0 (softmax arguments), vectorizable: 2^(x log2 e) split into
 * an integer power of two (set in the exponent bits) and 2^f, f in [-0.5, 0.5],
 * by a degree-6 polynomial; relative error about 2e-7, like expf's. At or below -87
 * the result is 0, which is what the softmax wants.
 * The two selects are integer masks, not float ternaries: gcc vectorizes a float
 * select only with AVX-512's mask registers, and left this loop scalar on AVX2. */
static inline __attribute__((always_inline)) float exp_neg(float x) {
    const int32_t underflow = -(int32_t)(x <= -87.0f); /* all ones where the result is 0 */
    int32_t x_bits, floor_bits;
    const float floor = -87.0f;
    memcpy(&x_bits, &x, sizeof x_bits);
    memcpy(&floor_bits, &floor, sizeof floor_bits);
    x_bits = (x_bits & ~underflow) | (floor_bits & underflow); /* keeps n in range below */
    memcpy(&x, &x_bits, sizeof x);
    const float t = x * 1.44269504088896341f;
    /* Round to nearest by the 1.5 * 2^23 trick: branch-free and vectorizable. */
    const float n = (t + 12582912.0f) - 12582912.0f;
    const float f = t - n;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits = (bits + ((int32_t)n << 23)) & ~underflow;
    float y;
    memcpy(&y, &bits, sizeof y);
    return y;
}

/* Whether every block sequences [seq_begin, seq_end) read is in their block-table rows and in the
 * cache, checked before any is read (the prefetch looks into the next sequences' rows too): a
 * scheduler bug must fail loudly, not read another request's keys and values or memory past the
 * cache. */
static int tables_in_bounds(const int32_t *block_tables, const int32_t *context_lens, int64_t seq_begin,
                            int64_t seq_end, int64_t max_blocks, int64_t block_size, int64_t num_blocks) {
    for (int64_t s = seq_begin; s < seq_end; ++s) {
        const int64_t blocks = ((int64_t)context_lens[s] + block_size - 1) / block_size;
        if (context_lens[s] < 0 || blocks > max_blocks) return 0;
        for (int64_t j = 0; j < blocks; ++j) {
            const int32_t id = block_tables[s * max_blocks + j];
            if (id < 0 || id >= num_blocks) return 0;
        }
    }
    return 1;
}

/* The cache block `j` blocks into sequence `seq`'s context, running on into the next sequences'
 * blocks past its last one (up to seq_end); -1 past the piece's last block.
 * The blocks ahead are somewhere else in memory, and the prefetchers follow no block table: the
 * kernel fetches the block PREFETCH_AHEAD blocks on while one is computed, one token's span of it
 * for each token there (keys during the scores, values during the sums), into L2. */
static inline int64_t block_ahead(const int32_t *block_tables, const int32_t *context_lens, int64_t seq,
                                  int64_t seq_end, int64_t j, int64_t max_blocks, int64_t block_size) {
    for (; seq < seq_end; ++seq) {
        const int64_t blocks = (context_lens[seq] + block_size - 1) / block_size;
        if (j < blocks) return block_tables[seq * max_blocks + j];
        j -= blocks;
    }
    return -1;
}

/* One new token's key and value (`span` elements of `elem` bytes at `in_at`) into its cache slot. */
static inline void write_new_kv(const void *new_k, const void *new_v, int64_t in_at, void *k_cache, void *v_cache,
                                int64_t slot_at, int64_t span, int64_t elem) {
    const size_t bytes = (size_t)span * elem;
    memcpy((char *)k_cache + slot_at * elem, (const char *)new_k + in_at * elem, bytes);
    memcpy((char *)v_cache + slot_at * elem, (const char *)new_v + in_at * elem, bytes);
}

#if BF16_DOT
/* One cached token's scores q.k / sqrt(d) for every query head of the span, from bf16 pairs on the bf16
 * units (summed in fp32), into scores[0..heads), and each head's running block maximum. */
static inline __attribute__((always_inline)) void bf16_scores(const uint16_t *qb, const uint16_t *kb, int64_t heads,
                                                              int64_t group, int64_t head_dim, float scale,
                                                              float *scores, float *block_max) {
    for (int64_t h = 0; h < heads; ++h) {
        __m512 sum = _mm512_setzero_ps();
        const uint16_t *qh = qb + h * head_dim, *kh = kb + (h / group) * head_dim;
        for (int64_t d = 0; d < head_dim; d += 32)
            sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(qh + d), (__m512bh)_mm512_loadu_si512(kh + d));
        const float dot = _mm512_reduce_add_ps(sum) * scale;
        scores[h] = dot;
        block_max[h] = dot > block_max[h] ? dot : block_max[h];
    }
}
#endif

/* Vectors of the width the compiler targets (-march), for the fp32 dot products below. */
#if defined(__AVX512F__)
#define DOT_LANES 16
#elif defined(__AVX__)
#define DOT_LANES 8
#else
#define DOT_LANES 4
#endif
typedef float lanes_t __attribute__((vector_size(DOT_LANES * 4), aligned(4)));

/* The sum of a vector's lanes by halves, each step one vector add. An `omp simd reduction` ends in
 * one scalar add a lane instead (16 dependent adds on AVX-512, through the stack), which cost a
 * decode step more than all its products. */
static inline __attribute__((always_inline)) float sum_lanes(lanes_t v) {
#if DOT_LANES == 16
    typedef float half_t __attribute__((vector_size(32), aligned(4)));
    const half_t h8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#elif DOT_LANES == 8
    const lanes_t h8 = v;
#endif
#if DOT_LANES >= 8
    typedef float quarter_t __attribute__((vector_size(16), aligned(4)));
    const quarter_t h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
#else
    const lanes_t h4 = v;
#endif
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

/* q.k over head_dim fp32 elements (a multiple of DOT_LANES), summed lane-wise, then across lanes. */
static inline __attribute__((always_inline)) float dot_f32(const float *q, const float *k, int64_t head_dim) {
    lanes_t sum = *(const lanes_t *)q * *(const lanes_t *)k;
    for (int64_t d = DOT_LANES; d < head_dim; d += DOT_LANES) sum += *(const lanes_t *)(q + d) * *(const lanes_t *)(k + d);
    return sum_lanes(sum);
}

/* One cached token's scores q.k / sqrt(d) for every query head of the span (q already scaled, in qf),
 * into scores[0..heads), and each head's running block maximum. fp32 keys with head_dim a multiple of
 * the vector width: a vector dot product a query head against its KV head's key. Otherwise: first the
 * products over the whole span (one long vectorized loop; under GQA a loop a query head), then a sum a
 * head. */
static inline __attribute__((always_inline)) void fp32_scores(const float *qf, const void *k_cache, int64_t k,
                                                              float *prod, int64_t heads, int64_t group,
                                                              int64_t head_dim, int bf16, float *scores,
                                                              float *block_max) {
    if (!bf16 && head_dim % DOT_LANES == 0) {
        const float *key = (const float *)k_cache + k;
        for (int64_t h = 0; h < heads; ++h) {
            const float dot = dot_f32(qf + h * head_dim, key + (h / group) * head_dim, head_dim);
            scores[h] = dot;
            block_max[h] = dot > block_max[h] ? dot : block_max[h];
        }
        return;
    }
    if (group == 1) {
#pragma omp simd
        for (int64_t i = 0; i < heads * head_dim; ++i) prod[i] = qf[i] * load(k_cache, k + i, bf16);
    } else {
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t kh = k + (h / group) * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) prod[h * head_dim + d] = qf[h * head_dim + d] * load(k_cache, kh + d, bf16);
        }
    }
    for (int64_t h = 0; h < heads; ++h) {
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; ++d) dot += prod[h * head_dim + d];
        scores[h] = dot;
        block_max[h] = dot > block_max[h] ? dot : block_max[h];
    }
}

/* acc += p * v for one cached token's values, each query head with its own weight p (scores[h], already
 * exponentiated) on its KV head's value, and the weights into each head's softmax denominator. */
static inline __attribute__((always_inline)) void add_values(const float *scores, const void *v_cache, int64_t v,
                                                             int64_t heads, int64_t group, int64_t head_dim, int bf16,
                                                             float *denom, float *acc) {
    for (int64_t h = 0; h < heads; ++h) {
        const float p = scores[h];
        const int64_t vh = v + (h / group) * head_dim;
        denom[h] += p;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) acc[h * head_dim + d] += p * load(v_cache, vh + d, bf16);
    }
}

/* acc += p * v for a block's n cached tokens at once, fp32 values and head_dim a multiple of the vector
 * width: each head's accumulator stays in a register over the block's tokens instead of a load and a
 * store a token, which bounded the loop above under GQA, where the group's query heads read each value
 * from L1 after the first. (Multi-head attention keeps the loop above: it streams the block in memory
 * order, which this loop's walk across tokens a head at a time does not, and measured slower.) */
static inline __attribute__((always_inline)) void add_block_values(const float *scores, const float *v_block,
                                                                   int64_t n, int64_t token_stride, int64_t heads,
                                                                   int64_t group, int64_t head_dim, float *denom,
                                                                   float *acc) {
    for (int64_t h = 0; h < heads; ++h) {
        const float *vh = v_block + (h / group) * head_dim;
        float p_sum = 0.0f;
        for (int64_t t = 0; t < n; ++t) p_sum += scores[t * heads + h];
        denom[h] += p_sum;
        for (int64_t d = 0; d < head_dim; d += DOT_LANES) {
            lanes_t a = *(lanes_t *)(acc + h * head_dim + d);
            for (int64_t t = 0; t < n; ++t) a += scores[t * heads + h] * *(const lanes_t *)(vh + t * token_stride + d);
            *(lanes_t *)(acc + h * head_dim + d) = a;
        }
    }
}

/* Into L2: n tokens' spans of span_bytes each, stride_bytes apart, from `base` (a block ahead). */
static inline void prefetch_tokens(const char *base, int64_t n, int64_t stride_bytes, int64_t span_bytes) {
    for (int64_t t = 0; t < n; ++t)
        for (int64_t b = 0; b < span_bytes; b += 64) __builtin_prefetch(base + t * stride_bytes + b, 0, 2);
}

/* The output of each head: its weighted sum of values over its softmax denominator. */
static inline __attribute__((always_inline)) void store_normalized(void *out, int64_t out_at, const float *acc,
                                                                   const float *denom, int64_t heads,
                                                                   int64_t head_dim, int bf16) {
    for (int64_t h = 0; h < heads; ++h) {
        const float inv = denom[h] > 0.0f ? 1.0f / denom[h] : 0.0f;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) store(out, out_at + h * head_dim + d, acc[h * head_dim + d] * inv, bf16);
    }
}

/* `bf16` is a constant in each caller below, so the compiler builds one
 * specialised copy per element type with no branch left in the loops. */
static inline __attribute__((always_inline)) int paged_decode(
    const void *q, const void *new_k, const void *new_v, const int64_t *slots, int64_t in_stride,
    int64_t num_slots, void *k_cache, void *v_cache, const int32_t *block_tables,
    const int32_t *context_lens, void *out, int64_t seq_begin, int64_t seq_end, int64_t head_begin,
    int64_t head_end, int64_t num_kv_heads, int64_t group, int64_t head_dim, int64_t block_size,
    int64_t max_blocks, float scale, int bf16) {
    /* This piece: KV heads [head_begin, head_end) of the cache, and the `group` query heads of each. */
    const int64_t kv_heads = head_end - head_begin, heads = kv_heads * group;
    const int64_t span = heads * head_dim, kv_span = kv_heads * head_dim;
    if (kv_heads <= 0 || group <= 0 || heads > MAX_SPAN_HEADS || span > MAX_SPAN || block_size > MAX_BLOCK_SIZE)
        return STATUS_LIMITS;
    const int64_t token_stride = num_kv_heads * head_dim, first_elem = head_begin * head_dim; /* in the cache */
    const int64_t q_stride = token_stride * group, first_q = first_elem * group;            /* in q and out */
    const int64_t elem = bf16 ? 2 : 4;
    if (!tables_in_bounds(block_tables, context_lens, seq_begin, seq_end, max_blocks, block_size,
                          num_slots / block_size))
        return STATUS_BAD_TABLE;
    float qf[MAX_SPAN], acc[MAX_SPAN], prod[MAX_SPAN];
    float scores[MAX_BLOCK_SIZE * MAX_SPAN_HEADS]; /* [token][head] of the current block */
    float running_max[MAX_SPAN_HEADS], denom[MAX_SPAN_HEADS], block_max[MAX_SPAN_HEADS];
    for (int64_t seq = seq_begin; seq < seq_end; ++seq) {
        const int64_t context = context_lens[seq];
        const int32_t *table = block_tables + seq * max_blocks;
        const int64_t in_at = seq * in_stride + first_q, out_at = seq * q_stride + first_q;
        if (new_k != 0 && slots[seq] >= num_slots) return STATUS_BAD_SLOT; /* never write outside the cache */
        if (new_k != 0 && slots[seq] >= 0) /* this token's K/V for these heads, into its slot */
            write_new_kv(new_k, new_v, seq * in_stride + first_elem, k_cache, v_cache,
                         slots[seq] * token_stride + first_elem, kv_span, elem);
#pragma omp simd
        for (int64_t i = 0; i < span; ++i) qf[i] = load(q, in_at + i, bf16) * scale;
        memset(acc, 0, (size_t)span * sizeof *acc);
        for (int64_t h = 0; h < heads; ++h) running_max[h] = -INFINITY, denom[h] = 0.0f;
        for (int64_t start = 0; start < context; start += block_size) {
            const int64_t n = context - start < block_size ? context - start : block_size;
            const int64_t block_at = (int64_t)table[start / block_size] * block_size * token_stride + first_elem;
            for (int64_t h = 0; h < heads; ++h) block_max[h] = -INFINITY;
            /* The blocks ahead are elsewhere in memory, and no prefetcher follows a block table (block_ahead). */
            const int64_t next_block = block_ahead(block_tables, context_lens, seq, seq_end,
                                                   start / block_size + PREFETCH_AHEAD, max_blocks, block_size);
            const int64_t next_at = next_block < 0 ? -1 : next_block * block_size * token_stride + first_elem;
            const char *next_k = next_at < 0 ? 0 : (const char *)k_cache + next_at * elem;
            const char *next_v = next_at < 0 ? 0 : (const char *)v_cache + next_at * elem;
            for (int64_t t = 0; t < n; ++t) { /* scores of every head for one token */
                const int64_t k = block_at + t * token_stride;
                if (next_k != 0)
                    for (int64_t b = 0; b < kv_span * elem; b += 64) __builtin_prefetch(next_k + t * token_stride * elem + b, 0, 2);
#if BF16_DOT
                if (bf16 && head_dim % 32 == 0) { /* q.k of bf16 pairs on the bf16 units, summed in fp32 */
                    bf16_scores((const uint16_t *)q + in_at, (const uint16_t *)k_cache + k, heads, group, head_dim,
                                scale, scores + t * heads, block_max);
                    continue;
                }
#endif
                fp32_scores(qf, k_cache, k, prod, heads, group, head_dim, bf16, scores + t * heads, block_max);
            }
            /* Online softmax: rescale what was summed under each head's old maximum. */
            for (int64_t h = 0; h < heads; ++h) {
                const float new_max = block_max[h] > running_max[h] ? block_max[h] : running_max[h];
                const float rescale = running_max[h] == -INFINITY ? 0.0f : exp_neg(running_max[h] - new_max);
                denom[h] *= rescale;
                running_max[h] = new_max;
                if (rescale != 1.0f) {
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; ++d) acc[h * head_dim + d] *= rescale;
                }
            }
            for (int64_t t = 0; t < n; ++t) {
#pragma omp simd
                for (int64_t h = 0; h < heads; ++h) scores[t * heads + h] -= running_max[h];
            }
#pragma omp simd
            for (int64_t i = 0; i < n * heads; ++i) scores[i] = exp_neg(scores[i]);
            if (!bf16 && group > 1 && head_dim % DOT_LANES == 0) { /* GQA: the block's values a head at a time
                                                                        (bf16 values: measured slower) */
                if (next_v != 0) prefetch_tokens(next_v, n, token_stride * elem, kv_span * elem);
                add_block_values(scores, (const float *)v_cache + block_at, n, token_stride, heads, group, head_dim,
                                 denom, acc);
                continue;
            }
            for (int64_t t = 0; t < n; ++t) { /* acc += p * v over the token's whole span */
                const int64_t v = block_at + t * token_stride;
                if (next_v != 0)
                    for (int64_t b = 0; b < kv_span * elem; b += 64) __builtin_prefetch(next_v + t * token_stride * elem + b, 0, 2);
                add_values(scores + t * heads, v_cache, v, heads, group, head_dim, bf16, denom, acc);
            }
        }
        store_normalized(out, out_at, acc, denom, heads, head_dim, bf16); /* acc / the softmax's denominator */
    }
    return 0;
}

/* Cuts sequences [0, num_seqs) into `parts` runs of about equal work: bounds[p] .. bounds[p + 1] is
 * run p. A sequence's work is its context (every cached key and value is read) plus one for its
 * query and output; a cut by count alone would give one thread most of a batch of mixed lengths
 * (32 contexts falling from 128 to 1 put 97% of the tokens in the first half). Each sequence goes
 * to the run in which more than half of its work falls. */
#define MAX_SEQ_PARTS 256
int paged_decode_max_seq_parts(void) { return MAX_SEQ_PARTS; }
void paged_decode_split(const int32_t *context_lens, int64_t num_seqs, int64_t parts, int64_t *bounds) {
    int64_t total = 0;
    for (int64_t s = 0; s < num_seqs; ++s) total += (int64_t)context_lens[s] + 1;
    int64_t s = 0, done = 0;
    bounds[0] = 0;
    for (int64_t p = 1; p < parts; ++p) {
        const int64_t target = total * p / parts;
        while (s < num_seqs && 2 * done + context_lens[s] + 1 <= 2 * target) done += context_lens[s++] + 1;
        bounds[p] = s;
    }
    bounds[parts] = num_seqs;
}

/* The whole step, its pieces spread over `threads` OpenMP threads. Built with
 * -fopenmp, this library needs libgomp.so.1, and the dynamic loader hands it
 * the libgomp torch has already loaded: the pieces run on torch's own worker
 * threads, which are still spinning from the projection just before, instead
 * of a second pool of threads competing with them for the same two cores.
 * Pieces: sequences split in `seq_parts` runs of equal work, KV heads in groups of `head_group` (each with
 * its query heads). */
#define PAGED_DECODE(name, is_bf16)                                                                       \
    int name(const void *q, const void *new_k, const void *new_v, const int64_t *slots, int64_t in_stride, \
             int64_t num_slots, void *k_cache, void *v_cache, const int32_t *block_tables,                                   \
             const int32_t *context_lens, void *out, int64_t num_seqs, int64_t seq_parts,                \
             int64_t head_group, int64_t threads, int64_t num_heads, int64_t num_kv_heads,               \
             int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale) {                    \
        if (seq_parts > MAX_SEQ_PARTS || seq_parts < 1) return STATUS_LIMITS;                                      \
        if (num_kv_heads < 1 || head_group < 1 || num_heads % num_kv_heads) return STATUS_LIMITS;                 \
        const int64_t group = num_heads / num_kv_heads;                                                    \
        int64_t bounds[MAX_SEQ_PARTS + 1];                                                                \
        paged_decode_split(context_lens, num_seqs, seq_parts, bounds);                                    \
        const int64_t head_parts = (num_kv_heads + head_group - 1) / head_group;                         \
        const int64_t pieces = seq_parts * head_parts;                                                    \
        int failed = 0;                                                                                   \
        _Pragma("omp parallel for schedule(static) num_threads(threads) reduction(| : failed) if(threads > 1)") \
        for (int64_t i = 0; i < pieces; ++i) {                                                            \
            const int64_t sp = i / head_parts, hp = i % head_parts;                                       \
            const int64_t h0 = hp * head_group;                                                           \
            const int64_t h1 = h0 + head_group < num_kv_heads ? h0 + head_group : num_kv_heads;           \
            failed |= paged_decode(q, new_k, new_v, slots, in_stride, num_slots, k_cache, v_cache, block_tables,     \
                                   context_lens, out,                                                     \
                                   bounds[sp], bounds[sp + 1], h0, h1,                                    \
                                   num_kv_heads, group, head_dim, block_size, max_blocks, scale, is_bf16); \
        }                                                                                                 \
        return failed;                                                                                    \
    }

PAGED_DECODE(paged_decode_f32, 0)
PAGED_DECODE(paged_decode_bf16, 1)

/* The limits above, for the caller. */
int paged_decode_max_span(void) { return MAX_SPAN; }
int paged_decode_max_span_heads(void) { return MAX_SPAN_HEADS; }
int paged_decode_max_block_size(void) { return MAX_BLOCK_SIZE; }
