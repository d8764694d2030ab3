/*
 * test_grad.c - the backward pass: aft_op_backward and aft_layer_backward.
 *
 *  1. The float64 reference (cfg.impl = AFT_IMPL_REFERENCE) against central
 *     finite differences of the tests' own float64 forward (ref_aft.c,
 *     written from the maths, not from lib/): every gradient, on small
 *     cases of every variant, bias kind, mask, causal or not, B 1 and 2,
 *     and keys of +-500 with biases of +-250.
 *  2. The fast kernels against that reference, per tensor:
 *       max |g - g64| <= 1e-4 * max(1, max |g64|),
 *     and g finite wherever g64 is, over the same grid as test_op.c's
 *     (every variant, bias kind, key form, mask, causal or not, B, T
 *     across block edges) and the extreme values.
 *  3. Threads 1 to 4 give the same gradients (to 1e-5 relative).
 *  4. The layer: its reference against finite differences of ref_aft.c's
 *     layer, the fast path against the reference (hidden size != D).
 *  5. The PyTorch fixtures (testdata/torch/, the *_grad cases): torch.autograd's
 *     gradients of labml's and rish-16's layers against
 *     aft_layer_backward, to 1e-4 * max(1, max |g|).
 *
 * Extreme inputs lie on a grid of 2^-8 (keys, biases), so that K + w is
 * exact in float (as in test_op.c): any failure there is the algorithm's.
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
#include "files.h"
#include "ops/kernels.h"
#include "ref_aft.h"
#include "rng.h"

#define TOL_REL 1e-4        /* fast against float64, relative to max(1, max |g64|) */
#define TOL_SAME 1e-6       /* one fast path against itself, other products or cuts */
#define FD_TOL 2e-6         /* the reference against finite differences (q, k, v) */
#define FD_TOL_BIAS 2e-5    /* (bias entries and weights: a float step, h^2 larger) */
#define THREAD_TOL 1e-5     /* one thread against several */
#define MAX_REPORTS 12

#define N_OF(a) (sizeof (a) / sizeof *(a))

/* ---------------------------------------------------------------- cases */

typedef enum { MASK_NONE, MASK_SHARED, MASK_BATCHED } mask_mode;
static const char *const mask_names[] = {"none", "TxT", "BxTxT"};
/* VALS_BEYOND_KEY, _BIAS: normal values but one key entry, or one dense
 * bias entry, of 3e38: beyond the sizes for which the band backward takes
 * its cheaper exponential (local_conv_grad.c's tame inputs) */
typedef enum { VALS_NORMAL, VALS_WIDE, VALS_ONE_HUGE, VALS_ADVERSE, VALS_BEYOND_KEY, VALS_BEYOND_BIAS } vals_mode;
static const char *const vals_names[] = {"normal", "wide", "one-huge-key", "adversarial", "one-key-beyond-tame",
                                         "one-bias-beyond-tame"};
static const char *const kind_names[] = {"none", "dense", "factored", "seeded", "conv"};

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;
    size_t B, T, C;
    size_t heads, window;
    int shared_keys;     /* conv: kc = heads */
    int causal;
    mask_mode mask;
    vals_mode vals;
    uint64_t seed;
    int threads;
    int one_row;         /* conv: a bias of one row for every head (shape recorded) */
} gcase;

/* inputs, bias storage and configuration of one case */
typedef struct {
    gcase c;
    size_t kc, H, nq, nk, ndense, nfac, nconv;
    float *q, *k, *v, *dout;
    float *dense, *fu, *fv, *conv;
    uint8_t *mask;
    aft_bias bias;
    aft_config cfg;
} gdata;

/* what one backward call gives */
typedef struct {
    float *dq, *dk, *dv, *out, *ddense, *du, *dv_f, *dconv;
} grads;

static void describe(char *buf, size_t n, const gcase *c)
{
    snprintf(buf, n,
             "variant=%s bias=%s B=%zu T=%zu C=%zu heads=%zu window=%zu shared_keys=%d one_row=%d causal=%d "
             "mask=%s values=%s seed=%llu threads=%d",
             aft_variant_name(c->variant), kind_names[c->kind], c->B, c->T, c->C, c->heads, c->window,
             c->shared_keys, c->one_row, c->causal, mask_names[c->mask], vals_names[c->vals],
             (unsigned long long)c->seed, c->threads);
}

static uint8_t *make_mask(rng *r, size_t nb, size_t T)
{
    uint8_t *m = xmalloc(nb * T * T);
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t t2 = 0; t2 < T; t2++)
                m[(b * T + t) * T + t2] = (t + b) % 5 == 2 ? 0 : (uint8_t)(rng_unif(r) < 0.7);
    return m;
}

static void build(gdata *d, const gcase *c)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    size_t B = c->B, T = c->T, C = c->C;
    d->H = c->variant == AFT_CONV ? c->heads : 1;
    d->kc = c->variant == AFT_CONV && c->shared_keys ? c->heads : C;
    rng r = {c->seed * 0x2545F4914F6CDD1Dull + T * 131 + C * 7 + B};
    int extreme = c->vals == VALS_WIDE || c->vals == VALS_ONE_HUGE || c->vals == VALS_ADVERSE;
    double span = extreme ? 250.0 : 1.0;

    d->cfg.variant = c->variant;
    d->cfg.window = c->window;
    d->cfg.heads = c->heads;
    d->cfg.causal = c->causal;
    d->cfg.threads = c->threads;
    d->cfg.impl = AFT_IMPL_FAST;

    d->bias.kind = c->kind;
    switch (c->kind) {
    case AFT_BIAS_DENSE: {
        size_t tmax = T + 3;   /* a stride other than T */
        d->ndense = tmax * tmax;
        d->dense = xmalloc(d->ndense * sizeof *d->dense);
        for (size_t i = 0; i < d->ndense; i++)
            d->dense[i] = extreme ? on_grid(span * rng_sym(&r), 0x1p-8) : (float)rng_sym(&r);
        d->bias.dense = d->dense;
        d->bias.tmax = tmax;
        break;
    }
    case AFT_BIAS_FACTORED: {
        size_t tmax = T + 2, rank = extreme ? 2 : 3;
        double s = extreme ? 11.0 : 0.6;
        d->nfac = tmax * rank;
        d->fu = xmalloc(d->nfac * sizeof *d->fu);
        d->fv = xmalloc(d->nfac * sizeof *d->fv);
        for (size_t i = 0; i < d->nfac; i++) {
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
        size_t rows = c->one_row ? 1 : c->heads, len = 2 * c->window - 1;
        d->nconv = rows * len;
        d->conv = xmalloc(d->nconv * sizeof *d->conv);
        for (size_t i = 0; i < d->nconv; i++)
            d->conv[i] = extreme ? on_grid(span * rng_sym(&r), 0x1p-8) : (float)rng_sym(&r);
        d->bias.conv = d->conv;
        if (c->one_row) {
            d->bias.conv_len = len;
            d->bias.conv_rows = 1;
        }
        break;
    }
    default:
        break;
    }
    if (c->mask != MASK_NONE) {
        d->mask = make_mask(&r, c->mask == MASK_BATCHED ? B : 1, T);
        d->bias.mask = d->mask;
        d->bias.mask_batched = c->mask == MASK_BATCHED;
    }

    d->nq = B * T * C;
    d->nk = B * T * d->kc;
    d->q = xmalloc(d->nq * sizeof *d->q);
    d->v = xmalloc(d->nq * sizeof *d->v);
    d->dout = xmalloc(d->nq * sizeof *d->dout);
    d->k = xmalloc(d->nk * sizeof *d->k);
    for (size_t i = 0; i < d->nq; i++) {
        d->q[i] = extreme ? (float)(8.0 * rng_sym(&r)) : (float)rng_normal(&r);
        d->v[i] = (float)rng_sym(&r);
        d->dout[i] = (float)rng_sym(&r);
    }
    for (size_t b = 0; b < B; b++)
        for (size_t t2 = 0; t2 < T; t2++)
            for (size_t j = 0; j < d->kc; j++) {
                float *kk = &d->k[(b * T + t2) * d->kc + j];
                switch (c->vals) {
                case VALS_NORMAL:
                case VALS_BEYOND_KEY:
                case VALS_BEYOND_BIAS:
                    *kk = (float)rng_normal(&r);
                    break;
                case VALS_WIDE:
                    *kk = on_grid(500.0 * rng_sym(&r), 0x1p-8);
                    break;
                case VALS_ONE_HUGE:
                    *kk = t2 == 2 * T / 3 ? 500.0f : -500.0f;
                    break;
                case VALS_ADVERSE: {
                    /* for one query row t* per key channel the largest key
                     * sits where w is most negative (see test_op.c) */
                    size_t head = d->kc == C ? j / (C / d->H) : j;
                    size_t ts = (j * 7 + 3) % T;
                    double w = c->kind == AFT_BIAS_CONV && c->one_row
                                   ? (fabs((double)ts - (double)t2) < (double)c->window
                                          ? d->conv[t2 + c->window - 1 - ts] : 0.0)
                                   : ref_aft_bias_entry(&d->bias, &d->cfg, head, ts, t2);
                    *kk = (float)(375.0 - 0.5 * w);
                    break;
                }
                }
            }
    /* one entry of 3e38: the last channel of the middle key (batch 0), or
     * row T / 3's own bias (inside every window) */
    if (c->vals == VALS_BEYOND_KEY) d->k[(T / 2) * d->kc + d->kc - 1] = 3e38f;
    if (c->vals == VALS_BEYOND_BIAS && d->dense) d->dense[(T / 3) * d->bias.tmax + T / 3] = 3e38f;
}

