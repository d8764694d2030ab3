/* bf16.c - products with bf16 operands and float32 sums (bf16.h).
 *
 * Compiled once per kernel level like the other kernels; only the avx512
 * level's copy has an engine. Its functions that use AVX512_BF16 carry
 * their own target attribute (the level's -march=x86-64-v4 lacks it), and
 * run only when aft_arch_bf16 found it on this CPU.
 *
 * vdpbf16ps adds to each float32 lane the two products of a pair of bf16
 * values from each source: lane j of acc += a[2j] b[2j] + a[2j+1] b[2j+1].
 * So both operands are packed as pairs along the inner dimension k: a
 * 32-bit word holds (k = 2q, k = 2q + 1) of one row of A, broadcast to every
 * lane, or of one column of B, a lane each. The loops are BLIS's, as
 * linear.c's: a block of B (G_KC deep, G_NC wide) packed once per block of
 * k, blocks of rows of A (G_MC x G_KC) packed against it, and a G_MR x G_NR
 * tile of C in 24 of the 32 registers, its B panel (G_KC x G_NR bf16, 16
 * KiB) in L1 while A's panels stream from L2. Odd k is padded with a zero
 * pair half in both operands (0 x 0 adds nothing); columns past N and rows
 * past M are zeros in the packing and masked out of C's loads and stores.
 */
#include "bf16.h"
#include "cpu/arch.h"
#include "numerics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

const char *aft_bf16_engine_name(aft_bf16_engine e)
{
    switch (e) {
    case AFT_BF16_AVX512: return "avx512_bf16";
    case AFT_BF16_AMX: return "amx";
    default: return "none";
    }
}

/* ---------------------------------------------------------------- float32, where there is no engine */

/* aft_gemm's split (gemm.c) with trans_a and beta: parts of 16 rows or
 * columns, rows when each thread gets two such blocks, one single-threaded
 * cblas_sgemm each */
enum { F32_ALIGN = 16 };
static void f32_part(int ta, int tb, size_t m0, size_t m1, size_t n0, size_t n1, size_t K, const float *A,
                     size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    if (m1 <= m0 || n1 <= n0) return;
    const float *Ap = ta ? A + m0 : A + m0 * lda, *Bp = tb ? B + n0 * ldb : B + n0;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)(m1 - m0),
                (int)(n1 - n0), (int)K, 1.0f, Ap, (int)lda, Bp, (int)ldb, beta, C + m0 * ldc + n0, (int)ldc);
}

