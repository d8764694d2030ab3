/* weights.c - find an AFT layer's tensors in a .safetensors file by name. */
#include "internal.h"

#include <stdlib.h>

/* the entries of aft_weights.names: the projections' weights, the position
 * bias (and its factor v), then the projections' biases */
enum { R_Q, R_K, R_V, R_O, R_BIAS, R_BIAS_V, R_QB };

/* Looks up prefix+stem+suffix for each candidate stem; exactly one may exist. */
static aft_status find_one(const aft_st_file *f, const char *prefix, const char *const *stems,
                           const char *suffix, const char *role, int required,
                           const aft_tensor **out, char name[160], aft_error *err)
{
    *out = NULL;
    name[0] = 0;
    char cand[160];
    for (size_t i = 0; stems[i]; i++) {
        int n = snprintf(cand, sizeof cand, "%s%s%s", prefix, stems[i], suffix);
        if (n < 0 || (size_t)n >= sizeof cand)
            return aft_fail(err, AFT_ERR_ARG, "prefix '%s' is too long", prefix);
        const aft_tensor *t = aft_st_find(f, cand);
        if (!t) continue;
        if (*out)
            return aft_fail(err, AFT_ERR_FORMAT, "two candidates for the %s: '%s' and '%s'", role, name, cand);
        *out = t;
        snprintf(name, 160, "%s", cand);
    }
    if (!*out && required) {
        char list[400] = "";
        size_t used = 0;
        for (size_t i = 0; stems[i] && used < sizeof list; i++) {
            int n = snprintf(list + used, sizeof list - used, "%s'%s%s%s'", i ? " or " : "", prefix, stems[i], suffix);
            if (n < 0) break;
            used += (size_t)n;
        }
        return aft_fail(err, AFT_ERR_FORMAT, "no %s: expected a tensor named %s", role, list);
    }
    return AFT_OK;
}

/* t as float32: a copy w owns, or, from a caller's arrays (aft_st_borrow_f32),
 * the array itself */
static aft_status to_f32(aft_weights *w, const aft_st_file *f, const aft_tensor *t, const char *name,
                         const float **out, aft_error *err)
{
    if (!aft_dtype_is_float(t->dtype))
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' has dtype %s; weights must be F64, F32, F16 or BF16",
                        name, aft_dtype_name(t->dtype));
    if (aft_st_borrowed(f) && t->dtype == AFT_F32) {
        *out = t->data;
        return AFT_OK;
    }
    float *copy;
    aft_status st = aft_tensor_to_f32(t, &copy, err);
    if (st) return st;
    w->owned[w->nowned++] = copy;
    *out = copy;
    return AFT_OK;
}

static int is_matrix(const aft_tensor *t) { return t->ndim == 2; }

/* A layer has a bias for each of its projections, for none, or for its
 * output alone (labml's AFTLocal with bias=False: query, key and value
 * without, output with); rish-16's and labml's modules make nothing else.
 * Any other set is a tensor lost on the way: the first projection without
 * one is named. bt: the biases found (NULL: none), names: the weights'. */
static aft_status check_biases(const aft_weights *w, const aft_tensor *const bt[4], aft_error *err)
{
    int have = bt[R_Q] ? R_Q : bt[R_K] ? R_K : bt[R_V] ? R_V : -1;
    if (have < 0) return AFT_OK;   /* none, or the output's alone */
    for (int r = 0; r < 4; r++) {
        if (bt[r]) continue;
        const char *wn = w->names[r];
        size_t n = strlen(wn) - strlen(".weight");   /* find_one made it prefix + stem + ".weight" */
        return aft_fail(err, AFT_ERR_FORMAT, "missing tensor '%.*s.bias' beside '%s': a layer has a bias for every "
                        "projection, for none, or for its output alone", (int)n, wn, w->names[R_QB + have]);
    }
    return AFT_OK;
}

/* Where the prefix numbers its layer: the last component of digits
 * ("encoder.layers.1.self_attn." -> "1", at [*a, *b)); 0 when it has none. */
