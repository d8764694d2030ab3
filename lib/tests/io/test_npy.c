/* test_npy.c - the .npy reader and writer against files numpy wrote
 * (testdata/npy, made by testdata/make_npy_fixtures.py) and against
 * malformed images built here byte by byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aft.h"
#include "files.h"
#include "formula.h"

/* ---------------------------------------------------------------- helpers */

/* a fixture of testdata/npy (files.h: four can be live) */
static const char *fixture(const char *name)
{
    return files_fixture("npy", name);
}

/* a malloc'd copy of n bytes (strdup would stop at the first NUL) */
static unsigned char *memdup(const char *s, size_t n)
{
    unsigned char *b = malloc(n + 1);
    assert_non_null(b);
    memcpy(b, s, n);
    return b;
}

/* a string literal's bytes without its final NUL, as (buffer, length) */
#define MEM(lit) memdup(lit, sizeof(lit) - 1), sizeof(lit) - 1

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* how many entries of the temporary directory start with prefix: finds a
 * leftover target or temporary ("x.npy.tmp.XXXXXX") of a failed write */
static int count_files_like(const char *prefix)
{
    DIR *d = opendir(files_tmpdir());
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

static int setup(void **state)
{
    return files_tmpdir_make("/tmp/aft_test_npy.XXXXXX");
}

static int teardown(void **state)
{
    return files_tmpdir_remove();
}

/* The numpy dtype codes of the fixtures, their aft_dtype and item size.
 * Written out here rather than taken from npy.c, so the mapping is tested. */
static const struct { const char *code; aft_dtype dt; size_t size; } codes[] = {
    {"f2", AFT_F16, 2}, {"f4", AFT_F32, 4}, {"f8", AFT_F64, 8}, {"b1", AFT_BOOL, 1},
    {"u1", AFT_U8, 1},  {"i1", AFT_I8, 1},  {"i2", AFT_I16, 2}, {"u2", AFT_U16, 2},
    {"i4", AFT_I32, 4}, {"u4", AFT_U32, 4}, {"i8", AFT_I64, 8}, {"u8", AFT_U64, 8},
};
#define NCODES (sizeof codes / sizeof codes[0])

/* t must hold the values make_npy_fixtures.py stores (formula.h);
 * reports the first differing element */
static void check_formula(const aft_tensor *t, const char *what)
{
    assert_int_equal(t->nbytes, t->nelem * aft_dtype_size(t->dtype));
    size_t bad = formula_differs(t);
    if (bad) fail_msg("%s: element %zu differs from the formula", what, bad - 1);
}

static void check_shape(const aft_tensor *t, size_t ndim, const size_t *shape)
{
    assert_int_equal(t->ndim, ndim);
    size_t n = 1;
    for (size_t k = 0; k < ndim; k++) {
        assert_int_equal(t->shape[k], shape[k]);
        n *= shape[k];
    }
    assert_int_equal(t->nelem, n);
    assert_int_equal(t->nbytes, n * aft_dtype_size(t->dtype));
    assert_non_null(t->data);
    assert_ptr_equal(t->data, t->owned);
}

/* A .npy image: preamble for version major.minor with the given header
 * length field (2 bytes for 1.x and unknown versions, 4 for 2.x and 3.x),
 * then hdr_len header bytes verbatim, then data_len bytes of data. */
static unsigned char *build(int major, int minor, size_t len_field, const char *hdr, size_t hdr_len,
                            const void *data, size_t data_len, size_t *len)
{
    size_t lb = (major == 2 || major == 3) ? 4 : 2;
    *len = 8 + lb + hdr_len + data_len;
    unsigned char *b = calloc(*len + 1, 1);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = (unsigned char)minor;
    for (size_t i = 0; i < lb; i++) b[8 + i] = (unsigned char)(len_field >> (8 * i));
    memcpy(b + 8 + lb, hdr, hdr_len);
    if (data) memcpy(b + 8 + lb + hdr_len, data, data_len);
    return b;
}

/* A version 1.0 image whose header is dict padded with spaces and a '\n' to
 * a 64-byte boundary, as numpy writes, followed by data_len zero bytes. */
static unsigned char *build_dict(const char *dict, size_t data_len, size_t *len)
{
    char hdr[12000];
    size_t n = strlen(dict);
    size_t pad = (64 - (10 + n + 1) % 64) % 64;
    assert_true(n + pad + 1 < sizeof hdr);
    memcpy(hdr, dict, n);
    memset(hdr + n, ' ', pad);
    hdr[n + pad] = '\n';
    return build(1, 0, n + pad + 1, hdr, n + pad + 1, NULL, data_len, len);
}

/* The image must be refused as a format error whose one-line message
 * contains want; the output tensor must be left empty. Frees buf. */
static void refused(unsigned char *buf, size_t len, const char *want)
{
    aft_tensor t;
    aft_npy_info info;
    aft_error err = {{0}};
    memset(&t, 0x5a, sizeof t);
    aft_status st = aft_npy_read_mem(buf, len, &t, &info, &err);
    free(buf);
    if (st == AFT_OK) aft_tensor_free(&t);
    if (st != AFT_ERR_FORMAT || !strstr(err.msg, want))
        fail_msg("want AFT_ERR_FORMAT with \"%s\", got status %d: \"%s\"", want, (int)st, err.msg);
    assert_null(strchr(err.msg, '\n'));
    assert_null(t.data);
    assert_null(t.owned);
    assert_int_equal(t.nbytes, 0);
}

static void refused_dict(const char *dict, size_t data_len, const char *want)
{
    size_t len;
    unsigned char *b = build_dict(dict, data_len, &len);
    refused(b, len, want);
}

static void refused_file(const char *name, const char *want)
{
    aft_tensor t;
    aft_error err = {{0}};
    aft_status st = aft_npy_read(fixture(name), &t, NULL, &err);
    if (st == AFT_OK) aft_tensor_free(&t);
    if (st != AFT_ERR_FORMAT || !strstr(err.msg, want))
        fail_msg("%s: want AFT_ERR_FORMAT with \"%s\", got status %d: \"%s\"", name, want, (int)st,
                 err.msg);
    assert_null(t.data);
}

/* reads buf as .npy, failing the test on any error */
static void accept_mem(const unsigned char *buf, size_t len, aft_tensor *t, aft_npy_info *info)
{
    aft_error err = {{0}};
    aft_status st = aft_npy_read_mem(buf, len, t, info, &err);
    if (st) fail_msg("refused (%d): %s", (int)st, err.msg);
}

static void accept_file(const char *name, aft_tensor *t, aft_npy_info *info)
{
    aft_error err = {{0}};
    aft_status st = aft_npy_read(fixture(name), t, info, &err);
    if (st) fail_msg("%s refused (%d): %s", name, (int)st, err.msg);
}

/* ---------------------------------------------------------------- numpy's files */

/* Every version x C/Fortran x byte order x dtype, shape (2, 3, 4). */
static void test_fixture_matrix(void **state)
{
    static const size_t shape[3] = {2, 3, 4};
    int files = 0;
    for (int ver = 1; ver <= 3; ver++)
        for (int fortran = 0; fortran <= 1; fortran++)
            for (size_t c = 0; c < NCODES; c++)
                for (int be = 0; be <= 1; be++) {
                    if (codes[c].size == 1 && be) continue;
                    const char *bo = codes[c].size == 1 ? "any" : be ? "be" : "le";
                    char name[64];
                    snprintf(name, sizeof name, "v%d_%s_%s_%s.npy", ver, fortran ? "F" : "C", bo,
                             codes[c].code);
                    aft_tensor t;
                    aft_npy_info info;
                    accept_file(name, &t, &info);
                    assert_int_equal(t.dtype, codes[c].dt);
                    check_shape(&t, 3, shape);
                    check_formula(&t, name);

                    char order = codes[c].size == 1 ? '|' : be ? '>' : '<';
                    char descr[8];
                    snprintf(descr, sizeof descr, "%c%s", order, codes[c].code);
                    assert_int_equal(info.major, ver);
                    assert_int_equal(info.minor, 0);
                    assert_int_equal(info.byteorder, order);
                    assert_int_equal(info.fortran_order, fortran);
                    assert_string_equal(info.descr, descr);
                    assert_int_equal(info.data_offset % 64, 0);
                    assert_int_equal(info.header_len + (ver == 1 ? 10 : 12), info.data_offset);
                    aft_tensor_free(&t);
                    files++;
                }
    assert_int_equal(files, 3 * 2 * (9 * 2 + 3));
}

static void test_scalars(void **state)
{
    for (size_t c = 0; c < NCODES; c++) {
        char name[64];
        snprintf(name, sizeof name, "scalar_%s.npy", codes[c].code);
        aft_tensor t;
        accept_file(name, &t, NULL);
        assert_int_equal(t.dtype, codes[c].dt);
        check_shape(&t, 0, NULL);
        assert_int_equal(t.nelem, 1);
        check_formula(&t, name);
        aft_tensor_free(&t);
    }
    aft_tensor t;
    accept_file("scalar_be_f8.npy", &t, NULL);
    assert_int_equal(t.dtype, AFT_F64);
    check_shape(&t, 0, NULL);
    assert_true(*(const double *)t.data == -3.0);
    aft_tensor_free(&t);
}

static void test_zero_size(void **state)
{
    static const struct { const char *name; aft_dtype dt; size_t ndim; size_t shape[3]; int f; } cases[] = {
        {"empty_0x3.npy", AFT_F32, 2, {0, 3}, 0},
        {"empty_0x3_F.npy", AFT_F32, 2, {0, 3}, 1},
        {"empty_3x0_be_i2.npy", AFT_I16, 2, {3, 0}, 0},
        {"empty_2x0x4_u8.npy", AFT_U64, 3, {2, 0, 4}, 0},
        {"empty_0_f8.npy", AFT_F64, 1, {0}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        aft_tensor t;
        aft_npy_info info;
        accept_file(cases[i].name, &t, &info);
        assert_int_equal(t.dtype, cases[i].dt);
        check_shape(&t, cases[i].ndim, cases[i].shape);
        assert_int_equal(t.nelem, 0);
        assert_int_equal(info.fortran_order, cases[i].f);
        aft_tensor_free(&t);
    }
}

static void test_other_shapes(void **state)
{
    aft_tensor t;
    aft_npy_info info;

    accept_file("vec5_f8.npy", &t, NULL);
    check_shape(&t, 1, (size_t[]){5});
    check_formula(&t, "vec5_f8");
    aft_tensor_free(&t);

    /* a 1-D array marked Fortran order is the same bytes */
    accept_file("vec5_F_i4.npy", &t, &info);
    assert_int_equal(info.fortran_order, 1);
    check_shape(&t, 1, (size_t[]){5});
    check_formula(&t, "vec5_F_i4");
    aft_tensor_free(&t);

    accept_file("mat3x5_F_be_i2.npy", &t, &info);
    assert_int_equal(info.byteorder, '>');
    assert_int_equal(info.fortran_order, 1);
    check_shape(&t, 2, (size_t[]){3, 5});
    check_formula(&t, "mat3x5_F_be_i2");
    aft_tensor_free(&t);

    accept_file("t2x1x3x2_F_f4.npy", &t, NULL);
    check_shape(&t, 4, (size_t[]){2, 1, 3, 2});
    check_formula(&t, "t2x1x3x2_F_f4");
    aft_tensor_free(&t);

    /* 32 dimensions, the most numpy and aft allow */
    size_t s32[32];
    for (int k = 0; k < 30; k++) s32[k] = 1;
    s32[30] = 2;
    s32[31] = 3;
    accept_file("dims32_u1.npy", &t, NULL);
    check_shape(&t, 32, s32);
    check_formula(&t, "dims32_u1");
    aft_tensor_free(&t);
}

/* '=' (native, read as little-endian) and '<' / '>' on 1-byte types */
static void test_byteorder_chars(void **state)
{
    static const struct { const char *name; aft_dtype dt; char bo; } cases[] = {
        {"eq_i4.npy", AFT_I32, '='}, {"eq_b1.npy", AFT_BOOL, '='},
        {"lt_u1.npy", AFT_U8, '<'},  {"gt_i1.npy", AFT_I8, '>'},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        aft_tensor t;
        aft_npy_info info;
        accept_file(cases[i].name, &t, &info);
        assert_int_equal(t.dtype, cases[i].dt);
        assert_int_equal(info.byteorder, cases[i].bo);
        check_shape(&t, 1, (size_t[]){6});
        check_formula(&t, cases[i].name);
        aft_tensor_free(&t);
    }
}

/* ---------------------------------------------------------------- header syntax we accept */

static void test_header_variants(void **state)
{
    static const char *dicts[] = {
        "{\"descr\": \"<i2\", \"fortran_order\": False, \"shape\": (2, 3)}",
        "{'shape': (2, 3), 'fortran_order': False, 'descr': '<i2'}",
        "{'fortran_order': False, 'descr': '<i2', 'shape': (2, 3,), }",
        "  { 'descr' : '<i2' ,\n\t'fortran_order':False,'shape':( 2 , 3 ) , }",
        "{'descr': \"<i2\", 'fortran_order': False, 'shape': (2, 3), }\n\n  \n",
    };
    int16_t data[6];
    formula_fill(AFT_I16, data, 6);
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        size_t len;
        unsigned char *b = build_dict(dicts[i], 0, &len);
        unsigned char *full = malloc(len + sizeof data);
        memcpy(full, b, len);
        memcpy(full + len, data, sizeof data);
        free(b);
        aft_tensor t;
        accept_mem(full, len + sizeof data, &t, NULL);
        free(full);   /* the reader copied it */
        assert_int_equal(t.dtype, AFT_I16);
        check_shape(&t, 2, (size_t[]){2, 3});
        check_formula(&t, dicts[i]);
        aft_tensor_free(&t);
    }
}

/* a header not padded to 64 bytes is still valid; so is a 2.0 header in memory */
static void test_header_unaligned_and_v2(void **state)
{
    const char *h = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }\n";
    uint16_t data[3] = {1, 2, 65535};
    size_t len;
    for (int major = 1; major <= 3; major++) {
        unsigned char *b = build(major, 0, strlen(h), h, strlen(h), data, sizeof data, &len);
        aft_tensor t;
        aft_npy_info info;
        accept_mem(b, len, &t, &info);
        free(b);
        assert_int_equal(info.major, major);
        assert_int_equal(info.header_len, strlen(h));
        assert_int_equal(info.data_offset, (major == 1 ? 10 : 12) + strlen(h));
        check_shape(&t, 1, (size_t[]){3});
        assert_memory_equal(t.data, data, sizeof data);
        aft_tensor_free(&t);
    }
}

