/*
 * test_model.c - `aft model`, `aft generate` and `aft bench --generate`
 * through the command line.
 *
 * What is checked, and against what:
 *  - the PyTorch outputs stored beside the shipped checkpoint
 *    (testdata/model): aft model's logits for [T], [B, T] and labml's
 *    [T, B] within 1e-4 x max(1, |logit|), fast and --impl reference; aft
 *    generate --greedy's text, character for character, for every run of
 *    greedy.json (one goes past the context twice);
 *  - the command against itself: sampling reproducible for a seed,
 *    --temperature 0 and --top-k 1 as --greedy, --vocab as the metadata;
 *    the other variants (full, conv, simple) in labml's block structure,
 *    from checkpoints written here, fast against --impl reference;
 *  - --timing's JSON, bench --generate's JSON;
 *  - without --weights, the shipped model: found beside a copy of aft once
 *    testdata/ is there, and both places named when neither holds it;
 *  - errors: a prompt character outside the vocabulary, a missing tensor,
 *    shapes that do not fit, bad tokens (exit 1, one line naming it), usage
 *    errors (exit 2), an -o left untouched by a failed run;
 *  - checkpoints whose layers are not alike (exact one-line refusals), an
 *    optional bias absent from every layer (loads), a tensor the model does
 *    not use (a warning, the same logits; --strict: an error).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aft.h"
#include "cli.h"
#include "checks.h"
#include "harness.h"

/* ------------------------------------------------------------------ helpers */

static char *tmp(const char *name) { return harness_tmp(name); }

/* a file of testdata/model, malloc'd */
static char *shipped(const char *name) { return harness_fmt("%s/model/%s", harness_testdata(), name); }

static char *ckpt(void) { return shipped("labml_aft_fortunes.safetensors"); }

static aft_tensor read_npy(const char *path)
{
    aft_tensor t;
    aft_error err;
    if (aft_npy_read(path, &t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    return t;
}

/* every |a - ref| <= tol * max(1, |ref|), shapes equal */
static void check_logits(const char *what, const char *got_path, const char *ref_path, double tol)
{
    aft_tensor a = read_npy(got_path), b = read_npy(ref_path);
    assert_int_equal(a.dtype, AFT_F32);
    assert_int_equal(a.ndim, b.ndim);
    for (size_t i = 0; i < a.ndim; i++) assert_int_equal(a.shape[i], b.shape[i]);
    const float *x = a.data, *y = b.data;
    double worst = 0.0;
    for (size_t i = 0; i < a.nelem; i++) {
        double r = fabs((double)x[i] - (double)y[i]) / fmax(1.0, fabs((double)y[i]));
        if (!(r <= worst)) worst = r;
    }
    if (!(worst <= tol)) fail_msg("%s: worst |aft - torch| / max(1, |torch|) = %g > %g", what, worst, tol);
    aft_tensor_free(&a);
    aft_tensor_free(&b);
}

/* a run (args) that must fail with status `code` and print nothing on
 * stdout, and on stderr one line (usage errors: and the hint) holding every
 * string of says */
static void expect_failure(int code, const char *const *args, const char *const *says)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != code) fail_msg("aft %s ...: exit %d, not %d; stderr: %s", args[0], r.exit_code, code, r.err);
    size_t lines = harness_count_lines(r.err);
    if (lines != (code == 2 ? 2u : 1u)) fail_msg("aft %s ...: %zu lines on stderr: %s", args[0], lines, r.err);
    assert_int_equal(r.out_len, 0);
    for (; *says; says++)
        if (!strstr(r.err, *says)) fail_msg("aft %s ...: stderr lacks '%s': %s", args[0], *says, r.err);
    char hint[64];
    snprintf(hint, sizeof hint, "Try 'aft %s --help'.", args[0]);
    if (code == 2 && !strstr(r.err, hint)) fail_msg("no hint '%s': %s", hint, r.err);
    if (code != 2 && strncmp(r.err, "aft", 3) != 0) fail_msg("the message does not start with 'aft': %s", r.err);
    harness_result_free(&r);
}
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define SAYS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define FAILS(code, args, says) expect_failure((code), args, says)

/* aft generate's standard output (exit 0, nothing on stderr); malloc'd */
static char *generate(const char *const *args)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != 0 || r.err_len) fail_msg("aft generate: exit %d: %s", r.exit_code, r.err);
    char *out = r.out;
    r.out = NULL;
    harness_result_free(&r);
    return out;
}
#define GENERATE(...) generate((const char *const[]){"generate", __VA_ARGS__, NULL})

/* ------------------------------------------------------------------ against PyTorch */

static void test_logits_vs_torch(void **state)
{
    (void)state;
    char *w = ckpt();
    static const struct { const char *tokens, *logits, *layout, *impl; } cases[] = {
        {"seq_tokens.npy", "seq_logits.npy", "btd", "fast"},        /* [T] */
        {"bt_tokens.npy", "bt_logits.npy", "btd", "fast"},          /* [B, T] */
        {"tb_tokens.npy", "tb_logits.npy", "tbd", "fast"},          /* labml's [T, B] */
        {"bt_tokens.npy", "bt_logits.npy", "btd", "reference"},
        {"tb_tokens.npy", "tb_logits.npy", "tbd", "reference"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *tok = shipped(cases[i].tokens), *ref = shipped(cases[i].logits), *out = tmp("logits.npy");
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, "model", "--weights", w, "--layout", cases[i].layout, "--impl",
                                     cases[i].impl, tok, "-o", out),
                         0);
        if (r.exit_code != 0) fail_msg("aft model %s: %s", cases[i].tokens, r.err);
        assert_int_equal(r.err_len, 0);
        harness_result_free(&r);
        char what[128];
        snprintf(what, sizeof what, "%s (%s, %s)", cases[i].tokens, cases[i].layout, cases[i].impl);
        check_logits(what, out, ref, 1e-4);
        free(tok);
        free(ref);
        free(out);
    }
    /* through a pipe: stdin in, stdout out */
    char *tok = shipped("seq_tokens.npy"), *ref = shipped("seq_logits.npy"), *in, *out = tmp("piped.npy");
    size_t len;
    assert_int_equal(harness_read_file(tok, &in, &len), 0);
    harness_result r;
    assert_int_equal(harness_run(&r, (const char *const[]){"model", "--weights", w, "-", NULL}, in, len), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(harness_write_file(out, r.out, r.out_len), 0);
    check_logits("seq_tokens.npy through a pipe", out, ref, 1e-4);
    harness_result_free(&r);
    free(in);
    free(tok);
    free(ref);
    free(out);
    free(w);
}

