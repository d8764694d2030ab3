/* mask.c - aft mask: the local (and causal) visibility pattern as text, .npy or JSON. */
#include "cli.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mask_opts {
    size_t n, s;
    int have_n, have_s, causal;
    const char *format, *out_path;
};

static int set_len(const cli_option *opt, void *opts, const char *v)
{
    struct mask_opts *o = opts;
    if (aft_parse_size(v, &o->n) != 0 || o->n == 0)
        return cli_usage_error("mask", "--len takes a whole number >= 1, not '%s'", v);
    o->have_n = 1;
    return 0;
}

static int set_window(const cli_option *opt, void *opts, const char *v)
{
    struct mask_opts *o = opts;
    if (aft_parse_size(v, &o->s) != 0)
        return cli_usage_error("mask", "--window takes a whole number >= 0, not '%s'", v);
    o->have_s = 1;
    return 0;
}

static int set_format(const cli_option *opt, void *opts, const char *v)
{
    struct mask_opts *o = opts;
    if (strcmp(v, "text") && strcmp(v, "npy") && strcmp(v, "json"))
        return cli_usage_error("mask", "--format takes text, npy or json, not '%s'", v);
    o->format = v;
    return 0;
}

/* --json: --format json, as every command that prints JSON spells it */
static int set_json(const cli_option *opt, void *opts, const char *v)
{
    ((struct mask_opts *)opts)->format = "json";
    return 0;
}

#define NEEDS_VALUE "%s needs a value"

static const cli_option options[] = {
    {"--len", NULL, "N", "sequence length, N >= 1", set_len, 0, NEEDS_VALUE, 0},
    {"--window", NULL, "S", "window, S >= 0 (S = 0 gives all zeros)", set_window, 0, NEEDS_VALUE, 0},
    {"--causal", NULL, NULL, "also require j <= i", cli_set_flag, offsetof(struct mask_opts, causal), NULL, 0},
    {"--format", NULL, "F",
     "text (default: N lines of N entries 1 or 0, single spaces), npy (bool .npy), json (array of N arrays of 0/1)",
     set_format, 0, NEEDS_VALUE, 0},
    {"--json", NULL, NULL, "the same as --format json", set_json, 0, NULL, 0},
    {"-o", NULL, "FILE", "write to FILE instead of stdout", cli_set_string, offsetof(struct mask_opts, out_path),
     NEEDS_VALUE, 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_mask_command = {
    .name = "mask",
    .usage = "usage: aft mask --len N --window S [--causal] [--format text|npy|json] [--json]\n"
             "                [-o FILE]\n"
             "\n"
             "Prints the N x N mask that is 1 where |i - j| < S (and j <= i with --causal).\n",
    .options = options,
    .unknown = "unknown argument '%s'",   /* mask takes no operands */
};

/* the mask in o's format, to o's output */
static int write_mask(const struct mask_opts *o)
{
    size_t n = o->n, s = o->s;
    int causal = o->causal;
    const char *format = o->format, *out_path = o->out_path;
    aft_error err;
    aft_out out;
    if (aft_out_open(&out, out_path ? out_path : "-", &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    int rc = 0;
#define VIS(i, j) (((i) > (j) ? (i) - (j) : (j) - (i)) < s && !(causal && (j) > (i)))
    if (strcmp(format, "npy") == 0) {
        uint8_t *m = malloc(n * n);
        if (!m) {
            aft_out_abort(&out);
            cli_error("mask", "out of memory for a %zu x %zu mask", n, n);
            return EXIT_DATA;
        }
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) m[i * n + j] = VIS(i, j);
        aft_tensor t = {.dtype = AFT_BOOL, .ndim = 2, .shape = {n, n}, .nelem = n * n, .nbytes = n * n, .data = m};
        if (aft_npy_write_fp(out.fp, &t, &err) != AFT_OK) {
            cli_error(NULL, "%s", err.msg);
            rc = EXIT_DATA;
        }
        free(m);
    } else if (strcmp(format, "json") == 0) {
        fputc('[', out.fp);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ",\n [" : "[", out.fp);
            for (size_t j = 0; j < n; j++) fputs(j ? (VIS(i, j) ? ",1" : ",0") : (VIS(i, j) ? "1" : "0"), out.fp);
            fputc(']', out.fp);
        }
        fputs("]\n", out.fp);
    } else {
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j < n; j++) {
                if (j) fputc(' ', out.fp);
                fputc(VIS(i, j) ? '1' : '0', out.fp);
            }
            fputc('\n', out.fp);
        }
    }
#undef VIS
    if ((rc = cli_out_close(&out, rc))) return rc;
    return out_path ? 0 : cli_finish_stdout("mask");
}

int cmd_mask(int argc, char **argv)
{
    struct mask_opts o = {.format = "text"};
    int rc = cli_parse_options(&cli_mask_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("mask") : rc;
    if (!o.have_n) return cli_usage_error("mask", "--len N is required");
    if (!o.have_s) return cli_usage_error("mask", "--window S is required");
    /* a text mask is 2 bytes an entry: keep it to what a terminal or file can take */
    if (o.n > 65536) return cli_usage_error("mask", "--len %zu is too large (at most 65536)", o.n);
    return write_mask(&o);
}
