/* model_grad.c - training's view of labml's model: its parameters under
 * labml's names (float32 master copies the forward pass reads), and the
 * loss with its gradient for every parameter.
 *
 * The forward pass keeps, per layer, its input x, the residual stream after
 * self_attn (xm), the FFN's hidden units after the ReLU (h) and what the AFT
 * layer's saved forward keeps for its backward (Q, K, V: layer_grad.c):
 * (2 D + F + 3 C) floats a row. The LayerNorms' outputs are computed again
 * in the backward pass (cheap, and it saves 2 D a row), and dropout masks
 * are a pure function of (seed, site, element). The backward pass then goes
 * layer by layer from the cross-entropy down to the embedding:
 *   LayerNorm:  dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), dy = dz w,
 *               dw = sum dz xhat, db = sum dz
 *   Linear:     dX = dY W, dW = dY^T X, db = column sums of dY
 *   ReLU:       dh = dh (h > 0);  dropout: d = d mask / (1 - p)
 *   embedding:  dtable[token] += sqrt(D) dx */
#include "layer.h"
#include "model_priv.h"
#include "nn/bf16.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* per layer: query, key, value (weight, bias), pos_bias, local_mask, output
 * (weight, bias), layer1, layer2 (weight, bias), norm_self_attn, norm_ff
 * (weight, bias) */
enum {
    P_QW, P_QB, P_KW, P_KB, P_VW, P_VB, P_POS, P_MASK, P_OW, P_OB,
    P_W1, P_B1, P_W2, P_B2, P_LN1W, P_LN1B, P_LN2W, P_LN2B, P_PER_LAYER
};
/* before the layers: the embedding and the positional encodings; after:
 * encoder.norm and generator.projection */
enum { P_EMB, P_PE, P_HEAD };
enum { P_NORMW, P_NORMB, P_GENW, P_GENB, P_TAIL };
/* a sum over rows is cut into this many fixed chunks, added in order: the
 * same bits for any number of threads */
enum { SUM_CHUNKS = 64 };
/* a step's batch is cut into at most this many groups of whole sequences
 * (step_groups) */
enum { GROUPS_MAX = 8 };

typedef struct {
    char name[96];
    size_t ndim, shape[4], n;
    int trainable;
    float *data;   /* the master copy; NULL until the first data call */
} tparam;

/* one thread's temporaries, for a group of at most rows_cap rows */
typedef struct {
    float *z, *y, *dx, *dz, *dh, *hd, *zf, *logits;
    double *part;         /* SUM_CHUNKS x 2 max(D, F, V) partial sums */
    aft_layer_ws ws;      /* the AFT layers' temporaries */
} temps;

struct aft_train {
    char why[200];        /* nonempty: the model cannot be trained, and why */
    size_t np;
    tparam *p;
    int have_data;
    /* the activations of a step, for cap rows: per layer its input x (n_layers
     * + 1 x's: the last the encoder's output), xm and h, and what its AFT
     * layer's forward saved for its backward (saved_cap floats a layer) */
    size_t cap, saved_cap;
    float **x, **xm, **h, **saved;
    /* the threads' temporaries (ntemps of them) */
    size_t ntemps, rows_cap;
    temps *tmp;
    /* the groups' copies of the gradients (copy_cap floats) */
    float *copies;
    size_t copy_cap;
};

static size_t layer_index(size_t l, int k)
{
    return P_HEAD + l * P_PER_LAYER + (size_t)k;
}

static size_t tail_index(const aft_model *m, int k)
{
    return P_HEAD + m->info.n_layers * P_PER_LAYER + (size_t)k;
}

/* ---------------------------------------------------------------- the parameters */

