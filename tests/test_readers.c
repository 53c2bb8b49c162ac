// test_readers.c - llama2.c .bin and safetensors readers, and format detection.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ll_error.h"
#include "ll_quant.h"
#include "ll_readers.h"
#include "testutil.h"

static void test_stories(void) {
  char path[4096], err[512];
  if (!ll_test_shared_path("testdata/models/stories260K.bin", path, sizeof path)) {
    printf("../shared/testdata/models/stories260K.bin absent: skipping the llama2.c real-file part\n");
    return;
  }
  struct ll_modelfile mf;
  CHECKF(ll_model_open(path, &mf, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(mf.source_format, "llama2c") == 0);
  CHECK(strcmp(mf.source_sha256, "9414d5a285453a7eab631713d171753232c978f6f97654211469aff8be93c8d6") == 0);
  int64_t v;
  CHECK(ll_mf_get_arch_int(&mf, "embedding_length", &v) == 0 && v == 64);
  CHECK(ll_mf_get_arch_int(&mf, "block_count", &v) == 0 && v == 5);
  CHECK(ll_mf_get_arch_int(&mf, "attention.head_count", &v) == 0 && v == 8);
  CHECK(ll_mf_get_arch_int(&mf, "attention.head_count_kv", &v) == 0 && v == 4);
  CHECK(ll_mf_get_arch_int(&mf, "context_length", &v) == 0 && v == 512);
  CHECK(mf.n_tensors == 1 + 5 * 9 + 1); // shared classifier: no output.weight
  const struct ll_tensor_info *k = ll_mf_find_tensor(&mf, "blk.3.attn_k.weight");
  CHECK(k && k->ne[0] == 64 && k->ne[1] == 32 && k->type == LL_TYPE_F32);
  CHECK(ll_mf_find_tensor(&mf, "output.weight") == NULL);
  // Values: read the file directly at offsets computed here from run.c's layout.
  size_t len;
  unsigned char *raw = ll_test_read_file(path, &len);
  CHECK(raw != NULL);
  if (raw) {
    const int dim = 64, hidden = 172, L = 5, vocab = 512, kv = 32;
    size_t off = 28 + (size_t)vocab * dim * 4 + (size_t)L * dim * 4 + (size_t)L * dim * dim * 4 + 3 * (size_t)kv * dim * 4;
    // that is blk.3.attn_k.weight's first float: after tok_embd, rms_att, wq, and wk of layers 0..2
    float want;
    memcpy(&want, raw + off, 4);
    CHECK(k && ((const float *)k->data)[0] == want);
    const struct ll_tensor_info *w2 = ll_mf_find_tensor(&mf, "blk.4.ffn_down.weight");
    CHECK(w2 && w2->ne[0] == hidden && w2->ne[1] == dim);
    // Every malformed header class is refused with a message naming the field.
    unsigned char *bad = malloc(len);
    struct ll_modelfile m2;
    const struct { int field; int32_t val; const char *needle; } cases[] = {
        {0, 0, "dim"}, {0, -64, "dim"}, {1, 0, "hidden_dim"}, {2, 1 << 20, "n_layers"}, {3, 7, "n_heads"},
        {4, 3, "n_kv_heads"}, {4, 16, "n_kv_heads"}, {5, 0, "vocab_size"}, {6, -1, "seq_len"}, {6, 511, "implies"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      memcpy(bad, raw, len);
      memcpy(bad + 4 * cases[i].field, &cases[i].val, 4);
      int rc = ll_llama2c_parse(bad, len, &m2, err, sizeof err);
      CHECKF(rc != 0 && strstr(err, cases[i].needle), "case %zu: rc %d, '%s'", i, rc, err);
      if (rc == 0) ll_modelfile_free(&m2);
    }
    // Truncation anywhere (dense sample) and one extra byte are refused.
    int refused = 0, tries = 0;
    for (size_t cut = 0; cut < len; cut += 997, tries++) refused += ll_llama2c_parse(raw, cut, &m2, err, sizeof err) != 0;
    CHECK(refused == tries);
    free(bad);
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, raw, len);
    CHECK(ll_llama2c_parse(longer, len + 1, &m2, err, sizeof err) == LL_EFORMAT);
    free(longer);
    free(raw);
  }
  ll_modelfile_free(&mf);
}

// ---- safetensors --------------------------------------------------------------------

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  fwrite(p, 1, n, f);
  fclose(f);
}

