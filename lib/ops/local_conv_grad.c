/* local_conv_grad.c - the backward pass of AFT-local, AFT-conv and causal
 * AFT-simple, beside local_conv.c: O(T s C) time, O(T C) memory, no T x T
 * array.
 *
 * Row t, channel c sees key j with weight exp(k[j,c] + w[t,j]); with L[t,c]
 * the log of the denominator, P = exp(k + w - L), Y' = sum_j P v[j] and
 * a = dout sigmoid(q) (dL/dY'):
 *   dw[t,j] = sum_c P a (v[j,c] - Y'[t,c])          (the band only: w = 0 outside)
 *   dv[j,c] = sum_t P a,   dk[j,c] = sum_t P a (v[j,c] - Y'[t,c])
 * The visible pairs split as in the forward (local_conv.c): the band |t - j| <
 * s, and outside it w = 0: there dv[j] = exp(k[j]) sum_t exp(-L[t]) a[t],
 * a running sum over the rows t >= j + s (and t <= j - s without
 * causality), the forward's keys becoming the rows' -L and its values a and
 * a Y'. So the backward is the forward run anti-causally.
 *
 * One pass over blocks of rows computes, per block, what the forward does
 * (band sums of exp(w - r) exp(k - mk), left and right running sums of the
 * keys, every running sum at the exact maximum of what it holds, so its
 * largest term is 1) and keeps, per entry, L as a stabiliser Z and den (L =
 * Z + log den: a float L of 700 is 3e-5 off, and so would be every P; no
 * logarithm is taken), a / den and a Y' / den. In the same pass, while the
 * block's factors are in the cache, the band's part of the gradients:
 *   G[t,c] = a exp(mk + r - L) = a exp(mk + r - Z) / den
 *   dw[t,j] = exp(w - r) sum_c exp(k - mk) (v G - Y' G)
 *   dv[j,c] += exp(k - mk) sum_t exp(w - r) G,  dk likewise with v G - Y' G.
 * Every factor but G is <= 1, and G <= a e^46 where den >=
 * AFT_DEN_EXACT_BELOW; a smaller den (the band's key maximum and bias
 * maximum more than 46 nats apart) makes the entry be done exactly in
 * double, as the forward does, so a term lost to underflow is below
 * e^-41 a. A second pass adds the running sums over the rows outside each
 * key's band (key -Z, values a / den, a Y' / den), once every row's are
 * known. With w = 0 everywhere (causal simple) there is no band at all: the
 * running sums take the diagonal too (s = 0).
 *
 * The rows are cut into slices, several a thread, which the threads take
 * as they come free (a machine's cores may run a third apart in speed: a
 * fixed half each left the faster one waiting). A slice starts its running
 * sums from the sums of the slices before (and after) it, and what its band
 * adds to keys of its neighbours' rows goes to a halo, added after a
 * barrier. Every sum over slices is taken in slice order, so the bits do
 * not depend on which thread took which slice.
 *
 * With causality the forward may run the block pass's forward alone and
 * keep each entry's 1 / den and Y' (io->sums, AFT_SUMS_WRITE: the layer's
 * saved forward); the backward then takes them (AFT_SUMS_READ) instead of
 * the band sums (a third of its products) and the left key sums, and
 * needs of the latter only their maxima, for Z. Kept and made again, the
 * values are the same bits. A run with an entry done exactly keeps
 * nothing (it clears the tag): that entry's backward needs the left sums
 * themselves. */
#include "kernels.h"

#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* rows a block, channels a step of the block pass */
enum { GB_ROWS = 64, GB_CH = 128 };
/* exp(mk + r - L) above e^GB_EXACT (an exact entry's): its gradient too is
 * done exactly */
#define GB_EXACT 46.0

/* exp(x) for a double x <= ~0 through the float exponential */
static inline float expd(double x)
{
    return aft_expf((float)x);
}

/* Tame inputs: every key, and every bias entry a block reads, at most
 * TAME_BOUND in size (so not NaN or infinite). Sums of a few such stay far
 * from overflow, so every stabiliser (Z, mk + r, the running maxima) is
 * finite or -inf, and each exponent below is <= 0 (but for rounding) or
 * -inf, never NaN or +inf: the domain of aft_expf_nonpos, 17 instructions
 * a vector where aft_expf takes 28. Other inputs (a NaN or an infinity)
 * take the full exponential, whose edges keep NaN and overflow as they
 * are. */
#define TAME_BOUND AFT_TAME_BOUND

static inline __attribute__((always_inline)) float gexp(float x, int tame)
{
    return tame ? aft_expf_nonpos(x) : aft_expf(x);
}

/* 1 if rows [r0, r1) of k (n channels, rows ld apart) are tame */
static int keys_tame(const float *k, size_t ld, size_t r0, size_t r1, size_t n)
{
    int ok = 1;
    for (size_t t = r0; t < r1; t++)
        for (size_t c = 0; c < n; c++) ok &= fabsf(k[t * ld + c]) <= TAME_BOUND;
    return ok;
}

/* 1 if every flag of n is set */
static int all_set(const unsigned char *f, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= f[i];
    return ok;
}

/* Adds key row k (values v) to a running sum (m, s0, s1) held at its exact
 * maximum m: one exponential, exp(-|k - m|), which scales either the sum
 * (a new maximum) or the new term. */
static inline __attribute__((always_inline)) void key_add(float *restrict m, float *restrict s0, float *restrict s1,
                                                          const float *restrict k, const float *restrict v, size_t n,
                                                          int tame)
{
    for (size_t c = 0; c < n; c++) {
        float d = k[c] - m[c];
        float e = gexp(-fabsf(d), tame);
        int up = d > 0.0f;
        s0[c] = up ? s0[c] * e + 1.0f : s0[c] + e;
        s1[c] = up ? s1[c] * e + v[c] : s1[c] + e * v[c];
        m[c] = up ? k[c] : m[c];
    }
}

/* The same for the backward's rows: key -L = -(Z + log den), kept as key
 * -Z with values u1 = a / den and u2 = u1 Y', so no logarithm is taken
 * (den >= 1e-20 on the fast path: u1 is finite) */
static inline __attribute__((always_inline)) void row_add(float *restrict m, float *restrict s1, float *restrict s2,
                                                          const float *restrict Z, const float *restrict u1,
                                                          const float *restrict u2, size_t n, int tame)
{
    for (size_t c = 0; c < n; c++) {
        float d = -Z[c] - m[c];
        float e = gexp(-fabsf(d), tame);
        int up = d > 0.0f;
        s1[c] = up ? s1[c] * e + u1[c] : s1[c] + e * u1[c];
        s2[c] = up ? s2[c] * e + u2[c] : s2[c] + e * u2[c];
        m[c] = up ? -Z[c] : m[c];
    }
}

/* a backward running sum: m, s1, s2 (n floats each) */
typedef struct {
    float *m, *s1, *s2;
} rsum;

static void rsum_empty(rsum *r, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        r->m[c] = -INFINITY;
        r->s1[c] = r->s2[c] = 0.0f;
    }
}

/* a += b, both brought to the larger maximum */
static void rsum_merge(rsum *a, const rsum *b, size_t n)
{
    for (size_t c = 0; c < n; c++) {
        float Z = a->m[c] > b->m[c] ? a->m[c] : b->m[c];
        float fa = a->m[c] == -INFINITY ? 0.0f : aft_expf(a->m[c] - Z);
        float fb = b->m[c] == -INFINITY ? 0.0f : aft_expf(b->m[c] - Z);
        a->s1[c] = a->s1[c] * fa + b->s1[c] * fb;
        a->s2[c] = a->s2[c] * fa + b->s2[c] * fb;
        a->m[c] = Z;
    }
}

/* what the threads share for one batch */
typedef struct {
    const aft_opspec *ws;
    const aft_grad_io *io;
    const float *q, *k, *v, *dout;   /* this batch's rows */
    size_t b;                         /* the batch */
    size_t T, C, H, ch, s;
    size_t ns;                        /* slices of the rows */
    int causal, want_dw;
    int set;                          /* this sequence sets the dense bias gradient (aft_bias_grad_sets) */
    /* per slice: its rows of k are tame (P1), every bias entry its blocks
     * read is (P2); and, in each thread's copy, every slice's keys are
     * tame (set after P1), and so is every bias entry (after P2) */
    unsigned char *ktame, *wtame;
    int keys_tame, tame;
    /* per slice, causal: how far it has come (causal_slice below) */
    atomic_int *stage;
    /* per entry: L = Z + log den, kept as the stabiliser Z (any float: the
     * factors against it are taken with exponents in double; a float L of
     * 700 would be 3e-5 off, and so every P), u1 = a / den (a = dout
     * sigmoid(q)) and u2 = u1 Y'; a row's [Z | U1 | U2] 3C floats (zrow
     * below). (T, 3C), or with zsplit each slice's first s rows (ns, s, 3C),
     * its others in the scratch of the thread that runs it. */
    float *Z;
    int zsplit;
    float *kp;        /* the forward's key pieces: (2 ns, 4C): slice i's left piece at 2i, right at 2i + 1 */
    float *rp;        /* the backward's row pieces: (2 ns, 3C) m, s1, s2, likewise */
    float *halo;      /* (ns, 2 hrows, 2C): dv | dk for rows of other slices */
    size_t hrows;     /* s - 1: halo rows each side */
    /* every row's band weights, when the call has several sequences (they
     * depend on the bias alone, and each sequence's blocks made them
     * again): per head and row, w and exp(w - r) (H, T, 2s) each, r and
     * whether every w is tame (H, T); NULL: each block makes its own */
    float *twr, *tew, *tr;
    unsigned char *tok;
    /* the forward's saved half (causal only, io->sums): AFT_SUMS_WRITE runs
     * the block pass's forward alone and keeps each entry's 1 / den and Y'
     * (this batch's rows of [1 / den | Y'], 2C floats a row, at sums);
     * AFT_SUMS_READ takes them instead of the band sums and the left key
     * sums. Only a run whose every block was tame and whose every entry
     * took the fast path keeps them (spoilt: the tag is cleared, and a
     * backward makes them again) */
    int mode;
    float *sums;
    atomic_int *spoilt;
} gjob;

/* slice i's first row */
static size_t row0(const gjob *jb, size_t i) { return jb->T * i / jb->ns; }

/* the halo rows a slice's band writes for its neighbours: with causality a
 * row's band reaches only the keys before it, so the left halo alone */
static size_t halo_used(const gjob *jb) { return (jb->causal ? 1 : 2) * jb->hrows; }

/* one thread's scratch for the block passes of its slices */
typedef struct {
    float *ek, *ekv;             /* (GB_ROWS + 2s, cw) */
    float *dd;                   /* (4 x (2s + 4)): four rows' dw sums, or two key rows' band weights */
    float *ce, *ce2;             /* dd's first two rows */
    float *h;                    /* (4 GB_CH): two key rows' sums over the block's rows */
    float *g1, *g2, *b0, *b1;    /* (GB_ROWS, GB_CH); g1 holds exp(zb - Z) / den first */
    float *ys, *as;              /* Y' and a of the exact entries, (GB_ROWS, GB_CH) each */
    double *lx;                  /* (GB_ROWS, GB_CH): L of the exact entries */
    float *lx_f;                 /* (lx's block, as floats) */
    float *rm, *r0, *r1;         /* the rows' right sums, (GB_ROWS, GB_CH) each */
    float *ew, *wr;              /* (GB_ROWS, 2s): exp(w - r) and w (the block's rows of gjob's
                                  * table, or ew_own, wr_own) */
    float *ew_own, *wr_own;
    float *dw;                   /* (GB_ROWS, 2s) */
    float *r, *r_own;            /* (GB_ROWS), likewise */
    float *mk;                   /* (cw) */
    float *pm, *p0, *p1;         /* the left running sums, (C) each */
    float *qm, *q0, *q1;         /* the right running sums, (C) each */
    float *snap;                 /* (blocks, 3C) */
    unsigned char *redo, *bad;   /* (GB_ROWS, GB_CH) each */
    unsigned char rowredo[GB_ROWS];   /* the row has an entry in redo */
    size_t zhi;                  /* rows of dv, dk (every channel) zeroed up to here */
    size_t te;                   /* the slice's rows end here (what may be asked for ahead) */
    float *zs;                   /* zsplit: Z, U1, U2 of the slice's rows from its s-th on (rows, 3C) */
    float *blk;
} gscratch;

