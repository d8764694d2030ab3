/* test_model.c - the binding interface's language model (lib/api/model.c),
 * on the model aft ships (testdata/model/):
 *  - its sizes; logits of [B, T] tokens byte for byte as aft model writes
 *    them with as many threads (one, the default, and two);
 *  - text encoded as aft encode encodes it, the count past cap, tokens'
 *    text as aft decode;
 *  - generate, greedy and sampled (temperature, top-k, seed), gives the
 *    text aft generate prints after its prompt with the same arguments;
 *    the bytes it needs past cap, cut to cap;
 *  - the refusals: options, a file not there (named), tokens outside the
 *    vocabulary or past the context, an empty prompt, a prompt outside the
 *    vocabulary, a bad temperature, NULLs. */
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
#include "files.h"

static aft_api_model *model;

static const char *weights(void)
{
    return files_fixture("model", "labml_aft_fortunes.safetensors");
}

static int setup(void **state)
{
    (void)state;
    aft_error err;
    return aft_api_model_open(&model, weights(), NULL, &err) == AFT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    aft_api_model_free(model);
    return aftrun_cleanup(state);
}

static void test_dims(void **state)
{
    (void)state;
    size_t V, D, L;
    aft_api_model_dims(model, &V, &D, &L);
    assert_int_equal(V, 113);
    assert_int_equal(D, 128);
    assert_int_equal(L, 256);
    aft_api_model_dims(NULL, &V, &D, &L);
    assert_int_equal(V + D + L, 0);
}

/* logits of tokens against aft model's with as many threads (the
 * products' sums are split by the threads: the last bits follow them) */
static void logits_against_cli(aft_api_model *m, const char *threads, const aft_tensor *t, const char *tokens)
{
    size_t B = t->shape[0], T = t->shape[1], V = 113;
    float *logits = malloc(B * T * V * sizeof(float));
    aft_error err;
    assert_int_equal(aft_api_model_logits(m, logits, t->data, B, T, &err), AFT_OK);
    assert_int_equal(AFTRUN(NULL, "model", "--weights", weights(), "--threads", threads, "-o",
                            aftrun_tmp("logits.npy"), tokens), 0);
    aftrun_same_npy(logits, B * T * V, aftrun_tmp("logits.npy"));
    free(logits);
}

static void test_logits(void **state)
{
    (void)state;
    const char *tokens = files_fixture("model", "bt_tokens.npy");
    aft_tensor t;
    aft_error err;
    assert_int_equal(aft_npy_read(tokens, &t, NULL, &err), AFT_OK);   /* int32 (3, 100) */
    logits_against_cli(model, "1", &t, tokens);   /* one thread unless asked */
    aft_api_model *two;
    assert_int_equal(aft_api_model_open(&two, weights(), "threads=2", &err), AFT_OK);
    logits_against_cli(two, "2", &t, tokens);
    aft_api_model_free(two);
    aft_tensor_free(&t);
}

