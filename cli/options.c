/* options.c - the one option parser of every subcommand, in the manner of
 * git's parse_options: a subcommand declares its options once, as a table of
 * cli_option (name, the value it takes, help text, where the value goes);
 * cli_parse_options walks argv against that table and cli_print_help makes
 * the --help text from it. The man page and the bash completion are checked
 * against the same tables by cli/tests/test_docs.c. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* the column where the help text of an option starts, and the line width */
#define HELP_COLUMN 24
#define HELP_WIDTH 79

static int set_quiet(const cli_option *opt, void *opts, const char *value)
{
    (void)opts;
    (void)value;
    cli_quiet = 1;
    return 0;
}

/* the options every command takes, listed last in its help; --help is the
 * parser's own (it prints the help), so it has no handler */
const cli_option cli_common_options[] = {
    {"-q", "--quiet", NULL, "silence the progress lines long runs show on a terminal", set_quiet, 0, NULL, 0},
    {"-h", "--help", NULL, "print this help and exit", NULL, 0, NULL, 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};
#define HELP_OPTION (&cli_common_options[1])

int cli_set_flag(const cli_option *opt, void *opts, const char *value)
{
    (void)value;
    *(int *)((char *)opts + opt->field) = 1;
    return 0;
}

int cli_set_string(const cli_option *opt, void *opts, const char *value)
{
    *(const char **)((char *)opts + opt->field) = value;
    return 0;
}

/* The length of the spelling of opt that arg starts with, where arg is that
 * spelling alone or followed by '=' and a value (only for an option that
 * takes one); 0 if arg is not opt. */
static size_t match(const cli_option *opt, const char *arg)
{
    const char *names[2] = {opt->name, opt->alias};
    for (int i = 0; i < 2; i++) {
        if (!names[i]) continue;
        size_t n = strlen(names[i]);
        if (strncmp(arg, names[i], n) == 0 && (arg[n] == '\0' || (arg[n] == '=' && opt->arg))) return n;
    }
    return 0;
}

/* the entry of table that arg is (*n: the length of its spelling), or NULL */
static const cli_option *find(const cli_option *table, const char *arg, size_t *n)
{
    for (const cli_option *opt = table; opt->name; opt++)
        if ((*n = match(opt, arg)) != 0) return opt;
    return NULL;
}

int cli_parse_options(const cli_command *c, int argc, char **argv, void *opts)
{
    int only_operands = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        /* operands: words not starting with '-', "-" (standard input), and
         * everything after "--" */
        if (c->operand && (only_operands || a[0] != '-' || strcmp(a, "-") == 0)) {
            int rc = c->operand(opts, a);
            if (rc) return rc;
            continue;
        }
        if (c->operand && strcmp(a, "--") == 0) {
            only_operands = 1;
            continue;
        }
        if (match(HELP_OPTION, a)) {
            cli_print_help(c, stdout);
            return -1;
        }
        /* the command's own options, then those every command takes */
        size_t n = 0;
        const cli_option *opt = find(c->options, a, &n);
        if (!opt) opt = find(cli_common_options, a, &n);
        if (!opt) return cli_usage_error(c->name, c->unknown ? c->unknown : "unknown option '%s'", a);
        const char *value = NULL;
        if (opt->arg) {
            if (a[n] == '=') value = a + n + 1;
            else if (i + 1 < argc) value = argv[++i];
            else if (opt->missing) return cli_usage_error(c->name, opt->missing, a);
        }
        int rc = opt->set(opt, opts, value);
        if (rc) return rc;
    }
    return 0;
}

/* Prints text from column col to the line width, breaking at spaces; '\n'
 * starts a new line, and a line's leading spaces indent its continuations
 * too. The first line continues the current one (at column col). */
static void print_wrapped(FILE *fp, const char *text, int col)
{
    int first = 1;
    while (*text) {
        const char *end = strchr(text, '\n');
        size_t len = end ? (size_t)(end - text) : strlen(text);
        size_t indent = 0;
        while (indent < len && text[indent] == ' ') indent++;
        int width = HELP_WIDTH - col - (int)indent;
        size_t pos = indent;
        do {
            if (!first) fprintf(fp, "%*s", col, "");
            first = 0;
            fprintf(fp, "%.*s", (int)indent, text);
            /* as many words as fit (at least one) */
            size_t brk = len;
            if ((int)(len - pos) > width) {
                for (brk = pos + (size_t)width; brk > pos && text[brk] != ' '; brk--) {}
                if (brk == pos)
                    for (brk = pos + (size_t)width; brk < len && text[brk] != ' '; brk++) {}
            }
            fprintf(fp, "%.*s\n", (int)(brk - pos), text + pos);
            pos = brk;
            while (pos < len && text[pos] == ' ') pos++;
        } while (pos < len);
        text += len + (end != NULL);
    }
}

/* "  -o, --output FILE" and its help, wrapped */
static void print_option(FILE *fp, const cli_option *opt)
{
    char left[128];
    int n = snprintf(left, sizeof left, "  %s%s%s%s%s", opt->name, opt->alias ? ", " : "",
                     opt->alias ? opt->alias : "", opt->arg ? " " : "", opt->arg ? opt->arg : "");
    fputs(left, fp);
    if (n + 2 > HELP_COLUMN) fprintf(fp, "\n%*s", HELP_COLUMN, "");
    else fprintf(fp, "%*s", HELP_COLUMN - n, "");
    print_wrapped(fp, opt->help, HELP_COLUMN);
}

void cli_print_help(const cli_command *c, FILE *fp)
{
    fputs(c->usage, fp);
    fputs("\noptions:\n", fp);
    for (const cli_option *opt = c->options; opt->name; opt++)
        if (!opt->hidden) print_option(fp, opt);
    for (const cli_option *opt = cli_common_options; opt->name; opt++) print_option(fp, opt);
    if (c->more) {
        fputc('\n', fp);
        fputs(c->more, fp);
    }
}
