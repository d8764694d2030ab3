/* model.c - aft model: labml's autoregressive AFT model (aft.h, "the
 * model") on token ids, writing its logits; and what aft model, aft
 * generate, aft encode, aft decode and aft bench --generate share: the
 * options that load a model, the step that loads it, and the reader of a
 * .npy of token ids (cli.h, "the model").
 *
 * cmd_model reads as its steps: parse the options, load the model, load
 * the tokens and check them against it, check the memory, compute, write. */
#include "cli.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the shared options */

/* the cli_model_opts inside a command's options, at opt->field */
#define MODEL_OPTS(opt, opts) ((cli_model_opts *)((char *)(opts) + (opt)->field))

int cli_model_set_weights(const cli_option *opt, void *opts, const char *v)
{
    MODEL_OPTS(opt, opts)->weights = v;
    return 0;
}

int cli_model_set_window(const cli_option *opt, void *opts, const char *v)
{
    cli_model_opts *m = MODEL_OPTS(opt, opts);
    if (aft_parse_size(v, &m->window) != 0 || m->window == 0)
        return cli_usage_error(m->cmd, "--window takes a whole number >= 1");
    return 0;
}

int cli_model_set_threads(const cli_option *opt, void *opts, const char *v)
{
    cli_model_opts *m = MODEL_OPTS(opt, opts);
    return cli_set_threads(m->cmd, &m->threads, v);
}

int cli_model_set_precision(const cli_option *opt, void *opts, const char *v)
{
    cli_model_opts *m = MODEL_OPTS(opt, opts);
    return cli_set_precision(m->cmd, &m->precision, v);
}

int cli_model_set_max_memory(const cli_option *opt, void *opts, const char *v)
{
    cli_model_opts *m = MODEL_OPTS(opt, opts);
    return cli_set_memory(m->cmd, &m->max_memory, v);
}

int cli_model_set_vocab(const cli_option *opt, void *opts, const char *v)
{
    MODEL_OPTS(opt, opts)->vocab = v;
    return 0;
}

int cli_model_set_strict(const cli_option *opt, void *opts, const char *v)
{
    MODEL_OPTS(opt, opts)->strict = 1;
    return 0;
}

/* ---------------------------------------------------------------- loading the model */

/* a --vocab file, whole, NUL-terminated: 0, or EXIT_DATA after reporting */
static int read_vocab(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        cli_error(NULL, "%s: %s", path, strerror(errno));
        if (f) fclose(f);
        return EXIT_DATA;
    }
    /* a vocabulary is a list of short strings: 64 MiB holds millions */
    if (!S_ISREG(sb.st_mode) || sb.st_size > (64 << 20)) {
        cli_error(NULL, "%s: %s", path, S_ISREG(sb.st_mode) ? "larger than 64 MiB: not a vocabulary"
                                                             : "not a regular file");
        fclose(f);
        return EXIT_DATA;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    size_t got = buf ? fread(buf, 1, n, f) : 0;
    int bad = !buf || got != n || ferror(f);
    fclose(f);
    if (bad) {
        cli_error(NULL, "%s: %s", path, buf ? "read failed" : "out of memory");
        free(buf);
        return EXIT_DATA;
    }
    buf[n] = 0;
    if (strlen(buf) != n) {
        cli_error(NULL, "%s: holds a NUL byte: not a JSON vocabulary", path);
        free(buf);
        return EXIT_DATA;
    }
    *out = buf;
    return 0;
}

/* bytes of the weights as float32: the model converts every tensor */
static size_t weights_bytes(const aft_st_file *f)
{
    size_t total = 0;
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const aft_tensor *t = aft_st_get(f, i, NULL);
        size_t b;
        if (__builtin_mul_overflow(t->nelem, sizeof(float), &b) || __builtin_add_overflow(total, b, &total))
            return SIZE_MAX;
    }
    return total;
}

/* tensors of the checkpoint the model does not use: a warning, or under
 * --strict an error (the model freed) */
