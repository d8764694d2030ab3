/*
 * test_layer_chunks.c - the layer a chunk of rows at a time
 * (lib/layer_chunks.c, through aft_layer_forward_chunked): the streamed
 * paths against the float64 layer reference (opcheck.h's run_layer_case),
 * the same bits whatever the thread count, and the fall back to the usual
 * path when a key is not finite.
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

#include "layer.h"    /* aft_layer_forward_chunked */
#include "opcheck.h"
#include "rng.h"

/* The streamed paths (layer.c): causal local, simple and conv with no mask
 * (the window's last rows kept as a halo, the left running sums carried
 * from chunk to chunk); the same without causality (K, V whole, the right
 * sums of the keys after each chunk added up from the end); and simple
 * without causality (softmax sums carried, folded into the output weights
 * at the end). Small chunks put many
 * boundaries in short sequences: T not a multiple of the chunk, a chunk as
 * wide as the window, B > 1, 1-3 threads, and key biases up to 200 (the
 * sums' maxima jump at boundaries). */
static void test_layer_streamed(void **state)
{
    (void)state;
    const layer_variant lvs[] = {
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 3, 0},   {AFT_LOCAL, AFT_BIAS_SEEDED, 0, 5, 0},
        {AFT_LOCAL, AFT_BIAS_FACTORED, 0, 2, 0}, {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, 0},
        {AFT_LOCAL, AFT_BIAS_DENSE, 0, 0, 0},   {AFT_CONV, AFT_BIAS_CONV, 1, 4, 0},
        {AFT_CONV, AFT_BIAS_CONV, 2, 3, 0},     {AFT_CONV, AFT_BIAS_CONV, 4, 2, 0},
    };
    const size_t chunks[] = {5, 8, 16};
    const size_t Ts[] = {37, 64, 17};
    const double kb[] = {0.5, 200.0};
    int fails = 0, cases = 0, reports = 0;
    for (size_t i = 0; i < N_OF(lvs); i++)
        for (size_t ci = 0; ci < N_OF(chunks); ci++)
            for (size_t ki = 0; ki < N_OF(kb); ki++) {
                if (chunks[ci] < lvs[i].window) continue;
                size_t B = (cases & 1) ? 2 : 1, T = Ts[cases % 3];
                g_chunk = chunks[ci];
                g_key_bias = kb[ki];
                fails += run_layer_case(&lvs[i], B, T, 12, 8, 1, 1, MASK_NONE, 3000 + (uint64_t)cases,
                                        1 + cases % 3, &reports);
                cases++;
                /* without causality: a global softmax where w = 0 everywhere,
                 * else K, V whole and the right sums carried in from the end */
                fails += run_layer_case(&lvs[i], B, T, 12, 8, 1, 0, MASK_NONE, 3000 + (uint64_t)cases,
                                        1 + cases % 3, &reports);
                cases++;
            }
    g_chunk = 0;
    g_key_bias = 0.5;
    op_finish(fails, cases);
}

/* The chunked paths (layer.c) run each chunk on one thread (the causal
 * pipeline: whichever thread is free next); chunk j's causal operator runs
 * on the carry and halo rows chunk j - 1 left, in another thread's buffer:
 * whatever the thread count, the output must be the same bits, at
 * the default chunk size and at a small one (many chunks per thread, the
 * buffers reused often), for local and for conv with two heads, B = 2, T
 * not a multiple of the chunk. A halo read from the wrong buffer, or a
 * carry taken before it was ready, would show as a difference; that each
 * result is right is test_layer_streamed's part. Simple, local and conv
 * without causality go through chunks the same way (each chunk's sums, or
 * the running sums of the keys before and after it, made first and added
 * up in order) and must give the same bits too; all with aft's projection
 * kernel and with OpenBLAS's. */
