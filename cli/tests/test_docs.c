/* test_docs.c - the manual, the completion and the README keep up with the
 * command: the man page renders without a groff warning; every subcommand
 * and every option that `aft CMD --help` names appears in man/aft.1 (and
 * every subcommand in README.md); and each subcommand's option table (the
 * one cli_parse_options walks) is what its --help, its section of
 * man/aft.1 and its list in completion/aft.bash name, no more and no less;
 * the options every command takes (cli_common_options: --quiet, --help) are
 * in every --help and every list, and in the man page's global options. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "cli.h"
#include "harness.h"

static const char *const commands[] = {"info",  "run",      "grad",   "mask",   "compare", "convert",
                                       "model", "generate", "encode", "decode", "bench", "train"};

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

/* ---------------------------------------------------------------- the option tables */

static const cli_command *const tables[] = {&cli_info_command,     &cli_run_command,     &cli_grad_command,
                                            &cli_mask_command,     &cli_compare_command, &cli_convert_command,
                                            &cli_model_command,    &cli_generate_command, &cli_encode_command,
                                            &cli_decode_command,   &cli_bench_command,   &cli_train_command};
#define NTABLES (sizeof tables / sizeof tables[0])

/* 1 if c may stand before an option's name in prose, a synopsis or roff */
static int opens(char c)
{
    return c == ' ' || c == '\n' || c == '[' || c == ',' || c == '(' || c == '|' || c == '"';
}

/* 1 if c may follow a whole option name */
static int closes(char c)
{
    return !(c == '-' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'));
}

/* 1 if text names opt as a whole word */
static int names(const char *text, const char *opt)
{
    size_t n = strlen(opt);
    for (const char *p = strstr(text, opt); p; p = strstr(p + 1, opt))
        if ((p == text || opens(p[-1])) && closes(p[n])) return 1;
    return 0;
}

/* 1 if table names opt (as a name or an alias; hidden ones count when
 * hidden is set) */
static int in_list(const cli_option *table, const char *opt, int hidden)
{
    for (const cli_option *o = table; o->name; o++)
        if ((!o->hidden || hidden) && (strcmp(o->name, opt) == 0 || (o->alias && strcmp(o->alias, opt) == 0)))
            return 1;
    return 0;
}

/* 1 if c's table has opt, or opt is one of the options every command takes
 * (-q, --quiet, -h, --help) */
static int in_table(const cli_command *c, const char *opt, int hidden)
{
    return in_list(c->options, opt, hidden) || in_list(cli_common_options, opt, 0);
}

/* Calls fn(c, opt, where) for every option named in text: "--word" or "-x"
 * after a space, '[', ',', '(', '|', '"' or a line start. */
static void each_named(const cli_command *c, const char *text, const char *where,
                       void (*fn)(const cli_command *, const char *, const char *))
{
    for (const char *p = text; *p; p++) {
        if (*p != '-' || (p > text && !opens(p[-1]))) continue;
        const char *e = p + 1 + (p[1] == '-');
        if (!(*e >= 'a' && *e <= 'z')) continue;
        while (!closes(*e)) e++;
        if (p[1] != '-' && e - p != 2) continue;   /* "-word" is prose ("-inf"), not a short option */
        char opt[64];
        snprintf(opt, sizeof opt, "%.*s", (int)(e - p), p);
        fn(c, opt, where);
        p = e - 1;
    }
}

static void must_be_in_table(const cli_command *c, const char *opt, const char *where)
{
    /* aft --version, documented for every command */
    if (strcmp(opt, "--version") == 0) return;
    if (!in_table(c, opt, 0)) fail_msg("%s names %s, which aft %s does not take", where, opt, c->name);
}

/* the section of man/aft.1 for a command: from ".SS aft NAME" to the next
 * .SS or .SH (malloc'd) */
static char *man_section(const char *man, const char *name)
{
    char head[64];
    snprintf(head, sizeof head, "\n.SS aft %s ", name);
    const char *p = strstr(man, head);
    if (!p) fail_msg("man/aft.1 has no section '.SS aft %s'", name);
    p++;
    const char *e = p + 1;
    while (*e && !(e[-1] == '\n' && (strncmp(e, ".SS ", 4) == 0 || strncmp(e, ".SH ", 4) == 0))) e++;
    return strndup(p, (size_t)(e - p));
}

/* what a function of completion/aft.bash prints for its arguments */
static char *completion(const char *fn, const char *a, const char *b)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "bash --norc --noprofile -c '. \"%s/../completion/aft.bash\"; %s \"$0\" \"$1\"' '%s' '%s'",
             harness_testdata(), fn, a, b ? b : "");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = calloc(1, 8192);
    assert_non_null(out);
    size_t n = fread(out, 1, 8191, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    if (n && out[n - 1] == '\n') out[n - 1] = '\0';
    return out;
}

