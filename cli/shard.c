/* shard.c - aft run under MPI: `mpirun -np N aft run ...` splits the
 * sequence into N contiguous slices, one a rank, and gives the one-process
 * output in 1/N of the memory per rank. The library knows nothing of MPI:
 * it offers slices (aft_layer_forward_slice, aft_state_seed, key sums),
 * and this file moves what they need between the ranks.
 *
 * Each rank, for its rows [t0, t1) of every sequence:
 *   read      its rows of X from the .npy at their offsets (and its rows of
 *             the mask); every rank maps the weights
 *   exchange  K | V of the rows near its slice that other ranks hold (the
 *             band's halo; every earlier row for full), from whichever
 *             ranks hold them (a halo may reach past a short neighbour)
 *   scan      the key sums of the rows beyond the halo: an MPI_Exscan from
 *             the left (and, without causality, one from the right) of each
 *             rank's sums shifted by the halo, so that rank r receives
 *             exactly the rows [0, t0 - halo); simple without causality:
 *             an MPI_Allreduce of every rank's sums
 *   compute   causal: a state seeded at t0 (aft_state_seed) stepped over
 *             its rows; otherwise aft_layer_forward_slice
 *   write     its rows of Y into one .npy at their offsets (pwrite): rank 0
 *             writes the header into a temporary and, once every rank is
 *             done, renames it into place
 * The ranks agree after each step: a failure on any rank makes every rank
 * stop, the lowest failing rank alone reports (its messages are held until
 * then), rank 0 removes the temporary, and every rank exits with that
 * status. A rank that dies makes mpirun end the others (SIGTERM, which
 * removes rank 0's temporary).
 *
 * Without Open MPI's development files this file builds to a stub that
 * says MPI is not built in. */
#include "shard.h"

#include <stdlib.h>
#include <string.h>

int cli_shard_rank0(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return strcmp(v, "0") == 0;
    }
    return 1;
}

const char *cli_shard_launcher(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return vars[i];
    }
    return NULL;
}

/* a whole number from the environment, 0 when unset or not one */
static long env_count(const char *name)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) return 0;
    long n = strtol(v, &end, 10);
    return *end == '\0' && n > 0 ? n : 0;
}

int cli_shard_check(const char *cmd, int shares)
{
    if (!cli_shard_launcher()) {
        /* srun sets its step's task count in every task; without --mpi=pmix
         * (or a site's MpiDefault) it gives them no PMIx or PMI, and each
         * task would be a whole run of its own, all writing the same files */
        long n = env_count("SLURM_STEP_NUM_TASKS");
        if (n < 2) return 0;
        const char *id = getenv("SLURM_PROCID");
        if (!id || strcmp(id, "0") == 0)
            cli_error(cmd, "srun started %ld tasks with no MPI between them (no PMIx or PMI in their "
                           "environment), and each would run alone and write the same files: use srun --mpi=pmix", n);
        return EXIT_USAGE;
    }
    long n = env_count("OMPI_COMM_WORLD_SIZE");
    if (!n) n = env_count("SLURM_STEP_NUM_TASKS");
    if (shares || n < 2) return 0;
    if (cli_shard_rank0())
        cli_error(cmd, "runs as one process: under mpirun or srun only aft run and aft train share their work "
                       "between ranks (%ld were started)", n);
    return cli_shard_refused(EXIT_USAGE);
}

#ifndef AFT_MPI

int cli_shard_built_in(void)
{
    return 0;
}

int cli_shard_run(const struct run_opts *o)
{
    (void)o;
    if (cli_shard_rank0())
        return cli_usage_error("run", "started by an MPI launcher (%s is set), but this aft was built without MPI: "
                               "install Open MPI's development files (libopenmpi-dev) and rebuild",
                               cli_shard_launcher());
    return EXIT_USAGE;
}

int cli_shard_refused(int rc)
{
    return rc;
}

#else

#include <mpi.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_shard_built_in(void)
{
    return 1;
}

/* what a rank knows of the run and of itself */
typedef struct {
    int rank, size;
    MPI_Comm comm;          /* the ranks in order */
    MPI_Comm rev;           /* the same ranks in reverse order (the scan from the right) */
    MPI_Datatype sums_t;    /* one sequence's key sums: 4C floats */
    MPI_Op merge_op;        /* aft_key_sums_merge, in rank order */
    size_t C;               /* channels of the sums the op merges */
    char *held;             /* this rank's messages, held (open_memstream) */
    size_t held_len;
    FILE *held_fp;
    double t_read, t_compute, t_comm, t_write;
    double sent;            /* bytes this rank sent (exchanges and collectives) */
} shard;

static shard *the_shard;   /* for the reduction's callback: the channels */

/* ---------------------------------------------------------------- agreeing */

/* After a step: every rank's status in, the lowest failing rank's out (0
 * when none failed). That rank prints the messages it held; the others
 * drop theirs. */
static int agree(shard *sh, int rc)
{
    double t = aft_now_ms();
    int in[2] = {rc ? sh->rank : sh->size, rc}, out[2];
    MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MINLOC, sh->comm);
    sh->t_comm += aft_now_ms() - t;
    if (out[0] == sh->size) return 0;
    fflush(sh->held_fp);
    if (out[0] == sh->rank && sh->held_len) fwrite(sh->held, 1, sh->held_len, stderr);
    fflush(stderr);
    fseeko(sh->held_fp, 0, SEEK_SET);   /* said once, or not at all */
    fflush(sh->held_fp);
    return out[1];
}

/* the lowest failing rank's status, after its message is out: every rank
 * waits for it, so no rank exits (which makes mpirun end the others)
 * before the message is written */
static int agree_final(shard *sh, int rc)
{
    rc = agree(sh, rc);
    MPI_Barrier(sh->comm);
    return rc;
}

