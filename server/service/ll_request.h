// ll_request.h - the generation parameters of a request as ONE table, read by both protocols:
// the line protocol's GEN/CHAT key=value parameters (net.c) and the HTTP API's JSON fields
// (http.c). A new parameter is one row here plus its field in struct ll_sched_req.
#ifndef LL_REQUEST_H
#define LL_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "ll_sched.h"

enum ll_gen_type { LL_GEN_INT, LL_GEN_FLOAT, LL_GEN_BOOL, LL_GEN_NAME, LL_GEN_STOP };

enum ll_gen_field {
  LL_GF_MAX_TOKENS, LL_GF_TEMPERATURE, LL_GF_TOP_K, LL_GF_TOP_P, LL_GF_MIN_P, LL_GF_REPEAT_PENALTY, LL_GF_REPEAT_LAST_N,
  LL_GF_FREQUENCY_PENALTY, LL_GF_PRESENCE_PENALTY, LL_GF_SEED, LL_GF_LOGPROBS, LL_GF_IGNORE_EOS, LL_GF_ADD_BOS, LL_GF_SPECIAL,
  LL_GF_ADAPTER, LL_GF_STOP, LL_GF_ENABLE_THINKING,
};

struct ll_gen_param {
  const char *name;       // the line protocol's key ("temperature")
  const char *alias;      // another accepted key ("temp"), or NULL
  enum ll_gen_type type;
  int64_t imin, imax;     // LL_GEN_INT; imax < 0: the server's max_tokens option
  double fmin, fmax;      // LL_GEN_FLOAT
  enum ll_gen_field field;
};

extern const struct ll_gen_param ll_gen_params[]; // terminated by name == NULL

const struct ll_gen_param *ll_gen_param_find(const char *key);
// A request's defaults: sampler defaults, default_max_tokens, the model's BOS rule, special on.
// r->kind must be set first (CHAT parses special tokens only in its template's markers).
void ll_gen_defaults(struct ll_sched_req *r, int64_t default_max_tokens);
// Store a value already checked against the row's range (ints: imin..imax, floats: fmin..fmax).
void ll_gen_set_int(struct ll_sched_req *r, const struct ll_gen_param *p, int64_t v);
void ll_gen_set_float(struct ll_sched_req *r, const struct ll_gen_param *p, double v);
// A stop string (1..256 bytes without NUL, at most LL_MAX_STOP) or an adapter name
// ([A-Za-z0-9._:-], 1..LL_ADAPTER_NAME_MAX bytes). 0, or LL_EINVAL / LL_ENOMEM with a message naming the key.
int ll_gen_set_str(struct ll_sched_req *r, const struct ll_gen_param *p, const char *s, size_t n, char *msg, size_t cap);

#endif