static int gscratch_alloc(gscratch *sc, const gjob *jb, size_t rows)
{
    const size_t s = jb->s, C = jb->C, ch = jb->ch, cw = ch < GB_CH ? ch : GB_CH, R = GB_ROWS;
    const size_t nb = (rows + R - 1) / R, nw = R + 2 * s;
    const size_t G = R * GB_CH;   /* per-row arrays: rows GB_CH apart */
    /* lx (doubles) first: the block is aligned for them */
    const size_t sizes[] = {2 * G, nw * cw, nw * cw, 4 * (2 * s + 4), 4 * GB_CH, G, G, G, G, G, G, G, R * 2 * s, R * 2 * s,
                            R * 2 * s, R, cw, C, C, C, C, C, C, nb * 3 * C, G, G};
    float **arrays[] = {&sc->lx_f, &sc->ek, &sc->ekv, &sc->dd, &sc->h, &sc->g1, &sc->g2, &sc->b0, &sc->b1, &sc->rm, &sc->r0,
                        &sc->r1, &sc->ew, &sc->wr, &sc->dw, &sc->r, &sc->mk, &sc->pm, &sc->p0, &sc->p1, &sc->qm,
                        &sc->q0, &sc->q1, &sc->snap, &sc->ys, &sc->as};
    _Static_assert(sizeof arrays / sizeof arrays[0] == sizeof sizes / sizeof sizes[0], "one size per array");
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    sc->blk = aft_alloc_array(total, sizeof(float));
    sc->redo = malloc(2 * R * GB_CH);
    sc->zs = jb->zsplit ? aft_alloc_array(rows, 3 * C * sizeof(float)) : NULL;
    if (!sc->blk || !sc->redo || (jb->zsplit && !sc->zs)) {
        free(sc->blk);
        free(sc->redo);
        free(sc->zs);
        sc->blk = NULL;
        sc->redo = NULL;
        sc->zs = NULL;
        return 0;
    }
    sc->bad = sc->redo + R * GB_CH;
    float *p = sc->blk;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *arrays[i] = p;
        p += sizes[i];
    }
    sc->lx = (double *)sc->lx_f;
    sc->ew_own = sc->ew;
    sc->wr_own = sc->wr;
    sc->r_own = sc->r;
    sc->ce = sc->dd;
    sc->ce2 = sc->dd + 2 * s;
    return 1;
}

static void gscratch_free(gscratch *sc)
{
    free(sc->blk);
    free(sc->redo);
    free(sc->zs);
}

/* Row t's [Z | U1 | U2] (3C floats). With zsplit (causal: each slice's
 * rows are read after its block pass by its own outside pass and, the
 * first s of them, by the slice before's): the first s rows of a slice in
 * Z, the rest in the scratch of the thread running the slice, reused for
 * its next slice. The 12 MiB of a whole array (T = 4096, C = 256) were
 * written to memory and read back; a thread's rows stay in its caches. */
static inline float *zrow(const gjob *jb, const gscratch *sc, size_t t)
{
    const size_t C3 = 3 * jb->C;
    if (!jb->zsplit) return jb->Z + t * C3;
    size_t sl = ((t + 1) * jb->ns - 1) / jb->T, r = t - row0(jb, sl);
    return r < jb->s ? jb->Z + (sl * jb->s + r) * C3 : sc->zs + (r - jb->s) * C3;
}

/* where key row j's dv and dk (all C channels; dk = dv + (dk's offset))
 * go for slice sl: its own rows straight to the output, others to its
 * halo. Sets *dk. */
static float *grad_rows(const gjob *jb, size_t sl, size_t j, float **dk)
{
    size_t t0 = row0(jb, sl), t1 = row0(jb, sl + 1);
    if (j >= t0 && j < t1) {
        size_t r = jb->b * jb->T + j;
        *dk = jb->io->dk + r * jb->io->lddk;
        return jb->io->dv + r * jb->io->lddv;
    }
    /* left halo rows t0 - hrows .. t0 - 1 at 0 .. hrows - 1, right t1 .. at hrows .. */
    size_t i = j < t0 ? jb->hrows - (t0 - j) : jb->hrows + (j - t1);
    float *h = jb->halo + (sl * 2 * jb->hrows + i) * 2 * jb->C;
    *dk = h + jb->C;
    return h;
}

typedef float aft_v4 __attribute__((vector_size(16)));

#if AFT_VEC_BYTES == 64
/* hsum of sixteen vectors at once, into one vector: lane 4k + l the sum of
 * a[4l + k]. Each step adds the two halves of every part, as aft_hsum does
 * (512 bits to 256, to 128, then lanes 0 + 2 and 1 + 3, then those two),
 * so each lane holds aft_hsum's bits; packing two parts a vector, each step
 * takes half the shuffles and adds of the step before, where sixteen
 * hsums each took every step alone. */
static inline aft_vf hsum16(const aft_vf a[16])
{
    /* __builtin_shufflevector with constant lane numbers: GCC (12 on) and
     * Clang both take it, where GCC's __builtin_shuffle is GCC's alone */
#define H256A 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define H256B 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define H128A 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define H128B 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define H64A 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define H64B 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define H32A 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30
#define H32B 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31
#define HALVES(x, y, A, B) (__builtin_shufflevector(x, y, A) + __builtin_shufflevector(x, y, B))
    aft_vf t[8], w[4], y[2];
    for (int i = 0; i < 8; i++)   /* [a2i | a2i+1], 256 bits each */
        t[i] = HALVES(a[2 * i], a[2 * i + 1], H256A, H256B);
    for (int i = 0; i < 4; i++)   /* 128 bits of a4i .. a4i+3 */
        w[i] = HALVES(t[2 * i], t[2 * i + 1], H128A, H128B);
    for (int i = 0; i < 2; i++)   /* 128-bit part k: 2 lanes of a8i+k, 2 of a8i+4+k */
        y[i] = HALVES(w[2 * i], w[2 * i + 1], H64A, H64B);
    return HALVES(y[0], y[1], H32A, H32B);
#undef HALVES
#undef H256A
#undef H256B
#undef H128A
#undef H128B
#undef H64A
#undef H64B
#undef H32A
#undef H32B
}
#endif

// Row t's dw over its band, before the factor exp(w - r):
//   d[j] = sum_c (ekv[j][c] g1[c] - ek[j][c] g2[c]),  j < nw, rows ld apart;
// four band rows at once share the loads of g1, g2
static void dw_row(float *restrict d, const float *restrict ekv, const float *restrict ek, size_t ld,
                   const float *restrict g1, const float *restrict g2, size_t nw, size_t cw)
{
    size_t j = 0, cv = cw / AFT_VL * AFT_VL;
    for (; j + 4 <= nw; j += 4) {
        /* the two products in sums of their own: one sum for both made each
         * step two dependent multiply-adds, and the loop waited on them */
        aft_vf a1[4] = {{0}}, a2[4] = {{0}};
        for (size_t c = 0; c < cv; c += AFT_VL) {
            aft_vf x1 = aft_vld(g1 + c), x2 = aft_vld(g2 + c);
            for (int u = 0; u < 4; u++) {
                a1[u] += aft_vld(ekv + (j + u) * ld + c) * x1;
                a2[u] += aft_vld(ek + (j + u) * ld + c) * x2;
            }
        }
        for (int u = 0; u < 4; u++) {
            float r = aft_hsum(a1[u] - a2[u]);
            for (size_t c = cv; c < cw; c++) r += ekv[(j + u) * ld + c] * g1[c] - ek[(j + u) * ld + c] * g2[c];
            d[j + u] = r;
        }
    }
    for (; j < nw; j++) {
        aft_vf acc = {0};
        for (size_t c = 0; c < cv; c += AFT_VL)
            acc += aft_vld(ekv + j * ld + c) * aft_vld(g1 + c) - aft_vld(ek + j * ld + c) * aft_vld(g2 + c);
        float r = aft_hsum(acc);
        for (size_t c = cv; c < cw; c++) r += ekv[j * ld + c] * g1[c] - ek[j * ld + c] * g2[c];
        d[j] = r;
    }
}

// Four neighbouring rows' band sums before the factor exp(w - r), over n
// key rows (the union of their bands):
//   d[r][j] = sum_c (ekv[j][c] g1[r][c] - ek[j][c] g2[r][c]),
// rows of d ld_d apart. A tile of 4 rows x 4 key rows is held in
// registers over the channels, so each load serves four multiply-adds
// (one row at a time, each served one).
static void dw_tile4(float *restrict d, size_t ld_d, const float *restrict ekv, const float *restrict ek,
                     size_t ld, const float *const g1[4], const float *const g2[4], size_t n, size_t cw)
{
    const size_t cv = cw / AFT_VL * AFT_VL;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        /* an array of sums a row: the compiler keeps small arrays of
         * vectors in registers, not one of all sixteen */
        aft_vf s0[4] = {{0}}, s1[4] = {{0}}, s2[4] = {{0}}, s3[4] = {{0}};
        for (size_t c = 0; c < cv; c += AFT_VL) {
            aft_vf x1[4], x2[4];
            for (int r = 0; r < 4; r++) {
                x1[r] = aft_vld(g1[r] + c);
                x2[r] = aft_vld(g2[r] + c);
            }
            for (int u = 0; u < 4; u++) {
                aft_vf y1 = aft_vld(ekv + (j + u) * ld + c), y2 = aft_vld(ek + (j + u) * ld + c);
                /* two multiply-adds each (as one expression, a multiply,
                 * a multiply-add and an add) */
                s0[u] += y1 * x1[0];
                s0[u] -= y2 * x2[0];
                s1[u] += y1 * x1[1];
                s1[u] -= y2 * x2[1];
                s2[u] += y1 * x1[2];
                s2[u] -= y2 * x2[2];
                s3[u] += y1 * x1[3];
                s3[u] -= y2 * x2[3];
            }
        }
        const aft_vf *sr[4] = {s0, s1, s2, s3};
#if AFT_VEC_BYTES == 64
        /* row r's four sums in lanes 4r .. 4r + 3, stored from the
         * register when no channels are left over (a vector stored and
         * read back a lane at a time misses store forwarding) */
        aft_vf a[16];
        for (int r = 0; r < 4; r++)
            for (int u = 0; u < 4; u++) a[4 * u + r] = sr[r][u];
        const aft_vf hv = hsum16(a);
        if (cv == cw) {
            const aft_v4 q0 = __builtin_shufflevector(hv, hv, 0, 1, 2, 3),
                         q1 = __builtin_shufflevector(hv, hv, 4, 5, 6, 7),
                         q2 = __builtin_shufflevector(hv, hv, 8, 9, 10, 11),
                         q3 = __builtin_shufflevector(hv, hv, 12, 13, 14, 15);
            memcpy(d + j, &q0, sizeof q0);
            memcpy(d + ld_d + j, &q1, sizeof q1);
            memcpy(d + 2 * ld_d + j, &q2, sizeof q2);
            memcpy(d + 3 * ld_d + j, &q3, sizeof q3);
            continue;
        }
        float hs[16];
        aft_vst(hs, hv);
#endif
        for (int r = 0; r < 4; r++)
            for (int u = 0; u < 4; u++) {
#if AFT_VEC_BYTES == 64
                float x = hs[4 * r + u];
#else
                float x = aft_hsum(sr[r][u]);
#endif
                for (size_t c = cv; c < cw; c++)
                    x += ekv[(j + u) * ld + c] * g1[r][c] - ek[(j + u) * ld + c] * g2[r][c];
                d[r * ld_d + j + u] = x;
            }
    }
    /* the last key rows, one at a time for the four rows */
    for (; j < n; j++) {
        aft_vf sj[4] = {{0}};
        for (size_t c = 0; c < cv; c += AFT_VL) {
            aft_vf y1 = aft_vld(ekv + j * ld + c), y2 = aft_vld(ek + j * ld + c);
            for (int r = 0; r < 4; r++) {
                sj[r] += y1 * aft_vld(g1[r] + c);
                sj[r] -= y2 * aft_vld(g2[r] + c);
            }
        }
        for (int r = 0; r < 4; r++) {
            float x = aft_hsum(sj[r]);
            for (size_t c = cv; c < cw; c++) x += ekv[j * ld + c] * g1[r][c] - ek[j * ld + c] * g2[r][c];
            d[r * ld_d + j] = x;
        }
    }
}

