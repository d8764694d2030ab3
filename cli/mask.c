/* mask.c - aft mask: the local (and causal) visibility pattern as text, .npy or JSON. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: aft mask --len N --window S [--causal] [--format text|npy|json] [-o FILE]\n"
    "\n"
    "Prints the N x N mask that is 1 where |i - j| < S (and j <= i with --causal).\n"
    "  --len N            sequence length, N >= 1\n"
    "  --window S         window, S >= 0 (S = 0 gives all zeros)\n"
    "  --causal           also require j <= i\n"
    "  --format F         text (default: N lines of N entries 1 or 0, single spaces),\n"
    "                     npy (bool .npy), json (array of N arrays of 0/1)\n"
    "  -o FILE            write to FILE instead of stdout\n";

int cmd_mask(int argc, char **argv)
{
    size_t n = 0, s = 0;
    int have_n = 0, have_s = 0, causal = 0;
    const char *format = "text", *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return cli_finish_stdout("mask");
        }
        if (strcmp(a, "--causal") == 0) { causal = 1; continue; }
        const char *opts[] = {"--len", "--window", "--format", "-o"};
        int which = -1;
        for (int j = 0; j < 4; j++) {
            size_t L = strlen(opts[j]);
            if (strncmp(a, opts[j], L) == 0 && (a[L] == 0 || a[L] == '=')) {
                which = j;
                if (a[L] == '=') val = a + L + 1;
                else if (i + 1 < argc) val = argv[++i];
                else return cli_usage_error("mask", "%s needs a value", opts[j]);
            }
        }
        switch (which) {
        case 0:
            if (cli_parse_size(val, &n) != 0 || n == 0)
                return cli_usage_error("mask", "--len takes a whole number >= 1, not '%s'", val);
            have_n = 1;
            break;
        case 1:
            if (cli_parse_size(val, &s) != 0)
                return cli_usage_error("mask", "--window takes a whole number >= 0, not '%s'", val);
            have_s = 1;
            break;
        case 2:
            if (strcmp(val, "text") && strcmp(val, "npy") && strcmp(val, "json"))
                return cli_usage_error("mask", "--format takes text, npy or json, not '%s'", val);
            format = val;
            break;
        case 3:
            out_path = val;
            break;
        default:
            return cli_usage_error("mask", "unknown argument '%s'", a);
        }
    }
    if (!have_n) return cli_usage_error("mask", "--len N is required");
    if (!have_s) return cli_usage_error("mask", "--window S is required");
    /* a text mask is 2 bytes an entry: keep it to what a terminal or file can take */
    if (n > 65536) return cli_usage_error("mask", "--len %zu is too large (at most 65536)", n);

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
    if (rc) {
        aft_out_abort(&out);
        return rc;
    }
    if (aft_out_commit(&out, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    return out_path ? 0 : cli_finish_stdout("mask");
}
