/* op_dense.c - AFT with an explicit T x T weight pattern: the full variant,
 * and any variant under an explicit mask. O(T^2 C) time through CBLAS, O(T C)
 * extra memory: exp(w) is held for one block of rows at a time.
 *
 * For a block of query rows and a chunk of key columns,
 *   num = exp(w - r) @ (exp(k - mk) * v),   den = exp(w - r) @ exp(k - mk)
 * is one matrix product with the two right-hand sides side by side. r is
 * each row's maximum of w over visible columns, mk each channel's key maximum
 * over the chunk, so every factor is <= 1. Without causality one chunk spans
 * the whole sequence; with it, chunks are a block wide so a large key late in
 * the sequence cannot push the stabiliser of earlier rows out of reach, and
 * chunk results are brought to the block's common maximum before summing.
 * Entries whose den still underflowed (w and k pulling opposite ways by more
 * than ~45 nats) are recomputed exactly in double, O(T) each.
 */
#include "internal.h"

#include <cblas.h>
#include <stdlib.h>

enum { CAUSAL_CHUNK = 256 };

/* Rows of exp(w) each thread holds at once: 512 keeps each thread's product
 * large enough to run near the kernel's peak (measured: 512-row products ran
 * 13% faster than 256-row ones, 40% faster than 128-row ones); fewer when the sequence is
 * short (so every thread gets a block) or very long (so all blocks together
 * stay under 2^26 floats, 256 MiB, and memory O(T)). */
size_t aft_dense_rows(size_t T, size_t threads)
{
    if (threads == 0) threads = 1;
    size_t rows = T ? ((size_t)1 << 26) / T / threads : 512;
    size_t share = (T + threads - 1) / threads;
    share = (share + 15) / 16 * 16;
    if (share < rows) rows = share;
    return rows > 512 ? 512 : rows < 16 ? 16 : rows;
}

static inline int visible(const uint8_t *mask, int causal, size_t T, size_t t, size_t j)
{
    return !(causal && j > t) && !(mask && !mask[t * T + j]);
}

/* one thread's buffers for a block of rows */
typedef struct {
    float *wblk;   /* (rows, T)  exp(w - r) */
    float *acc;    /* (rows, 2ch) */
    float *tmp;    /* (rows, 2ch) */
    float *mrow;   /* (ch) */
    float *wrow;   /* (T) */
} dense_scratch;

typedef struct {
    const float *q, *k, *v, *rhs, *mk;
    const uint8_t *mask;
    const aft_wspec *ws;
    size_t H, ch, chunk;
    int factored;
} dense_job;

/* exact recomputation in double of the entries of row t (head h) marked NaN
 * because their den underflowed; rows with nothing visible come out 0 */
static void redo_row(const dense_job *jb, size_t h, size_t t, size_t tv, float *wrow, float *yr)
{
    const aft_wspec *ws = jb->ws;
    const size_t T = ws->T, ldq = ws->ldq, ldk = ws->ldk, ldv = ws->ldv, ch = jb->ch;
    aft_w_row(ws, h, t, 0, tv, wrow);
    for (size_t c = 0; c < ch; c++) {
        if (!isnan(yr[c])) continue;
        size_t cc = h * ch + c;
        double M = -INFINITY;
        for (size_t j = 0; j < tv; j++)
            if (visible(jb->mask, ws->causal, T, t, j)) {
                double e = (double)jb->k[j * ldk + cc] + (double)wrow[j];
                M = e > M ? e : M;
            }
        double num = 0.0, den = 0.0;
        if (M > -INFINITY)
            for (size_t j = 0; j < tv; j++)
                if (visible(jb->mask, ws->causal, T, t, j)) {
                    double e = exp((double)jb->k[j * ldk + cc] + (double)wrow[j] - M);
                    den += e;
                    num += e * (double)jb->v[j * ldv + cc];
                }
        double sq = 1.0 / (1.0 + exp(-(double)jb->q[t * ldq + cc]));
        yr[c] = den > 0.0 ? (float)(sq * num / den) : 0.0f;
    }
}

