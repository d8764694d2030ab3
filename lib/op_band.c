/* op_band.c - AFT-local, AFT-conv and AFT-simple in O(T s C) time and O(T C)
 * memory, without a T x T array.
 *
 * For query t the visible keys split into three parts:
 *   left   t' <= t - s           w = 0: a running (prefix) sum
 *   band   |t' - t| < s          w from the bias: an explicit sum of <= 2s-1 terms
 *   right  t' >= t + s           w = 0: a running sum from the end (not causal)
 * Every part is summed with positive weights only, so nothing cancels (the
 * paper's "global sum plus (exp(w) - 1) correction" cancels catastrophically
 * when a band term dominates and w is very negative).
 *
 * Stability: each running sum carries its own maximum (online softmax); the
 * band is factorised as exp(k - mk) * exp(w - r) with mk the channel's key
 * maximum over the row block's band columns and r the row's band maximum; the
 * three parts are then brought to their common maximum. Where the band was
 * the largest part and its factorised sum still underflowed (keys and biases
 * pulling in opposite directions by more than ~45 nats), that entry is
 * recomputed exactly in double (O(s)).
 *
 * simple (or window 0) is the same kernel with a one-wide band of zero bias.
 */
#include "internal.h"

#include <omp.h>
#include <stdlib.h>

enum { BAND_ROWS = 64, BAND_CH = 64 };

/* running (max, sum exp(k - max), sum exp(k - max) v) over one more key row */
static inline void run_add(float *restrict m, float *restrict s0, float *restrict s1,
                           const float *restrict k, const float *restrict v, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        float mn = k[c] > m[c] ? k[c] : m[c];
        int none = mn == -INFINITY;
        float a = none ? 1.0f : aft_expf(m[c] - mn);
        float e = none ? 0.0f : aft_expf(k[c] - mn);
        s0[c] = s0[c] * a + e;
        s1[c] = s1[c] * a + e * v[c];
        m[c] = mn;
    }
}

typedef struct {
    float *sm, *s0, *s1;      /* right-part states per row: (T, cw) each */
    float *ek, *ekv;          /* band block: (BAND_ROWS + 2s, cw) each */
    float *w, *ew;            /* band row: 2s each */
    float *mk, *pm, *p0, *p1, *b0, *b1;  /* cw each */
    unsigned char *redo;      /* cw */
} band_scratch;

