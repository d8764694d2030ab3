/* test_slice.c - a sequence in slices, as N processes would run it, in one
 * process: each slice's rows from its own rows, K | V of the rows near it
 * and the key sums of the others (put together from each slice's sums, as
 * an MPI scan would), through aft_layer_forward_slice without causality
 * and under a mask, through a seeded state (aft_state_seed) with it. For
 * every variant and key form, causal and not, B = 1 and 3, N = 1 to 4 and
 * 7, slices shorter than the window, keys of +-500 and biases of +-250, the
 * output is within 1e-6 x max(1, |Y|) of the whole sequence's through
 * aft_layer_forward. A NaN input row gives the whole sequence's NaN
 * entries. Also: what the entry points refuse. (The .npy range
 * reader the slices read with: io/test_npy.c.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "aft.h"
#include "ref_aft.h"
#include "layers.h"
#include "rng.h"

#define TOL_REL 1e-6
/* slices of one or two rows: a causal step of so few rows takes the band
 * kernel's row-at-a-time path (the exact maximum of each row's terms), the
 * whole sequence the blocked one; with keys of +-500 the two differ by up
 * to 3.5e-6 x max(1, |Y|) (each is 3e-6 to 9e-6 from float64) */
#define TOL_REL_TINY 5e-6

enum { D = LAYER_D, C = LAYER_C, TMAX = LAYER_TMAX, H = LAYER_H };

/* rows [r0, r1) of every sequence of x (B, T, w) as (B, r1 - r0, w) */
static float *rows_of(const float *x, size_t B, size_t T, size_t w, size_t r0, size_t r1)
{
    float *o = xmalloc(B * (r1 - r0 + 1) * w * sizeof *o);
    for (size_t b = 0; b < B; b++) memcpy(o + b * (r1 - r0) * w, x + (b * T + r0) * w, (r1 - r0) * w * sizeof *o);
    return o;
}

/* K | V of rows [r0, r1) of x, (B, r1 - r0, 2C) */
static float *kv_of(const layer *L, const float *x, size_t B, size_t T, size_t r0, size_t r1)
{
    float *xr = rows_of(x, B, T, D, r0, r1);
    float *kv = xmalloc(B * (r1 - r0 + 1) * 2 * C * sizeof *kv);
    aft_error err;
    assert_int_equal(aft_layer_kv(kv, xr, &L->p, &L->cfg, B, r1 - r0, &err), AFT_OK);
    free(xr);
    return kv;
}

/* the key sums of rows [r0, r1), (B, 4C) */
static int sums_of(const layer *L, const float *x, size_t B, size_t T, size_t r0, size_t r1, float *sums)
{
    float *xr = rows_of(x, B, T, D, r0, r1);
    aft_error err;
    int bad = 0;
    assert_int_equal(aft_layer_key_sums(sums, &bad, xr, &L->p, &L->cfg, B, r1 - r0, 0, r1 - r0, &err), AFT_OK);
    free(xr);
    return bad;
}

/* slice i of N: rows [i T / N, (i + 1) T / N) */
static size_t cut(size_t i, size_t N, size_t T) { return i * T / N; }

/* the sums of rows [0, before) as a scan over N slices gives them: slice
 * q's rows shifted by `shift` (their part below `before`), merged in order */
static int scan_sums(const layer *L, const float *x, size_t B, size_t T, size_t N, size_t shift, size_t before,
                     float *out)
{
    int bad = 0;
    float *part = xmalloc(B * 4 * C * sizeof *part);
    for (size_t b = 0; b < B; b++) aft_key_sums_empty(out + b * 4 * C, C);
    for (size_t q = 0; q < N; q++) {
        size_t lo = cut(q, N, T) > shift ? cut(q, N, T) - shift : 0;
        size_t hi = cut(q + 1, N, T) > shift ? cut(q + 1, N, T) - shift : 0;
        if (hi > before) hi = before;
        if (lo >= hi) continue;
        bad |= sums_of(L, x, B, T, lo, hi, part);
        for (size_t b = 0; b < B; b++) aft_key_sums_merge(out + b * 4 * C, part + b * 4 * C, C);
    }
    free(part);
    return bad;
}

