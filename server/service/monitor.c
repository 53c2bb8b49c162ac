// monitor.c - the monitor socket for lltop and scripts: a Unix socket in a private directory
// (0700, socket 0600, created under a umask so there is no window where others can connect),
// newline-delimited JSON snapshots at monitor_hz plus event lines, and control commands from
// the socket's owner. Collection (snapshot_json) is separate from transport; every metric
// that is not known is null, never invented. Schema: man/llsrv-protocol.7, MONITOR SOCKET.
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ll_error.h"
#include "ll_log.h"
#include "ll_server.h"
#include "ll_adapters.h"
#include "ll_trainjob.h"

#define MON_MAX_CLIENTS 64
#define MON_MAX_LINE 4096
#define MON_MAX_PENDING (8u << 20) // bytes queued to a monitor client before it is dropped

struct ll_mconn {
  uv_pipe_t h;
  struct ll_server *srv;
  struct ll_mconn *next;
  char in[MON_MAX_LINE];
  size_t in_len;
  int closing;  // uv_close called
  int draining; // a last reply queued: nothing more is sent or read, closed once it is out
  uint64_t id;  // s->mon_ids at accept: found again by a reply that comes later (adapter load)
  uv_shutdown_t sd;
};

int64_t ll_host_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long pages_total, pages_res;
  int ok = fscanf(f, "%lld %lld", &pages_total, &pages_res) == 2;
  fclose(f);
  return ok ? pages_res * (int64_t)sysconf(_SC_PAGESIZE) : -1;
}

static int meminfo(int64_t *total, int64_t *avail) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long v;
  *total = *avail = -1;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemTotal: %lld kB", &v) == 1) *total = v * 1024;
    else if (sscanf(line, "MemAvailable: %lld kB", &v) == 1) *avail = v * 1024;
  }
  fclose(f);
  return *total >= 0 && *avail >= 0 ? 0 : -1;
}

static json_t *int_or_null(int known, int64_t v) { return known ? json_integer(v) : json_null(); }