/* numpy's limit is 10000 bytes of header: exactly 10000 is fine */
static void test_header_at_limit(void **state)
{
    static char hdr[10000];
    const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
    memset(hdr, ' ', sizeof hdr);
    memcpy(hdr, d, strlen(d));
    hdr[sizeof hdr - 1] = '\n';
    float one = 1.0f;
    size_t len;
    unsigned char *b = build(1, 0, sizeof hdr, hdr, sizeof hdr, &one, 4, &len);
    aft_tensor t;
    aft_npy_info info;
    accept_mem(b, len, &t, &info);
    free(b);
    assert_int_equal(info.header_len, 10000);
    assert_true(*(const float *)t.data == 1.0f);
    aft_tensor_free(&t);

    /* one byte more is refused */
    static char big[10001];
    memset(big, ' ', sizeof big);
    memcpy(big, d, strlen(d));
    big[sizeof big - 1] = '\n';
    b = build(2, 0, sizeof big, big, sizeof big, &one, 4, &len);
    refused(b, len, "header of 10001 bytes is over the 10000-byte limit");
}

/* Fortran order built by hand: column-major 0..5 for shape (2, 3) is the
 * C-order matrix [[0, 2, 4], [1, 3, 5]]; big-endian too. */
static void test_fortran_by_hand(void **state)
{
    const unsigned char col_major_be[12] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5};
    size_t len;
    unsigned char *b = build_dict("{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3), }", 0, &len);
    unsigned char *full = malloc(len + 12);
    memcpy(full, b, len);
    memcpy(full + len, col_major_be, 12);
    free(b);
    aft_tensor t;
    accept_mem(full, len + 12, &t, NULL);
    free(full);
    const int16_t want[6] = {0, 2, 4, 1, 3, 5};
    check_shape(&t, 2, (size_t[]){2, 3});
    assert_memory_equal(t.data, want, sizeof want);
    aft_tensor_free(&t);
}

