/* train.c - aft train: train labml's autoregressive AFT model on a text, as
 * testdata/model/train_labml_aft.py does in PyTorch (the same model,
 * initialisation distributions, schedule, clipping and Adam), data parallel
 * over the ranks of an MPI launcher (train_mpi.c).
 *
 * cmd_train reads as its steps: parse the options, read the text (or the
 * fixed batches), make the model (fresh, --init or --resume), then train:
 * each step draws its windows, takes the loss and the gradients
 * (aft_model_loss_grad), sums them over the ranks (one allreduce), clips,
 * and steps Adam; every --val-every steps the held-out loss, every
 * --save-every steps (and on SIGINT or SIGTERM) the checkpoint, atomically,
 * from rank 0. */
#include "cli.h"
#include "train_mpi.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- options */

struct train_opts {
    const char *text, *valid, *init, *batches, *output, *state, *resume, *log, *timing;
    size_t layers, d_model, d_ff, window, seq_len, batch, steps, warmup, val_every, val_windows, save_every, stop_at;
    double lr, pos_bias_mult, dropout;
    uint64_t seed;
    int threads;
};

#define FIELD(f) offsetof(struct train_opts, f)
#define TO(opts) ((struct train_opts *)(opts))

/* a whole number into the size_t at opt->field, from 0 or 1 up */
static int set_size(const cli_option *opt, void *opts, const char *v)
{
    size_t x;
    int zero_ok = strcmp(opt->name, "--val-every") == 0 || strcmp(opt->name, "--save-every") == 0 ||
                  strcmp(opt->name, "--warmup") == 0 || strcmp(opt->name, "--val-windows") == 0;
    if (aft_parse_size(v, &x) != 0 || (!zero_ok && x == 0) || x > ((size_t)1 << 40))
        return cli_usage_error("train", "%s takes a whole number from %d", opt->name, zero_ok ? 0 : 1);
    *(size_t *)((char *)opts + opt->field) = x;
    return 0;
}

static int set_double(const cli_option *opt, void *opts, const char *v)
{
    double x;
    int unit = strcmp(opt->name, "--dropout") == 0;
    if (cli_parse_double(v, &x) != 0 || !(x >= 0) || x > 1e6 || (unit && x >= 1))
        return cli_usage_error("train", "%s takes a number %s", opt->name, unit ? "from 0 up to (not) 1" : ">= 0");
    *(double *)((char *)opts + opt->field) = x;
    return 0;
}

static int set_seed(const cli_option *opt, void *opts, const char *v)
{
    if (aft_parse_u64(v, &TO(opts)->seed) != 0) return cli_usage_error("train", "--seed takes a whole number >= 0");
    return 0;
}

static int set_threads(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_threads("train", &TO(opts)->threads, v);
}

#define NEEDS_VALUE "%s needs a value"

