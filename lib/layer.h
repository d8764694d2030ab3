/* layer.h - the layer inside lib/: its weights packed once, its chunked
 * paths, and what a causal run carries from one call to the next. */
#ifndef AFT_LAYER_H
#define AFT_LAYER_H

#include "nn/linear.h"
#include "ops/op.h"

/* rows per chunk of the layer's chunked paths with aft's own projection
 * kernel (4 times as many with OpenBLAS's) */
#ifndef AFT_LAYER_PIPE_ROWS
#define AFT_LAYER_PIPE_ROWS 96
#endif
#define AFT_LAYER_CHUNK_AUTO SIZE_MAX
/* pieces of rows a thread, for each of the layer backward's row products
 * (layer_grad.c): more even out the threads' ends, but each packs the
 * product's right-hand side again */
enum { AFT_GRAD_PIECES_PER_THREAD = 4 };
/* aft_layer_forward_timed with chunks of `chunk` rows for the chunked
 * paths (0: never chunked; AFT_LAYER_CHUNK_AUTO: the sizes above);
 * *streamed_out (when not NULL) = 1 when such a path produced y. Tests
 * pass small chunks. */
aft_status aft_layer_forward_chunked(float *y, const float *x, const aft_params *p,
                                     const aft_config *cfg, size_t B, size_t T, size_t chunk,
                                     aft_layer_times *times, int *streamed_out, aft_error *err);

/* The layer's products: Q, K, V stacked into one (rows of W: C for Q, KC for
 * K, C for V, in that order: X is read once and the product is wide enough
 * to run near the machine's peak) and the output projection, packed once
 * (linear.c). p must outlive it. */
typedef struct {
    const aft_params *p;
    size_t D, C, KC, W;   /* W = 2C + KC, a row of the stacked product */
    float *wcat, *bcat;
    aft_linear qkv, o;
    aft_kernel kernel;    /* who runs the projections */
    int threads;
} aft_layer_prep;
/* checks p's sizes and pointers; threads >= 1 */
aft_status aft_layer_prep_init(aft_layer_prep *lp, const aft_params *p, aft_kernel kernel, int threads,
                               aft_error *err);
void aft_layer_prep_free(aft_layer_prep *lp);
/* the rows of the chunked paths' chunks, before the halo rounds them up: a
 * few tiles of the products with aft's kernel, or OpenBLAS's larger blocks
 * (it packs W again on every call) */
static inline size_t aft_layer_step(const aft_layer_prep *lp)
{
    return lp->qkv.pk ? AFT_LAYER_PIPE_ROWS : 4 * AFT_LAYER_PIPE_ROWS;
}

/* What a causal run leaves for the next, per sequence: the sums (sums.h) of
 * the keys before row pos - kept, and K | V of the `kept` rows before pos,
 * kept = min(pos, keep) (keep: the band's halo; SIZE_MAX for full, which
 * needs every past row). NULL where a run starts from nothing. */
typedef struct {
    size_t pos;      /* rows already run */
    size_t keep;
    size_t cap;      /* rows of kv room per sequence (>= off + kept) */
    size_t off;      /* the kept rows start at row off of each sequence's room
                      * (new rows go after them; they move to 0 when the
                      * room runs out, rarely, instead of at every step) */
    float *carry;    /* (B, 4C) */
    float *kv;       /* (B, cap, 2C): kept row i of sequence b at
                      * kv + (b cap + off + i) 2C, its key (C floats, one per
                      * value channel) then its value */
} aft_layer_carry;
static inline size_t aft_carry_kept(const aft_layer_carry *lc)
{
    return lc->pos < lc->keep ? lc->pos : lc->keep;
}

/* The chunked paths (layer_chunks.c): no mask, a band with keys of one
 * channel per value channel and a window no wider than a chunk (causal:
 * the pipeline; not causal: both-sided), or simple without causality. With
 * lc (causal only) the pipeline continues from lc and leaves its rows and
 * sums there; sp's positions are then lc->pos on. Returns 1 when done, 0
 * when not applicable, -2 when a key was +inf or NaN (y, and lc, are then
 * unusable), -1 on error (*st). */
int aft_layer_chunked(float *y, const float *x, const aft_layer_prep *lp, const aft_opspec *sp, size_t B,
                      size_t T, size_t chunk, aft_layer_times *tm, aft_layer_carry *lc, aft_status *st,
                      aft_error *err);

/* A streaming state (state.c) back at position 0, as aft_state_new left
 * it, its room and packed weights kept: for the model, which starts its
 * layers' states again when its context moves on. */
void aft_state_reset(aft_state *s);

#endif /* AFT_LAYER_H */