/* "-" reads standard input: a regular file, then a pipe bigger than the
 * reader's first buffer so it has to grow */
static void test_stdin(void **state)
{
    assert_non_null(freopen(fixture("v1_F_be_f8.npy"), "rb", stdin));
    aft_tensor t;
    aft_error err = {{0}};
    assert_int_equal(aft_npy_read("-", &t, NULL, &err), AFT_OK);
    check_shape(&t, 3, (size_t[]){2, 3, 4});
    check_formula(&t, "stdin");
    aft_tensor_free(&t);

    /* 300000 bytes of u2 through a pipe */
    size_t n = 150000;
    uint16_t *v = malloc(n * 2);
    for (size_t i = 0; i < n; i++) v[i] = (uint16_t)(i * 7);
    aft_tensor src = {.dtype = AFT_U16, .ndim = 1, .shape = {n}, .nelem = n, .nbytes = n * 2, .data = v};
    assert_int_equal(aft_npy_write(files_tmp("pipe.npy"), &src, &err), AFT_OK);
    size_t flen;
    unsigned char *file = files_slurp(files_tmp("pipe.npy"), &flen);
    unlink(files_tmp("pipe.npy"));

    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {   /* the child feeds the pipe and leaves */
        close(pfd[0]);
        size_t off = 0;
        while (off < flen) {
            ssize_t w = write(pfd[1], file + off, flen - off);
            if (w <= 0) _exit(1);
            off += (size_t)w;
        }
        _exit(0);
    }
    close(pfd[1]);
    assert_int_equal(dup2(pfd[0], fileno(stdin)), fileno(stdin));
    close(pfd[0]);
    clearerr(stdin);
    aft_status st = aft_npy_read("-", &t, NULL, &err);
    int status;
    waitpid(pid, &status, 0);
    if (st) fail_msg("%s", err.msg);
    check_shape(&t, 1, (size_t[]){n});
    assert_memory_equal(t.data, v, n * 2);
    aft_tensor_free(&t);
    free(file);
    free(v);
}

/* ---------------------------------------------------------------- refusals */

static void test_bad_magic(void **state)
{
    refused(MEM("hello, world: not numpy"), "bad magic: not a .npy file");
    refused(MEM("PK\x03\x04 a zip, say an .npz"), "not a .npy file: this is a .npz archive (a zip of .npy files)");
    refused(MEM("PK\x05\x06 an empty zip"), "this is a .npz archive");
    refused(MEM("\x0e\0\0\0\0\0\0\0{\"a\":{}}    "), "not a .npy file: this is a .safetensors file");
    refused(MEM("\x93NUMPZ\x01\x00\x10\x00"), "bad magic");
    refused(MEM(""), "bad magic");
    refused(MEM("\x93NU"), "file ends inside the .npy preamble");
    refused(MEM("\x93NUMPY\x01"), "file ends inside the .npy preamble");
    refused(MEM("\x93NUMPY\x01\x00\x10"), "file ends inside the .npy preamble");
    refused(MEM("\x93NUMPY\x02\x00\x10\x00"), "file ends inside the .npy preamble");

    /* an empty file on disk */
    FILE *f = fopen(files_tmp("empty.npy"), "wb");
    fclose(f);
    aft_tensor t;
    aft_error err = {{0}};
    assert_int_equal(aft_npy_read(files_tmp("empty.npy"), &t, NULL, &err), AFT_ERR_FORMAT);
    assert_string_equal(err.msg, "bad magic: not a .npy file");
    unlink(files_tmp("empty.npy"));
}