static const cli_option options[] = {
    {"--text", NULL, "FILE", "the UTF-8 text to train on (required)", cli_set_string, FIELD(text), NEEDS_VALUE, 0},
    {"--valid", NULL, "FILE", "held-out UTF-8 text: its loss every --val-every steps (and at the end)",
     cli_set_string, FIELD(valid), NEEDS_VALUE, 0},
    {"--init", NULL, "FILE", "start from this checkpoint (any that aft model reads) and its vocabulary, instead of "
     "a fresh model", cli_set_string, FIELD(init), NEEDS_VALUE, 0},
    {"--resume", NULL, "FILE", "continue the run whose --state file this is: the model, Adam's moments, the step "
     "and the generator; the options must be the run's", cli_set_string, FIELD(resume), NEEDS_VALUE, 0},
    {"--batches", NULL, "FILE", "fixed token windows instead of drawing them: a .npy of integers (steps, B, T + 1), "
     "step s reading row s (modulo the rows); B the whole batch over the ranks", cli_set_string, FIELD(batches),
     NEEDS_VALUE, 0},
    {"-o", "--output", "FILE", "the checkpoint (required): labml's state dict, vocabulary and metadata, as aft model "
     "and PyTorch's load_state_dict(strict=True) read it", cli_set_string, FIELD(output), NEEDS_VALUE, 0},
    {"--state", NULL, "FILE", "where the resume state goes with each save (default: OUTPUT.state)", cli_set_string,
     FIELD(state), NEEDS_VALUE, 0},
    {"--layers", NULL, "N", "a fresh model's layers (default 6)", set_size, FIELD(layers), NEEDS_VALUE, 0},
    {"--d-model", NULL, "D", "a fresh model's width (default 128)", set_size, FIELD(d_model), NEEDS_VALUE, 0},
    {"--d-ff", NULL, "F", "a fresh model's FFN width (default 256)", set_size, FIELD(d_ff), NEEDS_VALUE, 0},
    {"--window", NULL, "S", "a fresh model's AFT-local window (default 32)", set_size, FIELD(window), NEEDS_VALUE, 0},
    {"--seq-len", NULL, "T", "the length of each training window, and a fresh model's pos_bias size (default 256; "
     "--init: the model's)", set_size, FIELD(seq_len), NEEDS_VALUE, 0},
    {"--batch", NULL, "B", "windows a step on each rank (default 32)", set_size, FIELD(batch), NEEDS_VALUE, 0},
    {"--steps", NULL, "N", "steps of Adam (default 1000)", set_size, FIELD(steps), NEEDS_VALUE, 0},
    {"--lr", NULL, "LR", "the peak learning rate (default 2e-3)", set_double, FIELD(lr), NEEDS_VALUE, 0},
    {"--warmup", NULL, "N", "steps of linear warm-up before the cosine decay to lr/10 (default 100)", set_size,
     FIELD(warmup), NEEDS_VALUE, 0},
    {"--pos-bias-lr-mult", NULL, "X", "pos_bias's learning rate as a multiple of the others' (default 100)",
     set_double, FIELD(pos_bias_mult), NEEDS_VALUE, 0},
    {"--dropout", NULL, "P", "dropout after each sublayer and inside the FFN, seeded (default 0.1; 0: none)",
     set_double, FIELD(dropout), NEEDS_VALUE, 0},
    {"--seed", NULL, "N", "the seed of the initialisation, the windows and dropout (default 1)", set_seed, 0,
     NEEDS_VALUE, 0},
    {"--val-every", NULL, "N", "the held-out loss every N steps (default 250; 0: only at the end)", set_size,
     FIELD(val_every), NEEDS_VALUE, 0},
    {"--val-windows", NULL, "N", "the held-out loss over the first N windows of T + 1 (default 0: all)", set_size,
     FIELD(val_windows), NEEDS_VALUE, 0},
    {"--save-every", NULL, "N", "write the checkpoint and the state every N steps (default 0: at the end only)",
     set_size, FIELD(save_every), NEEDS_VALUE, 0},
    {"--log", NULL, "FILE", "one JSON object a step: step, loss, lr, grad_norm, tokens_per_s (and val_loss)",
     cli_set_string, FIELD(log), NEEDS_VALUE, 0},
    {"--timing", NULL, "FILE", "write the run's timing and memory as JSON (\"-\": standard output)", cli_set_string,
     FIELD(timing), NEEDS_VALUE, 0},
    {"--threads", NULL, "N", "threads on each rank (default: the cores it may run on)", set_threads, 0, NEEDS_VALUE, 0},
    {"--stop-at", NULL, "N", "save and stop after step N, as a signal would, but exit 0 (for tests of --resume)",
     set_size, FIELD(stop_at), NEEDS_VALUE, 1},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_train_command = {
    "train",
    "usage: aft train --text FILE -o FILE [options]\n"
    "       mpirun -np N aft train ...   (each rank B windows; gradients averaged)\n"
    "\n"
    "Train labml's autoregressive AFT language model (AFT-local layers, the model\n"
    "aft model runs) on a text, as testdata/model/train_labml_aft.py does in\n"
    "PyTorch: Adam (betas 0.9, 0.98, eps 1e-9), warm-up then cosine decay,\n"
    "pos_bias at --pos-bias-lr-mult times the learning rate, gradients clipped\n"
    "at norm 1. The vocabulary is the text's characters (with --valid's), or\n"
    "--init's.\n",
    options,
    "A non-finite loss stops the run, naming the step; the last checkpoint\n"
    "written stays. SIGINT and SIGTERM save the checkpoint and the state, then\n"
    "stop. --resume refuses a state of another configuration.\n",
    NULL,
    NULL,
};

/* ---------------------------------------------------------------- the run */

typedef struct {
    struct train_opts *o;
    cli_ranks ranks;
    int32_t *ids;           /* the text's tokens */
    size_t n_ids;
    int32_t *val;           /* the held-out text's */
    size_t n_val;
    aft_tensor batches;     /* --batches, as read */
    int32_t *bt;            /* its tokens */
    size_t T, B;            /* window, windows a step on this rank */
    char *vocab;            /* JSON */
    void *fresh;            /* a fresh model's safetensors bytes */
    size_t fresh_len;
    aft_st_file *src;       /* where the model came from (its buffers are saved as they are) */
    aft_st_file *resume;
    aft_model *m;
    size_t np;              /* trained parameters */
    size_t *idx;            /* their indices among the model's (aft_model_param_*) */
    float **gall;           /* the gradients by the model's index (NULL: a buffer, not wanted) */
    float **p, **g;         /* their values, their gradients (in one block: one allreduce) */
    float *gblock;
    size_t *len;
    double *lr;
    aft_adam *adam;
    uint64_t rng;           /* the windows' generator */
    int stop;               /* a rank had SIGINT or SIGTERM by the last step */
    size_t step;            /* steps done */
    size_t first_step;      /* where this process began (a resumed run's step) */
    size_t saved_step;      /* the last step saved (SIZE_MAX: none) */
    FILE *log;
    double t_start, t_steps;
    char *config;           /* the configuration a state must match (JSON) */
} run;

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig)
{
    stop_signal = sig;
}

/* the whole of a file into *buf (NUL-terminated), or an exit status after reporting */
static int read_all(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error(NULL, "%s: %s", path, strerror(errno));
        return EXIT_DATA;
    }
    aft_strbuf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) aft_strbuf_add(&b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    if (bad || b.oom) {
        free(b.p);
        cli_error(NULL, "%s: %s", path, bad ? "read error" : "out of memory");
        return EXIT_DATA;
    }
    *buf = b.p ? b.p : calloc(1, 1);
    *len = b.len;
    return 0;
}

