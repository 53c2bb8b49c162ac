// request.c - the generation parameter table (ll_request.h), shared by the line protocol and
// the HTTP API so that both accept the same names, ranges and meanings.
#include "ll_request.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"

const struct ll_gen_param ll_gen_params[] = {
    {"max_tokens", NULL, LL_GEN_INT, 1, -1, 0, 0, LL_GF_MAX_TOKENS},
    {"temperature", "temp", LL_GEN_FLOAT, 0, 0, 0, 10, LL_GF_TEMPERATURE},
    {"top_k", NULL, LL_GEN_INT, 0, 1 << 20, 0, 0, LL_GF_TOP_K},
    {"top_p", NULL, LL_GEN_FLOAT, 0, 0, 0, 1, LL_GF_TOP_P},
    {"min_p", NULL, LL_GEN_FLOAT, 0, 0, 0, 1, LL_GF_MIN_P},
    {"repeat_penalty", NULL, LL_GEN_FLOAT, 0, 0, 0.01, 10, LL_GF_REPEAT_PENALTY},
    {"repeat_last_n", NULL, LL_GEN_INT, 0, 1 << 16, 0, 0, LL_GF_REPEAT_LAST_N},
    {"frequency_penalty", NULL, LL_GEN_FLOAT, 0, 0, -2, 2, LL_GF_FREQUENCY_PENALTY},
    {"presence_penalty", NULL, LL_GEN_FLOAT, 0, 0, -2, 2, LL_GF_PRESENCE_PENALTY},
    {"seed", NULL, LL_GEN_INT, 0, INT64_MAX, 0, 0, LL_GF_SEED},
    {"logprobs", NULL, LL_GEN_INT, 0, 20, 0, 0, LL_GF_LOGPROBS},
    {"ignore_eos", NULL, LL_GEN_BOOL, 0, 1, 0, 0, LL_GF_IGNORE_EOS},
    {"add_bos", NULL, LL_GEN_BOOL, 0, 1, 0, 0, LL_GF_ADD_BOS},
    {"special", NULL, LL_GEN_BOOL, 0, 1, 0, 0, LL_GF_SPECIAL},
    {"enable_thinking", NULL, LL_GEN_BOOL, 0, 1, 0, 0, LL_GF_ENABLE_THINKING},
    {"adapter", NULL, LL_GEN_NAME, 0, 0, 0, 0, LL_GF_ADAPTER},
    {"stop", NULL, LL_GEN_STOP, 0, 0, 0, 0, LL_GF_STOP},
    {NULL, NULL, 0, 0, 0, 0, 0, 0},
};

const struct ll_gen_param *ll_gen_param_find(const char *key) {
  for (const struct ll_gen_param *p = ll_gen_params; p->name; p++)
    if (!strcmp(p->name, key) || (p->alias && !strcmp(p->alias, key))) return p;
  return NULL;
}

void ll_gen_defaults(struct ll_sched_req *r, int64_t default_max_tokens) {
  ll_sampler_params_default(&r->sp);
  r->max_tokens = (int)default_max_tokens;
  r->add_bos = -1;
  r->enable_thinking = 1;
  r->special = r->kind != LL_REQ_CHAT; // CHAT: the messages are text (ll_tokenize_marked); r->kind is set first
}

void ll_gen_set_int(struct ll_sched_req *r, const struct ll_gen_param *p, int64_t v) {
  switch (p->field) {
  case LL_GF_MAX_TOKENS: r->max_tokens = (int)v; break;
  case LL_GF_TOP_K: r->sp.top_k = (int)v; break;
  case LL_GF_REPEAT_LAST_N: r->sp.repeat_last_n = (int)v; break;
  case LL_GF_SEED: r->sp.seed = (uint64_t)v; break;
  case LL_GF_LOGPROBS: r->sp.n_probs = (int)v; break;
  case LL_GF_IGNORE_EOS: r->ignore_eos = (int)v; break;
  case LL_GF_ADD_BOS: r->add_bos = (int)v; break;
  case LL_GF_SPECIAL: r->special = (int)v; break;
  case LL_GF_ENABLE_THINKING: r->enable_thinking = (int)v; break;
  default: break;
  }
}

void ll_gen_set_float(struct ll_sched_req *r, const struct ll_gen_param *p, double v) {
  switch (p->field) {
  case LL_GF_TEMPERATURE: r->sp.temperature = (float)v; break;
  case LL_GF_TOP_P: r->sp.top_p = (float)v; break;
  case LL_GF_MIN_P: r->sp.min_p = (float)v; break;
  case LL_GF_REPEAT_PENALTY: r->sp.repeat_penalty = (float)v; break;
  case LL_GF_FREQUENCY_PENALTY: r->sp.frequency_penalty = (float)v; break;
  case LL_GF_PRESENCE_PENALTY: r->sp.presence_penalty = (float)v; break;
  default: break;
  }
}

int ll_gen_set_str(struct ll_sched_req *r, const struct ll_gen_param *p, const char *s, size_t n, char *msg, size_t cap) {
  if (p->type == LL_GEN_NAME) {
    if (n >= sizeof r->adapter || ll_adapter_name_check(s, n) != 0)
      return ll_errf(msg, cap, LL_EINVAL, "parameter '%s': 1..%d bytes of [A-Za-z0-9._:-]", p->name, LL_ADAPTER_NAME_MAX);
    memcpy(r->adapter, s, n);
    r->adapter[n] = 0;
    return 0;
  }
  if (r->n_stops >= LL_MAX_STOP) return ll_errf(msg, cap, LL_EINVAL, "parameter 'stop': at most %d stop strings", LL_MAX_STOP);
  if (n == 0 || n > 256 || memchr(s, 0, n)) return ll_errf(msg, cap, LL_EINVAL, "parameter 'stop': 1..256 bytes without NUL");
  char *d = malloc(n + 1);
  if (!d) return ll_errf(msg, cap, LL_ENOMEM, "out of memory");
  memcpy(d, s, n);
  d[n] = 0;
  r->stops[r->n_stops++] = d;
  return 0;
}
