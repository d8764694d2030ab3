/*
 * test_ref_grad.c - the float64 reference backward (lib/ops/ref_grad.c,
 * cfg.impl = AFT_IMPL_REFERENCE of aft_op_backward) against central finite
 * differences of the tests' own float64 forward (ref_aft.c, written from
 * the maths, not from lib/): every gradient, on small cases of every
 * variant, bias kind, mask, causal or not, B 1 and 2, and keys of +-500
 * with biases of +-250. The fast kernels are then held to this reference
 * (the *_grad.c tests beside this one).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "aft.h"
#include "gradcheck.h"
#include "ref_aft.h"
#include "rng.h"

/* sum dout * Y from ref_aft.c's float64 forward (one-row conv biases
 * repeated for every head: ref_aft.c reads (heads, 2S-1)) */
typedef struct {
    const gdata *d;
    double *qd, *kd, *vd, *y;
    float *conv_rows;   /* the conv bias as (heads, 2S-1) */
    aft_bias bias;
} fd_ctx;

static void fd_sync_conv(fd_ctx *x)
{
    const gdata *d = x->d;
    if (!d->conv) return;
    size_t len = 2 * d->c.window - 1;
    for (size_t h = 0; h < d->H; h++)
        memcpy(x->conv_rows + h * len, d->conv + (d->c.one_row ? 0 : h) * len, len * sizeof(float));
}

static double fd_loss(fd_ctx *x)
{
    const gdata *d = x->d;
    fd_sync_conv(x);
    aft_config cfg = d->cfg;
    assert_int_equal(ref_aft_op_d(x->y, x->qd, x->kd, x->vd, &x->bias, &cfg, d->c.B, d->c.T, d->c.C, d->kc), 0);
    double s = 0.0;
    for (size_t i = 0; i < d->nq; i++) s += (double)d->dout[i] * x->y[i];
    return s;
}

/* central differences of fd_loss in each entry of a double array */
static void fd_double(fd_ctx *x, double *a, size_t n, double *g)
{
    for (size_t i = 0; i < n; i++) {
        double a0 = a[i], h = 1e-6 * (fabs(a0) > 1.0 ? fabs(a0) : 1.0);
        a[i] = a0 + h;
        double fp = fd_loss(x);
        a[i] = a0 - h;
        double fm = fd_loss(x);
        a[i] = a0;
        g[i] = (fp - fm) / (2.0 * h);
    }
}

/* the same for a float array (the bias): a step of 2^-12 times the entry's
 * power of two, so a +- h is exact */
static void fd_float(fd_ctx *x, float *a, size_t n, double *g)
{
    for (size_t i = 0; i < n; i++) {
        float a0 = a[i];
        int e;
        frexpf(a0, &e);
        float h = ldexpf(1.0f, (fabsf(a0) > 1.0f ? e : 1) - 13);
        a[i] = a0 + h;
        double fp = fd_loss(x);
        a[i] = a0 - h;
        double fm = fd_loss(x);
        a[i] = a0;
        g[i] = (fp - fm) / (2.0 * (double)h);
    }
}

static int fd_case(const gcase *c, int *reports)
{
    gdata d;
    grad_build(&d, c);
    char what[512];
    grad_describe(what, sizeof what, c);
    grads g;
    aft_error err = {{0}};
    aft_status st = run_backward(&g, &d, AFT_IMPL_REFERENCE, 1, &err);
    int fails = 0;
    if (st != AFT_OK) {
        print_message("FAIL reference backward status %d (%s): %s\n", (int)st, err.msg, what);
        fails = 1;
        goto done;
    }
    fd_ctx x = {.d = &d};
    x.qd = xmalloc(d.nq * sizeof(double));
    x.vd = xmalloc(d.nq * sizeof(double));
    x.kd = xmalloc(d.nk * sizeof(double));
    x.y = xmalloc(d.nq * sizeof(double));
    for (size_t i = 0; i < d.nq; i++) {
        x.qd[i] = d.q[i];
        x.vd[i] = d.v[i];
    }
    for (size_t i = 0; i < d.nk; i++) x.kd[i] = d.k[i];
    x.bias = d.bias;
    if (d.conv) {
        x.conv_rows = xmalloc(d.H * (2 * c->window - 1) * sizeof(float));
        x.bias.conv = x.conv_rows;
        x.bias.conv_len = 0;
        x.bias.conv_rows = 0;
    }
    double *fd = xmalloc((d.nq + d.nk + d.ndense + 2 * d.nfac + d.nconv + 1) * sizeof(double));
    /* the forward output first */
    (void)fd_loss(&x);
    fails += grad_compare("out", g.out, x.y, d.nq, GRAD_FD_TOL, what, reports);
    fd_double(&x, x.qd, d.nq, fd);
    fails += grad_compare("dq", g.dq, fd, d.nq, GRAD_FD_TOL, what, reports);
    fd_double(&x, x.kd, d.nk, fd);
    fails += grad_compare("dk", g.dk, fd, d.nk, GRAD_FD_TOL, what, reports);
    fd_double(&x, x.vd, d.nq, fd);
    fails += grad_compare("dv", g.dv, fd, d.nq, GRAD_FD_TOL, what, reports);
    if (d.ndense) {
        fd_float(&x, d.dense, d.ndense, fd);
        fails += grad_compare("d dense", g.ddense, fd, d.ndense, GRAD_FD_TOL_BIAS, what, reports);
    }
    if (d.nfac) {
        fd_float(&x, d.fu, d.nfac, fd);
        fails += grad_compare("d u", g.du, fd, d.nfac, GRAD_FD_TOL_BIAS, what, reports);
        fd_float(&x, d.fv, d.nfac, fd);
        fails += grad_compare("d v (factored)", g.dv_f, fd, d.nfac, GRAD_FD_TOL_BIAS, what, reports);
    }
    if (d.nconv) {
        fd_float(&x, d.conv, d.nconv, fd);
        fails += grad_compare("d conv", g.dconv, fd, d.nconv, GRAD_FD_TOL_BIAS, what, reports);
    }
    free(fd);
    free(x.qd); free(x.kd); free(x.vd); free(x.y); free(x.conv_rows);
done:
    grads_free(&g);
    grad_free_data(&d);
    return fails;
}

