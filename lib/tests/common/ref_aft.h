/*
 * ref_aft.h - an independent float64 reference of the AFT operator and layer,
 * for the tests only. Written from the maths (Zhai et al. 2021), not from
 * lib/kernels*.c: plain loops, O(B T^2 C), every intermediate in double.
 *
 * For batch b, query t, channel c:
 *   Y[t,c] = sigmoid(Q[t,c]) * sum_{t' visible} exp(K[t',c] + w[t,t']) V[t',c]
 *                            / sum_{t' visible} exp(K[t',c] + w[t,t'])
 * computed as exp(K + w - M) with M the maximum of K + w over the visible t',
 * so the reference is exact (to double rounding) wherever the maths is
 * finite. A (t,c) with no visible t' gives 0.
 */
#ifndef REF_AFT_H
#define REF_AFT_H

#include "aft.h"

#include <stddef.h>

/* Is (t, t2) usable by query t of batch b? Causal keeps t2 <= t; an explicit
 * mask (1 = visible) of shape (T, T), or (B, T, T) when mask_batched, further
 * restricts it. */
int ref_aft_visible(const aft_bias *bias, const aft_config *cfg, size_t b,
                    size_t T, size_t t, size_t t2);

/* The position bias w[t,t'] the variant in cfg uses, for head `head` (only
 * conv looks at it; pass 0 otherwise). Outside a local or conv window the
 * bias is 0, not -inf: those positions stay visible with no bias. On a grid
 * (cfg->grid_w > 0) the window is 2-D around t in raster order, and conv's
 * bias is (heads, 2s-1, 2s-1). */
double ref_aft_bias_entry(const aft_bias *bias, const aft_config *cfg,
                          size_t head, size_t t, size_t t2);

/* Returns 0 if (cfg, bias, C, kc) describe a computation the maths defines,
 * else -1 (the reference refuses; the tests use this to catch their own
 * mistakes, it is not a model of the library's argument checks). */
int ref_aft_check(const aft_bias *bias, const aft_config *cfg, size_t T,
                  size_t C, size_t kc);

/* out: (B, T, C)   q, v: (B, T, C)   k: (B, T, kc), kc == C, or kc == heads
 * for conv (k[b,t,i] shared by the channels of head i). Double inputs, so the
 * layer reference can feed its double projections straight in. Returns 0, or
 * -1 when ref_aft_check refuses or memory runs out. */
int ref_aft_op_d(double *out, const double *q, const double *k, const double *v,
                 const aft_bias *bias, const aft_config *cfg, size_t B, size_t T,
                 size_t C, size_t kc);

/* Same with the float inputs aft_op_forward takes (each widened exactly). */
int ref_aft_op(double *out, const float *q, const float *k, const float *v,
               const aft_bias *bias, const aft_config *cfg, size_t B, size_t T,
               size_t C, size_t kc);

/* y: (B, T, D)   x: (B, T, D). Q = x Wq^T + bq, K = x Wk^T + bk,
 * V = x Wv^T + bv (W row-major (out, in), NULL bias = none), then
 * y = AFT(Q, K, V) Wo^T + bo, all in double. Returns 0 or -1 as above. */
int ref_aft_layer(double *y, const float *x, const aft_params *p,
                  const aft_config *cfg, size_t B, size_t T);

/* sigmoid in double without overflow for any finite or infinite q */
double ref_sigmoid(double q);

#endif
