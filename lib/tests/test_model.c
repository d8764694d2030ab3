/* test_model.c - labml's autoregressive AFT model (lib/model.c) and its
 * pieces:
 *  - LayerNorm, the FFN and the embedding: fast kernels against their
 *    float64 references;
 *  - the trained checkpoint in testdata/model (made by
 *    testdata/model/train_labml_aft.py): logits against PyTorch's for a
 *    sequence [T], a batch [B, T] and labml's own seq-first [T, B], within
 *    1e-4 x max(1, |logit|), by the fast kernels and by the float64 path;
 *    greedy generation character for character against PyTorch's (one run
 *    long enough to stream past the 256 positions of pos_bias); stepping
 *    the model a few tokens at a time against the one-pass forward, and
 *    past the context against the forward over the context it holds;
 *  - small random models of every variant (local, full, full factored,
 *    conv, simple) in labml's block structure: the variant found from the
 *    tensors, fast against float64, steps against the forward;
 *  - checkpoints missing a tensor, with a wrong shape, dtype or metadata:
 *    refused, naming the tensor or entry; tokens and characters outside the
 *    vocabulary: refused, naming them;
 *  - layers that do not all have the same tensors (an optional bias one
 *    layer lacks, a bias only some projections have, a shape unlike layer
 *    0's): refused, naming the tensor; optional tensors absent from every
 *    layer: loaded; tensors the model does not read: counted and named;
 *  - sampling: reproducible from a seed, top-k, temperature.
 * No Python at test time: the fixtures are committed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "aft.h"
#include "files.h"
#include "nn/nn.h"
#include "rng.h"

#define TOL_LOGIT 1e-4

/* ---------------------------------------------------------------- helpers */

static const char *model_file(const char *name)
{
    return files_fixture("model", name);
}

#define CKPT "labml_aft_fortunes.safetensors"

static aft_model *open_trained(void)
{
    aft_error err = {{0}};
    aft_model *m;
    if (aft_model_open(&m, model_file(CKPT), NULL, &err) != AFT_OK) fail_msg("%s: %s", CKPT, err.msg);
    return m;
}

/* worst |a - ref| / max(1, |ref|) over n; non-finite a where ref is finite fails */
static double worst_rel(const char *what, const float *a, const float *ref, size_t n)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) fail_msg("%s: entry %zu is %g, the reference %g", what, i, a[i], ref[i]);
        double d = fabs((double)a[i] - ref[i]) / fmax(1.0, fabs((double)ref[i]));
        e = d > e ? d : e;
    }
    return e;
}

static void check_rel(const char *what, const float *a, const float *ref, size_t n, double tol)
{
    double e = worst_rel(what, a, ref, n);
    if (!(e <= tol)) fail_msg("%s: worst |diff| / max(1, |ref|) = %.3g > %.3g", what, e, tol);
}

static aft_tensor read_npy(const char *name)
{
    aft_tensor t;
    aft_error err = {{0}};
    if (aft_npy_read(model_file(name), &t, NULL, &err) != AFT_OK) fail_msg("%s: %s", name, err.msg);
    return t;
}

/* int32 tokens of a .npy, as int32_t */
static int32_t *npy_tokens(const aft_tensor *t)
{
    assert_int_equal(t->dtype, AFT_I32);
    int32_t *ids = xmalloc(t->nbytes);
    memcpy(ids, t->data, t->nbytes);
    return ids;
}

/* ---------------------------------------------------------------- the pieces */

static void test_layernorm(void **state)
{
    (void)state;
    rng r = {11};
    const size_t Ds[] = {1, 7, 37, 128, 300};
    const double offsets[] = {0.0, 20.0};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (size_t oi = 0; oi < 2; oi++) {
            size_t D = Ds[di], N = 9;
            float *x = randf(&r, N * D, 3.0), *w = randf(&r, D, 1.5), *b = randf(&r, D, 0.5);
            for (size_t i = 0; i < N * D; i++) x[i] += (float)offsets[oi];
            float *y = xmalloc(N * D * sizeof *y), *yr = xmalloc(N * D * sizeof *yr);
            for (int withb = 0; withb < 2; withb++) {
                aft_layernorm(y, x, w, withb ? b : NULL, N, D, AFT_LAYERNORM_EPS);
                aft_layernorm_ref(yr, x, w, withb ? b : NULL, N, D, AFT_LAYERNORM_EPS);
                char what[64];
                snprintf(what, sizeof what, "layernorm D=%zu offset %g", D, offsets[oi]);
                check_rel(what, y, yr, N * D, 2e-5);
            }
            /* in place */
            memcpy(y, x, N * D * sizeof *y);
            aft_layernorm(y, y, w, b, N, D, AFT_LAYERNORM_EPS);
            check_rel("layernorm in place", y, yr, N * D, 2e-5);
            free(x); free(w); free(b); free(y); free(yr);
        }
}

/* LayerNorm's backward kernel against its double reference: dx (written and
 * added), the weight's and the bias's sums, rows with a large mean */
static void test_layernorm_back(void **state)
{
    (void)state;
    rng r = {13};
    const size_t Ds[] = {1, 7, 37, 128, 300};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (int offset = 0; offset <= 20; offset += 20) {
            size_t D = Ds[di], N = 9;
            float *x = randf(&r, N * D, 3.0), *w = randf(&r, D, 1.5), *dz = randf(&r, N * D, 1.0);
            for (size_t i = 0; i < N * D; i++) x[i] += (float)offset;
            float *dx = randf(&r, N * D, 1.0), *dxr = xmalloc(N * D * sizeof *dxr);
            float *s = calloc(4 * D, sizeof *s);
            memcpy(dxr, dx, N * D * sizeof *dx);
            for (int add = 1; add >= 0; add--) {
                memset(s, 0, 4 * D * sizeof *s);
                aft_layernorm_back(dx, add, s, s + D, dz, x, w, N, D, AFT_LAYERNORM_EPS);
                aft_layernorm_back_ref(dxr, add, s + 2 * D, s + 3 * D, dz, x, w, N, D, AFT_LAYERNORM_EPS);
                char what[64];
                snprintf(what, sizeof what, "layernorm back D=%zu offset %d add %d", D, offset, add);
                check_rel(what, dx, dxr, N * D, 2e-5);
                check_rel(what, s, s + 2 * D, 2 * D, 2e-5);
            }
            free(x); free(w); free(dz); free(dx); free(dxr); free(s);
        }
}

/* the cross-entropy kernel against its double reference: the summed loss
 * and the logits' gradient, logits far from 0, an ignored row, sizes
 * around the vector width */
static void test_xent(void **state)
{
    (void)state;
    rng r = {14};
    const size_t Vs[] = {1, 5, 16, 113, 300};
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++)
        for (int offset = 0; offset <= 300; offset += 300) {
            size_t V = Vs[vi], N = 7;
            float *lg = randf(&r, N * V, 8.0), *lr = xmalloc(N * V * sizeof *lr);
            for (size_t i = 0; i < N * V; i++) lg[i] += (float)offset;
            int32_t t[7];
            for (size_t i = 0; i < N; i++) t[i] = (int32_t)((i * 37 + 3) % V);
            t[2] = -100;
            memcpy(lr, lg, N * V * sizeof *lg);
            double a = aft_xent_rows(lg, t, N, V, 0, 0.5f), b = aft_xent_rows_ref(lr, t, N, V, 0, 0.5f);
            if (!(fabs(a - b) <= 1e-5 * fmax(1.0, fabs(b)))) fail_msg("xent V=%zu: %.9g vs %.9g", V, a, b);
            a = aft_xent_rows(lg, t, N, V, 1, 0.5f);
            b = aft_xent_rows_ref(lr, t, N, V, 1, 0.5f);
            if (!(fabs(a - b) <= 1e-5 * fmax(1.0, fabs(b)))) fail_msg("xent grad V=%zu: %.9g vs %.9g", V, a, b);
            char what[64];
            snprintf(what, sizeof what, "xent grad V=%zu offset %d", V, offset);
            check_rel(what, lg, lr, N * V, 1e-6);
            for (size_t j = 0; j < V; j++)
                if (lg[2 * V + j] != 0.0f) fail_msg("xent V=%zu: the ignored row's gradient is %g", V, lg[2 * V + j]);
            free(lg); free(lr);
        }
}