/* every variant and bias kind, causal or not, each mask, B 1 and 2 */
static void test_ref_grad_fd(void **state)
{
    (void)state;
    typedef struct { aft_variant v; aft_bias_kind k; size_t heads, window; int shared, one_row; } vk;
    const vk vks[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 0, 0, 0, 0},   {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, 0, 0},
        {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, 0, 0},  {AFT_FULL, AFT_BIAS_NONE, 0, 0, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0, 0},  {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 2, 0, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 4, 0, 0}, {AFT_LOCAL, AFT_BIAS_DENSE, 0, 0, 0, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0, 0},  {AFT_CONV, AFT_BIAS_CONV, 2, 3, 0, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 3, 1, 0},    {AFT_CONV, AFT_BIAS_CONV, 3, 2, 1, 1},
        {AFT_CONV, AFT_BIAS_CONV, 1, 9, 0, 0},
    };
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(vks); i++)
        for (int causal = 0; causal <= 1; causal++)
            for (int mask = MASK_NONE; mask <= MASK_BATCHED; mask++) {
                size_t B = (cases & 1) ? 2 : 1, T = 7 + (size_t)(cases % 3), C = 6;
                gcase c = {vks[i].v, vks[i].k, B, T, C, vks[i].heads, vks[i].window, vks[i].shared, causal,
                           (mask_mode)mask, VALS_NORMAL, 10 + (uint64_t)cases, 1, vks[i].one_row};
                fails += fd_case(&c, &reports);
                cases++;
            }
    grad_finish(fails, cases);
}

/* keys of +-500 and biases of +-250: the gradients are those of a softmax
 * close to one-hot, and finite differences still see them */
static void test_ref_grad_fd_extreme(void **state)
{
    (void)state;
    const gcase cs[] = {
        {AFT_FULL, AFT_BIAS_DENSE, 2, 9, 4, 0, 0, 0, 0, MASK_NONE, VALS_WIDE, 31, 1, 0},
        {AFT_FULL, AFT_BIAS_DENSE, 1, 9, 4, 0, 0, 0, 1, MASK_BATCHED, VALS_ADVERSE, 32, 1, 0},
        {AFT_FULL, AFT_BIAS_FACTORED, 1, 8, 4, 0, 0, 0, 1, MASK_NONE, VALS_WIDE, 33, 1, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 1, 9, 4, 0, 3, 0, 0, MASK_NONE, VALS_ADVERSE, 34, 1, 0},
        {AFT_LOCAL, AFT_BIAS_SEEDED, 2, 9, 4, 0, 2, 0, 1, MASK_NONE, VALS_ONE_HUGE, 35, 1, 0},
        {AFT_SIMPLE, AFT_BIAS_NONE, 2, 9, 4, 0, 0, 0, 0, MASK_NONE, VALS_WIDE, 36, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 9, 4, 2, 3, 1, 1, MASK_SHARED, VALS_WIDE, 37, 1, 0},
        {AFT_CONV, AFT_BIAS_CONV, 1, 9, 4, 2, 3, 0, 0, MASK_NONE, VALS_ADVERSE, 38, 1, 0},
    };
    int fails = 0, reports = 0;
    for (size_t i = 0; i < N_OF(cs); i++) fails += fd_case(&cs[i], &reports);
    grad_finish(fails, (int)N_OF(cs));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_grad_fd),
        cmocka_unit_test(test_ref_grad_fd_extreme),
    };
    /* TEST_GRAD_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_GRAD_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
