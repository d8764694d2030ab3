/* sums.c - stabilised softmax sums of keys and their merge (see sums.h). */
#include "sums.h"

/* rows whose keys raise the stabiliser together: one rescaling per block */
enum { SUM_ROWS = 64 };

int aft_sums_of_rows(const float *k, size_t ldk, const float *v, size_t ldv, size_t r0, size_t r1, size_t n,
                     float *restrict m, float *restrict s0, float *restrict s1, float *restrict bm)
{
    int bad = 0;
    for (size_t c = 0; c < n; c++) { m[c] = -INFINITY; s0[c] = 0.0f; s1[c] = 0.0f; }
    for (size_t b0 = r0; b0 < r1; b0 += SUM_ROWS) {
        size_t b1 = b0 + SUM_ROWS < r1 ? b0 + SUM_ROWS : r1;
        memcpy(bm, m, n * sizeof(float));
        for (size_t t = b0; t < b1; t++) {
            const float *kr = k + t * ldk;
            for (size_t c = 0; c < n; c++) {
                bad |= kr[c] != kr[c];
                bm[c] = kr[c] > bm[c] ? kr[c] : bm[c];
            }
        }
        for (size_t c = 0; c < n; c++) {
            bad |= bm[c] == INFINITY;
            float f = m[c] == -INFINITY ? 0.0f : aft_expf(m[c] - bm[c]);
            f = bm[c] > m[c] ? f : 1.0f;
            s0[c] *= f;
            s1[c] *= f;
            m[c] = bm[c] > m[c] ? bm[c] : m[c];
            bm[c] = isfinite(m[c]) ? m[c] : 0.0f;   /* only -inf keys so far: they give 0 */
        }
        /* k - bm <= 0; NaN only with a bad key, and then the sums are
         * not used */
        for (size_t t = b0; t < b1; t++) {
            const float *kr = k + t * ldk, *vr = v + t * ldv;
            for (size_t c = 0; c < n; c++) {
                float e = aft_expf_nonpos(kr[c] - bm[c]);
                s0[c] += e;
                s1[c] += e * vr[c];
            }
        }
    }
    return bad;
}

void aft_sums_merge(float *a, const float *b, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        float ma = a[c], mb = b[c], Z = ma > mb ? ma : mb;
        float fa = ma == -INFINITY ? 0.0f : aft_expf(ma - Z);
        float fb = mb == -INFINITY ? 0.0f : aft_expf(mb - Z);
        a[c] = Z;
        a[n + c] = a[n + c] * fa + b[n + c] * fb;
        a[2 * n + c] = a[2 * n + c] * fa + b[2 * n + c] * fb;
        a[3 * n + c] = a[3 * n + c] > b[3 * n + c] ? a[3 * n + c] : b[3 * n + c];
    }
}

void aft_sums_empty(float *a, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        a[c] = a[3 * n + c] = -INFINITY;
        a[n + c] = a[2 * n + c] = 0.0f;
    }
}
