/* util.c - errors, dtypes, half-precision conversions, tensor helpers,
 * whole numbers from text, the seq-first layout. */
#include "internal.h"
#include "nn/bf16.h"
#include "cpu/arch.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

aft_status aft_fail(aft_error *err, aft_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

void *aft_alloc_array(size_t n, size_t size)
{
    size_t bytes;
    if (!aft_mul_ok(n, size, &bytes)) return NULL;
    return malloc(bytes ? bytes : 1);
}

void *aft_calloc_array(size_t n, size_t size)
{
    size_t bytes;
    if (!aft_mul_ok(n, size, &bytes)) return NULL;
    return calloc(bytes ? bytes : 1, 1);
}

/* Non-temporal stores (arch.h's, where the machine has them): they go to
 * memory without reading each line into the cache first. This is baseline
 * code, and the baseline's 16-byte stores fill a line as fast as wider
 * ones: the stores are bound by memory, not by instructions. */
void aft_zero_stream(float *p, size_t n)
{
#ifdef AFT_ARCH_STREAM_ZERO
    enum { F = AFT_ARCH_STREAM_FLOATS };
    size_t i = 0;
    for (; i < n && (uintptr_t)(p + i) % (F * sizeof(float)); i++) p[i] = 0.0f;
    for (; i + F <= n; i += F) AFT_ARCH_STREAM_ZERO(p + i);
    for (; i < n; i++) p[i] = 0.0f;
    /* the stores are weakly ordered: done before another thread reads */
    AFT_ARCH_STREAM_FENCE();
#else
    memset(p, 0, n * sizeof(float));
#endif
}

void aft_copy_stream(float *dst, const float *src, size_t n)
{
#ifdef AFT_ARCH_STREAM_COPY
    enum { F = AFT_ARCH_STREAM_FLOATS };
    size_t i = 0;
    for (; i < n && (uintptr_t)(dst + i) % (F * sizeof(float)); i++) dst[i] = src[i];
    for (; i + F <= n; i += F) AFT_ARCH_STREAM_COPY(dst + i, src + i);
    for (; i < n; i++) dst[i] = src[i];
    AFT_ARCH_STREAM_FENCE();
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

static const struct { const char *name; size_t size; int is_float; } dtypes[AFT_DTYPE_COUNT] = {
    [AFT_F64] = {"F64", 8, 1},  [AFT_F32] = {"F32", 4, 1},  [AFT_F16] = {"F16", 2, 1},
    [AFT_BF16] = {"BF16", 2, 1}, [AFT_BOOL] = {"BOOL", 1, 0}, [AFT_U8] = {"U8", 1, 0},
    [AFT_I8] = {"I8", 1, 0},    [AFT_I16] = {"I16", 2, 0},  [AFT_U16] = {"U16", 2, 0},
    [AFT_I32] = {"I32", 4, 0},  [AFT_U32] = {"U32", 4, 0},  [AFT_I64] = {"I64", 8, 0},
    [AFT_U64] = {"U64", 8, 0},
};

const char *aft_dtype_name(aft_dtype dt)
{
    return (unsigned)dt < AFT_DTYPE_COUNT ? dtypes[dt].name : "?";
}

int aft_dtype_from_name(const char *name, aft_dtype *out)
{
    for (int i = 0; i < AFT_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (aft_dtype)i;
            return 0;
        }
    return -1;
}

size_t aft_dtype_size(aft_dtype dt)
{
    return (unsigned)dt < AFT_DTYPE_COUNT ? dtypes[dt].size : 0;
}

int aft_dtype_is_float(aft_dtype dt)
{
    return (unsigned)dt < AFT_DTYPE_COUNT && dtypes[dt].is_float;
}

/* IEEE 754 binary16 -> binary32, exact (every half is a float) */
float aft_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);          /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);  /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                      /* signed zero */
    } else {
        /* subnormal half: value = man * 2^-24, exactly representable */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* binary32 -> binary16 with round to nearest, ties to even */
uint16_t aft_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                       /* inf or nan (keep nan quiet) */
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0);
    if (ax >= 0x477ff000u)                       /* rounds to >= 65536: overflow */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {                      /* below the smallest normal half */
        /* scale so the half subnormal unit (2^-24) becomes 1, round in float:
         * the float addition rounds to nearest even for us */
        float a;
        memcpy(&a, &ax, 4);
        float r = a * 16777216.0f;               /* a / 2^-24, exact */
        float n = nearbyintf(r);                 /* default rounding: ties to even */
        return sign | (uint16_t)n;
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  /* carries into exp fine */
    return sign | (uint16_t)h;
}

