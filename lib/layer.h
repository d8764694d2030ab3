/* layer.h - the layer inside lib/ (layer.c, layer_grad.c): its weights
 * packed once and its paths; the chunked paths are layer_chunks.h's, the
 * streaming carry carry.h's. */
#ifndef AFT_LAYER_H
#define AFT_LAYER_H

#include "layer_chunks.h"

/* pieces of rows a thread, for each of the layer backward's row products
 * (layer_grad.c): more even out the threads' ends, but each packs the
 * product's right-hand side again */
enum { AFT_GRAD_PIECES_PER_THREAD = 4 };
/* aft_layer_forward_timed with chunks of `chunk` rows for the chunked
 * paths (0: never chunked; AFT_LAYER_CHUNK_AUTO: layer_chunks.h's sizes);
 * *streamed_out (when not NULL) = 1 when such a path produced y. Tests
 * pass small chunks. */
aft_status aft_layer_forward_chunked(float *y, const float *x, const aft_params *p,
                                     const aft_config *cfg, size_t B, size_t T, size_t chunk,
                                     aft_layer_times *times, int *streamed_out, aft_error *err);

/* aft_layer_forward for a caller that took the rows on cfg->progress
 * itself (the model, for all its layers at once): they are counted as
 * done, not taken on again */
aft_status aft_layer_forward_counted(float *y, const float *x, const aft_params *p, const aft_config *cfg, size_t B,
                                     size_t T, aft_error *err);

/* aft_layer_prep (layer_chunks.h) for p: checks p's sizes and pointers;
 * threads >= 1; the projections in bf16 when precision asks for it and
 * the CPU has an engine */
aft_status aft_layer_prep_init(aft_layer_prep *lp, const aft_params *p, aft_kernel kernel, aft_precision precision,
                               int threads, aft_error *err);
void aft_layer_prep_free(aft_layer_prep *lp);
/* p with 16-bit weights (w_dtype AFT_F16, AFT_BF16) as float32: *out is p
 * with wq, wk, wv, wo widened into *mem (one block; free it), for the
 * float64 references and the backward's products from W^T; p's own
 * weights are already float32: *out = p, *mem = NULL */
aft_status aft_params_widen(aft_params *out, float **mem, const aft_params *p, aft_error *err);

/* The saved forward (layer_grad.c): aft_layer_forward_saved gives y
 * (aft_layer_backward's y: aft_layer_forward's to rounding) and keeps in
 * saved (n floats, aft_layer_saved_floats: 0 for the reference) what
 * aft_layer_backward_saved then takes instead of computing it again: Q, K,
 * V and, where the operator's backward runs the dense kernel, its sums.
 * The gradients are aft_layer_backward's, bit for bit, for the same p, cfg,
 * x and dy; saved must be the forward's of the same. */
/* ws: where their temporaries go, kept by a caller that calls again and
 * again (the model's training steps: no page faults each call), grown as
 * needed and freed by aft_layer_ws_free; NULL: each call's own. */
typedef struct {
    void *mem;
    size_t cap;   /* bytes */
} aft_layer_ws;
void aft_layer_ws_free(aft_layer_ws *ws);
aft_status aft_layer_saved_floats(const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t *n,
                                  aft_error *err);
aft_status aft_layer_forward_saved(float *y, float *saved, const float *x, const aft_params *p,
                                   const aft_config *cfg, size_t B, size_t T, aft_layer_ws *ws, aft_error *err);
aft_status aft_layer_backward_saved(const aft_layer_grads *g, const float *saved, const float *dy, const float *x,
                                    const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                                    aft_layer_ws *ws, aft_error *err);
/* The same two on lp, made once by aft_layer_prep_init (with cfg's
 * projections, precision and threads) and, for the backward, by
 * aft_layer_prep_grad, whose packed weights it adds: for a caller that
 * runs many calls on one set of weights. The same bits as the calls above;
 * fast (not the reference) and at least one row. */
aft_status aft_layer_prep_grad(aft_layer_prep *lp, aft_error *err);
aft_status aft_layer_forward_saved_prep(float *y, float *saved, const float *x, const aft_layer_prep *lp,
                                        const aft_config *cfg, size_t B, size_t T, aft_layer_ws *ws, aft_error *err);
aft_status aft_layer_backward_saved_prep(const aft_layer_grads *g, const float *saved, const float *dy,
                                         const float *x, const aft_layer_prep *lp, const aft_config *cfg, size_t B,
                                         size_t T, aft_layer_ws *ws, aft_error *err);

#endif /* AFT_LAYER_H */
