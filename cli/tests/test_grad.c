/* test_grad.c - aft grad: every gradient of the PyTorch fixtures
 * (torch.autograd in float64) within 1e-5 + 1e-4 |g| under the fixture's
 * own names and shapes, for both of each case's command lines; the fast
 * kernels against --impl reference for every variant, the layer and the
 * bare operator, both layouts and a grid; a few entries of dX, dq and dk
 * against central differences of L = sum(Y * dY) computed by aft run; the
 * default dY of ones; .npz output; --timing; and the refusals, which leave
 * no file behind. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "aft.h"
#include "harness.h"

static char *tmp(const char *name)
{
    char *p = harness_tmp(name);
    assert_non_null(p);
    return p;
}

static char *data(const char *rel)
{
    char *p = harness_path(harness_testdata(), rel);
    assert_non_null(p);
    return p;
}

/* runs aft with args (NULL-terminated) and asserts it exits with want */
static void run_expect(const char *const *args, int want)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != want) fail_msg("exit %d (want %d): %s", r.exit_code, want, r.err);
    harness_result_free(&r);
}

/* a deterministic pseudo-random float in [-1, 1) */
static float noise(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (double)(1ULL << 23) - 1.0);
}

static void write_random(const char *path, size_t ndim, const size_t *shape, uint64_t seed)
{
    size_t n = 1;
    for (size_t i = 0; i < ndim; i++) n *= shape[i];
    float *x = malloc(n * sizeof *x + 1);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = noise(&seed);
    aft_tensor t = harness_tensor(AFT_F32, x, ndim, shape);
    aft_error err;
    assert_int_equal(aft_npy_write(path, &t, &err), AFT_OK);
    free(x);
}

/* every tensor of want is in got with the same shape and within
 * atol + rtol |want|; got holds nothing else. band > 0: a (T, T) tensor
 * named "wbias" is compared inside |i - j| < band only, and must be 0
 * outside it */
static void files_close_band(const char *got, const char *want, double atol, double rtol, size_t band)
{
    aft_st_file *g, *w;
    aft_error err;
    if (aft_st_open(got, &g, &err) != AFT_OK) fail_msg("%s: %s", got, err.msg);
    if (aft_st_open(want, &w, &err) != AFT_OK) fail_msg("%s: %s", want, err.msg);
    assert_int_equal(aft_st_count(g), aft_st_count(w));
    for (size_t i = 0; i < aft_st_count(w); i++) {
        const char *name;
        const aft_tensor *tw = aft_st_get(w, i, &name), *tg = aft_st_find(g, name);
        if (!tg) fail_msg("%s: no '%s'", got, name);
        assert_int_equal(tg->ndim, tw->ndim);
        for (size_t d = 0; d < tw->ndim; d++) assert_int_equal(tg->shape[d], tw->shape[d]);
        assert_int_equal(tg->dtype, AFT_F32);
        assert_int_equal(tw->dtype, AFT_F32);
        /* copies: a .npz member's data need not be aligned for floats */
        float *a, *b;
        aft_error e2;
        assert_int_equal(aft_tensor_to_f32(tg, &a, &e2), AFT_OK);
        assert_int_equal(aft_tensor_to_f32(tw, &b, &e2), AFT_OK);
        int banded = band && strcmp(name, "wbias") == 0;
        for (size_t j = 0; j < tw->nelem; j++) {
            size_t r = banded ? j / tw->shape[1] : 0, c = banded ? j % tw->shape[1] : 0;
            if (banded && (r > c ? r - c : c - r) >= band) {
                if (a[j] != 0.0f) fail_msg("%s: '%s'[%zu] is %.9g outside the window", got, name, j, (double)a[j]);
                continue;
            }
            if (!(fabs((double)a[j] - b[j]) <= atol + rtol * fabs((double)b[j])))
                fail_msg("%s: '%s'[%zu] is %.9g, want %.9g", got, name, j, (double)a[j], (double)b[j]);
        }
        free(a);
        free(b);
    }
    aft_st_close(g);
    aft_st_close(w);
}

static void files_close(const char *got, const char *want, double atol, double rtol)
{
    files_close_band(got, want, atol, rtol, 0);
}

/* ---------------------------------------------------------------- PyTorch */

