// ll_tokenizer.h - tokenizers built from GGUF-style metadata (tokenizer.ggml.*):
// SentencePiece-style (model "llama": scores, byte fallback), byte-level BPE (model "gpt2"
// with the pre-tokenizer named by tokenizer.ggml.pre: every name llama.cpp 0c1e5709 knows,
// gpt-2, llama-bpe, qwen2, qwen35, deepseek-llm, kimi-k2, ...) and Gemma 4's BPE over raw
// UTF-8 (model "gemma4"). Ids match llama.cpp's for the same file. WordPiece ("bert", embedding
// models) and the other llama.cpp tokenizer models (t5, rwkv, plamo2) are refused by name.
//
// Ownership: a tokenizer copies what it needs from the modelfile; it may outlive it.
// Thread safety: a built tokenizer is immutable; encode/decode may run concurrently.
#ifndef LL_TOKENIZER_H
#define LL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct ll_modelfile;
struct ll_tokenizer;

// Token attribute bits (from tokenizer.ggml.token_type).
enum ll_token_attr {
  LL_TOKEN_NORMAL = 1, LL_TOKEN_UNKNOWN = 2, LL_TOKEN_CONTROL = 4,
  LL_TOKEN_USER_DEFINED = 8, LL_TOKEN_UNUSED = 16, LL_TOKEN_BYTE = 32,
};

// LL_ENOTFOUND if the file carries no tokenizer (e.g. a llama2.c .bin): callers then work
// with ids only. Other errors name the bad key.
int ll_tokenizer_from_mf(const struct ll_modelfile *mf, struct ll_tokenizer **out, char *err, size_t errlen);
void ll_tokenizer_free(struct ll_tokenizer *t);

int32_t ll_tokenizer_n_vocab(const struct ll_tokenizer *t);
int32_t ll_tokenizer_bos(const struct ll_tokenizer *t); // -1 if none
int32_t ll_tokenizer_eos(const struct ll_tokenizer *t); // -1 if none
int ll_tokenizer_add_bos(const struct ll_tokenizer *t); // model's default for add_bos
// End of generation: eos, eot, <|im_end|>-style tokens the vocabulary marks or names.
int ll_tokenizer_is_eog(const struct ll_tokenizer *t, int32_t id);
int ll_tokenizer_token_attr(const struct ll_tokenizer *t, int32_t id); // 0 if out of range
// Chat template (Jinja text from tokenizer.chat_template) or NULL.
const char *ll_tokenizer_chat_template(const struct ll_tokenizer *t);

// Encode len bytes of UTF-8 text (invalid UTF-8 is tolerated as llama.cpp does).
// add_bos: prepend BOS (when the vocabulary has one); parse_special: recognise control /
// user-defined token texts like "<|im_start|>" in the input.
// Writes at most cap ids; returns the total number of ids (which may exceed cap: call
// again with a larger buffer) or a negative error code.
int ll_tokenize(const struct ll_tokenizer *t, const char *text, size_t len, int add_bos,
                int parse_special, int32_t *ids, int cap);

// A byte range [start, end) of a text.
struct ll_tok_span {
  size_t start, end;
};

// ll_tokenize with control-token texts recognised only where they lie wholly inside one of
// the n_marks spans (sorted, disjoint, inside the text; else LL_EINVAL): a chat template's own
// markup. Elsewhere - the messages' contents - "<|im_end|>" is text like any other, so a user
// cannot close their turn and write the assistant's. A user-defined token is recognised
// everywhere, as by ll_tokenize, unless its text occurs in the marks (a turn marker some
// vocabularies make user-defined): then it too is a token only inside them.
int ll_tokenize_marked(const struct ll_tokenizer *t, const char *text, size_t len, int add_bos,
                       const struct ll_tok_span *marks, int n_marks, int32_t *ids, int cap);

// Bytes of token id's text as it appears in the output (byte tokens give their raw byte,
// SPM's U+2581 becomes a space, BPE's byte-to-unicode mapping is undone). Control tokens
// give "" unless render_special. Writes at most cap bytes; returns the full length or a
// negative error code (LL_EINVAL for an id out of range).
int ll_token_to_piece(const struct ll_tokenizer *t, int32_t id, char *buf, size_t cap, int render_special);

// Decode a whole id sequence (with llama.cpp's rule of dropping the leading space after
// BOS for SPM). Returns total length like ll_token_to_piece.
int ll_detokenize(const struct ll_tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap,
                  int render_special);

// Streaming decode that never emits half a UTF-8 sequence: bytes of an incomplete character
// are held until the next token completes it (or flushed as-is by _finish if it never does).
struct ll_detok_stream {
  unsigned char pending[8];
  int n_pending;
  int n_tokens; // tokens pushed so far
};
void ll_detok_stream_init(struct ll_detok_stream *s);
// Appends the complete UTF-8 text now available to out (at most cap bytes; cap >= 256 is
// always enough for one token); returns bytes written or a negative code.
int ll_detok_stream_push(const struct ll_tokenizer *t, struct ll_detok_stream *s, int32_t id,
                         char *out, size_t cap);
int ll_detok_stream_finish(struct ll_detok_stream *s, char *out, size_t cap);

#endif
