// ll_proto.h - the TCP line protocol's grammar (man/llsrv-protocol.7), separate from the
// network so it can be tested and fuzzed on (buf, len).
//
// A request line:  VERB [key=value]... [ :text]
//   VERB     letters, case-insensitive (stored upper-case), at most LL_PROTO_MAX_VERB bytes
//   value    no spaces; the escapes \n \t \r \\ \xHH are decoded (so `stop=\n` works)
//   text     everything after the first " :" (or a leading ":") to the end of the line, escapes decoded
// A response line:  KIND id [key=value]... [ :text]   (text escaped with ll_proto_escape)
#ifndef LL_PROTO_H
#define LL_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define LL_PROTO_MAX_VERB 15
#define LL_PROTO_MAX_PARAMS 32
#define LL_PROTO_MAX_ID 64 // bytes of a request id (printable, no spaces)

struct ll_proto_param {
  const char *key; // NUL-terminated, points into the parsed line
  const char *val; // NUL-terminated, unescaped; may contain NULs: use val_len
  size_t val_len;
};

struct ll_proto_req {
  char verb[LL_PROTO_MAX_VERB + 1];
  const char *id; // value of id= (NULL if absent); validated: 1..64 printable non-space bytes
  int n_params;   // id= is included
  struct ll_proto_param params[LL_PROTO_MAX_PARAMS];
  int has_text;
  const char *text; // unescaped, NUL-terminated (may contain NULs: use text_len)
  size_t text_len;
};

// Parses one line (without its '\n'; a trailing '\r' is ignored) IN PLACE: the buffer is
// modified and req points into it; line[len] must be writable (the '\n' or one spare byte). Returns 0, or LL_EFORMAT with *code set to the wire error
// code ("bad_request", "bad_escape", "bad_param") and a message in err.
int ll_proto_parse(char *line, size_t len, struct ll_proto_req *req, const char **code, char *err, size_t errlen);

// Decode escapes of s[0..n) into out (out may equal s: decoding never grows). Returns the
// decoded length or LL_EFORMAT (message names the offending escape and its offset).
int64_t ll_proto_unescape(const char *s, size_t n, char *out, char *err, size_t errlen);

// Escape arbitrary bytes for a response's text or value: '\\' '\n' '\r' '\t' become \\ \n \r \t,
// other control bytes, DEL, ' ' (only when for_value) and bytes that are not part of valid
// UTF-8 become \xHH, so every response line is valid UTF-8 without raw control bytes, and
// unescaping gives back exactly the input. Writes at most cap bytes; returns the length the
// full escape needs (like snprintf) - call with cap >= 4*n to never truncate.
size_t ll_proto_escape(const char *s, size_t n, int for_value, char *out, size_t cap);

// Parameters.
const struct ll_proto_param *ll_proto_find(const struct ll_proto_req *req, const char *key);
// Strict numbers: whole value, no overflow, in [min, max]. LL_EINVAL with a message naming key.
int ll_proto_int(const struct ll_proto_param *p, int64_t min, int64_t max, int64_t *out, char *err, size_t errlen);
int ll_proto_float(const struct ll_proto_param *p, double min, double max, double *out, char *err, size_t errlen);
int ll_proto_bool(const struct ll_proto_param *p, int *out, char *err, size_t errlen);
// Adapter names: 1..LL_ADAPTER_NAME_MAX bytes of letters, digits, '.', '_', '-' and ':' (':'
// for fine-tuned models, ft:BASE:SUFFIX:ID). The one rule both protocols and the scheduler use.
#define LL_ADAPTER_NAME_MAX 127
// 0 when s[0..n) is such a name, else the offending byte's index + 1 (n + 1: wrong length).
size_t ll_adapter_name_check(const char *s, size_t n);
// A name (adapter=NAME), copied NUL-terminated into out (cap > LL_ADAPTER_NAME_MAX).
int ll_proto_name(const struct ll_proto_param *p, char *out, size_t cap, char *err, size_t errlen);

// The response line (with its '\n') of one scheduler event: TOK, PROB, END, ERR, IDS or TEXT.
// Writes at most cap bytes and returns the length the whole line needs (like snprintf; no
// NUL), 0 for events that have no line (monitor events, a PROB without top candidates).
struct ll_sched_ev;
size_t ll_proto_encode_event(const struct ll_sched_ev *ev, char *out, size_t cap);

// Length of the longest prefix of s[0..n) that does not end inside an incomplete UTF-8
// sequence (bytes that can never complete are not held back).
size_t ll_utf8_complete_prefix(const char *s, size_t n);

#endif
