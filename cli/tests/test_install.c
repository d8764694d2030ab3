/* test_install.c - `make install` and `make uninstall` into a temporary
 * prefix: the files (the shipped model among them), a program built
 * against the installed library through pkg-config, DESTDIR staging; and
 * the bash completion in completion/.
 *
 * The repository is $AFT_TESTDATA/.. . make runs with `-o aft -o
 * lib/libaft.a -o lib/libaft.so`, so it copies the files `make all` built
 * before the tests and never compiles anything itself (no race with a build
 * running beside it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aft.h"
#include "checks.h"
#include "harness.h"

static char *root;   /* the repository */

static int setup(void **state)
{
    int rc = harness_setup(state);
    char *up = harness_path(harness_testdata(), "..");
    root = up ? realpath(up, NULL) : NULL;
    free(up);
    return rc == 0 && root ? 0 : -1;
}

static int teardown(void **state)
{
    int rc = harness_teardown(state);
    free(root);
    return rc;
}

/* ---------------------------------------------------------------- helpers */

/* s in single quotes for sh, into a static ring of buffers */
static const char *q(const char *s)
{
    static char ring[8][4096];
    static int next;
    char *b = ring[next++ % 8];
    size_t n = 0;
    b[n++] = '\'';
    for (; *s && n < sizeof ring[0] - 8; s++) {
        if (*s == '\'') {
            memcpy(b + n, "'\\''", 4);
            n += 4;
        } else {
            b[n++] = *s;
        }
    }
    b[n++] = '\'';
    b[n] = '\0';
    return b;
}

/* Runs a shell command (stderr joined to stdout) and returns its exit
 * status; *out gets the output (malloc'd) when out is not NULL. make runs
 * without the MAKEFLAGS of a `make test` around us (its jobserver is not
 * ours to use). */
