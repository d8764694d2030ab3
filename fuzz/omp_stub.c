/* omp_stub.c - the OpenMP runtime functions of fuzz/omp_stub/omp.h for a
 * build without -fopenmp: one thread, always. */
#include "omp.h"

void omp_set_num_threads(int n)
{
    (void)n;
}

int omp_get_num_threads(void)
{
    return 1;
}

int omp_get_max_threads(void)
{
    return 1;
}

int omp_get_thread_num(void)
{
    return 0;
}

int omp_get_num_procs(void)
{
    return 1;
}

int omp_in_parallel(void)
{
    return 0;
}
