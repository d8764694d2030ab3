/* full.c - AFT with an explicit T x T weight pattern: the full variant,
 * and any variant under an explicit mask. O(T^2 C) time through CBLAS (or,
 * with one head on AVX-512, and causal on AVX, a fused product of our own,
 * below), O(T C) extra memory: exp(w) is held for one block of rows at a
 * time (the fused product: one panel of FMR rows and 256 keys).
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
#include "kernels.h"
#include "nn/bf16.h"
#include "numerics.h"

#include <cblas.h>
#include <float.h>
#include <stdlib.h>

enum { CAUSAL_CHUNK = 256 };

/* Rows of exp(w) each thread holds at once: 512 keeps each thread's product
 * large enough to run near the kernel's peak (smaller blocks run markedly
 * slower); fewer when the sequence is short (so every thread gets a block)
 * or very long (so all blocks together stay under 2^26 floats, 256 MiB,
 * and memory O(T)). */
size_t aft_full_rows(size_t T, size_t threads)
{
    if (threads == 0) threads = 1;
    size_t rows = T ? ((size_t)1 << 26) / T / threads : 512;
    size_t share = (T + threads - 1) / threads;
    share = (share + 15) / 16 * 16;
    if (share < rows) rows = share;
    return rows > 512 ? 512 : rows < 16 ? 16 : rows;
}

/* mask: rows from r0 on (the rows the caller wants: aft_opspec.q_row0) */
static inline int visible(const uint8_t *mask, size_t r0, int causal, size_t ld, size_t t, size_t j)
{
    return !(causal && j > t) && !(mask && !mask[(t - r0) * ld + j]);
}

/* a mask's row length */
static inline size_t mask_ld(const aft_opspec *sp)
{
    return sp->mask_ld ? sp->mask_ld : sp->T;
}

float aft_full_visible_max(const float *w, size_t nv, const uint8_t *mrow)
{
    if (!mrow) return aft_max_f32(w, nv);
    float r = -INFINITY;
    for (size_t j = 0; j < nv; j++) r = mrow[j] && w[j] > r ? w[j] : r;
    return r;
}

/* the row stabiliser: aft_full_visible_max, but 0 when nothing is visible
 * (the row then stays 0) */
static float visible_max(const float *w, size_t nv, const uint8_t *mrow)
{
    float r = aft_full_visible_max(w, nv, mrow);
    return r == -INFINITY ? 0.0f : r;
}

/* a[k] = exp(a[k] - r) for k < n, r the largest of a's visible entries
 * (mrow, NULL: all) or a stand-in for it; the hidden ones get some value
 * the caller zeroes. When every visible a[k] is at most r (none NaN) and r
 * is below +inf, the arguments are <= 0 and the shorter exponential for
 * non-positive arguments gives aft_expf's values; otherwise aft_expf, so
 * NaN stays NaN, +inf - +inf is NaN (a -nan would otherwise be taken for a
 * value below -87 and become 0) and an entry above the backward's stand-in
 * 0 for an infinite r gets its true exponential. The check is one compare
 * a value, the shorter exponential about half the instructions. */
static void exp_row_shifted(float *restrict a, size_t n, float r, const uint8_t *restrict mrow)
{
    int clean = r < INFINITY;
    if (mrow)
        for (size_t k = 0; k < n; k++) clean &= !mrow[k] | (a[k] <= r);
    else
        for (size_t k = 0; k < n; k++) clean &= a[k] <= r;
    if (clean)
        for (size_t k = 0; k < n; k++) a[k] = aft_expf_nonpos(a[k] - r);
    else
        for (size_t k = 0; k < n; k++) a[k] = aft_expf(a[k] - r);
}

void aft_full_exp_row(float *wr, size_t nv, size_t tv, float r, const uint8_t *mrow)
{
    exp_row_shifted(wr, nv, r, mrow);
    if (mrow)
        for (size_t j = 0; j < nv; j++) wr[j] = mrow[j] ? wr[j] : 0.0f;
    for (size_t j = nv; j < tv; j++) wr[j] = 0.0f;
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
    const aft_opspec *ws;
    size_t H, ch, chunk;
    int factored;
} dense_job;

