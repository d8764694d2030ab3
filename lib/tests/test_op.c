/*
 * test_op.c - the AFT operator and layer against the float64 reference in
 * ref_aft.c, for both cfg.impl = AFT_IMPL_FAST and AFT_IMPL_REFERENCE.
 *
 * Pass criterion for a comparison: every output finite and
 *   max |out - ref| <= 2e-5 * max(1, max |ref|),
 * and a (b, t, c) with nothing visible is exactly 0.
 *
 * The first group of tests checks the reference itself against closed forms
 * and identities between the variants, so a bug there cannot hide behind an
 * agreeing library. Every input comes from a seeded PRNG: a failure prints
 * the case (variant, sizes, options, seed) so it can be rerun.
 *
 * The extreme-value inputs (keys up to +-500, biases up to +-250) are put on a
 * grid of 2^-8 (2^-4 for factored u, v) so that K + w is exact even in float:
 * a correct float32 kernel then loses nothing before exp, and any failure
 * there is the algorithm's (overflow, underflow, a wrong maximum), not the
 * inputs' rounding. The seeded bias cannot be put on the grid; its sums round
 * to ~3e-5 at |K + w| ~ 750, which the tolerance still covers in practice.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <unistd.h>

#include <cmocka.h>

#include "aft.h"
#include "layer.h"    /* aft_layer_forward_chunked */
#include "nn/linear.h"   /* aft_linear */
#include "ref_aft.h"
#include "rng.h"

#define TOL_REL 2e-5       /* the comparison tolerance, relative to max(1, max|ref|) */
#define THREAD_TOL 1e-6    /* threads = 1 vs 2, relative to max(1, max|out|) */
#define MAX_REPORTS 12     /* mismatches printed per test before only counting */

/* ---------------------------------------------------------------- test cases */

typedef enum { MASK_NONE, MASK_SHARED, MASK_BATCHED } mask_mode;
static const char *const mask_names[] = {"none", "TxT", "BxTxT"};

typedef enum {
    VALS_NORMAL,     /* q, k ~ N(0,1), v, w ~ U[-1,1] */
    VALS_WIDE,       /* k ~ U[-500,500], w ~ U[-250,250], q ~ U[-100,100] */
    VALS_ONE_HUGE,   /* k = +500 at t0 = 2T/3, -500 elsewhere; w ~ U[-250,250] */
    VALS_ADVERSE,    /* per key channel, for one query row t*: k = 375 - w/2, so
                      * the largest key (~500) sits where w is most negative
                      * (k + w ~ 250) while k + w peaks (~500) where k is ~250
                      * below its maximum: exp(k - max k) underflows in float */
    VALS_RISING,     /* dense bias only: w[t,j] ~ U[-1,1] + 5 (j / 256), + 100
                      * from j = 768 on; q, k ~ N(0,1): each 256-key chunk
                      * raises every row's maximum of w, by 100 nats once */
} vals_mode;
static const char *const vals_names[] = {"normal", "wide", "one-huge-key", "adversarial", "rising"};
static const char *const kind_names[] = {"none", "dense", "factored", "seeded", "conv"};

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;      /* full/local: where w comes from; conv: AFT_BIAS_CONV */
    size_t B, T, C;
    size_t heads, window;
    int shared_keys;         /* conv: kc = heads instead of C */
    int causal;
    mask_mode mask;
    vals_mode vals;
    uint64_t seed;
    int threads;             /* cfg.threads for the library call (0 = all cores) */
} op_case;

/* who runs full's products in the cases built from here on (the OpenBLAS
 * path: AFT_KERNEL_BLAS) */
static aft_kernel g_full_product = AFT_KERNEL_AUTO;

/* everything one case needs: inputs, bias storage, config, reference output */
typedef struct {
    op_case c;
    size_t kc;
    float *q, *k, *v;
    float *dense, *fu, *fv, *conv;
    uint8_t *mask;
    aft_bias bias;
    aft_config cfg;
    double *ref;
} case_data;

static void describe(char *buf, size_t n, const op_case *c, size_t kc)
{
    snprintf(buf, n,
             "variant=%s bias=%s B=%zu T=%zu C=%zu kc=%zu heads=%zu window=%zu "
             "causal=%d mask=%s values=%s seed=%llu threads=%d",
             aft_variant_name(c->variant), kind_names[c->kind], c->B, c->T, c->C, kc,
             c->heads, c->window, c->causal, mask_names[c->mask], vals_names[c->vals],
             (unsigned long long)c->seed, c->threads);
}

/* The random mask: each entry visible with probability 0.7, and some rows
 * fully invisible (rows t with (t + b) % 5 == 2; b = 0 for a shared mask). */
static uint8_t *make_mask(rng *r, size_t nb, size_t T)
{
    uint8_t *m = xmalloc(nb * T * T);
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t t2 = 0; t2 < T; t2++)
                m[(b * T + t) * T + t2] =
                    (t + b) % 5 == 2 ? 0 : (uint8_t)(rng_unif(r) < 0.7);
    return m;
}

static void build_case(case_data *d, const op_case *c)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    size_t B = c->B, T = c->T, C = c->C;
    d->kc = c->variant == AFT_CONV && c->shared_keys ? c->heads : C;
    rng r = {c->seed * 0x2545F4914F6CDD1Dull + T * 131 + C * 7 + B};
    int extreme = c->vals != VALS_NORMAL && c->vals != VALS_RISING;
    double span = extreme ? 250.0 : 1.0;

    d->cfg.variant = c->variant;
    d->cfg.window = c->window;
    d->cfg.heads = c->heads;
    d->cfg.causal = c->causal;
    d->cfg.threads = 0;
    d->cfg.impl = AFT_IMPL_FAST;
    d->cfg.full_product = g_full_product;

    d->bias.kind = c->kind;
    switch (c->kind) {
    case AFT_BIAS_DENSE: {
        /* tmax > T, so a kernel that uses T as the row stride is caught */
        size_t tmax = T + 3;
        d->dense = xmalloc(tmax * tmax * sizeof *d->dense);
        for (size_t i = 0; i < tmax * tmax; i++) {
            size_t j = i % tmax;
            double rise = 5.0 * (double)(j / 256) + (j >= 768 ? 100.0 : 0.0);
            d->dense[i] = extreme ? on_grid(span * rng_sym(&r), 0x1p-8)
                          : c->vals == VALS_RISING ? on_grid(rise + rng_sym(&r), 0x1p-8)
                                                   : (float)rng_sym(&r);
        }
        d->bias.dense = d->dense;
        d->bias.tmax = tmax;
        break;
    }
    case AFT_BIAS_FACTORED: {
        /* extreme: rank 2, |u|, |v| <= 11, so |w| <= 242 */
        size_t tmax = T + 2, rank = extreme ? 2 : 3;
        double s = extreme ? 11.0 : 0.6;
        d->fu = xmalloc(tmax * rank * sizeof *d->fu);
        d->fv = xmalloc(tmax * rank * sizeof *d->fv);
        for (size_t i = 0; i < tmax * rank; i++) {
            d->fu[i] = extreme ? on_grid(s * rng_sym(&r), 0x1p-4) : (float)(s * rng_sym(&r));
            d->fv[i] = extreme ? on_grid(s * rng_sym(&r), 0x1p-4) : (float)(s * rng_sym(&r));
        }
        d->bias.u = d->fu;
        d->bias.v = d->fv;
        d->bias.rank = rank;
        d->bias.tmax = tmax;
        break;
    }
    case AFT_BIAS_SEEDED:
        d->bias.seed = c->seed ^ 0xA5A5A5A5u;
        d->bias.scale = (float)span;
        break;
    case AFT_BIAS_CONV: {
        size_t n = c->heads * (2 * c->window - 1);
        d->conv = xmalloc(n * sizeof *d->conv);
        for (size_t i = 0; i < n; i++)
            d->conv[i] = extreme ? on_grid(span * rng_sym(&r), 0x1p-8) : (float)rng_sym(&r);
        d->bias.conv = d->conv;
        break;
    }
    case AFT_BIAS_NONE:
    default:
        break;
    }
    if (c->mask != MASK_NONE) {
        d->mask = make_mask(&r, c->mask == MASK_BATCHED ? B : 1, T);
        d->bias.mask = d->mask;
        d->bias.mask_batched = c->mask == MASK_BATCHED;
    }

    size_t nq = B * T * C, nk = B * T * d->kc;
    d->q = xmalloc(nq * sizeof *d->q);
    d->v = xmalloc(nq * sizeof *d->v);
    d->k = xmalloc(nk * sizeof *d->k);
    for (size_t i = 0; i < nq; i++) {
        d->q[i] = c->vals == VALS_WIDE ? (float)(100.0 * rng_sym(&r)) : (float)rng_normal(&r);
        d->v[i] = (float)rng_sym(&r);
    }
    size_t H = c->variant == AFT_CONV ? c->heads : 1;
    for (size_t b = 0; b < B; b++)
        for (size_t t2 = 0; t2 < T; t2++)
            for (size_t j = 0; j < d->kc; j++) {
                float *kk = &d->k[(b * T + t2) * d->kc + j];
                switch (c->vals) {
                case VALS_NORMAL:
                case VALS_RISING:
                    *kk = (float)rng_normal(&r);
                    break;
                case VALS_WIDE:
                    *kk = on_grid(500.0 * rng_sym(&r), 0x1p-8);
                    break;
                case VALS_ONE_HUGE:
                    *kk = t2 == 2 * T / 3 ? 500.0f : -500.0f;
                    break;
                case VALS_ADVERSE: {
                    /* row t* differs per key channel; w from the same bias the
                     * operator uses (head of channel j) */
                    size_t head = d->kc == C ? j / (C / H) : j;
                    size_t ts = (j * 7 + 3) % T;
                    double w = ref_aft_bias_entry(&d->bias, &d->cfg, head, ts, t2);
                    *kk = (float)(375.0 - 0.5 * w);
                    break;
                }
                }
            }

    d->ref = xmalloc(nq * sizeof *d->ref);
    int rc = ref_aft_op(d->ref, d->q, d->k, d->v, &d->bias, &d->cfg, B, T, C, d->kc);
    if (rc != 0) {
        char buf[512];
        describe(buf, sizeof buf, c, d->kc);
        fail_msg("reference refused its own case: %s", buf);
    }
}

static void free_case(case_data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->dense);
    free(d->fu);
    free(d->fv);
    free(d->conv);
    free(d->mask);
    free(d->ref);
}

/* does (b, t) of the case see any t' at all? */
static int row_has_visible(const case_data *d, size_t b, size_t t)
{
    for (size_t t2 = 0; t2 < d->c.T; t2++)
        if (ref_aft_visible(&d->bias, &d->cfg, b, d->c.T, t, t2)) return 1;
    return 0;
}

static const char *impl_name(aft_impl impl)
{
    return impl == AFT_IMPL_FAST ? "fast" : "reference";
}

/* Runs the library once with the given impl and thread count, checks the
 * status, that the inputs are untouched, every output finite, invisible rows
 * exactly 0 and the error within tolerance. Returns 1 on a failure (printed
 * when *reports < MAX_REPORTS), else 0. */
static int check_impl(case_data *d, aft_impl impl, int threads, int *reports)
{
    const op_case *c = &d->c;
    size_t B = c->B, T = c->T, C = c->C, n = B * T * C;
    char what[512];
    describe(what, sizeof what, c, d->kc);

    float *out = xmalloc(n * sizeof *out);
    for (size_t i = 0; i < n; i++) out[i] = NAN;   /* an unwritten output shows as NaN */
    float *q0 = xmalloc(n * sizeof *q0), *k0 = xmalloc(B * T * d->kc * sizeof *k0),
          *v0 = xmalloc(n * sizeof *v0);
    memcpy(q0, d->q, n * sizeof *q0);
    memcpy(k0, d->k, B * T * d->kc * sizeof *k0);
    memcpy(v0, d->v, n * sizeof *v0);

    aft_config cfg = d->cfg;
    cfg.impl = impl;
    cfg.threads = threads;
    aft_error err = {{0}};
    aft_status st = aft_op_forward(out, d->q, d->k, d->v, &d->bias, &cfg, B, T, C, d->kc, &err);
    int bad = 0;
    if (st != AFT_OK) {
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s threads=%d] status %d (%s): %s\n", impl_name(impl),
                          threads, (int)st, err.msg, what);
        bad = 1;
        goto done;
    }
    if (memcmp(q0, d->q, n * sizeof *q0) || memcmp(k0, d->k, B * T * d->kc * sizeof *k0) ||
        memcmp(v0, d->v, n * sizeof *v0)) {
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s] inputs modified: %s\n", impl_name(impl), what);
        bad = 1;
    }

    double maxref = 0.0, maxerr = 0.0;
    size_t worst = 0, nonfinite = 0, first_nonfinite = 0, nonzero_empty = 0, first_nz = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(d->ref[i]) > maxref) maxref = fabs(d->ref[i]);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) {
            if (!nonfinite++) first_nonfinite = i;
            continue;
        }
        double e = fabs((double)out[i] - d->ref[i]);
        if (e > maxerr) {
            maxerr = e;
            worst = i;
        }
    }
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            if (row_has_visible(d, b, t)) continue;
            for (size_t ch = 0; ch < C; ch++)
                if (out[(b * T + t) * C + ch] != 0.0f && !nonzero_empty++)
                    first_nz = (b * T + t) * C + ch;
        }
    double tol = TOL_REL * (maxref > 1.0 ? maxref : 1.0);
    if (nonfinite) {
        size_t i = first_nonfinite;
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s threads=%d] %zu non-finite outputs, first at b=%zu t=%zu "
                          "c=%zu (out %g, ref %.9g): %s\n", impl_name(impl), threads, nonfinite,
                          i / (T * C), i / C % T, i % C, (double)out[i], d->ref[i], what);
        bad = 1;
    }
    if (nonzero_empty) {
        size_t i = first_nz;
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s threads=%d] %zu outputs of rows with nothing visible are "
                          "not 0, first b=%zu t=%zu c=%zu = %g: %s\n", impl_name(impl), threads,
                          nonzero_empty, i / (T * C), i / C % T, i % C, (double)out[i], what);
        bad = 1;
    }
    if (maxerr > tol) {
        size_t i = worst;
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s threads=%d] max |err| %.3g > tol %.3g at b=%zu t=%zu c=%zu "
                          "(out %.9g, ref %.9g): %s\n", impl_name(impl), threads, maxerr, tol,
                          i / (T * C), i / C % T, i % C, (double)out[i], d->ref[i], what);
        bad = 1;
    }