static void test_encode(void **state)
{
    (void)state;
    const char *text = "It is a truth universally acknowledged.\n";
    int32_t ids[64];
    size_t n;
    aft_error err;
    assert_int_equal(aft_api_model_encode(model, ids, 64, &n, text, strlen(text), &err), AFT_OK);
    assert_int_equal(AFTRUN(NULL, "encode", "--weights", weights(), "-o", aftrun_tmp("ids.npy"), text), 0);
    aft_tensor t;
    assert_int_equal(aft_npy_read(aftrun_tmp("ids.npy"), &t, NULL, &err), AFT_OK);
    assert_int_equal(t.nelem, n);
    assert_memory_equal(t.data, ids, n * sizeof(int32_t));
    aft_tensor_free(&t);
    /* the text back from the tokens' */
    char back[128] = "";
    for (size_t i = 0; i < n; i++) strcat(back, aft_api_model_token(model, (size_t)ids[i]));
    assert_string_equal(back, text);
    assert_null(aft_api_model_token(model, 113));
    assert_null(aft_api_model_token(NULL, 0));
    /* past cap: the count, the first cap ids */
    int32_t few[4] = {-1, -1, -1, -1};
    size_t m;
    assert_int_equal(aft_api_model_encode(model, few, 3, &m, text, strlen(text), &err), AFT_OK);
    assert_int_equal(m, n);
    assert_memory_equal(few, ids, 3 * sizeof(int32_t));
    assert_int_equal(few[3], -1);
    assert_int_equal(aft_api_model_encode(model, NULL, 0, &m, text, strlen(text), &err), AFT_OK);
    assert_int_equal(m, n);
    /* a character outside the vocabulary: named, with its offset */
    assert_int_equal(aft_api_model_encode(model, ids, 64, &m, "ok \x01", 4, &err), AFT_ERR_ARG);
    assert_null(strchr(err.msg, '\n'));
    assert_non_null(strstr(err.msg, "3"));
}

/* aft generate's stdout: the prompt, the text, a newline when it ends without */
static void against_cli(const char *prompt, size_t n, double temperature, size_t top_k, uint64_t seed)
{
    char out[4096];
    size_t len;
    aft_error err;
    assert_int_equal(aft_api_model_generate(model, out, sizeof out, &len, prompt, n, temperature, top_k, seed, &err),
                     AFT_OK);
    assert_int_equal(len, strlen(out) + 1);
    char ns[32], ts[32], ks[32], ss[32];
    snprintf(ns, sizeof ns, "%zu", n), snprintf(ts, sizeof ts, "%g", temperature);
    snprintf(ks, sizeof ks, "%zu", top_k), snprintf(ss, sizeof ss, "%llu", (unsigned long long)seed);
    const char *txt = aftrun_tmp("gen.txt");
    if (temperature == 0)
        assert_int_equal(AFTRUN(txt, "generate", "--weights", weights(), "--prompt", prompt, "-n", ns, "--greedy"), 0);
    else
        assert_int_equal(AFTRUN(txt, "generate", "--weights", weights(), "--prompt", prompt, "-n", ns,
                                "--temperature", ts, "--top-k", ks, "--seed", ss), 0);
    size_t got;
    char *cli = (char *)files_slurp(txt, &got);
    char want[8192];
    size_t wl = (size_t)snprintf(want, sizeof want, "%s%s", prompt, out);
    if (want[wl - 1] != '\n') want[wl++] = '\n';
    want[wl] = 0;
    assert_int_equal(got, wl);
    assert_string_equal(cli, want);
    free(cli);
}

static void test_generate(void **state)
{
    (void)state;
    against_cli("It is ", 60, 0.0, 0, 0);
    against_cli("The computer ", 40, 0.8, 5, 7);
    against_cli("Q", 30, 1.5, 0, 123456789);
    /* greedy: the text PyTorch gives (testdata/model/greedy.json's first run) */
    char out[512];
    size_t len;
    aft_error err;
    assert_int_equal(aft_api_model_generate(model, out, sizeof out, &len, "It is ", 20, 0.0, 0, 0, &err), AFT_OK);
    assert_string_equal(out, "the start of the sta");
    /* cut to cap; *len the whole text's bytes with its NUL */
    char small[8] = "xxxxxxx";
    assert_int_equal(aft_api_model_generate(model, small, sizeof small, &len, "It is ", 20, 0.0, 0, 0, &err), AFT_OK);
    assert_int_equal(len, 21);
    assert_string_equal(small, "the sta");
    assert_int_equal(aft_api_model_generate(model, NULL, 0, &len, "It is ", 20, 0.0, 0, 0, &err), AFT_OK);
    assert_int_equal(len, 21);
    assert_int_equal(aft_api_model_generate(model, out, sizeof out, &len, "It is ", 0, 0.0, 0, 0, &err), AFT_OK);
    assert_int_equal(len, 1);
    assert_string_equal(out, "");
}

