#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M (tests/fetch-gemma3.sh) against llama.cpp 0c1e5709 (tests/ref/README.md,
# "Families"). The engine's sums are not llama.cpp's bit for bit on this model (its Q5_0 / K-quant
# prompt products run through ggml's tinyBLAS order), and Gemma 3's large activations turn the
# last-bit differences into logit differences of ~0.1 - as large as llama.cpp's own between flash
# attention on and off - so this asserts the issue's tolerance rather than identity:
#  - prompt token ids identical to llama.cpp's (exact: the SPM tokenizer), and llama.cpp's
#    tokenizer test strings (tests/data/vocab/ggml-vocab-llama-spm.gguf.inp) through
#    `llsrv tokenize` give Gemma 3's ids as llama.cpp gives them (tests/ref/gemma3_vocab.out);
#  - teacher-forced top-1 agreement >= 99% over llama.cpp's 4 x 64 greedy continuations;
#  - perplexity on tests/ref/ppl.txt within 0.1% of llama-perplexity's (tests/ref/gemma3_ppl.txt).
set -u
M=$(bash "$LL_SOURCE_DIR/tests/fetch-gemma3.sh") || { echo "Gemma 3 not fetched"; echo "0 passed, 1 failed"; exit 1; }
REF=$LL_SOURCE_DIR/tests/ref
python3 - "$LL_BINARY_DIR/server/llsrv" "$M" "$LL_SOURCE_DIR/tests/data/vocab/ggml-vocab-llama-spm.gguf.inp" "$REF/gemma3_vocab.out" <<'PY' || exit 1
import subprocess, sys
llsrv, model, inp, out = sys.argv[1:]
sep = b"\n__ggml_vocab_test__\n"
raw = open(inp, "rb").read()
texts = raw.split(sep)
if raw.endswith(sep): texts = texts[:-1]
outs = open(out, "rb").read().split(b"\n")
for i, t in enumerate(texts):
    got = subprocess.run([llsrv, "tokenize", "--model", model, "--ids", "--no-bos", "--no-special"], input=t, capture_output=True, check=True).stdout.split()
    if got != outs[i].split():
        print("FAIL: tokenizer case", i, repr(t[:40]), "got", got[:20], "want", outs[i].split()[:20]); sys.exit(1)
print(f"ok: {len(texts)} tokenizer cases as llama.cpp's")
PY
"$LL_BINARY_DIR/tests/test_arch_ref" "$M" "$REF/gemma3_greedy64.tsv" --prompts "$REF/gemma3_prompts.txt" --min-tf 0.99 || exit 1
if [ -f "$REF/gemma3_ppl.txt" ]; then
  theirs=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$REF/gemma3_ppl.txt" | head -1)
  ours=$("$LL_BINARY_DIR/server/llsrv" perplexity --model "$M" -f "$REF/ppl.txt" --ctx 128 -t 2 | sed -n 's/.*PPL = \([0-9.]*\).*/\1/p' | head -1)
  echo "perplexity (ctx 128): ours $ours, llama-perplexity $theirs"
  python3 -c "import sys; o, t = float('$ours'), float('$theirs'); r = abs(o / t - 1); print(f'relative difference {r:.5f}'); sys.exit(0 if r <= 0.001 else 1)" || { echo "FAIL: perplexity not within 0.1%"; exit 1; }
fi
echo "ok"
