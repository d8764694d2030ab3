/* blas.c - the binding interface leaves OpenBLAS's thread count as the
 * caller had it (api.h, API_BLAS). In one process there is one OpenBLAS
 * (a binding's host, PyTorch, loaded it too), and its thread count is
 * process-wide: aft's products want 1 (gemm.c: aft's own threads make the
 * calls), the caller's products theirs. The first entry point in sets 1,
 * the last out puts the caller's count back; OpenBLAS's OpenMP build moves
 * OpenMP's default with it, which is put back as it was each time. */
#include "api.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>

static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;
static int blas_users;    /* entry points running */
static int blas_caller;   /* the count before the first of them */

static void blas_set(int n)
{
    int omp = omp_get_max_threads();
    openblas_set_num_threads(n);
    omp_set_num_threads(omp);
}

void api_blas_enter(void)
{
    pthread_mutex_lock(&blas_mu);
    if (blas_users++ == 0) {
        blas_caller = openblas_get_num_threads();
        if (blas_caller != 1) blas_set(1);
    }
    pthread_mutex_unlock(&blas_mu);
}

aft_status api_blas_leave(aft_status st)
{
    pthread_mutex_lock(&blas_mu);
    if (--blas_users == 0 && blas_caller != 1 && openblas_get_num_threads() != blas_caller) blas_set(blas_caller);
    pthread_mutex_unlock(&blas_mu);
    return st;
}
