/* bias_grad.c - the position bias's gradient: the adjoint of bias.c's
 * aft_w_row, which maps dL/dw_eff[t, j] back to the bias entries w_eff[t, j]
 * was read from. One home for the rule of which entries a variant reads:
 * every backward kernel hands its rows of dL/dw_eff here. */
#include "kernels.h"

#include <stdlib.h>

/* the field of db this run writes: the bias's kind, the variant reads it */
int aft_bias_grad_wanted(const aft_opspec *sp, const aft_bias_grad *db)
{
    if (!db) return 0;
    /* full reads its bias whatever the window (zero_bias speaks for the
     * band variants only); local and conv unless the window is 0 */
    int reads = sp->variant == AFT_FULL || (sp->variant != AFT_SIMPLE && !sp->zero_bias);
    if (!reads) return 0;
    switch (sp->bias->kind) {
    case AFT_BIAS_DENSE:
        return db->dense != NULL && sp->variant != AFT_CONV;
    case AFT_BIAS_FACTORED:
        return (db->u != NULL || db->v != NULL) && sp->variant != AFT_CONV;
    case AFT_BIAS_CONV:
        return db->conv != NULL && sp->variant == AFT_CONV;
    default:
        return 0;   /* seeded, none: nothing to learn */
    }
}

/* the bias's own entries of a full/local row: dense, or factored u v^T */
static void base_grad(const aft_bias *b, const aft_bias_grad *db, size_t t, size_t j0, size_t j1, const float *dw)
{
    if (b->kind == AFT_BIAS_DENSE) {
        float *row = db->dense + t * b->tmax;
        for (size_t j = j0; j < j1; j++) row[j] += dw[j - j0];
        return;
    }
    if (b->kind != AFT_BIAS_FACTORED) return;
    /* w[t, j] = u[t] . v[j]: du[t] = sum_j dw[j] v[j], dv[j] += dw[j] u[t] */
    const size_t R = b->rank;
    if (db->u) {
        float *du = db->u + t * R;
        for (size_t j = j0; j < j1; j++) {
            const float *vj = b->v + j * R;
            float g = dw[j - j0];
            for (size_t r = 0; r < R; r++) du[r] += g * vj[r];
        }
    }
    if (db->v) {
        const float *ut = b->u + t * R;
        for (size_t j = j0; j < j1; j++) {
            float *dvj = db->v + j * R, g = dw[j - j0];
            for (size_t r = 0; r < R; r++) dvj[r] += g * ut[r];
        }
    }
}

/* aft_w_row_grad on a grid: the adjoint of bias.c's grid_w_row, window row
 * by window row */
static void grid_row_grad(const aft_opspec *sp, const aft_bias_grad *db, size_t h, size_t t, size_t j0, size_t j1,
                          const float *dw)
{
    const size_t s = sp->window, W = sp->grid_w, r = t / W, c = t % W;
    if (s == 0) return;
    const size_t reach = aft_spec_grid_reach(sp);
    size_t rlo = r >= reach ? r - reach : 0, rhi = r + reach;
    size_t clo = c >= reach ? c - reach : 0, chi = c + reach < W - 1 ? c + reach : W - 1;
    rlo = rlo > j0 / W ? rlo : j0 / W;
    rhi = rhi < (j1 - 1) / W ? rhi : (j1 - 1) / W;
    const size_t len = sp->conv_len;
    float *sq = sp->variant == AFT_CONV ? db->conv + (sp->conv_rows == 1 ? 0 : h) * len * len : NULL;
    for (size_t rr = rlo; rr <= rhi; rr++) {
        size_t lo = rr * W + clo, hi = rr * W + chi + 1;
        lo = lo > j0 ? lo : j0;
        hi = hi < j1 ? hi : j1;
        if (lo >= hi) continue;
        if (sp->variant == AFT_LOCAL) {
            base_grad(sp->bias, db, t, lo, hi, dw + (lo - j0));
        } else {
            float *row = sq + (rr + s - 1 - r) * len;
            for (size_t j = lo; j < hi; j++) row[j - rr * W + s - 1 - c] += dw[j - j0];
        }
    }
}

