/*
 * test_op.c - the operator's entry points (lib/ops/op.c): aft_op_forward
 * and aft_op_backward, which settle a configuration (spec.c, whose rules
 * and refusals test_spec.c tests), check the tensors and pick the kernel.
 *  - What aft_op_backward refuses, with a message naming the problem; empty
 *    sizes write the (zero) gradients asked for.
 *  - Tables that run every variant and bias kind through the same entry
 *    point, forward (opcheck.h: against the float64 reference in
 *    ref_aft.c, fast and reference impls) and backward (gradcheck.h: the
 *    fast kernels against the float64 reference impl): large T across
 *    block edges, keys of +-500 with biases of +-250, one huge key,
 *    adversarial keys, thread counts, keys that are not finite.
 * Each kernel's own cases are in the test of its file (test_full.c,
 * test_local_conv.c, test_simple.c, test_grid.c and their *_grad.c).
 *
 * The extreme-value inputs (keys up to +-500, biases up to +-250) are put on a
 * grid of 2^-8 (2^-4 for factored u, v) so that K + w is exact even in float:
 * a correct float32 kernel then loses nothing before exp, and any failure
 * there is the algorithm's (overflow, underflow, a wrong maximum), not the
 * inputs' rounding. The seeded bias cannot be put on the grid; its sums round
 * to ~3e-5 at |K + w| ~ 750, which the tolerance still covers in practice.
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
#include "gradcheck.h"
#include "opcheck.h"
#include "ref_aft.h"
#include "rng.h"

/* ---------------------------------------------------------------- the backward's refusals */

/* refusals name what is wrong; empty sizes write the (zero) gradients whole
 * (the layer's: test_layer_grad.c) */
static void test_grad_errors(void **state)
{
    (void)state;
    const size_t B = 1, T = 5, C = 4, n = B * T * C;
    float q[20], k[20], v[20], dout[20], dq[20], dk[20], dv[20], dense[36], ddense[36];
    for (size_t i = 0; i < n; i++) q[i] = k[i] = v[i] = dout[i] = 0.1f * (float)i;
    for (size_t i = 0; i < 36; i++) dense[i] = 0.0f;
    aft_bias bias = {.kind = AFT_BIAS_DENSE, .dense = dense, .tmax = 6};
    aft_config cfg = {0};
    cfg.variant = AFT_FULL;
    aft_error err = {{0}};
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        cfg.impl = impls[ii];
        assert_int_equal(aft_op_backward(NULL, dk, dv, NULL, NULL, dout, q, k, v, &bias, &cfg, B, T, C, C, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "dq"));
        assert_int_equal(aft_op_backward(dq, dk, dv, NULL, NULL, NULL, q, k, v, &bias, &cfg, B, T, C, C, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "dout"));
        /* the forward's rules: a dense bias smaller than T */
        bias.tmax = 4;
        assert_int_equal(aft_op_backward(dq, dk, dv, NULL, NULL, dout, q, k, v, &bias, &cfg, B, T, C, C, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "Tmax"));
        bias.tmax = 6;
        /* conv: 4 heads do not divide 6 channels */
        aft_bias cb = {.kind = AFT_BIAS_CONV, .conv = dense};
        aft_config cc = cfg;
        cc.variant = AFT_CONV;
        cc.heads = 4;
        cc.window = 2;
        assert_int_equal(aft_op_backward(dq, dk, dv, NULL, NULL, dout, q, k, v, &cb, &cc, 1, 2, 6, 6, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "heads"));
        /* T = 0: nothing to do, but the bias gradient asked for is written (0) */
        for (size_t i = 0; i < 36; i++) ddense[i] = NAN;
        aft_bias_grad db = {.dense = ddense};
        assert_int_equal(aft_op_backward(dq, dk, dv, &db, NULL, dout, q, k, v, &bias, &cfg, B, 0, C, C, &err), AFT_OK);
        for (size_t i = 0; i < 36; i++) assert_true(ddense[i] == 0.0f);
    }
}

/* ---------------------------------------------------------------- every variant: forward */

/* Large T (1000..2000, C = 16) so blocked or tiled kernels cross many block
 * edges; T is prime or odd so no block size divides it. Full and local each
 * run causal and not; one full case carries a mask. */