static int layer_number(const char *prefix, size_t *a, size_t *b)
{
    int found = 0;
    for (size_t i = 0; prefix[i]; i++) {
        if ((i > 0 && prefix[i - 1] != '.') || prefix[i] < '0' || prefix[i] > '9') continue;
        size_t j = i;
        while (prefix[j] >= '0' && prefix[j] <= '9') j++;
        if (prefix[j] != '.') continue;
        *a = i;
        *b = j;
        found = 1;
    }
    return found;
}

/* The layer's peers are the prefix with another number in that place
 * ("encoder.layers.0.self_attn." for "encoder.layers.1.self_attn."): the
 * same module in another layer of the file. A bias one of them has and this
 * layer lacks is missing, as a checkpoint's layer is refused when another
 * layer has a tensor it lacks. bt: the biases found. */
static aft_status check_peer_biases(const aft_st_file *f, const char *prefix, const aft_weights *w,
                                    const aft_tensor *const bt[4], const char *const *const stems[4], aft_error *err)
{
    size_t a, b, plen = strlen(prefix);
    if ((bt[R_Q] && bt[R_K] && bt[R_V] && bt[R_O]) || !layer_number(prefix, &a, &b)) return AFT_OK;
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *name;
        aft_st_get(f, i, &name);
        if (strncmp(name, prefix, a) != 0) continue;
        const char *num = name + a, *after = num;
        while (*after >= '0' && *after <= '9') after++;
        size_t digits = (size_t)(after - num);
        if (digits == 0 || (digits == b - a && strncmp(num, prefix + a, digits) == 0) ||
            strncmp(after, prefix + b, plen - b) != 0)
            continue;
        const char *rest = after + (plen - b);
        for (int r = 0; r < 4; r++) {
            if (bt[r]) continue;
            for (size_t k = 0; stems[r][k]; k++) {
                size_t n = strlen(stems[r][k]);
                if (strncmp(rest, stems[r][k], n) != 0 || strcmp(rest + n, ".bias") != 0) continue;
                size_t wn = strlen(w->names[r]) - strlen(".weight");   /* prefix + stem + ".weight" */
                return aft_fail(err, AFT_ERR_FORMAT, "missing tensor '%.*s.bias', which the layer '%.*s' has", (int)wn,
                                w->names[r], (int)(rest - name), name);
            }
        }
    }
    return AFT_OK;
}

/* the layer's own names after the prefix: any other tensor under it is
 * unexpected. labml's local_mask is one (a buffer the window stands for). */
static int layer_name(const char *rest)
{
    static const char *const stems[] = {"query", "key", "value", "output", "to_q", "to_k", "to_v", "project"};
    static const char *const alone[] = {"pos_bias", "wbias", "pos_bias_u", "pos_bias_v", "local_mask"};
    for (size_t i = 0; i < sizeof alone / sizeof alone[0]; i++)
        if (strcmp(rest, alone[i]) == 0) return 1;
    for (size_t i = 0; i < sizeof stems / sizeof stems[0]; i++) {
        size_t n = strlen(stems[i]);
        if (strncmp(rest, stems[i], n) == 0 && (strcmp(rest + n, ".weight") == 0 || strcmp(rest + n, ".bias") == 0))
            return 1;
    }
    return 0;
}

/* w->n_unexpected and w->unexpected: the tensors under the prefix that are
 * none of a layer's, in file order */
static void note_unexpected(const aft_st_file *f, const char *prefix, aft_weights *w)
{
    size_t plen = strlen(prefix);
    w->n_unexpected = 0;
    w->unexpected[0] = 0;
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *name;
        aft_st_get(f, i, &name);
        if (strncmp(name, prefix, plen) != 0 || layer_name(name + plen)) continue;
        if (w->n_unexpected++ == 0) aft_shown(name, w->unexpected, sizeof w->unexpected - 4);
    }
}

static aft_status load_bias(const aft_st_file *f, const char *prefix, aft_variant variant, int grid,
                            aft_weights *w, aft_error *err);

void aft_weights_free(aft_weights *w)
{
    for (size_t i = 0; i < w->nowned; i++) free(w->owned[i]);
    memset(w, 0, sizeof *w);
}

aft_status aft_weights_load(const aft_st_file *f, const char *prefix, aft_variant variant,
                            aft_weights *w, aft_error *err)
{
    return aft_weights_load_grid(f, prefix, variant, 0, w, err);
}

