/* model_grad.c - training's view of labml's model: its parameters under
 * labml's names (float32 master copies the forward pass reads), and the
 * loss with its gradient for every parameter.
 *
 * The forward pass keeps, per layer, its input x, the residual stream after
 * self_attn (xm) and the FFN's hidden units after the ReLU (h): (2 D + F)
 * floats a row. The LayerNorms' outputs are computed again in the backward
 * pass (cheap, and it saves 2 D a row), dropout masks are a pure function of
 * (seed, site, element), and each AFT layer's backward (layer_grad.c) runs
 * its own forward. The backward pass then goes layer by layer from the
 * cross-entropy down to the embedding:
 *   LayerNorm:  dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), dy = dz w,
 *               dw = sum dz xhat, db = sum dz
 *   Linear:     dX = dY W, dW = dY^T X, db = column sums of dY
 *   ReLU:       dh = dh (h > 0);  dropout: d = d mask / (1 - p)
 *   embedding:  dtable[token] += sqrt(D) dx */
#include "layer.h"
#include "model_priv.h"
#include "nn/bf16.h"

#include <cblas.h>
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

typedef struct {
    char name[96];
    size_t ndim, shape[4], n;
    int trainable;
    float *data;   /* the master copy; NULL until the first data call */
} tparam;

struct aft_train {
    char why[200];        /* nonempty: the model cannot be trained, and why */
    size_t np;
    tparam *p;
    int have_data;
    /* the activations of a step, for cap rows */
    size_t cap;
    float **x, **xm, **h; /* per layer (n_layers + 1 x's: the last the encoder's output) */
    float *z, *y, *dx, *dz, *dh, *hd, *zf, *logits;
    double *part;         /* SUM_CHUNKS x max(D, F, V) partial sums */
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

static void free_scratch(struct aft_train *t, size_t nl)
{
    for (size_t l = 0; t->x && l <= nl; l++) free(t->x[l]);
    for (size_t l = 0; t->xm && l < nl; l++) free(t->xm[l]);
    for (size_t l = 0; t->h && l < nl; l++) free(t->h[l]);
    free(t->x);
    free(t->xm);
    free(t->h);
    t->x = t->xm = t->h = NULL;
    float **s[] = {&t->z, &t->y, &t->dx, &t->dz, &t->dh, &t->hd, &t->zf, &t->logits};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        free(*s[i]);
        *s[i] = NULL;
    }
    free(t->part);
    t->part = NULL;
    t->cap = 0;
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

/* a *= the dropout mask of (seed, site) over n elements */
static void dropout(float *a, size_t n, uint64_t seed, uint64_t site, float p, int nt)
{
    if (p <= 0.0f) return;
    const float inv = (float)(1.0 / (1.0 - (double)p));
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t i = 0; i < n; i++) a[i] = aft_train_dropout_scale(seed, site, i, p) == 0.0 ? 0.0f : a[i] * inv;
}

/* ---------------------------------------------------------------- pieces */

/* C (M, N) = A^T B: A (K, M), B (K, N); the rows of C dealt to the threads */
static void gemm_tn(int nt, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B, size_t ldb,
                    float *C, size_t ldc)
{
    aft_blas_one_thread();
    size_t parts = (size_t)nt, step = (M + parts - 1) / parts;
    step = (step + 15) / 16 * 16;
    #pragma omp parallel for schedule(static, 1) num_threads(nt) if (nt > 1)
    for (size_t p = 0; p < parts; p++) {
        size_t a = p * step < M ? p * step : M, b = a + step < M ? a + step : M;
        if (b > a)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(b - a), (int)N, (int)K, 1.0f, A + a,
                        (int)lda, B, (int)ldb, 0.0f, C + a * ldc, (int)ldc);
    }
}

/* out (n) = column sums of a (rows, n), in fixed chunks added in order */
static void col_sums(float *out, const float *a, size_t rows, size_t n, double *part, int nt)
{
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t c = 0; c < SUM_CHUNKS; c++) {
        double *s = part + c * n;
        for (size_t j = 0; j < n; j++) s[j] = 0.0;
        for (size_t i = rows * c / SUM_CHUNKS; i < rows * (c + 1) / SUM_CHUNKS; i++)
            for (size_t j = 0; j < n; j++) s[j] += a[i * n + j];
    }
    for (size_t j = 0; j < n; j++) {
        double s = 0.0;
        for (size_t c = 0; c < SUM_CHUNKS; c++) s += part[c * n + j];
        out[j] = (float)s;
    }
}

