/* local_conv.c - AFT-local, AFT-conv and AFT-simple in O(T s C) time and O(T C)
 * memory, without a T x T array.
 *
 * For query t the visible keys split into three parts:
 *   left   t' <= t - s        w = 0: a running (prefix) sum
 *   band   |t' - t| < s       w from the bias: an explicit sum of <= 2s-1 terms
 *   right  t' >= t + s        w = 0: a running sum from the end (not causal)
 * Every part is a sum of positive weights, so nothing cancels (the paper's
 * "global sum plus (exp(w) - 1) correction" cancels catastrophically when a
 * band term dominates and w is very negative).
 *
 * Stability without an exponential per term and part: rows are processed in
 * blocks. Within a block every part has one stabiliser per channel: the band
 * uses mk, the channel's key maximum over the block's band columns, times
 * exp(w - r) with r the row's band maximum; the left and right sums use a
 * stabiliser at least as large as every key they hold. Then for row t and
 * channel c everything is scaled by exp(Zc + Zr) with Zc = max of the three
 * channel stabilisers and Zr = max(r, 0), so combining the parts costs no
 * exponential per entry, and every factor is <= 1 (nothing overflows).
 *
 * A running sum whose stabiliser is far above the keys it holds would lose
 * them to underflow, so a block whose running maximum jumps by more than
 * JUMP nats (a large key arriving) is processed one row at a time with exact
 * stabilisers. And where the scaled denominator still came out below
 * AFT_DEN_EXACT_BELOW (keys and biases pulling opposite ways by more than
 * ~45 nats), that entry is recomputed exactly in double from the band's terms
 * and the two running sums, which are exact by the rule above.
 *
 * simple (or window 0) with causality is this kernel with a one-wide zero
 * band; without causality it is a global softmax per channel (simple.c).
 */
#include "kernels.h"

#include <omp.h>
#include <stdlib.h>

enum { BAND_ROWS = AFT_BAND_ROWS, BAND_CH = 128 };   /* BAND_ROWS: spec.h, which the memory estimate reads */
/* GROUP: rows whose band sums share loads (band_sums). Its GROUP x BV x 2
 * sums stay in registers: 4 x 2 x 2 = 16 of AVX-512's 32, 6 x 1 x 2 = 12 of
 * the 16 elsewhere; more rows a group means fewer loads a row (the group
 * does not change the sums, so not the output either) */
#if defined(__AVX512F__)
enum { GROUP = 4, BV = 2 };
#else
enum { GROUP = 6, BV = 1 };
#endif
/* ek and ekv hold blocks of EKB channels, each block's rows EKB floats
 * apart: band_sums walks a window of rows for a few channels at a time,
 * and rows cw floats apart (1 KiB for 256 channels) all fell into a few of
 * L1's sets and pushed each other out */
#ifndef EKB
#define EKB AFT_BAND_EKB   /* spec.h */
#endif
/* a running sum may sit at most this many nats below its stabiliser */
#define JUMP 30.0f

typedef struct {
    float *ek, *ekv;              /* band block: BAND_ROWS + 2s rows, in blocks of EKB channels */
    float *rs0, *rs1, *rst;       /* right part per row of a block: (BAND_ROWS, cw) each */
    float *snap;                  /* the right sum at each block's end: (blocks, 4 cw) */
    float *qst, *q0, *q1, *qmax;  /* the right part's running sum, cw each, one block of 4 cw
                                   * from qst on (copied whole to and from snap and rin) */
    float *rin;                   /* (st, s0, s1, smax) of the keys from r1 + s on, 4 cw */
    float *w, *ew;                /* GROUP rows' band: (GROUP, 2s), (2s + GROUP, GROUP) */
    float r[GROUP];               /* their band maxima */
    float *mk, *pst, *pmax, *p0, *p1, *fe, *fp, *fs, *first, *zeros, *gl, *gr;  /* cw each */
    float *b0, *b1;               /* (GROUP, cw) each */
    unsigned char *redo;          /* cw */
    int right_fixed;              /* the right part's block had one stabiliser: rst row 0 only */
} band_scratch;

static inline float fmax3(float a, float b, float c)
{
    float m = a > b ? a : b;
    return c > m ? c : m;
}

/* exp(a - b) for stabilisers: 0 when a holds nothing (-inf) */
static inline float scale_down(float a, float b)
{
    return a == -INFINITY ? 0.0f : aft_expf(a - b);
}

/* Moves a running sum (st, s0, s1) to the stabiliser nst >= st. */
static inline void restabilise(float *restrict st, float *restrict s0, float *restrict s1,
                               const float *restrict nst, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        float f = nst[c] == -INFINITY ? 1.0f : scale_down(st[c], nst[c]);
        s0[c] *= f;
        s1[c] *= f;
        st[c] = nst[c] > st[c] ? nst[c] : st[c];
    }
}

/* Adds one key row to a running sum at fixed stabiliser st >= every key. */
static inline void add_fixed(float *restrict s0, float *restrict s1, const float *restrict st,
                             const float *restrict k, const float *restrict v, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        float e = aft_expf(k[c] - st[c]);
        s0[c] += e;
        s1[c] += e * v[c];
    }
}

/* Adds one key row given as e = exp(k - mk) and e v, in blocks of EKB
 * channels bs floats apart (ek, ekv), times g = exp(mk - st). */
static inline void add_scaled(float *restrict s0, float *restrict s1, const float *restrict g,
                              const float *restrict e, const float *restrict ev, size_t bs, size_t n)
{
    for (size_t cb = 0; cb < n; cb += EKB) {
        const float *eb = e + cb / EKB * bs, *evb = ev + cb / EKB * bs;
        size_t m = n - cb < EKB ? n - cb : EKB;
        for (size_t c = 0; c < m; c++) {
            s0[cb + c] += eb[c] * g[cb + c];
            s1[cb + c] += evb[c] * g[cb + c];
        }
    }
}

/* Adds one key row with an exact stabiliser (the running maximum). */
static inline void add_exact(float *restrict st, float *restrict s0, float *restrict s1,
                             const float *restrict k, const float *restrict v, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        float mn = k[c] > st[c] ? k[c] : st[c];
        int none = mn == -INFINITY;
        float a = none ? 1.0f : scale_down(st[c], mn);
        float e = none ? 0.0f : aft_expf(k[c] - mn);
        s0[c] = s0[c] * a + e;
        s1[c] = s1[c] * a + e * v[c];
        st[c] = mn;
    }
}

/* Keys rows [j0, j1) (stepping by dir) are about to join a running sum whose
 * exact maximum is smax. Returns 1 if one stabiliser for all of them keeps
 * every intermediate sum within JUMP nats of it; sets nst to that stabiliser. */
