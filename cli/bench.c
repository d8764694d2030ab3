/* bench.c - aft bench: time the layer over a sweep of sizes and variants;
 * with --generate, labml's model generating tokens (bench_generate.c).
 *
 * Each configuration runs in a child process (this program again, with the
 * hidden option --one), so the peak memory reported is that configuration's
 * own, not the largest so far. The parent measures the machine's
 * matrix-product ceiling once and prints a table or JSON lines. */
#include "cli.h"

#include <cblas.h>
#include <cJSON.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_LIST 32

typedef struct {
    size_t seq[MAX_LIST], nseq;
    size_t dm[MAX_LIST], ndm;
    aft_variant var[MAX_LIST];
    size_t nvar;
    size_t d_hidden, window, heads, batch, repeat;
    int causal, threads, json, impl_both, impl_ref, no_ceiling;
    int one;   /* --one: the child's mode */
    int stream;         /* --stream: the causal layer a token at a time, and in chunks */
    size_t chunk;       /* --chunk: the chunks' rows (default 4096) */
    int grad;           /* --grad: also the backward pass */
    size_t grid_h, grid_w;   /* --grid H,W: one sequence length, H * W, on that grid */
    const char *plot;
    int seq_set;        /* --seq-len was given */
    int generate;       /* --generate: the model generating --seq-len tokens */
    const char *weights;   /* --generate: the model (default: the shipped one) */
    const char *label;     /* --progress-label: the child's progress line starts so */
    aft_precision prec[2];   /* --precision: the products' number types, each a row */
    size_t nprec;
    int prec_set;            /* --precision was given: the table shows them */
    aft_dtype wdt;         /* --weights-dtype: the seeded weights rounded to f16 or bf16, kept so */
} bench_opts;

/* a comma-separated list of sizes */
static int parse_list(const char *s, size_t *out, size_t *n)
{
    *n = 0;
    char buf[512];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_LIST || aft_parse_size(tok, &out[*n]) != 0 || out[*n] == 0) return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_variants(const char *s, aft_variant *out, size_t *n)
{
    *n = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_LIST || aft_variant_from_name(tok, &out[*n]) != 0) return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

/* ---------------------------------------------------------------- options */

#define BENCH_OPTS(opts) ((bench_opts *)(opts))

static int set_seq_len(const cli_option *opt, void *opts, const char *v)
{
    if (parse_list(v, BENCH_OPTS(opts)->seq, &BENCH_OPTS(opts)->nseq))
        return cli_usage_error("bench", "--seq-len takes sizes like 1024,4096");
    BENCH_OPTS(opts)->seq_set = 1;
    return 0;
}

static int set_d_model(const cli_option *opt, void *opts, const char *v)
{
    if (parse_list(v, BENCH_OPTS(opts)->dm, &BENCH_OPTS(opts)->ndm))
        return cli_usage_error("bench", "--d-model takes sizes like 256,512");
    return 0;
}

static int set_variants(const cli_option *opt, void *opts, const char *v)
{
    if (parse_variants(v, BENCH_OPTS(opts)->var, &BENCH_OPTS(opts)->nvar))
        return cli_usage_error("bench", "--variant takes a list of full, local, simple, conv");
    return 0;
}

/* --d-hidden, --window, --heads, --batch: a whole number >= 1 */
static int set_positive(const cli_option *opt, void *opts, const char *v)
{
    size_t *out = (size_t *)((char *)opts + opt->field);
    if (aft_parse_size(v, out) || *out == 0)
        return cli_usage_error("bench", "%s takes a whole number >= 1", opt->name);
    return 0;
}

static int set_threads(const cli_option *opt, void *opts, const char *v)
{
    size_t n;
    if (aft_parse_size(v, &n) || n > 1024) return cli_usage_error("bench", "--threads takes 0 to 1024");
    BENCH_OPTS(opts)->threads = (int)n;
    return 0;
}

static int set_grid(const cli_option *opt, void *opts, const char *v)
{
    bench_opts *o = opts;
    size_t n;
    if (aft_parse_grid(v, &o->grid_h, &o->grid_w) != 0 || __builtin_mul_overflow(o->grid_h, o->grid_w, &n))
        return cli_usage_error("bench", "--grid takes H,W: two whole numbers >= 1, like 56,56");
    o->seq[0] = n;
    o->nseq = 1;
    return 0;
}

static int set_repeat(const cli_option *opt, void *opts, const char *v)
{
    size_t *r = &BENCH_OPTS(opts)->repeat;
    if (aft_parse_size(v, r) || *r == 0 || *r > 10000)
        return cli_usage_error("bench", "--repeat takes a whole number from 1 to 10000");
    return 0;
}

static int set_precision(const cli_option *opt, void *opts, const char *v)
{
    bench_opts *o = opts;
    char buf[64];
    o->nprec = 0;
    o->prec_set = 1;
    if (strlen(v) < sizeof buf) {
        strcpy(buf, v);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (o->nprec == 2 || aft_precision_from_name(tok, &o->prec[o->nprec]) != 0) {
                o->nprec = 0;
                break;
            }
            o->nprec++;
        }
    }
    if (o->nprec == 0) return cli_usage_error("bench", "--precision takes f32, bf16 or f32,bf16");
    return 0;
}

static int set_impl(const cli_option *opt, void *opts, const char *v)
{
    bench_opts *o = opts;
    if (strcmp(v, "both") == 0) o->impl_both = 1;
    else if (strcmp(v, "reference") == 0) o->impl_ref = 1;
    else if (strcmp(v, "fast") != 0) return cli_usage_error("bench", "--impl takes fast, reference or both");
    return 0;
}

static int set_weights_dtype(const cli_option *opt, void *opts, const char *v)
{
    (void)opt;
    aft_dtype *dt = &BENCH_OPTS(opts)->wdt;
    if (strcmp(v, "f32") == 0) *dt = AFT_F32;
    else if (strcmp(v, "f16") == 0) *dt = AFT_F16;
    else if (strcmp(v, "bf16") == 0) *dt = AFT_BF16;
    else return cli_usage_error("bench", "--weights-dtype takes f32, f16 or bf16, not '%s'", v);
    return 0;
}

#define NEEDS_VALUE "%s needs a value"
#define FIELD(f) offsetof(bench_opts, f)