/* the training step's passes over rows, against plain loops: ReLU keeps a
 * NaN and zeroes -0 and negatives, its mask, the sum, the column sums */
static void test_elem(void **state)
{
    (void)state;
    rng r = {15};
    const size_t n = 77, rows = 5, cols = n / rows;
    float *h = randf(&r, n, 2.0), *d = randf(&r, n, 1.0), *y = randf(&r, n, 1.0), *o = xmalloc(n * sizeof *o);
    h[3] = NAN;
    h[4] = -0.0f;
    h[5] = 0.0f;
    float *h0 = xmalloc(n * sizeof *h0), *d0 = xmalloc(n * sizeof *d0);
    memcpy(h0, h, n * sizeof *h);
    memcpy(d0, d, n * sizeof *d);
    aft_relu(h, n);
    aft_relu_back(d, h, n);
    aft_vadd(o, h, y, n);
    for (size_t i = 0; i < n; i++) {
        float want = isnan(h0[i]) ? h0[i] : h0[i] > 0.0f ? h0[i] : 0.0f;
        if (isnan(want) ? !isnan(h[i]) : (h[i] != want || signbit(h[i])))
            fail_msg("relu(%g) = %g, not %g", h0[i], h[i], want);
        if (d[i] != (h[i] > 0.0f ? d0[i] : 0.0f)) fail_msg("relu_back at %zu: %g", i, d[i]);
        if (!isnan(h[i]) && o[i] != h[i] + y[i]) fail_msg("vadd at %zu: %g", i, o[i]);
    }
    float s[16] = {0};
    double ref[16] = {0};
    aft_col_sums(s, y, rows, cols);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) ref[j] += y[i * cols + j];
    for (size_t j = 0; j < cols; j++)
        if (!(fabs(s[j] - ref[j]) <= 1e-6 * fmax(1.0, fabs(ref[j])))) fail_msg("col_sums %zu: %g vs %g", j, s[j], ref[j]);
    free(h); free(d); free(y); free(o); free(h0); free(d0);
}

static void test_ffn(void **state)
{
    (void)state;
    rng r = {12};
    const size_t sizes[][3] = {{128, 256, 1}, {128, 256, 37}, {19, 45, 5}, {16, 32, 100}, {3, 1, 2}};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int bias = 0; bias < 2; bias++)
            for (int k = 0; k < 2; k++) {
                size_t D = sizes[si][0], F = sizes[si][1], N = sizes[si][2];
                float *w1 = randf(&r, F * D, 1.0 / sqrt((double)D)), *b1 = randf(&r, F, 0.3);
                float *w2 = randf(&r, D * F, 1.0 / sqrt((double)F)), *b2 = randf(&r, D, 0.3);
                float *x = randf(&r, N * D, 2.0), *y = xmalloc(N * D * sizeof *y), *yr = xmalloc(N * D * sizeof *yr);
                float *h = xmalloc(N * F * sizeof *h);
                aft_ffn_params p = {D, F, w1, bias ? b1 : NULL, w2, bias ? b2 : NULL, AFT_F32};
                aft_ffn f;
                aft_error err = {{0}};
                assert_int_equal(aft_ffn_init(&f, &p, k ? AFT_KERNEL_BLAS : AFT_KERNEL_AUTO, AFT_PRECISION_F32, 1, &err), AFT_OK);
                aft_ffn_apply(&f, y, x, N, h);
                aft_ffn_ref(yr, x, &p, N);
                char what[80];
                snprintf(what, sizeof what, "ffn D=%zu F=%zu N=%zu bias %d kernel %d", D, F, N, bias, k);
                check_rel(what, y, yr, N * D, 2e-5);
                aft_ffn_free(&f);
                free(w1); free(b1); free(w2); free(b2); free(x); free(y); free(yr); free(h);
            }
    /* relu keeps NaN, as torch.relu */
    float w1[1] = {1.0f}, w2[1] = {1.0f}, x[1] = {NAN}, y[1], h[1];
    aft_ffn_params p = {1, 1, w1, NULL, w2, NULL, AFT_F32};
    aft_ffn_ref(y, x, &p, 1);
    assert_true(isnan(y[0]));
    aft_ffn f;
    aft_error err = {{0}};
    assert_int_equal(aft_ffn_init(&f, &p, AFT_KERNEL_AUTO, AFT_PRECISION_F32, 1, &err), AFT_OK);
    aft_ffn_apply(&f, y, x, 1, h);
    assert_true(isnan(y[0]));
    aft_ffn_free(&f);
}

static void test_embed(void **state)
{
    (void)state;
    rng r = {13};
    size_t V = 11, D = 24, P = 40, B = 3, n = 9;
    float *table = randf(&r, V * D, 1.0), *pe = randf(&r, P * D, 1.0);
    int32_t tok[3 * 12];
    for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++) tok[i] = (int32_t)(rng_next(&r) % V);
    float *x = xmalloc(B * n * D * sizeof *x), *xr = xmalloc(B * n * D * sizeof *xr);
    for (int withpe = 0; withpe < 2; withpe++) {
        aft_embed_params e = {table, V, D, 4.8989795f, withpe ? pe : NULL, withpe ? P : 0, AFT_F32};
        size_t b, t;
        assert_int_equal(aft_embed_bad_token(&e, tok, 12, B, n, &b, &t), 0);
        aft_embed(x, &e, tok, 12, B, n, 31);
        aft_embed_ref(xr, &e, tok, 12, B, n, 31);
        check_rel("embedding", x, xr, B * n * D, 1e-6);
        /* row (1, 4) by hand */
        const float *row = table + (size_t)tok[12 + 4] * D;
        for (size_t i = 0; i < D; i++)
            assert_float_equal(xr[(n + 4) * D + i], row[i] * 4.8989795 + (withpe ? pe[(31 + 4) * D + i] : 0.0), 1e-5);
        tok[2 * 12 + 7] = (int32_t)V;
        assert_int_equal(aft_embed_bad_token(&e, tok, 12, B, n, &b, &t), 1);
        assert_int_equal(b, 2);
        assert_int_equal(t, 7);
        tok[2 * 12 + 7] = -1;
        assert_int_equal(aft_embed_bad_token(&e, tok, 12, B, n, &b, &t), 1);
        tok[2 * 12 + 7] = 0;
    }
    free(table); free(pe); free(x); free(xr);
}

/* 16-bit weights: the FFN with f16 or bf16 W1, W2 and the embedding with a
 * 16-bit table give the bits of the same values widened to float32, with
 * aft's kernel and OpenBLAS, many rows and one; the references agree too */
