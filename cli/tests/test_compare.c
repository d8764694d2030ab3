/* test_compare.c - `aft compare`: the allclose rule, NaN and infinity, operands, errors;
 * two files of tensors compared by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aft.h"
#include "harness.h"

/* writes name, in the temporary directory, as a .npy and returns its malloc'd path */
static char *npy(const char *name, aft_dtype dt, const void *data, size_t ndim,
                 const size_t *shape)
{
    char *path = harness_tmp(name);
    aft_tensor t = harness_tensor(dt, data, ndim, shape);
    aft_error err = {{0}};
    if (aft_npy_write(path, &t, &err) != AFT_OK) fail_msg("writing %s: %s", path, err.msg);
    return path;
}

/* (2, 3) float32 .npy */
static char *npy23(const char *name, const float v[6])
{
    return npy(name, AFT_F32, v, 2, (size_t[]){2, 3});
}

static const float base[6] = {1, 2, 3, -4, 5, 0};

/* runs aft compare with args (NULL-terminated, after "compare") */
static void run(harness_result *r, const char *const *args)
{
    const char *argv[16] = {"compare"};
    size_t n = 1;
    while (args[n - 1]) {
        assert_true(n < 15);
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    assert_int_equal(harness_run(r, argv, NULL, 0), 0);
}
#define COMPARE(r, ...) run((r), (const char *const[]){__VA_ARGS__, NULL})

/* the last line of stdout */
static const char *last_line(const harness_result *r)
{
    assert_true(r->out_len > 0 && r->out[r->out_len - 1] == '\n');
    const char *p = r->out + r->out_len - 1;
    while (p > r->out && p[-1] != '\n') p--;
    return p;
}

static cJSON *json_of(const harness_result *r)
{
    assert_int_equal(harness_count_lines(r->out), 1);
    cJSON *o = cJSON_Parse(r->out);
    if (!o) fail_msg("not JSON: %s", r->out);
    return o;
}

static const cJSON *field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) fail_msg("no field '%s'", key);
    return v;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = field(o, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static void check_index(const cJSON *o, size_t n, const size_t *idx)
{
    const cJSON *w = field(o, "worst_index");
    assert_true(cJSON_IsArray(w));
    assert_int_equal(cJSON_GetArraySize(w), n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal((size_t)cJSON_GetArrayItem(w, (int)i)->valuedouble, idx[i]);
}

static void test_identical(void **state)
{
    (void)state;
    char *a = npy23("same_a.npy", base), *b = npy23("same_b.npy", base);
    harness_result r;
    COMPARE(&r, a, b);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);
    assert_string_equal(last_line(&r), "close\n");
    assert_non_null(strstr(r.out, "mismatches:    0 / 6\n"));
    assert_non_null(strstr(r.out, "max abs error: 0\n"));
    harness_result_free(&r);
    /* a file against itself */
    COMPARE(&r, a, a, "--json");
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsTrue(field(o, "close")));
    assert_int_equal(num(o, "mismatches"), 0);
    assert_int_equal(num(o, "total"), 6);
    assert_true(num(o, "max_abs_error") == 0);
    cJSON_Delete(o);
    harness_result_free(&r);
    free(a);
    free(b);
}

/* small relative differences pass the default rtol 1e-5 */
static void test_close_within_tolerance(void **state)
{
    (void)state;
    float v[6];
    for (int i = 0; i < 6; i++) v[i] = base[i] * (1 + 2e-6f);
    char *a = npy23("near_a.npy", v), *b = npy23("near_b.npy", base);
    harness_result r;
    COMPARE(&r, a, b, "--json");
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsTrue(field(o, "close")));
    assert_true(num(o, "max_abs_error") > 0);
    assert_true(num(o, "max_rel_error") > 1e-6 && num(o, "max_rel_error") < 1e-5);
    assert_true(num(o, "rtol") == 1e-5);
    assert_true(num(o, "atol") == 1e-8);
    cJSON_Delete(o);
    harness_result_free(&r);
    /* and fail a tighter rtol */
    COMPARE(&r, a, b, "--rtol", "1e-7");
    assert_int_equal(r.exit_code, 1);
    assert_string_equal(last_line(&r), "not close\n");
    harness_result_free(&r);
    free(a);
    free(b);
}

