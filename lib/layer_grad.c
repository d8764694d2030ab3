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
#include "nn/bf16.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fast path's products, in pieces
 *
 * Each product is cut into pieces of output rows, and one parallel loop
 * deals a phase's pieces to the threads as they come free: a core that runs
 * slower than the other (on a shared machine they drift apart) takes fewer,
 * and no thread waits at the end of every product for the slower half. A
 * piece is one single-threaded product, so its rows come out as the whole
 * product's would (gemm.c): the same bits whichever thread runs it. */

/* pieces of rows are multiples of this: the sgemm kernel's register block
 * and whole tiles of aft's own (12 rows) */
enum { PIECE_ALIGN = 48, PIECES_PER_THREAD = AFT_GRAD_PIECES_PER_THREAD };

typedef enum { PIECE_GEMM, PIECE_LINEAR, PIECE_SUMS } piece_kind;

/* rows [m0, m1) of C (M x N, rows ldc apart) = op(A) op(B): trans_a, A
 * (K x M) (else (M x K)), rows lda apart; B (K x N), rows ldb apart.
 * PIECE_LINEAR: C = A lin^T + bias through lin (B unused). With sums (not
 * trans_a), also the piece's rows of A summed over their first K columns,
 * in double, into sums; PIECE_SUMS: only that. */
typedef struct {
    piece_kind kind;
    int trans_a;
    size_t m0, m1, N, K, lda, ldb, ldc;
    const float *A, *B;
    float *C;
    const aft_linear *lin;
    int in_place;   /* PIECE_LINEAR: aft's kernel reads A's rows where they are */
    int bf16;       /* PIECE_GEMM: bf16 operands, float32 sums (the plan's) */
    double *sums;
} piece;

typedef struct {
    piece *p;
    size_t n, cap;
    int bf16;       /* the products in bf16 (aft_config.precision, with an engine) */
} plan;

/* appends rows [0, M) of pr cut into at most `parts` pieces; with part
 * (K doubles a piece), piece i's row sums go to part + i K. *count = the
 * pieces; 0 when the plan is full. */
static int plan_add(plan *pl, const piece *pr, size_t M, size_t parts, double *part, size_t *count)
{
    size_t step = (M + parts - 1) / (parts ? parts : 1), i = 0;
    step = (step + PIECE_ALIGN - 1) / PIECE_ALIGN * PIECE_ALIGN;
    for (size_t m0 = 0; m0 < M; m0 += step, i++) {
        if (pl->n == pl->cap) return 0;
        piece x = *pr;
        x.m0 = m0;
        x.m1 = m0 + step < M ? m0 + step : M;
        x.sums = part ? part + i * pr->K : NULL;
        x.bf16 = pl->bf16;
        pl->p[pl->n++] = x;
    }
    if (count) *count = i;
    return 1;
}

/* out[c] = the pieces' row sums added in piece order: the same bits every
 * run */
static void sums_gather(float *out, const double *part, size_t pieces, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        double s = 0.0;
        for (size_t i = 0; i < pieces; i++) s += part[i * n + c];
        out[c] = (float)s;
    }
}

static void piece_sums(const piece *x)
{
    double *restrict s = x->sums;
    for (size_t c = 0; c < x->K; c++) s[c] = 0.0;
    for (size_t i = x->m0; i < x->m1; i++) {
        const float *restrict row = x->A + i * x->lda;
        for (size_t c = 0; c < x->K; c++) s[c] += row[c];
    }
}

static void piece_run(const piece *x)
{
    size_t m = x->m1 - x->m0;
    /* the sums first: they bring the rows into the cache for the product */
    if (x->sums) piece_sums(x);
    if (x->kind == PIECE_LINEAR)
        aft_linear_apply_x(x->lin, m, x->A + x->m0 * x->lda, x->lda, x->C + x->m0 * x->ldc, x->ldc, x->in_place);
    else if (x->kind == PIECE_GEMM && x->bf16)
        aft_gemm_bf16(1, x->trans_a, 0, m, x->N, x->K, x->trans_a ? x->A + x->m0 : x->A + x->m0 * x->lda, x->lda,
                      x->B, x->ldb, 0.0f, x->C + x->m0 * x->ldc, x->ldc);
    else if (x->kind == PIECE_GEMM && x->trans_a)   /* a weight's gradient: aft's kernel where it runs it */
        aft_gemm_tn(1, m, x->N, x->K, x->A + x->m0, x->lda, x->B, x->ldb, x->C + x->m0 * x->ldc, x->ldc);
    else if (x->kind == PIECE_GEMM)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)x->N, (int)x->K, 1.0f,
                    x->A + x->m0 * x->lda, (int)x->lda, x->B, (int)x->ldb, 0.0f, x->C + x->m0 * x->ldc,
                    (int)x->ldc);
}

