/* layer_chunks.h - the layer a chunk of rows at a time (layer_chunks.c),
 * and what its paths read: the layer's weights packed once (aft_layer_prep,
 * which layer.c makes and every path of the layer runs) and the carry of a
 * causal run (carry.h). layer.c and state.c call down into these paths;
 * the paths call nothing of theirs. */
#ifndef AFT_LAYER_CHUNKS_H
#define AFT_LAYER_CHUNKS_H

#include "carry.h"
#include "nn/linear.h"
#include "ops/op.h"

/* rows per chunk of the layer's chunked paths with aft's own projection
 * kernel (4 times as many with OpenBLAS's) */
#ifndef AFT_LAYER_PIPE_ROWS
#define AFT_LAYER_PIPE_ROWS 96
#endif
#define AFT_LAYER_CHUNK_AUTO SIZE_MAX

/* The layer's products: Q, K, V stacked into one (rows of W: C for Q, KC for
 * K, C for V, in that order: X is read once and the product is wide enough
 * to run near the machine's peak) and the output projection, packed once
 * (linear.c; aft_layer_prep_init, layer.h). p must outlive it. */
typedef struct {
    const aft_params *p;
    size_t D, C, KC, W;   /* W = 2C + KC, a row of the stacked product */
    void *wcat;           /* the stacked W, in p->w_dtype's values (16 bits
                           * kept as stored) */
    float *bcat;
    aft_linear qkv, o;
    aft_kernel kernel;    /* who runs the projections */
    int threads;
    int bf16;             /* the projections in bf16 (aft_config.precision, with an engine) */
    /* aft_layer_prep_grad: the backward's dH = dy Wo and dX = dQKV Wcat on
     * aft's kernel, Wo and Wcat packed as its weights (from W^T), made once
     * for the many backward calls of one set of weights */
    aft_linear dh_t, dx_t;
    int has_t;
} aft_layer_prep;
/* a projection of lp's kind (its kernel, or bf16): W (n x k) of wdt's
 * values (AFT_F32, AFT_F16, AFT_BF16: 16 bits kept as stored), bias (n) or
 * NULL (layer.c) */
aft_status aft_layer_prep_linear(const aft_layer_prep *lp, aft_linear *l, const void *w, aft_dtype wdt,
                                 const float *bias, size_t n, size_t k, int threads, aft_error *err);
/* the rows of the chunked paths' chunks, before the halo rounds them up: a
 * few tiles of the products with aft's kernels (float32 or bf16: W packed
 * once), or OpenBLAS's larger blocks (it packs W again on every call) */
static inline size_t aft_layer_step(const aft_layer_prep *lp)
{
    return lp->qkv.pk || lp->qkv.pk16 ? AFT_LAYER_PIPE_ROWS : 4 * AFT_LAYER_PIPE_ROWS;
}

/* wog (D x C) = Wo with column c scaled by avg[c] = s1 / s0 of sums' channel
 * c (sums.h's 4C floats; 0 where s0 is 0), the softmax average of v: the
 * simple variant's output projection (layer_chunks.c, slice.c). 16-bit
 * weights are widened as read: the same values. avg (C floats) may be sums
 * itself: it overwrites m, which is not read. */
static inline void aft_wo_scaled(float *wog, float *avg, const float *sums, const aft_params *p, size_t D, size_t C)
{
    for (size_t c = 0; c < C; c++) avg[c] = sums[C + c] > 0.0f ? sums[2 * C + c] / sums[C + c] : 0.0f;
    if (aft_dtype_is16(p->w_dtype))
        for (size_t d = 0; d < D; d++)
            for (size_t c = 0; c < C; c++) wog[d * C + c] = aft_w_at(p->wo, p->w_dtype, d * C + c) * avg[c];
    else
        for (size_t d = 0; d < D; d++)
            for (size_t c = 0; c < C; c++) wog[d * C + c] = p->wo[d * C + c] * avg[c];
}

/* The chunked paths: no mask, a band with keys of one channel per value
 * channel and a window no wider than a chunk (causal: the pipeline; not
 * causal: both-sided), or simple without causality. With lc (causal only)
 * the pipeline continues from lc and leaves its rows and sums there; sp's
 * positions are then lc->pos on. Each chunk done advances sp->progress by
 * its rows. Returns 1 when done, 0 when not
 * applicable, -2 when a key was +inf or NaN (y, and lc, are then unusable),
 * -1 on error (*st). */
int aft_layer_chunked(float *y, const float *x, const aft_layer_prep *lp, const aft_opspec *sp, size_t B,
                      size_t T, size_t chunk, aft_layer_times *tm, aft_layer_carry *lc, aft_status *st,
                      aft_error *err);

#endif /* AFT_LAYER_CHUNKS_H */