/* a case's args file, split at spaces, with mask.npy made a path */
static size_t read_args(const char *cdir, const char *file, char **argv, size_t cap, char *buf, size_t bufsz)
{
    char rel[256], *text;
    snprintf(rel, sizeof rel, "torch/%s/%s", cdir, file);
    char *p = data(rel);
    if (access(p, F_OK) != 0) {
        free(p);
        return 0;
    }
    assert_int_equal(harness_read_file(p, &text, NULL), 0);
    free(p);
    size_t n = 0, used = 0;
    for (char *tok = strtok(text, " \n"); tok && n < cap; tok = strtok(NULL, " \n")) {
        if (strcmp(tok, "mask.npy") == 0) {
            char mrel[256];
            snprintf(mrel, sizeof mrel, "torch/%s/mask.npy", cdir);
            char *mp = data(mrel);
            snprintf(buf + used, bufsz - used, "%s", mp);
            free(mp);
        } else {
            snprintf(buf + used, bufsz - used, "%s", tok);
        }
        argv[n++] = buf + used;
        used += strlen(buf + used) + 1;
        assert_true(used < bufsz);
    }
    free(text);
    return n;
}

/* rish-16's AFTLocal masks a copy of its wbias at each forward pass, so
 * torch's wbias gradient is a full bias's: --variant full matches it whole
 * (args_alt.txt), --variant local --window S inside the window, and is 0
 * outside (band S) */
static void torch_case(const char *cdir, const char *args_file, size_t band)
{
    char *av[40], buf[2048], rel[256];
    size_t n = 0;
    av[n++] = "grad";
    size_t k = read_args(cdir, args_file, av + n, 20, buf, sizeof buf);
    if (!k) return;
    n += k;
    snprintf(rel, sizeof rel, "torch/%s/weights.safetensors", cdir);
    char *w = data(rel);
    snprintf(rel, sizeof rel, "torch/%s/dy.npy", cdir);
    char *dy = data(rel);
    snprintf(rel, sizeof rel, "torch/%s/x.npy", cdir);
    char *x = data(rel);
    snprintf(rel, sizeof rel, "torch/%s/grads.safetensors", cdir);
    char *want = data(rel);
    char *out = tmp("torch.safetensors");
    const char *tail[] = {"--weights", w, "--grad-output", dy, x, "-o", out};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) av[n++] = (char *)tail[i];
    av[n] = NULL;
    run_expect((const char *const *)av, 0);
    files_close_band(out, want, 1e-5, 1e-4, band);
    free(w); free(dy); free(x); free(want); free(out);
}

static void test_torch_fixtures(void **state)
{
    (void)state;
    const char *cases[] = {"labml_local", "rish_full", "rish_local", "rish_simple"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t band = strcmp(cases[i], "rish_local") == 0 ? 3 : 0;
        torch_case(cases[i], "args.txt", band);
        torch_case(cases[i], "args_alt.txt", 0);
    }
}

/* ---------------------------------------------------------------- fast against reference */

/* aft grad opts... IN --dy DY, fast and --impl reference, agree */
static void fast_vs_reference(const char *const *opts, const char *in, const char *dy)
{
    char *f = tmp("fast.safetensors"), *r = tmp("ref.safetensors");
    const char *av[32];
    size_t n = 0;
    av[n++] = "grad";
    for (size_t i = 0; opts[i]; i++) av[n++] = opts[i];
    av[n++] = in;
    av[n++] = "--grad-output";
    av[n++] = dy;
    av[n++] = "-o";
    av[n++] = f;
    av[n] = NULL;
    run_expect(av, 0);
    av[n - 1] = r;
    av[n++] = "--impl";
    av[n++] = "reference";
    av[n] = NULL;
    run_expect(av, 0);
    files_close(f, r, 1e-5, 1e-4);
    free(f);
    free(r);
}

static void test_layer_fast_vs_reference(void **state)
{
    (void)state;
    char *x = tmp("x.npy"), *dy = tmp("dy.npy"), *xt = tmp("xt.npy"), *dyt = tmp("dyt.npy");
    size_t s3[3] = {2, 21, 12}, st[3] = {21, 2, 12};
    write_random(x, 3, s3, 1);
    write_random(dy, 3, s3, 2);
    write_random(xt, 3, st, 3);
    write_random(dyt, 3, st, 4);
    const char *cfgs[][8] = {
        {"--variant", "full", NULL},
        {"--variant", "full", "--causal", NULL},
        {"--variant", "local", "--window", "4", NULL},
        {"--variant", "local", "--window", "4", "--causal", NULL},
        {"--variant", "simple", "--d-hidden", "20", NULL},
        {"--variant", "simple", "--causal", NULL},
        {"--variant", "conv", "--window", "3", "--heads", "4", NULL},
        {"--variant", "conv", "--window", "5", "--heads", "2", "--causal", NULL},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        fast_vs_reference(cfgs[i], x, dy);
        const char *tbd[12];
        size_t n = 0;
        for (; cfgs[i][n]; n++) tbd[n] = cfgs[i][n];
        tbd[n++] = "--layout";
        tbd[n++] = "tbd";
        tbd[n] = NULL;
        fast_vs_reference(tbd, xt, dyt);
    }
    free(x); free(dy); free(xt); free(dyt);
}

