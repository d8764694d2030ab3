/*
 * test_local_conv.c - the band kernel (lib/ops/local_conv.c: AFT-local,
 * AFT-conv and causal AFT-simple) against the float64 reference in
 * ref_aft.c, for both cfg.impl = AFT_IMPL_FAST and AFT_IMPL_REFERENCE
 * (opcheck.h): local windows 0, 1, 3, T and T + 4 on every bias kind; conv
 * with 1 to 5 heads, keys per channel or per head; the causal rows split
 * over threads; a key of +inf or NaN handed to the per-channel kernels;
 * causality with a later NaN or infinite value.
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

static const size_t small_C[] = {5, 12};

/* local windows 0 (= simple), 1, 3, T (999), T + 4 (1000) on each bias kind */
static void test_op_local(void **state)
{
    (void)state;
    const size_t w[] = {0, 1, 3, 999, 1000};
    grid_full(AFT_LOCAL, AFT_BIAS_DENSE, w, N_OF(w), 400);
    grid_full(AFT_LOCAL, AFT_BIAS_FACTORED, w, N_OF(w), 500);
    grid_full(AFT_LOCAL, AFT_BIAS_SEEDED, w, N_OF(w), 600);
}

/* conv: heads 1, 2, 4 on C = 12 (and heads 1, 5 on C = 5), keys per channel
 * or per head, windows 1, 3, T, T + 4, causal, masks, B 1 and 3 */
static void test_op_conv(void **state)
{
    (void)state;
    const size_t heads12[] = {1, 2, 4}, heads5[] = {1, 5};
    int fails = 0, cases = 0, reports = 0;
    for (size_t ci = 0; ci < N_OF(small_C); ci++) {
        size_t C = small_C[ci];
        const size_t *hs = C == 12 ? heads12 : heads5;
        size_t nh = C == 12 ? N_OF(heads12) : N_OF(heads5);
        for (size_t hi = 0; hi < nh; hi++)
            for (int shared = 0; shared <= 1; shared++)
                for (size_t wi = 0; wi < 4; wi++)
                    for (int causal = 0; causal <= 1; causal++)
                        for (size_t ti = 0; ti < N_OF(small_T); ti++) {
                            size_t T = small_T[ti];
                            size_t s = wi == 0 ? 1 : wi == 1 ? 3 : wi == 2 ? T : T + 4;
                            /* the 6 (mask, B) pairs rotate through the cases;
                             * with T cycling every 4 each T meets each pair */
                            mask_mode mask = (mask_mode)(cases % 3);
                            size_t B = (cases / 3) % 2 ? 3 : 1;
                            op_case c = {AFT_CONV, AFT_BIAS_CONV, B, T, C, hs[hi], s, shared,
                                         causal, mask, VALS_NORMAL, 800 + (uint64_t)cases,
                                         grid_threads(cases)};
                            fails += op_run_case(&c, &reports);
                            cases++;
                        }
    }
    op_finish(fails, cases);
}

/* Causal local and causal simple split the rows over the threads; a thread
 * starts from the merged left sums of the threads before it. Windows 1, 17
 * and 300 (wider than some T), T from fewer rows than threads to 1001, one
 * to three threads, B and C alternating, every value mode in turn. */
static void test_op_causal_rows(void **state)
{
    (void)state;
    const size_t Ts[] = {5, 130, 1001};
    const size_t ws[] = {1, 17, 300};
    const aft_bias_kind kinds[] = {AFT_BIAS_DENSE, AFT_BIAS_SEEDED, AFT_BIAS_FACTORED};
    const int th[] = {1, 2, 3};
    int fails = 0, cases = 0, reports = 0;
    for (size_t ti = 0; ti < N_OF(Ts); ti++)
        for (size_t wi = 0; wi < N_OF(ws); wi++)
            for (size_t hi = 0; hi < N_OF(th); hi++) {
                size_t B = (cases & 1) ? 3 : 1, C = (cases & 2) ? 16 : 12;
                op_case c = {AFT_LOCAL, kinds[cases % 3], B, Ts[ti], C, 0, ws[wi], 0, 1, MASK_NONE,
                             (vals_mode)(cases % 4), 1500 + (uint64_t)cases, th[hi]};
                fails += op_run_case(&c, &reports);
                cases++;
            }
    for (size_t ti = 1; ti < N_OF(Ts); ti++)
        for (size_t hi = 1; hi < N_OF(th); hi++) {
            op_case c = {AFT_SIMPLE, AFT_BIAS_NONE, 2, Ts[ti], 16, 0, 0, 0, 1, MASK_NONE,
                         (vals_mode)(cases % 4), 1500 + (uint64_t)cases, th[hi]};
            fails += op_run_case(&c, &reports);
            cases++;
        }
    op_finish(fails, cases);
}

