/* run.c - aft run: one AFT layer (or the bare operator) on a user's files.
 *
 * cmd_run reads as its steps: parse the options, load the input, get the
 * parameters (from --weights, or the seeded initialisation aft bench shares)
 * and settle the configuration by the library's rules, check the values and
 * the memory, load the mask, compute (from and into a streaming state with
 * --state-in, --state-out), write. Each step takes the options and
 * the run's state (struct run) and returns 0 or an exit status after
 * reporting. */
#include "shard.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- options */

static const cli_option options[] = {
    RUNNER_OPTIONS
    {"-o", "--output", "FILE",
     "output .npy, float32 (default: stdout; on a terminal, a summary of the result instead)", cli_set_string,
     FIELD(out_path), "-o needs a file", 0},
    {"--state-in", NULL, "FILE",
     "with --causal: continue from the state FILE a run with --state-out left (the rows before INPUT's)",
     cli_set_string, FIELD(state_in), "--state-in needs a file", 0},
    {"--state-out", NULL, "FILE",
     "with --causal: write the state after INPUT's rows to FILE, for --state-in (may be --state-in's file)",
     cli_set_string, FIELD(state_out), "--state-out needs a file", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_run_command = {
    .name = "run",
    .usage = "usage: aft run [options] INPUT\n"
             "\n"
             "INPUT is a .npy holding X as [B, T, D] or [T, D] ('-' reads it from stdin),\n"
             "or a .safetensors or .npz holding tensors q, k, v (the bare operator, no\n"
             "projections). Formats are told apart by their first bytes.\n",
    .options = options,
    .more = RUNNER_WEIGHTS_MORE,
    .operand = runner_set_input,
};

/* the options, then the usage errors of options that do not go together;
 * 0, -1 after the help, or EXIT_USAGE */
static int parse_args(int argc, char **argv, struct run_opts *o)
{
    runner_defaults(o, "run");
    int rc = cli_parse_options(&cli_run_command, argc, argv, o);
    return rc ? rc : runner_check_options(o);
}

/* ---------------------------------------------------------------- compute */

/* the layer (or the operator) --repeat times into r->y; the times' median
 * and minimum, and the phases of the fastest run */
/* The rows of INPUT as the next chunk of a stream: a state for this layer
 * (or operator), read from --state-in when given, stepped once over them,
 * into r->state for write_result. */
static int compute_stream(const struct run_opts *o, struct run *r)
{
    aft_error err;
    aft_status st = r->bare ? aft_state_new_op(&r->state, &r->p->bias, &r->cfg, r->B, r->C, r->KC, &err)
                            : aft_state_new(&r->state, r->p, &r->cfg, r->B, &err);
    if (st != AFT_OK) {
        cli_error("run", "%s", err.msg);
        return EXIT_DATA;
    }
    if (o->state_in) {
        aft_st_file *f;
        if (aft_st_open_limit(o->state_in, aft_memory_limit(o->max_memory), &f, &err) != AFT_OK) {
            cli_error(NULL, "%s: %s", o->state_in, err.msg);
            return EXIT_DATA;
        }
        st = aft_state_load(r->state, f, &err);
        aft_st_close(f);   /* copied: --state-out may now replace the file */
        if (st != AFT_OK) {
            cli_error(NULL, "%s: %s", o->state_in, err.msg);
            return EXIT_DATA;
        }
    }
    r->t_loaded = aft_now_ms();
    double t0 = aft_now_ms();
    st = r->bare ? aft_state_step_op(r->state, r->y, r->q, r->k, r->v, r->T, &err)
                 : aft_state_step(r->state, r->y, r->x, r->T, &err);
    if (st != AFT_OK) {
        cli_error(NULL, "%s: %s", o->state_in ? o->state_in : o->input, err.msg);
        return EXIT_DATA;
    }
    r->tm.compute_min = r->tm.compute_med = aft_now_ms() - t0;
    return 0;
}

static int compute(const struct run_opts *o, struct run *r)
{
    size_t B = r->B, T = r->T, N = B * T, outw = r->bare ? r->C : r->D;
    r->y = malloc(N * outw * sizeof(float) + 1);
    double *times = malloc(o->repeat * sizeof(double));
    if (!r->y || !times) {
        free(times);
        cli_error("run", "out of memory for the output (%zu x %zu)", N, outw);
        return EXIT_DATA;
    }
    if (o->state_in || o->state_out) {
        free(times);
        return compute_stream(o, r);
    }
    r->t_loaded = aft_now_ms();
    aft_layer_times ph, best_ph = {0, 0, 0};
    double best = -1.0;
    aft_error err;
    const char *name = aft_variant_name(o->cfg.variant);
    cli_progress_start("aft run: %s T=%zu B=%zu", name, T, B);
    cli_progress_steps(o->repeat);
    r->cfg.progress = cli_progress_counter();   /* the library counts the rows done */
    for (size_t i = 0; i < o->repeat; i++) {
        cli_progress_step(i);
        if (o->repeat > 1) cli_progress_label("aft run: %s T=%zu B=%zu, run %zu of %zu", name, T, B, i + 1, o->repeat);
        double t0 = aft_now_ms();
        aft_status st = r->bare ? aft_op_forward(r->y, r->q, r->k, r->v, &r->p->bias, &r->cfg, B, T, r->C, r->KC, &err)
                                : aft_layer_forward_timed(r->y, r->x, r->p, &r->cfg, B, T, &ph, &err);
        times[i] = aft_now_ms() - t0;
        if (!r->bare && (best < 0 || times[i] < best)) {
            best = times[i];
            best_ph = ph;
        }
        if (st != AFT_OK) {
            cli_progress_stop();
            r->cfg.progress = NULL;
            free(times);
            cli_error("run", "%s", err.msg);
            return EXIT_DATA;   /* the options were checked: what is left is the data */
        }
    }
    cli_progress_stop();
    r->cfg.progress = NULL;
    r->tm.layer = !r->bare;
    r->tm.phases = best_ph;
    r->tm.compute_med = cli_median(times, o->repeat);
    r->tm.compute_min = times[0];
    free(times);
    return 0;
}

/* ---------------------------------------------------------------- write */

/* the result as a tensor in the input's layout and rank (y is swapped to
 * tbd in place when asked) */
static int output_tensor(const struct run_opts *o, struct run *r, aft_tensor *yt)
{
    size_t B = r->B, T = r->T, outw = r->bare ? r->C : r->D, n = B * T * outw;
    if (o->tbd && r->in_rank == 3) {
        float *z = cli_swap_tb(r->y, B, T, outw, 1);
        if (!z) {
            cli_error("run", "out of memory");
            return EXIT_DATA;
        }
        free(r->y);
        r->y = z;
    }
    (void)n;
    *yt = runner_shaped(o, r, r->y, outw);
    return 0;
}

/* the result to -o or standard output as .npy, or, when standard output is
 * a terminal and no -o is given, a summary for the reader; and --timing */
static int write_result(const struct run_opts *o, struct run *r)
{
    double t_w0 = aft_now_ms();
    aft_tensor yt;
    if (output_tensor(o, r, &yt) != 0) return EXIT_DATA;
    int show = !o->out_path && isatty(STDOUT_FILENO);
    aft_out yout = {0}, tout = {0};
    aft_error err;
    int rc = EXIT_DATA;
    /* both outputs are opened (as temporaries) before either is written,
     * and renamed into place only when both were written */
    if ((!show && aft_out_open(&yout, o->out_path ? o->out_path : "-", &err) != AFT_OK) ||
        (o->timing_path && aft_out_open(&tout, o->timing_path, &err) != AFT_OK)) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    if (show) {
        if (cli_show_tensor(stdout, &yt) != 0) {
            cli_error("run", "out of memory");
            goto out;
        }
        puts("(not saved: -o FILE or a pipe writes the result as .npy)");
    } else if (aft_npy_write_fp(yout.fp, &yt, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->out_path ? o->out_path : "standard output", err.msg);
        goto out;
    }
    r->tm.load = r->t_loaded - r->t_start;
    r->tm.write = aft_now_ms() - t_w0;
    r->tm.total = aft_now_ms() - r->t_start;
    size_t outw = r->bare ? r->C : r->D;
    if (o->timing_path && runner_write_timing(&tout, o, r, outw) != 0) goto out;
    /* the state goes into place (atomically) once the result is written, before it is */
    if (o->state_out && aft_state_save(r->state, o->state_out, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    /* the messages of commit name the file already */
    if ((!show && aft_out_commit(&yout, &err) != AFT_OK) ||
        (o->timing_path && aft_out_commit(&tout, &err) != AFT_OK)) {
        cli_error(NULL, "%s", err.msg);
        goto out;
    }
    rc = 0;
out:
    if (yout.fp) aft_out_abort(&yout);
    if (tout.fp) aft_out_abort(&tout);
    return rc;
}

/* ---------------------------------------------------------------- the command */

int cmd_run(int argc, char **argv)
{
    struct run_opts o;
    /* under MPI every rank parses the same options: rank 0 alone says
     * what is wrong with them */
    FILE *quiet = cli_shard_launcher() && !cli_shard_rank0() ? fopen("/dev/null", "w") : NULL;
    cli_msg_stream = quiet;
    int rc = parse_args(argc, argv, &o);
    cli_msg_stream = NULL;
    if (quiet) fclose(quiet);
    if (rc > 0 && cli_shard_launcher()) return cli_shard_refused(rc);
    if (rc) return rc < 0 ? cli_finish_stdout("run") : rc;
    /* started by mpirun or srun: the sequence in slices, one a process */
    if (cli_shard_launcher()) return cli_shard_run(&o);

    struct run r;
    if ((rc = runner_begin(&o, &r))) return rc;

    rc = runner_load_input(&o, &r);
    if (!rc) rc = runner_place_grid(&o, &r);
    if (!rc) rc = runner_get_params(&o, &r);
    if (!rc) rc = runner_check_values(&o, &r);
    if (!rc) rc = runner_check_memory(&o, &r);
    if (!rc) rc = runner_load_mask(&o, &r);
    if (!rc) rc = compute(&o, &r);
    if (!rc) rc = write_result(&o, &r);
    runner_free(&r);
    if (rc == 0 && !o.out_path) return cli_finish_stdout("run");
    return rc;
}