static void test_grid_fast_vs_reference(void **state)
{
    (void)state;
    char *x = tmp("g.npy"), *dy = tmp("gdy.npy");
    size_t s4[4] = {2, 4, 5, 8};
    write_random(x, 4, s4, 5);
    write_random(dy, 4, s4, 6);
    const char *a[] = {"--variant", "local", "--window", "2", NULL};
    const char *b[] = {"--variant", "conv", "--window", "2", "--heads", "2", "--causal", NULL};
    fast_vs_reference(a, x, dy);
    fast_vs_reference(b, x, dy);
    free(x);
    free(dy);
}

/* the bare operator's q, k (kc channels), v, and a bias file */
static void write_qkv(const char *path, size_t B, size_t T, size_t C, size_t kc, uint64_t seed)
{
    size_t n = B * T * C, nk = B * T * kc;
    float *q = malloc(n * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(n * sizeof *v);
    assert_true(q && k && v);
    for (size_t i = 0; i < n; i++) {
        q[i] = noise(&seed);
        v[i] = noise(&seed);
    }
    for (size_t i = 0; i < nk; i++) k[i] = 2.0f * noise(&seed);
    size_t sq[3] = {B, T, C}, sk[3] = {B, T, kc};
    aft_tensor ts[3] = {harness_tensor(AFT_F32, q, 3, sq), harness_tensor(AFT_F32, k, 3, sk),
                        harness_tensor(AFT_F32, v, 3, sq)};
    const char *names[3] = {"q", "k", "v"};
    aft_error err;
    assert_int_equal(aft_st_write(path, names, ts, 3, NULL, 0, &err), AFT_OK);
    free(q); free(k); free(v);
}

static void write_bias(const char *path, const char *name, size_t rows, size_t cols, uint64_t seed)
{
    size_t shape[2] = {rows, cols};
    float *b = malloc(rows * cols * sizeof *b);
    assert_non_null(b);
    for (size_t i = 0; i < rows * cols; i++) b[i] = noise(&seed);
    aft_tensor t = harness_tensor(AFT_F32, b, 2, shape);
    aft_error err;
    assert_int_equal(aft_st_write(path, &name, &t, 1, NULL, 0, &err), AFT_OK);
    free(b);
}

static void test_bare_fast_vs_reference(void **state)
{
    (void)state;
    char *qkv = tmp("qkv.safetensors"), *qkvh = tmp("qkvh.safetensors"), *dy = tmp("bdy.npy");
    char *dense = tmp("dense.safetensors"), *conv = tmp("conv.safetensors");
    write_qkv(qkv, 2, 17, 8, 8, 7);
    write_qkv(qkvh, 2, 17, 8, 2, 8);
    size_t s3[3] = {2, 17, 8};
    write_random(dy, 3, s3, 9);
    write_bias(dense, "wbias", 20, 20, 10);
    write_bias(conv, "pos_bias", 2, 7, 11);
    const char *a[] = {"--variant", "full", "--weights", dense, NULL};
    const char *b[] = {"--variant", "local", "--window", "3", "--causal", "--weights", dense, NULL};
    const char *c[] = {"--variant", "conv", "--weights", conv, NULL};
    const char *d[] = {"--variant", "simple", NULL};
    fast_vs_reference(a, qkv, dy);
    fast_vs_reference(b, qkv, dy);
    fast_vs_reference(c, qkvh, dy);
    fast_vs_reference(c, qkv, dy);
    fast_vs_reference(d, qkv, dy);
    /* the names and shapes written: q, k (the file's kc), v, and the bias */
    char *out = tmp("bare.safetensors");
    const char *av[] = {"grad", "--variant", "conv", "--weights", conv, qkvh, "--dy", dy, "-o", out, NULL};
    run_expect(av, 0);
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(out, &f, &err), AFT_OK);
    assert_int_equal(aft_st_count(f), 4);
    assert_int_equal(aft_st_find(f, "k")->shape[2], 2);
    assert_int_equal(aft_st_find(f, "pos_bias")->shape[1], 7);
    aft_st_close(f);
    free(qkv); free(qkvh); free(dy); free(dense); free(conv); free(out);
}

