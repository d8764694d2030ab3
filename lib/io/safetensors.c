/* safetensors.c - the .safetensors reader (validating, memory-mapped) and
 * writer.
 *
 * The format: an 8-byte little-endian unsigned header size N, N bytes of
 * UTF-8 JSON (an object, possibly padded at the end with whitespace), then
 * the data buffer. Each JSON key names a tensor,
 *     "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
 * with offsets relative to the start of the data buffer, except the optional
 * "__metadata__", an object of string values.
 *
 * The reader treats the file as hostile and follows the reference
 * implementation's rules: header size at most 100,000,000 bytes and inside
 * the file; valid UTF-8; every tensor's byte range exactly the size its dtype
 * and shape need (checked arithmetic); the ranges, sorted, tile the data
 * buffer from 0 to its end with no hole, overlap or trailing byte. It is also
 * stricter in a few places the reference leaves loose: duplicate names,
 * unknown keys in a tensor entry, raw control characters in JSON strings and
 * numbers not written as plain integers are refused.
 *
 * Tensors handed out point into the mapping (or the caller's buffer). Their
 * data may be unaligned for the dtype (nothing in the format aligns it), so
 * consumers read elements with memcpy or aft_tensor_to_f32, never through a
 * cast pointer. Data is used as is, which is native order only on a
 * little-endian host; a big-endian build refuses instead of swapping.
 */
#include "formats.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER ((uint64_t)100000000)  /* the reference's limit */
#define ST_MAX_DEPTH 64          /* a valid header nests 3 deep */
#define ST_INT_LIMIT 9007199254740992.0      /* 2^53: JSON numbers above are inexact */
#define ST_METADATA "__metadata__"


/* ---------------------------------------------------------------- helpers */

/* "[2, 3, 4]" into buf (cap >= 16), cut short with "..." if it does not fit */
static const char *fmt_shape(char *buf, size_t cap, const size_t *shape, size_t ndim)
{
    size_t used = 1;
    buf[0] = '[';
    for (size_t i = 0; i < ndim; i++) {
        char part[32];
        int k = snprintf(part, sizeof part, "%s%zu", i ? ", " : "", shape[i]);
        if (used + (size_t)k + 5 > cap) {   /* keep room for "...]" and the NUL */
            memcpy(buf + used, "...", 3);
            used += 3;
            break;
        }
        memcpy(buf + used, part, (size_t)k);
        used += (size_t)k;
    }
    buf[used++] = ']';
    buf[used] = '\0';
    return buf;
}


/* a name for a message, as aft_shown shows it (at most 80 bytes) */
static const char *show(const char *str, char buf[static 96])
{
    return aft_shown(str, buf, 80);
}

static int is_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Result of the lexical scan: the first number not written as a plain
 * non-negative integer (reported only if nothing else is wrong, so that a
 * negative or fractional shape gets the message naming its tensor). */
typedef struct {
    int has_bad_number;
    size_t bad_at, bad_len;
} st_lex;

/* A lexical pass over the header before cJSON sees it. It refuses what cJSON
 * would accept silently or cannot represent: raw control characters (a NUL
 * would cut a name short; JSON forbids them in strings), \u0000 escapes
 * (names are C strings), invalid escapes, unterminated strings, and nesting
 * deeper than a header needs (so no parser recursion goes deep). It also
 * notes numbers with a sign, fraction, exponent or leading zero: cJSON turns
 * "2.0" into 2, but shapes and offsets are plain integers. Iterative, one
 * pass, no allocation. */
static aft_status lex_header(const unsigned char *h, size_t n, st_lex *lx, aft_error *err)
{
    size_t depth = 0, i = 0;
    memset(lx, 0, sizeof *lx);
    while (i < n) {
        unsigned char c = h[i];
        if (c == '"') {
            size_t start = i++;
            for (;;) {
                if (i >= n)
                    return aft_fail(err, AFT_ERR_FORMAT,
                                    "header has an unterminated string starting at byte %zu", start);
                c = h[i];
                if (c == '"') { i++; break; }
                if (c < 0x20)
                    return aft_fail(err, AFT_ERR_FORMAT,
                                    "header has a raw control character 0x%02x inside a string at byte %zu",
                                    c, i);
                if (c != '\\') { i++; continue; }
                if (i + 1 >= n)
                    return aft_fail(err, AFT_ERR_FORMAT,
                                    "header has an unterminated string starting at byte %zu", start);
                unsigned char e = h[i + 1];
                if (e == 'u') {
                    if (n - i < 6 || !is_hex(h[i + 2]) || !is_hex(h[i + 3]) ||
                        !is_hex(h[i + 4]) || !is_hex(h[i + 5]))
                        return aft_fail(err, AFT_ERR_FORMAT,
                                        "header has a \\u escape without 4 hex digits at byte %zu", i);
                    if (memcmp(h + i + 2, "0000", 4) == 0)
                        return aft_fail(err, AFT_ERR_FORMAT,
                                        "header has a \\u0000 escape at byte %zu (names and values cannot hold NUL)",
                                        i);
                    i += 6;
                } else if (strchr("\"\\/bfnrt", e) && e != '\0') {
                    i += 2;
                } else {
                    return aft_fail(err, AFT_ERR_FORMAT,
                                    "header has an invalid escape '\\%c' at byte %zu",
                                    e >= 0x20 && e < 0x7f ? e : '?', i);
                }
            }
            continue;
        }
        if (c == '{' || c == '[') {
            if (++depth > ST_MAX_DEPTH)
                return aft_fail(err, AFT_ERR_FORMAT,
                                "header nests more than %d levels deep (at byte %zu)", ST_MAX_DEPTH, i);
        } else if (c == '}' || c == ']') {
            if (depth > 0) depth--;   /* a mismatch is cJSON's to report */
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t start = i;
            int plain = 1;
            while (i < n && strchr("0123456789+-.eE", h[i]) && h[i] != '\0') {
                if (h[i] < '0' || h[i] > '9') plain = 0;
                i++;
            }
            if (h[start] == '0' && i - start > 1) plain = 0;  /* leading zero */
            if (!plain && !lx->has_bad_number) {
                lx->has_bad_number = 1;
                lx->bad_at = start;
                lx->bad_len = i - start;
            }
            continue;
        } else if (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return aft_fail(err, AFT_ERR_FORMAT,
                            "header has a control character 0x%02x at byte %zu", c, i);
        }
        i++;
    }
    return AFT_OK;
}

