/*
 * test_memory.c - what a run will allocate (lib/memory.c): the scratch
 * estimate of a grid is bounded by a few copies of one sequence's channels
 * per thread, with no T x T array.
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

/* the scratch estimate for a grid: bounded by a few copies of one
 * sequence's channels per thread, and no T x T array */
static void test_grid_workspace(void **state)
{
    (void)state;
    aft_config cfg = {0};
    cfg.variant = AFT_CONV;
    cfg.window = 6;
    cfg.threads = 2;
    cfg.grid_h = 56;
    cfg.grid_w = 56;
    const size_t T = 56 * 56, C = 192;
    size_t bytes = aft_workspace_bytes(&cfg, 8, T, 192, C, 32);
    assert_true(bytes > 0 && bytes != SIZE_MAX);
    assert_true(bytes < (size_t)2 * 3 * T * C * sizeof(float) + 8 * T * C * sizeof(float));
    assert_true(bytes < T * T * sizeof(float));
    cfg.variant = AFT_LOCAL;
    bytes = aft_workspace_bytes(&cfg, 8, T, 192, C, 0);
    assert_true(bytes > 0 && bytes < T * T * sizeof(float) + 4 * 8 * T * C * sizeof(float));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_workspace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
