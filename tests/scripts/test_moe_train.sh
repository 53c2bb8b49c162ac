#!/usr/bin/env bash
# LoRA training through a mixture of experts, end to end: `llsrv init --arch moe` (8 experts,
# 2 per token), `llsrv train` with adapters on q, k, v, o (router and experts frozen) for 30
# steps on docs/ARCHITECTURE.md: the validation loss falls; the default targets (gate/up/down
# too) are refused naming the experts; the trained adapter serves (`generate --adapter`). Then
# adapters on the experts too (train.lora_experts): the loss falls, the adapter serves from its
# checkpoint and, exported as a GGUF LoRA (3-D ffn_*_exps tensors), gives the same greedy text;
# merged into the base (export --merge), the same top logits.
# Then full-parameter training of the same model (below).
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
passed=0 failed=0
check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }
"$LLSRV" init --arch moe --experts 8 --top-k 2 -o "$D/moe.ckpt" > /dev/null
check $? "init --arch moe"
"$LLSRV" train --model "$D/moe.ckpt" --data "$LL_SOURCE_DIR/docs/ARCHITECTURE.md" --lora-targets q,k,v,o --steps 30 --seq-len 64 --batch 2 \
  --lr 3e-3 --log-every 10 -t 2 --device cpu -o "$D/run" > "$D/out" 2>&1
check $? "train: $(tail -3 "$D/out")"
first=$(grep -m1 '^step 0/30' "$D/out" | sed 's/.*val \([0-9.]*\).*/\1/')
last=$(grep '^done:' "$D/out" | sed 's/.*, val \([0-9.]*\),.*/\1/')
echo "validation loss: $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b > 0 && b < a - 0.05) }'
check $? "the validation loss did not fall ($first -> $last)"
"$LLSRV" train --model "$D/moe.ckpt" --data "$LL_SOURCE_DIR/docs/ARCHITECTURE.md" --steps 2 -t 1 -o "$D/run2" > "$D/out2" 2>&1
[ $? -ne 0 ] && grep -q "mixture of 8 experts: use q,k,v,o (and train.lora_experts" "$D/out2"
check $? "default targets on an MoE model: $(tail -1 "$D/out2")"
"$LLSRV" generate --model "$D/moe.ckpt" --adapter "$D/run/last.ckpt" -p "The engine" -n 8 --temp 0 > /dev/null 2> "$D/out3"
[ $? -eq 0 ] && grep -q "adapter 'last'" "$D/out3"
check $? "generate --adapter: $(tail -2 "$D/out3")"
"$LLSRV" train --model "$D/moe.ckpt" --data "$LL_SOURCE_DIR/docs/ARCHITECTURE.md" --lora-targets q,k,v,o --lora-experts gate,up,down --steps 30 \
  --seq-len 64 --batch 2 --lr 3e-3 --log-every 10 -t 2 --device cpu -o "$D/xrun" > "$D/outx" 2>&1