static void set_param(tparam *t, int trainable, size_t ndim, size_t a, size_t b, size_t c, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void set_param(tparam *t, int trainable, size_t ndim, size_t a, size_t b, size_t c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->trainable = trainable;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    t->shape[3] = 0;
    t->n = a * (ndim > 1 ? b : 1) * (ndim > 2 ? c : 1);   /* each a loaded tensor's size: no overflow */
}

/* why m is not labml's AFTLocal model with every bias, or "" */
static void trainable_why(const aft_model *m, char *why, size_t cap)
{
    why[0] = 0;
    if (m->info.variant != AFT_LOCAL) {
        snprintf(why, cap, "training takes labml's AFTLocal model; this one's layers are %s",
                 aft_variant_name(m->info.variant));
        return;
    }
    if (!m->emb.pe) {
        snprintf(why, cap, "training takes labml's model with positional encodings; this one has none");
        return;
    }
    if (!m->norm_b || !m->gen_b) {
        snprintf(why, cap, "training takes labml's model, whose encoder.norm and generator have biases");
        return;
    }
    for (size_t l = 0; l < m->info.n_layers; l++) {
        const mlayer *L = &m->layers[l];
        const aft_params *p = &L->attn.p;
        if (!p->bq || !p->bk || !p->bv || !p->bo || !L->ln1_b || !L->ln2_b || !L->ffp.b1 || !L->ffp.b2 ||
            p->bias.kind != AFT_BIAS_DENSE || p->k_out != p->d_hidden) {
            snprintf(why, cap, "training takes labml's AFTLocal model with every bias; layer %zu lacks one, or "
                     "its pos_bias is not one square", l);
            return;
        }
    }
}

static aft_status prepare(aft_model *m, aft_error *err)
{
    if (m->train) return AFT_OK;
    struct aft_train *t = calloc(1, sizeof *t);
    if (!t) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the model's parameters");
    m->train = t;
    trainable_why(m, t->why, sizeof t->why);
    if (t->why[0]) return AFT_OK;
    const size_t nl = m->info.n_layers, D = m->info.d_model, C = m->info.d_hidden, F = m->info.d_ff,
                 V = m->info.n_vocab, Tm = m->info.bias_rows;
    t->np = P_HEAD + nl * P_PER_LAYER + P_TAIL;
    if (!(t->p = calloc(t->np, sizeof *t->p))) {
        t->np = 0;
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the model's parameters");
    }
    set_param(&t->p[P_EMB], 1, 2, V, D, 0, "src_embed.linear.weight");
    set_param(&t->p[P_PE], 0, 3, m->emb.P, 1, D, "src_embed.positional_encodings");
    for (size_t l = 0; l < nl; l++) {
        tparam *q = t->p + layer_index(l, 0);
        const char *pre = m->layers[l].prefix;
        set_param(&q[P_QW], 1, 2, C, D, 0, "%sself_attn.query.weight", pre);
        set_param(&q[P_QB], 1, 1, C, 0, 0, "%sself_attn.query.bias", pre);
        set_param(&q[P_KW], 1, 2, C, D, 0, "%sself_attn.key.weight", pre);
        set_param(&q[P_KB], 1, 1, C, 0, 0, "%sself_attn.key.bias", pre);
        set_param(&q[P_VW], 1, 2, C, D, 0, "%sself_attn.value.weight", pre);
        set_param(&q[P_VB], 1, 1, C, 0, 0, "%sself_attn.value.bias", pre);
        set_param(&q[P_POS], 1, 2, Tm, Tm, 0, "%sself_attn.pos_bias", pre);
        set_param(&q[P_MASK], 0, 2, Tm, Tm, 0, "%sself_attn.local_mask", pre);
        set_param(&q[P_OW], 1, 2, D, C, 0, "%sself_attn.output.weight", pre);
        set_param(&q[P_OB], 1, 1, D, 0, 0, "%sself_attn.output.bias", pre);
        set_param(&q[P_W1], 1, 2, F, D, 0, "%sfeed_forward.layer1.weight", pre);
        set_param(&q[P_B1], 1, 1, F, 0, 0, "%sfeed_forward.layer1.bias", pre);
        set_param(&q[P_W2], 1, 2, D, F, 0, "%sfeed_forward.layer2.weight", pre);
        set_param(&q[P_B2], 1, 1, D, 0, 0, "%sfeed_forward.layer2.bias", pre);
        set_param(&q[P_LN1W], 1, 1, D, 0, 0, "%snorm_self_attn.weight", pre);
        set_param(&q[P_LN1B], 1, 1, D, 0, 0, "%snorm_self_attn.bias", pre);
        set_param(&q[P_LN2W], 1, 1, D, 0, 0, "%snorm_ff.weight", pre);
        set_param(&q[P_LN2B], 1, 1, D, 0, 0, "%snorm_ff.bias", pre);
    }
    tparam *q = t->p + tail_index(m, 0);
    set_param(&q[P_NORMW], 1, 1, D, 0, 0, "encoder.norm.weight");
    set_param(&q[P_NORMB], 1, 1, D, 0, 0, "encoder.norm.bias");
    set_param(&q[P_GENW], 1, 2, V, D, 0, "generator.projection.weight");
    set_param(&q[P_GENB], 1, 1, V, 0, 0, "generator.projection.bias");
    return AFT_OK;
}

static void free_temps(temps *w)
{
    float *s[] = {w->z, w->y, w->dx, w->dz, w->dh, w->hd, w->zf, w->logits};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) free(s[i]);
    free(w->part);
    aft_layer_ws_free(&w->ws);
    memset(w, 0, sizeof *w);
}

static void free_scratch(struct aft_train *t, size_t nl)
{
    for (size_t l = 0; t->x && l <= nl; l++) free(t->x[l]);
    for (size_t l = 0; l < nl; l++) {
        if (t->xm) free(t->xm[l]);
        if (t->h) free(t->h[l]);
        if (t->saved) free(t->saved[l]);
    }
    free(t->x);
    free(t->xm);
    free(t->h);
    free(t->saved);
    t->x = t->xm = t->h = t->saved = NULL;
    t->cap = t->saved_cap = 0;
    for (size_t i = 0; i < t->ntemps; i++) free_temps(&t->tmp[i]);
    free(t->tmp);
    t->tmp = NULL;
    t->ntemps = t->rows_cap = 0;
    free(t->copies);
    t->copies = NULL;
    t->copy_cap = 0;
}

void aft_model_train_free(aft_model *m)
{
    struct aft_train *t = m->train;
    if (!t) return;
    free_scratch(t, m->info.n_layers);
    for (size_t i = 0; i < t->np; i++) free(t->p[i].data);
    free(t->p);
    free(t);
    m->train = NULL;
}

/* the packed products the forward pass reads (the FFNs', the generator's),
 * made again from the pointers */
static aft_status repack(aft_model *m, aft_error *err)
{
    aft_status st;
    for (size_t l = 0; l < m->info.n_layers; l++) {
        mlayer *L = &m->layers[l];
        if (L->ffn_ready) aft_ffn_free(&L->ffn);
        L->ffn_ready = 0;
        if ((st = aft_ffn_init(&L->ffn, &L->ffp, AFT_KERNEL_AUTO, m->precision, m->threads, err))) return st;
        L->ffn_ready = 1;
    }
    const size_t D = m->info.d_model, V = m->info.n_vocab;
    if (m->gen_ready) aft_linear_free(&m->gen);
    m->gen_ready = 0;
    if (aft_bf16_wanted(m->precision))
        st = aft_linear_init_bf16(&m->gen, m->gen_w, AFT_F32, m->gen_b, V, D, m->threads, err);
    else
        st = aft_linear_init(&m->gen, m->gen_w, m->gen_b, V, D, AFT_KERNEL_AUTO, m->threads, err);
    if (!st) m->gen_ready = 1;
    return st;
}

/* t's master copy from the model's values, widened from 16 bits where the
 * model kept them so (dt AFT_F16, AFT_BF16; anything else: float32) */
static void copy_in_dt(tparam *t, const void *src, aft_dtype dt)
{
    aft_w_widen_into(t->data, src, dt, t->n);
}

static void copy_in(tparam *t, const float *src)
{
    copy_in_dt(t, src, AFT_F32);
}

/* 16-bit storage's dtype for the model's pointer *src (k a layer's index
 * P_*), AFT_F32 for the rest */
static aft_dtype layer_dtype(const mlayer *L, int k)
{
    if (k == P_QW || k == P_KW || k == P_VW || k == P_OW) return L->attn.p.w_dtype;
    if (k == P_W1 || k == P_W2) return L->ffp.wdt;
    return AFT_F32;
}

