/* test_npz.c - the .npz reader behind aft_st_open and the .npz writer,
 * against archives numpy wrote (testdata/npz, made by
 * testdata/make_npz_fixtures.py), every hostile archive of the malformed
 * corpus (testdata/malformed/npz_*.npz and expected.tsv), and the bytes
 * Python's zipfile writes for the same members. (Telling formats apart,
 * lib/io/detect.c: test_detect.c.) */
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
#include <unistd.h>
#include <zlib.h>

#include "aft.h"
#include "files.h"
#include "io/formats.h"
#include "formula.h"
#include "internal.h"

/* ---------------------------------------------------------------- helpers */

static const char *fixture(const char *name)
{
    return files_fixture("npz", name);
}

static int setup(void **state)
{
    return files_tmpdir_make("/tmp/aft_test_npz.XXXXXX");
}

static int teardown(void **state)
{
    return files_tmpdir_remove();
}

static aft_st_file *open_ok(const char *path, size_t max_bytes)
{
    aft_st_file *f = NULL;
    aft_error err = {{0}};
    aft_status st = aft_st_open_limit(path, max_bytes, &f, &err);
    if (st) fail_msg("%s refused (%d): %s", path, (int)st, err.msg);
    assert_string_equal(aft_st_format(f), "npz");
    assert_int_equal(aft_st_metadata_count(f), 0);
    assert_null(aft_st_metadata_find(f, "format"));
    return f;
}

/* opening must fail with status st and a one-line message holding want */
static void open_fails(const char *path, size_t max_bytes, aft_status want_st, const char *want)
{
    aft_st_file *f = (aft_st_file *)1;
    aft_error err = {{0}};
    aft_status st = aft_st_open_limit(path, max_bytes, &f, &err);
    if (st == AFT_OK) aft_st_close(f);
    if (st != want_st || !strstr(err.msg, want))
        fail_msg("%s: want status %d with \"%s\", got %d: \"%s\"", path, (int)want_st, want, (int)st, err.msg);
    assert_null(f);
    for (const char *p = err.msg; *p; p++) assert_true((unsigned char)*p >= 0x20 && *p != 0x7f);
}

static void check_formula(const aft_tensor *t, const char *what)
{
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
}

/* ---------------------------------------------------------------- numpy's archives */

static const char *const codes[] = {"f2", "f4", "f8", "b1", "u1", "i1", "i2", "u2", "i4", "u4", "i8", "u8"};
#define NCODES (sizeof codes / sizeof codes[0])

/* arrays() of make_npz_fixtures.py, in np.savez's order; deflated: every
 * member owns its data, else only those that needed a byte swap or a
 * transpose do (the rest borrow the file) */
static void check_arrays(aft_st_file *f, int deflated)
{
    static const size_t s234[] = {2, 3, 4};
    assert_int_equal(aft_st_count(f), NCODES + 5);
    for (size_t c = 0; c < NCODES; c++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, c, &name);
        assert_non_null(t);
        assert_string_equal(name, codes[c]);
        assert_ptr_equal(aft_st_find(f, codes[c]), t);
        assert_int_equal(t->dtype, formula_dtype(codes[c]));
        check_shape(t, 3, s234);
        check_formula(t, codes[c]);
        assert_true(deflated ? t->owned != NULL : t->owned == NULL);
    }
    const aft_tensor *t = aft_st_find(f, "be_f8");
    assert_non_null(t);
    assert_int_equal(t->dtype, AFT_F64);
    check_shape(t, 3, s234);
    check_formula(t, "be_f8");
    assert_non_null(t->owned);   /* swapped: a copy */

    t = aft_st_find(f, "F_i2");
    assert_non_null(t);
    assert_int_equal(t->dtype, AFT_I16);
    check_shape(t, 2, (size_t[]){3, 5});
    check_formula(t, "F_i2");   /* C order, as numpy gives it */
    assert_non_null(t->owned);

    t = aft_st_find(f, "scalar_u8");
    assert_non_null(t);
    assert_int_equal(t->dtype, AFT_U64);
    check_shape(t, 0, NULL);
    check_formula(t, "scalar_u8");

    t = aft_st_find(f, "empty_f4");
    assert_non_null(t);
    check_shape(t, 2, (size_t[]){0, 3});

    t = aft_st_find(f, "blocks.0.attn.query.weight");
    assert_non_null(t);
    check_shape(t, 2, (size_t[]){3, 4});
    check_formula(t, "dotted key");

    const char *name = "x";
    assert_null(aft_st_get(f, NCODES + 5, &name));
    assert_null(name);
    assert_null(aft_st_find(f, "f4.npy"));   /* keys, not member names */
    assert_null(aft_st_find(f, "nothing"));
}

