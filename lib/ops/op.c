/* op.c - the AFT operator's one entry point: which kernel runs.
 *
 * The rules of a configuration are spec.c's: aft_spec_settle checks the
 * arguments and turns a configuration into the aft_opspec every kernel
 * reads. aft_op_run then picks the kernel:
 *   reference impl            -> ref.c (float64, O(T^2 C))
 *   simple without causality  -> simple.c (O(T C))
 *   local, conv on a grid     -> grid.c (O(H W s^2 C)), unless such a mask
 *   local, conv, causal simple -> local_conv.c (O(T s C)), unless a mask that is
 *                                neither all-visible nor exactly causal is given
 *   full, or any masked run   -> full.c (blocked products, O(T^2 C))
 * and aft_op_rows gives callers that hold part of a sequence the band kernel
 * a chunk of rows at a time. aft_op_backward picks the backward kernels the
 * same way, each in the *_grad.c beside its forward. Calls go down, to the
 * kernels and spec.c, never back: no kernel calls this file. */
#include "kernels.h"
#include "op.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Does this batch's mask (combined with causality) equal plain causality
 * (*is_causal) or see everything (*all)? Then the mask adds nothing and the
 * fast kernels apply. */
static void classify_mask(const uint8_t *m, size_t T, int causal, int *all, int *is_causal)
{
    *all = !causal;
    *is_causal = 1;
    for (size_t t = 0; t < T && (*all || *is_causal); t++)
        for (size_t j = 0; j < T; j++) {
            int vis = m[t * T + j] != 0 && !(causal && j > t);
            if (!vis) *all = 0;
            if (vis != (j <= t)) *is_causal = 0;
        }
}

/* each batch through a one-batch kernel (the reference, full) */
static aft_status per_batch(float *out, const float *q, const float *k, const float *v, const aft_opspec *sp,
                            size_t B, const uint8_t *mask, int batched, int reference, aft_error *err)
{
    const size_t T = sp->T, TC = T * sp->C;
    aft_status st = AFT_OK;
    for (size_t b = 0; b < B && !st; b++) {
        size_t mrows = sp->q_row1 ? sp->q_row1 - sp->q_row0 : T;   /* rows of the mask a batch holds */
        const uint8_t *m = mask ? mask + (batched ? b * mrows * (sp->mask_ld ? sp->mask_ld : T) : 0) : NULL;
        const float *qb = q + b * T * sp->ldq, *kb = k + b * T * sp->ldk, *vb = v + b * T * sp->ldv;
        st = reference ? aft_op_reference(out + b * TC, qb, kb, vb, m, sp, err)
                       : aft_op_full(out + b * TC, qb, kb, vb, m, sp, err);
    }
    return st;
}

/* A mask that is all-visible or exactly causal is dropped for the fast
 * kernels (sp->causal set for the latter); returns whether the mask is
 * needed. */
static int mask_needed(aft_opspec *sp, size_t B)
{
    const aft_bias *bias = sp->bias;
    if (!bias->mask) return 0;
    size_t nm = bias->mask_batched ? B : 1;
    int all_all = 1, all_causal = 1;
    for (size_t b = 0; b < nm; b++) {
        int a, c;
        classify_mask(bias->mask + b * sp->T * sp->T, sp->T, sp->causal, &a, &c);
        all_all &= a;
        all_causal &= c;
    }
    if (all_causal) sp->causal = 1;
    return !all_causal && !all_all;
}

/* batches [b0, b0 + B) through the fast kernel for sp */
static aft_status fast_kernel(float *out, const float *q, const float *k, const float *v, const aft_opspec *sp,
                              size_t b0, size_t B, int dense_mask, aft_error *err)
{
    const size_t T = sp->T, C = sp->C;
    out += b0 * T * C;
    q += b0 * T * sp->ldq;
    k += b0 * T * sp->ldk;
    v += b0 * T * sp->ldv;
    if (dense_mask || sp->variant == AFT_FULL) {
        const aft_bias *bias = sp->bias;
        const uint8_t *m = dense_mask ? bias->mask : NULL;
        /* a batched mask from batch b0 on, as per_batch steps through it
         * (a slice's rows are never split into groups) */
        if (m && bias->mask_batched) m += b0 * T * (sp->mask_ld ? sp->mask_ld : T);
        return per_batch(out, q, k, v, sp, B, m, bias->mask_batched, 0, err);
    }
    /* per_batch's kernels count their rows themselves; these are counted
     * when done (O(T s C): none is long for its rows) */
    aft_status st = sp->zero_bias && !sp->causal ? aft_op_simple(out, q, k, v, B, sp, err)
                    : aft_spec_on_grid(sp)       ? aft_op_grid(out, q, k, v, B, sp->C, sp, err)
                                                 : aft_op_band(out, q, k, v, B, sp, err);
    if (st == AFT_OK) aft_progress_done(sp->progress, B * T);
    return st;
}

