#!/usr/bin/env bash
# gpu_train.sh - issue 30's figures in one device call: `llsrv train` on the GPU (OpenCL fast
# tier, and the reference tier for scale) against PyTorch (+ PEFT) on the same GPU, the same
# shapes, and `llsrv train` on the same machine's CPU at 2, 4, 8 and 16 threads; then serving
# while training on the GPU. On an NVIDIA machine as ../shared/tools/gpu/README.md describes it
# (PyTorch, transformers and PEFT installed; no libuv/yaml/jansson, no ICD file, no network).
#
#   here:  tests/bench/gpu_train.sh prepare BUILD_DIR [SMOLLM2_GGUF]
#          writes .device/ (ignored): llsrv's binaries and libraries (bundle.sh, without
#          llama.cpp) and vocab.ckpt, a 2 MB model carrying SmolLM2's vocabulary;
#   there: bash tests/bench/gpu_train.sh run .device        (run tool: carry [".device"])
#          makes the models with `llsrv init --dims` + `convert` (random weights, real shapes:
#          SmolLM2-135M in Q4_1, a 1B Llama in Q4_0, `--preset small` in f32), trains each, runs
#          tests/bench/peft_gpu.py beside it and tests/bench/serve_while_training.py on the GPU,
#          and writes $OUT/results.md (one table, the issue's ratios) and the logs. About 6-8
#          minutes on an H100; every part has its own time limit, so the table is written
#          whatever fails.
# The targets (issue 30): LoRA r16 all targets seq 256 - SmolLM2 shape batch 1 >= 2x PEFT bf16,
# 1B shape batch 4 >= 1x PEFT bf16; full training of the small preset >= 1x PyTorch (AdamW, bf16
# autocast); GPU >= 10x the same machine's CPU; CPU 16 threads >= 4x 2 threads, more threads
# never slower; GEN p50 while training on the device <= 1.5x idle.
# A dry run without an NVIDIA GPU (PoCL here, shapes shrunk, no PyTorch needed):
#   DRY=1 tests/bench/gpu_train.sh run .device
set -uo pipefail
G=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:-}
if [ "$mode" = prepare ]; then
  B=${2:?BUILD_DIR}
  M=${3:-${LL_MODEL_CACHE:-$HOME/.cache/llsrv}/SmolLM2-135M-Instruct.Q4_1.gguf}
  D=${DEV_DIR:-$G/.device}
  T=${GPU_TOOLS:-$G/../shared/tools/gpu}
  [ -x "$T/bundle.sh" ] || T=/work/shared/tools/gpu
  mkdir -p "$D"
  EX=$(cd "$G" && realpath -m "$(git rev-parse --git-path info/exclude)")
  [ -n "${DEV_DIR:-}" ] || grep -qx '/.device/' "$EX" 2>/dev/null || echo /.device/ >>"$EX"
  bash "$T/bundle.sh" "$B" "$D" || exit 1
  [ -f "$D/vocab.ckpt" ] || { "$B/server/llsrv" init --vocab "$M" --dims 32,1,1,1,32,2048 -o "$D/v32.ckpt" >/dev/null &&
    "$B/server/llsrv" convert "$D/v32.ckpt" "$D/vocab.ckpt" --quant q8_0 >/dev/null && rm -f "$D/v32.ckpt"; } || exit 1
  du -sh "$D"
  echo "now: run tool, carry [\".device\"], command: bash tests/bench/gpu_train.sh run .device"
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 prepare BUILD_DIR [SMOLLM2_GGUF] | run DIR" >&2; exit 2; }
D=$(cd "${2:?DIR}" && pwd)
OUT=${OUT:-/tmp/gpu_train}
mkdir -p "$OUT"
R=$OUT/results.md
LOG=$OUT/logs
mkdir -p "$LOG"
# shellcheck disable=SC1091
. "$D/on-device.sh" "$D" >"$LOG/setup.log" 2>&1
grep -q nvidia "$W/icd/nvidia.icd" 2>/dev/null || unset OCL_ICD_VENDORS # no NVIDIA driver: the OpenCL found here (a dry run)
PY=${PYTHON:-python3}
if [ "${DRY:-0}" = 1 ]; then # shapes and steps for a CPU OpenCL device
  SMOL=${SMOL:-64,2,2,1,128,2048} B1=${B1:-128,2,4,2,256,2048} SMALL=${SMALL:-small} S=${S:-64}
  NG=${NG:-6} NC=${NC:-4} NB=${NB:-4} TORCHDEV=${TORCHDEV:-cpu} REQ=${REQ:-3} WIN=${WIN:-5}
else
  SMOL=${SMOL:-576,30,9,3,1536,2048} B1=${B1:-2048,16,32,8,8192,2048} SMALL=${SMALL:-small} S=${S:-256}
  NG=${NG:-40} NC=${NC:-8} NB=${NB:-12} TORCHDEV=${TORCHDEV:-cuda} REQ=${REQ:-10} WIN=${WIN:-20}