static void test_savez(void **state)
{
    aft_st_file *f = open_ok(fixture("savez.npz"), SIZE_MAX);
    check_arrays(f, 0);
    aft_st_close(f);
    /* the same through aft_st_open and from memory */
    aft_error err;
    assert_int_equal(aft_st_open(fixture("savez.npz"), &f, &err), AFT_OK);
    check_arrays(f, 0);
    aft_st_close(f);
    size_t len;
    unsigned char *b = files_slurp(fixture("savez.npz"), &len);
    assert_int_equal(aft_st_open_mem(b, len, &f, &err), AFT_OK);
    check_arrays(f, 0);
    /* a borrowed member points into the caller's buffer */
    const aft_tensor *t = aft_st_find(f, "f4");
    assert_true((const unsigned char *)t->data > b && (const unsigned char *)t->data < b + len);
    aft_st_close(f);
    free(b);
}

static void test_savez_compressed(void **state)
{
    aft_st_file *f = open_ok(fixture("savez_compressed.npz"), SIZE_MAX);
    check_arrays(f, 1);
    aft_st_close(f);
}

static void test_other_archives(void **state)
{
    aft_st_file *f = open_ok(fixture("empty.npz"), SIZE_MAX);
    assert_int_equal(aft_st_count(f), 0);
    aft_st_close(f);

    /* sizes and CRC-32 in data descriptors, zeros in the local headers */
    f = open_ok(fixture("descriptor.npz"), SIZE_MAX);
    assert_int_equal(aft_st_count(f), 2);
    check_formula(aft_st_find(f, "f4"), "descriptor f4");
    check_formula(aft_st_find(f, "i2"), "descriptor i2");
    aft_st_close(f);

    /* every size and offset in zip64 records */
    f = open_ok(fixture("zip64.npz"), SIZE_MAX);
    assert_int_equal(aft_st_count(f), 2);
    const aft_tensor *a = aft_st_find(f, "a"), *b = aft_st_find(f, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->dtype, AFT_F32);
    assert_int_equal(b->dtype, AFT_I64);
    check_formula(a, "zip64 a");
    check_formula(b, "zip64 b");
    aft_st_close(f);

    /* names in UTF-8 (flagged) and code page 437: the keys np.load gives */
    size_t len;
    char *keys = (char *)files_slurp(fixture("names.txt"), &len);
    char *nl = strchr(keys, '\n');
    assert_non_null(nl);
    *nl = 0;
    char *second = nl + 1;
    nl = strchr(second, '\n');
    assert_non_null(nl);
    *nl = 0;
    char *third = nl + 1;
    nl = strchr(third, '\n');
    assert_non_null(nl);
    *nl = 0;
    f = open_ok(fixture("names.npz"), SIZE_MAX);
    assert_int_equal(aft_st_count(f), 3);
    const char *name;
    aft_st_get(f, 0, &name);
    assert_string_equal(name, keys);
    aft_st_get(f, 1, &name);
    assert_string_equal(name, second);
    aft_st_get(f, 2, &name);
    assert_string_equal(name, third);   /* all of code page 437's upper half */
    assert_int_equal(aft_st_find(f, keys)->dtype, AFT_U8);
    assert_int_equal(aft_st_find(f, second)->dtype, AFT_I8);
    assert_int_equal(aft_st_find(f, third)->dtype, AFT_U16);
    aft_st_close(f);
    free(keys);
}