/* two mismatches; the worst is the larger excess over the tolerance */
static void test_not_close(void **state)
{
    (void)state;
    float v[6];
    memcpy(v, base, sizeof v);
    v[1] += 0.5f;   /* [0, 1]: off by 0.5 */
    v[5] += 3.0f;   /* [1, 2]: off by 3 where b == 0 */
    char *a = npy23("far_a.npy", v), *b = npy23("far_b.npy", base);
    harness_result r;
    COMPARE(&r, a, b);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.err_len, 0);
    assert_non_null(strstr(r.out, "mismatches:    2 / 6\n"));
    assert_non_null(strstr(r.out, "worst index:   [1, 2]  a = 3, b = 0\n"));
    assert_non_null(strstr(r.out, "max abs error: 3\n"));
    /* rel error skips b == 0: the largest is 0.5 / 2 */
    assert_non_null(strstr(r.out, "max rel error: 0.25\n"));
    assert_string_equal(last_line(&r), "not close\n");
    harness_result_free(&r);

    COMPARE(&r, "--json", a, b);
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsFalse(field(o, "close")));
    assert_int_equal(num(o, "mismatches"), 2);
    check_index(o, 2, (size_t[]){1, 2});
    assert_true(num(o, "worst_a") == 3);
    assert_true(num(o, "worst_b") == 0);
    assert_true(num(o, "max_abs_error") == 3);
    cJSON_Delete(o);
    harness_result_free(&r);

    /* atol 3 covers both: close; the worst (least margin) is still [1, 2] */
    COMPARE(&r, a, b, "--atol=3", "--json");
    assert_int_equal(r.exit_code, 0);
    o = json_of(&r);
    assert_true(cJSON_IsTrue(field(o, "close")));
    check_index(o, 2, (size_t[]){1, 2});
    cJSON_Delete(o);
    harness_result_free(&r);

    /* the rule is asymmetric, as in numpy: rtol scales |b| */
    COMPARE(&r, a, b, "--rtol", "0.3", "--atol", "0");
    assert_int_equal(r.exit_code, 1);   /* [1, 2] has b == 0 */
    assert_non_null(strstr(r.out, "mismatches:    1 / 6\n"));
    harness_result_free(&r);
    free(a);
    free(b);
}

/* NaN equals NaN only with --equal-nan; a NaN against a number never */
static void test_nan(void **state)
{
    (void)state;
    float v[6], w[6];
    memcpy(v, base, sizeof v);
    memcpy(w, base, sizeof w);
    v[4] = w[4] = NAN;   /* [1, 1] */
    char *a = npy23("nan_a.npy", v), *b = npy23("nan_b.npy", w);
    harness_result r;
    COMPARE(&r, a, b, "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    assert_int_equal(num(o, "mismatches"), 1);
    check_index(o, 2, (size_t[]){1, 1});
    assert_string_equal(field(o, "worst_a")->valuestring, "nan");
    /* NaN pairs stay out of the error maxima */
    assert_true(num(o, "max_abs_error") == 0);
    assert_true(cJSON_IsFalse(field(o, "equal_nan")));
    cJSON_Delete(o);
    harness_result_free(&r);

    COMPARE(&r, a, b, "--equal-nan");
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(last_line(&r), "close\n");
    harness_result_free(&r);

    /* NaN against a number fails even with --equal-nan */
    char *c = npy23("nan_c.npy", base);
    COMPARE(&r, a, c, "--equal-nan");
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.out, "worst index:   [1, 1]"));
    harness_result_free(&r);
    free(a);
    free(b);
    free(c);
}

