/* train.c - what aft train needs around the model's gradients: a fresh
 * labml model as PyTorch initialises it, the vocabulary of a text, the
 * learning-rate schedule, gradient clipping and Adam (as
 * testdata/model/train_labml_aft.py runs them), and the checkpoint. */
#include "internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- a fresh model */

/* one tensor of the state dict being built */
typedef struct {
    char name[96];
    aft_tensor t;
} sd_entry;

typedef struct {
    sd_entry *e;
    size_t n, cap;
} state_dict;

static float *sd_add(state_dict *sd, aft_dtype dt, size_t ndim, const size_t *shape, aft_error *err,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* appends a zeroed tensor named by fmt; its data, or NULL after an error */
static float *sd_add(state_dict *sd, aft_dtype dt, size_t ndim, const size_t *shape, aft_error *err,
                     const char *fmt, ...)
{
    if (sd->n == sd->cap) {
        size_t cap = sd->cap ? 2 * sd->cap : 32;
        sd_entry *e = realloc(sd->e, cap * sizeof *e);
        if (!e) return aft_fail(err, AFT_ERR_NOMEM, "out of memory building the model"), NULL;
        sd->e = e;
        sd->cap = cap;
    }
    sd_entry *x = &sd->e[sd->n];
    memset(x, 0, sizeof *x);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->name, sizeof x->name, fmt, ap);
    va_end(ap);
    size_t nelem = 1;
    for (size_t i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(nelem, shape[i], &nelem))
            return aft_fail(err, AFT_ERR_ARG, "%s: the shape overflows", x->name), NULL;
        x->t.shape[i] = shape[i];
    }
    size_t nbytes;
    if (__builtin_mul_overflow(nelem, aft_dtype_size(dt), &nbytes))
        return aft_fail(err, AFT_ERR_ARG, "%s: the shape overflows", x->name), NULL;
    void *p = calloc(nbytes ? nbytes : 1, 1);
    if (!p) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %s (%zu bytes)", x->name, nbytes), NULL;
    x->t.dtype = dt;
    x->t.ndim = ndim;
    x->t.nelem = nelem;
    x->t.nbytes = nbytes;
    x->t.data = x->t.owned = p;
    sd->n++;
    return p;
}

static void sd_free(state_dict *sd)
{
    for (size_t i = 0; i < sd->n; i++) aft_tensor_free(&sd->e[i].t);
    free(sd->e);
}

/* uniform in (-bound, bound) */
static float uniform(uint64_t *rng, double bound)
{
    return (float)((2.0 * aft_rng_uniform(rng) - 1.0) * bound);
}

/* N(0, 1) by Box-Muller (one draw of two uniforms a value) */
static float normal(uint64_t *rng)
{
    double u1 = 1.0 - aft_rng_uniform(rng);   /* (0, 1]: log is finite */
    double u2 = aft_rng_uniform(rng);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
}

/* nn.Linear(in, out): weight (out, in) and bias (out), both uniform in
 * +-1/sqrt(in) (kaiming_uniform_ with a = sqrt(5), and the bias's rule) */
static aft_status add_linear(state_dict *sd, uint64_t *rng, const char *pre, size_t in, size_t out, aft_error *err)
{
    size_t ws[2] = {out, in}, bs[1] = {out};
    double bound = 1.0 / sqrt((double)in);
    float *w = sd_add(sd, AFT_F32, 2, ws, err, "%s.weight", pre);
    if (!w) return AFT_ERR_NOMEM;
    for (size_t i = 0; i < out * in; i++) w[i] = uniform(rng, bound);
    float *b = sd_add(sd, AFT_F32, 1, bs, err, "%s.bias", pre);
    if (!b) return AFT_ERR_NOMEM;
    for (size_t i = 0; i < out; i++) b[i] = uniform(rng, bound);
    return AFT_OK;
}

/* nn.LayerNorm([D]): weight ones, bias zeros */
static aft_status add_norm(state_dict *sd, const char *pre, size_t D, aft_error *err)
{
    float *w = sd_add(sd, AFT_F32, 1, &D, err, "%s.weight", pre);
    if (!w) return AFT_ERR_NOMEM;
    for (size_t i = 0; i < D; i++) w[i] = 1.0f;
    return sd_add(sd, AFT_F32, 1, &D, err, "%s.bias", pre) ? AFT_OK : AFT_ERR_NOMEM;
}