void aft_w_row_grad(const aft_opspec *sp, const aft_bias_grad *db, size_t h, size_t t, size_t j0, size_t j1,
                    const float *dw)
{
    if (!aft_bias_grad_wanted(sp, db) || j1 <= j0) return;
    if (sp->grid_w && (sp->variant == AFT_LOCAL || sp->variant == AFT_CONV)) {
        grid_row_grad(sp, db, h, t, j0, j1, dw);
        return;
    }
    const size_t s = sp->window;
    switch (sp->variant) {
    case AFT_FULL:
        base_grad(sp->bias, db, t, j0, j1, dw);
        return;
    case AFT_LOCAL: {
        /* only the window |t - j| < s reads the bias (outside, w is 0) */
        size_t lo = t + 1 >= s ? t + 1 - s : 0, hi = t + s;
        lo = lo > j0 ? lo : j0;
        hi = hi < j1 ? hi : j1;
        if (lo < hi) base_grad(sp->bias, db, t, lo, hi, dw + (lo - j0));
        return;
    }
    case AFT_CONV: {
        /* offset j - t at entry j - t + s - 1 of the head's row (one row
         * may serve every head: then all heads add to it) */
        float *row = db->conv + (sp->conv_rows == 1 ? 0 : h) * sp->conv_len;
        size_t lo = t + 1 >= s ? t + 1 - s : 0, hi = t + s;
        lo = lo > j0 ? lo : j0;
        hi = hi < j1 ? hi : j1;
        for (size_t j = lo; j < hi; j++) row[j + s - 1 - t] += dw[j - j0];
        return;
    }
    case AFT_SIMPLE:
        return;
    }
}

/* the lines of row t's entries [j0, j1) of a (tmax-wide) matrix */
static void row_prefetch(const float *m, size_t tmax, size_t t, size_t j0, size_t j1, int write)
{
    const float *row = m + t * tmax + j0;
    if (j1 <= j0) return;
    if (write) aft_lines_prefetch(row, j1 - j0, 1);
    else aft_lines_prefetch(row, j1 - j0, 0);
}

void aft_band_bias_prefetch(const aft_opspec *sp, const aft_bias_grad *db, size_t t0, size_t t1)
{
    const aft_bias *b = sp->bias;
    if (sp->variant != AFT_LOCAL || sp->grid_w || b->kind != AFT_BIAS_DENSE || sp->window == 0) return;
    const size_t s = sp->window, tm = b->tmax, end = sp->t_off + sp->T;
    float *g = aft_bias_grad_wanted(sp, db) ? db->dense : NULL;
    for (size_t t = sp->t_off + t0; t < sp->t_off + t1 && t < end; t++) {
        size_t lo = t + 1 >= s ? t + 1 - s : 0, hi = sp->causal ? t + 1 : (t + s < end ? t + s : end);
        lo = lo > sp->t_off ? lo : sp->t_off;
        row_prefetch(b->dense, tm, t, lo, hi, 0);
        if (g) row_prefetch(g, tm, t, lo, hi, 1);
    }
}

/* floats of the parts threads cannot share: factored v, conv */
static void private_sizes(const aft_opspec *sp, const aft_bias_grad *db, size_t *nv, size_t *nconv)
{
    *nv = *nconv = 0;
    if (!aft_bias_grad_wanted(sp, db)) return;
    /* v's rows the keys reach (a group's copy has no more) */
    if (sp->bias->kind == AFT_BIAS_FACTORED && db->v) *nv = (sp->t_off + sp->T) * sp->bias->rank;
    if (sp->bias->kind == AFT_BIAS_CONV) *nconv = sp->conv_rows * sp->conv_len * (sp->bias->conv_2d ? sp->conv_len : 1);
}

size_t aft_bias_grad_private_floats(const aft_opspec *sp, const aft_bias_grad *db)
{
    size_t nv, nconv;
    private_sizes(sp, db, &nv, &nconv);
    return nv + nconv;
}

int aft_bias_grad_private(const aft_opspec *sp, const aft_bias_grad *db, aft_bias_grad *mine, float **blk)
{
    size_t nv, nconv;
    *blk = NULL;
    if (db) *mine = *db;
    else memset(mine, 0, sizeof *mine);
    private_sizes(sp, db, &nv, &nconv);
    if (nv + nconv == 0) return 1;
    *blk = aft_calloc_array(nv + nconv, sizeof(float));
    if (!*blk) return 0;
    if (nv) mine->v = *blk;
    if (nconv) mine->conv = *blk + nv;
    return 1;
}