static void free_data(gdata *d)
{
    free(d->q); free(d->k); free(d->v); free(d->dout);
    free(d->dense); free(d->fu); free(d->fv); free(d->conv);
    free(d->mask);
}

static void grads_alloc(grads *g, const gdata *d)
{
    g->dq = xcalloc(d->nq, sizeof(float));
    g->dk = xcalloc(d->nk, sizeof(float));
    g->dv = xcalloc(d->nq, sizeof(float));
    g->out = xcalloc(d->nq, sizeof(float));
    g->ddense = d->ndense ? xmalloc(d->ndense * sizeof(float)) : NULL;
    g->du = d->nfac ? xmalloc(d->nfac * sizeof(float)) : NULL;
    g->dv_f = d->nfac ? xmalloc(d->nfac * sizeof(float)) : NULL;
    g->dconv = d->nconv ? xmalloc(d->nconv * sizeof(float)) : NULL;
    /* unwritten entries show as NaN */
    for (size_t i = 0; i < d->ndense; i++) g->ddense[i] = NAN;
    for (size_t i = 0; i < d->nfac; i++) g->du[i] = g->dv_f[i] = NAN;
    for (size_t i = 0; i < d->nconv; i++) g->dconv[i] = NAN;
}

static void grads_free(grads *g)
{
    free(g->dq); free(g->dk); free(g->dv); free(g->out);
    free(g->ddense); free(g->du); free(g->dv_f); free(g->dconv);
}

/* one backward call with impl and threads; returns the status */
static aft_status run_backward(grads *g, const gdata *d, aft_impl impl, int threads, aft_error *err)
{
    grads_alloc(g, d);
    aft_config cfg = d->cfg;
    cfg.impl = impl;
    cfg.threads = threads;
    aft_bias_grad db = {.dense = g->ddense, .u = g->du, .v = g->dv_f, .conv = g->dconv};
    return aft_op_backward(g->dq, g->dk, g->dv, &db, g->out, d->dout, d->q, d->k, d->v, &d->bias, &cfg, d->c.B,
                           d->c.T, d->c.C, d->kc, err);
}

/* ---------------------------------------------------------------- comparisons */

/* got against want (n entries): finite wherever want is, and max |got -
 * want| <= tol * max(1, max |want|). Returns 1 on a failure (printed while
 * *reports < MAX_REPORTS). */
static int compare(const char *tensor, const float *got, const double *want, size_t n, double tol,
                   const char *what, int *reports)
{
    double maxw = 0.0, maxe = 0.0;
    size_t worst = 0, bad_finite = 0, first_bad = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs(want[i]) > maxw) maxw = fabs(want[i]);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(want[i])) continue;
        if (!isfinite(got[i])) {
            if (!bad_finite++) first_bad = i;
            continue;
        }
        double e = fabs((double)got[i] - want[i]);
        if (e > maxe) {
            maxe = e;
            worst = i;
        }
    }
    double lim = tol * (maxw > 1.0 ? maxw : 1.0);
    if (bad_finite) {
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL %s: %zu entries not finite, first [%zu] = %g (want %.9g): %s\n", tensor, bad_finite,
                          first_bad, (double)got[first_bad], want[first_bad], what);
        return 1;
    }
    if (maxe > lim) {
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL %s: max |err| %.3g > %.3g at [%zu] (got %.9g, want %.9g; max |want| %.3g): %s\n",
                          tensor, maxe, lim, worst, (double)got[worst], want[worst], maxw, what);
        return 1;
    }
    return 0;
}

static int compare_f(const char *tensor, const float *got, const float *want, size_t n, double tol,
                     const char *what, int *reports)
{
    double *w = xmalloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) w[i] = want[i];
    int r = compare(tensor, got, w, n, tol, what, reports);
    free(w);
    return r;
}

/* every tensor of two backward results */
static int compare_grads(const grads *got, const grads *want, const gdata *d, double tol, const char *what,
                         int *reports)
{
    int f = 0;
    f += compare_f("dq", got->dq, want->dq, d->nq, tol, what, reports);
    f += compare_f("dk", got->dk, want->dk, d->nk, tol, what, reports);
    f += compare_f("dv", got->dv, want->dv, d->nq, tol, what, reports);
    f += compare_f("out", got->out, want->out, d->nq, tol, what, reports);
    if (d->ndense) f += compare_f("d dense", got->ddense, want->ddense, d->ndense, tol, what, reports);
    if (d->nfac) {
        f += compare_f("d u", got->du, want->du, d->nfac, tol, what, reports);
        f += compare_f("d v (factored)", got->dv_f, want->dv_f, d->nfac, tol, what, reports);
    }
    if (d->nconv) f += compare_f("d conv", got->dconv, want->dconv, d->nconv, tol, what, reports);
    return f;
}

/* ---------------------------------------------------------------- 1. reference against finite differences */

/* sum dout * Y from ref_aft.c's float64 forward (one-row conv biases
 * repeated for every head: ref_aft.c reads (heads, 2S-1)) */
typedef struct {
    const gdata *d;
    double *qd, *kd, *vd, *y;
    float *conv_rows;   /* the conv bias as (heads, 2S-1) */
    aft_bias bias;
} fd_ctx;

static void fd_sync_conv(fd_ctx *x)
{
    const gdata *d = x->d;
    if (!d->conv) return;
    size_t len = 2 * d->c.window - 1;
    for (size_t h = 0; h < d->H; h++)
        memcpy(x->conv_rows + h * len, d->conv + (d->c.one_row ? 0 : h) * len, len * sizeof(float));
}

static double fd_loss(fd_ctx *x)
{
    const gdata *d = x->d;
    fd_sync_conv(x);
    aft_config cfg = d->cfg;
    assert_int_equal(ref_aft_op_d(x->y, x->qd, x->kd, x->vd, &x->bias, &cfg, d->c.B, d->c.T, d->c.C, d->kc), 0);
    double s = 0.0;
    for (size_t i = 0; i < d->nq; i++) s += (double)d->dout[i] * x->y[i];
    return s;
}

/* central differences of fd_loss in each entry of a double array */
static void fd_double(fd_ctx *x, double *a, size_t n, double *g)
{
    for (size_t i = 0; i < n; i++) {
        double a0 = a[i], h = 1e-6 * (fabs(a0) > 1.0 ? fabs(a0) : 1.0);
        a[i] = a0 + h;
        double fp = fd_loss(x);
        a[i] = a0 - h;
        double fm = fd_loss(x);
        a[i] = a0;
        g[i] = (fp - fm) / (2.0 * h);
    }
}

/* the same for a float array (the bias): a step of 2^-12 times the entry's
 * power of two, so a +- h is exact */
static void fd_float(fd_ctx *x, float *a, size_t n, double *g)
{
    for (size_t i = 0; i < n; i++) {
        float a0 = a[i];
        int e;
        frexpf(a0, &e);
        float h = ldexpf(1.0f, (fabsf(a0) > 1.0f ? e : 1) - 13);
        a[i] = a0 + h;
        double fp = fd_loss(x);
        a[i] = a0 - h;
        double fm = fd_loss(x);
        a[i] = a0;
        g[i] = (fp - fm) / (2.0 * (double)h);
    }
}

