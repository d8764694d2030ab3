/* full_grad.c - the backward pass with an explicit T x T pattern (full,
 * and any variant under a mask), beside full.c: O(T^2 C) time through
 * blocked products, O(T C) memory; exp(w) is held for one block of rows
 * per thread, as in the forward.
 *
 * For a block of query rows, with E = exp(w - r) (r each row's maximum
 * over what it sees, invisible entries 0) and, per chunk of keys,
 * R = [exp(k - mk) v | exp(k - mk)] (mk the chunk's key maximum):
 *   [num | den] = E R            the forward, in units of exp(r + M) (M the
 *                                block's largest mk), L = r + M + log den
 *   G = a exp(r + M - L) = a / den,   Gp = f [G | -Y' G],  f = exp(mk - M) <= 1
 *   dw = E .* (Gp R^T)           the bias's gradient, a block of rows
 *   H += E^T Gp                  summed over the blocks; at the end
 *   dv = exp(k - mk) H1,  dk = exp(k - mk) (v H1 + H2)
 * Three products of the block's E against the forward's one, each run by
 * OpenBLAS on one thread. Every factor but G is <= 1, and G <= a e^46
 * unless den fell below e^-46: such entries (and those whose den
 * underflowed outright) are done exactly in double, as the forward does,
 * so what underflow drops is below e^-41 a. */
#include "kernels.h"
#include "nn/bf16.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

enum { CAUSAL_CHUNK = 256, DW_COLS = 512 };
#define GF_EXACT 46.0
/* e^-GF_EXACT: a den at least this keeps exp(r + M - L) = 1 / den within
 * e^GF_EXACT */
#define GF_DEN_MIN 1.0530617e-20f

static inline int visible(const uint8_t *mask, int causal, size_t T, size_t t, size_t j)
{
    return !(causal && j > t) && !(mask && !mask[t * T + j]);
}

/* what the threads share */
typedef struct {
    const aft_opspec *ws;
    const aft_grad_io *io;
    const float *q, *k, *v, *rhs, *mk;
    const uint8_t *mask;
    size_t T, C, H, ch, chunk, rows, nt;
    int want_dw;
    int mode;      /* AFT_SUMS_*, as it applies to this run */
    float *sums;   /* (T, 2C): the saved sums, or NULL */
    float **hs;   /* per thread (T, 2C): sum of E^T Gp, per head [H1 | H2] */
    float **ds;   /* per thread (T, 2C) or NULL: exact terms, [dv | dk] */
} fjob;

/* one thread's buffers */
typedef struct {
    float *e;      /* (rows, T): E */
    float *acc, *tmp, *gp;   /* (rows, 2ch) */
    float *y, *a, *g;   /* (rows, ch): Y', a, G */
    double *L;     /* (rows, ch) */
    float *r, *M, *f;        /* (rows), (ch), (ch) */
    unsigned char *vis, *redo;   /* (rows), (rows, ch) */
    float *wrow, *dwrow;     /* (T) each */
    float *dws;    /* (rows, DW_COLS) */
} fscratch;

// row t's L and Y' for channel c of head h exactly in double, over the
// visible keys; wrow: w's row t
static void exact_forward(const fjob *jb, size_t t, size_t tv, size_t cc, const float *wrow, double *L, float *Y)
{
    const aft_opspec *ws = jb->ws;
    double M = -INFINITY;
    for (size_t j = 0; j < tv; j++)
        if (visible(jb->mask, ws->causal, jb->T, t, j)) {
            double z = (double)jb->k[j * ws->ldk + cc] + (double)wrow[j];
            M = z > M ? z : M;
        }
    double den = 0.0, num = 0.0;
    if (M > -INFINITY)
        for (size_t j = 0; j < tv; j++)
            if (visible(jb->mask, ws->causal, jb->T, t, j)) {
                double e = exp((double)jb->k[j * ws->ldk + cc] + (double)wrow[j] - M);
                den += e;
                num += e * (double)jb->v[j * ws->ldv + cc];
            }
    *L = M + log(den);
    *Y = den > 0.0 ? (float)(num / den) : 0.0f;
}

