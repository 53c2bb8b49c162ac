// proto.c - parse request lines, escape response text and encode the scheduler's events as
// response lines (grammar in ll_proto.h and man/llsrv-protocol.7). Pure functions on
// (buf, len): no allocation, fuzzed by fuzz_proto.
#include "ll_proto.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"
#include "ll_sched.h"

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int64_t ll_proto_unescape(const char *s, size_t n, char *out, char *err, size_t errlen) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c != '\\') {
      out[o++] = c;
      continue;
    }
    if (i + 1 >= n) return ll_errf(err, errlen, LL_EFORMAT, "invalid escape: lone '\\' at the end (offset %zu)", i);
    char e = s[++i];
    switch (e) {
    case 'n': out[o++] = '\n'; break;
    case 't': out[o++] = '\t'; break;
    case 'r': out[o++] = '\r'; break;
    case '\\': out[o++] = '\\'; break;
    case 'x': {
      int h = i + 2 < n ? hexval((unsigned char)s[i + 1]) : -1, l = i + 2 < n ? hexval((unsigned char)s[i + 2]) : -1;
      if (h < 0 || l < 0) return ll_errf(err, errlen, LL_EFORMAT, "invalid escape: '\\x' needs two hex digits (offset %zu)", i - 1);
      out[o++] = (char)(h * 16 + l);
      i += 2;
      break;
    }
    default:
      if ((unsigned char)e >= 0x21 && (unsigned char)e < 0x7f)
        return ll_errf(err, errlen, LL_EFORMAT, "invalid escape '\\%c' at offset %zu (use \\n \\t \\r \\\\ \\xHH)", e, i - 1);
      return ll_errf(err, errlen, LL_EFORMAT, "invalid escape '\\\\x%02X' at offset %zu (use \\n \\t \\r \\\\ \\xHH)", (unsigned char)e, i - 1);
    }
  }
  return (int64_t)o;
}

// Length of the valid UTF-8 sequence at s[0..n), 0 if invalid, -1 if valid so far but cut short.
static int utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  int len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c == 0xED) len = 3, hi = 0x9F; // no surrogates
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else return 0;
  for (int k = 1; k < len; k++) {
    if ((size_t)k >= n) return -1;
    unsigned b = s[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return len;
}

size_t ll_utf8_complete_prefix(const char *s, size_t n) {
  // Only the last 3 bytes can start an incomplete sequence.
  size_t start = n > 3 ? n - 3 : 0;
  for (size_t i = start; i < n; i++) {
    unsigned c = (unsigned char)s[i];
    if (c < 0xC0) continue;
    if (utf8_seq((const unsigned char *)s + i, n - i) == -1) return i;
  }
  return n;
}

size_t ll_proto_escape(const char *s, size_t n, int for_value, char *out, size_t cap) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
#define PUT(ch) do { if (o < cap) out[o] = (ch); o++; } while (0)
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\\') { PUT('\\'); PUT('\\'); i++; continue; }
    if (c == '\n') { PUT('\\'); PUT('n'); i++; continue; }
    if (c == '\r') { PUT('\\'); PUT('r'); i++; continue; }
    if (c == '\t') { PUT('\\'); PUT('t'); i++; continue; }
    if (c < 0x20 || c == 0x7f || (for_value && c == ' ')) {
      PUT('\\'); PUT('x'); PUT(hex[c >> 4]); PUT(hex[c & 15]);
      i++;
      continue;
    }
    int len = utf8_seq((const unsigned char *)s + i, n - i);
    if (len <= 0) { // invalid or truncated: escape this byte, resync at the next
      PUT('\\'); PUT('x'); PUT(hex[c >> 4]); PUT(hex[c & 15]);
      i++;
      continue;
    }
    for (int k = 0; k < len; k++) PUT(s[i + k]);
    i += (size_t)len;
  }
#undef PUT
  return o;
}

static int is_space(char c) { return c == ' '; }

