/* ref_grad.c - the plain float64 backward pass: the obvious loops,
 * O(T^2 C), beside ref.c. Every fast backward kernel is checked against
 * this one (and this one against finite differences, in the tests).
 *
 * For row t, channel c (head h), over the visible j:
 *   z_j = k[j,c] + w[t,j],  L = log sum_j exp(z_j),  P_j = exp(z_j - L),
 *   Y' = sum_j P_j v[j,c],  out = sigmoid(q) Y'.
 * With a = dout sigmoid(q) (dL/dY'), dL/dz_j = P_j a (v[j,c] - Y'), so
 *   dv[j,c] += P_j a,   dk[j,c] += P_j a (v[j,c] - Y'),   dw[t,j] += P_j a (v[j,c] - Y'),
 *   dq = dout Y' sigmoid'(q).
 * L is the maximum of z plus the log of sum exp(z - max) >= 1, so no
 * exponential overflows and P_j <= 1. */
#include "kernels.h"

#include <stdlib.h>

/* the bias gradient in double, the fields aft_bias_grad_wanted says */
typedef struct {
    double *dense, *u, *v, *conv;
    size_t ndense, nu, nconv;
} ref_acc;

static int acc_alloc(ref_acc *a, const aft_opspec *sp, const aft_bias_grad *db)
{
    memset(a, 0, sizeof *a);
    if (!aft_bias_grad_wanted(sp, db)) return 1;
    const aft_bias *b = sp->bias;
    if (b->kind == AFT_BIAS_DENSE) a->ndense = b->tmax * b->tmax;
    if (b->kind == AFT_BIAS_FACTORED) a->nu = b->tmax * b->rank;
    if (b->kind == AFT_BIAS_CONV) a->nconv = sp->conv_rows * sp->conv_len * (b->conv_2d ? sp->conv_len : 1);
    a->dense = aft_calloc_array(a->ndense, sizeof(double));
    a->u = aft_calloc_array(a->nu, sizeof(double));
    a->v = aft_calloc_array(a->nu, sizeof(double));
    a->conv = aft_calloc_array(a->nconv, sizeof(double));
    return a->dense && a->u && a->v && a->conv;
}

static void acc_free(ref_acc *a)
{
    free(a->dense);
    free(a->u);
    free(a->v);
    free(a->conv);
}

/* adds dw[j] = dL/dw_eff[t, j] (j < T) to the bias entries each came from */
static void acc_row(ref_acc *a, const aft_opspec *sp, size_t h, size_t t, const double *dw)
{
    const aft_bias *b = sp->bias;
    const size_t T = sp->T, s = sp->window, W = sp->grid_w;
    const int grid = aft_spec_on_grid(sp);
    for (size_t j = 0; j < T; j++) {
        size_t dist = j > t ? j - t : t - j;
        if (grid) {   /* the 2-D window |r - r'| < s, |c - c'| < s */
            size_t r = t / W, c = t % W, r2 = j / W, c2 = j % W;
            size_t dr = r2 > r ? r2 - r : r - r2, dc = c2 > c ? c2 - c : c - c2;
            if (dr >= s || dc >= s) continue;
            if (sp->variant == AFT_CONV) {
                size_t len = sp->conv_len;
                if (a->nconv)
                    a->conv[((sp->conv_rows == 1 ? 0 : h) * len + r2 + s - 1 - r) * len + c2 + s - 1 - c] += dw[j];
                continue;
            }
            dist = 0;   /* local: inside the window, the bias's entry (t, j) */
        }
        if (sp->variant == AFT_CONV) {
            if (dist < s && a->nconv) a->conv[(sp->conv_rows == 1 ? 0 : h) * sp->conv_len + j + s - 1 - t] += dw[j];
            continue;
        }
        if (sp->variant == AFT_LOCAL && dist >= s) continue;
        if (a->ndense) a->dense[t * b->tmax + j] += dw[j];
        if (a->nu)   /* w[t, j] = u[t] . v[j] */
            for (size_t i = 0; i < b->rank; i++) {
                a->u[t * b->rank + i] += dw[j] * (double)b->v[j * b->rank + i];
                a->v[j * b->rank + i] += dw[j] * (double)b->u[t * b->rank + i];
            }
    }
}

