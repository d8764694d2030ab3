/* model.c - labml's autoregressive AFT transformer: the checkpoint's tensors
 * found and checked by name (the rules are in aft.h, "the model"), the
 * one-pass forward, the model as an RNN over one streaming state per layer,
 * and generation.
 *
 * The pieces live beside it: the AFT layer and its state (layer.c,
 * state.c), LayerNorm (norm.c), the feed-forward network (ffn.c), the
 * embedding (embed.c), the vocabulary (vocab.c), sampling (sample.c). */
#include "carry.h"
#include "layer.h"   /* aft_layer_forward_counted */
#include "model_priv.h"
#include "nn/bf16.h"
#include "nn/nn.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- loading */

/* "[a, b]"; SIZE_MAX (any size) as "*" */
static void fmt_shape(char *buf, size_t cap, const size_t *shape, size_t ndim)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < ndim && used < cap; i++)
        used += shape[i] == SIZE_MAX ? (size_t)snprintf(buf + used, cap - used, "%s*", i ? ", " : "")
                                     : (size_t)snprintf(buf + used, cap - used, "%s%zu", i ? ", " : "", shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static aft_status own(aft_model *m, float *p, aft_error *err)
{
    if (m->nowned == m->capowned) {
        size_t cap = m->capowned ? 2 * m->capowned : 64;
        float **o = realloc(m->owned, cap * sizeof *o);
        if (!o) {
            free(p);
            return aft_fail(err, AFT_ERR_NOMEM, "out of memory loading the model");
        }
        m->owned = o;
        m->capowned = cap;
    }
    m->owned[m->nowned++] = p;
    return AFT_OK;
}

/* tensor `name` of f, if there is one, is read by the model */
static void mark(aft_model *m, const aft_st_file *f, const char *name)
{
    size_t i = aft_st_index(f, name);
    if (i != SIZE_MAX) m->used[i] = 1;
}

/* Tensor `name` as float32 (owned by m), or, with dt (a product's or the
 * embedding's weights), an f16 or bf16 one as stored (*dt its dtype;
 * else AFT_F32). shape: ndim sizes, SIZE_MAX for "any" (the found size is
 * written back); what: its role, for messages. Absent and not required:
 * *out = NULL. */
static aft_status get_dt(aft_model *m, const aft_st_file *f, const char *name, int required, size_t ndim,
                         size_t *shape, const char *what, const void **out, aft_dtype *dt, aft_error *err)
{
    *out = NULL;
    if (dt) *dt = AFT_F32;
    const aft_tensor *t = aft_st_find(f, name);
    if (!t) return required ? aft_fail(err, AFT_ERR_FORMAT, "missing tensor '%s' (%s)", name, what) : AFT_OK;
    mark(m, f, name);
    int ok = t->ndim == ndim;
    for (size_t i = 0; ok && i < ndim; i++) ok = shape[i] == SIZE_MAX || shape[i] == t->shape[i];
    if (!ok) {
        char want[96], have[96];
        fmt_shape(want, sizeof want, shape, ndim);
        fmt_shape(have, sizeof have, t->shape, t->ndim < 8 ? t->ndim : 8);
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' (%s) is %s but must be %s", name, what, have, want);
    }
    for (size_t i = 0; i < ndim; i++) shape[i] = t->shape[i];
    if (!aft_dtype_is_float(t->dtype))
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' has dtype %s; weights must be F64, F32, F16 or BF16", name,
                        aft_dtype_name(t->dtype));
    void *p;
    aft_status st;
    if (dt && aft_dtype_is16(t->dtype)) {
        st = aft_tensor_copy(t, &p, err);
        *dt = t->dtype;
    } else {
        float *pf = NULL;
        st = aft_tensor_to_f32(t, &pf, err);
        p = pf;
    }
    if (st || (st = own(m, p, err))) return st;
    *out = p;
    return AFT_OK;
}

static aft_status get(aft_model *m, const aft_st_file *f, const char *name, int required, size_t ndim,
                      size_t *shape, const char *what, const float **out, aft_error *err)
{
    const void *p;
    aft_status st = get_dt(m, f, name, required, ndim, shape, what, &p, NULL, err);
    *out = p;
    return st;
}

/* a positive whole number up to INT_MAX */
static int parse_count(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9') return 0;
    size_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (size_t)INT_MAX / 10) return 0;
        v = v * 10 + (size_t)(*s - '0');
    }
    if (v == 0 || v > INT_MAX) return 0;
    *out = v;
    return 1;
}

/* the number of layers: 1 + the largest N of the names "encoder.layers.N.*" */
static aft_status count_layers(const aft_st_file *f, size_t *n, aft_error *err)
{
    const size_t plen = strlen(LAYERS_PREFIX);
    *n = 0;
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *name;
        aft_st_get(f, i, &name);
        if (strncmp(name, LAYERS_PREFIX, plen) != 0) continue;
        const char *p = name + plen;
        size_t v = 0, digits = 0;
        for (; *p >= '0' && *p <= '9' && digits < 8; p++, digits++) v = v * 10 + (size_t)(*p - '0');
        char shown[100];
        if (digits == 0 || *p != '.' || (digits > 1 && name[plen] == '0')) {
            aft_show_text(shown, sizeof shown, name);
            return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': no layer number after '" LAYERS_PREFIX "'", shown);
        }
        if (v >= MAX_LAYERS) {
            aft_show_text(shown, sizeof shown, name);
            return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': layer %zu; aft reads at most %d layers", shown, v,
                            MAX_LAYERS);
        }
        if (v + 1 > *n) *n = v + 1;
    }
    if (*n == 0)
        return aft_fail(err, AFT_ERR_FORMAT, "no layers: no tensor is named '" LAYERS_PREFIX "0.*' (labml's Encoder)");
    return AFT_OK;
}

