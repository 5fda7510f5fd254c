/* The small operations between a Llama layer's projections, one call each: RMSNorm, the rotary
 * embedding (RoPE) of q and k, and the gated MLP's silu(gate) * up; and GPT-2's LayerNorm. In fp32 and
 * in bf16.
 *
 * Why in C? At batch 1 each of these touches a few kilobytes, yet torch's operators take 10-17 us
 * apiece (F.rms_norm on 576 values: 16 us; RoPE as roll, mul, mul, add: 16 us) in dispatch, checks
 * and allocation. A SmolLM2-shaped step has 30 layers of them: several milliseconds of a step whose
 * weights stream in about 15. A ctypes call here is 2-3 us, and the arithmetic a fraction of that.
 *
 * Each function computes what transformers computes, in its order:
 * - RMSNorm: y = x * (1 / sqrt(mean(x^2) + eps)) * w, in fp32; in bf16 the row is widened, normed in
 *   fp32, rounded to bf16, then multiplied by the bf16 weight and rounded again (Llama's cast order).
 *   Only the sum's order differs from torch's, so the last bit may.
 * - RoPE: x * cos + rotate_half(x) * sin, rotate_half's minus folded into `signed_sin` (see
 *   models/llama.py): every product rounded on its own, then the sum, as torch's separate operators
 *   round them. FMA contraction is off in this file for that, so fp32 and bf16 match torch bit for bit.
 * - LayerNorm: (x - mean) / sqrt(variance + eps) * w + b in fp32 (bf16: widened, rounded once at the end);
 *   the sums' order differs from torch's, so the last bit may.
 * - silu(g) * u = g / (1 + exp(-g)) * u, exp from vector_math.h's polynomial (within a few ulps of
 *   torch's); bf16 rounds silu's result, then the product, as torch's two operators do.
 *
 * Layouts: rows `*_stride` elements apart, a row's values contiguous; outputs [rows][width]
 * contiguous. RoPE turns x in place: `heads` heads of `head_dim` a row, cos and signed_sin
 * [rows][head_dim] (one angle set a token, shared by its heads). Large inputs (a prompt's rows) are
 * split across `threads` OpenMP threads by rows.
 */
#pragma GCC optimize("fp-contract=off")
#include <math.h>

#include "vector_math.h"

#define PARALLEL_ABOVE 16384 /* values in a call below which one thread does it: waking workers costs more */

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest, ties to even, as torch's bf16 conversion does (a NaN stays a quiet NaN). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* The same three on VL lanes at once (GCC vectors: vpmovzxwd, the rounding in integer lanes, vpmovdw). */
typedef uint16_t vh __attribute__((vector_size(VL * 2), aligned(2)));
typedef uint32_t vu __attribute__((vector_size(VL * 4), aligned(4)));

static inline vf widen_bf16(const uint16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    const vu bits = __builtin_convertvector(h, vu) << 16;
    vf f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline vu bf16_bits(vf f) {
    vu bits;
    memcpy(&bits, &f, sizeof bits);
    const vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const vi nan = (vi)((bits & 0x7fffffffu) > 0x7f800000u);
    return (vu)(((vi)rounded & ~nan) | (nan & 0x7fc0));
}

static inline vf round_bf16_lanes(vf f) {
    const vu bits = bf16_bits(f) << 16;
    vf out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline void store_bf16(uint16_t *p, vf f) {
    const vh h = __builtin_convertvector(bf16_bits(f), vh);
    memcpy(p, &h, sizeof h);
}

/* 1 / sqrt(mean of squares + eps) of one row, its squares summed in VL lanes, then across them. */
static float inverse_rms(const float *x, int64_t dim, float eps) {
    vf lanes = splat(0.0f);
    int64_t k = 0;
    for (; k + VL <= dim; k += VL) {
        vf v;
        memcpy(&v, x + k, sizeof v);
        lanes += v * v;
    }
    float sum = 0.0f;
    for (int i = 0; i < VL; ++i) sum += lanes[i];
    for (; k < dim; ++k) sum += x[k] * x[k];
    return 1.0f / sqrtf(sum / (float)dim + eps);
}

void rms_norm_f32(const float *x, int64_t x_stride, const float *w, float eps, float *y, int64_t rows, int64_t dim,
                  int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= PARALLEL_ABOVE)
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * x_stride;
        const float scale = inverse_rms(row, dim, eps);
        float *out = y + r * dim;
        for (int64_t k = 0; k < dim; ++k) out[k] = row[k] * scale * w[k];
    }
}

void rms_norm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *w, float eps, uint16_t *y, int64_t rows,
                   int64_t dim, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= PARALLEL_ABOVE)
    for (int64_t r = 0; r < rows; ++r) {
        float wide[dim]; /* the row in fp32: one widening, read twice */
        const uint16_t *row = x + r * x_stride;
        for (int64_t k = 0; k < dim; ++k) wide[k] = bf16_to_f32(row[k]);
        const float scale = inverse_rms(wide, dim, eps);
        uint16_t *out = y + r * dim;
        for (int64_t k = 0; k < dim; ++k) out[k] = f32_to_bf16(bf16_to_f32(w[k]) * round_bf16(wide[k] * scale));
    }
}

/* GPT-2's LayerNorm: the row's mean and 1 / sqrt(variance + eps), in two passes over it (the sum, then the
 * squares about the mean: no cancellation), summed in VL lanes and then across them. */
