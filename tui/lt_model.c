// lt_model.c - the monitor line parser (one JSON line -> struct lt_msg with known flags), the
// sanitizer every server string goes through, and the model lltop draws from. Lenient by
// field (a missing, null or ill-typed field is unknown, not an error: a newer server may add
// or change fields), strict by line (bad JSON or a line that is not a typed object is refused
// with a reason, and nothing of it is used).
#include "lt_model.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"

// ---- sanitizing ----

// Length of the valid UTF-8 sequence at s (n bytes left) and its code point, or 0 if invalid.
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned c = s[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) return *cp = c, 1;
  if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

// Characters that must never reach a terminal: C0, DEL, C1 (0x80-0x9F: CSI, OSC, ... in
// 8-bit form), and the bidirectional overrides/isolates that reorder what follows them.
static int dangerous(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF;
}

size_t lt_sanitize(const char *s, size_t n, char *out, size_t cap) {
  if (cap == 0) return 0;
  size_t o = 0, i = 0;
  while (i < n) {
    uint32_t cp;
    size_t k = utf8_seq((const unsigned char *)s + i, n - i, &cp);
    const char *src = s + i;
    if (k == 0 || dangerous(cp)) {
      src = "?";
      k = k ? k : 1;
      if (o + 1 >= cap) break;
      out[o++] = '?';
      i += k;
      continue;
    }
    if (o + k >= cap) break; // cut at a character boundary
    memcpy(out + o, src, k);
    o += k;
    i += k;
  }
  out[o] = 0;
  return o;
}

// ---- field readers ----

static struct lt_num num(json_t *o, const char *key) {
  struct lt_num r = {0, 0};
  json_t *v = json_object_get(o, key);
  if (json_is_integer(v)) r.v = (double)json_integer_value(v), r.known = 1;
  else if (json_is_real(v)) r.v = json_real_value(v), r.known = 1;
  if (r.known && !isfinite(r.v)) r.known = 0, r.v = 0;
  return r;
}

static struct lt_str str(json_t *o, const char *key) {
  struct lt_str r;
  r.s[0] = 0;
  r.known = 0;
  json_t *v = json_object_get(o, key);
  if (json_is_string(v)) {
    lt_sanitize(json_string_value(v), json_string_length(v), r.s, sizeof r.s);
    r.known = 1;
  }
  return r;
}