done:
    free(out);
    free(q0);
    free(k0);
    free(v0);
    return bad;
}

/* one case against both implementations; returns the number of failures */
static int run_case(const op_case *c, int *reports)
{
    case_data d;
    build_case(&d, c);
    int fails = check_impl(&d, AFT_IMPL_FAST, c->threads, reports) +
                check_impl(&d, AFT_IMPL_REFERENCE, c->threads, reports);
    free_case(&d);
    return fails;
}

/* the end of every grid test: all cases must have passed */
static void finish(int fails, int cases)
{
    if (fails) fail_msg("%d of %d comparisons failed (see above)", fails, 2 * cases);
}

/* ---------------------------------------------------------------- reference self-checks */

static double max_abs_diff(const double *a, const double *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= m)) m = e;   /* NaN propagates as the maximum */
    }
    return m;
}

static double *randd(rng *r, size_t n, double scale)
{
    double *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_sym(r);
    return x;
}

/* a dense bias: w (tmax x tmax), row t for query t */
static aft_bias dense_bias(const float *w, size_t tmax)
{
    aft_bias b;
    memset(&b, 0, sizeof b);
    b.kind = AFT_BIAS_DENSE;
    b.dense = w;
    b.tmax = tmax;
    return b;
}

static aft_config make_cfg(aft_variant v, size_t window, size_t heads, int causal)
{
    aft_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.full_product = g_full_product;
    cfg.variant = v;
    cfg.window = window;
    cfg.heads = heads;
    cfg.causal = causal;
    cfg.impl = AFT_IMPL_REFERENCE;
    return cfg;
}

/* simple: Y[t,c] = sigmoid(q[t,c]) * sum_t' softmax_t'(k[.,c]) v[t',c], the
 * softmax written out naively (moderate keys, so no overflow) */
static void test_ref_simple_closed_form(void **state)
{
    (void)state;
    const size_t B = 2, T = 9, C = 4;
    rng r = {1};
    double *q = randd(&r, B * T * C, 2), *k = randd(&r, B * T * C, 3),
           *v = randd(&r, B * T * C, 1), *y = xmalloc(B * T * C * sizeof *y);
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_SIMPLE, 0, 0, causal);
        assert_int_equal(ref_aft_op_d(y, q, k, v, &bias, &cfg, B, T, C, C), 0);
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < T; t++)
                for (size_t c = 0; c < C; c++) {
                    size_t last = causal ? t : T - 1;
                    double num = 0, den = 0;
                    for (size_t t2 = 0; t2 <= last; t2++) {
                        size_t i = (b * T + t2) * C + c;
                        num += exp(k[i]) * v[i];
                        den += exp(k[i]);
                    }
                    size_t i = (b * T + t) * C + c;
                    double want = 1.0 / (1.0 + exp(-q[i])) * num / den;
                    assert_true(fabs(y[i] - want) < 1e-13);
                }
    }
    free(q);
    free(k);
    free(v);
    free(y);
}

/* a mask leaving exactly one t' per row: Y = sigmoid(q) * v[t'] whatever the
 * keys and the bias, even at +-500 / +-250 */
static void test_ref_single_visible(void **state)
{
    (void)state;
    const size_t B = 1, T = 11, C = 4, H = 2, s = 4;
    rng r = {2};
    double *q = randd(&r, T * C, 5), *k = randd(&r, T * C, 500), *v = randd(&r, T * C, 1);
    double *y = xmalloc(T * C * sizeof *y);
    float *dense = randf(&r, T * T, 250), *conv = randf(&r, H * (2 * s - 1), 250);
    uint8_t mask[11 * 11];
    size_t pick[11];
    for (size_t t = 0; t < T; t++) {
        /* inside the conv window for the conv case: t' = t +- up to 3 */
        pick[t] = t < 3 ? t + (size_t)(rng_next(&r) % 4) : t - (size_t)(rng_next(&r) % 4);
        for (size_t t2 = 0; t2 < T; t2++) mask[t * T + t2] = t2 == pick[t];
    }
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    bias.mask = mask;
    for (int variant = 0; variant < 2; variant++) {
        aft_config cfg;
        if (variant == 0) {
            bias.kind = AFT_BIAS_DENSE;
            bias.dense = dense;
            bias.tmax = T;
            cfg = make_cfg(AFT_FULL, 0, 0, 0);
        } else {
            bias.kind = AFT_BIAS_CONV;
            bias.conv = conv;
            cfg = make_cfg(AFT_CONV, s, H, 0);
        }
        assert_int_equal(ref_aft_op_d(y, q, k, v, &bias, &cfg, B, T, C, C), 0);
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < C; c++) {
                double want = ref_sigmoid(q[t * C + c]) * v[pick[t] * C + c];
                assert_true(fabs(y[t * C + c] - want) <= 1e-15);
            }
    }
    free(q);
    free(k);
    free(v);
    free(y);
    free(dense);
    free(conv);
}

/* full with a constant bias equals simple (the constant cancels), causal or
 * not, with a mask or not */
static void test_ref_constant_bias_is_simple(void **state)
{
    (void)state;
    const size_t B = 2, T = 13, C = 3;
    rng r = {3};
    double *q = randd(&r, B * T * C, 2), *k = randd(&r, B * T * C, 4), *v = randd(&r, B * T * C, 1);
    double *y1 = xmalloc(B * T * C * sizeof *y1), *y2 = xmalloc(B * T * C * sizeof *y2);
    float dense[13 * 13];
    for (size_t i = 0; i < T * T; i++) dense[i] = 3.25f;
    uint8_t *mask = make_mask(&r, B, T);
    for (int causal = 0; causal <= 1; causal++)
        for (int masked = 0; masked <= 1; masked++) {
            aft_bias b1, b2;
            memset(&b1, 0, sizeof b1);
            b1.kind = AFT_BIAS_DENSE;
            b1.dense = dense;
            b1.tmax = T;
            b1.mask = masked ? mask : NULL;
            b1.mask_batched = 1;
            b2 = b1;
            b2.kind = AFT_BIAS_NONE;
            aft_config full = make_cfg(AFT_FULL, 0, 0, causal), simple = make_cfg(AFT_SIMPLE, 0, 0, causal);
            assert_int_equal(ref_aft_op_d(y1, q, k, v, &b1, &full, B, T, C, C), 0);
            assert_int_equal(ref_aft_op_d(y2, q, k, v, &b2, &simple, B, T, C, C), 0);
            assert_true(max_abs_diff(y1, y2, B * T * C) < 1e-14);
        }
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
    free(mask);
}

/* local(s) on a dense bias equals full on the same bias with the entries at
 * |t - t'| >= s set to 0; s >= T is full itself; s = 0 is simple */
static void test_ref_local_is_banded_full(void **state)
{
    (void)state;
    const size_t B = 1, T = 12, C = 5;
    rng r = {4};
    double *q = randd(&r, T * C, 2), *k = randd(&r, T * C, 4), *v = randd(&r, T * C, 1);
    double *y1 = xmalloc(T * C * sizeof *y1), *y2 = xmalloc(T * C * sizeof *y2);
    float *dense = randf(&r, T * T, 3), *band = xmalloc(T * T * sizeof *band);
    const size_t windows[] = {1, 3, 11, 12, 40};
    for (int causal = 0; causal <= 1; causal++)
        for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
            size_t s = windows[wi];
            for (size_t t = 0; t < T; t++)
                for (size_t t2 = 0; t2 < T; t2++)
                    band[t * T + t2] = (t > t2 ? t - t2 : t2 - t) < s ? dense[t * T + t2] : 0.0f;
            aft_bias b1, b2;
            memset(&b1, 0, sizeof b1);
            b1.kind = AFT_BIAS_DENSE;
            b1.dense = dense;
            b1.tmax = T;
            b2 = b1;
            b2.dense = band;
            aft_config local = make_cfg(AFT_LOCAL, s, 0, causal), full = make_cfg(AFT_FULL, 0, 0, causal);
            assert_int_equal(ref_aft_op_d(y1, q, k, v, &b1, &local, B, T, C, C), 0);
            assert_int_equal(ref_aft_op_d(y2, q, k, v, &b2, &full, B, T, C, C), 0);
            assert_true(max_abs_diff(y1, y2, T * C) < 1e-14);
            if (s >= T) {
                assert_int_equal(ref_aft_op_d(y2, q, k, v, &b1, &full, B, T, C, C), 0);
                assert_true(max_abs_diff(y1, y2, T * C) < 1e-14);
            }
        }
    /* window 0: no band, the simple variant */
    aft_bias b0;
    memset(&b0, 0, sizeof b0);
    b0.kind = AFT_BIAS_DENSE;
    b0.dense = dense;
    b0.tmax = T;
    aft_config local0 = make_cfg(AFT_LOCAL, 0, 0, 0), simple = make_cfg(AFT_SIMPLE, 0, 0, 0);
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &b0, &local0, B, T, C, C), 0);
    assert_int_equal(ref_aft_op_d(y2, q, k, v, &b0, &simple, B, T, C, C), 0);
    assert_true(max_abs_diff(y1, y2, T * C) < 1e-14);
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
    free(dense);
    free(band);
}

/* The rules of aft_config_settle: a conv bias that records its shape gives
 * the window and heads (the same bits as saying them), a one-row bias
 * serves every head (as the same row repeated), conv with window 0 and no
 * bias is simple, and a window wider than the sequence is the sequence. */
