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
# After the rounds, a summary per (model, threads, test): each program's best round (a busy
# neighbour only ever slows a run down, so on a shared VM the best rounds are the comparable
# ones), their ratio, and the median of the rounds' own ratios.
set -eu
LLSRV=$1 LB=$2 DIR=$3 ROUNDS=${4:-3}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
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
done | tee "$LOG"
echo "# best of $ROUNDS rounds: model threads test llama.cpp llsrv ratio | median of the rounds' ratios"
awk '$1 == "llama.cpp" || $1 == "llsrv" {
  k = $2 " " $3 " " $4; split($5, v, "±"); x = v[1] + 0
  if (!(k in seen)) { seen[k] = 1; order[++n] = k }
  if (x > best[$1, k]) best[$1, k] = x
  val[$1, k, $6] = x; if ($6 > nr) nr = $6
}
END {
  for (i = 1; i <= n; i++) {
    k = order[i]; m = 0
    for (r = 1; r <= nr; r++) if (val["llama.cpp", k, r] > 0 && val["llsrv", k, r] > 0) q[++m] = val["llsrv", k, r] / val["llama.cpp", k, r]
    for (a = 2; a <= m; a++) for (b = a; b > 1 && q[b - 1] > q[b]; b--) { t = q[b]; q[b] = q[b - 1]; q[b - 1] = t }
    med = m ? (m % 2 ? q[(m + 1) / 2] : (q[m / 2] + q[m / 2 + 1]) / 2) : 0
    l = best["llama.cpp", k]; s = best["llsrv", k]
    printf "best %s %.2f %.2f %.2f | %.2f\n", k, l, s, (l > 0 ? s / l : 0), med
  }
}' "$LOG"