/* labml's get_positional_encoding in float32, as PyTorch computes it:
 * PE[p, 2i] = sin(p * exp(2i * -(ln 10000 / D))), PE[p, 2i+1] = cos(same) */
static void positional(float *pe, size_t P, size_t D)
{
    float scale = (float)-(log(10000.0) / (double)D);
    for (size_t i = 0; 2 * i < D; i++) {
        float div = expf((float)(2 * i) * scale);
        for (size_t p = 0; p < P; p++) {
            float a = (float)p * div;
            pe[p * D + 2 * i] = sinf(a);
            if (2 * i + 1 < D) pe[p * D + 2 * i + 1] = cosf(a);
        }
    }
}

/* layer 0's tensors, in the state dict's order: AFTLocal's own parameters
 * (pos_bias, local_mask) before its children (query, key, value, output),
 * then feed_forward, norm_self_attn, norm_ff */
static aft_status add_layer(state_dict *sd, uint64_t *rng, const aft_model_config *c, aft_error *err)
{
    size_t D = c->d_model, L = c->seq_len, sq[2] = {L, L};
    if (!sd_add(sd, AFT_F32, 2, sq, err, "encoder.layers.0.self_attn.pos_bias")) return AFT_ERR_NOMEM;
    unsigned char *mask = (unsigned char *)sd_add(sd, AFT_BOOL, 2, sq, err, "encoder.layers.0.self_attn.local_mask");
    if (!mask) return AFT_ERR_NOMEM;
    for (size_t t = 0; t < L; t++)
        for (size_t u = 0; u < L; u++) mask[t * L + u] = (t > u ? t - u : u - t) < c->window;
    static const char *const proj[] = {"query", "key", "value", "output"};
    char pre[96];
    aft_status st;
    for (size_t i = 0; i < 4; i++) {
        snprintf(pre, sizeof pre, "encoder.layers.0.self_attn.%s", proj[i]);
        if ((st = add_linear(sd, rng, pre, D, D, err))) return st;
    }
    if ((st = add_linear(sd, rng, "encoder.layers.0.feed_forward.layer1", D, c->d_ff, err))) return st;
    if ((st = add_linear(sd, rng, "encoder.layers.0.feed_forward.layer2", c->d_ff, D, err))) return st;
    if ((st = add_norm(sd, "encoder.layers.0.norm_self_attn", D, err))) return st;
    return add_norm(sd, "encoder.layers.0.norm_ff", D, err);
}

/* copies of layer 0's tensors (entries [first, first + n)) as layer l's */
static aft_status copy_layer(state_dict *sd, size_t first, size_t n, size_t l, aft_error *err)
{
    for (size_t i = first; i < first + n; i++) {
        /* name and shape copied out first: sd_add may move the entries */
        const sd_entry src = sd->e[i];
        const char *rest = src.name + strlen("encoder.layers.0");
        void *p = sd_add(sd, src.t.dtype, src.t.ndim, src.t.shape, err, "encoder.layers.%zu%s", l, rest);
        if (!p) return AFT_ERR_NOMEM;
        memcpy(p, src.t.data, src.t.nbytes);
    }
    return AFT_OK;
}

static aft_status check_config(const aft_model_config *c, aft_error *err)
{
    if (!c || !c->vocab) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) model configuration or vocabulary");
    if (!c->n_layers || !c->d_model || !c->d_ff || !c->window || !c->seq_len || !c->n_vocab)
        return aft_fail(err, AFT_ERR_ARG, "layers, d_model, d_ff, window, seq_len and the vocabulary must be at least 1");
    if (c->d_model > 65536 || c->d_ff > 1048576 || c->seq_len > 65536 || c->n_layers > 4096 || c->n_vocab > 1u << 24)
        return aft_fail(err, AFT_ERR_ARG, "the model is too large (d_model <= 65536, d_ff <= 1048576, seq_len <= "
                                          "65536, layers <= 4096, vocabulary <= 2^24)");
    return AFT_OK;
}

