// safetensors.c - Hugging Face safetensors checkpoints (Llama / Qwen2 architectures).
//
// A safetensors file is: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [out, in], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data section. We map HF names to GGUF names, reverse the shape (GGUF ne[0] is the
// contiguous dimension), and permute the rows of q_proj / k_proj for Llama the way llama.cpp's
// converter does (HF checkpoints rotate halves; GGUF llama rotates adjacent pairs). Tensor bytes
// are copied into one heap block (mf->backing) since the permutation needs writable memory.
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_error.h"
#include "ll_quant.h"
#include "ll_readers.h"

#define ST_MAX_HEADER (100u << 20)
#define ST_MAX_SHARDS 256

static int st_dtype(const char *s) {
  if (strcmp(s, "F32") == 0) return LL_TYPE_F32;
  if (strcmp(s, "F16") == 0) return LL_TYPE_F16;
  if (strcmp(s, "BF16") == 0) return LL_TYPE_BF16;
  return -1;
}

int ll_safetensors_parse_header(const void *buf, size_t len, uint64_t file_len, struct ll_modelfile *mf, char *err, size_t errlen) {
  uint64_t n;
  if (len < 8) return ll_errf(err, errlen, LL_ETRUNC, "safetensors: file shorter than the 8-byte header length");
  memcpy(&n, buf, 8);
  if (n < 2 || n > ST_MAX_HEADER || n > len - 8 || n > file_len - 8)
    return ll_errf(err, errlen, LL_EFORMAT, "safetensors: header length %llu is out of range (file %llu bytes, limit %u)", (unsigned long long)n,
                   (unsigned long long)file_len, ST_MAX_HEADER);
  json_error_t je;
  json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
  if (!root) return ll_errf(err, errlen, LL_EFORMAT, "safetensors: header JSON: %s (line %d col %d)", je.text, je.line, je.column);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: header is not a JSON object");
    goto out;
  }
  const uint64_t data_start = 8 + n, data_len = file_len - data_start;
  const char *name;
  json_t *v;
  uint64_t first = mf->n_tensors;
  json_object_foreach(root, name, v) {
    if (strcmp(name, "__metadata__") == 0) continue;
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"), *of = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(of) || json_array_size(of) != 2) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tensor '%s': needs dtype, shape and data_offsets [begin, end]", name);
      goto out;
    }
    int type = st_dtype(json_string_value(dt));
    if (type < 0) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "safetensors: tensor '%s': dtype %s is not supported (F32, F16, BF16)", name,
                   json_string_value(dt));
      goto out;
    }
    size_t nd = json_array_size(sh);
    if (nd < 1 || nd > LL_MAX_DIMS) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tensor '%s': %zu dimensions (1..%d supported)", name, nd, LL_MAX_DIMS);
      goto out;
    }
    int64_t ne[LL_MAX_DIMS];
    uint64_t count = 1;
    for (size_t d = 0; d < nd; d++) {
      json_t *x = json_array_get(sh, d);
      if (!json_is_integer(x) || json_integer_value(x) <= 0 || json_integer_value(x) > (1ll << 40)) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tensor '%s': bad shape entry %zu", name, d);
        goto out;
      }
      ne[nd - 1 - d] = (int64_t)json_integer_value(x); // reverse: GGUF ne[0] is contiguous
      if (count > (1ull << 40) / (uint64_t)ne[nd - 1 - d]) {
        rc = ll_errf(err, errlen, LL_EOVERFLOW, "safetensors: tensor '%s': element count overflows", name);
        goto out;
      }
      count *= (uint64_t)ne[nd - 1 - d];
    }
    json_t *b = json_array_get(of, 0), *e = json_array_get(of, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b)) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tensor '%s': bad data_offsets", name);
      goto out;
    }
    uint64_t ob = (uint64_t)json_integer_value(b), oe = (uint64_t)json_integer_value(e);
    uint64_t es = type == LL_TYPE_F32 ? 4 : 2;
    if (oe > data_len) {
      rc = ll_errf(err, errlen, LL_ETRUNC, "safetensors: tensor '%s': data [%llu, %llu) exceeds the data section of %llu bytes", name,
                   (unsigned long long)ob, (unsigned long long)oe, (unsigned long long)data_len);
      goto out;
    }
    if (oe - ob != count * es) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tensor '%s': %llu data bytes but shape and dtype imply %llu", name,
                   (unsigned long long)(oe - ob), (unsigned long long)(count * es));
      goto out;
    }
    if ((rc = ll_mf_add_tensor(mf, name, type, (int)nd, ne, NULL))) {
      ll_errf(err, errlen, rc, "safetensors: tensor '%s': %s", name, ll_strerror(rc));
      goto out;
    }
    mf->tensors[mf->n_tensors - 1].offset = data_start + ob; // file offset
  }
  // Overlap check: sort this file's ranges.
  for (uint64_t i = first; i < mf->n_tensors; i++)
    for (uint64_t j = i + 1; j < mf->n_tensors && j < i + 4096; j++) {
      const struct ll_tensor_info *a = &mf->tensors[i], *c = &mf->tensors[j];
      if (a->nbytes && c->nbytes && a->offset < c->offset + c->nbytes && c->offset < a->offset + a->nbytes) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tensors '%s' and '%s' overlap", a->name.ptr, c->name.ptr);
        goto out;
      }
    }
