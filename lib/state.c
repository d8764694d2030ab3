/* state.c - the causal layer and operator as an RNN: a state that carries
 * what the next rows need (the keys' running sums and the window's rows, or
 * every past row for full) from one chunk of rows to the next, and its
 * (de)serialisation.
 *
 * A step of many rows of the layer goes through the layer's causal pipeline
 * (layer_chunks.c), continued from the state; a step of a few rows (a
 * token at a time) runs on the calling thread: the chunk's projections, the
 * operator's rows with the kept rows before them (aft_op_rows), the output
 * projection. Full keeps every past key and value and runs its rows of the
 * blocked product (aft_op_run with q_row0). */
#include "carry.h"
#include "layer.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

struct aft_state {
    int layer;               /* 1: the layer; 0: the bare operator */
    aft_config cfg;          /* settled */
    aft_bias bias;           /* the bias the state runs (its arrays borrowed) */
    aft_opspec sp;           /* settled once; T and the strides are set a step at a time */
    aft_layer_prep prep;     /* the layer: its weights packed once */
    size_t B, D, C, KC;
    aft_layer_carry lc;
    int poisoned;            /* a key of +inf: every output from then on NaN */
    uint8_t *nan_keys;       /* (B, C): a NaN key has gone into channel c of
                              * sequence b, so its every later output is NaN
                              * (kept and summed as -inf, which reach nothing) */
    size_t *first_nan;       /* (C): scratch, a chunk's first NaN key a channel */
    aft_op_rows_ctx *ctx;    /* the band's scratch for steps on this thread */
    char fingerprint[17];    /* "" until first asked for (fingerprint()) */
};

static aft_status make_room(aft_state *s, size_t n, size_t min, aft_error *err);
static int sums_ok(const float *m, const float *s0, const float *s1, const float *km, size_t n);

/* ---- the fingerprint: a 64-bit hash of the sizes, the weights and the bias */

static uint64_t mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 31);
}

static uint64_t hash_floats(uint64_t h, const float *x, size_t n)
{
    h = mix(h, (uint64_t)n);
    if (!x) return mix(h, 0x6e756c6cULL);   /* absent ("null") differs from zeros */
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t w;
        memcpy(&w, x + i, sizeof w);
        h = mix(h, w);
    }
    if (i < n) {
        uint32_t w;
        memcpy(&w, x + i, sizeof w);
        h = mix(h, w);
    }
    return h;
}

static uint64_t hash_bias(uint64_t h, const aft_bias *b, const aft_opspec *sp)
{
    h = mix(h, (uint64_t)b->kind);
    switch (b->kind) {
    case AFT_BIAS_DENSE: return hash_floats(h, b->dense, b->tmax * b->tmax);
    case AFT_BIAS_FACTORED: return hash_floats(hash_floats(mix(h, b->rank), b->u, b->tmax * b->rank), b->v,
                                               b->tmax * b->rank);
    case AFT_BIAS_SEEDED: {
        uint32_t sc;
        memcpy(&sc, &b->scale, sizeof sc);
        return mix(mix(h, b->seed), sc);
    }
    case AFT_BIAS_CONV: return hash_floats(h, b->conv, sp->conv_rows * sp->conv_len);
    default: return h;
    }
}

/* weights of dt (16 bits kept as stored) hashed as their float32 values,
 * so a 16-bit checkpoint and its widened copy agree; without the memory to
 * widen them, their bytes */
static uint64_t hash_w(uint64_t h, const float *w, aft_dtype dt, size_t n)
{
    if (!aft_dtype_is16(dt)) return hash_floats(h, w, n);
    float *wide = aft_w_widen(w, dt, n);
    if (!wide) return hash_floats(mix(h, 16), w, n / 2);
    h = hash_floats(h, wide, n);
    free(wide);
    return h;
}