/* inf == inf of the same sign; opposite signs or inf vs a number differ */
static void test_inf(void **state)
{
    (void)state;
    float v[6], w[6], x[6];
    memcpy(v, base, sizeof v);
    memcpy(w, base, sizeof w);
    memcpy(x, base, sizeof x);
    v[0] = w[0] = INFINITY;
    v[3] = w[3] = -INFINITY;
    x[0] = -INFINITY;
    x[3] = -INFINITY;
    char *a = npy23("inf_a.npy", v), *b = npy23("inf_b.npy", w), *c = npy23("inf_c.npy", x);
    harness_result r;
    COMPARE(&r, a, b, "--json");
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_of(&r);
    assert_true(num(o, "max_abs_error") == 0);
    cJSON_Delete(o);
    harness_result_free(&r);

    COMPARE(&r, a, c, "--json");
    assert_int_equal(r.exit_code, 1);
    o = json_of(&r);
    assert_int_equal(num(o, "mismatches"), 1);
    check_index(o, 2, (size_t[]){0, 0});
    assert_string_equal(field(o, "max_abs_error")->valuestring, "inf");
    cJSON_Delete(o);
    harness_result_free(&r);

    /* inf against a finite number, however large the tolerance */
    char *d = npy23("inf_d.npy", base);
    COMPARE(&r, a, d, "--atol", "1e300");
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.out, "mismatches:    2 / 6\n"));
    harness_result_free(&r);
    free(a);
    free(b);
    free(c);
    free(d);
}

static void test_shape_mismatch(void **state)
{
    (void)state;
    char *a = npy23("s23.npy", base);
    char *b = npy("s32.npy", AFT_F32, base, 2, (size_t[]){3, 2});
    harness_result r;
    COMPARE(&r, a, b);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.out, "shapes differ: [2, 3] vs [3, 2]\n"));
    assert_string_equal(last_line(&r), "not close\n");
    harness_result_free(&r);

    COMPARE(&r, a, b, "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsFalse(field(o, "shapes_equal")));
    assert_true(cJSON_IsFalse(field(o, "close")));
    assert_true(cJSON_IsNull(field(o, "worst_index")));
    assert_int_equal(cJSON_GetArraySize(field(o, "shape_b")), 2);
    cJSON_Delete(o);
    harness_result_free(&r);

    /* same element count, different rank: no broadcasting either */
    char *c = npy("s6.npy", AFT_F32, base, 1, (size_t[]){6});
    COMPARE(&r, a, c);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.out, "shapes differ: [2, 3] vs [6]\n"));
    harness_result_free(&r);
    free(a);
    free(b);
    free(c);
}

/* FILE.safetensors:NAME, a name holding ':', a single-tensor file named alone */
static void test_safetensors_operand(void **state)
{
    (void)state;
    char *st = harness_tmp("m.safetensors");
    char *one = harness_tmp("one.safetensors");
    static const double other[6] = {9, 9, 9, 9, 9, 9};
    aft_tensor ts[2] = {harness_tensor(AFT_F32, base, 2, (size_t[]){2, 3}),
                        harness_tensor(AFT_F64, other, 2, (size_t[]){2, 3})};
    const char *names[2] = {"w", "layer:0"};
    aft_error err = {{0}};
    assert_int_equal(aft_st_write(st, names, ts, 2, NULL, 0, &err), AFT_OK);
    assert_int_equal(aft_st_write(one, names, ts, 1, NULL, 0, &err), AFT_OK);
    char *a = npy23("st_ref.npy", base);
    char *w = NULL, *layer = NULL, *missing = NULL;
    assert_true(asprintf(&w, "%s:w", st) > 0);
    assert_true(asprintf(&layer, "%s:layer:0", st) > 0);
    assert_true(asprintf(&missing, "%s:nope", st) > 0);

    harness_result r;
    COMPARE(&r, w, a);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    COMPARE(&r, layer, w, "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    assert_string_equal(field(o, "a")->valuestring, layer);
    assert_string_equal(field(o, "dtype_a")->valuestring, "F64");
    assert_int_equal(num(o, "mismatches"), 6);
    cJSON_Delete(o);
    harness_result_free(&r);
    COMPARE(&r, one, a);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);

    /* errors: an unknown name; a two-tensor file without a name */
    COMPARE(&r, missing, a);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(harness_count_lines(r.err), 1);
    assert_true(strncmp(r.err, "aft compare: ", 13) == 0);
    assert_non_null(strstr(r.err, st));
    assert_non_null(strstr(r.err, "no tensor named 'nope'"));
    assert_int_equal(r.out_len, 0);
    harness_result_free(&r);
    COMPARE(&r, st, a);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.err, "holds 2 tensors"));
    harness_result_free(&r);
    free(st);
    free(one);
    free(a);
    free(w);
    free(layer);
    free(missing);
}

/* ".safetensors:" inside a directory name or a tensor name: the split is
 * the one whose file exists */
