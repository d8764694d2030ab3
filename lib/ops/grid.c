/* grid.c - AFT-local and AFT-conv on a grid of H x W tokens in raster
 * order, in O(H W s^2 C) time and O(H W C) memory, without a T x T array.
 *
 * For the query at grid row r, column c (window s: |r' - r| < s and
 * |c' - c| < s) the visible keys split into parts, each a sum of positive
 * terms:
 *   window  |r' - r| < s, |c' - c| < s   weights exp(k + w): a 2-D convolution
 *   left    |r' - r| < s, c' <= c - s    w = 0: a prefix over columns of the
 *                                        band rows' column sums
 *   right   |r' - r| < s, c' >= c + s    w = 0: a suffix of the same
 *   top     r' <= r - s                  w = 0: the rows' sums merged downwards
 *   bottom  r' >= r + s                  w = 0: merged upwards (not causal)
 * Causal (raster order, t' <= t): the band's rows end at r, and row r's keys
 * at c. The paper's conv2d(e^K, e^w - 1) + sum e^K form cancels
 * catastrophically when a window term dominates and w is very negative
 * (e^w - 1 is then -1 to rounding); this form never subtracts.
 *
 * Stabilisers. Each grid row's keys are held as e = exp(k - m_row), m_row
 * the row's largest key per channel (so each row has a term 1: its sums are
 * exact), computed once. For output row r the band rows come to a common
 * stabiliser Zt, their band maximum, by f = exp(m_row - Zt) <= 1: conv folds
 * f into its kernel's weights exp(w - rw) (rw the largest weight the row's
 * window uses, so every weight is <= 1), local scales each band row's
 * partial sums by it. The top and bottom sums are merged exactly (the
 * stabiliser is always their largest key). Then for each channel everything
 * is scaled by exp(zc + zr), zc the largest of the three stabilisers and
 * zr = max(rw, 0): every factor is <= 1, nothing overflows, and combining
 * costs no exponential per entry (all but one per query of local's are per
 * output row).
 *
 * A term lost to underflow on the way is below FLT_MIN in those units; where
 * the scaled denominator still came out below AFT_DEN_EXACT_BELOW (keys and
 * biases pulling opposite ways by more than ~45 nats) the entry is
 * recomputed exactly in double from the band rows' keys and the top and
 * bottom sums, which are exact by the rule above. As in local_conv.c.
 *
 * Work: the threads take tasks of (batch, channels, range of output rows);
 * the channels are the vector lanes (AFT_VL of them a block). conv's tasks
 * hold CONV_CH channels (its weights are per lane: per head) and take their
 * blocks one after another down the rows, so a block's band stays in L2;
 * local's hold every block, so its weights exp(w[t, t'] - rw), which differ
 * per query and are the same for all channels, are made once per query.
 * The window's sums are kept in registers for GN output columns at once.
 */
#include "kernels.h"

#include <omp.h>
#include <stdlib.h>

enum { GV = AFT_VL };   /* channels a block: one vector */
/* output columns whose window sums stay in registers at once: conv keeps
 * 2 GN sums, local 4 GN (a band row's partial sums, and the totals) */
#if defined(__AVX512F__)
enum { GN_CONV = 8, GN_LOCAL = 4 };
#else
enum { GN_CONV = 6, GN_LOCAL = 3 };
#endif
/* channels a conv task takes: its tokens' channels are read together in
 * the rows pass (a few cache lines a token rather than one) */
#ifndef CONV_CH
#define CONV_CH 64
#endif
/* tokens ahead the rows pass prefetches: it reads a few cache lines of each
 * token, rows of C channels apart, in order (4 to 16 measured alike) */
#ifndef PF_TOKENS
#define PF_TOKENS 6
#endif
#ifndef PF_LOC
#define PF_LOC 3
#endif

/* what every task of one call shares */
typedef struct {
    const aft_opspec *sp;
    const float *q, *k, *v;
    float *out;
    size_t H, W, S, C, ch;     /* S: the window; ch: channels a head */
    size_t kc;                 /* key channels: C, or conv's heads (channel c reads key c / ch) */
    size_t Se;                 /* min(S, max(H, W)): a wider window reaches no further */
    size_t Pr, Pc;             /* the window's reach in rows and in columns */
    size_t K2r, K2c;           /* 2 Pr + 1, 2 Pc + 1: the window's rows and columns */
    size_t Wp;                 /* a held row's columns: W, Pc zeros each side, GN more */
    size_t GN;                 /* output columns a register tile */
    int causal, conv;
    size_t nblk, nbt;          /* channel blocks; blocks a task */
    size_t rows_per, nsplit;   /* output rows a task; tasks a (batch, blocks) */
    size_t erows;              /* grid rows a task holds */
} grid_job;

/* one thread's scratch (sizes: grid_scratch_floats) */
typedef struct {
    float *ek;      /* (nbt, erows, Wp, 2, GV): exp(k - m_row), that times v; pads 0 */
    float *rm;      /* (nbt, H, GV): each row's largest key (NaN and +inf skipped) */
    float *rt;      /* (nbt, H, 2, GV): each row's sums of exp(k - m_row), and times v */
    float *bot;     /* (nbt, H + 1, 3, GV): (m, s0, s1) of the rows [r, H) */
    float *top;     /* (nbt, 3, GV): (m, s0, s1) of the rows [0, r - Se] */
    float *zt;      /* (nbt, GV): the band's stabiliser Zt */
    float *f;       /* (nbt, K2r, GV): band row i's exp(m_row - Zt) */
    float *ps, *ss; /* (nbt, W, 2, GV): prefix and suffix over columns of the band's column sums */
    float *fe;      /* (nbt, GV): exp(Zt - zc) */
    float *tb;      /* (nbt, 2, GV): the top and bottom sums in units of exp(zc) */
    float *fw, *fz; /* conv: (nbt, GV): exp(Zt - zc) exp(rw - zr), exp(-zr) */
    float *kw;      /* conv: (nbt, K2r, K2c, GV): each lane's kernel entry (its head's) */
    float *ew;      /* conv: (nbt, K2r, K2c, GV): exp(w - rw) */
    float *rw;      /* conv: (nbt, GV): the rw of ew (NAN: not made yet) */
    float *tf;      /* conv: (nbt, K2r, K2c, GV): ew times the band rows' f */
    float *wq;      /* local: (GN, K2r, K2c): exp(w - rw) of GN queries */
    float *rwq;     /* local: (GN): their rw */
    float *acc;     /* (GN, 2, GV): window sums of a tile */
    float *wrow;    /* the exact path: (K2r, W) */
    float *qe;      /* (nbt, rows_per, W, GV): 1 + exp(-q) of the task's rows */
    struct key_map *km;   /* (nbt): how each block's lanes find their keys */
    float *lane;    /* (4, GV) */
} grid_scratch;