out:
  json_decref(root);
  return rc;
}

// ---------------------------------------------------------------- HF -> GGUF names

static int map_name(const char *hf, char *out, size_t cap, int *kind) {
  int l;
  char rest[160];
  *kind = 0; // 1 = q (permute with n_head), 2 = k (permute with n_head_kv)
  if (strcmp(hf, "model.embed_tokens.weight") == 0) return snprintf(out, cap, "token_embd.weight"), 1;
  if (strcmp(hf, "model.norm.weight") == 0) return snprintf(out, cap, "output_norm.weight"), 1;
  if (strcmp(hf, "lm_head.weight") == 0) return snprintf(out, cap, "output.weight"), 1;
  if (sscanf(hf, "model.layers.%d.%159s", &l, rest) != 2 || l < 0 || l > 100000) return 0;
  static const struct { const char *hf, *gg; int kind; } m[] = {
      {"input_layernorm.weight", "attn_norm.weight", 0}, {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
      {"self_attn.q_proj.weight", "attn_q.weight", 1},   {"self_attn.k_proj.weight", "attn_k.weight", 2},
      {"self_attn.v_proj.weight", "attn_v.weight", 0},   {"self_attn.o_proj.weight", "attn_output.weight", 0},
      {"self_attn.q_proj.bias", "attn_q.bias", 1},       {"self_attn.k_proj.bias", "attn_k.bias", 2},
      {"self_attn.v_proj.bias", "attn_v.bias", 0},       {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
      {"mlp.up_proj.weight", "ffn_up.weight", 0},        {"mlp.down_proj.weight", "ffn_down.weight", 0},
  };
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (strcmp(rest, m[i].hf) == 0) {
      *kind = m[i].kind;
      snprintf(out, cap, "blk.%d.%s", l, m[i].gg);
      return 1;
    }
  return 0;
}

static json_t *load_json_file(const char *dir, const char *name, char *err, size_t errlen, int required) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  struct stat st;
  if (stat(p, &st) != 0) {
    if (required) ll_errf(err, errlen, LL_ENOTFOUND, "safetensors: %s not found", p);
    return NULL;
  }
  if (st.st_size > (64 << 20)) {
    ll_errf(err, errlen, LL_ELIMIT, "safetensors: %s is larger than 64 MiB", p);
    return NULL;
  }
  json_error_t je;
  json_t *j = json_load_file(p, 0, &je);
  if (!j) ll_errf(err, errlen, LL_EFORMAT, "safetensors: %s: %s (line %d)", p, je.text, je.line);
  return j;
}

static int jint(json_t *o, const char *k, int64_t dflt) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (int)json_integer_value(v) : (int)dflt;
}

