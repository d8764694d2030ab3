/* test_safetensors.c - the .safetensors reader and writer.
 *
 * Fixtures in testdata/st/ come from testdata/make_st_fixtures.py; their
 * values are formulas of the element index recomputed here (expect_bytes),
 * and the F16/BF16 ones carry torch's float32 view beside them. Malformed
 * files are built in memory from a header string, one per refusal, and each
 * test checks the message as well as the status.
 *
 * AFT_TESTDATA names the testdata directory (the Makefile sets it); without
 * it, "testdata" relative to the current directory. Setting
 * AFT_ST_WRITE_GOLDEN=1 rewrites testdata/st/written_by_aft.safetensors from
 * the writer instead of comparing against it (check the result with
 * testdata/make_st_fixtures.py --check).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aft.h"
#include "files.h"

/* ---------------------------------------------------------------- helpers */

/* a fixture of testdata/st (files.h: four can be live) */
static const char *fixture(const char *name)
{
    return files_fixture("st", name);
}

static aft_st_file *open_ok(const char *path)
{
    aft_st_file *f = NULL;
    aft_error err = {{0}};
    aft_status st = aft_st_open(path, &f, &err);
    if (st != AFT_OK) fail_msg("%s: %s", path, err.msg);
    assert_non_null(f);
    return f;
}

/* a file image: 8-byte LE size, the header bytes as given (hlen of them),
 * then datalen data bytes (0, 1, 2, ...) */
static unsigned char *mkfile_n(const char *header, size_t hlen, size_t datalen, size_t *len)
{
    *len = 8 + hlen + datalen;
    unsigned char *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    for (size_t i = 0; i < datalen; i++) b[8 + hlen + i] = (unsigned char)i;
    return b;
}

static void check_msg(const aft_error *err, const char *needle)
{
    if (!strstr(err->msg, needle)) fail_msg("message \"%s\" lacks \"%s\"", err->msg, needle);
    assert_null(strchr(err->msg, '\n'));
}

static void refused_raw(const unsigned char *buf, size_t len, const char *needle)
{
    aft_st_file *f = (aft_st_file *)&f;   /* must be reset to NULL on failure */
    aft_error err = {{0}};
    aft_status st = aft_st_open_mem(buf, len, &f, &err);
    if (st == AFT_OK) fail_msg("accepted, expected \"%s\"", needle);
    assert_int_equal(st, AFT_ERR_FORMAT);
    assert_null(f);
    check_msg(&err, needle);
}

static void refused_n(const char *header, size_t hlen, size_t datalen, const char *needle)
{
    size_t len;
    unsigned char *b = mkfile_n(header, hlen, datalen, &len);
    refused_raw(b, len, needle);
    free(b);
}

static void refused(const char *header, size_t datalen, const char *needle)
{
    refused_n(header, strlen(header), datalen, needle);
}

/* opens an in-memory file that must be valid; the buffer is handed back
 * through *keep and must outlive the handle */
static aft_st_file *accepted(const char *header, size_t datalen, unsigned char **keep)
{
    size_t len;
    unsigned char *b = mkfile_n(header, strlen(header), datalen, &len);
    aft_st_file *f = NULL;
    aft_error err = {{0}};
    if (aft_st_open_mem(b, len, &f, &err) != AFT_OK) fail_msg("refused: %s", err.msg);
    *keep = b;
    return f;
}

/* element i of the dtype fixture tensor, as bytes (the formulas of
 * dtype_values in make_st_fixtures.py) */
static void expect_bytes(aft_dtype dt, size_t i, unsigned char out[8])
{
    int64_t s = (int64_t)i;
    switch (dt) {
    case AFT_F64: { double v = (double)(s - 11) / 3.0; memcpy(out, &v, 8); break; }
    case AFT_F32: { float v = (float)((double)(s - 11) / 3.0); memcpy(out, &v, 4); break; }
    case AFT_BOOL: out[0] = i % 3 == 0; break;
    case AFT_U8: out[0] = (uint8_t)(i * 37 % 256); break;
    case AFT_I8: { int8_t v = (int8_t)((int)(i * 37 % 256) - 128); memcpy(out, &v, 1); break; }
    case AFT_I16: { int16_t v = (int16_t)(s * 1000 - 12000); memcpy(out, &v, 2); break; }
    case AFT_U16: { uint16_t v = (uint16_t)(i * 2700); memcpy(out, &v, 2); break; }
    case AFT_I32: { int32_t v = (int32_t)((s - 12) * 100000007); memcpy(out, &v, 4); break; }
    case AFT_U32: { uint32_t v = (uint32_t)(i * 178956970u); memcpy(out, &v, 4); break; }
    case AFT_I64: { int64_t v = (s - 12) * 1000000000007LL; memcpy(out, &v, 8); break; }
    case AFT_U64: { uint64_t v = (uint64_t)i * 800000000000000000ULL; memcpy(out, &v, 8); break; }
    default: fail_msg("no formula for %s", aft_dtype_name(dt));
    }
}

/* the same element as the float aft_tensor_to_f32 should give */
static float expect_f32(aft_dtype dt, size_t i)
{
    unsigned char b[8] = {0};
    expect_bytes(dt, i, b);
    switch (dt) {
    case AFT_F64: { double v; memcpy(&v, b, 8); return (float)v; }
    case AFT_F32: { float v; memcpy(&v, b, 4); return v; }
    case AFT_BOOL: case AFT_U8: return b[0];
    case AFT_I8: return (int8_t)b[0];
    case AFT_I16: { int16_t v; memcpy(&v, b, 2); return v; }
    case AFT_U16: { uint16_t v; memcpy(&v, b, 2); return v; }
    case AFT_I32: { int32_t v; memcpy(&v, b, 4); return (float)v; }
    case AFT_U32: { uint32_t v; memcpy(&v, b, 4); return (float)v; }
    case AFT_I64: { int64_t v; memcpy(&v, b, 8); return (float)v; }
    case AFT_U64: { uint64_t v; memcpy(&v, b, 8); return (float)v; }
    default: fail_msg("no formula"); return 0;
    }
}

static const aft_dtype formula_dtypes[] = {
    AFT_F64, AFT_F32, AFT_BOOL, AFT_U8, AFT_I8, AFT_I16, AFT_U16,
    AFT_I32, AFT_U32, AFT_I64, AFT_U64,
};
#define N_FORMULA (sizeof formula_dtypes / sizeof formula_dtypes[0])

