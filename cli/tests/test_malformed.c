/* test_malformed.c - aft info, run, compare and convert on every file of the
 * malformed corpus in testdata/malformed/, and regressions found with it.
 *
 * testdata/malformed/expected.tsv lists each file with a substring its error
 * message must contain (both made by testdata/malformed/make_malformed.py).
 * For every file, each command below must:
 *   - exit with status 1 (a data error), not die from a signal or time out;
 *   - print exactly one line on stderr, starting with "aft", naming the
 *     file and containing the expected substring, with no control
 *     characters in it (the file's bytes must not reach the terminal raw);
 *   - print nothing on stdout;
 *   - leave no output file (nor a temporary) behind when given -o.
 * The commands: `aft info FILE` and `aft run FILE -o OUT`; for a .npy also
 * `aft run - -o OUT` with the file on stdin; for a .safetensors or .npz also
 * `aft run --weights FILE x.npy -o OUT` (x.npy a valid input) and the same
 * with --weights /dev/stdin reading the file from a pipe (the reader's
 * non-mmap path); then for every file `aft compare FILE FILE` and
 * `aft convert -o OUT.safetensors FILE` (convert's streaming .npy parser
 * words a few messages differently: only their form is checked).
 *
 * AFT_TEST_QUICK=1 (set by `make test-valgrind`, where each aft run costs a
 * second or more) runs one command per file, `aft info FILE` and
 * `aft run FILE -o OUT` in turn: every file still goes through the reader
 * (where the error paths differ from file to file), and each command's own
 * error path still runs on half the corpus.
 *
 * Files named state_*.safetensors are streaming states, spoilt, for
 * `aft run --causal --variant local --window 3 --seed 7 --state-in FILE x.npy`
 * (x.npy [4, 8]): that command, and the same with --state-out, must fail as
 * above, writing neither the output nor the state.
 *
 * Every file in the directory (but the generator, expected.tsv and a README)
 * must be listed in expected.tsv and the other way round, so the corpus and
 * its expectations cannot drift apart.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "harness.h"

#define MIN_CASES 40

typedef struct {
    char *name;     /* file name inside testdata/malformed */
    char *expect;   /* substring of the message */
    char *path;     /* full path */
    int is_st;      /* .safetensors or .npz (a file of named tensors; else .npy) */
    int is_state;   /* state_*: a streaming state for --state-in */
    size_t index;   /* position in expected.tsv */
} mcase;

static mcase *cases;
static size_t ncases;
static char *corpus_dir;   /* $AFT_TESTDATA/malformed */
static char *x_path, *out_path, *out_st_path;
static int quick;

/* files in the corpus directory that are not corpus entries */
static int is_support_file(const char *name)
{
    return strcmp(name, "make_malformed.py") == 0 || strcmp(name, "expected.tsv") == 0 ||
           strcmp(name, "README.md") == 0 || name[0] == '.';
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Reads expected.tsv into cases. Lines: NAME TAB SUBSTRING; '#' starts a
 * comment line. Returns 0, or -1 after saying why. */
static int load_expectations(void)
{
    char *tsv_path = harness_path(corpus_dir, "expected.tsv");
    char *text = NULL;
    if (!tsv_path || harness_read_file(tsv_path, &text, NULL) != 0) {
        fprintf(stderr, "test_malformed: cannot read %s\n", tsv_path ? tsv_path : "expected.tsv");
        free(tsv_path);
        return -1;
    }
    size_t cap = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (line[0] == '#' || line[0] == '\0') continue;
        char *tab = strchr(line, '\t');
        if (!tab || tab == line || tab[1] == '\0' || strchr(tab + 1, '\t')) {
            fprintf(stderr, "test_malformed: %s: bad line '%s'\n", tsv_path, line);
            goto fail;
        }
        *tab = '\0';
        if (ncases == cap) {
            cap = cap ? 2 * cap : 64;
            mcase *n = realloc(cases, cap * sizeof *cases);
            if (!n) goto fail;
            cases = n;
        }
        mcase *c = &cases[ncases++];
        c->name = strdup(line);
        c->expect = strdup(tab + 1);
        c->path = harness_path(corpus_dir, line);
        c->is_st = ends_with(line, ".safetensors") || ends_with(line, ".npz");
        c->is_state = strncmp(line, "state_", 6) == 0;
        c->index = ncases - 1;
        if (!c->name || !c->expect || !c->path) goto fail;
        if (!c->is_st && !ends_with(line, ".npy")) {
            fprintf(stderr, "test_malformed: %s: '%s' is not .npy, .npz or .safetensors\n", tsv_path, line);
            goto fail;
        }
    }
    free(text);
    free(tsv_path);
    return 0;
fail:
    free(text);
    free(tsv_path);
    return -1;
}

