/* fuzz_model.c - libFuzzer target for the model loader: a parsed
 * .safetensors handle handed to aft_model_load (the window from the file,
 * and asked for), then, when it loads, a forward over a few tokens, a model
 * state stepped through them, a generation of a few tokens, tokenizing, and
 * aft_model_free.
 *
 * Whatever the file holds, loading either fails with a proper one-line
 * message, or gives a model whose sizes agree with what aft.h promises and
 * which runs: the arrays behind it are all read by the forward, so a size
 * mix-up shows as a sanitizer report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "fuzz_check.h"

/* a model's work is O(tensors): keep inputs whose products stay small */
static int small(const aft_model_info *in)
{
    return in->d_model <= 256 && in->d_hidden <= 256 && in->d_ff <= 1024 && in->n_vocab <= 1024 &&
           in->n_layers <= 8;
}

static void run(const aft_model *m, const aft_st_file *f)
{
    const aft_model_info *in = aft_model_get_info(m);
    FUZZ_REQUIRE(in->n_unused <= aft_st_count(f) && (in->n_unused == 0) == (in->unused == NULL));
    if (in->unused) fuzz_check_shown(in->unused, 160);
    FUZZ_REQUIRE(in->n_layers >= 1 && in->d_model >= 1 && in->n_vocab >= 1 && in->d_ff >= 1);
    FUZZ_REQUIRE(in->context >= 1);
    FUZZ_REQUIRE(in->context == SIZE_MAX ? in->keep == SIZE_MAX : in->keep == in->context / 2);
    FUZZ_REQUIRE(in->variant == AFT_LOCAL || in->variant == AFT_FULL || in->variant == AFT_CONV ||
                 in->variant == AFT_SIMPLE);
    if (!small(in)) return;
    size_t T = in->context < 5 ? in->context : 5, B = 2, V = in->n_vocab;
    int32_t tok[10];
    for (size_t i = 0; i < B * T; i++) tok[i] = (int32_t)(i * 7 % V);
    float *lg = malloc(B * 8 * V * sizeof *lg);
    FUZZ_REQUIRE(lg != NULL);
    aft_error err;
    memset(&err, 0, sizeof err);
    if (aft_model_forward(m, lg, tok, B, T, &err) == AFT_OK) {
        for (size_t i = 0; i < B * T * V; i++) fuzz_float_sink = lg[i];
    } else {
        fuzz_check_error(&err);
    }
    aft_model_state *s;
    if (aft_model_state_new(&s, m, B, &err) == AFT_OK) {
        /* one token at a time, past the context when it is short */
        for (size_t t = 0; t < 8; t++) {
            int32_t two[2] = {tok[t % T], tok[T + t % T]};
            if (aft_model_step(s, lg, two, 1, 1, &err) != AFT_OK) {
                fuzz_check_error(&err);
                break;
            }
            FUZZ_REQUIRE(aft_model_state_fed(s) == t + 1);
            FUZZ_REQUIRE(aft_model_state_context(s) <= in->context);
        }
        aft_model_state_free(s);
    } else {
        fuzz_check_error(&err);
    }
    int32_t out[4];
    size_t made = 0;
    aft_sampling smp = {0.7f, 3, 1};
    if (aft_model_generate(m, out, &made, tok, T, 4, &smp, NULL, NULL, &err) == AFT_OK) {
        FUZZ_REQUIRE(made == 4);
        for (size_t i = 0; i < made; i++) FUZZ_REQUIRE(out[i] >= 0 && (size_t)out[i] < V);
    } else {
        fuzz_check_error(&err);
    }
    int32_t *ids;
    size_t n;
    if (aft_model_tokenize(m, &ids, &n, "It is \xc3\xa9", 8, &err) == AFT_OK) {
        FUZZ_REQUIRE(in->has_vocab && n <= 8);
        for (size_t i = 0; i < n; i++) FUZZ_REQUIRE(aft_model_token(m, (size_t)ids[i]) != NULL);
        free(ids);
    } else {
        fuzz_check_error(&err);
    }
    free(lg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    aft_st_file *f;
    aft_error err;
    if (aft_st_open_mem(data, size, &f, &err) != AFT_OK) return 0;
    static const size_t windows[] = {0, 3};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        aft_model_options o = {.window = windows[i], .threads = 1};
        aft_model *m;
        memset(&err, 0, sizeof err);
        if (aft_model_load(&m, f, &o, &err) == AFT_OK) {
            run(m, f);
            aft_model_free(m);
        } else {
            FUZZ_REQUIRE(m == NULL);
            fuzz_check_error(&err);
        }
    }
    aft_st_close(f);
    return 0;
}
