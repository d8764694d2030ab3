/* generate.c - aft generate: text from labml's autoregressive AFT model, a
 * character at a time, as it is produced.
 *
 * cmd_generate reads as its steps: parse the options, load the model (and
 * its vocabulary), encode the prompt, generate (the prompt in one pass,
 * then one step of every layer's state a token, printing each), write
 * --timing. */
#include "cli.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- options */

struct gen_opts {
    cli_model_opts m;
    const char *prompt, *timing_path;
    size_t n;
    double temperature;
    size_t top_k;
    uint64_t seed;
    int greedy, temperature_set, top_k_set;
};

#define FIELD(f) offsetof(struct gen_opts, f)
#define GEN_OPTS(opts) ((struct gen_opts *)(opts))

static int set_n(const cli_option *opt, void *opts, const char *v)
{
    if (aft_parse_size(v, &GEN_OPTS(opts)->n) != 0 || GEN_OPTS(opts)->n > 1000000000)
        return cli_usage_error("generate", "-n takes a whole number from 0 to 1000000000");
    return 0;
}

static int set_temperature(const cli_option *opt, void *opts, const char *v)
{
    double t;
    if (cli_parse_double(v, &t) != 0 || t < 0 || t > 1e30)
        return cli_usage_error("generate", "--temperature takes a number >= 0 (0: greedy)");
    GEN_OPTS(opts)->temperature = t;
    GEN_OPTS(opts)->temperature_set = 1;
    return 0;
}

static int set_top_k(const cli_option *opt, void *opts, const char *v)
{
    if (aft_parse_size(v, &GEN_OPTS(opts)->top_k) != 0)
        return cli_usage_error("generate", "--top-k takes a whole number >= 0 (0: every token)");
    GEN_OPTS(opts)->top_k_set = 1;
    return 0;
}

static int set_seed(const cli_option *opt, void *opts, const char *v)
{
    if (aft_parse_u64(v, &GEN_OPTS(opts)->seed) != 0)
        return cli_usage_error("generate", "--seed takes a whole number >= 0");
    return 0;
}

#define NEEDS_VALUE "%s needs a value"

