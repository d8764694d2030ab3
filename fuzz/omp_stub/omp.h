/* omp.h - a stand-in for the OpenMP runtime header, for the fuzz build only.
 *
 * The fuzz targets compile the lib/ sources with clang without -fopenmp: the
 * `#pragma omp` lines are then ignored and everything runs on one thread,
 * which is what a fuzzer wants. This header (found first through
 * -Ifuzz/omp_stub) declares the few runtime functions lib/ calls, and
 * fuzz/omp_stub.c defines them, so the build needs neither libomp's header
 * nor its library. */
#ifndef AFT_FUZZ_OMP_STUB_H
#define AFT_FUZZ_OMP_STUB_H

void omp_set_num_threads(int n);
int omp_get_num_threads(void);
int omp_get_max_threads(void);
int omp_get_thread_num(void);
int omp_get_num_procs(void);
int omp_in_parallel(void);

#endif