static void f32_gemm(int threads, int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda,
                     const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    aft_blas_one_thread();
    size_t nt = (size_t)(threads > 0 ? threads : 1);
    int by_rows = M >= 2 * F32_ALIGN * nt;
    if (nt <= 1 || omp_in_parallel() || (!by_rows && N < 2 * F32_ALIGN * nt)) {
        f32_part(ta, tb, 0, M, 0, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    size_t len = by_rows ? M : N, step = (len + nt - 1) / nt;
    step = (step + F32_ALIGN - 1) / F32_ALIGN * F32_ALIGN;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt)
    for (size_t p = 0; p < nt; p++) {
        size_t a = p * step < len ? p * step : len, b = a + step < len ? a + step : len;
        if (by_rows) f32_part(ta, tb, a, b, 0, N, K, A, lda, B, ldb, beta, C, ldc);
        else f32_part(ta, tb, 0, M, a, b, K, A, lda, B, ldb, beta, C, ldc);
    }
}

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define BF16_ENGINE 1
#else
#define BF16_ENGINE 0
#endif

#if BF16_ENGINE
/* ---------------------------------------------------------------- the AVX512_BF16 engine */

#include <immintrin.h>

#define BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

static aft_bf16_engine engine = AFT_BF16_NONE;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static void engine_probe(void)
{
    int avx512bf16, amx;
    aft_arch_bf16(&avx512bf16, &amx);
    /* AMX has no kernel here; every AMX CPU has AVX512_BF16 too */
    engine = avx512bf16 ? AFT_BF16_AVX512 : AFT_BF16_NONE;
}

aft_bf16_engine aft_bf16_engine_now(void)
{
    pthread_once(&engine_once, engine_probe);
    return engine;
}

/* the tile: G_MR rows x G_NR columns (G_NV vectors of 16); G_KC inputs a
 * block (even: pairs), G_MC rows of A a block, G_NC columns of B */
enum { G_MR = 12, G_NV = 2, G_NR = 16 * G_NV, G_KC = 256, G_KP = G_KC / 2, G_MC = 96, G_NC = 512 };
_Static_assert(G_KC % 2 == 0 && G_MC % G_MR == 0 && G_NC % G_NR == 0, "blocks of whole pairs and tiles");

static inline uint32_t pair(float lo, float hi)
{
    return (uint32_t)aft_bf16_round(lo) | (uint32_t)aft_bf16_round(hi) << 16;
}

/* how a tile's sums start: from C (C += the product), from beta C, or from
 * init (one value a column, NULL: zero) without reading C */
enum { FROM_C, FROM_BETA_C, FROM_INIT };

// c (mr x nr of a G_MR x G_NR tile, rows ldc apart) = start + a (G_MR rows x kp
// pairs, row i's pair q at a[i si + q sq]) x bp (kp pairs x G_NR, packed), in
// float32. Callers pass the strides of a packed block: (kp, 1), a row's pairs
// side by side (pack_a's rows), or (1, G_MR), a pair's rows side by side.
BF16_TARGET static inline __attribute__((always_inline)) void
tile_s(size_t kp, const uint32_t *restrict a, size_t si, size_t sq, const uint32_t *restrict bp, float *restrict c,
       size_t ldc, size_t mr, size_t nr, int from, float beta, const float *restrict init)
{
    __m512 acc[G_MR][G_NV];
    __mmask16 mk[G_NV];
    for (int u = 0; u < G_NV; u++) {
        size_t cols = nr > 16u * u ? nr - 16u * u : 0;
        mk[u] = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    }
    #pragma GCC unroll 12
    for (int i = 0; i < G_MR; i++)
        #pragma GCC unroll 2
        for (int u = 0; u < G_NV; u++) {
            if (from != FROM_INIT && (size_t)i < mr) {
                __m512 v = _mm512_maskz_loadu_ps(mk[u], c + i * ldc + 16 * u);
                acc[i][u] = from == FROM_BETA_C ? _mm512_mul_ps(v, _mm512_set1_ps(beta)) : v;
            } else {
                acc[i][u] = init && from == FROM_INIT ? _mm512_maskz_loadu_ps(mk[u], init + 16 * u)
                                                      : _mm512_setzero_ps();
            }
        }
    for (size_t q = 0; q < kp; q++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * G_NR), b1 = (__m512bh)_mm512_loadu_si512(bp + q * G_NR + 16);
        #pragma GCC unroll 12
        for (int i = 0; i < G_MR; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * si + q * sq]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
        }
    }
    #pragma GCC unroll 12
    for (int i = 0; i < G_MR; i++)
        if ((size_t)i < mr)
            #pragma GCC unroll 2
            for (int u = 0; u < G_NV; u++) _mm512_mask_storeu_ps(c + i * ldc + 16 * u, mk[u], acc[i][u]);
}

/* a block packed by rows (pack_a, A not transposed) */
BF16_TARGET static void tile_rows(size_t kp, const uint32_t *restrict a, const uint32_t *restrict bp, float *restrict c,
                                  size_t ldc, size_t mr, size_t nr, int from, float beta, const float *restrict init)
{
    tile_s(kp, a, kp, 1, bp, c, ldc, mr, nr, from, beta, init);
}

/* a block packed by pairs (pack_a, A transposed) */
BF16_TARGET static void tile_pairs(size_t kp, const uint32_t *restrict a, const uint32_t *restrict bp,
                                   float *restrict c, size_t ldc, size_t mr, size_t nr, int from, float beta,
                                   const float *restrict init)
{
    tile_s(kp, a, 1, G_MR, bp, c, ldc, mr, nr, from, beta, init);
}

/* n <= 16 lanes' mask */
static inline __mmask16 lanes(size_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* 16 pairs: (lo[c], hi[c]) for c < n (n <= 16; NULL hi: zeros), zero
 * words past n; rounded to nearest even by vcvtneps2bf16 */
BF16_TARGET static inline __m512i pairs16(const float *lo, const float *hi, size_t n)
{
    __mmask16 m = lanes(n);
    __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, lo)));
    if (!hi) return l;
    __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, hi)));
    return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

