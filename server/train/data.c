// data.c - the training data pipeline (ll_data.h): documents read and tokenized one at a time
// from their files, packed into sequences with loss targets, a validation split by document,
// and a cursor that puts a resumed run on exactly the sequence it would have read next.
//
// Positions. A token of the training stream is named by (epoch, unit index in that epoch's
// order, document index in the unit's file, byte offset of the document, token index in the
// document); a unit is what an epoch shuffles (a text file, a run of JSONL records). Documents are cut deterministically from their byte offset (a text piece ends at
// the first blank line after doc_bytes; a JSONL document is one line), so a position can be
// re-entered by reading one document: that is all a cursor holds, and all a resume re-reads.
// Sequence k and k + 1 share a token (the last input of one is the first of the next); the
// shared token is kept as the "carry" and the cursor is its position.

#include "ll_data.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_files.h"
#include "ll_chat.h"
#include "ll_error.h"
#include "ll_tokenizer.h"
#include "ll_trainer.h"

_Static_assert(LL_TRAIN_CURSOR_WORDS == LL_DATA_CURSOR_WORDS, "a run checkpoint stores the data cursor as is");

#define LL_DATA_MAX_RECORD (16u << 20) // bytes of one JSONL line
#define LL_DATA_WINDOW (256u << 10)     // file bytes read at a time
#define LL_DATA_MAX_MESSAGES 1024       // messages of one chat record
#define LL_DATA_MAX_SEQ (1 << 20)       // seq_len

const char *ll_data_skip_name(int r) {
  static const char *const names[LL_DATA_SKIP_N] = {"ignored", "binary", "generated", "too large",
                                                    "empty", "other", "malformed"};
  return r >= 0 && r < LL_DATA_SKIP_N ? names[r] : "?";
}

void ll_data_params_init(struct ll_data_params *p) {
  memset(p, 0, sizeof *p);
  p->val_fraction = 0.05;
  p->max_file_bytes = 4 << 20;
  p->doc_bytes = 4 << 10;
}

// ---------------------------------------------------------------- hashing

static uint64_t mix64(uint64_t x) { // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001B3ULL;
  return h;
}

// ---------------------------------------------------------------- JSONL records

static const struct {
  const char *name, *marker, *end; // marker: text ll_chat_detect recognises; end: end of a turn
} chat_formats[] = {
    {"chatml", "<|im_start|>", "<|im_end|>"},
    {"llama3", "<|start_header_id|><|eot_id|>", "<|eot_id|>"},
    {"gemma", "<start_of_turn>", "<end_of_turn>"},
    {"phi3", "<|assistant|><|end|>", "<|end|>"},
    {"zephyr", "<|user|>", "</s>"},
    {"llama2", "[INST]", "</s>"},
    {"qwen3", "<|im_start|>enable_thinking", "<|im_end|>"},
};

static int find_format(const char *name) {
  for (int i = 0; i < (int)(sizeof chat_formats / sizeof chat_formats[0]); i++)
    if (name && !strcmp(name, chat_formats[i].name)) return i;
  return -1;
}

struct sbuf {
  char *p;
  size_t n, cap;
};

static int sb_put(struct sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = (b->n + n + 1) * 2;
    char *q = realloc(b->p, nc);
    if (!q) return LL_ENOMEM;
    b->p = q, b->cap = nc;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
  return 0;
}

static int add_span(struct ll_data_record *rec, size_t start, size_t end) {
  struct ll_data_span *v = realloc(rec->spans, (size_t)(rec->n_spans + 1) * sizeof *v);
  if (!v) return LL_ENOMEM;
  rec->spans = v;
  v[rec->n_spans].start = start;
  v[rec->n_spans].end = end;
  rec->n_spans++;
  return 0;
}

// Appends the template's markup s[0..n) to b and to rec's marks (merged where they touch): the
// only text where control-token texts become tokens.
static int put_markup(struct ll_data_record *rec, struct sbuf *b, const char *s, size_t n) {
  size_t at = b->n;
  int rc = sb_put(b, s, n);
  if (rc || !n) return rc;
  if (rec->n_marks && rec->marks[rec->n_marks - 1].end == at) {
    rec->marks[rec->n_marks - 1].end = b->n;
    return 0;
  }
  struct ll_tok_span *v = realloc(rec->marks, (size_t)(rec->n_marks + 1) * sizeof *v);
  if (!v) return LL_ENOMEM;
  rec->marks = v;
  v[rec->n_marks++] = (struct ll_tok_span){at, b->n};
  return 0;
}

// The loss spans of one assistant turn, text[start, end) its content and [end, stop) its
// end-of-turn marker, with its reasoning left out: each "<think>" ... "</think>" block (Qwen3's
// thinking; one left open runs to the content's end) and the whitespace after it. What the turn
// says after its thinking is learned; how it thought is not (train.on_thinking: it is).
static int think_spans(struct ll_data_record *rec, const char *text, size_t start, size_t end, size_t stop) {
  static const char open[] = "<think>", close[] = "</think>";
  size_t at = start;
  for (;;) {
    const char *o = memmem(text + at, end - at, open, sizeof open - 1);
    if (!o) break;
    const size_t os = (size_t)(o - text);
    const char *c = memmem(text + os, end - os, close, sizeof close - 1);
    size_t ce = c ? (size_t)(c - text) + sizeof close - 1 : end;
    while (ce < end && (text[ce] == ' ' || text[ce] == '\n' || text[ce] == '\r' || text[ce] == '\t')) ce++;
    if (os > at) {
      int rc = add_span(rec, at, os);
      if (rc) return rc;
    }
    at = ce;
  }
  return add_span(rec, at, stop); // what follows, with the end-of-turn marker (maybe only that)
}

