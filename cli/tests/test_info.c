/* test_info.c - `aft info` on .npy and .safetensors files, text and JSON, and its errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "checks.h"
#include "harness.h"

/* the fixture files, written once into a temp dir by the group setup */
static char *p_x;       /* x.npy: F32 (2, 3) */
static char *p_be;      /* be.npy: big-endian I16 (2, 3) stored in Fortran order */
static char *p_u8;      /* bytes.npy: U8 (5), descr '|u1' */
static char *p_model;   /* model.safetensors: 3 tensors, 2 metadata entries */
static char *p_odd;     /* odd.safetensors: a name with a newline in it */
static char *p_sniff_npy, *p_sniff_st;  /* no extension: recognised by content */
static char *p_bad;     /* bad.npy: the data cut short */
static char *x_bytes;   /* x.npy's bytes, for stdin */
static size_t x_len;

static const float x_vals[6] = {0, 1, 2, 3, 4, 5};

/* A version 1.0 .npy with the header dict given, padded as numpy pads it
 * (preamble + header a multiple of 64, ending in '\n'), then data. */
static int write_raw_npy(const char *path, const char *dict, const void *data, size_t len)
{
    unsigned char buf[512];
    size_t dl = strlen(dict), hl = dl + 1;
    while ((10 + hl) % 64) hl++;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hl & 0xff);
    buf[9] = (unsigned char)(hl >> 8);
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', hl - dl - 1);
    buf[10 + hl - 1] = '\n';
    memcpy(buf + 10 + hl, data, len);
    return harness_write_file(path, buf, 10 + hl + len);
}

static int setup(void **state)
{
    aft_error err = {{0}};
    if (harness_setup(state) != 0) return -1;
    p_x = harness_tmp("x.npy");
    p_be = harness_tmp("be.npy");
    p_u8 = harness_tmp("bytes.npy");
    p_model = harness_tmp("model.safetensors");
    p_odd = harness_tmp("odd.safetensors");
    p_sniff_npy = harness_tmp("array-data");
    p_sniff_st = harness_tmp("weights-data");
    p_bad = harness_tmp("bad.npy");

    aft_tensor x = harness_tensor(AFT_F32, x_vals, 2, (size_t[]){2, 3});
    if (aft_npy_write(p_x, &x, &err) != AFT_OK) goto fail;
    if (harness_read_file(p_x, &x_bytes, &x_len) != 0) return -1;
    if (harness_write_file(p_sniff_npy, x_bytes, x_len) != 0) return -1;
    /* cut the 24 data bytes to 20 */
    if (harness_write_file(p_bad, x_bytes, x_len - 4) != 0) return -1;

    /* [[1, 2, 3], [4, 5, 6]] as >i2 in column order: 1 4 2 5 3 6 */
    static const unsigned char be[12] = {0, 1, 0, 4, 0, 2, 0, 5, 0, 3, 0, 6};
    if (write_raw_npy(p_be, "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3), }",
                      be, sizeof be) != 0)
        return -1;
    static const unsigned char u8[5] = {1, 2, 3, 4, 5};
    if (write_raw_npy(p_u8, "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }",
                      u8, sizeof u8) != 0)
        return -1;

    static const float w[12] = {0};
    static const double bias[3] = {1, 2, 3};
    static const double scale = 0.5;
    aft_tensor ts[3] = {
        harness_tensor(AFT_F32, w, 2, (size_t[]){4, 3}),
        harness_tensor(AFT_F64, bias, 1, (size_t[]){3}),
        harness_tensor(AFT_F64, &scale, 0, NULL),
    };
    const char *names[3] = {"to_q.weight", "to_q.bias", "scale"};
    const char *meta[4] = {"format", "pt", "note", "made by test_info"};
    if (aft_st_write(p_model, names, ts, 3, meta, 2, &err) != AFT_OK) goto fail;
    if (aft_st_write(p_sniff_st, names, ts, 1, NULL, 0, &err) != AFT_OK) goto fail;
    const char *odd[1] = {"line\nbreak"};
    if (aft_st_write(p_odd, odd, ts, 1, NULL, 0, &err) != AFT_OK) goto fail;
    return 0;
fail:
    fprintf(stderr, "setup: %s\n", err.msg);
    return -1;
}

static int teardown(void **state)
{
    int rc = harness_teardown(state);
    char **all[] = {&p_x, &p_be, &p_u8, &p_model, &p_odd, &p_sniff_npy,
                    &p_sniff_st, &p_bad, &x_bytes};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(*all[i]);
        *all[i] = NULL;
    }
    return rc;
}