static void parse_snapshot(json_t *root, struct lt_snapshot *s) {
  memset(s, 0, sizeof *s);
  s->time = num(root, "time");
  s->uptime_s = num(root, "uptime_s");
  s->pid = num(root, "pid");
  s->version = str(root, "version");
  json_t *d = json_object_get(root, "device");
  s->dev_name = str(d, "name");
  s->dev_type = str(d, "type");
  s->dev_backend = str(d, "backend");
  s->dev_reason = str(d, "reason");
  s->dev_cu = num(d, "compute_units");
  s->dev_threads = num(d, "threads");
  json_t *m = json_object_get(root, "memory");
  s->mem_dev_total = num(m, "device_total");
  s->mem_dev_used = num(m, "device_used");
  s->mem_host_rss = num(m, "host_rss");
  s->mem_host_total = num(m, "host_total");
  s->mem_weights = num(m, "weights");
  s->mem_kv = num(m, "kv_bytes");
  s->mem_train = num(m, "train_bytes");
  s->kv_used = num(m, "kv_blocks_used");
  s->kv_total = num(m, "kv_blocks_total");
  json_t *md = json_object_get(root, "model");
  s->model_name = str(md, "name");
  s->model_path = str(md, "path");
  s->model_arch = str(md, "arch");
  s->model_quant = str(md, "quant");
  s->model_params = num(md, "n_params");
  s->model_ctx = num(md, "n_ctx");
  s->model_vocab = num(md, "n_vocab");
  json_t *sv = json_object_get(root, "serving");
  s->listen = str(sv, "listen");
  s->clients = num(sv, "clients");
  s->active = num(sv, "active");
  s->queued = num(sv, "queued");
  s->parallel = num(sv, "parallel");
  s->req_total = num(sv, "requests_total");
  s->req_done = num(sv, "requests_done");
  s->tok_gen = num(sv, "tokens_generated");
  s->tok_prefill = num(sv, "tokens_prefilled");
  s->decode_tps = num(sv, "decode_tps");
  s->prefill_tps = num(sv, "prefill_tps");
  s->clients_dropped = num(sv, "clients_dropped");
  json_t *rq = json_object_get(sv, "requests");
  if (json_is_array(rq)) {
    s->reqs_known = 1;
    size_t n = json_array_size(rq);
    for (size_t i = 0; i < n; i++) {
      json_t *r = json_array_get(rq, i);
      if (!json_is_object(r)) continue;
      if (s->n_reqs == LT_MAX_REQS) {
        s->reqs_cut = 1;
        break;
      }
      struct lt_req *q = &s->reqs[s->n_reqs++];
      q->id = str(r, "id");
      q->state = str(r, "state");
      q->client = str(r, "client");
      q->adapter = str(r, "adapter");
      q->prompt_tokens = num(r, "prompt_tokens");
      q->prefilled = num(r, "prefilled");
      q->tokens = num(r, "tokens");
      q->max_tokens = num(r, "max_tokens");
      q->tok_s = num(r, "tok_s");
      q->age_s = num(r, "age_s");
    }
  }
  json_t *t = json_object_get(root, "training");
  s->tr_state = str(t, "state");
  s->tr_checkpoint = str(t, "last_checkpoint");
  s->tr_run_dir = str(t, "run_dir");
  s->tr_backend = str(t, "backend"); // absent from older servers: unknown, not shown
  s->tr_device = str(t, "device");
  s->tr_step = num(t, "step");
  s->tr_total = num(t, "total_steps");
  s->tr_epoch = num(t, "epoch");
  s->tr_loss = num(t, "loss");
  s->tr_val_loss = num(t, "val_loss");
  s->tr_lr = num(t, "lr");
  s->tr_grad_norm = num(t, "grad_norm");
  s->tr_tps = num(t, "tokens_per_s");
  s->tr_eta = num(t, "eta_s");
  s->tr_skipped = num(t, "skipped_steps");
  json_t *h = json_object_get(t, "history");
  if (json_is_array(h)) {
    s->hist_known = 1;
    s->hist_tail = json_is_true(json_object_get(t, "history_tail"));
    size_t n = json_array_size(h);
    for (size_t i = 0; i < n && s->n_hist < LT_MSG_HIST; i++) {
      json_t *p = json_array_get(h, i);
      if (!json_is_array(p) || json_array_size(p) < 2) continue;
      json_t *a = json_array_get(p, 0), *b = json_array_get(p, 1), *c = json_array_get(p, 2);
      if (!json_is_number(a) || !json_is_number(b)) continue;
      struct lt_point pt = {json_number_value(a), json_number_value(b), 0, 0};
      if (json_is_number(c)) pt.val = json_number_value(c), pt.val_known = isfinite(pt.val);
      if (!isfinite(pt.step) || !isfinite(pt.loss)) continue;
      s->hist[s->n_hist++] = pt;
    }
  }
}

static void parse_event(json_t *root, struct lt_msg *m) {
  m->event = str(root, "event");
  m->ev_step = num(root, "step");
  m->ev_loss = num(root, "loss");
  m->ev_val_loss = num(root, "val_loss");
  const char *e = m->event.known ? m->event.s : "?";
  char a[32], b[32], c[32], d[32];
  struct lt_str id = str(root, "id"), reason = str(root, "reason"), peer = str(root, "peer"), path = str(root, "path"),
                msg = str(root, "message");
  if (!strcmp(e, "request_finished")) {
    lt_fmt_int(a, sizeof a, num(root, "prompt_tokens"));
    lt_fmt_int(b, sizeof b, num(root, "tokens"));
    lt_fmt_num(c, sizeof c, num(root, "prefill_ms"), 0);
    lt_fmt_num(d, sizeof d, num(root, "decode_ms"), 0);
    lt_fmt(m->text, sizeof m->text, "request %s finished (%s): %s+%s tokens, prefill %s ms, decode %s ms",
             id.known ? id.s : "N/A", reason.known ? reason.s : "N/A", a, b, c, d);
  } else if (!strcmp(e, "client_dropped")) {
    lt_fmt(m->text, sizeof m->text, "client %s dropped (%s)", peer.known ? peer.s : "N/A", reason.known ? reason.s : "N/A");
  } else if (!strcmp(e, "train_eval") || !strcmp(e, "train_finished")) {
    lt_fmt_int(a, sizeof a, m->ev_step);
    lt_fmt_num(b, sizeof b, m->ev_loss, 4);
    lt_fmt_num(c, sizeof c, m->ev_val_loss, 4);
    lt_fmt(m->text, sizeof m->text, "%s at step %s: loss %s, val loss %s",
             e[6] == 'e' ? "evaluation" : "training finished", a, b, c);
  } else if (!strcmp(e, "checkpoint_saved")) {
    lt_fmt_int(a, sizeof a, m->ev_step);
    lt_fmt(m->text, sizeof m->text, "checkpoint saved at step %s: %s", a, path.known ? path.s : "N/A");
  } else if (!strcmp(e, "nan_skip")) {
    lt_fmt_int(a, sizeof a, m->ev_step);
    lt_fmt(m->text, sizeof m->text, "step %s skipped (non-finite loss or gradient)", a);
  } else if (!strcmp(e, "train_error")) {
    lt_fmt(m->text, sizeof m->text, "training error: %s", msg.known ? msg.s : "N/A");
  } else if (!strcmp(e, "warning")) {
    lt_fmt(m->text, sizeof m->text, "warning: %s", msg.known ? msg.s : "N/A");
  } else {
    lt_fmt(m->text, sizeof m->text, "event %s%s%s", e, msg.known ? ": " : "", msg.known ? msg.s : "");
  }
}

