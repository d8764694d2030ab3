/* cli.h - what the subcommands of the aft command share. */
#ifndef AFT_CLI_H
#define AFT_CLI_H

#include "aft.h"

struct cJSON;   /* cJSON's object, for the JSON helpers below */

/* exit statuses */
enum { EXIT_DATA = 1, EXIT_USAGE = 2 };

/* each subcommand: argv[0] is the subcommand name */
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_mask(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_model(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_encode(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_train(int argc, char **argv);

/* Messages have one shape (README.md, man/aft.1 DIAGNOSTICS): one line on
 * stderr, "aft CMD: [FILE: ]what is wrong" ("aft: " when no command was
 * named); a usage error adds the line "Try 'aft CMD --help'.". */
/* the command main dispatched ("run"), or NULL before it has */
extern const char *cli_command_name;
/* "aft CMD: message" on stderr (CMD NULL: cli_command_name's); a
 * progress line shown stops first */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* where cli_error and cli_usage_error write (NULL: stderr); a process of
 * several under MPI holds its messages until the ranks agree who reports */
extern FILE *cli_msg_stream;
/* usage error: the message and the hint line; returns EXIT_USAGE */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- options (options.c)
 *
 * Each subcommand declares its options once, as a table, in the manner of
 * git's parse_options: cli_parse_options walks argv against it, and the
 * --help text is made from it (the man page and the bash completion are
 * checked against it by a test). */
typedef struct cli_option cli_option;

/* Puts the value of opt (NULL for a flag, and for a value the command line
 * lacks when opt->missing is NULL) where it goes in the command's options
 * struct, checking it first; returns 0, or an exit status after reporting. */
typedef int (*cli_option_fn)(const cli_option *opt, void *opts, const char *value);

struct cli_option {
    const char *name;      /* "--window", "-o" */
    const char *alias;     /* another spelling ("--output"), or NULL */
    const char *arg;       /* the value's name in the help ("S"); NULL: a flag */
    const char *help;      /* '\n' starts a new line; long lines are wrapped */
    cli_option_fn set;     /* where the value goes */
    size_t field;          /* for cli_set_flag and cli_set_string: the field's
                            * offsetof in the options struct */
    const char *missing;   /* the usage error when the value is missing ("%s":
                            * the option as typed); NULL: set() gets NULL */
    int hidden;            /* left out of the help (bench's --one) */
};

typedef struct {
    const char *name;             /* "run" */
    const char *usage;            /* the help before the options: usage, description */
    const cli_option *options;    /* ends with an entry whose name is NULL */
    const char *more;             /* the help after the options, or NULL */
    /* takes an operand (a word not starting with '-', "-", or anything after
     * "--"): 0, or an exit status after reporting; NULL: the command takes
     * none (and "--" is an unknown option) */
    int (*operand)(void *opts, const char *arg);
    const char *unknown;          /* the usage error for an unknown option ("%s":
                                   * it); NULL: "unknown option '%s'" */
} cli_command;

/* the options every command takes besides its own, listed after them in its
 * help (ends with an entry whose name is NULL): -q/--quiet, and -h/--help,
 * which the parser handles itself */
extern const cli_option cli_common_options[];

/* Walks argv[1..argc) in order against c's options, then the common ones;
 * -h and --help print the help. Returns 0 to go on, -1 after printing the
 * help to stdout (the caller returns cli_finish_stdout), or EXIT_USAGE after
 * a usage error. */
int cli_parse_options(const cli_command *c, int argc, char **argv, void *opts);
void cli_print_help(const cli_command *c, FILE *fp);
/* for options whose value needs no check: a flag sets an int to 1, a
 * value is kept as a const char * (pointing into argv) */
int cli_set_flag(const cli_option *opt, void *opts, const char *value);
int cli_set_string(const cli_option *opt, void *opts, const char *value);

/* the option tables, for the tests that check the help, the man page and
 * the completion against them */
extern const cli_command cli_info_command, cli_run_command, cli_grad_command, cli_mask_command, cli_compare_command,
    cli_convert_command, cli_model_command, cli_generate_command, cli_encode_command, cli_decode_command,
    cli_bench_command, cli_train_command;

/* strict number parsing: whole string, range checked (whole numbers:
 * aft_parse_u64, aft_parse_size and aft_parse_grid in aft.h). Return 0 on
 * success, -1 otherwise. */
int cli_parse_double(const char *s, double *out);
/* a byte count with an optional K, M, G or T suffix (powers of 1024) */
int cli_parse_bytes(const char *s, size_t *out);
/* --max-memory's value into *out (nonzero); 0, or EXIT_USAGE after reporting */
int cli_set_memory(const char *cmd, size_t *out, const char *v);
/* --threads' value (1 to 1024) into *out; 0, or EXIT_USAGE after reporting */
int cli_set_threads(const char *cmd, int *out, const char *v);
/* --impl's value (fast or reference) into *out; 0, or EXIT_USAGE after reporting */
int cli_set_impl(const char *cmd, aft_impl *out, const char *v);
/* --precision's value (f32 or bf16, aft_precision_from_name) into *out; 0,
 * or EXIT_USAGE after reporting */
int cli_set_precision(const char *cmd, aft_precision *out, const char *v);
/* --precision's help, the same in every command that takes it */
#define CLI_PRECISION_HELP \
    "the large products' number type: f32 (default) or bf16 (bf16 operands, float32 sums, on the CPU's " \
    "AVX512_BF16 or AMX; without them float32, said once on stderr)"
/* asked bf16 where the CPU has no bf16 engine: says once on stderr that the
 * products compute in float32 */
void cli_precision_note(aft_precision p);
/* --timing's and bench's keys "precision" (as asked) and "bf16_engine" */
void cli_precision_json(struct cJSON *j, aft_precision p);

/* progress on stderr (progress.c): shown only when stderr is a terminal,
 * after about a second, and never with --quiet (cli_quiet: set by the
 * common option, or by main when it comes before the command's name).
 * "LABEL: 37% (12.3 s, about 21 s left)" from the counter below, or
 * "LABEL (12.3 s)" while it counts nothing. */
extern int cli_quiet;
void cli_progress_start(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_label(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* the counter the line reads, zeroed by cli_progress_start: for the
 * library's calls (aft_config.progress, aft_model_forward_progress), or
 * the command's own counting (cli_progress_total, cli_progress_add).
 * NULL when no line is shown, so nothing is counted then. */
aft_progress *cli_progress_counter(void);
void cli_progress_total(size_t total);
void cli_progress_add(size_t n);
/* the work as n steps of equal weight (--repeat's runs): the fraction is
 * (i + the counter's fraction) / n in step i, which cli_progress_step(i)
 * begins with the counter zeroed */
void cli_progress_steps(size_t n);
void cli_progress_step(size_t i);
void cli_progress_stop(void);

/* "-" is shown as "standard input" in messages and reports */
const char *cli_display_name(const char *path);
/* an output path as messages name it: "-" is standard output */
const char *cli_output_name(const char *path);
/* "aft CMD: FILE: msg" (CMD NULL: as for cli_error), unless msg already
 * starts with the file's name */
void cli_report_file(const char *cmd, const char *path, const char *msg);
int cli_ends_with(const char *s, const char *suffix);
int cli_path_exists(const char *path);

/* the kernel choices the environment asks for (AFT_LINEAR_BLAS=1,
 * AFT_DENSE_BLAS=1: OpenBLAS) into cfg */
void cli_kernels_from_env(aft_config *cfg);
/* the median of n >= 1 timings, which it sorts in place (v[0] is then the
 * fastest) */
double cli_median(double *v, size_t n);
/* OpenBLAS's kernels for this CPU where it fell back to SSE3's for a CPU it
 * does not know, unless OPENBLAS_CORETYPE chose them (cli/blas_core.c) */
void cli_blas_core(void);

/* ---------------------------------------------------------------- kernel levels (levels.c) */

/* AFT_KERNELS=LEVEL, when set, chooses the kernels' level: 0, or
 * EXIT_USAGE when it names none this CPU runs (said) */
int cli_levels_choose(void);
/* the level in use ("avx512"), and why it is the one ("chosen by
 * AFT_KERNELS", "the highest this CPU and OS run: ...") */
const char *cli_level_name(void);
void cli_level_why(char *buf, size_t cap);
/* the two as JSON keys "kernels" and "kernels_why" */
void cli_level_json(struct cJSON *j);
/* aft --version's lines: the level in use and why, and the levels built in */
void cli_levels_print(FILE *fp);

/* ---------------------------------------------------------------- seeded parameters (params.c) */

/* a layer's parameters made from a seed, and the memory behind them */
typedef struct {
    aft_params p;
    float *owned[6];
    uint16_t *w16[4];   /* cli_params_16: wq, wk, wv, wo in 16 bits */
} cli_params;

/* The one deterministic initialisation, used by aft run without --weights
 * and by aft bench: entry (i, j) of each projection matrix and bias (for a
 * layer D -> C -> D) uniform in [-1/sqrt(in), 1/sqrt(in)) from a hash of
 * (seed, tensor, i, j); the position bias of cfg's variant, window and heads
 * uniform in [-0.5, 0.5) (full and local: generated as needed from (seed, t,
 * t'); conv: (heads, 2S - 1)). Without projections only the position bias is
 * made (the bare operator). A conv window wider than T is narrowed to T in
 * cfg (T = SIZE_MAX: a stream, never narrowed); an offset's conv bias is the
 * same whatever the narrowing. sp must be zeroed; free it with cli_params_free. Returns 0, or
 * EXIT_DATA after reporting as "aft CMD: ...". */
int cli_params_seeded(cli_params *sp, aft_config *cfg, uint64_t seed, size_t T, size_t D, size_t C,
                      int projections, const char *cmd);
void cli_params_free(cli_params *sp);
/* sp's projection weights rounded to dt (AFT_F16 or AFT_BF16; anything else
 * leaves them float32) and kept so (p.w_dtype): aft bench --weights-dtype.
 * Returns 0, or EXIT_DATA after reporting. */
int cli_params_16(cli_params *sp, aft_dtype dt, const char *cmd);

/* ---------------------------------------------------------------- the model (model.c)
 *
 * What aft model, aft generate, aft encode, aft decode and aft bench
 * --generate share: the options that load labml's model (aft.h, "the
 * model"), kept in a cli_model_opts inside each command's options struct,
 * the step that loads it, and the reader of token ids. */
typedef struct {
    const char *cmd;          /* "model", "generate" or "bench", for messages */
    const char *weights;      /* --weights FILE */
    const char *vocab;        /* --vocab FILE (a JSON array), or NULL: the metadata's */
    size_t window;            /* --window (0: from the checkpoint) */
    int threads;              /* --threads (0: every core) */
    aft_impl impl;            /* --impl */
    aft_precision precision;  /* --precision */
    size_t max_memory;        /* --max-memory (0: the memory available) */
    int strict;               /* --strict: a tensor the model does not use is an
                               * error (else a warning) */
    int no_warning;           /* say nothing of such tensors (aft bench's
                               * children: the parent has; aft encode and
                               * aft decode, which read the vocabulary only) */
    int need_vocab;           /* refuse a model without a vocabulary */
} cli_model_opts;

/* the help after the options of aft model and aft generate: what --weights
 * refuses */
#define CLI_MODEL_MORE \
    "Every layer must have the same tensors in the same shapes, as PyTorch's\n" \
    "load_state_dict demands: a layer without a tensor another layer has (an\n" \
    "optional bias too), or with one of another shape, is refused, naming it. A\n" \
    "tensor the model does not use is a warning (--strict: an error).\n"

/* --strict's help, the same in aft model and aft generate */
#define CLI_MODEL_STRICT_HELP \
    "a tensor in --weights that the model does not use is an error (default: a warning); a layer without a " \
    "tensor another layer has is an error either way"

/* the option handlers: each finds the cli_model_opts at opt->field */
int cli_model_set_weights(const cli_option *opt, void *opts, const char *v);
int cli_model_set_window(const cli_option *opt, void *opts, const char *v);
int cli_model_set_threads(const cli_option *opt, void *opts, const char *v);
int cli_model_set_precision(const cli_option *opt, void *opts, const char *v);
int cli_model_set_max_memory(const cli_option *opt, void *opts, const char *v);
int cli_model_set_vocab(const cli_option *opt, void *opts, const char *v);
int cli_model_set_strict(const cli_option *opt, void *opts, const char *v);

/* The model of --weights (with --vocab's vocabulary, --window, --threads,
 * --impl, --precision: said once when the CPU has no bf16), refused when it needs more memory than --max-memory or the
 * machine has: 0, or EXIT_DATA after reporting "aft: FILE: ..." (FILE the
 * weights, or --vocab's file when its list is what is wrong). Tensors the
 * model does not use: "aft CMD: warning: FILE: unexpected tensor ...", or
 * under --strict an error. With need_vocab, a model without a vocabulary
 * (no metadata 'vocab', no --vocab) is refused, pointing to --vocab. */
int cli_model_open(const cli_model_opts *o, aft_model **out);

/* the model's file and sizes (variant, window, layers, widths, vocabulary,
 * context) into the JSON object j, for --timing and bench's rows */
void cli_model_info_json(struct cJSON *j, const char *path, const aft_model_info *in);
/* "f32", "f16", "bf16" (weights_dtype in --timing and aft bench --json) */
const char *cli_dtype_lower(aft_dtype dt);
/* what a layer's products hold weights stored as `stored` in, under cfg's
 * kernel choice and precision at the level in use ("f32", "f16", "bf16") */
const char *cli_weights_dtype(aft_dtype stored, const aft_config *cfg);

/* token ids read from a .npy */
typedef struct {
    int32_t *ids;   /* (B, T), batch-major; malloc'd */
    size_t B, T;
    size_t rank;    /* the file's: 1 ([T]) or 2 ([B, T] or [T, B]) */
} cli_tokens;

/* FILE ('-': stdin), a .npy of integers of any integer dtype, [T] or
 * [B, T] ([T, B] when tbd), each in [0, V), into out: 0, or EXIT_DATA
 * after reporting "aft: FILE: ..." naming the token, the dtype or the rank
 * (CMD: the command, for an out-of-memory message) */
int cli_tokens_read(const char *cmd, const char *file, size_t V, int tbd, cli_tokens *out);

/* The trained model aft ships, which aft generate and aft bench --generate
 * run without --weights: in the source tree, CLI_SHIPPED_MODEL; installed
 * (make install, the Debian package), AFT_DATADIR/CLI_SHIPPED_NAME, the
 * data directory make compiles into cli/ from its PREFIX (mk/install.mk:
 * DATADIR). Builds that do not pass it (mk/sanitize.mk's) get make's
 * default. */
#define CLI_SHIPPED_MODEL "testdata/model/labml_aft_fortunes.safetensors"
#define CLI_SHIPPED_NAME "labml_aft_fortunes.safetensors"
#ifndef AFT_DATADIR
#define AFT_DATADIR "/usr/local/share/aft"
#endif
/* --weights' help in aft generate and aft bench: where the model is looked for */
#define CLI_SHIPPED_HELP \
    "the model shipped with aft: " CLI_SHIPPED_MODEL " beside the aft binary, else " AFT_DATADIR "/" \
    CLI_SHIPPED_NAME

/* The places looked in, in order: 0, beside this aft binary
 * (<its directory>/CLI_SHIPPED_MODEL: the source tree it was built in);
 * 1, the data directory (AFT_DATADIR/CLI_SHIPPED_NAME). Place i into buf:
 * buf, or NULL when it cannot be named (the binary cannot be found). */
const char *cli_shipped_place(int i, char *buf, size_t cap);
/* The first place that holds the model, into buf: buf; or NULL after
 * reporting "aft CMD: WHAT the model shipped with aft (PLACE0 beside the
 * aft binary, or PLACE1), which is not there: give --weights FILE". */
const char *cli_shipped_model(const char *cmd, const char *what, char *buf, size_t cap);

/* ---------------------------------------------------------------- aft bench --stream (bench_stream.c) */

typedef struct {
    double token_us;     /* a step of one row, per token (the first 4096 rows) */
    double chunked_ms;   /* the whole sequence in steps of `chunk` rows */
    size_t chunk;
    double floor_us;     /* reading the layer's four weight matrices once */
} cli_stream_times;

/* the causal layer p under cfg as a stream, on seeded inputs (B, T, D):
 * the best of `repeat` runs of each; 0, or an exit status after reporting */
int cli_bench_stream(const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t D, size_t C,
                     size_t chunk, size_t repeat, cli_stream_times *out);

/* aft bench --grad (bench_grad.c): the backward pass's median and fastest
 * time in ms, the forward pass inside it included, and the median of its
 * calls' ratios to a forward pass alone run right after each */
typedef struct {
    double med, min, ratio;
} cli_grad_times;

/* the layer p's gradients under cfg on x (B, T, D) and a seeded dY, timed
 * `repeat` times after an untimed run; 0, or an exit status after reporting */
int cli_bench_grad(const aft_params *p, const aft_config *cfg, size_t B, size_t T, const float *x, size_t repeat,
                   cli_grad_times *out);

/* ---------------------------------------------------------------- aft bench --generate (bench_generate.c) */

/* the prompt's tokens: ids 0, 1, 2, ... (mod the vocabulary) */
#define CLI_BENCH_PROMPT 8

typedef struct {
    double ms, ms_min;   /* the prompt and n new tokens: median and fastest */
    double ttft_ms;      /* median time to the first new token */
    size_t prompt;       /* the prompt's tokens */
} cli_generate_times;

/* m generating n tokens greedily after a prompt of CLI_BENCH_PROMPT tokens,
 * as aft generate does: one untimed run, then `repeat` timed; 0, or an
 * exit status after reporting */
int cli_bench_generate(const aft_model *m, size_t n, size_t repeat, cli_generate_times *out);

/* ---------------------------------------------------------------- a tensor for a terminal (show.c) */

/* numpy's repr of a float32 array of that shape ("array([[ 0.5, -1. ]],
 * dtype=float32)"), with numpy's default print options: malloc'd, or NULL
 * when out of memory */
char *cli_numpy_repr(const float *x, size_t ndim, const size_t *shape);
/* a float32 tensor for a reader: "shape (2, 3), dtype float32, min ..., max
 * ..., mean ..." and its numpy repr; 0, or -1 when out of memory */
int cli_show_tensor(FILE *fp, const aft_tensor *t);
/* Where an operand FILE.safetensors:NAME or FILE.npz:NAME splits: the ':'
 * after the last ".safetensors" or ".npz" whose file exists, else after the
 * last one (so opening it reports the missing file); NULL when there is
 * none. With must_exist, only a split whose file exists counts. */
const char *cli_tensor_split(const char *arg, int must_exist);
/* The format of a file operand (aft_file_format): "-" is a .npy; a file
 * that cannot be opened is handed to the .npy reader, which says why.
 * Returns -1 after reporting "aft[ CMD]: FILE: not a .npy, .npz or
 * .safetensors file". */
int cli_file_format(const char *cmd, const char *path, aft_format *fmt);

/* ---------------------------------------------------------------- layouts (common.c)
 *
 * The --layout of aft run, grad and model: btd, the batch first ([B, T,
 * X]), or tbd ([T, B, X]); inputs of rank 2 ([T, X]) or 4 (a grid [B, H,
 * W, X]) have one layout of their own. */

/* --layout's value into *tbd; 0, or EXIT_USAGE after reporting */
int cli_set_layout(const char *cmd, int *tbd, const char *v);
/* [T, B, X] -> [B, T, X] (or back when to_tbd), malloc'd; NULL when out of memory */
float *cli_swap_tb(const float *x, size_t B, size_t T, size_t X, int to_tbd);
/* An output of width X for an input of that rank and layout: a float32
 * tensor over data (NULL: the shape alone) of B * T * X values, [T, X] for
 * rank 2, [B, grid_h, grid_w, X] for rank 4, else [B, T, X], or [T, B, X]
 * with tbd */
aft_tensor cli_output_shaped(float *data, size_t rank, int tbd, size_t B, size_t T, size_t grid_h, size_t grid_w,
                             size_t X);

/* the end of an output opened with aft_out_open: aborted (nothing left)
 * when rc is an exit status, committed when it is 0; rc, or EXIT_DATA after
 * reporting a commit that failed (its message names the file) */
int cli_out_close(aft_out *out, int rc);
/* t as a .npy to path (NULL: standard output), written atomically; 0, or
 * EXIT_DATA after reporting */
int cli_write_npy(const char *path, const aft_tensor *t);

/* --timing's JSON: j printed to out, then deleted (NULL: out of memory); 0,
 * or EXIT_DATA after reporting */
int cli_write_json(aft_out *out, const char *cmd, struct cJSON *j);

/* a byte count for a message, in the unit that shows it: "512 B", "1 KiB",
 * "1.5 MiB", "3.2 GiB" (one decimal, left out where it is 0); use .s within
 * the expression: printf("%s", cli_bytes_text(n).s) */
typedef struct {
    char s[32];
} cli_size_text;
cli_size_text cli_bytes_text(size_t bytes);
/* the noun for a count: one when n is 1, else many ("1 value", "2 values") */
const char *cli_noun(size_t n, const char *one, const char *many);

/* flush and close stdout; reports a failed write and returns EXIT_DATA */
int cli_finish_stdout(const char *cmd);
/* a tensor's shape as "2, 3", for messages (cut short to fit cap) */
void cli_shape_text(const aft_tensor *t, char *buf, size_t cap);

#endif
