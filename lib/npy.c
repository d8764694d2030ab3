/* npy.c - NumPy .npy reader and writer.
 *
 * File layout (format versions 1.0, 2.0, 3.0):
 *   bytes 0..5   magic "\x93NUMPY"
 *   byte  6, 7   major, minor version
 *   then         header length: 2 bytes little-endian (1.0) or 4 bytes (2.0, 3.0)
 *   then         the header: a Python dict literal
 *                  {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *                padded with spaces and ending in '\n' (latin1 text for 1.0 and
 *                2.0, utf8 for 3.0)
 *   then         the array data, nelem * itemsize bytes, nothing after it.
 *
 * The file is untrusted: the header is parsed by a small strict parser (never
 * evaluated), every size is overflow-checked, and the data size is compared
 * with the bytes actually present before anything is allocated for it.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_HEADER 10000   /* numpy refuses longer headers for safety; so do we */
#define NPY_ALIGN 64           /* numpy pads so the data starts on this boundary */
#define NPY_GROWTH_DIGITS 21   /* numpy leaves room for the first axis to grow to 21 digits */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_LITTLE 0
#else
#define HOST_LITTLE 1
#endif

/* ---------------------------------------------------------------- dtypes */

/* numpy's kind+size spelling of each dtype we accept; the byte-order
 * character is handled separately. */
static const struct { const char *code; aft_dtype dt; } npy_types[] = {
    {"f2", AFT_F16}, {"f4", AFT_F32}, {"f8", AFT_F64}, {"b1", AFT_BOOL},
    {"u1", AFT_U8},  {"i1", AFT_I8},  {"i2", AFT_I16}, {"u2", AFT_U16},
    {"i4", AFT_I32}, {"u4", AFT_U32}, {"i8", AFT_I64}, {"u8", AFT_U64},
};
#define N_NPY_TYPES (sizeof npy_types / sizeof npy_types[0])

const char *aft_npy_code(aft_dtype dt)
{
    for (size_t i = 0; i < N_NPY_TYPES; i++)
        if (npy_types[i].dt == dt) return npy_types[i].code;
    return NULL;
}

/* Copies up to 24 bytes of untrusted text into out for an error message,
 * with anything unprintable shown as '?', so a hostile header cannot put
 * control characters or a newline into the one-line message. */
static void printable(char out[32], const unsigned char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && i < 24; i++)
        out[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    if (n > 24) { memcpy(out + k, "...", 3); k += 3; }
    out[k] = '\0';
}

/* ---------------------------------------------------------------- header parser */

typedef struct {
    const unsigned char *s;   /* the header text, without its final '\n' */
    size_t pos, end;
    size_t base;              /* file offset of s[0], for messages */
    aft_error *err;
} hparser;

typedef struct {
    const unsigned char *descr;
    size_t descr_len;
    int fortran;
    size_t ndim;
    size_t shape[AFT_MAX_DIMS];
} hfields;

/* whitespace Python accepts between tokens inside brackets */
static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static int is_ident(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c >= 0x80;
}

static void skip_ws(hparser *P)
{
    while (P->pos < P->end && is_ws(P->s[P->pos])) P->pos++;
}

/* the next byte, or -1 at the end of the header */
static int peek(const hparser *P)
{
    return P->pos < P->end ? P->s[P->pos] : -1;
}

static aft_status syntax(hparser *P, const char *what)
{
    return aft_fail(P->err, AFT_ERR_FORMAT, "bad .npy header: %s at byte %zu",
                    what, P->base + P->pos);
}

/* A plain quoted string, single or double quotes. Escapes, prefixes (b'', u'')
 * and triple quotes never occur in numpy's own headers, so they are refused
 * rather than half-supported. */