static void plan_run(const plan *pl, int threads)
{
    aft_blas_one_thread();
    /* threads itself, not a copy: a build without OpenMP (fuzz/) drops the
     * pragma, and a copy only it read would be an unused variable */
    if (threads < 1) threads = 1;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && pl->n > 1)
    for (size_t i = 0; i < pl->n; i++) {
        /* OpenBLAS's OpenMP build runs a product on omp_get_max_threads()
         * threads unless inside an active parallel region, and a region of
         * one thread is not active: this piece's own count is 1 */
        omp_set_num_threads(1);
        piece_run(&pl->p[i]);
    }
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

/* ---- the temporaries' memory: one block, the caller's workspace (kept
 * from call to call: no page faults each time) or the call's own */

void aft_layer_ws_free(aft_layer_ws *ws)
{
    if (!ws) return;
    free(ws->mem);
    ws->mem = NULL;
    ws->cap = 0;
}

/* at *at of the block, n items of size bytes, 64-byte aligned; *at moves on
 * (base NULL: sizes only); 0 when the sizes overflow */
static int ws_take(void **out, char *base, size_t *at, size_t n, size_t size)
{
    size_t b, end;
    if (!aft_mul_ok(n, size, &b) || !aft_add_ok(*at, b, &end) || !aft_add_ok(end, 63, &end)) return 0;
    if (out) *out = base ? base + *at : NULL;
    *at = end / 64 * 64;
    return 1;
}

/* bytes of ws (grown to them) or of *own (the call's own block, freed by
 * the caller) for the sizes ws_take is asked for; NULL: out of memory */
static char *ws_block(aft_layer_ws *ws, char **own, size_t bytes)
{
    *own = NULL;
    if (!ws) return *own = malloc(bytes ? bytes : 1);
    if (ws->cap < bytes) {
        free(ws->mem);
        ws->cap = 0;
        if (!(ws->mem = malloc(bytes))) return NULL;
        ws->cap = bytes;
    }
    return ws->mem;
}

/* What the fast path holds besides its inputs */
typedef struct {
    float *qkv, *dqkv, *dh, *h;   /* (N, W), (N, W), (N, C), (N, C) */
    float *dw;                    /* dWcat (W, D), when every part is wanted */
    float *db;                    /* dbcat (W) */
    double *part;                 /* the pieces' row sums: fine (W + D) */
    plan pl;
    /* when aft's kernel runs the projections, it runs dH = dy Wo and dX =
     * dQKV Wcat too, with Wo and Wcat packed as its weights (W^T); it
     * reads the rows of dy and dQKV in place, where OpenBLAS packs them */
    int own, borrowed;            /* borrowed: lin_dh, lin_dx are the prep's */
    aft_linear dh_lin, dx_lin;
    const aft_linear *lin_dh, *lin_dx;
    /* 16-bit weights: Wo and Wcat widened for the products from W^T (the
     * forward's read the 16-bit panels) */
    float *wo, *wcat, *wmem;
    char *own_block;              /* the temporaries' block, without a workspace */
} grad_mem;

/* the temporaries of the backward of N rows, in ws (or the call's own
 * block); 0: out of memory or too many rows */
static int grad_mem_take(grad_mem *m, aft_layer_ws *ws, int with_qkv, int with_h, const aft_layer_prep *lp,
                         size_t N, size_t fine)
{
    const size_t W = lp->W, C = lp->C, D = lp->D;
    char *base = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t at = 0;
        void *q = NULL, *dq, *dh, *h = NULL, *dw, *part, *pp;
        int ok = (!with_qkv || (ws_take(&q, base, &at, N, W * sizeof(float)))) &&
                 ws_take(&dq, base, &at, N, W * sizeof(float)) && ws_take(&dh, base, &at, N, C * sizeof(float)) &&
                 (!with_h || ws_take(&h, base, &at, N, C * sizeof(float))) &&
                 ws_take(&dw, base, &at, W, (D + 1) * sizeof(float)) &&
                 ws_take(&part, base, &at, fine, (W + D) * sizeof(double)) &&
                 ws_take(&pp, base, &at, 8 * fine, sizeof(piece));
        if (!ok) return 0;
        if (pass == 0) {
            if (!(base = ws_block(ws, &m->own_block, at))) return 0;
            continue;
        }
        m->qkv = q;
        m->dqkv = dq;
        m->dh = dh;
        m->h = h;
        m->dw = dw;
        m->part = part;
        m->pl.p = pp;
        m->pl.cap = 8 * fine;
    }
    return 1;
}

