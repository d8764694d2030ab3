/*
 * test_levels.c - the CPU level of aft's kernels from the command line:
 * aft --version names the one in use and the levels built in, AFT_KERNELS
 * chooses another (every level this CPU runs, each named back by
 * --version and --timing, its output within the float64 tolerance of the
 * default level's), and a name that is no level of this CPU is refused in
 * one line before anything is written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "harness.h"

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* the value of "NAME: " on a line of --version's output, malloc'd */
static char *version_field(const char *out, const char *name)
{
    char *key = harness_fmt("\n%s: ", name);
    const char *at = strstr(out, key);
    if (!at) fail_msg("aft --version has no '%s:' line:\n%s", name, out);
    at += strlen(key);
    free(key);
    return strndup(at, strcspn(at, "\n"));
}

/* aft --version under AFT_KERNELS=want (NULL: unset), stdout malloc'd */
static char *version_with(const char *want)
{
    if (want) setenv("AFT_KERNELS", want, 1);
    else unsetenv("AFT_KERNELS");
    harness_result r;
    assert_int_equal(harness_run(&r, ARGS("--version"), NULL, 0), 0);
    unsetenv("AFT_KERNELS");
    if (r.exit_code != 0) fail_msg("AFT_KERNELS=%s aft --version: exit %d\n%s", want, r.exit_code, r.err);
    char *out = strdup(r.out);
    harness_result_free(&r);
    return out;
}

/* the levels built in, and whether this CPU runs each (the library's own
 * answer: the test program links the same library) */
static void test_version_names_the_level(void **state)
{
    (void)state;
    /* under make test-valgrind aft runs under valgrind, which shows another
     * CPU than this program sees */
    if (!harness_aft_is_binary()) skip();
    char *out = version_with(NULL);
    assert_true(strncmp(out, "aft " AFT_VERSION "\n", strlen("aft " AFT_VERSION "\n")) == 0);
    char *in_use = version_field(out, "kernels"), *built = version_field(out, "kernel levels");
    size_t n;
    const aft_level *lv = aft_levels(&n);
    /* "kernel levels: base avx2 avx512 (this CPU and OS run base avx2)" */
    char *want = harness_fmt("%s", "");
    const char *highest = lv[0].name;
    for (size_t i = 0; i < n; i++) {
        char *w = harness_fmt("%s%s%s", want, i ? " " : "", lv[i].name);
        free(want), want = w;
        if (lv[i].runs) highest = lv[i].name;
    }
    if (strncmp(built, want, strlen(want)) != 0 || built[strlen(want)] != ' ')
        fail_msg("kernel levels: '%s', the library has '%s'", built, want);
    /* unforced, the highest this CPU runs, and why */
    char *head = harness_fmt("%s (", highest);
    if (strncmp(in_use, head, strlen(head)) != 0) fail_msg("kernels: '%s', want the highest, %s", in_use, highest);
    assert_non_null(strstr(in_use, "this CPU and OS run"));
    free(head), free(want), free(in_use), free(built), free(out);
}

static void test_every_level_forced(void **state)
{
    (void)state;
    if (!harness_aft_is_binary()) skip();
    unsetenv("AFT_KERNELS");
    char *x = harness_fmt("%s/torch/rish_local/x.npy", harness_testdata());
    char *y0 = harness_tmp("y_default.npy");
    harness_result r;
    assert_int_equal(harness_run(&r, ARGS("run", "--variant", "local", "--window", "4", "-o", y0, x), NULL, 0), 0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    size_t n;
    const aft_level *lv = aft_levels(&n);
    for (size_t i = 0; i < n; i++) {
        if (!lv[i].runs) continue;
        char *out = version_with(lv[i].name), *in_use = version_field(out, "kernels");
        char *want = harness_fmt("%s (chosen by AFT_KERNELS)", lv[i].name);
        assert_string_equal(in_use, want);
        free(out), free(in_use), free(want);

        char *y = harness_tmp("y_level.npy"), *t = harness_tmp("t_level.json");
        setenv("AFT_KERNELS", lv[i].name, 1);
        assert_int_equal(harness_run(&r, ARGS("run", "--variant", "local", "--window", "4", "--timing", t, "-o", y, x),
                                     NULL, 0), 0);
        unsetenv("AFT_KERNELS");
        if (r.exit_code != 0) fail_msg("AFT_KERNELS=%s aft run: exit %d\n%s", lv[i].name, r.exit_code, r.err);
        harness_result_free(&r);
        char *json;
        assert_int_equal(harness_read_file(t, &json, NULL), 0);
        cJSON *j = cJSON_Parse(json);
        assert_non_null(j);
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "kernels")), lv[i].name);
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "kernels_why")), "chosen by AFT_KERNELS");
        cJSON_Delete(j);
        free(json);
        /* the same layer at another level: the same values but for rounding */
        assert_int_equal(harness_run(&r, ARGS("compare", "--rtol", "2e-5", "--atol", "2e-6", y, y0), NULL, 0), 0);
        if (r.exit_code != 0) fail_msg("level %s against the default level:\n%s", lv[i].name, r.out);
        harness_result_free(&r);
        free(y), free(t);
    }
    free(x), free(y0);
}

/* one line and the usage hint, exit 2, and no output file */
static void expect_refused(const char *value, const char *says)
{
    char *x = harness_fmt("%s/torch/rish_local/x.npy", harness_testdata()), *y = harness_tmp("refused.npy");
    setenv("AFT_KERNELS", value, 1);
    harness_result r;
    assert_int_equal(harness_run(&r, ARGS("run", "--variant", "local", "--window", "4", "-o", y, x), NULL, 0), 0);
    unsetenv("AFT_KERNELS");
    char *want = harness_fmt("aft run: AFT_KERNELS=%s: %s\nTry 'aft run --help'.\n", value, says);
    if (r.exit_code != 2 || strcmp(r.err, want) != 0)
        fail_msg("AFT_KERNELS=%s: exit %d, stderr\n%s\nwanted\n%s", value, r.exit_code, r.err, want);
    assert_false(harness_exists(y));
    harness_result_free(&r);
    free(want), free(x), free(y);
}

static void test_refusals(void **state)
{
    (void)state;
    size_t n;
    const aft_level *lv = aft_levels(&n);
    char known[128] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", lv[i].name);
    char *says = harness_fmt("'sse9' is not a kernel level of this build (%s)", known);
    expect_refused("sse9", says);
    free(says);
    /* a level this CPU lacks (none on a CPU that runs them all) */
    for (size_t i = 0; i < n; i++) {
        if (lv[i].runs) continue;
        says = harness_fmt("kernel level %s needs %s: %s", lv[i].name, lv[i].needs, lv[i].why);
        expect_refused(lv[i].name, says);
        free(says);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_names_the_level),
        cmocka_unit_test(test_every_level_forced),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
