/* test_compare.c - `aft compare`: the allclose rule, NaN and infinity, operands, errors. */
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

static char *dir;   /* temp dir for this run's files */

static int setup(void **state)
{
    (void)state;
    dir = harness_mkdtemp();
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = harness_rmtree(dir);
    free(dir);
    dir = NULL;
    return rc;
}

/* writes dir/name as a .npy and returns its malloc'd path */
static char *npy(const char *name, aft_dtype dt, const void *data, size_t ndim,
                 const size_t *shape)
{
    char *path = harness_path(dir, name);
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
    char *st = harness_path(dir, "m.safetensors");
    char *one = harness_path(dir, "one.safetensors");
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
    char *sub = harness_path(dir, "d.safetensors:x");
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
    char *gone = harness_path(dir, "gone.npy");
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
        cmocka_unit_test(test_bad_tolerance),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests_name("cli compare", tests, setup, teardown);
}