static void set_fingerprint(aft_state *s)
{
    uint64_t h = 0x61667473746174ULL;   /* "aftstat" */
    const size_t sizes[] = {(size_t)s->layer, (size_t)s->cfg.variant, s->cfg.window, s->cfg.heads, s->D, s->C,
                            s->KC};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) h = mix(h, sizes[i]);
    if (s->layer) {
        const aft_params *p = s->prep.p;
        size_t D = s->D, C = s->C, KC = s->KC;
        h = hash_w(h, p->wq, p->w_dtype, C * D);
        h = hash_floats(h, p->bq, p->bq ? C : 0);
        h = hash_w(h, p->wk, p->w_dtype, KC * D);
        h = hash_floats(h, p->bk, p->bk ? KC : 0);
        h = hash_w(h, p->wv, p->w_dtype, C * D);
        h = hash_floats(h, p->bv, p->bv ? C : 0);
        h = hash_w(h, p->wo, p->w_dtype, D * C);
        h = hash_floats(h, p->bo, p->bo ? D : 0);
    }
    if (s->sp.variant != AFT_SIMPLE) h = hash_bias(h, &s->bias, &s->sp);
    snprintf(s->fingerprint, sizeof s->fingerprint, "%016" PRIx64, h);
}

/* The fingerprint, hashed the first time it is asked for (saving, loading,
 * aft_state_fingerprint): a state that is only stepped, as a model's
 * generating text, never reads its weights through (about 1 ms for
 * labml's six layers). The cache is the state's own memory, never const
 * storage, and a state serves one thread at a time. */
static const char *fingerprint(const aft_state *s)
{
    if (!s->fingerprint[0]) set_fingerprint((aft_state *)s);
    return s->fingerprint;
}

/* ---- making one */

static aft_status state_init(aft_state *s, const aft_bias *bias, const aft_config *cfg, size_t B, size_t C,
                             size_t kc, aft_error *err)
{
    if (!cfg || !bias) return aft_fail(err, AFT_ERR_ARG, "missing bias or configuration (NULL)");
    if (!cfg->causal) return aft_fail(err, AFT_ERR_ARG, "a streaming state needs a causal run: row t must not see later rows");
    if (bias->mask) return aft_fail(err, AFT_ERR_ARG, "a streaming state cannot take a mask: it holds no T x T pattern");
    if (cfg->grid_h || cfg->grid_w)
        return aft_fail(err, AFT_ERR_ARG, "a streaming state runs 1-D sequences only, not a grid (%zu x %zu)",
                        cfg->grid_h, cfg->grid_w);
    if (cfg->impl == AFT_IMPL_REFERENCE)
        return aft_fail(err, AFT_ERR_ARG, "the streaming state runs the fast kernels only");
    if (B == 0 || C == 0) return aft_fail(err, AFT_ERR_ARG, "a state needs B >= 1 and C >= 1 (B = %zu, C = %zu)", B, C);
    s->bias = *bias;
    aft_status st = aft_spec_settle(&s->sp, &s->bias, cfg, B, 1, C, kc, err);
    if (st) return st;
    s->cfg = *cfg;
    if ((st = aft_config_settle(&s->cfg, &s->bias, C, kc, err))) return st;
    s->B = B;
    s->C = C;
    s->KC = kc;
    s->lc.keep = aft_spec_keep(&s->sp);
    s->lc.carry = aft_alloc_array(B, 4 * C * sizeof(float));
    s->nan_keys = calloc(B, C);
    s->first_nan = aft_alloc_array(C, sizeof(size_t));
    if (!s->lc.carry || !s->nan_keys || !s->first_nan) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for a state of %zu sequences", B);
    /* room for the window twice over: the rows move back to the start once
     * every `keep` rows */
    if (s->sp.variant != AFT_FULL && (st = make_room(s, 0, s->lc.keep, err))) return st;
    for (size_t b = 0; b < B; b++) aft_sums_empty(s->lc.carry + b * 4 * C, C);
    if (s->sp.variant != AFT_FULL && !(s->ctx = aft_op_rows_new(&s->sp, 0)))
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the band's scratch");
    return AFT_OK;
}

aft_status aft_state_new(aft_state **out, const aft_params *p, const aft_config *cfg, size_t B, aft_error *err)
{
    *out = NULL;
    if (!p) return aft_fail(err, AFT_ERR_ARG, "missing layer parameters (NULL)");
    aft_state *s = calloc(1, sizeof *s);
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for a state");
    s->layer = 1;
    size_t C = p->d_hidden, KC = p->k_out ? p->k_out : C;
    aft_status st = state_init(s, &p->bias, cfg, B, C, KC, err);
    if (!st) st = aft_layer_prep_init(&s->prep, p, cfg->projections, cfg->precision, s->cfg.threads, err);
    if (st) {
        aft_state_free(s);
        return st;
    }
    s->D = p->d_model;
    *out = s;
    return AFT_OK;
}