/* ---------------------------------------------------------------- central differences */

/* L = sum(Y * dY) of aft run --impl reference on x (a .npy) */
static double loss_of(const char *const *opts, const char *x, const float *dyv)
{
    char *y = tmp("fd_y.npy");
    const char *av[24];
    size_t n = 0;
    av[n++] = "run";
    for (size_t i = 0; opts[i]; i++) av[n++] = opts[i];
    av[n++] = "--impl";
    av[n++] = "reference";
    av[n++] = x;
    av[n++] = "-o";
    av[n++] = y;
    av[n] = NULL;
    run_expect(av, 0);
    aft_tensor t;
    aft_error err;
    assert_int_equal(aft_npy_read(y, &t, NULL, &err), AFT_OK);
    double L = 0.0;
    for (size_t i = 0; i < t.nelem; i++) L += (double)((float *)t.data)[i] * dyv[i];
    aft_tensor_free(&t);
    free(y);
    return L;
}

/* a few entries of dX: (L(x + h e_i) - L(x - h e_i)) / 2h against aft grad */
static void check_dx(const char *const *opts, size_t ndim, const size_t *shape)
{
    char *x = tmp("fd_x.npy"), *xp = tmp("fd_xp.npy"), *dy = tmp("fd_dy.npy"), *g = tmp("fd_g.safetensors");
    write_random(x, ndim, shape, 12);
    write_random(dy, ndim, shape, 13);
    const char *av[24];
    size_t n = 0;
    av[n++] = "grad";
    for (size_t i = 0; opts[i]; i++) av[n++] = opts[i];
    av[n++] = x;
    av[n++] = "--dy";
    av[n++] = dy;
    av[n++] = "-o";
    av[n++] = g;
    av[n] = NULL;
    run_expect(av, 0);
    aft_tensor xt, dyt;
    aft_error err;
    assert_int_equal(aft_npy_read(x, &xt, NULL, &err), AFT_OK);
    assert_int_equal(aft_npy_read(dy, &dyt, NULL, &err), AFT_OK);
    aft_st_file *f;
    assert_int_equal(aft_st_open(g, &f, &err), AFT_OK);
    const float *dx = (const float *)aft_st_find(f, "input")->data;
    float *xv = malloc(xt.nbytes);
    assert_non_null(xv);
    memcpy(xv, xt.data, xt.nbytes);
    aft_tensor xw = harness_tensor(AFT_F32, xv, xt.ndim, xt.shape);
    const double h = 1e-2;
    for (size_t j = 0; j < 4; j++) {
        size_t i = (j * 7919 + 3) % xt.nelem;
        float keep = xv[i];
        xv[i] = keep + (float)h;
        assert_int_equal(aft_npy_write(xp, &xw, &err), AFT_OK);
        double lp = loss_of(opts, xp, dyt.data);
        xv[i] = keep - (float)h;
        assert_int_equal(aft_npy_write(xp, &xw, &err), AFT_OK);
        double lm = loss_of(opts, xp, dyt.data);
        xv[i] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - dx[i]) > 2e-3 * (1.0 + fabs(fd)))
            fail_msg("dX[%zu]: aft grad %.7g, central difference %.7g", i, (double)dx[i], fd);
    }
    aft_st_close(f);
    free(xv);
    aft_tensor_free(&xt);
    aft_tensor_free(&dyt);
    free(x); free(xp); free(dy); free(g);
}

static void test_central_differences(void **state)
{
    (void)state;
    const size_t s3[3] = {2, 9, 6}, t3[3] = {9, 2, 6}, s4[4] = {1, 3, 4, 6};
    const char *a[] = {"--variant", "local", "--window", "3", "--causal", NULL};
    const char *b[] = {"--variant", "full", "--layout", "tbd", NULL};
    const char *c[] = {"--variant", "conv", "--window", "2", "--heads", "2", NULL};
    check_dx(a, 3, s3);
    check_dx(b, 3, t3);
    check_dx(c, 4, s4);
}

/* ---------------------------------------------------------------- options and output */

