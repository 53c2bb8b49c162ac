// sched.c - continuous batching on one compute thread (see ll_sched.h).
//
// Step: take new requests and cancels under the lock; answer TOKENIZE/DETOKENIZE at once;
// admit GEN/CHAT requests into free slots (tokenize, check the context, take a sequence);
// build ONE batch = one token per generating slot + a prefill chunk per prompt-reading slot
// (bounded by the engine's batch size); decode; sample each slot that got logits; queue
// structured events (token, prob, end, error) in the outbox; wake the loop, whose protocols
// encode them.
#include "ll_sched.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_chat.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_log.h"
#include "ll_tokenizer.h"

#define MAX_BATCH_TOKENS 512 // the engine's batch limit (MAX_BATCH_DEFAULT in engine.c)
#define MAX_TEXT_IDS 1000000 // ids accepted by DETOKENIZE / id prompts

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct slot {
  struct ll_sched_req *r;
  struct slot *next_wait; // waiting list link (unused while active)
  int seq;
  int32_t *tokens;        // (n_prompt) prompt ids
  int n_prompt, n_prefilled, n_gen, max_gen;
  int32_t last;           // last sampled token, fed at the next step
  int has_logits;
  float *logits;          // (V)
  int greedy;             // plain greedy sampling: the engine takes the argmax (on a device, only it comes back)
  int32_t amax;           // ... into here
  int devs;               // sampling the device can take (ll_sampler_dev_ok: top-k, penalties): the engine takes the sampler's step too (ll_sampler_dev_next), into amax
  struct ll_sample_dev sd; // ... this step's
  struct ll_sampler *smp;
  struct ll_stop_matcher *stop;
  struct ll_detok_stream ds;
  char hold[8];           // an incomplete UTF-8 sequence held back between TOK lines
  int n_hold;
  double t_admit, t_first, t_end;
  int cancel;             // reason to end at the next step: 0 none, else an END reason
  char adapter[LL_ADAPTER_NAME_MAX + 1]; // resolved adapter name ("none" for the base model)
  struct aver *aver;      // the published adapter version it computes with (counted in its users), or NULL
};

enum { END_NONE, END_CANCEL, END_SHUTDOWN };

// A published adapter version (ll_sched_adapter_publish): owned by the scheduler, released
// once no name maps to it and no request computes with it. users and registered under mu.
struct aver {
  struct aver *next;
  struct ll_lora *a;
  void (*release)(struct ll_lora *a);
  char name[LL_ADAPTER_NAME_MAX + 1];
  uint64_t version;
  int users, registered;
};

struct cancel_req {
  struct cancel_req *next;
  uint64_t conn;
  int all;
  char id[LL_PROTO_MAX_ID + 1];
};

struct ll_sched {
  struct ll_engine *e;
  const struct ll_tokenizer *tok;
  char *chat_template; // the configured one (owned); NULL: the model's
  int V, n_ctx, parallel, chunk;
  ll_sched_notify_fn notify;
  void *user;
  pthread_t thread;
  int thread_started;

  pthread_mutex_t mu;     // guards everything below up to `stats`
  pthread_cond_t cv;
  struct ll_sched_req **in; // submitted, not yet seen by the compute thread
  int n_in, cap_in;
  struct cancel_req *cancels;
  int shutdown, quit;
  struct ll_sched_ev *out_head, *out_tail;
  struct ll_sched_stats stats;
  struct { char name[LL_ADAPTER_NAME_MAX + 1]; const struct ll_lora *a; struct aver *v; } adapters[LL_SCHED_MAX_ADAPTERS];
  struct aver *vers; // every published version not yet released
  int n_adapters;
  char default_adapter[LL_ADAPTER_NAME_MAX + 1];
  char live_why[256]; // why adapter=live names no adapter now ("": training is not running)

  // compute thread only
  struct slot *wait_head, *wait_tail;
  int n_wait;
  struct slot **active; // (parallel)
  struct ll_sched_ev *pend_head, *pend_tail; // events of this step, published at its end
  struct ll_batch_item *items;
  // A decode step queued behind the previous one (ll_engine_decode_queue) and not yet collected:
  // its sequences in slot order (q_n of them; 0: none queued). Compute thread only.
  int *q_seqs, q_n, *q_next;
  int32_t *q_ids;
  uint64_t q_behind, q_first; // steps queued behind a queued one; queued from the host's ids
  uint64_t tok_gen, tok_prefill, req_total, req_done;
  double win_t0;
  uint64_t win_gen, win_prefill;
  double decode_tps, prefill_tps;
  char *esc; // escape buffer
  size_t esc_cap;
  // background work (training): the function is set before requests flow; bg_wake under mu
  ll_sched_bg_fn bg_fn;
  void *bg_user;
  double bg_share;
  int bg_more, bg_wake;
  double bg_ms, fg_ms; // compute time spent on each, decayed (a ~10 s window)
  atomic_int busy;     // requests in flight (ll_sched_busy)
};

// ---- output ----

// A new event queued for this step's publication, with data[0..len) copied; NULL when out of
// memory (then a final event is still queued without its data: the loop must learn that the
// request ended).
static struct ll_sched_ev *ev_push(struct ll_sched *s, enum ll_sched_ev_type type, uint64_t conn, const char *id, int final,
                                   const void *data, size_t len) {
  struct ll_sched_ev *o = malloc(sizeof *o + len + 1);
  if (!o) {
    if (!final) return NULL;
    o = malloc(sizeof *o + 1);
    if (!o) return NULL;
    len = 0;
  }
  memset(o, 0, sizeof *o);
  o->type = type;
  o->conn = conn;
  o->final = final;
  snprintf(o->id, sizeof o->id, "%s", id ? id : "");
  if (len && data) memcpy(o->data, data, len);
  o->data[len] = 0;
  o->len = len;
  if (s->pend_tail) s->pend_tail->next = o;
  else s->pend_head = o;
  s->pend_tail = o;
  return o;
}