static void test_16bit(void **state)
{
    (void)state;
    rng r = {1616};
    const aft_dtype dts[] = {AFT_F16, AFT_BF16};
    for (size_t di = 0; di < 2; di++)
        for (int k = 0; k < 2; k++)
            for (size_t N = 1; N <= 40; N += 39) {
                aft_dtype dt = dts[di];
                size_t D = 128, F = 96;
                float *w[2] = {randf(&r, F * D, 0.1), randf(&r, D * F, 0.1)}, *b1 = randf(&r, F, 0.3);
                uint16_t *h[2] = {xmalloc(F * D * 2), xmalloc(D * F * 2)};
                for (int m = 0; m < 2; m++)
                    for (size_t i = 0; i < F * D; i++) {
                        h[m][i] = dt == AFT_F16 ? aft_f32_to_f16(w[m][i]) : aft_f32_to_bf16(w[m][i]);
                        w[m][i] = dt == AFT_F16 ? aft_f16_to_f32(h[m][i]) : aft_bf16_to_f32(h[m][i]);
                    }
                float *x = randf(&r, N * D, 2.0), *y = xmalloc(N * D * 4), *y2 = xmalloc(N * D * 4);
                float *h1 = xmalloc(N * F * 4), *yr = xmalloc(N * D * 4), *yr2 = xmalloc(N * D * 4);
                aft_ffn_params p16 = {D, F, h[0], b1, h[1], NULL, dt}, p32 = {D, F, w[0], b1, w[1], NULL, AFT_F32};
                aft_ffn f16, f32;
                aft_error err = {{0}};
                aft_kernel kern = k ? AFT_KERNEL_BLAS : AFT_KERNEL_AUTO;
                assert_int_equal(aft_ffn_init(&f16, &p16, kern, AFT_PRECISION_F32, 2, &err), AFT_OK);
                assert_int_equal(aft_ffn_init(&f32, &p32, kern, AFT_PRECISION_F32, 2, &err), AFT_OK);
                aft_ffn_apply(&f16, y, x, N, h1);
                aft_ffn_apply(&f32, y2, x, N, h1);
                if (memcmp(y, y2, N * D * 4) != 0) fail_msg("ffn %s N=%zu kernel %d: not the float32 bits",
                                                            aft_dtype_name(dt), N, k);
                aft_ffn_ref(yr, x, &p16, N);
                aft_ffn_ref(yr2, x, &p32, N);
                assert_memory_equal(yr, yr2, N * D * 4);
                aft_ffn_free(&f16);
                aft_ffn_free(&f32);
                /* the embedding: a 16-bit table of the same values */
                size_t V = 9;
                int32_t tok[5] = {0, 3, 8, 3, 1};
                aft_embed_params e16 = {h[0], V, D, 3.0f, x, N, dt}, e32 = {w[0], V, D, 3.0f, x, N, AFT_F32};
                float *xa = xmalloc(5 * D * 4), *xb = xmalloc(5 * D * 4);
                for (int ref = 0; ref < 2; ref++) {
                    (ref ? aft_embed_ref : aft_embed)(xa, &e16, tok, 5, 1, N < 5 ? N : 5, 0);
                    (ref ? aft_embed_ref : aft_embed)(xb, &e32, tok, 5, 1, N < 5 ? N : 5, 0);
                    assert_memory_equal(xa, xb, (N < 5 ? N : 5) * D * 4);
                }
                free(xa); free(xb);
                free(w[0]); free(w[1]); free(b1); free(h[0]); free(h[1]);
                free(x); free(y); free(y2); free(h1); free(yr); free(yr2);
            }
}

/* ---------------------------------------------------------------- the trained model */

static void test_info(void **state)
{
    (void)state;
    aft_model *m = open_trained();
    const aft_model_info *in = aft_model_get_info(m);
    assert_int_equal(in->variant, AFT_LOCAL);
    assert_int_equal(in->window, 32);
    assert_int_equal(in->d_model, 128);
    assert_int_equal(in->d_hidden, 128);
    assert_int_equal(in->d_ff, 256);
    assert_int_equal(in->n_layers, 6);
    assert_int_equal(in->bias_rows, 256);
    assert_int_equal(in->positions, 5000);
    assert_int_equal(in->context, 256);
    assert_int_equal(in->keep, 128);
    /* the shipped checkpoint is stored in f16: kept so where the level's
     * kernels widen it (avx2, avx512), widened at base */
    assert_int_equal(in->weights_dtype, aft_weights_held(AFT_F16, AFT_KERNEL_AUTO));
    assert_int_equal(in->weights_dtype, strcmp(aft_levels(&(size_t){0})[aft_level_in_use()].name, "base") == 0
                                            ? AFT_F32 : AFT_F16);
    assert_true(in->has_vocab);
    assert_string_equal(in->context_from, "encoder.layers.0.self_attn.pos_bias");
    assert_string_equal(aft_model_token(m, 3), "\n");
    assert_null(aft_model_token(m, in->n_vocab));
    aft_model_free(m);
}

/* logits of tokens (B, T) against PyTorch's (B, T, V), fast and float64 */
static void check_forward(aft_model *m, aft_model *mref, const int32_t *tok, const float *want, size_t B, size_t T,
                          const char *what)
{
    size_t V = aft_model_get_info(m)->n_vocab;
    float *lg = xmalloc(B * T * V * sizeof *lg);
    aft_error err = {{0}};
    for (int ref = 0; ref < 2; ref++) {
        if (aft_model_forward(ref ? mref : m, lg, tok, B, T, &err) != AFT_OK) fail_msg("%s: %s", what, err.msg);
        char w[96];
        snprintf(w, sizeof w, "%s (%s)", what, ref ? "float64" : "fast");
        double e = worst_rel(w, lg, want, B * T * V);
        printf("  %s: worst %.2e x max(1, |logit|)\n", w, e);
        if (!(e <= TOL_LOGIT)) fail_msg("%s: worst |diff| / max(1, |logit|) = %.3g > %g", w, e, TOL_LOGIT);
    }
    free(lg);
}

static aft_model *open_trained_ref(void)
{
    aft_error err = {{0}};
    aft_model *m;
    aft_model_options o = {.impl = AFT_IMPL_REFERENCE};
    if (aft_model_open(&m, model_file(CKPT), &o, &err) != AFT_OK) fail_msg("%s: %s", CKPT, err.msg);
    return m;
}

static void test_logits_vs_torch(void **state)
{
    (void)state;
    aft_model *m = open_trained(), *mref = open_trained_ref();
    size_t V = aft_model_get_info(m)->n_vocab;
    /* [T] */
    aft_tensor st = read_npy("seq_tokens.npy"), sl = read_npy("seq_logits.npy");
    assert_int_equal(st.ndim, 1);
    assert_int_equal(sl.shape[1], V);
    int32_t *tok = npy_tokens(&st);
    check_forward(m, mref, tok, sl.data, 1, st.shape[0], "[T] sequence");
    free(tok);
    /* [B, T] */
    aft_tensor bt = read_npy("bt_tokens.npy"), bl = read_npy("bt_logits.npy");
    tok = npy_tokens(&bt);
    check_forward(m, mref, tok, bl.data, bt.shape[0], bt.shape[1], "[B, T] batch");
    free(tok);
    /* labml's seq-first [T, B]: the caller transposes tokens and logits */
    aft_tensor tb = read_npy("tb_tokens.npy"), tl = read_npy("tb_logits.npy");
    size_t T = tb.shape[0], B = tb.shape[1];
    const int32_t *tbd = tb.data;
    tok = xmalloc(B * T * sizeof *tok);
    float *want = xmalloc(B * T * V * sizeof *want);
    for (size_t t = 0; t < T; t++)
        for (size_t b = 0; b < B; b++) {
            tok[b * T + t] = tbd[t * B + b];
            memcpy(want + (b * T + t) * V, (const float *)tl.data + (t * B + b) * V, V * sizeof(float));
        }
    check_forward(m, mref, tok, want, B, T, "[T, B] seq-first");
    free(tok);
    free(want);
    aft_tensor *ts[] = {&st, &sl, &bt, &bl, &tb, &tl};
    for (size_t i = 0; i < 6; i++) aft_tensor_free(ts[i]);
    aft_model_free(m);
    aft_model_free(mref);
}

typedef struct {
    const aft_model *m;
    char *text;
    size_t len, cap;
} collect;

static int collect_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    collect *c = ctx;
    const char *s = aft_model_token(c->m, (size_t)token);
    assert_non_null(s);
    size_t n = strlen(s);
    if (c->len + n + 1 > c->cap) {
        c->cap = 2 * (c->len + n + 1);
        c->text = realloc(c->text, c->cap);
        assert_non_null(c->text);
    }
    memcpy(c->text + c->len, s, n + 1);
    c->len += n;
    return 0;
}

static char *read_text(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("%s: cannot open", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = xmalloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, fp), (size_t)n);
    s[n] = 0;
    fclose(fp);
    return s;
}

