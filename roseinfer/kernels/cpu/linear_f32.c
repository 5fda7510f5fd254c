/* Projections in fp32 arithmetic, on any x86-64 (and any CPU GCC vectorizes for):
 * y[M][N] = x[M][K] . W[N][K]^T + bias, GELU (tanh) optionally applied.
 * - linear_f32: fp32 weights, for the few rows of a small decode step;
 * - linear_i8 (below): int8 weights with a scale per output column, widened to fp32 as they stream.
 *
 * Why not oneDNN's packed kernel (packed_linear.py)? At one to a few rows a projection is a
 * matrix-vector product: it should take as long as reading its weight. oneDNN's kernel pays a
 * fixed cost a call and, on some CPUs, reads the weight well under the memory's rate at one row;
 * F.linear (BLAS) has no layout made for it. The loop here is the plainest that streams:
 *
 * - The weight is packed once so that a run of NB output columns is one stream: [N/NB][K][NB].
 *   NB is two vectors of the widest unit the compiler targets (-march=native): 32 columns with
 *   AVX-512, 16 with AVX2 (256-bit, the whole register, not the 128-bit halves GCC's tuning
 *   picks for Zen 1 when left to auto-vectorize), 8 with SSE or NEON.
 * - For each k, the panel's two vectors are multiplied by x[r][k] broadcast, into fp32
 *   accumulators that stay in registers: every weight byte is read once and used for up to MB
 *   rows (see ROWS_KERNEL for how one row still keeps the FMA units busy).
 * - The threads split the panels, a contiguous range each: one sequential stream a thread.
 *
 * The vectors are GCC's vector extensions, so one source serves every width; the exp in GELU
 * is the same degree-6 polynomial for 2^f as linear_bf16.c's, written for any width.
 *
 * Layouts: x rows `x_stride` elements apart, K contiguous; packed as above, zero-padded to whole
 * panels; bias padded to whole panels (or NULL); y [M][N] contiguous.
 */
#include <stdlib.h>

#include "vector_math.h"

#define NB (2 * VL) /* output columns per panel */
#define MB 4        /* rows per pass over a panel: 2 x 4 accumulators fit even AVX2's 16 registers */
/* Rows per pass over a panel already in cache (int8's widened panel, many rows): as many as the registers
 * hold, 2 x 12 accumulators of AVX-512's 32, 2 x 6 of AVX2's 16, so each weight loaded serves that many rows. */
#if VL == 16
#define MB_WIDE 12
#else
#define MB_WIDE 6
#endif

/* VL int8 weights widened to fp32 lanes. GCC's __builtin_convertvector does this one byte at a time,
 * so the x86 units that sign-extend a vector of bytes are named where the target has them. */
static inline vf widen(const int8_t *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    vf out;
    for (int i = 0; i < VL; ++i) out[i] = (float)p[i];
    return out;
#endif
}

/* R rows of x against one panel, whose weights LOAD reads as fp32 vectors (fp32 panels as they are, int8
 * panels widened), U values of k at a time into U sets of accumulators. R and U are constants in each copy,
 * so the 2 U R accumulators are registers: with one row, two sums alone would wait on the FMA's latency every
 * k, so small R take U = 2 while the registers allow (ACCUMULATORS). Past an odd K's end the second set
 * multiplies the last k's weights again by x = 0. */