/* the master copies, from the values the model holds; the model's pointers
 * then read them */
static aft_status ensure_data(aft_model *m, aft_error *err)
{
    aft_status st = prepare(m, err);
    if (st) return st;
    struct aft_train *t = m->train;
    if (t->why[0]) return aft_fail(err, AFT_ERR_ARG, "%s", t->why);
    if (t->have_data) return AFT_OK;
    for (size_t i = 0; i < t->np; i++)
        if (!t->p[i].data && !(t->p[i].data = aft_alloc_array(t->p[i].n, sizeof(float))))
            return aft_fail(err, AFT_ERR_NOMEM, "out of memory for '%s'", t->p[i].name);
    tparam *P = t->p;
    copy_in_dt(&P[P_EMB], m->emb.table, m->emb.tdt);
    copy_in(&P[P_PE], m->emb.pe);
    m->emb.table = P[P_EMB].data;
    m->emb.tdt = AFT_F32;
    m->emb.pe = P[P_PE].data;
    for (size_t l = 0; l < m->info.n_layers; l++) {
        mlayer *L = &m->layers[l];
        aft_params *p = &L->attn.p;
        tparam *q = t->p + layer_index(l, 0);
        const float **src[] = {
            [P_QW] = &p->wq, [P_QB] = &p->bq, [P_KW] = &p->wk, [P_KB] = &p->bk, [P_VW] = &p->wv,
            [P_VB] = &p->bv, [P_POS] = &p->bias.dense, [P_MASK] = NULL, [P_OW] = &p->wo, [P_OB] = &p->bo,
            [P_W1] = NULL, [P_B1] = &L->ffp.b1, [P_W2] = NULL, [P_B2] = &L->ffp.b2,
            [P_LN1W] = &L->ln1_w, [P_LN1B] = &L->ln1_b, [P_LN2W] = &L->ln2_w, [P_LN2B] = &L->ln2_b};
        for (int k = 0; k < P_PER_LAYER; k++) {
            if (!src[k]) continue;
            copy_in_dt(&q[k], *src[k], layer_dtype(L, k));
            *src[k] = q[k].data;
        }
        copy_in_dt(&q[P_W1], L->ffp.w1, L->ffp.wdt);
        copy_in_dt(&q[P_W2], L->ffp.w2, L->ffp.wdt);
        L->ffp.w1 = q[P_W1].data;
        L->ffp.w2 = q[P_W2].data;
        p->w_dtype = AFT_F32;
        L->ffp.wdt = AFT_F32;
        /* the band labml's local_mask holds: |t - t'| < S */
        const size_t Tm = q[P_MASK].shape[0], S = L->cfg.window;
        for (size_t r = 0; r < Tm; r++)
            for (size_t c = 0; c < Tm; c++) q[P_MASK].data[r * Tm + c] = (r > c ? r - c : c - r) < S ? 1.0f : 0.0f;
    }
    tparam *q = t->p + tail_index(m, 0);
    const float **src[] = {[P_NORMW] = &m->norm_w, [P_NORMB] = &m->norm_b, [P_GENW] = NULL, [P_GENB] = &m->gen_b};
    for (int k = 0; k < P_TAIL; k++) {
        if (!src[k]) continue;
        copy_in(&q[k], *src[k]);
        *src[k] = q[k].data;
    }
    copy_in_dt(&q[P_GENW], m->gen_w, m->gen_dt);
    m->gen_w = q[P_GENW].data;
    m->gen_dt = AFT_F32;
    t->have_data = 1;
    return repack(m, err);
}

size_t aft_model_param_count(const aft_model *m)
{
    return m->train ? m->train->np : 0;
}

aft_status aft_model_param_info(const aft_model *m, size_t i, const char **name, size_t *ndim, size_t shape[4],
                                aft_error *err)
{
    const struct aft_train *t = m->train;
    if (!t || t->why[0])
        return aft_fail(err, AFT_ERR_ARG, "%s", t ? t->why : "the model has no parameters to train");
    if (i >= t->np) return aft_fail(err, AFT_ERR_ARG, "parameter %zu of %zu", i, t->np);
    if (name) *name = t->p[i].name;
    if (ndim) *ndim = t->p[i].ndim;
    if (shape)
        for (size_t d = 0; d < 4; d++) shape[d] = d < t->p[i].ndim ? t->p[i].shape[d] : 0;
    return AFT_OK;
}

int aft_model_param_trainable(const aft_model *m, size_t i)
{
    return m->train && i < m->train->np ? m->train->p[i].trainable : 0;
}

float *aft_model_param_data(aft_model *m, size_t i)
{
    aft_error e;
    if (ensure_data(m, &e) || i >= m->train->np) return NULL;
    return m->train->p[i].data;
}

aft_status aft_model_params_changed(aft_model *m, aft_error *err)
{
    aft_status st = ensure_data(m, err);
    return st ? st : repack(m, err);
}

aft_status aft_model_train_prepare(aft_model *m, aft_error *err)
{
    return prepare(m, err);
}

/* ---------------------------------------------------------------- dropout */

double aft_train_dropout_scale(uint64_t seed, uint64_t site, uint64_t i, float p)
{
    if (p <= 0.0f) return 1.0;
    /* splitmix64's finaliser of (seed, site, element) */
    uint64_t z = seed ^ (site + 1) * 0x9E3779B97F4A7C15ull;
    z += (i + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 11) * 0x1p-53;
    return u < (double)p ? 0.0 : 1.0 / (1.0 - (double)p);
}

/* a *= the dropout mask of (seed, site) over n elements, the first of them
 * the site's element i0 */
static void dropout(float *a, size_t n, uint64_t seed, uint64_t site, float p, size_t i0, int nt)
{
    if (p <= 0.0f) return;
    const float inv = (float)(1.0 / (1.0 - (double)p));
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t i = 0; i < n; i++) a[i] = aft_train_dropout_scale(seed, site, i0 + i, p) == 0.0 ? 0.0f : a[i] * inv;
}

/* ---------------------------------------------------------------- pieces */

