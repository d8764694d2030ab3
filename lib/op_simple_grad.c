/* op_simple_grad.c - the backward pass of AFT-simple without causality,
 * beside op_simple.c: O(T C).
 *
 * w = 0, so every row has the same softmax per channel: P[j,c] =
 * exp(k[j,c] - L[c]), L the log of sum_j exp(k[j,c]), Y'[c] = sum_j P v.
 * With a = dout sigmoid(q) and A[c] = sum_t a[t,c] (every row reads every
 * key alike):
 *   dv[j,c] = P[j,c] A[c],  dk[j,c] = P[j,c] (v[j,c] - Y'[c]) A[c],
 *   dq = dout Y' sigmoid'(q).
 * L is kept in double (a float L of 700 is off by 3e-5, and so would be
 * every P); k - L <= 0, so P never overflows. */
#include "kernels.h"

#include <omp.h>
#include <stdlib.h>

/* a = dout sigmoid(q), and dout sigmoid'(q) with sigmoid' = e / (1 + e)^2,
 * e = exp(-|q|) (no cancellation for either sign of q) */
static inline float grad_a(float dout, float q)
{
    return dout * aft_sigmoidf(q);
}
static inline float dsigmoid(float q)
{
    float e = aft_expf(-fabsf(q));
    return e / ((1.0f + e) * (1.0f + e));
}

aft_status aft_op_simple_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                              const aft_opspec *sp, aft_error *err)
{
    const size_t T = sp->T, C = sp->C, ldq = sp->ldq, ldk = sp->ldk, ldv = sp->ldv;
    const size_t nt = (size_t)sp->threads;
    /* per thread: m, s0, s1, scratch (4C floats) and A (C doubles); then
     * the merged L (C doubles), Y' (C floats), A (C doubles) */
    float *st = aft_alloc_array(nt * 4 + 1, C * sizeof(float));
    double *ad = aft_alloc_array(nt + 2, C * sizeof(double));
    if (!st || !ad) {
        free(st);
        free(ad);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for softmax sums (C = %zu)", C);
    }
    float *yp = st + nt * 4 * C;
    double *L = ad + nt * C, *A = L + C;
    for (size_t b = 0; b < B; b++) {
        const float *qb = q + b * T * ldq, *kb = k + b * T * ldk, *vb = v + b * T * ldv, *ob = io->dout + b * T * C;
        #pragma omp parallel num_threads((int)nt)
        {
            size_t tid = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
            size_t t0 = T * tid / n, t1 = T * (tid + 1) / n;
            float *m = st + tid * 4 * C;
            double *at = ad + tid * C;
            (void)aft_sums_of_rows(kb, ldk, vb, ldv, t0, t1, C, m, m + C, m + 2 * C, m + 3 * C);
            for (size_t c = 0; c < C; c++) at[c] = 0.0;
            for (size_t t = t0; t < t1; t++)
                for (size_t c = 0; c < C; c++) at[c] += grad_a(ob[t * C + c], qb[t * ldq + c]);
            #pragma omp barrier
            /* merge: each thread a range of channels */
            size_t c0 = C * tid / n, c1 = C * (tid + 1) / n;
            for (size_t c = c0; c < c1; c++) {
                float M, s0, s1;
                aft_sums_merge_channel(st, 4 * C, n, C, c, &M, &s0, &s1);
                /* s0 >= 1 (the largest key's term is 1) unless no key is finite */
                L[c] = (double)M + log((double)s0);
                yp[c] = s0 > 0.0f ? s1 / s0 : 0.0f;
                double a = 0.0;
                for (size_t i = 0; i < n; i++) a += ad[i * C + c];
                A[c] = a;
            }
            #pragma omp barrier
            for (size_t t = t0; t < t1; t++) {
                const size_t r = b * T + t;
                const float *qr = qb + t * ldq, *kr = kb + t * ldk, *vr = vb + t * ldv, *dr = ob + t * C;
                float *dq = io->dq + r * io->lddq, *dk = io->dk + r * io->lddk, *dv = io->dv + r * io->lddv;
                float *out = io->out ? io->out + r * C : NULL;
                for (size_t c = 0; c < C; c++) {
                    dq[c] = dr[c] * yp[c] * dsigmoid(qr[c]);
                    float g = aft_expf((float)((double)kr[c] - L[c])) * (float)A[c];
                    dv[c] = g;
                    dk[c] = g * (vr[c] - yp[c]);
                }
                if (out)
                    for (size_t c = 0; c < C; c++) out[c] = aft_sigmoidf(qr[c]) * yp[c];
            }
        }
    }
    free(st);
    free(ad);
    return AFT_OK;
}