#define LOAD_F32(p) (*(const vf *)(p))
#define LOAD_I8(p) widen(p)
#define ACCUMULATORS (VL == 16 ? 16 : 8) /* of AVX-512's 32 registers, AVX2's 16: the rest hold weights and x */
#define UNROLL(R) (4 * (R) <= ACCUMULATORS ? 2 : 1)
#define ROWS_KERNEL(NAME, T, LOAD, R)                                                                         \
    static void NAME##_##R(const float *x, int64_t x_stride, const T *panel, int64_t K, const float *scale,  \
                           const float *bias, int gelu, float *y, int64_t y_stride, int64_t ncols) {          \
        enum { U = UNROLL(R) };                                                                               \
        vf acc0[U][R], acc1[U][R];                                                                            \
        for (int u = 0; u < U; ++u)                                                                           \
            for (int r = 0; r < R; ++r) acc0[u][r] = acc1[u][r] = splat(0.0f);                                \
        for (int64_t k = 0; k < K; k += U) {                                                                  \
            for (int u = 0; u < U; ++u) {                                                                     \
                const int in = k + u < K;                                                                     \
                const T *w = panel + (in ? k + u : K - 1) * NB;                                               \
                const vf w0 = LOAD(w), w1 = LOAD(w + VL);                                                     \
                for (int r = 0; r < R; ++r) {                                                                 \
                    const vf xb = splat(in ? x[r * x_stride + k + u] : 0.0f);                                 \
                    acc0[u][r] += xb * w0;                                                                    \
                    acc1[u][r] += xb * w1;                                                                    \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        for (int u = 1; u < U; ++u)                                                                           \
            for (int r = 0; r < R; ++r) acc0[0][r] += acc0[u][r], acc1[0][r] += acc1[u][r];                   \
        finish_rows(R, acc0[0], acc1[0], scale, bias, gelu, y, y_stride, ncols);                              \
    }
#define F32_ROWS(R) ROWS_KERNEL(rows, float, LOAD_F32, R)
#define I8_ROWS(R) ROWS_KERNEL(rows_i8, int8_t, LOAD_I8, R)
F32_ROWS(1) F32_ROWS(2) F32_ROWS(3) F32_ROWS(4) F32_ROWS(5) F32_ROWS(6)
I8_ROWS(1) I8_ROWS(2) I8_ROWS(3) I8_ROWS(4)

typedef void (*rows_fn)(const float *, int64_t, const float *, int64_t, const float *, const float *, int, float *,
                        int64_t, int64_t);
typedef void (*rows_i8_fn)(const float *, int64_t, const int8_t *, int64_t, const float *, const float *, int,
                           float *, int64_t, int64_t);
#if MB_WIDE > 6
F32_ROWS(7) F32_ROWS(8) F32_ROWS(9) F32_ROWS(10) F32_ROWS(11) F32_ROWS(12)
static const rows_fn ROWS[MB_WIDE + 1] = {0,      rows_1, rows_2, rows_3,  rows_4,  rows_5, rows_6,
                                          rows_7, rows_8, rows_9, rows_10, rows_11, rows_12};
#else
static const rows_fn ROWS[MB_WIDE + 1] = {0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6};
#endif
static const rows_i8_fn ROWS_I8[MB + 1] = {0, rows_i8_1, rows_i8_2, rows_i8_3, rows_i8_4};

int linear_f32_panel_columns(void) { return NB; }

int linear_f32(const float *x, int64_t x_stride, const float *packed, const float *bias, int gelu, float *y,
               int64_t M, int64_t N, int64_t K, int64_t threads) {
    const int64_t panels = (N + NB - 1) / NB;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t first, last;
        this_threads_panels(panels, &first, &last);
        for (int64_t b = first; b < last; ++b) {
            for (int64_t m0 = 0; m0 < M; m0 += MB) {
                const int64_t rows = M - m0 < MB ? M - m0 : MB;
                ROWS[rows](x + m0 * x_stride, x_stride, packed + b * K * NB, K, 0, bias ? bias + b * NB : 0, gelu,
                           y + m0 * N + b * NB, N, N - b * NB);
            }
        }
    }
    return 0;
}

/* The int8 projection (weight-only quantization): the same panels with int8 weights, one fp32 scale per
 * output column, fp32 x and y: y = (x . Wq^T) * scale + bias. A quarter of fp32's bytes stream from
 * memory, so at a few rows (memory-bound) it runs up to 4x faster; the products are fp32 throughout.
 * - Up to MB rows: each panel's int8 weights are widened in registers as they stream (one pass).
 * - More rows: each panel is widened once, scale applied, into a per-thread fp32 panel (K x NB x 4 bytes,
 *   in L2), and the fp32 kernel's passes of up to MB_WIDE rows read that: the widening is paid once a panel however
 *   many rows there are.
 * Layout: packed [N/NB][K][NB] int8; scale and bias (or NULL) padded to whole panels. */
int linear_i8(const float *x, int64_t x_stride, const int8_t *packed, const float *scale, const float *bias,
              int gelu, float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    const int64_t panels = (N + NB - 1) / NB;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed)
    {
        int64_t first, last;
        this_threads_panels(panels, &first, &last);
        float *wide = M > MB ? malloc((size_t)K * NB * sizeof(float)) : 0; /* this thread's widened panel */
        if (M > MB && !wide) failed = 1;
        for (int64_t b = first; b < last && !failed; ++b) {
            const int8_t *panel = packed + b * K * NB;
            const float *bias_b = bias ? bias + b * NB : 0;
            if (wide) {
                const vf s0 = *(const vf *)(scale + b * NB), s1 = *(const vf *)(scale + b * NB + VL);
                for (int64_t k = 0; k < K; ++k) {
                    *(vf *)(wide + k * NB) = widen(panel + k * NB) * s0;
                    *(vf *)(wide + k * NB + VL) = widen(panel + k * NB + VL) * s1;
                }
            }
            if (wide) { /* passes of equal size, each at most MB_WIDE rows: 32 rows = 11 + 11 + 10 on AVX-512 */
                const int64_t passes = (M + MB_WIDE - 1) / MB_WIDE;
                for (int64_t p = 0; p < passes; ++p) {
                    const int64_t m0 = M * p / passes, m1 = M * (p + 1) / passes;
                    ROWS[m1 - m0](x + m0 * x_stride, x_stride, wide, K, 0, bias_b, gelu, y + m0 * N + b * NB, N,
                                  N - b * NB);
                }
                continue;
            }
            for (int64_t m0 = 0; m0 < M; m0 += MB) {
                const int rows = M - m0 < MB ? (int)(M - m0) : MB;
                ROWS_I8[rows](x + m0 * x_stride, x_stride, panel, K, scale + b * NB, bias_b, gelu, y + m0 * N + b * NB,
                              N, N - b * NB);
            }
        }
        free(wide);
    }
    return failed;
}