aft_status aft_state_new_op(aft_state **out, const aft_bias *bias, const aft_config *cfg, size_t B, size_t C,
                            size_t kc, aft_error *err)
{
    *out = NULL;
    aft_state *s = calloc(1, sizeof *s);
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for a state");
    aft_status st = state_init(s, bias, cfg, B, C, kc, err);
    if (st) {
        aft_state_free(s);
        return st;
    }
    *out = s;
    return AFT_OK;
}

void aft_state_free(aft_state *s)
{
    if (!s) return;
    if (s->layer) aft_layer_prep_free(&s->prep);
    aft_op_rows_free(s->ctx);
    free(s->lc.carry);
    free(s->lc.kv);
    free(s->nan_keys);
    free(s->first_nan);
    free(s);
}

void aft_state_reset(aft_state *s)
{
    s->lc.pos = 0;
    s->lc.off = 0;
    s->poisoned = 0;
    memset(s->nan_keys, 0, s->B * s->C);
    for (size_t b = 0; b < s->B; b++) aft_sums_empty(s->lc.carry + b * 4 * s->C, s->C);
}

size_t aft_state_position(const aft_state *s)
{
    return s->lc.pos;
}

const char *aft_state_fingerprint(const aft_state *s)
{
    return fingerprint(s);
}

/* ---- a step */

/* Room for n rows after the kept ones in each sequence's room: the kept rows
 * move to its start when they would run past its end, and the room grows
 * (at least doubling, so full's every-row history costs O(1) a row) when
 * even that is too little; also makes the first room, of `min` rows. */
static aft_status make_room(aft_state *s, size_t n, size_t min, aft_error *err)
{
    aft_layer_carry *lc = &s->lc;
    const size_t C2 = 2 * s->C, nk = aft_carry_kept(lc), need = nk + n;
    if (lc->kv && lc->off + need <= lc->cap) return AFT_OK;
    if (lc->kv && need <= lc->cap) {
        for (size_t b = 0; b < s->B; b++)
            memmove(lc->kv + b * lc->cap * C2, lc->kv + (b * lc->cap + lc->off) * C2, nk * C2 * sizeof(float));
        lc->off = 0;
        return AFT_OK;
    }
    size_t cap = lc->cap * 2 > need ? lc->cap * 2 : need, bytes;
    if (cap < 2 * min && min <= SIZE_MAX / 2) cap = 2 * min;
    if (!aft_mul3_ok(s->B, cap, C2, &bytes) || !aft_mul_ok(bytes, sizeof(float), &bytes))
        return aft_fail(err, AFT_ERR_NOMEM, "%zu rows of %zu sequences overflow", cap, s->B);
    float *kv = aft_alloc_array(s->B * cap, C2 * sizeof(float));
    if (!kv) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu rows of %zu sequences", cap, s->B);
    for (size_t b = 0; lc->kv && b < s->B; b++)
        memcpy(kv + b * cap * C2, lc->kv + (b * lc->cap + lc->off) * C2, nk * C2 * sizeof(float));
    free(lc->kv);
    lc->kv = kv;
    lc->cap = cap;
    lc->off = 0;
    return AFT_OK;
}

/* positions the bias covers (aft_bias_reach): a learned (Tmax, Tmax) bias
 * ends at Tmax */
static aft_status check_reach(const aft_state *s, size_t n, aft_error *err)
{
    size_t end;
    if (!aft_add_ok(s->lc.pos, n, &end) || end > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "position %zu + %zu rows exceeds the supported range", s->lc.pos, n);
    if (end > aft_bias_reach(&s->bias, s->sp.variant))
        return aft_fail(err, AFT_ERR_ARG, "rows %zu to %zu run past the position bias's Tmax = %zu", s->lc.pos,
                        end - 1, s->bias.tmax);
    return AFT_OK;
}


/* rows [nk, nk + n) of kv: the chunk's keys (widened to one per value
 * channel when there is one per head) and values, after the nk kept */