/* exact recomputation in double of the entries of row t (head h) marked NaN
 * because their den underflowed or they came out NaN or infinite; rows
 * with nothing visible come out 0 */
static void redo_row(const dense_job *jb, size_t h, size_t t, size_t tv, float *wrow, float *yr)
{
    const aft_opspec *ws = jb->ws;
    const size_t ldq = ws->ldq, ldk = ws->ldk, ldv = ws->ldv, ch = jb->ch;
    aft_w_row(ws, h, t, 0, tv, wrow);
    for (size_t c = 0; c < ch; c++) {
        if (!isnan(yr[c])) continue;
        size_t cc = h * ch + c;
        double M = -INFINITY;
        for (size_t j = 0; j < tv; j++)
            if (visible(jb->mask, ws->q_row0, ws->causal, mask_ld(ws), t, j)) {
                double e = (double)jb->k[j * ldk + cc] + (double)wrow[j];
                M = e > M ? e : M;
            }
        double num = 0.0, den = 0.0;
        if (M > -INFINITY)
            for (size_t j = 0; j < tv; j++)
                if (visible(jb->mask, ws->q_row0, ws->causal, mask_ld(ws), t, j)) {
                    double e = exp((double)jb->k[j * ldk + cc] + (double)wrow[j] - M);
                    den += e;
                    num += e * (double)jb->v[j * ldv + cc];
                }
        double sq = 1.0 / (1.0 + exp(-(double)jb->q[(t - ws->q_row0) * ldq + cc]));
        yr[c] = den > 0.0 ? (float)(sq * num / den) : 0.0f;
    }
}

/* one row: y = sigmoid(q) num / den, NaN where den underflowed or y is
 * not finite (a value NaN or +inf reaches every row of the product, those
 * that do not see it times 0); returns whether any entry is NaN. (restrict
 * pointers: so GCC vectorises it) */
static int dense_row_out(float *restrict yr, const float *restrict qr, const float *restrict num,
                         const float *restrict den, size_t ch)
{
    int any = 0;
    for (size_t c = 0; c < ch; c++) {
        float y = aft_sigmoidf(qr[c]) * (num[c] / den[c]);
        int bad = !(den[c] >= AFT_DEN_EXACT_BELOW) | !(fabsf(y) <= FLT_MAX);
        yr[c] = bad ? NAN : y;
        any |= bad;
    }
    return any;
}

/* rows [i0, i0 + bi) of head h from their sums, (num | den) per row, rows
 * lda apart: the rows' outputs, and the exact recomputation of the entries
 * marked NaN */
static void finish_rows(const dense_job *jb, size_t h, size_t i0, size_t bi, size_t tv, const float *acc,
                        size_t lda, float *wrow, float *out)
{
    const size_t C = jb->ws->C, ldq = jb->ws->ldq, ch = jb->ch;
    for (size_t i = 0; i < bi; i++) {
        size_t t = i0 + i;
        const float *a = acc + i * lda;
        size_t tq = t - jb->ws->q_row0;   /* q and out hold rows from q_row0 on */
        float *yr = out + tq * C + h * ch;
        if (dense_row_out(yr, jb->q + tq * ldq + h * ch, a, a + ch, ch)) redo_row(jb, h, t, tv, wrow, yr);
    }
}

