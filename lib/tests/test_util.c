/*
 * test_util.c - lib/util.c: the streaming stores (aft_zero_stream,
 * aft_copy_stream) write exactly their n floats from any float-aligned
 * start; the half-precision conversions against values worked out by hand
 * and, for every finite half and bfloat16, the float64 midpoints to the
 * next one (below, at and above it: ties to even); the dtype table; the
 * UTF-8 decoder and encoder at the edges of Unicode's Table 3-7; sizes
 * whose product overflows.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "aft.h"
#include "internal.h"

/* every start within a 64-byte line and every length to past a few
 * vectors: the n floats are 0, the floats either side untouched */
static void test_zero_stream_exact(void **state)
{
    (void)state;
    enum { PAD = 20, MAXN = 100 };
    static float buf[PAD + MAXN + PAD + 16];
    int bad = 0;
    for (size_t start = 0; start < 16; start++)
        for (size_t n = 0; n <= MAXN; n++) {
            const size_t len = sizeof buf / sizeof buf[0];
            for (size_t i = 0; i < len; i++) buf[i] = 1.0f + (float)i;
            float *p = buf + PAD + start;
            aft_zero_stream(p, n);
            for (size_t i = 0; i < len; i++) {
                int inside = buf + i >= p && buf + i < p + n;
                float want = inside ? 0.0f : 1.0f + (float)i;
                if (!(buf[i] == want) && bad++ < 5)
                    fprintf(stderr, "start %zu, n %zu: buf[%zu] = %g, want %g\n", start, n, i, buf[i], want);
            }
        }
    assert_int_equal(bad, 0);
}

/* aft_copy_stream: the same starts and lengths; the source unaligned too */
static void test_copy_stream_exact(void **state)
{
    (void)state;
    enum { PAD = 20, MAXN = 100 };
    static float buf[PAD + MAXN + PAD + 16], src[MAXN + 16];
    for (size_t i = 0; i < MAXN + 16; i++) src[i] = -1.0f - (float)i;
    int bad = 0;
    for (size_t start = 0; start < 16; start++)
        for (size_t n = 0; n <= MAXN; n++) {
            const size_t len = sizeof buf / sizeof buf[0];
            for (size_t i = 0; i < len; i++) buf[i] = 1.0f + (float)i;
            float *p = buf + PAD + start;
            const float *s = src + (start * 7) % 16;
            aft_copy_stream(p, s, n);
            for (size_t i = 0; i < len; i++) {
                int inside = buf + i >= p && buf + i < p + n;
                float want = inside ? s[buf + i - p] : 1.0f + (float)i;
                if (!(buf[i] == want) && bad++ < 5)
                    fprintf(stderr, "start %zu, n %zu: buf[%zu] = %g, want %g\n", start, n, i, buf[i], want);
            }
        }
    assert_int_equal(bad, 0);
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* the value of a half, from its fields (not from util.c) */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

/* binary16: hand-worked values, every half to float and back, and the
 * rounding of every midpoint between neighbours (ties to even; past the
 * largest half, 65520 and up, to infinity) */
static void test_f16(void **state)
{
    (void)state;
    const struct { float f; uint16_t h; } hand[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {0.5f, 0x3800}, {65504.0f, 0x7bff}, {65519.99f, 0x7bff},
        {65520.0f, 0x7c00}, {1e9f, 0x7c00}, {0x1p-14f, 0x0400}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000},
        {0x1.8p-24f, 0x0002}, {0x1.002p0f, 0x3c00}, {0x1.006p0f, 0x3c02}, {-0.0f, 0x8000},
        {INFINITY, 0x7c00}, {-INFINITY, 0xfc00}, {0.1f, 0x2e66}, {1.0f / 3.0f, 0x3555},
    };
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        if (aft_f32_to_f16(hand[i].f) != hand[i].h)
            fail_msg("%a -> %#06x, want %#06x", (double)hand[i].f, aft_f32_to_f16(hand[i].f), hand[i].h);
    }
    uint16_t qn = aft_f32_to_f16(NAN);
    assert_true((qn & 0x7c00) == 0x7c00 && (qn & 0x200));   /* a quiet NaN */
    assert_true(isnan(aft_f16_to_f32(0x7e00)) && isnan(aft_f16_to_f32(0x7c01)));
    assert_true(isinf(aft_f16_to_f32(0x7c00)) && aft_f16_to_f32(0xfc00) < 0);
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;   /* inf, NaN */
        float f = aft_f16_to_f32((uint16_t)h);
        if ((double)f != half_value((uint16_t)h) || aft_f32_to_f16(f) != h) {
            if (bad++ < 5) fprintf(stderr, "half %#06x: %a, back %#06x\n", h, (double)f, aft_f32_to_f16(f));
            continue;
        }
        if (h & 0x8000) continue;
        /* the midpoint to the next half up (past 0x7bff: 65536, where
         * infinity starts), exact in float */
        double up = h == 0x7bff ? 65536.0 : half_value((uint16_t)(h + 1));
        float mid = (float)((half_value((uint16_t)h) + up) / 2);
        uint16_t even = h & 1 ? (uint16_t)(h + 1) : (uint16_t)h;
        if (aft_f32_to_f16(mid) != even || aft_f32_to_f16(nextafterf(mid, 0.0f)) != h ||
            aft_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1)
            if (bad++ < 5) fprintf(stderr, "half %#06x: the midpoint %a rounds wrong\n", h, (double)mid);
        if (aft_f32_to_f16(-mid) != (even | 0x8000)) bad++;
    }
    assert_int_equal(bad, 0);
}

