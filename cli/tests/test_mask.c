/* test_mask.c - `aft mask`: the local (and causal) mask as text, .npy and JSON, and its usage errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "aft.h"
#include "checks.h"
#include "harness.h"

/* entries in a directory, not counting . and .. */
static size_t count_entries(const char *path)
{
    DIR *d = opendir(path);
    assert_non_null(d);
    size_t n = 0;
    const struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

/* the definition: visible where |i - j| < s, and j <= i when causal */
static int rule(size_t i, size_t j, size_t s, int causal)
{
    size_t d = i > j ? i - j : j - i;
    return d < s && !(causal && j > i);
}

/* the text the rule gives: n lines of n entries, single spaces */
static char *rule_text(size_t n, size_t s, int causal)
{
    char *t = malloc(2 * n * n + 1);
    assert_non_null(t);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            t[u++] = rule(i, j, s, causal) ? '1' : '0';
            t[u++] = j + 1 < n ? ' ' : '\n';
        }
    t[u] = 0;
    return t;
}

/* `aft mask ARGS` prints exactly want on stdout */
static void expect_text(const char *const *args, const char *want)
{
    harness_result r;
    check_ok(&r, args);
    assert_string_equal(r.out, want);
    assert_int_equal(r.out_len, strlen(want));
    harness_result_free(&r);
}

/* the definition for small sizes, written out by hand */
static void test_text_len5_window2(void **state)
{
    (void)state;
    expect_text((const char *[]){"mask", "--len", "5", "--window", "2", NULL},
                "1 1 0 0 0\n"
                "1 1 1 0 0\n"
                "0 1 1 1 0\n"
                "0 0 1 1 1\n"
                "0 0 0 1 1\n");
    /* the explicit text format is the default */
    expect_text((const char *[]){"mask", "--format", "text", "--window", "2", "--len", "5", NULL},
                "1 1 0 0 0\n"
                "1 1 1 0 0\n"
                "0 1 1 1 0\n"
                "0 0 1 1 1\n"
                "0 0 0 1 1\n");
}

static void test_text_len5_window2_causal(void **state)
{
    (void)state;
    expect_text((const char *[]){"mask", "--len", "5", "--window", "2", "--causal", NULL},
                "1 0 0 0 0\n"
                "1 1 0 0 0\n"
                "0 1 1 0 0\n"
                "0 0 1 1 0\n"
                "0 0 0 1 1\n");
    /* --opt=value spelling, --causal first */
    expect_text((const char *[]){"mask", "--causal", "--len=5", "--window=2", NULL},
                "1 0 0 0 0\n"
                "1 1 0 0 0\n"
                "0 1 1 0 0\n"
                "0 0 1 1 0\n"
                "0 0 0 1 1\n");
}

/* the README's example */
static void test_text_readme_example(void **state)
{
    (void)state;
    expect_text((const char *[]){"mask", "--len", "6", "--window", "2", "--causal", NULL},
                "1 0 0 0 0 0\n"
                "1 1 0 0 0 0\n"
                "0 1 1 0 0 0\n"
                "0 0 1 1 0 0\n"
                "0 0 0 1 1 0\n"
                "0 0 0 0 1 1\n");
}

/* a larger size against the rule computed here */
static void test_text_len37_window5(void **state)
{
    (void)state;
    for (int causal = 0; causal < 2; causal++) {
        char *want = rule_text(37, 5, causal);
        if (causal)
            expect_text((const char *[]){"mask", "--len", "37", "--window", "5", "--causal", NULL}, want);
        else
            expect_text((const char *[]){"mask", "--len", "37", "--window", "5", NULL}, want);
        /* spot checks of the rule itself, so a wrong rule here cannot hide a wrong aft */
        assert_int_equal(want[(0 * 37 + 4) * 2], causal ? '0' : '1');
        assert_int_equal(want[(0 * 37 + 5) * 2], '0');
        assert_int_equal(want[(10 * 37 + 6) * 2], '1');
        assert_int_equal(want[(10 * 37 + 5) * 2], '0');
        free(want);
    }
}

/* S = 0: nothing is visible */
static void test_window_zero(void **state)
{
    (void)state;
    expect_text((const char *[]){"mask", "--len", "3", "--window", "0", NULL}, "0 0 0\n0 0 0\n0 0 0\n");
    expect_text((const char *[]){"mask", "--len", "3", "--window", "0", "--causal", NULL},
                "0 0 0\n0 0 0\n0 0 0\n");
    expect_text((const char *[]){"mask", "--len", "1", "--window", "0", NULL}, "0\n");
}