/* Row t of the block, channels [c0, c0 + cw) of head h: the forward's L
 * and Y' exactly in double (its den underflowed): the band's terms one by
 * one and the running sums (exact: held at their maxima) */
static void exact_forward(const gjob *jb, const gscratch *sc, size_t i, size_t t, size_t lo, size_t hi, size_t c0,
                          size_t c, double *L, float *Y)
{
    const aft_opspec *ws = jb->ws;
    const float *wr = sc->wr + i * 2 * jb->s;
    size_t cc = c0 + c;
    double M = -INFINITY;
    for (size_t j = lo; j < hi; j++) {
        double z = (double)jb->k[j * ws->ldk + cc] + (double)wr[j - lo];
        M = z > M ? z : M;
    }
    float pm = sc->pm[cc], p0 = sc->p0[cc], p1 = sc->p1[cc];
    float rm = jb->causal ? -INFINITY : sc->rm[i * GB_CH + c], r0 = jb->causal ? 0.0f : sc->r0[i * GB_CH + c],
          r1 = jb->causal ? 0.0f : sc->r1[i * GB_CH + c];
    M = pm > M ? pm : M;
    M = rm > M ? rm : M;
    double den = 0.0, num = 0.0;
    if (M > -INFINITY) {
        for (size_t j = lo; j < hi; j++) {
            double e = exp((double)jb->k[j * ws->ldk + cc] + (double)wr[j - lo] - M);
            den += e;
            num += e * (double)jb->v[j * ws->ldv + cc];
        }
        if (pm > -INFINITY) {
            double f = exp((double)pm - M);
            den += p0 * f;
            num += p1 * f;
        }
        if (rm > -INFINITY) {
            double f = exp((double)rm - M);
            den += r0 * f;
            num += r1 * f;
        }
    }
    *L = M + log(den);
    *Y = den > 0.0 ? (float)(num / den) : 0.0f;
}

/* Vectors of channels a step in the band's sums: NV vectors of AFT_VL
 * floats, the sums of two right-hand sides, 2 NV registers, held over the
 * band's rows (the axpy form, which loaded and stored the sums at every band
 * row, spent its time on those). */
enum { NV = 4, VSTEP = NV * AFT_VL };

// b0[c] = sum_j e[j] x0[j][c], b1[c] = sum_j e[j] x1[j][c] for j < nw, rows
// of x0, x1 ld apart: a row's band sums
static void row_sums(float *restrict b0, float *restrict b1, const float *restrict e, const float *restrict x0,
                     const float *restrict x1, size_t nw, size_t ld, size_t cw)
{
    size_t c = 0;
    for (; c + VSTEP <= cw; c += VSTEP) {
        aft_vf a0[NV], a1[NV];
        for (int u = 0; u < NV; u++) a0[u] = a1[u] = (aft_vf){0};
        for (size_t j = 0; j < nw; j++) {
            const float ej = e[j], *p0 = x0 + j * ld + c, *p1 = x1 + j * ld + c;
            for (int u = 0; u < NV; u++) {
                a0[u] += ej * aft_vld(p0 + u * AFT_VL);
                a1[u] += ej * aft_vld(p1 + u * AFT_VL);
            }
        }
        for (int u = 0; u < NV; u++) {
            aft_vst(b0 + c + u * AFT_VL, a0[u]);
            aft_vst(b1 + c + u * AFT_VL, a1[u]);
        }
    }
    for (; c < cw; c++) {
        float a0 = 0.0f, a1 = 0.0f;
        for (size_t j = 0; j < nw; j++) {
            a0 += e[j] * x0[j * ld + c];
            a1 += e[j] * x1[j * ld + c];
        }
        b0[c] = a0;
        b1[c] = a1;
    }
}

/* row_sums for two neighbouring rows a and b, whose bands run over key rows
 * [0, na) and [nf, nf + nb) of x0, x1 (nf <= na <= nf + nb: a's band
 * starts no later and ends no later, and they meet): each key row is
 * loaded once for both, half the loads a multiply-add. Each row's sums run
 * over its keys in order, as row_sums's do: the same bits. */
static void row_sums2(float *restrict a0, float *restrict a1, float *restrict c0, float *restrict c1,
                      const float *restrict ea, const float *restrict eb, const float *restrict x0,
                      const float *restrict x1, size_t na, size_t nf, size_t nb, size_t ld, size_t cw)
{
    const size_t ne = nf + nb;
    size_t c = 0;
    for (; c + VSTEP <= cw; c += VSTEP) {
        aft_vf sa0[NV], sa1[NV], sb0[NV], sb1[NV];
        for (int u = 0; u < NV; u++) sa0[u] = sa1[u] = sb0[u] = sb1[u] = (aft_vf){0};
        size_t j = 0;
        for (; j < nf; j++)
            for (int u = 0; u < NV; u++) {
                sa0[u] += ea[j] * aft_vld(x0 + j * ld + c + u * AFT_VL);
                sa1[u] += ea[j] * aft_vld(x1 + j * ld + c + u * AFT_VL);
            }
        for (; j < na; j++) {
            const float e1 = ea[j], e2 = eb[j - nf];
            for (int u = 0; u < NV; u++) {
                aft_vf y0 = aft_vld(x0 + j * ld + c + u * AFT_VL), y1 = aft_vld(x1 + j * ld + c + u * AFT_VL);
                AFT_IN_REG(y0);
                AFT_IN_REG(y1);
                sa0[u] += e1 * y0;
                sa1[u] += e1 * y1;
                sb0[u] += e2 * y0;
                sb1[u] += e2 * y1;
            }
        }
        for (; j < ne; j++)
            for (int u = 0; u < NV; u++) {
                sb0[u] += eb[j - nf] * aft_vld(x0 + j * ld + c + u * AFT_VL);
                sb1[u] += eb[j - nf] * aft_vld(x1 + j * ld + c + u * AFT_VL);
            }
        for (int u = 0; u < NV; u++) {
            aft_vst(a0 + c + u * AFT_VL, sa0[u]);
            aft_vst(a1 + c + u * AFT_VL, sa1[u]);
            aft_vst(c0 + c + u * AFT_VL, sb0[u]);
            aft_vst(c1 + c + u * AFT_VL, sb1[u]);
        }
    }
    if (c < cw) {
        row_sums(a0 + c, a1 + c, ea, x0 + c, x1 + c, na, ld, cw - c);
        row_sums(c0 + c, c1 + c, eb, x0 + nf * ld + c, x1 + nf * ld + c, nb, ld, cw - c);
    }
}

// Key row j's band part, from h1 = sum_t exp(w - r) G[t] and h2 likewise
// with G Y' (row_sums over the block's rows whose band holds j):
//   dv += ek h1,   dk += ek (v h1 - h2)
static void col_apply(float *restrict dv, float *restrict dk, const float *restrict ek, const float *restrict v,
                      const float *restrict h1, const float *restrict h2, size_t cw)
{
    for (size_t c = 0; c < cw; c++) {
        float x = ek[c] * h1[c];
        dv[c] += x;
        dk[c] += x * v[c] - ek[c] * h2[c];
    }
}

/* Per entry, from 1 / den (rd), Y' (y) and exp(zb - Z) / den (ratio): the
 * output o, dq, a = dout sigmoid(q), G = a exp(zb - Z) / den (g1) and G Y'
 * (g2), u1 = a / den, u2 = u1 Y' */
typedef struct {
    float o, dq, a, g1, g2, u1, u2;
} gentry;

static inline __attribute__((always_inline)) gentry grad_entry(float rd, float y, float ratio, float q, float dout)
{
    float sq, ds;
    aft_sig_parts(q, &sq, &ds);
    gentry e;
    e.o = sq * y;
    e.dq = dout * y * ds;
    e.a = dout * sq;
    e.g1 = ratio * e.a;
    e.g2 = e.g1 * y;
    e.u1 = e.a * rd;
    e.u2 = e.u1 * y;
    return e;
}

/* Causal, two parts (the band and the left sum): the band's stabiliser
 * mk + r as a float, *zf, and the factors of the band's sums (returned) and
 * of the left sum's (*fp) in units of exp(max(*zf, pm)). The larger part's
 * factor is 1 (the band's, exp of zf's rounding error d, is 1 + d to
 * within d^2 / 2 < 1e-9), the other's exp(-|zf - pm|). Tame: zf and d by
 * Knuth's two-sum, exact (no overflow below TAME_BOUND), the same values
 * as through double without the conversions. */
static inline __attribute__((always_inline)) float causal_factors(float mk, double r, float pm, int tame, float *zf,
                                                                  float *fp)
{
    float d;
    if (tame) {
        float rf = (float)r, bv;
        *zf = mk + rf;
        bv = *zf - mk;
        d = (mk - (*zf - bv)) + (rf - bv);
    } else {
        double zb = (double)mk + r;
        *zf = (float)zb;
        d = (float)(zb - (double)*zf);
    }
    /* no band (s = 0, mk = -inf): zf's rounding error is 0, where -inf -
     * -inf would make it NaN, and every entry with it */
    d = *zf > -INFINITY ? d : 0.0f;
    float x = pm - *zf, e = gexp(-fabsf(x), tame);
    int up = x > 0.0f;
    *fp = up ? 1.0f : e;
    return (up ? e : 1.0f) * (1.0f + d);
}

/* Row i's forward for cw channels, in units of exp(Z), Z the largest of the
 * three parts' stabilisers (band zb = mk + r, left pm, right rm; every
 * factor <= 1): 1 / den, Y' = num / den, and exp(zb - Z) / den (for G);
 * then, in the same loop, grad_entry's values into the rows of Z, U1, U2,
 * G (g1), G Y' (g2), the output (never NULL: a condition in the loop kept
 * it from vectorising) and dq. bad[c] where
 * den fell below AFT_DEN_EXACT_BELOW or num overflowed (done exactly
 * after). Without `right` (causal) no right part; callers pass constants
 * for it and `tame`. (Its own function, restrict pointers and no calls:
 * one vector loop.) */