static const cli_option options[] = {
    {"--seq-len", NULL, "L", "sequence lengths (default 1024,4096); --generate: tokens generated (default 256)",
     set_seq_len, 0, NEEDS_VALUE, 0},
    {"--d-model", NULL, "L", "model sizes D (default 256)", set_d_model, 0, NEEDS_VALUE, 0},
    {"--d-hidden", NULL, "N", "hidden size (default: D)", set_positive, FIELD(d_hidden), NEEDS_VALUE, 0},
    {"--variant", NULL, "L", "variants: full,local,simple,conv (default all four)", set_variants, 0, NEEDS_VALUE, 0},
    {"--window", NULL, "S", "window for local and conv (default 32)", set_positive, FIELD(window), NEEDS_VALUE, 0},
    {"--heads", NULL, "H", "heads for conv (default 4)", set_positive, FIELD(heads), NEEDS_VALUE, 0},
    {"--causal", NULL, NULL, "causal sums", cli_set_flag, FIELD(causal), NULL, 0},
    {"--grid", NULL, "H,W", "the layer on a grid of H x W tokens (T = H*W, instead of --seq-len): 2-D windows",
     set_grid, 0, NEEDS_VALUE, 0},
    {"--batch", NULL, "B", "batch size (default 1)", set_positive, FIELD(batch), NEEDS_VALUE, 0},
    {"--threads", NULL, "N", "threads (default: the cores aft may run on)", set_threads, 0, NEEDS_VALUE, 0},
    {"--repeat", NULL, "N", "timed runs per configuration (default 5; ms is the median)", set_repeat, 0,
     NEEDS_VALUE, 0},
    {"--impl", NULL, "fast|reference|both",
     "both: also run the float64 reference and report the largest difference (the reference is O(T^2 d): slow)",
     set_impl, 0, NEEDS_VALUE, 0},
    {"--precision", NULL, "L",
     "the products' number types, f32 and/or bf16 (default f32): each configuration runs in each, side by side; "
     "the header adds the machine's bf16 floor (its measured bf16 product rate) beside the sgemm ceiling, and a "
     "bf16 row's ceil column is its share of that floor",
     set_precision, 0, NEEDS_VALUE, 0},
    {"--json", NULL, NULL, "one JSON object per configuration instead of the table (its keys: JSON OUTPUT in man aft)",
     cli_set_flag, FIELD(json), NULL, 0},
    {"--no-ceiling", NULL, NULL, "skip measuring the matrix-product ceiling (the ceil column shows -)", cli_set_flag,
     FIELD(no_ceiling), NULL, 0},
    {"--plot", NULL, "FILE",
     "also draw time and memory against T (log-log) with gnuplot into FILE.svg or FILE.png (the format, the "
     "directory and gnuplot are checked before anything is timed)",
     cli_set_string, FIELD(plot), NEEDS_VALUE, 0},
    {"--stream", NULL, NULL,
     "with --causal: also decode a token at a time (the streaming state in memory, one row a step) and run the "
     "sequence in chunks of --chunk rows; columns tok us (a token's step), 1-shot us (the one-shot run's time a "
     "token), floor us (reading the weights once), chunked ms and its ratio to the one-shot run",
     cli_set_flag, FIELD(stream), NULL, 0},
    {"--chunk", NULL, "N", "--stream: rows a chunk (default 4096)", set_positive, FIELD(chunk), NEEDS_VALUE, 0},
    {"--weights-dtype", NULL, "f32|f16|bf16",
     "the seeded projection weights rounded to f16 or bf16 and kept 16-bit, as a 16-bit checkpoint is (default "
     "f32); not with --generate, whose --weights file says its own",
     set_weights_dtype, 0, NEEDS_VALUE, 0},
    {"--grad", NULL, NULL,
     "also time the backward pass (every gradient, the forward pass inside it, as aft grad runs it); columns grad "
     "ms (its median) and x fwd, the median of each call's ratio to a forward pass run after it",
     cli_set_flag, FIELD(grad), NULL, 0},
    {"--generate", NULL, NULL,
     "time labml's model generating --seq-len tokens greedily after a prompt of 8, as aft generate does, on "
     "--threads; columns ms, ttft ms (time to the first token), tokens/s, us/token, peak MiB",
     cli_set_flag, FIELD(generate), NULL, 0},
    {"--weights", NULL, "FILE",
     "--generate: the model, a .safetensors of its state_dict() (default: " CLI_SHIPPED_HELP ")",
     cli_set_string, FIELD(weights), "--weights needs a file", 0},
    /* one configuration in this process: how the parent runs each */
    {"--one", NULL, NULL, "run the first configuration here and print its JSON", cli_set_flag, FIELD(one), NULL,
     1},
    {"--progress-label", NULL, "TEXT", "--one: the progress line's label (the parent's place in the sweep)",
     cli_set_string, FIELD(label), NEEDS_VALUE, 1},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_bench_command = {
    .name = "bench",
    .usage = "usage: aft bench [options]\n"
             "\n"
             "Times one AFT layer (projections included) on seeded inputs, with the\n"
             "seeded initialisation of aft run (seed 0).\n"
             "Lists are comma-separated; every combination runs.\n"
             "With --generate, times labml's AFT language model generating text instead.\n",
    .options = options,
    .more = "Columns: ms (median), GFLOP/s, tokens/s, peak resident memory of the run,\n"
            "the fraction of the measured single-precision matrix-product ceiling\n"
            "(cblas_sgemm, 2048^3, same threads) that the run's GFLOP/s reach, and proj:\n"
            "the share of the fastest run spent in the input and output projections.\n",
};

/* useful floating-point operations of one layer: the four projections and
 * the AFT sums (two products, numerator and denominator, per visible term) */
static double layer_flops(aft_variant v, size_t B, size_t T, size_t D, size_t C, size_t s, int causal, size_t gh,
                          size_t gw)
{
    double N = (double)B * (double)T;
    double proj = 2.0 * N * (double)D * (double)C * 4.0;
    double terms;   /* visible (t, t') pairs per batch, weighted by the kernel's work */
    switch (v) {
    case AFT_FULL:
        terms = causal ? 0.5 * (double)T * (double)(T + 1) : (double)T * (double)T;
        break;
    case AFT_LOCAL:
    case AFT_CONV: {
        if (gh) {   /* a (2S - 1) x (2S - 1) window, cut by the grid's sides */
            double a = (double)(2 * aft_window_in(s, gh) - 1), b = (double)(2 * aft_window_in(s, gw) - 1);
            terms = (double)T * a * b * (causal ? 0.5 : 1.0);
            break;
        }
        double w = (double)aft_window_in(s, T);
        terms = (double)T * (causal ? w : 2.0 * w - 1.0);
        break;
    }
    default:
        terms = (double)T;
        break;
    }
    return proj + 4.0 * (double)B * terms * (double)C;
}

/* ---------------------------------------------------------------- one configuration (the child) */

/* what one configuration measured */
typedef struct {
    double med, min;             /* ms */
    aft_layer_times phases;      /* of the fastest run */
    double maxdiff, maxref;      /* --impl both: vs the float64 reference; maxdiff < 0 otherwise */
    cli_stream_times stream;     /* --stream */
    cli_grad_times grad;         /* --grad */
} measured;

/* the child's progress line for the phase `what` of its configuration:
 * "LABEL, WHAT: 37% (...)", LABEL the parent's --progress-label */
static void phase(const bench_opts *o, const char *what)
{
    cli_progress_stop();
    cli_progress_start("%s, %s", o->label ? o->label : "aft bench", what);
}

/* runs the layer o->repeat times after one untimed run (thread pools and
 * page faults belong to start-up); y: (B, T, D) */
static int measure(const bench_opts *o, float *y, const float *x, const aft_params *p, const aft_config *cfg_in,
                   size_t B, size_t T, measured *m)
{
    aft_error err;
    double *times = malloc(o->repeat * sizeof(double));
    if (!times) return EXIT_DATA;
    phase(o, "the layer");
    cli_progress_steps(o->repeat + 1);
    aft_config cfg_p = *cfg_in;
    cfg_p.progress = cli_progress_counter();   /* a few adds a run, on a terminal only */
    const aft_config *cfg = &cfg_p;
    if (aft_layer_forward(y, x, p, cfg, B, T, &err) != AFT_OK) {
        cli_error("bench", "%s", err.msg);
        free(times);
        return EXIT_DATA;
    }
    aft_layer_times ph;
    double best = 0.0;
    for (size_t r = 0; r < o->repeat; r++) {
        cli_progress_step(r + 1);
        double t0 = aft_now_ms();
        aft_layer_forward_timed(y, x, p, cfg, B, T, &ph, &err);
        times[r] = aft_now_ms() - t0;
        if (r == 0 || times[r] < best) {   /* the phases of the fastest run */
            best = times[r];
            m->phases = ph;
        }
    }
    cli_progress_stop();
    m->med = cli_median(times, o->repeat);
    m->min = times[0];
    free(times);
    return 0;
}

/* --impl both: the largest |y - reference| and |reference| over nx values */
static int against_reference(const bench_opts *o, const float *y, const float *x, const aft_params *p,
                             const aft_config *cfg, size_t B, size_t T, size_t nx, measured *m)
{
    aft_error err;
    float *yr = malloc(nx * sizeof(float) + 1);
    aft_config rc = *cfg;
    rc.impl = AFT_IMPL_REFERENCE;
    phase(o, "the float64 reference");
    rc.progress = cli_progress_counter();
    aft_status st = yr ? aft_layer_forward(yr, x, p, &rc, B, T, &err) : AFT_ERR_NOMEM;
    cli_progress_stop();
    if (st != AFT_OK) {
        cli_error("bench", "reference run failed: %s", yr ? err.msg : "out of memory");
        free(yr);
        return EXIT_DATA;
    }
    m->maxdiff = 0.0;
    for (size_t i = 0; i < nx; i++) {
        double d = fabs((double)y[i] - (double)yr[i]);
        if (!(d <= m->maxdiff)) m->maxdiff = d;   /* NaN counts as the worst */
        if (fabs((double)yr[i]) > m->maxref) m->maxref = fabs((double)yr[i]);
    }
    free(yr);
    return 0;
}

/* j as one line on stdout, then deleted; 0, or an exit status */
static int print_json_line(cJSON *j)
{
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return EXIT_DATA;
    printf("%s\n", text);
    free(text);
    return cli_finish_stdout("bench");
}

/* the configuration and what it measured, as one JSON line on stdout */
static int print_one(const bench_opts *o, const aft_config *cfg, size_t B, size_t T, size_t D, size_t C,
                     const measured *m)
{
    aft_blas_info bi;
    aft_blas_get_info(&bi, cfg->projections);
    size_t s = cfg->variant == AFT_LOCAL || cfg->variant == AFT_CONV ? o->window : 0;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "variant", aft_variant_name(cfg->variant));
    cJSON_AddBoolToObject(j, "causal", o->causal);
    cJSON_AddNumberToObject(j, "batch", (double)B);
    cJSON_AddNumberToObject(j, "seq_len", (double)T);
    cJSON_AddNumberToObject(j, "d_model", (double)D);
    cJSON_AddNumberToObject(j, "d_hidden", (double)C);
    cJSON_AddNumberToObject(j, "window", (double)s);
    cJSON_AddNumberToObject(j, "heads", (double)cfg->heads);
    cJSON_AddNumberToObject(j, "threads", o->threads ? o->threads : aft_cores());
    cJSON_AddStringToObject(j, "impl", o->impl_ref ? "reference" : "fast");
    cli_precision_json(j, cfg->precision);
    cJSON_AddStringToObject(j, "blas_core", bi.core);
    cJSON_AddStringToObject(j, "projections_kernel", bi.projections);
    cJSON_AddStringToObject(j, "weights_dtype", cli_weights_dtype(o->wdt, cfg));
    cli_level_json(j);
    /* the times, under the keys aft run --timing gives the same facts (man/aft.1, JSON OUTPUT) */
    cJSON_AddNumberToObject(j, "compute_ms", m->med);
    cJSON_AddNumberToObject(j, "compute_min_ms", m->min);
    cJSON_AddNumberToObject(j, "projections_ms", m->phases.projections);
    cJSON_AddNumberToObject(j, "operator_ms", m->phases.op);
    cJSON_AddNumberToObject(j, "output_ms", m->phases.output);
    double fl = layer_flops(cfg->variant, B, T, D, C, s, o->causal, o->grid_h, o->grid_w);
    cJSON_AddNumberToObject(j, "gflop", fl * 1e-9);
    cJSON_AddNumberToObject(j, "gflop_per_s", fl / (m->med * 1e6));
    cJSON_AddNumberToObject(j, "tokens_per_s", (double)(B * T) / (m->med * 1e-3));
    if (o->stream) {
        cJSON_AddNumberToObject(j, "stream_us_per_token", m->stream.token_us);
        cJSON_AddNumberToObject(j, "one_shot_us_per_token", m->min * 1e3 / (double)(B * T));
        cJSON_AddNumberToObject(j, "floor_us_per_token", m->stream.floor_us);
        cJSON_AddNumberToObject(j, "chunk", (double)m->stream.chunk);
        cJSON_AddNumberToObject(j, "chunked_ms", m->stream.chunked_ms);
        cJSON_AddNumberToObject(j, "chunked_over_one_shot", m->stream.chunked_ms / m->min);
    }
    if (o->grad) {
        cJSON_AddNumberToObject(j, "backward_ms", m->grad.med);
        cJSON_AddNumberToObject(j, "backward_min_ms", m->grad.min);
        cJSON_AddNumberToObject(j, "backward_over_forward", m->grad.ratio);
    }
    if (m->maxdiff >= 0) {
        cJSON_AddNumberToObject(j, "max_abs_error", m->maxdiff);
        cJSON_AddNumberToObject(j, "max_abs_reference", m->maxref);
    }
    return print_json_line(j);
}

