// ll_chat.h - render chat messages with a model's chat template. The Jinja template text from
// the GGUF is not executed; it is recognised (like llama.cpp's llm_chat_detect_template) and
// the known format is rendered: chatml, llama2, llama3, zephyr, gemma, phi3.
#ifndef LL_CHAT_H
#define LL_CHAT_H

#include <stddef.h>

#include "ll_tokenizer.h"

struct ll_chat_msg {
  const char *role;    // system | user | assistant
  const char *content;
};

// Name of the recognised format ("chatml", ...) or NULL when the template is unknown/absent.
const char *ll_chat_detect(const char *tmpl);

// Parse the protocol's chat text: a JSON array of {"role","content"} objects, or an object
// {"messages":[...]}; any other text is one user message. *msgs and the strings are kept
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

#endif