static void moments(const float *x, int64_t dim, float eps, float *mean, float *rstd) {
    vf lanes = splat(0.0f);
    int64_t k = 0;
    for (; k + VL <= dim; k += VL) {
        vf v;
        memcpy(&v, x + k, sizeof v);
        lanes += v;
    }
    float sum = 0.0f;
    for (int i = 0; i < VL; ++i) sum += lanes[i];
    for (; k < dim; ++k) sum += x[k];
    const float m = sum / (float)dim;
    lanes = splat(0.0f);
    for (k = 0; k + VL <= dim; k += VL) {
        vf v;
        memcpy(&v, x + k, sizeof v);
        v -= m;
        lanes += v * v;
    }
    sum = 0.0f;
    for (int i = 0; i < VL; ++i) sum += lanes[i];
    for (; k < dim; ++k) sum += (x[k] - m) * (x[k] - m);
    *mean = m;
    *rstd = 1.0f / sqrtf(sum / (float)dim + eps);
}

void layer_norm_f32(const float *x, int64_t x_stride, const float *w, const float *b, float eps, float *y,
                    int64_t rows, int64_t dim, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= PARALLEL_ABOVE)
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * x_stride;
        float mean, rstd;
        moments(row, dim, eps, &mean, &rstd);
        float *out = y + r * dim;
        for (int64_t k = 0; k < dim; ++k) out[k] = (row[k] - mean) * rstd * w[k] + b[k];
    }
}

/* In fp32 from the widened row, weight and bias, rounded to bf16 once, as torch's CPU kernel does. */
void layer_norm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *w, const uint16_t *b, float eps,
                     uint16_t *y, int64_t rows, int64_t dim, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= PARALLEL_ABOVE)
    for (int64_t r = 0; r < rows; ++r) {
        float wide[dim];
        const uint16_t *row = x + r * x_stride;
        for (int64_t k = 0; k < dim; ++k) wide[k] = bf16_to_f32(row[k]);
        float mean, rstd;
        moments(wide, dim, eps, &mean, &rstd);
        uint16_t *out = y + r * dim;
        for (int64_t k = 0; k < dim; ++k)
            out[k] = f32_to_bf16((wide[k] - mean) * rstd * bf16_to_f32(w[k]) + bf16_to_f32(b[k]));
    }
}

void rope_f32(float *x, int64_t x_stride, int64_t heads, int64_t head_dim, const float *cos, const float *signed_sin,
              int64_t rows) {
    const int64_t half = head_dim / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos + r * head_dim, *s = signed_sin + r * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
            float *v = x + r * x_stride + h * head_dim;
            for (int64_t i = 0; i < half; ++i) { /* dimension i turns with i + half */
                const float first = v[i], second = v[i + half];
                v[i] = first * c[i] + second * s[i];
                v[i + half] = second * c[i + half] + first * s[i + half];
            }
        }
    }
}

void rope_bf16(uint16_t *x, int64_t x_stride, int64_t heads, int64_t head_dim, const uint16_t *cos,
               const uint16_t *signed_sin, int64_t rows) {
    const int64_t half = head_dim / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *c = cos + r * head_dim, *s = signed_sin + r * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
            uint16_t *v = x + r * x_stride + h * head_dim;
            for (int64_t i = 0; i < half; ++i) {
                const float first = bf16_to_f32(v[i]), second = bf16_to_f32(v[i + half]);
                v[i] = f32_to_bf16(round_bf16(first * bf16_to_f32(c[i])) + round_bf16(second * bf16_to_f32(s[i])));
                v[i + half] = f32_to_bf16(round_bf16(second * bf16_to_f32(c[i + half]))
                                          + round_bf16(first * bf16_to_f32(s[i + half])));
            }
        }
    }
}

/* The residual add x += y, as torch adds: exact in fp32; in bf16 the sum of the two widened values, rounded once
 * (decode_layers.c's, between a layer's blocks). */
void add_f32(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void add_bf16(uint16_t *x, const uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

/* silu(g) = g * sigmoid(g); sigmoid from exp of -|g| only (exp_neg's range), so no lane overflows. */
static inline vf silu(vf g) {
    const vi negative = g < 0;
    const vf e = exp_neg(lane_select(negative, g, -g)); /* exp(-|g|) */
    return lane_select(negative, g * e, g) / (1.0f + e); /* g / (1 + exp(-g)), as torch divides */
}

/* gate_up [rows][2 * inter] (gate's columns, then up's, as the fused projection writes them) -> y [rows][inter].
 * Whole vectors first; the last few values of a row go through a zero-padded one. */
void silu_mul_f32(const float *gate_up, int64_t stride, int64_t inter, float *y, int64_t rows, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * inter >= PARALLEL_ABOVE)
    for (int64_t r = 0; r < rows; ++r) {
        const float *gate = gate_up + r * stride, *up = gate + inter;
        float *out = y + r * inter;
        int64_t k = 0;
        for (; k + VL <= inter; k += VL) {
            vf g, u;
            memcpy(&g, gate + k, sizeof g);
            memcpy(&u, up + k, sizeof u);
            const vf v = silu(g) * u;
            memcpy(out + k, &v, sizeof v);
        }
        for (; k < inter; ++k) {
            const vf v = silu(splat(gate[k])) * up[k];
            out[k] = v[0];
        }
    }
}

void silu_mul_bf16(const uint16_t *gate_up, int64_t stride, int64_t inter, uint16_t *y, int64_t rows,
                   int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * inter >= PARALLEL_ABOVE)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *gate = gate_up + r * stride, *up = gate + inter;
        uint16_t *out = y + r * inter;
        int64_t k = 0;
        for (; k + VL <= inter; k += VL) store_bf16(out + k, round_bf16_lanes(silu(widen_bf16(gate + k))) * widen_bf16(up + k));
        for (; k < inter; ++k) {
            const vf activated = silu(splat(bf16_to_f32(gate[k])));
            out[k] = f32_to_bf16(round_bf16(activated[0]) * bf16_to_f32(up[k]));
        }
    }
}