fi
GPU=${GPU:-opencl:0:0}
mkdir -p /tmp/gt && cd /tmp/gt || exit 1
{
  echo "# issue 30 on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no NVIDIA GPU'), $(date -u +%FT%TZ)"
  echo "llsrv $($L --version 2>/dev/null | head -n 1); host $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "torch: $($PY -c 'import torch, peft, transformers; print(torch.__version__, "peft", peft.__version__, "transformers", transformers.__version__)' 2>&1 | tail -n 1)"
  echo "LoRA r16 alpha32 dropout 0 on q,k,v,o,gate,up,down, AdamW lr 1e-4, clip 1, seq $S; random weights, real shapes"
} >"$R"
# the models: SmolLM2-135M shape Q4_1 (SmolLM2's vocabulary), 1B Llama shape Q4_0, the small preset f32
mk() { # name dims quant
  timeout 180 $L init --vocab "$D/vocab.ckpt" --dims "$2" -o "$1.f.ckpt" >>"$LOG/models.log" 2>&1 &&
    timeout 180 $L convert "$1.f.ckpt" "$1.ckpt" --quant "$3" >>"$LOG/models.log" 2>&1 && rm -f "$1.f.ckpt"
}
mk smol "$SMOL" q4_1 || echo "models: smol failed (models.log)" >>"$R"
mk b1 "$B1" q4_0 || echo "models: 1B failed (models.log)" >>"$R"
if [ "$SMALL" = small ]; then $L init --preset small -o small.ckpt >>"$LOG/models.log" 2>&1; else $L init --dims "$SMALL" -o small.ckpt >>"$LOG/models.log" 2>&1; fi ||
  echo "models: small failed (models.log)" >>"$R"
