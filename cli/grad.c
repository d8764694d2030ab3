/* grad.c - aft grad: the gradients of one AFT layer (or the bare operator)
 * on a user's files, given dL/dY.
 *
 * cmd_grad runs as aft run does, through the same steps (runner.c) and
 * options, then reads dY (--grad-output), runs the backward pass, and writes
 * every gradient into one .safetensors (or .npz) under the names the inputs
 * came with: "input" for dL/dX (in the input's layout and rank), or "q",
 * "k", "v" for the bare operator; each weight's and bias's gradient under
 * its name in --weights, the position bias's in the file's own shape. That
 * is the layout torch.autograd's fixtures use, so aft compare checks one
 * against the other tensor by tensor. */
#include "runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- options */

static const cli_option options[] = {
    RUNNER_OPTIONS
    {"--grad-output", "--dy", "DY.npy",
     "dL/dY, the loss's gradient with respect to the output: the output's shape and layout (default: ones, the "
     "gradients of sum(Y))",
     cli_set_string, FIELD(grad_output), "--grad-output needs a file", 0},
    {"-o", "--output", "FILE",
     "the gradients as .safetensors, or .npz when FILE ends in .npz (default: stdout; on a terminal, a summary "
     "instead)",
     cli_set_string, FIELD(out_path), "-o needs a file", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_grad_command = {
    .name = "grad",
    .usage = "usage: aft grad [options] INPUT\n"
             "\n"
             "The backward pass of the layer aft run computes with the same options:\n"
             "the gradients of L = sum(Y * dY) with respect to the input and to every\n"
             "parameter, written as one file of named tensors: 'input' (dL/dX), or 'q',\n"
             "'k', 'v' for the bare operator, and each weight, bias and position bias\n"
             "under its name in --weights (without --weights: query.weight, query.bias,\n"
             "..., output.bias, and pos_bias for conv's bias; a seeded full or local\n"
             "bias is no parameter and has no gradient).\n",
    .options = options,
    .more = RUNNER_WEIGHTS_MORE,
    .operand = runner_set_input,
};

/* ---------------------------------------------------------------- dY */

/* --grad-output in the output's shape (as aft run would write it) into a
 * btd array of B*T*X floats; without it, ones */
static int load_dy(const struct run_opts *o, const struct run *r, size_t X, float **dy)
{
    size_t n = r->B * r->T * X;
    *dy = NULL;
    if (!o->grad_output) {
        if (!(*dy = malloc(n * sizeof(float) + 1))) goto nomem;
        for (size_t i = 0; i < n; i++) (*dy)[i] = 1.0f;
        return 0;
    }
    aft_error err;
    aft_tensor t;
    if (aft_npy_read(o->grad_output, &t, NULL, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->grad_output, err.msg);
        return EXIT_DATA;
    }
    aft_tensor want = runner_shaped(o, r, NULL, X);
    int same = t.ndim == want.ndim;
    for (size_t i = 0; same && i < t.ndim; i++) same = t.shape[i] == want.shape[i];
    int rc = EXIT_DATA;
    float *f = NULL;
    if (!same) {
        char a[96], b[96];
        cli_shape_text(&t, a, sizeof a);
        cli_shape_text(&want, b, sizeof b);
        cli_error(NULL, "%s: dY is [%s] but the output is [%s]; dY has the output's shape", o->grad_output, a, b);
    } else if (!aft_dtype_is_float(t.dtype)) {
        cli_error(NULL, "%s: dY has dtype %s; expected floating point", o->grad_output, aft_dtype_name(t.dtype));
    } else if (aft_tensor_to_f32(&t, &f, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->grad_output, err.msg);
    } else if (o->tbd && r->in_rank == 3) {
        *dy = cli_swap_tb(f, r->B, r->T, X, 0);
        rc = *dy ? 0 : (cli_error(o->cmd, "out of memory for dY"), EXIT_DATA);
    } else {
        *dy = f;
        f = NULL;
        rc = 0;
    }
    free(f);
    aft_tensor_free(&t);
    if (!rc && aft_count_nonfinite(*dy, n)) {
        size_t bad = aft_count_nonfinite(*dy, n);
        if (o->strict) {
            cli_error(NULL, "%s: %zu non-finite %s (NaN or inf); --strict refuses %s", o->grad_output, bad,
                      cli_noun(bad, "value", "values"), cli_noun(bad, "it", "them"));
            rc = EXIT_DATA;
        } else {
            cli_error(o->cmd, "warning: %s holds %zu non-finite %s (NaN or inf); gradients %s will be NaN",
                      o->grad_output, bad, cli_noun(bad, "value", "values"), cli_noun(bad, "it reaches", "they reach"));
        }
    }
    return rc;
nomem:
    cli_error(o->cmd, "out of memory for dY (%zu x %zu)", r->B * r->T, X);
    return EXIT_DATA;
}

/* ---------------------------------------------------------------- the gradients to write */

enum { MAX_GRADS = 14 };

/* what is written: names, tensors (shaped, btd or the input's layout) and
 * the buffers the backward pass fills */
struct grads {
    size_t n;
    char names[MAX_GRADS][176];
    aft_tensor t[MAX_GRADS];
    float *buf[MAX_GRADS];
};

/* a gradient buffer of shape dims, named name */
static float *add(struct grads *g, const char *name, size_t ndim, const size_t *dims)
{
    size_t n = 1, i = g->n;
    aft_tensor *t = &g->t[i];
    memset(t, 0, sizeof *t);
    t->dtype = AFT_F32;
    t->ndim = ndim;
    for (size_t d = 0; d < ndim; d++) {
        t->shape[d] = dims[d];
        n *= dims[d];   /* the shapes of tensors already in memory: no overflow */
    }
    t->nelem = n;
    t->nbytes = n * sizeof(float);
    if (!(g->buf[i] = calloc(n + 1, sizeof(float)))) return NULL;
    t->data = g->buf[i];
    snprintf(g->names[i], sizeof g->names[i], "%s", name);
    g->n++;
    return g->buf[i];
}

/* the parameters' gradients, named and shaped as aft_grad_slots lists
 * them (projections: the layer's too, not only the position bias's), into
 * g and their fields of lg */
static int add_slots(struct grads *g, const struct run_opts *o, const struct run *r, int projections,
                     aft_layer_grads *lg)
{
    aft_grad_slot slots[AFT_GRAD_SLOTS];
    const aft_weights *w = o->weights_path ? &r->wts : NULL;
    size_t n = aft_grad_slots(slots, r->p, projections, w, w ? r->w_st : NULL);
    for (size_t i = 0; i < n; i++) {
        if (!(*aft_layer_grads_field(lg, slots[i].role) = add(g, slots[i].name, slots[i].ndim, slots[i].shape)))
            return EXIT_DATA;
        /* add() callocs, and every --repeat call writes the same entries: the
         * library clears only those (labml's [T, T] bias: a band, not 64 MiB) */
        if (slots[i].role >= AFT_GRAD_DENSE) lg->bias.zero_outside = 1;
    }
    return 0;
}

/* the layer's: dX as "input", then each projection's weight and bias, and
 * the position bias */
static int plan_layer(struct grads *g, const struct run_opts *o, const struct run *r, aft_layer_grads *lg)
{
    aft_tensor xs = runner_shaped(o, r, NULL, r->D);
    if (!(lg->dx = add(g, "input", xs.ndim, xs.shape))) return EXIT_DATA;
    return add_slots(g, o, r, 1, lg);
}

/* the bare operator's: q, k, v in the input's layout, and the position
 * bias (into lg->bias) */
static int plan_op(struct grads *g, const struct run_opts *o, const struct run *r, float **dq, float **dk,
                   float **dv, aft_layer_grads *lg)
{
    aft_tensor qs = runner_shaped(o, r, NULL, r->C), ks = runner_shaped(o, r, NULL, r->KC);
    if (!(*dq = add(g, "q", qs.ndim, qs.shape)) || !(*dk = add(g, "k", ks.ndim, ks.shape)) ||
        !(*dv = add(g, "v", qs.ndim, qs.shape)))
        return EXIT_DATA;
    return add_slots(g, o, r, 0, lg);
}

static void grads_free(struct grads *g)
{
    for (size_t i = 0; i < g->n; i++) free(g->buf[i]);
    g->n = 0;
}

/* ---------------------------------------------------------------- compute */

/* --timing: one forward pass alone into y, its time in ms (< 0: it failed) */
static double forward_ms(struct run *r, float *y)
{
    aft_error err;
    aft_config cfg = r->cfg;
    cfg.progress = NULL;   /* the progress line counts the backward passes */
    double t0 = aft_now_ms();
    aft_status st = r->bare ? aft_op_forward(y, r->q, r->k, r->v, &r->p->bias, &cfg, r->B, r->T, r->C, r->KC, &err)
                            : aft_layer_forward(y, r->x, r->p, &cfg, r->B, r->T, &err);
    return st == AFT_OK ? aft_now_ms() - t0 : -1.0;
}

/* the backward pass --repeat times; the times' median and minimum. With
 * --timing each call is followed by a forward pass alone, and the ratio is
 * the median of the pairs' ratios: a machine whose speed drifts during the
 * run (a shared one moves by a third within minutes) moves both halves of a
 * pair alike, where all the gradient calls first and all the forward passes
 * after could land in different moments. */
static int compute(const struct run_opts *o, struct run *r, struct grads *g, const float *dy)
{
    aft_layer_grads lg;
    float *dq = NULL, *dk = NULL, *dv = NULL;
    memset(&lg, 0, sizeof lg);
    int rc = r->bare ? plan_op(g, o, r, &dq, &dk, &dv, &lg) : plan_layer(g, o, r, &lg);
    const int timed = o->timing_path != NULL;
    /* the gradient calls' times, the forward passes', the pairs' ratios */
    double *times = malloc(3 * o->repeat * sizeof(double));
    float *y = timed ? malloc(r->B * r->T * (r->bare ? r->C : r->D) * sizeof(float) + 1) : NULL;
    if (rc || !times || (timed && !y)) {
        free(times);
        free(y);
        cli_error(o->cmd, "out of memory for the gradients");
        return EXIT_DATA;
    }
    double *fwd = times + o->repeat, *ratio = fwd + o->repeat;
    r->t_loaded = aft_now_ms();
    aft_error err;
    const char *name = aft_variant_name(o->cfg.variant);
    size_t B = r->B, T = r->T;
    cli_progress_start("aft grad: %s T=%zu B=%zu", name, T, B);
    cli_progress_steps(o->repeat);
    r->cfg.progress = cli_progress_counter();   /* the library counts the rows done */
    for (size_t i = 0; i < o->repeat && !rc; i++) {
        cli_progress_step(i);
        if (o->repeat > 1) cli_progress_label("aft grad: %s T=%zu B=%zu, run %zu of %zu", name, T, B, i + 1, o->repeat);
        double t0 = aft_now_ms();
        aft_status st = r->bare ? aft_op_backward(dq, dk, dv, &lg.bias, NULL, dy, r->q, r->k, r->v, &r->p->bias, &r->cfg,
                                                  B, T, r->C, r->KC, &err)
                                : aft_layer_backward(&lg, NULL, dy, r->x, r->p, &r->cfg, B, T, &err);
        times[i] = aft_now_ms() - t0;
        if (st != AFT_OK) {
            cli_error(o->cmd, "%s", err.msg);
            rc = EXIT_DATA;
        } else if (timed && (fwd[i] = forward_ms(r, y)) < 0.0) {
            cli_error(o->cmd, "the forward pass for --timing failed");
            rc = EXIT_DATA;
        } else if (timed) {
            ratio[i] = fwd[i] > 0.0 ? times[i] / fwd[i] : 0.0;
        }
    }
    cli_progress_stop();
    r->cfg.progress = NULL;
    if (!rc) {
        r->tm.compute_med = cli_median(times, o->repeat);
        r->tm.compute_min = times[0];
    }
    if (!rc && timed) {
        r->tm.grad = 1;
        r->tm.forward = cli_median(fwd, o->repeat);
        r->tm.ratio = cli_median(ratio, o->repeat);
    }
    free(times);
    free(y);
    return rc;
}

/* ---------------------------------------------------------------- write */

/* the activations' gradients from btd to the input's layout */
static int to_layout(const struct run_opts *o, const struct run *r, struct grads *g)
{
    if (!o->tbd || r->in_rank != 3) return 0;
    size_t nact = r->bare ? 3 : 1;
    for (size_t i = 0; i < nact; i++) {
        float *z = cli_swap_tb(g->buf[i], r->B, r->T, g->t[i].shape[2], 1);
        if (!z) {
            cli_error(o->cmd, "out of memory");
            return EXIT_DATA;
        }
        free(g->buf[i]);
        g->buf[i] = z;
        g->t[i].data = z;
    }
    return 0;
}

/* a line a gradient for the reader: its shape, largest magnitude and norm */
static void show(const struct grads *g)
{
    printf("%-24s %-18s %14s %14s\n", "gradient", "shape", "max |g|", "norm");
    for (size_t i = 0; i < g->n; i++) {
        const float *x = g->buf[i];
        double mx = 0.0, ss = 0.0;
        for (size_t j = 0; j < g->t[i].nelem; j++) {
            double a = fabs((double)x[j]);
            mx = a > mx || isnan(a) ? a : mx;
            ss += a * a;
        }
        char shp[64];
        cli_shape_text(&g->t[i], shp, sizeof shp);
        printf("%-24s [%-16s %14.6g %14.6g\n", g->names[i], strcat(shp, "]"), mx, sqrt(ss));
    }
    puts("(not saved: -o FILE or a pipe writes the gradients as .safetensors)");
}

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* the gradients (and --timing), each file written whole or not at all */
static int write_grads(const struct run_opts *o, struct run *r, struct grads *g)
{
    double t_w0 = aft_now_ms();
    if (to_layout(o, r, g)) return EXIT_DATA;
    const char *names[MAX_GRADS];
    for (size_t i = 0; i < g->n; i++) names[i] = g->names[i];
    int term = !o->out_path && isatty(STDOUT_FILENO);
    const char *path = o->out_path ? o->out_path : "-";
    aft_out tout = {0};
    aft_error err;
    int rc = EXIT_DATA;
    if (o->timing_path && aft_out_open(&tout, o->timing_path, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    static const char *const meta[] = {"format", "pt", "grad_of", "sum(Y * dY)", "written_by", "aft grad"};
    aft_status st;
    if (term) {
        show(g);
        st = AFT_OK;
    } else if (o->out_path && ends_with(o->out_path, ".npz")) {
        st = aft_npz_write(path, names, g->t, g->n, &err);
    } else {
        st = aft_st_write(path, names, g->t, g->n, meta, 3, &err);
    }
    if (st != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    r->tm.write = aft_now_ms() - t_w0;
    r->tm.total = aft_now_ms() - r->t_start;
    r->tm.load = r->t_loaded - r->t_start;
    if (o->timing_path && runner_write_timing(&tout, o, r, r->bare ? r->C : r->D) != 0) goto out;
    if (o->timing_path && aft_out_commit(&tout, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    rc = 0;
out:
    if (tout.fp) aft_out_abort(&tout);
    return rc;
}

/* ---------------------------------------------------------------- the command */

/* the run's memory with the backward pass's: aft run's check with the
 * gradients' arrays and the backward workspace */
static int check_memory(const struct run_opts *o, const struct run *r)
{
    size_t outw = r->bare ? r->C : r->D, floats = SIZE_MAX;
    size_t work = aft_backward_workspace_bytes(&r->cfg, &r->p->bias, r->B, r->T, r->D, r->C, r->bare ? r->KC : 0);
    /* dY, and the gradients of the activations, twice over while swapped */
    size_t act = r->bare ? 2 * r->C + r->KC : r->D;
    if (__builtin_mul_overflow(r->B * r->T, outw + 2 * act, &floats)) floats = SIZE_MAX;
    return runner_check_memory_for(o, r, work, floats);
}

static int parse_args(int argc, char **argv, struct run_opts *o)
{
    runner_defaults(o, "grad");
    int rc = cli_parse_options(&cli_grad_command, argc, argv, o);
    if (rc) return rc;
    if ((rc = runner_check_options(o))) return rc;
    if (o->grad_output && o->input && strcmp(o->grad_output, "-") == 0 && strcmp(o->input, "-") == 0)
        return cli_usage_error(o->cmd, "only one of INPUT and --grad-output can be '-' (standard input)");
    return 0;
}

int cmd_grad(int argc, char **argv)
{
    struct run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout("grad") : rc;

    struct run r;
    struct grads g;
    float *dy = NULL;
    memset(&g, 0, sizeof g);
    if ((rc = runner_begin(&o, &r))) return rc;

    rc = runner_load_input(&o, &r);
    if (!rc) rc = runner_place_grid(&o, &r);
    if (!rc) rc = runner_get_params(&o, &r);
    if (!rc) rc = runner_check_values(&o, &r);
    if (!rc) rc = check_memory(&o, &r);
    if (!rc) rc = runner_load_mask(&o, &r);
    if (!rc) rc = load_dy(&o, &r, r.bare ? r.C : r.D, &dy);
    if (!rc) rc = compute(&o, &r, &g, dy);
    if (!rc) rc = write_grads(&o, &r, &g);
    free(dy);
    grads_free(&g);
    runner_free(&r);
    if (rc == 0 && !o.out_path) return cli_finish_stdout("grad");
    return rc;
}
