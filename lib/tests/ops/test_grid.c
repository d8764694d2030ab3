/*
 * test_grid.c - AFT-local and AFT-conv on 2-D grids (lib/ops/grid.c;
 * aft_config.grid_h, grid_w; aft_bias.conv_2d): the operator against the
 * float64 reference in ref_aft.c (its grid window written from the
 * definition), for both cfg.impl = AFT_IMPL_FAST and AFT_IMPL_REFERENCE; the
 * reference itself against other formulations; thread counts; causality
 * with a later NaN; the PyTorch fixtures in testdata/torch/grid_* (a module
 * written from the paper's formula with torch.nn.functional.conv2d, groups =
 * channels; see testdata/make_torch_grid_fixtures.py), through the layer;
 * and the backward against finite differences and its reference. (The
 * grid's rules and messages are tested with the other rules, in
 * test_op.c; the layer on a grid in test_layer.c; the loader's grid biases
 * in test_weights.c.)
 *
 * Pass criterion for a comparison, as in opcheck.h: every output finite and
 *   max |out - ref| <= 2e-5 * max(1, max |ref|),
 * and a (b, t) with nothing visible exactly 0. Extreme inputs (keys up to
 * +-500, biases up to +-250) sit on a grid of 2^-8 so that K + w is exact in
 * float: a failure there is the algorithm's, not the inputs' rounding.
 * Every input comes from a seeded PRNG; a failure prints the case.
 */
#include <dirent.h>
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
#include "cases.h"
#include "files.h"
#include "gradcheck.h"
#include "ref_aft.h"
#include "rng.h"

#define TOL_REL 2e-5

/* ---------------------------------------------------------------- cases */

typedef struct {
    aft_variant variant;     /* AFT_LOCAL or AFT_CONV */
    aft_bias_kind kind;      /* local: where w comes from; conv: AFT_BIAS_CONV */
    size_t B, H, W, C;
    size_t heads, window;
    int shared_keys;         /* conv: kc = heads instead of C */
    int shared_square;       /* conv: one (2S-1, 2S-1) square for every head */
    int shaped;              /* conv: the bias records its shape (conv_len), the
                              * window comes from it */
    int causal;
    mask_mode mask;
    vals_mode vals;
    uint64_t seed;
    int threads;
} grid_case;

typedef struct {
    grid_case c;
    size_t T, kc;
    float *q, *k, *v, *dense, *fu, *fv, *conv;
    uint8_t *mask;
    aft_bias bias;
    aft_config cfg;      /* as the library gets it */
    aft_config rcfg;     /* settled, for the reference: window and heads spelt out */
    double *ref;
} case_data;

static void describe(char *buf, size_t n, const grid_case *c, size_t kc)
{
    snprintf(buf, n,
             "variant=%s bias=%s B=%zu grid=%zux%zu C=%zu kc=%zu heads=%zu window=%zu shared_square=%d "
             "shaped=%d causal=%d mask=%s values=%s seed=%llu threads=%d",
             aft_variant_name(c->variant), kind_names[c->kind], c->B, c->H, c->W, c->C, kc, c->heads, c->window,
             c->shared_square, c->shaped, c->causal, mask_names[c->mask], vals_names[c->vals],
             (unsigned long long)c->seed, c->threads);
}

/* each entry visible with probability 0.7, rows with (t + b) % 5 == 2 fully
 * invisible; MASK_CAUSAL: exactly t' <= t (the library then runs the grid
 * kernel, causal) */
static uint8_t *make_grid_mask(rng *r, size_t nb, size_t T, int causal_only)
{
    uint8_t *m = xmalloc(nb * T * T);
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t t2 = 0; t2 < T; t2++)
                m[(b * T + t) * T + t2] = causal_only ? t2 <= t
                                          : (t + b) % 5 == 2 ? 0 : (uint8_t)(rng_unif(r) < 0.7);
    return m;
}

static void build_case(case_data *d, const grid_case *c)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    const size_t B = c->B, T = c->H * c->W, C = c->C, S = c->window;
    d->T = T;
    d->kc = c->variant == AFT_CONV && c->shared_keys ? c->heads : C;
    rng r = {c->seed * 0x2545F4914F6CDD1Dull + T * 131 + C * 7 + B};
    int extreme = c->vals != VALS_NORMAL;
    double span = extreme ? 250.0 : 1.0;

    d->cfg.variant = c->variant;
    d->cfg.window = c->window;
    d->cfg.heads = c->heads;
    d->cfg.causal = c->causal;
    d->cfg.grid_h = c->H;
    d->cfg.grid_w = c->W;
    d->cfg.impl = AFT_IMPL_FAST;
    d->rcfg = d->cfg;

    d->bias.kind = c->kind;
    switch (c->kind) {
    case AFT_BIAS_DENSE: {
        size_t tmax = T + 3;   /* > T: a kernel using T as the row stride is caught */
        d->dense = xmalloc(tmax * tmax * sizeof *d->dense);
        for (size_t i = 0; i < tmax * tmax; i++)
            d->dense[i] = extreme ? on_grid(span * rng_sym(&r), 0x1p-8) : (float)rng_sym(&r);
        d->bias.dense = d->dense;
        d->bias.tmax = tmax;
        break;
    }
    case AFT_BIAS_FACTORED:
        make_factored(&r, &d->bias, &d->fu, &d->fv, T, extreme);
        break;
    case AFT_BIAS_SEEDED:
        d->bias.seed = c->seed ^ 0xA5A5A5A5u;
        d->bias.scale = (float)span;
        break;
    case AFT_BIAS_CONV: {
        size_t len = 2 * S - 1, rows = c->shared_square ? 1 : c->heads, n = rows * len * len;
        d->conv = xmalloc(n * sizeof *d->conv);
        for (size_t i = 0; i < n; i++)
            d->conv[i] = extreme ? on_grid(span * rng_sym(&r), 0x1p-8) : (float)rng_sym(&r);
        d->bias.conv = d->conv;
        d->bias.conv_2d = 1;
        if (c->shaped || c->shared_square) {
            d->bias.conv_len = len;
            d->bias.conv_rows = rows;
        }
        if (c->shaped) {
            d->cfg.window = AFT_WINDOW_FROM_BIAS;
            if (!c->shared_square) d->cfg.heads = 0;   /* the bias's rows */
        }
        break;
    }
    default:
        break;
    }
    if (c->mask != MASK_NONE) {
        d->mask = make_grid_mask(&r, c->mask == MASK_BATCHED ? B : 1, T, c->mask == MASK_CAUSAL);
        d->bias.mask = d->mask;
        d->bias.mask_batched = c->mask == MASK_BATCHED;
    }

    make_qkv(&r, &d->q, &d->k, &d->v, c->vals, &d->bias, &d->rcfg, B, T, C, d->kc);
    size_t nq = B * T * C;
    d->ref = xmalloc(nq * sizeof *d->ref);
    if (ref_aft_op(d->ref, d->q, d->k, d->v, &d->bias, &d->rcfg, B, T, C, d->kc) != 0) {
        char buf[512];
        describe(buf, sizeof buf, c, d->kc);
        fail_msg("reference refused its own case: %s", buf);
    }
}