static inline size_t zmin(size_t a, size_t b) { return a < b ? a : b; }

/* exp(a - b) for stabilisers b >= a: 0 when a holds nothing (-inf) */
static inline float scale_down(float a, float b)
{
    return a == -INFINITY ? 0.0f : aft_expf(a - b);
}

/* n lanes from src, the rest fill */
static inline void lanes_in(float *restrict dst, const float *restrict src, size_t n, float fill)
{
    if (n == GV) {
        memcpy(dst, src, GV * sizeof(float));
        return;
    }
    for (size_t l = 0; l < GV; l++) dst[l] = l < n ? src[l] : fill;
}

/* GCC's permute of a vector by a vector of indices (clang has none) */
#if defined(__GNUC__) && !defined(__clang__)
#define HAVE_SHUFFLE 1
#else
#define HAVE_SHUFFLE 0
#endif

/* How a block's lanes find their keys: kidx[l] the key channel of lane l;
 * with one per head, ascending, and when GV of them from kidx[0] on lie in
 * the row, a vector from kidx[0] permuted by perm (one load and one
 * permute, where a lane at a time was 4% of the run) */
typedef struct key_map {
    size_t kidx[GV];
    int32_t perm[GV];   /* not an aft_vi: malloc does not align to a vector */
    int mode;   /* 0: lane at a time; 1: contiguous (kc == C); 2: load and permute */
} key_map;

static void key_map_init(key_map *km, size_t c0, size_t n, size_t C, size_t kc, size_t ch)
{
    for (size_t l = 0; l < GV; l++) km->kidx[l] = kc == C ? c0 + l : (c0 + (l < n ? l : 0)) / ch;
    km->mode = n < GV ? 0 : kc == C ? 1 : km->kidx[0] + GV <= kc && HAVE_SHUFFLE ? 2 : 0;
    for (size_t l = 0; l < GV; l++) km->perm[l] = (int32_t)(km->kidx[l] - km->kidx[0]);
}

/* keys of n lanes of the row k, the rest -inf */
static inline void key_lanes(float *restrict dst, const float *restrict k, const key_map *km, size_t n)
{
    if (km->mode == 1) {
        memcpy(dst, k + km->kidx[0], GV * sizeof(float));
#if HAVE_SHUFFLE
    } else if (km->mode == 2) {
        aft_vi perm;
        memcpy(&perm, km->perm, sizeof perm);
        aft_vst(dst, __builtin_shuffle(aft_vld(k + km->kidx[0]), perm));
#endif
    } else {
        for (size_t l = 0; l < GV; l++) dst[l] = l < n ? k[km->kidx[l]] : -INFINITY;
    }
}

/* e = exp(x - z) for a vector of lanes; with ok (no x +inf or NaN, z >= x)
 * through aft_expf_nonpos, the same values */
static inline void exp_lanes(float *restrict e, const float *restrict x, const float *restrict z, int ok)
{
    if (ok)
        for (size_t l = 0; l < GV; l++) e[l] = aft_expf_nonpos(x[l] - z[l]);
    else
        for (size_t l = 0; l < GV; l++) e[l] = aft_expf(x[l] - z[l]);
}

/* y = 1 + exp(-q): sigmoid(q) = 1 / y (q = -inf: y = inf, and the output 0) */
static inline void one_plus_exp_neg(float *restrict y, const float *restrict q)
{
    for (size_t l = 0; l < GV; l++) y[l] = 1.0f + aft_expf(-q[l]);
}

/* ---- the plan: task shapes and scratch sizes, for the kernel and aft_workspace_bytes */

static void grid_plan(grid_job *jb, aft_variant variant, int causal, size_t B, size_t H, size_t W, size_t S,
                      size_t C, size_t nt)
{
    jb->H = H;
    jb->W = W;
    jb->S = S;
    jb->C = C;
    jb->causal = causal;
    jb->conv = variant == AFT_CONV;
    jb->Se = aft_spec_grid_window(S, H, W);
    jb->Pr = zmin(jb->Se - 1, H - 1);
    jb->Pc = zmin(jb->Se - 1, W - 1);
    jb->K2r = 2 * jb->Pr + 1;
    jb->K2c = 2 * jb->Pc + 1;
    jb->GN = jb->conv ? GN_CONV : GN_LOCAL;
    jb->Wp = W + 2 * jb->Pc + jb->GN;
    jb->nblk = (C + GV - 1) / GV;
    /* conv: tasks of CONV_CH channels, fewer when that leaves threads idle
     * (before the rows are split, which costs more) */
    const size_t want = 2 * nt;
    jb->nbt = jb->conv ? zmin(jb->nblk, (CONV_CH + GV - 1) / GV) : jb->nblk;
    while (jb->conv && jb->nbt > 1 && B * ((jb->nblk + jb->nbt - 1) / jb->nbt) < want) jb->nbt = (jb->nbt + 1) / 2;
    /* split the rows when batches x channel groups still leave threads
     * idle; each piece sums every row's keys again (its top and bottom
     * parts): O(H W) exponentials a channel more for its O(rows W s^2) */
    size_t base = B * ((jb->nblk + jb->nbt - 1) / jb->nbt);
    size_t nsplit = base >= want ? 1 : zmin(H, (want + base - 1) / base);
    jb->rows_per = (H + nsplit - 1) / nsplit;
    jb->nsplit = (H + jb->rows_per - 1) / jb->rows_per;
    jb->erows = zmin(H, jb->rows_per + 2 * jb->Pr);
}

/* the floats of one thread's scratch, in grid_scratch's order; every size
 * is a product of at most H W C / GV blocks' worth, checked by the caller */