/* A JSON number that is a whole number in [0, 2^53). Below 2^53 every
 * integer is exact in a double, so the value is the one the text wrote.
 * Returns 0, -1 (not a non-negative integer) or -2 (too large). */
static int json_size(const cJSON *it, size_t *out)
{
    if (!cJSON_IsNumber(it)) return -1;
    double d = it->valuedouble;
    if (!(d >= 0.0)) return -1;              /* negative or NaN */
    if (d >= ST_INT_LIMIT) return -2;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return -1;           /* a fraction */
    if (u > SIZE_MAX) return -2;
    *out = (size_t)u;
    return 0;
}

/* ---------------------------------------------------------------- parsing */

typedef struct {
    const char *name;     /* into the cJSON tree */
    size_t begin, end;    /* byte range in the data buffer */
    size_t index;         /* position among the tensors in the header */
    aft_tensor t;
} st_entry;

typedef struct {
    const char *name;
    size_t index;
} st_named;

static int cmp_named(const void *a, const void *b)
{
    const st_named *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* file order: by begin, then end (a zero-size tensor before the tensor
 * starting where it sits), then header order so ties are deterministic */
static int cmp_offsets(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* tensor nm's keys: exactly one each of dtype, shape and data_offsets */
static aft_status entry_keys(const cJSON *obj, const char *nm, const cJSON **dtype, const cJSON **shape,
                             const cJSON **offs, aft_error *err)
{
    for (const cJSON *it = obj->child; it; it = it->next) {
        const cJSON **slot = strcmp(it->string, "dtype") == 0 ? dtype
                           : strcmp(it->string, "shape") == 0 ? shape
                           : strcmp(it->string, "data_offsets") == 0 ? offs : NULL;
        char kb[96];
        if (!slot)
            return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' has an unknown key '%s'",
                            nm, show(it->string, kb));
        if (*slot)
            return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' has key '%s' twice", nm, it->string);
        *slot = it;
    }
    if (!*dtype) return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' has no 'dtype'", nm);
    if (!*shape) return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' has no 'shape'", nm);
    if (!*offs) return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' has no 'data_offsets'", nm);
    return AFT_OK;
}

/* entry k of tensor nm's array `what` (shape, data_offsets) as a size */
static aft_status entry_size(const cJSON *it, const char *nm, const char *what, size_t k, size_t *out,
                             aft_error *err)
{
    int r = json_size(it, out);
    if (r == -1 && cJSON_IsNumber(it))
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': %s entry %zu (%.17g) is not a non-negative integer",
                        nm, what, k, it->valuedouble);
    if (r == -1)
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': %s entry %zu is not a number", nm, what, k);
    if (r == -2)
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': %s entry %zu (%.17g) is 2^53 or more",
                        nm, what, k, it->valuedouble);
    return AFT_OK;
}

/* tensor nm's dtype and shape into t, and its element and byte counts,
 * checked: an overflow is an error, never a wrap */
static aft_status entry_shape(const cJSON *dtype, const cJSON *shape, const char *nm, aft_tensor *t, aft_error *err)
{
    char sb[160];
    memset(t, 0, sizeof *t);
    if (!cJSON_IsString(dtype))
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': dtype is not a string", nm);
    if (aft_dtype_from_name(dtype->valuestring, &t->dtype) != 0) {
        char db[96];
        return aft_fail(err, AFT_ERR_FORMAT, "unknown dtype '%s' for tensor '%s'",
                        show(dtype->valuestring, db), nm);
    }

    if (!cJSON_IsArray(shape))
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': shape is not an array", nm);
    size_t ndim = (size_t)cJSON_GetArraySize(shape);
    if (ndim > AFT_MAX_DIMS)
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': shape has %zu dimensions, more than the %d supported",
                        nm, ndim, AFT_MAX_DIMS);
    size_t k = 0;
    for (const cJSON *it = shape->child; it; it = it->next, k++) {
        aft_status st = entry_size(it, nm, "shape", k, &t->shape[k], err);
        if (st != AFT_OK) return st;
    }
    t->ndim = ndim;

    size_t nelem = 1;
    for (k = 0; k < ndim; k++)
        if (!aft_mul_ok(nelem, t->shape[k], &nelem))
            return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': shape %s has more elements than fit in size_t",
                            nm, fmt_shape(sb, sizeof sb, t->shape, ndim));
    size_t nbytes;
    if (!aft_mul_ok(nelem, aft_dtype_size(t->dtype), &nbytes))
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': shape %s of %s needs more bytes than fit in size_t",
                        nm, fmt_shape(sb, sizeof sb, t->shape, ndim), aft_dtype_name(t->dtype));
    t->nelem = nelem;
    t->nbytes = nbytes;
    return AFT_OK;
}

