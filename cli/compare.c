/* compare.c - `aft compare`: are two tensors equal within tolerance (numpy's allclose)? */
#include "cli.h"

#include <cjson/cJSON.h>
#include <limits.h>
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
    aft_st_file *st;         /* a .safetensors or .npz: the open file */
    int whole;               /* st was named alone: which tensors are compared
                              * depends on the other operand */
    const aft_tensor *t;     /* the tensor compared: &own or inside st; NULL
                              * while whole and not yet chosen */
} operand;

static size_t max_memory;   /* --max-memory, 0 when not given */

/* Opens a .safetensors file or .npz archive and picks the tensor called
 * name, or, when name is NULL, keeps the whole file. */
static int load_safetensors(operand *op, const char *file, const char *name)
{
    aft_error err = {{0}};
    if (aft_st_open_limit(file, aft_memory_limit(max_memory), &op->st, &err) != AFT_OK) {
        report_file(file, err.msg);
        return -1;
    }
    if (!name) {
        op->whole = 1;
        return 0;
    }
    op->t = aft_st_find(op->st, name);
    if (!op->t) {
        char msg[512];
        snprintf(msg, sizeof msg, "no tensor named '%s'", name);
        report_file(file, msg);
        return -1;
    }
    return 0;
}

/* Two files named alone are compared tensor by tensor, by name, unless
 * each holds a single tensor: those two are compared whatever their names,
 * as a single-tensor file always was. */
static int by_name(const operand *a, const operand *b)
{
    return a->whole && b->whole && (aft_st_count(a->st) != 1 || aft_st_count(b->st) != 1);
}

/* A file named alone and compared as one tensor must hold just one. */
static int pick_single(operand *op)
{
    if (!op->whole) return 0;
    if (aft_st_count(op->st) == 1) {
        op->t = aft_st_get(op->st, 0, NULL);
        return 0;
    }
    char msg[512];
    snprintf(msg, sizeof msg, "holds %zu tensors; name one as %s:NAME, or compare it with another file of tensors",
             aft_st_count(op->st), op->arg);
    report_file(op->arg, msg);
    return -1;
}

/* Loads an operand: "-", FILE.safetensors:NAME, a whole .safetensors or .npz
 * file, or a .npy file. Reports and returns -1 on failure. */
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

struct compare_opts {
    double rtol, atol;
    int equal_nan, json, nops;
    const char *ops[2];
};

/* a pair of tensors compared: the two operands' tensors, or the tensors a
 * name stands for in two files */
typedef struct {
    const char *name;           /* the name in the files, or NULL */
    const aft_tensor *a, *b;    /* NULL on the side whose file lacks the name */
    int same_shape, close;      /* both 0 unless both sides are there */
    stats s;                    /* zero unless the shapes are equal */
} pair;

