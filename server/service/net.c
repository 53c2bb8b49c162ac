// net.c - the TCP line protocol on the libuv loop: accept, read lines (bounded), parse
// (proto.c), answer cheap commands at once, hand generate/tokenize work to the scheduler, and
// route its lines back to the right connection. Limits: max clients, max line, queue depth,
// idle and line timeouts, per-client output cap (a client that does not read is dropped).
//
// Handle memory is freed only in the close callback (libuv rule); the scheduler refers to a
// connection by a 64-bit uid (slot | generation << 32), so a line for a closed connection
// finds no one and is dropped.
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_chat.h"
#include "ll_error.h"
#include "ll_log.h"
#include "ll_proto.h"
#include "ll_request.h"
#include "ll_server.h"
#include "ll_tokenizer.h"

#define READ_CHUNK 65536
#define MAX_INFLIGHT_PER_CONN 4096

struct inflight {
  struct inflight *next;
  char id[LL_PROTO_MAX_ID + 1];
};

struct ll_conn {
  uv_tcp_t h; // first: the handle's data points back here too
  struct ll_server *srv;
  uint64_t uid;
  int slot;
  char *in;
  size_t in_len, in_cap, scanned;
  double last_activity, line_started; // ms
  int authed, closing, draining;      // draining: closing after the queued output is written
  double drain_started;
  int eof;                            // the peer sent EOF (or QUIT): close after the last answer
  char quit_id[LL_PROTO_MAX_ID + 1];  // QUIT's id; BYE is sent once nothing is in flight
  int quit;
  int n_inflight;
  struct inflight *inflight;
  uint64_t auto_id;
  char peer[64];
  uv_shutdown_t shut;
};

struct wreq {
  uv_write_t req;
  size_t len;
  char data[];
};

static double now_ms(struct ll_server *s) {
  (void)s;
  return (double)uv_hrtime() / 1e6;
}

// ---- connection lifetime ----

static void on_conn_closed(uv_handle_t *h) {
  struct ll_conn *c = h->data;
  struct ll_server *s = c->srv;
  if (s->conns[c->slot] == c) s->conns[c->slot] = NULL;
  s->n_conns--;
  while (c->inflight) {
    struct inflight *n = c->inflight->next;
    free(c->inflight);
    c->inflight = n;
  }
  free(c->in);
  free(c);
}

static void conn_close(struct ll_conn *c, const char *why) {
  if (c->closing) return;
  c->closing = 1;
  if (why) ll_log(LL_LOG_DEBUG, "client %s: closed (%s)", c->peer, why);
  if (c->n_inflight > 0) ll_net_cancel(c->srv, c->uid, NULL); // frees their KV before the next step
  uv_read_stop((uv_stream_t *)&c->h);
  uv_close((uv_handle_t *)&c->h, on_conn_closed);
}

static void on_shutdown_done(uv_shutdown_t *req, int status) {
  (void)status;
  struct ll_conn *c = req->data;
  conn_close(c, "finished");
}

// Close once everything queued has been written (QUIT, line too long, timeouts).
static void conn_drain_close(struct ll_conn *c) {
  if (c->closing || c->draining) return;
  c->draining = 1;
  c->drain_started = now_ms(c->srv);
  uv_read_stop((uv_stream_t *)&c->h);
  if (c->n_inflight > 0) ll_net_cancel(c->srv, c->uid, NULL);
  c->shut.data = c;
  if (uv_shutdown(&c->shut, (uv_stream_t *)&c->h, on_shutdown_done) != 0) conn_close(c, "shutdown failed");
}

static void on_write_done(uv_write_t *req, int status) {
  struct wreq *w = (struct wreq *)req;
  struct ll_conn *c = req->handle->data;
  free(w);
  if (status < 0 && status != UV_ECANCELED) conn_close(c, uv_strerror(status));
}

