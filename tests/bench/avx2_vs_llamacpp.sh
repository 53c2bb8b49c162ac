#!/bin/sh
# Side by side: llsrv's AVX2 kernels vs llama.cpp 0c1e5709, pp128 / tg64, 1 and 2 threads,
# the two programs alternating per (model, threads), ROUNDS times (take medians: the VM is shared).
# usage: tests/bench/avx2_vs_llamacpp.sh LLSRV LLAMA_BENCH MODEL_DIR [ROUNDS]
#   MODEL_DIR holds Q4_0.gguf Q4_1.gguf Q8_0.gguf Q4_K_M.gguf (SmolLM2-135M-Instruct; see
#   docs/PERFORMANCE.md for how they were made). On an AVX-512 machine LLAMA_BENCH must be a
#   build with -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF;
#   llsrv is pinned to its AVX2 kernels with LL_CPU_ISA=avx2 either way.
#   llama.cpp runs with -fa 0 (the attention llsrv computes bit for bit); LLAMA_FA=auto runs it
#   with its default (flash attention on for this model), faster on prompts: report both.
set -eu
LLSRV=$1 LB=$2 DIR=$3 ROUNDS=${4:-3}
echo "# $(date -u '+%F %T') $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) load:$(cut -d' ' -f1-3 /proc/loadavg) llama.cpp -fa ${LLAMA_FA:-0}"
for r in $(seq "$ROUNDS"); do
  for m in Q4_0 Q4_1 Q8_0 Q4_K_M; do
    for t in 1 2; do
      "$LB" -m "$DIR/$m.gguf" -p 128 -n 64 -t "$t" -r 3 -fa "${LLAMA_FA:-0}" -o md 2>/dev/null |
        awk -F'|' -v m="$m" -v t="$t" -v r="$r" '/pp128|tg64/ {gsub(/ /,"",$(NF-2)); gsub(/ /,"",$(NF-1)); print "llama.cpp", m, t, $(NF-2), $(NF-1), r}'
      LL_CPU_ISA=avx2 "$LLSRV" bench --model "$DIR/$m.gguf" -p 128 -n 64 -t "$t" -r 3 2>/dev/null |
        awk -F'|' -v m="$m" -v t="$t" -v r="$r" '/pp128|tg64/ {gsub(/ /,"",$(NF-2)); gsub(/ /,"",$(NF-1)); print "llsrv", m, t, $(NF-2), $(NF-1), r}'
    done
  done
  echo "# load after round $r:$(cut -d' ' -f1-3 /proc/loadavg)"
done