static void test_greedy_vs_torch(void **state)
{
    (void)state;
    aft_model *m = open_trained();
    char *json = read_text(model_file("greedy.json"));
    cJSON *doc = cJSON_Parse(json);
    assert_non_null(doc);
    assert_int_equal(cJSON_GetObjectItem(doc, "context")->valueint, 256);
    assert_int_equal(cJSON_GetObjectItem(doc, "keep")->valueint, 128);
    const cJSON *runs = cJSON_GetObjectItem(doc, "runs");
    assert_true(cJSON_GetArraySize(runs) >= 2);
    int long_run = 0;
    for (const cJSON *r = runs->child; r; r = r->next) {
        const char *prompt = cJSON_GetObjectItem(r, "prompt")->valuestring, *want = cJSON_GetObjectItem(r, "text")->valuestring;
        size_t n_new = (size_t)cJSON_GetObjectItem(r, "n_new")->valueint, np, made;
        int32_t *ids;
        aft_error err = {{0}};
        assert_int_equal(aft_model_tokenize(m, &ids, &np, prompt, strlen(prompt), &err), AFT_OK);
        collect c = {m, NULL, 0, 0};
        int32_t *out = xmalloc(n_new * sizeof *out);
        if (aft_model_generate(m, out, &made, ids, np, n_new, NULL, collect_token, &c, &err) != AFT_OK)
            fail_msg("generate from '%s': %s", prompt, err.msg);
        assert_int_equal(made, n_new);
        if (strcmp(c.text, want) != 0) {
            size_t i = 0;
            while (c.text[i] && c.text[i] == want[i]) i++;
            fail_msg("greedy from '%s' differs from PyTorch's at byte %zu:\n aft:   '%.60s'\n torch: '%.60s'", prompt, i,
                     c.text + i, want + i);
        }
        printf("  greedy from '%s': %zu characters as PyTorch's\n", prompt, n_new);
        long_run |= np + n_new > 256;
        free(c.text);
        free(out);
        free(ids);
    }
    assert_true(long_run);   /* one run streams past pos_bias's 256 positions */
    cJSON_Delete(doc);
    free(json);
    aft_model_free(m);
}

/* the tokens of a validation text the model has never seen, as (B, T) */
static int32_t *some_tokens(size_t B, size_t T)
{
    aft_tensor st = read_npy("seq_tokens.npy");
    const int32_t *src = st.data;
    int32_t *tok = xmalloc(B * T * sizeof *tok);
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) tok[b * T + t] = src[(b * 37 + t * 3 + t / 7) % st.shape[0]];
    aft_tensor_free(&st);
    return tok;
}

/* logits of tokens (B, n) stepped in chunks of sizes[] (cycling) */
static void step_chunks(aft_model *m, float *lg, const int32_t *tok, size_t B, size_t n, const size_t *sizes,
                        size_t nsizes)
{
    size_t V = aft_model_get_info(m)->n_vocab;
    aft_model_state *s;
    aft_error err = {{0}};
    assert_int_equal(aft_model_state_new(&s, m, B, &err), AFT_OK);
    int32_t *chunk = xmalloc(B * n * sizeof *chunk);
    float *cl = xmalloc(B * n * V * sizeof *cl);
    for (size_t t0 = 0, i = 0; t0 < n; i++) {
        size_t k = sizes[i % nsizes] < n - t0 ? sizes[i % nsizes] : n - t0;
        for (size_t b = 0; b < B; b++) memcpy(chunk + b * k, tok + b * n + t0, k * sizeof *chunk);
        if (aft_model_step(s, cl, chunk, k, 0, &err) != AFT_OK) fail_msg("step at %zu: %s", t0, err.msg);
        for (size_t b = 0; b < B; b++) memcpy(lg + (b * n + t0) * V, cl + b * k * V, k * V * sizeof *cl);
        t0 += k;
        assert_int_equal(aft_model_state_fed(s), t0);
    }
    aft_model_state_free(s);
    free(chunk);
    free(cl);
}

static void test_steps_vs_forward(void **state)
{
    (void)state;
    aft_model *m = open_trained();
    const size_t B = 2, T = 256, V = aft_model_get_info(m)->n_vocab;
    int32_t *tok = some_tokens(B, T);
    float *want = xmalloc(B * T * V * sizeof *want), *got = xmalloc(B * T * V * sizeof *got);
    aft_error err = {{0}};
    assert_int_equal(aft_model_forward(m, want, tok, B, T, &err), AFT_OK);
    const size_t ones[] = {1}, mixed[] = {1, 7, 1, 30, 100, 2}, whole[] = {256};
    const struct { const size_t *s; size_t n; const char *what; } runs[] = {
        {ones, 1, "a token at a time"}, {mixed, 6, "mixed chunks"}, {whole, 1, "one step"}};
    for (size_t i = 0; i < 3; i++) {
        step_chunks(m, got, tok, B, T, runs[i].s, runs[i].n);
        double e = worst_rel(runs[i].what, got, want, B * T * V);
        printf("  steps, %s: worst %.2e x max(1, |logit|) from the forward\n", runs[i].what, e);
        if (!(e <= 2e-5)) fail_msg("%s: %.3g", runs[i].what, e);
    }
    /* last_only: each sequence's last row */
    aft_model_state *s;
    assert_int_equal(aft_model_state_new(&s, m, B, &err), AFT_OK);
    float *last = xmalloc(B * V * sizeof *last);
    int32_t *half = xmalloc(B * 100 * sizeof *half);
    for (size_t b = 0; b < B; b++) memcpy(half + b * 100, tok + b * T, 100 * sizeof *half);
    assert_int_equal(aft_model_step(s, last, half, 100, 1, &err), AFT_OK);
    for (size_t b = 0; b < B; b++) check_rel("last_only", last + b * V, want + (b * T + 99) * V, V, 2e-5);
    aft_model_state_free(s);
    free(last); free(half); free(tok); free(want); free(got);
    aft_model_free(m);
}

/* Past the context: after each token the state's logits are the forward's
 * over the context it holds. The context: when it holds L tokens and
 * another comes, the last L/2 stay. */
static void test_stream_past_context(void **state)
{
    (void)state;
    aft_model *m = open_trained();
    const aft_model_info *in = aft_model_get_info(m);
    const size_t L = in->context, K = in->keep, n = 700, V = in->n_vocab;
    int32_t *tok = some_tokens(1, n);
    float *ones = xmalloc(n * V * sizeof *ones), *chunks = xmalloc(n * V * sizeof *chunks), *f = xmalloc(L * V * sizeof *f);
    const size_t one[] = {1}, mixed[] = {300, 1, 90, 256, 53};
    step_chunks(m, ones, tok, 1, n, one, 1);
    step_chunks(m, chunks, tok, 1, n, mixed, 5);
    check_rel("past the context: chunks against single tokens", chunks, ones, n * V, 2e-5);
    /* the context after token p: start moves on by L - K each time it is full */
    size_t start = 0, checked = 0;
    aft_error err = {{0}};
    for (size_t p = 0; p < n; p++) {
        if (p - start == L) start += L - K;
        if (p % 37 != 0 && p != L && p != L + 1 && p != n - 1) continue;
        size_t len = p + 1 - start;
        assert_int_equal(aft_model_forward(m, f, tok + start, 1, len, &err), AFT_OK);
        char what[64];
        snprintf(what, sizeof what, "token %zu (context from %zu)", p, start);
        check_rel(what, ones + p * V, f + (len - 1) * V, V, 2e-5);
        checked++;
    }
    assert_true(start > L);   /* it moved on at least twice */
    printf("  past the context: %zu tokens checked against the forward over their context\n", checked);
    /* the forward itself stops at L */
    assert_int_equal(aft_model_forward(m, f, tok, 1, L + 1, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "encoder.layers.0.self_attn.pos_bias"));
    free(tok); free(ones); free(chunks); free(f);
    aft_model_free(m);
}

