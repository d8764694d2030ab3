/* linear.c - the layer's projections, y = x W^T + b, with W packed once.
 *
 * The layer multiplies every chunk of rows by the same weights, so aft packs
 * W once per layer call into panels of LIN_NR output features (LIN_KC
 * inputs deep), and each product then only packs its rows of x. The
 * micro-kernel keeps an LIN_MR x LIN_NR tile of y in registers and starts
 * it from the bias, so y is written once and never read back (with inputs
 * deeper than LIN_KC it is read back once a block). The loops are BLIS's:
 * a panel of W (LIN_KC x LIN_NR) stays in L1 while the packed rows of x
 * (LIN_MC x LIN_KC) stream from L2. Rows of x that were just written (the
 * operator's output, before the output projection) are read in place
 * instead of packed: they are in the core's caches already.
 *
 * Builds for AVX/AVX2 (8-float vectors) and AVX-512 (16) use it by default:
 * for the layer's products, many small chunks against one packed W, it
 * runs nearer the FMA peak than OpenBLAS, which packs W again on every
 * call. AFT_KERNEL_BLAS (aft_config.projections) hands every product to
 * OpenBLAS instead. aft_linear_ref beside it is the float64 reference. */
#include "linear.h"
#include "bf16.h"
#include "numerics.h"

#include <omp.h>
#include <stdint.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

/* registers: LIN_MR x LIN_NV accumulators (12 of 16 with AVX2, 24 of 32
 * with AVX-512), LIN_NV loads and one broadcast a step */
#if AFT_VEC_BYTES >= 64
enum { LIN_MR = 12 };
#else
enum { LIN_MR = 6 };
#endif
enum { LIN_NV = 2, LIN_NR = LIN_NV * AFT_VL, LIN_KC = 256, LIN_MC = 96 };
_Static_assert(LIN_MC % LIN_MR == 0, "row blocks hold whole tiles");

void aft_linear_ref(float *y, size_t ldy, const float *x, size_t ldx, const float *w, const float *b,
                    size_t M, size_t K, size_t N)
{
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            double s = b ? (double)b[n] : 0.0;
            for (size_t i = 0; i < K; i++) s += (double)x[m * ldx + i] * (double)w[n * K + i];
            y[m * ldy + n] = (float)s;
        }
}

const char *aft_linear_kernel(void)
{
    if (AFT_VEC_BYTES < 32) return NULL;
    /* the builds that use it by default: 8- and 16-float vectors */
    _Static_assert(AFT_VEC_BYTES != 32 || (LIN_MR == 6 && LIN_NR == 16), "the name below is the tile's");
    _Static_assert(AFT_VEC_BYTES != 64 || (LIN_MR == 12 && LIN_NR == 32), "the name below is the tile's");
    return AFT_VEC_BYTES == 64 ? "aft 12x32" : "aft 6x16";
}

/* 16-bit weights: the panels hold them as stored and the kernels widen
 * them in registers, exactly (every f16 and bf16 value is a float32
 * value), so a product reads half the bytes and gives the bits of the same
 * weights in float32. bf16 is the upper half of a float32: a shift at
 * every level. f16 needs F16C's vcvtph2ps (avx2 and avx512); at base it
 * is packed widened to float32. W_* name the panels' kinds for the
 * kernels, which are compiled once for each. */
enum { W_F32, W_BF16, W_F16 };
#if defined(__F16C__) || defined(__AVX512F__)
#define LIN_F16_IN_REGS 1
#else
#define LIN_F16_IN_REGS 0
#endif

static int lin_wt(aft_dtype dt)
{
    return dt == AFT_BF16 ? W_BF16 : dt == AFT_F16 ? W_F16 : W_F32;
}

static size_t dt_bytes(aft_dtype dt)
{
    return dt == AFT_F16 || dt == AFT_BF16 ? 2 : sizeof(float);
}

/* A row of a panel (LIN_NR = LIN_NV vectors of weights of kind wt, from
 * element i of p), widened into b. bf16 rows are packed interleaved: 32-bit
 * lane j holds feature j in its low half and feature AFT_VL + j in its
 * high half, so one load and two bit operations (a shift, a mask) widen
 * both vectors, no shuffles; f16 goes through F16C's vcvtph2ps. */
