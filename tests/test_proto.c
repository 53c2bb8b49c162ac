// test_proto.c - the line protocol's grammar (ll_proto.h) and chat rendering (ll_chat.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ll_chat.h"
#include "ll_error.h"
#include "ll_proto.h"
#include "ll_sched.h"
#include "testutil.h"

static int parse(const char *text, struct ll_proto_req *q, char *buf, const char **code, char *err) {
  size_t n = strlen(text);
  memcpy(buf, text, n + 1);
  return ll_proto_parse(buf, n, q, code, err, 256);
}

// Qwen3's template with and without thinking (issue 32): each conversation of
// tests/ref/qwen3_chat.json (rendered by Python jinja2 from the template llama.cpp ships, README
// section 11) renders to the same bytes, marked or not, and only the template's own text is markup.
static void test_qwen3_ref(const char *path) {
  json_error_t je;
  json_t *all = json_load_file(path, 0, &je);
  CHECKF(all && json_array_size(all) >= 28, "%s: %s", path, je.text);
  char err[256];
  size_t i;
  json_t *e;
  json_array_foreach(all, i, e) {
    json_t *jm = json_object_get(e, "messages");
    const char *want = json_string_value(json_object_get(e, "expected"));
    struct ll_chat_msg m[16];
    size_t n = json_array_size(jm);
    CHECK(want && n >= 1 && n <= 16);
    if (!want || n < 1 || n > 16) continue;
    for (size_t k = 0; k < n; k++)
      m[k].role = json_string_value(json_object_get(json_array_get(jm, k), "role")),
      m[k].content = json_string_value(json_object_get(json_array_get(jm, k), "content")),
      m[k].reasoning = json_string_value(json_object_get(json_array_get(jm, k), "reasoning_content"));
    struct ll_chat_opts o = {.enable_thinking = json_is_true(json_object_get(e, "enable_thinking"))};
    char *r = NULL;
    struct ll_tok_span *mk = NULL;
    int nm = 0;
    CHECKF(ll_chat_render_opts("qwen3", m, (int)n, &o, &r, &mk, &nm, err, sizeof err) == 0 && r && !strcmp(r, want),
           "case %zu (enable_thinking=%d):\n got  '%s'\n want '%s'", i, o.enable_thinking, r ? r : err, want);
    // a message's text is never markup: no mark covers a byte that only a content could have put there
    for (int j = 0; r && j < nm; j++) CHECK(mk[j].start < mk[j].end && mk[j].end <= strlen(r) && (j == 0 || mk[j].start > mk[j - 1].end));
    free(r), free(mk);
    if (o.enable_thinking) { // the default is thinking on, as in the template; and from CHAT's JSON text
      CHECK(ll_chat_render("qwen3", m, (int)n, &r, err, sizeof err) == 0 && r && !strcmp(r, want));
      free(r);
      char *js = json_dumps(jm, JSON_COMPACT);
      struct ll_chat_msg *pm = NULL;
      void *store = NULL;
      int pn = js ? ll_chat_parse(js, strlen(js), &pm, &store, err, sizeof err) : -1;
      CHECKF(pn == (int)n && ll_chat_render("qwen3", pm, pn, &r, err, sizeof err) == 0 && r && !strcmp(r, want), "case %zu parsed", i);
      if (pn == (int)n) free(r);
      if (pn > 0) ll_chat_free_store(store, pm);
      free(js);
    }
  }
  json_decref(all);
}

// reasoning_format deepseek (issue 32): "<think>" reasoning "</think>" answer split as llama-server
// splits it, whole and streamed - fed one byte at a time and one UTF-8 character at a time, the
// pieces of each kind joined equal llama.cpp's, reasoning never after answer, and character-fed
// pieces are UTF-8 complete.
struct split_acc {
  char r[256], c[256];
  size_t nr, nc;
  int order_ok, utf8_ok, seen_answer;
};

static void split_emit(void *u, int reasoning, const char *t, size_t n) {
  struct split_acc *a = u;
  a->order_ok &= n > 0 && !(reasoning && a->seen_answer);
  a->seen_answer |= !reasoning;
  a->utf8_ok &= ll_utf8_complete_prefix(t, n) == n;
  char *d = reasoning ? a->r : a->c;
  size_t *k = reasoning ? &a->nr : &a->nc;
  if (*k + n < 256) memcpy(d + *k, t, n), *k += n;
}