// Renders a conversation: each content is first a placeholder, so the template's markup and
// the contents' places in the text are known exactly; the loss spans are the assistant contents
// with the end-of-turn marker that follows them (their thinking blocks left out unless flags
// has LL_DATA_TRAIN_ON_THINKING).
static int chat_record(json_t *arr, const char *tmpl, unsigned flags, struct ll_data_record *rec, char *err, size_t errlen) {
  if (!json_is_array(arr) || json_array_size(arr) == 0)
    return ll_errf(err, errlen, LL_EFORMAT, "\"messages\" must be a non-empty array");
  size_t n = json_array_size(arr);
  if (n > LL_DATA_MAX_MESSAGES)
    return ll_errf(err, errlen, LL_ELIMIT, "\"messages\" has %zu entries (at most %d)", n, LL_DATA_MAX_MESSAGES);
  int fi = find_format(tmpl);
  const char *ttext = fi >= 0 ? chat_formats[fi].marker : tmpl;
  const char *fmt = ll_chat_detect(ttext);
  if (!fmt)
    return ll_errf(err, errlen, LL_EUNSUPPORTED,
                   tmpl ? "chat records need a chat template of a known format (chatml, llama2, llama3, zephyr, gemma, phi3, qwen3)"
                        : "chat records need a chat template and the model has none (set one with chat_template / "
                          "--chat-template: chatml, llama2, llama3, zephyr, gemma, phi3, qwen3, or a template file)");
  // Qwen3's template is trained on as chatml: each turn's text verbatim, its thinking kept out of
  // the loss by think_spans rather than dropped or re-spaced as the template does at inference.
  if (!strcmp(fmt, "qwen3")) fmt = ttext = "chatml";
  fi = find_format(fmt);
  struct ll_chat_msg *m = calloc(n, sizeof *m);
  char(*ph)[24] = calloc(n, sizeof *ph);
  const char **content = calloc(n, sizeof *content);
  size_t *clen = calloc(n, sizeof *clen);
  char *r = NULL, *g = NULL;
  struct sbuf b = {0};
  int rc = 0, n_asst = 0;
  if (!m || !ph || !content || !clen) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < n; k++) {
    json_t *o = json_array_get(arr, k);
    json_t *jr = json_object_get(o, "role"), *jc = json_object_get(o, "content");
    if (!json_is_object(o) || !json_is_string(jr) || !json_is_string(jc)) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "message %zu needs string fields \"role\" and \"content\"", k);
      goto out;
    }
    const char *role = json_string_value(jr);
    if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "message %zu has role '%.32s' (system, user or assistant)", k, role);
      goto out;
    }
    n_asst += !strcmp(role, "assistant");
    snprintf(ph[k], sizeof ph[k], "\x01LLDATA%zu\x02", k);
    m[k].role = role;
    m[k].content = ph[k];
    content[k] = json_string_value(jc);
    clen[k] = json_string_length(jc);
  }
  if (!n_asst) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "the conversation has no assistant message (nothing to learn from)");
    goto out;
  }
  char e2[160];
  if ((rc = ll_chat_render(ttext, m, (int)n, &r, e2, sizeof e2)) || (rc = ll_chat_render(ttext, NULL, 0, &g, e2, sizeof e2))) {
    rc = ll_errf(err, errlen, rc, "%s", e2);
    goto out;
  }
  size_t rl = strlen(r), gl = strlen(g);
  if (gl <= rl && memcmp(r + rl - gl, g, gl) == 0) rl -= gl; // drop the generation prompt
  size_t i = 0, next = 0;
  const char *end = chat_formats[fi].end;
  const size_t el = strlen(end);
  while (i < rl && !rc) {
    const char *h = memchr(r + i, '\x01', rl - i);
    size_t hi = h ? (size_t)(h - r) : rl;
    rc = put_markup(rec, &b, r + i, hi - i);
    if (!h || rc) break;
    char *stop;
    unsigned long k = strtoul(h + 7, &stop, 10);
    if (strncmp(h, "\x01LLDATA", 7) != 0 || *stop != '\x02' || k != next || k >= n) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "the %s template did not render message %zu", fmt, next);
      break;
    }
    next++;
    size_t start = b.n;
    if ((rc = sb_put(&b, content[k], clen[k]))) break;
    i = (size_t)(stop + 1 - r);
    if (!strcmp(m[k].role, "assistant")) {
      size_t tail = i + el <= rl && memcmp(r + i, end, el) == 0 ? el : 0;
      if ((rc = put_markup(rec, &b, r + i, tail))) break;
      if (!(flags & LL_DATA_TRAIN_ON_THINKING)) rc = think_spans(rec, b.p, start, start + clen[k], b.n);
      else rc = add_span(rec, start, b.n);
      if (rc) break;
      i += tail;
    }
  }
  if (!rc && next != n) rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "the %s template did not render message %zu", fmt, next);
  if (rc == LL_ENOMEM) ll_errf(err, errlen, rc, "out of memory");
  if (!rc && !b.p) rc = sb_put(&b, "", 0);
  if (!rc) {
    rec->text = b.p;
    rec->len = b.n;
    b.p = NULL;
    rec->eos = 0;
  }
out:
  free(b.p);
  free(r);
  free(g);
  free(m);
  free(ph);
  free(content);
  free(clen);
  return rc;
}

int ll_data_record_parse(const char *line, size_t len, const char *tmpl, unsigned flags, struct ll_data_record *rec, char *err,
                         size_t errlen) {
  memset(rec, 0, sizeof *rec);
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) i++;
  if (i == len) return 1;
  if (len > LL_DATA_MAX_RECORD) return ll_errf(err, errlen, LL_ELIMIT, "record longer than %u MiB", LL_DATA_MAX_RECORD >> 20);
  json_error_t je;
  json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) return ll_errf(err, errlen, LL_EFORMAT, "invalid JSON at column %d: %s", je.column, je.text);
  int rc = 0;
  json_t *msgs = json_object_get(root, "messages"), *pr = json_object_get(root, "prompt"),
         *co = json_object_get(root, "completion"), *tx = json_object_get(root, "text");
  if (!json_is_object(root)) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "expected a JSON object");
  } else if (msgs) {
    rc = chat_record(msgs, tmpl, flags, rec, err, errlen);
  } else if (pr || co) {
    if (!json_is_string(pr) || !json_is_string(co)) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "\"prompt\" and \"completion\" must both be strings");
    } else {
      size_t pl = json_string_length(pr), cl = json_string_length(co);
      struct sbuf b = {0};
      rc = sb_put(&b, json_string_value(pr), pl);
      rc = rc ? rc : sb_put(&b, json_string_value(co), cl);
      rc = rc ? rc : add_span(rec, pl, pl + cl);
      if (rc) {
        free(b.p);
        rc = ll_errf(err, errlen, rc, "out of memory");
      } else {
        rec->text = b.p, rec->len = b.n, rec->eos = 1;
      }
    }
  } else if (tx) {
    if (!json_is_string(tx)) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "\"text\" must be a string");
    } else {
      struct sbuf b = {0};
      rc = sb_put(&b, json_string_value(tx), json_string_length(tx));
      rc = rc ? rc : add_span(rec, 0, b.n);
      if (rc) {
        free(b.p);
        rc = ll_errf(err, errlen, rc, "out of memory");
      } else {
        rec->text = b.p, rec->len = b.n, rec->eos = 1;
      }
    }
  } else {
    rc = ll_errf(err, errlen, LL_EFORMAT, "expected \"text\", \"prompt\" and \"completion\", or \"messages\"");
  }
  json_decref(root);
  if (rc) ll_data_record_free(rec);
  return rc;
}

void ll_data_record_free(struct ll_data_record *rec) {
  free(rec->text);
  free(rec->spans);
  free(rec->marks);
  memset(rec, 0, sizeof *rec);
}