static void test_bad_tokens(void **state)
{
    (void)state;
    aft_model *m = open_trained();
    const size_t V = aft_model_get_info(m)->n_vocab;
    float *lg = xmalloc(2 * 5 * V * sizeof *lg);
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    aft_error err = {{0}};
    tok[7] = (int32_t)V;
    assert_int_equal(aft_model_forward(m, lg, tok, 2, 5, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "token 113 (sequence 1, position 2)"));
    tok[7] = -4;
    aft_model_state *s;
    assert_int_equal(aft_model_state_new(&s, m, 2, &err), AFT_OK);
    assert_int_equal(aft_model_step(s, lg, tok, 5, 0, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "token -4 (sequence 1, position 2)"));
    /* a refused token changes nothing: the state carries on */
    tok[7] = 8;
    assert_int_equal(aft_model_step(s, lg, tok, 5, 0, &err), AFT_OK);
    assert_int_equal(aft_model_state_fed(s), 5);
    aft_model_state_free(s);
    /* characters */
    int32_t *ids;
    size_t n;
    const char *text = "It costs 5\xe2\x82\xac";   /* the euro sign: not in the fortunes */
    assert_int_equal(aft_model_tokenize(m, &ids, &n, text, strlen(text), &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "U+20AC"));
    assert_non_null(strstr(err.msg, "\xe2\x82\xac"));
    assert_non_null(strstr(err.msg, "byte 10"));
    assert_int_equal(aft_model_tokenize(m, &ids, &n, "ab\xff", 3, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "0xFF"));
    assert_int_equal(aft_model_tokenize(m, &ids, &n, "Hello", 5, &err), AFT_OK);
    assert_int_equal(n, 5);
    assert_string_equal(aft_model_token(m, (size_t)ids[1]), "e");
    free(ids);
    /* a character of two bytes is one token */
    assert_int_equal(aft_model_tokenize(m, &ids, &n, "caf\xc3\xa9", 5, &err), AFT_OK);
    assert_int_equal(n, 4);
    assert_string_equal(aft_model_token(m, (size_t)ids[3]), "\xc3\xa9");
    free(ids);
    /* generation needs a prompt */
    assert_int_equal(aft_model_generate(m, NULL, NULL, tok, 0, 3, NULL, NULL, NULL, &err), AFT_ERR_ARG);
    free(lg);
    aft_model_free(m);
}

/* ---------------------------------------------------------------- checkpoints made here */

enum { MAXT = 160 };
typedef struct {
    char names[MAXT][112];
    const char *np[MAXT];
    aft_tensor t[MAXT];
    void *data[MAXT];
    size_t n;
    const char *meta[16];
    size_t nmeta;
} ckpt;

static void ck_free(ckpt *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->data[i]);
    memset(c, 0, sizeof *c);
}

/* a tensor of the given shape, owned by c: random floats (or, when
 * band > 0, a BOOL band |t - t'| < band) */
static void ck_add(ckpt *c, rng *r, const char *name, double scale, size_t ndim, size_t d0, size_t d1, size_t d2)
{
    assert_true(c->n < MAXT);
    aft_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    t->dtype = AFT_F32;
    t->ndim = ndim;
    size_t dims[3] = {d0, d1, d2};
    t->nelem = 1;
    for (size_t i = 0; i < ndim; i++) {
        t->shape[i] = dims[i];
        t->nelem *= dims[i];
    }
    t->nbytes = t->nelem * sizeof(float);
    float *x = randf(r, t->nelem, scale);
    t->data = c->data[c->n] = x;
    snprintf(c->names[c->n], sizeof c->names[0], "%s", name);
    c->np[c->n] = c->names[c->n];
    c->n++;
}

static void ck_add_band(ckpt *c, const char *name, size_t tm, size_t s)
{
    assert_true(c->n < MAXT);
    aft_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    t->dtype = AFT_BOOL;
    t->ndim = 2;
    t->shape[0] = t->shape[1] = tm;
    t->nelem = t->nbytes = tm * tm;
    uint8_t *m = xmalloc(tm * tm);
    for (size_t i = 0; i < tm; i++)
        for (size_t j = 0; j < tm; j++) m[i * tm + j] = (i > j ? i - j : j - i) < s;
    t->data = c->data[c->n] = m;
    snprintf(c->names[c->n], sizeof c->names[0], "%s", name);
    c->np[c->n] = c->names[c->n];
    c->n++;
}

static char tmpdir[] = "/tmp/aft_test_model_XXXXXX";

static const char *ck_write(const ckpt *c)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    aft_error err = {{0}};
    if (aft_st_write(path, c->np, c->t, c->n, c->meta, c->nmeta / 2, &err) != AFT_OK) fail_msg("write: %s", err.msg);
    return path;
}

/* loads c: AFT_OK, or the error in err */
static aft_status ck_load(const ckpt *c, const aft_model_options *o, aft_model **m, aft_error *err)
{
    return aft_model_open(m, ck_write(c), o, err);
}

typedef struct {
    aft_variant variant;
    int positions;     /* labml's embedding with positional encodings (P, 1, D), 2: (P, D); 0: src_embed.weight */
    int mask;          /* local: a local_mask */
    const char *name;
} vcase;

enum { SD = 16, SF = 32, SV = 11, SP = 40, STM = 30, SS = 5, SH = 2, SC = 24 };

/* a random 2-layer model in labml's block structure with the variant's
 * self_attn tensors, and two optional biases left out of both layers */
static void make_small(ckpt *c, const vcase *vc, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    rng r = {seed};
    char n[112];
    if (vc->positions) {
        if (vc->positions == 2) ck_add(c, &r, "src_embed.positional_encodings", 1.0, 2, SP, SD, 0);
        else ck_add(c, &r, "src_embed.positional_encodings", 1.0, 3, SP, 1, SD);
        ck_add(c, &r, "src_embed.linear.weight", 1.0, 2, SV, SD, 0);
    } else {
        ck_add(c, &r, "src_embed.weight", 3.0, 2, SV, SD, 0);
    }
    size_t C = vc->variant == AFT_FULL || vc->variant == AFT_SIMPLE ? SC : SD;
    size_t KC = vc->variant == AFT_CONV ? SH : C;
    for (int l = 0; l < 2; l++) {
        const char *pre = l ? "encoder.layers.1." : "encoder.layers.0.";
#define ADD(stem, sc, nd, a, b) (snprintf(n, sizeof n, "%s%s", pre, stem), ck_add(c, &r, n, sc, nd, a, b, 0))
        switch (vc->variant) {
        case AFT_LOCAL:
            ADD("self_attn.pos_bias", 1.0, 2, STM, STM);
            if (vc->mask) {
                snprintf(n, sizeof n, "%sself_attn.local_mask", pre);
                ck_add_band(c, n, STM, SS);
            }
            break;
        case AFT_FULL:
            if (vc->mask) {   /* factored */
                ADD("self_attn.pos_bias_u", 1.0, 2, STM, 3);
                ADD("self_attn.pos_bias_v", 1.0, 2, STM, 3);
            } else {
                ADD("self_attn.pos_bias", 1.0, 2, STM, STM);
            }
            break;
        case AFT_CONV: ADD("self_attn.pos_bias", 1.0, 2, SH, 2 * SS - 1); break;
        default: break;
        }
        ADD("self_attn.query.weight", 0.3, 2, C, SD);
        ADD("self_attn.query.bias", 0.1, 1, C, 0);
        ADD("self_attn.key.weight", 0.3, 2, KC, SD);
        ADD("self_attn.key.bias", 0.1, 1, KC, 0);
        ADD("self_attn.value.weight", 0.3, 2, C, SD);
        ADD("self_attn.value.bias", 0.1, 1, C, 0);
        ADD("self_attn.output.weight", 0.3, 2, SD, C);
        ADD("self_attn.output.bias", 0.1, 1, SD, 0);
        ADD("feed_forward.layer1.weight", 0.3, 2, SF, SD);
        ADD("feed_forward.layer1.bias", 0.1, 1, SF, 0);
        ADD("feed_forward.layer2.weight", 0.2, 2, SD, SF);
        /* feed_forward.layer2.bias and norm_ff.bias: absent from every layer */
        ADD("norm_self_attn.weight", 1.0, 1, SD, 0);
        ADD("norm_self_attn.bias", 0.2, 1, SD, 0);
        ADD("norm_ff.weight", 1.0, 1, SD, 0);
#undef ADD
    }
    ck_add(c, &r, "encoder.norm.weight", 1.0, 1, SD, 0, 0);
    ck_add(c, &r, "encoder.norm.bias", 0.2, 1, SD, 0, 0);
    ck_add(c, &r, "generator.projection.weight", 0.5, 2, SV, SD, 0);
    ck_add(c, &r, "generator.projection.bias", 0.2, 1, SV, 0, 0);
}