void aft_bias_grad_merge(const aft_opspec *sp, const aft_bias_grad *db, const aft_bias_grad *mine)
{
    size_t nv, nconv;
    private_sizes(sp, db, &nv, &nconv);
    for (size_t i = 0; i < nv; i++) db->v[i] += mine->v[i];
    for (size_t i = 0; i < nconv; i++) db->conv[i] += mine->conv[i];
}

/* the parts of a whole copy (aft_bias_grad_copy_floats): rows below T of
 * dense (tmax wide), u and v, and conv whole */
static void copy_sizes(const aft_opspec *sp, const aft_bias_grad *db, size_t n[4])
{
    const aft_bias *b = sp->bias;
    const size_t rows = sp->t_off + sp->T;   /* the rows of w the run reads */
    n[0] = n[1] = n[2] = n[3] = 0;
    if (!aft_bias_grad_wanted(sp, db)) return;
    if (b->kind == AFT_BIAS_DENSE && !aft_mul_ok(rows, b->tmax, &n[0])) n[0] = SIZE_MAX;
    if (b->kind == AFT_BIAS_FACTORED && db->u && !aft_mul_ok(rows, b->rank, &n[1])) n[1] = SIZE_MAX;
    if (b->kind == AFT_BIAS_FACTORED && db->v && !aft_mul_ok(rows, b->rank, &n[2])) n[2] = SIZE_MAX;
    if (b->kind == AFT_BIAS_CONV) n[3] = sp->conv_rows * sp->conv_len * (b->conv_2d ? sp->conv_len : 1);
}

size_t aft_bias_grad_copy_floats(const aft_opspec *sp, const aft_bias_grad *db)
{
    size_t n[4], sum = 0;
    copy_sizes(sp, db, n);
    for (int i = 0; i < 4; i++)
        if (!aft_add_ok(sum, n[i], &sum)) return SIZE_MAX;
    return sum;
}

void aft_bias_grad_copy_init(const aft_opspec *sp, const aft_bias_grad *db, aft_bias_grad *mine, float *blk)
{
    size_t n[4];
    copy_sizes(sp, db, n);
    memset(mine, 0, sizeof *mine);
    if (n[0]) mine->dense = blk;
    if (n[1]) mine->u = blk + n[0];
    if (n[2]) mine->v = blk + n[0] + n[1];
    if (n[3]) mine->conv = blk + n[0] + n[1] + n[2];
    memset(blk, 0, (n[0] + n[1] + n[2] + n[3]) * sizeof(float));
}

void aft_bias_grad_copy_add(const aft_opspec *sp, const aft_bias_grad *db, const aft_bias_grad *mine)
{
    size_t n[4];
    copy_sizes(sp, db, n);
    float *const to[4] = {db->dense, db->u, db->v, db->conv};
    const float *const from[4] = {mine->dense, mine->u, mine->v, mine->conv};
    for (int p = 0; p < 4; p++)
        for (size_t i = 0; i < n[p]; i++) to[p][i] += from[p][i];
}

/* rows [0, rows) of a dense gradient (tmax wide) cleared: at T = 4096 all
 * of it is 64 MiB, a tenth of a local layer's backward pass on one thread;
 * the threads split the rows, and their stores skip the cache (the rows
 * the run writes come later, a line at a time) */
static void dense_zero_rows(const aft_opspec *sp, float *dense, size_t rows)
{
    const size_t tm = sp->bias->tmax, nt = (size_t)(sp->threads > 0 ? sp->threads : 1);
    const size_t per = (rows + nt - 1) / nt;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1 && rows >= 1024)
    for (size_t p = 0; p < nt; p++) {
        size_t r0 = p * per < rows ? p * per : rows, r1 = r0 + per < rows ? r0 + per : rows;
        aft_zero_stream(dense + r0 * tm, (r1 - r0) * tm);
    }
}

/* The entries of a dense gradient a run writes, when the rest is 0
 * already (zero_outside): local's band on a sequence, a line or two a row;
 * else the rows below T whole (a grid's windows, full and masks write most
 * of a row below T). Clearing more than is written is harmless: the
 * caller's promise covers the rest. */