static void put_rows(float *kv, size_t nk, const float *k, size_t ldk, const float *v, size_t ldv, size_t n, size_t C,
                     size_t kc)
{
    size_t per = C / kc;
    for (size_t i = 0; i < n; i++) {
        float *row = kv + (nk + i) * 2 * C;
        const float *kr = k + i * ldk;
        if (kc == C) memcpy(row, kr, C * sizeof(float));
        else for (size_t c = 0; c < C; c++) row[c] = kr[c / per];
        memcpy(row + C, v + i * ldv, C * sizeof(float));
    }
}

/* A NaN key reaches, under causality, its channel's output in its own row
 * and every later one (every variant sees every earlier key: local and
 * conv with w = 0 outside the window). The chunk's new keys rows [nk, nk +
 * n) of kv: each NaN becomes -inf (it reaches nothing in the kernel); then
 * o (n, C) is made NaN from each channel's first NaN key on, and from the
 * chunk's start in channels one reached before; nan (C) records them. */
static void nan_keys_in(float *kv, size_t nk, size_t n, size_t C, size_t *first)
{
    for (size_t c = 0; c < C; c++) first[c] = n;
    for (size_t i = 0; i < n; i++) {
        float *kr = kv + (nk + i) * 2 * C;
        unsigned bad = 0;
        for (size_t c = 0; c < C; c++) bad |= kr[c] != kr[c];
        if (!bad) continue;
        for (size_t c = 0; c < C; c++)
            if (kr[c] != kr[c]) {
                kr[c] = -INFINITY;
                first[c] = first[c] < i ? first[c] : i;
            }
    }
}

/* carry (4C, or NULL): such a channel's sums, which no output reads any
 * more, are put back to those of no rows (what -inf keys make of them
 * is not always a valid sum: a state is written with them) */
static void nan_keys_out(float *o, size_t n, size_t C, const size_t *first, uint8_t *nan, float *carry)
{
    for (size_t c = 0; c < C; c++) {
        size_t from = nan[c] ? 0 : first[c];
        for (size_t i = from; i < n; i++) o[i * C + c] = NAN;
        nan[c] |= from < n;
        if (nan[c] && carry) {
            carry[c] = carry[3 * C + c] = -INFINITY;
            carry[C + c] = carry[2 * C + c] = 0.0f;
        }
    }
}

/* The operator's rows for every sequence: out (B, n, C); q row i of
 * sequence b at q + (b n + i) ldq, likewise k (kc channels) and v. The
 * chunk's keys and values go after the kept rows in each sequence's room,
 * where the kernel reads them all in place. */
static aft_status step_rows(aft_state *s, float *out, const float *q, size_t ldq, const float *k, size_t ldk,
                            const float *v, size_t ldv, size_t n, aft_error *err)
{
    aft_layer_carry *lc = &s->lc;
    aft_status st = make_room(s, n, 0, err);
    if (st) return st;
    const size_t C = s->C, C2 = 2 * C, B = s->B, pos = lc->pos, nk = aft_carry_kept(lc);
    int full = s->sp.variant == AFT_FULL;
    for (size_t b = 0; b < B && !st; b++) {
        float *rows = lc->kv + (b * lc->cap + lc->off) * C2, *o = out + b * n * C;
        const float *qb = q + b * n * ldq;
        put_rows(rows, nk, k + b * n * ldk, ldk, v + b * n * ldv, ldv, n, C, s->KC);
        nan_keys_in(rows, nk, n, C, s->first_nan);
        aft_opspec sp = s->sp;
        sp.ldq = ldq;
        sp.ldk = sp.ldv = C2;
        sp.T = nk + n;
        sp.t_off = pos - nk;
        sp.q_row0 = nk;
        float *carry = lc->carry + b * 4 * C;
        if (full) {
            st = aft_op_run(o, qb, rows, rows + C, &sp, 1, C, err);
        } else {
            if (!aft_op_rows(s->ctx, o, qb, rows, rows + C, &sp, nk, nk + n, sp.t_off ? carry : NULL, carry, NULL))
                s->poisoned = 1;
        }
        if (!st) nan_keys_out(o, n, C, s->first_nan, s->nan_keys + b * C, full ? NULL : carry);
    }
    /* the kept rows: the last min(pos + n, keep) */
    size_t keep = pos + n < lc->keep ? pos + n : lc->keep;
    if (!st) lc->off += nk + n - keep;
    return st;
}

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