check $? "train --lora-experts: $(tail -3 "$D/outx")"
grep -q 'on q,k,v,o,gate_exps,up_exps,down_exps' "$D/outx"
check $? "the run's summary names the expert targets: $(grep -m1 LoRA "$D/outx")"
first=$(grep -m1 '^step 0/30' "$D/outx" | sed 's/.*val \([0-9.]*\).*/\1/')
last=$(grep '^done:' "$D/outx" | sed 's/.*, val \([0-9.]*\),.*/\1/')
echo "adapters on experts too, validation loss: $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b > 0 && b < a - 0.05) }'
check $? "expert adapters: the validation loss did not fall ($first -> $last)"
"$LLSRV" export "$D/xrun/last.ckpt" "$D/xlora.gguf" --model "$D/moe.ckpt" > /dev/null 2> "$D/outx2"
check $? "export of the expert adapter: $(tail -2 "$D/outx2")"
a=$("$LLSRV" generate --model "$D/moe.ckpt" --adapter "$D/xrun/last.ckpt" -p "The engine" -n 16 --temp 0 2> "$D/outx3")
check $? "generate --adapter (experts, .ckpt): $(tail -2 "$D/outx3")"
b=$("$LLSRV" generate --model "$D/moe.ckpt" --adapter "$D/xlora.gguf" -p "The engine" -n 16 --temp 0 2> "$D/outx4")
check $? "generate --adapter (experts, GGUF): $(tail -2 "$D/outx4")"
c=$("$LLSRV" generate --model "$D/moe.ckpt" -p "The engine" -n 16 --temp 0 2> /dev/null)
[ -n "$a" ] && [ "$a" = "$b" ]
check $? "the exported adapter's text differs from the checkpoint's: '$a' vs '$b'"
echo "greedy text: with the expert adapter '$a', without '$c'"
# merged into the base (each expert's rows of the 3-D tensors with its own pair): the merged
# model's top logits are the adapter's
"$LLSRV" export --merge --model "$D/moe.ckpt" "$D/xlora.gguf" "$D/merged.ckpt" > /dev/null 2> "$D/outx5"
check $? "export --merge of an expert adapter: $(tail -1 "$D/outx5")"
t1=$("$LLSRV" generate --model "$D/moe.ckpt" --adapter "$D/xlora.gguf" -p "The engine" -n 1 --temp 0 --dump-logits 5 2>&1 > /dev/null | grep '^top_logits:')
t2=$("$LLSRV" generate --model "$D/merged.ckpt" -p "The engine" -n 1 --temp 0 --dump-logits 5 2>&1 > /dev/null | grep '^top_logits:')
echo "with the adapter: $t1"
echo "merged:           $t2"
python3 -c 'import sys
a = [p.split(":") for p in sys.argv[1].split()[1:]]
b = [p.split(":") for p in sys.argv[2].split()[1:]]
ok = len(a) == 5 and [x[0] for x in a] == [x[0] for x in b] and max(abs(float(x[1]) - float(y[1])) for x, y in zip(a, b)) < 1e-4
sys.exit(0 if ok else 1)' "$t1" "$t2"
check $? "the merged model's top logits are not the adapter's: '$t1' vs '$t2'"
# Full-parameter training (every expert, the router, the load-balancing loss): the validation
# loss falls, the progress lines report the aux loss apart, the trained model serves, and a
# 0 coefficient drops the aux term.
"$LLSRV" train --model "$D/moe.ckpt" --mode full --data "$LL_SOURCE_DIR/docs/ARCHITECTURE.md" --steps 20 --seq-len 64 --batch 2 \
  --lr 1e-3 --log-every 10 -t 2 --device cpu -o "$D/full" > "$D/out4" 2>&1
check $? "train --mode full: $(tail -3 "$D/out4")"
first=$(grep -m1 '^step 0/20' "$D/out4" | sed 's/.*val \([0-9.]*\).*/\1/')
last=$(grep '^done:' "$D/out4" | sed 's/.*, val \([0-9.]*\),.*/\1/')
echo "full mode, validation loss: $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b > 0 && b < a - 0.3) }'
check $? "full mode: the validation loss did not fall ($first -> $last)"
grep -q '^step 20/20  loss [0-9.]*  aux 0\.0[0-9]* (not in loss)' "$D/out4" # 4 layers x 0.01 at balance: about 0.04
check $? "full mode: no aux loss on the progress line: $(grep '^step 20' "$D/out4")"
"$LLSRV" generate --model "$D/full/last.ckpt" -p "The engine" -n 8 --temp 0 > /dev/null 2> "$D/out5"
check $? "generate with the fully trained MoE model: $(tail -2 "$D/out5")"
"$LLSRV" train --model "$D/moe.ckpt" --mode full --moe-aux-coef 0 --data "$LL_SOURCE_DIR/docs/ARCHITECTURE.md" --steps 2 --seq-len 32 \
  --log-every 1 -t 2 --device cpu -o "$D/full0" > "$D/out6" 2>&1
[ $? -eq 0 ] && ! grep -q ' aux ' "$D/out6"
check $? "--moe-aux-coef 0: $(tail -2 "$D/out6")"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