static void test_op_large(void **state)
{
    (void)state;
    const op_case cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1531, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 901, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 1, 1103, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 902, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1009, 16, 0, 0, 0, 0, MASK_SHARED, VALS_NORMAL, 903, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1999, 16, 0, 37, 0, 1, MASK_NONE, VALS_NORMAL, 904, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 1201, 16, 0, 129, 0, 0, MASK_NONE, VALS_NORMAL, 905, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1103, 16, 4, 50, 1, 1, MASK_NONE, VALS_NORMAL, 906, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 1777, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 907, 0},
    };
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) fails += op_run_case(&cs[i], &reports);
    op_finish(fails, (int)N_OF(cs));
}

/* every variant once, for the extreme-value tests */
static void grid_extreme(vals_mode vals, uint64_t seed)
{
    struct { aft_variant v; aft_bias_kind k; size_t heads, window; int shared; } vs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0},    {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0},   {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 9, 0}, {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 20, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},   {AFT_CONV, AFT_BIAS_CONV, 2, 5, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 40, 1},    {AFT_CONV, AFT_BIAS_CONV, 1, 2, 1},
    };
    const size_t Ts[] = {33, 130};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(vs); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++) {
                /* the second size also runs with a batched mask */
                mask_mode mask = ti == 1 ? MASK_BATCHED : MASK_NONE;
                op_case c = {vs[i].v, vs[i].k, 2, Ts[ti], 12, vs[i].heads, vs[i].window,
                             vs[i].shared, causal, mask, vals, seed + (uint64_t)cases,
                             grid_threads(cases)};
                fails += op_run_case(&c, &reports);
                cases++;
            }
    /* and once at a large T, where blocked kernels take over */
    const op_case big[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1031, 16, 0, 0, 0, 1, MASK_NONE, vals, seed + 500, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1013, 16, 0, 0, 0, 0, MASK_NONE, vals, seed + 501, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1021, 16, 0, 300, 0, vals != VALS_WIDE, MASK_NONE, vals,
         seed + 502, 0},
    };
    for (size_t i = 0; i < N_OF(big); i++, cases++) fails += op_run_case(&big[i], &reports);
    op_finish(fails, cases);
}

static void test_op_extreme_wide(void **state)
{
    (void)state;
    grid_extreme(VALS_WIDE, 1000);
}

static void test_op_extreme_one_huge_key(void **state)
{
    (void)state;
    grid_extreme(VALS_ONE_HUGE, 1100);
}

static void test_op_extreme_adversarial(void **state)
{
    (void)state;
    grid_extreme(VALS_ADVERSE, 1200);
}

/* The outputs with cfg.threads = 1, 2 and 0 agree to 1e-6 relative. */
static void test_op_threads(void **state)
{
    (void)state;
    const op_case cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 2, 613, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 1301, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 3, 257, 12, 0, 0, 0, 0, MASK_BATCHED, VALS_NORMAL, 1302, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 2, 701, 16, 0, 45, 0, 0, MASK_NONE, VALS_NORMAL, 1303, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 509, 16, 0, 0, 0, 1, MASK_SHARED, VALS_NORMAL, 1304, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 3, 1000, 16, 0, 0, 0, 0, MASK_NONE, VALS_WIDE, 1306, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 401, 16, 4, 33, 1, 0, MASK_NONE, VALS_NORMAL, 1305, 0},
    };
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    int fails = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        case_data d;
        build_case(&d, &cs[i]);
        size_t n = cs[i].B * cs[i].T * cs[i].C;
        float *o1 = xmalloc(n * sizeof *o1), *o2 = xmalloc(n * sizeof *o2);
        for (size_t ii = 0; ii < N_OF(impls); ii++) {
            const int threads[] = {2, 0};
            aft_config cfg = d.cfg;
            cfg.impl = impls[ii];
            cfg.threads = 1;
            aft_error err = {{0}};
            assert_int_equal(aft_op_forward(o1, d.q, d.k, d.v, &d.bias, &cfg, cs[i].B, cs[i].T,
                                            cs[i].C, d.kc, &err), AFT_OK);
            double m = 1.0;
            for (size_t j = 0; j < n; j++)
                if (fabs(o1[j]) > m) m = fabs(o1[j]);
            for (size_t th = 0; th < N_OF(threads); th++) {
                cfg.threads = threads[th];
                assert_int_equal(aft_op_forward(o2, d.q, d.k, d.v, &d.bias, &cfg, cs[i].B,
                                                cs[i].T, cs[i].C, d.kc, &err), AFT_OK);
                double e = 0;
                for (size_t j = 0; j < n; j++) {
                    double dj = fabs((double)o1[j] - (double)o2[j]);
                    if (!(dj <= e)) e = dj;
                }
                if (!(e <= OP_THREAD_TOL * m)) {
                    char what[512];
                    op_describe(what, sizeof what, &cs[i], d.kc);
                    print_message("FAIL [%s] threads=1 vs threads=%d differ by %.3g (max|out| %.3g): %s\n",
                                  impl_name(impls[ii]), threads[th], e, m, what);
                    fails++;
                }
            }
        }
        free(o1);
        free(o2);
        free_case(&d);
    }
    if (fails) fail_msg("%d thread comparisons failed", fails);
}