/* the same from the right: rows [after, T) */
static void rscan_sums(const layer *L, const float *x, size_t B, size_t T, size_t N, size_t shift, size_t after,
                       float *out)
{
    float *part = xmalloc(B * 4 * C * sizeof *part);
    for (size_t b = 0; b < B; b++) aft_key_sums_empty(out + b * 4 * C, C);
    for (size_t q = N; q-- > 0;) {
        size_t lo = cut(q, N, T) + shift < T ? cut(q, N, T) + shift : T;
        size_t hi = cut(q + 1, N, T) + shift < T ? cut(q + 1, N, T) + shift : T;
        if (lo < after) lo = after;
        if (lo >= hi) continue;
        sums_of(L, x, B, T, lo, hi, part);
        /* the rows on the right come after: part then what was gathered */
        for (size_t b = 0; b < B; b++) {
            aft_key_sums_merge(part + b * 4 * C, out + b * 4 * C, C);
            memcpy(out + b * 4 * C, part + b * 4 * C, 4 * C * sizeof *out);
        }
    }
    free(part);
}

/* slice [t0, t1) of N through the slice entry points, into y (B, T, D) */
static void run_slice(const layer *L, const float *x, size_t B, size_t T, size_t N, size_t t0, size_t t1, float *y)
{
    aft_error err;
    size_t n = t1 - t0, halo;
    float *xs = rows_of(x, B, T, D, t0, t1), *ys = xmalloc(B * (n + 1) * D * sizeof *ys);
    if (L->cfg.causal && !L->p.bias.mask) {
        aft_state *s;
        assert_int_equal(aft_state_new(&s, &L->p, &L->cfg, B, &err), AFT_OK);
        size_t keep = aft_state_keep(s), kept = t0 < keep ? t0 : keep;
        float *kv = kv_of(L, x, B, T, t0 - kept, t0), *sums = xmalloc(B * 4 * C * sizeof *sums);
        /* a bad key before: every later output NaN (the shards' flag;
         * B = 1 in the cases with one) */
        int bad = scan_sums(L, x, B, T, N, keep == SIZE_MAX ? 0 : keep, t0 - kept, sums);
        assert_int_equal(aft_state_seed(s, t0, t0 > kept ? sums : NULL, kv, bad, &err), AFT_OK);
        assert_int_equal(aft_state_step(s, ys, xs, n, &err), AFT_OK);
        aft_state_free(s);
        free(kv);
        free(sums);
    } else {
        assert_int_equal(aft_layer_slice_halo(&L->p, &L->cfg, T, &halo, &err), AFT_OK);
        size_t a0 = halo == SIZE_MAX || t0 < halo ? 0 : t0 - halo;
        size_t a1 = L->cfg.causal ? t1 : halo == SIZE_MAX || T - t1 < halo ? T : t1 + halo;
        if (halo == 0) a0 = a1 = t0;   /* simple: the sums alone */
        float *kv = kv_of(L, x, B, T, a0, a1);
        float *left = xmalloc(B * 4 * C * sizeof *left), *right = xmalloc(B * 4 * C * sizeof *right);
        if (halo == 0) {   /* an all-reduce: every slice's sums */
            scan_sums(L, x, B, T, N, 0, T, left);
        } else if (halo != SIZE_MAX) {
            scan_sums(L, x, B, T, N, halo, a0, left);
            rscan_sums(L, x, B, T, N, halo, a1, right);
        }
        aft_params p = L->p;
        uint8_t *m = NULL;
        if (p.bias.mask) {   /* the slice's rows of the mask */
            size_t nb = p.bias.mask_batched ? B : 1;
            m = xmalloc(nb * (n + 1) * T);
            for (size_t b = 0; b < nb; b++) memcpy(m + b * n * T, p.bias.mask + (b * T + t0) * T, n * T);
            p.bias.mask = m;
        }
        int sums_used = halo != SIZE_MAX;
        assert_int_equal(aft_layer_forward_slice(ys, xs, kv, sums_used && (a0 > 0 || halo == 0) ? left : NULL,
                                                 sums_used && halo && a1 < T && !L->cfg.causal ? right : NULL, &p,
                                                 &L->cfg,
                                                 B, T, t0, t1, a0, a1, &err),
                         AFT_OK);
        free(kv); free(left); free(right); free(m);
    }
    for (size_t b = 0; b < B; b++) memcpy(y + (b * T + t0) * D, ys + b * n * D, n * D * sizeof *y);
    free(xs);
    free(ys);
}

static int close_enough(const char *what, const float *a, const float *ref, size_t n, double rel)
{
    for (size_t i = 0; i < n; i++) {
        double tol = rel * fmax(1.0, fabs((double)ref[i]));
        if (isnan(ref[i]) && isnan(a[i])) continue;
        if (!(fabs((double)a[i] - (double)ref[i]) <= tol)) {
            print_error("%s: entry %zu is %.9g, the whole sequence's %.9g\n", what, i, (double)a[i], (double)ref[i]);
            return 0;
        }
    }
    return 1;
}

