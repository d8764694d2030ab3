/* test_messages.c - every message has the one shape README.md and man/aft.1
 * (DIAGNOSTICS) state: one line on stderr, "aft COMMAND: [FILE: ]what is
 * wrong"; a usage error (exit status 2) adds the line "Try 'aft COMMAND
 * --help'."; without a command (an unknown one) the prefix is "aft: " and
 * the hint "Try 'aft --help'.". Each command is made to fail both ways:
 * by a file, and by its command line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "aft.h"
#include "harness.h"

static char *dir, *x_path, *missing, *out_path, *no_dir_path, *plot_path;

static int setup(void **state)
{
    (void)state;
    dir = harness_mkdtemp();
    x_path = harness_path(dir, "x.npy");
    missing = harness_path(dir, "missing.npy");
    out_path = harness_path(dir, "out.npy");
    no_dir_path = harness_path(dir, "no/such/dir.npy");
    plot_path = harness_path(dir, "plot.txt");
    float x[2 * 5 * 8];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)(i % 7) / 7.0f;
    aft_tensor t = harness_tensor(AFT_F32, x, 3, (size_t[]){2, 5, 8});
    aft_error err;
    return dir && aft_npy_write(x_path, &t, &err) == AFT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    harness_rmtree(dir);
    free(dir); free(x_path); free(missing); free(out_path); free(no_dir_path); free(plot_path);
    return 0;
}

/* runs args and checks the message: exit status code; its first line starts
 * "aft CMD: " (CMD: args[0], or "aft: " when cmd is NULL) and then names
 * file (when not NULL) as "FILE: "; a usage error's second and last line is
 * the hint, any other message is one line */
static void expect_message(const char *const *args, const char *cmd, int code, const char *file)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    char prefix[4096], hint[128];
    snprintf(prefix, sizeof prefix, "aft%s%s: %s%s", cmd ? " " : "", cmd ? cmd : "", file ? file : "",
             file ? ": " : "");
    snprintf(hint, sizeof hint, "Try 'aft%s%s --help'.\n", cmd ? " " : "", cmd ? cmd : "");
    const char *nl = strchr(r.err, '\n');
    const char *why = NULL;
    if (r.exit_code != code) why = "exit status";
    else if (strncmp(r.err, prefix, strlen(prefix)) != 0) why = "first line's prefix";
    else if (!nl) why = "no complete line";
    else if (code == 2 && (strcmp(nl + 1, hint) != 0)) why = "usage error without the hint as its second line";
    else if (code != 2 && nl[1] != '\0') why = "more than one line";
    if (why) fail_msg("aft %s ...: %s: exit %d (want %d), stderr:\n%swanted it to start '%s'", args[0], why,
                      r.exit_code, code, r.err, prefix);
    harness_result_free(&r);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* a file at fault: "aft CMD: FILE: ...", exit 1 */
static void test_file_errors(void **state)
{
    (void)state;
    expect_message(ARGS("info", missing), "info", 1, missing);
    expect_message(ARGS("run", missing, "-o", out_path), "run", 1, missing);
    expect_message(ARGS("grad", missing, "-o", out_path), "grad", 1, missing);
    expect_message(ARGS("compare", x_path, missing), "compare", 1, missing);
    expect_message(ARGS("convert", "-o", out_path, missing), "convert", 1, missing);
    expect_message(ARGS("model", "--weights", missing, x_path, "-o", out_path), "model", 1, missing);
    expect_message(ARGS("generate", "--weights", missing, "--prompt", "It"), "generate", 1, missing);
    expect_message(ARGS("bench", "--generate", "--weights", missing), "bench", 1, missing);
    expect_message(ARGS("mask", "--len", "3", "--window", "1", "-o", no_dir_path), "mask", 1, no_dir_path);
    /* the same message for a file at fault inside a layer's weights */
    expect_message(ARGS("run", "--weights", x_path, x_path, "-o", out_path), "run", 1, x_path);
}

/* the command line at fault: "aft CMD: ..." and the hint, exit 2 */
static void test_usage_errors(void **state)
{
    (void)state;
    static const char *const commands[] = {"info", "run", "grad", "mask", "compare", "convert", "model", "generate",
                                           "bench"};
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        expect_message(ARGS(commands[c], "--bogus"), commands[c], 2, NULL);
    expect_message(ARGS("mask", "--len", "0", "--window", "1"), "mask", 2, NULL);
    /* found once the input's sizes are known */
    expect_message(ARGS("run", "--variant", "conv", "--window", "2", "--heads", "3", x_path, "-o", out_path), "run", 2,
                   NULL);
    /* found after the runs (the rows are out, the plot is refused); bench
     * starts its runs through /proc/self/exe, valgrind's binary under
     * make test-valgrind */
    if (!strstr(harness_aft_bin(), "valgrind"))
        expect_message(ARGS("bench", "--seq-len", "8", "--d-model", "8", "--variant", "simple", "--repeat", "1",
                            "--no-ceiling", "--json", "--plot", plot_path),
                       "bench", 2, NULL);
}

/* no command: "aft: ..." and "Try 'aft --help'." */
static void test_no_command(void **state)
{
    (void)state;
    expect_message(ARGS("bogus"), NULL, 2, NULL);
    expect_message(ARGS("help", "bogus"), NULL, 2, NULL);
}

/* README.md and man/aft.1 state the rule the tests above hold the code to */
static void test_rule_documented(void **state)
{
    (void)state;
    static const char *const docs[][2] = {
        {"README.md", "`aft COMMAND: FILE: what is wrong`"},
        {"README.md", "`Try 'aft COMMAND --help'.`"},
        {"man/aft.1", ".SH DIAGNOSTICS\n"},
        {"man/aft.1", "aft COMMAND: FILE: what is wrong\n"},
        {"man/aft.1", "Try \\(aqaft COMMAND \\-\\-help\\(aq.\n"},
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        char path[4096], *text;
        snprintf(path, sizeof path, "%s/../%s", harness_testdata(), docs[i][0]);
        assert_int_equal(harness_read_file(path, &text, NULL), 0);
        if (!strstr(text, docs[i][1])) fail_msg("%s does not say %s", docs[i][0], docs[i][1]);
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_no_command),
        cmocka_unit_test(test_rule_documented),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