static void dense_zero_used(const aft_opspec *sp, const aft_bias_grad *db)
{
    if (!aft_bias_grad_wanted(sp, db)) return;
    const size_t tm = sp->bias->tmax, T = sp->t_off + sp->T, s = sp->window;
    if (sp->variant != AFT_LOCAL || sp->grid_w) {
        dense_zero_rows(sp, db->dense, T);
        return;
    }
    /* a row's band is a line or two, a page from the last row's: the
     * threads split the rows, and each asks for the rows a few ahead while
     * it clears these, so the misses overlap (one row at a time, 4096 rows
     * took 0.7 to 1.3 ms) */
    enum { AHEAD = 16 };
    const size_t nt = (size_t)(sp->threads > 0 ? sp->threads : 1), per = (T + nt - 1) / nt;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1 && T >= 1024)
    for (size_t p = 0; p < nt; p++) {
        size_t r0 = p * per < T ? p * per : T, r1 = r0 + per < T ? r0 + per : T;
        for (size_t t = r0; t < r1; t++) {
            size_t lo = t + 1 > s ? t + 1 - s : 0, hi = t + s < T ? t + s : T;
            if (t + AHEAD < r1) {
                size_t u = t + AHEAD, ulo = u + 1 > s ? u + 1 - s : 0, uhi = u + s < T ? u + s : T;
                row_prefetch(db->dense, tm, u, ulo, uhi, 1);
            }
            memset(db->dense + t * tm + lo, 0, (hi - lo) * sizeof(float));
        }
    }
}

int aft_bias_grad_sets(const aft_opspec *sp, const aft_bias_grad *db)
{
    if (!aft_bias_grad_wanted(sp, db) || sp->bias->kind != AFT_BIAS_DENSE || sp->bias->mask || sp->grid_w ||
        sp->t_off != 0)
        return 0;
    /* full's rows [0, T) below column T are all written; the rest, when the
     * caller does not promise zeros there, aft_bias_grad_zero_unset clears */
    return (sp->variant == AFT_FULL && !sp->causal) || (sp->variant == AFT_LOCAL && db->zero_outside);
}

void aft_bias_grad_zero_unset(const aft_opspec *sp, const aft_bias_grad *db)
{
    if (db->zero_outside || sp->variant != AFT_FULL) return;
    const size_t T = sp->T, tm = sp->bias->tmax;
    if (T < tm) {
        for (size_t t = 0; t < T; t++) memset(db->dense + t * tm + T, 0, (tm - T) * sizeof(float));
        aft_zero_stream(db->dense + T * tm, (tm - T) * tm);
    }
}

void aft_w_row_grad_set(const aft_opspec *sp, const aft_bias_grad *db, size_t t, size_t j0, size_t j1,
                        const float *dw)
{
    float *row = db->dense + t * sp->bias->tmax;
    if (sp->variant == AFT_FULL) {
        aft_copy_stream(row + j0, dw, j1 - j0);
        return;
    }
    /* local: a line or two, asked for ahead (aft_band_bias_prefetch) */
    const size_t s = sp->window, end = t + s < sp->T ? t + s : sp->T;
    memcpy(row + j0, dw, (j1 - j0) * sizeof(float));
    if (end > j1) memset(row + j1, 0, (end - j1) * sizeof(float));
}

void aft_bias_grad_zero(const aft_opspec *sp, const aft_bias_grad *db)
{
    const aft_bias *b = sp->bias;
    if (!db) return;
    if (b->kind == AFT_BIAS_DENSE && db->dense && db->zero_outside) {
        dense_zero_used(sp, db);
    } else if (b->kind == AFT_BIAS_DENSE && db->dense) {
        dense_zero_rows(sp, db->dense, b->tmax);
    }
    if (b->kind == AFT_BIAS_FACTORED && db->u) memset(db->u, 0, b->tmax * b->rank * sizeof(float));
    if (b->kind == AFT_BIAS_FACTORED && db->v) memset(db->v, 0, b->tmax * b->rank * sizeof(float));
    if (b->kind == AFT_BIAS_CONV && db->conv) {
        /* a conv bias read by another variant: its recorded shape, if any */
        size_t n = sp->variant == AFT_CONV ? sp->conv_rows * sp->conv_len : b->conv_rows * b->conv_len;
        if (b->conv_2d) n *= sp->variant == AFT_CONV ? sp->conv_len : b->conv_len;
        memset(db->conv, 0, n * sizeof(float));
    }
}