aft_status aft_weights_load_grid(const aft_st_file *f, const char *prefix, aft_variant variant, int grid,
                                 aft_weights *w, aft_error *err)
{
    static const char *const q_stems[] = {"query", "to_q", NULL};
    static const char *const k_stems[] = {"key", "to_k", NULL};
    static const char *const v_stems[] = {"value", "to_v", NULL};
    static const char *const o_stems[] = {"output", "project", NULL};
    static const char *const *const stems[4] = {q_stems, k_stems, v_stems, o_stems};
    static const char *const roles[4] = {"query weight", "key weight", "value weight", "output weight"};
    static const char *const broles[4] = {"query bias", "key bias", "value bias", "output bias"};

    memset(w, 0, sizeof *w);
    if (!prefix) prefix = "";
    const aft_tensor *wt[4], *bt[4];
    char (*bnames)[160] = w->names + R_QB;
    aft_status st;
    for (int r = 0; r < 4; r++) {
        if ((st = find_one(f, prefix, stems[r], ".weight", roles[r], 1, &wt[r], w->names[r], err))) goto fail;
        if ((st = find_one(f, prefix, stems[r], ".bias", broles[r], 0, &bt[r], bnames[r], err))) goto fail;
        if (!is_matrix(wt[r])) {
            st = aft_fail(err, AFT_ERR_FORMAT, "'%s' must be a matrix (out, in); it has %zu %s",
                          w->names[r], wt[r]->ndim, aft_noun(wt[r]->ndim, "dimension", "dimensions"));
            goto fail;
        }
    }
    size_t C = wt[R_Q]->shape[0], D = wt[R_Q]->shape[1], KC = wt[R_K]->shape[0];
    if (wt[R_V]->shape[0] != C || wt[R_V]->shape[1] != D) {
        st = aft_fail(err, AFT_ERR_FORMAT, "'%s' is [%zu, %zu] but '%s' is [%zu, %zu]; they must match",
                      w->names[R_V], wt[R_V]->shape[0], wt[R_V]->shape[1], w->names[R_Q], C, D);
        goto fail;
    }
    if (wt[R_K]->shape[1] != D) {
        st = aft_fail(err, AFT_ERR_FORMAT, "'%s' takes inputs of size %zu but '%s' takes %zu",
                      w->names[R_K], wt[R_K]->shape[1], w->names[R_Q], D);
        goto fail;
    }
    if (wt[R_O]->shape[0] != D || wt[R_O]->shape[1] != C) {
        st = aft_fail(err, AFT_ERR_FORMAT,
                      "'%s' is [%zu, %zu] but must be [%zu, %zu] (model size, hidden size)",
                      w->names[R_O], wt[R_O]->shape[0], wt[R_O]->shape[1], D, C);
        goto fail;
    }
    size_t outs[4] = {C, KC, C, D};
    for (int r = 0; r < 4; r++)
        if (bt[r] && (bt[r]->ndim != 1 || bt[r]->shape[0] != outs[r])) {
            st = aft_fail(err, AFT_ERR_FORMAT, "'%s' must have shape [%zu] to match '%s'", bnames[r], outs[r],
                          w->names[r]);
            goto fail;
        }
    if ((st = check_biases(w, bt, err)) || (st = check_peer_biases(f, prefix, w, bt, stems, err))) goto fail;
    /* the four matrices in one 16-bit dtype stay in it (the products widen
     * them in registers); any other mix is widened to float32 */
    aft_dtype wdt = wt[R_Q]->dtype;
    for (int r = 1; r < 4; r++)
        if (wt[r]->dtype != wdt) wdt = AFT_F32;
    if (!aft_dtype_is16(wdt)) wdt = AFT_F32;
    const float *mats[4], *vecs[4] = {NULL, NULL, NULL, NULL};
    for (int r = 0; r < 4; r++) {
        if (wdt != AFT_F32) {
            void *copy;
            if ((st = aft_tensor_copy(wt[r], &copy, err))) goto fail;
            w->owned[w->nowned++] = copy;
            mats[r] = copy;
        } else if ((st = to_f32(w, f, wt[r], w->names[r], &mats[r], err))) {
            goto fail;
        }
        if (bt[r] && (st = to_f32(w, f, bt[r], bnames[r], &vecs[r], err))) goto fail;
    }
    aft_params *p = &w->p;
    p->w_dtype = wdt;
    p->d_model = D; p->d_hidden = C; p->k_out = KC;
    p->wq = mats[R_Q]; p->wk = mats[R_K]; p->wv = mats[R_V]; p->wo = mats[R_O];
    p->bq = vecs[R_Q]; p->bk = vecs[R_K]; p->bv = vecs[R_V]; p->bo = vecs[R_O];
    st = load_bias(f, prefix, variant, grid, w, err);
    if (st) goto fail;
    note_unexpected(f, prefix, w);
    return AFT_OK;

fail:
    aft_weights_free(w);
    return st;
}

