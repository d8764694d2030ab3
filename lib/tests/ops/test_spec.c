/*
 * test_spec.c - the rules of a configuration (lib/ops/spec.c), through
 * aft_op_forward and aft_config_settle: a conv bias that records its shape
 * gives the window and heads, window 0 means simple, a window wider than the
 * sequence is the sequence; a grid's rules; and every refusal, each with a
 * one-line message naming the problem (shapes and options that do not fit,
 * sizes whose product overflows, and in the same function op.c's check of
 * NULL tensors).
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

/* The rules of aft_config_settle: a conv bias that records its shape gives
 * the window and heads (the same bits as saying them), a one-row bias
 * serves every head (as the same row repeated), conv with window 0 and no
 * bias is simple, and a window wider than the sequence is the sequence. */
static void test_op_settle_rules(void **state)
{
    (void)state;
    const size_t B = 2, T = 37, C = 12, H = 4, S = 3, L = 2 * S - 1, n = B * T * C;
    rng r = {777};
    float *q = randf(&r, n, 2), *k = randf(&r, n, 3), *v = randf(&r, n, 1), *conv = randf(&r, H * L, 1);
    float *wide = xmalloc(H * L * sizeof *wide), *y0 = xmalloc(n * sizeof *y0), *y1 = xmalloc(n * sizeof *y1);
    for (size_t h = 0; h < H; h++) memcpy(wide + h * L, conv, L * sizeof *conv);
    aft_error err = {{0}};
    for (int causal = 0; causal <= 1; causal++) {
        aft_config said = make_cfg(AFT_CONV, S, H, causal), from = make_cfg(AFT_CONV, AFT_WINDOW_FROM_BIAS, 0, causal);
        said.impl = from.impl = AFT_IMPL_FAST;
        aft_bias legacy = {.kind = AFT_BIAS_CONV, .conv = conv};
        aft_bias shaped = {.kind = AFT_BIAS_CONV, .conv = conv, .conv_len = L, .conv_rows = H};
        assert_int_equal(aft_op_forward(y0, q, k, v, &legacy, &said, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &shaped, &from, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        aft_config settled = from;
        assert_int_equal(aft_config_settle(&settled, &shaped, C, C, &err), AFT_OK);
        assert_int_equal(settled.window, S);
        assert_int_equal(settled.heads, H);
        assert_true(settled.threads >= 1);
        /* one row for every head */
        aft_bias one = {.kind = AFT_BIAS_CONV, .conv = conv, .conv_len = L, .conv_rows = 1};
        aft_bias rows = {.kind = AFT_BIAS_CONV, .conv = wide, .conv_len = L, .conv_rows = H};
        aft_config four = make_cfg(AFT_CONV, AFT_WINDOW_FROM_BIAS, H, causal);
        four.impl = AFT_IMPL_FAST;
        assert_int_equal(aft_op_forward(y0, q, k, v, &one, &four, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &rows, &four, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        /* conv, window 0, no bias: simple */
        aft_bias none = {.kind = AFT_BIAS_NONE};
        aft_config c0 = make_cfg(AFT_CONV, 0, H, causal), simple = make_cfg(AFT_SIMPLE, 0, 0, causal);
        c0.impl = simple.impl = AFT_IMPL_FAST;
        assert_int_equal(aft_op_forward(y0, q, k, v, &none, &c0, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &none, &simple, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        settled = c0;
        assert_int_equal(aft_config_settle(&settled, &none, C, C, &err), AFT_OK);
        assert_int_equal(settled.variant, AFT_SIMPLE);
        /* a window wider than the sequence */
        aft_bias seeded = {.kind = AFT_BIAS_SEEDED, .seed = 5, .scale = 0.5f};
        aft_config wide_w = make_cfg(AFT_LOCAL, 1000, 0, causal), all_w = make_cfg(AFT_LOCAL, T, 0, causal);
        wide_w.impl = all_w.impl = AFT_IMPL_FAST;
        assert_int_equal(aft_op_forward(y0, q, k, v, &seeded, &wide_w, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &seeded, &all_w, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        assert_int_equal(aft_window_in(1000, T), T);
        assert_int_equal(aft_window_in(3, T), 3);
    }
    free(q); free(k); free(v); free(conv); free(wide); free(y0); free(y1);
}

/* a small valid problem to break one field at a time */
typedef struct {
    float q[3 * 9 * 14], k[3 * 9 * 14], v[3 * 9 * 14], out[3 * 9 * 14];
    float dense[9 * 9], u[9 * 2], fv[9 * 2], conv[4 * 5];
} err_bufs;

/* part 0: shapes and options that do not fit; part 1: NULL tensors and a
 * size product that overflows, kept apart because a library that misses
 * them crashes the test program */
static void op_errors(int part)
{
    static err_bufs eb;
    rng r = {3000};
    for (size_t i = 0; i < N_OF(eb.q); i++) {
        eb.q[i] = (float)rng_sym(&r);
        eb.k[i] = (float)rng_sym(&r);
        eb.v[i] = (float)rng_sym(&r);
    }
    for (size_t i = 0; i < N_OF(eb.dense); i++) eb.dense[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(eb.u); i++) eb.u[i] = eb.fv[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(eb.conv); i++) eb.conv[i] = (float)rng_sym(&r);
    int bad = 0;
    aft_error err;
    aft_status st;
    aft_bias bias;
    aft_config cfg;

#define RESET(var, kind_)                                \
    do {                                                 \
        memset(&bias, 0, sizeof bias);                   \
        bias.kind = (kind_);                             \
        cfg = make_cfg((var), 0, 0, 0);                  \
        cfg.impl = impl;                                 \
        memset(&err, 0, sizeof err);                     \
    } while (0)

    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        aft_impl impl = impls[ii];
        char what[128];
#define WHAT(s) (snprintf(what, sizeof what, "[%s] %s", impl_name(impl), (s)), what)

        if (part == 1) goto null_and_overflow;
        /* sanity: the unbroken problems are accepted */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 3, 9, 12, 4, &err);
        if (st != AFT_OK) {
            print_message("FAIL [%s] valid conv problem refused: %s\n", impl_name(impl), err.msg);
            bad++;
        }
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 3, 9, 14, 14, &err);
        if (st != AFT_OK) {
            print_message("FAIL [%s] valid dense problem refused: %s\n", impl_name(impl), err.msg);
            bad++;
        }

        /* conv: C = 14 does not split into 4 heads */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 14, 14, &err);
        bad += !check_error(WHAT("conv C=14 heads=4"), st, &err, "head;divis",
                            (const size_t[]){14, 4, 0});
        /* conv: heads that disagree with a bias of 4 rows */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        bias.conv_len = 5;
        bias.conv_rows = 4;
        cfg.heads = 3;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv heads=3, bias rows=4"), st, &err, "head;rows", (const size_t[]){3, 4, 0});
        /* conv: a window that disagrees with a bias of 2S-1 = 5 columns */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        bias.conv_len = 5;
        bias.conv_rows = 4;
        cfg.heads = 4;
        cfg.window = 2;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv window=2, bias window 3"), st, &err, "window", (const size_t[]){2, 3, 0});
        /* conv: kc = 5 is neither C = 12 nor heads = 4 */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 5, &err);
        bad += !check_error(WHAT("conv kc=5 C=12 heads=4"), st, &err, "kc;key",
                            (const size_t[]){5, 0});
        /* full: kc = 3 != C = 12 (only conv shares keys) */
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 3, &err);
        bad += !check_error(WHAT("full kc=3 C=12"), st, &err, "kc;key", (const size_t[]){3, 0});
        /* dense bias covering T = 7 < 9 */
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 7;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("dense tmax=7 T=9"), st, &err, "tmax", (const size_t[]){7, 9, 0});
        /* the same through local */
        RESET(AFT_LOCAL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 7;
        cfg.window = 2;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("local dense tmax=7 T=9"), st, &err, "tmax", (const size_t[]){7, 9, 0});
        /* factored bias covering T = 8 < 9 */
        RESET(AFT_FULL, AFT_BIAS_FACTORED);
        bias.u = eb.u;
        bias.v = eb.fv;
        bias.rank = 2;
        bias.tmax = 8;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("factored tmax=8 T=9"), st, &err, "tmax", (const size_t[]){8, 9, 0});
        /* dense kind without the dense array */
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("dense bias NULL"), st, &err, "dense;null;missing", NULL);
        /* factored kind without u */
        RESET(AFT_FULL, AFT_BIAS_FACTORED);
        bias.v = eb.fv;
        bias.rank = 2;
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("factored u NULL"), st, &err, "factor;null;missing", NULL);
        /* conv with bias kind none: the header reads AFT_BIAS_NONE as "w = 0
         * (a zero bias)", so either refuse it naming conv, or compute conv
         * with an all-zero conv bias; anything else is wrong */
        RESET(AFT_CONV, AFT_BIAS_NONE);
        cfg.heads = 4;
        cfg.window = 3;
        for (size_t i = 0; i < 9 * 12; i++) eb.out[i] = NAN;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        if (st == AFT_OK) {
            static const float zeros[4 * 5];
            aft_bias zb = bias;
            zb.kind = AFT_BIAS_CONV;
            zb.conv = zeros;
            double ref[9 * 12], e = 0;
            assert_int_equal(ref_aft_op(ref, eb.q, eb.k, eb.v, &zb, &cfg, 1, 9, 12, 12), 0);
            for (size_t i = 0; i < 9 * 12; i++) {
                double di = fabs((double)eb.out[i] - ref[i]);
                if (!(di <= e)) e = di;
            }
            if (!(e <= OP_TOL_REL)) {
                print_message("FAIL [%s] conv with bias kind none accepted but differs from a "
                              "zero conv bias by %.3g\n", impl_name(impl), e);
                bad++;
            }
        } else {
            bad += !check_error(WHAT("conv with bias kind none"), st, &err, "conv", NULL);
        }
        /* kind conv but no conv array: the message should say it is missing */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv bias NULL"), st, &err, "null;missing;without;needs;no conv;no data",
                            NULL);
        /* conv window 0 against a bias that holds window 3 */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        bias.conv_len = 5;
        bias.conv_rows = 4;
        cfg.heads = 4;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv window=0, bias window 3"), st, &err, "window", NULL);
        /* conv window 0 is simple, which needs one key channel per value channel */
        RESET(AFT_CONV, AFT_BIAS_NONE);
        cfg.heads = 4;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 4, &err);
        bad += !check_error(WHAT("conv window=0, kc = heads"), st, &err, "simple;key", (const size_t[]){4, 12, 0});
        /* a window from the bias without a conv bias */
        RESET(AFT_CONV, AFT_BIAS_NONE);
        cfg.window = AFT_WINDOW_FROM_BIAS;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv window from no bias"), st, &err, "window;bias", NULL);
        /* a variant that does not exist */
        RESET((aft_variant)17, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("variant 17"), st, &err, "variant", (const size_t[]){17, 0});
        /* a bias kind that does not exist */
        RESET(AFT_FULL, (aft_bias_kind)42);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("bias kind 42"), st, &err, "kind;bias", (const size_t[]){42, 0});
        /* err may be NULL: still a non-OK status, no crash */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 5;
        cfg.window = 3;
        if (aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, NULL) == AFT_OK) {
            print_message("FAIL [%s] conv heads=5 C=12 accepted with err = NULL\n", impl_name(impl));
            bad++;
        }
        continue;

    null_and_overflow:
        /* missing tensors */
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, NULL, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("q NULL"), st, &err, "null;missing;q", NULL);
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(NULL, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("out NULL"), st, &err, "null;missing;out", NULL);
        /* B * T * C overflows size_t: must be refused before any access */
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, SIZE_MAX / 4, 9, 12, 12, &err);
        bad += !check_error(WHAT("B*T*C overflow"), st, &err, "overflow;too large;large;size", NULL);
        /* no configuration at all */
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, NULL, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("cfg NULL"), st, &err, "null;missing;config;cfg", NULL);
#undef WHAT
    }