aft_status aft_state_step_op(aft_state *s, float *out, const float *q, const float *k, const float *v, size_t n,
                             aft_error *err)
{
    if (s->layer) return aft_fail(err, AFT_ERR_ARG, "this state is a layer's: step it with x");
    if (n == 0) return AFT_OK;
    aft_status st = check_reach(s, n, err);
    if (st) return st;
    if (!out || !q || !k || !v)
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !out ? "out" : !q ? "q" : !k ? "k" : "v");
    if (!s->poisoned) st = step_rows(s, out, q, s->C, k, s->KC, v, s->C, n, err);
    if (st) return st;
    if (s->poisoned) fill_nan(out, s->B * n * s->C);
    s->lc.pos += n;
    return AFT_OK;
}

/* the layer a few rows at a time: the chunk's projections, the operator's
 * rows, the output projection */
static aft_status step_layer_rows(aft_state *s, float *y, const float *x, size_t n, aft_error *err)
{
    const aft_layer_prep *lp = &s->prep;
    size_t N = s->B * n, C = s->C, W = lp->W;
    float *qkv = aft_alloc_array(N, W * sizeof(float)), *h = aft_alloc_array(N, C * sizeof(float));
    aft_status st;
    if (!qkv || !h) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu rows", N);
    } else {
        aft_linear_apply(&lp->qkv, N, x, lp->D, qkv, W);
        st = step_rows(s, h, qkv, W, qkv + C, W, qkv + C + lp->KC, W, n, err);
        if (!st) aft_linear_apply(&lp->o, N, h, C, y, lp->D);
    }
    free(qkv);
    free(h);
    return st;
}

aft_status aft_state_step(aft_state *s, float *y, const float *x, size_t n, aft_error *err)
{
    if (!s->layer) return aft_fail(err, AFT_ERR_ARG, "this state is an operator's: step it with q, k and v");
    if (n == 0) return AFT_OK;
    aft_status st = check_reach(s, n, err);
    if (st) return st;
    if (!x || !y) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !x ? "input x" : "output y");
    if (!s->poisoned) {
        /* many rows: the causal pipeline, continued from the state; rows
         * with NaN or infinity (what makes a NaN key) a few at a time,
         * which keep a NaN key to its channel and the rows after it (the
         * pipeline would give up on the whole chunk) */
        aft_opspec sp = s->sp;
        sp.T = n;
        aft_layer_times tm = {0, 0, 0};
        int r = s->sp.variant == AFT_FULL || aft_count_nonfinite(x, s->B * n * s->D) ? 0
                                          : aft_layer_chunked(y, x, &s->prep, &sp, s->B, n, AFT_LAYER_CHUNK_AUTO, &tm,
                                                              &s->lc, &st, err);
        if (r == -1) return st;
        if (r == -2) s->poisoned = 1;
        if (r == 1) s->lc.off = 0;   /* the pipeline left the rows at the room's start */
        if (r == 0 && (st = step_layer_rows(s, y, x, n, err))) return st;
    }
    if (s->poisoned) fill_nan(y, s->B * n * s->D);
    s->lc.pos += n;
    return AFT_OK;
}

size_t aft_state_keep(const aft_state *s)
{
    return s->lc.keep;
}

