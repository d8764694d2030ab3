/* test_stream.c - the binding interface's streaming state (lib/api/stream.c):
 *  - a causal layer's state stepped over a sequence in two chunks gives,
 *    byte for byte, the outputs aft run --state-out / --state-in writes
 *    for the same chunks, and saves the same state files; a state loaded
 *    from aft run's file carries on as aft run does; the position;
 *  - the chunks' outputs are the whole causal run's to rounding;
 *  - the refusals: a layer that is not causal, a state file of another
 *    layer (named), a file that is not there, NULLs. */
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

enum { B = 2, T = 10, D = 16, CUT = 4 };

static aft_api_layer *layer(const aftrun_case *c, const char *options)
{
    aft_api_layer *l = NULL;
    aft_error err;
    aft_status st = aft_api_layer_new(&l, c->w.n, (const char *const *)c->w.names, (const float *const *)c->w.data,
                                      c->w.ndims, (const size_t *const *)c->w.shapes, options, &err);
    if (st) fail_msg("%s", err.msg);
    return l;
}

/* rows [t0, t1) of x (B, T, D) into a new (B, t1 - t0, D) array, and as a .npy at path */
static float *rows(const float *x, size_t t0, size_t t1, const char *path)
{
    size_t n = t1 - t0;
    float *r = malloc(B * n * D * sizeof(float));
    for (size_t b = 0; b < B; b++) memcpy(r + b * n * D, x + (b * T + t0) * D, n * D * sizeof(float));
    aft_tensor t = {.dtype = AFT_F32, .ndim = 3, .shape = {B, n, D}, .nelem = B * n * D, .data = r};
    t.nbytes = t.nelem * sizeof(float);
    aft_error err;
    assert_int_equal(aft_npy_write(path, &t, &err), AFT_OK);
    return r;
}

/* aft run on a chunk: its y into path, states in and out (NULL: none) */
static void cli_chunk(const aftrun_case *c, const char *x, const char *y, const char *in, const char *out)
{
    const char *args[20] = {"run", "--weights", aftrun_case_file(c, "weights.safetensors"), "--variant", "local",
                            "--window", "3", "--causal", "-o", y, x};
    size_t k = 11;
    if (in) args[k++] = "--state-in", args[k++] = in;
    if (out) args[k++] = "--state-out", args[k++] = out;
    assert_int_equal(aftrun(NULL, NULL, args), 0);
}

static void test_against_cli(void **state)
{
    (void)state;
    aftrun_case c;
    aftrun_case_read(&c, "rish_local");   /* (B, T, D) = (2, 10, 16) */
    aft_api_layer *l = layer(&c, "variant=local window=3 causal=1");
    const float *x = c.x.data[0];
    float *x1 = rows(x, 0, CUT, aftrun_tmp("x1.npy")), *x2 = rows(x, CUT, T, aftrun_tmp("x2.npy"));
    cli_chunk(&c, aftrun_tmp("x1.npy"), aftrun_tmp("y1.npy"), NULL, aftrun_tmp("s1.safetensors"));
    cli_chunk(&c, aftrun_tmp("x2.npy"), aftrun_tmp("y2.npy"), aftrun_tmp("s1.safetensors"),
              aftrun_tmp("s2.safetensors"));

    aft_api_state *s;
    aft_error err;
    float y1[B * CUT * D], y2[B * (T - CUT) * D];
    assert_int_equal(aft_api_state_new(&s, l, B, &err), AFT_OK);
    assert_int_equal(aft_api_state_position(s), 0);
    assert_int_equal(aft_api_state_step(s, y1, x1, CUT, &err), AFT_OK);
    assert_int_equal(aft_api_state_position(s), CUT);
    aftrun_same_npy(y1, B * CUT * D, aftrun_tmp("y1.npy"));
    assert_int_equal(aft_api_state_save(s, aftrun_tmp("a1.safetensors"), &err), AFT_OK);
    aftrun_same_files(aftrun_tmp("a1.safetensors"), aftrun_tmp("s1.safetensors"));
    assert_int_equal(aft_api_state_step(s, y2, x2, T - CUT, &err), AFT_OK);
    aftrun_same_npy(y2, B * (T - CUT) * D, aftrun_tmp("y2.npy"));
    assert_int_equal(aft_api_state_save(s, aftrun_tmp("a2.safetensors"), &err), AFT_OK);
    aftrun_same_files(aftrun_tmp("a2.safetensors"), aftrun_tmp("s2.safetensors"));
    aft_api_state_free(s);

    /* from aft run's state: the second chunk as aft run gave it */
    assert_int_equal(aft_api_state_new(&s, l, B, &err), AFT_OK);
    assert_int_equal(aft_api_state_load(s, aftrun_tmp("s1.safetensors"), &err), AFT_OK);
    assert_int_equal(aft_api_state_position(s), CUT);
    memset(y2, 0, sizeof y2);
    assert_int_equal(aft_api_state_step(s, y2, x2, T - CUT, &err), AFT_OK);
    aftrun_same_npy(y2, B * (T - CUT) * D, aftrun_tmp("y2.npy"));
    aft_api_state_free(s);

    /* the whole causal run, to rounding */
    float whole[B * T * D];
    assert_int_equal(aft_api_layer_forward(l, whole, x, B, T, &err), AFT_OK);
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t d = 0; d < D; d++) {
                float got = t < CUT ? y1[(b * CUT + t) * D + d] : y2[(b * (T - CUT) + t - CUT) * D + d];
                float want = whole[(b * T + t) * D + d];
                assert_true(fabsf(got - want) <= 2e-5f * fmaxf(1.0f, fabsf(want)));
            }
    free(x1), free(x2);
    aft_api_layer_free(l);
    aftrun_case_free(&c);
}

