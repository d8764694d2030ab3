/* system.c - clocks, peak memory, threads, and which BLAS kernel runs. */
#include "nn/linear.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* OpenBLAS's own entry points used here, all declared by Debian's cblas.h:
 * openblas_get_corename, openblas_get_config (and, in gemm.c,
 * openblas_set_num_threads). */

int aft_cores(void)
{
    /* the cores this process may run on: taskset, a container's cpuset or
     * srun's binding of each task can leave it fewer than the machine's,
     * and a thread a core it does not have would wait on the others */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

int aft_threads_or_all(int threads)
{
    return threads > 0 ? threads : aft_cores();
}

double aft_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

size_t aft_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024;  /* Linux reports KiB */
}

void aft_blas_get_info(aft_blas_info *info, aft_kernel projections)
{
    memset(info, 0, sizeof *info);
    const char *cfg = openblas_get_config();
    /* the config string starts "OpenBLAS 0.3.21 ..." : keep name and version */
    const char *sp = cfg ? strchr(cfg, ' ') : NULL;
    if (sp) sp = strchr(sp + 1, ' ');
    size_t n = sp ? (size_t)(sp - cfg) : (cfg ? strlen(cfg) : 0);
    if (n >= sizeof info->library) n = sizeof info->library - 1;
    if (cfg) memcpy(info->library, cfg, n);
    const char *core = openblas_get_corename();
    snprintf(info->core, sizeof info->core, "%s", core ? core : "unknown");
    const char *lin = projections == AFT_KERNEL_BLAS ? NULL : aft_linear_kernel();
    snprintf(info->projections, sizeof info->projections, "%s", lin ? lin : "OpenBLAS");
}