/* conv on a grid: (heads, 2S-1, 2S-1), or (2S-1, 2S-1) shared by every head */
static aft_status conv_bias_2d(aft_weights *w, const aft_st_file *f, const aft_tensor *pb, aft_error *err)
{
    int square = pb->ndim >= 2 && pb->shape[pb->ndim - 1] == pb->shape[pb->ndim - 2];
    size_t n = pb->ndim >= 2 ? pb->shape[pb->ndim - 1] : 0, H = pb->ndim == 3 ? pb->shape[0] : 1;
    if ((pb->ndim != 2 && pb->ndim != 3) || !square || n % 2 == 0 || H == 0)
        return aft_fail(err, AFT_ERR_FORMAT, "'%s' must be (heads, 2*window-1, 2*window-1) or (2*window-1, "
                        "2*window-1), odd and square, for the conv variant on a grid", w->names[R_BIAS]);
    const float *cb = NULL;
    aft_status st = to_f32(w, f, pb, w->names[R_BIAS], &cb, err);
    if (st) return st;
    aft_params *p = &w->p;
    w->conv_heads = H;
    w->conv_window = aft_conv_window(n);
    p->bias.conv_len = n;
    p->bias.conv_rows = H;   /* one square: shared by every head */
    p->bias.conv_2d = 1;
    p->bias.name = w->names[R_BIAS];
    p->bias.kind = AFT_BIAS_CONV;
    p->bias.conv = cb;
    return AFT_OK;
}

aft_status aft_bias_load(const aft_st_file *f, const char *prefix, aft_variant variant,
                         aft_weights *w, aft_error *err)
{
    return aft_bias_load_grid(f, prefix, variant, 0, w, err);
}

aft_status aft_bias_load_grid(const aft_st_file *f, const char *prefix, aft_variant variant, int grid,
                              aft_weights *w, aft_error *err)
{
    if (!prefix) prefix = "";
    aft_status st = load_bias(f, prefix, variant, grid, w, err);
    if (!st) note_unexpected(f, prefix, w);
    return st;
}