static void test_bad_version(void **state)
{
    const char *h = "{'descr': '<u1', 'fortran_order': False, 'shape': (1,), }\n";
    static const int versions[][2] = {{0, 0}, {1, 1}, {4, 0}, {255, 255}, {2, 1}};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        size_t len;
        char want[64];
        unsigned char *b = build(versions[i][0], versions[i][1], strlen(h), h, strlen(h), "x", 1, &len);
        snprintf(want, sizeof want, "unknown .npy version %d.%d", versions[i][0], versions[i][1]);
        refused(b, len, want);
    }
    refused_file("bad_version.npy", "unknown .npy version 4.0");
}

static void test_header_too_long_or_past_eof(void **state)
{
    size_t len;
    /* length field over the limit, bytes present or not */
    unsigned char *b = build(1, 0, 10001, "{", 1, NULL, 10000, &len);
    refused(b, len, "header of 10001 bytes is over the 10000-byte limit");
    b = build(2, 0, 0xffffffffu, "{", 1, NULL, 0, &len);
    refused(b, len, "header of 4294967295 bytes is over the 10000-byte limit");
    b = build(3, 0, 65535, "{", 1, NULL, 0, &len);
    refused(b, len, "over the 10000-byte limit");

    /* within the limit but longer than the file */
    const char *h = "{'descr': '<u1', 'fortran_order': False, 'shape': (1,), }\n";
    b = build(1, 0, 200, h, strlen(h), NULL, 0, &len);
    refused(b, len, "header extends past the end of the file: needs 210 bytes, file holds 68");
    b = build(3, 0, strlen(h) + 1, h, strlen(h), NULL, 0, &len);
    refused(b, len, "header extends past the end of the file");
}

/* numpy pads with spaces and a '\n', but does not insist on the '\n' */
static void test_header_no_newline(void **state)
{
    const char *h = "{'descr': '<u1', 'fortran_order': False, 'shape': (1,), }  ";
    size_t len;
    unsigned char *b = build(1, 0, strlen(h), h, strlen(h), "x", 1, &len);
    aft_tensor t;
    accept_mem(b, len, &t, NULL);
    free(b);
    check_shape(&t, 1, (size_t[]){1});
    assert_int_equal(((const unsigned char *)t.data)[0], 'x');
    aft_tensor_free(&t);
    b = build(1, 0, 0, "", 0, NULL, 0, &len);
    refused(b, len, "expected '{' (the header must be a dict)");
}

