// tokenizer.c - SentencePiece-style and BPE tokenizers (byte-level, or raw UTF-8 for Gemma 4)
// built from GGUF metadata.
//
// The algorithms follow llama.cpp's so that ids match it exactly (users compare against it):
//  - special/user-defined token texts are split out of the input first (longest first);
//  - SPM: whitespace escaped to U+2581 with a prefix space, bigram merges by score (ties: leftmost),
//    re-segmentation through the merge history, byte fallback <0xXX>;
//  - BPE: the pre-tokenizer regexes named by tokenizer.ggml.pre (run with PCRE2 in UTF+UCP mode,
//    each regex further splitting the pieces of the previous one), GPT-2 byte-to-unicode
//    mapping, merges by rank (ties: leftmost).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "ll_tokenizer.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"
#include "ll_modelfile.h"

enum { TOK_SPM = 1, TOK_BPE = 2 };
#define MAX_REGEX 6
#define MAX_TOKEN_TEXT 4096

struct tok_entry {
  char *text;
  uint32_t len;
  float score;
  int attr;
};

// Open-addressing map from a byte string to an int (token id or merge rank).
struct strmap {
  uint32_t *slot; // index + 1 into keys, 0 = empty
  size_t cap;
  const char **key;
  uint32_t *klen;
  int32_t *val;
  size_t n, kcap;
};

struct ll_tokenizer {
  int type;
  int32_t n_vocab;
  struct tok_entry *tok;
  struct strmap text_to_id;
  struct strmap merges; // "left right" -> rank
  char *merge_store;    // backing for merge keys
  int32_t bos, eos, eot, unk, pad;
  int add_bos, add_eos, add_space_prefix;
  int pre_flags; // PRE_* of its pre-tokenizer (BPE)
  pcre2_code *re[MAX_REGEX];
  uint8_t re_digits3[MAX_REGEX]; // regex i finds digit runs that bpe_split_digits3 cuts
  int n_re;
  int32_t *special; // CONTROL / USER_DEFINED / UNKNOWN tokens, longest text first
  int n_special;
  int32_t byte_tok[256]; // SPM: <0xXX> ids; BPE: id of the mapped byte char (-1 if none)
  uint8_t *eog;          // per token: end of generation
  char *chat_template;
  uint32_t byte_to_cp[256];
  int16_t cp_to_byte[512];
};

// ---------------------------------------------------------------- helpers

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h;
}

static int strmap_init(struct strmap *m, size_t n) {
  memset(m, 0, sizeof *m);
  m->cap = 64;
  while (m->cap < n * 2 + 2) m->cap <<= 1;
  m->slot = calloc(m->cap, sizeof *m->slot);
  m->kcap = n + 1;
  m->key = calloc(m->kcap, sizeof *m->key);
  m->klen = calloc(m->kcap, sizeof *m->klen);
  m->val = calloc(m->kcap, sizeof *m->val);
  return (m->slot && m->key && m->klen && m->val) ? 0 : LL_ENOMEM;
}

static void strmap_free(struct strmap *m) {
  free(m->slot);
  free(m->key);
  free(m->klen);
  free(m->val);
}

static int32_t strmap_get(const struct strmap *m, const char *s, size_t n) {
  if (!m->cap) return -1;
  size_t i = (size_t)fnv1a(s, n) & (m->cap - 1);
  while (m->slot[i]) {
    uint32_t k = m->slot[i] - 1;
    if (m->klen[k] == n && memcmp(m->key[k], s, n) == 0) return m->val[k];
    i = (i + 1) & (m->cap - 1);
  }
  return -1;
}

// Inserts (key borrowed). `overwrite`: replace an existing value (else keep the first).
static void strmap_put(struct strmap *m, const char *s, size_t n, int32_t v, int overwrite) {
  size_t i = (size_t)fnv1a(s, n) & (m->cap - 1);
  while (m->slot[i]) {
    uint32_t k = m->slot[i] - 1;
    if (m->klen[k] == n && memcmp(m->key[k], s, n) == 0) {
      if (overwrite) m->val[k] = v;
      return;
    }
    i = (i + 1) & (m->cap - 1);
  }
  if (m->n >= m->kcap) return; // sized at init: cannot happen
  m->key[m->n] = s;
  m->klen[m->n] = (uint32_t)n;
  m->val[m->n] = v;
  m->slot[i] = (uint32_t)++m->n;
}

static size_t utf8_len(unsigned char c) {
  static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[c >> 4];
}

static size_t utf8_put(uint32_t cp, char *out) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

// Decode one code point as llama.cpp does: structural check of the continuation bytes only;
// an invalid sequence yields U+FFFD and consumes one byte.
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *adv) {
  unsigned char c = s[0];
  if (!(c & 0x80)) {
    *adv = 1;
    return c;
  }
  if ((c & 0xE0) == 0xC0 && n >= 2 && (s[1] & 0xC0) == 0x80) {
    *adv = 2;
    return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
  }
  if ((c & 0xF0) == 0xE0 && n >= 3 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
    *adv = 3;
    return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  }
  if ((c & 0xF8) == 0xF0 && n >= 4 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80) {
    *adv = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  }
  *adv = 1;
  return 0xFFFD;
}

// Growable output id buffer.
struct idbuf {
  int32_t *ids;
  int cap;
  int n; // total produced (may exceed cap)
};
static void idbuf_push(struct idbuf *b, int32_t id) {
  if (b->n < b->cap) b->ids[b->n] = id;
  b->n++;
}

// ---------------------------------------------------------------- pre-tokenizer regexes
//
// One entry per pre-tokenizer type of llama.cpp 0c1e5709 (src/llama-vocab.cpp), with the
// tokenizer.ggml.pre names that select it and the regexes as llama.cpp writes them. llama.cpp
// runs a regex with a \p{..} class on a "collapsed" text (each non-ASCII code point replaced by
// its category), otherwise with std::wregex (non-ASCII whitespace replaced by \v); PCRE2 in
// UTF+UCP mode gives the same splits with three adjustments made when compiling (pre_compile):
//  - \p{Lu} \p{Ll} \p{Lt} \p{Lm} \p{Lo} all become \p{L}: collapsing keeps only "letter", so
//    llama.cpp cannot tell upper from lower case there (youtu, tiny_aya);
//  - \d becomes [0-9] (ECMAScript's \d is ASCII, PCRE2's UCP \d is not);
//  - $ matches only at the very end (PCRE2_DOLLAR_ENDONLY, as ECMAScript's $).
// Classes of non-ASCII literals that include a whitespace code point (which llama.cpp's \v
// substitution keeps from matching) are written here with a (?!NAWS) guard; and the custom C
// splitters llama.cpp uses for some patterns (kimi-k2, afmoe digit groups) are written as the
// regexes they compute.

