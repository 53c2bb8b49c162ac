// ll_sample.h - token sampling: greedy, temperature, top-k, top-p, min-p, repetition /
// frequency / presence penalties, seeded RNG (same seed, same output), optional top-n
// logprobs; plus stop-string matching across token boundaries.
#ifndef LL_SAMPLE_H
#define LL_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "ll_backend.h" // struct ll_sample_dev, LL_SAMPLE_DEV_K

struct ll_sampler_params {
  float temperature;       // 0 = greedy
  int top_k;               // 0 = off
  float top_p;             // 1 = off
  float min_p;             // 0 = off
  float repeat_penalty;    // 1 = off
  int repeat_last_n;       // window for penalties (64)
  float frequency_penalty; // 0 = off
  float presence_penalty;  // 0 = off
  uint64_t seed;
  int n_probs;             // top-n logprobs to report (0 = off, max 20)
};

struct ll_sampler;

void ll_sampler_params_default(struct ll_sampler_params *p);
// Returns NULL on allocation failure.
struct ll_sampler *ll_sampler_new(const struct ll_sampler_params *p, int n_vocab);
void ll_sampler_free(struct ll_sampler *s);
// Record a token as part of the context (prompt tokens and sampled tokens) for penalties.
void ll_sampler_accept(struct ll_sampler *s, int32_t token);

struct ll_token_prob { int32_t id; float logprob; };
// 1 when sampling is plain greedy (temperature 0, no penalties, no reported probabilities): the
// argmax of the logits, lowest id on ties, which a device can take itself (ll_batch_item.argmax)
// so that only the id comes back. The rest of the chain runs on the host, from the logits.
int ll_sampler_is_greedy(const struct ll_sampler *s);
// Samples from logits (modified in place). probs (if n_probs > 0) receives n_probs entries.
int32_t ll_sampler_sample(struct ll_sampler *s, float *logits, struct ll_token_prob *probs);
// 1 when the next choice can be made where the logits are (a device: ll_engine_seq_set_sample),
// with only the id coming back: no reported probabilities, and temperature > 0 with top-k in
// 1..LL_SAMPLE_DEV_K, top-p, min-p, or greedy with penalties (plain greedy is
// ll_sampler_is_greedy's); penalties either way. Then ll_sampler_dev_next takes the step's draw
// from the RNG (as ll_sampler_sample would) and the window's penalty list into *d (d->pen points
// into the sampler: valid until the next accept), and the choice is ll_sampler_sample's for the
// same logits; it returns 0 and changes nothing otherwise.
int ll_sampler_dev_ok(const struct ll_sampler *s);
int ll_sampler_dev_next(struct ll_sampler *s, struct ll_sample_dev *d);
// 1 when the sampler's steps do not depend on the tokens accepted since (no penalties: the draw
// alone changes), so a step may be prepared before the previous step's id is known (a decode
// step queued behind the previous one, ll_engine_decode_queue): the same draws, the same ids.
int ll_sampler_dev_ahead(const struct ll_sampler *s);
// The host's choice for *d (cand: n_vocab scratch; d's penalties are applied to logits in place):
// the reference of a device's sample member.
int32_t ll_sample_dev_choose(const struct ll_sample_dev *d, struct ll_token_prob *cand, float *logits, int V);
// Stop strings: feed generated text; reports how much of it is safe to emit now (text that
// cannot be the start of a stop string) and whether a stop string has matched.
#define LL_MAX_STOP 8
struct ll_stop_matcher;
struct ll_stop_matcher *ll_stop_new(const char *const *stops, int n_stops);
void ll_stop_free(struct ll_stop_matcher *m);
// Appends text; writes the text now safe to emit to out (cap bytes) and sets *stopped when a
// stop string completed (the stop string itself and anything after it are not emitted).
// Returns bytes written to out.
size_t ll_stop_push(struct ll_stop_matcher *m, const char *text, size_t len, char *out, size_t cap, int *stopped);
// At the end of generation: the held-back text (a partial stop-string prefix) to emit.
size_t ll_stop_flush(struct ll_stop_matcher *m, char *out, size_t cap);

#endif