/* out[k] (n) = the sum over the SUM_CHUNKS chunks c of the floats
 * pf + (c nout + k) n, added in chunk order in double (out[k] NULL: not
 * wanted) */
static void add_chunks(float *const *out, size_t nout, const float *pf, size_t n)
{
    for (size_t k = 0; k < nout; k++)
        for (size_t j = 0; out[k] && j < n; j++) {
            double s = 0.0;
            for (size_t c = 0; c < SUM_CHUNKS; c++) s += pf[(c * nout + k) * n + j];
            out[k][j] = (float)s;
        }
}

/* out (n) = the sum of a's rows (rows x n): SUM_CHUNKS fixed chunks of rows
 * summed in float (aft_col_sums) into part seen as floats, then added */
static void col_sums(float *out, const float *a, size_t rows, size_t n, double *part, int nt)
{
    float *pf = (float *)part;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t c = 0; c < SUM_CHUNKS; c++) {
        size_t i0 = rows * c / SUM_CHUNKS, i1 = rows * (c + 1) / SUM_CHUNKS;
        memset(pf + c * n, 0, n * sizeof *pf);
        aft_col_sums(pf + c * n, a + i0 * n, i1 - i0, n);
    }
    add_chunks(&out, 1, pf, n);
}

/* LayerNorm's backward pass: dx (+)= d/dx of the norm of x (N, D) given dz,
 * its weight w; dw, db (D) written. add: dx += rather than =. Each chunk of
 * rows sums its share of dw and db in float (aft_layernorm_back), in part
 * seen as floats; then added. */
static void layernorm_back(float *dx, int add, float *dw, float *db, const float *dz, const float *x, const float *w,
                           size_t N, size_t D, double *part, int nt)
{
    float *pf = (float *)part;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t c = 0; c < SUM_CHUNKS; c++) {
        float *sw = pf + c * 2 * D, *sb = sw + D;
        size_t i0 = N * c / SUM_CHUNKS, i1 = N * (c + 1) / SUM_CHUNKS;
        memset(sw, 0, 2 * D * sizeof *sw);
        aft_layernorm_back(dx + i0 * D, add, sw, sb, dz + i0 * D, x + i0 * D, w, i1 - i0, D, AFT_LAYERNORM_EPS);
    }
    float *const out[2] = {dw, db};
    add_chunks(out, 2, pf, D);
}

/* out = x + y over n floats, in nt parts */
static void add_into(float *out, const float *x, const float *y, size_t n, int nt)
{
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int p = 0; p < nt; p++) {
        size_t i0 = n * (size_t)p / (size_t)nt, i1 = n * (size_t)(p + 1) / (size_t)nt;
        aft_vadd(out + i0, x + i0, y + i0, i1 - i0);
    }
}

/* ---------------------------------------------------------------- memory */

/* the activations of N rows, and each layer's saved forward (saved floats) */
static aft_status scratch_acts(aft_model *m, size_t N, size_t saved, aft_error *err)
{
    struct aft_train *t = m->train;
    if (N <= t->cap && saved <= t->saved_cap) return AFT_OK;
    const size_t nl = m->info.n_layers, D = m->info.d_model, F = m->info.d_ff;
    free_scratch(t, nl);
    int ok = (t->x = calloc(nl + 1, sizeof *t->x)) && (t->xm = calloc(nl, sizeof *t->xm)) &&
             (t->h = calloc(nl, sizeof *t->h)) && (t->saved = calloc(nl, sizeof *t->saved));
    for (size_t l = 0; ok && l <= nl; l++) ok = (t->x[l] = aft_alloc_array(N, D * sizeof(float))) != NULL;
    for (size_t l = 0; ok && l < nl; l++)
        ok = (t->xm[l] = aft_alloc_array(N, D * sizeof(float))) && (t->h[l] = aft_alloc_array(N, F * sizeof(float))) &&
             (t->saved[l] = aft_alloc_array(saved ? saved : 1, sizeof(float)));
    if (!ok) {
        free_scratch(t, nl);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the activations of %zu rows (%zu layers)", N, nl);
    }
    t->cap = N;
    t->saved_cap = saved;
    return AFT_OK;
}

/* n sets of temporaries for groups of up to rows rows */
static aft_status scratch_temps(aft_model *m, size_t n, size_t rows, aft_error *err)
{
    struct aft_train *t = m->train;
    if (n <= t->ntemps && rows <= t->rows_cap) return AFT_OK;
    const size_t D = m->info.d_model, F = m->info.d_ff, V = m->info.n_vocab;
    for (size_t i = 0; i < t->ntemps; i++) free_temps(&t->tmp[i]);
    free(t->tmp);
    t->ntemps = t->rows_cap = 0;
    int ok = (t->tmp = calloc(n, sizeof *t->tmp)) != NULL;
    size_t w = D > F ? D : F;
    if (V > w) w = V;
    for (size_t i = 0; ok && i < n; i++) {
        temps *q = &t->tmp[i];
        ok = (q->z = aft_alloc_array(rows, D * sizeof(float))) && (q->y = aft_alloc_array(rows, D * sizeof(float))) &&
             (q->dx = aft_alloc_array(rows, D * sizeof(float))) &&
             (q->dz = aft_alloc_array(rows, D * sizeof(float))) &&
             (q->dh = aft_alloc_array(rows, F * sizeof(float))) &&
             (q->hd = aft_alloc_array(rows, F * sizeof(float))) &&
             (q->zf = aft_alloc_array(rows, D * sizeof(float))) &&
             (q->logits = aft_alloc_array(rows, V * sizeof(float))) &&
             (q->part = aft_alloc_array(SUM_CHUNKS, 2 * w * sizeof(double)));
    }
    if (t->tmp) t->ntemps = n;
    if (!ok) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the temporaries of %zu rows", rows);
    t->rows_cap = rows;
    return AFT_OK;
}

/* cross-entropy of the logits (N, V) against targets, summed over the
 * rows; dlogits in place, (softmax - one-hot) inv, when grad. The rows are
 * cut into SUM_CHUNKS fixed chunks, each aft_xent_rows's, added in order:
 * the same bits for any number of threads. */
