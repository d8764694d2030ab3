/*
 * test_ref_aft.c - the tests' float64 reference (ref_aft.c) against closed
 * forms and identities between the variants, so a bug there cannot hide
 * behind an agreeing library: simple's softmax written out, a mask leaving
 * one key, a constant bias, local as a banded full, conv with shared keys
 * and as a Toeplitz full, causality as a mask, shifted keys, factored and
 * seeded biases as the dense ones they describe, and the layer reference
 * with identity projections.
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

#include "opcheck.h"
#include "ref_aft.h"
#include "rng.h"

static double max_abs_diff(const double *a, const double *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= m)) m = e;   /* NaN propagates as the maximum */
    }
    return m;
}

/* simple: Y[t,c] = sigmoid(q[t,c]) * sum_t' softmax_t'(k[.,c]) v[t',c], the
 * softmax written out naively (moderate keys, so no overflow) */
static void test_ref_simple_closed_form(void **state)
{
    (void)state;
    const size_t B = 2, T = 9, C = 4;
    rng r = {1};
    double *q = randd(&r, B * T * C, 2), *k = randd(&r, B * T * C, 3),
           *v = randd(&r, B * T * C, 1), *y = xmalloc(B * T * C * sizeof *y);
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_SIMPLE, 0, 0, causal);
        assert_int_equal(ref_aft_op_d(y, q, k, v, &bias, &cfg, B, T, C, C), 0);
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < T; t++)
                for (size_t c = 0; c < C; c++) {
                    size_t last = causal ? t : T - 1;
                    double num = 0, den = 0;
                    for (size_t t2 = 0; t2 <= last; t2++) {
                        size_t i = (b * T + t2) * C + c;
                        num += exp(k[i]) * v[i];
                        den += exp(k[i]);
                    }
                    size_t i = (b * T + t) * C + c;
                    double want = 1.0 / (1.0 + exp(-q[i])) * num / den;
                    assert_true(fabs(y[i] - want) < 1e-13);
                }
    }
    free(q);
    free(k);
    free(v);
    free(y);
}

/* a mask leaving exactly one t' per row: Y = sigmoid(q) * v[t'] whatever the
 * keys and the bias, even at +-500 / +-250 */
static void test_ref_single_visible(void **state)
{
    (void)state;
    const size_t B = 1, T = 11, C = 4, H = 2, s = 4;
    rng r = {2};
    double *q = randd(&r, T * C, 5), *k = randd(&r, T * C, 500), *v = randd(&r, T * C, 1);
    double *y = xmalloc(T * C * sizeof *y);
    float *dense = randf(&r, T * T, 250), *conv = randf(&r, H * (2 * s - 1), 250);
    uint8_t mask[11 * 11];
    size_t pick[11];
    for (size_t t = 0; t < T; t++) {
        /* inside the conv window for the conv case: t' = t +- up to 3 */
        pick[t] = t < 3 ? t + (size_t)(rng_next(&r) % 4) : t - (size_t)(rng_next(&r) % 4);
        for (size_t t2 = 0; t2 < T; t2++) mask[t * T + t2] = t2 == pick[t];
    }
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    bias.mask = mask;
    for (int variant = 0; variant < 2; variant++) {
        aft_config cfg;
        if (variant == 0) {
            bias.kind = AFT_BIAS_DENSE;
            bias.dense = dense;
            bias.tmax = T;
            cfg = make_cfg(AFT_FULL, 0, 0, 0);
        } else {
            bias.kind = AFT_BIAS_CONV;
            bias.conv = conv;
            cfg = make_cfg(AFT_CONV, s, H, 0);
        }
        assert_int_equal(ref_aft_op_d(y, q, k, v, &bias, &cfg, B, T, C, C), 0);
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < C; c++) {
                double want = ref_sigmoid(q[t * C + c]) * v[pick[t] * C + c];
                assert_true(fabs(y[t * C + c] - want) <= 1e-15);
            }
    }
    free(q);
    free(k);
    free(v);
    free(y);
    free(dense);
    free(conv);
}

/* full with a constant bias equals simple (the constant cancels), causal or
 * not, with a mask or not */