static void conn_send(struct ll_conn *c, const char *data, size_t len) {
  if (c->closing || len == 0) return;
  uv_stream_t *st = (uv_stream_t *)&c->h;
  if (uv_stream_get_write_queue_size(st) == 0) {
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    int k = uv_try_write(st, &b, 1);
    if (k == (int)len) return;
    if (k > 0) data += k, len -= (size_t)k;
    else if (k != UV_EAGAIN && k != UV_ENOSYS) {
      conn_close(c, uv_strerror(k));
      return;
    }
  }
  if (uv_stream_get_write_queue_size(st) + len > (size_t)c->srv->cfg->output_buffer) {
    // The client does not read: drop it rather than grow our memory.
    ll_log(LL_LOG_WARN, "client %s: dropped, more than %lld bytes of output not read", c->peer, (long long)c->srv->cfg->output_buffer);
    c->srv->conns_dropped++;
    char ev[256];
    int n = snprintf(ev, sizeof ev, "{\"type\":\"event\",\"event\":\"client_dropped\",\"peer\":\"%s\",\"reason\":\"output_buffer\"}\n", c->peer);
    ll_monitor_event(c->srv, ev, (size_t)n);
    conn_close(c, "output buffer full");
    return;
  }
  struct wreq *w = malloc(sizeof *w + len);
  if (!w) {
    conn_close(c, "out of memory");
    return;
  }
  memcpy(w->data, data, len);
  w->len = len;
  uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
  if (uv_write(&w->req, st, &b, 1, on_write_done) != 0) {
    free(w);
    conn_close(c, "write failed");
  }
}

static void conn_printf(struct ll_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_printf(struct ll_conn *c, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  if ((size_t)k >= sizeof buf) k = sizeof buf - 1, buf[k - 1] = '\n';
  conn_send(c, buf, (size_t)k);
}

static void send_err(struct ll_conn *c, const char *id, const char *code, const char *msg) {
  char e[1024];
  size_t n = strlen(msg);
  if (n > 240) n = 240;
  size_t k = ll_proto_escape(msg, n, 0, e, sizeof e - 1);
  e[k] = 0;
  c->srv->errors_total++;
  conn_printf(c, "ERR %s %s :%s\n", id ? id : "-", code, e);
}

// After QUIT or EOF: once the last in-flight request has had its final line, say BYE (QUIT)
// and close after the output drains.
static void conn_finish_if_done(struct ll_conn *c) {
  if (c->closing || c->draining || c->n_inflight > 0 || !(c->quit || c->eof)) return;
  if (c->quit) conn_printf(c, "BYE %s\n", c->quit_id);
  conn_drain_close(c);
}

// ---- in-flight ids ----

static int inflight_has(struct ll_conn *c, const char *id) {
  for (struct inflight *f = c->inflight; f; f = f->next)
    if (strcmp(f->id, id) == 0) return 1;
  return 0;
}

static void inflight_remove(struct ll_conn *c, const char *id) {
  for (struct inflight **pp = &c->inflight; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->id, id) == 0) {
      struct inflight *f = *pp;
      *pp = f->next;
      free(f);
      c->n_inflight--;
      return;
    }
  }
}

// ---- commands ----


// Testing aids: LL_NET_FAULT=oom makes the in-flight record's allocation fail, to exercise the
// out-of-memory answer (the request is freed; its id must have been used before);
// LL_NET_FAULT=refuse has every request refused as the scheduler does once shutting down.
static int net_fault(const char *what) {
  const char *f = getenv("LL_NET_FAULT");
  return f && strcmp(f, what) == 0;
}
static int net_fault_oom(void) { return net_fault("oom"); }

static int hand_off(struct ll_conn *c, struct ll_sched_req *r) {
  struct inflight *f = net_fault_oom() ? NULL : malloc(sizeof *f);
  if (!f) {
    send_err(c, r->id, "internal", "out of memory");
    ll_sched_req_free(r);
    return LL_ENOMEM;
  }
  snprintf(f->id, sizeof f->id, "%s", r->id);
  f->next = c->inflight;
  c->inflight = f;
  c->n_inflight++;
  ll_net_submit(c->srv, r);
  return 0;
}

// Sampling / generation options of GEN and CHAT, by the parameter table (request.c).
// Returns 0 or sends ERR and returns < 0.
static int parse_gen(struct ll_conn *c, const struct ll_proto_req *q, struct ll_sched_req *r, const char *id) {
  const struct ll_config *cfg = c->srv->cfg;
  char msg[256];
  ll_gen_defaults(r, cfg->default_max_tokens);
  for (int i = 0; i < q->n_params; i++) {
    const struct ll_proto_param *p = &q->params[i];
    if (!strcmp(p->key, "id")) continue;
    const struct ll_gen_param *g = ll_gen_param_find(p->key);
    int64_t iv;
    double fv;
    int bv, rc = 0;
    if (!g) {
      rc = ll_errf(msg, sizeof msg, LL_EINVAL, "unknown parameter '%s' for %s", p->key, q->verb);
    } else if (g->type == LL_GEN_INT) {
      if ((rc = ll_proto_int(p, g->imin, g->imax < 0 ? cfg->max_tokens : g->imax, &iv, msg, sizeof msg)) == 0) ll_gen_set_int(r, g, iv);
    } else if (g->type == LL_GEN_FLOAT) {
      if ((rc = ll_proto_float(p, g->fmin, g->fmax, &fv, msg, sizeof msg)) == 0) ll_gen_set_float(r, g, fv);
    } else if (g->type == LL_GEN_BOOL) {
      if ((rc = ll_proto_bool(p, &bv, msg, sizeof msg)) == 0) ll_gen_set_int(r, g, bv);
    } else if (g->type == LL_GEN_NAME) {
      rc = ll_proto_name(p, r->adapter, sizeof r->adapter, msg, sizeof msg);
    } else {
      rc = ll_gen_set_str(r, g, p->val, p->val_len, msg, sizeof msg);
    }
    if (rc != 0) {
      send_err(c, id, "bad_param", msg);
      return -1;
    }
  }
  return 0;
}

