/* test_stream.c - aft run --causal --state-in/--state-out: an input fed a
 * chunk at a time, each chunk a process of its own, gives the one-shot causal
 * output within 2e-5 x max(1, |Y|); for every variant and key form, both
 * layouts, B = 1 and 3, chunks of one row and of random sizes, with
 * --weights (and --prefix) and without; the bytes a state written by one
 * process gives the next are those an in-memory state gives; and what a
 * state cannot do is refused. */
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
#include "harness.h"

static char *tmp(const char *name)
{
    char *p = harness_tmp(name);
    assert_non_null(p);
    return p;
}

static float *load_f32(const char *path, aft_tensor *t)
{
    aft_error err;
    if (aft_npy_read(path, t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    assert_int_equal(t->dtype, AFT_F32);
    return (float *)t->data;
}

/* rows [t0, t0 + n) of x (rank 2 [T, D], or rank 3 btd [B, T, D] or tbd
 * [T, B, D]) as a .npy of the same rank and layout */
static void write_rows(const char *path, const aft_tensor *x, int tbd, size_t t0, size_t n)
{
    size_t rank = x->ndim, D = x->shape[rank - 1], B = rank == 3 ? x->shape[tbd ? 1 : 0] : 1;
    float *c = malloc(B * n * D * sizeof *c + 1);
    assert_non_null(c);
    const float *src = x->data;
    size_t T = rank == 3 ? x->shape[tbd ? 0 : 1] : x->shape[0];
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < n; t++) {
            size_t from = tbd ? (t0 + t) * B + b : b * T + t0 + t, to = tbd ? t * B + b : b * n + t;
            memcpy(c + to * D, src + from * D, D * sizeof *c);
        }
    size_t shape[3];
    if (rank == 2) { shape[0] = n; shape[1] = D; }
    else if (tbd) { shape[0] = n; shape[1] = B; shape[2] = D; }
    else { shape[0] = B; shape[1] = n; shape[2] = D; }
    aft_tensor t = harness_tensor(AFT_F32, c, rank, shape);
    aft_error err;
    assert_int_equal(aft_npy_write(path, &t, &err), AFT_OK);
    free(c);
}

/* args + "--causal" [+ --state-in S] + --state-out S + in -o out: exit 0 */
static void run_ok(const char *const *args, const char *state_in, const char *state_out, const char *in,
                   const char *out)
{
    const char *argv[48];
    size_t n = 0;
    argv[n++] = "run";
    for (size_t i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n++] = "--causal";
    if (state_in) { argv[n++] = "--state-in"; argv[n++] = state_in; }
    if (state_out) { argv[n++] = "--state-out"; argv[n++] = state_out; }
    argv[n++] = in;
    argv[n++] = "-o";
    argv[n++] = out;
    argv[n] = NULL;
    harness_result r;
    assert_int_equal(harness_run(&r, argv, NULL, 0), 0);
    if (r.exit_code != 0) fail_msg("aft run %s: exit %d: %s", in, r.exit_code, r.err);
    harness_result_free(&r);
}

/* The input in chunks of sizes[0..n), each a run of its own through one
 * state file, the outputs put back together; against the one-shot run. */
static void check_chunks(const char *what, const char *const *args, const char *input, int tbd, const size_t *sizes,
                         size_t nsizes)
{
    char *one = tmp("one.npy"), *state = tmp("state.safetensors"), *chunk = tmp("chunk.npy"), *yc = tmp("yc.npy");
    run_ok(args, NULL, NULL, input, one);
    aft_tensor x, y1;
    load_f32(input, &x);
    const float *ref = load_f32(one, &y1);
    size_t rank = x.ndim, T = rank == 3 ? x.shape[tbd ? 0 : 1] : x.shape[0];
    size_t B = rank == 3 ? x.shape[tbd ? 1 : 0] : 1, Dy = y1.shape[rank - 1];
    float *y = calloc(y1.nelem + 1, sizeof *y);
    assert_non_null(y);
    remove(state);
    size_t t0 = 0;
    for (size_t i = 0; i < nsizes && t0 < T; i++) {
        size_t n = sizes[i] < T - t0 ? sizes[i] : T - t0;
        write_rows(chunk, &x, tbd, t0, n);
        run_ok(args, t0 ? state : NULL, state, chunk, yc);
        aft_tensor c;
        const float *cy = load_f32(yc, &c);
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < n; t++) {
                size_t from = tbd ? t * B + b : b * n + t, to = tbd ? (t0 + t) * B + b : b * T + t0 + t;
                memcpy(y + to * Dy, cy + from * Dy, Dy * sizeof *y);
            }
        aft_tensor_free(&c);
        t0 += n;
    }
    assert_int_equal(t0, T);
    double scale = 1.0, e = 0.0;
    for (size_t i = 0; i < y1.nelem; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    for (size_t i = 0; i < y1.nelem; i++) {
        double d = fabs((double)y[i] - (double)ref[i]);
        if (!(d <= e)) e = d;
    }
    if (!(e <= 2e-5 * scale)) fail_msg("%s: chunks against the one-shot run: max |diff| %.3g > %.3g", what, e,
                                      2e-5 * scale);
    free(y);
    aft_tensor_free(&x);
    aft_tensor_free(&y1);
    free(one); free(state); free(chunk); free(yc);
}

/* [B, T, D], or [T, D] when B is 0, seeded input of normal values */
static char *make_input(const char *name, size_t B, size_t T, size_t D, double scale)
{
    char *p = tmp(name);
    size_t n = (B ? B : 1) * T * D;   /* [T, D] holds T * D values, not none */
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * (double)aft_seeded_bias(17, 1.0f, i, 3));
    size_t shape[3] = {B, T, D};
    aft_tensor t = B ? harness_tensor(AFT_F32, x, 3, shape) : harness_tensor(AFT_F32, x, 2, shape + 1);
    aft_error err;
    assert_int_equal(aft_npy_write(p, &t, &err), AFT_OK);
    free(x);
    return p;
}