/* LayerNorm's backward pass: dx (+)= d/dx of the norm of x (N, D) given dz,
 * its weight w; dw, db (D) written. add: dx += rather than =. */
static void layernorm_back(float *dx, int add, float *dw, float *db, const float *dz, const float *x, const float *w,
                           size_t N, size_t D, double *part, int nt)
{
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t c = 0; c < SUM_CHUNKS; c++) {
        double *sw = part + c * 2 * D, *sb = sw + D;
        for (size_t j = 0; j < 2 * D; j++) sw[j] = 0.0;
        for (size_t i = N * c / SUM_CHUNKS; i < N * (c + 1) / SUM_CHUNKS; i++) {
            const float *xr = x + i * D, *g = dz + i * D;
            double mean = 0.0, var = 0.0;
            for (size_t j = 0; j < D; j++) mean += xr[j];
            mean /= (double)D;
            for (size_t j = 0; j < D; j++) var += (xr[j] - mean) * (xr[j] - mean);
            var /= (double)D;
            const double rstd = 1.0 / sqrt(var + (double)AFT_LAYERNORM_EPS);
            double m1 = 0.0, m2 = 0.0;
            for (size_t j = 0; j < D; j++) {
                double xh = (xr[j] - mean) * rstd, dy = (double)g[j] * w[j];
                m1 += dy;
                m2 += dy * xh;
                sw[j] += (double)g[j] * xh;
                sb[j] += g[j];
            }
            m1 /= (double)D;
            m2 /= (double)D;
            float *o = dx + i * D;
            for (size_t j = 0; j < D; j++) {
                double xh = (xr[j] - mean) * rstd, v = rstd * ((double)g[j] * w[j] - m1 - xh * m2);
                o[j] = add ? (float)(o[j] + v) : (float)v;
            }
        }
    }
    for (size_t j = 0; j < D; j++) {
        double sw = 0.0, sb = 0.0;
        for (size_t c = 0; c < SUM_CHUNKS; c++) {
            sw += part[c * 2 * D + j];
            sb += part[c * 2 * D + D + j];
        }
        if (dw) dw[j] = (float)sw;
        if (db) db[j] = (float)sb;
    }
}

