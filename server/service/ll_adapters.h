// ll_adapters.h - LoRA adapters loaded while the server runs (issue 33): the monitor's
// `adapter load NAME PATH` / `adapter unload NAME`, and a watched directory (adapter_dir).
//
// Files are read on libuv's worker threads (the loop never waits on disk), into host memory
// (every backend computes with host-memory adapters), and published to the scheduler as a new
// version of NAME (ll_sched_adapter_publish): requests admitted afterwards compute with it,
// requests in flight finish on the version they began with, and a replaced version is freed
// after its last request. A file that fails to load (truncated, another model's, not an
// adapter) is reported and the version served before stays. Loop thread only.
#ifndef LL_ADAPTERS_H
#define LL_ADAPTERS_H

#include <stdint.h>
#include <uv.h>

struct ll_sched;
struct ll_lora_dims;
struct ll_adapters;

// dims: the served model's (adapters are checked against them); dir: NULL or the directory to
// watch, scanned now and every poll_s seconds.
int ll_adapters_create(struct ll_adapters **out, uv_loop_t *loop, struct ll_sched *s, const struct ll_lora_dims *dims, const char *dir,
                       double poll_s, char *err, size_t errlen);
// Stops the watch; a load in progress is dropped when it completes. Then the loop must run
// until ll_adapters_closed() (its timer and work requests end).
void ll_adapters_close(struct ll_adapters *A);
int ll_adapters_closed(const struct ll_adapters *A);
void ll_adapters_free(struct ll_adapters *A); // after the loop has stopped; accepts NULL

// Loads PATH as a new version of NAME; done(user, rc, msg) on the loop when it is served (rc 0,
// msg says which version) or not (rc < 0, msg says why). 0 when started.
typedef void (*ll_adapters_done_fn)(void *user, int rc, const char *msg);
int ll_adapters_load(struct ll_adapters *A, const char *name, const char *path, ll_adapters_done_fn done, void *user);
// Unloads NAME now (requests in flight keep their version); LL_ENOTFOUND with msg if no such
// hot-loaded adapter.
int ll_adapters_unload(struct ll_adapters *A, const char *name, char *msg, size_t cap);

#endif