/* text into the model's tokens */
static int tokenize(run *r, const char *path, int32_t **ids, size_t *n)
{
    char *text;
    size_t len;
    int rc = read_all(path, &text, &len);
    if (rc) return rc;
    aft_error err;
    char *json = NULL;
    size_t nv;
    /* the vocabulary's checks say what an empty or binary text is */
    if (aft_train_vocab(&json, &nv, text, len, &err) != AFT_OK) {
        free(text);
        cli_report_file(NULL, path, err.msg);
        return EXIT_DATA;
    }
    free(json);
    aft_status st = aft_model_tokenize(r->m, ids, n, text, len, &err);
    free(text);
    if (st) {
        cli_report_file(NULL, path, err.msg);
        return EXIT_DATA;
    }
    return 0;
}

/* the vocabulary of --text and --valid together, as the script builds it */
static int text_vocab(run *r)
{
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    int rc = read_all(r->o->text, &a, &la);
    if (!rc && r->o->valid) rc = read_all(r->o->valid, &b, &lb);
    if (rc) {
        free(a);
        return rc;
    }
    aft_error err;
    size_t nv;
    if (la == 0) {
        cli_error(NULL, "%s: the text is empty", r->o->text);
        rc = EXIT_DATA;
    } else {
        aft_strbuf all = {0};
        aft_strbuf_add(&all, a, la);
        if (b) aft_strbuf_add(&all, b, lb);
        if (all.oom) {
            cli_error(NULL, "out of memory");
            rc = EXIT_DATA;
        } else if (aft_train_vocab(&r->vocab, &nv, all.p, all.len, &err) != AFT_OK) {
            /* name the file the offset is in */
            int in_a = aft_train_vocab(&(char *){NULL}, &nv, a, la, &(aft_error){{0}}) != AFT_OK;
            cli_error(NULL, "%s: %s", in_a ? r->o->text : r->o->valid, err.msg);
            rc = EXIT_DATA;
        }
        free(all.p);
    }
    free(a);
    free(b);
    return rc;
}

/* the model: --resume's, --init's, or a fresh one */
static int make_model(run *r)
{
    aft_error err;
    aft_model_options mo = {.threads = r->o->threads};
    const char *path = r->o->resume ? r->o->resume : r->o->init;
    aft_status st;
    if (path) {
        st = aft_st_open(path, &r->src, &err);
        if (!st) st = aft_model_load(&r->m, r->src, &mo, &err);
    } else {
        int rc = text_vocab(r);
        if (rc) return rc;
        aft_model_config c = {
            .n_layers = r->o->layers, .d_model = r->o->d_model, .d_ff = r->o->d_ff, .window = r->o->window,
            .seq_len = r->o->seq_len, .n_vocab = 0, .vocab = r->vocab,
        };
        cJSON *v = cJSON_Parse(r->vocab);
        c.n_vocab = (size_t)cJSON_GetArraySize(v);
        cJSON_Delete(v);
        path = "the fresh model";
        st = aft_train_fresh(&r->fresh, &r->fresh_len, &c, r->o->seed, &err);
        if (!st) st = aft_st_open_mem(r->fresh, r->fresh_len, &r->src, &err);
        if (!st) st = aft_model_load(&r->m, r->src, &mo, &err);
    }
    if (st) {
        cli_report_file(NULL, path, err.msg);
        return EXIT_DATA;
    }
    const aft_model_info *in = aft_model_get_info(r->m);
    if (!in->has_vocab) {
        cli_error(NULL, "%s: the checkpoint has no vocabulary (metadata 'vocab')", path);
        return EXIT_DATA;
    }
    if (in->variant != AFT_LOCAL) {
        cli_error(NULL, "%s: aft train trains labml's AFTLocal model; this checkpoint's layers are another variant",
                  path);
        return EXIT_DATA;
    }
    r->T = r->o->seq_len ? r->o->seq_len : in->context;   /* --init, --resume: the model's unless given */
    if (r->T > in->context) {
        cli_error(NULL, "%s: --seq-len %zu is longer than the model reads at once (%zu)", path, r->T, in->context);
        return EXIT_DATA;
    }
    return 0;
}

/* the parameters, their gradients in one block, Adam */
static int make_optimiser(run *r)
{
    aft_error err;
    size_t all = aft_model_param_count(r->m);
    r->idx = calloc(all ? all : 1, sizeof *r->idx);
    if (!r->idx) goto oom;
    for (size_t i = 0; i < all; i++)
        if (aft_model_param_trainable(r->m, i)) r->idx[r->np++] = i;
    if (r->np == 0) {
        aft_status st = aft_model_param_info(r->m, 0, &(const char *){NULL}, &(size_t){0}, (size_t[4]){0}, &err);
        cli_error(NULL, "%s", st ? err.msg : "the model has no parameters to train");
        return EXIT_DATA;
    }
    r->p = calloc(r->np, sizeof *r->p);
    r->g = calloc(r->np, sizeof *r->g);
    r->len = calloc(r->np, sizeof *r->len);
    r->lr = calloc(r->np, sizeof *r->lr);
    if (!r->p || !r->g || !r->len || !r->lr) goto oom;
    size_t total = 0;
    for (size_t i = 0; i < r->np; i++) {
        const char *name;
        size_t ndim, shape[4], n = 1;
        if (aft_model_param_info(r->m, r->idx[i], &name, &ndim, shape, &err)) {
            cli_error(NULL, "%s", err.msg);
            return EXIT_DATA;
        }
        for (size_t d = 0; d < ndim; d++) n *= shape[d];
        r->len[i] = n;
        r->p[i] = aft_model_param_data(r->m, r->idx[i]);
        if (!r->p[i]) {
            aft_model_loss_grad(r->m, NULL, NULL, 0, 0, NULL, &(float){0}, NULL, &err);
            cli_report_file(NULL, name, err.msg);
            return EXIT_DATA;
        }
        r->lr[i] = cli_ends_with(name, ".pos_bias") ? r->o->pos_bias_mult : 1.0;   /* multipliers, for now */
        total += n;
    }
    /* the gradients and, after them, the loss, a failure and a signal: one allreduce a step */
    r->gblock = calloc(total + 3, sizeof(float));
    if (!r->gblock) goto oom;
    r->gall = calloc(all, sizeof *r->gall);
    if (!r->gall) goto oom;
    for (size_t i = 0, off = 0; i < r->np; off += r->len[i++]) r->gall[r->idx[i]] = r->g[i] = r->gblock + off;
    if (aft_adam_new(&r->adam, r->len, r->np, 0.9, 0.98, 1e-9, &err)) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    return 0;
oom:
    cli_error(NULL, "out of memory for the gradients");
    return EXIT_DATA;
}

