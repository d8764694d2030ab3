/* test_bench.c - `aft bench`: the JSON lines and the table it prints for a
 * sweep, the phases of the fastest run, --impl both against the float64
 * reference, --no-ceiling, the peak memory being the configuration's own,
 * its usage errors, and --plot's needs checked before anything is timed.
 *
 * bench runs each configuration in a child, started through
 * /proc/self/exe; under valgrind that names valgrind's own binary, so these
 * tests are skipped when $AFT_BIN is the valgrind wrapper (the kernels they
 * would run are covered under memcheck by cli_test_run).
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
#include <unistd.h>

#include "aft.h"
#include "harness.h"

static void skip_under_valgrind(void)
{
    if (strstr(harness_aft_bin(), "valgrind")) {
        print_message("skipped: aft bench starts its children through /proc/self/exe (valgrind's binary)\n");
        skip();
    }
}

static double num(const cJSON *j, const char *key)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(f)) fail_msg("JSON field %s missing or not a number", key);
    return f->valuedouble;
}

/* one JSON object per configuration, every combination, each with sane
 * figures: phases of the fastest run add up to no more than its time */
static void test_json_sweep(void **state)
{
    (void)state;
    skip_under_valgrind();
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "33,64", "--d-model", "16", "--variant",
                                 "full,local,simple,conv", "--window", "4", "--heads", "2", "--repeat", "2",
                                 "--threads", "2", "--no-ceiling", "--json"),
                     0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(harness_count_lines(r.out), 8);
    int seen[4][2] = {{0}};
    static const char *const names[4] = {"full", "local", "simple", "conv"};
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "variant");
        assert_true(cJSON_IsString(v));
        int vi = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(v->valuestring, names[i]) == 0) vi = i;
        assert_true(vi >= 0);
        double T = num(j, "seq_len");
        assert_true(T == 33 || T == 64);
        seen[vi][T == 64]++;
        assert_true(num(j, "d_model") == 16 && num(j, "d_hidden") == 16 && num(j, "batch") == 1);
        assert_true(num(j, "threads") == 2);
        double ms = num(j, "compute_ms"), ms_min = num(j, "compute_min_ms");
        assert_true(ms_min > 0 && ms_min <= ms);
        double p = num(j, "projections_ms"), o = num(j, "operator_ms"), out = num(j, "output_ms");
        assert_true(p >= 0 && o >= 0 && out >= 0);
        assert_true(p + o + out <= ms_min);
        assert_true(num(j, "gflop") > 0);
        assert_true(fabs(num(j, "gflop_per_s") - num(j, "gflop") / (ms * 1e-3)) <= 1e-6 * num(j, "gflop_per_s"));
        assert_true(fabs(num(j, "tokens_per_s") - T / (ms * 1e-3)) <= 1e-6 * num(j, "tokens_per_s"));
        assert_true(num(j, "peak_rss_bytes") > 0);
        /* --no-ceiling: no ceiling figures */
        assert_null(cJSON_GetObjectItemCaseSensitive(j, "sgemm_ceiling_gflop_per_s"));
        assert_null(cJSON_GetObjectItemCaseSensitive(j, "ceiling_fraction"));
        cJSON_Delete(j);
    }
    for (int i = 0; i < 4; i++) assert_true(seen[i][0] == 1 && seen[i][1] == 1);
    harness_result_free(&r);
}

/* --precision f32,bf16: each configuration once in each, side by side,
 * each row naming its precision and the engine; the table's prec column
 * and, with an engine, the bf16 floor in the first line */
static void test_precision(void **state)
{
    (void)state;
    skip_under_valgrind();
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "40", "--d-model", "16", "--variant", "full,local",
                                 "--repeat", "1", "--threads", "2", "--precision", "f32,bf16", "--json",
                                 "--no-ceiling"),
                     0);
    assert_int_equal(r.exit_code, 0);
    int engine = strcmp(aft_bf16_engine_in_use(), "none") != 0;
    if (!engine) assert_non_null(strstr(r.err, "--precision bf16: this CPU has no bf16 arithmetic"));
    const char *p = r.out;
    static const char *const want[4][2] = {{"full", "f32"}, {"full", "bf16"}, {"local", "f32"}, {"local", "bf16"}};
    for (int i = 0; i < 4; i++) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        char *line = strndup(p, (size_t)(nl - p));
        cJSON *j = cJSON_Parse(line);
        free(line);
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "variant")->valuestring, want[i][0]);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "precision")->valuestring, want[i][1]);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "bf16_engine")->valuestring,
                            aft_bf16_engine_in_use());
        cJSON_Delete(j);
        p = nl + 1;
    }
    assert_true(*p == 0);
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "40", "--d-model", "16", "--variant", "simple",
                                 "--repeat", "1", "--threads", "2", "--precision", "bf16"),
                     0);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, engine ? "; bf16 floor " : "; bf16 floor -: no bf16 engine"));
    assert_non_null(strstr(r.out, " prec "));
    assert_non_null(strstr(r.out, " bf16 "));
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN(&r, "bench", "--generate", "--precision", "f32,bf16"), 0);
    assert_int_equal(r.exit_code, 2);
    harness_result_free(&r);
}

