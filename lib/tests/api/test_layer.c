/* test_layer.c - the binding interface's layer forward (lib/api/layer.c):
 *  - each case of testdata/torch/ (btd and labml's tbd, local, full,
 *    simple, conv and local on a grid) through aft_api_layer_new on the
 *    weights' arrays and aft_api_layer_forward gives, byte for byte, what
 *    aft run writes for the same files and options, and what
 *    aft_layer_forward gives on the same arrays;
 *  - a prefix finds the same layer among other tensors;
 *  - the arrays are borrowed: changing one changes the output;
 *  - the dims; the refusals (a T past the bias, a grid that does not fit,
 *    sizes that overflow, missing or misshapen arrays, NULLs), each
 *    AFT_ERR_ARG or the reader's status, with one line;
 *  - two layers on two threads at once give what each gives alone. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "aft.h"
#include "aftrun.h"

/* the case's layer from its arrays and options */
static aft_api_layer *case_layer(const aftrun_case *c, const char *options)
{
    aft_api_layer *l;
    aft_error err;
    if (aft_api_layer_new(&l, c->w.n, (const char *const *)c->w.names, (const float *const *)c->w.data, c->w.ndims,
                          (const size_t *const *)c->w.shapes, options, &err) != AFT_OK)
        fail_msg("%s (%s): %s", c->dir, options, err.msg);
    return l;
}

/* y of the case through the interface */
static float *case_forward(const aftrun_case *c, aft_api_layer *l)
{
    float *y = malloc(c->B * c->T * c->D * sizeof(float));
    aft_error err;
    assert_non_null(y);
    if (aft_api_layer_forward(l, y, c->x.data[0], c->B, c->T, &err) != AFT_OK) fail_msg("%s: %s", c->dir, err.msg);
    return y;
}

/* the case against aft run on its files */
static void against_cli(const char *name)
{
    aftrun_case c;
    aftrun_case_read(&c, name);
    aft_api_layer *l = case_layer(&c, c.options);
    size_t D, C;
    aft_api_layer_dims(l, &D, &C);
    assert_int_equal(D, c.D);
    float *y = case_forward(&c, l);
    const char *out = aftrun_tmp("y.npy");
    const char *args[24] = {"run", "--weights", aftrun_case_file(&c, "weights.safetensors"), "-o", out,
                            aftrun_case_file(&c, "x.npy")};
    memcpy(args + 6, c.argv, c.argc * sizeof *args);
    if (aftrun(NULL, NULL, args) != 0) fail_msg("aft run on %s failed", c.dir);
    aftrun_same_npy(y, c.B * c.T * c.D, out);
    free(y);
    aft_api_layer_free(l);
    aftrun_case_free(&c);
}

static void test_cases(void **state)
{
    (void)state;
    static const char *const names[] = {"rish_local", "labml_local", "labml_local_extreme", "rish_full",
                                        "rish_full_extreme", "rish_simple", "grid_conv", "grid_conv_shared",
                                        "grid_local"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) against_cli(names[i]);
}

/* labml's case through the interface and through aft_layer_forward on the
 * arrays: the same bytes */
static void test_as_library(void **state)
{
    (void)state;
    aftrun_case c;
    aftrun_case_read(&c, "labml_local");   /* tbd: (T, B, D) */
    aft_api_layer *l = case_layer(&c, "variant=local window=4 causal=1");   /* btd: the same arrays as (B, T, D) */
    size_t n = c.B * c.T * c.D;
    float *y = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    aft_error err;
    assert_int_equal(aft_api_layer_forward(l, y, c.x.data[0], c.B, c.T, &err), AFT_OK);
    aft_params p = {.d_model = 16, .d_hidden = 16, .k_out = 16};
    p.wq = aftrun_array(&c.w, "query.weight"), p.bq = aftrun_array(&c.w, "query.bias");
    p.wk = aftrun_array(&c.w, "key.weight"), p.bk = aftrun_array(&c.w, "key.bias");
    p.wv = aftrun_array(&c.w, "value.weight"), p.bv = aftrun_array(&c.w, "value.bias");
    p.wo = aftrun_array(&c.w, "output.weight"), p.bo = aftrun_array(&c.w, "output.bias");
    p.bias = (aft_bias){.kind = AFT_BIAS_DENSE, .dense = aftrun_array(&c.w, "pos_bias"), .tmax = 12};
    aft_config cfg = {.variant = AFT_LOCAL, .window = 4, .causal = 1};
    assert_int_equal(aft_layer_forward(want, c.x.data[0], &p, &cfg, c.B, c.T, &err), AFT_OK);
    assert_memory_equal(y, want, n * sizeof(float));

    /* borrowed, not copied: a changed weight changes the output */
    c.w.data[2][0] += 1.0f;   /* query.weight */
    float *y2 = malloc(n * sizeof(float));
    assert_int_equal(aft_api_layer_forward(l, y2, c.x.data[0], c.B, c.T, &err), AFT_OK);
    assert_memory_not_equal(y, y2, n * sizeof(float));
    free(y2);
    free(want);
    free(y);
    aft_api_layer_free(l);
    aftrun_case_free(&c);
}

