/* common.c - messages, number parsing, layouts and stdout checks for every
 * subcommand. */
#include "cli.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

FILE *cli_msg_stream;
const char *cli_command_name;

static void vmsg(const char *cmd, const char *fmt, va_list ap)
{
    FILE *fp = cli_msg_stream ? cli_msg_stream : stderr;
    cli_progress_stop();   /* the message takes the progress line's place, on a line of its own */
    if (!cmd) cmd = cli_command_name;
    if (cmd)
        fprintf(fp, "aft %s: ", cmd);
    else
        fputs("aft: ", fp);
    vfprintf(fp, fmt, ap);
    fputc('\n', fp);
}

void cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
    if (!cmd) cmd = cli_command_name;
    fprintf(cli_msg_stream ? cli_msg_stream : stderr, "Try 'aft%s%s --help'.\n", cmd ? " " : "", cmd ? cmd : "");
    return EXIT_USAGE;
}

int cli_parse_double(const char *s, double *out)
{
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int cli_finish_stdout(const char *cmd)
{
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) { bad = 1; e = errno; }
    if (bad) {
        cli_error(cmd, "standard output: write failed: %s", strerror(e));
        return EXIT_DATA;
    }
    return 0;
}

int cli_parse_bytes(const char *s, size_t *out)
{
    if (!s || !*s) return -1;
    size_t n = strlen(s), mult = 1;
    char buf[64];
    if (n >= sizeof buf) return -1;
    memcpy(buf, s, n + 1);
    switch (buf[n - 1]) {
    case 'K': case 'k': mult = (size_t)1 << 10; break;
    case 'M': case 'm': mult = (size_t)1 << 20; break;
    case 'G': case 'g': mult = (size_t)1 << 30; break;
    case 'T': case 't': mult = (size_t)1 << 40; break;
    default: break;
    }
    if (mult > 1) buf[n - 1] = 0;
    size_t v;
    if (aft_parse_size(buf, &v) != 0 || __builtin_mul_overflow(v, mult, out)) return -1;
    return 0;
}

const char *cli_display_name(const char *path)
{
    return strcmp(path, "-") == 0 ? "standard input" : path;
}

const char *cli_output_name(const char *path)
{
    return strcmp(path, "-") == 0 ? "standard output" : path;
}

void cli_report_file(const char *cmd, const char *path, const char *msg)
{
    /* the readers may already start msg with the path: do not say it twice */
    const char *shown = cli_display_name(path);
    const char *names[] = {path, shown};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(names[i]);
        if (strncmp(msg, names[i], n) == 0 && msg[n] == ':') {
            cli_error(cmd, "%s", msg);
            return;
        }
    }
    cli_error(cmd, "%s: %s", shown, msg);
}

int cli_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int cli_path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* AFT_LINEAR_BLAS=1 and AFT_DENSE_BLAS=1 hand the projections, and full's
 * products, to OpenBLAS: for comparing against aft's own kernels */
void cli_kernels_from_env(aft_config *cfg)
{
    const char *lin = getenv("AFT_LINEAR_BLAS"), *dense = getenv("AFT_DENSE_BLAS");
    if (lin && strcmp(lin, "1") == 0) cfg->projections = AFT_KERNEL_BLAS;
    if (dense && strcmp(dense, "1") == 0) cfg->full_product = AFT_KERNEL_BLAS;
}

const char *cli_tensor_split(const char *arg, int must_exist)
{
    static const char *const exts[] = {".safetensors", ".npz"};
    const char *last = NULL, *found = NULL;
    for (size_t e = 0; e < sizeof exts / sizeof exts[0]; e++) {
        size_t elen = strlen(exts[e]);
        for (const char *p = strstr(arg, exts[e]); p; p = strstr(p + 1, exts[e])) {
            if (p[elen] != ':') continue;
            const char *colon = p + elen;
            if (!last || colon > last) last = colon;
            char *file = strndup(arg, (size_t)(colon - arg));
            if (file && cli_path_exists(file) && (!found || colon > found)) found = colon;
            free(file);
        }
    }
    return found ? found : must_exist ? NULL : last;
}

int cli_file_format(const char *cmd, const char *path, aft_format *fmt)
{
    aft_error err = {{0}};
    aft_status st = aft_file_format(path, fmt, &err);
    if (st == AFT_ERR_FORMAT) {
        cli_report_file(cmd, path, err.msg);
        return -1;
    }
    if (st != AFT_OK || *fmt == AFT_FORMAT_UNKNOWN) *fmt = AFT_FORMAT_NPY;
    return 0;
}

int cli_set_memory(const char *cmd, size_t *out, const char *v)
{
    if (!v || cli_parse_bytes(v, out) != 0 || *out == 0)
        return cli_usage_error(cmd, "--max-memory takes a size like 4G, 512M or 1000000");
    return 0;
}

