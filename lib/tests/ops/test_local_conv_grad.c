/*
 * test_local_conv_grad.c - the band kernel's backward
 * (lib/ops/local_conv_grad.c: AFT-local, AFT-conv and causal AFT-simple)
 * against the float64 reference backward (gradcheck.h): local windows 0, 1,
 * 3, T and T + 4 on every bias kind; conv with 1 to 5 heads, keys per
 * channel or per head, a bias row per head or one for all; how the rows are
 * cut into slices; the same bits in every run whatever order the threads
 * finish in; inputs beyond the sizes of its cheaper exponential; the
 * backward from what the causal forward kept.
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
#include "ops/kernels.h"   /* aft_band_grad_slices */
#include "gradcheck.h"
#include "ref_aft.h"
#include "rng.h"

/* local windows 0 (= simple), 1, 3, T, T + 4 on each bias kind */
static void test_grad_local(void **state)
{
    (void)state;
    const size_t w[] = {0, 1, 3, 999, 1000};
    grad_grid(AFT_LOCAL, AFT_BIAS_DENSE, w, N_OF(w), 400);
    grad_grid(AFT_LOCAL, AFT_BIAS_FACTORED, w, N_OF(w), 500);
    grad_grid(AFT_LOCAL, AFT_BIAS_SEEDED, w, N_OF(w), 600);
}

/* conv: heads 1, 2, 4 on C = 12 (1, 5 on C = 5), keys per channel or per
 * head, a bias of one row per head or one for all, windows 1, 3, T, T + 4 */
static void test_grad_conv(void **state)
{
    (void)state;
    const size_t heads12[] = {1, 2, 4}, heads5[] = {1, 5}, Cs[] = {5, 12};
    int fails = 0, cases = 0, reports = 0;
    for (size_t ci = 0; ci < N_OF(Cs); ci++) {
        size_t C = Cs[ci];
        const size_t *hs = C == 12 ? heads12 : heads5;
        size_t nh = C == 12 ? N_OF(heads12) : N_OF(heads5);
        for (size_t hi = 0; hi < nh; hi++)
            for (int shared = 0; shared <= 1; shared++)
                for (size_t wi = 0; wi < 4; wi++)
                    for (int causal = 0; causal <= 1; causal++)
                        for (size_t ti = 0; ti < N_OF(small_T); ti++) {
                            size_t T = small_T[ti];
                            size_t s = wi == 0 ? 1 : wi == 1 ? 3 : wi == 2 ? T : T + 4;
                            mask_mode mask = (mask_mode)(cases % 3);
                            size_t B = (cases / 3) % 2 ? 3 : 1;
                            gcase c = {AFT_CONV, AFT_BIAS_CONV, B, T, C, hs[hi], s, shared, causal, mask, VALS_NORMAL,
                                       800 + (uint64_t)cases, grid_threads(cases), (cases / 6) % 2};
                            fails += grad_run_case(&c, &reports);
                            cases++;
                        }
    }
    grad_finish(fails, cases);
}

/* the band backward's slices of the rows: one for one thread; else at
 * least one a thread, at most 8; more than one a thread only while each is
 * at least 64 and 4 s rows (the halos within T C floats) and the private
 * bias copies beyond the threads' within T C floats */
static void test_band_grad_slices(void **state)
{
    (void)state;
    const size_t Ts[] = {1, 5, 63, 700, 4096, 65536}, ss[] = {0, 1, 20, 32, 600};
    const size_t nts[] = {1, 2, 3, 16}, privs[] = {0, 41, 4096 * 8, (size_t)1 << 40};
    const size_t C = 48;
    int bad = 0;
    for (size_t a = 0; a < N_OF(Ts); a++)
        for (size_t b = 0; b < N_OF(ss); b++)
            for (size_t c = 0; c < N_OF(nts); c++)
                for (size_t e = 0; e < N_OF(privs); e++) {
                    size_t T = Ts[a], s = ss[b], nt = nts[c], priv = privs[e];
                    size_t ns = aft_band_grad_slices(T, s, nt, priv, C), rows = 4 * s > 64 ? 4 * s : 64;
                    int ok = ns >= nt && ns <= 8 * nt;
                    if (nt == 1) ok = ns == 1;
                    else if (ns > nt) ok = ok && T / ns >= rows && (double)(ns - nt) * (double)priv <= (double)T * C;
                    /* one slice fewer would not have been needed */
                    if (nt > 1 && ns < 8 * nt)
                        ok = ok && (T / (ns + 1) < rows || (double)(ns + 1 - nt) * (double)priv > (double)T * C);
                    if (!ok && bad++ < 5)
                        printf("  T %zu, s %zu, %zu threads, priv %zu: %zu slices\n", T, s, nt, priv, ns);
                }
    assert_int_equal(bad, 0);
    /* the case the speed is measured on: 16 slices for 2 threads */
    assert_int_equal(aft_band_grad_slices(4096, 32, 2, 0, 256), 16);
}