/* pieces for a product that packs all of its B operand (N rows) whatever
 * its rows: as few as leave no thread more than its share of the phase's
 * work (part of all); a piece of 256 rows ran a fifth faster than two of
 * 128, and OpenBLAS packs B again for each */
static size_t few_pieces(size_t part, size_t all, size_t nt)
{
    size_t n = all ? (part * nt + all - 1) / all : 1;
    return n < 1 ? 1 : n;
}

/* The backward's products after the operator, one phase: dWcat = dQKV^T X
 * and dWo = dy^T H (few pieces: every piece packs all of X or H),
 * y = H Wo^T + bo when wanted, and dX = dQKV Wcat, whose small pieces come
 * last and even out the threads' ends; its pieces sum dQKV's rows for
 * dbcat (without dX, pieces that only sum). dWcat is one product of 3C
 * rows when every part is wanted (it runs nearer the machine's rate than
 * three of C). *np = the row-sum pieces. */
static int plan_after(grad_mem *m, const aft_layer_grads *g, float *y, const float *dy, const float *x,
                      const aft_layer_prep *lp, size_t nt, size_t N, size_t *np)
{
    const size_t D = lp->D, C = lp->C, KC = lp->KC, W = lp->W, fine = nt * PIECES_PER_THREAD;
    float *const dws[3] = {g->wq, g->wk, g->wv};
    const size_t off[3] = {0, C, C + KC}, rows[3] = {C, KC, C};
    int all_w = dws[0] && dws[1] && dws[2], any_b = g->bq || g->bk || g->bv, ok = 1;
    plan *pl = &m->pl;
    /* the phase's work in rows of D x N products: dWcat's (at most W),
     * dWo's C, y's C and dX's W */
    const size_t work = (dws[0] || dws[1] || dws[2] ? W : 0) + (g->wo ? C : 0) + (y ? C : 0) + (g->dx ? W : 0);
    piece tr = {.kind = PIECE_GEMM, .trans_a = 1, .N = D, .K = N, .lda = W, .B = x, .ldb = D, .ldc = D};
    for (int i = 0; i < 3; i++)
        if (dws[i] && (!all_w || i == 0)) {
            piece a = tr;
            a.A = m->dqkv + (all_w ? 0 : off[i]);
            a.C = all_w ? m->dw : dws[i];
            ok &= plan_add(pl, &a, all_w ? W : rows[i], few_pieces(all_w ? W : rows[i], work, nt), NULL, NULL);
        }
    if (g->wo) {   /* dWo = dy^T H */
        piece a = {.kind = PIECE_GEMM, .trans_a = 1, .N = C, .K = N, .A = dy, .lda = D, .B = m->h, .ldb = C,
                   .C = g->wo, .ldc = C};
        ok &= plan_add(pl, &a, D, few_pieces(C, work, nt), NULL, NULL);
    }
    if (y) {
        piece a = {.kind = PIECE_LINEAR, .A = m->h, .lda = C, .C = y, .ldc = D, .lin = &lp->o};
        ok &= plan_add(pl, &a, N, fine, NULL, NULL);
    }
    *np = 0;
    if (g->dx || any_b) {   /* dX = dQKV Wcat */
        piece a = {.kind = g->dx ? PIECE_GEMM : PIECE_SUMS, .N = D, .K = W, .A = m->dqkv, .lda = W, .B = m->wcat,
                   .ldb = D, .C = g->dx, .ldc = D};
        if (g->dx && m->own) {
            a.kind = PIECE_LINEAR;
            a.lin = m->lin_dx;
            a.in_place = 1;
        }
        ok &= plan_add(pl, &a, N, fine, any_b ? m->part : NULL, np);
    }
    return ok;
}