static void test_refusals(void **state)
{
    (void)state;
    aftrun_case c;
    aftrun_case_read(&c, "rish_local");
    aft_api_layer *open = layer(&c, "variant=local window=3"), *l = layer(&c, "variant=local window=3 causal=1"),
                  *other = layer(&c, "variant=local window=2 causal=1");
    aft_api_state *s = (aft_api_state *)1;
    aft_error err;
    assert_int_equal(aft_api_state_new(&s, open, B, &err), AFT_ERR_ARG);
    assert_null(s);
    assert_non_null(strstr(err.msg, "a streaming state needs a causal run"));
    assert_int_equal(aft_api_state_new(&s, NULL, B, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) layer");
    assert_int_equal(aft_api_state_new(NULL, l, B, &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_state_new(&s, l, 0, &err), AFT_ERR_ARG);

    aft_api_state *s2;
    float y[B * D], x[B * D] = {0};
    assert_int_equal(aft_api_state_new(&s, l, B, &err), AFT_OK);
    assert_int_equal(aft_api_state_new(&s2, other, B, &err), AFT_OK);
    assert_int_equal(aft_api_state_step(s2, y, x, 1, &err), AFT_OK);
    assert_int_equal(aft_api_state_save(s2, aftrun_tmp("other.safetensors"), &err), AFT_OK);
    const char *path = aftrun_tmp("other.safetensors");
    assert_int_not_equal(aft_api_state_load(s, path, &err), AFT_OK);
    assert_true(strncmp(err.msg, path, strlen(path)) == 0);
    assert_non_null(strstr(err.msg, "window"));
    path = aftrun_tmp("none.safetensors");
    assert_int_equal(aft_api_state_load(s, path, &err), AFT_ERR_IO);
    assert_true(strncmp(err.msg, path, strlen(path)) == 0);
    assert_int_equal(aft_api_state_save(s, aftrun_tmp("no/such/dir.safetensors"), &err), AFT_ERR_IO);
    assert_null(strchr(err.msg, '\n'));
    assert_int_equal(aft_api_state_step(s, NULL, x, 1, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) y");
    assert_int_equal(aft_api_state_step(NULL, y, x, 1, &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_state_save(NULL, "x", &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_state_load(s, NULL, &err), AFT_ERR_ARG);
    assert_int_equal(aft_api_state_position(NULL), 0);
    /* past the position bias's Tmax (12): the library's words */
    float big[B * 13 * D];
    memset(big, 0, sizeof big);
    float ybig[B * 13 * D];
    assert_int_equal(aft_api_state_step(s, ybig, big, 13, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "Tmax = 12"));
    aft_api_state_free(s);
    aft_api_state_free(s2);
    aft_api_state_free(NULL);
    aft_api_layer_free(open), aft_api_layer_free(l), aft_api_layer_free(other);
    aftrun_case_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_cli),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, aftrun_cleanup);
}