/* The window of the band a local_mask holds below its diagonal (t' <= t,
 * the part a causal model reads): mask[t][t'] set exactly where t - t' < S.
 * S = Tm when it is set everywhere there. */
static aft_status mask_band(const aft_st_file *f, const char *name, size_t tmax, size_t *S, aft_error *err)
{
    const aft_tensor *t = aft_st_find(f, name);
    if (t->ndim != 2 || t->shape[0] != tmax || t->shape[1] != tmax) {
        char have[96];
        fmt_shape(have, sizeof have, t->shape, t->ndim < 8 ? t->ndim : 8);
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' is %s but the position bias covers [%zu, %zu]", name, have,
                        tmax, tmax);
    }
    float *v;
    aft_status st = aft_tensor_to_f32(t, &v, err);
    if (st) return st;
    size_t s = 0;
    for (size_t j = 0; j < tmax && v[(tmax - 1) * tmax + (tmax - 1 - j)] != 0.0f; j++) s++;
    for (size_t r = 0; r < tmax && !st; r++)
        for (size_t c = 0; c <= r; c++)
            if ((v[r * tmax + c] != 0.0f) != (r - c < s)) {
                st = aft_fail(err, AFT_ERR_FORMAT, "'%s' is not a band |t - t'| < S below its diagonal (entry "
                              "[%zu, %zu] breaks the band of S = %zu its last row holds)", name, r, c, s);
                break;
            }
    free(v);
    *S = s;
    return st;
}

static int has_prefix(const aft_st_file *f, const char *prefix)
{
    size_t n = strlen(prefix);
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *name;
        aft_st_get(f, i, &name);
        if (strncmp(name, prefix, n) == 0) return 1;
    }
    return 0;
}

/* the variant of a layer's self_attn from the tensors it has (aft.h) */
static aft_variant detect_variant(const aft_st_file *f, const char *pre, int window_known, char *mask_name,
                                  size_t cap)
{
    char n[160];
    snprintf(mask_name, cap, "%slocal_mask", pre);
    int has_mask = aft_st_find(f, mask_name) != NULL;
    if (!has_mask) mask_name[0] = 0;
    snprintf(n, sizeof n, "%spos_bias_u", pre);
    const aft_tensor *u = aft_st_find(f, n);
    snprintf(n, sizeof n, "%spos_bias_v", pre);
    if (u || aft_st_find(f, n)) return has_mask || window_known ? AFT_LOCAL : AFT_FULL;
    snprintf(n, sizeof n, "%spos_bias", pre);
    const aft_tensor *b = aft_st_find(f, n);
    if (!b) {
        snprintf(n, sizeof n, "%swbias", pre);
        b = aft_st_find(f, n);
    }
    if (!b) return AFT_SIMPLE;
    if (b->ndim == 2 && b->shape[0] == b->shape[1]) return has_mask || window_known ? AFT_LOCAL : AFT_FULL;
    if ((b->ndim == 1 || b->ndim == 2) && b->shape[b->ndim - 1] % 2 == 1) return AFT_CONV;
    return AFT_FULL;   /* aft_weights_load names what is wrong with it */
}

/* "window" from the options, else the metadata: 0 when neither has one */
static aft_status known_window(const aft_st_file *f, const aft_model_options *opt, size_t *w, const char **from,
                               aft_error *err)
{
    *w = 0;
    *from = NULL;
    if (opt && opt->window) {
        *w = opt->window;
        *from = "the window asked for";
        return AFT_OK;
    }
    const char *mv = aft_st_metadata_find(f, "window");
    if (!mv) return AFT_OK;
    if (!parse_count(mv, w)) {
        char shown[48];
        aft_show_text(shown, sizeof shown, mv);
        return aft_fail(err, AFT_ERR_FORMAT, "metadata 'window' = '%s' is not a whole number from 1 to %d", shown,
                        INT_MAX);
    }
    *from = "metadata 'window'";
    return AFT_OK;
}