/* the position bias of the variant, into w */
static aft_status load_bias(const aft_st_file *f, const char *prefix, aft_variant variant, int grid,
                            aft_weights *w, aft_error *err)
{
    aft_params *p = &w->p;
    aft_status st;
    if (!prefix) prefix = "";
    p->bias.kind = AFT_BIAS_NONE;
    if (variant == AFT_SIMPLE) return AFT_OK;   /* simple has no position bias */

    static const char *const pb_stems[] = {"pos_bias", "wbias", NULL};
    static const char *const u_stems[] = {"pos_bias_u", NULL};
    static const char *const v2_stems[] = {"pos_bias_v", NULL};
    const aft_tensor *pb, *pu, *pv;
    char pbname[160], puname[160];
    if ((st = find_one(f, prefix, pb_stems, "", "position bias", 0, &pb, pbname, err))) goto fail;
    if ((st = find_one(f, prefix, u_stems, "", "factored position bias u", 0, &pu, puname, err))) goto fail;
    if (pu && pb) {
        st = aft_fail(err, AFT_ERR_FORMAT, "two candidates for the position bias: '%s' and '%s'", pbname, puname);
        goto fail;
    }
    snprintf(w->names[R_BIAS], sizeof w->names[R_BIAS], "%s", pu ? puname : pbname);
    if ((st = find_one(f, prefix, v2_stems, "", "factored position bias v", pu != NULL, &pv, w->names[R_BIAS_V], err)))
        goto fail;
    if (!pb && !pu) {
        st = aft_fail(err, AFT_ERR_FORMAT, "no position bias for the %s variant: expected '%spos_bias', '%swbias' "
                      "or '%spos_bias_u' with '%spos_bias_v'", aft_variant_name(variant), prefix, prefix, prefix, prefix);
        goto fail;
    }
    if (variant == AFT_CONV) {
        if (pu) {
            st = aft_fail(err, AFT_ERR_FORMAT, "the conv variant needs a per-head bias (heads, 2*window-1), not a factored one");
            goto fail;
        }
        if (grid) return conv_bias_2d(w, f, pb, err);
        size_t H = pb->ndim == 2 ? pb->shape[0] : 1, n = pb->ndim == 2 ? pb->shape[1] : (pb->ndim == 1 ? pb->shape[0] : 0);
        if ((pb->ndim != 1 && pb->ndim != 2) || n % 2 == 0) {
            st = aft_fail(err, AFT_ERR_FORMAT, "'%s' must be (heads, 2*window-1) or (2*window-1) with an odd last "
                          "dimension for the conv variant%s", w->names[R_BIAS],
                          pb->ndim == 3 ? " (a (heads, 2*window-1, 2*window-1) bias is a grid's)" : "");
            goto fail;
        }
        const float *cb = NULL;
        if ((st = to_f32(w, f, pb, w->names[R_BIAS], &cb, err))) goto fail;
        w->conv_heads = H;
        w->conv_window = aft_conv_window(n);
        p->bias.conv_len = n;
        p->bias.conv_rows = H;   /* one row: shared by every head */
        p->bias.name = w->names[R_BIAS];
        p->bias.kind = AFT_BIAS_CONV;
        p->bias.conv = cb;
        return AFT_OK;
    }
    if (pu) {
        if (pu->ndim != 2 || pv->ndim != 2 || pu->shape[0] != pv->shape[0] || pu->shape[1] != pv->shape[1] ||
            pu->shape[1] == 0) {
            st = aft_fail(err, AFT_ERR_FORMAT, "'%s' and '%s' must both be (Tmax, rank) with the same shape",
                          w->names[R_BIAS], w->names[R_BIAS_V]);
            goto fail;
        }
        const float *u = NULL, *v = NULL;
        if ((st = to_f32(w, f, pu, w->names[R_BIAS], &u, err)) ||
            (st = to_f32(w, f, pv, w->names[R_BIAS_V], &v, err)))
            goto fail;
        p->bias.kind = AFT_BIAS_FACTORED;
        p->bias.u = u; p->bias.v = v;
        p->bias.tmax = pu->shape[0];
        p->bias.rank = pu->shape[1];
        return AFT_OK;
    }
    if (pb->ndim != 2 || pb->shape[0] != pb->shape[1]) {
        st = aft_fail(err, AFT_ERR_FORMAT, "'%s' must be a square (Tmax, Tmax) matrix for the %s variant",
                      w->names[R_BIAS], aft_variant_name(variant));
        goto fail;
    }
    const float *dense = NULL;
    if ((st = to_f32(w, f, pb, w->names[R_BIAS], &dense, err))) goto fail;
    p->bias.kind = AFT_BIAS_DENSE;
    p->bias.dense = dense;
    p->bias.tmax = pb->shape[0];
    return AFT_OK;

fail:
    return st;
}

/* ---------------------------------------------------------------- the run's configuration */

void aft_weights_config(aft_config *cfg, const aft_weights *w, int window_set, int heads_set)
{
    if (cfg->variant != AFT_CONV || w->p.bias.kind != AFT_BIAS_CONV) return;
    if (!window_set) cfg->window = AFT_WINDOW_FROM_BIAS;
    if (!heads_set) cfg->heads = 0;
}

aft_status aft_weights_check_length(const aft_weights *w, aft_variant variant, size_t T, aft_error *err)
{
    const aft_bias *b = &w->p.bias;
    if (aft_bias_reach(b, variant) >= T) return AFT_OK;
    return aft_fail(err, AFT_ERR_ARG, "sequence length T = %zu exceeds the position bias '%s' size Tmax = %zu", T,
                    w->names[R_BIAS], b->tmax);
}
