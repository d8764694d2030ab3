/* test_grad.c - the binding interface's layer backward (lib/api/grad.c):
 *  - the gradients' names and shapes (aft_api_layer_grad_info) are those
 *    aft grad writes, in its order, after "input";
 *  - each case of testdata/torch/ (labml's tbd, btd, local, full, simple,
 *    conv on a grid) gives dX and every parameter's gradient byte for byte
 *    as aft grad writes them for the same files, options and dY (the case's
 *    dy.npy, else ones), and y as aft_layer_backward gives it (conv on a
 *    grid on one thread: its bias gradient's sums are ordered by the
 *    threads' timing, in aft grad as here);
 *  - a gradient not wanted (NULL) leaves the others as they were;
 *  - the refusals: NULLs, a T past the bias, an index past the gradients;
 *  - the saved forward (lib/api/saved.c): aft_api_layer_backward_saved
 *    gives aft_api_layer_backward's dX and gradients byte for byte in every
 *    case (extreme values too, which take the exact paths), and y as the
 *    backward's; a buffer of the wrong size, or one no forward filled, is
 *    refused; a buffer saved on another thread count gives the same bits
 *    (its sums are made again);
 *  - OpenBLAS's thread count (the process's, a binding's host's too) and
 *    OpenMP's default are as the caller set them after every call. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <cblas.h>
#include <omp.h>

#include "aft.h"
#include "aftrun.h"

typedef struct {
    aftrun_case c;
    aft_api_layer *l;
    float *dy, *dx, *y;
    size_t n, ng;
    float *g[AFT_GRAD_SLOTS];
    size_t glen[AFT_GRAD_SLOTS];
} run;

/* the case's run; one thread: conv's bias gradient on a grid is summed in
 * an order that varies from run to run with more (aft grad's too) */
static void setup_run(run *r, const char *name, int one_thread)
{
    memset(r, 0, sizeof *r);
    aftrun_case_read(&r->c, name);
    if (one_thread) {
        size_t len = strlen(r->c.options);
        snprintf(r->c.options + len, sizeof r->c.options - len, " threads=1");
        r->c.argv[r->c.argc++] = "--threads";
        r->c.argv[r->c.argc++] = "1";
    }
    aftrun_case *c = &r->c;
    aft_error err;
    if (aft_api_layer_new(&r->l, c->w.n, (const char *const *)c->w.names, (const float *const *)c->w.data,
                          c->w.ndims, (const size_t *const *)c->w.shapes, c->options, &err) != AFT_OK)
        fail_msg("%s: %s", c->dir, err.msg);
    r->n = c->B * c->T * c->D;
    r->dx = malloc(r->n * sizeof(float));
    r->y = malloc(r->n * sizeof(float));
    if (access(aftrun_case_file(c, "dy.npy"), F_OK) == 0) {
        aftrun_arrays d;
        aftrun_arrays_read(&d, aftrun_case_file(c, "dy.npy"));
        r->dy = d.data[0];
        d.data[0] = NULL;
        aftrun_arrays_free(&d);
    } else {
        r->dy = malloc(r->n * sizeof(float));
        for (size_t i = 0; i < r->n; i++) r->dy[i] = 1.0f;
    }
    r->ng = aft_api_layer_grad_count(r->l);
    assert_true(r->ng <= AFT_GRAD_SLOTS);
    for (size_t i = 0; i < r->ng; i++) {
        size_t ndim, shape[4];
        assert_int_equal(aft_api_layer_grad_info(r->l, i, NULL, &ndim, shape, &err), AFT_OK);
        r->glen[i] = 1;
        for (size_t d = 0; d < ndim; d++) r->glen[i] *= shape[d];
        r->g[i] = malloc(r->glen[i] * sizeof(float));
        for (size_t k = 0; k < r->glen[i]; k++) r->g[i][k] = NAN;   /* every entry must be written */
    }
}

static void free_run(run *r)
{
    for (size_t i = 0; i < r->ng; i++) free(r->g[i]);
    free(r->dy), free(r->dx), free(r->y);
    aft_api_layer_free(r->l);
    aftrun_case_free(&r->c);
}

