/* bias.c - where w[t, t'] comes from, for every kind of bias and variant. */
#include "internal.h"

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
    uint64_t h = mix64(seed ^ 0x5851f42d4c957f2dULL);
    h = mix64(h ^ ((uint64_t)t * 0x9e3779b97f4a7c15ULL));
    h = mix64(h ^ ((uint64_t)t2 * 0xc2b2ae3d27d4eb4fULL));
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

void aft_w_row(const aft_wspec *ws, size_t h, size_t t, size_t j0, size_t j1, float *out)
{
    const aft_bias *b = ws->bias;
    size_t s = ws->window;
    for (size_t j = j0; j < j1; j++) {
        float w = 0.0f;
        size_t dist = j > t ? j - t : t - j;
        switch (ws->variant) {
        case AFT_FULL:
            w = aft_bias_at(b, t, j);
            break;
        case AFT_LOCAL:
            if (dist < s) w = aft_bias_at(b, t, j);
            break;
        case AFT_CONV:
            /* offset t' - t = j - t maps to entry j - t + s - 1 of the head's row */
            if (dist < s && b->kind == AFT_BIAS_CONV)
                w = b->conv[h * (2 * s - 1) + (j + s - 1 - t)];
            break;
        case AFT_SIMPLE:
            break;
        }
        out[j - j0] = w;
    }
}
