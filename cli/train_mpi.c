/* train_mpi.c - aft train's ranks under Open MPI (train_mpi.h). Built with
 * -DAFT_MPI when Open MPI's development files are there (Makefile), else a
 * single rank that refuses to run under a launcher. The library knows
 * nothing of MPI. */
#include "train_mpi.h"

#include "cli.h"
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef AFT_MPI

int cli_ranks_init(cli_ranks *r)
{
    r->rank = 0;
    r->size = 1;
    r->mpi = 0;
    const char *l = cli_shard_launcher();
    if (l) {
        cli_error("train", "started by an MPI launcher (%s is set), but this aft was built without MPI: install "
                           "Open MPI's development files (libopenmpi-dev) and rebuild", l);
        return EXIT_USAGE;
    }
    return 0;
}

void cli_ranks_sum(cli_ranks *r, float *buf, size_t n)
{
    (void)r; (void)buf; (void)n;
}

void cli_ranks_sum_double(cli_ranks *r, double *buf, size_t n)
{
    (void)r; (void)buf; (void)n;
}

int cli_ranks_agree(cli_ranks *r, int rc)
{
    (void)r;
    return rc;
}

void cli_ranks_finish(cli_ranks *r)
{
    (void)r;
}

#else

#include <limits.h>
#include <mpi.h>

static char *held;
static size_t held_len;

int cli_ranks_init(cli_ranks *r)
{
    r->rank = 0;
    r->size = 1;
    r->mpi = 0;
    if (!cli_shard_launcher()) return 0;
    MPI_Init(NULL, NULL);
    r->mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r->size);
    /* every rank holds its messages: the lowest failing rank alone prints */
    cli_msg_stream = open_memstream(&held, &held_len);
    if (!cli_msg_stream) MPI_Abort(MPI_COMM_WORLD, 1);
    return 0;
}

/* in pieces of at most INT_MAX elements: MPI counts are ints */
void cli_ranks_sum(cli_ranks *r, float *buf, size_t n)
{
    if (!r->mpi) return;
    for (size_t i = 0; i < n; i += INT_MAX) {
        size_t k = n - i < INT_MAX ? n - i : INT_MAX;
        MPI_Allreduce(MPI_IN_PLACE, buf + i, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

void cli_ranks_sum_double(cli_ranks *r, double *buf, size_t n)
{
    if (!r->mpi) return;
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

int cli_ranks_agree(cli_ranks *r, int rc)
{
    if (!r->mpi) return rc;
    int in[2] = {rc ? r->rank : r->size, rc}, out[2];
    MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD);
    fflush(cli_msg_stream);
    if (out[0] != r->size && out[0] == r->rank && held_len) fwrite(held, 1, held_len, stderr);
    fflush(stderr);
    fseeko(cli_msg_stream, 0, SEEK_SET);
    fflush(cli_msg_stream);
    MPI_Barrier(MPI_COMM_WORLD);   /* no rank exits before the message is out */
    return out[0] == r->size ? 0 : out[1];
}

void cli_ranks_finish(cli_ranks *r)
{
    if (!r->mpi) return;
    fflush(cli_msg_stream);
    if (held_len) fwrite(held, 1, held_len, stderr);   /* warnings held and never agreed on */
    cli_msg_stream = NULL;
    MPI_Finalize();
    r->mpi = 0;
}

#endif