enum { N_ARRAYS = 24 };
static void grid_scratch_sizes(const grid_job *jb, size_t sizes[N_ARRAYS])
{
    const size_t nb = jb->nbt, H = jb->H, W = jb->W, K = jb->K2r * jb->K2c;
    const size_t s[N_ARRAYS] = {
        nb * jb->erows * jb->Wp * 2 * GV,                 /* ek */
        nb * H * GV, nb * H * 2 * GV, nb * (H + 1) * 3 * GV, nb * 3 * GV,   /* rm rt bot top */
        nb * GV, nb * jb->K2r * GV,                       /* zt f */
        nb * W * 2 * GV, nb * W * 2 * GV,                 /* ps ss */
        nb * GV, nb * 2 * GV,                             /* fe tb */
        jb->conv ? nb * GV : 0, jb->conv ? nb * GV : 0,   /* fw fz */
        jb->conv ? nb * K * GV : 0,                       /* kw */
        jb->conv ? nb * K * GV : 0, jb->conv ? nb * GV : 0, jb->conv ? nb * K * GV : 0,   /* ew rw tf */
        jb->conv ? 0 : jb->GN * K, jb->conv ? 0 : jb->GN, /* wq rwq */
        jb->GN * 2 * GV, jb->K2r * W, nb * jb->rows_per * W * GV, 4 * GV,   /* acc wrow qe lane */
        0};
    memcpy(sizes, s, sizeof s);
}

static size_t grid_scratch_floats(const grid_job *jb)
{
    size_t sizes[N_ARRAYS], total = 0;
    grid_scratch_sizes(jb, sizes);
    for (size_t i = 0; i < N_ARRAYS; i++)
        if (!aft_add_ok(total, sizes[i], &total)) return SIZE_MAX;
    return total;
}

size_t aft_grid_workspace(aft_variant variant, int causal, size_t B, size_t H, size_t W, size_t S, size_t C,
                          size_t threads)
{
    if (H == 0 || W == 0 || C == 0 || S == 0) return 0;
    grid_job jb;
    grid_plan(&jb, variant, causal, B, H, W, S, C, threads);
    size_t n = grid_scratch_floats(&jb), bytes;
    if (n == SIZE_MAX || !aft_mul3_ok(n, sizeof(float), threads, &bytes)) return SIZE_MAX;
    return bytes;
}

/* one block of zeroed scratch (pads and unused lanes stay 0); NULL: out of memory */
static float *grid_scratch_alloc(grid_scratch *sc, const grid_job *jb)
{
    size_t sizes[N_ARRAYS];
    grid_scratch_sizes(jb, sizes);
    float **arrays[N_ARRAYS] = {&sc->ek, &sc->rm, &sc->rt, &sc->bot, &sc->top, &sc->zt, &sc->f, &sc->ps,
                                &sc->ss, &sc->fe, &sc->tb, &sc->fw, &sc->fz, &sc->kw, &sc->ew, &sc->rw, &sc->tf,
                                &sc->wq, &sc->rwq, &sc->acc, &sc->wrow, &sc->qe, &sc->lane, NULL};
    size_t total = grid_scratch_floats(jb);
    float *blk = total == SIZE_MAX ? NULL : aft_calloc_array(total, sizeof(float));
    sc->km = aft_alloc_array(jb->nbt, sizeof(key_map));
    if (!blk || !sc->km) {
        free(blk);
        free(sc->km);
        return NULL;
    }
    float *p = blk;
    for (size_t i = 0; arrays[i]; i++) {
        *arrays[i] = p;
        p += sizes[i];
    }
    return blk;
}

/* ---- the parts that are sums over whole rows */

/* The blocks [blk0, blk0 + nbt) of batch b: every grid row's largest key
 * and its sums, exp(k - m_row), exp(k - m_row) v of the rows [e0, e1) into
 * sc->ek, and 1 + exp(-q) of the rows [r0, r1) into sc->qe (read here,
 * where the rows stream through in order, a token's channels together,
 * rather than a query at a time between window sums). Lanes past C hold
 * keys of -inf (they add nothing). */
static void rows_pass(const grid_job *jb, grid_scratch *sc, size_t b, size_t blk0, size_t nbt, size_t e0,
                      size_t e1, size_t r0, size_t r1)
{
    const aft_opspec *sp = jb->sp;
    const size_t H = jb->H, W = jb->W, T = sp->T, C = jb->C, c0 = blk0 * GV, cn = zmin(C - c0, nbt * GV);
    float kk[GV], vv[GV], z[GV], e[GV];
    key_map *km = sc->km;
    for (size_t bi = 0; bi < nbt; bi++) key_map_init(&km[bi], c0 + bi * GV, zmin(GV, cn - bi * GV), C, jb->kc, jb->ch);
    for (size_t r = 0; r < H; r++) {
        const float *kr = jb->k + (b * T + r * W) * sp->ldk, *vr = jb->v + (b * T + r * W) * sp->ldv + c0;
        const float *qr = jb->q + (b * T + r * W) * sp->ldq + c0;
        const int want_q = r0 <= r && r < r1;
        int ok = 1;   /* no key +inf or NaN: then every k - m <= 0 */
        aft_vi bad = {0};
        for (size_t bi = 0; bi < nbt; bi++)
            for (size_t l = 0; l < GV; l++) sc->rm[(bi * H + r) * GV + l] = -INFINITY;
        for (size_t c = 0; c < W; c++) {
            /* ask for a later token's lines early: the tokens are rows of
             * C channels, of which a task reads a few cache lines */
            for (size_t i = 0; i < cn; i += 16) {
                __builtin_prefetch(kr + (c + PF_TOKENS) * sp->ldk + km[i / GV].kidx[0], 0, PF_LOC);
                __builtin_prefetch(vr + (c + PF_TOKENS) * sp->ldv + i, 0, PF_LOC);
                if (want_q) __builtin_prefetch(qr + (c + PF_TOKENS) * sp->ldq + i, 0, PF_LOC);
            }
            for (size_t bi = 0; bi < nbt; bi++) {
                float *m = sc->rm + (bi * H + r) * GV;
                key_lanes(kk, kr + c * sp->ldk, &km[bi], zmin(GV, cn - bi * GV));
                aft_vf x = aft_vld(kk), mx = aft_vld(m);
                aft_vi fin = x < INFINITY;   /* NaN and +inf are not a row's maximum */
                bad |= ~fin;
                aft_vi gt = (x > mx) & fin;
                aft_vst(m, (aft_vf)(((aft_vi)x & gt) | ((aft_vi)mx & ~gt)));
            }
        }
        for (size_t l = 0; l < GV; l++) ok &= bad[l] == 0;
        for (size_t bi = 0; bi < nbt; bi++) {
            const size_t n = zmin(GV, cn - bi * GV);
            const float *m = sc->rm + (bi * H + r) * GV;
            for (size_t l = 0; l < GV; l++) z[l] = isfinite(m[l]) ? m[l] : 0.0f;
            aft_vf s0 = {0}, s1 = {0};
            float *row = e0 <= r && r < e1 ? sc->ek + ((bi * jb->erows + (r - e0)) * jb->Wp + jb->Pc) * 2 * GV
                                           : NULL;
            for (size_t c = 0; c < W; c++) {
                key_lanes(kk, kr + c * sp->ldk, &km[bi], n);
                lanes_in(vv, vr + c * sp->ldv + bi * GV, n, 0.0f);
                exp_lanes(e, kk, z, ok);
                aft_vf ev = aft_vld(e), evv = ev * aft_vld(vv);
                s0 += ev;
                s1 += evv;
                if (row) {
                    aft_vst(row + c * 2 * GV, ev);
                    aft_vst(row + c * 2 * GV + GV, evv);
                }
            }
            float *rt = sc->rt + (bi * H + r) * 2 * GV;
            aft_vst(rt, s0);
            aft_vst(rt + GV, s1);
            if (!want_q) continue;
            float *qe = sc->qe + ((bi * jb->rows_per) + (r - r0)) * W * GV;
            for (size_t c = 0; c < W; c++) {
                lanes_in(kk, qr + c * sp->ldq + bi * GV, n, 0.0f);
                one_plus_exp_neg(qe + c * GV, kk);
            }
        }
    }
}

