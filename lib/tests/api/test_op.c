/* test_op.c - the binding interface's bare operator (lib/api/op.c):
 *  - forward and backward of local (causal), full with a mask of (T, T)
 *    and of (B, T, T), conv with a bias of a row per head (window and heads
 *    from it, one key channel per head), simple, and conv on a grid, byte
 *    for byte as aft run and aft grad compute them on the same q, k, v,
 *    bias (--weights' pos_bias), mask and dY: out, dq, dk, dv and the
 *    bias's gradient in the bias's shape;
 *  - each case's saved forward and backward (aft_api_op_forward_saved,
 *    _backward_saved): the backward's gradients byte for byte;
 *  - no bias (w = 0) as aft_op_forward with AFT_BIAS_NONE; backward's out;
 *  - the refusals: NULLs, a dbias without a bias, a bias for simple, keys
 *    of the wrong width, a bias that is not square, T past Tmax, a key the
 *    operator does not take. */
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
#include "aftrun.h"
#include "rng.h"

enum { B = 2, T = 9, C = 8 };

typedef struct {
    const char *options;       /* the interface's */
    const char *args[8];       /* aft run's and aft grad's, the same */
    size_t kc;
    size_t bias_rows, bias_cols, bias_ndim, bias_shape[3];   /* rows 0: no bias */
    int mask;                  /* 0 none, 2 (T, T), 3 (B, T, T) */
} op_case;

static const op_case cases[] = {
    {"variant=local window=3 causal=1", {"--variant", "local", "--window", "3", "--causal"}, C, 12, 12, 2, {12, 12}, 0},
    {"variant=full", {"--variant", "full"}, C, 12, 12, 2, {12, 12}, 2},
    {"variant=full causal=1", {"--variant", "full", "--causal"}, C, 10, 10, 2, {10, 10}, 3},
    {"variant=conv", {"--variant", "conv"}, 2, 2, 5, 2, {2, 5}, 0},
    {"variant=simple causal=1", {"--variant", "simple", "--causal"}, C, 0, 0, 0, {0}, 0},
    {"variant=conv grid=3,3", {"--variant", "conv", "--grid", "3,3"}, C, 1, 25, 3, {1, 5, 5}, 0},
};

static aft_tensor f32(const float *x, size_t ndim, const size_t *shape)
{
    aft_tensor t = {.dtype = AFT_F32, .ndim = ndim, .nelem = 1, .data = x};
    for (size_t d = 0; d < ndim; d++) t.nelem *= (t.shape[d] = shape[d]);
    t.nbytes = t.nelem * sizeof(float);
    return t;
}

/* the case's inputs, as arrays and as the files aft reads */
typedef struct {
    float *q, *k, *v, *bias, *dy;
    uint8_t *mask;
    size_t nbias, nmask;
} inputs;

static void make_inputs(const op_case *c, inputs *in)
{
    rng r = {42};
    aft_error err;
    in->q = randf(&r, B * T * C, 1.0), in->k = randf(&r, B * T * c->kc, 2.0), in->v = randf(&r, B * T * C, 1.0);
    in->dy = randf(&r, B * T * C, 1.0);
    aft_tensor qkv[3] = {f32(in->q, 3, (size_t[]){B, T, C}), f32(in->k, 3, (size_t[]){B, T, c->kc}),
                         f32(in->v, 3, (size_t[]){B, T, C})};
    assert_int_equal(aft_st_write(aftrun_tmp("qkv.safetensors"), (const char *[]){"q", "k", "v"}, qkv, 3, NULL, 0,
                                  &err), AFT_OK);
    aft_tensor dy = f32(in->dy, 3, (size_t[]){B, T, C});
    assert_int_equal(aft_npy_write(aftrun_tmp("dy.npy"), &dy, &err), AFT_OK);
    in->nbias = c->bias_rows * c->bias_cols;
    in->bias = in->nbias ? randf(&r, in->nbias, 0.5) : NULL;
    if (in->bias) {
        aft_tensor b = f32(in->bias, c->bias_ndim, c->bias_shape);
        assert_int_equal(aft_st_write(aftrun_tmp("bias.safetensors"), (const char *[]){"pos_bias"}, &b, 1, NULL, 0,
                                      &err), AFT_OK);
    }
    in->nmask = c->mask == 2 ? T * T : c->mask == 3 ? B * T * T : 0;
    in->mask = in->nmask ? malloc(in->nmask) : NULL;
    for (size_t i = 0; i < in->nmask; i++) in->mask[i] = rng_unif(&r) < 0.6 || i % (T + 1) == 0;
    if (in->mask) {
        aft_tensor m = {.dtype = AFT_U8, .ndim = (size_t)c->mask, .nelem = in->nmask, .nbytes = in->nmask,
                        .data = in->mask};
        memcpy(m.shape, c->mask == 2 ? (size_t[]){T, T, 0} : (size_t[]){B, T, T}, 3 * sizeof(size_t));
        assert_int_equal(aft_npy_write(aftrun_tmp("mask.npy"), &m, &err), AFT_OK);
    }
}