// ---------------------------------------------------------------- files and documents

struct rfile { // a window of one open file
  int fd;
  size_t fi;
  char *buf;
  size_t cap, wlen;
  int64_t wstart;
  int eof; // the window ends at the end of the file
};

struct tokbuf {
  int32_t *ids;
  uint8_t *loss; // 1: this token counts when it is a target
  size_t n, cap;
};

struct pos {
  uint64_t epoch, fi, doc, tok;
  int64_t off;
};

struct reader {
  int val;
  struct pos p; // the next token
  int loaded;   // the document at p is in tb
  int64_t next_off;
  struct rfile rf;
  struct tokbuf tb;
  uint32_t *order;
  uint64_t order_epoch;
  int order_ok;
  int dry_wraps; // epochs wrapped in a row without a token
};

struct dfile {
  uint64_t phash;
};

// What an epoch shuffles: a whole text file (its pieces stay in order, so a file is read as one
// text), or with shuffle_pieces one piece of a text file, or a run of LL_DATA_UNIT_DOCS records
// of a JSONL file (records are independent; a file of instructions is reordered too, at a cost of
// a few bytes per record for the table).
#define LL_DATA_UNIT_DOCS 8
struct unit {
  uint32_t fi;
  uint32_t ndocs;   // document indices in it; 0: to the end of the file
  uint64_t doc0;    // first document's index
  int64_t off0;     // and byte offset
  int64_t tok_train, tok_val;
};

struct ll_data {
  const struct ll_tokenizer *tok;
  char *path, *tmpl;
  int S;
  uint64_t seed, thr;
  int64_t doc_bytes;
  int pieces; // shuffle_pieces
  unsigned rflags; // ll_data_record_parse's flags (LL_DATA_TRAIN_ON_THINKING)
  int32_t bos, eos, pad;
  int add_bos;
  struct ll_data_filelist fl;
  struct dfile *df;
  struct unit *u;
  size_t n_units, cap_units;
  struct ll_data_stats st;
  uint64_t fingerprint;
  struct reader tr, va;
  int32_t *win;
  uint8_t *winl;
  // training stream
  int have_carry, need_seek;
  int32_t carry;
  uint8_t carry_loss;
  struct pos carry_pos; // of the carry, or where to seek when need_seek
  uint64_t seqs;
  // validation stream
  int v_have_carry, v_done;
  int32_t v_carry;
  uint8_t v_carry_loss;
};

static void rf_close(struct rfile *rf) {
  if (rf->fd >= 0) close(rf->fd);
  rf->fd = -1;
  rf->wlen = 0;
  rf->wstart = 0;
  rf->eof = 0;
}

static int rf_open(struct ll_data *d, struct rfile *rf, size_t fi, char *err, size_t errlen) {
  if (rf->fd >= 0 && rf->fi == fi) return 0;
  rf_close(rf);
  const char *path = d->fl.v[fi].path;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return ll_errf(err, errlen, LL_ENOTFOUND, "data: '%s' has vanished since the data was scanned", path);
    return ll_errf(err, errlen, LL_EIO, "data: cannot open '%s': %s", path, strerror(errno));
  }
  rf->fd = fd;
  rf->fi = fi;
  return 0;
}

// Makes the file's bytes [off, off + need) available at *p (fewer at the end of the file).
// Returns how many bytes from off are available, or a negative code.
static int64_t rf_get(struct ll_data *d, struct rfile *rf, int64_t off, size_t need, const char **p, char *err,
                      size_t errlen) {
  const int64_t wend = rf->wstart + (int64_t)rf->wlen;
  if (off >= rf->wstart && (off + (int64_t)need <= wend || (rf->eof && off <= wend))) {
    *p = rf->buf + (off - rf->wstart);
    return wend - off;
  }
  size_t want = need > LL_DATA_WINDOW ? need : LL_DATA_WINDOW;
  if (rf->cap < want) {
    char *b = realloc(rf->buf, want);
    if (!b) return ll_errf(err, errlen, LL_ENOMEM, "data: out of memory for a %zu-byte read window", want);
    rf->buf = b, rf->cap = want;
  }
  if (off >= rf->wstart && off < wend) { // keep what is there
    memmove(rf->buf, rf->buf + (off - rf->wstart), (size_t)(wend - off));
    rf->wlen = (size_t)(wend - off);
  } else {
    rf->wlen = 0;
  }
  rf->wstart = off;
  rf->eof = 0;
  while (rf->wlen < rf->cap) {
    ssize_t r = pread(rf->fd, rf->buf + rf->wlen, rf->cap - rf->wlen, rf->wstart + (off_t)rf->wlen);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ll_errf(err, errlen, LL_EIO, "data: reading '%s': %s", d->fl.v[rf->fi].path, strerror(errno));
    if (r == 0) {
      rf->eof = 1;
      break;
    }
    rf->wlen += (size_t)r;
  }
  *p = rf->buf;
  return (int64_t)rf->wlen;
}

struct doc {
  const char *text;
  size_t len;
  int64_t next_off;
  int first, last;
};

// The document starting at off: 1 with it, 0 at the end of the file, or a negative code.
static int doc_read(struct ll_data *d, struct rfile *rf, int64_t off, uint64_t index, struct doc *out, char *err,
                    size_t errlen) {
  const char *b = NULL; // set by rf_get whenever it returns > 0 (gcc -O3 cannot see that)
  const struct ll_data_file *f = &d->fl.v[rf->fi];
  if (f->jsonl) {
    size_t need = 64 << 10;
    for (;;) {
      int64_t avail = rf_get(d, rf, off, need, &b, err, errlen);
      if (avail <= 0) return (int)avail;
      const char *nl = memchr(b, '\n', (size_t)avail);
      if (nl || (avail < (int64_t)need && rf->eof)) {
        size_t n = nl ? (size_t)(nl - b) : (size_t)avail;
        out->text = b;
        out->len = n && b[n - 1] == '\r' ? n - 1 : n;
        out->next_off = off + (int64_t)n + (nl ? 1 : 0);
        out->first = out->last = 1;
        return 1;
      }
      if (need > LL_DATA_MAX_RECORD)
        return ll_errf(err, errlen, LL_ELIMIT, "data: '%s' line %llu is longer than %u MiB", f->path,
                       (unsigned long long)index + 1, LL_DATA_MAX_RECORD >> 20);
      need *= 2;
    }
  }
  const size_t want = (size_t)d->doc_bytes * 2;
  int64_t avail = rf_get(d, rf, off, want + 1, &b, err, errlen);
  if (avail <= 0) return (int)avail;
  out->text = b;
  out->first = off == 0;
  if ((size_t)avail <= want) { // the rest of the file
    out->len = (size_t)avail;
    out->last = 1;
  } else {
    // the first blank line at or after doc_bytes, else the first newline, else a character boundary
    size_t lo = (size_t)d->doc_bytes - 1, cut = 0;
    for (size_t i = lo; i + 1 < want && !cut; i++)
      if (b[i] == '\n' && b[i + 1] == '\n') cut = i + 2;
    for (size_t i = lo; i < want && !cut; i++)
      if (b[i] == '\n') cut = i + 1;
    if (!cut) {
      cut = want;
      while (cut > (size_t)d->doc_bytes && ((unsigned char)b[cut] & 0xC0) == 0x80) cut--;
    }
    out->len = cut;
    out->last = 0;
  }
  out->next_off = off + (int64_t)out->len;
  return 1;
}

