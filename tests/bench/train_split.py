#!/usr/bin/env python3
# train_split.py - issue 30: how one CPU training step's work splits over a pool of T threads,
# measured on any machine (2 cores prove what 16 would get). `llsrv train --device cpu` runs
# with LL_POOL_TRACE (kernels/cpu/threadpool.c): every parallel region ("job") then runs its
# tasks one after another on one thread and logs each task's CPU time, and the caller's serial
# CPU time between jobs. For the last whole step (the jobs after one AdamW up to the next) it
# prints, per task function: jobs, tasks per job, CPU share, and the imbalance at T threads -
# the makespan of the job's tasks claimed in order by T equal threads (the pool's dynamic
# claim) over the perfect share (sum / T), 1.00 = balanced - and the whole step's predicted
# speed-up at 1, 2, 4, 8, 16 threads from those makespans and the serial time (what the split
# allows: memory bandwidth, the pool's hand-offs and other load not counted). The run is given
# -t THREADS (its tasks still run on one thread), so a split that depends on the pool's size
# is traced as that pool would run it.
#
#   python3 tests/bench/train_split.py --build build --model SmolLM2-135M-Instruct.Q4_1.gguf \
#       [--seq-len 256] [--steps 3] [--threads 16] [--isa avx2]
#
# Exit status 1 when a product (matmul, matmul_backward, attention, softmax_xent) has a job of
# more than 1% of the step with fewer than --threads tasks or an imbalance above --max-imbalance.
import argparse
import collections
import heapq
import os
import shutil
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--threads", type=int, default=16, help="the pool size the split is judged at")
ap.add_argument("--isa", default="", help="LL_CPU_ISA for the run (avx2: the products by dequantize + sgemm)")
ap.add_argument("--max-imbalance", type=float, default=1.25)
ap.add_argument("--extra", default="", help="more llsrv train options, space-separated")
a = ap.parse_args()

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

LLSRV = os.path.join(a.build, "server", "llsrv")
tmp = tempfile.mkdtemp(prefix="llsrv-trainsplit-")
corpus, _ = benchlib.corpus(tmp)
trace = os.path.join(tmp, "trace")
env = dict(os.environ, LL_POOL_TRACE=trace, OPENBLAS_NUM_THREADS="1")
if a.isa:
    env["LL_CPU_ISA"] = a.isa
    if a.isa == "avx2":
        env["OPENBLAS_CORETYPE"] = "Haswell"
cmd = [LLSRV, "train", "--model", a.model, "--device", "cpu", "--data", corpus, "--seq-len", str(a.seq_len), "--batch", "1",
       "--steps", str(a.steps), "--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout", "0", "--lr", "1e-4", "--warmup", "0",
       "--eval-every", "0", "--checkpoint-every", "0", "-t", str(a.threads), "--restart", "-o", os.path.join(tmp, "run")] + a.extra.split()
r = subprocess.run(cmd, env=env, capture_output=True, text=True)
if r.returncode != 0:
    sys.exit("failed: %s\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-2000:]))

# Names of the task functions: nm's symbols (static ones included) by address, which is the
# offset in the PIE binary.
syms = []
for line in subprocess.run(["nm", "--defined-only", LLSRV], capture_output=True, text=True).stdout.splitlines():
    f = line.split()
    if len(f) == 3 and f[1] in "tT":
        syms.append((int(f[0], 16), f[2]))
syms.sort()


def name(off):
    lo, hi = 0, len(syms)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if syms[mid][0] <= off:
            lo = mid
        else:
            hi = mid
    return syms[lo][1] if syms and syms[lo][0] <= off else hex(off)


jobs = []
for line in open(trace):
    f = line.split()
    jobs.append((name(int(f[0], 16)), int(f[1]), [int(x) for x in f[2:]]))
shutil.rmtree(tmp, ignore_errors=True)
ends = [i for i, j in enumerate(jobs) if j[0] == "adamw_task"]
if len(ends) < 2:
    sys.exit("fewer than two AdamW jobs in the trace (%d jobs): more --steps" % len(jobs))
step = jobs[ends[-2] + 1:ends[-1] + 1]


def makespan(tasks, T):
    """Tasks claimed in index order by T threads, each taking the next when it is free."""
    if T <= 1 or len(tasks) <= 1:
        return sum(tasks)
    free = [0] * T
    for x in tasks:
        heapq.heapreplace(free, free[0] + x)
    return max(free)


counts = [1, 2, 4, 8, 16]
if a.threads not in counts:
    counts.append(a.threads)
serial = sum(j[1] for j in step)
total = serial + sum(sum(j[2]) for j in step)
span = {T: serial + sum(makespan(j[2], T) for j in step) for T in counts}
by = collections.OrderedDict()
for n, gap, tasks in step:
    by.setdefault(n, []).append(tasks)
cpu, isa = benchlib.machine()
print("# %s (%s; LL_CPU_ISA=%s), seq %d, step %d of %d; %d jobs, step CPU %.1f ms (serial between jobs %.1f ms); load %s" %
      (cpu, isa, a.isa or "native", a.seq_len, a.steps, a.steps, len(step), total / 1e6, serial / 1e6, benchlib.load()))
print()
print("| task function | jobs | tasks per job | CPU share | imbalance at %d threads (worst job / CPU-weighted) |" % a.threads)
print("|---|---:|---:|---:|---:|")
bad = []
PRODUCTS = ("blas_task", "mm_task", "mm_multi_task", "mmb_", "att_", "xe_task")
for n, tl in sorted(by.items(), key=lambda kv: -sum(sum(t) for t in kv[1])):
    cpu_n = sum(sum(t) for t in tl)
    nt = sorted(len(t) for t in tl)
    imb = [makespan(t, a.threads) * a.threads / sum(t) if sum(t) else 1.0 for t in tl]
    w = sum(i * sum(t) for i, t in zip(imb, tl)) / cpu_n if cpu_n else 1.0
    print("| %s | %d | %s | %.1f%% | %.2f / %.2f |" % (n, len(tl), "%d" % nt[0] if nt[0] == nt[-1] else "%d-%d" % (nt[0], nt[-1]),
                                                       100.0 * cpu_n / total, max(imb), w))
    if n.startswith(PRODUCTS):
        for t, i in zip(tl, imb):
            if sum(t) > 0.01 * total and (len(t) < a.threads or i > a.max_imbalance):
                bad.append("%s: %d tasks, imbalance %.2f, %.1f%% of the step" % (n, len(t), i, 100.0 * sum(t) / total))
print()
print("| threads | predicted step speed-up (the split's limit) | vs 2 threads |")
print("|---:|---:|---:|")
for T in counts:
    print("| %d | %.2fx | %.2fx |" % (T, total / span[T], span[2] / span[T]))
print()
if bad:
    print("products of more than 1%% of the step short of %d balanced tasks:\n  %s" % (a.threads, "\n  ".join(bad[:20])))
    sys.exit(1)
print("every product job of more than 1%% of the step: at least %d tasks, imbalance <= %.2f at %d threads" %
      (a.threads, a.max_imbalance, a.threads))
