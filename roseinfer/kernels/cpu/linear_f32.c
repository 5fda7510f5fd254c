/* An fp32 projection for the few rows of a small decode step, on any x86-64 (and any CPU GCC
 * vectorizes for): y[M][N] = x[M][K] . W[N][K]^T + bias, GELU (tanh) optionally applied.
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
 * - For each k, the panel's two vectors are multiplied by x[r][k] broadcast, into 2 x MB fp32
 *   accumulators that stay in registers: every weight byte is read once and used for up to MB
 *   rows.
 * - The threads split the panels, a contiguous range each: one sequential stream a thread.
 *
 * The vectors are GCC's vector extensions, so one source serves every width; the exp in GELU
 * is the same degree-6 polynomial for 2^f as linear_bf16.c's, written for any width.
 *
 * Layouts: x rows `x_stride` elements apart, K contiguous; packed as above, zero-padded to whole
 * panels; bias padded to whole panels (or NULL); y [M][N] contiguous.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
#define NB (2 * VL) /* output columns per panel */
#define MB 4        /* rows per pass over a panel: 2 x 4 accumulators fit even AVX2's 16 registers */

typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VL * 4), aligned(4)));

static inline vf splat(float v) { return (vf){} + v; }
/* Lane-wise select, mask ? a : b (C has no vector ?:; a comparison gives -1 or 0 in each lane). */
static inline vf select(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }
static inline vf vmax(vf a, vf b) { return select(a > b, a, b); }

/* exp(x) for x <= 0: 2^(x log2 e) = 2^n 2^f, n the nearest integer (by the 1.5 x 2^23 rounding
 * trick, exact in round-to-nearest for |t| < 2^22), f in [-0.5, 0.5]. */
static inline vf exp_neg(vf x) {
    x = vmax(x, splat(-87.0f));
    const vf t = x * 1.44269504088896341f;
    const vf n = (t + 12582912.0f) - 12582912.0f;
    const vf f = t - n;
    vf p = splat(1.535336188319500e-4f);
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const vi scale = (__builtin_convertvector(n, vi) + 127) << 23; /* n >= -126: x was clamped */
    vf s;
    memcpy(&s, &scale, sizeof s);
    return p * s;
}

/* GPT-2's GELU: 0.5 y (1 + tanh(u)), u = sqrt(2/pi) (y + 0.044715 y^3); tanh(u) = sign(u) (1 - e) / (1 + e),
 * e = exp(-2|u|). */
static inline vf gelu_tanh(vf y) {
    const vf u = 0.7978845608028654f * (y + 0.044715f * y * y * y);
    const vi negative = u < 0;
    const vf a = select(negative, -u, u);
    const vf e = exp_neg(-2.0f * a);
    vf th = (1.0f - e) / (1.0f + e);
    th = select(negative, -th, th);
    return 0.5f * y * (1.0f + th);
}

static inline void store_masked(float *dst, vf v, int64_t ncols) {
    if (ncols >= VL) {
        memcpy(dst, &v, sizeof v);
    } else if (ncols > 0) {
        memcpy(dst, &v, (size_t)ncols * sizeof(float));
    }
}

/* R rows of x against one panel (R a constant in each copy, so the accumulators are registers). */
#define ROWS_KERNEL(R)                                                                                        \
    static void rows_##R(const float *x, int64_t x_stride, const float *panel, int64_t K, const float *bias, \
                         int gelu, float *y, int64_t y_stride, int64_t ncols) {                               \
        vf acc0[R], acc1[R];                                                                                  \
        for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = splat(0.0f);                                          \
        for (int64_t k = 0; k < K; ++k) {                                                                     \
            const vf w0 = *(const vf *)(panel + k * NB), w1 = *(const vf *)(panel + k * NB + VL);             \
            for (int r = 0; r < R; ++r) {                                                                     \
                const vf xb = splat(x[r * x_stride + k]);                                                     \
                acc0[r] += xb * w0;                                                                           \
                acc1[r] += xb * w1;                                                                           \
            }                                                                                                 \
        }                                                                                                     \
        const vf b0 = bias ? *(const vf *)bias : splat(0.0f), b1 = bias ? *(const vf *)(bias + VL) : splat(0.0f); \
        for (int r = 0; r < R; ++r) {                                                                         \
            vf v0 = acc0[r] + b0, v1 = acc1[r] + b1;                                                          \
            if (gelu) v0 = gelu_tanh(v0), v1 = gelu_tanh(v1);                                                 \
            store_masked(y + r * y_stride, v0, ncols);                                                        \
            store_masked(y + r * y_stride + VL, v1, ncols - VL);                                              \
        }                                                                                                     \
    }
ROWS_KERNEL(1) ROWS_KERNEL(2) ROWS_KERNEL(3) ROWS_KERNEL(4)

typedef void (*rows_fn)(const float *, int64_t, const float *, int64_t, const float *, int, float *, int64_t,
                        int64_t);
static const rows_fn ROWS[MB + 1] = {0, rows_1, rows_2, rows_3, rows_4};

int linear_f32_panel_columns(void) { return NB; }

int linear_f32(const float *x, int64_t x_stride, const float *packed, const float *bias, int gelu, float *y,
               int64_t M, int64_t N, int64_t K, int64_t threads) {
    const int64_t panels = (N + NB - 1) / NB;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#ifdef _OPENMP
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int64_t t = 0, nt = 1;
#endif
        const int64_t first = panels * t / nt, last = panels * (t + 1) / nt;
        for (int64_t b = first; b < last; ++b) {
            for (int64_t m0 = 0; m0 < M; m0 += MB) {
                const int64_t rows = M - m0 < MB ? M - m0 : MB;
                ROWS[rows](x + m0 * x_stride, x_stride, packed + b * K * NB, K, bias ? bias + b * NB : 0, gelu,
                           y + m0 * N + b * NB, N, N - b * NB);
            }
        }
    }
    return 0;
}