/* rows [i0, i1) of head h, on the calling thread alone */
static void dense_block(const dense_job *jb, size_t h, size_t i0, size_t i1, dense_scratch *sc, float *out)
{
    const aft_wspec *ws = jb->ws;
    const size_t T = ws->T, C = ws->C, ldq = ws->ldq, ch = jb->ch, C2 = 2 * C, chunk = jb->chunk;
    const int causal = ws->causal;
    const uint8_t *mask = jb->mask;
    size_t bi = i1 - i0;
    size_t tv = causal ? i1 : T;   /* columns any row of the block sees */
    float *wblk = sc->wblk, *acc = sc->acc, *tmp = sc->tmp, *mrow = sc->mrow;

    /* w for the block, then exp(w - r) with invisible entries 0 */
    if (jb->factored)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)bi, (int)tv, (int)ws->bias->rank,
                    1.0f, ws->bias->u + i0 * ws->bias->rank, (int)ws->bias->rank,
                    ws->bias->v, (int)ws->bias->rank, 0.0f, wblk, (int)tv);
    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i;
        float *wr = wblk + i * tv;
        if (!jb->factored) aft_w_row(ws, h, t, 0, tv, wr);
        /* columns past the diagonal are invisible under causality */
        size_t nv = causal ? t + 1 : tv;
        float r = -INFINITY;
        if (mask) {
            const uint8_t *mr = mask + t * T;
            for (size_t j = 0; j < nv; j++) r = mr[j] && wr[j] > r ? wr[j] : r;
        } else {
            r = aft_max_f32(wr, nv);
        }
        if (r == -INFINITY) r = 0.0f;   /* nothing visible: the row stays 0 */
        for (size_t j = 0; j < nv; j++) wr[j] = aft_expf(wr[j] - r);
        if (mask) {
            const uint8_t *mr = mask + t * T;
            for (size_t j = 0; j < nv; j++) wr[j] = mr[j] ? wr[j] : 0.0f;
        }
        for (size_t j = nv; j < tv; j++) wr[j] = 0.0f;
    }

    /* the block's common key maximum over the chunks its rows see */
    size_t nc = (tv + chunk - 1) / chunk;
    for (size_t c = 0; c < ch; c++) {
        float M = -INFINITY;
        for (size_t jc = 0; jc < nc; jc++) M = jb->mk[jc * C + h * ch + c] > M ? jb->mk[jc * C + h * ch + c] : M;
        mrow[c] = M;
    }
    for (size_t jc = 0; jc < nc; jc++) {
        size_t j0 = jc * chunk, j1 = j0 + chunk < tv ? j0 + chunk : tv;
        float *dst = nc == 1 ? acc : tmp;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bi, (int)(2 * ch), (int)(j1 - j0),
                    1.0f, wblk + j0, (int)tv, jb->rhs + j0 * C2 + h * 2 * ch, (int)C2,
                    0.0f, dst, (int)(2 * ch));
        if (nc == 1) break;
        /* rescale this chunk from its own key maximum to the block's */
        const float *m = jb->mk + jc * C + h * ch;
        for (size_t c = 0; c < ch; c++) sc->wrow[c] = aft_expf(m[c] - mrow[c]);
        for (size_t i = 0; i < bi; i++) {
            float *a = acc + i * 2 * ch, *tp = tmp + i * 2 * ch;
            for (size_t c = 0; c < ch; c++) {
                float f = sc->wrow[c];
                float pn = jc ? a[c] : 0.0f, pd = jc ? a[ch + c] : 0.0f;
                a[c] = pn + tp[c] * f;
                a[ch + c] = pd + tp[ch + c] * f;
            }
        }
    }

    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i;
        const float *a = acc + i * 2 * ch, *qr = jb->q + t * ldq + h * ch;
        float *yr = out + t * C + h * ch;
        int bad_row = 0;
        for (size_t c = 0; c < ch; c++) {
            float den = a[ch + c];
            float y = aft_sigmoidf(qr[c]) * (a[c] / den);
            int bad = !(den >= AFT_DEN_EXACT_BELOW);
            yr[c] = bad ? NAN : y;
            bad_row |= bad;
        }
        if (bad_row) redo_row(jb, h, t, tv, sc->wrow, yr);
    }
}