enum {
  PRE_IGNORE_MERGES = 1, // a word that is a whole token is taken as is
  PRE_ADD_BOS = 2,       // add_bos defaults to true
  PRE_NO_BOS = 4,        // no default BOS id
  PRE_RAW = 8,           // no GPT-2 byte-to-unicode mapping: raw UTF-8, <0xXX> byte fallback
  PRE_ESCAPE_WS = 16,    // spaces become U+2581 before splitting (SPM-style BPE)
  PRE_NL_WORD = 32,      // a word of newlines that is a token is kept whole (Gemma 4)
  PRE_FORCE_BOS = 64,    // add_bos is true even where the file says false (Gemma 4)
  PRE_NO_MERGES_OK = 128 // tokenizer.ggml.merges may be absent (kimi-k2)
};

struct pre_def {
  const char *names; // '|' separated tokenizer.ggml.pre values
  int flags;
  const char *re[MAX_REGEX];
};

#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                              \
  RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                               \
  RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_DS3_MAIN                                                                                            \
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O_WORDS(LM)                                                                                     \
  "[^\\r\\n\\p{L}\\p{N}]?((?=[" LM "])([^a-z]))*((?=[" LM "])([^A-Z]))+" RE_CONTRACT "?|[^\\r\\n\\p{L}\\p{N}]?((?=[" LM \
  "])([^a-z]))+((?=[" LM "])([^A-Z]))*" RE_CONTRACT "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CASED_WORDS(DIGITS)                                                                                 \
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACT                \
  "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACT "?|" DIGITS \
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
// llama.cpp's non-ASCII whitespace (unicode_set_whitespace above U+007F).
#define NAWS "(?![\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}])"
// unicode_cpt_is_han().
#define HAN                                                                                                    \
  "\\x{4e00}-\\x{9fff}\\x{3400}-\\x{4dbf}\\x{20000}-\\x{2a6df}\\x{2a700}-\\x{2b73f}\\x{2b740}-\\x{2b81f}\\x{2b820}-" \
  "\\x{2ceaf}\\x{2ceb0}-\\x{2ebef}\\x{f900}-\\x{faff}\\x{2f800}-\\x{2fa1f}"
// unicode_regex_split_custom_afmoe(): a run of digits splits into groups of three from the
// right; the text before the run stays glued to its first group (as llama.cpp's splitter does).
// Done in C (bpe_split_digits3), linear in the text, on the runs this regex finds.
#define RE_SPLIT_DIGITS3 "\x01"
#define RE_AFMOE_DIGITS RE_SPLIT_DIGITS3 "\\p{N}+"