static void lower(char *dst, const char *src)
{
    for (; *src; src++) *dst++ = (char)(*src >= 'A' && *src <= 'Z' ? *src + 32 : *src);
    *dst = '\0';
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* two floats are the same value: equal bits, or both NaN */
static void same_float(float got, float want, const char *what, size_t i)
{
    if (isnan(got) && isnan(want)) return;
    if (f32_bits(got) != f32_bits(want))
        fail_msg("%s[%zu]: got %a (0x%08x), want %a (0x%08x)", what, i, (double)got,
                 f32_bits(got), (double)want, f32_bits(want));
}

static float *to_f32(const aft_tensor *t)
{
    float *v = NULL;
    aft_error err = {{0}};
    if (aft_tensor_to_f32(t, &v, &err) != AFT_OK) fail_msg("to_f32: %s", err.msg);
    return v;
}

static void check_formula_tensor(const aft_tensor *t, aft_dtype dt)
{
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->shape[2], 4);
    assert_int_equal(t->nelem, 24);
    assert_int_equal(t->nbytes, 24 * aft_dtype_size(dt));
    size_t es = aft_dtype_size(dt);
    for (size_t i = 0; i < 24; i++) {
        unsigned char want[8];
        expect_bytes(dt, i, want);
        if (memcmp((const unsigned char *)t->data + i * es, want, es) != 0)
            fail_msg("%s element %zu differs", aft_dtype_name(dt), i);
    }
    float *v = to_f32(t);
    for (size_t i = 0; i < 24; i++) same_float(v[i], expect_f32(dt, i), aft_dtype_name(dt), i);
    free(v);
}

/* F16/BF16 tensor h against torch's float32 view w and its source src:
 * widening must match torch exactly, and narrowing src must give h's bits */
static void check_half(const aft_tensor *h, const aft_tensor *w, const aft_tensor *src, int bf16)
{
    assert_int_equal(h->dtype, bf16 ? AFT_BF16 : AFT_F16);
    assert_int_equal(w->dtype, AFT_F32);
    assert_int_equal(h->nelem, w->nelem);
    assert_int_equal(h->nelem, src->nelem);
    float *got = to_f32(h), *want = to_f32(w), *s = to_f32(src);
    for (size_t i = 0; i < h->nelem; i++) {
        same_float(got[i], want[i], bf16 ? "bf16 widened" : "f16 widened", i);
        uint16_t bits;
        memcpy(&bits, (const unsigned char *)h->data + 2 * i, 2);
        uint16_t mine = bf16 ? aft_f32_to_bf16(s[i]) : aft_f32_to_f16(s[i]);
        float back = bf16 ? aft_bf16_to_f32(mine) : aft_f16_to_f32(mine);
        if (isnan(s[i])) {
            assert_true(isnan(back));
        } else if (mine != bits) {
            fail_msg("%s of %a: aft 0x%04x, torch 0x%04x", bf16 ? "bf16" : "f16",
                     (double)s[i], mine, bits);
        }
    }
    free(got); free(want); free(s);
}

/* ---------------------------------------------------------------- fixtures */

static void test_dtypes_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("dtypes.safetensors"));
    assert_int_equal(aft_st_count(f), 15);
    for (size_t k = 0; k < N_FORMULA; k++) {
        char name[16];
        lower(name, aft_dtype_name(formula_dtypes[k]));
        const aft_tensor *t = aft_st_find(f, name);
        if (!t) fail_msg("no tensor %s", name);
        assert_null(t->owned);   /* borrowed from the mapping */
        check_formula_tensor(t, formula_dtypes[k]);
    }
    const aft_tensor *src = aft_st_find(f, "f32");
    check_half(aft_st_find(f, "f16"), aft_st_find(f, "f16_as_f32"), src, 0);
    check_half(aft_st_find(f, "bf16"), aft_st_find(f, "bf16_as_f32"), src, 1);
    /* file order is the order the generator laid the data out */
    const char *name;
    aft_st_get(f, 0, &name);
    assert_string_equal(name, "f64");
    aft_st_get(f, 14, &name);
    assert_string_equal(name, "bf16_as_f32");
    assert_int_equal(aft_st_metadata_count(f), 1);
    const char *k, *v;
    aft_st_metadata(f, 0, &k, &v);
    assert_string_equal(k, "format");
    assert_string_equal(v, "pt");
    aft_st_close(f);
}

static void test_halfs_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("halfs.safetensors"));
    const aft_tensor *src = aft_st_find(f, "src");
    assert_non_null(src);
    assert_true(src->nelem > 100);
    check_half(aft_st_find(f, "f16"), aft_st_find(f, "f16_as_f32"), src, 0);
    check_half(aft_st_find(f, "bf16"), aft_st_find(f, "bf16_as_f32"), src, 1);
    aft_st_close(f);
}

static void test_metadata_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("metadata.safetensors"));
    assert_int_equal(aft_st_metadata_count(f), 3);
    const char *k, *v;
    aft_st_metadata(f, 0, &k, &v);
    assert_string_equal(k, "format");
    assert_string_equal(v, "pt");
    aft_st_metadata(f, 1, &k, &v);
    assert_string_equal(k, "note");
    assert_string_equal(v, "na\xc3\xafve \xe2\x9c\x93 \"quoted\" back\\slash\nnewline");
    aft_st_metadata(f, 2, &k, &v);
    assert_string_equal(k, "empty");
    assert_string_equal(v, "");
    aft_st_metadata(f, 3, &k, &v);
    assert_null(k);
    assert_null(v);
    /* by key: the value, or NULL */
    assert_string_equal(aft_st_metadata_find(f, "note"), "na\xc3\xafve \xe2\x9c\x93 \"quoted\" back\\slash\nnewline");
    assert_string_equal(aft_st_metadata_find(f, "empty"), "");
    assert_null(aft_st_metadata_find(f, "x"));
    assert_null(aft_st_metadata_find(f, "forma"));
    assert_int_equal(aft_st_count(f), 1);
    const aft_tensor *t = aft_st_find(f, "x");
    assert_non_null(t);
    float x[2];
    memcpy(x, t->data, 8);
    assert_true(x[0] == 1.0f && x[1] == 2.0f);
    aft_st_close(f);
}

