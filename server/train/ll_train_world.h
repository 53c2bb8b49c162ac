// ll_train_world.h - the ranks of a data-parallel `llsrv train` (mpirun -np N llsrv train ...):
// an MPI world when the build has MPI (CMake's FindMPI; LL_HAVE_MPI), and the communicator the
// trainer sums gradients through (struct ll_train_comm, ll_trainer.h).
//
// The gradient sum comes in two orders: LL_REDUCE_ORDERED gathers each chunk of the gradient
// on rank 0, adds the ranks' chunks in rank order (((g0 + g1) + g2) + ...) and broadcasts the
// sum, so every run of N ranks gives the same bits, the ones of one process with grad_accum N
// where each parameter gets one addition per micro-batch; LL_REDUCE_ALLREDUCE is MPI_Allreduce
// (MPI_SUM), whose order is the MPI library's (bandwidth-optimal for large N, bits may differ
// from the single process's). Either way every rank ends with the same sum.
#ifndef LL_TRAIN_WORLD_H
#define LL_TRAIN_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "ll_trainer.h"

enum ll_reduce { LL_REDUCE_ORDERED = 0, LL_REDUCE_ALLREDUCE = 1 };

struct ll_train_world;

// 1 when the build has MPI.
int ll_train_world_built(void);
// 1 when an MPI launcher started this process (its environment says so: OMPI_COMM_WORLD_SIZE,
// PMI_SIZE, PMIX_RANK); what: the variable and its value, for messages.
int ll_train_world_launched(char *what, size_t cap);
// MPI_Init (threads: funneled). LL_EUNSUPPORTED "MPI is not built in" without MPI.
int ll_train_world_open(struct ll_train_world **out, int reduce, char *err, size_t errlen);
// MPI_Finalize; accepts NULL.
void ll_train_world_close(struct ll_train_world *w);
// Ends every rank of the job at once (MPI_Abort), for an error on one rank: the others would
// wait for it in the next sum for ever.
void ll_train_world_abort(struct ll_train_world *w, int code);
// Changes the order of the gradient sum (every rank alike, between sums; benchmarks).
void ll_train_world_set_reduce(struct ll_train_world *w, int reduce);
int ll_train_world_rank(const struct ll_train_world *w);
int ll_train_world_size(const struct ll_train_world *w);
void ll_train_world_comm(struct ll_train_world *w, struct ll_train_comm *c);
// 1 on every rank when flag is set on any (a signal seen by some ranks only: all stop at the same step).
int ll_train_world_any(struct ll_train_world *w, int flag);

// What the gradient sums cost so far: calls, floats per call (the last), seconds in total.
struct ll_train_world_stats {
  int64_t sums;
  int64_t floats;
  double seconds;
};
void ll_train_world_stats(const struct ll_train_world *w, struct ll_train_world_stats *st);

#endif