static inline __attribute__((always_inline)) int
combine_row(float *restrict Zo, float *restrict U1, float *restrict U2, float *restrict g1, float *restrict g2,
            float *restrict out, float *restrict dq, unsigned char *restrict bad, const float *restrict mk, double r,
            const float *restrict b0, const float *restrict b1, const float *restrict pm, const float *restrict p0,
            const float *restrict p1, const float *restrict rm, const float *restrict r0, const float *restrict r1,
            const float *restrict q, const float *restrict dout, size_t cw, int right, int tame)
{
    int any = 0;
    for (size_t c = 0; c < cw; c++) {
        /* the band's stabiliser mk + r, exact in double (both sides) or
         * as causal_factors makes it; Z a float at least as large as every
         * part's. pm, rm of -inf (nothing held) give exp(-inf) = 0 */
        float zf, fb, fp, Z;
        if (right) {
            double zb = (double)mk[c] + r;
            zf = (float)zb;
            Z = zf > pm[c] ? zf : pm[c];
            Z = rm[c] > Z ? rm[c] : Z;
            fb = gexp((float)(zb - (double)Z), tame);
            fp = gexp(pm[c] - Z, tame);
        } else {
            fb = causal_factors(mk[c], r, pm[c], tame, &zf, &fp);
            Z = zf > pm[c] ? zf : pm[c];
        }
        float den = b0[c] * fb + p0[c] * fp, num = b1[c] * fb + p1[c] * fp;
        if (right) {
            float fr = gexp(rm[c] - Z, tame);
            den += r0[c] * fr;
            num += r1[c] * fr;
        }
        /* one division: den >= AFT_DEN_EXACT_BELOW here, or the entry is
         * done again exactly */
        float rd = 1.0f / den, y = num * rd;
        Zo[c] = Z;
        bad[c] = !(den >= AFT_DEN_EXACT_BELOW) | !(fabsf(num) <= 3.4e38f);
        any |= bad[c];
        gentry e = grad_entry(rd, y, fb * rd, q[c], dout[c]);
        out[c] = e.o;
        dq[c] = e.dq;
        g1[c] = e.g1;
        g2[c] = e.g2;
        U1[c] = e.u1;
        U2[c] = e.u2;
    }
    return any;
}

/* row t's band of keys [lo, hi) */
static inline void band_of(const gjob *jb, size_t t, size_t *lo, size_t *hi)
{
    *lo = t + 1 >= jb->s ? t + 1 - jb->s : 0;
    *hi = jb->causal ? t + 1 : (t + jb->s < jb->T ? t + jb->s : jb->T);
}

/* the block's rows whose band holds key row j: [ta, tb) */
static inline void rows_of(const gjob *jb, size_t i0, size_t i1, size_t j, size_t *ta, size_t *tb)
{
    size_t a = jb->causal ? j : (j + 1 >= jb->s ? j + 1 - jb->s : 0), b = j + jb->s < i1 ? j + jb->s : i1;
    *ta = a > i0 ? a : i0;
    *tb = b > *ta ? b : *ta;
}

/* Every row's band sums of the block (nr rows from i0; keys from lob):
 * b0 = sum_j exp(w - r) exp(k - mk), b1 likewise times v. Two rows at a
 * time: neighbours' bands share all their keys but one. */
static void block_row_sums(const gjob *jb, gscratch *sc, size_t i0, size_t nr, size_t lob, size_t cw)
{
    const size_t s = jb->s;
    size_t i = 0;
    for (; i < nr && s == 0; i++)
        for (size_t c = 0; c < cw; c++) sc->b0[i * GB_CH + c] = sc->b1[i * GB_CH + c] = 0.0f;
    for (; i + 2 <= nr; i += 2) {
        size_t la, ha, lb, hb;
        band_of(jb, i0 + i, &la, &ha);
        band_of(jb, i0 + i + 1, &lb, &hb);
        row_sums2(sc->b0 + i * GB_CH, sc->b1 + i * GB_CH, sc->b0 + (i + 1) * GB_CH, sc->b1 + (i + 1) * GB_CH,
                  sc->ew + i * 2 * s, sc->ew + (i + 1) * 2 * s, sc->ek + (la - lob) * cw, sc->ekv + (la - lob) * cw,
                  ha - la, lb - la, hb - lb, cw, cw);
    }
    if (i < nr) {
        size_t lo, hi;
        band_of(jb, i0 + i, &lo, &hi);
        row_sums(sc->b0 + i * GB_CH, sc->b1 + i * GB_CH, sc->ew + i * 2 * s, sc->ek + (lo - lob) * cw,
                 sc->ekv + (lo - lob) * cw, hi - lo, cw, cw);
    }
}

/* Every row's dw over its band,
 *   dw[t, j] += exp(w - r) sum_c (ekv[j] g1[t] - ek[j] g2[t]),
 * four rows at a time over the union of their bands (the sums outside a
 * row's band are left unused: 12 of 140 at s = 32), a row left over
 * alone */
static void block_dw(const gjob *jb, gscratch *sc, size_t i0, size_t nr, size_t lob, size_t cw)
{
    const size_t s = jb->s, ld_d = 2 * s + 4;
    for (size_t i = 0; i < nr;) {
        size_t m = nr - i >= 4 ? 4 : 1, lo[4], hi[4];
        for (size_t r = 0; r < m; r++) band_of(jb, i0 + i + r, &lo[r], &hi[r]);
        /* the union [lo[0], hi[3]) fits in d's rows (2s + 4 keys) */
        if (m == 4 && hi[3] - lo[0] > ld_d) m = 1;
        const float *ekv = sc->ekv + (lo[0] - lob) * cw, *ek = sc->ek + (lo[0] - lob) * cw;
        if (m == 4) {
            const float *g1[4], *g2[4];
            for (size_t r = 0; r < 4; r++) {
                g1[r] = sc->g1 + (i + r) * GB_CH;
                g2[r] = sc->g2 + (i + r) * GB_CH;
            }
            dw_tile4(sc->dd, ld_d, ekv, ek, cw, g1, g2, hi[3] - lo[0], cw);
        } else {
            dw_row(sc->dd, ekv, ek, cw, sc->g1 + i * GB_CH, sc->g2 + i * GB_CH, hi[0] - lo[0], cw);
        }
        for (size_t r = 0; r < m; r++) {
            const float *w = sc->ew + (i + r) * 2 * s, *d = sc->dd + r * ld_d + (lo[r] - lo[0]);
            float *dw = sc->dw + (i + r) * 2 * s;
            for (size_t j = 0; j < hi[r] - lo[r]; j++) dw[j] += w[j] * d[j];
        }
        i += m;
    }
}

/* key row j's weights exp(w[t, j] - r[t]) over the block's rows [ta, tb) */
static void key_weights(const gjob *jb, const gscratch *sc, size_t i0, size_t j, size_t ta, size_t tb, float *e)
{
    for (size_t t = ta; t < tb; t++) {
        size_t lo, hi;
        band_of(jb, t, &lo, &hi);
        e[t - ta] = sc->ew[(t - i0) * 2 * jb->s + (j - lo)];
    }
}

/* The band's part of dv and dk for the block's keys [lob, hib), channels
 * [c0, c0 + cw): key row j's sums over the rows whose band holds it,
 *   h1 = sum_t exp(w - r) G[t],  h2 likewise with G Y',
 * two key rows at a time (their rows are the same but one), then
 * dv += exp(k - mk) h1, dk += exp(k - mk) (v h1 - h2). */
static void block_key_sums(const gjob *jb, gscratch *sc, size_t sl, size_t i0, size_t i1, size_t lob, size_t hib,
                           size_t c0, size_t cw)
{
    const size_t ldv = jb->ws->ldv;
    float *h = sc->h;
    for (size_t j = lob; j < hib;) {
        size_t ta, tb, tc = 0, td = 0;
        rows_of(jb, i0, i1, j, &ta, &tb);
        int two = j + 1 < hib;
        if (two) rows_of(jb, i0, i1, j + 1, &tc, &td);
        /* row_sums2's shape: b's rows start no earlier and end no earlier,
         * and meet a's */
        two = two && tc >= ta && tc <= tb && td >= tb;
        key_weights(jb, sc, i0, j, ta, tb, sc->ce);
        const float *g1 = sc->g1 + (ta - i0) * GB_CH, *g2 = sc->g2 + (ta - i0) * GB_CH;
        if (two) {
            key_weights(jb, sc, i0, j + 1, tc, td, sc->ce2);
            row_sums2(h, h + GB_CH, h + 2 * GB_CH, h + 3 * GB_CH, sc->ce, sc->ce2, g1, g2, tb - ta, tc - ta,
                      td - tc, GB_CH, cw);
        } else {
            row_sums(h, h + GB_CH, sc->ce, g1, g2, tb - ta, GB_CH, cw);
        }
        for (int m = 0; m <= two; m++) {
            size_t jj = j + (size_t)m;
            if (m ? td == tc : tb == ta) continue;
            float *dk, *dv = grad_rows(jb, sl, jj, &dk);
            col_apply(dv + c0, dk + c0, sc->ek + (jj - lob) * cw, jb->v + jj * ldv + c0, h + 2 * m * GB_CH,
                      h + (2 * m + 1) * GB_CH, cw);
        }
        j += two ? 2 : 1;
    }
}

/* key_add with a tame flag that is not a constant */
static void key_add_any(float *restrict m, float *restrict s0, float *restrict s1, const float *restrict k,
                        const float *restrict v, size_t n, int tame)
{
    if (tame) key_add(m, s0, s1, k, v, n, 1);
    else key_add(m, s0, s1, k, v, n, 0);
}

/* the band's key maximum mk (sc->mk, -inf on entry) and factors exp(k -
 * mk) and exp(k - mk) v for the block's keys [lob, hib), channels [c0, c0
 * + cw) */
static void block_factors(const gjob *jb, gscratch *sc, size_t lob, size_t hib, size_t c0, size_t cw, int tame)
{
    const size_t ldk = jb->ws->ldk, ldv = jb->ws->ldv;
    float *mk = sc->mk;
    for (size_t j = lob; j < hib; j++) {
        const float *kr = jb->k + j * ldk + c0;
        for (size_t c = 0; c < cw; c++) mk[c] = kr[c] > mk[c] ? kr[c] : mk[c];
    }
    for (size_t c = 0; c < cw; c++) mk[c] = isfinite(mk[c]) ? mk[c] : 0.0f;
    for (size_t j = lob; j < hib; j++) {
        const float *kr = jb->k + j * ldk + c0, *vr = jb->v + j * ldv + c0;
        float *e = sc->ek + (j - lob) * cw, *ev = sc->ekv + (j - lob) * cw;
        if (tame)
            for (size_t c = 0; c < cw; c++) e[c] = aft_expf_nonpos(kr[c] - mk[c]);
        else
            for (size_t c = 0; c < cw; c++) e[c] = aft_expf(kr[c] - mk[c]);
        for (size_t c = 0; c < cw; c++) ev[c] = e[c] * vr[c];
    }
}

/* Rows a block's row loop asks for ahead: the rows it reads and writes
 * (q, dout, dq, Z, U1, U2) are 1 to 3 KiB apart, in arrays written long
 * before or not yet this call, and came each as a miss; dv and dk of the
 * next block's rows likewise (zeroed when that block starts). Only the
 * slice's own rows: another thread may be writing the next slice's. With
 * both, the block pass took 17.8 million cycles a thread where it took
 * 18.9 (causal local, T = 4096, C = 256). */