/* S >= N: everything (or the lower triangle) is visible */
static void test_window_covers_all(void **state)
{
    (void)state;
    expect_text((const char *[]){"mask", "--len", "4", "--window", "9", NULL},
                "1 1 1 1\n1 1 1 1\n1 1 1 1\n1 1 1 1\n");
    expect_text((const char *[]){"mask", "--len", "4", "--window", "9", "--causal", NULL},
                "1 0 0 0\n1 1 0 0\n1 1 1 0\n1 1 1 1\n");
    /* S = N is just enough: |i - j| <= N - 1 < N */
    expect_text((const char *[]){"mask", "--len", "4", "--window", "4", NULL},
                "1 1 1 1\n1 1 1 1\n1 1 1 1\n1 1 1 1\n");
    /* S = N - 1 is not: the corners are hidden */
    expect_text((const char *[]){"mask", "--len", "4", "--window", "3", NULL},
                "1 1 1 0\n1 1 1 1\n1 1 1 1\n0 1 1 1\n");
    expect_text((const char *[]){"mask", "--len", "1", "--window", "1", NULL}, "1\n");
}

/* checks a bool [n, n] .npy's bytes against the rule */
static void check_npy_bytes(const char *bytes, size_t len, size_t n, size_t s, int causal)
{
    aft_tensor t;
    aft_npy_info info;
    aft_error err;
    aft_status st = aft_npy_read_mem(bytes, len, &t, &info, &err);
    if (st != AFT_OK) fprintf(stderr, "npy: %s\n", err.msg);
    assert_int_equal(st, AFT_OK);
    assert_int_equal(t.dtype, AFT_BOOL);
    assert_string_equal(info.descr, "|b1");
    assert_int_equal(info.fortran_order, 0);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], n);
    assert_int_equal(t.shape[1], n);
    const uint8_t *m = t.data;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) assert_int_equal(m[i * n + j], rule(i, j, s, causal));
    aft_tensor_free(&t);
}

static void test_npy_stdout(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"mask", "--len", "37", "--window", "5", "--format", "npy", NULL});
    check_npy_bytes(r.out, r.out_len, 37, 5, 0);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"mask", "--len", "37", "--window", "5", "--causal", "--format", "npy", NULL});
    check_npy_bytes(r.out, r.out_len, 37, 5, 1);
    harness_result_free(&r);
    /* the edge windows too */
    check_ok(&r, (const char *[]){"mask", "--len", "6", "--window", "0", "--format", "npy", NULL});
    check_npy_bytes(r.out, r.out_len, 6, 0, 0);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"mask", "--len", "6", "--window", "100", "--causal", "--format=npy", NULL});
    check_npy_bytes(r.out, r.out_len, 6, 100, 1);
    harness_result_free(&r);
}

/* JSON: an array of n arrays of n numbers 0/1 */
static void check_json(const char *text, size_t n, size_t s, int causal)
{
    cJSON *o = cJSON_Parse(text);
    assert_non_null(o);
    assert_true(cJSON_IsArray(o));
    assert_int_equal(cJSON_GetArraySize(o), n);
    for (size_t i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(o, (int)i);
        assert_true(cJSON_IsArray(row));
        assert_int_equal(cJSON_GetArraySize(row), n);
        for (size_t j = 0; j < n; j++) {
            const cJSON *e = cJSON_GetArrayItem(row, (int)j);
            assert_true(cJSON_IsNumber(e));
            assert_true(e->valuedouble == (double)rule(i, j, s, causal));
        }
    }
    cJSON_Delete(o);
}

static void test_json(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"mask", "--len", "37", "--window", "5", "--format", "json", NULL});
    check_json(r.out, 37, 5, 0);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"mask", "--len", "5", "--window", "2", "--causal", "--format", "json", NULL});
    check_json(r.out, 5, 2, 1);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"mask", "--len", "1", "--window", "1", "--format", "json", NULL});
    check_json(r.out, 1, 1, 0);
    harness_result_free(&r);
    /* --json, as every command that prints JSON spells it; the later of it
     * and --format counts */
    check_ok(&r, (const char *[]){"mask", "--len", "5", "--window", "2", "--causal", "--json", NULL});
    check_json(r.out, 5, 2, 1);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"mask", "--len", "5", "--window", "2", "--format", "npy", "--json", NULL});
    check_json(r.out, 5, 2, 0);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"mask", "--len", "2", "--window", "2", "--json", "--format", "text", NULL});
    assert_string_equal(r.out, "1 1\n1 1\n");
    harness_result_free(&r);
}

