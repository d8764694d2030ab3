/* opcheck.c - the forward tests' cases (opcheck.h) */
#include "opcheck.h"

#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "layer.h"    /* aft_layer_forward_chunked */
#include "ref_aft.h"
#include "rng.h"

aft_kernel g_full_product = AFT_KERNEL_AUTO;
size_t g_chunk = 0;
double g_key_bias = 0.5;

/* ---------------------------------------------------------------- operator cases */

void op_describe(char *buf, size_t n, const op_case *c, size_t kc)
{
    snprintf(buf, n,
             "variant=%s bias=%s B=%zu T=%zu C=%zu kc=%zu heads=%zu window=%zu "
             "causal=%d mask=%s values=%s seed=%llu threads=%d",
             aft_variant_name(c->variant), kind_names[c->kind], c->B, c->T, c->C, kc,
             c->heads, c->window, c->causal, mask_names[c->mask], vals_names[c->vals],
             (unsigned long long)c->seed, c->threads);
}

void build_case(case_data *d, const op_case *c)
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
    case AFT_BIAS_FACTORED:
        make_factored(&r, &d->bias, &d->fu, &d->fv, T, extreme);
        break;
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

    make_qkv(&r, &d->q, &d->k, &d->v, c->vals, &d->bias, &d->cfg, B, T, C, d->kc);
    size_t nq = B * T * C;
    d->ref = xmalloc(nq * sizeof *d->ref);
    int rc = ref_aft_op(d->ref, d->q, d->k, d->v, &d->bias, &d->cfg, B, T, C, d->kc);
    if (rc != 0) {
        char buf[512];
        op_describe(buf, sizeof buf, c, d->kc);
        fail_msg("reference refused its own case: %s", buf);
    }
}

void free_case(case_data *d)
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

/* Runs the library once with the given impl and thread count, checks the
 * status, that the inputs are untouched, every output finite, invisible rows
 * exactly 0 and the error within tolerance. Returns 1 on a failure (printed
 * when *reports < MAX_REPORTS), else 0. */
static int check_impl(case_data *d, aft_impl impl, int threads, int *reports)
{
    const op_case *c = &d->c;
    size_t B = c->B, T = c->T, C = c->C, n = B * T * C;
    char what[512];
    op_describe(what, sizeof what, c, d->kc);

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
    double tol = OP_TOL_REL * (maxref > 1.0 ? maxref : 1.0);
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
int op_run_case(const op_case *c, int *reports)
{
    case_data d;
    build_case(&d, c);
    int fails = check_impl(&d, AFT_IMPL_FAST, c->threads, reports) +
                check_impl(&d, AFT_IMPL_REFERENCE, c->threads, reports);
    free_case(&d);
    return fails;
}

/* the end of every grid test: all cases must have passed */
void op_finish(int fails, int cases)
{
    if (fails) fail_msg("%d of %d comparisons failed (see above)", fails, 2 * cases);
}

/* a dense bias: w (tmax x tmax), row t for query t */
aft_bias dense_bias(const float *w, size_t tmax)
{
    aft_bias b;
    memset(&b, 0, sizeof b);
    b.kind = AFT_BIAS_DENSE;
    b.dense = w;
    b.tmax = tmax;
    return b;
}

aft_config make_cfg(aft_variant v, size_t window, size_t heads, int causal)
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

/* full, local or simple over windows x causal x mask x T, with (B, C)
 * cycling, for one bias kind */
void grid_full(aft_variant variant, aft_bias_kind kind, const size_t *windows,
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
                        fails += op_run_case(&c, &reports);
                        cases++;
                    }
    op_finish(fails, cases);
}

/* ---------------------------------------------------------------- layer cases */

/* a layer's parameters with the given weights, nothing else set */
aft_params layer_params(size_t D, size_t C, const float *wq, const float *wk, const float *wv,
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
int run_layer_case(const layer_variant *lv, size_t B, size_t T, size_t D, size_t C,
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
    double tol = OP_TOL_REL * (maxref > 1 ? maxref : 1);

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

/* ---------------------------------------------------------------- refusals */

/* case-insensitive substring */
int contains_ci(const char *hay, const char *needle)
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
int check_error(const char *what, aft_status st, const aft_error *err, const char *words,
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