static void test_safetensors_split(void **state)
{
    (void)state;
    char *sub = harness_tmp("d.safetensors:x");
    assert_int_equal(mkdir(sub, 0700), 0);
    char *st = harness_path(sub, "m.safetensors");
    aft_tensor t = harness_tensor(AFT_F32, base, 2, (size_t[]){2, 3});
    const char *names[1] = {"a.safetensors:b"};
    aft_error err = {{0}};
    assert_int_equal(aft_st_write(st, names, &t, 1, NULL, 0, &err), AFT_OK);
    char *ref = npy23("split_ref.npy", base);
    char *op = NULL;
    assert_true(asprintf(&op, "%s:a.safetensors:b", st) > 0);
    harness_result r;
    COMPARE(&r, op, ref);
    if (r.exit_code != 0) fail_msg("exit %d: %s", r.exit_code, r.err);
    harness_result_free(&r);
    assert_int_equal(unlink(st), 0);
    assert_int_equal(rmdir(sub), 0);
    free(op);
    free(ref);
    free(st);
    free(sub);
}

static void test_stdin_operand(void **state)
{
    (void)state;
    char *a = npy23("in_a.npy", base);
    char *bytes;
    size_t len;
    assert_int_equal(harness_read_file(a, &bytes, &len), 0);
    harness_result r;
    assert_int_equal(HARNESS_RUN_STDIN(&r, bytes, len, "compare", "-", a), 0);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(last_line(&r), "close\n");
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN_STDIN(&r, bytes, len, "compare", a, "-", "--json"), 0);
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_of(&r);
    assert_string_equal(field(o, "b")->valuestring, "-");
    cJSON_Delete(o);
    harness_result_free(&r);
    /* empty stdin is a data error naming standard input */
    assert_int_equal(HARNESS_RUN(&r, "compare", "-", a), 0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(harness_count_lines(r.err), 1);
    assert_true(strncmp(r.err, "aft compare: standard input: ", 29) == 0);
    harness_result_free(&r);
    free(bytes);
    free(a);
}

/* F64 values are compared in double, not rounded through float */
static void test_double_precision(void **state)
{
    (void)state;
    static const double x[2] = {1.0, 2.0}, y[2] = {1.0, 2.0 + 1e-12};
    char *a = npy("d_a.npy", AFT_F64, x, 1, (size_t[]){2});
    char *b = npy("d_b.npy", AFT_F64, y, 1, (size_t[]){2});
    harness_result r;
    COMPARE(&r, a, b, "--rtol", "0", "--atol", "0", "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    check_index(o, 1, (size_t[]){1});
    assert_true(num(o, "max_abs_error") > 0);
    cJSON_Delete(o);
    harness_result_free(&r);
    /* mixed dtypes: integers against floats by value */
    static const int32_t ints[2] = {1, 2};
    char *c = npy("d_c.npy", AFT_I32, ints, 1, (size_t[]){2});
    COMPARE(&r, c, a, "--rtol", "0", "--atol", "0");
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    free(a);
    free(b);
    free(c);
}

static void test_empty_tensors(void **state)
{
    (void)state;
    char *a = npy("e_a.npy", AFT_F32, base, 2, (size_t[]){0, 3});
    harness_result r;
    COMPARE(&r, a, a, "--json");
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_of(&r);
    assert_int_equal(num(o, "total"), 0);
    assert_true(cJSON_IsNull(field(o, "worst_index")));
    cJSON_Delete(o);
    harness_result_free(&r);
    free(a);
}

/* ---------------------------------------------------------------- two files, by name */

/* a named tensor of a gradient file */
typedef struct {
    const char *name;
    const float *v;
    size_t ndim, shape[2];
} named;

static const float qw[6] = {0.5f, -1, 2, 0.25f, 4, -3}, qb[3] = {0.1f, 0.2f, 0.3f}, pb[4] = {1, -1, 2, -2};

/* what aft grad writes for a layer, in this order */
static const named grads[4] = {
    {"input", base, 2, {2, 3}},
    {"query.weight", qw, 2, {3, 2}},
    {"query.bias", qb, 1, {3}},
    {"pos_bias", pb, 2, {2, 2}},
};

/* writes the n tensors to name in the temporary directory, a .npz if the
 * name says so, else a .safetensors; returns the malloc'd path */
static char *tensors_file(const char *name, const named *ts, size_t n)
{
    char *path = harness_tmp(name);
    aft_tensor t[8];
    const char *names[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        t[i] = harness_tensor(AFT_F32, ts[i].v, ts[i].ndim, ts[i].shape);
        names[i] = ts[i].name;
    }
    aft_error err = {{0}};
    aft_status st = strstr(name, ".npz") ? aft_npz_write(path, names, t, n, &err)
                                         : aft_st_write(path, names, t, n, NULL, 0, &err);
    if (st != AFT_OK) fail_msg("writing %s: %s", path, err.msg);
    return path;
}

/* B holds the same tensors in another order */
static void reorder(named out[4])
{
    static const int order[4] = {3, 1, 0, 2};
    for (int i = 0; i < 4; i++) out[i] = grads[order[i]];
}

/* the tensor object called name in the JSON's "tensors" */
static const cJSON *tensor_named(const cJSON *o, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, field(o, "tensors"))
        if (strcmp(field(t, "name")->valuestring, name) == 0) return t;
    fail_msg("no tensor '%s' in the JSON", name);
    return NULL;
}