/* numpy's own test archives hold object arrays: refused, as a .npy of them */
static void test_numpy_object_archives(void **state)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/npy/numpy/py2-objarr.npz", files_testdata());
    open_fails(p, SIZE_MAX, AFT_ERR_FORMAT, "member 'x.npy': unsupported dtype '|O8' (object arrays would need unpickling)");
    snprintf(p, sizeof p, "%s/npy/numpy/py3-objarr.npz", files_testdata());
    open_fails(p, SIZE_MAX, AFT_ERR_FORMAT, "member 'x.npy': unsupported dtype '|O8'");
}

/* ---------------------------------------------------------------- the memory bound */

static void test_memory_limit(void **state)
{
    /* deflated members count their inflated size, checked before inflating */
    open_fails(fixture("savez_compressed.npz"), 0, AFT_ERR_NOMEM,
               "member 'f2.npy': inflates to 176 bytes, past the memory limit of 0 bytes (0 taken before it)");
    open_fails(fixture("savez_compressed.npz"), 1000, AFT_ERR_NOMEM, "past the memory limit of 1000 bytes");
    /* what every member takes, summed by hand: enough is enough */
    size_t len;
    unsigned char *b = files_slurp(fixture("savez_compressed.npz"), &len);
    free(b);
    aft_st_file *f = open_ok(fixture("savez_compressed.npz"), SIZE_MAX);
    size_t need = 0;
    for (size_t i = 0; i < aft_st_count(f); i++) need += aft_st_get(f, i, NULL)->nbytes + 128;
    aft_st_close(f);
    f = open_ok(fixture("savez_compressed.npz"), need + 4096);
    aft_st_close(f);

    /* stored members borrow the file: nothing to count, but the big-endian
     * and Fortran ones, which are copied */
    open_fails(fixture("savez.npz"), 0, AFT_ERR_NOMEM, "member 'be_f8.npy': needs 192 bytes, past the memory limit of 0 bytes");
    f = open_ok(fixture("writer_expect.npz"), 0);
    assert_int_equal(aft_st_count(f), 4);
    aft_st_close(f);
}

/* ---------------------------------------------------------------- hostile archives */

/* every npz_* file of the malformed corpus, with the message it must give
 * (aft_st_open, from the file and from memory) */
static void test_malformed_corpus(void **state)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/malformed/expected.tsv", files_testdata());
    size_t len;
    char *text = (char *)files_slurp(p, &len);
    int n = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (strncmp(line, "npz_", 4) != 0) continue;
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = 0;
        snprintf(p, sizeof p, "%s/malformed/%s", files_testdata(), line);
        aft_st_file *f = (aft_st_file *)1;
        aft_error err = {{0}};
        aft_status st = aft_st_open_limit(p, SIZE_MAX, &f, &err);
        if (st == AFT_OK) {
            aft_st_close(f);
            fail_msg("%s: accepted", line);
        }
        assert_null(f);
        if (!strstr(err.msg, tab + 1)) fail_msg("%s: want \"%s\", got \"%s\"", line, tab + 1, err.msg);
        for (const char *c = err.msg; *c; c++) assert_true((unsigned char)*c >= 0x20 && *c != 0x7f);

        /* from memory: refused too (an empty buffer is no zip by its bytes) */
        size_t blen;
        unsigned char *b = files_slurp(p, &blen);
        f = (aft_st_file *)1;
        st = aft_st_open_mem(b, blen, &f, &err);
        if (st == AFT_OK) aft_st_close(f);
        assert_int_not_equal(st, AFT_OK);
        assert_null(f);
        free(b);
        n++;
    }
    free(text);
    assert_true(n >= 40);
}