static int setup(void **state)
{
    (void)state;
    quick = harness_quick();
    if (harness_setup(state) != 0) return -1;
    x_path = harness_tmp("x.npy");
    out_path = harness_tmp("out.npy");
    out_st_path = harness_tmp("out.safetensors");
    if (!x_path || !out_path || !out_st_path) return -1;
    /* a valid input for `aft run --weights FILE x.npy`: X as [T, D] = [4, 8] */
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = (float)(i % 7) * 0.25f - 0.5f;
    aft_tensor t = {.dtype = AFT_F32, .ndim = 2, .shape = {4, 8}, .nelem = 32,
                    .nbytes = sizeof x, .data = x};
    aft_error err;
    if (aft_npy_write(x_path, &t, &err) != AFT_OK) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    int rc = harness_teardown(state);
    free(x_path);
    free(out_path);
    free(out_st_path);
    x_path = out_path = out_st_path = NULL;
    return rc;
}

/* The command line, for messages: "aft info FILE" */
static void describe(char *buf, size_t cap, const char *const *args)
{
    size_t n = (size_t)snprintf(buf, cap, "aft");
    for (size_t i = 0; args[i] && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, " %s", args[i]);
}

/* Names of the entries of the temporary directory other than x.npy,
 * comma-separated (empty when there are none): whatever a failed run left
 * behind. With remove set they are deleted too, so the next case starts
 * from a clean directory. */
static void leftovers(char *buf, size_t cap, int remove_them)
{
    buf[0] = '\0';
    DIR *d = opendir(harness_dir());
    assert_non_null(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        /* inputs the tests put there are not outputs */
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || strcmp(e->d_name, "x.npy") == 0 ||
            strcmp(e->d_name, "wide.npy") == 0)
            continue;
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", e->d_name);
        if (remove_them) {
            char *p = harness_tmp(e->d_name);
            if (p) remove(p);
            free(p);
        }
    }
    closedir(d);
}

/* Runs aft with args (stdin: in, in_len bytes) and checks the failure the
 * header comment describes; shown is how the message must name the file,
 * expect a substring it must contain (NULL: any). */
static void expect_failure(const mcase *c, const char *const *args, const void *in, size_t in_len,
                           const char *shown, const char *expect)
{
    char cmd[1024], left[512];
    describe(cmd, sizeof cmd, args);
    harness_result r;
    assert_int_equal(harness_run(&r, args, in, in_len), 0);

    const char *why = NULL;
    if (r.timed_out) why = "timed out";
    else if (r.term_signal) why = "killed by a signal";
    else if (r.exit_code != 1) why = "exit status is not 1";
    else if (harness_count_lines(r.err) != 1 || r.err_len == 0 || r.err[r.err_len - 1] != '\n')
        why = "stderr is not exactly one line";
    else if (strncmp(r.err, "aft", 3) != 0) why = "message does not start with \"aft\"";
    else if (!strstr(r.err, shown)) why = "message does not name the file";
    else if (expect && !strstr(r.err, expect)) why = "message lacks the expected text";
    else if (r.out_len != 0) why = "something was written to stdout";
    for (size_t i = 0; !why && i + 1 < r.err_len; i++)
        if ((unsigned char)r.err[i] < 0x20 || r.err[i] == 0x7f) why = "control character in the message";
    leftovers(left, sizeof left, 1);
    if (!why && left[0]) why = "output files left behind";
    if (why) {
        print_error("%s: %s\n  command:  %s\n  exit %d, signal %d%s\n  expected: %s\n  stderr:   %s%s"
                    "  stdout:   %zu bytes\n  files:    %s\n",
                    c->name, why, cmd, r.exit_code, r.term_signal, r.timed_out ? ", timed out" : "",
                    expect ? expect : "(any)", r.err, r.err_len && r.err[r.err_len - 1] == '\n' ? "" : "\n", r.out_len,
                    left[0] ? left : "(none)");
        harness_result_free(&r);
        fail_msg("%s: %s", c->name, why);
    }
    harness_result_free(&r);
}