static void free_case(case_data *d)
{
    free(d->q); free(d->k); free(d->v); free(d->dense); free(d->fu); free(d->fv); free(d->conv);
    free(d->mask); free(d->ref);
}

static int row_has_visible(const case_data *d, size_t b, size_t t)
{
    for (size_t t2 = 0; t2 < d->T; t2++)
        if (ref_aft_visible(&d->bias, &d->rcfg, b, d->T, t, t2)) return 1;
    return 0;
}

/* compares out with ref: finite, rows with nothing visible exactly 0, within
 * tolerance; returns 1 on a failure (printed while *reports < MAX_REPORTS) */
static int compare(const case_data *d, const float *out, const char *tag, int *reports)
{
    const grid_case *c = &d->c;
    const size_t T = d->T, C = c->C, n = c->B * T * C;
    char what[512];
    describe(what, sizeof what, c, d->kc);
    double maxref = 0.0, maxerr = 0.0;
    size_t worst = 0, nonfinite = 0, first_bad = 0, nonzero_empty = 0;
    for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs(d->ref[i]));
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) {
            if (!nonfinite++) first_bad = i;
            continue;
        }
        double e = fabs((double)out[i] - d->ref[i]);
        if (e > maxerr) {
            maxerr = e;
            worst = i;
        }
    }
    for (size_t b = 0; b < c->B; b++)
        for (size_t t = 0; t < T; t++)
            if (!row_has_visible(d, b, t))
                for (size_t ch = 0; ch < C; ch++) nonzero_empty += out[(b * T + t) * C + ch] != 0.0f;
    double tol = TOL_REL * (maxref > 1.0 ? maxref : 1.0);
    int bad = 0;
    if (nonfinite) {
        size_t i = first_bad;
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s] %zu non-finite outputs, first at b=%zu t=%zu c=%zu (ref %.9g): %s\n", tag,
                          nonfinite, i / (T * C), i / C % T, i % C, d->ref[i], what);
        bad = 1;
    }
    if (nonzero_empty) {
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s] %zu outputs of rows with nothing visible are not 0: %s\n", tag,
                          nonzero_empty, what);
        bad = 1;
    }
    if (maxerr > tol) {
        size_t i = worst;
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s] max |err| %.3g > tol %.3g at b=%zu t=%zu (row %zu, col %zu) c=%zu "
                          "(out %.9g, ref %.9g): %s\n", tag, maxerr, tol, i / (T * C), i / C % T,
                          i / C % T / c->W, i / C % T % c->W, i % C, (double)out[i], d->ref[i], what);
        bad = 1;
    }
    return bad;
}

/* one library run (impl, threads) against the reference; inputs untouched */
static int check_impl(case_data *d, aft_impl impl, int threads, int *reports)
{
    const grid_case *c = &d->c;
    const size_t n = c->B * d->T * c->C, nk = c->B * d->T * d->kc;
    float *out = xmalloc(n * sizeof *out), *k0 = xmalloc(nk * sizeof *k0);
    for (size_t i = 0; i < n; i++) out[i] = NAN;   /* an unwritten output shows as NaN */
    memcpy(k0, d->k, nk * sizeof *k0);
    aft_config cfg = d->cfg;
    cfg.impl = impl;
    cfg.threads = threads;
    aft_error err = {{0}};
    char tag[64];
    snprintf(tag, sizeof tag, "%s threads=%d", impl_name(impl), threads);
    aft_status st = aft_op_forward(out, d->q, d->k, d->v, &d->bias, &cfg, c->B, d->T, c->C, d->kc, &err);
    int bad = 0;
    if (st != AFT_OK) {
        char what[512];
        describe(what, sizeof what, c, d->kc);
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL [%s] status %d (%s): %s\n", tag, (int)st, err.msg, what);
        bad = 1;
    } else {
        bad = compare(d, out, tag, reports);
        if (memcmp(k0, d->k, nk * sizeof *k0)) {
            print_message("FAIL [%s] keys modified\n", tag);
            bad = 1;
        }
    }
    free(out);
    free(k0);
    return bad;
}