/* the JSON array under key holds exactly these strings, in order */
static void check_names(const cJSON *o, const char *key, size_t n, const char *const *want)
{
    const cJSON *arr = field(o, key);
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(cJSON_GetArrayItem(arr, (int)i)->valuestring, want[i]);
}

/* the same tensors, in another order and within tolerance: close */
static void test_files_close(void **state)
{
    (void)state;
    named b[4];
    reorder(b);
    float near[6];
    for (int i = 0; i < 6; i++) near[i] = qw[i] * (1 + 2e-6f);
    b[1].v = near;   /* query.weight */
    char *fa = tensors_file("close_a.safetensors", grads, 4), *fb = tensors_file("close_b.safetensors", b, 4);
    harness_result r;
    COMPARE(&r, fa, fb);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);
    assert_string_equal(last_line(&r), "close\n");
    /* a, b, rule, titles, a line per tensor, the verdict */
    assert_int_equal(harness_count_lines(r.out), 9);
    /* in A's order, whatever B's */
    const char *at = r.out;
    for (int i = 0; i < 4; i++) {
        char line[64];
        snprintf(line, sizeof line, "\n%-12s  ", grads[i].name);
        const char *p = strstr(at, line);
        if (!p) fail_msg("no line for %s after the previous one:\n%s", grads[i].name, r.out);
        const char *eol = strchr(p + 1, '\n');
        /* "  close", not "not close" */
        assert_true(eol && eol - p > 8 && strncmp(eol - 7, "  close", 7) == 0);
        at = p + 1;
    }
    harness_result_free(&r);

    COMPARE(&r, fa, fb, "--json");
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsTrue(field(o, "close")));
    assert_int_equal(cJSON_GetArraySize(field(o, "tensors")), 4);
    check_names(o, "only_in_a", 0, NULL);
    check_names(o, "only_in_b", 0, NULL);
    const cJSON *t = tensor_named(o, "query.weight");
    assert_true(cJSON_IsTrue(field(t, "close")));
    assert_true(num(t, "max_rel_error") > 1e-6 && num(t, "max_rel_error") < 1e-5);
    assert_int_equal(num(t, "total"), 6);
    assert_string_equal(field(t, "dtype_a")->valuestring, "F32");
    assert_true(num(o, "rtol") == 1e-5);
    cJSON_Delete(o);
    harness_result_free(&r);
    /* a tighter rtol turns just that tensor */
    COMPARE(&r, fa, fb, "--rtol", "1e-7");
    assert_int_equal(r.exit_code, 1);
    assert_string_equal(last_line(&r), "not close (1 of 4 tensors)\n");
    harness_result_free(&r);
    free(fa);
    free(fb);
}

