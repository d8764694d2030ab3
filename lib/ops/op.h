/* op.h - the AFT operator as the rest of lib/ sees it (op.c). Callers outside
 * the kernels (the layer, and whatever holds only part of a sequence at a
 * time) reach the kernels through these entry points alone, with an
 * operator settled by spec.h's rules. */
#ifndef AFT_OP_H
#define AFT_OP_H

#include "spec.h"
#include "sums.h"

/* aft_op_forward for a settled operator, with sp's row strides: out
 * (B, T, C) contiguous; q row t of batch b at q + (b T + t) ldq, likewise
 * k and v. kc: key channels (C, or conv's heads). */
aft_status aft_op_run(float *out, const float *q, const float *k, const float *v, const aft_opspec *sp,
                      size_t B, size_t kc, aft_error *err);

/* aft_op_forward for a caller that took the rows on cfg->progress itself
 * (aft_progress_plan): they are counted as done, not taken on again */
aft_status aft_op_forward_counted(float *out, const float *q, const float *k, const float *v, const aft_bias *bias,
                                  const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc, aft_error *err);

/* ---- the operator a chunk of rows at a time
 *
 * What a caller holding part of a sequence can do: AFT_ROWS_CAUSAL (the
 * causal band: local, conv, simple), AFT_ROWS_BAND (local or conv without
 * causality) and AFT_ROWS_GLOBAL (simple without causality: one softmax
 * average of v per channel). AFT_ROWS_NONE: only whole sequences (full, a
 * mask, keys of one channel per head, the reference). */
typedef enum { AFT_ROWS_NONE, AFT_ROWS_CAUSAL, AFT_ROWS_GLOBAL, AFT_ROWS_BAND } aft_rows_kind;
aft_rows_kind aft_op_rows_kind(const aft_opspec *sp, size_t kc);

/* Sequences shorter than AFT_GROUP_BELOW_T rows run whole, a group of them
 * a thread, where each split over the threads costs a parallel region and
 * its waits for a few rows' work: the groups for B sequences of T rows on
 * `threads` threads (1: none, each sequence split over the threads). */
enum { AFT_GROUP_BELOW_T = 256 };
size_t aft_batch_groups(int threads, size_t B, size_t T);

/* For the groups' parallel regions: s (with e) becomes the region's error
 * if it is the first one (*st still AFT_OK); aft_first_error_seen tells the
 * threads to skip what is left. */
static inline void aft_first_error(aft_status *st, aft_error *err, aft_status s, const aft_error *e)
{
    if (s == AFT_OK) return;
    #pragma omp critical(aft_first_error)
    {
        aft_status first;
        #pragma omp atomic read
        first = *st;
        if (first == AFT_OK) {
            if (err) *err = *e;
            #pragma omp atomic write
            *st = s;
        }
    }
}

static inline int aft_first_error_seen(const aft_status *st)
{
    aft_status seen;
    #pragma omp atomic read
    seen = *st;
    return seen != AFT_OK;
}

/* One thread's scratch for chunks of up to `rows` rows (NULL: out of memory). */
typedef struct aft_op_rows_ctx aft_op_rows_ctx;
aft_op_rows_ctx *aft_op_rows_new(const aft_opspec *sp, size_t rows);
void aft_op_rows_free(aft_op_rows_ctx *ctx);

/* Rows [r0, r1) of one sequence on the calling thread (AFT_ROWS_CAUSAL and
 * AFT_ROWS_BAND). k and v hold the sequence's rows from sp->t_off on,
 * sp->T of them (row t: row sp->t_off + t of the sequence); rows before r0
 * must be at least aft_spec_halo(sp) of them unless t_off is 0. q and out hold
 * rows from sp->q_row0 on. carry_in (NULL when t_off is 0) and carry_out
 * (NULL: not wanted; it may equal carry_in) are sums (sums.h) of sp->C
 * channels: the keys before local row 0, and after this call before row
 * r1 - halo. Without causality k and v must hold every row before r1 + halo
 * (or to the end), and right_in (NULL: none) holds the sums of the keys from
 * r1 + halo on. Returns 0 when a key of rows [r0, r1) is +inf or NaN (what
 * it wrote, carry_out included, is then unusable, and the caller must run
 * the whole sequence through aft_op_run), 1 when done. */
int aft_op_rows(aft_op_rows_ctx *ctx, float *out, const float *q, const float *k, const float *v,
                const aft_opspec *sp, size_t r0, size_t r1, const float *carry_in, float *carry_out,
                const float *right_in);

/* ---- the backward pass (aft_op_backward): the arrays of aft_grad_io (spec.h) */

/* aft_op_backward for a settled operator, with sp's row strides for q, k, v
 * and io's for the gradients; reference: the float64 kernel */
aft_status aft_op_grad_run(const aft_grad_io *io, const float *q, const float *k, const float *v,
                           const aft_opspec *sp, size_t B, size_t kc, int reference, aft_error *err);
/* The bare operator's saved forward: aft_op_forward_saved gives out
 * (aft_op_backward's out: aft_op_forward's to rounding) and keeps in saved
 * (n floats, aft_op_saved_floats: 0 unless the backward runs the dense
 * kernel or the causal band kernel with a band) the sums
 * aft_op_backward_saved then takes instead of their product:
 * aft_op_backward's gradients bit for bit. */
aft_status aft_op_saved_floats(const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                               size_t *n, aft_error *err);
aft_status aft_op_forward_saved(float *out, float *saved, const float *q, const float *k, const float *v,
                                const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                                aft_error *err);
aft_status aft_op_backward_saved(float *dq, float *dk, float *dv, const aft_bias_grad *dbias, const float *dout,
                                 const float *q, const float *k, const float *v, const float *saved,
                                 const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                                 aft_error *err);
/* Does aft_op_grad_run take io's saved sums (AFT_SUMS_WRITE, _READ) for
 * sp on B sequences: the dense kernel and the causal band kernel, (B, T,
 * 2C) floats of them? */
int aft_op_grad_saves(const aft_opspec *sp, size_t B, int reference);

/* The float64 backward pass (what the reference impl runs) on contiguous
 * float64 arrays, for the layer's float64 reference: dq, dv, out (NULL: not
 * wanted), dout, q, v (B, T, C); dk, k (B, T, kc). db as aft_op_backward's. */
aft_status aft_op_grad_reference_d(double *dq, double *dk, double *dv, double *out, const aft_bias_grad *db,
                                   const double *dout, const double *q, const double *k, const double *v,
                                   const aft_opspec *sp, size_t B, size_t kc, aft_error *err);

#endif /* AFT_OP_H */