int ll_proto_parse(char *line, size_t len, struct ll_proto_req *req, const char **code, char *err, size_t errlen) {
  memset(req, 0, sizeof *req);
  *code = "bad_request";
  if (len > 0 && line[len - 1] == '\r') len--;
  size_t i = 0;
  while (i < len && is_space(line[i])) i++;
  size_t v0 = i;
  while (i < len && !is_space(line[i])) {
    unsigned char c = (unsigned char)line[i];
    if (!isalpha(c) && c != '_') {
      if (c < 0x20 || c >= 0x7f)
        return ll_errf(err, errlen, LL_EFORMAT, "bad request: byte 0x%02X in the command name (offset %zu)", c, i);
      return ll_errf(err, errlen, LL_EFORMAT, "bad request: '%c' in the command name (offset %zu)", c, i);
    }
    if (i - v0 >= LL_PROTO_MAX_VERB) return ll_errf(err, errlen, LL_EFORMAT, "bad request: command name longer than %d bytes", LL_PROTO_MAX_VERB);
    req->verb[i - v0] = (char)toupper(c);
    i++;
  }
  if (i == v0) return ll_errf(err, errlen, LL_EFORMAT, "bad request: empty line (expected VERB [key=value]... [ :text])");
  req->verb[i - v0] = 0;
  for (;;) {
    while (i < len && is_space(line[i])) i++;
    if (i >= len) break;
    if (line[i] == ':') { // the text runs to the end of the line
      int64_t n = ll_proto_unescape(line + i + 1, len - i - 1, line + i + 1, err, errlen);
      if (n < 0) {
        *code = "bad_escape";
        return LL_EFORMAT;
      }
      line[i + 1 + n] = 0; // the unescaped text never grows, and len < buffer size or at the '\n'
      req->has_text = 1;
      req->text = line + i + 1;
      req->text_len = (size_t)n;
      break;
    }
    size_t k0 = i;
    while (i < len && !is_space(line[i]) && line[i] != '=') i++;
    if (i >= len || line[i] != '=') {
      *code = "bad_param";
      return ll_errf(err, errlen, LL_EFORMAT, "bad parameter at offset %zu: expected key=value (text goes after ' :')", k0);
    }
    size_t klen = i - k0;
    if (klen == 0 || klen > 32) {
      *code = "bad_param";
      return ll_errf(err, errlen, LL_EFORMAT, "bad parameter at offset %zu: key must be 1..32 bytes", k0);
    }
    for (size_t k = k0; k < k0 + klen; k++) {
      unsigned char c = (unsigned char)line[k];
      if (!isalnum(c) && c != '_' && c != '-') {
        *code = "bad_param";
        return ll_errf(err, errlen, LL_EFORMAT, "bad parameter at offset %zu: keys are letters, digits, '_' and '-'", k);
      }
      line[k] = (char)tolower(c);
    }
    size_t val0 = ++i;
    while (i < len && !is_space(line[i])) i++;
    if (req->n_params >= LL_PROTO_MAX_PARAMS) {
      *code = "bad_param";
      return ll_errf(err, errlen, LL_EFORMAT, "bad request: more than %d parameters", LL_PROTO_MAX_PARAMS);
    }
    char ebuf[160];
    int64_t vn = ll_proto_unescape(line + val0, i - val0, line + val0, ebuf, sizeof ebuf);
    line[k0 + klen] = 0; // the '='
    if (vn < 0) {
      *code = "bad_escape";
      return ll_errf(err, errlen, LL_EFORMAT, "parameter '%s': %s", line + k0, ebuf);
    }
    // The value is NUL-terminated at its end (the space or end of line that follows it:
    // unescaping only shrinks, so val0 + vn < i <= len).
    int at_end = i >= len;
    line[val0 + vn] = 0;
    struct ll_proto_param *p = &req->params[req->n_params++];
    p->key = line + k0;
    p->val = line + val0;
    p->val_len = (size_t)vn;
    if (!at_end) i++; // past the space we may have overwritten
    if (strcmp(p->key, "id") == 0) {
      if (req->id) {
        *code = "bad_param";
        return ll_errf(err, errlen, LL_EFORMAT, "bad request: id= given twice");
      }
      if (vn < 1 || vn > LL_PROTO_MAX_ID) {
        *code = "bad_param";
        return ll_errf(err, errlen, LL_EFORMAT, "bad id: must be 1..%d bytes", LL_PROTO_MAX_ID);
      }
      for (int64_t k = 0; k < vn; k++) {
        unsigned char c = (unsigned char)p->val[k];
        if (c <= 0x20 || c >= 0x7f || c == '\\') {
          *code = "bad_param";
          return ll_errf(err, errlen, LL_EFORMAT, "bad id: printable ASCII without spaces or '\\' only");
        }
      }
      if (strcmp(p->val, "-") == 0) {
        *code = "bad_param";
        return ll_errf(err, errlen, LL_EFORMAT, "bad id: '-' is reserved for errors without an id");
      }
      req->id = p->val;
    }
  }
  return 0;
}

const struct ll_proto_param *ll_proto_find(const struct ll_proto_req *req, const char *key) {
  for (int i = 0; i < req->n_params; i++)
    if (strcmp(req->params[i].key, key) == 0) return &req->params[i];
  return NULL;
}

int ll_proto_int(const struct ll_proto_param *p, int64_t min, int64_t max, int64_t *out, char *err, size_t errlen) {
  if (p->val_len == 0 || p->val_len > 24 || strlen(p->val) != p->val_len)
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': expected an integer", p->key);
  errno = 0;
  char *end;
  long long v = strtoll(p->val, &end, 10);
  if (*end || errno == ERANGE || (!isdigit((unsigned char)p->val[0]) && p->val[0] != '-'))
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': '%s' is not an integer", p->key, p->val);
  if (v < min || v > max)
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': %lld out of range %lld..%lld", p->key, v, (long long)min, (long long)max);
  *out = v;
  return 0;
}

