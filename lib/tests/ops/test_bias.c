/*
 * test_bias.c - the position biases (lib/ops/bias.c): aft_seeded_bias, the
 * bias made from a seed, is a pure function of the seed and both positions
 * with values spread over [-scale, scale). (Every bias kind reaches the
 * kernels in the tests of each kernel, held to the float64 reference.)
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

/* aft_seeded_bias: a pure function with values in [-scale, scale) that
 * spread over the range and depend on the seed and both positions */
static void test_seeded_bias_contract(void **state)
{
    (void)state;
    double lo = 1e9, hi = -1e9, sum = 0;
    size_t n = 0, same_seed = 0, same_t = 0;
    for (size_t t = 0; t < 64; t++)
        for (size_t t2 = 0; t2 < 64; t2++) {
            float a = aft_seeded_bias(42, 2.0f, t, t2);
            assert_true(a == aft_seeded_bias(42, 2.0f, t, t2));
            assert_true(a >= -2.0f && a < 2.0f);
            same_seed += a == aft_seeded_bias(43, 2.0f, t, t2);
            same_t += a == aft_seeded_bias(42, 2.0f, t2, t) && t != t2;
            if (a < lo) lo = a;
            if (a > hi) hi = a;
            sum += a;
            n++;
        }
    assert_true(lo < -1.8 && hi > 1.8);
    assert_true(fabs(sum / (double)n) < 0.1);
    assert_true(same_seed < 8 && same_t < 8);
    /* large positions (a band far down a long sequence) still work */
    float big = aft_seeded_bias(42, 2.0f, (size_t)1 << 40, ((size_t)1 << 40) + 3);
    assert_true(big >= -2.0f && big < 2.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeded_bias_contract),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