aft_status aft_train_fresh(void **buf, size_t *len, const aft_model_config *cfg, uint64_t seed, aft_error *err)
{
    aft_status st = check_config(cfg, err);
    if (st) return st;
    *buf = NULL;
    *len = 0;
    size_t D = cfg->d_model, V = cfg->n_vocab, P = cfg->positions ? cfg->positions : 5000;
    uint64_t rng = seed;
    state_dict sd = {0};
    char **names = NULL;
    aft_tensor *ts = NULL;
    char *hdr = NULL;
    /* the module tree in registration order; PyTorch draws the embedding
     * first, then the layer, then the generator (the encoder's norm has no
     * random values) */
    size_t pe_shape[3] = {P, 1, D}, emb_shape[2] = {V, D};
    float *pe = sd_add(&sd, AFT_F32, 3, pe_shape, err, "src_embed.positional_encodings");
    float *emb = pe ? sd_add(&sd, AFT_F32, 2, emb_shape, err, "src_embed.linear.weight") : NULL;
    if (!emb) { st = AFT_ERR_NOMEM; goto done; }
    positional(pe, P, D);
    for (size_t i = 0; i < V * D; i++) emb[i] = normal(&rng);
    size_t first = sd.n;
    if ((st = add_layer(&sd, &rng, cfg, err))) goto done;
    size_t per_layer = sd.n - first;
    for (size_t l = 1; l < cfg->n_layers; l++)
        if ((st = copy_layer(&sd, first, per_layer, l, err))) goto done;
    if ((st = add_norm(&sd, "encoder.norm", D, err))) goto done;
    if ((st = add_linear(&sd, &rng, "generator.projection", D, V, err))) goto done;

    names = malloc(sd.n * sizeof *names);
    ts = malloc(sd.n * sizeof *ts);
    if (!names || !ts) { st = aft_fail(err, AFT_ERR_NOMEM, "out of memory building the model"); goto done; }
    for (size_t i = 0; i < sd.n; i++) {
        names[i] = sd.e[i].name;
        ts[i] = sd.e[i].t;
    }
    char window[32];
    snprintf(window, sizeof window, "%zu", cfg->window);
    const char *meta[] = {"format", "pt", "vocab", cfg->vocab, "window", window};
    size_t hlen;
    if ((st = aft_st_header((const char *const *)names, ts, sd.n, meta, 3, &hdr, &hlen, err))) goto done;
    size_t total = 8 + hlen;
    for (size_t i = 0; i < sd.n; i++)
        if (__builtin_add_overflow(total, ts[i].nbytes, &total)) {
            st = aft_fail(err, AFT_ERR_ARG, "the model is too large");
            goto done;
        }
    unsigned char *out = malloc(total);
    if (!out) { st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for the model (%zu bytes)", total); goto done; }
    uint64_t h = hlen;
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(h >> (8 * i));
    memcpy(out + 8, hdr, hlen);
    size_t off = 8 + hlen;
    for (size_t i = 0; i < sd.n; i++) {
        memcpy(out + off, ts[i].data, ts[i].nbytes);
        off += ts[i].nbytes;
    }
    *buf = out;
    *len = total;
done:
    free(hdr);
    free(names);
    free(ts);
    sd_free(&sd);
    return st;
}

/* ---------------------------------------------------------------- the vocabulary */

aft_status aft_train_vocab(char **json, size_t *n, const char *text, size_t len, aft_error *err)
{
    *json = NULL;
    *n = 0;
    if (len == 0) return aft_fail(err, AFT_ERR_FORMAT, "the text is empty");
    /* a bitmap of the code points seen (0x110000 bits: 136 KiB) */
    unsigned char *seen = calloc(0x110000 / 8, 1);
    if (!seen) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    size_t count = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = aft_utf8_char((const unsigned char *)text + i, len - i, &cp);
        if (k == 0 || cp == 0) {
            free(seen);
            return aft_fail(err, AFT_ERR_FORMAT, "not UTF-8 text: %s at byte %zu",
                            k == 0 ? "a byte that starts no UTF-8 character" : "a NUL byte", i);
        }
        if (!(seen[cp >> 3] & (1u << (cp & 7)))) {
            seen[cp >> 3] |= (unsigned char)(1u << (cp & 7));
            count++;
        }
        i += k;
    }
    uint32_t *cps = malloc(count * sizeof *cps);
    cJSON *arr = cJSON_CreateArray();
    aft_status st = AFT_OK;
    if (!cps || !arr) { st = aft_fail(err, AFT_ERR_NOMEM, "out of memory"); goto done; }
    size_t k = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        if (seen[cp >> 3] & (1u << (cp & 7))) cps[k++] = cp;   /* in code-point order, as Python sorts */
    for (size_t i = 0; i < count; i++) {
        char s[5];
        uint32_t c = cps[i];
        size_t m = 0;
        if (c < 0x80) s[m++] = (char)c;
        else if (c < 0x800) { s[m++] = (char)(0xC0 | (c >> 6)); s[m++] = (char)(0x80 | (c & 0x3F)); }
        else if (c < 0x10000) {
            s[m++] = (char)(0xE0 | (c >> 12)); s[m++] = (char)(0x80 | ((c >> 6) & 0x3F)); s[m++] = (char)(0x80 | (c & 0x3F));
        } else {
            s[m++] = (char)(0xF0 | (c >> 18)); s[m++] = (char)(0x80 | ((c >> 12) & 0x3F));
            s[m++] = (char)(0x80 | ((c >> 6) & 0x3F)); s[m++] = (char)(0x80 | (c & 0x3F));
        }
        s[m] = 0;
        cJSON *item = cJSON_CreateString(s);
        if (!item || !cJSON_AddItemToArray(arr, item)) {
            cJSON_Delete(item);
            st = aft_fail(err, AFT_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    *json = cJSON_PrintUnformatted(arr);
    if (!*json) { st = aft_fail(err, AFT_ERR_NOMEM, "out of memory"); goto done; }
    *n = count;
done:
    cJSON_Delete(arr);
    free(cps);
    free(seen);
    return st;
}

/* ---------------------------------------------------------------- schedule, clipping, Adam */

double aft_schedule_lr(const aft_schedule *s, size_t step)
{
    if (step < s->warmup) return s->lr * (double)(step + 1) / (double)s->warmup;
    size_t span = s->steps > s->warmup ? s->steps - s->warmup : 1;
    double f = (double)(step - s->warmup) / (double)span;
    return s->lr * (0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * f)));
}

double aft_clip_grad_norm(float *const *g, const size_t *len, size_t n, double max_norm)
{
    /* torch: the norm of the per-tensor norms, in float32; summed here in
     * double (closer, and the same to float32's rounding at these sizes) */
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        double s = 0.0;
        for (size_t j = 0; j < len[i]; j++) s += (double)g[i][j] * g[i][j];
        float ni = (float)sqrt(s);
        total += (double)ni * ni;
    }
    float norm = (float)sqrt(total);
    if (!isfinite(norm)) return norm;
    float coef = (float)max_norm / (norm + 1e-6f);
    if (coef > 1.0f) coef = 1.0f;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < len[i]; j++) g[i][j] *= coef;
    return norm;
}

