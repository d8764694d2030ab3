/* runner.c - what aft run and aft grad share (runner.h): the options'
 * handlers, and the steps that read the input, get or seed the parameters,
 * settle the configuration by the library's rules, check the values and
 * the memory, and read the mask; and --timing's JSON. */
#include "runner.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


int runner_set_variant(const cli_option *opt, void *opts, const char *v)
{
    if (!v || aft_variant_from_name(v, &RUN_OPTS(opts)->cfg.variant) != 0)
        return cli_usage_error(RUN_OPTS(opts)->cmd, "--variant takes full, local, simple or conv");
    return 0;
}

int runner_set_window(const cli_option *opt, void *opts, const char *v)
{
    struct run_opts *o = opts;
    if (aft_parse_size(v, &o->cfg.window) != 0) return cli_usage_error(RUN_OPTS(opts)->cmd, "--window takes a whole number >= 0");
    o->window_set = 1;
    return 0;
}

int runner_set_heads(const cli_option *opt, void *opts, const char *v)
{
    struct run_opts *o = opts;
    if (aft_parse_size(v, &o->cfg.heads) != 0 || o->cfg.heads == 0)
        return cli_usage_error(RUN_OPTS(opts)->cmd, "--heads takes a whole number >= 1");
    o->heads_set = 1;
    return 0;
}

int runner_set_layout(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_layout(RUN_OPTS(opts)->cmd, &RUN_OPTS(opts)->tbd, v);
}

int runner_set_seed(const cli_option *opt, void *opts, const char *v)
{
    if (aft_parse_u64(v, &RUN_OPTS(opts)->seed) != 0)
        return cli_usage_error(RUN_OPTS(opts)->cmd, "--seed takes a whole number >= 0");
    return 0;
}

int runner_set_d_hidden(const cli_option *opt, void *opts, const char *v)
{
    size_t n;
    if (aft_parse_size(v, &n) != 0 || n == 0) return cli_usage_error(RUN_OPTS(opts)->cmd, "--d-hidden takes a whole number >= 1");
    RUN_OPTS(opts)->d_hidden = n;
    return 0;
}

int runner_set_repeat(const cli_option *opt, void *opts, const char *v)
{
    size_t n;
    if (aft_parse_size(v, &n) != 0 || n == 0 || n > 1000000)
        return cli_usage_error(RUN_OPTS(opts)->cmd, "--repeat takes a whole number from 1 to 1000000");
    RUN_OPTS(opts)->repeat = n;
    return 0;
}

int runner_set_threads(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_threads(RUN_OPTS(opts)->cmd, &RUN_OPTS(opts)->cfg.threads, v);
}

int runner_set_max_memory(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_memory(RUN_OPTS(opts)->cmd, &RUN_OPTS(opts)->max_memory, v);
}

int runner_set_impl(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_impl(RUN_OPTS(opts)->cmd, &RUN_OPTS(opts)->cfg.impl, v);
}

int runner_set_precision(const cli_option *opt, void *opts, const char *v)
{
    return cli_set_precision(RUN_OPTS(opts)->cmd, &RUN_OPTS(opts)->cfg.precision, v);
}

int runner_set_grid(const cli_option *opt, void *opts, const char *v)
{
    struct run_opts *o = opts;
    if (aft_parse_grid(v, &o->grid_h, &o->grid_w) != 0)
        return cli_usage_error(RUN_OPTS(opts)->cmd, "--grid takes H,W: two whole numbers >= 1, like 14,14");
    return 0;
}

int runner_set_input(void *opts, const char *arg)
{
    struct run_opts *o = opts;
    if (o->input) return cli_usage_error(RUN_OPTS(opts)->cmd, "more than one INPUT: '%s' and '%s'", o->input, arg);
    o->input = arg;
    return 0;
}

/* ---------------------------------------------------------------- the options together */

void runner_defaults(struct run_opts *o, const char *cmd)
{
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    o->cfg.variant = AFT_FULL;
    o->cfg.heads = 1;
    o->repeat = 1;
    o->prefix = "";
}

