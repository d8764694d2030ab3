/* slice.c - a sequence held in slices, for callers that hold only some rows
 * of each sequence (one process of several, each with its own rows): the
 * layer's K | V of some rows, the key sums of rows, and the layer's output
 * for a slice from the rows and the key sums around it. The causal layer's
 * other half, a state seeded at a slice's first row, is in state.c.
 *
 * Key sums (sums.h) are the one thing a slice needs of the rows far from
 * it: their merge is associative up to rounding, so the sums of the rows
 * before a slice can be put together from any pieces, in any grouping. */
#include "layer.h"

#include <omp.h>

#include <limits.h>
#include <math.h>
#include <stdlib.h>

void aft_key_sums_empty(float *sums, size_t C)
{
    aft_sums_empty(sums, C);
}

void aft_key_sums_merge(float *a, const float *b, size_t C)
{
    aft_sums_merge(a, b, C);
}

int aft_key_sums_ok(const float *sums, size_t C)
{
    const float *m = sums, *s0 = sums + C, *s1 = sums + 2 * C;
    for (size_t c = 0; c < C; c++)
        if (!(m[c] < INFINITY) || !(s0[c] >= 0.0f) || !isfinite(s0[c]) || !isfinite(s1[c])) return 0;
    return 1;
}

/* ---- K | V of rows */

/* what the entry points below share: the settled operator, the layer's
 * packed weights, and views of them for Q alone and for K, V together */
typedef struct {
    aft_opspec sp;
    aft_layer_prep lp;
    aft_linear lq, lkv;
    int have_q, have_kv;
    size_t D, C, KC, chunk;
} slice_prep;

static void slice_prep_free(slice_prep *s)
{
    if (s->have_q) aft_linear_free(&s->lq);
    if (s->have_kv) aft_linear_free(&s->lkv);
    if (s->lp.wcat) aft_layer_prep_free(&s->lp);
}

static aft_status slice_prep_init(slice_prep *s, const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                                  aft_error *err)
{
    memset(s, 0, sizeof *s);
    if (!p || !cfg) return aft_fail(err, AFT_ERR_ARG, "missing layer parameters or configuration (NULL)");
    if (cfg->impl == AFT_IMPL_REFERENCE) return aft_fail(err, AFT_ERR_ARG, "slices run the fast kernels only");
    if (cfg->grid_h || cfg->grid_w)
        return aft_fail(err, AFT_ERR_ARG, "slices run 1-D sequences only, not a grid (%zu x %zu)", cfg->grid_h,
                        cfg->grid_w);
    s->D = p->d_model;
    s->C = p->d_hidden;
    s->KC = p->k_out ? p->k_out : s->C;
    aft_status st = aft_spec_settle(&s->sp, &p->bias, cfg, B, T ? T : 1, s->C, s->KC, err);
    if (!st) st = aft_layer_prep_init(&s->lp, p, cfg->projections, cfg->precision, s->sp.threads, err);
    if (!st && !(st = aft_linear_view(&s->lq, &s->lp.qkv, 0, s->C, err))) s->have_q = 1;
    if (!st && !(st = aft_linear_view(&s->lkv, &s->lp.qkv, s->C, s->KC + s->C, err))) s->have_kv = 1;
    if (st) {
        slice_prep_free(s);
        return st;
    }
    /* chunks as the layer's chunked paths take them, so each row comes
     * from a product of the same shape */
    s->chunk = aft_layer_step(&s->lp);
    return AFT_OK;
}

/* K | V of rows [0, n) of x (rows D apart) into kv (rows 2C apart), keys
 * widened to one per value channel; kvw: n (KC + C) floats of scratch when
 * the keys have one channel per head */
static void kv_rows(const slice_prep *s, const float *x, size_t n, float *kv, float *kvw)
{
    const size_t C = s->C, KC = s->KC;
    if (KC == C) {
        aft_linear_apply(&s->lkv, n, x, s->D, kv, 2 * C);
        return;
    }
    aft_linear_apply(&s->lkv, n, x, s->D, kvw, KC + C);
    size_t per = C / KC;
    for (size_t i = 0; i < n; i++) {
        const float *src = kvw + i * (KC + C);
        float *dst = kv + i * 2 * C;
        for (size_t c = 0; c < C; c++) dst[c] = src[c / per];
        memcpy(dst + C, src + KC, C * sizeof(float));
    }
}

