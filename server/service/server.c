// server.c - the running service on one libuv loop (ll_server.h): the listeners (the line
// protocol, net.c; the HTTP API, http.c), the monitor socket (monitor.c), the timeouts tick,
// signals and shutdown; the scheduler's events come in through a uv_async and go to the
// protocol that encodes them.
//
// Shutdown: the first signal stops accepting, ends every request with a final event
// (reason=shutdown), closes clients once their last answer is out, removes the monitor socket
// and lets the loop end (at most ~5 s). A second signal exits at once; files are only ever
// published by rename, so nothing is torn.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ll_log.h"
#include "ll_server.h"

#include "ll_adapters.h"

static void on_async(uv_async_t *a) {
  struct ll_server *s = a->data;
  for (struct ll_sched_ev *o = ll_sched_take_events(s->sched), *n; o; o = n) {
    n = o->next;
    if (o->type == LL_EV_MONITOR) {
      ll_monitor_event(s, o->data, o->len);
      free(o);
      continue;
    }
    if (o->final) ll_http_observe(s, o); // /metrics counts both protocols' requests
    if (ll_http_is_uid(o->conn)) ll_http_on_event(s, o);
    else ll_net_on_event(s, o);
  }
  if (s->shutting_down == 1 && s->outstanding == 0) {
    // Every request has had its final event: close clients (after their output), stop.
    s->shutting_down = 2;
    ll_net_close_all(s);
    ll_http_close_all(s);
    ll_monitor_close(s);
    ll_adapters_close(s->adapters); // its timer; loads in progress end unpublished
    uv_close((uv_handle_t *)&s->tick, NULL);
    // The signal handlers stay (a second signal must still exit at once while clients
    // drain) but no longer keep the loop alive.
    uv_unref((uv_handle_t *)&s->sig_int);
    uv_unref((uv_handle_t *)&s->sig_term);
    uv_close((uv_handle_t *)&s->async, NULL);
    // stop_timer stays: if a client never lets its output drain, the loop still ends.
  }
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void ll_server_model_id(const char *model_path, char *out, size_t cap) {
  const char *stem = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;
  snprintf(out, cap, "%.*s", (int)strcspn(stem, "."), stem);
  if (!out[0]) snprintf(out, cap, "llsrv");
}

void ll_server_notify(void *user) { uv_async_send(&((struct ll_server *)user)->async); }

static void on_tick(uv_timer_t *t) { ll_net_tick(t->data); }

static void on_stop_timer(uv_timer_t *t) {
  struct ll_server *s = t->data;
  ll_log(LL_LOG_WARN, "shutdown: clients still open after 5 s; stopping anyway");
  uv_stop(s->loop);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct ll_server *s = h->data;
  if (s->shutting_down) {
    ll_log(LL_LOG_WARN, "second %s: exiting now", signum == SIGINT ? "SIGINT" : "SIGTERM");
    if (s->mon_path[0]) unlink(s->mon_path);
    _exit(1);
  }
  ll_log(LL_LOG_INFO, "%s: shutting down (finishing %d requests with reason=shutdown)", signum == SIGINT ? "SIGINT" : "SIGTERM",
         s->outstanding);
  s->shutting_down = 1;
  ll_net_shutdown(s);
  ll_http_shutdown(s);
  ll_sched_shutdown(s->sched);
  uv_timer_init(s->loop, &s->stop_timer);
  s->stop_timer.data = s;
  uv_timer_start(&s->stop_timer, on_stop_timer, 5000, 0);
  uv_unref((uv_handle_t *)&s->stop_timer); // does not by itself keep the loop alive
  uv_async_send(&s->async); // in case nothing is outstanding
}

void ll_server_init(struct ll_server *s, const struct ll_config *cfg, const char *model_path) {
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  s->model_path = model_path;
  s->loop = uv_default_loop();
  s->t_start = (double)uv_hrtime() / 1e6;
  uv_async_init(s->loop, &s->async, on_async);
  s->async.data = s;
}

// ---- loading with the HTTP API up (GET /health answers 503 until the model is there) ----

// The loading runs on a thread of our own, joined before the server goes on (libuv's thread
// pool would keep threads to the process's exit, where ASan's teardown trips on them).
struct load_work {
  uv_async_t done; // load_run -> the loop
  struct ll_server *s;
  int (*fn)(void *arg);
  void *arg;
  int rc;
  int finished; // fn has returned (the loop's flag: set by load_done)
};

static void *load_run(void *arg) {
  struct load_work *lw = arg;
  // Testing aid: LL_TEST_LOAD_DELAY_MS=N makes loading take N ms longer, so a test can see
  // the HTTP API answer while the model loads.
  const char *d = getenv("LL_TEST_LOAD_DELAY_MS");
  if (d && atoi(d) > 0 && atoi(d) <= 600000) usleep((useconds_t)atoi(d) * 1000u);
  // Opening a device may install an alternate signal stack of the library's own on this
  // thread (LLVM, under pocl, mallocs one); the thread's own is put back before it exits,
  // as whatever made it (the C library, a sanitizer) unmaps it then.
  stack_t own;
  int have = sigaltstack(NULL, &own) == 0;
  lw->rc = lw->fn(lw->arg);
  if (have) sigaltstack(&own, NULL);
  uv_async_send(&lw->done);
  return NULL;
}

// The server stays `loading` (HTTP 503) until ll_server_listen: between the two the scheduler,
// the monitor and the signal handlers are made, and a request the loop took in that gap (it
// still runs the iteration that saw this) must not find them missing - nor a client, told 200,
// send a SIGTERM that nothing catches yet.
static void load_done(uv_async_t *a) {
  struct load_work *lw = a->data;
  lw->finished = 1;
  uv_stop(lw->s->loop);
}

int ll_server_load(struct ll_server *s, int (*fn)(void *arg), void *arg, char *err, size_t errlen) {
  int rc = ll_http_start(s, err, errlen);
  if (rc) return rc;
  if (!s->http) return fn(arg); // HTTP off: nothing to answer while loading
  ll_log(LL_LOG_INFO, "http: http://%s answers 503 (loading) until the model is loaded", s->http_addr);
  struct load_work lw = {.s = s, .fn = fn, .arg = arg, .rc = 0};
  uv_async_init(s->loop, &lw.done, load_done);
  lw.done.data = &lw;
  pthread_t th;
  s->loading = 1;
  if (pthread_create(&th, NULL, load_run, &lw) != 0) {
    lw.rc = fn(arg);
  } else {
    while (!lw.finished) uv_run(s->loop, UV_RUN_DEFAULT); // load_done stops it
    pthread_join(th, NULL);
  }
  uv_close((uv_handle_t *)&lw.done, NULL);
  uv_run(s->loop, UV_RUN_NOWAIT); // the close completes before lw goes
  return lw.rc;
}

int ll_server_listen(struct ll_server *s, const char *sock_path, char *err, size_t errlen) {
  int rc = ll_net_start(s, err, errlen);
  if (!rc && !s->http) rc = ll_http_start(s, err, errlen);
  if (!rc) rc = ll_monitor_start(s, sock_path, err, errlen);
  if (rc) return rc;
  uv_timer_init(s->loop, &s->tick);
  s->tick.data = s;
  uv_timer_start(&s->tick, on_tick, 250, 250);
  uv_signal_init(s->loop, &s->sig_int);
  uv_signal_init(s->loop, &s->sig_term);
  s->sig_int.data = s->sig_term.data = s;
  uv_signal_start(&s->sig_int, on_signal, SIGINT);
  uv_signal_start(&s->sig_term, on_signal, SIGTERM);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGXFSZ, SIG_IGN); // a file-size limit (ulimit -f) fails a checkpoint's write with EFBIG, as a full disk does, not the server
  s->loading = 0; // served from here: /health 200 (see load_done)
  return 0;
}

void ll_server_run(struct ll_server *s) { uv_run(s->loop, UV_RUN_DEFAULT); }

void ll_server_close(struct ll_server *s) {
  if (s->mon_path[0]) unlink(s->mon_path);
  // Close what is still open (an error path, or the stop timer) and let the close callbacks
  // free their memory before the connection table goes.
  if (s->conns) ll_net_force_close_all(s);
  ll_monitor_close(s);
  ll_adapters_close(s->adapters);
  ll_http_free(s); // closes H2O's own handles; before the walk that closes what is left
  uv_walk(s->loop, close_walk, NULL);
  uv_run(s->loop, UV_RUN_DEFAULT);
  uv_loop_close(s->loop);
  free(s->conns);
  s->conns = NULL;
}
