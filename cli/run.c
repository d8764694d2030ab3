/* run.c - aft run: one AFT layer (or the bare operator) on a user's files. */
#include "cli.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: aft run [options] INPUT\n"
    "\n"
    "INPUT is a .npy holding X as [B, T, D] or [T, D] ('-' reads it from stdin),\n"
    "or a .safetensors or .npz holding tensors q, k, v (the bare operator, no\n"
    "projections). Formats are told apart by their first bytes.\n"
    "\n"
    "  --variant full|local|simple|conv   AFT variant (default full)\n"
    "  --window S          local, conv: keep w[t,t'] where |t - t'| < S (S = 0: simple)\n"
    "  --heads H           conv: number of heads (default 1, or the bias's rows)\n"
    "  --causal            sums run over t' <= t only\n"
    "  --mask FILE.npy     boolean or 0/1 [T, T] or [B, T, T], true = visible\n"
    "  --layout btd|tbd    input and output layout (default btd; tbd = [T, B, D])\n"
    "  --weights FILE      .safetensors or .npz with the layer's weights\n"
    "  --prefix P          prepended to every weight name (e.g. blocks.2.attn.)\n"
    "  --seed N            seed of the initialisation used without --weights (default 0)\n"
    "  --d-hidden N        hidden size without --weights (default: D)\n"
    "  -o FILE             output .npy, float32 (default: stdout, unless a terminal)\n"
    "  --timing FILE       write timings and the configuration as JSON\n"
    "  --repeat N          run the computation N times (timing: median and min)\n"
    "  --threads N         threads (default: all cores)\n"
    "  --impl fast|reference   reference: the plain float64 kernels\n"
    "  --max-memory SIZE   refuse runs needing more, and .npz members inflating to\n"
    "                      more (bytes, or with K, M, G; default: the memory\n"
    "                      available)\n"
    "  --strict            non-finite values (NaN, inf) in inputs or weights are an\n"
    "                      error (default: a warning)\n"
    "  -h, --help          this text\n";

struct run_opts {
    aft_config cfg;
    int window_set, heads_set;
    const char *mask_path, *weights_path, *prefix, *out_path, *timing_path, *input;
    int tbd;
    uint64_t seed;
    size_t d_hidden;
    size_t repeat;
    size_t max_memory;
    int strict;
};

static int parse_args(int argc, char **argv, struct run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cfg.variant = AFT_FULL;
    o->cfg.heads = 1;
    o->repeat = 1;
    o->prefix = "";
    int only_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        int missing = 0;
        size_t n;
        if (only_files || a[0] != '-' || strcmp(a, "-") == 0) {
            if (o->input) return cli_usage_error("run", "more than one INPUT: '%s' and '%s'", o->input, a);
            o->input = a;
            continue;
        }
        if (strcmp(a, "--") == 0) { only_files = 1; continue; }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return -1;
        }
        if (strcmp(a, "--causal") == 0) { o->cfg.causal = 1; continue; }
        if (strcmp(a, "--strict") == 0) { o->strict = 1; continue; }