static const struct pre_def pre_defs[] = {
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", PRE_IGNORE_MERGES | PRE_ADD_BOS, {RE_LLAMA3}},
    {"dbrx|smaug-bpe", 0, {RE_LLAMA3}},
    {"chatglm-bpe", PRE_NO_BOS, {RE_LLAMA3}},
    {"glm4|glm5", PRE_NO_BOS | PRE_IGNORE_MERGES, {RE_LLAMA3}},
    {"minicpm5", PRE_IGNORE_MERGES, {"\\p{N}{1,3}", RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"jais-2", 0, {RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|"
                    "\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"}},
    {"deepseek-llm", 0,
     {"[\r\n]",
      "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+",
      "\\s?(?:" NAWS "[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}])+", "\\s+$", "(?:" NAWS "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}])+", "\\p{N}+"}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", 0, {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+", RE_DS3_MAIN}},
    {"spark2_5", 0,
     {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+", "\\p{N}"}},
    {"youtu", PRE_IGNORE_MERGES,
     {"[\\x{ac00}-\\x{d7a3}\\x{3131}-\\x{318e}]+|[\\x{ff01}\\x{2026}\\x{201c}\\x{201d}\\x{2018}\\x{2019}\\x{2014}\\x{ff1a}\\x{ff1b}\\x{ff0c}\\x{3001}-\\x{303f}\\x{fe30}-\\x{fe4f}]+|[\\x{3105}-\\x{312f}]+|[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACT
      "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACT
      "?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"deepseek-coder", 0, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "(?:" NAWS "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}])+", "\\p{N}"}},
    {"falcon", 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", 0, {"\\p{N}", RE_GPT2}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|jina-v1-en|jina-v2-code|"
     "roberta-bpe|exaone4|mpt|olmo|jais|trillion|granite-docling",
     0, {RE_GPT2}},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open", 0, {RE_QWEN2}},
    {"qwen35", 0,
     {RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"poro-chat|bloom|gpt3-finnish", 0, {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{964}\\x{6d4}\\x{60c})]+"}},
    {"viking", 0, {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{964}\\x{6d4}\\x{60c})]+", "\\p{N}"}},
    {"tekken", PRE_IGNORE_MERGES | PRE_ADD_BOS,
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"chameleon", PRE_ADD_BOS,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2}},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", 0, {RE_GPT4O_WORDS("\\p{L}")}},
    {"granite-embed-multi-97m", PRE_IGNORE_MERGES, {RE_GPT4O_WORDS("\\p{L}\\p{M}")}},
    {"tiny_aya|cohere2moe", 0, {RE_AFMOE_DIGITS, RE_CASED_WORDS("\\p{N}{1,3}")}},
    {"kimi-k2", PRE_NO_MERGES_OK,
     {"[" HAN "]+|[^\\r\\n\\p{L}\\p{N}]?(?:(?![" HAN "])\\p{L})+" RE_CONTRACT "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"superbpe", 0, {"\\p{N}+", "(?=(\\d{3})+(?!\\d))"}},
    {"bailingmoe|bailingmoe2|llada-moe", 0,
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    {"seed-coder", 0, {RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"ufakzeka", 0, {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"grok-2", 0, {RE_QWEN2}},
    {"afmoe", 0, {RE_AFMOE_DIGITS, "[\\x{4e00}-\\x{9fff}\\x{3400}-\\x{4dbf}\\x{8c48}-\\x{faff}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}\\x{ff65}-\\x{ff9f}\\x{2f00}-\\x{2fdf}\\x{e40}-\\x{e7f}\\x{e80}-\\x{eff}\\x{1780}-\\x{17ff}\\x{1000}-\\x{109f}\\x{aa60}-\\x{aa7f}\\x{a9e0}-\\x{a9ff}\\x{ac00}-\\x{d7af}\\x{1100}-\\x{11ff}]+", RE_DS3_MAIN}},
    {"laguna", 0, {"[^\\n]+|[\\n]+", RE_QWEN2}},
    {"exaone-moe", 0,
     {RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    {"gemma4|granite-embed-multi-311m", PRE_RAW | PRE_ESCAPE_WS | PRE_NL_WORD | PRE_FORCE_BOS, {"[^\\n]+|[\\n]+"}},
    {"sarvam-moe", PRE_RAW | PRE_ESCAPE_WS, {"[^\\n]+|[\\n]+"}},
    {"whitespace", PRE_RAW, {"\\S+"}},
};

static const struct pre_def *pre_find(const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++) {
    const char *p = pre_defs[i].names;
    while (*p) {
      const char *bar = strchr(p, '|');
      size_t len = bar ? (size_t)(bar - p) : strlen(p);
      if (len == n && memcmp(p, name, n) == 0) return &pre_defs[i];
      p += len + (bar ? 1 : 0);
    }
  }
  return NULL;
}

// The regex as PCRE2 must see it to split as llama.cpp does (see the table's comment):
// \p{Lu|Ll|Lt|Lm|Lo} -> \p{L}, \d -> [0-9]. Returns a malloc'd string.
static char *pre_adapt(const char *re) {
  size_t n = strlen(re);
  char *out = malloc(n * 3 + 1);
  if (!out) return NULL;
  size_t o = 0;
  int in_class = 0;
  for (size_t i = 0; i < n; i++) {
    if (re[i] == '\\' && i + 1 < n) {
      if (re[i + 1] == 'p' && i + 5 < n && re[i + 2] == '{' && re[i + 3] == 'L' && re[i + 5] == '}' && strchr("ultmo", re[i + 4])) {
        memcpy(out + o, "\\p{L}", 5), o += 5, i += 5;
        continue;
      }
      if (re[i + 1] == 'd') {
        const char *d = in_class ? "0-9" : "[0-9]";
        memcpy(out + o, d, strlen(d)), o += strlen(d), i += 1;
        continue;
      }
      out[o++] = re[i++];
      out[o++] = re[i];
      continue;
    }
    if (re[i] == '[' && !in_class) in_class = 1;
    else if (re[i] == ']' && in_class) in_class = 0;
    out[o++] = re[i];
  }
  out[o] = 0;
  return out;
}

// ---------------------------------------------------------------- construction

void ll_tokenizer_free(struct ll_tokenizer *t) {
  if (!t) return;
  for (int32_t i = 0; i < t->n_vocab && t->tok; i++) free(t->tok[i].text);
  free(t->tok);
  strmap_free(&t->text_to_id);
  strmap_free(&t->merges);
  free(t->merge_store);
  for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
  free(t->special);
  free(t->eog);
  free(t->chat_template);
  free(t);
}

static const struct ll_tokenizer *special_cmp_tok;
static int special_cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  uint32_t lx = special_cmp_tok->tok[x].len, ly = special_cmp_tok->tok[y].len;
  if (lx != ly) return lx > ly ? -1 : 1;
  return x < y ? -1 : x > y;
}

static int32_t get_id(const struct ll_modelfile *mf, const char *key, int32_t n_vocab, int32_t dflt) {
  int64_t v;
  if (ll_mf_get_int(mf, key, &v) != 0) return dflt;
  if (v < 0 || v >= n_vocab) return -1;
  return (int32_t)v;
}

static void init_byte_map(struct ll_tokenizer *t) {
  // GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n.
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t->byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
  }
  for (int i = 0; i < 512; i++) t->cp_to_byte[i] = -1;
  for (int b = 0; b < 256; b++) t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
}

int ll_tokenizer_from_mf(const struct ll_modelfile *mf, struct ll_tokenizer **out, char *err, size_t errlen) {
  const char *model = NULL, *pre = NULL;
  const struct ll_kv_array *toks = NULL, *scores = NULL, *types = NULL, *merges = NULL;
  *out = NULL;
  if (ll_mf_get_str(mf, "tokenizer.ggml.model", &model) != 0 || ll_mf_get_arr(mf, "tokenizer.ggml.tokens", &toks) != 0)
    return ll_errf(err, errlen, LL_ENOTFOUND, "tokenizer: the model file has no tokenizer (tokenizer.ggml.model / tokens)");
  int type;
  if (strcmp(model, "llama") == 0)
    type = TOK_SPM;
  else if (strcmp(model, "gpt2") == 0 || strcmp(model, "gemma4") == 0)
    type = TOK_BPE; // gemma4: BPE over raw UTF-8 with U+2581 for spaces (pre-tokenizer "gemma4")
  else if (strcmp(model, "bert") == 0)
    return ll_errf(err, errlen, LL_EUNSUPPORTED,
                   "tokenizer: tokenizer.ggml.model 'bert' (WordPiece, used by BERT-style embedding models) is not supported: "
                   "llsrv serves generative models (tokenizer models llama, gpt2, gemma4)");
  else
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "tokenizer: tokenizer.ggml.model '%s' is not supported (llama, gpt2, gemma4)", model);
  if (toks->elem_type != LL_KV_STR || toks->n == 0 || toks->n > (1u << 24))
    return ll_errf(err, errlen, LL_EFORMAT, "tokenizer: tokenizer.ggml.tokens must be a non-empty string array");
  int32_t n = (int32_t)toks->n;
  if (ll_mf_get_arr(mf, "tokenizer.ggml.scores", &scores) == 0 && (scores->elem_type != LL_KV_F32 || scores->n != toks->n))
    return ll_errf(err, errlen, LL_EFORMAT, "tokenizer: tokenizer.ggml.scores must be f32[%d]", n);
  if (ll_mf_get_arr(mf, "tokenizer.ggml.token_type", &types) == 0 && (types->elem_type != LL_KV_I32 || types->n != toks->n))
    return ll_errf(err, errlen, LL_EFORMAT, "tokenizer: tokenizer.ggml.token_type must be i32[%d]", n);

  struct ll_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return LL_ENOMEM;
  t->type = type;
  t->n_vocab = n;
  init_byte_map(t);
  t->tok = calloc((size_t)n, sizeof *t->tok);
  t->eog = calloc((size_t)n, 1);
  int rc = LL_ENOMEM;
  if (!t->tok || !t->eog || strmap_init(&t->text_to_id, (size_t)n) != 0) goto fail;
  const struct ll_str *ts = toks->data;
  for (int32_t i = 0; i < n; i++) {
    struct tok_entry *e = &t->tok[i];
    if (ts[i].len > MAX_TOKEN_TEXT) {
      rc = ll_errf(err, errlen, LL_ELIMIT, "tokenizer: token %d text is %llu bytes (limit %d)", i, (unsigned long long)ts[i].len, MAX_TOKEN_TEXT);
      goto fail;
    }
    e->text = malloc(ts[i].len + 1);
    if (!e->text) goto fail;
    memcpy(e->text, ts[i].ptr, ts[i].len);
    e->text[ts[i].len] = 0;
    e->len = (uint32_t)ts[i].len;
    e->score = scores ? ((const float *)scores->data)[i] : 0.0f;
    int gt = types ? ((const int32_t *)types->data)[i] : 1;
    switch (gt) {
    case 1: e->attr = LL_TOKEN_NORMAL; break;
    case 2: e->attr = LL_TOKEN_UNKNOWN; break;
    case 3: e->attr = LL_TOKEN_CONTROL; break;
    case 4: e->attr = LL_TOKEN_USER_DEFINED; break;
    case 5: e->attr = LL_TOKEN_UNUSED; break;
    case 6: e->attr = LL_TOKEN_BYTE; break;
    default: e->attr = 0; break;
    }
    strmap_put(&t->text_to_id, e->text, e->len, i, 1); // a repeated text maps to its last id
  }

  if (type == TOK_BPE) {
    if (strcmp(model, "gemma4") == 0)
      pre = "gemma4"; // as llama.cpp: the model type names the pre-tokenizer
    else if (ll_mf_get_str(mf, "tokenizer.ggml.pre", &pre) != 0)
      pre = "default";
    const struct pre_def *pd = pre_find(pre);
    if (!pd) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '%s' (llama.cpp 0c1e5709's are supported)", pre);
      goto fail;
    }
    t->pre_flags = pd->flags;
    int have_merges = ll_mf_get_arr(mf, "tokenizer.ggml.merges", &merges) == 0;
    if (have_merges ? merges->elem_type != LL_KV_STR : !(pd->flags & PRE_NO_MERGES_OK)) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "tokenizer: a %s tokenizer needs tokenizer.ggml.merges (string array)", model);
      goto fail;
    }
    static const struct ll_kv_array no_merges = {0};
    if (!have_merges) merges = &no_merges;
    const struct ll_str *ms = merges->data;
    size_t total = 0;
    for (uint64_t i = 0; i < merges->n; i++) total += ms[i].len + 1;
    t->merge_store = malloc(total ? total : 1);
    if (!t->merge_store || strmap_init(&t->merges, (size_t)merges->n) != 0) goto fail;
    char *w = t->merge_store;
    for (uint64_t i = 0; i < merges->n; i++) {
      // Split at the first space after the first byte, as llama.cpp does.
      const char *sp = ms[i].len > 1 ? memchr(ms[i].ptr + 1, ' ', ms[i].len - 1) : NULL;
      if (!sp) continue;
      memcpy(w, ms[i].ptr, ms[i].len);
      strmap_put(&t->merges, w, ms[i].len, (int32_t)i, 0); // first rank wins
      w += ms[i].len + 1;
    }
    for (int i = 0; i < MAX_REGEX && pd->re[i]; i++) {
      int ec;
      PCRE2_SIZE eo;
      const char *src = pd->re[i];
      if (src[0] == RE_SPLIT_DIGITS3[0]) t->re_digits3[i] = 1, src++;
      char *adapted = pre_adapt(src);
      if (!adapted) goto fail;
      t->re[i] = pcre2_compile((PCRE2_SPTR)adapted, PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
      free(adapted);
      if (!t->re[i]) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "tokenizer: pre-tokenizer '%s' regex %d does not compile (offset %zu)", pre, i, (size_t)eo);
        goto fail;
      }
      pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); // optional speed-up; falls back to the interpreter
      t->n_re = i + 1;
    }
    t->add_bos = (pd->flags & PRE_ADD_BOS) != 0;
    t->add_space_prefix = 0;
    int dflt = strcmp(model, "gemma4") == 0 ? -1 : 11; // llama.cpp's defaults per model type
    t->bos = get_id(mf, "tokenizer.ggml.bos_token_id", n, (pd->flags & PRE_NO_BOS) || n <= dflt ? -1 : dflt);
    t->eos = get_id(mf, "tokenizer.ggml.eos_token_id", n, n > dflt ? dflt : -1);
    t->unk = get_id(mf, "tokenizer.ggml.unknown_token_id", n, -1);
  } else {
    t->add_bos = 1;
    t->add_space_prefix = 1;
    t->bos = get_id(mf, "tokenizer.ggml.bos_token_id", n, n > 1 ? 1 : -1);
    t->eos = get_id(mf, "tokenizer.ggml.eos_token_id", n, n > 2 ? 2 : -1);
    t->unk = get_id(mf, "tokenizer.ggml.unknown_token_id", n, 0);
  }
  t->eot = get_id(mf, "tokenizer.ggml.eot_token_id", n, -1);
  t->pad = get_id(mf, "tokenizer.ggml.padding_token_id", n, -1);
  int b;
  if (ll_mf_get_bool(mf, "tokenizer.ggml.add_bos_token", &b) == 0) t->add_bos = b;
  if (ll_mf_get_bool(mf, "tokenizer.ggml.add_eos_token", &b) == 0) t->add_eos = b;
  if (ll_mf_get_bool(mf, "tokenizer.ggml.add_space_prefix", &b) == 0) t->add_space_prefix = b;
  if (t->pre_flags & PRE_FORCE_BOS) t->add_bos = 1; // llama.cpp's workaround for Gemma 4
  const char *tmpl;
  if (ll_mf_get_str(mf, "tokenizer.chat_template", &tmpl) == 0 && !(t->chat_template = strdup(tmpl))) goto fail;

  // Byte tokens.
  for (int i = 0; i < 256; i++) {
    char buf[8];
    size_t len;
    if (type == TOK_SPM || (t->pre_flags & PRE_RAW)) {
      len = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", i);
    } else {
      len = utf8_put(t->byte_to_cp[i], buf);
    }
    t->byte_tok[i] = strmap_get(&t->text_to_id, buf, len);
  }

  // Special tokens, longest first (ties: lower id first).
  t->special = malloc((size_t)n * sizeof *t->special);
  if (!t->special) goto fail;
  for (int32_t i = 0; i < n; i++)
    if (t->tok[i].attr & (LL_TOKEN_CONTROL | LL_TOKEN_USER_DEFINED | LL_TOKEN_UNKNOWN) && t->tok[i].len > 0) t->special[t->n_special++] = i;
  special_cmp_tok = t;
  qsort(t->special, (size_t)t->n_special, sizeof *t->special, special_cmp);

  // End-of-generation tokens: eos, eot, and the turn-ending tokens chat models use.
  static const char *const eog_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>", NULL};
  if (t->eos >= 0) t->eog[t->eos] = 1;
  if (t->eot >= 0) t->eog[t->eot] = 1;
  for (int i = 0; eog_names[i]; i++) {
    int32_t id = strmap_get(&t->text_to_id, eog_names[i], strlen(eog_names[i]));
    if (id >= 0 && (t->tok[id].attr & (LL_TOKEN_CONTROL | LL_TOKEN_USER_DEFINED))) t->eog[id] = 1;
  }
  *out = t;
  return 0;
fail:
  if (rc == LL_ENOMEM) ll_errf(err, errlen, rc, "tokenizer: out of memory");
  ll_tokenizer_free(t);
  return rc;
}

// ---------------------------------------------------------------- accessors

int32_t ll_tokenizer_n_vocab(const struct ll_tokenizer *t) { return t->n_vocab; }
int32_t ll_tokenizer_bos(const struct ll_tokenizer *t) { return t->bos; }
int32_t ll_tokenizer_eos(const struct ll_tokenizer *t) { return t->eos; }
int ll_tokenizer_add_bos(const struct ll_tokenizer *t) { return t->add_bos && t->bos >= 0; }
int ll_tokenizer_is_eog(const struct ll_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->eog[id]; }
int ll_tokenizer_token_attr(const struct ll_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab ? t->tok[id].attr : 0; }
const char *ll_tokenizer_chat_template(const struct ll_tokenizer *t) { return t->chat_template; }

// ---------------------------------------------------------------- merge queue (binary heap)

struct bigram {
  float score; // SPM: higher first
  int32_t rank; // BPE: lower first
  int left, right;
  size_t size;
};

struct heap {
  struct bigram *a;
  size_t n, cap;
  int spm;
};

// Does x come out before y?
static int bg_before(const struct heap *h, const struct bigram *x, const struct bigram *y) {
  if (h->spm) {
    if (x->score != y->score) return x->score > y->score;
  } else if (x->rank != y->rank) {
    return x->rank < y->rank;
  }
  return x->left < y->left;
}

static int heap_push(struct heap *h, struct bigram b) {
  if (h->n == h->cap) {
    size_t nc = h->cap ? h->cap * 2 : 64;
    struct bigram *na = realloc(h->a, nc * sizeof *na);
    if (!na) return LL_ENOMEM;
    h->a = na;
    h->cap = nc;
  }
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!bg_before(h, &b, &h->a[p])) break;
    h->a[i] = h->a[p];
    i = p;
  }
  h->a[i] = b;
  return 0;
}