static void test_zero_size_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("zero_size.safetensors"));
    assert_int_equal(aft_st_count(f), 5);
    const char *want[] = {"a", "b", "c", "d", "e"};
    const size_t nbytes[] = {0, 8, 0, 0, 3};
    for (size_t i = 0; i < 5; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        assert_string_equal(name, want[i]);
        assert_int_equal(t->nbytes, nbytes[i]);
        assert_ptr_equal(aft_st_find(f, want[i]), t);
    }
    const aft_tensor *c = aft_st_find(f, "c");
    assert_int_equal(c->ndim, 3);
    assert_int_equal(c->shape[1], 0);
    assert_int_equal(c->nelem, 0);
    float b[2];
    memcpy(b, aft_st_find(f, "b")->data, 8);
    assert_true(b[0] == 1.5f && b[1] == -2.5f);
    const int8_t *e = aft_st_find(f, "e")->data;
    assert_true(e[0] == -1 && e[1] == 0 && e[2] == 1);
    /* converting an empty tensor works and yields nothing */
    float *v = to_f32(c);
    free(v);
    aft_st_close(f);
}

static void test_only_zero_size_fixture(void **state)
{
    /* the data buffer is empty: nothing past the header */
    aft_st_file *f = open_ok(fixture("only_zero_size.safetensors"));
    assert_int_equal(aft_st_count(f), 2);
    const aft_tensor *z = aft_st_find(f, "z"), *y = aft_st_find(f, "y");
    assert_non_null(z);
    assert_non_null(y);
    assert_int_equal(z->nelem, 0);
    assert_int_equal(y->nbytes, 0);
    assert_int_equal(y->dtype, AFT_U64);
    aft_st_close(f);

    f = open_ok(fixture("empty.safetensors"));
    assert_int_equal(aft_st_count(f), 0);
    assert_int_equal(aft_st_metadata_count(f), 0);
    assert_null(aft_st_get(f, 0, NULL));
    assert_null(aft_st_find(f, ""));
    aft_st_close(f);
}

static void test_scalars_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("scalars.safetensors"));
    const aft_tensor *a = aft_st_find(f, "s_f32"), *b = aft_st_find(f, "s_i64"),
                     *c = aft_st_find(f, "s_bf16");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(a->ndim, 0);
    assert_int_equal(a->nelem, 1);
    assert_int_equal(a->nbytes, 4);
    float fa;
    memcpy(&fa, a->data, 4);
    assert_true(fa == 3.5f);
    int64_t ib;
    memcpy(&ib, b->data, 8);
    assert_int_equal(ib, -42);
    float *v = to_f32(c);
    assert_true(v[0] == 1.5f);
    free(v);
    aft_st_close(f);
}

static void test_many_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("many.safetensors"));
    assert_int_equal(aft_st_count(f), 300);
    for (size_t k = 0; k < 300; k++) {
        char want[16];
        snprintf(want, sizeof want, "t%03zu", k);
        const char *name;
        const aft_tensor *t = aft_st_get(f, k, &name);
        assert_string_equal(name, want);
        assert_ptr_equal(aft_st_find(f, want), t);
        size_t n = k % 5 + 1;
        assert_int_equal(t->nelem, n);
        assert_int_equal(t->dtype, k % 3 == 0 ? AFT_F32 : k % 3 == 1 ? AFT_I32 : AFT_U8);
        float *v = to_f32(t);
        for (size_t j = 0; j < n; j++) {
            float w = k % 3 == 0 ? (float)((double)k + (double)j / 8.0)
                    : k % 3 == 1 ? (float)(k * 1000 + j) : (float)((k + j) % 256);
            same_float(v[j], w, want, j);
        }
        free(v);
    }
    assert_null(aft_st_find(f, "t300"));
    assert_null(aft_st_find(f, "t00"));
    assert_null(aft_st_find(f, ""));
    aft_st_close(f);
}

static void test_unaligned_fixture(void **state)
{
    aft_st_file *f = open_ok(fixture("unaligned.safetensors"));
    const aft_tensor *d = aft_st_find(f, "d"), *x = aft_st_find(f, "f");
    assert_non_null(d);
    assert_non_null(x);
    /* the point of the fixture: data at an odd address */
    assert_true((uintptr_t)d->data % 2 == 1);
    double dv[3];
    memcpy(dv, d->data, sizeof dv);
    assert_true(dv[0] == 0.5 && dv[1] == -1.25 && dv[2] == 1e300);
    float *v = to_f32(x);
    assert_true(v[0] == 3.25f && v[1] == -0.125f);
    free(v);
    aft_st_close(f);
}

/* the same bytes through aft_st_open_mem give the same tensors */
static void test_open_mem_matches_file(void **state)
{
    size_t len;
    unsigned char *buf = files_slurp(fixture("dtypes.safetensors"), &len);
    aft_st_file *m = NULL, *f = open_ok(fixture("dtypes.safetensors"));
    aft_error err = {{0}};
    assert_int_equal(aft_st_open_mem(buf, len, &m, &err), AFT_OK);
    assert_int_equal(aft_st_count(m), aft_st_count(f));
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *n1, *n2;
        const aft_tensor *a = aft_st_get(f, i, &n1), *b = aft_st_get(m, i, &n2);
        assert_string_equal(n1, n2);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
        /* borrowed: points into the caller's buffer */
        assert_true((const unsigned char *)b->data >= buf &&
                    (const unsigned char *)b->data + b->nbytes <= buf + len);
    }
    aft_st_close(m);
    aft_st_close(f);
    free(buf);
}

/* "-" reads standard input: once from a regular file, once from a pipe */
static void test_stdin(void **state)
{
    int saved = dup(0);
    assert_true(saved >= 0);
    int fd = open(fixture("metadata.safetensors"), O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(dup2(fd, 0), 0);
    close(fd);
    aft_st_file *f = open_ok("-");
    assert_int_equal(aft_st_count(f), 1);
    assert_int_equal(aft_st_metadata_count(f), 3);
    aft_st_close(f);

    size_t len;
    unsigned char *buf = files_slurp(fixture("scalars.safetensors"), &len);
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], buf, len), (ssize_t)len);   /* fits the pipe buffer */
    close(p[1]);
    assert_int_equal(dup2(p[0], 0), 0);
    close(p[0]);
    f = open_ok("-");
    assert_int_equal(aft_st_count(f), 3);
    assert_non_null(aft_st_find(f, "s_i64"));
    aft_st_close(f);
    free(buf);

    assert_int_equal(dup2(saved, 0), 0);
    close(saved);
}