static void test_ref_constant_bias_is_simple(void **state)
{
    (void)state;
    const size_t B = 2, T = 13, C = 3;
    rng r = {3};
    double *q = randd(&r, B * T * C, 2), *k = randd(&r, B * T * C, 4), *v = randd(&r, B * T * C, 1);
    double *y1 = xmalloc(B * T * C * sizeof *y1), *y2 = xmalloc(B * T * C * sizeof *y2);
    float dense[13 * 13];
    for (size_t i = 0; i < T * T; i++) dense[i] = 3.25f;
    uint8_t *mask = make_mask(&r, B, T);
    for (int causal = 0; causal <= 1; causal++)
        for (int masked = 0; masked <= 1; masked++) {
            aft_bias b1, b2;
            memset(&b1, 0, sizeof b1);
            b1.kind = AFT_BIAS_DENSE;
            b1.dense = dense;
            b1.tmax = T;
            b1.mask = masked ? mask : NULL;
            b1.mask_batched = 1;
            b2 = b1;
            b2.kind = AFT_BIAS_NONE;
            aft_config full = make_cfg(AFT_FULL, 0, 0, causal), simple = make_cfg(AFT_SIMPLE, 0, 0, causal);
            assert_int_equal(ref_aft_op_d(y1, q, k, v, &b1, &full, B, T, C, C), 0);
            assert_int_equal(ref_aft_op_d(y2, q, k, v, &b2, &simple, B, T, C, C), 0);
            assert_true(max_abs_diff(y1, y2, B * T * C) < 1e-14);
        }
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
    free(mask);
}

/* local(s) on a dense bias equals full on the same bias with the entries at
 * |t - t'| >= s set to 0; s >= T is full itself; s = 0 is simple */
static void test_ref_local_is_banded_full(void **state)
{
    (void)state;
    const size_t B = 1, T = 12, C = 5;
    rng r = {4};
    double *q = randd(&r, T * C, 2), *k = randd(&r, T * C, 4), *v = randd(&r, T * C, 1);
    double *y1 = xmalloc(T * C * sizeof *y1), *y2 = xmalloc(T * C * sizeof *y2);
    float *dense = randf(&r, T * T, 3), *band = xmalloc(T * T * sizeof *band);
    const size_t windows[] = {1, 3, 11, 12, 40};
    for (int causal = 0; causal <= 1; causal++)
        for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
            size_t s = windows[wi];
            for (size_t t = 0; t < T; t++)
                for (size_t t2 = 0; t2 < T; t2++)
                    band[t * T + t2] = (t > t2 ? t - t2 : t2 - t) < s ? dense[t * T + t2] : 0.0f;
            aft_bias b1, b2;
            memset(&b1, 0, sizeof b1);
            b1.kind = AFT_BIAS_DENSE;
            b1.dense = dense;
            b1.tmax = T;
            b2 = b1;
            b2.dense = band;
            aft_config local = make_cfg(AFT_LOCAL, s, 0, causal), full = make_cfg(AFT_FULL, 0, 0, causal);
            assert_int_equal(ref_aft_op_d(y1, q, k, v, &b1, &local, B, T, C, C), 0);
            assert_int_equal(ref_aft_op_d(y2, q, k, v, &b2, &full, B, T, C, C), 0);
            assert_true(max_abs_diff(y1, y2, T * C) < 1e-14);
            if (s >= T) {
                assert_int_equal(ref_aft_op_d(y2, q, k, v, &b1, &full, B, T, C, C), 0);
                assert_true(max_abs_diff(y1, y2, T * C) < 1e-14);
            }
        }
    /* window 0: no band, the simple variant */
    aft_bias b0;
    memset(&b0, 0, sizeof b0);
    b0.kind = AFT_BIAS_DENSE;
    b0.dense = dense;
    b0.tmax = T;
    aft_config local0 = make_cfg(AFT_LOCAL, 0, 0, 0), simple = make_cfg(AFT_SIMPLE, 0, 0, 0);
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &b0, &local0, B, T, C, C), 0);
    assert_int_equal(ref_aft_op_d(y2, q, k, v, &b0, &simple, B, T, C, C), 0);
    assert_true(max_abs_diff(y1, y2, T * C) < 1e-14);
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
    free(dense);
    free(band);
}

/* conv with kc == heads equals conv with each head's key copied to all of
 * its channels */