#undef RESET
    if (bad) fail_msg("%d argument-error checks failed", bad);
}

static void test_op_errors(void **state)
{
    (void)state;
    op_errors(0);
}

static void test_op_errors_null_overflow(void **state)
{
    (void)state;
    op_errors(1);
}

/* refused with a one-line message naming one of words (';'-separated) */
static int refused(const char *what, aft_status st, const aft_error *err, const char *words)
{
    if (st == AFT_OK) {
        print_message("FAIL %s: accepted\n", what);
        return 0;
    }
    if (!err->msg[0] || strchr(err->msg, '\n')) {
        print_message("FAIL %s: message empty or more than a line: \"%s\"\n", what, err->msg);
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", words);
    for (char *save = NULL, *w = strtok_r(buf, ";", &save); w; w = strtok_r(NULL, ";", &save))
        if (contains_ci(err->msg, w)) return 1;
    print_message("FAIL %s: message does not name the problem (%s): \"%s\"\n", what, words, err->msg);
    return 0;
}

static void test_grid_errors(void **state)
{
    (void)state;
    static float q[2 * 12 * 8], k[2 * 12 * 8], v[2 * 12 * 8], out[2 * 12 * 8], sq[2 * 25], line[2 * 5],
        dense[12 * 12];
    const size_t H = 3, W = 4, T = 12, C = 8;
    aft_bias cb = {0};
    cb.kind = AFT_BIAS_CONV;
    cb.conv = sq;
    cb.conv_2d = 1;
    cb.conv_len = 5;
    cb.conv_rows = 2;
    cb.name = "pos_bias";
    aft_config cfg = {0};
    cfg.variant = AFT_CONV;
    cfg.window = AFT_WINDOW_FROM_BIAS;
    cfg.grid_h = H;
    cfg.grid_w = W;
    cfg.threads = 1;
    aft_error err = {{0}};
    int bad = 0;
    bad += aft_op_forward(out, q, k, v, &cb, &cfg, 2, T, C, 2, &err) != AFT_OK;
    if (bad) print_message("FAIL a valid grid conv was refused: %s\n", err.msg);
    aft_config c2 = cfg;
    c2.grid_w = 0;
    bad += !refused("grid 3 x 0", aft_op_forward(out, q, k, v, &cb, &c2, 2, T, C, 2, &err), &err, "grid");
    c2 = cfg;
    bad += !refused("T != H W", aft_op_forward(out, q, k, v, &cb, &c2, 2, 11, C, 2, &err), &err, "grid;T = 11");
    c2 = cfg;
    c2.grid_h = SIZE_MAX / 2;
    bad += !refused("grid overflow", aft_op_forward(out, q, k, v, &cb, &c2, 2, T, C, 2, &err), &err, "overflow");
    c2 = cfg;
    c2.grid_h = c2.grid_w = 0;
    bad += !refused("2-D bias without a grid", aft_op_forward(out, q, k, v, &cb, &c2, 2, T, C, 2, &err), &err,
                    "grid");
    aft_bias b1 = cb;
    b1.conv = line;
    b1.conv_2d = 0;
    bad += !refused("1-D bias on a grid", aft_op_forward(out, q, k, v, &b1, &cfg, 2, T, C, 2, &err), &err, "2-D");
    aft_bias b2 = cb;
    b2.conv_len = 4;
    bad += !refused("even square", aft_op_forward(out, q, k, v, &b2, &cfg, 2, T, C, 2, &err), &err,
                    "2*window-1");
    c2 = cfg;
    c2.window = 2;
    bad += !refused("window 2 vs a bias of 3", aft_op_forward(out, q, k, v, &cb, &c2, 2, T, C, 2, &err), &err,
                    "window");
    aft_bias db = {0};
    db.kind = AFT_BIAS_DENSE;
    db.dense = dense;
    db.tmax = 11;
    aft_config lc = cfg;
    lc.variant = AFT_LOCAL;
    lc.window = 2;
    bad += !refused("dense Tmax < H W", aft_op_forward(out, q, k, v, &db, &lc, 2, T, C, C, &err), &err, "tmax");
    aft_bias none = {0};
    aft_config cc = cfg;
    cc.window = 2;
    cc.heads = 2;
    bad += !refused("conv without a bias", aft_op_forward(out, q, k, v, &none, &cc, 2, T, C, C, &err), &err,
                    "2*window-1, 2*window-1");

    /* the streaming state runs sequences only */
    aft_state *s = NULL;
    aft_config sc = cfg;
    sc.causal = 1;
    bad += !refused("state on a grid", aft_state_new_op(&s, &cb, &sc, 1, C, 2, &err), &err, "grid");
    assert_null(s);
    static float wts[8 * 8 * 4];
    aft_params p = {0};
    p.d_model = 8;
    p.d_hidden = 8;
    p.k_out = 2;
    p.wq = p.wk = p.wv = p.wo = wts;
    p.bias = cb;
    bad += !refused("layer state on a grid", aft_state_new(&s, &p, &sc, 1, &err), &err, "grid");
    assert_null(s);
    /* the layer passes the grid's rules on */
    static float x[12 * 8], y[12 * 8];
    bad += !refused("layer T != H W", aft_layer_forward(y, x, &p, &cfg, 1, 11, &err), &err, "grid");
    if (bad) fail_msg("%d checks of the grid's rules failed", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_settle_rules),
        cmocka_unit_test(test_op_errors),
        cmocka_unit_test(test_op_errors_null_overflow),
        cmocka_unit_test(test_grid_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