static void next_id(struct ll_conn *c, char *out, size_t cap) {
  do snprintf(out, cap, "s%llu", (unsigned long long)++c->auto_id);
  while (inflight_has(c, out));
}

static void fmt_stats(struct ll_server *s, char *buf, size_t cap) {
  struct ll_sched_stats st;
  ll_sched_get_stats(s->sched, &st);
  snprintf(buf, cap,
           "clients=%d active=%d queued=%d inflight=%d requests_total=%llu requests_done=%llu tokens_generated=%llu tokens_prefilled=%llu "
           "decode_tps=%.1f prefill_tps=%.1f kv_blocks_used=%d kv_blocks_total=%d host_rss=%lld uptime_s=%.1f",
           s->n_conns, st.active, st.queued, s->outstanding, (unsigned long long)st.requests_total, (unsigned long long)st.requests_done,
           (unsigned long long)st.tokens_generated, (unsigned long long)st.tokens_prefilled, st.decode_tps, st.prefill_tps,
           st.kv_blocks_used, s->info.kv_blocks_total, (long long)ll_host_rss_bytes(), (now_ms(s) - s->t_start) / 1000.0);
}

static void esc_value(const char *v, char *out, size_t cap) {
  size_t k = ll_proto_escape(v, strlen(v), 1, out, cap - 1);
  out[k < cap ? k : cap - 1] = 0;
}

static void verbs_help(char *out, size_t cap);

static void cmd_ping(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  if (q->id) conn_printf(c, "PONG %s\n", q->id);
  else conn_send(c, "PONG\n", 5);
}

static void cmd_auth(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  struct ll_server *s = c->srv;
  const struct ll_proto_param *tp = ll_proto_find(q, "token");
  const char *tok = q->has_text ? q->text : tp ? tp->val : NULL;
  size_t tlen = q->has_text ? q->text_len : tp ? tp->val_len : 0;
  const char *want = s->cfg->auth_token;
  if (!want) {
    conn_printf(c, "OK %s :no token needed\n", id);
    return;
  }
  // Constant time over the expected token's length; the length itself is not secret-sensitive
  // beyond what timing of the network reveals anyway.
  size_t wl = strlen(want);
  unsigned char diff = (unsigned char)(tlen != wl);
  for (size_t i = 0; i < wl; i++) diff |= (unsigned char)(want[i] ^ (tok && i < tlen ? tok[i] : 0));
  if (diff || !tok) {
    ll_log(LL_LOG_WARN, "client %s: AUTH failed", c->peer); // never the token itself
    send_err(c, q->id, "auth_failed", "wrong token");
    conn_drain_close(c);
    return;
  }
  c->authed = 1;
  conn_printf(c, "OK %s\n", id);
}

static void cmd_quit(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  (void)q;
  // Answers still being generated are delivered first (pipelined `nc` use), then BYE.
  c->quit = 1;
  snprintf(c->quit_id, sizeof c->quit_id, "%s", id);
  uv_read_stop((uv_stream_t *)&c->h);
  conn_finish_if_done(c);
}

static void cmd_help(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  (void)q;
  char help[256];
  verbs_help(help, sizeof help);
  conn_printf(c, "HELP %s :%s\n", id, help);
}