static void band_task(float *out, const float *q, const float *k, const float *v,
                      const aft_wspec *ws, size_t h, size_t c0, size_t cw, size_t s,
                      int zero_bias, band_scratch *sc)
{
    const size_t T = ws->T, C = ws->C;
    const int causal = ws->causal;

    /* right part, from the end: row t needs the keys t' >= t + s */
    if (!causal) {
        float *m = sc->pm, *a0 = sc->p0, *a1 = sc->p1;
        for (size_t c = 0; c < cw; c++) { m[c] = -INFINITY; a0[c] = 0.0f; a1[c] = 0.0f; }
        for (size_t t = T - (s < T ? s : T); t < T; t++)
            for (size_t c = 0; c < cw; c++) {
                sc->sm[t * cw + c] = -INFINITY; sc->s0[t * cw + c] = 0.0f; sc->s1[t * cw + c] = 0.0f;
            }
        for (size_t p = T; p-- > s;) {
            run_add(m, a0, a1, k + p * C + c0, v + p * C + c0, cw);
            size_t t = p - s;
            memcpy(sc->sm + t * cw, m, cw * sizeof(float));
            memcpy(sc->s0 + t * cw, a0, cw * sizeof(float));
            memcpy(sc->s1 + t * cw, a1, cw * sizeof(float));
        }
    }

    /* left part runs forward as rows advance */
    float *pm = sc->pm, *p0 = sc->p0, *p1 = sc->p1;
    for (size_t c = 0; c < cw; c++) { pm[c] = -INFINITY; p0[c] = 0.0f; p1[c] = 0.0f; }
    size_t pnext = 0;

    for (size_t i0 = 0; i0 < T; i0 += BAND_ROWS) {
        size_t i1 = i0 + BAND_ROWS < T ? i0 + BAND_ROWS : T;
        size_t lob = i0 + 1 >= s ? i0 + 1 - s : 0;
        size_t hib = causal ? i1 : (i1 + s - 1 < T ? i1 + s - 1 : T);

        /* exp(k - mk) for the block's band columns; mk is the block's key max
         * per channel, so the largest factor is 1 */
        float *mk = sc->mk;
        for (size_t c = 0; c < cw; c++) mk[c] = -INFINITY;
        for (size_t j = lob; j < hib; j++) {
            const float *kr = k + j * C + c0;
            for (size_t c = 0; c < cw; c++) mk[c] = kr[c] > mk[c] ? kr[c] : mk[c];
        }
        for (size_t c = 0; c < cw; c++) mk[c] = isfinite(mk[c]) ? mk[c] : 0.0f;
        for (size_t j = lob; j < hib; j++) {
            const float *kr = k + j * C + c0, *vr = v + j * C + c0;
            float *e = sc->ek + (j - lob) * cw, *ev = sc->ekv + (j - lob) * cw;
            for (size_t c = 0; c < cw; c++) {
                e[c] = aft_expf(kr[c] - mk[c]);
                ev[c] = e[c] * vr[c];
            }
        }

        for (size_t t = i0; t < i1; t++) {
            while (pnext + s <= t) {
                run_add(pm, p0, p1, k + pnext * C + c0, v + pnext * C + c0, cw);
                pnext++;
            }
            size_t lo = t + 1 >= s ? t + 1 - s : 0;
            size_t hi = causal ? t + 1 : (t + s < T ? t + s : T);
            size_t nw = hi - lo;

            /* band weights exp(w - r), r the row's band maximum */
            float r = 0.0f;
            if (zero_bias) {
                for (size_t j = 0; j < nw; j++) sc->w[j] = 0.0f;
            } else {
                aft_w_row(ws, h, t, lo, hi, sc->w);
                r = -INFINITY;
                for (size_t j = 0; j < nw; j++) r = sc->w[j] > r ? sc->w[j] : r;
                if (!isfinite(r)) r = 0.0f;
            }
            for (size_t j = 0; j < nw; j++) sc->ew[j] = aft_expf(sc->w[j] - r);

            float *b0 = sc->b0, *b1 = sc->b1;
            for (size_t c = 0; c < cw; c++) { b0[c] = 0.0f; b1[c] = 0.0f; }
            for (size_t j = 0; j < nw; j++) {
                const float e = sc->ew[j];
                const float *ekr = sc->ek + (lo + j - lob) * cw, *ekvr = sc->ekv + (lo + j - lob) * cw;
                for (size_t c = 0; c < cw; c++) {
                    b0[c] += e * ekr[c];
                    b1[c] += e * ekvr[c];
                }
            }

            /* bring band, left and right to their common maximum */
            const float *qr = q + t * C + c0;
            float *yr = out + t * C + c0;
            const float *smr = causal ? NULL : sc->sm + t * cw;
            const float *s0r = causal ? NULL : sc->s0 + t * cw;
            const float *s1r = causal ? NULL : sc->s1 + t * cw;
            int any_redo = 0;
            for (size_t c = 0; c < cw; c++) {
                float mb = mk[c] + r;
                float ms = causal ? -INFINITY : smr[c];
                float M = mb > pm[c] ? mb : pm[c];
                M = ms > M ? ms : M;
                float fb = aft_expf(mb - M), fp = aft_expf(pm[c] - M), fs = aft_expf(ms - M);
                float den = b0[c] * fb + p0[c] * fp + (causal ? 0.0f : s0r[c] * fs);
                float num = b1[c] * fb + p1[c] * fp + (causal ? 0.0f : s1r[c] * fs);
                yr[c] = aft_sigmoidf(qr[c]) * (num / den);
                unsigned char bad = !(den >= AFT_DEN_EXACT_BELOW);
                sc->redo[c] = bad;
                any_redo |= bad;
            }
            if (!any_redo) continue;

            /* exact recomputation in double of the entries whose band underflowed */
            for (size_t c = 0; c < cw; c++) {
                if (!sc->redo[c]) continue;
                double bm = -INFINITY;
                for (size_t j = lo; j < hi; j++) {
                    double e = (double)k[j * C + c0 + c] + (double)sc->w[j - lo];
                    bm = e > bm ? e : bm;
                }
                double lm = pm[c], rm = causal ? -INFINITY : smr[c];
                double M = bm > lm ? bm : lm;
                M = rm > M ? rm : M;
                double num = 0.0, den = 0.0;
                if (M > -INFINITY) {
                    for (size_t j = lo; j < hi; j++) {
                        double e = exp((double)k[j * C + c0 + c] + (double)sc->w[j - lo] - M);
                        den += e;
                        num += e * (double)v[j * C + c0 + c];
                    }
                    if (lm > -INFINITY) {
                        double f = exp(lm - M);
                        den += p0[c] * f;
                        num += p1[c] * f;
                    }
                    if (rm > -INFINITY) {
                        double f = exp(rm - M);
                        den += s0r[c] * f;
                        num += s1r[c] * f;
                    }
                }
                double sq = 1.0 / (1.0 + exp(-(double)qr[c]));
                yr[c] = den > 0.0 ? (float)(sq * num / den) : 0.0f;
            }
        }
    }
}