/* rows [i0, i0 + mc) of op(A), inputs [k0, k0 + kc), in panels of G_MR
 * rows: A not transposed, each panel [row][pair] (a row's 2 kp inputs
 * converted 32 at a time, vcvtne2ps2bf16); A transposed (K x M), each
 * [pair][row] (two rows of A, 12 columns). Rows past mc and the odd input's
 * other half are zero. The instructions round as aft_bf16_round does, but
 * take a denormal operand as zero (vdpbf16ps does too). */
BF16_TARGET static void pack_a(int ta, const float *A, size_t lda, size_t i0, size_t mc, size_t k0, size_t kc,
                               uint32_t *ap)
{
    size_t kp = (kc + 1) / 2;
    for (size_t ir = 0; ir < mc; ir += G_MR) {
        uint32_t *dst = ap + ir * kp;
        size_t mr = mc - ir < G_MR ? mc - ir : G_MR;
        if (!ta) {
            for (size_t r = 0; r < G_MR; r++) {
                uint32_t *row = dst + r * kp;
                if (r >= mr) {
                    memset(row, 0, kp * sizeof *row);
                    continue;
                }
                const float *src = A + (i0 + ir + r) * lda + k0;
                for (size_t k = 0; k < kc; k += 32) {
                    size_t left = kc - k, nlo = left < 16 ? left : 16, nhi = left > 16 ? left - 16 : 0;
                    __m512 lo = _mm512_maskz_loadu_ps(lanes(nlo), src + k),
                           hi = _mm512_maskz_loadu_ps(lanes(nhi), src + k + 16);
                    _mm512_mask_storeu_epi32(row + k / 2, lanes((left + 1) / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                }
            }
        } else {
            for (size_t q = 0; q < kp; q++) {
                const float *s0 = A + (k0 + 2 * q) * lda + i0 + ir, *s1 = 2 * q + 1 < kc ? s0 + lda : NULL;
                _mm512_mask_storeu_epi32(dst + q * G_MR, lanes(G_MR), pairs16(s0, s1, mr));
            }
        }
    }
}

/* columns [j0, j0 + nc) of op(B), inputs [k0, k0 + kc): panels of G_NR
 * columns, each [pair q][column c]; columns past nc zero. B not transposed:
 * two rows of B, 16 columns at a time; transposed (N x K): a column's
 * inputs are side by side, paired one by one. */
BF16_TARGET static void pack_b(int tb, const float *B, size_t ldb, size_t j0, size_t nc, size_t k0, size_t kc,
                               uint32_t *bp)
{
    size_t kp = (kc + 1) / 2, kh = kc / 2;
    for (size_t jr = 0; jr < nc; jr += G_NR) {
        uint32_t *dst = bp + jr * kp;
        size_t nr = nc - jr < G_NR ? nc - jr : G_NR;
        if (!tb) {
            for (size_t q = 0; q < kp; q++) {
                const float *s0 = B + (k0 + 2 * q) * ldb + j0 + jr, *s1 = 2 * q + 1 < kc ? s0 + ldb : NULL;
                for (size_t u = 0; u < G_NV; u++) {
                    size_t n = nr > 16 * u ? nr - 16 * u : 0;
                    _mm512_storeu_si512(dst + q * G_NR + 16 * u,
                                        pairs16(s0 + 16 * u, s1 ? s1 + 16 * u : NULL, n));
                }
            }
        } else {
            for (size_t c = 0; c < G_NR; c++) {
                if (c >= nr) {
                    for (size_t q = 0; q < kp; q++) dst[q * G_NR + c] = 0;
                    continue;
                }
                const float *src = B + (j0 + jr + c) * ldb + k0;
                for (size_t q = 0; q < kh; q++) dst[q * G_NR + c] = pair(src[2 * q], src[2 * q + 1]);
                if (kc & 1) dst[kh * G_NR + c] = pair(src[kc - 1], 0.0f);
            }
        }
    }
}

/* rows [m0, m1) x columns [n0, n1) of C; ap: G_MC x G_KP words, bp: G_NC x
 * G_KP */
static void bf16_part(int ta, int tb, size_t m0, size_t m1, size_t n0, size_t n1, size_t K, const float *A,
                      size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc, uint32_t *ap,
                      uint32_t *bp)
{
    for (size_t jc = n0; jc < n1; jc += G_NC) {
        size_t nc = n1 - jc < G_NC ? n1 - jc : G_NC;
        for (size_t pc = 0; pc < K; pc += G_KC) {
            size_t kc = K - pc < G_KC ? K - pc : G_KC, kp = (kc + 1) / 2;
            int from = pc > 0 ? FROM_C : beta == 0.0f ? FROM_INIT : beta == 1.0f ? FROM_C : FROM_BETA_C;
            pack_b(tb, B, ldb, jc, nc, pc, kc, bp);
            for (size_t ic = m0; ic < m1; ic += G_MC) {
                size_t mc = m1 - ic < G_MC ? m1 - ic : G_MC;
                pack_a(ta, A, lda, ic, mc, pc, kc, ap);
                for (size_t jr = 0; jr < nc; jr += G_NR)
                    for (size_t ir = 0; ir < mc; ir += G_MR)
                        (ta ? tile_pairs : tile_rows)(kp, ap + ir * kp, bp + jr * kp, C + (ic + ir) * ldc + jc + jr,
                                                      ldc, mc - ir < G_MR ? mc - ir : G_MR,
                                                      nc - jr < G_NR ? nc - jr : G_NR, from, beta, NULL);
            }
        }
    }
}

/* one part with its own packing buffers; float32 when they cannot be had */
static void bf16_part_alloc(int ta, int tb, size_t m0, size_t m1, size_t n0, size_t n1, size_t K, const float *A,
                            size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    if (m1 <= m0 || n1 <= n0) return;
    uint32_t *ap = aft_alloc_array((size_t)(G_MC + G_NC) * G_KP, sizeof(uint32_t));
    if (!ap) {
        f32_part(ta, tb, m0, m1, n0, n1, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    bf16_part(ta, tb, m0, m1, n0, n1, K, A, lda, B, ldb, beta, C, ldc, ap, ap + (size_t)G_MC * G_KP);
    free(ap);
}

void aft_gemm_bf16(int threads, int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
                   const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    if (M == 0 || N == 0) return;
    if (aft_bf16_engine_now() == AFT_BF16_NONE) {
        f32_gemm(threads, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (K == 0) {   /* no products: beta C */
        for (size_t i = 0; i < M; i++)
            for (size_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    /* aft_gemm's split: rows when each thread gets two blocks of them,
     * else columns, else one part; rows in whole tiles of both kernels'
     * sizes (12 and 16), columns in whole tiles */
    enum { ROW_ALIGN = 48 };
    size_t nt = (size_t)(threads > 0 ? threads : 1);
    int by_rows = M >= 2 * F32_ALIGN * nt;
    if (nt <= 1 || omp_in_parallel() || (!by_rows && N < 2 * F32_ALIGN * nt)) {
        bf16_part_alloc(trans_a, trans_b, 0, M, 0, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    size_t len = by_rows ? M : N, align = by_rows ? ROW_ALIGN : G_NR, step = (len + nt - 1) / nt;
    step = (step + align - 1) / align * align;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt)
    for (size_t p = 0; p < nt; p++) {
        size_t a = p * step < len ? p * step : len, b = a + step < len ? a + step : len;
        if (by_rows) bf16_part_alloc(trans_a, trans_b, a, b, 0, N, K, A, lda, B, ldb, beta, C, ldc);
        else bf16_part_alloc(trans_a, trans_b, 0, M, a, b, K, A, lda, B, ldb, beta, C, ldc);
    }
}

/* ---------------------------------------------------------------- projections */

/* W's element i (float32, f16 or bf16 storage) as a bf16 value: a bf16 W
 * as it is, the others rounded */
static inline uint16_t w_bf16(const void *w, aft_dtype dt, size_t i)
{
    uint16_t h;
    switch (dt) {
    case AFT_BF16: memcpy(&h, (const char *)w + 2 * i, 2); return h;
    case AFT_F16: memcpy(&h, (const char *)w + 2 * i, 2); return aft_bf16_round(aft_f16_to_f32(h));
    default: return aft_bf16_round(((const float *)w)[i]);
    }
}

aft_status aft_linear_init_bf16(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                                int threads, aft_error *err)
{
    if (aft_bf16_engine_now() == AFT_BF16_NONE)
        return aft_linear_init_dt(l, w, wdt, bias, n, k, AFT_KERNEL_AUTO, threads, err);
    memset(l, 0, sizeof *l);
    if (wdt != AFT_F32 && wdt != AFT_F16 && wdt != AFT_BF16)
        return aft_fail(err, AFT_ERR_ARG, "weights of dtype %s in a bf16 product (float32, f16 or bf16)",
                        aft_dtype_name(wdt));
    l->n = n;
    l->k = k;
    l->bias = bias;
    l->threads = threads > 0 ? threads : 1;
    l->bf16 = 1;
    l->wsrc = w;
    l->wsrc_dt = wdt;
    if (n == 0 || k == 0) return AFT_OK;   /* apply writes the bias alone */
    /* the block: the pairs (npad x (k + 1) / 2 words, whole lines since
     * npad is a multiple of 32), the padded bias, a line's slack */
    size_t npad = (n + G_NR - 1) / G_NR * G_NR, words = 0, total = 0;
    if (aft_mul_ok(npad, (k + 1) / 2, &words) && aft_add_ok(words, npad + 16, &total))
        l->mem = aft_alloc_array(total, sizeof(uint32_t));
    if (!l->mem) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for bf16 packed weights (%zu x %zu)", n, k);
    l->pk16 = (uint32_t *)(((uintptr_t)l->mem + 63) & ~(uintptr_t)63);
    l->bpad = (float *)(l->pk16 + words);
    l->npad = npad;
    memset(l->bpad, 0, npad * sizeof(float));
    if (bias) memcpy(l->bpad, bias, n * sizeof(float));
    /* block p0 (kc inputs) starts at p0 / 2 npad words, its panel j at
     * j (kc + 1) / 2, laid out [pair][G_NR] as pack_b's */
    for (size_t p0 = 0; p0 < k; p0 += G_KC) {
        size_t kc = k - p0 < G_KC ? k - p0 : G_KC, kp = (kc + 1) / 2;
        uint32_t *blk = l->pk16 + p0 / 2 * npad;
        for (size_t j = 0; j < npad; j++) {
            uint32_t *dst = blk + j / G_NR * G_NR * kp + j % G_NR;
            for (size_t q = 0; q < kp; q++) {
                size_t i = j * k + p0 + 2 * q;
                uint32_t lo = j < n ? w_bf16(w, wdt, i) : 0, hi = j < n && 2 * q + 1 < kc ? w_bf16(w, wdt, i + 1) : 0;
                dst[q * G_NR] = lo | hi << 16;
            }
        }
    }
    return AFT_OK;
}

aft_status aft_linear_bf16_view(aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err)
{
    if (f0 > parent->n || n > parent->n - f0)
        return aft_fail(err, AFT_ERR_ARG, "features [%zu, %zu + %zu) of a product with %zu", f0, f0, n, parent->n);
    const void *w = (const char *)parent->wsrc + f0 * parent->k * aft_dtype_size(parent->wsrc_dt);
    const float *bias = parent->bias ? parent->bias + f0 : NULL;
    if (!parent->pk16 || f0 % G_NR != 0)   /* its own packing */
        return aft_linear_init_bf16(v, w, parent->wsrc_dt, bias, n, parent->k, parent->threads, err);
    *v = *parent;
    v->n = n;
    v->wsrc = w;
    v->bias = bias;
    v->f0 = parent->f0 + f0;
    v->view = 1;
    return AFT_OK;
}

/* rows [r0, r1) of y; ap: G_MC x G_KP words of scratch */
static void lin_rows(const aft_linear *l, size_t r0, size_t r1, const float *x, size_t ldx, float *y, size_t ldy,
                     uint32_t *ap)
{
    const size_t n = l->n, k = l->k;
    for (size_t ic = r0; ic < r1; ic += G_MC) {
        size_t mc = r1 - ic < G_MC ? r1 - ic : G_MC;
        for (size_t p0 = 0; p0 < k; p0 += G_KC) {
            size_t kc = k - p0 < G_KC ? k - p0 : G_KC, kp = (kc + 1) / 2;
            pack_a(0, x, ldx, ic, mc, p0, kc, ap);
            const uint32_t *blk = l->pk16 + p0 / 2 * l->npad + l->f0 * kp;
            for (size_t j = 0; j < n; j += G_NR)
                for (size_t ir = 0; ir < mc; ir += G_MR)
                    tile_rows(kp, ap + ir * kp, blk + j * kp, y + (ic + ir) * ldy + j, ldy,
                         mc - ir < G_MR ? mc - ir : G_MR, n - j < G_NR ? n - j : G_NR, p0 == 0 ? FROM_INIT : FROM_C,
                         1.0f, p0 == 0 ? l->bpad + l->f0 + j : NULL);
        }
    }
}

void aft_linear_bf16_apply(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy)
{
    size_t nt = omp_in_parallel() ? 1 : (size_t)l->threads, tiles = (M + G_MR - 1) / G_MR;
    if (nt > tiles) nt = tiles;
    /* whole tiles to each thread, as even as they come */
    size_t per = (tiles + nt - 1) / nt * G_MR;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1)
    for (size_t p = 0; p < nt; p++) {
        size_t r0 = p * per < M ? p * per : M, r1 = r0 + per < M ? r0 + per : M;
        uint32_t ap[G_MC * G_KP] __attribute__((aligned(64)));   /* 48 KiB */
        if (r0 < r1) lin_rows(l, r0, r1, x, ldx, y, ldy, ap);
    }
}

/* ---------------------------------------------------------------- the machine's rate */

BF16_TARGET static double peak_one(void)
{
    /* 24 independent sums, as the tile keeps: the instruction's throughput,
     * not its latency */
    enum { CHAINS = 24, STEPS = 1 << 14, ROUNDS = 16 };
    __m512 acc[CHAINS];
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps(0.0f);
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    double best = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = aft_now_ms();
        for (int s = 0; s < STEPS; s++) {
            __asm__("" : "+v"(a), "+v"(b));
            #pragma GCC unroll 24
            for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        }
        double dt = aft_now_ms() - t0;
        if (dt < best) best = dt;
    }
    float sink[16];
    __m512 s = acc[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, acc[i]);
    _mm512_storeu_ps(sink, s);
    __asm__ volatile("" : : "r"(sink) : "memory");
    return (double)CHAINS * STEPS * 64.0 / (best * 1e6);
}

double aft_bf16_peak(int threads)
{
    if (aft_bf16_engine_now() == AFT_BF16_NONE) return 0.0;
    int nt = threads > 0 ? threads : 1;
    double sum = 0.0;
    #pragma omp parallel for num_threads(nt) reduction(+ : sum) schedule(static, 1)
    for (int p = 0; p < nt; p++) sum += peak_one();
    return sum;
}

double aft_bf16_rate(int threads)
{
    if (aft_bf16_engine_now() == AFT_BF16_NONE) return 0.0;
    const size_t n = 2048;
    float *a = aft_alloc_array(n * n, sizeof(float)), *b = aft_alloc_array(n * n, sizeof(float)),
          *c = aft_alloc_array(n * n, sizeof(float));
    double best = 1e30;
    if (a && b && c) {
        for (size_t i = 0; i < n * n; i++) {
            a[i] = (float)(i % 13) * 0.01f;
            b[i] = (float)(i % 7) * 0.01f;
        }
        for (int r = 0; r < 3; r++) {
            double t0 = aft_now_ms();
            aft_gemm_bf16(threads, 0, 0, n, n, n, a, n, b, n, 0.0f, c, n);
            double dt = aft_now_ms() - t0;
            if (dt < best) best = dt;
        }
    }
    free(a);
    free(b);
    free(c);
    return best < 1e30 ? 2.0 * (double)n * n * n / (best * 1e6) : 0.0;
}

#else /* ---------------------------------------------------------------- no engine at this level */

aft_bf16_engine aft_bf16_engine_now(void)
{
    return AFT_BF16_NONE;
}

void aft_gemm_bf16(int threads, int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
                   const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    if (M == 0 || N == 0) return;
    f32_gemm(threads, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

aft_status aft_linear_init_bf16(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                                int threads, aft_error *err)
{
    return aft_linear_init_dt(l, w, wdt, bias, n, k, AFT_KERNEL_AUTO, threads, err);
}

/* never reached: no aft_linear is marked bf16 at this level */
void aft_linear_bf16_apply(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy)
{
    (void)l, (void)M, (void)x, (void)ldx, (void)y, (void)ldy;
}

aft_status aft_linear_bf16_view(aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err)
{
    (void)v, (void)parent, (void)f0, (void)n;
    return aft_fail(err, AFT_ERR_ARG, "a bf16 product at a kernel level without bf16 arithmetic");
}

double aft_bf16_peak(int threads)
{
    (void)threads;
    return 0.0;
}

double aft_bf16_rate(int threads)
{
    (void)threads;
    return 0.0;
}

#endif
