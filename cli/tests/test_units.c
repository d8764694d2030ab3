/*
 * test_units.c - how messages print numbers: sizes in the unit that
 * shows them (cli_bytes_text, and the --max-memory refusals of aft run and
 * aft model that use it), and a count's noun in the singular for one
 * ("1 non-finite value", "1 byte", "1 dimension"), in the CLI's messages
 * and the library's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "harness.h"

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* a run that must exit with code and print exactly want on stderr */
static void expect_stderr(const char *const *args, int code, const char *want_plain)
{
    /* want_plain is written "aft: ..."; the one shape names the command: "aft run: ..." */
    char *want = strncmp(want_plain, "aft: ", 5) == 0 ? harness_fmt("aft %s: %s", args[0], want_plain + 5) : harness_fmt("%s", want_plain);
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != code || strcmp(r.err, want) != 0)
        fail_msg("aft %s ...: exit %d (want %d), stderr\n%s\nwanted\n%s", args[0], r.exit_code, code, r.err, want);
    harness_result_free(&r);
    free(want);
}

/* ------------------------------------------------------------------ sizes */

static void test_bytes_text(void **state)
{
    (void)state;
    static const struct {
        size_t bytes;
        const char *text;
    } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {1000, "1000 B"},
        {1023, "1023 B"},
        {1024, "1 KiB"},
        {1536, "1.5 KiB"},
        {10 * 1024 + 102, "10.1 KiB"},
        {1048524, "1023.9 KiB"},
        {1048575, "1 MiB"},   /* 1023.999 KiB would show as 1024.0 KiB */
        {1048576, "1 MiB"},
        {18035507, "17.2 MiB"},
        {(size_t)3 << 30, "3 GiB"},
        {((size_t)5 << 30) + ((size_t)1 << 29), "5.5 GiB"},
        {(size_t)4096 << 30, "4096 GiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = cli_bytes_text(cases[i].bytes).s;
        if (strcmp(got, cases[i].text) != 0) fail_msg("%zu bytes: '%s', not '%s'", cases[i].bytes, got, cases[i].text);
    }
    /* the largest count fits */
    assert_non_null(strstr(cli_bytes_text(SIZE_MAX).s, " GiB"));
}

/* --max-memory 1K was "allows 0.0 MiB" */
static void test_memory_refusals(void **state)
{
    (void)state;
    char *x = harness_fmt("%s/torch/rish_local/x.npy", harness_testdata());
    char *m = harness_fmt("%s/model/labml_aft_fortunes.safetensors", harness_testdata());
    char *t = harness_fmt("%s/model/bt_tokens.npy", harness_testdata());
    char *out = harness_path(harness_dir(), "y.npy");
    expect_stderr(ARGS("run", "--variant", "local", "--window", "3", "--max-memory", "1K", x, "-o", out), 1,
                  "aft run: this run needs about 155.2 KiB but --max-memory allows 1 KiB\n");
    expect_stderr(ARGS("model", "--weights", m, "--max-memory", "1K", t, "-o", out), 1,
                  "aft model: the model needs about 17.2 MiB but --max-memory allows 1 KiB\n");
    expect_stderr(ARGS("generate", "--weights", m, "--prompt", "It", "--max-memory", "1000"), 1,
                  "aft generate: the model needs about 17.2 MiB but --max-memory allows 1000 B\n");
    free(out);
    free(t);
    free(m);
    free(x);
}

/* ------------------------------------------------------------------ counts */

/* x [1, 4, 3] float32 with n (0, 1 or 2) non-finite entries, at path */
static void write_nonfinite(const char *path, int n)
{
    float x[12] = {0};
    if (n > 0) x[5] = NAN;
    if (n > 1) x[6] = INFINITY;
    aft_tensor t = harness_tensor(AFT_F32, x, 3, (size_t[]){1, 4, 3});
    aft_error err;
    if (aft_npy_write(path, &t, &err) != AFT_OK) fail_msg("%s", err.msg);
}

