/* file.c - the binding interface's files (aft.h, "tensors from and to
 * files"): a .npy, .npz or .safetensors read by aft's own readers, with
 * the CLI's checks and refusals and its bound on the memory an archive's
 * members may take; tensors written atomically by aft's writers, the
 * format from the path's extension. */
#include "api.h"

#include <stdlib.h>
#include <string.h>

/* the most dimensions a tensor crossing the interface has (its shape slots) */
enum { API_MAX_DIMS = 8 };

struct aft_api_file {
    aft_st_file *st;   /* a .npz or .safetensors, or NULL */
    aft_tensor npy;    /* a .npy's one tensor */
};

/* tensors of more dimensions than the interface's slots are refused */
static aft_status check_dims(const aft_api_file *f, const char *path, aft_error *err)
{
    size_t n = aft_api_file_count(f);
    for (size_t i = 0; i < n; i++) {
        const char *name = "arr_0";
        const aft_tensor *t = f->st ? aft_st_get(f->st, i, &name) : &f->npy;
        char shown[96];
        if (t->ndim > API_MAX_DIMS)
            return aft_fail(err, AFT_ERR_FORMAT, "%s: tensor '%s' has %zu dimensions; the binding takes at most %d",
                            path, aft_shown(name, shown, 80), t->ndim, API_MAX_DIMS);
    }
    return AFT_OK;
}

aft_status aft_api_file_read(aft_api_file **out, const char *path, aft_error *err)
{
    if (!out) return api_null(err, "out");
    *out = NULL;
    if (!path) return api_null(err, "path");
    aft_api_file *f = calloc(1, sizeof *f);
    if (!f) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    /* as the commands tell a file's format: "-" and what its bytes do not
     * say go to the .npy reader, which says what is wrong */
    aft_format fmt;
    aft_status st = aft_file_format(path, &fmt, err);
    if (st == AFT_ERR_FORMAT) goto fail;
    if (fmt == AFT_FORMAT_NPZ || fmt == AFT_FORMAT_SAFETENSORS)
        st = aft_st_open_limit(path, aft_memory_limit(0), &f->st, err);
    else
        st = aft_npy_read(path, &f->npy, NULL, err);
    if (!st) st = check_dims(f, path, err);
    if (!st) {
        *out = f;
        return AFT_OK;
    }
fail:
    aft_api_file_free(f);
    return api_file_error(st, path, err);
}

void aft_api_file_free(aft_api_file *f)
{
    if (!f) return;
    aft_st_close(f->st);
    aft_tensor_free(&f->npy);
    free(f);
}

size_t aft_api_file_count(const aft_api_file *f)
{
    return !f ? 0 : f->st ? aft_st_count(f->st) : 1;
}

/* tensor i of f and its name; NULL when there is none */
static const aft_tensor *tensor_at(const aft_api_file *f, size_t i, const char **name, aft_error *err)
{
    if (!f) {
        api_null(err, "file");
        return NULL;
    }
    if (i >= aft_api_file_count(f)) {
        aft_fail(err, AFT_ERR_ARG, "no tensor %zu: the file holds %zu", i, aft_api_file_count(f));
        return NULL;
    }
    *name = "arr_0";
    return f->st ? aft_st_get(f->st, i, name) : &f->npy;
}

aft_status aft_api_file_tensor(const aft_api_file *f, size_t i, const char **name, const char **dtype, size_t *ndim,
                               size_t *shape, size_t *nbytes, aft_error *err)
{
    const char *nm;
    const aft_tensor *t = tensor_at(f, i, &nm, err);
    if (!t) return AFT_ERR_ARG;
    if (name) *name = nm;
    if (dtype) *dtype = aft_dtype_name(t->dtype);
    if (ndim) *ndim = t->ndim;
    for (size_t d = 0; shape && d < API_MAX_DIMS; d++) shape[d] = d < t->ndim ? t->shape[d] : 0;
    if (nbytes) *nbytes = t->nbytes;
    return AFT_OK;
}

aft_status aft_api_file_copy(const aft_api_file *f, size_t i, void *dst, size_t nbytes, aft_error *err)
{
    const char *nm;
    const aft_tensor *t = tensor_at(f, i, &nm, err);
    if (!t) return AFT_ERR_ARG;
    char shown[96];
    if (nbytes != t->nbytes)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s' holds %zu bytes, not %zu", aft_shown(nm, shown, 80),
                        t->nbytes, nbytes);
    if (!dst && nbytes) return api_null(err, "dst");
    if (nbytes) memcpy(dst, t->data, nbytes);
    return AFT_OK;
}

size_t aft_api_file_metadata_count(const aft_api_file *f)
{
    return f && f->st ? aft_st_metadata_count(f->st) : 0;
}

