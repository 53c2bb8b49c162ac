#!/usr/bin/env bash
# Every tokenizer vocabulary of llama.cpp 0c1e5709's tests (fetched by tests/fetch-llama-vocab.sh)
# against the vectors in tests/data/vocab: test_tokenizer checks every case of every vocabulary,
# every pre-tokenizer name on llama-bpe's vocabulary, and that bert-bge (WordPiece) is refused;
# then the CLI as a user runs it: gemma-4's cases through `llsrv tokenize`, bert-bge's message.
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
DATA=$LL_SOURCE_DIR/tests/data/vocab
dir=$(bash "$LL_SOURCE_DIR/tests/fetch-llama-vocab.sh") || { echo "FAIL: fetch-llama-vocab.sh"; exit 1; }
fail=0
"$LL_BINARY_DIR/tests/test_tokenizer" "$dir" "$DATA" || fail=1
python3 - "$LLSRV" "$dir/ggml-vocab-gemma-4.gguf" "$DATA/ggml-vocab-gemma-4.gguf" <<'PY' || fail=1
import subprocess, sys
llsrv, g, v = sys.argv[1:]
sep = b"\n__ggml_vocab_test__\n"
raw = open(v + ".inp", "rb").read()
texts = raw.split(sep)
if raw.endswith(sep): texts = texts[:-1]
outs = open(v + ".out", "rb").read().split(b"\n")
for i in range(0, len(texts), 5):
    got = subprocess.run([llsrv, "tokenize", "--model", g, "--ids", "--no-bos", "--no-special"], input=texts[i],
                         capture_output=True, check=True).stdout.split()
    if got != outs[i].split():
        print("FAIL: gemma-4 case", i, "got", got[:20], "want", outs[i].split()[:20]); sys.exit(1)
print("ok: gemma-4 through llsrv tokenize")
PY
err=$(printf 'hello' | "$LLSRV" tokenize --model "$dir/ggml-vocab-bert-bge.gguf" 2>&1 >/dev/null); rc=$?
if [ $rc -eq 1 ] && grep -q "'bert' (WordPiece" <<<"$err"; then echo "ok: bert-bge refused: $err"
else echo "FAIL: bert-bge: exit $rc, [$err]"; fail=1; fi
exit $fail
