/* ffn.c - the position-wise feed-forward network of a transformer layer,
 * y = relu(x W1^T + b1) W2^T + b2 (labml's FeedForward, not gated), with
 * both products packed once (linear.c), and its float64 reference. */
#include "nn.h"
#include "bf16.h"

#include <math.h>
#include <stdlib.h>

/* y = x W^T + b packed as the FFN's products run: float32 under kernel
 * (a 16-bit W kept so), or bf16 */
static aft_status ffn_linear(aft_linear *l, const void *w, aft_dtype wdt, const float *b, size_t n, size_t k,
                             aft_kernel kernel, int bf16, int threads, aft_error *err)
{
    if (bf16) return aft_linear_init_bf16(l, w, wdt, b, n, k, threads, err);
    return aft_linear_init_dt(l, w, wdt, b, n, k, kernel, threads, err);
}

aft_status aft_ffn_init(aft_ffn *f, const aft_ffn_params *p, aft_kernel kernel, aft_precision precision, int threads,
                        aft_error *err)
{
    memset(f, 0, sizeof *f);
    if (!p->w1 || !p->w2) return aft_fail(err, AFT_ERR_ARG, "the feed-forward network needs both weights");
    f->p = *p;
    int bf16 = aft_bf16_wanted(precision);
    aft_dtype dt = aft_dtype_is16(p->wdt) ? p->wdt : AFT_F32;
    aft_status st = ffn_linear(&f->l1, p->w1, dt, p->b1, p->d_ff, p->d_model, kernel, bf16, threads, err);
    if (st) return st;
    if ((st = ffn_linear(&f->l2, p->w2, dt, p->b2, p->d_model, p->d_ff, kernel, bf16, threads, err))) {
        aft_linear_free(&f->l1);
        return st;
    }
    return AFT_OK;
}

void aft_ffn_free(aft_ffn *f)
{
    aft_linear_free(&f->l1);
    aft_linear_free(&f->l2);
    memset(f, 0, sizeof *f);
}

/* max(0, h), NaN kept: the comparison is false for NaN */
static void relu(float *h, size_t n)
{
    for (size_t i = 0; i < n; i++) h[i] = h[i] < 0.0f ? 0.0f : h[i];
}

void aft_ffn_apply(const aft_ffn *f, float *y, const float *x, size_t N, float *h)
{
    size_t D = f->p.d_model, F = f->p.d_ff;
    aft_linear_apply(&f->l1, N, x, D, h, F);
    relu(h, N * F);
    /* h was just written: aft's kernel reads its rows in place */
    aft_linear_apply_x(&f->l2, N, h, F, y, D, 1);
}

void aft_ffn_ref(float *y, const float *x, const aft_ffn_params *p, size_t N)
{
    size_t D = p->d_model, F = p->d_ff;
    double *h = aft_alloc_array(F ? F : 1, sizeof(double));
    /* 16-bit weights widened (exact) */
    int w16 = aft_dtype_is16(p->wdt);
    float *w1 = w16 ? aft_w_widen(p->w1, p->wdt, F * D) : (float *)p->w1;
    float *w2 = w16 ? aft_w_widen(p->w2, p->wdt, D * F) : (float *)p->w2;
    if (!h || !w1 || !w2) {   /* the tests' reference: no way to report, so poison the output */
        for (size_t i = 0; i < N * D; i++) y[i] = NAN;
        free(h);
        if (w16) free(w1), free(w2);
        return;
    }
    for (size_t r = 0; r < N; r++) {
        const float *xr = x + r * D;
        for (size_t j = 0; j < F; j++) {
            double s = p->b1 ? (double)p->b1[j] : 0.0;
            for (size_t i = 0; i < D; i++) s += (double)xr[i] * (double)w1[j * D + i];
            h[j] = s < 0.0 ? 0.0 : s;
        }
        for (size_t o = 0; o < D; o++) {
            double s = p->b2 ? (double)p->b2[o] : 0.0;
            for (size_t j = 0; j < F; j++) s += h[j] * (double)w2[o * F + j];
            y[r * D + o] = (float)s;
        }
    }
    free(h);
    if (w16) free(w1), free(w2);
}