aft_status aft_state_seed(aft_state *s, size_t pos, const float *sums, const float *kv, int poisoned,
                          aft_error *err)
{
    const size_t B = s->B, C = s->C, nk = pos < s->lc.keep ? pos : s->lc.keep;
    if (pos > INT_MAX) return aft_fail(err, AFT_ERR_ARG, "position %zu exceeds the supported range", pos);
    if (pos > aft_bias_reach(&s->bias, s->sp.variant))
        return aft_fail(err, AFT_ERR_ARG, "position %zu is past the position bias's Tmax = %zu", pos, s->bias.tmax);
    if (nk && !kv) return aft_fail(err, AFT_ERR_ARG, "a state at position %zu needs K, V of its last %zu %s", pos, nk,
                                   aft_noun(nk, "row", "rows"));
    if (pos > nk && !sums && !poisoned)
        return aft_fail(err, AFT_ERR_ARG, "a state at position %zu needs the key sums of rows [0, %zu)", pos, pos - nk);
    for (size_t q = 0; q < B && sums && !poisoned && pos > nk; q++) {
        const float *m = sums + q * 4 * C;
        if (!sums_ok(m, m + C, m + 2 * C, m + 3 * C, C))
            return aft_fail(err, AFT_ERR_ARG, "sequence %zu's sums hold NaN, infinite or negative values", q);
    }
    s->lc.pos = 0;   /* an empty room, then room for the rows */
    s->lc.off = 0;
    aft_status st = make_room(s, nk, 0, err);
    if (st) return st;
    for (size_t q = 0; q < B; q++) {
        float *carry = s->lc.carry + q * 4 * C;
        if (sums && pos > nk) memcpy(carry, sums + q * 4 * C, 4 * C * sizeof(float));
        else aft_sums_empty(carry, C);
        if (nk) memcpy(s->lc.kv + q * s->lc.cap * 2 * C, kv + q * nk * 2 * C, nk * 2 * C * sizeof(float));
    }
    s->lc.pos = pos;
    s->poisoned = poisoned != 0;
    /* a NaN among the kept keys: kept as -inf, its channel reached */
    memset(s->nan_keys, 0, B * C);
    for (size_t q = 0; q < B && nk; q++) {
        nan_keys_in(s->lc.kv + q * s->lc.cap * 2 * C, 0, nk, C, s->first_nan);
        for (size_t c = 0; c < C; c++) s->nan_keys[q * C + c] = s->first_nan[c] < nk;
    }
    return AFT_OK;
}

/* ---- (de)serialisation */

enum { N_SUMS = 4 };
static const char *const sums_names[N_SUMS] = {"sums_max", "sums_den", "sums_num", "keys_max"};

static aft_tensor f32_tensor(const float *data, size_t d0, size_t d1, size_t d2, size_t ndim)
{
    aft_tensor t = {.dtype = AFT_F32, .ndim = ndim, .data = data};
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.nelem = d0 * d1 * (ndim == 3 ? d2 : 1);
    t.nbytes = t.nelem * sizeof(float);
    return t;
}

/* the metadata a state is written with, as (key, value) strings into text */
enum { N_META = 12 };
static void state_meta(const aft_state *s, char text[N_META][32], const char *meta[2 * N_META])
{
    static const char *const keys[N_META] = {"aft_state", "kind", "variant", "window", "heads", "causal",
                                             "d_model", "d_hidden", "key_channels", "batch", "position",
                                             "poisoned"};
    snprintf(text[0], 32, "1");
    snprintf(text[1], 32, "%s", s->layer ? "layer" : "operator");
    snprintf(text[2], 32, "%s", aft_variant_name(s->sp.variant));
    snprintf(text[3], 32, "%zu", s->cfg.window);
    snprintf(text[4], 32, "%zu", s->sp.heads);
    snprintf(text[5], 32, "1");
    snprintf(text[6], 32, "%zu", s->D);
    snprintf(text[7], 32, "%zu", s->C);
    snprintf(text[8], 32, "%zu", s->KC);
    snprintf(text[9], 32, "%zu", s->B);
    snprintf(text[10], 32, "%zu", s->lc.pos);
    snprintf(text[11], 32, "%d", s->poisoned);
    for (int i = 0; i < N_META; i++) {
        meta[2 * i] = keys[i];
        meta[2 * i + 1] = text[i];
    }
}

