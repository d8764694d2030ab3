/* test_file.c - the binding interface's files (lib/api/file.c):
 *  - .npy, .npz and .safetensors fixtures read through aft_api_file_read
 *    give the names, dtypes, shapes, bytes and metadata aft_npy_read and
 *    aft_st_open give (a .npy's one tensor named "arr_0");
 *  - every file of the malformed corpus (but the states) is refused with its expected
 *    message, naming the file, and a few with exactly the message aft info
 *    prints for them;
 *  - aft_api_file_write writes the bytes aft_npy_write, aft_npz_write and
 *    aft_st_write write, and reads back;
 *  - the refusals: an unknown extension, a .npy of two tensors or with
 *    metadata, a .npz with metadata, an unknown dtype, more than 8
 *    dimensions (writing and reading), a copy of the wrong size, a tensor
 *    past the end, NULLs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "aft.h"
#include "aftrun.h"
#include "files.h"

/* f's tensor i against t, named name: the same description and bytes */
static void same_tensor(const aft_api_file *f, size_t i, const char *name, const aft_tensor *t)
{
    const char *nm, *dt;
    size_t ndim, shape[8], nbytes;
    aft_error err;
    assert_int_equal(aft_api_file_tensor(f, i, &nm, &dt, &ndim, shape, &nbytes, &err), AFT_OK);
    assert_string_equal(nm, name);
    assert_string_equal(dt, aft_dtype_name(t->dtype));
    assert_int_equal(ndim, t->ndim);
    for (size_t d = 0; d < 8; d++) assert_int_equal(shape[d], d < t->ndim ? t->shape[d] : 0);
    assert_int_equal(nbytes, t->nbytes);
    unsigned char *b = malloc(nbytes + 1);
    assert_non_null(b);
    assert_int_equal(aft_api_file_copy(f, i, b, nbytes, &err), AFT_OK);
    assert_memory_equal(b, t->data, nbytes);
    free(b);
}

static void test_npy(void **state)
{
    (void)state;
    static const char *const names[] = {"scalar_f4.npy", "scalar_be_f8.npy", "mat3x5_F_be_i2.npy", "empty_0x3.npy",
                                        "dims32_u1.npy", "eq_b1.npy"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const char *path = files_fixture("npy", names[k]);
        aft_tensor t;
        aft_error err;
        assert_int_equal(aft_npy_read(path, &t, NULL, &err), AFT_OK);
        aft_api_file *f = NULL;
        aft_status st = aft_api_file_read(&f, path, &err);
        if (t.ndim > 8) {   /* dims32: more than the interface's shape slots */
            assert_int_equal(st, AFT_ERR_FORMAT);
            assert_non_null(strstr(err.msg, "tensor 'arr_0' has 32 dimensions; the binding takes at most 8"));
            assert_true(strncmp(err.msg, path, strlen(path)) == 0);
            assert_null(f);
            aft_tensor_free(&t);
            continue;
        }
        assert_int_equal(st, AFT_OK);
        assert_int_equal(aft_api_file_count(f), 1);
        assert_int_equal(aft_api_file_metadata_count(f), 0);
        same_tensor(f, 0, "arr_0", &t);
        aft_api_file_free(f);
        aft_tensor_free(&t);
    }
}