/* one element off in one tensor: the whole report, exactly; B a .npz */
static void test_files_one_off(void **state)
{
    (void)state;
    float off[6];
    memcpy(off, qw, sizeof off);
    off[1] = -0.5f;   /* [0, 1]: b holds -1 */
    named a[4];
    memcpy(a, grads, sizeof a);
    a[1].v = off;
    named b[4];
    reorder(b);
    char *fa = tensors_file("off_a.safetensors", a, 4), *fb = tensors_file("off_b.npz", b, 4);
    harness_result r;
    COMPARE(&r, fa, fb);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.err_len, 0);
    char *want = NULL;
    assert_true(asprintf(&want,
                         "a:             %s  safetensors, 4 tensors\n"
                         "b:             %s  npz, 4 tensors\n"
                         "rule:          |a - b| <= 1e-08 + 1e-05 * |b|\n"
                         "name          shape   max abs error  max rel error  mismatches\n"
                         "input         [2, 3]  0              0              0 / 6       close\n"
                         "query.weight  [3, 2]  0.5            0.5            1 / 6       not close\n"
                         "query.bias    [3]     0              0              0 / 3       close\n"
                         "pos_bias      [2, 2]  0              0              0 / 4       close\n"
                         "not close (1 of 4 tensors)\n",
                         fa, fb) > 0);
    assert_string_equal(r.out, want);
    free(want);
    harness_result_free(&r);

    COMPARE(&r, "--json", fa, fb);
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsFalse(field(o, "close")));
    assert_string_equal(field(o, "a")->valuestring, fa);
    const cJSON *t = field(o, "tensors");
    assert_int_equal(cJSON_GetArraySize(t), 4);
    /* in A's order */
    for (int i = 0; i < 4; i++)
        assert_string_equal(field(cJSON_GetArrayItem(t, i), "name")->valuestring, grads[i].name);
    const cJSON *q = tensor_named(o, "query.weight");
    assert_true(cJSON_IsFalse(field(q, "close")));
    assert_true(cJSON_IsTrue(field(q, "shapes_equal")));
    assert_int_equal(num(q, "mismatches"), 1);
    check_index(q, 2, (size_t[]){0, 1});
    assert_true(num(q, "worst_a") == -0.5 && num(q, "worst_b") == -1);
    assert_true(cJSON_IsTrue(field(tensor_named(o, "pos_bias"), "close")));
    cJSON_Delete(o);
    harness_result_free(&r);
    free(fa);
    free(fb);
}

/* a name in one file only: a line each, A's among A's, B's at the end */
static void test_files_name_one_side(void **state)
{
    (void)state;
    named a[5], b[5];
    memcpy(a, grads, 4 * sizeof *a);
    a[4] = (named){"key.weight", qw, 2, {3, 2}};
    reorder(b);
    b[4] = (named){"value.bias", qb, 1, {3}};
    char *fa = tensors_file("side_a.safetensors", a, 5), *fb = tensors_file("side_b.safetensors", b, 5);
    harness_result r;
    COMPARE(&r, fa, fb);
    assert_int_equal(r.exit_code, 1);
    const char *ka = strstr(r.out, "\nkey.weight    only in a\n");
    const char *vb = strstr(r.out, "\nvalue.bias    only in b\n");
    assert_non_null(ka);
    assert_non_null(vb);
    assert_true(strstr(r.out, "\npos_bias ") < ka && ka < vb);
    assert_string_equal(last_line(&r), "not close (2 of 6 tensors)\n");
    harness_result_free(&r);

    COMPARE(&r, fa, fb, "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    assert_true(cJSON_IsFalse(field(o, "close")));
    assert_int_equal(cJSON_GetArraySize(field(o, "tensors")), 4);
    check_names(o, "only_in_a", 1, (const char *[]){"key.weight"});
    check_names(o, "only_in_b", 1, (const char *[]){"value.bias"});
    cJSON_Delete(o);
    harness_result_free(&r);

    /* a file of one tensor against one of several is compared by name too */
    char *one = tensors_file("side_one.safetensors", grads, 1);
    COMPARE(&r, one, fa, "--json");
    assert_int_equal(r.exit_code, 1);
    o = json_of(&r);
    assert_int_equal(cJSON_GetArraySize(field(o, "tensors")), 1);
    assert_true(cJSON_IsTrue(field(tensor_named(o, "input"), "close")));
    check_names(o, "only_in_b", 4, (const char *[]){"query.weight", "query.bias", "pos_bias", "key.weight"});
    cJSON_Delete(o);
    harness_result_free(&r);
    free(one);
    free(fa);
    free(fb);
}

/* a tensor whose shapes differ is not close, and has no errors */
static void test_files_shapes_differ(void **state)
{
    (void)state;
    named b[4];
    memcpy(b, grads, sizeof b);
    b[3].shape[0] = 1;   /* pos_bias [1, 2] */
    b[3].shape[1] = 2;
    char *fa = tensors_file("shape_a.safetensors", grads, 4), *fb = tensors_file("shape_b.safetensors", b, 4);
    harness_result r;
    COMPARE(&r, fa, fb);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.out, "\npos_bias      shapes differ: [2, 2] vs [1, 2]\n"));
    assert_string_equal(last_line(&r), "not close (1 of 4 tensors)\n");
    harness_result_free(&r);

    COMPARE(&r, fa, fb, "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    const cJSON *t = tensor_named(o, "pos_bias");
    assert_true(cJSON_IsFalse(field(t, "shapes_equal")));
    assert_true(cJSON_IsFalse(field(t, "close")));
    assert_true(cJSON_IsNull(field(t, "max_abs_error")));
    assert_int_equal(cJSON_GetArraySize(field(t, "shape_b")), 2);
    assert_true(cJSON_IsTrue(field(tensor_named(o, "input"), "close")));
    assert_true(cJSON_IsFalse(field(o, "close")));
    cJSON_Delete(o);
    harness_result_free(&r);
    free(fa);
    free(fb);
}