static double cross_entropy(float *lg, const int32_t *targets, size_t N, size_t V, int grad, double inv, int nt)
{
    double part[SUM_CHUNKS], total = 0.0;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t c = 0; c < SUM_CHUNKS; c++) {
        size_t i0 = N * c / SUM_CHUNKS, i1 = N * (c + 1) / SUM_CHUNKS;
        part[c] = aft_xent_rows(lg + i0 * V, targets + i0, i1 - i0, V, grad, (float)inv);
    }
    for (size_t c = 0; c < SUM_CHUNKS; c++) total += part[c];
    return total;
}

/* ---------------------------------------------------------------- loss and gradient
 *
 * A step cuts its batch into groups of whole sequences, as many as
 * step_groups says whatever the threads. Each thread takes a group as it
 * comes free and runs the whole model's forward and backward pass on its
 * rows alone (its products single-threaded), writing the weight gradients
 * into the group's own copy; the copies are then added in group order. One
 * parallel region a step: no thread waits for another between the
 * products (on a shared machine each wait is a core lost), a weight's
 * gradient is one product over the group's rows, not one cut between the
 * threads, and the bits do not depend on the thread count. With more
 * threads than groups (one sequence, or more than GROUPS_MAX threads) the
 * groups run one after another, each on every thread, as the bits of the
 * threaded kernels give them. */

typedef struct {
    aft_model *m;
    const int32_t *tokens, *targets;
    size_t T;
    float p;                /* dropout */
    uint64_t seed;
    double inv;             /* 1 / the targets counted */
    float *const *grads;    /* the caller's; NULL: the loss alone */
    int inner;              /* threads inside a group */
    aft_layer_prep *preps;  /* each AFT layer's weights stacked and packed
                             * once a step (prep_layers), for every group */
    aft_linear *tl;         /* the backward's dX products from W^T on aft's
                             * kernel, packed once a step: each layer's W1,
                             * W2, then the generator's; NULL: OpenBLAS */
} step;

typedef struct {
    size_t nb, r0, n;       /* nb sequences, rows [r0, r0 + n) */
    size_t saved;           /* its saved forward at saved of each layer's */
    float **g;              /* its gradients (NULL: not wanted) */
    temps *w;
    double loss;            /* its rows' losses, summed */
} group;

/* groups of a step of B sequences (N rows): at most GROUPS_MAX, and their
 * copies of the gradient (grad floats each) no more floats than the
 * activations the step keeps anyway, or than GROUPS_FLOATS */
enum { GROUPS_FLOATS = 1 << 20 };
static size_t step_groups(const aft_model *m, size_t B, size_t N, size_t grad)
{
    const size_t nl = m->info.n_layers, D = m->info.d_model, F = m->info.d_ff;
    size_t act, G = B < GROUPS_MAX ? B : GROUPS_MAX;
    if (!aft_mul_ok(N, nl * (2 * D + F), &act)) act = SIZE_MAX;
    if (act < GROUPS_FLOATS) act = GROUPS_FLOATS;
    while (G > 1 && G > act / (grad ? grad : 1)) G--;
    return G;
}

static aft_config layer_cfg(const mlayer *L, int threads)
{
    aft_config cfg = L->cfg;
    cfg.impl = AFT_IMPL_FAST;
    cfg.precision = AFT_PRECISION_F32;
    cfg.threads = threads;
    cfg.progress = NULL;
    return cfg;
}

/* layer l's FFN hidden units after its dropout: h itself, or a copy */
static const float *hidden_dropped(const step *s, const group *q, const float *h, size_t l)
{
    const size_t F = s->m->info.d_ff;
    if (s->p <= 0.0f) return h;
    memcpy(q->w->hd, h, q->n * F * sizeof(float));
    dropout(q->w->hd, q->n * F, s->seed, 3 * l + 1, s->p, q->r0 * F, s->inner);
    return q->w->hd;
}

/* the gradient w->dx after the dropout of site: a copy in w->y, or dx
 * itself without dropout */
static float *dropped(const step *s, const group *q, uint64_t site)
{
    const size_t D = s->m->info.d_model;
    if (s->p <= 0.0f) return q->w->dx;
    memcpy(q->w->y, q->w->dx, q->n * D * sizeof(float));
    dropout(q->w->y, q->n * D, s->seed, site, s->p, q->r0 * D, s->inner);
    return q->w->y;
}

/* y (n x N) = x (n x K) W^T + b, W (N x K): on aft's kernel where the
 * model packed W in float32 (repack), else OpenBLAS; x's rows were just
 * written (in this core's caches), so read in place */
static void forward_product(const aft_linear *l, int nt, size_t n, size_t N, size_t K, const float *x,
                            const void *w, const float *b, float *y)
{
    if (l->pk && aft_linear_dtype(l) == AFT_F32) aft_linear_apply_x(l, n, x, K, y, N, 1);
    else aft_gemm(nt, 1, n, N, K, x, K, w, K, b, y, N);
}

/* dx (n x N) = dy (n x K) W, W (K x N): on the step's packed W^T i
 * (s->tl), else OpenBLAS */
static void back_product(const step *s, size_t i, size_t n, size_t N, size_t K, const float *dy, const void *w,
                         float *dx)
{
    if (s->tl) aft_linear_apply_x(&s->tl[i], n, dy, K, dx, N, 1);
    else aft_gemm(s->inner, 0, n, N, K, dy, K, w, N, NULL, dx, N);
}

/* the group's forward pass, keeping x, xm, h and the saved forward of each
 * layer, to its logits and its loss (dlogits in their place with grads) */
