/* internal.h - checked sizes and allocation, shared inside lib/; not part of
 * the public API. */
#ifndef AFT_INTERNAL_H
#define AFT_INTERNAL_H

#include "aft.h"

#include <stdbool.h>
#include <string.h>

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

/* malloc of n * size bytes with overflow check; NULL on overflow or failure.
 * n == 0 still returns a unique pointer. */
void *aft_alloc_array(size_t n, size_t size);
/* same, zero-filled */
void *aft_calloc_array(size_t n, size_t size);

/* threads 0 (every core) as a count >= 1 */
int aft_threads_or_all(int threads);

#endif /* AFT_INTERNAL_H */
