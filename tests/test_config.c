// test_config.c - the option table and its readers: defaults, YAML (every error class with its
// file:line:col), the command line over a --config file, print_yaml round trip, every
// configs/*.yaml loads, and man/llsrv.yaml.5 matches the table.
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ll_config.h"
#include "testutil.h"

static int load(struct ll_config *c, const char *yaml, char *err) {
  return ll_config_load_yaml(c, yaml, strlen(yaml), "x.yaml", err, 512);
}

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

int main(void) {
  struct ll_config c;
  char err[512];
  // Defaults come from the table and are valid.
  ll_config_init(&c);
  CHECK(c.ctx == 2048 && c.parallel == 8 && c.kv_f16 == -1 && c.max_line == 1 << 20 && c.output_buffer == 4 << 20);
  CHECK(c.idle_timeout == 300 && c.line_timeout == 30 && c.monitor_hz == 4 && c.train_lr == 1e-3 && c.train_enabled == 0);
  CHECK(c.listen && strcmp(c.listen, "127.0.0.1:8478") == 0 && c.model == NULL && c.auth_token == NULL);
  CHECK(strcmp(c.log_level, "info") == 0 && strcmp(c.device, "auto") == 0);
  for (const struct ll_option *o = ll_options; o->name; o++) {
    CHECKF(o->help && o->help[0], "%s has help", o->name);
    if (o->def) CHECKF(ll_config_set(&c, o->name, o->def, err, sizeof err) == 0, "default of %s parses: %s", o->name, err);
  }
  ll_config_free(&c);

  // A good file: sections, sizes, durations, booleans, null.
  ll_config_init(&c);
  CHECKF(load(&c, "listen: 0.0.0.0:9000\nmax_line: 64K\nidle_timeout: 500ms\nline_timeout: 2m\nkv_f16: no\n"
                  "model: ~\ntrain:\n  enabled: yes\n  lora_rank: 16\n  lr: 2e-4\ntrain.steps: 5\n", err) == 0, "%s", err);
  CHECK(strcmp(c.listen, "0.0.0.0:9000") == 0 && c.max_line == 65536 && c.idle_timeout == 0.5 && c.line_timeout == 120);
  CHECK(c.kv_f16 == 0 && c.model == NULL && c.train_enabled == 1 && c.train_lora_rank == 16 && c.train_lr == 2e-4 && c.train_steps == 5);
  CHECK(load(&c, "", err) == 0 && load(&c, "# only a comment\n", err) == 0 && load(&c, "---\n...\n", err) == 0);
  CHECK(load(&c, "train:\n", err) == 0 && c.train_enabled == 1); // an empty section sets nothing
  ll_config_free(&c);

  // Sizes are powers of 1024 with or without "iB"; durations take ms/s/m/h; booleans every spelling.
  struct { const char *yaml; int64_t max_line; double idle; int kv; } ok[] = {
      {"max_line: 4096\nidle_timeout: 30\nkv_f16: true\n", 4096, 30, 1},
      {"max_line: 64K\nidle_timeout: 1.5\nkv_f16: off\n", 65536, 1.5, 0},
      {"max_line: 64KiB\nidle_timeout: 250ms\nkv_f16: on\n", 65536, 0.25, 1},
      {"max_line: 2M\nidle_timeout: 30s\nkv_f16: 0\n", 2 << 20, 30, 0},
      {"max_line: 2MiB\nidle_timeout: 5m\nkv_f16: yes\n", 2 << 20, 300, 1},
      {"max_line: 1.5K\nidle_timeout: 1h\nkv_f16: False\n", 1536, 3600, 0},
      {"max_line: \"64M\"\nidle_timeout: 1e3\nkv_f16: \"1\"\n", 64 << 20, 1000, 1},
      {"max_line: 4096\nidle_timeout: 30\nkv_f16: auto\n", 4096, 30, -1}, // decided by the model
      {"max_line: 4096\nidle_timeout: 30\nkv_f16: AUTO\n", 4096, 30, -1},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    ll_config_init(&c);
    CHECKF(load(&c, ok[i].yaml, err) == 0, "ok case %zu: %s", i, err);
    CHECKF(c.max_line == ok[i].max_line && c.idle_timeout == ok[i].idle && c.kv_f16 == ok[i].kv, "ok case %zu: %lld %g %d", i,
           (long long)c.max_line, c.idle_timeout, c.kv_f16);
    ll_config_free(&c);
  }
  ll_config_init(&c);
  CHECK(ll_config_set(&c, "output_buffer", "1GiB", err, sizeof err) == 0 && c.output_buffer == 1 << 30);
  CHECK(ll_config_set(&c, "output_buffer", "1G", err, sizeof err) == 0 && c.output_buffer == 1 << 30);
  CHECK(ll_config_set(&c, "ctx", "99999999", err, sizeof err) != 0 && strcmp(err, "option 'ctx': value 99999999 out of range 16..131072") == 0);
  CHECK(ll_config_set(&c, "log_level", "loud", err, sizeof err) != 0 && strstr(err, "'loud'") && strstr(err, "error|warn|info|debug"));
  CHECK(ll_config_set(&c, "nope", "1", err, sizeof err) != 0);
  CHECK(ll_config_set(&c, "ctx", "", err, sizeof err) != 0 && ll_config_set(&c, "ctx", "-", err, sizeof err) != 0);
  CHECK(ll_config_set(&c, "ctx", "1e", err, sizeof err) != 0 && ll_config_set(&c, "monitor_hz", "nan", err, sizeof err) != 0);
  CHECK(ll_config_set(&c, "idle_timeout", "-1", err, sizeof err) != 0 && strstr(err, "out of range 0.1..86400"));
  ll_config_free(&c);

  // Every error class, with its position.
  struct { const char *yaml, *prefix, *needle; } bad[] = {
      {"ctx: 512\nlisten: 127.0.0.1:1\nfrob: 1\n", "x.yaml:3:1:", "unknown key 'frob'"},
      {"ctx: 512\nparalel: 4\n", "x.yaml:2:1:", "did you mean 'parallel'"},
      {"ctx: 99999999\n", "x.yaml:1:6:", "out of range 16..131072"},
      {"ctx: twelve\n", "x.yaml:1:6:", "not an integer"},
      {"ctx: 12.5\n", "x.yaml:1:6:", "whole number"},
      {"kv_f16: maybe\n", "x.yaml:1:9:", "not a boolean (true/false/auto)"},
      {"train.enabled: auto\n", "x.yaml:1:16:", "not a boolean (true/false)"}, // only kv_f16 has auto
      {"max_line: 12Q\n", "x.yaml:1:11:", "size suffix"},
      {"idle_timeout: 3 days\n", "x.yaml:1:15:", "time unit"},
      {"log_level: loud\n", "x.yaml:1:12:", "not one of error|warn|info|debug"},
      {"ctx: 512\nctx: 1024\n", "x.yaml:2:1:", "duplicate key 'ctx'"},
      {"train:\n  lora_rank: 8\n  frob: 2\n", "x.yaml:3:3:", "unknown key 'train.frob'"},
      {"listen:\n  host: x\n", "x.yaml:1:1:", "option 'listen' takes a single value, not a mapping"},
      {"ctx: 512\nfrob:\n  x: 1\n", "x.yaml:2:1:", "unknown key 'frob'"},
      {"train: 5\n", "x.yaml:1:8:", "'train' is a section"},
      {"train:\n  lr: 0.1\ntrain:\n  steps: 2\n", "x.yaml:3:1:", "duplicate key 'train'"},
      {"train.steps: 2\ntrain:\n  steps: 3\n", "x.yaml:3:3:", "duplicate key 'train.steps'"},
      {"train:\n  lr:\n    x: 1\n", "x.yaml:2:3:", "takes a single value"},
      {"ctx: 512\n\xff\n", "x.yaml:2:1:", "syntax error"},
      {"ctx: 0x10\n", "x.yaml:1:6:", "not an integer"},
      {"ctx: \" 64\"\n", "x.yaml:1:6:", "not an integer"},
      {"ctx: 64abc\n", "x.yaml:1:6:", "trailing characters"},
      {"monitor_hz: 1e999\n", "x.yaml:1:13:", "not a number"},
      {"max_line: 2G\n", "x.yaml:1:11:", "out of range 64..67108864"},
      {"ctx: 99999999999999999999999\n", "x.yaml:1:6:", "out of range"},
      {"ctx: [1, 2]\n", "x.yaml:1:6:", "lists are not allowed"},
      {"ctx: 512\nlisten: \"unterminated\n", "x.yaml:", "syntax error"},
      {"- a\n- b\n", "x.yaml:1:1:", "lists are not allowed"},
      {"just a scalar\n", "x.yaml:1:1:", "expected a mapping"},
      {"ctx: 512\n---\nctx: 256\n", "x.yaml:", "one YAML document"},
      {"threads: ~\n", "x.yaml:1:10:", "needs a value"},
      {"ctx: &x 512\nparallel: *x\n", "x.yaml:2:11:", "aliases"},
      {"ctx: nan\n", "x.yaml:1:6:", "not an integer"},
      {"monitor_hz: inf\n", "x.yaml:1:13:", "not a number"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ll_config_init(&c);
    err[0] = 0;
    int rc = load(&c, bad[i].yaml, err);
    CHECKF(rc != 0 && starts(err, bad[i].prefix) && strstr(err, bad[i].needle), "case %zu: rc %d, message '%s' (want '%s' ... '%s')", i,
           rc, err, bad[i].prefix, bad[i].needle);
    ll_config_free(&c);
  }

  // Command line: --config first, flags override it whatever their order; bool forms.
  char dir[512], path[1200];
  CHECK(ll_test_tmpdir(dir, sizeof dir) != NULL);
  snprintf(path, sizeof path, "%s/c.yaml", dir);
  FILE *f = fopen(path, "w");
  fputs("ctx: 512\nparallel: 2\nkv_f16: false\ntrain:\n  lr: 0.01\n", f);
  fclose(f);
  char cfg_file[1200];
  snprintf(cfg_file, sizeof cfg_file, "%s", path);
  {
    char *argv[] = {"--ctx", "1024", "--config", path, "--kv-f16", "--train-lr=0.5", "-t", "3", "--check-config", "--max-line", "2M"};
    int help = 0, version = 0, check = 0;
    ll_config_init(&c);
    CHECKF(ll_config_parse_args(&c, 11, argv, &help, &version, &check, err, sizeof err) == 0, "%s", err);
    CHECK(c.ctx == 1024 && c.parallel == 2 && c.kv_f16 == 1 && c.train_lr == 0.5 && c.threads == 3 && check == 1 && !help);
    CHECK(c.max_line == 2 << 20);
    ll_config_free(&c);
  }
  {
    char *argv[] = {"--no-kv-f16", "--frob", "1"};
    ll_config_init(&c);
    CHECK(ll_config_parse_args(&c, 3, argv, NULL, NULL, NULL, err, sizeof err) != 0 && strstr(err, "unknown option '--frob'"));
    CHECK(c.kv_f16 == 0);
    ll_config_free(&c);
    char *argv2[] = {"--ctx"};
    ll_config_init(&c);
    CHECK(ll_config_parse_args(&c, 1, argv2, NULL, NULL, NULL, err, sizeof err) != 0 && strstr(err, "needs a value"));
    ll_config_free(&c);
    char *argv5[] = {"-x"};
    ll_config_init(&c);
    CHECK(ll_config_parse_args(&c, 1, argv5, NULL, NULL, NULL, err, sizeof err) != 0 && strstr(err, "unknown option '-x' (see llsrv --help)"));
    ll_config_free(&c);
    char *argv6[] = {"-m", "/m.gguf", "-c", "64", "--kv-f16=false", "--train-enabled", "--train-lora-rank", "4", "-h", "--version"};
    int help = 0, version = 0, check = 0;
    ll_config_init(&c);
    CHECKF(ll_config_parse_args(&c, 10, argv6, &help, &version, &check, err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(c.model, "/m.gguf") == 0 && c.ctx == 64 && c.kv_f16 == 0 && c.train_enabled == 1 && c.train_lora_rank == 4);
    CHECK(help == 1 && version == 1 && check == 0);
    ll_config_free(&c);
    char *argv7[] = {"--ctx=8"};
    ll_config_init(&c);
    CHECK(ll_config_parse_args(&c, 1, argv7, NULL, NULL, NULL, err, sizeof err) != 0 && strstr(err, "option 'ctx': value 8 out of range 16..131072"));
    ll_config_free(&c);
    char *argv3[] = {"positional"};
    ll_config_init(&c);
    CHECK(ll_config_parse_args(&c, 1, argv3, NULL, NULL, NULL, err, sizeof err) != 0 && strstr(err, "unexpected argument"));
    ll_config_free(&c);
    char *argv4[] = {"--config", "/nonexistent/x.yaml"};
    ll_config_init(&c);
    CHECK(ll_config_parse_args(&c, 2, argv4, NULL, NULL, NULL, err, sizeof err) != 0 && strstr(err, "/nonexistent/x.yaml"));
    ll_config_free(&c);
  }

  // print_yaml -> load_yaml gives the same values; the token is never printed.
  {
    ll_config_init(&c);
    CHECK(load(&c, "ctx: 777\nlisten: \"127.0.0.1:1\"\nauth_token: s3cret\nidle_timeout: 1.25\ntrain:\n  lr: 3e-5\n", err) == 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    ll_config_print_yaml(m, &c);
    fclose(m);
    CHECK(strstr(buf, "s3cret") == NULL && strstr(buf, "(set)") != NULL);
    struct ll_config d;
    ll_config_init(&d);
    CHECKF(ll_config_load_yaml(&d, buf, len, "printed", err, sizeof err) == 0, "%s\n%s", err, buf);
    CHECK(d.ctx == 777 && strcmp(d.listen, "127.0.0.1:1") == 0 && d.idle_timeout == 1.25 && d.train_lr == 3e-5);
    // Every option equal (the token aside: it is never printed).
    for (const struct ll_option *o = ll_options; o->name; o++) {
      if (!strcmp(o->name, "auth_token")) continue;
      const char *x = (const char *)&c + o->offset, *y = (const char *)&d + o->offset;
      int same;
      if (o->type == LL_OPT_STRING || o->type == LL_OPT_ENUM || o->type == LL_OPT_LIST) {
        const char *sx = *(char *const *)x, *sy = *(char *const *)y;
        same = (!sx && !sy) || (sx && sy && !strcmp(sx, sy));
      } else if (o->type == LL_OPT_BOOL) {
        same = *(const int *)x == *(const int *)y;
      } else if (o->type == LL_OPT_INT || o->type == LL_OPT_SIZE) {
        same = *(const int64_t *)x == *(const int64_t *)y;
      } else {
        same = *(const double *)x == *(const double *)y;
      }
      CHECKF(same, "round trip keeps %s", o->name);
    }
    CHECK(strstr(buf, "train_lr") == NULL && strstr(buf, "\ntrain:\n  enabled: false\n") != NULL); // sections nest
    CHECK(strstr(buf, "lr: 3e-05\n") != NULL); // shortest form, not 17 digits
    free(buf);
    ll_config_free(&d);
    ll_config_free(&c);
  }

  // Strings with quotes, control characters and code points YAML forbids print escaped and load back equal.
  {
    const char *nasty = "a\"b\\c\td\x01e\x7f\xc2\x80\xc2\x85\xe2\x80\xa8\xef\xbb\xbf\xef\xbf\xbe: # x\n\xf0\x9f\x98\x80";
    ll_config_init(&c);
    CHECK(ll_config_set(&c, "model", nasty, err, sizeof err) == 0);
    CHECK(ll_config_set(&c, "state_dir", "", err, sizeof err) == 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    ll_config_print_yaml(m, &c);
    fclose(m);
    struct ll_config d;
    ll_config_init(&d);
    CHECKF(ll_config_load_yaml(&d, buf, len, "printed", err, sizeof err) == 0, "%s\n%s", err, buf);
    CHECK(d.model && strcmp(d.model, nasty) == 0 && d.state_dir && d.state_dir[0] == 0 && d.auth_token == NULL);
    free(buf);
    ll_config_free(&d);
    ll_config_free(&c);
  }

  // --help lists every flag.
  {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    ll_config_print_help(m);
    fclose(m);
    CHECK(strncmp(buf, "usage: llsrv [--model PATH] [--config FILE] [options]\n", 54) == 0);
    CHECK(strstr(buf, "--train-lora-rank N") && strstr(buf, "--check-config") && strstr(buf, "--version"));
    for (const char *g = "general:\0network and limits:\0training:\0"; *g; g += strlen(g) + 1) CHECKF(strstr(buf, g) != NULL, "group %s", g);
    free(buf);
  }

  // Every shipped config loads.
  const char *src = getenv("LL_SOURCE_DIR");
  CHECK(src != NULL);
  if (src) {
    char cdir[600];
    snprintf(cdir, sizeof cdir, "%s/configs", src);
    DIR *dd = opendir(cdir);
    int n = 0;
    CHECK(dd != NULL);
    for (struct dirent *e; dd && (e = readdir(dd));) {
      size_t l = strlen(e->d_name);
      if (l < 6 || strcmp(e->d_name + l - 5, ".yaml")) continue;
      snprintf(path, sizeof path, "%s/%s", cdir, e->d_name);
      ll_config_init(&c);
      CHECKF(ll_config_load_file(&c, path, err, sizeof err) == 0, "%s", err);
      ll_config_free(&c);
      n++;
    }
    if (dd) closedir(dd);
    CHECKF(n >= 3, "configs/ holds server, lora and demo configs (%d found)", n);

    // man/llsrv.yaml.5 lists exactly what the table says.
    snprintf(path, sizeof path, "%s/man/llsrv.yaml.5", src);
    size_t mlen;
    char *man = (char *)ll_test_read_file(path, &mlen);
    CHECK(man != NULL);
    char *gen = NULL;
    size_t glen = 0;
    FILE *m = open_memstream(&gen, &glen);
    ll_config_print_man_options(m);
    fclose(m);
    const char *b = man ? strstr(man, ".\\\" BEGIN GENERATED OPTIONS\n") : NULL;
    const char *e = man ? strstr(man, ".\\\" END GENERATED OPTIONS") : NULL;
    CHECK(b && e && e > b);
    if (b && e) {
      b += strlen(".\\\" BEGIN GENERATED OPTIONS\n");
      CHECKF((size_t)(e - b) == glen && memcmp(b, gen, glen) == 0,
             "man/llsrv.yaml.5 differs from the option table: regenerate with build/tests/gen_man_options");
    }
    free(gen);
    free(man);
  }
  unlink(cfg_file);
  rmdir(dir);
  // Training keys: lora_targets is a list (flow or block), checked word by word.
  {
    ll_config_init(&c);
    CHECK(strcmp(c.train_lora_targets, "q,k,v,o,gate,up,down") == 0 && c.train_lora_rank == 16 && c.train_lora_alpha == 32);
    CHECKF(load(&c, "train:\n  lora_targets: [q, v]\n  lora_dropout: 0.05\n  schedule: linear\n", err) == 0, "%s", err);
    CHECK(strcmp(c.train_lora_targets, "q,v") == 0 && c.train_lora_dropout == 0.05 && strcmp(c.train_schedule, "linear") == 0);
    ll_config_free(&c);
    ll_config_init(&c);
    CHECKF(load(&c, "train:\n  lora_targets:\n    - gate\n    - down\n", err) == 0, "%s", err);
    CHECK(strcmp(c.train_lora_targets, "gate,down") == 0);
    ll_config_free(&c);
    const struct {
      const char *yaml, *want;
    } badt[] = {
        {"train:\n  lora_targets: [q, qq]\n", "x.yaml:2:3: option 'train.lora_targets': 'qq' is not one of"},
        {"train:\n  lora_targets: []\n", "x.yaml:2:3: option 'train.lora_targets': the list is empty"},
        {"train:\n  lora_targets: [q, q]\n", "listed twice"},
        {"train:\n  lora_targets: [q, [k]]\n", "x.yaml:2:21: option 'train.lora_targets': list items must be plain words"},
        {"train:\n  lora_rank: 0\n", "x.yaml:2:14: option 'train.lora_rank': value 0 out of range"},
        {"train:\n  lora_dropout: 1\n", "out of range"},
        {"train:\n  schedule: step\n", "'step' is not one of cosine|linear|constant"},
        {"train:\n  lora_target: [q]\n", "unknown key 'train.lora_target' (did you mean 'train.lora_targets'?)"},
        {"parallel: [1, 2]\n", "lists are not allowed here"},
    };
    for (size_t i = 0; i < sizeof badt / sizeof badt[0]; i++) {
      ll_config_init(&c);
      int rc = load(&c, badt[i].yaml, err);
      CHECKF(rc != 0 && strstr(err, badt[i].want), "%s -> %s", badt[i].yaml, err);
      ll_config_free(&c);
    }
    ll_config_init(&c);
    CHECK(ll_config_set(&c, "train.lora_targets", "q, k ,down", err, sizeof err) == 0 && strcmp(c.train_lora_targets, "q,k,down") == 0);
    CHECK(ll_config_set(&c, "train.lora_targets", "q,", err, sizeof err) != 0);
    CHECK(ll_config_set(&c, "train.lora_targets", "x", err, sizeof err) != 0 && strcmp(c.train_lora_targets, "q,k,down") == 0);
    ll_config_free(&c);
  }
  return ll_test_summary();
}
