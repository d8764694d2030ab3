/* test_model_grad.c - the whole model's loss and backward pass
 * (lib/model_grad.c) against a float64 reference written here: labml's
 * model (embedding with positional encodings, pre-norm layers of AFTLocal
 * and a ReLU FFN, the final norm, the generator, cross-entropy) as plain
 * loops in double, and its gradient by central differences, for every
 * element of every trained parameter. Each tensor within 1e-4 x max(1,
 * max|g|):
 *  - a small random model; the same with keys in the hundreds (the AFT
 *    layer's stabilisers); with ignored targets;
 *  - dropout: the same seed gives the same bits, another seed another loss,
 *    and the loss and gradients match the reference fed the same masks;
 *  - threads: the batch cut into groups of sequences, one a thread, gives
 *    the same bits for 1 and 2 threads; 3 (more than the groups) agree;
 *  - the parameters: labml's names in its state-dict order, writes reach the
 *    forward pass after aft_model_params_changed;
 *  - the PyTorch fixture (testdata/model/grad, made by
 *    testdata/model/make_grad_fixture.py): the gradients torch's autograd
 *    gives in float64, on fixed tokens. */
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

#include "aft.h"
#include "files.h"
#include "model_priv.h"   /* aft_train_dropout_scale */
#include "rng.h"

#define TOL 1e-4

/* ---------------------------------------------------------------- a small model */

enum { NL = 2, D = 8, F = 12, V = 7, TM = 6, S = 3, P = 9, B = 2, T = 5, NPAR = 2 + 18 * NL + 4 };

static char tmpdir[] = "/tmp/aft_test_mgrad_XXXXXX";

/* a checkpoint of labml's model in these sizes (values overwritten later) */
static aft_model *small_model(void)
{
    static char names[NPAR][96];
    const char *np[NPAR];
    aft_tensor t[NPAR];
    void *data[NPAR];
    size_t n = 0;
    rng r = {7};
#define ADD(nd, a, b, c, ...)                                                                       \
    do {                                                                                             \
        snprintf(names[n], sizeof names[0], __VA_ARGS__);                                           \
        np[n] = names[n];                                                                           \
        memset(&t[n], 0, sizeof t[n]);                                                              \
        t[n].dtype = AFT_F32;                                                                       \
        t[n].ndim = nd;                                                                             \
        size_t dd[3] = {a, b, c};                                                                   \
        t[n].nelem = 1;                                                                             \
        for (size_t i_ = 0; i_ < nd; i_++) t[n].nelem *= (t[n].shape[i_] = dd[i_]);                 \
        t[n].nbytes = t[n].nelem * 4;                                                               \
        t[n].data = data[n] = randf(&r, t[n].nelem, 0.5);                                           \
        n++;                                                                                        \
    } while (0)
    ADD(2, V, D, 0, "src_embed.linear.weight");
    ADD(3, P, 1, D, "src_embed.positional_encodings");
    for (int l = 0; l < NL; l++) {
        const char *s[] = {"query", "key", "value"};
        for (int k = 0; k < 3; k++) {
            ADD(2, D, D, 0, "encoder.layers.%d.self_attn.%s.weight", l, s[k]);
            ADD(1, D, 0, 0, "encoder.layers.%d.self_attn.%s.bias", l, s[k]);
        }
        ADD(2, TM, TM, 0, "encoder.layers.%d.self_attn.pos_bias", l);
        ADD(2, TM, TM, 0, "encoder.layers.%d.self_attn.local_mask", l);
        float *mk = data[n - 1];
        for (size_t i = 0; i < TM; i++)
            for (size_t j = 0; j < TM; j++) mk[i * TM + j] = (i > j ? i - j : j - i) < S;
        ADD(2, D, D, 0, "encoder.layers.%d.self_attn.output.weight", l);
        ADD(1, D, 0, 0, "encoder.layers.%d.self_attn.output.bias", l);
        ADD(2, F, D, 0, "encoder.layers.%d.feed_forward.layer1.weight", l);
        ADD(1, F, 0, 0, "encoder.layers.%d.feed_forward.layer1.bias", l);
        ADD(2, D, F, 0, "encoder.layers.%d.feed_forward.layer2.weight", l);
        ADD(1, D, 0, 0, "encoder.layers.%d.feed_forward.layer2.bias", l);
        ADD(1, D, 0, 0, "encoder.layers.%d.norm_self_attn.weight", l);
        ADD(1, D, 0, 0, "encoder.layers.%d.norm_self_attn.bias", l);
        ADD(1, D, 0, 0, "encoder.layers.%d.norm_ff.weight", l);
        ADD(1, D, 0, 0, "encoder.layers.%d.norm_ff.bias", l);
    }
    ADD(1, D, 0, 0, "encoder.norm.weight");
    ADD(1, D, 0, 0, "encoder.norm.bias");
    ADD(2, V, D, 0, "generator.projection.weight");
    ADD(1, V, 0, 0, "generator.projection.bias");
#undef ADD
    assert_int_equal(n, NPAR);
    char path[128];
    snprintf(path, sizeof path, "%s/small.safetensors", tmpdir);
    aft_error err = {{0}};
    if (aft_st_write(path, np, t, n, NULL, 0, &err)) fail_msg("%s", err.msg);
    for (size_t i = 0; i < n; i++) free(data[i]);
    aft_model *m;
    aft_model_options o = {.threads = 2};
    if (aft_model_open(&m, path, &o, &err)) fail_msg("%s", err.msg);
    return m;
}