static int run_case(const grid_case *c, int *reports)
{
    case_data d;
    build_case(&d, c);
    int fails = check_impl(&d, AFT_IMPL_FAST, c->threads, reports) +
                check_impl(&d, AFT_IMPL_REFERENCE, c->threads, reports);
    free_case(&d);
    return fails;
}

static void finish(int fails, int cases)
{
    if (fails) fail_msg("%d of %d comparisons failed (see above)", fails, 2 * cases);
}

/* grids of every shape: non-square both ways, a row, a column, one token */
static const size_t grids[][2] = {{5, 7}, {7, 3}, {1, 9}, {9, 1}, {1, 1}, {6, 6}, {4, 10}, {3, 2}};

/* ---------------------------------------------------------------- the reference's grid */

/* aft_op_forward with cfg.impl = AFT_IMPL_REFERENCE into a new array */
static double *ref_of(const float *q, const float *k, const float *v, const aft_bias *b, const aft_config *cfg,
                      size_t B, size_t T, size_t C, size_t kc)
{
    double *y = xmalloc(B * T * C * sizeof *y);
    assert_int_equal(ref_aft_op(y, q, k, v, b, cfg, B, T, C, kc), 0);
    return y;
}

static double max_abs_diff(const double *a, const double *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= m)) m = e;   /* NaN propagates */
    }
    return m;
}

/* The reference's grid window against other formulations of the same maths:
 *  - conv on a grid = full with the dense bias the kernel spells out,
 *    written here entry by entry from (r' - r, c' - c);
 *  - local with S >= max(H, W) = full with the same dense bias;
 *  - conv on a 1 x W grid = 1-D conv with the squares' middle rows, and on
 *    an H x 1 grid = 1-D conv with their middle columns (also through the
 *    library's fast kernels, grid and band).
 * Causal and not, two heads. */
static void test_grid_ref_identities(void **state)
{
    (void)state;
    rng r = {77};
    const size_t B = 2, C = 6, heads = 2, S = 3, n = 2 * S - 1;
    float *sq = randf(&r, heads * n * n, 1.0);
    for (int causal = 0; causal <= 1; causal++) {
        /* conv on a 4 x 5 grid vs full with the kernel spelt out, one head at a time */
        const size_t H = 4, W = 5, T = H * W;
        float *q = randf(&r, B * T * C, 2), *k = randf(&r, B * T * C, 2), *v = randf(&r, B * T * C, 1);
        aft_bias cb = {0};
        cb.kind = AFT_BIAS_CONV;
        cb.conv = sq;
        cb.conv_2d = 1;
        aft_config cc = {0};
        cc.variant = AFT_CONV;
        cc.window = S;
        cc.heads = heads;
        cc.causal = causal;
        cc.grid_h = H;
        cc.grid_w = W;
        double *yc = ref_of(q, k, v, &cb, &cc, B, T, C, C);
        float *dense = xmalloc(T * T * sizeof *dense);
        const size_t ch = C / heads;
        for (size_t h = 0; h < heads; h++) {
            for (size_t t = 0; t < T; t++)
                for (size_t t2 = 0; t2 < T; t2++) {
                    long dr = (long)(t2 / W) - (long)(t / W), dc = (long)(t2 % W) - (long)(t % W);
                    int in = labs(dr) < (long)S && labs(dc) < (long)S;
                    dense[t * T + t2] = in ? sq[(h * n + (size_t)(dr + (long)S - 1)) * n + (size_t)(dc + (long)S - 1)]
                                           : 0.0f;
                }
            aft_bias db = {0};
            db.kind = AFT_BIAS_DENSE;
            db.dense = dense;
            db.tmax = T;
            aft_config fc = {0};
            fc.variant = AFT_FULL;
            fc.causal = causal;
            double *yf = ref_of(q, k, v, &db, &fc, B, T, C, C);
            for (size_t i = 0; i < B * T; i++)
                for (size_t c = h * ch; c < (h + 1) * ch; c++)
                    if (!(fabs(yf[i * C + c] - yc[i * C + c]) < 1e-12))
                        fail_msg("conv grid vs spelt-out full: token %zu channel %zu: %.17g vs %.17g", i % T, c,
                                 yc[i * C + c], yf[i * C + c]);
            free(yf);
        }
        /* local with S >= max(H, W): the whole dense bias */
        aft_bias db = {0};
        db.kind = AFT_BIAS_DENSE;
        for (size_t i = 0; i < T * T; i++) dense[i] = (float)rng_sym(&r);
        db.dense = dense;
        db.tmax = T;
        aft_config lc = {0};
        lc.variant = AFT_LOCAL;
        lc.window = 5;
        lc.causal = causal;
        lc.grid_h = H;
        lc.grid_w = W;
        aft_config fc = lc;
        fc.variant = AFT_FULL;
        fc.grid_h = fc.grid_w = 0;
        double *yl = ref_of(q, k, v, &db, &lc, B, T, C, C), *yf = ref_of(q, k, v, &db, &fc, B, T, C, C);
        if (max_abs_diff(yl, yf, B * T * C) > 1e-12) fail_msg("local S >= max(H, W) is not full");
        free(yl); free(yf); free(dense); free(yc); free(q); free(k); free(v);

        /* a row and a column of a grid against the 1-D conv */
        for (int column = 0; column <= 1; column++) {
            const size_t L = 9;
            float *q1 = randf(&r, B * L * C, 2), *k1 = randf(&r, B * L * C, 2), *v1 = randf(&r, B * L * C, 1);
            float *line = xmalloc(heads * n * sizeof *line);
            for (size_t h = 0; h < heads; h++)
                for (size_t i = 0; i < n; i++)
                    line[h * n + i] = column ? sq[(h * n + i) * n + S - 1] : sq[(h * n + S - 1) * n + i];
            aft_bias b1 = {0};
            b1.kind = AFT_BIAS_CONV;
            b1.conv = line;
            aft_config c1 = {0};
            c1.variant = AFT_CONV;
            c1.window = S;
            c1.heads = heads;
            c1.causal = causal;
            aft_config c2 = c1;
            c2.grid_h = column ? L : 1;
            c2.grid_w = column ? 1 : L;
            double *y1 = ref_of(q1, k1, v1, &b1, &c1, B, L, C, C), *y2 = ref_of(q1, k1, v1, &cb, &c2, B, L, C, C);
            if (max_abs_diff(y1, y2, B * L * C) > 1e-12)
                fail_msg("reference: a %s grid is not the 1-D conv (causal %d)", column ? "9 x 1" : "1 x 9", causal);
            /* the library's fast kernels: the grid kernel against the band kernel */
            float *o1 = xmalloc(B * L * C * sizeof *o1), *o2 = xmalloc(B * L * C * sizeof *o2);
            aft_error err = {{0}};
            c1.threads = c2.threads = 2;
            assert_int_equal(aft_op_forward(o1, q1, k1, v1, &b1, &c1, B, L, C, C, &err), AFT_OK);
            assert_int_equal(aft_op_forward(o2, q1, k1, v1, &cb, &c2, B, L, C, C, &err), AFT_OK);
            for (size_t i = 0; i < B * L * C; i++)
                if (!(fabsf(o1[i] - o2[i]) <= 2e-6f * fmaxf(1.0f, fabsf(o1[i]))))
                    fail_msg("fast: the %s grid gives %.9g, the 1-D band %.9g at %zu", column ? "9 x 1" : "1 x 9",
                             (double)o2[i], (double)o1[i], i);
            free(o1); free(o2); free(y1); free(y2); free(line); free(q1); free(k1); free(v1);
        }
    }
    free(sq);
}