/* Row of a block, ch channels, where den is a fair float: Y' = num / den,
 * the outputs, dq, a and G = a / den. bad[c] (1) where den fell below
 * GF_DEN_MIN or num or den is not finite: entry_exact redoes those. (Its
 * own function, restrict pointers and only inlined calls: one vector
 * loop.) */
static inline __attribute__((always_inline)) int
row_entries(float *restrict Y, float *restrict A, float *restrict G, unsigned char *restrict bad, float *restrict out,
            float *restrict dq, const float *restrict num, const float *restrict den, const float *restrict q,
            const float *restrict dout, size_t n)
{
    int any = 0;
    for (size_t c = 0; c < n; c++) {
        float d = den[c], y = num[c] / d, sq, ds;
        aft_sig_parts(q[c], &sq, &ds);
        if (out) out[c] = sq * y;
        dq[c] = dout[c] * y * ds;
        A[c] = dout[c] * sq;
        G[c] = A[c] / d;
        Y[c] = y;
        bad[c] = !(d >= GF_DEN_MIN) | !(d <= 3.4e38f) | !(fabsf(num[c]) <= 3.4e38f);
        any |= bad[c];
    }
    return any;
}

/* Y' of entry (i, c) of the block (row t = i0 + i, channel c of head h)
 * that row_entries could not take, and L (both kept in sc): a row that
 * sees no key has Y' = 0; L in double from den where den is a float still
 * (r + M + log den), else from the exact sums (den underflowed, or num or
 * den overflowed) */
static float entry_y(const fjob *jb, fscratch *sc, size_t h, size_t i0, size_t i, size_t c, size_t tv)
{
    const size_t t = i0 + i, ch = jb->ch, k = i * ch + c;
    const float num = sc->acc[i * 2 * ch + c], den = sc->acc[i * 2 * ch + ch + c];
    double L = -INFINITY;
    float Y = 0.0f;
    if (!sc->vis[i]) {
        /* nothing visible: Y' = 0 */
    } else if (den >= AFT_DEN_EXACT_BELOW && isfinite(num) && isfinite(den)) {
        L = (double)sc->r[i] + (double)sc->M[c] + log((double)den);
        Y = num / den;
    } else {
        aft_w_row(jb->ws, h, t, 0, tv, sc->wrow);
        exact_forward(jb, t, tv, h * ch + c, sc->wrow, &L, &Y);
    }
    sc->L[k] = L;
    sc->y[k] = Y;
    return Y;
}

/* Entry (i, c) that row_entries could not take: Y' and L by entry_y; the
 * output, dq, a, and G = a exp(r + M - L) unless that passes e^GF_EXACT,
 * when redo[c] = 1 and the gradient's terms too are taken exactly
 * (block_exact). */
static void entry_exact(const fjob *jb, fscratch *sc, size_t h, size_t i0, size_t i, size_t c, size_t tv)
{
    const aft_opspec *ws = jb->ws;
    const size_t t = i0 + i, C = jb->C, ch = jb->ch, cc = h * ch + c, k = i * ch + c;
    float Y = entry_y(jb, sc, h, i0, i, c, tv);
    double L = sc->L[k];
    float sq, ds, dout = jb->io->dout[t * C + cc];
    aft_sig_parts(jb->q[t * ws->ldq + cc], &sq, &ds);
    if (jb->io->out) jb->io->out[t * C + cc] = sq * Y;
    jb->io->dq[t * jb->io->lddq + cc] = dout * Y * ds;
    sc->a[k] = dout * sq;
    double x = (double)sc->r[i] + (double)sc->M[c] - L;
    sc->redo[k] = sc->vis[i] && !(x <= GF_EXACT);
    sc->g[k] = sc->vis[i] && !sc->redo[k] ? sc->a[k] * aft_expf((float)x) : 0.0f;
}

/* The block's E = exp(w - r) (sc->e, rows tv apart) with invisible entries
 * 0, each row's r (sc->r) and whether it sees any key (sc->vis); M (sc->M):
 * the block's largest key maximum over the nc chunks it sees */