size_t aft_batch_groups(int threads, size_t B, size_t T)
{
    size_t nt = threads > 1 ? (size_t)threads : 1;
    return T >= AFT_GROUP_BELOW_T || B < 2 ? 1 : B < nt ? B : nt;
}

/* the groups of whole sequences for sp (1: none); never a slice's rows or
 * a grid's images, whose kernels split them their own way */
static size_t op_groups(const aft_opspec *sp, size_t B)
{
    return sp->q_row1 || aft_spec_on_grid(sp) ? 1 : aft_batch_groups(sp->threads, B, sp->T);
}

static aft_status grouped(float *out, const float *q, const float *k, const float *v, const aft_opspec *sp,
                          size_t B, size_t ng, int dense_mask, aft_error *err)
{
    aft_opspec one = *sp;
    one.threads = 1;
    aft_status st = AFT_OK;
    #pragma omp parallel for schedule(static, 1) num_threads((int)ng)
    for (size_t g = 0; g < ng; g++) {
        aft_error e;
        size_t b0 = B * g / ng, b1 = B * (g + 1) / ng;
        aft_first_error(&st, err, fast_kernel(out, q, k, v, &one, b0, b1 - b0, dense_mask, &e), &e);
    }
    return st;
}

static aft_status run_kernel(float *out, const float *q, const float *k, const float *v, aft_opspec *sp,
                             size_t B, int reference, aft_error *err)
{
    const aft_bias *bias = sp->bias;
    if (reference) return per_batch(out, q, k, v, sp, B, bias->mask, bias->mask_batched, 1, err);

    /* a mask's rows only (a slice's) are taken as they are */
    int dense_mask = bias->mask && sp->q_row1 ? 1 : mask_needed(sp, B);
    size_t ng = op_groups(sp, B);
    if (ng > 1) return grouped(out, q, k, v, sp, B, ng, dense_mask, err);
    return fast_kernel(out, q, k, v, sp, 0, B, dense_mask, err);
}

/* ---- NaN keys
 *
 * A NaN key at t' makes every output (t, c) whose sum holds it NaN: channel
 * c of each row t that sees t' (not masked, not after t under causality),
 * whatever w[t, t'] is (NaN + -inf is NaN, as 0 * a NaN value is). The fast
 * kernels' maxima skip a NaN (no value compares larger) and their
 * exponentials of keys less a maximum may drop one, so they run on keys
 * whose NaNs are -inf, which reach nothing, and the entries the NaNs reach
 * are made NaN afterwards. One scan of the keys finds them; keys without
 * NaN run as before, the same bits. The float64 reference keeps NaN itself
 * (ref.c, ref_grad.c). */

/* key (row bt, channel c) of keys with kc channels, rows ld apart, each of
 * C / kc channels sharing one */
static inline float key_at(const float *k, size_t ld, size_t kc, size_t C, size_t bt, size_t c)
{
    return k[bt * ld + c / (C / kc)];
}

/* whether n rows of kc keys, rows ld apart, hold a NaN: read at the
 * memory's rate, on `threads` threads when there are many */
static int keys_have_nan(const float *k, size_t n, size_t kc, size_t ld, int threads)
{
    unsigned bad = 0;
    #pragma omp parallel for num_threads(n * kc >= ((size_t)1 << 16) ? threads : 1) reduction(|:bad) schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float *kr = k + i * ld;
        for (size_t c = 0; c < kc; c++) bad |= kr[c] != kr[c];
    }
    return bad != 0;
}

/* keys_have_nan, and *tame: whether every key is at most AFT_TAME_BOUND in
 * size (the band backward's own check, made in this one pass over the
 * keys); the keys are read a second time, for NaN, only when one is not */
static int keys_scan(const float *k, size_t n, size_t kc, size_t ld, int threads, int *tame)
{
    unsigned big = 0;
    #pragma omp parallel for num_threads(n * kc >= ((size_t)1 << 16) ? threads : 1) reduction(|:big) schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float *kr = k + i * ld;
        for (size_t c = 0; c < kc; c++) big |= !(fabsf(kr[c]) <= AFT_TAME_BOUND);
    }
    *tame = big == 0;
    return big && keys_have_nan(k, n, kc, ld, threads);
}

