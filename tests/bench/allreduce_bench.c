// allreduce_bench - what the data-parallel gradient sum costs (docs/PERFORMANCE.md, issue 33):
//   mpirun -np N build/tests/allreduce_bench FLOATS [REPS]
// sums a gradient of FLOATS floats across the ranks through the trainer's communicator
// (ll_train_world.h), REPS times in each order (rank-ordered gather + broadcast, and
// MPI_Allreduce), and prints rank 0's mean and best milliseconds per sum. The sums are checked
// (every element must come out as the sum of the ranks' values), so a fast wrong sum fails.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ll_train_world.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: mpirun -np N %s FLOATS [REPS]\n", argv[0]);
    return 2;
  }
  const long long n = atoll(argv[1]);
  const int reps = argc > 2 ? atoi(argv[2]) : 5;
  float *g = malloc((size_t)n * sizeof *g);
  if (!g || n <= 0) return 1;
  int bad = 0;
  for (int order = 0; order < 2; order++) {
    char err[256];
    // The world is opened once per process (MPI_Init); the order is the world's setting.
    static struct ll_train_world *w;
    if (!w && ll_train_world_open(&w, LL_REDUCE_ORDERED, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    ll_train_world_set_reduce(w, order ? LL_REDUCE_ALLREDUCE : LL_REDUCE_ORDERED);
    struct ll_train_comm c;
    ll_train_world_comm(w, &c);
    double best = 1e9, sum = 0;
    for (int r = 0; r <= reps; r++) { // the first is a warm-up
      for (long long i = 0; i < n; i++) g[i] = (float)(c.rank + 1) * (float)(i & 7);
      const int any0 = ll_train_world_any(w, 0); // line the ranks up
      (void)any0;
      const double t0 = now_s();
      c.sum_f32(c.user, g, n, err, sizeof err);
      const double t = now_s() - t0;
      const float k = (float)c.size * (float)(c.size + 1) / 2;
      for (long long i = 0; i < n; i += 4099) bad += g[i] != k * (float)(i & 7);
      if (r == 0) continue;
      sum += t;
      if (t < best) best = t;
    }
    if (c.rank == 0)
      printf("%d ranks, %lld floats (%.1f MiB): %-13s mean %.1f ms, best %.1f ms\n", c.size, n, n * 4 / 1048576.0,
             order ? "MPI_Allreduce" : "rank-ordered", sum / reps * 1e3, best * 1e3);
    if (order == 1) {
      if (bad) fprintf(stderr, "rank %d: %d wrong sums\n", c.rank, bad);
      ll_train_world_close(w);
    }
  }
  free(g);
  return bad ? 1 : 0;
}
