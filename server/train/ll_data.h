// ll_data.h - the training data pipeline: files -> documents -> tokens -> packed sequences.
//
// Sources (params.path):
//   - a text file (any name but *.jsonl): cut into documents of about doc_bytes at blank lines;
//   - a JSONL file (*.jsonl): one record per line, {"text": ...}, {"prompt": ..., "completion": ...}
//     (loss on the completion only) or {"messages": [{"role", "content"}, ...]} rendered with the
//     model's chat template (loss on the assistant turns only, their end-of-turn marker included,
//     their <think> blocks left out unless train_on_thinking);
//   - a directory: in a git work tree its tracked files (`git ls-files`), elsewhere every file
//     not excluded by the .gitignore files met on the way down; binary, generated, empty and
//     huge (> max_file_bytes) files are skipped and counted per reason. *.jsonl members are
//     read as JSONL (one with a malformed line is skipped as "malformed"), others as text.
//
// Documents are tokenized with the model's tokenizer ([BOS] tokens [EOS]; a text file cut in
// several documents gets BOS on its first and EOS on its last) and packed back to back into one
// stream; sequence k of that stream is the S + 1 tokens starting at token k * S, so every token
// is predicted once: ids = tokens[0..S), targets[t] = tokens[t + 1] or -1 where that token does
// not count (BOS, prompt, padding). The training stream runs on across epochs without padding;
// each epoch reads the corpus in a new order drawn from seed and epoch, shuffling whole text
// files and runs of 8 JSONL records (more in files over 128 MiB); a sequence's epoch is the
// epoch of its first token.
//
// Validation: each document goes to the held-out split when a hash of (seed, file path,
// document index) falls below val_fraction (at least one document when there are two or more),
// so the split is deterministic, disjoint from training, and decided without holding the corpus.
//
// Streaming: ll_data_open scans the corpus once (counts for the pre-flight check, refusals);
// afterwards documents are read and tokenized one at a time from their files. Memory is the file
// list, a table of the shuffled units (under 10 bytes a JSONL record) and one document's tokens.
// A file that vanishes or becomes unreadable later gives an error
// naming it, and the position is left where it was (the trainer keeps its last checkpoint).
//
// Thread safety: one struct ll_data is used by one thread at a time.
#ifndef LL_DATA_H
#define LL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "ll_tokenizer.h"

struct ll_tokenizer;
struct ll_data;

// Why a directory member was not used (counted in ll_data_stats.skipped).
enum ll_data_skip {
  LL_DATA_SKIP_IGNORED,   // excluded by .gitignore (directory walk outside git)
  LL_DATA_SKIP_BINARY,    // NUL byte or invalid UTF-8 in the first 8 KiB
  LL_DATA_SKIP_GENERATED, // *.min.js, lock files, "@generated"/"DO NOT EDIT" headers, ...
  LL_DATA_SKIP_TOO_LARGE, // larger than max_file_bytes
  LL_DATA_SKIP_EMPTY,     // no bytes, or no document in it
  LL_DATA_SKIP_OTHER,     // not a regular file (symlink, socket, submodule), tracked but missing
  LL_DATA_SKIP_MALFORMED, // a *.jsonl member with a line that does not parse (a JSONL file named
                          // directly is refused instead)
  LL_DATA_SKIP_N
};
const char *ll_data_skip_name(int reason); // "ignored", "binary", ...

struct ll_data_params {
  const char *path;           // file or directory (required)
  int seq_len;                // S: tokens per training sequence (required, >= 2)
  double val_fraction;        // share of documents held out for validation; 0: none (default 0.05)
  uint64_t seed;              // split and epoch order (default 0)
  int64_t max_file_bytes;     // directory members larger than this are skipped (default 4 MiB);
                              // a file named directly by path is streamed whatever its size
  int64_t doc_bytes;          // text files are cut into documents of about this many bytes (default 4 KiB:
                              // fine enough that a few files still give a validation split)
  const char *chat_template;  // chat records: a format name (chatml, llama2, llama3, zephyr, gemma,
                              // phi3) or Jinja text; NULL: the tokenizer's own template
  int train_on_thinking;      // chat records: 1 the assistants' <think>...</think> blocks count in the
                              // loss; 0 (default) they are left out (ll_data_record_parse)
  int shuffle_pieces;         // text files: 0 (default) a file is one unit of the epoch's shuffle, read
                              // in order; 1 each document (piece of ~doc_bytes) is a unit, so that
                              // consecutive sequences come from different files (pre-training from
                              // scratch, where a file read for hundreds of steps pulls the model to it)
};
void ll_data_params_init(struct ll_data_params *p);

struct ll_data_stats {
  int64_t files;                          // files that gave at least one document
  int64_t skipped[LL_DATA_SKIP_N];        // directory members not used, per reason
  char skipped_example[LL_DATA_SKIP_N][128]; // one path per reason (for messages), "" if none
  int64_t bytes;                          // bytes of the files used
  int64_t docs_train, docs_val;           // documents (text pieces, JSONL records) per split
  int64_t tokens_train, tokens_val;       // tokens in those documents, BOS/EOS included
  int64_t loss_tokens_train;              // training tokens that count in the loss
  int64_t seqs_per_epoch;                 // tokens_train / seq_len (the stream wraps, no padding)
  int64_t seqs_val;                       // validation sequences (the last one padded)
  int64_t epoch;                          // epoch of the next training sequence
};