static int unused_tensors(const cli_model_opts *o, aft_model **m)
{
    const aft_model_info *in = aft_model_get_info(*m);
    if (!in->n_unused || (o->no_warning && !o->strict)) return 0;
    char more[48] = "";
    if (in->n_unused > 1) snprintf(more, sizeof more, " (and %zu more)", in->n_unused - 1);
    const char *file = cli_display_name(o->weights);
    if (!o->strict) {
        cli_error(o->cmd, "warning: %s: unexpected tensor '%s'%s, which the model does not use", file, in->unused,
                  more);
        return 0;
    }
    cli_error(NULL, "%s: unexpected tensor '%s'%s, which the model does not use; --strict refuses %s", file,
              in->unused, more, in->n_unused > 1 ? "them" : "it");
    aft_model_free(*m);
    *m = NULL;
    return EXIT_DATA;
}

int cli_model_open(const cli_model_opts *o, aft_model **out)
{
    *out = NULL;
    char *vocab = NULL;
    if (o->vocab && read_vocab(o->vocab, &vocab) != 0) return EXIT_DATA;
    aft_error err;
    aft_st_file *f;
    size_t limit = aft_memory_limit(o->max_memory);
    if (aft_st_open_limit(o->weights, limit, &f, &err) != AFT_OK) {
        cli_report_file(NULL, o->weights, err.msg);
        free(vocab);
        return EXIT_DATA;
    }
    /* the float32 copy and the products' packed copy of each matrix */
    size_t wb = weights_bytes(f), need = wb > SIZE_MAX / 2 ? SIZE_MAX : 2 * wb;
    if (need > limit) {
        cli_error(o->cmd, "the model needs about %s but %s %s", cli_bytes_text(need).s,
                  o->max_memory ? "--max-memory allows" : "only", cli_bytes_text(limit).s);
        aft_st_close(f);
        free(vocab);
        return EXIT_DATA;
    }
    aft_model_options mo = {.window = o->window, .threads = o->threads, .impl = o->impl, .vocab = vocab,
                            .precision = o->precision};
    if (!o->no_warning) cli_precision_note(o->precision);   /* (bench's children: the parent said it) */
    aft_status st = aft_model_load(out, f, &mo, &err);
    aft_st_close(f);
    free(vocab);
    if (st != AFT_OK) {
        /* what is wrong with --vocab's list is that file's fault */
        int theirs = o->vocab && strncmp(err.msg, "the vocabulary", 14) == 0;
        cli_report_file(NULL, theirs ? o->vocab : o->weights, err.msg);
        return EXIT_DATA;
    }
    int rc = unused_tensors(o, out);
    if (rc) return rc;
    if (o->need_vocab && !aft_model_get_info(*out)->has_vocab) {
        cli_error(NULL, "%s: no metadata 'vocab' (the characters of the token ids): give --vocab FILE", o->weights);
        aft_model_free(*out);
        *out = NULL;
        return EXIT_DATA;
    }
    return 0;
}