/* ---------------------------------------------------------------- the operator */

/* local on every grid shape: windows 1, 2, 3 and one >= max(H, W); dense,
 * factored, seeded and no bias; causal or not; masks; B 1 or 3; 1-4 threads */
static void test_grid_local(void **state)
{
    (void)state;
    const aft_bias_kind kinds[] = {AFT_BIAS_DENSE, AFT_BIAS_FACTORED, AFT_BIAS_SEEDED, AFT_BIAS_NONE};
    int fails = 0, cases = 0, reports = 0;
    for (size_t g = 0; g < N_OF(grids); g++)
        for (size_t wi = 0; wi < 4; wi++)
            for (size_t ki = 0; ki < N_OF(kinds); ki++)
                for (int causal = 0; causal <= 1; causal++) {
                    size_t H = grids[g][0], W = grids[g][1];
                    size_t S = wi < 3 ? wi + 1 : (H > W ? H : W) + (size_t)(cases % 2);
                    grid_case c = {AFT_LOCAL, kinds[ki], (size_t)(cases % 3 == 0 ? 3 : 1), H, W,
                                   (size_t)(cases % 2 ? 20 : 7), 1, S, 0, 0, 0, causal,
                                   (mask_mode)(cases % 7 == 3 ? MASK_SHARED : cases % 7 == 5 ? MASK_BATCHED
                                               : cases % 11 == 4 ? MASK_CAUSAL : MASK_NONE),
                                   VALS_NORMAL, 100 + (uint64_t)cases, 1 + cases % 4};
                    fails += run_case(&c, &reports);
                    cases++;
                }
    finish(fails, cases);
}

/* conv: heads 1, 2, 4 (channels 4 to 36: one, a part of one and several
 * blocks of vector lanes), keys per head or per channel, a square per head
 * or one shared, the window from the bias or the configuration, S = 1 to
 * >= max(H, W), causal or not, masks, B 1 or 2, 1-4 threads */
static void test_grid_conv(void **state)
{
    (void)state;
    const size_t heads[] = {1, 2, 4}, per_head[] = {4, 3, 9};
    int fails = 0, cases = 0, reports = 0;
    for (size_t g = 0; g < N_OF(grids); g++)
        for (size_t hi = 0; hi < N_OF(heads); hi++)
            for (size_t wi = 0; wi < 3; wi++)
                for (int variant = 0; variant < 4; variant++) {
                    size_t H = grids[g][0], W = grids[g][1], nh = heads[hi];
                    size_t S = wi == 0 ? 1 + (size_t)(cases % 2) : wi == 1 ? 3 : (H > W ? H : W) + 1;
                    grid_case c = {AFT_CONV, AFT_BIAS_CONV, (size_t)(cases % 3 == 1 ? 2 : 1), H, W,
                                   nh * per_head[(hi + wi) % 3], nh, S, variant & 1, (variant >> 1) & (cases % 3 == 0),
                                   cases % 2, (variant >> 1) & 1,
                                   (mask_mode)(cases % 9 == 4 ? MASK_SHARED : cases % 9 == 7 ? MASK_BATCHED
                                               : cases % 13 == 2 ? MASK_CAUSAL : MASK_NONE),
                                   VALS_NORMAL, 300 + (uint64_t)cases, 1 + cases % 4};
                    fails += run_case(&c, &reports);
                    cases++;
                }
    finish(fails, cases);
}

