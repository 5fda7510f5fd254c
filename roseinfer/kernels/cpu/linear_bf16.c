/* A bf16 projection for decode-sized batches on CPUs with AVX512-BF16:
 * y[M][N] = x[M][K] . W[N][K]^T + bias, GELU (tanh) optionally applied,
 * bf16 in and out, fp32 accumulation.
 *
 * Why not oneDNN's packed kernel (packed_linear.py)? At the row counts a
 * decode step has (1 to a few dozen) it reaches well under the bf16 units'
 * peak: its blocking is tuned for larger matrices. The loop here is shaped
 * for few rows and many columns:
 *
 * - The weight is packed once so that a run of 32 output columns is one
 *   stream: [N/32][K/2][32][2]. Each step of the inner loop loads two zmm
 *   registers of weights (32 columns x one pair of k), and `vdpbf16ps`
 *   multiplies each by a pair of x values broadcast to every lane, adding
 *   into fp32 accumulators: 2 x 12 rows = 24 of the 32 zmm registers.
 * - So every weight byte is read from memory once and used for up to 12 rows
 *   from registers; a batch of 32 rows goes over each 32-column panel in three
 *   passes, the 2nd and 3rd from L1/L2 (a panel of K = 768 is 48 KB).
 * - While the panel is in use, the next one is prefetched, so the weight
 *   stream from DRAM overlaps the arithmetic (for the LM head, 77 MB in bf16,
 *   this is what turns "read, then compute" into "read while computing").
 * - The threads split the columns, each a contiguous range of panels: one
 *   sequential stream each, no shared output.
 * - Rows come in tiles of 48 whose x stays in L2 while the weights pass by, so
 *   a long prompt's rows do not evict each other.
 *
 * Layouts: x rows `x_stride` elements apart, K contiguous, K even; packed as
 * above, zero-padded to whole panels; bias fp32 padded to whole panels (or
 * NULL); y [M][N] contiguous.
 *
 * Compiled by roseinfer.kernels.cpu.build with -march=native; on a CPU without
 * AVX512-BF16 the kernel is compiled out and `linear_bf16_supported` says so.
 */
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#define NB 32      /* output columns per panel: two zmm of fp32 accumulators */
#define MB 12      /* rows per pass over a panel: 2 x 12 = 24 accumulators */
#define M_TILE 48  /* rows whose x stays in L2 while the weights stream past */

/* exp(x) for x <= 0, by 2^(x log2 e) = 2^n 2^f: a degree-6 polynomial for 2^f, f in [-0.5, 0.5]. */
static inline __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* GPT-2's GELU: 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))), tanh(u) = sign(u) (1 - e) / (1 + e),
 * e = exp(-2|u|). */
static inline __m512 gelu_tanh16(__m512 y) {
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                   _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), y), _mm512_mul_ps(y, y), y));
    const __m512 e = exp_neg16(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-2.0f)));
    __m512 th = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    th = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(th),
                                             _mm512_and_si512(_mm512_castps_si512(u), _mm512_set1_epi32(0x80000000))));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), y), _mm512_add_ps(_mm512_set1_ps(1.0f), th));
}

/* R rows of x against one panel: the accumulators stay in registers (R is a constant in each copy). */
#define ROWS_KERNEL(R)                                                                                        \
    static void rows_##R(const uint16_t *x, int64_t x_stride, const uint16_t *panel, int64_t pairs,           \
                         const float *bias, int gelu, uint16_t *y, int64_t y_stride, int64_t ncols) {          \
        __m512 acc0[R], acc1[R];                                                                              \
        for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();                                  \
        const uint16_t *next = panel + pairs * NB * 2;                                                        \
        for (int64_t p = 0; p < pairs; ++p) {                                                                 \
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + p * NB * 2);                            \
            const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + p * NB * 2 + 32);                       \
            _mm_prefetch((const char *)(next + p * NB * 2), _MM_HINT_T0); /* never faults past the end */    \
            _mm_prefetch((const char *)(next + p * NB * 2 + 32), _MM_HINT_T0);                                \
            for (int r = 0; r < R; ++r) {                                                                     \
                const __m512bh xb = (__m512bh)_mm512_set1_epi32(*(const int32_t *)(x + r * x_stride + 2 * p)); \
                acc0[r] = _mm512_dpbf16_ps(acc0[r], xb, w0);                                                  \
                acc1[r] = _mm512_dpbf16_ps(acc1[r], xb, w1);                                                  \
            }                                                                                                 \
        }                                                                                                     \
        const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();                                 \
        const __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();                           \
        const __mmask16 m0 = ncols >= 16 ? 0xFFFF : (__mmask16)((1u << ncols) - 1);                           \
        const __mmask16 m1 = ncols >= 32 ? 0xFFFF : ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1);  \
        for (int r = 0; r < R; ++r) {                                                                         \
            __m512 v0 = _mm512_add_ps(acc0[r], b0), v1 = _mm512_add_ps(acc1[r], b1);                          \
            if (gelu) v0 = gelu_tanh16(v0), v1 = gelu_tanh16(v1);                                             \
            _mm256_mask_storeu_epi16(y + r * y_stride, m0, (__m256i)_mm512_cvtneps_pbh(v0));                  \
            _mm256_mask_storeu_epi16(y + r * y_stride + 16, m1, (__m256i)_mm512_cvtneps_pbh(v1));             \
        }                                                                                                     \
    }