_Static_assert(LIN_NV == 2, "the bf16 rows interleave two vectors");
static inline __attribute__((always_inline)) void lin_wrow(const void *restrict p, size_t i, int wt,
                                                          aft_vf b[LIN_NV])
{
    if (wt == W_F32) {
        for (int u = 0; u < LIN_NV; u++) b[u] = aft_vld((const float *)p + i + u * AFT_VL);
        return;
    }
    const uint16_t *h = (const uint16_t *)p + i;
    if (wt == W_BF16) {
        typedef uint32_t vu __attribute__((vector_size(AFT_VEC_BYTES)));
        vu x;
        memcpy(&x, h, sizeof x);
        b[0] = (aft_vf)(x << 16);
        b[1] = (aft_vf)(x & 0xffff0000u);
        return;
    }
#if AFT_VEC_BYTES == 64 && defined(__AVX512F__)
    for (int u = 0; u < LIN_NV; u++)
        b[u] = (aft_vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + u * AFT_VL)));
#elif AFT_VEC_BYTES == 32 && defined(__F16C__)
    for (int u = 0; u < LIN_NV; u++)
        b[u] = (aft_vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + u * AFT_VL)));
#else
    /* not reached: f16 is packed widened where the level has no F16C */
    for (int u = 0; u < LIN_NV; u++)
        for (int j = 0; j < AFT_VL; j++) b[u][j] = aft_f16_to_f32(h[u * AFT_VL + j]);
#endif
}

/* where feature u (< LIN_NR) of a panel row sits in a 16-bit panel of kind wt */
static size_t lin_slot(int wt, size_t u)
{
    return wt == W_BF16 ? 2 * (u % AFT_VL) + u / AFT_VL : u;
}

/* l's sizes and, when aft's kernel runs the product, its packing's block
 * (pk, bpad, npad set, pk not yet filled); 0 when OpenBLAS runs it (with a
 * 16-bit W, wf then holds W widened) */
