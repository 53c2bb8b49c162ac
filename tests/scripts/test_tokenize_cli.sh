#!/usr/bin/env bash
# llsrv tokenize / detokenize as a user runs them: every 5th vector case of each shared
# vocabulary through the CLI equals its .out line; SmolLM2 text round-trips through both.
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
pass=0 fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }
vocab=$LL_SHARED_DIR/testdata/vocab
if [ -d "$vocab" ]; then
  for g in "$vocab"/*.gguf; do
    python3 - "$g" "$LLSRV" <<'PY' && ok || bad "$g"
import subprocess, sys
g, llsrv = sys.argv[1], sys.argv[2]
texts = open(g + ".inp", "rb").read().split(b"\n__ggml_vocab_test__\n")[:-1]
outs = open(g + ".out", "rb").read().split(b"\n")
for i in range(0, len(texts), 5):
    got = subprocess.run([llsrv, "tokenize", "--model", g, "--no-bos", "--no-special"], input=texts[i],
                         capture_output=True, check=True).stdout.strip()
    want = outs[i].strip()
    if got != want:
        print("case", i, "got", got[:200], "want", want[:200]); sys.exit(1)
PY
  done
else
  echo "../shared/testdata/vocab absent: skipping the vector part"
fi
m=$LL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$m" ]; then
  text=$'Hello world, it\'s <|im_start|>user\nnaïve café 🦙'
  ids=$(printf '%s' "$text" | "$LLSRV" tokenize --model "$m")
  [ "$(printf '%s' "$text" | "$LLSRV" tokenize --model "$m" | cut -d' ' -f1-9)" = "19556 905 28 357 506 216 1 4093 198" ] && ok || bad "SmolLM2 ids: $ids"
  back=$(echo "$ids" | "$LLSRV" detokenize --model "$m" --special)
  [ "$back" = "$text" ] && ok || bad "SmolLM2 round trip: [$back]"
fi
# Errors are clear and the exit status says so.
"$LLSRV" tokenize --model /nonexistent </dev/null 2>/tmp/tokerr.$$; [ $? -eq 1 ] && grep -q nonexistent /tmp/tokerr.$$ && ok || bad "missing model error"
"$LLSRV" tokenize </dev/null 2>/dev/null; [ $? -eq 2 ] && ok || bad "usage error"
if [ -f "$LL_SHARED_DIR/testdata/models/stories260K.bin" ]; then
  "$LLSRV" tokenize --model "$LL_SHARED_DIR/testdata/models/stories260K.bin" </dev/null 2>/tmp/tokerr.$$; [ $? -eq 1 ] && grep -q "no tokenizer" /tmp/tokerr.$$ && ok || bad "no-tokenizer error"
fi
rm -f /tmp/tokerr.$$
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
