// http.c - the OpenAI-compatible HTTP API (man/llsrv-http.7): a second listener on the same
// libuv loop as the line protocol, HTTP parsed by H2O (libh2o, built with libuv), JSON by
// jansson. It is a thin encoder over the scheduler's request path: a request body becomes a
// struct ll_sched_req (generation parameters from the one table, ll_request.h; chat messages
// go to the same CHAT path the line protocol uses), and the scheduler's structured events come
// back here to be encoded as an OpenAI JSON response or as server-sent events.
//
// Ownership: an HTTP request handed to the scheduler is a struct hreq (malloc'ed, in the
// `reqs` table by slot; its uid names it to the scheduler). It ends when BOTH its final event
// has arrived and H2O has disposed of the h2o_req_t (a shared allocation in the request's pool
// tells us: req_gone). A client that goes away mid-request disposes of the h2o_req_t first:
// the request is cancelled, which frees its sequence before the next step.
//
// Limits (the line protocol's): max_clients connections (more get 503 and a close), bodies up
// to max_line bytes (413), min(idle_timeout, line_timeout) for a request's headers and body and
// for an idle keep-alive connection (H2O's req_timeout), output_buffer bytes of unsent stream
// (then the request is cancelled and the connection closed), parallel + max_queued requests in
// flight (429).
#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <h2o.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ll_chat.h"
#include "ll_error.h"
#include "ll_ftjobs.h"
#include "ll_log.h"
#include "ll_proto.h"
#include "ll_request.h"
#include "ll_server.h"
#include "ll_tokenizer.h"
#include "ll_trainjob.h"

#define HTTP_UID_BIT 0x80000000u // in a uid's slot half: the request is HTTP's, not a line connection's
#define MAX_MESSAGES 4096
#define N_BUCKETS 14

enum hkind { HK_CHAT, HK_COMPLETION, HK_TOKENIZE, HK_DETOKENIZE };

struct buf {
  char *p;
  size_t n, cap;
};

static int buf_add(struct buf *b, const char *p, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->n + n + 1) nc *= 2;
    char *q = realloc(b->p, nc);
    if (!q) return LL_ENOMEM;
    b->p = q, b->cap = nc;
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

static int buf_str(struct buf *b, const char *s) { return buf_add(b, s, strlen(s)); }

struct hreq {
  struct ll_http *http;
  int slot;
  uint64_t uid;
  char id[24];          // the scheduler's request id
  h2o_req_t *req;       // NULL once H2O has disposed of it
  h2o_generator_t gen;  // streaming responses
  enum hkind kind;
  int stream, include_usage, logprobs, top_logprobs;
  int special;          // logprobs' token text renders special tokens
  int reasoning;        // chat, reasoning_format deepseek|auto: "<think>...</think>" -> reasoning_content
  struct ll_chat_reasoning rsplit; // streamed reasoning: the splitter's state
  int with_pieces;      // /tokenize: [{"id","piece"}] instead of ids
  char model[128];
  char cid[48];
  long long created;
  int started;          // a streamed response has begun (status 200 sent)
  int finished;         // the final event has come
  int sending;          // h2o_send called, proceed not yet
  int final_queued;     // the last bytes are in `pend`
  int overflow;         // the client does not read: cancelled, closing
  struct buf text;      // non-streamed: the generated text
  size_t text_off;      // streamed: bytes of text sent so far
  struct buf pend, out; // streamed: bytes waiting for the next proceed / bytes H2O is sending
  json_t *lp;           // logprobs entries not yet sent (chat: array; completions: legacy object)
  char *tpl;            // streamed: a token chunk's JSON but its text (stream_text), the text goes at tpl_at
  size_t tpl_n, tpl_at;
  struct buf esc;       // streamed: a token's text as a JSON string
  double t_start;
};

struct hist {
  double sum;
  uint64_t count;
  uint64_t b[N_BUCKETS];
};

static const double k_buckets[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

struct hconn {
  uv_tcp_t h; // first: H2O's close callback gets this handle
  struct ll_http *http;
  struct hconn *prev, *next;
};

struct ll_http {
  struct ll_server *srv;
  struct hconn *conns;
  int conf_ready;
  int closing; // the server is stopping: the last connection to close quiets H2O's timers
  h2o_globalconf_t conf;
  h2o_context_t ctx;
  h2o_accept_ctx_t accept;
  int ctx_ready;
  uv_tcp_t listener;
  int listening;
  int n_conns;
  struct hreq **reqs;
  int n_reqs_cap;
  uint32_t gen;
  uint64_t next_id;
  char base_id[128];
  long long t_epoch;
  // metrics (loop thread)
  uint64_t outcomes[16];
  uint64_t prompt_tokens, gen_tokens;
  uint64_t http_status[6]; // 1xx..5xx by hundreds, [0] other
  struct hist ttft, tpot;
};

static const char *k_outcomes[16] = {"stop", "length", "cancel", "shutdown", "error", "bad_param", "context_exceeded", "bad_adapter",
                                     "unsupported", "too_long", "internal", "busy", "other", NULL};

static double now_ms(void) { return (double)uv_hrtime() / 1e6; }

// ---- JSON helpers ----

// A JSON string of bytes that may not be valid UTF-8 (a byte-level model can produce anything):
// each byte that is not part of a valid sequence becomes U+FFFD.
static json_t *jstr(const char *p, size_t n) {
  json_t *j = json_stringn(p, n);
  if (j) return j;
  struct buf b = {0};
  for (size_t i = 0; i < n;) {
    size_t k = ll_utf8_complete_prefix(p + i, n - i < 4 ? n - i : 4);
    unsigned char c = (unsigned char)p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    json_t *t = len && len <= k ? json_stringn(p + i, len) : NULL;
    if (t) {
      json_decref(t);
      buf_add(&b, p + i, len);
      i += len;
    } else {
      buf_str(&b, "\xEF\xBF\xBD");
      i++;
    }
  }
  j = json_stringn(b.p ? b.p : "", b.n);
  free(b.p);
  return j ? j : json_string("");
}

static json_t *jbytes(const char *p, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
  return a;
}

// ---- responses ----

static void count_status(struct ll_http *h, int status) {
  int k = status / 100;
  h->http_status[k >= 1 && k <= 5 ? k : 0]++;
}

static void send_json(struct ll_http *h, h2o_req_t *req, int status, const char *reason, json_t *body) {
  char *s = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  count_status(h, status);
  req->res.status = status;
  req->res.reason = reason;
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/json"));
  if (!s) {
    req->res.status = 500;
    req->res.reason = "Internal Server Error";
    h2o_send_inline(req, H2O_STRLIT("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"));
    return;
  }
  h2o_send_inline(req, s, strlen(s));
  free(s);
}

static const char *status_reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 413: return "Payload Too Large";
  case 429: return "Too Many Requests";
  case 503: return "Service Unavailable";
  default: return status >= 500 ? "Internal Server Error" : "Error";
  }
}

json_t *ll_http_error_object(int status, const char *code, const char *param, const char *msg) {
  const char *type = status == 401 ? "authentication_error"
                     : status == 429 ? "rate_limit_exceeded"
                     : status >= 500 ? "server_error"
                     : status == 404 && code && !strcmp(code, "model_not_found") ? "invalid_request_error"
                     : status == 404 ? "not_found_error"
                                     : "invalid_request_error";
  json_t *e = json_object();
  json_object_set_new(e, "message", jstr(msg, strlen(msg)));
  json_object_set_new(e, "type", json_string(type));
  json_object_set_new(e, "param", param ? json_string(param) : json_null());
  json_object_set_new(e, "code", code ? json_string(code) : json_null());
  json_t *o = json_object();
  json_object_set_new(o, "error", e);
  return o;
}