aft_status aft_layer_kv(float *kv, const float *x, const aft_params *p, const aft_config *cfg, size_t B, size_t n,
                        aft_error *err)
{
    if (B == 0 || n == 0) return AFT_OK;
    if (!kv || !x) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !kv ? "kv" : "x");
    slice_prep s;
    aft_status st = slice_prep_init(&s, p, cfg, B, n, err);
    if (st) return st;
    const size_t N = B * n, chunk = s.chunk, nch = (N + chunk - 1) / chunk, C = s.C;
    int nt = s.sp.threads < (int)nch ? s.sp.threads : (int)nch;
    float *kvw = s.KC != C ? aft_alloc_array((size_t)nt * chunk, (s.KC + C) * sizeof(float)) : NULL;
    if (s.KC != C && !kvw) {
        slice_prep_free(&s);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for K, V of %zu rows", chunk);
    }
    /* rows of all sequences in a row: K | V of a row depends on its x alone */
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t j = 0; j < nch; j++) {
        size_t r0 = j * chunk, len = N - r0 < chunk ? N - r0 : chunk;
        float *scr = kvw ? kvw + (size_t)omp_get_thread_num() * chunk * (s.KC + C) : NULL;
        kv_rows(&s, x + r0 * s.D, len, kv + r0 * 2 * C, scr);
    }
    free(kvw);
    slice_prep_free(&s);
    return AFT_OK;
}

/* ---- key sums of rows */

aft_status aft_kv_sums(float *sums, int *nonfinite, const float *kv, size_t B, size_t n, size_t C, size_t r0,
                       size_t r1, aft_error *err)
{
    if (r0 > r1 || r1 > n)
        return aft_fail(err, AFT_ERR_ARG, "rows [%zu, %zu) are not within the %zu rows held", r0, r1, n);
    float *scr = aft_alloc_array(C ? C : 1, sizeof(float));
    if (!scr) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu channels", C);
    int bad = 0;
    for (size_t b = 0; b < B; b++) {
        float *r = sums + b * 4 * C;
        const float *kb = kv + b * n * 2 * C;
        bad |= aft_sums_of_rows(kb, 2 * C, kb + C, 2 * C, r0, r1, C, r, r + C, r + 2 * C, scr);
        memcpy(r + 3 * C, r, C * sizeof(float));
    }
    free(scr);
    if (nonfinite) *nonfinite = bad;
    return AFT_OK;
}

aft_status aft_layer_key_sums(float *sums, int *nonfinite, const float *x, const aft_params *p,
                              const aft_config *cfg, size_t B, size_t n, size_t r0, size_t r1, aft_error *err)
{
    if (r0 > r1 || r1 > n)
        return aft_fail(err, AFT_ERR_ARG, "rows [%zu, %zu) are not within the %zu rows held", r0, r1, n);
    slice_prep s;
    aft_status st = slice_prep_init(&s, p, cfg, B, n ? n : 1, err);
    if (st) return st;
    const size_t C = s.C, chunk = s.chunk, rows = r1 - r0, nch = (rows + chunk - 1) / chunk;
    for (size_t b = 0; b < B; b++) aft_sums_empty(sums + b * 4 * C, C);
    int nt = s.sp.threads < (int)(nch ? nch : 1) ? s.sp.threads : (int)(nch ? nch : 1);
    float *kv = aft_alloc_array((size_t)nt * chunk, 2 * C * sizeof(float));
    float *kvw = s.KC != C ? aft_alloc_array((size_t)nt * chunk, (s.KC + C) * sizeof(float)) : NULL;
    float *part = aft_alloc_array(nch ? nch : 1, 4 * C * sizeof(float));
    float *scr = aft_alloc_array((size_t)nt, C * sizeof(float));
    if (!kv || (s.KC != C && !kvw) || !part || !scr) {
        free(kv); free(kvw); free(part); free(scr);
        slice_prep_free(&s);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for K, V of %zu rows", chunk);
    }
    int bad = 0;
    for (size_t b = 0; b < B; b++) {
        /* each chunk's sums on its thread, then added up in order */
        #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(|:bad)
        for (size_t j = 0; j < nch; j++) {
            size_t tid = (size_t)omp_get_thread_num(), R0 = r0 + j * chunk, len = r1 - R0 < chunk ? r1 - R0 : chunk;
            float *kt = kv + tid * chunk * 2 * C, *pj = part + j * 4 * C;
            kv_rows(&s, x + (b * n + R0) * s.D, len, kt, kvw ? kvw + tid * chunk * (s.KC + C) : NULL);
            bad |= aft_sums_of_rows(kt, 2 * C, kt + C, 2 * C, 0, len, C, pj, pj + C, pj + 2 * C, scr + tid * C);
            memcpy(pj + 3 * C, pj, C * sizeof(float));
        }
        for (size_t j = 0; j < nch; j++) aft_sums_merge(sums + b * 4 * C, part + j * 4 * C, C);
    }
    free(kv); free(kvw); free(part); free(scr);
    slice_prep_free(&s);
    if (nonfinite) *nonfinite = bad;
    return AFT_OK;
}

