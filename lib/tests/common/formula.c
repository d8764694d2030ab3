/* formula.c - see formula.h */
#include "formula.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void formula_fill(aft_dtype dt, void *buf, size_t n)
{
    unsigned char *p = buf;
    for (size_t j = 0; j < n; j++) {
        int64_t i = (int64_t)j;
        double f = (double)i * 0.5 - 3;
        switch (dt) {
        case AFT_F16: { uint16_t v = aft_f32_to_f16((float)f); memcpy(p + 2 * j, &v, 2); break; }
        case AFT_F32: { float v = (float)f; memcpy(p + 4 * j, &v, 4); break; }
        case AFT_F64: memcpy(p + 8 * j, &f, 8); break;
        case AFT_BOOL: p[j] = i % 3 == 0; break;
        case AFT_U8: p[j] = (uint8_t)((i * 37 + 5) % 256); break;
        case AFT_I8: p[j] = (uint8_t)(int8_t)((i * 37 + 5) % 256 - 128); break;
        case AFT_I16: { int16_t v = (int16_t)((i - 12) * 2730); memcpy(p + 2 * j, &v, 2); break; }
        case AFT_U16: { uint16_t v = (uint16_t)(i * 2849 + 3); memcpy(p + 2 * j, &v, 2); break; }
        case AFT_I32: { int32_t v = (int32_t)((i - 12) * 178956970); memcpy(p + 4 * j, &v, 4); break; }
        case AFT_U32: { uint32_t v = (uint32_t)(i * 186737708 + 1); memcpy(p + 4 * j, &v, 4); break; }
        case AFT_I64: { int64_t v = (i - 12) * INT64_C(768614336404564650); memcpy(p + 8 * j, &v, 8); break; }
        case AFT_U64: { uint64_t v = (uint64_t)i * UINT64_C(802032351030850070) + 5; memcpy(p + 8 * j, &v, 8); break; }
        default: memset(p, 0, n * aft_dtype_size(dt)); return;
        }
    }
}

size_t formula_differs(const aft_tensor *t)
{
    size_t size = aft_dtype_size(t->dtype);
    unsigned char *want = malloc(t->nbytes + 1);
    if (!want) return 1;
    formula_fill(t->dtype, want, t->nelem);
    size_t bad = 0;
    for (size_t i = 0; i < t->nelem && !bad; i++)
        if (memcmp((const unsigned char *)t->data + i * size, want + i * size, size) != 0) bad = i + 1;
    free(want);
    return bad;
}

aft_dtype formula_dtype(const char *code)
{
    static const struct { const char *code; aft_dtype dt; } codes[] = {
        {"f2", AFT_F16}, {"f4", AFT_F32}, {"f8", AFT_F64}, {"b1", AFT_BOOL}, {"u1", AFT_U8}, {"i1", AFT_I8},
        {"i2", AFT_I16}, {"u2", AFT_U16}, {"i4", AFT_I32}, {"u4", AFT_U32}, {"i8", AFT_I64}, {"u8", AFT_U64},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(codes[i].code, code) == 0) return codes[i].dt;
    return AFT_DTYPE_COUNT;
}
