/*
 * test_layer.c - the layer (lib/layer.c: projections, the operator, the
 * output projection) against the float64 layer reference in ref_aft.c, for
 * both cfg.impl = AFT_IMPL_FAST and AFT_IMPL_REFERENCE (opcheck.h):
 * d_hidden != d_model both ways, projection biases or none, short
 * sequences a thread each, the products split by rows or columns, on 2-D
 * grids; and what it refuses.
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

#include "opcheck.h"
#include "ref_aft.h"
#include "rng.h"

/* d_hidden != d_model both ways, projection biases present or NULL */
static void test_layer(void **state)
{
    (void)state;
    const layer_variant lvs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0},   {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0},  {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 3, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 1, 0},  {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 5, 0},    {AFT_CONV, AFT_BIAS_CONV, 4, 5, 1},
        {AFT_CONV, AFT_BIAS_CONV, 2, 40, 1},
    };
    const size_t dims[][2] = {{10, 12}, {16, 8}};   /* (D, C) */
    const size_t Ts[] = {7, 33};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(lvs); i++)
        for (size_t di = 0; di < N_OF(dims); di++)
            for (int with_biases = 0; with_biases <= 1; with_biases++)
                for (int causal = 0; causal <= 1; causal++) {
                    size_t B = (cases & 1) ? 3 : 1, T = Ts[(cases >> 1) & 1];
                    mask_mode mask = (mask_mode)(cases % 3);
                    fails += run_layer_case(&lvs[i], B, T, dims[di][0], dims[di][1], with_biases,
                                            causal, mask, 2000 + (uint64_t)cases, 0, &reports);
                    cases++;
                }
    op_finish(fails, cases);
}

/* Short sequences, two or more, longer than a chunk (layer.c,
 * layer_sequences): each thread runs whole sequences, each sequence's own
 * mask; 2 and 3 threads, the sequences not a multiple of them. */
static void test_layer_sequences(void **state)
{
    (void)state;
    const layer_variant lvs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0}, {AFT_LOCAL, AFT_BIAS_DENSE, 0, 9, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 3, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 5, 0},
    };
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(lvs); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (int th = 2; th <= 3; th++) {
                mask_mode mask = (mask_mode)(cases % 3);
                fails += run_layer_case(&lvs[i], 5, 130, 12, 8, causal, causal, mask, 2700 + (uint64_t)cases, th,
                                        &reports);
                cases++;
            }
    op_finish(fails, cases);
}

/* The layer's products are split over the threads by rows (many rows), by
 * columns (few rows, wide products) or not at all (both small); each shape
 * here takes one of those ways for Q/K/V or the output with 2 or 3 threads,
 * and one thread as the baseline. */
static void test_layer_products_split(void **state)
{
    (void)state;
    const layer_variant lv[] = {{AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0}};
    /* (B, T, D, C): Q/K/V is (B T) x 3C, the output (B T) x D */
    const size_t shapes[][4] = {
        {1, 20, 16, 48},    /* 20 rows, 144 columns: Q/K/V split by columns */
        {1, 9, 100, 12},    /* 9 rows, output 100 columns: split by columns */
        {2, 70, 24, 20},    /* 140 rows: split by rows */
        {1, 5, 8, 8},       /* too small to split */
    };
    const int th[] = {1, 2, 3};
    int fails = 0, cases = 0, reports = 0;
    for (size_t si = 0; si < N_OF(shapes); si++)
        for (size_t li = 0; li < N_OF(lv); li++)
            for (size_t hi = 0; hi < N_OF(th); hi++) {
                const size_t *sh = shapes[si];
                fails += run_layer_case(&lv[li], sh[0], sh[1], sh[2], sh[3], 1, (int)(hi & 1), MASK_NONE,
                                        2500 + (uint64_t)cases, th[hi], &reports);
                cases++;
            }
    op_finish(fails, cases);
}

/* aft_layer_forward with the grid in the configuration against the float64
 * layer reference: local (dense, seeded), conv (keys per head and per
 * channel, a shared square), causal or not, with projection biases or
 * without, both impls */