/* the keys, one per channel, with NaN as -inf: (n, C) contiguous */
static float *keys_without_nan(const float *k, size_t n, size_t kc, size_t C, size_t ld)
{
    float *kc_out = aft_alloc_array(n, C * sizeof(float));
    if (!kc_out) return NULL;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < C; c++) {
            float x = key_at(k, ld, kc, C, i, c);
            kc_out[i * C + c] = x != x ? -INFINITY : x;
        }
    return kc_out;
}

/* The rows a NaN key reaches, for each channel of one sequence. */
typedef struct {
    const aft_opspec *sp;
    const uint8_t *mask;   /* this sequence's rows of the mask, or NULL */
    size_t mld;            /* its row length */
    size_t row0, row1;     /* the query rows held: [row0, row1) */
    size_t *nanpos;        /* scratch: T positions */
    uint8_t *reached;      /* (row1 - row0): whether row t (from row0) is reached */
} nan_reach;

static int sees(const nan_reach *r, size_t t, size_t j)
{
    return !(r->sp->causal && j > t) && (!r->mask || r->mask[(t - r->row0) * r->mld + j]);
}

/* fills r->reached for channel c of keys kb (the sequence's rows, ld
 * apart); returns the rows reached */
static size_t reach_rows(nan_reach *r, const float *kb, size_t ld, size_t kc, size_t c)
{
    const size_t T = r->sp->T, C = r->sp->C;
    size_t np = 0, nr = 0;
    for (size_t j = 0; j < T; j++)
        if (isnan(key_at(kb, ld, kc, C, j, c))) r->nanpos[np++] = j;
    for (size_t t = r->row0; t < r->row1; t++) {
        int hit = 0;
        if (!r->mask) {
            hit = np > 0 && !(r->sp->causal && r->nanpos[0] > t);   /* the first NaN key is the earliest */
        } else {
            for (size_t p = 0; p < np && !hit; p++) hit = sees(r, t, r->nanpos[p]);
        }
        r->reached[t - r->row0] = (uint8_t)hit;
        nr += (size_t)hit;
    }
    return nr;
}

/* the mask rows of sequence b as per_batch reads them */
static const uint8_t *seq_mask(const aft_opspec *sp, size_t b, size_t *mld)
{
    const aft_bias *bias = sp->bias;
    const size_t T = sp->T, mrows = sp->q_row1 ? sp->q_row1 - sp->q_row0 : T;
    *mld = sp->mask_ld ? sp->mask_ld : T;
    if (!bias->mask) return NULL;
    return bias->mask + (bias->mask_batched ? b * mrows * *mld : 0);
}

static aft_status reach_init(nan_reach *r, const aft_opspec *sp, aft_error *err)
{
    const size_t T = sp->T;
    r->sp = sp;
    r->row1 = sp->q_row1 && sp->q_row1 < T ? sp->q_row1 : T;
    r->row0 = sp->q_row0 < r->row1 ? sp->q_row0 : r->row1;
    r->nanpos = aft_alloc_array(T, sizeof(size_t));
    r->reached = aft_alloc_array(T, 1);
    if (!r->nanpos || !r->reached) {
        free(r->nanpos);
        free(r->reached);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory marking what a NaN key reaches (T = %zu)", T);
    }
    return AFT_OK;
}

static void reach_free(nan_reach *r)
{
    free(r->nanpos);
    free(r->reached);
}

/* out (B, T, C), rows from q_row0 on: NaN where a NaN key of k reaches */
static aft_status nan_keys_forward(float *out, const float *k, size_t ldk, size_t kc, const aft_opspec *sp,
                                   size_t B, aft_error *err)
{
    const size_t T = sp->T, C = sp->C;
    nan_reach r;
    aft_status st = reach_init(&r, sp, err);
    if (st) return st;
    for (size_t b = 0; b < B; b++) {
        r.mask = seq_mask(sp, b, &r.mld);
        for (size_t c = 0; c < C; c++) {
            if (!reach_rows(&r, k + b * T * ldk, ldk, kc, c)) continue;
            for (size_t t = r.row0; t < r.row1; t++)
                if (r.reached[t - r.row0]) out[b * T * C + (t - r.row0) * C + c] = NAN;
        }
    }
    reach_free(&r);
    return AFT_OK;
}

/* The backward pass's entries a NaN key of k (one per channel, ld apart)
 * reaches, made NaN: out and dq where the output is NaN; dk and dv of
 * every key a reached row sees (its den is NaN, and so every term it adds);
 * the bias gradient's entries w[t, j] (through the adjoint of aft_w_row)
 * for j seen from a row t reached in a channel of head h. */
