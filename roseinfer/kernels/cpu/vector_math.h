/* What the projection kernels share: GCC's generic vectors at the width the compiler targets (-march),
 * the epilogue of a panel (per-column scale, bias, GPT-2's GELU) and the split of panels across threads.
 * Included by linear_f32.c and linear_w8a8.c; build.py's cache key hashes it with each of them. */
#ifndef ROSEINFER_VECTOR_MATH_H
#define ROSEINFER_VECTOR_MATH_H
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
typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VL * 4), aligned(4)));
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static inline vf splat(float v) { return (vf){} + v; }
/* Lane-wise select, mask ? a : b (C has no vector ?:; a comparison gives -1 or 0 in each lane). */
static inline vf lane_select(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }
static inline vf vmax(vf a, vf b) { return lane_select(a > b, a, b); }

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
    const vf a = lane_select(negative, -u, u);
    const vf e = exp_neg(-2.0f * a);
    vf th = (1.0f - e) / (1.0f + e);
    th = lane_select(negative, -th, th);
    return 0.5f * y * (1.0f + th);
}

static inline void store_masked(float *dst, vf v, int64_t ncols) {
    if (ncols >= VL) {
        memcpy(dst, &v, sizeof v);
    } else if (ncols > 0) {
        memcpy(dst, &v, (size_t)ncols * sizeof(float));
    }
}

/* y rows from the accumulators of one panel: scale (per column, int8 only; NULL: none), bias, GELU. */
static void finish_rows(int rows, const vf *acc0, const vf *acc1, const float *scale, const float *bias, int gelu,
                        float *y, int64_t y_stride, int64_t ncols) {
    const vf s0 = scale ? *(const vf *)scale : splat(1.0f), s1 = scale ? *(const vf *)(scale + VL) : splat(1.0f);
    const vf b0 = bias ? *(const vf *)bias : splat(0.0f), b1 = bias ? *(const vf *)(bias + VL) : splat(0.0f);
    for (int r = 0; r < rows; ++r) {
        vf v0 = acc0[r] * s0 + b0, v1 = acc1[r] * s1 + b1;
        if (gelu) v0 = gelu_tanh(v0), v1 = gelu_tanh(v1);
        store_masked(y + r * y_stride, v0, ncols);
        store_masked(y + r * y_stride + VL, v1, ncols - VL);
    }
}

/* The contiguous range of panels this thread of the parallel region streams: one sequential read each. */
static inline void this_threads_panels(int64_t panels, int64_t *first, int64_t *last) {
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int64_t t = 0, nt = 1;
#endif
    *first = panels * t / nt;
    *last = panels * (t + 1) / nt;
}

#endif