/* layer i's self_attn: its variant, weights, window and configuration */
static aft_status load_self_attn(aft_model *m, const aft_st_file *f, size_t i, size_t window, const char *wfrom,
                                 int asked, aft_error *err)
{
    mlayer *L = &m->layers[i];
    const size_t D = m->info.d_model;
    char pre[96], mask_name[160];
    snprintf(pre, sizeof pre, "%sself_attn.", L->prefix);
    aft_variant var = detect_variant(f, pre, window != 0, mask_name, sizeof mask_name);
    if (i > 0 && var != m->info.variant) {
        static const char *const why[] = {
            [AFT_FULL] = "a square pos_bias and no local_mask or window: full",
            [AFT_LOCAL] = "a pos_bias with a local_mask or a window: local",
            [AFT_SIMPLE] = "no pos_bias: simple",
            [AFT_CONV] = "a pos_bias of odd length: conv"};
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' has %s, but layer 0's self_attn is %s: every layer must be the "
                        "same variant", pre, why[var], aft_variant_name(m->info.variant));
    }
    aft_status st = aft_weights_load(f, pre, var, &L->attn, err);
    if (st) return st;
    for (size_t k = 0; k < sizeof L->attn.names / sizeof L->attn.names[0]; k++)
        if (L->attn.names[k][0]) mark(m, f, L->attn.names[k]);
    const aft_params *p = &L->attn.p;
    if (p->d_model != D)
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' takes inputs of size %zu but the model's size is %zu (from the "
                        "embedding)", L->attn.names[0], p->d_model, D);
    L->cfg = (aft_config){.variant = var, .causal = 1, .threads = m->threads, .impl = AFT_IMPL_FAST,
                          .precision = m->precision};
    /* the positions the bias covers: a learned bias's Tmax (SIZE_MAX: any),
     * and so its rows (0: none) */
    size_t reach = aft_bias_reach(&p->bias, var), tmax = reach == SIZE_MAX ? 0 : reach;
    if ((var == AFT_LOCAL || var == AFT_FULL) && tmax == 0)
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' covers no positions", L->attn.names[4]);
    if (var == AFT_LOCAL) {
        size_t S = window;
        if (mask_name[0]) {
            size_t band = 0;
            if ((st = mask_band(f, mask_name, tmax, &band, err))) return st;
            mark(m, f, mask_name);
            /* windows from Tmax up all read the same band */
            if (window && aft_window_in(window, tmax) != band)
                return aft_fail(err, AFT_ERR_FORMAT, "window %zu (%s) disagrees with '%s', a band of %zu%s", window,
                                wfrom, mask_name, band, band == tmax ? " or more" : "");
            if (!window) S = band;
        }
        L->cfg.window = S;
    } else if (var == AFT_CONV) {
        L->cfg.window = window ? window : AFT_WINDOW_FROM_BIAS;
    } else if (asked) {   /* a window in the metadata of a simple model means nothing */
        return aft_fail(err, AFT_ERR_ARG, "a window applies to local and conv layers; '%s' has the %s variant",
                        pre, aft_variant_name(var));
    }
    aft_config settled = L->cfg;
    aft_error e2;
    if ((st = aft_config_settle(&settled, &p->bias, p->d_hidden, p->k_out ? p->k_out : p->d_hidden, &e2)))
        return aft_fail(err, st, "layer %zu's self_attn: %s", i, e2.msg);
    if (i == 0) {
        m->info.variant = var;
        m->info.window = var == AFT_LOCAL || var == AFT_CONV ? settled.window : 0;
        m->info.d_hidden = p->d_hidden;
        m->info.key_channels = p->k_out ? p->k_out : p->d_hidden;
        m->info.bias_rows = tmax;
    } else if (p->d_hidden != m->info.d_hidden || (var != AFT_SIMPLE && settled.window != m->info.window &&
                                                   (var == AFT_LOCAL || var == AFT_CONV))) {
        return aft_fail(err, AFT_ERR_FORMAT, "layer %zu's self_attn (hidden size %zu, window %zu) differs from "
                        "layer 0's (%zu, %zu)", i, p->d_hidden, settled.window, m->info.d_hidden, m->info.window);
    }
    if (reach < m->info.context) {
        m->info.context = reach;
        snprintf(m->context_from, sizeof m->context_from, "%s", L->attn.names[4]);
    }
    return AFT_OK;
}

/* layer i's LayerNorms and feed-forward network */
static aft_status load_norms_ffn(aft_model *m, const aft_st_file *f, size_t i, aft_error *err)
{
    mlayer *L = &m->layers[i];
    const size_t D = m->info.d_model;
    char name[160];
    aft_status st;
    size_t sd[1] = {D};
    const struct { const char *stem; const float **w, **b; } norms[2] = {
        {"norm_self_attn", &L->ln1_w, &L->ln1_b}, {"norm_ff", &L->ln2_w, &L->ln2_b}};
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s%s.weight", L->prefix, norms[k].stem);
        if ((st = get(m, f, name, 1, 1, sd, "a LayerNorm's weight (d_model)", norms[k].w, err))) return st;
        snprintf(name, sizeof name, "%s%s.bias", L->prefix, norms[k].stem);
        if ((st = get(m, f, name, 0, 1, sd, "a LayerNorm's bias (d_model)", norms[k].b, err))) return st;
    }
    size_t s1[2] = {SIZE_MAX, D};
    snprintf(name, sizeof name, "%sfeed_forward.layer1.weight", L->prefix);
    aft_dtype dt1, dt2;
    if ((st = get_dt(m, f, name, 1, 2, s1, "the FFN's first layer (d_ff, d_model)", &L->ffp.w1, &dt1, err)))
        return st;
    size_t F = s1[0], sf[1] = {F}, s2[2] = {D, F};
    if (F == 0) return aft_fail(err, AFT_ERR_FORMAT, "'%s' has no rows", name);
    snprintf(name, sizeof name, "%sfeed_forward.layer1.bias", L->prefix);
    if ((st = get(m, f, name, 0, 1, sf, "the FFN's first bias (d_ff)", &L->ffp.b1, err))) return st;
    snprintf(name, sizeof name, "%sfeed_forward.layer2.weight", L->prefix);
    if ((st = get_dt(m, f, name, 1, 2, s2, "the FFN's second layer (d_model, d_ff)", &L->ffp.w2, &dt2, err)))
        return st;
    snprintf(name, sizeof name, "%sfeed_forward.layer2.bias", L->prefix);
    if ((st = get(m, f, name, 0, 1, sd, "the FFN's second bias (d_model)", &L->ffp.b2, err))) return st;
    if (i == 0) m->info.d_ff = F;
    else if (F != m->info.d_ff)
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' has d_ff %zu but layer 0's has %zu", name, F, m->info.d_ff);
    L->ffp.d_model = D;
    L->ffp.d_ff = F;
    L->ffp.wdt = dt1;
    if (dt1 != dt2) {   /* two dtypes: both float32 */
        const void *ws[2] = {L->ffp.w1, L->ffp.w2};
        const aft_dtype dts[2] = {dt1, dt2};
        const size_t ns[2] = {F * D, D * F};
        for (int k = 0; k < 2; k++) {
            if (dts[k] == AFT_F32) continue;
            float *wide = aft_w_widen(ws[k], dts[k], ns[k]);
            if (!wide || (st = own(m, wide, err)))
                return wide ? st : aft_fail(err, AFT_ERR_NOMEM, "out of memory loading the model");
            if (k == 0) L->ffp.w1 = wide;
            else L->ffp.w2 = wide;
        }
        L->ffp.wdt = AFT_F32;
    }
    if ((st = aft_ffn_init(&L->ffn, &L->ffp, AFT_KERNEL_AUTO, m->precision, m->threads, err))) return st;
    L->ffn_ready = 1;
    return AFT_OK;
}