static void acc_store(const ref_acc *a, const aft_bias_grad *db)
{
    if (!db) return;
    for (size_t i = 0; i < a->ndense; i++) db->dense[i] = (float)a->dense[i];
    for (size_t i = 0; i < a->nu; i++) {
        if (db->u) db->u[i] = (float)a->u[i];
        if (db->v) db->v[i] = (float)a->v[i];
    }
    for (size_t i = 0; i < a->nconv; i++) db->conv[i] = (float)a->conv[i];
}

/* sigmoid and its derivative without overflow or cancellation: with
 * e = exp(-|q|) <= 1, sigmoid' = e / (1 + e)^2 for either sign of q */
static double sig(double q)
{
    double e = exp(-fabs(q));
    return q >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
static double dsig(double q)
{
    double e = exp(-fabs(q));
    return e / ((1.0 + e) * (1.0 + e));
}

/* the reference backward's contiguous float64 arrays, (B, T, C) each, keys
 * one per channel */
typedef struct {
    double *dq, *dk, *dv;
    double *out;                        /* or NULL */
    const double *dout, *q, *k, *v;
} ref_io;

/* The loops, on d's arrays; acc the bias gradient. The mask from
 * sp->bias, (T, T) or (B, T, T). */
static aft_status ref_grad(const ref_io *d, size_t B, const aft_opspec *sp, ref_acc *acc, aft_error *err)
{
    double *dq = d->dq, *dk = d->dk, *dv = d->dv, *out = d->out;
    const double *dout = d->dout, *q = d->q, *k = d->k, *v = d->v;
    const size_t T = sp->T, C = sp->C, H = sp->heads ? sp->heads : 1, ch = C / H;
    const uint8_t *mask = sp->bias->mask;
    float *wrow = aft_alloc_array(T, sizeof(float));
    double *wd = aft_alloc_array(T, sizeof(double));
    double *dw = aft_alloc_array(H * T, sizeof(double));
    if (!wrow || !wd || !dw) {
        free(wrow); free(wd); free(dw);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the reference backward pass (T = %zu)", T);
    }
    for (size_t i = 0; i < B * T * C; i++) dk[i] = dv[i] = 0.0;
    for (size_t b = 0; b < B; b++) {
        const size_t o = b * T * C;
        const double *kb = k + o, *vb = v + o;
        const uint8_t *mb = mask ? mask + (sp->bias->mask_batched ? b * T * T : 0) : NULL;
        for (size_t t = 0; t < T; t++) {
            for (size_t i = 0; i < H * T; i++) dw[i] = 0.0;
            for (size_t h = 0; h < H; h++) {
                aft_w_row(sp, h, t, 0, T, wrow);
                for (size_t j = 0; j < T; j++) wd[j] = wrow[j];
                for (size_t c = h * ch; c < (h + 1) * ch; c++) {
                    double M = -INFINITY;
                    int nan_key = 0;
                    for (size_t j = 0; j < T; j++) {
                        if ((sp->causal && j > t) || (mb && !mb[t * T + j])) continue;
                        nan_key |= isnan(kb[j * C + c]);
                        double z = kb[j * C + c] + wd[j];
                        M = z > M ? z : M;
                    }
                    double den = 0.0, num = 0.0;
                    /* a visible NaN key: the sums are NaN, so y is, and so
                     * is every term below (L = NaN) */
                    if (nan_key) den = num = M = NAN;
                    else if (M > -INFINITY)
                        for (size_t j = 0; j < T; j++) {
                            if ((sp->causal && j > t) || (mb && !mb[t * T + j])) continue;
                            double e = exp(kb[j * C + c] + wd[j] - M);
                            den += e;
                            num += e * vb[j * C + c];
                        }
                    size_t i = o + t * C + c;
                    double y = den > 0.0 || nan_key ? num / den : 0.0;   /* Y' */
                    if (out) out[i] = sig(q[i]) * y;
                    dq[i] = dout[i] * y * dsig(q[i]);
                    if (!(den > 0.0) && !nan_key) continue;
                    double a = dout[i] * sig(q[i]), L = M + log(den);
                    for (size_t j = 0; j < T; j++) {
                        if ((sp->causal && j > t) || (mb && !mb[t * T + j])) continue;
                        double vj = vb[j * C + c];
                        double g = exp(kb[j * C + c] + wd[j] - L) * a;
                        dv[o + j * C + c] += g;
                        dk[o + j * C + c] += g * (vj - y);
                        dw[h * T + j] += g * (vj - y);
                    }
                }
            }
            for (size_t h = 0; h < H; h++) acc_row(acc, sp, h, t, dw + h * T);
            aft_progress_done(sp->progress, 1);   /* a row: O(T C) work, one add */
        }
    }
    free(wrow); free(wd); free(dw);
    return AFT_OK;
}

/* n rows of w floats, rows ld apart, into contiguous doubles */
static void widen_rows(double *dst, const float *src, size_t n, size_t w, size_t ld)
{
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < w; c++) dst[i * w + c] = src[i * ld + c];
}

