// test_demo.c - the embedded default model: state directory resolution (0700, env fallbacks,
// refusing non-directories), demo.ckpt created once and reused, the engine opens it, its
// byte-level tokenizer round-trips arbitrary bytes, greedy decoding is deterministic, and
// two independent creations hold identical tensors.
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ll_demo.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_modelfile.h"
#include "ll_tokenizer.h"
#include "testutil.h"

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(p);
}

static struct ll_engine *open_engine(const char *path) {
  char err[512];
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = path;
  ep.n_threads = 2;
  ep.n_ctx = 64;
  ep.device = "cpu";
  struct ll_engine *e = NULL;
  int rc = ll_engine_open(&e, &ep, err, sizeof err);
  CHECKF(rc == 0, "engine open %s: %s", path, err);
  return rc == 0 ? e : NULL;
}

// Greedy decode of n ids after BOS + prompt; last_logits gets the final step's logits (bitwise
// comparable across engines: the same weights and the same single-threaded-order kernels).
static void greedy(struct ll_engine *e, const char *prompt, int32_t *ids, int n, float *last_logits) {
  const int V = ll_engine_n_vocab(e);
  float *logits = malloc((size_t)V * sizeof *logits);
  char err[256];
  int seq = ll_engine_seq_new(e);
  int32_t in[64];
  int np = ll_tokenize(ll_engine_tokenizer(e), prompt, strlen(prompt), 1, 0, in, 64);
  CHECK(np > 0 && np <= 64);
  for (int i = 0; i < n; i++) {
    struct ll_batch_item it = {seq, i == 0 ? np : 1, in, 1, logits, NULL};
    int rc = ll_engine_decode(e, &it, 1, err, sizeof err);
    CHECKF(rc == 0, "decode step %d: %s", i, err);
    int b = 0;
    for (int j = 1; j < V; j++) b = logits[j] > logits[b] ? j : b;
    ids[i] = in[0] = b;
  }
  memcpy(last_logits, logits, (size_t)V * sizeof *logits);
  ll_engine_seq_free(e, seq);
  free(logits);
}