/* NaN and infinity keep the single report's strings inside "tensors" */
static void test_files_json_nonfinite(void **state)
{
    (void)state;
    float v[6];
    memcpy(v, base, sizeof v);
    v[2] = INFINITY;
    named a[4];
    memcpy(a, grads, sizeof a);
    a[0].v = v;
    char *fa = tensors_file("inf_a.safetensors", a, 4), *fb = tensors_file("inf_b.safetensors", grads, 4);
    harness_result r;
    COMPARE(&r, fa, fb, "--json");
    assert_int_equal(r.exit_code, 1);
    cJSON *o = json_of(&r);
    const cJSON *t = tensor_named(o, "input");
    assert_string_equal(field(t, "max_abs_error")->valuestring, "inf");
    assert_string_equal(field(t, "worst_a")->valuestring, "inf");
    cJSON_Delete(o);
    harness_result_free(&r);
    free(fa);
    free(fb);
}

/* a file of several tensors against one tensor: one line, exit 1 */
static void test_files_mixed_refused(void **state)
{
    (void)state;
    char *f = tensors_file("mixed.safetensors", grads, 4);
    char *x = npy23("mixed.npy", base);
    char *named_one = NULL;
    assert_true(asprintf(&named_one, "%s:input", f) > 0);
    const char *cases[4][2] = {{f, x}, {x, f}, {f, named_one}, {named_one, f}};
    for (int i = 0; i < 4; i++) {
        harness_result r;
        COMPARE(&r, cases[i][0], cases[i][1]);
        assert_int_equal(r.exit_code, 1);
        assert_int_equal(r.out_len, 0);
        assert_int_equal(harness_count_lines(r.err), 1);
        char *want = NULL;
        assert_true(asprintf(&want, "aft compare: %s: holds 4 tensors; name one as %s:NAME", f, f) > 0);
        if (strncmp(r.err, want, strlen(want)) != 0) fail_msg("stderr: %s", r.err);
        free(want);
        harness_result_free(&r);
    }
    /* named, it is a single tensor again */
    harness_result r;
    COMPARE(&r, named_one, x);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, "worst index:"));
    harness_result_free(&r);
    free(named_one);
    free(f);
    free(x);
}

/* two single-tensor files compare those tensors, whatever their names */
static void test_files_single_each(void **state)
{
    (void)state;
    named other = grads[0];
    other.name = "x";
    char *fa = tensors_file("single_a.safetensors", grads, 1), *fb = tensors_file("single_b.safetensors", &other, 1);
    harness_result r;
    COMPARE(&r, fa, fb);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, "mismatches:    0 / 6\n"));
    harness_result_free(&r);
    free(fa);
    free(fb);
}