static const cli_option options[] = {
    {"--weights", NULL, "FILE", "the model: a .safetensors export of its state_dict() (default: " CLI_SHIPPED_HELP ")",
     cli_model_set_weights, FIELD(m), "--weights needs a file", 0},
    {"--prompt", NULL, "TEXT", "the text to start from, at least one character (required)", cli_set_string,
     FIELD(prompt), "--prompt needs a text", 0},
    {"-n", NULL, "N", "characters (tokens) to generate after the prompt (default 200)", set_n, 0, NEEDS_VALUE, 0},
    {"--temperature", NULL, "T",
     "draw each token with probability proportional to exp(logit / T) (default 1; 0: greedy)", set_temperature,
     0, NEEDS_VALUE, 0},
    {"--top-k", NULL, "K", "draw among the K most likely tokens only (default 0: all)", set_top_k, 0, NEEDS_VALUE,
     0},
    {"--seed", NULL, "N", "the seed of the draws (default 0): the same seed, the same text", set_seed, 0,
     NEEDS_VALUE, 0},
    {"--greedy", NULL, NULL, "always the most likely token (the lowest id among equals); no draws",
     cli_set_flag, FIELD(greedy), NULL, 0},
    {"--vocab", NULL, "FILE",
     "the vocabulary, a JSON array of strings (index = token id) (default: the metadata 'vocab')",
     cli_model_set_vocab, FIELD(m), "--vocab needs a file", 0},
    {"--window", NULL, "S", "local: the window (default: metadata 'window', else local_mask's band)",
     cli_model_set_window, FIELD(m), NEEDS_VALUE, 0},
    {"--threads", NULL, "N",
     "threads (default 1: a new token is one row of each layer; more threads help only the prompt's pass and "
     "the context's re-encoding)",
     cli_model_set_threads, FIELD(m), NEEDS_VALUE, 0},
    {"--precision", NULL, "f32|bf16", CLI_PRECISION_HELP, cli_model_set_precision, FIELD(m), NEEDS_VALUE, 0},
    {"--timing", NULL, "FILE",
     "write JSON: prompt and generated tokens, time to first token, tokens/s, the model and the sampling"
     " (its keys: JSON OUTPUT in man aft)",
     cli_set_string, FIELD(timing_path), "--timing needs a file", 0},
    {"--max-memory", NULL, "SIZE",
     "refuse a model needing more (bytes, or with K, M, G; default: the memory available)",
     cli_model_set_max_memory, FIELD(m), NEEDS_VALUE, 0},
    {"--strict", NULL, NULL, CLI_MODEL_STRICT_HELP, cli_model_set_strict, FIELD(m), NULL, 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_generate_command = {
    .name = "generate",
    .usage = "usage: aft generate [--weights FILE] --prompt TEXT [-n N] [--temperature T] [--top-k K]\n"
             "                    [--seed N] [--greedy] [options]\n"
             "\n"
             "Prints the prompt, then each token of labml's autoregressive AFT model as it\n"
             "is produced, and a newline at the end when the text does not end with one.\n"
             "The prompt is encoded in one pass; each new token costs one step of every\n"
             "layer's state. Past the model's context (labml's 256 positions) the most\n"
             "recent half is kept, encoded again, and generation carries on.\n",
    .options = options,
    .more = CLI_MODEL_MORE,
    .unknown = "unknown argument '%s'",   /* generate takes no operands */
};

/* ---------------------------------------------------------------- generate */

struct gen_run {
    aft_model *model;
    const aft_model_info *info;
    int32_t *prompt;
    size_t n_prompt, made;
    double t_start, t_loaded, t_gen, t_first, t_last;
    int write_failed, ends_newline;
};

/* each token as it comes: its text to stdout, flushed */
static int on_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    struct gen_run *r = ctx;
    double now = aft_now_ms();
    if (r->made++ == 0) r->t_first = now;
    r->t_last = now;
    const char *text = aft_model_token(r->model, (size_t)token);
    size_t len = strlen(text);
    errno = 0;
    if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) {
        r->write_failed = errno ? errno : EIO;
        return 1;   /* stop: nobody reads the rest */
    }
    r->ends_newline = text[len - 1] == '\n';
    cli_progress_add(1);
    return 0;
}

/* the prompt's text, then the generated tokens' */
static int generate(const struct gen_opts *o, struct gen_run *r)
{
    size_t plen = strlen(o->prompt);
    errno = 0;
    if (fwrite(o->prompt, 1, plen, stdout) != plen || fflush(stdout) != 0) {
        cli_error("generate", "standard output: write failed: %s", strerror(errno ? errno : EIO));
        return EXIT_DATA;
    }
    r->ends_newline = o->prompt[plen - 1] == '\n';
    aft_sampling smp = {.temperature = o->greedy ? 0.0f : (float)o->temperature, .top_k = o->top_k,
                        .seed = o->seed};
    aft_error err;
    r->t_gen = aft_now_ms();
    /* on a terminal the text itself shows how far it has come; written
     * elsewhere, the progress line counts the tokens */
    if (!isatty(STDOUT_FILENO)) {
        cli_progress_start("aft generate: %zu tokens", o->n);
        cli_progress_total(o->n);
    }
    aft_status st = aft_model_generate(r->model, NULL, NULL, r->prompt, r->n_prompt, o->n, &smp, on_token, r, &err);
    cli_progress_stop();
    if (r->write_failed) {
        cli_error("generate", "standard output: write failed: %s", strerror(r->write_failed));
        return EXIT_DATA;
    }
    if (st != AFT_OK) {
        cli_error("generate", "%s", err.msg);
        return EXIT_DATA;
    }
    /* text ends with a newline, on a terminal, in a file and down a pipe
     * alike (a write error shows in cli_finish_stdout) */
    if (!r->ends_newline) putchar('\n');
    return 0;
}