static void test_state_dir(const char *root) {
  char cfg[4096], out[4096], err[512], want[4096];
  struct stat st;
  // Configured, with missing parents and a trailing slash.
  snprintf(cfg, sizeof cfg, "%s/a/b/state/", root);
  CHECKF(ll_state_dir_resolve(cfg, out, sizeof out, err, sizeof err) == 0, "%s", err);
  snprintf(want, sizeof want, "%s/a/b/state", root);
  CHECKF(strcmp(out, want) == 0, "got '%s'", out);
  CHECK(stat(out, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
  snprintf(want, sizeof want, "%s/a", root);
  CHECK(stat(want, &st) == 0 && (st.st_mode & 0777) == 0700); // parents too
  // Resolving again is fine.
  CHECKF(ll_state_dir_resolve(cfg, out, sizeof out, err, sizeof err) == 0, "%s", err);
  // A relative configured path comes back absolute.
  char cwd[4096];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  CHECK(chdir(root) == 0);
  CHECKF(ll_state_dir_resolve("rel/st", out, sizeof out, err, sizeof err) == 0, "%s", err);
  snprintf(want, sizeof want, "%s/rel/st", root);
  CHECKF(strcmp(out, want) == 0, "got '%s'", out);
  CHECK(chdir(cwd) == 0);
  // $XDG_STATE_HOME/llsrv, else $HOME/.local/state/llsrv (a relative XDG value is ignored).
  snprintf(want, sizeof want, "%s/xdg", root);
  setenv("XDG_STATE_HOME", want, 1);
  CHECKF(ll_state_dir_resolve(NULL, out, sizeof out, err, sizeof err) == 0, "%s", err);
  snprintf(want, sizeof want, "%s/xdg/llsrv", root);
  CHECKF(strcmp(out, want) == 0, "got '%s'", out);
  setenv("XDG_STATE_HOME", "relative/x", 1);
  snprintf(want, sizeof want, "%s/home", root);
  setenv("HOME", want, 1);
  CHECKF(ll_state_dir_resolve("", out, sizeof out, err, sizeof err) == 0, "%s", err);
  snprintf(want, sizeof want, "%s/home/.local/state/llsrv", root);
  CHECKF(strcmp(out, want) == 0, "got '%s'", out);
  // A file where the directory should be: an error naming the path.
  snprintf(cfg, sizeof cfg, "%s/afile", root);
  FILE *f = fopen(cfg, "w");
  CHECK(f != NULL);
  if (f) fclose(f);
  int rc = ll_state_dir_resolve(cfg, out, sizeof out, err, sizeof err);
  CHECKF(rc < 0 && strstr(err, cfg), "rc %d: %s", rc, err);
  snprintf(want, sizeof want, "%s/afile/sub", root);
  rc = ll_state_dir_resolve(want, out, sizeof out, err, sizeof err);
  CHECKF(rc < 0 && strstr(err, cfg), "rc %d: %s", rc, err);
  // Output buffer too small.
  snprintf(cfg, sizeof cfg, "%s/a/b/state", root);
  CHECK(ll_state_dir_resolve(cfg, out, 8, err, sizeof err) == LL_ELIMIT);
  // Another user's directory is refused (needs root to set up).
  if (geteuid() == 0) {
    snprintf(cfg, sizeof cfg, "%s/other", root);
    CHECK(mkdir(cfg, 0700) == 0 && chown(cfg, 65534, 65534) == 0);
    rc = ll_state_dir_resolve(cfg, out, sizeof out, err, sizeof err);
    CHECKF(rc < 0 && strstr(err, cfg) && strstr(err, "uid"), "rc %d: %s", rc, err);
  } else {
    printf("not root: skipping the other-owner state directory check\n");
  }
}

static void test_tokenizer(const struct ll_tokenizer *t) {
  CHECK(ll_tokenizer_n_vocab(t) == 260);
  CHECK(ll_tokenizer_bos(t) == 1 && ll_tokenizer_eos(t) == 2 && ll_tokenizer_add_bos(t));
  // Invalid UTF-8, control bytes and a NUL: each byte is its byte token (id = byte + 3).
  static const char text[] = "h\xc3\xa9llo\n\x01\xff\0z";
  const int n = (int)sizeof text - 1;
  int32_t ids[64];
  int k = ll_tokenize(t, text, (size_t)n, 1, 0, ids, 64);
  CHECKF(k == n + 1, "got %d ids", k);
  int exact = k == n + 1 && ids[0] == 1;
  for (int i = 0; exact && i < n; i++) exact = ids[i + 1] == (unsigned char)text[i] + 3;
  CHECK(exact);
  char back[64];
  int m = ll_detokenize(t, ids, k, back, sizeof back, 0);
  CHECK(m == n && memcmp(back, text, (size_t)n) == 0);
  // Spaces (escaped to U+2581 by the SPM encoder) are one token that decodes to " ".
  static const char sp[] = "  a b\t ";
  k = ll_tokenize(t, sp, strlen(sp), 0, 0, ids, 64);
  const int32_t want[] = {259, 259, 'a' + 3, 259, 'b' + 3, '\t' + 3, 259};
  CHECK(k == 7 && memcmp(ids, want, sizeof want) == 0);
  m = ll_detokenize(t, ids, k, back, sizeof back, 0);
  CHECK(m == (int)strlen(sp) && memcmp(back, sp, strlen(sp)) == 0);
  // Every byte value round-trips.
  char all[256];
  for (int i = 0; i < 256; i++) all[i] = (char)i;
  int32_t big[300];
  char back2[300];
  k = ll_tokenize(t, all, 256, 0, 0, big, 300);
  m = ll_detokenize(t, big, k, back2, sizeof back2, 0);
  CHECKF(k == 256 && m == 256 && memcmp(back2, all, 256) == 0, "k %d m %d", k, m);
}

static void compare_models(const char *pa, const char *pb) {
  struct ll_modelfile a, b;
  char err[512];
  ll_modelfile_init(&a);
  ll_modelfile_init(&b);
  CHECKF(ll_model_open(pa, &a, err, sizeof err) == 0, "%s", err);
  CHECKF(ll_model_open(pb, &b, err, sizeof err) == 0, "%s", err);
  CHECK(a.n_tensors == 2 + 9 * 4 && a.n_tensors == b.n_tensors && a.n_kv == b.n_kv);
  int same = 1;
  for (uint64_t i = 0; same && i < a.n_tensors && i < b.n_tensors; i++) {
    const struct ll_tensor_info *x = &a.tensors[i], *y = &b.tensors[i];
    same = strcmp(x->name.ptr, y->name.ptr) == 0 && x->type == y->type && x->nbytes == y->nbytes &&
           memcmp(x->ne, y->ne, sizeof x->ne) == 0 && memcmp(x->data, y->data, x->nbytes) == 0;
    if (!same) printf("tensor %s differs\n", x->name.ptr);
  }
  CHECK(same);
  // The init: N(0, 0.02) weights, residual projections / sqrt(2 * 4), RMSNorm weights 1.
  const struct ll_tensor_info *emb = ll_mf_find_tensor(&a, "token_embd.weight");
  const struct ll_tensor_info *down = ll_mf_find_tensor(&a, "blk.3.ffn_down.weight");
  const struct ll_tensor_info *norm = ll_mf_find_tensor(&a, "blk.0.attn_norm.weight");
  CHECK(emb && emb->ne[0] == 128 && emb->ne[1] == 260);
  CHECK(down && down->ne[0] == 352 && down->ne[1] == 128);
  CHECK(ll_mf_find_tensor(&a, "output.weight") == NULL); // tied head
  if (emb && down && norm) {
    double s = 0, s2 = 0;
    size_t n = (size_t)(emb->ne[0] * emb->ne[1]);
    for (size_t i = 0; i < n; i++) s += ((const float *)emb->data)[i], s2 += (double)((const float *)emb->data)[i] * ((const float *)emb->data)[i];
    double sd = sqrt(s2 / n - (s / n) * (s / n));
    CHECKF(fabs(s / n) < 1e-3 && fabs(sd - 0.02) < 1e-3, "embedding mean %g std %g", s / n, sd);
    s2 = 0;
    n = (size_t)(down->ne[0] * down->ne[1]);
    for (size_t i = 0; i < n; i++) s2 += (double)((const float *)down->data)[i] * ((const float *)down->data)[i];
    sd = sqrt(s2 / n);
    CHECKF(fabs(sd - 0.02 / sqrt(8.0)) < 5e-4, "ffn_down std %g", sd);
    int ones = 1;
    for (int i = 0; i < 128; i++) ones &= ((const float *)norm->data)[i] == 1.0f;
    CHECK(ones);
  }
  const char *name;
  CHECK(ll_mf_get_str(&a, "general.name", &name) == 0 && strcmp(name, "llsrv-demo") == 0);
  ll_modelfile_free(&a);
  ll_modelfile_free(&b);
}

int main(void) {
  char root[1024], err[512];
  CHECK(ll_test_tmpdir(root, sizeof root) != NULL);
  test_state_dir(root);

  char sd1[2048], sd2[2048], cfg[4096], p1[4096], p2[4096];
  snprintf(cfg, sizeof cfg, "%s/s1", root);
  CHECKF(ll_state_dir_resolve(cfg, sd1, sizeof sd1, err, sizeof err) == 0, "%s", err);
  snprintf(cfg, sizeof cfg, "%s/s2", root);
  CHECKF(ll_state_dir_resolve(cfg, sd2, sizeof sd2, err, sizeof err) == 0, "%s", err);

  // Created once, then reused (same inode and mtime); nothing else left in models/.
  CHECKF(ll_demo_model_ensure(sd1, p1, sizeof p1, err, sizeof err) == 0, "%s", err);
  char want[4096];
  snprintf(want, sizeof want, "%s/models/demo.ckpt", sd1);
  CHECKF(strcmp(p1, want) == 0, "got '%s'", p1);
  struct stat st1, st2;
  CHECK(stat(p1, &st1) == 0 && S_ISREG(st1.st_mode) && st1.st_size > 0);
  snprintf(want, sizeof want, "%s/models", sd1);
  CHECK(stat(want, &st2) == 0 && (st2.st_mode & 0777) == 0700);
  DIR *d = opendir(want);
  int entries = 0;
  for (struct dirent *de; d && (de = readdir(d));) entries += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  if (d) closedir(d);
  CHECKF(entries == 1, "%d entries in %s", entries, want);
  usleep(20000);
  CHECKF(ll_demo_model_ensure(sd1, p1, sizeof p1, err, sizeof err) == 0, "%s", err);
  CHECK(stat(p1, &st2) == 0 && st2.st_ino == st1.st_ino && st2.st_mtim.tv_sec == st1.st_mtim.tv_sec &&
        st2.st_mtim.tv_nsec == st1.st_mtim.tv_nsec);
  // Leftovers of a start killed while creating it (a dead PID's intermediate file, the .ckpt
  // writer's temporary file) go at the next start; a live process's file and other names stay.
  {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char names[4][128], lp[4][4300];
    snprintf(names[0], sizeof names[0], ".demo.ckpt.new-%ld-0", (long)dead);
    snprintf(names[1], sizeof names[1], "..demo.ckpt.new-%ld-0.tmp-AbCdEf", (long)dead);
    snprintf(names[2], sizeof names[2], ".demo.ckpt.new-%ld-7", (long)getpid());
    snprintf(names[3], sizeof names[3], "demo.ckpt.notes");
    for (int i = 0; i < 4; i++) {
      snprintf(lp[i], sizeof lp[i], "%s/models/%s", sd1, names[i]);
      FILE *f = fopen(lp[i], "w");
      CHECK(f != NULL);
      if (f) fputs("leftover", f), fclose(f);
    }
    CHECKF(ll_demo_model_ensure(sd1, p1, sizeof p1, err, sizeof err) == 0, "%s", err);
    CHECKF(access(lp[0], F_OK) != 0 && access(lp[1], F_OK) != 0, "a killed start's files are removed");
    CHECKF(access(lp[2], F_OK) == 0 && access(lp[3], F_OK) == 0, "a live process's file and other names stay");
    unlink(lp[2]);
    unlink(lp[3]);
  }
  char small[10];
  CHECK(ll_demo_model_ensure(sd1, small, sizeof small, err, sizeof err) == LL_ELIMIT);

  // The engine opens it.
  struct ll_engine *e1 = open_engine(p1);
  int32_t g1[16] = {0}, g2[16] = {0};
  static float l1[260], l2[260];
  const char *prompt = "int main(void) {\n  return 0;\n}\n";
  if (e1) {
    struct ll_engine_info info;
    ll_engine_get_info(e1, &info);
    CHECKF(strcmp(info.arch, "llama") == 0 && strcmp(info.name, "llsrv-demo") == 0, "arch %s name %s", info.arch, info.name);
    CHECK(info.n_vocab == 260 && info.n_embd == 128 && info.n_layer == 4 && info.n_head == 4 && info.n_head_kv == 4 &&
          info.n_ctx_train == 512);
    CHECK(strcmp(info.quant, "f32") == 0 || strcmp(info.quant, "F32") == 0);
    const struct ll_tokenizer *t = ll_engine_tokenizer(e1);
    CHECK(t != NULL);
    if (t) test_tokenizer(t);
    greedy(e1, prompt, g1, 16, l1);
    ll_engine_close(e1);
  }
  // Deterministic: the same ids from a second open of the same file, and from a file created
  // independently in another state directory (identical tensors).
  struct ll_engine *e2 = open_engine(p1);
  if (e2) {
    greedy(e2, prompt, g2, 16, l2);
    ll_engine_close(e2);
  }
  CHECK(memcmp(g1, g2, sizeof g1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
  CHECKF(ll_demo_model_ensure(sd2, p2, sizeof p2, err, sizeof err) == 0, "%s", err);
  memset(g2, 0, sizeof g2), memset(l2, 0, sizeof l2);
  e2 = open_engine(p2);
  if (e2) {
    greedy(e2, prompt, g2, 16, l2);
    ll_engine_close(e2);
  }
  CHECK(memcmp(g1, g2, sizeof g1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
  int in_range = 1;
  for (int i = 0; i < 16; i++) in_range &= g1[i] >= 0 && g1[i] < 260;
  CHECK(in_range);
  printf("greedy after BOS + prompt:");
  for (int i = 0; i < 16; i++) printf(" %d", g1[i]);
  printf("\n");
  compare_models(p1, p2);

  // Processes racing to create it: every one succeeds, the result is a complete file and
  // no temporary file is left behind.
  char sd4[2048], p4[4096];
  snprintf(cfg, sizeof cfg, "%s/s4", root);
  CHECKF(ll_state_dir_resolve(cfg, sd4, sizeof sd4, err, sizeof err) == 0, "%s", err);
  pid_t kids[4];
  for (int i = 0; i < 4; i++)
    if ((kids[i] = fork()) == 0) {
      char e[512], pp[4096];
      _exit(ll_demo_model_ensure(sd4, pp, sizeof pp, e, sizeof e) == 0 ? 0 : 1);
    }
  int all_ok = 1;
  for (int i = 0; i < 4; i++) {
    int ws = 0;
    all_ok &= kids[i] > 0 && waitpid(kids[i], &ws, 0) == kids[i] && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
  }
  CHECK(all_ok);
  snprintf(want, sizeof want, "%s/models", sd4);
  d = opendir(want);
  entries = 0;
  for (struct dirent *de; d && (de = readdir(d));) entries += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  if (d) closedir(d);
  CHECKF(entries == 1, "%d entries in %s", entries, want);
  CHECKF(ll_demo_model_ensure(sd4, p4, sizeof p4, err, sizeof err) == 0, "%s", err);
  compare_models(p1, p4);

  // An existing file is kept as is, even a damaged one (the engine reports it).
  char sd3[2048], p3[4096];
  snprintf(cfg, sizeof cfg, "%s/s3", root);
  CHECKF(ll_state_dir_resolve(cfg, sd3, sizeof sd3, err, sizeof err) == 0, "%s", err);
  snprintf(want, sizeof want, "%s/models", sd3);
  CHECK(mkdir(want, 0700) == 0);
  snprintf(want, sizeof want, "%s/models/demo.ckpt", sd3);
  FILE *f = fopen(want, "w");
  CHECK(f != NULL);
  if (f) fputs("not a checkpoint", f), fclose(f);
  CHECKF(ll_demo_model_ensure(sd3, p3, sizeof p3, err, sizeof err) == 0, "%s", err);
  CHECK(strcmp(p3, want) == 0 && stat(p3, &st1) == 0 && st1.st_size == 16);
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = p3;
  ep.device = "cpu";
  struct ll_engine *e3 = NULL;
  CHECK(ll_engine_open(&e3, &ep, err, sizeof err) < 0 && e3 == NULL);
  printf("damaged demo.ckpt: %s\n", err);

  nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return ll_test_summary();
}