/* the stacked gradients' parts: dWcat's rows, dbcat's entries */
static void stacked_copy(const aft_layer_grads *g, const grad_mem *m, const aft_layer_prep *lp)
{
    const size_t D = lp->D, C = lp->C, KC = lp->KC;
    float *const dws[3] = {g->wq, g->wk, g->wv}, *const dbs[3] = {g->bq, g->bk, g->bv};
    const size_t off[3] = {0, C, C + KC}, rows[3] = {C, KC, C};
    int all_w = dws[0] && dws[1] && dws[2];
    for (int i = 0; i < 3; i++) {
        if (all_w) memcpy(dws[i], m->dw + off[i] * D, rows[i] * D * sizeof(float));
        if (dbs[i]) memcpy(dbs[i], m->db + off[i], rows[i] * sizeof(float));
    }
}

static void grad_mem_free(grad_mem *m)
{
    free(m->own_block);
    free(m->wmem);
    if (m->own && !m->borrowed) {
        aft_linear_free(&m->dh_lin);
        aft_linear_free(&m->dx_lin);
    }
}

/* dh and dx, when aft's kernel runs the projections: the prep's when it
 * made them, else packed here (else, or short of memory for them, OpenBLAS
 * runs these two products) */
static void own_init(grad_mem *m, const aft_layer_prep *lp)
{
    const size_t D = lp->D, C = lp->C, W = lp->W;
    if (lp->has_t) {
        m->lin_dh = &lp->dh_t;
        m->lin_dx = &lp->dx_t;
        m->own = m->borrowed = 1;
        return;
    }
    /* (bf16 products: the GEMM pieces, in bf16) */
    if (!lp->qkv.pk || lp->bf16) return;
    if (aft_linear_init_t(&m->dh_lin, m->wo, C, C, D, AFT_KERNEL_OWN, 1, NULL) != AFT_OK) return;
    if (aft_linear_init_t(&m->dx_lin, m->wcat, D, D, W, AFT_KERNEL_OWN, 1, NULL) != AFT_OK) {
        aft_linear_free(&m->dh_lin);
        return;
    }
    m->lin_dh = &m->dh_lin;
    m->lin_dx = &m->dx_lin;
    m->own = 1;
}

aft_status aft_layer_prep_grad(aft_layer_prep *lp, aft_error *err)
{
    if (lp->has_t || !lp->qkv.pk || lp->bf16 || aft_dtype_is16(lp->p->w_dtype)) return AFT_OK;
    aft_status st = aft_linear_init_t(&lp->dh_t, lp->p->wo, lp->C, lp->C, lp->D, AFT_KERNEL_OWN, 1, err);
    if (st) return st;
    if ((st = aft_linear_init_t(&lp->dx_t, lp->wcat, lp->D, lp->D, lp->W, AFT_KERNEL_OWN, 1, err))) {
        aft_linear_free(&lp->dh_t);
        return st;
    }
    lp->has_t = 1;
    return AFT_OK;
}

/* saved (aft_layer_forward_saved's, NULL: none): Q, K, V from it, not
 * made again, and the operator's sums when its kernel keeps them */