/* The peak memory of a configuration is its own: children are forked from
 * the process that just ran the 2048^3 ceiling product (48 MiB of buffers),
 * and a child starts with its parent's resident pages counted, so those
 * must have gone back to the kernel. A tiny configuration stays far below
 * 48 MiB. (A sanitizer build's shadow memory would swamp the figure.) */
static void test_peak_is_the_runs_own(void **state)
{
    (void)state;
    skip_under_valgrind();
    if (getenv("ASAN_OPTIONS")) {
        print_message("skipped: a sanitizer build's resident memory is mostly its own\n");
        skip();
    }
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "32", "--d-model", "16", "--variant", "simple",
                                 "--repeat", "1", "--threads", "2", "--json"),
                     0);
    assert_int_equal(r.exit_code, 0);
    cJSON *j = cJSON_Parse(r.out);
    assert_non_null(j);
    assert_true(num(j, "sgemm_ceiling_gflop_per_s") > 0);
    double peak = num(j, "peak_rss_bytes");
    print_message("peak of T = 32, d = 16: %.1f MiB\n", peak / 1048576.0);
    assert_true(peak > 0);
    assert_true(peak < 40.0 * 1048576.0);
    cJSON_Delete(j);
    harness_result_free(&r);
}

/* --impl both: the fast layer against the float64 reference, within the
 * accuracy the library promises */
static void test_impl_both(void **state)
{
    (void)state;
    skip_under_valgrind();
    static const char *const variants[] = {"full", "local", "simple", "conv"};
    for (size_t i = 0; i < 4; i++) {
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "40", "--d-model", "24", "--variant", variants[i],
                                     "--window", "5", "--heads", "3", "--causal", "--repeat", "1", "--impl", "both",
                                     "--no-ceiling", "--json"),
                         0);
        assert_int_equal(r.exit_code, 0);
        cJSON *j = cJSON_Parse(r.out);
        assert_non_null(j);
        double diff = num(j, "max_abs_error"), ref = num(j, "max_abs_reference");
        assert_true(ref > 0);
        if (!(diff <= 2e-5 * (ref > 1 ? ref : 1)))
            fail_msg("%s: max |fast - reference| %g (max |reference| %g)", variants[i], diff, ref);
        cJSON_Delete(j);
        harness_result_free(&r);
    }
}

/* the table: a header, the columns named in --help, one row per
 * configuration; with --no-ceiling the ceiling is "not measured" and its
 * column "-" */
static void test_table(void **state)
{
    (void)state;
    skip_under_valgrind();
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "20,30,50", "--d-model", "8", "--variant", "simple",
                                 "--repeat", "1", "--threads", "1", "--no-ceiling"),
                     0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(harness_count_lines(r.out), 5);
    assert_non_null(strstr(r.out, "1 thread; projections "));
    assert_non_null(strstr(r.out, "; sgemm ceiling not measured\n"));
    static const char *const cols[] = {"variant", "causal", "min ms", "GFLOP/s", "tokens/s", "peak MiB", "ceil",
                                       "proj"};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) assert_non_null(strstr(r.out, cols[i]));
    size_t rows = 0;
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "simple ", 7) != 0) continue;
        rows++;
        char variant[16], causal[8], ceil_txt[8];
        size_t T, B, d;
        double ms, ms_min, gf, tok, mib, proj;
        assert_int_equal(sscanf(line, "%15s %7s %zu %zu %zu %lf %lf %lf %lf %lf %7s %lf%%", variant, causal, &T, &B,
                                &d, &ms, &ms_min, &gf, &tok, &mib, ceil_txt, &proj),
                         12);
        assert_string_equal(causal, "no");
        assert_true(T == 20 || T == 30 || T == 50);
        assert_true(B == 1 && d == 8);
        assert_true(ms_min > 0 && ms_min <= ms && mib > 0);
        assert_string_equal(ceil_txt, "-");
        assert_true(proj >= 0 && proj <= 100);
    }
    assert_int_equal(rows, 3);
    harness_result_free(&r);
}

/* usage errors: exit 2, one line naming the problem, nothing on stdout */
/* --stream: a token's step, the one-shot time a token, the floor, and the
 * chunked run, for each causal variant, in JSON and in the table */