static struct bigram heap_pop(struct heap *h) {
  struct bigram top = h->a[0], last = h->a[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && bg_before(h, &h->a[c + 1], &h->a[c])) c++;
    if (!bg_before(h, &h->a[c], &last)) break;
    h->a[i] = h->a[c];
    i = c;
  }
  if (h->n) h->a[i] = last;
  return top;
}

struct sym {
  const char *text;
  size_t n;
  int prev, next;
};

// Symbols = the UTF-8 characters of s (invalid lead bytes count as 1, truncated as the rest).
static int syms_split(const char *s, size_t len, struct sym **out, int *count) {
  struct sym *v = malloc((len ? len : 1) * sizeof *v);
  if (!v) return LL_ENOMEM;
  int k = 0;
  for (size_t off = 0; off < len; k++) {
    size_t cl = utf8_len((unsigned char)s[off]);
    if (cl > len - off) cl = len - off;
    v[k].text = s + off;
    v[k].n = cl;
    v[k].prev = k - 1;
    off += cl;
    v[k].next = off == len ? -1 : k + 1;
  }
  *out = v;
  *count = k;
  return 0;
}

// The merge loop both algorithms share: seed the queue with every adjacent pair, then
// repeatedly merge the best pair still valid (its two symbols unchanged) and queue the pairs
// it forms with its neighbours. `add` queues a pair if the vocabulary (SPM) or the merge
// table (BPE) has it.
typedef int (*bigram_add_fn)(void *ctx, struct sym *s, int l, int r, struct heap *h);