/* a path that is a pipe (as with <(cmd)) is read, not mapped */
static void test_pipe_path(void **state)
{
    size_t len;
    unsigned char *buf = files_slurp(fixture("zero_size.safetensors"), &len);
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], buf, len), (ssize_t)len);
    close(p[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", p[0]);
    aft_st_file *f = open_ok(path);
    assert_int_equal(aft_st_count(f), 5);
    aft_st_close(f);
    close(p[0]);
    free(buf);
}

static void test_open_errors(void **state)
{
    aft_st_file *f = NULL;
    aft_error err = {{0}};
    assert_int_equal(aft_st_open(files_tmp("does-not-exist"), &f, &err), AFT_ERR_IO);
    assert_null(f);
    check_msg(&err, "cannot open: No such file or directory");

    /* a directory opens but cannot be read */
    assert_int_equal(aft_st_open(files_tmpdir(), &f, &err), AFT_ERR_IO);
    assert_null(f);
    check_msg(&err, "cannot read");

    /* shorter than the size field, on disk: refused before mmap */
    const char *p = files_tmp("short.safetensors");
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    fwrite("\x02\0\0\0", 1, 5, fp);
    fclose(fp);
    assert_int_equal(aft_st_open(p, &f, &err), AFT_ERR_FORMAT);
    check_msg(&err, "file is 5 bytes, too short for the 8-byte header size");
    fp = fopen(p, "wb");
    fclose(fp);
    assert_int_equal(aft_st_open(p, &f, &err), AFT_ERR_FORMAT);
    check_msg(&err, "file is 0 bytes");
    unlink(p);

    /* a format error through the mapped path too */
    p = files_tmp("bad.safetensors");
    size_t len;
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    unsigned char *b = mkfile_n(h, strlen(h), 4, &len);
    fp = fopen(p, "wb");
    fwrite(b, 1, len, fp);
    fclose(fp);
    free(b);
    assert_int_equal(aft_st_open(p, &f, &err), AFT_ERR_FORMAT);
    assert_null(f);
    check_msg(&err, "run past the end of the data buffer (4 bytes)");
    unlink(p);
}

static void test_accessors_out_of_range(void **state)
{
    assert_int_equal(aft_st_count(NULL), 0);
    assert_int_equal(aft_st_metadata_count(NULL), 0);
    assert_null(aft_st_find(NULL, "x"));
    const char *name = "x", *k = "x", *v = "x";
    assert_null(aft_st_get(NULL, 0, &name));
    assert_null(name);
    aft_st_metadata(NULL, 0, &k, &v);
    assert_null(k);
    assert_null(v);
    aft_st_close(NULL);

    aft_st_file *f = open_ok(fixture("scalars.safetensors"));
    name = "x";
    assert_null(aft_st_get(f, 3, &name));
    assert_null(name);
    assert_non_null(aft_st_get(f, 2, NULL));
    aft_st_close(f);
}

/* ---------------------------------------------------------------- accepted edge cases */

#define W_F32_1 "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

static void test_accepts_padding_and_names(void **state)
{
    unsigned char *keep;
    /* trailing padding: spaces (writers pad to 8) or any JSON whitespace */
    aft_st_file *f = accepted("{\"w\":" W_F32_1 "}      ", 4, &keep);
    assert_int_equal(aft_st_count(f), 1);
    aft_st_close(f);
    free(keep);
    f = accepted("{}\r\n\t ", 0, &keep);
    assert_int_equal(aft_st_count(f), 0);
    aft_st_close(f);
    free(keep);
    /* leading whitespace: the spec says the header starts with '{', but the
     * reference implementation accepts it, so we do too */
    f = accepted(" \n{}", 0, &keep);
    aft_st_close(f);
    free(keep);
    /* escaped and non-ASCII names come back decoded; "" is a valid name */
    f = accepted("{\"a\\u00e9\\\"b\\n\":" W_F32_1 ",\"\":"
                 "{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
                 "\"\xe2\x9c\x93\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[6,7]}}",
                 7, &keep);
    assert_int_equal(aft_st_count(f), 3);
    assert_non_null(aft_st_find(f, "a\xc3\xa9\"b\n"));
    assert_int_equal(aft_st_find(f, "")->nelem, 2);
    assert_non_null(aft_st_find(f, "\xe2\x9c\x93\xf0\x9f\x98\x80"));
    aft_st_close(f);
    free(keep);
    /* AFT_MAX_DIMS dimensions are fine */
    char h[512];
    char dims[128] = "";
    for (int i = 0; i < AFT_MAX_DIMS; i++) strcat(dims, i ? ",1" : "1");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[0,4]}}", dims);
    f = accepted(h, 4, &keep);
    assert_int_equal(aft_st_find(f, "w")->ndim, AFT_MAX_DIMS);
    aft_st_close(f);
    free(keep);
    /* key order inside an entry does not matter; large exact offsets do
     * not either, as long as they fit the data */
    f = accepted("{\"w\":{\"data_offsets\":[0,4],\"shape\":[4],\"dtype\":\"BOOL\"}}", 4, &keep);
    assert_int_equal(aft_st_find(f, "w")->dtype, AFT_BOOL);
    aft_st_close(f);
    free(keep);
}

/* ---------------------------------------------------------------- refusals: framing */

static void test_refuses_short(void **state)
{
    refused_raw((const unsigned char *)"", 0, "file is 0 bytes, too short for the 8-byte header size");
    refused_raw((const unsigned char *)"\x02\0\0\0\0\0\0", 7, "file is 7 bytes");
    aft_st_file *f = NULL;
    aft_error err = {{0}};
    assert_int_equal(aft_st_open_mem(NULL, 0, &f, &err), AFT_ERR_FORMAT);
    check_msg(&err, "too short");
}

static void test_refuses_header_size(void **state)
{
    unsigned char b[16] = {0};
    uint64_t n = 123456789012ULL;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    refused_raw(b, 16, "header size 123456789012 exceeds the limit of 100000000 bytes");
    memset(b, 0xff, 8);
    refused_raw(b, 16, "header size 18446744073709551615 exceeds the limit");
    n = 100000001;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    refused_raw(b, 16, "header size 100000001 exceeds the limit of 100000000 bytes");
    /* within the limit but past the end of the file */
    n = 100000000;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    refused_raw(b, 16, "header size 100000000 runs past the end of the file (16 bytes)");
    n = 9;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    refused_raw(b, 16, "header size 9 runs past the end of the file (16 bytes)");
}

