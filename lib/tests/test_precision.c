/*
 * test_precision.c - aft_config.precision (aft.h): bf16 products with
 * float32 sums where the CPU has a bf16 engine at the kernel level in use.
 *  - With an engine: the layer's output and every gradient, every variant
 *    and bias kind, causal and not, within the bounds docs/design.md
 *    documents (PREC_BOUND_Y, PREC_BOUND_GRAD: twice the worst measured)
 *    of the float64 reference; the bare operator's full (its T x T
 *    products), the FFN and the model's logits likewise.
 *  - The negative control: each of those bf16 results differs from the
 *    float32 run's by more than float32 rounding (PREC_DIFFERS), so a
 *    product that silently ran in float32 where bf16 was asked fails.
 *  - Without an engine (AFT_KERNELS=base or avx2, make test-levels): bf16
 *    gives the float32 run's bits exactly.
 *  - The spelling (f32, bf16; f8 and bf32 refused) and an unknown value.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "aft.h"
#include "files.h"
#include "layers.h"
#include "nn/nn.h"
#include "rng.h"

/* docs/design.md's bounds on the normwise relative error against the
 * float64 reference, and the least difference from float32 a bf16 run
 * must show (float32's own is about 1e-7 here; bf16's about 1e-3) */
#define PREC_BOUND_Y 5e-3
#define PREC_BOUND_GRAD 1.2e-2
#define PREC_DIFFERS 1e-5

static int engine(void)
{
    return strcmp(aft_bf16_engine_in_use(), "none") != 0;
}

