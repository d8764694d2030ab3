/* numerics.h - the float arithmetic every kernel shares: an exponential that
 * vectorises without -ffast-math, the machine's vector width, a NaN-skipping
 * maximum and the sigmoid. Private to lib/. */
#ifndef AFT_NUMERICS_H
#define AFT_NUMERICS_H

#include "internal.h"

#include <stdint.h>
#include <math.h>
#include <string.h>

/* exp(x) for float, written so a loop of it vectorizes without -ffast-math:
 * n = round(x / ln 2), r = x - n ln 2 (|r| <= ln2 / 2, two-part ln 2 so the
 * reduction is exact), exp(r) by its Taylor series to r^7 (relative error
 * below 1e-8 on that range), then scaled by 2^n by adding n to the exponent
 * field of exp(r) (in [0.70, 1.42], so for -125 <= n <= 128 the sum stays a
 * normal float, or reaches the largest finite one at most). n comes from
 * the 1.5 * 2^23 rounding trick, whose sum's low bits are n itself. Results
 * below exp(-86.98), about 1.7e-38, flush to 0 (callers only ever drop such
 * terms); x above ln(FLT_MAX) gives +inf, NaN stays NaN. Vectorised, this
 * is about 28 instructions per 16 lanes. */
/* the bits of exp(xc) for -86.98 <= xc <= 88.72283, as above */
static inline uint32_t aft_exp_bits(float xc)
{
    /* 1.5 * 2^23 + n, exactly: the float's unit in the last place is 1 */
    float big = fmaf(xc, 1.44269504088896341f, 12582912.0f);
    float n = big - 12582912.0f;
    float r = fmaf(n, -0.693145751953125f, xc);
    r = fmaf(n, -1.428606765330187e-06f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t bb, pb;
    memcpy(&bb, &big, sizeof bb);
    memcpy(&pb, &p, sizeof pb);
    return pb + ((bb - 0x4b400000u) << 23);   /* 0x4b400000: 1.5 * 2^23 */
}

static inline float aft_expf(float x)
{
    const float hi = 88.72283f, lo = -86.98f;   /* round(lo / ln 2) = -125 */
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    uint32_t yb = aft_exp_bits(xc), xb;
    memcpy(&xb, &x, sizeof xb);
    /* the edges, from x's bits with integer masks: a float comparison or a
     * select here makes GCC move the arithmetic above into branches, which
     * it then cannot vectorise without AVX-512's masks. A negative float's
     * unsigned bits grow with its magnitude; a positive one's are below
     * 0x80000000, and as signed integers positive floats keep their order */
    uint32_t under = 0u - (uint32_t)(xb > 0xc2adf5c3u);                  /* x < lo (-86.98f) */
    uint32_t over = 0u - (uint32_t)((int32_t)xb > (int32_t)0x42b17217);   /* x > hi (88.72283f) */
    uint32_t nan = 0u - (uint32_t)((xb & 0x7fffffffu) > 0x7f800000u);
    yb = (yb & ~(under | over)) | (over & 0x7f800000u);   /* 0 below, +inf above */
    yb = (yb & ~nan) | (xb & nan);                          /* NaN stays NaN */
    float y;
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* aft_expf for x <= 0 (-inf included) that is never NaN: a key less a
 * maximum over checked keys. The same value, without the edges such x
 * cannot reach (about 17 instructions a vector instead of 28). */
static inline float aft_expf_nonpos(float x)
{
    float xc = x < -86.98f ? -86.98f : x;
    uint32_t yb = aft_exp_bits(xc), xb;
    memcpy(&xb, &x, sizeof xb);
    yb &= ~(0u - (uint32_t)(xb > 0xc2adf5c3u));   /* 0 below -86.98 */
    float y;
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* exp(-|x|) through aft_expf_nonpos (-|x| <= 0), a NaN x put back (the
 * cheaper exponential would make it 0): the one exponential behind
 * sigmoid(x) = 1 / (1 + e) or e / (1 + e) by x's sign, and sigmoid'(x) =
 * e / (1 + e)^2, without cancellation for either sign */
static inline float aft_exp_neg_abs(float x)
{
    float e = aft_expf_nonpos(-fabsf(x));
    return x == x ? e : x;
}

/* sigmoid(q) and sigmoid'(q) from that one e = exp(-|q|) and one
 * reciprocal r = 1 / (1 + e): sigmoid(q) is r or e r by q's sign,
 * sigmoid'(q) = e r^2 (one vector loop where inlined) */
static inline __attribute__((always_inline)) void aft_sig_parts(float q, float *sq, float *ds)
{
    float e = aft_exp_neg_abs(q), r = 1.0f / (1.0f + e);
    *sq = q >= 0.0f ? r : e * r;
    *ds = e * r * r;
}

/* The widest vector whose operations are single instructions here: 16
 * floats with AVX-512, 8 with AVX/AVX2, 4 otherwise (GCC/Clang vector
 * extensions). Kernels written with wider vectors than the machine has get
 * them split into pieces, spilled and reassembled lane by lane, several
 * times slower than the machine's own width. */
#if defined(__AVX512F__)
#define AFT_VEC_BYTES 64
#elif defined(__AVX__)
#define AFT_VEC_BYTES 32
#else
#define AFT_VEC_BYTES 16
#endif
enum { AFT_VL = AFT_VEC_BYTES / 4 };   /* floats a vector */
typedef float aft_vf __attribute__((vector_size(AFT_VEC_BYTES)));
typedef int32_t aft_vi __attribute__((vector_size(AFT_VEC_BYTES)));
/* loads and stores through memcpy: rows are not vector-aligned */
static inline aft_vf aft_vld(const float *p) { aft_vf x; memcpy(&x, p, sizeof x); return x; }
static inline void aft_vst(float *p, aft_vf x) { memcpy(p, &x, sizeof x); }

/* the sum of a vector's lanes, halving the width: a loop over the lanes is
 * a chain of AFT_VL dependent scalar adds, which a row's reductions (a
 * LayerNorm's, a softmax's) then wait on */
static inline float aft_hsum(aft_vf v)
{
    /* halves by register shuffles: through memory, a 64-byte store read
     * back as 32-byte halves misses store forwarding and stalls */
    typedef float v4 __attribute__((vector_size(16)));
#if AFT_VEC_BYTES >= 64
    typedef float v8 __attribute__((vector_size(32)));
    v8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#elif AFT_VEC_BYTES >= 32
    aft_vf h = v;
#endif
#if AFT_VEC_BYTES >= 32
    v4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
#else
    v4 q = v;
#endif
    q += __builtin_shufflevector(q, q, 2, 3, 0, 1);
    return q[0] + q[1];
}

/* Hold a loaded vector in a register. Without this GCC folds the load into
 * every FMA that uses it as a memory operand, issuing more loads than
 * FMAs; on cores with one 512-bit load a cycle the loop is then bound by
 * its loads instead of its FMAs. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define AFT_IN_REG(x) __asm__("" : "+v"(x))
#else
#define AFT_IN_REG(x) ((void)0)
#endif

/* max of x[0..n), -inf when n == 0; NaNs are skipped. AFT_VL running
 * maxima side by side, because a plain loop's float max reduction does not
 * vectorise without -ffast-math. They start at -inf, not at x's first
 * vector: a lane that started at a NaN would keep it (no value compares
 * larger) and hide the rest of its lane. */
static inline float aft_max_f32(const float *x, size_t n)
{
    size_t i = 0;
    float r = -INFINITY;
    if (n >= AFT_VL) {
        aft_vf m = (aft_vf){0} - INFINITY;
        for (; i + AFT_VL <= n; i += AFT_VL) {
            aft_vf v = aft_vld(x + i);
            aft_vi gt = v > m;   /* all ones where v is larger */
            m = (aft_vf)(((aft_vi)v & gt) | ((aft_vi)m & ~gt));
        }
        for (int l = 0; l < AFT_VL; l++) r = m[l] > r ? m[l] : r;
    }
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* 1 / (1 + exp(-x)): exp(-x) overflowing to inf gives exactly 0 */
static inline float aft_sigmoidf(float x)
{
    return 1.0f / (1.0f + aft_expf(-x));
}

/* a den below this (in units of the row's stabiliser) means the fast path's
 * factorised exponentials may have lost the terms that matter: such entries
 * are recomputed exactly. Each lost term is below FLT_MIN (1.2e-38), so with
 * den >= 1e-20 what is lost is below T * 1e-18 relative. */
#define AFT_DEN_EXACT_BELOW 1e-20f

#endif /* AFT_NUMERICS_H */
