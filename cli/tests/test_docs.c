/* test_docs.c - the manual and the README keep up with the command: the man
 * page renders without a groff warning, and every subcommand and every option
 * that `aft CMD --help` names appears in man/aft.1 (and every subcommand in
 * README.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "harness.h"

static const char *const commands[] = {"info", "run", "mask", "compare", "convert", "bench"};

static char *read_repo_file(const char *rel)
{
    const char *dir = harness_testdata();   /* <repo>/testdata */
    char path[4096];
    snprintf(path, sizeof path, "%s/../%s", dir, rel);
    char *data;
    size_t len;
    if (harness_read_file(path, &data, &len) != 0) fail_msg("cannot read %s", path);
    return data;
}

/* man's source escapes '-' as '\-': undo that so options can be searched */
static char *unescape_man(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] == '-') continue;
        *w++ = *r;
    }
    *w = 0;
    return s;
}

static void test_man_renders_cleanly(void **state)
{
    (void)state;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "command -v groff >/dev/null 2>&1 || exit 77; "
                              "groff -ww -man -Tutf8 '%s/../man/aft.1' 2>&1 >/dev/null", harness_testdata());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) skip();
    if (n) fail_msg("groff -ww warns about man/aft.1:\n%s", buf);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_every_option_documented(void **state)
{
    (void)state;
    char *man = unescape_man(read_repo_file("man/aft.1"));
    char *readme = read_repo_file("README.md");
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
        char needle[64];
        snprintf(needle, sizeof needle, "aft %s", commands[c]);
        if (!strstr(man, needle)) fail_msg("man/aft.1 does not document '%s'", needle);
        snprintf(needle, sizeof needle, "`aft %s`", commands[c]);
        if (!strstr(readme, needle)) fail_msg("README.md has no section for %s", needle);
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, commands[c], "--help"), 0);
        assert_int_equal(r.exit_code, 0);
        /* options in the help: "--word" after a space, '[' or ',' */
        for (char *p = r.out; *p; p++) {
            if (!(p[0] == '-' && p[1] == '-' && p > r.out && strchr(" [,", p[-1]))) continue;
            size_t n = 2;
            while (p[n] && (p[n] == '-' || (p[n] >= 'a' && p[n] <= 'z'))) n++;
            char opt[64];
            if (n < 3 || n >= sizeof opt) continue;
            memcpy(opt, p, n);
            opt[n] = 0;
            if (!strstr(man, opt)) fail_msg("aft %s --help names %s; man/aft.1 does not", commands[c], opt);
            p += n - 1;
        }
        harness_result_free(&r);
    }
    free(man);
    free(readme);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_man_renders_cleanly),
        cmocka_unit_test(test_every_option_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