int lt_parse_line(const char *buf, size_t len, struct lt_msg *msg, char *err, size_t errlen) {
  struct lt_snapshot *keep = msg->snap;
  memset(msg, 0, sizeof *msg);
  msg->snap = keep;
  if (len > LT_MAX_LINE) return ll_errf(err, errlen, LL_ELIMIT, "line of %zu bytes is over the %u byte limit", len, LT_MAX_LINE);
  json_error_t je;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    char why[96];
    lt_sanitize(je.text, strnlen(je.text, sizeof je.text), why, sizeof why);
    return ll_errf(err, errlen, LL_EFORMAT, "bad JSON at column %d: %s", je.column, why);
  }
  int rc = 0;
  json_t *type = json_object_get(root, "type");
  if (!json_is_object(root)) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "line is not a JSON object");
  } else if (!json_is_string(type)) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "object has no string \"type\"");
  } else if (!strcmp(json_string_value(type), "snapshot")) {
    if (!msg->snap) rc = ll_errf(err, errlen, LL_EINVAL, "no storage for a snapshot");
    else {
      msg->type = LT_MSG_SNAPSHOT;
      parse_snapshot(root, msg->snap);
    }
  } else if (!strcmp(json_string_value(type), "event")) {
    msg->type = LT_MSG_EVENT;
    parse_event(root, msg);
  } else if (!strcmp(json_string_value(type), "reply")) {
    msg->type = LT_MSG_REPLY;
    msg->command = str(root, "command");
    msg->error = str(root, "error");
    msg->ok = json_is_true(json_object_get(root, "ok"));
  } else {
    char t[40];
    lt_sanitize(json_string_value(type), json_string_length(type), t, sizeof t);
    rc = ll_errf(err, errlen, LL_EFORMAT, "unknown message type \"%s\"", t);
  }
  json_decref(root);
  return rc;
}

// ---- formatting ----

void lt_fmt(char *out, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out, cap, fmt, ap);
  va_end(ap);
}

void lt_fmt_num(char *out, size_t cap, struct lt_num n, int prec) {
  if (!n.known) snprintf(out, cap, "N/A");
  else if (fabs(n.v) >= 1e9 || (n.v != 0 && fabs(n.v) < 1e-3 && prec < 6)) snprintf(out, cap, "%.*g", prec > 0 ? prec : 3, n.v);
  else snprintf(out, cap, "%.*f", prec, n.v);
}

void lt_fmt_int(char *out, size_t cap, struct lt_num n) {
  if (!n.known) snprintf(out, cap, "N/A");
  else if (fabs(n.v) < 1e15) snprintf(out, cap, "%.0f", n.v);
  else snprintf(out, cap, "%.3g", n.v);
}

void lt_fmt_count(char *out, size_t cap, struct lt_num n) {
  static const char *suf[] = {"", "k", "M", "G", "T", "P"};
  if (!n.known) {
    snprintf(out, cap, "N/A");
    return;
  }
  double v = n.v;
  int i = 0;
  while (fabs(v) >= 1000 && i < 5) v /= 1000, i++;
  if (fabs(v) >= 1000) snprintf(out, cap, "%.3g", n.v);
  else if (i == 0) snprintf(out, cap, "%.0f", v);
  else snprintf(out, cap, fabs(v) < 10 ? "%.1f%s" : "%.0f%s", v, suf[i]);
}