/* -o FILE: the same bytes in the file, nothing on stdout, no temporary left behind */
static void test_output_file(void **state)
{
    (void)state;
    static const char *formats[3] = {"text", "npy", "json"};
    for (int f = 0; f < 3; f++) {
        char *sub = harness_tmp(formats[f]);
        assert_int_equal(mkdir(sub, 0700), 0);
        char *path = harness_path(sub, "mask.out");
        harness_result r, s;
        check_ok(&r, (const char *[]){"mask", "--len", "9", "--window", "3", "--causal", "--format", formats[f],
                                    "-o", path, NULL});
        assert_int_equal(r.out_len, 0);
        check_ok(&s, (const char *[]){"mask", "--len", "9", "--window", "3", "--causal", "--format", formats[f], NULL});
        char *data;
        size_t len;
        assert_int_equal(harness_read_file(path, &data, &len), 0);
        assert_int_equal(len, s.out_len);
        assert_memory_equal(data, s.out, len);
        if (f == 0) {
            char *want = rule_text(9, 3, 1);
            assert_string_equal(data, want);
            free(want);
        } else if (f == 1) {
            check_npy_bytes(data, len, 9, 3, 1);
        } else {
            check_json(data, 9, 3, 1);
        }
        free(data);
        /* an existing file is replaced */
        static const char old[] = "old contents, longer than the text mask of 9 x 9 entries: "
                                  "................................................................"
                                  "................................................................\n";
        assert_int_equal(harness_write_file(path, old, sizeof old - 1), 0);
        harness_result_free(&r);
        check_ok(&r, (const char *[]){"mask", "--len", "9", "--window", "3", "--causal", "--format", formats[f],
                                    "-o", path, NULL});
        assert_int_equal(harness_read_file(path, &data, &len), 0);
        assert_int_equal(len, s.out_len);
        assert_memory_equal(data, s.out, len);
        free(data);
        /* only mask.out in the directory: no temporary left behind */
        assert_int_equal(count_entries(sub), 1);
        harness_result_free(&r);
        harness_result_free(&s);
        free(path);
        free(sub);
    }
}

/* exit 2, nothing on stdout, "aft mask: ..." naming what is wrong, then the hint line */
static void expect_usage_error(const char *const *args, const char *what)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != 2) fprintf(stderr, "exit %d, stderr: %s\n", r.exit_code, r.err);
    assert_int_equal(r.exit_code, 2);
    assert_int_equal(r.out_len, 0);
    assert_true(strncmp(r.err, "aft mask: ", 10) == 0);
    assert_int_equal(harness_count_lines(r.err), 2);
    assert_non_null(strstr(r.err, "\nTry 'aft mask --help'.\n"));
    if (what) {
        const char *nl = strchr(r.err, '\n');
        char *first = strndup(r.err, (size_t)(nl - r.err));
        if (!strstr(first, what)) fprintf(stderr, "expected '%s' in: %s\n", what, first);
        assert_non_null(strstr(first, what));
        free(first);
    }
    harness_result_free(&r);
}

static void test_usage_errors(void **state)
{
    (void)state;
    expect_usage_error((const char *[]){"mask", "--len", "0", "--window", "2", NULL}, "--len");
    expect_usage_error((const char *[]){"mask", "--len", "5", "--window", "-1", NULL}, "--window");
    expect_usage_error((const char *[]){"mask", "--window", "2", NULL}, "--len");
    expect_usage_error((const char *[]){"mask", "--len", "5", NULL}, "--window");
    expect_usage_error((const char *[]){"mask", "--len", "5", "--window", "2", "--format", "csv", NULL}, "csv");
    expect_usage_error((const char *[]){"mask", "--len", "-5", "--window", "2", NULL}, "--len");
    expect_usage_error((const char *[]){"mask", "--len", "abc", "--window", "2", NULL}, "--len");
    expect_usage_error((const char *[]){"mask", "--len", "5", "--window", "2x", NULL}, "--window");
    expect_usage_error((const char *[]){"mask", "--len", "5", "--window", "2", "--frobnicate", NULL},
                       "--frobnicate");
    expect_usage_error((const char *[]){"mask", "--len", "5", "--window", NULL}, "--window");
    expect_usage_error((const char *[]){"mask", NULL}, NULL);
}

/* a usage error writes no file */
static void test_usage_error_writes_nothing(void **state)
{
    (void)state;
    char *path = harness_tmp("never.txt");
    expect_usage_error((const char *[]){"mask", "--len", "0", "--window", "2", "-o", path, NULL}, "--len");
    struct stat sb;
    assert_int_equal(stat(path, &sb), -1);
    free(path);
}

static void test_help(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"mask", "--help", NULL});
    assert_true(strncmp(r.out, "usage: aft mask", 15) == 0);
    harness_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_len5_window2),
        cmocka_unit_test(test_text_len5_window2_causal),
        cmocka_unit_test(test_text_readme_example),
        cmocka_unit_test(test_text_len37_window5),
        cmocka_unit_test(test_window_zero),
        cmocka_unit_test(test_window_covers_all),
        cmocka_unit_test(test_npy_stdout),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_output_file),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_usage_error_writes_nothing),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests_name("cli mask", tests, harness_setup, harness_teardown);
}
