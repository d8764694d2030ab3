/* test_readme.c - every shell example in README.md runs as written.
 *
 * The rule, which the README's examples follow:
 *
 *   - An example is an indented (four-space) block whose first line starts
 *     with a command: `./aft`, `aft`, `mpirun`, `srun`, `parallel`, `make`,
 *     `cc`, `jq`, `for`, `python3` or `/usr/bin/python3`, or a shell variable
 *     assignment (`M=...`). Other indented blocks (the formula, the C
 *     program, which cli/tests/test_install.c builds and runs) are not.
 *   - Each example runs on its own in a new empty directory that holds
 *     `./aft` (a link to $AFT_BIN), `testdata/` (a link to $AFT_TESTDATA)
 *     and `python/` (the package beside it, for PYTHONPATH=python), with
 *     `bash -e -o pipefail`, so a failing command anywhere in a line or a
 *     pipe fails it. It uses shipped files or makes
 *     its inputs in its own first lines; it calls `./aft`, never a bare `aft`.
 *   - An HTML comment in the text since the previous block changes the next
 *     one (keep them rare, and say why):
 *       <!-- example: skip (why) -->          the block does not run here
 *       <!-- example: skip WORD (why) -->     its lines starting with WORD
 *                                             (and their continuations) do not
 *       <!-- example: small: s/OLD/NEW/ ... --> each OLD is replaced by NEW
 *                                             everywhere in it (smaller sizes)
 *   - With $AFT_TEST_QUICK (make test-valgrind) the blocks marked small are
 *     skipped, with a note: even small, a benchmark under valgrind is slow.
 *   - A block calling mpirun is skipped, with a note, when mpirun is not on
 *     the PATH or aft was built without MPI (aft --version says); it runs
 *     with OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1.
 *   - A block importing torch (aft.torch's) is skipped, with a note, when
 *     /usr/bin/python3 has no PyTorch (it is optional).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

typedef struct {
    char *text;     /* the block's lines, four spaces removed, '\n'-ended */
    char *marker;   /* what follows "example:" in the marker before it, or NULL */
    size_t line;    /* its first line's number in the file, from 1 */
} block;

typedef struct {
    block *b;
    size_t n;
} blocks;

static void blocks_free(blocks *bs)
{
    for (size_t i = 0; i < bs->n; i++) free(bs->b[i].text), free(bs->b[i].marker);
    free(bs->b);
    bs->b = NULL, bs->n = 0;
}

/* the marker's body in line [p, e): "skip (why)" from "<!-- example: skip (why) -->" */
static char *marker_in(const char *p, const char *e)
{
    const char *m = NULL;
    for (const char *s = p; s + 4 <= e; s++)
        if (strncmp(s, "<!--", 4) == 0) m = s;
    if (!m) return NULL;
    m += 4;
    while (m < e && *m == ' ') m++;
    if ((size_t)(e - m) < 8 || strncmp(m, "example:", 8) != 0) return NULL;
    m += 8;
    while (m < e && *m == ' ') m++;
    const char *end = m;
    while (end + 3 <= e && strncmp(end, "-->", 3) != 0) end++;
    if (end + 3 > e) fail_msg("README.md: a marker runs past its line: %.*s", (int)(e - p), p);
    while (end > m && end[-1] == ' ') end--;
    char *out = harness_fmt("%.*s", (int)(end - m), m);
    assert_non_null(out);
    return out;
}

/* every indented block of text, with the marker written before it */
static blocks parse(const char *text)
{
    blocks bs = {NULL, 0};
    char *marker = NULL;
    size_t lineno = 1;
    const char *p = text;
    int prev_blank = 1;
    while (*p) {
        const char *e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        int blank = e == p;
        if (!blank && prev_blank == 1 && strncmp(p, "    ", 4) == 0) {
            /* a block: indented lines and blank ones up to a line of prose */
            size_t cap = 256, n = 0;
            char *t = malloc(cap);
            assert_non_null(t);
            size_t first = lineno;
            while (*p) {
                e = strchr(p, '\n');
                if (!e) e = p + strlen(p);
                if (e != p && strncmp(p, "    ", 4) != 0) break;
                size_t len = e > p ? (size_t)(e - p) - 4 : 0;
                if (n + len + 2 > cap) {
                    cap = 2 * (n + len + 2);
                    t = realloc(t, cap);
                    assert_non_null(t);
                }
                if (len) memcpy(t + n, p + 4, len);
                n += len;
                t[n++] = '\n';
                p = *e ? e + 1 : e;
                lineno++;
            }
            while (n > 1 && t[n - 1] == '\n' && t[n - 2] == '\n') n--;
            t[n] = '\0';
            bs.b = realloc(bs.b, (bs.n + 1) * sizeof *bs.b);
            assert_non_null(bs.b);
            bs.b[bs.n++] = (block){t, marker, first};
            marker = NULL;
            prev_blank = 0;
            continue;
        }
        char *m = marker_in(p, e);
        if (m) free(marker), marker = m;
        prev_blank = blank || (m && strncmp(p, "<!--", 4) == 0);
        p = *e ? e + 1 : e;
        lineno++;
    }
    free(marker);
    return bs;
}