static aft_status nan_keys_backward(const aft_grad_io *io, const float *k, size_t ldk, const aft_opspec *sp,
                                    size_t B, aft_error *err)
{
    const size_t T = sp->T, C = sp->C, H = sp->heads ? sp->heads : 1, ch = C / H;
    const int want_db = aft_bias_grad_wanted(sp, &io->db);
    nan_reach r;
    aft_status st = reach_init(&r, sp, err);
    if (st) return st;
    uint8_t *keyhit = aft_alloc_array(T, 1), *rowhit = aft_alloc_array(T, H);
    float *dw = aft_alloc_array(T, sizeof(float));
    if (!keyhit || !rowhit || !dw) {
        free(keyhit); free(rowhit); free(dw);
        reach_free(&r);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory marking what a NaN key reaches (T = %zu)", T);
    }
    for (size_t b = 0; b < B; b++) {
        r.mask = seq_mask(sp, b, &r.mld);
        memset(rowhit, 0, T * H);
        for (size_t c = 0; c < C; c++) {
            if (!reach_rows(&r, k + b * T * ldk, ldk, C, c)) continue;
            memset(keyhit, 0, T);
            for (size_t t = 0; t < T; t++) {
                if (!r.reached[t]) continue;
                size_t i = b * T + t;
                if (io->dq) io->dq[i * io->lddq + c] = NAN;   /* none in a forward half */
                if (io->out) io->out[i * C + c] = NAN;
                rowhit[(c / ch) * T + t] = 1;
                for (size_t j = 0; j < T; j++) keyhit[j] |= (uint8_t)sees(&r, t, j);
            }
            for (size_t j = 0; j < T && io->dk; j++)
                if (keyhit[j]) {
                    io->dk[(b * T + j) * io->lddk + c] = NAN;
                    io->dv[(b * T + j) * io->lddv + c] = NAN;
                }
        }
        for (size_t h = 0; h < H && want_db; h++)
            for (size_t t = 0; t < T; t++) {
                if (!rowhit[h * T + t]) continue;
                for (size_t j = 0; j < T; j++) dw[j] = sees(&r, t, j) ? NAN : 0.0f;
                aft_w_row_grad(sp, &io->db, h, t, 0, T, dw);
            }
    }
    free(keyhit); free(rowhit); free(dw);
    reach_free(&r);
    return AFT_OK;
}

/* keys widened to one per channel when they have one per head (the
 * paper's conv), then the kernel */
static aft_status run_all(float *out, const float *q, const float *k, const float *v, const aft_opspec *sp_in,
                          size_t B, size_t kc, int reference, aft_error *err)
{
    const size_t T = sp_in->T, C = sp_in->C;
    if (B == 0 || T == 0 || C == 0) return AFT_OK;
    if (!out || !q || !k || !v)
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !out ? "out" : !q ? "q" : !k ? "k" : "v");
    if (sp_in->bias->mask && T > SIZE_MAX / T / B)
        return aft_fail(err, AFT_ERR_ARG, "a mask of B x T x T = %zu x %zu x %zu entries overflows", B, T, T);
    aft_opspec sp = *sp_in;
    if (!reference && keys_have_nan(k, B * T, kc, sp.ldk, sp.threads)) {
        /* the kernel on keys whose NaNs are -inf, then what they reach */
        float *kclean = keys_without_nan(k, B * T, kc, C, sp.ldk);
        if (!kclean) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for keys of %zu channels", C);
        sp.ldk = C;
        aft_status st = run_kernel(out, q, kclean, v, &sp, B, 0, err);
        free(kclean);
        if (st == AFT_OK) st = nan_keys_forward(out, k, sp_in->ldk, kc, sp_in, B, err);
        return st;
    }
    /* the grid kernel reads keys of one channel per head where they are */
    if (kc != C && !reference && !sp.bias->mask && aft_spec_on_grid(&sp)) {
        aft_status st = aft_op_grid(out, q, k, v, B, kc, &sp, err);
        if (st == AFT_OK) aft_progress_done(sp.progress, B * T);
        return st;
    }
    float *kwide = NULL;
    if (kc != C) {
        size_t ch = C / kc;
        kwide = aft_alloc_array(B * T, C * sizeof(float));
        if (!kwide) return aft_fail(err, AFT_ERR_NOMEM, "out of memory widening keys to %zu channels", C);
        for (size_t bt = 0; bt < B * T; bt++)
            for (size_t j = 0; j < kc; j++)
                for (size_t c = 0; c < ch; c++) kwide[bt * C + j * ch + c] = k[bt * sp.ldk + j];
        k = kwide;
        sp.ldk = C;
    }
    aft_status st = run_kernel(out, q, k, v, &sp, B, reference, err);
    free(kwide);
    return st;
}