/* ---------------------------------------------------------------- the float64 reference */

typedef struct {
    double *p[NPAR];   /* every parameter, as param_data holds it */
    float drop;
    uint64_t seed;
} ref;

static double ln_row(double *z, const double *x, const double *w, const double *b)
{
    double mean = 0, var = 0;
    for (int j = 0; j < D; j++) mean += x[j];
    mean /= D;
    for (int j = 0; j < D; j++) var += (x[j] - mean) * (x[j] - mean);
    var /= D;
    double rstd = 1.0 / sqrt(var + 1e-5);
    for (int j = 0; j < D; j++) z[j] = (x[j] - mean) * rstd * w[j] + b[j];
    return rstd;
}

static double mask_at(const ref *R, size_t site, size_t i)
{
    return aft_train_dropout_scale(R->seed, site, i, R->drop);
}

/* y (n, out) = x (n, in) W^T + b */
static void lin(double *y, const double *x, const double *W, const double *b, int n, int in, int out)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int k = 0; k < in; k++) s += x[i * in + k] * W[o * in + k];
            y[i * out + o] = s;
        }
}

static double ref_loss(const ref *R, const int32_t *tok, const int32_t *tgt)
{
    enum { N = B * T };
    double x[N * D], z[N * D], q[N * D], k[N * D], v[N * D], h[N * D], y[N * D], hf[N * F];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < D; j++)
                x[(b * T + t) * D + j] = R->p[0][tok[b * T + t] * D + j] * (double)(float)sqrt((double)D) +
                                         R->p[1][t * D + j];
    for (int l = 0; l < NL; l++) {
        double *const *p = R->p + 2 + 18 * l;
        for (int i = 0; i < N; i++) ln_row(z + i * D, x + i * D, p[14], p[15]);
        lin(q, z, p[0], p[1], N, D, D);
        lin(k, z, p[2], p[3], N, D, D);
        lin(v, z, p[4], p[5], N, D, D);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < D; c++) {
                    double mx = -INFINITY, num = 0, den = 0;
                    for (int u = 0; u <= t; u++) {
                        double w = p[6][t * TM + u] * p[7][t * TM + u];
                        double a = k[(b * T + u) * D + c] + w;
                        mx = a > mx ? a : mx;
                    }
                    for (int u = 0; u <= t; u++) {
                        double w = p[6][t * TM + u] * p[7][t * TM + u];
                        double e = exp(k[(b * T + u) * D + c] + w - mx);
                        num += e * v[(b * T + u) * D + c];
                        den += e;
                    }
                    double g = q[(b * T + t) * D + c];
                    h[(b * T + t) * D + c] = num / den / (1.0 + exp(-g));
                }
        lin(y, h, p[8], p[9], N, D, D);
        for (int i = 0; i < N * D; i++) x[i] += y[i] * mask_at(R, 3 * l, i);
        for (int i = 0; i < N; i++) ln_row(z + i * D, x + i * D, p[16], p[17]);
        lin(hf, z, p[10], p[11], N, D, F);
        for (int i = 0; i < N * F; i++) hf[i] = (hf[i] > 0 ? hf[i] : 0) * mask_at(R, 3 * l + 1, i);
        lin(y, hf, p[12], p[13], N, F, D);
        for (int i = 0; i < N * D; i++) x[i] += y[i] * mask_at(R, 3 * l + 2, i);
    }
    double *const *p = R->p + 2 + 18 * NL;
    double lg[N * V], total = 0;
    int count = 0;
    for (int i = 0; i < N; i++) ln_row(z + i * D, x + i * D, p[0], p[1]);
    lin(lg, z, p[2], p[3], N, D, V);
    for (int i = 0; i < N; i++) {
        if (tgt[i] < 0) continue;
        double mx = lg[i * V], s = 0;
        for (int j = 1; j < V; j++) mx = lg[i * V + j] > mx ? lg[i * V + j] : mx;
        for (int j = 0; j < V; j++) s += exp(lg[i * V + j] - mx);
        total += mx + log(s) - lg[i * V + tgt[i]];
        count++;
    }
    return count ? total / count : 0.0;
}