// out, q, k, v: (T, C) of one batch   mask: (T, T) or NULL
aft_status aft_op_dense(float *out, const float *q, const float *k, const float *v,
                        const uint8_t *mask, const aft_wspec *ws, aft_error *err)
{
    const size_t T = ws->T, C = ws->C, ldk = ws->ldk, ldv = ws->ldv;
    const size_t H = ws->variant == AFT_CONV && ws->heads ? ws->heads : 1, ch = C / H;
    const int causal = ws->causal;
    if (T == 0 || C == 0) return AFT_OK;
    const size_t chunk = causal ? CAUSAL_CHUNK : T;
    const size_t nchunk = (T + chunk - 1) / chunk;
    const size_t C2 = 2 * C;
    const size_t nt = (size_t)aft_get_threads();

    /* rhs: (T, 2C), per head [exp(k - mk) v | exp(k - mk)] so a head's two
     * right-hand sides are adjacent columns; mk: (nchunk, C) */
    float *rhs = aft_alloc_array(T, C2 * sizeof(float));
    float *mk = aft_alloc_array(nchunk, C * sizeof(float));
    if (!rhs || !mk) {
        free(rhs); free(mk);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full-variant buffers (T = %zu, C = %zu)", T, C);
    }
    #pragma omp parallel for schedule(static)
    for (size_t jc = 0; jc < nchunk; jc++) {
        size_t j0 = jc * chunk, j1 = j0 + chunk < T ? j0 + chunk : T;
        float *m = mk + jc * C;
        for (size_t c = 0; c < C; c++) m[c] = -INFINITY;
        for (size_t j = j0; j < j1; j++)
            for (size_t c = 0; c < C; c++) m[c] = k[j * ldk + c] > m[c] ? k[j * ldk + c] : m[c];
        for (size_t c = 0; c < C; c++) m[c] = isfinite(m[c]) ? m[c] : 0.0f;
    }
    #pragma omp parallel for schedule(static)
    for (size_t j = 0; j < T; j++) {
        const float *m = mk + (j / chunk) * C;
        for (size_t h = 0; h < H; h++) {
            float *dst = rhs + j * C2 + h * 2 * ch;
            const float *kr = k + j * ldk + h * ch, *vr = v + j * ldv + h * ch, *mr = m + h * ch;
            for (size_t c = 0; c < ch; c++) {
                float e = aft_expf(kr[c] - mr[c]);
                dst[c] = e * vr[c];
                dst[ch + c] = e;
            }
        }
    }

    /* blocks of rows, one thread each; under causality the late blocks are
     * the large ones, so they are handed out first */
    dense_job jb = {q, k, v, rhs, mk, mask, ws, H, ch, chunk,
                    ws->variant == AFT_FULL && ws->bias->kind == AFT_BIAS_FACTORED};
    const size_t rows = aft_dense_rows(T, nt);
    const size_t nblk = (T + rows - 1) / rows, ntask = H * nblk;
    int failed = 0;
    #pragma omp parallel
    {
        dense_scratch sc;
        sc.wblk = aft_alloc_array(rows, T * sizeof(float));
        sc.acc = aft_alloc_array(rows, C2 * sizeof(float));
        sc.tmp = aft_alloc_array(rows, C2 * sizeof(float));
        sc.mrow = aft_alloc_array(C, sizeof(float));
        sc.wrow = aft_alloc_array(T > C ? T : C, sizeof(float));
        if (!sc.wblk || !sc.acc || !sc.tmp || !sc.mrow || !sc.wrow) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < ntask; task++) {
                size_t h = task / nblk, b = task % nblk;
                if (causal) b = nblk - 1 - b;
                size_t i0 = b * rows, i1 = i0 + rows < T ? i0 + rows : T;
                dense_block(&jb, h, i0, i1, &sc, out);
            }
        }
        free(sc.wblk); free(sc.acc); free(sc.tmp); free(sc.mrow); free(sc.wrow);
    }
    free(rhs); free(mk);
    if (failed)
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full-variant buffers (T = %zu, C = %zu)", T, C);
    return AFT_OK;
}