static void test_grid_layer(void **state)
{
    (void)state;
    int fails = 0, cases = 0;
    for (int variant = 0; variant < 4; variant++)
        for (int causal = 0; causal <= 1; causal++)
            for (int with_b = 0; with_b <= 1; with_b++) {
                const size_t B = 1 + (size_t)with_b, H = 5 + (size_t)causal, W = 7, T = H * W, D = 10, C = 12;
                const size_t nh = variant == 3 ? 1 : 4, S = 2 + (size_t)(variant % 2);
                const size_t KC = variant == 2 ? nh : C;
                rng r = {4000 + (uint64_t)cases};
                float *x = randf(&r, B * T * D, 1.0), *wq = randf(&r, C * D, 0.4), *wk = randf(&r, KC * D, 0.4),
                      *wv = randf(&r, C * D, 0.4), *wo = randf(&r, D * C, 0.4), *bq = randf(&r, C, 0.2),
                      *bk = randf(&r, KC, 0.2), *bv = randf(&r, C, 0.2), *bo = randf(&r, D, 0.2);
                size_t tmax = T + 1, len = 2 * S - 1;
                float *dense = randf(&r, tmax * tmax, 1.0), *sq = randf(&r, nh * len * len, 1.0);
                aft_params p = {0};
                p.d_model = D;
                p.d_hidden = C;
                p.k_out = KC;
                p.wq = wq; p.wk = wk; p.wv = wv; p.wo = wo;
                if (with_b) {
                    p.bq = bq; p.bk = bk; p.bv = bv; p.bo = bo;
                }
                aft_config cfg = {0};
                cfg.causal = causal;
                cfg.threads = 1 + cases % 3;
                cfg.grid_h = H;
                cfg.grid_w = W;
                cfg.window = S;
                if (variant == 0 || variant == 1) {
                    cfg.variant = AFT_LOCAL;
                    p.bias.kind = variant == 0 ? AFT_BIAS_DENSE : AFT_BIAS_SEEDED;
                    p.bias.dense = dense;
                    p.bias.tmax = tmax;
                    p.bias.seed = 17;
                    p.bias.scale = 1.0f;
                } else {
                    cfg.variant = AFT_CONV;
                    cfg.heads = 4;
                    p.bias.kind = AFT_BIAS_CONV;
                    p.bias.conv = sq;
                    p.bias.conv_2d = 1;
                    p.bias.conv_len = len;
                    p.bias.conv_rows = nh;
                }
                double *ref = xmalloc(B * T * D * sizeof *ref);
                aft_config rc = cfg;
                rc.heads = cfg.variant == AFT_CONV ? 4 : 0;
                assert_int_equal(ref_aft_layer(ref, x, &p, &rc, B, T), 0);
                float *y = xmalloc(B * T * D * sizeof *y);
                for (int impl = 0; impl <= 1; impl++) {
                    cfg.impl = impl ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
                    for (size_t i = 0; i < B * T * D; i++) y[i] = NAN;
                    aft_error err = {{0}};
                    aft_status st = aft_layer_forward(y, x, &p, &cfg, B, T, &err);
                    double maxref = 0, maxerr = 0;
                    for (size_t i = 0; i < B * T * D; i++) {
                        maxref = fmax(maxref, fabs(ref[i]));
                        double e = fabs((double)y[i] - ref[i]);
                        if (!(e <= maxerr)) maxerr = e;
                    }
                    if (st != AFT_OK || !(maxerr <= OP_TOL_REL * fmax(1.0, maxref))) {
                        print_message("FAIL layer %s variant %d causal %d biases %d: status %d (%s), max err %.3g\n",
                                      impl ? "reference" : "fast", variant, causal, with_b, (int)st, err.msg, maxerr);
                        fails++;
                    }
                }
                free(x); free(wq); free(wk); free(wv); free(wo); free(bq); free(bk); free(bv); free(bo);
                free(dense); free(sq); free(ref); free(y);
                cases++;
            }
    op_finish(fails, cases);
}

/* 16-bit weights (aft_params.w_dtype f16, bf16): the layer's outputs and
 * gradients, fast and reference, whole and chunked (local causal's
 * pipeline, simple's gated output), and a streaming state's steps, are
 * those of the same weights widened to float32, byte for byte */