static aft_status group_forward(const step *s, group *q, aft_error *err)
{
    aft_model *m = s->m;
    struct aft_train *t = m->train;
    const size_t nl = m->info.n_layers, D = m->info.d_model, F = m->info.d_ff, V = m->info.n_vocab;
    const size_t n = q->n, r0 = q->r0;
    const int nt = s->inner;
    temps *w = q->w;
    aft_embed(t->x[0] + r0 * D, &m->emb, s->tokens + r0, s->T, q->nb, s->T, 0);
    for (size_t l = 0; l < nl; l++) {
        const mlayer *L = &m->layers[l];
        const aft_config cfg = layer_cfg(L, nt);
        float *x = t->x[l] + r0 * D, *xm = t->xm[l] + r0 * D, *h = t->h[l] + r0 * F;
        aft_layernorm(w->z, x, L->ln1_w, L->ln1_b, n, D, AFT_LAYERNORM_EPS);
        aft_error e2;
        aft_status st = aft_layer_forward_saved_prep(w->y, t->saved[l] + q->saved, w->z, &s->preps[l], &cfg, q->nb,
                                                     s->T, &w->ws, &e2);
        if (st) return aft_fail(err, st, "layer %zu: %s", l, e2.msg);
        dropout(w->y, n * D, s->seed, 3 * l, s->p, r0 * D, nt);
        add_into(xm, x, w->y, n * D, nt);
        aft_layernorm(w->z, xm, L->ln2_w, L->ln2_b, n, D, AFT_LAYERNORM_EPS);
        forward_product(&L->ffn.l1, nt, n, F, D, w->z, L->ffp.w1, L->ffp.b1, h);
        aft_relu(h, n * F);
        forward_product(&L->ffn.l2, nt, n, D, F, hidden_dropped(s, q, h, l), L->ffp.w2, L->ffp.b2, w->y);
        dropout(w->y, n * D, s->seed, 3 * l + 2, s->p, r0 * D, nt);
        add_into(t->x[l + 1] + r0 * D, xm, w->y, n * D, nt);
    }
    aft_layernorm(w->zf, t->x[nl] + r0 * D, m->norm_w, m->norm_b, n, D, AFT_LAYERNORM_EPS);
    forward_product(&m->gen, nt, n, V, D, w->zf, m->gen_w, m->gen_b, w->logits);
    q->loss = cross_entropy(w->logits, s->targets + r0, n, V, s->grads != NULL, s->inv, nt);
    return AFT_OK;
}

/* the generator and encoder.norm: w->dx = d/d(the encoder's output) */
static void head_backward(const step *s, const group *q)
{
    const aft_model *m = s->m;
    const size_t nl = m->info.n_layers, D = m->info.d_model, V = m->info.n_vocab, n = q->n, th = tail_index(m, 0);
    temps *w = q->w;
    float *const *g = q->g;
    if (g[th + P_GENW]) aft_gemm_tn(s->inner, V, D, n, w->logits, V, w->zf, D, g[th + P_GENW], D);
    if (g[th + P_GENB]) col_sums(g[th + P_GENB], w->logits, n, V, w->part, s->inner);
    back_product(s, 2 * nl, n, D, V, w->logits, m->gen_w, w->dz);
    layernorm_back(w->dx, 0, g[th + P_NORMW], g[th + P_NORMB], w->dz, m->train->x[nl] + q->r0 * D, m->norm_w, n, D,
                   w->part, s->inner);
}

/* layer l's FFN and norm_ff: w->dx from d/d(x[l + 1]) to d/d(xm[l]) */
static void ffn_backward(const step *s, const group *q, size_t l)
{
    const aft_model *m = s->m;
    const mlayer *L = &m->layers[l];
    const size_t D = m->info.d_model, F = m->info.d_ff, n = q->n, r0 = q->r0;
    const int nt = s->inner;
    temps *w = q->w;
    float *const *gl = q->g + layer_index(l, 0);
    const float *h = m->train->h[l] + r0 * F, *xm = m->train->xm[l] + r0 * D;
    /* dy = dropout(dx) (dx itself without dropout: read before dx changes);
     * y = hd W2^T + b2 */
    float *dy = dropped(s, q, 3 * l + 2);
    if (gl[P_W2]) aft_gemm_tn(nt, D, F, n, dy, D, hidden_dropped(s, q, h, l), F, gl[P_W2], F);
    if (gl[P_B2]) col_sums(gl[P_B2], dy, n, D, w->part, nt);
    back_product(s, 2 * l + 1, n, F, D, dy, L->ffp.w2, w->dh);
    dropout(w->dh, n * F, s->seed, 3 * l + 1, s->p, r0 * F, nt);
    float *dh = w->dh;
    aft_relu_back(dh, h, n * F);
    aft_layernorm(w->z, xm, L->ln2_w, L->ln2_b, n, D, AFT_LAYERNORM_EPS);
    if (gl[P_W1]) aft_gemm_tn(nt, F, D, n, dh, F, w->z, D, gl[P_W1], D);
    if (gl[P_B1]) col_sums(gl[P_B1], dh, n, F, w->part, nt);
    back_product(s, 2 * l, n, D, F, dh, L->ffp.w1, w->dz);
    layernorm_back(w->dx, 1, gl[P_LN2W], gl[P_LN2B], w->dz, xm, L->ln2_w, n, D, w->part, nt);
}

/* layer l's self_attn and norm_self_attn: w->dx from d/d(xm[l]) to d/d(x[l]) */
static aft_status attn_backward(const step *s, const group *q, size_t l, aft_error *err)
{
    const aft_model *m = s->m;
    const mlayer *L = &m->layers[l];
    const size_t D = m->info.d_model, n = q->n, r0 = q->r0;
    temps *w = q->w;
    float *const *gl = q->g + layer_index(l, 0);
    const float *x = m->train->x[l] + r0 * D;
    float *dy = dropped(s, q, 3 * l);
    aft_layernorm(w->z, x, L->ln1_w, L->ln1_b, n, D, AFT_LAYERNORM_EPS);
    const aft_config cfg = layer_cfg(L, s->inner);
    aft_layer_grads lg = {.dx = w->dz, .wq = gl[P_QW], .bq = gl[P_QB], .wk = gl[P_KW], .bk = gl[P_KB],
                          .wv = gl[P_VW], .bv = gl[P_VB], .wo = gl[P_OW], .bo = gl[P_OB]};
    lg.bias.dense = gl[P_POS];
    aft_error e2;
    aft_status st = aft_layer_backward_saved_prep(&lg, m->train->saved[l] + q->saved, dy, w->z, &s->preps[l], &cfg,
                                                  q->nb, s->T, &w->ws, &e2);
    if (st) return aft_fail(err, st, "layer %zu: %s", l, e2.msg);
    layernorm_back(w->dx, 1, gl[P_LN1W], gl[P_LN1B], w->dz, x, L->ln1_w, n, D, w->part, s->inner);
    return AFT_OK;
}

