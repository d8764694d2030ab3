/* runner.h - what aft run and aft grad share: their options (the same table
 * entries, RUNNER_OPTIONS), and the steps that load a layer's input, its
 * parameters and mask and check them before either computes. Each step
 * takes the options and the run's state (struct run) and returns 0 or an
 * exit status after reporting, its messages naming the command. */
#ifndef AFT_CLI_RUNNER_H
#define AFT_CLI_RUNNER_H

#include "cli.h"

#include <cJSON.h>
#include <stddef.h>

struct run_opts {
    const char *cmd;                    /* "run" or "grad", for messages */
    const char *grad_output;            /* aft grad: --grad-output DY.npy */
    aft_config cfg;
    int window_set, heads_set;
    const char *mask_path, *weights_path, *prefix, *out_path, *timing_path, *input;
    const char *state_in, *state_out;   /* a causal run's streaming state */
    size_t grid_h, grid_w;              /* --grid H,W (0: none given) */
    int tbd;
    uint64_t seed;
    size_t d_hidden;
    size_t repeat;
    size_t max_memory;
    int strict;
};

#define RUN_OPTS(opts) ((struct run_opts *)(opts))
#define FIELD(f) offsetof(struct run_opts, f)

/* the options' handlers (runner.c) */
int runner_set_variant(const cli_option *opt, void *opts, const char *v);
int runner_set_window(const cli_option *opt, void *opts, const char *v);
int runner_set_heads(const cli_option *opt, void *opts, const char *v);
int runner_set_layout(const cli_option *opt, void *opts, const char *v);
int runner_set_seed(const cli_option *opt, void *opts, const char *v);
int runner_set_d_hidden(const cli_option *opt, void *opts, const char *v);
int runner_set_repeat(const cli_option *opt, void *opts, const char *v);
int runner_set_threads(const cli_option *opt, void *opts, const char *v);
int runner_set_max_memory(const cli_option *opt, void *opts, const char *v);
int runner_set_impl(const cli_option *opt, void *opts, const char *v);
int runner_set_precision(const cli_option *opt, void *opts, const char *v);
int runner_set_grid(const cli_option *opt, void *opts, const char *v);
int runner_set_input(void *opts, const char *arg);

/* the table entries of both commands' shared options */
#define RUNNER_OPTIONS \
    {"--variant", NULL, "full|local|simple|conv", "AFT variant (default full)", runner_set_variant, 0, NULL, 0}, \
    {"--window", NULL, "S", "local, conv: keep w[t,t'] where |t - t'| < S (S = 0: simple)", runner_set_window, 0, NULL, 0}, \
    {"--heads", NULL, "H", "conv: number of heads (default 1, or the bias's rows)", runner_set_heads, 0, NULL, 0}, \
    {"--causal", NULL, NULL, "sums run over t' <= t only (on a grid: raster order)", cli_set_flag, FIELD(cfg.causal), \
     NULL, 0}, \
    {"--grid", NULL, "H,W", \
     "the T = H*W rows are a grid of H rows and W columns in raster order: local's window and conv's bias are 2-D " \
     "(a 4-D INPUT [B, H, W, D] is a grid of its own)", \
     runner_set_grid, 0, "--grid needs H,W", 0}, \
    {"--mask", NULL, "FILE.npy", "boolean or 0/1 [T, T] or [B, T, T], true = visible", cli_set_string, \
     FIELD(mask_path), "--mask needs a file", 0}, \
    {"--layout", NULL, "btd|tbd", "input and output layout (default btd; tbd = [T, B, D])", runner_set_layout, 0, NULL, 0}, \
    {"--weights", NULL, "FILE", ".safetensors or .npz with the layer's weights", cli_set_string, FIELD(weights_path), \
     "--weights needs a file", 0}, \
    {"--prefix", NULL, "P", "prepended to every weight name (e.g. blocks.2.attn.)", cli_set_string, FIELD(prefix), \
     "--prefix needs a value", 0}, \
    {"--seed", NULL, "N", "seed of the initialisation used without --weights (default 0)", runner_set_seed, 0, NULL, 0}, \
    {"--d-hidden", NULL, "N", "hidden size without --weights (default: D)", runner_set_d_hidden, 0, NULL, 0}, \
    {"--timing", NULL, "FILE", "write timings and the configuration as JSON (its keys: JSON OUTPUT in man aft)", \
     cli_set_string, FIELD(timing_path), "--timing needs a file", 0}, \
    {"--repeat", NULL, "N", "run the computation N times (timing: median and min)", runner_set_repeat, 0, NULL, 0}, \
    {"--threads", NULL, "N", "threads (default: the cores aft may run on)", runner_set_threads, 0, NULL, 0}, \
    {"--impl", NULL, "fast|reference", "reference: the plain float64 kernels", runner_set_impl, 0, NULL, 0}, \
    {"--precision", NULL, "f32|bf16", CLI_PRECISION_HELP, runner_set_precision, 0, "--precision needs f32 or bf16", 0}, \
    {"--max-memory", NULL, "SIZE", \
     "refuse runs needing more, and .npz members inflating to more (bytes, or with K, M, G; default: the memory " \
     "available)", runner_set_max_memory, 0, NULL, \
     0}, \
    {"--strict", NULL, NULL, \
     "non-finite values (NaN, inf) in inputs or weights, and tensors under --prefix in --weights that are none of " \
     "the layer's, are an error (default: a warning)", cli_set_flag, FIELD(strict), NULL, 0},

