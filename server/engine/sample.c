// sample.c - the sampler chain (penalties, top-k, top-p, min-p, temperature, seeded draw) and
// stop strings matched across token boundaries.
#include "ll_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ll_sampler {
  struct ll_sampler_params p;
  int n_vocab;
  int32_t *hist; // ring of the last repeat_last_n tokens
  int hist_n, hist_pos;
  uint64_t rng;
  struct ll_token_prob *cand; // (n_vocab) working set
  int32_t *count;             // (n_vocab) occurrences in the window
  int32_t *pen;               // (repeat_last_n, 2) ll_sampler_dev_next's penalty list: id, count
};

void ll_sampler_params_default(struct ll_sampler_params *p) {
  memset(p, 0, sizeof *p);
  p->temperature = 0.8f;
  p->top_k = 40;
  p->top_p = 0.95f;
  p->min_p = 0.05f;
  p->repeat_penalty = 1.0f;
  p->repeat_last_n = 64;
  p->seed = 0x5eed;
}

struct ll_sampler *ll_sampler_new(const struct ll_sampler_params *p, int n_vocab) {
  if (n_vocab <= 0) return NULL;
  struct ll_sampler *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->p = *p;
  if (s->p.repeat_last_n < 0) s->p.repeat_last_n = 0;
  if (s->p.repeat_last_n > 4096) s->p.repeat_last_n = 4096;
  if (s->p.n_probs < 0) s->p.n_probs = 0;
  if (s->p.n_probs > 20) s->p.n_probs = 20;
  s->n_vocab = n_vocab;
  s->hist = calloc((size_t)(s->p.repeat_last_n ? s->p.repeat_last_n : 1), sizeof *s->hist);
  s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
  s->count = calloc((size_t)n_vocab, sizeof *s->count);
  s->pen = malloc((size_t)(s->p.repeat_last_n ? s->p.repeat_last_n : 1) * 2 * sizeof *s->pen);
  s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ULL;
  if (!s->hist || !s->cand || !s->count || !s->pen) {
    ll_sampler_free(s);
    return NULL;
  }
  return s;
}

void ll_sampler_free(struct ll_sampler *s) {
  if (!s) return;
  free(s->hist);
  free(s->cand);
  free(s->count);
  free(s->pen);
  free(s);
}

void ll_sampler_accept(struct ll_sampler *s, int32_t tok) {
  if (s->p.repeat_last_n == 0 || tok < 0 || tok >= s->n_vocab) return;
  if (s->hist_n == s->p.repeat_last_n) {
    s->count[s->hist[s->hist_pos]]--;
  } else {
    s->hist_n++;
  }
  s->hist[s->hist_pos] = tok;
  s->count[tok]++;
  s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
}