static void test_op_settle_rules(void **state)
{
    (void)state;
    const size_t B = 2, T = 37, C = 12, H = 4, S = 3, L = 2 * S - 1, n = B * T * C;
    rng r = {777};
    float *q = randf(&r, n, 2), *k = randf(&r, n, 3), *v = randf(&r, n, 1), *conv = randf(&r, H * L, 1);
    float *wide = xmalloc(H * L * sizeof *wide), *y0 = xmalloc(n * sizeof *y0), *y1 = xmalloc(n * sizeof *y1);
    for (size_t h = 0; h < H; h++) memcpy(wide + h * L, conv, L * sizeof *conv);
    aft_error err = {{0}};
    for (int causal = 0; causal <= 1; causal++) {
        aft_config said = make_cfg(AFT_CONV, S, H, causal), from = make_cfg(AFT_CONV, AFT_WINDOW_FROM_BIAS, 0, causal);
        said.impl = from.impl = AFT_IMPL_FAST;
        aft_bias legacy = {.kind = AFT_BIAS_CONV, .conv = conv};
        aft_bias shaped = {.kind = AFT_BIAS_CONV, .conv = conv, .conv_len = L, .conv_rows = H};
        assert_int_equal(aft_op_forward(y0, q, k, v, &legacy, &said, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &shaped, &from, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        aft_config settled = from;
        assert_int_equal(aft_config_settle(&settled, &shaped, C, C, &err), AFT_OK);
        assert_int_equal(settled.window, S);
        assert_int_equal(settled.heads, H);
        assert_true(settled.threads >= 1);
        /* one row for every head */
        aft_bias one = {.kind = AFT_BIAS_CONV, .conv = conv, .conv_len = L, .conv_rows = 1};
        aft_bias rows = {.kind = AFT_BIAS_CONV, .conv = wide, .conv_len = L, .conv_rows = H};
        aft_config four = make_cfg(AFT_CONV, AFT_WINDOW_FROM_BIAS, H, causal);
        four.impl = AFT_IMPL_FAST;
        assert_int_equal(aft_op_forward(y0, q, k, v, &one, &four, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &rows, &four, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        /* conv, window 0, no bias: simple */
        aft_bias none = {.kind = AFT_BIAS_NONE};
        aft_config c0 = make_cfg(AFT_CONV, 0, H, causal), simple = make_cfg(AFT_SIMPLE, 0, 0, causal);
        c0.impl = simple.impl = AFT_IMPL_FAST;
        assert_int_equal(aft_op_forward(y0, q, k, v, &none, &c0, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &none, &simple, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        settled = c0;
        assert_int_equal(aft_config_settle(&settled, &none, C, C, &err), AFT_OK);
        assert_int_equal(settled.variant, AFT_SIMPLE);
        /* a window wider than the sequence */
        aft_bias seeded = {.kind = AFT_BIAS_SEEDED, .seed = 5, .scale = 0.5f};
        aft_config wide_w = make_cfg(AFT_LOCAL, 1000, 0, causal), all_w = make_cfg(AFT_LOCAL, T, 0, causal);
        wide_w.impl = all_w.impl = AFT_IMPL_FAST;
        assert_int_equal(aft_op_forward(y0, q, k, v, &seeded, &wide_w, B, T, C, C, &err), AFT_OK);
        assert_int_equal(aft_op_forward(y1, q, k, v, &seeded, &all_w, B, T, C, C, &err), AFT_OK);
        assert_memory_equal(y0, y1, n * sizeof *y0);
        assert_int_equal(aft_window_in(1000, T), T);
        assert_int_equal(aft_window_in(3, T), 3);
    }
    free(q); free(k); free(v); free(conv); free(wide); free(y0); free(y1);
}

/* conv with kc == heads equals conv with each head's key copied to all of
 * its channels */
static void test_ref_conv_shared_keys(void **state)
{
    (void)state;
    const size_t B = 2, T = 10, C = 12, H = 4, s = 3, per = C / H;
    rng r = {5};
    double *q = randd(&r, B * T * C, 2), *kh = randd(&r, B * T * H, 4), *v = randd(&r, B * T * C, 1);
    double *kx = xmalloc(B * T * C * sizeof *kx);
    for (size_t i = 0; i < B * T; i++)
        for (size_t c = 0; c < C; c++) kx[i * C + c] = kh[i * H + c / per];
    double *y1 = xmalloc(B * T * C * sizeof *y1), *y2 = xmalloc(B * T * C * sizeof *y2);
    float *conv = randf(&r, H * (2 * s - 1), 2);
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    bias.kind = AFT_BIAS_CONV;
    bias.conv = conv;
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_CONV, s, H, causal);
        assert_int_equal(ref_aft_op_d(y1, q, kh, v, &bias, &cfg, B, T, C, H), 0);
        assert_int_equal(ref_aft_op_d(y2, q, kx, v, &bias, &cfg, B, T, C, C), 0);
        assert_true(max_abs_diff(y1, y2, B * T * C) < 1e-15);
    }
    free(q);
    free(kh);
    free(kx);
    free(v);
    free(y1);
    free(y2);
    free(conv);
}

/* conv on head h equals full, on that head's channels, with the Toeplitz
 * dense bias w[t,t'] = conv[h][t' - t + s - 1] inside the window, 0 outside */
static void test_ref_conv_is_toeplitz_full(void **state)
{
    (void)state;
    const size_t B = 1, T = 9, C = 6, H = 3, per = C / H;
    rng r = {6};
    double *q = randd(&r, T * C, 2), *k = randd(&r, T * C, 4), *v = randd(&r, T * C, 1);
    double *y = xmalloc(T * C * sizeof *y), *yh = xmalloc(T * per * sizeof *yh);
    double *qh = xmalloc(T * per * sizeof *qh), *kh = xmalloc(T * per * sizeof *kh),
           *vh = xmalloc(T * per * sizeof *vh);
    float dense[9 * 9];
    const size_t windows[] = {1, 2, 5, 9, 14};
    for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
        size_t s = windows[wi];
        float *conv = randf(&r, H * (2 * s - 1), 2);
        aft_bias cb;
        memset(&cb, 0, sizeof cb);
        cb.kind = AFT_BIAS_CONV;
        cb.conv = conv;
        aft_config cfg = make_cfg(AFT_CONV, s, H, (int)(wi & 1));
        assert_int_equal(ref_aft_op_d(y, q, k, v, &cb, &cfg, B, T, C, C), 0);
        for (size_t h = 0; h < H; h++) {
            for (size_t t = 0; t < T; t++) {
                for (size_t t2 = 0; t2 < T; t2++) {
                    long off = (long)t2 - (long)t;
                    dense[t * T + t2] = labs(off) < (long)s ? conv[h * (2 * s - 1) + (size_t)(off + (long)s - 1)] : 0.0f;
                }
                for (size_t j = 0; j < per; j++) {
                    qh[t * per + j] = q[t * C + h * per + j];
                    kh[t * per + j] = k[t * C + h * per + j];
                    vh[t * per + j] = v[t * C + h * per + j];
                }
            }
            aft_bias db;
            memset(&db, 0, sizeof db);
            db.kind = AFT_BIAS_DENSE;
            db.dense = dense;
            db.tmax = T;
            aft_config full = make_cfg(AFT_FULL, 0, 0, cfg.causal);
            assert_int_equal(ref_aft_op_d(yh, qh, kh, vh, &db, &full, B, T, per, per), 0);
            for (size_t t = 0; t < T; t++)
                for (size_t j = 0; j < per; j++)
                    assert_true(fabs(yh[t * per + j] - y[t * C + h * per + j]) < 1e-15);
        }
        free(conv);
    }
    free(q);
    free(k);
    free(v);
    free(y);
    free(yh);
    free(qh);
    free(kh);
    free(vh);
}

/* causal equals a lower-triangular mask; a batched mask equals running each
 * batch alone with its slice as a shared mask */
static void test_ref_masks(void **state)
{
    (void)state;
    const size_t B = 3, T = 8, C = 2, n = B * T * C;
    rng r = {7};
    double *q = randd(&r, n, 2), *k = randd(&r, n, 4), *v = randd(&r, n, 1);
    double *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    float *dense = randf(&r, T * T, 2);
    uint8_t tril[8 * 8];
    for (size_t t = 0; t < T; t++)
        for (size_t t2 = 0; t2 < T; t2++) tril[t * T + t2] = t2 <= t;
    aft_bias bias = dense_bias(dense, T);
    aft_config causal = make_cfg(AFT_FULL, 0, 0, 1), plain = make_cfg(AFT_FULL, 0, 0, 0);
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &bias, &causal, B, T, C, C), 0);
    bias.mask = tril;
    assert_int_equal(ref_aft_op_d(y2, q, k, v, &bias, &plain, B, T, C, C), 0);
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);

    uint8_t *mask = make_mask(&r, B, T);
    bias.mask = mask;
    bias.mask_batched = 1;
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &bias, &causal, B, T, C, C), 0);
    for (size_t b = 0; b < B; b++) {
        aft_bias one = bias;
        one.mask = mask + b * T * T;
        one.mask_batched = 0;
        size_t o = b * T * C;
        assert_int_equal(ref_aft_op_d(y2 + o, q + o, k + o, v + o, &one, &causal, 1, T, C, C), 0);
    }
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    /* rows the mask empties ((t + b) % 5 == 2) are exactly zero */
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            if ((t + b) % 5 == 2)
                for (size_t c = 0; c < C; c++) assert_true(y1[(b * T + t) * C + c] == 0.0);
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
    free(dense);
    free(mask);
}

/* Y does not change when a constant is added to all keys of a channel: with
 * +700 an unshifted exp would overflow double, so this checks the max
 * subtraction. Same for the extreme one-huge-key pattern against its closed
 * form on the causal rows before the huge key. */
static void test_ref_shift_invariance(void **state)
{
    (void)state;
    const size_t B = 1, T = 15, C = 3, n = T * C;
    rng r = {8};
    double *q = randd(&r, n, 2), *k = randd(&r, n, 4), *v = randd(&r, n, 1);
    double *k2 = xmalloc(n * sizeof *k2), *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    float *dense = randf(&r, T * T, 250);
    aft_bias bias = dense_bias(dense, T);
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_FULL, 0, 0, causal);
        for (size_t i = 0; i < n; i++) k2[i] = k[i] + (i % C == 1 ? 700.0 : -700.0);
        assert_int_equal(ref_aft_op_d(y1, q, k, v, &bias, &cfg, B, T, C, C), 0);
        assert_int_equal(ref_aft_op_d(y2, q, k2, v, &bias, &cfg, B, T, C, C), 0);
        assert_true(max_abs_diff(y1, y2, n) < 1e-12);
    }
    /* one key +500 at t0, the rest -500, zero bias, causal: rows t < t0 are
     * the plain mean of v over t' <= t, rows t >= t0 are v[t0] (to e^-1000) */
    const size_t t0 = 10;
    for (size_t i = 0; i < n; i++) k2[i] = i / C == t0 ? 500.0 : -500.0;
    bias.kind = AFT_BIAS_NONE;
    aft_config cfg = make_cfg(AFT_SIMPLE, 0, 0, 1);
    assert_int_equal(ref_aft_op_d(y1, q, k2, v, &bias, &cfg, B, T, C, C), 0);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < C; c++) {
            double mean = 0;
            for (size_t t2 = 0; t2 <= t; t2++) mean += v[t2 * C + c];
            mean /= (double)(t + 1);
            double want = ref_sigmoid(q[t * C + c]) * (t < t0 ? mean : v[t0 * C + c]);
            assert_true(fabs(y1[t * C + c] - want) < 1e-14);
        }
    free(q);
    free(k);
    free(v);
    free(k2);
    free(y1);
    free(y2);
    free(dense);
}

/* factored (u, v on a 2^-4 grid, so U V^T is exact in float) and seeded
 * biases equal the dense matrices they describe */
static void test_ref_factored_seeded_are_dense(void **state)
{
    (void)state;
    const size_t B = 2, T = 10, C = 3, n = B * T * C, tmax = 12, rank = 3;
    rng r = {9};
    double *q = randd(&r, n, 2), *k = randd(&r, n, 4), *v = randd(&r, n, 1);
    double *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    float u[12 * 3], vv[12 * 3], dense[12 * 12];
    for (size_t i = 0; i < tmax * rank; i++) {
        u[i] = on_grid(2 * rng_sym(&r), 0x1p-4);
        vv[i] = on_grid(2 * rng_sym(&r), 0x1p-4);
    }
    for (size_t t = 0; t < tmax; t++)
        for (size_t t2 = 0; t2 < tmax; t2++) {
            float s = 0;
            for (size_t j = 0; j < rank; j++) s += u[t * rank + j] * vv[t2 * rank + j];
            dense[t * tmax + t2] = s;
        }
    aft_bias fb, db, sb;
    memset(&fb, 0, sizeof fb);
    db = sb = fb;
    fb.kind = AFT_BIAS_FACTORED;
    fb.u = u;
    fb.v = vv;
    fb.rank = rank;
    fb.tmax = tmax;
    db.kind = AFT_BIAS_DENSE;
    db.dense = dense;
    db.tmax = tmax;
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_FULL, 0, 0, causal);
        assert_int_equal(ref_aft_op_d(y1, q, k, v, &fb, &cfg, B, T, C, C), 0);
        assert_int_equal(ref_aft_op_d(y2, q, k, v, &db, &cfg, B, T, C, C), 0);
        assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    }
    sb.kind = AFT_BIAS_SEEDED;
    sb.seed = 12345;
    sb.scale = 3.0f;
    for (size_t t = 0; t < tmax; t++)
        for (size_t t2 = 0; t2 < tmax; t2++)
            dense[t * tmax + t2] = aft_seeded_bias(sb.seed, sb.scale, t, t2);
    aft_config cfg = make_cfg(AFT_LOCAL, 4, 0, 1);
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &sb, &cfg, B, T, C, C), 0);
    assert_int_equal(ref_aft_op_d(y2, q, k, v, &db, &cfg, B, T, C, C), 0);
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
}

/* the layer reference with identity projections and no biases is the op on
 * Q = K = V = x; output biases add to every row */
static void test_ref_layer_identity(void **state)
{
    (void)state;
    const size_t B = 2, T = 7, D = 5, n = B * T * D;
    rng r = {10};
    float *x = randf(&r, n, 2), eye[5 * 5], bo[5];
    for (size_t i = 0; i < D * D; i++) eye[i] = i / D == i % D ? 1.0f : 0.0f;
    for (size_t i = 0; i < D; i++) bo[i] = (float)(i + 1) * 0.5f;
    double *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    aft_params p;
    memset(&p, 0, sizeof p);
    p.d_model = p.d_hidden = p.k_out = D;
    p.wq = p.wk = p.wv = p.wo = eye;
    p.bias.kind = AFT_BIAS_SEEDED;
    p.bias.seed = 77;
    p.bias.scale = 1.5f;
    aft_config cfg = make_cfg(AFT_FULL, 0, 0, 1);
    assert_int_equal(ref_aft_layer(y1, x, &p, &cfg, B, T), 0);
    assert_int_equal(ref_aft_op(y2, x, x, x, &p.bias, &cfg, B, T, D, D), 0);
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    p.bo = bo;
    assert_int_equal(ref_aft_layer(y1, x, &p, &cfg, B, T), 0);
    for (size_t i = 0; i < n; i++) assert_true(fabs(y1[i] - y2[i] - bo[i % D]) < 1e-15);
    free(x);
    free(y1);
    free(y2);
}

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

/* ---------------------------------------------------------------- the operator */

static const size_t small_T[] = {1, 7, 33, 130};
static const size_t small_C[] = {5, 12};
#define N_OF(a) (sizeof (a) / sizeof *(a))

/* Small grids call the library thousands of times: most calls use one
 * thread so the suite stays fast on a busy machine; every fourth uses all
 * cores (threads = 0) so each variant also runs its parallel path. */
static int grid_threads(int n)
{
    return n % 4 == 0 ? 0 : 1;
}

/* (B, C) pairs cycled through the grids: every T meets each of them */
static const size_t grid_BC[4][2] = {{1, 5}, {3, 12}, {1, 12}, {3, 5}};

/* full, local or simple over windows x causal x mask x T, with (B, C)
 * cycling, for one bias kind */
static void grid_full(aft_variant variant, aft_bias_kind kind, const size_t *windows,
                      size_t nwin, uint64_t seed)
{
    int fails = 0, cases = 0, reports = 0;
    for (size_t wi = 0; wi < nwin; wi++)
        for (int causal = 0; causal <= 1; causal++)
            for (int mask = MASK_NONE; mask <= MASK_BATCHED; mask++)
                for (size_t ti = 0; ti < N_OF(small_T); ti++)
                    for (size_t bc = 0; bc < 2; bc++) {
                        size_t T = small_T[ti];
                        const size_t *BC = grid_BC[(2 * (ti + (size_t)mask + wi) + bc) % 4];
                        /* window codes: 999 means T, 1000 means T + 4 */
                        size_t s = windows[wi] == 1000 ? T + 4 : windows[wi] == 999 ? T : windows[wi];
                        op_case c = {variant, kind, BC[0], T, BC[1], 0, s, 0, causal,
                                     (mask_mode)mask, VALS_NORMAL, seed + (uint64_t)cases,
                                     grid_threads(cases)};
                        fails += run_case(&c, &reports);
                        cases++;
                    }
    finish(fails, cases);
}

