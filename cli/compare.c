/* compare.c - `aft compare`: are two tensors equal within tolerance (numpy's allclose)? */
#include "cli.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const cmd = "compare";

/* messages about a file: "aft compare: FILE: msg" */
static void report_file(const char *path, const char *msg)
{
    cli_report_file(cmd, path, msg);
}

/* one side of the comparison */
typedef struct {
    const char *arg;         /* the operand as given */
    aft_tensor own;          /* a .npy: the tensor, owning its data */
    aft_st_file *st;         /* a .safetensors: the open file */
    const aft_tensor *t;     /* the tensor compared: &own or inside st */
} operand;

static size_t max_memory;   /* --max-memory, 0 when not given */

/* Opens a .safetensors file or .npz archive and picks the tensor called
 * name, or, when name is NULL, the file's only tensor. */
static int load_safetensors(operand *op, const char *file, const char *name)
{
    aft_error err = {{0}};
    if (aft_st_open_limit(file, cli_memory_limit(max_memory), &op->st, &err) != AFT_OK) {
        report_file(file, err.msg);
        return -1;
    }
    char msg[512];
    if (name) {
        op->t = aft_st_find(op->st, name);
        if (!op->t) {
            snprintf(msg, sizeof msg, "no tensor named '%s'", name);
            report_file(file, msg);
            return -1;
        }
    } else if (aft_st_count(op->st) == 1) {
        op->t = aft_st_get(op->st, 0, NULL);
    } else {
        snprintf(msg, sizeof msg, "holds %zu tensors; name one as %s:NAME",
                 aft_st_count(op->st), file);
        report_file(file, msg);
        return -1;
    }
    return 0;
}

/* Loads an operand: "-", FILE.safetensors:NAME, a .safetensors file with a
 * single tensor, or a .npy file. Reports and returns -1 on failure. */
static int load(operand *op, const char *arg)
{
    memset(op, 0, sizeof *op);
    op->arg = arg;
    aft_error err = {{0}};

    /* FILE.safetensors:NAME or FILE.npz:NAME, unless the whole operand is
     * itself a file. A path can contain ".safetensors:" and so can a tensor
     * name: take the last split whose file exists, else the last split
     * (whose open then reports the missing file). */
    if (strcmp(arg, "-") != 0 && !cli_path_exists(arg)) {
        const char *colon = cli_tensor_split(arg, 0);
        if (colon) {
            char *file = strndup(arg, (size_t)(colon - arg));
            if (!file) {
                report_file(arg, "out of memory");
                return -1;
            }
            int rc = load_safetensors(op, file, colon + 1);
            free(file);
            return rc;
        }
    }
    aft_format fmt;
    if (cli_file_format(cmd, arg, &fmt) != 0) return -1;
    if (fmt == AFT_FORMAT_SAFETENSORS || fmt == AFT_FORMAT_NPZ) return load_safetensors(op, arg, NULL);

    if (aft_npy_read(arg, &op->own, NULL, &err) != AFT_OK) {
        report_file(arg, err.msg);
        return -1;
    }
    op->t = &op->own;
    return 0;
}

static void unload(operand *op)
{
    aft_tensor_free(&op->own);
    aft_st_close(op->st);
    memset(op, 0, sizeof *op);
}

/* Element i of t as a double: exact for every dtype except 64-bit integers
 * beyond 2^53, which round to the nearest double. */
static double elem(const aft_tensor *t, size_t i)
{
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case AFT_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
    case AFT_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
    case AFT_F16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return aft_f16_to_f32(v); }
    case AFT_BF16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return aft_bf16_to_f32(v); }
    case AFT_BOOL: return p[i] ? 1.0 : 0.0;
    case AFT_U8: return p[i];
    case AFT_I8: return (int8_t)p[i];
    case AFT_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case AFT_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case AFT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case AFT_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case AFT_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case AFT_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    default: return NAN;   /* the readers hand out no other dtype */
    }
}

typedef struct {
    double max_abs, max_rel;
    size_t mismatches, total;
    int have_worst;
    size_t worst;              /* flat index, C order */
    double worst_a, worst_b;
} stats;