/* the arrays under a prefix, beside another layer's and tensors of no
 * layer: the same output */
static void test_prefix(void **state)
{
    (void)state;
    aftrun_case c;
    aftrun_case_read(&c, "rish_local");
    size_t n = c.w.n, m = 2 * n + 1;
    const char **names = calloc(m, sizeof *names);
    const float **data = calloc(m, sizeof *data);
    size_t *ndims = calloc(m, sizeof *ndims);
    const size_t **shapes = calloc(m, sizeof *shapes);
    char (*buf)[96] = calloc(m, sizeof *buf);
    for (size_t i = 0; i < m; i++) {
        size_t j = i % n;
        snprintf(buf[i], sizeof buf[i], i < n ? "blocks.0.attn.%s" : i < 2 * n ? "blocks.1.attn.%s" : "head.%s",
                 c.w.names[j]);
        names[i] = buf[i], data[i] = c.w.data[j], ndims[i] = c.w.ndims[j], shapes[i] = c.w.shapes[j];
    }
    aft_api_layer *l, *ref = case_layer(&c, c.options);
    aft_error err;
    char opts[600];
    snprintf(opts, sizeof opts, "%s prefix=blocks.1.attn.", c.options);
    assert_int_equal(aft_api_layer_new(&l, m, names, data, ndims, shapes, opts, &err), AFT_OK);
    float *y = case_forward(&c, l), *want = case_forward(&c, ref);
    assert_memory_equal(y, want, c.B * c.T * c.D * sizeof(float));
    aft_api_layer_free(l);
    /* no such prefix: the reader's message */
    assert_int_equal(aft_api_layer_new(&l, m, names, data, ndims, shapes, "variant=local window=3 prefix=blocks.2.",
                                       &err), AFT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "no query weight: expected a tensor named 'blocks.2.query.weight' or "
                                    "'blocks.2.to_q.weight'"));
    free(y), free(want), free(buf), free(names), free(data), free(ndims), free(shapes);
    aft_api_layer_free(ref);
    aftrun_case_free(&c);
}

/* the call refused with st and a line holding want */
static void refused(aft_status got, aft_status st, const aft_error *err, const char *want)
{
    assert_int_equal(got, st);
    if (!strstr(err->msg, want)) fail_msg("'%s' lacks '%s'", err->msg, want);
    assert_null(strchr(err->msg, '\n'));
}