aft_status aft_op_band(float *out, const float *q, const float *k, const float *v,
                       size_t B, const aft_wspec *ws, aft_error *err)
{
    const size_t T = ws->T, C = ws->C;
    const size_t H = ws->variant == AFT_CONV && ws->heads ? ws->heads : 1, ch = C / H;
    if (T == 0 || C == 0 || B == 0) return AFT_OK;
    int zero_bias = ws->variant == AFT_SIMPLE || ws->window == 0 ||
                    (ws->variant == AFT_CONV ? ws->bias->kind != AFT_BIAS_CONV
                                             : ws->bias->kind == AFT_BIAS_NONE);
    /* a band wider than the sequence is the whole sequence */
    size_t s = zero_bias ? 1 : (ws->window < T ? ws->window : T);
    size_t nblk = (ch + BAND_CH - 1) / BAND_CH;
    size_t ntask = B * H * nblk;
    size_t cw_max = ch < BAND_CH ? ch : BAND_CH;

    /* per-thread scratch; sizes are small multiples of T * 64, so plain
     * products cannot overflow once T * C did not */
    size_t n_right = ws->causal ? 0 : T * cw_max;
    size_t n_band = (BAND_ROWS + 2 * s) * cw_max;
    int failed = 0;

    #pragma omp parallel
    {
        band_scratch sc = {0};
        float *blk = aft_alloc_array(3 * n_right + 2 * n_band + 4 * s + 6 * cw_max, sizeof(float));
        sc.redo = malloc(cw_max);
        if (!blk || !sc.redo) {
            #pragma omp atomic write
            failed = 1;
        } else {
            float *p = blk;
            sc.sm = p; p += n_right;
            sc.s0 = p; p += n_right;
            sc.s1 = p; p += n_right;
            sc.ek = p; p += n_band;
            sc.ekv = p; p += n_band;
            sc.w = p; p += 2 * s;
            sc.ew = p; p += 2 * s;
            sc.mk = p; p += cw_max;
            sc.pm = p; p += cw_max;
            sc.p0 = p; p += cw_max;
            sc.p1 = p; p += cw_max;
            sc.b0 = p; p += cw_max;
            sc.b1 = p;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < ntask; task++) {
                size_t b = task / (H * nblk), rest = task % (H * nblk);
                size_t h = rest / nblk, blkno = rest % nblk;
                size_t c0 = h * ch + blkno * BAND_CH;
                size_t cw = ch - blkno * BAND_CH < BAND_CH ? ch - blkno * BAND_CH : BAND_CH;
                size_t off = b * T * C;
                band_task(out + off, q + off, k + off, v + off, ws, h, c0, cw, s, zero_bias, &sc);
            }
        }
        free(blk);
        free(sc.redo);
    }
    if (failed)
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for band scratch (T = %zu)", T);
    return AFT_OK;
}