static uint64_t next_u64(uint64_t *x) { // splitmix64
  uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static int cmp_desc(const void *a, const void *b) {
  const struct ll_token_prob *x = a, *y = b;
  if (x->logprob != y->logprob) return x->logprob < y->logprob ? 1 : -1;
  return x->id < y->id ? -1 : x->id > y->id;
}

// Sort the n best candidates to the front (partial selection, then sort).
static void top_sort(struct ll_token_prob *c, int total, int n) {
  if (n < total) {
    // quickselect-ish via qsort on a copy would be O(V log V); a simple heap keeps it O(V log n)
    // for small n; for large n fall back to a full sort.
    if (n > 256) {
      qsort(c, (size_t)total, sizeof *c, cmp_desc);
      return;
    }
    for (int i = 0; i < n; i++) { // selection of n maxima (n is small)
      int best = i;
      for (int j = i + 1; j < total; j++)
        if (cmp_desc(&c[j], &c[best]) < 0) best = j;
      struct ll_token_prob t = c[i];
      c[i] = c[best];
      c[best] = t;
    }
    return;
  }
  qsort(c, (size_t)total, sizeof *c, cmp_desc);
}

int ll_sampler_is_greedy(const struct ll_sampler *s) {
  return s->p.temperature <= 0.0f && s->p.n_probs <= 0 && s->p.repeat_penalty == 1.0f && s->p.frequency_penalty == 0.0f &&
         s->p.presence_penalty == 0.0f;
}

// The chain past the penalties: greedy (temperature 0), else top-k, top-p, min-p, temperature
// and the draw u (uniform in [0, 1), taken by the caller). cand: (V) scratch. The device
// sampler (kernels/opencl/llsrv_fast.cl sample_rows) repeats it step for step.
static int32_t sample_chain(const struct ll_sampler_params *p, struct ll_token_prob *cand, const float *logits, int V, double u,
                            struct ll_token_prob *probs) {
  int32_t chosen = 0;
  if (p->temperature <= 0.0f) { // greedy: argmax, lowest id on ties
    for (int i = 1; i < V; i++)
      if (logits[i] > logits[chosen]) chosen = i;
  }
  // Candidates (needed for sampling and for reported logprobs).
  const int need_cands = p->temperature > 0.0f || p->n_probs > 0;
  if (need_cands) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0;
    for (int i = 0; i < V; i++) z += exp((double)logits[i] - mx);
    const float lz = (float)(mx + log(z));
    for (int i = 0; i < V; i++) cand[i] = (struct ll_token_prob){i, logits[i] - lz};
    if (probs && p->n_probs > 0) {
      top_sort(cand, V, p->n_probs);
      memcpy(probs, cand, (size_t)p->n_probs * sizeof *probs);
    }
  }
  if (p->temperature > 0.0f) {
    int n = V;
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    top_sort(cand, V, k);
    n = k;
    // Probabilities of the kept set at temperature 1 for top-p / min-p (as llama.cpp's chain).
    double z = 0;
    for (int i = 0; i < n; i++) z += exp(cand[i].logprob - cand[0].logprob);
    if (p->top_p < 1.0f) {
      double cum = 0;
      for (int i = 0; i < n; i++) {
        cum += exp(cand[i].logprob - cand[0].logprob) / z;
        if (cum >= p->top_p) {
          n = i + 1;
          break;
        }
      }
    }
    if (p->min_p > 0.0f) {
      const float floor = cand[0].logprob + logf(p->min_p);
      int m = 1;
      while (m < n && cand[m].logprob >= floor) m++;
      n = m;
    }
    // Temperature, then the draw.
    double tot = 0;
    for (int i = 0; i < n; i++) tot += exp((cand[i].logprob - cand[0].logprob) / p->temperature);
    double r = u * tot, acc = 0;
    chosen = cand[n - 1].id;
    for (int i = 0; i < n; i++) {
      acc += exp((cand[i].logprob - cand[0].logprob) / p->temperature);
      if (r < acc) {
        chosen = cand[i].id;
        break;
      }
    }
  }
  return chosen;
}

static double draw_u(struct ll_sampler *s) { return (double)(next_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0); }

// A penalized logit: the host's arithmetic, which the device's (llsrv_fast.cl smp_penalty)
// repeats operation for operation (count > 0: the token's occurrences in the window).
static float penalty_apply(float l, int32_t count, float rep, float freq, float pres) {
  if (rep != 1.0f) l = l <= 0 ? l * rep : l / rep;
  l -= (float)count * freq + (count > 0 ? pres : 0.0f);
  return l;
}

static int has_penalties(const struct ll_sampler_params *p) {
  return p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
}

int32_t ll_sampler_sample(struct ll_sampler *s, float *logits, struct ll_token_prob *probs) {
  // Penalties over the recent window (llama.cpp's order: repetition, frequency, presence).
  if (s->hist_n && has_penalties(&s->p)) {
    for (int i = 0; i < s->hist_n; i++) {
      const int32_t t = s->hist[i];
      if (s->count[t] <= 0) continue;
      logits[t] = penalty_apply(logits[t], s->count[t], s->p.repeat_penalty, s->p.frequency_penalty, s->p.presence_penalty);
      s->count[t] = -s->count[t]; // mark applied (a token repeated in the window counts once)
    }
    for (int i = 0; i < s->hist_n; i++)
      if (s->count[s->hist[i]] < 0) s->count[s->hist[i]] = -s->count[s->hist[i]];
  }
  const double u = s->p.temperature > 0.0f ? draw_u(s) : 0; // the step's one draw
  return sample_chain(&s->p, s->cand, logits, s->n_vocab, u, probs);
}

int ll_sampler_dev_ok(const struct ll_sampler *s) {
  if (s->p.n_probs > 0) return 0;
  if (s->p.temperature <= 0.0f) return has_penalties(&s->p); // greedy with penalties (plain greedy: ll_sampler_is_greedy)
  return s->p.top_k >= 1 && s->p.top_k <= LL_SAMPLE_DEV_K;
}

int ll_sampler_dev_ahead(const struct ll_sampler *s) { return !has_penalties(&s->p); }