static void test_seeded_variants(void **state)
{
    (void)state;
    char *x3 = make_input("x3.npy", 3, 150, 16, 1.0), *x1 = make_input("x1.npy", 0, 150, 16, 1.0);
    const size_t ones[150] = {[0 ... 149] = 1}, mixed[] = {7, 1, 100, 1, 2, 39};
    const char *local[] = {"--variant", "local", "--window", "5", NULL};
    const char *conv[] = {"--variant", "conv", "--window", "40", "--heads", "4", NULL};
    const char *simple[] = {"--variant", "simple", "--d-hidden", "24", NULL};
    const char *full[] = {"--variant", "full", "--seed", "3", NULL};
    /* a window past the sequence: the one-shot run narrows it to T */
    const char *wide[] = {"--variant", "conv", "--window", "200", "--heads", "2", NULL};
    const char *const *cfgs[] = {local, conv, simple, full, wide};
    /* 150 runs of one row each: under AFT_TEST_QUICK for local alone, the
     * others go in the mixed chunks (1-row chunks among them) */
    for (size_t i = 0; i < 5; i++) {
        int by_ones = i % 2 == 0 && (i == 0 || !harness_quick());
        check_chunks("seeded, B = 3", cfgs[i], x3, 0, mixed, 6);
        check_chunks("seeded, [T, D]", cfgs[i], x1, 0, by_ones ? ones : mixed, by_ones ? 150 : 6);
    }
    free(x3);
    free(x1);
}