// Position of the next training sequence. A run checkpoint stores it as LL_DATA_CURSOR_WORDS
// little-endian u64 and gives it back to ll_data_cursor_set to continue with exactly the
// sequence the interrupted run would have read next.
#define LL_DATA_CURSOR_WORDS 8
struct ll_data_cursor {
  uint64_t version;     // LL_DATA_CURSOR_VERSION
  uint64_t fingerprint; // of the file list and the parameters that shape the stream
  uint64_t epoch;
  uint64_t file;        // index in this epoch's order of units (a text file, a run of JSONL records)
  uint64_t doc;         // document index in that file
  uint64_t offset;      // byte offset of that document in the file
  uint64_t token;       // token index in that document
  uint64_t seqs;        // training sequences read so far
};
#define LL_DATA_CURSOR_VERSION 1

// Scans the corpus and refuses, with a message naming the file (and line for JSONL), data that is
// missing, unreadable, empty, malformed or too short (fewer than seq_len + 1 training tokens).
// tok is required (it must outlive the struct ll_data).
int ll_data_open(struct ll_data **out, const struct ll_data_params *p, const struct ll_tokenizer *tok,
                 char *err, size_t errlen);
void ll_data_close(struct ll_data *d);

void ll_data_stats(const struct ll_data *d, struct ll_data_stats *st);
// The data half of the pre-flight check, one or more lines ending in '\n': path, files (skips per
// reason with an example), documents, tokens, sequences. Returns the length written (truncated to
// cap - 1) like snprintf.
int ll_data_describe(const struct ll_data *d, char *buf, size_t cap);

// Next training sequence: ids (S) the model's input, targets (S) the token to predict at each
// position or -1. Returns the sequence's epoch (>= 0) or a negative LL_E* code (position unchanged).
int ll_data_next(struct ll_data *d, int32_t *ids, int32_t *targets, char *err, size_t errlen);

// Validation sequences in a fixed order: returns 1 with a sequence, 0 after the last one (then
// ll_data_val_reset starts over), or a negative code. The last one is padded (targets -1).
int ll_data_val_next(struct ll_data *d, int32_t *ids, int32_t *targets, char *err, size_t errlen);
void ll_data_val_reset(struct ll_data *d);

void ll_data_cursor_get(const struct ll_data *d, struct ll_data_cursor *c);
// LL_EFORMAT for a cursor of another version; LL_ESTATE when the fingerprint differs (the files
// or parameters changed since the checkpoint: the message says so and the position is unchanged;
// a caller that wants to go on anyway copies the current fingerprint into c, and positions past a
// file's new end move on to the next file).
int ll_data_cursor_set(struct ll_data *d, const struct ll_data_cursor *c, char *err, size_t errlen);
void ll_data_cursor_to_words(const struct ll_data_cursor *c, uint64_t w[LL_DATA_CURSOR_WORDS]);
void ll_data_cursor_from_words(struct ll_data_cursor *c, const uint64_t w[LL_DATA_CURSOR_WORDS]);

// The trainer's view of d (ll_trainer.h): next, val_next, val_reset and the cursor as words.
struct ll_train_source;
void ll_data_train_source(struct ll_data *d, struct ll_train_source *src);

// ---- one JSONL record (exposed for tests and the fuzz target) ----
// The record's text as the model sees it, with the byte spans that count in the loss.
struct ll_data_span { size_t start, end; };
struct ll_data_record {
  char *text;        // malloc'ed, NUL-terminated (len bytes before it)
  size_t len;
  struct ll_data_span *spans; // sorted, disjoint, inside [0, len]
  int n_spans;
  struct ll_tok_span *marks; // the chat template's markup (sorted, disjoint): tokenized with
  int n_marks;               // ll_tokenize_marked, so only it gives control tokens; none: text
  int eos;           // 1: append EOS, counted in the loss (text, completion); 0: none (chat: the
                     // template's end-of-turn marker ends the record)
};
// Parses one line (without its '\n'); chat_template as in ll_data_params (NULL: chat records are
// refused). A chat record's assistant turns count in the loss without their thinking: each
// "<think>" ... "</think>" block (Qwen3's reasoning; an unclosed one to the content's end) and the
// whitespace after it are left out of the spans, unless flags has LL_DATA_TRAIN_ON_THINKING.
// Returns 0, 1 for a blank line (no record), or LL_EFORMAT / LL_EUNSUPPORTED / LL_ENOMEM.
#define LL_DATA_TRAIN_ON_THINKING 1u
int ll_data_record_parse(const char *line, size_t len, const char *chat_template, unsigned flags, struct ll_data_record *rec,
                         char *err, size_t errlen);
void ll_data_record_free(struct ll_data_record *rec);

#endif