int runner_check_options(const struct run_opts *o)
{
    if (!o->input) return cli_usage_error(o->cmd, "no INPUT given");
    aft_variant v = o->cfg.variant;
    if (o->window_set && v != AFT_LOCAL && v != AFT_CONV)
        return cli_usage_error(o->cmd, "--window applies to --variant local and conv, not %s", aft_variant_name(v));
    if (o->heads_set && v != AFT_CONV)
        return cli_usage_error(o->cmd, "--heads applies to --variant conv, not %s", aft_variant_name(v));
    if (v == AFT_LOCAL && !o->window_set) return cli_usage_error(o->cmd, "--variant local needs --window S");
    if (v == AFT_CONV && !o->window_set && !o->weights_path)
        return cli_usage_error(o->cmd, "--variant conv needs --window S (or a conv bias in --weights)");
    if (o->weights_path && o->d_hidden)
        return cli_usage_error(o->cmd, "--d-hidden applies without --weights; the weights fix the hidden size");
    if (o->cfg.precision == AFT_PRECISION_BF16 && o->cfg.impl == AFT_IMPL_REFERENCE)
        return cli_usage_error(o->cmd, "--precision bf16 applies to the fast kernels; --impl reference computes in "
                               "float64");
    if (o->state_in || o->state_out) {
        const char *which = o->state_in ? "--state-in" : "--state-out";
        if (o->grid_h)
            return cli_usage_error(o->cmd, "%s carries a 1-D sequence; a grid has no streaming state", which);
        if (!o->cfg.causal)
            return cli_usage_error(o->cmd, "%s needs --causal: without it every row sees later rows, which no state "
                                   "of the rows before can hold", which);
        if (o->mask_path)
            return cli_usage_error(o->cmd, "%s cannot go with --mask: a state holds the sums of the rows before, not "
                                   "a T x T pattern", which);
        if (o->cfg.impl == AFT_IMPL_REFERENCE)
            return cli_usage_error(o->cmd, "%s runs the fast kernels; it does not go with --impl reference", which);
        if (o->repeat > 1)
            return cli_usage_error(o->cmd, "%s continues a sequence once; it does not go with --repeat", which);
    }
    return 0;
}

/* ---------------------------------------------------------------- the steps */

void runner_free(struct run *r)
{
    if (r->in_st) aft_st_close(r->in_st);
    if (r->w_st) aft_st_close(r->w_st);
    aft_weights_free(&r->wts);
    cli_params_free(&r->seeded);
    aft_state_free(r->state);
    free(r->x); free(r->q); free(r->k); free(r->v); free(r->y); free(r->mask);
}

/* ---------------------------------------------------------------- load the input */

/* A float tensor of rank 2 or 3 as float32 [B, T, X] in btd order; of
 * rank 4, [B, H, W, X], a grid: *gh, *gw (0 otherwise). */
