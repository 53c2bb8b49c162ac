// threadpool.c - workers spin briefly on a generation counter, then sleep on a condvar, so a
// decode step's ~200 small jobs cost microseconds each while an idle server burns no CPU.
#include "ll_threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SPIN_ITERS 20000

// A polite spin-wait hint: keeps a waiting core from flooding the memory system and lets an
// SMT sibling run (x86 pause, Arm yield).
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

struct ll_threadpool {
  int n;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_uint gen;      // bumped for each job
  atomic_int next_task; // work queue: tasks are claimed by atomic increment
  atomic_int done;      // workers finished with the current job
  atomic_int stop;
  ll_task_fn fn;
  void *ctx;
  int n_tasks;
};

struct worker_arg {
  struct ll_threadpool *p;
  int id;
};

static void drain(struct ll_threadpool *p, int id) {
  for (;;) {
    int t = atomic_fetch_add(&p->next_task, 1);
    if (t >= p->n_tasks) break;
    p->fn(p->ctx, t, id);
  }
}

static void *worker(void *arg) {
  struct worker_arg wa = *(struct worker_arg *)arg;
  free(arg);
  struct ll_threadpool *p = wa.p;
  unsigned seen = 0;
  for (;;) {
    unsigned g;
    int spins = 0;
    while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) {
      if (++spins < SPIN_ITERS) {
        cpu_relax();
        continue;
      }
      pthread_mutex_lock(&p->mu);
      while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
      pthread_mutex_unlock(&p->mu);
      break;
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = g;
    drain(p, wa.id);
    atomic_fetch_add(&p->done, 1);
  }
}

struct ll_threadpool *ll_threadpool_new(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  struct ll_threadpool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  if (!p->threads) {
    free(p);
    return NULL;
  }
  for (int i = 1; i < n_threads; i++) {
    struct worker_arg *a = malloc(sizeof *a);
    if (!a || pthread_create(&p->threads[i], NULL, worker, a ? (a->p = p, a->id = i, a) : NULL) != 0) {
      free(a);
      p->n = i; // run with the workers we have
      break;
    }
  }
  return p;
}

int ll_threadpool_size(const struct ll_threadpool *p) { return p ? p->n : 1; }

void ll_threadpool_run(struct ll_threadpool *p, ll_task_fn fn, void *ctx, int n_tasks) {
  if (!p || p->n == 1 || n_tasks <= 1) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  p->n_tasks = n_tasks;
  atomic_store(&p->next_task, 0);
  atomic_store(&p->done, 0);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->gen, 1);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  drain(p, 0);
  // The workers finish within microseconds of the caller: spin (a sched_yield per check was
  // a system call each time, ~4% of a batched decode step), yield only if it takes long.
  for (int spins = 0; atomic_load(&p->done) < p->n - 1;)
    if (++spins < SPIN_ITERS) cpu_relax();
    else sched_yield();
}

void ll_threadpool_free(struct ll_threadpool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->threads);
  free(p);
}