enum { ROWS_AHEAD = 4 };

static inline __attribute__((always_inline)) void rows_prefetch(const gjob *jb, const gscratch *sc, size_t t,
                                                                size_t c0, size_t cw)
{
    const size_t C = jb->C, T = jb->T;
    if (t + ROWS_AHEAD < sc->te) {
        size_t u = t + ROWS_AHEAD, row = jb->b * T + u;
        const float *z = zrow(jb, sc, u);
        aft_lines_prefetch(jb->q + u * jb->ws->ldq + c0, cw, 0);
        aft_lines_prefetch(jb->dout + u * C + c0, cw, 0);
        aft_lines_prefetch(jb->io->dq + row * jb->io->lddq + c0, cw, 1);
        for (int a = 0; a < 3; a++) aft_lines_prefetch(z + a * C + c0, cw, 1);
        if (jb->mode == AFT_SUMS_READ)   /* the forward's 1 / den and Y', long out of the caches */
            for (int a = 0; a < 2; a++) aft_lines_prefetch(jb->sums + u * 2 * C + a * C + c0, cw, 0);
    }
    if (t + GB_ROWS < sc->te) {
        size_t row = jb->b * T + t + GB_ROWS;
        aft_lines_prefetch(jb->io->dv + row * jb->io->lddv + c0, cw, 1);
        aft_lines_prefetch(jb->io->dk + row * jb->io->lddk + c0, cw, 1);
    }
}

/* The block's rows [i0, i0 + nr) one by one, channels [c0, c0 + cw): the
 * left sum takes key t - s, then the forward's L (as Z and den) and Y',
 * exactly where den underflowed, and grad_entry's per-entry factors.
 * causal and tame are constants (block_rows below). */
static inline __attribute__((always_inline)) void
block_rows_body(const gjob *jb, gscratch *sc, size_t i0, size_t nr, size_t c0, size_t cw, int causal, int tame)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, C = jb->C, s = jb->s, ldk = ws->ldk, ldv = ws->ldv, ldq = ws->ldq;
    float *pm = sc->pm + c0, *p0 = sc->p0 + c0, *p1 = sc->p1 + c0, *mk = sc->mk;
    for (size_t i = 0; i < nr; i++) {
        size_t t = i0 + i, lo, hi;
        band_of(jb, t, &lo, &hi);
        rows_prefetch(jb, sc, t, c0, cw);
        if (t >= s) key_add(pm, p0, p1, jb->k + (t - s) * ldk + c0, jb->v + (t - s) * ldv + c0, cw, tame);
        float *b0 = sc->b0 + i * GB_CH, *b1 = sc->b1 + i * GB_CH;
        const double r = sc->r[i];
        float *Z = zrow(jb, sc, t) + c0, *U1 = Z + C, *U2 = Z + 2 * C;
        float *Y = sc->ys + i * GB_CH, *A = sc->as + i * GB_CH;
        const float *qr = jb->q + t * ldq + c0, *dr = jb->dout + t * C + c0;
        const size_t row = jb->b * T + t;
        float *dq = jb->io->dq + row * jb->io->lddq + c0;
        float *out = jb->io->out ? jb->io->out + row * C + c0 : NULL;
        float *g1 = sc->g1 + i * GB_CH, *g2 = sc->g2 + i * GB_CH;
        unsigned char *redo = sc->redo + i * GB_CH, *bad = sc->bad + i * GB_CH;
        const float *rm = sc->rm + i * GB_CH, *r0 = sc->r0 + i * GB_CH, *r1 = sc->r1 + i * GB_CH;
        /* no output wanted: it goes to A's row, written again below for
         * the entries that read it */
        int any = combine_row(Z, U1, U2, g1, g2, out ? out : A, dq, bad, mk, r, b0, b1, pm, p0, p1, rm, r0, r1, qr,
                              dr, cw, !causal, tame);
        sc->rowredo[i] = 0;
        for (size_t c = 0; c < cw && any; c++) {
            redo[c] = 0;
            if (!bad[c]) continue;
            /* exactly: L kept as Z = L rounded and 1 / den = exp(Z - L);
             * G's factor exp(zb - L) unless it would pass e^46 (then
             * the gradient too is done exactly, below) */
            double L;
            exact_forward(jb, sc, i, t, lo, hi, c0, c, &L, Y + c);
            Z[c] = (float)L;
            float rd = (float)exp((double)Z[c] - L);
            sc->lx[i * GB_CH + c] = L;
            double x = (double)mk[c] + r - L;
            redo[c] = !(x <= GB_EXACT);
            sc->rowredo[i] |= redo[c];
            /* the entry's gradient factors again, from the exact values
             * (a, for the exact gradient below, too) */
            gentry e = grad_entry(rd, Y[c], redo[c] ? 0.0f : expd(x), qr[c], dr[c]);
            if (out) out[c] = e.o;
            dq[c] = e.dq;
            A[c] = e.a;
            g1[c] = e.g1;
            g2[c] = e.g2;
            U1[c] = e.u1;
            U2[c] = e.u2;
        }
    }
}

static void block_rows(const gjob *jb, gscratch *sc, size_t i0, size_t nr, size_t c0, size_t cw, int tame)
{
    if (jb->causal) {
        if (tame) block_rows_body(jb, sc, i0, nr, c0, cw, 1, 1);
        else block_rows_body(jb, sc, i0, nr, c0, cw, 1, 0);
    } else {
        if (tame) block_rows_body(jb, sc, i0, nr, c0, cw, 0, 1);
        else block_rows_body(jb, sc, i0, nr, c0, cw, 0, 0);
    }
}

/* ---- the saved forward half (gjob.mode): causal only */

/* combine_row's forward alone, causal: each entry's 1 / den (rd) and Y'
 * (y) and the output, as combine_row makes them (the same bits); bad[c]
 * as there */
static inline __attribute__((always_inline)) int
combine_fwd(float *restrict rdo, float *restrict yo, float *restrict out, unsigned char *restrict bad,
            const float *restrict mk, double r, const float *restrict b0, const float *restrict b1,
            const float *restrict pm, const float *restrict p0, const float *restrict p1, const float *restrict q,
            size_t cw, int tame)
{
    int any = 0;
    for (size_t c = 0; c < cw; c++) {
        float zf, fp, fb = causal_factors(mk[c], r, pm[c], tame, &zf, &fp);
        float den = b0[c] * fb + p0[c] * fp, num = b1[c] * fb + p1[c] * fp;
        float rd = 1.0f / den, y = num * rd, sq, ds;
        bad[c] = !(den >= AFT_DEN_EXACT_BELOW) | !(fabsf(num) <= 3.4e38f);
        any |= bad[c];
        aft_sig_parts(q[c], &sq, &ds);
        out[c] = sq * y;
        rdo[c] = rd;
        yo[c] = y;
    }
    return any;
}

/* combine_row where the forward kept 1 / den (rd) and Y' (y): Z and the
 * band's factor from the left sum's maximum pm alone, as combine_row
 * makes them (the same bits), then grad_entry's values. Causal, no entry
 * done exactly (a run with one keeps nothing). */
static inline __attribute__((always_inline)) void
combine_read(float *restrict Zo, float *restrict U1, float *restrict U2, float *restrict g1, float *restrict g2,
             float *restrict out, float *restrict dq, const float *restrict mk, double r, const float *restrict pm,
             const float *restrict rd, const float *restrict y, const float *restrict q, const float *restrict dout,
             size_t cw, int tame)
{
    for (size_t c = 0; c < cw; c++) {
        float zf, fp, fb = causal_factors(mk[c], r, pm[c], tame, &zf, &fp);
        (void)fp;
        Zo[c] = zf > pm[c] ? zf : pm[c];
        gentry g = grad_entry(rd[c], y[c], fb * rd[c], q[c], dout[c]);
        out[c] = g.o;
        dq[c] = g.dq;
        g1[c] = g.g1;
        g2[c] = g.g2;
        U1[c] = g.u1;
        U2[c] = g.u2;
    }
}

/* The block's rows' forward alone (AFT_SUMS_WRITE): the left sum takes key
 * t - s, then combine_fwd into the output and the kept sums; an entry
 * done exactly gets its output as block_rows_body gives it and spoils
 * the kept sums */
static inline __attribute__((always_inline)) void block_rows_fwd_body(const gjob *jb, gscratch *sc, size_t i0,
                                                                      size_t nr, size_t c0, size_t cw, int tame)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, C = jb->C, s = jb->s, ldk = ws->ldk, ldv = ws->ldv, ldq = ws->ldq;
    float *pm = sc->pm + c0, *p0 = sc->p0 + c0, *p1 = sc->p1 + c0, *mk = sc->mk;
    for (size_t i = 0; i < nr; i++) {
        size_t t = i0 + i, lo, hi;
        band_of(jb, t, &lo, &hi);
        /* as rows_prefetch: the rows read and written ahead (the kept
         * sums' rows are new memory); and the next block's keys and
         * values, which block_factors reads first: in the training step
         * they come from memory, and it waited on them */
        if (t + ROWS_AHEAD < sc->te) {
            size_t u = t + ROWS_AHEAD;
            aft_lines_prefetch(jb->q + u * ldq + c0, cw, 0);
            aft_lines_prefetch(jb->io->out + (jb->b * T + u) * C + c0, cw, 1);
            aft_lines_prefetch(jb->sums + u * 2 * C + c0, cw, 1);
            aft_lines_prefetch(jb->sums + u * 2 * C + C + c0, cw, 1);
        }
        if (t + GB_ROWS < sc->te) {
            aft_lines_prefetch(jb->k + (t + GB_ROWS) * ldk + c0, cw, 0);
            aft_lines_prefetch(jb->v + (t + GB_ROWS) * ldv + c0, cw, 0);
        }
        if (t >= s) key_add(pm, p0, p1, jb->k + (t - s) * ldk + c0, jb->v + (t - s) * ldv + c0, cw, tame);
        const float *qr = jb->q + t * ldq + c0;
        float *out = jb->io->out + (jb->b * T + t) * C + c0, *rd = jb->sums + t * 2 * C + c0, *y = rd + C;
        unsigned char *bad = sc->bad + i * GB_CH;
        int any = combine_fwd(rd, y, out, bad, mk, sc->r[i], sc->b0 + i * GB_CH, sc->b1 + i * GB_CH, pm, p0, p1, qr,
                              cw, tame);
        for (size_t c = 0; c < cw && any; c++) {
            if (!bad[c]) continue;
            double L;
            float Y, sq, ds;
            exact_forward(jb, sc, i, t, lo, hi, c0, c, &L, &Y);
            aft_sig_parts(qr[c], &sq, &ds);
            out[c] = sq * Y;
        }
        if (any) atomic_store_explicit(jb->spoilt, 1, memory_order_relaxed);
    }
}

static void block_rows_fwd(const gjob *jb, gscratch *sc, size_t i0, size_t nr, size_t c0, size_t cw, int tame)
{
    if (tame) block_rows_fwd_body(jb, sc, i0, nr, c0, cw, 1);
    else block_rows_fwd_body(jb, sc, i0, nr, c0, cw, 0);
}

/* block_rows where the forward kept 1 / den and Y' (AFT_SUMS_READ): the
 * left sum's maximum takes key t - s (the left sums themselves serve only
 * the entries done exactly, and a run with one keeps nothing) */
