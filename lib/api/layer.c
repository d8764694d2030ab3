/* layer.c - the binding interface's layer (aft.h, "the layer, from named
 * float32 arrays"): the caller's arrays found and checked by
 * aft_weights_load as aft run --weights finds a file's, the configuration
 * settled as aft run settles it, the forward pass in either layout. */
#include "api.h"

#include <stdlib.h>

/* the arrays into l->w (borrowed), the configuration settled, the
 * gradients' names listed, as aft run and aft grad do with a file */
static aft_status load(aft_api_layer *l, size_t n, const char *const *names, const float *const *data,
                       const size_t *ndims, const size_t *const *shapes, aft_error *err)
{
    aft_st_file *f;
    aft_status st = aft_st_borrow_f32(&f, n, names, data, ndims, shapes, err);
    if (st) return st;
    const api_options *o = &l->opt;
    st = aft_weights_load_grid(f, o->prefix, o->cfg.variant, o->cfg.grid_h != 0, &l->w, err);
    if (!st) {
        l->cfg = o->cfg;
        aft_weights_config(&l->cfg, &l->w, (o->given & API_WINDOW) != 0, (o->given & API_HEADS) != 0);
        st = aft_config_settle(&l->cfg, &l->w.p.bias, l->w.p.d_hidden, l->w.p.k_out, err);
    }
    if (!st) l->n_grads = aft_grad_slots(l->grads, &l->w.p, 1, &l->w, f);
    aft_st_close(f);
    return st;
}

aft_status aft_api_layer_new(aft_api_layer **out, size_t n, const char *const *names, const float *const *data,
                             const size_t *ndims, const size_t *const *shapes, const char *options, aft_error *err)
{
    if (!out) return api_null(err, "out");
    *out = NULL;
    aft_api_layer *l = calloc(1, sizeof *l);
    if (!l) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    aft_status st = api_options_parse(&l->opt, options, API_LAYER_KEYS, "the layer", err);
    if (!st) st = api_options_check(&l->opt, 1, err);
    if (!st) st = load(l, n, names, data, ndims, shapes, err);
    if (st) {
        aft_api_layer_free(l);
        return st;
    }
    *out = l;
    return AFT_OK;
}

void aft_api_layer_free(aft_api_layer *l)
{
    if (!l) return;
    aft_weights_free(&l->w);
    free(l);
}

void aft_api_layer_dims(const aft_api_layer *l, size_t *d_model, size_t *d_hidden)
{
    if (d_model) *d_model = l ? l->w.p.d_model : 0;
    if (d_hidden) *d_hidden = l ? l->w.p.d_hidden : 0;
}

/* y from x, both (T, B, D): through (B, T, D) copies, as aft run --layout tbd */
static aft_status forward_tbd(aft_api_layer *l, float *y, const float *x, size_t B, size_t T, size_t n,
                              aft_error *err)
{
    size_t D = l->w.p.d_model;
    float *xb = aft_alloc_array(n, 2 * sizeof(float)), *yb = xb + n;
    if (!xb) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the layout's copies (%zu floats)", 2 * n);
    aft_swap_tb(xb, x, B, T, D, 0);
    aft_status st = aft_layer_forward(yb, xb, &l->w.p, &l->cfg, B, T, err);
    if (!st) aft_swap_tb(y, yb, B, T, D, 1);
    free(xb);
    return st;
}

aft_status aft_api_layer_forward(aft_api_layer *l, float *y, const float *x, size_t B, size_t T, aft_error *err)
{
    if (!l || !y || !x) return api_null(err, !l ? "layer" : !y ? "y" : "x");
    size_t n;
    aft_status st = api_floats(B, T, l->w.p.d_model, &n, "x", err);
    if (!st) st = aft_weights_check_length(&l->w, l->cfg.variant, T, err);
    if (st) return st;
    if (l->opt.tbd) return API_BLAS(forward_tbd(l, y, x, B, T, n, err));
    return API_BLAS(aft_layer_forward(y, x, &l->w.p, &l->cfg, B, T, err));
}

size_t aft_api_layer_grad_count(const aft_api_layer *l)
{
    return l ? l->n_grads : 0;
}

aft_status aft_api_layer_grad_info(const aft_api_layer *l, size_t i, const char **name, size_t *ndim, size_t *shape,
                                   aft_error *err)
{
    if (!l) return api_null(err, "layer");
    if (i >= l->n_grads) return aft_fail(err, AFT_ERR_ARG, "no gradient %zu: the layer has %zu", i, l->n_grads);
    const aft_grad_slot *s = &l->grads[i];
    if (name) *name = s->name;
    if (ndim) *ndim = s->ndim;
    for (size_t d = 0; shape && d < 4; d++) shape[d] = s->shape[d];
    return AFT_OK;
}