/* ---------------------------------------------------------------- the slices */

/* rank q's rows: [q T / N, (q + 1) T / N) */
static size_t slice_at(size_t q, size_t N, size_t T)
{
    return (size_t)((unsigned __int128)q * T / N);
}

/* the key sums' reduction: inout = in, then inout (in holds the lower
 * ranks' rows) */
static void merge_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    size_t C = the_shard->C, n = 4 * C;
    float *tmp = malloc(n * sizeof *tmp);
    if (!tmp) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < *len; i++) {
        float *a = (float *)in + (size_t)i * n, *b = (float *)inout + (size_t)i * n;
        memcpy(tmp, a, n * sizeof *tmp);
        aft_key_sums_merge(tmp, b, C);
        memcpy(b, tmp, n * sizeof *tmp);
    }
    free(tmp);
}

/* the reversed scan's reduction: in holds the higher ranks' rows, which
 * come after */
static void merge_rev_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    size_t n = 4 * the_shard->C;
    for (int i = 0; i < *len; i++)
        aft_key_sums_merge((float *)inout + (size_t)i * n, (const float *)in + (size_t)i * n, the_shard->C);
}

/* sums (B, 4C): out = the sums of the lower ranks' (Exscan; rank 0: none),
 * from the right with rev; all: every rank's (Allreduce) */
static void scan_sums(shard *sh, const float *mine, float *out, size_t B, int rev, int all)
{
    double t = aft_now_ms();
    MPI_Op op;
    MPI_Op_create(rev ? merge_rev_fn : merge_fn, 0, &op);
    MPI_Comm c = rev ? sh->rev : sh->comm;
    int r;
    MPI_Comm_rank(c, &r);
    if (all) MPI_Allreduce(mine, out, (int)B, sh->sums_t, op, c);
    else MPI_Exscan(mine, out, (int)B, sh->sums_t, op, c);
    if (!all && r == 0)
        for (size_t b = 0; b < B; b++) aft_key_sums_empty(out + b * 4 * sh->C, sh->C);
    MPI_Op_free(&op);
    sh->sent += (double)(B * 4 * sh->C * sizeof(float));
    sh->t_comm += aft_now_ms() - t;
}

/* per-sequence flags: out = the max over the lower ranks (Exscan), or over
 * every rank */
static void scan_flags(shard *sh, const int *mine, int *out, size_t B, int all)
{
    double t = aft_now_ms();
    if (all) MPI_Allreduce(mine, out, (int)B, MPI_INT, MPI_MAX, sh->comm);
    else MPI_Exscan(mine, out, (int)B, MPI_INT, MPI_MAX, sh->comm);
    if (!all && sh->rank == 0) memset(out, 0, B * sizeof *out);
    sh->t_comm += aft_now_ms() - t;
}

/* ---------------------------------------------------------------- the run's plan */

typedef struct {
    size_t B, T, D, C, N;
    size_t t0, t1, n;         /* this rank's rows */
    int tbd, rank2;           /* the input's layout, and [T, D] */
    int causal;
    int stream;               /* causal without a mask: a seeded state */
    size_t halo;              /* rows of K | V either side (SIZE_MAX: every row) */
    size_t lo, hi;            /* the rows of K | V this rank holds */
    float *x, *y, *kv;        /* (B, n, D), (B, n, D), (B, hi - lo, 2C) */
    uint8_t *mask;            /* (n, T) or (B, n, T) */
} plan;

/* the rows of K | V rank q needs: [lo, hi) (empty for an empty slice) */
static void need_of(const plan *pl, size_t q, size_t *lo, size_t *hi)
{
    size_t t0 = slice_at(q, pl->N, pl->T), t1 = slice_at(q + 1, pl->N, pl->T), h = pl->halo;
    if (t0 == t1 || (!pl->stream && h == 0)) {
        *lo = *hi = t0;
        return;
    }
    *lo = h == SIZE_MAX || t0 < h ? 0 : t0 - h;
    if (pl->stream) *hi = t0;   /* the rows before: the state's own are stepped */
    else if (h == SIZE_MAX) *hi = pl->causal ? t1 : pl->T;   /* full, a mask: every row a row may see */
    else *hi = pl->T - t1 < h ? pl->T : t1 + h;
}

/* ---------------------------------------------------------------- read */

/* the options this form runs; a usage error otherwise */
static int check_options(const struct run_opts *o)
{
    if (strcmp(o->input, "-") == 0)
        return cli_usage_error("run", "under MPI each rank reads its rows of INPUT at their offsets: INPUT must be "
                               "a file, not standard input");
    if (!o->out_path || strcmp(o->out_path, "-") == 0)
        return cli_usage_error("run", "under MPI each rank writes its rows into one file: give -o FILE");
    if (o->state_in || o->state_out)
        return cli_usage_error("run", "under MPI --state-in and --state-out are not supported: each rank's state "
                               "is seeded from the ranks before it");
    if (o->grid_h) return cli_usage_error("run", "under MPI the sequence is split by rows: --grid is not supported");
    if (o->cfg.impl == AFT_IMPL_REFERENCE)
        return cli_usage_error("run", "under MPI the fast kernels run: --impl reference is not supported");
    if (o->repeat > 1) return cli_usage_error("run", "under MPI --repeat is not supported");
    return 0;
}