/* anything but exactly the dict of three keys */
static void test_header_not_the_dict(void **state)
{
    static const struct { const char *dict, *want; } cases[] = {
        {"[1, 2, 3]", "expected '{' (the header must be a dict)"},
        {"", "expected '{'"},
        {"{}", "missing key 'descr'"},
        {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
        {"{'descr': '<f4', 'shape': (2,)}", "missing key 'fortran_order'"},
        {"{'fortran_order': False, 'shape': (2,)}", "missing key 'descr'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'foo': 1}", "unexpected key 'foo' in .npy header"},
        {"{'Descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "unexpected key 'Descr'"},
        /* adjacent strings join: the key is 'descr<f4' */
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "unexpected key 'descr<f4'"},
        {"{'descr' 5, 'fortran_order': False, 'shape': (2,)}", "expected ':' after a key"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}' after a value"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "unexpected text after the dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}{}", "unexpected text after the dict"},
        {"{'descr': \"<f4', 'fortran_order': False, 'shape': (2,)}", "unterminated string"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", "expected a quoted string"},
        {"{b'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "expected a quoted string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,),,}", "expected a quoted string"},
        {"{'descr': '<f4'", "expected ',' or '}' after a value"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", "'fortran_order' must be True or False"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "'fortran_order' must be True or False"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", "'fortran_order' must be True or False"},
        {"{'descr': 5, 'fortran_order': False, 'shape': (2,)}", "'descr' must be a string"},
        {"{'descr': ('<i4', (2,)), 'fortran_order': False, 'shape': (2,)}", "'descr' must be a string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}", "'shape' must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': 2}", "'shape' must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "'shape' must be a tuple (one dimension needs a trailing comma)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "expected ',' or ')' in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3 4)}", "expected ',' or ')' in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'descr': 1}", "'descr' must be a string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} \\", "backslash outside a string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,\v)}", "unexpected byte 0x0b"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': x}", "'shape' must be a tuple"},
        {"{'descr': x, 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "unexpected name 'x'"},
        {"{'descr': f'<f4', 'fortran_order': False, 'shape': (2,)}", "an f-string"},
        {"{'descr': '<f4' b'', 'fortran_order': False, 'shape': (2,)}", "bytes and text strings joined"},
        {"{'descr': '<\\xZ4', 'fortran_order': False, 'shape': (2,)}", "a truncated \\x, \\u or \\U escape"},
        {"{'descr': '<\\N{DIGIT FOUR}', 'fortran_order': False, 'shape': (2,)}", "\\N{...} escape (not supported)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -+3)}", "expected a dimension in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3_)}", "non-integer dimension in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,3)}", "expected a dimension in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "expected a dimension in shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,", "expected a dimension in shape"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) refused_dict(cases[i].dict, 8, cases[i].want);

    /* control bytes in a key are shown as '?' so the message stays one line */
    refused_dict("{'a\nb\x01': 1}", 0, "unterminated string");
    refused_dict("{'a\x01\x7f': 1}", 0, "unexpected key 'a?\?'");
}

static void test_dtype_refused(void **state)
{
    refused_file("bad_object.npy", "unsupported dtype '|O' (object arrays would need unpickling)");
    refused_file("bad_structured.npy", "structured dtypes are not supported (descr is a list)");
    refused_file("bad_complex.npy", "unsupported dtype '<c8'");
    refused_file("bad_unicode.npy", "unsupported dtype '<U2'");

    static const struct { const char *descr, *want; } cases[] = {
        {"'<c16'", "unsupported dtype '<c16'"},
        {"'<f16'", "unsupported dtype '<f16'"},
        {"'<f1'", "unsupported dtype '<f1'"},
        {"'<i16'", "unsupported dtype '<i16'"},
        {"'<b2'", "unsupported dtype '<b2'"},
        {"'<M8[s]'", "unsupported dtype '<M8[s]'"},
        {"'|V4'", "unsupported dtype '|V4'"},
        {"'|S3'", "unsupported dtype '|S3'"},
        {"'O'", "unsupported dtype 'O'"},
        {"''", "unsupported dtype ''"},
        {"'!f4'", "unsupported dtype '!f4'"},
        {"'<F4'", "unsupported dtype '<F4'"},
        {"'<f4 '", "unsupported dtype '<f4 '"},
        {"'\x01\x02\x03'", "unsupported dtype '?\?\?'"},
        {"'abcdefghijklmnopqrstuvwxyz0123456789'", "unsupported dtype 'abcdefghijklmnopqrstuvwx...'"},
        {"[('a', '<i4')]", "structured dtypes are not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dict[256];
        snprintf(dict, sizeof dict, "{'descr': %s, 'fortran_order': False, 'shape': (2,), }", cases[i].descr);
        refused_dict(dict, 32, cases[i].want);
    }
}

static void test_bad_dimensions(void **state)
{
    static const struct { const char *shape, *want; } cases[] = {
        {"(-1,)", "negative dimension in shape"},
        {"(2, -3)", "negative dimension in shape"},
        {"(2.5,)", "non-integer dimension in shape"},
        {"(2.,)", "non-integer dimension in shape"},
        {"(1e3,)", "non-integer dimension in shape"},
        {"(2j,)", "non-integer dimension in shape"},
        {"(True,)", "non-integer dimension in shape"},
        {"(None,)", "non-integer dimension in shape"},
        {"('2',)", "expected a dimension in shape"},
        {"(.5,)", "non-integer dimension in shape"},
        {"(007,)", "dimension with a leading zero in shape"},
        {"(18446744073709551616,)", "dimension too large in shape"},
        {"(99999999999999999999999999999,)", "dimension too large in shape"},
        {"(4294967296, 4294967296)", "array too large: element count overflows"},
        /* a zero dimension empties the array but the rest must still fit */
        {"(0, 4294967296, 4294967296)", "array too large: element count overflows"},
        {"(2305843009213693952,)", "array too large: byte count overflows"},   /* 2^61 * 8 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dict[256];
        snprintf(dict, sizeof dict, "{'descr': '<f8', 'fortran_order': False, 'shape': %s, }", cases[i].shape);
        refused_dict(dict, 48, cases[i].want);
    }

    /* 33 dimensions */
    char dict[512] = "{'descr': '<f8', 'fortran_order': False, 'shape': (";
    for (int k = 0; k < 33; k++) strcat(dict, "1, ");
    strcat(dict, "), }");
    refused_dict(dict, 8, "too many dimensions in shape (at most 32)");
}

static void test_data_size_mismatch(void **state)
{
    const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    refused_dict(d, 23, "data truncated: header promises 24 bytes, file holds 23");
    refused_dict(d, 0, "data truncated: header promises 24 bytes, file holds 0");
    refused_dict(d, 25, "1 trailing byte after the data");
    refused_dict(d, 4096, "4072 trailing bytes after the data");
    refused_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 0,
                 "data truncated: header promises 4 bytes, file holds 0");
    refused_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 1,
                 "1 trailing byte after the data");
}

/* a tiny file claiming a huge array must fail on the size check, before
 * anything is allocated for the data (an attempt to allocate 4e18 bytes
 * would have come back as AFT_ERR_NOMEM, not as this format error) */
static void test_huge_shape_tiny_file(void **state)
{
    size_t len;
    unsigned char *b = build_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000000000), }",
                                  20, &len);
    FILE *f = fopen(files_tmp("huge.npy"), "wb");
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
    free(b);
    aft_tensor t;
    aft_error err = {{0}};
    double t0 = now_ms();
    assert_int_equal(aft_npy_read(files_tmp("huge.npy"), &t, NULL, &err), AFT_ERR_FORMAT);
    assert_true(now_ms() - t0 < 1000);
    assert_string_equal(err.msg, "data truncated: header promises 4000000000000000000 bytes, file holds 20");
    assert_null(t.data);
    unlink(files_tmp("huge.npy"));

    /* the Fortran path must check first too */
    b = build_dict("{'descr': '<f8', 'fortran_order': True, 'shape': (1000000000, 2000000000), }", 20, &len);
    refused(b, len, "data truncated: header promises 16000000000000000000 bytes, file holds 20");
}

static void test_io_errors(void **state)
{
    aft_tensor t;
    aft_error err = {{0}};
    assert_int_equal(aft_npy_read(files_tmp("no-such-file.npy"), &t, NULL, &err), AFT_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot open: No such file or directory"));
    assert_null(t.data);
    assert_int_equal(aft_npy_read(files_tmpdir(), &t, NULL, &err), AFT_ERR_IO);
    assert_non_null(strstr(err.msg, "read failed: Is a directory"));
}


/* ---------------------------------------------------------------- what numpy reads */

/* testdata/npy/spell/: headers spelled by hand, each with what np.load
 * made of it (expected.tsv, by make_npy_fixtures.py). aft must load what
 * numpy loads, with the same dtype, shape and values, and refuse what
 * numpy refuses; "differs" marks numpy's leniencies aft refuses on purpose. */
static void test_spellings(void **state)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/npy/spell/expected.tsv", files_testdata());
    size_t len;
    char *text = (char *)files_slurp(path, &len);
    text[len] = '\0';
    int n_ok = 0, n_refused = 0, n_differs = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (line[0] == '#') continue;
        char *f[5] = {0};
        int nf = 0;
        for (char *p = line; p && nf < 5; nf++) {
            f[nf] = p;
            p = strchr(p, '\t');
            if (p) *p++ = '\0';
        }
        assert_true(nf >= 3);
        char name[300];
        snprintf(name, sizeof name, "spell/%s", f[0]);
        aft_tensor t;
        aft_error err = {{0}};
        aft_status st = aft_npy_read(fixture(name), &t, NULL, &err);
        if (strcmp(f[1], "ok") == 0) {
            if (st) fail_msg("%s: numpy reads %s, aft refuses: %s", f[0], f[4], err.msg);
            size_t c = 0;
            while (c < NCODES && strcmp(codes[c].code, f[2]) != 0) c++;
            assert_true(c < NCODES);
            assert_int_equal(t.dtype, codes[c].dt);
            size_t shape[AFT_MAX_DIMS], ndim = 0;
            for (char *p = f[3]; strcmp(f[3], "scalar") != 0 && *p; ndim++) {
                shape[ndim] = strtoul(p, &p, 10);
                if (*p == 'x') p++;
            }
            assert_int_equal(t.ndim, ndim);
            for (size_t k = 0; k < ndim; k++) assert_int_equal(t.shape[k], shape[k]);
            check_formula(&t, f[0]);
            aft_tensor_free(&t);
            n_ok++;
        } else {
            assert_true(strcmp(f[1], "refused") == 0 || strcmp(f[1], "differs") == 0);
            if (st == AFT_OK) {
                aft_tensor_free(&t);
                fail_msg("%s: numpy %s, aft reads it: %s", f[0], f[1][0] == 'r' ? "refuses it" : "reads it", f[2]);
            }
            assert_int_equal(st, AFT_ERR_FORMAT);
            assert_null(strchr(err.msg, '\n'));
            if (f[1][0] == 'r') n_refused++;
            else n_differs++;
        }
    }
    free(text);
    assert_true(n_ok >= 50 && n_refused >= 20 && n_differs <= 4);
}

/* numpy's own test files (numpy/lib/tests/data): the two numeric ones
 * numpy loads without pickles (2.0 written by Python 3, and by Python 2 on
 * Windows with a 'L' in the shape) hold [1.0, 1.0]; the object arrays stay
 * refused with the message they always got */
static void test_numpy_test_files(void **state)
{
    static const char *const ok[] = {"numpy/python3.npy", "numpy/win64python2.npy"};
    for (size_t i = 0; i < 2; i++) {
        aft_tensor t;
        aft_npy_info info;
        accept_file(ok[i], &t, &info);
        assert_int_equal(t.dtype, AFT_F64);
        check_shape(&t, 1, (size_t[]){2});
        const double *d = t.data;
        assert_true(d[0] == 1.0 && d[1] == 1.0);
        assert_string_equal(info.descr, "<f8");
        aft_tensor_free(&t);
    }
    refused_file("numpy/py2-objarr.npy", "unsupported dtype '|O8' (object arrays would need unpickling)");
    refused_file("numpy/py3-objarr.npy", "unsupported dtype '|O8' (object arrays would need unpickling)");

    /* and our own Python 2 header: (2L, 3L) */
    aft_tensor t;
    accept_file("py2_long.npy", &t, NULL);
    check_shape(&t, 2, (size_t[]){2, 3});
    check_formula(&t, "py2_long.npy");
    aft_tensor_free(&t);
}

/* ---------------------------------------------------------------- writer */

/* numpy's own files for the same arrays, byte for byte */
static void test_write_matches_numpy(void **state)
{
    aft_error err = {{0}};
    unsigned char buf[24 * 8];
    for (size_t c = 0; c < NCODES; c++) {
        for (int scalar = 0; scalar <= 1; scalar++) {
            char name[64];
            aft_tensor t = {.dtype = codes[c].dt, .data = buf};
            if (scalar) {
                snprintf(name, sizeof name, "scalar_%s.npy", codes[c].code);
                t.ndim = 0;
                t.nelem = 1;
            } else {
                snprintf(name, sizeof name, "v1_C_%s_%s.npy", codes[c].size == 1 ? "any" : "le",
                         codes[c].code);
                t.ndim = 3;
                t.shape[0] = 2; t.shape[1] = 3; t.shape[2] = 4;
                t.nelem = 24;
            }
            t.nbytes = t.nelem * codes[c].size;
            formula_fill(t.dtype, buf, t.nelem);
            if (aft_npy_write(files_tmp("w.npy"), &t, &err)) fail_msg("%s: %s", name, err.msg);
            size_t n1, n2;
            unsigned char *ours = files_slurp(files_tmp("w.npy"), &n1);
            unsigned char *theirs = files_slurp(fixture(name), &n2);
            assert_int_equal(n1, n2);
            if (memcmp(ours, theirs, n1) != 0) fail_msg("%s: bytes differ from numpy's", name);
            free(ours);
            free(theirs);
            unlink(files_tmp("w.npy"));
        }
    }
}

/* every little-endian C-order file numpy wrote survives read + write unchanged,
 * including empty arrays, 32 dims and the 64-space padding corner */
static void test_rewrite_identical(void **state)
{
    static const char *names[] = {
        "empty_0x3.npy", "empty_2x0x4_u8.npy", "empty_0_f8.npy", "vec5_f8.npy",
        "dims32_u1.npy", "pad64_f4.npy", "v1_C_le_f2.npy", "scalar_b1.npy",
    };
    aft_error err = {{0}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        aft_tensor t;
        accept_file(names[i], &t, NULL);
        if (aft_npy_write(files_tmp("w.npy"), &t, &err)) fail_msg("%s: %s", names[i], err.msg);
        aft_tensor_free(&t);
        size_t n1, n2;
        unsigned char *ours = files_slurp(files_tmp("w.npy"), &n1);
        unsigned char *theirs = files_slurp(fixture(names[i]), &n2);
        if (n1 != n2 || memcmp(ours, theirs, n1) != 0) fail_msg("%s: bytes differ from numpy's", names[i]);
        free(ours);
        free(theirs);
        unlink(files_tmp("w.npy"));
    }
}

/* write then read back: every dtype, several shapes, arbitrary bytes */
static void test_write_roundtrip(void **state)
{
    static const struct { size_t ndim, shape[4]; } shapes[] = {
        {0, {0}}, {1, {0}}, {2, {0, 3}}, {1, {7}}, {2, {5, 3}}, {3, {3, 4, 5}}, {4, {2, 1, 3, 70}},
    };
    aft_error err = {{0}};
    uint64_t seed = 12345;
    for (size_t c = 0; c < NCODES; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            aft_tensor t = {.dtype = codes[c].dt, .ndim = shapes[s].ndim, .nelem = 1};
            for (size_t k = 0; k < t.ndim; k++) {
                t.shape[k] = shapes[s].shape[k];
                t.nelem *= t.shape[k];
            }
            t.nbytes = t.nelem * codes[c].size;
            unsigned char *data = malloc(t.nbytes + 1);
            for (size_t i = 0; i < t.nbytes; i++) {   /* xorshift bytes; bools 0/1 */
                seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
                data[i] = codes[c].dt == AFT_BOOL ? (unsigned char)(seed & 1) : (unsigned char)seed;
            }
            t.data = data;
            if (aft_npy_write(files_tmp("rt.npy"), &t, &err)) fail_msg("%s: %s", codes[c].code, err.msg);
            aft_tensor back;
            aft_npy_info info;
            if (aft_npy_read(files_tmp("rt.npy"), &back, &info, &err)) fail_msg("%s", err.msg);
            assert_int_equal(back.dtype, t.dtype);
            check_shape(&back, t.ndim, t.shape);
            assert_memory_equal(back.data, data, t.nbytes);
            assert_int_equal(info.major, 1);
            assert_int_equal(info.data_offset % 64, 0);
            assert_int_equal(info.fortran_order, 0);
            assert_int_equal(info.byteorder, codes[c].size == 1 ? '|' : '<');
            aft_tensor_free(&back);
            free(data);
            unlink(files_tmp("rt.npy"));
        }
    assert_int_equal(count_files_like("rt.npy"), 0);
}

/* aft_npy_write_fp writes the same bytes as aft_npy_write */
static void test_write_fp(void **state)
{
    float v[6] = {1, -2, 3.5f, 0, -0.0f, 1e30f};
    aft_tensor t = {.dtype = AFT_F32, .ndim = 2, .shape = {2, 3}, .nelem = 6, .nbytes = 24, .data = v};
    aft_error err = {{0}};
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(aft_npy_write_fp(f, &t, &err), AFT_OK);
    long n = ftell(f);
    assert_int_equal(n, 128 + 24);
    unsigned char got[152];
    rewind(f);
    assert_int_equal(fread(got, 1, sizeof got, f), sizeof got);
    fclose(f);
    assert_int_equal(aft_npy_write(files_tmp("fp.npy"), &t, &err), AFT_OK);
    size_t len;
    unsigned char *want = files_slurp(files_tmp("fp.npy"), &len);
    assert_int_equal(len, sizeof got);
    assert_memory_equal(got, want, len);
    /* numpy's exact header text */
    const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    assert_memory_equal(got + 10, h, strlen(h));
    assert_int_equal(got[127], '\n');
    free(want);
    unlink(files_tmp("fp.npy"));
}

/* aft_npy_header: the first bytes of numpy's own file for every dtype and a
 * 32-dimension shape, without looking at data; refusals */
static void test_header_alone(void **state)
{
    aft_error err = {{0}};
    char head[4096];
    size_t len;
    for (size_t c = 0; c < NCODES; c++) {
        char name[64];
        snprintf(name, sizeof name, "v1_C_%s_%s.npy", codes[c].size == 1 ? "any" : "le", codes[c].code);
        aft_tensor t = {.dtype = codes[c].dt, .ndim = 3, .shape = {2, 3, 4}};
        if (aft_npy_header(&t, head, sizeof head, &len, &err)) fail_msg("%s: %s", name, err.msg);
        size_t n;
        unsigned char *theirs = files_slurp(fixture(name), &n);
        assert_int_equal(n, len + 24 * codes[c].size);
        if (memcmp(head, theirs, len) != 0) fail_msg("%s: header differs from numpy's", name);
        free(theirs);
        assert_string_equal(aft_npy_code(codes[c].dt), codes[c].code);
    }
    aft_tensor d32;
    accept_file("dims32_u1.npy", &d32, NULL);
    const void *data = d32.data;
    d32.data = NULL;   /* the header never reads it */
    assert_int_equal(aft_npy_header(&d32, head, sizeof head, &len, &err), AFT_OK);
    size_t n;
    unsigned char *theirs = files_slurp(fixture("dims32_u1.npy"), &n);
    assert_int_equal(n, len + d32.nbytes);
    assert_memory_equal(head, theirs, len);
    free(theirs);
    /* too small a buffer, bfloat16, too many dimensions */
    assert_int_equal(aft_npy_header(&d32, head, 64, &len, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "a .npy header of more than 64 bytes");
    d32.data = data;
    aft_tensor_free(&d32);
    aft_tensor bf = {.dtype = AFT_BF16, .ndim = 1, .shape = {4}};
    assert_int_equal(aft_npy_header(&bf, head, sizeof head, &len, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "bfloat16 cannot be stored in .npy");
    assert_null(aft_npy_code(AFT_BF16));
    aft_tensor many = {.dtype = AFT_F32, .ndim = AFT_MAX_DIMS + 1};
    assert_int_equal(aft_npy_header(&many, head, sizeof head, &len, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "too many dimensions"));
}

/* aft_npy_peek agrees with aft_npy_read on every fixture and every
 * malformed file: the same dtype, shape and info where the file is good,
 * the same message where the header is bad; only the data goes unread */
static void check_header_against_read(const char *path)
{
    aft_tensor full, head;
    aft_npy_info fi, hi;
    aft_error ferr = {{0}}, herr = {{0}};
    aft_status fs = aft_npy_read(path, &full, &fi, &ferr);
    aft_status hs = aft_npy_peek(path, &head, &hi, &herr);
    assert_null(head.data);
    assert_null(head.owned);
    if (fs == AFT_OK) {
        if (hs != AFT_OK) fail_msg("%s: read, but its header alone was not: %s", path, herr.msg);
        assert_int_equal(head.dtype, full.dtype);
        assert_int_equal(head.ndim, full.ndim);
        assert_memory_equal(head.shape, full.shape, full.ndim * sizeof full.shape[0]);
        assert_int_equal(head.nelem, full.nelem);
        assert_int_equal(head.nbytes, full.nbytes);
        assert_memory_equal(&hi, &fi, sizeof hi);
    } else if (hs == AFT_OK) {
        /* the header was good: the data is what is wrong */
        if (!strstr(ferr.msg, "data truncated") && !strstr(ferr.msg, "trailing bytes") &&
            !strstr(ferr.msg, "out of memory"))
            fail_msg("%s: its header alone was read, but the file was refused for: %s", path, ferr.msg);
    } else {
        assert_string_equal(herr.msg, ferr.msg);
    }
    aft_tensor_free(&full);
}

static void test_read_header(void **state)
{
    const char *dirs[2] = {"npy", "malformed"};
    size_t checked = 0;
    for (int k = 0; k < 2; k++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", files_testdata(), dirs[k]);
        DIR *d = opendir(dir);
        assert_non_null(d);
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n < 4 || strcmp(e->d_name + n - 4, ".npy") != 0) continue;
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            check_header_against_read(path);
            checked++;
        }
        closedir(d);
    }
    assert_true(checked > 50);
    /* a file whose data is cut short: its size is checked too */
    size_t len;
    unsigned char *b = files_slurp(fixture("v1_C_le_f4.npy"), &len);
    FILE *f = fopen(files_tmp("cut.npy"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len - 5, f), len - 5);
    fclose(f);
    free(b);
    aft_tensor t;
    aft_error err = {{0}};
    assert_int_equal(aft_npy_peek(files_tmp("cut.npy"), &t, NULL, &err), AFT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    assert_int_equal(aft_npy_read(files_tmp("cut.npy"), &t, NULL, &err), AFT_ERR_FORMAT);
    unlink(files_tmp("cut.npy"));
    /* not standard input, and not a missing file */
    assert_int_not_equal(aft_npy_peek("-", &t, NULL, &err), AFT_OK);
    assert_int_equal(aft_npy_peek(files_tmp("none.npy"), &t, NULL, &err), AFT_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot open"));
}

static void test_write_refusals(void **state)
{
    uint16_t v[4] = {0};
    aft_error err = {{0}};

    /* bfloat16 has no numpy dtype; no file, not even a temporary, is left */
    aft_tensor bf = {.dtype = AFT_BF16, .ndim = 1, .shape = {4}, .nelem = 4, .nbytes = 8, .data = v};
    assert_int_equal(aft_npy_write(files_tmp("bf.npy"), &bf, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "bfloat16 cannot be stored in .npy");
    assert_int_equal(aft_npy_write_fp(stdout, &bf, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "bfloat16 cannot be stored in .npy");

    /* counts that disagree with the shape; the temporary is removed */
    aft_tensor bad = {.dtype = AFT_U16, .ndim = 1, .shape = {4}, .nelem = 3, .nbytes = 6, .data = v};
    assert_int_equal(aft_npy_write(files_tmp("bad.npy"), &bad, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "do not match its shape"));
    aft_tensor nodata = {.dtype = AFT_U16, .ndim = 1, .shape = {4}, .nelem = 4, .nbytes = 8};
    assert_int_equal(aft_npy_write(files_tmp("bad.npy"), &nodata, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "tensor has no data");
    aft_tensor over = {.dtype = AFT_U16, .ndim = 2, .shape = {SIZE_MAX, 2}, .nelem = 1, .nbytes = 2, .data = v};
    assert_int_equal(aft_npy_write(files_tmp("bad.npy"), &over, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "shape element count overflows");
    /* even with a zero dimension, as the reader would refuse the file */
    aft_tensor over0 = {.dtype = AFT_U16, .ndim = 3, .shape = {0, SIZE_MAX, 2}, .nelem = 0, .nbytes = 0};
    assert_int_equal(aft_npy_write(files_tmp("bad.npy"), &over0, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "shape element count overflows");
    aft_tensor overb = {.dtype = AFT_U64, .ndim = 2, .shape = {0, SIZE_MAX / 4}, .nelem = 0, .nbytes = 0};
    assert_int_equal(aft_npy_write(files_tmp("bad.npy"), &overb, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "shape byte count overflows");
    assert_int_equal(count_files_like("bf.npy"), 0);
    assert_int_equal(count_files_like("bad.npy"), 0);

    /* a directory that does not exist */
    aft_tensor ok = {.dtype = AFT_U16, .ndim = 1, .shape = {4}, .nelem = 4, .nbytes = 8, .data = v};
    assert_int_equal(aft_npy_write(files_tmp("nodir/x.npy"), &ok, &err), AFT_ERR_IO);

    /* a full disk */
    FILE *full = fopen("/dev/full", "wb");
    if (full) {
        setvbuf(full, NULL, _IONBF, 0);
        assert_int_equal(aft_npy_write_fp(full, &ok, &err), AFT_ERR_IO);
        assert_non_null(strstr(err.msg, "write failed: No space left on device"));
        fclose(full);
    }
}

/* ---------------------------------------------------------------- reading a range */

/* elements of a .npy by range: every dtype numpy writes for floats, both
 * byte orders, a file cut short */
static void test_npy_range(void **state)
{
    (void)state;
    char dir[] = "/tmp/aft_slice_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/x.npy", dir);
    double vals[30];
    for (int i = 0; i < 30; i++) vals[i] = i * 0.5 - 3.0;
    aft_tensor t = {.dtype = AFT_F64, .ndim = 2, .shape = {10, 3}, .nelem = 30, .nbytes = sizeof vals, .data = vals};
    aft_error err;
    assert_int_equal(aft_npy_write(path, &t, &err), AFT_OK);
    float got[7];
    assert_int_equal(aft_npy_read_f32(path, 12, 7, got, &err), AFT_OK);
    for (int i = 0; i < 7; i++) assert_true(got[i] == (float)vals[12 + i]);
    assert_int_equal(aft_npy_read_f32(path, 25, 6, got, &err), AFT_ERR_ARG);
    /* big-endian float32, written by hand */
    const char *hdr = "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }";
    unsigned char buf[256];
    size_t hl = 128 - 10;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hl; buf[9] = 0;
    memset(buf + 10, ' ', hl);
    memcpy(buf + 10, hdr, strlen(hdr));
    buf[127] = '\n';
    for (int i = 0; i < 4; i++) {
        float f = (float)i + 0.25f;
        uint32_t u;
        memcpy(&u, &f, 4);
        for (int k = 0; k < 4; k++) buf[128 + 4 * i + k] = (unsigned char)(u >> (24 - 8 * k));
    }
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(buf, 1, 128 + 12, fp), 128 + 12);   /* the last element cut off */
    fclose(fp);
    aft_tensor h;
    assert_int_equal(aft_npy_peek(path, &h, NULL, &err), AFT_ERR_FORMAT);
    assert_int_equal(aft_npy_peek_header(path, &h, NULL, &err), AFT_OK);
    assert_int_equal(h.shape[0], 4);
    assert_int_equal(aft_npy_read_f32(path, 1, 2, got, &err), AFT_OK);
    assert_true(got[0] == 1.25f && got[1] == 2.25f);
    assert_int_equal(aft_npy_read_f32(path, 2, 2, got, &err), AFT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "data truncated"));
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_matrix),
        cmocka_unit_test(test_read_header),
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_zero_size),
        cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_byteorder_chars),
        cmocka_unit_test(test_header_variants),
        cmocka_unit_test(test_header_unaligned_and_v2),
        cmocka_unit_test(test_header_at_limit),
        cmocka_unit_test(test_fortran_by_hand),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_header_too_long_or_past_eof),
        cmocka_unit_test(test_header_no_newline),
        cmocka_unit_test(test_header_not_the_dict),
        cmocka_unit_test(test_dtype_refused),
        cmocka_unit_test(test_bad_dimensions),
        cmocka_unit_test(test_spellings),
        cmocka_unit_test(test_numpy_test_files),
        cmocka_unit_test(test_data_size_mismatch),
        cmocka_unit_test(test_huge_shape_tiny_file),
        cmocka_unit_test(test_io_errors),
        cmocka_unit_test(test_write_matches_numpy),
        cmocka_unit_test(test_rewrite_identical),
        cmocka_unit_test(test_write_roundtrip),
        cmocka_unit_test(test_write_fp),
        cmocka_unit_test(test_header_alone),
        cmocka_unit_test(test_write_refusals),
        cmocka_unit_test(test_npy_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