aft_status aft_state_save(const aft_state *s, const char *path, aft_error *err)
{
    const size_t B = s->B, C = s->C, nk = aft_carry_kept(&s->lc);
    float *sums = aft_alloc_array(B * (N_SUMS + 1), C * sizeof(float));
    float *kv = aft_alloc_array(B * 2 * (nk ? nk : 1), C * sizeof(float));
    if (!sums || !kv) {
        free(sums); free(kv);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory writing a state");
    }
    /* sums: array i of sequence b at (i B + b) C; keys then values, (B, nk, C) each */
    for (size_t b = 0; b < B; b++)
        for (int i = 0; i < N_SUMS; i++)
            memcpy(sums + (i * B + b) * C, s->lc.carry + (b * N_SUMS + i) * C, C * sizeof(float));
    float *keys = kv, *vals = kv + B * nk * C;
    for (size_t b = 0; b < B; b++)
        for (size_t r = 0; r < nk; r++) {
            const float *row = s->lc.kv + (b * s->lc.cap + s->lc.off + r) * 2 * C;
            memcpy(keys + (b * nk + r) * C, row, C * sizeof(float));
            memcpy(vals + (b * nk + r) * C, row + C, C * sizeof(float));
        }
    const char *names[N_SUMS + 3];
    aft_tensor ts[N_SUMS + 3];
    for (int i = 0; i < N_SUMS; i++) {
        names[i] = sums_names[i];
        ts[i] = f32_tensor(sums + i * B * C, B, C, 0, 2);
    }
    names[N_SUMS] = "keys";
    names[N_SUMS + 1] = "values";
    ts[N_SUMS] = f32_tensor(keys, B, nk, C, 3);
    ts[N_SUMS + 1] = f32_tensor(vals, B, nk, C, 3);
    /* nan_keys (B, C), 1 where a NaN key has gone into the channel: only
     * when one has (a state without is written as before) */
    size_t nt = N_SUMS + 2, nnan = 0;
    float *nanf = sums + N_SUMS * B * C;
    for (size_t i = 0; i < B * C; i++) nnan += (nanf[i] = s->nan_keys[i] ? 1.0f : 0.0f) != 0.0f;
    if (nnan) {
        names[nt] = "nan_keys";
        ts[nt++] = f32_tensor(nanf, B, C, 0, 2);
    }
    char text[N_META][32];
    const char *meta[2 * (N_META + 1)];
    state_meta(s, text, meta);
    meta[2 * N_META] = "fingerprint";
    meta[2 * N_META + 1] = fingerprint(s);
    aft_status st = aft_st_write(path, names, ts, nt, meta, N_META + 1, err);
    free(sums);
    free(kv);
    return st;
}

/* the file's metadata against this state's: one line naming what differs */
static aft_status check_meta(const aft_state *s, const aft_st_file *f, size_t *pos, int *poisoned, aft_error *err)
{
    char text[N_META][32];
    const char *meta[2 * N_META];
    state_meta(s, text, meta);
    const char *what[N_META] = {"format", "kind", "variant", "window", "heads", "causality", "model size D",
                                "hidden size", "key channels", "batch size", "", ""};
    for (int i = 0; i < N_META; i++) {
        const char *v = aft_st_metadata_find(f, meta[2 * i]);
        if (!v) return aft_fail(err, AFT_ERR_FORMAT, "not an aft state: no '%s' in its metadata", meta[2 * i]);
        if (i >= 10) continue;   /* position and poisoned: read below */
        char b[40];
        if (strcmp(v, meta[2 * i + 1]) != 0)
            return aft_fail(err, AFT_ERR_ARG, "the state was made for %s %s, this run has %s", what[i],
                            aft_shown(v, b, 32), meta[2 * i + 1]);
    }
    const char *fp = aft_st_metadata_find(f, "fingerprint");
    if (!fp) return aft_fail(err, AFT_ERR_FORMAT, "not an aft state: no 'fingerprint' in its metadata");
    char b[40];
    if (strcmp(fp, fingerprint(s)) != 0)
        return aft_fail(err, AFT_ERR_ARG, "the state was made with other weights or bias (fingerprint %s, this "
                        "run's %s)", aft_shown(fp, b, 32), fingerprint(s));
    const char *ps = aft_st_metadata_find(f, "position"), *pz = aft_st_metadata_find(f, "poisoned");
    char *end;
    unsigned long long v = strtoull(ps, &end, 10);
    if (!*ps || *ps == '-' || *ps == '+' || *end || v > INT_MAX)
        return aft_fail(err, AFT_ERR_FORMAT, "position '%s' is not a whole number up to %d", aft_shown(ps, b, 32),
                        INT_MAX);
    if (strcmp(pz, "0") != 0 && strcmp(pz, "1") != 0)
        return aft_fail(err, AFT_ERR_FORMAT, "poisoned '%s' is neither 0 nor 1", aft_shown(pz, b, 32));
    *pos = (size_t)v;
    *poisoned = pz[0] == '1';
    return AFT_OK;
}