static void cmd_info(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  struct ll_server *s = c->srv;
  (void)q;
  const struct ll_engine_info *in = &s->info;
  const struct ll_tokenizer *tk = ll_engine_tokenizer(s->e);
  const char *ct = tk ? ll_sched_chat_template(s->sched) : NULL;
  const char *tmpl = ll_chat_builtin(ct) ? ll_chat_builtin(ct) : ll_chat_detect(ct);
  char name[400], dev[400], path[1100];
  esc_value(in->name, name, sizeof name);
  esc_value(in->device_name, dev, sizeof dev);
  esc_value(s->model_path, path, sizeof path);
  conn_printf(c,
              "INFO %s name=%s arch=%s quant=%s params=%lld n_vocab=%d n_ctx=%d n_ctx_train=%d n_embd=%d n_layer=%d n_head=%d "
              "n_head_kv=%d parallel=%d threads=%d backend=%s device=%s weights_bytes=%lld kv_bytes=%lld tokenizer=%d "
              "chat_template=%s max_tokens=%lld version=%s path=%s\n",
              id, name, in->arch, in->quant, (long long)in->n_params, in->n_vocab, in->n_ctx, in->n_ctx_train, in->n_embd,
              in->n_layer, in->n_head, in->n_head_kv, in->n_parallel, in->n_threads, in->backend, dev, (long long)in->weight_bytes,
              (long long)in->kv_bytes, tk != NULL, tmpl ? tmpl : "none", (long long)s->cfg->max_tokens, LL_VERSION, path);
}

static void cmd_stats(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  struct ll_server *s = c->srv;
  (void)q;
  char b[1024];
  fmt_stats(s, b, sizeof b);
  conn_printf(c, "STATS %s %s\n", id, b);
}

static void cmd_cancel(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  struct ll_server *s = c->srv;
  char msg[512];
  const struct ll_proto_param *t = ll_proto_find(q, "req");
  for (int i = 0; i < q->n_params; i++)
    if (strcmp(q->params[i].key, "id") && strcmp(q->params[i].key, "req")) {
      snprintf(msg, sizeof msg, "unknown parameter '%s' for CANCEL", q->params[i].key);
      send_err(c, q->id, "bad_param", msg);
      return;
    }
  if (!t && !q->has_text) {
    send_err(c, q->id, "bad_param", "CANCEL needs req=ID (or :all)");
    return;
  }
  if (!t && q->text_len == 3 && !memcmp(q->text, "all", 3)) {
    int n = c->n_inflight;
    if (n) ll_net_cancel(s, c->uid, NULL);
    conn_printf(c, "OK %s cancelled=%d\n", id, n);
    return;
  }
  const char *target = t ? t->val : q->text;
  if (!inflight_has(c, target)) {
    snprintf(msg, sizeof msg, "no request '%.64s' in flight on this connection", target);
    send_err(c, q->id, "not_found", msg);
    return;
  }
  ll_net_cancel(s, c->uid, target);
  conn_printf(c, "OK %s cancelled=1\n", id);
}

static void cmd_work(struct ll_conn *c, const struct ll_proto_req *q, const char *id) {
  struct ll_server *s = c->srv;
  const char *v = q->verb;
  char msg[512];
  int is_gen = v[0] == 'G' || v[0] == 'C';
  if (s->shutting_down) {
    send_err(c, q->id, "shutdown", "the server is shutting down");
    return;
  }
  if (q->id && inflight_has(c, q->id)) {
    snprintf(msg, sizeof msg, "request '%s' is still in flight on this connection", q->id);
    send_err(c, q->id, "duplicate_id", msg);
    return;
  }
  if (!q->has_text) {
    snprintf(msg, sizeof msg, "%s needs its text after ' :'", v);
    send_err(c, q->id, "bad_request", msg);
    return;
  }
  if (s->outstanding >= s->cfg->parallel + s->cfg->max_queued || c->n_inflight >= MAX_INFLIGHT_PER_CONN) {
    snprintf(msg, sizeof msg, "queue full (%d requests active or queued; max_queued=%lld)", s->outstanding, (long long)s->cfg->max_queued);
    send_err(c, q->id, "busy", msg);
    return;
  }
  struct ll_sched_req *r = calloc(1, sizeof *r);
  if (!r) {
    send_err(c, q->id, "internal", "out of memory");
    return;
  }
  if (q->id) snprintf(r->id, sizeof r->id, "%s", q->id);
  else next_id(c, r->id, sizeof r->id);
  r->conn = c->uid;
  r->kind = v[0] == 'G' ? LL_REQ_GEN : v[0] == 'C' ? LL_REQ_CHAT : v[0] == 'T' ? LL_REQ_TOKENIZE : LL_REQ_DETOKENIZE;
  if (is_gen) {
    if (parse_gen(c, q, r, q->id) != 0) {
      ll_sched_req_free(r);
      return;
    }
  } else {
    r->add_bos = 0;
    r->special = 0;
    for (int i = 0; i < q->n_params; i++) {
      const struct ll_proto_param *p = &q->params[i];
      int bv = 0, rc = 0;
      if (!strcmp(p->key, "id")) continue;
      if (!strcmp(p->key, "add_bos")) rc = ll_proto_bool(p, &bv, msg, sizeof msg), r->add_bos = bv;
      else if (!strcmp(p->key, "special")) rc = ll_proto_bool(p, &bv, msg, sizeof msg), r->special = bv;
      else rc = ll_errf(msg, sizeof msg, LL_EINVAL, "unknown parameter '%s' for %s", p->key, v);
      if (rc) {
        send_err(c, q->id, "bad_param", msg);
        ll_sched_req_free(r);
        return;
      }
    }
  }
  r->text = malloc(q->text_len + 1);
  if (!r->text) {
    send_err(c, q->id, "internal", "out of memory");
    ll_sched_req_free(r);
    return;
  }
  memcpy(r->text, q->text, q->text_len);
  r->text[q->text_len] = 0;
  r->text_len = q->text_len;
  hand_off(c, r);
}

