// chat.c - chat templates: recognise the model's Jinja template by its markers and render the
// known format (the same approach and output as llama.cpp's llm_chat_apply_template).
#include "ll_chat.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"

const char *ll_chat_detect(const char *t) {
  if (!t) return NULL;
  if (strstr(t, "<|im_start|>")) return "chatml";
  if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) return "llama3";
  if (strstr(t, "<start_of_turn>")) return "gemma";
  if (strstr(t, "<|assistant|>") && strstr(t, "<|end|>")) return "phi3";
  if (strstr(t, "<|user|>")) return "zephyr";
  if (strstr(t, "[INST]")) return "llama2";
  return NULL;
}

struct sb {
  char *p;
  size_t n, cap;
  int oom;
};

static void sb_add(struct sb *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int k = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (k < 0 || b->oom) {
    va_end(ap2);
    b->oom = 1;
    return;
  }
  if (b->n + (size_t)k + 1 > b->cap) {
    size_t nc = (b->n + (size_t)k + 1) * 2;
    char *q = realloc(b->p, nc);
    if (!q) {
      va_end(ap2);
      b->oom = 1;
      return;
    }
    b->p = q, b->cap = nc;
  }
  vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap2);
  va_end(ap2);
  b->n += (size_t)k;
}

int ll_chat_render(const char *tmpl, const struct ll_chat_msg *m, int n, char **out, char *err, size_t errlen) {
  const char *fmt = ll_chat_detect(tmpl);
  *out = NULL;
  if (!fmt)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, tmpl ? "chat: the model's chat template is not one of chatml, llama2, llama3, zephyr, gemma, phi3"
                                                      : "chat: the model has no chat template (use GEN with a prompt)");
  struct sb b = {0};
  sb_add(&b, "%s", "");
  if (!strcmp(fmt, "chatml")) {
    for (int i = 0; i < n; i++) sb_add(&b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
    sb_add(&b, "<|im_start|>assistant\n");
  } else if (!strcmp(fmt, "llama3")) {
    for (int i = 0; i < n; i++) sb_add(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", m[i].role, m[i].content);
    sb_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  } else if (!strcmp(fmt, "gemma")) {
    const char *sys = NULL;
    for (int i = 0; i < n; i++) {
      if (!strcmp(m[i].role, "system")) { sys = m[i].content; continue; } // merged into the next user turn
      const char *role = !strcmp(m[i].role, "assistant") ? "model" : m[i].role;
      sb_add(&b, "<start_of_turn>%s\n%s%s%s<end_of_turn>\n", role, sys ? sys : "", sys ? "\n\n" : "", m[i].content);
      sys = NULL;
    }
    sb_add(&b, "<start_of_turn>model\n");
  } else if (!strcmp(fmt, "phi3")) {
    for (int i = 0; i < n; i++) sb_add(&b, "<|%s|>\n%s<|end|>\n", m[i].role, m[i].content);
    sb_add(&b, "<|assistant|>\n");
  } else if (!strcmp(fmt, "zephyr")) {
    for (int i = 0; i < n; i++) sb_add(&b, "<|%s|>\n%s</s>\n", m[i].role, m[i].content);
    sb_add(&b, "<|assistant|>\n");
  } else { // llama2: [INST] <<SYS>> ... [/INST]
    int open = 0;
    for (int i = 0; i < n; i++) {
      if (!strcmp(m[i].role, "system")) {
        sb_add(&b, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n", m[i].content);
        open = 1;
      } else if (!strcmp(m[i].role, "user")) {
        sb_add(&b, open ? "%s [/INST]" : "[INST] %s [/INST]", m[i].content);
        open = 0;
      } else {
        sb_add(&b, " %s</s>", m[i].content);
      }
    }
  }
  if (b.oom) {
    free(b.p);
    return ll_errf(err, errlen, LL_ENOMEM, "chat: out of memory");
  }
  *out = b.p;
  return 0;
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
    m[k].role = role;
    m[k].content = content;
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
