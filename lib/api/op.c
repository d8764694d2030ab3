/* op.c - the binding interface's bare operator (aft.h, "the bare
 * operator"): its options and bias read and settled as aft run reads a
 * bare operator's --weights, then aft_op_forward or aft_op_backward. */
#include "api.h"
#include "ops/op.h"   /* the saved forward */

#include <string.h>

/* what a call runs: the bias (a one-tensor view of the caller's array,
 * named pos_bias as aft run finds it), the settled configuration */
typedef struct {
    api_options o;
    aft_weights w;
    aft_config cfg;
} op_run;

/* the bias's shape as a file holds it: (rows, cols); conv on a grid, rows
 * of (2S - 1) x (2S - 1) squares: (rows, n, n) when cols is n * n */
static size_t bias_shape(const op_run *r, size_t rows, size_t cols, size_t shape[3])
{
    shape[0] = rows;
    shape[1] = cols;
    size_t n = 1;
    while (n * n < cols) n++;
    if (r->cfg.variant != AFT_CONV || !r->cfg.grid_h || n * n != cols) return 2;
    shape[1] = shape[2] = n;
    return 3;
}

/* the caller's bias (NULL: none, w = 0) checked as aft_bias_load_grid
 * checks a file's, borrowed */
static aft_status load_bias(op_run *r, const float *bias, size_t rows, size_t cols, aft_error *err)
{
    r->w.p.bias.kind = AFT_BIAS_NONE;
    if (!bias) return AFT_OK;
    if (r->o.cfg.variant == AFT_SIMPLE)
        return aft_fail(err, AFT_ERR_ARG, "variant simple reads no position bias: bias must be NULL");
    size_t shape[3], ndim = bias_shape(r, rows, cols, shape);
    const size_t *shapes[1] = {shape};
    const char *names[1] = {"pos_bias"};
    aft_st_file *f;
    aft_status st = aft_st_borrow_f32(&f, 1, names, &bias, &ndim, shapes, err);
    if (st) return st;
    st = aft_bias_load_grid(f, "", r->o.cfg.variant, r->o.cfg.grid_h != 0, &r->w, err);
    aft_st_close(f);
    return st;
}

/* kc against C as aft run checks a bare operator's k */
static aft_status check_keys(const op_run *r, size_t C, size_t kc, aft_error *err)
{
    if (kc == C || (r->cfg.variant == AFT_CONV && kc == r->cfg.heads)) return AFT_OK;
    if (r->o.cfg.variant == AFT_CONV)
        return aft_fail(err, AFT_ERR_ARG, "k has %zu %s; conv needs %zu (one per value channel) or %zu (one per "
                        "head)", kc, aft_noun(kc, "channel", "channels"), C, r->cfg.heads);
    return aft_fail(err, AFT_ERR_ARG, "k has %zu %s but q and v have %zu", kc, aft_noun(kc, "channel", "channels"), C);
}

static aft_status setup(op_run *r, const char *options, size_t B, size_t T, size_t C, size_t kc, const float *bias,
                        size_t bias_rows, size_t bias_cols, const uint8_t *mask, int mask_batched, aft_error *err)
{
    memset(r, 0, sizeof *r);
    size_t n;
    aft_status st = api_options_parse(&r->o, options, API_OP_KEYS, "the operator", err);
    if (!st) st = api_options_check(&r->o, bias != NULL, err);
    if (!st) st = api_floats(B, T, C, &n, "q", err);
    if (!st) st = api_floats(B, T, kc, &n, "k", err);
    r->cfg = r->o.cfg;
    if (!st) st = load_bias(r, bias, bias_rows, bias_cols, err);
    if (st) return st;
    aft_weights_config(&r->cfg, &r->w, (r->o.given & API_WINDOW) != 0, (r->o.given & API_HEADS) != 0);
    r->w.p.bias.mask = mask;
    r->w.p.bias.mask_batched = mask_batched != 0;
    st = aft_config_settle(&r->cfg, &r->w.p.bias, C, kc, err);
    if (!st) st = check_keys(r, C, kc, err);
    if (!st) st = aft_weights_check_length(&r->w, r->cfg.variant, T, err);
    return st;
}

aft_status aft_api_op_forward(float *out, const float *q, const float *k, const float *v, size_t B, size_t T,
                              size_t C, size_t kc, const float *bias, size_t bias_rows, size_t bias_cols,
                              const uint8_t *mask, int mask_batched, const char *options, aft_error *err)
{
    if (!out || !q || !k || !v) return api_null(err, !out ? "out" : !q ? "q" : !k ? "k" : "v");
    op_run r;
    aft_status st = setup(&r, options, B, T, C, kc, bias, bias_rows, bias_cols, mask, mask_batched, err);
    if (!st) st = API_BLAS(aft_op_forward(out, q, k, v, &r.w.p.bias, &r.cfg, B, T, C, kc, err));
    aft_weights_free(&r.w);
    return st;
}