static void test_refuses_bad_utf8(void **state)
{
    const char *bad[] = {
        "{\"\xff\":1}",                 /* never valid */
        "{\"\xc0\xaf\":1}",             /* overlong '/' */
        "{\"\xe0\x80\xaf\":1}",         /* overlong, 3 bytes */
        "{\"\xed\xa0\x80\":1}",         /* UTF-16 surrogate */
        "{\"\xf4\x90\x80\x80\":1}",     /* above U+10FFFF */
        "{\"\x80\":1}",                 /* stray continuation byte */
        "{\"a\":1}\xe2\x82",            /* cut off at the end */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(bad[i], 0, "header is not valid UTF-8");
    refused("{\"ab\xff\":1}", 0, "header is not valid UTF-8 (byte 4)");
}

static void test_refuses_bad_json(void **state)
{
    refused("", 0, "header is not valid JSON");
    refused("{", 0, "header is not valid JSON");
    refused("{\"w\":}", 0, "header is not valid JSON");
    refused("{} x", 0, "header is not valid JSON");
    refused("{}{}", 0, "header is not valid JSON");
    refused("{'w':1}", 0, "header is not valid JSON");
    refused("{\"w\":" W_F32_1 ",}", 4, "header is not valid JSON");
    refused("{\"abc", 0, "unterminated string starting at byte 1");
    refused("{\"abc\\", 0, "unterminated string");
    refused("{\"a\\x\":1}", 0, "invalid escape '\\x' at byte 3");
    refused("{\"a\\u12\":1}", 0, "\\u escape without 4 hex digits");
    refused("{\"a\\u12", 0, "\\u escape without 4 hex digits");
    refused("{\"a\\u0000b\":" W_F32_1 "}", 4, "\\u0000 escape at byte 3");
    refused("{\"a\tb\":" W_F32_1 "}", 4, "raw control character 0x09 inside a string at byte 3");
    refused_n("{}\0   ", 6, 0, "control character 0x00 at byte 2");
    static const char nul_after[] = "{\"w\":" W_F32_1 "}\0";
    refused_n(nul_after, sizeof nul_after - 1, 4, "control character 0x00");
    refused("{}\x01", 0, "control character 0x01 at byte 2");
    refused("[]", 0, "header is not a JSON object");
    refused("3", 0, "header is not a JSON object");
    refused("\"w\"", 0, "header is not a JSON object");
    refused("null", 0, "header is not a JSON object");
}

/* 100000 '[' (and other deep shapes) are refused by the lexer's depth limit
 * before any recursive parser sees them */
static void test_refuses_deep_nesting(void **state)
{
    size_t n = 100000;
    char *h = malloc(2 * n + 1);
    assert_non_null(h);
    memset(h, '[', n);
    h[n] = '\0';
    refused(h, 0, "header nests more than 64 levels deep");
    memset(h + n, ']', n);
    h[2 * n] = '\0';
    refused(h, 0, "nests more than 64 levels deep");
    /* objects inside a tensor entry */
    size_t len = 0;
    len += (size_t)sprintf(h, "{\"w\":");
    for (int i = 0; i < 1000; i++) len += (size_t)sprintf(h + len, "{\"a\":");
    refused(h, 0, "nests more than 64 levels deep (at byte");
    /* 64 deep is within the limit: then the ordinary checks speak */
    len = (size_t)sprintf(h, "{\"w\":");
    for (int i = 0; i < 63; i++) h[len++] = '[';
    for (int i = 0; i < 63; i++) h[len++] = ']';
    strcpy(h + len, "}");
    refused(h, 0, "tensor 'w' is not a JSON object");
    free(h);
}

/* ---------------------------------------------------------------- refusals: metadata */

static void test_refuses_bad_metadata(void **state)
{
    refused("{\"__metadata__\":\"x\"}", 0, "__metadata__ is not a JSON object");
    refused("{\"__metadata__\":[]}", 0, "__metadata__ is not a JSON object");
    refused("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value for key 'k' is not a string");
    refused("{\"__metadata__\":{\"a\":\"x\",\"k\":{}}}", 0, "__metadata__ value for key 'k' is not a string");
    refused("{\"__metadata__\":{\"k\":null}}", 0, "value for key 'k' is not a string");
    refused("{\"__metadata__\":{\"k\":[\"v\"]}}", 0, "value for key 'k' is not a string");
    refused("{\"__metadata__\":{\"k\":true}}", 0, "value for key 'k' is not a string");
    refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "header has '__metadata__' twice");
    refused("{\"__metadata__\":{\"k\":\"a\",\"j\":\"b\",\"k\":\"c\"}}", 0, "__metadata__ has key 'k' twice");
    /* the name is case-sensitive: this is a tensor, and not a valid one */
    refused("{\"__METADATA__\":{\"k\":\"v\"}}", 0, "tensor '__METADATA__' has an unknown key 'k'");
}

/* ---------------------------------------------------------------- refusals: tensor entries */

static void test_refuses_bad_entry_keys(void **state)
{
    refused("{\"w\":1}", 0, "tensor 'w' is not a JSON object");
    refused("{\"w\":[]}", 0, "tensor 'w' is not a JSON object");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
            "tensor 'w' has an unknown key 'x'");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"offsets\":[0,4]}}", 4,
            "unknown key 'offsets'");
    refused("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
            "tensor 'w' has key 'dtype' twice");
    refused("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w' has no 'dtype'");
    refused("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w' has no 'shape'");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w' has no 'data_offsets'");
    /* key names are case-sensitive */
    refused("{\"w\":{\"DTYPE\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown key 'DTYPE'");
}

static void test_refuses_bad_dtype(void **state)
{
    refused("{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': dtype is not a string");
    refused("{\"w\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not a string");
    refused("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
            "unknown dtype 'F8_E4M3' for tensor 'w'");
    refused("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'f32' for tensor 'w'");
    refused("{\"w\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype '' for tensor 'w'");
    /* an unknown dtype is refused, not skipped, even after valid tensors */
    refused("{\"a\":" W_F32_1 ",\"b\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[4,12]}}", 12,
            "unknown dtype 'C64' for tensor 'b'");
}

static void test_refuses_bad_shape(void **state)
{
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12, "tensor 'w': shape is not an array");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4, "shape is not an array");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
            "tensor 'w': shape entry 0 (-1) is not a non-negative integer");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,-3],\"data_offsets\":[0,4]}}", 4,
            "shape entry 1 (-3) is not a non-negative integer");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}", 2,
            "tensor 'w': shape entry 0 (2.5) is not a non-negative integer");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2,
            "tensor 'w': shape entry 0 is not a number");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[null],\"data_offsets\":[0,2]}}", 2, "shape entry 0 is not a number");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[[2]],\"data_offsets\":[0,2]}}", 2, "shape entry 0 is not a number");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[9007199254740992],\"data_offsets\":[0,2]}}", 2,
            "tensor 'w': shape entry 0 (9007199254740992) is 2^53 or more");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[9007199254740993],\"data_offsets\":[0,2]}}", 2, "is 2^53 or more");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[1e300],\"data_offsets\":[0,2]}}", 2, "is 2^53 or more");
    /* written as a number cJSON reads as an integer, but not a plain one */
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2,
            "header number '2.0' at byte 28 is not a plain non-negative integer");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[2e0],\"data_offsets\":[0,2]}}", 2, "header number '2e0'");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[02],\"data_offsets\":[0,2]}}", 2, "header number '02'");
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-0,2]}}", 2, "header number '-0'");
    /* more than AFT_MAX_DIMS */
    char h[512], dims[128] = "";
    for (int i = 0; i <= AFT_MAX_DIMS; i++) strcat(dims, i ? ",1" : "1");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[0,4]}}", dims);
    refused(h, 4, "tensor 'w': shape has 33 dimensions, more than the 32 supported");
}