/* the tensors of a and b that differ in any bit (names printed) */
static int bits_differ(const grads *a, const grads *b, const gdata *d, const char *what)
{
    const float *const x[] = {a->dq, a->dk, a->dv, a->out, a->ddense, a->du, a->dv_f, a->dconv};
    const float *const y[] = {b->dq, b->dk, b->dv, b->out, b->ddense, b->du, b->dv_f, b->dconv};
    const size_t n[] = {d->nq, d->nk, d->nq, d->nq, d->ndense, d->nfac, d->nfac, d->nconv};
    static const char *const names[] = {"dq", "dk", "dv", "out", "dense", "u", "v", "conv"};
    int fails = 0;
    for (size_t i = 0; i < N_OF(n); i++)
        if (n[i] && memcmp(x[i], y[i], n[i] * sizeof(float)) != 0) {
            printf("  bits differ from the first run: %s (%s)\n", names[i], what);
            fails++;
        }
    return fails;
}

/* local and conv with three threads (more than this machine's cores, so
 * they finish in any order): every run gives the same bits, the threads'
 * bias gradients being added in thread order, as are the groups' copies
 * when short sequences run a group a thread. (The dense kernel's threads,
 * for full, masks and grids, take its blocks as they come free, so its
 * sums over them are not: see full_grad.c.) */
static void test_grad_same_bits_every_run(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 700, 48, 0, 20, 0, 1, MASK_NONE, VALS_NORMAL, 73, 3, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 1, 700, 48, 0, 20, 0, 0, MASK_NONE, VALS_NORMAL, 76, 3, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 700, 48, 4, 32, 0, 1, MASK_NONE, VALS_NORMAL, 74, 3, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 700, 48, 4, 32, 0, 0, MASK_NONE, VALS_NORMAL, 75, 3, 0},
        /* short sequences in groups, one a thread, with copies of the bias
         * gradient added in group order (full too: one thread a group) */
        {AFT_LOCAL, AFT_BIAS_DENSE, 5, 40, 24, 0, 9, 0, 1, MASK_NONE, VALS_NORMAL, 77, 3, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 5, 40, 24, 0, 9, 0, 0, MASK_NONE, VALS_NORMAL, 78, 3, 0},
        {AFT_CONV, AFT_BIAS_CONV, 5, 40, 24, 4, 9, 0, 1, MASK_NONE, VALS_NORMAL, 79, 3, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 5, 40, 24, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 80, 3, 0},
    };
    int fails = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        gdata d;
        grad_build(&d, &cs[i]);
        char what[512];
        grad_describe(what, sizeof what, &cs[i]);
        aft_error err = {{0}};
        grads g1;
        assert_int_equal(run_backward(&g1, &d, AFT_IMPL_FAST, 3, &err), AFT_OK);
        for (int r = 0; r < 8; r++) {
            grads gn;
            assert_int_equal(run_backward(&gn, &d, AFT_IMPL_FAST, 3, &err), AFT_OK);
            fails += bits_differ(&gn, &g1, &d, what);
            grads_free(&gn);
        }
        grads_free(&g1);
        grad_free_data(&d);
    }
    assert_int_equal(fails, 0);
}

/* Finite inputs beyond the band backward's tame sizes take its full
 * exponential, and still agree with the float64 reference: a key entry of
 * 3e38 (every exponential of the call), or a bias entry (its block's, and
 * the pass over the rows outside the band). Simple without causality takes
 * the cheaper exponential for any finite keys: a key of 3e38 puts every
 * other's exponent near -3e38. */
static void test_grad_beyond_tame(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 130, 6, 0, 9, 0, 1, MASK_NONE, VALS_BEYOND_KEY, 81, 2, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 130, 6, 0, 9, 0, 0, MASK_NONE, VALS_BEYOND_KEY, 82, 2, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 130, 6, 0, 9, 0, 1, MASK_NONE, VALS_BEYOND_BIAS, 83, 2, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 130, 6, 0, 9, 0, 0, MASK_NONE, VALS_BEYOND_BIAS, 84, 2, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 130, 6, 0, 0, 0, 1, MASK_NONE, VALS_BEYOND_KEY, 85, 2, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 130, 6, 0, 0, 0, 0, MASK_NONE, VALS_BEYOND_KEY, 87, 2, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 130, 6, 2, 5, 0, 1, MASK_NONE, VALS_BEYOND_KEY, 86, 2, 0},
    };
    grad_run_table(cs, N_OF(cs));
}