static void test_layer_16bit(void **state)
{
    (void)state;
    enum { B = 2, T = 300, D = 40, C = 24 };
    rng r = {1616};
    const aft_dtype dts[] = {AFT_F16, AFT_BF16};
    const aft_variant vars[] = {AFT_LOCAL, AFT_SIMPLE, AFT_FULL};
    float *x = randf(&r, B * T * D, 1.0), *dy = randf(&r, B * T * D, 1.0);
    float *y1 = xmalloc(B * T * D * 4), *y2 = xmalloc(B * T * D * 4);
    for (size_t di = 0; di < 2; di++) {
        aft_dtype dt = dts[di];
        const size_t n[4] = {C * D, C * D, C * D, D * C};
        float *w[4], *b[4];
        uint16_t *h[4];
        for (int i = 0; i < 4; i++) {
            w[i] = randf(&r, n[i], 0.3);
            b[i] = randf(&r, i == 3 ? D : C, 0.1);
            h[i] = xmalloc(n[i] * 2);
            for (size_t j = 0; j < n[i]; j++) {
                h[i][j] = dt == AFT_F16 ? aft_f32_to_f16(w[i][j]) : aft_f32_to_bf16(w[i][j]);
                w[i][j] = dt == AFT_F16 ? aft_f16_to_f32(h[i][j]) : aft_bf16_to_f32(h[i][j]);
            }
        }
        aft_params p32 = {.d_model = D, .d_hidden = C, .k_out = C, .wq = w[0], .bq = b[0], .wk = w[1], .bk = b[1],
                          .wv = w[2], .bv = b[2], .wo = w[3], .bo = b[3],
                          .bias = {.kind = AFT_BIAS_SEEDED, .seed = 9, .scale = 0.5f}, .w_dtype = AFT_F32};
        aft_params p16 = p32;
        p16.wq = (const float *)h[0];
        p16.wk = (const float *)h[1];
        p16.wv = (const float *)h[2];
        p16.wo = (const float *)h[3];
        p16.w_dtype = dt;
        for (size_t vi = 0; vi < N_OF(vars); vi++)
            for (int impl = 0; impl < 2; impl++) {
                aft_config cfg = {.variant = vars[vi], .window = 5, .causal = vi == 0, .threads = 2,
                                  .impl = impl ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST};
                aft_error err = {{0}};
                assert_int_equal(aft_layer_forward(y1, x, &p16, &cfg, B, T, &err), AFT_OK);
                assert_int_equal(aft_layer_forward(y2, x, &p32, &cfg, B, T, &err), AFT_OK);
                if (memcmp(y1, y2, B * T * D * 4) != 0)
                    fail_msg("%s %s impl %d: forward not the float32 bits", aft_dtype_name(dt),
                             aft_variant_name(vars[vi]), impl);
                /* gradients */
                float *g1 = xcalloc(2 * (B * T * D + 4 * C * D + 3 * C + D), 4);
                float *g2 = g1 + B * T * D + 4 * C * D + 3 * C + D;
                aft_layer_grads gr[2];
                for (int k = 0; k < 2; k++) {
                    float *g = k ? g2 : g1;
                    gr[k] = (aft_layer_grads){.dx = g, .wq = g + B * T * D, .wk = g + B * T * D + C * D,
                                              .wv = g + B * T * D + 2 * C * D, .wo = g + B * T * D + 3 * C * D,
                                              .bq = g + B * T * D + 4 * C * D, .bk = g + B * T * D + 4 * C * D + C,
                                              .bv = g + B * T * D + 4 * C * D + 2 * C,
                                              .bo = g + B * T * D + 4 * C * D + 3 * C};
                }
                assert_int_equal(aft_layer_backward(&gr[0], y1, dy, x, &p16, &cfg, B, T, &err), AFT_OK);
                assert_int_equal(aft_layer_backward(&gr[1], y2, dy, x, &p32, &cfg, B, T, &err), AFT_OK);
                if (memcmp(g1, g2, (B * T * D + 4 * C * D + 3 * C + D) * 4) != 0 ||
                    memcmp(y1, y2, B * T * D * 4) != 0)
                    fail_msg("%s %s impl %d: backward not the float32 bits", aft_dtype_name(dt),
                             aft_variant_name(vars[vi]), impl);
                free(g1);
                /* a stream, a few rows a step */
                if (!cfg.causal || impl) continue;
                aft_state *s1, *s2;
                assert_int_equal(aft_state_new(&s1, &p16, &cfg, B, &err), AFT_OK);
                assert_int_equal(aft_state_new(&s2, &p32, &cfg, B, &err), AFT_OK);
                float xs[B * 7 * D], o1[B * 7 * D], o2[B * 7 * D];
                for (size_t t0 = 0; t0 + 7 <= 70; t0 += 7) {
                    for (size_t bb = 0; bb < B; bb++) memcpy(xs + bb * 7 * D, x + (bb * T + t0) * D, 7 * D * 4);
                    assert_int_equal(aft_state_step(s1, o1, xs, 7, &err), AFT_OK);
                    assert_int_equal(aft_state_step(s2, o2, xs, 7, &err), AFT_OK);
                    assert_memory_equal(o1, o2, sizeof o1);
                }
                aft_state_free(s1);
                aft_state_free(s2);
            }
        for (int i = 0; i < 4; i++) free(w[i]), free(b[i]), free(h[i]);
    }
    free(x); free(dy); free(y1); free(y2);
}