static int tb_reserve(struct tokbuf *tb, size_t n, char *err, size_t errlen) {
  if (n <= tb->cap) return 0;
  if (n > (size_t)INT_MAX) return ll_errf(err, errlen, LL_ELIMIT, "data: a document of more than %d tokens", INT_MAX);
  int32_t *ids = realloc(tb->ids, n * sizeof *ids);
  if (ids) tb->ids = ids;
  uint8_t *loss = realloc(tb->loss, n);
  if (loss) tb->loss = loss;
  if (!ids || !loss) return ll_errf(err, errlen, LL_ENOMEM, "data: out of memory for %zu tokens", n);
  tb->cap = n;
  return 0;
}

// Marks the tokens that overlap a loss span: the tokens' texts are laid along the text (a
// leading space a tokenizer adds itself, SentencePiece's dummy prefix, is allowed for).
static int mark_spans(const struct ll_data *d, const char *text, size_t len, const int32_t *ids, uint8_t *loss,
                      size_t n, const struct ll_data_span *sp, int ns, char *err, size_t errlen) {
  char small[256];
  char *piece = small;
  size_t pcap = sizeof small;
  size_t c = 0;
  int j = 0, rc = 0;
  for (size_t i = 0; i < n; i++) {
    int pl = ll_token_to_piece(d->tok, ids[i], piece, pcap, 1);
    if (pl >= 0 && (size_t)pl > pcap) {
      char *q = piece == small ? malloc((size_t)pl) : realloc(piece, (size_t)pl);
      if (!q) {
        rc = ll_errf(err, errlen, LL_ENOMEM, "out of memory");
        break;
      }
      piece = q, pcap = (size_t)pl;
      pl = ll_token_to_piece(d->tok, ids[i], piece, pcap, 1);
    }
    if (pl < 0) {
      rc = ll_errf(err, errlen, pl, "token %d has no text", ids[i]);
      break;
    }
    size_t st = c, k = (size_t)pl;
    if (k <= len - c && memcmp(text + c, piece, k) == 0) {
      c += k;
    } else if (k >= 1 && piece[0] == ' ' && k - 1 <= len - c && memcmp(text + c, piece + 1, k - 1) == 0) {
      c += k - 1;
    } else {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "cannot line the tokens up with the text at byte %zu (token %d)", c,
                   ids[i]);
      break;
    }
    size_t en = c > st ? c : st + 1;
    while (j < ns && sp[j].end <= st) j++;
    loss[i] = j < ns && sp[j].start < en;
  }
  if (piece != small) free(piece);
  return rc;
}

// Tokenizes one document into tb: [BOS] text [EOS]. spans NULL: every text token counts.
// marks: the chat template's markup, where control-token texts are tokens (elsewhere, and in
// text files, "<|im_end|>" is text: training data cannot smuggle in a turn).
static int doc_tokens(struct ll_data *d, struct tokbuf *tb, const char *text, size_t len, const struct ll_tok_span *marks,
                      int n_marks, int bos, int eos, const struct ll_data_span *sp, int ns, char *err, size_t errlen) {
  tb->n = 0;
  if (len > (size_t)INT_MAX - 16) return ll_errf(err, errlen, LL_ELIMIT, "document too long");
  int rc = tb_reserve(tb, len + 16, err, errlen);
  if (rc) return rc;
  size_t at = 0;
  if (bos && d->add_bos && d->bos >= 0) tb->ids[at] = d->bos, tb->loss[at++] = 0;
  int k = ll_tokenize_marked(d->tok, text, len, 0, marks, n_marks, tb->ids + at, (int)(tb->cap - at - 1));
  if (k >= 0 && (size_t)k > tb->cap - at - 1) {
    if ((rc = tb_reserve(tb, at + (size_t)k + 1, err, errlen))) return rc;
    k = ll_tokenize_marked(d->tok, text, len, 0, marks, n_marks, tb->ids + at, (int)(tb->cap - at - 1));
  }
  if (k < 0) return ll_errf(err, errlen, k, "tokenizer: %s", ll_strerror(k));
  if (sp) {
    if ((rc = mark_spans(d, text, len, tb->ids + at, tb->loss + at, (size_t)k, sp, ns, err, errlen))) return rc;
  } else {
    memset(tb->loss + at, 1, (size_t)k);
  }
  at += (size_t)k;
  if (eos && d->eos >= 0) tb->ids[at] = d->eos, tb->loss[at++] = 1;
  tb->n = at;
  return 0;
}

static int in_val(const struct ll_data *d, size_t fi, uint64_t doc) {
  return mix64(d->seed ^ mix64(d->df[fi].phash ^ mix64(doc))) < d->thr;
}

// Tokens of the document doc of file fi into tb (tb->n = 0 for a blank JSONL line).
static int doc_tokenize(struct ll_data *d, struct tokbuf *tb, size_t fi, uint64_t index, const struct doc *dc,
                        char *err, size_t errlen) {
  const struct ll_data_file *f = &d->fl.v[fi];
  char e2[256];
  int rc;
  if (!f->jsonl) {
    rc = doc_tokens(d, tb, dc->text, dc->len, NULL, 0, dc->first, dc->last, NULL, 0, e2, sizeof e2);
    if (rc) return ll_errf(err, errlen, rc, "data: '%s' at byte %lld: %s", f->path, (long long)(dc->next_off - (int64_t)dc->len), e2);
    return 0;
  }
  struct ll_data_record rec;
  rc = ll_data_record_parse(dc->text, dc->len, d->tmpl, d->rflags, &rec, e2, sizeof e2);
  if (rc == 1) {
    tb->n = 0;
    return 0;
  }
  if (rc == 0) {
    int whole = rec.n_spans == 1 && rec.spans[0].start == 0 && rec.spans[0].end == rec.len;
    rc = doc_tokens(d, tb, rec.text, rec.len, rec.marks, rec.n_marks, 1, rec.eos, whole ? NULL : rec.spans, rec.n_spans, e2,
                    sizeof e2);
    ll_data_record_free(&rec);
  }
  if (rc) return ll_errf(err, errlen, rc, "data: '%s' line %llu: %s", f->path, (unsigned long long)index + 1, e2);
  return 0;
}