/* ---- the layer over a slice */

typedef enum { SLICE_BAND, SLICE_GLOBAL, SLICE_DENSE } slice_kind;

static slice_kind kind_of(const aft_opspec *sp)
{
    if (sp->bias->mask || sp->variant == AFT_FULL) return SLICE_DENSE;
    if (!sp->causal && sp->zero_bias) return SLICE_GLOBAL;
    return SLICE_BAND;
}

aft_status aft_layer_slice_halo(const aft_params *p, const aft_config *cfg, size_t T, size_t *halo, aft_error *err)
{
    slice_prep s;
    aft_status st = slice_prep_init(&s, p, cfg, 1, T, err);
    if (st) return st;
    slice_kind k = kind_of(&s.sp);
    *halo = k == SLICE_DENSE ? SIZE_MAX : k == SLICE_GLOBAL ? 0 : aft_spec_halo(&s.sp);
    slice_prep_free(&s);
    return AFT_OK;
}

typedef struct {
    float *y;
    const float *x, *kv, *left, *right;
    size_t B, T, t0, t1, a0, a1;
} slice_args;

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* slice_band's points into pt (room for 2 nch + 2): a0, a1, and each of
 * the nch chunks' first held row and (without causality) its window's end,
 * sorted, without repeats. Returns how many. */
static size_t slice_points(const slice_args *a, size_t *pt, size_t chunk, size_t nch, size_t halo, int causal)
{
    size_t npt = 0;
    pt[npt++] = a->a0;
    pt[npt++] = a->a1;
    for (size_t j = 0; j < nch; j++) {
        size_t R0 = a->t0 + j * chunk, len = a->t1 - R0 < chunk ? a->t1 - R0 : chunk;
        pt[npt++] = R0 - (R0 < halo ? R0 : halo);
        if (!causal) pt[npt++] = R0 + len + halo < a->T ? R0 + len + halo : a->T;
    }
    qsort(pt, npt, sizeof *pt, cmp_size);
    size_t u = 1;
    for (size_t i = 1; i < npt; i++)
        if (pt[i] != pt[u - 1]) pt[u++] = pt[i];
    return u;
}

/* Sequence b's key sums at the npt points (its held K | V in kvb): suf[i]
 * the sums of piece [pt[i], pt[i+1]) first, then of [pt[i], a1) and
 * `right`; pre[i]: `left` and [a0, pt[i]). Returns 0 when a key of +inf
 * or NaN is among them (then pre is not made). */
static int slice_key_sums(const slice_args *a, size_t b, const float *kvb, const size_t *pt, size_t npt, size_t C,
                          float *pre, float *suf, float *scr)
{
    int bad = 0;
    for (size_t i = 0; i + 1 < npt; i++) {
        float *r = suf + i * 4 * C;
        bad |= aft_sums_of_rows(kvb, 2 * C, kvb + C, 2 * C, pt[i] - a->a0, pt[i + 1] - a->a0, C, r, r + C,
                                r + 2 * C, scr);
        memcpy(r + 3 * C, r, C * sizeof(float));
    }
    const float *lb = a->left ? a->left + b * 4 * C : NULL, *rb = a->right ? a->right + b * 4 * C : NULL;
    if ((lb && !aft_key_sums_ok(lb, C)) || (rb && !aft_key_sums_ok(rb, C))) bad = 1;
    if (bad) return 0;
    if (lb) memcpy(pre, lb, 4 * C * sizeof(float));
    else aft_sums_empty(pre, C);
    for (size_t i = 1; i < npt; i++) {
        memcpy(pre + i * 4 * C, pre + (i - 1) * 4 * C, 4 * C * sizeof(float));
        aft_sums_merge(pre + i * 4 * C, suf + (i - 1) * 4 * C, C);
    }
    if (rb) memcpy(suf + (npt - 1) * 4 * C, rb, 4 * C * sizeof(float));
    else aft_sums_empty(suf + (npt - 1) * 4 * C, C);
    for (size_t i = npt - 1; i-- > 0;) aft_sums_merge(suf + i * 4 * C, suf + (i + 1) * 4 * C, C);
    return 1;
}