static int merge_loop(struct sym *s, int n, struct heap *h, bigram_add_fn add, void *ctx) {
  int rc;
  for (int i = 1; i < n; i++)
    if ((rc = add(ctx, s, i - 1, i, h))) return rc;
  while (h->n) {
    struct bigram b = heap_pop(h);
    struct sym *L = &s[b.left], *R = &s[b.right];
    if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; // outdated
    L->n += R->n;
    R->n = 0;
    L->next = R->next;
    if (R->next >= 0) s[R->next].prev = b.left;
    if ((rc = add(ctx, s, L->prev, b.left, h)) || (rc = add(ctx, s, b.left, L->next, h))) return rc;
  }
  return 0;
}

// ---------------------------------------------------------------- SPM

struct revmerge {
  struct strmap map; // text -> index into pairs
  int *pairs;        // left, right
  char **texts;
  int n, cap;
};

static int spm_try_bigram(const struct ll_tokenizer *t, struct sym *s, int l, int r, struct heap *h, struct revmerge *rm) {
  if (l < 0 || r < 0) return 0;
  size_t n = s[l].n + s[r].n;
  int32_t id = strmap_get(&t->text_to_id, s[l].text, n);
  if (id < 0) return 0;
  struct bigram b = {t->tok[id].score, 0, l, r, n};
  int rc = heap_push(h, b);
  if (rc) return rc;
  // Remember how this text was formed (the latest formation wins, as llama.cpp's map does).
  int32_t at = strmap_get(&rm->map, s[l].text, n);
  if (at >= 0) {
    rm->pairs[2 * at] = l;
    rm->pairs[2 * at + 1] = r;
    return 0;
  }
  if (rm->n == rm->cap) return 0; // sized for every possible bigram: cannot happen
  rm->pairs[2 * rm->n] = l;
  rm->pairs[2 * rm->n + 1] = r;
  strmap_put(&rm->map, s[l].text, n, rm->n, 0);
  rm->n++;
  return 0;
}

struct spm_adder {
  const struct ll_tokenizer *t;
  struct revmerge *rm;
};
static int spm_add(void *ctx, struct sym *s, int l, int r, struct heap *h) {
  struct spm_adder *a = ctx;
  return spm_try_bigram(a->t, s, l, r, h, a->rm);
}

static void spm_resegment(const struct ll_tokenizer *t, struct sym *s, int i, const struct revmerge *rm, struct idbuf *out, int depth) {
  int32_t id = strmap_get(&t->text_to_id, s[i].text, s[i].n);
  if (id >= 0) {
    idbuf_push(out, id);
    return;
  }
  int32_t at = depth < 256 ? strmap_get(&rm->map, s[i].text, s[i].n) : -1;
  if (at < 0) {
    for (size_t j = 0; j < s[i].n; j++) {
      int32_t b = t->byte_tok[(unsigned char)s[i].text[j]];
      idbuf_push(out, b >= 0 ? b : (t->unk >= 0 ? t->unk : 0));
    }
    return;
  }
  spm_resegment(t, s, rm->pairs[2 * at], rm, out, depth + 1);
  spm_resegment(t, s, rm->pairs[2 * at + 1], rm, out, depth + 1);
}

static int spm_encode(const struct ll_tokenizer *t, const char *text, size_t len, struct idbuf *out) {
  struct sym *s;
  int n, rc;
  if (len == 0) return 0;
  if ((rc = syms_split(text, len, &s, &n))) return rc;
  struct heap h = {0};
  h.spm = 1;
  struct revmerge rm = {0};
  rm.cap = n * 2 + 2;
  rm.pairs = malloc((size_t)rm.cap * 2 * sizeof *rm.pairs);
  if (!rm.pairs || (rc = strmap_init(&rm.map, (size_t)rm.cap)) != 0) {
    rc = LL_ENOMEM;
    goto done;
  }
  struct spm_adder add = {t, &rm};
  if ((rc = merge_loop(s, n, &h, spm_add, &add))) goto done;
  for (int i = 0; i != -1; i = s[i].next) spm_resegment(t, s, i, &rm, out, 0);
done:
  free(h.a);
  free(rm.pairs);
  strmap_free(&rm.map);
  free(s);
  return rc;
}

