/* test_progress.c - the caller's progress counter (aft.h, aft_progress):
 * every entry point that advances it, on every path it can take (the
 * float64 reference, the full kernel, the band, simple and grid kernels,
 * groups of short sequences, masks, the layer's chunked paths and its
 * fallback after a key of +inf, the backward kernels, the model), takes
 * its rows on and counts exactly as many as done: a zeroed counter ends
 * with done == total == the documented units. The outputs are the same
 * with a counter as without. */
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
#include "files.h"
#include "layer.h"
#include "layers.h"
#include "rng.h"

enum { D = LAYER_D, C = LAYER_C, H = LAYER_H };

/* the counter after a call: done == total == want */
static void check_counted(const aft_progress *pg, size_t want, const char *what)
{
    if (pg->total != want || pg->done != want)
        fail_msg("%s: total %zu, done %zu, expected %zu", what, pg->total, pg->done, want);
}

/* a mask (T, T) with about one entry in four hidden, the diagonal visible */
static uint8_t *some_mask(rng *r, size_t nb, size_t T)
{
    uint8_t *m = xmalloc(nb * T * T);
    for (size_t b = 0; b < nb; b++)
        for (size_t i = 0; i < T; i++)
            for (size_t j = 0; j < T; j++) m[(b * T + i) * T + j] = i == j || rng_unif(r) > 0.25;
    return m;
}

/* what each case runs: sizes, threads, a mask, a grid */
typedef struct {
    size_t B, T;
    int threads;
    int mask;            /* 1: (T, T), 2: (B, T, T) */
    size_t gh, gw;       /* a grid (local only) */
} shape;

static const shape shapes[] = {
    {1, 150, 1, 0, 0, 0},
    {3, 200, 2, 0, 0, 0},    /* groups of short sequences, one a thread */
    {2, 40, 2, 0, 0, 0},
    {1, 257, 2, 0, 0, 0},    /* longer than a group's sequences */
    {2, 60, 2, 1, 0, 0},     /* a mask: the full kernel for every variant */
    {2, 50, 1, 2, 0, 0},
    {2, 120, 2, 0, 10, 12},  /* a grid */
};

static int applies(const lcase *lc, const shape *s)
{
    if (s->gh) return lc->variant == AFT_LOCAL;   /* conv's bias here is 1-D */
    return 1;
}

/* the layer and the bare operator, forward and backward, reference and
 * fast, on each shape: counted exactly */
static void test_every_path_counts_its_rows(void **state)
{
    (void)state;
    rng r = {42};
    for (size_t ci = 0; ci < layer_ncases; ci++)
        for (int causal = 0; causal < 2; causal++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const lcase *lc = &layer_cases[ci];
                const shape *s = &shapes[si];
                if (!applies(lc, s)) continue;
                layer L;
                make_layer(&L, lc, 0, causal, 7 + ci);
                const size_t B = s->B, T = s->T, N = B * T, KC = L.p.k_out;
                uint8_t *mask = s->mask ? some_mask(&r, s->mask == 2 ? B : 1, T) : NULL;
                L.p.bias.mask = mask;
                L.p.bias.mask_batched = s->mask == 2;
                float *x = randf(&r, N * D, 1.0), *dy = randf(&r, N * D, 1.0), *y = xmalloc(N * D * sizeof(float));
                float *q = randf(&r, N * C, 1.0), *k = randf(&r, N * KC, 1.0), *v = randf(&r, N * C, 1.0);
                float *o = xmalloc(N * C * sizeof(float)), *dout = randf(&r, N * C, 1.0);
                float *dq = xmalloc(N * C * sizeof(float)), *dk = xmalloc(N * KC * sizeof(float));
                float *dv = xmalloc(N * C * sizeof(float)), *dx = xmalloc(N * D * sizeof(float));
                for (int impl = 0; impl < 2; impl++) {
                    aft_config cfg = L.cfg;
                    cfg.threads = s->threads;
                    cfg.impl = impl ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
                    cfg.grid_h = s->gh;
                    cfg.grid_w = s->gw;
                    char what[160];
                    aft_error err;
                    aft_progress pg = {0, 0};
                    cfg.progress = &pg;
                    snprintf(what, sizeof what, "%s%s B=%zu T=%zu threads %d%s%s %s", lc->name,
                             causal ? " causal" : "", B, T, s->threads, s->mask ? " mask" : "", s->gh ? " grid" : "",
                             impl ? "reference" : "fast");

                    if (aft_layer_forward(y, x, &L.p, &cfg, B, T, &err) != AFT_OK) fail_msg("%s: %s", what, err.msg);
                    check_counted(&pg, N, what);
                    pg = (aft_progress){0, 0};
                    if (aft_op_forward(o, q, k, v, &L.p.bias, &cfg, B, T, C, KC, &err) != AFT_OK)
                        fail_msg("%s: operator: %s", what, err.msg);
                    check_counted(&pg, N, what);
                    pg = (aft_progress){0, 0};
                    if (aft_op_backward(dq, dk, dv, NULL, NULL, dout, q, k, v, &L.p.bias, &cfg, B, T, C, KC, &err) !=
                        AFT_OK)
                        fail_msg("%s: operator's backward: %s", what, err.msg);
                    check_counted(&pg, N, what);
                    pg = (aft_progress){0, 0};
                    aft_layer_grads g = {.dx = dx};
                    if (aft_layer_backward(&g, NULL, dy, x, &L.p, &cfg, B, T, &err) != AFT_OK)
                        fail_msg("%s: layer's backward: %s", what, err.msg);
                    check_counted(&pg, N, what);
                }
                free(x); free(dy); free(y); free(q); free(k); free(v); free(o); free(dout);
                free(dq); free(dk); free(dv); free(dx); free(mask);
                free_layer(&L);
            }
}