__attribute__((noinline)) static int plan_block(float *restrict nst, float *restrict first, const float *smax,
                                                const float *k, size_t ldk, long j0, long j1, long dir, size_t n)
{
    for (size_t c = 0; c < n; c++) { nst[c] = smax[c]; first[c] = smax[c]; }
    for (long j = j0; j != j1; j += dir) {
        const float *kr = k + (size_t)j * ldk;
        for (size_t c = 0; c < n; c++) {
            first[c] = first[c] == -INFINITY ? kr[c] : first[c];
            nst[c] = kr[c] > nst[c] ? kr[c] : nst[c];
        }
    }
    int ok = 1;
    for (size_t c = 0; c < n; c++) ok &= !(nst[c] - first[c] > JUMP);
    return ok;
}

/* e = exp(k - mk) and ev = e v for n channels; with keys_ok (no key +inf
 * or NaN, mk >= every key) through aft_expf_nonpos, the same values */
static inline void ek_row(float *restrict e, float *restrict ev, const float *restrict k,
                          const float *restrict v, const float *restrict mk, size_t n, int keys_ok)
{
    if (keys_ok) {
        for (size_t c = 0; c < n; c++) {
            e[c] = aft_expf_nonpos(k[c] - mk[c]);
            ev[c] = e[c] * v[c];
        }
    } else {
        for (size_t c = 0; c < n; c++) {
            e[c] = aft_expf(k[c] - mk[c]);
            ev[c] = e[c] * v[c];
        }
    }
}

/* BV: vectors of channels per row in band_sums, with the BV + BV loaded
 * vectors beside the sums (2 x 16 floats with AVX-512; 1 vector else) */
enum { BCH = BV * AFT_VL };   /* channels per step */
_Static_assert(EKB % BCH == 0, "a step's channels lie in one block");

// Band sums of GROUP rows at once, rows i = 0 .. GROUP-1:
//   b0[i][c] = sum_j ew[j][i] ek[j][c],   b1[i][c] = sum_j ew[j][i] ekv[j][c]
// ew: (nw, GROUP), zero where row i does not see band row j; ek, ekv:
// (nw, cw); b0, b1: (GROUP, cw). The inner loop of the whole kernel: each
// ek/ekv vector loaded feeds GROUP rows' sums (one row at a time, the loads
// from L2 were the limit), BCH channels x GROUP rows x 2 sums in registers.
// Band rows j >= jt (jt <= nw) go to rows i > j - jt only: the caller
// sets jt where the rows left out do not see them. Under causality those
// band rows are later than the rows left out, and 0 * inf or 0 * NaN from a
// later value would otherwise reach an earlier row.
__attribute__((noinline)) static void band_sums(float *restrict b0, float *restrict b1, const float *restrict ew,
                                                const float *restrict ek, const float *restrict ekv, size_t nw,
                                                size_t jt, size_t cw, size_t bs)
{
    size_t c = 0;
    for (; c + BCH <= cw; c += BCH) {
        aft_vf a[GROUP][BV], d[GROUP][BV];
        const float *eb = ek + c / EKB * bs + c % EKB, *vb = ekv + c / EKB * bs + c % EKB;
        #pragma GCC unroll 16
        for (int i = 0; i < GROUP; i++)
            #pragma GCC unroll 2
            for (int u = 0; u < BV; u++) a[i][u] = d[i][u] = (aft_vf){0};
        /* one band row j to rows [i0, i1) (constants once unrolled) */
#define BAND_ROW(j, i0, i1)                                                    \
        do {                                                                   \
            const float *wj = ew + (j) * GROUP;                                \
            aft_vf e[BV], x[BV];                                               \
            _Pragma("GCC unroll 2")                                            \
            for (int u = 0; u < BV; u++) {                                     \
                e[u] = aft_vld(eb + (j) * EKB + u * AFT_VL);                   \
                x[u] = aft_vld(vb + (j) * EKB + u * AFT_VL);                   \
                AFT_IN_REG(e[u]);                                              \
                AFT_IN_REG(x[u]);                                              \
            }                                                                  \
            _Pragma("GCC unroll 16")                                           \
            for (int i = (i0); i < (i1); i++) {                                \
                float wi = wj[i];                                              \
                _Pragma("GCC unroll 2")                                        \
                for (int u = 0; u < BV; u++) {                                 \
                    a[i][u] += wi * e[u];                                      \
                    d[i][u] += wi * x[u];                                      \
                }                                                              \
            }                                                                  \
        } while (0)
        for (size_t j = 0; j < jt; j++) BAND_ROW(j, 0, GROUP);
        #pragma GCC unroll 8
        for (int m = 0; m < GROUP - 1; m++) {
            if (jt + (size_t)m >= nw) break;
            BAND_ROW(jt + (size_t)m, m + 1, GROUP);
        }
#undef BAND_ROW
        #pragma GCC unroll 16
        for (int i = 0; i < GROUP; i++)
            #pragma GCC unroll 2
            for (int u = 0; u < BV; u++) {
                aft_vst(b0 + i * cw + c + u * AFT_VL, a[i][u]);
                aft_vst(b1 + i * cw + c + u * AFT_VL, d[i][u]);
            }
    }
    for (; c < cw; c++) {
        float a[GROUP] = {0}, d[GROUP] = {0};
        size_t o = c / EKB * bs + c % EKB;
        for (size_t j = 0; j < nw; j++)
            for (size_t i = 0; i < GROUP; i++) {
                if (j >= jt && i + jt <= j) continue;
                a[i] = fmaf(ew[j * GROUP + i], ek[o + j * EKB], a[i]);
                d[i] = fmaf(ew[j * GROUP + i], ekv[o + j * EKB], d[i]);
            }
        for (size_t i = 0; i < GROUP; i++) {
            b0[i * cw + c] = a[i];
            b1[i * cw + c] = d[i];
        }
    }
}

/* one output row: the band, left and right parts in units of exp(zc + zr),
 * y = sigmoid(q) * num / den with one division; redo[c] marks entries whose
 * den underflowed. Returns whether any did. Without `right` (causal: rs0,
 * rs1 and fs unused) the same arithmetic without the right part's zeros;
 * callers pass it as a constant, so each form is a loop of its own. (A
 * function of its own so that restrict tells the compiler nothing here
 * aliases: the char stores to redo would otherwise need more run-time alias
 * checks than it makes, and the loop stayed scalar.) */
static inline __attribute__((always_inline)) int
band_row_out(float *restrict yr, unsigned char *restrict redo, const float *restrict qr, const float *restrict b0,
             const float *restrict b1, const float *restrict p0, const float *restrict p1,
             const float *restrict rs0, const float *restrict rs1, const float *restrict fe,
             const float *restrict fp, const float *restrict fs, float fr, float fz, size_t cw, int right)
{
    int any = 0;
    for (size_t c = 0; c < cw; c++) {
        float fb = fe[c] * fr;
        float l0 = p0[c] * fp[c], l1 = p1[c] * fp[c];
        float den = b0[c] * fb + (right ? l0 + rs0[c] * fs[c] : l0) * fz;
        float num = b1[c] * fb + (right ? l1 + rs1[c] * fs[c] : l1) * fz;
        yr[c] = num / (den * (1.0f + aft_expf(-qr[c])));
        unsigned char bad = !(den >= AFT_DEN_EXACT_BELOW);
        redo[c] = bad;
        any |= bad;
    }
    return any;
}