/* the group's backward pass, from its dlogits down to the embedding */
static aft_status group_backward(const step *s, const group *q, aft_error *err)
{
    const aft_model *m = s->m;
    const size_t D = m->info.d_model, V = m->info.n_vocab, n = q->n;
    head_backward(s, q);
    for (size_t l = m->info.n_layers; l-- > 0;) {
        ffn_backward(s, q, l);
        aft_status st = attn_backward(s, q, l, err);
        if (st) return st;
    }
    /* the embedding: each row's gradient to its token's, times the scale */
    float *ge = q->g[P_EMB];
    if (!ge) return AFT_OK;
    const float *dx = q->w->dx;
    const int32_t *tok = s->tokens + q->r0;
    memset(ge, 0, V * D * sizeof(float));
    #pragma omp parallel for schedule(static) num_threads(s->inner) if (s->inner > 1)
    for (size_t j = 0; j < D; j++)
        for (size_t i = 0; i < n; i++) ge[(size_t)tok[i] * D + j] += m->emb.scale * dx[i * D + j];
    return AFT_OK;
}

static aft_status check_call(const aft_model *m, const int32_t *tokens, const int32_t *targets, size_t B, size_t T,
                             const aft_train_options *o, float *loss, size_t *N, aft_error *err)
{
    if (!tokens || !targets || !loss)
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !tokens ? "tokens" : !targets ? "targets" : "loss");
    if (!aft_mul_ok(B, T, N) || *N > INT_MAX || *N == 0)
        return aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu must be from 1 to %d", B, T, INT_MAX);
    if (T > m->info.context)
        return aft_fail(err, AFT_ERR_ARG, "%zu tokens exceed the model's context of %zu (the rows of '%s')", T,
                        m->info.context, m->context_from);
    if (o && !(o->dropout >= 0.0f && o->dropout < 1.0f))
        return aft_fail(err, AFT_ERR_ARG, "dropout %g is not in [0, 1)", (double)o->dropout);
    const size_t V = m->info.n_vocab;
    for (size_t i = 0; i < *N; i++) {
        if (tokens[i] < 0 || (size_t)tokens[i] >= V)
            return aft_fail(err, AFT_ERR_ARG, "token %" PRId32 " (sequence %zu, position %zu) is outside the "
                            "vocabulary [0, %zu)", tokens[i], i / T, i % T, V);
        if (targets[i] >= 0 && (size_t)targets[i] >= V)
            return aft_fail(err, AFT_ERR_ARG, "target %" PRId32 " (sequence %zu, position %zu) is outside the "
                            "vocabulary [0, %zu)", targets[i], i / T, i % T, V);
    }
    return AFT_OK;
}

/* the groups' places: their sequences and rows, their saved forwards
 * (*saved: the floats of all, a layer), their gradients (the caller's for
 * one group, else ptr's G x np pointers into the copies, *copy floats
 * each); NULL copies: only sizes */
static aft_status plan_groups(const step *s, group *grp, size_t G, size_t B, float **ptr, float *copies,
                              size_t *saved, size_t *copy, aft_error *err)
{
    const struct aft_train *t = s->m->train;
    const aft_config cfg = layer_cfg(&s->m->layers[0], s->inner);
    *saved = *copy = 0;
    for (size_t i = 0; s->grads && i < t->np; i++) *copy += s->grads[i] && t->p[i].trainable ? t->p[i].n : 0;
    for (size_t g = 0; g < G; g++) {
        size_t b0 = B * g / G, nf;
        group *q = &grp[g];
        q->nb = B * (g + 1) / G - b0;
        q->r0 = b0 * s->T;
        q->n = q->nb * s->T;
        q->saved = *saved;
        aft_status st = aft_layer_saved_floats(&s->m->layers[0].attn.p, &cfg, q->nb, s->T, &nf, err);
        if (st) return st;
        if (!aft_add_ok(*saved, nf, saved)) return aft_fail(err, AFT_ERR_ARG, "the saved forward overflows");
        q->g = G == 1 ? (float **)s->grads : ptr + g * t->np;
        for (size_t i = 0, at = 0; G > 1 && s->grads && i < t->np; i++) {
            int want = s->grads[i] && t->p[i].trainable;
            q->g[i] = want && copies ? copies + g * *copy + at : NULL;
            at += want ? t->p[i].n : 0;
        }
    }
    return AFT_OK;
}

/* the caller's gradients: the groups' copies added in group order, and 0
 * for the buffers */
static void gather_grads(const step *s, const group *grp, size_t G, int nt)
{
    const struct aft_train *t = s->m->train;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    for (size_t i = 0; i < t->np; i++) {
        float *out = s->grads[i];
        if (!out) continue;
        if (!t->p[i].trainable) {
            #pragma omp single nowait
            memset(out, 0, t->p[i].n * sizeof(float));
            continue;
        }
        if (G == 1) continue;
        #pragma omp for schedule(static) nowait
        for (size_t e = 0; e < t->p[i].n; e++) {
            double a = grp[0].g[i][e];
            for (size_t g = 1; g < G; g++) a += grp[g].g[i][e];
            out[e] = (float)a;
        }
    }
}

/* s->tl, when aft's kernel runs the forward's products (the model packed
 * its FFNs' W1 in float32) and gradients are wanted: each layer's W1 and
 * W2, then the generator's, as W^T. Short of memory: OpenBLAS runs them. */