aft_status aft_op_run(float *out, const float *q, const float *k, const float *v, const aft_opspec *sp,
                      size_t B, size_t kc, aft_error *err)
{
    return run_all(out, q, k, v, sp, B, kc, 0, err);
}

/* take: the rows go on cfg's counter's total here (else the caller's) */
static aft_status op_forward(float *out, const float *q, const float *k, const float *v, const aft_bias *bias,
                             const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc, int take,
                             aft_error *err)
{
    aft_opspec sp;
    aft_status st = aft_spec_settle(&sp, bias, cfg, B, T, C, kc, err);
    if (st) return st;
    sp.progress = take && C > 0 ? aft_progress_plan(cfg->progress, B * T) : cfg->progress;
    return run_all(out, q, k, v, &sp, B, kc, cfg->impl == AFT_IMPL_REFERENCE, err);
}

aft_status aft_op_forward(float *out, const float *q, const float *k, const float *v,
                          const aft_bias *bias, const aft_config *cfg,
                          size_t B, size_t T, size_t C, size_t kc, aft_error *err)
{
    return op_forward(out, q, k, v, bias, cfg, B, T, C, kc, 1, err);
}

aft_status aft_op_forward_counted(float *out, const float *q, const float *k, const float *v, const aft_bias *bias,
                                  const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc, aft_error *err)
{
    return op_forward(out, q, k, v, bias, cfg, B, T, C, kc, 0, err);
}

/* ---- the backward pass: the kernels as run_kernel picks them */

/* io's arrays from batch b on (those it has) */
static aft_grad_io io_from(const aft_grad_io *io, size_t b, size_t T, size_t C)
{
    aft_grad_io o = *io;
    if (o.dq) o.dq += b * T * io->lddq;
    if (o.dk) o.dk += b * T * io->lddk;
    if (o.dv) o.dv += b * T * io->lddv;
    if (o.dout) o.dout += b * T * C;
    if (o.out) o.out += b * T * C;
    if (o.sums) o.sums += b * T * 2 * C;
    return o;
}

/* batches [b0, b0 + B) through the fast backward kernel for sp */
static aft_status fast_grad(const aft_grad_io *io, const float *q, const float *k, const float *v,
                            const aft_opspec *sp, size_t b0, size_t B, int dense_mask, aft_error *err)
{
    const size_t T = sp->T, C = sp->C;
    aft_grad_io iob = io_from(io, b0, T, C);
    q += b0 * T * sp->ldq;
    k += b0 * T * sp->ldk;
    v += b0 * T * sp->ldv;
    /* local and conv on a grid: the dense kernel with the grid's w rows,
     * O(T^2 C) (no banded backward on grids yet) */
    if (dense_mask || sp->variant == AFT_FULL || aft_spec_on_grid(sp)) {
        aft_status st = AFT_OK;
        for (size_t b = 0; b < B && !st; b++) {
            aft_grad_io one = io_from(&iob, b, T, C);
            one.db_set = io->db_set && b0 + b == 0;   /* later sequences add */
            const uint8_t *m = dense_mask ? sp->bias->mask + (sp->bias->mask_batched ? (b0 + b) * T * T : 0) : NULL;
            st = aft_op_full_grad(&one, q + b * T * sp->ldq, k + b * T * sp->ldk, v + b * T * sp->ldv, m, sp, err);
        }
        return st;
    }
    /* the full kernel counts its rows itself; these are counted when done */
    aft_status st = sp->zero_bias && !sp->causal ? aft_op_simple_grad(&iob, q, k, v, B, sp, err)
                                                 : aft_op_band_grad(&iob, q, k, v, B, sp, err);
    if (st == AFT_OK) aft_progress_done(sp->progress, B * T);
    return st;
}

/* Groups of whole sequences, one a thread, as the forward's: every group
 * but the first adds its bias gradient to a copy of its own, and the
 * copies are added in group order (the same bits every run) */