/* One configuration, run in this (child) process: the inputs ~ U(-1, 1)
 * and the parameters of the seeded initialisation aft run uses (seed 0),
 * timed; prints one JSON line. */
static int run_one(const bench_opts *o, aft_variant var, size_t T, size_t D)
{
    size_t B = o->batch, C = o->d_hidden ? o->d_hidden : D;
    /* every size below comes from options: check the products first */
    size_t nx;
    if (__builtin_mul_overflow(B, T, &nx) || __builtin_mul_overflow(nx, D, &nx) || nx > SIZE_MAX / 8 ||
        o->window > SIZE_MAX / 4) {
        cli_error("bench", "sizes B = %zu, T = %zu, D = %zu, C = %zu are too large", B, T, D, C);
        return EXIT_DATA;
    }
    aft_config cfg = {.variant = var, .window = var == AFT_LOCAL || var == AFT_CONV ? o->window : 0,
                      .heads = var == AFT_CONV ? o->heads : 1, .causal = o->causal, .threads = o->threads,
                      .impl = o->impl_ref ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST, .grid_h = o->grid_h,
                      .grid_w = o->grid_w, .precision = o->prec[0]};
    cli_kernels_from_env(&cfg);
    float *x = malloc(nx * sizeof(float) + 1), *y = malloc(nx * sizeof(float) + 1);
    cli_params params = {0};
    measured m = {.maxdiff = -1.0};
    int rc = EXIT_DATA;
    if (!x || !y) {
        cli_error("bench", "out of memory for T = %zu, D = %zu", T, D);
    } else if (cli_params_seeded(&params, &cfg, 0, T, D, C, 1, "bench") == 0 &&
               cli_params_16(&params, o->wdt, "bench") == 0) {
        for (size_t i = 0; i < nx; i++) x[i] = aft_seeded_bias(11, 1.0f, i / D, i % D);
        rc = measure(o, y, x, &params.p, &cfg, B, T, &m);
        if (!rc && o->impl_both) rc = against_reference(o, y, x, &params.p, &cfg, B, T, nx, &m);
        if (!rc && o->stream) {
            phase(o, "streaming");
            rc = cli_bench_stream(&params.p, &cfg, B, T, D, C, o->chunk, o->repeat, &m.stream);
        }
        if (!rc && o->grad) {
            phase(o, "the backward pass");
            rc = cli_bench_grad(&params.p, &cfg, B, T, x, o->repeat, &m.grad);
        }
        cli_progress_stop();
        if (!rc) rc = print_one(o, &cfg, B, T, D, C, &m);
    }
    free(x);
    free(y);
    cli_params_free(&params);
    return rc;
}

