/* sums.h - the stabilised softmax sums of a set of keys, per channel, and
 * their merge (sums.c). Every causal and chunked path carries these: the
 * layer's pipeline between chunks, and the parts a sequence is split into.
 *
 * Sums of n channels are 4 n floats, four arrays of n: m, the stabiliser
 * (the largest key held, -inf for none); s0 = sum exp(k - m); s1 =
 * sum exp(k - m) v; and kmax, the largest key held (kept apart from m
 * because kernels may hold their sums at a stabiliser above it). Every
 * factor is exp of something <= 0, so nothing overflows, and the merge of
 * two sums is associative up to rounding: sums of pieces of a sequence can
 * be combined in any grouping. */
#ifndef AFT_SUMS_H
#define AFT_SUMS_H

#include "numerics.h"

/* The sums (m, s0, s1) of keys [r0, r1) (n channels, rows ldk and ldv
 * apart), m raised a block of rows at a time so every factor is <= 1;
 * scratch: n floats. Returns 1 when a key is +inf or NaN (the sums are then
 * unusable). */
int aft_sums_of_rows(const float *k, size_t ldk, const float *v, size_t ldv, size_t r0, size_t r1, size_t n,
                     float *m, float *s0, float *s1, float *scratch);

/* a += b for sums of n channels (4 n floats each, as above): both brought to
 * the larger stabiliser and added; kmax the larger of the two */
void aft_sums_merge(float *a, const float *b, size_t n);

/* Sums of no keys: m = kmax = -inf, s0 = s1 = 0. */
void aft_sums_empty(float *a, size_t n);

/* Channel c of parts 0 .. np-1, part i at parts + i * stride as (m, s0, s1)
 * arrays of n: brought to their largest m (*m) and added (*s0, *s1). */
static inline void aft_sums_merge_channel(const float *parts, size_t stride, size_t np, size_t n, size_t c,
                                          float *m, float *s0, float *s1)
{
    float M = -INFINITY;
    for (size_t i = 0; i < np; i++) {
        float mi = parts[i * stride + c];
        M = mi > M ? mi : M;
    }
    float a0 = 0.0f, a1 = 0.0f;
    for (size_t i = 0; i < np; i++) {
        const float *pi = parts + i * stride;
        float f = pi[c] == -INFINITY ? 0.0f : aft_expf(pi[c] - M);
        a0 += pi[n + c] * f;
        a1 += pi[2 * n + c] * f;
    }
    *m = M;
    *s0 = a0;
    *s1 = a1;
}

#endif /* AFT_SUMS_H */