static void test_layer_pipeline_threads(void **state)
{
    (void)state;
    const size_t B = 2, T = 777, D = 24, C = 16;
    rng r = {91};
    float *x = randf(&r, B * T * D, 1.0), *wq = randf(&r, C * D, 0.4), *wk = randf(&r, C * D, 0.4),
          *wv = randf(&r, C * D, 0.4), *wo = randf(&r, D * C, 0.4), *dense = randf(&r, T * T, 1.0),
          *conv = randf(&r, 2 * (2 * 6 - 1), 1.0);
    aft_params p = layer_params(D, C, wq, wk, wv, wo);
    float *y1 = xmalloc(B * T * D * sizeof(float)), *yn = xmalloc(B * T * D * sizeof(float));
    /* local and conv with and without causality, simple without */
    const aft_variant vs[] = {AFT_LOCAL, AFT_CONV, AFT_SIMPLE, AFT_LOCAL, AFT_CONV};
    const int causal[] = {1, 1, 0, 0, 0};
    enum { NV = 5 };
    for (int pass = 0; pass < 2 * NV; pass++) {
        /* the second half with OpenBLAS for the projections (the default
         * with AVX-512 or without AVX), whose small products take other
         * paths */
        int vi = pass % NV;

        aft_config cfg = vs[vi] == AFT_SIMPLE ? make_cfg(AFT_SIMPLE, 0, 0, 0)
                         : vs[vi] == AFT_CONV ? make_cfg(AFT_CONV, 6, 2, causal[vi]) : make_cfg(AFT_LOCAL, 5, 0, causal[vi]);
        cfg.impl = AFT_IMPL_FAST;
        cfg.projections = pass >= NV ? AFT_KERNEL_BLAS : AFT_KERNEL_AUTO;
        p.bias = (aft_bias){0};
        p.bias.kind = vs[vi] == AFT_SIMPLE ? AFT_BIAS_NONE : vs[vi] == AFT_CONV ? AFT_BIAS_CONV : AFT_BIAS_DENSE;
        p.bias.dense = vs[vi] == AFT_LOCAL ? dense : NULL;
        p.bias.conv = vs[vi] == AFT_CONV ? conv : NULL;
        p.bias.tmax = T;
        const size_t chunks[] = {AFT_LAYER_CHUNK_AUTO, 7};
        for (size_t ci = 0; ci < N_OF(chunks); ci++)
            for (int th = 1; th <= 4; th++) {
                cfg.threads = th;
                float *y = th == 1 ? y1 : yn;
                for (size_t i = 0; i < B * T * D; i++) y[i] = NAN;
                aft_error err = {{0}};
                int streamed = -1;
                assert_int_equal(aft_layer_forward_chunked(y, x, &p, &cfg, B, T, chunks[ci], NULL, &streamed, &err),
                                 AFT_OK);
                assert_int_equal(streamed, 1);
                if (th == 1)
                    for (size_t i = 0; i < B * T * D; i++) assert_true(isfinite(y1[i]));
                else
                    assert_memory_equal(y1, yn, B * T * D * sizeof(float));
            }
    }
    free(x); free(wq); free(wk); free(wv); free(wo); free(dense); free(conv); free(y1); free(yn);
}

/* A key of +inf or NaN stops a streamed path; the layer then runs the
 * whole sequence the usual way and must give exactly what that gives. Too
 * small a chunk for the window, or the full variant, keep the usual path. */