static aft_status parse_string(hparser *P, const unsigned char **str, size_t *len)
{
    int q = peek(P);
    if (q != '\'' && q != '"') return syntax(P, "expected a quoted string");
    size_t start = ++P->pos;
    while (P->pos < P->end && P->s[P->pos] != q) {
        unsigned char c = P->s[P->pos];
        if (c == '\\') return syntax(P, "escape sequences are not supported in strings");
        if (c == '\n' || c == '\r') return syntax(P, "unterminated string");
        P->pos++;
    }
    if (P->pos >= P->end) return syntax(P, "unterminated string");
    *str = P->s + start;
    *len = P->pos - start;
    P->pos++;   /* the closing quote */
    return AFT_OK;
}

/* One non-negative decimal dimension, as Python writes an int. */
static aft_status parse_dim(hparser *P, size_t *out)
{
    int c = peek(P);
    if (c == '-') return aft_fail(P->err, AFT_ERR_FORMAT, "negative dimension in shape");
    if (c == '.' || (c >= 0 && is_ident((unsigned char)c) && !(c >= '0' && c <= '9')))
        return aft_fail(P->err, AFT_ERR_FORMAT, "non-integer dimension in shape at byte %zu",
                        P->base + P->pos);
    if (c < '0' || c > '9') return syntax(P, "expected a dimension in shape");
    size_t start = P->pos, v = 0;
    while (P->pos < P->end && P->s[P->pos] >= '0' && P->s[P->pos] <= '9') {
        /* v = 10 v + digit, refusing values that do not fit in size_t */
        if (!aft_mul_ok(v, 10, &v) || !aft_add_ok(v, (size_t)(P->s[P->pos] - '0'), &v))
            return aft_fail(P->err, AFT_ERR_FORMAT, "dimension too large in shape");
        P->pos++;
    }
    c = peek(P);
    if (c == 'L' || c == 'l')
        return aft_fail(P->err, AFT_ERR_FORMAT,
                        "Python 2 long suffix 'L' in shape is not supported");
    if (c == '.' || c == 'e' || c == 'E' || c == 'j' || c == 'J' || (c >= 0 && is_ident((unsigned char)c)))
        return aft_fail(P->err, AFT_ERR_FORMAT, "non-integer dimension in shape at byte %zu",
                        P->base + start);
    /* Python 3 rejects "007"; Python 2 read it as octal. Either way not numpy's. */
    if (P->pos - start > 1 && P->s[start] == '0')
        return aft_fail(P->err, AFT_ERR_FORMAT, "dimension with a leading zero in shape at byte %zu",
                        P->base + start);
    *out = v;
    return AFT_OK;
}

/* A tuple of dimensions: "()", "(3,)", "(2, 3)", "(2, 3,)". "(3)" is a
 * parenthesised int in Python, not a tuple, so it is refused. */
static aft_status parse_shape(hparser *P, hfields *h)
{
    if (peek(P) != '(') return aft_fail(P->err, AFT_ERR_FORMAT, "'shape' must be a tuple");
    P->pos++;
    h->ndim = 0;
    skip_ws(P);
    if (peek(P) == ')') { P->pos++; return AFT_OK; }
    for (;;) {
        if (h->ndim == AFT_MAX_DIMS)
            return aft_fail(P->err, AFT_ERR_FORMAT, "too many dimensions in shape (at most %d)",
                            AFT_MAX_DIMS);
        aft_status st = parse_dim(P, &h->shape[h->ndim]);
        if (st) return st;
        h->ndim++;
        skip_ws(P);
        int c = peek(P);
        if (c == ')') {
            if (h->ndim == 1) return aft_fail(P->err, AFT_ERR_FORMAT,
                                              "'shape' must be a tuple (one dimension needs a trailing comma)");
            P->pos++;
            return AFT_OK;
        }
        if (c != ',') return syntax(P, "expected ',' or ')' in shape");
        P->pos++;
        skip_ws(P);
        if (peek(P) == ')') { P->pos++; return AFT_OK; }   /* trailing comma */
    }
}

