// llama2c.c - reader for llama2.c's legacy checkpoint (run.c's format).
//
// Layout: int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: the
// classifier is stored separately), seq_len; then fp32 arrays in this order:
//   token_embedding (vocab, dim), rms_att (L, dim), wq (L, dim, dim), wk (L, kv_dim, dim),
//   wv (L, kv_dim, dim), wo (L, dim, dim), rms_ffn (L, dim), w1 (L, hidden, dim),
//   w2 (L, dim, hidden), w3 (L, hidden, dim), rms_final (dim),
//   freq_cis_real + freq_cis_imag (seq_len * head_size / 2 each, unused), [wcls (vocab, dim)].
// Matrices are row-major (out, in), i.e. GGUF ne = {in, out}. run.c rotates adjacent pairs
// (x[2i], x[2i+1]) in RoPE, which is GGUF's "normal" llama ordering: no permutation needed.
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_error.h"
#include "ll_fileio.h"
#include "ll_quant.h"
#include "ll_readers.h"

#define L2C_MAX_DIM (1 << 16)
#define L2C_MAX_LAYERS 1024
#define L2C_MAX_VOCAB (1 << 22)
#define L2C_MAX_SEQ (1 << 22)

int ll_sha256_hex(const void *buf, size_t len, char out[65]) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  if (!EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32) return LL_EIO;
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

struct l2c_cursor {
  const unsigned char *base;
  uint64_t off, len;
};

// Add a tensor of ne = {ne0, ne1} f32 at the cursor and advance.
static int take(struct ll_modelfile *mf, struct l2c_cursor *c, const char *name, int64_t ne0, int64_t ne1, char *err, size_t errlen) {
  uint64_t bytes = (uint64_t)ne0 * (uint64_t)ne1 * 4u; // bounded by the header checks
  if (bytes > c->len - c->off)
    return ll_errf(err, errlen, LL_ETRUNC, "llama2c: file too short for tensor '%s' at offset %llu (need %llu bytes, %llu left)", name,
                   (unsigned long long)c->off, (unsigned long long)bytes, (unsigned long long)(c->len - c->off));
  int64_t ne[2] = {ne0, ne1};
  int rc = ll_mf_add_tensor(mf, name, LL_TYPE_F32, ne1 == 1 ? 1 : 2, ne, c->base + c->off);
  if (rc) return ll_errf(err, errlen, rc, "llama2c: tensor '%s': %s", name, ll_strerror(rc));
  mf->tensors[mf->n_tensors - 1].offset = c->off;
  c->off += bytes;
  return 0;
}

