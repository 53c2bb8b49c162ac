#!/usr/bin/env bash
# opencl_vs_cuda.sh - issue 29's GPU figures in one device call: llsrv's OpenCL tiers (fast,
# reference) against llama.cpp 0c1e5709's CUDA backend on the same GGUF files, on an NVIDIA GPU
# machine as ../shared/tools/gpu/README.md describes it (no libuv/yaml/jansson, no ICD file, no
# network). Two steps:
#
#   here:  tests/bench/opencl_vs_cuda.sh prepare BUILD_DIR [SMOLLM2_GGUF]
#          writes .device/ (keep it ignored: `echo /.device/ >> .git/info/exclude`): llsrv's
#          binaries and libraries (shared/tools/gpu/bundle.sh --llama: llama.cpp's trimmed source
#          to build with CUDA there) and vocab.ckpt, a 2 MB model carrying SmolLM2's vocabulary;
#   there: bash tests/bench/opencl_vs_cuda.sh run .device        (run tool: carry [".device"])
#          builds llama-bench with CUDA in the background, makes the two models of the issue
#          (SmolLM2-135M's shape in Q4_1, a 1B Llama shape in Q4_0: random weights, real shapes)
#          with `llsrv init --dims` + `convert`, runs test_opencl on the GPU, llsrv bench
#          (pp512, tg128, 8 streams) on both tiers (and the fast one without its GEMM tiles for
#          prompts, LL_OPENCL_FAULT=nogemm: fmmt_*), llsrv generate's launches and bytes per
#          step, then llama-bench -ngl 99 (pp512, tg128); then decode at long contexts (tg64 at
#          depths $DEPTHS, default 4096: `llsrv bench -d` on the fast tier with split-K attention
#          as chosen and with it off, LL_OPENCL_SPLIT_KV=0, and llama-bench -d); everything into
#          $OUT (results.md, logs). About 10-12 minutes on an H100; each part has its own time
#          limit so the table is written whatever fails.
# A dry run where there is no NVIDIA driver (PoCL here): P=64 N=16 REPS=1 MODELS=smol TESTS=0
# DEPTHS=256 tests/bench/opencl_vs_cuda.sh run .device - the same steps on whatever OpenCL device
# is found.
# The llama.cpp build has no flash-attention kernels (GGML_CUDA_FA=OFF, as the gpu tools build
# it: minutes instead of tens), so its column is -fa 0. Compare only figures of one run.
set -uo pipefail
mode=${1:-}
if [ "$mode" = prepare ]; then
  B=${2:?BUILD_DIR}
  M=${3:-${LL_MODEL_CACHE:-$HOME/.cache/llsrv}/SmolLM2-135M-Instruct.Q4_1.gguf}
  G=$(cd "$(dirname "$0")/../.." && pwd)
  D=${DEV_DIR:-$G/.device} # DEV_DIR: elsewhere (a dry run here)
  T=${GPU_TOOLS:-$G/../shared/tools/gpu}
  [ -x "$T/bundle.sh" ] || T=/work/shared/tools/gpu
  mkdir -p "$D"
  EX=$(cd "$G" && realpath -m "$(git rev-parse --git-path info/exclude)") # .device/ stays out of git (a worktree's exclude is the main one's)
  [ -n "${DEV_DIR:-}" ] || grep -qx '/.device/' "$EX" 2>/dev/null || echo /.device/ >>"$EX"
  bash "$T/bundle.sh" "$B" "$D" $([ "${LLAMA:-1}" = 0 ] || echo --llama) || exit 1 # LLAMA=0: without llama.cpp (a dry run)
  "$B/server/llsrv" init --vocab "$M" --dims 32,1,1,1,32,2048 -o "$D/v32.ckpt" >/dev/null &&
    "$B/server/llsrv" convert "$D/v32.ckpt" "$D/vocab.ckpt" --quant q8_0 >/dev/null && rm -f "$D/v32.ckpt" || exit 1
  cp "$0" "$D/"
  du -sh "$D"
  echo "now: run tool, carry [\".device\"], command: bash tests/bench/opencl_vs_cuda.sh run .device"
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 prepare BUILD_DIR [SMOLLM2_GGUF] | run DIR" >&2; exit 2; }
D=$(cd "${2:?DIR}" && pwd)
OUT=${OUT:-/tmp/opencl_vs_cuda}
mkdir -p "$OUT"
R=$OUT/results.md
OUTD=$OUT
OUT=/tmp/opencl_vs_cuda_logs # the logs, tarred into $OUTD/logs.tar.gz at the end (the run tool brings back 8 files)
mkdir -p "$OUT"
# shellcheck disable=SC1091
. "$D/on-device.sh" "$D" >"$OUT/setup.log" 2>&1
grep -q nvidia "$W/icd/nvidia.icd" 2>/dev/null || unset OCL_ICD_VENDORS # no NVIDIA driver: the OpenCL found here (a dry run)
P=${P:-512} N=${N:-128} REPS=${REPS:-3} MODELS=${MODELS:-smol llama1b}
cd /tmp/w || exit 1
{
  echo "# issue 29 on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null), $(date -u +%FT%TZ)"
  echo "llsrv $($L --version 2>/dev/null | head -n 1); llama.cpp 0c1e5709 CUDA (sm_90, GGML_CUDA_FA=OFF); load $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$R"
# the models (random weights, real shapes): SmolLM2-135M Q4_1, 1B Llama Q4_0
mk() { # name dims quant
  timeout 120 $L init --vocab "$D/vocab.ckpt" --dims "$2" -o "$1.f.ckpt" >>"$OUT/models.log" 2>&1 &&
    timeout 120 $L convert "$1.f.ckpt" "$1.q.ckpt" --quant "$3" >>"$OUT/models.log" 2>&1 &&
    timeout 120 $L convert "$1.q.ckpt" "$1.gguf" >>"$OUT/models.log" 2>&1 && rm -f "$1.f.ckpt" "$1.q.ckpt"
}
case " $MODELS " in *" smol "*) mk smol 576,30,9,3,1536,8192 q4_1 || echo "models: smol failed (models.log)" >>"$R" ;; esac
case " $MODELS " in *" llama1b "*) mk llama1b 2048,16,32,8,8192,8192 q4_0 || echo "models: 1B failed (models.log)" >>"$R" ;; esac
# test_opencl on the GPU: the reference tier exact where the device is, the fast tier's tolerances
if [ "${TESTS:-1}" = 1 ]; then # TESTS=0: not (a dry run)
  ( export LL_TEST_OPENCL_DEVICE=opencl:0:0; timeout 240 "$BIN/test_opencl" >"$OUT/test_opencl.log" 2>&1; echo "rc=$?" >>"$OUT/test_opencl.log" )
  echo "test_opencl: $(grep -E 'passed|failed' "$OUT/test_opencl.log" | tail -n 1) ($(tail -n 1 "$OUT/test_opencl.log"))" >>"$R"