static aft_status parse_bool(hparser *P, int *out)
{
    size_t start = P->pos;
    while (P->pos < P->end && is_ident(P->s[P->pos])) P->pos++;
    size_t n = P->pos - start;
    if (n == 4 && memcmp(P->s + start, "True", 4) == 0) { *out = 1; return AFT_OK; }
    if (n == 5 && memcmp(P->s + start, "False", 5) == 0) { *out = 0; return AFT_OK; }
    return aft_fail(P->err, AFT_ERR_FORMAT, "'fortran_order' must be True or False");
}

/* The whole header: exactly one dict with the keys 'descr', 'fortran_order'
 * and 'shape', each once, in any order, optional trailing comma, then only
 * padding. */
static aft_status parse_header(hparser *P, hfields *h)
{
    enum { K_DESCR = 1, K_FORTRAN = 2, K_SHAPE = 4 };
    unsigned seen = 0;
    aft_status st;

    skip_ws(P);
    if (peek(P) != '{') return syntax(P, "expected '{' (the header must be a dict)");
    P->pos++;
    for (;;) {
        skip_ws(P);
        if (peek(P) == '}') { P->pos++; break; }   /* empty dict or trailing comma */
        const unsigned char *key;
        size_t klen;
        if ((st = parse_string(P, &key, &klen))) return st;
        unsigned k = 0;
        if (klen == 5 && memcmp(key, "descr", 5) == 0) k = K_DESCR;
        else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) k = K_FORTRAN;
        else if (klen == 5 && memcmp(key, "shape", 5) == 0) k = K_SHAPE;
        char shown[32];
        printable(shown, key, klen);
        if (!k) return aft_fail(P->err, AFT_ERR_FORMAT, "unexpected key '%s' in .npy header", shown);
        if (seen & k) return aft_fail(P->err, AFT_ERR_FORMAT, "duplicate key '%s' in .npy header", shown);
        seen |= k;
        skip_ws(P);
        if (peek(P) != ':') return syntax(P, "expected ':' after a key");
        P->pos++;
        skip_ws(P);
        if (k == K_DESCR) {
            int c = peek(P);
            if (c == '[')
                return aft_fail(P->err, AFT_ERR_FORMAT,
                                "structured dtypes are not supported (descr is a list)");
            if (c != '\'' && c != '"')
                return aft_fail(P->err, AFT_ERR_FORMAT, "'descr' must be a string");
            if ((st = parse_string(P, &h->descr, &h->descr_len))) return st;
        } else if (k == K_FORTRAN) {
            if ((st = parse_bool(P, &h->fortran))) return st;
        } else {
            if ((st = parse_shape(P, h))) return st;
        }
        skip_ws(P);
        int c = peek(P);
        if (c == ',') { P->pos++; continue; }
        if (c == '}') { P->pos++; break; }
        return syntax(P, "expected ',' or '}' after a value");
    }
    skip_ws(P);
    if (P->pos != P->end) return syntax(P, "unexpected text after the dict");
    if (!(seen & K_DESCR)) return aft_fail(P->err, AFT_ERR_FORMAT, "missing key 'descr' in .npy header");
    if (!(seen & K_FORTRAN))
        return aft_fail(P->err, AFT_ERR_FORMAT, "missing key 'fortran_order' in .npy header");
    if (!(seen & K_SHAPE)) return aft_fail(P->err, AFT_ERR_FORMAT, "missing key 'shape' in .npy header");
    return AFT_OK;
}

/* Maps descr ("<f4", "|b1", ...) to our dtype and whether the file's bytes are
 * little-endian. '=' is "native" of the writer; numpy never writes it, and we
 * take it as little-endian like every machine we run on. */