/* Applies |a - b| <= atol + rtol * |b| to every pair. The "violation"
 * |a - b| - (atol + rtol |b|) ranks the elements; NaN and infinity
 * mismatches rank above everything, matches of non-finite values below. */
static void compare(stats *s, const aft_tensor *a, const aft_tensor *b,
                    double rtol, double atol, int equal_nan)
{
    memset(s, 0, sizeof *s);
    s->total = a->nelem;
    double worst_viol = -INFINITY;
    for (size_t i = 0; i < a->nelem; i++) {
        double x = elem(a, i), y = elem(b, i), viol;
        int close;
        if (isnan(x) || isnan(y)) {
            close = equal_nan && isnan(x) && isnan(y);
            viol = close ? -INFINITY : INFINITY;
            /* NaN pairs have no meaningful error: left out of the maxima */
        } else {
            double d = x == y ? 0.0 : fabs(x - y);   /* inf == inf gives 0, not NaN */
            if (isinf(x) || isinf(y)) {
                close = x == y;
                viol = close ? -INFINITY : INFINITY;
            } else {
                double tol = atol + rtol * fabs(y);
                close = d <= tol;
                viol = d - tol;
            }
            if (d > s->max_abs) s->max_abs = d;
            /* |a - b| / |b| with b = inf and a finite is inf / inf: say inf */
            if (y != 0) {
                double rel = d == 0 ? 0 : isinf(y) ? INFINITY : d / fabs(y);
                if (rel > s->max_rel) s->max_rel = rel;
            }
        }
        if (!close) s->mismatches++;
        if (!s->have_worst || viol > worst_viol) {
            s->have_worst = 1;
            s->worst = i;
            worst_viol = viol;
            s->worst_a = x;
            s->worst_b = y;
        }
    }
}