static int fd_case(const gcase *c, int *reports)
{
    gdata d;
    build(&d, c);
    char what[512];
    describe(what, sizeof what, c);
    grads g;
    aft_error err = {{0}};
    aft_status st = run_backward(&g, &d, AFT_IMPL_REFERENCE, 1, &err);
    int fails = 0;
    if (st != AFT_OK) {
        print_message("FAIL reference backward status %d (%s): %s\n", (int)st, err.msg, what);
        fails = 1;
        goto done;
    }
    fd_ctx x = {.d = &d};
    x.qd = xmalloc(d.nq * sizeof(double));
    x.vd = xmalloc(d.nq * sizeof(double));
    x.kd = xmalloc(d.nk * sizeof(double));
    x.y = xmalloc(d.nq * sizeof(double));
    for (size_t i = 0; i < d.nq; i++) {
        x.qd[i] = d.q[i];
        x.vd[i] = d.v[i];
    }
    for (size_t i = 0; i < d.nk; i++) x.kd[i] = d.k[i];
    x.bias = d.bias;
    if (d.conv) {
        x.conv_rows = xmalloc(d.H * (2 * c->window - 1) * sizeof(float));
        x.bias.conv = x.conv_rows;
        x.bias.conv_len = 0;
        x.bias.conv_rows = 0;
    }
    double *fd = xmalloc((d.nq + d.nk + d.ndense + 2 * d.nfac + d.nconv + 1) * sizeof(double));
    /* the forward output first */
    (void)fd_loss(&x);
    fails += compare("out", g.out, x.y, d.nq, FD_TOL, what, reports);
    fd_double(&x, x.qd, d.nq, fd);
    fails += compare("dq", g.dq, fd, d.nq, FD_TOL, what, reports);
    fd_double(&x, x.kd, d.nk, fd);
    fails += compare("dk", g.dk, fd, d.nk, FD_TOL, what, reports);
    fd_double(&x, x.vd, d.nq, fd);
    fails += compare("dv", g.dv, fd, d.nq, FD_TOL, what, reports);
    if (d.ndense) {
        fd_float(&x, d.dense, d.ndense, fd);
        fails += compare("d dense", g.ddense, fd, d.ndense, FD_TOL_BIAS, what, reports);
    }
    if (d.nfac) {
        fd_float(&x, d.fu, d.nfac, fd);
        fails += compare("d u", g.du, fd, d.nfac, FD_TOL_BIAS, what, reports);
        fd_float(&x, d.fv, d.nfac, fd);
        fails += compare("d v (factored)", g.dv_f, fd, d.nfac, FD_TOL_BIAS, what, reports);
    }
    if (d.nconv) {
        fd_float(&x, d.conv, d.nconv, fd);
        fails += compare("d conv", g.dconv, fd, d.nconv, FD_TOL_BIAS, what, reports);
    }
    free(fd);
    free(x.qd); free(x.kd); free(x.vd); free(x.y); free(x.conv_rows);
done:
    grads_free(&g);
    free_data(&d);
    return fails;
}

static void finish(int fails, int cases)
{
    if (fails) fail_msg("%d failures in %d cases (see above)", fails, cases);
}

/* every variant and bias kind, causal or not, each mask, B 1 and 2 */
static void test_ref_grad_fd(void **state)
{
    (void)state;
    typedef struct { aft_variant v; aft_bias_kind k; size_t heads, window; int shared, one_row; } vk;
    const vk vks[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0, 0},   {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0, 0},  {AFT_FULL, AFT_BIAS_NONE, 0, 0, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0, 0},  {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 2, 0, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 4, 0, 0}, {AFT_LOCAL, AFT_BIAS_DENSE, 0, 0, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0, 0},  {AFT_CONV, AFT_BIAS_CONV, 2, 3, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 3, 1, 0},    {AFT_CONV, AFT_BIAS_CONV, 3, 2, 1, 1},
        {AFT_CONV, AFT_BIAS_CONV, 1, 9, 0, 0},
    };
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(vks); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (int mask = MASK_NONE; mask <= MASK_BATCHED; mask++) {
                size_t B = (cases & 1) ? 2 : 1, T = 7 + (size_t)(cases % 3), C = 6;
                gcase c = {vks[i].v, vks[i].k, B, T, C, vks[i].heads, vks[i].window, vks[i].shared, causal,
                           (mask_mode)mask, VALS_NORMAL, 10 + (uint64_t)cases, 1, vks[i].one_row};
                fails += fd_case(&c, &reports);
                cases++;
            }
    finish(fails, cases);
}

/* keys of +-500 and biases of +-250: the gradients are those of a softmax
 * close to one-hot, and finite differences still see them */
static void test_ref_grad_fd_extreme(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 2, 9, 4, 0, 0, 0, 0, MASK_NONE, VALS_WIDE, 31, 1, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 1, 9, 4, 0, 0, 0, 1, MASK_BATCHED, VALS_ADVERSE, 32, 1, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 8, 4, 0, 0, 0, 1, MASK_NONE, VALS_WIDE, 33, 1, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 9, 4, 0, 3, 0, 0, MASK_NONE, VALS_ADVERSE, 34, 1, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 2, 9, 4, 0, 2, 0, 1, MASK_NONE, VALS_ONE_HUGE, 35, 1, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 9, 4, 0, 0, 0, 0, MASK_NONE, VALS_WIDE, 36, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 9, 4, 2, 3, 1, 1, MASK_SHARED, VALS_WIDE, 37, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 9, 4, 2, 3, 0, 0, MASK_NONE, VALS_ADVERSE, 38, 1, 0},
    };
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) fails += fd_case(&cs[i], &reports);
    finish(fails, (int)N_OF(cs));
}

/* ---------------------------------------------------------------- 2. fast against the reference */

/* one case: the fast kernels (c->threads) against the float64 reference */
static int run_case(const gcase *c, int *reports)
{
    gdata d;
    build(&d, c);
    char what[512];
    describe(what, sizeof what, c);
    grads gf, gr;
    aft_error err = {{0}};
    int fails = 0;
    aft_status st = run_backward(&gr, &d, AFT_IMPL_REFERENCE, 1, &err);
    if (st != AFT_OK) {
        if ((*reports)++ < MAX_REPORTS)
            print_message("FAIL reference status %d (%s): %s\n", (int)st, err.msg, what);
        fails++;
    }
    st = run_backward(&gf, &d, AFT_IMPL_FAST, c->threads, &err);
    if (st != AFT_OK) {
        if ((*reports)++ < MAX_REPORTS) print_message("FAIL fast status %d (%s): %s\n", (int)st, err.msg, what);
        fails++;
    }
    if (!fails) fails += compare_grads(&gf, &gr, &d, TOL_REL, what, reports);
    grads_free(&gf);
    grads_free(&gr);
    free_data(&d);
    return fails;
}

/* every case of a table, fast against the reference */
static void run_table(const gcase *cs, size_t n)
{
    int fails = 0, reports = 0;
    for (size_t i = 0; i < n; i++) fails += run_case(&cs[i], &reports);
    finish(fails, (int)n);
}

static const size_t small_T[] = {1, 7, 33, 130};
static const size_t grid_BC[4][2] = {{1, 5}, {3, 12}, {1, 12}, {3, 5}};

/* most grid cases on one thread (the suite stays fast on a busy machine),
 * every fourth on all cores; test_grad_threads runs 1 to 4 */
static int grid_threads(int n)
{
    return n % 4 == 0 ? 0 : 1;
}

/* full, local or simple over windows x causal x mask x T x (B, C); window
 * codes 999 = T, 1000 = T + 4 */
static void grid(aft_variant variant, aft_bias_kind kind, const size_t *windows, size_t nwin, uint64_t seed)
{
    int fails = 0, cases = 0, reports = 0;
    for (size_t wi = 0; wi < nwin; wi++)
        for (int causal = 0; causal <= 1; causal++)
            for (int mask = MASK_NONE; mask <= MASK_BATCHED; mask++)
                for (size_t ti = 0; ti < N_OF(small_T); ti++)
                    for (size_t bc = 0; bc < 2; bc++) {
                        size_t T = small_T[ti];
                        const size_t *BC = grid_BC[(2 * (ti + (size_t)mask + wi) + bc) % 4];
                        size_t s = windows[wi] == 1000 ? T + 4 : windows[wi] == 999 ? T : windows[wi];
                        gcase c = {variant, kind, BC[0], T, BC[1], 0, s, 0, causal, (mask_mode)mask, VALS_NORMAL,
                                   seed + (uint64_t)cases, grid_threads(cases), 0};
                        fails += run_case(&c, &reports);
                        cases++;
                    }
    finish(fails, cases);
}

static void test_grad_simple(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid(AFT_SIMPLE, AFT_BIAS_NONE, w, 1, 700);
}

static void test_grad_full(void **state)
{
    (void)state;
    const size_t w[] = {0};
    grid(AFT_FULL, AFT_BIAS_DENSE, w, 1, 100);
    grid(AFT_FULL, AFT_BIAS_FACTORED, w, 1, 200);
    grid(AFT_FULL, AFT_BIAS_SEEDED, w, 1, 300);
    grid(AFT_FULL, AFT_BIAS_NONE, w, 1, 350);
}

/* local windows 0 (= simple), 1, 3, T, T + 4 on each bias kind */
static void test_grad_local(void **state)
{
    (void)state;
    const size_t w[] = {0, 1, 3, 999, 1000};
    grid(AFT_LOCAL, AFT_BIAS_DENSE, w, N_OF(w), 400);
    grid(AFT_LOCAL, AFT_BIAS_FACTORED, w, N_OF(w), 500);
    grid(AFT_LOCAL, AFT_BIAS_SEEDED, w, N_OF(w), 600);
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
                            fails += run_case(&c, &reports);
                            cases++;
                        }
    }
    finish(fails, cases);
}

/* Large T (C = 16) so every blocked kernel crosses many block edges; odd
 * or prime T so no block size divides it */
