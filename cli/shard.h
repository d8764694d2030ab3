/* shard.h - aft run under an MPI launcher (shard.c): the sequence in slices,
 * one a process, over the steps aft run and aft grad share (runner.h).
 * Private to cli/. */
#ifndef AFT_CLI_SHARD_H
#define AFT_CLI_SHARD_H

#include "runner.h"

/* The environment variable that says an MPI launcher started this process
 * (mpirun's OMPI_COMM_WORLD_SIZE, srun's PMIX_RANK or PMI_RANK), or NULL:
 * a plain run, which never initialises MPI. */
const char *cli_shard_launcher(void);
/* 0 when command cmd can run as launched, else an exit status, task 0
 * having said why: srun's tasks without MPI between them (each would run
 * alone, all writing the same files), or under a launcher of more than
 * one process a command that does not share its work (shares 0) */
int cli_shard_check(const char *cmd, int shares);
/* 1 when this aft was built with Open MPI (aft --version says so) */
int cli_shard_built_in(void);
/* 1 unless the launcher says this process is a rank other than 0 (the
 * one that reports the options' errors, before MPI is up) */
int cli_shard_rank0(void);
/* aft run over the ranks, each on its slice of the sequence; every rank
 * returns the same exit status */
int cli_shard_run(const struct run_opts *o);
/* options refused under a launcher (rank 0 has said why): every rank
 * returns rc once all have got this far, so none exits first and has
 * mpirun end rank 0 before its message is out */
int cli_shard_refused(int rc);

#endif
