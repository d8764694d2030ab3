/* train_mpi.h - aft train's ranks under an MPI launcher (train_mpi.c):
 * data parallel, one MPI_Allreduce of the gradients (and the loss) a step.
 * Without an MPI launcher, or without Open MPI built in, one rank. Private
 * to cli/. */
#ifndef AFT_CLI_TRAIN_MPI_H
#define AFT_CLI_TRAIN_MPI_H

#include <stddef.h>

typedef struct {
    int rank, size;
    int mpi;   /* MPI_Init was called */
} cli_ranks;

/* Starts MPI when a launcher started this process (cli_shard_launcher):
 * 0, or an exit status after reporting (a launcher but no MPI built in).
 * Messages of ranks other than the lowest failing one are held
 * (cli_msg_stream) until cli_ranks_agree. */
int cli_ranks_init(cli_ranks *r);
/* buf (n floats) summed over the ranks, in place (nothing with one rank) */
void cli_ranks_sum(cli_ranks *r, float *buf, size_t n);
void cli_ranks_sum_double(cli_ranks *r, double *buf, size_t n);
/* every rank's exit status in, the lowest failing rank's out (0: none
 * failed); that rank's held messages are printed, the others dropped */
int cli_ranks_agree(cli_ranks *r, int rc);
void cli_ranks_finish(cli_ranks *r);

#endif