/* a zip bomb within deflate's reach: 64 MiB of zeros in a member of about
 * 64 KiB, refused by the bound before a byte is inflated */
static void test_bomb_within_ratio(void **state)
{
    size_t big = (size_t)64 << 20;
    aft_tensor t = {.dtype = AFT_U8, .ndim = 1, .shape = {big}, .nelem = big, .nbytes = big};
    unsigned char *zeros = calloc(big, 1);
    assert_non_null(zeros);
    t.data = zeros;
    /* deflate it by hand into a one-member archive */
    char head[4096];
    size_t hn;
    aft_error err;
    assert_int_equal(aft_npy_header(&t, head, sizeof head, &hn, &err), AFT_OK);
    size_t usize = hn + big;
    unsigned char *raw = malloc(usize);
    assert_non_null(raw);
    memcpy(raw, head, hn);
    memcpy(raw + hn, zeros, big);
    free(zeros);
    /* zlib through the library's CRC and a raw deflate stream */
    uLongf clen = compressBound(usize);
    unsigned char *z = malloc(clen);
    assert_non_null(z);
    z_stream s;
    memset(&s, 0, sizeof s);
    assert_int_equal(deflateInit2(&s, 9, Z_DEFLATED, -MAX_WBITS, 9, Z_DEFAULT_STRATEGY), Z_OK);
    s.next_in = raw;
    s.avail_in = (uInt)usize;
    s.next_out = z;
    s.avail_out = (uInt)clen;
    assert_int_equal(deflate(&s, Z_FINISH), Z_STREAM_END);
    size_t csize = s.total_out;
    deflateEnd(&s);
    uint32_t crc = aft_crc32(0, raw, usize);
    free(raw);

    FILE *fp = fopen(files_tmp("bomb.npz"), "wb");
    assert_non_null(fp);
    unsigned char l[30] = {'P', 'K', 3, 4, 20, 0, 0, 0, 8, 0, 0, 0, 0x21, 0};
    #define PUT32(p, v) ((p)[0] = (unsigned char)(v), (p)[1] = (unsigned char)((v) >> 8), \
                         (p)[2] = (unsigned char)((v) >> 16), (p)[3] = (unsigned char)((v) >> 24))
    PUT32(l + 14, crc);
    PUT32(l + 18, (uint32_t)csize);
    PUT32(l + 22, (uint32_t)usize);
    l[26] = 5;
    fwrite(l, 1, 30, fp);
    fwrite("a.npy", 1, 5, fp);
    fwrite(z, 1, csize, fp);
    unsigned char c[46] = {'P', 'K', 1, 2, 20, 3, 20, 0, 0, 0, 8, 0, 0, 0, 0x21, 0};
    PUT32(c + 16, crc);
    PUT32(c + 20, (uint32_t)csize);
    PUT32(c + 24, (uint32_t)usize);
    c[28] = 5;
    fwrite(c, 1, 46, fp);
    fwrite("a.npy", 1, 5, fp);
    unsigned char e[22] = {'P', 'K', 5, 6, 0, 0, 0, 0, 1, 0, 1, 0};
    PUT32(e + 12, 51u);
    PUT32(e + 16, (uint32_t)(35 + csize));
    fwrite(e, 1, 22, fp);
    fclose(fp);
    free(z);
    assert_true(csize < usize / 500);

    open_fails(files_tmp("bomb.npz"), (size_t)1 << 20, AFT_ERR_NOMEM,
               "member 'a.npy': inflates to 67108992 bytes, past the memory limit of 1048576 bytes");
    /* with room for it, it is an ordinary archive */
    aft_st_file *f = open_ok(files_tmp("bomb.npz"), (size_t)80 << 20);
    assert_int_equal(aft_st_find(f, "a")->nbytes, big);
    aft_st_close(f);
}

/* ---------------------------------------------------------------- the writer */

