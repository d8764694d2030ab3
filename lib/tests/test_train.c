/* test_train.c - lib/train.c: the schedule, clipping and Adam against their
 * formulas (torch's, written out in double), the vocabulary of a text, a
 * fresh model (loads, runs, has PyTorch's init distributions, every layer
 * equal) and its checkpoint written back. */
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

static void test_schedule(void **state)
{
    (void)state;
    aft_schedule s = {2e-3, 100, 1000, 100};
    assert_true(fabs(aft_schedule_lr(&s, 0) - 2e-5) < 1e-18);
    assert_true(fabs(aft_schedule_lr(&s, 99) - 2e-3) < 1e-18);
    assert_true(fabs(aft_schedule_lr(&s, 100) - 2e-3) < 1e-18);                     /* cos(0): the peak */
    assert_true(fabs(aft_schedule_lr(&s, 550) - 2e-3 * (0.1 + 0.45)) < 1e-15);     /* halfway: cos = 0 */
    assert_true(fabs(aft_schedule_lr(&s, 1000) - 2e-4) < 1e-15);                   /* a tenth at the end */
    aft_schedule none = {1e-3, 0, 10, 1};
    assert_true(fabs(aft_schedule_lr(&none, 0) - 1e-3) < 1e-18);
}

static void test_clip(void **state)
{
    (void)state;
    float a[2] = {3, 0}, b[1] = {4};
    float *g[2] = {a, b};
    size_t len[2] = {2, 1};
    double n = aft_clip_grad_norm(g, len, 2, 1.0);
    assert_true(fabs(n - 5.0) < 1e-6);
    /* scaled by 1 / (5 + 1e-6), as torch */
    assert_true(fabs(a[0] - 3.0 / (5.0 + 1e-6)) < 1e-6 && fabs(b[0] - 4.0 / (5.0 + 1e-6)) < 1e-6);
    float c[1] = {0.5f};
    float *h[1] = {c};
    size_t l1 = 1;
    assert_true(fabs(aft_clip_grad_norm(h, &l1, 1, 1.0) - 0.5) < 1e-7);
    assert_true(c[0] == 0.5f);   /* under the norm: unchanged */
    float d[1] = {NAN};
    float *k[1] = {d};
    assert_true(isnan(aft_clip_grad_norm(k, &l1, 1, 1.0)));
}

static void test_adam(void **state)
{
    (void)state;
    size_t len[2] = {3, 1};
    aft_adam *a;
    aft_error err;
    assert_int_equal(aft_adam_new(&a, len, 2, 0.9, 0.98, 1e-9, &err), AFT_OK);
    float p0[3] = {1, -2, 0.5f}, p1[1] = {0};
    float *p[2] = {p0, p1};
    double P[4] = {1, -2, 0.5, 0}, M[4] = {0}, V[4] = {0};
    for (int t = 1; t <= 5; t++) {
        float g0[3] = {0.1f * t, -0.3f, 1e-3f}, g1[1] = {t % 2 ? 2.0f : -2.0f};
        const float *g[2] = {g0, g1};
        double lr[2] = {1e-2, 1.0};
        aft_adam_step(a, p, g, lr);
        const float *gs[4] = {&g0[0], &g0[1], &g0[2], &g1[0]};
        for (int i = 0; i < 4; i++) {
            double gi = *gs[i], l = i < 3 ? 1e-2 : 1.0;
            M[i] = 0.9 * M[i] + 0.1 * gi;
            V[i] = 0.98 * V[i] + 0.02 * gi * gi;
            P[i] -= l / (1 - pow(0.9, t)) * M[i] / (sqrt(V[i]) / sqrt(1 - pow(0.98, t)) + 1e-9);
        }
        const float got[4] = {p0[0], p0[1], p0[2], p1[0]};
        for (int i = 0; i < 4; i++)
            if (fabs(got[i] - P[i]) > 1e-6 * fmax(1, fabs(P[i]))) fail_msg("step %d, %d: %.9g, %.9g", t, i, got[i], P[i]);
    }
    assert_int_equal(aft_adam_steps(a), 5);
    assert_true(fabs(aft_adam_moment(a, 1, 0)[0] - M[3]) < 1e-6);
    assert_true(fabs(aft_adam_moment(a, 0, 1)[1] - V[1]) < 1e-7);
    assert_null(aft_adam_moment(a, 2, 0));
    aft_adam_free(a);
}