static aft_status lin_setup(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                            aft_kernel kernel, int threads, int *own, aft_error *err)
{
    memset(l, 0, sizeof *l);
    if (wdt != AFT_F32 && wdt != AFT_F16 && wdt != AFT_BF16)
        return aft_fail(err, AFT_ERR_ARG, "weights of dtype %s: a product takes F32, F16 or BF16",
                        aft_dtype_name(wdt));
    l->n = n;
    l->k = k;
    l->w = w;
    l->wdt = wdt;
    l->pkdt = AFT_F32;
    l->bias = bias;
    l->threads = threads > 0 ? threads : 1;
    *own = kernel == AFT_KERNEL_OWN || (kernel == AFT_KERNEL_AUTO && aft_linear_kernel() != NULL);
    *own = *own && n > 0 && k > 0;
    if (!*own) {
        size_t nk = 0;
        if (wdt == AFT_F32 || n == 0 || k == 0) return AFT_OK;
        if (aft_mul_ok(n, k, &nk)) l->wf = aft_alloc_array(nk, sizeof(float));
        if (!l->wf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory widening weights (%zu x %zu)", n, k);
        for (size_t i = 0; i < nk; i++) l->wf[i] = aft_w_at(w, wdt, i);
        return AFT_OK;
    }
    l->pkdt = wdt == AFT_F16 && !LIN_F16_IN_REGS ? AFT_F32 : wdt;
    /* pk and bpad start on cache lines (malloc gives 16 bytes): a 64-byte
     * load that straddles two lines costs two, and a token's matrix-vector
     * products, which only stream through pk, ran at half the rate. The
     * padding is in the block rather than posix_memalign's, whose split-off
     * ends kept --repeat from reusing freed memory. */
    enum { LINE = 64 };
    size_t es = dt_bytes(l->pkdt);
    size_t npad = (n + LIN_NR - 1) / LIN_NR * LIN_NR, pkb = 0, bytes = 0;
    /* the block: pk (npad k values, to a whole line), bpad, a line's slack */
    int sized = aft_mul_ok(npad, k, &pkb) && aft_mul_ok(pkb, es, &pkb) && aft_add_ok(pkb, LINE - 1, &pkb);
    pkb = pkb / LINE * LINE;
    if (sized && aft_add_ok(npad, LINE / sizeof(float), &bytes) && aft_mul_ok(bytes, sizeof(float), &bytes) &&
        aft_add_ok(bytes, pkb + LINE, &bytes))
        l->mem = aft_alloc_array(bytes, 1);
    if (!l->mem) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for packed weights (%zu x %zu)", n, k);
    l->pk = (void *)(((uintptr_t)l->mem + 63) & ~(uintptr_t)63);
    l->bpad = (float *)((char *)l->pk + pkb);
    l->npad = npad;
    /* two loops, not one with `bias &&` in it: GCC vectorises that one
     * with masked loads from NULL + j, which the CPU skips but qemu's
     * emulation of them (make test-qemu) faults on */
    memset(l->bpad, 0, npad * sizeof(float));
    if (bias) memcpy(l->bpad, bias, n * sizeof(float));
    return AFT_OK;
}

/* block p0 (kc inputs deep) of the packing starts at p0 * npad; panel j of
 * it at j * kc * LIN_NR, laid out [kc][LIN_NR]; features past n are zero.
 * In values of pkdt. */
static size_t lin_panel(const aft_linear *l, size_t p0, size_t kc, size_t j)
{
    return p0 * l->npad + j * kc;
}

/* the packed values from element off on */
static const void *lin_pk(const aft_linear *l, size_t off)
{
    return (const char *)l->pk + off * dt_bytes(l->pkdt);
}

aft_status aft_linear_init(aft_linear *l, const float *w, const float *bias, size_t n, size_t k,
                           aft_kernel kernel, int threads, aft_error *err)
{
    return aft_linear_init_dt(l, w, AFT_F32, bias, n, k, kernel, threads, err);
}

aft_status aft_linear_init_dt(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                              aft_kernel kernel, int threads, aft_error *err)
{
    int own;
    aft_status st = lin_setup(l, w, wdt, bias, n, k, kernel, threads, &own, err);
    if (st || !own) return st;
    if (l->pkdt == AFT_F32) {   /* float32 panels: W's values, widened where W is 16-bit */
        float *pk = l->pk;
        for (size_t p0 = 0; p0 < k; p0 += LIN_KC) {
            size_t kc = k - p0 < LIN_KC ? k - p0 : LIN_KC;
            for (size_t j = 0; j < l->npad; j += LIN_NR) {
                float *dst = pk + lin_panel(l, p0, kc, j);
                for (size_t u = 0; u < LIN_NR; u++) {
                    if (j + u >= n) {
                        for (size_t i = 0; i < kc; i++) dst[i * LIN_NR + u] = 0.0f;
                    } else if (wdt == AFT_F32) {
                        const float *src = (const float *)w + (j + u) * k + p0;
                        for (size_t i = 0; i < kc; i++) dst[i * LIN_NR + u] = src[i];
                    } else {
                        for (size_t i = 0; i < kc; i++) dst[i * LIN_NR + u] = aft_w_at(w, wdt, (j + u) * k + p0 + i);
                    }
                }
            }
        }
        return AFT_OK;
    }
    /* 16-bit panels: the stored bits, copied (bf16's interleaved: lin_wrow) */
    uint16_t *pk = l->pk;
    const int wt = lin_wt(l->pkdt);
    const unsigned char *src = w;
    for (size_t p0 = 0; p0 < k; p0 += LIN_KC) {
        size_t kc = k - p0 < LIN_KC ? k - p0 : LIN_KC;
        for (size_t j = 0; j < l->npad; j += LIN_NR) {
            uint16_t *dst = pk + lin_panel(l, p0, kc, j);
            for (size_t u = 0; u < LIN_NR; u++)
                for (size_t i = 0; i < kc; i++) {
                    uint16_t h = 0;
                    if (j + u < n) memcpy(&h, src + 2 * ((j + u) * k + p0 + i), 2);
                    dst[i * LIN_NR + lin_slot(wt, u)] = h;
                }
        }
    }
    return AFT_OK;
}

aft_dtype aft_linear_dtype(const aft_linear *l)
{
    if (l->bf16) return AFT_BF16;   /* bf16 products (bf16.c): W packed as bf16 pairs */
    return l->pk ? l->pkdt : AFT_F32;
}

aft_status aft_linear_init_t(aft_linear *l, const float *wt, size_t ldwt, size_t n, size_t k, aft_kernel kernel,
                             int threads, aft_error *err)
{
    int own;
    aft_status st = lin_setup(l, wt, AFT_F32, NULL, n, k, kernel, threads, &own, err);
    l->ldwt = ldwt;
    if (st || !own) return st;
    /* a panel's row i is LIN_NR features of W^T's row p0 + i: a copy */
    float *pk = l->pk;
    for (size_t p0 = 0; p0 < k; p0 += LIN_KC) {
        size_t kc = k - p0 < LIN_KC ? k - p0 : LIN_KC;
        for (size_t j = 0; j < l->npad; j += LIN_NR) {
            float *dst = pk + lin_panel(l, p0, kc, j);
            size_t nr = n - j < LIN_NR ? n - j : LIN_NR;
            for (size_t i = 0; i < kc; i++) {
                memcpy(dst + i * LIN_NR, wt + (p0 + i) * ldwt + j, nr * sizeof(float));
                memset(dst + i * LIN_NR + nr, 0, (LIN_NR - nr) * sizeof(float));
            }
        }
    }
    return AFT_OK;
}

void aft_linear_free(aft_linear *l)
{
    if (!l->view) {
        free(l->mem);
        free(l->wf);
    }
    l->mem = NULL;
    l->pk = NULL;
    l->bpad = l->wf = NULL;
    l->pk16 = NULL;
}

aft_status aft_linear_view(aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err)
{
    if (parent->bf16) return aft_linear_bf16_view(v, parent, f0, n, err);
    if (parent->ldwt) return aft_fail(err, AFT_ERR_ARG, "a view of a product given W^T");
    if (f0 > parent->n || n > parent->n - f0)
        return aft_fail(err, AFT_ERR_ARG, "features [%zu, %zu + %zu) of a product with %zu", f0, f0, n, parent->n);
    const void *w = (const char *)parent->w + f0 * parent->k * dt_bytes(parent->wdt);
    const float *bias = parent->bias ? parent->bias + f0 : NULL;
    if (!parent->pk && parent->wf)   /* OpenBLAS: rows of the widened copy */
        return aft_linear_init(v, parent->wf + f0 * parent->k, bias, n, parent->k, AFT_KERNEL_BLAS, parent->threads,
                               err);
    if (!parent->pk || f0 % LIN_NR != 0)
        return aft_linear_init_dt(v, w, parent->wdt, bias, n, parent->k,
                                  parent->pk ? AFT_KERNEL_OWN : AFT_KERNEL_BLAS, parent->threads, err);
    *v = *parent;
    v->n = n;
    v->w = w;
    v->bias = bias;
    v->f0 = parent->f0 + f0;
    v->view = 1;
    return AFT_OK;
}

// c (LIN_MR x LIN_NR, rows ldc apart) = init (one row, each tile row; NULL:
// c itself) + a (LIN_MR x kc: row i, input k at a[i * si + k * sk]) x bp
// (kc x LIN_NR, row k at k * sb: LIN_NR when packed). Callers pass
// constant strides: (1, LIN_MR) for a packed block of rows, (lda, 1) for
// rows read in place; aft_linear_gemm_tn reads a and bp in place.
static inline __attribute__((always_inline)) void
lin_tile_s(size_t kc, const float *restrict a, size_t si, size_t sk, const void *restrict bp, size_t sb,
           float *restrict c, size_t ldc, const float *restrict init, int wt)
{
    aft_vf acc[LIN_MR][LIN_NV];
    if (init) {
        aft_vf iv[LIN_NV];
        #pragma GCC unroll 4
        for (int u = 0; u < LIN_NV; u++) iv[u] = aft_vld(init + u * AFT_VL);
        #pragma GCC unroll 16
        for (int i = 0; i < LIN_MR; i++)
            #pragma GCC unroll 4
            for (int u = 0; u < LIN_NV; u++) acc[i][u] = iv[u];
    } else {
        #pragma GCC unroll 16
        for (int i = 0; i < LIN_MR; i++)
            #pragma GCC unroll 4
            for (int u = 0; u < LIN_NV; u++) acc[i][u] = aft_vld(c + i * ldc + u * AFT_VL);
    }
    #pragma GCC unroll 4
    for (size_t k = 0; k < kc; k++) {
        aft_vf b[LIN_NV];
        lin_wrow(bp, k * sb, wt, b);
        #pragma GCC unroll 16
        for (int i = 0; i < LIN_MR; i++) {
            float ai = a[i * si + k * sk];
            #pragma GCC unroll 4
            for (int u = 0; u < LIN_NV; u++) acc[i][u] += ai * b[u];
        }
    }
    #pragma GCC unroll 16
    for (int i = 0; i < LIN_MR; i++)
        #pragma GCC unroll 4
        for (int u = 0; u < LIN_NV; u++) aft_vst(c + i * ldc + u * AFT_VL, acc[i][u]);
}

/* the tile for packed rows (lin_tile) and for rows in place
 * (lin_tile_rows), one copy for each kind of panel */
#define LIN_TILES(SUF, WT)                                                                                       \
    static void lin_tile_##SUF(size_t kc, const float *restrict ap, const void *restrict bp, float *restrict c,  \
                               size_t ldc, const float *restrict init)                                          \
    {                                                                                                            \
        lin_tile_s(kc, ap, 1, LIN_MR, bp, LIN_NR, c, ldc, init, WT);                                                     \
    }                                                                                                            \
    static void lin_tile_rows_##SUF(size_t kc, const float *restrict a, size_t lda, const void *restrict bp,     \
                                    float *restrict c, size_t ldc, const float *restrict init)                  \
    {                                                                                                            \
        lin_tile_s(kc, a, lda, 1, bp, LIN_NR, c, ldc, init, WT);                                                         \
    }