static void test_reasoning_split(void) {
  // llama-server 0c1e5709's reasoning_content and content for these outputs of Qwen3's template
  // with reasoning_format deepseek (common_chat_parse, tests/ref/README.md section 11)
  static const struct {
    const char *text, *reasoning, *content;
  } cases[] = {
      {"<think>\nI add.\n</think>\n\nFour.", "I add.\n", "Four."},
      {"  \n<think>r</think>a", "r", "a"},
      {"Four.", "", "Four."},
      {"<think>\nunclosed  reason \n", "unclosed  reason \n", ""},
      {"x<think>r</think>y", "", "x<think>r</think>y"},
      {"<thi", "", ""},
      {"\n\n", "", ""},
      {"", "", ""},
      {"<think></think>", "", ""},
      {"<think>\xc3\xa9 \xc3\xbc\n</thi</think>\n\n\xe6\x97\xa5 <think>", "\xc3\xa9 \xc3\xbc\n</thi", "\xe6\x97\xa5 <think>"},
      {"<think>a</think>b</think>c", "a", "b</think>c"},
      {"<think>a \n </think", "a \n ", ""},
      {"<think>\n\nA  \n\n</think>\n\n\nB\n", "\nA  \n\n", "\nB\n"},
      {"  hi  ", "", "hi  "},
      {"<think>r</think>  \n a", "r", "  \n a"},
      {"\t<think>\r\nr</think>x", "\r\nr", "x"},
      {"Four.<thi", "", "Four.<thi"},
      {"a</think>b", "", "a</think>b"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *t = cases[i].text;
    const size_t n = strlen(t);
    size_t rs, re, cs;
    const int has = ll_chat_reasoning_split(t, n, &rs, &re, &cs);
    CHECKF(has == !strncmp(t + strspn(t, " \t\r\n"), "<think>", 7) && re - rs == strlen(cases[i].reasoning) &&
               !memcmp(t + rs, cases[i].reasoning, re - rs) && !strcmp(t + cs, cases[i].content),
           "split case %zu: reasoning '%.*s' content '%s'", i, (int)(re - rs), t + rs, t + cs);
    for (int by_char = 0; by_char < 2; by_char++) {
      struct ll_chat_reasoning st = {0};
      struct split_acc a = {.order_ok = 1, .utf8_ok = 1};
      int rc = 0;
      for (size_t k = 0; k < n && !rc;) {
        size_t step = 1;
        if (by_char) step = (unsigned char)t[k] >= 0xf0 ? 4 : (unsigned char)t[k] >= 0xe0 ? 3 : (unsigned char)t[k] >= 0xc0 ? 2 : 1;
        rc = ll_chat_reasoning_feed(&st, t + k, step, 0, split_emit, &a);
        k += step;
      }
      rc |= ll_chat_reasoning_feed(&st, "", 0, 1, split_emit, &a);
      a.r[a.nr] = a.c[a.nc] = 0;
      CHECKF(rc == 0 && a.order_ok && !strcmp(a.r, cases[i].reasoning) && !strcmp(a.c, cases[i].content) &&
                 (!by_char || a.utf8_ok),
             "streamed case %zu (%s): reasoning '%s' content '%s'", i, by_char ? "by character" : "by byte", a.r, a.c);
      ll_chat_reasoning_free(&st);
    }
  }
}

int main(int argc, char **argv) {
  test_reasoning_split();
  if (argc > 1) test_qwen3_ref(argv[1]);
  struct ll_proto_req q;
  const char *code;
  char err[256], buf[4096];

  // The example from the issue.
  CHECK(parse("GEN id=a1 max_tokens=32 temperature=0 :Once upon a time", &q, buf, &code, err) == 0);
  CHECK(strcmp(q.verb, "GEN") == 0);
  CHECK(q.id && strcmp(q.id, "a1") == 0);
  CHECK(q.n_params == 3);
  CHECK(q.has_text && q.text_len == 16 && memcmp(q.text, "Once upon a time", 16) == 0);
  CHECK(strcmp(ll_proto_find(&q, "max_tokens")->val, "32") == 0);
  int64_t iv;
  double dv;
  CHECK(ll_proto_int(ll_proto_find(&q, "max_tokens"), 1, 100, &iv, err, sizeof err) == 0 && iv == 32);
  CHECK(ll_proto_int(ll_proto_find(&q, "max_tokens"), 1, 10, &iv, err, sizeof err) != 0 && strstr(err, "out of range"));
  CHECK(ll_proto_float(ll_proto_find(&q, "temperature"), 0, 2, &dv, err, sizeof err) == 0 && dv == 0.0);

  // adapter=NAME: letters, digits, '.', '_', '-', ':', 1..127 bytes (a fine-tuned model's
  // ft:BASE:SUFFIX:ID; a ':' inside a value does not start the text, only ' :' does).
  {
    char name[LL_ADAPTER_NAME_MAX + 1];
    CHECK(parse("GEN adapter=my-run.step_100 :x", &q, buf, &code, err) == 0);
    CHECK(ll_proto_name(ll_proto_find(&q, "adapter"), name, sizeof name, err, sizeof err) == 0 && strcmp(name, "my-run.step_100") == 0);
    CHECK(parse("GEN adapter=ft:demo:my-suffix:ab12cd34 max_tokens=3 :x", &q, buf, &code, err) == 0 && q.has_text && !strcmp(q.text, "x"));
    CHECK(ll_proto_name(ll_proto_find(&q, "adapter"), name, sizeof name, err, sizeof err) == 0 && !strcmp(name, "ft:demo:my-suffix:ab12cd34"));
    CHECK(ll_proto_find(&q, "max_tokens") != NULL);
    CHECK(parse("GEN adapter=ft::: :x", &q, buf, &code, err) == 0);
    CHECK(ll_proto_name(ll_proto_find(&q, "adapter"), name, sizeof name, err, sizeof err) == 0 && !strcmp(name, "ft:::"));
    CHECK(parse("GEN adapter=a/b :x", &q, buf, &code, err) == 0);
    CHECK(ll_proto_name(ll_proto_find(&q, "adapter"), name, sizeof name, err, sizeof err) == LL_EINVAL && strstr(err, "byte 1"));
    CHECK(parse("GEN adapter=\\x00 :x", &q, buf, &code, err) == 0);
    CHECK(ll_proto_name(ll_proto_find(&q, "adapter"), name, sizeof name, err, sizeof err) == LL_EINVAL);
    CHECK(parse("GEN adapter=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa :x", &q, buf, &code, err) == 0); // 128 bytes
    CHECK(ll_proto_name(ll_proto_find(&q, "adapter"), name, sizeof name, err, sizeof err) == LL_EINVAL && strstr(err, "1..127"));
  }

  // Case-insensitive verb, text with escapes and a leading space kept, CRLF.
  CHECK(parse("gen : two\\nlines\\t\\\\ \\xC3\\xA9\r", &q, buf, &code, err) == 0);
  CHECK(strcmp(q.verb, "GEN") == 0 && q.id == NULL);
  CHECK(q.text_len == strlen(" two\nlines\t\\ \xC3\xA9") && memcmp(q.text, " two\nlines\t\\ \xC3\xA9", q.text_len) == 0);
  // The text may hold NUL via \x00 and " :" inside text is just text.
  CHECK(parse("GEN :a\\x00b :c", &q, buf, &code, err) == 0 && q.text_len == 6 && q.text[1] == 0 && q.text[3] == ' ');
  // Values are unescaped too; repeated keys are kept in order.
  CHECK(parse("GEN stop=\\n stop=\\x20end :x", &q, buf, &code, err) == 0);
  CHECK(q.n_params == 2 && strcmp(q.params[0].val, "\n") == 0 && strcmp(q.params[1].val, " end") == 0);
  CHECK(parse("PING", &q, buf, &code, err) == 0 && !q.has_text && q.n_params == 0);
  CHECK(parse(":text only", &q, buf, &code, err) != 0 && strcmp(code, "bad_request") == 0);

  // Errors name what was wrong.
  CHECK(parse("GEN :bad \\q", &q, buf, &code, err) != 0 && strcmp(code, "bad_escape") == 0 && strstr(err, "\\q"));
  CHECK(parse("GEN :bad \\x4", &q, buf, &code, err) != 0 && strcmp(code, "bad_escape") == 0);
  CHECK(parse("GEN :trailing \\", &q, buf, &code, err) != 0 && strcmp(code, "bad_escape") == 0);
  CHECK(parse("GEN max_tokens :x", &q, buf, &code, err) != 0 && strcmp(code, "bad_param") == 0 && strstr(err, "key=value"));
  CHECK(parse("GEN id=a id=b :x", &q, buf, &code, err) != 0 && strstr(err, "twice"));
  CHECK(parse("GEN id=- :x", &q, buf, &code, err) != 0);
  CHECK(parse("", &q, buf, &code, err) != 0 && strstr(err, "empty"));
  CHECK(parse("G\x01N", &q, buf, &code, err) != 0 && strstr(err, "0x01"));
  CHECK(parse("VERYLONGCOMMANDNAMEX", &q, buf, &code, err) != 0);
  {
    char many[2048] = "GEN";
    for (int i = 0; i < 40; i++) strcat(many, " k=v");
    CHECK(parse(many, &q, buf, &code, err) != 0 && strstr(err, "more than"));
  }
  // Numbers are strict.
  struct ll_proto_param p = {"n", "12x", 3};
  CHECK(ll_proto_int(&p, 0, 100, &iv, err, sizeof err) != 0);
  p.val = "99999999999999999999999", p.val_len = strlen(p.val);
  CHECK(ll_proto_int(&p, INT64_MIN, INT64_MAX, &iv, err, sizeof err) != 0);
  p.val = "nan", p.val_len = 3;
  CHECK(ll_proto_float(&p, -1e9, 1e9, &dv, err, sizeof err) != 0);
  p.val = "0x10", p.val_len = 4;
  CHECK(ll_proto_float(&p, -1e9, 1e9, &dv, err, sizeof err) != 0);
  p.val = "0.5", p.val_len = 3;
  CHECK(ll_proto_float(&p, 0, 1, &dv, err, sizeof err) == 0 && dv == 0.5);

  // Escaping: valid UTF-8 passes through; controls, backslash, invalid bytes are escaped.
  char out[256];
  size_t k = ll_proto_escape("a\\b\nc\t\x01\xC3\xA9\xff\xE2\x82", 12, 0, out, sizeof out);
  out[k] = 0;
  CHECKF(strcmp(out, "a\\\\b\\nc\\t\\x01\xC3\xA9\\xFF\\xE2\\x82") == 0, "%s", out);
  k = ll_proto_escape("a b", 3, 1, out, sizeof out);
  out[k] = 0;
  CHECK(strcmp(out, "a\\x20b") == 0);
  k = ll_proto_escape("\xED\xA0\x80", 3, 0, out, sizeof out); // a surrogate is not valid UTF-8
  out[k] = 0;
  CHECK(strcmp(out, "\\xED\\xA0\\x80") == 0);
  CHECK(ll_proto_escape("xyz", 3, 0, out, 1) == 3); // snprintf-like length

  // Incomplete UTF-8 tails are held back; impossible bytes are not.
  CHECK(ll_utf8_complete_prefix("ab\xC3", 3) == 2);
  CHECK(ll_utf8_complete_prefix("ab\xE2\x82", 4) == 2);
  CHECK(ll_utf8_complete_prefix("ab\xE2\x82\xAC", 5) == 5);
  CHECK(ll_utf8_complete_prefix("ab\xff", 3) == 3);

  // Chat: detection and rendering like llama.cpp's.
  CHECK(strcmp(ll_chat_detect("{% ... '<|im_start|>' + role %}"), "chatml") == 0);
  CHECK(strcmp(ll_chat_detect("<|start_header_id|> ... <|eot_id|>"), "llama3") == 0);
  CHECK(ll_chat_detect("{{ something else }}") == NULL);
  struct ll_chat_msg *msgs;
  void *store;
  const char *js = "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\\nthere\"}]";
  int n = ll_chat_parse(js, strlen(js), &msgs, &store, err, sizeof err);
  CHECK(n == 2);
  char *r = NULL;
  CHECK(ll_chat_render("<|im_start|>", msgs, n, &r, err, sizeof err) == 0);
  CHECKF(r && strcmp(r, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n") == 0, "%s", r);
  free(r);
  // The families of issue 32, as llama.cpp's llm_chat_apply_template renders them: Gemma's turns
  // (the system text merged into the first user turn, the assistant's role "model"), Phi-3's, and
  // Qwen3's template (chatml; its <think> handling is the training data's, ll_data.h).
  CHECK(!strcmp(ll_chat_detect("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\n' }}"), "gemma"));
  CHECK(!strcmp(ll_chat_detect("{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n'}}"
                               "{% endfor %}{{ '<|assistant|>\n' }}"),
                "phi3"));
  CHECK(!strcmp(ll_chat_detect("{%- if enable_thinking is defined %}<|im_start|>assistant\n<think>\n\n</think>\n\n{%- endif %}"), "qwen3"));
  CHECK(ll_chat_render("gemma", msgs, n, &r, err, sizeof err) == 0);
  CHECKF(r && !strcmp(r, "<start_of_turn>user\nBe brief.\n\nHi\nthere<end_of_turn>\n<start_of_turn>model\n"), "%s", r);
  free(r);
  CHECK(ll_chat_render("phi3", msgs, n, &r, err, sizeof err) == 0);
  CHECKF(r && !strcmp(r, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi\nthere<|end|>\n<|assistant|>\n"), "%s", r);
  free(r);
  CHECK(ll_chat_render(NULL, msgs, n, &r, err, sizeof err) != 0 && strstr(err, "no chat template"));
  ll_chat_free_store(store, msgs);
  n = ll_chat_parse("plain words", 11, &msgs, &store, err, sizeof err);
  CHECK(n == 1 && strcmp(msgs[0].role, "user") == 0 && strcmp(msgs[0].content, "plain words") == 0);
  ll_chat_free_store(store, msgs);
  CHECK(ll_chat_parse("[{\"role\":\"robot\",\"content\":\"x\"}]", 32, &msgs, &store, err, sizeof err) < 0 && strstr(err, "robot"));
  CHECK(ll_chat_parse("[1,2", 4, &msgs, &store, err, sizeof err) < 0 && strstr(err, "invalid JSON"));
  const char *bad_rc = "[{\"role\":\"user\",\"content\":\"x\",\"reasoning_content\":\"r\"}]";
  CHECK(ll_chat_parse(bad_rc, strlen(bad_rc), &msgs, &store, err, sizeof err) < 0 && strstr(err, "reasoning_content"));

  // Marked rendering (issue 28): the same text, and the marks are the template's text exactly -
  // the bytes outside them are the messages' contents in order, whatever markers they contain.
  const char *names[] = {"chatml", "llama2", "llama3", "zephyr", "gemma", "phi3", "qwen3"};
  const struct ll_chat_msg conv[] = {{"system", "S<|im_end|>", NULL}, {"user", "</s>[/INST]<|eot_id|>", NULL}, {"assistant", "<end_of_turn>ok", NULL},
                                     {"user", "<|end|><|assistant|>", NULL}};
  const char *contents = "S<|im_end|></s>[/INST]<|eot_id|><end_of_turn>ok<|end|><|assistant|>";
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char *plain = NULL, *marked = NULL, outside[256];
    struct ll_tok_span *mk = NULL;
    int nm = 0;
    CHECK(ll_chat_render(names[i], conv, 4, &plain, err, sizeof err) == 0);
    CHECKF(ll_chat_render_marked(names[i], conv, 4, &marked, &mk, &nm, err, sizeof err) == 0, "%s: %s", names[i], err);
    size_t o = 0, at = 0;
    int ok = plain && marked && !strcmp(plain, marked) && nm > 0;
    for (int j = 0; ok && j <= nm; j++) {
      size_t st = j < nm ? mk[j].start : strlen(marked);
      ok &= st >= at && o + (st - at) < sizeof outside && (j == nm || mk[j].end > st);
      if (!ok) break;
      memcpy(outside + o, marked + at, st - at), o += st - at;
      at = j < nm ? mk[j].end : at;
    }
    outside[ok ? o : 0] = 0;
    CHECKF(ok && !strcmp(outside, contents), "%s: outside the marks '%s'", names[i], outside);
    free(plain), free(marked), free(mk);
  }
  // a model without a template: the message says how to set one
  CHECK(ll_chat_render(NULL, conv, 1, &r, err, sizeof err) == LL_EUNSUPPORTED && strstr(err, "chat_template"));

  // chat_template settings (issue 28, 8a): built-in names, template files, and the refusals.
  char *tt = NULL;
  CHECK(ll_chat_template_load("llama3", &tt, err, sizeof err) == 0 && tt && !strcmp(tt, "llama3"));
  free(tt);
  CHECKF(ll_chat_template_load("chatml2", &tt, err, sizeof err) == LL_EINVAL && !tt && strstr(err, "'chatml2'") &&
             strstr(err, "chatml, llama2, llama3, zephyr, gemma, phi3, qwen3"),
         "%s", err);
  char dir[512], path[600];
  if (ll_test_tmpdir(dir, sizeof dir)) {
    snprintf(path, sizeof path, "%s/t.jinja", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("{% for m in messages %}{{ '<start_of_turn>' + m.role }}{% endfor %}", f), fclose(f);
    CHECKF(ll_chat_template_load(path, &tt, err, sizeof err) == 0 && tt && !strcmp(ll_chat_detect(tt), "gemma"), "%s", err);
    CHECK(tt && ll_chat_render(tt, conv + 1, 1, &r, err, sizeof err) == 0 && !strcmp(r, "<start_of_turn>user\n</s>[/INST]<|eot_id|><end_of_turn>\n<start_of_turn>model\n"));
    free(r), free(tt);
    f = fopen(path, "w");
    if (f) fputs("{{ unknown }}", f), fclose(f);
    CHECKF(ll_chat_template_load(path, &tt, err, sizeof err) == LL_EUNSUPPORTED && !tt && strstr(err, "not of a known format"), "%s", err);
    remove(path);
    rmdir(dir);
  }
  // The scheduler's events as response lines, byte for byte (man/llsrv-protocol.7).
  {
    struct ll_sched_ev *ev = calloc(1, sizeof *ev + 64);
    char line[256];
    size_t kl;
#define LINE(want) (kl = ll_proto_encode_event(ev, line, sizeof line), kl == strlen(want) && memcmp(line, want, kl) == 0)
    snprintf(ev->id, sizeof ev->id, "a1");
    ev->type = LL_EV_TOKEN;
    memcpy(ev->data, "x y\n\x01", 5), ev->len = 5;
    CHECKF(LINE("TOK a1 :x y\\n\\x01\n"), "%.*s", (int)kl, line);
    ev->type = LL_EV_PROB, ev->token = 7, ev->n_top = 2, ev->top[0] = (struct ll_token_prob){7, -0.5f}, ev->top[1] = (struct ll_token_prob){3, -1.25f};
    CHECKF(LINE("PROB a1 token=7 top=7:-0.5000,3:-1.2500\n"), "%.*s", (int)kl, line);
    ev->n_top = 0; // the sampled token's logprob alone (HTTP's logprobs) has no line
    CHECK(ll_proto_encode_event(ev, line, sizeof line) == 0);
    ev->type = LL_EV_END, ev->final = 1, ev->reason = "length", ev->prompt_tokens = 3, ev->tokens = 2, ev->prefill_ms = 1.25, ev->decode_ms = 10;
    ev->len = 0;
    CHECKF(LINE("END a1 reason=length prompt_tokens=3 tokens=2 prefill_ms=1.2 decode_ms=10.0\n"), "%.*s", (int)kl, line);
    ev->reason = "error";
    memcpy(ev->data, "bad\n", 4), ev->len = 4;
    CHECKF(LINE("END a1 reason=error prompt_tokens=3 tokens=2 prefill_ms=1.2 decode_ms=10.0 :bad\\n\n"), "%.*s", (int)kl, line);
    ev->type = LL_EV_ERROR, ev->code = "bad_param";
    memcpy(ev->data, "no: x", 5), ev->len = 5;
    CHECKF(LINE("ERR a1 bad_param :no: x\n"), "%.*s", (int)kl, line);
    ev->type = LL_EV_IDS, ev->n_ids = 3;
    int32_t ids[3] = {1, 22, 333};
    memcpy(ev->data, ids, sizeof ids), ev->len = sizeof ids;
    CHECKF(LINE("IDS a1 n=3 :1 22 333\n"), "%.*s", (int)kl, line);
    ev->type = LL_EV_TEXT;
    memcpy(ev->data, "he\tllo", 6), ev->len = 6;
    CHECKF(LINE("TEXT a1 :he\\tllo\n"), "%.*s", (int)kl, line);
    // Too small a buffer: nothing past cap is written, the full length is returned.
    CHECK(ll_proto_encode_event(ev, line, 4) == strlen("TEXT a1 :he\\tllo\n"));
    ev->type = LL_EV_MONITOR;
    CHECK(ll_proto_encode_event(ev, line, sizeof line) == 0);
#undef LINE
    free(ev);
  }
  return ll_test_summary();
}