/* a (m, s0, s1) += the row sums (m_row, s0, s1): both brought to the larger
 * stabiliser, exactly as aft_sums_merge */
static void merge_row(float *restrict a, const float *restrict m, const float *restrict s)
{
    for (size_t l = 0; l < GV; l++) {
        float Z = a[l] > m[l] ? a[l] : m[l];
        float fa = scale_down(a[l], Z), fb = scale_down(m[l], Z);
        a[GV + l] = a[GV + l] * fa + s[l] * fb;
        a[2 * GV + l] = a[2 * GV + l] * fa + s[GV + l] * fb;
        a[l] = Z;
    }
}

static void sums_empty(float *a)
{
    for (size_t l = 0; l < GV; l++) {
        a[l] = -INFINITY;
        a[GV + l] = a[2 * GV + l] = 0.0f;
    }
}

/* bottom: the sums of the rows [r, H) for every r; top: of the rows
 * [0, r0 - Se] */
static void ends_pass(const grid_job *jb, grid_scratch *sc, size_t bi, size_t r0)
{
    const size_t H = jb->H;
    const float *rm = sc->rm + bi * H * GV, *rt = sc->rt + bi * H * 2 * GV;
    if (!jb->causal) {
        float *bot = sc->bot + bi * (H + 1) * 3 * GV;
        sums_empty(bot + H * 3 * GV);
        for (size_t r = H; r-- > 0;) {
            memcpy(bot + r * 3 * GV, bot + (r + 1) * 3 * GV, 3 * GV * sizeof(float));
            merge_row(bot + r * 3 * GV, rm + r * GV, rt + r * 2 * GV);
        }
    }
    float *top = sc->top + bi * 3 * GV;
    sums_empty(top);
    for (size_t r = 0; r + jb->Se <= r0; r++) merge_row(top, rm + r * GV, rt + r * 2 * GV);
}

/* ---- one output row */

/* conv: each lane's kernel entries (its head's) for the offsets |dr| <= Pr,
 * |dc| <= Pc, into kw (K2r, K2c, GV); lanes past n 0 */
static void conv_lanes(const grid_job *jb, float *kw, size_t cb, size_t n)
{
    const aft_opspec *sp = jb->sp;
    const size_t len = sp->conv_len, S = jb->S, Pr = jb->Pr, Pc = jb->Pc;
    for (size_t l = 0; l < GV; l++) {
        const float *sq = l < n ? sp->bias->conv + (sp->conv_rows == 1 ? 0 : (cb + l) / jb->ch) * len * len : NULL;
        for (size_t i = 0; i < jb->K2r; i++)
            for (size_t j = 0; j < jb->K2c; j++)   /* offset (i - Pr, j - Pc) */
                kw[(i * jb->K2c + j) * GV + l] = sq ? sq[(S - 1 - Pr + i) * len + (S - 1 - Pc + j)] : 0.0f;
    }
}

/* The band rows [blo, bhi] of block bi: their common stabiliser Zt (sc->zt),
 * the largest of their row maxima, and each row's factor exp(m_row - Zt)
 * (sc->f) */
static void band_stabiliser(const grid_job *jb, grid_scratch *sc, size_t bi, size_t blo, size_t bhi)
{
    const float *rm = sc->rm + bi * jb->H * GV;
    float *zt = sc->zt + bi * GV, *f = sc->f + bi * jb->K2r * GV;
    for (size_t l = 0; l < GV; l++) zt[l] = -INFINITY;
    for (size_t rr = blo; rr <= bhi; rr++)
        for (size_t l = 0; l < GV; l++) zt[l] = rm[rr * GV + l] > zt[l] ? rm[rr * GV + l] : zt[l];
    for (size_t rr = blo; rr <= bhi; rr++)
        for (size_t l = 0; l < GV; l++) f[(rr - blo) * GV + l] = scale_down(rm[rr * GV + l], zt[l]);
}

/* The left and right parts of block bi's output row r: the band's column
 * sums over the rows [blo, vend) (causal: the rows above r into ss, then
 * row r added on the way into ps), prefix sums into ps, suffix sums into
 * ss; rows of ek held from e0 */
