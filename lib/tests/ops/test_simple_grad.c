/*
 * test_simple_grad.c - AFT-simple's backward (lib/ops/simple_grad.c;
 * causal simple's runs on the band, test_local_conv_grad.c) against the
 * float64 reference backward (gradcheck.h) over T x causal x mask x (B, C).
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

static void test_grad_simple(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grad_grid(AFT_SIMPLE, AFT_BIAS_NONE, w, 1, 700);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_simple),
    };
    /* TEST_GRAD_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_GRAD_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