static void block_e(const fjob *jb, fscratch *sc, size_t h, size_t i0, size_t bi, size_t tv, size_t nc)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, C = jb->C, ch = jb->ch;
    const int causal = ws->causal;
    float *E = sc->e;
    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i, nv = causal ? t + 1 : tv;
        float *er = E + i * tv;
        const uint8_t *mrow = jb->mask ? jb->mask + t * T : NULL;
        aft_w_row(ws, h, t, 0, tv, er);
        float r = aft_full_visible_max(er, nv, mrow);
        sc->vis[i] = r > -INFINITY;
        r = isfinite(r) ? r : 0.0f;
        sc->r[i] = r;
        aft_full_exp_row(er, nv, tv, r, mrow);
    }
    for (size_t c = 0; c < ch; c++) {
        float M = -INFINITY;
        for (size_t jc = 0; jc < nc; jc++) M = jb->mk[jc * C + h * ch + c] > M ? jb->mk[jc * C + h * ch + c] : M;
        sc->M[c] = M;
    }
}

/* C = beta C + op(A) op(B), one thread's call: cblas_sgemm, or with bf16
 * operands and float32 sums when the run asks for bf16 products
 * (aft_config.precision) */
static void product(const aft_opspec *ws, int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A,
                    size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    if (ws->bf16)
        aft_gemm_bf16(1, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M,
                    (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* The block's forward, [num | den] = E R into sc->acc, each of the nc
 * chunks brought to M */
static void block_sums(const fjob *jb, fscratch *sc, size_t h, size_t bi, size_t tv, size_t nc)
{
    const size_t C = jb->C, C2 = 2 * C, ch = jb->ch, ch2 = 2 * ch, chunk = jb->chunk;
    const float *E = sc->e;
    for (size_t jc = 0; jc < nc; jc++) {
        size_t j0 = jc * chunk, j1 = j0 + chunk < tv ? j0 + chunk : tv;
        float *dst = nc == 1 ? sc->acc : sc->tmp;
        product(jb->ws, 0, 0, bi, ch2, j1 - j0, E + j0, tv, jb->rhs + j0 * C2 + h * ch2, C2, 0.0f, dst, ch2);
        if (nc == 1) break;
        for (size_t c = 0; c < ch; c++) sc->f[c] = aft_expf(jb->mk[jc * C + h * ch + c] - sc->M[c]);
        for (size_t i = 0; i < bi; i++) {
            float *a = sc->acc + i * ch2, *tp = sc->tmp + i * ch2;
            for (size_t c = 0; c < ch; c++) {
                float pn = jc ? a[c] : 0.0f, pd = jc ? a[ch + c] : 0.0f;
                a[c] = pn + tp[c] * sc->f[c];
                a[ch + c] = pd + tp[ch + c] * sc->f[c];
            }
        }
    }
}

/* Y', the outputs, dq, a and G = a exp(r + M - L) = a / den: a vector
 * loop a row; the entries it marks bad one at a time (entry_exact) */
static void block_entries(const fjob *jb, fscratch *sc, size_t h, size_t i0, size_t bi, size_t tv)
{
    const aft_opspec *ws = jb->ws;
    const size_t C = jb->C, ch = jb->ch, ch2 = 2 * ch;
    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i, o = t * C + h * ch;
        const float *acc = sc->acc + i * ch2;
        float *out = jb->io->out ? jb->io->out + o : NULL, *dq = jb->io->dq + t * jb->io->lddq + h * ch;
        unsigned char *redo = sc->redo + i * ch;
        int any = !sc->vis[i] ||
                  row_entries(sc->y + i * ch, sc->a + i * ch, sc->g + i * ch, redo, out, dq, acc, acc + ch,
                              jb->q + t * ws->ldq + h * ch, jb->io->dout + o, ch);
        for (size_t c = 0; c < ch && any; c++)
            if (!sc->vis[i] || redo[c]) entry_exact(jb, sc, h, i0, i, c, tv);
    }
}

/* The forward half alone (AFT_SUMS_WRITE): the block's outputs as
 * block_entries writes them, by the same code (row_entries, with dout 0
 * and dq into sc->tmp, free once the sums are made) */
static void block_outs(const fjob *jb, fscratch *sc, size_t h, size_t i0, size_t bi, size_t tv)
{
    const aft_opspec *ws = jb->ws;
    const size_t C = jb->C, ch = jb->ch, ch2 = 2 * ch;
    float *zero = sc->tmp, *dq = sc->tmp + ch;
    memset(zero, 0, ch * sizeof(float));
    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i;
        const float *acc = sc->acc + i * ch2, *q = jb->q + t * ws->ldq + h * ch;
        float *out = jb->io->out + t * C + h * ch;
        unsigned char *redo = sc->redo + i * ch;
        int any = !sc->vis[i] || row_entries(sc->y + i * ch, sc->a + i * ch, sc->g + i * ch, redo, out, dq, acc,
                                             acc + ch, q, zero, ch);
        for (size_t c = 0; c < ch && any; c++) {
            if (sc->vis[i] && !redo[c]) continue;
            float Y = entry_y(jb, sc, h, i0, i, c, tv), sq, ds;
            aft_sig_parts(q[c], &sq, &ds);
            out[c] = sq * Y;
        }
    }
}

/* the block's [num | den] to or from the saved sums (T, 2C), head h's
 * 2ch columns of rows [i0, i0 + bi) */
static void sums_copy(const fjob *jb, fscratch *sc, size_t h, size_t i0, size_t bi, int store)
{
    const size_t C2 = 2 * jb->C, ch2 = 2 * jb->ch;
    for (size_t i = 0; i < bi; i++) {
        float *saved = jb->sums + (i0 + i) * C2 + h * ch2, *acc = sc->acc + i * ch2;
        if (store) memcpy(saved, acc, ch2 * sizeof(float));
        else memcpy(acc, saved, ch2 * sizeof(float));
    }
}

/* The block's share of the backward: per chunk of keys Gp = f [G | -Y' G],
 * H += E^T Gp (the thread's H) and, wanted, dw = E .* (Gp R^T) a block of
 * DW_COLS columns at a time */
static void block_backward(const fjob *jb, fscratch *sc, const aft_bias_grad *db, size_t tid, size_t h, size_t i0,
                           size_t bi, size_t tv, size_t nc)
{
    const aft_opspec *ws = jb->ws;
    const size_t C = jb->C, C2 = 2 * C, ch = jb->ch, ch2 = 2 * ch, chunk = jb->chunk;
    const float *E = sc->e;
    float *H = jb->hs[tid];
    for (size_t jc = 0; jc < nc; jc++) {
        size_t j0 = jc * chunk, j1 = j0 + chunk < tv ? j0 + chunk : tv;
        for (size_t c = 0; c < ch; c++) sc->f[c] = nc == 1 ? 1.0f : aft_expf(jb->mk[jc * C + h * ch + c] - sc->M[c]);
        for (size_t i = 0; i < bi; i++) {
            float *gp = sc->gp + i * ch2;
            const float *g = sc->g + i * ch, *y = sc->y + i * ch;
            for (size_t c = 0; c < ch; c++) {
                float g1 = g[c] * sc->f[c];
                gp[c] = g1;
                gp[ch + c] = -g1 * y[c];
            }
        }
        product(ws, 1, 0, j1 - j0, ch2, bi, E + j0, tv, sc->gp, ch2, 1.0f, H + j0 * C2 + h * ch2, C2);
        if (!jb->want_dw) continue;
        for (size_t c0 = j0; c0 < j1; c0 += DW_COLS) {
            size_t c1 = c0 + DW_COLS < j1 ? c0 + DW_COLS : j1, n = c1 - c0;
            product(ws, 0, 1, bi, n, ch2, sc->gp, ch2, jb->rhs + c0 * C2 + h * ch2, C2, 0.0f, sc->dws, DW_COLS);
            for (size_t i = 0; i < bi; i++) {
                float *d = sc->dws + i * DW_COLS;
                const float *er = E + i * tv + c0;
                for (size_t j = 0; j < n; j++) d[j] *= er[j];
                if (jb->io->db_set) aft_w_row_grad_set(ws, db, i0 + i, c0, c1, d);
                else aft_w_row_grad(ws, db, h, i0 + i, c0, c1, d);
            }
        }
    }
}

/* the entries whose den was below e^-46, exactly: their terms to the
 * thread's exact sums (made on first need) and dw. Returns 0 when out of
 * memory for those. */
static int block_exact(const fjob *jb, fscratch *sc, const aft_bias_grad *db, size_t tid, size_t h, size_t i0,
                       size_t bi, size_t tv)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, C = jb->C, C2 = 2 * C, ch = jb->ch;
    const int causal = ws->causal;
    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i;
        const unsigned char *redo = sc->redo + i * ch;
        int any = 0;
        for (size_t c = 0; c < ch; c++) any |= redo[c];
        if (!any) continue;
        if (!jb->ds[tid]) {
            jb->ds[tid] = aft_calloc_array(T, C2 * sizeof(float));
            if (!jb->ds[tid]) return 0;
        }
        float *D = jb->ds[tid];
        aft_w_row(ws, h, t, 0, tv, sc->wrow);
        memset(sc->dwrow, 0, tv * sizeof(float));
        for (size_t c = 0; c < ch; c++) {
            if (!redo[c]) continue;
            size_t cc = h * ch + c;
            double L = sc->L[i * ch + c], y = sc->y[i * ch + c], a = sc->a[i * ch + c];
            for (size_t j = 0; j < tv; j++) {
                if (!visible(jb->mask, causal, T, t, j)) continue;
                double vj = jb->v[j * ws->ldv + cc];
                double g = exp((double)jb->k[j * ws->ldk + cc] + (double)sc->wrow[j] - L) * a;
                D[j * C2 + cc] += (float)g;
                D[j * C2 + C + cc] += (float)(g * (vj - y));
                sc->dwrow[j] += (float)(g * (vj - y));
            }
        }
        if (jb->want_dw) aft_w_row_grad(ws, db, h, t, 0, tv, sc->dwrow);
    }
    return 1;
}