static void test_greedy_vs_torch(void **state)
{
    (void)state;
    char *path = shipped("greedy.json"), *text, *w = ckpt();
    assert_int_equal(harness_read_file(path, &text, NULL), 0);
    cJSON *doc = cJSON_Parse(text);
    assert_non_null(doc);
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *run;
    assert_true(cJSON_GetArraySize(runs) >= 3);
    cJSON_ArrayForEach(run, runs) {
        const char *prompt = cJSON_GetObjectItemCaseSensitive(run, "prompt")->valuestring;
        const char *want = cJSON_GetObjectItemCaseSensitive(run, "text")->valuestring;
        int n_new = cJSON_GetObjectItemCaseSensitive(run, "n_new")->valueint;
        /* under AFT_TEST_QUICK the runs within one context (test_timing
         * goes past it) */
        if (harness_quick() && n_new > 200) continue;
        char n[32];
        snprintf(n, sizeof n, "%d", n_new);
        char *got = GENERATE("--weights", w, "--prompt", prompt, "-n", n, "--greedy");
        /* and the newline that ends the text */
        char *expect = harness_fmt("%s%s%s", prompt, want, want[0] && want[strlen(want) - 1] == '\n' ? "" : "\n");
        if (strcmp(got, expect) != 0) fail_msg("greedy from '%s':\n got  %s\n want %s", prompt, got, expect);
        free(got);
        free(expect);
    }
    cJSON_Delete(doc);
    free(text);
    free(path);
    free(w);
}

/* ------------------------------------------------------------------ sampling and timing */

static void test_sampling(void **state)
{
    (void)state;
    char *w = ckpt();
    const char *n = harness_quick() ? "40" : "150";
    char *a = GENERATE("--weights", w, "--prompt", "The ", "-n", n, "--temperature", "0.8", "--seed", "7");
    char *b = GENERATE("--weights", w, "--prompt", "The ", "-n", n, "--temperature", "0.8", "--seed", "7");
    char *c = GENERATE("--weights", w, "--prompt", "The ", "-n", n, "--temperature", "0.8", "--seed", "8");
    assert_string_equal(a, b);   /* reproducible for a seed */
    assert_string_not_equal(a, c);
    assert_true(strncmp(a, "The ", 4) == 0);
    /* n characters of the vocabulary after the prompt (count UTF-8
     * characters), then a newline, unless the last of them was one */
    size_t chars = 0, len = strlen(a), want = 4 + (size_t)atoi(n);
    for (const unsigned char *p = (const unsigned char *)a; *p; p++) chars += (*p & 0xC0) != 0x80;
    assert_true(len > 0 && a[len - 1] == '\n');
    assert_true(chars == want + 1 || chars == want);
    /* the threads change nothing */
    char *d = GENERATE("--weights", w, "--prompt", "The ", "-n", n, "--temperature", "0.8", "--seed", "7",
                       "--threads", "2");
    assert_string_equal(a, d);
    /* the same as greedy: temperature 0, and the top token alone */
    char *g = GENERATE("--weights", w, "--prompt", "The ", "-n", "60", "--greedy");
    char *t0 = GENERATE("--weights", w, "--prompt", "The ", "-n", "60", "--temperature", "0", "--seed", "3");
    char *k1 = GENERATE("--weights", w, "--prompt", "The ", "-n", "60", "--top-k", "1", "--seed", "5");
    assert_string_equal(g, t0);
    assert_string_equal(g, k1);
    /* -n 0: the prompt alone, ended by a newline (a pipe's text too); a
     * prompt that ends with one gets no other */
    char *z = GENERATE("--weights", w, "--prompt", "The ", "-n", "0");
    assert_string_equal(z, "The \n");
    free(z);
    z = GENERATE("--weights", w, "--prompt", "The\n", "-n", "0");
    assert_string_equal(z, "The\n");
    free(a); free(b); free(c); free(d); free(g); free(t0); free(k1); free(z);
    free(w);
}

static double num(const cJSON *j, const char *key)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(f)) fail_msg("JSON field %s missing or not a number", key);
    return f->valuedouble;
}