/* tensor `name` as F32 of the given shape, or an error naming it */
static aft_status get_f32(const aft_st_file *f, const char *name, size_t ndim, const size_t *shape,
                          const aft_tensor **out, aft_error *err)
{
    const aft_tensor *t = aft_st_find(f, name);
    if (!t) return aft_fail(err, AFT_ERR_FORMAT, "not an aft state: no tensor '%s'", name);
    int ok = t->dtype == AFT_F32 && t->ndim == ndim;
    for (size_t i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96];
        if (ndim == 2) snprintf(want, sizeof want, "[%zu, %zu]", shape[0], shape[1]);
        else snprintf(want, sizeof want, "[%zu, %zu, %zu]", shape[0], shape[1], shape[2]);
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' must be F32 %s for this state", name, want);
    }
    *out = t;
    return AFT_OK;
}

/* sums as the kernels leave them: stabilisers and key maxima not NaN and
 * below +inf, s0 >= 0 and finite, s1 finite */
static int sums_ok(const float *m, const float *s0, const float *s1, const float *km, size_t n)
{
    for (size_t c = 0; c < n; c++)
        if (m[c] != m[c] || m[c] == INFINITY || km[c] != km[c] || km[c] == INFINITY || !(s0[c] >= 0.0f) ||
            !isfinite(s0[c]) || !isfinite(s1[c]))
            return 0;
    return 1;
}

aft_status aft_state_load(aft_state *s, const aft_st_file *f, aft_error *err)
{
    size_t pos = 0;
    int poisoned = 0;
    aft_status st = check_meta(s, f, &pos, &poisoned, err);
    if (st) return st;
    const size_t B = s->B, C = s->C, nk = pos < s->lc.keep ? pos : s->lc.keep;
    const aft_tensor *sums[N_SUMS], *keys, *vals;
    for (int i = 0; i < N_SUMS; i++)
        if ((st = get_f32(f, sums_names[i], 2, (const size_t[]){B, C}, &sums[i], err))) return st;
    if ((st = get_f32(f, "keys", 3, (const size_t[]){B, nk, C}, &keys, err)) ||
        (st = get_f32(f, "values", 3, (const size_t[]){B, nk, C}, &vals, err)))
        return st;
    const aft_tensor *nan = NULL;   /* optional: no NaN key has gone in */
    if (aft_st_find(f, "nan_keys") && (st = get_f32(f, "nan_keys", 2, (const size_t[]){B, C}, &nan, err)))
        return st;
    for (size_t i = 0; nan && i < B * C; i++) {
        float x = ((const float *)nan->data)[i];
        if (x != 0.0f && x != 1.0f)
            return aft_fail(err, AFT_ERR_FORMAT, "tensor 'nan_keys' holds %g: only 0 and 1 are allowed", (double)x);
    }
    if (pos > aft_bias_reach(&s->bias, s->sp.variant))
        return aft_fail(err, AFT_ERR_FORMAT, "position %zu is past the position bias's Tmax = %zu", pos,
                        s->bias.tmax);
    const float *sd[N_SUMS];
    for (int i = 0; i < N_SUMS; i++) sd[i] = sums[i]->data;
    for (size_t q = 0; q < B && !poisoned; q++)
        if (!sums_ok(sd[0] + q * C, sd[1] + q * C, sd[2] + q * C, sd[3] + q * C, C))
            return aft_fail(err, AFT_ERR_FORMAT, "sequence %zu's sums hold NaN, infinite or negative values", q);
    s->lc.pos = 0;   /* an empty room, then room for the file's rows */
    s->lc.off = 0;
    if ((st = make_room(s, nk, 0, err))) return st;
    for (size_t q = 0; q < B; q++) {
        for (int i = 0; i < N_SUMS; i++) memcpy(s->lc.carry + (q * N_SUMS + i) * C, sd[i] + q * C, C * sizeof(float));
        const float *kq = (const float *)keys->data + q * nk * C, *vq = (const float *)vals->data + q * nk * C;
        for (size_t r = 0; r < nk; r++) {
            float *row = s->lc.kv + (q * s->lc.cap + r) * 2 * C;
            memcpy(row, kq + r * C, C * sizeof(float));
            memcpy(row + C, vq + r * C, C * sizeof(float));
        }
    }
    s->lc.pos = pos;
    s->poisoned = poisoned;
    for (size_t i = 0; i < B * C; i++) s->nan_keys[i] = nan && ((const float *)nan->data)[i] != 0.0f;
    return AFT_OK;
}