/* the help the binary prints is the one its table makes */
static void test_help_from_table(void **state)
{
    (void)state;
    for (size_t t = 0; t < NTABLES; t++) {
        const cli_command *c = tables[t];
        char *made = NULL;
        size_t len = 0;
        FILE *fp = open_memstream(&made, &len);
        assert_non_null(fp);
        cli_print_help(c, fp);
        fclose(fp);
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, c->name, "--help"), 0);
        assert_int_equal(r.exit_code, 0);
        if (strcmp(r.out, made) != 0) fail_msg("aft %s --help is not the help its option table makes", c->name);
        /* every option the table lists is named, the hidden ones are not;
         * so is every common option */
        for (const cli_option *o = cli_common_options; o->name; o++)
            if (!names(made, o->name) || !names(made, o->alias))
                fail_msg("aft %s --help does not name %s, %s", c->name, o->name, o->alias);
        for (const cli_option *o = c->options; o->name; o++) {
            if (o->hidden) {
                if (names(made, o->name)) fail_msg("aft %s --help names the hidden %s", c->name, o->name);
                continue;
            }
            if (!names(made, o->name)) fail_msg("aft %s --help does not name %s", c->name, o->name);
            if (o->alias && !names(made, o->alias)) fail_msg("aft %s --help does not name %s", c->name, o->alias);
            if (!o->help || !*o->help) fail_msg("aft %s: %s has no help text", c->name, o->name);
        }
        char where[64];
        snprintf(where, sizeof where, "aft %s --help", c->name);
        each_named(c, made, where, must_be_in_table);
        harness_result_free(&r);
        free(made);
    }
}

/* each command's section of the man page names the options of its table,
 * and no other */
static void test_man_matches_tables(void **state)
{
    (void)state;
    char *man = unescape_man(read_repo_file("man/aft.1"));
    for (size_t t = 0; t < NTABLES; t++) {
        const cli_command *c = tables[t];
        char *sec = man_section(man, c->name);
        for (const cli_option *o = c->options; o->name; o++) {
            if (o->hidden) continue;
            if (!names(sec, o->name))
                fail_msg("man/aft.1, section 'aft %s', does not name %s", c->name, o->name);
            if (o->alias && !names(sec, o->alias))
                fail_msg("man/aft.1, section 'aft %s', does not name %s", c->name, o->alias);
        }
        char where[64];
        snprintf(where, sizeof where, "man/aft.1, section 'aft %s',", c->name);
        each_named(c, sec, where, must_be_in_table);
        free(sec);
    }
    free(man);
}

/* completion/aft.bash offers each command exactly its table's options (and
 * the common ones: -q, --quiet, -h, --help), and expects a value after
 * exactly those that take one */
static void test_completion_matches_tables(void **state)
{
    (void)state;
    for (size_t t = 0; t < NTABLES; t++) {
        const cli_command *c = tables[t];
        char *offered = completion("_aft_options", c->name, NULL);
        char where[64];
        snprintf(where, sizeof where, "the completion of aft %s", c->name);
        /* the list is one line of words separated by single spaces */
        char line[8192];
        snprintf(line, sizeof line, " %s ", offered);
        for (char *w = strtok(offered, " "); w; w = strtok(NULL, " "))
            if (!in_table(c, w, 0)) fail_msg("%s offers %s, which aft %s does not take", where, w, c->name);
        for (const cli_option *o = cli_common_options; o->name; o++) {
            if (!names(line, o->name) || !names(line, o->alias))
                fail_msg("%s does not offer %s and %s", where, o->name, o->alias);
            char *kind = completion("_aft_value", c->name, o->alias);
            if (strcmp(kind, "flag") != 0) fail_msg("%s takes %s as '%s', not as a flag", where, o->alias, kind);
            free(kind);
        }
        for (const cli_option *o = c->options; o->name; o++) {
            if (o->hidden) {
                if (names(line, o->name)) fail_msg("%s offers the hidden %s", where, o->name);
                continue;
            }
            const char *spell[2] = {o->name, o->alias};
            for (int i = 0; i < 2 && spell[i]; i++) {
                if (!names(line, spell[i])) fail_msg("%s does not offer %s", where, spell[i]);
                char *kind = completion("_aft_value", c->name, spell[i]);
                if ((strcmp(kind, "flag") == 0) != (o->arg == NULL))
                    fail_msg("%s takes %s as '%s', but it %s a value", where, spell[i], kind,
                             o->arg ? "takes" : "does not take");
                free(kind);
            }
        }
        free(offered);
    }
}

/* the tables are those of the commands aft lists, in the same order */
static void test_tables_are_the_commands(void **state)
{
    (void)state;
    assert_int_equal(NTABLES, sizeof commands / sizeof commands[0]);
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "--help"), 0);
    const char *p = strstr(r.out, "commands:\n");
    assert_non_null(p);
    for (size_t t = 0; t < NTABLES; t++) {
        assert_string_equal(tables[t]->name, commands[t]);
        char line[64];
        snprintf(line, sizeof line, "\n  %s ", commands[t]);
        const char *q = strstr(p, line);
        if (!q) fail_msg("aft --help does not list %s", commands[t]);
        p = q + 1;
    }
    harness_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_man_renders_cleanly),
        cmocka_unit_test(test_every_option_documented),
        cmocka_unit_test(test_tables_are_the_commands),
        cmocka_unit_test(test_help_from_table),
        cmocka_unit_test(test_man_matches_tables),
        cmocka_unit_test(test_completion_matches_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
