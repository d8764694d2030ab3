/*
 * ref_aft.c - the float64 reference of the AFT operator and layer (see
 * ref_aft.h). Deliberately simple: each (b, t, c) is computed on its own from
 * the definition, with the maximum of K + w over the visible t' subtracted
 * before exp so no term overflows and the largest term is exactly 1.
 */
#include "ref_aft.h"

#include <math.h>
#include <stdlib.h>

double ref_sigmoid(double q)
{
    /* use exp of a non-positive number only: exp(-q) for large negative q
     * would overflow to inf (harmless, but this form needs no care) */
    if (q >= 0) return 1.0 / (1.0 + exp(-q));
    double e = exp(q);
    return e / (1.0 + e);
}

int ref_aft_visible(const aft_bias *bias, const aft_config *cfg, size_t b,
                    size_t T, size_t t, size_t t2)
{
    if (cfg->causal && t2 > t) return 0;
    if (bias && bias->mask) {
        const uint8_t *m = bias->mask;
        if (bias->mask_batched) m += b * T * T;
        if (!m[t * T + t2]) return 0;
    }
    return 1;
}

/* the full-variant bias w[t,t'] straight from its source */
static double base_bias(const aft_bias *bias, size_t t, size_t t2)
{
    if (!bias) return 0.0;
    switch (bias->kind) {
    case AFT_BIAS_DENSE:
        return (double)bias->dense[t * bias->tmax + t2];
    case AFT_BIAS_FACTORED: {
        /* w = U V^T: row t of u against row t2 of v, each (tmax, rank) */
        double s = 0.0;
        for (size_t r = 0; r < bias->rank; r++)
            s += (double)bias->u[t * bias->rank + r] * (double)bias->v[t2 * bias->rank + r];
        return s;
    }
    case AFT_BIAS_SEEDED:
        return (double)aft_seeded_bias(bias->seed, bias->scale, t, t2);
    case AFT_BIAS_NONE:
    case AFT_BIAS_CONV:
    default:
        return 0.0;
    }
}

/* n doubles (at least one, so n == 0 is not a failure) */
static double *alloc_d(size_t n)
{
    /* zeroed: GCC 12 cannot see that every caller writes before it reads */
    return calloc(n ? n : 1, sizeof(double));
}

static size_t absdiff(size_t a, size_t b)
{
    return a > b ? a - b : b - a;
}

/* local and conv on a grid of grid_h x grid_w in raster order: the window
 * is |r - r'| < s and |c - c'| < s around t = r grid_w + c; conv's bias is
 * (heads, 2s-1, 2s-1) (one square shared by every head when it records one
 * row), offset (r' - r, c' - c) at [r' - r + s - 1][c' - c + s - 1] */
static double grid_entry(const aft_bias *bias, const aft_config *cfg, size_t head, size_t t, size_t t2)
{
    size_t W = cfg->grid_w, s = cfg->window;
    size_t r = t / W, c = t % W, r2 = t2 / W, c2 = t2 % W;
    if (s == 0 || absdiff(r, r2) >= s || absdiff(c, c2) >= s) return 0.0;
    if (cfg->variant == AFT_LOCAL) return base_bias(bias, t, t2);
    size_t n = 2 * s - 1, sq = bias->conv_len && bias->conv_rows == 1 ? 0 : head;
    return (double)bias->conv[(sq * n + (r2 + s - 1 - r)) * n + (c2 + s - 1 - c)];
}