/* labml's AFTLocal, seq-first, B = 3; rish-16's AFTFull under a prefix */
static void test_weights_and_layouts(void **state)
{
    (void)state;
    char path[4096], x[4096], pre[4096], xp[4096];
    snprintf(path, sizeof path, "%s/torch/labml_local/weights.safetensors", harness_testdata());
    snprintf(x, sizeof x, "%s/torch/labml_local/x.npy", harness_testdata());
    const char *labml[] = {"--variant", "local", "--window", "4", "--layout", "tbd", "--weights", path, NULL};
    const size_t ones[10] = {[0 ... 9] = 1}, split[] = {3, 6, 1};
    check_chunks("labml tbd, ones", labml, x, 1, ones, 10);
    check_chunks("labml tbd, 3 6 1", labml, x, 1, split, 3);

    /* rish-16's full weights renamed under a prefix */
    snprintf(path, sizeof path, "%s/torch/rish_full/weights.safetensors", harness_testdata());
    snprintf(xp, sizeof xp, "%s/torch/rish_full/x.npy", harness_testdata());
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(path, &f, &err), AFT_OK);
    size_t n = aft_st_count(f);
    const char *names[16];
    char renamed[16][64];
    aft_tensor ts[16];
    for (size_t i = 0; i < n; i++) {
        const char *nm;
        ts[i] = *aft_st_get(f, i, &nm);
        ts[i].owned = NULL;
        snprintf(renamed[i], sizeof renamed[i], "blocks.1.attn.%s", nm);
        names[i] = renamed[i];
    }
    char *w = tmp("prefixed.safetensors");
    assert_int_equal(aft_st_write(w, names, ts, n, NULL, 0, &err), AFT_OK);
    aft_st_close(f);
    snprintf(pre, sizeof pre, "blocks.1.attn.");
    const char *rish[] = {"--variant", "full", "--weights", w, "--prefix", pre, NULL};
    check_chunks("rish full, prefix", rish, xp, 0, split, 3);
    free(w);
}

/* conv with one key channel per head, from a weights file; and the bare
 * operator on q, k, v */