fi
{
  echo
  echo "| model | engine | pp$P tok/s | tg$N tok/s | tg x8 aggregate tok/s |"
  echo "|---|---|---:|---:|---:|"
} >>"$R"
for m in $MODELS; do
  [ -f $m.gguf ] || continue
  for tier in 0 0g 1; do # 0g: the fast tier without its GEMM tiles for prompts (llsrv_gemm.cl; fmmt_* instead)
    name=$(case $tier in 0) echo "llsrv OpenCL fast" ;; 0g) echo "llsrv OpenCL fast, no GEMM tiles" ;; *) echo "llsrv OpenCL reference" ;; esac)
    fault=$([ $tier = 0g ] && echo nogemm)
    gen=$([ $tier = 0g ] && echo "-n 1" || echo "-n $N --parallel 8") # 0g: the prompt alone (decode is tier 0's)
    LL_OPENCL_FAULT=$fault LL_OPENCL_REFERENCE=${tier%g} timeout 150 $L bench --model $m.gguf --device opencl:0:0 -p $P $gen -r $REPS >"$OUT/bench_${m}_$tier.log" 2>&1
    pp=$(awk -F'|' "/pp$P /{print \$(NF-1)}" "$OUT/bench_${m}_$tier.log" | head -n 1)
    tg=$(awk -F'|' "/tg$N /{print \$(NF-1)}" "$OUT/bench_${m}_$tier.log" | head -n 1)
    tp=$(awk -F'|' "/tg${N}x8|x8 /{print \$(NF-1)}" "$OUT/bench_${m}_$tier.log" | head -n 1)
    echo "| $m | $name | ${pp:-?} | ${tg:-?} | ${tp:-?} |" >>"$R"
    [ $tier = 0g ] && continue
    LL_OPENCL_REFERENCE=$tier timeout 60 $L generate --model $m.gguf --device opencl:0:0 -n 16 --temp 0 --ignore-eos -p "Once upon a time" \
      >"$OUT/generate_${m}_$tier.log" 2>&1
  done