static void test_timing(void **state)
{
    (void)state;
    char *w = ckpt(), *t = tmp("timing.json");
    char *out = GENERATE("--weights", w, "--prompt", "It is ", "-n", "300", "--greedy", "--threads", "1", "--timing", t);
    char *text;
    assert_int_equal(harness_read_file(t, &text, NULL), 0);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_true(num(j, "prompt_tokens") == 6);
    assert_true(num(j, "generated_tokens") == 300);
    double ttft = num(j, "time_to_first_token_ms"), tps = num(j, "tokens_per_s");
    double gen = num(j, "generate_ms");
    assert_true(ttft > 0 && ttft <= gen);
    assert_true(tps > 0 && fabs(tps - 300 / (gen * 1e-3)) <= 1e-6 * tps);
    assert_true(num(j, "total_ms") >= gen + num(j, "load_ms") - 1e-6);
    assert_true(num(j, "n_layers") == 6 && num(j, "d_model") == 128 && num(j, "n_vocab") == 113);
    assert_true(num(j, "context") == 256 && num(j, "window") == 32 && num(j, "threads") == 1);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "variant")->valuestring, "local");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "sampling");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "greedy")));
    assert_true(num(j, "peak_rss_bytes") > 0);
    cJSON_Delete(j);
    free(text);
    free(out);
    free(t);
    free(w);
}

/* ------------------------------------------------------------------ checkpoints made here */

/* the shipped checkpoint's tensors and metadata, with the tensors named in
 * drops (NULL-terminated, or NULL) left out, tensor `reshape` given shape
 * (d0, d1) (its data cut short), a float32 tensor [4] named `extra` added
 * at the end (NULL: none), and the metadata "vocab" left out when no_vocab;
 * written to path */
static void rewrite_with(const char *path, const char *const *drops, const char *reshape, size_t d0, size_t d1,
                         const char *extra, int no_vocab)
{
    char *w = ckpt();
    aft_st_file *f;
    aft_error err;
    if (aft_st_open(w, &f, &err) != AFT_OK) fail_msg("%s", err.msg);
    size_t n = aft_st_count(f), k = 0, nm = 0;
    const char **names = calloc(n + 1, sizeof *names);
    aft_tensor *ts = calloc(n + 1, sizeof *ts);
    static const float four[4] = {0.5f, -0.25f, 1.0f, 2.0f};
    const char *meta[32];
    assert_non_null(names);
    assert_non_null(ts);
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        int dropped = 0;
        for (size_t d = 0; drops && drops[d]; d++) dropped |= strcmp(name, drops[d]) == 0;
        if (dropped) continue;
        names[k] = name;
        ts[k] = *t;
        ts[k].owned = NULL;
        if (reshape && strcmp(name, reshape) == 0) {
            ts[k].ndim = 2;
            ts[k].shape[0] = d0;
            ts[k].shape[1] = d1;
            ts[k].nelem = d0 * d1;
            ts[k].nbytes = d0 * d1 * aft_dtype_size(t->dtype);
            assert_true(ts[k].nbytes <= t->nbytes);
        }
        k++;
    }
    if (extra) {
        names[k] = extra;
        ts[k++] = harness_tensor(AFT_F32, four, 1, (size_t[]){4});
    }
    for (size_t i = 0; i < aft_st_metadata_count(f) && nm < 30; i++) {
        const char *key, *value;
        aft_st_metadata(f, i, &key, &value);
        if (no_vocab && strcmp(key, "vocab") == 0) continue;
        meta[nm++] = key;
        meta[nm++] = value;
    }
    if (aft_st_write(path, names, ts, k, meta, nm / 2, &err) != AFT_OK) fail_msg("%s", err.msg);
    aft_st_close(f);
    free(names);
    free(ts);
    free(w);
}

static void rewrite(const char *path, const char *drop, const char *reshape, size_t d0, size_t d1, int no_vocab)
{
    const char *drops[2] = {drop, NULL};
    rewrite_with(path, drops, reshape, d0, d1, NULL, no_vocab);
}

/* a small random model of labml's block structure, 2 layers, d 16, d_ff 32,
 * vocabulary 11 ("abcdefghij "), 40 positions; self_attn of the variant */
enum { SD = 16, SF = 32, SV = 11, SP = 40, SC = 24, SH = 2, SS = 5 };
typedef struct {
    const char *names[64];
    char nbuf[64][96];
    aft_tensor t[64];
    float *data[64];
    size_t n;
    uint64_t rng;
} small;

static void add(small *s, const char *name, double scale, size_t ndim, size_t d0, size_t d1, size_t d2)
{
    assert_true(s->n < 64);
    size_t dims[3] = {d0, d1, d2}, n = 1;
    for (size_t i = 0; i < ndim; i++) n *= dims[i];
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) {
        s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)(scale * (2.0 * (double)(s->rng >> 11) * 0x1.0p-53 - 1.0));
    }
    snprintf(s->nbuf[s->n], sizeof s->nbuf[0], "%s", name);
    s->names[s->n] = s->nbuf[s->n];
    s->t[s->n] = harness_tensor(AFT_F32, x, ndim, dims);
    s->data[s->n++] = x;
}

static const char *small_vocab = "[\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\", \"j\", \" \"]";