double ref_aft_bias_entry(const aft_bias *bias, const aft_config *cfg,
                          size_t head, size_t t, size_t t2)
{
    size_t s = cfg->window;
    if (cfg->grid_w && (cfg->variant == AFT_LOCAL || cfg->variant == AFT_CONV))
        return grid_entry(bias, cfg, head, t, t2);
    switch (cfg->variant) {
    case AFT_FULL:
        return base_bias(bias, t, t2);
    case AFT_LOCAL:
        /* window 0 means no band at all: the simple variant */
        if (s == 0 || absdiff(t, t2) >= s) return 0.0;
        return base_bias(bias, t, t2);
    case AFT_CONV:
        if (absdiff(t, t2) >= s) return 0.0;
        /* offset t2 - t runs over -(s-1) .. s-1, stored at index offset + s - 1 */
        return (double)bias->conv[head * (2 * s - 1) + (t2 + s - 1 - t)];
    case AFT_SIMPLE:
    default:
        return 0.0;
    }
}

int ref_aft_check(const aft_bias *bias, const aft_config *cfg, size_t T,
                  size_t C, size_t kc)
{
    if (!cfg) return -1;
    switch (cfg->variant) {
    case AFT_SIMPLE:
        return kc == C ? 0 : -1;
    case AFT_FULL:
    case AFT_LOCAL:
        if (kc != C) return -1;
        if (!bias) return 0;
        switch (bias->kind) {
        case AFT_BIAS_NONE:
        case AFT_BIAS_SEEDED:
            return 0;
        case AFT_BIAS_DENSE:
            return bias->dense && bias->tmax >= T ? 0 : -1;
        case AFT_BIAS_FACTORED:
            return bias->tmax >= T && (bias->rank == 0 || (bias->u && bias->v)) ? 0 : -1;
        default:
            return -1;
        }
    case AFT_CONV:
        if (!bias || bias->kind != AFT_BIAS_CONV || !bias->conv) return -1;
        if (cfg->heads == 0 || C % cfg->heads != 0 || cfg->window == 0) return -1;
        return kc == C || kc == cfg->heads ? 0 : -1;
    default:
        return -1;
    }
}

int ref_aft_op_d(double *out, const double *q, const double *k, const double *v,
                 const aft_bias *bias, const aft_config *cfg, size_t B, size_t T,
                 size_t C, size_t kc)
{
    if (ref_aft_check(bias, cfg, T, C, kc) != 0) return -1;
    size_t H = cfg->variant == AFT_CONV ? cfg->heads : 1;
    size_t per_head = C / H;
    /* per query t: which t' are visible, w[t,t'] for each head, and per channel
     * the running maximum, numerator and denominator */
    unsigned char *vis = malloc(T ? T : 1);
    double *w = alloc_d(H * T);
    double *mx = alloc_d(C);
    double *num = alloc_d(C);
    double *den = alloc_d(C);
    /* channel c reads key column kcol[c] and the bias row of its head,
     * starting at w + wrow[c] */
    size_t *kcol = malloc((C ? C : 1) * sizeof *kcol);
    size_t *wrow = malloc((C ? C : 1) * sizeof *wrow);
    int rc = -1;
    if (!vis || !w || !mx || !num || !den || !kcol || !wrow) goto done;
    for (size_t c = 0; c < C; c++) {
        kcol[c] = kc == C ? c : c / per_head;
        wrow[c] = c / per_head * T;
    }

    for (size_t b = 0; b < B; b++) {
        const double *kb = k + b * T * kc;
        const double *vb = v + b * T * C;
        for (size_t t = 0; t < T; t++) {
            for (size_t t2 = 0; t2 < T; t2++) {
                vis[t2] = (unsigned char)ref_aft_visible(bias, cfg, b, T, t, t2);
                for (size_t h = 0; h < H; h++)
                    w[h * T + t2] = ref_aft_bias_entry(bias, cfg, h, t, t2);
            }
            /* pass 1: M = max over visible t' of K[t',c] + w[t,t']; a
             * visible NaN key makes M NaN (and then stays), and the output
             * NaN: the sums hold it, whatever its bias */
            for (size_t c = 0; c < C; c++) mx[c] = -INFINITY;
            for (size_t t2 = 0; t2 < T; t2++) {
                if (!vis[t2]) continue;
                for (size_t c = 0; c < C; c++) {
                    double z = kb[t2 * kc + kcol[c]] + w[wrow[c] + t2];
                    if (isnan(kb[t2 * kc + kcol[c]])) mx[c] = NAN;
                    else if (z > mx[c]) mx[c] = z;
                }
            }
            /* pass 2: sums of exp(z - M) <= 1, the largest term exactly 1, so
             * den >= 1 whenever anything is visible */
            for (size_t c = 0; c < C; c++) num[c] = den[c] = 0.0;
            for (size_t t2 = 0; t2 < T; t2++) {
                if (!vis[t2]) continue;
                for (size_t c = 0; c < C; c++) {
                    double z = kb[t2 * kc + kcol[c]] + w[wrow[c] + t2];
                    double d = z - mx[c];
                    /* below -746 exp(d) is exactly 0 in double; skipping
                     * changes nothing but avoids glibc's slow underflow path */
                    if (d < -746.0) continue;
                    double e = exp(d);
                    num[c] += e * vb[t2 * C + c];
                    den[c] += e;
                }
            }
            double *o = out + (b * T + t) * C;
            const double *qt = q + (b * T + t) * C;
            for (size_t c = 0; c < C; c++)
                o[c] = isnan(mx[c]) ? NAN : den[c] > 0.0 ? ref_sigmoid(qt[c]) * (num[c] / den[c]) : 0.0;
        }
    }
    rc = 0;
done:
    free(vis);
    free(w);
    free(mx);
    free(num);
    free(den);
    free(kcol);
    free(wrow);
    return rc;
}