/* bfloat16: the top half of a float; every midpoint rounds to even */
static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(aft_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(aft_f32_to_bf16(0x1.01p0f), 0x3f80);    /* a tie: to even */
    assert_int_equal(aft_f32_to_bf16(0x1.03p0f), 0x3f82);    /* a tie: to even, up */
    assert_int_equal(aft_f32_to_bf16(-3.0f), 0xc040);
    assert_int_equal(aft_f32_to_bf16(INFINITY), 0x7f80);
    assert_true(aft_f32_to_bf16(0x1.fffffep127f) == 0x7f80);   /* rounds past the largest: infinity */
    uint16_t qn = aft_f32_to_bf16(NAN);
    assert_true((qn & 0x7f80) == 0x7f80 && (qn & 0x40));
    int bad = 0;
    for (uint32_t h = 0; h < 0x7f80; h++) {
        float f = aft_bf16_to_f32((uint16_t)h), next = aft_bf16_to_f32((uint16_t)(h + 1));
        if (bits_of(f) != h << 16 || aft_f32_to_bf16(f) != h) bad++;
        double up = h == 0x7f7f ? ldexp(1.0, 128) : (double)next;
        float mid = (float)(((double)f + up) / 2);
        uint16_t even = h & 1 ? (uint16_t)(h + 1) : (uint16_t)h;
        if (aft_f32_to_bf16(mid) != even || aft_f32_to_bf16(nextafterf(mid, 0.0f)) != h ||
            aft_f32_to_bf16(nextafterf(mid, INFINITY)) != h + 1)
            if (bad++ < 5) fprintf(stderr, "bf16 %#06x: the midpoint %a rounds wrong\n", h, (double)mid);
    }
    assert_int_equal(bad, 0);
}