/* One causal run through the saved forward (aft_api_op_forward_saved, then
 * _backward_saved) against the backward alone: the same bits of dq, dk,
 * dv, the bias gradient and out. Returns the saved buffer's tag (its last
 * float): the thread count of the blocks of rows when the forward kept its
 * 1 / den and Y' (1 where groups of sequences ran a thread each), 0 when it
 * kept nothing and the backward made them again. */
static float saved_run(const char *opt, size_t T, size_t C, size_t window, float kscale, uint64_t seed)
{
    const size_t B = 2, n = B * T * C, nb = window ? T * T : 0;
    rng r = {seed};
    float *x = xmalloc((6 * n + 3 * nb) * sizeof(float));
    float *q = x, *k = q + n, *v = k + n, *dy = v + n, *out = dy + n, *out2 = out + n, *bias = out2 + n;
    float *db = bias + nb, *db2 = db + nb;
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)rng_normal(&r);
        k[i] = kscale * (float)rng_normal(&r);
        v[i] = (float)rng_normal(&r);
        dy[i] = (float)rng_normal(&r);
    }
    for (size_t i = 0; i < nb; i++) bias[i] = 0.5f * (float)rng_normal(&r);
    float *g = xmalloc(6 * n * sizeof(float)), *g2 = g + 3 * n;
    aft_error err = {{0}};
    size_t ns;
    const float *bp = nb ? bias : NULL;
    const size_t br = nb ? T : 0;
    assert_int_equal(aft_api_op_saved_size(B, T, C, C, bp, br, br, NULL, 0, opt, &ns, &err), AFT_OK);
    assert_true(ns > B * T * 2 * C);   /* a header first (lib/api/saved.c), the tag last */
    float *sv = xmalloc(ns * sizeof(float));
    assert_int_equal(aft_api_op_backward(g, g + n, g + 2 * n, nb ? db : NULL, out, dy, q, k, v, B, T, C, C, bp, br,
                                         br, NULL, 0, opt, &err), AFT_OK);
    assert_int_equal(aft_api_op_forward_saved(out2, sv, ns, q, k, v, B, T, C, C, bp, br, br, NULL, 0, opt, &err),
                     AFT_OK);
    assert_memory_equal(out2, out, n * sizeof(float));
    assert_int_equal(aft_api_op_backward_saved(g2, g2 + n, g2 + 2 * n, nb ? db2 : NULL, dy, q, k, v, sv, ns, B, T, C,
                                               C, bp, br, br, NULL, 0, opt, &err), AFT_OK);
    assert_memory_equal(g2, g, 3 * n * sizeof(float));
    if (nb) assert_memory_equal(db2, db, nb * sizeof(float));
    float tag = sv[ns - 1];
    free(x), free(g), free(sv);
    return tag;
}

/* The causal band backward from what its forward kept (AFT_SUMS_WRITE,
 * _READ): the same bits as it makes them itself, on one thread and on
 * several slices; keys in the hundreds put entries on the exact path, and
 * then the forward keeps nothing (its tag cleared) */
static void test_grad_saved_forward(void **state)
{
    (void)state;
    assert_true(saved_run("variant=local window=9 causal=1 threads=1", 300, 20, 9, 1.0f, 91) != 0.0f);
    assert_true(saved_run("variant=local window=9 causal=1 threads=2", 600, 20, 9, 1.0f, 92) != 0.0f);
    assert_true(saved_run("variant=local window=32 causal=1 threads=1", 256, 128, 32, 1.0f, 93) != 0.0f);
    /* w = 0 everywhere (causal simple): every entry done exactly, nothing kept */
    size_t ns;
    aft_error err = {{0}};
    assert_int_equal(aft_api_op_saved_size(2, 300, 12, 12, NULL, 0, 0, NULL, 0, "variant=simple causal=1", &ns, &err),
                     AFT_OK);
    assert_true(ns < 2 * 300 * 12);
    assert_true(saved_run("variant=local window=9 causal=1 threads=1", 300, 20, 9, 300.0f, 95) == 0.0f);
    assert_true(saved_run("variant=local window=9 causal=1 threads=2", 600, 20, 9, 300.0f, 96) == 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_local),
        cmocka_unit_test(test_grad_conv),
        cmocka_unit_test(test_band_grad_slices),
        cmocka_unit_test(test_grad_same_bits_every_run),
        cmocka_unit_test(test_grad_beyond_tame),
        cmocka_unit_test(test_grad_saved_forward),
    };
    /* TEST_GRAD_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_GRAD_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