struct aft_adam {
    size_t n;
    size_t *len;
    float **m, **v;
    double beta1, beta2, eps;
    uint64_t t;
};

void aft_adam_free(aft_adam *a)
{
    if (!a) return;
    for (size_t i = 0; a->m && i < a->n; i++) {
        free(a->m[i]);
        free(a->v[i]);
    }
    free(a->m);
    free(a->v);
    free(a->len);
    free(a);
}

aft_status aft_adam_new(aft_adam **out, const size_t *len, size_t n, double beta1, double beta2, double eps,
                        aft_error *err)
{
    *out = NULL;
    aft_adam *a = calloc(1, sizeof *a);
    if (!a) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Adam's moments");
    a->n = n;
    a->beta1 = beta1;
    a->beta2 = beta2;
    a->eps = eps;
    a->len = malloc((n ? n : 1) * sizeof *a->len);
    a->m = calloc(n ? n : 1, sizeof *a->m);
    a->v = calloc(n ? n : 1, sizeof *a->v);
    if (!a->len || !a->m || !a->v) goto oom;
    for (size_t i = 0; i < n; i++) {
        a->len[i] = len[i];
        a->m[i] = calloc(len[i] ? len[i] : 1, sizeof(float));
        a->v[i] = calloc(len[i] ? len[i] : 1, sizeof(float));
        if (!a->m[i] || !a->v[i]) goto oom;
    }
    *out = a;
    return AFT_OK;
oom:
    aft_adam_free(a);
    return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Adam's moments");
}