/* parses the single JSON line of r's stdout */
static cJSON *json_line(const harness_result *r)
{
    assert_int_equal(harness_count_lines(r->out), 1);
    cJSON *o = cJSON_Parse(r->out);
    assert_non_null(o);
    assert_true(cJSON_IsObject(o));
    return o;
}

static const char *str_field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsString(v));
    return v->valuestring;
}

static double num_field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static void check_shape(const cJSON *o, size_t ndim, const size_t *shape)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "shape");
    assert_true(cJSON_IsArray(s));
    assert_int_equal(cJSON_GetArraySize(s), ndim);
    for (size_t i = 0; i < ndim; i++) {
        const cJSON *d = cJSON_GetArrayItem(s, (int)i);
        assert_true(cJSON_IsNumber(d));
        assert_int_equal((size_t)d->valuedouble, shape[i]);
    }
}

/* checks the "npy" object of a JSON report */
static void check_npy(const cJSON *o, const char *order, int fortran)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "npy");
    assert_true(cJSON_IsObject(n));
    assert_string_equal(str_field(n, "version"), "1.0");
    assert_string_equal(str_field(n, "byte_order"), order);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(n, "fortran_order");
    assert_true(cJSON_IsBool(f));
    assert_int_equal(cJSON_IsTrue(f), fortran);
}

static void test_npy_text(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", p_x, NULL});
    char *want = harness_fmt("%s: npy 1.0, little-endian, C order\n"
                             "  name  dtype  shape   bytes\n"
                             "  x     F32    [2, 3]     24\n",
                             p_x);
    assert_string_equal(r.out, want);
    free(want);
    harness_result_free(&r);
}

static void test_npy_json(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", "--json", p_x, NULL});
    cJSON *o = json_line(&r);
    assert_string_equal(str_field(o, "file"), p_x);
    assert_string_equal(str_field(o, "format"), "npy");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tensors");
    assert_true(cJSON_IsArray(ts));
    assert_int_equal(cJSON_GetArraySize(ts), 1);
    const cJSON *t = cJSON_GetArrayItem(ts, 0);
    assert_string_equal(str_field(t, "name"), "x");
    assert_string_equal(str_field(t, "dtype"), "F32");
    check_shape(t, 2, (size_t[]){2, 3});
    assert_int_equal(num_field(t, "bytes"), 24);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "metadata");
    assert_true(cJSON_IsObject(m));
    assert_int_equal(cJSON_GetArraySize(m), 0);
    check_npy(o, "little", 0);
    cJSON_Delete(o);
    harness_result_free(&r);
}

/* a big-endian, Fortran-order file: reported as stored */
static void test_npy_big_endian_fortran(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", "--json", p_be, NULL});
    cJSON *o = json_line(&r);
    const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "tensors"), 0);
    assert_non_null(t);
    assert_string_equal(str_field(t, "name"), "be");
    assert_string_equal(str_field(t, "dtype"), "I16");
    check_shape(t, 2, (size_t[]){2, 3});
    assert_int_equal(num_field(t, "bytes"), 12);
    check_npy(o, "big", 1);
    cJSON_Delete(o);
    harness_result_free(&r);

    check_ok(&r, (const char *[]){"info", p_be, NULL});
    char *want = harness_fmt("%s: npy 1.0, big-endian, Fortran order\n", p_be);
    assert_true(strncmp(r.out, want, strlen(want)) == 0);
    free(want);
    harness_result_free(&r);
}

/* single bytes have no byte order */
static void test_npy_no_byte_order(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", "--json", p_u8, NULL});
    cJSON *o = json_line(&r);
    check_npy(o, "none", 0);
    const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "tensors"), 0);
    assert_string_equal(str_field(t, "dtype"), "U8");
    check_shape(t, 1, (size_t[]){5});
    cJSON_Delete(o);
    harness_result_free(&r);

    check_ok(&r, (const char *[]){"info", p_u8, NULL});
    assert_non_null(strstr(r.out, "byte order n/a, C order\n"));
    harness_result_free(&r);
}

static void test_safetensors_text(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", p_model, NULL});
    char *want = harness_fmt("%s: safetensors, 3 tensors, 2 metadata entries\n"
                             "  name         dtype  shape   bytes\n"
                             "  to_q.weight  F32    [4, 3]     48\n"
                             "  to_q.bias    F64    [3]        24\n"
                             "  scale        F64    []          8\n"
                             "  metadata:\n"
                             "    format = pt\n"
                             "    note = made by test_info\n",
                             p_model);
    assert_string_equal(r.out, want);
    free(want);
    harness_result_free(&r);
}