static void block_rows_read(const gjob *jb, gscratch *sc, size_t i0, size_t nr, size_t c0, size_t cw, int tame)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, C = jb->C, s = jb->s, ldk = ws->ldk, ldq = ws->ldq;
    float *pm = sc->pm + c0;
    for (size_t i = 0; i < nr; i++) {
        size_t t = i0 + i;
        rows_prefetch(jb, sc, t, c0, cw);
        if (t >= s) {
            const float *kr = jb->k + (t - s) * ldk + c0;
            for (size_t c = 0; c < cw; c++) pm[c] = kr[c] > pm[c] ? kr[c] : pm[c];
        }
        float *Z = zrow(jb, sc, t) + c0;
        const float *qr = jb->q + t * ldq + c0, *dr = jb->dout + t * C + c0;
        const float *rd = jb->sums + t * 2 * C + c0;
        const size_t row = jb->b * T + t;
        float *dq = jb->io->dq + row * jb->io->lddq + c0;
        float *out = jb->io->out ? jb->io->out + row * C + c0 : sc->as + i * GB_CH;
        float *g1 = sc->g1 + i * GB_CH, *g2 = sc->g2 + i * GB_CH;
        if (tame) combine_read(Z, Z + C, Z + 2 * C, g1, g2, out, dq, sc->mk, sc->r[i], pm, rd, rd + C, qr, dr, cw, 1);
        else combine_read(Z, Z + C, Z + 2 * C, g1, g2, out, dq, sc->mk, sc->r[i], pm, rd, rd + C, qr, dr, cw, 0);
        sc->rowredo[i] = 0;
    }
}

/* Row t's w over its band (head h), as w and e = exp(w - r), r the row's
 * maximum (*r). Returns whether every w is tame. */
static int row_weights(const gjob *jb, size_t h, size_t t, float *restrict w, float *restrict e, float *r)
{
    const aft_opspec *ws = jb->ws;
    size_t lo, hi;
    band_of(jb, t, &lo, &hi);
    aft_w_row(ws, h, ws->t_off + t, ws->t_off + lo, ws->t_off + hi, w);
    float m = ws->zero_bias ? 0.0f : aft_max_f32(w, hi - lo);
    m = isfinite(m) ? m : 0.0f;
    *r = m;
    int ok = 1;
    for (size_t j = 0; j < hi - lo; j++) {
        e[j] = aft_expf(w[j] - m);
        ok &= fabsf(w[j]) <= TAME_BOUND;
    }
    return ok;
}

/* The block's rows' w over their bands, as w (sc->wr) and exp(w - r)
 * (sc->ew), r the row's maximum (sc->r): the rows of gjob's table where
 * there is one, else made here. Returns whether every w is tame (and
 * clears slice sl's flag where one is not). */
static int block_weights(const gjob *jb, gscratch *sc, size_t sl, size_t h, size_t i0, size_t nr)
{
    const size_t s = jb->s;
    int w_ok = 1;
    if (jb->tew) {
        size_t x = h * jb->T + i0;
        sc->wr = jb->twr + x * 2 * s;
        sc->ew = jb->tew + x * 2 * s;
        sc->r = jb->tr + x;
        w_ok = all_set(jb->tok + x, nr);
    } else {
        sc->wr = sc->wr_own;
        sc->ew = sc->ew_own;
        sc->r = sc->r_own;
        for (size_t i = 0; i < nr && s == 0; i++) sc->r[i] = 0.0f;
        for (size_t i = 0; i < nr && s > 0; i++)
            w_ok &= row_weights(jb, h, i0 + i, sc->wr + i * 2 * s, sc->ew + i * 2 * s, &sc->r[i]);
    }
    if (!w_ok) jb->wtame[sl] = 0;
    return w_ok;
}

/* gjob's table of band weights for B sequences: NULL (each block makes
 * its own) for one sequence, no band, or a table of more than
 * WEIGHTS_MAX floats */
enum { WEIGHTS_MAX = 1 << 20 };
static void weights_table_alloc(gjob *jb, size_t B)
{
    const size_t n = jb->H * jb->T, s = jb->s;
    jb->twr = jb->tew = jb->tr = NULL;
    jb->tok = NULL;
    if (B < 2 || s == 0 || n > WEIGHTS_MAX / (4 * s + 1)) return;
    jb->twr = aft_alloc_array(n, (4 * s + 1) * sizeof(float));
    jb->tok = malloc(n);
    if (!jb->twr || !jb->tok) {   /* the blocks make their own */
        free(jb->twr);
        free(jb->tok);
        jb->twr = NULL;
        jb->tok = NULL;
        return;
    }
    jb->tew = jb->twr + n * 2 * s;
    jb->tr = jb->tew + n * 2 * s;
}

/* The rows of dv, dk a block reaches first, keys [lob, hib) (every row of
 * the slice's is in its own band), zeroed while they come into the cache,
 * every head's channels (the block's first head comes first) */
static void zero_grad_rows(const gjob *jb, gscratch *sc, size_t sl, size_t lob, size_t hib)
{
    const size_t C = jb->C;
    size_t t0 = row0(jb, sl), t1 = row0(jb, sl + 1), z0 = lob > sc->zhi ? lob : sc->zhi;
    z0 = z0 > t0 ? z0 : t0;
    size_t z1 = hib < t1 ? hib : t1;
    for (size_t j = z0; j < z1; j++) {
        size_t row = jb->b * jb->T + j;
        memset(jb->io->dv + row * jb->io->lddv, 0, C * sizeof(float));
        memset(jb->io->dk + row * jb->io->lddk, 0, C * sizeof(float));
    }
    sc->zhi = z1 > sc->zhi ? z1 : sc->zhi;
}

/* The rows' right sums (keys t' >= t + s) for channels [c0, c0 + cw) into
 * sc->rm, r0, r1, from block bi's snapshot, as t runs back from i1 - 1 */
static void block_right(const gjob *jb, gscratch *sc, size_t i0, size_t i1, size_t bi, size_t c0, size_t cw)
{
    const size_t T = jb->T, C = jb->C, s = jb->s, ldk = jb->ws->ldk, ldv = jb->ws->ldv;
    float *qm = sc->qm + c0, *q0 = sc->q0 + c0, *q1 = sc->q1 + c0;
    const float *sn = sc->snap + bi * 3 * C;
    memcpy(qm, sn + c0, cw * sizeof(float));
    memcpy(q0, sn + C + c0, cw * sizeof(float));
    memcpy(q1, sn + 2 * C + c0, cw * sizeof(float));
    for (size_t t = i1; t-- > i0;) {
        if (t + s < T)
            key_add_any(qm, q0, q1, jb->k + (t + s) * ldk + c0, jb->v + (t + s) * ldv + c0, cw, jb->keys_tame);
        memcpy(sc->rm + (t - i0) * GB_CH, qm, cw * sizeof(float));
        memcpy(sc->r0 + (t - i0) * GB_CH, q0, cw * sizeof(float));
        memcpy(sc->r1 + (t - i0) * GB_CH, q1, cw * sizeof(float));
    }
}

/* The gradient's band terms of the entries whose band maxima lie far apart
 * (sc->redo: G's factor would pass e^46), exactly in double, from L
 * (sc->lx), Y' and a: to dv and dk (through grad_rows) and dw */
static void block_exact_grad(const gjob *jb, gscratch *sc, size_t sl, size_t i0, size_t nr, size_t c0, size_t cw)
{
    const size_t s = jb->s, ldk = jb->ws->ldk, ldv = jb->ws->ldv;
    for (size_t i = 0; i < nr; i++) {
        size_t t = i0 + i, lo, hi;
        band_of(jb, t, &lo, &hi);
        const unsigned char *redo = sc->redo + i * GB_CH;
        const float *wr = sc->wr + i * 2 * s;
        float *dw = sc->dw + i * 2 * s;
        for (size_t c = 0; c < cw && sc->rowredo[i]; c++) {
            if (!redo[c]) continue;
            size_t cc = c0 + c;
            double L = sc->lx[i * GB_CH + c], y = sc->ys[i * GB_CH + c], a = sc->as[i * GB_CH + c];
            for (size_t j = lo; j < hi; j++) {
                double vj = jb->v[j * ldv + cc];
                double g = exp((double)jb->k[j * ldk + cc] + (double)wr[j - lo] - L) * a;
                float *dk, *dv = grad_rows(jb, sl, j, &dk);
                dv[cc] += (float)g;
                dk[cc] += (float)(g * (vj - y));
                if (jb->want_dw) dw[j - lo] += (float)(g * (vj - y));
            }
        }
    }
}

/* band_block's forward alone (AFT_SUMS_WRITE): the output, and each
 * entry's 1 / den and Y' kept */
static void band_block_fwd(const gjob *jb, gscratch *sc, size_t sl, size_t h, size_t i0, size_t i1)
{
    const size_t s = jb->s, ch = jb->ch, cwm = ch < GB_CH ? ch : GB_CH, nr = i1 - i0;
    const size_t lob = s == 0 ? i0 : (i0 + 1 >= s ? i0 + 1 - s : 0);
    const int tame = jb->keys_tame && block_weights(jb, sc, sl, h, i0, nr);
    if (!tame) atomic_store_explicit(jb->spoilt, 1, memory_order_relaxed);
    for (size_t c0 = h * ch; c0 < (h + 1) * ch; c0 += cwm) {
        const size_t cw = (h + 1) * ch - c0 < cwm ? (h + 1) * ch - c0 : cwm;
        for (size_t c = 0; c < cw; c++) sc->mk[c] = -INFINITY;
        if (s > 0) block_factors(jb, sc, lob, i1, c0, cw, tame);
        block_row_sums(jb, sc, i0, nr, lob, cw);
        block_rows_fwd(jb, sc, i0, nr, c0, cw, tame);
    }
}

/* One block of rows [i0, i1) of head h of slice sl: the forward's L and
 * Y' (and out), dq, and the band's part of dw, dv and dk. */
static void band_block(const gjob *jb, gscratch *sc, const aft_bias_grad *db, size_t sl, size_t h, size_t i0,
                       size_t i1, size_t bi)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, s = jb->s, ch = jb->ch;
    const int causal = jb->causal;
    /* the band's keys (s = 0, no band: the block's own rows, for dv, dk) */
    const size_t lob = s == 0 ? i0 : (i0 + 1 >= s ? i0 + 1 - s : 0);
    const size_t hib = causal ? i1 : (i1 + s - 1 < T ? i1 + s - 1 : T);
    const size_t nr = i1 - i0, cwm = ch < GB_CH ? ch : GB_CH;

    const int w_ok = block_weights(jb, sc, sl, h, i0, nr);
    /* the next block's rows of the bias and its gradient, in the cache by
     * the time it starts (a row a page, which the prefetcher misses) */
    const size_t te = row0(jb, sl + 1);
    if (h == 0 && i1 < te) aft_band_bias_prefetch(ws, db, i1, i1 + GB_ROWS < te ? i1 + GB_ROWS : te);
    const int tame = jb->keys_tame && w_ok;
    if (jb->want_dw) memset(sc->dw, 0, nr * 2 * s * sizeof(float));
    if (h == 0) zero_grad_rows(jb, sc, sl, lob, hib);

    for (size_t c0 = h * ch; c0 < (h + 1) * ch; c0 += cwm) {
        const size_t cw = (h + 1) * ch - c0 < cwm ? (h + 1) * ch - c0 : cwm;
        /* band factors exp(k - mk), mk the block's key maximum per channel
         * (no band: mk = -inf, so the band's part is exp(-inf) = 0) */
        for (size_t c = 0; c < cw; c++) sc->mk[c] = -INFINITY;
        if (s > 0) block_factors(jb, sc, lob, hib, c0, cw, tame);
        if (!causal) block_right(jb, sc, i0, i1, bi, c0, cw);

        /* the forward: the rows' band sums, then row by row (or what
         * the forward kept of them) */
        if (jb->mode == AFT_SUMS_READ) {
            block_rows_read(jb, sc, i0, nr, c0, cw, tame);
        } else {
            block_row_sums(jb, sc, i0, nr, lob, cw);
            block_rows(jb, sc, i0, nr, c0, cw, tame);
        }

        /* dw[t, j] += exp(w - r) sum_c (exp(k - mk) v G - exp(k - mk) Y' G) */
        if (jb->want_dw) block_dw(jb, sc, i0, nr, lob, cw);

        /* key row j: dv += exp(k - mk) sum_t exp(w - r) G[t], dk likewise
         * with v G - Y' G, over the block's rows t whose band holds j */
        if (s > 0) block_key_sums(jb, sc, sl, i0, i1, lob, hib, c0, cw);

        block_exact_grad(jb, sc, sl, i0, nr, c0, cw);
    }
    if (jb->want_dw)
        for (size_t i = 0; i < nr; i++) {
            size_t t = i0 + i, lo, hi;
            band_of(jb, t, &lo, &hi);
            if (jb->set && h == 0) aft_w_row_grad_set(ws, db, t, lo, hi, sc->dw + i * 2 * s);
            else aft_w_row_grad(ws, db, h, ws->t_off + t, ws->t_off + lo, ws->t_off + hi, sc->dw + i * 2 * s);
        }
}

