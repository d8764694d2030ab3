/* opcheck.h - the forward tests' cases: an operator case (variant, bias
 * kind, sizes, mask, input form, seed) built from a seeded PRNG, run through
 * aft_op_forward with cfg.impl = AFT_IMPL_FAST and AFT_IMPL_REFERENCE and
 * held to the float64 reference in ref_aft.c; the grids of such cases; a
 * layer case held to ref_aft.c's layer; and the check that a refusal's
 * message names its problem. Shared by tests/ops/ (the kernels and the
 * dispatch), tests/test_layer.c and tests/test_layer_chunks.c.
 *
 * Pass criterion for a comparison: every output finite and
 *   max |out - ref| <= 2e-5 * max(1, max |ref|),
 * and a (b, t, c) with nothing visible is exactly 0. A failure prints the
 * case (variant, sizes, options, seed) so it can be rerun. */
#ifndef AFT_TEST_OPCHECK_H
#define AFT_TEST_OPCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "aft.h"
#include "cases.h"

#define OP_TOL_REL 2e-5       /* the comparison tolerance, relative to max(1, max|ref|) */
#define OP_THREAD_TOL 1e-6    /* threads = 1 vs 2, relative to max(1, max|out|) */

/* ---------------------------------------------------------------- operator cases */

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;      /* full/local: where w comes from; conv: AFT_BIAS_CONV */
    size_t B, T, C;
    size_t heads, window;
    int shared_keys;         /* conv: kc = heads instead of C */
    int causal;
    mask_mode mask;
    vals_mode vals;
    uint64_t seed;
    int threads;             /* cfg.threads for the library call (0 = all cores) */
} op_case;

/* who runs full's products in the cases built from here on (the OpenBLAS
 * path: AFT_KERNEL_BLAS); AFT_KERNEL_AUTO unless a test sets it */
extern aft_kernel g_full_product;

/* everything one case needs: inputs, bias storage, config, reference output */
typedef struct {
    op_case c;
    size_t kc;
    float *q, *k, *v;
    float *dense, *fu, *fv, *conv;
    uint8_t *mask;
    aft_bias bias;
    aft_config cfg;
    double *ref;
} case_data;

/* the case in words, for a failure's message */
void op_describe(char *buf, size_t n, const op_case *c, size_t kc);
/* c's inputs, bias and configuration, and the reference's output */
void build_case(case_data *d, const op_case *c);
void free_case(case_data *d);
/* one case against both implementations; returns the number of failures */
int op_run_case(const op_case *c, int *reports);
/* the end of every grid test: all cases must have passed */
void op_finish(int fails, int cases);

/* a dense bias: w (tmax x tmax), row t for query t */
aft_bias dense_bias(const float *w, size_t tmax);
/* a configuration for the reference impl (full's products: g_full_product) */
aft_config make_cfg(aft_variant v, size_t window, size_t heads, int causal);

/* full, local or simple over windows x causal x mask x T, with (B, C)
 * cycling, for one bias kind; window codes: 999 means T, 1000 means T + 4 */
void grid_full(aft_variant variant, aft_bias_kind kind, const size_t *windows, size_t nwin, uint64_t seed);

/* ---------------------------------------------------------------- layer cases */

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;
    size_t heads, window;
    int shared_keys;
} layer_variant;

/* the streamed causal path (test_layer_chunks.c): chunks of this many rows
 * for the fast impl, which must then take that path (0: aft_layer_forward);
 * and the scale of the key biases (large ones make the left sums' maxima
 * jump at chunk boundaries) */
extern size_t g_chunk;
extern double g_key_bias;

/* a layer's parameters with the given weights, nothing else set */
aft_params layer_params(size_t D, size_t C, const float *wq, const float *wk, const float *wv, const float *wo);
/* one random layer (weights ~ U[-1,1] / sqrt(fan in)) through
 * aft_layer_forward (or the chunked path, g_chunk) with both impls, against
 * ref_aft_layer; returns the number of failures */
int run_layer_case(const layer_variant *lv, size_t B, size_t T, size_t D, size_t C, int with_biases, int causal,
                   mask_mode mask, uint64_t seed, int threads, int *reports);

/* ---------------------------------------------------------------- refusals */

/* case-insensitive substring */
int contains_ci(const char *hay, const char *needle);
/* The call must fail with a one-line message that names the problem: one of
 * the words (';'-separated), or else all the numbers (terminated by 0).
 * Returns 1 when it does, else prints why and returns 0. */
int check_error(const char *what, aft_status st, const aft_error *err, const char *words, const size_t *numbers);

#endif
