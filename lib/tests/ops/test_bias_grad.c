/*
 * test_bias_grad.c - the position biases' gradients (lib/ops/bias_grad.c):
 * asked for with zero_outside, a dense bias gradient is written only where
 * a run reaches (local's band, full's block) and comes out with the bits
 * of a run that clears it all.
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
#include "ref_aft.h"
#include "rng.h"

/* zero_outside: a dense gradient with garbage (NaN) in every entry the run
 * may write comes out with the same bits as a run that clears all of it.
 * The entries outside hold a mark the run cannot write, standing for the
 * caller's zeros: each must keep it or be cleared to 0 (clearing more than
 * is written is allowed), and take no other value. Local's band on and off
 * the diagonal's edges, with and without causality, and full's block:
 * without causality its first sequence sets the entries (one sequence or
 * more, one group or two, one block of rows or two), with causality they
 * are cleared and added to; tmax > T, so rows are tmax apart. */
static void test_grad_zero_outside(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 37, 16, 0, 5, 0, 1, MASK_NONE, VALS_NORMAL, 91, 2, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 37, 16, 0, 5, 0, 0, MASK_NONE, VALS_NORMAL, 92, 1, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 300, 16, 0, 40, 0, 1, MASK_NONE, VALS_NORMAL, 93, 2, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 2, 37, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 94, 2, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 3, 37, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 95, 1, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 1, 300, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 96, 2, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 2, 37, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 97, 2, 0},
    };
    const float mark = 12345.0f;
    int fails = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        gdata d;
        grad_build(&d, &cs[i]);
        char what[512];
        grad_describe(what, sizeof what, &cs[i]);
        aft_error err = {{0}};
        grads all;   /* every entry cleared by the library */
        assert_int_equal(run_backward(&all, &d, AFT_IMPL_FAST, cs[i].threads, &err), AFT_OK);
        grads g;
        grads_alloc(&g, &d);
        /* garbage where the run writes (the entries it made nonzero, and
         * for local the whole band), the mark elsewhere */
        const size_t tm = d.bias.tmax, T = d.c.T, s = d.c.window;
        for (size_t t = 0; t < tm; t++)
            for (size_t j = 0; j < tm; j++) {
                int used = t < T && j < T && (d.c.variant == AFT_FULL || (t < j + s && j < t + s));
                g.ddense[t * tm + j] = used ? NAN : all.ddense[t * tm + j] == 0.0f ? mark : -1.0f;
            }
        aft_config cfg = d.cfg;
        cfg.threads = cs[i].threads;
        aft_bias_grad db = {.dense = g.ddense, .zero_outside = 1};
        assert_int_equal(aft_op_backward(g.dq, g.dk, g.dv, &db, g.out, d.dout, d.q, d.k, d.v, &d.bias, &cfg, d.c.B,
                                         T, d.c.C, d.kc, &err),
                         AFT_OK);
        size_t bad = 0;
        for (size_t n = 0; n < d.ndense; n++) {
            float want = all.ddense[n] == 0.0f && g.ddense[n] == mark ? mark : all.ddense[n];
            bad += memcmp(&g.ddense[n], &want, sizeof want) != 0;
        }
        if (bad) {
            printf("  %zu entries differ from a run that clears everything (%s)\n", bad, what);
            fails++;
        }
        grads_free(&g);
        grads_free(&all);
        grad_free_data(&d);
    }
    assert_int_equal(fails, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_zero_outside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