int cli_set_threads(const char *cmd, int *out, const char *v)
{
    size_t n;
    if (aft_parse_size(v, &n) != 0 || n == 0 || n > 1024)
        return cli_usage_error(cmd, "--threads takes a whole number from 1 to 1024");
    *out = (int)n;
    return 0;
}

int cli_set_impl(const char *cmd, aft_impl *out, const char *v)
{
    if (!v || (strcmp(v, "fast") != 0 && strcmp(v, "reference") != 0))
        return cli_usage_error(cmd, "--impl takes fast or reference");
    *out = strcmp(v, "reference") == 0 ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
    return 0;
}

int cli_set_precision(const char *cmd, aft_precision *out, const char *v)
{
    if (aft_precision_from_name(v, out) != 0) return cli_usage_error(cmd, "--precision takes f32 or bf16");
    return 0;
}

void cli_precision_note(aft_precision p)
{
    static int said;
    if (p != AFT_PRECISION_BF16 || said || strcmp(aft_bf16_engine_in_use(), "none") != 0) return;
    said = 1;
    cli_error(NULL, "--precision bf16: this CPU has no bf16 arithmetic (neither AVX512_BF16 nor AMX at kernel level "
              "%s); computing in float32", cli_level_name());
}

void cli_precision_json(cJSON *j, aft_precision p)
{
    cJSON_AddStringToObject(j, "precision", aft_precision_name(p));
    cJSON_AddStringToObject(j, "bf16_engine", aft_bf16_engine_in_use());
}

cli_size_text cli_bytes_text(size_t bytes)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB"};
    cli_size_text t;
    double v = (double)bytes;
    size_t u = 0;
    /* the next unit up once the number would show as 1024.0 */
    while (u < 3 && v >= 1023.95) {
        v /= 1024.0;
        u++;
    }
    int n = snprintf(t.s, sizeof t.s, u ? "%.1f" : "%.0f", v);
    if (n >= 2 && n < (int)sizeof t.s && strcmp(t.s + n - 2, ".0") == 0) t.s[n - 2] = '\0';
    size_t len = strlen(t.s);
    snprintf(t.s + len, sizeof t.s - len, " %s", unit[u]);
    return t;
}

const char *cli_noun(size_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

/* "2, 3" for messages */
void cli_shape_text(const aft_tensor *t, char *buf, size_t cap)
{
    size_t u = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < t->ndim && u < cap - 24; i++)
        u += (size_t)snprintf(buf + u, cap - u, "%s%zu", i ? ", " : "", t->shape[i]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cli_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---------------------------------------------------------------- layouts */

int cli_set_layout(const char *cmd, int *tbd, const char *v)
{
    if (!v || (strcmp(v, "btd") != 0 && strcmp(v, "tbd") != 0))
        return cli_usage_error(cmd, "--layout takes btd or tbd");
    *tbd = strcmp(v, "tbd") == 0;
    return 0;
}

float *cli_swap_tb(const float *x, size_t B, size_t T, size_t X, int to_tbd)
{
    /* B * T * X elements exist already (x), so the product cannot overflow */
    float *y = malloc(B * T * X * sizeof(float) + 1);
    if (y) aft_swap_tb(y, x, B, T, X, to_tbd);
    return y;
}

aft_tensor cli_output_shaped(float *data, size_t rank, int tbd, size_t B, size_t T, size_t grid_h, size_t grid_w,
                             size_t X)
{
    size_t n = B * T * X;
    aft_tensor t = {.dtype = AFT_F32, .data = data, .nelem = n, .nbytes = n * sizeof(float)};
    if (rank == 2) {
        t.ndim = 2;
        t.shape[0] = T;
        t.shape[1] = X;
    } else if (rank == 4) {
        t.ndim = 4;
        t.shape[0] = B;
        t.shape[1] = grid_h;
        t.shape[2] = grid_w;
        t.shape[3] = X;
    } else {
        t.ndim = 3;
        t.shape[0] = tbd ? T : B;
        t.shape[1] = tbd ? B : T;
        t.shape[2] = X;
    }
    return t;
}

/* ---------------------------------------------------------------- --timing */

int cli_out_close(aft_out *out, int rc)
{
    if (rc) {
        aft_out_abort(out);
        return rc;
    }
    aft_error err;
    if (aft_out_commit(out, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    return 0;
}

int cli_write_npy(const char *path, const aft_tensor *t)
{
    aft_error err;
    aft_out out;
    if (aft_out_open(&out, path ? path : "-", &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    int rc = 0;
    if (aft_npy_write_fp(out.fp, t, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", path ? path : "standard output", err.msg);
        rc = EXIT_DATA;
    }
    return cli_out_close(&out, rc);
}

int cli_write_json(aft_out *out, const char *cmd, cJSON *j)
{
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) {
        cli_error(cmd, "out of memory writing timing");
        return EXIT_DATA;
    }
    fputs(text, out->fp);
    fputc('\n', out->fp);
    free(text);
    return 0;
}
