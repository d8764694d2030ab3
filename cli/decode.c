/* decode.c - aft decode: token ids back into text, by a model's
 * vocabulary; aft encode's inverse.
 *
 * cmd_decode reads as its steps: parse the options, load the model (for
 * its vocabulary), read the token ids, print their text. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- options */

struct decode_opts {
    cli_model_opts m;
    const char *tokens;
};

#define FIELD(f) offsetof(struct decode_opts, f)

static int set_tokens(void *opts, const char *arg)
{
    struct decode_opts *o = opts;
    if (o->tokens) return cli_usage_error("decode", "more than one TOKENS: '%s' and '%s'", o->tokens, arg);
    o->tokens = arg;
    return 0;
}

static const cli_option options[] = {
    {"--weights", NULL, "FILE",
     "the model whose vocabulary decodes the ids: a .safetensors export of its state_dict() (required)",
     cli_model_set_weights, FIELD(m), "--weights needs a file", 0},
    {"--vocab", NULL, "FILE",
     "the vocabulary, a JSON array of strings (index = token id) (default: the metadata 'vocab')",
     cli_model_set_vocab, FIELD(m), "--vocab needs a file", 0},
    {"--max-memory", NULL, "SIZE",
     "refuse a model needing more (bytes, or with K, M, G; default: the memory available)",
     cli_model_set_max_memory, FIELD(m), "--max-memory needs a size", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_decode_command = {
    .name = "decode",
    .usage = "usage: aft decode --weights FILE [options] TOKENS\n"
             "\n"
             "Prints the text of TOKENS, integer token ids [T] or [B, T] in a .npy ('-':\n"
             "stdin), by the model's vocabulary: each sequence's text, and a newline after\n"
             "it when it does not end with one. An id outside the vocabulary is an error\n"
             "naming it and its place.\n",
    .options = options,
    .operand = set_tokens,
};

/* ---------------------------------------------------------------- steps */

/* each sequence's text, a line at least */
static int print_text(const aft_model *m, const cli_tokens *tk)
{
    for (size_t b = 0; b < tk->B; b++) {
        int ends_newline = 0;
        for (size_t t = 0; t < tk->T; t++) {
            const char *text = aft_model_token(m, (size_t)tk->ids[b * tk->T + t]);
            size_t len = strlen(text);
            errno = 0;
            if (fwrite(text, 1, len, stdout) != len) {
                cli_error("decode", "standard output: write failed: %s", strerror(errno ? errno : EIO));
                return EXIT_DATA;
            }
            ends_newline = text[len - 1] == '\n';
        }
        if (!ends_newline) putchar('\n');
    }
    return 0;
}

int cmd_decode(int argc, char **argv)
{
    struct decode_opts o = {.m = {.cmd = "decode", .no_warning = 1, .need_vocab = 1}};
    int rc = cli_parse_options(&cli_decode_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("decode") : rc;
    if (!o.m.weights) return cli_usage_error("decode", "--weights FILE is required: the model whose vocabulary decodes");
    if (!o.tokens) return cli_usage_error("decode", "no TOKENS given");

    aft_model *m = NULL;
    cli_tokens tk = {0};
    rc = cli_model_open(&o.m, &m);
    if (!rc) rc = cli_tokens_read("decode", o.tokens, aft_model_get_info(m)->n_vocab, 0, &tk);
    if (!rc) rc = print_text(m, &tk);
    free(tk.ids);
    aft_model_free(m);
    return rc ? rc : cli_finish_stdout("decode");
}