/* --timing's JSON into out */
static int write_timing(aft_out *out, const struct gen_opts *o, const struct gen_run *r)
{
    const aft_model_info *in = r->info;
    double t_end = r->made ? r->t_last : r->t_gen, gen_ms = t_end - r->t_gen;
    cJSON *j = cJSON_CreateObject();
    cli_model_info_json(j, o->m.weights, in);
    cJSON_AddNumberToObject(j, "threads", o->m.threads);
    cli_precision_json(j, o->m.precision);
    cli_level_json(j);
    cJSON *s = cJSON_AddObjectToObject(j, "sampling");
    cJSON_AddBoolToObject(s, "greedy", o->greedy || o->temperature == 0.0);
    cJSON_AddNumberToObject(s, "temperature", o->greedy ? 0.0 : o->temperature);
    cJSON_AddNumberToObject(s, "top_k", (double)o->top_k);
    cJSON_AddNumberToObject(s, "seed", (double)o->seed);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(j, "generated_tokens", (double)r->made);
    if (r->made) {
        cJSON_AddNumberToObject(j, "time_to_first_token_ms", r->t_first - r->t_gen);
        cJSON_AddNumberToObject(j, "tokens_per_s", gen_ms > 0 ? (double)r->made / (gen_ms * 1e-3) : 0.0);
    } else {
        cJSON_AddNullToObject(j, "time_to_first_token_ms");
        cJSON_AddNullToObject(j, "tokens_per_s");
    }
    cJSON_AddNumberToObject(j, "load_ms", r->t_loaded - r->t_start);
    cJSON_AddNumberToObject(j, "generate_ms", gen_ms);
    cJSON_AddNumberToObject(j, "total_ms", aft_now_ms() - r->t_start);
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)aft_peak_rss());
    return cli_write_json(out, "generate", j);
}

/* the options that do not go together: 0 or EXIT_USAGE */
static int check_options(const struct gen_opts *o)
{
    if (!o->prompt) return cli_usage_error("generate", "--prompt TEXT is required");
    if (!o->prompt[0])
        return cli_usage_error("generate", "--prompt needs at least one character: the model starts from it");
    if (o->greedy && (o->temperature_set || o->top_k_set))
        return cli_usage_error("generate", "--greedy draws nothing: it does not go with %s",
                               o->temperature_set ? "--temperature" : "--top-k");
    return 0;
}

/* the model with a vocabulary, and the prompt in its tokens */
static int load(const struct gen_opts *o, struct gen_run *r)
{
    int rc = cli_model_open(&o->m, &r->model);
    if (rc) return rc;
    r->info = aft_model_get_info(r->model);
    aft_error err;
    if (aft_model_tokenize(r->model, &r->prompt, &r->n_prompt, o->prompt, strlen(o->prompt), &err) != AFT_OK) {
        cli_error("generate", "--prompt: %s", err.msg);
        return EXIT_DATA;
    }
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    struct gen_opts o = {.m = {.cmd = "generate", .threads = 1, .need_vocab = 1}, .n = 200, .temperature = 1.0};
    int rc = cli_parse_options(&cli_generate_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("generate") : rc;
    if ((rc = check_options(&o))) return rc;
    char shipped[4096];
    if (!o.m.weights) {
        if (!cli_shipped_model("generate", "without --weights, generate runs", shipped, sizeof shipped))
            return EXIT_DATA;
        o.m.weights = shipped;
    }

    struct gen_run r = {.t_start = aft_now_ms()};
    aft_out tout = {0};
    aft_error err;
    rc = load(&o, &r);
    r.t_loaded = aft_now_ms();
    /* --timing is opened (as a temporary) before the text starts, so a bad
     * path fails first */
    if (!rc && o.timing_path && aft_out_open(&tout, o.timing_path, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        rc = EXIT_DATA;
    }
    if (!rc) rc = generate(&o, &r);
    if (!rc && o.timing_path) {
        rc = write_timing(&tout, &o, &r);
        if (!rc && aft_out_commit(&tout, &err) != AFT_OK) {
            cli_error(NULL, "%s", err.msg);
            rc = EXIT_DATA;
        }
    }
    if (tout.fp) aft_out_abort(&tout);
    free(r.prompt);
    aft_model_free(r.model);
    return rc ? rc : cli_finish_stdout("generate");
}