/* Keys whose exp(k - mk) a block already holds join a running sum with one
 * stabiliser st as that times g = exp(mk - st), no exponential per entry,
 * while mk is at most JUMP above st (why: left_plan).
 * Returns whether they may; then g is set. */
__attribute__((noinline)) static int band_factor_scale(float *restrict g, const float *restrict mk,
                                                       const float *restrict st, size_t n)
{
    for (size_t c = 0; c < n; c++)
        if (mk[c] - st[c] > JUMP) return 0;
    for (size_t c = 0; c < n; c++) g[c] = aft_expf(mk[c] - st[c]);
    return 1;
}

/* One task of the band kernel: rows [r0, r1) of a block of cw channels of
 * head h, on the calling thread. q, k, v and out point at the block's first
 * channel; rows are ws's (ldq, ldk, ldv and C floats apart), q's and out's
 * counted from ws->q_row0. */
typedef struct {
    float *out;             /* (rows from q_row0, C): the output */
    const float *q;         /* (rows from q_row0, ldq) */
    const float *k, *v;     /* (T, ldk), (T, ldv) */
    const aft_opspec *ws;   /* T, C, the strides, causality, the bias */
    band_scratch *sc;       /* the calling thread's */
    size_t h;               /* the head: conv's bias row */
    size_t cw;              /* channels */
    size_t s;               /* the band: |t' - t| < s */
    size_t r0, r1;          /* the rows */
    int zero_bias;          /* w = 0 in the band */
    int have_left;          /* sc's left sum (pst, p0, p1, pmax) holds the keys before r0 - s; else none */
    int have_right;         /* not causal: sc->rin holds the keys from r1 + s on; else none */
} band_args;

/* Where the steps below are compiled (measured against the kernel before
 * it was cut into steps, T = 4096, C = 256, local and conv, causal or not,
 * keys with jumps: each within 2%): band_task with its blocks' set-up
 * (right_snapshots, left_plan, block_rows inlined), each segment's rows in
 * segment_groups (band_group, group_weights, band_row_out inlined); not
 * inlined, as GCC chose before, plan_block, band_sums, band_factor_scale
 * and right_block (whose exponentials, inside band_task, GCC stopped
 * inlining: add_exact took 20% longer on keys that jump), and
 * block_factors. */

/* A block of rows [i0, i1) (at most BAND_ROWS) and the band rows [lob, hib)
 * they read, whose factors exp(k - mk) sc->ek and sc->ekv hold (bs floats a
 * block of EKB channels; lob == hib: none) */
typedef struct {
    size_t i0, i1, lob, hib, bs;
    int fixed;   /* one left stabiliser for the whole block, else one a row */
    int reuse;   /* with fixed: the left keys join as ek exp(mk - pst) (sc->gl) */
} row_block;

/* The right part's block [i0, i1) of b: the keys t + s (t + s < T) join
 * the running sum (sc->qst, q0, q1, qmax) as t runs i1 - 1 .. i0. With
 * store, row t's sum (keys t' >= t + s, scaled by exp(-rst)) goes to rs0,
 * rs1 at row t - i0, and its stabiliser to rst at row t - i0, or only at
 * row 0 when it is the same for the whole block (then sc->right_fixed is
 * 1). Keys [lob, hib) have their band factors in sc->ek, sc->ekv with the
 * maximum sc->mk: with one stabiliser they join as ek exp(mk - st), as in
 * the left part (left_plan). */
__attribute__((noinline)) static void right_block(const band_args *a, const row_block *b, int store)
{
    band_scratch *sc = a->sc;
    const float *k = a->k, *v = a->v;
    const size_t ldk = a->ws->ldk, ldv = a->ws->ldv, T = a->ws->T, s = a->s, cw = a->cw;
    const size_t i0 = b->i0, i1 = b->i1, lob = b->lob, hib = b->hib, bs = b->bs;
    float *st = sc->qst, *s0 = sc->q0, *s1 = sc->q1, *smax = sc->qmax;
    long j0 = (long)(i1 - 1 + s), j1 = (long)(i0 + s) - 1;
    if (j0 > (long)T - 1) j0 = (long)T - 1;
    int fixed = plan_block(sc->fs, sc->first, smax, k, ldk, j0, j0 < j1 ? j0 : j1, -1, cw);
    if (fixed) restabilise(st, s0, s1, sc->fs, cw);
    sc->right_fixed = fixed;
    if (store && fixed) memcpy(sc->rst, st, cw * sizeof(float));
    int reuse = fixed && hib > lob && band_factor_scale(sc->gr, sc->mk, st, cw);
    for (size_t t = i1; t-- > i0;) {
        if (t + s < T) {
            const float *kr = k + (t + s) * ldk, *vr = v + (t + s) * ldv;
            if (reuse && t + s >= lob && t + s < hib)
                add_scaled(s0, s1, sc->gr, sc->ek + (t + s - lob) * EKB, sc->ekv + (t + s - lob) * EKB, bs, cw);
            else if (fixed) add_fixed(s0, s1, st, kr, vr, cw);
            else add_exact(st, s0, s1, kr, vr, cw);
            for (size_t c = 0; c < cw; c++) smax[c] = kr[c] > smax[c] ? kr[c] : smax[c];
        }
        if (store) {
            memcpy(sc->rs0 + (t - i0) * cw, s0, cw * sizeof(float));
            memcpy(sc->rs1 + (t - i0) * cw, s1, cw * sizeof(float));
            if (!fixed) memcpy(sc->rst + (t - i0) * cw, st, cw * sizeof(float));
        }
    }
}

/* The right part, first pass: row t needs the keys t' >= t + s, which join
 * as t runs backwards. One pass from r1 - 1 back to r0 keeps only the
 * running sum at the end of each block (sc->snap); the forward pass
 * (band_task) takes a block's rows' sums up again from there, into rs0,
 * rs1, rst (one block, in the caches, instead of T rows of them in
 * memory), the same sums. */
