/* grad_names.c - what aft grad calls a layer's gradients and the shapes it
 * gives them (aft.h, aft_grad_slots): one list, which aft grad writes and
 * the binding interface hands out. */
#include "internal.h"

#include <stdio.h>

/* aft_weights.names: the position bias and its factor v */
enum { NAME_BIAS = 4, NAME_BIAS_V = 5 };

static void put(aft_grad_slot *s, aft_grad_role role, const char *name, size_t ndim, const size_t *shape)
{
    s->role = role;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim < 4 ? ndim : 4;
    for (size_t d = 0; d < 4; d++) s->shape[d] = d < s->ndim ? shape[d] : 0;
}

/* "query.weight" -> "query.bias" */
static void bias_name(char *out, size_t cap, const char *weight)
{
    size_t n = strlen(weight);
    if (n >= 7 && strcmp(weight + n - 7, ".weight") == 0) snprintf(out, cap, "%.*s.bias", (int)(n - 7), weight);
    else snprintf(out, cap, "%s.bias", weight);
}

/* each projection's weight (out, in), then its bias (out) when it has one */
static size_t projection_slots(aft_grad_slot *slots, const aft_params *p, const aft_weights *w)
{
    static const char *const canon[4] = {"query.weight", "key.weight", "value.weight", "output.weight"};
    const float *bias[4] = {p->bq, p->bk, p->bv, p->bo};
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out, n = 0;
    const size_t rows[4] = {C, KC, C, D}, cols[4] = {D, D, D, C};
    for (int i = 0; i < 4; i++) {
        const char *wn = w ? w->names[i] : canon[i];
        put(&slots[n++], (aft_grad_role)(AFT_GRAD_WQ + 2 * i), wn, 2, (size_t[2]){rows[i], cols[i]});
        if (!bias[i]) continue;
        char bn[176];
        bias_name(bn, sizeof bn, wn);
        put(&slots[n++], (aft_grad_role)(AFT_GRAD_BQ + 2 * i), bn, 1, &rows[i]);
    }
    return n;
}

/* the position bias: in the file's shape, or a seeded conv bias's */
static size_t bias_slots(aft_grad_slot *slots, const aft_params *p, const aft_weights *w, const aft_st_file *f)
{
    const aft_bias *b = &p->bias;
    if (b->kind == AFT_BIAS_NONE || b->kind == AFT_BIAS_SEEDED) return 0;
    aft_grad_role role = b->kind == AFT_BIAS_DENSE ? AFT_GRAD_DENSE : b->kind == AFT_BIAS_FACTORED ? AFT_GRAD_U
                                                                                                    : AFT_GRAD_CONV;
    const char *name = w ? w->names[NAME_BIAS] : "pos_bias";
    const aft_tensor *ft = w && f ? aft_st_find(f, name) : NULL;
    if (ft) put(&slots[0], role, name, ft->ndim, ft->shape);
    else if (b->kind == AFT_BIAS_CONV)
        put(&slots[0], role, name, b->conv_2d ? 3 : 2, (size_t[3]){b->conv_rows, b->conv_len, b->conv_len});
    else return 0;
    const aft_tensor *fv = b->kind == AFT_BIAS_FACTORED ? aft_st_find(f, w->names[NAME_BIAS_V]) : NULL;
    if (!fv) return 1;
    put(&slots[1], AFT_GRAD_V, w->names[NAME_BIAS_V], fv->ndim, fv->shape);
    return 2;
}

size_t aft_grad_slots(aft_grad_slot *slots, const aft_params *p, int projections, const aft_weights *w,
                      const aft_st_file *f)
{
    size_t n = projections ? projection_slots(slots, p, w) : 0;
    return n + bias_slots(slots + n, p, w, f);
}

float **aft_layer_grads_field(aft_layer_grads *g, aft_grad_role role)
{
    switch (role) {
    case AFT_GRAD_WQ: return &g->wq;
    case AFT_GRAD_BQ: return &g->bq;
    case AFT_GRAD_WK: return &g->wk;
    case AFT_GRAD_BK: return &g->bk;
    case AFT_GRAD_WV: return &g->wv;
    case AFT_GRAD_BV: return &g->bv;
    case AFT_GRAD_WO: return &g->wo;
    case AFT_GRAD_BO: return &g->bo;
    case AFT_GRAD_DENSE: return &g->bias.dense;
    case AFT_GRAD_U: return &g->bias.u;
    case AFT_GRAD_V: return &g->bias.v;
    case AFT_GRAD_CONV: return &g->bias.conv;
    }
    return NULL;
}
