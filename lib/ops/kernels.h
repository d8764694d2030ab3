/* kernels.h - the kernels behind aft_op_run, for op.c and the kernel files
 * themselves. Nothing else in lib/ includes this: the rest reaches the
 * kernels through op.h. Every kernel reads a settled operator (spec.h) and
 * decides no rule of its own. This header includes spec.h and the shared
 * basics only, never op.h: the dispatcher calls the kernels, and no kernel
 * calls back into it. */
#ifndef AFT_KERNELS_H
#define AFT_KERNELS_H

#include "spec.h"
#include "sums.h"

/* ---- bias.c: where w[t, t'] comes from */

/* raw bias entry b(t, t2) of a full/local bias (dense, factored, seeded, none) */
float aft_bias_at(const aft_bias *b, size_t t, size_t t2);
/* w_eff[t, j] for j in [j0, j1) of head h (conv) into out[0 .. j1-j0): the
 * variant's bias inside its window, zero outside (on a grid, the 2-D
 * window: t, j in raster order) */
void aft_w_row(const aft_opspec *sp, size_t h, size_t t, size_t j0, size_t j1, float *out);

/* ---- ref.c: the float64 reference, O(T^2 C)
 * out, q, k, v: (T, C) of one batch, rows sp->ldq/ldk/ldv apart (out: C);
 * mask (T, T), 1 = visible, or NULL */
aft_status aft_op_reference(float *out, const float *q, const float *k, const float *v, const uint8_t *mask,
                            const aft_opspec *sp, aft_error *err);

/* ---- full.c: an explicit T x T pattern (full, and any variant under a
 * mask), blocked products; one batch as aft_op_reference */
aft_status aft_op_full(float *out, const float *q, const float *k, const float *v, const uint8_t *mask,
                       const aft_opspec *sp, aft_error *err);
/* A row of exp(w - r), the forward's and the backward's: the largest of
 * w[0..nv) where the mask row (NULL: every column) lets it through, -inf
 * when nothing does; then, on w's row wr[0..tv), exp(w - r) on the nv
 * columns the row may see (up to the diagonal under causality) and 0 on
 * those the mask hides and past nv. Vector loops (a visibility test per
 * entry had kept the backward's scalar: 8% of its samples). */
float aft_full_visible_max(const float *w, size_t nv, const uint8_t *mrow);
void aft_full_exp_row(float *wr, size_t nv, size_t tv, float r, const uint8_t *mrow);

/* ---- simple.c: simple without causality, a softmax average of v per
 * channel; all batches: (B, T, C) */
aft_status aft_op_simple(float *out, const float *q, const float *k, const float *v, size_t B,
                         const aft_opspec *sp, aft_error *err);

/* ---- local_conv.c: local and conv, and simple with causality (a zero band
 * of one row), in O(T s C); all batches: (B, T, C) */
aft_status aft_op_band(float *out, const float *q, const float *k, const float *v, size_t B,
                       const aft_opspec *sp, aft_error *err);
/* the band kernel a chunk of rows at a time: aft_op_rows (op.h) */
typedef struct aft_band_ctx aft_band_ctx;
aft_band_ctx *aft_band_ctx_new(const aft_opspec *sp, size_t rows);
void aft_band_ctx_free(aft_band_ctx *ctx);
int aft_band_rows(aft_band_ctx *ctx, float *out, const float *q, const float *k, const float *v,
                  const aft_opspec *sp, size_t r0, size_t r1, const float *carry_in, float *carry_out,
                  const float *right_in);

/* ---- grid.c: local and conv on a grid (aft_spec_on_grid), in
 * O(H W s^2 C) time and O(H W C) memory; all batches: (B, T, C), keys
 * (B, T, kc) with kc = C, or conv's heads (read where they are) */
aft_status aft_op_grid(float *out, const float *q, const float *k, const float *v, size_t B, size_t kc,
                       const aft_opspec *sp, aft_error *err);

/* ---- the backward pass, each kernel beside its forward (*_grad.c). Each
 * reads and writes io's arrays (aft_grad_io, spec.h) with keys of one
 * channel per value channel; the bias gradient's arrays come zeroed and are
 * added to (but for io.db_set: aft_bias_grad_sets below). */

/* bias_grad.c: the adjoint of aft_w_row: adds dw[0 .. j1-j0) (dL/dw_eff[t, j]
 * for head h) to the entries of db that w_eff[t, j] was read from */
void aft_w_row_grad(const aft_opspec *sp, const aft_bias_grad *db, size_t h, size_t t, size_t j0, size_t j1,
                    const float *dw);