LIN_TILES(f32, W_F32)
LIN_TILES(bf16, W_BF16)
#if LIN_F16_IN_REGS
LIN_TILES(f16, W_F16)
#endif

static void lin_tile(int wt, size_t kc, const float *restrict ap, const void *restrict bp, float *restrict c,
                     size_t ldc, const float *restrict init)
{
#if LIN_F16_IN_REGS
    if (wt == W_F16) {
        lin_tile_f16(kc, ap, bp, c, ldc, init);
        return;
    }
#endif
    if (wt == W_BF16) lin_tile_bf16(kc, ap, bp, c, ldc, init);
    else lin_tile_f32(kc, ap, bp, c, ldc, init);
}

static void lin_tile_rows(int wt, size_t kc, const float *restrict a, size_t lda, const void *restrict bp,
                          float *restrict c, size_t ldc, const float *restrict init)
{
#if LIN_F16_IN_REGS
    if (wt == W_F16) {
        lin_tile_rows_f16(kc, a, lda, bp, c, ldc, init);
        return;
    }
#endif
    if (wt == W_BF16) lin_tile_rows_bf16(kc, a, lda, bp, c, ldc, init);
    else lin_tile_rows_f32(kc, a, lda, bp, c, ldc, init);
}

// One row of the tile above, across RP panels at once: c + q LIN_NR (1 x
// LIN_NR for panel q < np) = init + q LIN_NR (or c itself) + a (kc inputs,
// in place) x bp + q pstride. Each panel's sums take the same operations in
// the same order as that row of lin_tile_s, so the same bits; for the few
// rows of a last part tile (a token at a time: one row) it does one row's
// work instead of a whole tile's, and the panels' independent sums keep
// the FMA units busy where one panel's would wait on each other.
enum { RP = 4 };
static inline __attribute__((always_inline)) void
lin_row_panels_s(size_t kc, const float *restrict a, const void *restrict bp, size_t pstride, float *restrict c,
                 const float *restrict init, size_t np, int wt)
{
    aft_vf acc[RP][LIN_NV];
    for (size_t q = 0; q < RP; q++)
        #pragma GCC unroll 4
        for (int u = 0; u < LIN_NV; u++)
            acc[q][u] = q < np ? aft_vld((init ? init : c) + q * LIN_NR + u * AFT_VL) : (aft_vf){0};
    if (np == RP) {
        for (size_t k = 0; k < kc; k++) {
            float ak = a[k];
            #pragma GCC unroll 4
            for (int q = 0; q < RP; q++) {
                aft_vf b[LIN_NV];
                lin_wrow(bp, q * pstride + k * LIN_NR, wt, b);
                #pragma GCC unroll 4
                for (int u = 0; u < LIN_NV; u++) acc[q][u] += ak * b[u];
            }
        }
    } else {
        for (size_t k = 0; k < kc; k++) {
            float ak = a[k];
            for (size_t q = 0; q < np; q++) {
                aft_vf b[LIN_NV];
                lin_wrow(bp, q * pstride + k * LIN_NR, wt, b);
                #pragma GCC unroll 4
                for (int u = 0; u < LIN_NV; u++) acc[q][u] += ak * b[u];
            }
        }
    }
    for (size_t q = 0; q < np; q++)
        #pragma GCC unroll 4
        for (int u = 0; u < LIN_NV; u++) aft_vst(c + q * LIN_NR + u * AFT_VL, acc[q][u]);
}