static void test_refusals(void **state)
{
    (void)state;
    aftrun_case c;
    aftrun_case_read(&c, "labml_local");
    aft_api_layer *l = case_layer(&c, c.options);
    aft_error err;
    float *y = calloc(64 * 3 * 16, sizeof(float)), *x = calloc(64 * 3 * 16, sizeof(float));
    refused(aft_api_layer_forward(l, y, x, 3, 13, &err), AFT_ERR_ARG, &err,
            "sequence length T = 13 exceeds the position bias 'pos_bias' size Tmax = 12");
    refused(aft_api_layer_forward(l, y, x, SIZE_MAX / 4, 3, &err), AFT_ERR_ARG, &err, "overflows");
    refused(aft_api_layer_forward(NULL, y, x, 3, 10, &err), AFT_ERR_ARG, &err, "missing (NULL) layer");
    refused(aft_api_layer_forward(l, NULL, x, 3, 10, &err), AFT_ERR_ARG, &err, "missing (NULL) y");
    refused(aft_api_layer_forward(l, y, NULL, 3, 10, &err), AFT_ERR_ARG, &err, "missing (NULL) x");
    aft_api_layer_free(l);
    /* a grid whose H * W is not T */
    l = case_layer(&c, "variant=local window=2 grid=2,3");
    assert_int_not_equal(aft_api_layer_forward(l, y, x, 1, 5, &err), AFT_OK);
    assert_null(strchr(err.msg, '\n'));
    aft_api_layer_free(l);

    const char *const *names = (const char *const *)c.w.names;
    const float *const *data = (const float *const *)c.w.data;
    const size_t *const *shapes = (const size_t *const *)c.w.shapes;
    refused(aft_api_layer_new(NULL, c.w.n, names, data, c.w.ndims, shapes, c.options, &err), AFT_ERR_ARG, &err,
            "missing (NULL) out");
    refused(aft_api_layer_new(&l, c.w.n, NULL, data, c.w.ndims, shapes, c.options, &err), AFT_ERR_ARG, &err,
            "missing (NULL) names");
    assert_null(l);
    refused(aft_api_layer_new(&l, c.w.n, names, data, NULL, shapes, c.options, &err), AFT_ERR_ARG, &err,
            "missing (NULL) ndims");
    /* an array without its data, one named twice, one too few, one misshapen */
    const float *d2[16];
    const char *n2[16];
    size_t nd2[16];
    memcpy(d2, data, c.w.n * sizeof *d2);
    memcpy(n2, names, c.w.n * sizeof *n2);
    memcpy(nd2, c.w.ndims, c.w.n * sizeof *nd2);
    d2[3] = NULL;
    refused(aft_api_layer_new(&l, c.w.n, names, d2, c.w.ndims, shapes, c.options, &err), AFT_ERR_ARG, &err,
            "missing (NULL) data");
    n2[3] = n2[2];
    refused(aft_api_layer_new(&l, c.w.n, n2, data, c.w.ndims, shapes, c.options, &err), AFT_ERR_ARG, &err,
            "appears twice");
    refused(aft_api_layer_new(&l, c.w.n - 2, names, data, c.w.ndims, shapes, c.options, &err), AFT_ERR_FORMAT,
            &err, "no output weight");
    nd2[2] = 1;   /* query.weight as a vector */
    refused(aft_api_layer_new(&l, c.w.n, names, data, nd2, shapes, c.options, &err), AFT_ERR_FORMAT, &err,
            "'query.weight' must be a matrix (out, in); it has 1 dimension");
    nd2[2] = 0;
    refused(aft_api_layer_new(&l, c.w.n, names, data, nd2, shapes, c.options, &err), AFT_ERR_FORMAT, &err,
            "it has 0 dimensions");
    assert_int_equal(aft_api_layer_new(&l, c.w.n, names, data, nd2, shapes, c.options, NULL), AFT_ERR_FORMAT);
    free(x), free(y);
    aftrun_case_free(&c);
}

/* ---------------------------------------------------------------- threads */

struct job {
    aftrun_case *c;
    aft_api_layer *l;
    const float *want;
    int bad;
};

static void *run_job(void *arg)
{
    struct job *j = arg;
    size_t n = j->c->B * j->c->T * j->c->D;
    float *y = malloc(n * sizeof(float));
    for (int i = 0; i < 200 && y; i++) {
        aft_error err;
        if (aft_api_layer_forward(j->l, y, j->c->x.data[0], j->c->B, j->c->T, &err) != AFT_OK ||
            memcmp(y, j->want, n * sizeof(float)) != 0)
            j->bad++;
    }
    free(y);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    aftrun_case c[2];
    struct job jobs[2];
    pthread_t th[2];
    aftrun_case_read(&c[0], "rish_local");
    aftrun_case_read(&c[1], "labml_local");
    for (int i = 0; i < 2; i++) {
        char opts[600];
        snprintf(opts, sizeof opts, "%s threads=1", c[i].options);
        jobs[i] = (struct job){&c[i], case_layer(&c[i], opts), NULL, 0};
        jobs[i].want = case_forward(&c[i], jobs[i].l);
    }
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].bad, 0);
        free((float *)jobs[i].want);
        aft_api_layer_free(jobs[i].l);
        aftrun_case_free(&c[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),    cmocka_unit_test(test_as_library), cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, aftrun_cleanup);
}