static size_t grad_floats(const run *r)
{
    size_t total = 0;
    for (size_t i = 0; i < r->np; i++) total += r->len[i];
    return total;
}

/* the configuration a --resume state must match */
static char *config_json(const run *r)
{
    const aft_model_info *in = aft_model_get_info(r->m);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "layers", (double)in->n_layers);
    cJSON_AddNumberToObject(j, "d_model", (double)in->d_model);
    cJSON_AddNumberToObject(j, "d_ff", (double)in->d_ff);
    cJSON_AddNumberToObject(j, "window", (double)in->window);
    cJSON_AddNumberToObject(j, "vocab", (double)in->n_vocab);
    cJSON_AddNumberToObject(j, "seq_len", (double)r->T);
    cJSON_AddNumberToObject(j, "batch", (double)(r->B * (size_t)r->ranks.size));
    cJSON_AddNumberToObject(j, "steps", (double)r->o->steps);
    cJSON_AddNumberToObject(j, "lr", r->o->lr);
    cJSON_AddNumberToObject(j, "warmup", (double)r->o->warmup);
    cJSON_AddNumberToObject(j, "pos_bias_lr_mult", r->o->pos_bias_mult);
    cJSON_AddNumberToObject(j, "dropout", r->o->dropout);
    cJSON_AddNumberToObject(j, "seed", (double)r->o->seed);
    cJSON_AddStringToObject(j, "batches", r->o->batches ? "file" : "drawn");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* --resume: the configuration must be this run's; then the moments, step and generator */
static int restore(run *r)
{
    const char *path = r->o->resume;
    const char *cfg = aft_st_metadata_find(r->src, "aft_train");
    if (!cfg) {
        cli_error(NULL, "%s: not an aft train state (no metadata 'aft_train')", path);
        return EXIT_DATA;
    }
    if (strcmp(cfg, r->config) != 0) {
        cJSON *a = cJSON_Parse(cfg), *b = cJSON_Parse(r->config);
        const char *key = "?";
        char was[64] = "?", now[64] = "?";
        for (cJSON *x = b ? b->child : NULL; x; x = x->next) {
            cJSON *y = cJSON_GetObjectItemCaseSensitive(a, x->string);
            char *sx = cJSON_PrintUnformatted(x), *sy = y ? cJSON_PrintUnformatted(y) : NULL;
            int differ = !sy || strcmp(sx, sy) != 0;
            if (differ) {
                key = x->string;
                snprintf(now, sizeof now, "%s", sx);
                snprintf(was, sizeof was, "%s", sy ? sy : "none");
            }
            free(sx);
            free(sy);
            if (differ) break;
        }
        cli_error(NULL, "%s: a state of another configuration: %s %s, this run's %s", path, key, was, now);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return EXIT_DATA;
    }
    for (size_t i = 0; i < r->np; i++) {
        const char *name;
        aft_error err;
        aft_model_param_info(r->m, r->idx[i], &name, &(size_t){0}, (size_t[4]){0}, &err);
        for (int w = 0; w < 2; w++) {
            char key[300];
            snprintf(key, sizeof key, "adam.%s.%s", w ? "v" : "m", name);
            const aft_tensor *t = aft_st_find(r->src, key);
            if (!t || t->dtype != AFT_F32 || t->nelem != r->len[i]) {
                cli_error(NULL, "%s: '%s' is missing or not %zu float32 values", path, key, r->len[i]);
                return EXIT_DATA;
            }
            memcpy(aft_adam_moment(r->adam, i, w), t->data, t->nbytes);
        }
    }
    const aft_tensor *st = aft_st_find(r->src, "train.state");
    if (!st || st->dtype != AFT_U64 || st->nelem != 2) {
        cli_error(NULL, "%s: 'train.state' is missing or not 2 uint64 values", path);
        return EXIT_DATA;
    }
    const uint64_t *s = st->data;
    r->step = (size_t)s[0];
    r->rng = s[1];
    aft_adam_set_steps(r->adam, s[0]);
    return 0;
}

