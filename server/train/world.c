// world.c - MPI ranks for data-parallel training (ll_train_world.h). Everything MPI is here,
// behind LL_HAVE_MPI; the trainer sees only struct ll_train_comm.
#include "ll_train_world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_error.h"

#ifdef LL_HAVE_MPI
#include <mpi.h>
#endif

int ll_train_world_built(void) {
#ifdef LL_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

int ll_train_world_launched(char *what, size_t cap) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) {
      if (what) snprintf(what, cap, "%s=%s", vars[i], v);
      return 1;
    }
  }
  if (what && cap) what[0] = 0;
  return 0;
}

struct ll_train_world {
  int rank, size, reduce;
  float *chunks; // rank 0, ordered: (size, CHUNK) one chunk of every rank's gradient
  struct ll_train_world_stats st;
};

// Floats per gathered chunk: rank 0 holds size x CHUNK of them (16 MiB at 4 ranks).
#define CHUNK (1 << 20)

#ifdef LL_HAVE_MPI
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int sum_f32(void *user, float *buf, int64_t n, char *err, size_t errlen) {
  struct ll_train_world *w = user;
  (void)err, (void)errlen; // MPI errors abort the job (MPI_ERRORS_ARE_FATAL), naming the rank
  const double t0 = now_s();
  for (int64_t o = 0; o < n; o += CHUNK) {
    const int c = (int)(n - o < CHUNK ? n - o : CHUNK);
    float *b = buf + o;
    if (w->reduce == LL_REDUCE_ALLREDUCE) {
      MPI_Allreduce(MPI_IN_PLACE, b, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      continue;
    }
    MPI_Gather(b, c, MPI_FLOAT, w->chunks, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (w->rank == 0)
      for (int r = 1; r < w->size; r++) { // in rank order: ((g0 + g1) + g2) + ...
        const float *x = w->chunks + (size_t)r * c;
        for (int i = 0; i < c; i++) b[i] += x[i];
      }
    MPI_Bcast(b, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  w->st.sums++;
  w->st.floats = n;
  w->st.seconds += now_s() - t0;
  return 0;
}

static int gather_f64(void *user, const double *in, int n, double *out, char *err, size_t errlen) {
  (void)user, (void)err, (void)errlen;
  MPI_Allgather(in, n, MPI_DOUBLE, out, n, MPI_DOUBLE, MPI_COMM_WORLD);
  return 0;
}
#endif

int ll_train_world_open(struct ll_train_world **out, int reduce, char *err, size_t errlen) {
  *out = NULL;
#ifdef LL_HAVE_MPI
  int inited = 0, prov = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &prov) != MPI_SUCCESS)
    return ll_errf(err, errlen, LL_EIO, "MPI_Init failed");
  struct ll_train_world *w = calloc(1, sizeof *w);
  if (!w) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w->size);
  w->reduce = reduce;
  if (w->rank == 0 && w->size > 1 && reduce == LL_REDUCE_ORDERED && !(w->chunks = malloc((size_t)w->size * CHUNK * sizeof *w->chunks))) {
    const int n = w->size;
    free(w);
    return ll_errf(err, errlen, LL_ENOMEM, "out of memory for the gradient sum (%d x %d floats)", n, CHUNK);
  }
  *out = w;
  return 0;
#else
  (void)reduce;
  return ll_errf(err, errlen, LL_EUNSUPPORTED, "MPI is not built in (install libopenmpi-dev and rebuild: CMake's FindMPI enables it)");
#endif
}

void ll_train_world_close(struct ll_train_world *w) {
  if (!w) return;
#ifdef LL_HAVE_MPI
  MPI_Finalize();
#endif
  free(w->chunks);
  free(w);
}

void ll_train_world_abort(struct ll_train_world *w, int code) {
#ifdef LL_HAVE_MPI
  if (w) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)w, (void)code;
#endif
}

void ll_train_world_set_reduce(struct ll_train_world *w, int reduce) {
  if (reduce == LL_REDUCE_ORDERED && w->rank == 0 && w->size > 1 && !w->chunks) {
    w->chunks = malloc((size_t)w->size * CHUNK * sizeof *w->chunks);
    if (!w->chunks) reduce = LL_REDUCE_ALLREDUCE; // no memory for the ordered sum's chunks
  }
  w->reduce = reduce;
}

int ll_train_world_rank(const struct ll_train_world *w) { return w ? w->rank : 0; }
int ll_train_world_size(const struct ll_train_world *w) { return w ? w->size : 1; }

void ll_train_world_comm(struct ll_train_world *w, struct ll_train_comm *c) {
  memset(c, 0, sizeof *c);
  c->rank = ll_train_world_rank(w), c->size = ll_train_world_size(w);
#ifdef LL_HAVE_MPI
  c->user = w, c->sum_f32 = sum_f32, c->gather_f64 = gather_f64;
#endif
}

int ll_train_world_any(struct ll_train_world *w, int flag) {
#ifdef LL_HAVE_MPI
  if (w && w->size > 1) {
    int any = 0;
    MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return any != 0;
  }
#else
  (void)w;
#endif
  return flag != 0;
}

void ll_train_world_stats(const struct ll_train_world *w, struct ll_train_world_stats *st) {
  if (w) *st = w->st;
  else memset(st, 0, sizeof *st);
}