static void add_to(float *x, const float *y, size_t n, int nt)
{
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static aft_status scratch(aft_model *m, size_t N, aft_error *err)
{
    struct aft_train *t = m->train;
    if (N <= t->cap) return AFT_OK;
    const size_t nl = m->info.n_layers, D = m->info.d_model, F = m->info.d_ff, V = m->info.n_vocab;
    free_scratch(t, nl);
    int ok = (t->x = calloc(nl + 1, sizeof *t->x)) && (t->xm = calloc(nl, sizeof *t->xm)) &&
             (t->h = calloc(nl, sizeof *t->h));
    for (size_t l = 0; ok && l <= nl; l++) ok = (t->x[l] = aft_alloc_array(N, D * sizeof(float))) != NULL;
    for (size_t l = 0; ok && l < nl; l++)
        ok = (t->xm[l] = aft_alloc_array(N, D * sizeof(float))) && (t->h[l] = aft_alloc_array(N, F * sizeof(float)));
    size_t w = D > F ? D : F;
    if (V > w) w = V;
    ok = ok && (t->z = aft_alloc_array(N, D * sizeof(float))) && (t->y = aft_alloc_array(N, D * sizeof(float))) &&
         (t->dx = aft_alloc_array(N, D * sizeof(float))) && (t->dz = aft_alloc_array(N, D * sizeof(float))) &&
         (t->dh = aft_alloc_array(N, F * sizeof(float))) && (t->hd = aft_alloc_array(N, F * sizeof(float))) &&
         (t->zf = aft_alloc_array(N, D * sizeof(float))) && (t->logits = aft_alloc_array(N, V * sizeof(float))) &&
         (t->part = aft_alloc_array(SUM_CHUNKS, 2 * w * sizeof(double)));
    if (!ok) {
        free_scratch(t, nl);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the activations of %zu rows (%zu layers)", N, nl);
    }
    t->cap = N;
    return AFT_OK;
}

/* cross-entropy of the logits (N, V) against targets; dlogits in place
 * (softmax - one-hot) / count when grad */
static double cross_entropy(float *lg, const int32_t *targets, size_t N, size_t V, int grad, int nt)
{
    size_t count = 0;
    for (size_t i = 0; i < N; i++) count += targets[i] >= 0;
    double total = 0.0;
    const double inv = count ? 1.0 / (double)count : 0.0;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1) reduction(+ : total)
    for (size_t i = 0; i < N; i++) {
        float *r = lg + i * V;
        if (targets[i] < 0) {
            if (grad) memset(r, 0, V * sizeof(float));
            continue;
        }
        /* subtract the row's max so exp cannot overflow */
        double mx = r[0], s = 0.0;
        for (size_t j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
        for (size_t j = 0; j < V; j++) s += exp((double)r[j] - mx);
        double lse = mx + log(s);
        total += lse - r[targets[i]];
        if (grad) {
            for (size_t j = 0; j < V; j++) r[j] = (float)(exp((double)r[j] - lse) * inv);
            r[targets[i]] -= (float)inv;
        }
    }
    /* the sum above is per thread; its order differs with threads only in the
     * last bits of a double */
    return count ? total / (double)count : 0.0;
}

/* ---------------------------------------------------------------- loss and gradient */

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

aft_status aft_model_loss_grad(aft_model *m, const int32_t *tokens, const int32_t *targets, size_t B, size_t T,
                               const aft_train_options *o, float *loss, float *const *grads, aft_error *err)
{
    size_t N;
    aft_status st = check_call(m, tokens, targets, B, T, o, loss, &N, err);
    if (st || (st = ensure_data(m, err)) || (st = scratch(m, N, err))) return st;
    struct aft_train *t = m->train;
    const size_t nl = m->info.n_layers, D = m->info.d_model, F = m->info.d_ff, V = m->info.n_vocab;
    const float p = o ? o->dropout : 0.0f;
    const uint64_t seed = o ? o->seed : 0;
    const int nt = aft_threads_or_all(o && o->threads ? o->threads : m->threads);
    aft_error e2;

    /* forward, keeping x, xm, h of each layer */
    aft_embed(t->x[0], &m->emb, tokens, T, B, T, 0);
    for (size_t l = 0; l < nl; l++) {
        const mlayer *L = &m->layers[l];
        aft_config cfg = L->cfg;
        cfg.impl = AFT_IMPL_FAST;
        cfg.precision = AFT_PRECISION_F32;
        cfg.threads = nt;
        cfg.progress = NULL;
        aft_layernorm(t->z, t->x[l], L->ln1_w, L->ln1_b, N, D, AFT_LAYERNORM_EPS);
        if ((st = aft_layer_forward(t->y, t->z, &L->attn.p, &cfg, B, T, &e2)))
            return aft_fail(err, st, "layer %zu: %s", l, e2.msg);
        dropout(t->y, N * D, seed, 3 * l, p, nt);
        memcpy(t->xm[l], t->x[l], N * D * sizeof(float));
        add_to(t->xm[l], t->y, N * D, nt);
        aft_layernorm(t->z, t->xm[l], L->ln2_w, L->ln2_b, N, D, AFT_LAYERNORM_EPS);
        aft_gemm(nt, 1, N, F, D, t->z, D, L->ffp.w1, D, L->ffp.b1, t->h[l], F);
        float *h = t->h[l];
        #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (size_t i = 0; i < N * F; i++) h[i] = h[i] > 0.0f || isnan(h[i]) ? h[i] : 0.0f;
        const float *hd = h;
        if (p > 0.0f) {
            memcpy(t->hd, h, N * F * sizeof(float));
            dropout(t->hd, N * F, seed, 3 * l + 1, p, nt);
            hd = t->hd;
        }
        aft_gemm(nt, 1, N, D, F, hd, F, L->ffp.w2, F, L->ffp.b2, t->y, D);
        dropout(t->y, N * D, seed, 3 * l + 2, p, nt);
        memcpy(t->x[l + 1], t->xm[l], N * D * sizeof(float));
        add_to(t->x[l + 1], t->y, N * D, nt);
    }
    aft_layernorm(t->zf, t->x[nl], m->norm_w, m->norm_b, N, D, AFT_LAYERNORM_EPS);
    aft_gemm(nt, 1, N, V, D, t->zf, D, m->gen_w, D, m->gen_b, t->logits, V);
    *loss = (float)cross_entropy(t->logits, targets, N, V, grads != NULL, nt);
    if (!grads) return AFT_OK;

    /* backward: the head */
    float *const *g = grads;
    const size_t th = tail_index(m, 0);
    if (g[th + P_GENW]) gemm_tn(nt, V, D, N, t->logits, V, t->zf, D, g[th + P_GENW], D);
    if (g[th + P_GENB]) col_sums(g[th + P_GENB], t->logits, N, V, t->part, nt);
    aft_gemm(nt, 0, N, D, V, t->logits, V, m->gen_w, D, NULL, t->dz, D);
    layernorm_back(t->dx, 0, g[th + P_NORMW], g[th + P_NORMB], t->dz, t->x[nl], m->norm_w, N, D, t->part, nt);
    /* the layers, last first */
    for (size_t l = nl; l-- > 0;) {
        const mlayer *L = &m->layers[l];
        float *const *gl = g + layer_index(l, 0);
        /* the FFN: dy = dropout(dx); y = hd W2^T + b2 */
        float *dy = t->y;
        memcpy(dy, t->dx, N * D * sizeof(float));
        dropout(dy, N * D, seed, 3 * l + 2, p, nt);
        const float *hd = t->h[l];
        if (p > 0.0f) {
            memcpy(t->hd, t->h[l], N * F * sizeof(float));
            dropout(t->hd, N * F, seed, 3 * l + 1, p, nt);
            hd = t->hd;
        }
        if (gl[P_W2]) gemm_tn(nt, D, F, N, dy, D, hd, F, gl[P_W2], F);
        if (gl[P_B2]) col_sums(gl[P_B2], dy, N, D, t->part, nt);
        aft_gemm(nt, 0, N, F, D, dy, D, L->ffp.w2, F, NULL, t->dh, F);
        dropout(t->dh, N * F, seed, 3 * l + 1, p, nt);
        const float *h = t->h[l];
        float *dh = t->dh;
        #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (size_t i = 0; i < N * F; i++) dh[i] = h[i] > 0.0f ? dh[i] : 0.0f;
        aft_layernorm(t->z, t->xm[l], L->ln2_w, L->ln2_b, N, D, AFT_LAYERNORM_EPS);
        if (gl[P_W1]) gemm_tn(nt, F, D, N, dh, F, t->z, D, gl[P_W1], D);
        if (gl[P_B1]) col_sums(gl[P_B1], dh, N, F, t->part, nt);
        aft_gemm(nt, 0, N, D, F, dh, F, L->ffp.w1, D, NULL, t->dz, D);
        layernorm_back(t->dx, 1, gl[P_LN2W], gl[P_LN2B], t->dz, t->xm[l], L->ln2_w, N, D, t->part, nt);
        /* self_attn: dy = dropout(dx) */
        memcpy(dy, t->dx, N * D * sizeof(float));
        dropout(dy, N * D, seed, 3 * l, p, nt);
        aft_layernorm(t->z, t->x[l], L->ln1_w, L->ln1_b, N, D, AFT_LAYERNORM_EPS);
        aft_config cfg = L->cfg;
        cfg.impl = AFT_IMPL_FAST;
        cfg.precision = AFT_PRECISION_F32;
        cfg.threads = nt;
        cfg.progress = NULL;
        aft_layer_grads lg = {.dx = t->dz, .wq = gl[P_QW], .bq = gl[P_QB], .wk = gl[P_KW], .bk = gl[P_KB],
                              .wv = gl[P_VW], .bv = gl[P_VB], .wo = gl[P_OW], .bo = gl[P_OB]};
        lg.bias.dense = gl[P_POS];
        if ((st = aft_layer_backward(&lg, NULL, dy, t->z, &L->attn.p, &cfg, B, T, &e2)))
            return aft_fail(err, st, "layer %zu: %s", l, e2.msg);
        layernorm_back(t->dx, 1, gl[P_LN1W], gl[P_LN1B], t->dz, t->x[l], L->ln1_w, N, D, t->part, nt);
        if (gl[P_MASK]) memset(gl[P_MASK], 0, t->p[layer_index(l, P_MASK)].n * sizeof(float));
    }
    /* the embedding: each row's gradient to its token's, times the scale */
    if (g[P_EMB]) {
        float *ge = g[P_EMB];
        memset(ge, 0, V * D * sizeof(float));
        #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (size_t j = 0; j < D; j++)
            for (size_t i = 0; i < N; i++) ge[(size_t)tokens[i] * D + j] += m->emb.scale * t->dx[i * D + j];
    }
    if (g[P_PE]) memset(g[P_PE], 0, t->p[P_PE].n * sizeof(float));
    return AFT_OK;
}