/* ---------------------------------------------------------------- checks */

static void fill_ref(ref *R, aft_model *m)
{
    for (size_t i = 0; i < NPAR; i++) {
        const char *name;
        size_t nd, sh[4];
        assert_int_equal(aft_model_param_info(m, i, &name, &nd, sh, NULL), AFT_OK);
        size_t n = 1;
        for (size_t d = 0; d < nd; d++) n *= sh[d];
        const float *a = aft_model_param_data(m, i);
        assert_non_null(a);
        R->p[i] = xmalloc(n * sizeof(double));
        for (size_t j = 0; j < n; j++) R->p[i][j] = a[j];
    }
}

static void free_ref(ref *R)
{
    for (size_t i = 0; i < NPAR; i++) free(R->p[i]);
}

/* len[i] = parameter i's elements */
static void param_lens(const aft_model *m, size_t len[NPAR])
{
    for (size_t i = 0; i < NPAR; i++) {
        size_t nd, sh[4];
        aft_model_param_info(m, i, NULL, &nd, sh, NULL);
        len[i] = 1;
        for (size_t d = 0; d < nd; d++) len[i] *= sh[d];
    }
}

/* aft's loss and every gradient against the reference's */
static void check_grads(aft_model *m, const int32_t *tok, const int32_t *tgt, float drop, uint64_t seed,
                        const char *what)
{
    ref R = {.drop = drop, .seed = seed};
    fill_ref(&R, m);
    float *g[NPAR];
    size_t len[NPAR];
    param_lens(m, len);
    for (size_t i = 0; i < NPAR; i++) {
        g[i] = xmalloc(len[i] * sizeof(float));
        for (size_t j = 0; j < len[i]; j++) g[i][j] = NAN;
    }
    aft_train_options o = {.dropout = drop, .seed = seed, .threads = 2};
    float loss;
    aft_error err = {{0}};
    if (aft_model_loss_grad(m, tok, tgt, B, T, &o, &loss, g, &err)) fail_msg("%s: %s", what, err.msg);
    double want = ref_loss(&R, tok, tgt);
    if (fabs(loss - want) > TOL * fmax(1.0, fabs(want))) fail_msg("%s: loss %.9g, reference %.9g", what, loss, want);
    double worst = 0;
    for (size_t i = 0; i < NPAR; i++) {
        const char *name;
        aft_model_param_info(m, i, &name, NULL, NULL, NULL);
        double *num = xmalloc(len[i] * sizeof(double)), gmax = 0;
        for (size_t j = 0; j < len[i]; j++) {
            if (!aft_model_param_trainable(m, i)) {
                num[j] = 0;
                continue;
            }
            double keep = R.p[i][j], h = 1e-6 * fmax(1.0, fabs(keep));
            R.p[i][j] = keep + h;
            double up = ref_loss(&R, tok, tgt);
            R.p[i][j] = keep - h;
            double down = ref_loss(&R, tok, tgt);
            R.p[i][j] = keep;
            num[j] = (up - down) / (2 * h);
            gmax = fmax(gmax, fabs(num[j]));
        }
        for (size_t j = 0; j < len[i]; j++) {
            double e = fabs(g[i][j] - num[j]) / fmax(1.0, gmax);
            if (!(e <= TOL))
                fail_msg("%s: %s[%zu] = %.9g, reference %.9g (max |g| %.3g)", what, name, j, g[i][j], num[j], gmax);
            worst = fmax(worst, e);
        }
        free(num);
        free(g[i]);
    }
    print_message("%s: loss %.6f, worst gradient error %.2e x max(1, max|g|)\n", what, loss, worst);
    free_ref(&R);
}