#define LIN_ROW_PANELS(SUF, WT)                                                                                  \
    static void lin_row_panels_##SUF(size_t kc, const float *restrict a, const void *restrict bp,               \
                                     size_t pstride, float *restrict c, const float *restrict init, size_t np)  \
    {                                                                                                            \
        lin_row_panels_s(kc, a, bp, pstride, c, init, np, WT);                                                   \
    }
LIN_ROW_PANELS(f32, W_F32)
LIN_ROW_PANELS(bf16, W_BF16)
#if LIN_F16_IN_REGS
LIN_ROW_PANELS(f16, W_F16)
#endif

static void lin_row_panels(int wt, size_t kc, const float *restrict a, const void *restrict bp, size_t pstride,
                           float *restrict c, const float *restrict init, size_t np)
{
#if LIN_F16_IN_REGS
    if (wt == W_F16) {
        lin_row_panels_f16(kc, a, bp, pstride, c, init, np);
        return;
    }
#endif
    if (wt == W_BF16) lin_row_panels_bf16(kc, a, bp, pstride, c, init, np);
    else lin_row_panels_f32(kc, a, bp, pstride, c, init, np);
}

/* one row of y, columns [0, n): whole panels RP at a time, the last part
 * panel through one on the stack */
static void lin_row(const aft_linear *l, size_t p0, size_t kc, const float *a, float *c)
{
    const size_t n = l->n, full = n / LIN_NR * LIN_NR, pk = p0 * l->npad + l->f0 * kc;
    const float *bias = p0 == 0 ? l->bpad + l->f0 : NULL;
    const int wt = lin_wt(l->pkdt);
    for (size_t j = 0; j < full; j += RP * LIN_NR) {
        size_t np = (full - j) / LIN_NR < RP ? (full - j) / LIN_NR : RP;
        lin_row_panels(wt, kc, a, lin_pk(l, pk + j * kc), kc * LIN_NR, c + j, bias ? bias + j : NULL, np);
    }
    if (full == n) return;
    float t[LIN_NR] = {0};
    if (!bias) memcpy(t, c + full, (n - full) * sizeof(float));
    lin_row_panels(wt, kc, a, lin_pk(l, pk + full * kc), kc * LIN_NR, t, bias ? bias + full : NULL, 1);
    memcpy(c + full, t, (n - full) * sizeof(float));
}