static aft_status grouped_grad(const aft_grad_io *io, const float *q, const float *k, const float *v,
                               const aft_opspec *sp, size_t B, size_t ng, int dense_mask, aft_error *err)
{
    const size_t per = aft_bias_grad_copy_floats(sp, &io->db);
    float *blk = per ? aft_alloc_array(ng - 1, per * sizeof(float)) : NULL;
    aft_bias_grad *mine = calloc(ng, sizeof *mine);
    if ((per && !blk) || !mine) {
        free(blk);
        free(mine);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu copies of the bias gradient", ng - 1);
    }
    aft_opspec one = *sp;
    one.threads = 1;
    aft_status st = AFT_OK;
    #pragma omp parallel for schedule(static, 1) num_threads((int)ng)
    for (size_t g = 0; g < ng; g++) {
        aft_error e;
        aft_grad_io iog = *io;
        if (g > 0 && per) {
            aft_bias_grad_copy_init(sp, &io->db, &mine[g], blk + (g - 1) * per);
            iog.db = mine[g];
            iog.db_set = 0;   /* a zeroed copy, added to */
        }
        size_t b0 = B * g / ng, b1 = B * (g + 1) / ng;
        aft_first_error(&st, err, fast_grad(&iog, q, k, v, &one, b0, b1 - b0, dense_mask, &e), &e);
    }
    for (size_t g = 1; g < ng && per && st == AFT_OK; g++) aft_bias_grad_copy_add(sp, &io->db, &mine[g]);
    free(blk);
    free(mine);
    return st;
}

/* Whether the backward runs B sequences in ng groups (op_groups): only
 * when the copies of the bias gradient take at most B T C floats, within
 * the O(T C) the backward pass may take beyond its arguments */
static int grad_grouped(const aft_grad_io *io, const aft_opspec *sp, size_t B, size_t *ng)
{
    size_t per = aft_bias_grad_copy_floats(sp, &io->db), room;
    *ng = op_groups(sp, B);
    int fits = aft_mul_ok(B * sp->T, sp->C, &room) && (per == 0 || (*ng - 1) <= room / per);
    return *ng > 1 && fits;
}

/* the saved sums' tag: the thread count of the blocks of rows, so of
 * their bits; sums made on another are made again */
static float sums_tag(const aft_grad_io *io, const aft_opspec *sp, size_t B)
{
    size_t ng;
    return grad_grouped(io, sp, B, &ng) ? 1.0f : (float)sp->threads;
}

static aft_status grad_kernel(const aft_grad_io *io, const float *q, const float *k, const float *v, aft_opspec *sp,
                              size_t B, int reference, aft_error *err)
{
    if (reference) return aft_op_reference_grad(io, q, k, v, B, sp, err);
    int dense_mask = mask_needed(sp, B);
    size_t ng;
    int grouped = grad_grouped(io, sp, B, &ng);
    float tag = grouped ? 1.0f : (float)sp->threads;
    aft_grad_io iok = *io;
    if (iok.sums && iok.sums_mode == AFT_SUMS_WRITE) *iok.sums_tag = tag;
    if (iok.sums && iok.sums_mode == AFT_SUMS_READ && *iok.sums_tag != tag) iok.sums = NULL;
    if (grouped) return grouped_grad(&iok, q, k, v, sp, B, ng, dense_mask, err);
    return fast_grad(&iok, q, k, v, sp, 0, B, dense_mask, err);
}

/* whether the backward of B sequences runs the dense kernel (full, a
 * mask, a grid); sp a copy, which mask_needed settles */
static int dense_grad(aft_opspec *sp, size_t B)
{
    return mask_needed(sp, B) || sp->variant == AFT_FULL || aft_spec_on_grid(sp);
}

int aft_op_grad_saves(const aft_opspec *sp_in, size_t B, int reference)
{
    aft_opspec sp = *sp_in;
    /* the dense kernel's, and the band kernel's with causality and a band
     * (the forward's 1 / den and Y', local_conv_grad.c; with w = 0
     * everywhere its every entry is done exactly, which keeps nothing) */
    return !reference && (dense_grad(&sp, B) || (sp.causal && !sp.zero_bias));
}

/* Does a backward (io, sp) take sums the band kernel's forward kept (the
 * tag holds)? That forward kept them only where every key was tame
 * (local_conv_grad.c), so the keys need no scan. */
static int band_sums_kept(const aft_grad_io *io, const aft_opspec *sp_in, size_t B, int reference)
{
    aft_opspec sp = *sp_in;
    if (reference || !io->sums || io->sums_mode != AFT_SUMS_READ || !io->sums_tag) return 0;
    if (dense_grad(&sp, B) || !sp.causal || sp.zero_bias) return 0;
    return *io->sums_tag == sums_tag(io, &sp, B);
}