/* keys of +-500 and biases of +-250: wide, one huge key, adversarial */
static void test_grid_extreme(void **state)
{
    (void)state;
    const vals_mode vals[] = {VALS_WIDE, VALS_ONE_HUGE, VALS_ADVERSE};
    const size_t g3[][2] = {{5, 7}, {8, 3}, {6, 6}};
    int fails = 0, cases = 0, reports = 0;
    for (size_t vi = 0; vi < N_OF(vals); vi++)
        for (size_t g = 0; g < N_OF(g3); g++)
            for (int causal = 0; causal <= 1; causal++)
                for (int variant = 0; variant < 4; variant++) {
                    size_t H = g3[g][0], W = g3[g][1];
                    grid_case c;
                    if (variant == 0) {
                        c = (grid_case){AFT_LOCAL, AFT_BIAS_DENSE, 2, H, W, 18, 1, 2 + g, 0, 0, 0, causal, MASK_NONE,
                                        vals[vi], 500 + (uint64_t)cases, 1 + cases % 3};
                    } else if (variant == 1) {
                        c = (grid_case){AFT_LOCAL, AFT_BIAS_FACTORED, 1, H, W, 9, 1, 3, 0, 0, 0, causal,
                                        cases % 4 == 1 ? MASK_SHARED : MASK_NONE, vals[vi], 500 + (uint64_t)cases,
                                        2};
                    } else {
                        c = (grid_case){AFT_CONV, AFT_BIAS_CONV, 2, H, W, 24, variant == 2 ? 4 : 3, 2 + g % 2,
                                        variant == 3, 0, 1, causal, MASK_NONE, vals[vi], 500 + (uint64_t)cases,
                                        1 + cases % 4};
                    }
                    fails += run_case(&c, &reports);
                    cases++;
                }
    finish(fails, cases);
}

/* larger grids: several blocks of channels, partial blocks, many tiles and
 * the rows split over threads (B = 1) or not */
static void test_grid_large(void **state)
{
    (void)state;
    int fails = 0, cases = 0, reports = 0;
    for (int causal = 0; causal <= 1; causal++) {
        grid_case c1 = {AFT_CONV, AFT_BIAS_CONV, 2, 23, 26, 70, 5, 4, 0, 0, 1, causal, MASK_NONE, VALS_NORMAL,
                        900 + (uint64_t)causal, 3};
        grid_case c2 = {AFT_CONV, AFT_BIAS_CONV, 1, 19, 17, 96, 32, 3, 1, 0, 1, causal, MASK_NONE, VALS_NORMAL,
                        910 + (uint64_t)causal, 4};
        grid_case c3 = {AFT_LOCAL, AFT_BIAS_DENSE, 1, 21, 16, 40, 1, 3, 0, 0, 0, causal, MASK_NONE, VALS_NORMAL,
                        920 + (uint64_t)causal, 2};
        grid_case c4 = {AFT_CONV, AFT_BIAS_CONV, 1, 20, 24, 37, 1, 6, 0, 1, 1, causal, MASK_NONE, VALS_WIDE,
                        930 + (uint64_t)causal, 2};
        fails += run_case(&c1, &reports) + run_case(&c2, &reports) + run_case(&c3, &reports) +
                 run_case(&c4, &reports);
        cases += 4;
    }
    finish(fails, cases);
}

/* the same bits on 1 to 4 threads (the rows split over threads only when
 * batches and channel blocks leave some idle, and the split changes no sum) */
static void test_grid_threads(void **state)
{
    (void)state;
    const grid_case cs[] = {
        {AFT_CONV, AFT_BIAS_CONV, 1, 17, 13, 40, 4, 3, 1, 0, 1, 0, MASK_NONE, VALS_NORMAL, 1001, 1},
        {AFT_CONV, AFT_BIAS_CONV, 3, 9, 11, 24, 2, 2, 0, 0, 1, 1, MASK_NONE, VALS_WIDE, 1002, 1},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 14, 9, 20, 1, 3, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 1003, 1},
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 12, 12, 33, 1, 2, 0, 0, 0, 1, MASK_NONE, VALS_ADVERSE, 1004, 1},
    };
    for (size_t i = 0; i < N_OF(cs); i++) {
        case_data d;
        build_case(&d, &cs[i]);
        const size_t n = cs[i].B * d.T * cs[i].C;
        float *y1 = xmalloc(n * sizeof *y1), *yn = xmalloc(n * sizeof *yn);
        aft_error err = {{0}};
        aft_config cfg = d.cfg;
        cfg.threads = 1;
        assert_int_equal(aft_op_forward(y1, d.q, d.k, d.v, &d.bias, &cfg, cs[i].B, d.T, cs[i].C, d.kc, &err), AFT_OK);
        int reports = 0;
        if (compare(&d, y1, "fast threads=1", &reports)) fail_msg("case %zu disagrees with the reference", i);
        for (int th = 2; th <= 4; th++) {
            cfg.threads = th;
            assert_int_equal(aft_op_forward(yn, d.q, d.k, d.v, &d.bias, &cfg, cs[i].B, d.T, cs[i].C, d.kc, &err),
                             AFT_OK);
            if (memcmp(y1, yn, n * sizeof *y1) != 0) fail_msg("case %zu: %d threads differ from 1", i, th);
        }
        free(y1); free(yn);
        free_case(&d);
    }
}

/* Causality with a value, or a key, that is NaN or +inf at token t_bad: the
 * outputs before it are the same bits as with that entry 0 (0 * NaN must
 * not reach them, nor may the key raise a stabiliser they use to +inf); with
 * a bad value, those from it on in its channel are not finite (each sees
 * it, inside its window or outside). */