static void right_snapshots(const band_args *a)
{
    band_scratch *sc = a->sc;
    const size_t cw = a->cw, r0 = a->r0, r1 = a->r1;
    if (a->have_right) {
        memcpy(sc->qst, sc->rin, 4 * cw * sizeof(float));
    } else {
        for (size_t c = 0; c < cw; c++) {
            sc->qst[c] = -INFINITY; sc->q0[c] = 0.0f; sc->q1[c] = 0.0f; sc->qmax[c] = -INFINITY;
        }
    }
    size_t nblk = (r1 - r0 + BAND_ROWS - 1) / BAND_ROWS;
    for (size_t bi = nblk; bi-- > 0;) {
        size_t i0 = r0 + bi * BAND_ROWS, i1 = i0 + BAND_ROWS < r1 ? i0 + BAND_ROWS : r1;
        memcpy(sc->snap + bi * 4 * cw, sc->qst, 4 * cw * sizeof(float));
        /* the sum after the first block is not needed (a chunk of the
         * layer's pipeline is one block: then there is no pass here) */
        if (bi > 0) right_block(a, &(row_block){.i0 = i0, .i1 = i1}, 0);
    }
}

/* The block's band factors exp(k - mk) into sc->ek, sc->ekv, mk (sc->mk)
 * the block's key maximum per channel. Returns whether no key is +inf or
 * NaN (the fall-back kernel meets them). */
__attribute__((noinline)) static int block_factors(const band_args *a, const row_block *b)
{
    band_scratch *sc = a->sc;
    const float *k = a->k, *v = a->v;
    const size_t ldk = a->ws->ldk, ldv = a->ws->ldv, cw = a->cw, lob = b->lob, hib = b->hib, bs = b->bs;
    float *mk = sc->mk;
    int keys_ok = 1;
    for (size_t c = 0; c < cw; c++) mk[c] = -INFINITY;
    for (size_t j = lob; j < hib; j++) {
        const float *kr = k + j * ldk;
        for (size_t c = 0; c < cw; c++) {
            mk[c] = kr[c] > mk[c] ? kr[c] : mk[c];
            keys_ok &= kr[c] < INFINITY;
        }
    }
    for (size_t c = 0; c < cw; c++) mk[c] = isfinite(mk[c]) ? mk[c] : 0.0f;
    for (size_t j = lob; j < hib; j++) {
        const float *kr = k + j * ldk, *vr = v + j * ldv;
        for (size_t cb = 0; cb < cw; cb += EKB) {
            float *e = sc->ek + cb / EKB * bs + (j - lob) * EKB, *ev = sc->ekv + cb / EKB * bs + (j - lob) * EKB;
            size_t n = cw - cb < EKB ? cw - cb : EKB;
            ek_row(e, ev, kr + cb, vr + cb, mk + cb, n, keys_ok);
        }
    }
    return keys_ok;
}

/* The left part's plan for block b: one stabiliser for the block if the
 * keys joining allow it, and the right part's stabiliser does not change
 * inside the block (b->fixed; then the left sum is moved to it); and
 * whether the joining keys' ek can be reused (b->reuse). */
static void left_plan(const band_args *a, row_block *b)
{
    band_scratch *sc = a->sc;
    const size_t s = a->s, cw = a->cw, i0 = b->i0, i1 = b->i1;
    int fixed = 1;
    if (i1 > s) {
        size_t j0 = i0 > s ? i0 - s : 0, j1 = i1 - s;
        fixed = plan_block(sc->fs, sc->first, sc->pmax, a->k, a->ws->ldk, (long)j0, (long)j1, 1, cw);
    }
    if (!a->ws->causal && !sc->right_fixed)
        for (size_t t = i0 + 1; t < i1 && fixed; t++)
            fixed = memcmp(sc->rst + (t - i0) * cw, sc->rst, cw * sizeof(float)) == 0;
    if (fixed && i1 > s) restabilise(sc->pst, sc->p0, sc->p1, sc->fs, cw);
    /* In a block with one left stabiliser the keys joining the left
     * sum (but the first) are band rows of the block, whose exp(k - mk)
     * ek holds: exp(k - pst) = ek exp(mk - pst), no exponential per
     * entry. Only while mk is at most JUMP above pst: a key that
     * underflowed in ek is then more than 87 - JUMP nats below pst,
     * and the sum holds a term within JUMP of pst (plan_block), so
     * dropping it changes nothing in float. */
    b->fixed = fixed;
    b->reuse = fixed && i1 > s && band_factor_scale(sc->gl, sc->mk, sc->pst, cw);
}

/* The band weights of the gn rows from t0: row i's w (sc->w + i 2s), its
 * band maximum r (sc->r[i]) and exp(w - r) into column i of sc->ew, whose
 * row j is band row ulo + j */
static inline __attribute__((always_inline)) void group_weights(const band_args *a, size_t t0, size_t gn,
                                                                size_t ulo)
{
    const aft_opspec *ws = a->ws;
    band_scratch *sc = a->sc;
    const size_t T = ws->T, s = a->s;
    const int causal = ws->causal;
    float *ew = sc->ew;
    for (size_t i = 0; i < gn; i++) {
        size_t t = t0 + i;
        size_t lo = t + 1 >= s ? t + 1 - s : 0;
        size_t hi = causal ? t + 1 : (t + s < T ? t + s : T);
        size_t nw = hi - lo;
        float *w = sc->w + i * 2 * s;
        /* band weights exp(w - r), r the row's band maximum */
        float r = 0.0f;
        if (a->zero_bias) {
            for (size_t j = 0; j < nw; j++) w[j] = 0.0f;
        } else {
            aft_w_row(ws, a->h, ws->t_off + t, ws->t_off + lo, ws->t_off + hi, w);
            r = aft_max_f32(w, nw);
            if (!isfinite(r)) r = 0.0f;
        }
        sc->r[i] = r;
        for (size_t j = 0; j < nw; j++) ew[(lo - ulo + j) * GROUP + i] = aft_expf(w[j] - r);
    }
}

/* Row t's entries whose den underflowed (sc->redo), exactly in double: the
 * band's terms one by one (w: its weights), the running sums (exact by
 * construction) at their own stabilisers: the left sum's pst, the right
 * one's rst (rs0, rs1: its sums; zeros when causal) */
static void row_exact(const band_args *a, size_t t, const float *w, const float *rs0, const float *rs1,
                      const float *rst, float *yr)
{
    const aft_opspec *ws = a->ws;
    const band_scratch *sc = a->sc;
    const float *k = a->k, *v = a->v, *pst = sc->pst, *p0 = sc->p0, *p1 = sc->p1;
    const size_t T = ws->T, ldk = ws->ldk, ldv = ws->ldv, s = a->s;
    const int causal = ws->causal;
    const float *qr = a->q + (t - ws->q_row0) * ws->ldq;
    size_t lo = t + 1 >= s ? t + 1 - s : 0;
    size_t hi = causal ? t + 1 : (t + s < T ? t + s : T);
    for (size_t c = 0; c < a->cw; c++) {
        if (!sc->redo[c]) continue;
        double bm = -INFINITY;
        for (size_t j = lo; j < hi; j++) {
            double e = (double)k[j * ldk + c] + (double)w[j - lo];
            bm = e > bm ? e : bm;
        }
        double lm = p0[c] > 0.0f ? (double)pst[c] : -INFINITY;
        double rm = !causal && rs0[c] > 0.0f ? (double)rst[c] : -INFINITY;
        double M = bm > lm ? bm : lm;
        M = rm > M ? rm : M;
        double num = 0.0, den = 0.0;
        if (M > -INFINITY) {
            for (size_t j = lo; j < hi; j++) {
                double e = exp((double)k[j * ldk + c] + (double)w[j - lo] - M);
                den += e;
                num += e * (double)v[j * ldv + c];
            }
            if (lm > -INFINITY) {
                double f = exp(lm - M);
                den += p0[c] * f;
                num += p1[c] * f;
            }
            if (rm > -INFINITY) {
                double f = exp(rm - M);
                den += rs0[c] * f;
                num += rs1[c] * f;
            }
        }
        double sq = 1.0 / (1.0 + exp(-(double)qr[c]));
        yr[c] = den > 0.0 ? (float)(sq * num / den) : 0.0f;
    }
}