static aft_status load_layer(aft_model *m, const aft_st_file *f, size_t i, size_t window, const char *wfrom,
                             int asked, aft_error *err)
{
    mlayer *L = &m->layers[i];
    snprintf(L->prefix, sizeof L->prefix, LAYERS_PREFIX "%zu.", i);
    if (!has_prefix(f, L->prefix))
        return aft_fail(err, AFT_ERR_FORMAT, "layer %zu of %zu is missing: no tensor is named '%s*'", i,
                        m->info.n_layers, L->prefix);
    aft_status st = load_self_attn(m, f, i, window, wfrom, asked, err);
    return st ? st : load_norms_ffn(m, f, i, err);
}

/* Every layer reads the same tensors, in the same shapes: one that a layer
 * reads, every layer has. An optional tensor (a bias, local_mask) may be
 * absent from every layer, not from some: a file where it is is missing one,
 * as PyTorch's load_state_dict would say. Layer 0 stands for them all: each
 * tensor it reads is looked for in every other layer, and each tensor
 * another layer reads in layer 0. */
static aft_status check_peers(const aft_model *m, const aft_st_file *f, aft_error *err)
{
    const size_t plen = strlen(LAYERS_PREFIX);
    char name[224], have[96], want[96];
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *tn;
        const aft_tensor *t = aft_st_get(f, i, &tn);
        if (!m->used[i] || strncmp(tn, LAYERS_PREFIX, plen) != 0) continue;
        /* "N.rest", N checked by count_layers */
        size_t j = 0;
        const char *rest = tn + plen;
        for (; *rest >= '0' && *rest <= '9'; rest++) j = j * 10 + (size_t)(*rest - '0');
        rest++;
        if (j != 0) {
            snprintf(name, sizeof name, LAYERS_PREFIX "0.%s", rest);
            if (!aft_st_find(f, name))
                return aft_fail(err, AFT_ERR_FORMAT, "missing tensor '%s', which layer %zu has", name, j);
            continue;
        }
        for (size_t l = 1; l < m->info.n_layers; l++) {
            snprintf(name, sizeof name, LAYERS_PREFIX "%zu.%s", l, rest);
            const aft_tensor *u = aft_st_find(f, name);
            if (!u) return aft_fail(err, AFT_ERR_FORMAT, "missing tensor '%s', which layer 0 has", name);
            int same = u->ndim == t->ndim;
            for (size_t d = 0; same && d < t->ndim; d++) same = u->shape[d] == t->shape[d];
            if (!same) {
                fmt_shape(have, sizeof have, u->shape, u->ndim < 8 ? u->ndim : 8);
                fmt_shape(want, sizeof want, t->shape, t->ndim < 8 ? t->ndim : 8);
                return aft_fail(err, AFT_ERR_FORMAT, "'%s' is %s but layer 0's is %s", name, have, want);
            }
        }
    }
    return AFT_OK;
}

/* the tensors of f that the model did not read: how many, and the first */
static void note_unused(aft_model *m, const aft_st_file *f)
{
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *name;
        aft_st_get(f, i, &name);
        if (m->used[i]) continue;
        if (m->info.n_unused++ == 0) aft_shown(name, m->unused, sizeof m->unused - 4);
    }
    m->info.unused = m->info.n_unused ? m->unused : NULL;
}

void aft_model_free(aft_model *m)
{
    if (!m) return;
    aft_model_train_free(m);
    for (size_t i = 0; m->layers && i < m->info.n_layers; i++) {
        if (m->layers[i].ffn_ready) aft_ffn_free(&m->layers[i].ffn);
        aft_weights_free(&m->layers[i].attn);
    }
    free(m->layers);
    if (m->gen_ready) aft_linear_free(&m->gen);
    aft_vocab_free(&m->vocab);
    for (size_t i = 0; i < m->nowned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->used);
    free(m);
}