static void test_ref_conv_shared_keys(void **state)
{
    (void)state;
    const size_t B = 2, T = 10, C = 12, H = 4, s = 3, per = C / H;
    rng r = {5};
    double *q = randd(&r, B * T * C, 2), *kh = randd(&r, B * T * H, 4), *v = randd(&r, B * T * C, 1);
    double *kx = xmalloc(B * T * C * sizeof *kx);
    for (size_t i = 0; i < B * T; i++)
        for (size_t c = 0; c < C; c++) kx[i * C + c] = kh[i * H + c / per];
    double *y1 = xmalloc(B * T * C * sizeof *y1), *y2 = xmalloc(B * T * C * sizeof *y2);
    float *conv = randf(&r, H * (2 * s - 1), 2);
    aft_bias bias;
    memset(&bias, 0, sizeof bias);
    bias.kind = AFT_BIAS_CONV;
    bias.conv = conv;
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_CONV, s, H, causal);
        assert_int_equal(ref_aft_op_d(y1, q, kh, v, &bias, &cfg, B, T, C, H), 0);
        assert_int_equal(ref_aft_op_d(y2, q, kx, v, &bias, &cfg, B, T, C, C), 0);
        assert_true(max_abs_diff(y1, y2, B * T * C) < 1e-15);
    }
    free(q);
    free(kh);
    free(kx);
    free(v);
    free(y1);
    free(y2);
    free(conv);
}

/* conv on head h equals full, on that head's channels, with the Toeplitz
 * dense bias w[t,t'] = conv[h][t' - t + s - 1] inside the window, 0 outside */
static void test_ref_conv_is_toeplitz_full(void **state)
{
    (void)state;
    const size_t B = 1, T = 9, C = 6, H = 3, per = C / H;
    rng r = {6};
    double *q = randd(&r, T * C, 2), *k = randd(&r, T * C, 4), *v = randd(&r, T * C, 1);
    double *y = xmalloc(T * C * sizeof *y), *yh = xmalloc(T * per * sizeof *yh);
    double *qh = xmalloc(T * per * sizeof *qh), *kh = xmalloc(T * per * sizeof *kh),
           *vh = xmalloc(T * per * sizeof *vh);
    float dense[9 * 9];
    const size_t windows[] = {1, 2, 5, 9, 14};
    for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
        size_t s = windows[wi];
        float *conv = randf(&r, H * (2 * s - 1), 2);
        aft_bias cb;
        memset(&cb, 0, sizeof cb);
        cb.kind = AFT_BIAS_CONV;
        cb.conv = conv;
        aft_config cfg = make_cfg(AFT_CONV, s, H, (int)(wi & 1));
        assert_int_equal(ref_aft_op_d(y, q, k, v, &cb, &cfg, B, T, C, C), 0);
        for (size_t h = 0; h < H; h++) {
            for (size_t t = 0; t < T; t++) {
                for (size_t t2 = 0; t2 < T; t2++) {
                    long off = (long)t2 - (long)t;
                    dense[t * T + t2] = labs(off) < (long)s ? conv[h * (2 * s - 1) + (size_t)(off + (long)s - 1)] : 0.0f;
                }
                for (size_t j = 0; j < per; j++) {
                    qh[t * per + j] = q[t * C + h * per + j];
                    kh[t * per + j] = k[t * C + h * per + j];
                    vh[t * per + j] = v[t * C + h * per + j];
                }
            }
            aft_bias db;
            memset(&db, 0, sizeof db);
            db.kind = AFT_BIAS_DENSE;
            db.dense = dense;
            db.tmax = T;
            aft_config full = make_cfg(AFT_FULL, 0, 0, cfg.causal);
            assert_int_equal(ref_aft_op_d(yh, qh, kh, vh, &db, &full, B, T, per, per), 0);
            for (size_t t = 0; t < T; t++)
                for (size_t j = 0; j < per; j++)
                    assert_true(fabs(yh[t * per + j] - y[t * C + h * per + j]) < 1e-15);
        }
        free(conv);
    }
    free(q);
    free(k);
    free(v);
    free(y);
    free(yh);
    free(qh);
    free(kh);
    free(vh);
}

/* causal equals a lower-triangular mask; a batched mask equals running each
 * batch alone with its slice as a shared mask */
