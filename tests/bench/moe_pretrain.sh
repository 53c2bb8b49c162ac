#!/usr/bin/env bash
# Pre-training a dense model and a mixture of experts of the same active size on the same data
# (issue 32), validation curves side by side. `llsrv init` writes a dense Llama (FFN width 2F)
# and a Mixtral-layout MoE (E experts of width F, 2 routed per token: the same parameters per
# token, plus the router's E x dim); `llsrv train --mode full` trains each from scratch for
# STEPS steps with the same seed, data order, schedule and evaluation (the MoE with its
# load-balancing loss, train.moe_aux_coef 0.01). Byte vocabulary; the repository's own text and
# code as data. Prints the load average before each run and the CPU time each run took (user +
# system, all threads: on a shared machine a steadier measure than tokens/s, which follows the
# other processes' load). Run from the repository root.
#   tests/bench/moe_pretrain.sh [BUILD_DIR] [DIM,LAYERS,HEADS,F] [EXPERTS] [STEPS] [EVAL_EVERY] [THREADS]
set -eu
BUILD=${1:-build}
IFS=, read -r DIM LAYERS HEADS F <<< "${2:-128,4,4,176}"
E=${3:-8}
STEPS=${4:-150}
EVERY=${5:-25}
THREADS=${6:-2}
LLSRV=$BUILD/server/llsrv
DATA=${MOE_PRETRAIN_DATA:-formats,kernels,server,tui,docs,man,README.md}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$LLSRV" init --dims "$DIM,$LAYERS,$HEADS,$HEADS,$((2 * F)),512" -o "$TMP/dense.ckpt" > /dev/null
"$LLSRV" init --dims "$DIM,$LAYERS,$HEADS,$HEADS,$F,512" --experts "$E" --top-k 2 -o "$TMP/moe.ckpt" > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs; threads $THREADS"
for m in dense moe; do
  "$LLSRV" plan --model "$TMP/$m.ckpt" --device cpu 2> /dev/null | sed -n 2p | sed "s/^/$m: /"
  echo "$m: load $(cut -d' ' -f1-3 /proc/loadavg) before"
  TIMEFORMAT='%U %S'
  { time "$LLSRV" train --model "$TMP/$m.ckpt" --mode full --data "$DATA" --shuffle pieces --steps "$STEPS" --seq-len 64 --batch 4 \
    --lr 2e-3 --warmup 10 --eval-every "$EVERY" --eval-seqs 64 --log-every "$EVERY" -t "$THREADS" --device cpu --keep 1 \
    -o "$TMP/run-$m" > "$TMP/$m.out" 2>&1 || { tail -5 "$TMP/$m.out"; exit 1; }; } 2> "$TMP/$m.time"
  grep '^done:' "$TMP/$m.out" | sed "s/^/$m: /"
  awk -v m="$m" '{ printf "%s: CPU time %.2f s (user %.2f, system %.2f)\n", m, $1 + $2, $1, $2 }' "$TMP/$m.time"
done
# step, each model's validation loss (at step 0 and every EVAL_EVERY), the MoE's aux loss
printf '%6s  %10s  %10s  %10s\n' step "val dense" "val moe" "aux moe"
val() { sed -n 's/^step \([0-9]*\)\/[0-9]*  .*val \([0-9.]*\).*/\1 \2/p' "$1"; }
join --nocheck-order <(val "$TMP/dense.out") <(val "$TMP/moe.out") |
  join --nocheck-order -a 1 - <(sed -n 's/^step \([0-9]*\)\/[0-9]*  .* aux \([0-9.]*\) .*/\1 \2/p' "$TMP/moe.out") |
  awk '{ printf "%6d  %10.4f  %10.4f  %10s\n", $1, $2, $3, $4 == "" ? "-" : $4 }'