/* src_embed: labml's embedding with positional encodings, or without */
static aft_status load_embedding(aft_model *m, const aft_st_file *f, aft_error *err)
{
    size_t se[2] = {SIZE_MAX, SIZE_MAX};
    aft_status st;
    const char *tname = "src_embed.linear.weight";
    int positional = aft_st_find(f, tname) != NULL;
    if (!positional && !aft_st_find(f, "src_embed.weight"))
        return aft_fail(err, AFT_ERR_FORMAT, "missing tensor 'src_embed.linear.weight' (the token embedding, with "
                        "'src_embed.positional_encodings'; or 'src_embed.weight' for one without positions)");
    if (!positional) tname = "src_embed.weight";
    if ((st = get_dt(m, f, tname, 1, 2, se, "the token embedding (n_vocab, d_model)", &m->emb.table, &m->emb.tdt,
                     err)))
        return st;
    size_t V = se[0], D = se[1];
    if (V == 0 || D == 0 || V > INT32_MAX || D > INT_MAX)
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' is [%zu, %zu]: the vocabulary and d_model must be from 1 to %d",
                        tname, V, D, INT_MAX);
    m->info.n_vocab = m->emb.V = V;
    m->info.d_model = m->emb.D = D;
    m->emb.scale = 1.0f;
    m->info.context = SIZE_MAX;
    if (!positional) return AFT_OK;
    /* labml scales the embedding by sqrt(d_model) (math.sqrt, then float) */
    m->emb.scale = (float)sqrt((double)D);
    const char *pname = "src_embed.positional_encodings";
    const aft_tensor *t = aft_st_find(f, pname);
    size_t sp[3] = {SIZE_MAX, 1, D}, sp2[2] = {SIZE_MAX, D};
    int two = t && t->ndim == 2;
    st = two ? get(m, f, pname, 1, 2, sp2, "the positional encodings (max_len, d_model)", &m->emb.pe, err)
             : get(m, f, pname, 1, 3, sp, "the positional encodings (max_len, 1, d_model)", &m->emb.pe, err);
    if (st) return st;
    m->emb.P = two ? sp2[0] : sp[0];
    if (m->emb.P == 0) return aft_fail(err, AFT_ERR_FORMAT, "'%s' has no rows: no position can be encoded", pname);
    m->info.positions = m->emb.P;
    m->info.context = m->emb.P;
    snprintf(m->context_from, sizeof m->context_from, "%s", pname);
    return AFT_OK;
}

/* encoder.norm and generator.projection */
static aft_status load_head(aft_model *m, const aft_st_file *f, aft_error *err)
{
    const size_t D = m->info.d_model, V = m->info.n_vocab;
    size_t sd[1] = {D}, sg[2] = {V, D}, sv[1] = {V};
    aft_status st;
    if ((st = get(m, f, "encoder.norm.weight", 1, 1, sd, "the final LayerNorm's weight (d_model)", &m->norm_w, err)) ||
        (st = get(m, f, "encoder.norm.bias", 0, 1, sd, "the final LayerNorm's bias (d_model)", &m->norm_b, err)) ||
        (st = get_dt(m, f, "generator.projection.weight", 1, 2, sg, "the logits' projection (n_vocab, d_model)",
                     &m->gen_w, &m->gen_dt, err)) ||
        (st = get(m, f, "generator.projection.bias", 0, 1, sv, "the logits' bias (n_vocab)", &m->gen_b, err)))
        return st;
    if (aft_bf16_wanted(m->precision))
        st = aft_linear_init_bf16(&m->gen, m->gen_w, m->gen_dt, m->gen_b, V, D, m->threads, err);
    else
        st = aft_linear_init_dt(&m->gen, m->gen_w, m->gen_dt, m->gen_b, V, D, AFT_KERNEL_AUTO, m->threads, err);
    if (st) return st;
    m->gen_ready = 1;
    return AFT_OK;
}

/* the dtype every product holds its weights in (16 bits kept, or bf16
 * products), or AFT_F32 when any is float32 (aft_model_info.weights_dtype) */
static aft_dtype held_dtype(const aft_model *m)
{
    aft_dtype dt = aft_linear_dtype(&m->gen);
    int same = aft_dtype_is16(dt);
    for (size_t i = 0; same && i < m->info.n_layers; i++) {
        const mlayer *L = &m->layers[i];
        /* the attention's products are packed as the FFN's are */
        same = aft_linear_dtype(&L->ffn.l1) == dt && aft_linear_dtype(&L->ffn.l2) == dt &&
               L->attn.p.w_dtype == L->ffp.wdt;
    }
    return same ? dt : AFT_F32;
}