/* Up to GROUP rows [t0, t1) of a segment of block b (rows sharing all
 * stabilisers: sc->fe, fp, fs; rst the right part's): their band sums at
 * once (they share most band rows, so each row of ek/ekv loaded feeds
 * GROUP rows' sums), then row by row the left key joining, the output,
 * and the exact recomputation where den underflowed */
static inline __attribute__((always_inline)) void band_group(const band_args *a, const row_block *b, size_t t0,
                                                             size_t t1, const float *rst)
{
    const aft_opspec *ws = a->ws;
    band_scratch *sc = a->sc;
    const float *k = a->k, *v = a->v;
    const size_t T = ws->T, C = ws->C, ldq = ws->ldq, ldk = ws->ldk, ldv = ws->ldv, s = a->s, cw = a->cw;
    const size_t i0 = b->i0, lob = b->lob, bs = b->bs;
    const int causal = ws->causal, fixed = b->fixed, reuse = b->reuse;
    float *p0 = sc->p0, *p1 = sc->p1, *pst = sc->pst;
    size_t gn = t1 - t0;
    size_t ulo = t0 + 1 >= s ? t0 + 1 - s : 0;
    size_t tl = t0 + gn - 1;
    size_t uhi = causal ? tl + 1 : (tl + s < T ? tl + s : T);
    size_t un = uhi - ulo;
    memset(sc->ew, 0, un * GROUP * sizeof(float));
    group_weights(a, t0, gn, ulo);
    /* under causality row i sees band rows up to jt - 1 + i
     * (band_sums leaves the later ones out) */
    size_t jt = causal ? t0 - ulo + 1 : un;
    band_sums(sc->b0, sc->b1, sc->ew, sc->ek + (ulo - lob) * EKB, sc->ekv + (ulo - lob) * EKB, un, jt, cw, bs);

    for (size_t i = 0; i < gn; i++) {
        size_t t = t0 + i;
        if (fixed && t >= s && reuse && t - s >= lob) {
            add_scaled(p0, p1, sc->gl, sc->ek + (t - s - lob) * EKB, sc->ekv + (t - s - lob) * EKB, bs, cw);
        } else if (fixed && t >= s) {
            const float *kr = k + (t - s) * ldk;
            add_fixed(p0, p1, pst, kr, v + (t - s) * ldv, cw);
        }
        float r = sc->r[i];
        const float *b0 = sc->b0 + i * cw, *b1 = sc->b1 + i * cw;

        /* everything in units of exp(zc + zr): no exponential per entry */
        float zr = r > 0.0f ? r : 0.0f;
        float fr = aft_expf(r - zr), fz = aft_expf(-zr);
        const float *qr = a->q + (t - ws->q_row0) * ldq;
        float *yr = a->out + (t - ws->q_row0) * C;
        /* causal: no right part (zeros for the exact sums below) */
        const float *rs0 = causal ? sc->zeros : sc->rs0 + (t - i0) * cw;
        const float *rs1 = causal ? sc->zeros : sc->rs1 + (t - i0) * cw;
        int any_redo = causal ? band_row_out(yr, sc->redo, qr, b0, b1, p0, p1, rs0, rs1, sc->fe, sc->fp, sc->fs,
                                             fr, fz, cw, 0)
                              : band_row_out(yr, sc->redo, qr, b0, b1, p0, p1, rs0, rs1, sc->fe, sc->fp, sc->fs,
                                             fr, fz, cw, 1);
        if (any_redo) row_exact(a, t, sc->w + i * 2 * s, rs0, rs1, rst, yr);
    }
}

/* The rows [g0, g1) of a segment of block b, GROUP at a time (band_group).
 * A function of its own, with its own copies of the task's and block's
 * arguments (which it then keeps in registers), so that the rows' loops
 * are compiled apart from the block's set-up: inlined into band_task,
 * band_row_out's loop spilled differently and ran 2-5% slower (local, T =
 * 4096, C = 256), and band_group as the function a call for each group
 * cost up to 8% where a block holds few channels (conv's heads). */
__attribute__((noinline)) static void segment_groups(const band_args *args, const row_block *blk, size_t g0, size_t g1,
                                                     const float *rst)
{
    const band_args task = *args, *a = &task;
    const row_block bk = *blk, *b = &bk;
    for (size_t t0 = g0; t0 < g1; t0 += GROUP) band_group(a, b, t0, g1 - t0 < GROUP ? g1 : t0 + GROUP, rst);
}

/* The rows of block b in segments that share all stabilisers: the whole
 * block (b->fixed), or single rows, whose left key joins exactly first.
 * A segment's factors bring the band (mk), left (pst) and right (rst)
 * parts to their largest, zc, each row's then in groups (band_group). */
static inline __attribute__((always_inline)) void block_rows(const band_args *a, const row_block *b)
{
    band_scratch *sc = a->sc;
    const size_t ldk = a->ws->ldk, ldv = a->ws->ldv, s = a->s, cw = a->cw, i0 = b->i0, i1 = b->i1;
    const int causal = a->ws->causal;
    const float *mk = sc->mk, *pst = sc->pst;
    for (size_t g0 = i0; g0 < i1;) {
        size_t g1 = b->fixed ? i1 : g0 + 1;
        if (!b->fixed && g0 >= s) {   /* exact: join the row's left key first */
            add_exact(sc->pst, sc->p0, sc->p1, a->k + (g0 - s) * ldk, a->v + (g0 - s) * ldv, cw);
            for (size_t c = 0; c < cw; c++) sc->pmax[c] = pst[c];
        }
        const float *rst = causal ? NULL : sc->rst + (sc->right_fixed ? 0 : g0 - i0) * cw;
        for (size_t c = 0; c < cw; c++) {
            float zc = fmax3(mk[c], pst[c], causal ? -INFINITY : rst[c]);
            sc->fe[c] = aft_expf(mk[c] - zc);
            sc->fp[c] = scale_down(pst[c], zc);
            sc->fs[c] = causal ? 0.0f : scale_down(rst[c], zc);
        }
        segment_groups(a, b, g0, g1, rst);
        g0 = g1;
    }
}