static void test_vocab(void **state)
{
    (void)state;
    char *json;
    size_t n;
    aft_error err;
    const char *text = "b\xc3\xa9" "a\nb a";   /* b, e-acute, a, newline, b, space, a */
    assert_int_equal(aft_train_vocab(&json, &n, text, strlen(text), &err), AFT_OK);
    assert_int_equal(n, 5);
    assert_string_equal(json, "[\"\\n\",\" \",\"a\",\"b\",\"\xc3\xa9\"]");   /* by code point, as Python sorts */
    free(json);
    assert_int_equal(aft_train_vocab(&json, &n, "", 0, &err), AFT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "empty"));
    assert_int_equal(aft_train_vocab(&json, &n, "ab\xff", 3, &err), AFT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "at byte 2"));
    assert_int_equal(aft_train_vocab(&json, &n, "a\0b", 3, &err), AFT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "NUL byte at byte 1"));
}

static void test_fresh(void **state)
{
    (void)state;
    aft_model_config c = {.n_layers = 3, .d_model = 8, .d_ff = 16, .window = 3, .seq_len = 12, .positions = 20,
                          .n_vocab = 4, .vocab = "[\"a\",\"b\",\"c\",\"d\"]"};
    void *buf;
    size_t len;
    aft_error err;
    assert_int_equal(aft_train_fresh(&buf, &len, &c, 42, &err), AFT_OK);
    aft_st_file *f;
    assert_int_equal(aft_st_open_mem(buf, len, &f, &err), AFT_OK);
    aft_model *m;
    assert_int_equal(aft_model_load(&m, f, NULL, &err), AFT_OK);
    const aft_model_info *in = aft_model_get_info(m);
    assert_int_equal(in->n_layers, 3);
    assert_int_equal(in->window, 3);
    assert_int_equal(in->n_vocab, 4);
    assert_int_equal(in->n_unused, 0);
    /* the state dict's order, as PyTorch's */
    const char *name;
    aft_st_get(f, 0, &name);
    assert_string_equal(name, "src_embed.positional_encodings");
    aft_st_get(f, 2, &name);
    assert_string_equal(name, "encoder.layers.0.self_attn.pos_bias");
    /* PyTorch's distributions: Linear in +-1/sqrt(fan_in), LayerNorm ones, pos_bias zeros */
    const aft_tensor *w1 = aft_st_find(f, "encoder.layers.0.feed_forward.layer2.weight");
    const float *v = w1->data;
    double bound = 1 / sqrt(16.0), mx = 0;
    for (size_t i = 0; i < w1->nelem; i++) mx = fmax(mx, fabs(v[i]));
    assert_true(mx < bound && mx > 0.5 * bound);
    assert_true(((const float *)aft_st_find(f, "encoder.norm.weight")->data)[7] == 1.0f);
    assert_true(((const float *)aft_st_find(f, "encoder.layers.2.self_attn.pos_bias")->data)[5] == 0.0f);
    /* every layer equal, as labml's deep copies */
    const aft_tensor *q0 = aft_st_find(f, "encoder.layers.0.self_attn.query.weight"),
                     *q2 = aft_st_find(f, "encoder.layers.2.self_attn.query.weight");
    assert_memory_equal(q0->data, q2->data, q0->nbytes);
    /* labml's sinusoid: PE[1, 0] = sin(1), PE[1, 1] = cos(1) */
    const float *pe = aft_st_find(f, "src_embed.positional_encodings")->data;
    assert_true(fabs(pe[8] - sin(1.0)) < 1e-6 && fabs(pe[9] - cos(1.0)) < 1e-6);
    /* it runs */
    int32_t tok[5] = {0, 1, 2, 3, 0};
    float logits[5 * 4];
    assert_int_equal(aft_model_forward(m, logits, tok, 1, 5, &err), AFT_OK);
    for (size_t i = 0; i < 20; i++) assert_true(isfinite(logits[i]));
    /* the same seed, the same bytes */
    void *buf2;
    size_t len2;
    assert_int_equal(aft_train_fresh(&buf2, &len2, &c, 42, &err), AFT_OK);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    free(buf2);
    aft_model_free(m);
    aft_st_close(f);
    free(buf);
    c.d_model = 0;
    assert_int_equal(aft_train_fresh(&buf, &len, &c, 1, &err), AFT_ERR_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule), cmocka_unit_test(test_clip),  cmocka_unit_test(test_adam),
        cmocka_unit_test(test_vocab),    cmocka_unit_test(test_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