aft_status aft_model_load(aft_model **out, const aft_st_file *f, const aft_model_options *opt, aft_error *err)
{
    *out = NULL;
    aft_model *m = calloc(1, sizeof *m);
    if (!m) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for a model");
    m->impl = opt ? opt->impl : AFT_IMPL_FAST;
    m->threads = aft_threads_or_all(opt ? opt->threads : 0);
    m->precision = opt ? opt->precision : AFT_PRECISION_F32;
    size_t n, window;
    const char *wfrom;
    aft_status st = AFT_OK;
    if ((unsigned)m->precision > AFT_PRECISION_BF16)
        st = aft_fail(err, AFT_ERR_ARG, "unknown precision %d", (int)m->precision);
    else if (!(m->used = calloc(aft_st_count(f) + 1, 1)))
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a model");
    if (!st) st = load_embedding(m, f, err);
    if (!st) st = count_layers(f, &n, err);
    if (!st) st = known_window(f, opt, &window, &wfrom, err);
    if (!st && !(m->layers = calloc(n, sizeof *m->layers)))
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu layers", n);
    if (!st) m->info.n_layers = n;
    for (size_t i = 0; !st && i < n; i++) st = load_layer(m, f, i, window, wfrom, opt && opt->window, err);
    if (!st) st = load_head(m, f, err);
    /* the caller's vocabulary stands in for the metadata's */
    const char *voc = opt && opt->vocab ? opt->vocab : aft_st_metadata_find(f, "vocab");
    if (!st && voc) {
        st = aft_vocab_parse(&m->vocab, voc, opt && opt->vocab ? "the vocabulary" : "metadata 'vocab'",
                             m->info.n_vocab, err);
        m->info.has_vocab = st == AFT_OK;
    }
    if (!st) st = check_peers(m, f, err);
    if (!st) st = aft_model_train_prepare(m, err);
    if (st) {
        aft_model_free(m);
        return st;
    }
    note_unused(m, f);
    m->info.weights_dtype = held_dtype(m);
    free(m->used);
    m->used = NULL;
    m->info.keep = m->info.context == SIZE_MAX ? SIZE_MAX : m->info.context / 2;
    m->info.context_from = m->context_from[0] ? m->context_from : NULL;
    *out = m;
    return AFT_OK;
}

aft_status aft_model_open(aft_model **out, const char *path, const aft_model_options *opt, aft_error *err)
{
    *out = NULL;
    aft_st_file *f;
    aft_status st = aft_st_open(path, &f, err);
    if (st) return st;
    st = aft_model_load(out, f, opt, err);
    aft_st_close(f);
    return st;
}

const aft_model_info *aft_model_get_info(const aft_model *m)
{
    return &m->info;
}

const char *aft_model_token(const aft_model *m, size_t id)
{
    return m->info.has_vocab && id < m->vocab.n ? m->vocab.text[id] : NULL;
}

aft_status aft_model_tokenize(const aft_model *m, int32_t **ids, size_t *n, const char *text, size_t len,
                              aft_error *err)
{
    *ids = NULL;
    *n = 0;
    if (!m->info.has_vocab)
        return aft_fail(err, AFT_ERR_ARG, "the model has no vocabulary (no metadata 'vocab'): give token ids");
    return aft_vocab_encode(&m->vocab, ids, n, text, len, err);
}

/* ---------------------------------------------------------------- forward */

static aft_status bad_token(const aft_model *m, const int32_t *tokens, size_t ldt, size_t B, size_t n, size_t t0,
                            aft_error *err)
{
    size_t b, t;
    if (!aft_embed_bad_token(&m->emb, tokens, ldt, B, n, &b, &t)) return AFT_OK;
    return aft_fail(err, AFT_ERR_ARG, "token %" PRId32 " (sequence %zu, position %zu) is outside the vocabulary "
                    "[0, %zu)", tokens[b * ldt + t], b, t0 + t, m->info.n_vocab);
}

static void add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

aft_status aft_model_forward(const aft_model *m, float *logits, const int32_t *tokens, size_t B, size_t T,
                             aft_error *err)
{
    return aft_model_forward_progress(m, logits, tokens, B, T, NULL, err);
}

