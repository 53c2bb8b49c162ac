#!/usr/bin/env bash
# LoRA training of Gemma 3 270M Q4_K_M (tests/fetch-gemma3.sh) with `llsrv train`, and the
# exported adapter in llama.cpp 0c1e5709 --lora (tests/ref/README.md, section 10):
#  - 30 steps (r 8, alpha 16, all seven targets, seq_len 64, lr 2e-3) on man/ of the pinned corpus
#    (tests/data/finetune_corpus.tar.xz, as finetune_smollm2): the validation loss at step 30 is
#    below the step-0 one;
#  - `llsrv export` of the last checkpoint is the adapter llama.cpp's reference ids were made with
#    (sha256; the training arithmetic pinned as in finetune_smollm2: LL_CPU_ISA=avx2,
#    OPENBLAS_CORETYPE=Haswell, one OpenBLAS thread, 2 trainer threads - on another OpenBLAS
#    build the check fails and says so);
#  - with that adapter, the engine against llama.cpp's greedy ids (tests/ref/gemma3_lora_greedy64.tsv):
#    teacher-forced top-1 agreement >= 99% (the base model's tolerance, engine_gemma3: Gemma 3's
#    sums are not llama.cpp's bit for bit), and the adapter changes llama.cpp's own ids (against
#    tests/ref/gemma3_greedy64.tsv), so the comparison is about the adapter.
set -u
SHA=046b11a212fbf2cf05ae1b5a0202f34d0ae3b4dd23970f26f0118c3532072665
M=$(bash "$LL_SOURCE_DIR/tests/fetch-gemma3.sh") || { echo "Gemma 3 not fetched"; echo "0 passed, 1 failed"; exit 1; }
REF=$LL_SOURCE_DIR/tests/ref
LLSRV=$LL_BINARY_DIR/server/llsrv
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); echo "ok: $2"; else failed=$((failed + 1)); echo "FAIL: $2"; fi; }
mkdir "$D/corpus"
tar -xJf "$LL_SOURCE_DIR/tests/data/finetune_corpus.tar.xz" -C "$D/corpus" man
export LL_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1
"$LLSRV" train --model "$M" --data "$D/corpus/man" --seq-len 64 --batch 1 --lora-rank 8 --lora-alpha 16 --lr 2e-3 --warmup 3 \
  --steps 30 --eval-every 10 --eval-seqs 8 --checkpoint-every 0 --log-every 5 -t 2 -o "$D/run" >"$D/train.out" 2>&1
rc=$?
cat "$D/train.out"
check '[ $rc -eq 0 ] && [ -f "$D/run/last.ckpt" ]' "llsrv train on gemma3 (rc $rc)"
# "step 0/30  val V0" before the first step; "done: ... val V30, best val ..." at the end
v0=$(sed -n 's|^step 0/30  val \([0-9.]*\).*|\1|p' "$D/train.out")
v30=$(sed -n 's|^done: .*, val \([0-9.]*\),.*|\1|p' "$D/train.out")
check 'python3 -c "import sys; sys.exit(0 if float(\"$v30\") < float(\"$v0\") else 1)" 2>/dev/null' "validation loss falls: step 0 $v0 -> step 30 $v30"
"$LLSRV" export "$D/run/last.ckpt" "$D/g3-lora.gguf" --model "$M" >"$D/export.out" 2>&1
check '[ $? -eq 0 ]' "export: $(tail -2 "$D/export.out")"
[ -n "${LL_KEEP_ADAPTER:-}" ] && cp "$D/g3-lora.gguf" "$LL_KEEP_ADAPTER"
sha=$(sha256sum "$D/g3-lora.gguf" | cut -d' ' -f1)
check '[ "$sha" = "$SHA" ]' "the exported adapter is the reference's (sha256 $sha, want $SHA): if not, another CPU or OpenBLAS build changed the training arithmetic, and llama.cpp's ids below belong to other bytes"
"$LL_BINARY_DIR/tests/test_arch_ref" "$M" "$REF/gemma3_lora_greedy64.tsv" --prompts "$REF/gemma3_prompts.txt" --min-tf 0.99 --adapter "$D/g3-lora.gguf" >"$D/ref.out" 2>&1
rc=$?
cat "$D/ref.out"
check '[ $rc -eq 0 ]' "with the adapter, llama.cpp --lora's ids teacher-forced >= 99%"
changed=$(python3 - "$REF/gemma3_greedy64.tsv" "$REF/gemma3_lora_greedy64.tsv" <<'PY'
import sys
rows = [{l.split("\t")[0]: l.rstrip("\n").split("\t")[2].split() for l in open(f) if l.strip()} for f in sys.argv[1:]]
print(sum(sum(a != b for a, b in zip(rows[0][k], rows[1][k])) for k in rows[1]))
PY
)
check '[ "${changed:-0}" -gt 0 ]' "the adapter changes llama.cpp's greedy ids ($changed of 256 differ from the base model's)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