/* INPUT's header: a .npy of [B, T, D] or [T, D] (or [T, B, D]) floats */
static int read_header(const struct run_opts *o, plan *pl)
{
    aft_format fmt;
    if (cli_file_format(NULL, o->input, &fmt) != 0) return EXIT_DATA;
    if (fmt != AFT_FORMAT_NPY) {
        cli_error(NULL, "%s: under MPI INPUT must be a .npy of X (a %s of q, k, v runs in one process)", o->input,
                  aft_format_name(fmt));
        return EXIT_DATA;
    }
    aft_tensor h;
    aft_npy_info info;
    aft_error err;
    if (aft_npy_peek_header(o->input, &h, &info, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->input, err.msg);
        return EXIT_DATA;
    }
    if (!aft_dtype_is_float(h.dtype)) {
        cli_error(NULL, "%s: the input has dtype %s; expected floating point", o->input, aft_dtype_name(h.dtype));
        return EXIT_DATA;
    }
    if (h.ndim == 4) {
        cli_error(NULL, "%s: the input is a grid [B, H, W, D]; under MPI the sequence is split by rows, which a "
                  "grid is not", o->input);
        return EXIT_DATA;
    }
    if (h.ndim < 2 || h.ndim > 3) {
        cli_error(NULL, "%s: the input must be [B, T, D] or [T, D]; it has %zu %s", o->input, h.ndim,
                  cli_noun(h.ndim, "dimension", "dimensions"));
        return EXIT_DATA;
    }
    if (info.fortran_order && h.nelem > 0) {
        cli_error(NULL, "%s: the input is stored in Fortran order; under MPI each rank reads its rows, which must "
                  "be contiguous (C order)", o->input);
        return EXIT_DATA;
    }
    pl->rank2 = h.ndim == 2;
    pl->tbd = o->tbd && h.ndim == 3;
    pl->B = h.ndim == 2 ? 1 : pl->tbd ? h.shape[1] : h.shape[0];
    pl->T = h.ndim == 2 ? h.shape[0] : pl->tbd ? h.shape[0] : h.shape[1];
    pl->D = h.shape[h.ndim - 1];
    if (pl->B * pl->T * pl->D > (size_t)INT32_MAX * 64) {
        cli_error(NULL, "%s: the input is too large", o->input);
        return EXIT_DATA;
    }
    return 0;
}

/* this rank's rows of X, (B, n, D) */
static int read_rows(const struct run_opts *o, plan *pl)
{
    size_t B = pl->B, T = pl->T, D = pl->D, n = pl->n;
    pl->x = malloc(B * n * D * sizeof(float) + 1);
    if (!pl->x) {
        cli_error("run", "out of memory for %zu rows of X", B * n);
        return EXIT_DATA;
    }
    aft_error err;
    aft_status st = AFT_OK;
    if (pl->tbd) {   /* [T, B, D]: the rows are one range; to (B, n, D) */
        float *tmp = malloc(B * n * D * sizeof(float) + 1);
        if (!tmp) {
            cli_error("run", "out of memory for %zu rows of X", B * n);
            return EXIT_DATA;
        }
        st = aft_npy_read_f32(o->input, pl->t0 * B * D, n * B * D, tmp, &err);
        for (size_t t = 0; t < n && !st; t++)
            for (size_t b = 0; b < B; b++) memcpy(pl->x + (b * n + t) * D, tmp + (t * B + b) * D, D * sizeof(float));
        free(tmp);
    } else {
        for (size_t b = 0; b < B && !st; b++)
            st = aft_npy_read_f32(o->input, (b * T + pl->t0) * D, n * D, pl->x + b * n * D, &err);
    }
    if (st) {
        cli_error(NULL, "%s: rows %zu to %zu: %s", o->input, pl->t0, pl->t1 ? pl->t1 - 1 : 0, err.msg);
        return EXIT_DATA;
    }
    return 0;
}

/* --mask: this rank's rows of [T, T] or [B, T, T] of 0 and 1 */
static int read_mask(const struct run_opts *o, plan *pl, struct run *r)
{
    if (!o->mask_path) return 0;
    size_t B = pl->B, T = pl->T, n = pl->n;
    aft_tensor mt;
    aft_error err;
    if (aft_npy_peek_header(o->mask_path, &mt, NULL, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", o->mask_path, err.msg);
        return EXIT_DATA;
    }
    int batched = mt.ndim == 3;
    if (!((mt.ndim == 2 && mt.shape[0] == T && mt.shape[1] == T) ||
          (batched && mt.shape[0] == B && mt.shape[1] == T && mt.shape[2] == T))) {
        cli_error(NULL, "%s: mask must be [T, T] = [%zu, %zu] or [B, T, T] = [%zu, %zu, %zu]", o->mask_path, T, T, B,
                  T, T);
        return EXIT_DATA;
    }
    if (aft_dtype_is_float(mt.dtype) && mt.dtype != AFT_F32 && mt.dtype != AFT_F64) {
        cli_error(NULL, "%s: mask has dtype %s; expected bool or 0/1 integers", o->mask_path, aft_dtype_name(mt.dtype));
        return EXIT_DATA;
    }
    size_t nb = batched ? B : 1;
    float *row = malloc(T * sizeof(float) + 1);
    pl->mask = malloc(nb * n * T + 1);
    if (!row || !pl->mask) {
        free(row);
        cli_error("run", "out of memory for the mask's rows");
        return EXIT_DATA;
    }
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < n; t++) {   /* a row at a time: its floats and its bytes */
            size_t at = (b * T + pl->t0 + t) * T;
            if (aft_npy_read_f32(o->mask_path, at, T, row, &err) != AFT_OK) {
                free(row);
                cli_error(NULL, "%s: %s", o->mask_path, err.msg);
                return EXIT_DATA;
            }
            for (size_t j = 0; j < T; j++) {
                if (row[j] != 0.0f && row[j] != 1.0f) {
                    free(row);
                    cli_error(NULL, "%s: mask entry %zu is %g; entries must be 0 or 1", o->mask_path, at + j,
                              (double)row[j]);
                    return EXIT_DATA;
                }
                pl->mask[(b * n + t) * T + j] = row[j] != 0.0f;
            }
        }
    free(row);
    r->p->bias.mask = pl->mask;
    r->p->bias.mask_batched = batched;
    return 0;
}