// A monitor event line (JSON + '\n') built with printf arguments.
static void emit_monitor(struct ll_sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit_monitor(struct ll_sched *s, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  if ((size_t)k >= sizeof buf) k = (int)sizeof buf - 1;
  ev_push(s, LL_EV_MONITOR, 0, NULL, 0, buf, (size_t)k);
}

// Escaped copy of bytes in s->esc (NUL-terminated), or "" if out of memory (monitor JSON).
static const char *esc(struct ll_sched *s, const char *p, size_t n) {
  size_t need = 4 * n + 1;
  if (need > s->esc_cap) {
    char *q = realloc(s->esc, need);
    if (!q) return "";
    s->esc = q, s->esc_cap = need;
  }
  size_t k = ll_proto_escape(p, n, 0, s->esc, s->esc_cap - 1);
  s->esc[k] = 0;
  return s->esc;
}

static void publish(struct ll_sched *s) {
  if (!s->pend_head) return;
  pthread_mutex_lock(&s->mu);
  if (s->out_tail) s->out_tail->next = s->pend_head;
  else s->out_head = s->pend_head;
  s->out_tail = s->pend_tail;
  pthread_mutex_unlock(&s->mu);
  s->pend_head = s->pend_tail = NULL;
  s->notify(s->user);
}

// ---- requests ----

void ll_sched_req_free(struct ll_sched_req *r) {
  if (!r) return;
  free(r->text);
  for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
  free(r);
}

// Versions no name maps to and no request uses, unlinked from s->vers (caller holds mu);
// released by the caller after unlocking.
static struct aver *avers_unused(struct ll_sched *s) {
  struct aver *done = NULL;
  for (struct aver **pp = &s->vers; *pp;) {
    struct aver *v = *pp;
    if (!v->registered && v->users == 0) {
      *pp = v->next;
      v->next = done, done = v;
    } else {
      pp = &v->next;
    }
  }
  return done;
}
static void avers_release(struct aver *done) {
  for (struct aver *n; done; done = n) {
    n = done->next;
    ll_log(LL_LOG_INFO, "adapter '%s' version %llu released (replaced or unloaded, and no request uses it)", done->name,
           (unsigned long long)done->version);
    if (done->release) done->release(done->a);
    free(done);
  }
}

static void slot_free(struct ll_sched *s, struct slot *sl) {
  if (!sl) return;
  if (sl->aver) { // the request is done with its version: the last user of a replaced one frees it
    pthread_mutex_lock(&s->mu);
    sl->aver->users--;
    struct aver *done = avers_unused(s);
    pthread_mutex_unlock(&s->mu);
    avers_release(done);
  }
  if (sl->seq >= 0) ll_engine_seq_free(s->e, sl->seq);
  ll_sampler_free(sl->smp);
  ll_stop_free(sl->stop);
  free(sl->tokens);
  free(sl->logits);
  ll_sched_req_free(sl->r);
  free(sl);
}

static void err_final(struct ll_sched *s, struct ll_sched_req *r, const char *code, const char *msg) {
  struct ll_sched_ev *o = ev_push(s, LL_EV_ERROR, r->conn, r->id, 1, msg, strlen(msg));
  if (o) o->code = code;
  s->req_done++;
}

// Text for a TOK line: pass through the stop matcher, hold back an incomplete UTF-8 tail.
static void out_text(struct ll_sched *s, struct slot *sl, const char *p, size_t n, int *stopped, int final) {
  char buf[1536];
  size_t k = 0;
  if (n > 0 || final) {
    char tmp[1024];
    size_t m = n ? ll_stop_push(sl->stop, p, n, tmp, sizeof tmp, stopped) : 0;
    if (final && !*stopped) m += ll_stop_flush(sl->stop, tmp + m, sizeof tmp - m);
    memcpy(buf, sl->hold, (size_t)sl->n_hold);
    memcpy(buf + sl->n_hold, tmp, m);
    k = (size_t)sl->n_hold + m;
  }
  size_t ok = final ? k : ll_utf8_complete_prefix(buf, k);
  sl->n_hold = (int)(k - ok);
  memcpy(sl->hold, buf + ok, k - ok);
  if (ok > 0) ev_push(s, LL_EV_TOKEN, sl->r->conn, sl->r->id, 0, buf, ok);
}

static void slot_end(struct ll_sched *s, struct slot *sl, const char *reason, const char *msg) {
  struct ll_sched_req *r = sl->r;
  int stopped = 0;
  if (strcmp(reason, "error") != 0 && s->tok && sl->stop) out_text(s, sl, NULL, 0, &stopped, 1);
  double t = now_ms();
  double prefill_ms = sl->t_first > 0 ? sl->t_first - sl->t_admit : t - sl->t_admit;
  double decode_ms = sl->t_first > 0 ? t - sl->t_first : 0.0;
  struct ll_sched_ev *o = ev_push(s, LL_EV_END, r->conn, r->id, 1, msg ? msg : "", msg ? strlen(msg) : 0);
  if (o) {
    o->reason = reason;
    o->prompt_tokens = sl->n_prompt, o->tokens = sl->n_gen;
    o->queue_ms = sl->t_admit > r->t_submit ? sl->t_admit - r->t_submit : 0.0;
    o->prefill_ms = prefill_ms, o->decode_ms = decode_ms;
  }
  emit_monitor(s,
               "{\"type\":\"event\",\"event\":\"request_finished\",\"id\":\"%s\",\"reason\":\"%s\",\"prompt_tokens\":%d,\"tokens\":%d,"
               "\"prefill_ms\":%.1f,\"decode_ms\":%.1f}\n",
               esc(s, r->id, strlen(r->id)), reason, sl->n_prompt, sl->n_gen, prefill_ms, decode_ms);
  s->req_done++;
  slot_free(s, sl);
}

static void do_tokenize(struct ll_sched *s, struct ll_sched_req *r) {
  if (!s->tok) return err_final(s, r, "unsupported", "this model has no tokenizer");
  size_t cap = r->text_len + 8;
  if (cap > (size_t)INT32_MAX / 4) return err_final(s, r, "too_long", "text too long");
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return err_final(s, r, "internal", "out of memory");
  int add_bos = r->add_bos >= 0 ? r->add_bos : 0;
  int n = ll_tokenize(s->tok, r->text, r->text_len, add_bos, r->special, ids, (int)cap);
  if (n < 0) {
    free(ids);
    return err_final(s, r, "bad_param", "text could not be tokenized");
  }
  struct ll_sched_ev *o = ev_push(s, LL_EV_IDS, r->conn, r->id, 1, ids, (size_t)n * sizeof *ids);
  if (o) o->n_ids = o->len ? n : 0;
  s->req_done++;
  free(ids);
}

// Parse space-separated token ids; LL_EFORMAT/ LL_ELIMIT with a message.
static int parse_ids(const char *t, size_t len, int V, int32_t **out, int *n_out, char *msg, size_t msglen) {
  size_t cap = len / 2 + 2;
  if (cap > MAX_TEXT_IDS) cap = MAX_TEXT_IDS;
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return ll_errf(msg, msglen, LL_ENOMEM, "out of memory");
  int n = 0;
  size_t i = 0;
  while (i < len) {
    while (i < len && (t[i] == ' ' || t[i] == ',' || t[i] == '\t')) i++;
    if (i >= len) break;
    long v = 0;
    size_t d0 = i;
    while (i < len && t[i] >= '0' && t[i] <= '9' && i - d0 < 10) v = v * 10 + (t[i++] - '0');
    if (i == d0 || (i < len && t[i] != ' ' && t[i] != ',' && t[i] != '\t')) {
      free(ids);
      return ll_errf(msg, msglen, LL_EFORMAT, "bad token id at offset %zu (expected space-separated integers)", d0);
    }
    if (v >= V) {
      free(ids);
      return ll_errf(msg, msglen, LL_EFORMAT, "token id %ld out of range 0..%d", v, V - 1);
    }
    if ((size_t)n >= cap) {
      free(ids);
      return ll_errf(msg, msglen, LL_ELIMIT, "more than %zu token ids", cap);
    }
    ids[n++] = (int32_t)v;
  }
  *out = ids;
  *n_out = n;
  return 0;
}

static void do_detokenize(struct ll_sched *s, struct ll_sched_req *r) {
  if (!s->tok) return err_final(s, r, "unsupported", "this model has no tokenizer");
  int32_t *ids;
  int n;
  char msg[160];
  if (parse_ids(r->text, r->text_len, s->V, &ids, &n, msg, sizeof msg) != 0) return err_final(s, r, "bad_param", msg);
  size_t cap = (size_t)n * 64 + 64;
  char *text = malloc(cap);
  int k = text ? ll_detokenize(s->tok, ids, n, text, cap, r->special) : -1;
  free(ids);
  if (k < 0) {
    free(text);
    return err_final(s, r, "internal", "detokenize failed");
  }
  ev_push(s, LL_EV_TEXT, r->conn, r->id, 1, text, (size_t)k);
  s->req_done++;
  free(text);
}

// The request's adapter, set on its sequence. 0, or a message for `ERR bad_adapter`.
static int resolve_adapter(struct ll_sched *s, struct slot *sl, char *msg, size_t cap) {
  const struct ll_lora *a = NULL;
  int found = 0;
  pthread_mutex_lock(&s->mu);
  const char *want = sl->r->adapter[0] ? sl->r->adapter : s->default_adapter[0] ? s->default_adapter : "none";
  snprintf(sl->adapter, sizeof sl->adapter, "%s", want);
  if (strcmp(want, "none") == 0) found = 1;
  for (int i = 0; !found && i < s->n_adapters; i++)
    if (strcmp(s->adapters[i].name, want) == 0) {
      a = s->adapters[i].a, found = 1;
      // A published version stays alive for this request until it ends, whatever is loaded
      // under its name meanwhile.
      if ((sl->aver = s->adapters[i].v)) sl->aver->users++;
    }
  if (!found) {
    size_t k = strcmp(want, "live") == 0
                   ? (size_t)snprintf(msg, cap, "no live adapter: %s (adapters:", s->live_why[0] ? s->live_why : "training is not running")
                   : (size_t)snprintf(msg, cap, "unknown adapter '%s' (adapters:", want);
    for (int i = 0; i < s->n_adapters && k < cap; i++) k += (size_t)snprintf(msg + k, cap - k, " %s", s->adapters[i].name);
    if (k < cap) snprintf(msg + k, cap - k, "%s)", s->n_adapters ? "" : " none loaded");
  }
  pthread_mutex_unlock(&s->mu);
  if (!found) return LL_ENOTFOUND;
  char e2[400];
  if (a && ll_engine_seq_set_adapter(s->e, sl->seq, a, e2, sizeof e2) != 0) {
    snprintf(msg, cap, "adapter '%s': %.300s", want, e2);
    return LL_EINVAL;
  }
  return 0;
}

static int adapter_name_ok(const char *n) { return ll_adapter_name_check(n, strlen(n)) == 0; }

// Maps name to a (NULL: removes it), with v its published version or NULL (caller-owned).
// The version it replaces is unregistered; versions with no user left are returned to release.
static int adapter_set(struct ll_sched *s, const char *name, const struct ll_lora *a, struct aver *v, struct aver **done) {
  *done = NULL;
  int rc = 0;
  int i = 0;
  while (i < s->n_adapters && strcmp(s->adapters[i].name, name) != 0) i++;
  struct aver *old = i < s->n_adapters ? s->adapters[i].v : NULL;
  if (!a) {
    if (i < s->n_adapters) s->adapters[i] = s->adapters[--s->n_adapters];
  } else if (i < s->n_adapters) {
    s->adapters[i].a = a, s->adapters[i].v = v;
  } else if (s->n_adapters == LL_SCHED_MAX_ADAPTERS) {
    rc = LL_ELIMIT;
    old = NULL;
  } else {
    snprintf(s->adapters[i].name, sizeof s->adapters[i].name, "%s", name);
    s->adapters[i].a = a, s->adapters[i].v = v;
    s->n_adapters++;
  }
  if (old) old->registered = 0;
  if (rc == 0 && v) v->registered = 1, v->next = s->vers, s->vers = v;
  *done = avers_unused(s);
  return rc;
}

int ll_sched_adapter_register(struct ll_sched *s, const char *name, const struct ll_lora *a) {
  if (!name || !adapter_name_ok(name) || strcmp(name, "none") == 0) return LL_EINVAL;
  struct aver *done;
  pthread_mutex_lock(&s->mu);
  int rc = adapter_set(s, name, a, NULL, &done);
  pthread_mutex_unlock(&s->mu);
  avers_release(done);
  return rc;
}

int ll_sched_adapter_publish(struct ll_sched *s, const char *name, struct ll_lora *a, uint64_t version, void (*release)(struct ll_lora *a)) {
  if (!name || !adapter_name_ok(name) || strcmp(name, "none") == 0 || strcmp(name, "live") == 0) return LL_EINVAL;
  struct aver *v = NULL;
  if (a) {
    if (!(v = calloc(1, sizeof *v))) return LL_ENOMEM;
    v->a = a, v->release = release, v->version = version;
    snprintf(v->name, sizeof v->name, "%s", name);
  }
  struct aver *done;
  pthread_mutex_lock(&s->mu);
  int rc = adapter_set(s, name, a, v, &done);
  pthread_mutex_unlock(&s->mu);
  if (rc) free(v); // not taken: the caller keeps a
  avers_release(done);
  return rc;
}

int ll_sched_adapter_versions(struct ll_sched *s, struct ll_sched_adapter_version *out, int cap) {
  int n = 0;
  pthread_mutex_lock(&s->mu);
  for (struct aver *v = s->vers; v; v = v->next, n++)
    if (n < cap) {
      snprintf(out[n].name, sizeof out[n].name, "%s", v->name);
      out[n].version = v->version, out[n].users = v->users, out[n].registered = v->registered;
    }
  pthread_mutex_unlock(&s->mu);
  return n;
}

void ll_sched_live_reason(struct ll_sched *s, const char *why) {
  pthread_mutex_lock(&s->mu);
  snprintf(s->live_why, sizeof s->live_why, "%s", why ? why : "");
  pthread_mutex_unlock(&s->mu);
}

int ll_sched_adapter_names(struct ll_sched *s, char (*names)[LL_ADAPTER_NAME_MAX + 1], int cap) {
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (int i = 0; i < s->n_adapters && n < cap; i++) snprintf(names[n++], LL_ADAPTER_NAME_MAX + 1, "%s", s->adapters[i].name);
  pthread_mutex_unlock(&s->mu);
  return n;
}

int ll_sched_adapter_default(struct ll_sched *s, const char *name) {
  if (name && strcmp(name, "none") != 0 && !adapter_name_ok(name)) return LL_EINVAL;
  pthread_mutex_lock(&s->mu);
  snprintf(s->default_adapter, sizeof s->default_adapter, "%s", name ? name : "");
  pthread_mutex_unlock(&s->mu);
  return 0;
}

// Admission of a GEN/CHAT request: tokens, context check, sequence, sampler. NULL on error
// (the ERR line is already out).
static struct slot *admit(struct ll_sched *s, struct slot *sl) {
  struct ll_sched_req *r = sl->r;
  char msg[512];
  char *rendered = NULL;
  struct ll_tok_span *marks = NULL; // CHAT: the template's markup in `rendered`
  int n_marks = 0;
  const char *text = r->text;
  size_t text_len = r->text_len;
  sl->t_admit = now_ms();
  if (r->kind == LL_REQ_CHAT) {
    if (!s->tok) goto no_tok;
    struct ll_chat_msg *msgs;
    void *store;
    int n = ll_chat_parse(r->text, r->text_len, &msgs, &store, msg, sizeof msg);
    if (n < 0) goto bad_param;
    const char *tmpl = ll_sched_chat_template(s);
    if ((!tmpl || !*tmpl) && r->chat_default) tmpl = "<|im_start|>"; // chatml, llama-server's default (HTTP only)
    struct ll_chat_opts co = {.enable_thinking = r->enable_thinking};
    int rc = ll_chat_render_opts(tmpl, msgs, n, &co, &rendered, &marks, &n_marks, msg, sizeof msg);
    ll_chat_free_store(store, msgs);
    if (rc != 0) {
      err_final(s, r, rc == LL_EUNSUPPORTED ? "unsupported" : "internal", msg);
      goto fail;
    }
    text = rendered, text_len = strlen(rendered);
  }
  if (s->tok) {
    // More tokens than bytes + 2 is impossible; bound before allocating.
    size_t cap = text_len + 4;
    if (cap > (size_t)s->n_ctx + 4 && text_len / 64 > (size_t)s->n_ctx) { // way over: do not even tokenize
      snprintf(msg, sizeof msg, "prompt of %zu bytes cannot fit the context of %d tokens", text_len, s->n_ctx);
      err_final(s, r, "context_exceeded", msg);
      goto fail;
    }
    sl->tokens = malloc(cap * sizeof *sl->tokens);
    if (!sl->tokens) goto oom;
    int add_bos = r->add_bos >= 0 ? r->add_bos : ll_tokenizer_add_bos(s->tok);
    // CHAT: the messages are the client's text; only the template's markers become control
    // tokens unless the client asks for special=1 (it then writes markup in its messages).
    int n = r->kind == LL_REQ_CHAT && !r->special
                ? ll_tokenize_marked(s->tok, text, text_len, add_bos, marks, n_marks, sl->tokens, (int)cap)
                : ll_tokenize(s->tok, text, text_len, add_bos, r->special, sl->tokens, (int)cap);
    if (n < 0) {
      snprintf(msg, sizeof msg, "prompt could not be tokenized (%s)", ll_strerror(n));
      goto bad_param;
    }
    if (n == 0) sl->tokens[n++] = ll_tokenizer_bos(s->tok) >= 0 ? ll_tokenizer_bos(s->tok) : 0;
    sl->n_prompt = n;
  } else { // no tokenizer (llama2.c .bin): the prompt is token ids after BOS = 1
    int32_t *ids;
    int n;
    if (parse_ids(text, text_len, s->V, &ids, &n, msg, sizeof msg) != 0) goto bad_param;
    sl->tokens = malloc(((size_t)n + 1) * sizeof *sl->tokens);
    if (!sl->tokens) {
      free(ids);
      goto oom;
    }
    sl->tokens[0] = 1;
    memcpy(sl->tokens + 1, ids, (size_t)n * sizeof *ids);
    free(ids);
    sl->n_prompt = n + 1;
  }
  if (sl->n_prompt >= s->n_ctx) {
    snprintf(msg, sizeof msg, "prompt has %d tokens; the context holds %d (with room for at least one generated token)", sl->n_prompt,
             s->n_ctx);
    err_final(s, r, "context_exceeded", msg);
    goto fail;
  }
  sl->max_gen = r->max_tokens;
  if (sl->n_prompt + sl->max_gen > s->n_ctx) sl->max_gen = s->n_ctx - sl->n_prompt;
  sl->seq = ll_engine_seq_new(s->e);
  if (sl->seq >= 0 && resolve_adapter(s, sl, msg, sizeof msg) != 0) {
    err_final(s, r, "bad_adapter", msg);
    goto fail;
  }
  sl->logits = malloc((size_t)s->V * sizeof *sl->logits);
  sl->smp = ll_sampler_new(&r->sp, s->V);
  // A logprob is computed from the logits, which the argmax path does not bring back.
  sl->greedy = sl->smp && ll_sampler_is_greedy(sl->smp) && !r->want_logprob;
  sl->devs = sl->smp && !sl->greedy && !r->want_logprob && ll_sampler_dev_ok(sl->smp);
  sl->stop = ll_stop_new((const char *const *)r->stops, r->n_stops);
  if (sl->seq < 0 || !sl->logits || !sl->smp || !sl->stop) goto oom;
  for (int i = 0; i < sl->n_prompt; i++) ll_sampler_accept(sl->smp, sl->tokens[i]);
  ll_detok_stream_init(&sl->ds);
  free(rendered);
  free(marks);
  return sl;
no_tok:
  err_final(s, r, "unsupported", "this model has no tokenizer (no chat template)");
  goto fail;
bad_param:
  err_final(s, r, "bad_param", msg);
  goto fail;
oom:
  err_final(s, r, "internal", sl->seq < 0 && sl->logits ? "no free sequence slot" : "out of memory");
fail:
  free(rendered);
  free(marks);
  slot_free(s, sl);
  return NULL;
}

// Log-probability of the sampled token t: from the top candidates when it is among them, else
// a log-softmax over the logits (as penalised by the sampler, which works on them in place).
static float chosen_logprob(struct ll_sched *s, struct slot *sl, int32_t t, const struct ll_token_prob *top, int n_top) {
  for (int i = 0; i < n_top; i++)
    if (top[i].id == t) return top[i].logprob;
  float mx = -INFINITY;
  for (int i = 0; i < s->V; i++) mx = sl->logits[i] > mx ? sl->logits[i] : mx;
  double z = 0;
  for (int i = 0; i < s->V; i++) z += exp((double)sl->logits[i] - mx);
  return (float)(sl->logits[t] - (mx + log(z)));
}

// Sample the next token of a slot with fresh logits; returns 1 if the slot ended.
static int slot_sample(struct ll_sched *s, struct slot *sl) {
  struct ll_sched_req *r = sl->r;
  struct ll_token_prob probs[20];
  int32_t t = sl->greedy || sl->devs ? sl->amax : ll_sampler_sample(sl->smp, sl->logits, r->sp.n_probs > 0 ? probs : NULL);
  ll_sampler_accept(sl->smp, t);
  if (sl->t_first == 0) sl->t_first = now_ms();
  if (!r->ignore_eos && s->tok && ll_tokenizer_is_eog(s->tok, t)) {
    slot_end(s, sl, "stop", NULL);
    return 1;
  }
  sl->n_gen++;
  s->tok_gen++;
  s->win_gen++;
  if (r->sp.n_probs > 0 || r->want_logprob) {
    struct ll_sched_ev *o = ev_push(s, LL_EV_PROB, r->conn, r->id, 0, NULL, 0);
    if (o) {
      o->token = t;
      o->n_top = r->sp.n_probs;
      memcpy(o->top, probs, (size_t)r->sp.n_probs * sizeof *probs);
      o->logprob = chosen_logprob(s, sl, t, probs, r->sp.n_probs);
    }
  }
  int stopped = 0;
  if (s->tok) {
    char piece[512];
    int k = ll_detok_stream_push(s->tok, &sl->ds, t, piece, sizeof piece);
    if (k > 0) out_text(s, sl, piece, (size_t)k, &stopped, 0);
  } else {
    char num[16];
    int k = snprintf(num, sizeof num, "%s%d", sl->n_gen > 1 ? " " : "", t);
    ev_push(s, LL_EV_TOKEN, r->conn, r->id, 0, num, (size_t)k);
  }
  if (stopped) {
    slot_end(s, sl, "stop", NULL);
    return 1;
  }
  if (sl->n_gen >= sl->max_gen) {
    slot_end(s, sl, "length", NULL);
    return 1;
  }
  sl->last = t;
  return 0;
}

static void apply_cancels(struct ll_sched *s, struct cancel_req *c, int shutdown) {
  while (c) {
    for (struct slot *w = s->wait_head; w; w = w->next_wait)
      if (w->r->conn == c->conn && (c->all || strcmp(w->r->id, c->id) == 0)) w->cancel = END_CANCEL;
    for (int i = 0; i < s->parallel; i++) {
      struct slot *a = s->active[i];
      if (a && a->r->conn == c->conn && (c->all || strcmp(a->r->id, c->id) == 0)) a->cancel = END_CANCEL;
    }
    struct cancel_req *n = c->next;
    free(c);
    c = n;
  }
  if (shutdown) {
    for (struct slot *w = s->wait_head; w; w = w->next_wait) w->cancel = END_SHUTDOWN;
    for (int i = 0; i < s->parallel; i++)
      if (s->active[i]) s->active[i]->cancel = END_SHUTDOWN;
  }
  // End waiting ones now; active ones end at the start of the step (below).
  struct slot **pp = &s->wait_head, *prev = NULL;
  while (*pp) {
    struct slot *w = *pp;
    if (w->cancel) {
      *pp = w->next_wait;
      if (s->wait_tail == w) s->wait_tail = prev;
      s->n_wait--;
      w->t_admit = now_ms();
      slot_end(s, w, w->cancel == END_CANCEL ? "cancel" : "shutdown", NULL);
    } else {
      prev = w;
      pp = &w->next_wait;
    }
  }
  for (int i = 0; i < s->parallel; i++) {
    struct slot *a = s->active[i];
    if (a && a->cancel) {
      s->active[i] = NULL;
      slot_end(s, a, a->cancel == END_CANCEL ? "cancel" : "shutdown", NULL);
    }
  }
}

static void update_stats(struct ll_sched *s, int publish_now) {
  double t = now_ms();
  if (t - s->win_t0 >= 1000.0 || publish_now) {
    double dt = (t - s->win_t0) / 1000.0;
    if (dt >= 0.25) {
      s->decode_tps = s->win_gen / dt;
      s->prefill_tps = s->win_prefill / dt;
      s->win_gen = s->win_prefill = 0;
      s->win_t0 = t;
    }
  }
  pthread_mutex_lock(&s->mu);
  struct ll_sched_stats *st = &s->stats;
  st->active = 0;
  st->n_shown = 0;
  for (int i = 0; i < s->parallel; i++) {
    struct slot *a = s->active[i];
    if (!a) continue;
    st->active++;
    if (st->n_shown < LL_SCHED_MAX_SHOWN) {
      struct ll_sched_req_progress *p = &st->shown[st->n_shown++];
      snprintf(p->id, sizeof p->id, "%s", a->r->id);
      p->conn = a->r->conn;
      p->prefilling = a->n_prefilled < a->n_prompt;
      p->prompt_tokens = a->n_prompt;
      p->prefilled = a->n_prefilled;
      p->tokens = a->n_gen;
      p->max_tokens = a->max_gen;
      snprintf(p->adapter, sizeof p->adapter, "%s", a->adapter[0] ? a->adapter : "none");
      double tn = now_ms();
      p->age_s = (tn - a->r->t_submit) / 1e3;
      p->tok_s = a->t_first > 0 && tn > a->t_first && a->n_gen > 0 ? a->n_gen / ((tn - a->t_first) / 1e3) : -1;
    }
  }
  st->queued = s->n_wait + s->n_in;
  st->requests_total = s->req_total;
  st->requests_done = s->req_done;
  st->tokens_generated = s->tok_gen;
  st->tokens_prefilled = s->tok_prefill;
  st->decode_tps = s->decode_tps;
  st->prefill_tps = s->prefill_tps;
  st->kv_blocks_used = ll_engine_kv_blocks_used(s->e);
  pthread_mutex_unlock(&s->mu);
}

// A slot whose next step may be queued before its previous token reaches the host: its choice
// is made on the device (greedy, or a sampler step that needs no window of recent tokens) and
// nothing else comes back (no probabilities).
static int slot_ahead(const struct slot *a) {
  return a->n_prefilled >= a->n_prompt && (a->greedy || (a->devs && ll_sampler_dev_ahead(a->smp))) && !a->r->want_logprob && a->r->sp.n_probs == 0;
}

// The queued step's ids, waited for, to the slots still active that it decoded (a slot that
// ended since - its sequence freed - gets nothing: the step past its end is dropped with it).
static void queued_collect(struct ll_sched *s, char *err, size_t errlen) {
  const int n = s->q_n;
  s->q_n = 0;
  const int rc = ll_engine_decode_collect(s->e, s->q_ids, s->parallel, err, errlen);
  for (int k = 0; k < n; k++)
    for (int i = 0; i < s->parallel; i++) {
      struct slot *a = s->active[i];
      if (!a || a->seq != s->q_seqs[k]) continue;
      if (rc < 0) {
        s->active[i] = NULL;
        slot_end(s, a, "error", err);
      } else {
        a->amax = s->q_ids[k];
        if (slot_sample(s, a)) s->active[i] = NULL;
      }
      break;
    }
}

// One step of the generating slots queued behind the one still queued (ids from the device),
// when the batch is that step's: the same slots, all generating and slot_ahead, no prefill.
// seqs: the sequences in slot order, n of them. Returns 1 when it queued, else 0.
static int queue_behind(struct ll_sched *s, int *seqs, int *n_out) {
  int n = 0;
  for (int i = 0; i < s->parallel; i++) {
    struct slot *a = s->active[i];
    if (!a) continue;
    if (!slot_ahead(a) || n >= s->q_n || s->q_seqs[n] != a->seq) return 0;
    seqs[n++] = a->seq;
  }
  *n_out = n;
  return n == s->q_n && n > 0;
}

static void *compute_main(void *arg) {
  struct ll_sched *s = arg;
  char err[512];
  for (;;) {
    int n_active = 0;
    for (int i = 0; i < s->parallel; i++) n_active += s->active[i] != NULL;
    pthread_mutex_lock(&s->mu);
    // Queued requests are work too: when every active slot finished in the same step (equal
    // requests started together), the queue must be admitted now, not after the next arrival
    // (that wait hung 55 queued requests forever in a test run). wait_head is this thread's.
    if (s->bg_wake) s->bg_more = 1, s->bg_wake = 0;
    while (!s->quit && s->n_in == 0 && !s->cancels && n_active == 0 && !s->wait_head && !(s->bg_fn && s->bg_more)) {
      atomic_store(&s->busy, 0);
      // Idle. The rate window runs on through short gaps (clients that send their next request
      // after each END leave the thread idle many times a second: restarting the window at
      // every wake kept it from ever closing, and the rates read 0 while tokens streamed). A
      // window that ends while idle publishes what it counted; the next, empty one, 0.
      double t = now_ms();
      if (t - s->win_t0 >= 1000.0) {
        double dt = (t - s->win_t0) / 1000.0;
        s->decode_tps = s->win_gen / dt;
        s->prefill_tps = s->win_prefill / dt;
        s->stats.decode_tps = s->decode_tps;
        s->stats.prefill_tps = s->prefill_tps;
        s->win_gen = s->win_prefill = 0;
        s->win_t0 = t;
      }
      if (s->decode_tps != 0 || s->prefill_tps != 0) { // wake again to close the window
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)((1000.0 - (t - s->win_t0)) * 1e6) + 1000000;
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
      } else {
        pthread_cond_wait(&s->cv, &s->mu);
        // After an idle spell with rates at 0, a new window starts with the work.
        s->win_t0 = now_ms();
        s->win_gen = s->win_prefill = 0;
      }
      if (s->bg_wake) s->bg_more = 1, s->bg_wake = 0;
    }
    atomic_store(&s->busy, s->n_in > 0 || n_active > 0 || s->wait_head != NULL);
    if (s->quit) {
      pthread_mutex_unlock(&s->mu);
      break;
    }
    struct ll_sched_req **in = s->in;
    int n_in = s->n_in;
    s->in = NULL;
    s->n_in = s->cap_in = 0;
    struct cancel_req *cancels = s->cancels;
    s->cancels = NULL;
    int shutdown = s->shutdown;
    pthread_mutex_unlock(&s->mu);

    // A step queued in the last round: while nothing changes (no request in, no cancel, no one
    // waiting for a free slot), the next one is queued behind it before its ids are waited for,
    // so the device goes from step to step without waiting for the host; else it is collected
    // first, before any slot changes.
    int queued_now = 0;
    if (s->q_n > 0) {
      int free_slot = 0, n_next = 0;
      for (int i = 0; i < s->parallel; i++) free_slot |= s->active[i] == NULL;
      const double t_fg = now_ms();
      if (n_in == 0 && !cancels && !(s->wait_head && free_slot) && queue_behind(s, s->q_next, &n_next)) {
        for (int k = 0; k < n_next; k++)
          for (int i = 0; i < s->parallel; i++) {
            struct slot *a = s->active[i];
            if (a && a->seq == s->q_next[k] && a->devs && ll_sampler_dev_next(a->smp, &a->sd)) ll_engine_seq_set_sample(s->e, a->seq, &a->sd);
          }
        if (ll_engine_decode_queue(s->e, s->q_next, NULL, n_next, err, sizeof err) == 0) {
          queued_now = 1;
          s->q_behind++;
          queued_collect(s, err, sizeof err); // the older step's ids, the new step running meanwhile
          memcpy(s->q_seqs, s->q_next, (size_t)n_next * sizeof *s->q_next);
          s->q_n = n_next;
          int ended = 0;
          for (int k = 0; k < n_next; k++) {
            int live = 0;
            for (int i = 0; i < s->parallel; i++) live |= s->active[i] && s->active[i]->seq == s->q_next[k];
            ended |= !live;
          }
          // A slot ended on the older step's id: the new step is collected now (its step for that
          // sequence dropped with it), before a new request may take the freed sequence.
          if (ended) queued_collect(s, err, sizeof err);
        }
      }
      if (!queued_now) queued_collect(s, err, sizeof err);
      s->fg_ms += now_ms() - t_fg;
    }

    // New requests: utility ones are answered at once, generations queue in order.
    for (int i = 0; i < n_in; i++) {
      struct ll_sched_req *r = in[i];
      s->req_total++;
      if (r->kind == LL_REQ_TOKENIZE) {
        do_tokenize(s, r);
        ll_sched_req_free(r);
        continue;
      }
      if (r->kind == LL_REQ_DETOKENIZE) {
        do_detokenize(s, r);
        ll_sched_req_free(r);
        continue;
      }
      struct slot *sl = calloc(1, sizeof *sl);
      if (!sl) {
        err_final(s, r, "internal", "out of memory");
        ll_sched_req_free(r);
        continue;
      }
      sl->r = r;
      sl->seq = -1;
      if (s->wait_tail) s->wait_tail->next_wait = sl;
      else s->wait_head = sl;
      s->wait_tail = sl;
      s->n_wait++;
    }
    free(in);
    apply_cancels(s, cancels, shutdown);

    // Admit into free slots.
    for (int i = 0; i < s->parallel && s->wait_head; i++) {
      if (s->active[i]) continue;
      struct slot *sl = s->wait_head;
      s->wait_head = sl->next_wait;
      if (!s->wait_head) s->wait_tail = NULL;
      s->n_wait--;
      sl->next_wait = NULL;
      s->active[i] = admit(s, sl);
      if (!s->active[i]) i--; // that one failed: try the next request for this slot
    }

    // One batch: generating slots first (1 token each), then prefill chunks in slot order.
    int n_items = 0, budget = MAX_BATCH_TOKENS;
    for (int i = 0; !queued_now && i < s->parallel; i++) { // (none when this round queued a step above)
      struct slot *a = s->active[i];
      if (!a || a->n_prefilled < a->n_prompt) continue;
      const int by_id = a->greedy || a->devs;
      if (a->devs && ll_sampler_dev_next(a->smp, &a->sd)) ll_engine_seq_set_sample(s->e, a->seq, &a->sd);
      s->items[n_items++] = (struct ll_batch_item){a->seq, 1, &a->last, 1, by_id ? NULL : a->logits, by_id ? &a->amax : NULL};
      budget--;
    }
    for (int i = 0; !queued_now && i < s->parallel && budget > 0; i++) {
      struct slot *a = s->active[i];
      if (!a || a->n_prefilled >= a->n_prompt) continue;
      int n = a->n_prompt - a->n_prefilled;
      if (n > s->chunk) n = s->chunk;
      if (n > budget) n = budget;
      int last = a->n_prefilled + n == a->n_prompt;
      const int by_id = a->greedy || a->devs;
      if (last && a->devs && ll_sampler_dev_next(a->smp, &a->sd)) ll_engine_seq_set_sample(s->e, a->seq, &a->sd);
      s->items[n_items++] = (struct ll_batch_item){a->seq, n, a->tokens + a->n_prefilled, last ? 1 : 0, by_id ? NULL : a->logits,
                                                      by_id ? &a->amax : NULL};
      budget -= n;
    }
    const double t_fg = now_ms();
    // Only generating slots, each slot_ahead: the step is queued (its ids collected in the next
    // round, with the step after it queued first) instead of decoded here.
    int ahead = !queued_now && n_items > 0 && s->q_ids && ll_engine_queue_ok(s->e);
    for (int i = 0; ahead && i < s->parallel; i++) ahead = !s->active[i] || slot_ahead(s->active[i]);
    for (int k = 0; ahead && k < n_items; k++) ahead = s->items[k].n_tokens == 1 && s->items[k].logits_mode == 1;
    if (ahead) {
      for (int k = 0; k < n_items; k++) s->q_seqs[k] = s->items[k].seq, s->q_ids[k] = *s->items[k].tokens;
      if (ll_engine_decode_queue(s->e, s->q_seqs, s->q_ids, n_items, err, sizeof err) == 0) {
        s->q_n = n_items;
        s->q_first++;
        n_items = 0; // collected next round
        s->fg_ms += now_ms() - t_fg;
      }
    }
    if (n_items > 0) {
      int rc = ll_engine_decode(s->e, s->items, n_items, err, sizeof err);
      // Map items back to slots (items name distinct sequences).
      for (int k = 0; k < n_items; k++) {
        for (int i = 0; i < s->parallel; i++) {
          struct slot *a = s->active[i];
          if (!a || a->seq != s->items[k].seq) continue;
          if (rc != 0) {
            s->active[i] = NULL;
            slot_end(s, a, "error", err);
            break;
          }
          if (a->n_prefilled < a->n_prompt) {
            a->n_prefilled += s->items[k].n_tokens;
            s->tok_prefill += (uint64_t)s->items[k].n_tokens;
            s->win_prefill += (uint64_t)s->items[k].n_tokens;
            if (a->n_prefilled < a->n_prompt) break; // more prompt to read
          }
          if (slot_sample(s, a)) s->active[i] = NULL;
          break;
        }
      }
    }
    if (n_items > 0) s->fg_ms += now_ms() - t_fg;
    // Background unit: always when idle; when busy, only under its share of compute time.
    if (s->bg_fn && s->bg_more && (n_items == 0 || s->bg_ms < s->bg_share * (s->bg_ms + s->fg_ms))) {
      const double t0 = now_ms();
      s->bg_more = s->bg_fn(s->bg_user, n_items > 0);
      const double dt = now_ms() - t0;
      if (n_items > 0) s->bg_ms += dt;
    }
    if (s->bg_ms + s->fg_ms > 10000) s->bg_ms *= 0.5, s->fg_ms *= 0.5; // forget slowly
    update_stats(s, 0);
    publish(s);
  }
  return NULL;
}

