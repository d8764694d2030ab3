/*
 * test_encode.c - `aft encode` and `aft decode` through the command line,
 * on the shipped model's vocabulary (testdata/model).
 *
 * What is checked, and against what:
 *  - encode's ids against ids made here from the metadata 'vocab' by hand,
 *    and aft model's logits on encode's file against its logits on the
 *    hand-made one (the same bytes);
 *  - round trips: text -> encode -> decode gives the text (and a newline
 *    where it did not end with one), from TEXT, --text-file and stdin; the
 *    shipped seq_tokens.npy -> decode -> encode gives its ids;
 *  - refusals: a character outside the vocabulary (exit 1, one line in aft
 *    generate's words, no output written), an id outside it, float ids, a
 *    model without a vocabulary (--vocab then works), a text past
 *    --max-memory, usage errors (exit 2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aft.h"
#include "checks.h"
#include "harness.h"

/* ------------------------------------------------------------------ helpers */

static char *tmp(const char *name) { return harness_tmp(name); }

static char *ckpt(void) { return harness_fmt("%s/model/labml_aft_fortunes.safetensors", harness_testdata()); }

/* the shipped model's metadata 'vocab' (a JSON array), malloc'd */
static char *vocab_json(void)
{
    char *w = ckpt(), *out = NULL;
    aft_st_file *f;
    aft_error err;
    if (aft_st_open(w, &f, &err) != AFT_OK) fail_msg("%s", err.msg);
    for (size_t i = 0; i < aft_st_metadata_count(f); i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        if (strcmp(k, "vocab") == 0) out = strdup(v);
    }
    aft_st_close(f);
    free(w);
    assert_non_null(out);
    return out;
}

/* text's ids by hand: each character (every entry of this vocabulary is
 * one) looked up in the list; malloc'd, *n of them */
static int32_t *ids_by_hand(const char *text, size_t *n)
{
    char *json = vocab_json();
    cJSON *arr = cJSON_Parse(json);
    assert_non_null(arr);
    size_t len = strlen(text), count = 0;
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    assert_non_null(ids);
    for (size_t at = 0; at < len;) {
        int found = -1;
        size_t flen = 0, id = 0;
        for (const cJSON *e = arr->child; e; e = e->next, id++) {
            size_t el = strlen(e->valuestring);
            if (el <= len - at && memcmp(text + at, e->valuestring, el) == 0) {
                found = (int)id;
                flen = el;
            }
        }
        if (found < 0) fail_msg("'%s' at byte %zu: not in the vocabulary", text, at);
        ids[count++] = found;
        at += flen;
    }
    cJSON_Delete(arr);
    free(json);
    *n = count;
    return ids;
}

/* a run that must succeed with nothing on stderr; its stdout, malloc'd
 * (*len bytes) */
static char *run_ok(const char *const *args, const void *in, size_t in_len, size_t *len)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, in, in_len), 0);
    if (r.exit_code != 0 || r.err_len) fail_msg("aft %s ...: exit %d: %s", args[0], r.exit_code, r.err);
    char *out = r.out;
    if (len) *len = r.out_len;
    r.out = NULL;
    harness_result_free(&r);
    return out;
}
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* a run that must fail with status code, print nothing on stdout and, on
 * stderr, exactly want (usage errors: want, then the hint line) */
static void expect_error(const char *const *args, int code, const char *want_plain)
{
    /* want_plain is written "aft: ..."; the one shape names the command: "aft encode: ..." */
    char *want = strncmp(want_plain, "aft: ", 5) == 0 ? harness_fmt("aft %s: %s", args[0], want_plain + 5) : harness_fmt("%s", want_plain);
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != code) fail_msg("aft %s ...: exit %d, not %d: %s", args[0], r.exit_code, code, r.err);
    assert_int_equal(r.out_len, 0);
    if (code == 2) {
        char *full = harness_fmt("%sTry 'aft %s --help'.\n", want, args[0]);
        if (strcmp(r.err, full) != 0) fail_msg("aft %s ...: stderr\n%s\nwanted\n%s", args[0], r.err, full);
        free(full);
    } else if (strcmp(r.err, want) != 0) {
        fail_msg("aft %s ...: stderr\n%s\nwanted\n%s", args[0], r.err, want);
    }
    harness_result_free(&r);
    free(want);
}

