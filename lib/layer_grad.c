/* layer_grad.c - the layer's backward pass, beside layer.c.
 *
 * With H = AFT(Q, K, V) the operator's output and y = H Wo^T + bo:
 *   dH = dy Wo,  dWo = dy^T H,  dbo = sum over rows of dy,
 * the operator's backward pass gives dQ, dK, dV from dH, and then, the
 * three projections stacked as in the forward (Wcat = [Wq; Wk; Wv]):
 *   dX = [dQ dK dV] Wcat,  dWcat = [dQ dK dV]^T X,  dbcat = column sums.
 * Q, K and V are computed again from x (one product), and the operator
 * writes H as it goes. Time: 11 products of (rows x D x C) against the
 * forward's 4, and the operator's backward pass. */
#include "layer.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* C (M x N, rows ldc apart) = op(A) op(B): trans_a, A (K x M) (else (M x
 * K)), rows lda apart; trans_b, B (N x K) (else (K x N)). The output's rows
 * are split over the threads, one single-threaded sgemm each. */
static void gemm(int threads, int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
                 const float *B, size_t ldb, float *C, size_t ldc)
{
    aft_blas_one_thread();
    size_t nt = (size_t)(threads > 0 ? threads : 1);
    size_t step = (M + nt - 1) / nt;
    step = (step + 15) / 16 * 16;   /* whole register blocks of rows */
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt)
    for (size_t p = 0; p < nt; p++) {
        /* OpenBLAS's OpenMP build runs a product on omp_get_max_threads()
         * threads unless inside an active parallel region, and a region of
         * one thread is not active: this task's own count is 1 */
        omp_set_num_threads(1);
        size_t m0 = p * step < M ? p * step : M, m1 = m0 + step < M ? m0 + step : M;
        if (m1 > m0)
            cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                        (int)(m1 - m0), (int)N, (int)K, 1.0f, trans_a ? A + m0 : A + m0 * lda, (int)lda, B, (int)ldb,
                        0.0f, C + m0 * ldc, (int)ldc);
    }
}

/* out[c] = sum over the N rows of a[., c] (rows lda apart), in double. Each
 * thread takes a part of the columns and goes down the rows through it, so
 * every column is summed in row order (the same bits for any number of
 * threads) and no serial pass over dQKV keeps the other threads waiting. */
static aft_status column_sums(int threads, float *out, const float *a, size_t lda, size_t N, size_t n,
                              aft_error *err)
{
    double *s = aft_calloc_array(n, sizeof(double));
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu column sums", n);
    size_t nt = threads > 0 ? (size_t)threads : 1, part = ((n + nt - 1) / nt + 7) / 8 * 8;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1)
    for (size_t p = 0; p < nt; p++) {
        size_t c0 = p * part < n ? p * part : n, c1 = c0 + part < n ? c0 + part : n;
        double *restrict sp = s + c0;
        for (size_t i = 0; i < N; i++) {
            const float *restrict row = a + i * lda + c0;
            for (size_t c = 0; c < c1 - c0; c++) sp[c] += row[c];
        }
        for (size_t c = c0; c < c1; c++) out[c] = (float)s[c];
    }
    free(s);
    return AFT_OK;
}

/* ---- the float64 reference (cfg.impl AFT_IMPL_REFERENCE) */

/* y (N x n) = x (N x k) W^T + b, W (n x k) float, in double */
static void lin_d(double *y, const double *x, const float *w, const float *b, size_t N, size_t k, size_t n)
{
    for (size_t i = 0; i < N; i++)
        for (size_t o = 0; o < n; o++) {
            double s = b ? (double)b[o] : 0.0;
            for (size_t j = 0; j < k; j++) s += x[i * k + j] * (double)w[o * k + j];
            y[i * n + o] = s;
        }
}

/* dW (n x k) = dy^T (n x N) x (N x k), db = column sums of dy; dx += dy W */
static void lin_back_d(const aft_layer_grads *g, float *dw, float *db, double *dx, const double *dy, const double *x,
                       const float *w, size_t N, size_t k, size_t n)
{
    if (dw)
        for (size_t o = 0; o < n; o++)
            for (size_t j = 0; j < k; j++) {
                double s = 0.0;
                for (size_t i = 0; i < N; i++) s += dy[i * n + o] * x[i * k + j];
                dw[o * k + j] = (float)s;
            }
    if (db)
        for (size_t o = 0; o < n; o++) {
            double s = 0.0;
            for (size_t i = 0; i < N; i++) s += dy[i * n + o];
            db[o] = (float)s;
        }
    if (g->dx)
        for (size_t i = 0; i < N; i++)
            for (size_t o = 0; o < n; o++)
                for (size_t j = 0; j < k; j++) dx[i * k + j] += dy[i * n + o] * (double)w[o * k + j];
}