static json_t *snapshot_json(struct ll_server *s) {
  const struct ll_engine_info *in = &s->info;
  struct ll_sched_stats st;
  ll_sched_get_stats(s->sched, &st);
  int64_t rss = ll_host_rss_bytes(), mt = -1, ma = -1;
  int have_mem = meminfo(&mt, &ma) == 0;
  int is_cpu = strcmp(in->backend, "cpu") == 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  json_t *root = json_object();
  json_object_set_new(root, "type", json_string("snapshot"));
  json_object_set_new(root, "time", json_real(ts.tv_sec + ts.tv_nsec / 1e9));
  json_object_set_new(root, "uptime_s", json_real(((double)uv_hrtime() / 1e6 - s->t_start) / 1000.0));
  json_object_set_new(root, "version", json_string(LL_VERSION));
  json_object_set_new(root, "pid", json_integer(getpid()));

  json_t *dev = json_object();
  json_object_set_new(dev, "name", json_string(in->device_name));
  json_object_set_new(dev, "type", json_string(is_cpu ? "cpu" : "gpu"));
  json_object_set_new(dev, "backend", json_string(in->backend));
  json_object_set_new(dev, "compute_units", int_or_null(is_cpu, sysconf(_SC_NPROCESSORS_ONLN)));
  json_object_set_new(dev, "threads", json_integer(in->n_threads));
  json_object_set_new(dev, "reason", json_string(in->device_reason));
  if (!is_cpu) { // OpenCL details (null-free: the backend fills them at start-up)
    json_object_set_new(dev, "vendor", json_string(in->device_vendor));
    json_object_set_new(dev, "driver", json_string(in->device_driver));
    json_object_set_new(dev, "opencl_version", json_string(in->device_version));
    json_object_set_new(dev, "compute_units", json_integer(in->n_threads));
    json_object_set_new(dev, "global_mem", json_integer(in->device_mem_total));
    json_object_set_new(dev, "max_alloc", json_integer(in->device_max_alloc));
    json_object_set_new(dev, "fp16", json_boolean(in->device_fp16));
    json_object_set_new(dev, "subgroups", json_boolean(in->device_subgroups));
    json_object_set_new(dev, "dot", json_string(in->device_dot));
  }
  json_object_set_new(root, "device", dev);

  json_t *mem = json_object();
  // For the CPU backend the device memory is the host's RAM.
  // For the OpenCL backend: its global memory and what we allocated on it (counted at start-up:
  // weights and staging; the KV pool grows on the device as it is used).
  json_object_set_new(mem, "device_total", is_cpu ? int_or_null(have_mem, mt) : json_integer(in->device_mem_total));
  // The trainer's own OpenCL instance on the same device (trainjob.c) counts its allocations
  // apart: device_used is both instances' sum, train_device_bytes the trainer's part.
  const int64_t tdb = s->job ? ll_trainjob_device_bytes(s->job) : -1;
  json_object_set_new(mem, "device_used", is_cpu ? int_or_null(have_mem, mt - ma) : json_integer(in->device_mem_used + (tdb > 0 ? tdb : 0)));
  json_object_set_new(mem, "host_rss", int_or_null(rss >= 0, rss));
  json_object_set_new(mem, "host_total", int_or_null(have_mem, mt));
  json_object_set_new(mem, "weights", json_integer(in->weight_bytes));
  json_object_set_new(mem, "kv_bytes", json_integer(in->kv_bytes));
  json_object_set_new(mem, "kv_blocks_used", json_integer(st.kv_blocks_used));
  json_object_set_new(mem, "kv_blocks_total", json_integer(in->kv_blocks_total));
  const int64_t tb = s->job ? ll_trainjob_bytes(s->job) : -1; // null until a run has its buffers
  json_object_set_new(mem, "train_bytes", tb >= 0 ? json_integer(tb) : json_null());
  json_object_set_new(mem, "train_device_bytes", tdb >= 0 ? json_integer(tdb) : json_null());
  json_object_set_new(root, "memory", mem);

  json_t *model = json_object();
  json_object_set_new(model, "name", json_string(in->name));
  json_object_set_new(model, "path", json_string(s->model_path));
  json_object_set_new(model, "arch", json_string(in->arch));
  json_object_set_new(model, "quant", json_string(in->quant));
  json_object_set_new(model, "n_params", json_integer(in->n_params));
  json_object_set_new(model, "n_ctx", json_integer(in->n_ctx));
  json_object_set_new(model, "n_vocab", json_integer(in->n_vocab));
  json_object_set_new(root, "model", model);

  json_t *sv = json_object();
  json_object_set_new(sv, "listen", s->listen_addr[0] ? json_string(s->listen_addr) : json_null());
  json_object_set_new(sv, "clients", json_integer(s->n_conns));
  json_object_set_new(sv, "active", json_integer(st.active));
  json_object_set_new(sv, "queued", json_integer(st.queued));
  json_object_set_new(sv, "parallel", json_integer(in->n_parallel));
  json_object_set_new(sv, "requests_total", json_integer((json_int_t)st.requests_total));
  json_object_set_new(sv, "requests_done", json_integer((json_int_t)st.requests_done));
  json_object_set_new(sv, "tokens_generated", json_integer((json_int_t)st.tokens_generated));
  json_object_set_new(sv, "tokens_prefilled", json_integer((json_int_t)st.tokens_prefilled));
  json_object_set_new(sv, "decode_tps", json_real(st.decode_tps));
  json_object_set_new(sv, "prefill_tps", json_real(st.prefill_tps));
  json_object_set_new(sv, "clients_dropped", json_integer((json_int_t)s->conns_dropped));
  json_t *reqs = json_array();
  for (int i = 0; i < st.n_shown; i++) {
    const struct ll_sched_req_progress *p = &st.shown[i];
    json_t *r = json_object();
    json_object_set_new(r, "id", json_string(p->id));
    json_object_set_new(r, "state", json_string(p->prefilling ? "prefill" : "decode"));
    json_object_set_new(r, "prompt_tokens", json_integer(p->prompt_tokens));
    json_object_set_new(r, "prefilled", json_integer(p->prefilled));
    json_object_set_new(r, "tokens", json_integer(p->tokens));
    json_object_set_new(r, "max_tokens", json_integer(p->max_tokens));
    json_object_set_new(r, "adapter", json_string(p->adapter[0] ? p->adapter : "none"));
    const char *peer = ll_net_peer(s, p->conn);
    json_object_set_new(r, "client", peer ? json_string(peer) : json_null());
    json_object_set_new(r, "tok_s", p->tok_s >= 0 ? json_real(p->tok_s) : json_null());
    json_object_set_new(r, "age_s", json_real(p->age_s));
    json_array_append_new(reqs, r);
  }
  json_object_set_new(sv, "requests", reqs);
  // Hot-loaded adapter versions alive: the served one of each name, and replaced ones still
  // computing requests that began with them (freed after their last).
  struct ll_sched_adapter_version av[64];
  const int nav = ll_sched_adapter_versions(s->sched, av, 64);
  json_t *avs = json_array();
  for (int i = 0; i < nav && i < 64; i++) {
    json_t *a = json_object();
    json_object_set_new(a, "name", json_string(av[i].name));
    json_object_set_new(a, "version", json_integer((json_int_t)av[i].version));
    json_object_set_new(a, "requests", json_integer(av[i].users));
    json_object_set_new(a, "served", json_boolean(av[i].registered));
    json_array_append_new(avs, a);
  }
  json_object_set_new(sv, "adapter_versions", avs);
  json_object_set_new(root, "serving", sv);

  // Training: the job's fields, or "unavailable" (a model without a tokenizer cannot train).
  json_t *tr;
  if (s->job) {
    tr = ll_trainjob_json(s->job);
  } else {
    tr = json_object();
    json_object_set_new(tr, "state", json_string(s->cfg->train_enabled ? "unavailable" : "off"));
    const char *nulls[] = {"step", "total_steps", "epoch", "loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "eta_s", "last_checkpoint",
                           "skipped_steps", "run_dir", "backend", "device", "device_reason"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) json_object_set_new(tr, nulls[i], json_null());
    json_object_set_new(tr, "history", json_array()); // [[step, loss, val_loss|null], ...]
    json_object_set_new(tr, "history_tail", json_false());
  }
  json_object_set_new(root, "training", tr);
  return root;
}