float aft_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t aft_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  /* quiet nan */
    uint32_t lsb = (x >> 16) & 1;
    x += 0x7fff + lsb;                           /* round to nearest even */
    return (uint16_t)(x >> 16);
}

void aft_tensor_free(aft_tensor *t)
{
    if (!t) return;
    free(t->owned);
    memset(t, 0, sizeof *t);
}

aft_status aft_tensor_to_f32(const aft_tensor *t, float **out, aft_error *err)
{
    *out = NULL;
    float *y = aft_alloc_array(t->nelem, sizeof(float));
    if (!y) return aft_fail(err, AFT_ERR_NOMEM, "out of memory converting %zu values to F32", t->nelem);
    const unsigned char *p = t->data;
    size_t n = t->nelem;
    if (t->dtype == AFT_F32) {   /* already float32: a copy (the data may be unaligned) */
        memcpy(y, p, n * sizeof(float));
        *out = y;
        return AFT_OK;
    }
    for (size_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case AFT_F32: { float v; memcpy(&v, p + 4 * i, 4); y[i] = v; break; }
        case AFT_F64: { double v; memcpy(&v, p + 8 * i, 8); y[i] = (float)v; break; }
        case AFT_F16: { uint16_t v; memcpy(&v, p + 2 * i, 2); y[i] = aft_f16_to_f32(v); break; }
        case AFT_BF16: { uint16_t v; memcpy(&v, p + 2 * i, 2); y[i] = aft_bf16_to_f32(v); break; }
        case AFT_BOOL: y[i] = p[i] ? 1.0f : 0.0f; break;
        case AFT_U8: y[i] = p[i]; break;
        case AFT_I8: y[i] = (int8_t)p[i]; break;
        case AFT_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); y[i] = v; break; }
        case AFT_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); y[i] = v; break; }
        case AFT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); y[i] = (float)v; break; }
        case AFT_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); y[i] = (float)v; break; }
        case AFT_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); y[i] = (float)v; break; }
        case AFT_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); y[i] = (float)v; break; }
        default:
            free(y);
            return aft_fail(err, AFT_ERR_FORMAT, "unsupported dtype %d", (int)t->dtype);
        }
    }
    *out = y;
    return AFT_OK;
}

float aft_w_at(const void *w, aft_dtype dt, size_t i)
{
    if (!aft_dtype_is16(dt)) {
        float v;
        memcpy(&v, (const char *)w + i * sizeof v, sizeof v);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const char *)w + 2 * i, 2);
    return dt == AFT_BF16 ? aft_bf16_to_f32(h) : aft_f16_to_f32(h);
}

void aft_w_widen_into(float *y, const void *w, aft_dtype dt, size_t n)
{
    if (!aft_dtype_is16(dt)) memcpy(y, w, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++) y[i] = aft_w_at(w, dt, i);
}

float *aft_w_widen(const void *w, aft_dtype dt, size_t n)
{
    float *y = aft_alloc_array(n, sizeof(float));
    if (y) aft_w_widen_into(y, w, dt, n);
    return y;
}

aft_status aft_tensor_copy(const aft_tensor *t, void **out, aft_error *err)
{
    *out = aft_alloc_array(t->nelem ? t->nelem : 1, aft_dtype_size(t->dtype));
    if (!*out) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu values", t->nelem);
    memcpy(*out, t->data, t->nelem * aft_dtype_size(t->dtype));
    return AFT_OK;
}

static const char *variant_names[] = {"full", "local", "simple", "conv"};

const char *aft_variant_name(aft_variant v)
{
    return (unsigned)v < 4 ? variant_names[v] : "?";
}

int aft_variant_from_name(const char *name, aft_variant *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, variant_names[i]) == 0) {
            *out = (aft_variant)i;
            return 0;
        }
    return -1;
}

void aft_strbuf_add(aft_strbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    size_t need;
    if (!aft_add_ok(b->len, n, &need) || !aft_add_ok(need, 1, &need)) { b->oom = 1; return; }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need)
            if (!aft_mul_ok(cap, 2, &cap)) { b->oom = 1; return; }
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void aft_strbuf_add_str(aft_strbuf *b, const char *s)
{
    aft_strbuf_add(b, s, strlen(s));
}

int aft_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int aft_parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (aft_parse_u64(s, &v) != 0 || v > SIZE_MAX) return -1;
    *out = (size_t)v;
    return 0;
}