static void narrow_rows(float *dst, size_t ld, const double *src, size_t n, size_t w)
{
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < w; c++) dst[i * ld + c] = (float)src[i * w + c];
}

aft_status aft_op_reference_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                                 const aft_opspec *sp, aft_error *err)
{
    const size_t N = B * sp->T, C = sp->C;
    double *buf = aft_alloc_array(N * C, 8 * sizeof(double));
    if (!buf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the reference backward pass (%zu x %zu)", N, C);
    double *qd = buf, *kd = qd + N * C, *vd = kd + N * C, *dod = vd + N * C;
    double *dq = dod + N * C, *dk = dq + N * C, *dv = dk + N * C, *out = dv + N * C;
    widen_rows(qd, q, N, C, sp->ldq);
    widen_rows(kd, k, N, C, sp->ldk);
    widen_rows(vd, v, N, C, sp->ldv);
    widen_rows(dod, io->dout, N, C, C);
    ref_acc acc;
    aft_status st = acc_alloc(&acc, sp, &io->db) ? AFT_OK
                    : aft_fail(err, AFT_ERR_NOMEM, "out of memory for the reference bias gradient");
    if (!st) st = ref_grad(&(ref_io){dq, dk, dv, io->out ? out : NULL, dod, qd, kd, vd}, B, sp, &acc, err);
    if (!st) {
        narrow_rows(io->dq, io->lddq, dq, N, C);
        narrow_rows(io->dk, io->lddk, dk, N, C);
        narrow_rows(io->dv, io->lddv, dv, N, C);
        if (io->out) narrow_rows(io->out, C, out, N, C);
        acc_store(&acc, &io->db);
    }
    acc_free(&acc);
    free(buf);
    return st;
}

aft_status aft_op_reference_grad_d(double *dq, double *dk, double *dv, double *out, const aft_bias_grad *db,
                                   const double *dout, const double *q, const double *k, const double *v,
                                   const aft_opspec *sp, size_t B, size_t kc, aft_error *err)
{
    const size_t N = B * sp->T, C = sp->C;
    if (N == 0 || C == 0) return AFT_OK;
    /* keys of one channel per head: widened, and dk summed back per head */
    double *kw = NULL, *dkw = NULL;
    if (kc != C) {
        size_t ch = C / kc;
        kw = aft_alloc_array(N * C, 2 * sizeof(double));
        if (!kw) return aft_fail(err, AFT_ERR_NOMEM, "out of memory widening keys to %zu channels", C);
        dkw = kw + N * C;
        for (size_t i = 0; i < N; i++)
            for (size_t c = 0; c < C; c++) kw[i * C + c] = k[i * kc + c / ch];
    }
    aft_bias_grad_zero(sp, db);
    ref_acc acc;
    aft_status st = acc_alloc(&acc, sp, db) ? AFT_OK
                    : aft_fail(err, AFT_ERR_NOMEM, "out of memory for the reference bias gradient");
    if (!st) st = ref_grad(&(ref_io){dq, kw ? dkw : dk, dv, out, dout, q, kw ? kw : k, v}, B, sp, &acc, err);
    if (!st) {
        acc_store(&acc, db);
        if (kw) {
            size_t ch = C / kc;
            for (size_t i = 0; i < N; i++)
                for (size_t h = 0; h < kc; h++) {
                    double s = 0.0;
                    for (size_t c = h * ch; c < (h + 1) * ch; c++) s += dkw[i * C + c];
                    dk[i * kc + h] = s;
                }
        }
    }
    acc_free(&acc);
    free(kw);
    return st;
}