// ---- transport ----

static void on_mclosed(uv_handle_t *h) {
  struct ll_mconn *m = h->data;
  struct ll_server *s = m->srv;
  for (struct ll_mconn **pp = &s->mconns; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  free(m);
}

static void mclose(struct ll_mconn *m) {
  if (m->closing) return;
  m->closing = 1;
  uv_close((uv_handle_t *)&m->h, on_mclosed);
}

static void on_mdrained(uv_shutdown_t *req, int status) {
  (void)status;
  mclose(req->data);
}

// Closes once what is queued has been written (a reply saying why the connection ends).
static void mdrain(struct ll_mconn *m) {
  if (m->closing || m->draining) return;
  m->draining = 1;
  uv_read_stop((uv_stream_t *)&m->h);
  // Discard what the peer has sent and we have not read: closing a Unix socket with unread
  // input resets the connection, and the peer would lose the reply that says why.
  uv_os_fd_t fd;
  char junk[4096];
  if (uv_fileno((uv_handle_t *)&m->h, &fd) == 0)
    for (int i = 0; i < 256 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {
    }
  m->sd.data = m;
  if (uv_shutdown(&m->sd, (uv_stream_t *)&m->h, on_mdrained) != 0) mclose(m);
}

static void on_mwrite(uv_write_t *req, int status) {
  (void)status;
  free(req);
}

static void msend(struct ll_mconn *m, const char *data, size_t len) {
  if (m->closing || m->draining) return;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&m->h) + len > MON_MAX_PENDING) {
    mclose(m); // a monitor that does not read is dropped, it does not grow our memory
    return;
  }
  uv_write_t *req = malloc(sizeof *req + len);
  if (!req) return;
  char *p = (char *)(req + 1);
  memcpy(p, data, len);
  uv_buf_t b = uv_buf_init(p, (unsigned)len);
  if (uv_write(req, (uv_stream_t *)&m->h, &b, 1, on_mwrite) != 0) {
    free(req);
    mclose(m);
  }
}

static void send_json(struct ll_mconn *m, json_t *j) {
  char *txt = json_dumps(j, JSON_COMPACT);
  if (!txt) return;
  size_t n = strlen(txt);
  txt[n] = 0;
  char *line = malloc(n + 2);
  if (line) {
    memcpy(line, txt, n);
    line[n] = '\n';
    msend(m, line, n + 1);
    free(line);
  }
  free(txt);
}

static void reply(struct ll_mconn *m, const char *cmd, int ok, const char *error) {
  json_t *j = json_object();
  json_object_set_new(j, "type", json_string("reply"));
  json_object_set_new(j, "command", json_string(cmd));
  json_object_set_new(j, "ok", json_boolean(ok));
  if (error) json_object_set_new(j, "error", json_string(error));
  send_json(m, j);
  json_decref(j);
}