// The verbs, one row each; HELP lists them in this order. before_auth: allowed before AUTH.
typedef void (*verb_fn)(struct ll_conn *c, const struct ll_proto_req *q, const char *id);
static const struct verb {
  const char *name;
  verb_fn fn;
  int before_auth;
} k_verbs[] = {
    {"GEN", cmd_work, 0},        {"CHAT", cmd_work, 0},  {"CANCEL", cmd_cancel, 0}, {"TOKENIZE", cmd_work, 0},
    {"DETOKENIZE", cmd_work, 0}, {"INFO", cmd_info, 0},  {"STATS", cmd_stats, 0},   {"PING", cmd_ping, 0},
    {"QUIT", cmd_quit, 1},       {"AUTH", cmd_auth, 1},  {"HELP", cmd_help, 0},     {NULL, NULL, 0},
};

// "GEN CHAT ... HELP (man 7 llsrv-protocol)"
static void verbs_help(char *out, size_t cap) {
  size_t k = 0;
  for (const struct verb *vb = k_verbs; vb->name && k < cap; vb++) k += (size_t)snprintf(out + k, cap - k, "%s ", vb->name);
  if (k < cap) snprintf(out + k, cap - k, "(man 7 llsrv-protocol)");
}

static void handle_line(struct ll_conn *c, char *line, size_t len) {
  struct ll_server *s = c->srv;
  struct ll_proto_req q;
  const char *code;
  char msg[512];
  s->lines_total++;
  if (ll_proto_parse(line, len, &q, &code, msg, sizeof msg) != 0) {
    if (len == 0 || (len == 1 && line[0] == '\r')) return; // empty lines are ignored (nc, telnet)
    send_err(c, "-", code, msg);
    return;
  }
  const struct verb *vb = k_verbs;
  while (vb->name && strcmp(vb->name, q.verb) != 0) vb++;
  if (s->cfg->auth_token && !c->authed && !vb->before_auth) {
    send_err(c, q.id, "auth_required", "send AUTH :TOKEN first");
    return;
  }
  if (vb->fn) {
    vb->fn(c, &q, q.id ? q.id : "-");
    return;
  }
  char vname[64];
  esc_value(q.verb, vname, sizeof vname);
  snprintf(msg, sizeof msg, "unknown command '%s' (try HELP)", vname);
  send_err(c, "-", "unknown_command", msg);
}

// ---- reading ----

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  struct ll_conn *c = h->data;
  size_t limit = (size_t)c->srv->cfg->max_line + 2; // a full line + its '\n' (+ '\r')
  if (c->in_cap - c->in_len < READ_CHUNK && c->in_cap < limit + 1) {
    size_t nc = c->in_cap ? c->in_cap * 2 : READ_CHUNK;
    if (nc > limit + 1) nc = limit + 1;
    if (nc < c->in_len + 1024) nc = c->in_len + 1024;
    char *p = realloc(c->in, nc);
    if (p) c->in = p, c->in_cap = nc;
  }
  // Keep one byte spare: the parser may write a NUL at line[len].
  size_t room = c->in_cap > c->in_len + 1 ? c->in_cap - c->in_len - 1 : 0;
  *buf = uv_buf_init(room ? c->in + c->in_len : NULL, (unsigned)room);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  struct ll_conn *c = st->data;
  struct ll_server *s = c->srv;
  if (n == UV_ENOBUFS) { // no room left although no newline
    if (c->in_len <= (size_t)s->cfg->max_line) {
      // The buffer could not grow (out of memory) below max_line: answer instead of being
      // called again and again with no room.
      send_err(c, "-", "internal", "out of memory for the input line; closing");
      conn_drain_close(c);
      return;
    }
    n = 0; // the line is too long: handled below
  } else if (n == UV_EOF && c->n_inflight > 0) {
    // Half-close after sending requests (nc -N, scripts): answer them, then close. A peer
    // that is really gone makes the next write fail, which cancels its requests.
    c->eof = 1;
    uv_read_stop(st);
    return;
  } else if (n < 0) {
    conn_close(c, n == UV_EOF ? "peer closed" : uv_strerror((int)n));
    return;
  }
  if (n == 0 && c->in_len + 1 < c->in_cap) return;
  double t = now_ms(s);
  c->last_activity = t;
  if (c->in_len == 0 && n > 0) c->line_started = t;
  c->in_len += (size_t)n;
  size_t start = 0;
  for (size_t i = c->scanned; i < c->in_len; i++) {
    if (c->in[i] != '\n') continue;
    size_t len = i - start;
    if (len > (size_t)s->cfg->max_line) goto too_long;
    handle_line(c, c->in + start, len);
    start = i + 1;
    if (c->closing || c->draining) return;
    if (c->quit) { // what follows QUIT is not read
      c->in_len = 0;
      return;
    }
    c->line_started = t;
  }
  if (start > 0) {
    memmove(c->in, c->in + start, c->in_len - start);
    c->in_len -= start;
  }
  c->scanned = c->in_len;
  if (c->in_len > (size_t)s->cfg->max_line) goto too_long;
  return;
