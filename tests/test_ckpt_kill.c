// test_ckpt_kill.c - crash safety of ll_ckpt_write: a child process writes a checkpoint over
// an existing valid one and is SIGKILLed (a) at random times and (b) from inside the writer
// after each shard. After every kill the file at the path must load and verify and be exactly
// the old or exactly the new model; a temporary file left behind must never load as anything
// but the complete new model. (c) Temporary files of killed writers do not pile up: the next
// write of the path removes them, but not one a live writer holds nor other names.
// Usage: test_ckpt_kill [N_RANDOM_KILLS] (default 120).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ll_error.h"
#include "test_ckpt_common.h"

static char g_dir[512];
static int g_kill_at = -1, g_calls;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void kill_self_progress(void *user, const char *phase, uint64_t done, uint64_t total) {
  (void)user, (void)phase, (void)done, (void)total;
  if (g_calls++ == g_kill_at) raise(SIGKILL);
}

static void opts_for(struct ll_ckpt_write_opts *o) {
  ll_ckpt_write_opts_init(o);
  o->shard_target = 64 << 10;
  o->n_threads = 2;
  o->zstd_level = 1;
}

// Which of the candidates the file at path equals: 0, 1, or -1 (loads but matches neither),
// -2 (does not load). err gets the loader's message.
static int identify(const char *path, struct ll_modelfile *cand, char *err, size_t errlen) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  if (ll_ckpt_open(path, &mf, 2, err, errlen) != 0) return -2;
  int who = -1;
  for (int c = 0; c < 2 && who < 0; c++)
    if (tc_kv_diff(&mf, &cand[c]) < 0 && tc_tensor_diff(&mf, &cand[c]) < 0) who = c;
  ll_modelfile_free(&mf);
  return who;
}

// After a kill: the target is old or new; leftovers are incomplete (refused) or complete-new.
static void check_after_kill(const char *path, struct ll_modelfile *cand, int old, int neu, int *n_old, int *n_new,
                             const char *how) {
  char err[512] = "";
  int who = identify(path, cand, err, sizeof err);
  CHECKF(who == old || who == neu, "%s: file at path is %s (%s)", how, who == -2 ? "refused" : "a torn mix", err);
  if (who == old) (*n_old)++;
  else if (who == neu) (*n_new)++;
  DIR *d = opendir(g_dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, ".m.ckpt.tmp-", 12) != 0) continue;
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
    int w = identify(p, cand, err, sizeof err);
    CHECKF(w == -2 || w == neu, "%s: leftover %s loads as model %d", how, e->d_name, w);
    unlink(p);
  }
  if (d) closedir(d);
}

static int count_tmp(void) {
  int n = 0;
  DIR *d = opendir(g_dir);
  for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, ".m.ckpt.tmp-", 12) == 0;
  if (d) closedir(d);
  return n;
}

static pid_t spawn_writer(const char *path, struct ll_modelfile *mf, int kill_at) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    struct ll_ckpt_write_opts o;
    char err[512];
    opts_for(&o);
    g_kill_at = kill_at;
    g_calls = 0;
    o.progress = kill_self_progress;
    int rc = ll_ckpt_write(path, mf, &o, err, sizeof err);
    if (rc) fprintf(stderr, "child write failed: %s\n", err);
    _exit(rc ? 1 : 0);
  }
  return pid;
}