static void column_sums(const grid_job *jb, grid_scratch *sc, size_t bi, size_t r, size_t e0, size_t blo,
                        size_t vend)
{
    const size_t W = jb->W, Wp = jb->Wp;
    const int causal = jb->causal;
    const float *f = sc->f + bi * jb->K2r * GV;
    float *ps = sc->ps + bi * W * 2 * GV, *ss = sc->ss + bi * W * 2 * GV;
    const float *ek = sc->ek + ((bi * jb->erows) * Wp + jb->Pc) * 2 * GV;
    const size_t rs = Wp * 2 * GV;
    const float *e0r = ek + (blo - e0) * rs, *er = ek + (r - e0) * rs;
    const aft_vf fr = aft_vld(f + (r - blo) * GV);
    /* VC columns at once: one column's sum down the rows is a chain of
     * dependent additions from L2, VC of them side by side are not */
    enum { VC = 4 };
    for (size_t c0 = 0; c0 < W; c0 += VC) {
        const size_t nc = zmin(VC, W - c0);
        aft_vf u[VC][2];
        #pragma GCC unroll 8
        for (size_t i = 0; i < VC; i++) u[i][0] = u[i][1] = (aft_vf){0};
        for (size_t rr = blo; rr < vend; rr++) {
            aft_vf g = aft_vld(f + (rr - blo) * GV);
            const float *ec = e0r + (rr - blo) * rs + c0 * 2 * GV;
            #pragma GCC unroll 8
            for (size_t i = 0; i < VC; i++) {   /* past W: the row's zero pad */
                u[i][0] += g * aft_vld(ec + i * 2 * GV);
                u[i][1] += g * aft_vld(ec + i * 2 * GV + GV);
            }
        }
        for (size_t i = 0; i < nc; i++) {
            aft_vst(ss + (c0 + i) * 2 * GV, u[i][0]);
            aft_vst(ss + (c0 + i) * 2 * GV + GV, u[i][1]);
        }
    }
    aft_vf p0 = {0}, p1 = {0};
    for (size_t c = 0; c < W; c++) {
        aft_vf u0 = aft_vld(ss + c * 2 * GV), u1 = aft_vld(ss + c * 2 * GV + GV);
        /* causal: row r's keys join the left part (they are left of c) */
        if (causal) {
            u0 += fr * aft_vld(er + c * 2 * GV);
            u1 += fr * aft_vld(er + c * 2 * GV + GV);
        }
        p0 += u0;
        p1 += u1;
        aft_vst(ps + c * 2 * GV, p0);
        aft_vst(ps + c * 2 * GV + GV, p1);
    }
    p0 = p1 = (aft_vf){0};
    for (size_t c = W; c-- > 0;) {
        p0 += aft_vld(ss + c * 2 * GV);
        p1 += aft_vld(ss + c * 2 * GV + GV);
        aft_vst(ss + c * 2 * GV, p0);
        aft_vst(ss + c * 2 * GV + GV, p1);
    }
}

/* The top and bottom parts of block bi's output row r, and the band's
 * factor, in units of exp(zc), zc the largest of the three stabilisers:
 * sc->tb and sc->fe */
static void ends_scale(const grid_job *jb, grid_scratch *sc, size_t bi, size_t r)
{
    const size_t H = jb->H, Se = jb->Se;
    const float *zt = sc->zt + bi * GV, *top = sc->top + bi * 3 * GV;
    const float *bot = !jb->causal && r + Se < H ? sc->bot + (bi * (H + 1) + r + Se) * 3 * GV : NULL;
    float *fe = sc->fe + bi * GV, *tb = sc->tb + bi * 2 * GV;
    for (size_t l = 0; l < GV; l++) {
        float bm = bot ? bot[l] : -INFINITY;
        float zc = zt[l] > top[l] ? zt[l] : top[l];
        zc = bm > zc ? bm : zc;
        fe[l] = scale_down(zt[l], zc);
        float ft = scale_down(top[l], zc), fb = scale_down(bm, zc);
        tb[l] = top[GV + l] * ft + (bot ? bot[GV + l] * fb : 0.0f);
        tb[GV + l] = top[2 * GV + l] * ft + (bot ? bot[2 * GV + l] * fb : 0.0f);
    }
}

/* conv, block bi's output row r (band rows [blo, bhi]): rw, the largest
 * weight this row's window uses (border rows use fewer of the kernel's
 * rows), its weights exp(w - rw) made again when rw changed, and those
 * times the band rows' f; fw, fz the factors of the band and of the
 * parts outside it */
static void conv_weights(const grid_job *jb, grid_scratch *sc, size_t bi, size_t r, size_t blo, size_t bhi)
{
    const size_t K2c = jb->K2c, K2r = jb->K2r, K = K2r * K2c, Pc = jb->Pc;
    const int causal = jb->causal;
    const long dlo = (long)blo - (long)r, dhi = (long)bhi - (long)r;
    const float *kw = sc->kw + bi * K * GV, *f = sc->f + bi * K2r * GV, *fe = sc->fe + bi * GV;
    float rwn[GV];
    {
        aft_vf mx = aft_vld(kw + (size_t)(dlo + (long)jb->Pr) * K2c * GV);
        for (long dr = dlo; dr <= dhi; dr++) {
            const float *kr = kw + (size_t)(dr + (long)jb->Pr) * K2c * GV;
            size_t nc = causal && dr == 0 ? Pc + 1 : K2c;   /* causal: row r's window ends at c */
            for (size_t j = 0; j < nc; j++) {
                aft_vf x = aft_vld(kr + j * GV);
                aft_vi gt = x > mx;   /* a NaN entry is skipped */
                mx = (aft_vf)(((aft_vi)x & gt) | ((aft_vi)mx & ~gt));
            }
        }
        aft_vst(rwn, mx);
    }
    for (size_t l = 0; l < GV; l++) rwn[l] = isfinite(rwn[l]) ? rwn[l] : 0.0f;
    float *rw = sc->rw + bi * GV, *ew = sc->ew + bi * K * GV;
    if (memcmp(rw, rwn, sizeof rwn) != 0) {
        memcpy(rw, rwn, sizeof rwn);
        for (size_t j = 0; j < K; j++)   /* a lane at a time: it vectorises */
            for (size_t l = 0; l < GV; l++) ew[j * GV + l] = aft_expf(kw[j * GV + l] - rw[l]);
    }
    float *tf = sc->tf + bi * K2r * K2c * GV;
    for (long dr = dlo; dr <= dhi; dr++) {
        const aft_vf fr = aft_vld(f + (size_t)((long)r + dr - (long)blo) * GV);
        const float *e = ew + (size_t)(dr + (long)jb->Pr) * K2c * GV;
        float *t = tf + (size_t)(dr - dlo) * K2c * GV;
        for (size_t j = 0; j < K2c; j++) aft_vst(t + j * GV, aft_vld(e + j * GV) * fr);
    }
    float *fw = sc->fw + bi * GV, *fz = sc->fz + bi * GV;
    for (size_t l = 0; l < GV; l++) {
        float zr = rw[l] > 0.0f ? rw[l] : 0.0f;
        fw[l] = fe[l] * aft_expf(rw[l] - zr);
        fz[l] = aft_expf(-zr);
    }
}

