/* fuzz_check.h - checks shared by the fuzz targets: what the library
 * promises about every result, whatever the input bytes were.
 *
 * A broken promise aborts, which libFuzzer reports as a crash and saves the
 * input, like a memory error found by the sanitizers. */
#ifndef AFT_FUZZ_CHECK_H
#define AFT_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"

/* abort with a line saying which promise broke */
#define FUZZ_REQUIRE(cond)                                                         \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: promise broken: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                               \
        }                                                                          \
    } while (0)

/* reads stored here cannot be optimised away */
static volatile unsigned char fuzz_byte_sink;
static volatile float fuzz_float_sink;

/* aft.h: on failure err->msg is one line, no trailing newline. Also: not
 * empty, and no control characters, so a hostile file cannot put escape
 * sequences or line breaks into what the command line prints. */
static inline void fuzz_check_error(const aft_error *err)
{
    size_t n = strnlen(err->msg, sizeof err->msg);
    FUZZ_REQUIRE(n > 0 && n < sizeof err->msg);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)err->msg[i];
        FUZZ_REQUIRE(c >= 0x20 && c != 0x7f);
    }
}

/* aft.h: a tensor name as messages show it (aft_weights.unexpected,
 * aft_model_info.unused): ends within cap bytes, no control characters */
static inline void fuzz_check_shown(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    FUZZ_REQUIRE(n < cap);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        FUZZ_REQUIRE(c >= 0x20 && c != 0x7f);
    }
}

/* aft.h: a tensor's nelem is the product of its shape and nbytes is nelem
 * times the element size; data holds nbytes bytes. Reads every byte (so the
 * sanitizers see an out-of-bounds buffer) and converts small tensors. */
static inline void fuzz_check_tensor(const aft_tensor *t)
{
    FUZZ_REQUIRE(t->ndim <= AFT_MAX_DIMS);
    FUZZ_REQUIRE((unsigned)t->dtype < AFT_DTYPE_COUNT);
    size_t n = 1;
    for (size_t k = 0; k < t->ndim; k++) {
        FUZZ_REQUIRE(!__builtin_mul_overflow(n, t->shape[k], &n));
    }
    FUZZ_REQUIRE(n == t->nelem);
    size_t bytes;
    FUZZ_REQUIRE(!__builtin_mul_overflow(n, aft_dtype_size(t->dtype), &bytes));
    FUZZ_REQUIRE(bytes == t->nbytes);
    FUZZ_REQUIRE(t->nbytes == 0 || t->data != NULL);

    const unsigned char *p = t->data;
    for (size_t i = 0; i < t->nbytes; i++) fuzz_byte_sink = p[i];

    if (t->nbytes <= (1u << 20)) {
        float *f = NULL;
        aft_error err;
        if (aft_tensor_to_f32(t, &f, &err) == AFT_OK) {
            /* read the result too: every one of nelem floats must exist */
            for (size_t i = 0; i < t->nelem; i++) fuzz_float_sink = f[i];
            free(f);
        } else {
            fuzz_check_error(&err);
        }
    }
}

#endif