/* tensors under --prefix that are none of the layer's, and non-finite
 * values: counted by every rank over its rows, the weights by rank 0; a
 * warning from rank 0, or with --strict an error */
static int check_values(shard *sh, const struct run_opts *o, const plan *pl, const struct run *r)
{
    unsigned long long mine = aft_count_nonfinite(pl->x, pl->B * pl->n * pl->D), all = 0, bad_w = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, sh->comm);
    /* tensors under --prefix that are none of the layer's: the same on
     * every rank, so rank 0 speaks for all (every rank has made the
     * collective call above before any returns) */
    char what[256];
    if (runner_unexpected(o, r, what, sizeof what)) {
        if (o->strict) {
            if (sh->rank != 0) return 0;
            cli_error(NULL, "%s: %s; --strict refuses %s", o->weights_path, what,
                      r->wts.n_unexpected > 1 ? "them" : "it");
            return EXIT_DATA;
        }
        if (sh->rank == 0) fprintf(stderr, "aft run: warning: %s: %s\n", o->weights_path, what);
    }
    if (o->weights_path) bad_w = runner_nonfinite_params(r);
    const char *where = all ? o->input : o->weights_path;
    unsigned long long nbad = all ? all : bad_w;
    if (nbad && o->strict) {
        if (sh->rank == 0) {
            cli_error(NULL, "%s: %llu non-finite %s (NaN or inf); --strict refuses %s", where, nbad,
                      cli_noun(nbad, "value", "values"), cli_noun(nbad, "it", "them"));
            return EXIT_DATA;
        }
        return 0;
    }
    if (nbad && sh->rank == 0)
        fprintf(stderr, "aft run: warning: %s holds %llu non-finite %s (NaN or inf); outputs %s will be NaN\n", where,
                nbad, cli_noun(nbad, "value", "values"), cli_noun(nbad, "it reaches", "they reach"));
    return 0;
}

/* ---------------------------------------------------------------- exchange */

/* K | V of rows [a, b) of this rank's (B sequences) into dst (B, b - a, 2C) */
static int own_kv(const plan *pl, const struct run *r, size_t a, size_t b, float *dst, size_t ld_rows)
{
    aft_error err;
    for (size_t q = 0; q < pl->B; q++) {
        if (aft_layer_kv(dst + q * ld_rows * 2 * pl->C, pl->x + (q * pl->n + a - pl->t0) * pl->D, r->p, &r->cfg, 1,
                         b - a, &err) != AFT_OK) {
            cli_error("run", "%s", err.msg);
            return EXIT_DATA;
        }
    }
    return 0;
}

/* Rows every rank needs of the others' K | V, sent by the ranks that hold
 * them: rank r's need is [lo, hi) of need_of, less its own rows. src holds
 * rows [s0, s0 + ns) of this rank's (B, ns, 2C); dst rows [lo, hi) of
 * this rank's need (B, hi - lo, 2C). */
static int exchange(shard *sh, const plan *pl, const float *src, size_t s0, size_t ns, float *dst)
{
    const size_t B = pl->B, W = 2 * pl->C, N = pl->N;
    double t = aft_now_ms();
    size_t nmsg = 0;
    MPI_Request *req = malloc(2 * N * sizeof *req);
    float **bufs = calloc(2 * N, sizeof *bufs);
    size_t *rlo = calloc(N, sizeof *rlo), *rhi = calloc(N, sizeof *rhi);
    int rc = req && bufs && rlo && rhi ? 0 : EXIT_DATA;
    size_t mlo, mhi;
    need_of(pl, (size_t)sh->rank, &mlo, &mhi);
    for (size_t q = 0; q < N && !rc; q++) {
        if (q == (size_t)sh->rank) continue;
        size_t q0 = slice_at(q, N, pl->T), q1 = slice_at(q + 1, N, pl->T), lo, hi;
        /* what q holds of my need */
        size_t a = mlo > q0 ? mlo : q0, b = mhi < q1 ? mhi : q1;
        if (a < b) {
            rlo[q] = a;
            rhi[q] = b;
            if (!(bufs[2 * q] = malloc(B * (b - a) * W * sizeof(float)))) rc = EXIT_DATA;
            else MPI_Irecv(bufs[2 * q], (int)(B * (b - a) * W), MPI_FLOAT, (int)q, 7, sh->comm, &req[nmsg++]);
        }
        /* what I hold of q's need */
        need_of(pl, q, &lo, &hi);
        a = lo > pl->t0 ? lo : pl->t0;
        b = hi < pl->t1 ? hi : pl->t1;
        if (a < b && !rc) {
            float *sb = bufs[2 * q + 1] = malloc(B * (b - a) * W * sizeof(float));
            if (!sb) {
                rc = EXIT_DATA;
                break;
            }
            for (size_t k = 0; k < B; k++)
                memcpy(sb + k * (b - a) * W, src + (k * ns + a - s0) * W, (b - a) * W * sizeof(float));
            MPI_Isend(sb, (int)(B * (b - a) * W), MPI_FLOAT, (int)q, 7, sh->comm, &req[nmsg++]);
            sh->sent += (double)(B * (b - a) * W * sizeof(float));
        }
    }
    if (req) MPI_Waitall((int)nmsg, req, MPI_STATUSES_IGNORE);
    for (size_t q = 0; q < N && !rc; q++)
        if (rhi[q] > rlo[q])
            for (size_t k = 0; k < B; k++)
                memcpy(dst + (k * (mhi - mlo) + rlo[q] - mlo) * W, bufs[2 * q] + k * (rhi[q] - rlo[q]) * W,
                       (rhi[q] - rlo[q]) * W * sizeof(float));
    for (size_t i = 0; bufs && i < 2 * N; i++) free(bufs[i]);
    free(bufs); free(req); free(rlo); free(rhi);
    if (rc) cli_error("run", "out of memory for the rows exchanged");
    sh->t_comm += aft_now_ms() - t;
    return rc;
}