static void test_layer_streamed_falls_back(void **state)
{
    (void)state;
    const size_t B = 2, T = 40, D = 6, C = 4;
    rng r = {77};
    float *x = randf(&r, B * T * D, 1.0), *wq = randf(&r, C * D, 0.4), *wk = randf(&r, C * D, 0.4),
          *wv = randf(&r, C * D, 0.4), *wo = randf(&r, D * C, 0.4), *dense = randf(&r, T * T, 1.0);
    aft_params p = layer_params(D, C, wq, wk, wv, wo);
    p.bias.kind = AFT_BIAS_DENSE;
    p.bias.dense = dense;
    p.bias.tmax = T;
    aft_config cfg = make_cfg(AFT_LOCAL, 3, 0, 1);
    cfg.impl = AFT_IMPL_FAST;
    float *y0 = xmalloc(B * T * D * sizeof(float)), *y1 = xmalloc(B * T * D * sizeof(float));
    aft_error err = {{0}};
    int streamed = -1;
    /* the usual path is taken, and streaming works, before the key goes bad */
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 1);
    /* batch 1: row 21 (the third chunk), then rows of the last chunk and
     * the sequence's last row */
    const size_t causal_bad[] = {39, 38, 36, 33, 32, 0, 1, 21};
    for (size_t i = 0; i < N_OF(causal_bad); i++) {
        x[(1 * T + causal_bad[i]) * D + 2] = INFINITY;
        assert_int_equal(aft_layer_forward_chunked(y0, x, &p, &cfg, B, T, 0, NULL, &streamed, &err), AFT_OK);
        assert_int_equal(streamed, 0);
        for (size_t j = 0; j < B * T * D; j++) y1[j] = 12345.0f;
        assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
        assert_int_equal(streamed, 0);
        assert_memory_equal(y0, y1, B * T * D * sizeof(float));
        if (i + 1 < N_OF(causal_bad)) x[(1 * T + causal_bad[i]) * D + 2] = 0.5f;
    }
    /* the same for simple without causality */
    aft_config sc = make_cfg(AFT_SIMPLE, 0, 0, 0);
    sc.impl = AFT_IMPL_FAST;
    assert_int_equal(aft_layer_forward_chunked(y0, x, &p, &sc, B, T, 0, NULL, &streamed, &err), AFT_OK);
    for (size_t i = 0; i < B * T * D; i++) y1[i] = 12345.0f;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &sc, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 0);
    assert_memory_equal(y0, y1, B * T * D * sizeof(float));
    x[(1 * T + 21) * D + 2] = 0.5f;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &sc, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 1);
    /* the same for local without causality: the bad key in the last chunk,
     * then in the first, the last row, the first row (found while the right
     * sums are made) */
    aft_config nc = make_cfg(AFT_LOCAL, 3, 0, 0);
    nc.impl = AFT_IMPL_FAST;
    const size_t bad_rows[] = {1 * T + 37, 0 * T + 2, 1 * T + 39, 0 * T + 0};
    for (size_t i = 0; i < N_OF(bad_rows); i++) {
        x[bad_rows[i] * D + 1] = INFINITY;
        assert_int_equal(aft_layer_forward_chunked(y0, x, &p, &nc, B, T, 0, NULL, &streamed, &err), AFT_OK);
        for (size_t j = 0; j < B * T * D; j++) y1[j] = 12345.0f;
        assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &nc, B, T, 8, NULL, &streamed, &err), AFT_OK);
        assert_int_equal(streamed, 0);
        assert_memory_equal(y0, y1, B * T * D * sizeof(float));
        x[bad_rows[i] * D + 1] = 0.25f;
    }
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &nc, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 1);
    /* chunk narrower than the window; the full variant */
    cfg.window = 9;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 0);
    cfg = make_cfg(AFT_FULL, 0, 0, 0);
    cfg.impl = AFT_IMPL_FAST;
    assert_int_equal(aft_layer_forward_chunked(y1, x, &p, &cfg, B, T, 8, NULL, &streamed, &err), AFT_OK);
    assert_int_equal(streamed, 0);
    free(x); free(wq); free(wk); free(wv); free(wo); free(dense); free(y0); free(y1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_streamed),
        cmocka_unit_test(test_layer_pipeline_threads),
        cmocka_unit_test(test_layer_streamed_falls_back),
    };
    /* TEST_OP_FILTER=pattern runs only the matching tests (while debugging) */
    const char *filter = getenv("TEST_OP_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