/* Rows [i0, i1) of head h on the calling thread. Returns 0 when out of
 * memory for the exact terms. */
static int full_block(const fjob *jb, fscratch *sc, const aft_bias_grad *db, size_t tid, size_t h, size_t i0,
                      size_t i1)
{
    const size_t T = jb->T, chunk = jb->chunk;
    const size_t bi = i1 - i0, tv = jb->ws->causal ? i1 : T, nc = (tv + chunk - 1) / chunk;
    block_e(jb, sc, h, i0, bi, tv, nc);
    if (jb->mode == AFT_SUMS_READ) sums_copy(jb, sc, h, i0, bi, 0);   /* the forward's product, kept */
    else block_sums(jb, sc, h, bi, tv, nc);
    if (jb->mode == AFT_SUMS_WRITE) {
        sums_copy(jb, sc, h, i0, bi, 1);
        block_outs(jb, sc, h, i0, bi, tv);
        return 1;
    }
    block_entries(jb, sc, h, i0, bi, tv);
    block_backward(jb, sc, db, tid, h, i0, bi, tv, nc);
    return block_exact(jb, sc, db, tid, h, i0, bi, tv);
}

static int fscratch_alloc(fscratch *sc, size_t rows, size_t T, size_t ch)
{
    memset(sc, 0, sizeof *sc);
    sc->e = aft_alloc_array(rows, T * sizeof(float));
    sc->acc = aft_alloc_array(rows, 2 * ch * sizeof(float));
    sc->tmp = aft_alloc_array(rows, 2 * ch * sizeof(float));
    sc->gp = aft_alloc_array(rows, 2 * ch * sizeof(float));
    sc->y = aft_alloc_array(rows, ch * sizeof(float));
    sc->a = aft_alloc_array(rows, ch * sizeof(float));
    sc->g = aft_alloc_array(rows, ch * sizeof(float));
    sc->L = aft_alloc_array(rows, ch * sizeof(double));
    sc->r = aft_alloc_array(rows, sizeof(float));
    sc->M = aft_alloc_array(ch, sizeof(float));
    sc->f = aft_alloc_array(ch, sizeof(float));
    sc->vis = malloc(rows);
    sc->redo = malloc(rows * ch);
    sc->wrow = aft_alloc_array(T, sizeof(float));
    sc->dwrow = aft_alloc_array(T, sizeof(float));
    sc->dws = aft_alloc_array(rows, DW_COLS * sizeof(float));
    return sc->e && sc->acc && sc->tmp && sc->gp && sc->y && sc->a && sc->g && sc->L && sc->r && sc->M && sc->f && sc->vis &&
           sc->redo && sc->wrow && sc->dwrow && sc->dws;
}