/* A key of +inf (simple) or NaN (causal local) makes the row-split paths
 * hand the call to the per-channel kernels: the channels and batches without
 * it still match the reference. */
static void test_op_rows_bad_key(void **state)
{
    (void)state;
    const size_t B = 2, T = 300, C = 8, n = B * T * C;
    const size_t bad_b = 1, bad_c = 2, bad_i = (bad_b * T + 150) * C + bad_c;
    const int th[] = {1, 2, 3};
    rng r = {77};
    float *q = xmalloc(n * sizeof *q), *k = xmalloc(n * sizeof *k), *v = xmalloc(n * sizeof *v),
          *y = xmalloc(n * sizeof *y);
    double *qd = xmalloc(n * sizeof *qd), *kd = xmalloc(n * sizeof *kd), *vd = xmalloc(n * sizeof *vd),
           *yd = xmalloc(n * sizeof *yd);
    double *rq = randd(&r, n, 2), *rk = randd(&r, n, 3), *rv = randd(&r, n, 1);
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)rq[i]; k[i] = (float)rk[i]; v[i] = (float)rv[i];
        qd[i] = q[i]; kd[i] = k[i]; vd[i] = v[i];
    }
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    for (int which = 0; which < 4; which++) {
        /* simple without causality with a +inf key; causal local with NaN,
         * with +inf; causal simple with +inf */
        k[bad_i] = which == 1 ? NAN : INFINITY;
        kd[bad_i] = k[bad_i];
        aft_config cfg = which == 0   ? make_cfg(AFT_SIMPLE, 0, 0, 0)
                         : which == 3 ? make_cfg(AFT_SIMPLE, 0, 0, 1)
                                      : make_cfg(AFT_LOCAL, 9, 0, 1);
        assert_int_equal(ref_aft_op_d(yd, qd, kd, vd, &bias, &cfg, B, T, C, C), 0);
        for (size_t hi = 0; hi < N_OF(th); hi++) {
            cfg.threads = th[hi];
            aft_error err = {{0}};
            assert_int_equal(aft_op_forward(y, q, k, v, &bias, &cfg, B, T, C, C, &err), AFT_OK);
            for (size_t i = 0; i < n; i++) {
                size_t b = i / (T * C), c = i % C;
                /* the bad key's channel too: NaN where the reference is
                 * NaN, else its value (a kernel that missed the key sums
                 * exp(+inf - stabiliser) into NaN or inf, or drops it) */
                int ok = isnan(yd[i]) ? isnan(y[i]) : fabs((double)y[i] - yd[i]) <= OP_TOL_REL;
                if (!ok)
                    fail_msg("%s%s threads=%d b=%zu t=%zu c=%zu: %.9g, reference %.9g", aft_variant_name(cfg.variant),
                             cfg.causal ? " causal" : "", th[hi], b, i / C % T, c, (double)y[i], yd[i]);
            }
        }
    }
    free(q); free(k); free(v); free(y); free(qd); free(kd); free(vd); free(yd);
    free(rq); free(rk); free(rv);
}