/* the dtypes' names and sizes, as safetensors spells them */
static void test_dtypes(void **state)
{
    (void)state;
    const struct { aft_dtype dt; const char *name; size_t size; int is_float; } want[] = {
        {AFT_F64, "F64", 8, 1}, {AFT_F32, "F32", 4, 1}, {AFT_F16, "F16", 2, 1}, {AFT_BF16, "BF16", 2, 1},
        {AFT_BOOL, "BOOL", 1, 0}, {AFT_U8, "U8", 1, 0}, {AFT_I8, "I8", 1, 0}, {AFT_I16, "I16", 2, 0},
        {AFT_U16, "U16", 2, 0}, {AFT_I32, "I32", 4, 0}, {AFT_U32, "U32", 4, 0}, {AFT_I64, "I64", 8, 0},
        {AFT_U64, "U64", 8, 0},
    };
    assert_int_equal(sizeof want / sizeof want[0], AFT_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_string_equal(aft_dtype_name(want[i].dt), want[i].name);
        assert_int_equal(aft_dtype_size(want[i].dt), want[i].size);
        assert_int_equal(aft_dtype_is_float(want[i].dt), want[i].is_float);
        aft_dtype dt;
        assert_int_equal(aft_dtype_from_name(want[i].name, &dt), 0);
        assert_int_equal(dt, want[i].dt);
    }
    aft_dtype dt;
    assert_int_equal(aft_dtype_from_name("f32", &dt), -1);
    assert_string_equal(aft_dtype_name(AFT_DTYPE_COUNT), "?");
    assert_int_equal(aft_dtype_size(AFT_DTYPE_COUNT), 0);
}

/* aft_utf8_char at each edge of Unicode's Table 3-7 of well-formed byte
 * sequences: the length and the code point, or 0; aft_utf8_put writes a
 * code point back as the same bytes; aft_shown keeps a message one line */
static void test_utf8(void **state)
{
    (void)state;
    const struct { const char *s; size_t len; uint32_t cp; } cases[] = {
        {"a", 1, 0x61}, {"\x7f", 1, 0x7f}, {"\xc2\x80", 2, 0x80}, {"\xdf\xbf", 2, 0x7ff}, {"\xc1\xbf", 0, 0},
        {"\x80", 0, 0}, {"\xe0\xa0\x80", 3, 0x800}, {"\xe0\x9f\xbf", 0, 0}, {"\xed\x9f\xbf", 3, 0xd7ff},
        {"\xed\xa0\x80", 0, 0}, {"\xef\xbf\xbf", 3, 0xffff}, {"\xf0\x90\x80\x80", 4, 0x10000},
        {"\xf0\x8f\xbf\xbf", 0, 0}, {"\xf4\x8f\xbf\xbf", 4, 0x10ffff}, {"\xf4\x90\x80\x80", 0, 0},
        {"\xf5\x80\x80\x80", 0, 0}, {"\xe2\x82", 0, 0}, {"\xe2\x28\xa1", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const unsigned char *s = (const unsigned char *)cases[i].s;
        size_t n = strlen(cases[i].s);
        uint32_t cp = 0xffffffffu;
        size_t len = aft_utf8_char(s, n, &cp);
        if (len != cases[i].len || (len && cp != cases[i].cp))
            fail_msg("case %zu: length %zu, code point %#x; want %zu, %#x", i, len, cp, cases[i].len, cases[i].cp);
        if (len) {
            unsigned char out[4];
            assert_int_equal(aft_utf8_put(out, cp), len);
            assert_memory_equal(out, s, len);
        }
    }
    char buf[64];
    assert_string_equal(aft_shown("a\tb\xff\xc3\xa9", buf, 16), "a?b?\xc3\xa9");
    assert_string_equal(aft_shown("abcdef", buf, 4), "abcd...");
}

/* element counts times sizes that do not fit in size_t: NULL, not a small block */
static void test_alloc_overflow(void **state)
{
    (void)state;
    assert_null(aft_alloc_array(SIZE_MAX / 2, 3));
    assert_null(aft_calloc_array((size_t)1 << 62, 8));
    void *p = aft_alloc_array(0, 8);   /* empty: a valid pointer */
    assert_non_null(p);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_stream_exact),
        cmocka_unit_test(test_copy_stream_exact),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_alloc_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