/* Slice sl's rows, every head: the block pass. Its left and right key
 * sums start from the pieces (P1). A block's heads go one after another,
 * while its rows are in the cache (head after head over all the rows read
 * every row from memory once a head). */
static void block_pass(const gjob *jb, gscratch *sc, const aft_bias_grad *db, size_t sl)
{
    const size_t T = jb->T, C = jb->C, s = jb->s, t0 = row0(jb, sl), t1 = row0(jb, sl + 1);
    const size_t ns = jb->ns, ldk = jb->ws->ldk, ldv = jb->ws->ldv;
    if (t1 <= t0) return;
    const size_t nb = (t1 - t0 + GB_ROWS - 1) / GB_ROWS;
    sc->zhi = 0;
    sc->te = t1;
    /* left: keys [0, t0 - s), the left pieces of the slices before */
    for (size_t c = 0; c < C; c++)
        aft_sums_merge_channel(jb->kp, 8 * C, sl, C, c, &sc->pm[c], &sc->p0[c], &sc->p1[c]);
    if (!jb->causal) {
        /* right: keys [t1 + s, T), the right pieces of the slices after;
         * then back over the rows, a snapshot at each block's end */
        for (size_t c = 0; c < C; c++)
            aft_sums_merge_channel(jb->kp + (2 * sl + 3) * 4 * C, 8 * C, ns - sl - 1, C, c, &sc->qm[c],
                                   &sc->q0[c], &sc->q1[c]);
        for (size_t bi = nb; bi-- > 0;) {
            size_t i0 = t0 + bi * GB_ROWS, i1 = i0 + GB_ROWS < t1 ? i0 + GB_ROWS : t1;
            float *sn = sc->snap + bi * 3 * C;
            memcpy(sn, sc->qm, C * sizeof(float));
            memcpy(sn + C, sc->q0, C * sizeof(float));
            memcpy(sn + 2 * C, sc->q1, C * sizeof(float));
            for (size_t t = i1; t-- > i0;)
                if (t + s < T)
                    key_add_any(sc->qm, sc->q0, sc->q1, jb->k + (t + s) * ldk, jb->v + (t + s) * ldv, C, jb->keys_tame);
        }
    }
    for (size_t bi = 0; bi < nb; bi++) {
        size_t i0 = t0 + bi * GB_ROWS, i1 = i0 + GB_ROWS < t1 ? i0 + GB_ROWS : t1;
        for (size_t h = 0; h < jb->H; h++) {
            if (jb->mode == AFT_SUMS_WRITE) band_block_fwd(jb, sc, sl, h, i0, i1);
            else band_block(jb, sc, db, sl, h, i0, i1, bi);
        }
    }
}

/* slice sl's sums of the rows of its pieces for the backward's outside
 * parts: left piece rows [t0 - s, t1 - s), right [t0 + s, t1 + s) */
static void row_pieces(const gjob *jb, const gscratch *sc, size_t sl)
{
    const size_t T = jb->T, C = jb->C, s = jb->s, t0 = row0(jb, sl), t1 = row0(jb, sl + 1);
    for (int side = 0; side < 2; side++) {
        /* (as the key pieces: only those another slice merges) */
        if ((side == 0 && (jb->causal || sl + 1 == jb->ns)) || (side == 1 && sl == 0)) continue;
        float *p = jb->rp + (2 * sl + side) * 3 * C;
        rsum r = {p, p + C, p + 2 * C};
        rsum_empty(&r, C);
        size_t a = side == 0 ? (t0 > s ? t0 - s : 0) : (t0 + s < T ? t0 + s : T);
        size_t e = side == 0 ? (t1 > s ? t1 - s : 0) : (t1 + s < T ? t1 + s : T);
        for (size_t t = a; t < e; t++) {
            const float *z = zrow(jb, sc, t);
            if (jb->tame) row_add(r.m, r.s1, r.s2, z, z + C, z + 2 * C, C, 1);
            else row_add(r.m, r.s1, r.s2, z, z + C, z + 2 * C, C, 0);
        }
    }
}

/* key row j's share of a running sum over rows outside its band:
 * dv += exp(k + m) s1, dk += exp(k + m) (v s1 - s2). k + m <= 0: each row
 * held sees key j with w = 0 inside one of its running sums, whose
 * stabiliser (<= the row's Z) is at least k. */
static inline __attribute__((always_inline)) void
outside_add(float *restrict dv, float *restrict dk, const float *restrict k, const float *restrict v,
            const float *restrict m, const float *restrict s1, const float *restrict s2, size_t n, int tame)
{
    for (size_t c = 0; c < n; c++) {
        float f = gexp(k[c] + m[c], tame);   /* m = -inf (nothing held): 0 */
        float x = f * s1[c];
        dv[c] += x;
        dk[c] += x * v[c] - f * s2[c];
    }
}

/* The outside pass's rows: a key's k, v, dv and dk lie in rows of Q, K, V
 * and of their gradients, 3C floats apart, and it walks them downwards
 * (causal), so the machine's prefetcher, which keeps within a page, misses
 * each new row; the rows' Z, U1 and U2 come from the block pass (without
 * causality long since out of the nearer caches). Asked for this many keys
 * ahead, the pass took 6 million cycles a thread where it took 10 (T =
 * 4096, C = 256). */
enum { OUT_AHEAD = 2 };

static void outside_prefetch(const gjob *jb, const gscratch *sc, size_t j, int side)
{
    const size_t C = jb->C, t = side ? j + jb->s : j - jb->s, row = jb->b * jb->T + j;
    aft_lines_prefetch(jb->k + j * jb->ws->ldk, C, 0);
    aft_lines_prefetch(jb->v + j * jb->ws->ldv, C, 0);
    aft_lines_prefetch(jb->io->dv + row * jb->io->lddv, C, 1);
    aft_lines_prefetch(jb->io->dk + row * jb->io->lddk, C, 1);
    if (side ? t < jb->T : j >= jb->s) aft_lines_prefetch(zrow(jb, sc, t), 3 * C, 0);
}

/* keys j in [t0, t1) on one side (outside_pass below): each row
 * outside j's band joins the running sum cur, which j then takes; tame a
 * constant */
static inline __attribute__((always_inline)) void outside_keys(const gjob *jb, const gscratch *sc, rsum *cur,
                                                               size_t t0, size_t t1,
                                                               int side, int tame)
{
    const size_t T = jb->T, C = jb->C, s = jb->s, ldk = jb->ws->ldk, ldv = jb->ws->ldv;
    for (size_t n = 0; n < t1 - t0; n++) {
        size_t j = side ? t1 - 1 - n : t0 + n;
        size_t t = side ? j + s : j - s;   /* the row joining */
        if (n + OUT_AHEAD < t1 - t0) outside_prefetch(jb, sc, side ? j - OUT_AHEAD : j + OUT_AHEAD, side);
        if ((side && j + s < T) || (!side && j >= s)) {
            const float *z = zrow(jb, sc, t);
            row_add(cur->m, cur->s1, cur->s2, z, z + C, z + 2 * C, C, tame);
        }
        const size_t row = jb->b * T + j;
        outside_add(jb->io->dv + row * jb->io->lddv, jb->io->dk + row * jb->io->lddk, jb->k + j * ldk,
                    jb->v + j * ldv, cur->m, cur->s1, cur->s2, C, tame);
    }
}

/* Slice sl's keys j in [t0, t1): the rows outside their band (w = 0)
 * through running sums, and the halos other slices left for them. */
static void outside_pass(const gjob *jb, const gscratch *sc, rsum *cur, size_t sl)
{
    const size_t T = jb->T, C = jb->C, ns = jb->ns, t0 = row0(jb, sl), t1 = row0(jb, sl + 1);
    if (t1 <= t0) return;
    for (int side = 0; side < 2; side++) {
        if (side == 0 && jb->causal) continue;
        /* side 1: rows [j + s, T), from the pieces after, j descending;
         * side 0: rows [0, j - s + 1), from the pieces before, j ascending */
        rsum_empty(cur, C);
        size_t k0 = side ? sl + 1 : 0, k1 = side ? ns : sl;
        for (size_t kk = k0; kk < k1; kk++) {
            float *pp = jb->rp + (2 * kk + side) * 3 * C;
            rsum p = {pp, pp + C, pp + 2 * C};
            rsum_merge(cur, &p, C);
        }
        if (jb->tame) outside_keys(jb, sc, cur, t0, t1, side, 1);
        else outside_keys(jb, sc, cur, t0, t1, side, 0);
    }
    /* the halos of the other slices that fall on these rows */
    for (size_t o = 0; o < ns; o++) {
        if (o == sl) continue;
        size_t o0 = row0(jb, o), o1 = row0(jb, o + 1);
        if (o1 <= o0) continue;
        for (size_t i = 0; i < halo_used(jb); i++) {
            /* halo row i of slice o */
            size_t j;
            if (i < jb->hrows) {
                if (o0 < jb->hrows - i) continue;
                j = o0 - (jb->hrows - i);
            } else {
                j = o1 + (i - jb->hrows);
            }
            if (j < t0 || j >= t1) continue;
            const float *hv = jb->halo + (o * 2 * jb->hrows + i) * 2 * C, *hk = hv + C;
            const size_t row = jb->b * T + j;
            float *dv = jb->io->dv + row * jb->io->lddv, *dk = jb->io->dk + row * jb->io->lddk;
            for (size_t c = 0; c < C; c++) {
                dv[c] += hv[c];
                dk[c] += hk[c];
            }
        }
    }
}

/* ---- causal: a slice's three passes one after another
 *
 * With causality a key's rows outside its band all come after it, so
 * slice i's outside pass needs the row pieces of the slices after it only,
 * and its row piece the block pass of the next slice. The slices are taken
 * last first, and each runs its block pass, its row piece and its outside
 * pass in turn, waiting where a later slice has not got so far: while its
 * rows (Z, U1, U2, k, v, dk, dv) are still in this core's caches, which a
 * pass over every slice after a barrier found in memory. A later slice is
 * done or running on another thread (the loop hands out slices in order),
 * so the waits end. Every sum is taken as in the passes with barriers
 * between them: the same bits. */