/* Causality with a value that is NaN or +inf: the fast kernels' rows
 * before it must not see it (0 * NaN is NaN), so they come out the same to
 * the bit as with that value 0, and the rows from it on, in its channel,
 * are NaN or infinite. Local (dense bias), conv (2 heads) and simple; rows
 * in groups and blocks of every phase; 1-3 threads. Then full, causal, and
 * full with a mask that hides the value's row from every query: the rows
 * that do not see it match within rounding (the dense kernel recomputes
 * them exactly). */
static void test_op_causal_later_value(void **state)
{
    (void)state;
    const size_t T = 300, C = 8, n = T * C, t_bad = 150, c_bad = 2;
    const float bads[] = {NAN, INFINITY};
    rng r = {91};
    float *q = randf(&r, n, 2), *k = randf(&r, n, 3), *v = randf(&r, n, 1), *w = randf(&r, T * T, 1),
          *u = randf(&r, 2 * 9, 1);
    float *y0 = xmalloc(n * sizeof *y0), *y1 = xmalloc(n * sizeof *y1);
    uint8_t *mask = xmalloc(T * T);
    for (size_t i = 0; i < T * T; i++) mask[i] = i % T != t_bad;
    for (int var = 0; var < 5; var++)
        for (size_t bi = 0; bi < N_OF(bads); bi++)
            for (int th = 1; th <= 3; th++) {
                aft_bias bias;
                memset(&bias, 0, sizeof bias);
                aft_config cfg;
                if (var == 0) {
                    cfg = make_cfg(AFT_LOCAL, 9, 0, 1);
                    bias.kind = AFT_BIAS_DENSE;
                    bias.dense = w;
                    bias.tmax = T;
                } else if (var == 1) {
                    cfg = make_cfg(AFT_CONV, 5, 2, 1);
                    bias.kind = AFT_BIAS_CONV;
                    bias.conv = u;
                } else if (var == 2) {
                    cfg = make_cfg(AFT_SIMPLE, 0, 0, 1);
                } else {   /* full: causal, or with the mask */
                    cfg = make_cfg(AFT_FULL, 0, 0, var == 3);
                    bias.kind = AFT_BIAS_DENSE;
                    bias.dense = w;
                    bias.tmax = T;
                    bias.mask = var == 4 ? mask : NULL;
                }
                cfg.impl = AFT_IMPL_FAST;
                cfg.threads = th;
                aft_error err = {{0}};
                v[t_bad * C + c_bad] = 0.0f;
                assert_int_equal(aft_op_forward(y0, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                v[t_bad * C + c_bad] = bads[bi];
                assert_int_equal(aft_op_forward(y1, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                for (size_t i = 0; i < n; i++) {
                    size_t t = i / C, c = i % C;
                    if (var == 4 || (var == 3 && t < t_bad)) {
                        if (!(fabsf(y1[i] - y0[i]) <= 1e-6f + 1e-5f * fabsf(y0[i])))
                            fail_msg("full%s, v = %g at t = %zu, threads %d: row %zu channel %zu is %.9g, %.9g "
                                     "without it", var == 3 ? " causal" : " masked", (double)bads[bi], t_bad, th, t,
                                     c, (double)y1[i], (double)y0[i]);
                        continue;
                    }
                    if (t < t_bad && memcmp(&y0[i], &y1[i], sizeof(float)) != 0)
                        fail_msg("%s, v = %g at t = %zu, threads %d: row %zu channel %zu is %.9g, %.9g without it",
                                 aft_variant_name(cfg.variant), (double)bads[bi], t_bad, th, t, c, (double)y1[i],
                                 (double)y0[i]);
                    if (t >= t_bad && c == c_bad && isfinite(y1[i]))
                        fail_msg("%s, v = %g at t = %zu: row %zu is finite (%.9g)", aft_variant_name(cfg.variant),
                                 (double)bads[bi], t_bad, t, (double)y1[i]);
                }
            }
    free(q); free(k); free(v); free(w); free(u); free(y0); free(y1); free(mask);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_local),
        cmocka_unit_test(test_op_conv),
        cmocka_unit_test(test_op_causal_rows),
        cmocka_unit_test(test_op_rows_bad_key),
        cmocka_unit_test(test_op_causal_later_value),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