/* rows [i0, i1) of head h, on the calling thread alone */
static void dense_block(const dense_job *jb, size_t h, size_t i0, size_t i1, dense_scratch *sc, float *out)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = ws->T, C = ws->C, ch = jb->ch, C2 = 2 * C, chunk = jb->chunk;
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
        const uint8_t *mr = mask ? mask + (t - ws->q_row0) * mask_ld(ws) : NULL;
        aft_full_exp_row(wr, nv, tv, visible_max(wr, nv, mr), mr);
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
        if (ws->bf16)   /* aft_config.precision: bf16 operands, float32 sums */
            aft_gemm_bf16(1, 0, 0, bi, 2 * ch, j1 - j0, wblk + j0, tv, jb->rhs + j0 * C2 + h * 2 * ch, C2, 0.0f,
                          dst, 2 * ch);
        else
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

    finish_rows(jb, h, i0, bi, tv, acc, 2 * ch, sc->wrow, out);
}

/* ---- the fused product (one head). exp(w - r) is computed FMR rows and
 * 256 keys at a time straight into the panel the micro-kernel reads,
 * instead of for whole rows that OpenBLAS then copies into panels of its
 * own, and the right-hand sides are packed once for all blocks. w itself is
 * made a panel at a time too, so no block of rows of w is ever held: r is
 * each row's running maximum over the keys seen so far, and when a later
 * chunk raises it, the row's sums so far are brought down by exp(r_old -
 * r_new) (<= 1, nothing overflows; what that factor underflows is below
 * FLT_MIN times the row's largest term, the same as computing with the
 * final maximum from the start). The micro-kernel keeps an FMR x FNR tile
 * of sums in registers over 256 keys and adds it, times the chunk's
 * rescaling factor per column, to the block's sums. A panel's rows are
 * interleaved (key by key, FMR values each) for the micro-kernel with
 * AVX/AVX2 (FROWS below), and a
 * thread holds FSUB panels (96 rows) of them for a chunk of keys, so each
 * panel of right-hand sides (FKC x FNR: 16 KiB with AVX2) is loaded into L1
 * once for all of them, not once per panel.
 * The tile: 12 x 32 (24 of AVX-512's 32 registers), 6 x 16 with AVX/AVX2
 * (12 of 16); without either, OpenBLAS's products serve. */
#if AFT_VEC_BYTES >= 64
enum { FMR = 12, FNR = 32 };
#else
enum { FMR = 6, FNR = 16 };
#endif
enum { FKC = 256, FNV = FNR / AFT_VL };   /* FNV: vectors across the tile */
/* The panel of exp(w) the tile reads: with AVX-512 its FMR rows as they
 * were computed, FKC apart (the tile reads FMR strided streams, and the
 * interleaving, a scalar transpose, is saved); else interleaved, key by
 * key, FMR values each, which AVX2's narrower loads read faster. Either
 * way the same bits. */
enum { FROWS = AFT_VEC_BYTES >= 64 };
enum { FSI = FROWS ? FKC : 1, FSK = FROWS ? 1 : FMR };   /* row i, key k at i * FSI + k * FSK */
/* panels of rows whose exp(w) a thread holds at once (96 rows) */
enum { FSUB = 96 / FMR };
_Static_assert((int)FKC == (int)CAUSAL_CHUNK, "a key chunk of the fused product is a causal chunk");

// c (FMR x FNR, rows ldc apart) += f .* (ap (FMR x kc: row i, key k at
// ap[i * FSI + k * FSK]) x bp (kc x FNR)).
// Not inlined: inside its caller GCC ran out of registers and spilled sums.
__attribute__((noinline)) static void fused_tile(size_t kc, const float *restrict ap, const float *restrict bp,
                                                 float *restrict c, size_t ldc, const float *restrict f)
{
    aft_vf acc[FMR][FNV];
    #pragma GCC unroll 16
    for (int i = 0; i < FMR; i++)
        #pragma GCC unroll 4
        for (int u = 0; u < FNV; u++) acc[i][u] = (aft_vf){0};
    for (size_t k = 0; k < kc; k++) {
        aft_vf b[FNV];
        #pragma GCC unroll 4
        for (int u = 0; u < FNV; u++) {
            b[u] = aft_vld(bp + k * FNR + u * AFT_VL);
            AFT_IN_REG(b[u]);
        }
        const float *a = ap + k * FSK;
        #pragma GCC unroll 16
        for (int i = 0; i < FMR; i++) {
            float ai = a[i * FSI];
            #pragma GCC unroll 4
            for (int u = 0; u < FNV; u++) acc[i][u] += ai * b[u];
        }
    }
    aft_vf fv[FNV];
    #pragma GCC unroll 4
    for (int u = 0; u < FNV; u++) fv[u] = aft_vld(f + u * AFT_VL);
    #pragma GCC unroll 16
    for (int i = 0; i < FMR; i++)
        #pragma GCC unroll 4
        for (int u = 0; u < FNV; u++) {
            float *cr = c + i * ldc + u * AFT_VL;
            aft_vst(cr, aft_vld(cr) + acc[i][u] * fv[u]);
        }
}

