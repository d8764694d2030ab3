/* formats.h - what the file readers share inside lib/: .npy images in
 * memory, and the named-tensor handle behind aft_st_open, which the
 * .safetensors parser (safetensors.c) and the .npz reader (npz.c) fill. */
#ifndef AFT_FORMATS_H
#define AFT_FORMATS_H

#include "internal.h"

/* .npy images in memory, beyond aft_npy_read_mem (npy.c):
 * view: as aft_npy_read_mem, but when the data is already native C order
 * the tensor borrows buf (owned NULL) instead of copying it;
 * owned: buf is a malloc'd block of len bytes that the call consumes,
 * reused for the data where it can (no second copy);
 * view_size: checks the image as the readers do and sets *copy_bytes to
 * what aft_npy_view_mem would allocate (0 when it borrows). */
aft_status aft_npy_view_mem(const void *buf, size_t len, aft_tensor *out, aft_npy_info *info, aft_error *err);
aft_status aft_npy_read_owned(void *buf, size_t len, aft_tensor *out, aft_npy_info *info, aft_error *err);
aft_status aft_npy_view_size(const void *buf, size_t len, size_t *copy_bytes, aft_error *err);

/* The handle behind aft_st_open: filled by the .safetensors parser
 * (safetensors.c) or the .npz reader (npz.c). */
struct aft_st_file {
    aft_format format;           /* AFT_FORMAT_SAFETENSORS or AFT_FORMAT_NPZ */
    const unsigned char *bytes;  /* the whole file: size bytes */
    size_t size;
    void *map;                   /* mmap of the file, or NULL */
    size_t map_size;
    unsigned char *owned;        /* file read from a pipe or stdin, or NULL */
    size_t n;
    aft_tensor *tensors;         /* (n) in file order: ascending data offset;
                                  * a .npz member's owned block is freed with f */
    const char **names;          /* (n) in file order, into strings */
    size_t *by_name;             /* (n) file positions sorted by name, for find */
    size_t nmeta;
    const char **meta;           /* (2 * nmeta) key, value pairs in header order */
    char *strings;               /* one block holding every name, key and value */
    int borrowed;                /* aft_st_borrow_f32's: the tensors are a caller's
                                  * float32 arrays, which aft_weights_load uses in
                                  * place */
};

/* Reads f->bytes[0..f->size) as a .npz archive into f's tables; tensors
 * allocated for members count against max_bytes (npz.c). On failure the
 * caller frees f with aft_st_close. */
aft_status aft_npz_parse(aft_st_file *f, size_t max_bytes, aft_error *err);

/* aft_npz_writer_new with every size and offset in zip64 records, as an
 * archive over 4 GiB has them (tests write such archives without 4 GiB) */
aft_status aft_npz_writer_new_zip64(FILE *fp, int force_zip64, aft_npz_writer **out, aft_error *err);

#endif /* AFT_FORMATS_H */