static int load_activation(const char *file, const char *what, const aft_tensor *t, int tbd,
                           float **out, size_t *B, size_t *T, size_t *X, size_t *gh, size_t *gw)
{
    *gh = *gw = 0;
    aft_error err;
    if (!aft_dtype_is_float(t->dtype)) {
        cli_error(NULL, "%s: %s has dtype %s; expected floating point", file, what, aft_dtype_name(t->dtype));
        return EXIT_DATA;
    }
    if (t->ndim < 2 || t->ndim > 4) {
        cli_error(NULL, "%s: %s must be [B, T, D], [T, D] or a grid [B, H, W, D]; it has %zu %s", file, what,
                  t->ndim, cli_noun(t->ndim, "dimension", "dimensions"));
        return EXIT_DATA;
    }
    if (t->ndim == 4 && tbd) {
        cli_error(NULL, "%s: %s is a grid [B, H, W, D]; --layout tbd applies to [T, B, D]", file, what);
        return EXIT_DATA;
    }
    float *x;
    if (aft_tensor_to_f32(t, &x, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", file, err.msg);
        return EXIT_DATA;
    }
    if (t->ndim == 2) {
        *B = 1; *T = t->shape[0]; *X = t->shape[1];
    } else if (t->ndim == 4) {   /* H * W: the tensor's elements exist, so no overflow */
        *B = t->shape[0]; *gh = t->shape[1]; *gw = t->shape[2]; *T = *gh * *gw; *X = t->shape[3];
    } else if (tbd) {
        *T = t->shape[0]; *B = t->shape[1]; *X = t->shape[2];
        float *y = cli_swap_tb(x, *B, *T, *X, 0);
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

/* a .safetensors or .npz INPUT: its tensors q, k and v, as float32 in btd order */
static int load_qkv(const struct run_opts *o, struct run *r)
{
    aft_error err;
    if (aft_st_open_limit(o->input, aft_memory_limit(o->max_memory), &r->in_st, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->input, err.msg);
        return EXIT_DATA;
    }
    const char *names[3] = {"q", "k", "v"};
    float **dst[3] = {&r->q, &r->k, &r->v};
    size_t dims[3][3], gh[3], gw[3];
    for (int i = 0; i < 3; i++) {
        const aft_tensor *t = aft_st_find(r->in_st, names[i]);
        if (!t) {
            cli_error(NULL, "%s: no tensor '%s'; a .%s INPUT holds q, k and v", o->input, names[i],
                      aft_st_format(r->in_st));
            return EXIT_DATA;
        }
        char what[16];
        snprintf(what, sizeof what, "'%s'", names[i]);
        if (load_activation(o->input, what, t, o->tbd, dst[i], &dims[i][0], &dims[i][1], &dims[i][2], &gh[i],
                            &gw[i]))
            return EXIT_DATA;
    }
    r->B = dims[0][0];
    r->T = dims[0][1];
    r->C = dims[0][2];
    r->KC = dims[1][2];
    r->D = r->C;
    r->in_rank = aft_st_find(r->in_st, "q")->ndim;
    r->grid_h = gh[0];
    r->grid_w = gw[0];
    for (int i = 1; i < 3; i++)
        if (dims[i][0] != r->B || dims[i][1] != r->T || (i == 2 && dims[i][2] != r->C) || gh[i] != gh[0]) {
            cli_error(NULL, "%s: '%s' is [B=%zu, T=%zu, %zu] but 'q' is [B=%zu, T=%zu, %zu]", o->input, names[i],
                      dims[i][0], dims[i][1], dims[i][2], r->B, r->T, r->C);
            return EXIT_DATA;
        }
    return 0;
}

int runner_begin(const struct run_opts *o, struct run *r)
{
    memset(r, 0, sizeof *r);
    r->cmd = o->cmd;
    r->t_start = aft_now_ms();
    aft_format in_fmt;
    if (cli_file_format(NULL, o->input, &in_fmt) != 0) return EXIT_DATA;
    r->bare = in_fmt == AFT_FORMAT_SAFETENSORS || in_fmt == AFT_FORMAT_NPZ;
    r->cfg = o->cfg;
    cli_kernels_from_env(&r->cfg);
    cli_precision_note(r->cfg.precision);
    return 0;
}

/* the layer's input X from a .npy (or the bare operator's q, k, v from a
 * .safetensors), as float32 in btd order */
int runner_load_input(const struct run_opts *o, struct run *r)
{
    if (r->bare) return load_qkv(o, r);
    aft_error err;
    aft_tensor xt;
    if (aft_npy_read(o->input, &xt, NULL, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->input, err.msg);
        return EXIT_DATA;
    }
    r->in_rank = xt.ndim;
    int rc = load_activation(o->input, "the input", &xt, o->tbd, &r->x, &r->B, &r->T, &r->D, &r->grid_h, &r->grid_w);
    aft_tensor_free(&xt);
    return rc;
}

/* the grid: a 4-D INPUT's, or --grid's over the T rows (both: they agree) */
int runner_place_grid(const struct run_opts *o, struct run *r)
{
    if (r->grid_h && o->grid_h && (r->grid_h != o->grid_h || r->grid_w != o->grid_w)) {
        cli_error(NULL, "%s: a grid of %zu x %zu, but --grid %zu,%zu", o->input, r->grid_h, r->grid_w, o->grid_h,
                  o->grid_w);
        return EXIT_DATA;
    }
    if (!r->grid_h && o->grid_h) {
        size_t n;
        if (__builtin_mul_overflow(o->grid_h, o->grid_w, &n) || n != r->T) {
            cli_error(NULL, "%s: --grid %zu,%zu holds H*W tokens, but the input has T = %zu", o->input, o->grid_h,
                      o->grid_w, r->T);
            return EXIT_DATA;
        }
        r->grid_h = o->grid_h;
        r->grid_w = o->grid_w;
    }
    r->cfg.grid_h = r->grid_h;
    r->cfg.grid_w = r->grid_w;
    return 0;
}

/* ---------------------------------------------------------------- get the parameters */

/* --weights: the layer's weights (for the bare operator only its position
 * bias) */
static int load_weights(const struct run_opts *o, struct run *r)
{
    aft_error err;
    aft_params *p = r->p = &r->wts.p;
    aft_format w_fmt;
    if (cli_file_format(NULL, o->weights_path, &w_fmt) != 0) return EXIT_DATA;
    if (aft_st_open_limit(o->weights_path, aft_memory_limit(o->max_memory), &r->w_st, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->weights_path, err.msg);
        return EXIT_DATA;
    }
    int grid = r->grid_h != 0;
    aft_status st = r->bare ? aft_bias_load_grid(r->w_st, o->prefix, o->cfg.variant, grid, &r->wts, &err)
                            : aft_weights_load_grid(r->w_st, o->prefix, o->cfg.variant, grid, &r->wts, &err);
    if (st != AFT_OK) {
        cli_error(NULL, "%s: %s", o->weights_path, err.msg);
        return EXIT_DATA;
    }
    if (!r->bare && p->d_model != r->D) {
        cli_error(NULL, "%s: the input has D = %zu but '%s' expects %zu", o->weights_path, r->D, r->wts.names[0],
                  p->d_model);
        return EXIT_DATA;
    }
    /* conv: the window and heads the bias holds, unless given */
    aft_weights_config(&r->cfg, &r->wts, o->window_set, o->heads_set);
    if (!r->bare) {
        r->C = p->d_hidden;
        r->KC = p->k_out;
    }
    return 0;
}

/* without --weights: the seeded initialisation (params.c) */
static int seed_params(const struct run_opts *o, struct run *r)
{
    /* sizes from options must fit before anything is allocated for them */
    size_t C = r->bare ? r->C : (o->d_hidden ? o->d_hidden : r->D);
    if (r->cfg.variant == AFT_CONV && C % r->cfg.heads != 0)
        return cli_usage_error(r->cmd, "--heads %zu does not divide the hidden size %zu", r->cfg.heads, C);
    r->p = &r->seeded.p;
    /* a stream's bias covers every position it may reach, not this chunk's */
    size_t span = o->state_in || o->state_out ? SIZE_MAX : r->T;
    int rc = cli_params_seeded(&r->seeded, &r->cfg, o->seed, span, r->D, C, !r->bare, "run");
    if (rc) return rc;
    if (!r->bare) r->C = r->KC = C;
    return 0;
}

/* the library's rules (a conv window and heads from the bias, window 0
 * meaning simple) settle r->cfg; then what only the sizes can tell */
static int settle(const struct run_opts *o, struct run *r)
{
    aft_error err;
    const aft_bias *b = &r->p->bias;
    if (aft_config_settle(&r->cfg, b, r->C, r->KC, &err) != AFT_OK) {
        if (o->weights_path) cli_error(NULL, "%s: %s", o->weights_path, err.msg);
        else cli_error(r->cmd, "%s", err.msg);
        return EXIT_DATA;
    }
    if (r->bare && r->KC != r->C && !(r->cfg.variant == AFT_CONV && r->KC == r->cfg.heads)) {
        if (o->cfg.variant == AFT_CONV)
            cli_error(NULL, "%s: 'k' has %zu %s; conv needs %zu (one per value channel) or %zu (one per head)",
                      o->input, r->KC, cli_noun(r->KC, "channel", "channels"), r->C, r->cfg.heads);
        else
            cli_error(NULL, "%s: 'k' has %zu %s but 'q' and 'v' have %zu", o->input, r->KC,
                      cli_noun(r->KC, "channel", "channels"), r->C);
        return EXIT_DATA;
    }
    /* (a seeded bias covers every position) */
    if (o->weights_path && aft_weights_check_length(&r->wts, r->cfg.variant, r->T, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->weights_path, err.msg);
        return EXIT_DATA;
    }
    return 0;
}

int runner_get_params(const struct run_opts *o, struct run *r)
{
    int rc = o->weights_path ? load_weights(o, r) : seed_params(o, r);
    return rc ? rc : settle(o, r);
}

/* ---------------------------------------------------------------- check */

int runner_unexpected(const struct run_opts *o, const struct run *r, char *buf, size_t cap)
{
    size_t n = o->weights_path ? r->wts.n_unexpected : 0;
    if (!n) return 0;
    char more[48] = "";
    if (n > 1) snprintf(more, sizeof more, " (and %zu more)", n - 1);
    snprintf(buf, cap, "unexpected tensor '%s'%s, which the layer does not use", r->wts.unexpected, more);
    return 1;
}

size_t runner_nonfinite_params(const struct run *r)
{
    const aft_params *p = r->p;
    size_t D = r->D, C = r->C, KC = r->KC, bad = 0;
    const float *mats[] = {p->wq, p->wk, p->wv, p->wo, p->bq, p->bk, p->bv, p->bo};
    size_t lens[] = {C * D, KC * D, C * D, D * C, C, KC, C, D};
    int w16 = p->w_dtype == AFT_F16 || p->w_dtype == AFT_BF16;
    for (int i = 0; i < 8; i++) {
        if (!mats[i] || r->bare) continue;
        if (i < 4 && w16) {   /* weights kept 16-bit: each value widened */
            for (size_t j = 0; j < lens[i]; j++) {
                uint16_t h;
                memcpy(&h, (const char *)mats[i] + 2 * j, 2);
                float v = p->w_dtype == AFT_F16 ? aft_f16_to_f32(h) : aft_bf16_to_f32(h);
                bad += !isfinite(v);
            }
        } else {
            bad += aft_count_nonfinite(mats[i], lens[i]);
        }
    }
    const aft_bias *b = &p->bias;
    if (b->kind == AFT_BIAS_DENSE) bad += aft_count_nonfinite(b->dense, b->tmax * b->tmax);
    if (b->kind == AFT_BIAS_FACTORED)
        bad += aft_count_nonfinite(b->u, b->tmax * b->rank) + aft_count_nonfinite(b->v, b->tmax * b->rank);
    if (b->kind == AFT_BIAS_CONV) bad += aft_count_nonfinite(b->conv, b->conv_rows * b->conv_len);
    return bad;
}

/* tensors under --prefix that are none of the layer's, and non-finite
 * values, which poison every output they reach: a warning, or with --strict
 * an error */
int runner_check_values(const struct run_opts *o, const struct run *r)
{
    char what[256];
    if (runner_unexpected(o, r, what, sizeof what)) {
        if (o->strict) {
            cli_error(NULL, "%s: %s; --strict refuses %s", o->weights_path, what,
                      r->wts.n_unexpected > 1 ? "them" : "it");
            return EXIT_DATA;
        }
        cli_error(r->cmd, "warning: %s: %s", o->weights_path, what);
    }
    size_t B = r->B, T = r->T, D = r->D, C = r->C, KC = r->KC, bad_in = 0, bad_w = 0;
    if (r->bare)
        bad_in = aft_count_nonfinite(r->q, B * T * C) + aft_count_nonfinite(r->k, B * T * KC) +
                 aft_count_nonfinite(r->v, B * T * C);
    else
        bad_in = aft_count_nonfinite(r->x, B * T * D);
    if (o->weights_path) bad_w = runner_nonfinite_params(r);
    const char *where = bad_in ? o->input : o->weights_path;
    size_t nbad = bad_in ? bad_in : bad_w;
    if (nbad && o->strict) {
        cli_error(NULL, "%s: %zu non-finite %s (NaN or inf); --strict refuses %s", where, nbad,
                  cli_noun(nbad, "value", "values"), cli_noun(nbad, "it", "them"));
        return EXIT_DATA;
    }
    if (nbad)
        cli_error(r->cmd, "warning: %s holds %zu non-finite %s (NaN or inf); outputs %s will be NaN", where, nbad,
                  cli_noun(nbad, "value", "values"), cli_noun(nbad, "it reaches", "they reach"));
    return 0;
}

/* refuse, with both numbers, a run the machine cannot hold */
int runner_check_memory_for(const struct run_opts *o, const struct run *r, size_t work, size_t floats)
{
    size_t need, maskb = 0;
    /* a --mask as read (float) and as bytes */
    int over = o->mask_path &&
               (__builtin_mul_overflow(r->B, r->T, &maskb) || __builtin_mul_overflow(maskb, r->T, &maskb) ||
                __builtin_mul_overflow(maskb, sizeof(float) + 1, &maskb));
    over = over || __builtin_mul_overflow(floats, sizeof(float), &need) || __builtin_add_overflow(need, work, &need) ||
           __builtin_add_overflow(need, maskb, &need);
    if (over) need = SIZE_MAX;
    size_t limit = o->max_memory ? o->max_memory : aft_available_memory();
    if (limit && need > limit) {
        cli_error(r->cmd, "this run needs about %s but %s %s", cli_bytes_text(need).s,
                  o->max_memory ? "--max-memory allows" : "only", cli_bytes_text(limit).s);
        return EXIT_DATA;
    }
    return 0;
}

int runner_check_memory(const struct run_opts *o, const struct run *r)
{
    size_t outw = r->bare ? r->C : r->D, floats = SIZE_MAX;
    size_t work = aft_workspace_bytes(&r->cfg, r->B, r->T, r->D, r->C, r->bare ? r->KC : 0);
    if (__builtin_mul_overflow(r->B * r->T, outw, &floats)) floats = SIZE_MAX;   /* the output */
    return runner_check_memory_for(o, r, work, floats);
}

/* ---------------------------------------------------------------- the mask */

/* --mask: [T, T] or [B, T, T] of 0 and 1 (bool, integers or floats) into
 * r->mask, one byte an entry, and the bias */
int runner_load_mask(const struct run_opts *o, struct run *r)
{
    if (!o->mask_path) return 0;
    aft_error err;
    aft_tensor mt;
    size_t B = r->B, T = r->T;
    if (aft_npy_read(o->mask_path, &mt, NULL, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->mask_path, err.msg);
        return EXIT_DATA;
    }
    int batched = mt.ndim == 3, rc = EXIT_DATA;
    float *mf = NULL;
    if (!((mt.ndim == 2 && mt.shape[0] == T && mt.shape[1] == T) ||
          (batched && mt.shape[0] == B && mt.shape[1] == T && mt.shape[2] == T))) {
        char shp[96];
        cli_shape_text(&mt, shp, sizeof shp);
        cli_error(NULL, "%s: mask is [%s] but the input needs [T, T] = [%zu, %zu] or [B, T, T] = [%zu, %zu, %zu]",
                  o->mask_path, shp, T, T, B, T, T);
    } else if (aft_dtype_is_float(mt.dtype) && mt.dtype != AFT_F32 && mt.dtype != AFT_F64) {
        cli_error(NULL, "%s: mask has dtype %s; expected bool or 0/1 integers", o->mask_path, aft_dtype_name(mt.dtype));
    } else if (aft_tensor_to_f32(&mt, &mf, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->mask_path, err.msg);
    } else if (!(r->mask = malloc(mt.nelem + 1))) {
        cli_error(r->cmd, "out of memory for the mask");
    } else {
        rc = 0;
        for (size_t i = 0; i < mt.nelem && !rc; i++) {
            if (mf[i] != 0.0f && mf[i] != 1.0f) {
                cli_error(NULL, "%s: mask entry %zu is %g; entries must be 0 or 1", o->mask_path, i, (double)mf[i]);
                rc = EXIT_DATA;
            }
            r->mask[i] = mf[i] != 0.0f;
        }
        r->p->bias.mask = r->mask;
        r->p->bias.mask_batched = batched;
    }
    free(mf);
    aft_tensor_free(&mt);
    return rc;
}


aft_tensor runner_shaped(const struct run_opts *o, const struct run *r, float *data, size_t X)
{
    return cli_output_shaped(data, r->in_rank, o->tbd, r->B, r->T, r->grid_h, r->grid_w, X);
}

/* ---------------------------------------------------------------- timing */

cJSON *runner_timing_json(const struct run_opts *o, const aft_config *cfg, aft_dtype wdt, size_t B, size_t T,
                          size_t D, size_t C, const struct timing *tm)
{
    aft_blas_info bi;
    aft_blas_get_info(&bi, cfg->projections);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "variant", aft_variant_name(o->cfg.variant));
    cJSON_AddNumberToObject(j, "window", (double)cfg->window);
    cJSON_AddNumberToObject(j, "heads", (double)cfg->heads);
    cJSON_AddBoolToObject(j, "causal", o->cfg.causal);
    if (cfg->grid_h) {
        cJSON *g = cJSON_AddArrayToObject(j, "grid");
        cJSON_AddItemToArray(g, cJSON_CreateNumber((double)cfg->grid_h));
        cJSON_AddItemToArray(g, cJSON_CreateNumber((double)cfg->grid_w));
    }
    cJSON_AddBoolToObject(j, "mask", o->mask_path != NULL);
    cJSON_AddNumberToObject(j, "batch", (double)B);
    cJSON_AddNumberToObject(j, "seq_len", (double)T);
    cJSON_AddNumberToObject(j, "d_model", (double)D);
    cJSON_AddNumberToObject(j, "d_hidden", (double)C);
    cJSON_AddNumberToObject(j, "threads", cfg->threads);
    cJSON_AddStringToObject(j, "impl", o->cfg.impl == AFT_IMPL_REFERENCE ? "reference" : "fast");
    cli_precision_json(j, o->cfg.precision);
    cJSON_AddNumberToObject(j, "repeat", (double)o->repeat);
    if (tm->grad) cJSON_AddStringToObject(j, "pass", "forward and backward");
    cJSON_AddStringToObject(j, "blas_library", bi.library);
    cJSON_AddStringToObject(j, "blas_core", bi.core);
    cJSON_AddStringToObject(j, "projections_kernel", bi.projections);
    /* what the projections' packed weights hold: 16 bits kept as stored */
    cJSON_AddStringToObject(j, "weights_dtype", cli_weights_dtype(wdt, cfg));
    cli_level_json(j);
    /* the times, under the keys aft bench gives the same facts (man/aft.1, JSON OUTPUT) */
    cJSON_AddNumberToObject(j, "load_ms", tm->load);
    cJSON_AddNumberToObject(j, "compute_ms", tm->compute_med);
    cJSON_AddNumberToObject(j, "compute_min_ms", tm->compute_min);
    cJSON_AddNumberToObject(j, "write_ms", tm->write);
    cJSON_AddNumberToObject(j, "total_ms", tm->total);
    if (tm->grad) {
        /* the backward call recomputes the forward pass inside */
        cJSON_AddNumberToObject(j, "forward_ms", tm->forward);
        cJSON_AddNumberToObject(j, "backward_ms", tm->compute_med);
        cJSON_AddNumberToObject(j, "backward_over_forward", tm->ratio);
    }
    if (tm->layer) {
        /* where the fastest run spent its time */
        cJSON_AddNumberToObject(j, "projections_ms", tm->phases.projections);
        cJSON_AddNumberToObject(j, "operator_ms", tm->phases.op);
        cJSON_AddNumberToObject(j, "output_ms", tm->phases.output);
    }
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)aft_peak_rss());
    return j;
}

int runner_write_timing(aft_out *out, const struct run_opts *o, const struct run *r, size_t D)
{
    aft_dtype wdt = r->p && !r->bare ? r->p->w_dtype : AFT_F32;
    return cli_write_json(out, o->cmd, runner_timing_json(o, &r->cfg, wdt, r->B, r->T, D, r->C, &r->tm));
}