static void test_op_full_dense(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_DENSE, w, 1, 100);
}

static void test_op_full_factored(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_FACTORED, w, 1, 200);
}

static void test_op_full_seeded(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_SEEDED, w, 1, 300);
}

/* full with no bias at all (kind NONE: w = 0) */
static void test_op_full_no_bias(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_FULL, AFT_BIAS_NONE, w, 1, 350);
}

/* local windows 0 (= simple), 1, 3, T (999), T + 4 (1000) on each bias kind */
static void test_op_local(void **state)
{
    (void)state;
    const size_t w[] = {0, 1, 3, 999, 1000};
    grid_full(AFT_LOCAL, AFT_BIAS_DENSE, w, N_OF(w), 400);
    grid_full(AFT_LOCAL, AFT_BIAS_FACTORED, w, N_OF(w), 500);
    grid_full(AFT_LOCAL, AFT_BIAS_SEEDED, w, N_OF(w), 600);
}

static void test_op_simple(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid_full(AFT_SIMPLE, AFT_BIAS_NONE, w, 1, 700);
}

/* conv: heads 1, 2, 4 on C = 12 (and heads 1, 5 on C = 5), keys per channel
 * or per head, windows 1, 3, T, T + 4, causal, masks, B 1 and 3 */
static void test_op_conv(void **state)
{
    (void)state;
    const size_t heads12[] = {1, 2, 4}, heads5[] = {1, 5};
    int fails = 0, cases = 0, reports = 0;
    for (size_t ci = 0; ci < N_OF(small_C); ci++) {
        size_t C = small_C[ci];
        const size_t *hs = C == 12 ? heads12 : heads5;
        size_t nh = C == 12 ? N_OF(heads12) : N_OF(heads5);
        for (size_t hi = 0; hi < nh; hi++)
            for (int shared = 0; shared <= 1; shared++)
                for (size_t wi = 0; wi < 4; wi++)
                    for (int causal = 0; causal <= 1; causal++)
                        for (size_t ti = 0; ti < N_OF(small_T); ti++) {
                            size_t T = small_T[ti];
                            size_t s = wi == 0 ? 1 : wi == 1 ? 3 : wi == 2 ? T : T + 4;
                            /* the 6 (mask, B) pairs rotate through the cases;
                             * with T cycling every 4 each T meets each pair */
                            mask_mode mask = (mask_mode)(cases % 3);
                            size_t B = (cases / 3) % 2 ? 3 : 1;
                            op_case c = {AFT_CONV, AFT_BIAS_CONV, B, T, C, hs[hi], s, shared,
                                         causal, mask, VALS_NORMAL, 800 + (uint64_t)cases,
                                         grid_threads(cases)};
                            fails += run_case(&c, &reports);
                            cases++;
                        }
    }
    finish(fails, cases);
}

/* Large T (1000..2000, C = 16) so blocked or tiled kernels cross many block
 * edges; T is prime or odd so no block size divides it. Full and local each
 * run causal and not; one full case carries a mask. */
static void test_op_large(void **state)
{
    (void)state;
    const op_case cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1531, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 901, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 1, 1103, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 902, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1009, 16, 0, 0, 0, 0, MASK_SHARED, VALS_NORMAL, 903, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1999, 16, 0, 37, 0, 1, MASK_NONE, VALS_NORMAL, 904, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 1201, 16, 0, 129, 0, 0, MASK_NONE, VALS_NORMAL, 905, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1103, 16, 4, 50, 1, 1, MASK_NONE, VALS_NORMAL, 906, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 1777, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 907, 0},
    };
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) fails += run_case(&cs[i], &reports);
    finish(fails, (int)N_OF(cs));
}

/* every variant once, for the extreme-value tests */
static void grid_extreme(vals_mode vals, uint64_t seed)
{
    struct { aft_variant v; aft_bias_kind k; size_t heads, window; int shared; } vs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0},    {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0},   {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 9, 0}, {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 20, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},   {AFT_CONV, AFT_BIAS_CONV, 2, 5, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 40, 1},    {AFT_CONV, AFT_BIAS_CONV, 1, 2, 1},
    };
    const size_t Ts[] = {33, 130};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(vs); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++) {
                /* the second size also runs with a batched mask */
                mask_mode mask = ti == 1 ? MASK_BATCHED : MASK_NONE;
                op_case c = {vs[i].v, vs[i].k, 2, Ts[ti], 12, vs[i].heads, vs[i].window,
                             vs[i].shared, causal, mask, vals, seed + (uint64_t)cases,
                             grid_threads(cases)};
                fails += run_case(&c, &reports);
                cases++;
            }
    /* and once at a large T, where blocked kernels take over */
    const op_case big[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1031, 16, 0, 0, 0, 1, MASK_NONE, vals, seed + 500, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1013, 16, 0, 0, 0, 0, MASK_NONE, vals, seed + 501, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1021, 16, 0, 300, 0, vals != VALS_WIDE, MASK_NONE, vals,
         seed + 502, 0},
    };
    for (size_t i = 0; i < N_OF(big); i++, cases++) fails += run_case(&big[i], &reports);
    finish(fails, cases);
}

static void test_op_extreme_wide(void **state)
{
    (void)state;
    grid_extreme(VALS_WIDE, 1000);
}

static void test_op_extreme_one_huge_key(void **state)
{
    (void)state;
    grid_extreme(VALS_ONE_HUGE, 1100);
}

static void test_op_extreme_adversarial(void **state)
{
    (void)state;
    grid_extreme(VALS_ADVERSE, 1200);
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
                fails += run_case(&c, &reports);
                cases++;
            }
    finish(fails, cases);
}

/* Causal local and causal simple split the rows over the threads; a thread
 * starts from the merged left sums of the threads before it. Windows 1, 17
 * and 300 (wider than some T), T from fewer rows than threads to 1001, one
 * to three threads, B and C alternating, every value mode in turn. */
static void test_op_causal_rows(void **state)
{
    (void)state;
    const size_t Ts[] = {5, 130, 1001};
    const size_t ws[] = {1, 17, 300};
    const aft_bias_kind kinds[] = {AFT_BIAS_DENSE, AFT_BIAS_SEEDED, AFT_BIAS_FACTORED};
    const int th[] = {1, 2, 3};
    int fails = 0, cases = 0, reports = 0;
    for (size_t ti = 0; ti < N_OF(Ts); ti++)
        for (size_t wi = 0; wi < N_OF(ws); wi++)
            for (size_t hi = 0; hi < N_OF(th); hi++) {
                size_t B = (cases & 1) ? 3 : 1, C = (cases & 2) ? 16 : 12;
                op_case c = {AFT_LOCAL, kinds[cases % 3], B, Ts[ti], C, 0, ws[wi], 0, 1, MASK_NONE,
                             (vals_mode)(cases % 4), 1500 + (uint64_t)cases, th[hi]};
                fails += run_case(&c, &reports);
                cases++;
            }
    for (size_t ti = 1; ti < N_OF(Ts); ti++)
        for (size_t hi = 1; hi < N_OF(th); hi++) {
            op_case c = {AFT_SIMPLE, AFT_BIAS_NONE, 2, Ts[ti], 16, 0, 0, 0, 1, MASK_NONE,
                         (vals_mode)(cases % 4), 1500 + (uint64_t)cases, th[hi]};
            fails += run_case(&c, &reports);
            cases++;
        }
    finish(fails, cases);
}

/* A key of +inf (simple) or NaN (causal local) makes the row-split paths
 * hand the call to the per-channel kernels: the channels and batches without
 * it still match the reference. */
static void test_op_rows_bad_key(void **state)
{
    (void)state;
    const size_t B = 2, T = 300, C = 8, n = B * T * C;
    const size_t bad_b = 1, bad_c = 2, bad_i = (bad_b * T + 150) * C + bad_c;
    const int th[] = {1, 2, 3};
    rng r = {77};
    float *q = xmalloc(n * sizeof *q), *k = xmalloc(n * sizeof *k), *v = xmalloc(n * sizeof *v),
          *y = xmalloc(n * sizeof *y);
    double *qd = xmalloc(n * sizeof *qd), *kd = xmalloc(n * sizeof *kd), *vd = xmalloc(n * sizeof *vd),
           *yd = xmalloc(n * sizeof *yd);
    double *rq = randd(&r, n, 2), *rk = randd(&r, n, 3), *rv = randd(&r, n, 1);
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)rq[i]; k[i] = (float)rk[i]; v[i] = (float)rv[i];
        qd[i] = q[i]; kd[i] = k[i]; vd[i] = v[i];
    }
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    for (int which = 0; which < 4; which++) {
        /* simple without causality with a +inf key; causal local with NaN,
         * with +inf; causal simple with +inf */
        k[bad_i] = which == 1 ? NAN : INFINITY;
        kd[bad_i] = k[bad_i];
        aft_config cfg = which == 0   ? make_cfg(AFT_SIMPLE, 0, 0, 0)
                         : which == 3 ? make_cfg(AFT_SIMPLE, 0, 0, 1)
                                      : make_cfg(AFT_LOCAL, 9, 0, 1);
        assert_int_equal(ref_aft_op_d(yd, qd, kd, vd, &bias, &cfg, B, T, C, C), 0);
        for (size_t hi = 0; hi < N_OF(th); hi++) {
            cfg.threads = th[hi];
            aft_error err = {{0}};
            assert_int_equal(aft_op_forward(y, q, k, v, &bias, &cfg, B, T, C, C, &err), AFT_OK);
            for (size_t i = 0; i < n; i++) {
                size_t b = i / (T * C), c = i % C;
                /* the bad key's channel too: NaN where the reference is
                 * NaN, else its value (a kernel that missed the key sums
                 * exp(+inf - stabiliser) into NaN or inf, or drops it) */
                int ok = isnan(yd[i]) ? isnan(y[i]) : fabs((double)y[i] - yd[i]) <= TOL_REL;
                if (!ok)
                    fail_msg("%s%s threads=%d b=%zu t=%zu c=%zu: %.9g, reference %.9g", aft_variant_name(cfg.variant),
                             cfg.causal ? " causal" : "", th[hi], b, i / C % T, c, (double)y[i], yd[i]);
            }
        }
    }
    free(q); free(k); free(v); free(y); free(qd); free(kd); free(vd); free(yd);
    free(rq); free(rk); free(rv);
}

/* Causality with a value that is NaN or +inf: the fast kernels' rows
 * before it must not see it (0 * NaN is NaN), so they come out the same to
 * the bit as with that value 0, and the rows from it on, in its channel,
 * are NaN or infinite. Local (dense bias), conv (2 heads) and simple; rows
 * in groups and blocks of every phase; 1-3 threads. Then full, causal, and
 * full with a mask that hides the value's row from every query: the rows
 * that do not see it match within rounding (the dense kernel recomputes
 * them exactly). */