static void fscratch_free(fscratch *sc)
{
    free(sc->e); free(sc->acc); free(sc->tmp); free(sc->gp); free(sc->y); free(sc->a); free(sc->g); free(sc->L);
    free(sc->r); free(sc->M); free(sc->f); free(sc->vis); free(sc->redo); free(sc->wrow); free(sc->dwrow);
    free(sc->dws);
}

/* mk (nchunk, C) per chunk, the threads taking ranges of channels (without
 * causality there is one chunk, which by chunks ran on one thread); then R
 * = [exp(k - mk) v | exp(k - mk)] per head into rhs (T, 2C), by rows */
static void grad_rhs(const fjob *jb, float *rhs, float *mk, size_t nchunk)
{
    const aft_opspec *ws = jb->ws;
    const float *k = jb->k, *v = jb->v;
    const size_t T = jb->T, C = jb->C, C2 = 2 * C, H = jb->H, ch = jb->ch, chunk = jb->chunk, nt = jb->nt;
    #pragma omp parallel for schedule(static) num_threads((int)nt)
    for (size_t x = 0; x < nchunk * nt; x++) {
        size_t jc = x / nt, p = x % nt, c0 = C * p / nt, c1 = C * (p + 1) / nt;
        size_t j0 = jc * chunk, j1 = j0 + chunk < T ? j0 + chunk : T;
        float *m = mk + jc * C;
        for (size_t c = c0; c < c1; c++) m[c] = -INFINITY;
        for (size_t j = j0; j < j1; j++)
            for (size_t c = c0; c < c1; c++) m[c] = k[j * ws->ldk + c] > m[c] ? k[j * ws->ldk + c] : m[c];
        for (size_t c = c0; c < c1; c++) m[c] = isfinite(m[c]) ? m[c] : 0.0f;
    }
    #pragma omp parallel for schedule(static) num_threads((int)nt)
    for (size_t j = 0; j < T; j++) {
        const float *m = mk + j / chunk * C;
        for (size_t h = 0; h < H; h++) {
            float *dst = rhs + j * C2 + h * 2 * ch;
            for (size_t c = 0; c < ch; c++) {
                size_t cc = h * ch + c;
                float e = aft_expf(k[j * ws->ldk + cc] - m[cc]);
                dst[c] = e * v[j * ws->ldv + cc];
                dst[ch + c] = e;
            }
        }
    }
}