/* ||a - r|| / ||r||, in double */
static double rel(const float *a, const float *r, size_t n)
{
    double d = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)r[i];
        d += e * e;
        s += (double)r[i] * (double)r[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* bf16 result b against the reference r (within bound) and the float32
 * result f (farther than float32 rounding) with an engine; without one, b
 * must be f exactly */
static void check(const char *what, const float *b, const float *f, const float *r, size_t n, double bound)
{
    if (!engine()) {
        if (memcmp(b, f, n * sizeof(float)) != 0)
            fail_msg("%s: bf16 without an engine is not the float32 run's bits", what);
        return;
    }
    double e = rel(b, r, n), d = rel(b, f, n);
    if (!(e <= bound)) fail_msg("%s: bf16's error %.3g against the float64 reference exceeds %.3g", what, e, bound);
    if (!(d > PREC_DIFFERS))
        fail_msg("%s: bf16 differs from float32 by %.3g only: it ran in float32 (engine %s)", what, d,
                 aft_bf16_engine_in_use());
}

/* ---------------------------------------------------------------- the layer, forward and backward */

enum { B = 2, T = 64 };

static void layer_case(const lcase *lc, int causal)
{
    layer L;
    make_layer(&L, lc, 0, causal, 46);
    const size_t D = LAYER_D, C = LAYER_C, KC = L.p.k_out, N = B * T * D;
    rng r = {7};
    float *x = randf(&r, N, 1.0), *dy = randf(&r, N, 1.0);
    /* index 0: reference, 1: float32, 2: bf16 */
    float *y[3], *g[3][9];
    const size_t gn[9] = {N, C * D, C, KC * D, KC, C * D, C, D * C, D};
    for (int k = 0; k < 3; k++) {
        y[k] = malloc(N * sizeof(float));
        for (int i = 0; i < 9; i++) g[k][i] = malloc(gn[i] * sizeof(float));
    }
    for (int k = 0; k < 3; k++) {
        aft_config cfg = L.cfg;
        cfg.impl = k == 0 ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
        cfg.precision = k == 2 ? AFT_PRECISION_BF16 : AFT_PRECISION_F32;
        cfg.threads = 2;
        aft_error err = {{0}};
        if (aft_layer_forward(y[k], x, &L.p, &cfg, B, T, &err) != AFT_OK) fail_msg("%s: %s", lc->name, err.msg);
        aft_layer_grads lg = {.dx = g[k][0], .wq = g[k][1], .bq = g[k][2], .wk = g[k][3], .bk = g[k][4],
                              .wv = g[k][5], .bv = g[k][6], .wo = g[k][7], .bo = g[k][8]};
        if (aft_layer_backward(&lg, NULL, dy, x, &L.p, &cfg, B, T, &err) != AFT_OK)
            fail_msg("%s: %s", lc->name, err.msg);
    }
    char what[96];
    snprintf(what, sizeof what, "%s%s: y", lc->name, causal ? " causal" : "");
    check(what, y[2], y[1], y[0], N, PREC_BOUND_Y);
    static const char *const names[9] = {"dx", "dwq", "dbq", "dwk", "dbk", "dwv", "dbv", "dwo", "dbo"};
    for (int i = 0; i < 9; i++) {
        /* the key bias's exact gradient is 0 (a constant added to a
         * channel's keys cancels in its softmax): no relative error */
        if (i == 4) continue;
        /* the output bias's is the column sums of dy: no product, the
         * float32 run's bits */
        if (i == 8) {
            if (memcmp(g[2][i], g[1][i], gn[i] * sizeof(float)) != 0) fail_msg("%s: dbo moved", lc->name);
            continue;
        }
        snprintf(what, sizeof what, "%s%s: %s", lc->name, causal ? " causal" : "", names[i]);
        check(what, g[2][i], g[1][i], g[0][i], gn[i], PREC_BOUND_GRAD);
    }
    for (int k = 0; k < 3; k++) {
        free(y[k]);
        for (int i = 0; i < 9; i++) free(g[k][i]);
    }
    free(x);
    free(dy);
    free_layer(&L);
}

static void test_layer(void **state)
{
    (void)state;
    for (size_t i = 0; i < layer_ncases; i++)
        for (int causal = 0; causal < 2; causal++) layer_case(&layer_cases[i], causal);
}

/* ---------------------------------------------------------------- the bare operator: full's own products */

static void test_op_full(void **state)
{
    (void)state;
    enum { C = 32, TT = 300 };   /* past full's causal chunk of 256 keys */
    rng r = {11};
    const size_t n = B * TT * C;
    float *q = randf(&r, n, 1.0), *k = randf(&r, n, 1.0), *v = randf(&r, n, 1.0), *dout = randf(&r, n, 1.0);
    float *dense = randf(&r, TT * TT, 0.5);
    aft_bias bias = {.kind = AFT_BIAS_DENSE, .dense = dense, .tmax = TT};
    for (int causal = 0; causal < 2; causal++) {
        float *o[3], *d[3][3];
        for (int j = 0; j < 3; j++) {
            o[j] = malloc(n * sizeof(float));
            for (int i = 0; i < 3; i++) d[j][i] = malloc(n * sizeof(float));
            aft_config cfg = {.variant = AFT_FULL, .causal = causal, .threads = 2,
                              .impl = j == 0 ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST,
                              .precision = j == 2 ? AFT_PRECISION_BF16 : AFT_PRECISION_F32};
            aft_error err = {{0}};
            assert_int_equal(aft_op_forward(o[j], q, k, v, &bias, &cfg, B, TT, C, C, &err), AFT_OK);
            assert_int_equal(aft_op_backward(d[j][0], d[j][1], d[j][2], NULL, NULL, dout, q, k, v, &bias, &cfg, B,
                                             TT, C, C, &err),
                             AFT_OK);
        }
        check(causal ? "full causal: out" : "full: out", o[2], o[1], o[0], n, PREC_BOUND_Y);
        check(causal ? "full causal: dq" : "full: dq", d[2][0], d[1][0], d[0][0], n, PREC_BOUND_GRAD);
        check(causal ? "full causal: dk" : "full: dk", d[2][1], d[1][1], d[0][1], n, PREC_BOUND_GRAD);
        check(causal ? "full causal: dv" : "full: dv", d[2][2], d[1][2], d[0][2], n, PREC_BOUND_GRAD);
        for (int j = 0; j < 3; j++) {
            free(o[j]);
            for (int i = 0; i < 3; i++) free(d[j][i]);
        }
    }
    free(q); free(k); free(v); free(dout); free(dense);
}

/* ---------------------------------------------------------------- the FFN and the model */

static void test_ffn(void **state)
{
    (void)state;
    enum { D = 48, F = 96, N = 70 };
    rng r = {5};
    aft_ffn_params p = {.d_model = D, .d_ff = F, .w1 = randf(&r, F * D, 0.2), .b1 = randf(&r, F, 0.1),
                        .w2 = randf(&r, D * F, 0.2), .b2 = randf(&r, D, 0.1)};
    float *x = randf(&r, N * D, 1.0), *y[3], *h = malloc(N * F * sizeof(float));
    for (int j = 0; j < 3; j++) y[j] = malloc(N * D * sizeof(float));
    aft_ffn_ref(y[0], x, &p, N);
    for (int j = 1; j < 3; j++) {
        aft_ffn f;
        aft_error err = {{0}};
        assert_int_equal(aft_ffn_init(&f, &p, AFT_KERNEL_AUTO, j == 2 ? AFT_PRECISION_BF16 : AFT_PRECISION_F32, 2,
                                      &err),
                         AFT_OK);
        aft_ffn_apply(&f, y[j], x, N, h);
        aft_ffn_free(&f);
    }
    check("ffn", y[2], y[1], y[0], N * D, PREC_BOUND_Y);
    for (int j = 0; j < 3; j++) free(y[j]);
    free(h); free(x);
    free((void *)p.w1); free((void *)p.b1); free((void *)p.w2); free((void *)p.b2);
}

static void test_model(void **state)
{
    (void)state;
    const char *path = files_fixture("model", "labml_aft_fortunes.safetensors");
    enum { TT = 48 };
    aft_model *m[3];
    for (int j = 0; j < 3; j++) {
        aft_model_options mo = {.threads = 2, .impl = j == 0 ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST,
                                .precision = j == 2 ? AFT_PRECISION_BF16 : AFT_PRECISION_F32};
        aft_error err = {{0}};
        if (aft_model_open(&m[j], path, &mo, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    }
    size_t V = aft_model_get_info(m[0])->n_vocab;
    int32_t tok[TT];
    for (size_t t = 0; t < TT; t++) tok[t] = (int32_t)((t * 7 + 3) % V);
    float *lg[3];
    for (int j = 0; j < 3; j++) {
        lg[j] = malloc(TT * V * sizeof(float));
        aft_error err = {{0}};
        assert_int_equal(aft_model_forward(m[j], lg[j], tok, 1, TT, &err), AFT_OK);
    }
    check("model logits", lg[2], lg[1], lg[0], TT * V, PREC_BOUND_Y);
    /* the stream (aft generate's path) runs bf16 too */
    aft_model_state *s[2];
    float *step[2];
    for (int j = 0; j < 2; j++) {
        aft_error err = {{0}};
        step[j] = malloc(TT * V * sizeof(float));
        assert_int_equal(aft_model_state_new(&s[j], m[j + 1], 1, &err), AFT_OK);
        assert_int_equal(aft_model_step(s[j], step[j], tok, TT, 0, &err), AFT_OK);
        aft_model_state_free(s[j]);
    }
    check("model stream logits", step[1], step[0], lg[0], TT * V, PREC_BOUND_Y);
    for (int j = 0; j < 2; j++) free(step[j]);
    for (int j = 0; j < 3; j++) {
        free(lg[j]);
        aft_model_free(m[j]);
    }
}

/* ---------------------------------------------------------------- the spelling */

static void test_names(void **state)
{
    (void)state;
    aft_precision p = AFT_PRECISION_F32;
    assert_int_equal(aft_precision_from_name("bf16", &p), 0);
    assert_int_equal(p, AFT_PRECISION_BF16);
    assert_int_equal(aft_precision_from_name("f32", &p), 0);
    assert_int_equal(p, AFT_PRECISION_F32);
    const char *bad[] = {"f8", "bf32", "BF16", "", "bf16 ", "fp32", NULL};
    for (int i = 0; bad[i]; i++) assert_int_equal(aft_precision_from_name(bad[i], &p), -1);
    assert_int_equal(aft_precision_from_name(NULL, &p), -1);
    assert_string_equal(aft_precision_name(AFT_PRECISION_BF16), "bf16");
    assert_string_equal(aft_precision_name(AFT_PRECISION_F32), "f32");
    const char *e = aft_bf16_engine_in_use();
    assert_true(strcmp(e, "none") == 0 || strcmp(e, "avx512_bf16") == 0 || strcmp(e, "amx") == 0);
    /* the floor is measured only where there is an engine */
    if (!engine()) assert_true(aft_bf16_floor(1) == 0.0);

    /* a value outside the enum is refused, not run */
    aft_config cfg = {.variant = AFT_SIMPLE, .precision = (aft_precision)7};
    aft_bias bias = {0};
    aft_error err = {{0}};
    assert_int_equal(aft_config_settle(&cfg, &bias, 4, 4, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "precision"));
    aft_model *m;
    aft_model_options mo = {.precision = (aft_precision)7};
    assert_int_equal(aft_model_open(&m, files_fixture("model", "labml_aft_fortunes.safetensors"), &mo, &err),
                     AFT_ERR_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_layer),
        cmocka_unit_test(test_op_full),
        cmocka_unit_test(test_ffn),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
