/* layer.c - the AFT layer: projections, the operator, the output projection. */
#include "internal.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

// y: (N, out)   x: (N, in)   w: (out, in) like PyTorch's Linear   b: (out) or NULL
// y = x w^T + b, through CBLAS
static void linear_fast(float *y, const float *x, const float *w, const float *b,
                        size_t N, size_t in, size_t out)
{
    if (b) {
        #pragma omp parallel for schedule(static)
        for (size_t n = 0; n < N; n++) memcpy(y + n * out, b, out * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)out, (int)in, 1.0f, x, (int)in,
                w, (int)in, b ? 1.0f : 0.0f, y, (int)out);
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
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C;
    if (!p->wq || !p->wk || !p->wv || !p->wo)
        return aft_fail(err, AFT_ERR_ARG, "the layer needs query, key, value and output weights");
    if (D == 0 || C == 0)
        return aft_fail(err, AFT_ERR_ARG, "model size %zu and hidden size %zu must be positive", D, C);
    if (D > INT_MAX || C > INT_MAX / 2)
        return aft_fail(err, AFT_ERR_ARG, "sizes D = %zu, C = %zu exceed the supported range", D, C);
    size_t N;
    if (!aft_mul_ok(B, T, &N) || N > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu exceeds the supported range", B, T);
    if (N == 0) return AFT_OK;
    if (!x || !y) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !x ? "input x" : "output y");
    if (cfg->threads != aft_get_threads() || cfg->threads == 0) aft_set_threads(cfg->threads);

    float *q = aft_alloc_array(N, C * sizeof(float));
    float *k = aft_alloc_array(N, KC * sizeof(float));
    float *v = aft_alloc_array(N, C * sizeof(float));
    float *h = aft_alloc_array(N, C * sizeof(float));
    if (!q || !k || !v || !h) {
        free(q); free(k); free(v); free(h);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu x %zu", N, C);
    }
    void (*lin)(float *, const float *, const float *, const float *, size_t, size_t, size_t) =
        cfg->impl == AFT_IMPL_REFERENCE ? linear_ref : linear_fast;
    lin(q, x, p->wq, p->bq, N, D, C);
    lin(k, x, p->wk, p->bk, N, D, KC);
    lin(v, x, p->wv, p->bv, N, D, C);
    aft_status st = aft_op_forward(h, q, k, v, &p->bias, cfg, B, T, C, KC, err);
    if (st == AFT_OK) lin(y, h, p->wo, p->bo, N, C, D);
    free(q); free(k); free(v); free(h);
    return st;
}
