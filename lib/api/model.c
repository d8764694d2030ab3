/* model.c - the binding interface's language model (aft.h, "labml's
 * language model"): aft_model_open as aft model and aft generate open it,
 * its logits, its vocabulary, and aft generate's text into a buffer. */
#include "api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct aft_api_model {
    aft_model *m;
};

aft_status aft_api_model_open(aft_api_model **out, const char *path, const char *options, aft_error *err)
{
    if (!out) return api_null(err, "out");
    *out = NULL;
    if (!path) return api_null(err, "path");
    api_options o;
    aft_status st = api_options_parse(&o, options, API_MODEL_KEYS, "the model", err);
    if (st) return st;
    if (o.given & API_WINDOW && o.cfg.window == 0)
        return aft_fail(err, AFT_ERR_ARG, "option window=0: the model's window takes a whole number >= 1");
    /* one thread unless asked, as aft generate: a step is one row a layer */
    aft_model_options mo = {.window = o.cfg.window, .threads = o.given & API_THREADS ? o.cfg.threads : 1,
                            .precision = o.cfg.precision};
    aft_api_model *m = calloc(1, sizeof *m);
    if (!m) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    aft_st_file *f;
    st = aft_st_open_limit(path, aft_memory_limit(0), &f, err);
    if (!st) {
        st = aft_model_load(&m->m, f, &mo, err);
        aft_st_close(f);
    }
    if (st) {
        free(m);
        return api_file_error(st, path, err);
    }
    *out = m;
    return AFT_OK;
}

void aft_api_model_free(aft_api_model *m)
{
    if (!m) return;
    aft_model_free(m->m);
    free(m);
}

void aft_api_model_dims(const aft_api_model *m, size_t *n_vocab, size_t *d_model, size_t *context)
{
    const aft_model_info *in = m ? aft_model_get_info(m->m) : NULL;
    if (n_vocab) *n_vocab = in ? in->n_vocab : 0;
    if (d_model) *d_model = in ? in->d_model : 0;
    if (context) *context = in ? in->context : 0;
}

aft_status aft_api_model_logits(aft_api_model *m, float *logits, const int32_t *tokens, size_t B, size_t T,
                                aft_error *err)
{
    if (!m || !logits || !tokens) return api_null(err, !m ? "model" : !logits ? "logits" : "tokens");
    size_t n;
    aft_status st = api_floats(B, T, aft_model_get_info(m->m)->n_vocab, &n, "logits", err);
    return st ? st : API_BLAS(aft_model_forward(m->m, logits, tokens, B, T, err));
}

aft_status aft_api_model_encode(const aft_api_model *m, int32_t *ids, size_t cap, size_t *n, const char *text,
                                size_t len, aft_error *err)
{
    if (!m || !n || (!text && len) || (!ids && cap))
        return api_null(err, !m ? "model" : !n ? "n" : !ids && cap ? "ids" : "text");
    int32_t *all;
    aft_status st = aft_model_tokenize(m->m, &all, n, text ? text : "", len, err);
    if (st) return st;
    if (cap) memcpy(ids, all, (*n < cap ? *n : cap) * sizeof *ids);
    free(all);
    return AFT_OK;
}

const char *aft_api_model_token(const aft_api_model *m, size_t id)
{
    return m ? aft_model_token(m->m, id) : NULL;
}

/* ---------------------------------------------------------------- generate */

/* the text generated so far */
typedef struct {
    const aft_model *m;
    aft_strbuf text;
} gen_text;

/* each new token's text onto the buffer, as aft generate prints it */
static int add_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    gen_text *g = ctx;
    const char *text = aft_model_token(g->m, (size_t)token);
    aft_strbuf_add_str(&g->text, text ? text : "");
    return 0;
}

/* aft generate's checks of its arguments */
static aft_status check_args(const char *prompt, size_t n, double temperature, aft_error *err)
{
    if (!prompt) return api_null(err, "prompt");
    if (!prompt[0]) return aft_fail(err, AFT_ERR_ARG, "the prompt needs at least one character: the model starts "
                                    "from it");
    if (n > 1000000000) return aft_fail(err, AFT_ERR_ARG, "n takes a whole number from 0 to 1000000000");
    if (!(temperature >= 0 && temperature <= 1e30))
        return aft_fail(err, AFT_ERR_ARG, "temperature takes a number >= 0 (0: greedy)");
    return AFT_OK;
}

/* text (its NUL counted in *len) into out, cut to cap bytes */
static void give_text(const aft_strbuf *b, char *out, size_t cap, size_t *len)
{
    const char *s = b->p ? b->p : "";
    *len = b->len + 1;
    if (!cap) return;
    size_t k = b->len < cap - 1 ? b->len : cap - 1;
    memcpy(out, s, k);
    out[k] = 0;
}

aft_status aft_api_model_generate(aft_api_model *m, char *out, size_t cap, size_t *len, const char *prompt,
                                  size_t n, double temperature, size_t top_k, uint64_t seed, aft_error *err)
{
    if (!m || !len || (!out && cap)) return api_null(err, !m ? "model" : !len ? "len" : "out");
    aft_status st = check_args(prompt, n, temperature, err);
    if (st) return st;
    int32_t *ids;
    size_t n_prompt;
    aft_error e;
    if ((st = aft_model_tokenize(m->m, &ids, &n_prompt, prompt, strlen(prompt), &e)))
        return aft_fail(err, st, "prompt: %s", e.msg);
    aft_sampling smp = {.temperature = (float)temperature, .top_k = top_k, .seed = seed};
    gen_text g = {.m = m->m};
    st = API_BLAS(aft_model_generate(m->m, NULL, NULL, ids, n_prompt, n, &smp, add_token, &g, err));
    free(ids);
    if (!st && g.text.oom) st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for the text");
    if (!st) give_text(&g.text, out, cap, len);
    free(g.text.p);
    return st;
}