static void test_ref_masks(void **state)
{
    (void)state;
    const size_t B = 3, T = 8, C = 2, n = B * T * C;
    rng r = {7};
    double *q = randd(&r, n, 2), *k = randd(&r, n, 4), *v = randd(&r, n, 1);
    double *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    float *dense = randf(&r, T * T, 2);
    uint8_t tril[8 * 8];
    for (size_t t = 0; t < T; t++)
        for (size_t t2 = 0; t2 < T; t2++) tril[t * T + t2] = t2 <= t;
    aft_bias bias = dense_bias(dense, T);
    aft_config causal = make_cfg(AFT_FULL, 0, 0, 1), plain = make_cfg(AFT_FULL, 0, 0, 0);
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &bias, &causal, B, T, C, C), 0);
    bias.mask = tril;
    assert_int_equal(ref_aft_op_d(y2, q, k, v, &bias, &plain, B, T, C, C), 0);
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);

    uint8_t *mask = make_mask(&r, B, T);
    bias.mask = mask;
    bias.mask_batched = 1;
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &bias, &causal, B, T, C, C), 0);
    for (size_t b = 0; b < B; b++) {
        aft_bias one = bias;
        one.mask = mask + b * T * T;
        one.mask_batched = 0;
        size_t o = b * T * C;
        assert_int_equal(ref_aft_op_d(y2 + o, q + o, k + o, v + o, &one, &causal, 1, T, C, C), 0);
    }
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    /* rows the mask empties ((t + b) % 5 == 2) are exactly zero */
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            if ((t + b) % 5 == 2)
                for (size_t c = 0; c < C; c++) assert_true(y1[(b * T + t) * C + c] == 0.0);
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
    free(dense);
    free(mask);
}

/* Y does not change when a constant is added to all keys of a channel: with
 * +700 an unshifted exp would overflow double, so this checks the max
 * subtraction. Same for the extreme one-huge-key pattern against its closed
 * form on the causal rows before the huge key. */
static void test_ref_shift_invariance(void **state)
{
    (void)state;
    const size_t B = 1, T = 15, C = 3, n = T * C;
    rng r = {8};
    double *q = randd(&r, n, 2), *k = randd(&r, n, 4), *v = randd(&r, n, 1);
    double *k2 = xmalloc(n * sizeof *k2), *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    float *dense = randf(&r, T * T, 250);
    aft_bias bias = dense_bias(dense, T);
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_FULL, 0, 0, causal);
        for (size_t i = 0; i < n; i++) k2[i] = k[i] + (i % C == 1 ? 700.0 : -700.0);
        assert_int_equal(ref_aft_op_d(y1, q, k, v, &bias, &cfg, B, T, C, C), 0);
        assert_int_equal(ref_aft_op_d(y2, q, k2, v, &bias, &cfg, B, T, C, C), 0);
        assert_true(max_abs_diff(y1, y2, n) < 1e-12);
    }
    /* one key +500 at t0, the rest -500, zero bias, causal: rows t < t0 are
     * the plain mean of v over t' <= t, rows t >= t0 are v[t0] (to e^-1000) */
    const size_t t0 = 10;
    for (size_t i = 0; i < n; i++) k2[i] = i / C == t0 ? 500.0 : -500.0;
    bias.kind = AFT_BIAS_NONE;
    aft_config cfg = make_cfg(AFT_SIMPLE, 0, 0, 1);
    assert_int_equal(ref_aft_op_d(y1, q, k2, v, &bias, &cfg, B, T, C, C), 0);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < C; c++) {
            double mean = 0;
            for (size_t t2 = 0; t2 <= t; t2++) mean += v[t2 * C + c];
            mean /= (double)(t + 1);
            double want = ref_sigmoid(q[t * C + c]) * (t < t0 ? mean : v[t0 * C + c]);
            assert_true(fabs(y1[t * C + c] - want) < 1e-14);
        }
    free(q);
    free(k);
    free(v);
    free(k2);
    free(y1);
    free(y2);
    free(dense);
}

/* factored (u, v on a 2^-4 grid, so U V^T is exact in float) and seeded
 * biases equal the dense matrices they describe */