/* Causal slices: the first held row (from a0) with a NaN key, or `held`;
 * with one, kv's keys copied into *clean (NaN as -inf, which reach
 * nothing), which the caller frees */
static size_t first_nan_key(const float *kvb, size_t held, size_t C, float **clean)
{
    size_t first = held;
    for (size_t i = 0; i < held && first == held; i++) {
        unsigned bad = 0;
        for (size_t c = 0; c < C; c++) bad |= kvb[i * 2 * C + c] != kvb[i * 2 * C + c];
        if (bad) first = i;
    }
    *clean = NULL;
    if (first == held) return held;
    *clean = aft_alloc_array(held, 2 * C * sizeof(float));
    if (!*clean) return first;
    for (size_t i = 0; i < held * 2 * C; i++) {
        float x = kvb[i];
        (*clean)[i] = i % (2 * C) < C && x != x ? -INFINITY : x;
    }
    return first;
}

/* The band (local, conv; causal simple), as the layer's streamed path
 * without causality does it for a whole sequence: the held keys cut into
 * pieces at each chunk's held rows' start and window's end, the pieces'
 * sums added up from the left (after `left`) and from the right (before
 * `right`), then each chunk on its own thread: Q, the band kernel's rows
 * with the sums on either side, the output projection. A sequence with a
 * key of +inf or NaN in its sums, or among those held without causality,
 * comes out NaN; with causality a NaN key held makes its row and the later
 * ones NaN. Returns 1 when done, -1 on error (*st). */
static int slice_band(const slice_args *a, slice_prep *s, aft_status *st, aft_error *err)
{
    const size_t C = s->C, D = s->D, n = a->t1 - a->t0, chunk = s->chunk, nch = (n + chunk - 1) / chunk;
    const size_t halo = aft_spec_halo(&s->sp), held = a->a1 - a->a0, T = a->T;
    const int causal = s->sp.causal;
    int nt = s->sp.threads < (int)nch ? s->sp.threads : (int)nch;
    size_t *pt = malloc((2 * nch + 2) * sizeof *pt), npt = 0;
    float *pre = aft_alloc_array(2 * nch + 2, 4 * C * sizeof(float));
    float *suf = aft_alloc_array(2 * nch + 2, 4 * C * sizeof(float));
    float *q = aft_alloc_array((size_t)nt * chunk, C * sizeof(float));
    float *h = aft_alloc_array((size_t)nt * chunk, C * sizeof(float));
    float *scr = aft_alloc_array(C, sizeof(float));
    aft_op_rows_ctx **ctx = calloc((size_t)nt, sizeof *ctx);
    aft_opspec ws = s->sp;
    ws.ldq = C;
    ws.ldk = ws.ldv = 2 * C;
    int ok = pt && pre && suf && q && h && scr && ctx;
    for (int i = 0; ok && i < nt; i++) ok = (ctx[i] = aft_op_rows_new(&ws, chunk)) != NULL;
    int ret = 1;
    if (!ok) {
        *st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a slice's chunks of %zu rows", chunk);
        ret = -1;
    }
    if (ok) npt = slice_points(a, pt, chunk, nch, halo, causal);
    for (size_t b = 0; b < a->B && ret == 1; b++) {
        const float *kvb = a->kv + b * held * 2 * C;
        /* causal: a NaN key held reaches the rows from its own on (every
         * channel, after the output projection), not those before it; the
         * rows run with it as -inf, then those are made NaN */
        float *clean = NULL;
        size_t nan_from = causal ? a->a0 + first_nan_key(kvb, held, C, &clean) : a->a1;
        if (nan_from < a->a1 && !clean) {
            *st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a slice's keys of %zu rows", held);
            ret = -1;
            break;
        }
        if (clean) kvb = clean;
        if (!slice_key_sums(a, b, kvb, pt, npt, C, pre, suf, scr)) {
            free(clean);
            /* a key of +inf or NaN reaches every row of this sequence */
            fill_nan(a->y + b * n * D, n * D);
            continue;
        }
        int rows_ok = 1;
        #pragma omp parallel num_threads(nt) reduction(&:rows_ok)
        {
            size_t tid = (size_t)omp_get_thread_num();
            float *qt = q + tid * chunk * C, *ht = h + tid * chunk * C;
            #pragma omp for schedule(dynamic, 1)
            for (size_t j = 0; j < nch; j++) {
                size_t R0 = a->t0 + j * chunk, len = a->t1 - R0 < chunk ? a->t1 - R0 : chunk;
                size_t hl = R0 < halo ? R0 : halo, from = R0 - hl;
                aft_linear_apply(&s->lq, len, a->x + (b * n + R0 - a->t0) * D, D, qt, C);
                aft_opspec w = ws;
                w.T = T - from;
                w.t_off = from;
                w.q_row0 = hl;
                const float *kr = kvb + (from - a->a0) * 2 * C;
                size_t rp = R0 + len + halo < T ? R0 + len + halo : T;
                const float *cin = from ? pre + aft_sorted_index(pt, npt, from) * 4 * C : NULL;
                const float *rin = !causal && rp < T ? suf + aft_sorted_index(pt, npt, rp) * 4 * C : NULL;
                rows_ok &= aft_op_rows(ctx[tid], ht, qt, kr, kr + C, &w, hl, hl + len, cin, NULL, rin);
                aft_linear_apply_x(&s->lp.o, len, ht, C, a->y + (b * n + R0 - a->t0) * D, D, 1);
            }
        }
        if (!rows_ok) fill_nan(a->y + b * n * D, n * D);
        else if (nan_from < a->t1) {
            size_t from = nan_from > a->t0 ? nan_from - a->t0 : 0;
            fill_nan(a->y + (b * n + from) * D, (n - from) * D);
        }
        free(clean);
    }
    for (int i = 0; ctx && i < nt; i++) aft_op_rows_free(ctx[i]);
    free(pt); free(pre); free(suf); free(q); free(h); free(scr); free(ctx);
    return ret;
}