int aft_parse_grid(const char *s, size_t *h, size_t *w)
{
    const char *comma = s ? strchr(s, ',') : NULL;
    char buf[64];
    if (!comma || (size_t)(comma - s) >= sizeof buf) return -1;
    memcpy(buf, s, (size_t)(comma - s));
    buf[comma - s] = 0;
    if (aft_parse_size(buf, h) != 0 || aft_parse_size(comma + 1, w) != 0 || *h == 0 || *w == 0) return -1;
    return 0;
}

/* ---- the products' precision: its one spelling, for the CLI, the
 * binding's option strings and Python alike */

const char *aft_precision_name(aft_precision p)
{
    return p == AFT_PRECISION_BF16 ? "bf16" : "f32";
}

int aft_precision_from_name(const char *name, aft_precision *out)
{
    if (!name) return -1;
    if (strcmp(name, "f32") == 0) *out = AFT_PRECISION_F32;
    else if (strcmp(name, "bf16") == 0) *out = AFT_PRECISION_BF16;
    else return -1;
    return 0;
}

const char *aft_bf16_engine_in_use(void)
{
    return aft_bf16_engine_name(aft_bf16_engine_now());
}

double aft_bf16_floor(int threads)
{
    return aft_bf16_rate(threads);
}

int aft_bf16_wanted(aft_precision p)
{
    return p == AFT_PRECISION_BF16 && aft_bf16_engine_now() != AFT_BF16_NONE;
}

/* dst: (B, T, X) from src (T, B, X), or the reverse: a row of X at a time */
void aft_swap_tb(float *dst, const float *src, size_t B, size_t T, size_t X, int to_tbd)
{
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            const float *from = to_tbd ? src + (b * T + t) * X : src + (t * B + b) * X;
            float *to = to_tbd ? dst + (t * B + b) * X : dst + (b * T + t) * X;
            memcpy(to, from, X * sizeof(float));
        }
}

size_t aft_sorted_index(const size_t *sorted, size_t n, size_t v)
{
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The well-formed UTF-8 character at s (n bytes available): its length,
 * and its code point in *cp; 0 when there is none. Follows Unicode's
 * Table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF, no
 * cut-off sequence. */
size_t aft_utf8_char(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;  /* allowed range of byte 2 */
    size_t len;
    if (c < 0x80) {
        if (cp) *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;        /* below: overlong */
        if (c == 0xed) hi = 0x9f;        /* above: UTF-16 surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;        /* below: overlong */
        if (c == 0xf4) hi = 0x8f;        /* above: beyond U+10FFFF */
    } else {
        return 0;                        /* stray continuation, C0, C1, F5+ */
    }
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    if (cp) {
        uint32_t v = c & (0x7fu >> len);   /* the lead byte's payload bits */
        for (size_t k = 1; k < len; k++) v = v << 6 | (s[k] & 0x3fu);
        *cp = v;
    }
    return len;
}

size_t aft_utf8_put(unsigned char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t aft_utf8_prefix(const void *bytes, size_t n)
{
    const unsigned char *s = bytes;
    size_t i = 0;
    while (i < n) {
        size_t len = aft_utf8_char(s + i, n - i, NULL);
        if (len == 0) return i;
        i += len;
    }
    return n;
}

int aft_utf8_valid(const char *s)
{
    size_t n = strlen(s);
    return aft_utf8_prefix(s, n) == n;
}

/* the one loop behind aft_shown and aft_show_text: at most limit bytes of
 * str's whole characters, then "..."; invalid UTF-8 and control characters
 * as '?' (the C1 controls only with c1) */
static void show_chars(const char *str, char *buf, size_t limit, int c1)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str), i = 0, o = 0;
    while (i < n) {
        uint32_t cp = 0;
        size_t len = aft_utf8_char(s + i, n - i, &cp);
        if (o + (len ? len : 1) > limit) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (len == 0 || (aft_is_control(cp) && (c1 || cp < 0x80))) {
            buf[o++] = '?';
            i += len ? len : 1;
        } else {
            memcpy(buf + o, s + i, len);
            o += len;
            i += len;
        }
    }
    buf[o] = '\0';
}

const char *aft_shown(const char *str, char *buf, size_t limit)
{
    show_chars(str, buf, limit, 0);
    return buf;
}

void aft_show_text(char *buf, size_t cap, const char *str)
{
    if (cap > 4) show_chars(str, buf, cap - 4, 1);
    else if (cap) buf[0] = '\0';
}