/* a spoilt streaming state: refused by --state-in, nothing written */
static void test_state_file(const mcase *c)
{
    const char *in[] = {"run", "--causal", "--variant", "local", "--window", "3", "--seed", "7", "--state-in",
                        c->path, x_path, "-o", out_path, NULL};
    expect_failure(c, in, NULL, 0, c->path, *c->expect ? c->expect : NULL);
    if (quick) return;
    const char *both[] = {"run", "--causal", "--variant", "local", "--window", "3", "--seed", "7", "--state-in",
                          c->path, "--state-out", out_st_path, x_path, "-o", out_path, NULL};
    expect_failure(c, both, NULL, 0, c->path, *c->expect ? c->expect : NULL);
}

static void test_file(void **state)
{
    const mcase *c = *state;
    if (c->is_state) {
        test_state_file(c);
        return;
    }
    const char *info[] = {"info", c->path, NULL};
    const char *run[] = {"run", c->path, "-o", out_path, NULL};
    if (!quick || c->index % 2 == 0) expect_failure(c, info, NULL, 0, c->path, c->expect);
    if (!quick || c->index % 2 == 1) expect_failure(c, run, NULL, 0, c->path, c->expect);
    if (quick) return;

    char *bytes = NULL;
    size_t len = 0;
    assert_int_equal(harness_read_file(c->path, &bytes, &len), 0);
    if (c->is_st) {
        const char *weights[] = {"run", "--weights", c->path, x_path, "-o", out_path, NULL};
        expect_failure(c, weights, NULL, 0, c->path, c->expect);
        const char *piped[] = {"run", "--weights", "/dev/stdin", x_path, "-o", out_path, NULL};
        expect_failure(c, piped, bytes, len, "aft run: /dev/stdin: ", c->expect);
    } else {
        const char *piped[] = {"run", "-", "-o", out_path, NULL};
        expect_failure(c, piped, bytes, len, "aft run: -: ", c->expect);
    }
    free(bytes);

    /* the other commands that read files: compare reads through the same
     * readers; convert streams .npy data through its own header parser,
     * whose wording may differ, so only the message's form is checked */
    const char *compare[] = {"compare", c->path, c->path, NULL};
    expect_failure(c, compare, NULL, 0, c->path, c->expect);
    const char *convert[] = {"convert", "-o", out_st_path, c->path, NULL};
    expect_failure(c, convert, NULL, 0, c->path, NULL);

    /* the model's commands: the file as the checkpoint, or as the tokens */
    if (c->is_st) {
        const char *model[] = {"model", "--weights", c->path, x_path, "-o", out_path, NULL};
        expect_failure(c, model, NULL, 0, c->path, c->expect);
        const char *generate[] = {"generate", "--weights", c->path, "--prompt", "a", NULL};
        expect_failure(c, generate, NULL, 0, c->path, c->expect);
    } else {
        char *ckpt = harness_path(harness_testdata(), "model/labml_aft_fortunes.safetensors");
        assert_non_null(ckpt);
        const char *model[] = {"model", "--weights", ckpt, c->path, "-o", out_path, NULL};
        expect_failure(c, model, NULL, 0, c->path, c->expect);
        free(ckpt);
    }
}

/* Runs aft with args and checks the refusal (or success) of a command given
 * sizes that fit no memory: no signal or timeout, and exit 0, 1 (one line on
 * stderr) or 2 (a usage error: one line and the hint). Whatever failed leaves
 * no output file. */
static void expect_sane_outcome(const char *const *args)
{
    char cmd[1024], left[512];
    describe(cmd, sizeof cmd, args);
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    size_t lines = harness_count_lines(r.err);
    const char *why = NULL;
    if (r.timed_out) why = "timed out";
    else if (r.term_signal) why = "killed by a signal";
    else if (r.exit_code != 0 && r.exit_code != 1 && r.exit_code != 2) why = "exit status is not 0, 1 or 2";
    else if (r.exit_code == 1 && lines != 1) why = "a data error whose message is not one line";
    else if (r.exit_code == 2 && (lines < 1 || lines > 2)) why = "a usage error of more than a line and the hint";
    else if (r.exit_code != 0 && strncmp(r.err, "aft", 3) != 0) why = "message does not start with \"aft\"";
    leftovers(left, sizeof left, 1);
    if (!why && r.exit_code != 0 && left[0]) why = "output files left behind";
    if (why)
        print_error("%s\n  command: %s\n  exit %d, signal %d\n  stderr:  %s\n", why, cmd, r.exit_code,
                    r.term_signal, r.err);
    harness_result_free(&r);
    if (why) fail_msg("%s", why);
}

