/* cases.h - what the operator's tests share to describe a case: the masks,
 * the forms of the inputs (normal, extreme, adversarial), the names printed
 * with a failure, the random mask, and the small sizes every kernel's grid
 * of cases walks through (opcheck.h for the forward, gradcheck.h for the
 * backward). */
#ifndef AFT_TEST_CASES_H
#define AFT_TEST_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "aft.h"
#include "rng.h"

#define N_OF(a) (sizeof (a) / sizeof *(a))
#define MAX_REPORTS 12     /* mismatches printed per test before only counting */

/* MASK_CAUSAL: exactly t' <= t (the grids' tests: the library then runs the
 * grid kernel, causal) */
typedef enum { MASK_NONE, MASK_SHARED, MASK_BATCHED, MASK_CAUSAL } mask_mode;
extern const char *const mask_names[];   /* "none", "TxT", "BxTxT", "TxT-causal" */

typedef enum {
    VALS_NORMAL,     /* q, k ~ N(0,1), v, w ~ U[-1,1] */
    VALS_WIDE,       /* k ~ U[-500,500], w ~ U[-250,250], q ~ U[-100,100] */
    VALS_ONE_HUGE,   /* k = +500 at t0 = 2T/3, -500 elsewhere; w ~ U[-250,250] */
    VALS_ADVERSE,    /* per key channel, for one query row t*: k = 375 - w/2, so
                      * the largest key (~500) sits where w is most negative
                      * (k + w ~ 250) while k + w peaks (~500) where k is ~250
                      * below its maximum: exp(k - max k) underflows in float */
    VALS_RISING,     /* dense bias only: w[t,j] ~ U[-1,1] + 5 (j / 256), + 100
                      * from j = 768 on; q, k ~ N(0,1): each 256-key chunk
                      * raises every row's maximum of w, by 100 nats once */
    VALS_BEYOND_KEY, /* the backward's: normal values but one key entry, or */
    VALS_BEYOND_BIAS /* one dense bias entry, of 3e38: beyond the sizes for
                      * which the band backward takes its cheaper exponential
                      * (local_conv_grad.c's tame inputs) */
} vals_mode;
extern const char *const vals_names[];
extern const char *const kind_names[];   /* by aft_bias_kind */

/* "fast" or "reference" */
const char *impl_name(aft_impl impl);

/* The random mask: each entry visible with probability 0.7, and some rows
 * fully invisible (rows t with (t + b) % 5 == 2; b = 0 for a shared mask). */
uint8_t *make_mask(rng *r, size_t nb, size_t T);

/* A factored bias for T rows into b, tmax T + 2 (*u, *v malloc'd, tmax x
 * rank each, drawn in turn): rank 3 with u, v ~ U[-0.6, 0.6]; extreme: rank
 * 2 with |u|, |v| <= 11 on a grid of 1/16, so |w| <= 242. Returns the
 * entries of each, tmax x rank. */
size_t make_factored(rng *r, aft_bias *b, float **u, float **v, size_t T, int extreme);

/* A case's inputs, malloc'd, drawn from r: q, v (B, T, C) a row entry at a
 * time (q ~ N(0,1), or U[-100, 100] for VALS_WIDE; v ~ U[-1,1]), then k (B,
 * T, kc) as vals says, VALS_ADVERSE's from bias under cfg (the bias the
 * operator is given; its heads when cfg->variant is AFT_CONV). */
void make_qkv(rng *r, float **q, float **k, float **v, vals_mode vals, const aft_bias *bias, const aft_config *cfg,
              size_t B, size_t T, size_t C, size_t kc);

/* the lengths the small grids of cases walk through, and the (B, C) pairs
 * cycled through them: every T meets each pair */
extern const size_t small_T[4];
extern const size_t grid_BC[4][2];

/* Small grids call the library thousands of times: most calls use one
 * thread so the suite stays fast on a busy machine; every fourth uses all
 * cores (threads = 0) so each variant also runs its parallel path. */
int grid_threads(int n);

#endif
