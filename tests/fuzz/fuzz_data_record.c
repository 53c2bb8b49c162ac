// fuzz_data_record.c - one JSONL line of training data, arbitrary bytes: the record parser
// never crashes or reads outside the line; a parsed record's text is NUL-terminated and its
// loss spans are sorted, disjoint and inside the text; a refusal always says why. Every chat
// format is tried (chat records render through ll_chat_render with placeholders); the markup
// spans are sorted, disjoint and inside the text too; with thinking blocks in the loss and out.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ll_data.h"

static void check(const char *line, size_t n, const char *tmpl, unsigned flags) {
  struct ll_data_record r;
  char err[256];
  err[0] = 0;
  int rc = ll_data_record_parse(line, n, tmpl, flags, &r, err, sizeof err);
  if (rc == 1) { // blank: whitespace only
    for (size_t i = 0; i < n; i++)
      if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r' && line[i] != '\n') __builtin_trap();
    return;
  }
  if (rc < 0) {
    if (!err[0] || r.text || r.spans) __builtin_trap();
    return;
  }
  if (rc != 0 || !r.text || r.text[r.len] != '\0' || r.n_spans < 1) __builtin_trap();
  size_t prev = 0;
  for (int i = 0; i < r.n_spans; i++) {
    if (r.spans[i].start < prev || r.spans[i].end < r.spans[i].start || r.spans[i].end > r.len) __builtin_trap();
    prev = r.spans[i].end;
  }
  prev = 0;
  for (int i = 0; i < r.n_marks; i++) { // the template's markup: what ll_tokenize_marked accepts
    if (r.marks[i].start < prev || r.marks[i].end <= r.marks[i].start || r.marks[i].end > r.len) __builtin_trap();
    prev = r.marks[i].end;
  }
  ll_data_record_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *line = malloc(size ? size : 1); // exactly size bytes: reads past the line are caught by ASan
  if (!line) return 0;
  memcpy(line, data, size);
  static const char *const tmpls[] = {NULL, "chatml", "llama2", "llama3", "zephyr", "gemma", "phi3",
                                      "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", "unknown"};
  for (size_t i = 0; i < sizeof tmpls / sizeof tmpls[0]; i++) check(line, size, tmpls[i], 0), check(line, size, tmpls[i], LL_DATA_TRAIN_ON_THINKING);
  free(line);
  return 0;
}