/* ---------------------------------------------------------------- compute */

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* causal without a mask: a state at t0 seeded with the sums of the rows
 * before its kept ones and those rows (K | V from the ranks before),
 * stepped over this rank's rows */
static int compute_stream(shard *sh, plan *pl, struct run *r, aft_state *state)
{
    const size_t B = pl->B, C = pl->C, keep = aft_state_keep(state), t0 = pl->t0, t1 = pl->t1;
    aft_error err;
    double t = aft_now_ms();
    /* my rows others keep: the last `keep` (every row for full) */
    size_t s0 = keep == SIZE_MAX || t1 - t0 < keep ? t0 : t1 - keep, ns = t1 - s0;
    size_t kept = pl->hi - pl->lo;
    float *mine = malloc(B * ns * 2 * C * sizeof(float) + 1), *halo = malloc(B * kept * 2 * C * sizeof(float) + 1);
    float *g = malloc(B * 12 * C * sizeof(float) + 1);
    int rc = 0, bad = 0, bad_before = 0, nf = 0;
    if (!mine || !halo || !g) {
        cli_error("run", "out of memory for K, V of %zu rows", B * (ns + kept));
        rc = EXIT_DATA;
    }
    if (!rc) rc = own_kv(pl, r, s0, t1, mine, ns);
    sh->t_compute += aft_now_ms() - t;
    if ((rc = agree(sh, rc))) goto out;
    if ((rc = exchange(sh, pl, mine, s0, ns, halo))) goto out;
    t = aft_now_ms();
    /* the sums of my rows shifted back by `keep`, [t0 - keep, t1 - keep):
     * the halo's part, then my own rows' part; whether a key of my rows is
     * +inf or NaN (the kernel checks the kept rows it reads itself) */
    float *own = g + B * 4 * C, *left = g + B * 8 * C;
    if (keep != SIZE_MAX) {
        size_t a = t0 < keep ? 0 : t0 - keep, b = t1 < keep ? 0 : t1 - keep, hb = b < t0 ? b : t0;
        if (aft_kv_sums(g, &nf, halo, B, kept, C, a - pl->lo, hb - pl->lo, &err) != AFT_OK ||
            aft_layer_key_sums(own, &nf, pl->x, r->p, &r->cfg, B, pl->n, 0, b > t0 ? b - t0 : 0, &err) != AFT_OK) {
            cli_error("run", "%s", err.msg);
            rc = EXIT_DATA;
        }
        bad |= nf;
        for (size_t q = 0; q < B && !rc; q++) aft_key_sums_merge(g + q * 4 * C, own + q * 4 * C, C);
    }
    if (!rc && aft_kv_sums(own, &nf, mine, B, ns, C, 0, ns, &err) != AFT_OK) {
        cli_error("run", "%s", err.msg);
        rc = EXIT_DATA;
    }
    bad |= nf;
    sh->t_compute += aft_now_ms() - t;
    if ((rc = agree(sh, rc))) goto out;
    /* the sums of rows [0, lo), and whether a key before t0 was bad */
    if (keep != SIZE_MAX) scan_sums(sh, g, left, B, 0, 0);
    scan_flags(sh, &bad, &bad_before, 1, 0);
    t = aft_now_ms();
    aft_status st = aft_state_seed(state, t0, keep != SIZE_MAX && pl->lo > 0 ? left : NULL, halo, bad_before, &err);
    if (!st && pl->n) st = aft_state_step(state, pl->y, pl->x, pl->n, &err);
    if (st) {
        cli_error("run", "%s", err.msg);
        rc = EXIT_DATA;
    }
    sh->t_compute += aft_now_ms() - t;
out:
    free(mine); free(halo); free(g);
    return rc;
}

/* without causality, or under a mask: K | V of this rank's rows and of the
 * rows near them, the key sums of the rows beyond (scans from both ends),
 * or of every row (simple); then the slice */
