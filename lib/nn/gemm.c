/* gemm.c - matrix products on aft's own threads.
 *
 * OpenBLAS runs with one thread (blas_one_thread below) and aft splits
 * each product into parts, one single-threaded cblas_sgemm per OpenMP
 * thread. Two thread pools on one machine fight: a pool's idle workers spin
 * for a while after every product and take the cores from the other's
 * threads. With one pool nothing spins, and the parts of a product and the
 * work around them share threads. A part's entries mostly come out as the
 * whole product's would, but not always: OpenBLAS's edge kernels sum some
 * shapes in another order (a split by columns at M = 5, or K = 113 at
 * M = 96, differ in the last bits), so the thread count can change the
 * bits here. Where they must not change (the training step's gradients),
 * the products run on aft's own tile, whose every entry sums its inputs in
 * one order whatever the split.
 *
 * aft_gemm_tn (a weight's gradient, A^T B) runs on aft's own tile where
 * the build has one (linear.c, aft_linear_gemm_tn): it reads A and B in
 * place where OpenBLAS packs both, and ran the training step's weight
 * gradients faster.
 */
#include "linear.h"

#include <pthread.h>

#include <cblas.h>
#include <omp.h>

/* parts are multiples of 16 rows (or columns): the kernel's register block */
enum { PART_ALIGN = 16 };

/* rows [m0, m1) and columns [n0, n1) of C = op(A) op(B) (+ bias); op(A)
 * = A^T with A (K x M) when trans_a */
static void gemm_part(int trans_a, int trans_b, size_t m0, size_t m1, size_t n0, size_t n1, size_t K,
                      const float *A, size_t lda, const float *B, size_t ldb,
                      const float *bias, float *C, size_t ldc)
{
    if (m1 <= m0 || n1 <= n0) return;
    if (bias)
        for (size_t i = m0; i < m1; i++) memcpy(C + i * ldc + n0, bias + n0, (n1 - n0) * sizeof(float));
    const float *Ap = trans_a ? A + m0 : A + m0 * lda;
    const float *Bp = trans_b ? B + n0 * ldb : B + n0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (int)(m1 - m0), (int)(n1 - n0), (int)K, 1.0f, Ap, (int)lda, Bp, (int)ldb, bias ? 1.0f : 0.0f,
                C + m0 * ldc + n0, (int)ldc);
}

/* OpenBLAS on one thread a call: aft's threads each make their own calls.
 * OpenBLAS's OpenMP build sets OpenMP's default thread count along with its
 * own, so that is put back as it was: the caller's OpenMP code keeps its
 * setting. Checked at every product, not once: the binding interface
 * (lib/api/blas.c) sets 1 for its calls and puts the caller's count back
 * after, and a call of aft.h's own functions after that needs 1 again. */
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;

void aft_blas_one_thread(void)
{
    if (openblas_get_num_threads() == 1) return;
    pthread_mutex_lock(&blas_mu);
    if (openblas_get_num_threads() != 1) {
        int n = omp_get_max_threads();
        openblas_set_num_threads(1);
        omp_set_num_threads(n);
    }
    pthread_mutex_unlock(&blas_mu);
}

void aft_gemm(int threads, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
              const float *B, size_t ldb, const float *bias, float *C, size_t ldc)
{
    aft_blas_one_thread();
    size_t nt = (size_t)(threads > 0 ? threads : 1);
    if (nt <= 1 || omp_in_parallel()) {
        gemm_part(0, trans_b, 0, M, 0, N, K, A, lda, B, ldb, bias, C, ldc);
        return;
    }
    /* split the rows when every thread gets at least two blocks of them,
     * else the columns, else nothing */
    int by_rows = M >= 2 * PART_ALIGN * nt;
    size_t len = by_rows ? M : N;
    if (!by_rows && N < 2 * PART_ALIGN * nt) {
        gemm_part(0, trans_b, 0, M, 0, N, K, A, lda, B, ldb, bias, C, ldc);
        return;
    }
    size_t step = (len + nt - 1) / nt;
    step = (step + PART_ALIGN - 1) / PART_ALIGN * PART_ALIGN;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt)
    for (size_t p = 0; p < nt; p++) {
        size_t a = p * step < len ? p * step : len, b = a + step < len ? a + step : len;
        if (by_rows) gemm_part(0, trans_b, a, b, 0, N, K, A, lda, B, ldb, bias, C, ldc);
        else gemm_part(0, trans_b, 0, M, a, b, K, A, lda, B, ldb, bias, C, ldc);
    }
}

void aft_gemm_tn(int threads, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B, size_t ldb,
                 float *C, size_t ldc)
{
    if (aft_linear_gemm_tn(threads, M, N, K, A, lda, B, ldb, C, ldc)) return;
    aft_blas_one_thread();
    size_t nt = (size_t)(threads > 0 ? threads : 1);
    if (nt <= 1 || omp_in_parallel()) {
        gemm_part(1, 0, 0, M, 0, N, K, A, lda, B, ldb, NULL, C, ldc);
        return;
    }
    /* the rows of C (columns of A), whole register blocks to each thread */
    size_t step = (M + nt - 1) / nt;
    step = (step + PART_ALIGN - 1) / PART_ALIGN * PART_ALIGN;
    #pragma omp parallel for schedule(static, 1) num_threads((int)nt)
    for (size_t p = 0; p < nt; p++) {
        size_t a = p * step < M ? p * step : M, b = a + step < M ? a + step : M;
        gemm_part(1, 0, a, b, 0, N, K, A, lda, B, ldb, NULL, C, ldc);
    }
}