ROWS_KERNEL(1) ROWS_KERNEL(2) ROWS_KERNEL(3) ROWS_KERNEL(4) ROWS_KERNEL(5) ROWS_KERNEL(6)
ROWS_KERNEL(7) ROWS_KERNEL(8) ROWS_KERNEL(9) ROWS_KERNEL(10) ROWS_KERNEL(11) ROWS_KERNEL(12)

typedef void (*rows_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, const float *, int, uint16_t *,
                        int64_t, int64_t);
static const rows_fn ROWS[MB + 1] = {0,      rows_1, rows_2, rows_3,  rows_4,  rows_5, rows_6,
                                     rows_7, rows_8, rows_9, rows_10, rows_11, rows_12};

int linear_bf16_supported(void) { return 1; }
int linear_bf16_panel_columns(void) { return NB; }

int linear_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *packed, const float *bias, int gelu,
                uint16_t *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    if (K % 2) return 1;
    const int64_t pairs = K / 2, panels = (N + NB - 1) / NB;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#ifdef _OPENMP
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int64_t t = 0, nt = 1;
#endif
        const int64_t first = panels * t / nt, last = panels * (t + 1) / nt;
        for (int64_t tile = 0; tile < M; tile += M_TILE) {
            const int64_t rows = M - tile < M_TILE ? M - tile : M_TILE, passes = (rows + MB - 1) / MB;
            for (int64_t b = first; b < last; ++b) {
                for (int64_t s = 0; s < passes; ++s) { /* passes of equal size: 32 rows = 11 + 11 + 10 */
                    const int64_t m0 = tile + rows * s / passes, m1 = tile + rows * (s + 1) / passes;
                    ROWS[m1 - m0](x + m0 * x_stride, x_stride, packed + b * pairs * NB * 2, pairs,
                                  bias ? bias + b * NB : 0, gelu, y + m0 * N + b * NB, N, N - b * NB);
                }
            }
        }
    }
    return 0;
}
/* The greedy pick over bf16 logits: each row's index of its largest value (the first, on ties).
 * torch's argmax on bf16 is a slow scalar loop, and widening the logits to fp32 first moves
 * 3x the bytes. bf16 values compare in the order of a 16-bit key: the bits with the sign bit set
 * for positives, all bits flipped for negatives; a NaN of either sign gets the top key, so it is
 * picked, as torch picks it. Two passes over a row (the max, then its first index), the second from L2. */
static inline __m512i order_keys(__m512i b) {
    const __m512i sign = _mm512_set1_epi16((short)0x8000);
    const __mmask32 negative = _mm512_test_epi16_mask(b, sign);
    const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_andnot_si512(sign, b), _mm512_set1_epi16(0x7F80));
    const __m512i keys = _mm512_mask_mov_epi16(_mm512_or_si512(b, sign), negative, _mm512_xor_si512(b, _mm512_set1_epi16(-1)));
    return _mm512_mask_mov_epi16(keys, nan, _mm512_set1_epi16(-1)); /* any NaN, either sign: the top key */
}

void argmax_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t stride, int64_t *out, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *row = x + r * stride;
        __m512i best = _mm512_setzero_si512();
        int64_t c = 0;
        for (; c + 32 <= cols; c += 32) best = _mm512_max_epu16(best, order_keys(_mm512_loadu_si512(row + c)));
        const __mmask32 tail = cols - c >= 32 ? 0 : (__mmask32)((1u << (cols - c)) - 1);
        if (tail) best = _mm512_mask_max_epu16(best, tail, best, order_keys(_mm512_maskz_loadu_epi16(tail, row + c)));
        /* the largest key of the row, then the first column that has it */
        uint16_t lanes[32], top = 0;
        _mm512_storeu_si512(lanes, best);
        for (int i = 0; i < 32; ++i) top = lanes[i] > top ? lanes[i] : top;
        const __m512i wanted = _mm512_set1_epi16((short)top);
        int64_t found = 0;
        for (c = 0; c < cols; c += 32) {
            const __mmask32 valid = cols - c >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (cols - c)) - 1);
            const __mmask32 hit =
                _mm512_mask_cmpeq_epi16_mask(valid, order_keys(_mm512_maskz_loadu_epi16(valid, row + c)), wanted);
            if (hit) {
                found = c + __builtin_ctz(hit);
                break;
            }
        }
        out[r] = found;
    }
}
#else
int linear_bf16_supported(void) { return 0; }
void argmax_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t stride, int64_t *out, int64_t threads) {}
int linear_bf16_panel_columns(void) { return 32; }
int linear_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *packed, const float *bias, int gelu,
                uint16_t *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    return 2;
}
#endif