static void free_inputs(inputs *in)
{
    free(in->q), free(in->k), free(in->v), free(in->bias), free(in->dy), free(in->mask);
}

/* aft `cmd` (run or grad) on the case's files into out */
static void cli(const char *cmd, const op_case *c, const char *out)
{
    const char *args[24] = {cmd, "-o", out, aftrun_tmp("qkv.safetensors")};
    size_t k = 4;
    for (size_t i = 0; c->args[i]; i++) args[k++] = c->args[i];
    if (c->bias_rows) args[k++] = "--weights", args[k++] = aftrun_tmp("bias.safetensors");
    if (c->mask) args[k++] = "--mask", args[k++] = aftrun_tmp("mask.npy");
    if (strcmp(cmd, "grad") == 0) args[k++] = "--grad-output", args[k++] = aftrun_tmp("dy.npy");
    if (aftrun(NULL, NULL, args) != 0) fail_msg("aft %s (%s) failed", cmd, c->options);
}

static void same(const aft_st_file *f, const char *name, const float *x, size_t n)
{
    const aft_tensor *t = aft_st_find(f, name);
    if (!t || t->nelem != n || memcmp(t->data, x, n * sizeof(float)) != 0)
        fail_msg("'%s' is not aft grad's", name);
}

/* the saved forward and backward: the gradients of aft_api_op_backward (dq,
 * dk, dv, db) byte for byte, out as its out; a buffer no forward filled
 * refused */
