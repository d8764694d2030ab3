/* rng.c - the lib tests' random data (rng.h) */
#include "rng.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>

#include <cmocka.h>

uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_unif(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

double rng_sym(rng *r)
{
    return 2.0 * rng_unif(r) - 1.0;
}

double rng_normal(rng *r)
{
    double u1 = rng_unif(r), u2 = rng_unif(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float on_grid(double x, double step)
{
    return (float)(nearbyint(x / step) * step);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    assert_non_null(p);
    return p;
}

float *randf(rng *r, size_t n, double scale)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_sym(r));
    return x;
}

double *randd(rng *r, size_t n, double scale)
{
    double *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_sym(r);
    return x;
}