static aft_status parse_descr(const unsigned char *d, size_t n, aft_dtype *dt, int *little,
                              aft_error *err)
{
    char shown[32];
    printable(shown, d, n);
    if (memchr(d, 'O', n))
        return aft_fail(err, AFT_ERR_FORMAT,
                        "unsupported dtype '%s' (object arrays would need unpickling)", shown);
    /* d[0] != 0: strchr would find the string's own terminator */
    if (n == 3 && d[0] != 0 && strchr("<>|=", d[0])) {
        for (size_t i = 0; i < N_NPY_TYPES; i++) {
            if (memcmp(d + 1, npy_types[i].code, 2) != 0) continue;
            size_t size = aft_dtype_size(npy_types[i].dt);
            /* '|' means "byte order does not apply": only right for 1-byte types */
            if (d[0] == '|' && size != 1)
                return aft_fail(err, AFT_ERR_FORMAT,
                                "unsupported dtype '%s' (byte order '|' on a multi-byte type)", shown);
            *dt = npy_types[i].dt;
            *little = d[0] != '>';
            return AFT_OK;
        }
    }
    return aft_fail(err, AFT_ERR_FORMAT, "unsupported dtype '%s'", shown);
}

/* ---------------------------------------------------------------- data conversion */

/* reverses the bytes of each of n elements of size 2, 4 or 8, in place */
static void byteswap(unsigned char *p, size_t n, size_t size)
{
    for (size_t i = 0; i < n; i++, p += size) {
        if (size == 2) {
            uint16_t v; memcpy(&v, p, 2); v = __builtin_bswap16(v); memcpy(p, &v, 2);
        } else if (size == 4) {
            uint32_t v; memcpy(&v, p, 4); v = __builtin_bswap32(v); memcpy(p, &v, 4);
        } else if (size == 8) {
            uint64_t v; memcpy(&v, p, 8); v = __builtin_bswap64(v); memcpy(p, &v, 8);
        }
    }
}

/* dst: C order   src: Fortran order   both of shape dims[ndim], size-byte elements.
 * Walks dst in C order with an odometer of indices and keeps the matching
 * Fortran offset, src_off = sum_k idx[k] * fstride[k] with fstride[0] = 1 and
 * fstride[k] = fstride[k-1] * dims[k-1]. Requires nelem > 0 (so every stride
 * is at most nelem and cannot overflow). */
static void fortran_to_c(unsigned char *dst, const unsigned char *src, const size_t *dims,
                         size_t ndim, size_t size, size_t nelem)
{
    size_t fstride[AFT_MAX_DIMS], idx[AFT_MAX_DIMS] = {0};
    fstride[0] = 1;
    for (size_t k = 1; k < ndim; k++) fstride[k] = fstride[k - 1] * dims[k - 1];
    size_t last = ndim - 1, n_last = dims[last], step = fstride[last] * size;
    size_t off = 0;   /* element offset in src of dst's current row start */
    for (size_t row = 0; row < nelem / n_last; row++) {
        /* the last C index is the slowest Fortran one: a strided gather */
        const unsigned char *s = src + off * size;
        for (size_t j = 0; j < n_last; j++, s += step, dst += size) memcpy(dst, s, size);
        /* advance the other indices, last-but-one fastest */
        for (size_t k = last; k-- > 0;) {
            if (++idx[k] < dims[k]) { off += fstride[k]; break; }
            idx[k] = 0;
            off -= (dims[k] - 1) * fstride[k];
        }
    }
}

/* ---------------------------------------------------------------- reader */

/* what the preamble and the header dict of a .npy say */
typedef struct {
    int major, minor;
    size_t hlen;              /* bytes of the header dict, padding included */
    size_t data_off;          /* where the data starts */
    hfields h;                /* h.descr points into the image */
    aft_dtype dt;
    int little;               /* the data's bytes are little-endian */
    size_t nelem, nbytes;
} npy_head;

/* Parses the preamble and header of a .npy image of len bytes (the data may
 * follow or not; len is the file's size when all of it is there). */
