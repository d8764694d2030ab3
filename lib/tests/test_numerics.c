/*
 * test_numerics.c - the library's own exponential (aft_expf, lib/internal.h)
 * against the C library's exp in double, over every float of a regular
 * sample of the 2^32 bit patterns and at the edges of its range.
 *
 * What must hold, for x a float:
 *   NaN -> NaN; x > 88.72283 (just below ln FLT_MAX) -> +inf;
 *   x < -86.98 -> 0 (the flush: such terms are below 1.7e-38);
 *   otherwise a finite normal float within 1.5e-7 relative of exp(x).
 * Both the scalar code and the loop the compiler vectorises are checked:
 * the kernels only ever call aft_expf inside such loops; the loop is the
 * full kernel's, at the kernel level in use (make test-levels runs each). aft_expf_nonpos,
 * for x <= 0 and never NaN, must give aft_expf's bits on all such x. And
 * aft_max_f32, the vector maximum (through the full kernel's row maximum,
 * at the level in use), skips NaNs as a plain loop does.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "numerics.h"
#include "ops/kernels.h"

#define HI 88.72283f
#define LO -86.98f
#define REL 1.5e-7

/* the expected class of aft_expf(x): 0 NaN, 1 +inf, 2 zero, 3 normal */
static int expected(float x)
{
    if (isnan(x)) return 0;
    if (x > HI) return 1;
    if (x < LO) return 2;
    return 3;
}

/* 1 if y is right for x; prints the first few failures */
static int check_one(float x, float y, int *shown)
{
    int ok;
    switch (expected(x)) {
    case 0: ok = isnan(y); break;
    case 1: ok = y == INFINITY; break;
    case 2: ok = y == 0.0f && !signbit(y); break;
    default: {
        double e = exp((double)x);
        ok = isnormal(y) && fabs((double)y - e) <= REL * e;
        break;
    }
    }
    if (!ok && (*shown)++ < 5) fprintf(stderr, "aft_expf(%a) = %a, exp = %a\n", x, y, exp((double)x));
    return ok;
}

/* the vectorised form: the full kernel's loop over a row, exp(x - 0),
 * compiled for the level in use (AFT_KERNELS chooses it) */
static void exp_loop(float *restrict y, const float *restrict x, size_t n)
{
    memcpy(y, x, n * sizeof *y);
    aft_full_exp_row(y, n, n, 0.0f, NULL);
}

enum { N = 4096 };

static void test_expf_sampled(void **state)
{
    (void)state;
    static float xs[N], ys[N];
    int shown = 0;
    size_t bad = 0, n = 0, normal = 0;
    /* every 4099th bit pattern: ~1 million floats of both signs, all
     * exponents, NaNs and infinities included at the end */
    uint64_t u = 0;
    while (u <= 0xffffffffu) {
        size_t m = 0;
        for (; m < N && u <= 0xffffffffu; m++, u += 4099) {
            uint32_t b = (uint32_t)u;
            memcpy(&xs[m], &b, sizeof b);
        }
        exp_loop(ys, xs, m);
        for (size_t i = 0; i < m; i++) {
            bad += !check_one(xs[i], ys[i], &shown);
            bad += !check_one(xs[i], aft_expf(xs[i]), &shown);
            normal += expected(xs[i]) == 3;
        }
        n += m;
    }
    fprintf(stderr, "%zu floats, %zu in the normal range, %zu wrong\n", n, normal, bad);
    assert_true(normal > 10000);
    assert_int_equal(bad, 0);
}

static void test_expf_edges(void **state)
{
    (void)state;
    /* the thresholds, their neighbours, the points where the scale 2^n
     * changes most (n = -125 and n = 128), and exact values */
    float xs[] = {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 1.0f, -1.0f,
                  HI, nextafterf(HI, 0.0f), nextafterf(HI, INFINITY), 88.7228391f, 88.0f,
                  LO, nextafterf(LO, 0.0f), nextafterf(LO, -INFINITY), -86.6f, -86.9f,
                  -87.3f, -100.0f, -1e30f, 1e30f, 0.34657359f, -0.34657359f,
                  1e-8f, -1e-8f, 1e-40f, -1e-40f};
    size_t n = sizeof xs / sizeof xs[0];
    float ys[32];
    exp_loop(ys, xs, n);
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(check_one(xs[i], ys[i], &shown));
        assert_true(check_one(xs[i], aft_expf(xs[i]), &shown));
    }
    assert_true(aft_expf(0.0f) == 1.0f);
    assert_true(aft_expf(HI) <= FLT_MAX && aft_expf(HI) > 3.3e38f);
    /* the smallest kept result is a normal float near 1.7e-38 */
    assert_true(aft_expf(LO) >= FLT_MIN && aft_expf(LO) < 1.8e-38f);
}