const char *cli_shipped_place(int i, char *buf, size_t cap)
{
    if (i == 1) {
        snprintf(buf, cap, "%s/%s", AFT_DATADIR, CLI_SHIPPED_NAME);
        return buf;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return NULL;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return NULL;
    *slash = 0;
    snprintf(buf, cap, "%s/" CLI_SHIPPED_MODEL, self);
    return buf;
}

const char *cli_shipped_model(const char *cmd, const char *what, char *buf, size_t cap)
{
    const char *beside = cli_shipped_place(0, buf, cap);
    if (beside && cli_path_exists(beside)) return buf;
    char datadir[4096];
    if (cli_path_exists(cli_shipped_place(1, datadir, sizeof datadir))) {
        snprintf(buf, cap, "%s", datadir);
        return buf;
    }
    cli_error(cmd, "%s the model shipped with aft (%s beside the aft binary, or %s), which is not there: give "
              "--weights FILE", what, beside ? beside : CLI_SHIPPED_MODEL, datadir);
    return NULL;
}

void cli_model_info_json(struct cJSON *j, const char *path, const aft_model_info *in)
{
    cJSON_AddStringToObject(j, "model", path);
    cJSON_AddStringToObject(j, "variant", aft_variant_name(in->variant));
    cJSON_AddNumberToObject(j, "window", (double)in->window);
    cJSON_AddNumberToObject(j, "n_layers", (double)in->n_layers);
    cJSON_AddNumberToObject(j, "d_model", (double)in->d_model);
    cJSON_AddNumberToObject(j, "d_ff", (double)in->d_ff);
    cJSON_AddNumberToObject(j, "n_vocab", (double)in->n_vocab);
    if (in->context == SIZE_MAX) cJSON_AddNullToObject(j, "context");
    else cJSON_AddNumberToObject(j, "context", (double)in->context);
    cJSON_AddStringToObject(j, "weights_dtype", cli_dtype_lower(in->weights_dtype));
}

const char *cli_weights_dtype(aft_dtype stored, const aft_config *cfg)
{
    /* bf16 products (with an engine) hold W as bf16, whatever it was stored as */
    if (cfg->precision == AFT_PRECISION_BF16 && strcmp(aft_bf16_engine_in_use(), "none") != 0) return "bf16";
    return cli_dtype_lower(aft_weights_held(stored, cfg->projections));
}

const char *cli_dtype_lower(aft_dtype dt)
{
    return dt == AFT_F16 ? "f16" : dt == AFT_BF16 ? "bf16" : dt == AFT_F64 ? "f64" : "f32";
}

/* ---------------------------------------------------------------- token ids */

/* one integer of any integer dtype, as int64 (u64 above INT64_MAX: -1,
 * outside every vocabulary anyway) */
static int64_t int_at(const aft_tensor *t, size_t i)
{
    const void *d = t->data;
    switch (t->dtype) {
    case AFT_U8: return ((const uint8_t *)d)[i];
    case AFT_I8: return ((const int8_t *)d)[i];
    case AFT_I16: return ((const int16_t *)d)[i];
    case AFT_U16: return ((const uint16_t *)d)[i];
    case AFT_I32: return ((const int32_t *)d)[i];
    case AFT_U32: return ((const uint32_t *)d)[i];
    case AFT_I64: return ((const int64_t *)d)[i];
    case AFT_U64: return ((const uint64_t *)d)[i] > (uint64_t)INT64_MAX ? -1 : (int64_t)((const uint64_t *)d)[i];
    default: return -1;
    }
}

int cli_tokens_read(const char *cmd, const char *file, size_t V, int tbd, cli_tokens *out)
{
    memset(out, 0, sizeof *out);
    aft_error err;
    aft_tensor t;
    if (aft_npy_read(file, &t, NULL, &err) != AFT_OK) {
        cli_report_file(NULL, file, err.msg);
        return EXIT_DATA;
    }
    int rc = EXIT_DATA;
    if (aft_dtype_is_float(t.dtype) || t.dtype == AFT_BOOL) {
        cli_error(NULL, "%s: tokens have dtype %s; they must be integers (token ids)", cli_display_name(file),
                  aft_dtype_name(t.dtype));
        goto done;
    }
    if (t.ndim != 1 && t.ndim != 2) {
        cli_error(NULL, "%s: tokens must be [T] or [B, T]%s; they have %zu dimensions", cli_display_name(file),
                  tbd ? " ([T, B] with --layout tbd)" : "", t.ndim);
        goto done;
    }
    out->rank = t.ndim;
    size_t d0 = t.shape[0], d1 = t.ndim == 2 ? t.shape[1] : 1;
    out->B = t.ndim == 1 ? 1 : tbd ? d1 : d0;
    out->T = t.ndim == 1 ? d0 : tbd ? d0 : d1;
    if (!(out->ids = malloc(t.nelem * sizeof(int32_t) + 1))) {
        cli_error(cmd, "out of memory for %zu tokens", t.nelem);
        goto done;
    }
    for (size_t i = 0; i < t.nelem; i++) {
        int64_t v = int_at(&t, i);
        if (v < 0 || (uint64_t)v >= V) {
            if (t.ndim == 1)
                cli_error(NULL, "%s: token %" PRId64 " at [%zu] is outside the vocabulary [0, %zu)",
                          cli_display_name(file), v, i, V);
            else
                cli_error(NULL, "%s: token %" PRId64 " at [%zu, %zu] is outside the vocabulary [0, %zu)",
                          cli_display_name(file), v, i / d1, i % d1, V);
            goto done;
        }
        /* the file's [T, B] to [B, T] */
        size_t at = t.ndim == 2 && tbd ? (i % d1) * d0 + i / d1 : i;
        out->ids[at] = (int32_t)v;
    }
    rc = 0;
done:
    aft_tensor_free(&t);
    if (rc) {
        free(out->ids);
        out->ids = NULL;
    }
    return rc;
}

/* ---------------------------------------------------------------- aft model: options */

struct model_opts {
    cli_model_opts m;
    const char *tokens, *out_path, *targets, *timing_path;
    int tbd;
    int grad;          /* --grad: the loss and every parameter's gradient */
    double dropout;    /* --grad's dropout (labml's), 0: none */
    uint64_t seed;     /* its masks' seed */
};

#define FIELD(f) offsetof(struct model_opts, f)

static int set_layout(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_layout("model", &((struct model_opts *)opts)->tbd, v);
}

static int set_impl(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_impl("model", &((struct model_opts *)opts)->m.impl, v);
}

static int set_dropout(const cli_option *opt, void *opts, const char *v)
{
    double *d = &((struct model_opts *)opts)->dropout;
    if (cli_parse_double(v, d) != 0 || *d < 0.0 || *d >= 1.0)
        return cli_usage_error("model", "--dropout takes a probability in [0, 1)");
    return 0;
}

static int set_seed(const cli_option *opt, void *opts, const char *v)
{
    if (aft_parse_u64(v, &((struct model_opts *)opts)->seed) != 0)
        return cli_usage_error("model", "--seed takes a whole number >= 0");
    return 0;
}

static int set_tokens(void *opts, const char *arg)
{
    struct model_opts *o = opts;
    if (o->tokens) return cli_usage_error("model", "more than one TOKENS: '%s' and '%s'", o->tokens, arg);
    o->tokens = arg;
    return 0;
}

static const cli_option options[] = {
    {"--weights", NULL, "FILE",
     "the model: a .safetensors export of its state_dict() (required)", cli_model_set_weights, FIELD(m),
     "--weights needs a file", 0},
    {"-o", "--output", "FILE",
     "the logits, .npy float32 (default: stdout; on a terminal, a summary instead)", cli_set_string,
     FIELD(out_path), "-o needs a file", 0},
    {"--layout", NULL, "btd|tbd",
     "TOKENS [B, T] (default) or labml's seq-first [T, B]; the logits follow", set_layout, 0,
     "--layout needs btd or tbd", 0},
    {"--window", NULL, "S", "local: the window (default: metadata 'window', else local_mask's band)",
     cli_model_set_window, FIELD(m), "--window needs a value", 0},
    {"--threads", NULL, "N", "threads (default: the cores aft may run on)", cli_model_set_threads, FIELD(m),
     "--threads needs a value", 0},
    {"--impl", NULL, "fast|reference", "reference: the plain float64 kernels", set_impl, 0,
     "--impl needs fast or reference", 0},
    {"--precision", NULL, "f32|bf16", CLI_PRECISION_HELP, cli_model_set_precision, FIELD(m),
     "--precision needs f32 or bf16", 0},
    {"--max-memory", NULL, "SIZE",
     "refuse runs needing more (bytes, or with K, M, G; default: the memory available)",
     cli_model_set_max_memory, FIELD(m), "--max-memory needs a size", 0},
    {"--strict", NULL, NULL, CLI_MODEL_STRICT_HELP, cli_model_set_strict, FIELD(m), NULL, 0},
    {"--grad", NULL, NULL,
     "write the mean cross-entropy (metadata 'loss') and every trained parameter's gradient, under labml's "
     "names, as .safetensors, instead of the logits", cli_set_flag, FIELD(grad), NULL, 0},
    {"--targets", NULL, "FILE",
     "--grad: the token each position predicts, shaped as TOKENS (default: the next token of TOKENS; the last "
     "position predicts nothing)", cli_set_string, FIELD(targets), "--targets needs a file", 0},
    {"--dropout", NULL, "P", "--grad: labml's dropout with probability P (default 0: none)", set_dropout, 0,
     "--dropout needs a value", 0},
    {"--seed", NULL, "N", "--grad: the seed of the dropout masks (default 0)", set_seed, 0,
     "--seed needs a value", 0},
    {"--timing", NULL, "FILE",
     "write timings and the configuration as JSON (the model's sizes, weights_dtype, load_ms, compute_ms, ...)",
     cli_set_string, FIELD(timing_path), "--timing needs a file", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_model_command = {
    .name = "model",
    .usage = "usage: aft model --weights FILE [options] TOKENS\n"
             "\n"
             "Runs labml's autoregressive AFT model (its AutoregressiveTransformer) on\n"
             "TOKENS, integer token ids [T] or [B, T] in a .npy ('-': stdin), and writes\n"
             "its logits, float32 [T, V] or [B, T, V]. Layers, sizes, the vocabulary\n"
             "size and the variant come from the checkpoint. With --grad, the loss of\n"
             "predicting the next token (or --targets) and its gradient for every\n"
             "trained parameter instead (PyTorch's loss.backward() on labml's model).\n",
    .options = options,
    .more = CLI_MODEL_MORE,
    .operand = set_tokens,
};

/* ---------------------------------------------------------------- aft model: steps */

struct model_run {
    aft_model *model;
    const aft_model_info *info;
    size_t B, T, rank;
    int32_t *tokens;    /* (B, T), batch-major */
    float *logits;      /* (B, T, V), batch-major */
    double t_start, t_loaded, t_computed, t_written;   /* ms */
};

/* TOKENS into r, no longer than the model reads at once */
static int load_tokens(const struct model_opts *o, struct model_run *r)
{
    cli_tokens tk;
    int rc = cli_tokens_read("model", o->tokens, r->info->n_vocab, o->tbd, &tk);
    if (rc) return rc;
    r->tokens = tk.ids;
    r->B = tk.B;
    r->T = tk.T;
    r->rank = tk.rank;
    if (r->T > r->info->context) {
        cli_error(NULL, "%s: %zu tokens a sequence, but the model reads at most %zu at once (the rows of '%s'); "
                  "aft generate streams on past that", cli_display_name(o->tokens), r->T, r->info->context,
                  r->info->context_from ? r->info->context_from : "?");
        return EXIT_DATA;
    }
    return 0;
}

/* refuse, with both numbers, a run the machine cannot hold: the logits,
 * four activations a row (x, the norm's output, a layer's output, the
 * FFN's hidden row) and a layer's workspace */
static int check_memory(const struct model_opts *o, const struct model_run *r)
{
    const aft_model_info *in = r->info;
    size_t N = r->B * r->T, row = 3 * in->d_model + in->d_ff + in->n_vocab, need;
    aft_config cfg = {.variant = in->variant, .window = in->window, .causal = 1, .threads = o->m.threads,
                      .impl = o->m.impl,
                      .heads = in->variant == AFT_CONV && in->key_channels != in->d_hidden ? in->key_channels : 1};
    size_t ws = aft_workspace_bytes(&cfg, r->B, r->T, in->d_model, in->d_hidden, 0);
    if (__builtin_mul_overflow(N, row * sizeof(float), &need) || __builtin_add_overflow(need, ws, &need))
        need = SIZE_MAX;
    size_t limit = o->m.max_memory ? o->m.max_memory : aft_available_memory();
    if (limit && need > limit) {
        cli_error("model", "this run needs about %s but %s %s", cli_bytes_text(need).s,
                  o->m.max_memory ? "--max-memory allows" : "only", cli_bytes_text(limit).s);
        return EXIT_DATA;
    }
    return 0;
}

static int compute(const struct model_opts *o, struct model_run *r)
{
    size_t V = r->info->n_vocab, bytes;
    /* B * T tokens were read, so B * T fits; times V need not */
    if (__builtin_mul_overflow(r->B * r->T, V * sizeof(float), &bytes) ||
        !(r->logits = malloc(bytes + 1))) {
        cli_error("model", "out of memory for the logits (%zu x %zu)", r->B * r->T, V);
        return EXIT_DATA;
    }
    aft_error err;
    cli_progress_start("aft model: B=%zu T=%zu", r->B, r->T);
    aft_status st =
        aft_model_forward_progress(r->model, r->logits, r->tokens, r->B, r->T, cli_progress_counter(), &err);
    cli_progress_stop();
    if (st != AFT_OK) {
        cli_error("model", "%s", err.msg);
        return EXIT_DATA;
    }
    return 0;
}

/* the logits in the tokens' layout and rank, to -o or stdout as .npy, or a
 * summary on a terminal */
static int write_logits(const struct model_opts *o, struct model_run *r)
{
    size_t B = r->B, T = r->T, V = r->info->n_vocab;
    float *y = r->logits;
    if (o->tbd && r->rank == 2) {   /* [B, T, V] -> [T, B, V] */
        if (!(y = cli_swap_tb(r->logits, B, T, V, 1))) {
            cli_error("model", "out of memory");
            return EXIT_DATA;
        }
        free(r->logits);
        r->logits = y;
    }
    /* tokens [T] or [B, T] give logits as an input [T, D] or [B, T, D] would */
    aft_tensor yt = cli_output_shaped(y, r->rank + 1, o->tbd, B, T, 0, 0, V);
    if (!o->out_path && isatty(STDOUT_FILENO)) {
        if (cli_show_tensor(stdout, &yt) != 0) {
            cli_error("model", "out of memory");
            return EXIT_DATA;
        }
        puts("(not saved: -o FILE or a pipe writes the logits as .npy)");
        return 0;
    }
    return cli_write_npy(o->out_path, &yt);
}

/* ---------------------------------------------------------------- aft model --grad */

/* the targets: --targets (shaped as TOKENS), else each token's next, -1
 * (ignored) at a sequence's last position */
static int load_targets(const struct model_opts *o, const struct model_run *r, int32_t **out)
{
    if (o->targets) {
        cli_tokens tk;
        int rc = cli_tokens_read("model", o->targets, r->info->n_vocab, o->tbd, &tk);
        if (rc) return rc;
        if (tk.B != r->B || tk.T != r->T) {
            cli_error(NULL, "%s: %zu x %zu targets for %zu x %zu tokens", cli_display_name(o->targets), tk.B, tk.T,
                      r->B, r->T);
            free(tk.ids);
            return EXIT_DATA;
        }
        *out = tk.ids;
        return 0;
    }
    int32_t *y = malloc(r->B * r->T * sizeof *y + 1);
    if (!y) {
        cli_error("model", "out of memory for the targets");
        return EXIT_DATA;
    }
    for (size_t b = 0; b < r->B; b++)
        for (size_t t = 0; t < r->T; t++) y[b * r->T + t] = t + 1 < r->T ? r->tokens[b * r->T + t + 1] : -1;
    *out = y;
    return 0;
}

/* the gradients as .safetensors (labml's names, metadata 'loss') to -o or
 * stdout; on a terminal without -o, the loss only */
static int write_grads(const struct model_opts *o, aft_model *m, float *const *g, float loss)
{
    char lossbuf[32];
    snprintf(lossbuf, sizeof lossbuf, "%.9g", (double)loss);
    if (!o->out_path && isatty(STDOUT_FILENO)) {
        printf("loss %s\n(not saved: -o FILE or a pipe writes the gradients as .safetensors)\n", lossbuf);
        return 0;
    }
    size_t np = aft_model_param_count(m), n = 0;
    const char **names = calloc(np + 1, sizeof *names);
    aft_tensor *t = calloc(np + 1, sizeof *t);
    int rc = 0;
    if (!names || !t) {
        cli_error("model", "out of memory");
        rc = EXIT_DATA;
    }
    for (size_t i = 0; !rc && i < np; i++) {
        if (!aft_model_param_trainable(m, i)) continue;
        size_t nd, sh[4];
        aft_model_param_info(m, i, &names[n], &nd, sh, NULL);
        t[n] = (aft_tensor){.dtype = AFT_F32, .ndim = nd, .data = g[i], .nelem = 1};
        for (size_t d = 0; d < nd; d++) t[n].nelem *= (t[n].shape[d] = sh[d]);
        t[n].nbytes = t[n].nelem * sizeof(float);
        n++;
    }
    const char *meta[] = {"format", "pt", "loss", lossbuf};
    aft_error err;
    if (!rc && aft_st_write(o->out_path ? o->out_path : "-", names, t, n, meta, 2, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        rc = EXIT_DATA;
    }
    free(names);
    free(t);
    return rc;
}

static int run_grad(const struct model_opts *o, struct model_run *r)
{
    int32_t *targets = NULL;
    int rc = load_targets(o, r, &targets);
    if (rc) return rc;
    aft_model *m = r->model;
    size_t np = aft_model_param_count(m);
    aft_error err;
    float **g = calloc(np + 1, sizeof *g), loss = 0.0f;
    if (np == 0) {
        aft_model_param_info(m, 0, NULL, NULL, NULL, &err);
        cli_error("model", "%s: %s", o->m.weights, err.msg);
        rc = EXIT_DATA;
    } else if (!g) {
        cli_error("model", "out of memory for the gradients");
        rc = EXIT_DATA;
    }
    for (size_t i = 0; !rc && i < np; i++) {
        size_t nd, sh[4], n = 1;
        aft_model_param_info(m, i, NULL, &nd, sh, NULL);
        for (size_t d = 0; d < nd; d++) n *= sh[d];
        if (!(g[i] = malloc(n * sizeof(float) + 1))) {
            cli_error("model", "out of memory for the gradients");
            rc = EXIT_DATA;
        }
    }
    aft_train_options to = {.dropout = (float)o->dropout, .seed = o->seed, .threads = o->m.threads};
    if (!rc) {
        cli_progress_start("aft model --grad: B=%zu T=%zu", r->B, r->T);
        aft_status st = aft_model_loss_grad(m, r->tokens, targets, r->B, r->T, &to, &loss, g, &err);
        cli_progress_stop();
        if (st != AFT_OK) {
            cli_error("model", "%s", err.msg);
            rc = EXIT_DATA;
        }
    }
    if (!rc) rc = write_grads(o, m, g, loss);
    for (size_t i = 0; g && i < np; i++) free(g[i]);
    free(g);
    free(targets);
    return rc;
}

/* --timing's JSON into out: the model, what its weights are held in, the
 * run's sizes and times */
static int write_timing(aft_out *out, const struct model_opts *o, const struct model_run *r)
{
    cJSON *j = cJSON_CreateObject();
    cli_model_info_json(j, o->m.weights, r->info);
    cJSON_AddNumberToObject(j, "threads", o->m.threads ? o->m.threads : aft_cores());
    cli_level_json(j);
    cJSON_AddStringToObject(j, "impl", o->m.impl == AFT_IMPL_REFERENCE ? "reference" : "fast");
    cJSON_AddNumberToObject(j, "batch", (double)r->B);
    cJSON_AddNumberToObject(j, "seq_len", (double)r->T);
    cJSON_AddNumberToObject(j, "load_ms", r->t_loaded - r->t_start);
    cJSON_AddNumberToObject(j, "compute_ms", r->t_computed - r->t_loaded);
    cJSON_AddNumberToObject(j, "write_ms", r->t_written - r->t_computed);
    cJSON_AddNumberToObject(j, "total_ms", aft_now_ms() - r->t_start);
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)aft_peak_rss());
    return cli_write_json(out, "model", j);
}

int cmd_model(int argc, char **argv)
{
    struct model_opts o = {.m = {.cmd = "model"}};
    int rc = cli_parse_options(&cli_model_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("model") : rc;
    if (!o.m.weights) return cli_usage_error("model", "--weights FILE is required: the model");
    if (!o.tokens) return cli_usage_error("model", "no TOKENS given");
    if (!o.grad && (o.targets || o.dropout > 0.0 || o.seed))
        return cli_usage_error("model", "--targets, --dropout and --seed go with --grad");
    if (o.grad && (o.m.impl == AFT_IMPL_REFERENCE || o.m.precision == AFT_PRECISION_BF16))
        return cli_usage_error("model", "--grad computes in float32: drop --impl and --precision");
    if (o.m.precision == AFT_PRECISION_BF16 && o.m.impl == AFT_IMPL_REFERENCE)
        return cli_usage_error("model", "--precision bf16 applies to the fast kernels; --impl reference computes in "
                               "float64");

    struct model_run r = {.t_start = aft_now_ms()};
    aft_out tout;
    aft_error err;
    if (o.timing_path && aft_out_open(&tout, o.timing_path, &err) != AFT_OK) {
        cli_error("model", "%s", err.msg);
        return EXIT_DATA;
    }
    rc = cli_model_open(&o.m, &r.model);
    if (!rc) {
        r.info = aft_model_get_info(r.model);
        rc = load_tokens(&o, &r);
    }
    r.t_loaded = aft_now_ms();
    if (!rc && o.grad) {
        rc = run_grad(&o, &r);
        r.t_computed = r.t_written = aft_now_ms();
    } else {
        if (!rc) rc = check_memory(&o, &r);
        if (!rc) rc = compute(&o, &r);
        r.t_computed = aft_now_ms();
        if (!rc) rc = write_logits(&o, &r);
        r.t_written = aft_now_ms();
    }
    if (o.timing_path) {
        if (!rc) rc = write_timing(&tout, &o, &r);
        if (!rc && aft_out_commit(&tout, &err) != AFT_OK) {
            cli_error("model", "%s", err.msg);
            rc = EXIT_DATA;
        }
        if (rc) aft_out_abort(&tout);
    }
    free(r.tokens);
    free(r.logits);
    aft_model_free(r.model);
    if (rc == 0 && !o.out_path) return cli_finish_stdout("model");
    return rc;
}
