/* norm.c - LayerNorm over each row, as torch.nn.LayerNorm: the mean and the
 * biased variance of the row, then an affine map per feature.
 *
 * Two passes over the row (the mean, then the squares of the deviations
 * from it) rather than one pass of sum and sum of squares: the one-pass
 * variance cancels catastrophically when a row's mean is large against its
 * spread (labml's embeddings are scaled by sqrt(d_model)). The sums run in
 * AFT_VL lanes side by side, so they vectorise without -ffast-math, and the
 * lanes are added by halving (aft_hsum): a row of a few hundred floats
 * loses nothing that matters to float sums there, and a row's sums wait on
 * four adds where a loop over the lanes made them wait on sixteen. */
#include "nn.h"
#include "numerics.h"

#include <math.h>

/* sum of x[0..n) in AFT_VL lanes, then the lanes */
static inline float lane_sum(const float *x, size_t n, float centre, int squares)
{
    aft_vf acc = {0};
    size_t i = 0;
    for (; i + AFT_VL <= n; i += AFT_VL) {
        aft_vf v = aft_vld(x + i) - centre;
        acc += squares ? v * v : v;
    }
    float s = aft_hsum(acc);
    for (; i < n; i++) {
        float v = x[i] - centre;
        s += squares ? v * v : v;
    }
    return s;
}

void aft_layernorm(float *y, const float *x, const float *w, const float *b, size_t N, size_t D, float eps)
{
    if (D == 0) return;
    for (size_t r = 0; r < N; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float mean = lane_sum(xr, D, 0.0f, 0) / (float)D;
        float var = lane_sum(xr, D, mean, 1) / (float)D;
        float inv = 1.0f / sqrtf(var + eps);
        for (size_t i = 0; i < D; i++) {
            float v = (xr[i] - mean) * inv * w[i];
            yr[i] = b ? v + b[i] : v;
        }
    }
}

void aft_layernorm_ref(float *y, const float *x, const float *w, const float *b, size_t N, size_t D, float eps)
{
    if (D == 0) return;
    for (size_t r = 0; r < N; r++) {
        const float *xr = x + r * D;
        double mean = 0.0, var = 0.0;
        for (size_t i = 0; i < D; i++) mean += xr[i];
        mean /= (double)D;
        for (size_t i = 0; i < D; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        var /= (double)D;
        double inv = 1.0 / sqrt(var + (double)eps);
        for (size_t i = 0; i < D; i++)
            y[r * D + i] = (float)(((double)xr[i] - mean) * inv * w[i] + (b ? (double)b[i] : 0.0));
    }
}

/* LayerNorm's backward pass for rows [0, N): dx (+)= rstd (dy - mean(dy) -
 * xhat mean(dy xhat)) with dy = dz w, xhat and rstd as aft_layernorm forms
 * them (the same lanes, so the same floats); dz xhat and dz added into sw
 * and sb (D each), which the caller zeroes and sums in double across calls.
 * The row sums run in AFT_VL lanes as the forward's do. */
static void layernorm_back_row(float *restrict dx, int add, float *restrict sw, float *restrict sb,
                               const float *restrict dz, const float *restrict x, const float *restrict w, size_t D,
                               float eps)
{
    const float mean = lane_sum(x, D, 0.0f, 0) / (float)D;
    const float inv = 1.0f / sqrtf(lane_sum(x, D, mean, 1) / (float)D + eps);
    aft_vf a = {0}, b = {0};
    size_t i = 0;
    for (; i + AFT_VL <= D; i += AFT_VL) {
        aft_vf dy = aft_vld(dz + i) * aft_vld(w + i);
        a += dy;
        b += dy * ((aft_vld(x + i) - mean) * inv);
    }
    float m1 = aft_hsum(a), m2 = aft_hsum(b);
    for (; i < D; i++) {
        float dy = dz[i] * w[i];
        m1 += dy;
        m2 += dy * ((x[i] - mean) * inv);
    }
    m1 /= (float)D;
    m2 /= (float)D;
    for (i = 0; i < D; i++) {
        float xh = (x[i] - mean) * inv, v = inv * (dz[i] * w[i] - m1 - xh * m2);
        sw[i] += dz[i] * xh;
        sb[i] += dz[i];
        dx[i] = add ? dx[i] + v : v;
    }
}

void aft_layernorm_back(float *dx, int add, float *sw, float *sb, const float *dz, const float *x, const float *w,
                        size_t N, size_t D, float eps)
{
    for (size_t r = 0; r < N; r++)
        layernorm_back_row(dx + r * D, add, sw, sb, dz + r * D, x + r * D, w, D, eps);
}

/* the same in double, each row's sums one after another: the reference the
 * tests hold the lanes to */
void aft_layernorm_back_ref(float *dx, int add, float *sw, float *sb, const float *dz, const float *x,
                            const float *w, size_t N, size_t D, float eps)
{
    for (size_t r = 0; r < N; r++) {
        const float *xr = x + r * D, *g = dz + r * D;
        double mean = 0.0, var = 0.0, m1 = 0.0, m2 = 0.0;
        for (size_t i = 0; i < D; i++) mean += xr[i];
        mean /= (double)D;
        for (size_t i = 0; i < D; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        const double inv = 1.0 / sqrt(var / (double)D + (double)eps);
        for (size_t i = 0; i < D; i++) {
            m1 += (double)g[i] * w[i];
            m2 += (double)g[i] * w[i] * ((xr[i] - mean) * inv);
        }
        m1 /= (double)D;
        m2 /= (double)D;
        for (size_t i = 0; i < D; i++) {
            double xh = (xr[i] - mean) * inv, v = inv * ((double)g[i] * w[i] - m1 - xh * m2);
            sw[i] += (float)(g[i] * xh);
            sb[i] += g[i];
            dx[r * D + i] = add ? (float)(dx[r * D + i] + v) : (float)v;
        }
    }
}