// ---------------------------------------------------------------- BPE

static int bpe_try_bigram(const struct ll_tokenizer *t, struct sym *s, int l, int r, struct heap *h, char *scratch) {
  if (l < 0 || r < 0) return 0;
  size_t n = s[l].n + s[r].n + 1;
  if (n > 2 * MAX_TOKEN_TEXT) return 0;
  memcpy(scratch, s[l].text, s[l].n);
  scratch[s[l].n] = ' ';
  memcpy(scratch + s[l].n + 1, s[r].text, s[r].n);
  int32_t rank = strmap_get(&t->merges, scratch, n);
  if (rank < 0) return 0;
  struct bigram b = {0, rank, l, r, s[l].n + s[r].n};
  return heap_push(h, b);
}

struct bpe_adder {
  const struct ll_tokenizer *t;
  char *scratch;
};
static int bpe_add(void *ctx, struct sym *s, int l, int r, struct heap *h) {
  struct bpe_adder *a = ctx;
  return bpe_try_bigram(a->t, s, l, r, h, a->scratch);
}

// One pre-tokenized word (already byte-to-unicode mapped unless PRE_RAW).
static int bpe_word(const struct ll_tokenizer *t, const char *w, size_t len, struct idbuf *out, char *scratch) {
  int whole = (t->pre_flags & PRE_IGNORE_MERGES) != 0;
  if (!whole && (t->pre_flags & PRE_NL_WORD)) { // Gemma 4: "\n\n\n" is a token of its own
    whole = 1;
    for (size_t i = 0; i < len && whole; i++) whole = w[i] == '\n';
  }
  if (whole) {
    int32_t id = strmap_get(&t->text_to_id, w, len);
    if (id >= 0) {
      idbuf_push(out, id);
      return 0;
    }
  }
  struct sym *s;
  int n, rc;
  if ((rc = syms_split(w, len, &s, &n))) return rc;
  struct heap h = {0};
  struct bpe_adder add = {t, scratch};
  if ((rc = merge_loop(s, n, &h, bpe_add, &add))) goto done;
  for (int i = 0; i < n; i++) {
    if (s[i].n == 0) continue;
    int32_t id = strmap_get(&t->text_to_id, s[i].text, s[i].n);
    if (id >= 0) {
      idbuf_push(out, id);
      continue;
    }
    for (size_t j = 0; j < s[i].n; j++) { // as llama.cpp: each byte of the symbol looked up alone
      int32_t bid = (t->pre_flags & PRE_RAW) ? t->byte_tok[(unsigned char)s[i].text[j]] : strmap_get(&t->text_to_id, s[i].text + j, 1);
      if (bid >= 0) idbuf_push(out, bid);
    }
  }
done:
  free(h.a);
  free(s);
  return rc;
}

// Piece ends under construction (byte offsets into the text).
struct ends {
  size_t *v;
  size_t n, cap;
};
static int ends_push(struct ends *e, size_t end) {
  if (e->n == e->cap) {
    size_t nc = e->cap ? e->cap * 2 : 16;
    size_t *nv = realloc(e->v, nc * sizeof *nv);
    if (!nv) return LL_ENOMEM;
    e->v = nv;
    e->cap = nc;
  }
  e->v[e->n++] = end;
  return 0;
}

// A run of digits [ms, me) found by a RE_SPLIT_DIGITS3 regex, cut as llama.cpp's
// unicode_regex_split_custom_afmoe does: len % 3 leading digits (glued to the text before the
// run), then groups of three.
static int bpe_split_digits3(const char *text, size_t ms, size_t me, struct ends *ne) {
  size_t k = 0;
  for (size_t i = ms; i < me; i += utf8_len((unsigned char)text[i])) k++;
  size_t group = k % 3 ? k % 3 : 3, in_group = 0;
  for (size_t i = ms; i < me;) {
    i += utf8_len((unsigned char)text[i]);
    if (i > me) i = me;
    if (++in_group == group) {
      int rc = ends_push(ne, i);
      if (rc) return rc;
      in_group = 0;
      group = 3;
    }
  }
  return 0;
}