static int compute_slice(shard *sh, plan *pl, struct run *r)
{
    const size_t B = pl->B, C = pl->C, T = pl->T, t0 = pl->t0, t1 = pl->t1, h = pl->halo;
    const size_t held = pl->hi - pl->lo;
    aft_error err;
    double t = aft_now_ms();
    int rc = 0, global = h == 0, dense = h == SIZE_MAX;
    pl->kv = malloc(B * held * 2 * C * sizeof(float) + 1);
    float *g = malloc(B * 16 * C * sizeof(float) + 1);
    int *bad = calloc(2 * B, sizeof *bad);
    if (!pl->kv || !g || !bad) {
        cli_error("run", "out of memory for K, V of %zu rows", B * held);
        rc = EXIT_DATA;
    }
    /* my own rows' K | V, in place among the rows held */
    if (!rc && !global && pl->n) rc = own_kv(pl, r, t0, t1, pl->kv + (t0 - pl->lo) * 2 * C, held);
    sh->t_compute += aft_now_ms() - t;
    if ((rc = agree(sh, rc))) goto out;
    if (!global && (rc = exchange(sh, pl, pl->kv, pl->lo, held, pl->kv))) goto out;
    t = aft_now_ms();
    float *gl = g, *gr = g + B * 4 * C, *left = g + B * 8 * C, *right = g + B * 12 * C;
    int nf = 0;
    if (global) {   /* my rows' sums, for the sum over every rank's */
        if (aft_layer_key_sums(gl, &nf, pl->x, r->p, &r->cfg, B, pl->n, 0, pl->n, &err) != AFT_OK) rc = EXIT_DATA;
    } else if (!dense) {
        /* my rows shifted by the halo, to the left and to the right, both
         * within the rows held */
        size_t a = t0 < h ? 0 : t0 - h, b = t1 < h ? 0 : t1 - h;
        size_t c = T - t0 < h ? T : t0 + h, d = T - t1 < h ? T : t1 + h;
        if (t0 == t1) a = b = c = d = pl->lo;
        int nf2 = 0;
        if (aft_kv_sums(gl, &nf, pl->kv, B, held, C, a - pl->lo, b - pl->lo, &err) != AFT_OK ||
            aft_kv_sums(gr, &nf2, pl->kv, B, held, C, c - pl->lo, d - pl->lo, &err) != AFT_OK)
            rc = EXIT_DATA;
        nf |= nf2;
        /* my own rows, each in one of the two ranges or the other's */
        if (!rc && aft_kv_sums(left, &nf2, pl->kv, B, held, C, t0 - pl->lo, t1 - pl->lo, &err) != AFT_OK)
            rc = EXIT_DATA;
        nf |= nf2;
    }
    if (rc) cli_error("run", "%s", err.msg);
    for (size_t q = 0; q < B; q++) bad[q] = nf;
    sh->t_compute += aft_now_ms() - t;
    if ((rc = agree(sh, rc))) goto out;
    if (global) {
        scan_sums(sh, gl, left, B, 0, 1);
    } else if (!dense) {
        scan_sums(sh, gl, left, B, 0, 0);
        scan_sums(sh, gr, right, B, 1, 0);
    }
    if (!dense) scan_flags(sh, bad, bad + B, B, 1);
    t = aft_now_ms();
    size_t a0 = global ? t0 : pl->lo, a1 = global ? t0 : pl->hi;
    const float *lp = global || (!dense && a0 > 0) ? left : NULL;
    const float *rp = !global && !dense && !r->cfg.causal && a1 < T ? right : NULL;
    if (aft_layer_forward_slice(pl->y, pl->x, global ? NULL : pl->kv, lp, rp, r->p, &r->cfg, B, T, t0, t1, a0, a1,
                                &err) != AFT_OK) {
        cli_error("run", "%s", err.msg);
        rc = EXIT_DATA;
    }
    /* a key of +inf or NaN anywhere reaches every row of its sequence */
    for (size_t q = 0; q < B && !rc && !dense; q++)
        if (bad[B + q]) fill_nan(pl->y + q * pl->n * pl->D, pl->n * pl->D);
    sh->t_compute += aft_now_ms() - t;
out:
    free(g); free(bad);
    return rc;
}

/* ---------------------------------------------------------------- write */