static void test_stream(void **state)
{
    (void)state;
    skip_under_valgrind();
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "70", "--d-model", "16", "--variant", "local,simple,conv,full",
                                 "--window", "4", "--heads", "2", "--causal", "--stream", "--chunk", "30", "--repeat",
                                 "2", "--no-ceiling", "--json"),
                     0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(harness_count_lines(r.out), 4);
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        assert_true(num(j, "stream_us_per_token") > 0 && num(j, "one_shot_us_per_token") > 0);
        assert_true(num(j, "floor_us_per_token") > 0 && num(j, "chunk") == 30);
        assert_true(num(j, "chunked_ms") > 0);
        assert_true(fabs(num(j, "chunked_over_one_shot") - num(j, "chunked_ms") / num(j, "compute_min_ms")) < 1e-9 *
                    num(j, "chunked_over_one_shot") + 1e-12);
        assert_true(fabs(num(j, "one_shot_us_per_token") - num(j, "compute_min_ms") * 1e3 / 70) < 1e-6);
        cJSON_Delete(j);
    }
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "40", "--d-model", "8", "--variant", "simple", "--causal",
                                 "--stream", "--repeat", "1", "--no-ceiling"),
                     0);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, "tok us"));
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN(&r, "bench", "--stream", "--seq-len", "40"), 0);
    assert_int_equal(r.exit_code, 2);
    assert_non_null(strstr(r.err, "--causal"));
    harness_result_free(&r);
}

/* --grad: the backward pass's time and its ratio to the forward pass, for
 * every variant, causal or not, in JSON and in the table */
static void test_grad(void **state)
{
    (void)state;
    skip_under_valgrind();
    harness_result r;
    for (int causal = 0; causal < 2; causal++) {
        assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "50", "--d-model", "16", "--variant",
                                     "local,simple,conv,full", "--window", "4", "--heads", "2",
                                     causal ? "--causal" : "--batch", causal ? "--grad" : "2",
                                     causal ? "--no-ceiling" : "--grad", "--repeat", "3", "--json"),
                         0);
        assert_int_equal(r.exit_code, 0);
        assert_int_equal(harness_count_lines(r.out), 4);
        char *save = NULL;
        for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            cJSON *j = cJSON_Parse(line);
            assert_non_null(j);
            assert_true(num(j, "backward_ms") > 0 && num(j, "backward_min_ms") <= num(j, "backward_ms"));
            /* the median of the calls' ratios to the forward pass run after
             * each: a positive finite number (the forward's own median is
             * measured apart, at other moments) */
            assert_true(num(j, "backward_over_forward") > 0 && isfinite(num(j, "backward_over_forward")));
            cJSON_Delete(j);
        }
        harness_result_free(&r);
    }
    assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "40", "--d-model", "8", "--variant", "conv", "--grid",
                                 "5,8", "--window", "2", "--heads", "2", "--grad", "--repeat", "1", "--no-ceiling"),
                     0);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.out, "grad ms"));
    harness_result_free(&r);
}

/* the OpenBLAS kernel a bench ran with, under OPENBLAS_CORETYPE=core (NULL: unset) */
static char *bench_core(const char *core)
{
    const char *saved = getenv("OPENBLAS_CORETYPE");
    char *keep = saved ? strdup(saved) : NULL;
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    harness_result r;
    int rc = HARNESS_RUN(&r, "bench", "--seq-len", "32", "--d-model", "16", "--variant", "simple", "--repeat", "1",
                         "--threads", "1", "--no-ceiling", "--json");
    if (keep) setenv("OPENBLAS_CORETYPE", keep, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    free(keep);
    assert_int_equal(rc, 0);
    if (r.exit_code) fail_msg("aft bench: %s", r.err);
    cJSON *j = cJSON_Parse(r.out);
    assert_non_null(j);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "blas_core");
    assert_true(cJSON_IsString(c));
    char *out = strdup(c->valuestring);
    cJSON_Delete(j);
    harness_result_free(&r);
    return out;
}

/* left to itself, aft multiplies with OpenBLAS's kernels for a CPU with
 * AVX2 and FMA, not with the SSE3 fallback OpenBLAS takes for a CPU newer
 * than it knows; a core the user names is kept */
static void test_blas_core(void **state)
{
    (void)state;
    skip_under_valgrind();
    char *chosen = bench_core("Prescott");
    assert_string_equal(chosen, "Prescott");
    free(chosen);
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        print_message("skipped: this CPU has no AVX2 and FMA; SSE3's kernels are its own\n");
        skip();
    }
    char *own = bench_core(NULL);
    if (strcmp(own, "Prescott") == 0) fail_msg("aft ran OpenBLAS's SSE3 kernels (Prescott) on a CPU with AVX2");
    free(own);
}

