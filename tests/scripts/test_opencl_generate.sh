#!/usr/bin/env bash
# End to end on the OpenCL backend: `llsrv generate` greedy ids over 32 tokens with
# --device opencl:P:D (the PoCL device, or $LL_TEST_OPENCL_DEVICE) equal the CPU backend's,
# for stories260K (llama2.c, from BOS) and SmolLM2-135M Q4_1 on the reference prompts.
# Exact equality is asserted: both backends quantize activations to the same bytes and take
# exact integer block sums, so logits differ only by float summation order (~1e-7 relative),
# far below the gaps between the top two logits on these prompts. The stderr device line
# must name OpenCL (a silent CPU fallback would compare the CPU with itself).
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
DEV=${LL_TEST_OPENCL_DEVICE:-opencl:0:0}
STORIES=$LL_SHARED_DIR/testdata/models/stories260K.bin
SMOL=$LL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
export XDG_STATE_HOME=$(mktemp -d) # the binary cache goes here, not into the user's state
trap 'rm -rf "$XDG_STATE_HOME"' EXIT
passed=0 failed=0
check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }
run() { # model device args... -> ids on stdout, device line checked
  local m=$1 d=$2; shift 2
  "$LLSRV" generate --model "$m" --ids -n 32 --temp 0 --ignore-eos --device "$d" "$@" 2>"$XDG_STATE_HOME/err" | tr -s ' \n' ' '
  grep -q "^llsrv generate: device $( [ "$d" = cpu ] && echo cpu || echo opencl)" "$XDG_STATE_HOME/err" ||
    { echo "unexpected device for $d:" >&2; cat "$XDG_STATE_HOME/err" >&2; }
}
if [ -f "$STORIES" ]; then
  a=$(run "$STORIES" cpu); b=$(run "$STORIES" "$DEV")
  echo "stories260K cpu:    $a"; echo "stories260K opencl: $b"
  [ -n "$a" ] && [ "$a" = "$b" ]; check $? "stories260K: OpenCL ids differ from the CPU's"
  # The fast tier (not bit-exact: f32 trees, flash-style attention) on the same 32 greedy ids: the
  # tiny model's top-two gaps are far wider than its rounding. (On SmolLM2 free-running greedy
  # ids part at near ties after 13-16 tokens on two of the four prompts; test_opencl_fast
  # measures it teacher-forced instead.)
  c=$(LL_OPENCL_REFERENCE=0 run "$STORIES" "$DEV")
  echo "stories260K opencl fast tier: $c"
  [ -n "$a" ] && [ "$a" = "$c" ]; check $? "stories260K: the OpenCL fast tier's ids differ from the CPU's"
else
  # ../shared is the project's test data, absent from a user's clone: only this part is skipped.
  echo "skipped: stories260K comparison ($STORIES absent)"
fi
if [ -f "$SMOL" ]; then
  while IFS= read -r p; do
    p=$(printf '%b' "$p")
    a=$(run "$SMOL" cpu -p "$p"); b=$(run "$SMOL" "$DEV" -p "$p")
    echo "smollm2 '$p'"; echo "  cpu:    $a"; echo "  opencl: $b"
    [ -n "$a" ] && [ "$a" = "$b" ]; check $? "smollm2 prompt '$p': OpenCL ids differ from the CPU's"
  done < "$LL_SOURCE_DIR/tests/ref/smollm2_prompts.txt"
else
  check 1 "SmolLM2 not cached at $SMOL"
fi
# A decode step on the device uploads token ids and positions (and index arrays) and, sampling
# greedily, reads back the chosen id only (the argmax is taken on the device): 4 bytes down, a
# few KiB up, with one wait (that read). Sampling that is not plain greedy runs on the host from
# the logits: 49152 x 4 bytes down. The fast tier (LL_OPENCL_REFERENCE=0) queues at most 6
# kernels per layer, the reference tier more (printed).
for tier in 1 0; do
  line=$(LL_OPENCL_REFERENCE=$tier "$LLSRV" generate --model "$SMOL" -n 8 --temp 0 --ignore-eos -p "Hello" --device "$DEV" 2>&1 >/dev/null | grep "device transfers per decode step")
  echo "$line"
  echo "$line" | awk '{ exit !($8 + 0 > 0 && $8 < 4096 && $11 == 4 && $14 == 1) }'
  check $? "decode step traffic (LL_OPENCL_REFERENCE=$tier): ${line:-no transfer line}"
  per_layer=$(echo "$line" | sed -n 's/.*launches (\([0-9.]*\) per layer.*/\1/p')
  tiername=$( [ $tier = 1 ] && echo reference || echo fast)
  echo "$line" | grep -q "$tiername tier"; check $? "tier $tiername not named: $line"
  if [ $tier = 0 ]; then awk -v n="$per_layer" 'BEGIN { exit !(n + 0 > 0 && n <= 6.2) }'; check $? "fast tier: $per_layer launches per layer (at most 6, plus 3 a step)"; fi