/* Regression: a valid but empty .npy of shape (0, 2^32) makes `aft run`
 * (no --weights) build seeded C x D weight matrices with C = D = 2^32;
 * their byte count, 2^66, wrapped to 0 in cli/run.c seeded_matrix and the
 * generator wrote past a 1-byte block (found by hand, crashes natively). */
static void test_run_empty_input_of_huge_width(void **state)
{
    (void)state;
    char *path = harness_tmp("wide.npy");
    assert_non_null(path);
    aft_tensor t = {.dtype = AFT_F32, .ndim = 2, .shape = {0, (size_t)1 << 32}, .nelem = 0, .nbytes = 0};
    aft_error err;
    assert_int_equal(aft_npy_write(path, &t, &err), AFT_OK);
    const char *run[] = {"run", path, "-o", out_path, NULL};
    expect_sane_outcome(run);
    const char *local[] = {"run", "--variant", "local", "--window", "2", path, "-o", out_path, NULL};
    expect_sane_outcome(local);
    remove(out_path);
    remove(path);
    free(path);
}

/* Regression: the same wrap-around through options that size the seeded
 * weights or conv bias: --d-hidden (C x D matrices), --window and --heads
 * (an H x (2S-1) conv bias), on a valid small input. */
static void test_run_huge_size_options(void **state)
{
    (void)state;
    const char *d_hidden[] = {"run", "--d-hidden", "4611686018427387904", x_path, "-o", out_path, NULL};
    expect_sane_outcome(d_hidden);
    const char *window[] = {"run", "--variant", "conv", "--window", "4611686018427387905", x_path, "-o", out_path,
                            NULL};
    expect_sane_outcome(window);
    const char *heads[] = {"run", "--variant", "conv", "--window", "2", "--heads", "4611686018427387904", x_path,
                           "-o", out_path, NULL};
    expect_sane_outcome(heads);
    remove(out_path);
}

/* the directory holds exactly the files expected.tsv lists, and enough */
static void test_corpus_listed(void **state)
{
    (void)state;
    DIR *d = opendir(corpus_dir);
    assert_non_null(d);
    size_t found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (is_support_file(e->d_name)) continue;
        size_t i = 0;
        while (i < ncases && strcmp(cases[i].name, e->d_name) != 0) i++;
        if (i == ncases) print_error("%s/%s is not listed in expected.tsv\n", corpus_dir, e->d_name);
        else found++;
        assert_true(i < ncases);
    }
    closedir(d);
    if (found != ncases) print_error("expected.tsv lists %zu files; %zu exist\n", ncases, found);
    assert_int_equal(found, ncases);
    assert_true(ncases >= MIN_CASES);
}

int main(void)
{
    corpus_dir = harness_path(harness_testdata(), "malformed");
    if (!corpus_dir || load_expectations() != 0) return 1;
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_corpus_listed),
        cmocka_unit_test(test_run_empty_input_of_huge_width),
        cmocka_unit_test(test_run_huge_size_options),
    };
    size_t nfixed = sizeof fixed / sizeof fixed[0], ntests = nfixed + ncases;
    struct CMUnitTest *tests = calloc(ntests, sizeof *tests);
    if (!tests) return 1;
    memcpy(tests, fixed, sizeof fixed);
    for (size_t i = 0; i < ncases; i++)
        tests[nfixed + i] = (struct CMUnitTest){.name = cases[i].name, .test_func = test_file,
                                                .initial_state = &cases[i]};
    /* cmocka_run_group_tests wants an array whose size is known at compile
     * time; the function behind it takes the count */
    int rc = _cmocka_run_group_tests("malformed", tests, ntests, setup, teardown);
    for (size_t i = 0; i < ncases; i++) {
        free(cases[i].name);
        free(cases[i].expect);
        free(cases[i].path);
    }
    free(cases);
    free(tests);
    free(corpus_dir);
    return rc;
}
