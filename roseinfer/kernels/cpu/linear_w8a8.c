/* Projections in int8 arithmetic: y[M][N] = x[M][K] . W[N][K]^T + bias, GELU (tanh) optionally applied,
 * with W quantized once per output column (int8, scale sw[n] = max|W[n]| / 127) and each row of x quantized
 * at every call (scale sx[m] = max|x[m]| / QMAX). The products are int8 x int8 summed in int32, exactly:
 *
 *     y[m][n] = sx[m] sw[n] sum_k qx[m][k] qw[n][k] + bias[n]
 *
 * Why, beside linear_f32.c's int8 kernel (int8 weights widened to fp32)? Widening costs three instructions
 * per 16 weights before the multiply, so that kernel is bound by arithmetic, not memory, from one row on.
 * Here 4 int8 products and their sum are one instruction per 32-bit lane:
 * - AVX512-VNNI (and AVX-VNNI): vpdpbusd, unsigned bytes times signed bytes, 4 of each summed into a lane;
 * - AVX2, AVX-512 without VNNI: vpmaddubsw (pairs into saturating int16) then vpmaddwd by 1 (pairs into int32);
 * - anything else: the same sums in plain C.
 * The unsigned operand is x, shifted by ZP: qx + ZP >= 0. vpmaddubsw's int16 holds 2 x 127 x 127 but not
 * 2 x 255 x 127, so its x keeps 7 bits (QMAX 63, ZP 64) where VNNI keeps 8 (QMAX 127, ZP 128). The shift
 * adds ZP times each column's weight sum (colsum, computed at packing), subtracted before scaling.
 *
 * Layouts: x rows `x_stride` elements apart, K contiguous. Weights packed [N/NB][K4][NB][4] int8, K4 = K/4
 * rounded up: for a run of NB output columns, each group of 4 k is one 32-bit lane a column, zero past K.
 * sw, colsum and bias (or NULL) padded to whole panels; y [M][N] contiguous. Returns 1 where the buffer
 * for the quantized x cannot be allocated, else 0.
 */
#include <stdlib.h>

#include "vector_math.h"

#define NB (2 * VL) /* output columns per panel: two vectors of 32-bit lanes */
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__) || (!defined(__AVX2__) && !defined(__AVX512BW__))
#define QMAX 127
#define ZP 128
#else /* vpmaddubsw: 7-bit x, so that no pair of products saturates its int16 */
#define QMAX 63
#define ZP 64
#endif
/* Rows per pass over a panel: 2 x MB int32 accumulators beside the two weight vectors, the broadcast x and
 * (vpmaddubsw) its two temporaries and the vector of ones: AVX-512 has 32 registers, AVX2 16. */
#if VL == 16
#define MB 12
#else
#define MB 5
#endif

typedef uint8_t vu8 __attribute__((vector_size(VL * 4), aligned(4)));
typedef int8_t vs8 __attribute__((vector_size(VL * 4), aligned(4)));

/* acc + per lane, the sum of its 4 products of unsigned x bytes and signed w bytes. */
static inline vi dot4(vi acc, vi x, vi w) {
#if VL == 16 && defined(__AVX512VNNI__)
    return (vi)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)x, (__m512i)w);
#elif VL == 8 && defined(__AVXVNNI__)
    return (vi)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)x, (__m256i)w);
#elif VL == 16 && defined(__AVX512BW__)
    return acc + (vi)_mm512_madd_epi16(_mm512_maddubs_epi16((__m512i)x, (__m512i)w), _mm512_set1_epi16(1));
#elif VL == 8 && defined(__AVX2__)
    return acc + (vi)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)x, (__m256i)w), _mm256_set1_epi16(1));
#else
    const vu8 xb = (vu8)x;
    const vs8 wb = (vs8)w;
    for (int lane = 0; lane < VL; ++lane)
        for (int j = 0; j < 4; ++j) acc[lane] += (int32_t)xb[4 * lane + j] * (int32_t)wb[4 * lane + j];
    return acc;
#endif
}