void lt_fmt_bytes(char *out, size_t cap, struct lt_num n) {
  static const char *suf[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!n.known) {
    snprintf(out, cap, "N/A");
    return;
  }
  double v = n.v;
  int i = 0;
  while (fabs(v) >= 1024 && i < 5) v /= 1024, i++;
  if (fabs(v) >= 1024) snprintf(out, cap, "%.3gB", n.v);
  else if (i == 0) snprintf(out, cap, "%.0f B", v);
  else snprintf(out, cap, fabs(v) < 10 ? "%.2f %s" : fabs(v) < 100 ? "%.1f %s" : "%.0f %s", v, suf[i]);
}

void lt_fmt_dur(char *out, size_t cap, struct lt_num n) {
  if (!n.known) {
    snprintf(out, cap, "N/A");
    return;
  }
  double v = n.v;
  if (v < 0 || v >= 1e9) snprintf(out, cap, "%.3gs", v);
  else if (v < 60) snprintf(out, cap, "%.0fs", v);
  else if (v < 3600) snprintf(out, cap, "%dm%02ds", (int)(v / 60), (int)v % 60);
  else if (v < 86400) snprintf(out, cap, "%dh%02dm", (int)(v / 3600), (int)(v / 60) % 60);
  else snprintf(out, cap, "%dd%02dh", (int)(v / 86400), (int)(v / 3600) % 24);
}

static const char *S(const struct lt_str *s) { return s->known ? s->s : "N/A"; }

size_t lt_format_text(const struct lt_snapshot *s, char *out, size_t cap) {
  size_t o = 0;
#define P(...)                                                                  \
  do {                                                                          \
    int k_ = snprintf(out + (o < cap ? o : cap), o < cap ? cap - o : 0, __VA_ARGS__); \
    if (k_ > 0) o += (size_t)k_;                                                \
  } while (0)
  char a[32], b[32], c[32], d[32], e[32], f[32], g[32];
  if (cap) out[0] = 0;
  lt_fmt_dur(a, sizeof a, s->uptime_s);
  lt_fmt_int(b, sizeof b, s->pid);
  P("llsrv %s  pid %s  up %s\n", S(&s->version), b, a);
  lt_fmt_count(a, sizeof a, s->model_params);
  lt_fmt_int(b, sizeof b, s->model_ctx);
  lt_fmt_int(c, sizeof c, s->model_vocab);
  P("model     %s (%s, %s params, %s, ctx %s, vocab %s)\n", S(&s->model_name), S(&s->model_arch), a, S(&s->model_quant), b, c);
  lt_fmt_int(a, sizeof a, s->dev_cu);
  lt_fmt_int(b, sizeof b, s->dev_threads);
  P("device    %s (%s, backend %s, %s compute units, %s threads)\n", S(&s->dev_name), S(&s->dev_type), S(&s->dev_backend), a, b);
  lt_fmt_bytes(a, sizeof a, s->mem_dev_used);
  lt_fmt_bytes(b, sizeof b, s->mem_dev_total);
  lt_fmt_bytes(c, sizeof c, s->mem_host_rss);
  lt_fmt_bytes(d, sizeof d, s->mem_weights);
  lt_fmt_bytes(e, sizeof e, s->mem_kv);
  lt_fmt_bytes(f, sizeof f, s->mem_train);
  P("memory    device %s / %s  host rss %s  weights %s  kv %s  train %s\n", a, b, c, d, e, f);
  lt_fmt_int(a, sizeof a, s->clients);
  lt_fmt_int(b, sizeof b, s->active);
  lt_fmt_int(c, sizeof c, s->queued);
  lt_fmt_int(d, sizeof d, s->parallel);
  lt_fmt_int(e, sizeof e, s->kv_used);
  lt_fmt_int(f, sizeof f, s->kv_total);
  P("serving   %s  clients %s  active %s  queued %s  parallel %s  kv blocks %s/%s\n", S(&s->listen), a, b, c, d, e, f);
  lt_fmt_num(a, sizeof a, s->decode_tps, 1);
  lt_fmt_num(b, sizeof b, s->prefill_tps, 1);
  lt_fmt_int(c, sizeof c, s->req_done);
  lt_fmt_int(d, sizeof d, s->req_total);
  lt_fmt_int(e, sizeof e, s->tok_gen);
  P("          decode %s tok/s  prefill %s tok/s  requests %s/%s done  %s tokens generated\n", a, b, c, d, e);
  if (!s->reqs_known) P("requests  N/A\n");
  for (int i = 0; i < s->n_reqs; i++) {
    const struct lt_req *q = &s->reqs[i];
    lt_fmt_int(a, sizeof a, q->prompt_tokens);
    lt_fmt_int(b, sizeof b, q->tokens);
    lt_fmt_int(c, sizeof c, q->max_tokens);
    lt_fmt_num(d, sizeof d, q->tok_s, 1);
    lt_fmt_dur(e, sizeof e, q->age_s);
    P("  request %s  client %s  %s  prompt %s  generated %s/%s  %s tok/s  age %s  adapter %s\n", S(&q->id), S(&q->client),
      S(&q->state), a, b, c, d, e, S(&q->adapter));
  }
  lt_fmt_int(a, sizeof a, s->tr_step);
  lt_fmt_int(b, sizeof b, s->tr_total);
  lt_fmt_num(c, sizeof c, s->tr_epoch, 2);
  lt_fmt_num(d, sizeof d, s->tr_loss, 4);
  lt_fmt_num(e, sizeof e, s->tr_val_loss, 4);
  struct lt_num ppl = {s->tr_loss.known && s->tr_loss.v < 700 ? exp(s->tr_loss.v) : 0, s->tr_loss.known && s->tr_loss.v < 700};
  lt_fmt_num(f, sizeof f, ppl, 2);
  P("training  %s  step %s/%s  epoch %s  loss %s  val loss %s  perplexity %s\n", S(&s->tr_state), a, b, c, d, e, f);
  lt_fmt_num(a, sizeof a, s->tr_lr, 6);
  lt_fmt_num(b, sizeof b, s->tr_grad_norm, 3);
  lt_fmt_int(c, sizeof c, s->tr_skipped);
  lt_fmt_num(d, sizeof d, s->tr_tps, 1);
  lt_fmt_dur(e, sizeof e, s->tr_eta);
  lt_fmt_int(g, sizeof g, (struct lt_num){s->n_hist, s->hist_known});
  P("          lr %s  grad norm %s  skipped %s  %s tok/s  eta %s  last checkpoint %s  history %s points\n", a, b, c, d, e,
    S(&s->tr_checkpoint), g);
  if (s->tr_backend.known) P("          on %s: %s\n", S(&s->tr_backend), S(&s->tr_device)); // where it trains (absent from older servers)
#undef P
  return o;
}

