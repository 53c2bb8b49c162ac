// lltop.c - the live monitor for llsrv: attaches to the server's monitor Unix socket, folds
// its JSON lines into the model (lt_model.c) and draws it with ncursesw. One thread, one
// poll() over the socket and the keyboard; signals only set flags (SIGWINCH -> redraw at the
// new size, SIGINT/SIGTERM/SIGHUP -> restore the terminal and leave). Every string from the
// server is sanitized by the parser and again clipped per character here (put(): controls,
// bidi controls and what the locale cannot print are drawn as '?', wide characters take their
// columns), so nothing the server sends reaches the terminal raw. Panels, keys and the drop
// order for small terminals: man/lltop.1.
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define NCURSES_WIDECHAR 1
#include <curses.h>

#include "ll_error.h"
#include "lt_model.h"

#ifndef LL_VERSION
#define LL_VERSION "0"
#endif

// ---- options and global state ----

static struct {
  char socket[108];
  int interval_ms;
  int once, json;
} opt = {"", 1000, 0, 0};

static volatile sig_atomic_t g_quit_sig, g_resized;
static int g_curses;       // the terminal is in curses mode (restore it on every exit)
static int g_utf8, g_color;

static struct lt_model g_m;
static struct lt_snapshot g_parse; // storage the parser fills

static struct {
  int fd;             // -1 while disconnected
  struct lt_linebuf lb;
  double last_rx;     // wall time of the last complete line
  double next_try;
  int ever;           // connected at least once
  double down_since;
  char why[160];      // why the last connect failed / the connection ended
} C = {.fd = -1};