aft_status aft_model_forward_progress(const aft_model *m, float *logits, const int32_t *tokens, size_t B, size_t T,
                                      aft_progress *progress, aft_error *err)
{
    const size_t D = m->info.d_model, F = m->info.d_ff, V = m->info.n_vocab;
    size_t N;
    if (!aft_mul_ok(B, T, &N) || N > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu exceeds the supported range", B, T);
    if (N == 0) return AFT_OK;
    if (!logits || !tokens) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !logits ? "logits" : "tokens");
    if (T > m->info.context)
        return aft_fail(err, AFT_ERR_ARG, "%zu tokens exceed the model's context of %zu (the rows of '%s'); a "
                        "model state streams on past it", T, m->info.context, m->context_from);
    aft_status st = bad_token(m, tokens, T, B, T, 0, err);
    if (st) return st;
    const int ref = m->impl == AFT_IMPL_REFERENCE;
    /* N rows a layer, which each layer counts (N <= INT_MAX, layers <=
     * MAX_LAYERS: no overflow) */
    aft_progress_plan(progress, N * m->info.n_layers);
    float *x = aft_alloc_array(N, D * sizeof(float)), *z = aft_alloc_array(N, D * sizeof(float));
    float *y = aft_alloc_array(N, D * sizeof(float)), *h = aft_alloc_array(N, F * sizeof(float));
    if (!x || !z || !y || !h) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu rows of the model", N);
        goto done;
    }
    void (*norm)(float *, const float *, const float *, const float *, size_t, size_t, float) =
        ref ? aft_layernorm_ref : aft_layernorm;
    (ref ? aft_embed_ref : aft_embed)(x, &m->emb, tokens, T, B, T, 0);
    for (size_t l = 0; l < m->info.n_layers; l++) {
        const mlayer *L = &m->layers[l];
        aft_config cfg = L->cfg;
        cfg.impl = m->impl;
        cfg.progress = progress;   /* the layer counts its rows, taken on above */
        norm(z, x, L->ln1_w, L->ln1_b, N, D, AFT_LAYERNORM_EPS);
        aft_error e2;
        if ((st = aft_layer_forward_counted(y, z, &L->attn.p, &cfg, B, T, &e2))) {
            st = aft_fail(err, st, "layer %zu: %s", l, e2.msg);
            goto done;
        }
        add(x, y, N * D);
        norm(z, x, L->ln2_w, L->ln2_b, N, D, AFT_LAYERNORM_EPS);
        if (ref) aft_ffn_ref(y, z, &L->ffp, N);
        else aft_ffn_apply(&L->ffn, y, z, N, h);
        add(x, y, N * D);
    }
    norm(z, x, m->norm_w, m->norm_b, N, D, AFT_LAYERNORM_EPS);
    if (ref) {   /* 16-bit weights widened for the reference (exact) */
        float *gw = aft_w_widen(m->gen_w, m->gen_dt, V * D);
        if (!gw) {
            st = aft_fail(err, AFT_ERR_NOMEM, "out of memory widening the logits' projection");
            goto done;
        }
        aft_linear_ref(logits, V, z, D, gw, m->gen_b, N, D, V);
        free(gw);
    } else {
        aft_linear_apply(&m->gen, N, z, D, logits, V);
    }
done:
    free(x);
    free(z);
    free(y);
    free(h);
    return st;
}

/* ---------------------------------------------------------------- the state */

struct aft_model_state {
    const aft_model *m;
    size_t B;
    aft_state **st;       /* one per layer */
    int32_t *hist;        /* (B, L): the context's tokens, when L is bounded */
    size_t cur;           /* tokens in the context (the layers' states' position) */
    size_t fed;
    int broken;
    size_t cap;           /* rows the scratch holds */
    float *x, *z, *y, *h; /* (cap, D) three times, (cap, F) */
};

void aft_model_state_free(aft_model_state *s)
{
    if (!s) return;
    for (size_t l = 0; s->st && l < s->m->info.n_layers; l++) aft_state_free(s->st[l]);
    free(s->st);
    free(s->hist);
    free(s->x);
    free(s->z);
    free(s->y);
    free(s->h);
    free(s);
}

aft_status aft_model_state_new(aft_model_state **out, const aft_model *m, size_t B, aft_error *err)
{
    *out = NULL;
    if (B == 0) return aft_fail(err, AFT_ERR_ARG, "a model state needs B >= 1 sequences");
    aft_model_state *s = calloc(1, sizeof *s);
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for a model state");
    s->m = m;
    s->B = B;
    aft_status st = AFT_OK;
    const size_t L = m->info.context;
    if (!(s->st = calloc(m->info.n_layers, sizeof *s->st)) ||
        (L != SIZE_MAX && !(s->hist = aft_alloc_array(B, L * sizeof(int32_t)))))
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a model state of %zu sequences", B);
    for (size_t l = 0; !st && l < m->info.n_layers; l++) {
        aft_config cfg = m->layers[l].cfg;
        cfg.impl = AFT_IMPL_FAST;
        aft_error e2;
        if ((st = aft_state_new(&s->st[l], &m->layers[l].attn.p, &cfg, B, &e2)))
            st = aft_fail(err, st, "layer %zu: %s", l, e2.msg);
    }
    if (st) {
        aft_model_state_free(s);
        return st;
    }
    *out = s;
    return AFT_OK;
}

size_t aft_model_state_fed(const aft_model_state *s)
{
    return s->fed;
}

size_t aft_model_state_context(const aft_model_state *s)
{
    return s->cur;
}

static aft_status scratch(aft_model_state *s, size_t rows, aft_error *err)
{
    if (rows <= s->cap) return AFT_OK;
    const size_t D = s->m->info.d_model, F = s->m->info.d_ff;
    free(s->x);
    free(s->z);
    free(s->y);
    free(s->h);
    s->x = aft_alloc_array(rows, D * sizeof(float));
    s->z = aft_alloc_array(rows, D * sizeof(float));
    s->y = aft_alloc_array(rows, D * sizeof(float));
    s->h = aft_alloc_array(rows, F * sizeof(float));
    s->cap = s->x && s->z && s->y && s->h ? rows : 0;
    return s->cap ? AFT_OK : aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu rows of the model", rows);
}

enum { LOGITS_NONE, LOGITS_ALL, LOGITS_LAST };

/* The next n tokens of each sequence (tok (B, n), rows ldt apart) through
 * every layer's state, from position s->cur. LOGITS_ALL: row j of
 * sequence b's logits to lg + (b lg_rows + lg_off + j) V; LOGITS_LAST:
 * each sequence's last row's to lg + b V. */