static int sh(char **out, const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && (size_t)n < sizeof cmd - 64);
    strcat(cmd, " 2>&1");
    char full[16500];
    snprintf(full, sizeof full, "unset MAKEFLAGS MFLAGS MAKELEVEL; %s", cmd);
    fflush(NULL);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t k;
    while ((k = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += k;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[len] = '\0';
    int status = pclose(p);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (out) *out = buf;
    else free(buf);
    return code;
}

/* sh() that must succeed; returns the output (malloc'd) */
#define SH_OK(...) sh_ok(__FILE__, __LINE__, __VA_ARGS__)
static char *sh_ok(const char *file, int line, const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char *out;
    int code = sh(&out, "%s", cmd);
    if (code != 0) {
        print_error("%s:%d: `%s` exited %d:\n%s\n", file, line, cmd, code, out);
        free(out);
        fail();
    }
    return out;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* prefix + rel, malloc'd */
static char *at(const char *prefix, const char *rel)
{
    char *p = harness_path(prefix, rel);
    assert_non_null(p);
    return p;
}

/* the files make install writes, relative to the prefix */
static const char *const installed[] = {
    "bin/aft",
    "lib/libaft.a",
    "lib/libaft.so.1.0.0",
    "lib/libaft.so.1",
    "lib/libaft.so",
    "include/aft.h",
    "lib/pkgconfig/aft.pc",
    "share/man/man1/aft.1",
    "share/bash-completion/completions/aft",
    "share/aft/labml_aft_fortunes.safetensors",
    "share/aft/README.md",
};
/* where each comes from in the repository (NULL: generated) */
static const char *const sources[] = {
    "aft", "lib/libaft.a", "lib/libaft.so", "lib/libaft.so", "lib/libaft.so", "lib/aft.h", NULL, "man/aft.1",
    "completion/aft.bash",
    "testdata/model/labml_aft_fortunes.safetensors", "testdata/model/README.md",
};
#define N_INSTALLED (sizeof installed / sizeof installed[0])

/* A program that uses the installed library: an .npy written and read
 * back, and the bare AFT operator (simple variant) on a tiny input checked
 * against the formula. Prints "ok". */
static const char program[] =
    "#include <aft.h>\n"
    "#include <math.h>\n"
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "\n"
    "int main(void)\n"
    "{\n"
    "    enum { T = 3, C = 2 };\n"
    "    float q[T * C] = {0.5f, -1, 2, 0, -0.25f, 1};\n"
    "    float k[T * C] = {1, 2, -1, 0.5f, 3, -2};\n"
    "    float v[T * C] = {1, -1, 2, 0.5f, -3, 4};\n"
    "    float y[T * C];\n"
    "    aft_error err = {{0}};\n"
    "    aft_tensor t = {0}, back;\n"
    "    t.dtype = AFT_F32; t.ndim = 2; t.shape[0] = T; t.shape[1] = C;\n"
    "    t.nelem = T * C; t.nbytes = sizeof q; t.data = q;\n"
    "    if (aft_npy_write(\"q.npy\", &t, &err) != AFT_OK ||\n"
    "        aft_npy_read(\"q.npy\", &back, NULL, &err) != AFT_OK) {\n"
    "        printf(\"npy: %s\\n\", err.msg);\n"
    "        return 1;\n"
    "    }\n"
    "    if (back.nbytes != sizeof q || memcmp(back.data, q, sizeof q) != 0) {\n"
    "        puts(\"npy: round trip differs\");\n"
    "        return 1;\n"
    "    }\n"
    "    aft_tensor_free(&back);\n"
    "    aft_bias bias = {0};\n"
    "    bias.kind = AFT_BIAS_NONE;\n"
    "    aft_config cfg = {0};\n"
    "    cfg.variant = AFT_SIMPLE;\n"
    "    cfg.threads = 1;\n"
    "    if (aft_op_forward(y, q, k, v, &bias, &cfg, 1, T, C, C, &err) != AFT_OK) {\n"
    "        printf(\"op: %s\\n\", err.msg);\n"
    "        return 1;\n"
    "    }\n"
    "    /* Y[t,c] = sigmoid(q) * sum_t' exp(k) v / sum_t' exp(k), all t' */\n"
    "    for (int t2 = 0; t2 < T; t2++)\n"
    "        for (int c = 0; c < C; c++) {\n"
    "            double num = 0, den = 0;\n"
    "            for (int s = 0; s < T; s++) {\n"
    "                num += exp(k[s * C + c]) * v[s * C + c];\n"
    "                den += exp(k[s * C + c]);\n"
    "            }\n"
    "            double want = num / den / (1 + exp(-q[t2 * C + c]));\n"
    "            if (fabs(y[t2 * C + c] - want) > 1e-5) {\n"
    "                printf(\"op: y[%d,%d] = %g, want %g\\n\", t2, c, y[t2 * C + c], want);\n"
    "                return 1;\n"
    "            }\n"
    "        }\n"
    "    puts(\"ok\");\n"
    "    return 0;\n"
    "}\n";

/* ---------------------------------------------------------------- the README's example */

/* The lines of the indented (Markdown code) block of text that starts at
 * or before p and holds p, each without its four spaces; the block's end
 * (the line after it) into *end. malloc'd. */
static char *code_block(const char *text, const char *p, const char **end)
{
    /* back to the block's first line: past blank lines and indented ones */
    const char *start = p;
    while (start > text) {
        const char *prev = start - 1;   /* the '\n' ending the line before */
        const char *ls = prev;
        while (ls > text && ls[-1] != '\n') ls--;
        if (!(prev == ls || strncmp(ls, "    ", 4) == 0)) break;
        start = ls;
    }
    while (*start == '\n') start++;
    char *out = malloc(strlen(start) + 1);
    assert_non_null(out);
    size_t n = 0;
    const char *line = start;
    while (*line) {
        const char *e = strchr(line, '\n');
        size_t len = e ? (size_t)(e - line) : strlen(line);
        if (len > 0 && strncmp(line, "    ", 4) != 0) break;   /* prose: the block ended */
        if (len > 4) {
            memcpy(out + n, line + 4, len - 4);
            n += len - 4;
        }
        out[n++] = '\n';
        line = e ? e + 1 : line + len;
    }
    while (n > 1 && out[n - 1] == '\n' && out[n - 2] == '\n') n--;   /* trailing blank lines */
    out[n] = '\0';
    *end = line;
    return out;
}

/* README.md's library example: the C program (the code block that includes
 * "aft.h") and the shell lines that build and run it (the next block) */
static void readme_example(char **prog, char **script)
{
    char *path = at(root, "README.md"), *text;
    assert_int_equal(harness_read_file(path, &text, NULL), 0);
    const char *inc = strstr(text, "\n    #include \"aft.h\"\n"), *end;
    if (!inc) fail_msg("%s has no indented C block that includes \"aft.h\"", path);
    *prog = code_block(text, inc + 1, &end);
    const char *next = strstr(end, "\n    ");
    assert_non_null(next);
    *script = code_block(text, next + 1, &end);
    if (!strstr(*script, "pkg-config --cflags --libs aft"))
        fail_msg("the block after the README's example does not build it with pkg-config:\n%s", *script);
    free(text);
    free(path);
}

/* Builds and runs the README's example as its own lines say, in a new
 * directory under work/ that sees the repository's testdata/, with env's
 * pkg-config settings and the installed aft first on PATH: once with
 * `pkg-config --libs`, once with `pkg-config --static --libs`. */
static void run_readme_example(const char *work, const char *env, const char *bindir)
{
    char *prog, *script;
    readme_example(&prog, &script);
    static const char *const modes[] = {"", "--static "};
    for (int m = 0; m < 2; m++) {
        char *cwd = at(work, m ? "readme_static" : "readme");
        assert_int_equal(mkdir(cwd, 0777), 0);
        char *src = at(cwd, "prog.c"), *data = at(root, "testdata"), *link = at(cwd, "testdata");
        assert_int_equal(harness_write_file(src, prog, strlen(prog)), 0);
        assert_int_equal(symlink(data, link), 0);
        /* the script with --static after pkg-config in the static round */
        char lines[8192];
        const char *cut = strstr(script, "pkg-config --cflags");
        size_t head = (size_t)(cut - script) + strlen("pkg-config ");
        snprintf(lines, sizeof lines, "%.*s%s%s", (int)head, script, modes[m], script + head);
        char *out = SH_OK("cd %s && PATH=%s:\"$PATH\" %s sh -ex -c %s", q(cwd), q(bindir), env, q(lines));
        /* aft compare said close (and exited 0, as sh -e requires) */
        if (!strstr(out, "\nclose\n")) fail_msg("the README's example:\n%s", out);
        free(out);
        free(link);
        free(data);
        free(src);
        free(cwd);
    }
    free(script);
    free(prog);
}

/* ---------------------------------------------------------------- tests */

/* make install copies ./aft, lib/libaft.a and lib/libaft.so, which `make test` builds
 * first; a run that built elsewhere (make test-asan builds into its own
 * directory) may not have them: skip rather than build them here */
static void need_built_files(void)
{
    static const char *const files[] = {"aft", "lib/libaft.a", "lib/libaft.so"};
    for (int i = 0; i < 3; i++) {
        char *p = at(root, files[i]);
        int ok = exists(p);
        free(p);
        if (!ok) {
            print_message("skipped: %s/%s is not built (make all)\n", root, files[i]);
            skip();
        }
    }
}

static void test_install_uninstall(void **state)
{
    (void)state;
    need_built_files();
    char *prefix = at(harness_dir(), "prefix");
    char *out = SH_OK("make --no-print-directory -C %s -o aft -o lib/libaft.a -o lib/libaft.so install PREFIX=%s",
                      q(root), q(prefix));
    /* nothing was compiled: install only copies */
    if (strstr(out, " -c ") || strstr(out, "ar rcs")) fail_msg("install built something:\n%s", out);
    free(out);

    for (size_t i = 0; i < N_INSTALLED; i++) {
        char *p = at(prefix, installed[i]);
        if (!exists(p)) fail_msg("not installed: %s", p);
        if (sources[i]) {
            char *src = at(root, sources[i]);
            check_same_file(p, src);
            free(src);
        }
        free(p);
    }
    char *bin = at(prefix, "bin/aft");
    assert_int_equal(access(bin, X_OK), 0);
    out = SH_OK("%s --version", q(bin));
    assert_true(strncmp(out, "aft " AFT_VERSION "\n", strlen("aft " AFT_VERSION "\n")) == 0);
    free(out);

    /* pkg-config finds it and names the installed paths */
    char *pcdir = at(prefix, "lib/pkgconfig"), env[8192];
    snprintf(env, sizeof env, "PKG_CONFIG_PATH=%s", q(pcdir));
    out = SH_OK("%s pkg-config --modversion aft", env);
    assert_string_equal(out, AFT_VERSION "\n");
    free(out);
    out = SH_OK("%s pkg-config --cflags aft", env);
    char want[4096];
    snprintf(want, sizeof want, "-I%s/include", prefix);
    if (!strstr(out, want)) fail_msg("--cflags lacks %s: %s", want, out);
    free(out);
    out = SH_OK("%s pkg-config --libs aft", env);
    snprintf(want, sizeof want, "-L%s/lib -laft", prefix);
    if (!strstr(out, want)) fail_msg("--libs lacks %s: %s", want, out);
    free(out);

    /* a program built with plain --libs and with --static --libs runs */
    char *src = at(harness_dir(), "prog.c");
    assert_int_equal(harness_write_file(src, program, sizeof program - 1), 0);
    const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
    static const char *const modes[] = {"", "--static"};
    for (int m = 0; m < 2; m++) {
        char *exe = at(harness_dir(), m ? "prog_static" : "prog");
        out = SH_OK("cd %s && %s -std=c11 -o %s %s $(%s pkg-config %s --cflags --libs aft)",
                    q(harness_dir()), cc, q(exe), q(src), env, modes[m]);
        free(out);
        out = SH_OK("cd %s && %s", q(harness_dir()), q(exe));
        assert_string_equal(out, "ok\n");
        free(out);
        free(exe);
    }

    /* and the README's example, as the README builds and runs it */
    char *bindir = at(prefix, "bin");
    run_readme_example(harness_dir(), env, bindir);
    free(bindir);

    /* uninstall removes exactly what install wrote */
    char *other = at(prefix, "bin/other-tool");
    assert_int_equal(harness_write_file(other, "x", 1), 0);
    out = SH_OK("make --no-print-directory -C %s -o aft -o lib/libaft.a -o lib/libaft.so uninstall PREFIX=%s",
                q(root), q(prefix));
    free(out);
    for (size_t i = 0; i < N_INSTALLED; i++) {
        char *p = at(prefix, installed[i]);
        if (exists(p)) fail_msg("still there after uninstall: %s", p);
        free(p);
    }
    assert_true(exists(other));
    assert_true(exists(src));

    free(other);
    free(src);
    free(pcdir);
    free(bin);
    free(prefix);
}

/* DESTDIR stages the files; aft.pc names PREFIX, not the staging dir */
static void test_destdir(void **state)
{
    (void)state;
    need_built_files();
    char *stage = at(harness_dir(), "stage");
    char *out = SH_OK("make --no-print-directory -C %s -o aft -o lib/libaft.a -o lib/libaft.so install DESTDIR=%s PREFIX=/opt/aft",
                      q(root), q(stage));
    free(out);
    char *base = at(stage, "opt/aft");
    for (size_t i = 0; i < N_INSTALLED; i++) {
        char *p = at(base, installed[i]);
        if (!exists(p)) fail_msg("not staged: %s", p);
        free(p);
    }
    char *pc = at(base, "lib/pkgconfig/aft.pc"), *text;
    assert_int_equal(harness_read_file(pc, &text, NULL), 0);
    assert_non_null(strstr(text, "prefix=/opt/aft\n"));
    assert_non_null(strstr(text, "libdir=/opt/aft/lib\n"));
    assert_non_null(strstr(text, "includedir=/opt/aft/include\n"));
    assert_non_null(strstr(text, "Version: " AFT_VERSION "\n"));
    assert_null(strstr(text, stage));
    assert_null(strstr(text, "@"));
    free(text);

    /* the README's example through pkg-config from the staged tree:
     * PKG_CONFIG_SYSROOT_DIR puts the stage before every -I and -L path
     * aft.pc names (not before the run path, /opt/aft/lib: the staged
     * program finds libaft.so through LD_LIBRARY_PATH) */
    char *pcdir = at(base, "lib/pkgconfig"), *bindir = at(base, "bin"), *work = at(harness_dir(), "staged"), env[8192];
    char *libdir = at(base, "lib");
    assert_int_equal(mkdir(work, 0777), 0);
    snprintf(env, sizeof env, "PKG_CONFIG_PATH=%s PKG_CONFIG_SYSROOT_DIR=%s LD_LIBRARY_PATH=%s", q(pcdir), q(stage),
             q(libdir));
    free(libdir);
    out = SH_OK("%s pkg-config --libs aft", env);
    char want[4096];
    snprintf(want, sizeof want, "-L%s/opt/aft/lib -laft", stage);
    if (!strstr(out, want)) fail_msg("--libs lacks %s: %s", want, out);
    free(out);
    run_readme_example(work, env, bindir);
    free(work);
    free(bindir);
    free(pcdir);

    out = SH_OK("make --no-print-directory -C %s -o aft -o lib/libaft.a -o lib/libaft.so uninstall DESTDIR=%s PREFIX=/opt/aft",
                q(root), q(stage));
    free(out);
    for (size_t i = 0; i < N_INSTALLED; i++) {
        char *p = at(base, installed[i]);
        assert_false(exists(p));
        free(p);
    }
    free(pc);
    free(base);
    free(stage);
}

/* ---------------------------------------------------------------- completion */

/* Runs the completion function as bash would for the words given (the last
 * one is being completed) in directory cwd, and returns COMPREPLY, one
 * entry per line (malloc'd). */
static char *complete(const char *cwd, const char *const *words)
{
    char arr[4096] = "";
    size_t n = 0;
    for (; words[n]; n++) {
        strcat(arr, q(words[n]));
        strcat(arr, " ");
    }
    char *script = at(root, "completion/aft.bash");
    /* the script, the words (quoted for eval) and the index go in as $0, $1
     * and $2 */
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd %s && bash --norc --noprofile -c 'source \"$0\"; eval \"COMP_WORDS=($1)\"; COMP_CWORD=$2; "
             "_aft; [ ${#COMPREPLY[@]} -eq 0 ] || printf \"%%s\\n\" \"${COMPREPLY[@]}\"' %s %s %zu",
             q(cwd), q(script), q(arr), n - 1);
    free(script);
    return SH_OK("%s", cmd);
}
#define COMPLETE(cwd, ...) complete((cwd), (const char *const[]){__VA_ARGS__, NULL})

/* the completions, one per line, are exactly want (also one per line) */
#define ASSERT_COMPLETES(want, cwd, ...)                                     \
    do {                                                                     \
        char *got_ = COMPLETE(cwd, __VA_ARGS__);                             \
        if (strcmp(got_, want) != 0) fail_msg("completions:\n%s\nwanted:\n%s", got_, want); \
        free(got_);                                                          \
    } while (0)

/* 1 if line is one of the lines of list */
static int has_line(const char *list, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, line, n) == 0) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