/* the tensors of writer_expect.npz: formula values */
static void expect_tensors(aft_tensor t[4], void *bufs[4])
{
    static const char *const c[4] = {"f4", "i2", "f4", "b1"};
    static const size_t shapes[4][3] = {{2, 3, 4}, {2, 3, 4}, {3, 4, 0}, {2, 3, 4}};
    for (int i = 0; i < 4; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].dtype = formula_dtype(c[i]);
        t[i].ndim = i == 2 ? 2 : 3;
        memcpy(t[i].shape, shapes[i], sizeof shapes[i]);
        t[i].nelem = i == 2 ? 12 : 24;
        t[i].nbytes = t[i].nelem * aft_dtype_size(t[i].dtype);
        bufs[i] = malloc(t[i].nbytes);
        assert_non_null(bufs[i]);
        formula_fill(t[i].dtype, bufs[i], t[i].nelem);
        t[i].data = bufs[i];
    }
}

static void test_writer_matches_python(void **state)
{
    aft_tensor t[4];
    void *bufs[4];
    expect_tensors(t, bufs);
    const char *keys[4] = {"f4", "i2", "blocks.0.attn.query.weight", "b1"};
    aft_error err;
    assert_int_equal(aft_npz_write(files_tmp("w.npz"), keys, t, 4, &err), AFT_OK);
    size_t la, lb;
    unsigned char *got = files_slurp(files_tmp("w.npz"), &la), *want = files_slurp(fixture("writer_expect.npz"), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(got, want, la);
    free(got);
    free(want);

    /* and it reads back */
    aft_st_file *f = open_ok(files_tmp("w.npz"), 0);
    for (int i = 0; i < 4; i++) {
        const aft_tensor *r = aft_st_find(f, keys[i]);
        assert_non_null(r);
        assert_int_equal(r->nbytes, t[i].nbytes);
        assert_memory_equal(r->data, t[i].data, t[i].nbytes);
    }
    aft_st_close(f);
    for (int i = 0; i < 4; i++) free(bufs[i]);
}

/* zip64 records everywhere, as an archive over 4 GiB has them */
static void test_writer_zip64(void **state)
{
    aft_tensor t[2];
    void *bufs[2];
    static const char *const c[2] = {"f4", "i8"};
    for (int i = 0; i < 2; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].dtype = formula_dtype(c[i]);
        t[i].ndim = 3;
        t[i].shape[0] = 2, t[i].shape[1] = 3, t[i].shape[2] = 4;
        t[i].nelem = 24;
        t[i].nbytes = 24 * aft_dtype_size(t[i].dtype);
        bufs[i] = malloc(t[i].nbytes);
        formula_fill(t[i].dtype, bufs[i], 24);
        t[i].data = bufs[i];
    }
    FILE *fp = fopen(files_tmp("z64.npz"), "wb");
    assert_non_null(fp);
    aft_npz_writer *w;
    aft_error err;
    assert_int_equal(aft_npz_writer_new_zip64(fp, 1, &w, &err), AFT_OK);
    const char *keys[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        char head[4096];
        size_t hn;
        assert_int_equal(aft_npy_header(&t[i], head, sizeof head, &hn, &err), AFT_OK);
        uint32_t crc = aft_crc32(aft_crc32(0, head, hn), t[i].data, t[i].nbytes);
        assert_int_equal(aft_npz_writer_begin(w, keys[i], hn + t[i].nbytes, crc, &err), AFT_OK);
        assert_int_equal(aft_npz_writer_write(w, head, hn, &err), AFT_OK);
        /* the data in two pieces */
        assert_int_equal(aft_npz_writer_write(w, t[i].data, 10, &err), AFT_OK);
        assert_int_equal(aft_npz_writer_write(w, (const char *)t[i].data + 10, t[i].nbytes - 10, &err), AFT_OK);
    }
    assert_int_equal(aft_npz_writer_finish(w, &err), AFT_OK);
    aft_npz_writer_free(w);
    fclose(fp);
    size_t la, lb;
    unsigned char *got = files_slurp(files_tmp("z64.npz"), &la), *want = files_slurp(fixture("writer_zip64_expect.npz"), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(got, want, la);
    free(got);
    free(want);
    aft_st_file *f = open_ok(files_tmp("z64.npz"), 0);
    check_formula(aft_st_find(f, "a"), "zip64 a");
    check_formula(aft_st_find(f, "b"), "zip64 b");
    aft_st_close(f);
    for (int i = 0; i < 2; i++) free(bufs[i]);
}

/* every dtype, odd shapes and many members through the writer and back */
static void test_writer_roundtrip(void **state)
{
    enum { N = 300 };
    aft_tensor t[N];
    char *keys[N];
    unsigned char data[24 * 8];
    for (int i = 0; i < N; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].dtype = formula_dtype(codes[i % NCODES]);
        t[i].ndim = (size_t)(i % 4);
        size_t n = 1;
        for (size_t k = 0; k < t[i].ndim; k++) n *= (t[i].shape[k] = (size_t)(k + 1 + i % 2));
        if (i % 7 == 3) { t[i].ndim = 2; t[i].shape[0] = 0; t[i].shape[1] = 5; n = 0; }
        t[i].nelem = n;
        t[i].nbytes = n * aft_dtype_size(t[i].dtype);
        t[i].data = data;
        keys[i] = malloc(32);
        snprintf(keys[i], 32, "t%d.%s", i, codes[i % NCODES]);
    }
    formula_fill(AFT_U8, data, sizeof data);
    aft_error err;
    assert_int_equal(aft_npz_write(files_tmp("rt.npz"), (const char *const *)keys, t, N, &err), AFT_OK);
    aft_st_file *f = open_ok(files_tmp("rt.npz"), 0);
    assert_int_equal(aft_st_count(f), N);
    for (int i = 0; i < N; i++) {
        const char *name;
        const aft_tensor *r = aft_st_get(f, (size_t)i, &name);
        assert_string_equal(name, keys[i]);
        assert_int_equal(r->dtype, t[i].dtype);
        check_shape(r, t[i].ndim, t[i].shape);
        if (r->nbytes) assert_memory_equal(r->data, data, r->nbytes);
        free(keys[i]);
    }
    aft_st_close(f);
}