/* Block bi of output row r: the band's stabiliser and factors, the left and
 * right parts (prefix and suffix sums over columns), the top and bottom
 * parts in units of exp(zc), and conv's weights for the row. */
static void row_prep(const grid_job *jb, grid_scratch *sc, size_t bi, size_t cb, size_t n, size_t r, size_t e0)
{
    const int causal = jb->causal;
    const size_t blo = r >= jb->Pr ? r - jb->Pr : 0, bhi = causal ? r : zmin(jb->H - 1, r + jb->Pr);
    band_stabiliser(jb, sc, bi, blo, bhi);
    column_sums(jb, sc, bi, r, e0, blo, causal ? r : bhi + 1);
    ends_scale(jb, sc, bi, r);
    if (jb->conv) conv_weights(jb, sc, bi, r, blo, bhi);
}

/* ---- the window's sums: the inner loop */

// conv: the window sums of GN_CONV output columns c0 .. c0 + GN - 1 of one
// row, for one block: acc[i] = (sum w e, sum w ev) over the nr band rows
// (er: the first's padded column c0, rows rs floats apart) and the K2c
// columns of each (the last row: last_n of them), weights tf (nr, K2c, GV).
static inline void window_conv(float *restrict acc, const float *restrict er, size_t rs,
                               const float *restrict tf, size_t nr, size_t K2c, size_t last_n)
{
    aft_vf a[GN_CONV], d[GN_CONV];
    #pragma GCC unroll 16
    for (int i = 0; i < GN_CONV; i++) a[i] = d[i] = (aft_vf){0};
    for (size_t ri = 0; ri < nr; ri++) {
        const float *e = er + ri * rs, *wr = tf + ri * K2c * GV;
        size_t nc = ri + 1 == nr ? last_n : K2c;
        for (size_t j = 0; j < nc; j++) {
            aft_vf w = aft_vld(wr + j * GV);
            AFT_IN_REG(w);
            #pragma GCC unroll 16
            for (int i = 0; i < GN_CONV; i++) {
                aft_vf x0 = aft_vld(e + ((size_t)i + j) * 2 * GV), x1 = aft_vld(e + ((size_t)i + j) * 2 * GV + GV);
                a[i] += w * x0;
                d[i] += w * x1;
            }
        }
    }
    #pragma GCC unroll 16
    for (int i = 0; i < GN_CONV; i++) {
        aft_vst(acc + (size_t)i * 2 * GV, a[i]);
        aft_vst(acc + (size_t)i * 2 * GV + GV, d[i]);
    }
}

// local: the same with weights per query, wq (GN_LOCAL, K2r, K2c) from
// band row wr0 on; each band row's partial sums are scaled by its f (nr, GV)
static inline void window_local(float *restrict acc, const float *restrict er, size_t rs,
                                const float *restrict wq, size_t wr0, size_t K2r, size_t K2c,
                                const float *restrict f, size_t nr, size_t last_n)
{
    aft_vf a[GN_LOCAL], d[GN_LOCAL];
    #pragma GCC unroll 16
    for (int i = 0; i < GN_LOCAL; i++) a[i] = d[i] = (aft_vf){0};
    const size_t K = K2r * K2c;
    for (size_t ri = 0; ri < nr; ri++) {
        const float *e = er + ri * rs, *wr = wq + (wr0 + ri) * K2c;
        size_t nc = ri + 1 == nr ? last_n : K2c;
        aft_vf pa[GN_LOCAL], pd[GN_LOCAL];
        #pragma GCC unroll 16
        for (int i = 0; i < GN_LOCAL; i++) pa[i] = pd[i] = (aft_vf){0};
        for (size_t j = 0; j < nc; j++) {
            #pragma GCC unroll 16
            for (int i = 0; i < GN_LOCAL; i++) {
                float w = wr[(size_t)i * K + j];
                aft_vf x0 = aft_vld(e + ((size_t)i + j) * 2 * GV), x1 = aft_vld(e + ((size_t)i + j) * 2 * GV + GV);
                pa[i] += w * x0;
                pd[i] += w * x1;
            }
        }
        aft_vf fr = aft_vld(f + ri * GV);
        #pragma GCC unroll 16
        for (int i = 0; i < GN_LOCAL; i++) {
            a[i] += fr * pa[i];
            d[i] += fr * pd[i];
        }
    }
    #pragma GCC unroll 16
    for (int i = 0; i < GN_LOCAL; i++) {
        aft_vst(acc + (size_t)i * 2 * GV, a[i]);
        aft_vst(acc + (size_t)i * 2 * GV + GV, d[i]);
    }
}

/* local: exp(w[t, t'] - rw) of the queries c0 .. c0 + GN - 1 of row r over
 * their windows (0 where a key is off the grid, or later under causality),
 * rw each query's largest w */
static void local_weights(const grid_job *jb, grid_scratch *sc, size_t r, size_t c0)
{
    const aft_opspec *sp = jb->sp;
    const size_t W = jb->W, K2r = jb->K2r, K2c = jb->K2c, K = K2r * K2c, Pr = jb->Pr, Pc = jb->Pc;
    memset(sc->wq, 0, jb->GN * K * sizeof(float));
    for (size_t i = 0; i < jb->GN; i++) {
        size_t c = c0 + i;
        sc->rwq[i] = 0.0f;
        if (c >= W) continue;
        const size_t t = r * W + c, blo = r >= Pr ? r - Pr : 0, bhi = jb->causal ? r : zmin(jb->H - 1, r + Pr);
        float *wi = sc->wq + i * K, mx = -INFINITY;
        for (size_t rr = blo; rr <= bhi; rr++) {
            size_t lo = c >= Pc ? c - Pc : 0, hi = jb->causal && rr == r ? c + 1 : zmin(W, c + Pc + 1);
            float *dst = wi + (rr + Pr - r) * K2c + (lo + Pc - c);
            aft_w_row(sp, 0, t, rr * W + lo, rr * W + hi, dst);
            mx = fmaxf(mx, aft_max_f32(dst, hi - lo));
        }
        float rw = isfinite(mx) ? mx : 0.0f;
        sc->rwq[i] = rw;
        for (size_t rr = blo; rr <= bhi; rr++) {
            size_t lo = c >= Pc ? c - Pc : 0, hi = jb->causal && rr == r ? c + 1 : zmin(W, c + Pc + 1);
            float *dst = wi + (rr + Pr - r) * K2c + (lo + Pc - c);
            for (size_t j = 0; j < hi - lo; j++) dst[j] = aft_expf(dst[j] - rw);
        }
    }
}