static void test_safetensors_json(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", "--json", p_model, NULL});
    cJSON *o = json_line(&r);
    assert_string_equal(str_field(o, "file"), p_model);
    assert_string_equal(str_field(o, "format"), "safetensors");
    assert_null(cJSON_GetObjectItemCaseSensitive(o, "npy"));
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tensors");
    assert_int_equal(cJSON_GetArraySize(ts), 3);
    static const char *names[3] = {"to_q.weight", "to_q.bias", "scale"};
    static const char *dtypes[3] = {"F32", "F64", "F64"};
    static const size_t bytes[3] = {48, 24, 8};
    for (int i = 0; i < 3; i++) {
        const cJSON *t = cJSON_GetArrayItem(ts, i);
        assert_string_equal(str_field(t, "name"), names[i]);
        assert_string_equal(str_field(t, "dtype"), dtypes[i]);
        assert_int_equal(num_field(t, "bytes"), bytes[i]);
    }
    check_shape(cJSON_GetArrayItem(ts, 0), 2, (size_t[]){4, 3});
    check_shape(cJSON_GetArrayItem(ts, 1), 1, (size_t[]){3});
    check_shape(cJSON_GetArrayItem(ts, 2), 0, NULL);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "metadata");
    assert_int_equal(cJSON_GetArraySize(m), 2);
    assert_string_equal(str_field(m, "format"), "pt");
    assert_string_equal(str_field(m, "note"), "made by test_info");
    cJSON_Delete(o);
    harness_result_free(&r);
}

/* a newline inside a tensor name must not break the table; JSON keeps it */
static void test_odd_name(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", p_odd, NULL});
    assert_int_equal(harness_count_lines(r.out), 3);
    assert_non_null(strstr(r.out, "  line\\nbreak  F32"));
    harness_result_free(&r);

    check_ok(&r, (const char *[]){"info", "--json", p_odd, NULL});
    cJSON *o = json_line(&r);
    const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "tensors"), 0);
    assert_string_equal(str_field(t, "name"), "line\nbreak");
    cJSON_Delete(o);
    harness_result_free(&r);
}

/* files without a known extension are recognised by their first bytes */
static void test_sniff(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", "--json", p_sniff_npy, p_sniff_st, NULL});
    assert_int_equal(harness_count_lines(r.out), 2);
    char *nl = strchr(r.out, '\n');
    *nl = '\0';
    cJSON *a = cJSON_Parse(r.out), *b = cJSON_Parse(nl + 1);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(str_field(a, "format"), "npy");
    assert_string_equal(str_field(b, "format"), "safetensors");
    /* the .npy tensor is named after the whole base name */
    assert_string_equal(str_field(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "tensors"), 0), "name"),
                        "array-data");
    cJSON_Delete(a);
    cJSON_Delete(b);
    harness_result_free(&r);
}

/* several files: one report each, separated by a blank line */
static void test_several_files_text(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", p_x, p_model, NULL});
    char *second = harness_fmt("\n\n%s: safetensors", p_model);
    assert_non_null(strstr(r.out, second));
    free(second);
    harness_result_free(&r);
}

/* exit 1; stderr is one line "aft info: FILE: problem" */
static void check_one_error_line(const harness_result *r, const char *file, const char *problem)
{
    assert_int_equal(r->exit_code, 1);
    assert_int_equal(harness_count_lines(r->err), 1);
    assert_int_equal(r->err[r->err_len - 1], '\n');
    char *prefix = harness_fmt("aft info: %s: ", file);
    if (strncmp(r->err, prefix, strlen(prefix)) != 0)
        fail_msg("stderr '%s' does not start with '%s'", r->err, prefix);
    /* something after the prefix, and it names the problem */
    assert_true(r->err_len > strlen(prefix) + 1);
    free(prefix);
    if (!strstr(r->err, problem)) fail_msg("stderr '%s' does not say '%s'", r->err, problem);
}

static void test_stdin(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN_STDIN(&r, x_bytes, x_len, "info", "--json", "-"), 0);
    assert_int_equal(r.exit_code, 0);
    cJSON *o = json_line(&r);
    assert_string_equal(str_field(o, "file"), "-");
    assert_string_equal(str_field(o, "format"), "npy");
    const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "tensors"), 0);
    assert_string_equal(str_field(t, "name"), "(array)");
    check_shape(t, 2, (size_t[]){2, 3});
    cJSON_Delete(o);
    harness_result_free(&r);
    /* the text report calls it standard input */
    assert_int_equal(HARNESS_RUN_STDIN(&r, x_bytes, x_len, "info", "-"), 0);
    assert_int_equal(r.exit_code, 0);
    assert_true(strncmp(r.out, "standard input: npy 1.0, little-endian, C order\n", 48) == 0);
    assert_non_null(strstr(r.out, "\n  (array)  F32    [2, 3]     24\n"));
    harness_result_free(&r);
    /* empty stdin: the message names standard input */
    assert_int_equal(HARNESS_RUN(&r, "info", "-"), 0);
    check_one_error_line(&r, "standard input", "");
    harness_result_free(&r);
}