static aft_status parse_head(const unsigned char *buf, size_t len, npy_head *H, aft_error *err)
{
    aft_status st;
    memset(H, 0, sizeof *H);

    /* magic and version */
    if (memcmp(buf, NPY_MAGIC, len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN) != 0 || len == 0)
        return aft_fail(err, AFT_ERR_FORMAT, "bad magic: not a .npy file");
    if (len < NPY_MAGIC_LEN + 2)
        return aft_fail(err, AFT_ERR_FORMAT, "file ends inside the .npy preamble (%zu bytes)", len);
    H->major = buf[6];
    H->minor = buf[7];
    if (!((H->major == 1 || H->major == 2 || H->major == 3) && H->minor == 0))
        return aft_fail(err, AFT_ERR_FORMAT, "unknown .npy version %d.%d", H->major, H->minor);

    /* header length: 2 bytes little-endian in 1.0, 4 bytes in 2.0 and 3.0 */
    size_t lenbytes = H->major == 1 ? 2 : 4, prefix = 8 + lenbytes;
    if (len < prefix) return aft_fail(err, AFT_ERR_FORMAT, "file ends inside the .npy preamble (%zu bytes)", len);
    size_t hlen = 0;
    for (size_t i = lenbytes; i-- > 0;) hlen = hlen << 8 | buf[8 + i];
    if (hlen > NPY_MAX_HEADER)
        return aft_fail(err, AFT_ERR_FORMAT, "header of %zu bytes is over the %d-byte limit", hlen, NPY_MAX_HEADER);
    size_t data_off = prefix + hlen;   /* no overflow: hlen <= 10000 */
    if (data_off > len)
        return aft_fail(err, AFT_ERR_FORMAT, "header extends past the end of the file: needs %zu bytes, file holds %zu",
                        data_off, len);
    if (hlen == 0 || buf[data_off - 1] != '\n')
        return aft_fail(err, AFT_ERR_FORMAT, "bad .npy header: does not end with a newline");
    H->hlen = hlen;
    H->data_off = data_off;

    /* the dict, without the final newline */
    hparser P = {.s = buf + prefix, .pos = 0, .end = hlen - 1, .base = prefix, .err = err};
    if ((st = parse_header(&P, &H->h))) return st;
    if ((st = parse_descr(H->h.descr, H->h.descr_len, &H->dt, &H->little, err))) return st;
    size_t size = aft_dtype_size(H->dt);

    /* element and byte counts. Zero dimensions make the array empty, but the
     * product of the other dimensions must still fit, so that code computing
     * strides from the shape never overflows either. */
    size_t nz = 1, nelem = 1, nbytes;
    for (size_t k = 0; k < H->h.ndim; k++) {
        if (H->h.shape[k] == 0) { nelem = 0; continue; }
        if (!aft_mul_ok(nz, H->h.shape[k], &nz))
            return aft_fail(err, AFT_ERR_FORMAT, "array too large: element count overflows");
    }
    if (nelem) nelem = nz;
    if (!aft_mul_ok(nz, size, &nbytes)) return aft_fail(err, AFT_ERR_FORMAT, "array too large: byte count overflows");
    H->nelem = nelem;
    H->nbytes = nelem * size;   /* <= nz * size, checked above */
    return AFT_OK;
}

/* info and the dtype and shape of out from a parsed header (out's data is
 * left alone) */
static void fill_head(const npy_head *H, aft_tensor *out, aft_npy_info *info)
{
    if (info) {
        info->major = H->major;
        info->minor = H->minor;
        info->byteorder = (char)H->h.descr[0];
        info->fortran_order = H->h.fortran;
        memcpy(info->descr, H->h.descr, H->h.descr_len);   /* 3 bytes: parse_descr checked */
        info->descr[H->h.descr_len] = '\0';
        info->header_len = H->hlen;
        info->data_offset = H->data_off;
    }
    out->dtype = H->dt;
    out->ndim = H->h.ndim;
    memcpy(out->shape, H->h.shape, H->h.ndim * sizeof H->h.shape[0]);
    out->nelem = H->nelem;
    out->nbytes = H->nbytes;
}

