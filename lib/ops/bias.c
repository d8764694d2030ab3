/* bias.c - where w[t, t'] comes from, for every kind of bias and variant. */
#include "kernels.h"

/* splitmix64's finaliser: a bijective mix, so distinct (seed, t, t2) give
 * independent-looking values */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

float aft_seeded_bias(uint64_t seed, float scale, size_t t, size_t t2)
{
    uint64_t h;
    if ((uint64_t)t < (1ULL << 32) && (uint64_t)t2 < (1ULL << 32))
        /* (t, t2) packed into 64 bits is one-to-one, so one mix suffices */
        h = mix64(mix64(seed ^ 0x5851f42d4c957f2dULL) ^ (((uint64_t)t << 32) | (uint64_t)t2));
    else
        h = mix64(mix64(mix64(seed ^ 0x5851f42d4c957f2dULL) ^ ((uint64_t)t * 0x9e3779b97f4a7c15ULL)) ^
                  ((uint64_t)t2 * 0xc2b2ae3d27d4eb4fULL));
    /* top 24 bits -> [0, 1), then to [-scale, scale) */
    float u = (float)(h >> 40) * (1.0f / 16777216.0f);
    return (2.0f * u - 1.0f) * scale;
}

float aft_bias_at(const aft_bias *b, size_t t, size_t t2)
{
    switch (b->kind) {
    case AFT_BIAS_DENSE:
        return b->dense[t * b->tmax + t2];
    case AFT_BIAS_FACTORED: {
        const float *u = b->u + t * b->rank, *v = b->v + t2 * b->rank;
        float s = 0.0f;
        for (size_t r = 0; r < b->rank; r++) s += u[r] * v[r];
        return s;
    }
    case AFT_BIAS_SEEDED:
        return aft_seeded_bias(b->seed, b->scale, t, t2);
    default:
        return 0.0f;
    }
}

/* raw bias entries b(t, j) for j in [j0, j1) */
static void bias_row(const aft_bias *b, size_t t, size_t j0, size_t j1, float *out)
{
    switch (b->kind) {
    case AFT_BIAS_DENSE:
        memcpy(out, b->dense + t * b->tmax + j0, (j1 - j0) * sizeof(float));
        return;
    case AFT_BIAS_SEEDED:
        if (j1 < (1ULL << 32) && t < (1ULL << 32)) {
            /* the same values as aft_seeded_bias, with the seed mixed once */
            uint64_t h0 = mix64(b->seed ^ 0x5851f42d4c957f2dULL), row = (uint64_t)t << 32;
            const float scale = b->scale;   /* a local: out might alias *b, which kept the loop scalar */
            for (size_t j = j0; j < j1; j++) {
                uint64_t x = mix64(h0 ^ (row | (uint64_t)j));
                /* x >> 40 < 2^24 converts exactly through int32 (AVX2 has no 64-bit conversion) */
                out[j - j0] = (2.0f * ((float)(int32_t)(x >> 40) * (1.0f / 16777216.0f)) - 1.0f) * scale;
            }
            return;
        }
        break;
    case AFT_BIAS_NONE:
        memset(out, 0, (j1 - j0) * sizeof(float));
        return;
    default:
        break;
    }
    for (size_t j = j0; j < j1; j++) out[j - j0] = aft_bias_at(b, t, j);
}

/* aft_w_row on a grid: the keys j of [j0, j1) in the 2-D window around t
 * (|r - r'| < s and |c - c'| < s), grid row by grid row; zero elsewhere */
static void grid_w_row(const aft_opspec *sp, size_t h, size_t t, size_t j0, size_t j1, float *out)
{
    const aft_bias *b = sp->bias;
    const size_t s = sp->window, W = sp->grid_w, r = t / W, c = t % W;
    memset(out, 0, (j1 - j0) * sizeof(float));
    if (s == 0 || j0 >= j1) return;
    /* the window's grid rows and columns, inclusive (a window of any size:
     * its far sides are clamped before they could wrap) */
    const size_t reach = aft_spec_grid_reach(sp);
    size_t rlo = r >= reach ? r - reach : 0, rhi = r + reach;
    size_t clo = c >= reach ? c - reach : 0, chi = c + reach < W - 1 ? c + reach : W - 1;
    rlo = rlo > j0 / W ? rlo : j0 / W;
    rhi = rhi < (j1 - 1) / W ? rhi : (j1 - 1) / W;
    const size_t len = sp->conv_len;   /* conv: 2S - 1, a square's side */
    const float *sq = sp->variant == AFT_CONV && b->kind == AFT_BIAS_CONV
                          ? b->conv + (sp->conv_rows == 1 ? 0 : h) * len * len : NULL;
    for (size_t rr = rlo; rr <= rhi; rr++) {
        size_t lo = rr * W + clo, hi = rr * W + chi + 1;   /* this row's window keys */
        lo = lo > j0 ? lo : j0;
        hi = hi < j1 ? hi : j1;
        if (lo >= hi) continue;
        if (sp->variant == AFT_LOCAL) {
            bias_row(b, t, lo, hi, out + (lo - j0));
        } else if (sq) {
            /* offset (rr - r, cc - c) at [rr - r + s - 1][cc - c + s - 1] */
            const float *row = sq + (rr + s - 1 - r) * len;
            for (size_t j = lo; j < hi; j++) out[j - j0] = row[j - rr * W + s - 1 - c];
        }
    }
}

void aft_w_row(const aft_opspec *sp, size_t h, size_t t, size_t j0, size_t j1, float *out)
{
    const aft_bias *b = sp->bias;
    size_t s = sp->window;
    if (sp->grid_w && (sp->variant == AFT_LOCAL || sp->variant == AFT_CONV)) {
        grid_w_row(sp, h, t, j0, j1, out);
        return;
    }
    switch (sp->variant) {
    case AFT_FULL:
        bias_row(b, t, j0, j1, out);
        return;
    case AFT_LOCAL: {
        /* the bias inside the window |t - j| < s, zero outside */
        size_t lo = t + 1 >= s ? t + 1 - s : 0, hi = t + s;
        lo = lo > j0 ? lo : j0;
        hi = hi < j1 ? hi : j1;
        memset(out, 0, (j1 - j0) * sizeof(float));
        if (s > 0 && lo < hi) bias_row(b, t, lo, hi, out + (lo - j0));
        return;
    }
    case AFT_CONV: {
        /* offset t' - t = j - t maps to entry j - t + s - 1 of the head's
         * row (a bias of one row serves every head) */
        const float *row = b->kind == AFT_BIAS_CONV ? b->conv + (sp->conv_rows == 1 ? 0 : h) * sp->conv_len : NULL;
        for (size_t j = j0; j < j1; j++) {
            size_t dist = j > t ? j - t : t - j;
            out[j - j0] = dist < s && row ? row[j + s - 1 - t] : 0.0f;
        }
        return;
    }
    case AFT_SIMPLE:
        memset(out, 0, (j1 - j0) * sizeof(float));
        return;
    }
}
