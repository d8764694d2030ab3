/* run.h - what aft run shares with its sharded form under MPI (shard.c):
 * the options, the run's state, and the steps both take. Private to cli/. */
#ifndef AFT_CLI_RUN_H
#define AFT_CLI_RUN_H

#include "cli.h"

#include <cJSON.h>

/* ---------------------------------------------------------------- options */

struct run_opts {
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

/* ---------------------------------------------------------------- the run's state */

struct timing {
    double load, write, total, compute_med, compute_min;
    int layer;              /* phases apply: a layer run, not the bare operator */
    aft_layer_times phases; /* of the fastest run */
};

/* what a run holds from one step to the next */
struct run {
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

void run_free(struct run *r);
/* the layer's parameters (--weights, or the seeded ones) for r's sizes
 * (B, T, D, bare), settled by the library's rules into r->cfg; 0 or an
 * exit status after reporting */
int run_get_params(const struct run_opts *o, struct run *r);
/* --timing's JSON: the configuration and tm (the caller adds to it) */
cJSON *run_timing_json(const struct run_opts *o, const aft_config *cfg, size_t B, size_t T, size_t D, size_t C,
                       const struct timing *tm);
/* j printed to out, then deleted; 0 or EXIT_DATA after reporting */
int run_write_json(aft_out *out, cJSON *j);

/* ---------------------------------------------------------------- under MPI (shard.c) */

/* The environment variable that says an MPI launcher started this process
 * (mpirun's OMPI_COMM_WORLD_SIZE, srun's PMIX_RANK or PMI_RANK), or NULL:
 * a plain run, which never initialises MPI. */
const char *cli_shard_launcher(void);
/* 1 unless the launcher says this process is a rank other than 0 (the
 * one that reports the options' errors, before MPI is up) */
int cli_shard_rank0(void);
/* aft run over the ranks, each on its slice of the sequence; every rank
 * returns the same exit status */
int cli_shard_run(const struct run_opts *o);

#endif