static aft_status layer_fast_grad(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                                  const float *saved, const aft_layer_prep *lp, aft_opspec sp, size_t B, size_t T,
                                  aft_layer_ws *ws, aft_error *err)
{
    const aft_params *p = lp->p;
    const size_t D = lp->D, C = lp->C, KC = lp->KC, W = lp->W, N = B * T;
    const size_t nt = (size_t)(sp.threads > 0 ? sp.threads : 1), fine = nt * PIECES_PER_THREAD;
    /* the plan: at most fine pieces for each of the first phase's two
     * products, and nt or fine for each of the second phase's six */
    grad_mem m = {.pl = {.bf16 = lp->bf16}};
    aft_status st = AFT_OK;
    if (!grad_mem_take(&m, ws, !saved, y || g->wo, lp, N, fine)) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V and their gradients (%zu x %zu)", N, W);
        goto done;
    }
    m.db = m.dw + W * D;
    m.wo = (float *)p->wo;
    m.wcat = lp->wcat;
    if (aft_dtype_is16(p->w_dtype)) {   /* Wo and Wcat (stacked as Q, K, V's are) widened */
        aft_params pw;
        if ((st = aft_params_widen(&pw, &m.wmem, p, err))) goto done;
        m.wo = (float *)pw.wo;
        m.wcat = (float *)pw.wq;   /* wq, wk, wv lie one after another: Wcat */
    }
    own_init(&m, lp);
    /* Q, K, V again, and dH = dy Wo, whose pieces sum dy's rows for dbo */
    size_t np = 0;
    piece a = {.kind = PIECE_LINEAR, .A = x, .lda = D, .C = m.qkv, .ldc = W, .lin = &lp->qkv, .in_place = 1};
    piece b = {.kind = PIECE_GEMM, .N = C, .K = D, .A = dy, .lda = D, .B = m.wo, .ldb = C, .C = m.dh, .ldc = C};
    if (m.own) {
        b.kind = PIECE_LINEAR;
        b.lin = m.lin_dh;
        b.in_place = 1;
    }
    double *bo_part = m.part + fine * W;
    if ((!saved && !plan_add(&m.pl, &a, N, fine, NULL, NULL)) ||
        !plan_add(&m.pl, &b, N, fine, g->bo ? bo_part : NULL, &np)) {
        st = aft_fail(err, AFT_ERR_ARG, "too many pieces of work (%zu threads)", nt);
        goto done;
    }
    plan_run(&m.pl, (int)nt);
    if (g->bo) sums_gather(g->bo, bo_part, np, D);
    const float *qkv = saved ? saved : m.qkv;
    aft_grad_io io = {.dq = m.dqkv, .dk = m.dqkv + C, .dv = m.dqkv + C + KC, .lddq = W, .lddk = W, .lddv = W,
                      .dout = m.dh, .out = m.h, .db = g->bias};
    if (saved && aft_op_grad_saves(&sp, B, 0)) {   /* the forward's sums, not their product again */
        io.sums_mode = AFT_SUMS_READ;
        io.sums = (float *)saved + N * W;   /* only read */
        io.sums_tag = io.sums + N * 2 * C;
    }
    sp.ldq = sp.ldk = sp.ldv = W;
    if ((st = aft_op_grad_run(&io, qkv, qkv + C, qkv + C + KC, &sp, B, KC, 0, err))) goto done;
    m.pl.n = 0;
    if (!plan_after(&m, g, y, dy, x, lp, nt, N, &np)) {
        st = aft_fail(err, AFT_ERR_ARG, "too many pieces of work (%zu threads)", nt);
        goto done;
    }
    plan_run(&m.pl, (int)nt);
    sums_gather(m.db, m.part, np, W);
    stacked_copy(g, &m, lp);
done:
    grad_mem_free(&m);
    return st;
}

/* ---- the saved forward: the backward's first steps, run by the forward
 *
 * Q, K, V by the backward's own pieces, and with the dense kernel or the
 * causal band kernel the operator's forward half as its backward runs it
 * (the dense kernel's sums: a third of that backward's products; the band
 * kernel's 1 / den and Y' per entry: its band sums and left key sums),
 * kept in the caller's buffer: (N, W) of Q, K, V, then (B, T, 2C) of them
 * and their tag. The backward starts from them,
 * and its results are the bits it gives when it makes them itself. */

/* the saved floats for B x T (N rows) with spec sp (0: the reference,
 * which saves nothing); 0 with *n unset when that overflows */
static int saved_floats(const aft_opspec *sp, const aft_config *cfg, size_t N, size_t B, size_t W, size_t C,
                        size_t *n)
{
    size_t a = 0, b = 0;
    if (cfg->impl == AFT_IMPL_REFERENCE || N == 0) {
        *n = 0;
        return 1;
    }
    if (!aft_mul_ok(N, W, &a)) return 0;
    if (aft_op_grad_saves(sp, B, 0) && (!aft_mul_ok(N, 2 * C, &b) || !aft_add_ok(b, 1, &b))) return 0;
    return aft_add_ok(a, b, n);
}