/* dv = exp(k - mk) H1 (+ exact terms), dk = exp(k - mk) (v H1 + H2) for
 * thread tid's share of the rows, the n threads' sums added in order */
static void grad_dv_dk(const fjob *jb, size_t tid, size_t n)
{
    const aft_grad_io *io = jb->io;
    const size_t T = jb->T, C = jb->C, C2 = 2 * C, H = jb->H, ch = jb->ch;
    size_t j0 = T * tid / n, j1 = T * (tid + 1) / n;
    for (size_t j = j0; j < j1; j++)
        for (size_t h = 0; h < H; h++)
            for (size_t c = 0; c < ch; c++) {
                size_t cc = h * ch + c, o = j * C2 + h * 2 * ch + c;
                float h1 = 0.0f, h2 = 0.0f, xv = 0.0f, xk = 0.0f;
                for (size_t p = 0; p < n; p++) {
                    h1 += jb->hs[p][o];
                    h2 += jb->hs[p][o + ch];
                    if (jb->ds[p]) {
                        xv += jb->ds[p][j * C2 + cc];
                        xk += jb->ds[p][j * C2 + C + cc];
                    }
                }
                float e = jb->rhs[o + ch], x = e * h1;
                io->dv[j * io->lddv + cc] = x + xv;
                io->dk[j * io->lddk + cc] = x * jb->v[j * jb->ws->ldv + cc] + e * h2 + xk;
            }
}

/* The blocks of rows over the threads (full_block), then each thread's
 * share of dv and dk and its private bias gradient merged. Returns 0 when
 * out of memory. */