static void test_op_causal_later_value(void **state)
{
    (void)state;
    const size_t T = 300, C = 8, n = T * C, t_bad = 150, c_bad = 2;
    const float bads[] = {NAN, INFINITY};
    rng r = {91};
    float *q = randf(&r, n, 2), *k = randf(&r, n, 3), *v = randf(&r, n, 1), *w = randf(&r, T * T, 1),
          *u = randf(&r, 2 * 9, 1);
    float *y0 = xmalloc(n * sizeof *y0), *y1 = xmalloc(n * sizeof *y1);
    uint8_t *mask = xmalloc(T * T);
    for (size_t i = 0; i < T * T; i++) mask[i] = i % T != t_bad;
    for (int var = 0; var < 5; var++)
        for (size_t bi = 0; bi < N_OF(bads); bi++)
            for (int th = 1; th <= 3; th++) {
                aft_bias bias;
                memset(&bias, 0, sizeof bias);
                aft_config cfg;
                if (var == 0) {
                    cfg = make_cfg(AFT_LOCAL, 9, 0, 1);
                    bias.kind = AFT_BIAS_DENSE;
                    bias.dense = w;
                    bias.tmax = T;
                } else if (var == 1) {
                    cfg = make_cfg(AFT_CONV, 5, 2, 1);
                    bias.kind = AFT_BIAS_CONV;
                    bias.conv = u;
                } else if (var == 2) {
                    cfg = make_cfg(AFT_SIMPLE, 0, 0, 1);
                } else {   /* full: causal, or with the mask */
                    cfg = make_cfg(AFT_FULL, 0, 0, var == 3);
                    bias.kind = AFT_BIAS_DENSE;
                    bias.dense = w;
                    bias.tmax = T;
                    bias.mask = var == 4 ? mask : NULL;
                }
                cfg.impl = AFT_IMPL_FAST;
                cfg.threads = th;
                aft_error err = {{0}};
                v[t_bad * C + c_bad] = 0.0f;
                assert_int_equal(aft_op_forward(y0, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                v[t_bad * C + c_bad] = bads[bi];
                assert_int_equal(aft_op_forward(y1, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                for (size_t i = 0; i < n; i++) {
                    size_t t = i / C, c = i % C;
                    if (var == 4 || (var == 3 && t < t_bad)) {
                        if (!(fabsf(y1[i] - y0[i]) <= 1e-6f + 1e-5f * fabsf(y0[i])))
                            fail_msg("full%s, v = %g at t = %zu, threads %d: row %zu channel %zu is %.9g, %.9g "
                                     "without it", var == 3 ? " causal" : " masked", (double)bads[bi], t_bad, th, t,
                                     c, (double)y1[i], (double)y0[i]);
                        continue;
                    }
                    if (t < t_bad && memcmp(&y0[i], &y1[i], sizeof(float)) != 0)
                        fail_msg("%s, v = %g at t = %zu, threads %d: row %zu channel %zu is %.9g, %.9g without it",
                                 aft_variant_name(cfg.variant), (double)bads[bi], t_bad, th, t, c, (double)y1[i],
                                 (double)y0[i]);
                    if (t >= t_bad && c == c_bad && isfinite(y1[i]))
                        fail_msg("%s, v = %g at t = %zu: row %zu is finite (%.9g)", aft_variant_name(cfg.variant),
                                 (double)bads[bi], t_bad, t, (double)y1[i]);
                }
            }
    free(q); free(k); free(v); free(w); free(u); free(y0); free(y1); free(mask);
}

/* With one head the dense kernel runs its own fused product on AVX-512
 * machines (the grids above take that path there); these cases run the
 * OpenBLAS path it replaces (AFT_KERNEL_BLAS), causal and not, which is
 * also what machines without AVX-512 and several heads use. */
static void test_op_full_blas(void **state)
{
    (void)state;
    g_full_product = AFT_KERNEL_BLAS;
    const aft_bias_kind kinds[] = {AFT_BIAS_DENSE, AFT_BIAS_FACTORED, AFT_BIAS_SEEDED};
    const size_t Ts[] = {7, 130, 600};
    int fails = 0, cases = 0, reports = 0;
    for (int causal = 0; causal <= 1; causal++)
        for (size_t ki = 0; ki < N_OF(kinds); ki++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++)
                for (int mask = MASK_NONE; mask <= MASK_BATCHED; mask++) {
                    op_case c = {AFT_FULL, kinds[ki], (cases & 1) ? 2 : 1, Ts[ti], (cases & 2) ? 16 : 12, 0, 0, 0,
                                 causal, (mask_mode)mask, (vals_mode)(cases % 4), 1600 + (uint64_t)cases,
                                 (cases & 1) ? 2 : 1};
                    fails += run_case(&c, &reports);
                    cases++;
                }
    g_full_product = AFT_KERNEL_AUTO;
    finish(fails, cases);
}

/* A bias whose row maxima rise with every 256-key chunk (once by 100 nats):
 * the fused product keeps a running maximum per row and brings the sums so
 * far down each time it rises, by factors from exp(-5) to below FLT_MIN;
 * each chunk still matters to the output at 1e-2 to 1e-9 relative, so a
 * factor missed or misapplied shows. Fused and OpenBLAS paths, causal and
 * not, lengths across one to five chunks, masks, B > 1. */
static void test_op_full_rising_bias(void **state)
{
    (void)state;
    const size_t Ts[] = {255, 257, 600, 1031};
    int fails = 0, cases = 0, reports = 0;
    for (int blas = 0; blas <= 1; blas++) {
        if (blas) g_full_product = AFT_KERNEL_BLAS;
        for (int causal = 0; causal <= 1; causal++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++) {
                mask_mode mask = ti == 2 ? MASK_SHARED : MASK_NONE;
                op_case c = {AFT_FULL, AFT_BIAS_DENSE, ti == 1 ? 2 : 1, Ts[ti], 16, 0, 0, 0, causal, mask,
                             VALS_RISING, 2100 + (uint64_t)cases, (cases & 1) ? 2 : 1};
                fails += run_case(&c, &reports);
                cases++;
            }
        g_full_product = AFT_KERNEL_AUTO;
    }
    finish(fails, cases);
}

/* Full with a bias holding NaN (either sign), +inf and -inf, against the
 * float64 reference: there a row that sees a NaN or +inf entry of w has a
 * NaN denominator and comes out 0, as a row that sees nothing does, and a
 * -inf entry only drops its key; aft must agree. The short exponential
 * aft takes for rows of w - r without NaN would turn a NaN with its sign
 * bit set (-nan) into 0 and drop it: the check before it keeps those rows
 * as the reference has them. Fused and OpenBLAS paths, causal and not, 1-2
 * threads; bad entries early, late (past the first 256-key chunk) and at
 * the diagonal, and a row with every kind. */
static void test_op_full_bad_bias(void **state)
{
    (void)state;
    const size_t T = 300, C = 8, n = T * C;
    rng r = {123};
    float *q = randf(&r, n, 2), *k = randf(&r, n, 3), *v = randf(&r, n, 1), *w = randf(&r, T * T, 2);
    float *y = xmalloc(n * sizeof *y);
    double *qd = xmalloc(n * sizeof *qd), *kd = xmalloc(n * sizeof *kd), *vd = xmalloc(n * sizeof *vd),
           *yd = xmalloc(n * sizeof *yd);
    for (size_t i = 0; i < n; i++) { qd[i] = q[i]; kd[i] = k[i]; vd[i] = v[i]; }
    /* (row, column, value) */
    const struct { size_t t, j; float x; } bad[] = {
        {5, 2, NAN}, {40, 270, NAN}, {77, 77, INFINITY}, {120, 3, INFINITY}, {200, 280, INFINITY},
        {150, 10, -INFINITY}, {151, 151, -INFINITY}, {260, 1, NAN}, {260, 2, INFINITY}, {260, 3, -INFINITY},
        {90, 30, -NAN}, {210, 290, -NAN},   /* the sign bit set: bits above every negative float's */
    };
    for (size_t i = 0; i < N_OF(bad); i++) w[bad[i].t * T + bad[i].j] = bad[i].x;
    aft_bias bias = dense_bias(w, T);
    for (int blas = 0; blas <= 1; blas++) {
        if (blas) g_full_product = AFT_KERNEL_BLAS;
        for (int causal = 0; causal <= 1; causal++) {
            aft_config cfg = make_cfg(AFT_FULL, 0, 0, causal);
            assert_int_equal(ref_aft_op_d(yd, qd, kd, vd, &bias, &cfg, 1, T, C, C), 0);
            for (int th = 1; th <= 2; th++) {
                cfg.impl = AFT_IMPL_FAST;
                cfg.threads = th;
                aft_error err = {{0}};
                assert_int_equal(aft_op_forward(y, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                for (size_t i = 0; i < n; i++) {
                    int ok = isnan(yd[i]) ? isnan(y[i]) : fabs((double)y[i] - yd[i]) <= TOL_REL;
                    if (!ok)
                        fail_msg("full%s%s threads=%d t=%zu c=%zu: %.9g, reference %.9g", causal ? " causal" : "",
                                 blas ? " (OpenBLAS)" : "", th, i / C, i % C, (double)y[i], yd[i]);
                }
            }
        }
        g_full_product = AFT_KERNEL_AUTO;
    }
    free(q); free(k); free(v); free(w); free(y); free(qd); free(kd); free(vd); free(yd);
}

/* The outputs with cfg.threads = 1, 2 and 0 agree to 1e-6 relative. */
static void test_op_threads(void **state)
{
    (void)state;
    const op_case cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 2, 613, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 1301, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 3, 257, 12, 0, 0, 0, 0, MASK_BATCHED, VALS_NORMAL, 1302, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 2, 701, 16, 0, 45, 0, 0, MASK_NONE, VALS_NORMAL, 1303, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 509, 16, 0, 0, 0, 1, MASK_SHARED, VALS_NORMAL, 1304, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 3, 1000, 16, 0, 0, 0, 0, MASK_NONE, VALS_WIDE, 1306, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 401, 16, 4, 33, 1, 0, MASK_NONE, VALS_NORMAL, 1305, 0},
    };
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    int fails = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        case_data d;
        build_case(&d, &cs[i]);
        size_t n = cs[i].B * cs[i].T * cs[i].C;
        float *o1 = xmalloc(n * sizeof *o1), *o2 = xmalloc(n * sizeof *o2);
        for (size_t ii = 0; ii < N_OF(impls); ii++) {
            const int threads[] = {2, 0};
            aft_config cfg = d.cfg;
            cfg.impl = impls[ii];
            cfg.threads = 1;
            aft_error err = {{0}};
            assert_int_equal(aft_op_forward(o1, d.q, d.k, d.v, &d.bias, &cfg, cs[i].B, cs[i].T,
                                            cs[i].C, d.kc, &err), AFT_OK);
            double m = 1.0;
            for (size_t j = 0; j < n; j++)
                if (fabs(o1[j]) > m) m = fabs(o1[j]);
            for (size_t th = 0; th < N_OF(threads); th++) {
                cfg.threads = threads[th];
                assert_int_equal(aft_op_forward(o2, d.q, d.k, d.v, &d.bias, &cfg, cs[i].B,
                                                cs[i].T, cs[i].C, d.kc, &err), AFT_OK);
                double e = 0;
                for (size_t j = 0; j < n; j++) {
                    double dj = fabs((double)o1[j] - (double)o2[j]);
                    if (!(dj <= e)) e = dj;
                }
                if (!(e <= THREAD_TOL * m)) {
                    char what[512];
                    describe(what, sizeof what, &cs[i], d.kc);
                    print_message("FAIL [%s] threads=1 vs threads=%d differ by %.3g (max|out| %.3g): %s\n",
                                  impl_name(impls[ii]), threads[th], e, m, what);
                    fails++;
                }
            }
        }
        free(o1);
        free(o2);
        free_case(&d);
    }
    if (fails) fail_msg("%d thread comparisons failed", fails);
}

/* ---------------------------------------------------------------- the projections */

/* aft_linear (linear.c) with its own kernel forced (every build, whatever
 * the default there), with OpenBLAS, and as the default picks, against
 * double loops written here: M, K, N on and off the tile sizes (rows of 6
 * or 12, 16 or 32 features, 256 inputs a block, 96 rows a block), strides
 * wider than the rows, with and without bias, 1-3 threads. The error bound
 * is the float summation's: (K + 2) eps sum |x w|. The strides' gaps and the
 * rows past M hold a sentinel that must survive, and the own kernel's rows
 * are the same bits whatever the thread count. */
static void test_linear(void **state)
{
    (void)state;
    const size_t Ms[] = {1, 5, 6, 7, 13, 97, 200};
    const size_t Ks[] = {1, 3, 256, 257, 600};
    const size_t Ns[] = {1, 15, 16, 17, 40};
    const aft_kernel modes[] = {AFT_KERNEL_OWN, AFT_KERNEL_BLAS, AFT_KERNEL_AUTO};
    const float sentinel = -12345.0f;
    int fails = 0, cases = 0, reports = 0;
    rng r = {4242};
    for (size_t mi = 0; mi < N_OF(Ms); mi++)
        for (size_t ki = 0; ki < N_OF(Ks); ki++)
            for (size_t ni = 0; ni < N_OF(Ns); ni++) {
                size_t M = Ms[mi], K = Ks[ki], N = Ns[ni], ldx = K + (cases % 3), ldy = N + (cases % 2) * 5;
                int with_bias = cases % 4 != 1;
                float *x = randf(&r, (M + 1) * ldx, 2.0), *w = randf(&r, N * K, 1.0), *b = randf(&r, N, 3.0);
                double *ref = xmalloc(M * N * sizeof *ref), *mag = xmalloc(M * N * sizeof *mag);
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++) {
                        double s = with_bias ? b[n] : 0.0, a = fabs(s);
                        for (size_t i = 0; i < K; i++) {
                            s += (double)x[m * ldx + i] * (double)w[n * K + i];
                            a += fabs((double)x[m * ldx + i] * (double)w[n * K + i]);
                        }
                        ref[m * N + n] = s;
                        mag[m * N + n] = a;
                    }
                size_t ny = (M + 1) * ldy;
                float *y = xmalloc(ny * sizeof *y), *y1 = xmalloc(ny * sizeof *y1), *y2 = xmalloc(ny * sizeof *y2),
                      *y3 = xmalloc(ny * sizeof *y3);
                for (size_t mo = 0; mo < N_OF(modes); mo++)
                    for (int th = 1; th <= 3; th++) {
                        char what[200];
                        snprintf(what, sizeof what, "linear M=%zu K=%zu N=%zu ldx=%zu ldy=%zu bias=%d mode=%d threads=%d",
                                 M, K, N, ldx, ldy, with_bias, modes[mo], th);
                        aft_linear l;
                        aft_error err = {{0}};
                        assert_int_equal(aft_linear_init(&l, w, with_bias ? b : NULL, N, K, modes[mo], th, &err), AFT_OK);
                        if (modes[mo] == AFT_KERNEL_OWN && !l.pk) fail_msg("the own kernel was not packed: %s", what);
                        /* packed weights on a cache line: a token's products
                         * stream through them with 64-byte loads */
                        if (l.pk && ((uintptr_t)l.pk % 64 != 0 || (uintptr_t)l.bpad % 64 != 0))
                            fail_msg("packed weights not on a cache line (%p, %p): %s", (void *)l.pk, (void *)l.bpad,
                                     what);
                        for (size_t i = 0; i < ny; i++) y[i] = sentinel;
                        aft_linear_apply(&l, M, x, ldx, y, ldy);
                        int bad = 0;
                        /* x read in place (the layer's output projection):
                         * the same bits, nothing written outside y */
                        for (size_t i = 0; i < ny; i++) y2[i] = sentinel;
                        aft_linear_apply_x(&l, M, x, ldx, y2, ldy, 1);
                        if (memcmp(y, y2, ny * sizeof *y) != 0) {
                            bad = 1;
                            if (reports++ < MAX_REPORTS)
                                print_message("FAIL x in place: not the bits of x packed: %s\n", what);
                        }
                        /* from W^T, as the backward's dy Wo and dQKV Wcat
                         * are run (no bias): aft's kernel packs it as it packs
                         * W, so the same bits; OpenBLAS within the tolerance */
                        if (!with_bias && !bad) {
                            size_t ldwt = N + 3;
                            float *wt = xmalloc(K * ldwt * sizeof *wt);
                            for (size_t i = 0; i < K; i++)
                                for (size_t n = 0; n < N; n++) wt[i * ldwt + n] = w[n * K + i];
                            aft_linear lt;
                            assert_int_equal(aft_linear_init_t(&lt, wt, ldwt, N, K, modes[mo], th, &err), AFT_OK);
                            if (!lt.pk != !l.pk) fail_msg("W^T packed unlike W: %s", what);
                            for (size_t i = 0; i < ny; i++) y2[i] = sentinel;
                            aft_linear_apply_x(&lt, M, x, ldx, y2, ldy, th == 2);
                            aft_linear_free(&lt);
                            free(wt);
                            for (size_t i = 0; i < ny && !bad; i++) {
                                size_t m = i / ldy, n = i % ldy;
                                int in = m < M && n < N;
                                double tol = in ? (double)(K + 2) * 0x1p-24 * mag[m * N + n] + 1e-30 : 0.0;
                                if (l.pk ? y2[i] != y[i] : in ? !(fabs((double)y2[i] - ref[m * N + n]) <= tol)
                                                              : y2[i] != sentinel) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL from W^T at m=%zu n=%zu (%.9g, from W %.9g): %s\n", m,
                                                      n, (double)y2[i], (double)y[i], what);
                                }
                            }
                        }
                        /* views of features [f0, N) (in the packing, or
                         * packed anew off a panel's edge): the bits of W's
                         * rows from f0 set up on their own, in y's columns */
                        const size_t f0s[] = {16, 1};
                        for (size_t fi = 0; fi < N_OF(f0s) && !bad; fi++) {
                            size_t f0 = f0s[fi];
                            if (f0 >= N) continue;
                            aft_linear v, sub;
                            assert_int_equal(aft_linear_view(&v, &l, f0, N - f0, &err), AFT_OK);
                            assert_int_equal(aft_linear_init(&sub, w + f0 * K, with_bias ? b + f0 : NULL, N - f0, K,
                                                             modes[mo], th, &err), AFT_OK);
                            for (size_t i = 0; i < ny; i++) y2[i] = y3[i] = sentinel;
                            aft_linear_apply(&v, M, x, ldx, y2, ldy);
                            aft_linear_apply(&sub, M, x, ldx, y3, ldy);
                            aft_linear_free(&v);
                            aft_linear_free(&sub);
                            if (memcmp(y3, y2, ny * sizeof *y) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL view from %zu: not the bits of its rows alone: %s\n", f0, what);
                            }
                            /* and aft's kernel gives a column the same bits
                             * whatever the columns beside it (OpenBLAS need not) */
                            for (size_t m = 0; m < M && !bad && l.pk; m++)
                                for (size_t n = f0; n < N; n++)
                                    if (y2[m * ldy + n - f0] != y[m * ldy + n]) {
                                        bad = 1;
                                        if (reports++ < MAX_REPORTS)
                                            print_message("FAIL view from %zu: column %zu is not the whole's: %s\n",
                                                          f0, n, what);
                                        break;
                                    }
                        }
                        /* each row alone (a token at a time: the one-row
                         * path) gives the bits it got among all M rows */
                        for (size_t m = 0; m < M && !bad && modes[mo] == AFT_KERNEL_OWN; m++) {
                            float row[64];
                            aft_linear_apply(&l, 1, x + m * ldx, ldx, row, N);
                            if (memcmp(row, y + m * ldy, N * sizeof *row) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL row %zu alone: not the bits it had among %zu: %s\n", m, M,
                                                  what);
                            }
                        }
                        aft_linear_free(&l);
                        for (size_t i = 0; i < ny && !bad; i++) {
                            size_t m = i / ldy, n = i % ldy;
                            if (m >= M || n >= N) {
                                if (y[i] != sentinel) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL wrote outside the rows at m=%zu n=%zu: %s\n", m, n, what);
                                }
                                continue;
                            }
                            double e = fabs((double)y[i] - ref[m * N + n]);
                            double tol = (double)(K + 2) * 0x1p-24 * mag[m * N + n] + 1e-30;
                            if (!(e <= tol)) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL |err| %.3g > %.3g at m=%zu n=%zu (y %.9g ref %.9g): %s\n", e,
                                                  tol, m, n, (double)y[i], ref[m * N + n], what);
                            }
                        }
                        if (!bad && modes[mo] == AFT_KERNEL_OWN) {
                            if (th == 1) memcpy(y1, y, ny * sizeof *y);
                            else if (memcmp(y1, y, ny * sizeof *y) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL not the bits of one thread: %s\n", what);
                            }
                        }
                        fails += bad;
                        cases++;
                    }
                free(x); free(w); free(b); free(ref); free(mag); free(y); free(y1); free(y2); free(y3);
            }
    /* a view past the product's features is refused */
    {
        float w[2 * 32] = {0};
        aft_linear l, v;
        aft_error err = {{0}};
        assert_int_equal(aft_linear_init(&l, w, NULL, 32, 2, AFT_KERNEL_OWN, 1, &err), AFT_OK);
        assert_int_equal(aft_linear_view(&v, &l, 16, 17, &err), AFT_ERR_ARG);
        assert_int_equal(aft_linear_view(&v, &l, 33, 0, &err), AFT_ERR_ARG);
        aft_linear_free(&l);
        /* and any view of a product given W^T */
        assert_int_equal(aft_linear_init_t(&l, w, 32, 32, 2, AFT_KERNEL_OWN, 1, &err), AFT_OK);
        assert_int_equal(aft_linear_view(&v, &l, 0, 16, &err), AFT_ERR_ARG);
        aft_linear_free(&l);
    }
    finish(fails, cases);
}