#define OPT(name) ((val = cli_opt_value(argc, argv, &i, name, &missing)) != NULL || missing)
        if (OPT("--variant")) {
            if (missing || aft_variant_from_name(val, &o->cfg.variant) != 0)
                return cli_usage_error("run", "--variant takes full, local, simple or conv");
        } else if (OPT("--window")) {
            if (missing || cli_parse_size(val, &n) != 0)
                return cli_usage_error("run", "--window takes a whole number >= 0");
            o->cfg.window = n;
            o->window_set = 1;
        } else if (OPT("--heads")) {
            if (missing || cli_parse_size(val, &n) != 0 || n == 0)
                return cli_usage_error("run", "--heads takes a whole number >= 1");
            o->cfg.heads = n;
            o->heads_set = 1;
        } else if (OPT("--mask")) {
            if (missing) return cli_usage_error("run", "--mask needs a file");
            o->mask_path = val;
        } else if (OPT("--layout")) {
            if (missing || (strcmp(val, "btd") != 0 && strcmp(val, "tbd") != 0))
                return cli_usage_error("run", "--layout takes btd or tbd");
            o->tbd = strcmp(val, "tbd") == 0;
        } else if (OPT("--weights")) {
            if (missing) return cli_usage_error("run", "--weights needs a file");
            o->weights_path = val;
        } else if (OPT("--prefix")) {
            if (missing) return cli_usage_error("run", "--prefix needs a value");
            o->prefix = val;
        } else if (OPT("--seed")) {
            if (missing || cli_parse_u64(val, &o->seed) != 0)
                return cli_usage_error("run", "--seed takes a whole number >= 0");
        } else if (OPT("--d-hidden")) {
            if (missing || cli_parse_size(val, &n) != 0 || n == 0)
                return cli_usage_error("run", "--d-hidden takes a whole number >= 1");
            o->d_hidden = n;
        } else if (OPT("-o") || OPT("--output")) {
            if (missing) return cli_usage_error("run", "-o needs a file");
            o->out_path = val;
        } else if (OPT("--timing")) {
            if (missing) return cli_usage_error("run", "--timing needs a file");
            o->timing_path = val;
        } else if (OPT("--repeat")) {
            if (missing || cli_parse_size(val, &n) != 0 || n == 0 || n > 1000000)
                return cli_usage_error("run", "--repeat takes a whole number from 1 to 1000000");
            o->repeat = n;
        } else if (OPT("--threads")) {
            if (missing || cli_parse_size(val, &n) != 0 || n == 0 || n > 1024)
                return cli_usage_error("run", "--threads takes a whole number from 1 to 1024");
            o->cfg.threads = (int)n;
        } else if (OPT("--max-memory")) {
            if (missing || cli_parse_bytes(val, &o->max_memory) != 0 || o->max_memory == 0)
                return cli_usage_error("run", "--max-memory takes a size like 4G, 512M or 1000000");
        } else if (OPT("--impl")) {
            if (missing || (strcmp(val, "fast") != 0 && strcmp(val, "reference") != 0))
                return cli_usage_error("run", "--impl takes fast or reference");
            o->cfg.impl = strcmp(val, "reference") == 0 ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
        } else {
            return cli_usage_error("run", "unknown option '%s'", a);
        }
#undef OPT
    }
    if (!o->input) return cli_usage_error("run", "no INPUT given");
    aft_variant v = o->cfg.variant;
    if (o->window_set && v != AFT_LOCAL && v != AFT_CONV)
        return cli_usage_error("run", "--window applies to --variant local and conv, not %s", aft_variant_name(v));
    if (o->heads_set && v != AFT_CONV)
        return cli_usage_error("run", "--heads applies to --variant conv, not %s", aft_variant_name(v));
    if (v == AFT_LOCAL && !o->window_set)
        return cli_usage_error("run", "--variant local needs --window S");
    if (v == AFT_CONV && !o->window_set && !o->weights_path)
        return cli_usage_error("run", "--variant conv needs --window S (or a conv bias in --weights)");
    if (o->weights_path && o->d_hidden)
        return cli_usage_error("run", "--d-hidden applies without --weights; the weights fix the hidden size");
    if (!o->out_path && isatty(STDOUT_FILENO))
        return cli_usage_error("run", "refusing to write binary .npy to a terminal; use -o FILE or a pipe");
    return 0;
}

/* [T, B, X] -> [B, T, X] (or back when to_tbd) */
static float *swap_tb(const float *x, size_t B, size_t T, size_t X, int to_tbd)
{
    /* B * T * X elements exist already (x), so the product cannot overflow */
    float *y = malloc(B * T * X * sizeof(float) + 1);
    if (!y) return NULL;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            const float *src = to_tbd ? x + (b * T + t) * X : x + (t * B + b) * X;
            float *dst = to_tbd ? y + (t * B + b) * X : y + (b * T + t) * X;
            memcpy(dst, src, X * sizeof(float));
        }
    return y;
}