static void tokens(int32_t *tok, int32_t *tgt, uint64_t seed)
{
    rng r = {seed};
    for (size_t i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(rng_next(&r) % V);
        tgt[i] = (int32_t)(rng_next(&r) % V);
    }
}

static void test_names(void **state)
{
    (void)state;
    aft_model *m = small_model();
    assert_int_equal(aft_model_param_count(m), NPAR);
    const char *name;
    size_t nd, sh[4];
    assert_int_equal(aft_model_param_info(m, 0, &name, &nd, sh, NULL), AFT_OK);
    assert_string_equal(name, "src_embed.linear.weight");
    assert_int_equal(aft_model_param_info(m, 8, &name, &nd, sh, NULL), AFT_OK);
    assert_string_equal(name, "encoder.layers.0.self_attn.pos_bias");
    assert_int_equal(aft_model_param_trainable(m, 9), 0);
    assert_int_equal(aft_model_param_info(m, NPAR - 1, &name, &nd, sh, NULL), AFT_OK);
    assert_string_equal(name, "generator.projection.bias");
    aft_error err;
    assert_int_equal(aft_model_param_info(m, NPAR, &name, &nd, sh, &err), AFT_ERR_ARG);
    /* a write reaches the forward pass after params_changed */
    int32_t tok[B * T], tgt[B * T];
    tokens(tok, tgt, 3);
    float *gb = aft_model_param_data(m, NPAR - 1);
    gb[2] += 1.5f;
    assert_int_equal(aft_model_params_changed(m, &err), AFT_OK);
    float lg[B * T * V], loss;
    assert_int_equal(aft_model_forward(m, lg, tok, B, T, &err), AFT_OK);
    double ce = 0;
    for (size_t i = 0; i < B * T; i++) {
        double mx = lg[i * V], s = 0;
        for (size_t j = 1; j < V; j++) mx = fmax(mx, lg[i * V + j]);
        for (size_t j = 0; j < V; j++) s += exp(lg[i * V + j] - mx);
        ce += mx + log(s) - lg[i * V + tgt[i]];
    }
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, T, NULL, &loss, NULL, &err), AFT_OK);
    assert_true(fabs(loss - ce / (B * T)) < 1e-5);
    tok[3] = V;
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, T, NULL, &loss, NULL, &err), AFT_ERR_ARG);
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, TM + 1, NULL, &loss, NULL, &err), AFT_ERR_ARG);
    aft_model_free(m);
}

static void test_small(void **state)
{
    (void)state;
    aft_model *m = small_model();
    int32_t tok[B * T], tgt[B * T];
    tokens(tok, tgt, 1);
    check_grads(m, tok, tgt, 0.0f, 0, "small model");
    tgt[0] = tgt[4] = tgt[7] = -1;
    check_grads(m, tok, tgt, 0.0f, 0, "ignored targets");
    aft_model_free(m);
}