/* Element and byte counts overflow size_t: an error, never a wrap (a
 * wrapped product could match a small range); and a huge but finite shape
 * is refused by the size check without allocating anything. */
static void test_refuses_size_overflow(void **state)
{
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
            "tensor 'w': shape [4294967296, 4294967296, 4294967296] has more elements than fit in size_t");
    /* 2^64 elements would wrap to exactly 0 */
    refused("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
            "has more elements than fit in size_t");
    /* 2^63 elements fit; 2^66 bytes do not */
    refused("{\"w\":{\"dtype\":\"F64\",\"shape\":[1073741824,1073741824,8],\"data_offsets\":[0,0]}}", 0,
            "tensor 'w': shape [1073741824, 1073741824, 8] of F64 needs more bytes than fit in size_t");
    /* 2^62 elements of 4 bytes = 2^64 would wrap to 0 too */
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,0]}}", 0,
            "needs more bytes than fit in size_t");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[100000000000],\"data_offsets\":[0,4]}}", 4,
            "tensor 'w': data_offsets [0, 4] hold 4 bytes but shape [100000000000] of F32 needs 400000000000");
}

static void test_refuses_bad_offsets(void **state)
{
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":4}}", 4,
            "tensor 'w': data_offsets is not a [begin, end] pair");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, "data_offsets is not a [begin, end] pair");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "data_offsets is not a [begin, end] pair");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, "data_offsets is not a [begin, end] pair");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
            "tensor 'w': data_offsets entry 0 (-4) is not a non-negative integer");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 4,
            "data_offsets entry 1 (4.5) is not a non-negative integer");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4,
            "tensor 'w': data_offsets entry 1 is not a number");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[9007199254740992,9007199254740996]}}", 4,
            "data_offsets entry 0 (9007199254740992) is 2^53 or more");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8,
            "tensor 'w': data_offsets [8, 4] end before they begin");
}

static void test_refuses_size_mismatch(void **state)
{
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 10,
            "tensor 'w': data_offsets [0, 10] hold 10 bytes but shape [2, 3] of F32 needs 24");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,8]}}", 8,
            "hold 8 bytes but shape [] of F32 needs 4");
    refused("{\"w\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,2]}}", 2,
            "hold 2 bytes but shape [0] of BF16 needs 0");
    /* a long shape is cut short in the message, which stays one line */
    char h[512], dims[256] = "";
    for (int i = 0; i < 32; i++) strcat(dims, i ? ",1000000" : "1");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[%s],\"data_offsets\":[0,1]}}", dims);
    refused(h, 1, "...]");
}

static void test_refuses_out_of_range(void **state)
{
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}", 16,
            "tensor 'w': data_offsets [0, 24] run past the end of the data buffer (16 bytes)");
    refused("{\"a\":" W_F32_1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 6,
            "tensor 'b': data_offsets [4, 8] run past the end of the data buffer (6 bytes)");
    /* an empty tensor placed beyond the data is out of range as well */
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[100,100]}}", 0,
            "tensor 'w': data_offsets [100, 100] run past the end of the data buffer (0 bytes)");
}

static void test_refuses_holes_and_overlaps(void **state)
{
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
            "tensor 'a' starts at 4 but the data buffer starts at 0 (hole)");
    refused("{\"a\":" W_F32_1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
            "tensor 'b' starts at 8 but the previous tensor 'a' ends at 4 (hole)");
    /* header order does not matter: the check runs in offset order */
    refused("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},\"a\":" W_F32_1 "}", 12,
            "tensor 'b' starts at 8 but the previous tensor 'a' ends at 4 (hole)");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
            "tensor 'b' starts at 4 but the previous tensor 'a' ends at 8 (overlap)");
    /* two names for the same bytes */
    refused("{\"a\":" W_F32_1 ",\"b\":" W_F32_1 "}", 4, "starts at 0 but the previous tensor 'a' ends at 4 (overlap)");
    /* an empty tensor inside another one */
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
            "tensor 'z' starts at 4 but the previous tensor 'a' ends at 8 (overlap)");
    refused("{\"a\":" W_F32_1 "}", 6, "data buffer holds 6 bytes but the tensors end at 4 (2 trailing bytes)");
    refused("{}", 4, "data buffer holds 4 bytes but the header lists no tensors");
    refused("{\"__metadata__\":{\"k\":\"v\"}}", 1, "header lists no tensors");
}