/* ---------------------------------------------------------------- every variant: backward */

/* threads 1 to 4 (and all cores) give the same gradients, to 1e-5 */
static void test_grad_threads(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 2, 301, 12, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 61, 1, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 257, 12, 0, 0, 0, 0, MASK_SHARED, VALS_NORMAL, 62, 1, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 301, 12, 0, 7, 0, 0, MASK_NONE, VALS_NORMAL, 63, 1, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 1, 301, 12, 0, 40, 0, 1, MASK_NONE, VALS_WIDE, 64, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 257, 12, 3, 9, 1, 1, MASK_NONE, VALS_NORMAL, 65, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 199, 12, 2, 120, 0, 0, MASK_NONE, VALS_ADVERSE, 66, 1, 1},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 301, 12, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 67, 1, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 301, 12, 0, 0, 0, 1, MASK_NONE, VALS_WIDE, 68, 1, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 5, 12, 0, 3, 0, 0, MASK_NONE, VALS_NORMAL, 69, 1, 0},
    };
    const int threads[] = {2, 3, 4, 0};
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        gdata d;
        grad_build(&d, &cs[i]);
        grads g1;
        aft_error err = {{0}};
        assert_int_equal(run_backward(&g1, &d, AFT_IMPL_FAST, 1, &err), AFT_OK);
        for (size_t ti = 0; ti < N_OF(threads); ti++) {
            gcase c = cs[i];
            c.threads = threads[ti];
            char what[512];
            grad_describe(what, sizeof what, &c);
            grads gn;
            assert_int_equal(run_backward(&gn, &d, AFT_IMPL_FAST, threads[ti], &err), AFT_OK);
            fails += compare_grads(&gn, &g1, &d, GRAD_THREAD_TOL, what, &reports);
            grads_free(&gn);
        }
        grads_free(&g1);
        grad_free_data(&d);
    }
    grad_finish(fails, (int)N_OF(cs));
}

/* A key of +inf or NaN (only non-finite inputs make one): every kernel
 * returns AFT_OK and stays inside its arrays (the sanitizer build checks
 * that). Which gradients come out NaN is not specified: the reference
 * drops the rows whose denominator is NaN, the fast kernels let the NaN
 * reach more of the key's channel (and every dw those rows touch). */
static void test_grad_nonfinite_keys(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 40, 5, 0, 3, 0, 1, MASK_NONE, VALS_NORMAL, 71, 0, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 70, 5, 0, 4, 0, 0, MASK_NONE, VALS_NORMAL, 72, 0, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 1, 40, 5, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 73, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 200, 5, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 74, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 200, 5, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 75, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 40, 6, 2, 3, 0, 0, MASK_SHARED, VALS_NORMAL, 76, 0, 0},
    };
    for (size_t i = 0; i < N_OF(cs); i++)
        for (int kind = 0; kind < 2; kind++) {
            gdata d;
            grad_build(&d, &cs[i]);
            d.k[(cs[i].T / 2) * d.kc + 1] = kind ? NAN : INFINITY;
            grads gf, gr;
            aft_error err = {{0}};
            assert_int_equal(run_backward(&gr, &d, AFT_IMPL_REFERENCE, 1, &err), AFT_OK);
            assert_int_equal(run_backward(&gf, &d, AFT_IMPL_FAST, cs[i].threads, &err), AFT_OK);
            grads_free(&gf);
            grads_free(&gr);
            grad_free_data(&d);
        }
}