static void send_error(struct ll_http *h, h2o_req_t *req, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void send_error(struct ll_http *h, h2o_req_t *req, int status, const char *code, const char *param, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  send_json(h, req, status, status_reason(status), ll_http_error_object(status, code, param, msg));
}

// The HTTP status of a scheduler error code.
static int status_of_code(const char *code) {
  if (!code) return 500;
  if (!strcmp(code, "bad_adapter")) return 404;
  if (!strcmp(code, "busy")) return 429;
  if (!strcmp(code, "shutdown")) return 503;
  if (!strcmp(code, "internal")) return 500;
  return 400;
}

static const char *api_code(const char *code) {
  if (!code) return NULL;
  if (!strcmp(code, "bad_adapter")) return "model_not_found";
  if (!strcmp(code, "context_exceeded")) return "context_length_exceeded";
  return code;
}

// ---- the request table ----

static void hreq_free(struct hreq *hr) {
  if (!hr) return;
  if (hr->slot >= 0 && hr->http->reqs[hr->slot] == hr) hr->http->reqs[hr->slot] = NULL;
  free(hr->text.p);
  ll_chat_reasoning_free(&hr->rsplit);
  free(hr->pend.p);
  free(hr->out.p);
  json_decref(hr->lp);
  free(hr->tpl);
  free(hr->esc.p);
  free(hr);
}

// H2O disposed of the request (response done, or the client went away).
static void req_gone(void *p) {
  struct hreq *hr = *(struct hreq **)p;
  hr->req = NULL;
  if (!hr->finished) {
    ll_net_cancel(hr->http->srv, hr->uid, hr->id); // frees its KV before the next step
    return;                                        // freed when its final event comes
  }
  hreq_free(hr);
}

// ---- streaming ----

static void stream_flush(struct hreq *hr);

static void on_proceed(h2o_generator_t *g, h2o_req_t *req) {
  struct hreq *hr = (struct hreq *)((char *)g - offsetof(struct hreq, gen));
  (void)req;
  hr->sending = 0;
  hr->out.n = 0;
  stream_flush(hr);
}

static void on_stop(h2o_generator_t *g, h2o_req_t *req) { (void)g, (void)req; } // req_gone follows

static void stream_flush(struct hreq *hr) {
  if (!hr->req || hr->sending) return;
  if (hr->overflow) {
    hr->sending = 1;
    h2o_send(hr->req, NULL, 0, H2O_SEND_STATE_ERROR); // closes the connection
    return;
  }
  if (hr->pend.n == 0 && !hr->final_queued) return;
  struct buf t = hr->out;
  hr->out = hr->pend;
  hr->pend = t;
  hr->pend.n = 0;
  int final = hr->final_queued;
  hr->sending = 1;
  h2o_iovec_t b = h2o_iovec_init(hr->out.p ? hr->out.p : "", hr->out.n);
  h2o_send(hr->req, &b, 1, final ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void stream_start(struct hreq *hr) {
  if (hr->started || !hr->req) return;
  hr->started = 1;
  h2o_req_t *req = hr->req;
  count_status(hr->http, 200);
  req->res.status = 200;
  req->res.reason = "OK";
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("text/event-stream"));
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-cache"));
  hr->gen.proceed = on_proceed;
  hr->gen.stop = on_stop;
  h2o_start_response(req, &hr->gen);
}

// One SSE event "data: JSON\n\n" (body consumed).
// One SSE event "data: a b c\n\n" from up to three pieces of JSON text (NULL: out of memory).
static void stream_put(struct hreq *hr, const char *a, size_t an, const char *b, size_t bn, const char *c, size_t cn) {
  if (!hr->req || hr->overflow) return;
  int rc = a ? 0 : LL_ENOMEM;
  if (!rc) rc = buf_add(&hr->pend, "data: ", 6);
  if (!rc) rc = buf_add(&hr->pend, a, an);
  if (!rc && bn) rc = buf_add(&hr->pend, b, bn);
  if (!rc && cn) rc = buf_add(&hr->pend, c, cn);
  if (!rc) rc = buf_add(&hr->pend, "\n\n", 2);
  if (rc || hr->pend.n + hr->out.n > (size_t)hr->http->srv->cfg->output_buffer) {
    ll_log(LL_LOG_WARN, "http: request %s dropped, more than %lld bytes of output not read", hr->cid,
           (long long)hr->http->srv->cfg->output_buffer);
    hr->overflow = 1;
    if (!hr->finished) ll_net_cancel(hr->http->srv, hr->uid, hr->id);
  }
  stream_flush(hr);
}

static void stream_event(struct hreq *hr, json_t *body) {
  char *s = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  stream_put(hr, s, s ? strlen(s) : 0, NULL, 0, NULL, 0);
  free(s);
}

static json_t *chunk_base(struct hreq *hr) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(hr->cid));
  json_object_set_new(o, "object", json_string(hr->kind == HK_CHAT ? "chat.completion.chunk" : "text_completion"));
  json_object_set_new(o, "created", json_integer(hr->created));
  json_object_set_new(o, "model", json_string(hr->model));
  json_object_set_new(o, "system_fingerprint", json_string("llsrv-" LL_VERSION));
  return o;
}

static json_t *take_logprobs(struct hreq *hr) {
  if (!hr->logprobs) return json_null();
  json_t *lp = hr->lp;
  hr->lp = NULL;
  if (!lp) lp = hr->kind == HK_CHAT ? json_array() : NULL;
  if (hr->kind == HK_CHAT) {
    json_t *o = json_object();
    json_object_set_new(o, "content", lp);
    return o;
  }
  if (!lp) {
    lp = json_object();
    json_object_set_new(lp, "tokens", json_array());
    json_object_set_new(lp, "token_logprobs", json_array());
    json_object_set_new(lp, "top_logprobs", json_array());
    json_object_set_new(lp, "text_offset", json_array());
  }
  return lp;
}

// A streamed chunk with text (and the logprobs gathered since the last one), or the last one
// with finish_reason.
static json_t *chunk_json(struct hreq *hr, const char *text, size_t n, const char *finish, int first);

