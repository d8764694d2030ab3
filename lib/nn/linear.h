/* linear.h - matrix products: the layer's projections (linear.c) and
 * products split over aft's threads (gemm.c). */
#ifndef AFT_LINEAR_H
#define AFT_LINEAR_H

#include "internal.h"

#include <stdint.h>

/* C (M x N) = A (M x K) op(B) (+ bias, one value per column, when not NULL);
 * op(B) = B (K x N, rows ldb apart) or, trans_b, B^T with B (N x K). Row-major.
 * Split over `threads` threads (one single-threaded cblas_sgemm each); one
 * call when already inside a parallel region. */
/* OpenBLAS on one thread a call, set once before the first product (every
 * caller of cblas_sgemm in lib/ calls this first) */
void aft_blas_one_thread(void);
void aft_gemm(int threads, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
              const float *B, size_t ldb, const float *bias, float *C, size_t ldc);
/* C (M x N) = A^T B, A (K x M), B (K x N): a weight's gradient summed over
 * K rows, on aft's tile where it has one (aft_linear_gemm_tn), else the
 * rows of C split as aft_gemm's */
void aft_gemm_tn(int threads, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B, size_t ldb,
                 float *C, size_t ldc);

/* y (M x n, rows ldy apart) = x (M x k, rows ldx apart) W^T + bias, W
 * (n x k) like PyTorch's Linear, bias (n) or NULL. init packs W once when
 * aft's own kernel runs the product (kernel AFT_KERNEL_AUTO: where
 * aft_linear_kernel() names one; AFT_KERNEL_OWN: always; AFT_KERNEL_BLAS:
 * never, OpenBLAS's sgemm); W and bias must outlive l. apply splits the rows
 * over `threads` threads (1 inside a parallel region); a row's result does
 * not depend on the split. */
typedef struct {
    size_t n, k, npad;
    const void *w;      /* W as given: wdt's values */
    aft_dtype wdt;      /* AFT_F32, AFT_F16 or AFT_BF16 */
    const float *bias;
    size_t ldwt;        /* aft_linear_init_t: w is W^T, rows ldwt apart; else 0 */
    void *pk;           /* packed W, pkdt's values; NULL: OpenBLAS */
    aft_dtype pkdt;     /* what pk holds: wdt (the kernel widens 16 bits in
                         * registers), or AFT_F32 where this level has no
                         * f16 conversion (base: SSE2) */
    float *bpad;        /* the bias padded to npad features (the packing's,
                         * a view's too) */
    float *wf;          /* OpenBLAS with a 16-bit W: W widened to float32
                         * (owned unless a view) */
    void *mem;          /* the block holding pk and bpad, pk on a cache line in it */
    size_t f0;          /* a view (aft_linear_view): features from f0 of pk */
    int view;           /* pk, bpad, wf belong to another aft_linear */
    int threads;
    /* aft_linear_init_bf16 with an engine (bf16.h): W as bf16 pairs in
     * pk16 (in mem, pk NULL, bpad the padded bias), from W stored at wsrc
     * as wsrc_dt (after W16's change, w and wdt hold the same) */
    int bf16;
    uint32_t *pk16;
    const void *wsrc;
    aft_dtype wsrc_dt;
} aft_linear;
aft_status aft_linear_init(aft_linear *l, const float *w, const float *bias, size_t n, size_t k,
                           aft_kernel kernel, int threads, aft_error *err);
/* the same with W (n x k) in float32, f16 or bf16 (wdt: AFT_F32, AFT_F16,
 * AFT_BF16; the values as stored, 2 bytes each for 16 bits, any alignment).
 * A 16-bit W stays 16-bit in the packed panels and aft's kernel widens it
 * in registers (bf16: a shift; f16: F16C's vcvtph2ps, from avx2 up); at
 * base f16 is packed widened, and where OpenBLAS runs the product it reads
 * a widened copy. Widening is exact: y has the bits a float32 W of the same
 * values gives. Bias is float32. */
aft_status aft_linear_init_dt(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                              aft_kernel kernel, int threads, aft_error *err);
/* the dtype l's weights are held in for its products: pkdt when packed,
 * AFT_F32 when OpenBLAS runs them, AFT_BF16 for bf16 products
 * (aft_linear_init_bf16 with an engine) */
aft_dtype aft_linear_dtype(const aft_linear *l);
/* the same product from W^T: wt (k x n, rows ldwt apart), no bias (the
 * backward pass's dy Wo and dQKV Wcat). No views of it. */
aft_status aft_linear_init_t(aft_linear *l, const float *wt, size_t ldwt, size_t n, size_t k, aft_kernel kernel,
                             int threads, aft_error *err);
void aft_linear_apply(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy);
/* the same, the same bits; with x_cached aft's kernel reads x's rows in
 * place instead of packing them first: for rows just written, in this
 * core's caches, and for the backward pass's products, whose rows it
 * streamed faster in place than packed */
void aft_linear_apply_x(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy,
                        int x_cached);
void aft_linear_free(aft_linear *l);
/* aft_gemm_tn's product, C = A^T B, on aft's tile with A and B read in
 * place: 1 when it ran it, else 0 and C untouched */
int aft_linear_gemm_tn(int threads, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B,
                       size_t ldb, float *C, size_t ldc);
/* v = features [f0, f0 + n) of parent (rows f0.. of its W and bias), using
 * parent's packing where it can (f0 on a panel's edge; else v packs its
 * own): free v with aft_linear_free before parent. */
aft_status aft_linear_view(aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err);
/* the same product as loops accumulating in double */
void aft_linear_ref(float *y, size_t ldy, const float *x, size_t ldx, const float *w, const float *b,
                    size_t M, size_t K, size_t N);
/* the name of aft's projection kernel in this build ("aft 6x16", "aft
 * 12x32"), NULL when there is none (a build with 4-float vectors: OpenBLAS
 * runs every projection) */
const char *aft_linear_kernel(void);

#endif /* AFT_LINEAR_H */