/* simple without causality: each row's output is sigmoid(Q) times the
 * softmax average g of every value, from the sums `left`, the held rows'
 * and `right`; g is folded into the output weights (Wo diag(g)) as the
 * layer's streamed path does. Returns as slice_band. */
static int slice_global(const slice_args *a, slice_prep *s, const aft_params *p, aft_status *st, aft_error *err)
{
    const size_t C = s->C, D = s->D, n = a->t1 - a->t0, chunk = s->chunk, nch = (n + chunk - 1) / chunk;
    const size_t held = a->a1 - a->a0;
    int nt = s->sp.threads < (int)nch ? s->sp.threads : (int)nch;
    float *g = aft_alloc_array(8, C * sizeof(float));
    float *wog = aft_alloc_array(D, C * sizeof(float));
    float *sq = aft_alloc_array((size_t)nt * chunk, C * sizeof(float));
    if (!g || !wog || !sq) {
        free(g); free(wog); free(sq);
        *st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a slice's chunks of %zu rows", chunk);
        return -1;
    }
    int ret = 1;
    for (size_t b = 0; b < a->B && ret == 1; b++) {
        float *tot = g, *mid = g + 4 * C;
        const float *lb = a->left ? a->left + b * 4 * C : NULL, *rb = a->right ? a->right + b * 4 * C : NULL;
        if (lb) memcpy(tot, lb, 4 * C * sizeof(float));
        else aft_sums_empty(tot, C);
        const float *kvb = a->kv ? a->kv + b * held * 2 * C : NULL;
        int bad = (lb && !aft_key_sums_ok(lb, C)) || (rb && !aft_key_sums_ok(rb, C));
        if (held) {
            bad |= aft_sums_of_rows(kvb, 2 * C, kvb + C, 2 * C, 0, held, C, mid, mid + C, mid + 2 * C, wog);
            memcpy(mid + 3 * C, mid, C * sizeof(float));
            aft_sums_merge(tot, mid, C);
        }
        if (rb) aft_sums_merge(tot, rb, C);
        if (bad) {   /* a key of +inf or NaN reaches every row of this sequence */
            fill_nan(a->y + b * n * D, n * D);
            continue;
        }
        aft_wo_scaled(wog, mid, tot, p, D, C);
        aft_linear lo;
        if ((*st = aft_layer_prep_linear(&s->lp, &lo, wog, AFT_F32, p->bo, D, C, s->sp.threads, err)) != AFT_OK) {
            ret = -1;
            break;
        }
        #pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (size_t j = 0; j < nch; j++) {
            size_t R0 = j * chunk, len = n - R0 < chunk ? n - R0 : chunk;
            float *qt = sq + (size_t)omp_get_thread_num() * chunk * C;
            aft_linear_apply(&s->lq, len, a->x + (b * n + R0) * D, D, qt, C);
            for (size_t i = 0; i < len * C; i++) qt[i] = aft_sigmoidf(qt[i]);
            aft_linear_apply(&lo, len, qt, C, a->y + (b * n + R0) * D, D);
        }
        aft_linear_free(&lo);
    }
    free(g); free(wog); free(sq);
    return ret;
}

