// threadpool.c - workers spin briefly on the job word, then sleep on a condvar, so a decode
// step's ~200 small jobs cost microseconds each while an idle server burns no CPU.
//
// A job is one 64-bit word: generation (16 bits) | task count (24) | next unclaimed task (24).
// Tasks are claimed by compare-and-swap on the word, so a claim names its job: a worker that
// slept through a job (or several) can never run a task of the wrong one. The caller waits
// for the job's tasks to be done, not for every worker to check in: with more threads than a
// job has tasks (a 2-task product on 16 threads), the workers that found nothing, or were still
// asleep, cost the caller nothing. Before, the caller waited until each of the n - 1 workers
// had woken and counted itself done; a worker asleep on the condvar came back through the
// mutex one after another, so every job after a pause paid n - 1 serialised wake-ups (issue 30).
#include "ll_threadpool.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define SPIN_ITERS 20000
// With more threads than CPUs a spinning thread takes the core a working one needs: spin only
// a little (a pause is 10-140 cycles), then sleep (workers) or yield (the caller).
#define SPIN_ITERS_OVER 64

#define W_NEXT_BITS 24
#define W_MAX_TASKS ((1 << W_NEXT_BITS) - 1)
#define W_GEN(w) ((unsigned)((w) >> (2 * W_NEXT_BITS)))
#define W_NTASKS(w) ((int)(((w) >> W_NEXT_BITS) & W_MAX_TASKS))
#define W_NEXT(w) ((int)((w)&W_MAX_TASKS))

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
  int spin; // SPIN_ITERS, or SPIN_ITERS_OVER when n exceeds the CPUs we may run on
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Alignas(64) _Atomic uint64_t work; // the job word (see the file comment)
  atomic_int sleepers;                // workers in (or entering) the condvar wait
  atomic_int stop;
  _Alignas(64) atomic_int pending; // tasks of the current job not yet finished
  // The current job, written before its word is published and not again until its tasks are
  // all done: a worker reads them only after claiming a task of that job.
  _Alignas(64) ll_task_fn fn;
  void *ctx;
  int base; // task index offset (jobs of more than W_MAX_TASKS tasks run in parts)
  unsigned gen;
};

struct worker_arg {
  struct ll_threadpool *p;
  int id;
};

// Claims and runs tasks of generation gen (mod 2^16) until there are none left or the word has
// moved on to another job.
static void drain(struct ll_threadpool *p, unsigned gen, int id) {
  uint64_t w = atomic_load(&p->work);
  for (;;) {
    if (W_GEN(w) != gen || W_NEXT(w) >= W_NTASKS(w)) return;
    if (!atomic_compare_exchange_weak(&p->work, &w, w + 1)) continue; // w reloaded
    p->fn(p->ctx, p->base + W_NEXT(w), id);
    atomic_fetch_sub(&p->pending, 1);
    w = atomic_load(&p->work);
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
    while ((g = W_GEN(atomic_load(&p->work))) == seen && !atomic_load(&p->stop)) {
      if (++spins < p->spin) {
        cpu_relax();
        continue;
      }
      // Sleep. sleepers is raised before gen is read again and the caller reads sleepers after
      // publishing a job (both sequentially consistent): one of the two sees the other.
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while ((g = W_GEN(atomic_load(&p->work))) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
      break;
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = g;
    drain(p, g, wa.id);
  }
}

static int cpus_usable(void) {
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  return 0; // unknown: assume enough
}

struct ll_threadpool *ll_threadpool_new(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  struct ll_threadpool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  const int ncpu = cpus_usable();
  p->spin = ncpu > 0 && n_threads > ncpu ? SPIN_ITERS_OVER : SPIN_ITERS;
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

static void run_part(struct ll_threadpool *p, ll_task_fn fn, void *ctx, int base, int n_tasks) {
  p->fn = fn;
  p->ctx = ctx;
  p->base = base;
  p->gen = (p->gen + 1) & 0xffff;
  atomic_store(&p->pending, n_tasks);
  atomic_store(&p->work, (uint64_t)p->gen << (2 * W_NEXT_BITS) | (uint64_t)n_tasks << W_NEXT_BITS);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  drain(p, p->gen, 0);
  // The tasks others claimed finish within microseconds of ours: spin (a sched_yield per
  // check was a system call each time, ~4% of a batched decode step), yield only if it takes
  // long (a worker preempted in its task).
  for (int spins = 0; atomic_load(&p->pending) > 0;)
    if (++spins < p->spin) cpu_relax();
    else sched_yield();
}

// LL_POOL_TRACE=FILE: how a program's parallel work splits (issue 30, tests/bench/train_split.py
// reads it). Every job then runs on the caller alone, its tasks one after another, and writes
// one line to FILE: the task function's offset in its binary (nm names it), the caller's CPU
// nanoseconds since the previous job ended (its serial work between jobs), then each task's
// CPU nanoseconds. A benchmark's switch, not for serving: it takes the pool's threads away.
static FILE *trace_file;
static pthread_once_t trace_once = PTHREAD_ONCE_INIT;
static void trace_open(void) {
  const char *path = getenv("LL_POOL_TRACE");
  if (path && *path) trace_file = fopen(path, "w");
}
static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static void trace_job(ll_task_fn fn, void *ctx, int n_tasks) {
  static _Thread_local int64_t last; // the end of this thread's previous job
  Dl_info di;
  uintptr_t off = (uintptr_t)fn;
  if (dladdr((void *)(uintptr_t)fn, &di) && di.dli_fbase) off -= (uintptr_t)di.dli_fbase;
  int64_t t = thread_cpu_ns();
  fprintf(trace_file, "%jx %jd", (uintmax_t)off, (intmax_t)(last ? t - last : 0));
  for (int i = 0; i < n_tasks; i++) {
    fn(ctx, i, 0);
    const int64_t t1 = thread_cpu_ns();
    fprintf(trace_file, " %jd", (intmax_t)(t1 - t));
    t = t1;
  }
  fputc('\n', trace_file);
  last = thread_cpu_ns();
}

void ll_threadpool_run(struct ll_threadpool *p, ll_task_fn fn, void *ctx, int n_tasks) {
  pthread_once(&trace_once, trace_open);
  if (trace_file) {
    trace_job(fn, ctx, n_tasks);
    return;
  }
  if (!p || p->n == 1 || n_tasks <= 1) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  for (int base = 0; base < n_tasks; base += W_MAX_TASKS)
    run_part(p, fn, ctx, base, n_tasks - base < W_MAX_TASKS ? n_tasks - base : W_MAX_TASKS);
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