static int shapes_equal(const aft_tensor *a, const aft_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (size_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* fills p's verdict from its two tensors (both present) */
static void compare_pair(pair *p, const struct compare_opts *o)
{
    p->same_shape = shapes_equal(p->a, p->b);
    if (p->same_shape) compare(&p->s, p->a, p->b, o->rtol, o->atol, o->equal_nan);
    p->close = p->same_shape && p->s.mismatches == 0;
}

/* flat C-order index -> multi-index idx[0..ndim) */
static void unravel(const aft_tensor *t, size_t flat, size_t *idx)
{
    for (size_t d = t->ndim; d-- > 0;) {
        idx[d] = flat % t->shape[d];
        flat /= t->shape[d];
    }
}

/* room for "[d0, d1, ...]" with AFT_MAX_DIMS dims of 20 digits */
enum { DIMS_TEXT = AFT_MAX_DIMS * 22 + 3 };

static void format_dims(char *buf, size_t size, const size_t *dims, size_t n)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (size_t i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%zu", i ? ", " : "", dims[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

static void print_dims(const size_t *dims, size_t n)
{
    char buf[DIMS_TEXT];
    format_dims(buf, sizeof buf, dims, n);
    fputs(buf, stdout);
}

/* "a:   FILE  F32 [2, 3]", or for a file of tensors "FILE  npz, 4 tensors" */
static void print_operand(const char *label, const operand *op)
{
    printf("%s:             %s  ", label, cli_display_name(op->arg));
    if (op->t) {
        printf("%s ", aft_dtype_name(op->t->dtype));
        print_dims(op->t->shape, op->t->ndim);
    } else {
        size_t n = aft_st_count(op->st);
        printf("%s, %zu tensor%s", aft_st_format(op->st), n, n == 1 ? "" : "s");
    }
    putchar('\n');
}

static void print_rule(const struct compare_opts *o)
{
    printf("rule:          |a - b| <= %.9g + %.9g * |b|%s\n", o->atol, o->rtol,
           o->equal_nan ? ", NaN == NaN" : "");
}

static void print_shapes_differ(const pair *p)
{
    printf("shapes differ: ");
    print_dims(p->a->shape, p->a->ndim);
    printf(" vs ");
    print_dims(p->b->shape, p->b->ndim);
    putchar('\n');
}

static void print_text(const operand *a, const operand *b, const pair *p,
                       const struct compare_opts *o)
{
    print_operand("a", a);
    print_operand("b", b);
    if (!p->same_shape) {
        print_shapes_differ(p);
        printf("not close\n");
        return;
    }
    const stats *s = &p->s;
    print_rule(o);
    printf("max abs error: %.9g\n", s->max_abs);
    printf("max rel error: %.9g\n", s->max_rel);
    printf("mismatches:    %zu / %zu\n", s->mismatches, s->total);
    printf("worst index:   ");
    if (s->have_worst) {
        size_t idx[AFT_MAX_DIMS];
        unravel(p->a, s->worst, idx);
        print_dims(idx, p->a->ndim);
        printf("  a = %.9g, b = %.9g\n", s->worst_a, s->worst_b);
    } else {
        printf("none (no elements)\n");
    }
    puts(p->close ? "close" : "not close");
}

/* ---------------------------------------------------------------- two files, as a table */

/* the columns after the name, for a pair of equal shapes */
enum { CELLS = 4 };
static const char *const titles[CELLS + 1] = {"name", "shape", "max abs error", "max rel error",
                                              "mismatches"};

static void pair_cells(const pair *p, char cell[CELLS][DIMS_TEXT])
{
    format_dims(cell[0], DIMS_TEXT, p->a->shape, p->a->ndim);
    snprintf(cell[1], DIMS_TEXT, "%.9g", p->s.max_abs);
    snprintf(cell[2], DIMS_TEXT, "%.9g", p->s.max_rel);
    snprintf(cell[3], DIMS_TEXT, "%zu / %zu", p->s.mismatches, p->s.total);
}

static void widen(int *w, size_t len)
{
    if (len > (size_t)*w) *w = len < INT_MAX ? (int)len : INT_MAX;
}

/* each column as wide as its title and its widest cell */
static void column_widths(const pair *pairs, size_t n, int w[CELLS + 1])
{
    for (int c = 0; c <= CELLS; c++) w[c] = (int)strlen(titles[c]);
    for (size_t i = 0; i < n; i++) {
        widen(&w[0], strlen(pairs[i].name));
        if (!pairs[i].same_shape) continue;
        char cell[CELLS][DIMS_TEXT];
        pair_cells(&pairs[i], cell);
        for (int c = 0; c < CELLS; c++) widen(&w[c + 1], strlen(cell[c]));
    }
}

/* one line: the cells and the verdict, or why there are none */
static void print_row(const pair *p, const int w[CELLS + 1])
{
    printf("%-*s  ", w[0], p->name);
    if (!p->a || !p->b) {
        printf("only in %s\n", p->a ? "a" : "b");
    } else if (!p->same_shape) {
        print_shapes_differ(p);
    } else {
        char cell[CELLS][DIMS_TEXT];
        pair_cells(p, cell);
        for (int c = 0; c < CELLS; c++) printf("%-*s  ", w[c + 1], cell[c]);
        puts(p->close ? "close" : "not close");
    }
}

static void print_files_text(const operand *a, const operand *b, const pair *pairs, size_t n,
                             size_t not_close, const struct compare_opts *o)
{
    print_operand("a", a);
    print_operand("b", b);
    print_rule(o);
    int w[CELLS + 1];
    column_widths(pairs, n, w);
    for (int c = 0; c < CELLS; c++) printf("%-*s  ", w[c], titles[c]);
    puts(titles[CELLS]);
    for (size_t i = 0; i < n; i++) print_row(&pairs[i], w);
    if (not_close)
        printf("not close (%zu of %zu %s)\n", not_close, n, cli_noun(n, "tensor", "tensors"));
    else
        puts("close");
}

/* ---------------------------------------------------------------- JSON */

/* a number, or "inf" / "-inf" / "nan" where JSON has no number */
static cJSON *json_number(double v)
{
    if (isnan(v)) return cJSON_CreateString("nan");
    if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    return cJSON_CreateNumber(v);
}

/* appends item to arr; deletes item and returns 0 if anything is NULL */
static int push(cJSON *arr, cJSON *item)
{
    if (!arr || !item) {
        cJSON_Delete(item);
        return 0;
    }
    return cJSON_AddItemToArray(arr, item);
}

static cJSON *json_dims(const size_t *dims, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n && arr; i++) {
        if (!push(arr, cJSON_CreateNumber((double)dims[i]))) {
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

static int put_tensors(cJSON *o, const pair *p)
{
    return put(o, "dtype_a", cJSON_CreateString(aft_dtype_name(p->a->dtype))) &&
           put(o, "dtype_b", cJSON_CreateString(aft_dtype_name(p->b->dtype))) &&
           put(o, "shape_a", json_dims(p->a->shape, p->a->ndim)) &&
           put(o, "shape_b", json_dims(p->b->shape, p->b->ndim));
}

static int put_rule(cJSON *o, const struct compare_opts *opt)
{
    return put(o, "rtol", cJSON_CreateNumber(opt->rtol)) &&
           put(o, "atol", cJSON_CreateNumber(opt->atol)) &&
           put(o, "equal_nan", cJSON_CreateBool(opt->equal_nan));
}

static int put_errors(cJSON *o, const pair *p)
{
    const stats *s = &p->s;
    cJSON *worst = NULL;
    if (s->have_worst) {
        size_t idx[AFT_MAX_DIMS];
        unravel(p->a, s->worst, idx);
        worst = json_dims(idx, p->a->ndim);
    } else {
        worst = cJSON_CreateNull();
    }
    return put(o, "max_abs_error", json_number(s->max_abs)) &&
           put(o, "max_rel_error", json_number(s->max_rel)) &&
           put(o, "mismatches", cJSON_CreateNumber((double)s->mismatches)) &&
           put(o, "total", cJSON_CreateNumber((double)s->total)) &&
           put(o, "worst_index", worst) &&
           put(o, "worst_a", s->have_worst ? json_number(s->worst_a) : cJSON_CreateNull()) &&
           put(o, "worst_b", s->have_worst ? json_number(s->worst_b) : cJSON_CreateNull());
}

/* shapes_equal, the errors (null when the shapes differ) and close */
static int put_verdict(cJSON *o, const pair *p)
{
    int ok = put(o, "shapes_equal", cJSON_CreateBool(p->same_shape));
    if (ok && p->same_shape) {
        ok = put_errors(o, p);
    } else if (ok) {
        static const char *const keys[] = {"max_abs_error", "max_rel_error", "mismatches",
                                           "total", "worst_index", "worst_a", "worst_b"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0] && ok; i++)
            ok = put(o, keys[i], cJSON_CreateNull());
    }
    return ok && put(o, "close", cJSON_CreateBool(p->close));
}

/* prints o on one line if ok, and deletes it; 0, or -1 when out of memory */
static int print_json_object(cJSON *o, int ok)
{
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) return -1;
    puts(text);
    cJSON_free(text);
    return 0;
}

static int print_json(const operand *a, const operand *b, const pair *p,
                      const struct compare_opts *opt)
{
    cJSON *o = cJSON_CreateObject();
    int ok = put(o, "a", cJSON_CreateString(a->arg)) &&
             put(o, "b", cJSON_CreateString(b->arg)) &&
             put_tensors(o, p) && put_rule(o, opt) && put_verdict(o, p);
    return print_json_object(o, ok);
}

/* a pair of two files: its name, then the fields of a single comparison */
static cJSON *json_pair(const pair *p)
{
    cJSON *o = cJSON_CreateObject();
    if (put(o, "name", cJSON_CreateString(p->name)) && put_tensors(o, p) && put_verdict(o, p)) return o;
    cJSON_Delete(o);
    return NULL;
}

/* each pair goes to "tensors", or by name to "only_in_a" or "only_in_b" */
static int put_pairs(cJSON *o, const pair *pairs, size_t n)
{
    cJSON *both, *only_a, *only_b;
    if (!put(o, "tensors", both = cJSON_CreateArray()) ||
        !put(o, "only_in_a", only_a = cJSON_CreateArray()) ||
        !put(o, "only_in_b", only_b = cJSON_CreateArray()))
        return 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        const pair *p = &pairs[i];
        if (p->a && p->b)
            ok = push(both, json_pair(p));
        else
            ok = push(p->a ? only_a : only_b, cJSON_CreateString(p->name));
    }
    return ok;
}

static int print_files_json(const operand *a, const operand *b, const pair *pairs, size_t n,
                            int close, const struct compare_opts *opt)
{
    cJSON *o = cJSON_CreateObject();
    int ok = put(o, "a", cJSON_CreateString(a->arg)) &&
             put(o, "b", cJSON_CreateString(b->arg)) &&
             put_rule(o, opt) && put_pairs(o, pairs, n) &&
             put(o, "close", cJSON_CreateBool(close));
    return print_json_object(o, ok);
}


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
    {"--json", NULL, NULL, "print one JSON object instead of the text report (its keys: JSON OUTPUT in man aft)",
     cli_set_flag, offsetof(struct compare_opts, json), NULL, 0},
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
             "apart by their first bytes.\n"
             "\n"
             "When A and B are both .safetensors or .npz files named alone, their\n"
             "tensors are compared by name, whatever their order: each name must be in\n"
             "both files. (Two files of one tensor each compare those two, whatever\n"
             "their names.) A file of several tensors against a single tensor is an\n"
             "error.\n",
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
            "Two files give a table instead, a line per name in A's order, then the\n"
            "names only B holds: the shape, the largest errors, the mismatches and\n"
            "'close' or 'not close'; or 'shapes differ', 'only in a', 'only in b'. The\n"
            "last line is 'close' (every tensor close) or 'not close (K of N tensors)'.\n"
            "Their --json object has \"tensors\" (per name in both: \"name\" and the\n"
            "fields above), \"only_in_a\" and \"only_in_b\" (names), and \"close\".\n"
            "\n"
            "exit status: 0 close, 1 not close (or the shapes differ, or a name is in\n"
            "one file only) or a file could not be read, 2 usage error\n",
    .operand = add_operand,
};

/* the exit status after a report: a failed report or write, else the verdict */
static int finish(int rc, int close)
{
    if (rc != 0) {
        cli_error(cmd, "out of memory writing the report");
        cli_finish_stdout(cmd);
        return EXIT_DATA;
    }
    int out = cli_finish_stdout(cmd);
    if (out) return out;
    return close ? 0 : EXIT_DATA;
}

/* two tensors: the operands', a file named alone standing for its only one */
static int compare_single(operand *a, operand *b, const struct compare_opts *o)
{
    if (pick_single(a) != 0 || pick_single(b) != 0) return EXIT_DATA;
    pair p = {.a = a->t, .b = b->t};
    compare_pair(&p, o);
    int rc = 0;
    if (o->json)
        rc = print_json(a, b, &p, o);
    else
        print_text(a, b, &p, o);
    return finish(rc, p.close);
}

/* The pairs of two files: A's names in file order, each with B's tensor of
 * that name or none, then the names only B holds. NULL when out of memory;
 * else *n pairs (a name appears once in a file), malloc'd. */
static pair *match_names(const aft_st_file *fa, const aft_st_file *fb, size_t *n)
{
    size_t na = aft_st_count(fa), nb = aft_st_count(fb), cap;
    if (__builtin_add_overflow(na, nb, &cap)) return NULL;
    pair *pairs = calloc(cap ? cap : 1, sizeof *pairs);
    if (!pairs) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < na; i++, k++) {
        pairs[k].a = aft_st_get(fa, i, &pairs[k].name);
        pairs[k].b = aft_st_find(fb, pairs[k].name);
    }
    for (size_t j = 0; j < nb; j++) {
        const char *name;
        const aft_tensor *t = aft_st_get(fb, j, &name);
        if (!aft_st_find(fa, name)) pairs[k++] = (pair){.name = name, .b = t};
    }
    *n = k;
    return pairs;
}