/* ---------------------------------------------------------------- the layer */

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;
    size_t heads, window;
    int shared_keys;
} layer_variant;

/* the streamed causal path (test_layer_streamed): chunks of this many rows
 * for the fast impl, which must then take that path (0: aft_layer_forward);
 * and the scale of the key biases (large ones make the left sums' maxima
 * jump at chunk boundaries) */
static size_t g_chunk = 0;
static double g_key_bias = 0.5;

/* a layer's parameters with the given weights, nothing else set */
static aft_params layer_params(size_t D, size_t C, const float *wq, const float *wk, const float *wv,
                               const float *wo)
{
    aft_params p;
    memset(&p, 0, sizeof p);
    p.d_model = D;
    p.d_hidden = C;
    p.wq = wq;
    p.wk = wk;
    p.wv = wv;
    p.wo = wo;
    return p;
}

/* weights ~ U[-1,1] / sqrt(fan in), so activations stay O(1) */
static int run_layer_case(const layer_variant *lv, size_t B, size_t T, size_t D, size_t C,
                          int with_biases, int causal, mask_mode mask, uint64_t seed, int threads,
                          int *reports)
{
    rng r = {seed};
    size_t kc = lv->shared_keys ? lv->heads : C;
    float *x = randf(&r, B * T * D, 1.5);
    float *wq = randf(&r, C * D, 1 / sqrt((double)D)), *wk = randf(&r, kc * D, 2 / sqrt((double)D)),
          *wv = randf(&r, C * D, 1 / sqrt((double)D)), *wo = randf(&r, D * C, 1 / sqrt((double)C));
    float *bq = randf(&r, C, 0.5), *bk = randf(&r, kc, g_key_bias), *bv = randf(&r, C, 0.5),
          *bo = randf(&r, D, 0.5);
    /* bias storage: big enough for every kind used below */
    size_t tmax = T + 1;
    float *dense = randf(&r, tmax * tmax, 1), *fu = randf(&r, tmax * 2, 0.8),
          *fv = randf(&r, tmax * 2, 0.8);
    float *conv = lv->variant == AFT_CONV ? randf(&r, lv->heads * (2 * lv->window - 1), 1) : NULL;
    uint8_t *m = mask == MASK_NONE ? NULL : make_mask(&r, mask == MASK_BATCHED ? B : 1, T);

    aft_params p = layer_params(D, C, wq, wk, wv, wo);
    p.k_out = kc;
    if (with_biases) {
        p.bq = bq;
        p.bk = bk;
        p.bv = bv;
        p.bo = bo;
    }
    p.bias.kind = lv->kind;
    p.bias.dense = dense;
    p.bias.tmax = tmax;
    p.bias.u = fu;
    p.bias.v = fv;
    p.bias.rank = 2;
    p.bias.seed = seed;
    p.bias.scale = 1.0f;
    p.bias.conv = conv;
    p.bias.mask = m;
    p.bias.mask_batched = mask == MASK_BATCHED;
    aft_config cfg = make_cfg(lv->variant, lv->window, lv->heads, causal);
    cfg.threads = threads;

    size_t n = B * T * D;
    double *ref = xmalloc(n * sizeof *ref);
    float *y = xmalloc(n * sizeof *y);
    char what[512];
    snprintf(what, sizeof what,
             "layer variant=%s bias=%s B=%zu T=%zu D=%zu C=%zu k_out=%zu heads=%zu window=%zu "
             "causal=%d mask=%s biases=%s seed=%llu threads=%d",
             aft_variant_name(lv->variant), kind_names[lv->kind], B, T, D, C, kc, lv->heads,
             lv->window, causal, mask_names[mask], with_biases ? "yes" : "NULL",
             (unsigned long long)seed, threads);
    if (ref_aft_layer(ref, x, &p, &cfg, B, T) != 0) fail_msg("reference refused: %s", what);
    double maxref = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    double tol = TOL_REL * (maxref > 1 ? maxref : 1);

    int fails = 0;
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        cfg.impl = impls[ii];
        for (size_t i = 0; i < n; i++) y[i] = NAN;
        aft_error err = {{0}};
        int streamed = 0, chunked = g_chunk && impls[ii] == AFT_IMPL_FAST;
        aft_status st = chunked ? aft_layer_forward_chunked(y, x, &p, &cfg, B, T, g_chunk, NULL, &streamed, &err)
                                : aft_layer_forward(y, x, &p, &cfg, B, T, &err);
        if (st == AFT_OK && chunked && !streamed) {
            if ((*reports)++ < MAX_REPORTS)
                print_message("FAIL [%s] chunks of %zu rows: the streamed path was not taken: %s\n",
                              impl_name(impls[ii]), g_chunk, what);
            fails++;
            continue;
        }
        if (st != AFT_OK) {
            if ((*reports)++ < MAX_REPORTS)
                print_message("FAIL [%s] status %d (%s): %s\n", impl_name(impls[ii]), (int)st,
                              err.msg, what);
            fails++;
            continue;
        }
        double e = 0;
        size_t worst = 0;
        for (size_t i = 0; i < n; i++) {
            double di = fabs((double)y[i] - ref[i]);
            if (!(di <= e)) {   /* NaN counts as the worst */
                e = di;
                worst = i;
                if (isnan(di)) break;
            }
        }
        if (!(e <= tol)) {
            if ((*reports)++ < MAX_REPORTS)
                print_message("FAIL [%s] max |err| %.3g > tol %.3g at b=%zu t=%zu d=%zu (y %.9g, "
                              "ref %.9g): %s\n", impl_name(impls[ii]), e, tol, worst / (T * D),
                              worst / D % T, worst % D, (double)y[worst], ref[worst], what);
            fails++;
        }
    }
    free(x);
    free(wq);
    free(wk);
    free(wv);
    free(wo);
    free(bq);
    free(bk);
    free(bv);
    free(bo);
    free(dense);
    free(fu);
    free(fv);
    free(conv);
    free(m);
    free(ref);
    free(y);
    return fails;
}

/* d_hidden != d_model both ways, projection biases present or NULL */
static void test_layer(void **state)
{
    (void)state;
    const layer_variant lvs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0},   {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0},  {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 3, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 1, 0},  {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 5, 0},    {AFT_CONV, AFT_BIAS_CONV, 4, 5, 1},
        {AFT_CONV, AFT_BIAS_CONV, 2, 40, 1},
    };
    const size_t dims[][2] = {{10, 12}, {16, 8}};   /* (D, C) */
    const size_t Ts[] = {7, 33};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(lvs); i++)
        for (size_t di = 0; di < N_OF(dims); di++)
            for (int with_biases = 0; with_biases <= 1; with_biases++)
                for (int causal = 0; causal <= 1; causal++) {
                    size_t B = (cases & 1) ? 3 : 1, T = Ts[(cases >> 1) & 1];
                    mask_mode mask = (mask_mode)(cases % 3);
                    fails += run_layer_case(&lvs[i], B, T, dims[di][0], dims[di][1], with_biases,
                                            causal, mask, 2000 + (uint64_t)cases, 0, &reports);
                    cases++;
                }
    finish(fails, cases);
}

/* Short sequences, two or more, longer than a chunk (layer.c,
 * layer_sequences): each thread runs whole sequences, each sequence's own
 * mask; 2 and 3 threads, the sequences not a multiple of them. */
static void test_layer_sequences(void **state)
{
    (void)state;
    const layer_variant lvs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0}, {AFT_LOCAL, AFT_BIAS_DENSE, 0, 9, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 3, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 5, 0},
    };
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(lvs); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (int th = 2; th <= 3; th++) {
                mask_mode mask = (mask_mode)(cases % 3);
                fails += run_layer_case(&lvs[i], 5, 130, 12, 8, causal, causal, mask, 2700 + (uint64_t)cases, th,
                                        &reports);
                cases++;
            }
    finish(fails, cases);
}