static aft_status layer_reference_grad(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                                       const aft_params *p, const aft_opspec *sp, size_t B, size_t T,
                                       aft_error *err)
{
    const size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C, N = B * T;
    /* x, dy, dx (N x D); q, v, h, dh, dq, dv (N x C); k, dk (N x KC) */
    size_t per = 3 * D + 6 * C + 2 * KC;
    double *buf = aft_calloc_array(N, per * sizeof(double));
    if (!buf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the reference backward pass (%zu rows)", N);
    double *xd = buf, *dyd = xd + N * D, *dx = dyd + N * D, *q = dx + N * D, *v = q + N * C, *h = v + N * C;
    double *dh = h + N * C, *dq = dh + N * C, *dv = dq + N * C, *k = dv + N * C, *dk = k + N * KC;
    for (size_t i = 0; i < N * D; i++) {
        xd[i] = x[i];
        dyd[i] = dy[i];
    }
    lin_d(q, xd, p->wq, p->bq, N, D, C);
    lin_d(k, xd, p->wk, p->bk, N, D, KC);
    lin_d(v, xd, p->wv, p->bv, N, D, C);
    /* dH = dy Wo */
    for (size_t i = 0; i < N; i++)
        for (size_t c = 0; c < C; c++) {
            double s = 0.0;
            for (size_t d = 0; d < D; d++) s += dyd[i * D + d] * (double)p->wo[d * C + c];
            dh[i * C + c] = s;
        }
    aft_status st = aft_op_grad_reference_d(dq, dk, dv, h, &g->bias, dh, q, k, v, sp, B, KC, err);
    if (st == AFT_OK) {
        if (y) {
            double *yd = aft_alloc_array(N, D * sizeof(double));
            if (!yd) {
                free(buf);
                return aft_fail(err, AFT_ERR_NOMEM, "out of memory for y (%zu x %zu)", N, D);
            }
            lin_d(yd, h, p->wo, p->bo, N, C, D);
            for (size_t i = 0; i < N * D; i++) y[i] = (float)yd[i];
            free(yd);
        }
        aft_layer_grads none = *g;
        none.dx = NULL;   /* dx does not flow back through the output projection */
        lin_back_d(&none, g->wo, g->bo, NULL, dyd, h, p->wo, N, C, D);
        lin_back_d(g, g->wq, g->bq, dx, dq, xd, p->wq, N, D, C);
        lin_back_d(g, g->wk, g->bk, dx, dk, xd, p->wk, N, D, KC);
        lin_back_d(g, g->wv, g->bv, dx, dv, xd, p->wv, N, D, C);
        if (g->dx)
            for (size_t i = 0; i < N * D; i++) g->dx[i] = (float)dx[i];
    }
    free(buf);
    return st;
}

/* ---- the fast path */

/* dWcat = dQKV^T X and dbcat = dQKV's column sums, each projection's rows
 * of them: one product and one pass over dQKV when every part is wanted
 * (a product of 3C rows runs nearer the machine's rate than three of C) */
static aft_status stacked_grads(const aft_layer_grads *g, const float *dqkv, const float *x,
                                const aft_layer_prep *lp, int nt, size_t N, aft_error *err)
{
    const size_t D = lp->D, C = lp->C, KC = lp->KC, W = lp->W;
    float *const dws[3] = {g->wq, g->wk, g->wv}, *const dbs[3] = {g->bq, g->bk, g->bv};
    const size_t off[3] = {0, C, C + KC}, rows[3] = {C, KC, C};
    int all_w = dws[0] && dws[1] && dws[2], all_b = dbs[0] && dbs[1] && dbs[2];
    float *tmp = all_w || all_b ? aft_alloc_array(W, D * sizeof(float)) : NULL;
    if ((all_w || all_b) && !tmp) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for dW (%zu x %zu)", W, D);
    aft_status st = AFT_OK;
    if (all_w) {
        gemm(nt, 1, 0, W, D, N, dqkv, W, x, D, tmp, D);
        for (int i = 0; i < 3; i++) memcpy(dws[i], tmp + off[i] * D, rows[i] * D * sizeof(float));
    }
    if (all_b && !(st = column_sums(nt, tmp, dqkv, W, N, W, err)))
        for (int i = 0; i < 3; i++) memcpy(dbs[i], tmp + off[i], rows[i] * sizeof(float));
    for (int i = 0; i < 3 && !st; i++) {
        if (dws[i] && !all_w) gemm(nt, 1, 0, rows[i], D, N, dqkv + off[i], W, x, D, dws[i], D);
        if (dbs[i] && !all_b) st = column_sums(nt, dbs[i], dqkv + off[i], W, N, rows[i], err);
    }
    free(tmp);
    return st;
}

static aft_status layer_fast_grad(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                                  const aft_layer_prep *lp, aft_opspec sp, size_t B, size_t T, aft_error *err)
{
    const aft_params *p = lp->p;
    const size_t D = lp->D, C = lp->C, KC = lp->KC, W = lp->W, N = B * T;
    const int nt = sp.threads;
    int want_h = y || g->wo;
    float *qkv = aft_alloc_array(N, W * sizeof(float));
    float *dqkv = aft_alloc_array(N, W * sizeof(float));
    float *dh = aft_alloc_array(N, C * sizeof(float));
    float *h = want_h ? aft_alloc_array(N, C * sizeof(float)) : NULL;
    aft_status st = AFT_OK;
    if (!qkv || !dqkv || !dh || (want_h && !h)) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V and their gradients (%zu x %zu)", N, W);
        goto done;
    }
    aft_linear_apply(&lp->qkv, N, x, D, qkv, W);
    gemm(nt, 0, 0, N, C, D, dy, D, p->wo, C, dh, C);   /* dH = dy Wo */
    sp.ldq = sp.ldk = sp.ldv = W;
    aft_grad_io io = {.dq = dqkv, .dk = dqkv + C, .dv = dqkv + C + KC, .lddq = W, .lddk = W, .lddv = W,
                      .dout = dh, .out = h, .db = g->bias};
    if ((st = aft_op_grad_run(&io, qkv, qkv + C, qkv + C + KC, &sp, B, KC, 0, err))) goto done;
    if (y) aft_linear_apply(&lp->o, N, h, C, y, D);
    if (g->wo) gemm(nt, 1, 0, D, C, N, dy, D, h, C, g->wo, C);   /* dWo = dy^T H */
    if (g->bo && (st = column_sums(nt, g->bo, dy, D, N, D, err))) goto done;
    if (g->dx) gemm(nt, 0, 0, N, D, W, dqkv, W, lp->wcat, D, g->dx, D);   /* dX = dQKV Wcat */
    st = stacked_grads(g, dqkv, x, lp, nt, N, err);
done:
    free(qkv);
    free(dqkv);
    free(dh);
    free(h);
    return st;
}