static void test_conv_shared_keys_and_bare(void **state)
{
    (void)state;
    const size_t D = 8, C = 12, H = 3, L = 7;
    float wq[12 * 8], wk[3 * 8], wv[12 * 8], wo[8 * 12], bias[3 * 7];
    for (size_t i = 0; i < sizeof wq / 4; i++) wq[i] = wv[i] = wo[i] = aft_seeded_bias(5, 0.4f, i, 0);
    for (size_t i = 0; i < sizeof wk / 4; i++) wk[i] = aft_seeded_bias(6, 2.0f, i, 0);
    for (size_t i = 0; i < sizeof bias / 4; i++) bias[i] = aft_seeded_bias(7, 1.0f, i, 0);
    size_t sq[2] = {C, D}, sk[2] = {H, D}, so[2] = {D, C}, sb[2] = {H, L};
    aft_tensor ts[5] = {harness_tensor(AFT_F32, wq, 2, sq), harness_tensor(AFT_F32, wk, 2, sk),
                        harness_tensor(AFT_F32, wv, 2, sq), harness_tensor(AFT_F32, wo, 2, so),
                        harness_tensor(AFT_F32, bias, 2, sb)};
    const char *names[5] = {"query.weight", "key.weight", "value.weight", "output.weight", "pos_bias"};
    char *w = tmp("conv.safetensors");
    aft_error err;
    assert_int_equal(aft_st_write(w, names, ts, 5, NULL, 0, &err), AFT_OK);
    char *x = make_input("xc.npy", 3, 60, D, 2.0);
    const char *conv[] = {"--variant", "conv", "--weights", w, NULL};
    const size_t sizes[] = {1, 2, 3, 5, 8, 13, 28};
    check_chunks("conv, one key a head", conv, x, 0, sizes, 7);

    /* the bare operator: q, k, v [B, T, C] with keys of +-500 */
    float *q = malloc(2 * 60 * C * sizeof *q), *k = malloc(2 * 60 * C * sizeof *k), *v = malloc(2 * 60 * C * sizeof *v);
    assert_true(q && k && v);
    for (size_t i = 0; i < 2 * 60 * C; i++) {
        q[i] = aft_seeded_bias(8, 3.0f, i, 0);
        k[i] = aft_seeded_bias(9, 500.0f, i, 0);
        v[i] = aft_seeded_bias(10, 1.0f, i, 0);
    }
    size_t s3[3] = {2, 60, C};
    aft_tensor qkv[3] = {harness_tensor(AFT_F32, q, 3, s3), harness_tensor(AFT_F32, k, 3, s3),
                         harness_tensor(AFT_F32, v, 3, s3)};
    const char *qn[3] = {"q", "k", "v"};
    char *op = tmp("qkv.safetensors"), *one = tmp("op1.npy");
    assert_int_equal(aft_st_write(op, qn, qkv, 3, NULL, 0, &err), AFT_OK);
    /* chunks of the bare operator are .safetensors of q, k, v rows */
    const char *local[] = {"run", "--variant", "local", "--window", "6", "--causal", op, "-o", one, NULL};
    harness_result r;
    assert_int_equal(harness_run(&r, local, NULL, 0), 0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    aft_tensor y1;
    const float *ref = load_f32(one, &y1);
    char *st = tmp("opstate.safetensors"), *cin = tmp("opchunk.safetensors"), *yc = tmp("opy.npy");
    remove(st);
    size_t t0 = 0;
    double worst = 0, scale = 1;
    for (size_t i = 0; t0 < 60; i++) {
        size_t n = sizes[i % 7] < 60 - t0 ? sizes[i % 7] : 60 - t0;
        float *part[3];
        size_t sp[3] = {2, n, C};
        for (int m = 0; m < 3; m++) {
            part[m] = malloc(2 * n * C * sizeof(float));
            for (size_t b = 0; b < 2; b++)
                memcpy(part[m] + b * n * C, (m == 0 ? q : m == 1 ? k : v) + (b * 60 + t0) * C, n * C * sizeof(float));
            qkv[m] = harness_tensor(AFT_F32, part[m], 3, sp);
        }
        assert_int_equal(aft_st_write(cin, qn, qkv, 3, NULL, 0, &err), AFT_OK);
        for (int m = 0; m < 3; m++) free(part[m]);
        const char *step[] = {"run", "--variant", "local", "--window", "6", "--causal", "--state-out", st,
                              t0 ? "--state-in" : cin, t0 ? st : "-o", t0 ? cin : yc, t0 ? "-o" : NULL, yc, NULL};
        assert_int_equal(harness_run(&r, step, NULL, 0), 0);
        if (r.exit_code != 0) fail_msg("bare chunk at %zu: %s", t0, r.err);
        harness_result_free(&r);
        aft_tensor c;
        const float *cy = load_f32(yc, &c);
        for (size_t b = 0; b < 2; b++)
            for (size_t t = 0; t < n; t++)
                for (size_t ch = 0; ch < C; ch++) {
                    double want = ref[(b * 60 + t0 + t) * C + ch], got = cy[(b * n + t) * C + ch];
                    scale = fabs(want) > scale ? fabs(want) : scale;
                    worst = fabs(got - want) > worst ? fabs(got - want) : worst;
                }
        aft_tensor_free(&c);
        t0 += n;
    }
    if (!(worst <= 2e-5 * scale)) fail_msg("bare operator chunks: max |diff| %.3g", worst);
    aft_tensor_free(&y1);
    free(q); free(k); free(v); free(w); free(x); free(op); free(one); free(st); free(cin); free(yc);
}

/* A state written by one process and read by the next gives the bytes an
 * in-memory state gives for the same chunks. */
static void test_process_boundary_same_bytes(void **state)
{
    (void)state;
    char wpath[4096];
    snprintf(wpath, sizeof wpath, "%s/torch/labml_local/weights.safetensors", harness_testdata());
    char *x = make_input("xb.npy", 2, 12, 16, 1.0), *st = tmp("b.safetensors"), *chunk = tmp("bc.npy"),
         *yc = tmp("by.npy");
    const char *args[] = {"--variant", "local", "--window", "4", "--weights", wpath, NULL};
    aft_tensor xt;
    const float *xs = load_f32(x, &xt);
    aft_st_file *f;
    aft_weights w;
    aft_error err;
    assert_int_equal(aft_st_open(wpath, &f, &err), AFT_OK);
    assert_int_equal(aft_weights_load(f, "", AFT_LOCAL, &w, &err), AFT_OK);
    aft_config cfg = {.variant = AFT_LOCAL, .window = 4, .causal = 1};
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &w.p, &cfg, 2, &err), AFT_OK);
    const size_t sizes[] = {1, 4, 2, 5};
    size_t t0 = 0;
    remove(st);
    for (size_t i = 0; i < 4; i++) {
        size_t n = sizes[i];
        write_rows(chunk, &xt, 0, t0, n);
        run_ok(args, t0 ? st : NULL, st, chunk, yc);
        aft_tensor c;
        const float *cy = load_f32(yc, &c);
        float xin[2 * 5 * 16], yout[2 * 5 * 16];
        for (size_t b = 0; b < 2; b++) memcpy(xin + b * n * 16, xs + (b * 12 + t0) * 16, n * 16 * sizeof(float));
        assert_int_equal(aft_state_step(s, yout, xin, n, &err), AFT_OK);
        assert_memory_equal(cy, yout, 2 * n * 16 * sizeof(float));
        aft_tensor_free(&c);
        t0 += n;
    }
    aft_state_free(s);
    aft_weights_free(&w);
    aft_st_close(f);
    aft_tensor_free(&xt);
    free(x); free(st); free(chunk); free(yc);
}