/* tmax1: the rows of layer 1's full pos_bias (0: layer 0's, SP - 10) */
static void write_small(const char *path, aft_variant v, int with_vocab, size_t tmax1)
{
    small s = {.rng = 42 + (uint64_t)v};
    char n[96];
    add(&s, "src_embed.positional_encodings", 1.0, 3, SP, 1, SD);
    add(&s, "src_embed.linear.weight", 1.0, 2, SV, SD, 0);
    size_t C = v == AFT_LOCAL ? SD : SC, KC = v == AFT_CONV ? SH : C;
    for (int l = 0; l < 2; l++) {
#define ADD(stem, sc, nd, a, b) (snprintf(n, sizeof n, "encoder.layers.%d.%s", l, stem), add(&s, n, sc, nd, a, b, 0))
        size_t tm = l == 1 && tmax1 ? tmax1 : SP - 10;
        if (v == AFT_FULL) ADD("self_attn.pos_bias", 1.0, 2, tm, tm);
        if (v == AFT_CONV) ADD("self_attn.pos_bias", 1.0, 2, SH, 2 * SS - 1);
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
        ADD("feed_forward.layer2.bias", 0.1, 1, SD, 0);
        ADD("norm_self_attn.weight", 1.0, 1, SD, 0);
        ADD("norm_self_attn.bias", 0.2, 1, SD, 0);
        ADD("norm_ff.weight", 1.0, 1, SD, 0);
        ADD("norm_ff.bias", 0.2, 1, SD, 0);
#undef ADD
    }
    add(&s, "encoder.norm.weight", 1.0, 1, SD, 0, 0);
    add(&s, "encoder.norm.bias", 0.2, 1, SD, 0, 0);
    add(&s, "generator.projection.weight", 0.5, 2, SV, SD, 0);
    add(&s, "generator.projection.bias", 0.2, 1, SV, 0, 0);
    const char *meta[2] = {"vocab", small_vocab};
    aft_error err;
    if (aft_st_write(path, s.names, s.t, s.n, meta, with_vocab ? 1 : 0, &err) != AFT_OK) fail_msg("%s", err.msg);
    for (size_t i = 0; i < s.n; i++) free(s.data[i]);
}

static void write_tokens(const char *path, aft_dtype dt, const void *data, size_t ndim, const size_t *shape)
{
    aft_error err;
    aft_tensor t = harness_tensor(dt, data, ndim, shape);
    if (aft_npy_write(path, &t, &err) != AFT_OK) fail_msg("%s", err.msg);
}

/* full, conv and simple in the same block structure: the variant found,
 * fast against --impl reference, and generation (with --vocab where the
 * checkpoint has none) */
static void test_other_variants(void **state)
{
    (void)state;
    const aft_variant vs[] = {AFT_FULL, AFT_CONV, AFT_SIMPLE};
    int32_t tok[2 * 30];
    for (size_t i = 0; i < 60; i++) tok[i] = (int32_t)((i * 7 + 3) % SV);
    char *tp = tmp("small_tokens.npy"), *vocab = tmp("vocab.json");
    write_tokens(tp, AFT_I32, tok, 2, (size_t[]){2, 30});
    assert_int_equal(harness_write_file(vocab, small_vocab, strlen(small_vocab)), 0);
    for (size_t i = 0; i < 3; i++) {
        char *w = tmp("small.safetensors"), *a = tmp("fast.npy"), *b = tmp("ref.npy"), *t = tmp("small_timing.json");
        write_small(w, vs[i], i != 1, 0);
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, "model", "--weights", w, tp, "-o", a), 0);
        if (r.exit_code) fail_msg("%s: %s", aft_variant_name(vs[i]), r.err);
        harness_result_free(&r);
        assert_int_equal(HARNESS_RUN(&r, "model", "--weights", w, tp, "-o", b, "--impl", "reference"), 0);
        assert_int_equal(r.exit_code, 0);
        harness_result_free(&r);
        check_logits(aft_variant_name(vs[i]), a, b, 1e-4);
        /* generation past the context (full: the bias's 30 rows) */
        char *g = i == 1 ? GENERATE("--weights", w, "--vocab", vocab, "--prompt", "abc ", "-n", "100", "--greedy",
                                    "--timing", t)
                         : GENERATE("--weights", w, "--prompt", "abc ", "-n", "100", "--greedy", "--timing", t);
        assert_int_equal(strlen(g), 105);   /* the text and its newline (not in this vocabulary) */
        assert_true(strspn(g, "abcdefghij ") == 104 && g[104] == '\n');
        char *text;
        assert_int_equal(harness_read_file(t, &text, NULL), 0);
        cJSON *j = cJSON_Parse(text);
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "variant")->valuestring, aft_variant_name(vs[i]));
        assert_true(num(j, "context") == (vs[i] == AFT_FULL ? SP - 10 : SP));
        cJSON_Delete(j);
        free(text);
        free(g);
        free(w); free(a); free(b); free(t);
    }
    free(tp);
    free(vocab);
}

/* a checkpoint without the metadata vocab: --vocab gives the same text */
static void test_vocab_file(void **state)
{
    (void)state;
    char *w = ckpt(), *bare = tmp("novocab.safetensors"), *vocab = tmp("vocab113.json");
    rewrite(bare, NULL, NULL, 0, 0, 1);
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(w, &f, &err), AFT_OK);
    for (size_t i = 0; i < aft_st_metadata_count(f); i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        if (strcmp(k, "vocab") == 0) assert_int_equal(harness_write_file(vocab, v, strlen(v)), 0);
    }
    aft_st_close(f);
    FAILS(1, ARGS("generate", "--weights", bare, "--prompt", "It is "), SAYS(bare, "'vocab'", "--vocab"));
    char *a = GENERATE("--weights", w, "--prompt", "It is ", "-n", "80", "--greedy");
    char *b = GENERATE("--weights", bare, "--vocab", vocab, "--prompt", "It is ", "-n", "80", "--greedy");
    assert_string_equal(a, b);
    /* a vocabulary of the wrong size names its file */
    char *small_v = tmp("vocab11.json");
    assert_int_equal(harness_write_file(small_v, small_vocab, strlen(small_vocab)), 0);
    FAILS(1, ARGS("generate", "--weights", w, "--vocab", small_v, "--prompt", "a"), SAYS(small_v, "11 tokens", "113"));
    free(a); free(b); free(w); free(bare); free(vocab); free(small_v);
}

/* ------------------------------------------------------------------ errors */