/* ---------------------------------------------------------------- --generate, one length (the child) */

/* the model of --weights generating n tokens in this (child) process;
 * prints one JSON line */
static int run_generate_one(const bench_opts *o, size_t n)
{
    cli_model_opts mo = {.cmd = "bench", .weights = o->weights, .threads = o->threads, .no_warning = 1,
                         .precision = o->prec[0]};
    aft_model *m;
    int rc = cli_model_open(&mo, &m);
    if (rc) return rc;
    cli_generate_times t;
    phase(o, "generating");
    rc = cli_bench_generate(m, n, o->repeat, &t);
    cli_progress_stop();
    if (rc) {
        aft_model_free(m);
        return rc;
    }
    aft_blas_info bi;
    aft_blas_get_info(&bi, AFT_KERNEL_AUTO);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "mode", "generate");
    cli_model_info_json(j, o->weights, aft_model_get_info(m));
    cJSON_AddNumberToObject(j, "threads", o->threads ? o->threads : aft_cores());
    cli_precision_json(j, o->prec[0]);
    cJSON_AddStringToObject(j, "blas_core", bi.core);
    cJSON_AddStringToObject(j, "projections_kernel", bi.projections);
    cli_level_json(j);
    /* the counts and times, under the keys of aft generate --timing */
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)t.prompt);
    cJSON_AddNumberToObject(j, "generated_tokens", (double)n);
    cJSON_AddNumberToObject(j, "generate_ms", t.ms);
    cJSON_AddNumberToObject(j, "generate_min_ms", t.ms_min);
    cJSON_AddNumberToObject(j, "time_to_first_token_ms", t.ttft_ms);
    cJSON_AddNumberToObject(j, "tokens_per_s", (double)n / (t.ms * 1e-3));
    cJSON_AddNumberToObject(j, "us_per_token", t.ms * 1e3 / (double)n);
    aft_model_free(m);
    return print_json_line(j);
}

/* ---------------------------------------------------------------- the sweep (the parent) */

/* single-precision matrix-product ceiling: the best of three 2048^3
 * products, their rows split over `threads` threads each making one
 * single-threaded cblas_sgemm call, as aft's own products run. (Debian's
 * OpenMP build of OpenBLAS, asked for several threads on one call, ran this
 * product at the one-thread rate on this project's machines: a ceiling that
 * low would flatter every run measured against it.) */