/* Reads one tensor entry {"dtype", "shape", "data_offsets"} into e and
 * checks that its byte range holds exactly what dtype and shape need and
 * lies inside the data buffer. Nothing is allocated from these numbers. */
static aft_status parse_entry(const cJSON *obj, st_entry *e, size_t data_size, aft_error *err)
{
    char nb[96], sb[160];
    const char *nm = show(e->name, nb);
    if (!cJSON_IsObject(obj))
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' is not a JSON object", nm);

    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    aft_status st = entry_keys(obj, nm, &dtype, &shape, &offs, err);
    if (st != AFT_OK) return st;
    aft_tensor *t = &e->t;
    if ((st = entry_shape(dtype, shape, nm, t, err)) != AFT_OK) return st;
    const size_t nbytes = t->nbytes;

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': data_offsets is not a [begin, end] pair", nm);
    size_t be[2], k = 0;
    for (const cJSON *it = offs->child; it; it = it->next, k++)
        if ((st = entry_size(it, nm, "data_offsets", k, &be[k], err)) != AFT_OK) return st;
    e->begin = be[0];
    e->end = be[1];
    if (e->begin > e->end)
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': data_offsets [%zu, %zu] end before they begin",
                        nm, e->begin, e->end);
    if (e->end - e->begin != nbytes)
        return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s': data_offsets [%zu, %zu] hold %zu %s but shape %s of %s needs %zu",
                        nm, e->begin, e->end, e->end - e->begin, aft_noun(e->end - e->begin, "byte", "bytes"),
                        fmt_shape(sb, sizeof sb, t->shape, t->ndim), aft_dtype_name(t->dtype), nbytes);
    if (e->end > data_size)
        return aft_fail(err, AFT_ERR_FORMAT,
                        "tensor '%s': data_offsets [%zu, %zu] run past the end of the data buffer (%zu %s)",
                        nm, e->begin, e->end, data_size, aft_noun(data_size, "byte", "bytes"));
    return AFT_OK;
}

/* Reads "__metadata__" into pairs (key, value pointers into the tree). */
static aft_status parse_metadata(const cJSON *obj, const char ***pairs, size_t *count, aft_error *err)
{
    char kb[96];
    if (!cJSON_IsObject(obj))
        return aft_fail(err, AFT_ERR_FORMAT, "__metadata__ is not a JSON object");
    size_t n = 0;
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (!cJSON_IsString(it))
            return aft_fail(err, AFT_ERR_FORMAT, "__metadata__ value for key '%s' is not a string",
                            show(it->string, kb));
        n++;
    }
    const char **p = aft_alloc_array(n, 2 * sizeof *p);
    st_named *sorted = aft_alloc_array(n, sizeof *sorted);
    if (!p || !sorted) {
        free(p); free(sorted);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu metadata entries", n);
    }
    size_t i = 0;
    for (const cJSON *it = obj->child; it; it = it->next, i++) {
        p[2 * i] = it->string;
        p[2 * i + 1] = it->valuestring;
        sorted[i] = (st_named){it->string, i};
    }
    /* duplicate keys: cJSON keeps both; sort to find them in n log n */
    qsort(sorted, n, sizeof *sorted, cmp_named);
    for (i = 1; i < n; i++)
        if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
            aft_status st = aft_fail(err, AFT_ERR_FORMAT, "__metadata__ has key '%s' twice",
                                     show(sorted[i].name, kb));
            free(p); free(sorted);
            return st;
        }
    free(sorted);
    *pairs = p;
    *count = n;
    return AFT_OK;
}

/* Copies every name, key and value into one block owned by f, so the cJSON
 * tree can be freed. entries are in file order. */
static aft_status keep_strings(aft_st_file *f, const st_entry *entries, const char **pairs,
                               aft_error *err)
{
    size_t total = 1;
    for (size_t i = 0; i < f->n; i++)
        if (!aft_add_ok(total, strlen(entries[i].name) + 1, &total)) goto nomem;
    for (size_t i = 0; i < 2 * f->nmeta; i++)
        if (!aft_add_ok(total, strlen(pairs[i]) + 1, &total)) goto nomem;
    f->strings = malloc(total);
    f->names = aft_alloc_array(f->n, sizeof *f->names);
    f->meta = aft_alloc_array(f->nmeta, 2 * sizeof *f->meta);
    if (!f->strings || !f->names || !f->meta) goto nomem;
    char *s = f->strings;
    for (size_t i = 0; i < f->n; i++) {
        size_t len = strlen(entries[i].name) + 1;
        memcpy(s, entries[i].name, len);
        f->names[i] = s;
        s += len;
    }
    for (size_t i = 0; i < 2 * f->nmeta; i++) {
        size_t len = strlen(pairs[i]) + 1;
        memcpy(s, pairs[i], len);
        f->meta[i] = s;
        s += len;
    }
    return AFT_OK;
nomem:
    return aft_fail(err, AFT_ERR_NOMEM, "out of memory keeping %zu names", f->n);
}

/* The file's frame: the 8-byte header size, the header h (hlen bytes) and
 * the data buffer after it (data_size bytes) */