static void test_data_errors(void **state)
{
    (void)state;
    char *w = ckpt(), *seq = shipped("seq_tokens.npy"), *out = tmp("keep.npy");
    /* a prompt character outside the vocabulary: named, nothing printed */
    FAILS(1, ARGS("generate", "--weights", w, "--prompt", "price: 5\xe2\x82\xac"), SAYS("'\xe2\x82\xac'", "U+20AC", "byte 8"));
    /* a checkpoint missing a tensor */
    char *miss = tmp("missing.safetensors");
    rewrite(miss, "encoder.layers.3.feed_forward.layer1.weight", NULL, 0, 0, 0);
    FAILS(1, ARGS("model", "--weights", miss, seq), SAYS(miss, "encoder.layers.3.feed_forward.layer1.weight"));
    FAILS(1, ARGS("generate", "--weights", miss, "--prompt", "It"), SAYS(miss, "encoder.layers.3.feed_forward.layer1.weight"));
    /* shapes that do not fit */
    char *bad = tmp("shape.safetensors");
    rewrite(bad, NULL, "generator.projection.weight", 100, 128, 0);
    FAILS(1, ARGS("model", "--weights", bad, seq), SAYS(bad, "generator.projection.weight", "[100, 128]"));
    FAILS(1, ARGS("generate", "--weights", bad, "--prompt", "It"), SAYS(bad, "generator.projection.weight"));
    rewrite(bad, NULL, "encoder.layers.1.self_attn.key.weight", 64, 128, 0);
    FAILS(1, ARGS("model", "--weights", bad, seq), SAYS(bad, "encoder.layers.1.self_attn.key.weight"));
    /* tokens: out of range, floats, too many, the wrong rank */
    char *tp = tmp("tokens.npy");
    int64_t t64[4] = {1, 2, 113, 4};
    write_tokens(tp, AFT_I64, t64, 2, (size_t[]){2, 2});
    FAILS(1, ARGS("model", "--weights", w, tp), SAYS(tp, "token 113", "[1, 0]", "[0, 113)"));
    int32_t neg[3] = {5, -1, 7};
    write_tokens(tp, AFT_I32, neg, 1, (size_t[]){3});
    FAILS(1, ARGS("model", "--weights", w, tp), SAYS(tp, "token -1", "[1]"));
    float fl[3] = {1, 2, 3};
    write_tokens(tp, AFT_F32, fl, 1, (size_t[]){3});
    FAILS(1, ARGS("model", "--weights", w, tp), SAYS(tp, "F32", "integers"));
    int32_t *many = calloc(300, sizeof *many);
    assert_non_null(many);
    write_tokens(tp, AFT_I32, many, 1, (size_t[]){300});
    FAILS(1, ARGS("model", "--weights", w, tp), SAYS(tp, "300", "256"));
    write_tokens(tp, AFT_I32, many, 3, (size_t[]){2, 3, 4});
    FAILS(1, ARGS("model", "--weights", w, tp), SAYS(tp, "3 dimensions"));
    free(many);
    /* a failed run leaves -o as it was */
    assert_int_equal(harness_write_file(out, "old", 3), 0);
    write_tokens(tp, AFT_I64, t64, 2, (size_t[]){2, 2});
    FAILS(1, ARGS("model", "--weights", w, tp, "-o", out), SAYS("token 113"));
    char *kept;
    assert_int_equal(harness_read_file(out, &kept, NULL), 0);
    assert_string_equal(kept, "old");
    free(kept);
    /* not a checkpoint; --max-memory too small */
    FAILS(1, ARGS("model", "--weights", seq, seq), SAYS(seq));
    FAILS(1, ARGS("generate", "--weights", w, "--prompt", "It", "--max-memory", "1M"), SAYS("--max-memory"));
    free(w); free(seq); free(out); free(miss); free(bad); free(tp);
}


/* expect_stderr of the one line "aft CMD: what" (CMD: args[0]) */
static void expect_message(const char *const *args, int code, const char *what)
{
    char *want = harness_fmt("aft %s: %s", args[0], what);
    check_stderr(args, code, want);
    free(want);
}

/* files a and b hold the same bytes */
static void same_file(const char *a, const char *b)
{
    char *da, *db;
    size_t na, nb;
    assert_int_equal(harness_read_file(a, &da, &na), 0);
    assert_int_equal(harness_read_file(b, &db, &nb), 0);
    if (na != nb || memcmp(da, db, na) != 0) fail_msg("%s and %s differ", a, b);
    free(da);
    free(db);
}

/* checkpoints whose layers are not alike, or with a tensor nothing reads:
 * the exact one-line refusals (a layer short of a tensor the others have, a
 * bias only some projections have, a shape unlike layer 0's, a shape that
 * does not fit), the warning that leaves the logits as they were, and
 * --strict's refusal; optional tensors absent from every layer load */