static void test_small_variants(void **state)
{
    (void)state;
    const vcase cases[] = {
        {AFT_LOCAL, 1, 1, "local with local_mask"},
        {AFT_LOCAL, 1, 0, "local, window from the metadata"},
        {AFT_LOCAL, 2, 1, "local, positional encodings (P, D)"},
        {AFT_FULL, 1, 0, "full"},
        {AFT_FULL, 1, 1, "full factored"},
        {AFT_CONV, 1, 0, "conv"},
        {AFT_CONV, 0, 0, "conv without positions"},
        {AFT_SIMPLE, 1, 0, "simple"},
        {AFT_SIMPLE, 0, 0, "simple without positions"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const vcase *vc = &cases[ci];
        ckpt c;
        make_small(&c, vc, 100 + ci);
        if (vc->variant == AFT_LOCAL && !vc->mask) {
            c.meta[0] = "window";
            c.meta[1] = "5";
            c.nmeta = 2;
        }
        aft_model *m, *mref;
        aft_error err = {{0}};
        aft_model_options ro = {.impl = AFT_IMPL_REFERENCE, .threads = 1};
        if (ck_load(&c, NULL, &m, &err) != AFT_OK) fail_msg("%s: %s", vc->name, err.msg);
        assert_int_equal(ck_load(&c, &ro, &mref, &err), AFT_OK);
        const aft_model_info *in = aft_model_get_info(m);
        if (in->variant != vc->variant) fail_msg("%s: found %s", vc->name, aft_variant_name(in->variant));
        assert_int_equal(in->n_layers, 2);
        assert_int_equal(in->window, vc->variant == AFT_LOCAL || vc->variant == AFT_CONV ? SS : 0);
        size_t want_ctx = !vc->positions ? SIZE_MAX : vc->variant == AFT_LOCAL || vc->variant == AFT_FULL ? STM : SP;
        assert_int_equal(in->context, want_ctx);
        assert_false(in->has_vocab);
        /* forward: fast against float64, then steps against the forward */
        size_t B = 2, T = want_ctx < 60 ? want_ctx : 60;
        int32_t *tok = xmalloc(B * 100 * sizeof *tok);
        rng r = {7 + ci};
        for (size_t i = 0; i < B * 100; i++) tok[i] = (int32_t)(rng_next(&r) % SV);
        float *a = xmalloc(B * 100 * SV * sizeof *a), *b = xmalloc(B * 100 * SV * sizeof *b);
        assert_int_equal(aft_model_forward(m, a, tok, B, T, &err), AFT_OK);
        assert_int_equal(aft_model_forward(mref, b, tok, B, T, &err), AFT_OK);
        char what[96];
        snprintf(what, sizeof what, "%s: fast against float64", vc->name);
        check_rel(what, a, b, B * T * SV, TOL_LOGIT);
        const size_t one[] = {1}, mixed[] = {3, 1, 17};
        step_chunks(m, b, tok, B, T, one, 1);
        snprintf(what, sizeof what, "%s: steps against the forward", vc->name);
        check_rel(what, b, a, B * T * SV, 2e-5);
        /* 100 tokens: past the context where there is one */
        float *s1 = xmalloc(B * 100 * SV * sizeof *s1);
        step_chunks(m, a, tok, B, 100, one, 1);
        step_chunks(m, s1, tok, B, 100, mixed, 3);
        snprintf(what, sizeof what, "%s: 100 tokens in chunks against one at a time", vc->name);
        check_rel(what, s1, a, B * 100 * SV, 2e-5);
        if (want_ctx == SIZE_MAX) {   /* no positions: the forward reads them all */
            assert_int_equal(aft_model_forward(m, b, tok, B, 100, &err), AFT_OK);
            check_rel(what, a, b, B * 100 * SV, 2e-5);
        }
        free(s1); free(a); free(b); free(tok);
        aft_model_free(m);
        aft_model_free(mref);
        ck_free(&c);
    }
}

/* ---------------------------------------------------------------- hostile checkpoints */

/* the trained checkpoint's tensors and metadata, borrowed from f */
static void ck_from(ckpt *c, const aft_st_file *f)
{
    memset(c, 0, sizeof *c);
    c->n = aft_st_count(f);
    assert_true(c->n <= MAXT);
    for (size_t i = 0; i < c->n; i++) {
        const char *name;
        c->t[i] = *aft_st_get(f, i, &name);
        c->t[i].owned = NULL;
        snprintf(c->names[i], sizeof c->names[0], "%s", name);
        c->np[i] = c->names[i];
    }
    c->nmeta = 2 * aft_st_metadata_count(f);
    assert_true(c->nmeta <= 16);
    for (size_t i = 0; i < c->nmeta / 2; i++) aft_st_metadata(f, i, &c->meta[2 * i], &c->meta[2 * i + 1]);
}

static size_t ck_index(const ckpt *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->names[i], name) == 0) return i;
    fail_msg("no tensor %s", name);
    return 0;
}

/* drops every tensor whose name starts with prefix */
static void ck_drop(ckpt *c, const char *prefix)
{
    size_t k = 0, pl = strlen(prefix);
    for (size_t i = 0; i < c->n; i++) {
        if (strncmp(c->names[i], prefix, pl) == 0) continue;
        c->t[k] = c->t[i];
        memcpy(c->names[k], c->names[i], sizeof c->names[0]);
        c->np[k] = c->names[k];
        k++;
    }
    assert_true(k < c->n);
    c->n = k;
}

static void ck_meta(ckpt *c, const char *key, const char *value)
{
    for (size_t i = 0; i < c->nmeta; i += 2)
        if (strcmp(c->meta[i], key) == 0) {
            c->meta[i + 1] = value;
            return;
        }
    c->meta[c->nmeta++] = key;
    c->meta[c->nmeta++] = value;
}

/* loading c fails with a message holding each of the strings given */
static void expect_refused(const ckpt *c, const aft_model_options *o, const char *what, ...)
{
    aft_model *m = NULL;
    aft_error err = {{0}};
    aft_status st = ck_load(c, o, &m, &err);
    if (st == AFT_OK) fail_msg("%s: loaded", what);
    assert_null(m);
    va_list ap;
    va_start(ap, what);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(err.msg, s)) fail_msg("%s: the message '%s' does not name '%s'", what, err.msg, s);
    va_end(ap);
    printf("  %s: %s\n", what, err.msg);
}

/* c as f holds it, with tensor name's axis resized to n (its element
 * count and bytes to match); the tensor's index */
static size_t ck_resize(ckpt *c, const aft_st_file *f, const char *name, size_t axis, size_t n)
{
    ck_from(c, f);
    size_t i = ck_index(c, name);
    aft_tensor *t = &c->t[i];
    t->shape[axis] = n;
    t->nelem = 1;
    for (size_t d = 0; d < t->ndim; d++) t->nelem *= t->shape[d];
    t->nbytes = t->nelem * aft_dtype_size(t->dtype);
    return i;
}

/* tensors missing: each named one, and a whole layer */
static void hostile_missing(const aft_st_file *f)
{
    ckpt c;
    const char *missing[] = {"src_embed.linear.weight", "src_embed.positional_encodings",
                             "encoder.layers.3.norm_ff.weight", "encoder.layers.5.feed_forward.layer2.weight",
                             "encoder.layers.0.feed_forward.layer1.weight", "encoder.layers.2.self_attn.key.weight",
                             "encoder.layers.4.self_attn.output.weight", "encoder.norm.weight",
                             "generator.projection.weight", "encoder.layers.5.norm_self_attn.weight"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        ck_from(&c, f);
        ck_drop(&c, missing[i]);
        char what[128];
        snprintf(what, sizeof what, "without %s", missing[i]);
        /* aft_weights_load names the projections without ".weight" in its list of candidates */
        char stem[112];
        snprintf(stem, sizeof stem, "%s", missing[i]);
        if (strstr(stem, "self_attn.")) *strrchr(stem, '.') = 0;
        expect_refused(&c, NULL, what, stem, NULL);
    }
    /* a whole layer missing: layers 0, 1 and 3 to 5 are there */
    ck_from(&c, f);
    ck_drop(&c, "encoder.layers.2.");
    expect_refused(&c, NULL, "without layer 2", "encoder.layers.2.", NULL);
}