/* pwrite of all n bytes at off */
static int write_at(int fd, const void *p, size_t n, off_t off)
{
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* the output's .npy header (hdr, cap bytes; its length hlen) for the whole
 * array, [B, T, D] ([T, B, D] with tbd) or [T, D], and its data's bytes */
static int rows_header(const plan *pl, char *hdr, size_t cap, size_t *hlen, size_t *nbytes)
{
    const size_t B = pl->B, T = pl->T, D = pl->D;
    aft_error err;
    aft_tensor yt = cli_output_shaped(NULL, pl->rank2 ? 2 : 3, pl->tbd, B, T, 0, 0, D);
    *nbytes = yt.nbytes;
    if (aft_npy_header(&yt, hdr, cap, hlen, &err) != AFT_OK) {
        cli_error("run", "%s", err.msg);
        return EXIT_DATA;
    }
    return 0;
}

/* rank 0: the temporary beside -o's file (yout), its header (hdr, hlen
 * bytes) and its size; *tmp its name */
static int open_temporary(const struct run_opts *o, aft_out *yout, const char *hdr, size_t hlen, size_t nbytes,
                          char **tmp)
{
    aft_error err;
    if (aft_out_open(yout, o->out_path, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        return EXIT_DATA;
    }
    if (yout->direct || !yout->tmp) {
        cli_error(NULL, "%s: under MPI the output must be a regular file", o->out_path);
        return EXIT_DATA;
    }
    if (fwrite(hdr, 1, hlen, yout->fp) != hlen || fflush(yout->fp) != 0 ||
        ftruncate(fileno(yout->fp), (off_t)(hlen + nbytes)) != 0) {
        cli_error(NULL, "%s: %s", o->out_path, strerror(errno));
        return EXIT_DATA;
    }
    *tmp = yout->tmp;
    return 0;
}

/* rank 0's temporary's name (tmp there) on every rank: rank 0's own, a
 * copy elsewhere */
static char *share_name(shard *sh, char *tmp)
{
    double tc = aft_now_ms();
    long tmplen = sh->rank == 0 ? (long)strlen(tmp) + 1 : 0;
    MPI_Bcast(&tmplen, 1, MPI_LONG, 0, sh->comm);
    char *name = sh->rank == 0 ? tmp : malloc((size_t)tmplen);
    if (!name) MPI_Abort(MPI_COMM_WORLD, EXIT_DATA);
    MPI_Bcast(name, (int)tmplen, MPI_CHAR, 0, sh->comm);
    sh->t_comm += aft_now_ms() - tc;
    return name;
}

/* this rank's rows of Y into fd at their offsets, after the header's hlen
 * bytes */
static int put_rows(int fd, const struct run_opts *o, const plan *pl, size_t hlen)
{
    const size_t B = pl->B, T = pl->T, D = pl->D, n = pl->n;
    int rc = 0;
    float *rows = NULL;
    if (pl->tbd && n) {   /* (B, n, D) to [n, B, D]: one range */
        rows = malloc(B * n * D * sizeof(float));
        if (!rows) {
            cli_error("run", "out of memory writing %zu rows", n * B);
            rc = EXIT_DATA;
        } else {
            for (size_t i = 0; i < n; i++)
                for (size_t b = 0; b < B; b++) memcpy(rows + (i * B + b) * D, pl->y + (b * n + i) * D, D * sizeof(float));
            if (write_at(fd, rows, B * n * D * sizeof(float), (off_t)(hlen + pl->t0 * B * D * sizeof(float))) != 0)
                rc = EXIT_DATA;
        }
    } else {
        for (size_t b = 0; b < B && !rc && n; b++)
            if (write_at(fd, pl->y + b * n * D, n * D * sizeof(float),
                         (off_t)(hlen + (b * T + pl->t0) * D * sizeof(float))) != 0)
                rc = EXIT_DATA;
    }
    if (rc) cli_error(NULL, "%s: writing rows %zu to %zu: %s", o->out_path, pl->t0, pl->t1, strerror(errno));
    free(rows);
    return rc;
}

/* a rank but 0: its rows on the disk and fd closed (rc: how it went so
 * far) */
static int close_rows(int fd, const char *out_path, int rc)
{
    if (fd >= 0 && (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) && !rc) {
        cli_error(NULL, "%s: %s", out_path, strerror(errno));
        rc = EXIT_DATA;
    }
    if (fd >= 0 && close(fd) != 0 && !rc) {
        cli_error(NULL, "%s: %s", out_path, strerror(errno));
        rc = EXIT_DATA;
    }
    return rc;
}

/* The output: rank 0 opens the temporary beside -o's file and writes the
 * header (and sets the file's size); every rank then writes its rows at
 * their offsets. *yout: rank 0's temporary, committed by the caller. */
static int write_rows(shard *sh, const struct run_opts *o, const plan *pl, aft_out *yout)
{
    double t = aft_now_ms();
    char hdr[4096];
    size_t hlen = 0, nbytes = 0;
    int rc = rows_header(pl, hdr, sizeof hdr, &hlen, &nbytes);
    char *tmp = NULL;
    if (!rc && sh->rank == 0) rc = open_temporary(o, yout, hdr, hlen, nbytes, &tmp);
    sh->t_write += aft_now_ms() - t;
    if ((rc = agree(sh, rc))) return rc;
    char *name = share_name(sh, tmp);
    t = aft_now_ms();
    int fd = sh->rank == 0 ? fileno(yout->fp) : open(name, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        cli_error(NULL, "%s: cannot open the output's temporary %s: %s", o->out_path, name, strerror(errno));
        rc = EXIT_DATA;
    }
    if (!rc) rc = put_rows(fd, o, pl, hlen);
    if (sh->rank != 0) {
        rc = close_rows(fd, o->out_path, rc);
        free(name);
    }
    sh->t_write += aft_now_ms() - t;
    return agree(sh, rc);
}

/* ---------------------------------------------------------------- timing */

enum { NPHASE = 8 };

/* every rank's phases to rank 0, and there --timing's JSON */
static int write_timing(shard *sh, const struct run_opts *o, const plan *pl, const struct run *r, double t_start,
                        aft_out *tout)
{
    double mine[NPHASE] = {sh->t_read, sh->t_compute, sh->t_comm, sh->t_write, (double)aft_peak_rss(), sh->sent,
                           (double)pl->t0, (double)pl->t1};
    double *all = sh->rank == 0 ? malloc((size_t)sh->size * NPHASE * sizeof(double)) : NULL;
    if (sh->rank == 0 && !all) MPI_Abort(MPI_COMM_WORLD, EXIT_DATA);
    MPI_Gather(mine, NPHASE, MPI_DOUBLE, all, NPHASE, MPI_DOUBLE, 0, sh->comm);
    if (sh->rank != 0 || !o->timing_path) {
        free(all);
        return 0;
    }
    struct timing tm = {0};
    for (int q = 0; q < sh->size; q++) {
        const double *a = all + (size_t)q * NPHASE;
        tm.load = fmax(tm.load, a[0]);
        tm.compute_med = fmax(tm.compute_med, a[1]);
        tm.write = fmax(tm.write, a[3]);
    }
    tm.compute_min = tm.compute_med;
    tm.total = aft_now_ms() - t_start;
    aft_dtype wdt = r->p && !r->bare ? r->p->w_dtype : AFT_F32;
    cJSON *j = runner_timing_json(o, &r->cfg, wdt, pl->B, pl->T, pl->D, r->C, &tm);
    cJSON *m = cJSON_AddObjectToObject(j, "mpi");
    cJSON_AddNumberToObject(m, "ranks", sh->size);
    cJSON_AddStringToObject(m, "path", pl->stream ? "state" : pl->halo == SIZE_MAX ? "dense" : pl->halo == 0 ? "sums"
                                                                                                            : "band");
    cJSON_AddNumberToObject(m, "halo_rows", pl->halo == SIZE_MAX ? -1.0 : (double)pl->halo);
    cJSON *arr = cJSON_AddArrayToObject(m, "per_rank");
    static const char *const names[NPHASE] = {"load_ms", "compute_ms", "communicate_ms", "write_ms",
                                              "peak_rss_bytes", "sent_bytes", "row_start", "row_end"};
    for (int q = 0; q < sh->size; q++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", q);
        for (int k = 0; k < NPHASE; k++) cJSON_AddNumberToObject(e, names[k], all[(size_t)q * NPHASE + k]);
        cJSON_AddItemToArray(arr, e);
    }
    free(all);
    return cli_write_json(tout, "run", j);
}

/* ---------------------------------------------------------------- the command */

/* the parameters (every rank maps the weights, or makes the seeded ones),
 * this rank's rows of X and its rows of the mask */
static int read_inputs(shard *sh, const struct run_opts *o, plan *pl, struct run *r)
{
    r->B = pl->B;
    r->T = pl->T;
    r->D = pl->D;
    r->in_rank = pl->rank2 ? 2 : 3;
    r->cfg = o->cfg;
    cli_kernels_from_env(&r->cfg);
    double t = aft_now_ms();
    int rc = runner_get_params(o, r);
    if (!rc) rc = read_rows(o, pl);
    if (!rc) rc = read_mask(o, pl, r);
    sh->t_read += aft_now_ms() - t;
    return rc;
}

/* the path (the streaming state under causality without a mask, else a
 * slice with its halo), Y's rows, the state, and the key sums' type */
static int choose_path(shard *sh, const struct run_opts *o, plan *pl, const struct run *r, aft_state **state)
{
    aft_error err;
    int rc = 0;
    pl->C = r->C;
    sh->C = r->C;
    MPI_Type_contiguous((int)(4 * r->C), MPI_FLOAT, &sh->sums_t);
    MPI_Type_commit(&sh->sums_t);
    /* the path, and the rows of K | V it needs */
    pl->causal = r->cfg.causal;
    pl->stream = r->cfg.causal && !o->mask_path;
    pl->y = malloc(pl->B * pl->n * pl->D * sizeof(float) + 1);
    if (!pl->y) {
        cli_error("run", "out of memory for %zu rows of Y", pl->B * pl->n);
        rc = EXIT_DATA;
    } else if (pl->stream) {
        if (aft_state_new(state, r->p, &r->cfg, pl->B, &err) != AFT_OK) rc = EXIT_DATA;
        else pl->halo = aft_state_keep(*state);
    } else if (aft_layer_slice_halo(r->p, &r->cfg, pl->T, &pl->halo, &err) != AFT_OK) {
        rc = EXIT_DATA;
    }
    if (rc && pl->y) cli_error("run", "%s", err.msg);
    return rc;
}

/* --timing (rank 0, a temporary too), then the output into place */
static int finish_outputs(shard *sh, const struct run_opts *o, const plan *pl, const struct run *r, double t_start,
                          aft_out *yout, aft_out *tout)
{
    aft_error err;
    int rc, trc = 0;
    if (sh->rank == 0 && o->timing_path && aft_out_open(tout, o->timing_path, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        trc = EXIT_DATA;
    }
    if ((rc = agree(sh, trc))) return rc;
    rc = write_timing(sh, o, pl, r, t_start, tout);
    if (!rc && sh->rank == 0 &&
        (aft_out_commit(yout, &err) != AFT_OK || (o->timing_path && aft_out_commit(tout, &err) != AFT_OK))) {
        cli_error(NULL, "%s", err.msg);
        rc = EXIT_DATA;
    }
    return rc;
}

/* the steps after MPI is up; rank 0's output committed last */
static int shard_main(shard *sh, const struct run_opts *o)
{
    double t_start = aft_now_ms();
    struct run r;
    plan pl;
    memset(&r, 0, sizeof r);
    memset(&pl, 0, sizeof pl);
    r.cmd = "run";
    aft_out yout = {0}, tout = {0};
    aft_state *state = NULL;
    int rc = check_options(o);
    if (!rc) rc = read_header(o, &pl);
    if ((rc = agree(sh, rc))) goto out;
    pl.N = (size_t)sh->size;
    pl.t0 = slice_at((size_t)sh->rank, pl.N, pl.T);
    pl.t1 = slice_at((size_t)sh->rank + 1, pl.N, pl.T);
    pl.n = pl.t1 - pl.t0;
    if ((rc = agree(sh, read_inputs(sh, o, &pl, &r)))) goto out;
    if ((rc = agree(sh, check_values(sh, o, &pl, &r)))) goto out;
    if ((rc = agree(sh, choose_path(sh, o, &pl, &r, &state)))) goto out;
    need_of(&pl, (size_t)sh->rank, &pl.lo, &pl.hi);
    if (!pl.stream && pl.halo != 0 && pl.n) {   /* the slice's own rows are among those held */
        if (pl.lo > pl.t0) pl.lo = pl.t0;
        if (pl.hi < pl.t1) pl.hi = pl.t1;
    }
    rc = pl.stream ? compute_stream(sh, &pl, &r, state) : compute_slice(sh, &pl, &r);
    if ((rc = agree(sh, rc))) goto out;
    if ((rc = write_rows(sh, o, &pl, &yout))) goto out;
    rc = finish_outputs(sh, o, &pl, &r, t_start, &yout, &tout);
out:
    rc = agree_final(sh, rc);
    if (yout.fp) aft_out_abort(&yout);
    if (tout.fp) aft_out_abort(&tout);
    aft_state_free(state);
    runner_free(&r);
    free(pl.x); free(pl.y); free(pl.kv); free(pl.mask);
    return rc;
}

int cli_shard_refused(int rc)
{
    int provided;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return rc;
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}

int cli_shard_run(const struct run_opts *o)
{
    int provided;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        cli_error("run", "MPI_Init failed");
        return EXIT_DATA;
    }
    shard sh;
    memset(&sh, 0, sizeof sh);
    the_shard = &sh;
    sh.comm = MPI_COMM_WORLD;
    MPI_Comm_rank(sh.comm, &sh.rank);
    MPI_Comm_size(sh.comm, &sh.size);
    MPI_Comm_split(sh.comm, 0, sh.size - 1 - sh.rank, &sh.rev);
    sh.sums_t = MPI_DATATYPE_NULL;
    /* messages are held until the ranks agree who reports */
    sh.held_fp = open_memstream(&sh.held, &sh.held_len);
    cli_msg_stream = sh.held_fp;
    int rc = sh.held_fp ? shard_main(&sh, o) : EXIT_DATA;
    cli_msg_stream = NULL;
    if (sh.held_fp) fclose(sh.held_fp);
    free(sh.held);
    if (sh.sums_t != MPI_DATATYPE_NULL) MPI_Type_free(&sh.sums_t);
    MPI_Comm_free(&sh.rev);
    MPI_Finalize();
    return rc;
}

#endif /* AFT_MPI */