static void test_layers_alike(void **state)
{
    (void)state;
    char *seq = shipped("seq_tokens.npy"), *w = ckpt(), *p = tmp("alike.safetensors");
    char *out = tmp("alike_logits.npy"), *ref = tmp("alike_ref.npy"), *want;
    /* the file: layer 1 without the bias every other layer has */
    rewrite(p, "encoder.layers.1.feed_forward.layer2.bias", NULL, 0, 0, 0);
    want = harness_fmt("%s: missing tensor 'encoder.layers.1.feed_forward.layer2.bias', which layer 0 has\n", p);
    expect_message(ARGS("model", "--weights", p, seq, "-o", out), 1, want);
    expect_message(ARGS("generate", "--weights", p, "--prompt", "It", "-n", "3"), 1, want);
    free(want);
    /* the same bias absent from every layer: optional, so the model loads */
    const char *every[7];
    char names[6][64];
    for (int l = 0; l < 6; l++) {
        snprintf(names[l], sizeof names[l], "encoder.layers.%d.feed_forward.layer2.bias", l);
        every[l] = names[l];
    }
    every[6] = NULL;
    rewrite_with(p, every, NULL, 0, 0, NULL, 0);
    check_stderr(ARGS("model", "--weights", p, seq, "-o", out), 0, "");
    /* a bias the query and value have and the key lacks */
    rewrite(p, "encoder.layers.2.self_attn.key.bias", NULL, 0, 0, 0);
    want = harness_fmt("%s: missing tensor 'encoder.layers.2.self_attn.key.bias' beside "
               "'encoder.layers.2.self_attn.query.bias': a layer has a bias for every projection, for none, or for "
               "its output alone\n", p);
    expect_message(ARGS("model", "--weights", p, seq, "-o", out), 1, want);
    free(want);
    /* shapes: one that does not fit, one unlike layer 0's */
    rewrite(p, NULL, "generator.projection.weight", 100, 128, 0);
    want = harness_fmt("%s: 'generator.projection.weight' (the logits' projection (n_vocab, d_model)) is [100, 128] but "
               "must be [113, 128]\n", p);
    expect_message(ARGS("model", "--weights", p, seq, "-o", out), 1, want);
    free(want);
    write_small(p, AFT_FULL, 1, 20);
    want = harness_fmt("%s: 'encoder.layers.1.self_attn.pos_bias' is [20, 20] but layer 0's is [30, 30]\n", p);
    expect_message(ARGS("model", "--weights", p, seq, "-o", out), 1, want);
    expect_message(ARGS("generate", "--weights", p, "--prompt", "abc"), 1, want);
    free(want);
    /* a tensor the model does not use: a warning, the same logits and text;
     * --strict refuses it */
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "model", "--weights", w, seq, "-o", ref), 0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    rewrite_with(p, NULL, NULL, 0, 0, "encoder.layers.0.feed_forward.linear_v.weight", 0);
    want = harness_fmt("aft model: warning: %s: unexpected tensor 'encoder.layers.0.feed_forward.linear_v.weight', "
                       "which the model does not use\n", p);
    check_stderr(ARGS("model", "--weights", p, seq, "-o", out), 0, want);
    same_file(out, ref);
    free(want);
    want = harness_fmt("%s: unexpected tensor 'encoder.layers.0.feed_forward.linear_v.weight', which the model does not "
               "use; --strict refuses it\n", p);
    expect_message(ARGS("model", "--weights", p, "--strict", seq, "-o", out), 1, want);
    expect_message(ARGS("generate", "--weights", p, "--prompt", "It", "--strict"), 1, want);
    free(want);
    assert_int_equal(HARNESS_RUN(&r, "generate", "--weights", p, "--prompt", "It is ", "-n", "40", "--greedy"), 0);
    char *text = GENERATE("--weights", w, "--prompt", "It is ", "-n", "40", "--greedy");
    want = harness_fmt("aft generate: warning: %s: unexpected tensor "
                       "'encoder.layers.0.feed_forward.linear_v.weight', which the model does not use\n", p);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.err, want);
    assert_string_equal(r.out, text);
    harness_result_free(&r);
    free(want);
    free(text);
    free(seq); free(w); free(p); free(out); free(ref);
}

static void test_usage_errors(void **state)
{
    (void)state;
    char *w = ckpt(), *seq = shipped("seq_tokens.npy");
    FAILS(2, ARGS("model", seq), SAYS("--weights"));
    FAILS(2, ARGS("model", "--weights", w), SAYS("no TOKENS"));
    FAILS(2, ARGS("model", "--weights", w, seq, seq), SAYS("more than one TOKENS"));
    FAILS(2, ARGS("model", "--weights", w, "--layout", "bt", seq), SAYS("--layout"));
    FAILS(2, ARGS("model", "--weights", w, "--impl", "slow", seq), SAYS("--impl"));
    FAILS(2, ARGS("model", "--weights", w, "--threads", "0", seq), SAYS("--threads"));
    FAILS(2, ARGS("model", "--weights", w, "--window", "x", seq), SAYS("--window"));
    FAILS(2, ARGS("model", "--weights", w, "--bogus", seq), SAYS("--bogus"));
    FAILS(2, ARGS("generate", "--weights", w), SAYS("--prompt"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", ""), SAYS("--prompt", "at least one character"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", "a", "--greedy", "--temperature", "0.5"), SAYS("--temperature"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", "a", "--greedy", "--top-k", "3"), SAYS("--top-k"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", "a", "-n", "-1"), SAYS("-n"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", "a", "--temperature", "-1"), SAYS("--temperature"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", "a", "--seed", "x"), SAYS("--seed"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt", "a", "extra"), SAYS("extra"));
    FAILS(2, ARGS("generate", "--weights", w, "--prompt"), SAYS("--prompt needs"));
    FAILS(2, ARGS("bench", "--generate", "--d-model", "64"), SAYS("--d-model"));
    FAILS(2, ARGS("bench", "--weights", w), SAYS("--generate"));
    free(w);
    free(seq);
}

/* ------------------------------------------------------------------ aft bench --generate */

static void test_bench_generate(void **state)
{
    (void)state;
    if (strstr(harness_aft_bin(), "valgrind")) {
        print_message("skipped: aft bench starts its children through /proc/self/exe (valgrind's binary)\n");
        skip();
    }
    char *w = ckpt();
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "bench", "--generate", "--weights", w, "--seq-len", "40,300", "--threads", "1",
                                 "--repeat", "1", "--json"),
                     0);
    if (r.exit_code) fail_msg("aft bench --generate: %s", r.err);
    assert_int_equal(harness_count_lines(r.out), 2);
    char *save = NULL;
    double want[2] = {40, 300};
    int i = 0;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "mode")->valuestring, "generate");
        assert_true(num(j, "generated_tokens") == want[i] && num(j, "prompt_tokens") == 8 && num(j, "threads") == 1);
        double ms = num(j, "generate_ms");
        assert_true(num(j, "generate_min_ms") > 0 && num(j, "generate_min_ms") <= ms &&
                    num(j, "time_to_first_token_ms") <= ms);
        assert_true(fabs(num(j, "tokens_per_s") - want[i] / (ms * 1e-3)) <= 1e-6 * num(j, "tokens_per_s"));
        assert_true(num(j, "peak_rss_bytes") > 0 && num(j, "n_layers") == 6);
        cJSON_Delete(j);
    }
    harness_result_free(&r);
    /* the table: the model's line and a row */
    assert_int_equal(HARNESS_RUN(&r, "bench", "--generate", "--weights", w, "--seq-len", "20", "--repeat", "1"), 0);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, "6 layers, local S=32"));
    assert_non_null(strstr(r.out, "tokens/s"));
    assert_int_equal(harness_count_lines(r.out), 4);
    harness_result_free(&r);
    free(w);
}