/* Whether the fused product is used: one head, a build with vectors of 8
 * or 16 floats, and not full_blas (aft_config.full_product). Causal, the
 * products run a chunk of 256 keys at a time, a depth at which OpenBLAS
 * repacks its operands for every call and the fused kernel is the faster
 * on AVX2 and AVX-512. Without causality the products are as deep as the
 * sequence: there OpenBLAS's AVX2 kernels keep up with the fused one, and
 * only AVX-512 builds use it. */
static int fused_ok(size_t H, int causal, int blas)
{
    return H == 1 && AFT_VEC_BYTES >= 32 && (AFT_VEC_BYTES >= 64 || causal) && !blas;
}

/* the rows of w for one panel: rows t0 .. t0 + nr - 1, keys [j0, j0 + kc),
 * into ap (rows FKC apart); nv[i]: how many of row i's keys it sees */
static void panel_w(const dense_job *jb, size_t t0, size_t nr, size_t j0, size_t kc, const size_t *nv, float *ap)
{
    const aft_opspec *ws = jb->ws;
    if (jb->factored) {   /* u v^T, one small product */
        const size_t rank = ws->bias->rank;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)kc, (int)rank, 1.0f,
                    ws->bias->u + t0 * rank, (int)rank, ws->bias->v + j0 * rank, (int)rank, 0.0f, ap, FKC);
        return;
    }
    for (size_t i = 0; i < nr; i++)
        if (nv[i]) aft_w_row(ws, 0, t0 + i, j0, j0 + nv[i], ap + i * FKC);
}