/* The task a: rows [r0, r1) of its channels, a block of BAND_ROWS rows at
 * a time: the block's band factors, its right sums (from the first pass's
 * snapshot), the left sum's plan, then its rows. With have_left the left
 * running sum in sc (pst, p0, p1, pmax) already holds the keys before r0 -
 * s, else it starts empty; without causality, with have_right the right
 * one starts from sc->rin (the keys from r1 + s on), else from nothing.
 * Returns 0 when a key the band blocks read (every key of the rows among
 * them) is +inf or NaN, 1 otherwise. */
static int band_task(const band_args *args)
{
    /* a copy of its own: through args every field would be read again
     * after each call the steps make */
    const band_args task = *args, *a = &task;
    band_scratch *sc = a->sc;
    const size_t T = a->ws->T, s = a->s, cw = a->cw, r0 = a->r0, r1 = a->r1;
    const int causal = a->ws->causal;
    if (!causal) right_snapshots(a);

    /* the left part runs forward as rows advance: row t holds t' <= t - s */
    float *pst = sc->pst, *p0 = sc->p0, *p1 = sc->p1, *pmax = sc->pmax;
    int all_ok = 1;
    if (!a->have_left)
        for (size_t c = 0; c < cw; c++) { pst[c] = -INFINITY; p0[c] = 0.0f; p1[c] = 0.0f; pmax[c] = -INFINITY; }

    for (size_t i0 = r0; i0 < r1; i0 += BAND_ROWS) {
        row_block b = {.i0 = i0, .i1 = i0 + BAND_ROWS < r1 ? i0 + BAND_ROWS : r1};
        b.lob = i0 + 1 >= s ? i0 + 1 - s : 0;
        b.hib = causal ? b.i1 : (b.i1 + s - 1 < T ? b.i1 + s - 1 : T);
        b.bs = (b.hib - b.lob) * EKB;
        int keys_ok = block_factors(a, &b);
        if (!causal) {   /* this block's right sums, from its snapshot */
            memcpy(sc->qst, sc->snap + (i0 - r0) / BAND_ROWS * 4 * cw, 4 * cw * sizeof(float));
            right_block(a, &b, 1);
        }
        left_plan(a, &b);
        block_rows(a, &b);
        /* the keys that joined in a fixed block: their maximum is the
         * stabiliser plan_block chose (the left sum's stabiliser is always
         * its largest key once a block is done) */
        if (b.fixed && b.i1 > s) memcpy(pmax, pst, cw * sizeof(float));
        all_ok &= keys_ok;
    }
    return all_ok;
}

/* One thread's scratch: right-part sums for a range of n_right rows (0 when
 * causal), a band block for window s (0: none), cw channels. Returns the block to
 * pass to scratch_free, NULL when out of memory (nothing to free then). */
static float *scratch_alloc(band_scratch *sc, size_t n_right, size_t s, size_t cw)
{
    memset(sc, 0, sizeof *sc);
    size_t nr = n_right ? BAND_ROWS * cw : 0, nb = s ? (BAND_ROWS + 2 * s) * ((cw + EKB - 1) / EKB * EKB) : 0;
    size_t nsnap = (n_right + BAND_ROWS - 1) / BAND_ROWS * 4 * cw;
    const size_t sizes[] = {nr, nr, nr, nb, nb, GROUP * 2 * s, GROUP * (2 * s + GROUP),
                            cw, cw, cw, cw, cw, cw, cw, cw, GROUP * cw, GROUP * cw, cw, cw,
                            4 * cw, 4 * cw, nsnap, cw, cw};
    float **arrays[] = {&sc->rs0, &sc->rs1, &sc->rst, &sc->ek, &sc->ekv, &sc->w, &sc->ew, &sc->mk, &sc->pst,
                        &sc->pmax, &sc->p0, &sc->p1, &sc->fe, &sc->fp, &sc->fs, &sc->b0, &sc->b1, &sc->first,
                        &sc->zeros, &sc->qst, &sc->rin, &sc->snap, &sc->gl, &sc->gr};
    _Static_assert(sizeof arrays / sizeof arrays[0] == sizeof sizes / sizeof sizes[0], "one size per array");
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    float *blk = aft_alloc_array(total, sizeof(float));
    sc->redo = malloc(cw ? cw : 1);
    if (!blk || !sc->redo) {
        free(blk);
        free(sc->redo);
        return NULL;
    }
    float *p = blk;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *arrays[i] = p;
        p += sizes[i];
    }
    memset(sc->zeros, 0, cw * sizeof(float));
    sc->q0 = sc->qst + cw;
    sc->q1 = sc->qst + 2 * cw;
    sc->qmax = sc->qst + 3 * cw;
    return blk;
}

static void scratch_free(band_scratch *sc, float *blk)
{
    free(blk);
    free(sc->redo);
}

/* Local, conv (each head's channels in turn) or simple with causality, one
 * sequence: the rows split over the threads, each thread all channels of
 * its rows (whole rows read in order; splitting channels made every thread
 * stride through every row and wait on memory). A thread starting at row t0
 * needs the left running sum of the keys before t0 - s: the threads first
 * sum those keys in equal pieces (aft_sums_of_rows), then each starts from the
 * merged sums of the pieces before its t0 - s. Channels go in blocks of
 * ROW_SPLIT_CH.
 *
 * Returns 1 when done, 0 when some key is +inf or NaN (the caller runs the
 * channel-split kernel, whose handling of those this does not repeat), -1
 * when out of memory. */