static void write_refused(const char *key, const aft_tensor *t, const char *want)
{
    aft_error err = {{0}};
    aft_status st = aft_npz_write(files_tmp("bad.npz"), &key, t, 1, &err);
    if (st != AFT_ERR_ARG || !strstr(err.msg, want))
        fail_msg("key '%s': want AFT_ERR_ARG with \"%s\", got %d: \"%s\"", key ? key : "(null)", want, (int)st, err.msg);
    assert_int_equal(access(files_tmp("bad.npz"), F_OK), -1);
}

static void test_writer_refusals(void **state)
{
    float v[2] = {1, 2};
    aft_tensor t = {.dtype = AFT_F32, .ndim = 1, .shape = {2}, .nelem = 2, .nbytes = 8, .data = v};
    write_refused("", &t, "an empty key");
    write_refused("a/b", &t, "key 'a/b': '/' in a key (members are keys, not paths)");
    write_refused("../x", &t, "'/' in a key");
    write_refused("a\\b", &t, "'\\' in a key");
    write_refused("..", &t, "'..' in a key");
    write_refused("\xff", &t, "is not valid UTF-8");
    write_refused(NULL, &t, "a tensor without a name");
    aft_tensor bf = t;
    bf.dtype = AFT_BF16;
    bf.nbytes = 4;
    write_refused("bf", &bf, "bfloat16 cannot be stored in .npy");
    aft_tensor lie = t;
    lie.nelem = 3;
    write_refused("lie", &lie, "its counts do not match its shape");

    aft_tensor two[2] = {t, t};
    const char *dup[2] = {"x", "x"};
    aft_error err;
    assert_int_equal(aft_npz_write(files_tmp("bad.npz"), dup, two, 2, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "key 'x' is given twice"));

    /* the streaming writer checks what it is handed */
    FILE *fp = fopen(files_tmp("s.npz"), "wb");
    aft_npz_writer *w;
    assert_int_equal(aft_npz_writer_new(fp, &w, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_write(w, "x", 1, &err), AFT_ERR_ARG);   /* no member begun */
    assert_int_equal(aft_npz_writer_begin(w, "a", 4, aft_crc32(0, "abcd", 4), &err), AFT_OK);
    assert_int_equal(aft_npz_writer_write(w, "abc", 3, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_finish(w, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "member 'a.npy': 3 bytes written of the 4 announced"));
    aft_npz_writer_free(w);
    fclose(fp);

    fp = fopen(files_tmp("s.npz"), "wb");
    assert_int_equal(aft_npz_writer_new(fp, &w, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_begin(w, "a", 4, aft_crc32(0, "abcd", 4), &err), AFT_OK);
    assert_int_equal(aft_npz_writer_write(w, "abcd!", 5, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "more than the 4 bytes announced"));
    aft_npz_writer_free(w);
    fclose(fp);

    fp = fopen(files_tmp("s.npz"), "wb");
    assert_int_equal(aft_npz_writer_new(fp, &w, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_begin(w, "a", 4, aft_crc32(0, "abcd", 4), &err), AFT_OK);
    assert_int_equal(aft_npz_writer_write(w, "abcx", 4, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_begin(w, "b", 0, 0, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "its data changed while it was written"));
    aft_npz_writer_free(w);
    fclose(fp);

    fp = fopen(files_tmp("s.npz"), "wb");
    assert_int_equal(aft_npz_writer_new(fp, &w, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_begin(w, "a", 0, 0, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_begin(w, "a", 0, 0, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "key 'a' is given twice"));
    aft_npz_writer_free(w);
    fclose(fp);

    /* a full disk */
    FILE *full = fopen("/dev/full", "wb");
    if (full) {
        setvbuf(full, NULL, _IONBF, 0);
        assert_int_equal(aft_npz_writer_new(full, &w, &err), AFT_OK);
        assert_int_equal(aft_npz_writer_begin(w, "a", 0, 0, &err), AFT_ERR_IO);
        assert_non_null(strstr(err.msg, "write failed: No space left on device"));
        aft_npz_writer_free(w);
        fclose(full);
    }
}


/* A sink for a 2 GiB archive that keeps only its first and last bytes. */
typedef struct {
    unsigned char head[256], tail[1024];
    uint64_t n;
} sink;

static ssize_t sink_write(void *c, const char *p, size_t len)
{
    sink *k = c;
    /* only the bytes that can still be among the first or the last count */
    size_t skip = len > sizeof k->tail ? len - sizeof k->tail : 0;
    for (size_t i = 0; i < len; i++) {
        uint64_t at = k->n + i;
        if (at < sizeof k->head) k->head[at] = (unsigned char)p[i];
        else if (i < skip) i = skip - 1;   /* jump to the last tail-full */
        else k->tail[at % sizeof k->tail] = (unsigned char)p[i];
    }
    k->n += len;
    return (ssize_t)len;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

/* The zip64 records an archive gets without being forced: a member over
 * 2 GiB - 1 (Python's zipfile's limit too) and the central directory past
 * it. 2 GiB of zeros go through the writer into a sink that keeps the ends
 * (a second or so; skipped with AFT_TEST_QUICK, as under valgrind). */
static void test_writer_zip64_natural(void **state)
{
    const char *q = getenv("AFT_TEST_QUICK");
    if (q && *q && strcmp(q, "0") != 0) skip();
    sink *k = calloc(1, sizeof *k);
    assert_non_null(k);
    cookie_io_functions_t io = {.write = sink_write};
    FILE *fp = fopencookie(k, "w", io);
    assert_non_null(fp);
    const uint64_t size = (uint64_t)1 << 31;   /* one byte over the limit */
    size_t chunk = (size_t)1 << 24;
    unsigned char *zeros = calloc(chunk, 1);
    assert_non_null(zeros);
    uint32_t crc = 0;
    for (uint64_t done = 0; done < size; done += chunk) crc = aft_crc32(crc, zeros, chunk);
    aft_npz_writer *w;
    aft_error err;
    assert_int_equal(aft_npz_writer_new(fp, &w, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_begin(w, "big", size, crc, &err), AFT_OK);
    for (uint64_t done = 0; done < size; done += chunk)
        assert_int_equal(aft_npz_writer_write(w, zeros, chunk, &err), AFT_OK);
    assert_int_equal(aft_npz_writer_finish(w, &err), AFT_OK);
    aft_npz_writer_free(w);
    assert_int_equal(fclose(fp), 0);
    free(zeros);

    /* local header: version 4.5, sizes 0xffffffff, the zip64 extra */
    assert_int_equal(le(k->head, 4), 0x04034b50);
    assert_int_equal(le(k->head + 4, 2), 45);
    assert_int_equal(le(k->head + 18, 4), 0xffffffffu);
    assert_int_equal(le(k->head + 22, 4), 0xffffffffu);
    assert_int_equal(le(k->head + 26, 2), 7);    /* "big.npy" */
    assert_int_equal(le(k->head + 28, 2), 20);
    assert_memory_equal(k->head + 30, "big.npy", 7);
    assert_int_equal(le(k->head + 37, 2), 1);
    assert_int_equal(le(k->head + 41, 8), size);
    assert_int_equal(le(k->head + 49, 8), size);

    /* the tail: central entry (46 + 7 + 20), zip64 end record (56) and
     * locator (20), end record (22) */
    uint64_t data_end = 57 + size, n = k->n;
    assert_int_equal(n, data_end + 73 + 56 + 20 + 22);
    unsigned char t[171];
    for (size_t i = 0; i < sizeof t; i++) t[i] = k->tail[(n - sizeof t + i) % sizeof k->tail];
    const unsigned char *c = t, *e64 = t + 73, *loc = e64 + 56, *end = loc + 20;
    assert_int_equal(le(c, 4), 0x02014b50);
    assert_int_equal(le(c + 20, 4), 0xffffffffu);   /* sizes in the extra */
    assert_int_equal(le(c + 24, 4), 0xffffffffu);
    assert_int_equal(le(c + 30, 2), 20);
    assert_int_equal(le(c + 42, 4), 0);             /* the offset fits */
    assert_int_equal(le(c + 53 + 4, 8), size);
    assert_int_equal(le(e64, 4), 0x06064b50);
    assert_int_equal(le(e64 + 32, 8), 1);
    assert_int_equal(le(e64 + 40, 8), 73);
    assert_int_equal(le(e64 + 48, 8), data_end);
    assert_int_equal(le(loc, 4), 0x07064b50);
    assert_int_equal(le(loc + 8, 8), data_end + 73);
    assert_int_equal(le(end, 4), 0x06054b50);
    assert_int_equal(le(end + 10, 2), 1);
    /* the directory's offset fits 32 bits: written, as Python's zipfile
     * does (min(offset, 0xffffffff)); readers take the zip64 record */
    assert_int_equal(le(end + 16, 4), data_end);
    free(k);
}

/* ---------------------------------------------------------------- telling formats apart */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_savez),
        cmocka_unit_test(test_savez_compressed),
        cmocka_unit_test(test_other_archives),
        cmocka_unit_test(test_numpy_object_archives),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_malformed_corpus),
        cmocka_unit_test(test_bomb_within_ratio),
        cmocka_unit_test(test_writer_matches_python),
        cmocka_unit_test(test_writer_zip64),
        cmocka_unit_test(test_writer_zip64_natural),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_writer_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