static void test_default_dy_is_ones(void **state)
{
    (void)state;
    char *x = tmp("o_x.npy"), *ones = tmp("ones.npy"), *a = tmp("o_a.safetensors"), *b = tmp("o_b.safetensors");
    size_t s[2] = {11, 8};
    write_random(x, 2, s, 14);
    float one[88];
    for (size_t i = 0; i < 88; i++) one[i] = 1.0f;
    aft_tensor t = harness_tensor(AFT_F32, one, 2, s);
    aft_error err;
    assert_int_equal(aft_npy_write(ones, &t, &err), AFT_OK);
    const char *av1[] = {"grad", "--variant", "simple", x, "-o", a, NULL};
    const char *av2[] = {"grad", "--variant", "simple", x, "--grad-output", ones, "-o", b, NULL};
    run_expect(av1, 0);
    run_expect(av2, 0);
    files_close(a, b, 0.0, 0.0);
    free(x); free(ones); free(a); free(b);
}

static void test_npz_and_timing(void **state)
{
    (void)state;
    char *x = tmp("n_x.npy"), *npz = tmp("n.npz"), *st = tmp("n.safetensors"), *js = tmp("n.json");
    size_t s[3] = {1, 10, 8};
    write_random(x, 3, s, 15);
    const char *av1[] = {"grad", "--variant", "local", "--window", "2", x, "-o", npz, NULL};
    const char *av2[] = {"grad", "--variant", "local", "--window", "2", x, "-o", st, "--timing", js,
                         "--repeat", "3", NULL};
    run_expect(av1, 0);
    run_expect(av2, 0);
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(npz, &f, &err), AFT_OK);
    assert_string_equal(aft_st_format(f), "npz");
    aft_st_close(f);
    files_close(npz, st, 0.0, 0.0);
    char *text;
    assert_int_equal(harness_read_file(js, &text, NULL), 0);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "pass")->valuestring, "forward and backward");
    assert_int_equal(cJSON_GetObjectItem(j, "repeat")->valueint, 3);
    assert_true(cJSON_GetObjectItem(j, "compute_ms")->valuedouble > 0.0);
    assert_true(cJSON_GetObjectItem(j, "forward_ms")->valuedouble > 0.0);
    assert_true(cJSON_GetObjectItem(j, "backward_ms")->valuedouble ==
                cJSON_GetObjectItem(j, "compute_ms")->valuedouble);
    assert_true(cJSON_GetObjectItem(j, "backward_over_forward")->valuedouble > 0.0);
    cJSON_Delete(j);
    free(text);
    free(x); free(npz); free(st); free(js);
}

/* a refusal: exit status want, one line naming needle, no output file */
static void refused(const char *const *args, int want, const char *needle, const char *out)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != want || !strstr(r.err, needle))
        fail_msg("exit %d (want %d), stderr: %s (want '%s')", r.exit_code, want, r.err, needle);
    if (want == 1) assert_int_equal(harness_count_lines(r.err), 1);
    harness_result_free(&r);
    assert_int_not_equal(access(out, F_OK), 0);
}

static void test_refusals(void **state)
{
    (void)state;
    char *x = tmp("r_x.npy"), *dy = tmp("r_dy.npy"), *out = tmp("r_out.safetensors");
    size_t s[3] = {2, 6, 4}, w[3] = {2, 7, 4};
    write_random(x, 3, s, 16);
    write_random(dy, 3, w, 17);
    const char *a[] = {"grad", x, "--grad-output", dy, "-o", out, NULL};
    refused(a, 1, "dY is [2, 7, 4] but the output is [2, 6, 4]", out);
    const char *b[] = {"grad", "-", "--grad-output", "-", "-o", out, NULL};
    refused(b, 2, "only one of INPUT and --grad-output", out);
    const char *c[] = {"grad", "--causal", "--state-out", out, x, NULL};
    refused(c, 2, "--state-out", out);
    char *dyt = tmp("r_dyt.npy");
    size_t t[3] = {6, 2, 4};
    write_random(dyt, 3, t, 18);
    const char *d[] = {"grad", x, "--grad-output", dyt, "--layout", "tbd", "-o", out, NULL};
    refused(d, 1, "dY is [6, 2, 4] but the output is [2, 6, 4]", out);
    free(dyt);
    const char *e[] = {"grad", x, "--max-memory", "1K", "-o", out, NULL};
    refused(e, 1, "--max-memory allows", out);
    free(x); free(dy); free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_fixtures),
        cmocka_unit_test(test_layer_fast_vs_reference),
        cmocka_unit_test(test_grid_fast_vs_reference),
        cmocka_unit_test(test_bare_fast_vs_reference),
        cmocka_unit_test(test_central_differences),
        cmocka_unit_test(test_default_dy_is_ones),
        cmocka_unit_test(test_npz_and_timing),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