// ---- control commands: one row each ----

static void mcmd_snapshot(struct ll_mconn *m, const char *cmd, const char *arg) {
  (void)cmd, (void)arg;
  json_t *j = snapshot_json(m->srv);
  send_json(m, j);
  json_decref(j);
}

static void mcmd_log_level(struct ll_mconn *m, const char *cmd, const char *arg) {
  (void)cmd;
  int lv = ll_log_level_from_name(arg);
  if (lv < 0) return reply(m, "log_level", 0, "expected error, warn, info or debug");
  ll_log_set_level(lv);
  ll_log(LL_LOG_INFO, "log level set to %s from the monitor socket", arg);
  reply(m, "log_level", 1, NULL);
}

// train start|pause|resume|stop, and save|pause|resume alone: flags for the compute thread; the
// reply says whether the command fits the job's state.
static void mcmd_train(struct ll_mconn *m, const char *cmd, const char *arg) {
  struct ll_server *s = m->srv;
  const char *what = !strcmp(cmd, "train") ? arg : cmd;
  char e[256];
  if (!s->job) return reply(m, cmd, 0, "training is unavailable: the model has no tokenizer");
  if (!strcmp(cmd, "train") && !arg[0]) return reply(m, cmd, 0, "train needs start, pause, resume or stop");
  if (ll_trainjob_control(s->job, what, e, sizeof e) != 0) return reply(m, cmd, 0, e);
  reply(m, cmd, 1, NULL);
}

// adapter load NAME PATH | adapter unload NAME: hot-loading (adapters.c). A load replies when
// the file is read and served (or not), which may be after other commands' replies.
struct pending_reply {
  struct ll_server *srv;
  uint64_t id;
};
static void adapter_loaded(void *user, int rc, const char *msg) {
  struct pending_reply *p = user;
  for (struct ll_mconn *m = p->srv->mconns; m; m = m->next)
    if (m->id == p->id && !m->closing && !m->draining) {
      json_t *j = json_object();
      json_object_set_new(j, "type", json_string("reply"));
      json_object_set_new(j, "command", json_string("adapter"));
      json_object_set_new(j, "ok", json_boolean(rc == 0));
      json_object_set_new(j, rc ? "error" : "message", json_string(msg));
      send_json(m, j);
      json_decref(j);
      break;
    }
  free(p);
}

static void mcmd_adapter(struct ll_mconn *m, const char *cmd, const char *arg) {
  struct ll_server *s = m->srv;
  char verb[16] = "", name[LL_ADAPTER_NAME_MAX + 2] = "", e[512];
  int used = 0;
  if (sscanf(arg, "%15s %128s %n", verb, name, &used) < 2 || (strcmp(verb, "load") && strcmp(verb, "unload")))
    return reply(m, cmd, 0, "adapter load NAME PATH, or adapter unload NAME");
  if (!s->adapters) return reply(m, cmd, 0, "adapters cannot be loaded now (the server is starting or stopping)");
  if (!strcmp(verb, "unload")) {
    int rc = ll_adapters_unload(s->adapters, name, e, sizeof e);
    return reply(m, cmd, rc == 0, rc ? e : NULL);
  }
  const char *path = arg + used;
  if (!*path) return reply(m, cmd, 0, "adapter load NAME PATH: no PATH");
  struct pending_reply *p = malloc(sizeof *p);
  if (!p) return reply(m, cmd, 0, "out of memory");
  p->srv = s, p->id = m->id;
  int rc = ll_adapters_load(s->adapters, name, path, adapter_loaded, p);
  if (rc) {
    free(p);
    return reply(m, cmd, 0, rc == LL_EINVAL ? "adapter load NAME PATH: NAME up to 127 bytes, PATH up to PATH_MAX" : ll_strerror(rc));
  }
}

static const struct mcmd {
  const char *name;
  void (*fn)(struct ll_mconn *m, const char *cmd, const char *arg);
} k_mcmds[] = {
    {"snapshot", mcmd_snapshot}, {"log_level", mcmd_log_level}, {"train", mcmd_train},
    {"save", mcmd_train},        {"pause", mcmd_train},         {"resume", mcmd_train},
    {"adapter", mcmd_adapter},   {NULL, NULL},
};

