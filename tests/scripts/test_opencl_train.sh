#!/usr/bin/env bash
# End to end training on the OpenCL backend: `llsrv train` once with --device cpu and once on
# the OpenCL device (the PoCL device, or $LL_TEST_OPENCL_DEVICE); the per-step loss curves
# must agree, and stderr must name the OpenCL device (a silent CPU fallback would compare the
# CPU with itself). Three runs: full-parameter training (every weight's dw, the embedding's
# get_rows_backward, rmsnorm's dg, AdamW on all of them); LoRA with dropout and gradient
# accumulation (the counter-based dropout mask, the A/B products); the same LoRA on a Q4_1
# base (matmul_backward's dx through dequantized quantized weights, as on SmolLM2).
#
# The model: stories260K's shape (64 dims, 5 layers, 8/4 heads, FFN 172) from `llsrv init`,
# since stories260K.bin itself (llama2.c format) carries no tokenizer and `llsrv train` needs
# one to read text (FFN 192 for the Q4_1 copy: rows of whole 32-blocks); the data: this
# repository's man pages.
#
# Tolerance: relative 1e-3 per step over 20 steps. The two backends differ by rounding only:
# the forward's float-weight products sum in f32 on the device (the CPU's sgemm in another
# order), exp is the device's (within ulps of libm's expf), softmax sums in another order;
# that is ~1e-6 relative in a step's loss, and AdamW's normalized steps carry it forward
# without amplifying it much over 20 steps (the losses agree to the 4 printed decimals on
# PoCL, i.e. within ~2e-5 relative; on Q4_1 the forward quantizes activations to Q8_1, where
# a last-bit difference can move a value by a whole step: 1e-4 in two steps' losses there). Tried the other way: one gradient 1% off (swiglu's dup
# x 1.01) with a shifted dropout mask moves the curves by 1e-3 to 4e-2 within 10 steps and
# fails both runs; a whole op wrong or missing moves them much further. Finer errors are the
# unit tests' job (tests/test_opencl.c, each op against its scalar reference).
# Each OpenCL run's activations, gradients and optimizer state stay on the device: its
# reported host <-> device traffic per step is checked too (traffic below).
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
DEV=${LL_TEST_OPENCL_DEVICE:-opencl:0:0}
D=$(mktemp -d)
export XDG_STATE_HOME=$D/state # the kernels' binary cache goes here, not into the user's state
trap 'rm -rf "$D"' EXIT
passed=0 failed=0
check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

"$LLSRV" init --dims 64,5,8,4,172,512 -o "$D/m.ckpt" >"$D/init.out" 2>&1
check $? "llsrv init: $(cat "$D/init.out")"

# name model device args... -> $D/name-device.{out,err,loss}; the device line checked
run() {
  local name=$1 model=$2 dev=$3; shift 3
  local tag=$name-${dev%%:*}
  "$LLSRV" train --model "$model" --data "$LL_SOURCE_DIR/man" --log-every 1 --eval-every 0 --checkpoint-every 0 -t 2 \
    --device "$dev" -o "$D/run-$tag" "$@" >"$D/$tag.out" 2>"$D/$tag.err"
  check $? "$name on $dev exits 0: $(tail -3 "$D/$tag.err")"
  local want=cpu
  [ "$dev" = cpu ] || want=opencl
  grep -q "^model: .*), $want: " "$D/$tag.err"
  check $? "$name on $dev: stderr does not name the $want backend: $(cat "$D/$tag.err")"
  grep "^step " "$D/$tag.out" | sed -E 's/^step ([0-9]+)\/[0-9]+ +loss ([0-9.]+).*/\1 \2/' >"$D/$tag.loss"
}

# traffic name: a plain step on the device moves index arrays up and the loss's and the gradient
# norm's partial sums down, nothing the size of an activation (a micro-batch's logits alone are
# 64 x 512 x 4 = 128 KiB here): under 16 KiB each way; and the host waits for the device at most
# twice (the gradient norm's read, then the sync that completes the losses, with nothing left).
traffic() {
  local line
  line=$(grep "device transfers per step" "$D/$1-opencl.err")
  echo "$1: $line"
  echo "$line" | awk '{ exit !($7 + 0 > 0 && $7 < 16384 && $10 + 0 > 0 && $10 < 16384 && $13 + 0 > 0 && $13 <= 2) }'
  check $? "$1: a training step on the device moves too much between host and device: ${line:-no transfer line}"
}

# compare name steps: both curves complete, relative difference <= 1e-3 per step
compare() {
  local name=$1 steps=$2
  echo "$name: step, loss (cpu), loss (opencl)"
  paste -d' ' "$D/$name-cpu.loss" "$D/$name-opencl.loss" | tee "$D/$name.both"
  python3 - "$D/$name.both" "$steps" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
n = int(sys.argv[2])
ok = len(rows) == n
for r in rows:
    if len(r) != 4 or r[0] != r[2]:
        ok = False
        continue
    a, b = float(r[1]), float(r[3])
    if not abs(a - b) <= 1e-3 * abs(a):
        print(f"step {r[0]}: cpu {a} opencl {b}: relative {abs(a - b) / abs(a):.3g} > 1e-3")
        ok = False
sys.exit(0 if ok else 1)
PY
  check $? "$name: the OpenCL loss curve differs from the CPU's (or is incomplete)"
}