static int grad_blocks(const fjob *jb)
{
    const aft_opspec *ws = jb->ws;
    const aft_grad_io *io = jb->io;
    const size_t T = jb->T, C2 = 2 * jb->C;
    const size_t nblk = (T + jb->rows - 1) / jb->rows, ntask = jb->H * nblk;
    int failed = 0;
    #pragma omp parallel num_threads((int)jb->nt)
    {
        /* OpenBLAS's OpenMP build runs a product on omp_get_max_threads()
         * threads unless inside an active parallel region, and a region of
         * one thread is not active: this task's own count is 1 (the setting
         * ends with the region) */
        omp_set_num_threads(1);
        size_t tid = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
        fscratch sc;
        aft_bias_grad mine;
        float *priv = NULL;
        /* the forward half alone needs neither H nor a bias gradient */
        const int fwd = jb->mode == AFT_SUMS_WRITE;
        int ok = fscratch_alloc(&sc, jb->rows, T, jb->ch) &&
                 (fwd || aft_bias_grad_private(ws, &io->db, &mine, &priv));
        if (!fwd) jb->hs[tid] = aft_calloc_array(T, C2 * sizeof(float));
        if (!ok || (!fwd && !jb->hs[tid])) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            /* under causality the late blocks, which see more keys, first,
             * taken as threads come free: where one thread runs slower (a
             * shared machine), dealing them round-robin, which would give
             * the same sums in every run, made the backward pass 15%
             * slower. So a thread's partial sums hold whichever blocks it
             * took, and with more than one thread the last bits of dk, dv
             * and the bias's gradient can differ from run to run. */
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < ntask; task++) {
                size_t h = task / nblk, b = task % nblk;
                if (ws->causal) b = nblk - 1 - b;
                size_t i0 = b * jb->rows, i1 = i0 + jb->rows < T ? i0 + jb->rows : T;
                if (!full_block(jb, &sc, &mine, tid, h, i0, i1)) {
                    #pragma omp atomic write
                    failed = 1;
                }
                /* the block's rows, a head's share of them: one add a block */
                size_t nr = i1 - i0;
                if (!fwd) aft_progress_done(ws->progress, nr * (h + 1) / jb->H - nr * h / jb->H);
            }
        }
        #pragma omp barrier
        if (!failed && !fwd) {
            grad_dv_dk(jb, tid, n);
            if (priv) {
                #pragma omp critical(aft_full_grad_merge)
                aft_bias_grad_merge(ws, &io->db, &mine);
            }
        }
        free(priv);
        fscratch_free(&sc);
    }
    return !failed;
}

// io's arrays, q, k, v: one batch's rows   mask: (T, T) or NULL
aft_status aft_op_full_grad(const aft_grad_io *io, const float *q, const float *k, const float *v,
                            const uint8_t *mask, const aft_opspec *ws, aft_error *err)
{
    const size_t T = ws->T, C = ws->C, C2 = 2 * C, nt = (size_t)ws->threads;
    const size_t H = ws->variant == AFT_CONV && ws->heads ? ws->heads : 1, ch = C / H;
    if (T == 0 || C == 0) return AFT_OK;
    aft_blas_one_thread();
    const size_t chunk = ws->causal ? CAUSAL_CHUNK : T, nchunk = (T + chunk - 1) / chunk;
    fjob jb = {.ws = ws, .io = io, .q = q, .k = k, .v = v, .mask = mask, .T = T, .C = C, .H = H, .ch = ch,
               .chunk = chunk, .rows = aft_full_rows(T, nt), .nt = nt, .mode = io->sums ? io->sums_mode : 0,
               .sums = io->sums};
    if (jb.mode != AFT_SUMS_WRITE) jb.want_dw = aft_bias_grad_wanted(ws, &io->db);
    float *rhs = aft_alloc_array(T, C2 * sizeof(float));
    float *mk = aft_alloc_array(nchunk, C * sizeof(float));
    jb.hs = calloc(nt, sizeof *jb.hs);
    jb.ds = calloc(nt, sizeof *jb.ds);
    if (!rhs || !mk || !jb.hs || !jb.ds) {
        free(rhs); free(mk); free(jb.hs); free(jb.ds);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full backward pass (T = %zu, C = %zu)", T, C);
    }
    jb.rhs = rhs;
    jb.mk = mk;
    grad_rhs(&jb, rhs, mk, nchunk);
    int ok = grad_blocks(&jb);
    for (size_t p = 0; p < nt; p++) {
        free(jb.hs[p]);
        free(jb.ds[p]);
    }
    free(jb.hs); free(jb.ds); free(rhs); free(mk);
    if (!ok) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full backward pass (T = %zu, C = %zu)", T, C);
    return AFT_OK;
}