static void test_extreme_keys(void **state)
{
    (void)state;
    aft_model *m = small_model();
    /* keys in the hundreds: exp(k) overflows float32 without the stabilisers */
    for (int l = 0; l < NL; l++) {
        float *kw = aft_model_param_data(m, 2 + 18 * l + 2), *kb = aft_model_param_data(m, 2 + 18 * l + 3);
        for (size_t i = 0; i < D * D; i++) kw[i] *= 120.0f;
        for (size_t i = 0; i < D; i++) kb[i] = 300.0f + 40.0f * (float)i;
    }
    aft_error err;
    assert_int_equal(aft_model_params_changed(m, &err), AFT_OK);
    int32_t tok[B * T], tgt[B * T];
    tokens(tok, tgt, 2);
    check_grads(m, tok, tgt, 0.0f, 0, "extreme keys");
    aft_model_free(m);
}

static void test_dropout(void **state)
{
    (void)state;
    aft_model *m = small_model();
    int32_t tok[B * T], tgt[B * T];
    tokens(tok, tgt, 4);
    aft_train_options o = {.dropout = 0.3f, .seed = 11, .threads = 2};
    float a, b, c;
    aft_error err;
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, T, &o, &a, NULL, &err), AFT_OK);
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, T, &o, &b, NULL, &err), AFT_OK);
    assert_memory_equal(&a, &b, sizeof a);
    o.seed = 12;
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, T, &o, &c, NULL, &err), AFT_OK);
    assert_true(a != c);
    o.dropout = 1.0f;
    assert_int_equal(aft_model_loss_grad(m, tok, tgt, B, T, &o, &c, NULL, &err), AFT_ERR_ARG);
    check_grads(m, tok, tgt, 0.3f, 11, "dropout 0.3");
    aft_model_free(m);
}

/* the batch's sequences are cut into groups fixed by the sizes alone (B
 * of them here), each run on one thread: the loss and every gradient the
 * same bits for 1 and 2 threads (and with dropout); 3 threads, more than
 * the groups, run them one after another on all three, within float32's
 * rounding of those */
static void test_threads(void **state)
{
    (void)state;
    aft_model *m = small_model();
    int32_t tok[B * T], tgt[B * T];
    tokens(tok, tgt, 5);
    float *g[3][NPAR], loss[3];
    size_t len[NPAR];
    param_lens(m, len);
    for (int drop = 0; drop < 2; drop++) {
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < NPAR; i++) g[k][i] = xmalloc(len[i] * sizeof(float));
            aft_train_options o = {.dropout = drop ? 0.3f : 0.0f, .seed = 9, .threads = k + 1};
            aft_error err = {{0}};
            if (aft_model_loss_grad(m, tok, tgt, B, T, &o, &loss[k], g[k], &err)) fail_msg("%s", err.msg);
        }
        assert_memory_equal(&loss[1], &loss[0], sizeof loss[0]);
        assert_true(fabs(loss[2] - loss[0]) <= 1e-6 * fmax(1.0, fabs(loss[0])));
        for (size_t i = 0; i < NPAR; i++) {
            assert_memory_equal(g[1][i], g[0][i], len[i] * sizeof(float));
            double gmax = 0;
            for (size_t j = 0; j < len[i]; j++) gmax = fmax(gmax, fabs(g[0][i][j]));
            for (size_t j = 0; j < len[i]; j++)
                if (!(fabs(g[2][i][j] - g[0][i][j]) <= 1e-5 * fmax(1.0, gmax)))
                    fail_msg("3 threads: parameter %zu[%zu] = %.9g, 1 thread %.9g", i, j, g[2][i][j], g[0][i][j]);
            for (int k = 0; k < 3; k++) free(g[k][i]);
        }
    }
    aft_model_free(m);
}

/* ---------------------------------------------------------------- PyTorch's gradients */

