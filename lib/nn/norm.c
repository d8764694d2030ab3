/* norm.c - LayerNorm over each row, as torch.nn.LayerNorm: the mean and the
 * biased variance of the row, then an affine map per feature.
 *
 * Two passes over the row (the mean, then the squares of the deviations
 * from it) rather than one pass of sum and sum of squares: the one-pass
 * variance cancels catastrophically when a row's mean is large against its
 * spread (labml's embeddings are scaled by sqrt(d_model)). The sums run in
 * AFT_VL lanes side by side, so they vectorise without -ffast-math; a row of
 * a few hundred floats loses nothing that matters to float sums there. */
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
    float s = 0.0f;
    for (int l = 0; l < AFT_VL; l++) s += acc[l];
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