// The JSON string (quotes included) of n bytes of ASCII text, appended to b without building
// a jansson value: the same bytes as json_dumps of json_stringn's (\" \\ \b \f \n \r \t,
// other control bytes as \u00XX). -1 with b as it was when a byte is not ASCII: jansson then
// checks the UTF-8 (jstr), or out of memory.
static int json_ascii(struct buf *b, const char *p, size_t n) {
  const size_t n0 = b->n;
  int rc = buf_add(b, "\"", 1);
  for (size_t i = 0, run = 0; !rc && i <= n; i++) {
    unsigned char c = i < n ? (unsigned char)p[i] : 0;
    if (i < n && c >= 0x20 && c < 0x80 && c != '"' && c != '\\') continue;
    if (i > run) rc = buf_add(b, p + run, i - run);
    run = i + 1;
    if (rc || i == n) break;
    if (c >= 0x80) rc = -1;
    else if (c == '"' || c == '\\') rc = buf_add(b, c == '"' ? "\\\"" : "\\\\", 2);
    else if (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t')
      rc = buf_add(b, c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t", 2);
    else {
      char u[8];
      snprintf(u, sizeof u, "\\u%04X", c);
      rc = buf_add(b, u, 6);
    }
  }
  if (!rc) rc = buf_add(b, "\"", 1);
  if (rc) b->n = n0;
  if (b->p) b->p[b->n] = 0;
  return rc;
}

// A token's chunk without logprobs (most of a stream) is the same JSON for every token but
// the text: built once per request as the two halves around the text (tpl, split at tpl_at),
// each token's chunk is the text's JSON string between them - the same bytes as chunk_json's,
// without building and dumping an object of eleven members per token. The halves are written
// directly (the first token's latency), or where a name is not ASCII, cut out of chunk_json's
// dump around a marker text.
static int chunk_template_json(struct hreq *hr) {
  static const char mark[] = "\x01llsrv-text\x01", mark_json[] = "\"\\u0001llsrv-text\\u0001\"";
  json_t *o = chunk_json(hr, mark, sizeof mark - 1, NULL, 0);
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  char *at = t ? strstr(t, mark_json) : NULL;
  if (!at) {
    free(t);
    return -1;
  }
  size_t n = strlen(t), k = sizeof mark_json - 1;
  memmove(at, at + k, n - (size_t)(at - t) - k + 1);
  hr->tpl = t;
  hr->tpl_n = n - k;
  hr->tpl_at = (size_t)(at - t);
  return 0;
}

static int chunk_template(struct hreq *hr) {
  struct buf t = {0};
  char num[32];
  snprintf(num, sizeof num, "%lld", hr->created);
  const int chat = hr->kind == HK_CHAT;
  int rc = buf_str(&t, "{\"id\":");
  if (!rc) rc = json_ascii(&t, hr->cid, strlen(hr->cid));
  if (!rc) rc = buf_str(&t, chat ? ",\"object\":\"chat.completion.chunk\",\"created\":" : ",\"object\":\"text_completion\",\"created\":");
  if (!rc) rc = buf_str(&t, num);
  if (!rc) rc = buf_str(&t, ",\"model\":");
  if (!rc) rc = json_ascii(&t, hr->model, strlen(hr->model));
  if (!rc) rc = buf_str(&t, ",\"system_fingerprint\":\"llsrv-" LL_VERSION "\",\"choices\":[{\"index\":0,");
  if (!rc) rc = buf_str(&t, chat ? "\"delta\":{\"content\":" : "\"text\":");
  const size_t at = t.n;
  if (!rc) rc = buf_str(&t, chat ? "},\"logprobs\":null,\"finish_reason\":null}]" : ",\"logprobs\":null,\"finish_reason\":null}]");
  if (!rc) rc = buf_str(&t, hr->include_usage ? ",\"usage\":null}" : "}");
  if (rc) {
    free(t.p);
    return chunk_template_json(hr);
  }
  hr->tpl = t.p;
  hr->tpl_n = t.n;
  hr->tpl_at = at;
#ifndef NDEBUG
  { // our invariant: the same bytes as chunk_json's (checked in debug builds, as the suite's sanitizer pass runs)
    char *fast = hr->tpl;
    size_t fn = hr->tpl_n, fat = hr->tpl_at;
    if (chunk_template_json(hr) == 0) {
      assert(fn == hr->tpl_n && fat == hr->tpl_at && memcmp(fast, hr->tpl, fn) == 0);
      free(hr->tpl);
    }
    hr->tpl = fast, hr->tpl_n = fn, hr->tpl_at = fat;
  }
#endif
  return 0;
}

static int stream_text(struct hreq *hr, const char *text, size_t n) {
  if (!hr->tpl && chunk_template(hr) != 0) return -1;
  hr->esc.n = 0;
  int rc = json_ascii(&hr->esc, text, n);
#ifndef NDEBUG
  if (rc == 0) { // our invariant: the same bytes as jansson's
    json_t *js = json_stringn(text, n);
    char *e = json_dumps(js, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(js);
    assert(e && strlen(e) == hr->esc.n && memcmp(e, hr->esc.p, hr->esc.n) == 0);
    free(e);
  }
#endif
  if (rc != 0) {
    json_t *js = jstr(text, n);
    char *e = json_dumps(js, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(js);
    hr->esc.n = 0;
    rc = e ? buf_str(&hr->esc, e) : LL_ENOMEM;
    free(e);
  }
  stream_put(hr, rc ? NULL : hr->tpl, hr->tpl_at, hr->esc.p, hr->esc.n, hr->tpl + hr->tpl_at, hr->tpl_n - hr->tpl_at);
  return 0;
}

static void stream_chunk(struct hreq *hr, const char *text, size_t n, const char *finish, int first) {
  if (!finish && !first && !hr->logprobs && !hr->lp && n && stream_text(hr, text, n) == 0) return;
  stream_event(hr, chunk_json(hr, text, n, finish, first));
}

static json_t *chunk_json(struct hreq *hr, const char *text, size_t n, const char *finish, int first) {
  json_t *o = chunk_base(hr);
  json_t *c = json_object();
  json_object_set_new(c, "index", json_integer(0));
  if (hr->kind == HK_CHAT) {
    json_t *d = json_object();
    if (first) json_object_set_new(d, "role", json_string("assistant"));
    if (!finish) json_object_set_new(d, "content", jstr(text, n));
    json_object_set_new(c, "delta", d);
  } else {
    json_object_set_new(c, "text", jstr(text, n));
  }
  json_object_set_new(c, "logprobs", finish && !hr->lp ? json_null() : take_logprobs(hr));
  json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
  json_t *ch = json_array();
  json_array_append_new(ch, c);
  json_object_set_new(o, "choices", ch);
  if (hr->include_usage) json_object_set_new(o, "usage", json_null());
  return o;
}

static json_t *usage(int prompt, int gen) {
  json_t *u = json_object();
  json_object_set_new(u, "prompt_tokens", json_integer(prompt));
  json_object_set_new(u, "completion_tokens", json_integer(gen));
  json_object_set_new(u, "total_tokens", json_integer(prompt + gen));
  return u;
}

static void stream_done(struct hreq *hr) {
  if (!hr->req || hr->overflow) return;
  if (!buf_add(&hr->pend, "data: [DONE]\n\n", 14)) hr->final_queued = 1;
  else hr->overflow = 1;
  stream_flush(hr);
}

// ---- events from the scheduler ----

static void add_logprob(struct hreq *hr, const struct ll_sched_ev *ev) {
  const struct ll_tokenizer *tk = ll_engine_tokenizer(hr->http->srv->e);
  char piece[256];
  int k = tk ? ll_token_to_piece(tk, ev->token, piece, sizeof piece, hr->special) : snprintf(piece, sizeof piece, " %d", ev->token);
  if (k < 0) k = 0;
  if ((size_t)k >= sizeof piece) k = sizeof piece - 1;
  if (hr->kind == HK_CHAT) {
    if (!hr->lp) hr->lp = json_array();
    json_t *e = json_object();
    json_object_set_new(e, "token", jstr(piece, (size_t)k));
    json_object_set_new(e, "logprob", json_real(ev->logprob));
    json_object_set_new(e, "bytes", jbytes(piece, (size_t)k));
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top && i < hr->top_logprobs; i++) {
      char p2[256];
      int k2 = tk ? ll_token_to_piece(tk, ev->top[i].id, p2, sizeof p2, hr->special) : snprintf(p2, sizeof p2, " %d", ev->top[i].id);
      if (k2 < 0) k2 = 0;
      if ((size_t)k2 >= sizeof p2) k2 = sizeof p2 - 1;
      json_t *t = json_object();
      json_object_set_new(t, "token", jstr(p2, (size_t)k2));
      json_object_set_new(t, "logprob", json_real(ev->top[i].logprob));
      json_object_set_new(t, "bytes", jbytes(p2, (size_t)k2));
      json_array_append_new(top, t);
    }
    json_object_set_new(e, "top_logprobs", top);
    json_array_append_new(hr->lp, e);
    return;
  }
  if (!hr->lp) {
    hr->lp = json_object();
    json_object_set_new(hr->lp, "tokens", json_array());
    json_object_set_new(hr->lp, "token_logprobs", json_array());
    json_object_set_new(hr->lp, "top_logprobs", json_array());
    json_object_set_new(hr->lp, "text_offset", json_array());
  }
  json_array_append_new(json_object_get(hr->lp, "tokens"), jstr(piece, (size_t)k));
  json_array_append_new(json_object_get(hr->lp, "token_logprobs"), json_real(ev->logprob));
  json_t *top = json_object();
  for (int i = 0; i < ev->n_top && i < hr->top_logprobs; i++) {
    char p2[256];
    int k2 = tk ? ll_token_to_piece(tk, ev->top[i].id, p2, sizeof p2, hr->special) : snprintf(p2, sizeof p2, " %d", ev->top[i].id);
    if (k2 < 0) k2 = 0;
    if ((size_t)k2 >= sizeof p2) k2 = sizeof p2 - 1;
    json_t *key = jstr(p2, (size_t)k2);
    json_object_set_new(top, json_string_value(key), json_real(ev->top[i].logprob));
    json_decref(key);
  }
  json_array_append_new(json_object_get(hr->lp, "top_logprobs"), top);
  json_array_append_new(json_object_get(hr->lp, "text_offset"), json_integer((json_int_t)(hr->stream ? hr->text_off : hr->text.n)));
}

static const char *finish_reason(const char *reason) { return !strcmp(reason, "length") ? "length" : "stop"; }

static void stream_reasoning_chunk(struct hreq *hr, const char *t, size_t n) {
  json_t *o = chunk_json(hr, t, n, NULL, 0);
  json_t *d = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
  json_object_set(d, "reasoning_content", json_object_get(d, "content"));
  json_object_del(d, "content");
  stream_event(hr, o);
}

static void emit_split(void *u, int reasoning, const char *t, size_t n) {
  struct hreq *hr = u;
  if (reasoning) stream_reasoning_chunk(hr, t, n);
  else stream_chunk(hr, t, n, NULL, 0);
}

// reasoning_format deepseek|auto: the streamed text through the splitter (ll_chat.h).
static void split_stream(struct hreq *hr, const char *text, size_t n, int final) {
  if (ll_chat_reasoning_feed(&hr->rsplit, text, n, final, emit_split, hr) != 0) ll_net_cancel(hr->http->srv, hr->uid, hr->id);
}

static void on_final_nonstream(struct hreq *hr, const struct ll_sched_ev *ev) {
  struct ll_http *h = hr->http;
  h2o_req_t *req = hr->req;
  if (ev->type == LL_EV_ERROR) {
    send_error(h, req, status_of_code(ev->code), api_code(ev->code), NULL, "%.*s", (int)(ev->len < 700 ? ev->len : 700), ev->data);
    return;
  }
  if (ev->type == LL_EV_IDS) {
    const struct ll_tokenizer *tk = ll_engine_tokenizer(h->srv->e);
    const int32_t *ids = (const int32_t *)(const void *)ev->data;
    json_t *a = json_array();
    for (int i = 0; i < ev->n_ids; i++) {
      if (hr->with_pieces) {
        char piece[256];
        int k = tk ? ll_token_to_piece(tk, ids[i], piece, sizeof piece, 1) : 0;
        if (k < 0) k = 0;
        if ((size_t)k >= sizeof piece) k = sizeof piece - 1;
        json_t *t = json_object();
        json_object_set_new(t, "id", json_integer(ids[i]));
        json_object_set_new(t, "piece", jstr(piece, (size_t)k));
        json_array_append_new(a, t);
      } else {
        json_array_append_new(a, json_integer(ids[i]));
      }
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", a);
    send_json(h, req, 200, "OK", o);
    return;
  }
  if (ev->type == LL_EV_TEXT) {
    json_t *o = json_object();
    json_object_set_new(o, "content", jstr(ev->data, ev->len));
    send_json(h, req, 200, "OK", o);
    return;
  }
  // END
  if (!strcmp(ev->reason, "error")) {
    send_error(h, req, 500, "internal", NULL, "generation failed: %.*s", (int)(ev->len < 600 ? ev->len : 600), ev->data);
    return;
  }
  if (!strcmp(ev->reason, "shutdown")) {
    send_error(h, req, 503, "shutdown", NULL, "the server is shutting down");
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(hr->cid));
  json_object_set_new(o, "object", json_string(hr->kind == HK_CHAT ? "chat.completion" : "text_completion"));
  json_object_set_new(o, "created", json_integer(hr->created));
  json_object_set_new(o, "model", json_string(hr->model));
  json_object_set_new(o, "system_fingerprint", json_string("llsrv-" LL_VERSION));
  json_t *c = json_object();
  json_object_set_new(c, "index", json_integer(0));
  if (hr->kind == HK_CHAT) {
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    const char *t = hr->text.p ? hr->text.p : "";
    size_t rs = 0, re = 0, cs = 0;
    if (hr->reasoning) ll_chat_reasoning_split(t, hr->text.n, &rs, &re, &cs);
    json_object_set_new(m, "content", jstr(t + cs, hr->text.n - cs));
    if (re > rs) json_object_set_new(m, "reasoning_content", jstr(t + rs, re - rs)); // none when empty, as llama-server
    json_object_set_new(c, "message", m);
  } else {
    json_object_set_new(c, "text", jstr(hr->text.p ? hr->text.p : "", hr->text.n));
  }
  json_object_set_new(c, "logprobs", take_logprobs(hr));
  json_object_set_new(c, "finish_reason", json_string(finish_reason(ev->reason)));
  json_t *ch = json_array();
  json_array_append_new(ch, c);
  json_object_set_new(o, "choices", ch);
  json_object_set_new(o, "usage", usage(ev->prompt_tokens, ev->tokens));
  send_json(h, req, 200, "OK", o);
}

static void on_event(struct hreq *hr, const struct ll_sched_ev *ev) {
  if (!hr->req) return; // the client has gone; only the final event matters (freeing)
  switch (ev->type) {
  case LL_EV_PROB:
    if (hr->logprobs) add_logprob(hr, ev);
    return;
  case LL_EV_TOKEN:
    if (!hr->stream) {
      if (buf_add(&hr->text, ev->data, ev->len) != 0) ll_net_cancel(hr->http->srv, hr->uid, hr->id);
      return;
    }
    {
      int first = !hr->started;
      stream_start(hr);
      if (first && hr->kind == HK_CHAT) stream_chunk(hr, "", 0, NULL, 1); // the role first, as OpenAI does
      if (hr->reasoning) split_stream(hr, ev->data, ev->len, 0);
      else stream_chunk(hr, ev->data, ev->len, NULL, 0);
      hr->text_off += ev->len; // text_offset of completions' logprobs
    }
    return;
  default:
    break;
  }
  // The final event.
  if (!hr->stream || (!hr->started && ev->type != LL_EV_END)) {
    on_final_nonstream(hr, ev);
    return;
  }
  if (!hr->started && (!strcmp(ev->reason, "error") || !strcmp(ev->reason, "shutdown"))) {
    on_final_nonstream(hr, ev);
    return;
  }
  int first = !hr->started;
  stream_start(hr);
  if (first && hr->kind == HK_CHAT) stream_chunk(hr, "", 0, NULL, 1);
  if (!strcmp(ev->reason, "error") || !strcmp(ev->reason, "shutdown")) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s%.*s", !strcmp(ev->reason, "shutdown") ? "the server is shutting down" : "generation failed: ",
             !strcmp(ev->reason, "shutdown") ? 0 : (int)(ev->len < 600 ? ev->len : 600), ev->data);
    stream_event(hr, ll_http_error_object(!strcmp(ev->reason, "shutdown") ? 503 : 500, ev->reason, NULL, msg));
  } else {
    if (hr->reasoning) split_stream(hr, "", 0, 1);  // what waited for a tag that never came
    if (hr->lp) stream_chunk(hr, "", 0, NULL, 0); // logprobs of tokens whose text was held back
    stream_chunk(hr, "", 0, finish_reason(ev->reason), 0);
    if (hr->include_usage) {
      json_t *o = chunk_base(hr);
      json_object_set_new(o, "choices", json_array());
      json_object_set_new(o, "usage", usage(ev->prompt_tokens, ev->tokens));
      stream_event(hr, o);
    }
  }
  stream_done(hr);
}

static void observe(struct hist *hs, double v, uint64_t n) {
  if (n == 0 || !(v >= 0)) return;
  hs->sum += v * (double)n;
  hs->count += n;
  for (int i = 0; i < N_BUCKETS; i++)
    if (v <= k_buckets[i]) hs->b[i] += n;
}

void ll_http_observe(struct ll_server *s, const struct ll_sched_ev *ev) {
  struct ll_http *h = s->http;
  if (!h || !ev->final) return;
  const char *o = ev->type == LL_EV_END ? ev->reason : ev->type == LL_EV_ERROR ? ev->code : NULL;
  if (!o) return; // tokenize / detokenize
  int i = 0;
  while (k_outcomes[i] && strcmp(k_outcomes[i], o) != 0) i++;
  if (!k_outcomes[i]) i = 12; // other
  h->outcomes[i]++;
  if (ev->type != LL_EV_END) return;
  h->prompt_tokens += (uint64_t)ev->prompt_tokens;
  h->gen_tokens += (uint64_t)ev->tokens;
  if (ev->tokens > 0) observe(&h->ttft, (ev->queue_ms + ev->prefill_ms) / 1e3, 1);
  if (ev->tokens > 1) observe(&h->tpot, ev->decode_ms / 1e3 / (ev->tokens - 1), (uint64_t)(ev->tokens - 1));
}

void ll_http_on_event(struct ll_server *s, struct ll_sched_ev *ev) {
  struct ll_http *h = s->http;
  if (ev->type == LL_EV_END && !ev->reason) ev->reason = "error"; // never the case; cheap to be sure
  if (ev->final) s->outstanding--;
  uint32_t slot = (uint32_t)(ev->conn & 0x7fffffffu);
  struct hreq *hr = h && slot < (uint32_t)h->n_reqs_cap ? h->reqs[slot] : NULL;
  if (hr && hr->uid != ev->conn) hr = NULL;
  if (hr) {
    if (ev->final) hr->finished = 1;
    on_event(hr, ev);
    if (ev->final && !hr->req) hreq_free(hr);
  }
  free(ev);
}

// ---- request parsing ----

struct body {
  json_t *j;
  char msg[512];
  const char *param;
};

// Reads an optional member of type `want` ('s' string, 'i' integer, 'n' number, 'b' bool, 'o'
// object, 'a' array); null counts as absent. 1 present, 0 absent, -1 wrong type (message set).
static int member(struct body *b, const char *key, char want, json_t **out) {
  json_t *v = json_object_get(b->j, key);
  if (!v || json_is_null(v)) return 0;
  int ok = want == 's' ? json_is_string(v)
           : want == 'i' ? json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
           : want == 'n' ? json_is_number(v)
           : want == 'b' ? json_is_boolean(v)
           : want == 'o' ? json_is_object(v)
                         : json_is_array(v);
  if (!ok) {
    const char *what = want == 's' ? "a string" : want == 'i' ? "an integer" : want == 'n' ? "a number" : want == 'b' ? "a boolean" : want == 'o' ? "an object" : "an array";
    snprintf(b->msg, sizeof b->msg, "'%s' must be %s", key, what);
    b->param = key;
    return -1;
  }
  *out = v;
  return 1;
}

static int64_t jint(json_t *v) { return json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)json_real_value(v); }

// The sampling fields: the OpenAI names and llsrv's own (the one table, ll_request.h).
static int parse_sampling(struct ll_http *h, struct body *b, struct ll_sched_req *r) {
  const struct ll_config *cfg = h->srv->cfg;
  json_t *v;
  int rc;
  for (const struct ll_gen_param *g = ll_gen_params; g->name; g++) {
    if (g->field == LL_GF_MAX_TOKENS || g->field == LL_GF_LOGPROBS || g->field == LL_GF_STOP || g->field == LL_GF_ADAPTER) continue;
    char want = g->type == LL_GEN_FLOAT ? 'n' : g->type == LL_GEN_BOOL ? 'b' : 'i';
    if ((rc = member(b, g->name, want, &v)) < 0) return -1;
    if (rc == 0) continue;
    if (g->type == LL_GEN_FLOAT) {
      double x = json_number_value(v);
      if (x < g->fmin || x > g->fmax) {
        snprintf(b->msg, sizeof b->msg, "'%s' must be in %g..%g (got %g)", g->name, g->fmin, g->fmax, x);
        b->param = g->name;
        return -1;
      }
      ll_gen_set_float(r, g, x);
    } else if (g->type == LL_GEN_BOOL) {
      ll_gen_set_int(r, g, json_is_true(v));
    } else {
      int64_t x = jint(v);
      if (x < g->imin || x > g->imax) {
        snprintf(b->msg, sizeof b->msg, "'%s' must be in %lld..%lld", g->name, (long long)g->imin, (long long)g->imax);
        b->param = g->name;
        return -1;
      }
      ll_gen_set_int(r, g, x);
    }
  }
  const char *mt_keys[2] = {"max_completion_tokens", "max_tokens"};
  for (int i = 0; i < 2; i++) {
    if ((rc = member(b, mt_keys[i], 'i', &v)) < 0) return -1;
    if (rc == 0) continue;
    int64_t x = jint(v);
    if (x < 1 || x > cfg->max_tokens) {
      snprintf(b->msg, sizeof b->msg, "'%s' must be in 1..%lld (the server's max_tokens)", mt_keys[i], (long long)cfg->max_tokens);
      b->param = mt_keys[i];
      return -1;
    }
    r->max_tokens = (int)x;
    break;
  }
  if ((rc = member(b, "n", 'i', &v)) < 0) return -1;
  if (rc && jint(v) != 1) {
    snprintf(b->msg, sizeof b->msg, "'n' must be 1 (one choice per request)");
    b->param = "n";
    return -1;
  }
  json_t *stop = json_object_get(b->j, "stop");
  if (stop && !json_is_null(stop)) {
    const struct ll_gen_param *g = ll_gen_param_find("stop");
    if (json_is_string(stop)) {
      rc = ll_gen_set_str(r, g, json_string_value(stop), json_string_length(stop), b->msg, sizeof b->msg);
    } else if (json_is_array(stop)) {
      rc = json_array_size(stop) > LL_MAX_STOP ? ll_errf(b->msg, sizeof b->msg, LL_EINVAL, "'stop': at most %d strings", LL_MAX_STOP) : 0;
      for (size_t i = 0; !rc && i < json_array_size(stop); i++) {
        json_t *e = json_array_get(stop, i);
        rc = json_is_string(e) ? ll_gen_set_str(r, g, json_string_value(e), json_string_length(e), b->msg, sizeof b->msg)
                               : ll_errf(b->msg, sizeof b->msg, LL_EINVAL, "'stop' must be a string or an array of strings");
      }
    } else {
      rc = ll_errf(b->msg, sizeof b->msg, LL_EINVAL, "'stop' must be a string or an array of strings");
    }
    if (rc) {
      b->param = "stop";
      return -1;
    }
  }
  return 0;
}

// `model`: the base model's id, an adapter's name, `live`; absent: the server's default.
// 0, or 404 with the message set.
static int resolve_model(struct ll_http *h, struct body *b, struct ll_sched_req *r, char *model, size_t cap) {
  json_t *v;
  int rc = member(b, "model", 's', &v);
  if (rc < 0) return 400;
  if (rc == 0) {
    snprintf(model, cap, "%s", h->base_id);
    return 0;
  }
  const char *m = json_string_value(v);
  snprintf(model, cap, "%s", m);
  if (!strcmp(m, h->base_id)) {
    snprintf(r->adapter, sizeof r->adapter, "none");
    return 0;
  }
  char names[LL_SCHED_MAX_ADAPTERS][LL_ADAPTER_NAME_MAX + 1];
  int n = ll_sched_adapter_names(h->srv->sched, names, LL_SCHED_MAX_ADAPTERS);
  for (int i = 0; i < n; i++)
    if (!strcmp(names[i], m)) {
      snprintf(r->adapter, sizeof r->adapter, "%s", m);
      return 0;
    }
  if (!strcmp(m, "live")) { // not registered now: the scheduler's message says why
    snprintf(r->adapter, sizeof r->adapter, "live");
    return 0;
  }
  snprintf(b->msg, sizeof b->msg, "The model '%.200s' does not exist (GET /v1/models lists them)", m);
  b->param = "model";
  return 404;
}

// The chat messages as the CHAT verb's JSON text: [{"role","content"}...], content parts
// ({"type":"text","text":...}) joined.
static char *chat_text(struct body *b) {
  json_t *msgs;
  int rc = member(b, "messages", 'a', &msgs);
  if (rc <= 0) {
    if (rc == 0) snprintf(b->msg, sizeof b->msg, "'messages' is required"), b->param = "messages";
    return NULL;
  }
  size_t n = json_array_size(msgs);
  if (n == 0 || n > MAX_MESSAGES) {
    snprintf(b->msg, sizeof b->msg, "'messages' must hold 1..%d messages", MAX_MESSAGES);
    b->param = "messages";
    return NULL;
  }
  json_t *out = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(msgs, i);
    json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
    json_t *content = json_is_object(m) ? json_object_get(m, "content") : NULL;
    if (!json_is_string(role)) {
      snprintf(b->msg, sizeof b->msg, "messages[%zu]: 'role' must be a string", i);
      b->param = "messages";
      json_decref(out);
      return NULL;
    }
    const char *rs = json_string_value(role);
    if (!strcmp(rs, "developer")) rs = "system";
    if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
      snprintf(b->msg, sizeof b->msg, "messages[%zu]: role '%.40s' is not one of system, developer, user, assistant", i, rs);
      b->param = "messages";
      json_decref(out);
      return NULL;
    }
    struct buf t = {0};
    int ok = 1;
    if (json_is_string(content)) {
      ok = buf_add(&t, json_string_value(content), json_string_length(content)) == 0;
    } else if (json_is_array(content)) {
      for (size_t k = 0; ok && k < json_array_size(content); k++) {
        json_t *part = json_array_get(content, k);
        json_t *pt = json_is_object(part) ? json_object_get(part, "text") : NULL;
        json_t *ty = json_is_object(part) ? json_object_get(part, "type") : NULL;
        if (!json_is_string(pt) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") != 0) ok = -1;
        else ok = buf_add(&t, json_string_value(pt), json_string_length(pt)) == 0;
      }
    } else if (!(json_is_null(content) && !strcmp(rs, "assistant"))) {
      ok = -1;
    }
    if (ok != 1) {
      snprintf(b->msg, sizeof b->msg, "messages[%zu]: 'content' must be a string or an array of text parts", i);
      b->param = "messages";
      free(t.p);
      json_decref(out);
      return NULL;
    }
    json_t *o = json_object();
    json_object_set_new(o, "role", json_string(rs));
    json_object_set_new(o, "content", json_stringn(t.p ? t.p : "", t.n));
    free(t.p);
    json_t *rct = json_object_get(m, "reasoning_content"); // an earlier answer's reasoning (Qwen3's template renders it)
    if (rct && !json_is_null(rct) && !strcmp(rs, "assistant")) {
      if (!json_is_string(rct)) {
        snprintf(b->msg, sizeof b->msg, "messages[%zu]: 'reasoning_content' must be a string", i);
        b->param = "messages";
        json_decref(o);
        json_decref(out);
        return NULL;
      }
      json_object_set(o, "reasoning_content", rct);
    }
    json_array_append_new(out, o);
  }
  char *s = json_dumps(out, JSON_COMPACT);
  json_decref(out);
  if (!s) snprintf(b->msg, sizeof b->msg, "out of memory");
  return s;
}