// ---------------------------------------------------------------- streams

// The unit at index ui of this reader's order: validation reads units in corpus order, training
// in an order drawn from the seed and the epoch.
static const struct unit *unit_at(struct ll_data *d, struct reader *r, uint64_t ui, uint64_t epoch) {
  if (r->val) return &d->u[ui];
  if (!r->order_ok || r->order_epoch != epoch) {
    size_t n = d->n_units;
    for (size_t i = 0; i < n; i++) r->order[i] = (uint32_t)i;
    uint64_t s = mix64(d->seed ^ mix64(epoch ^ 0x5EEDF11E5ULL));
    for (size_t i = n; i > 1; i--) {
      s = mix64(s);
      size_t j = (size_t)(s % i);
      uint32_t t = r->order[i - 1];
      r->order[i - 1] = r->order[j];
      r->order[j] = t;
    }
    r->order_epoch = epoch;
    r->order_ok = 1;
  }
  return &d->u[r->order[ui]];
}

// Positions r at the first token of unit ui (ui == n_units: past the last one).
static void enter_unit(struct ll_data *d, struct reader *r, uint64_t ui) {
  r->p.fi = ui;
  r->p.tok = 0;
  r->loaded = 0;
  if (ui < d->n_units) {
    const struct unit *u = unit_at(d, r, ui, r->p.epoch);
    r->p.doc = u->doc0;
    r->p.off = u->off0;
  } else {
    r->p.doc = 0;
    r->p.off = 0;
  }
}

static void reader_seek(struct reader *r, const struct pos *p) {
  r->p = *p;
  r->loaded = 0;
}

// Loads documents until one has a token at r->p: 0, 1 at the end of the validation split, or a
// negative code.
static int ensure(struct ll_data *d, struct reader *r, char *err, size_t errlen) {
  for (;;) {
    if (r->loaded) {
      if (r->p.tok < r->tb.n) return 0;
      r->p.off = r->next_off;
      r->p.doc++;
      r->p.tok = 0;
      r->loaded = 0;
    }
    if (r->p.fi >= d->n_units) {
      if (r->val) return 1;
      if (++r->dry_wraps > 2)
        return ll_errf(err, errlen, LL_EFORMAT, "data: '%s' gives no training tokens any more (its files changed?)", d->path);
      r->p.epoch++;
      enter_unit(d, r, 0);
    }
    const struct unit *u = unit_at(d, r, r->p.fi, r->p.epoch);
    if ((r->val ? u->tok_val : u->tok_train) == 0 || (u->ndocs && r->p.doc >= u->doc0 + u->ndocs)) {
      enter_unit(d, r, r->p.fi + 1); // nothing of this split in it, or its documents are done
      continue;
    }
    size_t fi = u->fi;
    int rc = rf_open(d, &r->rf, fi, err, errlen);
    if (rc) return rc;
    struct doc dc;
    rc = doc_read(d, &r->rf, r->p.off, r->p.doc, &dc, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) {
      enter_unit(d, r, r->p.fi + 1);
      continue;
    }
    r->next_off = dc.next_off;
    r->loaded = 1;
    r->tb.n = 0;
    if (in_val(d, fi, r->p.doc) != r->val) continue;
    if ((rc = doc_tokenize(d, &r->tb, fi, r->p.doc, &dc, err, errlen))) {
      r->loaded = 0;
      return rc;
    }
    if (r->tb.n) r->dry_wraps = 0;
  }
}

int ll_data_next(struct ll_data *d, int32_t *ids, int32_t *targets, char *err, size_t errlen) {
  struct reader *r = &d->tr;
  const int S = d->S;
  struct pos start = d->have_carry || d->need_seek ? d->carry_pos : r->p;
  if (d->need_seek) {
    reader_seek(r, &d->carry_pos);
    d->need_seek = 0;
    d->have_carry = 0;
  }
  int rc = 0;
  struct pos last = {0};
  if (!d->have_carry) {
    if ((rc = ensure(d, r, err, errlen))) goto fail;
    start = r->p;
    d->win[0] = r->tb.ids[r->p.tok];
    d->winl[0] = r->tb.loss[r->p.tok];
    r->p.tok++;
  } else {
    d->win[0] = d->carry;
    d->winl[0] = d->carry_loss;
  }
  for (int t = 1; t <= S; t++) {
    if ((rc = ensure(d, r, err, errlen))) goto fail;
    if (t == S) last = r->p;
    d->win[t] = r->tb.ids[r->p.tok];
    d->winl[t] = r->tb.loss[r->p.tok];
    r->p.tok++;
  }
  d->carry = d->win[S];
  d->carry_loss = d->winl[S];
  d->carry_pos = last;
  d->have_carry = 1;
  d->seqs++;
  for (int t = 0; t < S; t++) {
    ids[t] = d->win[t];
    targets[t] = d->winl[t + 1] ? d->win[t + 1] : -1;
  }
  return start.epoch > INT_MAX ? INT_MAX : (int)start.epoch;
fail:
  if (rc == 1) rc = ll_errf(err, errlen, LL_ESTATE, "data: the training stream ended");
  d->carry_pos = start; // the next call starts this sequence again
  d->have_carry = 0;
  d->need_seek = 1;
  return rc;
}

void ll_data_val_reset(struct ll_data *d) {
  d->va.p.epoch = 0;
  enter_unit(d, &d->va, 0);
  d->v_have_carry = 0;
  d->v_done = 0;
}

int ll_data_val_next(struct ll_data *d, int32_t *ids, int32_t *targets, char *err, size_t errlen) {
  struct reader *r = &d->va;
  const int S = d->S;
  if (d->v_done) return 0;
  int rc, t = 1;
  if (!d->v_have_carry) {
    if ((rc = ensure(d, r, err, errlen))) goto end;
    d->win[0] = r->tb.ids[r->p.tok];
    d->winl[0] = r->tb.loss[r->p.tok];
    r->p.tok++;
  } else {
    d->win[0] = d->v_carry;
    d->winl[0] = d->v_carry_loss;
  }
  for (; t <= S; t++) {
    if ((rc = ensure(d, r, err, errlen))) goto end;
    d->win[t] = r->tb.ids[r->p.tok];
    d->winl[t] = r->tb.loss[r->p.tok];
    r->p.tok++;
  }
  d->v_carry = d->win[S];
  d->v_carry_loss = d->winl[S];
  d->v_have_carry = 1;
  goto out;
end:
  if (rc < 0) {
    ll_data_val_reset(d);
    return rc;
  }
  d->v_done = 1; // rc == 1: the split ended inside this sequence
  if (t == 1) return 0;
  for (; t <= S; t++) d->win[t] = d->pad, d->winl[t] = 0;
out:
  for (int k = 0; k < S; k++) {
    ids[k] = d->win[k];
    targets[k] = d->winl[k + 1] ? d->win[k + 1] : -1;
  }
  return 1;
}