/* R rows of quantized x against one panel, in passes of the panel's K4 lanes. */
#define ROWS_KERNEL(R)                                                                                        \
    static void rows_##R(const uint8_t *qx, int64_t qx_stride, const float *sx, const int8_t *panel,          \
                         int64_t K4, const int32_t *colsum, const float *sw, const float *bias, int gelu,      \
                         float *y, int64_t y_stride, int64_t ncols) {                                          \
        vi acc0[R], acc1[R];                                                                                   \
        for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = (vi){};                                                \
        for (int64_t k4 = 0; k4 < K4; ++k4) {                                                                  \
            vi w0, w1;                                                                                         \
            memcpy(&w0, panel + k4 * NB * 4, sizeof w0);                                                       \
            memcpy(&w1, panel + k4 * NB * 4 + VL * 4, sizeof w1);                                              \
            for (int r = 0; r < R; ++r) {                                                                      \
                int32_t four;                                                                                  \
                memcpy(&four, qx + r * qx_stride + 4 * k4, sizeof four);                                       \
                const vi xb = (vi){} + four;                                                                   \
                acc0[r] = dot4(acc0[r], xb, w0);                                                               \
                acc1[r] = dot4(acc1[r], xb, w1);                                                               \
            }                                                                                                  \
        }                                                                                                      \
        vi c0, c1;                                                                                             \
        memcpy(&c0, colsum, sizeof c0);                                                                        \
        memcpy(&c1, colsum + VL, sizeof c1);                                                                   \
        vf out0[R], out1[R];                                                                                   \
        for (int r = 0; r < R; ++r) {                                                                          \
            out0[r] = __builtin_convertvector(acc0[r] - ZP * c0, vf) * sx[r];                                  \
            out1[r] = __builtin_convertvector(acc1[r] - ZP * c1, vf) * sx[r];                                  \
        }                                                                                                      \
        finish_rows(R, out0, out1, sw, bias, gelu, y, y_stride, ncols);                                        \
    }
ROWS_KERNEL(1) ROWS_KERNEL(2) ROWS_KERNEL(3) ROWS_KERNEL(4) ROWS_KERNEL(5)
typedef void (*rows_fn)(const uint8_t *, int64_t, const float *, const int8_t *, int64_t, const int32_t *,
                        const float *, const float *, int, float *, int64_t, int64_t);
#if MB > 5
ROWS_KERNEL(6) ROWS_KERNEL(7) ROWS_KERNEL(8) ROWS_KERNEL(9) ROWS_KERNEL(10) ROWS_KERNEL(11) ROWS_KERNEL(12)
static const rows_fn ROWS[MB + 1] = {0,      rows_1, rows_2, rows_3,  rows_4,  rows_5, rows_6,
                                     rows_7, rows_8, rows_9, rows_10, rows_11, rows_12};
#else
static const rows_fn ROWS[MB + 1] = {0, rows_1, rows_2, rows_3, rows_4, rows_5};
#endif

int linear_w8a8_panel_columns(void) { return NB; }
/* The quantized x's range, +-QMAX: what a reference of this arithmetic must round x to. */
int linear_w8a8_activation_max(void) { return QMAX; }

/* Row m of x to qx + ZP in K4 x 4 bytes (ZP past K: x = 0) and its scale sx = max|x| / QMAX (1 for a zero row).
 * q = rint(x QMAX / max|x|): round to nearest even, as torch.round. */
static void quantize_row(const float *x, int64_t K, int64_t K4, uint8_t *q, float *sx) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = x[k] > amax ? x[k] : -x[k] > amax ? -x[k] : amax;
    const float inv = amax > 0.0f ? (float)QMAX / amax : 0.0f;
    for (int64_t k = 0; k < K; ++k) q[k] = (uint8_t)((int32_t)__builtin_rintf(x[k] * inv) + ZP);
    for (int64_t k = K; k < 4 * K4; ++k) q[k] = ZP;
    *sx = amax > 0.0f ? amax / (float)QMAX : 1.0f;
}

int linear_w8a8(const float *x, int64_t x_stride, const int8_t *packed, const float *sw, const int32_t *colsum,
                const float *bias, int gelu, float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    const int64_t panels = (N + NB - 1) / NB, K4 = (K + 3) / 4;
    uint8_t *qx = malloc((size_t)(M * K4 * 4) + 1); /* + 1: M = 0 still gets a pointer to free */
    float *sx = malloc((size_t)M * sizeof(float) + 1);
    if (!qx || !sx) {
        free(qx);
        free(sx);
        return 1;
    }
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) quantize_row(x + m * x_stride, K, K4, qx + m * K4 * 4, sx + m);
        int64_t first, last;
        this_threads_panels(panels, &first, &last);
        for (int64_t b = first; b < last; ++b) {
            /* passes of equal size, each at most MB rows: 32 rows = 11 + 11 + 10 with AVX-512 */
            const int64_t passes = (M + MB - 1) / MB;
            for (int64_t p = 0; p < passes; ++p) {
                const int64_t m0 = M * p / passes, m1 = M * (p + 1) / passes;
                ROWS[m1 - m0](qx + m0 * K4 * 4, K4 * 4, sx + m0, packed + b * K4 * NB * 4, K4, colsum + b * NB,
                              sw + b * NB, bias ? bias + b * NB : 0, gelu, y + m0 * N + b * NB, N, N - b * NB);
            }
        }
    }
    free(sx);
    free(qx);
    return 0;
}