static double sgemm_ceiling(int threads)
{
    const int n = 2048;
    float *a = malloc((size_t)n * n * sizeof(float)), *b = malloc((size_t)n * n * sizeof(float)),
          *c = malloc((size_t)n * n * sizeof(float));
    if (!a || !b || !c) { free(a); free(b); free(c); return 0.0; }
    for (size_t i = 0; i < (size_t)n * n; i++) { a[i] = (float)(i % 13) * 0.01f; b[i] = (float)(i % 7) * 0.01f; }
    int nt = threads > 0 ? threads : 1, step = (n + nt - 1) / nt;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = aft_now_ms();
        #pragma omp parallel for num_threads(nt) schedule(static, 1)
        for (int p = 0; p < nt; p++) {
            omp_set_num_threads(1);   /* this thread's OpenBLAS call runs on it alone */
            int m0 = p * step, m1 = m0 + step < n ? m0 + step : n;
            if (m1 > m0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m1 - m0, n, n, 1.0f, a + (size_t)m0 * n, n,
                            b, n, 0.0f, c + (size_t)m0 * n, n);
        }
        double dt = aft_now_ms() - t0;
        if (dt < best) best = dt;
    }
    free(a); free(b); free(c);
#ifdef __GLIBC__
    /* the configurations' children are forked from this process and start
     * with its resident pages counted in their peak; aft keeps freed memory
     * (cli/main.c), so the 48 MiB of this product go back explicitly */
    malloc_trim(0);
#endif
    return 2.0 * n * (double)n * n / (best * 1e6);
}

static int spawn(const char *self, char **argv, char **line, size_t *peak);

/* runs one configuration in a child, its progress line (on a terminal)
 * starting with label; fills line (its JSON) and peak (bytes) */
static int run_child(const char *self, const bench_opts *o, aft_variant var, size_t T, size_t D, aft_precision prec,
                     const char *label, char **line, size_t *peak)
{
    char a_var[16], a_T[32], a_D[32], a_C[32], a_s[32], a_h[32], a_b[32], a_th[32], a_r[32];
    snprintf(a_var, sizeof a_var, "%s", aft_variant_name(var));
    snprintf(a_T, sizeof a_T, "%zu", T);
    snprintf(a_D, sizeof a_D, "%zu", D);
    snprintf(a_C, sizeof a_C, "%zu", o->d_hidden ? o->d_hidden : D);
    snprintf(a_s, sizeof a_s, "%zu", o->window);
    snprintf(a_h, sizeof a_h, "%zu", o->heads);
    snprintf(a_b, sizeof a_b, "%zu", o->batch);
    snprintf(a_th, sizeof a_th, "%d", o->threads);
    snprintf(a_r, sizeof a_r, "%zu", o->repeat);
    char *argv[48];
    int n = 0;
    argv[n++] = (char *)self;
    argv[n++] = "bench";
    argv[n++] = "--one";
    argv[n++] = "--variant"; argv[n++] = a_var;
    argv[n++] = "--seq-len"; argv[n++] = a_T;
    argv[n++] = "--d-model"; argv[n++] = a_D;
    argv[n++] = "--d-hidden"; argv[n++] = a_C;
    argv[n++] = "--window"; argv[n++] = a_s;
    argv[n++] = "--heads"; argv[n++] = a_h;
    argv[n++] = "--batch"; argv[n++] = a_b;
    argv[n++] = "--threads"; argv[n++] = a_th;
    argv[n++] = "--repeat"; argv[n++] = a_r;
    if (o->causal) argv[n++] = "--causal";
    argv[n++] = "--precision"; argv[n++] = (char *)aft_precision_name(prec);
    char a_c[32], a_g[64];
    snprintf(a_c, sizeof a_c, "%zu", o->chunk);
    snprintf(a_g, sizeof a_g, "%zu,%zu", o->grid_h, o->grid_w);
    if (o->grid_h) { argv[n++] = "--grid"; argv[n++] = a_g; }
    if (o->stream) { argv[n++] = "--stream"; argv[n++] = "--chunk"; argv[n++] = a_c; }
    if (o->grad) argv[n++] = "--grad";
    if (o->wdt == AFT_F16 || o->wdt == AFT_BF16) {
        argv[n++] = "--weights-dtype";
        argv[n++] = o->wdt == AFT_F16 ? "f16" : "bf16";
    }
    if (o->impl_both) { argv[n++] = "--impl"; argv[n++] = "both"; }
    else if (o->impl_ref) { argv[n++] = "--impl"; argv[n++] = "reference"; }
    if (cli_quiet) argv[n++] = "--quiet";
    argv[n++] = "--progress-label"; argv[n++] = (char *)label;
    argv[n] = NULL;
    return spawn(self, argv, line, peak);
}

/* --generate: n tokens in a child; as run_child */
static int generate_child(const char *self, const bench_opts *o, size_t n, const char *label, char **line,
                          size_t *peak)
{
    char a_n[32], a_th[32], a_r[32];
    snprintf(a_n, sizeof a_n, "%zu", n);
    snprintf(a_th, sizeof a_th, "%d", o->threads);
    snprintf(a_r, sizeof a_r, "%zu", o->repeat);
    char *argv[] = {(char *)self, "bench", "--one", "--generate", "--weights", (char *)o->weights, "--seq-len", a_n,
                    "--threads", a_th, "--repeat", a_r, "--precision", (char *)aft_precision_name(o->prec[0]),
                    "--progress-label", (char *)label, cli_quiet ? "--quiet" : NULL, NULL};
    return spawn(self, argv, line, peak);
}

/* runs self with argv in a child; fills line (its standard output) and
 * peak (its peak resident memory, bytes) */
static int spawn(const char *self, char **argv, char **line, size_t *peak)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(self, argv);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fds[0], buf + len, cap - len - 1)) != 0) {
        if (got < 0) {
            if (errno == EINTR) continue;
            break;
        }
        len += (size_t)got;
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    close(fds[0]);
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
    if (!buf) return -1;
    buf[len] = 0;
    *line = buf;
    *peak = (size_t)ru.ru_maxrss * 1024;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 && len > 0 ? 0 : -1;
}

/* What --plot needs, checked before anything is timed: a name ending in
 * .svg or .png (the format), a directory it can write in, and gnuplot. 0,
 * or an exit status after reporting. */