void ll_sched_set_background(struct ll_sched *s, ll_sched_bg_fn fn, void *user, double share) {
  pthread_mutex_lock(&s->mu);
  s->bg_fn = fn;
  s->bg_user = user;
  s->bg_share = share;
  s->bg_wake = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int ll_sched_busy(const struct ll_sched *s) { return atomic_load(&((struct ll_sched *)s)->busy); }

void ll_sched_wake(struct ll_sched *s) {
  pthread_mutex_lock(&s->mu);
  s->bg_wake = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void ll_sched_emit_event(struct ll_sched *s, const char *json) {
  size_t n = strlen(json);
  struct ll_sched_ev *o = ev_push(s, LL_EV_MONITOR, 0, NULL, 0, NULL, n + 1);
  if (!o) return;
  memcpy(o->data, json, n);
  o->data[n] = '\n';
}

// ---- loop-thread API ----

const char *ll_sched_chat_template(const struct ll_sched *s) {
  return s->chat_template ? s->chat_template : s->tok ? ll_tokenizer_chat_template(s->tok) : NULL;
}

int ll_sched_create(struct ll_sched **out, struct ll_engine *e, const struct ll_sched_params *p, ll_sched_notify_fn notify, void *user,
                    char *err, size_t errlen) {
  struct ll_engine_info info;
  ll_engine_get_info(e, &info);
  struct ll_sched *s = calloc(1, sizeof *s);
  if (!s) return ll_errf(err, errlen, LL_ENOMEM, "scheduler: out of memory");
  s->e = e;
  s->tok = ll_engine_tokenizer(e);
  s->V = info.n_vocab;
  s->n_ctx = info.n_ctx;
  s->parallel = info.n_parallel;
  s->chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 256;
  if (p->chat_template && !(s->chat_template = strdup(p->chat_template))) {
    free(s);
    return ll_errf(err, errlen, LL_ENOMEM, "scheduler: out of memory");
  }
  if (s->chunk > MAX_BATCH_TOKENS) s->chunk = MAX_BATCH_TOKENS;
  s->notify = notify;
  s->user = user;
  s->active = calloc((size_t)s->parallel, sizeof *s->active);
  s->items = calloc((size_t)s->parallel, sizeof *s->items);
  s->q_seqs = calloc((size_t)s->parallel, sizeof *s->q_seqs);
  s->q_ids = calloc((size_t)s->parallel, sizeof *s->q_ids);
  s->q_next = calloc((size_t)s->parallel, sizeof *s->q_next);
  if (!s->active || !s->items || !s->q_seqs || !s->q_ids || !s->q_next) {
    ll_sched_destroy(s);
    return ll_errf(err, errlen, LL_ENOMEM, "scheduler: out of memory");
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->win_t0 = now_ms();
  if (pthread_create(&s->thread, NULL, compute_main, s) != 0) {
    ll_sched_destroy(s);
    return ll_errf(err, errlen, LL_EIO, "scheduler: cannot start the compute thread");
  }
  s->thread_started = 1;
  *out = s;
  return 0;
}

void ll_sched_destroy(struct ll_sched *s) {
  if (!s) return;
  if (s->thread_started) {
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
  }
  if (s->q_behind + s->q_first)
    ll_log(LL_LOG_INFO, "scheduler: %llu decode steps queued behind the previous one before its ids came back, %llu queued after a change of batch",
           (unsigned long long)s->q_behind, (unsigned long long)s->q_first);
  for (int i = 0; i < s->n_in; i++) ll_sched_req_free(s->in[i]);
  free(s->in);
  while (s->cancels) {
    struct cancel_req *n = s->cancels->next;
    free(s->cancels);
    s->cancels = n;
  }
  while (s->wait_head) {
    struct slot *n = s->wait_head->next_wait;
    slot_free(s, s->wait_head);
    s->wait_head = n;
  }
  if (s->active)
    for (int i = 0; i < s->parallel; i++) slot_free(s, s->active[i]);
  for (struct ll_sched_ev *o = s->out_head, *n; o; o = n) n = o->next, free(o);
  for (struct ll_sched_ev *o = s->pend_head, *n; o; o = n) n = o->next, free(o);
  free(s->active);
  free(s->items);
  free(s->q_seqs), free(s->q_ids), free(s->q_next);
  free(s->chat_template);
  free(s->esc);
  for (int i = 0; i < s->n_adapters; i++)
    if (s->adapters[i].v) s->adapters[i].v->registered = 0;
  struct aver *done = avers_unused(s); // every version now: no name, no request
  avers_release(done);
  if (s->thread_started) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
  }
  free(s);
}

int ll_sched_submit(struct ll_sched *s, struct ll_sched_req *r) {
  int rc;
  ll_sched_submit_many(s, &r, 1, &rc);
  return rc;
}

void ll_sched_submit_many(struct ll_sched *s, struct ll_sched_req **r, int n, int *rc) {
  int added = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    rc[i] = s->shutdown ? LL_ESTATE : 0;
    if (!rc[i] && s->n_in == s->cap_in) {
      int nc = s->cap_in ? s->cap_in * 2 : 16;
      struct ll_sched_req **q = realloc(s->in, (size_t)nc * sizeof *q);
      if (q) s->in = q, s->cap_in = nc;
      else rc[i] = LL_ENOMEM;
    }
    if (rc[i]) {
      ll_sched_req_free(r[i]);
      continue;
    }
    r[i]->t_submit = now_ms();
    s->in[s->n_in++] = r[i];
    s->stats.queued++;
    added++;
  }
  if (added) pthread_cond_signal(&s->cv); // one wake-up: the next step sees them all
  pthread_mutex_unlock(&s->mu);
}

void ll_sched_cancel(struct ll_sched *s, uint64_t conn, const char *id) {
  struct cancel_req *c = calloc(1, sizeof *c);
  if (!c) return; // the request then runs to its end; the loop drops its lines
  c->conn = conn;
  c->all = id == NULL;
  if (id) snprintf(c->id, sizeof c->id, "%s", id);
  pthread_mutex_lock(&s->mu);
  c->next = s->cancels;
  s->cancels = c;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void ll_sched_shutdown(struct ll_sched *s) {
  pthread_mutex_lock(&s->mu);
  s->shutdown = 1;
  // Requests not yet seen by the compute thread are answered there (reason=shutdown).
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  ll_sched_cancel(s, 0, "\x01"); // wakes the thread even when idle (matches nothing)
}

struct ll_sched_ev *ll_sched_take_events(struct ll_sched *s) {
  pthread_mutex_lock(&s->mu);
  struct ll_sched_ev *o = s->out_head;
  s->out_head = s->out_tail = NULL;
  pthread_mutex_unlock(&s->mu);
  return o;
}

void ll_sched_get_stats(struct ll_sched *s, struct ll_sched_stats *st) {
  pthread_mutex_lock(&s->mu);
  *st = s->stats;
  pthread_mutex_unlock(&s->mu);
}