static aft_status parse_frame(const aft_st_file *f, const unsigned char **h, size_t *hlen, size_t *data_size,
                              aft_error *err)
{
    const unsigned char *b = f->bytes;
    size_t size = f->size;
    if (!AFT_HOST_LITTLE)
        return aft_fail(err, AFT_ERR_FORMAT, "safetensors data is little-endian and this is a big-endian build (not supported)");
    if (size < 8)
        return aft_fail(err, AFT_ERR_FORMAT, "file is %zu %s, too short for the 8-byte header size", size,
                        aft_noun(size, "byte", "bytes"));

    uint64_t n64 = 0;
    for (int i = 7; i >= 0; i--) n64 = n64 << 8 | b[i];
    if (n64 > ST_MAX_HEADER)
        return aft_fail(err, AFT_ERR_FORMAT, "header size %llu exceeds the limit of %llu bytes",
                        (unsigned long long)n64, (unsigned long long)ST_MAX_HEADER);
    *hlen = (size_t)n64;
    if (*hlen > size - 8)
        return aft_fail(err, AFT_ERR_FORMAT, "header size %zu runs past the end of the file (%zu %s)",
                        *hlen, size, aft_noun(size, "byte", "bytes"));
    *h = b + 8;
    *data_size = size - 8 - *hlen;
    return AFT_OK;
}

/* The header h (hlen bytes) checked (UTF-8, the lexer's rules: lx) and
 * parsed: *root, the tree of *text, a copy of it the caller frees with
 * the tree */
static aft_status parse_json(const unsigned char *h, size_t hlen, st_lex *lx, char **text, cJSON **root,
                             aft_error *err)
{
    size_t ok = aft_utf8_prefix(h, hlen);
    if (ok != hlen)
        return aft_fail(err, AFT_ERR_FORMAT, "header is not valid UTF-8 (byte %zu)", ok);
    aft_status st = lex_header(h, hlen, lx, err);
    if (st != AFT_OK) return st;

    /* cJSON wants a NUL-terminated string; parsing a private copy also keeps
     * it from ever reading past the header, whatever the input holds */
    char *t = malloc(hlen + 1);
    if (!t) return aft_fail(err, AFT_ERR_NOMEM, "out of memory copying a %zu-byte header", hlen);
    memcpy(t, h, hlen);
    t[hlen] = '\0';
    const char *end = NULL;
    /* require_null_terminated: only whitespace may follow the object (the
     * lexer refused NUL bytes, so the terminator is the one we added) */
    cJSON *r = cJSON_ParseWithOpts(t, &end, 1);
    if (!r) {
        size_t at = end && end >= t && end <= t + hlen ? (size_t)(end - t) : 0;
        free(t);
        return aft_fail(err, AFT_ERR_FORMAT, "header is not valid JSON (near byte %zu)", at);
    }
    *text = t;
    *root = r;
    return AFT_OK;
}

/* __metadata__ (at most once: *meta, NULL if none), and the tensors'
 * count */
static aft_status header_parts(const cJSON *root, const cJSON **meta, size_t *ntensors, aft_error *err)
{
    if (!cJSON_IsObject(root)) return aft_fail(err, AFT_ERR_FORMAT, "header is not a JSON object");
    *ntensors = 0;
    *meta = NULL;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, ST_METADATA) != 0) { (*ntensors)++; continue; }
        if (*meta) return aft_fail(err, AFT_ERR_FORMAT, "header has '__metadata__' twice");
        *meta = it;
    }
    return AFT_OK;
}

/* duplicate names: cJSON keeps both entries; sorting finds them in n log
 * n, and the sorted order is kept for aft_st_find */
static aft_status check_names(st_named *sorted, size_t n, aft_error *err)
{
    char nb[96];
    qsort(sorted, n, sizeof *sorted, cmp_named);
    for (size_t k = 1; k < n; k++)
        if (strcmp(sorted[k - 1].name, sorted[k].name) == 0)
            return aft_fail(err, AFT_ERR_FORMAT, "tensor name '%s' appears twice", show(sorted[k].name, nb));
    return AFT_OK;
}

/* the byte ranges, sorted (entries into file order), must tile the data
 * buffer exactly: each starts where the previous ended, the first at 0,
 * the last at its end */
static aft_status check_tiling(st_entry *entries, size_t n, size_t data_size, aft_error *err)
{
    char nb[96], nb2[96];
    qsort(entries, n, sizeof *entries, cmp_offsets);
    size_t expect = 0;
    for (size_t k = 0; k < n; k++) {
        const st_entry *e = &entries[k];
        if (e->begin != expect) {
            const char *kind = e->begin > expect ? "hole" : "overlap";
            if (k == 0)
                return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' starts at %zu but the data buffer starts at 0 (%s)",
                                show(e->name, nb), e->begin, kind);
            return aft_fail(err, AFT_ERR_FORMAT, "tensor '%s' starts at %zu but the previous tensor '%s' ends at %zu (%s)",
                            show(e->name, nb), e->begin, show(entries[k - 1].name, nb2), expect, kind);
        }
        expect = e->end;
    }
    if (expect != data_size) {
        if (n == 0)
            return aft_fail(err, AFT_ERR_FORMAT,
                            "data buffer holds %zu %s but the header lists no tensors (trailing bytes)",
                            data_size, aft_noun(data_size, "byte", "bytes"));
        return aft_fail(err, AFT_ERR_FORMAT, "data buffer holds %zu %s but the tensors end at %zu (%zu trailing %s)",
                        data_size, aft_noun(data_size, "byte", "bytes"), expect, data_size - expect,
                        aft_noun(data_size - expect, "byte", "bytes"));
    }
    return AFT_OK;
}

/* the handle: f's tensors in file order pointing into data, by_name from
 * the sorted names (pos: scratch of n) */