aft_status aft_api_op_backward(float *dq, float *dk, float *dv, float *dbias, float *out, const float *dout,
                               const float *q, const float *k, const float *v, size_t B, size_t T, size_t C,
                               size_t kc, const float *bias, size_t bias_rows, size_t bias_cols, const uint8_t *mask,
                               int mask_batched, const char *options, aft_error *err)
{
    if (!dq || !dk || !dv || !dout || !q || !k || !v)
        return api_null(err, !dq ? "dq" : !dk ? "dk" : !dv ? "dv" : !dout ? "dout" : !q ? "q" : !k ? "k" : "v");
    if (dbias && !bias) return aft_fail(err, AFT_ERR_ARG, "dbias given without a bias: it must be NULL");
    op_run r;
    aft_status st = setup(&r, options, B, T, C, kc, bias, bias_rows, bias_cols, mask, mask_batched, err);
    /* the bias's gradient in its own shape: dense (Tmax, Tmax) or conv's rows */
    aft_bias_grad g = {0};
    if (r.w.p.bias.kind == AFT_BIAS_DENSE) g.dense = dbias;
    else g.conv = dbias;
    if (!st)
        st = API_BLAS(aft_op_backward(dq, dk, dv, dbias ? &g : NULL, out, dout, q, k, v, &r.w.p.bias, &r.cfg, B, T,
                                      C, kc, err));
    aft_weights_free(&r.w);
    return st;
}

/* ---- the saved forward (aft.h): the sums of the dense kernel behind the
 * header of saved.c */

aft_status aft_api_op_saved_size(size_t B, size_t T, size_t C, size_t kc, const float *bias, size_t bias_rows,
                                 size_t bias_cols, const uint8_t *mask, int mask_batched, const char *options,
                                 size_t *n, aft_error *err)
{
    if (!n) return api_null(err, "n");
    op_run r;
    aft_status st = setup(&r, options, B, T, C, kc, bias, bias_rows, bias_cols, mask, mask_batched, err);
    if (!st) st = aft_op_saved_floats(&r.w.p.bias, &r.cfg, B, T, C, kc, n, err);
    if (!st && !aft_add_ok(*n, API_SAVED_HEAD, n)) st = aft_fail(err, AFT_ERR_ARG, "the saved forward overflows");
    aft_weights_free(&r.w);
    return st;
}

/* setup, and n_saved against the size the call takes */
static aft_status saved_setup(op_run *r, size_t n_saved, const char *options, size_t B, size_t T, size_t C,
                              size_t kc, const float *bias, size_t bias_rows, size_t bias_cols, const uint8_t *mask,
                              int mask_batched, aft_error *err)
{
    size_t want = 0;
    aft_status st = setup(r, options, B, T, C, kc, bias, bias_rows, bias_cols, mask, mask_batched, err);
    if (!st) st = aft_op_saved_floats(&r->w.p.bias, &r->cfg, B, T, C, kc, &want, err);
    if (!st && want + API_SAVED_HEAD != n_saved)
        st = aft_fail(err, AFT_ERR_ARG, "saved holds %zu floats, the operator's saved forward of B = %zu, T = %zu "
                      "takes %zu", n_saved, B, T, want + API_SAVED_HEAD);
    return st;
}

aft_status aft_api_op_forward_saved(float *out, float *saved, size_t n_saved, const float *q, const float *k,
                                    const float *v, size_t B, size_t T, size_t C, size_t kc, const float *bias,
                                    size_t bias_rows, size_t bias_cols, const uint8_t *mask, int mask_batched,
                                    const char *options, aft_error *err)
{
    if (!out || !saved || !q || !k || !v)
        return api_null(err, !out ? "out" : !saved ? "saved" : !q ? "q" : !k ? "k" : "v");
    op_run r;
    aft_status st = saved_setup(&r, n_saved, options, B, T, C, kc, bias, bias_rows, bias_cols, mask, mask_batched,
                                err);
    if (!st) api_saved_mark(saved, B * T, 0);
    if (!st)
        st = API_BLAS(aft_op_forward_saved(out, saved + API_SAVED_HEAD, q, k, v, &r.w.p.bias, &r.cfg, B, T, C, kc,
                                           err));
    if (!st) api_saved_mark(saved, B * T, 1);
    aft_weights_free(&r.w);
    return st;
}

aft_status aft_api_op_backward_saved(float *dq, float *dk, float *dv, float *dbias, const float *dout, const float *q,
                                     const float *k, const float *v, const float *saved, size_t n_saved, size_t B,
                                     size_t T, size_t C, size_t kc, const float *bias, size_t bias_rows,
                                     size_t bias_cols, const uint8_t *mask, int mask_batched, const char *options,
                                     aft_error *err)
{
    if (!dq || !dk || !dv || !dout || !q || !k || !v || !saved)
        return api_null(err, !dq ? "dq" : !dk ? "dk" : !dv ? "dv" : !dout ? "dout" : !q ? "q" : !k ? "k" : !v ? "v"
                                                                                                            : "saved");
    if (dbias && !bias) return aft_fail(err, AFT_ERR_ARG, "dbias given without a bias: it must be NULL");
    op_run r;
    aft_status st = saved_setup(&r, n_saved, options, B, T, C, kc, bias, bias_rows, bias_cols, mask, mask_batched,
                                err);
    if (!st) st = api_saved_check(saved, B * T, B, T, err);
    aft_bias_grad g = {0};
    if (r.w.p.bias.kind == AFT_BIAS_DENSE) g.dense = dbias;
    else g.conv = dbias;
    if (!st)
        st = API_BLAS(aft_op_backward_saved(dq, dk, dv, dbias ? &g : NULL, dout, q, k, v, saved + API_SAVED_HEAD,
                                            &r.w.p.bias, &r.cfg, B, T, C, kc, err));
    aft_weights_free(&r.w);
    return st;
}