done
# Decode steps queued one behind the other (LL_OPENCL_QUEUE_AHEAD=1, the default on GPUs; 0 steps
# one at a time, the default on CPU devices such as PoCL): the host waits for step n's id with step n + 1 already queued, so only the last step's
# wait leaves the device idle (1 in 7 here, 0.14 a step); one at a time, every wait does. The
# same 4 bytes down and one wait a step.
for qa in 1 0; do
  line=$(LL_OPENCL_QUEUE_AHEAD=$qa "$LLSRV" generate --model "$SMOL" -n 8 --temp 0 --ignore-eos -p "Hello" --device "$DEV" 2>&1 >/dev/null | grep "device transfers per decode step")
  echo "$line"
  idle=$(echo "$line" | sed -n 's/.* \([0-9.]*\) idle waits.*/\1/p')
  if [ $qa = 1 ]; then
    echo "$line" | grep -q "steps queued ahead" && awk -v n="$idle" 'BEGIN { exit !(n != "" && n + 0 < 0.2) }'
  else
    echo "$line" | grep -q "steps one at a time" && awk -v n="$idle" 'BEGIN { exit !(n + 0 == 1) }'
  fi
  check $? "idle waits per step (LL_OPENCL_QUEUE_AHEAD=$qa): ${line:-no transfer line}"
  echo "$line" | awk '{ exit !($11 == 4 && $14 == 1) }'; check $? "decode step traffic (LL_OPENCL_QUEUE_AHEAD=$qa): $line"
done
# A stop (EOS after two tokens) with steps queued ahead: the same tokens as the CPU's and as one
# step at a time, the step queued past the EOS undone (ll_engine_seq_truncate; test_opencl_queue
# checks the cache after it).
q="Reply with one word: yes or no?"
stop_run() { "$LLSRV" generate --model "$SMOL" --ids -n 40 --temp 0 --chat -p "$q" --device "$1" 2>/dev/null | tr -s ' \n' ' '; } # EOS ends it
a=$(stop_run cpu); b=$(LL_OPENCL_QUEUE_AHEAD=1 stop_run "$DEV"); c=$(LL_OPENCL_QUEUE_AHEAD=0 stop_run "$DEV")
echo "stop: cpu '$a', queued '$b', one at a time '$c'"
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ $(echo $a | wc -w) -lt 40 ]; check $? "stop at EOS: ids differ or no stop ('$a' / '$b' / '$c')"
# Top-k sampling (the default chain: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) runs on
# the device too: the id alone comes back, and with the same seed the sampled ids are the CPU's
# (the default tier on PoCL gives the CPU's logits; the device's sums of the chain's
# softmax differ from the host's in order only). Repetition / frequency / presence penalties
# too: the sampler's window goes up as (id, count) pairs, the id alone comes back.
line=$("$LLSRV" generate --model "$SMOL" -n 8 --temp 0.8 --seed 1 --ignore-eos -p "Hello" --device "$DEV" 2>&1 >/dev/null | grep "device transfers per decode step")
echo "$line"
echo "$line" | awk '{ exit !($11 == 4 && $14 == 1) }' && echo "$line" | grep -q "sampling by the chain on the device"
check $? "decode step traffic, top-k sampling on the device: ${line:-no transfer line}"
a=$(run "$SMOL" cpu -n 24 --temp 0.8 --seed 7 -p "Once upon a time"); b=$(run "$SMOL" "$DEV" -n 24 --temp 0.8 --seed 7 -p "Once upon a time")
echo "sampled (seed 7) cpu:    $a"; echo "sampled (seed 7) opencl: $b"
[ -n "$a" ] && [ "$a" = "$b" ]; check $? "sampled ids: OpenCL (sampling on the device) differ from the CPU's"
line=$("$LLSRV" generate --model "$SMOL" -n 8 --temp 0.8 --seed 1 --repeat-penalty 1.1 --ignore-eos -p "Hello" --device "$DEV" 2>&1 >/dev/null | grep "device transfers per decode step")
echo "$line"
echo "$line" | awk '{ exit !($11 == 4 && $14 == 1) }' && echo "$line" | grep -q "sampling by the chain on the device"
check $? "decode step traffic, penalties on the device: ${line:-no transfer line}"
for pen in "--temp 0.8 --repeat-penalty 1.3" "--temp 0 --repeat-penalty 1.5 --repeat-last-n 16"; do
  a=$(run "$SMOL" cpu -n 24 $pen --seed 7 -p "Once upon a time"); b=$(run "$SMOL" "$DEV" -n 24 $pen --seed 7 -p "Once upon a time")
  echo "penalties ($pen) cpu:    $a"; echo "penalties ($pen) opencl: $b"
  [ -n "$a" ] && [ "$a" = "$b" ]; check $? "ids with penalties ($pen): OpenCL (on the device) differ from the CPU's"
done
# The second start loads the kernels from the binary cache.
"$LLSRV" generate --model "$SMOL" --ids -n 1 --temp 0 --device "$DEV" 2>&1 | grep -q "kernels from the binary cache"
check $? "second start did not use the binary cache"
# llsrv plan: a plan that fits as configured; one that must adapt (the device capped with
# LL_OPENCL_MEM_LIMIT) halves parallel first, then ctx, and says so; nothing fits -> CPU.
out=$("$LLSRV" plan --model "$SMOL" --device "$DEV" --parallel 2 --ctx 1024 2>&1)
echo "$out" | grep -q "adaptation: none needed"; check $? "plan: default plan should fit: $out"
out=$(LL_OPENCL_MEM_LIMIT=1000000000 "$LLSRV" plan --model "$SMOL" --device "$DEV" --parallel 32 --ctx 8192 2>&1)
echo "$out"
echo "$out" | grep -q "parallel 32 -> 16" && echo "$out" | grep -q "plan after adaptation" && ! echo "$out" | grep -q "ctx 8192 -> 4096"
check $? "plan: expected parallel halvings only"
out=$(LL_OPENCL_MEM_LIMIT=150000000 "$LLSRV" plan --model "$SMOL" --device "$DEV" --train-enabled 2>&1)
echo "$out" | grep -q "activation recomputation on" && echo "$out" | grep -q "nothing fits.*CPU backend"
check $? "plan: expected the whole adaptation order and the CPU fallback: $out"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