/* full, or any run under a mask: the blocked product of the slice's query
 * rows against every key held (rows [0, a1)), then the output projection */
static aft_status slice_dense(const slice_args *a, slice_prep *s, const aft_params *p, aft_error *err)
{
    const size_t C = s->C, D = s->D, n = a->t1 - a->t0, held = a->a1 - a->a0;
    float *q = aft_alloc_array(n ? n : 1, C * sizeof(float)), *h = aft_alloc_array(n ? n : 1, C * sizeof(float));
    aft_status st = AFT_OK;
    if (!q || !h) st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q of %zu x %zu", n, C);
    aft_bias bias = p->bias;
    for (size_t b = 0; b < a->B && !st; b++) {
        aft_linear_apply(&s->lq, n, a->x + b * n * D, D, q, C);
        aft_opspec w = s->sp;
        w.bias = &bias;
        if (bias.mask) {   /* batch b's rows of the mask, as a mask of one batch */
            bias.mask = p->bias.mask + (p->bias.mask_batched ? b * n * a->T : 0);
            bias.mask_batched = 0;
        }
        w.T = s->sp.causal ? a->t1 : a->T;   /* causal rows see no key past t1 */
        w.mask_ld = a->T;
        w.ldq = C;
        w.ldk = w.ldv = 2 * C;
        w.q_row0 = a->t0;
        w.q_row1 = a->t1;
        const float *kvb = a->kv + b * held * 2 * C;
        st = aft_op_run(h, q, kvb, kvb + C, &w, 1, C, err);
        if (!st) aft_linear_apply(&s->lp.o, n, h, C, a->y + b * n * D, D);
    }
    free(q);
    free(h);
    return st;
}

aft_status aft_layer_forward_slice(float *y, const float *x, const float *kv, const float *left, const float *right,
                                   const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t t0,
                                   size_t t1, size_t a0, size_t a1, aft_error *err)
{
    if (!(t0 <= t1 && t1 <= T && a0 <= a1 && a1 <= T))
        return aft_fail(err, AFT_ERR_ARG, "rows [%zu, %zu) and held rows [%zu, %zu) do not fit a sequence of %zu",
                        t0, t1, a0, a1, T);
    if (B == 0 || t0 == t1) return AFT_OK;
    if (!y || !x || (a1 > a0 && !kv))
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !y ? "y" : !x ? "x" : "kv");
    if (T > INT_MAX) return aft_fail(err, AFT_ERR_ARG, "T = %zu exceeds the supported range", T);
    slice_prep s;
    aft_status st = slice_prep_init(&s, p, cfg, B, T, err);
    if (st) return st;
    slice_kind k = kind_of(&s.sp);
    size_t halo = aft_spec_halo(&s.sp);
    /* what the held rows and the sums must cover */
    size_t need0 = k == SLICE_DENSE ? 0 : k == SLICE_GLOBAL ? a0 : t0 - (t0 < halo ? t0 : halo);
    size_t need1 = k == SLICE_GLOBAL ? a1 : s.sp.causal ? t1 : k == SLICE_DENSE || T - t1 < halo ? T : t1 + halo;
    if (a0 > need0 || a1 < need1)
        st = aft_fail(err, AFT_ERR_ARG, "rows [%zu, %zu) need K, V of rows [%zu, %zu); [%zu, %zu) are held", t0, t1,
                      need0, need1, a0, a1);
    else if (k == SLICE_BAND && ((a0 > 0 && !left) || (!s.sp.causal && a1 < T && !right)))
        st = aft_fail(err, AFT_ERR_ARG, "the key sums of rows [0, %zu) and [%zu, %zu) are needed", a0, a1, T);
    if (st) {
        slice_prep_free(&s);
        return st;
    }
    slice_args a = {y, x, kv, left, right, B, T, t0, t1, a0, a1};
    if (k == SLICE_DENSE) st = slice_dense(&a, &s, p, err);
    else if (k == SLICE_GLOBAL) (void)slice_global(&a, &s, p, &st, err);
    else (void)slice_band(&a, &s, &st, err);
    slice_prep_free(&s);
    return st;
}