/* runs aft with args; the exit status must be `code`, the message name `word` */
static void expect_refused(int code, const char *word, const char *const *args)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != code || !strstr(r.err, word))
        fail_msg("exit %d (want %d), message '%s' (want '%s')", r.exit_code, code, r.err, word);
    harness_result_free(&r);
}

static void test_refusals(void **state)
{
    (void)state;
    char *x = make_input("xr.npy", 0, 8, 16, 1.0), *st = tmp("r.safetensors"), *y = tmp("ry.npy");
    const char *no_causal[] = {"run", "--variant", "simple", "--state-out", st, x, "-o", y, NULL};
    expect_refused(2, "needs --causal", no_causal);
    const char *masked[] = {"run", "--variant", "simple", "--causal", "--mask", x, "--state-out", st, x, "-o", y, NULL};
    expect_refused(2, "--mask", masked);
    const char *reference[] = {"run", "--variant", "simple", "--causal", "--impl", "reference", "--state-in", st, x,
                               "-o", y, NULL};
    expect_refused(2, "--impl reference", reference);
    /* past a learned bias's Tmax = 12: 9 rows, then 9 more */
    char wpath[4096], xin[4096];
    snprintf(wpath, sizeof wpath, "%s/torch/rish_full/weights.safetensors", harness_testdata());
    snprintf(xin, sizeof xin, "%s/torch/rish_full/x.npy", harness_testdata());   /* [2, 9, 16] */
    const char *first[] = {"run", "--variant", "full", "--causal", "--weights", wpath, "--state-out", st, xin, "-o",
                           y, NULL};
    harness_result r;
    assert_int_equal(harness_run(&r, first, NULL, 0), 0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    const char *again[] = {"run", "--variant", "full", "--causal", "--weights", wpath, "--state-in", st,
                           "--state-out", st, xin, "-o", y, NULL};
    expect_refused(1, "Tmax = 12", again);
    /* the state is what it was: position 9 */
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(st, &f, &err), AFT_OK);
    int found = 0;
    for (size_t i = 0; i < aft_st_metadata_count(f); i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        if (strcmp(k, "position") == 0) found = strcmp(v, "9") == 0;
    }
    aft_st_close(f);
    assert_true(found);
    /* another batch size, a window the state was not made for */
    const char *other[] = {"run", "--variant", "local", "--window", "3", "--causal", "--weights", wpath, "--state-in",
                           st, xin, "-o", y, NULL};
    expect_refused(1, "variant full", other);
    free(x); free(st); free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeded_variants),
        cmocka_unit_test(test_weights_and_layouts),
        cmocka_unit_test(test_conv_shared_keys_and_bare),
        cmocka_unit_test(test_process_boundary_same_bytes),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