/* The layer's products are split over the threads by rows (many rows), by
 * columns (few rows, wide products) or not at all (both small); each shape
 * here takes one of those ways for Q/K/V or the output with 2 or 3 threads,
 * and one thread as the baseline. */
static void test_layer_products_split(void **state)
{
    (void)state;
    const layer_variant lv[] = {{AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0}};
    /* (B, T, D, C): Q/K/V is (B T) x 3C, the output (B T) x D */
    const size_t shapes[][4] = {
        {1, 20, 16, 48},    /* 20 rows, 144 columns: Q/K/V split by columns */
        {1, 9, 100, 12},    /* 9 rows, output 100 columns: split by columns */
        {2, 70, 24, 20},    /* 140 rows: split by rows */
        {1, 5, 8, 8},       /* too small to split */
    };
    const int th[] = {1, 2, 3};
    int fails = 0, cases = 0, reports = 0;
    for (size_t si = 0; si < N_OF(shapes); si++)
        for (size_t li = 0; li < N_OF(lv); li++)
            for (size_t hi = 0; hi < N_OF(th); hi++) {
                const size_t *sh = shapes[si];
                fails += run_layer_case(&lv[li], sh[0], sh[1], sh[2], sh[3], 1, (int)(hi & 1), MASK_NONE,
                                        2500 + (uint64_t)cases, th[hi], &reports);
                cases++;
            }
    finish(fails, cases);
}

/* The streamed paths (layer.c): causal local, simple and conv with no mask
 * (the window's last rows kept as a halo, the left running sums carried
 * from chunk to chunk); the same without causality (K, V whole, the right
 * sums of the keys after each chunk added up from the end); and simple
 * without causality (softmax sums carried, folded into the output weights
 * at the end). Small chunks put many
 * boundaries in short sequences: T not a multiple of the chunk, a chunk as
 * wide as the window, B > 1, 1-3 threads, and key biases up to 200 (the
 * sums' maxima jump at boundaries). */
static void test_layer_streamed(void **state)
{
    (void)state;
    const layer_variant lvs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0},   {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 5, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 2, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 0, 0},   {AFT_CONV, AFT_BIAS_CONV, 1, 4, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 3, 0},     {AFT_CONV, AFT_BIAS_CONV, 4, 2, 0},
    };
    const size_t chunks[] = {5, 8, 16};
    const size_t Ts[] = {37, 64, 17};
    const double kb[] = {0.5, 200.0};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(lvs); i++)
        for (size_t ci = 0; ci < N_OF(chunks); ci++)
            for (size_t ki = 0; ki < N_OF(kb); ki++) {
                if (chunks[ci] < lvs[i].window) continue;
                size_t B = (cases & 1) ? 2 : 1, T = Ts[cases % 3];
                g_chunk = chunks[ci];
                g_key_bias = kb[ki];
                fails += run_layer_case(&lvs[i], B, T, 12, 8, 1, 1, MASK_NONE, 3000 + (uint64_t)cases,
                                        1 + cases % 3, &reports);
                cases++;
                /* without causality: a global softmax where w = 0 everywhere,
                 * else K, V whole and the right sums carried in from the end */
                fails += run_layer_case(&lvs[i], B, T, 12, 8, 1, 0, MASK_NONE, 3000 + (uint64_t)cases,
                                        1 + cases % 3, &reports);
                cases++;
            }
    g_chunk = 0;
    g_key_bias = 0.5;
    finish(fails, cases);
}

/* The chunked paths (layer.c) run each chunk on one thread (the causal
 * pipeline: whichever thread is free next); chunk j's causal operator runs
 * on the carry and halo rows chunk j - 1 left, in another thread's buffer:
 * whatever the thread count, the output must be the same bits, at
 * the default chunk size and at a small one (many chunks per thread, the
 * buffers reused often), for local and for conv with two heads, B = 2, T
 * not a multiple of the chunk. A halo read from the wrong buffer, or a
 * carry taken before it was ready, would show as a difference; that each
 * result is right is test_layer_streamed's part. Simple, local and conv
 * without causality go through chunks the same way (each chunk's sums, or
 * the running sums of the keys before and after it, made first and added
 * up in order) and must give the same bits too; all with aft's projection
 * kernel and with OpenBLAS's. */
static void test_layer_pipeline_threads(void **state)
{
    (void)state;
    const size_t B = 2, T = 777, D = 24, C = 16;
    rng r = {91};
    float *x = randf(&r, B * T * D, 1.0), *wq = randf(&r, C * D, 0.4), *wk = randf(&r, C * D, 0.4),
          *wv = randf(&r, C * D, 0.4), *wo = randf(&r, D * C, 0.4), *dense = randf(&r, T * T, 1.0),
          *conv = randf(&r, 2 * (2 * 6 - 1), 1.0);
    aft_params p = layer_params(D, C, wq, wk, wv, wo);
    float *y1 = xmalloc(B * T * D * sizeof(float)), *yn = xmalloc(B * T * D * sizeof(float));
    /* local and conv with and without causality, simple without */
    const aft_variant vs[] = {AFT_LOCAL, AFT_CONV, AFT_SIMPLE, AFT_LOCAL, AFT_CONV};
    const int causal[] = {1, 1, 0, 0, 0};
    enum { NV = 5 };
    for (int pass = 0; pass < 2 * NV; pass++) {
        /* the second half with OpenBLAS for the projections (the default
         * with AVX-512 or without AVX), whose small products take other
         * paths */
        int vi = pass % NV;

        aft_config cfg = vs[vi] == AFT_SIMPLE ? make_cfg(AFT_SIMPLE, 0, 0, 0)
                         : vs[vi] == AFT_CONV ? make_cfg(AFT_CONV, 6, 2, causal[vi]) : make_cfg(AFT_LOCAL, 5, 0, causal[vi]);
        cfg.impl = AFT_IMPL_FAST;
        cfg.projections = pass >= NV ? AFT_KERNEL_BLAS : AFT_KERNEL_AUTO;
        p.bias = (aft_bias){0};
        p.bias.kind = vs[vi] == AFT_SIMPLE ? AFT_BIAS_NONE : vs[vi] == AFT_CONV ? AFT_BIAS_CONV : AFT_BIAS_DENSE;
        p.bias.dense = vs[vi] == AFT_LOCAL ? dense : NULL;
        p.bias.conv = vs[vi] == AFT_CONV ? conv : NULL;
        p.bias.tmax = T;
        const size_t chunks[] = {AFT_LAYER_CHUNK_AUTO, 7};
        for (size_t ci = 0; ci < N_OF(chunks); ci++)
            for (int th = 1; th <= 4; th++) {
                cfg.threads = th;
                float *y = th == 1 ? y1 : yn;
                for (size_t i = 0; i < B * T * D; i++) y[i] = NAN;
                aft_error err = {{0}};
                int streamed = -1;
                assert_int_equal(aft_layer_forward_chunked(y, x, &p, &cfg, B, T, chunks[ci], NULL, &streamed, &err),
                                 AFT_OK);
                assert_int_equal(streamed, 1);
                if (th == 1)
                    for (size_t i = 0; i < B * T * D; i++) assert_true(isfinite(y1[i]));
                else
                    assert_memory_equal(y1, yn, B * T * D * sizeof(float));
            }
    }
    free(x); free(wq); free(wk); free(wv); free(wo); free(dense); free(conv); free(y1); free(yn);
}

/* A key of +inf or NaN stops a streamed path; the layer then runs the
 * whole sequence the usual way and must give exactly what that gives. Too
 * small a chunk for the window, or the full variant, keep the usual path. */
static void test_layer_streamed_falls_back(void **state)
{
    (void)state;
    const size_t B = 2, T = 40, D = 6, C = 4;
    rng r = {77};
    float *x = randf(&r, B * T * D, 1.0), *wq = randf(&r, C * D, 0.4), *wk = randf(&r, C * D, 0.4),
          *wv = randf(&r, C * D, 0.4), *wo = randf(&r, D * C, 0.4), *dense = randf(&r, T * T, 1.0);
    aft_params p = layer_params(D, C, wq, wk, wv, wo);
    p.bias.kind = AFT_BIAS_DENSE;
    p.bias.dense = dense;
    p.bias.tmax = T;
    aft_config cfg = make_cfg(AFT_LOCAL, 3, 0, 1);
    cfg.impl = AFT_IMPL_FAST;
    float *y0 = xmalloc(B * T * D * sizeof(float)), *y1 = xmalloc(B * T * D * sizeof(float));
    aft_error err = {{0}};
    int streamed = -1;
    /* the usual path is taken, and streaming works, before the key goes bad */
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 1);
    /* batch 1: row 21 (the third chunk), then rows of the last chunk and
     * the sequence's last row */
    const size_t causal_bad[] = {39, 38, 36, 33, 32, 0, 1, 21};
    for (size_t i = 0; i < N_OF(causal_bad); i++) {
        x[(1 * T + causal_bad[i]) * D + 2] = INFINITY;
        assert_int_equal(aft_layer_forward_chunked(y0, x, &p, &cfg, B, T, 0, NULL, &streamed, &err), AFT_OK);
        assert_int_equal(streamed, 0);
        for (size_t j = 0; j < B * T * D; j++) y1[j] = 12345.0f;
        assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
        assert_int_equal(streamed, 0);
        assert_memory_equal(y0, y1, B * T * D * sizeof(float));
        if (i + 1 < N_OF(causal_bad)) x[(1 * T + causal_bad[i]) * D + 2] = 0.5f;
    }
    /* the same for simple without causality */
    aft_config sc = make_cfg(AFT_SIMPLE, 0, 0, 0);
    sc.impl = AFT_IMPL_FAST;
    assert_int_equal(aft_layer_forward_chunked(y0, x, &p, &sc, B, T, 0, NULL, &streamed, &err), AFT_OK);
    for (size_t i = 0; i < B * T * D; i++) y1[i] = 12345.0f;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &sc, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 0);
    assert_memory_equal(y0, y1, B * T * D * sizeof(float));
    x[(1 * T + 21) * D + 2] = 0.5f;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &sc, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 1);
    /* the same for local without causality: the bad key in the last chunk,
     * then in the first, the last row, the first row (found while the right
     * sums are made) */
    aft_config nc = make_cfg(AFT_LOCAL, 3, 0, 0);
    nc.impl = AFT_IMPL_FAST;
    const size_t bad_rows[] = {1 * T + 37, 0 * T + 2, 1 * T + 39, 0 * T + 0};
    for (size_t i = 0; i < N_OF(bad_rows); i++) {
        x[bad_rows[i] * D + 1] = INFINITY;
        assert_int_equal(aft_layer_forward_chunked(y0, x, &p, &nc, B, T, 0, NULL, &streamed, &err), AFT_OK);
        for (size_t j = 0; j < B * T * D; j++) y1[j] = 12345.0f;
        assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &nc, B, T, 8, NULL, &streamed, &err), AFT_OK);
        assert_int_equal(streamed, 0);
        assert_memory_equal(y0, y1, B * T * D * sizeof(float));
        x[bad_rows[i] * D + 1] = 0.25f;
    }
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &nc, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 1);
    /* chunk narrower than the window; the full variant */
    cfg.window = 9;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 0);
    cfg = make_cfg(AFT_FULL, 0, 0, 0);
    cfg.impl = AFT_IMPL_FAST;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 0);
    free(x); free(wq); free(wk); free(wv); free(wo); free(dense); free(y0); free(y1);
}

/* ---------------------------------------------------------------- argument errors */

/* case-insensitive substring */
static int contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}

/* does msg contain the number as a whole token (not part of a longer number)? */
static int contains_number(const char *msg, size_t num)
{
    char s[32];
    snprintf(s, sizeof s, "%zu", num);
    size_t n = strlen(s);
    for (const char *p = msg; (p = strstr(p, s)) != NULL; p++) {
        int before = p > msg && isdigit((unsigned char)p[-1]);
        int after = isdigit((unsigned char)p[n]);
        if (!before && !after) return 1;
    }
    return 0;
}

/* The call must fail with a one-line message that names the problem: one of
 * the words (';'-separated), or else all the numbers (terminated by 0). */
static int check_error(const char *what, aft_status st, const aft_error *err, const char *words,
                       const size_t *numbers)
{
    int ok = 1;
    if (st == AFT_OK) {
        print_message("FAIL %s: accepted (status OK)\n", what);
        return 0;
    }
    if (!err->msg[0]) {
        print_message("FAIL %s: status %d but empty message\n", what, (int)st);
        return 0;
    }
    if (strchr(err->msg, '\n')) {
        print_message("FAIL %s: message has a newline: \"%s\"\n", what, err->msg);
        ok = 0;
    }
    int named = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", words);
    for (char *save = NULL, *w = strtok_r(buf, ";", &save); w; w = strtok_r(NULL, ";", &save))
        if (contains_ci(err->msg, w)) named = 1;
    if (!named && numbers && numbers[0]) {
        named = 1;
        for (const size_t *n = numbers; *n; n++)
            if (!contains_number(err->msg, *n)) named = 0;
    }
    if (!named) {
        print_message("FAIL %s: message does not name the problem (wanted one of \"%s\"): \"%s\"\n",
                      what, words, err->msg);
        ok = 0;
    }
    return ok;
}

/* a small valid problem to break one field at a time */
typedef struct {
    float q[3 * 9 * 14], k[3 * 9 * 14], v[3 * 9 * 14], out[3 * 9 * 14];
    float dense[9 * 9], u[9 * 2], fv[9 * 2], conv[4 * 5];
} err_bufs;

