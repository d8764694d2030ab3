/* loss.c - the cross-entropy of logits against targets, as
 * torch.nn.functional.cross_entropy sums it, and its gradient in place.
 *
 * A row's softmax runs in float AFT_VL lanes with aft_expf (which
 * vectorizes), after subtracting the row's maximum so no exponential
 * overflows; its log-sum-exp and the loss are formed in double. The
 * reference beside it does the whole row in double with libm's exp. */
#include "nn.h"
#include "numerics.h"

#include <math.h>
#include <string.h>

/* the row's largest logit (NaN: they propagate through the sum below) */
static float row_max(const float *r, size_t V)
{
    float mx = r[0];
    for (size_t j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
    return mx;
}

/* sum of exp(r - mx) over the row, in lanes */
static float row_expsum(const float *restrict r, size_t V, float mx)
{
    aft_vf acc = {0};
    size_t j = 0;
    for (; j + AFT_VL <= V; j += AFT_VL) {
        aft_vf e;
        for (int l = 0; l < AFT_VL; l++) e[l] = aft_expf(r[j + l] - mx);
        acc += e;
    }
    float s = aft_hsum(acc);
    for (; j < V; j++) s += aft_expf(r[j] - mx);
    return s;
}

double aft_xent_rows(float *lg, const int32_t *targets, size_t N, size_t V, int grad, float inv)
{
    double total = 0.0;
    for (size_t i = 0; i < N; i++) {
        float *r = lg + i * V;
        if (targets[i] < 0) {   /* ignored: no loss, no gradient */
            if (grad) memset(r, 0, V * sizeof(float));
            continue;
        }
        const float mx = row_max(r, V), s = row_expsum(r, V, mx);
        total += (double)mx + log((double)s) - r[targets[i]];
        if (grad) {
            const float scale = inv / s;
            for (size_t j = 0; j < V; j++) r[j] = aft_expf(r[j] - mx) * scale;
            r[targets[i]] -= inv;
        }
    }
    return total;
}

double aft_xent_rows_ref(float *lg, const int32_t *targets, size_t N, size_t V, int grad, float inv)
{
    double total = 0.0;
    for (size_t i = 0; i < N; i++) {
        float *r = lg + i * V;
        if (targets[i] < 0) {
            if (grad) memset(r, 0, V * sizeof(float));
            continue;
        }
        double mx = r[0], s = 0.0;
        for (size_t j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
        for (size_t j = 0; j < V; j++) s += exp((double)r[j] - mx);
        const double lse = mx + log(s);
        total += lse - r[targets[i]];
        if (grad) {
            for (size_t j = 0; j < V; j++) r[j] = (float)(exp((double)r[j] - lse) * inv);
            r[targets[i]] -= inv;
        }
    }
    return total;
}