FULL=(--mode full --seq-len 64 --batch 2 --lr 3e-3 --warmup 2 --steps 20)
run full "$D/m.ckpt" cpu "${FULL[@]}"
run full "$D/m.ckpt" "$DEV" "${FULL[@]}"
compare full 20
traffic full
# the loss falls: the run trained something (equal flat curves would prove nothing)
first=$(head -1 "$D/full-opencl.loss" | cut -d' ' -f2) last=$(tail -1 "$D/full-opencl.loss" | cut -d' ' -f2)
python3 -c "import sys; sys.exit(0 if float('${last:-0}') < 0.9 * float('${first:-0}') else 1)"
check $? "full: the OpenCL run's loss does not fall ($first -> $last)"

LORA=(--seq-len 64 --batch 1 --grad-accum 2 --lora-rank 4 --lora-alpha 8 --lora-targets q,v,down --lora-dropout 0.1 --lr 1e-2 --steps 10)
run lora "$D/m.ckpt" cpu "${LORA[@]}"
run lora "$D/m.ckpt" "$DEV" "${LORA[@]}"
compare lora 10
traffic lora

"$LLSRV" init --dims 64,5,8,4,192,512 -o "$D/m192.ckpt" >"$D/init2.out" 2>&1 &&
  "$LLSRV" convert "$D/m192.ckpt" "$D/q4_1.ckpt" --quant q4_1 >"$D/convert.out" 2>&1
check $? "llsrv init + convert --quant q4_1: $(cat "$D/init2.out" "$D/convert.out")"
run lora_q4_1 "$D/q4_1.ckpt" cpu "${LORA[@]}"
run lora_q4_1 "$D/q4_1.ckpt" "$DEV" "${LORA[@]}"
compare lora_q4_1 10
traffic lora_q4_1

# The fast tier (LL_OPENCL_REFERENCE=0: train_fast.cl's tiled products, llsrv_fast.cl's forward)
# against the same CPU curves: full-parameter (the tiled dw of every weight) and LoRA on the Q4_1
# base (the tiled dx through dequantized weights), the same 1e-3 relative per step. Then resume
# on the device: 5 steps, a checkpoint, the same command for 10 resumes at step 5 and its steps
# 6-10 print the uninterrupted fast run's losses (constant schedule: the step count does not
# change the learning rates).
export LL_OPENCL_REFERENCE=0
mkdir -p "$D/fast" && D0=$D && D=$D0/fast
cp "$D0/full-cpu.loss" "$D0/lora_q4_1-cpu.loss" "$D/"
run full "$D0/m.ckpt" "$DEV" "${FULL[@]}"
compare full 20
run lora_q4_1 "$D0/q4_1.ckpt" "$DEV" "${LORA[@]}"
compare lora_q4_1 10
RES=(--seq-len 64 --batch 1 --lora-rank 4 --lora-alpha 8 --lora-targets q,v,down --lora-dropout 0.1 --lr 1e-2 --warmup 0 --schedule constant)
run whole "$D0/q4_1.ckpt" "$DEV" "${RES[@]}" --steps 10
"$LLSRV" train --model "$D0/q4_1.ckpt" --data "$LL_SOURCE_DIR/man" --log-every 1 --eval-every 0 --checkpoint-every 5 -t 2 \
  --device "$DEV" -o "$D/run-res" "${RES[@]}" --steps 5 >"$D/res1.out" 2>"$D/res1.err" &&
  "$LLSRV" train --model "$D0/q4_1.ckpt" --data "$LL_SOURCE_DIR/man" --log-every 1 --eval-every 0 --checkpoint-every 5 -t 2 \
    --device "$DEV" -o "$D/run-res" "${RES[@]}" --steps 10 >"$D/res2.out" 2>"$D/res2.err"
check $? "fast tier: the interrupted run: $(tail -n 3 "$D/res1.err" "$D/res2.err")"
grep -q "resuming .*last.ckpt at step 5" "$D/res2.out"
check $? "fast tier: the second run does not resume at step 5: $(head -5 "$D/res2.out")"
grep "^step " "$D/res2.out" | sed -E 's/^step ([0-9]+)\/[0-9]+ +loss ([0-9.]+).*/\1 \2/' >"$D/res.loss"
tail -5 "$D/whole-opencl.loss" >"$D/whole6.loss"
echo "fast tier, resumed at step 5 against uninterrupted:"; paste -d' ' "$D/res.loss" "$D/whole6.loss"
[ -s "$D/res.loss" ] && cmp -s "$D/res.loss" "$D/whole6.loss"
check $? "fast tier: steps 6-10 after resuming differ from the uninterrupted run's"
D=$D0
unset LL_OPENCL_REFERENCE

# A device that holds the weights but not a run's buffers (capped at 3 MB): the CPU trains, with
# one line saying why, and the run completes.
LL_OPENCL_MEM_LIMIT=3000000 "$LLSRV" train --model "$D/m.ckpt" --data "$LL_SOURCE_DIR/man" --eval-every 0 --checkpoint-every 0 -t 2 \
  --device "$DEV" -o "$D/run-oom" --seq-len 256 --batch 4 --steps 2 >"$D/oom.out" 2>"$D/oom.err"
check $? "training on a device too small for its buffers exits 0: $(tail -3 "$D/oom.err")"
grep -q "^llsrv train: on the CPU: the device cannot hold the training buffers: trainer: out of device memory" "$D/oom.err" &&
  grep -q "^done: 2 steps" "$D/oom.out"
check $? "the CPU fallback says why and trains: $(cat "$D/oom.err" "$D/oom.out" | tail -5)"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