/* widen n floats to a new double array (NULL on failure) */
static double *widen(const float *x, size_t n)
{
    double *d = alloc_d(n);
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) d[i] = (double)x[i];
    return d;
}

int ref_aft_op(double *out, const float *q, const float *k, const float *v,
               const aft_bias *bias, const aft_config *cfg, size_t B, size_t T,
               size_t C, size_t kc)
{
    double *qd = widen(q, B * T * C), *kd = widen(k, B * T * kc), *vd = widen(v, B * T * C);
    int rc = -1;
    if (qd && kd && vd) rc = ref_aft_op_d(out, qd, kd, vd, bias, cfg, B, T, C, kc);
    free(qd);
    free(kd);
    free(vd);
    return rc;
}

/* out: (n, nout)   x: (n, nin)   w: (nout, nin)   bias: (nout) or NULL
 * out = x W^T + bias, in double */
static void linear_d(double *out, const double *x, const float *w, const float *bias,
                     size_t n, size_t nin, size_t nout)
{
    for (size_t i = 0; i < n; i++)
        for (size_t o = 0; o < nout; o++) {
            double s = bias ? (double)bias[o] : 0.0;
            for (size_t j = 0; j < nin; j++) s += x[i * nin + j] * (double)w[o * nin + j];
            out[i * nout + o] = s;
        }
}

int ref_aft_layer(double *y, const float *x, const aft_params *p,
                  const aft_config *cfg, size_t B, size_t T)
{
    size_t n = B * T, D = p->d_model, C = p->d_hidden, kc = p->k_out;
    double *xd = widen(x, n * D);
    double *q = alloc_d(n * C);
    double *k = alloc_d(n * kc);
    double *v = alloc_d(n * C);
    double *a = alloc_d(n * C);
    int rc = -1;
    if (!xd || !q || !k || !v || !a) goto done;
    linear_d(q, xd, p->wq, p->bq, n, D, C);
    linear_d(k, xd, p->wk, p->bk, n, D, kc);
    linear_d(v, xd, p->wv, p->bv, n, D, C);
    if (ref_aft_op_d(a, q, k, v, &p->bias, cfg, B, T, C, kc) != 0) goto done;
    linear_d(y, a, p->wo, p->bo, n, C, D);
    rc = 0;
done:
    free(xd);
    free(q);
    free(k);
    free(v);
    free(a);
    return rc;
}