/* ---- the exact path */

/* Output (b, t = r W + c, channel ch) exactly in double, from the band rows'
 * keys and the top and bottom sums (m, s0, s1) of its lane (bottom NULL:
 * none). */
static float grid_exact(const grid_job *jb, grid_scratch *sc, size_t b, size_t r, size_t c, size_t ch,
                        const float *top, const float *bot, size_t l)
{
    const aft_opspec *sp = jb->sp;
    const size_t W = jb->W, T = sp->T, t = r * W + c, h = jb->conv ? ch / jb->ch : 0;
    const size_t blo = r >= jb->Pr ? r - jb->Pr : 0, bhi = jb->causal ? r : zmin(jb->H - 1, r + jb->Pr);
    const float *k = jb->k + b * T * sp->ldk + (jb->kc == jb->C ? ch : ch / jb->ch), *v = jb->v + b * T * sp->ldv + ch;
    double M = -INFINITY;
    for (size_t rr = blo; rr <= bhi; rr++) {
        float *w = sc->wrow + (rr - blo) * W;
        aft_w_row(sp, h, t, rr * W, rr * W + W, w);
        size_t cend = jb->causal && rr == r ? c + 1 : W;
        for (size_t cc = 0; cc < cend; cc++) {
            double z = (double)k[(rr * W + cc) * sp->ldk] + (double)w[cc];
            M = z > M ? z : M;
        }
    }
    double tm = top[GV + l] > 0.0f ? (double)top[l] : -INFINITY;
    double bm = bot && bot[GV + l] > 0.0f ? (double)bot[l] : -INFINITY;
    M = tm > M ? tm : M;
    M = bm > M ? bm : M;
    double num = 0.0, den = 0.0;
    if (M > -INFINITY) {
        for (size_t rr = blo; rr <= bhi; rr++) {
            const float *w = sc->wrow + (rr - blo) * W;
            size_t cend = jb->causal && rr == r ? c + 1 : W;
            for (size_t cc = 0; cc < cend; cc++) {
                size_t j = rr * W + cc;
                double e = exp((double)k[j * sp->ldk] + (double)w[cc] - M);
                den += e;
                num += e * (double)v[j * sp->ldv];
            }
        }
        if (tm > -INFINITY) {
            double f = exp(tm - M);
            den += (double)top[GV + l] * f;
            num += (double)top[2 * GV + l] * f;
        }
        if (bm > -INFINITY) {
            double f = exp(bm - M);
            den += (double)bot[GV + l] * f;
            num += (double)bot[2 * GV + l] * f;
        }
    }
    double sq = 1.0 / (1.0 + exp(-(double)jb->q[(b * T + t) * sp->ldq + ch]));
    return den > 0.0 ? (float)(sq * num / den) : 0.0f;
}

/* ---- a tile's outputs */

/* The outputs of columns c0 .. c0 + GN - 1 (those < W) of row r, block bi,
 * from the window sums in sc->acc and the row's parts: y = sigmoid(q) num /
 * den, one division; entries whose den underflowed go the exact path. */
static void tile_out(const grid_job *jb, grid_scratch *sc, size_t b, size_t bi, size_t cb, size_t n, size_t r,
                     size_t r0, size_t c0)
{
    const aft_opspec *sp = jb->sp;
    const size_t W = jb->W, H = jb->H, Se = jb->Se, T = sp->T;
    const float *ps = sc->ps + bi * W * 2 * GV, *ss = sc->ss + bi * W * 2 * GV;
    const float *fe = sc->fe + bi * GV, *tb = sc->tb + bi * 2 * GV;
    float *y = sc->lane + GV, *fw = sc->lane + 2 * GV, *fz = sc->lane + 3 * GV;
    const float *qe = sc->qe + ((bi * jb->rows_per) + (r - r0)) * W * GV;
    static const float zeros[2 * GV];
    if (jb->conv) {
        memcpy(fw, sc->fw + bi * GV, GV * sizeof(float));
        memcpy(fz, sc->fz + bi * GV, GV * sizeof(float));
    }
    for (size_t i = 0; i < jb->GN && c0 + i < W; i++) {
        const size_t c = c0 + i, t = r * W + c;
        const float *L = c >= Se ? ps + (c - Se) * 2 * GV : zeros;
        const float *R = c + Se < W ? ss + (c + Se) * 2 * GV : zeros;
        const float *a = sc->acc + i * 2 * GV;
        if (!jb->conv) {   /* local: rw is the query's */
            float rw = sc->rwq[i], zr = rw > 0.0f ? rw : 0.0f, frw = aft_expf(rw - zr), z = aft_expf(-zr);
            for (size_t l = 0; l < GV; l++) {
                fw[l] = fe[l] * frw;
                fz[l] = z;
            }
        }
        /* the window in units of exp(zc + zr): times fe fw'; the other parts
         * (left, right: fe; top and bottom: tb) times exp(-zr) */
        const aft_vf vfe = aft_vld(fe), vfw = aft_vld(fw), vfz = aft_vld(fz);
        aft_vf den = aft_vld(a) * vfw + ((aft_vld(L) + aft_vld(R)) * vfe + aft_vld(tb)) * vfz;
        aft_vf num = aft_vld(a + GV) * vfw + ((aft_vld(L + GV) + aft_vld(R + GV)) * vfe + aft_vld(tb + GV)) * vfz;
        aft_vst(y, num / (den * aft_vld(qe + c * GV)));
        aft_vi ok = den >= AFT_DEN_EXACT_BELOW;   /* false for NaN too */
        int any = 0;
        for (size_t l = 0; l < n; l++) any |= ok[l] == 0;
        if (any) {
            const float *top = sc->top + bi * 3 * GV;
            const float *bot = !jb->causal && r + Se < H ? sc->bot + (bi * (H + 1) + r + Se) * 3 * GV : NULL;
            for (size_t l = 0; l < n; l++)
                if (!ok[l]) y[l] = grid_exact(jb, sc, b, r, c, cb + l, top, bot, l);
        }
        float *o = jb->out + (b * T + t) * jb->C + cb;
        if (n == GV) aft_vst(o, aft_vld(y));   /* a fixed size: no call to memcpy */
        else memcpy(o, y, n * sizeof(float));
    }
}