static void handle_control(struct ll_mconn *m, char *line) {
  // The command's first word, then the rest of the line as its argument (a path may be long).
  char cmd[64] = "", arg[MON_MAX_LINE];
  int at = 0;
  if (sscanf(line, "%63s %n", cmd, &at) < 1) return;
  snprintf(arg, sizeof arg, "%s", line + at);
  for (size_t l = strlen(arg); l > 0 && (arg[l - 1] == ' ' || arg[l - 1] == '\t' || arg[l - 1] == '\r'); l--) arg[l - 1] = 0;
  for (const struct mcmd *c = k_mcmds; c->name; c++)
    if (!strcmp(c->name, cmd)) return c->fn(m, cmd, arg);
  char e[256];
  snprintf(e, sizeof e, "unknown command '%.40s' (snapshot, log_level LEVEL, train start|stop|pause|resume, save, adapter load NAME PATH|unload NAME)", cmd);
  reply(m, "?", 0, e);
}

static void on_malloc(uv_handle_t *h, size_t sugg, uv_buf_t *buf) {
  (void)sugg;
  struct ll_mconn *m = h->data;
  *buf = uv_buf_init(m->in + m->in_len, (unsigned)(sizeof m->in - 1 - m->in_len));
}

static void on_mread(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  struct ll_mconn *m = st->data;
  if (n < 0) {
    mclose(m);
    return;
  }
  m->in_len += (size_t)n;
  size_t start = 0;
  for (size_t i = 0; i < m->in_len; i++) {
    if (m->in[i] != '\n') continue;
    m->in[i] = 0;
    handle_control(m, m->in + start);
    start = i + 1;
    if (m->closing || m->draining) return;
  }
  memmove(m->in, m->in + start, m->in_len - start);
  m->in_len -= start;
  if (m->in_len >= sizeof m->in - 1) { // a control line is short: this is not a monitor client
    char e[128];
    snprintf(e, sizeof e, "control line longer than %d bytes; closing the connection", MON_MAX_LINE - 1);
    ll_log(LL_LOG_WARN, "monitor: a client sent a %s", e + strlen("control "));
    reply(m, "?", 0, e);
    mdrain(m);
  }
}

static void on_mconnection(uv_stream_t *server, int status) {
  struct ll_server *s = server->data;
  if (status < 0) return;
  struct ll_mconn *m = calloc(1, sizeof *m);
  if (!m) return;
  m->srv = s;
  m->id = ++s->mon_ids;
  uv_pipe_init(s->loop, &m->h, 0);
  m->h.data = m;
  m->next = s->mconns;
  s->mconns = m;
  if (uv_accept(server, (uv_stream_t *)&m->h) != 0) {
    mclose(m);
    return;
  }
  int n = 0;
  for (struct ll_mconn *x = s->mconns; x; x = x->next) n += !x->closing;
  // Only the socket's owner may attach (the socket is 0600 as well).
  uv_os_fd_t fd;
  struct ucred cr;
  socklen_t cl = sizeof cr;
  if (uv_fileno((uv_handle_t *)&m->h, &fd) != 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid() ||
      n > MON_MAX_CLIENTS) {
    mclose(m);
    return;
  }
  uv_read_start((uv_stream_t *)&m->h, on_malloc, on_mread);
  json_t *j = snapshot_json(s); // a new client sees the state at once
  send_json(m, j);
  json_decref(j);
}

static void on_mon_timer(uv_timer_t *t) {
  struct ll_server *s = t->data;
  if (!s->mconns) return;
  json_t *j = snapshot_json(s);
  char *txt = json_dumps(j, JSON_COMPACT); // serialized once for every client
  json_decref(j);
  size_t n = txt ? strlen(txt) : 0;
  char *line = txt ? realloc(txt, n + 2) : NULL;
  if (!line) {
    free(txt);
    return;
  }
  line[n] = '\n';
  for (struct ll_mconn *m = s->mconns; m; m = m->next) msend(m, line, n + 1);
  free(line);
}

void ll_monitor_event(struct ll_server *s, const char *line, size_t len) {
  for (struct ll_mconn *m = s->mconns; m; m = m->next) msend(m, line, len);
}

int ll_monitor_default_path(char *out, size_t cap, char *err, size_t errlen) {
  const char *rt = getenv("XDG_RUNTIME_DIR");
  int n;
  if (rt && rt[0] == '/') n = snprintf(out, cap, "%s/llsrv/llsrv.sock", rt);
  else n = snprintf(out, cap, "/tmp/llsrv-%u/llsrv.sock", (unsigned)getuid());
  if (n < 0 || (size_t)n >= cap) return ll_errf(err, errlen, LL_ELIMIT, "monitor socket path too long");
  return 0;
}

