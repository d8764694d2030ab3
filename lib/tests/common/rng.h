/* rng.h - the lib tests' random data: splitmix64, small and seedable, so
 * each test's inputs are the same in every run, and allocation that fails
 * the test instead of returning NULL. */
#ifndef AFT_TEST_RNG_H
#define AFT_TEST_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t s; } rng;

uint64_t rng_next(rng *r);
/* uniform in [0, 1) with 53 random bits */
double rng_unif(rng *r);
/* uniform in [-1, 1) */
double rng_sym(rng *r);
/* standard normal by Box-Muller (one of the pair) */
double rng_normal(rng *r);
/* x rounded to a multiple of step (a power of two), so sums stay exact */
float on_grid(double x, double step);
/* n floats uniform in [-scale, scale) */
float *randf(rng *r, size_t n, double scale);
/* n doubles uniform in [-scale, scale) */
double *randd(rng *r, size_t n, double scale);
/* malloc and calloc that fail the test when out of memory (never NULL) */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);

#endif
