/*
 * test_levels.c - the kernel levels (lib/cpu/levels.c): the levels built
 * in, the choice of the highest this CPU runs, aft_level_use's refusals,
 * and that the entry points reach the level in use (its projection kernel
 * is the one of its vector width).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "nn/linear.h"

static void test_levels_listed(void **state)
{
    (void)state;
    size_t n;
    const aft_level *lv = aft_levels(&n);
    assert_true(n >= 1);
    /* the lowest runs wherever the binary does; names are distinct */
    assert_true(lv[0].runs);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(lv[i].name);
        assert_non_null(lv[i].needs);
        if (!lv[i].runs) assert_true(strlen(lv[i].why) > 0);
        for (size_t j = 0; j < i; j++) assert_string_not_equal(lv[i].name, lv[j].name);
    }
    /* a level runs only if every one below it does */
    for (size_t i = 1; i < n; i++)
        if (lv[i].runs) assert_true(lv[i - 1].runs);
}

static void test_the_highest_runs(void **state)
{
    (void)state;
    size_t n, in = aft_level_in_use();
    const aft_level *lv = aft_levels(&n);
    assert_true(in < n);
    assert_true(lv[in].runs);
    const char *want = getenv("AFT_KERNELS");
    if (want && *want) {
        assert_string_equal(lv[in].name, want);   /* the test's constructor chose it */
    } else {
        for (size_t i = in + 1; i < n; i++) assert_false(lv[i].runs);
    }
}

/* the projection kernel of each vector width: none (OpenBLAS) at 4
 * floats, 6x16 tiles at 8, 12x32 at 16 */
static void test_entries_reach_the_level(void **state)
{
    (void)state;
    size_t n, in = aft_level_in_use();
    const char *name = aft_levels(&n)[in].name, *lin = aft_linear_kernel();
    if (strcmp(name, "base") == 0) assert_null(lin);
    else if (strcmp(name, "avx2") == 0) assert_string_equal(lin, "aft 6x16");
    else if (strcmp(name, "avx512") == 0) assert_string_equal(lin, "aft 12x32");
}

static void test_refusals(void **state)
{
    (void)state;
    size_t n, in = aft_level_in_use();
    const aft_level *lv = aft_levels(&n);
    aft_error err = {{0}};
    assert_int_equal(aft_level_use("sse9", &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "'sse9' is not a kernel level of this build ("));
    assert_non_null(strstr(err.msg, lv[0].name));
    /* the level in use again: nothing to change */
    assert_int_equal(aft_level_use(lv[in].name, &err), AFT_OK);
    for (size_t i = 0; i < n; i++) {
        if (i == in) continue;
        memset(&err, 0, sizeof err);
        assert_int_equal(aft_level_use(lv[i].name, &err), AFT_ERR_ARG);
        const char *says = lv[i].runs ? "the kernels already run at level " : lv[i].why;
        if (!strstr(err.msg, says)) fail_msg("aft_level_use(%s): '%s', wanted '%s'", lv[i].name, err.msg, says);
    }
    assert_int_equal(aft_level_in_use(), in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_listed),
        cmocka_unit_test(test_the_highest_runs),
        cmocka_unit_test(test_entries_reach_the_level),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