/* Asks the cache for what a band kernel reads of a dense bias for rows
 * [t0, t1) of local's band, and the same entries of its gradient (db, when
 * wanted): a row of each a page apart, which the machine's prefetcher does
 * not reach. Nothing for other biases or variants. */
void aft_band_bias_prefetch(const aft_opspec *sp, const aft_bias_grad *db, size_t t0, size_t t1);
/* the field of db for the bias's kind, zeroed (every kernel adds to it) */
void aft_bias_grad_zero(const aft_opspec *sp, const aft_bias_grad *db);
/* 1 when db needs no zeroing for a run of sp because the kernel's first
 * sequence sets every entry it would add to (io.db_set), and the rest is
 * cleared by aft_bias_grad_zero_unset, or the caller's zero_outside covers
 * it; a dense bias, no mask or grid, and:
 * - full without causality: the first sequence writes all of rows [0, T)
 *   below column T once (64 MiB cleared and then read back to be added to
 *   cost the full backward pass a fortieth of its time at T = 4096); what
 *   is left, the columns from T on and the rows from T on, none at T =
 *   Tmax, is cleared first unless zero_outside;
 * - local with zero_outside: the first head of the first sequence writes
 *   each row's band (aft_w_row_grad_set clears what causality leaves of
 *   it). */
int aft_bias_grad_sets(const aft_opspec *sp, const aft_bias_grad *db);
void aft_bias_grad_zero_unset(const aft_opspec *sp, const aft_bias_grad *db);
/* aft_w_row_grad where aft_bias_grad_sets holds: sets row t's entries
 * [j0, j1) instead (full: with stores that skip the cache; local: j0, j1
 * the row's band as the band kernel has it, and the rest of the window
 * cleared) */
void aft_w_row_grad_set(const aft_opspec *sp, const aft_bias_grad *db, size_t t, size_t j0, size_t j1,
                        const float *dw);
/* whether a backward run of sp has a bias gradient to write into db */
int aft_bias_grad_wanted(const aft_opspec *sp, const aft_bias_grad *db);
/* The parts of db threads cannot share when each owns rows t: factored v
 * and conv. aft_bias_grad_private points *mine at db with those two
 * replaced by zeroed arrays of its own (one block, *blk, NULL when none is
 * needed); aft_bias_grad_merge adds them to db. Returns 0 when out of
 * memory. */
int aft_bias_grad_private(const aft_opspec *sp, const aft_bias_grad *db, aft_bias_grad *mine, float **blk);
/* the floats of one such private copy (0: none) */
size_t aft_bias_grad_private_floats(const aft_opspec *sp, const aft_bias_grad *db);
void aft_bias_grad_merge(const aft_opspec *sp, const aft_bias_grad *db, const aft_bias_grad *mine);
/* A whole copy of what a run of T rows writes into db, for runs over other
 * sequences at the same time (aft_op_grad_run's batch groups): rows below
 * T of dense (tmax wide), u and v, and conv whole. _floats: its size
 * (SIZE_MAX past size_t); _init points *mine into blk (that many floats)
 * and zeroes it; _add adds it to db. */
size_t aft_bias_grad_copy_floats(const aft_opspec *sp, const aft_bias_grad *db);
void aft_bias_grad_copy_init(const aft_opspec *sp, const aft_bias_grad *db, aft_bias_grad *mine, float *blk);
void aft_bias_grad_copy_add(const aft_opspec *sp, const aft_bias_grad *db, const aft_bias_grad *mine);

/* ref_grad.c: float64, O(T^2 C); all batches, the mask from sp->bias */
aft_status aft_op_reference_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                                 const aft_opspec *sp, aft_error *err);
/* the same on contiguous float64 arrays: aft_op_grad_reference_d (op.h) */
aft_status aft_op_reference_grad_d(double *dq, double *dk, double *dv, double *out, const aft_bias_grad *db,
                                   const double *dout, const double *q, const double *k, const double *v,
                                   const aft_opspec *sp, size_t B, size_t kc, aft_error *err);
/* full_grad.c: one batch as aft_op_full (io's arrays from that batch's
 * rows on) */
aft_status aft_op_full_grad(const aft_grad_io *io, const float *q, const float *k, const float *v,
                            const uint8_t *mask, const aft_opspec *sp, aft_error *err);
/* simple_grad.c: simple without causality, all batches */
aft_status aft_op_simple_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                              const aft_opspec *sp, aft_error *err);
/* local_conv_grad.c: local, conv and causal simple, all batches */
aft_status aft_op_band_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                            const aft_opspec *sp, aft_error *err);
/* (its slices: aft_band_grad_slices, spec.h) */

#endif /* AFT_KERNELS_H */
