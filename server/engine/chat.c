// chat.c - chat templates: recognise the model's Jinja template by its markers and render the
// known format (the same approach and output as llama.cpp's llm_chat_apply_template).
#include "ll_chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"

const char *ll_chat_detect(const char *t) {
  if (!t) return NULL;
  if (strstr(t, "<|im_start|>") && strstr(t, "enable_thinking")) return "qwen3"; // chatml with Qwen3's thinking rules
  if (strstr(t, "<|im_start|>")) return "chatml";
  if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) return "llama3";
  if (strstr(t, "<start_of_turn>")) return "gemma";
  if (strstr(t, "<|assistant|>") && strstr(t, "<|end|>")) return "phi3";
  if (strstr(t, "<|user|>")) return "zephyr";
  if (strstr(t, "[INST]")) return "llama2";
  return NULL;
}

// The rendered text and, beside it, the spans of the template's own markup (merged where they
// touch): the only places where control-token texts become tokens (ll_tokenize_marked).
struct sb {
  char *p;
  size_t n, cap;
  struct ll_tok_span *m;
  int nm, mcap;
  int oom;
};

static void sb_put(struct sb *b, const char *s, size_t k, int markup) {
  if (b->oom) return;
  if (b->n + k + 1 > b->cap) {
    size_t nc = (b->n + k + 1) * 2;
    char *q = realloc(b->p, nc);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q, b->cap = nc;
  }
  memcpy(b->p + b->n, s, k);
  b->p[b->n + k] = 0;
  if (markup && k) {
    if (b->nm && b->m[b->nm - 1].end == b->n) {
      b->m[b->nm - 1].end += k;
    } else {
      if (b->nm == b->mcap) {
        int nc = b->mcap ? b->mcap * 2 : 16;
        struct ll_tok_span *q = realloc(b->m, (size_t)nc * sizeof *q);
        if (!q) {
          b->oom = 1;
          return;
        }
        b->m = q, b->mcap = nc;
      }
      b->m[b->nm++] = (struct ll_tok_span){b->n, b->n + k};
    }
  }
  b->n += k;
}

static void mark(struct sb *b, const char *s) { sb_put(b, s, strlen(s), 1); } // the template's text
static void text(struct sb *b, const char *s) { sb_put(b, s, strlen(s), 0); } // a message's content

static const char *const chat_names[] = {"chatml", "llama2", "llama3", "zephyr", "gemma", "phi3", "qwen3"};
#define CHAT_NAMES "chatml, llama2, llama3, zephyr, gemma, phi3, qwen3"

const char *ll_chat_builtin(const char *name) {
  for (size_t i = 0; name && i < sizeof chat_names / sizeof chat_names[0]; i++)
    if (!strcmp(name, chat_names[i])) return chat_names[i];
  return NULL;
}

static void textn(struct sb *b, const char *s, size_t k) { sb_put(b, s, k, 0); }

static const char *find_last(const char *s, size_t n, const char *pat) {
  size_t k = strlen(pat);
  const char *last = NULL;
  for (size_t i = 0; i + k <= n; i++)
    if (!memcmp(s + i, pat, k)) last = s + i;
  return last;
}

// A user turn that is a tool's answer (Qwen3's template does not count it as a query).
static int is_tool_response(const char *c) {
  static const char open[] = "<tool_response>", close[] = "</tool_response>";
  size_t n = strlen(c);
  return !strncmp(c, open, sizeof open - 1) && n >= sizeof close - 1 && !strcmp(c + n - (sizeof close - 1), close);
}