static void test_nonfinite_counts(void **state)
{
    (void)state;
    char *one = harness_path(harness_dir(), "nan1.npy"), *two = harness_path(harness_dir(), "nan2.npy"), *out = harness_path(harness_dir(), "o.npy");
    char *g = harness_path(harness_dir(), "g.safetensors");
    write_nonfinite(one, 1);
    write_nonfinite(two, 2);
    char *want = harness_fmt("aft run: warning: %s holds 1 non-finite value (NaN or inf); outputs it reaches will be NaN\n", one);
    expect_stderr(ARGS("run", "--variant", "simple", one, "-o", out), 0, want);
    free(want);
    want = harness_fmt("aft: %s: 1 non-finite value (NaN or inf); --strict refuses it\n", one);
    expect_stderr(ARGS("run", "--variant", "simple", "--strict", one, "-o", out), 1, want);
    free(want);
    want = harness_fmt("aft run: warning: %s holds 2 non-finite values (NaN or inf); outputs they reach will be NaN\n", two);
    expect_stderr(ARGS("run", "--variant", "simple", two, "-o", out), 0, want);
    free(want);
    want = harness_fmt("aft: %s: 2 non-finite values (NaN or inf); --strict refuses them\n", two);
    expect_stderr(ARGS("run", "--variant", "simple", "--strict", two, "-o", out), 1, want);
    free(want);
    /* aft grad's dY */
    float dy[12] = {0};
    dy[0] = NAN;
    aft_tensor t = harness_tensor(AFT_F32, dy, 3, (size_t[]){1, 4, 3});
    aft_error err;
    assert_int_equal(aft_npy_write(two, &t, &err), AFT_OK);
    write_nonfinite(one, 0);
    want = harness_fmt("aft grad: warning: %s holds 1 non-finite value (NaN or inf); gradients it reaches will be NaN\n", two);
    expect_stderr(ARGS("grad", "--variant", "simple", one, "--grad-output", two, "-o", g), 0, want);
    free(want);
    want = harness_fmt("aft: %s: 1 non-finite value (NaN or inf); --strict refuses it\n", two);
    expect_stderr(ARGS("grad", "--variant", "simple", "--strict", one, "--grad-output", two, "-o", g), 1, want);
    free(want);
    free(g);
    free(out);
    free(two);
    free(one);
}

/* a file of one byte, one byte too many, one dimension */
static void test_one_of_a_noun(void **state)
{
    (void)state;
    char *npy = harness_path(harness_dir(), "one.npy"), *st = harness_path(harness_dir(), "one.safetensors"), *out = harness_path(harness_dir(), "o.npy");
    assert_int_equal(harness_write_file(npy, "\x93", 1), 0);
    char *want = harness_fmt("aft: %s: file ends inside the .npy preamble (1 byte)\n", npy);
    expect_stderr(ARGS("info", npy), 1, want);
    free(want);
    assert_int_equal(harness_write_file(st, "{", 1), 0);
    want = harness_fmt("aft: %s: file is 1 byte, too short for the 8-byte header size\n", st);
    expect_stderr(ARGS("info", st), 1, want);
    free(want);
    /* a vector [5] and a byte after its data */
    float v[5] = {0};
    aft_tensor t = harness_tensor(AFT_F32, v, 1, (size_t[]){5});
    aft_error err;
    assert_int_equal(aft_npy_write(npy, &t, &err), AFT_OK);
    want = harness_fmt("aft: %s: the input must be [B, T, D], [T, D] or a grid [B, H, W, D]; it has 1 dimension\n", npy);
    expect_stderr(ARGS("run", "--variant", "simple", npy, "-o", out), 1, want);
    free(want);
    char *data;
    size_t len;
    assert_int_equal(harness_read_file(npy, &data, &len), 0);
    data[len] = '\0';   /* the terminator harness_read_file leaves is the extra byte */
    assert_int_equal(harness_write_file(npy, data, len + 1), 0);
    free(data);
    want = harness_fmt("aft: %s: 1 trailing byte after the data\n", npy);
    expect_stderr(ARGS("info", npy), 1, want);
    free(want);
    free(out);
    free(st);
    free(npy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_text),
        cmocka_unit_test(test_memory_refusals),
        cmocka_unit_test(test_nonfinite_counts),
        cmocka_unit_test(test_one_of_a_noun),
    };
    return cmocka_run_group_tests_name("cli messages", tests, harness_setup, harness_teardown);
}
