/* system.c - clocks, memory figures, thread count, and which BLAS kernel runs. */
#include "internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* OpenBLAS's own entry points used here, all declared by Debian's cblas.h:
 * openblas_get_corename, openblas_get_config, openblas_set_num_threads. */

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

static int n_threads = 0;

void aft_set_threads(int n)
{
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    n_threads = n;
    omp_set_num_threads(n);
    /* aft splits products over its own threads (gemm.c): OpenBLAS keeps one */
    openblas_set_num_threads(1);
}

int aft_get_threads(void)
{
    if (n_threads == 0) aft_set_threads(0);
    return n_threads;
}

void aft_blas_get_info(aft_blas_info *info)
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
    info->threads = aft_get_threads();
    const char *lin = aft_linear_kernel();
    snprintf(info->projections, sizeof info->projections, "%s", lin ? lin : "OpenBLAS");
}

/* Kernels that use AVX-512; anything else on an AVX-512 CPU leaves most of
 * the matrix-product speed unused. */
static int core_has_avx512(const char *core)
{
    static const char *const names[] = {"skylakex", "cooperlake", "sapphirerapids"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(core, names[i]) == 0) return 1;
    return 0;
}

const char *aft_blas_better_coretype(void)
{
    __builtin_cpu_init();
    int cpu_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512cd");
    if (!cpu_avx512) return NULL;
    const char *core = openblas_get_corename();
    if (!core || core_has_avx512(core)) return NULL;
    return "SkylakeX";
}