/* ---- a task */

/* Output row r of block bi (channels [cb, cb + n)): its tiles of GN
 * columns (local's weights made by the caller) */
static void row_tiles(const grid_job *jb, grid_scratch *sc, size_t b, size_t bi, size_t cb, size_t n, size_t r,
                      size_t r0, size_t e0, size_t c0, size_t c1)
{
    const size_t H = jb->H, Pr = jb->Pr;
    const size_t blo = r >= Pr ? r - Pr : 0, bhi = jb->causal ? r : zmin(H - 1, r + Pr);
    const size_t nr = bhi - blo + 1, last_n = jb->causal ? jb->Pc + 1 : jb->K2c, rs = jb->Wp * 2 * GV;
    for (size_t c = c0; c < c1; c += jb->GN) {
        /* band row blo at padded column c: column c - Pc of the grid */
        const float *er = sc->ek + ((bi * jb->erows + (blo - e0)) * jb->Wp + c) * 2 * GV;
        if (jb->conv)
            window_conv(sc->acc, er, rs, sc->tf + bi * jb->K2r * jb->K2c * GV, nr, jb->K2c, last_n);
        else
            window_local(sc->acc, er, rs, sc->wq, blo + Pr - r, jb->K2r, jb->K2c, sc->f + bi * jb->K2r * GV, nr,
                         last_n);
        tile_out(jb, sc, b, bi, cb, n, r, r0, c);
    }
}

/* Batch b, the blocks [blk0, blk0 + nbt), output rows [r0, r1). conv takes
 * its blocks one after another, each down the rows, so a block's band of
 * rows stays in the caches while it moves down; local takes the rows one
 * after another, each tile of GN queries through every block, so their
 * weights are made once. */
static void grid_task(const grid_job *jb, grid_scratch *sc, size_t b, size_t blk0, size_t r0, size_t r1)
{
    const size_t H = jb->H, W = jb->W, Se = jb->Se, Pr = jb->Pr;
    const size_t e0 = r0 >= Pr ? r0 - Pr : 0, e1 = jb->causal ? r1 : zmin(H, r1 + Pr);
    const size_t nbt = zmin(jb->nbt, jb->nblk - blk0);
    rows_pass(jb, sc, b, blk0, nbt, e0, e1, r0, r1);
    for (size_t bi = 0; bi < nbt; bi++) {
        size_t cb = (blk0 + bi) * GV, n = zmin(GV, jb->C - cb);
        ends_pass(jb, sc, bi, r0);
        if (jb->conv) {
            conv_lanes(jb, sc->kw + bi * jb->K2r * jb->K2c * GV, cb, n);
            for (size_t l = 0; l < GV; l++) sc->rw[bi * GV + l] = NAN;   /* the weights are not made yet */
        }
    }
    /* the top part holds the rows [0, r - Se] at row r */
    for (size_t bo = 0; bo < (jb->conv ? nbt : 1); bo++)
        for (size_t r = r0; r < r1; r++) {
            const size_t bi0 = jb->conv ? bo : 0, bi1 = jb->conv ? bo + 1 : nbt;
            for (size_t bi = bi0; bi < bi1; bi++) {
                size_t cb = (blk0 + bi) * GV;
                if (r > r0 && r >= Se)
                    merge_row(sc->top + bi * 3 * GV, sc->rm + (bi * H + r - Se) * GV,
                              sc->rt + (bi * H + r - Se) * 2 * GV);
                row_prep(jb, sc, bi, cb, zmin(GV, jb->C - cb), r, e0);
            }
            if (jb->conv) {
                size_t cb = (blk0 + bo) * GV;
                row_tiles(jb, sc, b, bo, cb, zmin(GV, jb->C - cb), r, r0, e0, 0, W);
                continue;
            }
            for (size_t c = 0; c < W; c += jb->GN) {
                local_weights(jb, sc, r, c);
                for (size_t bi = 0; bi < nbt; bi++) {
                    size_t cb = (blk0 + bi) * GV;
                    row_tiles(jb, sc, b, bi, cb, zmin(GV, jb->C - cb), r, r0, e0, c, zmin(W, c + jb->GN));
                }
            }
        }
}

// out: (B, T, C)   q, v: (B, T, C)   k: (B, T, kc), kc = C or heads; with
// sp's row strides; T = grid_h * grid_w in raster order
aft_status aft_op_grid(float *out, const float *q, const float *k, const float *v, size_t B, size_t kc,
                       const aft_opspec *sp, aft_error *err)
{
    const size_t H = sp->grid_h, W = sp->grid_w, C = sp->C, nt = (size_t)sp->threads;
    if (B == 0 || H == 0 || W == 0 || C == 0) return AFT_OK;
    grid_job jb;
    grid_plan(&jb, sp->variant, sp->causal, B, H, W, sp->window, C, nt);
    jb.sp = sp;
    jb.q = q;
    jb.k = k;
    jb.v = v;
    jb.out = out;
    jb.ch = C / sp->heads;
    jb.kc = kc;
    const size_t ngroup = (jb.nblk + jb.nbt - 1) / jb.nbt, ntask = B * ngroup * jb.nsplit;
    int failed = 0;
    #pragma omp parallel num_threads((int)nt)
    {
        grid_scratch sc;
        float *blk = grid_scratch_alloc(&sc, &jb);
        if (!blk) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (size_t task = 0; task < ntask; task++) {
                size_t b = task / (ngroup * jb.nsplit), rest = task % (ngroup * jb.nsplit);
                size_t g = rest / jb.nsplit, piece = rest % jb.nsplit;
                size_t r0 = piece * jb.rows_per, r1 = zmin(H, r0 + jb.rows_per);
                grid_task(&jb, &sc, b, g * jb.nbt, r0, r1);
            }
        }
        free(blk);
        free(sc.km);
    }
    if (failed)
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the grid kernel's scratch (%zu x %zu grid)", H, W);
    return AFT_OK;
}