static aft_tensor read_npy(const char *path)
{
    aft_tensor t;
    aft_error err;
    if (aft_npy_read(path, &t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    return t;
}

static void write_ids(const char *path, const int32_t *ids, size_t n)
{
    aft_tensor t = harness_tensor(AFT_I32, ids, 1, (size_t[]){n});
    aft_error err;
    if (aft_npy_write(path, &t, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
}

/* a fortune, with a tab, quotes, a newline and a non-ASCII entry ("é") */
static const char fortune[] = "\tIt is a truth universally acknowledged, that \"caf\xc3\xa9\" (1813)\nhas 2 lines.";

/* ------------------------------------------------------------------ encode */

/* encode's ids are the hand-made ones, int32 [n]; aft model reads them and
 * gives the logits it gives for the hand-made file, byte for byte */
static void test_encode_feeds_model(void **state)
{
    (void)state;
    char *w = ckpt(), *enc = tmp("enc.npy"), *hand = tmp("hand.npy"), *la = tmp("la.npy"), *lb = tmp("lb.npy");
    size_t n;
    int32_t *want = ids_by_hand(fortune, &n);
    write_ids(hand, want, n);
    free(run_ok(ARGS("encode", "--weights", w, fortune, "-o", enc), NULL, 0, NULL));
    aft_tensor t = read_npy(enc);
    assert_int_equal(t.dtype, AFT_I32);
    assert_int_equal(t.ndim, 1);
    assert_int_equal(t.shape[0], n);
    assert_memory_equal(t.data, want, n * sizeof *want);
    aft_tensor_free(&t);
    check_same_file(enc, hand);

    free(run_ok(ARGS("model", "--weights", w, enc, "-o", la), NULL, 0, NULL));
    free(run_ok(ARGS("model", "--weights", w, hand, "-o", lb), NULL, 0, NULL));
    check_same_file(la, lb);
    /* and down a pipe: encode's stdout is model's stdin */
    size_t len, llen;
    char *npy = run_ok(ARGS("encode", "--weights", w, fortune), NULL, 0, &len);
    char *logits = run_ok(ARGS("model", "--weights", w, "-"), npy, len, &llen);
    char *ref;
    size_t rlen;
    assert_int_equal(harness_read_file(lb, &ref, &rlen), 0);
    assert_int_equal(llen, rlen);
    assert_memory_equal(logits, ref, rlen);
    free(ref);
    free(logits);
    free(npy);
    free(want);
    free(w); free(enc); free(hand); free(la); free(lb);
}

/* text -> ids -> text, from each source; a newline ends the text printed */
static void test_round_trip(void **state)
{
    (void)state;
    char *w = ckpt(), *ids = tmp("ids.npy"), *txt = tmp("fortune.txt");
    char *with_nl = harness_fmt("%s\n", fortune);
    /* TEXT: decode adds the newline the text lacks */
    free(run_ok(ARGS("encode", "--weights", w, fortune, "-o", ids), NULL, 0, NULL));
    char *back = run_ok(ARGS("decode", "--weights", w, ids), NULL, 0, NULL);
    assert_string_equal(back, with_nl);
    free(back);
    /* --text-file: a text that ends with a newline comes back as it was */
    assert_int_equal(harness_write_file(txt, with_nl, strlen(with_nl)), 0);
    free(run_ok(ARGS("encode", "--weights", w, "--text-file", txt, "-o", ids), NULL, 0, NULL));
    back = run_ok(ARGS("decode", "--weights", w, ids), NULL, 0, NULL);
    assert_string_equal(back, with_nl);
    free(back);
    /* stdin, and decode from stdin */
    size_t len;
    char *npy = run_ok(ARGS("encode", "--weights", w, "-"), with_nl, strlen(with_nl), &len);
    back = run_ok(ARGS("decode", "--weights", w, "-"), npy, len, NULL);
    assert_string_equal(back, with_nl);
    free(back);
    free(npy);
    /* the empty text: no tokens, and an empty line back */
    free(run_ok(ARGS("encode", "--weights", w, "", "-o", ids), NULL, 0, NULL));
    aft_tensor t = read_npy(ids);
    assert_int_equal(t.ndim, 1);
    assert_int_equal(t.shape[0], 0);
    aft_tensor_free(&t);
    back = run_ok(ARGS("decode", "--weights", w, ids), NULL, 0, NULL);
    assert_string_equal(back, "\n");
    free(back);
    free(with_nl);
    free(w); free(ids); free(txt);
}

/* the shipped tokens (PyTorch's test sequence) decode to a text that
 * encodes to them again; [B, T] decodes a line a sequence */
static void test_shipped_tokens(void **state)
{
    (void)state;
    char *w = ckpt(), *seq = harness_fmt("%s/model/seq_tokens.npy", harness_testdata()), *again = tmp("again.npy");
    char *txt = tmp("seq.txt"), *bt = harness_fmt("%s/model/bt_tokens.npy", harness_testdata());
    size_t len;
    char *text = run_ok(ARGS("decode", "--weights", w, seq), NULL, 0, &len);
    aft_tensor s = read_npy(seq);
    /* the last token is no newline, so decode added one: leave it out */
    assert_true(len > 1 && text[len - 1] == '\n');
    assert_int_equal(harness_write_file(txt, text, len - 1), 0);
    free(run_ok(ARGS("encode", "--weights", w, "--text-file", txt, "-o", again), NULL, 0, NULL));
    aft_tensor a = read_npy(again);
    assert_int_equal(a.nelem, s.nelem);
    for (size_t i = 0; i < s.nelem; i++) {
        int64_t want = s.dtype == AFT_I64 ? ((const int64_t *)s.data)[i] : ((const int32_t *)s.data)[i];
        if (((const int32_t *)a.data)[i] != want) fail_msg("token %zu: %d, not %lld", i, ((const int32_t *)a.data)[i], (long long)want);
    }
    aft_tensor_free(&a);
    aft_tensor_free(&s);
    free(text);
    /* [B, T]: B lines of text, or more where a sequence holds newlines,
     * each sequence ending in one */
    aft_tensor b = read_npy(bt);
    assert_int_equal(b.ndim, 2);
    text = run_ok(ARGS("decode", "--weights", w, bt), NULL, 0, &len);
    assert_true(len >= b.shape[0] * b.shape[1] && text[len - 1] == '\n');
    aft_tensor_free(&b);
    free(text);
    free(w); free(seq); free(again); free(txt); free(bt);
}

/* on a terminal without -o: the ids as text, and where they would go
 * (util-linux's script(1) gives the pty; skipped without it) */
static void test_terminal(void **state)
{
    (void)state;
    char *w = ckpt();
    size_t n;
    int32_t *ids = ids_by_hand("It is", &n);
    char *cmd = harness_fmt("command -v script >/dev/null 2>&1 || exit 77; "
                    "script -qec \"'%s' encode --weights '%s' 'It is'\" /dev/null", harness_aft_bin(), w);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char got[4096];
    size_t len = 0;
    int c;
    while ((c = fgetc(p)) != EOF && len < sizeof got - 1)
        if (c != '\r') got[len++] = (char)c;   /* the terminal's "\r\n" */
    got[len] = '\0';
    int st = pclose(p);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) skip();
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *want = harness_fmt("[%d, %d, %d, %d, %d]\n(5 tokens; not saved: -o FILE or a pipe writes them as .npy)\n", ids[0],
                     ids[1], ids[2], ids[3], ids[4]);
    assert_int_equal(n, 5);
    assert_string_equal(got, want);
    free(want);
    free(cmd);
    free(ids);
    free(w);
}

/* ------------------------------------------------------------------ refusals */

static void test_unknown_character(void **state)
{
    (void)state;
    char *w = ckpt(), *out = tmp("never.npy"), *txt = tmp("euro.txt");
    /* in aft generate's words: the character, its code point, its byte */
    expect_error(ARGS("encode", "--weights", w, "price: 5\xe2\x82\xac", "-o", out), 1,
                 "aft encode: TEXT: character '\xe2\x82\xac' (U+20AC) at byte 8 is not in the model's vocabulary\n");
    expect_error(ARGS("generate", "--weights", w, "--prompt", "price: 5\xe2\x82\xac"), 1,
                 "aft generate: --prompt: character '\xe2\x82\xac' (U+20AC) at byte 8 is not in the model's vocabulary\n");
    assert_int_equal(access(out, F_OK), -1);   /* nothing written */
    assert_int_equal(harness_write_file(txt, "ok\n\x01", 4), 0);
    char *want = harness_fmt("aft: %s: character U+0001 at byte 3 is not in the model's vocabulary\n", txt);
    expect_error(ARGS("encode", "--weights", w, "--text-file", txt, "-o", out), 1, want);
    free(want);
    assert_int_equal(harness_write_file(txt, "ab\xff", 3), 0);
    want = harness_fmt("aft: %s: character byte 0xFF (not UTF-8) at byte 2 is not in the model's vocabulary\n", txt);
    expect_error(ARGS("encode", "--weights", w, "--text-file", txt, "-o", out), 1, want);
    free(want);
    assert_int_equal(access(out, F_OK), -1);
    free(w); free(out); free(txt);
}

static void test_decode_errors(void **state)
{
    (void)state;
    char *w = ckpt(), *p = tmp("bad_ids.npy");
    write_ids(p, (const int32_t[]){5, 113, 7}, 3);
    char *want = harness_fmt("aft: %s: token 113 at [1] is outside the vocabulary [0, 113)\n", p);
    expect_error(ARGS("decode", "--weights", w, p), 1, want);
    free(want);
    const float f[2] = {1, 2};
    aft_tensor t = harness_tensor(AFT_F32, f, 1, (size_t[]){2});
    aft_error err;
    assert_int_equal(aft_npy_write(p, &t, &err), AFT_OK);
    want = harness_fmt("aft: %s: tokens have dtype F32; they must be integers (token ids)\n", p);
    expect_error(ARGS("decode", "--weights", w, p), 1, want);
    free(want);
    free(w);
    free(p);
}

/* a checkpoint without the metadata 'vocab' at path */
static void write_bare(const char *path)
{
    char *w = ckpt();
    aft_st_file *f;
    aft_error err;
    if (aft_st_open(w, &f, &err) != AFT_OK) fail_msg("%s", err.msg);
    size_t n = aft_st_count(f);
    const char **names = calloc(n, sizeof *names);
    aft_tensor *ts = calloc(n, sizeof *ts);
    assert_non_null(names);
    assert_non_null(ts);
    for (size_t i = 0; i < n; i++) {
        ts[i] = *aft_st_get(f, i, &names[i]);
        ts[i].owned = NULL;
    }
    if (aft_st_write(path, names, ts, n, NULL, 0, &err) != AFT_OK) fail_msg("%s", err.msg);
    aft_st_close(f);
    free(names);
    free(ts);
    free(w);
}

static void test_vocab(void **state)
{
    (void)state;
    char *w = ckpt(), *bare = tmp("bare.safetensors"), *vocab = tmp("vocab.json"), *a = tmp("a.npy"), *b = tmp("b.npy");
    write_bare(bare);
    char *json = vocab_json();
    assert_int_equal(harness_write_file(vocab, json, strlen(json)), 0);
    char *want = harness_fmt("aft: %s: no metadata 'vocab' (the characters of the token ids): give --vocab FILE\n", bare);
    expect_error(ARGS("encode", "--weights", bare, "abc", "-o", a), 1, want);
    expect_error(ARGS("decode", "--weights", bare, a), 1, want);
    free(want);
    free(run_ok(ARGS("encode", "--weights", w, fortune, "-o", a), NULL, 0, NULL));
    free(run_ok(ARGS("encode", "--weights", bare, "--vocab", vocab, fortune, "-o", b), NULL, 0, NULL));
    check_same_file(a, b);
    char *x = run_ok(ARGS("decode", "--weights", bare, "--vocab", vocab, b), NULL, 0, NULL);
    char *with_nl = harness_fmt("%s\n", fortune);
    assert_string_equal(x, with_nl);
    free(x);
    free(with_nl);
    free(json);
    free(w); free(bare); free(vocab); free(a); free(b);
}

static void test_limits_and_usage(void **state)
{
    (void)state;
    char *w = ckpt(), *txt = tmp("long.txt"), *out = tmp("never.npy");
    /* the model needs more than --max-memory: its size in the unit that shows it */
    expect_error(ARGS("encode", "--weights", w, "abc", "--max-memory", "1K"), 1,
                 "aft encode: the model needs about 17.2 MiB but --max-memory allows 1 KiB\n");
    /* a text whose tokens would pass the bound: 9 MiB of text, 45 MiB with its tokens, under 40M */
    size_t n = 9u << 20;
    char *big = malloc(n);
    assert_non_null(big);
    memset(big, 'a', n);
    assert_int_equal(harness_write_file(txt, big, n), 0);
    free(big);
    char *want = harness_fmt("aft: %s: the text and its tokens need more than --max-memory allows (40 MiB)\n", txt);
    expect_error(ARGS("encode", "--weights", w, "--text-file", txt, "--max-memory", "40M", "-o", out), 1, want);
    free(want);
    assert_int_equal(access(out, F_OK), -1);

    expect_error(ARGS("encode", "abc"), 2, "aft encode: --weights FILE is required: the model whose vocabulary encodes\n");
    expect_error(ARGS("encode", "--weights", w), 2,
                 "aft encode: no TEXT given ('-': standard input; or --text-file FILE)\n");
    expect_error(ARGS("encode", "--weights", w, "a", "b"), 2,
                 "aft encode: more than one text: 'a' and 'b' (quote a text that has spaces)\n");
    want = harness_fmt("aft encode: more than one text: 'a' and --text-file %s\n", txt);
    expect_error(ARGS("encode", "--weights", w, "a", "--text-file", txt), 2, want);
    free(want);
    expect_error(ARGS("decode", "--weights", w), 2, "aft decode: no TOKENS given\n");
    free(w); free(txt); free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_feeds_model),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_shipped_tokens),
        cmocka_unit_test(test_terminal),
        cmocka_unit_test(test_unknown_character),
        cmocka_unit_test(test_decode_errors),
        cmocka_unit_test(test_vocab),
        cmocka_unit_test(test_limits_and_usage),
    };
    return cmocka_run_group_tests_name("cli encode, decode", tests, harness_setup, harness_teardown);
}