/* tensor `name` of the file f: n F32 values equal to x, bit for bit */
static void same_tensor(const aft_st_file *f, const char *name, const float *x, size_t n, size_t ndim,
                        const size_t *shape)
{
    const aft_tensor *t = aft_st_find(f, name);
    if (!t) fail_msg("aft grad wrote no '%s'", name);
    assert_int_equal(t->dtype, AFT_F32);
    assert_int_equal(t->nelem, n);
    if (shape) {
        assert_int_equal(t->ndim, ndim);
        for (size_t d = 0; d < ndim; d++) assert_int_equal(t->shape[d], shape[d]);
    }
    if (memcmp(t->data, x, n * sizeof(float)) != 0) {
        const float *y = t->data;
        size_t i = 0;
        while (i < n && memcmp(&x[i], &y[i], sizeof(float)) == 0) i++;
        fail_msg("'%s' [%zu] is %.9g, aft grad's %.9g", name, i, (double)x[i], (double)y[i]);
    }
}

static void against_cli(const char *name)
{
    run r;
    setup_run(&r, name, strncmp(name, "grid_conv", 9) == 0);
    aft_error err;
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, r.y, r.dy, r.c.x.data[0], r.c.B, r.c.T, &err), AFT_OK);

    const char *out = aftrun_tmp("g.safetensors");
    const char *args[26] = {"grad", "--weights", aftrun_case_file(&r.c, "weights.safetensors"), "-o", out,
                            aftrun_case_file(&r.c, "x.npy")};
    size_t k = 6;
    if (access(aftrun_case_file(&r.c, "dy.npy"), F_OK) == 0) {
        args[k++] = "--grad-output";
        args[k++] = aftrun_case_file(&r.c, "dy.npy");
    }
    memcpy(args + k, r.c.argv, r.c.argc * sizeof *args);
    if (aftrun(NULL, NULL, args) != 0) fail_msg("aft grad on %s failed", r.c.dir);
    aft_st_file *f;
    assert_int_equal(aft_st_open(out, &f, &err), AFT_OK);
    /* aft grad's tensors: "input", then the interface's, in its order */
    assert_int_equal(aft_st_count(f), r.ng + 1);
    const char *first;
    aft_st_get(f, 0, &first);
    assert_string_equal(first, "input");
    same_tensor(f, "input", r.dx, r.n, 0, NULL);
    for (size_t i = 0; i < r.ng; i++) {
        const char *gn, *fn;
        size_t ndim, shape[4];
        assert_int_equal(aft_api_layer_grad_info(r.l, i, &gn, &ndim, shape, &err), AFT_OK);
        assert_non_null(aft_st_get(f, i + 1, &fn));
        assert_string_equal(gn, fn);
        same_tensor(f, gn, r.g[i], r.glen[i], ndim, shape);
    }
    aft_st_close(f);
    free_run(&r);
}

static void test_cases(void **state)
{
    (void)state;
    static const char *const names[] = {"labml_local", "rish_local", "rish_full", "rish_simple", "grid_conv",
                                        "grid_conv_shared", "grid_local"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) against_cli(names[i]);
}

/* labml's names; y as the library's backward pass gives it; a gradient not
 * wanted */
