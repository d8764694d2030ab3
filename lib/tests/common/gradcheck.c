/* gradcheck.c - the backward tests' cases (gradcheck.h) */
#include "gradcheck.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ref_aft.h"
#include "rng.h"

void grad_describe(char *buf, size_t n, const gcase *c)
{
    snprintf(buf, n,
             "variant=%s bias=%s B=%zu T=%zu C=%zu heads=%zu window=%zu shared_keys=%d one_row=%d causal=%d "
             "mask=%s values=%s seed=%llu threads=%d",
             aft_variant_name(c->variant), kind_names[c->kind], c->B, c->T, c->C, c->heads, c->window,
             c->shared_keys, c->one_row, c->causal, mask_names[c->mask], vals_names[c->vals],
             (unsigned long long)c->seed, c->threads);
}

void grad_build(gdata *d, const gcase *c)
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
    case AFT_BIAS_FACTORED:
        d->nfac = make_factored(&r, &d->bias, &d->fu, &d->fv, T, extreme);
        break;
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
                case VALS_RISING:    /* the forward's mode: normal keys here */
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
                     * sits where w is most negative (see cases.h) */
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

void grad_free_data(gdata *d)
{
    free(d->q); free(d->k); free(d->v); free(d->dout);
    free(d->dense); free(d->fu); free(d->fv); free(d->conv);
    free(d->mask);
}

void grads_alloc(grads *g, const gdata *d)
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

void grads_free(grads *g)
{
    free(g->dq); free(g->dk); free(g->dv); free(g->out);
    free(g->ddense); free(g->du); free(g->dv_f); free(g->dconv);
}

/* one backward call with impl and threads; returns the status */
aft_status run_backward(grads *g, const gdata *d, aft_impl impl, int threads, aft_error *err)
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
int grad_compare(const char *tensor, const float *got, const double *want, size_t n, double tol,
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

int grad_compare_f(const char *tensor, const float *got, const float *want, size_t n, double tol,
                   const char *what, int *reports)
{
    double *w = xmalloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) w[i] = want[i];
    int r = grad_compare(tensor, got, w, n, tol, what, reports);
    free(w);
    return r;
}

/* every tensor of two backward results */
int compare_grads(const grads *got, const grads *want, const gdata *d, double tol, const char *what,
                  int *reports)
{
    int f = 0;
    f += grad_compare_f("dq", got->dq, want->dq, d->nq, tol, what, reports);
    f += grad_compare_f("dk", got->dk, want->dk, d->nk, tol, what, reports);
    f += grad_compare_f("dv", got->dv, want->dv, d->nq, tol, what, reports);
    f += grad_compare_f("out", got->out, want->out, d->nq, tol, what, reports);
    if (d->ndense) f += grad_compare_f("d dense", got->ddense, want->ddense, d->ndense, tol, what, reports);
    if (d->nfac) {
        f += grad_compare_f("d u", got->du, want->du, d->nfac, tol, what, reports);
        f += grad_compare_f("d v (factored)", got->dv_f, want->dv_f, d->nfac, tol, what, reports);
    }
    if (d->nconv) f += grad_compare_f("d conv", got->dconv, want->dconv, d->nconv, tol, what, reports);
    return f;
}

void grad_finish(int fails, int cases)
{
    if (fails) fail_msg("%d failures in %d cases (see above)", fails, cases);
}

/* ---------------------------------------------------------------- fast against the reference */

/* one case: the fast kernels (c->threads) against the float64 reference */
int grad_run_case(const gcase *c, int *reports)
{
    gdata d;
    grad_build(&d, c);
    char what[512];
    grad_describe(what, sizeof what, c);
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
    if (!fails) fails += compare_grads(&gf, &gr, &d, GRAD_TOL_REL, what, reports);
    grads_free(&gf);
    grads_free(&gr);
    grad_free_data(&d);
    return fails;
}

/* every case of a table, fast against the reference */
void grad_run_table(const gcase *cs, size_t n)
{
    int fails = 0, reports = 0;
    for (size_t i = 0; i < n; i++) fails += grad_run_case(&cs[i], &reports);
    grad_finish(fails, (int)n);
}

/* full, local or simple over windows x causal x mask x T x (B, C); window
 * codes 999 = T, 1000 = T + 4 */
void grad_grid(aft_variant variant, aft_bias_kind kind, const size_t *windows, size_t nwin, uint64_t seed)
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
                        fails += grad_run_case(&c, &reports);
                        cases++;
                    }
    grad_finish(fails, cases);
}