// UI state
static int focus;              // 0 requests table, 1 event tail
static int scroll_req, scroll_ev;
static int logy, show_help;
static int confirm;            // 0 none, else the key being confirmed
static char confirm_cmd[32], confirm_q[96];
static char status[256];
static double status_t;
static int status_level;
static int vis_req_rows, vis_ev_rows; // rows each scrollable panel showed last time

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void set_status(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_status(int level, const char *fmt, ...) {
  char raw[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  lt_sanitize(raw, strlen(raw), status, sizeof status);
  status_t = now_s();
  status_level = level;
  lt_model_add_event(&g_m, status_t, level, status);
}

static void restore_terminal(void) {
  if (g_curses) {
    g_curses = 0;
    endwin();
  }
}

static void on_signal(int sig) {
  if (sig == SIGWINCH) g_resized = 1;
  else g_quit_sig = sig;
}

static void default_socket(char *out, size_t cap) {
  const char *rt = getenv("XDG_RUNTIME_DIR");
  if (rt && rt[0] == '/') snprintf(out, cap, "%s/llsrv/llsrv.sock", rt);
  else snprintf(out, cap, "/tmp/llsrv-%u/llsrv.sock", (unsigned)getuid());
}

// ---- the connection ----

// Returns a connected, non-blocking socket or -1 with why set.
static int conn_open(const char *path, char *why, size_t cap) {
  struct sockaddr_un sun;
  memset(&sun, 0, sizeof sun);
  sun.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sun.sun_path) {
    snprintf(why, cap, "socket path is longer than %zu bytes", sizeof sun.sun_path - 1);
    return -1;
  }
  memcpy(sun.sun_path, path, strlen(path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, cap, "socket: %s", strerror(errno));
    return -1;
  }
  if (connect(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
    snprintf(why, cap, "%s", strerror(errno));
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static void conn_drop(const char *why) {
  if (C.fd >= 0) close(C.fd);
  C.fd = -1;
  lt_linebuf_reset(&C.lb);
  C.down_since = now_s();
  C.next_try = C.down_since + 1.0;
  snprintf(C.why, sizeof C.why, "%s", why);
  set_status(1, "disconnected (%s), retrying", why);
}

static void conn_try(void) {
  double t = now_s();
  if (C.fd >= 0 || t < C.next_try) return;
  char why[160];
  int fd = conn_open(opt.socket, why, sizeof why);
  if (fd < 0) {
    snprintf(C.why, sizeof C.why, "%s", why);
    C.next_try = t + 1.0;
    if (!C.down_since) C.down_since = t;
    return;
  }
  C.fd = fd;
  C.last_rx = t;
  lt_linebuf_reset(&C.lb);
  C.ever = 1;
  C.down_since = 0;
  set_status(0, "attached to %s", opt.socket);
}

// One complete line from the server: parse, fold into the model, or say why it was ignored.
static void process_line(const char *line, size_t len) {
  static struct lt_msg msg;
  char err[256];
  msg.snap = &g_parse;
  int rc = lt_parse_line(line, len, &msg, err, sizeof err);
  if (rc < 0) {
    set_status(1, "ignored a line from the server: %s", err);
    return;
  }
  lt_model_apply(&g_m, &msg, now_s());
}

static void on_long_line(void *user, size_t len) {
  (void)user;
  set_status(1, "ignored a line of %zu bytes from the server (over the %u byte limit)", len, LT_MAX_LINE);
}

static void on_line(void *user, const char *line, size_t len) {
  (void)user;
  process_line(line, len);
}

// Reads what is there (bounded per call so keys stay responsive). Returns 1 if lines came.
static int conn_read(void) {
  if (C.fd < 0) return 0;
  int got_lines = 0;
  size_t budget = 4u << 20;
  static char chunk[65536];
  while (budget && C.fd >= 0) {
    ssize_t n = read(C.fd, chunk, sizeof chunk);
    if (n == 0) {
      conn_drop("the server closed the socket");
      return got_lines;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) conn_drop(strerror(errno));
      return got_lines;
    }
    budget = (size_t)n > budget ? 0 : budget - (size_t)n;
    int k = lt_linebuf_feed(&C.lb, chunk, (size_t)n, on_line, on_long_line, NULL);
    if (k == LL_ENOMEM) set_status(2, "out of memory reading a line from the server: dropped");
    if (k != 0) {
      C.last_rx = now_s();
      got_lines = 1;
    }
  }
  return got_lines;
}

static int conn_send(const char *cmd) {
  if (C.fd < 0) {
    set_status(1, "not connected: '%s' not sent", cmd);
    return -1;
  }
  char line[64];
  int n = snprintf(line, sizeof line, "%.60s\n", cmd);
  if (send(C.fd, line, (size_t)n, MSG_NOSIGNAL) != n) {
    set_status(1, "could not send '%s': %s", cmd, strerror(errno));
    return -1;
  }
  set_status(0, "sent '%s', waiting for the server's answer", cmd);
  return 0;
}

// ---- drawing primitives ----

enum { CP_HEAD = 1, CP_OK, CP_WARN, CP_ERR, CP_TRAIN, CP_VAL, CP_W, CP_KV, CP_TR, CP_DIM, CP_FOCUS };

static int g_dim; // draw data dimmed (disconnected / stale)

static attr_t A(int pair) { return g_color ? COLOR_PAIR(pair) : 0; }

// Bidirectional controls (marks, embeddings, overrides, isolates): drawn as '?' like the
// parser does, so nothing reorders what follows them on the terminal.
static int bidi_control(wchar_t c) {
  return c == 0x061C || c == 0x200E || c == 0x200F || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

// Zero-width characters that format rather than combine: dropped. Terminals disagree about the
// width of a ZWJ emoji sequence and of a base followed by a variation selector; without them
// every character takes its wcwidth() columns, the columns the layout counts.
static int zero_width_format(wchar_t c) {
  return c == 0x034F || c == 0x180E || (c >= 0x200B && c <= 0x200D) || (c >= 0x2060 && c <= 0x2064) ||
         (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0xE0000 && c <= 0xE007F) || (c >= 0xE0100 && c <= 0xE01EF);
}

// Draws untrusted or local UTF-8 text at (y, x) in at most maxw columns. In a UTF-8 locale a
// printable character takes its wcwidth() columns (CJK and emoji two); a double-width one that
// would cross the edge is cut before it (the column stays blank), combining marks go with the
// character before them (at most CCHARW_MAX - 1, none at the start), zero-width formatting
// characters are dropped. Controls, bidi controls, invalid UTF-8 and anything the locale
// cannot print become '?'; outside UTF-8 everything but printable ASCII does. Returns the
// columns used.
static int put(int y, int x, int maxw, const char *s) {
  if (maxw <= 0 || y < 0 || y >= LINES || x < 0 || x >= COLS) return 0;
  if (x + maxw > COLS) maxw = COLS - x;
  wchar_t w[1024];
  int k = 0, cols = 0, marks = -1; // marks on the last character; -1: no character to carry them
  mbstate_t st;
  memset(&st, 0, sizeof st);
  size_t n = strlen(s);
  while (n && k < (int)(sizeof w / sizeof w[0])) {
    wchar_t c;
    int cw = 1;
    size_t r = 1;
    if (!g_utf8) { // ASCII; a UTF-8 sequence (all strings are UTF-8) is one '?'
      unsigned char b = (unsigned char)*s;
      c = b < 0x20 || b > 0x7e ? L'?' : (wchar_t)b;
      if (b >= 0xC0)
        while (r < n && r < 4 && ((unsigned char)s[r] & 0xC0) == 0x80) r++;
    } else if ((r = mbrtowc(&c, s, n, &st)) == (size_t)-1 || r == (size_t)-2 || r == 0) {
      c = L'?';
      r = 1;
      memset(&st, 0, sizeof st);
    } else if (c < 0x20 || (c >= 0x7f && c <= 0x9f) || bidi_control(c) || c == 0x2028 || c == 0x2029) {
      c = L'?';
    } else if (zero_width_format(c)) {
      cw = -2; // dropped
    } else if ((cw = wcwidth(c)) < 0 || cw > 2) {
      c = L'?', cw = 1;
    }
    s += r;
    n -= r;
    if (cw == -2) continue;
    if (cw == 0) { // a combining mark: it rides on the character before it
      if (marks >= 0 && marks < CCHARW_MAX - 1) w[k++] = c, marks++;
      continue;
    }
    if (cols + cw > maxw) break;
    w[k++] = c;
    cols += cw;
    marks = 0;
  }
  mvaddnwstr(y, x, w, k);
  return cols;
}

static int putf(int y, int x, int maxw, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int putf(int y, int x, int maxw, const char *fmt, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  return put(y, x, maxw, b);
}

// One of our own glyphs (a UTF-8 literal when the locale is UTF-8, else the ASCII fallback).
static void glyph(int y, int x, const char *u8, const char *ascii) { put(y, x, 1, g_utf8 ? u8 : ascii); }

static void box_at(int y, int x, int h, int w, const char *title, int focused) {
  if (h < 2 || w < 4) return;
  mvaddch(y, x, ACS_ULCORNER);
  mvhline(y, x + 1, ACS_HLINE, w - 2);
  mvaddch(y, x + w - 1, ACS_URCORNER);
  for (int i = 1; i < h - 1; i++) {
    mvaddch(y + i, x, ACS_VLINE);
    mvaddch(y + i, x + w - 1, ACS_VLINE);
  }
  mvaddch(y + h - 1, x, ACS_LLCORNER);
  mvhline(y + h - 1, x + 1, ACS_HLINE, w - 2);
  mvaddch(y + h - 1, x + w - 1, ACS_LRCORNER);
  if (title) {
    attr_t a = focused ? (A_BOLD | A(CP_FOCUS)) : A_BOLD;
    attron(a);
    putf(y, x + 2, w - 4, focused ? "[%s]" : " %s ", title);
    attroff(a);
  }
}

// A panel's title rule across the width: "── Title ─────── right ─".
static void rule_at(int y, int W, const char *title, int focused, const char *right) {
  mvhline(y, 0, ACS_HLINE, W);
  attr_t a = focused ? (A_BOLD | A_REVERSE | A(CP_FOCUS)) : A_BOLD;
  attron(a);
  int k = putf(y, 2, W - 4, " %s ", title);
  attroff(a);
  if (right && right[0]) {
    int n = (int)strlen(right) + 2;
    if (2 + k + n < W) putf(y, W - n - 1, n, " %s ", right);
  }
}

static void clear_inner(int y, int x, int h, int w) {
  for (int i = 0; i < h; i++) mvhline(y + i, x, ' ', w);
}

// A horizontal bar of n segments (values in the same unit) scaled to `total`, w columns.
struct seg {
  double v;
  int pair;
  const char *u8, *ascii; // fill glyph: distinct per segment so it reads without colour
};
static void bar(int y, int x, int w, const struct seg *sg, int n, double total) {
  if (w < 3) return;
  put(y, x, 1, "[");
  put(y, x + w - 1, 1, "]");
  int inner = w - 2, col = 0;
  double acc = 0;
  for (int i = 0; i < n && total > 0; i++) {
    if (!(sg[i].v > 0)) continue;
    acc += sg[i].v;
    int upto = (int)(acc / total * inner + 0.5);
    if (upto > inner) upto = inner;
    if (upto <= col && sg[i].v > 0 && col < inner) upto = col + 1; // anything present shows
    attron(A(sg[i].pair));
    for (; col < upto; col++) glyph(y, x + 1 + col, sg[i].u8, sg[i].ascii);
    attroff(A(sg[i].pair));
  }
  for (; col < inner; col++) glyph(y, x + 1 + col, g_utf8 ? "\xc2\xb7" : ".", ".");
}

// A sparkline of the last w samples of a ring (NaN = unknown, drawn blank).
static void sparkline(int y, int x, int w, const double *ring, int n, int head) {
  static const char *u8[] = {"\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83", "\xe2\x96\x84",
                             "\xe2\x96\x85", "\xe2\x96\x86", "\xe2\x96\x87", "\xe2\x96\x88"};
  static const char *as[] = {"_", ".", ":", "-", "=", "+", "*", "#"};
  if (w <= 0) return;
  int m = n < w ? n : w;
  double mx = 0;
  for (int i = 0; i < m; i++) {
    double v = ring[(head - m + i + LT_RATE_N) % LT_RATE_N];
    if (isfinite(v) && v > mx) mx = v;
  }
  for (int i = 0; i < w; i++) mvaddch(y, x + i, ' ');
  for (int i = 0; i < m; i++) {
    double v = ring[(head - m + i + LT_RATE_N) % LT_RATE_N];
    int cx = x + w - m + i;
    if (!isfinite(v)) continue;
    int lv = mx > 0 ? (int)(v / mx * 7 + 0.5) : 0;
    if (lv < 0) lv = 0;
    if (lv > 7) lv = 7;
    put(y, cx, 1, g_utf8 ? u8[lv] : as[lv]);
  }
}

// ---- panels ----

static void draw_header(int W) {
  const struct lt_snapshot *s = &g_m.snap;
  char up[32], par[32];
  attron(A_REVERSE | A(CP_HEAD));
  mvhline(0, 0, ' ', W);
  lt_fmt_dur(up, sizeof up, s->uptime_s);
  lt_fmt_count(par, sizeof par, s->model_params);
  int x = 0;
  char st[96];
  double t = now_s();
  int pair = CP_OK;
  if (C.fd < 0) {
    lt_fmt(st, sizeof st, " disconnected, retrying ");
    pair = CP_ERR;
  } else if (t - C.last_rx > (opt.interval_ms / 1000.0 * 3 > 5 ? opt.interval_ms / 1000.0 * 3 : 5)) {
    lt_fmt(st, sizeof st, " stale: no data for %.0fs ", t - C.last_rx);
    pair = CP_WARN;
  } else {
    lt_fmt(st, sizeof st, " live ");
  }
  int sl = (int)strlen(st);
  int hw = W - sl; // the header text stops before the connection state
  if (!g_m.have) {
    x += putf(0, x, hw - x, " lltop  %s", opt.socket);
  } else {
    x += putf(0, x, hw - x, " llsrv %s", s->version.known ? s->version.s : "N/A");
    x += putf(0, x, hw - x, " | up %s", up);
    x += putf(0, x, hw - x, " | %s %s %s", s->model_name.known ? s->model_name.s : "N/A", par, s->model_quant.known ? s->model_quant.s : "N/A");
    x += putf(0, x, hw - x, " | %s/%s %s", s->dev_type.known ? s->dev_type.s : "N/A", s->dev_backend.known ? s->dev_backend.s : "N/A",
              s->dev_name.known ? s->dev_name.s : "N/A");
  }
  // The connection state, right-aligned, always visible.
  attroff(A(CP_HEAD));
  attron(A_BOLD | A(pair));
  put(0, W - sl > 0 ? W - sl : 0, W, st);
  attroff(A_BOLD | A(pair));
  attroff(A_REVERSE);
}

static void draw_memory(int y, int h, int W) {
  const struct lt_snapshot *s = &g_m.snap;
  int iw = W, x = 0, r = y + 1;
  char a[32], b[32], c[32], d[32], e[32], ttl[240];
  lt_fmt_int(a, sizeof a, s->dev_cu);
  lt_fmt_int(b, sizeof b, s->dev_threads);
  lt_fmt(ttl, sizeof ttl, "Device %s: %s, backend %s, %s compute units, %s threads", s->dev_name.known ? s->dev_name.s : "N/A",
         s->dev_type.known ? s->dev_type.s : "N/A", s->dev_backend.known ? s->dev_backend.s : "N/A", a, b);
  rule_at(y, W, ttl, 0, NULL);
  // device memory used / total
  lt_fmt_bytes(a, sizeof a, s->mem_dev_used);
  lt_fmt_bytes(b, sizeof b, s->mem_dev_total);
  int narrow = iw < 64;
  int lab = putf(r, x, iw, narrow ? " Mem " : " Device mem ");
  char tail[96];
  if (s->mem_dev_used.known && s->mem_dev_total.known && s->mem_dev_total.v > 0)
    lt_fmt(tail, sizeof tail, narrow ? " %s/%s" : " %s / %s (%.0f%%)", a, b, 100.0 * s->mem_dev_used.v / s->mem_dev_total.v);
  else lt_fmt(tail, sizeof tail, " %s / %s", a, b);
  int bw = iw - lab - (int)strlen(tail);
  if (bw > 40) bw = 40 + (bw - 40) / 2;
  if (bw < 8) bw = 8;
  if (s->mem_dev_used.known && s->mem_dev_total.known) {
    struct seg sg = {s->mem_dev_used.v, CP_OK, "\xe2\x96\x88", "#"};
    bar(r, x + lab, bw, &sg, 1, s->mem_dev_total.v);
  } else {
    putf(r, x + lab, bw, "[N/A]");
  }
  put(r, x + lab + (bw > 0 ? bw : 0), iw - lab - (bw > 0 ? bw : 0), tail);
  r++;
  if (h < 3) return;
  // host RSS split: weights, KV cache, training buffers, the rest
  lt_fmt_bytes(a, sizeof a, s->mem_host_rss);
  lt_fmt_bytes(c, sizeof c, s->mem_weights);
  lt_fmt_bytes(d, sizeof d, s->mem_kv);
  lt_fmt_bytes(e, sizeof e, s->mem_train);
  lab = putf(r, x, iw, narrow ? " RSS " : " Host RSS   ");
  lt_fmt(tail, sizeof tail, " %s: weights %s, KV %s, training %s", a, c, d, e);
  if (iw - lab - (int)strlen(tail) < 12) // too narrow for the words and a bar: the short labels
    lt_fmt(tail, sizeof tail, " %s: wts %s, KV %s, train %s", a, c, d, e);
  bw = iw - lab - (int)strlen(tail);
  if (bw < 12) bw = 12 < iw - lab ? 12 : iw - lab;
  if (bw > 40) bw = 40;
  if (s->mem_host_rss.known) {
    double w = s->mem_weights.known ? s->mem_weights.v : 0, k = s->mem_kv.known ? s->mem_kv.v : 0,
           t = s->mem_train.known ? s->mem_train.v : 0, rest = s->mem_host_rss.v - w - k - t;
    struct seg sg[4] = {{w, CP_W, "\xe2\x96\x88", "W"}, {k, CP_KV, "\xe2\x96\x93", "K"}, {t, CP_TR, "\xe2\x96\x92", "T"},
                        {rest, CP_DIM, "\xe2\x96\x91", "o"}};
    double tot = s->mem_host_rss.v > w + k + t ? s->mem_host_rss.v : w + k + t;
    bar(r, x + lab, bw, sg, 4, tot);
  } else {
    putf(r, x + lab, bw, "[N/A]");
  }
  put(r, x + lab + bw, iw - lab - bw, tail);
}

static void draw_serving(int y, int h, int W, int spark, int table) {
  const struct lt_snapshot *s = &g_m.snap;
  char pos[48] = "";
  if (table && s->n_reqs > 0) lt_fmt(pos, sizeof pos, "%d request%s", s->n_reqs, s->n_reqs == 1 ? "" : "s");
  rule_at(y, W, "Serving", focus == 0 && table, pos);
  int iw = W, x = 0, r = y + 1;
  char a[32], b[32], c[32], d[32], e[32], f[32];
  lt_fmt_int(a, sizeof a, s->clients);
  lt_fmt_int(b, sizeof b, s->active);
  lt_fmt_int(c, sizeof c, s->parallel);
  lt_fmt_int(d, sizeof d, s->queued);
  lt_fmt_int(e, sizeof e, s->kv_used);
  lt_fmt_int(f, sizeof f, s->kv_total);
  char dn[32], gn[32];
  lt_fmt_int(dn, sizeof dn, s->req_done);
  lt_fmt_count(gn, sizeof gn, s->tok_gen);
  // A busy server's counts grow: when the full labels would leave no room for the KV bar, the
  // short ones do (80 columns with thousands of requests done).
  char line[512];
  snprintf(line, sizeof line, " clients %s  active %s/%s  queued %s  done %s  generated %s tok  KV %s/%s ", a, b, c, d, dn, gn, e, f);
  if ((int)strlen(line) + 7 > iw) snprintf(line, sizeof line, " clients %s active %s/%s queued %s done %s generated %s tok KV %s/%s ", a, b, c, d, dn, gn, e, f);
  int k = putf(r, x, iw, "%s", line);
  if (s->kv_used.known && s->kv_total.known && iw - k >= 7) { // the KV bar takes what is left
    struct seg sg = {s->kv_used.v, CP_KV, "\xe2\x96\x88", "#"};
    int bw = iw - k - 1;
    if (bw > 20) bw = 20;
    bar(r, x + k, bw, &sg, 1, s->kv_total.v);
  }
  r++;
  if (spark) {
    char v[32];
    lt_fmt_num(v, sizeof v, s->decode_tps, 1);
    int l = putf(r, x, iw, " decode  %9s tok/s ", v);
    attron(A(CP_OK));
    sparkline(r, x + l, iw - l - 1, g_m.rate_dec, g_m.rate_n, g_m.rate_head);
    attroff(A(CP_OK));
    r++;
    lt_fmt_num(v, sizeof v, s->prefill_tps, 1);
    l = putf(r, x, iw, " prefill %9s tok/s ", v);
    attron(A(CP_KV));
    sparkline(r, x + l, iw - l - 1, g_m.rate_pre, g_m.rate_n, g_m.rate_head);
    attroff(A(CP_KV));
    r++;
  }
  if (!table) return;
  int rows = y + h - r - 1;
  if (rows < 1) return;
  // Columns drop from the right as the width shrinks: adapter, client, age.
  int base = 1 + 11 + 8 + 7 + 12 + 8, show_age = base + 8 <= iw, show_client = base + 8 * show_age + 22 <= iw,
      show_adapter = base + 8 * show_age + 22 * show_client + 9 <= iw;
  attron(A_UNDERLINE);
  char hdr[256];
  lt_fmt(hdr, sizeof hdr, " %-10s %s%-7s %6s %11s %7s%s%s", "ID", show_client ? "CLIENT                " : "", "STATE", "PROMPT",
         "GENERATED", "TOK/S", show_age ? "     AGE" : "", show_adapter ? " ADAPTER" : "");
  mvhline(r, x, ' ', iw);
  put(r, x, iw, hdr);
  attroff(A_UNDERLINE);
  r++;
  int n = s->n_reqs;
  if (scroll_req > n - rows) scroll_req = n - rows;
  if (scroll_req < 0) scroll_req = 0;
  vis_req_rows = rows;
  if (!s->reqs_known) {
    put(r, x, iw, " N/A (the server does not report requests)");
    return;
  }
  if (n == 0) {
    attron(A_DIM);
    put(r, x, iw, " no active generations");
    attroff(A_DIM);
  }
  for (int i = 0; i < rows && scroll_req + i < n; i++) {
    const struct lt_req *q = &s->reqs[scroll_req + i];
    char pt[24], gen[40], ts[24], age[24];
    lt_fmt_int(pt, sizeof pt, q->prompt_tokens);
    lt_fmt_int(a, sizeof a, q->tokens);
    lt_fmt_int(b, sizeof b, q->max_tokens);
    lt_fmt(gen, sizeof gen, "%s/%s", a, b);
    lt_fmt_num(ts, sizeof ts, q->tok_s, 1);
    lt_fmt_dur(age, sizeof age, q->age_s);
    // put() cuts each string to its column by display width (a byte-sized copy could split a
    // multi-byte character); the next column starts at a fixed x whatever was drawn.
    const char *id = q->id.known ? q->id.s : "N/A", *cl = q->client.known ? q->client.s : "N/A",
               *ad = q->adapter.known ? q->adapter.s : "N/A";
    mvhline(r + i, x, ' ', iw);
    int cx = x + 1;
    put(r + i, cx, 10, id);
    cx += 11;
    if (show_client) put(r + i, cx, 21, cl), cx += 22;
    put(r + i, cx, 7, q->state.known ? q->state.s : "N/A");
    cx += 8;
    putf(r + i, cx, iw - (cx - x), "%6s %11s %7s", pt, gen, ts);
    cx += 26;
    if (show_age) putf(r + i, cx, iw - (cx - x), " %7s", age), cx += 8;
    if (show_adapter) putf(r + i, cx, iw - (cx - x), " %s", ad);
  }
  if (n > rows || s->reqs_cut) {
    lt_fmt(pos, sizeof pos, "rows %d-%d of %d%s", scroll_req + 1, scroll_req + rows < n ? scroll_req + rows : n, n, s->reqs_cut ? "+" : "");
    rule_at(y, W, "Serving", focus == 0 && table, pos);
  }
}

static void draw_training(int y, int h, int W) {
  const struct lt_snapshot *s = &g_m.snap;
  // Where it trains (the server's trainer may run on the CPU while serving on a GPU).
  char on[LT_TEXT + 32] = "";
  if (s->tr_backend.known) lt_fmt(on, sizeof on, "on %s: %s", s->tr_backend.s, s->tr_device.known ? s->tr_device.s : "N/A");
  if ((int)strlen(on) + 16 > W && s->tr_backend.known) lt_fmt(on, sizeof on, "on %s", s->tr_backend.s); // a narrow terminal
  rule_at(y, W, "Training", 0, on);
  int iw = W, x = 0, r = y + 1;
  char a[32], b[32], c[32], d[32], e[32], f[32];
  const char *stt = s->tr_state.known ? s->tr_state.s : "N/A";
  int pair = !strcmp(stt, "running") ? CP_OK : !strcmp(stt, "error") ? CP_ERR : (!strcmp(stt, "paused") || !strcmp(stt, "pausing")) ? CP_WARN : 0;
  int k = put(r, x, iw, " state ");
  attron(A_BOLD | A(pair));
  k += put(r, x + k, iw - k, stt);
  attroff(A_BOLD | A(pair));
  lt_fmt_int(a, sizeof a, s->tr_step);
  lt_fmt_int(b, sizeof b, s->tr_total);
  char pct[16] = "";
  if (s->tr_step.known && s->tr_total.known && s->tr_total.v > 0) lt_fmt(pct, sizeof pct, " (%.0f%%)", 100 * s->tr_step.v / s->tr_total.v);
  lt_fmt_num(c, sizeof c, s->tr_epoch, 2);
  lt_fmt_num(d, sizeof d, s->tr_loss, 4);
  lt_fmt_num(e, sizeof e, s->tr_val_loss, 4);
  struct lt_num ppl = {0, 0};
  if (s->tr_loss.known && s->tr_loss.v < 700) ppl.v = exp(s->tr_loss.v), ppl.known = 1;
  lt_fmt_num(f, sizeof f, ppl, 2);
  char line[256];
  lt_fmt(line, sizeof line, "  step %s/%s%s  epoch %s  loss %s  val loss %s  perplexity %s", a, b, pct, c, d, e, f);
  if ((int)strlen(line) > iw - k) lt_fmt(line, sizeof line, "  step %s/%s%s  ep %s  loss %s  val %s  ppl %s", a, b, pct, c, d, e, f);
  put(r, x + k, iw - k, line);
  r++;
  if (h < 3) return;
  lt_fmt_num(a, sizeof a, s->tr_lr, 6);
  if (s->tr_lr.known && s->tr_lr.v != 0 && fabs(s->tr_lr.v) < 1e-2) lt_fmt(a, sizeof a, "%.3g", s->tr_lr.v);
  lt_fmt_num(b, sizeof b, s->tr_grad_norm, 3);
  lt_fmt_int(c, sizeof c, s->tr_skipped);
  lt_fmt_num(d, sizeof d, s->tr_tps, 1);
  lt_fmt_dur(e, sizeof e, s->tr_eta);
  char line2[256];
  lt_fmt(line2, sizeof line2, " lr %s  grad norm %s  skipped %s  %s tok/s  ETA %s  checkpoint ", a, b, c, d, e);
  if (iw - (int)strlen(line2) < 24) lt_fmt(line2, sizeof line2, " lr %s  gnorm %s  skip %s  %s tok/s  ETA %s  ckpt ", a, b, c, d, e);
  k = put(r, x, iw, line2);
  // A long checkpoint path keeps its end (the step is in the file name).
  const char *cp = s->tr_checkpoint.known ? s->tr_checkpoint.s : "N/A";
  int room = iw - k, len = (int)strlen(cp);
  if (len > room && room > 4) {
    const char *tail = cp + len - (room - 3);
    while (tail > cp && ((unsigned char)*tail & 0xC0) == 0x80) tail++; // a character boundary
    k += put(r, x + k, 3, "...");
    put(r, x + k, iw - k, tail);
  } else {
    put(r, x + k, iw - k, cp);
  }
}

// Train (and validation) loss against step. Braille cells (2x4 dots each) in UTF-8 locales;
// elsewhere ASCII half cells ('\'' upper, '.' lower, ':' both; 'o' marks validation).
static unsigned char *g_cells; // per cell: braille bits
static unsigned char *g_ser;   // per cell: 1 train, 2 validation
static size_t g_cells_cap;

static void plot_dot(int pw, int ph, int sx, int sy, int series, int sub_w, int sub_h) {
  if (sx < 0 || sy < 0 || sx >= pw * sub_w || sy >= ph * sub_h) return;
  int cx = sx / sub_w, cy = sy / sub_h;
  static const unsigned char bits[4][2] = {{0x01, 0x08}, {0x02, 0x10}, {0x04, 0x20}, {0x40, 0x80}};
  unsigned char bit = sub_h == 4 ? bits[sy % 4][sx % 2] : (sy % 2 ? 2 : 1);
  g_cells[cy * pw + cx] |= bit;
  g_ser[cy * pw + cx] |= (unsigned char)series;
}

static void plot_line(int pw, int ph, int x0, int y0, int x1, int y1, int series, int sw, int sh) {
  int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
  for (int guard = 0; guard < 100000; guard++) {
    plot_dot(pw, ph, x0, y0, series, sw, sh);
    if (x0 == x1 && y0 == y1) break;
    int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

static double ty(double v) { return logy ? log10(v) : v; }

static void draw_chart(int y, int h, int W) {
  char title[64];
  lt_fmt(title, sizeof title, "Loss (%s; l: %s)", logy ? "log scale" : "linear", logy ? "linear" : "log");
  rule_at(y, W, title, 0, NULL);
  int ix = 0, iy = y + 1, iw = W, ih = h - 1;
  // legend on the top border
  if (W > 60) {
    int lx = W - 28;
    attron(A(CP_TRAIN));
    put(y, lx, 9, g_utf8 ? " \xe2\x94\x80 train " : " - train ");
    attroff(A(CP_TRAIN));
    attron(A(CP_VAL));
    put(y, lx + 9, 14, g_utf8 ? " \xe2\x94\x80 validation " : " o validation ");
    attroff(A(CP_VAL));
  }
  const struct lt_point *P = g_m.hist;
  int n = g_m.n_hist;
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (int i = 0; i < n; i++) {
    xmin = fmin(xmin, P[i].step), xmax = fmax(xmax, P[i].step);
    if (!logy || P[i].loss > 0) ymin = fmin(ymin, ty(P[i].loss)), ymax = fmax(ymax, ty(P[i].loss));
    if (P[i].val_known && (!logy || P[i].val > 0)) ymin = fmin(ymin, ty(P[i].val)), ymax = fmax(ymax, ty(P[i].val));
  }
  if (n == 0 || !isfinite(ymin)) {
    put(iy + ih / 2, ix + 2, iw - 4, g_m.have && g_m.snap.hist_known ? "no training points yet" : "N/A (the server reports no training history)");
    return;
  }
  if (xmax <= xmin) xmin -= 1, xmax += 1;
  if (ymax - ymin < 1e-9 * (fabs(ymax) + 1)) ymin -= 0.5 * (fabs(ymin) * 0.1 + 1e-3), ymax += 0.5 * (fabs(ymax) * 0.1 + 1e-3);
  double pad = (ymax - ymin) * 0.05;
  ymin -= pad, ymax += pad;
  const int LW = 9; // y labels
  int pw = iw - LW - 1, ph = ih - 2;
  if (pw < 4 || ph < 2) return;
  size_t need = (size_t)pw * (size_t)ph;
  if (need > g_cells_cap) {
    unsigned char *a = realloc(g_cells, need), *b = realloc(g_ser, need);
    if (a) g_cells = a;
    if (b) g_ser = b;
    if (!a || !b) return;
    g_cells_cap = need;
  }
  memset(g_cells, 0, need);
  memset(g_ser, 0, need);
  int sw = g_utf8 ? 2 : 1, sh = g_utf8 ? 4 : 2;
  double fx = (pw * sw - 1) / (xmax - xmin), fy = (ph * sh - 1) / (ymax - ymin);
  for (int ser = 1; ser <= 2; ser++) {
    int havep = 0, px = 0, py = 0;
    for (int i = 0; i < n; i++) {
      double v = ser == 1 ? P[i].loss : P[i].val;
      if (ser == 2 && !P[i].val_known) continue;
      if (logy && v <= 0) continue;
      int sx = (int)lround((P[i].step - xmin) * fx), sy = (int)lround((ymax - ty(v)) * fy);
      if (havep) plot_line(pw, ph, px, py, sx, sy, ser, sw, sh);
      else plot_dot(pw, ph, sx, sy, ser, sw, sh);
      px = sx, py = sy, havep = 1;
    }
  }
  // y axis: labels at the top, middle and bottom rows (values, also in log scale)
  int px0 = ix + LW;
  for (int r = 0; r < ph; r++) {
    mvaddch(iy + r, px0, ACS_VLINE);
    if (r == 0 || r == ph - 1 || r == ph / 2) {
      double yv = ymax - (r * sh + sh / 2.0) / fy;
      char lab[32];
      lt_fmt(lab, sizeof lab, "%8.3g", logy ? pow(10, yv) : yv);
      put(iy + r, ix, LW - 1, lab);
    }
  }
  mvaddch(iy + ph, px0, ACS_LLCORNER);
  mvhline(iy + ph, px0 + 1, ACS_HLINE, pw);
  // x axis: step labels at both ends and the middle
  char l0[32], l1[32], lm[32];
  snprintf(l0, sizeof l0, "%.0f", xmin);
  lt_fmt(lm, sizeof lm, "%.0f", (xmin + xmax) / 2);
  snprintf(l1, sizeof l1, "%.0f", xmax);
  if (fabs(xmax) >= 1e9) snprintf(l1, sizeof l1, "%.3g", xmax), snprintf(l0, sizeof l0, "%.3g", xmin), lt_fmt(lm, sizeof lm, "%.3g", (xmin + xmax) / 2);
  mvhline(iy + ph + 1, ix, ' ', iw);
  put(iy + ph + 1, ix, LW, "    step");
  put(iy + ph + 1, px0 + 1, pw, l0);
  if (pw > 30) put(iy + ph + 1, px0 + 1 + pw / 2 - (int)strlen(lm) / 2, pw / 2, lm);
  put(iy + ph + 1, px0 + 1 + pw - (int)strlen(l1), (int)strlen(l1), l1);
  for (int r = 0; r < ph; r++) {
    for (int c = 0; c < pw; c++) {
      unsigned char b = g_cells[r * pw + c], se = g_ser[r * pw + c];
      int cx = px0 + 1 + c;
      if (!b) {
        mvaddch(iy + r, cx, ' ');
        continue;
      }
      attr_t at = A(se & 2 ? CP_VAL : CP_TRAIN) | (se & 2 ? A_BOLD : 0);
      attron(at);
      if (g_utf8) {
        wchar_t wc[2] = {(wchar_t)(0x2800 + b), 0};
        mvaddnwstr(iy + r, cx, wc, 1);
      } else {
        char ch = se & 2 ? 'o' : (b == 3 ? ':' : b == 1 ? '\'' : '.');
        mvaddch(iy + r, cx, (chtype)(unsigned char)ch);
      }
      attroff(at);
    }
  }
}

// The event tail's scroll counts lines back from the newest. Scrolled back, it moves with the
// lines that arrived since (the view stays on the same events, as in less +F stopped); at the
// bottom it follows the new ones.
static unsigned ev_seq_seen;
static void ev_anchor(void) {
  unsigned d = g_m.ev_seq - ev_seq_seen;
  ev_seq_seen = g_m.ev_seq;
  if (scroll_ev > 0) scroll_ev = d > LT_EVENTS ? g_m.n_ev : scroll_ev + (int)d;
}

static void draw_events(int y, int h, int W) {
  int iw = W, rows = h - 1;
  ev_anchor();
  vis_ev_rows = rows;
  if (scroll_ev > g_m.n_ev - rows) scroll_ev = g_m.n_ev - rows;
  if (scroll_ev < 0) scroll_ev = 0;
  int nshow = g_m.n_ev - scroll_ev < rows ? g_m.n_ev - scroll_ev : rows; // newest at the bottom
  char pos[48] = "";
  if (g_m.n_ev > rows) // numbered from the oldest line kept
    lt_fmt(pos, sizeof pos, "lines %d-%d of %d", g_m.n_ev - scroll_ev - nshow + 1, g_m.n_ev - scroll_ev, g_m.n_ev);
  rule_at(y, W, "Events", focus == 1, pos);
  for (int i = 0; i < nshow; i++) {
    const struct lt_event *e = lt_model_event(&g_m, scroll_ev + nshow - 1 - i);
    if (!e) break;
    time_t tt = (time_t)e->t;
    struct tm tm;
    localtime_r(&tt, &tm);
    char ts[16];
    strftime(ts, sizeof ts, "%H:%M:%S", &tm);
    attr_t at = e->level == 2 ? A(CP_ERR) | A_BOLD : e->level == 1 ? A(CP_WARN) : 0;
    int k = putf(y + 1 + i, 0, iw, " %s ", ts);
    attron(at);
    put(y + 1 + i, k, iw - k, e->text);
    attroff(at);
  }
}

static void draw_help(int H, int W) {
  static const char *lines[] = {
      "lltop - keys",
      "",
      "q          quit",
      "?          this help (any key closes it)",
      "p          pause / resume training (asks first)",
      "s          save a checkpoint now (asks first)",
      "t          start / stop training (asks first)",
      "l          loss chart: linear / log scale",
      "tab        focus: requests table / event tail",
      "arrows     scroll the focused panel",
      "PgUp/PgDn  scroll a page; Home/End",
      "",
      "Small terminals drop panels in this order:",
      "events, loss chart, request table,",
      "sparklines, then memory shrinks to one bar.",
  };
  int n = (int)(sizeof lines / sizeof lines[0]), w = 48, h = n + 2;
  if (w > W) w = W;
  if (h > H) h = H;
  int y = (H - h) / 2, x = (W - w) / 2;
  clear_inner(y, x, h, w);
  box_at(y, x, h, w, "help", 1);
  for (int i = 0; i < n && i < h - 2; i++) put(y + 1 + i, x + 2, w - 4, lines[i]);
}

static void draw(void) {
  int H = LINES, W = COLS;
  erase();
  if (H < 3 || W < 20) {
    put(0, 0, W, "lltop: terminal too small");
    refresh();
    return;
  }
  g_dim = C.fd < 0 || !g_m.have;
  draw_header(W);
  // Panels from top to bottom; rows between the header and the status line.
  int avail = H - 2;
  int n_reqs = g_m.snap.n_reqs;
  int mem_h = 3, spark = 1, table = 1, chart = 1, events = 1;
  int serv_base = 2, train_h = 3, table_min = 2, chart_min = 7, ev_min = 3;
  // Drop order: events, chart, table, sparklines, then memory collapses to one bar line.
  for (int level = 0; level <= 5; level++) {
    events = level < 1, chart = level < 2, table = level < 3, spark = level < 4, mem_h = level < 5 ? 3 : 2;
    int need = mem_h + serv_base + (spark ? 2 : 0) + (table ? table_min : 0) + train_h + (chart ? chart_min : 0) + (events ? ev_min : 0);
    if (need <= avail || level == 5) break;
  }
  if (mem_h + serv_base + train_h > avail) train_h = 2; // one line of training below 12 rows
  int used = mem_h + serv_base + (spark ? 2 : 0) + (table ? table_min : 0) + train_h + (chart ? chart_min : 0) + (events ? ev_min : 0);
  int extra = avail - used;
  if (extra < 0) extra = 0;
  int table_rows = table ? table_min : 0, chart_h = chart ? chart_min : 0, ev_h = events ? ev_min : 0;
  if (table) {
    int want = 1 + (n_reqs > 2 ? n_reqs : 2) + 0; // header + rows
    int add = want - (table_min - 0);
    if (!chart && !events) add = extra; // nothing else wants the rows
    if (add > extra) add = extra;
    if (add > 0) table_rows += add, extra -= add;
  }
  if (chart && events) {
    int ce = extra * 2 / 3;
    chart_h += ce;
    ev_h += extra - ce;
  } else if (chart) {
    chart_h += extra;
  } else if (events) {
    ev_h += extra;
  }
  // The focus goes to a panel that is on screen (before drawing: the titles show it).
  if (focus == 0 && !table && events) focus = 1;
  if (focus == 1 && !events) focus = 0;
  if (g_dim) attron(A_DIM);
  int y = 1;
  if (y + mem_h > H - 1) mem_h = H - 1 - y;
  if (mem_h >= 2) draw_memory(y, mem_h, W);
  y += mem_h;
  int serv_h = serv_base + (spark ? 2 : 0) + table_rows;
  if (y + serv_h > H - 1) serv_h = H - 1 - y;
  if (serv_h >= 2) draw_serving(y, serv_h, W, spark, table);
  y += serv_h;
  if (y + train_h > H - 1) train_h = H - 1 - y;
  if (train_h >= 2) draw_training(y, train_h, W);
  y += train_h;
  if (chart && chart_h >= 5) draw_chart(y, chart_h, W);
  y += chart_h;
  if (events && ev_h >= 2) draw_events(y, ev_h, W);
  if (g_dim) attroff(A_DIM);
  // status line
  mvhline(H - 1, 0, ' ', W);
  if (confirm) {
    attron(A_REVERSE | A_BOLD);
    putf(H - 1, 0, W, " %s [y/N] ", confirm_q);
    attroff(A_REVERSE | A_BOLD);
  } else if (status[0] && now_s() - status_t < 10) {
    attron(status_level ? A(CP_WARN) | A_BOLD : 0);
    put(H - 1, 0, W, status);
    attroff(status_level ? A(CP_WARN) | A_BOLD : 0);
  } else if (C.fd < 0) {
    attron(A(CP_ERR) | A_BOLD);
    putf(H - 1, 0, W, "disconnected, retrying %s (%s)", opt.socket, C.why);
    attroff(A(CP_ERR) | A_BOLD);
  } else {
    put(H - 1, 0, W, "q quit  ? help  p pause/resume  s save  t train start/stop  l log  tab focus  arrows scroll");
  }
  if (show_help) draw_help(H, W);
  refresh();
}

// ---- keys ----

static void ask(int key, const char *cmd, const char *q) {
  confirm = key;
  lt_fmt(confirm_cmd, sizeof confirm_cmd, "%s", cmd);
  lt_fmt(confirm_q, sizeof confirm_q, "%s", q);
}

static void on_key(int ch) {
  if (show_help) {
    show_help = 0;
    return;
  }
  if (confirm) {
    if (ch == 'y' || ch == 'Y') conn_send(confirm_cmd);
    else set_status(0, "cancelled");
    confirm = 0;
    return;
  }
  const char *st = g_m.snap.tr_state.known ? g_m.snap.tr_state.s : "";
  if (focus == 1) ev_anchor();
  int *sc = focus == 0 ? &scroll_req : &scroll_ev;
  int page = (focus == 0 ? vis_req_rows : vis_ev_rows);
  if (page < 1) page = 1;
  // The farthest scroll with the rows last drawn: each key stops at the ends at once (keys read
  // in one batch are not drawn in between; drawing clamps again when a table shrinks).
  int last = focus == 0 ? g_m.snap.n_reqs - vis_req_rows : g_m.n_ev - vis_ev_rows;
  if (last < 0) last = 0;
  switch (ch) {
  case 'q':
  case 'Q': g_quit_sig = -1; break;
  case '?':
  case 'h': show_help = 1; break;
  case 'p':
    if (!strcmp(st, "paused") || !strcmp(st, "pausing")) ask(ch, "resume", "Resume training?");
    else ask(ch, "pause", "Pause training?");
    break;
  case 's': ask(ch, "save", "Save a checkpoint now?"); break;
  case 't':
    if (!strcmp(st, "running") || !strcmp(st, "paused") || !strcmp(st, "pausing")) ask(ch, "train stop", "Stop training?");
    else ask(ch, "train start", "Start training?");
    break;
  case 'l': logy = !logy; break;
  case '\t':
  case KEY_BTAB: focus = !focus; break;
  // The event tail counts from the newest line (at the bottom): up goes back in time.
  case KEY_UP: *sc += focus ? 1 : -1; break;
  case KEY_DOWN: *sc += focus ? -1 : 1; break;
  case KEY_PPAGE: *sc += focus ? page : -page; break;
  case KEY_NPAGE: *sc += focus ? -page : page; break;
  case KEY_HOME: *sc = focus ? last : 0; break;
  case KEY_END: *sc = focus ? 0 : last; break;
  default: break;
  }
  if (*sc > last) *sc = last;
  if (*sc < 0) *sc = 0;
}

// ---- modes ----

static void usage(FILE *f) {
  fprintf(f, "usage: lltop [--socket PATH] [--interval MS] [--once] [--json]\n"
             "  --socket PATH   the llsrv monitor socket (default $XDG_RUNTIME_DIR/llsrv/llsrv.sock,\n"
             "                  else /tmp/llsrv-$UID/llsrv.sock)\n"
             "  --interval MS   redraw interval, 100..60000 (default 1000)\n"
             "  --once          print one plain-text snapshot and exit\n"
             "  --json          print the raw snapshot (JSON) and exit\n"
             "  --version, --help\n"
             "See lltop(1).\n");
}

// --once / --json: the snapshot the server sends on attach. Returns the exit status.
static int run_once(void) {
  char why[160];
  int fd = conn_open(opt.socket, why, sizeof why);
  if (fd < 0) {
    fprintf(stderr, "lltop: no llsrv listening on %s: %s\n", opt.socket, why);
    return 1;
  }
  static char buf[LT_MAX_LINE + 1];
  size_t len = 0;
  double deadline = now_s() + 10;
  for (;;) {
    char *nl = memchr(buf, '\n', len);
    while (nl) {
      size_t l = (size_t)(nl - buf);
      static struct lt_msg msg;
      char err[256];
      msg.snap = &g_parse;
      int rc = lt_parse_line(buf, l, &msg, err, sizeof err);
      if (rc == 0 && msg.type == LT_MSG_SNAPSHOT) {
        close(fd);
        if (opt.json) { // re-encoded: valid JSON, ASCII only, no raw control bytes
          json_t *j = json_loadb(buf, l, 0, NULL);
          char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
          if (!txt) return fprintf(stderr, "lltop: cannot re-encode the snapshot\n"), 1;
          printf("%s\n", txt);
          free(txt);
          json_decref(j);
        } else {
          static char out[1 << 18];
          lt_format_text(&g_parse, out, sizeof out);
          if (!g_utf8) // outside UTF-8 the text goes out as ASCII
            for (char *p = out; *p; p++)
              if ((unsigned char)*p >= 0x80) *p = '?';
          fputs(out, stdout);
        }
        return fflush(stdout) == 0 ? 0 : 1;
      }
      if (rc < 0) fprintf(stderr, "lltop: ignored a line from the server: %s\n", err);
      memmove(buf, nl + 1, len - l - 1);
      len -= l + 1;
      nl = memchr(buf, '\n', len);
    }
    if (len >= LT_MAX_LINE) {
      fprintf(stderr, "lltop: the server sent a line over %u bytes\n", LT_MAX_LINE);
      close(fd);
      return 1;
    }
    double left = deadline - now_s();
    if (left <= 0) {
      fprintf(stderr, "lltop: no snapshot from %s within 10 s\n", opt.socket);
      close(fd);
      return 1;
    }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
    ssize_t n = read(fd, buf + len, LT_MAX_LINE - len);
    if (n == 0) {
      fprintf(stderr, "lltop: %s closed the connection before a snapshot\n", opt.socket);
      close(fd);
      return 1;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      fprintf(stderr, "lltop: reading %s: %s\n", opt.socket, strerror(errno));
      close(fd);
      return 1;
    }
    if (n > 0) len += (size_t)n;
  }
  close(fd);
  return 1;
}

static void init_colors(void) {
  const char *nc = getenv("NO_COLOR");
  g_color = has_colors() && !(nc && nc[0]);
  if (!g_color) return;
  start_color();
  use_default_colors();
  init_pair(CP_HEAD, COLOR_BLACK, COLOR_CYAN);
  init_pair(CP_OK, COLOR_GREEN, -1);
  init_pair(CP_WARN, COLOR_YELLOW, -1);
  init_pair(CP_ERR, COLOR_RED, -1);
  init_pair(CP_TRAIN, COLOR_CYAN, -1);
  init_pair(CP_VAL, COLOR_YELLOW, -1);
  init_pair(CP_W, COLOR_BLUE, -1);
  init_pair(CP_KV, COLOR_GREEN, -1);
  init_pair(CP_TR, COLOR_MAGENTA, -1);
  init_pair(CP_DIM, COLORS >= 16 ? 8 : COLOR_WHITE, -1);
  init_pair(CP_FOCUS, COLOR_CYAN, -1);
}

static int run_tui(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    fprintf(stderr, "lltop: not a terminal (use --once or --json for a snapshot)\n");
    return 2;
  }
  atexit(restore_terminal);
  if (!initscr()) return 2;
  g_curses = 1;
  // Our handlers after initscr (which installs its own): flags only.
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGWINCH, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  cbreak();
  noecho();
  nonl();
  keypad(stdscr, TRUE);
  nodelay(stdscr, TRUE);
  curs_set(0);
  set_escdelay(25);
  init_colors();
  set_status(0, "lltop %s: attaching to %s", LL_VERSION, opt.socket);
  conn_try();
  double next_draw = 0;
  while (!g_quit_sig) {
    if (g_resized) {
      g_resized = 0;
      struct winsize ws;
      if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) resizeterm(ws.ws_row, ws.ws_col);
      clearok(stdscr, TRUE);
      next_draw = 0;
    }
    double t = now_s();
    if (t >= next_draw) {
      draw();
      next_draw = t + opt.interval_ms / 1000.0;
    }
    conn_try();
    struct pollfd p[2] = {{STDIN_FILENO, POLLIN, 0}, {C.fd, POLLIN, 0}};
    double wait = next_draw - now_s();
    if (C.fd < 0 && C.next_try - now_s() < wait) wait = C.next_try - now_s();
    int ms = wait > 0 ? (int)(wait * 1000) + 1 : 0;
    int r = poll(p, C.fd >= 0 ? 2 : 1, ms);
    if (r < 0) continue; // EINTR: a signal set a flag
    int dirty = 0;
    if (C.fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      int had = C.fd;
      conn_read();
      if (C.fd < 0 && had >= 0) dirty = 1; // show the disconnect at once
    }
    if (p[0].revents & POLLIN) {
      int ch;
      while ((ch = getch()) != ERR) {
        if (ch == KEY_RESIZE) g_resized = 1;
        else on_key(ch), dirty = 1;
      }
    }
    if (p[0].revents & (POLLHUP | POLLERR)) g_quit_sig = SIGHUP; // the terminal went away
    if (dirty) next_draw = 0;
  }
  restore_terminal();
  // A signal exits 128+N (as a shell reports it); the flag handler stays installed, so a second
  // signal during the exit (a hangup of the closing terminal) cannot cut the exit short.
  int sig = g_quit_sig;
  return sig > 0 ? 128 + sig : 0;
}

int main(int argc, char **argv) {
  setlocale(LC_ALL, "");
  g_utf8 = strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--socket") && i + 1 < argc) {
      if (strlen(argv[i + 1]) >= sizeof opt.socket) {
        fprintf(stderr, "lltop: --socket path is longer than %zu bytes\n", sizeof opt.socket - 1);
        return 2;
      }
      snprintf(opt.socket, sizeof opt.socket, "%s", argv[++i]);
    } else if (!strcmp(a, "--interval") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || end == argv[i] || v < 100 || v > 60000) {
        fprintf(stderr, "lltop: --interval wants milliseconds between 100 and 60000, not '%s'\n", argv[i]);
        return 2;
      }
      opt.interval_ms = (int)v;
    } else if (!strcmp(a, "--once")) {
      opt.once = 1;
    } else if (!strcmp(a, "--json")) {
      opt.json = 1;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--version")) {
      printf("lltop %s\n", LL_VERSION);
      return 0;
    } else {
      fprintf(stderr, "lltop: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!opt.socket[0]) default_socket(opt.socket, sizeof opt.socket);
  lt_model_init(&g_m);
  lt_linebuf_init(&C.lb, LT_MAX_LINE);
  if (opt.once || opt.json) return run_once();
  return run_tui();
}