static aft_status build_handle(aft_st_file *f, const st_entry *entries, const st_named *sorted, size_t *pos,
                               const char **pairs, const unsigned char *data, size_t n, aft_error *err)
{
    f->n = n;
    aft_status st = keep_strings(f, entries, pairs, err);
    if (st != AFT_OK) return st;
    f->tensors = aft_alloc_array(n, sizeof *f->tensors);
    f->by_name = aft_alloc_array(n, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu tensors", n);
    for (size_t k = 0; k < n; k++) {
        f->tensors[k] = entries[k].t;
        f->tensors[k].data = data + entries[k].begin;
        f->tensors[k].owned = NULL;
        pos[entries[k].index] = k;   /* header position -> file position */
    }
    for (size_t k = 0; k < n; k++)
        f->by_name[k] = pos[sorted[k].index];
    return AFT_OK;
}

/* Validates f->bytes[0..size) and fills the tensor table. On failure the
 * caller frees f with aft_st_close. */
static aft_status parse(aft_st_file *f, aft_error *err)
{
    const unsigned char *h = NULL;
    size_t hlen = 0, data_size = 0;
    aft_status st = parse_frame(f, &h, &hlen, &data_size, err);
    if (st != AFT_OK) return st;
    const unsigned char *data = h + hlen;
    st_lex lx;
    char *text = NULL;
    cJSON *root = NULL;
    if ((st = parse_json(h, hlen, &lx, &text, &root, err)) != AFT_OK) return st;

    st_entry *entries = NULL;
    st_named *sorted = NULL;
    size_t *pos = NULL;
    const char **pairs = NULL;
    size_t ntensors = 0;
    const cJSON *meta = NULL;
    if ((st = header_parts(root, &meta, &ntensors, err)) != AFT_OK) goto done;
    if (meta && (st = parse_metadata(meta, &pairs, &f->nmeta, err)) != AFT_OK) goto done;

    entries = aft_calloc_array(ntensors, sizeof *entries);
    sorted = aft_alloc_array(ntensors, sizeof *sorted);
    pos = aft_alloc_array(ntensors, sizeof *pos);
    if (!entries || !sorted || !pos) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu tensor entries", ntensors);
        goto done;
    }
    size_t k = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (it == meta) continue;
        entries[k].name = it->string;
        entries[k].index = k;
        if ((st = parse_entry(it, &entries[k], data_size, err)) != AFT_OK) goto done;
        sorted[k] = (st_named){it->string, k};
        k++;
    }
    if ((st = check_names(sorted, ntensors, err)) != AFT_OK) goto done;
    if ((st = check_tiling(entries, ntensors, data_size, err)) != AFT_OK) goto done;

    /* everything else is right; now a number like 2.0 or -0, which cJSON
     * read as a valid integer, is still not what the format allows */
    if (lx.has_bad_number) {
        int len = lx.bad_len > 40 ? 40 : (int)lx.bad_len;
        st = aft_fail(err, AFT_ERR_FORMAT, "header number '%.*s' at byte %zu is not a plain non-negative integer",
                      len, (const char *)h + lx.bad_at, lx.bad_at);
        goto done;
    }
    st = build_handle(f, entries, sorted, pos, pairs, data, ntensors, err);

done:
    free(entries);
    free(sorted);
    free(pos);
    free(pairs);
    cJSON_Delete(root);
    free(text);
    return st;
}

/* ---------------------------------------------------------------- opening */

/* Reads everything from fd (a pipe or standard input) into a malloc block. */
static aft_status read_all(int fd, unsigned char **out, size_t *len, aft_error *err)
{
    size_t cap = 1 << 16, used = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading input");
    for (;;) {
        if (used == cap) {
            size_t ncap;
            unsigned char *nbuf = aft_mul_ok(cap, 2, &ncap) ? realloc(buf, ncap) : NULL;
            if (!nbuf) {
                free(buf);
                return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading input (%zu bytes so far)", used);
            }
            buf = nbuf;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + used, cap - used);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return aft_fail(err, AFT_ERR_IO, "cannot read: %s", strerror(e));
        }
        if (r == 0) break;
        used += (size_t)r;
    }
    *out = buf;
    *len = used;
    return AFT_OK;
}

static aft_st_file *new_file(aft_error *err)
{
    aft_st_file *f = calloc(1, sizeof *f);
    if (!f) aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    return f;
}

/* Reads f->bytes as what its first bytes say: a .npz archive, or else a
 * .safetensors (which has no magic: its parser says what is wrong with
 * anything else), refusing a .npy with a message saying what it is. */
static aft_status finish_open(aft_st_file *f, size_t max_bytes, int named_npz, aft_st_file **out, aft_error *err)
{
    aft_status st;
    aft_format fmt = aft_format_detect(f->bytes, f->size);
    /* bytes that say nothing go by the name, as aft_file_format does */
    if (fmt == AFT_FORMAT_UNKNOWN && named_npz) fmt = AFT_FORMAT_NPZ;
    switch (fmt) {
    case AFT_FORMAT_NPZ:
        st = aft_npz_parse(f, max_bytes, err);
        break;
    case AFT_FORMAT_NPY:
        st = aft_fail(err, AFT_ERR_FORMAT, "not a .safetensors or .npz file: this is a .npy file (one array)");
        break;
    default:
        f->format = AFT_FORMAT_SAFETENSORS;
        st = parse(f, err);
        break;
    }
    if (st != AFT_OK) {
        aft_st_close(f);
        return st;
    }
    *out = f;
    return AFT_OK;
}