static int auth_ok(struct ll_http *h, h2o_req_t *req) {
  const char *want = h->srv->cfg->auth_token;
  if (!want) return 1;
  ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
  if (i < 0) return 0;
  const h2o_iovec_t v = req->headers.entries[i].value;
  if (v.len < 7 || strncasecmp(v.base, "Bearer ", 7) != 0) return 0;
  const char *tok = v.base + 7;
  size_t tlen = v.len - 7, wl = strlen(want);
  unsigned char diff = (unsigned char)(tlen != wl);
  for (size_t k = 0; k < wl; k++) diff |= (unsigned char)(want[k] ^ (k < tlen ? tok[k] : 0));
  return diff == 0;
}

static int path_is(h2o_req_t *req, const char *p) {
  size_t n = strlen(p);
  return req->path_normalized.len == n && memcmp(req->path_normalized.base, p, n) == 0;
}

static int method_is(h2o_req_t *req, const char *m) {
  size_t n = strlen(m);
  return req->method.len == n && memcmp(req->method.base, m, n) == 0;
}

// ---- handlers ----

static json_t *model_object(struct ll_http *h, const char *id, const char *owner) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(id));
  json_object_set_new(o, "object", json_string("model"));
  json_object_set_new(o, "created", json_integer(h->t_epoch));
  json_object_set_new(o, "owned_by", json_string(owner));
  return o;
}