// ---- line assembly ----

void lt_linebuf_init(struct lt_linebuf *lb, size_t max) {
  memset(lb, 0, sizeof *lb);
  lb->max = max;
}

void lt_linebuf_reset(struct lt_linebuf *lb) {
  lb->len = 0;
  lb->discarding = 0;
  lb->discarded = 0;
}

void lt_linebuf_free(struct lt_linebuf *lb) {
  free(lb->buf);
  lb->buf = NULL;
  lb->cap = lb->len = 0;
}

// Appends to the partial line, or switches to discarding when it would pass max.
static int lb_keep(struct lt_linebuf *lb, const char *p, size_t k) {
  if (lb->discarding) {
    lb->discarded += k;
    return 0;
  }
  if (k > lb->max - lb->len) { // len <= max always holds
    lb->discarding = 1;
    lb->discarded = lb->len + k;
    lb->len = 0;
    return 0;
  }
  if (lb->len + k > lb->cap) {
    size_t nc = lb->cap ? lb->cap : 4096;
    while (nc < lb->len + k) nc *= 2;
    if (nc > lb->max) nc = lb->max;
    char *nb = realloc(lb->buf, nc ? nc : 1);
    if (!nb) {
      lb->discarding = 1;
      lb->discarded = lb->len + k;
      lb->len = 0;
      return LL_ENOMEM;
    }
    lb->buf = nb;
    lb->cap = nc;
  }
  memcpy(lb->buf + lb->len, p, k);
  lb->len += k;
  return 0;
}

int lt_linebuf_feed(struct lt_linebuf *lb, const char *data, size_t n, lt_line_fn on_line, lt_long_fn on_long, void *user) {
  int lines = 0, rc = 0;
  size_t start = 0;
  while (start <= n) {
    const char *nl = start < n ? memchr(data + start, '\n', n - start) : NULL;
    size_t part = nl ? (size_t)(nl - (data + start)) : n - start;
    if (!nl) {
      if (part && lb_keep(lb, data + start, part) < 0) rc = LL_ENOMEM;
      break;
    }
    if (lb->discarding) {
      if (on_long) on_long(user, lb->discarded + part);
    } else if (lb->len == 0) { // the whole line is in this chunk: no copy
      if (part <= lb->max) on_line(user, data + start, part);
      else if (on_long) on_long(user, part);
    } else if (lb_keep(lb, data + start, part) < 0) {
      rc = LL_ENOMEM;
      if (on_long) on_long(user, lb->discarded);
    } else if (lb->discarding) {
      if (on_long) on_long(user, lb->discarded);
    } else {
      on_line(user, lb->buf, lb->len);
    }
    lt_linebuf_reset(lb);
    lines++;
    start += part + 1;
  }
  return rc ? rc : lines;
}