int ll_llama2c_parse(const void *buf, size_t len, struct ll_modelfile *mf, char *err, size_t errlen) {
  ll_modelfile_init(mf);
  int32_t h[7];
  if (len < sizeof h) return ll_errf(err, errlen, LL_ETRUNC, "llama2c: file of %zu bytes is shorter than the 28-byte header", len);
  memcpy(h, buf, sizeof h);
  const int32_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4], seq = h[6];
  const int shared = h[5] > 0;
  const int64_t vocab = h[5] < 0 ? -(int64_t)h[5] : h[5];
  static const char *const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  static const int64_t caps[7] = {L2C_MAX_DIM, 4 * L2C_MAX_DIM, L2C_MAX_LAYERS, L2C_MAX_DIM, L2C_MAX_DIM, L2C_MAX_VOCAB, L2C_MAX_SEQ};
  for (int i = 0; i < 7; i++) {
    int64_t v = i == 5 ? vocab : h[i];
    if (v <= 0 || v > caps[i])
      return ll_errf(err, errlen, LL_EFORMAT, "llama2c: header field %s = %d at offset %d is out of range 1..%lld", names[i], h[i], 4 * i,
                     (long long)caps[i]);
  }
  if (dim % n_heads != 0) return ll_errf(err, errlen, LL_EFORMAT, "llama2c: dim %d is not a multiple of n_heads %d", dim, n_heads);
  if (n_kv > n_heads || n_heads % n_kv != 0)
    return ll_errf(err, errlen, LL_EFORMAT, "llama2c: n_heads %d is not a multiple of n_kv_heads %d", n_heads, n_kv);
  const int64_t head = dim / n_heads, kv_dim = head * n_kv;
  if (head % 2) return ll_errf(err, errlen, LL_EFORMAT, "llama2c: head size %lld is odd", (long long)head);
  // Expected size (all products bounded: dim, hidden <= 2^18, layers <= 2^10, vocab, seq <= 2^22).
  uint64_t floats = (uint64_t)vocab * dim + (uint64_t)n_layers * ((uint64_t)dim * 2 + (uint64_t)dim * dim * 2 + (uint64_t)kv_dim * dim * 2 +
                                                                    (uint64_t)hidden * dim * 3) +
                    dim + (uint64_t)seq * (uint64_t)head;
  uint64_t expect = 28 + floats * 4, with_cls = expect + (uint64_t)vocab * dim * 4;
  if (len != expect && len != with_cls)
    return ll_errf(err, errlen, len < expect ? LL_ETRUNC : LL_EFORMAT,
                   "llama2c: file is %zu bytes; the header (dim %d, hidden %d, layers %d, heads %d/%d, vocab %lld, seq %d) implies %llu%s", len, dim,
                   hidden, n_layers, n_heads, n_kv, (long long)vocab, seq, (unsigned long long)expect,
                   shared ? "" : " plus a classifier");
  if (!shared && len != with_cls)
    return ll_errf(err, errlen, LL_ETRUNC, "llama2c: negative vocab_size promises a separate classifier, but the file ends before it");

  struct l2c_cursor c = {buf, 28, len};
  char name[64];
  int rc;
  if ((rc = take(mf, &c, "token_embd.weight", dim, vocab, err, errlen))) goto fail;
  // Per-kind arrays hold all layers back to back: take each layer's slice in turn.
  static const struct {
    const char *fmt;
    int rows_kind, cols_kind; // 0 = dim, 1 = kv_dim, 2 = hidden, 3 = one
  } kinds[] = {
      {"blk.%d.attn_norm.weight", 0, 3},   {"blk.%d.attn_q.weight", 0, 0},    {"blk.%d.attn_k.weight", 0, 1},
      {"blk.%d.attn_v.weight", 0, 1},      {"blk.%d.attn_output.weight", 0, 0}, {"blk.%d.ffn_norm.weight", 0, 3},
      {"blk.%d.ffn_gate.weight", 0, 2},    {"blk.%d.ffn_down.weight", 2, 0},  {"blk.%d.ffn_up.weight", 0, 2},
  };
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    const int64_t sz[4] = {dim, kv_dim, hidden, 1};
    for (int l = 0; l < n_layers; l++) {
      snprintf(name, sizeof name, kinds[k].fmt, l);
      if ((rc = take(mf, &c, name, sz[kinds[k].rows_kind], sz[kinds[k].cols_kind], err, errlen))) goto fail;
    }
  }
  if ((rc = take(mf, &c, "output_norm.weight", dim, 1, err, errlen))) goto fail;
  c.off += (uint64_t)seq * (uint64_t)head * 4; // freq_cis_real + freq_cis_imag (seq * head/2 each)
  if (!shared && (rc = take(mf, &c, "output.weight", dim, vocab, err, errlen))) goto fail;

  // Tensors were added per kind (all layers of one kind together); the engine looks them up by name.
  rc = 0;
  rc |= ll_mf_set_str(mf, "general.architecture", "llama");
  rc |= ll_mf_set_str(mf, "general.name", "llama2.c");
  rc |= ll_mf_set_u32(mf, "llama.context_length", (uint32_t)seq);
  rc |= ll_mf_set_u32(mf, "llama.embedding_length", (uint32_t)dim);
  rc |= ll_mf_set_u32(mf, "llama.feed_forward_length", (uint32_t)hidden);
  rc |= ll_mf_set_u32(mf, "llama.block_count", (uint32_t)n_layers);
  rc |= ll_mf_set_u32(mf, "llama.attention.head_count", (uint32_t)n_heads);
  rc |= ll_mf_set_u32(mf, "llama.attention.head_count_kv", (uint32_t)n_kv);
  rc |= ll_mf_set_u32(mf, "llama.rope.dimension_count", (uint32_t)head);
  rc |= ll_mf_set_f32(mf, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  rc |= ll_mf_set_f32(mf, "llama.rope.freq_base", 10000.0f);
  rc |= ll_mf_set_u32(mf, "llama.vocab_size", (uint32_t)vocab);
  rc |= ll_mf_set_u32(mf, "general.file_type", 0); // all f32
  if (rc) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "llama2c: out of memory");
    goto fail;
  }
  snprintf(mf->source_format, sizeof mf->source_format, "llama2c");
  return 0;
fail:
  ll_modelfile_free(mf);
  return rc;
}

int ll_llama2c_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen) {
  ll_modelfile_init(mf);
  void *map;
  size_t len;
  int mrc = ll_map_file(path, &map, &len, err, errlen);
  if (mrc) return mrc;
  char e2[384] = "";
  int rc = ll_llama2c_parse(map, len, mf, e2, sizeof e2);
  if (rc) {
    munmap(map, len);
    return ll_errf(err, errlen, rc, "%s: %s", path, e2);
  }
  ll_sha256_hex(map, len, mf->source_sha256);
  mf->backing = map;
  mf->backing_len = len;
  mf->backing_is_mmap = 1;
  return 0;
}