static int shapes_equal(const aft_tensor *a, const aft_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (size_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* flat C-order index -> multi-index idx[0..ndim) */
static void unravel(const aft_tensor *t, size_t flat, size_t *idx)
{
    for (size_t d = t->ndim; d-- > 0;) {
        idx[d] = flat % t->shape[d];
        flat /= t->shape[d];
    }
}

static void print_dims(const size_t *dims, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++) printf("%s%zu", i ? ", " : "", dims[i]);
    putchar(']');
}

static void print_text(const operand *a, const operand *b, int same_shape,
                       const stats *s, double rtol, double atol, int equal_nan,
                       int close)
{
    const operand *ops[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        printf("%s:             %s  %s ", i ? "b" : "a", cli_display_name(ops[i]->arg),
               aft_dtype_name(ops[i]->t->dtype));
        print_dims(ops[i]->t->shape, ops[i]->t->ndim);
        putchar('\n');
    }
    if (!same_shape) {
        printf("shapes differ: ");
        print_dims(a->t->shape, a->t->ndim);
        printf(" vs ");
        print_dims(b->t->shape, b->t->ndim);
        printf("\nnot close\n");
        return;
    }
    printf("rule:          |a - b| <= %.9g + %.9g * |b|%s\n", atol, rtol,
           equal_nan ? ", NaN == NaN" : "");
    printf("max abs error: %.9g\n", s->max_abs);
    printf("max rel error: %.9g\n", s->max_rel);
    printf("mismatches:    %zu / %zu\n", s->mismatches, s->total);
    printf("worst index:   ");
    if (s->have_worst) {
        size_t idx[AFT_MAX_DIMS];
        unravel(a->t, s->worst, idx);
        print_dims(idx, a->t->ndim);
        printf("  a = %.9g, b = %.9g\n", s->worst_a, s->worst_b);
    } else {
        printf("none (no elements)\n");
    }
    puts(close ? "close" : "not close");
}

/* a number, or "inf" / "-inf" / "nan" where JSON has no number */
static cJSON *json_number(double v)
{
    if (isnan(v)) return cJSON_CreateString("nan");
    if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    return cJSON_CreateNumber(v);
}

static cJSON *json_dims(const size_t *dims, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n && arr; i++) {
        cJSON *d = cJSON_CreateNumber((double)dims[i]);
        if (!d || !cJSON_AddItemToArray(arr, d)) {
            cJSON_Delete(d);
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

/* adds item under key; deletes item and returns 0 if anything is NULL */
static int put(cJSON *o, const char *key, cJSON *item)
{
    if (!o || !item) {
        cJSON_Delete(item);
        return 0;
    }
    return cJSON_AddItemToObject(o, key, item);
}

/* prints the JSON report on one line; 0, or -1 when out of memory */
static int print_json(const operand *a, const operand *b, int same_shape,
                      const stats *s, double rtol, double atol, int equal_nan,
                      int close)
{
    cJSON *o = cJSON_CreateObject();
    int ok = put(o, "a", cJSON_CreateString(a->arg)) &&
             put(o, "b", cJSON_CreateString(b->arg)) &&
             put(o, "dtype_a", cJSON_CreateString(aft_dtype_name(a->t->dtype))) &&
             put(o, "dtype_b", cJSON_CreateString(aft_dtype_name(b->t->dtype))) &&
             put(o, "shape_a", json_dims(a->t->shape, a->t->ndim)) &&
             put(o, "shape_b", json_dims(b->t->shape, b->t->ndim)) &&
             put(o, "rtol", cJSON_CreateNumber(rtol)) &&
             put(o, "atol", cJSON_CreateNumber(atol)) &&
             put(o, "equal_nan", cJSON_CreateBool(equal_nan)) &&
             put(o, "shapes_equal", cJSON_CreateBool(same_shape));
    if (ok && same_shape) {
        cJSON *worst = NULL;
        if (s->have_worst) {
            size_t idx[AFT_MAX_DIMS];
            unravel(a->t, s->worst, idx);
            worst = json_dims(idx, a->t->ndim);
        } else {
            worst = cJSON_CreateNull();
        }
        ok = put(o, "max_abs_error", json_number(s->max_abs)) &&
             put(o, "max_rel_error", json_number(s->max_rel)) &&
             put(o, "mismatches", cJSON_CreateNumber((double)s->mismatches)) &&
             put(o, "total", cJSON_CreateNumber((double)s->total)) &&
             put(o, "worst_index", worst) &&
             put(o, "worst_a", s->have_worst ? json_number(s->worst_a) : cJSON_CreateNull()) &&
             put(o, "worst_b", s->have_worst ? json_number(s->worst_b) : cJSON_CreateNull());
    } else if (ok) {
        static const char *const keys[] = {"max_abs_error", "max_rel_error", "mismatches",
                                           "total", "worst_index", "worst_a", "worst_b"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0] && ok; i++)
            ok = put(o, keys[i], cJSON_CreateNull());
    }
    ok = ok && put(o, "close", cJSON_CreateBool(close));
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) return -1;
    puts(text);
    cJSON_free(text);
    return 0;
}

struct compare_opts {
    double rtol, atol;
    int equal_nan, json, nops;
    const char *ops[2];
};

/* a tolerance: a finite number >= 0 */
static int set_tol(const cli_option *opt, void *opts, const char *val)
{
    double *out = (double *)((char *)opts + opt->field);
    if (cli_parse_double(val, out) != 0 || *out < 0)
        return cli_usage_error(cmd, "invalid %s '%s': want a number >= 0", opt->name, val);
    return 0;
}

static int add_operand(void *opts, const char *arg)
{
    struct compare_opts *o = opts;
    if (o->nops == 2) return cli_usage_error(cmd, "too many operands: '%s'", arg);
    o->ops[o->nops++] = arg;
    return 0;
}

#define NEEDS_VALUE "option '%s' needs a value"

static int set_max_memory(const cli_option *opt, void *opts, const char *v)
{
    (void)opt;
    (void)opts;
    return cli_set_memory(cmd, &max_memory, v);
}

static const cli_option options[] = {
    {"--rtol", NULL, "R", "relative tolerance, a number >= 0 (default 1e-05)", set_tol,
     offsetof(struct compare_opts, rtol), NEEDS_VALUE, 0},
    {"--atol", NULL, "A", "absolute tolerance, a number >= 0 (default 1e-08)", set_tol,
     offsetof(struct compare_opts, atol), NEEDS_VALUE, 0},
    {"--equal-nan", NULL, NULL, "treat NaN as close to NaN", cli_set_flag, offsetof(struct compare_opts, equal_nan),
     NULL, 0},
    {"--json", NULL, NULL, "print one JSON object instead of the text report", cli_set_flag,
     offsetof(struct compare_opts, json), NULL, 0},
    {"--max-memory", NULL, "SIZE", "memory for inflating .npz members (bytes, or with K, M, G; default: the memory available)",
     set_max_memory, 0, "--max-memory takes a size like 4G, 512M or 1000000", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_compare_command = {
    .name = "compare",
    .usage = "usage: aft compare A B [--rtol R] [--atol A] [--equal-nan] [--json]\n"
             "                   [--max-memory SIZE]\n"
             "\n"
             "Compare two tensors element by element with numpy's allclose rule:\n"
             "a and b are close when |a - b| <= atol + rtol * |b| (B is the reference).\n"
             "Infinities are close only to the same infinity; NaN is close to nothing,\n"
             "or to NaN with --equal-nan. Values are compared as doubles; the dtypes\n"
             "may differ. The shapes must be equal (no broadcasting).\n"
             "\n"
             "A and B are each a .npy file, '-' (a .npy on standard input),\n"
             "FILE.safetensors:NAME, the tensor NAME in a .safetensors file, or\n"
             "FILE.npz:KEY, the member KEY of a .npz archive (np.savez); a .safetensors\n"
             "or .npz that holds a single tensor may be named alone. Formats are told\n"
             "apart by their first bytes.\n",
    .options = options,
    .more = "The report gives the shapes and dtypes, the largest |a - b| and the\n"
            "largest |a - b| / |b| (both over the pairs where neither value is NaN;\n"
            "the relative error skips pairs with b == 0), the number of elements that\n"
            "are not close, and the worst index: the element where |a - b| most\n"
            "exceeds atol + rtol * |b| (a NaN or infinity mismatch counts as the\n"
            "worst), shown with its two values. The last line is 'close' or\n"
            "'not close'. In --json output, infinite or NaN numbers are the strings\n"
            "\"inf\", \"-inf\" and \"nan\"; when the shapes differ the error fields\n"
            "are null.\n"
            "\n"
            "exit status: 0 close, 1 not close (or the shapes differ) or a file could\n"
            "not be read, 2 usage error\n",
    .operand = add_operand,
};

int cmd_compare(int argc, char **argv)
{
    /* options may come before, between or after the operands */
    struct compare_opts o = {.rtol = 1e-5, .atol = 1e-8};
    int rc = cli_parse_options(&cli_compare_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout(cmd) : rc;
    double rtol = o.rtol, atol = o.atol;
    int equal_nan = o.equal_nan, json = o.json, nops = o.nops;
    const char **ops = o.ops;
    if (nops != 2) return cli_usage_error(cmd, "need two operands, A and B");
    if (strcmp(ops[0], "-") == 0 && strcmp(ops[1], "-") == 0)
        return cli_usage_error(cmd, "only one operand can be '-' (standard input)");

    operand a, b;
    memset(&b, 0, sizeof b);
    if (load(&a, ops[0]) != 0) {
        unload(&a);
        return EXIT_DATA;
    }
    if (load(&b, ops[1]) != 0) {
        unload(&a);
        unload(&b);
        return EXIT_DATA;
    }

    int same_shape = shapes_equal(a.t, b.t);
    stats s;
    memset(&s, 0, sizeof s);
    if (same_shape) compare(&s, a.t, b.t, rtol, atol, equal_nan);
    int close = same_shape && s.mismatches == 0;

    if (json)
        rc = print_json(&a, &b, same_shape, &s, rtol, atol, equal_nan, close);
    else
        print_text(&a, &b, same_shape, &s, rtol, atol, equal_nan, close);
    unload(&a);
    unload(&b);
    if (rc != 0) {
        cli_error(cmd, "out of memory writing the report");
        cli_finish_stdout(cmd);
        return EXIT_DATA;
    }
    int out = cli_finish_stdout(cmd);
    if (out) return out;
    return close ? 0 : EXIT_DATA;
}
