/*
 * test_messages.c - how messages print numbers: sizes in the unit that
 * shows them (cli_bytes_text, and the --max-memory refusals of aft run and
 * aft model that use it), and a count's noun in the singular for one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "harness.h"

static char *dir;   /* temp dir for every input and output */

static int setup(void **state)
{
    (void)state;
    dir = harness_mkdtemp();
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = dir ? harness_rmtree(dir) : 0;
    free(dir);
    dir = NULL;
    return rc;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    int n = vasprintf(&s, f, ap);
    va_end(ap);
    assert_true(n >= 0);
    return s;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* a run that must exit with code and print exactly want on stderr */
static void expect_stderr(const char *const *args, int code, const char *want)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != code || strcmp(r.err, want) != 0)
        fail_msg("aft %s ...: exit %d (want %d), stderr\n%s\nwanted\n%s", args[0], r.exit_code, code, r.err, want);
    harness_result_free(&r);
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
    char *x = fmt("%s/torch/rish_local/x.npy", harness_testdata());
    char *m = fmt("%s/model/labml_aft_fortunes.safetensors", harness_testdata());
    char *t = fmt("%s/model/bt_tokens.npy", harness_testdata());
    char *out = harness_path(dir, "y.npy");
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_text),
        cmocka_unit_test(test_memory_refusals),
    };
    return cmocka_run_group_tests_name("cli messages", tests, setup, teardown);
}