int ll_proto_float(const struct ll_proto_param *p, double min, double max, double *out, char *err, size_t errlen) {
  if (p->val_len == 0 || p->val_len > 32 || strlen(p->val) != p->val_len)
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': expected a number", p->key);
  unsigned char c0 = (unsigned char)p->val[0];
  errno = 0;
  char *end;
  double v = strtod(p->val, &end);
  if (*end || errno == ERANGE || !isfinite(v) || !(isdigit(c0) || c0 == '-' || c0 == '.' || c0 == '+') ||
      strpbrk(p->val, "xXnN")) // no hex floats, nan, inf
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': '%s' is not a number", p->key, p->val);
  if (v < min || v > max) return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': %g out of range %g..%g", p->key, v, min, max);
  *out = v;
  return 0;
}

int ll_proto_bool(const struct ll_proto_param *p, int *out, char *err, size_t errlen) {
  static const char *t[] = {"1", "true", "yes", "on"}, *f[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcmp(p->val, t[i]) == 0) return *out = 1, 0;
    if (strcmp(p->val, f[i]) == 0) return *out = 0, 0;
  }
  return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': expected 0 or 1", p->key);
}

size_t ll_adapter_name_check(const char *s, size_t n) {
  if (n == 0 || n > LL_ADAPTER_NAME_MAX) return n + 1;
  for (size_t i = 0; i < n; i++) {
    const unsigned char ch = (unsigned char)s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-' || ch == ':'))
      return i + 1;
  }
  return 0;
}

int ll_proto_name(const struct ll_proto_param *p, char *out, size_t cap, char *err, size_t errlen) {
  size_t n = p->val_len, bad = ll_adapter_name_check(p->val, n);
  if (bad == n + 1 || n >= cap)
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': a name of 1..%d bytes of letters, digits, '.', '_', '-', ':'", p->key,
                   LL_ADAPTER_NAME_MAX);
  if (bad)
    return ll_errf(err, errlen, LL_EINVAL, "parameter '%s': byte %zu (0x%02x) is not a letter, digit, '.', '_', '-' or ':'", p->key, bad - 1,
                   (unsigned char)p->val[bad - 1]);
  memcpy(out, p->val, n);
  out[n] = 0;
  return 0;
}

// ---- encoding the scheduler's events as response lines ----

struct lineout {
  char *out;
  size_t cap, n; // n counts every byte the full line needs, written or not
};

static void lo_put(struct lineout *o, const char *p, size_t n) {
  if (o->n < o->cap) memcpy(o->out + o->n, p, o->n + n <= o->cap ? n : o->cap - o->n);
  o->n += n;
}

static void lo_printf(struct lineout *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lo_printf(struct lineout *o, const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (k > 0) lo_put(o, buf, (size_t)k < sizeof buf ? (size_t)k : sizeof buf - 1);
}

static void lo_esc(struct lineout *o, const char *p, size_t n) {
  size_t room = o->n < o->cap ? o->cap - o->n : 0;
  o->n += ll_proto_escape(p, n, 0, room ? o->out + o->n : NULL, room);
}

size_t ll_proto_encode_event(const struct ll_sched_ev *ev, char *out, size_t cap) {
  struct lineout o = {out, cap, 0};
  switch (ev->type) {
  case LL_EV_TOKEN:
    lo_printf(&o, "TOK %s :", ev->id);
    lo_esc(&o, ev->data, ev->len);
    break;
  case LL_EV_PROB:
    if (ev->n_top <= 0) return 0; // the sampled token's logprob alone is HTTP's (want_logprob)
    lo_printf(&o, "PROB %s token=%d top=", ev->id, ev->token);
    for (int i = 0; i < ev->n_top && i < 20; i++) lo_printf(&o, "%s%d:%.4f", i ? "," : "", ev->top[i].id, ev->top[i].logprob);
    break;
  case LL_EV_END:
    lo_printf(&o, "END %s reason=%s prompt_tokens=%d tokens=%d prefill_ms=%.1f decode_ms=%.1f", ev->id, ev->reason ? ev->reason : "error",
              ev->prompt_tokens, ev->tokens, ev->prefill_ms, ev->decode_ms);
    if (ev->reason && !strcmp(ev->reason, "error")) { // the message, cut to 597 escaped bytes as always
      char m[600];
      size_t k = ll_proto_escape(ev->data, ev->len, 0, m + 2, sizeof m - 3);
      if (k > sizeof m - 3) k = sizeof m - 3;
      m[0] = ' ', m[1] = ':';
      lo_put(&o, m, k + 2);
    }
    break;
  case LL_EV_ERROR:
    lo_printf(&o, "ERR %s %s :", ev->id, ev->code ? ev->code : "internal");
    lo_esc(&o, ev->data, ev->len);
    break;
  case LL_EV_IDS: {
    lo_printf(&o, "IDS %s n=%d :", ev->id, ev->n_ids);
    const int32_t *ids = (const int32_t *)(const void *)ev->data;
    for (int i = 0; i < ev->n_ids; i++) lo_printf(&o, i ? " %d" : "%d", ids[i]);
    break;
  }
  case LL_EV_TEXT:
    lo_printf(&o, "TEXT %s :", ev->id);
    lo_esc(&o, ev->data, ev->len);
    break;
  case LL_EV_MONITOR:
    return 0;
  }
  lo_put(&o, "\n", 1);
  return o.n;
}