/* the checkpoint (-o) and the state (--state), from rank 0; 0 or EXIT_DATA after reporting */
static int save(run *r)
{
    if (r->ranks.rank != 0) return 0;
    aft_error err;
    const aft_model_info *in = aft_model_get_info(r->m);
    char window[32], training[256], stepbuf[32];
    snprintf(window, sizeof window, "%zu", in->window);
    snprintf(stepbuf, sizeof stepbuf, "%zu", r->step);
    snprintf(training, sizeof training,
             "aft train: %zu of %zu steps of %zu x %zu tokens, Adam lr %g (pos_bias x %g), warm-up %zu, dropout %g, "
             "seed %llu", r->step, r->o->steps, r->B * (size_t)r->ranks.size, r->T, r->o->lr, r->o->pos_bias_mult,
             r->o->warmup, r->o->dropout, (unsigned long long)r->o->seed);
    const char *vocab = aft_st_metadata_find(r->src, "vocab");
    const char *meta[] = {"format", "pt", "vocab", vocab ? vocab : "[]", "window", window,
                          "model", "labml_nn AutoregressiveTransformer, AFTLocal self-attention",
                          "training", training, "step", stepbuf, "aft_train", r->config};
    if (aft_train_save(r->o->output, r->src, r->m, NULL, NULL, 0, meta, 6, &err)) {
        cli_report_file(NULL, r->o->output, err.msg);
        return EXIT_DATA;
    }
    /* the state: the model's tensors, Adam's moments, the step and the generator */
    size_t n = 2 * r->np + 1;
    const char **names = calloc(n, sizeof *names);
    char **owned = calloc(n, sizeof *owned);
    aft_tensor *ts = calloc(n, sizeof *ts);
    uint64_t state[2] = {r->step, r->rng};
    int rc = 0;
    if (!names || !owned || !ts) {
        cli_error(NULL, "out of memory saving the state");
        rc = EXIT_DATA;
        goto done;
    }
    for (size_t i = 0; i < r->np; i++) {
        const char *name;
        aft_model_param_info(r->m, r->idx[i], &name, &(size_t){0}, (size_t[4]){0}, &err);
        for (int w = 0; w < 2; w++) {
            size_t k = 2 * i + (size_t)w;
            size_t len = strlen(name) + 8;
            owned[k] = malloc(len);
            if (!owned[k]) {
                cli_error(NULL, "out of memory saving the state");
                rc = EXIT_DATA;
                goto done;
            }
            snprintf(owned[k], len, "adam.%s.%s", w ? "v" : "m", name);
            names[k] = owned[k];
            ts[k] = (aft_tensor){.dtype = AFT_F32, .ndim = 1, .shape = {r->len[i]}, .nelem = r->len[i],
                                 .nbytes = r->len[i] * sizeof(float), .data = aft_adam_moment(r->adam, i, w)};
        }
    }
    names[n - 1] = "train.state";
    ts[n - 1] = (aft_tensor){.dtype = AFT_U64, .ndim = 1, .shape = {2}, .nelem = 2, .nbytes = 16, .data = state};
    if (aft_train_save(r->o->state, r->src, r->m, names, ts, n, meta, 7, &err)) {
        cli_report_file(NULL, r->o->state, err.msg);
        rc = EXIT_DATA;
    } else {
        r->saved_step = r->step;
    }
done:
    for (size_t i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(names);
    free(ts);
    return rc;
}

/* this step's windows, (B, T + 1) on this rank, into w */
static int windows(run *r, int32_t *w)
{
    size_t W = r->T + 1, all = r->B * (size_t)r->ranks.size, first = r->B * (size_t)r->ranks.rank;
    if (r->o->batches) {
        const aft_tensor *a = &r->batches;
        size_t row = r->step % a->shape[0];
        const int32_t *src = r->bt + row * all * W;
        memcpy(w, src + first * W, r->B * W * sizeof *w);
        return 0;
    }
    /* every rank draws the whole batch, as one process would, and keeps its share */
    size_t span = r->n_ids - r->T - 1;   /* starts in [0, n - T - 1), as torch.randint(0, len - T - 1) */
    for (size_t b = 0; b < all; b++) {
        size_t s = (size_t)(((unsigned __int128)aft_rng_next(&r->rng) * span) >> 64);
        if (b >= first && b < first + r->B) memcpy(w + (b - first) * W, r->ids + s, W * sizeof *w);
    }
    return 0;
}

/* the held-out loss: mean cross entropy over non-overlapping windows of
 * T + 1, split between the ranks; NaN without --valid */
static double valid_loss(run *r, int *rc)
{
    size_t T = r->T, n = r->n_val > T ? (r->n_val - 1) / T : 0;
    if (r->o->val_windows && n > r->o->val_windows) n = r->o->val_windows;
    const aft_model_info *in = aft_model_get_info(r->m);
    size_t V = in->n_vocab, Bv = r->B;
    float *logits = malloc(Bv * T * V * sizeof *logits);
    int32_t *tok = malloc(Bv * T * sizeof *tok);
    double acc[2] = {0, 0};
    aft_error err;
    *rc = 0;
    if (!logits || !tok) {
        cli_error(NULL, "out of memory for the held-out loss");
        *rc = EXIT_DATA;
    }
    for (size_t b0 = (size_t)r->ranks.rank * Bv; !*rc && b0 < n; b0 += Bv * (size_t)r->ranks.size) {
        size_t nb = n - b0 < Bv ? n - b0 : Bv;
        for (size_t b = 0; b < nb; b++) memcpy(tok + b * T, r->val + (b0 + b) * T, T * sizeof *tok);
        if (aft_model_forward(r->m, logits, tok, nb, T, &err)) {
            cli_error(NULL, "held-out loss: %s", err.msg);
            *rc = EXIT_DATA;
            break;
        }
        for (size_t b = 0; b < nb; b++)
            for (size_t t = 0; t < T; t++) {
                const float *l = logits + (b * T + t) * V;
                float mx = l[0];
                for (size_t v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
                double s = 0;
                for (size_t v = 0; v < V; v++) s += exp((double)l[v] - mx);
                acc[0] += log(s) + mx - l[r->val[(b0 + b) * T + t + 1]];
                acc[1] += 1;
            }
    }
    free(logits);
    free(tok);
    cli_ranks_sum_double(&r->ranks, acc, 2);
    return acc[1] > 0 ? acc[0] / acc[1] : NAN;
}

/* one step: the windows, the loss and gradients, summed over the ranks,
 * clipped, Adam. *loss the mean over every rank's windows. */
static int step(run *r, int32_t *w, int32_t *x, int32_t *y, float *loss, double *norm)
{
    aft_error err;
    size_t T = r->T, W = T + 1, nf = grad_floats(r);
    windows(r, w);
    for (size_t b = 0; b < r->B; b++) {
        memcpy(x + b * T, w + b * W, T * sizeof *x);
        memcpy(y + b * T, w + b * W + 1, T * sizeof *y);
    }
    aft_train_options to = {.dropout = (float)r->o->dropout, .threads = r->o->threads,
                            .seed = r->o->seed ^ (0x9E3779B97F4A7C15ull * (r->step + 1)) ^
                                    ((uint64_t)r->ranks.rank << 48)};
    float l = NAN;
    int rc = 0;
    if (aft_model_loss_grad(r->m, x, y, r->B, T, &to, &l, r->gall, &err)) {
        cli_error(NULL, "step %zu: %s", r->step + 1, err.msg);
        rc = EXIT_DATA;
    }
    /* the loss and a failure travel with the gradients: one allreduce */
    r->gblock[nf] = rc ? 0.0f : l;
    r->gblock[nf + 1] = rc ? 1.0f : 0.0f;
    r->gblock[nf + 2] = stop_signal ? 1.0f : 0.0f;
    cli_ranks_sum(&r->ranks, r->gblock, nf + 3);
    r->stop = r->gblock[nf + 2] != 0.0f;   /* a signal on any rank stops every rank after this step */
    if (r->gblock[nf + 1] != 0.0f) return cli_ranks_agree(&r->ranks, rc);   /* some rank failed: its message */
    float inv = 1.0f / (float)r->ranks.size;
    if (r->ranks.size > 1)
        for (size_t i = 0; i < nf; i++) r->gblock[i] *= inv;
    *loss = r->gblock[nf] * inv;
    *norm = aft_clip_grad_norm(r->g, r->len, r->np, 1.0);
    if (!isfinite(*loss) || !isfinite(*norm)) {
        if (r->ranks.rank == 0) {
            if (r->saved_step != SIZE_MAX)
                cli_error(NULL, "step %zu: the %s is not finite (%g); stopped, the last checkpoint (step %zu) stays "
                          "in %s", r->step + 1, isfinite(*loss) ? "gradient" : "loss",
                          isfinite(*loss) ? *norm : (double)*loss, r->saved_step, r->o->output);
            else
                cli_error(NULL, "step %zu: the %s is not finite (%g); stopped, nothing was saved", r->step + 1,
                          isfinite(*loss) ? "gradient" : "loss", isfinite(*loss) ? *norm : (double)*loss);
        }
        return EXIT_DATA;
    }
    aft_schedule s = {r->o->lr, r->o->warmup, r->o->steps, r->o->pos_bias_mult};
    double base = aft_schedule_lr(&s, r->step);
    double *lr = malloc(r->np * sizeof *lr);
    if (!lr) {
        cli_error(NULL, "out of memory");
        return EXIT_DATA;
    }
    for (size_t i = 0; i < r->np; i++) lr[i] = base * r->lr[i];
    aft_adam_step(r->adam, r->p, (const float *const *)r->g, lr);
    free(lr);
    if (aft_model_params_changed(r->m, &err)) {
        cli_error(NULL, "step %zu: %s", r->step + 1, err.msg);
        return EXIT_DATA;
    }
    r->step++;
    return 0;
}

static void log_step(run *r, float loss, double norm, double lr, double tps, double val)
{
    if (r->log && r->ranks.rank == 0) {
        fprintf(r->log, "{\"step\":%zu,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f", r->step,
                (double)loss, lr, norm, tps);
        if (!isnan(val)) fprintf(r->log, ",\"val_loss\":%.9g", val);
        fputs("}\n", r->log);
        fflush(r->log);   /* a line a step, as it happens, for whoever follows the file */
    }
    if (r->ranks.rank == 0) {
        if (!isnan(val)) {
            cli_progress_stop();
            fprintf(stderr, "aft train: step %zu: loss %.4f, held-out loss %.4f\n", r->step, (double)loss, val);
            cli_progress_start("aft train");
            cli_progress_total(r->o->steps - r->step + 1);   /* the ETA from the pace since */
        }
        cli_progress_label("aft train: step %zu/%zu, loss %.4f, lr %.2e, %.0f tokens/s", r->step, r->o->steps,
                           (double)loss, lr, tps);
        cli_progress_add(1);
    }
}

static int train_loop(run *r)
{
    size_t W = r->T + 1;
    int32_t *w = malloc(r->B * W * sizeof *w), *x = malloc(r->B * r->T * sizeof *x),
            *y = malloc(r->B * r->T * sizeof *y);
    if (!w || !x || !y) {
        free(w), free(x), free(y);
        cli_error(NULL, "out of memory for the windows");
        return EXIT_DATA;
    }
    if (r->ranks.rank == 0) {
        cli_progress_start("aft train");
        cli_progress_total(r->o->steps - r->step);   /* this process's steps: its pace gives the ETA */
    }
    int rc = 0;
    r->t_start = aft_now_ms();
    while (r->step < r->o->steps && !rc) {
        double t0 = aft_now_ms();
        aft_schedule s = {r->o->lr, r->o->warmup, r->o->steps, r->o->pos_bias_mult};
        double lr = aft_schedule_lr(&s, r->step);
        float loss = NAN;
        double norm = NAN;
        if ((rc = step(r, w, x, y, &loss, &norm))) break;
        double ms = aft_now_ms() - t0;
        r->t_steps += ms;
        double tps = (double)(r->B * (size_t)r->ranks.size * r->T) / (ms / 1000.0);
        double val = NAN;
        if (r->n_val && ((r->o->val_every && r->step % r->o->val_every == 0) || r->step == r->o->steps)) {
            val = valid_loss(r, &rc);
            rc = cli_ranks_agree(&r->ranks, rc);
        }
        log_step(r, loss, norm, lr, tps, val);
        if (!rc && ((r->o->save_every && r->step % r->o->save_every == 0) || r->step == r->o->steps))
            rc = cli_ranks_agree(&r->ranks, save(r));
        /* a signal on any rank (told with the step's sums): every rank saves (rank 0 writes) and stops */
        if (!rc && r->o->stop_at && r->step == r->o->stop_at && r->step < r->o->steps) {
            rc = cli_ranks_agree(&r->ranks, save(r));
            break;
        }
        if (!rc && r->stop && r->step < r->o->steps) {
            rc = cli_ranks_agree(&r->ranks, save(r));
            if (!rc) {
                cli_progress_stop();
                if (r->ranks.rank == 0)
                    cli_error(NULL, "stopped by a signal at step %zu; the checkpoint and the state are saved "
                              "(--resume %s continues)", r->step, r->o->state);
                rc = 128 + (stop_signal ? stop_signal : SIGTERM);
            }
        }
    }
    cli_progress_stop();
    free(w), free(x), free(y);
    return rc;
}

/* --batches: integers (steps, B, T + 1), B the whole batch over the ranks */
static int read_batches(run *r)
{
    aft_error err;
    if (aft_npy_read(r->o->batches, &r->batches, NULL, &err)) {
        cli_report_file(NULL, r->o->batches, err.msg);
        return EXIT_DATA;
    }
    aft_tensor *a = &r->batches;
    if (a->ndim != 3 || a->shape[0] == 0 || a->shape[1] == 0 || a->shape[2] < 2 ||
        (a->dtype != AFT_I32 && a->dtype != AFT_I64)) {
        cli_error(NULL, "%s: --batches must be (steps, B, T + 1) integers", r->o->batches);
        return EXIT_DATA;
    }
    if (a->shape[1] % (size_t)r->ranks.size) {
        cli_error(NULL, "%s: B = %zu windows do not split evenly over %d ranks", r->o->batches, a->shape[1],
                  r->ranks.size);
        return EXIT_DATA;
    }
    r->bt = malloc(a->nelem * sizeof *r->bt);
    if (!r->bt) {
        cli_error(NULL, "%s: out of memory", r->o->batches);
        return EXIT_DATA;
    }
    r->B = a->shape[1] / (size_t)r->ranks.size;
    r->T = a->shape[2] - 1;
    const aft_model_info *in = aft_model_get_info(r->m);
    for (size_t i = 0; i < a->nelem; i++) {
        int64_t d = a->dtype == AFT_I32 ? ((const int32_t *)a->data)[i] : ((const int64_t *)a->data)[i];
        if (d < 0 || (uint64_t)d >= in->n_vocab) {
            cli_error(NULL, "%s: token %lld at index %zu is outside the vocabulary [0, %zu)", r->o->batches,
                      (long long)d, i, in->n_vocab);
            return EXIT_DATA;
        }
        r->bt[i] = (int32_t)d;
    }
    if (r->T > in->context) {
        cli_error(NULL, "%s: windows of T = %zu are longer than the model reads at once (%zu)", r->o->batches, r->T,
                  in->context);
        return EXIT_DATA;
    }
    return 0;
}

static int prepare(run *r)
{
    struct train_opts *o = r->o;
    int rc;
    if ((rc = make_model(r))) return rc;
    r->B = o->batch;
    if (o->batches) {
        if ((rc = read_batches(r))) return rc;
    } else {
        if ((rc = tokenize(r, o->text, &r->ids, &r->n_ids))) return rc;
        if (r->n_ids < r->T + 2) {
            cli_error(NULL, "%s: the text holds %zu characters, fewer than --seq-len + 2 = %zu (a window of T + 1 "
                      "and one start to draw)", o->text, r->n_ids, r->T + 2);
            return EXIT_DATA;
        }
    }
    if (o->valid) {
        if ((rc = tokenize(r, o->valid, &r->val, &r->n_val))) return rc;
        if (r->n_val < r->T + 1) {
            cli_error(NULL, "%s: the held-out text holds %zu characters, fewer than one window of %zu", o->valid,
                      r->n_val, r->T + 1);
            return EXIT_DATA;
        }
    }
    if ((rc = make_optimiser(r))) return rc;
    r->config = config_json(r);
    r->rng = o->seed;
    r->saved_step = SIZE_MAX;
    if (o->resume && (rc = restore(r))) return rc;
    if (o->resume) r->saved_step = r->step;
    r->first_step = r->step;
    return 0;
}

/* --timing: the model, the run's sizes, its times and memory, in the
 * vocabulary of the other commands' --timing (man aft, JSON OUTPUT) */
static int write_timing(run *r)
{
    if (!r->o->timing || r->ranks.rank != 0) return 0;
    const aft_model_info *in = aft_model_get_info(r->m);
    aft_out out;
    aft_error err;
    if (aft_out_open(&out, r->o->timing, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    cJSON *j = cJSON_CreateObject();
    const char *src = r->o->resume ? r->o->resume : r->o->init;
    cli_model_info_json(j, src ? src : r->o->output, in);
    cJSON_AddNumberToObject(j, "threads", r->o->threads ? r->o->threads : aft_cores());
    cli_level_json(j);
    cJSON_AddNumberToObject(j, "ranks", r->ranks.size);
    cJSON_AddNumberToObject(j, "batch", (double)r->B);
    cJSON_AddNumberToObject(j, "seq_len", (double)r->T);
    size_t done = r->step - r->first_step;
    cJSON_AddNumberToObject(j, "steps", (double)done);
    cJSON_AddNumberToObject(j, "train_ms", r->t_steps);
    cJSON_AddNumberToObject(j, "step_ms", done ? r->t_steps / (double)done : 0.0);
    double tokens = (double)(r->B * (size_t)r->ranks.size * r->T) * (double)done;
    cJSON_AddNumberToObject(j, "tokens_per_s", r->t_steps > 0 ? tokens / (r->t_steps / 1000.0) : 0.0);
    /* what one step keeps for its backward pass, as the model states it:
     * (2 D + 3 C + F) B T floats a layer, O(layers B T D) */
    double BT = (double)r->B * (double)r->T;
    cJSON_AddNumberToObject(j, "activations_bytes",
                            4.0 * BT * (double)in->n_layers *
                                (2.0 * (double)in->d_model + 3.0 * (double)in->d_hidden + (double)in->d_ff));
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)aft_peak_rss());
    return cli_out_close(&out, cli_write_json(&out, "train", j));
}

static void run_free(run *r)
{
    if (r->log) fclose(r->log);
    aft_adam_free(r->adam);
    free(r->idx), free(r->gall), free(r->p), free(r->g), free(r->gblock), free(r->len), free(r->lr);
    aft_model_free(r->m);
    aft_st_close(r->src);
    free(r->fresh);
    free(r->vocab);
    free(r->ids);
    free(r->val);
    free(r->config);
    aft_tensor_free(&r->batches);
    free(r->bt);
}

static int check_options(struct train_opts *o, char **state_buf)
{
    if (!o->output) return cli_usage_error("train", "give the checkpoint to write: -o FILE");
    if (!o->text && !o->batches) return cli_usage_error("train", "give the text to train on: --text FILE");
    if (o->batches && !o->init && !o->resume)
        return cli_usage_error("train", "--batches needs the model they index: --init FILE (or --resume FILE)");
    if (o->init && o->resume) return cli_usage_error("train", "--init and --resume both give the model: one of them");
    if (!o->state) {
        size_t n = strlen(o->output) + 7;
        *state_buf = malloc(n);
        if (!*state_buf) return EXIT_DATA;
        snprintf(*state_buf, n, "%s.state", o->output);
        o->state = *state_buf;
    }
    return 0;
}

int cmd_train(int argc, char **argv)
{
    struct train_opts o = {.layers = 6, .d_model = 128, .d_ff = 256, .window = 32, .seq_len = 0, .batch = 32,
                           .steps = 1000, .lr = 2e-3, .warmup = 100, .pos_bias_mult = 100, .dropout = 0.1,
                           .seed = 1, .val_every = 250};
    int rc = cli_parse_options(&cli_train_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("train") : rc;
    char *state_buf = NULL;
    if ((rc = check_options(&o, &state_buf))) return rc;
    if (!o.init && !o.resume && !o.seq_len) o.seq_len = 256;
    run r = {.o = &o};
    if ((rc = cli_ranks_init(&r.ranks))) return rc;
    rc = prepare(&r);
    if (!rc && o.log && r.ranks.rank == 0 && !(r.log = fopen(o.log, r.step ? "a" : "w"))) {
        cli_error(NULL, "%s: %s", o.log, strerror(errno));
        rc = EXIT_DATA;
    }
    rc = cli_ranks_agree(&r.ranks, rc);
    if (!rc) {
        /* a signal the parent set to be ignored stays ignored (as main's) */
        struct sigaction sa = {.sa_handler = on_stop}, old_int, old_term;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, NULL, &old_int);
        sigaction(SIGTERM, NULL, &old_term);
        if (old_int.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, NULL);
        if (old_term.sa_handler != SIG_IGN) sigaction(SIGTERM, &sa, NULL);
        rc = train_loop(&r);
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        if (!rc) rc = write_timing(&r);
        if (r.log && fflush(r.log) != 0) {
            cli_error(NULL, "%s: %s", o.log, strerror(errno));
            rc = EXIT_DATA;
        }
        rc = cli_ranks_agree(&r.ranks, rc);
    }
    run_free(&r);
    free(state_buf);
    cli_ranks_finish(&r.ranks);
    return rc ? rc : cli_finish_stdout("train");
}