// rows [i0, i1) (one head) with the fused product; bpk: the right-hand
// sides packed as npan panels of FNR columns, each (T, FNR)
static void dense_block_fused(const dense_job *jb, size_t i0, size_t i1, dense_scratch *sc, float *out,
                              const float *bpk, size_t npan)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = ws->T, C = ws->C, ch = jb->ch, Np = npan * FNR;
    const int causal = ws->causal;
    const uint8_t *mask = jb->mask;
    size_t bi = i1 - i0, tv = causal ? i1 : T;
    /* aw: FSUB panels of exp(w) (FROWS: as rows); rmax: each row's running maximum of w */
    float *acc = sc->acc, *aw = sc->wblk, *rmax = sc->tmp, *fvec = sc->mrow + C;
    size_t npanel = (bi + FMR - 1) / FMR;
    for (size_t i = 0; i < npanel * FMR; i++) rmax[i] = -INFINITY;

    /* the block's common key maximum over the chunks its rows see */
    size_t nc = (tv + FKC - 1) / FKC;
    float *mrow = sc->mrow;
    for (size_t c = 0; c < ch; c++) {
        float M = -INFINITY;
        for (size_t jc = 0; jc < (causal ? nc : 1); jc++) M = jb->mk[jc * C + c] > M ? jb->mk[jc * C + c] : M;
        mrow[c] = M;
    }
    memset(acc, 0, npanel * FMR * Np * sizeof(float));
    /* FSUB panels of rows at a time: their exp(w) for a chunk of keys
     * (FSUB x FMR x FKC floats, in L2), then each panel of right-hand
     * sides (FKC x FNR, in L1) for all of them */
    for (size_t sp0 = 0; sp0 < npanel; sp0 += FSUB) {
        size_t sp1 = sp0 + FSUB < npanel ? sp0 + FSUB : npanel;
        size_t last = i0 + sp1 * FMR < i1 ? i0 + sp1 * FMR : i1;   /* after the sub-block's last row */
        size_t ncs = causal ? (last + FKC - 1) / FKC : nc;         /* chunks its rows see */
        for (size_t jc = 0; jc < ncs; jc++) {
            size_t j0 = jc * FKC, j1 = j0 + FKC < tv ? j0 + FKC : tv, kc = j1 - j0;
            /* rescaling of this chunk from its own key maximum to the block's */
            for (size_t c = 0; c < ch; c++) {
                float f = causal ? aft_expf(jb->mk[jc * C + c] - mrow[c]) : 1.0f;
                fvec[c] = f;
                fvec[ch + c] = f;
            }
            for (size_t c = 2 * ch; c < Np; c++) fvec[c] = 0.0f;
            for (size_t mp = sp0; mp < sp1; mp++) {
                /* the panel's rows, FKC apart: in aw where the tile reads
                 * them so, else in wrow and then interleaved into aw */
                float *ap = FROWS ? aw + (mp - sp0) * FMR * FKC : sc->wrow;
                size_t nv[FMR], nr = 0;
                for (size_t i = 0; i < FMR; i++) {
                    size_t row = mp * FMR + i, t = i0 + row;
                    size_t n = row < bi ? (causal ? (t + 1 > j0 ? t + 1 - j0 : 0) : kc) : 0;
                    nv[i] = n < kc ? n : kc;
                    nr = nv[i] ? i + 1 : nr;
                }
                panel_w(jb, i0 + mp * FMR, nr, j0, kc, nv, ap);
                for (size_t i = 0; i < FMR; i++) {
                    size_t row = mp * FMR + i, t = i0 + row;
                    float *a = ap + i * FKC;
                    size_t n = nv[i];
                    const uint8_t *mr = mask && n ? mask + (t - ws->q_row0) * mask_ld(ws) + j0 : NULL;
                    float m = n ? aft_full_visible_max(a, n, mr) : -INFINITY;
                    if (m > rmax[row]) {
                        /* a larger maximum: the row's sums so far come down to it */
                        if (rmax[row] != -INFINITY) {
                            float f = aft_expf(rmax[row] - m), *ar = acc + row * Np;
                            for (size_t c = 0; c < Np; c++) ar[c] *= f;
                        }
                        rmax[row] = m;
                    }
                    float r = rmax[row];
                    if (r == -INFINITY) n = 0;   /* nothing visible yet */
                    aft_full_exp_row(a, n, kc, r, mr);
                }
                if (!FROWS) {
                    float *dst = aw + (mp - sp0) * FMR * FKC;
                    for (size_t i = 0; i < FMR; i++)
                        for (size_t k = 0; k < kc; k++) dst[k * FMR + i] = ap[i * FKC + k];
                }
            }
            for (size_t p = 0; p < npan; p++) {
                const float *bp = bpk + (p * T + j0) * FNR;
                for (size_t mp = sp0; mp < sp1; mp++)
                    fused_tile(kc, aw + (mp - sp0) * FMR * FKC, bp, acc + mp * FMR * Np + p * FNR, Np,
                               fvec + p * FNR);
            }
        }
    }
    finish_rows(jb, 0, i0, bi, tv, acc, Np, sc->wrow, out);
}

/* mk: (nchunk, C), each chunk of keys' maximum per channel, 0 where that
 * is not finite */