int main(int argc, char **argv) {
  uint64_t rng = ll_test_seed();
  int n_random = argc > 1 ? atoi(argv[1]) : 120;
  if (!ll_test_tmpdir(g_dir, sizeof g_dir)) return 1;
  struct ll_modelfile cand[2];
  // ~3 MB of tensor data each, 64 KiB shard target: ~25 shards, tens of ms per write.
  CHECK(tc_make_model(&cand[0], &rng, 400, 100) == 0);
  CHECK(tc_make_model(&cand[1], &rng, 400, 200) == 0);
  char path[600], err[512];
  snprintf(path, sizeof path, "%s/m.ckpt", g_dir);
  struct ll_ckpt_write_opts o;
  opts_for(&o);
  double t0 = now_s();
  int rc = ll_ckpt_write(path, &cand[0], &o, err, sizeof err);
  double t_write = now_s() - t0;
  CHECKF(rc == 0, "%s", err);
  if (rc) return ll_test_summary();
  printf("one write takes %.1f ms; %d random kills in [0, %.1f ms]\n", t_write * 1e3, n_random, 1.5e3 * t_write);

  int cur = 0, n_old = 0, n_new = 0;
  // (a) deterministic: kill from inside the writer after each progress step.
  int n_steps = 0;
  {
    struct ll_ckpt_manifest man;
    struct ll_modelfile tmp;
    ll_modelfile_init(&tmp);
    CHECK(ll_ckpt_open_ex(path, &tmp, &man, 1, err, sizeof err) == 0);
    n_steps = (int)man.n_shards;
    ll_ckpt_manifest_free(&man);
    ll_modelfile_free(&tmp);
  }
  CHECK(n_steps > 10);
  for (int k = 0; k < n_steps; k++) {
    int next = 1 - cur;
    pid_t pid = spawn_writer(path, &cand[next], k);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child for step %d did not die by SIGKILL", k);
    char how[64];
    snprintf(how, sizeof how, "kill at progress step %d", k);
    int before_new = n_new;
    check_after_kill(path, cand, cur, next, &n_old, &n_new, how);
    CHECKF(n_new == before_new, "%s: the new file was published before the writer finished", how);
  }
  // (b) random: SIGKILL from outside at a random moment (including fsync / rename / dir fsync).
  // If the machine is so loaded that no child got as far as publishing, late kills follow,
  // each window twice the last (4x the measured write time, then 8x, ...: the write measured
  // on an idle core may take many times longer beside other work; at most 64x), until one sees the new
  // file, so both outcomes are exercised whatever the machine's speed.
  int n_extra = 0;
  double span = 1.5;
  for (int i = 0; i < n_random + n_extra; i++) {
    if (i >= n_random - 1 && n_new == 0 && n_extra < 24) n_extra++;
    if (i >= n_random) span = span < 4.0 ? 4.0 : span < 64.0 ? span * 2.0 : 64.0;
    int next = 1 - cur;
    pid_t pid = spawn_writer(path, &cand[next], -1);
    useconds_t delay = (useconds_t)((double)(ll_test_rand(&rng) % 10000) / 10000.0 * span * t_write * 1e6);
    usleep(delay);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "child %d failed", i);
    char how[64];
    snprintf(how, sizeof how, "random kill %d after %u us", i, (unsigned)delay);
    int before_new = n_new;
    check_after_kill(path, cand, cur, next, &n_old, &n_new, how);
    if (n_new > before_new) cur = next;
  }
  printf("after %d kills: old file %d times, new file %d times, never torn\n", n_steps + n_random + n_extra, n_old,
         n_new);
  // (c) Writers killed mid-write leave their temporary files (MBs each); each write of the
  // path first removes every one nobody holds. A live writer's (this process holding the lock, as
  // ll_ckpt_write does) and names not of the writer's pattern stay.
  {
    for (int k = 0; k < 4; k++) {
      pid_t pid = spawn_writer(path, &cand[1 - cur], 2 + k);
      int status = 0;
      waitpid(pid, &status, 0);
      CHECKF(WIFSIGNALED(status), "writer %d was not killed", k);
    }
    // Each writer removed the one killed before it: one is left, not four.
    CHECKF(count_tmp() == 1, "4 writers killed in turn leave 1 temporary file (%d)", count_tmp());
    char live[700], other[2][700];
    snprintf(live, sizeof live, "%s/.m.ckpt.tmp-LiVe00", g_dir);
    snprintf(other[0], sizeof other[0], "%s/.m.ckpt.tmp-AB", g_dir);
    snprintf(other[1], sizeof other[1], "%s/m.ckpt.bak", g_dir);
    int lfd = open(live, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    CHECK(lfd >= 0 && flock(lfd, LOCK_EX) == 0);
    for (int k = 0; k < 2; k++) {
      FILE *f = fopen(other[k], "w");
      CHECK(f != NULL);
      if (f) fclose(f);
    }
    CHECK(ll_ckpt_write(path, &cand[cur], &o, err, sizeof err) == 0);
    CHECKF(count_tmp() == 2, "after a complete write only the live writer's and the look-alike remain (%d)", count_tmp());
    CHECK(access(live, F_OK) == 0 && access(other[0], F_OK) == 0 && access(other[1], F_OK) == 0);
    close(lfd); // the live writer dies: its file is stale now
    CHECK(ll_ckpt_write(path, &cand[cur], &o, err, sizeof err) == 0);
    CHECKF(access(live, F_OK) != 0, "a temporary file nobody holds goes at the next write");
    unlink(other[0]);
    unlink(other[1]);
  }
  CHECK(n_old >= n_steps);
  if (n_random >= 20) CHECKF(n_new > 0, "no random kill came late enough to see the new file");
  unlink(path);
  rmdir(g_dir);
  CHECKF(access(g_dir, F_OK) != 0, "stray files left in %s", g_dir);
  ll_modelfile_free(&cand[0]);
  ll_modelfile_free(&cand[1]);
  return ll_test_summary();
}