static void test_grad_large(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1531, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 901, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 1, 1103, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 902, 0, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1009, 16, 0, 0, 0, 0, MASK_SHARED, VALS_NORMAL, 903, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1999, 16, 0, 37, 0, 1, MASK_NONE, VALS_NORMAL, 904, 0, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 2, 1201, 16, 0, 129, 0, 0, MASK_NONE, VALS_NORMAL, 905, 3, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 1, 1301, 16, 0, 70, 0, 0, MASK_NONE, VALS_NORMAL, 906, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1103, 16, 4, 50, 1, 1, MASK_NONE, VALS_NORMAL, 907, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1013, 16, 2, 90, 0, 0, MASK_NONE, VALS_NORMAL, 908, 4, 1},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 1777, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 909, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 1501, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 910, 3, 0},
    };
    run_table(cs, N_OF(cs));
}

/* every variant with keys of +-500 and biases of +-250 */
static void grid_extreme(vals_mode vals, uint64_t seed)
{
    struct { aft_variant v; aft_bias_kind k; size_t heads, window; int shared, one_row; } vs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0, 0},     {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0, 0},    {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 9, 0, 0}, {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 20, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0, 0},    {AFT_CONV, AFT_BIAS_CONV, 2, 5, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 4, 40, 1, 0},     {AFT_CONV, AFT_BIAS_CONV, 1, 2, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 3, 4, 0, 1},
    };
    const size_t Ts[] = {33, 130};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(vs); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (size_t ti = 0; ti < N_OF(Ts); ti++) {
                mask_mode mask = ti == 1 ? MASK_BATCHED : MASK_NONE;
                size_t C = vs[i].heads == 3 ? 9 : 12;
                gcase c = {vs[i].v, vs[i].k, 2, Ts[ti], C, vs[i].heads, vs[i].window, vs[i].shared, causal, mask,
                           vals, seed + (uint64_t)cases, grid_threads(cases), vs[i].one_row};
                fails += run_case(&c, &reports);
                /* the band kernels (no mask) at the second size too */
                if (mask != MASK_NONE && vs[i].v != AFT_FULL) {
                    c.mask = MASK_NONE;
                    c.seed += 7;
                    fails += run_case(&c, &reports);
                }
                cases++;
            }
    const gcase big[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 1, 1031, 16, 0, 0, 0, 1, MASK_NONE, vals, seed + 500, 0, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 1013, 16, 0, 0, 0, 0, MASK_NONE, vals, seed + 501, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 1021, 16, 0, 300, 0, vals != VALS_WIDE, MASK_NONE, vals, seed + 502, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 1021, 16, 2, 61, 0, 1, MASK_NONE, vals, seed + 503, 0, 0},
    };
    for (size_t i = 0; i < N_OF(big); i++, cases++) fails += run_case(&big[i], &reports);
    finish(fails, cases);
}

static void test_grad_extreme_wide(void **state)
{
    (void)state;
    grid_extreme(VALS_WIDE, 1000);
}

static void test_grad_extreme_one_huge_key(void **state)
{
    (void)state;
    grid_extreme(VALS_ONE_HUGE, 1100);
}

static void test_grad_extreme_adversarial(void **state)
{
    (void)state;
    grid_extreme(VALS_ADVERSE, 1200);
}

/* ---------------------------------------------------------------- the layer */

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;
    size_t heads, window;
    int shared;   /* conv: k_out = heads */
} lvariant;

/* one layer case: parameters, inputs and the gradients' arrays */
typedef struct {
    size_t B, T, D, C, KC;
    float *x, *dy, *w[4], *b[4];   /* q, k, v, o */
    float *dense, *fu, *fv, *conv;
    size_t nbias, nfac, nconv;
    uint8_t *mask;
    aft_params p;
    aft_config cfg;
} ldata;

/* wn[i], bn[i]: the sizes of weight and bias i */
static void lsizes(const ldata *L, size_t wn[4], size_t bn[4])
{
    wn[0] = wn[2] = L->C * L->D;
    wn[1] = L->KC * L->D;
    wn[3] = L->D * L->C;
    bn[0] = bn[2] = L->C;
    bn[1] = L->KC;
    bn[3] = L->D;
}

/* key_scale: the keys' weights times this (400 / max |K| in the extreme
 * case, as the PyTorch extreme fixtures do) */
static void lbuild(ldata *L, const lvariant *lv, size_t B, size_t T, size_t D, size_t C, int biases, int causal,
                   mask_mode mask, int extreme, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    rng r = {seed * 0x9E3779B97F4A7C15ull + 17};
    L->B = B; L->T = T; L->D = D; L->C = C;
    L->KC = lv->variant == AFT_CONV && lv->shared ? lv->heads : C;
    size_t wn[4], bn[4];
    lsizes(L, wn, bn);
    double ws = 1.0 / sqrt((double)D);
    for (int i = 0; i < 4; i++) {
        L->w[i] = xmalloc(wn[i] * sizeof(float));
        for (size_t j = 0; j < wn[i]; j++) L->w[i][j] = (float)(ws * rng_sym(&r));
        if (biases) {
            L->b[i] = xmalloc(bn[i] * sizeof(float));
            for (size_t j = 0; j < bn[i]; j++) L->b[i][j] = (float)(0.5 * rng_sym(&r));
        }
    }
    size_t n = B * T * D;
    L->x = xmalloc(n * sizeof(float));
    L->dy = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        L->x[i] = (float)rng_normal(&r);
        L->dy[i] = (float)rng_sym(&r);
    }
    double span = extreme ? 250.0 : 1.0;
    aft_bias *bias = &L->p.bias;
    bias->kind = lv->kind;
    if (lv->kind == AFT_BIAS_DENSE) {
        size_t tmax = T + 2;
        L->nbias = tmax * tmax;
        L->dense = xmalloc(L->nbias * sizeof(float));
        for (size_t i = 0; i < L->nbias; i++) L->dense[i] = on_grid(span * rng_sym(&r), 0x1p-8);
        bias->dense = L->dense;
        bias->tmax = tmax;
    } else if (lv->kind == AFT_BIAS_FACTORED) {
        size_t tmax = T + 1, rank = 2;
        L->nfac = tmax * rank;
        L->fu = xmalloc(L->nfac * sizeof(float));
        L->fv = xmalloc(L->nfac * sizeof(float));
        for (size_t i = 0; i < L->nfac; i++) {
            L->fu[i] = (float)(0.7 * rng_sym(&r));
            L->fv[i] = (float)(0.7 * rng_sym(&r));
        }
        bias->u = L->fu;
        bias->v = L->fv;
        bias->rank = rank;
        bias->tmax = tmax;
    } else if (lv->kind == AFT_BIAS_SEEDED) {
        bias->seed = seed;
        bias->scale = (float)span;
    } else if (lv->kind == AFT_BIAS_CONV) {
        L->nconv = lv->heads * (2 * lv->window - 1);
        L->conv = xmalloc(L->nconv * sizeof(float));
        for (size_t i = 0; i < L->nconv; i++) L->conv[i] = on_grid(span * rng_sym(&r), 0x1p-8);
        bias->conv = L->conv;
    }
    if (mask != MASK_NONE) {
        L->mask = make_mask(&r, mask == MASK_BATCHED ? B : 1, T);
        bias->mask = L->mask;
        bias->mask_batched = mask == MASK_BATCHED;
    }
    if (extreme) {
        /* keys up to +-400 (+ a bias up to +-100), as the extreme fixtures */
        double km = 0.0;
        for (size_t i = 0; i < B * T; i++)
            for (size_t o = 0; o < L->KC; o++) {
                double s = 0.0;
                for (size_t j = 0; j < D; j++) s += (double)L->x[i * D + j] * L->w[1][o * D + j];
                km = fabs(s) > km ? fabs(s) : km;
            }
        for (size_t j = 0; j < wn[1]; j++) L->w[1][j] = (float)(L->w[1][j] * 400.0 / km);
        if (L->b[1])
            for (size_t j = 0; j < bn[1]; j++) L->b[1][j] = (float)(100.0 * rng_sym(&r));
    }
    L->p.d_model = D;
    L->p.d_hidden = C;
    L->p.k_out = L->KC;
    L->p.wq = L->w[0]; L->p.wk = L->w[1]; L->p.wv = L->w[2]; L->p.wo = L->w[3];
    L->p.bq = L->b[0]; L->p.bk = L->b[1]; L->p.bv = L->b[2]; L->p.bo = L->b[3];
    L->cfg.variant = lv->variant;
    L->cfg.window = lv->window;
    L->cfg.heads = lv->heads;
    L->cfg.causal = causal;
    L->cfg.threads = 0;
}

static void lfree(ldata *L)
{
    free(L->x); free(L->dy);
    for (int i = 0; i < 4; i++) { free(L->w[i]); free(L->b[i]); }
    free(L->dense); free(L->fu); free(L->fv); free(L->conv); free(L->mask);
}

/* the gradients of one layer backward call, in one block */
typedef struct {
    float *dx, *w[4], *b[4], *y, *dense, *fu, *fv, *conv;
    float *blk;
} lgrads;