static void handle_models(struct ll_http *h, h2o_req_t *req, const char *one) {
  char names[LL_SCHED_MAX_ADAPTERS][LL_ADAPTER_NAME_MAX + 1];
  int n = ll_sched_adapter_names(h->srv->sched, names, LL_SCHED_MAX_ADAPTERS);
  json_t *data = json_array();
  json_array_append_new(data, model_object(h, h->base_id, "llsrv"));
  for (int i = 0; i < n; i++)
    json_array_append_new(data, model_object(h, names[i], !strcmp(names[i], "live")       ? "llsrv-training"
                                                          : !strncmp(names[i], "ft:", 3) ? "llsrv-fine-tuning"
                                                                                         : "llsrv-adapter"));
  if (one) {
    for (size_t i = 0; i < json_array_size(data); i++) {
      json_t *m = json_array_get(data, i);
      if (!strcmp(json_string_value(json_object_get(m, "id")), one)) {
        json_incref(m);
        json_decref(data);
        send_json(h, req, 200, "OK", m);
        return;
      }
    }
    json_decref(data);
    send_error(h, req, 404, "model_not_found", "model", "The model '%.200s' does not exist", one);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "object", json_string("list"));
  json_object_set_new(o, "data", data);
  send_json(h, req, 200, "OK", o);
}

static void fmt_hist(struct buf *b, const char *name, const char *help, const struct hist *hs) {
  char line[256];
  int k = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  buf_add(b, line, (size_t)k);
  for (int i = 0; i < N_BUCKETS; i++) {
    k = snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, k_buckets[i], (unsigned long long)hs->b[i]);
    buf_add(b, line, (size_t)k);
  }
  k = snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)hs->count, name,
               hs->sum, name, (unsigned long long)hs->count);
  buf_add(b, line, (size_t)k);
}

static void metric(struct buf *b, const char *name, const char *type, const char *help, double v) {
  char line[512];
  int k = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
  buf_add(b, line, (size_t)k);
}

