// ll_chat.h - render chat messages with a model's chat template. The Jinja template text from
// the GGUF is not executed; it is recognised (like llama.cpp's llm_chat_detect_template) and
// the known format is rendered: chatml, llama2, llama3, zephyr, gemma, phi3, qwen3 (chatml with
// Qwen3's thinking rules: recognised by "<|im_start|>" with "enable_thinking").
#ifndef LL_CHAT_H
#define LL_CHAT_H

#include <stddef.h>

#include "ll_tokenizer.h"

struct ll_chat_msg {
  const char *role;      // system | user | assistant
  const char *content;
  const char *reasoning; // assistant: its reasoning_content (qwen3 renders it instead of a
                         // <think> block in content), or NULL; "" counts as NULL (as llama.cpp)
};

// Name of the recognised format ("chatml", ...) or NULL when the template is unknown/absent.
const char *ll_chat_detect(const char *tmpl);

// Parse the protocol's chat text: a JSON array of {"role","content"} objects (an assistant's
// may carry "reasoning_content"), or an object {"messages":[...]}; any other text is one user message. *msgs and the strings are kept
// in *store (free with ll_chat_free_store). Returns the message count or LL_EFORMAT.
int ll_chat_parse(const char *text, size_t len, struct ll_chat_msg **msgs, void **store, char *err, size_t errlen);
void ll_chat_free_store(void *store, struct ll_chat_msg *msgs);

// The built-in format named name ("chatml", ...: the static string) or NULL.
const char *ll_chat_builtin(const char *name);

// A chat_template setting (config key chat_template, --chat-template): a built-in name, or the
// path of a template file (Jinja text as in a GGUF's tokenizer.chat_template, e.g. what
// llama.cpp's --chat-template-file reads) of a format ll_chat_detect recognises. *out is the
// malloc'ed template (the name itself for a built-in). LL_EINVAL with a message listing the
// built-in names when spec is neither; LL_EUNSUPPORTED for a file of an unknown format.
int ll_chat_template_load(const char *spec, char **out, char *err, size_t errlen);

// Render with the assistant prompt appended; tmpl is a built-in name or template text. *out is
// malloc'ed. LL_EUNSUPPORTED for an unknown template.
int ll_chat_render(const char *tmpl, const struct ll_chat_msg *msgs, int n, char **out, char *err, size_t errlen);
// The same, with the spans of the template's own markup in *marks (malloc'ed, sorted, disjoint;
// *n_marks of them): tokenize the text with ll_tokenize_marked so that only the template's
// markers become control tokens and the messages' contents stay text.
int ll_chat_render_marked(const char *tmpl, const struct ll_chat_msg *msgs, int n, char **out, struct ll_tok_span **marks,
                          int *n_marks, char *err, size_t errlen);

// Rendering options (NULL: the defaults).
struct ll_chat_opts {
  int enable_thinking; // qwen3: 1 (default) the model thinks first; 0 the prompt ends with an
                       // empty "<think>\n\n</think>\n\n" block, as Qwen3's template renders
                       // enable_thinking=false. Other formats ignore it.
};
int ll_chat_render_opts(const char *tmpl, const struct ll_chat_msg *msgs, int n, const struct ll_chat_opts *o, char **out,
                        struct ll_tok_span **marks, int *n_marks, char *err, size_t errlen);

// A thinking model's answer, "<think>" reasoning "</think>" answer (Qwen3, DeepSeek-R1), split as
// llama-server 0c1e5709 splits a Qwen3 answer with reasoning_format deepseek (its PEG parser, checked
// case by case in test_proto): the output's leading whitespace is dropped; only an output that
// then starts with "<think>" has reasoning, from after it and one newline to "</think>" (verbatim;
// an unclosed block runs to the end, less a partial "</think>" there), and the answer follows it
// less up to two newlines; an output that is only the start of "<think>" is empty. The reasoning
// is text[*rs, *re), the answer text[*cs, n); returns 1 when there is a think block, else 0.
int ll_chat_reasoning_split(const char *text, size_t n, size_t *rs, size_t *re, size_t *cs);
// The same over text arriving in pieces (a stream): each call adds n bytes and emits what is
// decided, reasoning (1) or answer (0), in order; what may still become a tag or droppable
// whitespace waits for more text, and final ends it. The pieces of each kind
// joined equal ll_chat_reasoning_split's. Pieces split text only where it is ASCII (a tag, a
// whitespace run), so UTF-8-complete input gives UTF-8-complete pieces. 0 or LL_ENOMEM.
struct ll_chat_reasoning {
  int state;
  char *hold; // bytes not yet emitted
  size_t n, cap;
};
typedef void (*ll_chat_reasoning_emit)(void *u, int reasoning, const char *t, size_t n);
int ll_chat_reasoning_feed(struct ll_chat_reasoning *r, const char *text, size_t n, int final, ll_chat_reasoning_emit emit, void *u);
void ll_chat_reasoning_free(struct ll_chat_reasoning *r);

#endif