/* g's arrays in one block of NaNs: what a call does not write shows */
static void lalloc(lgrads *g, const ldata *L)
{
    size_t wn[4], bn[4], n = L->B * L->T * L->D;
    lsizes(L, wn, bn);
    size_t total = 2 * n + L->nbias + 2 * L->nfac + L->nconv;
    for (int i = 0; i < 4; i++) total += wn[i] + bn[i];
    g->blk = xmalloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) g->blk[i] = NAN;
    float *p = g->blk;
    g->dx = p; p += n;
    g->y = p; p += n;
    for (int i = 0; i < 4; i++) { g->w[i] = p; p += wn[i]; g->b[i] = p; p += bn[i]; }
    g->dense = L->nbias ? p : NULL; p += L->nbias;
    g->fu = L->nfac ? p : NULL; p += L->nfac;
    g->fv = L->nfac ? p : NULL; p += L->nfac;
    g->conv = L->nconv ? p : NULL;
}

/* one backward call asking only for the gradients in `want` (bit i: dx,
 * y, then dW and db of q, k, v, o; the position bias's always) */
enum { WANT_DX = 1, WANT_Y = 2, WANT_ALL = 0x3ff };
#define WANT_W(i) (4u << (2 * (i)))
#define WANT_B(i) (8u << (2 * (i)))
static aft_status lbackward_want(lgrads *g, const ldata *L, aft_impl impl, unsigned want, int threads,
                                 aft_error *err)
{
    lalloc(g, L);
    float *ws[4], *bs[4];
    for (int i = 0; i < 4; i++) {
        ws[i] = want & WANT_W(i) ? g->w[i] : NULL;
        bs[i] = want & WANT_B(i) ? g->b[i] : NULL;
    }
    aft_layer_grads lg = {want & WANT_DX ? g->dx : NULL, ws[0], bs[0], ws[1], bs[1], ws[2], bs[2], ws[3], bs[3],
                          {.dense = g->dense, .u = g->fu, .v = g->fv, .conv = g->conv}};
    aft_config cfg = L->cfg;
    cfg.impl = impl;
    cfg.threads = threads;
    return aft_layer_backward(&lg, want & WANT_Y ? g->y : NULL, L->dy, L->x, &L->p, &cfg, L->B, L->T, err);
}

static aft_status lbackward(lgrads *g, const ldata *L, aft_impl impl, int threads, aft_error *err)
{
    return lbackward_want(g, L, impl, WANT_ALL, threads, err);
}

static double lloss(const ldata *L, double *y)
{
    assert_int_equal(ref_aft_layer(y, L->x, &L->p, &L->cfg, L->B, L->T), 0);
    double s = 0.0;
    for (size_t i = 0; i < L->B * L->T * L->D; i++) s += (double)L->dy[i] * y[i];
    return s;
}

static void lfd(const ldata *L, float *a, size_t n, double *g, double *y)
{
    for (size_t i = 0; i < n; i++) {
        float a0 = a[i];
        int e;
        frexpf(a0, &e);
        float h = ldexpf(1.0f, (fabsf(a0) > 1.0f ? e : 1) - 13);
        a[i] = a0 + h;
        double fp = lloss(L, y);
        a[i] = a0 - h;
        double fm = lloss(L, y);
        a[i] = a0;
        g[i] = (fp - fm) / (2.0 * (double)h);
    }
}

static const char *const tensor_names[4] = {"q", "k", "v", "o"};

/* the reference layer backward against finite differences of ref_aft.c's layer */
static int layer_fd_case(const lvariant *lv, size_t B, size_t T, size_t D, size_t C, int biases, int causal,
                         mask_mode mask, uint64_t seed, int *reports)
{
    ldata L;
    lbuild(&L, lv, B, T, D, C, biases, causal, mask, 0, seed);
    char what[256];
    snprintf(what, sizeof what, "layer %s bias=%s B=%zu T=%zu D=%zu C=%zu k_out=%zu biases=%d causal=%d mask=%s "
             "seed=%llu", aft_variant_name(lv->variant), kind_names[lv->kind], B, T, D, C, L.KC, biases, causal,
             mask_names[mask], (unsigned long long)seed);
    lgrads g;
    aft_error err = {{0}};
    int fails = 0;
    aft_status st = lbackward(&g, &L, AFT_IMPL_REFERENCE, 1, &err);
    if (st != AFT_OK) {
        print_message("FAIL layer reference status %d (%s): %s\n", (int)st, err.msg, what);
        fails = 1;
    } else {
        size_t wn[4], bn[4], n = B * T * D;
        lsizes(&L, wn, bn);
        double *y = xmalloc(n * sizeof(double)), *fd = xmalloc((n + L.nbias + L.nfac + L.nconv + C * D) * sizeof(double));
        (void)lloss(&L, y);
        fails += compare("y", g.y, y, n, FD_TOL, what, reports);
        lfd(&L, L.x, n, fd, y);
        fails += compare("dx", g.dx, fd, n, FD_TOL_BIAS, what, reports);
        for (int i = 0; i < 4; i++) {
            char name[32];
            snprintf(name, sizeof name, "dW%s", tensor_names[i]);
            lfd(&L, L.w[i], wn[i], fd, y);
            fails += compare(name, g.w[i], fd, wn[i], FD_TOL_BIAS, what, reports);
            if (!L.b[i]) continue;
            snprintf(name, sizeof name, "db%s", tensor_names[i]);
            lfd(&L, L.b[i], bn[i], fd, y);
            fails += compare(name, g.b[i], fd, bn[i], FD_TOL_BIAS, what, reports);
        }
        if (L.nbias) {
            lfd(&L, L.dense, L.nbias, fd, y);
            fails += compare("d dense", g.dense, fd, L.nbias, FD_TOL_BIAS, what, reports);
        }
        if (L.nfac) {
            lfd(&L, L.fu, L.nfac, fd, y);
            fails += compare("d u", g.fu, fd, L.nfac, FD_TOL_BIAS, what, reports);
            lfd(&L, L.fv, L.nfac, fd, y);
            fails += compare("d v (factored)", g.fv, fd, L.nfac, FD_TOL_BIAS, what, reports);
        }
        if (L.nconv) {
            lfd(&L, L.conv, L.nconv, fd, y);
            fails += compare("d conv", g.conv, fd, L.nconv, FD_TOL_BIAS, what, reports);
        }
        free(y);
        free(fd);
    }
    free(g.blk);
    lfree(&L);
    return fails;
}

static const lvariant layer_variants[] = {
    {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0},  {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0}, {AFT_LOCAL, AFT_BIAS_DENSE, 0, 2, 0},
    {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 3, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},  {AFT_CONV, AFT_BIAS_CONV, 2, 3, 0},
    {AFT_CONV, AFT_BIAS_CONV, 2, 3, 1},
};

static void test_layer_ref_grad_fd(void **state)
{
    (void)state;
    const size_t dims[][2] = {{6, 4}, {4, 6}};   /* (D, C) */
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(layer_variants); i++)
        for (size_t di = 0; di < N_OF(dims); di++)
            for (int causal = 0; causal <= 1; causal++) {
                size_t B = (cases & 1) ? 2 : 1, T = 5 + (size_t)(cases % 3);
                fails += layer_fd_case(&layer_variants[i], B, T, dims[di][0], dims[di][1], (cases >> 1) & 1, causal,
                                       (mask_mode)(cases % 3), 500 + (uint64_t)cases, &reports);
                cases++;
            }
    finish(fails, cases);
}

/* every gradient of two layer backward results */
static int compare_layer(const lgrads *got, const lgrads *want, const ldata *L, double tol, const char *what,
                         int *reports)
{
    size_t wn[4], bn[4], n = L->B * L->T * L->D;
    lsizes(L, wn, bn);
    int f = 0;
    f += compare_f("y", got->y, want->y, n, tol, what, reports);
    f += compare_f("dx", got->dx, want->dx, n, tol, what, reports);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "dW%s", tensor_names[i]);
        f += compare_f(name, got->w[i], want->w[i], wn[i], tol, what, reports);
        snprintf(name, sizeof name, "db%s", tensor_names[i]);
        f += compare_f(name, got->b[i], want->b[i], bn[i], tol, what, reports);
    }
    if (L->nbias) f += compare_f("d dense", got->dense, want->dense, L->nbias, tol, what, reports);
    if (L->nfac) {
        f += compare_f("d u", got->fu, want->fu, L->nfac, tol, what, reports);
        f += compare_f("d v (factored)", got->fv, want->fv, L->nfac, tol, what, reports);
    }
    if (L->nconv) f += compare_f("d conv", got->conv, want->conv, L->nconv, tol, what, reports);
    return f;
}