static void key_maxima(float *mk, const float *k, const aft_opspec *ws, size_t chunk, size_t nchunk)
{
    const size_t T = ws->T, C = ws->C, ldk = ws->ldk;
    #pragma omp parallel for schedule(static) num_threads(ws->threads)
    for (size_t jc = 0; jc < nchunk; jc++) {
        size_t j0 = jc * chunk, j1 = j0 + chunk < T ? j0 + chunk : T;
        float *m = mk + jc * C;
        for (size_t c = 0; c < C; c++) m[c] = -INFINITY;
        for (size_t j = j0; j < j1; j++)
            for (size_t c = 0; c < C; c++) m[c] = k[j * ldk + c] > m[c] ? k[j * ldk + c] : m[c];
        for (size_t c = 0; c < C; c++) m[c] = isfinite(m[c]) ? m[c] : 0.0f;
    }
}

/* The right-hand sides rhs: (T, 2C), per head of ch channels [exp(k - mk) v
 * | exp(k - mk)], so a head's two right-hand sides are adjacent columns.
 * fused: the same columns packed as npan panels of FNR, each (T, FNR), the
 * last padded with zeros. Returns 0 when out of memory. */
static int pack_rhs(float *rhs, const float *mk, const float *k, const float *v, const aft_opspec *ws, size_t H,
                    size_t chunk, int fused, size_t npan)
{
    const size_t T = ws->T, C = ws->C, C2 = 2 * C, ldk = ws->ldk, ldv = ws->ldv, ch = C / H, Np = npan * FNR;
    int no_row = 0;
    #pragma omp parallel num_threads(ws->threads)
    {
        /* fused: each row's 2C values, then FNR of them to each panel */
        float *row = fused ? aft_alloc_array(Np, sizeof(float)) : NULL;
        if (fused && !row) {
            #pragma omp atomic write
            no_row = 1;
        }
        #pragma omp for schedule(static)
        for (size_t j = 0; j < T; j++) {
            const float *m = mk + (j / chunk) * C;
            for (size_t h = 0; h < H; h++) {
                float *dst = row ? row : rhs + j * C2 + h * 2 * ch;
                const float *kr = k + j * ldk + h * ch, *vr = v + j * ldv + h * ch, *mr = m + h * ch;
                for (size_t c = 0; c < ch; c++) {
                    float e = aft_expf(kr[c] - mr[c]);
                    dst[c] = e * vr[c];
                    dst[ch + c] = e;
                }
            }
            if (row) {
                for (size_t c = C2; c < Np; c++) row[c] = 0.0f;
                for (size_t p = 0; p < npan; p++) memcpy(rhs + (p * T + j) * FNR, row + p * FNR, FNR * sizeof(float));
            }
        }
        free(row);
    }
    return !no_row;
}

/* one thread's scratch for blocks of `rows` rows; returns 0 when out of
 * memory (dense_scratch_free frees what there is) */
static int dense_scratch_alloc(dense_scratch *sc, int fused, size_t rows, size_t T, size_t C, size_t Np)
{
    const size_t C2 = 2 * C;
    if (fused) {   /* wblk: one panel; tmp: row maxima; mrow: + factors */
        size_t prows = (rows + FMR - 1) / FMR * FMR;
        sc->wblk = aft_alloc_array(FSUB * FMR * FKC, sizeof(float));
        sc->acc = aft_alloc_array(prows, Np * sizeof(float));
        sc->tmp = aft_alloc_array(prows, sizeof(float));
        sc->mrow = aft_alloc_array(C + Np, sizeof(float));
    } else {
        sc->wblk = aft_alloc_array(rows, T * sizeof(float));
        sc->acc = aft_alloc_array(rows, C2 * sizeof(float));
        sc->tmp = aft_alloc_array(rows, C2 * sizeof(float));
        sc->mrow = aft_alloc_array(C, sizeof(float));
    }
    size_t nwrow = T > C ? T : C;
    if (fused && !FROWS && nwrow < FMR * FKC) nwrow = FMR * FKC;   /* interleaved: also one panel of w */
    sc->wrow = aft_alloc_array(nwrow, sizeof(float));
    return sc->wblk && sc->acc && sc->tmp && sc->mrow && sc->wrow;
}