static void refused(aft_status got, aft_status st, const aft_error *err, const char *want)
{
    assert_int_equal(got, st);
    if (!strstr(err->msg, want)) fail_msg("'%s' lacks '%s'", err->msg, want);
    assert_null(strchr(err->msg, '\n'));
}

static void test_refusals(void **state)
{
    (void)state;
    aft_api_model *m = (aft_api_model *)1;
    aft_error err;
    refused(aft_api_model_open(&m, weights(), "window=0", &err), AFT_ERR_ARG, &err,
            "option window=0: the model's window takes a whole number >= 1");
    assert_null(m);
    refused(aft_api_model_open(&m, weights(), "variant=local", &err), AFT_ERR_ARG, &err,
            "unknown option 'variant' (the model takes window, threads, precision)");
    refused(aft_api_model_open(&m, aftrun_tmp("none.safetensors"), NULL, &err), AFT_ERR_IO, &err,
            "none.safetensors: cannot open");
    refused(aft_api_model_open(&m, files_fixture("torch", "rish_local/weights.safetensors"), NULL, &err),
            AFT_ERR_FORMAT, &err, "rish_local/weights.safetensors: ");
    refused(aft_api_model_open(&m, NULL, NULL, &err), AFT_ERR_ARG, &err, "missing (NULL) path");
    refused(aft_api_model_open(NULL, weights(), NULL, &err), AFT_ERR_ARG, &err, "missing (NULL) out");

    int32_t tokens[300] = {0};
    float *logits = malloc(300 * 113 * sizeof(float));
    tokens[5] = 113;
    refused(aft_api_model_logits(model, logits, tokens, 1, 10, &err), AFT_ERR_ARG, &err,
            "token 113 (sequence 0, position 5) is outside the vocabulary [0, 113)");
    tokens[5] = 0;
    refused(aft_api_model_logits(model, logits, tokens, 1, 257, &err), AFT_ERR_ARG, &err,
            "257 tokens exceed the model's context of 256");
    refused(aft_api_model_logits(model, NULL, tokens, 1, 10, &err), AFT_ERR_ARG, &err, "missing (NULL) logits");
    refused(aft_api_model_logits(model, logits, tokens, SIZE_MAX, 10, &err), AFT_ERR_ARG, &err, "overflows");
    free(logits);

    char out[64];
    size_t len;
    refused(aft_api_model_generate(model, out, 64, &len, "", 5, 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "the prompt needs at least one character");
    refused(aft_api_model_generate(model, out, 64, &len, "ok \x01", 5, 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "prompt: ");
    refused(aft_api_model_generate(model, out, 64, &len, "ok", 5, -1.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "temperature takes a number >= 0");
    refused(aft_api_model_generate(model, out, 64, &len, "ok", 5, 0.0 / 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "temperature takes a number >= 0");
    refused(aft_api_model_generate(model, out, 64, &len, "ok", 2000000000, 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "n takes a whole number from 0 to 1000000000");
    refused(aft_api_model_generate(model, out, 64, NULL, "ok", 5, 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "missing (NULL) len");
    refused(aft_api_model_generate(model, NULL, 64, &len, "ok", 5, 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "missing (NULL) out");
    refused(aft_api_model_generate(model, out, 64, &len, NULL, 5, 0.0, 0, 0, &err), AFT_ERR_ARG, &err,
            "missing (NULL) prompt");
    refused(aft_api_model_encode(model, NULL, 4, &len, "ok", 2, &err), AFT_ERR_ARG, &err, "missing (NULL) ids");
    refused(aft_api_model_encode(NULL, NULL, 0, &len, "ok", 2, &err), AFT_ERR_ARG, &err, "missing (NULL) model");
    aft_api_model_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dims),     cmocka_unit_test(test_logits),   cmocka_unit_test(test_encode),
        cmocka_unit_test(test_generate), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