aft_status aft_op_grad_run(const aft_grad_io *io_in, const float *q, const float *k, const float *v,
                           const aft_opspec *sp_in, size_t B, size_t kc, int reference, aft_error *err)
{
    const size_t T = sp_in->T, C = sp_in->C;
    /* the kernel's first sequence may set the dense entries instead of clearing them here */
    const int set = !reference && B > 0 && T > 0 && C > 0 && aft_bias_grad_sets(sp_in, &io_in->db);
    if (!set) aft_bias_grad_zero(sp_in, &io_in->db);
    else aft_bias_grad_zero_unset(sp_in, &io_in->db);
    if (B == 0 || T == 0 || C == 0) return AFT_OK;
    const int fwd = io_in->sums && io_in->sums_mode == AFT_SUMS_WRITE;
    if (fwd && (!io_in->out || !io_in->sums_tag || !aft_op_grad_saves(sp_in, B, reference)))
        return aft_fail(err, AFT_ERR_ARG, "the operator's forward half: %s",
                        !io_in->out ? "missing (NULL) out" : "only the dense and causal band kernels keep sums");
    if (fwd && (!q || !k || !v)) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !q ? "q" : !k ? "k" : "v");
    if (!fwd && (!io_in->dq || !io_in->dk || !io_in->dv || !io_in->dout || !q || !k || !v))
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s",
                        !io_in->dq ? "dq" : !io_in->dk ? "dk" : !io_in->dv ? "dv" : !io_in->dout ? "dout" :
                        !q ? "q" : !k ? "k" : "v");
    if (sp_in->bias->mask && T > SIZE_MAX / T / B)
        return aft_fail(err, AFT_ERR_ARG, "a mask of B x T x T = %zu x %zu x %zu entries overflows", B, T, T);
    aft_opspec sp = *sp_in;
    aft_grad_io io = *io_in;
    io.db_set = set;
    /* keys of one channel per head: widened as for the forward, and each
     * head's dk the sum over its channels */
    float *kwide = NULL, *dkwide = NULL;
    if (kc != C) {
        size_t ch = C / kc;
        kwide = aft_alloc_array(B * T, C * sizeof(float));
        dkwide = aft_alloc_array(B * T, C * sizeof(float));
        if (!kwide || !dkwide) {
            free(kwide);
            free(dkwide);
            return aft_fail(err, AFT_ERR_NOMEM, "out of memory widening keys to %zu channels", C);
        }
        for (size_t bt = 0; bt < B * T; bt++)
            for (size_t c = 0; c < C; c++) kwide[bt * C + c] = k[bt * sp.ldk + c / ch];
        k = kwide;
        sp.ldk = C;
        io.dk = dkwide;
        io.lddk = C;
    }
    aft_status st;
    int tame = band_sums_kept(&io, &sp, B, reference);
    if (!reference && !tame && keys_scan(k, B * T, C, sp.ldk, sp.threads, &tame)) {
        /* the kernel on keys whose NaNs are -inf, then what they reach */
        float *kclean = keys_without_nan(k, B * T, C, C, sp.ldk);
        if (!kclean) {
            st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for keys of %zu channels", C);
        } else {
            aft_opspec spc = sp;
            spc.ldk = C;
            st = grad_kernel(&io, q, kclean, v, &spc, B, 0, err);
            free(kclean);
            if (st == AFT_OK) st = nan_keys_backward(&io, k, sp.ldk, &sp, B, err);
        }
    } else {
        sp.keys_tame = tame;
        st = grad_kernel(&io, q, k, v, &sp, B, reference, err);
    }
    if (dkwide && st == AFT_OK && !fwd) {
        size_t ch = C / kc;
        for (size_t bt = 0; bt < B * T; bt++)
            for (size_t h = 0; h < kc; h++) {
                float s = 0.0f;
                for (size_t c = h * ch; c < (h + 1) * ch; c++) s += dkwide[bt * C + c];
                io_in->dk[bt * io_in->lddk + h] = s;
            }
    }
    free(kwide);
    free(dkwide);
    return st;
}

/* ---- the saved forward of the bare operator: the sums of the dense
 * kernel (aft_op_grad_saves), (B, T, 2C), then their tag */

static aft_status saved_settle(aft_opspec *sp, size_t *n, const aft_bias *bias, const aft_config *cfg, size_t B,
                               size_t T, size_t C, size_t kc, aft_error *err)
{
    aft_status st = aft_spec_settle(sp, bias, cfg, B, T, C, kc, err);
    if (st) return st;
    *n = 0;
    if (B == 0 || T == 0 || C == 0 || !aft_op_grad_saves(sp, B, cfg->impl == AFT_IMPL_REFERENCE)) return AFT_OK;
    if (!aft_mul_ok(B * T, 2 * C, n) || !aft_add_ok(*n, 1, n))
        return aft_fail(err, AFT_ERR_ARG, "the saved sums of B * T = %zu * %zu rows overflow", B, T);
    return AFT_OK;
}