/* A float tensor of rank 2 or 3 as float32 [B, T, X] in btd order. */
static int load_activation(const char *file, const char *what, const aft_tensor *t, int tbd,
                           float **out, size_t *B, size_t *T, size_t *X)
{
    aft_error err;
    if (!aft_dtype_is_float(t->dtype)) {
        cli_error(NULL, "%s: %s has dtype %s; expected floating point", file, what, aft_dtype_name(t->dtype));
        return EXIT_DATA;
    }
    if (t->ndim != 2 && t->ndim != 3) {
        cli_error(NULL, "%s: %s must be [B, T, D] or [T, D]; it has %zu dimensions", file, what, t->ndim);
        return EXIT_DATA;
    }
    float *x;
    if (aft_tensor_to_f32(t, &x, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", file, err.msg);
        return EXIT_DATA;
    }
    if (t->ndim == 2) {
        *B = 1; *T = t->shape[0]; *X = t->shape[1];
    } else if (tbd) {
        *T = t->shape[0]; *B = t->shape[1]; *X = t->shape[2];
        float *y = swap_tb(x, *B, *T, *X, 0);
        free(x);
        if (!y) {
            cli_error(NULL, "%s: out of memory", file);
            return EXIT_DATA;
        }
        x = y;
    } else {
        *B = t->shape[0]; *T = t->shape[1]; *X = t->shape[2];
    }
    *out = x;
    return 0;
}

/* deterministic initialisation without --weights: entry (i, j) of tensor id is
 * uniform in [-1/sqrt(in), 1/sqrt(in)), like PyTorch's Linear default bound */
static float *seeded_matrix(uint64_t seed, unsigned id, size_t rows, size_t cols, size_t fan_in)
{
    size_t n;
    if (__builtin_mul_overflow(rows, cols, &n) || n > SIZE_MAX / sizeof(float)) return NULL;
    float *m = malloc(n * sizeof(float) + 1);
    if (!m) return NULL;
    float bound = 1.0f / sqrtf((float)fan_in);
    uint64_t s = seed ^ (0x100000001b3ULL * (id + 1));
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) m[i * cols + j] = aft_seeded_bias(s, bound, i, j);
    return m;
}

#define SEEDED_BIAS_SCALE 0.5f

struct timing {
    double load, write, total, compute_med, compute_min;
    int layer;              /* phases apply: a layer run, not the bare operator */
    aft_layer_times phases; /* of the fastest run */
};