static void handle_metrics(struct ll_http *h, h2o_req_t *req) {
  struct ll_server *s = h->srv;
  struct ll_sched_stats st;
  ll_sched_get_stats(s->sched, &st);
  struct buf b = {0};
  char line[256];
  buf_str(&b, "# HELP llsrv_requests_total Generation requests finished, by outcome (finish reason or error code).\n"
              "# TYPE llsrv_requests_total counter\n");
  for (int i = 0; k_outcomes[i]; i++) {
    int k = snprintf(line, sizeof line, "llsrv_requests_total{outcome=\"%s\"} %llu\n", k_outcomes[i], (unsigned long long)h->outcomes[i]);
    buf_add(&b, line, (size_t)k);
  }
  metric(&b, "llsrv_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", (double)h->prompt_tokens);
  metric(&b, "llsrv_generation_tokens_total", "counter", "Tokens generated by finished requests.", (double)h->gen_tokens);
  fmt_hist(&b, "llsrv_time_to_first_token_seconds", "From submission to the first generated token.", &h->ttft);
  fmt_hist(&b, "llsrv_time_per_output_token_seconds", "Time between generated tokens (each request's mean, once per token).", &h->tpot);
  metric(&b, "llsrv_requests_running", "gauge", "Requests decoding now.", st.active);
  metric(&b, "llsrv_requests_waiting", "gauge", "Requests queued for a free sequence.", st.queued);
  metric(&b, "llsrv_kv_blocks_used", "gauge", "KV cache blocks in use.", st.kv_blocks_used);
  metric(&b, "llsrv_kv_blocks_total", "gauge", "KV cache blocks in all.", s->info.kv_blocks_total);
  metric(&b, "llsrv_decode_tokens_per_second", "gauge", "Decode rate over the last second.", st.decode_tps);
  metric(&b, "llsrv_prefill_tokens_per_second", "gauge", "Prompt reading rate over the last second.", st.prefill_tps);
  buf_str(&b, "# HELP llsrv_clients Open connections by protocol.\n# TYPE llsrv_clients gauge\n");
  int k = snprintf(line, sizeof line, "llsrv_clients{protocol=\"line\"} %d\nllsrv_clients{protocol=\"http\"} %d\n", s->n_conns, h->n_conns);
  buf_add(&b, line, (size_t)k);
  buf_str(&b, "# HELP llsrv_http_responses_total HTTP responses by status class.\n# TYPE llsrv_http_responses_total counter\n");
  for (int i = 1; i <= 5; i++) {
    k = snprintf(line, sizeof line, "llsrv_http_responses_total{code=\"%dxx\"} %llu\n", i, (unsigned long long)h->http_status[i]);
    buf_add(&b, line, (size_t)k);
  }
  int64_t dev_used = s->info.device_mem_used, train_dev = s->job ? ll_trainjob_device_bytes(s->job) : -1;
  if (train_dev > 0) dev_used += train_dev;
  metric(&b, "llsrv_device_memory_used_bytes", "gauge", "Device memory allocated by the server (weights, KV cache, trainer).", (double)dev_used);
  metric(&b, "llsrv_device_memory_total_bytes", "gauge", "The device's memory (0 on the CPU).", (double)s->info.device_mem_total);
  metric(&b, "llsrv_host_rss_bytes", "gauge", "Resident memory of the process.", (double)ll_host_rss_bytes());
  json_t *tj = s->job ? ll_trainjob_json(s->job) : NULL;
  json_t *v;
  metric(&b, "llsrv_train_running", "gauge", "1 while a training job runs.",
         tj && json_is_string(json_object_get(tj, "state")) && !strcmp(json_string_value(json_object_get(tj, "state")), "running"));
  if (tj && json_is_number(v = json_object_get(tj, "step"))) metric(&b, "llsrv_train_step", "gauge", "The training job's optimizer step.", json_number_value(v));
  if (tj && json_is_number(v = json_object_get(tj, "loss"))) metric(&b, "llsrv_train_loss", "gauge", "The training loss of the last step.", json_number_value(v));
  if (tj && json_is_number(v = json_object_get(tj, "tokens_per_s")))
    metric(&b, "llsrv_train_tokens_per_second", "gauge", "Training throughput.", json_number_value(v));
  json_decref(tj);
  struct ll_ftjobs_stats fs;
  ll_ftjobs_stats(s->ft, &fs);
  buf_str(&b, "# HELP llsrv_fine_tuning_jobs Fine-tuning jobs by status.\n# TYPE llsrv_fine_tuning_jobs gauge\n");
  for (int i = 0; ll_ftjobs_status_name(i); i++) {
    k = snprintf(line, sizeof line, "llsrv_fine_tuning_jobs{status=\"%s\"} %lld\n", ll_ftjobs_status_name(i), (long long)fs.jobs[i]);
    buf_add(&b, line, (size_t)k);
  }
  metric(&b, "llsrv_fine_tuning_files", "gauge", "Uploaded fine-tuning files.", (double)fs.files);
  if (fs.running) {
    metric(&b, "llsrv_fine_tuning_step", "gauge", "The running fine-tuning job's optimizer step.", (double)fs.step);
    metric(&b, "llsrv_fine_tuning_total_steps", "gauge", "The running fine-tuning job's steps in all.", (double)fs.total_steps);
    if (isfinite(fs.loss)) metric(&b, "llsrv_fine_tuning_loss", "gauge", "The running fine-tuning job's last training loss.", fs.loss);
  }
  metric(&b, "llsrv_uptime_seconds", "gauge", "Seconds since the server started.", (now_ms() - s->t_start) / 1e3);
  count_status(h, 200);
  req->res.status = 200;
  req->res.reason = "OK";
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("text/plain; version=0.0.4; charset=utf-8"));
  h2o_send_inline(req, b.p ? b.p : "", b.n);
  free(b.p);
}

// Hands a request to the scheduler (ll_net_submit) with a table slot for its events; sends a
// 429 itself when the queue is full.
static void submit(struct ll_http *h, h2o_req_t *req, struct ll_sched_req *r, struct hreq *hr) {
  struct ll_server *s = h->srv;
  int slot = -1;
  for (int i = 0; i < h->n_reqs_cap; i++)
    if (!h->reqs[i]) {
      slot = i;
      break;
    }
  if (slot < 0 || s->outstanding >= s->cfg->parallel + s->cfg->max_queued) {
    send_error(h, req, 429, "busy", NULL, "queue full (%d requests active or queued; max_queued=%lld)", s->outstanding, (long long)s->cfg->max_queued);
    ll_sched_req_free(r);
    free(hr);
    return;
  }
  struct hreq **ref = h2o_mem_alloc_shared(&req->pool, sizeof *ref, req_gone);
  *ref = hr;
  hr->http = h;
  hr->slot = slot;
  hr->uid = (uint64_t)((uint32_t)slot | HTTP_UID_BIT) | ((uint64_t)++h->gen << 32);
  snprintf(hr->id, sizeof hr->id, "h%llu", (unsigned long long)++h->next_id);
  hr->req = req;
  hr->created = (long long)time(NULL);
  hr->t_start = now_ms();
  snprintf(r->id, sizeof r->id, "%s", hr->id);
  r->conn = hr->uid;
  h->reqs[slot] = hr;
  ll_net_submit(s, r); // a refusal comes back as its final event (503 shutdown / 500)
}

// A request and its table entry, zeroed (slot -1: none yet); 0, or -1 with the 500 sent.
static int req_alloc(struct ll_http *h, h2o_req_t *req, struct ll_sched_req **r, struct hreq **hr) {
  *r = calloc(1, sizeof **r);
  *hr = calloc(1, sizeof **hr);
  if (!*r || !*hr) {
    free(*r), free(*hr);
    send_error(h, req, 500, "internal", NULL, "out of memory");
    return -1;
  }
  (*hr)->slot = -1;
  return 0;
}

static void handle_generate(struct ll_http *h, h2o_req_t *req, enum hkind kind, struct body *b) {
  struct ll_sched_req *r;
  struct hreq *hr;
  if (req_alloc(h, req, &r, &hr)) return;
  hr->kind = kind;
  hr->special = 0;
  r->kind = kind == HK_CHAT ? LL_REQ_CHAT : LL_REQ_GEN; // before the defaults: a chat's messages are text
  ll_gen_defaults(r, h->srv->cfg->default_max_tokens);
  json_t *v;
  int status = 400, rc;
  if (parse_sampling(h, b, r) != 0) goto bad;
  if ((status = resolve_model(h, b, r, hr->model, sizeof hr->model)) != 0) goto bad;
  status = 400;
  if ((rc = member(b, "stream", 'b', &v)) < 0) goto bad;
  hr->stream = rc && json_is_true(v);
  if ((rc = member(b, "stream_options", 'o', &v)) < 0) goto bad;
  if (rc) {
    json_t *iu = json_object_get(v, "include_usage");
    if (iu && !json_is_boolean(iu)) {
      snprintf(b->msg, sizeof b->msg, "'stream_options.include_usage' must be a boolean");
      b->param = "stream_options";
      goto bad;
    }
    hr->include_usage = iu && json_is_true(iu);
  }
  if (kind == HK_CHAT) {
    if ((rc = member(b, "logprobs", 'b', &v)) < 0) goto bad;
    hr->logprobs = rc && json_is_true(v);
    if ((rc = member(b, "top_logprobs", 'i', &v)) < 0) goto bad;
    if (rc) {
      int64_t x = jint(v);
      if (x < 0 || x > 20) {
        snprintf(b->msg, sizeof b->msg, "'top_logprobs' must be in 0..20");
        b->param = "top_logprobs";
        goto bad;
      }
      if (!hr->logprobs) {
        snprintf(b->msg, sizeof b->msg, "'top_logprobs' needs 'logprobs': true");
        b->param = "top_logprobs";
        goto bad;
      }
      hr->top_logprobs = (int)x;
    }
    // Thinking (Qwen3's template): top-level enable_thinking (the table, llama-server's and
    // llsrv's line protocol's name), then chat_template_kwargs.enable_thinking (vLLM's and
    // llama-server's spelling; other keys are accepted and ignored: no Jinja runs here), then
    // reasoning_effort "none" (llama-server's) turns it off.
    if ((rc = member(b, "chat_template_kwargs", 'o', &v)) < 0) goto bad;
    json_t *et = rc ? json_object_get(v, "enable_thinking") : NULL;
    if (et && !json_is_null(et)) {
      if (!json_is_boolean(et)) {
        snprintf(b->msg, sizeof b->msg, "'chat_template_kwargs.enable_thinking' must be a boolean");
        b->param = "chat_template_kwargs";
        goto bad;
      }
      r->enable_thinking = json_is_true(et);
    }
    if ((rc = member(b, "reasoning_effort", 's', &v)) < 0) goto bad;
    if (rc && !strcmp(json_string_value(v), "none")) r->enable_thinking = 0;
    const char *dflt = h->srv->cfg->reasoning_format;
    hr->reasoning = dflt && strcmp(dflt, "none") != 0; // the server's reasoning_format option
    if ((rc = member(b, "reasoning_format", 's', &v)) < 0) goto bad;
    if (rc) {
      const char *rf = json_string_value(v);
      if (strcmp(rf, "none") && strcmp(rf, "auto") && strcmp(rf, "deepseek")) {
        snprintf(b->msg, sizeof b->msg, "'reasoning_format' must be none, auto or deepseek (got '%.40s')", rf);
        b->param = "reasoning_format";
        goto bad;
      }
      hr->reasoning = strcmp(rf, "none") != 0;
    }
    if (!(r->text = chat_text(b))) goto bad;
    r->kind = LL_REQ_CHAT;
    r->chat_default = 1; // a model without a template is chatted with in chatml, as llama-server does
  } else {
    if ((rc = member(b, "logprobs", 'i', &v)) < 0) goto bad;
    if (rc) {
      int64_t x = jint(v);
      if (x < 0 || x > 20) {
        snprintf(b->msg, sizeof b->msg, "'logprobs' must be in 0..20");
        b->param = "logprobs";
        goto bad;
      }
      hr->logprobs = 1, hr->top_logprobs = (int)x;
    }
    json_t *p = json_object_get(b->j, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
    if (!json_is_string(p)) {
      snprintf(b->msg, sizeof b->msg, "'prompt' must be a string (or an array of one string)");
      b->param = "prompt";
      goto bad;
    }
    r->text = strdup(json_string_value(p));
    if (!r->text) goto oom;
    r->kind = LL_REQ_GEN;
  }
  r->text_len = strlen(r->text); // JSON strings can hold NUL (\u0000); the prompt ends at the first
  r->sp.n_probs = hr->logprobs ? hr->top_logprobs : 0;
  r->want_logprob = hr->logprobs;
  snprintf(hr->cid, sizeof hr->cid, "%s-%llu%04x", kind == HK_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)h->next_id + 1,
           (unsigned)(uv_hrtime() & 0xffff));
  submit(h, req, r, hr);
  return;
oom:
  snprintf(b->msg, sizeof b->msg, "out of memory");
  status = 500;
bad:
  send_error(h, req, status, status == 404 ? "model_not_found" : status == 500 ? "internal" : "invalid_value", b->param, "%s", b->msg);
  ll_sched_req_free(r);
  free(hr);
}