static int check_plot(const char *path)
{
    if (!cli_ends_with(path, ".svg") && !cli_ends_with(path, ".png"))
        return cli_usage_error("bench", "--plot %s: the file must end in .svg or .png", path);
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (access(dir, W_OK) != 0 || (access(path, F_OK) == 0 && access(path, W_OK) != 0)) {
        cli_error("bench", "--plot %s: cannot write there: %s", path, strerror(errno));
        return EXIT_DATA;
    }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        cli_error("bench", "--plot needs gnuplot, which is not installed; on Debian: apt-get install gnuplot-nox");
        return EXIT_DATA;
    }
    return 0;
}

/* the plot of rows into path (check_plot said it can be made) */
static int write_plot(const char *path, cJSON *rows)
{
    int png = cli_ends_with(path, ".png");
    char dat[] = "/tmp/aft-bench-XXXXXX";
    int fd = mkstemp(dat);
    if (fd < 0) return EXIT_DATA;
    FILE *f = fdopen(fd, "w");
    /* one data block per (variant, causal, D): T, ms, peak MiB */
    char titles[64][64];
    int nblock = 0;
    for (int pass = 0; pass < cJSON_GetArraySize(rows) && nblock < 64; pass++) {
        cJSON *r = cJSON_GetArrayItem(rows, pass);
        char key[64];
        snprintf(key, sizeof key, "%s%s d=%d", cJSON_GetObjectItem(r, "variant")->valuestring,
                 cJSON_IsTrue(cJSON_GetObjectItem(r, "causal")) ? " causal" : "",
                 (int)cJSON_GetObjectItem(r, "d_model")->valuedouble);
        int seen = 0;
        for (int b = 0; b < nblock; b++) seen |= strcmp(titles[b], key) == 0;
        if (seen) continue;
        snprintf(titles[nblock], sizeof titles[nblock], "%s", key);
        for (int i = 0; i < cJSON_GetArraySize(rows); i++) {
            cJSON *q = cJSON_GetArrayItem(rows, i);
            char k2[64];
            snprintf(k2, sizeof k2, "%s%s d=%d", cJSON_GetObjectItem(q, "variant")->valuestring,
                     cJSON_IsTrue(cJSON_GetObjectItem(q, "causal")) ? " causal" : "",
                     (int)cJSON_GetObjectItem(q, "d_model")->valuedouble);
            if (strcmp(k2, key) == 0)
                fprintf(f, "%g %g %g\n", cJSON_GetObjectItem(q, "seq_len")->valuedouble,
                        cJSON_GetObjectItem(q, "compute_ms")->valuedouble,
                        cJSON_GetObjectItem(q, "peak_rss_bytes")->valuedouble / 1048576.0);
        }
        fprintf(f, "\n\n");
        nblock++;
    }
    fclose(f);
    char script[] = "/tmp/aft-plot-XXXXXX";
    fd = mkstemp(script);
    if (fd < 0) { unlink(dat); return EXIT_DATA; }
    f = fdopen(fd, "w");
    fprintf(f, "set terminal %s size 1000,420\nset output '%s'\n", png ? "pngcairo" : "svg", path);
    fprintf(f, "set multiplot layout 1,2 title 'aft bench'\nset logscale xy\nset grid\nset key left top\n");
    fprintf(f, "set xlabel 'sequence length T'\nset ylabel 'time (ms)'\nplot ");
    for (int b = 0; b < nblock; b++)
        fprintf(f, "%s'%s' index %d using 1:2 with linespoints title '%s'", b ? ", " : "", dat, b, titles[b]);
    fprintf(f, "\nset ylabel 'peak memory (MiB)'\nplot ");
    for (int b = 0; b < nblock; b++)
        fprintf(f, "%s'%s' index %d using 1:3 with linespoints title '%s'", b ? ", " : "", dat, b, titles[b]);
    fprintf(f, "\nunset multiplot\n");
    fclose(f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "gnuplot %s", script);
    int rc = system(cmd);
    unlink(dat);
    unlink(script);
    if (rc != 0) {
        cli_error("bench", "gnuplot failed drawing %s", path);
        return EXIT_DATA;
    }
    return 0;
}

/* the table's first line (library, kernel, threads, ceiling) and header */
static void print_header(const bench_opts *o, int threads, double ceiling, double floor16)
{
    aft_config kc = {0};
    cli_kernels_from_env(&kc);
    aft_blas_info bi;
    aft_blas_get_info(&bi, kc.projections);
    char why[160];
    cli_level_why(why, sizeof why);
    printf("# %s, kernel %s, %d thread%s; projections %s; aft kernels %s (%s); ", bi.library, bi.core, threads,
           threads == 1 ? "" : "s", bi.projections, cli_level_name(), why);
    if (ceiling > 0) printf("sgemm ceiling %.1f GFLOP/s", ceiling);
    else printf("sgemm ceiling not measured");
    if (o->prec_set && floor16 > 0) printf("; bf16 floor %.1f GFLOP/s (%s)", floor16, aft_bf16_engine_in_use());
    else if (o->prec_set) printf("; bf16 floor -: %s", ceiling > 0 ? "no bf16 engine" : "not measured");
    printf("\n");
    printf("%-7s %-6s%s %6s %3s %5s %10s %10s %8s %12s %9s %6s %5s%s%s%s\n", "variant", "causal",
           o->prec_set ? " prec" : "", "T", "B", "d", "ms",
           "min ms", "GFLOP/s", "tokens/s", "peak MiB", "ceil", "proj",
           o->stream ? "   tok us 1-shot us floor us chunked ms ratio" : "", o->grad ? "    grad ms  x fwd" : "",
           o->impl_both ? "  max|diff| vs ref" : "");
    fflush(stdout);
}

/* one configuration's result (a child's JSON with the parent's peak and
 * ceiling added) as a line of the table or of JSON */
