/*
 * test_full_grad.c - AFT-full's backward (lib/ops/full_grad.c, which also
 * runs every masked call) against the float64 reference backward
 * (gradcheck.h): dense, factored, seeded and no bias over T x causal x mask
 * x (B, C), per tensor within 1e-4 * max(1, max |g64|).
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

static void test_grad_full(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grad_grid(AFT_FULL, AFT_BIAS_DENSE, w, 1, 100);
    grad_grid(AFT_FULL, AFT_BIAS_FACTORED, w, 1, 200);
    grad_grid(AFT_FULL, AFT_BIAS_SEEDED, w, 1, 300);
    grad_grid(AFT_FULL, AFT_BIAS_NONE, w, 1, 350);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_full),
    };
    /* TEST_GRAD_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_GRAD_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