static int32_t *fixture_ids(const char *name, size_t *b, size_t *t)
{
    aft_tensor x;
    aft_error err = {{0}};
    if (aft_npy_read(files_fixture("model/grad", name), &x, NULL, &err) != AFT_OK) fail_msg("%s: %s", name, err.msg);
    assert_int_equal(x.dtype, AFT_I32);
    assert_int_equal(x.ndim, 2);
    *b = x.shape[0];
    *t = x.shape[1];
    int32_t *ids = xmalloc(x.nbytes);
    memcpy(ids, x.data, x.nbytes);
    aft_tensor_free(&x);
    return ids;
}

static void torch_case(const char *name)
{
    char path[160];
    aft_error err = {{0}};
    snprintf(path, sizeof path, "%s.safetensors", name);
    aft_model *m;
    aft_model_options mo = {.threads = 2};
    if (aft_model_open(&m, files_fixture("model/grad", path), &mo, &err)) fail_msg("%s: %s", path, err.msg);
    snprintf(path, sizeof path, "%s_grads.safetensors", name);
    aft_st_file *f;
    if (aft_st_open(files_fixture("model/grad", path), &f, &err)) fail_msg("%s: %s", path, err.msg);
    size_t bb, tt, b2, t2;
    int32_t *tok = fixture_ids("tokens.npy", &bb, &tt), *tgt = fixture_ids("targets.npy", &b2, &t2);
    assert_true(bb == b2 && tt == t2);
    size_t np = aft_model_param_count(m), ntrained = 0;
    float **g = xcalloc(np, sizeof *g), loss;
    for (size_t i = 0; i < np; i++) {
        size_t nd, sh[4], n = 1;
        aft_model_param_info(m, i, NULL, &nd, sh, NULL);
        for (size_t d = 0; d < nd; d++) n *= sh[d];
        g[i] = xmalloc(n * sizeof(float));
    }
    aft_train_options o = {.threads = 2};
    if (aft_model_loss_grad(m, tok, tgt, bb, tt, &o, &loss, g, &err)) fail_msg("%s: %s", name, err.msg);
    double want = atof(aft_st_metadata_find(f, "loss")), worst = 0;
    if (fabs(loss - want) > TOL * fmax(1.0, fabs(want))) fail_msg("%s: loss %.9g, torch %.9g", name, loss, want);
    for (size_t i = 0; i < np; i++) {
        const char *pn;
        aft_model_param_info(m, i, &pn, NULL, NULL, NULL);
        const aft_tensor *t = aft_st_find(f, pn);
        if (!aft_model_param_trainable(m, i)) {
            assert_null(t);
            continue;
        }
        if (!t) fail_msg("%s: torch has no gradient '%s'", name, pn);
        float *tg;
        if (aft_tensor_to_f32(t, &tg, &err)) fail_msg("%s", err.msg);
        double gmax = 0;
        for (size_t j = 0; j < t->nelem; j++) gmax = fmax(gmax, fabs(tg[j]));
        for (size_t j = 0; j < t->nelem; j++) {
            double e = fabs(g[i][j] - tg[j]) / fmax(1.0, gmax);
            if (!(e <= TOL)) fail_msg("%s: %s[%zu] = %.9g, torch %.9g", name, pn, j, g[i][j], tg[j]);
            /* and relative to the tensor's own scale, for the report (a
             * gradient that is 0 by symmetry, as the key bias's, aside) */
            if (gmax > 1e-6) worst = fmax(worst, fabs(g[i][j] - tg[j]) / gmax);
        }
        free(tg);
        ntrained++;
    }
    assert_int_equal(ntrained, aft_st_count(f));
    print_message("torch %s: loss %.7f (torch %.7f), worst error %.2e x max|g| of its tensor\n", name, loss, want,
                  worst);
    for (size_t i = 0; i < np; i++) free(g[i]);
    free(g);
    free(tok);
    free(tgt);
    aft_st_close(f);
    aft_model_free(m);
}

static void test_torch(void **state)
{
    (void)state;
    torch_case("small");
    torch_case("extreme");
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/small.safetensors", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_small),
        cmocka_unit_test(test_extreme_keys),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_torch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