static int layer_case(const lvariant *lv, size_t B, size_t T, size_t D, size_t C, int biases, int causal,
                      mask_mode mask, int extreme, uint64_t seed, int threads, int *reports)
{
    ldata L;
    lbuild(&L, lv, B, T, D, C, biases, causal, mask, extreme, seed);
    char what[256];
    snprintf(what, sizeof what, "layer %s bias=%s B=%zu T=%zu D=%zu C=%zu k_out=%zu biases=%d causal=%d mask=%s "
             "extreme=%d seed=%llu threads=%d", aft_variant_name(lv->variant), kind_names[lv->kind], B, T, D, C,
             L.KC, biases, causal, mask_names[mask], extreme, (unsigned long long)seed, threads);
    lgrads gf, gr;
    aft_error err = {{0}};
    int fails = 0;
    aft_status st = lbackward(&gr, &L, AFT_IMPL_REFERENCE, 1, &err);
    if (st != AFT_OK) {
        print_message("FAIL layer reference status %d (%s): %s\n", (int)st, err.msg, what);
        fails++;
    }
    st = lbackward(&gf, &L, AFT_IMPL_FAST, threads, &err);
    if (st != AFT_OK) {
        print_message("FAIL layer fast status %d (%s): %s\n", (int)st, err.msg, what);
        fails++;
    }
    if (!fails) fails += compare_layer(&gf, &gr, &L, TOL_REL, what, reports);
    free(gf.blk);
    free(gr.blk);
    lfree(&L);
    return fails;
}

/* the fast layer against its float64 reference: hidden size != D both
 * ways, projection biases or none, causal, masks, B 1 and 3 */
static void test_layer_grad(void **state)
{
    (void)state;
    const lvariant more[] = {{AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0}, {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 4, 0},
                             {AFT_CONV, AFT_BIAS_CONV, 4, 5, 1}, {AFT_CONV, AFT_BIAS_CONV, 2, 40, 1}};
    const size_t dims[][2] = {{10, 12}, {16, 8}};
    const size_t Ts[] = {7, 33, 97};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(layer_variants) + N_OF(more); i++)
        for (size_t di = 0; di < N_OF(dims); di++)
            for (int causal = 0; causal <= 1; causal++) {
                const lvariant *lv = i < N_OF(layer_variants) ? &layer_variants[i] : &more[i - N_OF(layer_variants)];
                size_t B = (cases & 1) ? 3 : 1, T = Ts[cases % 3];
                fails += layer_case(lv, B, T, dims[di][0], dims[di][1], (cases >> 1) & 1, causal,
                                    (mask_mode)((cases / 2) % 3), 0, 3000 + (uint64_t)cases, grid_threads(cases),
                                    &reports);
                cases++;
            }
    finish(fails, cases);
}

/* keys of +-400 (+ a key bias of +-100) and position biases of +-250 */
static void test_layer_grad_extreme(void **state)
{
    (void)state;
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(layer_variants); i++)
        for (int causal = 0; causal <= 1; causal++) {
            fails += layer_case(&layer_variants[i], 2, 41, 16, 12, 1, causal, MASK_NONE, 1, 4000 + (uint64_t)cases,
                                grid_threads(cases), &reports);
            cases++;
        }
    finish(fails, cases);
}

/* Asked for some of the gradients, the fast path gives those as when
 * asked for all, up to rounding (its products are planned around what is
 * asked: Q, K, V's weights in one product only when all three are wanted,
 * the biases' sums without dX), and writes nothing else. */
static void test_layer_grad_some(void **state)
{
    (void)state;
    const unsigned wants[] = {
        WANT_ALL & ~(unsigned)WANT_DX,                   /* all but dx */
        WANT_W(0) | WANT_B(1) | WANT_B(3),               /* some of the stacked ones */
        WANT_B(0) | WANT_B(1) | WANT_B(2),               /* the biases alone: no product */
        WANT_DX,                                         /* dx alone */
        WANT_Y | WANT_W(3) | WANT_W(1) | WANT_W(2),      /* dWo, y, two stacked */
    };
    const lvariant vs[] = {{AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0}, {AFT_CONV, AFT_BIAS_CONV, 2, 3, 1},
                           {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0}};
    int fails = 0, cases = 0, reports = 0;
    for (size_t v = 0; v < N_OF(vs); v++)
        for (size_t w = 0; w < N_OF(wants); w++) {
            ldata L;
            int threads = 1 + 2 * (int)(w & 1);
            lbuild(&L, &vs[v], 2, 150, 20, 12, 1, (int)(w & 1), MASK_NONE, 0, 900 + (uint64_t)cases);
            char what[160];
            snprintf(what, sizeof what, "layer %s want=%#x threads=%d", aft_variant_name(vs[v].variant), wants[w],
                     threads);
            lgrads all, some;
            aft_error err = {{0}};
            aft_status st = lbackward(&all, &L, AFT_IMPL_FAST, threads, &err);
            aft_status st2 = lbackward_want(&some, &L, AFT_IMPL_FAST, wants[w], threads, &err);
            if (st || st2) {
                print_message("FAIL status %d / %d (%s): %s\n", (int)st, (int)st2, err.msg, what);
                fails++;
            } else {
                size_t wn[4], bn[4], n = L.B * L.T * L.D;
                lsizes(&L, wn, bn);
                const float *got[10] = {some.dx, some.y}, *ref[10] = {all.dx, all.y};
                size_t len[10] = {n, n};
                for (int i = 0; i < 4; i++) {
                    got[2 + 2 * i] = some.w[i], ref[2 + 2 * i] = all.w[i], len[2 + 2 * i] = wn[i];
                    got[3 + 2 * i] = some.b[i], ref[3 + 2 * i] = all.b[i], len[3 + 2 * i] = bn[i];
                }
                static const char *const names[10] = {"dx", "y", "dWq", "dbq", "dWk", "dbk", "dWv", "dbv", "dWo",
                                                      "dbo"};
                for (int t = 0; t < 10; t++) {
                    if ((wants[w] >> t) & 1) {
                        fails += compare_f(names[t], got[t], ref[t], len[t], TOL_SAME, what, &reports);
                        continue;
                    }
                    size_t bad = 0;
                    for (size_t e = 0; e < len[t]; e++) bad += !isnan(got[t][e]);
                    if (bad) {
                        print_message("FAIL %s: %s written (%zu of %zu entries), not asked for\n", what, names[t],
                                      bad, len[t]);
                        fails++;
                    }
                }
            }
            free(all.blk);
            free(some.blk);
            lfree(&L);
            cases++;
        }
    finish(fails, cases);
}

/* threads 1 to 4 (and all cores) give the same gradients, to 1e-5 */
static void test_grad_threads(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 2, 301, 12, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 61, 1, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 257, 12, 0, 0, 0, 0, MASK_SHARED, VALS_NORMAL, 62, 1, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 301, 12, 0, 7, 0, 0, MASK_NONE, VALS_NORMAL, 63, 1, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 1, 301, 12, 0, 40, 0, 1, MASK_NONE, VALS_WIDE, 64, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 257, 12, 3, 9, 1, 1, MASK_NONE, VALS_NORMAL, 65, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 199, 12, 2, 120, 0, 0, MASK_NONE, VALS_ADVERSE, 66, 1, 1},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 301, 12, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 67, 1, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 301, 12, 0, 0, 0, 1, MASK_NONE, VALS_WIDE, 68, 1, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 5, 12, 0, 3, 0, 0, MASK_NONE, VALS_NORMAL, 69, 1, 0},
    };
    const int threads[] = {2, 3, 4, 0};
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        gdata d;
        build(&d, &cs[i]);
        grads g1;
        aft_error err = {{0}};
        assert_int_equal(run_backward(&g1, &d, AFT_IMPL_FAST, 1, &err), AFT_OK);
        for (size_t ti = 0; ti < N_OF(threads); ti++) {
            gcase c = cs[i];
            c.threads = threads[ti];
            char what[512];
            describe(what, sizeof what, &c);
            grads gn;
            assert_int_equal(run_backward(&gn, &d, AFT_IMPL_FAST, threads[ti], &err), AFT_OK);
            fails += compare_grads(&gn, &g1, &d, THREAD_TOL, what, &reports);
            grads_free(&gn);
        }
        grads_free(&g1);
        free_data(&d);
    }
    finish(fails, (int)N_OF(cs));
}

/* the band backward's slices of the rows: at least one a thread, at most 8;
 * more than one a thread only while each is at least 64 and 4 s rows (the
 * halos within T C floats) and the private bias copies beyond the threads'
 * within T C floats */
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
                    if (ns > nt) ok = ok && T / ns >= rows && (double)(ns - nt) * (double)priv <= (double)T * C;
                    /* one slice fewer would not have been needed */
                    if (ns < 8 * nt) ok = ok && (T / (ns + 1) < rows || (double)(ns + 1 - nt) * (double)priv > (double)T * C);
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
        build(&d, &cs[i]);
        char what[512];
        describe(what, sizeof what, &cs[i]);
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
        free_data(&d);
    }
    assert_int_equal(fails, 0);
}

/* zero_outside: a dense gradient with garbage (NaN) in every entry the run
 * may write comes out with the same bits as a run that clears all of it.
 * The entries outside hold a mark the run cannot write, standing for the
 * caller's zeros: each must keep it or be cleared to 0 (clearing more than
 * is written is allowed), and take no other value. Local's band on and off
 * the diagonal's edges, with and without causality, and full's block:
 * without causality its first sequence sets the entries (one sequence or
 * more, one group or two, one block of rows or two), with causality they
 * are cleared and added to; tmax > T, so rows are tmax apart. */