static aft_status layer_fast_forward_saved(float *y, float *saved, const float *x, const aft_layer_prep *lp,
                                           aft_opspec sp, size_t B, size_t T, aft_layer_ws *ws, aft_error *err)
{
    const size_t D = lp->D, C = lp->C, KC = lp->KC, W = lp->W, N = B * T;
    const size_t nt = (size_t)(sp.threads > 0 ? sp.threads : 1), fine = nt * PIECES_PER_THREAD;
    size_t bytes = 0;
    void *hv = NULL, *pv = NULL;
    char *own = NULL, *base = NULL;
    if (ws_take(NULL, NULL, &bytes, N, C * sizeof(float)) && ws_take(NULL, NULL, &bytes, fine, sizeof(piece)) &&
        (base = ws_block(ws, &own, bytes))) {
        bytes = 0;
        ws_take(&hv, base, &bytes, N, C * sizeof(float));
        ws_take(&pv, base, &bytes, fine, sizeof(piece));
    }
    float *h = hv;
    plan pl = {.p = pv, .cap = fine, .bf16 = lp->bf16};
    aft_status st = AFT_OK;
    piece a = {.kind = PIECE_LINEAR, .A = x, .lda = D, .C = saved, .ldc = W, .lin = &lp->qkv, .in_place = 1};
    piece o = {.kind = PIECE_LINEAR, .A = h, .lda = C, .C = y, .ldc = D, .lin = &lp->o};
    if (!h || !pl.p) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for the layer's hidden rows (%zu x %zu)", N, C);
        goto done;
    }
    if (!plan_add(&pl, &a, N, fine, NULL, NULL)) {   /* Q, K, V as the backward's pieces make them */
        st = aft_fail(err, AFT_ERR_ARG, "too many pieces of work (%zu threads)", nt);
        goto done;
    }
    plan_run(&pl, (int)nt);
    const float *q = saved, *k = saved + C, *v = saved + C + KC;
    if (aft_op_grad_saves(&sp, B, 0)) {
        aft_grad_io io = {.out = h, .sums_mode = AFT_SUMS_WRITE, .sums = saved + N * W};
        io.sums_tag = io.sums + N * 2 * C;
        sp.ldq = sp.ldk = sp.ldv = W;
        st = aft_op_grad_run(&io, q, k, v, &sp, B, KC, 0, err);
    } else {
        sp.ldq = sp.ldk = sp.ldv = W;
        st = aft_op_run(h, q, k, v, &sp, B, KC, err);
    }
    if (st) goto done;
    pl.n = 0;   /* y = H Wo^T + bo, as the backward's y */
    if (!plan_add(&pl, &o, N, fine, NULL, NULL)) {
        st = aft_fail(err, AFT_ERR_ARG, "too many pieces of work (%zu threads)", nt);
        goto done;
    }
    plan_run(&pl, (int)nt);
done:
    free(own);
    return st;
}

/* the backward's and the saved forward's start: the parameters' checks
 * and the stacked weights (lp, freed on failure), the operator settled
 * (sp), N = B T */
static aft_status spec_setup(aft_opspec *sp, size_t *N, const aft_layer_prep *lp, const aft_config *cfg, size_t B,
                             size_t T, aft_error *err)
{
    if (!aft_mul_ok(B, T, N) || *N > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu exceeds the supported range", B, T);
    return aft_spec_settle(sp, &lp->p->bias, cfg, B, T, lp->C, lp->KC, err);
}

static aft_status grad_setup(aft_layer_prep *lp, aft_opspec *sp, size_t *N, const aft_params *p,
                             const aft_config *cfg, size_t B, size_t T, aft_error *err)
{
    aft_status st = aft_layer_prep_init(lp, p, cfg->projections, cfg->precision, aft_threads_or_all(cfg->threads),
                                        err);
    if (st) return st;
    if ((st = spec_setup(sp, N, lp, cfg, B, T, err))) aft_layer_prep_free(lp);
    return st;
}

static aft_status layer_backward(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                                 const float *saved, const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                                 aft_layer_ws *ws, aft_error *err)
{
    if (!g || !p || !cfg) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) gradients, parameters or configuration");
    aft_opspec sp;
    aft_layer_prep lp;
    size_t N;
    aft_status st = grad_setup(&lp, &sp, &N, p, cfg, B, T, err);
    if (st) return st;
    size_t C = lp.C, KC = lp.KC;
    if (N == 0) {
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
    } else {
        /* the rows on the caller's counter, which the operator's backward
         * kernels count (the products around them are not counted) */
        sp.progress = aft_progress_plan(cfg->progress, N);
        aft_params pw;
        float *wmem = NULL;
        if (cfg->impl == AFT_IMPL_REFERENCE && !(st = aft_params_widen(&pw, &wmem, p, err)))
            st = layer_reference_grad(g, y, dy, x, &pw, &sp, B, T, err);
        else if (cfg->impl != AFT_IMPL_REFERENCE)
            st = layer_fast_grad(g, y, dy, x, saved, &lp, sp, B, T, ws, err);
        free(wmem);
    }
    aft_layer_prep_free(&lp);
    return st;
}