/* --max-memory bounds the archives of a file comparison as of one tensor */
static void test_files_max_memory(void **state)
{
    (void)state;
    char *a = NULL, *b = NULL;
    assert_true(asprintf(&a, "%s/npz/weights_rish_full.npz", harness_testdata()) > 0);
    assert_true(asprintf(&b, "%s/npz/weights_rish_full_deflated.npz", harness_testdata()) > 0);
    harness_result r;
    COMPARE(&r, a, b, "--atol", "0", "--rtol", "0");
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(last_line(&r), "close\n");
    harness_result_free(&r);
    COMPARE(&r, a, b, "--max-memory", "1K");
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.out_len, 0);
    assert_int_equal(harness_count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "past the memory limit of 1024 bytes"));
    harness_result_free(&r);
    free(a);
    free(b);
}

static void expect_usage_error(const char *const *args, const char *says)
{
    harness_result r;
    run(&r, args);
    assert_int_equal(r.exit_code, 2);
    assert_int_equal(r.out_len, 0);
    assert_true(strncmp(r.err, "aft compare: ", 13) == 0);
    if (!strstr(r.err, says)) fail_msg("stderr '%s' does not say '%s'", r.err, says);
    assert_non_null(strstr(r.err, "Try 'aft compare --help'."));
    harness_result_free(&r);
}

static void test_bad_tolerance(void **state)
{
    (void)state;
    char *a = npy23("tol.npy", base);
    expect_usage_error((const char *[]){a, a, "--rtol", "abc", NULL}, "--rtol 'abc'");
    expect_usage_error((const char *[]){a, a, "--atol", "-1", NULL}, "--atol '-1'");
    expect_usage_error((const char *[]){a, a, "--atol=1e999", NULL}, "--atol '1e999'");
    expect_usage_error((const char *[]){a, a, "--rtol=nan", NULL}, "--rtol 'nan'");
    expect_usage_error((const char *[]){a, a, "--rtol", NULL}, "needs a value");
    expect_usage_error((const char *[]){a, a, "--rtol", "", NULL}, "--rtol ''");
    free(a);
}

static void test_usage_errors(void **state)
{
    (void)state;
    char *a = npy23("use.npy", base);
    expect_usage_error((const char *[]){NULL}, "two operands");
    expect_usage_error((const char *[]){a, NULL}, "two operands");
    expect_usage_error((const char *[]){a, a, a, NULL}, "too many operands");
    expect_usage_error((const char *[]){"-", "-", NULL}, "only one operand");
    expect_usage_error((const char *[]){a, a, "--bogus", NULL}, "--bogus");
    free(a);
}

static void test_missing_file(void **state)
{
    (void)state;
    char *a = npy23("present.npy", base);
    char *gone = harness_tmp("gone.npy");
    harness_result r;
    COMPARE(&r, a, gone);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.out_len, 0);
    assert_int_equal(harness_count_lines(r.err), 1);
    char *want = NULL;
    assert_true(asprintf(&want, "aft compare: %s: cannot open", gone) > 0);
    assert_true(strncmp(r.err, want, strlen(want)) == 0);
    harness_result_free(&r);
    free(want);
    free(a);
    free(gone);
}

static void test_help(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "compare", "--help"), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);
    static const char first[] =
        "usage: aft compare A B [--rtol R] [--atol A] [--equal-nan] [--json]\n";
    assert_true(strncmp(r.out, first, sizeof first - 1) == 0);
    harness_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical),
        cmocka_unit_test(test_close_within_tolerance),
        cmocka_unit_test(test_not_close),
        cmocka_unit_test(test_nan),
        cmocka_unit_test(test_inf),
        cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_safetensors_operand),
        cmocka_unit_test(test_safetensors_split),
        cmocka_unit_test(test_stdin_operand),
        cmocka_unit_test(test_double_precision),
        cmocka_unit_test(test_empty_tensors),
        cmocka_unit_test(test_files_close),
        cmocka_unit_test(test_files_one_off),
        cmocka_unit_test(test_files_name_one_side),
        cmocka_unit_test(test_files_shapes_differ),
        cmocka_unit_test(test_files_json_nonfinite),
        cmocka_unit_test(test_files_mixed_refused),
        cmocka_unit_test(test_files_single_each),
        cmocka_unit_test(test_files_max_memory),
        cmocka_unit_test(test_bad_tolerance),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests_name("cli compare", tests, harness_setup, harness_teardown);
}