// Qwen3's template (Qwen/Qwen3-*'s chat_template, llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja;
// tools aside): chatml, where an assistant turn's "<think>...</think>" reasoning is dropped up to
// the last user query and kept, normalised, after it (a turn after it without reasoning gets an
// empty block when it is the last); enable_thinking off pre-fills an empty block in the prompt.
// Each .split/.strip below is the template's, in its order (tests/ref/qwen3_chat.json).
static void render_qwen3(struct sb *b, const struct ll_chat_msg *m, int n, int enable_thinking) {
  int last_query = n - 1;
  for (int i = n - 1; i >= 0; i--)
    if (!strcmp(m[i].role, "user") && !is_tool_response(m[i].content)) {
      last_query = i;
      break;
    }
  for (int i = 0; i < n; i++) {
    if (strcmp(m[i].role, "assistant")) {
      mark(b, "<|im_start|>"), mark(b, m[i].role), mark(b, "\n"), text(b, m[i].content), mark(b, "<|im_end|>\n");
      continue;
    }
    const char *c = m[i].content, *r = "";
    size_t cl = strlen(c), rl = 0;
    const char *close = strstr(c, "</think>");
    if (m[i].reasoning && *m[i].reasoning) { // reasoning_content given: the content is the answer as it is
      r = m[i].reasoning, rl = strlen(r);
    } else if (close) {
      const char *re = close, *rs = c, *last = find_last(c, cl, "</think>"), *open;
      while (re > c && re[-1] == '\n') re--;                                   // split('</think>')[0].rstrip('\n')
      if ((open = find_last(c, (size_t)(re - c), "<think>"))) rs = open + 7; // .split('<think>')[-1]
      while (rs < re && *rs == '\n') rs++;                                     // .lstrip('\n')
      r = rs, rl = (size_t)(re - rs);
      c = last + 8;                                                            // split('</think>')[-1]
      while (*c == '\n') c++;                                                  // .lstrip('\n')
      cl = strlen(c);
    }
    mark(b, "<|im_start|>assistant\n");
    if (i > last_query && (i == n - 1 || rl)) {
      while (rl && *r == '\n') r++, rl--; // reasoning_content.strip('\n')
      while (rl && r[rl - 1] == '\n') rl--;
      while (*c == '\n') c++, cl--;       // content.lstrip('\n')
      mark(b, "<think>\n"), textn(b, r, rl), mark(b, "\n</think>\n\n");
    }
    textn(b, c, cl), mark(b, "<|im_end|>\n");
  }
  mark(b, "<|im_start|>assistant\n");
  if (!enable_thinking) mark(b, "<think>\n\n</think>\n\n");
}

int ll_chat_render_marked(const char *tmpl, const struct ll_chat_msg *m, int n, char **out, struct ll_tok_span **marks,
                          int *n_marks, char *err, size_t errlen) {
  return ll_chat_render_opts(tmpl, m, n, NULL, out, marks, n_marks, err, errlen);
}

int ll_chat_render_opts(const char *tmpl, const struct ll_chat_msg *m, int n, const struct ll_chat_opts *o, char **out,
                        struct ll_tok_span **marks, int *n_marks, char *err, size_t errlen) {
  const char *fmt = ll_chat_builtin(tmpl);
  if (!fmt) fmt = ll_chat_detect(tmpl);
  *out = NULL;
  if (marks) *marks = NULL, *n_marks = 0;
  if (!fmt)
    return ll_errf(err, errlen, LL_EUNSUPPORTED,
                   tmpl ? "chat: the model's chat template is not one of " CHAT_NAMES " (set one with chat_template)"
                        : "chat: the model has no chat template (set one with chat_template: " CHAT_NAMES ", or a template file; or use GEN with a prompt)");
  struct sb b = {0};
  sb_put(&b, "", 0, 0);
  if (!strcmp(fmt, "qwen3")) {
    render_qwen3(&b, m, n, o ? o->enable_thinking : 1);
  } else if (!strcmp(fmt, "chatml")) {
    for (int i = 0; i < n; i++) mark(&b, "<|im_start|>"), mark(&b, m[i].role), mark(&b, "\n"), text(&b, m[i].content), mark(&b, "<|im_end|>\n");
    mark(&b, "<|im_start|>assistant\n");
  } else if (!strcmp(fmt, "llama3")) {
    for (int i = 0; i < n; i++)
      mark(&b, "<|start_header_id|>"), mark(&b, m[i].role), mark(&b, "<|end_header_id|>\n\n"), text(&b, m[i].content), mark(&b, "<|eot_id|>");
    mark(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  } else if (!strcmp(fmt, "gemma")) {
    const char *sys = NULL;
    for (int i = 0; i < n; i++) {
      if (!strcmp(m[i].role, "system")) { sys = m[i].content; continue; } // merged into the next user turn
      mark(&b, "<start_of_turn>"), mark(&b, !strcmp(m[i].role, "assistant") ? "model" : m[i].role), mark(&b, "\n");
      if (sys) text(&b, sys), mark(&b, "\n\n");
      text(&b, m[i].content), mark(&b, "<end_of_turn>\n");
      sys = NULL;
    }
    mark(&b, "<start_of_turn>model\n");
  } else if (!strcmp(fmt, "phi3") || !strcmp(fmt, "zephyr")) {
    const char *end = !strcmp(fmt, "phi3") ? "<|end|>\n" : "</s>\n";
    for (int i = 0; i < n; i++) mark(&b, "<|"), mark(&b, m[i].role), mark(&b, "|>\n"), text(&b, m[i].content), mark(&b, end);
    mark(&b, "<|assistant|>\n");
  } else { // llama2: [INST] <<SYS>> ... [/INST]
    int open = 0;
    for (int i = 0; i < n; i++) {
      if (!strcmp(m[i].role, "system")) {
        mark(&b, "[INST] <<SYS>>\n"), text(&b, m[i].content), mark(&b, "\n<</SYS>>\n\n");
        open = 1;
      } else if (!strcmp(m[i].role, "user")) {
        if (!open) mark(&b, "[INST] ");
        text(&b, m[i].content), mark(&b, " [/INST]");
        open = 0;
      } else {
        mark(&b, " "), text(&b, m[i].content), mark(&b, "</s>");
      }
    }
  }
  if (b.oom) {
    free(b.p);
    free(b.m);
    return ll_errf(err, errlen, LL_ENOMEM, "chat: out of memory");
  }
  *out = b.p;
  if (marks) *marks = b.m, *n_marks = b.nm;
  else free(b.m);
  return 0;
}

int ll_chat_template_load(const char *spec, char **out, char *err, size_t errlen) {
  *out = NULL;
  const char *name = ll_chat_builtin(spec);
  if (name) {
    if (!(*out = strdup(name))) return ll_errf(err, errlen, LL_ENOMEM, "chat_template: out of memory");
    return 0;
  }
  if (!spec || !*spec) return ll_errf(err, errlen, LL_EINVAL, "chat_template: empty (one of " CHAT_NAMES ", or a template file)");
  FILE *f = fopen(spec, "rb");
  if (!f)
    return ll_errf(err, errlen, LL_EINVAL, "chat_template '%.200s' is neither a built-in template (" CHAT_NAMES ") nor a readable file (%s)",
                   spec, strerror(errno));
  enum { CAP = 1 << 20 }; // a template is a few KiB; a bigger file is not one
  char *t = malloc(CAP + 1);
  size_t n = t ? fread(t, 1, CAP + 1, f) : 0;
  int bad = ferror(f);
  fclose(f);
  if (!t) return ll_errf(err, errlen, LL_ENOMEM, "chat_template: out of memory");
  if (bad || n > CAP || memchr(t, 0, n)) {
    free(t);
    return ll_errf(err, errlen, LL_EINVAL, "chat_template file '%.200s': %s", spec, bad ? "read error" : "not a template (over 1 MiB or binary)");
  }
  t[n] = 0;
  if (!ll_chat_detect(t)) {
    free(t);
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "chat_template file '%.200s' is not of a known format (" CHAT_NAMES ")", spec);
  }
  *out = t;
  return 0;
}