static void test_layer_errors(void **state)
{
    (void)state;
    static float x[2 * 5 * 8], y[2 * 5 * 8], w[64 * 8], b[64], conv[4 * 5];
    rng r = {3100};
    for (size_t i = 0; i < N_OF(x); i++) x[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(w); i++) w[i] = (float)rng_sym(&r) * 0.3f;
    for (size_t i = 0; i < N_OF(b); i++) b[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(conv); i++) conv[i] = (float)rng_sym(&r);
    int bad = 0;
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        char what[128];
        aft_params p;
        memset(&p, 0, sizeof p);
        p.d_model = 8;
        p.d_hidden = 12;
        p.k_out = 4;
        p.wq = p.wk = p.wv = p.wo = w;
        p.bq = p.bk = p.bv = p.bo = b;
        p.bias.kind = AFT_BIAS_CONV;
        p.bias.conv = conv;
        aft_config cfg = make_cfg(AFT_CONV, 3, 4, 1);
        cfg.impl = impls[ii];
        aft_error err = {{0}};
        aft_status st = aft_layer_forward(y, x, &p, &cfg, 2, 5, &err);
        if (st != AFT_OK) {
            print_message("FAIL [%s] valid layer refused: %s\n", impl_name(impls[ii]), err.msg);
            bad++;
        }
        /* k_out = 5: neither d_hidden = 12 nor heads = 4 */
        aft_params p2 = p;
        p2.k_out = 5;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &cfg, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer k_out=5 C=12 heads=4", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "k_out;kc;key", (const size_t[]){5, 0});
        /* d_hidden = 14 does not split into 4 heads */
        p2 = p;
        p2.d_hidden = 14;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &cfg, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer d_hidden=14 heads=4", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "head;divis", (const size_t[]){14, 4, 0});
        /* a missing weight matrix */
        p2 = p;
        p2.wv = NULL;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &cfg, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer wv NULL", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "wv;null;missing;weight", NULL);
        /* dense bias too short for T through the layer */
        static float dense[4 * 4];
        p2 = p;
        p2.k_out = 12;
        p2.bias.kind = AFT_BIAS_DENSE;
        p2.bias.dense = dense;
        p2.bias.tmax = 4;
        aft_config full = make_cfg(AFT_FULL, 0, 0, 0);
        full.impl = impls[ii];
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &full, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer dense tmax=4 T=5", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "tmax", (const size_t[]){4, 5, 0});
        /* full needs k_out == d_hidden */
        p2.bias.tmax = 5;
        p2.k_out = 4;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &full, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer full k_out=4 C=12", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "k_out;kc;key", (const size_t[]){4, 0});
    }
    if (bad) fail_msg("%d layer argument-error checks failed", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_sequences),
        cmocka_unit_test(test_layer_products_split),
        cmocka_unit_test(test_layer),
        cmocka_unit_test(test_grid_layer),
        cmocka_unit_test(test_layer_errors),
        cmocka_unit_test(test_layer_16bit),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