aft_status aft_op_saved_floats(const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                               size_t *n, aft_error *err)
{
    aft_opspec sp;
    return saved_settle(&sp, n, bias, cfg, B, T, C, kc, err);
}

aft_status aft_op_forward_saved(float *out, float *saved, const float *q, const float *k, const float *v,
                                const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                                aft_error *err)
{
    aft_opspec sp;
    size_t n;
    aft_status st = saved_settle(&sp, &n, bias, cfg, B, T, C, kc, err);
    if (st) return st;
    if (n == 0) return aft_op_forward(out, q, k, v, bias, cfg, B, T, C, kc, err);
    aft_grad_io io = {.out = out, .sums_mode = AFT_SUMS_WRITE, .sums = saved, .sums_tag = saved + n - 1};
    return aft_op_grad_run(&io, q, k, v, &sp, B, kc, 0, err);
}

aft_status aft_op_backward_saved(float *dq, float *dk, float *dv, const aft_bias_grad *dbias, const float *dout,
                                 const float *q, const float *k, const float *v, const float *saved,
                                 const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                                 aft_error *err)
{
    aft_opspec sp;
    size_t n;
    aft_status st = saved_settle(&sp, &n, bias, cfg, B, T, C, kc, err);
    if (st) return st;
    if (C > 0) sp.progress = aft_progress_plan(cfg->progress, B * T);
    aft_grad_io io = {.dq = dq, .dk = dk, .dv = dv, .lddq = C, .lddk = kc, .lddv = C, .dout = dout};
    if (dbias) io.db = *dbias;
    if (n) {   /* the forward's sums, only read */
        io.sums_mode = AFT_SUMS_READ;
        io.sums = (float *)saved;
        io.sums_tag = io.sums + n - 1;
    }
    return aft_op_grad_run(&io, q, k, v, &sp, B, kc, cfg->impl == AFT_IMPL_REFERENCE, err);
}

aft_status aft_op_grad_reference_d(double *dq, double *dk, double *dv, double *out, const aft_bias_grad *db,
                                   const double *dout, const double *q, const double *k, const double *v,
                                   const aft_opspec *sp, size_t B, size_t kc, aft_error *err)
{
    return aft_op_reference_grad_d(dq, dk, dv, out, db, dout, q, k, v, sp, B, kc, err);
}

aft_status aft_op_backward(float *dq, float *dk, float *dv, const aft_bias_grad *dbias, float *out,
                           const float *dout, const float *q, const float *k, const float *v,
                           const aft_bias *bias, const aft_config *cfg,
                           size_t B, size_t T, size_t C, size_t kc, aft_error *err)
{
    aft_opspec sp;
    aft_status st = aft_spec_settle(&sp, bias, cfg, B, T, C, kc, err);
    if (st) return st;
    if (C > 0) sp.progress = aft_progress_plan(cfg->progress, B * T);
    aft_grad_io io = {.dq = dq, .dk = dk, .dv = dv, .lddq = C, .lddk = kc, .lddv = C, .dout = dout, .out = out};
    if (dbias) io.db = *dbias;
    return aft_op_grad_run(&io, q, k, v, &sp, B, kc, cfg->impl == AFT_IMPL_REFERENCE, err);
}

/* ---- a chunk of rows at a time */

aft_rows_kind aft_op_rows_kind(const aft_opspec *sp, size_t kc)
{
    if (sp->bias->mask || kc != sp->C || sp->variant == AFT_FULL || aft_spec_on_grid(sp)) return AFT_ROWS_NONE;
    if (sp->causal) return AFT_ROWS_CAUSAL;
    return sp->zero_bias ? AFT_ROWS_GLOBAL : AFT_ROWS_BAND;
}

struct aft_op_rows_ctx {
    aft_band_ctx *band;
};

aft_op_rows_ctx *aft_op_rows_new(const aft_opspec *sp, size_t rows)
{
    aft_op_rows_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->band = aft_band_ctx_new(sp, rows);
    if (!ctx->band) {
        free(ctx);
        return NULL;
    }
    return ctx;
}

void aft_op_rows_free(aft_op_rows_ctx *ctx)
{
    if (!ctx) return;
    aft_band_ctx_free(ctx->band);
    free(ctx);
}

int aft_op_rows(aft_op_rows_ctx *ctx, float *out, const float *q, const float *k, const float *v,
                const aft_opspec *sp, size_t r0, size_t r1, const float *carry_in, float *carry_out,
                const float *right_in)
{
    return aft_band_rows(ctx->band, out, q, k, v, sp, r0, r1, carry_in, carry_out, right_in);
}