/* Parses a .npy image of len bytes. When own is non-NULL it is the malloc'd
 * block holding buf, and the result may reuse it (the data is moved to its
 * start), which keeps a file's peak memory near its size; own is consumed
 * either way. When own is NULL, buf is copied. */
static aft_status decode(const unsigned char *buf, size_t len, unsigned char *own,
                         aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    aft_status st;
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    npy_head H;
    if ((st = parse_head(buf, len, &H, err))) goto fail;
    size_t size = aft_dtype_size(H.dt), nelem = H.nelem, nbytes = H.nbytes;

    /* the data must be exactly what the header promises; checked before any
     * allocation, so a tiny file claiming a huge shape costs nothing */
    size_t have = len - H.data_off;
    if (have < nbytes) {
        st = aft_fail(err, AFT_ERR_FORMAT, "data truncated: header promises %zu bytes, file holds %zu",
                      nbytes, have);
        goto fail;
    }
    if (have > nbytes) {
        st = aft_fail(err, AFT_ERR_FORMAT, "%zu trailing bytes after the data", have - nbytes);
        goto fail;
    }

    /* fill info now: descr points into buf, which the data may overwrite below */
    fill_head(&H, out, info);

    /* Fortran order only differs from C order with two or more dimensions */
    int transpose = H.h.fortran && H.h.ndim >= 2 && nelem > 0;
    unsigned char *data;
    if (transpose) {
        data = aft_alloc_array(nbytes, 1);
        if (!data) goto nomem;
        fortran_to_c(data, buf + H.data_off, H.h.shape, H.h.ndim, size, nelem);
        free(own);
        own = NULL;
    } else if (own) {
        /* reuse the file buffer: move the data to its start, return the rest */
        memmove(own, own + H.data_off, nbytes);
        data = realloc(own, nbytes ? nbytes : 1);
        if (!data) data = own;   /* shrinking failed: keep the larger block */
        own = NULL;
    } else {
        data = aft_alloc_array(nbytes, 1);
        if (!data) goto nomem;
        memcpy(data, buf + H.data_off, nbytes);
    }
    if (size > 1 && H.little != HOST_LITTLE) byteswap(data, nelem, size);
    out->data = data;
    out->owned = data;
    return AFT_OK;

nomem:
    st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu bytes of array data", nbytes);
fail:
    free(own);
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    return st;
}

aft_status aft_npy_read_mem(const void *buf, size_t len, aft_tensor *out, aft_npy_info *info,
                            aft_error *err)
{
    if (!buf && len) {
        memset(out, 0, sizeof *out);
        return aft_fail(err, AFT_ERR_ARG, "NULL buffer");
    }
    static const unsigned char empty[1];
    return decode(buf ? buf : empty, len, NULL, out, info, err);
}

/* Reads fp to its end into a malloc'd block. hint is the expected size (the
 * file size for a regular file, 0 when unknown); one spare byte lets the read
 * that sees end-of-file happen without growing the block. */
static aft_status read_all(FILE *fp, size_t hint, unsigned char **out, size_t *outlen,
                           aft_error *err)
{
    size_t cap = hint ? hint : 65536, len = 0;
    if (!aft_add_ok(cap, 1, &cap)) cap = SIZE_MAX;
    unsigned char *buf = malloc(cap);
    if (!buf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu bytes", cap);
    for (;;) {
        if (len == cap) {
            size_t ncap;
            if (!aft_mul_ok(cap, 2, &ncap)) {
                free(buf);
                return aft_fail(err, AFT_ERR_NOMEM, "input too large");
            }
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu bytes", ncap);
            }
            buf = nb;
            cap = ncap;
        }
        size_t n = fread(buf + len, 1, cap - len, fp);
        len += n;
        if (len < cap) {   /* a short fread: end of file or an error */
            if (ferror(fp)) {
                int e = errno;
                free(buf);
                return aft_fail(err, AFT_ERR_IO, "read failed: %s", strerror(e));
            }
            if (feof(fp)) break;
        }
    }
    *out = buf;
    *outlen = len;
    return AFT_OK;
}