/* a part tile of at most this many rows goes a row at a time */
enum { LIN_ROW_AT_A_TIME = LIN_MR / 2 };

/* a 16-bit panel (kc rows) widened into wb, laid out as a float32 one */
static void lin_widen_panel(const void *bp, size_t kc, int wt, float *wb)
{
    for (size_t k = 0; k < kc; k++) {
        aft_vf b[LIN_NV];
        if (wt == W_BF16) lin_wrow(bp, k * LIN_NR, W_BF16, b);
        else lin_wrow(bp, k * LIN_NR, W_F16, b);
        for (int u = 0; u < LIN_NV; u++) aft_vst(wb + k * LIN_NR + u * AFT_VL, b[u]);
    }
}

// rows [r0, r1) of y; ap: LIN_MC x LIN_KC floats of scratch, and with
// 16-bit panels wb: LIN_KC x LIN_NR more. With in_place whole tiles of rows
// read x where it is (only a last part tile is packed)
static void lin_rows(const aft_linear *l, size_t r0, size_t r1, const float *x, size_t ldx, float *y,
                     size_t ldy, float *ap, float *wb, int in_place)
{
    const size_t n = l->n, k = l->k;
    const int wt16 = lin_wt(l->pkdt);
    for (size_t ic = r0; ic < r1; ic += LIN_MC) {
        size_t mc = r1 - ic < LIN_MC ? r1 - ic : LIN_MC;
        for (size_t p0 = 0; p0 < k; p0 += LIN_KC) {
            size_t kc = k - p0 < LIN_KC ? k - p0 : LIN_KC;
            /* the rows' inputs [p0, p0 + kc), LIN_MR rows interleaved;
             * rows past mc are zero */
            size_t tail = mc % LIN_MR, packed = tail && tail <= LIN_ROW_AT_A_TIME ? mc - tail : mc;
            for (size_t ir = in_place ? mc / LIN_MR * LIN_MR : 0; ir < packed; ir += LIN_MR)
                for (size_t i = 0; i < LIN_MR; i++) {
                    float *dst = ap + ir * kc + i;
                    if (ir + i < mc) {
                        const float *src = x + (ic + ir + i) * ldx + p0;
                        for (size_t q = 0; q < kc; q++) dst[q * LIN_MR] = src[q];
                    } else {
                        for (size_t q = 0; q < kc; q++) dst[q * LIN_MR] = 0.0f;
                    }
                }
            for (size_t j = 0; j < n; j += LIN_NR) {
                const void *bp = lin_pk(l, p0 * l->npad + (l->f0 + j) * kc);
                int wt = wt16;
                /* a 16-bit panel that two or more tiles read: widened once
                 * (the same floats), and the float32 tiles run; for one
                 * tile the kernel widens in registers */
                if (wt != W_F32 && wb && packed >= 2 * LIN_MR) {
                    lin_widen_panel(bp, kc, wt, wb);
                    bp = wb;
                    wt = W_F32;
                }
                const float *init = p0 == 0 ? l->bpad + l->f0 + j : NULL;
                size_t nr = n - j < LIN_NR ? n - j : LIN_NR;
                for (size_t ir = 0; ir < mc; ir += LIN_MR) {
                    size_t mr = mc - ir < LIN_MR ? mc - ir : LIN_MR;
                    float *c = y + (ic + ir) * ldy + j;
                    const float *xr = x + (ic + ir) * ldx + p0;
                    if (ir >= packed) break;   /* the last few rows: below */
                    /* the next tile's rows of y, asked for now: each is a
                     * row of y away, in a buffer the call has not touched
                     * yet, and the tile's stores waited on each line (the
                     * backward pass's first products, Q, K, V and dy Wo,
                     * took 7.9 ms where they took 8.4 to 8.8) */
                    if (p0 == 0 && ir + 2 * LIN_MR <= mc)
                        for (size_t i = 0; i < LIN_MR; i++) aft_lines_prefetch(c + (LIN_MR + i) * ldy, nr, 1);
                    int rows = in_place && mr == LIN_MR;   /* read in place */
                    if (mr == LIN_MR && nr == LIN_NR) {
                        if (rows) lin_tile_rows(wt, kc, xr, ldx, bp, c, ldy, init);
                        else lin_tile(wt, kc, ap + ir * kc, bp, c, ldy, init);
                        continue;
                    }
                    /* an edge tile: through a full one on the stack */
                    float t[LIN_MR * LIN_NR];
                    if (!init) {   /* the sums so far; zeros where the tile overhangs */
                        memset(t, 0, sizeof t);
                        for (size_t i = 0; i < mr; i++) memcpy(t + i * LIN_NR, c + i * ldy, nr * sizeof(float));
                    }
                    if (rows) lin_tile_rows(wt, kc, xr, ldx, bp, t, LIN_NR, init);
                    else lin_tile(wt, kc, ap + ir * kc, bp, t, LIN_NR, init);
                    for (size_t i = 0; i < mr; i++) memcpy(c + i * ldy, t + i * LIN_NR, nr * sizeof(float));
                }
            }
            /* a few rows: one at a time, x in place */
            for (size_t i = packed; i < mc; i++) lin_row(l, p0, kc, x + (ic + i) * ldx + p0, y + (ic + i) * ldy);
        }
    }
}