// ---------------------------------------------------------------- cursor

void ll_data_cursor_get(const struct ll_data *d, struct ll_data_cursor *c) {
  const struct pos *p = d->have_carry || d->need_seek ? &d->carry_pos : &d->tr.p;
  memset(c, 0, sizeof *c);
  c->version = LL_DATA_CURSOR_VERSION;
  c->fingerprint = d->fingerprint;
  c->epoch = p->epoch;
  c->file = p->fi;
  c->doc = p->doc;
  c->offset = (uint64_t)p->off;
  c->token = p->tok;
  c->seqs = d->seqs;
}

int ll_data_cursor_set(struct ll_data *d, const struct ll_data_cursor *c, char *err, size_t errlen) {
  if (c->version != LL_DATA_CURSOR_VERSION)
    return ll_errf(err, errlen, LL_EFORMAT, "data cursor: version %llu (this llsrv reads %d)",
                   (unsigned long long)c->version, LL_DATA_CURSOR_VERSION);
  if (c->fingerprint != d->fingerprint)
    return ll_errf(err, errlen, LL_ESTATE,
                   "data cursor: '%s' is not the data the checkpoint was trained on (its file list, seq_len, seed, "
                   "val_fraction or tokenizer differ)",
                   d->path);
  if (c->offset > (uint64_t)INT64_MAX || c->epoch > (uint64_t)INT_MAX)
    return ll_errf(err, errlen, LL_EFORMAT, "data cursor: offset or epoch out of range");
  struct pos p = {c->epoch, c->file, c->doc, c->token, (int64_t)c->offset};
  d->carry_pos = p;
  d->have_carry = 0;
  d->need_seek = 1;
  d->seqs = c->seqs;
  d->tr.dry_wraps = 0;
  return 0;
}

void ll_data_cursor_to_words(const struct ll_data_cursor *c, uint64_t w[LL_DATA_CURSOR_WORDS]) {
  w[0] = c->version, w[1] = c->fingerprint, w[2] = c->epoch, w[3] = c->file;
  w[4] = c->doc, w[5] = c->offset, w[6] = c->token, w[7] = c->seqs;
}

void ll_data_cursor_from_words(struct ll_data_cursor *c, const uint64_t w[LL_DATA_CURSOR_WORDS]) {
  c->version = w[0], c->fingerprint = w[1], c->epoch = w[2], c->file = w[3];
  c->doc = w[4], c->offset = w[5], c->token = w[6], c->seqs = w[7];
}

static int src_next(void *u, int32_t *ids, int32_t *targets, char *err, size_t errlen) {
  return ll_data_next(u, ids, targets, err, errlen);
}
static int src_val_next(void *u, int32_t *ids, int32_t *targets, char *err, size_t errlen) {
  return ll_data_val_next(u, ids, targets, err, errlen);
}
static void src_val_reset(void *u) { ll_data_val_reset(u); }
static void src_cursor_get(void *u, uint64_t w[LL_TRAIN_CURSOR_WORDS]) {
  struct ll_data_cursor c;
  ll_data_cursor_get(u, &c);
  ll_data_cursor_to_words(&c, w);
}
static int src_cursor_set(void *u, const uint64_t w[LL_TRAIN_CURSOR_WORDS], char *err, size_t errlen) {
  struct ll_data_cursor c;
  ll_data_cursor_from_words(&c, w);
  return ll_data_cursor_set(u, &c, err, errlen);
}

void ll_data_train_source(struct ll_data *d, struct ll_train_source *src) {
  memset(src, 0, sizeof *src);
  src->user = d;
  src->next = src_next;
  src->val_next = src_val_next;
  src->val_reset = src_val_reset;
  src->cursor_get = src_cursor_get;
  src->cursor_set = src_cursor_set;
}

// ---------------------------------------------------------------- open: the scan

void ll_data_stats(const struct ll_data *d, struct ll_data_stats *st) {
  *st = d->st;
  const struct pos *p = d->have_carry || d->need_seek ? &d->carry_pos : &d->tr.p;
  st->epoch = (int64_t)p->epoch;
}

static void reader_free(struct reader *r) {
  rf_close(&r->rf);
  free(r->rf.buf);
  free(r->tb.ids);
  free(r->tb.loss);
  free(r->order);
}

void ll_data_close(struct ll_data *d) {
  if (!d) return;
  reader_free(&d->tr);
  reader_free(&d->va);
  ll_data_filelist_free(&d->fl);
  free(d->df);
  free(d->u);
  free(d->win);
  free(d->winl);
  free(d->path);
  free(d->tmpl);
  free(d);
}

static int skipped_summary(const struct ll_data_filelist *l, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int r = 0; r < LL_DATA_SKIP_N; r++) {
    if (!l->skipped[r]) continue;
    int k = snprintf(buf + n, cap - n, "%s%lld %s (e.g. %s)", n ? ", " : "", (long long)l->skipped[r],
                     ll_data_skip_name(r), l->example[r]);
    if (k < 0 || (size_t)k >= cap - n) break;
    n += (size_t)k;
  }
  return (int)n;
}

// Reads every document once: counts per file and split, refusals.
static int push_unit(struct ll_data *d, size_t fi, uint32_t ndocs, uint64_t doc0, int64_t off0) {
  if (d->n_units == d->cap_units) {
    if (d->n_units >= UINT32_MAX / 2) return LL_ELIMIT;
    size_t nc = d->cap_units ? d->cap_units * 2 : 64;
    struct unit *v = realloc(d->u, nc * sizeof *v);
    if (!v) return LL_ENOMEM;
    d->u = v, d->cap_units = nc;
  }
  struct unit *u = &d->u[d->n_units++];
  memset(u, 0, sizeof *u);
  u->fi = (uint32_t)fi;
  u->ndocs = ndocs;
  u->doc0 = doc0;
  u->off0 = off0;
  return 0;
}

