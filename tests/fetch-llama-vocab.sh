#!/usr/bin/env bash
# Fetch and cache llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf of llama.cpp
# 0c1e5709) from the PyPI source distribution llama-cpp-python==0.3.36, checking its sha256.
# Prints the directory holding them. Their test vectors (.inp/.out) are in tests/data/vocab.
# Cache: $LL_MODEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/llsrv. Safe to run concurrently and
# repeatedly (each run works in its own temporary directory and renames into place).
set -euo pipefail
SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
VER=0.3.36
SDIST=llama_cpp_python-$VER.tar.gz
CACHE=${LL_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llsrv}
OUT=$CACHE/llama-vocab-0c1e5709
mkdir -p "$CACHE"
if [ -f "$OUT/.complete" ]; then
  echo "$OUT"; exit 0
fi
tmp=$(mktemp -d "$CACHE/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The sdist itself is kept in the cache (76 MB) so that a removed vocab directory is rebuilt
# without downloading again.
if ! { [ -f "$CACHE/$SDIST" ] && echo "$SHA  $CACHE/$SDIST" | sha256sum -c --quiet - 2>/dev/null; }; then
  PY=$(command -v python3 || true)
  if [ -z "$PY" ]; then echo "fetch-llama-vocab: python3 (with pip) is needed: apt-get install python3-pip" >&2; exit 1; fi
  "$PY" -m pip download --quiet --no-binary :all: --no-deps --disable-pip-version-check \
    "llama-cpp-python==$VER" -d "$tmp" >&2
  echo "$SHA  $tmp/$SDIST" | sha256sum -c --quiet - || { echo "fetch-llama-vocab: $SDIST: sha256 mismatch" >&2; exit 1; }
  mv -f "$tmp/$SDIST" "$CACHE/$SDIST"
fi
mkdir "$tmp/x"
tar -xzf "$CACHE/$SDIST" -C "$tmp/x" --strip-components=4 --wildcards "llama_cpp_python-$VER/vendor/llama.cpp/models/ggml-vocab-*.gguf"
n=$(ls "$tmp/x"/ggml-vocab-*.gguf | wc -l)
[ "$n" -ge 15 ] || { echo "fetch-llama-vocab: only $n vocabularies in $SDIST" >&2; exit 1; }
touch "$tmp/x/.complete"
# Another run may have finished first: then its directory stands and ours is dropped.
mv -T "$tmp/x" "$OUT" 2>/dev/null || [ -f "$OUT/.complete" ] || { echo "fetch-llama-vocab: cannot create $OUT" >&2; exit 1; }
echo "$OUT"
