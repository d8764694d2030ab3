/* encode.c - aft encode: text into the token ids of a model's vocabulary,
 * the .npy of TOKENS that aft model reads; the prompt's encoding of aft
 * generate, as a step of its own.
 *
 * cmd_encode reads as its steps: parse the options, load the model (for
 * its vocabulary), read the text, encode it, write the ids. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- options */

struct encode_opts {
    cli_model_opts m;
    const char *text;        /* TEXT, or NULL */
    const char *text_file;   /* TEXT's file ('-': stdin), or NULL */
    const char *out_path;    /* -o, or NULL: stdout */
};

#define FIELD(f) offsetof(struct encode_opts, f)

/* TEXT, or '-': standard input */
static int set_text(void *opts, const char *arg)
{
    struct encode_opts *o = opts;
    if (o->text || o->text_file)
        return cli_usage_error("encode", "more than one text: '%s' and '%s' (quote a text that has spaces)",
                               o->text ? o->text : o->text_file, arg);
    if (strcmp(arg, "-") == 0) o->text_file = arg;
    else o->text = arg;
    return 0;
}

static int set_text_file(const cli_option *opt, void *opts, const char *v)
{
    struct encode_opts *o = opts;
    if (o->text || o->text_file)
        return cli_usage_error("encode", "more than one text: '%s' and --text-file %s", o->text ? o->text : o->text_file,
                               v);
    o->text_file = v;
    return 0;
}

static const cli_option options[] = {
    {"--weights", NULL, "FILE",
     "the model whose vocabulary encodes the text: a .safetensors export of its state_dict() (required)",
     cli_model_set_weights, FIELD(m), "--weights needs a file", 0},
    {"--text-file", NULL, "FILE", "the text is FILE's bytes ('-': standard input), instead of TEXT", set_text_file, 0,
     "--text-file needs a file", 0},
    {"-o", "--output", "FILE",
     "the token ids, .npy int32 [n] (default: stdout; on a terminal, the ids as text instead)", cli_set_string,
     FIELD(out_path), "-o needs a file", 0},
    {"--vocab", NULL, "FILE",
     "the vocabulary, a JSON array of strings (index = token id) (default: the metadata 'vocab')",
     cli_model_set_vocab, FIELD(m), "--vocab needs a file", 0},
    {"--max-memory", NULL, "SIZE",
     "refuse a model or a text needing more (bytes, or with K, M, G; default: the memory available)",
     cli_model_set_max_memory, FIELD(m), "--max-memory needs a size", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_encode_command = {
    .name = "encode",
    .usage = "usage: aft encode --weights FILE [-o TOKENS] [options] (TEXT | - | --text-file FILE)\n"
             "\n"
             "Encodes TEXT (or standard input, '-', or --text-file's bytes) in the model's\n"
             "vocabulary as aft generate encodes its prompt, the longest entry that\n"
             "matches at each point, and writes the token ids as a .npy of int32 [n]: the\n"
             "TOKENS of aft model. A character outside the vocabulary is an error naming\n"
             "it and its byte offset. aft decode turns the ids back into the text.\n",
    .options = options,
    .operand = set_text,
};

/* ---------------------------------------------------------------- steps */

/* the bytes of path ('-': stdin) into *buf (*len of them; malloc'd), when
 * they and their tokens (4 bytes each, at most one a byte) fit in the
 * memory bound: 0, or EXIT_DATA after reporting */
static int read_text(const struct encode_opts *o, char **buf, size_t *len)
{
    const char *path = o->text_file, *name = cli_display_name(path);
    size_t limit = aft_memory_limit(o->m.max_memory), max = limit / 5;
    *buf = NULL;
    *len = 0;
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        cli_error(NULL, "%s: cannot open: %s", path, strerror(errno));
        return EXIT_DATA;
    }
    size_t cap = 0, n = 0;
    char *b = NULL;
    int rc = 0;
    for (;;) {
        if (n == cap) {   /* grow, to one byte past max at most: that byte says the text is too long */
            size_t next = cap ? 2 * cap : 65536;   /* cap <= max + 1 <= SIZE_MAX / 5 + 1: no overflow */
            if (next > max + 1) next = max + 1;
            char *nb = realloc(b, next + 1);
            if (!nb) {
                cli_error("encode", "out of memory reading %s", name);
                rc = EXIT_DATA;
                break;
            }
            b = nb;
            cap = next;
        }
        size_t want = cap - n;
        errno = 0;
        size_t got = fread(b + n, 1, want, f);
        n += got;
        if (n > max) {
            cli_error(NULL, "%s: the text and its tokens need more than %s (%s)", name,
                      o->m.max_memory ? "--max-memory allows" : "the memory available", cli_bytes_text(limit).s);
            rc = EXIT_DATA;
            break;
        }
        if (got < want) {   /* the end, or an error */
            if (ferror(f)) {
                cli_error(NULL, "%s: read failed: %s", name, strerror(errno ? errno : EIO));
                rc = EXIT_DATA;
            }
            break;
        }
    }
    if (!is_stdin) fclose(f);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

/* the ids on a terminal: "[12, 5, 7]" and where they would have gone */
static int show_ids(const int32_t *ids, size_t n)
{
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)ids[i]);
    printf("]\n(%zu %s; not saved: -o FILE or a pipe writes them as .npy)\n", n, cli_noun(n, "token", "tokens"));
    return 0;
}

/* the ids as .npy int32 [n] to -o or stdout */
static int write_ids(const struct encode_opts *o, int32_t *ids, size_t n)
{
    if (!o->out_path && isatty(STDOUT_FILENO)) return show_ids(ids, n);
    aft_tensor t = {.dtype = AFT_I32, .ndim = 1, .data = ids, .nelem = n, .nbytes = n * sizeof(int32_t)};
    t.shape[0] = n;
    return cli_write_npy(o->out_path, &t);
}

/* the text in the model's tokens; a character outside the vocabulary
 * named as aft generate names one of its prompt */
static int encode(const struct encode_opts *o, const aft_model *m, const char *text, size_t len, int32_t **ids,
                  size_t *n)
{
    aft_error err;
    if (aft_model_tokenize(m, ids, n, text, len, &err) == AFT_OK) return 0;
    if (o->text) cli_error("encode", "TEXT: %s", err.msg);
    else cli_report_file(NULL, o->text_file, err.msg);
    return EXIT_DATA;
}

int cmd_encode(int argc, char **argv)
{
    struct encode_opts o = {.m = {.cmd = "encode", .no_warning = 1, .need_vocab = 1}};
    int rc = cli_parse_options(&cli_encode_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("encode") : rc;
    if (!o.m.weights) return cli_usage_error("encode", "--weights FILE is required: the model whose vocabulary encodes");
    if (!o.text && !o.text_file) return cli_usage_error("encode", "no TEXT given ('-': standard input; or --text-file FILE)");

    aft_model *m = NULL;
    char *buf = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    rc = cli_model_open(&o.m, &m);
    if (!rc && o.text_file) rc = read_text(&o, &buf, &len);
    if (!rc) rc = encode(&o, m, o.text ? o.text : buf, o.text ? strlen(o.text) : len, &ids, &n);
    if (!rc) rc = write_ids(&o, ids, n);
    free(ids);
    free(buf);
    aft_model_free(m);
    if (rc == 0 && !o.out_path) return cli_finish_stdout("encode");
    return rc;
}