// Reads every document once: counts per unit and split, the units' table, refusals.
static int scan(struct ll_data *d, char *err, size_t errlen) {
  struct reader *r = &d->tr;
  uint64_t min_h = UINT64_MAX;
  size_t min_u = 0;
  int64_t min_n = 0, min_loss = 0;
  for (size_t fi = 0; fi < d->fl.n; fi++) {
    const struct ll_data_file *f = &d->fl.v[fi];
    int rc = rf_open(d, &r->rf, fi, err, errlen);
    if (rc) return rc;
    // this file's counts, committed when the whole file has been read
    const size_t u_first = d->n_units;
    // records per unit: 8, more for files over 128 MiB (the table stays under ~64K units a file)
    // text: 0 (the whole file is one unit) or, with shuffle_pieces, 1
    const uint32_t k = f->jsonl ? (uint32_t)(f->size >> 24 > LL_DATA_UNIT_DOCS ? (f->size >> 24 > (1 << 20) ? 1 << 20 : f->size >> 24) : LL_DATA_UNIT_DOCS)
                                : (uint32_t)(d->pieces != 0);
    int64_t off = 0, docs = 0, n_tr = 0, n_va = 0, d_tr = 0, d_va = 0, l_tr = 0;
    uint64_t f_min_h = UINT64_MAX;
    size_t f_min_u = 0;
    int64_t f_min_n = 0, f_min_loss = 0;
    if (!k) rc = push_unit(d, fi, 0, 0, 0);
    for (uint64_t doc = 0; !rc; doc++) {
      if (k && doc % k == 0 && (rc = push_unit(d, fi, k, doc, off))) break;
      struct doc dc;
      rc = doc_read(d, &r->rf, off, doc, &dc, err, errlen);
      if (rc == 0) break;
      if (rc > 0) {
        off = dc.next_off;
        rc = doc_tokenize(d, &r->tb, fi, doc, &dc, err, errlen);
      }
      if (rc < 0) break;
      if (!r->tb.n) continue;
      docs++;
      struct unit *u = &d->u[d->n_units - 1];
      int64_t n = (int64_t)r->tb.n, loss = 0;
      for (size_t i = 0; i < r->tb.n; i++) loss += r->tb.loss[i]; // a BOS has loss 0
      uint64_t h = mix64(d->seed ^ mix64(d->df[fi].phash ^ mix64(doc)));
      if (h < d->thr) n_va += n, d_va++, u->tok_val += n;
      else n_tr += n, d_tr++, l_tr += loss, u->tok_train += n;
      if (h < f_min_h) f_min_h = h, f_min_u = d->n_units - 1, f_min_n = n, f_min_loss = loss;
    }
    if (rc == LL_ELIMIT && d->n_units >= UINT32_MAX / 2)
      return ll_errf(err, errlen, rc, "data: '%s' has too many records", f->path);
    if (rc == LL_ENOMEM && !(err && err[0])) return ll_errf(err, errlen, rc, "data: out of memory");
    if (rc < 0) {
      d->n_units = u_first;
      // A JSONL member of a directory that does not parse (a source tree's test fixtures, a
      // chat file for a model without a template) is skipped and counted with its first error;
      // a file named directly, and any I/O error, stops here.
      if (!d->fl.is_dir || !f->jsonl || rc == LL_EIO || rc == LL_ENOMEM || rc == LL_ENOTFOUND) return rc;
      d->fl.skipped[LL_DATA_SKIP_MALFORMED]++;
      if (!d->fl.example[LL_DATA_SKIP_MALFORMED][0]) {
        const char *m = strstr(err, f->rel); // "data: 'DIR/REL' line N: why" -> "REL' line N: why"
        snprintf(d->fl.example[LL_DATA_SKIP_MALFORMED], sizeof d->fl.example[0], "%s", m ? m : f->rel);
        char *q = strchr(d->fl.example[LL_DATA_SKIP_MALFORMED], '\'');
        if (q && m) memmove(q, q + 1, strlen(q)); // drop the closing quote
      }
      if (err && errlen) err[0] = '\0';
      continue;
    }
    if (!docs) {
      d->n_units = u_first;
      if (!d->fl.is_dir)
        return ll_errf(err, errlen, LL_EFORMAT, "data: '%s' holds no document (only blank lines)", f->path);
      d->fl.skipped[LL_DATA_SKIP_EMPTY]++;
      if (!d->fl.example[LL_DATA_SKIP_EMPTY][0])
        snprintf(d->fl.example[LL_DATA_SKIP_EMPTY], sizeof d->fl.example[0], "%s", f->rel);
      continue;
    }
    d->st.docs_train += d_tr, d->st.docs_val += d_va;
    d->st.tokens_train += n_tr, d->st.tokens_val += n_va;
    d->st.loss_tokens_train += l_tr;
    d->st.files++;
    d->st.bytes += off;
    if (f_min_h < min_h) min_h = f_min_h, min_u = f_min_u, min_n = f_min_n, min_loss = f_min_loss;
  }
  rf_close(&r->rf);
  const int64_t docs = d->st.docs_train + d->st.docs_val;
  if (docs == 0) {
    char sk[512];
    skipped_summary(&d->fl, sk, sizeof sk);
    return ll_errf(err, errlen, LL_EFORMAT, "data: no usable text under '%s'%s%s%s", d->path, sk[0] ? " (skipped: " : "",
                   sk, sk[0] ? ")" : "");
  }
  if (d->thr && d->st.docs_val == 0 && docs >= 2) { // hold out at least one document
    d->thr = min_h + 1;
    d->u[min_u].tok_train -= min_n, d->u[min_u].tok_val += min_n;
    d->st.docs_train--, d->st.docs_val++;
    d->st.tokens_train -= min_n, d->st.tokens_val += min_n;
    d->st.loss_tokens_train -= min_loss;
  }
  if (d->st.docs_train == 0) {
    if (docs == 1) { // a single document: no validation split
      d->thr = 0;
      for (size_t i = 0; i < d->n_units; i++) d->u[i].tok_train += d->u[i].tok_val, d->u[i].tok_val = 0;
      d->st.docs_train = 1, d->st.docs_val = 0;
      d->st.tokens_train = d->st.tokens_val, d->st.tokens_val = 0;
      d->st.loss_tokens_train = min_loss;
    } else {
      return ll_errf(err, errlen, LL_EINVAL, "data: val_fraction %.3g leaves no training document in '%s'",
                     (double)d->thr / 18446744073709551616.0, d->path);
    }
  }
  if (d->st.tokens_train < (int64_t)d->S + 1)
    return ll_errf(err, errlen, LL_EFORMAT,
                   "data: '%s' is too short: %lld training tokens, and one sequence of seq_len %d needs %d",
                   d->path, (long long)d->st.tokens_train, d->S, d->S + 1);
  if (d->st.loss_tokens_train == 0)
    return ll_errf(err, errlen, LL_EFORMAT, "data: no token of '%s' counts in the loss (no completion or assistant text)",
                   d->path);
  d->st.seqs_per_epoch = d->st.tokens_train / d->S;
  d->st.seqs_val = d->st.tokens_val >= 2 ? (d->st.tokens_val - 1 + d->S - 1) / d->S : 0;
  return 0;
}