// Split [0, len) of `text` by the pre-tokenizer regexes; each regex splits every piece of the
// previous pass into matches and the gaps between them (both kept), as llama.cpp's
// unicode_regex_split_stl does (an empty match only cuts). Offsets are byte offsets of piece ends.
static int bpe_pretokenize(const struct ll_tokenizer *t, const char *text, size_t len, size_t **ends_out, size_t *n_out) {
  struct ends cur = {0}, ne = {0};
  int rc = ends_push(&cur, len);
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (rc || !md) goto oom;
  for (int r = 0; r < t->n_re; r++) {
    ne.n = 0;
    size_t start = 0;
    for (size_t k = 0; k < cur.n; k++) {
      size_t seg_end = cur.v[k], seg_len = seg_end - start;
      const PCRE2_SPTR subj = (PCRE2_SPTR)(text + start);
      size_t pos = 0, last = 0;
      while (pos < seg_len) {
        int m = pcre2_match(t->re[r], subj, seg_len, pos, 0, md, NULL);
        if (m < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (t->re_digits3[r] && me > ms) {
          if (bpe_split_digits3(text, start + ms, start + me, &ne)) goto oom;
          last = pos = me;
          continue;
        }
        if (ms > last) { // the gap before the match
          if (ends_push(&ne, start + ms)) goto oom;
          last = ms;
        }
        if (me > ms) {
          if (ends_push(&ne, start + me)) goto oom;
          last = pos = me;
        } else { // empty match: step one character
          pos = ms + utf8_len(subj[ms]);
        }
      }
      if (last < seg_len && ends_push(&ne, seg_end)) goto oom;
      start = seg_end;
    }
    struct ends tmp = cur;
    cur = ne;
    ne = tmp;
  }
  pcre2_match_data_free(md);
  free(ne.v);
  *ends_out = cur.v;
  *n_out = cur.n;
  return 0;
oom:
  pcre2_match_data_free(md);
  free(cur.v);
  free(ne.v);
  return LL_ENOMEM;
}

static int bpe_encode(const struct ll_tokenizer *t, const char *text, size_t len, struct idbuf *out) {
  if (len == 0) return 0;
  // Normalise to valid UTF-8 the way llama.cpp does (invalid bytes become U+FFFD); SPM-style
  // BPE (Gemma 4) also escapes spaces as U+2581 first.
  const int esc = (t->pre_flags & PRE_ESCAPE_WS) != 0, raw = (t->pre_flags & PRE_RAW) != 0;
  char *clean = malloc(len * 3 + 1);
  char *scratch = malloc(4 * MAX_TOKEN_TEXT + 8);
  char *word = NULL;
  size_t *ends = NULL, n_ends = 0;
  int rc = LL_ENOMEM;
  if (!clean || !scratch) goto done;
  size_t cl = 0;
  for (size_t off = 0; off < len;) {
    size_t adv;
    uint32_t cp = utf8_next((const unsigned char *)text + off, len - off, &adv);
    if ((cp == 0xFFFD && adv == 1 && (unsigned char)text[off] >= 0x80) || (esc && cp == ' ')) {
      cl += utf8_put(cp == ' ' ? 0x2581 : 0xFFFD, clean + cl);
    } else {
      memcpy(clean + cl, text + off, adv);
      cl += adv;
    }
    off += adv;
  }
  if ((rc = bpe_pretokenize(t, clean, cl, &ends, &n_ends))) goto done;
  word = malloc(cl * 2 + 1);
  if (!word) {
    rc = LL_ENOMEM;
    goto done;
  }
  size_t start = 0;
  for (size_t k = 0; k < n_ends; k++) {
    size_t wl = 0;
    if (raw) {
      memcpy(word, clean + start, ends[k] - start);
      wl = ends[k] - start;
    } else {
      for (size_t i = start; i < ends[k]; i++) wl += utf8_put(t->byte_to_cp[(unsigned char)clean[i]], word + wl);
    }
    if (wl && (rc = bpe_word(t, word, wl, out, scratch))) goto done;
    start = ends[k];
  }
  rc = 0;
done:
  free(clean);
  free(scratch);
  free(word);
  free(ends);
  return rc;
}

// ---------------------------------------------------------------- encode

struct frag {
  size_t off, len;
  int32_t token; // -1: raw text
};

// A control token's text at [off, off + n) may be parsed as the token only inside one marked
// span (marks sorted and disjoint); straddling a span's edge is text too.
static int in_marks(size_t off, size_t n, const struct ll_tok_span *m, int nm) {
  int lo = 0, hi = nm - 1, at = -1;
  while (lo <= hi) { // last span starting at or before off
    int mid = lo + (hi - lo) / 2;
    if (m[mid].start <= off) at = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  return at >= 0 && off + n <= m[at].end;
}

// mode 0: control texts are text; 1: recognised everywhere; 2: only inside marks.
static int tokenize(const struct ll_tokenizer *t, const char *text, size_t len, int add_bos, int mode,
                    const struct ll_tok_span *marks, int n_marks, int32_t *ids, int cap) {
  if (!t || (!text && len) || cap < 0 || n_marks < 0 || (n_marks && !marks)) return LL_EINVAL;
  if (len > (size_t)1 << 30) return LL_ELIMIT;
  struct idbuf out = {ids, cap, 0};
  // Split special tokens out of the text, longest first.
  size_t fcap = 16, nf = 0;
  struct frag *f = malloc(fcap * sizeof *f);
  if (!f) return LL_ENOMEM;
  if (len) f[nf++] = (struct frag){0, len, -1};
  for (int si = 0; si < t->n_special; si++) {
    int32_t id = t->special[si];
    const struct tok_entry *e = &t->tok[id];
    const int gated = (e->attr & (LL_TOKEN_CONTROL | LL_TOKEN_UNKNOWN)) != 0; // user-defined: always parsed (llama.cpp)
    if (gated && mode == 0) continue;
    // Marked text: a user-defined token is gated too when the template's markup uses it (some
    // vocabularies, Gemma's, make turn markers user-defined); others stay parsed as llama.cpp
    // parses them. Decided at the token's first hit outside the marks (-1: not yet).
    int user_marker = gated ? 1 : -1;
    for (size_t k = 0; k < nf; k++) {
      if (f[k].token >= 0 || f[k].len < e->len) continue;
      const char *base = text + f[k].off;
      const char *hit = memmem(base, f[k].len, e->text, e->len);
      // Outside the marks (a chat message's content) the text stays text: look further on.
      while (hit && mode == 2 && !in_marks((size_t)(hit - text), e->len, marks, n_marks)) {
        if (user_marker < 0) {
          user_marker = 0;
          for (int j = 0; j < n_marks && !user_marker; j++)
            user_marker = memmem(text + marks[j].start, marks[j].end - marks[j].start, e->text, e->len) != NULL;
        }
        if (!user_marker) break;
        size_t from = (size_t)(hit - base) + 1;
        hit = from + e->len <= f[k].len ? memmem(base + from, f[k].len - from, e->text, e->len) : NULL;
      }
      if (!hit) continue;
      size_t pre = (size_t)(hit - base), post_off = f[k].off + pre + e->len, post_len = f[k].len - pre - e->len;
      if (nf + 2 > fcap) {
        fcap = fcap * 2 + 2;
        struct frag *nfp = realloc(f, fcap * sizeof *f);
        if (!nfp) {
          free(f);
          return LL_ENOMEM;
        }
        f = nfp;
      }
      // Replace f[k] by [pre][token][post]; post is examined next (k + 1 .. ).
      size_t ins = (pre ? 1 : 0) + 1 + (post_len ? 1 : 0);
      memmove(&f[k + ins], &f[k + 1], (nf - k - 1) * sizeof *f);
      size_t j = k;
      size_t orig_off = f[k].off;
      if (pre) f[j++] = (struct frag){orig_off, pre, -1};
      f[j++] = (struct frag){0, 0, id};
      if (post_len) f[j++] = (struct frag){post_off, post_len, -1};
      nf += ins - 1;
      k = j - 1 - (post_len ? 1 : 0); // continue scanning at the post fragment
    }
  }

  int rc = 0;
  if (add_bos && t->bos >= 0) idbuf_push(&out, t->bos);
  if (t->type == TOK_SPM) {
    int prev_special = 1;
    char *buf = NULL;
    size_t bcap = 0;
    for (size_t k = 0; k < nf && rc == 0; k++) {
      if (f[k].token >= 0) {
        idbuf_push(&out, f[k].token);
        prev_special = 1;
        continue;
      }
      // Escape spaces as U+2581 (3 bytes each), prefix one if the previous piece was special.
      size_t need = 3 * (f[k].len + 1) + 1;
      if (need > bcap) {
        char *nb = realloc(buf, need);
        if (!nb) {
          rc = LL_ENOMEM;
          break;
        }
        buf = nb;
        bcap = need;
      }
      size_t bl = 0;
      if (t->add_space_prefix && prev_special) memcpy(buf + bl, "\xe2\x96\x81", 3), bl += 3;
      for (size_t i = 0; i < f[k].len; i++) {
        char c = text[f[k].off + i];
        if (c == ' ')
          memcpy(buf + bl, "\xe2\x96\x81", 3), bl += 3;
        else
          buf[bl++] = c;
      }
      rc = spm_encode(t, buf, bl, &out);
      prev_special = 0;
    }
    free(buf);
  } else {
    for (size_t k = 0; k < nf && rc == 0; k++) {
      if (f[k].token >= 0)
        idbuf_push(&out, f[k].token);
      else
        rc = bpe_encode(t, text + f[k].off, f[k].len, &out);
    }
  }
  free(f);
  if (rc) return rc;
  if (add_bos && t->add_eos && t->eos >= 0) idbuf_push(&out, t->eos);
  return out.n;
}

int ll_tokenize(const struct ll_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special, int32_t *ids, int cap) {
  return tokenize(t, text, len, add_bos, parse_special ? 1 : 0, NULL, 0, ids, cap);
}

int ll_tokenize_marked(const struct ll_tokenizer *t, const char *text, size_t len, int add_bos, const struct ll_tok_span *marks,
                       int n_marks, int32_t *ids, int cap) {
  for (int i = 0; i < n_marks; i++) // sorted, disjoint, inside the text: else binary search lies
    if (!marks || marks[i].start > marks[i].end || marks[i].end > len || (i && marks[i].start < marks[i - 1].end)) return LL_EINVAL;
  return tokenize(t, text, len, add_bos, 2, marks, n_marks, ids, cap);
}

// ---------------------------------------------------------------- decode

static int copy_out(char *buf, size_t cap, const char *s, size_t n) {
  if (buf && cap) memcpy(buf, s, n < cap ? n : cap);
  return (int)n;
}

int ll_token_to_piece(const struct ll_tokenizer *t, int32_t id, char *buf, size_t cap, int render_special) {
  if (!t || id < 0 || id >= t->n_vocab) return LL_EINVAL;
  const struct tok_entry *e = &t->tok[id];
  if (e->attr & (LL_TOKEN_CONTROL | LL_TOKEN_UNKNOWN)) return render_special ? copy_out(buf, cap, e->text, e->len) : 0;
  if (e->attr & LL_TOKEN_USER_DEFINED) return copy_out(buf, cap, e->text, e->len);
  if (e->attr & LL_TOKEN_BYTE) {
    unsigned v = 0;
    if ((t->type == TOK_SPM || (t->pre_flags & PRE_RAW)) && e->len == 6 && sscanf(e->text, "<0x%02X>", &v) == 1) {
      char c = (char)v;
      return copy_out(buf, cap, &c, 1);
    }
    return 0;
  }
  if (!(e->attr & LL_TOKEN_NORMAL)) return 0;
  char tmp[MAX_TOKEN_TEXT + 8];
  size_t n = 0;
  if (t->type == TOK_SPM || (t->pre_flags & (PRE_ESCAPE_WS | PRE_RAW))) { // U+2581 is a space; else raw
    for (size_t i = 0; i < e->len;) {
      if (i + 3 <= e->len && memcmp(e->text + i, "\xe2\x96\x81", 3) == 0) {
        tmp[n++] = ' ';
        i += 3;
      } else {
        tmp[n++] = e->text[i++];
      }
    }
  } else {
    for (size_t i = 0; i < e->len;) {
      size_t adv;
      uint32_t cp = utf8_next((const unsigned char *)e->text + i, e->len - i, &adv);
      if (cp < 512 && t->cp_to_byte[cp] >= 0)
        tmp[n++] = (char)t->cp_to_byte[cp];
      else { // not a byte-level char: keep its bytes
        memcpy(tmp + n, e->text + i, adv);
        n += adv;
      }
      i += adv;
    }
  }
  return copy_out(buf, cap, tmp, n);
}

int ll_detokenize(const struct ll_tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap, int render_special) {
  size_t total = 0;
  char piece[MAX_TOKEN_TEXT + 8];
  for (int i = 0; i < n; i++) {
    int len = ll_token_to_piece(t, ids[i], piece, sizeof piece, render_special);
    if (len < 0) return len;
    const char *p = piece;
    // SPM: the space the encoder prefixed to the first text piece is dropped.
    if (t->type == TOK_SPM && t->add_space_prefix && total == 0 && len > 0 && piece[0] == ' ' &&
        (i == 0 || (i == 1 && ids[0] == t->bos))) {
      p++;
      len--;
    }
    if (buf && total < cap) memcpy(buf + total, p, (size_t)len < cap - total ? (size_t)len : cap - total);
    total += (size_t)len;
  }
  return total > (size_t)INT32_MAX ? LL_ELIMIT : (int)total;
}

// ---------------------------------------------------------------- streaming decode

void ll_detok_stream_init(struct ll_detok_stream *s) { memset(s, 0, sizeof *s); }

// Length of the longest prefix of s[0..n) that ends on a complete UTF-8 character boundary,
// treating bytes that can never start/complete a valid sequence as complete (emitted as-is).
static size_t utf8_complete_prefix(const unsigned char *s, size_t n) {
  size_t i = 0, ok = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (need == 1) {
      ok = ++i;
      continue;
    }
    size_t j = 1;
    while (j < need && i + j < n && (s[i + j] & 0xC0) == 0x80) j++;
    if (j == need) {
      i += need;
      ok = i;
    } else if (i + j == n) {
      break; // incomplete at the end: hold it
    } else {
      i += j; // broken sequence: pass its bytes through
      ok = i;
    }
  }
  return ok;
}

int ll_detok_stream_push(const struct ll_tokenizer *t, struct ll_detok_stream *s, int32_t id, char *out, size_t cap) {
  unsigned char tmp[MAX_TOKEN_TEXT + 16];
  memcpy(tmp, s->pending, (size_t)s->n_pending);
  int len = ll_token_to_piece(t, id, (char *)tmp + s->n_pending, MAX_TOKEN_TEXT, 0);
  if (len < 0) return len;
  size_t total = (size_t)s->n_pending + (size_t)len;
  // Generated text continues a prompt, so no leading space is dropped here (unlike
  // ll_detokenize of a whole sequence).
  const size_t skip = 0;
  s->n_tokens++;
  size_t ok = utf8_complete_prefix(tmp + skip, total - skip);
  size_t rest = total - skip - ok;
  if (rest > sizeof s->pending) { // cannot be an incomplete character: emit everything
    ok += rest;
    rest = 0;
  }
  if (ok > cap) return LL_ELIMIT;
  memcpy(out, tmp + skip, ok);
  memcpy(s->pending, tmp + skip + ok, rest);
  s->n_pending = (int)rest;
  return (int)ok;
}

int ll_detok_stream_finish(struct ll_detok_stream *s, char *out, size_t cap) {
  size_t n = (size_t)s->n_pending;
  if (n > cap) return LL_ELIMIT;
  memcpy(out, s->pending, n);
  s->n_pending = 0;
  return (int)n;
}
