/* gradcheck.h - the backward tests' cases: an operator case (gcase:
 * variant, bias kind, sizes, mask, input form, seed) built from a seeded
 * PRNG with a random dout, run through aft_op_backward, and the comparison
 * of its gradients with another run's (the float64 reference impl, other
 * threads) or with finite differences. Shared by the tests of the backward
 * kernels in tests/ops/ and of the layer's backward (tests/test_layer_grad.c).
 *
 * The fast kernels are held to the reference per tensor:
 *   max |g - g64| <= 1e-4 * max(1, max |g64|),
 * and g finite wherever g64 is. Extreme inputs lie on a grid of 2^-8 (keys,
 * biases), so that K + w is exact in float: any failure there is the
 * algorithm's. */
#ifndef AFT_TEST_GRADCHECK_H
#define AFT_TEST_GRADCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "aft.h"
#include "cases.h"

#define GRAD_TOL_REL 1e-4        /* fast against float64, relative to max(1, max |g64|) */
#define GRAD_TOL_SAME 1e-6       /* one fast path against itself, other products or cuts */
#define GRAD_FD_TOL 2e-6         /* the reference against finite differences (q, k, v) */
#define GRAD_FD_TOL_BIAS 2e-5    /* (bias entries and weights: a float step, h^2 larger) */
#define GRAD_THREAD_TOL 1e-5     /* one thread against several */

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;
    size_t B, T, C;
    size_t heads, window;
    int shared_keys;     /* conv: kc = heads */
    int causal;
    mask_mode mask;
    vals_mode vals;
    uint64_t seed;
    int threads;
    int one_row;         /* conv: a bias of one row for every head (shape recorded) */
} gcase;

/* inputs, bias storage and configuration of one case */
typedef struct {
    gcase c;
    size_t kc, H, nq, nk, ndense, nfac, nconv;
    float *q, *k, *v, *dout;
    float *dense, *fu, *fv, *conv;
    uint8_t *mask;
    aft_bias bias;
    aft_config cfg;
} gdata;

/* what one backward call gives */
typedef struct {
    float *dq, *dk, *dv, *out, *ddense, *du, *dv_f, *dconv;
} grads;

void grad_describe(char *buf, size_t n, const gcase *c);
/* c's inputs, bias storage and configuration */
void grad_build(gdata *d, const gcase *c);
void grad_free_data(gdata *d);
/* g's arrays for d's sizes (the bias gradients NaN: unwritten entries show) */
void grads_alloc(grads *g, const gdata *d);
void grads_free(grads *g);
/* one backward call with impl and threads into new arrays; returns the status */
aft_status run_backward(grads *g, const gdata *d, aft_impl impl, int threads, aft_error *err);

/* got against want (n entries): finite wherever want is, and max |got -
 * want| <= tol * max(1, max |want|). Returns 1 on a failure (printed while
 * *reports < MAX_REPORTS). */
int grad_compare(const char *tensor, const float *got, const double *want, size_t n, double tol, const char *what,
                 int *reports);
int grad_compare_f(const char *tensor, const float *got, const float *want, size_t n, double tol, const char *what,
                   int *reports);
/* every tensor of two backward results */
int compare_grads(const grads *got, const grads *want, const gdata *d, double tol, const char *what, int *reports);
/* the end of a test of many cases: all must have passed */
void grad_finish(int fails, int cases);

/* one case: the fast kernels (c->threads) against the float64 reference */
int grad_run_case(const gcase *c, int *reports);
/* every case of a table, fast against the reference */
void grad_run_table(const gcase *cs, size_t n);
/* full, local or simple over windows x causal x mask x T x (B, C); window
 * codes 999 = T, 1000 = T + 4 */
void grad_grid(aft_variant variant, aft_bias_kind kind, const size_t *windows, size_t nwin, uint64_t seed);

#endif