enum { ROW_SPLIT_CH = 512, ROW_SPLIT_MIN_ROWS = BAND_ROWS };
static int band_rows_split(float *out, const float *q, const float *k, const float *v,
                           const aft_opspec *ws, size_t s, int zero_bias, size_t nt)
{
    const size_t C = ws->C, ldk = ws->ldk, ldv = ws->ldv, T = ws->T;
    const size_t H = ws->heads, ch = C / H;
    const size_t cwr = ch < ROW_SPLIT_CH ? ch : ROW_SPLIT_CH;
    /* slots of (m, s0, s1, scratch), 4C each: n pieces, then one remainder
     * per thread */
    float *parts = aft_alloc_array(nt * 8, C * sizeof(float));
    if (!parts) return -1;
    int failed = 0, bad = 0;
    #pragma omp parallel num_threads((int)nt)
    {
        band_scratch sc;
        float *blk = scratch_alloc(&sc, 0, s, cwr);
        if (!blk) {
            #pragma omp atomic write
            failed = 1;
        }
        size_t tid = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
        size_t t0 = T * tid / n, t1 = T * (tid + 1) / n;
        /* Thread i starts from the keys [0, t0_i - s). The longest such prefix
         * (the last thread's) is cut into n equal pieces, one per thread;
         * thread i merges the pieces inside its prefix and sums the rest of
         * it, part of one piece, itself. */
        size_t tl = T * (n - 1) / n, P = tl > s ? tl - s : 0, need = t0 > s ? t0 - s : 0;
        size_t p0 = P * tid / n, p1 = P * (tid + 1) / n, full = 0;
        while (full < n && P * (full + 1) / n <= need) full++;
        size_t rest0 = P * full / n;
        float *m = parts + tid * 4 * C, *r = parts + (n + tid) * 4 * C;
        #pragma omp barrier
        if (!failed && aft_sums_of_rows(k, ldk, v, ldv, p0, p1, C, m, m + C, m + 2 * C, m + 3 * C)) {
            #pragma omp atomic write
            bad = 1;
        }
        #pragma omp barrier
        if (!failed && !bad) {
            /* keys [rest0, need) lie in a piece checked above */
            (void)aft_sums_of_rows(k, ldk, v, ldv, rest0, need > rest0 ? need : rest0, C, r, r + C, r + 2 * C,
                               r + 3 * C);
            /* each head's channels in blocks (conv's heads differ in w only) */
            for (size_t c0 = 0, cw = 0; c0 < C; c0 += cw) {
                size_t hh = c0 / ch, hend = (hh + 1) * ch;
                cw = hend - c0 < cwr ? hend - c0 : cwr;
                for (size_t c = 0; c < cw; c++) {
                    float M, a0, a1;
                    aft_sums_merge_channel(parts, 4 * C, full, C, c0 + c, &M, &a0, &a1);
                    /* and the remainder */
                    float mr = r[c0 + c];
                    float Z = M > mr ? M : mr;
                    float fa = M == -INFINITY ? 0.0f : aft_expf(M - Z);
                    float fr = mr == -INFINITY ? 0.0f : aft_expf(mr - Z);
                    sc.pst[c] = Z;
                    sc.pmax[c] = Z;
                    /* one rounding for the merged pieces' part */
                    sc.p0[c] = fmaf(a0, fa, r[C + c0 + c] * fr);
                    sc.p1[c] = fmaf(a1, fa, r[2 * C + c0 + c] * fr);
                }
                /* the keys of this thread's rows' bands, which the pieces
                 * above do not reach for the last rows, are checked here:
                 * each key is in some thread's bands */
                band_args a = {.out = out + c0, .q = q + c0, .k = k + c0, .v = v + c0, .ws = ws, .sc = &sc,
                               .h = hh, .cw = cw, .s = s, .r0 = t0, .r1 = t1, .zero_bias = zero_bias,
                               .have_left = 1};
                if (!band_task(&a)) {
                    #pragma omp atomic write
                    bad = 1;
                }
            }
        }
        if (blk) scratch_free(&sc, blk);
    }
    free(parts);
    return failed ? -1 : bad ? 0 : 1;
}

aft_status aft_op_band(float *out, const float *q, const float *k, const float *v,
                       size_t B, const aft_opspec *ws, aft_error *err)
{
    const size_t T = ws->T, C = ws->C, H = ws->heads, ch = C / H;
    if (T == 0 || C == 0 || B == 0) return AFT_OK;
    const int zero_bias = ws->zero_bias;
    const size_t s = aft_spec_band(ws, T), nt = (size_t)ws->threads;
    /* many short sequences: the tasks below, a sequence's block of channels
     * each, where splitting each one's few rows over the threads cost a
     * parallel region a sequence */
    if (ws->causal && H == 1 && (B < nt || T >= nt * ROW_SPLIT_MIN_ROWS)) {
        int r = 1;
        for (size_t b = 0; b < B && r > 0; b++)
            r = band_rows_split(out + b * T * C, q + b * T * ws->ldq, k + b * T * ws->ldk, v + b * T * ws->ldv,
                                ws, s, zero_bias, nt);
        if (r < 0) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for band scratch (T = %zu)", T);
        if (r > 0) return AFT_OK;
        /* a key of +inf or NaN: the channel-split kernel below, for all batches */
    }
    /* channel blocks as wide as BAND_CH (per-row work is shared by a block's
     * channels), narrower when that leaves threads without a block */
    size_t bw = BAND_CH;
    while (bw > 32 && B * H * ((ch + bw - 1) / bw) < nt) bw /= 2;
    size_t nblk = (ch + bw - 1) / bw;
    size_t ntask = B * H * nblk;
    size_t cw_max = ch < bw ? ch : bw;

    /* per-thread scratch; every size is a small multiple of T * 64 or less,
     * and T * C was checked by the caller */
    size_t n_right = ws->causal ? 0 : T;
    int failed = 0;

    #pragma omp parallel num_threads((int)nt)
    {
        band_scratch sc;
        float *blk = scratch_alloc(&sc, n_right, s, cw_max);
        if (!blk) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < ntask; task++) {
                size_t b = task / (H * nblk), rest = task % (H * nblk);
                size_t hh = rest / nblk, blkno = rest % nblk;
                size_t c0 = hh * ch + blkno * bw;
                size_t cw = ch - blkno * bw < bw ? ch - blkno * bw : bw;
                const float *qb = q + b * T * ws->ldq, *kb = k + b * T * ws->ldk, *vb = v + b * T * ws->ldv;
                band_args a = {.out = out + b * T * C + c0, .q = qb + c0, .k = kb + c0, .v = vb + c0, .ws = ws,
                               .sc = &sc, .h = hh, .cw = cw, .s = s, .r0 = 0, .r1 = T, .zero_bias = zero_bias};
                (void)band_task(&a);
            }
        }
        scratch_free(&sc, blk);
    }
    if (failed)
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for band scratch (T = %zu)", T);
    return AFT_OK;
}

/* ---- a chunk of rows on the calling thread (aft_op_rows) */

struct aft_band_ctx {
    band_scratch sc;
    float *blk;
    size_t cwr;   /* channels per block */
};

aft_band_ctx *aft_band_ctx_new(const aft_opspec *ws, size_t rows)
{
    const size_t ch = ws->C / ws->heads;
    aft_band_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->cwr = ch < ROW_SPLIT_CH ? ch : ROW_SPLIT_CH;
    ctx->blk = scratch_alloc(&ctx->sc, ws->causal ? 0 : rows, aft_spec_halo(ws), ctx->cwr);
    if (!ctx->blk) {
        free(ctx);
        return NULL;
    }
    return ctx;
}

void aft_band_ctx_free(aft_band_ctx *ctx)
{
    if (!ctx) return;
    scratch_free(&ctx->sc, ctx->blk);
    free(ctx);
}

/* band_row1's sums: den += exp(k + w - Z), num += that times v, over the
 * nw keys from lo; nonpos: no exponent is above 0 or NaN, the domain of
 * aft_expf_nonpos */