void aft_linear_apply(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy)
{
    aft_linear_apply_x(l, M, x, ldx, y, ldy, 0);
}

void aft_linear_apply_x(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy,
                        int x_cached)
{
    if (M == 0 || l->n == 0) return;
    if (l->k == 0) {   /* no inputs: the bias alone */
        for (size_t m = 0; m < M; m++)
            for (size_t j = 0; j < l->n; j++) y[m * ldy + j] = l->bias ? l->bias[j] : 0.0f;
        return;
    }
    if (l->bf16) {   /* W packed as bf16 (bf16.c) */
        aft_linear_bf16_apply(l, M, x, ldx, y, ldy);
        return;
    }
    size_t nt = omp_in_parallel() ? 1 : (size_t)l->threads;
    size_t tiles = (M + LIN_MR - 1) / LIN_MR;
    if (nt > tiles) nt = tiles;
    /* per thread: LIN_MC x LIN_KC floats for x's rows, and for 16-bit
     * panels LIN_KC x LIN_NR to widen one into */
    const size_t per_thread = LIN_MC * LIN_KC + (l->pkdt != AFT_F32 ? LIN_KC * LIN_NR : 0);
    float *ap = l->pk ? aft_alloc_array(nt, per_thread * sizeof(float)) : NULL;
    if (!ap && l->pk && l->wdt != AFT_F32) {   /* no scratch, and W is 16-bit: a row at a time, in place */
        for (size_t m = 0; m < M; m++)
            for (size_t p0 = 0; p0 < l->k; p0 += LIN_KC)
                lin_row(l, p0, l->k - p0 < LIN_KC ? l->k - p0 : LIN_KC, x + m * ldx + p0, y + m * ldy);
        return;
    }
    if (!ap) {   /* not packed, or no scratch: OpenBLAS needs none of ours */
        const float *w = l->wdt == AFT_F32 ? l->w : l->wf;
        if (l->ldwt) aft_gemm(l->threads, 0, M, l->n, l->k, x, ldx, w, l->ldwt, NULL, y, ldy);
        else aft_gemm(l->threads, 1, M, l->n, l->k, x, ldx, w, l->k, l->bias, y, ldy);
        return;
    }
    /* whole tiles to each thread, as even as they come */
    size_t per = (tiles + nt - 1) / nt * LIN_MR;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1)
    for (size_t p = 0; p < nt; p++) {
        size_t r0 = p * per < M ? p * per : M, r1 = r0 + per < M ? r0 + per : M;
        float *tap = ap + p * per_thread, *wb = l->pkdt != AFT_F32 ? tap + LIN_MC * LIN_KC : NULL;
        if (r0 < r1) lin_rows(l, r0, r1, x, ldx, y, ldy, tap, wb, x_cached);
    }
    free(ap);
}