static void test_names_and_y(void **state)
{
    (void)state;
    run r;
    setup_run(&r, "labml_local", 0);
    static const char *const want[] = {"query.weight", "query.bias", "key.weight", "key.bias", "value.weight",
                                       "value.bias", "output.weight", "output.bias", "pos_bias"};
    assert_int_equal(r.ng, 9);
    aft_error err;
    for (size_t i = 0; i < r.ng; i++) {
        const char *gn;
        size_t ndim, shape[4];
        assert_int_equal(aft_api_layer_grad_info(r.l, i, &gn, &ndim, shape, &err), AFT_OK);
        assert_string_equal(gn, want[i]);
        assert_int_equal(ndim, i == 8 ? 2 : i % 2 ? 1 : 2);
        assert_int_equal(shape[0], i == 8 ? 12 : 16);
    }
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, r.y, r.dy, r.c.x.data[0], r.c.B, r.c.T, &err), AFT_OK);
    float *y = malloc(r.n * sizeof(float)), *dx = malloc(r.n * sizeof(float)), *keep = malloc(r.n * sizeof(float));
    assert_int_equal(aft_api_layer_forward(r.l, y, r.c.x.data[0], r.c.B, r.c.T, &err), AFT_OK);
    for (size_t i = 0; i < r.n; i++) assert_true(fabsf(y[i] - r.y[i]) <= 1e-5f * fmaxf(1.0f, fabsf(y[i])));
    /* only dX and pos_bias: the other arrays are not touched */
    float *only[AFT_GRAD_SLOTS] = {0};
    only[8] = r.g[8];
    memcpy(keep, r.g[8], 144 * sizeof(float));
    for (size_t k = 0; k < 144; k++) r.g[8][k] = NAN;
    assert_int_equal(aft_api_layer_backward(r.l, dx, only, NULL, r.dy, r.c.x.data[0], r.c.B, r.c.T, &err), AFT_OK);
    assert_memory_equal(dx, r.dx, r.n * sizeof(float));
    assert_memory_equal(keep, r.g[8], 144 * sizeof(float));
    /* no parameters' gradients at all, no dX */
    assert_int_equal(aft_api_layer_backward(r.l, NULL, NULL, y, r.dy, r.c.x.data[0], r.c.B, r.c.T, &err), AFT_OK);
    assert_memory_equal(y, r.y, r.n * sizeof(float));
    free(y), free(dx), free(keep);
    free_run(&r);
}

static void test_refusals(void **state)
{
    (void)state;
    run r;
    setup_run(&r, "labml_local", 0);
    aft_error err;
    const float *x = r.c.x.data[0];
    assert_int_equal(aft_api_layer_backward(NULL, r.dx, r.g, NULL, r.dy, x, 3, 10, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) layer");
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, NULL, NULL, x, 3, 10, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) dy");
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, NULL, r.dy, NULL, 3, 10, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) x");
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, NULL, r.dy, x, 1, 13, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "sequence length T = 13 exceeds"));
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, NULL, r.dy, x, SIZE_MAX, 10, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "overflows"));
    const char *gn;
    assert_int_equal(aft_api_layer_grad_info(r.l, r.ng, &gn, NULL, NULL, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "no gradient 9: the layer has 9");
    assert_int_equal(aft_api_layer_grad_info(NULL, 0, &gn, NULL, NULL, &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_layer_grad_count(NULL), 0);
    free_run(&r);
}

/* the saved forward and backward against the recomputing backward */
static void saved_case(const char *name)
{
    run r;
    setup_run(&r, name, strncmp(name, "grid_conv", 9) == 0);
    aft_error err;
    const float *x = r.c.x.data[0];
    size_t B = r.c.B, T = r.c.T, n;
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, r.y, r.dy, x, B, T, &err), AFT_OK);
    assert_int_equal(aft_api_layer_saved_size(r.l, B, T, &n, &err), AFT_OK);
    float *saved = malloc(n * sizeof(float)), *y = malloc(r.n * sizeof(float)), *dx = malloc(r.n * sizeof(float));
    float *g[AFT_GRAD_SLOTS] = {0};
    for (size_t i = 0; i < r.ng; i++) g[i] = malloc(r.glen[i] * sizeof(float));
    assert_int_equal(aft_api_layer_forward_saved(r.l, y, saved, n, x, B, T, &err), AFT_OK);
    for (size_t i = 0; i < r.n; i++)
        if (!(fabsf(y[i] - r.y[i]) <= 1e-5f * fmaxf(1.0f, fabsf(r.y[i]))) && !(isnan(y[i]) && isnan(r.y[i])))
            fail_msg("%s: y[%zu] = %.9g, the backward's %.9g", name, i, (double)y[i], (double)r.y[i]);
    assert_int_equal(aft_api_layer_backward_saved(r.l, dx, g, r.dy, x, saved, n, B, T, &err), AFT_OK);
    assert_memory_equal(dx, r.dx, r.n * sizeof(float));
    for (size_t i = 0; i < r.ng; i++) assert_memory_equal(g[i], r.g[i], r.glen[i] * sizeof(float));
    /* the wrong size; a buffer no forward filled */
    assert_int_equal(aft_api_layer_backward_saved(r.l, dx, g, r.dy, x, saved, n - 1, B, T, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "saved holds"));
    memset(saved, 0, n * sizeof(float));
    assert_int_equal(aft_api_layer_backward_saved(r.l, dx, g, r.dy, x, saved, n, B, T, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "not what a saved forward left"));
    assert_int_equal(aft_api_layer_backward_saved(r.l, dx, g, r.dy, x, NULL, n, B, T, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) saved");
    for (size_t i = 0; i < r.ng; i++) free(g[i]);
    free(saved), free(y), free(dx);
    free_run(&r);
}