aft_status aft_st_open_mem_limit(const void *buf, size_t len, size_t max_bytes, aft_st_file **out, aft_error *err)
{
    *out = NULL;
    aft_st_file *f = new_file(err);
    if (!f) return AFT_ERR_NOMEM;
    f->bytes = buf;
    f->size = buf ? len : 0;
    return finish_open(f, max_bytes, 0, out, err);
}

aft_status aft_st_open_mem(const void *buf, size_t len, aft_st_file **out, aft_error *err)
{
    return aft_st_open_mem_limit(buf, len, SIZE_MAX, out, err);
}

aft_status aft_st_open(const char *path, aft_st_file **out, aft_error *err)
{
    return aft_st_open_limit(path, SIZE_MAX, out, err);
}

aft_status aft_st_open_limit(const char *path, size_t max_bytes, aft_st_file **out, aft_error *err)
{
    size_t plen = strlen(path);
    int named_npz = plen >= 4 && strcmp(path + plen - 4, ".npz") == 0;
    *out = NULL;
    aft_st_file *f = new_file(err);
    if (!f) return AFT_ERR_NOMEM;
    aft_status st;
    if (strcmp(path, "-") == 0) {
        if ((st = read_all(STDIN_FILENO, &f->owned, &f->size, err)) != AFT_OK) goto fail;
        f->bytes = f->owned;
        return finish_open(f, max_bytes, named_npz, out, err);
    }

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = aft_fail(err, AFT_ERR_IO, "cannot stat: %s", strerror(errno));
        close(fd);
        goto fail;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size < 8) {
        /* a pipe or device has no size to map: read it whole instead; so is
         * a file too short to be anything (mmap refuses a length of 0) */
        st = read_all(fd, &f->owned, &f->size, err);
        close(fd);
        if (st != AFT_OK) goto fail;
        f->bytes = f->owned;
        return finish_open(f, max_bytes, named_npz, out, err);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        st = aft_fail(err, AFT_ERR_NOMEM, "file of %lld bytes is too large to map", (long long)sb.st_size);
        goto fail;
    }
    /* The whole file is mapped (at least 8 bytes, so never a zero-length
     * map, even when the data buffer is empty). The mapping outlives the
     * descriptor. A file truncated by someone else while mapped would fault
     * on access; that is the usual contract of mapped readers. */
    size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        st = aft_fail(err, AFT_ERR_IO, "cannot map: %s", strerror(e));
        goto fail;
    }
    f->map = map;
    f->map_size = size;
    f->bytes = map;
    f->size = size;
    return finish_open(f, max_bytes, named_npz, out, err);

fail:
    aft_st_close(f);
    return st;
}

void aft_st_close(aft_st_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    free(f->owned);
    for (size_t i = 0; f->tensors && i < f->n; i++) free(f->tensors[i].owned);   /* a .npz's */
    free(f->tensors);
    free(f->names);
    free(f->by_name);
    free(f->meta);
    free(f->strings);
    free(f);
}

/* ---------------------------------------------------------------- a caller's arrays */

/* tensor i of aft_st_borrow_f32: its header over the caller's data */
static aft_status borrow_one(aft_tensor *t, const char *name, const float *data, size_t ndim, const size_t *shape,
                             aft_error *err)
{
    char nb[96];
    if (ndim > AFT_MAX_DIMS || (ndim && !shape))
        return aft_fail(err, AFT_ERR_ARG, "array '%s': %zu dimensions (at most %d)", show(name, nb), ndim,
                        AFT_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = AFT_F32;
    t->ndim = ndim;
    t->nelem = 1;
    for (size_t d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        if (!aft_mul_ok(t->nelem, shape[d], &t->nelem))
            return aft_fail(err, AFT_ERR_ARG, "array '%s': its shape overflows", show(name, nb));
    }
    if (!aft_mul_ok(t->nelem, sizeof(float), &t->nbytes))
        return aft_fail(err, AFT_ERR_ARG, "array '%s': its shape overflows", show(name, nb));
    if (!data && t->nelem) return aft_fail(err, AFT_ERR_ARG, "array '%s': missing (NULL) data", show(name, nb));
    t->data = data;
    return AFT_OK;
}

aft_status aft_st_borrow_f32(aft_st_file **out, size_t n, const char *const *names, const float *const *data,
                             const size_t *ndims, const size_t *const *shapes, aft_error *err)
{
    *out = NULL;
    if (n && (!names || !data || !ndims || !shapes))
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !names ? "names" : !data ? "data" : !ndims ? "ndims"
                                                                                                   : "shapes");
    aft_st_file *f = new_file(err);
    if (!f) return AFT_ERR_NOMEM;
    f->format = AFT_FORMAT_SAFETENSORS;
    f->borrowed = 1;
    f->n = n;
    f->tensors = aft_alloc_array(n, sizeof *f->tensors);
    f->names = aft_alloc_array(n, sizeof *f->names);
    f->by_name = aft_alloc_array(n, sizeof *f->by_name);
    st_named *sorted = aft_alloc_array(n, sizeof *sorted);
    aft_status st = AFT_OK;
    if (!f->tensors || !f->names || !f->by_name || !sorted) st = aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++) {
        if (!names[i]) st = aft_fail(err, AFT_ERR_ARG, "missing (NULL) name of array %zu", i);
        else st = borrow_one(&f->tensors[i], names[i], data[i], ndims[i], shapes[i], err);
        f->names[i] = names[i];
        sorted[i] = (st_named){names[i], i};
    }
    if (!st && (st = check_names(sorted, n, err)) != AFT_OK) st = AFT_ERR_ARG;   /* the caller's, not a file's */
    for (size_t k = 0; !st && k < n; k++) f->by_name[k] = sorted[k].index;
    free(sorted);
    if (st) {
        aft_st_close(f);
        return st;
    }
    *out = f;
    return AFT_OK;
}