/* tensors of the wrong shape, dtype or values */
static void hostile_tensors(const aft_st_file *f)
{
    ckpt c;
    ck_resize(&c, f, "encoder.layers.1.feed_forward.layer2.weight", 1, 255);
    expect_refused(&c, NULL, "layer2 of 255 inputs", "encoder.layers.1.feed_forward.layer2.weight", "[128, 255]",
                   "[128, 256]", NULL);
    ck_resize(&c, f, "generator.projection.bias", 0, 112);
    expect_refused(&c, NULL, "112 logit biases", "generator.projection.bias", NULL);
    ck_resize(&c, f, "encoder.layers.3.self_attn.query.weight", 0, 64);
    expect_refused(&c, NULL, "a query of 64 rows", "encoder.layers.3.self_attn.", NULL);
    ck_resize(&c, f, "encoder.layers.0.self_attn.pos_bias", 1, 128);
    expect_refused(&c, NULL, "a pos_bias of [256, 128]", "encoder.layers.0.self_attn.pos_bias", NULL);
    /* a dtype that is not a float */
    ck_from(&c, f);
    size_t i = ck_index(&c, "encoder.norm.weight");
    c.t[i].dtype = AFT_I16;
    expect_refused(&c, NULL, "an integer norm", "encoder.norm.weight", "I16", NULL);
    /* a local_mask that is not a band */
    ck_from(&c, f);
    i = ck_index(&c, "encoder.layers.4.self_attn.local_mask");
    uint8_t *mask = xmalloc(c.t[i].nbytes);
    memcpy(mask, c.t[i].data, c.t[i].nbytes);
    mask[100 * 256 + 90] = 0;
    c.t[i].data = mask;
    expect_refused(&c, NULL, "a torn local_mask", "encoder.layers.4.self_attn.local_mask", "[100, 90]", NULL);
    free(mask);
}

/* the metadata's window and vocabulary, and the caller's */
static void hostile_metadata(const aft_st_file *f)
{
    ckpt c;
    /* a window against the mask: from the metadata, and asked for */
    ck_from(&c, f);
    ck_meta(&c, "window", "16");
    expect_refused(&c, NULL, "window 16 in the metadata", "metadata 'window'", "local_mask", "band of 32", NULL);
    ck_meta(&c, "window", "32x");
    expect_refused(&c, NULL, "window '32x'", "metadata 'window'", "32x", NULL);
    ck_from(&c, f);
    aft_model_options o = {.window = 8};
    expect_refused(&c, &o, "window 8 asked for", "window 8", "local_mask", NULL);
    /* the vocabulary */
    ck_from(&c, f);
    ck_meta(&c, "vocab", "[\"a\", \"b\"]");
    expect_refused(&c, NULL, "a vocab of 2", "'vocab'", "2 tokens", "113", NULL);
    ck_meta(&c, "vocab", "{\"a\": 1}");
    expect_refused(&c, NULL, "a vocab that is no array", "'vocab'", NULL);
    /* the caller's vocabulary replaces the metadata's (even a bad one) */
    aft_model_options vo = {.vocab = "[\"x\", \"y\"]"};
    expect_refused(&c, &vo, "a vocabulary of 2 given", "the vocabulary", "2 tokens", "113", NULL);
    char *json = xmalloc(113 * 8 + 8), *w = json;
    w += sprintf(w, "[");
    for (int k = 0; k < 113; k++) w += sprintf(w, "%s\"t%d\"", k ? ", " : "", k);
    sprintf(w, "]");
    vo.vocab = json;
    aft_model *vm;
    aft_error verr = {{0}};
    if (ck_load(&c, &vo, &vm, &verr) != AFT_OK) fail_msg("a vocabulary given: %s", verr.msg);
    assert_true(aft_model_get_info(vm)->has_vocab);
    assert_string_equal(aft_model_token(vm, 112), "t112");
    aft_model_free(vm);
    free(json);
}

static void test_hostile_checkpoints(void **state)
{
    (void)state;
    aft_st_file *f;
    aft_error err = {{0}};
    assert_int_equal(aft_st_open(model_file(CKPT), &f, &err), AFT_OK);
    hostile_missing(f);
    hostile_tensors(f);
    hostile_metadata(f);
    /* hostile layer numbers (on an optional tensor's name) */
    ckpt c;
    ck_from(&c, f);
    size_t i = ck_index(&c, "generator.projection.bias");
    snprintf(c.names[i], sizeof c.names[0], "encoder.layers.99999999.x");
    expect_refused(&c, NULL, "layer 99999999", "encoder.layers.99999999.x", NULL);
    snprintf(c.names[i], sizeof c.names[0], "encoder.layers.x.y");
    expect_refused(&c, NULL, "layer x", "encoder.layers.x.y", NULL);
    snprintf(c.names[i], sizeof c.names[0], "encoder.layers.07.y");
    expect_refused(&c, NULL, "layer 07", "encoder.layers.07.y", NULL);
    /* the same file as it is loads, and with the window asked for */
    ck_from(&c, f);
    aft_model_options o = {.window = 32};
    aft_model *m;
    assert_int_equal(ck_load(&c, &o, &m, &err), AFT_OK);
    aft_model_free(m);
    o.window = 1000;   /* any window from Tmax on reads the same band */
    expect_refused(&c, &o, "window 1000 against a band of 32", "local_mask", NULL);
    aft_st_close(f);
}

/* ---------------------------------------------------------------- layers alike */

/* loading c fails with exactly the message want */
static void expect_message(const ckpt *c, const char *what, const char *want)
{
    aft_model *m = NULL;
    aft_error err = {{0}};
    if (ck_load(c, NULL, &m, &err) == AFT_OK) fail_msg("%s: loaded", what);
    assert_null(m);
    if (strcmp(err.msg, want) != 0) fail_msg("%s:\n got  %s\n want %s", what, err.msg, want);
}

/* loading c succeeds with n_unused tensors unread, the first `first` */
static void expect_loads(const ckpt *c, const char *what, size_t n_unused, const char *first)
{
    aft_model *m = NULL;
    aft_error err = {{0}};
    if (ck_load(c, NULL, &m, &err) != AFT_OK) fail_msg("%s: %s", what, err.msg);
    const aft_model_info *in = aft_model_get_info(m);
    if (in->n_unused != n_unused) fail_msg("%s: %zu tensors unused, not %zu", what, in->n_unused, n_unused);
    if (first) assert_string_equal(in->unused, first);
    else assert_null(in->unused);
    aft_model_free(m);
}

/* drops tensor stem of every layer of c (of n) */
static void ck_drop_all(ckpt *c, const char *stem, size_t n)
{
    char name[112];
    for (size_t l = 0; l < n; l++) {
        snprintf(name, sizeof name, "encoder.layers.%zu.%s", l, stem);
        ck_drop(c, name);
    }
}