too_long: {
  char m[128];
  snprintf(m, sizeof m, "line longer than max_line=%lld bytes; closing", (long long)s->cfg->max_line);
  send_err(c, "-", "too_long", m);
  conn_drain_close(c);
}
}

// ---- handing requests to the scheduler (ll_net_submit) ----

// A refused request's final ERROR event, queued in sub_failed for the check (never delivered
// from here: a cancel that flushes may run inside a protocol's callback).
static void submit_refused(struct ll_server *s, const struct ll_sub *p, int rc) {
  const char *msg = rc == LL_ESTATE ? "the server is shutting down" : "cannot queue the request";
  size_t n = strlen(msg);
  struct ll_sched_ev *ev = calloc(1, sizeof *ev + n + 1);
  if (!ev) { // no memory even for the answer: at least the count stays right
    ll_log(LL_LOG_ERROR, "request %s: refused by the scheduler (%s) and not answered: out of memory", p->id, ll_strerror(rc));
    s->outstanding--;
    return;
  }
  ev->type = LL_EV_ERROR;
  ev->final = 1;
  ev->conn = p->conn;
  memcpy(ev->id, p->id, sizeof ev->id);
  ev->code = rc == LL_ESTATE ? "shutdown" : "internal";
  memcpy(ev->data, msg, n + 1);
  ev->len = n;
  struct ll_sched_ev **tail = &s->sub_failed; // in order: a connection's answers keep their order
  while (*tail) tail = &(*tail)->next;
  *tail = ev;
}

// Requests to the scheduler under one lock and one wake-up (64 at a time).
static void submit_batch(struct ll_server *s, const struct ll_sub *subs, int n_subs) {
  struct ll_sched_req *rs[64];
  int rc[64];
  for (int i0 = 0; i0 < n_subs; i0 += 64) {
    int n = n_subs - i0 < 64 ? n_subs - i0 : 64;
    for (int i = 0; i < n; i++) rs[i] = subs[i0 + i].r;
    if (net_fault("refuse")) {
      for (int i = 0; i < n; i++) ll_sched_req_free(rs[i]), rc[i] = LL_ESTATE;
    } else {
      ll_sched_submit_many(s->sched, rs, n, rc); // owns them from here, also on error
    }
    for (int i = 0; i < n; i++)
      if (rc[i]) submit_refused(s, &subs[i0 + i], rc[i]);
  }
}

static void submit_flush(struct ll_server *s) {
  int n = s->n_sub;
  s->n_sub = 0;
  submit_batch(s, s->sub, n);
}

// The end of a loop iteration (libuv runs check handles right after polling for I/O): the
// iteration's requests go to the scheduler together, then the refusals' answers go out.
static void on_submit_check(uv_check_t *h) {
  struct ll_server *s = h->data;
  submit_flush(s);
  uv_check_stop(h);
  if (!s->sub_failed) return;
  while (s->sub_failed) {
    struct ll_sched_ev *ev = s->sub_failed;
    s->sub_failed = ev->next;
    ev->next = NULL;
    if (ll_http_is_uid(ev->conn)) {
      ll_http_on_event(s, ev);
    } else {
      s->errors_total++;
      ll_net_on_event(s, ev);
    }
  }
  // Refusals come while shutting down: the loop's async callback is where the shutdown goes on
  // once nothing is outstanding (server.c); its wake-up may have come before these answers.
  if (s->shutting_down == 1) uv_async_send(&s->async);
}

