/* grad.c - the binding interface's layer backward (aft.h): the gradients
 * aft grad writes, into the caller's arrays, in either layout. */
#include "api.h"

#include <stdlib.h>

/* the caller's arrays for the gradients of l's parameters (grads[i]: the
 * gradient aft_api_layer_grad_info(i) names; NULL: none wanted) */
static void grads_into(aft_layer_grads *g, const aft_api_layer *l, float *const *grads)
{
    for (size_t i = 0; grads && i < l->n_grads; i++) *aft_layer_grads_field(g, l->grads[i].role) = grads[i];
}

/* the backward pass on (T, B, D) arrays through (B, T, D) copies, as aft
 * grad --layout tbd: x and dy in, dx and y out */
static aft_status backward_tbd(aft_api_layer *l, aft_layer_grads *g, float *dx, float *y, const float *dy,
                               const float *x, size_t B, size_t T, size_t n, aft_error *err)
{
    size_t D = l->w.p.d_model;
    float *xb = aft_alloc_array(n, 4 * sizeof(float)), *dyb = xb + n;
    if (!xb) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the layout's copies (%zu floats)", 4 * n);
    float *dxb = dx ? dyb + n : NULL, *yb = y ? dyb + 2 * n : NULL;
    aft_swap_tb(xb, x, B, T, D, 0);
    aft_swap_tb(dyb, dy, B, T, D, 0);
    g->dx = dxb;
    aft_status st = aft_layer_backward(g, yb, dyb, xb, &l->w.p, &l->cfg, B, T, err);
    if (!st && dx) aft_swap_tb(dx, dxb, B, T, D, 1);
    if (!st && y) aft_swap_tb(y, yb, B, T, D, 1);
    free(xb);
    return st;
}

aft_status aft_api_layer_backward(aft_api_layer *l, float *dx, float *const *grads, float *y, const float *dy,
                                  const float *x, size_t B, size_t T, aft_error *err)
{
    if (!l || !dy || !x) return api_null(err, !l ? "layer" : !dy ? "dy" : "x");
    size_t n;
    aft_status st = api_floats(B, T, l->w.p.d_model, &n, "x", err);
    if (!st) st = aft_weights_check_length(&l->w, l->cfg.variant, T, err);
    if (st) return st;
    aft_layer_grads g = {0};
    grads_into(&g, l, grads);
    if (l->opt.tbd) return API_BLAS(backward_tbd(l, &g, dx, y, dy, x, B, T, n, err));
    g.dx = dx;
    return API_BLAS(aft_layer_backward(&g, y, dy, x, &l->w.p, &l->cfg, B, T, err));
}