/* every normal result x -> exp(x) is non-decreasing over a dense run of
 * floats (a wrong scale at a change of n would show as a step down) */
static void test_expf_monotone(void **state)
{
    (void)state;
    float prev = 0.0f;
    size_t steps = 0;
    for (float x = LO; x <= HI; x = nextafterf(x + 0.0009765625f, INFINITY)) {
        float y = aft_expf(x);
        if (y < prev) fprintf(stderr, "aft_expf(%a) = %a < previous %a\n", x, y, prev);
        assert_true(y >= prev);
        prev = y;
        steps++;
    }
    assert_true(steps > 100000);
}

/* aft_expf_nonpos against aft_expf, bit for bit, in a loop (vectorised)
 * and alone, on every 251st non-positive float from -0 to -inf, plus the
 * edges */
static void exp_nonpos_loop(float *restrict y, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = aft_expf_nonpos(x[i]);
}

static void test_expf_nonpos_same_bits(void **state)
{
    (void)state;
    static float xs[N], ya[N], yb[N];
    size_t n = 0, bad = 0;
    uint64_t u = 0x80000000u;
    const uint64_t end = 0xff800000u;   /* -inf */
    while (u <= end) {
        size_t m = 0;
        for (; m < N && u <= end; m++, u += 251) {
            uint32_t b = (uint32_t)u;
            memcpy(&xs[m], &b, sizeof b);
        }
        if (u > end && m < N) xs[m++] = -INFINITY;
        if (n == 0) {   /* the edges, in place of the first ones */
            const float edges[] = {0.0f, -0.0f, LO, nextafterf(LO, 0.0f), nextafterf(LO, -INFINITY), -87.3f,
                                   -1e30f, -INFINITY, -1e-40f, -0.34657359f, -FLT_MIN};
            memcpy(xs, edges, sizeof edges);
        }
        exp_loop(ya, xs, m);
        exp_nonpos_loop(yb, xs, m);
        for (size_t i = 0; i < m; i++) {
            float one = aft_expf_nonpos(xs[i]);
            int same = memcmp(&ya[i], &yb[i], sizeof(float)) == 0 && memcmp(&ya[i], &one, sizeof(float)) == 0;
            if (!same && bad < 5) fprintf(stderr, "x = %a: aft_expf %a, aft_expf_nonpos %a / %a\n", xs[i], ya[i], yb[i], one);
            bad += !same;
        }
        n += m;
    }
    fprintf(stderr, "%zu non-positive floats, %zu different\n", n, bad);
    assert_true(n > 8000000);
    assert_int_equal(bad, 0);
}

/* aft_max_f32 skips NaNs wherever they are: a NaN must not hide the
 * values after it in its vector lane (or anywhere), for every length and
 * NaN position around a vector's width; the answer is the plain loop's */
static void test_max_skips_nan(void **state)
{
    (void)state;
    float x[80];
    int bad = 0;
    for (size_t n = 1; n <= 80; n++)
        for (size_t at = 0; at < n; at++)
            for (int pattern = 0; pattern < 2; pattern++) {
                for (size_t i = 0; i < n; i++) x[i] = (float)((i * 37) % 23) - 11.0f;
                x[at] = NAN;
                if (pattern) /* a NaN at the start of every lane */
                    for (size_t i = 0; i < n && i < 16; i++) x[i] = NAN;
                float want = -INFINITY;
                for (size_t i = 0; i < n; i++) want = x[i] > want ? x[i] : want;
                float got = aft_full_visible_max(x, n, NULL);
                if (!(got == want) && bad++ < 5) fprintf(stderr, "n = %zu, NaN at %zu: got %g, want %g\n", n, at, got, want);
            }
    float inf[20];
    for (size_t i = 0; i < 20; i++) inf[i] = i == 17 ? INFINITY : -1.0f;
    assert_true(aft_full_visible_max(inf, 20, NULL) == INFINITY);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_sampled),
        cmocka_unit_test(test_expf_edges),
        cmocka_unit_test(test_expf_monotone),
        cmocka_unit_test(test_expf_nonpos_same_bits),
        cmocka_unit_test(test_max_skips_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