int aft_st_borrowed(const aft_st_file *f)
{
    return f && f->borrowed;
}

/* ---------------------------------------------------------------- queries */

const char *aft_st_format(const aft_st_file *f)
{
    return f && f->format == AFT_FORMAT_NPZ ? "npz" : "safetensors";
}

size_t aft_st_count(const aft_st_file *f)
{
    return f ? f->n : 0;
}

const aft_tensor *aft_st_get(const aft_st_file *f, size_t i, const char **name)
{
    if (!f || i >= f->n) {
        if (name) *name = NULL;
        return NULL;
    }
    if (name) *name = f->names[i];
    return &f->tensors[i];
}

size_t aft_st_index(const aft_st_file *f, const char *name)
{
    if (!f || !name) return SIZE_MAX;
    /* binary search over the names sorted at open time */
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->names[f->by_name[mid]], name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return SIZE_MAX;
}

const aft_tensor *aft_st_find(const aft_st_file *f, const char *name)
{
    size_t i = aft_st_index(f, name);
    return i == SIZE_MAX ? NULL : &f->tensors[i];
}

size_t aft_st_metadata_count(const aft_st_file *f)
{
    return f ? f->nmeta : 0;
}

void aft_st_metadata(const aft_st_file *f, size_t i, const char **key, const char **value)
{
    int ok = f && i < f->nmeta;
    if (key) *key = ok ? f->meta[2 * i] : NULL;
    if (value) *value = ok ? f->meta[2 * i + 1] : NULL;
}

const char *aft_st_metadata_find(const aft_st_file *f, const char *key)
{
    for (size_t i = 0; f && i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

/* ---------------------------------------------------------------- writing */

static void buf_size(aft_strbuf *b, size_t v)
{
    char tmp[32];
    int k = snprintf(tmp, sizeof tmp, "%zu", v);
    aft_strbuf_add(b, tmp, (size_t)k);
}

/* s as a JSON string: quote, backslash and control characters escaped;
 * everything else (valid UTF-8, checked by the caller) goes as is */
static void buf_json_string(aft_strbuf *b, const char *s)
{
    aft_strbuf_add(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        char esc[8];
        if (c == '"') aft_strbuf_add(b, "\\\"", 2);
        else if (c == '\\') aft_strbuf_add(b, "\\\\", 2);
        else if (c == '\n') aft_strbuf_add(b, "\\n", 2);
        else if (c == '\r') aft_strbuf_add(b, "\\r", 2);
        else if (c == '\t') aft_strbuf_add(b, "\\t", 2);
        else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            aft_strbuf_add(b, esc, 6);
        } else {
            aft_strbuf_add(b, p, 1);
        }
    }
    aft_strbuf_add(b, "\"", 1);
}

/* Checks a tensor handed to the writer: known dtype, shape and counts that
 * agree, data present, sizes the reader will accept (below 2^53). */
static aft_status check_out_tensor(const char *name, const aft_tensor *t, int need_data, aft_error *err)
{
    char nb[96], sb[160];
    const char *nm = show(name, nb);
    if ((unsigned)t->dtype >= AFT_DTYPE_COUNT)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s' has an invalid dtype (%d)", nm, (int)t->dtype);
    if (t->ndim > AFT_MAX_DIMS)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s' has %zu dimensions, more than %d", nm, t->ndim, AFT_MAX_DIMS);
    size_t nelem = 1, nbytes;
    for (size_t k = 0; k < t->ndim; k++)
        if ((double)t->shape[k] >= ST_INT_LIMIT || !aft_mul_ok(nelem, t->shape[k], &nelem))
            return aft_fail(err, AFT_ERR_ARG, "tensor '%s': shape %s is too large", nm,
                            fmt_shape(sb, sizeof sb, t->shape, t->ndim));
    if (!aft_mul_ok(nelem, aft_dtype_size(t->dtype), &nbytes))
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s': shape %s is too large", nm,
                        fmt_shape(sb, sizeof sb, t->shape, t->ndim));
    if (t->nelem != nelem || t->nbytes != nbytes)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s' says %zu elements in %zu bytes but shape %s of %s means %zu in %zu",
                        nm, t->nelem, t->nbytes, fmt_shape(sb, sizeof sb, t->shape, t->ndim),
                        aft_dtype_name(t->dtype), nelem, nbytes);
    if (need_data && nbytes > 0 && !t->data)
        return aft_fail(err, AFT_ERR_ARG, "tensor '%s' has no data", nm);
    return AFT_OK;
}

/* names must be unique: sort copies (n log n) and compare neighbours */
static aft_status check_unique(const char *const *names, size_t n, size_t stride, const char *what,
                               aft_error *err)
{
    st_named *s = aft_alloc_array(n, sizeof *s);
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory checking %zu names", n);
    for (size_t i = 0; i < n; i++) s[i] = (st_named){names[i * stride], i};
    qsort(s, n, sizeof *s, cmp_named);
    for (size_t i = 1; i < n; i++)
        if (strcmp(s[i - 1].name, s[i].name) == 0) {
            char nb[96];
            aft_status st = aft_fail(err, AFT_ERR_ARG, "%s '%s' is given twice", what, show(s[i].name, nb));
            free(s);
            return st;
        }
    free(s);
    return AFT_OK;
}

