/* sample.c - the next token from a row of logits: greedy, or drawn from the
 * softmax at a temperature, optionally among the k most likely tokens only,
 * with aft's own small generator (splitmix64) so that a seed gives the same
 * tokens on every machine and build. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

uint64_t aft_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double aft_rng_uniform(uint64_t *state)
{
    return (double)(aft_rng_next(state) >> 11) * 0x1.0p-53;   /* 53 random bits: [0, 1) */
}

/* the largest logit, the lowest id among equals */
static size_t argmax(const float *x, size_t V)
{
    size_t best = 0;
    for (size_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct {
    float v;
    size_t id;
} scored;

/* larger logits first, then lower ids: a total order, so the draw below
 * does not depend on the sort */
static int by_logit(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

aft_status aft_sample(int32_t *token, const float *logits, size_t V, const aft_sampling *smp, uint64_t *rng,
                      aft_error *err)
{
    if (V == 0 || V > INT32_MAX) return aft_fail(err, AFT_ERR_ARG, "cannot sample from %zu logits", V);
    if (!(smp->temperature >= 0.0f) || isinf(smp->temperature))
        return aft_fail(err, AFT_ERR_ARG, "temperature %g: must be 0 (greedy) or positive and finite",
                        (double)smp->temperature);
    for (size_t i = 0; i < V; i++)
        if (isnan(logits[i])) return aft_fail(err, AFT_ERR_ARG, "logit %zu is NaN: the model's weights or state hold non-finite values", i);
    size_t best = argmax(logits, V);
    if (logits[best] == -INFINITY) return aft_fail(err, AFT_ERR_ARG, "every logit is -inf: no token can follow");
    /* greedy; also when one token, or one +inf, takes all the probability */
    if (smp->temperature == 0.0f || smp->top_k == 1 || V == 1 || logits[best] == INFINITY) {
        *token = (int32_t)best;
        return AFT_OK;
    }
    scored *s = aft_alloc_array(V, sizeof *s);
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory sampling from %zu logits", V);
    for (size_t i = 0; i < V; i++) s[i] = (scored){logits[i], i};
    qsort(s, V, sizeof *s, by_logit);
    size_t k = smp->top_k && smp->top_k < V ? smp->top_k : V;
    /* exp((l - max) / T) in double: the largest term is 1, none overflows */
    double total = 0.0, top = s[0].v, t = smp->temperature;
    for (size_t i = 0; i < k; i++) total += exp(((double)s[i].v - top) / t);
    double u = aft_rng_uniform(rng) * total, cum = 0.0;
    size_t pick = s[0].id;
    for (size_t i = 0; i < k; i++) {
        double p = exp(((double)s[i].v - top) / t);
        if (p == 0.0) break;   /* the rest are as unlikely */
        pick = s[i].id;
        cum += p;
        if (u < cum) break;
    }
    free(s);
    *token = (int32_t)pick;
    return AFT_OK;
}