static void handle_tokenize(struct ll_http *h, h2o_req_t *req, int detok, struct body *b) {
  struct ll_sched_req *r;
  struct hreq *hr;
  if (req_alloc(h, req, &r, &hr)) return;
  hr->special = 1;
  json_t *v;
  int rc;
  if (!detok) {
    hr->kind = HK_TOKENIZE;
    r->kind = LL_REQ_TOKENIZE;
    if ((rc = member(b, "content", 's', &v)) <= 0) {
      if (rc == 0) snprintf(b->msg, sizeof b->msg, "'content' (a string) is required"), b->param = "content";
      goto bad;
    }
    r->text = strdup(json_string_value(v));
    if ((rc = member(b, "add_special", 'b', &v)) < 0) goto bad;
    r->add_bos = rc && json_is_true(v);
    r->special = 1;
    if ((rc = member(b, "with_pieces", 'b', &v)) < 0) goto bad;
    hr->with_pieces = rc && json_is_true(v);
  } else {
    hr->kind = HK_DETOKENIZE;
    r->kind = LL_REQ_DETOKENIZE;
    if ((rc = member(b, "tokens", 'a', &v)) <= 0) {
      if (rc == 0) snprintf(b->msg, sizeof b->msg, "'tokens' (an array of token ids) is required"), b->param = "tokens";
      goto bad;
    }
    struct buf t = {0};
    buf_add(&t, "", 0);
    for (size_t i = 0; i < json_array_size(v); i++) {
      json_t *e = json_array_get(v, i);
      if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) {
        free(t.p);
        snprintf(b->msg, sizeof b->msg, "tokens[%zu] must be a token id (an integer >= 0)", i);
        b->param = "tokens";
        goto bad;
      }
      char num[24];
      int k = snprintf(num, sizeof num, i ? " %lld" : "%lld", (long long)json_integer_value(e));
      buf_add(&t, num, (size_t)k);
    }
    r->text = t.p;
    r->add_bos = 0;
    r->special = 1;
  }
  if (!r->text) {
    snprintf(b->msg, sizeof b->msg, "out of memory");
    goto bad;
  }
  r->text_len = strlen(r->text);
  submit(h, req, r, hr);
  return;
bad:
  send_error(h, req, 400, "invalid_value", b->param, "%s", b->msg);
  ll_sched_req_free(r);
  free(hr);
}

// PATH itself or below it.
static int path_under(h2o_req_t *req, const char *p) {
  size_t n = strlen(p);
  return req->path_normalized.len >= n && memcmp(req->path_normalized.base, p, n) == 0 &&
         (req->path_normalized.len == n || req->path_normalized.base[n] == '/');
}

// ---- the fine-tuning API (ftjobs.c) ----

// An answer that may come later (an upload, after the worker has stored it): this context
// outlives whichever comes last of the answer and the h2o_req_t (H2O disposes of it when the
// client goes): a ref-counted chunk, one reference held by the request's pool, one by ftjobs.
struct ftctx {
  struct ll_http *h;
  h2o_req_t *req; // NULL once H2O has disposed of it
};

static void ft_req_gone(void *p) {
  struct ftctx *c = *(struct ftctx **)p;
  c->req = NULL;
  h2o_mem_release_shared(c);
}

static void ft_reply(void *ctx, int status, json_t *body) {
  struct ftctx *c = ctx;
  if (body && c->req) send_json(c->h, c->req, status, status_reason(status), body);
  else json_decref(body);
  h2o_mem_release_shared(c);
}

static void handle_fine_tuning(struct ll_http *h, h2o_req_t *req) {
  struct ll_server *s = h->srv;
  if (!s->ft) {
    send_error(h, req, 503, "unavailable", NULL, "the fine-tuning API is not available (the server is starting or stopping)");
    return;
  }
  const h2o_iovec_t p = req->path_normalized;
  const int upload = p.len == 9 && method_is(req, "POST");
  if (!upload && req->entity.base && req->entity.len > (size_t)s->cfg->max_line) { // H2O's limit is max_upload's
    send_error(h, req, 413, "body_too_large", NULL, "the body is larger than max_line (%lld bytes)", (long long)s->cfg->max_line);
    return;
  }
  ssize_t ct = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_TYPE, -1);
  const h2o_iovec_t ctype = ct >= 0 ? req->headers.entries[ct].value : h2o_iovec_init("", 0);
  const char *q = req->query_at != SIZE_MAX ? req->path.base + req->query_at + 1 : "";
  const size_t qlen = req->query_at != SIZE_MAX ? req->path.len - req->query_at - 1 : 0;
  struct ftctx *c = h2o_mem_alloc_shared(NULL, sizeof *c, NULL); // ftjobs' reference
  c->h = h, c->req = req;
  struct ftctx **ref = h2o_mem_alloc_shared(&req->pool, sizeof *ref, ft_req_gone);
  *ref = c;
  h2o_mem_addref_shared(c); // the pool's
  if (!ll_ftjobs_request(s->ft, req->method.base, req->method.len, p.base + 3, p.len - 3, q, qlen, req->entity.base, req->entity.base ? req->entity.len : 0,
                         ctype.base, ctype.len, ft_reply, c)) {
    h2o_mem_release_shared(c);
    send_error(h, req, 404, "not_found", NULL, "no endpoint %.*s %.*s (see man 7 llsrv-http)", (int)(req->method.len < 16 ? req->method.len : 16),
               req->method.base, (int)(p.len < 200 ? p.len : 200), p.base);
  }
}

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
  struct ll_http *h = *(struct ll_http **)(self + 1);
  struct ll_server *s = h->srv;
  int get = method_is(req, "GET") || method_is(req, "HEAD"), post = method_is(req, "POST");
  if (path_is(req, "/health")) {
    if (!get) goto bad_method;
    const char *st = s->loading ? "loading" : s->shutting_down ? "shutting_down" : "ok";
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(st));
    send_json(h, req, strcmp(st, "ok") ? 503 : 200, strcmp(st, "ok") ? "Service Unavailable" : "OK", o);
    return 0;
  }
  if (!auth_ok(h, req)) {
    ll_log(LL_LOG_WARN, "http: request without the right bearer token"); // never the token itself
    send_error(h, req, 401, "invalid_api_key", NULL, "Incorrect API key: send 'Authorization: Bearer TOKEN' (the server's auth_token)");
    return 0;
  }
  if (s->loading) {
    send_error(h, req, 503, "loading", NULL, "the model is loading; GET /health says when it is served");
    return 0;
  }
  if (path_is(req, "/metrics")) {
    if (!get) goto bad_method;
    handle_metrics(h, req);
    return 0;
  }
  if (path_is(req, "/v1/models")) {
    if (!get) goto bad_method;
    handle_models(h, req, NULL);
    return 0;
  }
  if (req->path_normalized.len > 11 && !memcmp(req->path_normalized.base, "/v1/models/", 11)) {
    if (!get) goto bad_method;
    char id[256];
    snprintf(id, sizeof id, "%.*s", (int)(req->path_normalized.len - 11 < 255 ? req->path_normalized.len - 11 : 255), req->path_normalized.base + 11);
    handle_models(h, req, id);
    return 0;
  }
  if (path_under(req, "/v1/files") || path_under(req, "/v1/fine_tuning")) {
    handle_fine_tuning(h, req);
    return 0;
  }
  if (req->entity.base && req->entity.len > (size_t)s->cfg->max_line) { // H2O's limit is max_upload's
    send_error(h, req, 413, "body_too_large", NULL, "the body is larger than max_line (%lld bytes)", (long long)s->cfg->max_line);
    return 0;
  }
  int chat = path_is(req, "/v1/chat/completions"), compl = path_is(req, "/v1/completions");
  int tok = path_is(req, "/tokenize"), detok = path_is(req, "/detokenize");
  if (!chat && !compl && !tok && !detok) {
    send_error(h, req, 404, "not_found", NULL, "no endpoint %.*s %.*s (see man 7 llsrv-http)", (int)(req->method.len < 16 ? req->method.len : 16),
               req->method.base, (int)(req->path_normalized.len < 200 ? req->path_normalized.len : 200), req->path_normalized.base);
    return 0;
  }
  if (!post) goto bad_method;
  if (s->shutting_down) {
    send_error(h, req, 503, "shutdown", NULL, "the server is shutting down");
    return 0;
  }
  struct body b = {0};
  json_error_t je;
  b.j = req->entity.base ? json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &je) : NULL;
  if (!b.j) {
    if (!req->entity.base) send_error(h, req, 400, "invalid_json", NULL, "the request needs a JSON body");
    else send_error(h, req, 400, "invalid_json", NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    return 0;
  }
  if (!json_is_object(b.j)) {
    send_error(h, req, 400, "invalid_json", NULL, "the body must be a JSON object");
  } else if (chat || compl) {
    handle_generate(h, req, chat ? HK_CHAT : HK_COMPLETION, &b);
  } else {
    handle_tokenize(h, req, detok, &b);
  }
  json_decref(b.j);
  return 0;
bad_method:
  send_error(h, req, 405, "method_not_allowed", NULL, "method %.*s is not allowed here", (int)(req->method.len < 16 ? req->method.len : 16), req->method.base);
  return 0;
}