aft_status aft_st_header(const char *const *names, const aft_tensor *tensors, size_t n,
                         const char *const *meta, size_t nmeta, char **out, size_t *out_len, aft_error *err)
{
    *out = NULL;
    *out_len = 0;
    if (!AFT_HOST_LITTLE)
        return aft_fail(err, AFT_ERR_ARG, "writing safetensors on a big-endian build is not supported");
    if ((n && (!names || !tensors)) || (nmeta && !meta))
        return aft_fail(err, AFT_ERR_ARG, "missing tensor or metadata arrays");

    /* refuse bad arguments before any file is created */
    char nb[96];
    for (size_t i = 0; i < n; i++) {
        if (!names[i]) return aft_fail(err, AFT_ERR_ARG, "tensor %zu has no name", i);
        if (!aft_utf8_valid(names[i])) return aft_fail(err, AFT_ERR_ARG, "tensor name '%s' is not valid UTF-8", show(names[i], nb));
        if (strcmp(names[i], ST_METADATA) == 0)
            return aft_fail(err, AFT_ERR_ARG, "'__metadata__' is reserved and cannot name a tensor");
        aft_status st = check_out_tensor(names[i], &tensors[i], 0, err);
        if (st != AFT_OK) return st;
    }
    for (size_t i = 0; i < 2 * nmeta; i++) {
        if (!meta[i]) return aft_fail(err, AFT_ERR_ARG, "metadata %s %zu is missing", i % 2 ? "value" : "key", i / 2);
        if (!aft_utf8_valid(meta[i]))
            return aft_fail(err, AFT_ERR_ARG, "metadata %s '%s' is not valid UTF-8", i % 2 ? "value" : "key", show(meta[i], nb));
    }
    aft_status st = check_unique(names, n, 1, "tensor name", err);
    if (st == AFT_OK) st = check_unique(meta, nmeta, 2, "metadata key", err);
    if (st != AFT_OK) return st;

    /* the header: __metadata__ first, then the tensors back to back in the
     * order given */
    aft_strbuf h = {0};
    aft_strbuf_add(&h, "{", 1);
    if (nmeta > 0) {
        aft_strbuf_add_str(&h, "\"" ST_METADATA "\":{");
        for (size_t i = 0; i < nmeta; i++) {
            if (i) aft_strbuf_add(&h, ",", 1);
            buf_json_string(&h, meta[2 * i]);
            aft_strbuf_add(&h, ":", 1);
            buf_json_string(&h, meta[2 * i + 1]);
        }
        aft_strbuf_add(&h, "}", 1);
    }
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const aft_tensor *t = &tensors[i];
        if (i || nmeta) aft_strbuf_add(&h, ",", 1);
        buf_json_string(&h, names[i]);
        aft_strbuf_add_str(&h, ":{\"dtype\":\"");
        aft_strbuf_add_str(&h, aft_dtype_name(t->dtype));
        aft_strbuf_add_str(&h, "\",\"shape\":[");
        for (size_t k = 0; k < t->ndim; k++) {
            if (k) aft_strbuf_add(&h, ",", 1);
            buf_size(&h, t->shape[k]);
        }
        aft_strbuf_add_str(&h, "],\"data_offsets\":[");
        buf_size(&h, offset);
        aft_strbuf_add(&h, ",", 1);
        if (!aft_add_ok(offset, t->nbytes, &offset) || (double)offset >= ST_INT_LIMIT) {
            free(h.p);
            return aft_fail(err, AFT_ERR_ARG, "the tensors hold 2^53 bytes or more");
        }
        buf_size(&h, offset);
        aft_strbuf_add_str(&h, "]}");
    }
    aft_strbuf_add(&h, "}", 1);
    /* spaces after the JSON so the data starts at a multiple of 8 */
    while (!h.oom && (8 + h.len) % 8 != 0) aft_strbuf_add(&h, " ", 1);
    if (h.oom) {
        free(h.p);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory building the header");
    }
    if (h.len > ST_MAX_HEADER) {
        size_t len = h.len;
        free(h.p);
        return aft_fail(err, AFT_ERR_ARG, "header would be %zu bytes, more than the %llu the format allows",
                        len, (unsigned long long)ST_MAX_HEADER);
    }

    *out = h.p;
    *out_len = h.len;
    return AFT_OK;
}

aft_status aft_st_write(const char *path, const char *const *names, const aft_tensor *tensors,
                        size_t n, const char *const *meta, size_t nmeta, aft_error *err)
{
    /* every check, and the header, before any file is created */
    aft_strbuf h = {0};
    aft_status st = aft_st_header(names, tensors, n, meta, nmeta, &h.p, &h.len, err);
    if (st != AFT_OK) return st;
    for (size_t i = 0; i < n; i++)
        if ((st = check_out_tensor(names[i], &tensors[i], 1, err)) != AFT_OK) {
            free(h.p);
            return st;
        }

    aft_out o;
    if ((st = aft_out_open(&o, path, err)) != AFT_OK) {
        free(h.p);
        return st;
    }
    unsigned char size_le[8];
    for (int i = 0; i < 8; i++) size_le[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    int bad = fwrite(size_le, 1, 8, o.fp) != 8 || fwrite(h.p, 1, h.len, o.fp) != h.len;
    free(h.p);
    for (size_t i = 0; i < n && !bad; i++)
        if (tensors[i].nbytes && fwrite(tensors[i].data, 1, tensors[i].nbytes, o.fp) != tensors[i].nbytes)
            bad = 1;
    if (bad) {
        int e = errno;
        aft_out_abort(&o);
        return aft_fail(err, AFT_ERR_IO, "write failed: %s", strerror(e));
    }
    return aft_out_commit(&o, err);
}
