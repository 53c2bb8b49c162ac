#!/usr/bin/env python3
# train_vs_peft.py - issue 11's training benchmark, side by side in one run: `llsrv train` (LoRA
# r 16, alpha 32, all seven targets, sequences of S tokens, batch 1, T threads) against PyTorch +
# PEFT on the same GGUF and the same text (tests/bench/peft_train.py), alternating per round, with
# the machine named (CPU, ISA, load, read bandwidth and OpenBLAS sgemm's peak measured in the same
# minutes). Reports training tokens/s and its ratio to the peer, a step's time over llsrv's own
# forward pass over the same tokens (`llsrv bench -p S -n 0`), peak resident memory against the
# weights (with and without --recompute), and the achieved FLOP/s next to sgemm's peak.
#
#   python3 tests/bench/train_vs_peft.py --build build --model SmolLM2-135M-Instruct.Q4_1.gguf \
#       --python /path/to/venv/bin/python [--steps 30] [--warmup 3] [--rounds 2] [--threads 2] [--isa native,avx2]
#
# --build: a build directory after `make bench` (server/llsrv, tests/readbw, tests/train_kernels_bench).
# --python: a venv with torch, transformers, peft, gguf (for this benchmark only; never the suite's).
# --isa avx2 pins both sides to AVX2 (LL_CPU_ISA=avx2, OPENBLAS_CORETYPE=Haswell, ATEN_CPU_CAPABILITY=avx2),
# to measure an AVX2-only machine's paths on an AVX-512 one.
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--python", required=True)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--isa", default="native")
ap.add_argument("--no-peer", action="store_true", help="llsrv only (no PyTorch)")
a = ap.parse_args()

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
from benchlib import load, machine  # noqa: E402

LLSRV = os.path.join(a.build, "server", "llsrv")
S, T = a.seq_len, a.threads


def run(cmd, env_extra=None, check=True):
    """Runs cmd; returns (stdout+stderr text, peak RSS of that process in MiB, seconds)."""
    env = dict(os.environ)
    env.update(env_extra or {})
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out = p.stdout.read().decode("utf-8", "replace")
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if check and p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), out[-2000:]))
    return out, ru.ru_maxrss / 1024.0, time.time() - t0


def readbw():
    return [float(x) for x in benchlib.readbw(a.build, T).split(" / ") if x]


def sgemm_peak(env):
    out, _, _ = run([os.path.join(a.build, "tests", "train_kernels_bench"), "--peak", "-t", str(T), "-r", "3"], env)
    m = re.search(r"1 thread ([\d.]+) GFLOP/s, \d+ threads \(OpenBLAS's\) ([\d.]+) GFLOP/s", out)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


ISA_ENV = {"native": {}, "avx2": {"LL_CPU_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2"}}
isas = a.isa.split(",")
for i in isas:
    if i not in ISA_ENV:
        sys.exit("--isa: native or avx2")

tmp = tempfile.mkdtemp(prefix="llsrv-trainbench-")
corpus, files = benchlib.corpus(tmp)


def llsrv_train(env, recompute=False):
    rd = os.path.join(tmp, "run")
    shutil.rmtree(rd, ignore_errors=True)
    cmd = [LLSRV, "train", "--model", a.model, "--data", corpus, "--seq-len", str(S), "--batch", "1", "--steps", str(a.steps),
           "--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout", "0", "--lr", "1e-4", "--warmup", "0", "--eval-every", "0",
           "--checkpoint-every", "0", "-t", str(T), "--log-every", "1", "--restart", "-o", rd]
    if recompute:
        cmd.append("--recompute")
    out, rss, _ = run(cmd, env)
    tps = benchlib.train_tps(out, S, a.warmup, a.steps - 1)  # the last step also saves
    if tps is None:
        sys.exit("llsrv train: no progress lines to time\n" + out[-2000:])
    m = re.search(r"\(llama, \S+, (\d+) parameters\)", out)
    return tps, rss, int(m.group(1)) if m else None


