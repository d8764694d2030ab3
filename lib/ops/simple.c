/* simple.c - AFT-simple without causality: w = 0, so each channel's
 * output is sigmoid(q) times one softmax average of v over the sequence,
 * O(T C) time. (With causality simple is the band kernel with a band of one
 * row and w = 0: local_conv.c.)
 *
 * The average's sums are the stabilised sums of sums.h, so keys in the
 * hundreds neither overflow nor lose the terms that matter. */
#include "kernels.h"

#include <omp.h>
#include <stdlib.h>

/* below this many rows the per-channel kernel alone */
enum { SIMPLE_SPLIT_ROWS = 128 };
/* channels a task of the per-channel kernel */
enum { SIMPLE_CH = 128 };

/* simple, not causal: Y[t,c] = sigmoid(q) * sum softmax_t'(k) v, one
 * exponential per key; the channel maximum makes the largest term 1 */
static void simple_task(float *out, const float *q, const float *k, const float *v, const aft_opspec *ws,
                        size_t c0, size_t cw, float *m, float *s0, float *s1)
{
    const size_t T = ws->T, C = ws->C, ldq = ws->ldq, ldk = ws->ldk, ldv = ws->ldv;
    for (size_t c = 0; c < cw; c++) { m[c] = -INFINITY; s0[c] = 0.0f; s1[c] = 0.0f; }
    for (size_t t = 0; t < T; t++) {
        const float *kr = k + t * ldk + c0;
        for (size_t c = 0; c < cw; c++) m[c] = kr[c] > m[c] ? kr[c] : m[c];
    }
    for (size_t c = 0; c < cw; c++) m[c] = isfinite(m[c]) ? m[c] : 0.0f;
    for (size_t t = 0; t < T; t++) {
        const float *kr = k + t * ldk + c0, *vr = v + t * ldv + c0;
        for (size_t c = 0; c < cw; c++) {
            float e = aft_expf(kr[c] - m[c]);
            s0[c] += e;
            s1[c] += e * vr[c];
        }
    }
    for (size_t c = 0; c < cw; c++) s1[c] = s0[c] > 0.0f ? s1[c] / s0[c] : 0.0f;
    for (size_t t = 0; t < T; t++) {
        const float *qr = q + t * ldq + c0;
        float *yr = out + t * C + c0;
        for (size_t c = 0; c < cw; c++) yr[c] = aft_sigmoidf(qr[c]) * s1[c];
    }
}

/* simple, not causal, all batches: the same sums with the rows split over
 * the threads, so each thread reads whole rows in order (q, k and v share a
 * row in the layer's buffer) instead of every thread striding through all
 * rows for its channels. Each thread keeps per channel a running maximum m
 * and s0 = sum exp(k - m), s1 = sum exp(k - m) v over its rows, raising m a
 * block of rows at a time (all factors stay <= 1); the threads'
 * sums are then brought to the largest m and added. Returns 0 when some key
 * is +inf or NaN: the caller then runs simple_task, whose rules for
 * non-finite keys this does not repeat. */
static int simple_rows_split(float *out, const float *q, const float *k, const float *v, size_t B,
                             const aft_opspec *ws, float *st, size_t nt)
{
    const size_t T = ws->T, C = ws->C, ldq = ws->ldq, ldk = ws->ldk, ldv = ws->ldv;
    /* st: per thread m, s0, s1, block maxima (4C each); then s (C) */
    float *sv = st + nt * 4 * C;
    int ok = 1;
    for (size_t b = 0; b < B && ok; b++) {
        const float *qb = q + b * T * ldq, *kb = k + b * T * ldk, *vb = v + b * T * ldv;
        float *ob = out + b * T * C;
        int bad_key = 0;
        #pragma omp parallel num_threads((int)nt) reduction(|:bad_key)
        {
            size_t tid = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
            size_t t0 = T * tid / n, t1 = T * (tid + 1) / n;
            float *m = st + tid * 4 * C, *s0 = m + C, *s1 = m + 2 * C, *bm = m + 3 * C;
            bad_key |= aft_sums_of_rows(kb, ldk, vb, ldv, t0, t1, C, m, s0, s1, bm);
            #pragma omp barrier
            /* merge: each thread a range of channels */
            size_t c0 = C * tid / n, c1 = C * (tid + 1) / n;
            for (size_t c = c0; c < c1; c++) {
                float M, a0, a1;
                aft_sums_merge_channel(st, 4 * C, n, C, c, &M, &a0, &a1);
                sv[c] = a0 > 0.0f ? a1 / a0 : 0.0f;
            }
            #pragma omp barrier
            for (size_t t = t0; t < t1; t++) {
                const float *qr = qb + t * ldq;
                float *yr = ob + t * C;
                for (size_t c = 0; c < C; c++) yr[c] = aft_sigmoidf(qr[c]) * sv[c];
            }
        }
        ok = !bad_key;
    }
    return ok;
}

/* every batch and channel block on the next free thread, simple_task each */
static aft_status simple_per_channel(float *out, const float *q, const float *k, const float *v, size_t B,
                                     const aft_opspec *sp, aft_error *err)
{
    const size_t T = sp->T, C = sp->C, nblk = (C + SIMPLE_CH - 1) / SIMPLE_CH;
    int failed = 0;
    #pragma omp parallel num_threads(sp->threads)
    {
        float *m = aft_alloc_array(3 * SIMPLE_CH, sizeof(float));
        if (!m) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < B * nblk; task++) {
                size_t b = task / nblk, c0 = task % nblk * SIMPLE_CH;
                size_t cw = C - c0 < SIMPLE_CH ? C - c0 : SIMPLE_CH;
                simple_task(out + b * T * C, q + b * T * sp->ldq, k + b * T * sp->ldk, v + b * T * sp->ldv, sp,
                            c0, cw, m, m + SIMPLE_CH, m + 2 * SIMPLE_CH);
            }
        }
        free(m);
    }
    if (failed) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for softmax sums (C = %zu)", C);
    return AFT_OK;
}

aft_status aft_op_simple(float *out, const float *q, const float *k, const float *v, size_t B,
                         const aft_opspec *sp, aft_error *err)
{
    const size_t T = sp->T, C = sp->C;
    if (T == 0 || C == 0 || B == 0) return AFT_OK;
    if (T >= SIMPLE_SPLIT_ROWS) {
        size_t nt = (size_t)sp->threads;
        float *st = aft_alloc_array(nt * 4 + 1, C * sizeof(float));
        if (!st) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for softmax sums (C = %zu)", C);
        int ok = simple_rows_split(out, q, k, v, B, sp, st, nt);
        free(st);
        if (ok) return AFT_OK;
        /* a key of +inf or NaN: the per-channel kernel, for all batches */
    }
    return simple_per_channel(out, q, k, v, B, sp, err);
}
