// ll_chat.h - render chat messages with a model's chat template. The Jinja template text from
// the GGUF is not executed; it is recognised (like llama.cpp's llm_chat_detect_template) and
// the known format is rendered: chatml, llama2, llama3, zephyr, gemma, phi3.
#ifndef LL_CHAT_H
#define LL_CHAT_H

#include <stddef.h>

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

// Render with the assistant prompt appended. *out is malloc'ed. LL_EUNSUPPORTED for an
// unknown template.
int ll_chat_render(const char *tmpl, const struct ll_chat_msg *msgs, int n, char **out, char *err, size_t errlen);

#endif