/* ---- C = A^T B (aft_gemm_tn, a weight's gradient) on the tile, A (K x
 * M) and B (K x N) read in place: a tile's LIN_MR rows of C are LIN_MR
 * adjacent floats of each row of A, and a panel's LIN_NR columns LIN_NR
 * adjacent floats of each row of B, so neither is packed (OpenBLAS packs
 * both, and packing B for aft's kernel cost as much as the kernel won).
 * A part tile or part panel is copied, zero-padded, into scratch. */

static void lin_tn_tile(size_t kc, const float *restrict a, size_t sk, const float *restrict b, size_t sb,
                        float *restrict c, size_t ldc, const float *restrict init)
{
    lin_tile_s(kc, a, 1, sk, b, sb, c, ldc, init, W_F32);
}

/* rows [r0, r1) of C; ab: LIN_KC x LIN_MR floats, bb: LIN_KC x LIN_NR */
static void lin_tn_rows(size_t r0, size_t r1, size_t N, size_t K, const float *A, size_t lda, const float *B,
                        size_t ldb, float *C, size_t ldc, float *ab, float *bb)
{
    static const float zero[LIN_NR];
    for (size_t p0 = 0; p0 < K; p0 += LIN_KC) {
        size_t kc = K - p0 < LIN_KC ? K - p0 : LIN_KC;
        const float *init = p0 == 0 ? zero : NULL;
        for (size_t j = 0; j < N; j += LIN_NR) {
            size_t nr = N - j < LIN_NR ? N - j : LIN_NR, sb = ldb;
            const float *bp = B + p0 * ldb + j;
            if (nr < LIN_NR) {
                for (size_t q = 0; q < kc; q++) {
                    memcpy(bb + q * LIN_NR, bp + q * ldb, nr * sizeof(float));
                    memset(bb + q * LIN_NR + nr, 0, (LIN_NR - nr) * sizeof(float));
                }
                bp = bb;
                sb = LIN_NR;
            }
            for (size_t ir = r0; ir < r1; ir += LIN_MR) {
                size_t mr = r1 - ir < LIN_MR ? r1 - ir : LIN_MR, sk = lda;
                const float *ap = A + p0 * lda + ir;
                float *c = C + ir * ldc + j;
                if (mr < LIN_MR) {   /* not past A's columns: its last row would overrun */
                    for (size_t q = 0; q < kc; q++) {
                        memcpy(ab + q * LIN_MR, ap + q * lda, mr * sizeof(float));
                        memset(ab + q * LIN_MR + mr, 0, (LIN_MR - mr) * sizeof(float));
                    }
                    ap = ab;
                    sk = LIN_MR;
                }
                if (mr == LIN_MR && nr == LIN_NR) {
                    lin_tn_tile(kc, ap, sk, bp, sb, c, ldc, init);
                    continue;
                }
                float t[LIN_MR * LIN_NR];   /* an edge tile, as lin_rows's */
                if (!init) {
                    memset(t, 0, sizeof t);
                    for (size_t i = 0; i < mr; i++) memcpy(t + i * LIN_NR, c + i * ldc, nr * sizeof(float));
                }
                lin_tn_tile(kc, ap, sk, bp, sb, t, LIN_NR, init);
                for (size_t i = 0; i < mr; i++) memcpy(c + i * ldc, t + i * LIN_NR, nr * sizeof(float));
            }
        }
    }
}

int aft_linear_gemm_tn(int threads, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B,
                       size_t ldb, float *C, size_t ldc)
{
    if (AFT_VEC_BYTES < 64 || M == 0 || N == 0 || K == 0) return 0;
    size_t nt = omp_in_parallel() ? 1 : (size_t)(threads > 0 ? threads : 1);
    size_t tiles = (M + LIN_MR - 1) / LIN_MR;
    if (nt > tiles) nt = tiles;
    const size_t per_thread = LIN_KC * (LIN_MR + LIN_NR);
    float *scratch = aft_alloc_array(nt, per_thread * sizeof(float));
    if (!scratch) return 0;   /* OpenBLAS then */
    /* whole tiles to each thread: a row's sums do not depend on the split */
    size_t per = (tiles + nt - 1) / nt * LIN_MR;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1)
    for (size_t p = 0; p < nt; p++) {
        size_t r0 = p * per < M ? p * per : M, r1 = r0 + per < M ? r0 + per : M;
        float *ab = scratch + p * per_thread;
        if (r0 < r1) lin_tn_rows(r0, r1, N, K, A, lda, B, ldb, C, ldc, ab, ab + LIN_KC * LIN_MR);
    }
    free(scratch);
    return 1;
}