/* the help after both commands' options: what --weights refuses */
#define RUNNER_WEIGHTS_MORE \
    "A layer in --weights has a bias for every projection, for none, or for its\n" \
    "output alone (labml's AFTLocal with bias=False): any other set is refused,\n" \
    "naming the missing tensor, and so is a layer without a bias that its peer\n" \
    "has (--prefix with another layer number: blocks.0.attn. for blocks.1.attn.).\n" \
    "A tensor under --prefix that is none of a layer's is a warning (--strict: an\n" \
    "error).\n"

/* o zeroed and given its defaults, for command cmd */
void runner_defaults(struct run_opts *o, const char *cmd);
/* the usage errors of options that do not go together, for both commands:
 * 0 or EXIT_USAGE */
int runner_check_options(const struct run_opts *o);

struct timing {
    double load, write, total, compute_med, compute_min;
    int layer;              /* phases apply: a layer run, not the bare operator */
    aft_layer_times phases; /* of the fastest run */
    int grad;               /* aft grad: compute is forward and backward, */
    double forward;         /* beside the forward pass alone (medians), */
    double ratio;           /* and the median of the pairs' ratios */
};

/* what a run holds from one step to the next */
struct run {
    const char *cmd;          /* "run" or "grad" */
    double t_start, t_loaded;
    int bare;                 /* a .safetensors INPUT: the bare operator on its q, k, v */
    size_t B, T, D, C, KC;    /* batch, sequence, model width, value and key channels */
    size_t in_rank;           /* the input's rank, 2, 3 or 4 (a grid): the output's too */
    size_t grid_h, grid_w;    /* the grid the rows make (0: a 1-D sequence) */
    float *x;                 /* (B, T, D): the layer's input */
    float *q, *k, *v;         /* bare: (B, T, C), (B, T, KC), (B, T, C) */
    aft_st_file *in_st, *w_st;
    aft_weights wts;          /* from --weights */
    cli_params seeded;        /* without --weights */
    aft_params *p;            /* &wts.p or &seeded.p */
    aft_config cfg;           /* as asked, then settled by the library */
    uint8_t *mask;            /* (T, T) or (B, T, T), 1 = visible */
    float *y;                 /* (B, T, C or D): the result, btd */
    aft_state *state;         /* --state-in, --state-out: the stream's state */
    struct timing tm;
};

/* the steps, in the order they run: r set up for o (the command, the clock
 * started, whether INPUT is a bare operator's file, the configuration) */
int runner_begin(const struct run_opts *o, struct run *r);
int runner_load_input(const struct run_opts *o, struct run *r);
int runner_place_grid(const struct run_opts *o, struct run *r);
int runner_get_params(const struct run_opts *o, struct run *r);
int runner_check_values(const struct run_opts *o, const struct run *r);
/* "unexpected tensor 'NAME' (and N more), which the layer does not use"
 * into buf when --weights holds tensors under --prefix that are none of the
 * layer's (r->wts.n_unexpected): 1, else 0 */
int runner_unexpected(const struct run_opts *o, const struct run *r, char *buf, size_t cap);
/* the non-finite values in r's parameters: the projections (none for the
 * bare operator) and the position bias */
size_t runner_nonfinite_params(const struct run *r);
int runner_check_memory(const struct run_opts *o, const struct run *r);
/* the same for a run needing `work` bytes and `floats` floats beside its
 * mask (aft grad's own sum): 0, or an exit status after saying why */
int runner_check_memory_for(const struct run_opts *o, const struct run *r, size_t work, size_t floats);
int runner_load_mask(const struct run_opts *o, struct run *r);
void runner_free(struct run *r);

/* --timing's JSON: the configuration as settled, the times, the peak
 * memory; D the output's width (the caller may add to it) */
/* wdt: the layer's weights as stored (aft_params.w_dtype) */
cJSON *runner_timing_json(const struct run_opts *o, const aft_config *cfg, aft_dtype wdt, size_t B, size_t T,
                          size_t D, size_t C, const struct timing *tm);
/* the two for r */
int runner_write_timing(aft_out *out, const struct run_opts *o, const struct run *r, size_t D);

/* a float32 tensor over data of the input's rank and layout, width X
 * (cli_output_shaped with r's sizes) */
aft_tensor runner_shaped(const struct run_opts *o, const struct run *r, float *data, size_t X);

#endif