/* ------------------------------------------------------------------ the shipped model, without --weights */

/* A copy of aft in a directory of its own looks beside itself, then in the
 * data directory it was built for (cli_shipped_place: the one this test's
 * cli/ objects were compiled with, as aft's were). With neither holding the
 * model, aft generate and aft bench --generate name both (exit 1); with
 * testdata/ beside the copy, generate runs that model as --weights would. */
static void test_shipped_model(void **state)
{
    (void)state;
    if (!harness_aft_is_binary()) {
        print_message("skipped: $AFT_BIN is a wrapper, which cannot be copied away from its aft\n");
        skip();
    }
    char *dir = tmp("bin"), *copy = harness_path(dir, "aft"), *bin, *here = NULL, *data = NULL;
    size_t len;
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(harness_read_file(harness_aft_bin(), &bin, &len), 0);
    assert_int_equal(harness_write_file(copy, bin, len), 0);
    assert_int_equal(chmod(copy, 0755), 0);
    assert_non_null(here = realpath(dir, NULL));
    assert_non_null(data = realpath(harness_testdata(), NULL));
    char *beside = harness_fmt("%s/testdata/model/labml_aft_fortunes.safetensors", here), datadir[4096];
    assert_non_null(cli_shipped_place(1, datadir, sizeof datadir));
    assert_non_null(strstr(datadir, "/labml_aft_fortunes.safetensors"));
    char *saved = strdup(harness_aft_bin());
    setenv("AFT_BIN", copy, 1);
    if (harness_exists(datadir)) {
        print_message("note: %s is installed, so the copy finds it: its absence is not checked\n", datadir);
    } else {
        FAILS(1, ARGS("generate", "--prompt", "It"),
              SAYS("aft generate: without --weights, generate runs the model shipped with aft (", beside,
                   " beside the aft binary, or ", datadir, "), which is not there: give --weights FILE"));
        FAILS(1, ARGS("bench", "--generate", "--seq-len", "8", "--repeat", "1"),
              SAYS("aft bench: --generate without --weights times the model shipped with aft (", beside, datadir));
    }
    char *link = harness_path(dir, "testdata"), *t = tmp("shipped_timing.json"), *w = ckpt();
    assert_int_equal(symlink(data, link), 0);
    char *a = GENERATE("--prompt", "It is ", "-n", "40", "--greedy", "--timing", t);
    setenv("AFT_BIN", saved, 1);
    char *b = GENERATE("--weights", w, "--prompt", "It is ", "-n", "40", "--greedy");
    assert_string_equal(a, b);
    /* --timing names the file it found */
    char *text;
    assert_int_equal(harness_read_file(t, &text, NULL), 0);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "model")->valuestring, beside);
    cJSON_Delete(j);
    free(text); free(a); free(b); free(w); free(t); free(link); free(saved); free(beside);
    free(data); free(here); free(bin); free(copy); free(dir);
}

/* ------------------------------------------------------------------ 16-bit checkpoints */

/* aft's output (exit 0); malloc'd stdout, its length in *len */
static char *run_out(const char *const *args, size_t *len)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != 0) fail_msg("aft %s ...: exit %d: %s", args[0], r.exit_code, r.err);
    char *out = r.out;
    *len = r.out_len;
    r.out = NULL;
    harness_result_free(&r);
    return out;
}
#define RUN_OUT(len, ...) run_out((const char *const[]){__VA_ARGS__, NULL}, (len))

/* a --timing file's weights_dtype */
static char *timing_dtype(const char *path)
{
    char *text;
    assert_int_equal(harness_read_file(path, &text, NULL), 0);
    cJSON *j = cJSON_Parse(text), *v = cJSON_GetObjectItemCaseSensitive(j, "weights_dtype");
    if (!cJSON_IsString(v)) fail_msg("%s: no weights_dtype: %s", path, text);
    char *dt = strdup(v->valuestring);
    cJSON_Delete(j);
    free(text);
    return dt;
}

/* A checkpoint converted to f16 and to bf16 keeps its products' and
 * embedding's weights 16-bit, which widening exactly makes give the bits of
 * the float32 checkpoint of the same values (aft convert --dtype f32 of the
 * 16-bit file): aft model's logits, aft generate's text (greedy and
 * sampled), aft run's and aft grad's outputs on a layer of it, at every
 * kernel level this CPU runs; --timing and aft info say what memory holds
 * (f16 at base: widened). */