static void dense_scratch_free(dense_scratch *sc)
{
    free(sc->wblk); free(sc->acc); free(sc->tmp); free(sc->mrow); free(sc->wrow);
}

/* The rows wanted, [q_row0, q_row1), in blocks, one thread each (fused:
 * dense_block_fused, the right-hand sides packed in npan panels); under
 * causality the late blocks are the large ones, so they are handed out
 * first. Returns 0 when out of memory. */
static int full_blocks(const dense_job *jb, float *out, int fused, size_t npan)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = ws->T, C = ws->C, H = jb->H, nt = (size_t)ws->threads, Np = npan * FNR;
    const int causal = ws->causal;
    const size_t row1 = ws->q_row1 && ws->q_row1 < T ? ws->q_row1 : T;
    const size_t row0 = ws->q_row0 < row1 ? ws->q_row0 : row1, rows = aft_full_rows(T, nt);
    const size_t nblk = (row1 - row0 + rows - 1) / rows, ntask = H * nblk;
    int failed = 0;
    #pragma omp parallel num_threads((int)nt)
    {
        dense_scratch sc;
        if (!dense_scratch_alloc(&sc, fused, rows, T, C, Np)) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < ntask; task++) {
                size_t h = task / nblk, b = task % nblk;
                if (causal) b = nblk - 1 - b;
                size_t i0 = row0 + b * rows, i1 = i0 + rows < row1 ? i0 + rows : row1;
                if (fused) dense_block_fused(jb, i0, i1, &sc, out, jb->rhs, npan);
                else dense_block(jb, h, i0, i1, &sc, out);
                /* the block's rows, a head's share of them: one add a block */
                size_t n = i1 - i0;
                aft_progress_done(ws->progress, n * (h + 1) / H - n * h / H);
            }
        }
        dense_scratch_free(&sc);
    }
    return !failed;
}

// out, q, k, v: (T, C) of one batch   mask: (T, T) or NULL; q, out and the
// mask hold rows [q_row0, q_row1) (q_row1 0: to T)
aft_status aft_op_full(float *out, const float *q, const float *k, const float *v,
                        const uint8_t *mask, const aft_opspec *ws, aft_error *err)
{
    const size_t T = ws->T, C = ws->C;
    const size_t H = ws->variant == AFT_CONV && ws->heads ? ws->heads : 1, ch = C / H;
    const int causal = ws->causal;
    if (T == 0 || C == 0) return AFT_OK;
    aft_blas_one_thread();
    const size_t chunk = causal ? CAUSAL_CHUNK : T;
    const size_t nchunk = (T + chunk - 1) / chunk;
    const size_t C2 = 2 * C;

    /* rhs: (T, 2C) (pack_rhs); mk: (nchunk, C). For the fused product
     * npan panels of FNR columns. */
    const int fused = fused_ok(H, causal, ws->full_blas || ws->bf16);
    const size_t npan = (C2 + FNR - 1) / FNR, Np = npan * FNR;
    float *rhs = fused ? aft_calloc_array(T, Np * sizeof(float)) : aft_alloc_array(T, C2 * sizeof(float));
    float *mk = aft_alloc_array(nchunk, C * sizeof(float));
    if (!rhs || !mk) {
        free(rhs); free(mk);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full-variant buffers (T = %zu, C = %zu)", T, C);
    }
    key_maxima(mk, k, ws, chunk, nchunk);
    if (!pack_rhs(rhs, mk, k, v, ws, H, chunk, fused, npan)) {
        free(rhs); free(mk);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full-variant buffers (T = %zu, C = %zu)", T, C);
    }
    dense_job jb = {q, k, v, rhs, mk, mask, ws, H, ch, chunk,
                    ws->variant == AFT_FULL && ws->bias->kind == AFT_BIAS_FACTORED};
    int ok = full_blocks(&jb, out, fused, npan);
    free(rhs); free(mk);
    if (!ok)
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the full-variant buffers (T = %zu, C = %zu)", T, C);
    return AFT_OK;
}