void ll_net_submit(struct ll_server *s, struct ll_sched_req *r) {
  s->outstanding++;
  struct ll_sub one = {.r = r, .conn = r->conn};
  snprintf(one.id, sizeof one.id, "%s", r->id);
  if (s->n_sub == s->cap_sub) {
    int nc = s->cap_sub ? s->cap_sub * 2 : 64;
    struct ll_sub *q = s->submit_ready ? realloc(s->sub, (size_t)nc * sizeof *q) : NULL;
    if (q) s->sub = q, s->cap_sub = nc;
  }
  if (s->n_sub == s->cap_sub) { // no check handle yet, or no memory to wait in: now, in order
    submit_flush(s);
    submit_batch(s, &one, 1);
  } else {
    s->sub[s->n_sub++] = one;
  }
  // Also for a refusal of the line above: its answer goes out from the check.
  if (s->submit_ready && (s->n_sub || s->sub_failed)) uv_check_start(&s->submit_check, on_submit_check);
}

void ll_net_cancel(struct ll_server *s, uint64_t uid, const char *id) {
  submit_flush(s);
  ll_sched_cancel(s->sched, uid, id);
}

// ---- accepting ----

static void on_connection(uv_stream_t *server, int status) {
  struct ll_server *s = server->data;
  if (status < 0) {
    ll_log(LL_LOG_WARN, "accept: %s", uv_strerror(status));
    return;
  }
  struct ll_conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = s;
  uv_tcp_init(s->loop, &c->h);
  c->h.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->h) != 0) {
    c->slot = -1;
    uv_close((uv_handle_t *)&c->h, (uv_close_cb)free);
    return;
  }
  struct sockaddr_storage ss;
  int sl = sizeof ss;
  snprintf(c->peer, sizeof c->peer, "?");
  if (uv_tcp_getpeername(&c->h, (struct sockaddr *)&ss, &sl) == 0) {
    char host[48] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host), port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6) uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof host), port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
  }
  int slot = -1;
  if (s->n_conns < s->cfg->max_clients && !s->shutting_down)
    for (int i = 0; i < s->cfg->max_clients; i++)
      if (!s->conns[i]) {
        slot = i;
        break;
      }
  s->conns_total++;
  if (slot < 0) {
    // Tell the client why, then close (best effort; not counted as a connection).
    static const char busy[] = "ERR - busy :too many clients\n";
    uv_buf_t b = uv_buf_init((char *)busy, sizeof busy - 1);
    uv_try_write((uv_stream_t *)&c->h, &b, 1);
    c->slot = -1;
    uv_close((uv_handle_t *)&c->h, (uv_close_cb)free);
    return;
  }
  c->slot = slot;
  c->uid = (uint64_t)(uint32_t)slot | ((uint64_t)++s->conn_gen << 32);
  s->conns[slot] = c;
  s->n_conns++;
  c->last_activity = now_ms(s);
  uv_tcp_nodelay(&c->h, 1);
  uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
}

int ll_net_host_is_loopback(const char *host) {
  struct in_addr a4;
  struct in6_addr a6;
  if (!strcmp(host, "localhost")) return 1;
  if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return 0;
}

int ll_net_parse_listen(const char *spec, char *host, size_t hostcap, int *port, char *err, size_t errlen) {
  const char *colon = strrchr(spec, ':');
  if (!colon) return ll_errf(err, errlen, LL_EINVAL, "listen '%s': expected HOST:PORT", spec);
  const char *h = spec;
  size_t hl = (size_t)(colon - spec);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h++, hl -= 2; // [::1]:8478
  if (hl == 0 || hl >= hostcap) return ll_errf(err, errlen, LL_EINVAL, "listen '%s': bad host", spec);
  memcpy(host, h, hl);
  host[hl] = 0;
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (*end || colon[1] == 0 || errno || p < 0 || p > 65535) return ll_errf(err, errlen, LL_EINVAL, "listen '%s': port must be 0..65535", spec);
  *port = (int)p;
  return 0;
}