/* two files, tensor by tensor: each tensor is read where the file holds it
 * (mapped, or inflated once at open), so nothing is loaded twice */
static int compare_files(const operand *a, const operand *b, const struct compare_opts *o)
{
    size_t n, not_close = 0;
    pair *pairs = match_names(a->st, b->st, &n);
    if (!pairs) {
        cli_error(cmd, "out of memory matching the tensors of %s and %s", cli_display_name(a->arg),
                  cli_display_name(b->arg));
        return EXIT_DATA;
    }
    for (size_t i = 0; i < n; i++) {
        if (pairs[i].a && pairs[i].b) compare_pair(&pairs[i], o);
        not_close += !pairs[i].close;
    }
    int rc = 0;
    if (o->json)
        rc = print_files_json(a, b, pairs, n, not_close == 0, o);
    else
        print_files_text(a, b, pairs, n, not_close, o);
    free(pairs);
    return finish(rc, not_close == 0);
}

int cmd_compare(int argc, char **argv)
{
    /* options may come before, between or after the operands */
    struct compare_opts o = {.rtol = 1e-5, .atol = 1e-8};
    int rc = cli_parse_options(&cli_compare_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout(cmd) : rc;
    if (o.nops != 2) return cli_usage_error(cmd, "need two operands, A and B");
    if (strcmp(o.ops[0], "-") == 0 && strcmp(o.ops[1], "-") == 0)
        return cli_usage_error(cmd, "only one operand can be '-' (standard input)");

    operand a, b;
    memset(&b, 0, sizeof b);
    if (load(&a, o.ops[0]) != 0 || load(&b, o.ops[1]) != 0)
        rc = EXIT_DATA;
    else if (by_name(&a, &b))
        rc = compare_files(&a, &b, &o);
    else
        rc = compare_single(&a, &b, &o);
    unload(&a);
    unload(&b);
    return rc;
}