static void test_grid_causal_later_value(void **state)
{
    (void)state;
    const size_t H = 7, W = 9, T = H * W, C = 8, t_bad = 3 * W + 4, c_bad = 5;
    const float bads[] = {NAN, INFINITY};
    rng r = {91};
    float *q = randf(&r, T * C, 2), *k = randf(&r, T * C, 3), *v = randf(&r, T * C, 1), *w = randf(&r, T * T, 1),
          *sq = randf(&r, 2 * 25, 1);
    float *y0 = xmalloc(T * C * sizeof *y0), *y1 = xmalloc(T * C * sizeof *y1);
    for (int var = 0; var < 4; var++)
        for (size_t bi = 0; bi < N_OF(bads); bi++)
            for (int th = 1; th <= 3; th++) {
                float *x = var < 2 ? v : k;   /* 2, 3: the key */
                aft_bias bias = {0};
                aft_config cfg = {0};
                cfg.causal = 1;
                cfg.threads = th;
                cfg.grid_h = H;
                cfg.grid_w = W;
                if (var % 2 == 0) {
                    cfg.variant = AFT_LOCAL;
                    cfg.window = 3;
                    bias.kind = AFT_BIAS_DENSE;
                    bias.dense = w;
                    bias.tmax = T;
                } else {
                    cfg.variant = AFT_CONV;
                    cfg.window = 3;
                    cfg.heads = 2;
                    bias.kind = AFT_BIAS_CONV;
                    bias.conv = sq;
                    bias.conv_2d = 1;
                }
                aft_error err = {{0}};
                x[t_bad * C + c_bad] = 0.0f;
                assert_int_equal(aft_op_forward(y0, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                x[t_bad * C + c_bad] = bads[bi];
                assert_int_equal(aft_op_forward(y1, q, k, v, &bias, &cfg, 1, T, C, C, &err), AFT_OK);
                x[t_bad * C + c_bad] = 0.0f;
                for (size_t i = 0; i < T * C; i++) {
                    size_t t = i / C, c = i % C;
                    if (t < t_bad && memcmp(&y0[i], &y1[i], sizeof(float)) != 0)
                        fail_msg("%s, %s = %g at token %zu, threads %d: token %zu channel %zu is %.9g, %.9g without "
                                 "it", aft_variant_name(cfg.variant), var < 2 ? "v" : "k", (double)bads[bi], t_bad,
                                 th, t, c, (double)y1[i], (double)y0[i]);
                    if (var < 2 && t >= t_bad && c == c_bad && isfinite(y1[i]))
                        fail_msg("%s, v = %g at token %zu: token %zu is finite (%.9g)", aft_variant_name(cfg.variant),
                                 (double)bads[bi], t_bad, t, (double)y1[i]);
                }
            }
    free(q); free(k); free(v); free(w); free(sq); free(y0); free(y1);
}

/* full and simple on a grid use only its size: the same as without it */
static void test_grid_full_simple(void **state)
{
    (void)state;
    const size_t B = 2, H = 4, W = 6, T = H * W, C = 5;
    rng r = {61};
    float *q = randf(&r, B * T * C, 2), *k = randf(&r, B * T * C, 2), *v = randf(&r, B * T * C, 1),
          *w = randf(&r, T * T, 1);
    float *y0 = xmalloc(B * T * C * sizeof *y0), *y1 = xmalloc(B * T * C * sizeof *y1);
    aft_bias db = {0};
    db.kind = AFT_BIAS_DENSE;
    db.dense = w;
    db.tmax = T;
    aft_bias none = {0};
    for (int full = 0; full <= 1; full++)
        for (int causal = 0; causal <= 1; causal++) {
            aft_config cfg = {0};
            cfg.variant = full ? AFT_FULL : AFT_SIMPLE;
            cfg.causal = causal;
            cfg.threads = 2;
            aft_error err = {{0}};
            const aft_bias *b = full ? &db : &none;
            assert_int_equal(aft_op_forward(y0, q, k, v, b, &cfg, B, T, C, C, &err), AFT_OK);
            cfg.grid_h = H;
            cfg.grid_w = W;
            assert_int_equal(aft_op_forward(y1, q, k, v, b, &cfg, B, T, C, C, &err), AFT_OK);
            if (memcmp(y0, y1, B * T * C * sizeof *y0) != 0)
                fail_msg("%s (causal %d) on a grid differs from the sequence", full ? "full" : "simple", causal);
        }
    free(q); free(k); free(v); free(w); free(y0); free(y1);
}

/* ---------------------------------------------------------------- the PyTorch fixtures */

/* each case: how aft runs it (the window and heads of conv come from the bias) */
typedef struct {
    const char *name;
    aft_variant variant;
    size_t window, heads;   /* local's window; conv's heads (a shared square does not say) */
    double tol;             /* relative to max(1, max |y|) */
} torch_case;

static const torch_case torch_cases[] = {
    {"grid_conv", AFT_CONV, 0, 4, TOL_REL},
    {"grid_conv_wide_keys", AFT_CONV, 0, 3, TOL_REL},
    {"grid_conv_shared", AFT_CONV, 0, 2, TOL_REL},
    {"grid_local", AFT_LOCAL, 2, 0, TOL_REL},
    {"grid_conv_extreme", AFT_CONV, 0, 4, TOL_REL},
};

static void read_npy_case(const char *dir, const char *file, aft_tensor *t)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    aft_error err = {{0}};
    if (aft_npy_read(path, t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    assert_int_equal(t->dtype, AFT_F32);
}

/* Each case's layer on its x.npy [B, H, W, D] against y.npy (the module's
 * output, or for *_extreme the float64 truth, where PyTorch's own output is
 * NaN: y_torch.npy), with 1 and 2 threads, fast and reference; and every
 * grid_* directory is a case here. */
static void test_grid_torch(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_OF(torch_cases); ci++) {
        const torch_case *tc = &torch_cases[ci];
        char dir[400], path[512];
        snprintf(dir, sizeof dir, "%s/torch/%s", files_testdata(), tc->name);
        snprintf(path, sizeof path, "%s/weights.safetensors", dir);
        aft_error err = {{0}};
        aft_st_file *f = NULL;
        if (aft_st_open(path, &f, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
        aft_weights w;
        if (aft_weights_load_grid(f, "", tc->variant, 1, &w, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
        aft_tensor x, y;
        read_npy_case(dir, "x.npy", &x);
        read_npy_case(dir, "y.npy", &y);
        assert_int_equal(x.ndim, 4);
        const size_t B = x.shape[0], H = x.shape[1], W = x.shape[2], D = x.shape[3], T = H * W;
        assert_int_equal(D, w.p.d_model);
        assert_int_equal(y.nelem, x.nelem);
        if (strstr(tc->name, "extreme")) {   /* the point of the case: PyTorch itself fails it */
            aft_tensor yt;
            read_npy_case(dir, "y_torch.npy", &yt);
            size_t nan = 0;
            for (size_t i = 0; i < yt.nelem; i++) nan += !isfinite(((const float *)yt.data)[i]);
            assert_true(nan > 0);
            aft_tensor_free(&yt);
        }
        float *out = xmalloc(x.nelem * sizeof *out);
        const float *want = y.data;
        double maxy = 0;
        for (size_t i = 0; i < y.nelem; i++) maxy = fmax(maxy, fabs(want[i]));
        for (int impl = 0; impl <= 1; impl++)
            for (int th = 1; th <= 2; th++) {
                aft_config cfg = {0};
                cfg.variant = tc->variant;
                cfg.window = tc->variant == AFT_CONV ? AFT_WINDOW_FROM_BIAS : tc->window;
                cfg.heads = tc->heads;
                cfg.grid_h = H;
                cfg.grid_w = W;
                cfg.threads = th;
                cfg.impl = impl ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
                for (size_t i = 0; i < x.nelem; i++) out[i] = NAN;
                if (aft_layer_forward(out, x.data, &w.p, &cfg, B, T, &err) != AFT_OK)
                    fail_msg("%s: %s", tc->name, err.msg);
                double maxerr = 0;
                size_t worst = 0;
                for (size_t i = 0; i < x.nelem; i++) {
                    double e = fabs((double)out[i] - want[i]);
                    if (!(e <= maxerr)) {
                        maxerr = e;
                        worst = i;
                    }
                }
                if (!(maxerr <= tc->tol * fmax(1.0, maxy)))
                    fail_msg("%s (%s, %d threads): max |err| %.3g at %zu (aft %.9g, torch %.9g)", tc->name,
                             impl ? "reference" : "fast", th, maxerr, worst, (double)out[worst],
                             (double)want[worst]);
            }
        free(out);
        aft_tensor_free(&x);
        aft_tensor_free(&y);
        aft_weights_free(&w);
        aft_st_close(f);
    }
    /* every grid_* directory is one of the cases above */
    char top[400];
    snprintf(top, sizeof top, "%s/torch", files_testdata());
    DIR *d = opendir(top);
    assert_non_null(d);
    const struct dirent *e;
    size_t found = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "grid_", 5) != 0) continue;
        int known = 0;
        for (size_t ci = 0; ci < N_OF(torch_cases); ci++) known |= strcmp(torch_cases[ci].name, e->d_name) == 0;
        if (!known) fail_msg("testdata/torch/%s is not a case of test_grid_torch", e->d_name);
        found++;
    }
    closedir(d);
    assert_int_equal(found, N_OF(torch_cases));
}

/* ---------------------------------------------------------------- the backward */

/* loss = sum dout * y in double through the test reference (grid-aware) */
static double grid_loss(const double *q, const double *k, const double *v, const aft_bias *b, const aft_config *cfg,
                        size_t B, size_t T, size_t C, size_t kc, const float *dout, double *y)
{
    assert_int_equal(ref_aft_op_d(y, q, k, v, b, cfg, B, T, C, kc), 0);
    double s = 0.0;
    for (size_t i = 0; i < B * T * C; i++) s += y[i] * (double)dout[i];
    return s;
}

/* Local (dense bias) and conv (a 2-D bias per head, or one shared square,
 * keys of one channel a head or a value channel) on grids, causal or not:
 * the reference backward against central differences of the test
 * reference, and the fast backward against the reference backward. */
static void test_grad_grid(void **state)
{
    (void)state;
    typedef struct { aft_variant v; size_t gh, gw, S, heads, shared_keys, one_square; } gc;
    const gc cs[] = {{AFT_LOCAL, 3, 4, 2, 1, 0, 0}, {AFT_CONV, 4, 3, 2, 2, 0, 0}, {AFT_CONV, 3, 3, 2, 2, 1, 1},
                     {AFT_CONV, 2, 5, 3, 3, 1, 0}};
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++)
        for (int causal = 0; causal <= 1; causal++) {
            const gc *c = &cs[i];
            const size_t B = 2, T = c->gh * c->gw, C = 6, kc = c->shared_keys ? c->heads : C, n = B * T * C,
                         nk = B * T * kc, len = 2 * c->S - 1, rows = c->one_square ? 1 : c->heads;
            rng r = {900 + i * 2 + (uint64_t)causal};
            float *q = xmalloc(n * 4), *k = xmalloc(nk * 4), *v = xmalloc(n * 4), *dout = xmalloc(n * 4);
            for (size_t j = 0; j < n; j++) {
                q[j] = (float)rng_normal(&r);
                v[j] = (float)rng_sym(&r);
                dout[j] = (float)rng_sym(&r);
            }
            for (size_t j = 0; j < nk; j++) k[j] = (float)rng_normal(&r);
            size_t nb = c->v == AFT_LOCAL ? T * T : rows * len * len;
            float *bw = xmalloc(nb * 4);
            for (size_t j = 0; j < nb; j++) bw[j] = (float)rng_sym(&r);
            aft_bias bias = {0};
            if (c->v == AFT_LOCAL) {
                bias.kind = AFT_BIAS_DENSE;
                bias.dense = bw;
                bias.tmax = T;
            } else {
                bias = (aft_bias){.kind = AFT_BIAS_CONV, .conv = bw, .conv_len = len, .conv_rows = rows, .conv_2d = 1};
            }
            aft_config cfg = {.variant = c->v, .window = c->S, .heads = c->heads, .causal = causal, .threads = 1,
                              .grid_h = c->gh, .grid_w = c->gw};
            float *g[2][4];
            for (int m = 0; m < 2; m++) {
                g[m][0] = xcalloc(n, 4); g[m][1] = xcalloc(nk, 4); g[m][2] = xcalloc(n, 4); g[m][3] = xcalloc(nb, 4);
                aft_config cm = cfg;
                cm.impl = m ? AFT_IMPL_FAST : AFT_IMPL_REFERENCE;
                aft_bias_grad db = {0};
                if (c->v == AFT_LOCAL) db.dense = g[m][3];
                else db.conv = g[m][3];
                aft_error err = {{0}};
                if (aft_op_backward(g[m][0], g[m][1], g[m][2], &db, NULL, dout, q, k, v, &bias, &cm, B, T, C, kc,
                                    &err) != AFT_OK)
                    fail_msg("grid case %zu: %s", i, err.msg);
            }
            char what[96];
            snprintf(what, sizeof what, "grid %zu (%zux%zu S=%zu) causal=%d", i, c->gh, c->gw, c->S, causal);
            /* finite differences of the double reference, each input in turn */
            double *qd = xmalloc(n * 8), *kd = xmalloc(nk * 8), *vd = xmalloc(n * 8), *y = xmalloc(n * 8);
            double *fd = xmalloc((n > nb ? n : nb) * 8);
            for (size_t j = 0; j < n; j++) { qd[j] = q[j]; vd[j] = v[j]; }
            for (size_t j = 0; j < nk; j++) kd[j] = k[j];
            double *ins[3] = {qd, kd, vd};
            size_t lens[3] = {n, nk, n};
            const char *names[4] = {"dq", "dk", "dv", "dbias"};
            for (int a = 0; a < 3; a++) {
                for (size_t j = 0; j < lens[a]; j++) {
                    double x0 = ins[a][j], h = 1e-5;
                    ins[a][j] = x0 + h;
                    double lp = grid_loss(qd, kd, vd, &bias, &cfg, B, T, C, kc, dout, y);
                    ins[a][j] = x0 - h;
                    double lm = grid_loss(qd, kd, vd, &bias, &cfg, B, T, C, kc, dout, y);
                    ins[a][j] = x0;
                    fd[j] = (lp - lm) / (2 * h);
                }
                fails += grad_compare(names[a], g[0][a], fd, lens[a], GRAD_FD_TOL, what, &reports);
            }
            for (size_t j = 0; j < nb; j++) {
                float x0 = bw[j], h = 0x1p-10f;
                bw[j] = x0 + h;
                double lp = grid_loss(qd, kd, vd, &bias, &cfg, B, T, C, kc, dout, y);
                bw[j] = x0 - h;
                double lm = grid_loss(qd, kd, vd, &bias, &cfg, B, T, C, kc, dout, y);
                bw[j] = x0;
                fd[j] = (lp - lm) / (2.0 * (double)h);
            }
            fails += grad_compare(names[3], g[0][3], fd, nb, GRAD_FD_TOL_BIAS, what, &reports);
            /* the fast backward against the reference's */
            const size_t all[4] = {n, nk, n, nb};
            for (int a = 0; a < 4; a++) {
                for (size_t j = 0; j < all[a]; j++) fd[j] = g[0][a][j];
                fails += grad_compare(names[a], g[1][a], fd, all[a], GRAD_TOL_REL, what, &reports);
            }
            for (int m = 0; m < 2; m++)
                for (int a = 0; a < 4; a++) free(g[m][a]);
            free(q); free(k); free(v); free(dout); free(bw); free(qd); free(kd); free(vd); free(y); free(fd);
        }
    grad_finish(fails, (int)(2 * N_OF(cs)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_ref_identities),
        cmocka_unit_test(test_grid_local),
        cmocka_unit_test(test_grid_conv),
        cmocka_unit_test(test_grid_extreme),
        cmocka_unit_test(test_grid_large),
        cmocka_unit_test(test_grid_threads),
        cmocka_unit_test(test_grid_causal_later_value),
        cmocka_unit_test(test_grid_full_simple),
        cmocka_unit_test(test_grid_torch),
        cmocka_unit_test(test_grad_grid),
    };
    const char *filter = getenv("TEST_GRID_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