int ll_net_start(struct ll_server *s, char *err, size_t errlen) {
  const char *spec = s->cfg->listen;
  s->conns = calloc((size_t)s->cfg->max_clients, sizeof *s->conns);
  if (!s->conns) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  uv_check_init(s->loop, &s->submit_check); // closed by ll_server_close's walk
  s->submit_check.data = s;
  s->submit_ready = 1;
  if (!spec || !*spec || !strcmp(spec, "off")) return 0;
  char host[100];
  int port;
  int rc = ll_net_parse_listen(spec, host, sizeof host, &port, err, errlen);
  if (rc) return rc;
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  struct sockaddr_storage ss;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 && uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
    return ll_errf(err, errlen, LL_EINVAL, "listen '%s': '%s' is not an IP address", spec, host);
  uv_tcp_init(s->loop, &s->tcp);
  s->tcp.data = s;
  s->tcp_open = 1;
  int r = uv_tcp_bind(&s->tcp, (struct sockaddr *)&ss, 0);
  if (r == 0) r = uv_listen((uv_stream_t *)&s->tcp, 511, on_connection);
  if (r != 0) return ll_errf(err, errlen, LL_EIO, "listen %s: %s", spec, uv_strerror(r));
  int sl = sizeof ss;
  uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&ss, &sl);
  char name[64] = "?";
  if (ss.ss_family == AF_INET) {
    uv_ip4_name((struct sockaddr_in *)&ss, name, sizeof name);
    snprintf(s->listen_addr, sizeof s->listen_addr, "%s:%d", name, ntohs(((struct sockaddr_in *)&ss)->sin_port));
  } else {
    uv_ip6_name((struct sockaddr_in6 *)&ss, name, sizeof name);
    snprintf(s->listen_addr, sizeof s->listen_addr, "[%s]:%d", name, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
  }
  return 0;
}

void ll_net_on_event(struct ll_server *s, struct ll_sched_ev *o) {
  uint32_t slot = (uint32_t)(o->conn & 0xffffffffu);
  struct ll_conn *c = slot < (uint32_t)s->cfg->max_clients ? s->conns[slot] : NULL;
  if (c && c->uid != o->conn) c = NULL;
  if (o->final) {
    s->outstanding--;
    if (c) inflight_remove(c, o->id);
  }
  if (c && !c->closing) {
    char buf[4096];
    size_t n = ll_proto_encode_event(o, buf, sizeof buf);
    if (n <= sizeof buf) {
      conn_send(c, buf, n);
    } else {
      char *big = malloc(n);
      if (big) ll_proto_encode_event(o, big, n), conn_send(c, big, n);
      else conn_close(c, "out of memory");
      free(big);
    }
  }
  if (c && o->final) conn_finish_if_done(c);
  free(o);
}

const char *ll_net_peer(struct ll_server *s, uint64_t uid) {
  uint32_t slot = (uint32_t)(uid & 0xffffffffu);
  struct ll_conn *c = slot < (uint32_t)s->cfg->max_clients ? s->conns[slot] : NULL;
  return c && c->uid == uid ? c->peer : NULL;
}

void ll_net_tick(struct ll_server *s) {
  double t = now_ms(s);
  const double idle = s->cfg->idle_timeout * 1000.0, line = s->cfg->line_timeout * 1000.0;
  for (int i = 0; i < s->cfg->max_clients; i++) {
    struct ll_conn *c = s->conns[i];
    if (!c || c->closing) continue;
    if (c->draining) { // a peer that does not read never lets the shutdown complete
      if (t - c->drain_started > 5000.0) conn_close(c, "drain timeout");
      continue;
    }
    if (c->in_len > 0 && t - c->line_started > line) {
      send_err(c, "-", "timeout", "line not completed in time (line_timeout); closing");
      conn_drain_close(c);
    } else if (c->n_inflight == 0 && c->in_len == 0 && !c->quit && !c->eof && t - c->last_activity > idle) {
      send_err(c, "-", "timeout", "idle too long (idle_timeout); closing");
      conn_drain_close(c);
    }
  }
}

void ll_net_shutdown(struct ll_server *s) {
  if (s->tcp_open) {
    s->tcp_open = 0;
    uv_close((uv_handle_t *)&s->tcp, NULL);
  }
}

void ll_net_close_all(struct ll_server *s) {
  for (int i = 0; i < s->cfg->max_clients; i++)
    if (s->conns[i]) conn_drain_close(s->conns[i]);
}

void ll_net_force_close_all(struct ll_server *s) {
  ll_net_shutdown(s);
  for (int i = 0; i < s->cfg->max_clients; i++)
    if (s->conns[i]) conn_close(s->conns[i], "server stopping");
  // What never reached the scheduler (the loop stopped in between): nobody waits for it now.
  for (int i = 0; i < s->n_sub; i++) ll_sched_req_free(s->sub[i].r);
  s->n_sub = 0;
  free(s->sub);
  s->sub = NULL;
  s->cap_sub = 0;
  while (s->sub_failed) {
    struct ll_sched_ev *ev = s->sub_failed;
    s->sub_failed = ev->next;
    free(ev);
  }
}
