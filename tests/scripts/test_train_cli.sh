#!/usr/bin/env bash
# llsrv init + llsrv train as a user runs them: a tiny random model trained in full on this
# repository's man pages (progress lines, last/best checkpoints, kept step checkpoints), SIGTERM
# saves a checkpoint and the same command resumes from it at that step, the full checkpoint loads
# as a model (llsrv generate), a LoRA run on it, --dry-run's pre-flight, and bad options refused
# with the option named (exit 2).
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
D=$(mktemp -d)
TRAIN_PID=
cleanup() { [ -n "$TRAIN_PID" ] && kill -9 "$TRAIN_PID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

DATA=$LL_SOURCE_DIR/man
# 32 dims, 2 layers, GQA 4/2: seconds per run even under ASan.
"$LLSRV" init --dims 32,2,4,2,64,128 -o "$D/tiny.ckpt" >"$D/init.out" 2>&1
check '[ $? -eq 0 ] && [ -f "$D/tiny.ckpt" ]' "init writes the model: $(cat "$D/init.out")"

COMMON=(--model "$D/tiny.ckpt" --data "$DATA" --mode full --seq-len 32 --batch 2 --lr 5e-3 --warmup 2 -t 2 --eval-seqs 4)
"$LLSRV" train "${COMMON[@]}" --steps 12 --eval-every 4 --checkpoint-every 4 --keep 2 -o "$D/run" >"$D/t1.out" 2>"$D/t1.err"
check '[ $? -eq 0 ]' "train exits 0: $(tail -3 "$D/t1.err")"
check 'grep -q "^step 12/12  loss" "$D/t1.out"' "progress line for the last step"
check 'grep -q "^done: 12 steps" "$D/t1.out"' "summary line"
check '[ -f "$D/run/last.ckpt" ] && [ -f "$D/run/best.ckpt" ]' "last.ckpt and best.ckpt"
check '[ -f "$D/run/step-00000012.ckpt" ] && [ -f "$D/run/step-00000008.ckpt" ] && [ ! -f "$D/run/step-00000004.ckpt" ]' "keep 2 step checkpoints: $(ls "$D/run")"
first=$(grep -m1 -o "loss [0-9.]*" "$D/t1.out" | cut -d' ' -f2)
last=$(grep "^step 12/12" "$D/t1.out" | grep -o "loss [0-9.]*" | cut -d' ' -f2)
check 'python3 -c "import sys; sys.exit(0 if float(\"$last\") < float(\"$first\") else 1)"' "loss falls ($first -> $last)"

# The full checkpoint is a model.
"$LLSRV" generate --model "$D/run/last.ckpt" -p "llsrv" -n 8 --temp 0 >"$D/gen.out" 2>&1
check '[ $? -eq 0 ]' "generate loads the trained checkpoint: $(tail -2 "$D/gen.out")"

# SIGTERM mid-run: a checkpoint, then the same command resumes at that step.
"$LLSRV" train "${COMMON[@]}" --steps 100000 --checkpoint-every 0 --eval-every 0 --log-every 1 -o "$D/run2" >"$D/t2.out" 2>"$D/t2.err" &
TRAIN_PID=$!
for _ in $(seq 1 600); do grep -q "^step 3/" "$D/t2.out" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$TRAIN_PID"
wait "$TRAIN_PID"
rc=$?
TRAIN_PID=
check '[ $rc -eq 0 ] && grep -q "stopped by signal 15 at step" "$D/t2.out" && [ -f "$D/run2/last.ckpt" ]' "SIGTERM saves and exits 0 (rc $rc): $(tail -2 "$D/t2.out")"
at=$(grep -o "stopped by signal 15 at step [0-9]*" "$D/t2.out" | grep -o "[0-9]*$")
"$LLSRV" train "${COMMON[@]}" --steps $((at + 2)) --checkpoint-every 0 --eval-every 0 -o "$D/run2" >"$D/t3.out" 2>"$D/t3.err"
check '[ $? -eq 0 ] && grep -q "resuming .*last.ckpt at step $at" "$D/t3.out" && grep -q "^done: 2 steps" "$D/t3.out"' "resume at step $at: $(cat "$D/t3.out" | tail -3)"

# LoRA on the trained model, with dropout and accumulation.
"$LLSRV" train --model "$D/run/last.ckpt" --data "$DATA" --seq-len 32 --batch 1 --grad-accum 2 --lora-rank 4 --lora-alpha 8 \
  --lora-targets q,v,down --lora-dropout 0.1 --steps 4 --eval-every 2 --eval-seqs 2 -t 2 -o "$D/lora" >"$D/t4.out" 2>"$D/t4.err"
check '[ $? -eq 0 ] && [ -f "$D/lora/last.ckpt" ]' "LoRA run: $(tail -2 "$D/t4.err")"

# Pre-flight.
"$LLSRV" train "${COMMON[@]}" --steps 10 --dry-run >"$D/dry.out" 2>&1
check '[ $? -eq 0 ] && grep -q "^data: " "$D/dry.out" && grep -q "^memory: weights" "$D/dry.out" && grep -q "s per step" "$D/dry.out"' "dry run: $(cat "$D/dry.out")"

# Chat records with Qwen3's thinking: the pre-flight's count of tokens in the loss grows by the
# think blocks with --train-on-thinking (train.on_thinking), and not otherwise.
for i in $(seq 1 40); do
  echo '{"messages":[{"role":"user","content":"q'"$i"'"},{"role":"assistant","content":"<think>\nlet me see\n</think>\n\nyes '"$i"'"}]}'
done >"$D/think.jsonl"
counted() { grep -o "([0-9]* counted in the loss)" "$1" | grep -o "[0-9]*"; }
"$LLSRV" train --model "$D/tiny.ckpt" --data "$D/think.jsonl" --chat-template chatml --seq-len 32 --val-fraction 0 --dry-run >"$D/th0.out" 2>&1
r0=$?
"$LLSRV" train --model "$D/tiny.ckpt" --data "$D/think.jsonl" --chat-template chatml --seq-len 32 --val-fraction 0 --train-on-thinking --dry-run >"$D/th1.out" 2>&1
r1=$?
n0=$(counted "$D/th0.out") n1=$(counted "$D/th1.out")
check '[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ -n "$n0" ] && [ -n "$n1" ] && [ "$n1" -gt "$n0" ]' \
  "thinking out of the loss by default ($n0 tokens), in with --train-on-thinking ($n1): $(grep '^data' "$D/th0.out" "$D/th1.out")"

# Bad options: named, exit 2; empty data refused naming the path.
bad() {
  local want=$1
  shift
  "$LLSRV" train --model "$D/tiny.ckpt" --data "$DATA" -o "$D/bad" "$@" >"$D/bad.out" 2>&1
  local rc=$?
  check "[ $rc -eq 2 ] && grep -qF -- \"$want\" \"$D/bad.out\"" "$* refused with exit 2 naming $want (rc $rc): $(head -1 "$D/bad.out")"
}
bad "'x' is not one of q|k|v|o|gate|up|down" --lora-targets q,x
bad "train.lora_rank': value 0 out of range" --lora-rank 0
bad "train.lora_dropout': value 1.5 out of range" --lora-dropout 1.5
bad "'sometimes' is not one of cosine|linear|constant" --schedule sometimes
bad "unknown option '--no-such-option'" --no-such-option 1
mkdir -p "$D/empty"
"$LLSRV" train --model "$D/tiny.ckpt" --data "$D/empty" -o "$D/bad" >"$D/empty.out" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -qF "$D/empty" "$D/empty.out"' "empty data refused naming it (rc $rc): $(cat "$D/empty.out")"

# ---- Issue 28 (hardening): NaN weights, the run directory, divergence, messages.
# A base with a NaN weight is refused at load, naming the tensor (every step of it was skipped).
"$LLSRV" convert "$D/tiny.ckpt" "$D/tiny.gguf" >/dev/null 2>&1
python3 -c "
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
i = b.find(struct.pack('<f', 1.0) * 32)  # the first norm weight (32 dims) of llsrv init
b[i + 8:i + 12] = struct.pack('<f', float('nan'))
open(sys.argv[2], 'wb').write(b)" "$D/tiny.gguf" "$D/nan.gguf"
"$LLSRV" train --model "$D/nan.gguf" --data "$DATA" --mode full --seq-len 32 --steps 3 -o "$D/nanrun" >"$D/nan.out" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "tensor .output_norm.weight. (f32) holds a non-finite value" "$D/nan.out" && [ ! -e "$D/nanrun" ]' \
  "a NaN weight refused at load naming the tensor (rc $rc): $(tail -1 "$D/nan.out")"

nsteps() { ls "$1" | grep -c '^step-[0-9]\{8,\}\.ckpt$'; }
K=("${COMMON[@]}" --checkpoint-every 1 --eval-every 0 --keep 2)
# keep applies to what is on disk, earlier processes' checkpoints too; stale temporary files of
# our own naming go at start, nothing else does.
"$LLSRV" train "${K[@]}" --steps 4 -o "$D/run3" >"$D/k1.out" 2>&1
mkdir -p "$D/run3/.last.ckpt.tmp-7"
touch "$D/run3/.step-00000009.ckpt.tmp-AbC123" "$D/run3/.last.ckpt.tmp-4242" "$D/run3/.best.ckpt.tmp-x1Y2z3" "$D/run3/.stepx.tmp-1" \
  "$D/run3/notes.txt" "$D/run3/step-1.ckpt" "$D/run3/.step-00000009.ckpt.tmp-a.b"
"$LLSRV" train "${K[@]}" --steps 8 -o "$D/run3" >"$D/k2.out" 2>"$D/k2.err"
check '[ $? -eq 0 ] && [ "$(nsteps "$D/run3")" -eq 2 ] && [ -f "$D/run3/step-00000008.ckpt" ] && [ -f "$D/run3/step-00000007.ckpt" ]' \
  "keep 2 across two processes: $(ls "$D/run3" | tr '\n' ' ')"
check '[ ! -e "$D/run3/.step-00000009.ckpt.tmp-AbC123" ] && [ ! -e "$D/run3/.last.ckpt.tmp-4242" ] && [ ! -e "$D/run3/.best.ckpt.tmp-x1Y2z3" ] && grep -q "removed 3 stale temporary files" "$D/k2.err"' \
  "stale temporary files removed and said: $(ls -a "$D/run3" | tr '\n' ' ') $(grep removed "$D/k2.err")"
check '[ -d "$D/run3/.last.ckpt.tmp-7" ] && [ -f "$D/run3/.stepx.tmp-1" ] && [ -f "$D/run3/notes.txt" ] && [ -f "$D/run3/step-1.ckpt" ] && [ -f "$D/run3/.step-00000009.ckpt.tmp-a.b" ]' \
  "files not of our naming are left alone: $(ls -a "$D/run3" | tr '\n' ' ')"
rm -rf "$D/run3/.last.ckpt.tmp-7" "$D/run3/.stepx.tmp-1" "$D/run3/notes.txt" "$D/run3/step-1.ckpt" "$D/run3/.step-00000009.ckpt.tmp-a.b"
# kill -9 at arbitrary points of a run that checkpoints every step, six times: still `keep` step
# checkpoints and no temporary file once a run has started after the last kill.
for k in 1 2 3 4 5 6; do
  "$LLSRV" train "${K[@]}" --steps 100000 --log-every 1 -o "$D/run3" >"$D/k9.out" 2>&1 &
  TRAIN_PID=$!
  for _ in $(seq 1 600); do [ "$(grep -c "saved" "$D/k9.out" 2>/dev/null)" -ge $((k + 2)) ] && break; sleep 0.05; done
  sleep 0.0$k
  kill -9 "$TRAIN_PID"
  wait "$TRAIN_PID" 2>/dev/null
  TRAIN_PID=
done
at=$(ls "$D/run3" | grep '^step-' | sort | tail -1 | grep -o '[0-9]*' | sed 's/^0*//')
"$LLSRV" train "${K[@]}" --steps $((at + 1)) -o "$D/run3" >"$D/k3.out" 2>"$D/k3.err"
check '[ $? -eq 0 ] && [ "$(nsteps "$D/run3")" -eq 2 ] && [ -z "$(ls -a "$D/run3" | grep -F .tmp-)" ]' \
  "after 6 x kill -9: keep 2, no temporary file: $(ls -a "$D/run3" | tr '\n' ' ') $(tail -2 "$D/k3.err")"

# A damaged last.ckpt (and the step checkpoint it links): the run resumes from the newest
# checkpoint that loads, says which and why, and keeps the damaged file.
at=$(grep -o "^done: .*" "$D/k3.out" >/dev/null; ls "$D/run3" | grep '^step-' | sort | tail -1 | grep -o '[0-9]*' | sed 's/^0*//')
python3 -c "
import os, sys
p = sys.argv[1]; n = os.path.getsize(p)
with open(p, 'r+b') as f:
    f.seek(n // 2); b = f.read(1); f.seek(n // 2); f.write(bytes([b[0] ^ 0xff]))" "$D/run3/last.ckpt"
"$LLSRV" train "${K[@]}" --steps $((at + 2)) -o "$D/run3" >"$D/dmg.out" 2>"$D/dmg.err"
rc=$?
prev=$(printf "step-%08d.ckpt" $((at - 1)))
check '[ $rc -eq 0 ] && grep -q "resuming .*$prev at step $((at - 1))" "$D/dmg.out" && grep -q "^done: 3 steps" "$D/dmg.out"' \
  "a damaged last.ckpt: resumes from $prev (rc $rc): $(cat "$D/dmg.err" | tail -3) $(grep resuming "$D/dmg.out")"
check 'grep -q "skipped newer: last.ckpt (.*damaged.*); step-.*ckpt (the same file" "$D/dmg.err" && [ -f "$D/run3/last.ckpt.damaged" ] && [ "$(nsteps "$D/run3")" -eq 2 ]' \
  "the skip is said, the damaged file kept, keep 2: $(grep skipped "$D/dmg.err") $(ls "$D/run3" | tr '\n' ' ')"

# A base whose huge (finite) norm weights overflow to NaN in every step: the run stops after
# train.max_skipped_steps skipped steps in a row, with an error, instead of skipping to the end.
python3 -c "
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
ones = struct.pack('<f', 1.0) * 32  # every norm weight (32 dims) of llsrv init
while b.find(ones) >= 0:
    i = b.find(ones); b[i:i + 128] = struct.pack('<f', 3e38) * 32
open(sys.argv[2], 'wb').write(b)" "$D/tiny.gguf" "$D/huge.gguf"
"$LLSRV" train --model "$D/huge.gguf" --data "$DATA" --mode full --seq-len 32 --batch 2 -t 2 --steps 1000 --checkpoint-every 4 --eval-every 0 \
  --max-skipped-steps 6 --log-every 1 -o "$D/skiprun" >"$D/skip.out" 2>"$D/skip.err"
rc=$?
check '[ $rc -eq 1 ] && grep -q "6 consecutive steps skipped .*train.max_skipped_steps 6.*at step 6" "$D/skip.err" && ! grep -q "^step 7/" "$D/skip.out" && [ -f "$D/skiprun/last.ckpt" ]' \
  "every step skipped: stopped after 6 with an error (rc $rc): $(tail -1 "$D/skip.err")"

# lr 1 diverges: a warning; best.ckpt is the best evaluation's weights (here the start's: the
# diverged run never beats it), not whatever the next checkpoint holds.
"$LLSRV" train "${COMMON[@]}" --lr 1 --warmup 0 --steps 20 --eval-every 5 --checkpoint-every 10 -o "$D/div" >"$D/div.out" 2>"$D/div.err"
rc=$?
check '[ $rc -eq 0 ] && grep -q "warning: the loss is diverging: .* more than twice its minimum" "$D/div.err"' "divergence warned (rc $rc): $(grep -v '^data\|^memory\|^train' "$D/div.out" | head -5) $(tail -2 "$D/div.err")"
mkdir -p "$D/divbest" && cp "$D/div/best.ckpt" "$D/divbest/last.ckpt"
"$LLSRV" train "${COMMON[@]}" --lr 1 --warmup 0 --steps 21 --eval-every 0 --checkpoint-every 0 -o "$D/divbest" >"$D/divb.out" 2>&1
check 'grep -q "resuming .* at step 0$" "$D/divb.out"' "best.ckpt holds the step-0 weights (val $(grep -m1 -o 'val [0-9.]*' "$D/div.out")): $(grep resuming "$D/divb.out")"

# best.ckpt that cannot be written at step 0 (a directory stands there): a warning, training goes on.
mkdir -p "$D/run5/best.ckpt/x"
"$LLSRV" train "${COMMON[@]}" --steps 2 --eval-every 1 --checkpoint-every 0 -o "$D/run5" >"$D/b0.out" 2>"$D/b0.err"
check 'grep -q "^step 0/2  val" "$D/b0.out" && grep -v "checkpoint at step" "$D/b0.err" | grep -q "warning: .*best.ckpt.* (training goes on)" && grep -q "^step 2/2" "$D/b0.out"' \
  "a failed best.ckpt at step 0 is a warning: $(head -3 "$D/b0.err" | tail -2)"

# The summary names only files that exist: no validation data, no best.ckpt.
"$LLSRV" train "${COMMON[@]}" --steps 2 --val-fraction 0 --eval-every 1 -o "$D/noval" >"$D/noval.out" 2>&1
check '[ $? -eq 0 ] && grep -q "^done: 2 steps.*noval/last.ckpt$" "$D/noval.out" && [ ! -e "$D/noval/best.ckpt" ]' "summary without best.ckpt: $(grep done "$D/noval.out")"
# The checkpoint at SIGTERM failing (last.ckpt cannot be replaced): exit 1, the error said.
"$LLSRV" train "${COMMON[@]}" --steps 100000 --checkpoint-every 0 --eval-every 0 --log-every 1 -o "$D/run4" >"$D/t5.out" 2>"$D/t5.err" &
TRAIN_PID=$!
for _ in $(seq 1 600); do grep -q "^step 3/" "$D/t5.out" 2>/dev/null && break; sleep 0.1; done
mkdir -p "$D/run4/last.ckpt/x"
kill -TERM "$TRAIN_PID"
wait "$TRAIN_PID"
rc=$?
TRAIN_PID=
check '[ $rc -eq 1 ] && grep -q "stopped at step [0-9]* but the checkpoint failed: .*last.ckpt" "$D/t5.err"' "a failed checkpoint at SIGTERM exits 1 (rc $rc): $(tail -1 "$D/t5.err")"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