static void test_ref_factored_seeded_are_dense(void **state)
{
    (void)state;
    const size_t B = 2, T = 10, C = 3, n = B * T * C, tmax = 12, rank = 3;
    rng r = {9};
    double *q = randd(&r, n, 2), *k = randd(&r, n, 4), *v = randd(&r, n, 1);
    double *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    float u[12 * 3], vv[12 * 3], dense[12 * 12];
    for (size_t i = 0; i < tmax * rank; i++) {
        u[i] = on_grid(2 * rng_sym(&r), 0x1p-4);
        vv[i] = on_grid(2 * rng_sym(&r), 0x1p-4);
    }
    for (size_t t = 0; t < tmax; t++)
        for (size_t t2 = 0; t2 < tmax; t2++) {
            float s = 0;
            for (size_t j = 0; j < rank; j++) s += u[t * rank + j] * vv[t2 * rank + j];
            dense[t * tmax + t2] = s;
        }
    aft_bias fb, db, sb;
    memset(&fb, 0, sizeof fb);
    db = sb = fb;
    fb.kind = AFT_BIAS_FACTORED;
    fb.u = u;
    fb.v = vv;
    fb.rank = rank;
    fb.tmax = tmax;
    db.kind = AFT_BIAS_DENSE;
    db.dense = dense;
    db.tmax = tmax;
    for (int causal = 0; causal <= 1; causal++) {
        aft_config cfg = make_cfg(AFT_FULL, 0, 0, causal);
        assert_int_equal(ref_aft_op_d(y1, q, k, v, &fb, &cfg, B, T, C, C), 0);
        assert_int_equal(ref_aft_op_d(y2, q, k, v, &db, &cfg, B, T, C, C), 0);
        assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    }
    sb.kind = AFT_BIAS_SEEDED;
    sb.seed = 12345;
    sb.scale = 3.0f;
    for (size_t t = 0; t < tmax; t++)
        for (size_t t2 = 0; t2 < tmax; t2++)
            dense[t * tmax + t2] = aft_seeded_bias(sb.seed, sb.scale, t, t2);
    aft_config cfg = make_cfg(AFT_LOCAL, 4, 0, 1);
    assert_int_equal(ref_aft_op_d(y1, q, k, v, &sb, &cfg, B, T, C, C), 0);
    assert_int_equal(ref_aft_op_d(y2, q, k, v, &db, &cfg, B, T, C, C), 0);
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    free(q);
    free(k);
    free(v);
    free(y1);
    free(y2);
}

/* the layer reference with identity projections and no biases is the op on
 * Q = K = V = x; output biases add to every row */
static void test_ref_layer_identity(void **state)
{
    (void)state;
    const size_t B = 2, T = 7, D = 5, n = B * T * D;
    rng r = {10};
    float *x = randf(&r, n, 2), eye[5 * 5], bo[5];
    for (size_t i = 0; i < D * D; i++) eye[i] = i / D == i % D ? 1.0f : 0.0f;
    for (size_t i = 0; i < D; i++) bo[i] = (float)(i + 1) * 0.5f;
    double *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    aft_params p;
    memset(&p, 0, sizeof p);
    p.d_model = p.d_hidden = p.k_out = D;
    p.wq = p.wk = p.wv = p.wo = eye;
    p.bias.kind = AFT_BIAS_SEEDED;
    p.bias.seed = 77;
    p.bias.scale = 1.5f;
    aft_config cfg = make_cfg(AFT_FULL, 0, 0, 1);
    assert_int_equal(ref_aft_layer(y1, x, &p, &cfg, B, T), 0);
    assert_int_equal(ref_aft_op(y2, x, x, x, &p.bias, &cfg, B, T, D, D), 0);
    assert_true(max_abs_diff(y1, y2, n) < 1e-15);
    p.bo = bo;
    assert_int_equal(ref_aft_layer(y1, x, &p, &cfg, B, T), 0);
    for (size_t i = 0; i < n; i++) assert_true(fabs(y1[i] - y2[i] - bo[i % D]) < 1e-15);
    free(x);
    free(y1);
    free(y2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_simple_closed_form),
        cmocka_unit_test(test_ref_single_visible),
        cmocka_unit_test(test_ref_constant_bias_is_simple),
        cmocka_unit_test(test_ref_local_is_banded_full),
        cmocka_unit_test(test_ref_conv_shared_keys),
        cmocka_unit_test(test_ref_conv_is_toeplitz_full),
        cmocka_unit_test(test_ref_masks),
        cmocka_unit_test(test_ref_shift_invariance),
        cmocka_unit_test(test_ref_factored_seeded_are_dense),
        cmocka_unit_test(test_ref_layer_identity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
