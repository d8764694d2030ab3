/* ref.c - the plain float64 AFT operator: the obvious loops, O(T^2 C).
 * Every fast kernel is checked against this one (tests, aft bench --impl both). */
#include "kernels.h"

#include <stdlib.h>

// out, q, k, v: (T, C) of one batch   mask: (T, T), 1 = visible, or NULL
// Each row done advances ws->progress by 1.
// For each (t, c): M = max over visible t' of k[t',c] + w[t,t']; subtracting it
// makes every exponent <= 0, so nothing overflows and the largest term is 1,
// so the denominator cannot underflow to 0. A NaN key among the visible ones
// makes the output NaN, as the sum it is in is (whatever its bias: NaN + -inf
// is NaN too); masked and causally hidden keys are not in the sum and reach
// nothing.
aft_status aft_op_reference(float *out, const float *q, const float *k, const float *v,
                            const uint8_t *mask, const aft_opspec *ws, aft_error *err)
{
    size_t T = ws->T, C = ws->C, H = ws->heads ? ws->heads : 1, ch = C / H;
    float *wrow = aft_alloc_array(T, sizeof(float));
    double *wd = aft_alloc_array(T, sizeof(double));
    if (!wrow || !wd) {
        free(wrow); free(wd);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for a reference row of %zu entries", T);
    }
    for (size_t t = 0; t < T; t++) {
        for (size_t h = 0; h < H; h++) {
            aft_w_row(ws, h, t, 0, T, wrow);
            for (size_t j = 0; j < T; j++) wd[j] = wrow[j];
            for (size_t c = h * ch; c < (h + 1) * ch; c++) {
                double M = -INFINITY;
                int nan_key = 0;
                for (size_t j = 0; j < T; j++) {
                    if ((ws->causal && j > t) || (mask && !mask[t * T + j])) continue;
                    nan_key |= isnan(k[j * ws->ldk + c]);
                    double e = (double)k[j * ws->ldk + c] + wd[j];
                    if (e > M) M = e;
                }
                double num = 0.0, den = 0.0;
                if (nan_key) {
                    num = den = NAN;
                } else if (M > -INFINITY) {
                    for (size_t j = 0; j < T; j++) {
                        if ((ws->causal && j > t) || (mask && !mask[t * T + j])) continue;
                        double e = exp((double)k[j * ws->ldk + c] + wd[j] - M);
                        num += e * (double)v[j * ws->ldv + c];
                        den += e;
                    }
                }
                double sq = 1.0 / (1.0 + exp(-(double)q[t * ws->ldq + c]));
                out[t * C + c] = den > 0.0 || nan_key ? (float)(sq * num / den) : 0.0f;
            }
        }
        aft_progress_done(ws->progress, 1);   /* a row: O(T C) work, one add */
    }
    free(wrow);
    free(wd);
    return AFT_OK;
}