static void test_refuses_duplicate_names(void **state)
{
    refused("{\"w\":" W_F32_1 ",\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
            "tensor name 'w' appears twice");
    /* the same name spelled with an escape is still the same name */
    refused("{\"w\":" W_F32_1 ",\"\\u0077\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
            "tensor name 'w' appears twice");
    /* names differing only in case are different */
    unsigned char *keep;
    aft_st_file *f = accepted("{\"w\":" W_F32_1 ",\"W\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, &keep);
    assert_ptr_not_equal(aft_st_find(f, "w"), aft_st_find(f, "W"));
    aft_st_close(f);
    free(keep);
}

/* names in messages are shown safely: control characters as '?', long
 * names cut short, so the message stays one line */
static void test_error_names_are_one_line(void **state)
{
    refused("{\"a\\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor 'a?b'");
    char h[512], name[201];
    memset(name, 'x', 200);
    name[200] = '\0';
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", name);
    refused(h, 8, "xxx...'");
}

/* ---------------------------------------------------------------- writer */

/* the tensors of written_by_aft.safetensors (see check_written in
 * make_st_fixtures.py) */
typedef struct {
    unsigned char raw[N_FORMULA][24 * 8];
    uint16_t f16[24], bf16[24];
    float scalar;
    char names[N_FORMULA][8];
    const char *name_ptr[N_FORMULA + 4];
    aft_tensor t[N_FORMULA + 4];
    size_t n;
} golden_set;

static void shape3(aft_tensor *t, aft_dtype dt, const void *data)
{
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = 3;
    t->shape[0] = 2; t->shape[1] = 3; t->shape[2] = 4;
    t->nelem = 24;
    t->nbytes = 24 * aft_dtype_size(dt);
    t->data = data;
}

static void make_golden(golden_set *g)
{
    memset(g, 0, sizeof *g);
    size_t k = 0;
    for (; k < N_FORMULA; k++) {
        aft_dtype dt = formula_dtypes[k];
        size_t es = aft_dtype_size(dt);
        for (size_t i = 0; i < 24; i++) {
            unsigned char b[8];
            expect_bytes(dt, i, b);
            memcpy(g->raw[k] + i * es, b, es);
        }
        lower(g->names[k], aft_dtype_name(dt));
        g->name_ptr[k] = g->names[k];
        shape3(&g->t[k], dt, g->raw[k]);
    }
    for (size_t i = 0; i < 24; i++) {
        float v = expect_f32(AFT_F32, i);
        g->f16[i] = aft_f32_to_f16(v);
        g->bf16[i] = aft_f32_to_bf16(v);
    }
    g->name_ptr[k] = "f16";
    shape3(&g->t[k++], AFT_F16, g->f16);
    g->name_ptr[k] = "bf16";
    shape3(&g->t[k++], AFT_BF16, g->bf16);
    g->scalar = 3.5f;
    g->name_ptr[k] = "scalar";
    g->t[k] = (aft_tensor){.dtype = AFT_F32, .ndim = 0, .nelem = 1, .nbytes = 4, .data = &g->scalar};
    k++;
    g->name_ptr[k] = "empty";
    g->t[k] = (aft_tensor){.dtype = AFT_I32, .ndim = 2, .shape = {0, 3}, .nelem = 0, .nbytes = 0, .data = NULL};
    k++;
    g->n = k;
}

static const char *const golden_meta[] = {"writer", "aft", "note", "tab\there \"q\" \xc3\xa9"};

static void same_tensor(const aft_tensor *a, const aft_tensor *b)
{
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    for (size_t d = 0; d < a->ndim; d++) assert_int_equal(a->shape[d], b->shape[d]);
    assert_int_equal(a->nelem, b->nelem);
    assert_int_equal(a->nbytes, b->nbytes);
    if (a->nbytes) assert_memory_equal(a->data, b->data, a->nbytes);
}

static void test_write_round_trip(void **state)
{
    golden_set *g = malloc(sizeof *g);
    assert_non_null(g);
    make_golden(g);
    const char *path = files_tmp("rt.safetensors");
    aft_error err = {{0}};
    if (aft_st_write(path, g->name_ptr, g->t, g->n, golden_meta, 2, &err) != AFT_OK)
        fail_msg("write: %s", err.msg);

    aft_st_file *f = open_ok(path);
    assert_int_equal(aft_st_count(f), g->n);
    for (size_t i = 0; i < g->n; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        assert_string_equal(name, g->name_ptr[i]);   /* laid out in the order given */
        same_tensor(t, &g->t[i]);
    }
    assert_int_equal(aft_st_metadata_count(f), 2);
    for (size_t i = 0; i < 2; i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        assert_string_equal(k, golden_meta[2 * i]);
        assert_string_equal(v, golden_meta[2 * i + 1]);
    }
    /* the values read back through the conversions are the formulas */
    for (size_t k = 0; k < N_FORMULA; k++)
        check_formula_tensor(aft_st_find(f, g->names[k]), formula_dtypes[k]);
    aft_st_close(f);

    /* the header is padded so the data starts at a multiple of 8, and
     * __metadata__ comes first */
    size_t len;
    unsigned char *b = files_slurp(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    assert_int_equal((8 + n) % 8, 0);
    assert_true(n >= 16 && memcmp(b + 8, "{\"__metadata__\":{", 17) == 0);
    assert_true(b[8 + n - 1] == ' ' || b[8 + n - 1] == '}');

    /* the committed file written earlier by this writer, which the
     * generator's independent Python reader checked, has the same bytes */
    const char *gpath = fixture("written_by_aft.safetensors");
    const char *regen = getenv("AFT_ST_WRITE_GOLDEN");
    if (regen && *regen) {
        assert_int_equal(aft_st_write(gpath, g->name_ptr, g->t, g->n, golden_meta, 2, &err), AFT_OK);
    } else {
        size_t glen;
        unsigned char *gb = files_slurp(gpath, &glen);
        assert_int_equal(glen, len);
        assert_memory_equal(gb, b, len);
        free(gb);
    }
    free(b);
    unlink(path);
    free(g);
}

/* names and metadata with quotes, backslashes and control characters are
 * escaped and come back exactly; zero-size tensors keep their place */
static void test_write_escapes_and_order(void **state)
{
    static const uint8_t bytes[] = {1, 2, 3};
    static const float fl[2] = {1.0f, 2.0f};
    const char *names[] = {"z\"q\\", "ctl\x01\x1f\n\t", "", "\xe2\x9c\x93", "b"};
    aft_tensor t[5] = {
        {.dtype = AFT_U8, .ndim = 1, .shape = {3}, .nelem = 3, .nbytes = 3, .data = bytes},
        {.dtype = AFT_F32, .ndim = 1, .shape = {0}, .nelem = 0, .nbytes = 0},
        {.dtype = AFT_F32, .ndim = 1, .shape = {2}, .nelem = 2, .nbytes = 8, .data = fl},
        {.dtype = AFT_I64, .ndim = 2, .shape = {2, 0}, .nelem = 0, .nbytes = 0},
        {.dtype = AFT_U8, .ndim = 0, .nelem = 1, .nbytes = 1, .data = bytes},
    };
    const char *meta[] = {"k\"\\\x02", "v\n\r\x7f"};
    const char *path = files_tmp("esc.safetensors");
    aft_error err = {{0}};
    if (aft_st_write(path, names, t, 5, meta, 1, &err) != AFT_OK) fail_msg("write: %s", err.msg);
    aft_st_file *f = open_ok(path);
    assert_int_equal(aft_st_count(f), 5);
    for (size_t i = 0; i < 5; i++) {
        const char *name;
        const aft_tensor *r = aft_st_get(f, i, &name);
        assert_string_equal(name, names[i]);
        same_tensor(r, &t[i]);
    }
    const char *k, *v;
    aft_st_metadata(f, 0, &k, &v);
    assert_string_equal(k, meta[0]);
    assert_string_equal(v, meta[1]);
    aft_st_close(f);
    unlink(path);

    /* nothing at all: "{}" plus padding, and it reads back */
    if (aft_st_write(path, NULL, NULL, 0, NULL, 0, &err) != AFT_OK) fail_msg("write: %s", err.msg);
    size_t len;
    unsigned char *b = files_slurp(path, &len);
    assert_int_equal(len, 16);
    assert_memory_equal(b + 8, "{}      ", 8);
    free(b);
    f = open_ok(path);
    assert_int_equal(aft_st_count(f), 0);
    aft_st_close(f);
    unlink(path);
}

/* "-" writes standard output */
static void test_write_stdout(void **state)
{
    static const int32_t v[3] = {7, -8, 9};
    aft_tensor t = {.dtype = AFT_I32, .ndim = 1, .shape = {3}, .nelem = 3, .nbytes = 12, .data = v};
    const char *name = "v";
    const char *path = files_tmp("stdout.safetensors");
    fflush(stdout);
    int saved = dup(1);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 1);
    close(fd);
    aft_error err = {{0}};
    aft_status st = aft_st_write("-", &name, &t, 1, NULL, 0, &err);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    if (st != AFT_OK) fail_msg("write: %s", err.msg);
    aft_st_file *f = open_ok(path);
    same_tensor(aft_st_find(f, "v"), &t);
    aft_st_close(f);
    unlink(path);
}

static void write_refused(const char *const *names, const aft_tensor *t, size_t n,
                          const char *const *meta, size_t nmeta, aft_status want, const char *needle)
{
    const char *path = files_tmp("refused.safetensors");
    aft_error err = {{0}};
    aft_status st = aft_st_write(path, names, t, n, meta, nmeta, &err);
    if (st == AFT_OK) fail_msg("write accepted, expected \"%s\"", needle);
    assert_int_equal(st, want);
    check_msg(&err, needle);
    struct stat sb;
    assert_int_not_equal(stat(path, &sb), 0);   /* nothing left behind */
}

static void test_write_refusals(void **state)
{
    static const float fl[4] = {0};
    aft_tensor t = {.dtype = AFT_F32, .ndim = 1, .shape = {4}, .nelem = 4, .nbytes = 16, .data = fl};
    aft_tensor two[2] = {t, t};
    const char *dup[] = {"w", "w"};
    write_refused(dup, two, 2, NULL, 0, AFT_ERR_ARG, "tensor name 'w' is given twice");
    const char *reserved[] = {"__metadata__"};
    write_refused(reserved, &t, 1, NULL, 0, AFT_ERR_ARG, "'__metadata__' is reserved");
    const char *ok[] = {"w"};
    const char *dmeta[] = {"k", "a", "j", "b", "k", "c"};
    write_refused(ok, &t, 1, dmeta, 3, AFT_ERR_ARG, "metadata key 'k' is given twice");
    const char *badname[] = {"a\xff"};
    write_refused(badname, &t, 1, NULL, 0, AFT_ERR_ARG, "tensor name 'a?' is not valid UTF-8");
    const char *badmeta[] = {"k", "\xc0\xaf"};
    write_refused(ok, &t, 1, badmeta, 1, AFT_ERR_ARG, "metadata value");
    const char *nullmeta[] = {"k", NULL};
    write_refused(ok, &t, 1, nullmeta, 1, AFT_ERR_ARG, "metadata value 0 is missing");
    const char *noname[] = {NULL};
    write_refused(noname, &t, 1, NULL, 0, AFT_ERR_ARG, "tensor 0 has no name");

    aft_tensor bad = t;
    bad.nbytes = 12;
    write_refused(ok, &bad, 1, NULL, 0, AFT_ERR_ARG,
                  "tensor 'w' says 4 elements in 12 bytes but shape [4] of F32 means 4 in 16");
    bad = t;
    bad.nelem = 5;
    write_refused(ok, &bad, 1, NULL, 0, AFT_ERR_ARG, "says 5 elements");
    bad = t;
    bad.data = NULL;
    write_refused(ok, &bad, 1, NULL, 0, AFT_ERR_ARG, "tensor 'w' has no data");
    bad = t;
    bad.dtype = AFT_DTYPE_COUNT;
    write_refused(ok, &bad, 1, NULL, 0, AFT_ERR_ARG, "invalid dtype");
    bad = t;
    bad.ndim = AFT_MAX_DIMS + 1;
    write_refused(ok, &bad, 1, NULL, 0, AFT_ERR_ARG, "has 33 dimensions");
    bad = t;
    bad.shape[0] = (size_t)1 << 53;   /* the reader would refuse it */
    write_refused(ok, &bad, 1, NULL, 0, AFT_ERR_ARG, "is too large");

    /* a directory that does not exist: an I/O error from the atomic output */
    aft_error err = {{0}};
    assert_int_equal(aft_st_write(files_tmp("no/such/dir.safetensors"), ok, &t, 1, NULL, 0, &err), AFT_ERR_IO);
    check_msg(&err, "cannot create");
}

/* ---------------------------------------------------------------- main */

static int setup(void **state)
{
    return files_tmpdir_make("/tmp/aft_st_test.XXXXXX");
}

static int teardown(void **state)
{
    return rmdir(files_tmpdir());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes_fixture),
        cmocka_unit_test(test_halfs_fixture),
        cmocka_unit_test(test_metadata_fixture),
        cmocka_unit_test(test_zero_size_fixture),
        cmocka_unit_test(test_only_zero_size_fixture),
        cmocka_unit_test(test_scalars_fixture),
        cmocka_unit_test(test_many_fixture),
        cmocka_unit_test(test_unaligned_fixture),
        cmocka_unit_test(test_open_mem_matches_file),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_pipe_path),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_accessors_out_of_range),
        cmocka_unit_test(test_accepts_padding_and_names),
        cmocka_unit_test(test_refuses_short),
        cmocka_unit_test(test_refuses_header_size),
        cmocka_unit_test(test_refuses_bad_utf8),
        cmocka_unit_test(test_refuses_bad_json),
        cmocka_unit_test(test_refuses_deep_nesting),
        cmocka_unit_test(test_refuses_bad_metadata),
        cmocka_unit_test(test_refuses_bad_entry_keys),
        cmocka_unit_test(test_refuses_bad_dtype),
        cmocka_unit_test(test_refuses_bad_shape),
        cmocka_unit_test(test_refuses_size_overflow),
        cmocka_unit_test(test_refuses_bad_offsets),
        cmocka_unit_test(test_refuses_size_mismatch),
        cmocka_unit_test(test_refuses_out_of_range),
        cmocka_unit_test(test_refuses_holes_and_overlaps),
        cmocka_unit_test(test_refuses_duplicate_names),
        cmocka_unit_test(test_error_names_are_one_line),
        cmocka_unit_test(test_write_round_trip),
        cmocka_unit_test(test_write_escapes_and_order),
        cmocka_unit_test(test_write_stdout),
        cmocka_unit_test(test_write_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