static void test_completion_words(void **state)
{
    (void)state;
    ASSERT_COMPLETES("run\n", harness_dir(), "aft", "ru");
    ASSERT_COMPLETES("compare\nconvert\n", harness_dir(), "aft", "co");
    ASSERT_COMPLETES("info\nrun\ngrad\nmask\ncompare\nconvert\nmodel\ngenerate\nencode\ndecode\nbench\ntrain\nhelp\n",
                     harness_dir(), "aft",
                     "");
    ASSERT_COMPLETES("decode\n", harness_dir(), "aft", "de");
    ASSERT_COMPLETES("--text-file\n", harness_dir(), "aft", "encode", "--te");
    ASSERT_COMPLETES("generate\n", harness_dir(), "aft", "ge");
    ASSERT_COMPLETES("btd\ntbd\n", harness_dir(), "aft", "model", "--layout", "");
    ASSERT_COMPLETES("--temperature\n--top-k\n--threads\n--timing\n", harness_dir(), "aft", "generate", "--t");
    ASSERT_COMPLETES("", harness_dir(), "aft", "generate", "--prompt", "");   /* free text: nothing to offer */
    ASSERT_COMPLETES("--help\n--version\n--quiet\n", harness_dir(), "aft", "--");
    ASSERT_COMPLETES("compare\nconvert\n", harness_dir(), "aft", "help", "co");
    ASSERT_COMPLETES("--dtype\n", harness_dir(), "aft", "convert", "--dt");
    ASSERT_COMPLETES("f32\nf16\nbf16\nf64\n", harness_dir(), "aft", "convert", "--dtype", "");
    ASSERT_COMPLETES("bf16\n", harness_dir(), "aft", "convert", "-o", "x.safetensors", "--dtype", "b");
    ASSERT_COMPLETES("local\n", harness_dir(), "aft", "run", "--variant", "l");
    ASSERT_COMPLETES("btd\ntbd\n", harness_dir(), "aft", "run", "--layout", "");
    ASSERT_COMPLETES("fast\nreference\nboth\n", harness_dir(), "aft", "bench", "--impl", "");
    ASSERT_COMPLETES("full,local\n", harness_dir(), "aft", "bench", "--variant", "full,lo");
    /* "--format=j": bash splits at '=', so the word is "j" */
    ASSERT_COMPLETES("json\n", harness_dir(), "aft", "mask", "--format", "=", "j");
    ASSERT_COMPLETES("npy\nnpz\nsafetensors\n", harness_dir(), "aft", "convert", "--format", "");
    ASSERT_COMPLETES("", harness_dir(), "aft", "run", "--threads", "");   /* a number: nothing to offer */
    ASSERT_COMPLETES("--equal-nan\n", harness_dir(), "aft", "compare", "--e");
}