// A tiny Llama: hidden 8, 2 heads (head dim 4), 1 kv head, 1 layer, ff 16, vocab 6.
static void test_safetensors(uint64_t *rs) {
  char dir[256], err[512];
  CHECK(ll_test_tmpdir(dir, sizeof dir) != NULL);
  const char *cfg = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
                    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":6,"
                    "\"max_position_embeddings\":64,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0}";
  write_file(dir, "config.json", cfg, strlen(cfg));
  const char *tok = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3},\"merges\":[\"a b\"]},"
                    "\"added_tokens\":[{\"id\":4,\"content\":\"<s>\",\"special\":true},{\"id\":5,\"content\":\"</s>\",\"special\":true}],"
                    "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
  write_file(dir, "tokenizer.json", tok, strlen(tok));
  const char *tcfg = "{\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"</s>\"},\"chat_template\":\"{{x}}\"}";
  write_file(dir, "tokenizer_config.json", tcfg, strlen(tcfg));
  // Tensors: q_proj F32 (8, 8), k_proj F16 (4, 8), embed BF16 (6, 8), norm F32 (8).
  static float q[64], nrm[8];
  static uint16_t k[32], emb[48];
  for (int i = 0; i < 64; i++) q[i] = (float)i;
  for (int i = 0; i < 32; i++) k[i] = ll_fp32_to_fp16((float)i);
  for (int i = 0; i < 48; i++) emb[i] = ll_fp32_to_bf16(ll_test_randf(rs));
  for (int i = 0; i < 8; i++) nrm[i] = 1.0f + i;
  char hdr[1024];
  int hl = snprintf(hdr, sizeof hdr,
                    "{\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"F32\",\"shape\":[8,8],\"data_offsets\":[0,256]},"
                    "\"model.layers.0.self_attn.k_proj.weight\":{\"dtype\":\"F16\",\"shape\":[4,8],\"data_offsets\":[256,320]},"
                    "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[6,8],\"data_offsets\":[320,416]},"
                    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[416,448]},"
                    "\"model.layers.0.self_attn.rotary_emb.inv_freq\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[448,456]},"
                    "\"__metadata__\":{\"format\":\"pt\"}}");
  static unsigned char file[4096];
  uint64_t n = (uint64_t)hl;
  memcpy(file, &n, 8);
  memcpy(file + 8, hdr, (size_t)hl);
  size_t o = 8 + (size_t)hl;
  memcpy(file + o, q, 256), memcpy(file + o + 256, k, 64), memcpy(file + o + 320, emb, 96), memcpy(file + o + 416, nrm, 32);
  memset(file + o + 448, 0, 8);
  write_file(dir, "model.safetensors", file, o + 456);

  struct ll_modelfile mf;
  int rc = ll_model_open(dir, &mf, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  if (rc == 0) {
    CHECK(strcmp(mf.source_format, "safetensors") == 0);
    const struct ll_tensor_info *tq = ll_mf_find_tensor(&mf, "blk.0.attn_q.weight"), *tk = ll_mf_find_tensor(&mf, "blk.0.attn_k.weight");
    CHECK(tq && tq->ne[0] == 8 && tq->ne[1] == 8 && tq->type == LL_TYPE_F32);
    CHECK(tk && tk->ne[0] == 8 && tk->ne[1] == 4 && tk->type == LL_TYPE_F16);
    CHECK(ll_mf_find_tensor(&mf, "token_embd.weight") && ll_mf_find_tensor(&mf, "output_norm.weight"));
    CHECK(mf.n_tensors == 4); // inv_freq dropped
    // Independent permutation: GGUF row h*hd + 2j + i holds HF row h*hd + i*hd/2 + j.
    int okq = 1, okk = 1;
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
          for (int c = 0; c < 8; c++) okq &= ((const float *)tq->data)[(h * 4 + 2 * j + i) * 8 + c] == q[(h * 4 + i * 2 + j) * 8 + c];
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++)
        for (int c = 0; c < 8; c++) okk &= ((const uint16_t *)tk->data)[(2 * j + i) * 8 + c] == k[(i * 2 + j) * 8 + c];
    CHECK(okq && okk);
    int64_t v;
    double fv;
    const char *s;
    CHECK(ll_mf_get_arch_int(&mf, "attention.head_count_kv", &v) == 0 && v == 1);
    CHECK(ll_mf_get_arch_float(&mf, "rope.freq_base", &fv) == 0 && fv == 500000.0);
    CHECK(ll_mf_get_str(&mf, "tokenizer.ggml.model", &s) == 0 && strcmp(s, "gpt2") == 0);
    CHECK(ll_mf_get_int(&mf, "tokenizer.ggml.bos_token_id", &v) == 0 && v == 4);
    CHECK(ll_mf_get_int(&mf, "tokenizer.ggml.eos_token_id", &v) == 0 && v == 5);
    CHECK(ll_mf_get_str(&mf, "tokenizer.chat_template", &s) == 0 && strcmp(s, "{{x}}") == 0);
    ll_modelfile_free(&mf);
  }
  // Malformed headers.
  const char *bad[] = {
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,9999]}}",  // out of range
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",     // wrong size
      "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",     // unsupported dtype
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},",  // bad JSON
      "[1,2]",
  };
  const char *needles[] = {"exceeds", "imply", "I64", "overlap", "JSON", "object"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    unsigned char b2[512];
    uint64_t l = strlen(bad[i]);
    memcpy(b2, &l, 8);
    memcpy(b2 + 8, bad[i], l);
    memset(b2 + 8 + l, 0, 16);
    struct ll_modelfile m2;
    ll_modelfile_init(&m2);
    rc = ll_safetensors_parse_header(b2, 8 + l + 16, 8 + l + 16, &m2, err, sizeof err);
    CHECKF(rc != 0 && strstr(err, needles[i]), "bad header %zu: rc %d '%s'", i, rc, err);
    ll_modelfile_free(&m2);
  }
  uint64_t huge = 1ull << 50;
  unsigned char b3[16];
  memcpy(b3, &huge, 8);
  struct ll_modelfile m3;
  ll_modelfile_init(&m3);
  CHECK(ll_safetensors_parse_header(b3, 16, 16, &m3, err, sizeof err) == LL_EFORMAT);
  ll_modelfile_free(&m3);
  // An unsupported architecture is named.
  const char *cfg2 = "{\"architectures\":[\"GPTNeoXForCausalLM\"]}";
  write_file(dir, "config.json", cfg2, strlen(cfg2));
  rc = ll_model_open(dir, &mf, err, sizeof err);
  CHECKF(rc == LL_EUNSUPPORTED && strstr(err, "GPTNeoX"), "rc %d: %s", rc, err);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  uint64_t rs = ll_test_seed();
  test_stories();
  test_safetensors(&rs);
  return ll_test_summary();
}
