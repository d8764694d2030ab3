/* internal.h - checked sizes and allocation, shared inside lib/; not part of
 * the public API. */
#ifndef AFT_INTERNAL_H
#define AFT_INTERNAL_H

#include "aft.h"

#include <stdbool.h>
#include <string.h>

/* 1 on a little-endian machine (the byte order .npy, .npz and .safetensors
 * data is written in here), else 0 */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define AFT_HOST_LITTLE 0
#else
#define AFT_HOST_LITTLE 1
#endif

/* checked size arithmetic: return false on overflow */
static inline bool aft_mul_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool aft_add_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
/* a * b * c, false on overflow */
static inline bool aft_mul3_ok(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return aft_mul_ok(a, b, &ab) && aft_mul_ok(ab, c, out);
}

/* 1 when products under precision p run in bf16: BF16 asked for and the
 * CPU has an engine (else they run in float32, as F32's) */
int aft_bf16_wanted(aft_precision p);

/* malloc of n * size bytes with overflow check; NULL on overflow or failure.
 * n == 0 still returns a unique pointer. */
void *aft_alloc_array(size_t n, size_t size);
/* same, zero-filled */
void *aft_calloc_array(size_t n, size_t size);
/* 16-bit weights kept as stored (the layer's projections, the model's
 * products and embedding): element i of an array of dt (AFT_F32, AFT_F16,
 * AFT_BF16; any alignment) as float32, exact; n of them widened into y (n
 * floats), or into a new array (malloc'd; NULL when out of memory); and
 * t's values copied as stored (its dtype's bytes, malloc'd) */
float aft_w_at(const void *w, aft_dtype dt, size_t i);
void aft_w_widen_into(float *y, const void *w, aft_dtype dt, size_t n);
float *aft_w_widen(const void *w, aft_dtype dt, size_t n);
aft_status aft_tensor_copy(const aft_tensor *t, void **out, aft_error *err);
/* 1 for AFT_F16 and AFT_BF16 */
static inline int aft_dtype_is16(aft_dtype dt)
{
    return dt == AFT_F16 || dt == AFT_BF16;
}
/* n floats set to 0 without reading them into the cache first (streaming
 * stores where the machine has them): a large array that a pass will
 * write only a little of, such as a [Tmax, Tmax] bias gradient of which a
 * local run writes a band. 64 MiB took 2.1 ms where memset took 5.6. */
void aft_zero_stream(float *p, size_t n);
/* dst[0 .. n) = src[0 .. n) the same way (dst not read into the cache) */
void aft_copy_stream(float *dst, const float *src, size_t n);

/* Asks the cache for the lines of p[0 .. n), to read or (write, a
 * constant) to write: for rows a page or more apart, which the machine's
 * prefetcher does not follow from one to the next */
static inline __attribute__((always_inline)) void aft_lines_prefetch(const float *p, size_t n, int write)
{
    enum { LINE_FLOATS = 16 };   /* a 64-byte line */
    if (n == 0) return;
    for (size_t i = 0; i < n; i += LINE_FLOATS) {
        if (write) __builtin_prefetch(p + i, 1, 3);
        else __builtin_prefetch(p + i, 0, 3);
    }
    if (write) __builtin_prefetch(p + n - 1, 1, 3);   /* a last line the steps passed over */
    else __builtin_prefetch(p + n - 1, 0, 3);
}

/* the index of v in sorted[0 .. n) (ascending, n >= 1, v one of them):
 * a binary search */
size_t aft_sorted_index(const size_t *sorted, size_t n, size_t v);

/* the well-formed UTF-8 character at s (n >= 1 bytes left): its length,
 * and its code point in *cp (when cp is not NULL); 0 when there is none.
 * The one UTF-8 decoder: aft_utf8_prefix and aft_utf8_valid (aft.h) and
 * the messages' text are made from it. */
size_t aft_utf8_char(const unsigned char *s, size_t n, uint32_t *cp);
/* code point cp (<= 0x10ffff) as UTF-8 into out (room for 4): its length */
size_t aft_utf8_put(unsigned char *out, uint32_t cp);
/* str for a message: at most `limit` bytes of whole UTF-8 characters (then
 * "..."), control characters and invalid UTF-8 shown as '?', so the message
 * stays one line of valid text whatever a file holds; buf: limit + 4 bytes */
const char *aft_shown(const char *str, char *buf, size_t limit);
/* the same cut short to fit cap bytes (limit cap - 4), and with the C1
 * controls (U+0080..U+009F) also shown as '?'. The model's messages use it;
 * the readers' keep C1 characters as they are. */
void aft_show_text(char *buf, size_t cap, const char *str);
/* a control character (C0, DEL or C1), never printed as itself in a message */
static inline bool aft_is_control(uint32_t cp)
{
    return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0);
}

/* The caller's progress counter (aft.h), NULL for none: a call takes on n
 * units of work (aft_progress_plan returns p, for the settled operator's
 * field), and n of them are finished; relaxed atomic adds, made a block
 * of rows or a sequence at a time */
static inline aft_progress *aft_progress_plan(aft_progress *p, size_t n)
{
    if (p && n) __atomic_fetch_add(&p->total, n, __ATOMIC_RELAXED);
    return p;
}
static inline void aft_progress_done(aft_progress *p, size_t n)
{
    if (p && n) __atomic_fetch_add(&p->done, n, __ATOMIC_RELAXED);
}
/* the units finished so far (0 without a counter) */
static inline size_t aft_progress_seen(const aft_progress *p)
{
    return p ? __atomic_load_n(&p->done, __ATOMIC_RELAXED) : 0;
}

/* a count's noun in a message: one when n is 1, else many ("1 byte", "2 bytes") */
static inline const char *aft_noun(unsigned long long n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

/* A named-tensor handle (aft_st_find, aft_weights_load, ...) over n of a
 * caller's float32 arrays: names[i], data[i] of shape shapes[i] (ndims[i]
 * entries, at most AFT_MAX_DIMS), C order. Nothing is copied: the names,
 * the shapes' arrays and the data must outlive the handle, and
 * aft_weights_load takes the arrays themselves as the layer's parameters
 * (aft_st_borrowed). Names must be unique; AFT_ERR_ARG otherwise, or for
 * a NULL, or for sizes that overflow. Close it with aft_st_close. */
aft_status aft_st_borrow_f32(aft_st_file **out, size_t n, const char *const *names, const float *const *data,
                             const size_t *ndims, const size_t *const *shapes, aft_error *err);
/* 1 when f is aft_st_borrow_f32's */
int aft_st_borrowed(const aft_st_file *f);

/* threads 0 (every core) as a count >= 1 */
int aft_threads_or_all(int threads);

#endif /* AFT_INTERNAL_H */
