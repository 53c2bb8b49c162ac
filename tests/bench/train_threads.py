#!/usr/bin/env python3
# train_threads.py - issue 30's CPU scaling benchmark: `llsrv train --device cpu` tokens/s at
# 1, 2, 4, ... threads up to the CPUs this process may use (and the count itself when it is not
# a power of two), LoRA r 16 alpha 32 on all seven targets, sequences of S tokens, batch 1, the
# thread counts interleaved round by round so a change of load shows in the spread, not in one
# thread count's figure. Prints a table with each count's speedup over 1 and 2 threads and the
# load average, and says whether more threads were ever slower than fewer (the rule: never).
#
#   python3 tests/bench/train_threads.py --build build --model SmolLM2-135M-Instruct.Q4_1.gguf \
#       [--steps 8] [--warmup 2] [--rounds 2] [--max-threads N] [--over 4]
#
# --over K adds thread counts K x the CPUs (oversubscription: what a pool whose workers spin
# does when it has fewer cores than threads). The target, on a 16-core host: 16 threads
# at least 4x the tokens/s of 2 threads.
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--warmup", type=int, default=2, help="steps left out of the timing (buffers, page faults)")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--max-threads", type=int, default=0, help="default: the CPUs this process may run on")
ap.add_argument("--over", type=int, default=0, help="also run K x the CPUs threads")
ap.add_argument("--tolerance", type=float, default=0.05, help="slower by less than this fraction counts as noise")
a = ap.parse_args()

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

LLSRV = os.path.join(a.build, "server", "llsrv")
S = a.seq_len
ncpu = len(os.sched_getaffinity(0))
top = a.max_threads or ncpu
counts = []
t = 1
while t < top:
    counts.append(t)
    t *= 2
counts.append(top)
if a.over > 1:
    counts.append(a.over * ncpu)

tmp = tempfile.mkdtemp(prefix="llsrv-trainthreads-")
corpus, _ = benchlib.corpus(tmp)


def train(threads):
    rd = os.path.join(tmp, "run")
    shutil.rmtree(rd, ignore_errors=True)
    cmd = [LLSRV, "train", "--model", a.model, "--device", "cpu", "--data", corpus, "--seq-len", str(S), "--batch", "1",
           "--steps", str(a.steps), "--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout", "0", "--lr", "1e-4",
           "--warmup", "0", "--eval-every", "0", "--checkpoint-every", "0", "-t", str(threads), "--log-every", "1",
           "--restart", "-o", rd]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read().decode("utf-8", "replace")
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out[-2000:]))
    tps = benchlib.train_tps(out, S, a.warmup, a.steps - 1)  # the last step also saves
    if tps is None:
        sys.exit("llsrv train: no progress lines to time\n" + out[-2000:])
    # CPU seconds per 1000 tokens over the whole run (start and save included): what spinning,
    # oversubscription or extra work cost, less disturbed by other load than wall time is.
    return tps, (ru.ru_utime + ru.ru_stime) * 1000.0 / (a.steps * S)


cpu, isa = benchlib.machine()
print("# %s, %s, %d CPUs usable; seq %d, steps %d (%d timed), rounds %d; load before %s" %
      (cpu, isa, ncpu, S, a.steps, a.steps - 1 - a.warmup, a.rounds, benchlib.load()))
res = {c: [] for c in counts}
cpu_s = {c: [] for c in counts}
loads = []
for r in range(a.rounds):
    for c in counts:
        tps, cs = train(c)
        res[c].append(tps)
        cpu_s[c].append(cs)
        loads.append(benchlib.load())
        print("# round %d, %d threads: %.1f tok/s, %.2f CPU s per 1k tokens (load %s)" % (r + 1, c, tps, cs, loads[-1]), flush=True)
shutil.rmtree(tmp, ignore_errors=True)

best = {c: max(v) for c, v in res.items()}
print()
print("| threads | tok/s (best) | tok/s (median) | vs 1 thread | vs 2 threads | CPU s / 1k tokens (min) |")
print("|---:|---:|---:|---:|---:|---:|")
for c in counts:
    two = "%.2fx" % (best[c] / best[2]) if 2 in best else "n/a"
    print("| %d | %.1f | %.1f | %.2fx | %s | %.2f |" % (c, best[c], statistics.median(res[c]), best[c] / best[1], two, min(cpu_s[c])))
print()
print("load averages after each run: %s" % "; ".join(loads))
bad = [(x, y) for i, x in enumerate(counts) for y in counts[i + 1:] if y <= ncpu and best[y] < best[x] * (1 - a.tolerance)]
if bad:
    print("SLOWER with more threads (beyond %.0f%%): %s" % (a.tolerance * 100, ", ".join("%d -> %d" % p for p in bad)))
else:
    print("more threads never slower than fewer (within %.0f%%, up to %d CPUs)" % (a.tolerance * 100, ncpu))