void aft_api_file_metadata(const aft_api_file *f, size_t i, const char **key, const char **value)
{
    if (f && f->st) {
        aft_st_metadata(f->st, i, key, value);
        return;
    }
    if (key) *key = NULL;
    if (value) *value = NULL;
}

/* ---------------------------------------------------------------- writing */

/* the caller's tensor i as an aft_tensor over its data */
static aft_status make_tensor(aft_tensor *t, const char *name, const char *dtype, size_t ndim, const size_t *shape,
                              const void *data, aft_error *err)
{
    char shown[96];
    const char *nm = name ? aft_shown(name, shown, 80) : "arr_0";
    memset(t, 0, sizeof *t);
    if (!dtype || aft_dtype_from_name(dtype, &t->dtype) != 0)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s': dtype '%s' is none of F64 F32 F16 BF16 BOOL U8 I8 I16 U16 "
                        "I32 U32 I64 U64", nm, dtype ? dtype : "(NULL)");
    if (ndim > API_MAX_DIMS)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s' has %zu dimensions; the binding takes at most %d", nm, ndim,
                        API_MAX_DIMS);
    if (ndim && !shape) return aft_fail(err, AFT_ERR_ARG, "tensor '%s': missing (NULL) shape", nm);
    t->ndim = ndim;
    t->nelem = 1;
    for (size_t d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        if (!aft_mul_ok(t->nelem, shape[d], &t->nelem))
            return aft_fail(err, AFT_ERR_ARG, "tensor '%s': its shape overflows", nm);
    }
    if (!aft_mul_ok(t->nelem, aft_dtype_size(t->dtype), &t->nbytes))
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s': its shape overflows", nm);
    if (!data && t->nbytes) return aft_fail(err, AFT_ERR_ARG, "tensor '%s': missing (NULL) data", nm);
    t->data = data;
    return AFT_OK;
}

/* which writer: 0 .npy, 1 .npz, 2 .safetensors, -1 none */
static int format_of(const char *path)
{
    static const char *const ext[] = {".npy", ".npz", ".safetensors"};
    size_t n = strlen(path);
    for (int i = 0; i < 3; i++) {
        size_t m = strlen(ext[i]);
        if (n > m && strcmp(path + n - m, ext[i]) == 0) return i;
    }
    return -1;
}

/* the tensors to path in its format */
static aft_status write_tensors(const char *path, int fmt, size_t n, const char *const *names, const aft_tensor *ts,
                                size_t n_meta, const char *const *meta, aft_error *err)
{
    if (fmt == 0 && (n != 1 || n_meta))
        return aft_fail(err, AFT_ERR_ARG, "a .npy holds one tensor and no metadata (given %zu and %zu)", n, n_meta);
    if (fmt == 1 && n_meta) return aft_fail(err, AFT_ERR_ARG, "a .npz holds no metadata (given %zu)", n_meta);
    if (fmt == 0) return aft_npy_write(path, &ts[0], err);
    if (fmt == 1) return aft_npz_write(path, names, ts, n, err);
    return aft_st_write(path, names, ts, n, meta, n_meta, err);
}

aft_status aft_api_file_write(const char *path, size_t n, const char *const *names, const char *const *dtypes,
                              const size_t *ndims, const size_t *const *shapes, const void *const *data,
                              size_t n_meta, const char *const *keys, const char *const *values, aft_error *err)
{
    if (!path) return api_null(err, "path");
    int fmt = format_of(path);
    if (fmt < 0)
        return api_file_error(aft_fail(err, AFT_ERR_ARG, "the format comes from the extension: .npy, .npz or "
                                       ".safetensors"), path, err);
    if (n && (!dtypes || !ndims || !shapes || !data || (fmt && !names)))
        return api_null(err, !dtypes ? "dtypes" : !ndims ? "ndims" : !shapes ? "shapes" : !data ? "data" : "names");
    if (n_meta && (!keys || !values)) return api_null(err, !keys ? "keys" : "values");
    aft_tensor *ts = aft_calloc_array(n, sizeof *ts);
    const char **meta = aft_calloc_array(n_meta, 2 * sizeof *meta);
    aft_status st = ts && meta ? AFT_OK : aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++) {
        if (fmt && !names[i]) st = aft_fail(err, AFT_ERR_ARG, "missing (NULL) name of tensor %zu", i);
        else st = make_tensor(&ts[i], names ? names[i] : NULL, dtypes[i], ndims[i], shapes[i], data[i], err);
    }
    for (size_t i = 0; !st && i < n_meta; i++) {
        meta[2 * i] = keys[i];
        meta[2 * i + 1] = values[i];
        if (!keys[i] || !values[i]) st = aft_fail(err, AFT_ERR_ARG, "missing (NULL) metadata key or value %zu", i);
    }
    if (!st) st = write_tensors(path, fmt, n, names, ts, n_meta, meta, err);
    free(ts);
    free(meta);
    return st ? api_file_error(st, path, err) : AFT_OK;
}