aft_status aft_layer_backward(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                              const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                              aft_error *err)
{
    if (!g || !p || !cfg) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) gradients, parameters or configuration");
    aft_opspec sp;
    aft_layer_prep lp;
    /* the parameters' checks, and the stacked weights for the fast path */
    aft_status st = aft_layer_prep_init(&lp, p, cfg->projections, aft_threads_or_all(cfg->threads), err);
    if (st) return st;
    size_t C = lp.C, KC = lp.KC, N;
    if (!aft_mul_ok(B, T, &N) || N > INT_MAX) {
        st = aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu exceeds the supported range", B, T);
    } else if ((st = aft_op_settle(&sp, &p->bias, cfg, B, T, C, KC, err))) {
        /* st says why */
    } else if (N == 0) {
        /* sums over no rows: every weight's gradient is 0 */
        size_t D = lp.D;
        float *const gs[8] = {g->wq, g->bq, g->wk, g->bk, g->wv, g->bv, g->wo, g->bo};
        const size_t ns[8] = {C * D, C, KC * D, KC, C * D, C, D * C, D};
        for (int i = 0; i < 8; i++)
            if (gs[i]) memset(gs[i], 0, ns[i] * sizeof(float));
        aft_grad_io io = {.db = g->bias};
        st = aft_op_grad_run(&io, NULL, NULL, NULL, &sp, 0, KC, 0, err);   /* zeroes the bias gradient */
    } else if (!x || !dy) {
        st = aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !x ? "input x" : "dy");
    } else if (cfg->impl == AFT_IMPL_REFERENCE) {
        st = layer_reference_grad(g, y, dy, x, p, &sp, B, T, err);
    } else {
        st = layer_fast_grad(g, y, dy, x, &lp, sp, B, T, err);
    }
    aft_layer_prep_free(&lp);
    return st;
}
