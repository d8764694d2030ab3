/*
 * test_full.c - AFT-full (lib/ops/full.c, which also runs every masked
 * call) against the float64 reference in ref_aft.c, for both cfg.impl =
 * AFT_IMPL_FAST and AFT_IMPL_REFERENCE (opcheck.h): dense, factored, seeded
 * and no bias over T x causal x mask x (B, C); the OpenBLAS products
 * (AFT_KERNEL_BLAS) beside the fused one; a bias whose row maxima rise
 * chunk by chunk; a bias holding NaN and infinities.
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

static void test_op_full_dense(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_DENSE, w, 1, 100);
}

static void test_op_full_factored(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_FACTORED, w, 1, 200);
}

static void test_op_full_seeded(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_SEEDED, w, 1, 300);
}

/* full with no bias at all (kind NONE: w = 0) */
static void test_op_full_no_bias(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_NONE, w, 1, 350);
}

/* With one head the dense kernel runs its own fused product on AVX-512
 * machines (the grids above take that path there); these cases run the
 * OpenBLAS path it replaces (AFT_KERNEL_BLAS), causal and not, which is
 * also what machines without AVX-512 and several heads use. */
static void test_op_full_blas(void **state)
{
    (void)state;
    g_full_product = AFT_KERNEL_BLAS;
    const aft_bias_kind kinds[] = {AFT_BIAS_DENSE, AFT_BIAS_FACTORED, AFT_BIAS_SEEDED};
    const size_t Ts[] = {7, 130, 600};
    int fails = 0, cases = 0, reports = 0;
    for (int causal = 0; causal <= 1; causal++)
        for (size_t ki = 0; ki < N_OF(kinds); ki++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++)
                for (int mask = MASK_NONE; mask <= MASK_BATCHED; mask++) {
                    op_case c = {AFT_FULL, kinds[ki], (cases & 1) ? 2 : 1, Ts[ti], (cases & 2) ? 16 : 12, 0, 0, 0,
                                 causal, (mask_mode)mask, (vals_mode)(cases % 4), 1600 + (uint64_t)cases,
                                 (cases & 1) ? 2 : 1};
                    fails += op_run_case(&c, &reports);
                    cases++;
                }
    g_full_product = AFT_KERNEL_AUTO;
    op_finish(fails, cases);
}

/* A bias whose row maxima rise with every 256-key chunk (once by 100 nats):
 * the fused product keeps a running maximum per row and brings the sums so
 * far down each time it rises, by factors from exp(-5) to below FLT_MIN;
 * each chunk still matters to the output at 1e-2 to 1e-9 relative, so a
 * factor missed or misapplied shows. Fused and OpenBLAS paths, causal and
 * not, lengths across one to five chunks, masks, B > 1. */
static void test_op_full_rising_bias(void **state)
{
    (void)state;
    const size_t Ts[] = {255, 257, 600, 1031};
    int fails = 0, cases = 0, reports = 0;
    for (int blas = 0; blas <= 1; blas++) {
        if (blas) g_full_product = AFT_KERNEL_BLAS;
        for (int causal = 0; causal <= 1; causal++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++) {
                mask_mode mask = ti == 2 ? MASK_SHARED : MASK_NONE;
                op_case c = {AFT_FULL, AFT_BIAS_DENSE, ti == 1 ? 2 : 1, Ts[ti], 16, 0, 0, 0, causal, mask,
                             VALS_RISING, 2100 + (uint64_t)cases, (cases & 1) ? 2 : 1};
                fails += op_run_case(&c, &reports);
                cases++;
            }
        g_full_product = AFT_KERNEL_AUTO;
    }
    op_finish(fails, cases);
}

/* Full with a bias holding NaN (either sign), +inf and -inf, against the
 * float64 reference: there a row that sees a NaN or +inf entry of w has a
 * NaN denominator and comes out 0, as a row that sees nothing does, and a
 * -inf entry only drops its key; aft must agree. The short exponential
 * aft takes for rows of w - r without NaN would turn a NaN with its sign
 * bit set (-nan) into 0 and drop it: the check before it keeps those rows
 * as the reference has them. Fused and OpenBLAS paths, causal and not, 1-2
 * threads; bad entries early, late (past the first 256-key chunk) and at
 * the diagonal, and a row with every kind. */
static void test_op_full_bad_bias(void **state)
{
    (void)state;
    const size_t T = 300, C = 8, n = T * C;
    rng r = {123};
    float *q = randf(&r, n, 2), *k = randf(&r, n, 3), *v = randf(&r, n, 1), *w = randf(&r, T * T, 2);
    float *y = xmalloc(n * sizeof *y);
    double *qd = xmalloc(n * sizeof *qd), *kd = xmalloc(n * sizeof *kd), *vd = xmalloc(n * sizeof *vd),
           *yd = xmalloc(n * sizeof *yd);
    for (size_t i = 0; i < n; i++) { qd[i] = q[i]; kd[i] = k[i]; vd[i] = v[i]; }
    /* (row, column, value) */
    const struct { size_t t, j; float x; } bad[] = {
        {5, 2, NAN}, {40, 270, NAN}, {77, 77, INFINITY}, {120, 3, INFINITY}, {200, 280, INFINITY},
        {150, 10, -INFINITY}, {151, 151, -INFINITY}, {260, 1, NAN}, {260, 2, INFINITY}, {260, 3, -INFINITY},
        {90, 30, -NAN}, {210, 290, -NAN},   /* the sign bit set: bits above every negative float's */
    };
    for (size_t i = 0; i < N_OF(bad); i++) w[bad[i].t * T + bad[i].j] = bad[i].x;
    aft_bias bias = dense_bias(w, T);
    for (int blas = 0; blas <= 1; blas++) {
        if (blas) g_full_product = AFT_KERNEL_BLAS;
        for (int causal = 0; causal <= 1; causal++) {
            aft_config cfg = make_cfg(AFT_FULL, 0, 0, causal);
            assert_int_equal(ref_aft_op_d(yd, qd, kd, vd, &bias, &cfg, 1, T, C, C), 0);
            for (int th = 1; th <= 2; th++) {
                cfg.impl = AFT_IMPL_FAST;
                cfg.threads = th;
                aft_error err = {{0}};
                assert_int_equal(aft_op_forward(y, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                for (size_t i = 0; i < n; i++) {
                    int ok = isnan(yd[i]) ? isnan(y[i]) : fabs((double)y[i] - yd[i]) <= OP_TOL_REL;
                    if (!ok)
                        fail_msg("full%s%s threads=%d t=%zu c=%zu: %.9g, reference %.9g", causal ? " causal" : "",
                                 blas ? " (OpenBLAS)" : "", th, i / C, i % C, (double)y[i], yd[i]);
                }
            }
        }
        g_full_product = AFT_KERNEL_AUTO;
    }
    free(q); free(k); free(v); free(w); free(y); free(qd); free(kd); free(vd); free(yd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_full_dense),
        cmocka_unit_test(test_op_full_factored),
        cmocka_unit_test(test_op_full_seeded),
        cmocka_unit_test(test_op_full_no_bias),
        cmocka_unit_test(test_op_full_blas),
        cmocka_unit_test(test_op_full_rising_bias),
        cmocka_unit_test(test_op_full_bad_bias),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