static void test_grad_zero_outside(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 37, 16, 0, 5, 0, 1, MASK_NONE, VALS_NORMAL, 91, 2, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 37, 16, 0, 5, 0, 0, MASK_NONE, VALS_NORMAL, 92, 1, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 300, 16, 0, 40, 0, 1, MASK_NONE, VALS_NORMAL, 93, 2, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 2, 37, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 94, 2, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 3, 37, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 95, 1, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 1, 300, 16, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 96, 2, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 2, 37, 16, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 97, 2, 0},
    };
    const float mark = 12345.0f;
    int fails = 0;
    for (size_t i = 0; i < N_OF(cs); i++) {
        gdata d;
        build(&d, &cs[i]);
        char what[512];
        describe(what, sizeof what, &cs[i]);
        aft_error err = {{0}};
        grads all;   /* every entry cleared by the library */
        assert_int_equal(run_backward(&all, &d, AFT_IMPL_FAST, cs[i].threads, &err), AFT_OK);
        grads g;
        grads_alloc(&g, &d);
        /* garbage where the run writes (the entries it made nonzero, and
         * for local the whole band), the mark elsewhere */
        const size_t tm = d.bias.tmax, T = d.c.T, s = d.c.window;
        for (size_t t = 0; t < tm; t++)
            for (size_t j = 0; j < tm; j++) {
                int used = t < T && j < T && (d.c.variant == AFT_FULL || (t < j + s && j < t + s));
                g.ddense[t * tm + j] = used ? NAN : all.ddense[t * tm + j] == 0.0f ? mark : -1.0f;
            }
        aft_config cfg = d.cfg;
        cfg.threads = cs[i].threads;
        aft_bias_grad db = {.dense = g.ddense, .zero_outside = 1};
        assert_int_equal(aft_op_backward(g.dq, g.dk, g.dv, &db, g.out, d.dout, d.q, d.k, d.v, &d.bias, &cfg, d.c.B,
                                         T, d.c.C, d.kc, &err),
                         AFT_OK);
        size_t bad = 0;
        for (size_t n = 0; n < d.ndense; n++) {
            float want = all.ddense[n] == 0.0f && g.ddense[n] == mark ? mark : all.ddense[n];
            bad += memcmp(&g.ddense[n], &want, sizeof want) != 0;
        }
        if (bad) {
            printf("  %zu entries differ from a run that clears everything (%s)\n", bad, what);
            fails++;
        }
        grads_free(&g);
        grads_free(&all);
        free_data(&d);
    }
    assert_int_equal(fails, 0);
}

/* ---------------------------------------------------------------- 5. the PyTorch fixtures */

typedef struct {
    const char *name;
    aft_variant variant;
    size_t window;
    int causal, tbd;   /* tbd: x, y in labml's (T, B, D) layout */
    int band;          /* compare the position bias inside |i - j| < window
                        * only (torch's is upstream's replaced parameter) */
} torch_case;