def llsrv_forward(env):
    out, _, _ = run([LLSRV, "bench", "--model", a.model, "-p", str(S), "-n", "0", "-t", str(T), "-r", "3"], env)
    m = re.search(r"pp%d\s*\|\s*([\d.]+)" % S, out)
    if not m:
        sys.exit("llsrv bench: no pp%d figure\n%s" % (S, out[-1000:]))
    return float(m.group(1))


def peer(env):
    out, rss, _ = run([a.python, os.path.join(HERE, "peft_train.py"), "--gguf", a.model, "--data"] + files +
                      ["--seq-len", str(S), "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(T)], env)
    import json
    j = json.loads(out.strip().splitlines()[-1])
    j["rss_process"] = rss
    return j


cpu, flags = machine()
print("# %s UTC, %s (%s), %d threads, seq %d, batch 1, LoRA r16 alpha32 on q,k,v,o,gate,up,down, %d steps (%d warm-up)" %
      (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), cpu, flags, T, S, a.steps, a.warmup), flush=True)
print("# load %s; read bandwidth %s GB/s (1..%d threads)" % (load(), " / ".join("%.1f" % x for x in readbw()), T), flush=True)
weights_mib = os.path.getsize(a.model) / 1048576.0
res = {i: {"ll": [], "fwd": [], "rss": [], "rss_rc": [], "peer": []} for i in isas}
n_params = None
for r in range(a.rounds):
    for i in isas:
        env = ISA_ENV[i]
        tps, rss, n_params = llsrv_train(env)
        res[i]["ll"].append(tps)
        res[i]["rss"].append(rss)
        res[i]["fwd"].append(llsrv_forward(env))
        if r == 0:
            _, rss_rc, _ = llsrv_train(env, recompute=True)
            res[i]["rss_rc"].append(rss_rc)
        if not a.no_peer:
            res[i]["peer"].append(peer(env))
        print("# round %d %s: llsrv %.1f tok/s (forward %.1f), peer %s; load %s" %
              (r + 1, i, tps, res[i]["fwd"][-1], res[i]["peer"][-1]["train_tok_s"] if res[i]["peer"] else "-", load()), flush=True)
peak = {i: sgemm_peak(ISA_ENV[i]) for i in isas}
print("# after: load %s; read bandwidth %s GB/s" % (load(), " / ".join("%.1f" % x for x in readbw())), flush=True)

# FLOPs per trained token: the frozen base's products forward (2 per weight) and their
# activation gradients backward (2 per weight; no weight gradients), + 2 more with --recompute;
# the adapters' forward, dx and dW (6 per adapter parameter); attention's S^2 terms are left out
# (under 3% at S = 256 for SmolLM2).
lora = res[isas[0]]["peer"][0]["lora_params"] if res[isas[0]]["peer"] else 4884480
fl_tok = 4.0 * (n_params or 0) + 6.0 * lora
print()
print("| ISA | llsrv train tok/s | PyTorch+PEFT tok/s | ratio | llsrv step / forward | PEFT step / forward | llsrv GFLOP/s | sgemm peak 1t / %dt GFLOP/s | peak RSS llsrv (recompute) | PEFT RSS | weights |" % T)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for i in isas:
    x = res[i]
    ll = statistics.median(x["ll"])
    fwd = statistics.median(x["fwd"])
    pe = statistics.median([p["train_tok_s"] for p in x["peer"]]) if x["peer"] else float("nan")
    pe_ratio = statistics.median([p["step_over_forward"] for p in x["peer"]]) if x["peer"] else float("nan")
    prss = max(p["rss_process"] for p in x["peer"]) if x["peer"] else float("nan")
    p1, pn = peak[i]
    print("| %s | %.1f (%s) | %.1f | **%.2fx** | %.2fx | %.2fx | %.1f | %s / %s | %.0f MiB = weights + %.0f (%.0f = + %.0f) | %.0f MiB | %.0f MiB |" %
          (i, ll, ", ".join("%.1f" % v for v in x["ll"]), pe, ll / pe, fwd / ll, pe_ratio, ll * fl_tok * 1e-9, p1, pn,
           max(x["rss"]), max(x["rss"]) - weights_mib, max(x["rss_rc"]), max(x["rss_rc"]) - weights_mib, prss, weights_mib))
shutil.rmtree(tmp, ignore_errors=True)