static void saved_same(const op_case *c, const inputs *in, const float *dq, const float *dk, const float *dv,
                       const float *db)
{
    aft_error err;
    size_t n, nq = B * T * C, nk = B * T * c->kc;
    const int mb = c->mask == 3;
    assert_int_equal(aft_api_op_saved_size(B, T, C, c->kc, in->bias, c->bias_rows, c->bias_cols, in->mask, mb,
                                           c->options, &n, &err), AFT_OK);
    float *saved = malloc(n * sizeof(float)), *out = malloc(nq * sizeof(float)), *want = malloc(nq * sizeof(float));
    float *gq = malloc(nq * sizeof(float)), *gk = malloc(nk * sizeof(float)), *gv = malloc(nq * sizeof(float));
    float *gb = db ? malloc(in->nbias * sizeof(float)) : NULL;
    assert_int_equal(aft_api_op_forward_saved(out, saved, n, in->q, in->k, in->v, B, T, C, c->kc, in->bias,
                                              c->bias_rows, c->bias_cols, in->mask, mb, c->options, &err), AFT_OK);
    assert_int_equal(aft_api_op_backward(gq, gk, gv, NULL, want, in->dy, in->q, in->k, in->v, B, T, C, c->kc,
                                         in->bias, c->bias_rows, c->bias_cols, in->mask, mb, c->options, &err),
                     AFT_OK);
    for (size_t i = 0; i < nq; i++) assert_true(fabsf(out[i] - want[i]) <= 1e-5f * fmaxf(1.0f, fabsf(want[i])));
    assert_int_equal(aft_api_op_backward_saved(gq, gk, gv, gb, in->dy, in->q, in->k, in->v, saved, n, B, T, C,
                                               c->kc, in->bias, c->bias_rows, c->bias_cols, in->mask, mb, c->options,
                                               &err), AFT_OK);
    assert_memory_equal(gq, dq, nq * sizeof(float));
    assert_memory_equal(gk, dk, nk * sizeof(float));
    assert_memory_equal(gv, dv, nq * sizeof(float));
    if (db) assert_memory_equal(gb, db, in->nbias * sizeof(float));
    memset(saved, 0, n * sizeof(float));
    assert_int_equal(aft_api_op_backward_saved(gq, gk, gv, gb, in->dy, in->q, in->k, in->v, saved, n, B, T, C,
                                               c->kc, in->bias, c->bias_rows, c->bias_cols, in->mask, mb, c->options,
                                               &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_op_backward_saved(gq, gk, gv, gb, in->dy, in->q, in->k, in->v, saved, n + 1, B, T, C,
                                               c->kc, in->bias, c->bias_rows, c->bias_cols, in->mask, mb, c->options,
                                               &err), AFT_ERR_ARG);
    free(saved), free(out), free(want), free(gq), free(gk), free(gv), free(gb);
}

static void against_cli(const op_case *c)
{
    inputs in;
    make_inputs(c, &in);
    aft_error err;
    float *out = malloc(B * T * C * sizeof(float)), *dq = malloc(B * T * C * sizeof(float));
    float *dk = malloc(B * T * c->kc * sizeof(float)), *dv = malloc(B * T * C * sizeof(float));
    float *db = in.nbias ? malloc(in.nbias * sizeof(float)) : NULL;
    if (aft_api_op_forward(out, in.q, in.k, in.v, B, T, C, c->kc, in.bias, c->bias_rows, c->bias_cols, in.mask,
                           c->mask == 3, c->options, &err) != AFT_OK)
        fail_msg("%s: %s", c->options, err.msg);
    cli("run", c, aftrun_tmp("y.npy"));
    aftrun_same_npy(out, B * T * C, aftrun_tmp("y.npy"));

    if (aft_api_op_backward(dq, dk, dv, db, NULL, in.dy, in.q, in.k, in.v, B, T, C, c->kc, in.bias, c->bias_rows,
                            c->bias_cols, in.mask, c->mask == 3, c->options, &err) != AFT_OK)
        fail_msg("%s: %s", c->options, err.msg);
    cli("grad", c, aftrun_tmp("g.safetensors"));
    aft_st_file *f;
    assert_int_equal(aft_st_open(aftrun_tmp("g.safetensors"), &f, &err), AFT_OK);
    assert_int_equal(aft_st_count(f), in.nbias ? 4 : 3);
    same(f, "q", dq, B * T * C);
    same(f, "k", dk, B * T * c->kc);
    same(f, "v", dv, B * T * C);
    if (db) same(f, "pos_bias", db, in.nbias);
    aft_st_close(f);
    saved_same(c, &in, dq, dk, dv, db);
    free(out), free(dq), free(dk), free(dv), free(db);
    free_inputs(&in);
}

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) against_cli(&cases[i]);
}

/* no bias: w = 0, as the library's own call; backward's out is forward's
 * to rounding */