static void read_npy_f32(const char *dir, const char *file, aft_tensor *t)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    aft_error err = {{0}};
    if (aft_npy_read(path, t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    assert_int_equal(t->dtype, AFT_F32);
    assert_int_equal(t->ndim, 3);
}

/* (A, B, D) -> (B, A, D) */
static void swap01(float *dst, const float *src, size_t A, size_t B, size_t D)
{
    for (size_t a = 0; a < A; a++)
        for (size_t b = 0; b < B; b++) memcpy(dst + (b * A + a) * D, src + (a * B + b) * D, D * sizeof(float));
}

/* got against the fixture's tensor name (its first n floats; rows x cols
 * when band: only entries with |i - j| < band, i, j < lim compared, and
 * got 0 elsewhere) */
static int compare_named(const aft_st_file *gf, const char *name, const float *got, size_t n, size_t cols,
                         size_t band, size_t lim, const char *what, int *reports)
{
    const aft_tensor *t = aft_st_find(gf, name);
    if (!t) {
        print_message("FAIL %s: no tensor '%s' in grads.safetensors\n", what, name);
        return 1;
    }
    assert_int_equal(t->dtype, AFT_F32);
    assert_int_equal(t->nelem, n);
    const float *want = t->data;
    double *w = xmalloc(n * sizeof *w);
    int outside = 0;
    for (size_t i = 0; i < n; i++) {
        size_t r = cols ? i / cols : 0, c = cols ? i % cols : 0;
        int in = !band || (r < lim && c < lim && (r > c ? r - c : c - r) < band);
        w[i] = in ? want[i] : 0.0;
        outside |= !in && got[i] != 0.0f;
    }
    int f = compare(name, got, w, n, TOL_REL, what, reports);
    if (outside) {
        print_message("FAIL %s: %s nonzero outside the window\n", what, name);
        f++;
    }
    free(w);
    return f;
}

static int torch_case_run(const torch_case *tc, int *reports)
{
    char dir[1024], path[1100], what[256];
    snprintf(dir, sizeof dir, "%s/torch/%s", files_testdata(), tc->name);
    snprintf(what, sizeof what, "torch fixture %s as %s window %zu causal %d", tc->name,
             aft_variant_name(tc->variant), tc->window, tc->causal);
    aft_error err = {{0}};
    aft_st_file *wf, *gf;
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (aft_st_open(path, &wf, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    snprintf(path, sizeof path, "%s/grads.safetensors", dir);
    if (aft_st_open(path, &gf, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    aft_weights w;
    if (aft_weights_load(wf, "", tc->variant, &w, &err) != AFT_OK) fail_msg("%s: %s", dir, err.msg);
    aft_tensor xt, dyt;
    read_npy_f32(dir, "x.npy", &xt);
    read_npy_f32(dir, "dy.npy", &dyt);
    const aft_params *p = &w.p;
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out;
    size_t B = tc->tbd ? xt.shape[1] : xt.shape[0], T = tc->tbd ? xt.shape[0] : xt.shape[1], n = B * T * D;
    assert_int_equal(xt.shape[2], D);
    float *x = xmalloc(n * sizeof *x), *dy = xmalloc(n * sizeof *dy), *dx = xmalloc(n * sizeof *dx);
    float *dxl = xmalloc(n * sizeof *dxl);
    if (tc->tbd) {
        swap01(x, xt.data, T, B, D);
        swap01(dy, dyt.data, T, B, D);
    } else {
        memcpy(x, xt.data, n * sizeof *x);
        memcpy(dy, dyt.data, n * sizeof *dy);
    }
    size_t tmax = p->bias.kind == AFT_BIAS_DENSE ? p->bias.tmax : 0;
    float *gw[4], *gb[4], *gdense = tmax ? xmalloc(tmax * tmax * sizeof(float)) : NULL;
    const size_t wn[4] = {C * D, KC * D, C * D, D * C}, bn[4] = {C, KC, C, D};
    for (int i = 0; i < 4; i++) {
        gw[i] = xmalloc(wn[i] * sizeof(float));
        gb[i] = xmalloc(bn[i] * sizeof(float));
    }
    aft_layer_grads g = {dx, gw[0], gb[0], gw[1], gb[1], gw[2], gb[2], gw[3], gb[3], {.dense = gdense}};
    aft_config cfg = {0};
    cfg.variant = tc->variant;
    cfg.window = tc->window;
    cfg.causal = tc->causal;
    int fails = 0;
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        cfg.impl = impls[ii];
        char w2[300];
        snprintf(w2, sizeof w2, "%s [%s]", what, impls[ii] == AFT_IMPL_FAST ? "fast" : "reference");
        if (aft_layer_backward(&g, NULL, dy, x, p, &cfg, B, T, &err) != AFT_OK) {
            print_message("FAIL %s: %s\n", w2, err.msg);
            fails++;
            continue;
        }
        if (tc->tbd) swap01(dxl, dx, B, T, D);
        else memcpy(dxl, dx, n * sizeof *dx);
        fails += compare_named(gf, "input", dxl, n, 0, 0, 0, w2, reports);
        for (int i = 0; i < 4; i++) {
            char bname[200];
            fails += compare_named(gf, w.names[i], gw[i], wn[i], 0, 0, 0, w2, reports);
            /* "stem.weight" -> "stem.bias" */
            snprintf(bname, sizeof bname, "%.*s.bias", (int)(strlen(w.names[i]) - strlen(".weight")), w.names[i]);
            fails += compare_named(gf, bname, gb[i], bn[i], 0, 0, 0, w2, reports);
        }
        if (gdense) fails += compare_named(gf, w.names[4], gdense, tmax * tmax, tmax, tc->band ? tc->window : 0, T, w2,
                                           reports);
    }
    for (int i = 0; i < 4; i++) {
        free(gw[i]);
        free(gb[i]);
    }
    free(gdense); free(x); free(dy); free(dx); free(dxl);
    aft_tensor_free(&xt);
    aft_tensor_free(&dyt);
    aft_weights_free(&w);
    aft_st_close(wf);
    aft_st_close(gf);
    return fails;
}

/* torch.autograd's gradients of labml's AFTLocal and rish-16's AFTFull,
 * AFTSimple and AFTLocal (testdata/make_torch_grad_fixtures.py) against
 * aft_layer_backward on the same weights, to 1e-4 * max(1, max |g|).
 * rish-16's AFTLocal replaces its wbias by a band-masked copy at every
 * forward, so torch's wbias gradient is that of a full bias: full matches it
 * whole, local inside the window (and is 0 outside). */
static void test_grad_torch_fixtures(void **state)
{
    (void)state;
    const torch_case cs[] = {
        {"labml_local", AFT_LOCAL, 4, 1, 1, 0},
        {"rish_full", AFT_FULL, 0, 0, 0, 0},
        {"rish_simple", AFT_SIMPLE, 0, 0, 0, 0},
        {"rish_local", AFT_FULL, 0, 0, 0, 0},
        {"rish_local", AFT_LOCAL, 3, 0, 0, 1},
    };
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) fails += torch_case_run(&cs[i], &reports);
    finish(fails, (int)N_OF(cs));
}

/* A key of +inf or NaN (only non-finite inputs make one): every kernel
 * returns AFT_OK and stays inside its arrays (the sanitizer build checks
 * that). Which gradients come out NaN is not specified: the reference
 * drops the rows whose denominator is NaN, the fast kernels let the NaN
 * reach more of the key's channel (and every dw those rows touch). */
static void test_grad_nonfinite_keys(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 2, 40, 5, 0, 3, 0, 1, MASK_NONE, VALS_NORMAL, 71, 0, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 1, 70, 5, 0, 4, 0, 0, MASK_NONE, VALS_NORMAL, 72, 0, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 1, 40, 5, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 73, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 200, 5, 0, 0, 0, 0, MASK_NONE, VALS_NORMAL, 74, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 1, 200, 5, 0, 0, 0, 1, MASK_NONE, VALS_NORMAL, 75, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 40, 6, 2, 3, 0, 0, MASK_SHARED, VALS_NORMAL, 76, 0, 0},
    };
    for (size_t i = 0; i < N_OF(cs); i++)
        for (int kind = 0; kind < 2; kind++) {
            gdata d;
            build(&d, &cs[i]);
            d.k[(cs[i].T / 2) * d.kc + 1] = kind ? NAN : INFINITY;
            grads gf, gr;
            aft_error err = {{0}};
            assert_int_equal(run_backward(&gr, &d, AFT_IMPL_REFERENCE, 1, &err), AFT_OK);
            assert_int_equal(run_backward(&gf, &d, AFT_IMPL_FAST, cs[i].threads, &err), AFT_OK);
            grads_free(&gf);
            grads_free(&gr);
            free_data(&d);
        }
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
    run_table(cs, N_OF(cs));
}

/* ---------------------------------------------------------------- arguments */

/* refusals name what is wrong; empty sizes write the (zero) gradients whole */
static void test_grad_errors(void **state)
{
    (void)state;
    const size_t B = 1, T = 5, C = 4, n = B * T * C;
    float q[20], k[20], v[20], dout[20], dq[20], dk[20], dv[20], dense[36], ddense[36];
    for (size_t i = 0; i < n; i++) q[i] = k[i] = v[i] = dout[i] = 0.1f * (float)i;
    for (size_t i = 0; i < 36; i++) dense[i] = 0.0f;
    aft_bias bias = {.kind = AFT_BIAS_DENSE, .dense = dense, .tmax = 6};
    aft_config cfg = {0};
    cfg.variant = AFT_FULL;
    aft_error err = {{0}};
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        cfg.impl = impls[ii];
        assert_int_equal(aft_op_backward(NULL, dk, dv, NULL, NULL, dout, q, k, v, &bias, &cfg, B, T, C, C, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "dq"));
        assert_int_equal(aft_op_backward(dq, dk, dv, NULL, NULL, NULL, q, k, v, &bias, &cfg, B, T, C, C, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "dout"));
        /* the forward's rules: a dense bias smaller than T */
        bias.tmax = 4;
        assert_int_equal(aft_op_backward(dq, dk, dv, NULL, NULL, dout, q, k, v, &bias, &cfg, B, T, C, C, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "Tmax"));
        bias.tmax = 6;
        /* conv: 4 heads do not divide 6 channels */
        aft_bias cb = {.kind = AFT_BIAS_CONV, .conv = dense};
        aft_config cc = cfg;
        cc.variant = AFT_CONV;
        cc.heads = 4;
        cc.window = 2;
        assert_int_equal(aft_op_backward(dq, dk, dv, NULL, NULL, dout, q, k, v, &cb, &cc, 1, 2, 6, 6, &err),
                         AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "heads"));
        /* T = 0: nothing to do, but the bias gradient asked for is written (0) */
        for (size_t i = 0; i < 36; i++) ddense[i] = NAN;
        aft_bias_grad db = {.dense = ddense};
        assert_int_equal(aft_op_backward(dq, dk, dv, &db, NULL, dout, q, k, v, &bias, &cfg, B, 0, C, C, &err), AFT_OK);
        for (size_t i = 0; i < 36; i++) assert_true(ddense[i] == 0.0f);
    }
    /* the layer: no gradients struct; and B = 0, where every gradient is 0 */
    float wq[16], wo[16], gw[8][16], x[20], dy[20];
    for (size_t i = 0; i < 16; i++) wq[i] = wo[i] = 0.25f;
    for (size_t i = 0; i < 20; i++) x[i] = dy[i] = 1.0f;
    aft_params p = {.d_model = 4, .d_hidden = 4, .k_out = 4, .wq = wq, .wk = wq, .wv = wq, .wo = wo, .bias = bias};
    assert_int_equal(aft_layer_backward(NULL, NULL, dy, x, &p, &cfg, 1, 5, &err), AFT_ERR_ARG);
    for (size_t i = 0; i < 8; i++)
        for (size_t j = 0; j < 16; j++) gw[i][j] = NAN;
    for (size_t i = 0; i < 36; i++) ddense[i] = NAN;
    aft_layer_grads g = {NULL, gw[0], gw[1], gw[2], gw[3], gw[4], gw[5], gw[6], gw[7], {.dense = ddense}};
    for (size_t ii = 0; ii < N_OF(impls); ii++) {
        cfg.impl = impls[ii];
        assert_int_equal(aft_layer_backward(&g, NULL, NULL, NULL, &p, &cfg, 0, 5, &err), AFT_OK);
        for (size_t i = 0; i < 8; i++)
            for (size_t j = 0; j < (i % 2 ? 4 : 16); j++) assert_true(gw[i][j] == 0.0f);
        for (size_t i = 0; i < 36; i++) assert_true(ddense[i] == 0.0f);
        /* missing input */
        assert_int_equal(aft_layer_backward(&g, NULL, dy, NULL, &p, &cfg, 1, 5, &err), AFT_ERR_ARG);
        assert_non_null(strstr(err.msg, "x"));
    }
}

/* ---------------------------------------------------------------- grids */

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
                fails += compare(names[a], g[0][a], fd, lens[a], FD_TOL, what, &reports);
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
            fails += compare(names[3], g[0][3], fd, nb, FD_TOL_BIAS, what, &reports);
            /* the fast backward against the reference's */
            const size_t all[4] = {n, nk, n, nb};
            for (int a = 0; a < 4; a++) {
                for (size_t j = 0; j < all[a]; j++) fd[j] = g[0][a][j];
                fails += compare(names[a], g[1][a], fd, all[a], TOL_REL, what, &reports);
            }
            for (int m = 0; m < 2; m++)
                for (int a = 0; a < 4; a++) free(g[m][a]);
            free(q); free(k); free(v); free(dout); free(bw); free(qd); free(kd); free(vd); free(y); free(fd);
        }
    finish(fails, (int)(2 * N_OF(cs)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_grad_fd),
        cmocka_unit_test(test_ref_grad_fd_extreme),
        cmocka_unit_test(test_layer_ref_grad_fd),
        cmocka_unit_test(test_layer_grad),
        cmocka_unit_test(test_layer_grad_extreme),
        cmocka_unit_test(test_layer_grad_some),
        cmocka_unit_test(test_band_grad_slices),
        cmocka_unit_test(test_grad_threads),
        cmocka_unit_test(test_grad_same_bits_every_run),
        cmocka_unit_test(test_grad_zero_outside),
        cmocka_unit_test(test_grad_torch_fixtures),
        cmocka_unit_test(test_grad_errors),
        cmocka_unit_test(test_grad_nonfinite_keys),
        cmocka_unit_test(test_grad_beyond_tame),
        cmocka_unit_test(test_grad_full),
        cmocka_unit_test(test_grad_simple),
        cmocka_unit_test(test_grad_local),
        cmocka_unit_test(test_grad_conv),
        cmocka_unit_test(test_grad_grid),
        cmocka_unit_test(test_grad_large),
        cmocka_unit_test(test_grad_extreme_wide),
        cmocka_unit_test(test_grad_extreme_one_huge_key),
        cmocka_unit_test(test_grad_extreme_adversarial),
    };
    const char *filter = getenv("TEST_GRAD_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
