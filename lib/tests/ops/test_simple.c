/*
 * test_simple.c - AFT-simple without causality (lib/ops/simple.c; causal
 * simple runs on the band, test_local_conv.c) against the float64
 * reference in ref_aft.c, for both cfg.impl = AFT_IMPL_FAST and
 * AFT_IMPL_REFERENCE (opcheck.h): the grid of T x causal x mask x (B, C),
 * and the rows split over one to three threads, each keeping running
 * softmax sums, with keys of +-500 and one huge key.
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

static void test_op_simple(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_SIMPLE, AFT_BIAS_NONE, w, 1, 700);
}

/* simple without causality splits the rows over the threads, each keeping
 * running softmax sums a 64-row block at a time, merged at the end (from
 * T = 128 on): T around the block and threshold sizes and past several
 * blocks, B > 1, one to three threads (three on two cores: uneven rows),
 * every value mode, including keys of +-500 and one huge key. */
static void test_op_simple_rows(void **state)
{
    (void)state;
    const size_t Ts[] = {127, 128, 129, 521};
    const int th[] = {1, 2, 3};
    int fails = 0, cases = 0, reports = 0;
    for (size_t ti = 0; ti < N_OF(Ts); ti++)
        for (size_t hi = 0; hi < N_OF(th); hi++)
            for (int vm = 0; vm < 4; vm += 2) {
                size_t B = (cases & 1) ? 3 : 1, C = (cases & 2) ? 16 : 12;
                /* value modes: normal/one-huge-key, then wide/adversarial */
                vals_mode vals = (vals_mode)(vm + (int)(hi & 1));
                op_case c = {AFT_SIMPLE, AFT_BIAS_NONE, B, Ts[ti], C, 0, 0, 0, 0, MASK_NONE, vals,
                             1400 + (uint64_t)cases, th[hi]};
                fails += op_run_case(&c, &reports);
                cases++;
            }
    op_finish(fails, cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_simple),
        cmocka_unit_test(test_op_simple_rows),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