/* every case: the whole sequence, then its N slices */
static void check_all_nan(size_t T, int with_mask, const size_t *Ns, size_t nN, double rel, size_t nan_row)
{
    rng r = {T * 7 + (size_t)with_mask};
    int failures = 0;
    for (size_t ci = 0; ci < layer_ncases; ci++)
        for (int causal = 0; causal < 2; causal++)
            for (int extreme = 0; extreme < 2; extreme++)
                for (size_t B = 1; B <= 3; B += 2) {
                    /* aft_state_seed's flag of a bad key before covers every
                     * sequence: one sequence when a NaN row leads there */
                    if (nan_row < T && causal && !with_mask && B > 1) continue;
                    layer L;
                    make_layer(&L, &layer_cases[ci], extreme, causal, 11 + ci);
                    float *x = randf(&r, B * T * D, 1.0), *want = xmalloc(B * T * D * sizeof *want);
                    if (nan_row < T) x[(B - 1) * T * D + nan_row * D + 3] = NAN;   /* the last sequence */
                    float *got = xmalloc(B * T * D * sizeof *got);
                    uint8_t *mask = NULL;
                    if (with_mask) {
                        mask = xmalloc(B * T * T);
                        for (size_t i = 0; i < B * T * T; i++) mask[i] = rng_next(&r) % 4 != 0;
                        L.p.bias.mask = mask;
                        L.p.bias.mask_batched = B > 1;
                    }
                    aft_error err;
                    assert_int_equal(aft_layer_forward(want, x, &L.p, &L.cfg, B, T, &err), AFT_OK);
                    for (size_t k = 0; k < nN; k++) {
                        size_t N = Ns[k];
                        memset(got, 0, B * T * D * sizeof *got);
                        for (size_t i = 0; i < N; i++) run_slice(&L, x, B, T, N, cut(i, N, T), cut(i + 1, N, T), got);
                        char what[160];
                        snprintf(what, sizeof what, "%s%s%s%s, B = %zu, T = %zu, N = %zu", layer_cases[ci].name,
                                 causal ? " causal" : "", extreme ? " extreme" : "", with_mask ? " masked" : "", B, T,
                                 N);
                        if (!close_enough(what, got, want, B * T * D, rel)) {
                            /* how far each is from the float64 reference */
                            double *ref = xmalloc(B * T * D * sizeof *ref), e1 = 0, e2 = 0;
                            assert_int_equal(ref_aft_layer(ref, x, &L.p, &L.cfg, B, T), 0);
                            for (size_t i = 0; i < B * T * D; i++) {
                                double sc = fmax(1.0, fabs(ref[i]));
                                e1 = fmax(e1, fabs(want[i] - ref[i]) / sc);
                                e2 = fmax(e2, fabs(got[i] - ref[i]) / sc);
                            }
                            print_error("  against float64: whole %.3g, slices %.3g\n", e1, e2);
                            free(ref);
                            failures++;
                        }
                    }
                    free(x); free(want); free(got); free(mask);
                    free_layer(&L);
                }
    assert_int_equal(failures, 0);
}

static void check_all(size_t T, int with_mask, const size_t *Ns, size_t nN, double rel)
{
    check_all_nan(T, with_mask, Ns, nN, rel, SIZE_MAX);
}

static const size_t Ns[] = {1, 2, 3, 4, 7};

static void test_slices_long(void **state) { (void)state; check_all(TMAX, 0, Ns, 5, TOL_REL); }
/* slices of 3 to 15 rows, windows of up to 7: a slice's halo reaches past its neighbours */
static void test_slices_short(void **state) { (void)state; check_all(15, 0, Ns, 4, TOL_REL); }
/* slices of 2 and 3 rows */
static void test_slices_tiny(void **state) { (void)state; check_all(15, 0, Ns + 4, 1, TOL_REL_TINY); }
static void test_slices_masked(void **state) { (void)state; check_all(37, 1, Ns, 5, TOL_REL); }
/* a NaN input row (its keys NaN): the same NaN entries as the whole
 * sequence's (causal: that row's and the later ones, in its sequence; else
 * its sequence), the rest within TOL_REL_TINY: the whole sequence runs full
 * with that row's keys as -inf, which can move the column maxima its blocked
 * kernel factors out, so with keys of +-500 rows before it round apart from
 * the slices' by up to 1.1e-6 x max(1, |Y|) at the base level (both 3.3e-6
 * from float64) */
static void test_slices_nan(void **state)
{
    (void)state;
    check_all_nan(TMAX, 0, Ns, 5, TOL_REL_TINY, 70);
    check_all_nan(37, 1, Ns, 5, TOL_REL_TINY, 20);
}

/* the band's slice with causality, called as a library caller may (the
 * shards step a state instead): rows before a held NaN key's stay finite */