enum { STAGE_NONE, STAGE_BLOCKS, STAGE_PIECE };

static void stage_wait(const gjob *jb, size_t i, int stage)
{
    /* a pause a turn, and the core to another thread now and then (the
     * one waited for may need it: one core, or valgrind, which runs one
     * thread at a time) */
    for (unsigned n = 1; atomic_load_explicit(&jb->stage[i], memory_order_acquire) < stage; n++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (n % 256 == 0) sched_yield();
    }
}

static void causal_slice(const gjob *jb, gscratch *sc, const aft_bias_grad *db, rsum *cur, size_t i)
{
    const size_t ns = jb->ns;
    block_pass(jb, sc, db, i);
    atomic_store_explicit(&jb->stage[i], STAGE_BLOCKS, memory_order_release);
    /* the row piece: rows [t0 + s, t1 + s), of this slice and the next */
    gjob j2 = *jb;
    if (i + 1 < ns) stage_wait(jb, i + 1, STAGE_BLOCKS);
    j2.tame = jb->keys_tame && jb->wtame[i] && (i + 1 == ns || jb->wtame[i + 1]);
    row_pieces(&j2, sc, i);
    atomic_store_explicit(&jb->stage[i], STAGE_PIECE, memory_order_release);
    /* the outside pass: every later slice's piece, and its stabilisers */
    for (size_t k = i + 1; k < ns; k++) stage_wait(jb, k, STAGE_PIECE);
    j2.tame = jb->keys_tame && all_set(jb->wtame + i, ns - i);
    outside_pass(&j2, sc, cur, i);
}

/* Slices a thread (with more than one thread): more of them even out the
 * threads' ends, but each adds its halo, 2 (s - 1) rows of 2C floats, and
 * its own copy of the private bias gradient. */
enum { SLICES_PER_THREAD = 8 };

size_t aft_band_grad_slices(size_t T, size_t s, size_t nt, size_t priv, size_t C)
{
    /* each slice at least a block and 4 s rows: the halos stay under T C
     * floats; the private copies beyond the threads' under T C too */
    size_t tc, rows = s > SIZE_MAX / 4 ? SIZE_MAX : 4 * s, ns = nt * SLICES_PER_THREAD;
    rows = rows > GB_ROWS ? rows : GB_ROWS;
    if (!aft_mul_ok(T, C, &tc)) tc = SIZE_MAX;
    /* one thread: one slice. Slices beyond the threads even out their
     * ends; for one thread they only add their pieces, halos and merges,
     * which cost more than the slices' rows staying in the cache saved, at
     * every T and C tried */
    if (nt <= 1) return 1;
    while (ns > nt && (T / ns < rows || (priv && (ns - nt) > tc / priv))) ns--;
    return ns > 0 ? ns : 1;
}

/* slice sl's halo zeroed (its rows of dv, dk are zeroed as the block pass
 * reaches them), whether its keys are tame (known already when op.c's scan
 * for NaN found them so), and the key sums of its left and right pieces: a left
 * piece serves the slices after, a right one those before (the forward has
 * a right part only without causality) */
static void key_pieces(const gjob *jb, size_t sl)
{
    const aft_opspec *ws = jb->ws;
    const size_t T = jb->T, C = jb->C, s = jb->s, t0 = row0(jb, sl), t1 = row0(jb, sl + 1);
    memset(jb->halo + sl * 2 * jb->hrows * 2 * C, 0, halo_used(jb) * 2 * C * sizeof(float));
    jb->ktame[sl] = (unsigned char)(ws->keys_tame || keys_tame(jb->k, ws->ldk, t0, t1, C));
    jb->wtame[sl] = 1;
    atomic_store_explicit(&jb->stage[sl], STAGE_NONE, memory_order_relaxed);
    float *lp = jb->kp + 2 * sl * 4 * C, *rp = lp + 4 * C;
    size_t la = t0 > s ? t0 - s : 0, le = t1 > s ? t1 - s : 0;
    if (sl + 1 < jb->ns)
        (void)aft_sums_of_rows(jb->k, ws->ldk, jb->v, ws->ldv, la, le, C, lp, lp + C, lp + 2 * C, lp + 3 * C);
    size_t ra = t0 + s < T ? t0 + s : T, re = t1 + s < T ? t1 + s : T;
    if (sl > 0 && !jb->causal)
        (void)aft_sums_of_rows(jb->k, ws->ldk, jb->v, ws->ldv, ra, re, C, rp, rp + C, rp + 2 * C, rp + 3 * C);
}

/* Batch b's passes, inside the threads' parallel region (each loop ends
 * at a barrier): P1 the halos and key pieces; P2 the block pass; P3 the
 * backward's row pieces; P4 the rows outside each key's band, and the
 * halos. The forward alone (AFT_SUMS_WRITE) is P1 and P2's forward. */
static void batch_passes(const gjob *jb, gscratch *sc, aft_bias_grad *mine, rsum *cur, const float *q,
                         const float *k, const float *v, size_t b)
{
    const aft_opspec *ws = jb->ws;
    const aft_grad_io *io = jb->io;
    const size_t T = jb->T, C = jb->C, ns = jb->ns;
    gjob jbb = *jb;
    jbb.b = b;
    jbb.set = io->db_set && b == 0;   /* later sequences add */
    jbb.q = q + b * T * ws->ldq;
    jbb.k = k + b * T * ws->ldk;
    jbb.v = v + b * T * ws->ldv;
    jbb.dout = io->dout ? io->dout + b * T * C : NULL;
    jbb.sums = jb->mode ? io->sums + b * T * 2 * C : NULL;
    #pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < ns; i++) key_pieces(&jbb, i);
    jbb.keys_tame = all_set(jb->ktame, ns);
    if (jb->mode == AFT_SUMS_WRITE) {   /* the forward alone */
        #pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < ns; i++) block_pass(&jbb, sc, &mine[i], i);
        return;
    }
    if (jb->causal) {
        #pragma omp for schedule(dynamic, 1)
        for (size_t n = 0; n < ns; n++) causal_slice(&jbb, sc, &mine[ns - 1 - n], cur, ns - 1 - n);
        return;
    }
    #pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < ns; i++) block_pass(&jbb, sc, &mine[i], i);
    jbb.tame = jbb.keys_tame && all_set(jb->wtame, ns);
    #pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < ns; i++) row_pieces(&jbb, sc, i);
    #pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < ns; i++) outside_pass(&jbb, sc, cur, i);
}

aft_status aft_op_band_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                            const aft_opspec *ws, aft_error *err)
{
    const size_t T = ws->T, C = ws->C, H = ws->heads ? ws->heads : 1, nt = (size_t)ws->threads;
    if (T == 0 || C == 0 || B == 0) return AFT_OK;
    /* w = 0 everywhere (causal simple: a zero bias reaches this kernel only
     * with causality) has no band: the running sums take the diagonal too,
     * s = 0 */
    gjob jb = {.ws = ws, .io = io, .T = T, .C = C, .H = H, .ch = C / H,
               .s = ws->zero_bias ? 0 : aft_spec_band(ws, T),
               .causal = ws->causal, .want_dw = aft_bias_grad_wanted(ws, &io->db)};
    jb.hrows = jb.s ? jb.s - 1 : 0;
    atomic_int spoilt = 0;
    jb.spoilt = &spoilt;
    jb.mode = io->sums && jb.causal ? io->sums_mode : AFT_SUMS_NONE;
    if (jb.mode == AFT_SUMS_WRITE) jb.want_dw = 0;
    jb.ns = aft_band_grad_slices(T, jb.s, nt, aft_bias_grad_private_floats(ws, &io->db), C);
    const size_t ns = jb.ns;
    /* causal: Z, U1, U2 split (zrow) where the slices' first rows are at
     * most a quarter of T and the threads' scratch at most half of it, so
     * the two take less than the whole array */
    jb.zsplit = jb.causal && ns >= 2 * nt && T / ns >= 4 * jb.s;
    /* the forward alone keeps no Z, U1, U2 */
    const int fwd = jb.mode == AFT_SUMS_WRITE;
    jb.zsplit &= !fwd;
    jb.Z = fwd ? NULL
               : jb.zsplit ? aft_alloc_array(ns * (jb.s ? jb.s : 1), 3 * C * sizeof(float))
                           : aft_alloc_array(T, 3 * C * sizeof(float));
    jb.kp = aft_alloc_array(2 * ns, 4 * C * sizeof(float));
    jb.rp = aft_alloc_array(2 * ns, 3 * C * sizeof(float));
    jb.halo = aft_alloc_array(ns * 2 * (jb.hrows ? jb.hrows : 1), 2 * C * sizeof(float));
    jb.ktame = malloc(2 * ns);
    jb.wtame = jb.ktame ? jb.ktame + ns : NULL;
    jb.stage = malloc(ns * sizeof *jb.stage);
    for (size_t i = 0; i < ns && jb.stage; i++) atomic_init(&jb.stage[i], STAGE_NONE);
    /* each slice's private part of the bias gradient */
    aft_bias_grad *mine = calloc(ns, sizeof *mine);
    float **priv = calloc(ns, sizeof *priv);
    weights_table_alloc(&jb, B);
    int failed = (!jb.Z && !fwd) || !jb.kp || !jb.rp || !jb.halo || !jb.ktame || !jb.stage || !mine || !priv;
    for (size_t i = 0; i < ns && !failed; i++) failed = !aft_bias_grad_private(ws, &io->db, &mine[i], &priv[i]);
    if (!failed) {
        #pragma omp parallel num_threads((int)nt)
        {
            gscratch sc;
            int ok = gscratch_alloc(&sc, &jb, (T + ns - 1) / ns);
            /* the running sum of the outside pass: 3C floats */
            float *rs = aft_alloc_array(3 * C, sizeof(float));
            if (!ok || !rs) {
                #pragma omp atomic write
                failed = 1;
            }
            #pragma omp barrier
            if (jb.tew && !failed) {
                const size_t s2 = 2 * jb.s;
                #pragma omp for schedule(static)
                for (size_t x = 0; x < H * T; x++)
                    jb.tok[x] =
                        (unsigned char)row_weights(&jb, x / T, x % T, jb.twr + x * s2, jb.tew + x * s2, &jb.tr[x]);
            }
            for (size_t b = 0; b < B && !failed; b++) {
                rsum cur = {rs, rs + C, rs + 2 * C};
                batch_passes(&jb, &sc, mine, &cur, q, k, v, b);
            }
            free(rs);
            gscratch_free(&sc);
        }
    }
    /* the slices' bias gradients added in slice order: the same bits from
     * run to run, whichever thread took which slice */
    for (size_t i = 0; i < ns && mine && priv; i++) {
        if (!failed && priv[i]) aft_bias_grad_merge(ws, &io->db, &mine[i]);
        free(priv[i]);
    }
    free(mine); free(priv);
    free(jb.Z); free(jb.kp); free(jb.rp); free(jb.halo); free(jb.ktame); free(jb.stage);
    free(jb.twr); free(jb.tok);
    if (failed) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the band backward pass (T = %zu, C = %zu)", T, C);
    if (jb.mode == AFT_SUMS_WRITE && atomic_load(&spoilt)) {
        /* no thread count's tag: a backward makes the sums again (groups
         * of sequences may clear it at once) */
        float none = 0.0f;
        __atomic_store(io->sums_tag, &none, __ATOMIC_RELAXED);
    }
    return AFT_OK;
}
