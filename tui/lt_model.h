// lt_model.h - lltop's data side: the monitor stream parsed into plain structs where every
// field carries a "known" flag (a null or missing field stays unknown and is drawn as N/A,
// never as 0), and the model that accumulates them (last snapshot, rate history for the
// sparklines, the training loss history, the event tail). No terminal, no socket here: the
// drawing (lltop.c) reads the model, the connection (lltop.c) feeds it lines.
// The schema is man/llsrv-protocol.7, MONITOR SOCKET; tui/ includes no server header.
#ifndef LT_MODEL_H
#define LT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define LT_TEXT 96            // sanitized strings are cut to this many bytes (incl. NUL)
#define LT_MAX_REQS 256       // request rows kept from one snapshot
#define LT_MAX_HIST 4096      // loss points kept client-side (halved by keeping every 2nd)
#define LT_MSG_HIST 2048      // points read from one message's training.history
#define LT_RATE_N 600         // sparkline samples (one per second: the last 10 minutes)
#define LT_EVENTS 256         // event tail lines kept
#define LT_MAX_LINE (1u << 20) // a monitor line longer than this is dropped unread

struct lt_num {
  double v;
  int known;
};
struct lt_str {
  char s[LT_TEXT]; // printable UTF-8: control characters and bad bytes are replaced by '?'
  int known;
};

struct lt_req {
  struct lt_str id, state, client, adapter;
  struct lt_num prompt_tokens, prefilled, tokens, max_tokens, tok_s, age_s;
};

struct lt_point {
  double step, loss, val; // val_known says whether val is a value
  int val_known;
};

struct lt_snapshot {
  struct lt_num time, uptime_s, pid;
  struct lt_str version;
  struct lt_str dev_name, dev_type, dev_backend, dev_reason;
  struct lt_num dev_cu, dev_threads;
  struct lt_num mem_dev_total, mem_dev_used, mem_host_rss, mem_host_total, mem_weights, mem_kv, mem_train;
  struct lt_num kv_used, kv_total;
  struct lt_str model_name, model_path, model_arch, model_quant;
  struct lt_num model_params, model_ctx, model_vocab;
  struct lt_str listen;
  struct lt_num clients, active, queued, parallel, req_total, req_done, tok_gen, tok_prefill, decode_tps, prefill_tps,
      clients_dropped;
  int n_reqs, reqs_known, reqs_cut; // reqs_cut: more rows came than LT_MAX_REQS
  struct lt_req reqs[LT_MAX_REQS];
  struct lt_str tr_state, tr_checkpoint, tr_run_dir, tr_backend, tr_device; // tr_backend/device: where it trains
  struct lt_num tr_step, tr_total, tr_epoch, tr_loss, tr_val_loss, tr_lr, tr_grad_norm, tr_tps, tr_eta, tr_skipped;
  int hist_known, hist_tail, n_hist;
  struct lt_point hist[LT_MSG_HIST];
};

enum lt_msg_type { LT_MSG_SNAPSHOT = 1, LT_MSG_EVENT, LT_MSG_REPLY };

struct lt_msg {
  enum lt_msg_type type;
  struct lt_snapshot *snap; // LT_MSG_SNAPSHOT: caller-provided storage (large)
  // LT_MSG_EVENT
  struct lt_str event;      // the event's name
  char text[256];           // one sanitized line describing it
  struct lt_num ev_step, ev_loss, ev_val_loss;
  // LT_MSG_REPLY
  struct lt_str command, error;
  int ok;
};

// Parses one monitor line (without its '\n'). msg->snap must point to storage for a snapshot.
// Returns 0, or a negative LL_E* code with err naming what was wrong (bad JSON, not an
// object, unknown type, wrong field type). Never trusts a size or a string from the line.
int lt_parse_line(const char *buf, size_t len, struct lt_msg *msg, char *err, size_t errlen);

// Copies n bytes of untrusted text into out (cap bytes) as printable UTF-8: C0/C1 controls,
// DEL and invalid UTF-8 become '?', cut at a character boundary. Returns the length.
size_t lt_sanitize(const char *s, size_t n, char *out, size_t cap);

// Assembles lines from a byte stream read in arbitrary chunks. A line longer than max bytes
// is not kept: its bytes are dropped up to its '\n' and on_long reports its length.
struct lt_linebuf {
  char *buf;
  size_t len, cap, max;
  int discarding;
  size_t discarded;
};
typedef void (*lt_line_fn)(void *user, const char *line, size_t len);
typedef void (*lt_long_fn)(void *user, size_t len);
void lt_linebuf_init(struct lt_linebuf *lb, size_t max);
void lt_linebuf_reset(struct lt_linebuf *lb); // drop a partial line (a new connection)
void lt_linebuf_free(struct lt_linebuf *lb);
// Feeds n bytes; calls on_line for each complete line (without its '\n'), on_long for each
// over-long one. Returns the number of lines completed, or LL_ENOMEM (the partial line is then
// dropped as if it were over-long).
int lt_linebuf_feed(struct lt_linebuf *lb, const char *data, size_t n, lt_line_fn on_line, lt_long_fn on_long, void *user);

struct lt_event {
  double t;        // local wall time it arrived
  int level;       // 0 info, 1 warning, 2 error
  char text[256];
};

struct lt_model {
  int have;                 // a snapshot has been seen since start
  struct lt_snapshot snap;  // the last one
  double pid_seen;          // the pid the history belongs to (a new server resets it)
  // sparklines: one sample per second, ring
  double rate_dec[LT_RATE_N], rate_pre[LT_RATE_N];
  int rate_n, rate_head;
  double rate_last_t;
  // loss history, ascending step
  struct lt_point hist[LT_MAX_HIST];
  int n_hist;
  int hist_gen;             // bumped whenever hist changes (the chart redraws then)
  // event tail, ring
  struct lt_event ev[LT_EVENTS];
  int n_ev, ev_head;
  unsigned ev_seq;          // events added since init (wraps): a scrolled-back view stays anchored
  // the last reply
  char reply[256];
  int reply_ok, have_reply;
};

void lt_model_init(struct lt_model *m);
// Folds one parsed message in; now = local wall time in seconds.
void lt_model_apply(struct lt_model *m, const struct lt_msg *msg, double now);
void lt_model_add_event(struct lt_model *m, double now, int level, const char *text);
const struct lt_event *lt_model_event(const struct lt_model *m, int i); // 0 = newest

// Plain-text rendering of one snapshot (lltop --once); every unknown value prints N/A.
// Writes at most cap bytes incl. NUL; returns the length it wanted.
size_t lt_format_text(const struct lt_snapshot *s, char *out, size_t cap);

// snprintf that may cut (the text is for display; a cut is fine and expected).
void lt_fmt(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Number formatting used everywhere: N/A when unknown; bounded output for any double.
void lt_fmt_bytes(char *out, size_t cap, struct lt_num n);
void lt_fmt_num(char *out, size_t cap, struct lt_num n, int prec);
void lt_fmt_int(char *out, size_t cap, struct lt_num n);
void lt_fmt_dur(char *out, size_t cap, struct lt_num n);
void lt_fmt_count(char *out, size_t cap, struct lt_num n); // 135M, 1.2k

#endif