/* a .npz or .safetensors against aft_st_open's view of it */
static void same_archive(const char *path)
{
    aft_st_file *st;
    aft_error err;
    assert_int_equal(aft_st_open(path, &st, &err), AFT_OK);
    aft_api_file *f;
    if (aft_api_file_read(&f, path, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    assert_int_equal(aft_api_file_count(f), aft_st_count(st));
    for (size_t i = 0; i < aft_st_count(st); i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(st, i, &name);
        same_tensor(f, i, name, t);
    }
    assert_int_equal(aft_api_file_metadata_count(f), aft_st_metadata_count(st));
    for (size_t i = 0; i < aft_st_metadata_count(st); i++) {
        const char *k1, *v1, *k2, *v2;
        aft_st_metadata(st, i, &k1, &v1);
        aft_api_file_metadata(f, i, &k2, &v2);
        assert_string_equal(k1, k2);
        assert_string_equal(v1, v2);
    }
    const char *k = "x", *v = "x";
    aft_api_file_metadata(f, aft_st_metadata_count(st), &k, &v);
    assert_null(k);
    assert_null(v);
    aft_api_file_free(f);
    aft_st_close(st);
}

static void test_archives(void **state)
{
    (void)state;
    same_archive(files_fixture("npz", "savez.npz"));
    same_archive(files_fixture("npz", "savez_compressed.npz"));
    same_archive(files_fixture("npz", "weights_labml_local_deflated.npz"));
    same_archive(files_fixture("npz", "zip64.npz"));
    same_archive(files_fixture("st", "dtypes.safetensors"));
    same_archive(files_fixture("st", "metadata.safetensors"));
    same_archive(files_fixture("st", "unaligned.safetensors"));
    same_archive(files_fixture("st", "zero_size.safetensors"));
    same_archive(files_fixture("torch", "labml_local/weights.safetensors"));
}

/* every malformed file refused, its message naming it and holding the
 * expected words (testdata/malformed/expected.tsv) */
static void test_malformed(void **state)
{
    (void)state;
    size_t len;
    char *tsv = (char *)files_slurp(files_fixture("malformed", "expected.tsv"), &len);
    size_t checked = 0;
    for (char *line = strtok(tsv, "\n"); line; line = strtok(NULL, "\n")) {
        char *tab = strchr(line, '\t');
        if (line[0] == '#' || !tab || strncmp(line, "state_", 6) == 0) continue;   /* states: aft run's */
        *tab = 0;
        const char *path = files_fixture("malformed", line);
        aft_api_file *f = (aft_api_file *)1;
        aft_error err = {{0}};
        aft_status st = aft_api_file_read(&f, path, &err);
        if (st == AFT_OK) fail_msg("%s: read, not refused", path);
        assert_null(f);
        if (strncmp(err.msg, path, strlen(path)) != 0 || !strstr(err.msg, tab + 1))
            fail_msg("%s: '%s' lacks '%s'", path, err.msg, tab + 1);
        assert_null(strchr(err.msg, '\n'));
        checked++;
    }
    free(tsv);
    assert_true(checked > 100);
}

/* the message aft info prints, without "aft info: " */
static void same_as_cli(const char *path)
{
    const char *out = aftrun_tmp("info.err");
    assert_int_equal(aftrun(NULL, out, (const char *const[]){"info", path, NULL}), 1);
    size_t len;
    char *msg = (char *)files_slurp(out, &len);
    assert_true(len > 11 && strncmp(msg, "aft info: ", 10) == 0 && msg[len - 1] == '\n');
    msg[len - 1] = 0;
    aft_api_file *f;
    aft_error err;
    assert_int_not_equal(aft_api_file_read(&f, path, &err), AFT_OK);
    assert_string_equal(err.msg, msg + 10);
    free(msg);
}

static void test_as_cli(void **state)
{
    (void)state;
    same_as_cli(files_fixture("malformed", "npy_bad_magic.npy"));
    same_as_cli(files_fixture("malformed", "npy_dims_overflow.npy"));
    same_as_cli(files_fixture("npy", "bad_object.npy"));
    same_as_cli(files_fixture("malformed", "st_header_is_array.safetensors"));
    same_as_cli(files_fixture("malformed", "npz_crc_mismatch.npz"));
    same_as_cli(aftrun_tmp("no such file.npy"));
    same_as_cli(aftrun_dir());
}

/* ---------------------------------------------------------------- writing */

static const float vals[6] = {1.5f, -2, 0.25f, 3, -0.5f, 8};
static const int16_t ivals[3] = {-7, 0, 300};

static void test_write(void **state)
{
    (void)state;
    aft_error err;
    const char *names[2] = {"w", "ids"}, *dtypes[2] = {"F32", "I16"};
    const size_t s0[2] = {2, 3}, s1[1] = {3}, ndims[2] = {2, 1};
    const size_t *shapes[2] = {s0, s1};
    const void *data[2] = {vals, ivals};
    const char *keys[2] = {"format", "note"}, *values[2] = {"pt", "written by the test"};
    aft_tensor ts[2] = {{.dtype = AFT_F32, .ndim = 2, .shape = {2, 3}, .nelem = 6, .nbytes = 24, .data = vals},
                        {.dtype = AFT_I16, .ndim = 1, .shape = {3}, .nelem = 3, .nbytes = 6, .data = ivals}};
    const char *meta[4] = {"format", "pt", "note", "written by the test"};

    assert_int_equal(aft_api_file_write(aftrun_tmp("a.safetensors"), 2, names, dtypes, ndims, shapes, data, 2, keys,
                                        values, &err), AFT_OK);
    assert_int_equal(aft_st_write(aftrun_tmp("b.safetensors"), names, ts, 2, meta, 2, &err), AFT_OK);
    aftrun_same_files(aftrun_tmp("a.safetensors"), aftrun_tmp("b.safetensors"));
    same_archive(aftrun_tmp("a.safetensors"));

    assert_int_equal(aft_api_file_write(aftrun_tmp("a.npz"), 2, names, dtypes, ndims, shapes, data, 0, NULL, NULL,
                                        &err), AFT_OK);
    assert_int_equal(aft_npz_write(aftrun_tmp("b.npz"), names, ts, 2, &err), AFT_OK);
    aftrun_same_files(aftrun_tmp("a.npz"), aftrun_tmp("b.npz"));
    same_archive(aftrun_tmp("a.npz"));

    /* a .npy: one tensor, its name not stored */
    assert_int_equal(aft_api_file_write(aftrun_tmp("a.npy"), 1, NULL, dtypes, ndims, shapes, data, 0, NULL, NULL,
                                        &err), AFT_OK);
    assert_int_equal(aft_npy_write(aftrun_tmp("b.npy"), &ts[0], &err), AFT_OK);
    aftrun_same_files(aftrun_tmp("a.npy"), aftrun_tmp("b.npy"));
    aft_api_file *f;
    assert_int_equal(aft_api_file_read(&f, aftrun_tmp("a.npy"), &err), AFT_OK);
    same_tensor(f, 0, "arr_0", &ts[0]);
    aft_api_file_free(f);

    /* an empty .safetensors, and a 0-d tensor */
    const size_t *noshape[1] = {NULL}, nodims[1] = {0};
    assert_int_equal(aft_api_file_write(aftrun_tmp("e.safetensors"), 0, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL,
                                        &err), AFT_OK);
    assert_int_equal(aft_api_file_write(aftrun_tmp("s.npy"), 1, NULL, dtypes, nodims, noshape, data, 0, NULL, NULL,
                                        &err), AFT_OK);
}

/* the write refused: AFT_ERR_ARG, a line holding want */
static void write_refused(const char *path, size_t n, const char *const *dtypes, const size_t *ndims,
                          const size_t *const *shapes, size_t n_meta, const char *want)
{
    const char *names[2] = {"a", "b"}, *keys[1] = {"k"}, *values[1] = {"v"};
    const void *data[2] = {vals, vals};
    aft_error err = {{0}};
    assert_int_equal(aft_api_file_write(path, n, names, dtypes, ndims, shapes, data, n_meta, keys, values, &err),
                     AFT_ERR_ARG);
    if (!strstr(err.msg, want)) fail_msg("'%s' lacks '%s'", err.msg, want);
    assert_null(strchr(err.msg, '\n'));
    assert_int_not_equal(access(path, F_OK), 0);   /* nothing written */
}

static void test_write_refusals(void **state)
{
    (void)state;
    const char *f32[2] = {"F32", "F32"}, *bad[2] = {"F32", "float32"};
    const size_t s6[1] = {6}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 6}, nd[2] = {1, 1}, nd9[2] = {9, 1};
    const size_t *shapes[2] = {s6, s6}, *shapes9[2] = {s9, s6};
    write_refused(aftrun_tmp("x.txt"), 1, f32, nd, shapes, 0, "x.txt: the format comes from the extension: .npy, "
                  ".npz or .safetensors");
    write_refused(aftrun_tmp("x.npy"), 2, f32, nd, shapes, 0, "x.npy: a .npy holds one tensor and no metadata "
                  "(given 2 and 0)");
    write_refused(aftrun_tmp("x.npy"), 1, f32, nd, shapes, 1, "a .npy holds one tensor and no metadata");
    write_refused(aftrun_tmp("x.npz"), 1, f32, nd, shapes, 1, "x.npz: a .npz holds no metadata (given 1)");
    write_refused(aftrun_tmp("x.safetensors"), 2, bad, nd, shapes, 0, "tensor 'b': dtype 'float32' is none of F64");
    write_refused(aftrun_tmp("x.safetensors"), 2, f32, nd9, shapes9, 0,
                  "tensor 'a' has 9 dimensions; the binding takes at most 8");
    const char *bf16[1] = {"BF16"};
    write_refused(aftrun_tmp("x.npy"), 1, bf16, nd, shapes, 0, "x.npy: bfloat16 cannot be stored in .npy");
    const char *dup[2] = {"a", "a"};
    const void *data[2] = {vals, vals};
    aft_error err;
    assert_int_equal(aft_api_file_write(aftrun_tmp("d.safetensors"), 2, dup, f32, nd, shapes, data, 0, NULL, NULL,
                                        &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "d.safetensors: "));
    /* NULLs */
    assert_int_equal(aft_api_file_write(NULL, 0, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) path");
    assert_int_equal(aft_api_file_write(aftrun_tmp("n.npz"), 1, NULL, f32, nd, shapes, data, 0, NULL, NULL, &err),
                     AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) names");
    assert_int_equal(aft_api_file_write(aftrun_tmp("n.npz"), 1, dup, f32, nd, shapes, (const void *const[]){NULL}, 0,
                                        NULL, NULL, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "n.npz: tensor 'a': missing (NULL) data"));
    assert_int_equal(aft_api_file_write(aftrun_tmp("n.safetensors"), 0, NULL, NULL, NULL, NULL, NULL, 1, NULL, NULL,
                                        NULL), AFT_ERR_ARG);
}

static void test_read_refusals(void **state)
{
    (void)state;
    aft_error err;
    aft_api_file *f;
    assert_int_equal(aft_api_file_read(NULL, "x.npy", &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_file_read(&f, NULL, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) path");
    assert_int_equal(aft_api_file_read(&f, files_fixture("npz", "savez.npz"), &err), AFT_OK);
    size_t n = aft_api_file_count(f), nbytes;
    assert_int_equal(aft_api_file_tensor(f, n, NULL, NULL, NULL, NULL, NULL, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "no tensor"));
    assert_int_equal(aft_api_file_tensor(f, 0, NULL, NULL, NULL, NULL, &nbytes, &err), AFT_OK);
    char *b = malloc(nbytes + 2);
    assert_int_equal(aft_api_file_copy(f, 0, b, nbytes + 1, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "bytes, not"));
    assert_int_equal(aft_api_file_copy(f, 0, NULL, nbytes, &err), nbytes ? AFT_ERR_ARG : AFT_OK);
    assert_int_equal(aft_api_file_copy(NULL, 0, b, nbytes, &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_file_tensor(NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL), AFT_ERR_ARG);
    free(b);
    aft_api_file_free(f);
    aft_api_file_free(NULL);
    assert_int_equal(aft_api_file_count(NULL), 0);
    assert_int_equal(aft_api_file_metadata_count(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy),          cmocka_unit_test(test_archives),
        cmocka_unit_test(test_malformed),    cmocka_unit_test(test_as_cli),
        cmocka_unit_test(test_write),        cmocka_unit_test(test_write_refusals),
        cmocka_unit_test(test_read_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, aftrun_cleanup);
}