aft_status aft_npy_read(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    int is_stdin = strcmp(path, "-") == 0;
    FILE *fp = is_stdin ? stdin : fopen(path, "rb");
    if (!fp) return aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));

    /* the file size, when there is one, sizes the buffer in one allocation */
    size_t hint = 0;
    struct stat sb;
    if (fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 &&
        (uintmax_t)sb.st_size < SIZE_MAX)
        hint = (size_t)sb.st_size;

    unsigned char *buf = NULL;
    size_t len = 0;
    aft_status st = read_all(fp, hint, &buf, &len, err);
    if (!is_stdin) fclose(fp);
    if (st) return st;
    return decode(buf, len, buf, out, info, err);
}

aft_status aft_npy_read_header(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    if (strcmp(path, "-") == 0)
        return aft_fail(err, AFT_ERR_ARG, "the header alone cannot be read from standard input");
    FILE *fp = fopen(path, "rb");
    if (!fp) return aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));
    /* the preamble and the longest header allowed, or the whole file when
     * it is shorter: what parse_head needs, and its sizes for messages */
    unsigned char buf[12 + NPY_MAX_HEADER];
    size_t len = fread(buf, 1, sizeof buf, fp);
    int e = errno, bad = ferror(fp);
    fclose(fp);
    if (bad) return aft_fail(err, AFT_ERR_IO, "read failed: %s", strerror(e));
    npy_head H;
    aft_status st = parse_head(buf, len, &H, err);
    if (st) return st;
    fill_head(&H, out, info);
    return AFT_OK;
}

/* ---------------------------------------------------------------- writer */

/* Builds numpy's version 1.0 header for t (2.0 if it would not fit in a
 * 2-byte length) into buf, preamble included: numpy's exact text
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * then the spaces numpy reserves for the first axis to grow, then spaces and
 * a final '\n' so that the data starts on a 64-byte boundary. Returns the
 * total length, or 0 if buf is too small (4096 bytes always suffice: at most
 * 32 dims). */