int ll_data_open(struct ll_data **out, const struct ll_data_params *p, const struct ll_tokenizer *tok, char *err,
                 size_t errlen) {
  *out = NULL;
  if (!p || !p->path || !p->path[0]) return ll_errf(err, errlen, LL_EINVAL, "data: no data path given");
  if (!tok) return ll_errf(err, errlen, LL_EINVAL, "data: the model has no tokenizer, and training data needs one");
  if (p->seq_len < 2 || p->seq_len > LL_DATA_MAX_SEQ)
    return ll_errf(err, errlen, LL_EINVAL, "data: seq_len %d is out of range (2 to %d)", p->seq_len, LL_DATA_MAX_SEQ);
  if (!(p->val_fraction >= 0 && p->val_fraction < 1))
    return ll_errf(err, errlen, LL_EINVAL, "data: val_fraction %g is out of range [0, 1)", p->val_fraction);
  int64_t max_bytes = p->max_file_bytes > 0 ? p->max_file_bytes : 4 << 20;
  int64_t doc_bytes = p->doc_bytes > 0 ? p->doc_bytes : 4 << 10;
  if (doc_bytes < 64 || doc_bytes > (64 << 20))
    return ll_errf(err, errlen, LL_EINVAL, "data: doc_bytes %lld is out of range (64 B to 64 MiB)", (long long)doc_bytes);
  struct ll_data *d = calloc(1, sizeof *d);
  if (!d) return ll_errf(err, errlen, LL_ENOMEM, "data: out of memory");
  d->tr.rf.fd = d->va.rf.fd = -1;
  d->va.val = 1;
  d->tok = tok;
  d->S = p->seq_len;
  d->seed = p->seed;
  d->doc_bytes = doc_bytes;
  d->pieces = p->shuffle_pieces != 0;
  d->rflags = p->train_on_thinking ? LL_DATA_TRAIN_ON_THINKING : 0;
  d->thr = p->val_fraction > 0 ? (uint64_t)(p->val_fraction * 18446744073709551616.0) : 0;
  d->bos = ll_tokenizer_bos(tok);
  d->eos = ll_tokenizer_eos(tok);
  d->pad = d->eos >= 0 ? d->eos : 0;
  d->add_bos = ll_tokenizer_add_bos(tok);
  const char *tmpl = p->chat_template ? p->chat_template : ll_tokenizer_chat_template(tok);
  d->path = strdup(p->path);
  d->tmpl = tmpl ? strdup(tmpl) : NULL;
  d->win = malloc(((size_t)d->S + 1) * sizeof *d->win);
  d->winl = malloc((size_t)d->S + 1);
  int rc = 0;
  if (!d->path || (tmpl && !d->tmpl) || !d->win || !d->winl) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "data: out of memory");
    goto fail;
  }
  if ((rc = ll_data_list_files(p->path, max_bytes, &d->fl, err, errlen))) goto fail;
  if (d->fl.n == 0) {
    char sk[512];
    skipped_summary(&d->fl, sk, sizeof sk);
    rc = ll_errf(err, errlen, LL_ENOTFOUND, "data: no usable files under '%s'%s%s%s", p->path,
                 sk[0] ? " (skipped: " : "", sk, sk[0] ? ")" : "");
    goto fail;
  }
  d->df = calloc(d->fl.n, sizeof *d->df);
  if (!d->df) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "data: out of memory for %zu files", d->fl.n);
    goto fail;
  }
  uint64_t fp = mix64(0x11D47AULL ^ (uint64_t)d->fl.n);
  for (size_t i = 0; i < d->fl.n; i++) {
    d->df[i].phash = fnv1a(d->fl.v[i].rel);
    fp = mix64(fp ^ d->df[i].phash);
  }
  if ((rc = scan(d, err, errlen))) goto fail;
  d->tr.order = malloc(d->n_units * sizeof *d->tr.order);
  if (!d->tr.order) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "data: out of memory for %zu units", d->n_units);
    goto fail;
  }
  enter_unit(d, &d->tr, 0); // the first token of epoch 0
  ll_data_val_reset(d);
  fp = mix64(fp ^ (uint64_t)d->n_units);
  fp = mix64(fp ^ (uint64_t)d->S);
  fp = mix64(fp ^ d->seed);
  fp = mix64(fp ^ d->thr);
  fp = mix64(fp ^ (uint64_t)d->doc_bytes);
  fp = mix64(fp ^ (uint64_t)d->pieces);
  fp = mix64(fp ^ (uint64_t)(uint32_t)ll_tokenizer_n_vocab(tok) ^ (uint64_t)(uint32_t)d->bos << 32);
  fp = mix64(fp ^ (uint64_t)(uint32_t)d->eos ^ (uint64_t)d->add_bos << 32);
  d->fingerprint = fp;
  memcpy(d->st.skipped, d->fl.skipped, sizeof d->st.skipped);
  memcpy(d->st.skipped_example, d->fl.example, sizeof d->st.skipped_example);
  *out = d;
  return 0;
fail:
  ll_data_close(d);
  return rc;
}

// ---------------------------------------------------------------- describe

static void human(char *b, size_t cap, int64_t n) {
  if (n >= (1 << 20)) snprintf(b, cap, "%.1f MiB", (double)n / (1 << 20));
  else if (n >= 1024) snprintf(b, cap, "%.1f KiB", (double)n / 1024);
  else snprintf(b, cap, "%lld B", (long long)n);
}

int ll_data_describe(const struct ll_data *d, char *buf, size_t cap) {
  const struct ll_data_stats *s = &d->st;
  char sz[32], sk[600];
  human(sz, sizeof sz, s->bytes);
  skipped_summary(&d->fl, sk, sizeof sk);
  int64_t nsk = 0;
  for (int r = 0; r < LL_DATA_SKIP_N; r++) nsk += s->skipped[r];
  return snprintf(buf, cap,
                  "data: %s (%s%s%s): %lld file%s, %s; %lld skipped%s%s\n"
                  "data: %lld documents (%lld training, %lld validation), %lld tokens: %lld training (%lld counted in "
                  "the loss), %lld validation\n"
                  "data: %lld training sequences of %d tokens per epoch, %lld validation sequences\n",
                  d->path, !d->fl.is_dir ? "file" : d->fl.git ? "git tracked files" : "directory, .gitignore applied",
                  d->fl.note[0] ? ": " : "", d->fl.note, (long long)s->files, s->files == 1 ? "" : "s", sz,
                  (long long)nsk, nsk ? ": " : "", sk, (long long)(s->docs_train + s->docs_val),
                  (long long)s->docs_train, (long long)s->docs_val, (long long)(s->tokens_train + s->tokens_val),
                  (long long)s->tokens_train, (long long)s->loss_tokens_train, (long long)s->tokens_val,
                  (long long)s->seqs_per_epoch, d->S, (long long)s->seqs_val);
}
