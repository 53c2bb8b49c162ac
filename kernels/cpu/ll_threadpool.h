// ll_threadpool.h - a fixed pool of compute workers (our own, not libuv's or OpenMP's).
// Created once; each job runs fn(ctx, task, thread) for task in [0, n_tasks) with the calling
// thread participating. No allocation and no thread creation per job.
#ifndef LL_THREADPOOL_H
#define LL_THREADPOOL_H

struct ll_threadpool;
typedef void (*ll_task_fn)(void *ctx, int task, int thread);

// n_threads >= 1 counts the caller: n_threads - 1 workers are started.
struct ll_threadpool *ll_threadpool_new(int n_threads);
void ll_threadpool_free(struct ll_threadpool *p); // accepts NULL
int ll_threadpool_size(const struct ll_threadpool *p);
// Runs the job to completion. Not reentrant: one job at a time (the engine's compute thread).
void ll_threadpool_run(struct ll_threadpool *p, ll_task_fn fn, void *ctx, int n_tasks);

#endif