static aft_status run_rows(aft_model_state *s, const int32_t *tok, size_t ldt, size_t n, int which, float *lg,
                           size_t lg_rows, size_t lg_off, aft_error *err)
{
    const aft_model *m = s->m;
    const size_t D = m->info.d_model, V = m->info.n_vocab, B = s->B, N = B * n;
    aft_status st = scratch(s, N, err);
    if (st) return st;
    aft_embed(s->x, &m->emb, tok, ldt, B, n, s->cur);
    for (size_t l = 0; l < m->info.n_layers; l++) {
        const mlayer *L = &m->layers[l];
        aft_layernorm(s->z, s->x, L->ln1_w, L->ln1_b, N, D, AFT_LAYERNORM_EPS);
        aft_error e2;
        if ((st = aft_state_step(s->st[l], s->y, s->z, n, &e2))) return aft_fail(err, st, "layer %zu: %s", l, e2.msg);
        add(s->x, s->y, N * D);
        aft_layernorm(s->z, s->x, L->ln2_w, L->ln2_b, N, D, AFT_LAYERNORM_EPS);
        aft_ffn_apply(&L->ffn, s->y, s->z, N, s->h);
        add(s->x, s->y, N * D);
    }
    s->cur += n;
    if (which == LOGITS_ALL) {
        aft_layernorm(s->z, s->x, m->norm_w, m->norm_b, N, D, AFT_LAYERNORM_EPS);
        for (size_t b = 0; b < B; b++)
            aft_linear_apply(&m->gen, n, s->z + b * n * D, D, lg + (b * lg_rows + lg_off) * V, V);
    } else if (which == LOGITS_LAST) {
        for (size_t b = 0; b < B; b++)
            aft_layernorm(s->z + b * D, s->x + (b * n + n - 1) * D, m->norm_w, m->norm_b, 1, D, AFT_LAYERNORM_EPS);
        aft_linear_apply(&m->gen, B, s->z, D, lg, V);
    }
    return AFT_OK;
}

/* The context is full: keep its last `keep` tokens, encoded again from
 * position 0 by fresh layer states. */
static aft_status move_on(aft_model_state *s, aft_error *err)
{
    const size_t L = s->m->info.context, K = s->m->info.keep;
    for (size_t b = 0; b < s->B; b++) memmove(s->hist + b * L, s->hist + b * L + (L - K), K * sizeof(int32_t));
    for (size_t l = 0; l < s->m->info.n_layers; l++) aft_state_reset(s->st[l]);
    s->cur = 0;
    return K ? run_rows(s, s->hist, L, K, LOGITS_NONE, NULL, 0, 0, err) : AFT_OK;
}

aft_status aft_model_step(aft_model_state *s, float *logits, const int32_t *tokens, size_t n, int last_only,
                          aft_error *err)
{
    if (s->broken) return aft_fail(err, AFT_ERR_ARG, "this model state failed in an earlier step: free it");
    if (n == 0) return AFT_OK;
    if (!tokens) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) tokens");
    size_t N;
    if (!aft_mul_ok(s->B, n, &N) || N > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "B * n = %zu * %zu exceeds the supported range", s->B, n);
    aft_status st = bad_token(s->m, tokens, n, s->B, n, s->fed, err);
    if (st) return st;
    const size_t L = s->m->info.context, B = s->B;
    for (size_t i = 0; i < n;) {
        if (L != SIZE_MAX && s->cur == L && (st = move_on(s, err))) break;
        size_t k = n - i;
        if (L != SIZE_MAX) {
            if (k > L - s->cur) k = L - s->cur;
            for (size_t b = 0; b < B; b++)
                memcpy(s->hist + b * L + s->cur, tokens + b * n + i, k * sizeof(int32_t));
        }
        int which = !logits ? LOGITS_NONE : !last_only ? LOGITS_ALL : i + k == n ? LOGITS_LAST : LOGITS_NONE;
        if ((st = run_rows(s, tokens + i, n, k, which, logits, n, i, err))) break;
        i += k;
        s->fed += k;
    }
    if (st) s->broken = 1;
    return st;
}

/* ---------------------------------------------------------------- generation */

aft_status aft_model_generate(const aft_model *m, int32_t *out, size_t *n_out, const int32_t *prompt,
                              size_t n_prompt, size_t n_new, const aft_sampling *smp, aft_token_fn fn,
                              void *fn_ctx, aft_error *err)
{
    if (n_out) *n_out = 0;
    if (n_prompt == 0 || !prompt)
        return aft_fail(err, AFT_ERR_ARG, "generation needs a prompt of at least one token");
    const aft_sampling greedy = {0.0f, 0, 0};
    if (!smp) smp = &greedy;
    aft_model_state *s;
    aft_status st = aft_model_state_new(&s, m, 1, err);
    if (st) return st;
    float *lg = aft_alloc_array(m->info.n_vocab, sizeof(float));
    if (!lg) st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for the logits");
    if (!st) st = aft_model_step(s, lg, prompt, n_prompt, 1, err);
    uint64_t rng = smp->seed;
    for (size_t i = 0; !st && i < n_new; i++) {
        int32_t tok;
        if ((st = aft_sample(&tok, lg, m->info.n_vocab, smp, &rng, err))) break;
        if (out) out[i] = tok;
        if (n_out) *n_out = i + 1;
        if (fn && fn(fn_ctx, tok, lg)) break;
        if (i + 1 < n_new) st = aft_model_step(s, lg, &tok, 1, 1, err);
    }
    free(lg);
    aft_model_state_free(s);
    return st;
}
