/*
 * test_layer_grad.c - the layer's backward (lib/layer_grad.c,
 * aft_layer_backward):
 *  - its float64 reference against central finite differences of
 *    ref_aft.c's layer, every weight, bias and position bias;
 *  - the fast path against the reference (hidden size != D both ways,
 *    projection biases or none, causal, masks; keys of +-400 and biases of
 *    +-250), and asked for some of the gradients only;
 *  - the PyTorch fixtures (testdata/torch/, the *_grad cases): torch.autograd's
 *    gradients of labml's and rish-16's layers against aft_layer_backward,
 *    to 1e-4 * max(1, max |g|);
 *  - what it refuses.
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
#include "gradcheck.h"
#include "ref_aft.h"
#include "rng.h"

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
        fails += grad_compare("y", g.y, y, n, GRAD_FD_TOL, what, reports);
        lfd(&L, L.x, n, fd, y);
        fails += grad_compare("dx", g.dx, fd, n, GRAD_FD_TOL_BIAS, what, reports);
        for (int i = 0; i < 4; i++) {
            char name[32];
            snprintf(name, sizeof name, "dW%s", tensor_names[i]);
            lfd(&L, L.w[i], wn[i], fd, y);
            fails += grad_compare(name, g.w[i], fd, wn[i], GRAD_FD_TOL_BIAS, what, reports);
            if (!L.b[i]) continue;
            snprintf(name, sizeof name, "db%s", tensor_names[i]);
            lfd(&L, L.b[i], bn[i], fd, y);
            fails += grad_compare(name, g.b[i], fd, bn[i], GRAD_FD_TOL_BIAS, what, reports);
        }
        if (L.nbias) {
            lfd(&L, L.dense, L.nbias, fd, y);
            fails += grad_compare("d dense", g.dense, fd, L.nbias, GRAD_FD_TOL_BIAS, what, reports);
        }
        if (L.nfac) {
            lfd(&L, L.fu, L.nfac, fd, y);
            fails += grad_compare("d u", g.fu, fd, L.nfac, GRAD_FD_TOL_BIAS, what, reports);
            lfd(&L, L.fv, L.nfac, fd, y);
            fails += grad_compare("d v (factored)", g.fv, fd, L.nfac, GRAD_FD_TOL_BIAS, what, reports);
        }
        if (L.nconv) {
            lfd(&L, L.conv, L.nconv, fd, y);
            fails += grad_compare("d conv", g.conv, fd, L.nconv, GRAD_FD_TOL_BIAS, what, reports);
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
    grad_finish(fails, cases);
}

/* every gradient of two layer backward results */
static int compare_layer(const lgrads *got, const lgrads *want, const ldata *L, double tol, const char *what,
                         int *reports)
{
    size_t wn[4], bn[4], n = L->B * L->T * L->D;
    lsizes(L, wn, bn);
    int f = 0;
    f += grad_compare_f("y", got->y, want->y, n, tol, what, reports);
    f += grad_compare_f("dx", got->dx, want->dx, n, tol, what, reports);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "dW%s", tensor_names[i]);
        f += grad_compare_f(name, got->w[i], want->w[i], wn[i], tol, what, reports);
        snprintf(name, sizeof name, "db%s", tensor_names[i]);
        f += grad_compare_f(name, got->b[i], want->b[i], bn[i], tol, what, reports);
    }
    if (L->nbias) f += grad_compare_f("d dense", got->dense, want->dense, L->nbias, tol, what, reports);
    if (L->nfac) {
        f += grad_compare_f("d u", got->fu, want->fu, L->nfac, tol, what, reports);
        f += grad_compare_f("d v (factored)", got->fv, want->fv, L->nfac, tol, what, reports);
    }
    if (L->nconv) f += grad_compare_f("d conv", got->conv, want->conv, L->nconv, tol, what, reports);
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
    if (!fails) fails += compare_layer(&gf, &gr, &L, GRAD_TOL_REL, what, reports);
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
    grad_finish(fails, cases);
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
    grad_finish(fails, cases);
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
                        fails += grad_compare_f(names[t], got[t], ref[t], len[t], GRAD_TOL_SAME, what, &reports);
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
    grad_finish(fails, cases);
}

/* ---------------------------------------------------------------- the PyTorch fixtures */

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
    int f = grad_compare(name, got, w, n, GRAD_TOL_REL, what, reports);
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
    grad_finish(fails, (int)N_OF(cs));
}

/* ---------------------------------------------------------------- arguments */

/* refusals name what is wrong; empty sizes write the (zero) gradients whole
 * (aft_op_backward's: tests/ops/test_op.c) */
static void test_layer_grad_errors(void **state)
{
    (void)state;
    float dense[36], ddense[36];
    for (size_t i = 0; i < 36; i++) dense[i] = 0.0f;
    aft_bias bias = {.kind = AFT_BIAS_DENSE, .dense = dense, .tmax = 6};
    aft_config cfg = {0};
    cfg.variant = AFT_FULL;
    cfg.impl = AFT_IMPL_REFERENCE;
    aft_error err = {{0}};
    const aft_impl impls[] = {AFT_IMPL_FAST, AFT_IMPL_REFERENCE};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_ref_grad_fd),
        cmocka_unit_test(test_layer_grad),
        cmocka_unit_test(test_layer_grad_extreme),
        cmocka_unit_test(test_layer_grad_some),
        cmocka_unit_test(test_grad_torch_fixtures),
        cmocka_unit_test(test_layer_grad_errors),
    };
    /* TEST_GRAD_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_GRAD_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
