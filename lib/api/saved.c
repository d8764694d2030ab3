/* saved.c - the binding interface's saved forward (aft.h, "a training
 * step"): aft_layer_forward_saved and aft_layer_backward_saved over the
 * caller's buffer, in either layout, behind a header that lets the
 * backward refuse a buffer no forward of this shape filled. */
#include "api.h"
#include "layer.h"

#include <stdlib.h>
#include <string.h>

/* the buffer's first API_SAVED_HEAD floats: a mark and the rows, written
 * when the forward has succeeded (cleared when it starts) */
static const uint32_t SAVED_MARK = 0x53544641u;   /* "AFTS" */

typedef struct {
    uint32_t mark, head;
    uint64_t rows;
} saved_head;

void api_saved_mark(float *saved, size_t rows, int done)
{
    saved_head h = {0};
    if (done) h = (saved_head){.mark = SAVED_MARK, .head = API_SAVED_HEAD, .rows = rows};
    memcpy(saved, &h, sizeof h);
}

aft_status api_saved_check(const float *saved, size_t rows, size_t B, size_t T, aft_error *err)
{
    saved_head h;
    memcpy(&h, saved, sizeof h);
    if (h.mark != SAVED_MARK || h.head != API_SAVED_HEAD || h.rows != rows)
        return aft_fail(err, AFT_ERR_ARG, "saved is not what a saved forward left for B = %zu, T = %zu", B, T);
    return AFT_OK;
}

static aft_status saved_floats(const aft_api_layer *l, size_t B, size_t T, size_t *n, aft_error *err)
{
    size_t x;
    aft_status st = api_floats(B, T, l->w.p.d_model, &x, "x", err);
    if (!st) st = aft_weights_check_length(&l->w, l->cfg.variant, T, err);
    if (!st) st = aft_layer_saved_floats(&l->w.p, &l->cfg, B, T, n, err);
    if (!st && !aft_add_ok(*n, API_SAVED_HEAD, n))
        st = aft_fail(err, AFT_ERR_ARG, "the saved forward of B * T = %zu * %zu rows overflows", B, T);
    return st;
}

aft_status aft_api_layer_saved_size(const aft_api_layer *l, size_t B, size_t T, size_t *n, aft_error *err)
{
    if (!l || !n) return api_null(err, !l ? "layer" : "n");
    return saved_floats(l, B, T, n, err);
}

/* the checks both calls make: the buffer's size, x's */
static aft_status saved_check(const aft_api_layer *l, size_t n_saved, size_t B, size_t T, size_t *n, aft_error *err)
{
    size_t want;
    aft_status st = saved_floats(l, B, T, &want, err);
    if (!st && n_saved != want)
        st = aft_fail(err, AFT_ERR_ARG, "saved holds %zu floats, the layer's saved forward of B = %zu, T = %zu takes %zu",
                      n_saved, B, T, want);
    if (!st) st = api_floats(B, T, l->w.p.d_model, n, "x", err);
    return st;
}

/* (B, T, D) copies of x (and dy) for layout=tbd, two or three arrays of n */
static float *tbd_copies(size_t n, int k, aft_error *err)
{
    float *c = aft_alloc_array(n, (size_t)k * sizeof(float));
    if (!c) aft_fail(err, AFT_ERR_NOMEM, "out of memory for the layout's copies (%zu floats)", (size_t)k * n);
    return c;
}

aft_status aft_api_layer_forward_saved(aft_api_layer *l, float *y, float *saved, size_t n_saved, const float *x,
                                       size_t B, size_t T, aft_error *err)
{
    if (!l || !y || !saved || !x) return api_null(err, !l ? "layer" : !y ? "y" : !saved ? "saved" : "x");
    size_t n;
    aft_status st = saved_check(l, n_saved, B, T, &n, err);
    if (st) return st;
    api_saved_mark(saved, 0, 0);
    size_t D = l->w.p.d_model;
    if (!l->opt.tbd) {
        st = API_BLAS(aft_layer_forward_saved(y, saved + API_SAVED_HEAD, x, &l->w.p, &l->cfg, B, T, NULL, err));
    } else {
        float *xb = tbd_copies(n, 2, err), *yb = xb + n;
        if (!xb) return AFT_ERR_NOMEM;
        aft_swap_tb(xb, x, B, T, D, 0);
        st = API_BLAS(aft_layer_forward_saved(yb, saved + API_SAVED_HEAD, xb, &l->w.p, &l->cfg, B, T, NULL, err));
        if (!st) aft_swap_tb(y, yb, B, T, D, 1);
        free(xb);
    }
    if (st) return st;
    api_saved_mark(saved, B * T, 1);
    return AFT_OK;
}

aft_status aft_api_layer_backward_saved(aft_api_layer *l, float *dx, float *const *grads, const float *dy,
                                        const float *x, const float *saved, size_t n_saved, size_t B, size_t T,
                                        aft_error *err)
{
    if (!l || !dy || !x || !saved) return api_null(err, !l ? "layer" : !dy ? "dy" : !x ? "x" : "saved");
    size_t n;
    aft_status st = saved_check(l, n_saved, B, T, &n, err);
    if (st) return st;
    if ((st = api_saved_check(saved, B * T, B, T, err))) return st;
    aft_layer_grads g = {0};
    for (size_t i = 0; grads && i < l->n_grads; i++) *aft_layer_grads_field(&g, l->grads[i].role) = grads[i];
    size_t D = l->w.p.d_model;
    if (!l->opt.tbd) {
        g.dx = dx;
        return API_BLAS(aft_layer_backward_saved(&g, saved + API_SAVED_HEAD, dy, x, &l->w.p, &l->cfg, B, T, NULL, err));
    }
    float *xb = tbd_copies(n, 3, err), *dyb = xb + n;
    if (!xb) return AFT_ERR_NOMEM;
    aft_swap_tb(xb, x, B, T, D, 0);
    aft_swap_tb(dyb, dy, B, T, D, 0);
    g.dx = dx ? dyb + n : NULL;
    st = API_BLAS(aft_layer_backward_saved(&g, saved + API_SAVED_HEAD, dyb, xb, &l->w.p, &l->cfg, B, T, NULL, err));
    if (!st && dx) aft_swap_tb(dx, g.dx, B, T, D, 1);
    free(xb);
    return st;
}