/* 1 if the block is a shell example by the rule above */
static int is_example(const char *t)
{
    static const char *const cmds[] = {"./aft", "aft", "mpirun", "srun", "parallel", "make", "cc",
                                       "jq", "for", "python3", "/usr/bin/python3"};
    size_t w = strcspn(t, " \n");
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (strlen(cmds[i]) == w && strncmp(t, cmds[i], w) == 0) return 1;
    size_t name = strspn(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_0123456789");
    return name > 0 && t[name] == '=';
}

/* t with every old (ol bytes) replaced by new (nl bytes), malloc'd; NULL
 * when t holds no old */
static char *replace_all(const char *t, const char *old, size_t ol, const char *new, size_t nl)
{
    size_t count = 0, tl = strlen(t);
    for (const char *a = t; (a = memmem(a, tl - (size_t)(a - t), old, ol)); a += ol) count++;
    if (!count) return NULL;
    char *out = malloc(tl - count * ol + count * nl + 1), *o = out;
    assert_non_null(out);
    const char *a = t;
    for (const char *at; (at = memmem(a, tl - (size_t)(a - t), old, ol)) != NULL; a = at + ol) {
        memcpy(o, a, (size_t)(at - a)), o += at - a;
        memcpy(o, new, nl), o += nl;
    }
    strcpy(o, a);
    return out;
}

/* the block as it runs: the marker's substitutions made and lines dropped;
 * NULL when the marker skips it all. *why: the reason of a skip. */
static char *apply_marker(const block *b, const char **why)
{
    *why = NULL;
    char *t = strdup(b->text);
    assert_non_null(t);
    const char *m = b->marker;
    if (!m) return t;
    if (strncmp(m, "skip", 4) == 0) {
        const char *r = m + 4;
        while (*r == ' ') r++;
        if (*r == '(') {
            *why = r;
            free(t);
            return NULL;
        }
        /* skip WORD (why): drop the lines starting with WORD */
        size_t w = strcspn(r, " ");
        const char *reason = strchr(r, '(');
        if (w == 0 || !reason) fail_msg("README.md:%zu: a skip marker says why in parentheses: %s", b->line, m);
        char *out = malloc(strlen(t) + 1);
        assert_non_null(out);
        size_t n = 0;
        int dropping = 0;
        for (char *l = t; *l;) {
            char *e = strchr(l, '\n');
            size_t len = (size_t)(e - l) + 1;
            if (!dropping) dropping = strncmp(l, r, w) == 0 && (l[w] == ' ' || l[w] == '\n');
            if (!dropping) memcpy(out + n, l, len), n += len;
            if (dropping && !(e > l && e[-1] == '\\')) dropping = 0;   /* its last line */
            l = e + 1;
        }
        out[n] = '\0';
        free(t);
        return out;
    }
    if (strncmp(m, "small:", 6) != 0)
        fail_msg("README.md:%zu: an unknown marker (skip (why), skip WORD (why), small: s/OLD/NEW/): %s",
                 b->line, m);
    for (const char *s = m + 6; *s;) {
        while (*s == ' ') s++;
        if (!*s) break;
        const char *old = s + 2, *mid = strchr(old, '/'), *end = mid ? strchr(mid + 1, '/') : NULL;
        if (strncmp(s, "s/", 2) != 0 || !mid || !end || mid == old)
            fail_msg("README.md:%zu: a substitution is s/OLD/NEW/: %s", b->line, s);
        size_t ol = (size_t)(mid - old), nl = (size_t)(end - mid - 1);
        char *u = replace_all(t, old, ol, mid + 1, nl);
        int found = u != NULL;
        if (u) free(t), t = u;
        if (!found) fail_msg("README.md:%zu: the substitution finds no %.*s in the block", b->line, (int)ol, old);
        s = end + 1;
    }
    return t;
}

/* 1 if PROG is an executable on the PATH */
static int on_path(const char *prog)
{
    char *cmd = harness_fmt("command -v %s >/dev/null 2>&1", prog);
    assert_non_null(cmd);
    int st = system(cmd);
    free(cmd);
    return st == 0;
}

/* 1 if the aft under test was built with MPI (its --version says) */
static int aft_has_mpi(void)
{
    char *cmd = harness_fmt("'%s' --version | grep -qx 'mpi: built in'", harness_aft_bin());
    assert_non_null(cmd);
    int st = system(cmd);
    free(cmd);
    return st == 0;
}

/* 1 if /usr/bin/python3, the examples' interpreter, imports torch */
static int python_has_torch(void)
{
    return system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

/* an absolute path for p (which exists) */
static char *absolute(const char *p)
{
    char buf[PATH_MAX];
    if (!realpath(p, buf)) fail_msg("cannot resolve %s", p);
    char *out = strdup(buf);
    assert_non_null(out);
    return out;
}

/* Runs script in a new directory dir (./aft, testdata/ and python/ linked into it)
 * with bash -e -o pipefail (killed after 300 s). 0 when it exits 0; else -1 and *err its stderr. */
static int run_script(const char *dir, const char *script, char **err)
{
    *err = NULL;
    char *bin = absolute(harness_aft_bin()), *data = absolute(harness_testdata());
    char *aft = harness_path(dir, "aft"), *td = harness_path(dir, "testdata");
    char *sh = harness_path(dir, "example.sh"), *errf = harness_path(dir, "example.err");
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(symlink(bin, aft), 0);
    assert_int_equal(symlink(data, td), 0);
    /* python/, the tree's package beside testdata/, when there is one */
    char *py_src = harness_fmt("%s/../python", data), *py = harness_path(dir, "python");
    if (access(py_src, F_OK) == 0) assert_int_equal(symlink(py_src, py), 0);
    free(py_src), free(py);
    assert_int_equal(harness_write_file(sh, script, strlen(script)), 0);
    char *cmd = harness_fmt("cd '%s' && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                            "timeout 300 bash -e -o pipefail example.sh </dev/null >example.out 2>example.err", dir);
    assert_non_null(cmd);
    int st = system(cmd);
    if (st != 0) {
        if (harness_read_file(errf, err, NULL) != 0) *err = strdup("(no stderr)");
    }
    free(cmd), free(errf), free(sh), free(td), free(aft), free(data), free(bin);
    return st == 0 ? 0 : -1;
}

static blocks readme_blocks(void)
{
    char *path = harness_fmt("%s/../README.md", harness_testdata()), *text;
    assert_non_null(path);
    if (harness_read_file(path, &text, NULL) != 0) fail_msg("cannot read %s", path);
    blocks bs = parse(text);
    free(text), free(path);
    return bs;
}

/* every example of README.md runs; the failures are listed together */
static void test_examples_run(void **state)
{
    /* under make test-valgrind aft is a wrapper script that finds itself
     * by its own path, which the examples' ./aft symlink hides: make test
     * runs the examples on the real binary */
    if (harness_quick()) skip();
    (void)state;
    blocks bs = readme_blocks();
    size_t examples = 0, ran = 0, failed = 0;
    int mpirun = on_path("mpirun"), mpi = aft_has_mpi(), torch = python_has_torch();
    for (size_t i = 0; i < bs.n; i++) {
        const block *b = &bs.b[i];
        if (!is_example(b->text)) continue;
        const char *why;
        char *script = apply_marker(b, &why);
        if (!script) {
            printf("# README.md:%zu: skipped %s\n", b->line, why);
            continue;
        }
        examples++;
        if (harness_quick() && b->marker && strncmp(b->marker, "small:", 6) == 0) {
            printf("# README.md:%zu: skipped: a slow example, and AFT_TEST_QUICK is set\n", b->line);
            free(script);
            continue;
        }
        if (strstr(script, "mpirun") && !mpirun) {
            printf("# README.md:%zu: skipped: no mpirun on the PATH\n", b->line);
            free(script);
            continue;
        }
        if (strstr(script, "mpirun") && !mpi) {
            printf("# README.md:%zu: skipped: this aft was built without MPI\n", b->line);
            free(script);
            continue;
        }
        if ((strstr(script, "import torch") || strstr(script, "aft.torch")) && !torch) {
            printf("# README.md:%zu: skipped: /usr/bin/python3 has no PyTorch\n", b->line);
            free(script);
            continue;
        }
        char name[32], *err;
        snprintf(name, sizeof name, "line%zu", b->line);
        char *dir = harness_tmp(name);
        if (run_script(dir, script, &err) != 0) {
            size_t l = strcspn(b->text, "\n");
            fprintf(stderr, "README.md:%zu: the example failed: %.*s\n%s\n", b->line, (int)l, b->text, err);
            failed++;
        }
        ran++;
        free(err), free(dir), free(script);
    }
    blocks_free(&bs);
    if (failed) fail_msg("%zu of %zu README examples failed (above)", failed, ran);
    if (examples < 9) fail_msg("only %zu README examples found: is the rule still the README's?", examples);
}

/* the examples call ./aft, and the README says once what ./aft and aft are */
static void test_examples_call_dot_aft(void **state)
{
    (void)state;
    blocks bs = readme_blocks();
    for (size_t i = 0; i < bs.n; i++) {
        const block *b = &bs.b[i];
        const char *why;
        if (!is_example(b->text)) continue;
        char *script = apply_marker(b, &why);
        if (!script) continue;
        for (const char *l = script; *l; l = strchr(l, '\n') + 1) {
            const char *s = l + strspn(l, " ");
            if (strncmp(s, "aft ", 4) == 0 || strstr(l, "| aft ") || strstr(l, "; aft "))
                fail_msg("README.md:%zu: an example calls a bare aft (./aft after make): %.*s", b->line,
                         (int)strcspn(l, "\n"), l);
        }
        free(script);
    }
    blocks_free(&bs);
    char *path = harness_fmt("%s/../README.md", harness_testdata()), *text;
    assert_non_null(path);
    assert_int_equal(harness_read_file(path, &text, NULL), 0);
    const char *say = strstr(text, "After `make` the binary is\n`./aft`");
    if (!say || say - text > 2000) fail_msg("README.md does not say near its top that make's binary is ./aft");
    free(text), free(path);
}

/* the runner fails an example whose pipe fails inside, or whose first command
 * fails, and the markers do what the rule says */
static void test_rule_itself(void **state)
{
    /* under make test-valgrind aft is a wrapper script that finds itself
     * by its own path, which the examples' ./aft symlink hides: make test
     * runs the examples on the real binary */
    if (harness_quick()) skip();
    (void)state;
    static const char readme[] =
        "prose\n\n"
        "    ./aft mask --len 3 --window 1 | false | cat\n\n"
        "prose <!-- example: skip (no reason to run) -->\n\n"
        "    ./aft no-such-command\n\n"
        "<!-- example: small: s/4096/3/ -->\n"
        "    ./aft mask --len 4096 --window 1 \\\n"
        "        --causal\n"
        "    ./aft mask --len 4096 --window 2\n\n"
        "<!-- example: skip srun (no Slurm) -->\n"
        "    ./aft mask --len 2 --window 1\n"
        "    srun -n 32 ./aft \\\n"
        "        run x.npy\n"
        "    M=1; test \"$M\" = 1\n\n"
        "prose\n\n"
        "    Y[t,c] = sigmoid(Q[t,c])\n";
    blocks bs = parse(readme);
    assert_int_equal(bs.n, 5);
    const char *why;
    char *err;
    /* a failure inside a pipe fails the block */
    assert_true(is_example(bs.b[0].text));
    char *s = apply_marker(&bs.b[0], &why), *dir = harness_tmp("rule_pipe");
    assert_int_equal(run_script(dir, s, &err), -1);
    free(err), free(dir), free(s);
    /* skip */
    assert_null(apply_marker(&bs.b[1], &why));
    assert_string_equal(why, "(no reason to run)");
    /* small: every occurrence, continuation lines kept */
    s = apply_marker(&bs.b[2], &why);
    assert_string_equal(s, "./aft mask --len 3 --window 1 \\\n    --causal\n./aft mask --len 3 --window 2\n");
    dir = harness_tmp("rule_small");
    assert_int_equal(run_script(dir, s, &err), 0);
    free(dir), free(s);
    /* skip WORD drops that command with its continuation */
    s = apply_marker(&bs.b[3], &why);
    assert_string_equal(s, "./aft mask --len 2 --window 1\nM=1; test \"$M\" = 1\n");
    dir = harness_tmp("rule_srun");
    assert_int_equal(run_script(dir, s, &err), 0);
    free(dir), free(s);
    /* the formula is no example */
    assert_false(is_example(bs.b[4].text));
    blocks_free(&bs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_itself),
        cmocka_unit_test(test_examples_call_dot_aft),
        cmocka_unit_test(test_examples_run),
    };
    return cmocka_run_group_tests_name("cli readme", tests, harness_setup, harness_teardown);
}
