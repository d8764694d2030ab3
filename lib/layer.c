/* layer.c - the AFT layer: projections, the operator, the output projection. */
#include "internal.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

// y: (N, out)   x: (N, in)   w: (out, in) like PyTorch's Linear   b: (out) or NULL
// y = x w^T + b, through CBLAS on aft's threads
static void linear_fast(float *y, const float *x, const float *w, const float *b,
                        size_t N, size_t in, size_t out)
{
    aft_gemm(1, N, out, in, x, in, w, in, b, y, out);
}

// same, as plain loops accumulating in double
static void linear_ref(float *y, const float *x, const float *w, const float *b,
                       size_t N, size_t in, size_t out)
{
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < out; o++) {
            double s = b ? (double)b[o] : 0.0;
            for (size_t i = 0; i < in; i++) s += (double)x[n * in + i] * (double)w[o * in + i];
            y[n * out + o] = (float)s;
        }
}

aft_status aft_layer_forward(float *y, const float *x, const aft_params *p,
                             const aft_config *cfg, size_t B, size_t T, aft_error *err)
{
    return aft_layer_forward_timed(y, x, p, cfg, B, T, NULL, err);
}

aft_status aft_layer_forward_timed(float *y, const float *x, const aft_params *p,
                                   const aft_config *cfg, size_t B, size_t T,
                                   aft_layer_times *times, aft_error *err)
{
    aft_layer_times tm = {0, 0, 0};
    if (times) *times = tm;
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C;
    if (!p->wq || !p->wk || !p->wv || !p->wo)
        return aft_fail(err, AFT_ERR_ARG, "the layer needs query, key, value and output weights");
    if (D == 0 || C == 0)
        return aft_fail(err, AFT_ERR_ARG, "model size %zu and hidden size %zu must be positive", D, C);
    if (D > INT_MAX || C > INT_MAX / 4 || KC > INT_MAX / 4)
        return aft_fail(err, AFT_ERR_ARG, "sizes D = %zu, C = %zu exceed the supported range", D, C);
    size_t N;
    if (!aft_mul_ok(B, T, &N) || N > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu exceeds the supported range", B, T);
    if (N == 0) return AFT_OK;
    if (!x || !y) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !x ? "input x" : "output y");
    if (cfg->threads != aft_get_threads() || cfg->threads == 0) aft_set_threads(cfg->threads);

    aft_status st;
    if (cfg->impl == AFT_IMPL_REFERENCE) {
        /* the plain path: each projection on its own, in double */
        float *q = aft_alloc_array(N, C * sizeof(float));
        float *k = aft_alloc_array(N, KC * sizeof(float));
        float *v = aft_alloc_array(N, C * sizeof(float));
        float *h = aft_alloc_array(N, C * sizeof(float));
        if (!q || !k || !v || !h) {
            free(q); free(k); free(v); free(h);
            return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu x %zu", N, C);
        }
        double t0 = aft_now_ms();
        linear_ref(q, x, p->wq, p->bq, N, D, C);
        linear_ref(k, x, p->wk, p->bk, N, D, KC);
        linear_ref(v, x, p->wv, p->bv, N, D, C);
        double t1 = aft_now_ms();
        st = aft_op_forward(h, q, k, v, &p->bias, cfg, B, T, C, KC, err);
        double t2 = aft_now_ms();
        if (st == AFT_OK) linear_ref(y, h, p->wo, p->bo, N, C, D);
        tm = (aft_layer_times){t1 - t0, t2 - t1, aft_now_ms() - t2};
        if (times) *times = tm;
        free(q); free(k); free(v); free(h);
        return st;
    }

    /* the fast path: Q, K and V from one product with the three weight
     * matrices stacked, (N, D) x (D, 2C + KC): X is read and packed once and
     * the product is wide enough to run near the machine's peak. The
     * operator reads Q, K, V in place, rows 2C + KC apart. */
    size_t W = 2 * C + KC;
    float *wcat = aft_alloc_array(W, D * sizeof(float));
    float *bcat = aft_alloc_array(W, sizeof(float));
    float *qkv = aft_alloc_array(N, W * sizeof(float));
    float *h = aft_alloc_array(N, C * sizeof(float));
    if (!wcat || !bcat || !qkv || !h) {
        free(wcat); free(bcat); free(qkv); free(h);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu x %zu", N, W);
    }
    memcpy(wcat, p->wq, C * D * sizeof(float));
    memcpy(wcat + C * D, p->wk, KC * D * sizeof(float));
    memcpy(wcat + (C + KC) * D, p->wv, C * D * sizeof(float));
    int any_bias = p->bq || p->bk || p->bv;
    const float *bs[3] = {p->bq, p->bk, p->bv};
    size_t bn[3] = {C, KC, C}, off = 0;
    for (int i = 0; i < 3; i++) {
        if (bs[i]) memcpy(bcat + off, bs[i], bn[i] * sizeof(float));
        else memset(bcat + off, 0, bn[i] * sizeof(float));
        off += bn[i];
    }
    double t0 = aft_now_ms();
    linear_fast(qkv, x, wcat, any_bias ? bcat : NULL, N, D, W);
    double t1 = aft_now_ms();
    free(wcat);
    free(bcat);
    st = aft_op_forward_ld(h, qkv, W, qkv + C, W, qkv + C + KC, W, &p->bias, cfg, B, T, C, KC, err);
    double t2 = aft_now_ms();
    if (st == AFT_OK) linear_fast(y, h, p->wo, p->bo, N, C, D);
    tm = (aft_layer_times){t1 - t0, t2 - t1, aft_now_ms() - t2};
    if (times) *times = tm;
    free(qkv);
    free(h);
    return st;
}
