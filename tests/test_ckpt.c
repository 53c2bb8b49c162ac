// test_ckpt.c - .ckpt container: bit-exact round trip of every dtype and metadata type,
// roles and training state carried through, damage to each shard / the manifest / the header
// refused with a message naming it, truncation at many points refused, manifest parser limits.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_error.h"
#include "test_ckpt_common.h"

static char g_dir[512];

static void write_bytes(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(b, 1, n, f) == n);
  fclose(f);
}

static void test_round_trip(uint64_t *rng, int n_threads, uint64_t shard_target) {
  struct ll_modelfile mf, back;
  CHECK(tc_make_model(&mf, rng, 8, 7) == 0);
  char path[600], err[512] = "";
  snprintf(path, sizeof path, "%s/rt.ckpt", g_dir);
  struct ll_ckpt_write_opts o;
  ll_ckpt_write_opts_init(&o);
  o.n_threads = n_threads;
  o.shard_target = shard_target;
  o.no_fsync = 1;
  struct ll_ckpt_training tr = {1, 1234, 3e-4, 0xfedcba9876543210ull, 987654321};
  o.training = &tr;
  o.note = "unit test";
  int rc = ll_ckpt_write(path, &mf, &o, err, sizeof err);
  CHECKF(rc == 0, "write: %s", err);
  struct ll_ckpt_manifest man;
  ll_modelfile_init(&back);
  rc = ll_ckpt_open_ex(path, &back, &man, n_threads, err, sizeof err);
  CHECKF(rc == 0, "open: %s", err);
  if (rc == 0) {
    long kd = tc_kv_diff(&mf, &back), td = tc_tensor_diff(&mf, &back);
    CHECKF(kd < 0, "metadata differs at key %ld", kd);
    CHECKF(td < 0, "tensor %ld differs", td);
    for (uint64_t i = 0; i < back.n_tensors; i++)
      CHECKF(((uintptr_t)back.tensors[i].data & 63) == 0, "tensor %s not 64-byte aligned", back.tensors[i].name.ptr);
    CHECK(strcmp(back.source_format, "ckpt") == 0);
    CHECK(back.gguf_version == mf.gguf_version && back.alignment == mf.alignment);
    CHECK(man.training.present && man.training.step == 1234 && man.training.seed == 0xfedcba9876543210ull &&
          man.training.data_position == 987654321 && man.training.lr == 3e-4);
    CHECK(man.n_tensors == mf.n_tensors);
    int roles[LL_CKPT_ROLE_COUNT] = {0};
    for (uint64_t i = 0; i < man.n_tensors; i++) roles[man.tensors[i].role]++;
    CHECK(roles[LL_CKPT_ROLE_LORA_A] == 1 && roles[LL_CKPT_ROLE_LORA_B] == 1 && roles[LL_CKPT_ROLE_ADAM_M] == 1 &&
          roles[LL_CKPT_ROLE_ADAM_V] == 1);
    CHECK(man.arch && strcmp(man.arch, "llama") == 0 && man.n_layer == 2 && man.n_embd == 256 && man.n_tokens == 4);
    CHECK(man.note && strcmp(man.note, "unit test") == 0);
    if (shard_target && shard_target < 4096) CHECKF(man.n_shards > 5, "only %u shards with a %llu-byte target", man.n_shards,
                                    (unsigned long long)shard_target);
    // ckpt -> ckpt keeps everything too (the reader's output is a valid writer input).
    char path2[600];
    snprintf(path2, sizeof path2, "%s/rt2.ckpt", g_dir);
    CHECK(ll_ckpt_write(path2, &back, &o, err, sizeof err) == 0);
    struct ll_modelfile again;
    ll_modelfile_init(&again);
    CHECKF(ll_ckpt_open(path2, &again, 1, err, sizeof err) == 0, "%s", err);
    CHECK(tc_kv_diff(&mf, &again) < 0 && tc_tensor_diff(&mf, &again) < 0);
    ll_modelfile_free(&again);
    unlink(path2);
  }
  ll_ckpt_manifest_free(&man);
  ll_modelfile_free(&back);
  ll_modelfile_free(&mf);
  unlink(path);
}