static int write_timing(aft_out *out, const struct run_opts *o, size_t B, size_t T, size_t D, size_t C,
                        const struct timing *tm)
{
    aft_blas_info bi;
    aft_blas_get_info(&bi);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "variant", aft_variant_name(o->cfg.variant));
    cJSON_AddNumberToObject(j, "window", (double)o->cfg.window);
    cJSON_AddNumberToObject(j, "heads", (double)o->cfg.heads);
    cJSON_AddBoolToObject(j, "causal", o->cfg.causal);
    cJSON_AddBoolToObject(j, "mask", o->mask_path != NULL);
    cJSON_AddNumberToObject(j, "batch", (double)B);
    cJSON_AddNumberToObject(j, "seq_len", (double)T);
    cJSON_AddNumberToObject(j, "d_model", (double)D);
    cJSON_AddNumberToObject(j, "d_hidden", (double)C);
    cJSON_AddNumberToObject(j, "threads", aft_get_threads());
    cJSON_AddStringToObject(j, "impl", o->cfg.impl == AFT_IMPL_REFERENCE ? "reference" : "fast");
    cJSON_AddNumberToObject(j, "repeat", (double)o->repeat);
    cJSON *blas = cJSON_AddObjectToObject(j, "blas");
    cJSON_AddStringToObject(blas, "library", bi.library);
    cJSON_AddStringToObject(blas, "core", bi.core);
    cJSON_AddStringToObject(blas, "projections", bi.projections);
    const char *was = getenv("AFT_OPENBLAS_CORETYPE_WAS");
    if (was) cJSON_AddStringToObject(blas, "core_overridden_from", was);
    cJSON *t = cJSON_AddObjectToObject(j, "timing_ms");
    cJSON_AddNumberToObject(t, "load", tm->load);
    cJSON_AddNumberToObject(t, "compute", tm->compute_med);
    cJSON_AddNumberToObject(t, "compute_min", tm->compute_min);
    cJSON_AddNumberToObject(t, "write", tm->write);
    cJSON_AddNumberToObject(t, "total", tm->total);
    if (tm->layer) {
        cJSON *ph = cJSON_AddObjectToObject(t, "phases_of_fastest");
        cJSON_AddNumberToObject(ph, "projections", tm->phases.projections);
        cJSON_AddNumberToObject(ph, "operator", tm->phases.op);
        cJSON_AddNumberToObject(ph, "output", tm->phases.output);
    }
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)aft_peak_rss());
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) {
        cli_error("run", "out of memory writing timing");
        return EXIT_DATA;
    }
    fputs(text, out->fp);
    fputc('\n', out->fp);
    free(text);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0) return cli_finish_stdout("run");
    if (rc) return rc;

    double t_start = aft_now_ms();
    aft_error err;
    aft_tensor xt = {0}, mt = {0};
    aft_st_file *in_st = NULL, *w_st = NULL;
    aft_weights wts = {0};
    float *x = NULL, *q = NULL, *k = NULL, *v = NULL, *y = NULL, *owned[6] = {0};
    uint8_t *mask = NULL;
    aft_out yout = {0}, tout = {0};
    size_t B = 0, T = 0, D = 0, C = 0, KC = 0, in_rank = 3;
    aft_format in_fmt;
    if (cli_file_format(NULL, o.input, &in_fmt) != 0) return EXIT_DATA;
    int bare = in_fmt == AFT_FORMAT_SAFETENSORS || in_fmt == AFT_FORMAT_NPZ;
    size_t read_limit = cli_memory_limit(o.max_memory);
    rc = EXIT_DATA;
    if (o.cfg.threads) aft_set_threads(o.cfg.threads);

    /* ---- load the input */
    if (bare) {
        if (aft_st_open_limit(o.input, read_limit, &in_st, &err) != AFT_OK) {
            cli_error(NULL, "%s: %s", o.input, err.msg);
            goto out;
        }
        const char *names[3] = {"q", "k", "v"};
        float **dst[3] = {&q, &k, &v};
        size_t dims[3][3];
        for (int i = 0; i < 3; i++) {
            const aft_tensor *t = aft_st_find(in_st, names[i]);
            if (!t) {
                cli_error(NULL, "%s: no tensor '%s'; a .%s INPUT holds q, k and v", o.input, names[i],
                          aft_st_format(in_st));
                goto out;
            }
            char what[16];
            snprintf(what, sizeof what, "'%s'", names[i]);
            if (load_activation(o.input, what, t, o.tbd, dst[i], &dims[i][0], &dims[i][1], &dims[i][2])) goto out;
        }
        B = dims[0][0]; T = dims[0][1]; C = dims[0][2]; KC = dims[1][2];
        in_rank = aft_st_find(in_st, "q")->ndim;
        D = C;
        for (int i = 1; i < 3; i++)
            if (dims[i][0] != B || dims[i][1] != T || (i == 2 && dims[i][2] != C)) {
                cli_error(NULL, "%s: '%s' is [B=%zu, T=%zu, %zu] but 'q' is [B=%zu, T=%zu, %zu]", o.input, names[i],
                          dims[i][0], dims[i][1], dims[i][2], B, T, C);
                goto out;
            }
    } else {
        aft_npy_info info;
        if (aft_npy_read(o.input, &xt, &info, &err) != AFT_OK) {
            cli_error(NULL, "%s: %s", o.input, err.msg);
            goto out;
        }
        in_rank = xt.ndim;
        if (load_activation(o.input, "the input", &xt, o.tbd, &x, &B, &T, &D)) goto out;
        aft_tensor_free(&xt);
    }

    /* ---- weights, or the seeded initialisation */
    aft_params *p = &wts.p;
    if (o.weights_path) {
        aft_format w_fmt;
        if (cli_file_format(NULL, o.weights_path, &w_fmt) != 0) goto out;
        if (aft_st_open_limit(o.weights_path, read_limit, &w_st, &err) != AFT_OK) {
            cli_error(NULL, "%s: %s", o.weights_path, err.msg);
            goto out;
        }
        aft_status st = bare ? aft_bias_load(w_st, o.prefix, o.cfg.variant, o.cfg.heads, &wts, &err)
                             : aft_weights_load(w_st, o.prefix, o.cfg.variant, o.cfg.heads, &wts, &err);
        if (st != AFT_OK) {
            cli_error(NULL, "%s: %s", o.weights_path, err.msg);
            goto out;
        }
        if (!bare && p->d_model != D) {
            cli_error(NULL, "%s: the input has D = %zu but '%s' expects %zu", o.weights_path, D, wts.names[0],
                      p->d_model);
            goto out;
        }
        if (o.cfg.variant == AFT_CONV && p->bias.kind == AFT_BIAS_CONV) {
            if (o.window_set && o.cfg.window != wts.conv_window) {
                cli_error(NULL, "%s: --window %zu but '%s' holds a window of %zu (2S-1 = %zu)", o.weights_path,
                          o.cfg.window, wts.names[4], wts.conv_window, 2 * wts.conv_window - 1);
                goto out;
            }
            if (o.heads_set && o.cfg.heads != wts.conv_heads) {
                cli_error(NULL, "%s: --heads %zu but '%s' has %zu rows (one per head)", o.weights_path, o.cfg.heads,
                          wts.names[4], wts.conv_heads);
                goto out;
            }
            o.cfg.window = wts.conv_window;
            o.cfg.heads = wts.conv_heads;
        }
        if (!bare) { C = p->d_hidden; KC = p->k_out; }
    } else {
        /* sizes from options must fit before anything is allocated for them */
        size_t Cw = bare ? C : (o.d_hidden ? o.d_hidden : D);
        if (o.cfg.variant == AFT_CONV && Cw % o.cfg.heads != 0) {
            cli_error("run", "--heads %zu does not divide the hidden size %zu", o.cfg.heads, Cw);
            rc = EXIT_USAGE;
            goto out;
        }
        size_t wbytes;
        if (!bare && (__builtin_mul_overflow(Cw, D, &wbytes) || __builtin_mul_overflow(wbytes, 4 * sizeof(float), &wbytes))) {
            cli_error("run", "weights of %zu x %zu do not fit in memory", Cw, D);
            goto out;
        }
        /* a conv window past the sequence sees everything: generate only the
         * offsets that can occur */
        if (o.cfg.variant == AFT_CONV && o.cfg.window > T) o.cfg.window = T ? T : 1;
        if (!bare) {
            C = o.d_hidden ? o.d_hidden : D;
            KC = C;
            size_t dims[4][2] = {{C, D}, {C, D}, {C, D}, {D, C}};
            for (unsigned i = 0; i < 4; i++) {
                owned[i] = seeded_matrix(o.seed, i, dims[i][0], dims[i][1], dims[i][1]);
                if (!owned[i]) { cli_error("run", "out of memory for weights"); goto out; }
            }
            owned[4] = seeded_matrix(o.seed, 4, 4, C > D ? C : D, D ? D : 1);   /* rows: bq, bk, bv, bo */
            if (!owned[4]) { cli_error("run", "out of memory for weights"); goto out; }
            size_t ld = C > D ? C : D;
            p->d_model = D; p->d_hidden = C; p->k_out = C;
            p->wq = owned[0]; p->wk = owned[1]; p->wv = owned[2]; p->wo = owned[3];
            p->bq = owned[4]; p->bk = owned[4] + ld; p->bv = owned[4] + 2 * ld; p->bo = owned[4] + 3 * ld;
        }
        if (o.cfg.variant == AFT_CONV) {
            size_t H = o.cfg.heads, n = o.cfg.window ? 2 * o.cfg.window - 1 : 1;
            owned[5] = seeded_matrix(o.seed, 5, H, n, 1);
            if (!owned[5]) { cli_error("run", "out of memory for the conv bias"); goto out; }
            for (size_t i = 0; i < H * n; i++) owned[5][i] *= SEEDED_BIAS_SCALE;
            p->bias.kind = AFT_BIAS_CONV;
            p->bias.conv = owned[5];
        } else if (o.cfg.variant != AFT_SIMPLE) {
            p->bias.kind = AFT_BIAS_SEEDED;
            p->bias.seed = o.seed;
            p->bias.scale = SEEDED_BIAS_SCALE;
        }
    }

    if (bare && KC != C && !(o.cfg.variant == AFT_CONV && KC == o.cfg.heads)) {
        if (o.cfg.variant == AFT_CONV)
            cli_error(NULL, "%s: 'k' has %zu channels; conv needs %zu (one per value channel) or %zu (one per head)",
                      o.input, KC, C, o.cfg.heads);
        else
            cli_error(NULL, "%s: 'k' has %zu channels but 'q' and 'v' have %zu", o.input, KC, C);
        goto out;
    }
    if ((p->bias.kind == AFT_BIAS_DENSE || p->bias.kind == AFT_BIAS_FACTORED) && p->bias.tmax < T &&
        o.cfg.variant != AFT_SIMPLE) {
        cli_error(NULL, "%s: sequence length T = %zu exceeds the position bias '%s' size Tmax = %zu",
                  o.weights_path, T, wts.names[4], p->bias.tmax);
        goto out;
    }

    /* ---- non-finite values poison every output they reach */
    {
        size_t bad_in = 0, bad_w = 0;
        if (bare) bad_in = aft_count_nonfinite(q, B * T * C) + aft_count_nonfinite(k, B * T * KC) +
                           aft_count_nonfinite(v, B * T * C);
        else bad_in = aft_count_nonfinite(x, B * T * D);
        if (o.weights_path) {
            const float *mats[] = {p->wq, p->wk, p->wv, p->wo, p->bq, p->bk, p->bv, p->bo};
            size_t lens[] = {C * D, KC * D, C * D, D * C, C, KC, C, D};
            for (int i = 0; i < 8; i++)
                if (mats[i] && !bare) bad_w += aft_count_nonfinite(mats[i], lens[i]);
            if (p->bias.kind == AFT_BIAS_DENSE) bad_w += aft_count_nonfinite(p->bias.dense, p->bias.tmax * p->bias.tmax);
            if (p->bias.kind == AFT_BIAS_FACTORED)
                bad_w += aft_count_nonfinite(p->bias.u, p->bias.tmax * p->bias.rank) +
                         aft_count_nonfinite(p->bias.v, p->bias.tmax * p->bias.rank);
            if (p->bias.kind == AFT_BIAS_CONV)
                bad_w += aft_count_nonfinite(p->bias.conv, o.cfg.heads * (2 * o.cfg.window - 1));
        }
        const char *where = bad_in ? o.input : o.weights_path;
        size_t nbad = bad_in ? bad_in : bad_w;
        if (nbad && o.strict) {
            cli_error(NULL, "%s: %zu non-finite values (NaN or inf); --strict refuses them", where, nbad);
            goto out;
        }
        if (nbad)
            cli_error("run", "warning: %s holds %zu non-finite values (NaN or inf); outputs they reach will be NaN",
                      where, nbad);
    }

    /* ---- refuse, with both numbers, a run the machine cannot hold */
    {
        size_t outw0 = bare ? C : D;
        size_t need = aft_workspace_bytes(&o.cfg, B, T, D, C, bare ? KC : 0);
        size_t outb = B * T * outw0 * sizeof(float), maskb = 0;
        if (o.mask_path) maskb = B * T * T * (sizeof(float) + 1);   /* the mask as read and as bytes */
        need = need > SIZE_MAX - outb - maskb ? SIZE_MAX : need + outb + maskb;
        size_t limit = o.max_memory ? o.max_memory : aft_available_memory();
        if (limit && need > limit) {
            cli_error("run", "this run needs about %.1f MiB but %s %.1f MiB", (double)need / 1048576.0,
                      o.max_memory ? "--max-memory allows" : "only", (double)limit / 1048576.0);
            goto out;
        }
    }

    /* ---- the mask */
    if (o.mask_path) {
        if (aft_npy_read(o.mask_path, &mt, NULL, &err) != AFT_OK) {
            cli_error(NULL, "%s: %s", o.mask_path, err.msg);
            goto out;
        }
        int batched = mt.ndim == 3;
        if (!((mt.ndim == 2 && mt.shape[0] == T && mt.shape[1] == T) ||
              (batched && mt.shape[0] == B && mt.shape[1] == T && mt.shape[2] == T))) {
            char shp[96] = "";
            size_t u = 0;
            for (size_t i = 0; i < mt.ndim && u < sizeof shp - 24; i++)
                u += (size_t)snprintf(shp + u, sizeof shp - u, "%s%zu", i ? ", " : "", mt.shape[i]);
            cli_error(NULL, "%s: mask is [%s] but the input needs [T, T] = [%zu, %zu] or [B, T, T] = [%zu, %zu, %zu]",
                      o.mask_path, shp, T, T, B, T, T);
            goto out;
        }
        if (aft_dtype_is_float(mt.dtype) && mt.dtype != AFT_F32 && mt.dtype != AFT_F64) {
            cli_error(NULL, "%s: mask has dtype %s; expected bool or 0/1 integers", o.mask_path,
                      aft_dtype_name(mt.dtype));
            goto out;
        }
        float *mf;
        if (aft_tensor_to_f32(&mt, &mf, &err) != AFT_OK) {
            cli_error(NULL, "%s: %s", o.mask_path, err.msg);
            goto out;
        }
        mask = malloc(mt.nelem + 1);
        if (!mask) { free(mf); cli_error("run", "out of memory for the mask"); goto out; }
        for (size_t i = 0; i < mt.nelem; i++) {
            if (mf[i] != 0.0f && mf[i] != 1.0f) {
                cli_error(NULL, "%s: mask entry %zu is %g; entries must be 0 or 1", o.mask_path, i, (double)mf[i]);
                free(mf);
                goto out;
            }
            mask[i] = mf[i] != 0.0f;
        }
        free(mf);
        p->bias.mask = mask;
        p->bias.mask_batched = batched;
    }

    /* ---- compute; conv with window 0 has no band: it is simple */
    aft_config run_cfg = o.cfg;
    if (run_cfg.variant == AFT_CONV && run_cfg.window == 0) {
        if (KC != C) {
            cli_error("run", "--variant conv --window 0 is simple, which needs as many key channels as "
                      "value channels (keys have %zu, values %zu)", KC, C);
            goto out;
        }
        run_cfg.variant = AFT_SIMPLE;
        p->bias.kind = AFT_BIAS_NONE;
    }

    size_t N = B * T, outw = bare ? C : D;
    y = malloc(N * outw * sizeof(float) + 1);
    double *times = malloc(o.repeat * sizeof(double));
    if (!y || !times) {
        free(times);
        cli_error("run", "out of memory for the output (%zu x %zu)", N, outw);
        goto out;
    }
    double t_loaded = aft_now_ms();
    aft_layer_times ph, best_ph = {0, 0, 0};
    double best = -1.0;
    cli_progress_start("aft run: %s T=%zu B=%zu", aft_variant_name(o.cfg.variant), T, B);
    for (size_t r = 0; r < o.repeat; r++) {
        if (o.repeat > 1)
            cli_progress_label("aft run: %s T=%zu B=%zu, run %zu of %zu", aft_variant_name(o.cfg.variant), T, B,
                               r + 1, o.repeat);
        double t0 = aft_now_ms();
        aft_status st = bare ? aft_op_forward(y, q, k, v, &p->bias, &run_cfg, B, T, C, KC, &err)
                             : aft_layer_forward_timed(y, x, p, &run_cfg, B, T, &ph, &err);
        times[r] = aft_now_ms() - t0;
        if (!bare && (best < 0 || times[r] < best)) {
            best = times[r];
            best_ph = ph;
        }
        if (st != AFT_OK) {
            cli_progress_stop();
            free(times);
            cli_error("run", "%s", err.msg);
            rc = EXIT_DATA;   /* the options were checked: what is left is the data */
            goto out;
        }
    }
    cli_progress_stop();
    qsort(times, o.repeat, sizeof(double), cmp_double);
    struct timing tm = {0};
    tm.layer = !bare;
    tm.phases = best_ph;
    tm.compute_min = times[0];
    tm.compute_med = o.repeat % 2 ? times[o.repeat / 2] : 0.5 * (times[o.repeat / 2 - 1] + times[o.repeat / 2]);
    free(times);

    /* ---- write, in the input's layout and rank */
    double t_w0 = aft_now_ms();
    if (o.tbd && in_rank == 3) {
        float *z = swap_tb(y, B, T, outw, 1);
        if (!z) { cli_error("run", "out of memory"); goto out; }
        free(y);
        y = z;
    }
    aft_tensor yt = {.dtype = AFT_F32, .data = y, .nelem = N * outw, .nbytes = N * outw * sizeof(float)};
    if (in_rank == 2) {
        yt.ndim = 2; yt.shape[0] = T; yt.shape[1] = outw;
    } else {
        yt.ndim = 3;
        yt.shape[0] = o.tbd ? T : B; yt.shape[1] = o.tbd ? B : T; yt.shape[2] = outw;
    }
    /* both outputs are opened (as temporaries) before either is written,
     * and renamed into place only when both were written */
    const char *dest = o.out_path ? o.out_path : "-";
    if (aft_out_open(&yout, dest, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    if (o.timing_path && aft_out_open(&tout, o.timing_path, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    if (aft_npy_write_fp(yout.fp, &yt, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o.out_path ? o.out_path : "standard output", err.msg);
        goto out;
    }
    tm.load = t_loaded - t_start;
    tm.write = aft_now_ms() - t_w0;
    tm.total = aft_now_ms() - t_start;
    if (o.timing_path && write_timing(&tout, &o, B, T, bare ? C : D, C, &tm) != 0) goto out;
    /* the messages of commit name the file already */
    if (aft_out_commit(&yout, &err) != AFT_OK || (o.timing_path && aft_out_commit(&tout, &err) != AFT_OK)) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    rc = 0;

out:
    if (yout.fp) aft_out_abort(&yout);
    if (tout.fp) aft_out_abort(&tout);
    aft_tensor_free(&xt);
    aft_tensor_free(&mt);
    if (in_st) aft_st_close(in_st);
    if (w_st) aft_st_close(w_st);
    aft_weights_free(&wts);
    free(x); free(q); free(k); free(v); free(y); free(mask);
    for (int i = 0; i < 6; i++) free(owned[i]);
    if (rc == 0 && !o.out_path) return cli_finish_stdout("run");
    return rc;
}