// ---- the model ----

void lt_model_init(struct lt_model *m) {
  memset(m, 0, sizeof *m);
  m->pid_seen = -1;
}

void lt_model_add_event(struct lt_model *m, double now, int level, const char *text) {
  struct lt_event *e = &m->ev[m->ev_head];
  e->t = now;
  e->level = level;
  lt_sanitize(text, strlen(text), e->text, sizeof e->text);
  m->ev_head = (m->ev_head + 1) % LT_EVENTS;
  if (m->n_ev < LT_EVENTS) m->n_ev++;
  m->ev_seq++;
}

const struct lt_event *lt_model_event(const struct lt_model *m, int i) {
  if (i < 0 || i >= m->n_ev) return NULL;
  return &m->ev[(m->ev_head - 1 - i + 2 * LT_EVENTS) % LT_EVENTS];
}

static void hist_push(struct lt_model *m, const struct lt_point *p) {
  if (m->n_hist == LT_MAX_HIST) { // the whole run stays, at half the resolution
    int k = 0;
    for (int i = 0; i < m->n_hist; i += 2) m->hist[k++] = m->hist[i];
    m->n_hist = k;
  }
  m->hist[m->n_hist++] = *p;
}

static void merge_history(struct lt_model *m, const struct lt_snapshot *s) {
  if (!s->hist_known) return;
  if (!s->hist_tail) m->n_hist = 0; // a full history replaces ours
  for (int i = 0; i < s->n_hist; i++) {
    const struct lt_point *p = &s->hist[i];
    struct lt_point *last = m->n_hist ? &m->hist[m->n_hist - 1] : NULL;
    if (last && p->step == last->step) {
      *last = *p; // a value may have been filled in since (val loss of that step)
    } else if (!last || p->step > last->step) {
      hist_push(m, p);
    }
  }
  m->hist_gen++;
}

void lt_model_apply(struct lt_model *m, const struct lt_msg *msg, double now) {
  if (msg->type == LT_MSG_SNAPSHOT && msg->snap) {
    const struct lt_snapshot *s = msg->snap;
    if (s->pid.known && s->pid.v != m->pid_seen) { // another server: its own history and rates
      m->n_hist = 0;
      m->rate_n = m->rate_head = 0;
      m->hist_gen++;
      m->pid_seen = s->pid.v;
    }
    if (&m->snap != s) memcpy(&m->snap, s, sizeof *s);
    m->have = 1;
    merge_history(m, s);
    if (m->rate_n == 0 || now - m->rate_last_t >= 1.0 || now < m->rate_last_t) {
      m->rate_dec[m->rate_head] = s->decode_tps.known ? s->decode_tps.v : NAN;
      m->rate_pre[m->rate_head] = s->prefill_tps.known ? s->prefill_tps.v : NAN;
      m->rate_head = (m->rate_head + 1) % LT_RATE_N;
      if (m->rate_n < LT_RATE_N) m->rate_n++;
      m->rate_last_t = now;
    }
  } else if (msg->type == LT_MSG_EVENT) {
    const char *e = msg->event.known ? msg->event.s : "";
    int level = !strcmp(e, "train_error") ? 2 : (!strcmp(e, "warning") || !strcmp(e, "client_dropped") || !strcmp(e, "nan_skip"));
    lt_model_add_event(m, now, level, msg->text);
  } else if (msg->type == LT_MSG_REPLY) {
    const char *c = msg->command.known ? msg->command.s : "?";
    if (msg->ok) lt_fmt(m->reply, sizeof m->reply, "server: %s: ok", c);
    else lt_fmt(m->reply, sizeof m->reply, "server refused %s: %s", c, msg->error.known ? msg->error.s : "(no reason given)");
    m->reply_ok = msg->ok;
    m->have_reply = 1;
    lt_model_add_event(m, now, msg->ok ? 0 : 1, m->reply);
  }
}