static void test_causal_band_slice_nan(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < layer_ncases; ci++) {
        layer L;
        make_layer(&L, &layer_cases[ci], 0, 1, 31 + ci);
        if (L.cfg.variant == AFT_FULL) {
            free_layer(&L);
            continue;
        }
        const size_t B = 2, T = 60, t0 = 30, t1 = 60, nan_row = 45;
        rng r = {91 + ci};
        float *x = randf(&r, B * T * D, 1.0), *want = xmalloc(B * T * D * sizeof *want);
        x[(T + nan_row) * D + 1] = NAN;   /* sequence 1 */
        aft_error err;
        assert_int_equal(aft_layer_forward(want, x, &L.p, &L.cfg, B, T, &err), AFT_OK);
        float *kv = kv_of(&L, x, B, T, 0, t1), *xs = rows_of(x, B, T, D, t0, t1);
        float *ys = xmalloc(B * (t1 - t0) * D * sizeof *ys);
        assert_int_equal(aft_layer_forward_slice(ys, xs, kv, NULL, NULL, &L.p, &L.cfg, B, T, t0, t1, 0, t1, &err),
                         AFT_OK);
        for (size_t b = 0; b < B; b++)
            for (size_t t = t0; t < t1; t++)
                for (size_t d = 0; d < D; d++) {
                    float g = ys[(b * (t1 - t0) + t - t0) * D + d], w = want[(b * T + t) * D + d];
                    if (isnan(g) != isnan(w) || isnan(w) != (b == 1 && t >= nan_row))
                        fail_msg("%s: b=%zu t=%zu d=%zu: %g, whole sequence %g", layer_cases[ci].name, b, t, d,
                                 (double)g, (double)w);
                    if (!isnan(w) && !(fabs((double)g - w) <= 1e-5 * fmax(1.0, fabs((double)w))))
                        fail_msg("%s: b=%zu t=%zu d=%zu: %g, whole sequence %g", layer_cases[ci].name, b, t, d,
                                 (double)g, (double)w);
                }
        free(x); free(want); free(kv); free(xs); free(ys);
        free_layer(&L);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    layer L;
    make_layer(&L, &layer_cases[0], 0, 0, 3);
    aft_error err;
    float x[4 * D], y[4 * D], kv[8 * 2 * C];
    memset(x, 0, sizeof x);
    memset(kv, 0, sizeof kv);
    /* the band needs the window's rows either side */
    assert_int_equal(aft_layer_forward_slice(y, x, kv, NULL, NULL, &L.p, &L.cfg, 1, 100, 50, 54, 48, 56, &err),
                     AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "need K, V of rows [45, 59)"));
    /* and the sums of the rows beyond them */
    assert_int_equal(aft_layer_forward_slice(y, x, kv, NULL, NULL, &L.p, &L.cfg, 1, 100, 50, 54, 45, 59, &err),
                     AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "key sums"));
    assert_int_equal(aft_layer_forward_slice(y, x, kv, NULL, NULL, &L.p, &L.cfg, 1, 100, 50, 40, 45, 59, &err),
                     AFT_ERR_ARG);
    /* a state's sums must be sums */
    L.cfg.causal = 1;
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &L.p, &L.cfg, 1, &err), AFT_OK);
    assert_int_equal(aft_state_keep(s), 5);
    float sums[4 * C];
    aft_key_sums_empty(sums, C);
    assert_int_equal(aft_key_sums_ok(sums, C), 1);
    sums[C] = -1.0f;
    assert_int_equal(aft_key_sums_ok(sums, C), 0);
    assert_int_equal(aft_state_seed(s, 9, sums, kv, 0, &err), AFT_ERR_ARG);
    assert_int_equal(aft_state_seed(s, 9, NULL, kv, 0, &err), AFT_ERR_ARG);
    assert_int_equal(aft_state_seed(s, 3, NULL, kv, 0, &err), AFT_OK);
    assert_int_equal(aft_state_position(s), 3);
    /* a poisoned seed: every output NaN */
    assert_int_equal(aft_state_seed(s, 9, NULL, kv, 1, &err), AFT_OK);
    assert_int_equal(aft_state_step(s, y, x, 2, &err), AFT_OK);
    assert_true(isnan(y[0]) && isnan(y[2 * D - 1]));
    aft_state_free(s);
    free_layer(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_long),
        cmocka_unit_test(test_slices_short),
        cmocka_unit_test(test_slices_tiny),
        cmocka_unit_test(test_slices_masked),
        cmocka_unit_test(test_slices_nan),
        cmocka_unit_test(test_causal_band_slice_nan),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