/* part 0: shapes and options that do not fit; part 1: NULL tensors and a
 * size product that overflows, kept apart because a library that misses
 * them crashes the test program */
static void op_errors(int part)
{
    static err_bufs eb;
    rng r = {3000};
    for (size_t i = 0; i < N_OF(eb.q); i++) {
        eb.q[i] = (float)rng_sym(&r);
        eb.k[i] = (float)rng_sym(&r);
        eb.v[i] = (float)rng_sym(&r);
    }
    for (size_t i = 0; i < N_OF(eb.dense); i++) eb.dense[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(eb.u); i++) eb.u[i] = eb.fv[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(eb.conv); i++) eb.conv[i] = (float)rng_sym(&r);
    int bad = 0;
    aft_error err;
    aft_status st;
    aft_bias bias;
    aft_config cfg;

#define RESET(var, kind_)                                \
    do {                                                 \
        memset(&bias, 0, sizeof bias);                   \
        bias.kind = (kind_);                             \
        cfg = make_cfg((var), 0, 0, 0);                  \
        cfg.impl = impl;                                 \
        memset(&err, 0, sizeof err);                     \
    } while (0)

    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        aft_impl impl = impls[ii];
        char what[128];
#define WHAT(s) (snprintf(what, sizeof what, "[%s] %s", impl_name(impl), (s)), what)

        if (part == 1) goto null_and_overflow;
        /* sanity: the unbroken problems are accepted */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 3, 9, 12, 4, &err);
        if (st != AFT_OK) {
            print_message("FAIL [%s] valid conv problem refused: %s\n", impl_name(impl), err.msg);
            bad++;
        }
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 3, 9, 14, 14, &err);
        if (st != AFT_OK) {
            print_message("FAIL [%s] valid dense problem refused: %s\n", impl_name(impl), err.msg);
            bad++;
        }

        /* conv: C = 14 does not split into 4 heads */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 14, 14, &err);
        bad += !check_error(WHAT("conv C=14 heads=4"), st, &err, "head;divis",
                            (const size_t[]){14, 4, 0});
        /* conv: heads that disagree with a bias of 4 rows */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        bias.conv_len = 5;
        bias.conv_rows = 4;
        cfg.heads = 3;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv heads=3, bias rows=4"), st, &err, "head;rows", (const size_t[]){3, 4, 0});
        /* conv: a window that disagrees with a bias of 2S-1 = 5 columns */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        bias.conv_len = 5;
        bias.conv_rows = 4;
        cfg.heads = 4;
        cfg.window = 2;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv window=2, bias window 3"), st, &err, "window", (const size_t[]){2, 3, 0});
        /* conv: kc = 5 is neither C = 12 nor heads = 4 */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 5, &err);
        bad += !check_error(WHAT("conv kc=5 C=12 heads=4"), st, &err, "kc;key",
                            (const size_t[]){5, 0});
        /* full: kc = 3 != C = 12 (only conv shares keys) */
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 3, &err);
        bad += !check_error(WHAT("full kc=3 C=12"), st, &err, "kc;key", (const size_t[]){3, 0});
        /* dense bias covering T = 7 < 9 */
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 7;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("dense tmax=7 T=9"), st, &err, "tmax", (const size_t[]){7, 9, 0});
        /* the same through local */
        RESET(AFT_LOCAL, AFT_BIAS_DENSE);
        bias.dense = eb.dense;
        bias.tmax = 7;
        cfg.window = 2;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("local dense tmax=7 T=9"), st, &err, "tmax", (const size_t[]){7, 9, 0});
        /* factored bias covering T = 8 < 9 */
        RESET(AFT_FULL, AFT_BIAS_FACTORED);
        bias.u = eb.u;
        bias.v = eb.fv;
        bias.rank = 2;
        bias.tmax = 8;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("factored tmax=8 T=9"), st, &err, "tmax", (const size_t[]){8, 9, 0});
        /* dense kind without the dense array */
        RESET(AFT_FULL, AFT_BIAS_DENSE);
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("dense bias NULL"), st, &err, "dense;null;missing", NULL);
        /* factored kind without u */
        RESET(AFT_FULL, AFT_BIAS_FACTORED);
        bias.v = eb.fv;
        bias.rank = 2;
        bias.tmax = 9;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("factored u NULL"), st, &err, "factor;null;missing", NULL);
        /* conv with bias kind none: the header reads AFT_BIAS_NONE as "w = 0
         * (a zero bias)", so either refuse it naming conv, or compute conv
         * with an all-zero conv bias; anything else is wrong */
        RESET(AFT_CONV, AFT_BIAS_NONE);
        cfg.heads = 4;
        cfg.window = 3;
        for (size_t i = 0; i < 9 * 12; i++) eb.out[i] = NAN;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        if (st == AFT_OK) {
            static const float zeros[4 * 5];
            aft_bias zb = bias;
            zb.kind = AFT_BIAS_CONV;
            zb.conv = zeros;
            double ref[9 * 12], e = 0;
            assert_int_equal(ref_aft_op(ref, eb.q, eb.k, eb.v, &zb, &cfg, 1, 9, 12, 12), 0);
            for (size_t i = 0; i < 9 * 12; i++) {
                double di = fabs((double)eb.out[i] - ref[i]);
                if (!(di <= e)) e = di;
            }
            if (!(e <= TOL_REL)) {
                print_message("FAIL [%s] conv with bias kind none accepted but differs from a "
                              "zero conv bias by %.3g\n", impl_name(impl), e);
                bad++;
            }
        } else {
            bad += !check_error(WHAT("conv with bias kind none"), st, &err, "conv", NULL);
        }
        /* kind conv but no conv array: the message should say it is missing */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        cfg.heads = 4;
        cfg.window = 3;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv bias NULL"), st, &err, "null;missing;without;needs;no conv;no data",
                            NULL);
        /* conv window 0 against a bias that holds window 3 */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        bias.conv_len = 5;
        bias.conv_rows = 4;
        cfg.heads = 4;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv window=0, bias window 3"), st, &err, "window", NULL);
        /* conv window 0 is simple, which needs one key channel per value channel */
        RESET(AFT_CONV, AFT_BIAS_NONE);
        cfg.heads = 4;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 4, &err);
        bad += !check_error(WHAT("conv window=0, kc = heads"), st, &err, "simple;key", (const size_t[]){4, 12, 0});
        /* a window from the bias without a conv bias */
        RESET(AFT_CONV, AFT_BIAS_NONE);
        cfg.window = AFT_WINDOW_FROM_BIAS;
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("conv window from no bias"), st, &err, "window;bias", NULL);
        /* a variant that does not exist */
        RESET((aft_variant)17, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("variant 17"), st, &err, "variant", (const size_t[]){17, 0});
        /* a bias kind that does not exist */
        RESET(AFT_FULL, (aft_bias_kind)42);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("bias kind 42"), st, &err, "kind;bias", (const size_t[]){42, 0});
        /* err may be NULL: still a non-OK status, no crash */
        RESET(AFT_CONV, AFT_BIAS_CONV);
        bias.conv = eb.conv;
        cfg.heads = 5;
        cfg.window = 3;
        if (aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, NULL) == AFT_OK) {
            print_message("FAIL [%s] conv heads=5 C=12 accepted with err = NULL\n", impl_name(impl));
            bad++;
        }
        continue;

    null_and_overflow:
        /* missing tensors */
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, NULL, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("q NULL"), st, &err, "null;missing;q", NULL);
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(NULL, eb.q, eb.k, eb.v, &bias, &cfg, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("out NULL"), st, &err, "null;missing;out", NULL);
        /* B * T * C overflows size_t: must be refused before any access */
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, &cfg, SIZE_MAX / 4, 9, 12, 12, &err);
        bad += !check_error(WHAT("B*T*C overflow"), st, &err, "overflow;too large;large;size", NULL);
        /* no configuration at all */
        RESET(AFT_SIMPLE, AFT_BIAS_NONE);
        st = aft_op_forward(eb.out, eb.q, eb.k, eb.v, &bias, NULL, 1, 9, 12, 12, &err);
        bad += !check_error(WHAT("cfg NULL"), st, &err, "null;missing;config;cfg", NULL);
#undef WHAT
    }
#undef RESET
    if (bad) fail_msg("%d argument-error checks failed", bad);
}

static void test_op_errors(void **state)
{
    (void)state;
    op_errors(0);
}

static void test_op_errors_null_overflow(void **state)
{
    (void)state;
    op_errors(1);
}

static void test_layer_errors(void **state)
{
    (void)state;
    static float x[2 * 5 * 8], y[2 * 5 * 8], w[64 * 8], b[64], conv[4 * 5];
    rng r = {3100};
    for (size_t i = 0; i < N_OF(x); i++) x[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(w); i++) w[i] = (float)rng_sym(&r) * 0.3f;
    for (size_t i = 0; i < N_OF(b); i++) b[i] = (float)rng_sym(&r);
    for (size_t i = 0; i < N_OF(conv); i++) conv[i] = (float)rng_sym(&r);
    int bad = 0;
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        char what[128];
        aft_params p;
        memset(&p, 0, sizeof p);
        p.d_model = 8;
        p.d_hidden = 12;
        p.k_out = 4;
        p.wq = p.wk = p.wv = p.wo = w;
        p.bq = p.bk = p.bv = p.bo = b;
        p.bias.kind = AFT_BIAS_CONV;
        p.bias.conv = conv;
        aft_config cfg = make_cfg(AFT_CONV, 3, 4, 1);
        cfg.impl = impls[ii];
        aft_error err = {{0}};
        aft_status st = aft_layer_forward(y, x, &p, &cfg, 2, 5, &err);
        if (st != AFT_OK) {
            print_message("FAIL [%s] valid layer refused: %s\n", impl_name(impls[ii]), err.msg);
            bad++;
        }
        /* k_out = 5: neither d_hidden = 12 nor heads = 4 */
        aft_params p2 = p;
        p2.k_out = 5;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &cfg, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer k_out=5 C=12 heads=4", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "k_out;kc;key", (const size_t[]){5, 0});
        /* d_hidden = 14 does not split into 4 heads */
        p2 = p;
        p2.d_hidden = 14;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &cfg, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer d_hidden=14 heads=4", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "head;divis", (const size_t[]){14, 4, 0});
        /* a missing weight matrix */
        p2 = p;
        p2.wv = NULL;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &cfg, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer wv NULL", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "wv;null;missing;weight", NULL);
        /* dense bias too short for T through the layer */
        static float dense[4 * 4];
        p2 = p;
        p2.k_out = 12;
        p2.bias.kind = AFT_BIAS_DENSE;
        p2.bias.dense = dense;
        p2.bias.tmax = 4;
        aft_config full = make_cfg(AFT_FULL, 0, 0, 0);
        full.impl = impls[ii];
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &full, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer dense tmax=4 T=5", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "tmax", (const size_t[]){4, 5, 0});
        /* full needs k_out == d_hidden */
        p2.bias.tmax = 5;
        p2.k_out = 4;
        memset(&err, 0, sizeof err);
        st = aft_layer_forward(y, x, &p2, &full, 2, 5, &err);
        snprintf(what, sizeof what, "[%s] layer full k_out=4 C=12", impl_name(impls[ii]));
        bad += !check_error(what, st, &err, "k_out;kc;key", (const size_t[]){4, 0});
    }
    if (bad) fail_msg("%d layer argument-error checks failed", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* the reference against closed forms and identities */
        cmocka_unit_test(test_ref_simple_closed_form),
        cmocka_unit_test(test_ref_single_visible),
        cmocka_unit_test(test_ref_constant_bias_is_simple),
        cmocka_unit_test(test_ref_local_is_banded_full),
        cmocka_unit_test(test_ref_conv_shared_keys),
        cmocka_unit_test(test_op_settle_rules),
        cmocka_unit_test(test_ref_conv_is_toeplitz_full),
        cmocka_unit_test(test_ref_masks),
        cmocka_unit_test(test_ref_shift_invariance),
        cmocka_unit_test(test_ref_factored_seeded_are_dense),
        cmocka_unit_test(test_ref_layer_identity),
        cmocka_unit_test(test_seeded_bias_contract),
        /* the library against the reference */
        cmocka_unit_test(test_op_full_dense),
        cmocka_unit_test(test_op_full_factored),
        cmocka_unit_test(test_op_full_seeded),
        cmocka_unit_test(test_op_full_no_bias),
        cmocka_unit_test(test_op_local),
        cmocka_unit_test(test_op_simple),
        cmocka_unit_test(test_op_conv),
        cmocka_unit_test(test_op_large),
        cmocka_unit_test(test_op_extreme_wide),
        cmocka_unit_test(test_op_extreme_one_huge_key),
        cmocka_unit_test(test_op_extreme_adversarial),
        cmocka_unit_test(test_op_simple_rows),
        cmocka_unit_test(test_op_causal_rows),
        cmocka_unit_test(test_op_rows_bad_key),
        cmocka_unit_test(test_op_causal_later_value),
        cmocka_unit_test(test_op_full_blas),
        cmocka_unit_test(test_op_full_rising_bias),
        cmocka_unit_test(test_op_full_bad_bias),
        cmocka_unit_test(test_op_threads),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_layer_sequences),
        cmocka_unit_test(test_layer_products_split),
        cmocka_unit_test(test_layer),
        cmocka_unit_test(test_layer_streamed),
        cmocka_unit_test(test_layer_pipeline_threads),
        cmocka_unit_test(test_layer_streamed_falls_back),
        cmocka_unit_test(test_op_errors),
        cmocka_unit_test(test_layer_errors),
        cmocka_unit_test(test_op_errors_null_overflow),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