static void test_layers_alike(void **state)
{
    (void)state;
    aft_st_file *f;
    aft_error err = {{0}};
    assert_int_equal(aft_st_open(model_file(CKPT), &f, &err), AFT_OK);
    ckpt c;
    /* the file: one layer without a bias every other layer has */
    ck_from(&c, f);
    expect_loads(&c, "the trained model", 0, NULL);
    ck_drop(&c, "encoder.layers.1.feed_forward.layer2.bias");
    expect_message(&c, "without layer 1's layer2.bias",
                   "missing tensor 'encoder.layers.1.feed_forward.layer2.bias', which layer 0 has");
    ck_from(&c, f);
    ck_drop(&c, "encoder.layers.0.norm_ff.bias");
    expect_message(&c, "without layer 0's norm_ff.bias",
                   "missing tensor 'encoder.layers.0.norm_ff.bias', which layer 1 has");
    ck_from(&c, f);
    ck_drop(&c, "encoder.layers.4.self_attn.local_mask");   /* the window is in the metadata */
    expect_message(&c, "without layer 4's local_mask",
                   "missing tensor 'encoder.layers.4.self_attn.local_mask', which layer 0 has");
    /* optional tensors absent from every layer: loaded as before */
    ck_from(&c, f);
    ck_drop_all(&c, "feed_forward.layer2.bias", 6);
    ck_drop_all(&c, "norm_ff.bias", 6);
    ck_drop_all(&c, "self_attn.local_mask", 6);
    expect_loads(&c, "no layer2.bias, norm_ff.bias or local_mask in any layer", 0, NULL);
    ck_from(&c, f);
    ck_drop_all(&c, "self_attn.query.bias", 6);   /* labml's AFTLocal with bias=False */
    ck_drop_all(&c, "self_attn.key.bias", 6);
    ck_drop_all(&c, "self_attn.value.bias", 6);
    expect_loads(&c, "self_attn biases on the output alone", 0, NULL);
    /* a bias only some of a layer's projections have */
    ck_from(&c, f);
    ck_drop(&c, "encoder.layers.3.self_attn.value.bias");
    expect_message(&c, "without layer 3's value bias",
                   "missing tensor 'encoder.layers.3.self_attn.value.bias' beside "
                   "'encoder.layers.3.self_attn.query.bias': a layer has a bias for every projection, for none, or "
                   "for its output alone");
    ck_from(&c, f);
    ck_drop(&c, "encoder.layers.5.self_attn.output.bias");
    expect_message(&c, "without layer 5's output bias",
                   "missing tensor 'encoder.layers.5.self_attn.output.bias' beside "
                   "'encoder.layers.5.self_attn.query.bias': a layer has a bias for every projection, for none, or "
                   "for its output alone");
    /* one layer's self_attn with its output's bias alone, the others with all four */
    ck_from(&c, f);
    ck_drop(&c, "encoder.layers.3.self_attn.query.bias");
    ck_drop(&c, "encoder.layers.3.self_attn.key.bias");
    ck_drop(&c, "encoder.layers.3.self_attn.value.bias");
    expect_message(&c, "without layer 3's query, key and value biases",
                   "missing tensor 'encoder.layers.3.self_attn.query.bias', which the layer "
                   "'encoder.layers.0.self_attn.' has");
    /* tensors the model does not read: loaded, counted, the first named */
    ck_from(&c, f);
    rng r = {5};
    ck_add(&c, &r, "encoder.layers.2.feed_forward.linear_v.weight", 0.1, 2, 256, 128, 0);
    ck_add(&c, &r, "src_embed.weight", 0.1, 2, 113, 128, 0);   /* beside src_embed.linear */
    expect_loads(&c, "a gated FFN's linear_v and a second embedding", 2,
                 "encoder.layers.2.feed_forward.linear_v.weight");
    free(c.data[c.n - 1]);
    free(c.data[c.n - 2]);
    /* a shape unlike layer 0's */
    const vcase full = {AFT_FULL, 1, 0, "full"};
    make_small(&c, &full, 7);
    size_t i = ck_index(&c, "encoder.layers.1.self_attn.pos_bias");
    c.t[i].shape[0] = c.t[i].shape[1] = 20;
    c.t[i].nelem = 400;
    c.t[i].nbytes = 400 * sizeof(float);
    expect_message(&c, "layer 1's pos_bias of [20, 20]",
                   "'encoder.layers.1.self_attn.pos_bias' is [20, 20] but layer 0's is [30, 30]");
    ck_free(&c);
    aft_st_close(f);
}

/* ---------------------------------------------------------------- sampling */

static void test_sampling(void **state)
{
    (void)state;
    aft_error err = {{0}};
    const float lg[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    aft_sampling g = {0.0f, 0, 0};
    uint64_t rs = 1;
    int32_t tok;
    assert_int_equal(aft_sample(&tok, lg, 5, &g, &rs, &err), AFT_OK);
    assert_int_equal(tok, 1);   /* the lowest id among equals */
    g.temperature = 1.0f;
    g.top_k = 1;
    assert_int_equal(aft_sample(&tok, lg, 5, &g, &rs, &err), AFT_OK);
    assert_int_equal(tok, 1);
    /* top-k: only the k most likely */
    g.top_k = 3;
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(aft_sample(&tok, lg, 5, &g, &rs, &err), AFT_OK);
        assert_true(tok == 1 || tok == 3 || tok == 4);
    }
    /* frequencies at temperature 1 and 0.5 */
    const float lp[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    const double want1[3] = {0.5, 0.3, 0.2}, want05[3] = {0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38};
    for (int k = 0; k < 2; k++) {
        aft_sampling sm = {k ? 0.5f : 1.0f, 0, 0};
        size_t count[3] = {0};
        uint64_t r = 42;
        for (int i = 0; i < 40000; i++) {
            assert_int_equal(aft_sample(&tok, lp, 3, &sm, &r, &err), AFT_OK);
            count[tok]++;
        }
        for (int j = 0; j < 3; j++) {
            double p = (double)count[j] / 40000.0, w = k ? want05[j] : want1[j];
            if (fabs(p - w) > 0.012) fail_msg("temperature %g: token %d drawn %.4f of the time, expected %.4f", (double)sm.temperature, j, p, w);
        }
    }
    /* the same seed, the same draws */
    uint64_t a = 7, b = 7;
    aft_sampling sm = {0.8f, 0, 0};
    for (int i = 0; i < 100; i++) {
        int32_t ta, tb;
        assert_int_equal(aft_sample(&ta, lp, 3, &sm, &a, &err), AFT_OK);
        assert_int_equal(aft_sample(&tb, lp, 3, &sm, &b, &err), AFT_OK);
        assert_int_equal(ta, tb);
    }
    /* refused */
    const float nanl[3] = {0.0f, NAN, 1.0f}, ninf[2] = {-INFINITY, -INFINITY};
    assert_int_equal(aft_sample(&tok, nanl, 3, &sm, &a, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "NaN"));
    assert_int_equal(aft_sample(&tok, ninf, 2, &sm, &a, &err), AFT_ERR_ARG);
    sm.temperature = -1.0f;
    assert_int_equal(aft_sample(&tok, lp, 3, &sm, &a, &err), AFT_ERR_ARG);
    sm.temperature = NAN;
    assert_int_equal(aft_sample(&tok, lp, 3, &sm, &a, &err), AFT_ERR_ARG);
    /* +inf takes everything */
    const float pinf[3] = {0.0f, INFINITY, 1.0f};
    sm.temperature = 1.0f;
    assert_int_equal(aft_sample(&tok, pinf, 3, &sm, &a, &err), AFT_OK);
    assert_int_equal(tok, 1);
}

static void test_generate_seeded(void **state)
{
    (void)state;
    aft_model *m = open_trained();
    aft_error err = {{0}};
    int32_t *prompt;
    size_t np;
    assert_int_equal(aft_model_tokenize(m, &prompt, &np, "A ", 2, &err), AFT_OK);
    int32_t a[300], b[300], c[300];
    aft_sampling sm = {0.8f, 20, 12345};
    assert_int_equal(aft_model_generate(m, a, NULL, prompt, np, 300, &sm, NULL, NULL, &err), AFT_OK);
    assert_int_equal(aft_model_generate(m, b, NULL, prompt, np, 300, &sm, NULL, NULL, &err), AFT_OK);
    assert_memory_equal(a, b, sizeof a);
    sm.seed = 54321;
    assert_int_equal(aft_model_generate(m, c, NULL, prompt, np, 300, &sm, NULL, NULL, &err), AFT_OK);
    assert_memory_not_equal(a, c, sizeof a);
    free(prompt);
    aft_model_free(m);
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_layernorm_back),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_elem),
        cmocka_unit_test(test_ffn),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_16bit),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_logits_vs_torch),
        cmocka_unit_test(test_greedy_vs_torch),
        cmocka_unit_test(test_steps_vs_forward),
        cmocka_unit_test(test_stream_past_context),
        cmocka_unit_test(test_bad_tokens),
        cmocka_unit_test(test_small_variants),
        cmocka_unit_test(test_hostile_checkpoints),
        cmocka_unit_test(test_layers_alike),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_generate_seeded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
