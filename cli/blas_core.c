/* blas_core.c - asks OpenBLAS again for its kernels when the ones it chose
 * on loading are the fallback for a CPU it does not know.
 *
 * OpenBLAS's DYNAMIC_ARCH build picks its kernels from the CPU's family and
 * model when the library loads. A release older than the CPU finds no entry
 * and falls back to Prescott's SSE3 kernels: Debian 12's OpenBLAS 0.3.21 on
 * an Emerald Rapids Xeon (family 6, model 207) multiplies 2048^3 at 42
 * GFLOP/s there against 311 with its SkylakeX kernels, and `aft grad`, whose
 * products are OpenBLAS's, ran at a quarter to a half of its speed. When the user has
 * not chosen a core (OPENBLAS_CORETYPE), the core is that fallback, and the
 * CPU runs AVX-512 or AVX2 with FMA, aft names the newest kernels it runs
 * and has OpenBLAS choose again, before any product: gotoblas_dynamic_quit
 * and gotoblas_dynamic_init are what OpenBLAS runs itself on loading and
 * unloading. A BLAS without them (not a DYNAMIC_ARCH OpenBLAS) is left as
 * it is. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

/* OpenBLAS's kernels for the highest of aft's kernel levels that this CPU
 * and its OS run (lib/cpu's one probe: cpuid and xgetbv): SkylakeX for
 * avx512 (x86-64-v4), Haswell for avx2 (x86-64-v3); NULL for none better
 * than SSE3. A build of one level (make ARCH=...) has no levels to ask:
 * the flags it was compiled with, which every CPU it runs on has, say. */
static const char *best_core(void)
{
    size_t n;
    const aft_level *lv = aft_levels(&n);
    const char *core = NULL;
    for (size_t i = 0; i < n; i++) {   /* lowest first */
        if (!lv[i].runs) continue;
        if (strcmp(lv[i].name, "avx512") == 0) core = "SkylakeX";
        else if (strcmp(lv[i].name, "avx2") == 0) core = "Haswell";
    }
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
    if (!core) core = "SkylakeX";
#elif defined(__AVX2__) && defined(__FMA__)
    if (!core) core = "Haswell";
#endif
    return core;
}

void cli_blas_core(void)
{
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit || getenv("OPENBLAS_CORETYPE")) return;
    aft_blas_info bi;
    aft_blas_get_info(&bi, AFT_KERNEL_AUTO);
    const char *core = best_core();
    if (strcasecmp(bi.core, "Prescott") != 0 || !core) return;
    /* OpenBLAS reads the choice from its environment variable, and only
     * there; it is taken back at once, so nothing aft starts inherits it */
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
}