VOCAB=${VOCAB:-49152} # vocab.ckpt carries SmolLM2's vocabulary
# the corpus: the project's docs and man pages (as tests/bench/benchlib.py's)
mkdir -p corpus && cp "$G"/docs/*.md corpus/ && for f in "$G"/man/*.[0-9]; do cp "$f" "corpus/$(basename "$f").txt"; done

# tok/s of steps k0+1..k1 from `--log-every 1` lines ("step k/N ... X tok/s" is the average since the start)
tps() { # log tokens_per_step k0 k1
  awk -v n="$2" -v k0="$3" -v k1="$4" '/^step [0-9]+\/[0-9]+ /{split($2, a, "/"); for (i = 3; i < NF; i++) if ($(i + 1) == "tok/s" && $i > 0) el[a[1]] = a[1] * n / $i}
    END { if ((k0 in el) && (k1 in el) && el[k1] > el[k0]) printf "%.1f", (k1 - k0) * n / (el[k1] - el[k0]); else printf "?" }' "$1"
}
mem() { grep -m1 '^memory:' "$1" | sed 's/^memory: //; s/|/\//g'; }
# run NAME MODEL DEVICE STEPS BATCH TIMEOUT [args...]
train() {
  local name=$1 model=$2 dev=$3 n=$4 b=$5 to=$6
  shift 6
  rm -rf "run_$name"
  timeout "$to" $L train --model "$model" --data corpus --seq-len "$S" --batch "$b" --steps "$n" --lr 1e-4 --warmup 0 \
    --eval-every 0 --checkpoint-every 0 --log-every 1 --restart --device "$dev" -o "run_$name" "$@" >"$LOG/train_$name.log" 2>&1
  echo "rc=$?" >>"$LOG/train_$name.log"
  local k0=$((n / 8 + 1)) k1=$((n - 1))
  tps "$LOG/train_$name.log" $((S * b)) $k0 $k1
}
LORA=(--lora-rank 16 --lora-alpha 32 --lora-dropout 0)
peer() { # name timeout args...
  local name=$1 to=$2
  shift 2
  timeout "$to" $PY "$G/tests/bench/peft_gpu.py" --device "$TORCHDEV" --seq-len "$S" "$@" >"$LOG/peer_$name.log" 2>&1
  $PY -c 'import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(j["train_tok_s"], j["peak_mem_mib"])' \
    "$LOG/peer_$name.log" 2>/dev/null || echo "? ?"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else printf "?" }'; }

# GPU, LoRA, SmolLM2 shape, batch 1: the fast tier (the default on GPUs; named, so a dry run on a
# CPU OpenCL device measures it too) and the reference tier
g_smol=$(LL_OPENCL_REFERENCE=0 train smol_gpu smol.ckpt "$GPU" "$NG" 1 120 "${LORA[@]}")
g_smol_ref=$(LL_OPENCL_REFERENCE=1 train smol_gpu_ref smol.ckpt "$GPU" $((NG / 2)) 1 120 "${LORA[@]}")
# GPU, LoRA, 1B shape, batch 4
g_b1=$(LL_OPENCL_REFERENCE=0 train b1_gpu b1.ckpt "$GPU" "$NB" 4 200 "${LORA[@]}")
# GPU, full training of the small preset
g_full=$(LL_OPENCL_REFERENCE=0 train full_gpu small.ckpt "$GPU" "$NG" 1 120 --mode full)
# CPU, LoRA, SmolLM2 shape, 2/4/8/16 threads (the scaling rule)
declare -A c
for t in 2 4 8 16; do c[$t]=$(train "smol_cpu_t$t" smol.ckpt cpu "$NC" 1 90 "${LORA[@]}" -t $t); done
# the peers
read -r p_bf16 p_bf16_mem < <(peer smol_bf16 150 --dims "$SMOL" --vocab "$VOCAB" --mode lora --dtype bf16 --batch 1 --steps 30 --warmup 5)
read -r p_fp32 p_fp32_mem < <(peer smol_fp32 150 --dims "$SMOL" --vocab "$VOCAB" --mode lora --dtype fp32 --batch 1 --steps 30 --warmup 5)
read -r p_b1 p_b1_mem < <(peer b1_bf16 200 --dims "$B1" --vocab "$VOCAB" --mode lora --dtype bf16 --batch 4 --steps 12 --warmup 3)
SMALL_DIMS=$([ "$SMALL" = small ] && echo 384,6,6,2,1024,1024 || echo "$SMALL")
read -r p_full p_full_mem < <(peer full_bf16 150 --dims "$SMALL_DIMS" --vocab 260 --mode full --dtype bf16 --batch 1 --steps 40 --warmup 5)
{
  echo
  echo "| run | llsrv tok/s | llsrv memory (its estimate) | peer tok/s | peer peak GPU MiB | ratio | target |"
  echo "|---|---:|---|---:|---:|---:|---|"
  echo "| SmolLM2 shape LoRA b1, GPU fast tier vs PEFT bf16 | $g_smol | $(mem "$LOG/train_smol_gpu.log") | $p_bf16 | $p_bf16_mem | $(ratio "$g_smol" "$p_bf16") | >= 2x |"
  echo "| SmolLM2 shape LoRA b1, GPU fast tier vs PEFT fp32 | $g_smol | | $p_fp32 | $p_fp32_mem | $(ratio "$g_smol" "$p_fp32") | |"
  echo "| SmolLM2 shape LoRA b1, GPU reference tier vs PEFT bf16 | $g_smol_ref | | $p_bf16 | | $(ratio "$g_smol_ref" "$p_bf16") | |"
  echo "| 1B shape LoRA b4, GPU fast tier vs PEFT bf16 | $g_b1 | $(mem "$LOG/train_b1_gpu.log") | $p_b1 | $p_b1_mem | $(ratio "$g_b1" "$p_b1") | >= 1x |"
  echo "| small preset full, GPU fast tier vs PyTorch bf16 autocast | $g_full | $(mem "$LOG/train_full_gpu.log") | $p_full | $p_full_mem | $(ratio "$g_full" "$p_full") | >= 1x |"
  echo "| SmolLM2 shape LoRA b1, GPU vs this machine's CPU at 16 threads | $g_smol | | ${c[16]} (CPU) | | $(ratio "$g_smol" "${c[16]}") | >= 10x |"
  echo
  echo "| CPU threads | 2 | 4 | 8 | 16 | 16 / 2 (>= 4x) |"
  echo "|---|---:|---:|---:|---:|---:|"
  echo "| llsrv train tok/s | ${c[2]} | ${c[4]} | ${c[8]} | ${c[16]} | $(ratio "${c[16]}" "${c[2]}") |"
  echo
  echo "launches per step (fast tier): $(grep -m1 'launches' "$LOG/train_smol_gpu.log" | sed 's/^llsrv train: //')"
} >>"$R"
# serving while training on the GPU: a build-directory view of the bundle for the script
mkdir -p sb/server sb/tests && ln -sf "$L" sb/server/llsrv && ln -sf "$BIN/readbw" sb/tests/readbw
timeout 240 $PY "$G/tests/bench/serve_while_training.py" --build sb --model smol.ckpt --device "$GPU" --seq-len "$S" \
  --requests "$REQ" --window "$WIN" --threads 4 >"$LOG/serve_while_training.log" 2>&1
rc=$?
{
  echo
  echo "serving while training on $GPU (tests/bench/serve_while_training.py, rc $rc; target: p50 ratio <= 1.5):"
  grep -E '^\|' "$LOG/serve_while_training.log" || echo "(no table: see serve_while_training.log)"
} >>"$R"
tar czf "$OUT/logs.tar.gz" -C "$LOG" .
rm -rf "$LOG"
cat "$R"