static size_t build_header(char *buf, size_t cap, const char *code, const aft_tensor *t)
{
    char dict[1024];
    size_t n = 0;
    /* every snprintf below writes well under the 1024 bytes: at most 32 dims
     * (checked by the caller) of at most 20 digits each, plus the fixed text */
    n += (size_t)snprintf(dict + n, sizeof dict - n,
                          "{'descr': '%c%s', 'fortran_order': False, 'shape': (",
                          aft_dtype_size(t->dtype) == 1 ? '|' : '<', code);
    for (size_t k = 0; k < t->ndim; k++)
        n += (size_t)snprintf(dict + n, sizeof dict - n, k ? ", %zu" : "%zu", t->shape[k]);
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", t->ndim == 1 ? "," : "");
    if (t->ndim > 0) {
        int digits = snprintf(NULL, 0, "%zu", t->shape[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS; i++) dict[n++] = ' ';
    }

    /* padding: numpy adds 1..64 spaces (64 when already aligned), then '\n' */
    int major = 1;
    size_t prefix = 10, hlen = n + 1, pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    if (hlen + pad > 65535) {
        major = 2;
        prefix = 12;
        pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    }
    size_t total = prefix + n + pad + 1;
    if (total > cap) return 0;
    size_t field = n + pad + 1;   /* the stored header length */
    memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
    buf[6] = (char)major;
    buf[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) buf[8 + i] = (char)((field >> (8 * i)) & 0xff);
    memcpy(buf + prefix, dict, n);
    memset(buf + prefix + n, ' ', pad);
    buf[total - 1] = '\n';
    return total;
}

aft_status aft_npy_header(const aft_tensor *t, char *buf, size_t cap, size_t *len, aft_error *err)
{
    if (!t || !buf || !len) return aft_fail(err, AFT_ERR_ARG, "NULL tensor or buffer");
    if (t->dtype == AFT_BF16) return aft_fail(err, AFT_ERR_ARG, "bfloat16 cannot be stored in .npy");
    const char *code = aft_npy_code(t->dtype);
    if (!code) return aft_fail(err, AFT_ERR_ARG, "unknown dtype %d", (int)t->dtype);
    if (t->ndim > AFT_MAX_DIMS)
        return aft_fail(err, AFT_ERR_ARG, "too many dimensions: %zu", t->ndim);
    *len = build_header(buf, cap, code, t);
    if (!*len) return aft_fail(err, AFT_ERR_ARG, "a .npy header of more than %zu bytes", cap);
    return AFT_OK;
}

aft_status aft_npy_write_fp(FILE *fp, const aft_tensor *t, aft_error *err)
{
    if (!t || !fp) return aft_fail(err, AFT_ERR_ARG, "NULL tensor or file");
    char head[4096];
    size_t hn;
    aft_status st = aft_npy_header(t, head, sizeof head, &hn, err);
    if (st != AFT_OK) return st;

    /* the tensor's own counts must agree with its shape, or the file would
     * lie; the nonzero dimensions must multiply without overflow, the rule
     * the reader applies, so everything written here can be read back */
    size_t size = aft_dtype_size(t->dtype), nz = 1, nelem = 1, nbytes;
    for (size_t k = 0; k < t->ndim; k++) {
        if (t->shape[k] == 0) { nelem = 0; continue; }
        if (!aft_mul_ok(nz, t->shape[k], &nz))
            return aft_fail(err, AFT_ERR_ARG, "shape element count overflows");
    }
    if (!aft_mul_ok(nz, size, &nbytes))
        return aft_fail(err, AFT_ERR_ARG, "shape byte count overflows");
    if (nelem) nelem = nz;
    nbytes = nelem * size;
    if (nelem != t->nelem || nbytes != t->nbytes)
        return aft_fail(err, AFT_ERR_ARG, "tensor counts (%zu elements, %zu bytes) do not match "
                        "its shape (%zu elements, %zu bytes)", t->nelem, t->nbytes, nelem, nbytes);
    if (nbytes && !t->data) return aft_fail(err, AFT_ERR_ARG, "tensor has no data");

    if (fwrite(head, 1, hn, fp) != hn) goto io;

    if (size == 1 || HOST_LITTLE) {
        if (nbytes && fwrite(t->data, 1, nbytes, fp) != nbytes) goto io;
    } else {
        /* a big-endian host swaps a chunk at a time into little-endian */
        unsigned char chunk[65536];
        const unsigned char *p = t->data;
        for (size_t done = 0; done < nbytes;) {
            size_t m = nbytes - done < sizeof chunk ? nbytes - done : sizeof chunk;
            memcpy(chunk, p + done, m);
            byteswap(chunk, m / size, size);
            if (fwrite(chunk, 1, m, fp) != m) goto io;
            done += m;
        }
    }
    return AFT_OK;
io:
    return aft_fail(err, AFT_ERR_IO, "write failed: %s", strerror(errno));
}

aft_status aft_npy_write(const char *path, const aft_tensor *t, aft_error *err)
{
    /* refuse what cannot be written before creating any file */
    if (t && t->dtype == AFT_BF16)
        return aft_fail(err, AFT_ERR_ARG, "bfloat16 cannot be stored in .npy");
    aft_out o;
    aft_status st = aft_out_open(&o, path, err);
    if (st) return st;
    st = aft_npy_write_fp(o.fp, t, err);
    if (st) {
        aft_out_abort(&o);
        return st;
    }
    return aft_out_commit(&o, err);
}