/* Every subcommand's options as the completion lists them are exactly the
 * options its --help names (so neither can drift from the other). */
static void test_completion_matches_help(void **state)
{
    (void)state;
    static const char *const cmds[] = {"info",     "run",    "mask",   "compare", "convert", "model",
                                       "generate", "encode", "decode", "bench"};
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        char *opts = COMPLETE(harness_dir(), "aft", cmds[c], "-");
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, cmds[c], "--help"), 0);
        if (r.exit_code != 0) fail_msg("aft %s --help: exit %d: %s", cmds[c], r.exit_code, r.err);
        /* options in the help: "-x" or "--word" after a space, '[', ',' or
         * a line start, followed by a letter; collected one per line */
        char *help = r.out, named[4096] = "";
        for (char *p = help; *p; p++) {
            if (*p != '-' || (p > help && !strchr(" [,\n", p[-1]))) continue;
            char *e = p + 1 + (p[1] == '-');
            if (!(*e >= 'a' && *e <= 'z')) continue;
            while ((*e >= 'a' && *e <= 'z') || *e == '-') e++;
            char opt[64];
            snprintf(opt, sizeof opt, "%.*s", (int)(e - p), p);
            if (!has_line(opts, opt)) fail_msg("aft %s --help names %s; the completion does not", cmds[c], opt);
            if (!has_line(named, opt) && strlen(named) + strlen(opt) + 2 < sizeof named) {
                strcat(named, opt);
                strcat(named, "\n");
            }
            p = e - 1;
        }
        /* and every option offered is named there (-h and --help, which
         * every subcommand takes, even where its text leaves them out) */
        for (char *p = opts; *p;) {
            char *e = strchr(p, '\n');
            *e = '\0';
            if (!has_line(named, p) && strcmp(p, "-h") != 0 && strcmp(p, "--help") != 0)
                fail_msg("the completion offers %s, which aft %s --help does not name", p, cmds[c]);
            p = e + 1;
        }
        assert_true(named[0] != '\0');
        harness_result_free(&r);
        free(opts);
    }
}