static inline __attribute__((always_inline)) void
band_row1_terms(float *restrict den, float *restrict num, const float *k, size_t ldk, const float *v, size_t ldv,
                size_t lo, size_t nw, const float *w, const float *restrict Z, size_t cw, int nonpos)
{
    for (size_t j = 0; j < nw; j++) {
        const float *kr = k + (lo + j) * ldk, *vr = v + (lo + j) * ldv;
        const float wj = w[j];
        for (size_t c = 0; c < cw; c++) {
            float x = kr[c] + wj - Z[c];
            float e = nonpos ? aft_expf_nonpos(x) : aft_expf(x);
            den[c] += e;
            num[c] += e * vr[c];
        }
    }
}

/* One causal row t of task a (its channels, of head h), the left sum in
 * sc (pst, p0, p1, pmax) holding the keys before t - s + 1 once it has taken
 * key t - s here. The band's terms exp(k + w - Z) are summed directly, Z the
 * exact maximum of the band's k + w and the left sum's stabiliser, so the
 * largest term is 1 and no sum can underflow: s exponentials a channel,
 * where the blocked kernel shares each key's among the rows of its window,
 * which pays only over many rows. For a step of a row or two (a token at a
 * time) this is several times faster. Returns 0 when a key it reads is +inf
 * or NaN. */
static int band_row1(const band_args *a, size_t t)
{
    const aft_opspec *ws = a->ws;
    const size_t ldk = ws->ldk, ldv = ws->ldv, cw = a->cw, s = a->s;
    const float *k = a->k, *v = a->v;
    band_scratch *sc = a->sc;
    float *restrict pst = sc->pst, *restrict p0 = sc->p0, *restrict p1 = sc->p1, *restrict pmax = sc->pmax;
    int ok = 1;
    if (t >= s) {   /* key t - s leaves the band for the left sum */
        const float *kr = k + (t - s) * ldk;
        for (size_t c = 0; c < cw; c++) ok &= kr[c] < INFINITY;
        add_exact(pst, p0, p1, kr, v + (t - s) * ldv, cw);
        for (size_t c = 0; c < cw; c++) pmax[c] = kr[c] > pmax[c] ? kr[c] : pmax[c];
    }
    size_t lo = t + 1 >= s ? t + 1 - s : 0, nw = t + 1 - lo;
    float *w = sc->w, *restrict Z = sc->mk, *restrict den = sc->b0, *restrict num = sc->b1;
    if (ws->zero_bias) memset(w, 0, nw * sizeof(float));
    else aft_w_row(ws, a->h, ws->t_off + t, ws->t_off + lo, ws->t_off + t + 1, w);
    for (size_t c = 0; c < cw; c++) Z[c] = pst[c];
    for (size_t j = 0; j < nw; j++) {
        const float *kr = k + (lo + j) * ldk;
        const float wj = w[j];
        for (size_t c = 0; c < cw; c++) {
            float e = kr[c] + wj;
            ok &= kr[c] < INFINITY;
            Z[c] = e > Z[c] ? e : Z[c];
        }
    }
    for (size_t c = 0; c < cw; c++) {
        float z = Z[c];
        Z[c] = z == -INFINITY ? 0.0f : z;   /* nothing visible: every term 0 */
    }
    for (size_t c = 0; c < cw; c++) {
        /* scale_down(pst, Z) without its branch, which kept this loop
         * scalar: Z is finite or +inf here, so pst = -inf gives exp(-inf) = 0 */
        float f = aft_expf(pst[c] - Z[c]);
        den[c] = p0[c] * f;
        num[c] = p1[c] * f;
    }
    /* Z is the largest k + w: with no w of +inf or NaN (and a key of either
     * ends the step, ok = 0) every exponent is <= 0 or -inf, the case
     * aft_expf_nonpos takes in 17 instructions a vector instead of 28 */
    int w_ok = 1;
    for (size_t j = 0; j < nw; j++) w_ok &= w[j] < INFINITY;
    if (w_ok) band_row1_terms(den, num, k, ldk, v, ldv, lo, nw, w, Z, cw, 1);
    else band_row1_terms(den, num, k, ldk, v, ldv, lo, nw, w, Z, cw, 0);
    const float *qr = a->q + (t - ws->q_row0) * ws->ldq;
    float *yr = a->out + (t - ws->q_row0) * ws->C;
    for (size_t c = 0; c < cw; c++) yr[c] = den[c] > 0.0f ? aft_sigmoidf(qr[c]) * (num[c] / den[c]) : 0.0f;
    return ok;
}

/* rows a causal step takes one at a time (band_row1) */
enum { ROW1_MAX = 2 };

int aft_band_rows(aft_band_ctx *ctx, float *out, const float *q, const float *k, const float *v,
                      const aft_opspec *ws, size_t r0, size_t r1, const float *carry_in, float *carry_out,
                      const float *right_in)
{
    const int zero_bias = ws->zero_bias;
    const size_t s = aft_spec_band(ws, ws->T);
    const size_t C = ws->C, ch = C / ws->heads;
    band_scratch *sc = &ctx->sc;
    int ok = 1;
    for (size_t c0 = 0, cw = 0; c0 < C; c0 += cw) {
        size_t hh = c0 / ch, hend = (hh + 1) * ch;
        cw = hend - c0 < ctx->cwr ? hend - c0 : ctx->cwr;
        float *const sums[4] = {sc->pst, sc->p0, sc->p1, sc->pmax};
        const float empty[4] = {-INFINITY, 0.0f, 0.0f, -INFINITY};
        for (size_t i = 0; i < 4; i++) {
            if (carry_in) memcpy(sums[i], carry_in + i * C + c0, cw * sizeof(float));
            else for (size_t c = 0; c < cw; c++) sums[i][c] = empty[i];
        }
        int have_right = !ws->causal && right_in;
        for (size_t i = 0; i < 4 && have_right; i++)
            memcpy(sc->rin + i * cw, right_in + i * C + c0, cw * sizeof(float));
        band_args a = {.out = out + c0, .q = q + c0, .k = k + c0, .v = v + c0, .ws = ws, .sc = sc, .h = hh,
                       .cw = cw, .s = s, .r0 = r0, .r1 = r1, .zero_bias = zero_bias, .have_left = 1,
                       .have_right = have_right};
        if (ws->causal && r1 - r0 <= ROW1_MAX)
            for (size_t t = r0; t < r1; t++) ok &= band_row1(&a, t);
        else
            ok &= band_task(&a);
        if (!carry_out) continue;
        memcpy(carry_out + c0, sc->pst, cw * sizeof(float));
        memcpy(carry_out + C + c0, sc->p0, cw * sizeof(float));
        memcpy(carry_out + 2 * C + c0, sc->p1, cw * sizeof(float));
        memcpy(carry_out + 3 * C + c0, sc->pmax, cw * sizeof(float));
    }
    return ok;
}