/* saved by a layer on another thread count: its sums have other bits, so
 * the backward makes them again and still gives its own backward's bits */
static void test_saved_other_threads(void **state)
{
    (void)state;
    run r, one;
    setup_run(&r, "rish_full", 0);
    setup_run(&one, "rish_full", 1);
    aft_error err;
    const float *x = r.c.x.data[0];
    size_t B = r.c.B, T = r.c.T, n, n1;
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, NULL, r.dy, x, B, T, &err), AFT_OK);
    assert_int_equal(aft_api_layer_saved_size(r.l, B, T, &n, &err), AFT_OK);
    assert_int_equal(aft_api_layer_saved_size(one.l, B, T, &n1, &err), AFT_OK);
    assert_int_equal(n, n1);
    float *saved = malloc(n * sizeof(float));
    assert_int_equal(aft_api_layer_forward_saved(one.l, one.y, saved, n, x, B, T, &err), AFT_OK);
    assert_int_equal(aft_api_layer_backward_saved(r.l, one.dx, one.g, r.dy, x, saved, n, B, T, &err), AFT_OK);
    assert_memory_equal(one.dx, r.dx, r.n * sizeof(float));
    for (size_t i = 0; i < r.ng; i++) assert_memory_equal(one.g[i], r.g[i], r.glen[i] * sizeof(float));
    free(saved);
    free_run(&one);
    free_run(&r);
}

static void test_blas_threads(void **state)
{
    (void)state;
    run r;
    setup_run(&r, "rish_full", 0);
    aft_error err;
    const float *x = r.c.x.data[0];
    size_t B = r.c.B, T = r.c.T, n;
    int omp = omp_get_max_threads();
    openblas_set_num_threads(3);
    omp_set_num_threads(omp);
    assert_int_equal(aft_api_layer_forward(r.l, r.y, x, B, T, &err), AFT_OK);
    assert_int_equal(openblas_get_num_threads(), 3);
    assert_int_equal(aft_api_layer_backward(r.l, r.dx, r.g, NULL, r.dy, x, B, T, &err), AFT_OK);
    assert_int_equal(openblas_get_num_threads(), 3);
    assert_int_equal(aft_api_layer_saved_size(r.l, B, T, &n, &err), AFT_OK);
    float *saved = malloc(n * sizeof(float));
    assert_int_equal(aft_api_layer_forward_saved(r.l, r.y, saved, n, x, B, T, &err), AFT_OK);
    assert_int_equal(aft_api_layer_backward_saved(r.l, r.dx, r.g, r.dy, x, saved, n, B, T, &err), AFT_OK);
    assert_int_equal(openblas_get_num_threads(), 3);
    assert_int_equal(omp_get_max_threads(), omp);
    /* a refused call too */
    assert_int_equal(aft_api_layer_forward(r.l, r.y, x, B, SIZE_MAX, &err), AFT_ERR_ARG);
    assert_int_equal(openblas_get_num_threads(), 3);
    openblas_set_num_threads(1);
    omp_set_num_threads(omp);
    free(saved);
    free_run(&r);
}

static void test_saved(void **state)
{
    (void)state;
    static const char *const names[] = {"labml_local", "labml_local_extreme", "rish_local", "rish_full",
                                        "rish_full_extreme", "rish_simple", "grid_conv", "grid_local"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) saved_case(names[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_names_and_y),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_saved),
        cmocka_unit_test(test_saved_other_threads),
        cmocka_unit_test(test_blas_threads),
    };
    return cmocka_run_group_tests(tests, NULL, aftrun_cleanup);
}