/* file names, NAME=FILE, and the tensor names of FILE.safetensors:NAME and
 * FILE.npz:NAME */
static void test_completion_files(void **state)
{
    (void)state;
    char *cwd = at(harness_dir(), "files");
    assert_int_equal(mkdir(cwd, 0777), 0);
    const float f[2] = {1, 2};
    aft_tensor ts[3];
    for (int i = 0; i < 3; i++) {
        memset(&ts[i], 0, sizeof ts[i]);
        ts[i].dtype = AFT_F32;
        ts[i].ndim = 1;
        ts[i].shape[0] = 2;
        ts[i].nelem = 2;
        ts[i].nbytes = sizeof f;
        ts[i].data = f;
    }
    const char *names[3] = {"blocks.0.wq", "blocks.0.wk", "head"};
    char *st = at(cwd, "model.safetensors"), *npy = at(cwd, "x.npy"), *npz = at(cwd, "arch.npz");
    aft_error err = {{0}};
    assert_int_equal(aft_st_write(st, names, ts, 3, NULL, 0, &err), AFT_OK);
    assert_int_equal(aft_npz_write(npz, names, ts, 3, &err), AFT_OK);
    assert_int_equal(aft_npy_write(npy, &ts[0], &err), AFT_OK);

    ASSERT_COMPLETES("x.npy\n", cwd, "aft", "info", "x");
    ASSERT_COMPLETES("model.safetensors\n", cwd, "aft", "convert", "-o", "m");
    ASSERT_COMPLETES("x.npy\n", cwd, "aft", "convert", "w", "=", "x");
    ASSERT_COMPLETES("model.safetensors\n", cwd, "aft", "generate", "--weights", "m");
    ASSERT_COMPLETES("x.npy\n", cwd, "aft", "model", "--weights", "model.safetensors", "x");
    ASSERT_COMPLETES("x.npy\n", cwd, "aft", "decode", "--weights", "model.safetensors", "x");
    ASSERT_COMPLETES("model.safetensors\n", cwd, "aft", "encode", "--text-file", "m");
    /* tensor names come from `aft info --json`, run as the completed command */
    const char *bin = harness_aft_bin();
    ASSERT_COMPLETES("blocks.0.wq\nblocks.0.wk\n", cwd, bin, "compare", "model.safetensors", ":", "blocks");
    ASSERT_COMPLETES("blocks.0.wq\nblocks.0.wk\nhead\n", cwd, bin, "compare", "x.npy", "model.safetensors", ":");
    ASSERT_COMPLETES("head\n", cwd, bin, "convert", "w", "=", "model.safetensors", ":", "h");
    ASSERT_COMPLETES("blocks.0.wq\nblocks.0.wk\n", cwd, bin, "compare", "arch.npz", ":", "blocks");
    ASSERT_COMPLETES("head\n", cwd, bin, "convert", "-o", "h.npy", "arch.npz", ":", "h");
    free(npz);
    free(st);
    free(npy);
    free(cwd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_uninstall),
        cmocka_unit_test(test_destdir),
        cmocka_unit_test(test_completion_words),
        cmocka_unit_test(test_completion_matches_help),
        cmocka_unit_test(test_completion_files),
    };
    return cmocka_run_group_tests_name("cli install", tests, setup, teardown);
}