void aft_adam_step(aft_adam *a, float *const *p, const float *const *g, const double *lr)
{
    a->t++;
    /* torch's _single_tensor_adam: the scalars in double, cast to float
     * where they meet the tensors */
    double bc1 = 1.0 - pow(a->beta1, (double)a->t);
    double bc2_sqrt = sqrt(1.0 - pow(a->beta2, (double)a->t));
    float b1 = (float)a->beta1, c1 = (float)(1.0 - a->beta1);
    float b2 = (float)a->beta2, c2 = (float)(1.0 - a->beta2);
    float bc2s = (float)bc2_sqrt, eps = (float)a->eps;
    for (size_t i = 0; i < a->n; i++) {
        float step = (float)(lr[i] / bc1);
        float *m = a->m[i], *v = a->v[i], *pi = p[i];
        const float *gi = g[i];
        #pragma omp parallel for schedule(static) if (a->len[i] > 65536)
        for (size_t j = 0; j < a->len[i]; j++) {
            m[j] = m[j] * b1 + c1 * gi[j];
            v[j] = v[j] * b2 + c2 * (gi[j] * gi[j]);
            float denom = sqrtf(v[j]) / bc2s + eps;
            pi[j] -= step * (m[j] / denom);
        }
    }
}

float *aft_adam_moment(aft_adam *a, size_t i, int which)
{
    if (!a || i >= a->n) return NULL;
    return which ? a->v[i] : a->m[i];
}

uint64_t aft_adam_steps(const aft_adam *a)
{
    return a->t;
}

void aft_adam_set_steps(aft_adam *a, uint64_t t)
{
    a->t = t;
}

/* ---------------------------------------------------------------- the checkpoint */

aft_status aft_train_save(const char *path, const aft_st_file *src, aft_model *m, const char *const *extra_names,
                          const aft_tensor *extra, size_t n_extra, const char *const *meta, size_t nmeta,
                          aft_error *err)
{
    size_t np = aft_model_param_count(m), total;
    if (__builtin_add_overflow(np, n_extra, &total)) return aft_fail(err, AFT_ERR_ARG, "too many tensors");
    const char **names = malloc((total ? total : 1) * sizeof *names);
    aft_tensor *ts = calloc(total ? total : 1, sizeof *ts);
    aft_status st = AFT_OK;
    if (!names || !ts) { st = aft_fail(err, AFT_ERR_NOMEM, "out of memory saving the model"); goto done; }
    /* the state dict, in the model's (labml's) order */
    for (size_t k = 0; k < np; k++) {
        size_t ndim, shape[4];
        if ((st = aft_model_param_info(m, k, &names[k], &ndim, shape, err))) goto done;
        const aft_tensor *s = src ? aft_st_find(src, names[k]) : NULL;
        aft_tensor *t = &ts[k];
        t->ndim = ndim;
        t->nelem = 1;
        for (size_t d = 0; d < ndim; d++) t->nelem *= (t->shape[d] = shape[d]);
        if (!aft_model_param_trainable(m, k) && s && s->nelem == t->nelem) {
            *t = *s;   /* a buffer as the checkpoint had it (local_mask BOOL) */
            t->owned = NULL;
            continue;
        }
        t->dtype = AFT_F32;
        t->nbytes = t->nelem * sizeof(float);
        t->data = aft_model_param_data(m, k);
        if (!t->data) {
            st = aft_fail(err, AFT_ERR_ARG, "parameter '%s' has no values to save", names[k]);
            goto done;
        }
    }
    for (size_t i = 0; i < n_extra; i++) {
        names[np + i] = extra_names[i];
        ts[np + i] = extra[i];
        ts[np + i].owned = NULL;
    }
    st = aft_st_write(path, names, ts, total, meta, nmeta, err);
done:
    free(names);
    free(ts);
    return st;
}