static void test_usage_errors(void **state)
{
    (void)state;
    const char *const cases[][4] = {
        {"--repeat", "0", NULL, "--repeat"},
        {"--variant", "fast", NULL, "--variant"},
        {"--threads", "5000", NULL, "--threads"},
        {"--seq-len", "12,x", NULL, "--seq-len"},
        {"--window", "0", NULL, "--window"},
        {"--impl", "quick", NULL, "--impl"},
        {"--frobnicate", NULL, NULL, "--frobnicate"},
        {"--weights-dtype", "f8", NULL, "--weights-dtype"},
        {"--generate", "--weights-dtype", "f16", "--weights-dtype"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        harness_result r;
        const char *args[] = {"bench", cases[i][0], cases[i][1], cases[i][2], NULL};
        assert_int_equal(harness_run(&r, args, NULL, 0), 0);
        if (r.exit_code != 2 || r.out_len != 0 || !strstr(r.err, cases[i][3]))
            fail_msg("bench %s %s: exit %d, stderr '%s'", cases[i][0], cases[i][1] ? cases[i][1] : "", r.exit_code,
                     r.err);
        assert_true(harness_count_lines(r.err) <= 2);   /* the message, and maybe "Try 'aft bench --help'" */
        harness_result_free(&r);
    }
}

/* --weights-dtype: the seeded weights rounded to 16 bits and kept so; the
 * JSON says what the products hold (f32 at base, where they are widened),
 * and the layer's output is that of the same weights in float32 (aft run
 * on a file of them is checked byte for byte in test_model) */
static void test_weights_dtype(void **state)
{
    (void)state;
    skip_under_valgrind();
    const char *const dts[] = {"f16", "bf16", "f32"};
    for (int i = 0; i < 3; i++) {
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "40", "--d-model", "32", "--variant", "local",
                                     "--causal", "--stream", "--repeat", "1", "--no-ceiling", "--json",
                                     "--weights-dtype", dts[i]),
                         0);
        assert_int_equal(r.exit_code, 0);
        cJSON *j = cJSON_Parse(r.out), *dt = cJSON_GetObjectItemCaseSensitive(j, "weights_dtype"),
              *lv = cJSON_GetObjectItemCaseSensitive(j, "kernels");
        assert_true(cJSON_IsString(dt) && cJSON_IsString(lv));
        int base = strcmp(lv->valuestring, "base") == 0 || strcmp(lv->valuestring, "fixed") == 0;
        assert_string_equal(dt->valuestring, base ? "f32" : dts[i]);
        assert_true(num(j, "stream_us_per_token") > 0 && num(j, "floor_us_per_token") > 0);
        cJSON_Delete(j);
        harness_result_free(&r);
    }
}

/* --plot's format, directory and gnuplot are checked before the ceiling or
 * any configuration is timed: one line, nothing on stdout, no file */
static void test_plot_checked_first(void **state)
{
    /* under make test-valgrind aft is a wrapper script, which needs the
     * PATH this test empties; make test runs it on the real binary */
    if (harness_quick()) skip();
    (void)state;
    char *dir = harness_mkdtemp();
    assert_non_null(dir);
    char *svg = harness_path(dir, "t.svg"), *txt = harness_path(dir, "t.txt");
    const char *old = getenv("PATH");
    char *saved = old ? strdup(old) : NULL;
    setenv("PATH", dir, 1);   /* a PATH without gnuplot */
    const struct {
        const char *file;
        int exit_code;
        const char *says;
    } cases[] = {
        {svg, 1, "gnuplot"},
        {txt, 2, ".svg or .png"},
        {"/nonexistent-aft-dir/t.svg", 1, "cannot write there"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        harness_result r;
        double t0 = aft_now_ms();
        assert_int_equal(HARNESS_RUN(&r, "bench", "--seq-len", "64,128", "--d-model", "16", "--variant", "full,local",
                                     "--repeat", "1", "--plot", cases[i].file),
                         0);
        double ms = aft_now_ms() - t0;
        if (r.exit_code != cases[i].exit_code || r.out_len != 0 || !strstr(r.err, cases[i].says) ||
            harness_count_lines(r.err) != (cases[i].exit_code == 2 ? 2 : 1))   /* a usage error adds its hint line */
            fail_msg("--plot %s: exit %d, stdout '%s', stderr '%s'", cases[i].file, r.exit_code, r.out, r.err);
        print_message("--plot %s: refused after %.0f ms\n", cases[i].file, ms);
        harness_result_free(&r);
    }
    if (saved) setenv("PATH", saved, 1);
    else unsetenv("PATH");
    free(saved);
    assert_int_equal(access(svg, F_OK), -1);   /* no plot was begun */
    free(svg);
    free(txt);
    harness_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_sweep),
        cmocka_unit_test(test_impl_both),
        cmocka_unit_test(test_peak_is_the_runs_own),
        cmocka_unit_test(test_precision),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_grad),
        cmocka_unit_test(test_blas_core),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_weights_dtype),
        cmocka_unit_test(test_plot_checked_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