// Token id of a tokenizer_config special (string or {"content": ...}) via the vocab.
static int64_t special_id(json_t *tcfg, const char *key, json_t *vocab, json_t *added) {
  json_t *v = json_object_get(tcfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  if (!json_is_string(v)) return -1;
  const char *s = json_string_value(v);
  size_t i;
  json_t *a;
  json_array_foreach(added, i, a) {
    json_t *c = json_object_get(a, "content");
    if (json_is_string(c) && strcmp(json_string_value(c), s) == 0) return json_integer_value(json_object_get(a, "id"));
  }
  json_t *id = json_object_get(vocab, s);
  return json_is_integer(id) ? json_integer_value(id) : -1;
}

static int load_tokenizer(const char *dir, struct ll_modelfile *mf, int64_t vocab_size, char *err, size_t errlen) {
  json_t *tj = load_json_file(dir, "tokenizer.json", err, errlen, 0);
  if (!tj) return 0; // optional
  int rc = 0;
  json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
  json_t *added = json_object_get(tj, "added_tokens");
  const char *mtype = json_string_value(json_object_get(model, "type"));
  if (!mtype || strcmp(mtype, "BPE") != 0 || !json_is_object(vocab) || !json_is_array(merges)) {
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "safetensors: tokenizer.json: only byte-level BPE tokenizers are supported");
    goto out;
  }
  int64_t n = vocab_size;
  const char *k;
  json_t *v;
  json_object_foreach(vocab, k, v) if (json_is_integer(v) && json_integer_value(v) >= n) n = json_integer_value(v) + 1;
  size_t ai;
  json_t *a;
  json_array_foreach(added, ai, a) {
    json_t *id = json_object_get(a, "id");
    if (json_is_integer(id) && json_integer_value(id) >= n) n = json_integer_value(id) + 1;
  }
  if (n <= 0 || n > (1 << 22)) {
    rc = ll_errf(err, errlen, LL_ELIMIT, "safetensors: tokenizer.json: vocabulary size %lld out of range", (long long)n);
    goto out;
  }
  const char **toks = calloc((size_t)n, sizeof *toks);
  int32_t *types = calloc((size_t)n, sizeof *types);
  char (*pads)[32] = calloc((size_t)n, 32);
  size_t nm = json_array_size(merges);
  const char **ms = calloc(nm ? nm : 1, sizeof *ms);
  char **mown = calloc(nm ? nm : 1, sizeof *mown);
  if (!toks || !types || !pads || !ms || !mown) {
    rc = LL_ENOMEM;
    goto free_all;
  }
  json_object_foreach(vocab, k, v) if (json_is_integer(v) && json_integer_value(v) >= 0) {
    toks[json_integer_value(v)] = k;
    types[json_integer_value(v)] = 1;
  }
  json_array_foreach(added, ai, a) {
    json_t *id = json_object_get(a, "id"), *c = json_object_get(a, "content");
    if (!json_is_integer(id) || !json_is_string(c) || json_integer_value(id) < 0) continue;
    toks[json_integer_value(id)] = json_string_value(c);
    types[json_integer_value(id)] = json_is_true(json_object_get(a, "special")) ? 3 : 4;
  }
  for (int64_t i = 0; i < n; i++)
    if (!toks[i]) {
      snprintf(pads[i], 32, "[PAD%lld]", (long long)i);
      toks[i] = pads[i];
      types[i] = 5;
    }
  for (size_t i = 0; i < nm; i++) {
    json_t *m = json_array_get(merges, i);
    if (json_is_string(m)) {
      ms[i] = json_string_value(m);
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
      const char *x = json_string_value(json_array_get(m, 0)), *y = json_string_value(json_array_get(m, 1));
      mown[i] = malloc(strlen(x) + strlen(y) + 2);
      if (!mown[i]) {
        rc = LL_ENOMEM;
        goto free_all;
      }
      sprintf(mown[i], "%s %s", x, y);
      ms[i] = mown[i];
    } else {
      rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: tokenizer.json: merge %zu is neither \"a b\" nor [a, b]", i);
      goto free_all;
    }
  }
  rc |= ll_mf_set_str(mf, "tokenizer.ggml.model", "gpt2");
  // Pre-tokenizer: llama-3 style regex split if present, else GPT-2's.
  {
    char *dump = json_dumps(json_object_get(tj, "pre_tokenizer"), JSON_COMPACT);
    const char *pre = "gpt-2";
    if (dump && strstr(dump, "\\\\p{N}{1,3}")) pre = "llama-bpe";
    else if (dump && strstr(dump, "\"Digits\"")) pre = "smollm";
    rc |= ll_mf_set_str(mf, "tokenizer.ggml.pre", pre);
    free(dump);
  }
  rc |= ll_mf_set_arr(mf, "tokenizer.ggml.tokens", LL_KV_STR, toks, (uint64_t)n);
  rc |= ll_mf_set_arr(mf, "tokenizer.ggml.token_type", LL_KV_I32, types, (uint64_t)n);
  rc |= ll_mf_set_arr(mf, "tokenizer.ggml.merges", LL_KV_STR, ms, nm);
  json_t *tcfg = load_json_file(dir, "tokenizer_config.json", err, errlen, 0);
  if (tcfg) {
    int64_t b = special_id(tcfg, "bos_token", vocab, added), e = special_id(tcfg, "eos_token", vocab, added);
    if (b >= 0) rc |= ll_mf_set_u32(mf, "tokenizer.ggml.bos_token_id", (uint32_t)b);
    if (e >= 0) rc |= ll_mf_set_u32(mf, "tokenizer.ggml.eos_token_id", (uint32_t)e);
    json_t *ct = json_object_get(tcfg, "chat_template");
    if (json_is_string(ct)) rc |= ll_mf_set_str(mf, "tokenizer.chat_template", json_string_value(ct));
    json_t *ab = json_object_get(tcfg, "add_bos_token");
    if (json_is_boolean(ab)) rc |= ll_mf_set_bool(mf, "tokenizer.ggml.add_bos_token", json_is_true(ab));
    json_decref(tcfg);
  }
  if (rc) rc = ll_errf(err, errlen, LL_ENOMEM, "safetensors: out of memory building tokenizer metadata");