static int print_row(const bench_opts *o, cJSON *j, double ceiling, double floor16)
{
    if (o->json) {
        char *text = cJSON_PrintUnformatted(j);
        if (!text) {   /* out of memory: the row is lost, the run says so */
            cli_error("bench", "out of memory printing a result");
            return EXIT_DATA;
        }
        printf("%s\n", text);
        free(text);
        fflush(stdout);
        return 0;
    }
#define NUM(key) cJSON_GetObjectItem(j, key)->valuedouble
    cJSON *md = cJSON_GetObjectItem(j, "max_abs_error");
    char diff[48] = "";
    if (md) snprintf(diff, sizeof diff, "  %.3g", md->valuedouble);
    double gf = NUM("gflop_per_s"), ms_min = NUM("compute_min_ms"), proj = NUM("projections_ms") + NUM("output_ms");
    /* a bf16 row against the bf16 floor, where there is one */
    int bf16 = strcmp(cJSON_GetObjectItem(j, "precision")->valuestring, "bf16") == 0 && floor16 > 0;
    double top = bf16 ? floor16 : ceiling;
    char ceil_txt[16] = "-", prec[8] = "";
    if (top > 0) snprintf(ceil_txt, sizeof ceil_txt, "%.0f%%", 100.0 * gf / top);
    if (o->prec_set) snprintf(prec, sizeof prec, " %-4s", cJSON_GetObjectItem(j, "precision")->valuestring);
    char stream[96] = "";
    if (o->stream)
        snprintf(stream, sizeof stream, " %8.2f %9.3f %8.2f %10.3f %5.2f", NUM("stream_us_per_token"),
                 NUM("one_shot_us_per_token"), NUM("floor_us_per_token"), NUM("chunked_ms"),
                 NUM("chunked_over_one_shot"));
    char grad[48] = "";
    if (o->grad) snprintf(grad, sizeof grad, " %10.3f %6.2f", NUM("backward_ms"), NUM("backward_over_forward"));
    printf("%-7s %-6s%s %6.0f %3.0f %5.0f %10.3f %10.3f %8.1f %12.0f %9.1f %6s %4.0f%%%s%s%s\n",
           cJSON_GetObjectItem(j, "variant")->valuestring, o->causal ? "yes" : "no", prec, NUM("seq_len"), NUM("batch"),
           NUM("d_model"), NUM("compute_ms"), ms_min, gf, NUM("tokens_per_s"), NUM("peak_rss_bytes") / 1048576.0,
           ceil_txt, ms_min > 0 ? 100.0 * proj / ms_min : 0.0, stream, grad, diff);
#undef NUM
    fflush(stdout);
    return 0;
}

/* every configuration, each in a child process, printed as it ends and
 * gathered in rows; 0, or EXIT_DATA when one failed */
static int sweep(const bench_opts *o, const char *self, double ceiling, double floor16, cJSON *rows)
{
    int tty = isatty(STDERR_FILENO) && !cli_quiet, rc = 0;
    size_t total = o->nvar * o->nseq * o->ndm * o->nprec, done = 0;
    for (size_t d = 0; d < o->ndm; d++)
        for (size_t v = 0; v < o->nvar; v++)
            for (size_t s = 0; s < o->nseq * o->nprec; s++) {
                /* each precision's row beside the others' */
                size_t si = s / o->nprec;
                aft_precision prec = o->prec[s % o->nprec];
                const char *name = aft_variant_name(o->var[v]);
                char label[128];
                snprintf(label, sizeof label, "aft bench: [%zu/%zu] %s T=%zu d=%zu%s%s", done + 1, total, name,
                         o->seq[si], o->dm[d], o->prec_set ? " " : "", o->prec_set ? aft_precision_name(prec) : "");
                if (tty) fprintf(stderr, "\r%s ...   ", label);
                char *line = NULL;
                size_t peak = 0;
                if (run_child(self, o, o->var[v], o->seq[si], o->dm[d], prec, label, &line, &peak) != 0) {
                    if (tty) fputc('\n', stderr);
                    cli_error("bench", "%s T=%zu d=%zu failed", name, o->seq[si], o->dm[d]);
                    free(line);
                    rc = EXIT_DATA;
                    continue;
                }
                done++;
                cJSON *j = cJSON_Parse(line);
                free(line);
                if (!j) {
                    rc = EXIT_DATA;
                    continue;
                }
                cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)peak);
                if (ceiling > 0) {
                    cJSON_AddNumberToObject(j, "sgemm_ceiling_gflop_per_s", ceiling);
                    cJSON_AddNumberToObject(j, "ceiling_fraction",
                                            cJSON_GetObjectItem(j, "gflop_per_s")->valuedouble / ceiling);
                }
                if (floor16 > 0) {
                    cJSON_AddNumberToObject(j, "bf16_floor_gflop_per_s", floor16);
                    if (prec == AFT_PRECISION_BF16)
                        cJSON_AddNumberToObject(j, "bf16_floor_fraction",
                                                cJSON_GetObjectItem(j, "gflop_per_s")->valuedouble / floor16);
                }
                if (tty) fputs("\r\033[K", stderr);
                if (print_row(o, j, ceiling, floor16)) rc = EXIT_DATA;
                cJSON_AddItemToArray(rows, j);
            }
    return rc;
}

/* --generate: the model's line of the header (its sizes), and the columns */
static void print_generate_header(const bench_opts *o, const aft_model_info *in)
{
    aft_blas_info bi;
    aft_blas_get_info(&bi, AFT_KERNEL_AUTO);
    int threads = o->threads ? o->threads : aft_cores();
    char why[160];
    cli_level_why(why, sizeof why);
    printf("# %s, kernel %s, %d thread%s; projections %s; aft kernels %s (%s)\n", bi.library, bi.core, threads,
           threads == 1 ? "" : "s", bi.projections, cli_level_name(), why);
    char ctx[32] = "unbounded";
    if (in->context != SIZE_MAX) snprintf(ctx, sizeof ctx, "%zu", in->context);
    char win[32] = "";
    if (in->window) snprintf(win, sizeof win, " S=%zu", in->window);
    printf("# %s: %zu %s, %s%s, d_model %zu, d_ff %zu, vocabulary %zu, context %s; greedy after a prompt of %d "
           "tokens\n", o->weights, in->n_layers, cli_noun(in->n_layers, "layer", "layers"),
           aft_variant_name(in->variant), win, in->d_model, in->d_ff, in->n_vocab, ctx, CLI_BENCH_PROMPT);
    printf("%7s %10s %10s %9s %10s %9s %9s\n", "tokens", "ms", "min ms", "ttft ms", "tokens/s", "us/token",
           "peak MiB");
    fflush(stdout);
}