/* the layer's chunked paths (small chunks, so every CPU takes them), the
 * same output with a counter as without */
static void test_chunked_paths_count_chunks(void **state)
{
    (void)state;
    rng r = {5};
    const size_t B = 2, T = 200, N = B * T;
    float *x = randf(&r, N * D, 1.0), *y0 = xmalloc(N * D * sizeof(float)), *y1 = xmalloc(N * D * sizeof(float));
    for (size_t ci = 0; ci < layer_ncases; ci++)
        for (int causal = 0; causal < 2; causal++) {
            const lcase *lc = &layer_cases[ci];
            layer L;
            make_layer(&L, lc, 0, causal, 3 + ci);
            aft_config cfg = L.cfg;
            cfg.threads = 2;
            aft_error err;
            int streamed = 0;
            if (aft_layer_forward_chunked(y0, x, &L.p, &cfg, B, T, 16, NULL, NULL, &err) != AFT_OK)
                fail_msg("%s: %s", lc->name, err.msg);
            aft_progress pg = {0, 0};
            cfg.progress = &pg;
            if (aft_layer_forward_chunked(y1, x, &L.p, &cfg, B, T, 16, NULL, &streamed, &err) != AFT_OK)
                fail_msg("%s: %s", lc->name, err.msg);
            check_counted(&pg, N, lc->name);
            /* the band's variants without a key per head take the chunks */
            if (lc->variant != AFT_FULL && !lc->shared_keys && !streamed) fail_msg("%s: not chunked", lc->name);
            assert_memory_equal(y0, y1, N * D * sizeof(float));
            free_layer(&L);
        }
    free(x); free(y0); free(y1);
}

/* a key of +inf or NaN stops the chunks, and the layer runs the sequences
 * again whole: total grows by the rows redone, and done meets it */
static void test_fallback_counts_the_rows_redone(void **state)
{
    (void)state;
    rng r = {9};
    const size_t B = 2, T = 200, N = B * T;
    layer L;
    make_layer(&L, &layer_cases[1], 0, 1, 11);   /* local seeded, causal */
    float *x = randf(&r, N * D, 1.0), *y = xmalloc(N * D * sizeof(float));
    x[(T + 150) * D] = INFINITY;   /* a key of +inf or NaN late in the second sequence */
    aft_config cfg = L.cfg;
    cfg.threads = 2;
    aft_progress pg = {0, 0};
    cfg.progress = &pg;
    aft_error err;
    int streamed = 1;
    if (aft_layer_forward_chunked(y, x, &L.p, &cfg, B, T, 16, NULL, &streamed, &err) != AFT_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(streamed, 0);
    assert_true(pg.total > N);   /* the chunks before it had counted theirs */
    assert_int_equal(pg.done, pg.total);
    free(x); free(y);
    free_layer(&L);
}

/* one counter over several calls: each adds its own rows */
static void test_calls_add_up(void **state)
{
    (void)state;
    rng r = {1};
    const size_t B = 1, T = 64, N = B * T;
    layer L;
    make_layer(&L, &layer_cases[6], 0, 0, 2);   /* full dense */
    float *x = randf(&r, N * D, 1.0), *y = xmalloc(N * D * sizeof(float));
    aft_progress pg = {0, 0};
    aft_config cfg = L.cfg;
    cfg.progress = &pg;
    aft_error err;
    for (int i = 0; i < 3; i++) assert_int_equal(aft_layer_forward(y, x, &L.p, &cfg, B, T, &err), AFT_OK);
    check_counted(&pg, 3 * N, "three calls");
    /* an empty call takes nothing on */
    assert_int_equal(aft_layer_forward(y, x, &L.p, &cfg, 0, T, &err), AFT_OK);
    check_counted(&pg, 3 * N, "and an empty one");
    free(x); free(y);
    free_layer(&L);
}

/* the model: B * T rows a layer, in the fast and the reference impl */
static void test_model_counts_its_layers(void **state)
{
    (void)state;
    const char *path = files_fixture("model", "labml_aft_fortunes.safetensors");
    for (int impl = 0; impl < 2; impl++) {
        aft_model_options opt = {.impl = impl ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST, .threads = 2};
        aft_model *m;
        aft_error err;
        if (aft_model_open(&m, path, &opt, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
        const aft_model_info *in = aft_model_get_info(m);
        const size_t B = 2, T = 20;
        int32_t tok[2 * 20];
        for (size_t i = 0; i < B * T; i++) tok[i] = (int32_t)(i * 7 % in->n_vocab);
        float *a = xmalloc(B * T * in->n_vocab * sizeof(float)), *b = xmalloc(B * T * in->n_vocab * sizeof(float));
        aft_progress pg = {0, 0};
        assert_int_equal(aft_model_forward(m, a, tok, B, T, &err), AFT_OK);
        assert_int_equal(aft_model_forward_progress(m, b, tok, B, T, &pg, &err), AFT_OK);
        check_counted(&pg, B * T * in->n_layers, impl ? "model, reference" : "model");
        assert_memory_equal(a, b, B * T * in->n_vocab * sizeof(float));
        free(a); free(b);
        aft_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_path_counts_its_rows),
        cmocka_unit_test(test_chunked_paths_count_chunks),
        cmocka_unit_test(test_fallback_counts_the_rows_redone),
        cmocka_unit_test(test_calls_add_up),
        cmocka_unit_test(test_model_counts_its_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