free_all:
  for (size_t i = 0; mown && i < nm; i++) free(mown[i]);
  free(mown);
  free(ms);
  free(pads);
  free(types);
  free(toks);
out:
  json_decref(tj);
  return rc;
}

// ---------------------------------------------------------------- open

int ll_safetensors_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen) {
  ll_modelfile_init(mf);
  char dir[4096], files[ST_MAX_SHARDS][512];
  int nfiles = 0, rc = 0;
  struct stat st;
  if (stat(path, &st) != 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  json_t *index = NULL;
  if (S_ISDIR(st.st_mode)) {
    snprintf(dir, sizeof dir, "%s", path);
    index = load_json_file(dir, "model.safetensors.index.json", err, errlen, 0);
    if (index) {
      const char *k;
      json_t *v;
      json_object_foreach(json_object_get(index, "weight_map"), k, v) {
        if (!json_is_string(v) || strchr(json_string_value(v), '/')) continue;
        int seen = 0;
        for (int i = 0; i < nfiles; i++) seen |= strcmp(files[i], json_string_value(v)) == 0;
        if (!seen && nfiles < ST_MAX_SHARDS) snprintf(files[nfiles++], 512, "%s", json_string_value(v));
      }
      json_decref(index);
    } else {
      snprintf(files[nfiles++], 512, "model.safetensors");
    }
  } else {
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    snprintf(files[nfiles++], 512, "%s", slash ? slash + 1 : path);
  }
  json_t *cfg = load_json_file(dir, "config.json", err, errlen, 1);
  if (!cfg) return LL_ENOTFOUND;
  const char *archname = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
  const char *arch = NULL;
  if (archname && (strcmp(archname, "LlamaForCausalLM") == 0 || strcmp(archname, "MistralForCausalLM") == 0)) arch = "llama";
  if (archname && strcmp(archname, "Qwen2ForCausalLM") == 0) arch = "qwen2";
  if (!arch) {
    ll_errf(err, errlen, LL_EUNSUPPORTED, "safetensors: %s/config.json: architecture '%s' is not supported (Llama, Qwen2)", dir,
            archname ? archname : "?");
    json_decref(cfg); // archname points into cfg: format the message first
    return LL_EUNSUPPORTED;
  }
  const int n_embd = jint(cfg, "hidden_size", 0), n_ff = jint(cfg, "intermediate_size", 0), n_layer = jint(cfg, "num_hidden_layers", 0);
  const int n_head = jint(cfg, "num_attention_heads", 0), n_head_kv = jint(cfg, "num_key_value_heads", n_head);
  const int64_t vocab_size = jint(cfg, "vocab_size", 0);
  if (n_embd <= 0 || n_ff <= 0 || n_layer <= 0 || n_head <= 0 || n_head_kv <= 0 || n_embd % n_head || n_head % n_head_kv ||
      (n_embd / n_head) % 2) {
    json_decref(cfg);
    return ll_errf(err, errlen, LL_EFORMAT, "safetensors: %s/config.json: inconsistent hidden_size / heads / layers", dir);
  }
  const int permute = strcmp(arch, "llama") == 0;

  // Pass 1: headers of every shard; collect tensors with file offsets.
  struct ll_modelfile raw;
  ll_modelfile_init(&raw);
  int *owner = NULL;
  uint64_t total = 0;
  for (int f = 0; f < nfiles && rc == 0; f++) {
    char p[4700];
    snprintf(p, sizeof p, "%.4000s/%.511s", dir, files[f]);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      rc = ll_errf(err, errlen, LL_EIO, "safetensors: %s: %s", p, strerror(errno));
      break;
    }
    struct stat fs;
    fstat(fd, &fs);
    void *map = fs.st_size > 0 ? mmap(NULL, (size_t)fs.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) {
      rc = ll_errf(err, errlen, LL_EIO, "safetensors: %s: cannot map", p);
      break;
    }
    uint64_t before = raw.n_tensors;
    char e2[384] = "";
    rc = ll_safetensors_parse_header(map, (size_t)fs.st_size, (uint64_t)fs.st_size, &raw, e2, sizeof e2);
    if (rc) {
      ll_errf(err, errlen, rc, "%s: %s", p, e2);
      munmap(map, (size_t)fs.st_size);
      break;
    }
    int *no = realloc(owner, raw.n_tensors * sizeof *owner + 1);
    if (!no) {
      rc = LL_ENOMEM;
      munmap(map, (size_t)fs.st_size);
      break;
    }
    owner = no;
    // Copy this shard's tensor bytes now (while mapped) into per-tensor heap blocks.
    for (uint64_t i = before; i < raw.n_tensors; i++) {
      owner[i] = f;
      void *copy = malloc(raw.tensors[i].nbytes ? raw.tensors[i].nbytes : 1);
      if (!copy) {
        rc = LL_ENOMEM;
        break;
      }
      memcpy(copy, (const char *)map + raw.tensors[i].offset, raw.tensors[i].nbytes);
      raw.tensors[i].data = copy;
      total += raw.tensors[i].nbytes;
    }
    munmap(map, (size_t)fs.st_size);
  }
  // Pass 2: one backing block, GGUF names, q/k permutation.
  unsigned char *backing = NULL;
  if (rc == 0 && !(backing = malloc(total ? total : 1))) rc = LL_ENOMEM;
  uint64_t off = 0;
  for (uint64_t i = 0; rc == 0 && i < raw.n_tensors; i++) {
    const struct ll_tensor_info *t = &raw.tensors[i];
    char gname[192];
    int kind;
    if (!map_name(t->name.ptr, gname, sizeof gname, &kind)) continue; // e.g. rotary_emb.inv_freq
    unsigned char *dst = backing + off;
    const unsigned char *src = t->data;
    if (permute && kind) {
      // rows: heads of hd rows; HF row h*hd + i*hd/2 + j -> GGUF row h*hd + 2j + i.
      const int heads = kind == 1 ? n_head : n_head_kv;
      const int64_t rows = t->ne[1] > 1 || t->n_dims > 1 ? t->ne[1] : t->ne[0];
      const size_t rowb = t->n_dims > 1 ? (size_t)(t->nbytes / (uint64_t)rows) : (t->type == LL_TYPE_F32 ? 4 : 2);
      if (rows % heads || (rows / heads) % 2) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "safetensors: %s: %lld rows do not split into %d heads", t->name.ptr, (long long)rows, heads);
        break;
      }
      const int64_t hd = rows / heads;
      for (int64_t h = 0; h < heads; h++)
        for (int64_t ii = 0; ii < 2; ii++)
          for (int64_t j = 0; j < hd / 2; j++)
            memcpy(dst + (size_t)(h * hd + 2 * j + ii) * rowb, src + (size_t)(h * hd + ii * hd / 2 + j) * rowb, rowb);
    } else {
      memcpy(dst, src, t->nbytes);
    }
    if ((rc = ll_mf_add_tensor(mf, gname, t->type, t->n_dims, t->ne, dst))) {
      ll_errf(err, errlen, rc, "safetensors: %s: %s", gname, ll_strerror(rc));
      break;
    }
    off += t->nbytes;
  }
  for (uint64_t i = 0; i < raw.n_tensors; i++) free((void *)raw.tensors[i].data), raw.tensors[i].data = NULL;
  ll_modelfile_free(&raw);
  free(owner);
  if (rc == 0) {
    mf->backing = backing;
    mf->backing_len = total;
    mf->backing_is_mmap = 0;
    backing = NULL;
    char key[128];
#define SETU(suffix, val) (snprintf(key, sizeof key, "%s." suffix, arch), ll_mf_set_u32(mf, key, (uint32_t)(val)))
#define SETF(suffix, val) (snprintf(key, sizeof key, "%s." suffix, arch), ll_mf_set_f32(mf, key, (float)(val)))
    rc |= ll_mf_set_str(mf, "general.architecture", arch);
    rc |= ll_mf_set_str(mf, "general.name", json_string_value(json_object_get(cfg, "_name_or_path")) ? json_string_value(json_object_get(cfg, "_name_or_path")) : dir);
    rc |= SETU("context_length", jint(cfg, "max_position_embeddings", 2048));
    rc |= SETU("embedding_length", n_embd);
    rc |= SETU("feed_forward_length", n_ff);
    rc |= SETU("block_count", n_layer);
    rc |= SETU("attention.head_count", n_head);
    rc |= SETU("attention.head_count_kv", n_head_kv);
    rc |= SETU("rope.dimension_count", n_embd / n_head);
    json_t *eps = json_object_get(cfg, "rms_norm_eps"), *theta = json_object_get(cfg, "rope_theta");
    rc |= SETF("attention.layer_norm_rms_epsilon", json_is_number(eps) ? json_number_value(eps) : 1e-6);
    rc |= SETF("rope.freq_base", json_is_number(theta) ? json_number_value(theta) : 10000.0);
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (json_is_object(rs)) {
      const char *rt = json_string_value(json_object_get(rs, "rope_type"));
      if (!rt) rt = json_string_value(json_object_get(rs, "type"));
      json_t *fac = json_object_get(rs, "factor");
      if (rt && strcmp(rt, "linear") == 0 && json_is_number(fac)) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        rc |= ll_mf_set_str(mf, key, "linear");
        rc |= SETF("rope.scaling.factor", json_number_value(fac));
      } else if (rt) {
        rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "safetensors: rope_scaling type '%s' is not supported yet (linear)", rt);
      }
    }
#undef SETU
#undef SETF
    if (rc == 0) rc = load_tokenizer(dir, mf, vocab_size, err, errlen);
    snprintf(mf->source_format, sizeof mf->source_format, "safetensors");
  }
  free(backing);
  json_decref(cfg);
  if (rc) ll_modelfile_free(mf);
  return rc;
}