// Once stopping and without connections: H2O's timers with no entries may still be armed (one
// fires once more, finds nothing and stops; the request timeout's after up to 30 s) - stop them;
// the one-second one keeps an entry of the context's own, not a connection's - it must not hold
// the loop either.
static void quiet_timers(struct ll_http *h) {
  h2o_timeout_t *const ts[] = {&h->ctx.zero_timeout, &h->ctx.hundred_ms_timeout, &h->ctx.handshake_timeout, &h->ctx.http1.req_timeout,
                               &h->ctx.http2.idle_timeout, &h->ctx.http2.graceful_shutdown_timeout, &h->ctx.proxy.io_timeout};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    if (h2o_linklist_is_empty(&ts[i]->_entries)) uv_timer_stop(&ts[i]->_backend.timer);
  uv_unref((uv_handle_t *)&h->ctx.one_sec_timeout._backend.timer);
}

// ---- connections ----

static void on_conn_closed(uv_handle_t *hd) {
  struct hconn *c = (struct hconn *)hd;
  struct ll_http *h = c->http;
  h->n_conns--;
  if (c->prev) c->prev->next = c->next;
  else h->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  free(c);
  if (h->closing && h->n_conns == 0) quiet_timers(h);
}

static void on_refused_closed(uv_handle_t *hd) { free(hd); }

static void on_connection(uv_stream_t *server, int status) {
  struct ll_http *h = server->data;
  struct ll_server *s = h->srv;
  if (status < 0) {
    ll_log(LL_LOG_WARN, "http accept: %s", uv_strerror(status));
    return;
  }
  struct hconn *hc = calloc(1, sizeof *hc);
  if (!hc) return;
  uv_tcp_t *c = &hc->h;
  hc->http = h;
  uv_tcp_init(s->loop, c);
  if (uv_accept(server, (uv_stream_t *)c) != 0) {
    uv_close((uv_handle_t *)c, on_refused_closed);
    return;
  }
  if (h->n_conns >= s->cfg->max_clients || s->shutting_down) {
    // Tell the client why, then close (best effort; not counted as a connection).
    static const char body[] = "{\"error\":{\"message\":\"too many clients\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_clients\"}}\n";
    char busy[320];
    int k = snprintf(busy, sizeof busy, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                                        "Connection: close\r\n\r\n%s", sizeof body - 1, body);
    uv_buf_t bb = uv_buf_init(busy, (unsigned)k);
    uv_try_write((uv_stream_t *)c, &bb, 1);
    uv_close((uv_handle_t *)c, on_refused_closed);
    return;
  }
  h->n_conns++;
  hc->next = h->conns;
  if (h->conns) h->conns->prev = hc;
  h->conns = hc;
  uv_tcp_nodelay(c, 1);
  h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)c, on_conn_closed);
  h2o_accept(&h->accept, sock);
}

int ll_http_start(struct ll_server *s, char *err, size_t errlen) {
  const char *spec = s->cfg->http;
  if (!spec || !*spec || !strcmp(spec, "off")) return 0;
  char host[100];
  int port;
  int rc = ll_net_parse_listen(spec, host, sizeof host, &port, err, errlen);
  if (rc) return ll_errf(err, errlen, rc, "http: %s", err);
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  struct sockaddr_storage ss;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 && uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
    return ll_errf(err, errlen, LL_EINVAL, "http '%s': '%s' is not an IP address", spec, host);
  struct ll_http *h = calloc(1, sizeof *h);
  if (!h) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  s->http = h;
  h->srv = s;
  h->t_epoch = (long long)time(NULL);
  h->n_reqs_cap = (int)(s->cfg->max_clients + s->cfg->parallel + s->cfg->max_queued);
  h->reqs = calloc((size_t)h->n_reqs_cap, sizeof *h->reqs);
  if (!h->reqs) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  ll_server_model_id(s->model_path, h->base_id, sizeof h->base_id);

  h2o_config_init(&h->conf);
  h->conf_ready = 1;
  h->conf.server_name = h2o_iovec_init(H2O_STRLIT("llsrv"));
  // Uploads (POST /v1/files) up to max_upload; every other body is refused past max_line.
  h->conf.max_request_entity_size = (size_t)(s->cfg->max_upload > s->cfg->max_line ? s->cfg->max_upload : s->cfg->max_line);
  double t = s->cfg->line_timeout < s->cfg->idle_timeout ? s->cfg->line_timeout : s->cfg->idle_timeout;
  h->conf.http1.req_timeout = (uint64_t)(t * 1000.0);
  h->conf.http1.upgrade_to_http2 = 0;
  h2o_hostconf_t *host_conf = h2o_config_register_host(&h->conf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
  h2o_pathconf_t *pc = h2o_config_register_path(host_conf, "/", 0);
  h2o_handler_t *hd = h2o_create_handler(pc, sizeof *hd + sizeof(struct ll_http *));
  hd->on_req = on_req;
  *(struct ll_http **)(hd + 1) = h;
  h2o_context_init(&h->ctx, s->loop, &h->conf);
  h->ctx_ready = 1;
  h->accept.ctx = &h->ctx;
  h->accept.hosts = h->conf.hosts;

  uv_tcp_init(s->loop, &h->listener);
  h->listener.data = h;
  h->listening = 1;
  int r = uv_tcp_bind(&h->listener, (struct sockaddr *)&ss, 0);
  if (r == 0) r = uv_listen((uv_stream_t *)&h->listener, 511, on_connection);
  if (r != 0) return ll_errf(err, errlen, LL_EIO, "http %s: %s", spec, uv_strerror(r));
  int sl = sizeof ss;
  uv_tcp_getsockname(&h->listener, (struct sockaddr *)&ss, &sl);
  char name[64] = "?";
  if (ss.ss_family == AF_INET) {
    uv_ip4_name((struct sockaddr_in *)&ss, name, sizeof name);
    snprintf(s->http_addr, sizeof s->http_addr, "%s:%d", name, ntohs(((struct sockaddr_in *)&ss)->sin_port));
  } else {
    uv_ip6_name((struct sockaddr_in6 *)&ss, name, sizeof name);
    snprintf(s->http_addr, sizeof s->http_addr, "[%s]:%d", name, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
  }
  return 0;
}

void ll_http_shutdown(struct ll_server *s) {
  struct ll_http *h = s->http;
  if (!h || !h->listening) return;
  h->listening = 0;
  uv_close((uv_handle_t *)&h->listener, NULL);
}

// H2O's context keeps handles of its own on our loop (a uv_async for other threads' messages,
// unused here, and a periodic timer): they must not keep the loop alive once the server is
// stopping; open connections still do. ll_http_free closes them.
static void unref_h2o(uv_handle_t *hd, void *arg) {
  struct ll_server *s = arg;
  if ((hd->type == UV_ASYNC) && hd != (uv_handle_t *)&s->stop_timer && !uv_is_closing(hd)) uv_unref(hd);
}

void ll_http_close_all(struct ll_server *s) {
  struct ll_http *h = s->http;
  if (!h) return;
  ll_http_shutdown(s);
  if (h->ctx_ready) h2o_context_request_shutdown(&h->ctx); // later responses say Connection: close
  // H2O does not close idle keep-alive HTTP/1 connections on shutdown: half-close their reading
  // side, so that each connection reads EOF and closes itself by H2O's own path.
  for (struct hconn *c = h->conns; c; c = c->next) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->h, &fd) == 0) shutdown(fd, SHUT_RD);
  }
  uv_walk(s->loop, unref_h2o, s);
  h->closing = 1;
  if (h->n_conns == 0) quiet_timers(h);
}

void ll_http_free(struct ll_server *s) {
  struct ll_http *h = s->http;
  if (!h) return;
  // An entry H2O keeps in its one-second timeout for the context's own periodic work would
  // fail h2o_timeout_dispose's check that no entry is left: unlink what is left there.
  while (h->ctx_ready && !h2o_linklist_is_empty(&h->ctx.one_sec_timeout._entries))
    h2o_timeout_unlink(H2O_STRUCT_FROM_MEMBER(h2o_timeout_entry_t, _link, h->ctx.one_sec_timeout._entries.next));
  if (h->ctx_ready) h2o_context_dispose(&h->ctx);
  if (h->conf_ready) h2o_config_dispose(&h->conf);
  for (int i = 0; i < h->n_reqs_cap; i++)
    if (h->reqs[i]) {
      h->reqs[i]->slot = -1;
      if (!h->reqs[i]->req) hreq_free(h->reqs[i]); // else its connection still holds it (forced exit)
    }
  free(h->reqs);
  free(h);
  s->http = NULL;
}

int ll_http_is_uid(uint64_t uid) { return (uid & HTTP_UID_BIT) != 0; }