int ll_sampler_dev_next(struct ll_sampler *s, struct ll_sample_dev *d) {
  if (!ll_sampler_dev_ok(s)) return 0;
  const uint64_t r = s->p.temperature > 0.0f ? next_u64(&s->rng) >> 11 : 0; // as draw_u
  *d = (struct ll_sample_dev){s->p.temperature, s->p.top_p, s->p.min_p, s->p.min_p > 0.0f ? logf(s->p.min_p) : 0.0f, s->p.top_k,
                              (uint32_t)(r >> 32), (uint32_t)r, s->p.repeat_penalty, s->p.frequency_penalty, s->p.presence_penalty,
                              0, s->pen};
  if (s->hist_n && has_penalties(&s->p)) { // each token of the window once, with its count
    for (int i = 0; i < s->hist_n; i++) {
      const int32_t t = s->hist[i];
      if (s->count[t] <= 0) continue;
      s->pen[2 * d->n_pen] = t, s->pen[2 * d->n_pen + 1] = s->count[t], d->n_pen++;
      s->count[t] = -s->count[t];
    }
    for (int i = 0; i < s->hist_n; i++)
      if (s->count[s->hist[i]] < 0) s->count[s->hist[i]] = -s->count[s->hist[i]];
  }
  return 1;
}

int32_t ll_sample_dev_choose(const struct ll_sample_dev *d, struct ll_token_prob *cand, float *logits, int V) {
  struct ll_sampler_params p;
  ll_sampler_params_default(&p);
  p.temperature = d->temperature, p.top_k = d->top_k, p.top_p = d->top_p, p.min_p = d->min_p, p.n_probs = 0;
  for (int i = 0; i < d->n_pen && d->pen; i++) {
    const int32_t t = d->pen[2 * i];
    if (t >= 0 && t < V) logits[t] = penalty_apply(logits[t], d->pen[2 * i + 1], d->repeat_penalty, d->frequency_penalty, d->presence_penalty);
  }
  const double u = (double)(((uint64_t)d->u_hi << 32) | d->u_lo) * (1.0 / 9007199254740992.0);
  return sample_chain(&p, cand, logits, V, u, NULL);
}

// ---------------------------------------------------------------- stop strings

struct ll_stop_matcher {
  char *stops[LL_MAX_STOP];
  size_t len[LL_MAX_STOP];
  int n;
  size_t maxlen;
  char *held; // text not yet emitted (a possible stop-string prefix)
  size_t held_n, held_cap;
  int stopped;
};

struct ll_stop_matcher *ll_stop_new(const char *const *stops, int n_stops) {
  struct ll_stop_matcher *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  for (int i = 0; i < n_stops && m->n < LL_MAX_STOP; i++) {
    if (!stops[i] || !*stops[i]) continue;
    m->stops[m->n] = strdup(stops[i]);
    if (!m->stops[m->n]) {
      ll_stop_free(m);
      return NULL;
    }
    m->len[m->n] = strlen(stops[i]);
    if (m->len[m->n] > m->maxlen) m->maxlen = m->len[m->n];
    m->n++;
  }
  return m;
}

void ll_stop_free(struct ll_stop_matcher *m) {
  if (!m) return;
  for (int i = 0; i < m->n; i++) free(m->stops[i]);
  free(m->held);
  free(m);
}

size_t ll_stop_push(struct ll_stop_matcher *m, const char *text, size_t len, char *out, size_t cap, int *stopped) {
  *stopped = m->stopped;
  if (m->stopped) return 0;
  if (m->held_n + len > m->held_cap) {
    size_t nc = (m->held_n + len) * 2 + 16;
    char *nh = realloc(m->held, nc);
    if (!nh) return 0;
    m->held = nh;
    m->held_cap = nc;
  }
  memcpy(m->held + m->held_n, text, len);
  m->held_n += len;
  // Earliest complete stop string.
  size_t cut = m->held_n;
  for (int i = 0; i < m->n; i++) {
    if (m->len[i] > m->held_n) continue;
    for (size_t p = 0; p + m->len[i] <= m->held_n; p++)
      if (memcmp(m->held + p, m->stops[i], m->len[i]) == 0) {
        if (p < cut) cut = p;
        break;
      }
  }
  size_t emit;
  if (cut < m->held_n) {
    m->stopped = 1;
    *stopped = 1;
    emit = cut;
  } else {
    // Hold back the longest suffix that is a prefix of some stop string.
    size_t keep = 0;
    for (int i = 0; i < m->n; i++)
      for (size_t k = m->len[i] - 1; k > keep; k--)
        if (k <= m->held_n && memcmp(m->held + m->held_n - k, m->stops[i], k) == 0) {
          keep = k;
          break;
        }
    emit = m->held_n - keep;
  }
  if (emit > cap) emit = cap;
  memcpy(out, m->held, emit);
  memmove(m->held, m->held + emit, m->held_n - emit);
  m->held_n -= emit;
  if (m->stopped) m->held_n = 0;
  return emit;
}

size_t ll_stop_flush(struct ll_stop_matcher *m, char *out, size_t cap) {
  size_t n = m->stopped ? 0 : (m->held_n < cap ? m->held_n : cap);
  memcpy(out, m->held, n);
  m->held_n = 0;
  return n;
}