done
[ -n "${LLAMA_PID:-}" ] && wait_llama "${LLAMA_WAIT:-420}" >>"$OUT/setup.log"
LB=$W/lt/build/bin/llama-bench
for m in $MODELS; do
  [ -f $m.gguf ] && [ -x "$LB" ] || continue
  timeout 150 "$LB" -m $m.gguf -ngl 99 -p $P -n $N -r $REPS -fa 0 >"$OUT/llama_bench_$m.log" 2>&1
  pp=$(awk -F'|' "/pp$P /{print \$(NF-1)}" "$OUT/llama_bench_$m.log" | head -n 1)
  tg=$(awk -F'|' "/tg$N /{print \$(NF-1)}" "$OUT/llama_bench_$m.log" | head -n 1)
  echo "| $m | llama.cpp CUDA -fa 0 | ${pp:-?} | ${tg:-?} | - |" >>"$R"
done
{
  echo
  echo "launches and bytes per decode step (llsrv generate -n 16 --temp 0):"
  for f in "$OUT"/generate_*.log; do echo "- $(basename "$f" .log): $(grep -iE 'launch' "$f" | tail -n 1)"; done
} >>"$R"
# Decode at long contexts: split-K attention (llsrv_split.cl) as chosen, and off, against llama.cpp
# at the same depth (one prompt of D tokens, untimed, then tg64; DEPTHS=0 skips this part).
DEPTHS=${DEPTHS:-4096}
if [ "$DEPTHS" != 0 ]; then
  {
    echo
    echo "| model | engine | depth | tg64 tok/s |"
    echo "|---|---|---:|---:|"
  } >>"$R"
  for m in $MODELS; do
    [ -f $m.gguf ] || continue
    for d in $DEPTHS; do
      for sk in on off; do
        log="$OUT/bench_${m}_d${d}_split$sk.log"
        if [ $sk = on ]; then LL_OPENCL_REFERENCE=0 timeout 150 $L bench --model $m.gguf --device opencl:0:0 -p 0 -n 64 -d "$d" -r $REPS >"$log" 2>&1
        else LL_OPENCL_SPLIT_KV=0 LL_OPENCL_REFERENCE=0 timeout 150 $L bench --model $m.gguf --device opencl:0:0 -p 0 -n 64 -d "$d" -r $REPS >"$log" 2>&1; fi
        tg=$(awk -F'|' "/tg64 @ d$d /{print \$(NF-1)}" "$log" | head -n 1)
        echo "| $m | llsrv OpenCL fast, split-K $sk | $d | ${tg:-?} |" >>"$R"
      done
      if [ -x "$LB" ]; then
        timeout 150 "$LB" -m $m.gguf -ngl 99 -p 0 -n 64 -d "$d" -r $REPS -fa 0 >"$OUT/llama_bench_${m}_d$d.log" 2>&1
        tg=$(awk -F'|' "/tg64 @ d$d /{print \$(NF-1)}" "$OUT/llama_bench_${m}_d$d.log" | head -n 1)
        echo "| $m | llama.cpp CUDA -fa 0 | $d | ${tg:-?} |" >>"$R"
      fi
    done
  done
fi
cp "$W/llama-build.log" "$OUT/" 2>/dev/null
tar czf "$OUTD/logs.tar.gz" -C "$OUT" .
cat "$R"