/* Large T (C = 16) so every blocked kernel crosses many block edges; odd
 * or prime T so no block size divides it */
static void test_grad_large(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1531, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 901, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 1, 1103, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 902, 0, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1009, 16, 0, 0, 0, 0, MASK_SHARED, VALS_NORMAL, 903, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1999, 16, 0, 37, 0, 1, MASK_NONE, VALS_NORMAL, 904, 0, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 2, 1201, 16, 0, 129, 0, 0, MASK_NONE, VALS_NORMAL, 905, 3, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 1, 1301, 16, 0, 70, 0, 0, MASK_NONE, VALS_NORMAL, 906, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1103, 16, 4, 50, 1, 1, MASK_NONE, VALS_NORMAL, 907, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1013, 16, 2, 90, 0, 0, MASK_NONE, VALS_NORMAL, 908, 4, 1},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 1777, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 909, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 1501, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 910, 3, 0},
    };
    grad_run_table(cs, N_OF(cs));
}

/* every variant with keys of +-500 and biases of +-250 */
static void grad_grid_extreme(vals_mode vals, uint64_t seed)
{
    struct { aft_variant v; aft_bias_kind k; size_t heads, window; int shared, one_row; } vs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0, 0},     {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0, 0},    {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 9, 0, 0}, {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 20, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0, 0},    {AFT_CONV, AFT_BIAS_CONV, 2, 5, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 40, 1, 0},     {AFT_CONV, AFT_BIAS_CONV, 1, 2, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 3, 4, 0, 1},
    };
    const size_t Ts[] = {33, 130};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(vs); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++) {
                mask_mode mask = ti == 1 ? MASK_BATCHED : MASK_NONE;
                size_t C = vs[i].heads == 3 ? 9 : 12;
                gcase c = {vs[i].v, vs[i].k, 2, Ts[ti], C, vs[i].heads, vs[i].window, vs[i].shared, causal, mask,
                           vals, seed + (uint64_t)cases, grid_threads(cases), vs[i].one_row};
                fails += grad_run_case(&c, &reports);
                /* the band kernels (no mask) at the second size too */
                if (mask != MASK_NONE && vs[i].v != AFT_FULL) {
                    c.mask = MASK_NONE;
                    c.seed += 7;
                    fails += grad_run_case(&c, &reports);
                }
                cases++;
            }
    const gcase big[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1031, 16, 0, 0, 0, 1, MASK_NONE, vals, seed + 500, 0, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1013, 16, 0, 0, 0, 0, MASK_NONE, vals, seed + 501, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1021, 16, 0, 300, 0, vals != VALS_WIDE, MASK_NONE, vals, seed + 502, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1021, 16, 2, 61, 0, 1, MASK_NONE, vals, seed + 503, 0, 0},
    };
    for (size_t i = 0; i < N_OF(big); i++, cases++) fails += grad_run_case(&big[i], &reports);
    grad_finish(fails, cases);
}

static void test_grad_extreme_wide(void **state)
{
    (void)state;
    grad_grid_extreme(VALS_WIDE, 1000);
}

static void test_grad_extreme_one_huge_key(void **state)
{
    (void)state;
    grad_grid_extreme(VALS_ONE_HUGE, 1100);
}

static void test_grad_extreme_adversarial(void **state)
{
    (void)state;
    grad_grid_extreme(VALS_ADVERSE, 1200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* the backward's refusals */
        cmocka_unit_test(test_grad_errors),
        /* every variant through the entry points: forward */
        cmocka_unit_test(test_op_large),
        cmocka_unit_test(test_op_extreme_wide),
        cmocka_unit_test(test_op_extreme_one_huge_key),
        cmocka_unit_test(test_op_extreme_adversarial),
        cmocka_unit_test(test_op_threads),
        /* and backward */
        cmocka_unit_test(test_grad_threads),
        cmocka_unit_test(test_grad_nonfinite_keys),
        cmocka_unit_test(test_grad_large),
        cmocka_unit_test(test_grad_extreme_wide),
        cmocka_unit_test(test_grad_extreme_one_huge_key),
        cmocka_unit_test(test_grad_extreme_adversarial),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