aft_status aft_layer_backward(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                              const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                              aft_error *err)
{
    return layer_backward(g, y, dy, x, NULL, p, cfg, B, T, NULL, err);
}

aft_status aft_layer_backward_saved(const aft_layer_grads *g, const float *saved, const float *dy, const float *x,
                                    const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                                    aft_layer_ws *ws, aft_error *err)
{
    if (!saved && cfg && cfg->impl != AFT_IMPL_REFERENCE && B && T) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) saved");
    return layer_backward(g, NULL, dy, x, saved, p, cfg, B, T, ws, err);
}

aft_status aft_layer_saved_floats(const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t *n,
                                  aft_error *err)
{
    if (!p || !cfg || !n) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) parameters, configuration or n");
    aft_opspec sp;
    aft_layer_prep lp;
    size_t N;
    aft_status st = grad_setup(&lp, &sp, &N, p, cfg, B, T, err);
    if (st) return st;
    if (!saved_floats(&sp, cfg, N, B, lp.W, lp.C, n))
        st = aft_fail(err, AFT_ERR_ARG, "the saved forward of B * T = %zu * %zu rows overflows", B, T);
    aft_layer_prep_free(&lp);
    return st;
}

aft_status aft_layer_forward_saved(float *y, float *saved, const float *x, const aft_params *p,
                                   const aft_config *cfg, size_t B, size_t T, aft_layer_ws *ws, aft_error *err)
{
    if (!p || !cfg) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) parameters or configuration");
    /* the reference, and no rows: nothing to save */
    if (cfg->impl == AFT_IMPL_REFERENCE || B == 0 || T == 0) return aft_layer_forward(y, x, p, cfg, B, T, err);
    aft_opspec sp;
    aft_layer_prep lp;
    size_t N;
    aft_status st = grad_setup(&lp, &sp, &N, p, cfg, B, T, err);
    if (st) return st;
    if (!y || !x || !saved)
        st = aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !y ? "y" : !x ? "input x" : "saved");
    else
        st = layer_fast_forward_saved(y, saved, x, &lp, sp, B, T, ws, err);
    aft_layer_prep_free(&lp);
    return st;
}

/* ---- the same on a prep made once (aft_layer_prep_init, then
 * aft_layer_prep_grad for the backward): the model's training step calls
 * these for every group with one step's weights, which are stacked and
 * packed once instead of at every call */

aft_status aft_layer_forward_saved_prep(float *y, float *saved, const float *x, const aft_layer_prep *lp,
                                        const aft_config *cfg, size_t B, size_t T, aft_layer_ws *ws, aft_error *err)
{
    if (!lp || !cfg || !y || !x || !saved || cfg->impl == AFT_IMPL_REFERENCE || B == 0 || T == 0)
        return aft_fail(err, AFT_ERR_ARG, "the prepared forward needs y, x, saved, a prep and rows, fast");
    aft_opspec sp;
    size_t N;
    aft_status st = spec_setup(&sp, &N, lp, cfg, B, T, err);
    return st ? st : layer_fast_forward_saved(y, saved, x, lp, sp, B, T, ws, err);
}

aft_status aft_layer_backward_saved_prep(const aft_layer_grads *g, const float *saved, const float *dy,
                                         const float *x, const aft_layer_prep *lp, const aft_config *cfg, size_t B,
                                         size_t T, aft_layer_ws *ws, aft_error *err)
{
    if (!g || !lp || !cfg || !saved || !dy || !x || cfg->impl == AFT_IMPL_REFERENCE || B == 0 || T == 0)
        return aft_fail(err, AFT_ERR_ARG, "the prepared backward needs saved, dy, x, a prep and rows, fast");
    aft_opspec sp;
    size_t N;
    aft_status st = spec_setup(&sp, &N, lp, cfg, B, T, err);
    if (st) return st;
    sp.progress = aft_progress_plan(cfg->progress, N);
    return layer_fast_grad(g, NULL, dy, x, saved, lp, sp, B, T, ws, err);
}
