#!/usr/bin/env bash
# Mixture of experts against a dense model of the same active size, side by side (issue 32):
# `llsrv init` writes a dense Llama (FFN width 2F) and a Mixtral-layout MoE (E experts of width
# F, 2 routed per token: the same parameters per token, plus the router's E x dim), both
# converted to QUANT; `llsrv bench` runs them alternately ROUNDS times (pp128, tg64), with the
# load average before each run. Decode of the MoE reads only its 2 routed experts.
#   tests/bench/moe_vs_dense.sh [BUILD_DIR] [DIM,LAYERS,HEADS,F] [EXPERTS] [QUANT] [ROUNDS] [THREADS]
set -eu
BUILD=${1:-build}
IFS=, read -r DIM LAYERS HEADS F <<< "${2:-512,8,8,1408}"
E=${3:-8}
QUANT=${4:-q8_0}
ROUNDS=${5:-2}
THREADS=${6:-2}
LLSRV=$BUILD/server/llsrv
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$LLSRV" init --dims "$DIM,$LAYERS,$HEADS,$HEADS,$((2 * F)),1024" -o "$TMP/dense.ckpt" > /dev/null
"$LLSRV" init --dims "$DIM,$LAYERS,$HEADS,$HEADS,$F,1024" --experts "$E" --top-k 2 -o "$TMP/moe.ckpt" > /dev/null
for m in dense moe; do
  "$LLSRV" convert "$TMP/$m.ckpt" "$TMP/$m-$QUANT.ckpt" --quant "$QUANT" 2> /dev/null
  "$LLSRV" plan --model "$TMP/$m-$QUANT.ckpt" --device cpu | sed -n 2p | sed "s/^/$m: /"
done
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs; threads $THREADS"
for r in $(seq "$ROUNDS"); do
  for m in dense moe; do
    echo "round $r $m, load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$LLSRV" bench --model "$TMP/$m-$QUANT.ckpt" -p 128 -n 64 -t "$THREADS" -r 3 2> /dev/null | grep -E '\| (pp|tg)'
  done
done
