// ll_server.h - the running service: one libuv loop owns the TCP listener and its clients
// (net.c), the HTTP listener and its clients (http.c), the monitor socket and its clients (monitor.c), timers and signals; the scheduler's
// compute thread hands lines back through a uv_async (sched.c). Internal to server/.
#ifndef LL_SERVER_H
#define LL_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "ll_config.h"
#include "ll_engine.h"
#include "ll_sched.h"

struct ll_conn;
struct ll_mconn;

struct ll_sub { // a request waiting for the end of the loop iteration (net.c ll_net_submit)
  struct ll_sched_req *r;
  uint64_t conn;                 // r's, kept for the answer if the scheduler refuses r (and frees it)
  char id[LL_PROTO_MAX_ID + 1];
};

struct ll_server {
  uv_loop_t *loop;
  const struct ll_config *cfg;
  struct ll_engine *e;
  struct ll_engine_info info;
  struct ll_sched *sched;
  struct ll_trainjob *job; // background training, NULL when the model cannot train (no tokenizer)
  struct ll_ftjobs *ft;    // the fine-tuning API's files and jobs (ftjobs.c), NULL while loading
  const char *model_path;
  double t_start; // ms, uv_hrtime based

  // TCP
  uv_tcp_t tcp;
  int tcp_open;
  char listen_addr[128]; // as bound ("127.0.0.1:8478")
  struct ll_conn **conns; // (max_clients) slots
  int n_conns;
  uint32_t conn_gen;
  int outstanding; // requests handed to the scheduler whose final line has not come back
  // Requests of this loop iteration, handed to the scheduler together at its end (net.c
  // ll_net_submit), and the final events of those it refused, delivered there too.
  uv_check_t submit_check;
  int submit_ready;
  struct ll_sub *sub;
  int n_sub, cap_sub;
  struct ll_sched_ev *sub_failed;
  uint64_t conns_total, conns_dropped, lines_total, errors_total;

  // HTTP (http.c), NULL when off
  struct ll_http *http;
  char http_addr[128]; // as bound

  // monitor
  uv_pipe_t mon;
  int mon_open;
  char mon_path[256];
  struct ll_mconn *mconns;
  uint64_t mon_ids; // the last monitor client's id (a reply that comes later finds its client by id)
  uv_timer_t mon_timer;

  // hot-loaded adapters (adapters.c): `adapter load|unload`, adapter_dir; NULL when none
  struct ll_adapters *adapters;

  uv_async_t async;
  uv_timer_t tick;
  uv_signal_t sig_int, sig_term;
  uv_timer_t stop_timer;
  int shutting_down;
  int loading; // from ll_server_load until ll_server_listen is done: HTTP answers 503
};

// server.c: the loop's life. init (before the scheduler: its notify is ll_server_notify),
// listen (sockets, tick, signals), run (until shutdown), close (after the scheduler is gone).
void ll_server_init(struct ll_server *s, const struct ll_config *cfg, const char *model_path);
void ll_server_notify(void *user); // the scheduler's notify: wakes the loop (any thread)
// The base model's id on the HTTP API and in fine-tuned names: the model file's stem up to its
// first '.' ("SmolLM2-135M-Instruct" of .../SmolLM2-135M-Instruct.Q4_1.gguf).
void ll_server_model_id(const char *model_path, char *out, size_t cap);
// Runs fn(arg) (opening the engine) on a worker thread while the loop serves the HTTP API,
// started here, whose /health answers 503 (loading) meanwhile; returns fn's result.
int ll_server_load(struct ll_server *s, int (*fn)(void *arg), void *arg, char *err, size_t errlen);
int ll_server_listen(struct ll_server *s, const char *sock_path, char *err, size_t errlen);
void ll_server_run(struct ll_server *s);
void ll_server_close(struct ll_server *s);

// net.c
int ll_net_start(struct ll_server *s, char *err, size_t errlen);
void ll_net_on_event(struct ll_server *s, struct ll_sched_ev *o); // encodes one event as a line for its connection; frees o
void ll_net_tick(struct ll_server *s);                              // timeouts
void ll_net_shutdown(struct ll_server *s);                          // stop accepting
void ll_net_close_all(struct ll_server *s);                         // after the last final line
void ll_net_force_close_all(struct ll_server *s);                   // error/exit path: close now
int ll_net_parse_listen(const char *spec, char *host, size_t hostcap, int *port, char *err, size_t errlen);
int ll_net_host_is_loopback(const char *host);
const char *ll_net_peer(struct ll_server *s, uint64_t uid); // "ip:port" of a live connection, else NULL
// Both protocols' way to the scheduler. ll_net_submit takes r (conn and id set) and counts it
// in `outstanding`; it reaches the scheduler at the end of this loop iteration, with every
// other request read in it, so that requests arriving together start in the same batch step
// (were each handed over at once, the compute thread would wake at the first and start its
// step before the loop has read the others, which then wait a whole step). A request the
// scheduler refuses (shutting down) ends with a final ERROR event like any other.
// ll_net_cancel is ll_sched_cancel after handing over what is waiting (so a cancel never
// overtakes its request).
void ll_net_submit(struct ll_server *s, struct ll_sched_req *r);
void ll_net_cancel(struct ll_server *s, uint64_t uid, const char *id);

// http.c: the OpenAI-compatible HTTP API on the same loop (man/llsrv-http.7)
int ll_http_start(struct ll_server *s, char *err, size_t errlen);
int ll_http_is_uid(uint64_t uid);                                 // an event for an HTTP request
void ll_http_on_event(struct ll_server *s, struct ll_sched_ev *o); // encodes it for its request; frees o
void ll_http_observe(struct ll_server *s, const struct ll_sched_ev *o); // metrics of a final event (any protocol)
void ll_http_shutdown(struct ll_server *s);                       // stop accepting
void ll_http_close_all(struct ll_server *s);                      // after the last final event
void ll_http_free(struct ll_server *s);                           // after the loop has stopped

// monitor.c
int ll_monitor_default_path(char *out, size_t cap, char *err, size_t errlen);
int ll_monitor_start(struct ll_server *s, const char *path, char *err, size_t errlen);
void ll_monitor_event(struct ll_server *s, const char *json_line, size_t len); // broadcast
void ll_monitor_close(struct ll_server *s); // closes clients and the socket, unlinks it
int64_t ll_host_rss_bytes(void);

#endif