int ll_chat_render(const char *tmpl, const struct ll_chat_msg *m, int n, char **out, char *err, size_t errlen) {
  return ll_chat_render_marked(tmpl, m, n, out, NULL, NULL, err, errlen);
}

int ll_chat_parse(const char *text, size_t len, struct ll_chat_msg **msgs, void **store, char *err, size_t errlen) {
  *msgs = NULL;
  *store = NULL;
  size_t i = 0;
  while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) i++;
  if (i >= len || (text[i] != '[' && text[i] != '{')) { // plain text: one user message
    struct ll_chat_msg *m = malloc(sizeof *m);
    char *c = malloc(len + 1);
    if (!m || !c) {
      free(m), free(c);
      return ll_errf(err, errlen, LL_ENOMEM, "chat: out of memory");
    }
    memcpy(c, text, len);
    c[len] = 0;
    m->role = "user";
    m->content = c;
    *msgs = m;
    *store = c;
    return 1;
  }
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) return ll_errf(err, errlen, LL_EFORMAT, "chat: invalid JSON at column %d: %s", je.column, je.text);
  json_t *arr = json_is_object(root) ? json_object_get(root, "messages") : root;
  if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > 1024) {
    json_decref(root);
    return ll_errf(err, errlen, LL_EFORMAT, "chat: expected a non-empty array of at most 1024 messages");
  }
  size_t n = json_array_size(arr);
  struct ll_chat_msg *m = calloc(n, sizeof *m);
  if (!m) {
    json_decref(root);
    return ll_errf(err, errlen, LL_ENOMEM, "chat: out of memory");
  }
  for (size_t k = 0; k < n; k++) {
    json_t *o = json_array_get(arr, k);
    const char *role = json_string_value(json_object_get(o, "role"));
    const char *content = json_string_value(json_object_get(o, "content"));
    if (!role || !content) {
      free(m);
      json_decref(root);
      return ll_errf(err, errlen, LL_EFORMAT, "chat: message %zu needs string fields \"role\" and \"content\"", k);
    }
    if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
      ll_errf(err, errlen, LL_EFORMAT, "chat: message %zu has role '%.32s' (system, user or assistant)", k, role);
      free(m);
      json_decref(root); // role points into the tree: message formatted first
      return LL_EFORMAT;
    }
    json_t *jr = json_object_get(o, "reasoning_content");
    if (jr && !json_is_null(jr) && (!json_is_string(jr) || strcmp(role, "assistant"))) {
      free(m);
      json_decref(root);
      return ll_errf(err, errlen, LL_EFORMAT, "chat: message %zu: \"reasoning_content\" is a string on an assistant message", k);
    }
    m[k].role = role;
    m[k].content = content;
    m[k].reasoning = json_string_value(jr);
  }
  *msgs = m;
  *store = root; // strings live in the JSON tree
  return (int)n;
}