// Flip one byte in every shard, in the manifest and in the header in turn.
static void test_damage(uint64_t *rng) {
  struct ll_modelfile mf, back;
  CHECK(tc_make_model(&mf, rng, 4, 1) == 0);
  char path[600], bad[600], err[512] = "";
  snprintf(path, sizeof path, "%s/dmg.ckpt", g_dir);
  snprintf(bad, sizeof bad, "%s/bad.ckpt", g_dir);
  struct ll_ckpt_write_opts o;
  ll_ckpt_write_opts_init(&o);
  o.shard_target = 2048;
  o.no_fsync = 1;
  CHECK(ll_ckpt_write(path, &mf, &o, err, sizeof err) == 0);
  struct ll_ckpt_manifest man;
  ll_modelfile_init(&back);
  int rc = ll_ckpt_open_ex(path, &back, &man, 2, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  ll_modelfile_free(&back);
  size_t len = 0;
  unsigned char *orig = ll_test_read_file(path, &len), *b = malloc(len);
  if (rc || !orig || !b) {
    free(orig);
    free(b);
    ll_modelfile_free(&mf);
    return;
  }
  for (uint32_t i = 0; i < man.n_shards; i++) {
    const struct ll_ckpt_shard_entry *s = &man.shards[i];
    memcpy(b, orig, len);
    uint64_t at = s->offset + ll_test_rand(rng) % s->csize;
    b[at] ^= (unsigned char)(1u << (ll_test_rand(rng) % 8));
    write_bytes(bad, b, len);
    char want[64], want2[1100];
    snprintf(want, sizeof want, "shard %u at file offset %llu", i, (unsigned long long)s->offset);
    const char *first = s->kind == LL_CKPT_SHARD_METADATA ? "(metadata)" : man.tensors[s->first_tensor].name;
    snprintf(want2, sizeof want2, "first tensor '%s'", first);
    rc = ll_ckpt_open(bad, &back, 3, err, sizeof err);
    CHECKF(rc == LL_ECHECKSUM && strstr(err, want) && strstr(err, want2),
           "flip at %llu in shard %u: rc %d, message: %s", (unsigned long long)at, i, rc, err);
    CHECK(back.n_tensors == 0 && back.backing == NULL);
  }
  // Manifest: every 97th byte.
  uint64_t moff = man.shards[man.n_shards - 1].offset + man.shards[man.n_shards - 1].csize;
  int nm = 0;
  for (uint64_t at = moff; at < len; at += 97, nm++) {
    memcpy(b, orig, len);
    b[at] ^= 0x20;
    write_bytes(bad, b, len);
    rc = ll_ckpt_open(bad, &back, 1, err, sizeof err);
    CHECKF(rc == LL_ECHECKSUM && strstr(err, "manifest"), "flip at manifest byte %llu: rc %d: %s",
           (unsigned long long)at, rc, err);
  }
  CHECK(nm > 3);
  // Header: every byte.
  for (unsigned at = 0; at < LL_CKPT_HEADER_SIZE; at++) {
    memcpy(b, orig, len);
    b[at] ^= 0x01;
    write_bytes(bad, b, len);
    rc = ll_ckpt_open(bad, &back, 1, err, sizeof err);
    CHECKF(rc != 0 && strstr(err, "header"), "flip at header byte %u: rc %d: %s", at, rc, err);
  }
  // Truncation at many points (and one trailing byte).
  int nt = 0;
  for (uint64_t cut = 0; cut < len; cut += 1 + ll_test_rand(rng) % (len / 60 + 1), nt++) {
    write_bytes(bad, orig, cut);
    rc = ll_ckpt_open(bad, &back, 2, err, sizeof err);
    CHECKF(rc == LL_ETRUNC || rc == LL_EFORMAT, "truncated to %llu of %zu bytes: rc %d: %s", (unsigned long long)cut,
           len, rc, err);
  }
  CHECK(nt > 40);
  memcpy(b, orig, len);
  FILE *f = fopen(bad, "wb");
  fwrite(orig, 1, len, f);
  fputc(0, f);
  fclose(f);
  rc = ll_ckpt_open(bad, &back, 1, err, sizeof err);
  CHECKF(rc == LL_EFORMAT && strstr(err, "trailing"), "trailing byte: rc %d: %s", rc, err);
  // Untouched copy still loads (the loop above did not damage the original).
  rc = ll_ckpt_open(path, &back, 2, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  ll_modelfile_free(&back);
  free(orig);
  free(b);
  ll_ckpt_manifest_free(&man);
  ll_modelfile_free(&mf);
  unlink(bad);
  unlink(path);
}

// Manifest parser: a valid minimal manifest and targeted violations of each bound.
static const char *k_ok =
    "{\"format\":\"llsrv-ckpt\",\"version\":1,\"gguf\":{\"version\":3,\"alignment\":32},"
    "\"metadata\":{\"encoding\":\"gguf-kv-v3\",\"shard\":0,\"n_kv\":0},"
    "\"shards\":[{\"kind\":\"metadata\",\"offset\":128,\"csize\":17,\"rsize\":8,"
    "\"csha256\":\"%s\",\"rsha256\":\"%s\"},"
    "{\"kind\":\"tensors\",\"offset\":145,\"csize\":%s,\"rsize\":%s,\"csha256\":\"%s\",\"rsha256\":\"%s\"}],"
    "\"tensors\":[{\"name\":\"a\",\"dtype\":\"%s\",\"shape\":[%s],\"role\":\"%s\",\"shard\":1,\"offset\":%s,\"size\":%s}]}";

static int parse_variant(const char *csize, const char *rsize, const char *dtype, const char *shape, const char *role,
                         const char *off, const char *size, char *err, size_t errlen) {
  const char *h = "0000000000000000000000000000000000000000000000000000000000000000";
  char buf[2048];
  snprintf(buf, sizeof buf, k_ok, h, h, csize, rsize, h, h, dtype, shape, role, off, size);
  struct ll_ckpt_manifest m;
  int rc = ll_ckpt_parse_manifest(buf, strlen(buf), &m, err, errlen);
  ll_ckpt_manifest_free(&m);
  return rc;
}

static void test_parser(void) {
  char err[512];
  int rc = parse_variant("20", "64", "f32", "16", "weight", "0", "64", err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  CHECK(parse_variant("20", "64", "f32", "16", "lora_b", "0", "64", err, sizeof err) == 0);
  CHECK(parse_variant("20", "64", "f32", "17", "weight", "0", "64", err, sizeof err) == LL_EFORMAT); // size vs shape
  CHECK(parse_variant("20", "64", "f32", "16", "weight", "64", "64", err, sizeof err) == LL_EFORMAT); // past shard
  CHECK(parse_variant("20", "64", "f32", "16", "weight", "1", "64", err, sizeof err) == LL_ELIMIT ||
        strstr(err, "misaligned"));
  CHECK(parse_variant("20", "64", "q4_0", "16", "weight", "0", "64", err, sizeof err) == LL_EFORMAT); // block
  CHECK(parse_variant("20", "64", "nope", "16", "weight", "0", "64", err, sizeof err) == LL_EUNSUPPORTED);
  CHECK(parse_variant("20", "64", "f32", "16", "adam_x", "0", "64", err, sizeof err) == LL_EFORMAT);
  CHECK(parse_variant("20", "64", "f32", "16,1,1,1,1", "weight", "0", "64", err, sizeof err) == LL_EFORMAT);
  CHECK(parse_variant("20", "64", "f32", "-16", "weight", "0", "64", err, sizeof err) == LL_EFORMAT);
  CHECK(parse_variant("20", "63", "f32", "16", "weight", "0", "64", err, sizeof err) == LL_EFORMAT); // rsize align
  // Raw size that 1 compressed byte cannot produce (bounded before any allocation).
  CHECK(parse_variant("1", "4294967296", "f32", "16", "weight", "0", "64", err, sizeof err) == LL_ELIMIT);
  CHECK(parse_variant("20", "99999999999999999999", "f32", "16", "weight", "0", "64", err, sizeof err) != 0);
  CHECK(parse_variant("20", "64", "f32", "1099511627776,1099511627776", "weight", "0", "64", err, sizeof err) ==
        LL_ELIMIT);
  struct ll_ckpt_manifest m;
  CHECK(ll_ckpt_parse_manifest("{", 1, &m, err, sizeof err) == LL_EFORMAT);
  ll_ckpt_manifest_free(&m);
  CHECK(ll_ckpt_parse_manifest("[]", 2, &m, err, sizeof err) == LL_EFORMAT);
  ll_ckpt_manifest_free(&m);
}

// A failed write leaves the previous file alone and no temporary file behind.
static void test_failed_write(uint64_t *rng) {
  struct ll_modelfile mf, back;
  char path[600], err[512];
  snprintf(path, sizeof path, "%s/keep.ckpt", g_dir);
  CHECK(tc_make_model(&mf, rng, 2, 3) == 0);
  struct ll_ckpt_write_opts o;
  ll_ckpt_write_opts_init(&o);
  o.no_fsync = 1;
  CHECK(ll_ckpt_write(path, &mf, &o, err, sizeof err) == 0);
  const void *saved = mf.tensors[1].data;
  mf.tensors[1].data = NULL; // invalid input -> error before anything is touched
  CHECK(ll_ckpt_write(path, &mf, &o, err, sizeof err) == LL_EINVAL);
  mf.tensors[1].data = saved;
  o.zstd_level = 99;
  CHECK(ll_ckpt_write(path, &mf, &o, err, sizeof err) == LL_EINVAL);
  o.zstd_level = 3;
  struct ll_ckpt_training bad_tr = {1, 1, NAN, 0, 0}; // NaN lr: JSON cannot hold it
  o.training = &bad_tr;
  CHECK(ll_ckpt_write(path, &mf, &o, err, sizeof err) == LL_EINVAL);
  o.training = NULL;
  ll_modelfile_init(&back);
  CHECKF(ll_ckpt_open(path, &back, 1, err, sizeof err) == 0, "%s", err);
  CHECK(tc_tensor_diff(&mf, &back) < 0);
  ll_modelfile_free(&back);
  char other[600];
  snprintf(other, sizeof other, "%s/no/such/dir/x.ckpt", g_dir);
  o.zstd_level = 3;
  CHECK(ll_ckpt_write(other, &mf, &o, err, sizeof err) == LL_EIO);
  ll_modelfile_free(&mf);
  unlink(path);
}

int main(void) {
  uint64_t rng = ll_test_seed();
  if (!ll_test_tmpdir(g_dir, sizeof g_dir)) {
    fprintf(stderr, "cannot create a temporary directory\n");
    return 1;
  }
  CHECK(strcmp(ll_ckpt_role_name(LL_CKPT_ROLE_ADAM_V), "adam_v") == 0);
  CHECK(ll_ckpt_role_from_tensor_name("blk.3.ffn_up.weight.lora_b") == LL_CKPT_ROLE_LORA_B);
  CHECK(ll_ckpt_role_from_tensor_name("lora_a") == LL_CKPT_ROLE_WEIGHT);
  test_round_trip(&rng, 1, 0);
  test_round_trip(&rng, 4, 1000);
  test_damage(&rng);
  test_parser();
  test_failed_write(&rng);
  rmdir(g_dir); // fails loudly below if a temporary file was left behind
  CHECKF(access(g_dir, F_OK) != 0, "temporary directory %s not empty (stray temp file?)", g_dir);
  return ll_test_summary();
}