// The socket's directory: created 0700 when missing. A directory that was already there is
// never chmod'ed (it may be shared, e.g. /tmp, or set up so on purpose); it must be ours and
// writable by no one else, since whoever may write there could put their own socket at our path
// before us or after us. The socket's own mode (0600) and the peer-uid check keep readers out.
static int private_dir(const char *dir, char *err, size_t errlen) {
  if (mkdir(dir, 0700) == 0) return 0;
  if (errno != EEXIST) return ll_errf(err, errlen, LL_EIO, "monitor: cannot create %s: %s", dir, strerror(errno));
  struct stat st;
  if (lstat(dir, &st) != 0) return ll_errf(err, errlen, LL_EIO, "monitor: %s: %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return ll_errf(err, errlen, LL_EINVAL, "monitor: %s is not a directory", dir);
  if (st.st_uid != geteuid())
    return ll_errf(err, errlen, LL_EINVAL, "monitor: directory %s belongs to uid %u, not to us (uid %u); refusing to put the socket there",
                   dir, (unsigned)st.st_uid, (unsigned)geteuid());
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return ll_errf(err, errlen, LL_EINVAL,
                   "monitor: directory %s is writable by %s (mode %04o); refusing to put the socket there "
                   "(give --socket a path in a directory of your own, e.g. %s/llsrv/llsrv.sock, which llsrv creates 0700)",
                   dir, (st.st_mode & S_IWOTH) ? "everyone" : "its group", (unsigned)(st.st_mode & 07777), dir);
  return 0;
}

int ll_monitor_start(struct ll_server *s, const char *path, char *err, size_t errlen) {
  struct sockaddr_un sun;
  if (strlen(path) >= sizeof sun.sun_path || strlen(path) >= sizeof s->mon_path)
    return ll_errf(err, errlen, LL_ELIMIT, "monitor socket path '%s' is longer than %zu bytes", path, sizeof sun.sun_path - 1);
  char dir[sizeof s->mon_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = 0;
    int rc = private_dir(dir, err, errlen);
    if (rc) return rc;
  }
  // A socket file already there: live server -> refuse; stale -> replace.
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return ll_errf(err, errlen, LL_EEXIST, "monitor: %s exists and is not a socket", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path));
    int live = fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof sun) == 0;
    if (fd >= 0) close(fd);
    if (live) return ll_errf(err, errlen, LL_EBUSY, "monitor: another llsrv is serving on %s", path);
    if (unlink(path) != 0) return ll_errf(err, errlen, LL_EIO, "monitor: cannot remove stale socket %s: %s", path, strerror(errno));
    ll_log(LL_LOG_INFO, "monitor: replaced stale socket %s", path);
  }
  uv_pipe_init(s->loop, &s->mon, 0);
  s->mon.data = s;
  s->mon_open = 1;
  mode_t old = umask(0177); // the socket is born 0600: no window where others may connect
  int r = uv_pipe_bind(&s->mon, path);
  umask(old);
  if (r != 0) return ll_errf(err, errlen, LL_EIO, "monitor: bind %s: %s", path, uv_strerror(r));
  snprintf(s->mon_path, sizeof s->mon_path, "%s", path);
  chmod(path, 0600);
  r = uv_listen((uv_stream_t *)&s->mon, 16, on_mconnection);
  if (r != 0) return ll_errf(err, errlen, LL_EIO, "monitor: listen %s: %s", path, uv_strerror(r));
  double hz = s->cfg->monitor_hz > 0 ? s->cfg->monitor_hz : 4;
  uv_timer_init(s->loop, &s->mon_timer);
  s->mon_timer.data = s;
  uint64_t ms = (uint64_t)(1000.0 / hz);
  uv_timer_start(&s->mon_timer, on_mon_timer, ms ? ms : 1, ms ? ms : 1);
  return 0;
}

void ll_monitor_close(struct ll_server *s) {
  for (struct ll_mconn *m = s->mconns; m; m = m->next) mclose(m);
  if (s->mon_open) {
    s->mon_open = 0;
    uv_timer_stop(&s->mon_timer);
    uv_close((uv_handle_t *)&s->mon_timer, NULL);
    uv_close((uv_handle_t *)&s->mon, NULL);
    if (s->mon_path[0]) unlink(s->mon_path);
  }
}
