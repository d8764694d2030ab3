/* levels.c - which level runs the kernels: the levels built in, whether
 * this CPU and OS run each (arch.h), the choice, made once. */
#include "arch.h"
#include "table.h"

#include <pthread.h>

/* A build of one level (make ARCH=...) compiles the kernels with the
 * build's own flags, AFT_FIXED_LEVEL, into aft_kernels_fixed. */
#ifdef AFT_FIXED_LEVEL
static const aft_arch_level built[] = {{"fixed", "this build's flags: " AFT_FIXED_LEVEL}};
extern const aft_kernel_table aft_kernels_fixed;
static const aft_kernel_table *const tables[] = {&aft_kernels_fixed};
#define built_runs(i, why, cap) 1
#else
#define built aft_arch_levels
#define AFT_DECLARE_TABLE(n) extern const aft_kernel_table aft_kernels_##n;
AFT_ARCH_LEVEL_NAMES(AFT_DECLARE_TABLE)
#define AFT_TABLE_ADDRESS(n) &aft_kernels_##n,
static const aft_kernel_table *const tables[] = {AFT_ARCH_LEVEL_NAMES(AFT_TABLE_ADDRESS)};
#define built_runs aft_arch_runs
#endif
enum { NLEVELS = sizeof tables / sizeof tables[0] };
_Static_assert(sizeof built / sizeof built[0] == NLEVELS, "a table for each level");

static aft_level levels[NLEVELS];
static pthread_once_t probed = PTHREAD_ONCE_INIT;
/* the level in use, -1 until chosen; read and set atomically, since the
 * first kernel call may come from several threads at once */
static int in_use = -1;

static void probe(void)
{
    for (size_t i = 0; i < NLEVELS; i++) {
        levels[i].name = built[i].name;
        levels[i].needs = built[i].needs;
        levels[i].runs = built_runs(i, levels[i].why, sizeof levels[i].why);
    }
}

const aft_level *aft_levels(size_t *n)
{
    pthread_once(&probed, probe);
    *n = NLEVELS;
    return levels;
}

/* sets the level in use to i unless one is set; the one in use */
static int settle(int i)
{
    int none = -1;
    if (__atomic_compare_exchange_n(&in_use, &none, i, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return i;
    return none;
}

size_t aft_level_in_use(void)
{
    int i = __atomic_load_n(&in_use, __ATOMIC_ACQUIRE);
    if (i >= 0) return (size_t)i;
    size_t n;
    const aft_level *lv = aft_levels(&n);
    int best = 0;
    for (size_t j = 1; j < n; j++)
        if (lv[j].runs) best = (int)j;
    return (size_t)settle(best);
}

const aft_kernel_table *aft_kernels_now(void)
{
    int i = __atomic_load_n(&in_use, __ATOMIC_ACQUIRE);
    return tables[i >= 0 ? (size_t)i : aft_level_in_use()];
}

aft_status aft_level_use(const char *name, aft_error *err)
{
    size_t n, i = 0;
    const aft_level *lv = aft_levels(&n);
    while (i < n && strcmp(lv[i].name, name) != 0) i++;
    if (i == n) {
        char known[128] = "";
        for (size_t j = 0; j < n; j++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", lv[j].name);
        return aft_fail(err, AFT_ERR_ARG, "'%s' is not a kernel level of this build (%s)", name, known);
    }
    if (!lv[i].runs) return aft_fail(err, AFT_ERR_ARG, "kernel level %s needs %s: %s", name, lv[i].needs, lv[i].why);
    size_t now = (size_t)settle((int)i);
    if (now != i)
        return aft_fail(err, AFT_ERR_ARG, "the kernels already run at level %s: choose one before the first",
                        now < n ? lv[now].name : "?");
    return AFT_OK;
}