void ll_chat_free_store(void *store, struct ll_chat_msg *msgs) {
  if (msgs && msgs[0].role && strcmp(msgs[0].role, "user") == 0 && msgs[0].content == store) {
    free(store); // plain-text form
  } else if (store) {
    json_decref((json_t *)store);
  }
  free(msgs);
}

// ---- reasoning / answer (ll_chat_reasoning_*)

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The states of a streamed split: before the output's first text; after "<think>" (its newline
// to drop); in the reasoning; after "</think>" (two newlines to drop, one); in the answer.
enum { R_START, R_THINK_NL, R_THINK, R_ANSWER_NL2, R_ANSWER_NL1, R_ANSWER };

static size_t tag_prefix_tail(const char *p, size_t n, const char *tag) { // the longest suffix of p that begins tag
  size_t k = strlen(tag) - 1;
  for (k = k < n ? k : n; k > 0; k--)
    if (!memcmp(p + n - k, tag, k)) return k;
  return 0;
}

int ll_chat_reasoning_split(const char *t, size_t n, size_t *rs, size_t *re, size_t *cs) {
  size_t i = 0;
  while (i < n && is_ws(t[i])) i++;
  *rs = *re = 0, *cs = i;
  if (n - i < 7) {
    if (!memcmp(t + i, "<think>", n - i)) *cs = n; // only the start of a tag: nothing yet
    return 0;
  }
  if (memcmp(t + i, "<think>", 7) != 0) return 0;
  size_t a = i + 7;
  if (a < n && t[a] == '\n') a++; // the newline after "<think>"
  const char *end = memmem(t + a, n - a, "</think>", 8);
  size_t b = end ? (size_t)(end - t) : n - tag_prefix_tail(t + a, n - a, "</think>"), c = end ? b + 8 : n;
  for (int k = 0; k < 2 && c < n && t[c] == '\n'; k++) c++; // "\n\n" after "</think>"
  *rs = a, *re = b, *cs = c;
  return 1;
}

int ll_chat_reasoning_feed(struct ll_chat_reasoning *r, const char *text, size_t n, int final, ll_chat_reasoning_emit emit, void *u) {
  if (n) {
    if (r->n + n > r->cap) {
      size_t nc = (r->n + n) * 2;
      char *q = realloc(r->hold, nc);
      if (!q) return LL_ENOMEM;
      r->hold = q, r->cap = nc;
    }
    memcpy(r->hold + r->n, text, n);
    r->n += n;
  }
  const char *p = r->hold;
  size_t len = r->n, i = 0;
  while (i < len) {
    if (r->state == R_START) { // leading whitespace is dropped either way
      while (i < len && is_ws(p[i])) i++;
      if (i == len) break;
      const size_t k = len - i < 7 ? len - i : 7;
      if (k < 7 && !memcmp(p + i, "<think>", k)) { // undecided; at the end, only a tag's start: dropped
        if (final) i = len;
        break;
      }
      if (k == 7 && !memcmp(p + i, "<think>", 7)) i += 7, r->state = R_THINK_NL;
      else r->state = R_ANSWER;
    } else if (r->state == R_THINK_NL) {
      if (p[i] == '\n') i++;
      r->state = R_THINK;
    } else if (r->state == R_THINK) {
      const char *e = memmem(p + i, len - i, "</think>", 8);
      const size_t upto = e ? (size_t)(e - p) : len - tag_prefix_tail(p + i, len - i, "</think>");
      if (upto > i) emit(u, 1, p + i, upto - i);
      if (!e) {
        i = final ? len : upto; // a tag's start waits (at the end: dropped)
        break;
      }
      i = upto + 8, r->state = R_ANSWER_NL2;
    } else if (r->state == R_ANSWER_NL2 || r->state == R_ANSWER_NL1) {
      if (p[i] == '\n') i++, r->state = r->state == R_ANSWER_NL2 ? R_ANSWER_NL1 : R_ANSWER;
      else r->state = R_ANSWER;
    } else {
      emit(u, 0, p + i, len - i);
      i = len;
    }
  }
  if (i < len) memmove(r->hold, p + i, len - i); // (hold is NULL before any text)
  r->n = len - i;
  return 0;
}

void ll_chat_reasoning_free(struct ll_chat_reasoning *r) {
  free(r->hold);
  *r = (struct ll_chat_reasoning){0};
}