static void test_malformed(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info", p_bad), 0);
    check_one_error_line(&r, p_bad, "truncated");
    assert_int_equal(r.out_len, 0);
    harness_result_free(&r);
}

/* the first bad file stops the command; earlier reports stay printed */
static void test_stops_at_first_bad_file(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info", "--json", p_x, p_bad, p_model), 0);
    check_one_error_line(&r, p_bad, "truncated");
    cJSON *o = json_line(&r);
    assert_string_equal(str_field(o, "file"), p_x);
    cJSON_Delete(o);
    harness_result_free(&r);
}

static void test_missing_file(void **state)
{
    (void)state;
    char *missing = harness_tmp("nope.npy");
    char *missing2 = harness_tmp("nope");
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info", missing), 0);
    check_one_error_line(&r, missing, "cannot open");
    harness_result_free(&r);
    /* no extension: the open for sniffing fails the same way */
    assert_int_equal(HARNESS_RUN(&r, "info", missing2), 0);
    check_one_error_line(&r, missing2, "cannot open");
    harness_result_free(&r);
    free(missing);
    free(missing2);
}

/* a file that is neither format: the safetensors reader says why */
static void test_unknown_format(void **state)
{
    (void)state;
    char *junk = harness_tmp("junk.txt");
    assert_int_equal(harness_write_file(junk, "hello, world\n", 13), 0);
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info", junk), 0);
    check_one_error_line(&r, junk, "");
    harness_result_free(&r);
    free(junk);
}

static void test_no_args(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info"), 0);
    assert_int_equal(r.exit_code, 2);
    assert_int_equal(r.out_len, 0);
    assert_true(strncmp(r.err, "aft info: ", 10) == 0);
    assert_non_null(strstr(r.err, "Try 'aft info --help'."));
    harness_result_free(&r);

    /* "--json" alone is still no file */
    assert_int_equal(HARNESS_RUN(&r, "info", "--json"), 0);
    assert_int_equal(r.exit_code, 2);
    harness_result_free(&r);
}

static void test_unknown_option(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info", "--frobnicate", p_x), 0);
    assert_int_equal(r.exit_code, 2);
    assert_int_equal(r.out_len, 0);
    assert_non_null(strstr(r.err, "--frobnicate"));
    harness_result_free(&r);
}

static void test_help(void **state)
{
    (void)state;
    harness_result r;
    check_ok(&r, (const char *[]){"info", "--help", NULL});
    assert_true(strncmp(r.out, "usage: aft info [--json] [--max-memory SIZE] FILE...\n", 52) == 0);
    harness_result_free(&r);
    /* -h too, and `aft help info` */
    check_ok(&r, (const char *[]){"info", "-h", NULL});
    assert_true(strncmp(r.out, "usage: aft info", 15) == 0);
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"help", "info", NULL});
    assert_true(strncmp(r.out, "usage: aft info", 15) == 0);
    harness_result_free(&r);
}

/* "--" ends the options: what follows is a file even if it looks like one */
static void test_double_dash(void **state)
{
    (void)state;
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "info", "--", "--json"), 0);
    check_one_error_line(&r, "--json", "cannot open");
    harness_result_free(&r);
    check_ok(&r, (const char *[]){"info", "--json", "--", p_x, NULL});
    cJSON *o = json_line(&r);
    assert_string_equal(str_field(o, "file"), p_x);
    cJSON_Delete(o);
    harness_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_text),
        cmocka_unit_test(test_npy_json),
        cmocka_unit_test(test_npy_big_endian_fortran),
        cmocka_unit_test(test_npy_no_byte_order),
        cmocka_unit_test(test_safetensors_text),
        cmocka_unit_test(test_safetensors_json),
        cmocka_unit_test(test_odd_name),
        cmocka_unit_test(test_sniff),
        cmocka_unit_test(test_several_files_text),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_stops_at_first_bad_file),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_unknown_format),
        cmocka_unit_test(test_no_args),
        cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_double_dash),
    };
    return cmocka_run_group_tests_name("cli info", tests, setup, teardown);
}