/* --generate: each length in a child, printed as it ends */
static int generate_sweep(const bench_opts *o, const char *self)
{
    cli_model_opts mo = {.cmd = "bench", .weights = o->weights, .threads = o->threads, .precision = o->prec[0]};
    aft_model *m;
    int rc = cli_model_open(&mo, &m);   /* its errors here, once, before any child */
    if (rc) return rc;
    if (!o->json) print_generate_header(o, aft_model_get_info(m));
    aft_model_free(m);
#ifdef __GLIBC__
    malloc_trim(0);   /* the children start with this process's resident pages (sgemm_ceiling) */
#endif
    int tty = isatty(STDERR_FILENO) && !cli_quiet;
    for (size_t i = 0; i < o->nseq; i++) {
        char *line = NULL, label[96];
        size_t peak = 0;
        cJSON *j = NULL;
        snprintf(label, sizeof label, "aft bench: [%zu/%zu] %zu tokens", i + 1, o->nseq, o->seq[i]);
        if (tty) fprintf(stderr, "\r%s ...   ", label);
        int failed = generate_child(self, o, o->seq[i], label, &line, &peak) != 0 || !(j = cJSON_Parse(line));
        if (tty) fputs("\r\033[K", stderr);
        if (failed) {
            cli_error("bench", "--generate of %zu %s failed", o->seq[i], cli_noun(o->seq[i], "token", "tokens"));
            free(line);
            rc = EXIT_DATA;
            continue;
        }
        free(line);
        cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)peak);
        if (o->json) {
            char *text = cJSON_PrintUnformatted(j);
            if (text) printf("%s\n", text);
            free(text);
        } else {
#define NUM(key) cJSON_GetObjectItem(j, key)->valuedouble
            printf("%7.0f %10.3f %10.3f %9.3f %10.0f %9.2f %9.1f\n", NUM("generated_tokens"), NUM("generate_ms"),
                   NUM("generate_min_ms"), NUM("time_to_first_token_ms"), NUM("tokens_per_s"), NUM("us_per_token"),
                   NUM("peak_rss_bytes") / 1048576.0);
#undef NUM
        }
        fflush(stdout);
        cJSON_Delete(j);
    }
    return rc;
}

/* --generate times a model: the layer's options do not apply (those left at
 * their defaults pass); --seq-len defaults to 256 and --weights to the
 * shipped model. 0, or an exit status after reporting. */
static int check_generate(bench_opts *o, char *shipped, size_t cap)
{
    const char *bad = o->ndm != 1 || o->dm[0] != 256 ? "--d-model"
                      : o->nvar != 4 ? "--variant"
                      : o->d_hidden ? "--d-hidden"
                      : o->window != 32 ? "--window"
                      : o->heads != 4 ? "--heads"
                      : o->causal ? "--causal"
                      : o->grid_h ? "--grid"
                      : o->batch != 1 ? "--batch"
                      : o->impl_both || o->impl_ref ? "--impl"
                      : o->stream ? "--stream"
                      : o->chunk != 4096 ? "--chunk"
                      : o->plot ? "--plot" : NULL;
    if (bad) return cli_usage_error("bench", "--generate times the model of --weights: %s does not apply", bad);
    if (!o->seq_set) {
        o->seq[0] = 256;
        o->nseq = 1;
    }
    if (!o->weights) {
        if (!cli_shipped_model("bench", "--generate without --weights times", shipped, cap)) return EXIT_DATA;
        o->weights = shipped;
    }
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    bench_opts o = {.nseq = 2, .seq = {1024, 4096}, .ndm = 1, .dm = {256}, .nvar = 4,
                    .var = {AFT_FULL, AFT_LOCAL, AFT_SIMPLE, AFT_CONV}, .window = 32, .heads = 4, .batch = 1,
                    .repeat = 5, .chunk = 4096, .nprec = 1};
    int rc = cli_parse_options(&cli_bench_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("bench") : rc;
    char shipped[4096];
    if (o.generate && (rc = check_generate(&o, shipped, sizeof shipped))) return rc;
    if (!o.generate && o.weights) return cli_usage_error("bench", "--weights applies to --generate");
    if (o.generate && o.nprec > 1)
        return cli_usage_error("bench", "--generate takes one --precision: f32 or bf16");
    if (o.impl_ref && o.nprec > 1)
        return cli_usage_error("bench", "--impl reference computes in float64: --precision takes one value there");
    if (o.generate && o.one) return run_generate_one(&o, o.seq[0]);
    for (size_t i = 0; !o.one && i < o.nprec; i++) cli_precision_note(o.prec[i]);
    if (o.stream && !o.causal) return cli_usage_error("bench", "--stream times a causal layer: add --causal");
    if (o.generate && (o.wdt == AFT_F16 || o.wdt == AFT_BF16))
        return cli_usage_error("bench", "--generate reads its weights from --weights: convert the file with aft "
                               "convert --dtype instead of --weights-dtype");
    if (o.stream && o.impl_ref) return cli_usage_error("bench", "--stream runs the fast kernels, not --impl reference");
    if (o.stream && o.grid_h) return cli_usage_error("bench", "--stream carries a 1-D sequence; a grid has no streaming state");
    for (size_t d = 0; d < o.ndm; d++) {
        size_t C = o.d_hidden ? o.d_hidden : o.dm[d];
        for (size_t v = 0; v < o.nvar; v++)
            if (o.var[v] == AFT_CONV && C % o.heads)
                return cli_usage_error("bench", "--heads %zu does not divide the hidden size %zu", o.heads, C);
    }
    if (o.one) return run_one(&o, o.var[0], o.seq[0], o.dm[0]);
    if (o.plot && (rc = check_plot(o.plot))) return rc;

    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        cli_error("bench", "cannot find the aft executable to run configurations");
        return EXIT_DATA;
    }
    self[sl] = 0;
    if (o.generate) {
        rc = generate_sweep(&o, self);
        int frc = cli_finish_stdout("bench");
        return rc ? rc : frc;
    }
    int threads = o.threads ? o.threads : aft_cores();
    double ceiling = o.no_ceiling ? 0.0 : sgemm_ceiling(threads);
    int any_bf16 = o.prec[0] == AFT_PRECISION_BF16 || o.prec[o.nprec - 1] == AFT_PRECISION_BF16;
    double floor16 = o.no_ceiling || !any_bf16 ? 0.0 : aft_bf16_floor(threads);
#ifdef __GLIBC__
    if (floor16 > 0) malloc_trim(0);   /* as after sgemm_ceiling */
#endif
    if (!o.json) print_header(&o, threads, ceiling, floor16);
    cJSON *rows = cJSON_CreateArray();
    rc = sweep(&o, self, ceiling, floor16, rows);
    if (o.plot && rc == 0) rc = write_plot(o.plot, rows);
    cJSON_Delete(rows);
    int frc = cli_finish_stdout("bench");
    return rc ? rc : frc;
}
