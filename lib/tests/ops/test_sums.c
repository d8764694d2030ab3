/*
 * test_sums.c - the stabilised softmax sums (lib/ops/sums.c) against float64
 * sums written here: for keys of +-1 to +-500, -inf keys, rows across the
 * 64-row blocks and strides wider than the rows, aft_sums_of_rows holds
 * m = the largest key, s0 = sum exp(k - m) and s1 = sum exp(k - m) v within
 * the float summation's bound, (n + 2) eps sum |terms|, and flags +inf and
 * NaN keys; aft_sums_merge of the sums of two parts gives the sums of the
 * whole within the same bound, and the sums of no keys merge as nothing.
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

#include "ops/sums.h"
#include "rng.h"

/* keys (T rows of ld) in [-scale, scale), a few -inf; values in [-1, 1) */
static void make_keys(rng *r, float *k, float *v, size_t T, size_t ld, double scale)
{
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < ld; c++) {
            k[t * ld + c] = (t * 7 + c) % 23 == 5 ? -INFINITY : (float)(scale * rng_sym(r));
            v[t * ld + c] = (float)rng_sym(r);
        }
}

/* the float64 sums of rows [r0, r1) of channel c, and the sums of their
 * terms' sizes (for the bound) */
static void ref_sums(const float *k, const float *v, size_t ld, size_t r0, size_t r1, size_t c, double *m,
                     double *s0, double *s1, double *a1)
{
    double M = -INFINITY;
    for (size_t t = r0; t < r1; t++) M = fmax(M, (double)k[t * ld + c]);
    *m = M;
    *s0 = *s1 = *a1 = 0.0;
    if (M == -INFINITY) return;
    for (size_t t = r0; t < r1; t++) {
        double e = exp((double)k[t * ld + c] - M);
        *s0 += e;
        *s1 += e * v[t * ld + c];
        *a1 += e * fabs((double)v[t * ld + c]);
    }
}

/* got within (n + 2) eps of the float32 sum's size, plus the exponential's
 * 1.5e-7 relative per term */
static int close_to(float got, double want, double size, size_t nterms)
{
    double tol = ((double)nterms + 2) * 0x1p-24 * size + 1.5e-7 * size + 1e-30;
    return fabs((double)got - want) <= tol;
}

static void test_sums_of_rows(void **state)
{
    (void)state;
    const size_t Ts[] = {1, 5, 64, 65, 200};
    const double scales[] = {1.0, 30.0, 500.0};
    const size_t n = 9, ld = 11;
    rng r = {2024};
    int bad = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            size_t T = Ts[ti];
            float *k = malloc(T * ld * sizeof *k), *v = malloc(T * ld * sizeof *v);
            float m[9], s0[9], s1[9], scratch[9];
            assert_non_null(k);
            assert_non_null(v);
            make_keys(&r, k, v, T, ld, scales[si]);
            size_t r0 = T > 3 ? 2 : 0;
            assert_int_equal(aft_sums_of_rows(k, ld, v, ld, r0, T, n, m, s0, s1, scratch), 0);
            for (size_t c = 0; c < n; c++) {
                double M, S0, S1, A1;
                ref_sums(k, v, ld, r0, T, c, &M, &S0, &S1, &A1);
                int ok = (double)m[c] == M && close_to(s0[c], S0, S0, T - r0) && close_to(s1[c], S1, A1, T - r0);
                if (!ok && bad++ < 5)
                    print_message("T %zu scale %g channel %zu: m %.9g (%.9g) s0 %.9g (%.9g) s1 %.9g (%.9g)\n", T,
                                  scales[si], c, (double)m[c], M, (double)s0[c], S0, (double)s1[c], S1);
            }
            /* a key of +inf or NaN is flagged */
            k[(T - 1) * ld + 3] = INFINITY;
            assert_int_equal(aft_sums_of_rows(k, ld, v, ld, r0, T, n, m, s0, s1, scratch), 1);
            k[(T - 1) * ld + 3] = NAN;
            assert_int_equal(aft_sums_of_rows(k, ld, v, ld, r0, T, n, m, s0, s1, scratch), 1);
            free(k);
            free(v);
        }
    assert_int_equal(bad, 0);
}

/* the sums of [0, cut) merged with those of [cut, T) are those of [0, T);
 * the sums of no keys change nothing */
static void test_sums_merge(void **state)
{
    (void)state;
    const size_t T = 150, n = 6, ld = 6;
    const size_t cuts[] = {0, 1, 64, 100, 150};
    rng r = {77};
    float *k = malloc(T * ld * sizeof *k), *v = malloc(T * ld * sizeof *v);
    assert_non_null(k);
    assert_non_null(v);
    make_keys(&r, k, v, T, ld, 200.0);
    int bad = 0;
    for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
        size_t cut = cuts[ci];
        float a[4 * 6], b[4 * 6], scratch[6];
        aft_sums_empty(a, n);
        aft_sums_empty(b, n);
        assert_int_equal(aft_sums_of_rows(k, ld, v, ld, 0, cut, n, a, a + n, a + 2 * n, scratch), 0);
        assert_int_equal(aft_sums_of_rows(k, ld, v, ld, cut, T, n, b, b + n, b + 2 * n, scratch), 0);
        for (size_t c = 0; c < n; c++) {
            a[3 * n + c] = a[c];   /* kmax: the largest key held */
            b[3 * n + c] = b[c];
        }
        aft_sums_merge(a, b, n);
        for (size_t c = 0; c < n; c++) {
            double M, S0, S1, A1;
            ref_sums(k, v, ld, 0, T, c, &M, &S0, &S1, &A1);
            int ok = (double)a[c] == M && (double)a[3 * n + c] == M && close_to(a[n + c], S0, S0, T) &&
                     close_to(a[2 * n + c], S1, A1, T);
            if (!ok && bad++ < 5)
                print_message("cut %zu channel %zu: m %.9g (%.9g) s0 %.9g (%.9g) s1 %.9g (%.9g)\n", cut, c,
                              (double)a[c], M, (double)a[n + c], S0, (double)a[2 * n + c], S1);
        }
        /* merging the sums of no keys leaves the bits as they are */
        float before[4 * 6], none[4 * 6];
        memcpy(before, a, sizeof a);
        aft_sums_empty(none, n);
        aft_sums_merge(a, none, n);
        assert_memory_equal(a, before, sizeof a);
    }
    /* and two empties stay empty */
    float e1[4 * 6], e2[4 * 6];
    aft_sums_empty(e1, n);
    aft_sums_empty(e2, n);
    aft_sums_merge(e1, e2, n);
    for (size_t c = 0; c < n; c++) {
        assert_true(e1[c] == -INFINITY && e1[3 * n + c] == -INFINITY);
        assert_true(e1[n + c] == 0.0f && e1[2 * n + c] == 0.0f);
    }
    free(k);
    free(v);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_of_rows),
        cmocka_unit_test(test_sums_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