static void test_16bit_checkpoint(void **state)
{
    (void)state;
    const char *const dts[] = {"f16", "bf16"};
    char *w = ckpt(), *tok = shipped("bt_tokens.npy"), *x = tmp("x16.npy"), *dy = tmp("dy16.npy");
    /* a layer's input and output gradient: (2, 40, 128) */
    enum { B = 2, T = 40, D = 128 };
    static float xs[B * T * D], dys[B * T * D];
    for (size_t i = 0; i < B * T * D; i++) {
        xs[i] = aft_seeded_bias(7, 1.0f, i / D, i % D);
        dys[i] = aft_seeded_bias(8, 1.0f, i / D, i % D);
    }
    const size_t shape[3] = {B, T, D};
    aft_error err;
    aft_tensor tx = harness_tensor(AFT_F32, xs, 3, shape), td = harness_tensor(AFT_F32, dys, 3, shape);
    assert_int_equal(aft_npy_write(x, &tx, &err), AFT_OK);
    assert_int_equal(aft_npy_write(dy, &td, &err), AFT_OK);
    size_t nlev;
    const aft_level *lev = aft_levels(&nlev);
    const int wrapped = !harness_aft_is_binary();
    const char *env = getenv("AFT_KERNELS");
    char *kept = env ? strdup(env) : NULL;   /* put back after the loop */
    for (size_t di = 0; di < 2; di++) {
        char *n16 = harness_fmt("m_%s.safetensors", dts[di]), *n32 = harness_fmt("m_%s_f32.safetensors", dts[di]);
        char *w16 = tmp(n16), *w32 = tmp(n32);
        free(n16);
        free(n32);
        size_t n;
        free(RUN_OUT(&n, "convert", "--dtype", dts[di], "-o", w16, w));
        free(RUN_OUT(&n, "convert", "--dtype", "f32", "-o", w32, w16));
        for (size_t li = 0; li < nlev; li++) {
            if (!lev[li].runs) continue;
            /* under make test-valgrind's wrapper aft sees valgrind's CPU,
             * which has no AVX-512: avx2 alone, the level it picks there
             * (base's widening runs natively in make test and test-levels) */
            if (wrapped && strcmp(lev[li].name, "avx2") != 0) continue;
            setenv("AFT_KERNELS", lev[li].name, 1);
            char what[96];
            snprintf(what, sizeof what, "%s at %s", dts[di], lev[li].name);
            int base = strcmp(lev[li].name, "base") == 0 || strcmp(lev[li].name, "fixed") == 0;
            /* the model's logits */
            char *a = tmp("l16.npy"), *b = tmp("l32.npy");
            char *t = tmp("g16.json");
            free(RUN_OUT(&n, "model", "--weights", w16, "-o", a, tok, "--timing", t));
            free(RUN_OUT(&n, "model", "--weights", w32, "-o", b, tok));
            same_file(a, b);
            char *mdt = timing_dtype(t);
            if (!base) assert_string_equal(mdt, dts[di]);
            free(mdt);
            /* generation, greedy and sampled; --timing says the dtype */
            char *g1 = GENERATE("--weights", w16, "--prompt", "It is ", "-n", "60", "--greedy", "--timing", t);
            char *g2 = GENERATE("--weights", w32, "--prompt", "It is ", "-n", "60", "--greedy");
            assert_string_equal(g1, g2);
            char *dt = timing_dtype(t);
            if (!base) assert_string_equal(dt, dts[di]);
            free(dt);
            free(g1); free(g2);
            g1 = GENERATE("--weights", w16, "--prompt", "It is ", "-n", "60", "--temperature", "0.8", "--seed", "5");
            g2 = GENERATE("--weights", w32, "--prompt", "It is ", "-n", "60", "--temperature", "0.8", "--seed", "5");
            assert_string_equal(g1, g2);
            free(g1); free(g2);
            /* a layer of it: aft run and aft grad (local causal, full) */
            const char *pre = "encoder.layers.0.self_attn.";
            free(RUN_OUT(&n, "run", "--weights", w16, "--prefix", pre, "--variant", "local", "--window", "8",
                         "--causal", "--timing", t, "-o", a, x));
            free(RUN_OUT(&n, "run", "--weights", w32, "--prefix", pre, "--variant", "local", "--window", "8",
                         "--causal", "-o", b, x));
            same_file(a, b);
            dt = timing_dtype(t);
            if (!base) assert_string_equal(dt, dts[di]);
            free(dt);
            char *ga = tmp("g16.safetensors"), *gb = tmp("g32.safetensors");
            free(RUN_OUT(&n, "grad", "--weights", w16, "--prefix", pre, "--variant", "full", "--dy", dy, "-o", ga, x));
            free(RUN_OUT(&n, "grad", "--weights", w32, "--prefix", pre, "--variant", "full", "--dy", dy, "-o", gb, x));
            same_file(ga, gb);
            /* aft info: what the products hold */
            char *info = RUN_OUT(&n, "info", w16);
            char *want = harness_fmt("  in memory: %s", base ? "f32" : dts[di]);
            if (!strstr(info, want)) fail_msg("%s: aft info lacks '%s': %s", what, want, info);
            free(want); free(info);
            free(a); free(b); free(t); free(ga); free(gb);
        }
        if (kept) setenv("AFT_KERNELS", kept, 1);
        else unsetenv("AFT_KERNELS");
        free(w16); free(w32);
    }
    free(kept);
    free(w); free(tok); free(x); free(dy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_vs_torch),
        cmocka_unit_test(test_greedy_vs_torch),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_timing),
        cmocka_unit_test(test_other_variants),
        cmocka_unit_test(test_vocab_file),
        cmocka_unit_test(test_data_errors),
        cmocka_unit_test(test_layers_alike),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_bench_generate),
        cmocka_unit_test(test_shipped_model),
        cmocka_unit_test(test_16bit_checkpoint),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