static void prep_back_products(step *s)
{
    const aft_model *m = s->m;
    const size_t nl = m->info.n_layers, D = m->info.d_model, F = m->info.d_ff, V = m->info.n_vocab;
    if (!s->grads || nl == 0 || !m->layers[0].ffn.l1.pk || aft_linear_dtype(&m->layers[0].ffn.l1) != AFT_F32 ||
        m->gen_dt != AFT_F32)
        return;
    aft_linear *tl = calloc(2 * nl + 1, sizeof *tl);
    size_t made = 0;
    int ok = tl != NULL;
    for (size_t l = 0; ok && l < nl; l++) {
        const aft_ffn_params *f = &m->layers[l].ffp;
        ok = f->wdt == AFT_F32 &&
             !aft_linear_init_t(&tl[made], f->w1, D, D, F, AFT_KERNEL_OWN, s->inner, NULL) && ++made &&
             !aft_linear_init_t(&tl[made], f->w2, F, F, D, AFT_KERNEL_OWN, s->inner, NULL) && ++made;
    }
    ok = ok && !aft_linear_init_t(&tl[made], m->gen_w, D, D, V, AFT_KERNEL_OWN, s->inner, NULL) && ++made;
    if (!ok) {
        for (size_t i = 0; i < made; i++) aft_linear_free(&tl[i]);
        free(tl);
        return;
    }
    s->tl = tl;
}

/* each AFT layer's prep for this step's weights (the backward's too with
 * grads); freed by free_preps */
static aft_status prep_layers(step *s, aft_error *err)
{
    const aft_model *m = s->m;
    const size_t nl = m->info.n_layers;
    if (!(s->preps = calloc(nl, sizeof *s->preps)))
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu layers' weights", nl);
    for (size_t l = 0; l < nl; l++) {
        const aft_config cfg = layer_cfg(&m->layers[l], s->inner);
        aft_status st = aft_layer_prep_init(&s->preps[l], &m->layers[l].attn.p, cfg.projections, cfg.precision,
                                            s->inner, err);
        if (!st && s->grads) st = aft_layer_prep_grad(&s->preps[l], err);
        if (st) return st;
    }
    prep_back_products(s);
    return AFT_OK;
}

static void free_preps(step *s)
{
    for (size_t l = 0; s->preps && l < s->m->info.n_layers; l++) aft_layer_prep_free(&s->preps[l]);
    free(s->preps);
    s->preps = NULL;
    for (size_t i = 0; s->tl && i < 2 * s->m->info.n_layers + 1; i++) aft_linear_free(&s->tl[i]);
    free(s->tl);
    s->tl = NULL;
}

/* the groups, each forward then backward, one a thread as they come free */
static aft_status run_groups(const step *s, group *grp, size_t G, int outer, aft_error *err)
{
    struct aft_train *t = s->m->train;
    aft_status st = AFT_OK;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(outer) if (outer > 1)
    for (size_t g = 0; g < G; g++) {
        /* OpenBLAS's OpenMP build runs a product on omp_get_max_threads()
         * threads outside an active region (a region of one thread is not
         * active): a group of one thread runs its products on it alone */
        if (s->inner == 1) omp_set_num_threads(1);
        aft_error e;
        group *q = &grp[g];
        q->w = &t->tmp[outer > 1 ? omp_get_thread_num() : 0];
        aft_status sg = group_forward(s, q, &e);
        if (!sg && s->grads) sg = group_backward(s, q, &e);
        if (sg) {
            #pragma omp critical(aft_model_grad_error)
            if (!st) {
                st = sg;
                *err = e;
            }
        }
    }
    return st;
}

/* the step's memory: the activations and saved forwards, each thread's
 * temporaries, and with more than one group their copies of the gradients */
static aft_status step_memory(const step *s, group *grp, size_t G, size_t B, size_t N, int outer, float **ptr,
                              aft_error *err)
{
    struct aft_train *t = s->m->train;
    size_t saved, copy, all;
    aft_status st = plan_groups(s, grp, G, B, ptr, NULL, &saved, &copy, err);
    if (!st) st = scratch_acts(s->m, N, saved, err);
    if (!st) st = scratch_temps(s->m, (size_t)outer, (B + G - 1) / G * s->T, err);
    if (st) return st;
    if (G > 1 && s->grads) {
        if (!aft_mul_ok(G, copy, &all)) return aft_fail(err, AFT_ERR_NOMEM, "%zu copies of the gradients", G);
        if (all > t->copy_cap) {
            free(t->copies);
            t->copy_cap = 0;
            if (!(t->copies = aft_alloc_array(all, sizeof(float))))
                return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu copies of the gradients", G);
            t->copy_cap = all;
        }
    }
    return plan_groups(s, grp, G, B, ptr, t->copies, &saved, &copy, err);
}

aft_status aft_model_loss_grad(aft_model *m, const int32_t *tokens, const int32_t *targets, size_t B, size_t T,
                               const aft_train_options *o, float *loss, float *const *grads, aft_error *err)
{
    size_t N = 0, count = 0, saved, copy;
    aft_status st = check_call(m, tokens, targets, B, T, o, loss, &N, err);
    if (st || (st = ensure_data(m, err))) return st;
    struct aft_train *t = m->train;
    const int nt = aft_threads_or_all(o && o->threads ? o->threads : m->threads);
    for (size_t i = 0; i < N; i++) count += targets[i] >= 0;
    step s = {.m = m, .tokens = tokens, .targets = targets, .T = T, .p = o ? o->dropout : 0.0f,
              .seed = o ? o->seed : 0, .inv = count ? 1.0 / (double)count : 0.0, .grads = grads, .inner = nt};
    /* the gradients' floats (plan_groups of one group), then the groups */
    group one;
    if ((st = plan_groups(&s, &one, 1, B, NULL, NULL, &saved, &copy, err))) return st;
    const size_t G = step_groups(m, B, N, copy);
    /* more threads than groups: the groups one after another, on all of them */
    const int outer = G > 1 && nt > 1 && (size_t)nt <= G ? nt : 1;
    s.inner = outer > 1 ? 1 : nt;
    group *grp = calloc(G, sizeof *grp);
    float **ptr = calloc(G * t->np, sizeof *ptr);
    if (!grp || !ptr) st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu groups", G);
    if (!st) st = step_memory(&s, grp, G, B, N, outer, ptr, err);
    if (!st) st = prep_layers(&s, err);
    if (!st) st = run_groups(&s, grp, G, outer, err);
    if (!st) {
        double total = 0.0;
        for (size_t g = 0; g < G; g++) total += grp[g].loss;
        *loss = (float)(total * s.inv);
        if (grads) gather_grads(&s, grp, G, nt);
    }
    free_preps(&s);
    free(grp);
    free(ptr);
    return st;
}