static void test_no_bias(void **state)
{
    (void)state;
    inputs in;
    make_inputs(&cases[4], &in);
    aft_error err;
    float out[B * T * C], want[B * T * C], out2[B * T * C], dq[B * T * C], dk[B * T * C], dv[B * T * C];
    assert_int_equal(aft_api_op_forward(out, in.q, in.k, in.v, B, T, C, C, NULL, 0, 0, NULL, 0,
                                        "variant=local window=2 threads=1", &err), AFT_OK);
    aft_bias none = {.kind = AFT_BIAS_NONE};
    aft_config cfg = {.variant = AFT_LOCAL, .window = 2, .threads = 1};
    assert_int_equal(aft_op_forward(want, in.q, in.k, in.v, &none, &cfg, B, T, C, C, &err), AFT_OK);
    assert_memory_equal(out, want, sizeof out);
    assert_int_equal(aft_api_op_backward(dq, dk, dv, NULL, out2, in.dy, in.q, in.k, in.v, B, T, C, C, NULL, 0, 0,
                                         NULL, 0, "variant=local window=2 threads=1", &err), AFT_OK);
    for (size_t i = 0; i < B * T * C; i++) assert_float_equal(out2[i], out[i], 1e-5);
    free_inputs(&in);
}

static void refused(aft_status got, const aft_error *err, const char *want)
{
    assert_int_equal(got, AFT_ERR_ARG);
    if (!strstr(err->msg, want)) fail_msg("'%s' lacks '%s'", err->msg, want);
    assert_null(strchr(err->msg, '\n'));
}

static void test_refusals(void **state)
{
    (void)state;
    inputs in;
    make_inputs(&cases[0], &in);
    aft_error err;
    float o[B * T * C], g1[B * T * C], g2[B * T * C], g3[B * T * C], gb[144];
    const float *q = in.q, *k = in.k, *v = in.v, *b = in.bias;
    const char *local = "variant=local window=3";
    refused(aft_api_op_forward(NULL, q, k, v, B, T, C, C, b, 12, 12, NULL, 0, local, &err), &err, "missing (NULL) out");
    refused(aft_api_op_forward(o, q, NULL, v, B, T, C, C, b, 12, 12, NULL, 0, local, &err), &err, "missing (NULL) k");
    refused(aft_api_op_backward(g1, g2, NULL, NULL, NULL, in.dy, q, k, v, B, T, C, C, b, 12, 12, NULL, 0, local, &err),
            &err, "missing (NULL) dv");
    refused(aft_api_op_backward(g1, g2, g3, gb, NULL, in.dy, q, k, v, B, T, C, C, NULL, 0, 0, NULL, 0, local, &err),
            &err, "dbias given without a bias");
    refused(aft_api_op_forward(o, q, k, v, B, T, C, C, b, 12, 12, NULL, 0, "variant=simple", &err), &err,
            "variant simple reads no position bias");
    refused(aft_api_op_forward(o, q, k, v, B, T, C, 3, b, 12, 12, NULL, 0, local, &err), &err,
            "k has 3 channels but q and v have 8");
    refused(aft_api_op_forward(o, q, k, v, B, T, C, 3, NULL, 0, 0, NULL, 0, "variant=conv window=2 heads=2", &err),
            &err, "k has 3 channels; conv needs 8 (one per value channel) or 2 (one per head)");
    refused(aft_api_op_forward(o, q, k, v, B, 13, C, C, b, 12, 12, NULL, 0, local, &err), &err,
            "sequence length T = 13 exceeds the position bias 'pos_bias' size Tmax = 12");
    refused(aft_api_op_forward(o, q, k, v, B, T, C, C, b, 12, 12, NULL, 0, "variant=local window=3 prefix=a.", &err),
            &err, "unknown option 'prefix' (the operator takes variant, window, heads, causal, threads, impl, grid, "
                  "precision)");
    refused(aft_api_op_forward(o, q, k, v, SIZE_MAX, T, C, C, b, 12, 12, NULL, 0, local, &err), &err, "overflows");
    assert_int_equal(aft_api_op_forward(o, q, k, v, B, T, C, C, b, 6, 24, NULL, 0, local, &err), AFT_ERR_FORMAT);
    assert_string_equal(err.msg, "'pos_bias' must be a square (Tmax, Tmax) matrix for the local variant");
    free_inputs(&in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_no_bias),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, aftrun_cleanup);
}
