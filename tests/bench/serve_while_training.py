#!/usr/bin/env python3
# serve_while_training.py - issue 11's serving-while-training figures, in one run: the server
# (SmolLM2 by default, `--parallel 4`) answers one client's GEN requests one after another,
# first idle and then while it fine-tunes LoRA in the background (r 16, alpha 32, all seven
# targets, sequences of S tokens, batch 1, train.share as configured); then, with no requests,
# the server's training tokens/s against `llsrv train` alone with the same settings. Prints the
# machine (CPU, ISA, load, read bandwidth) and the ratios the issue sets targets for:
# latency p50 while training / idle (target <= 1.5) and training tokens/s in the server /
# alone (target >= 0.9).
#
#   python3 tests/bench/serve_while_training.py --build build --model SmolLM2-135M-Instruct.Q4_1.gguf \
#       [--requests 15] [--max-tokens 32] [--threads 2] [--seq-len 256] [--window 60] [--share 0.25] [--device opencl:0:0]
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "scripts"))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
from benchlib import load, machine  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--requests", type=int, default=15)
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--window", type=float, default=60.0, help="seconds of training measured without requests")
ap.add_argument("--share", type=float, default=None, help="train.share (default: the config's default)")
ap.add_argument("--device", default=None, help="the engine's device for serving and training (default: the server's choice)")
a = ap.parse_args()
os.environ["LL_BINARY_DIR"] = os.path.abspath(a.build)
from llsrv_client import Monitor, Server, escape, wait_until  # noqa: E402

LLSRV = os.path.join(a.build, "server", "llsrv")
S, T = a.seq_len, a.threads
PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):", "Explain what a LoRA adapter is."]


def readbw():
    return benchlib.readbw(a.build, T)


def training_now(srv):
    """The training object of a snapshot taken now (a monitor connection's first; one kept open
    queues snapshots that a reader which sleeps would read late)."""
    m = Monitor(srv.sock, timeout=600)
    try:
        return m.snapshot()["training"]
    finally:
        m.close()


def latencies(srv, n):
    out = []
    for i in range(n):
        c = srv.conn(timeout=600)
        t0 = time.time()
        text, kv, lines = c.generate("GEN max_tokens=%d temperature=0 ignore_eos=1 :%s" % (a.max_tokens, escape(PROMPTS[i % len(PROMPTS)])))
        dt = time.time() - t0
        c.close()
        if text is None:
            sys.exit("GEN failed: %r" % lines[-1:])
        out.append(dt)
    return out


tmp = tempfile.mkdtemp(prefix="llsrv-swt-")
corpus, _ = benchlib.corpus(tmp)
train = ["--train-data", corpus, "--train-seq-len", str(S), "--train-batch", "1", "--train-lora-rank", "16", "--train-lora-alpha", "32",
         "--train-lr", "1e-4", "--train-eval-every", "0", "--train-checkpoint-every", "0", "--train-steps", "100000"]
if a.share is not None:
    train += ["--train-share", str(a.share)]
cpu, flags = machine()
print("# %s UTC, %s (%s), %d threads; load %s; read bandwidth %s GB/s" % (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), cpu, flags, T,
                                                                         load(), readbw()), flush=True)
DEV = ["--device", a.device] if a.device else []
srv = Server(tmp, ["--model", a.model, "--parallel", "4", "--threads", str(T)] + DEV + train)
try:
    latencies(srv, 2)  # warm-up
    idle = latencies(srv, a.requests)
    mon = Monitor(srv.sock, timeout=600)
    r = mon.cmd("train start")
    mon.close()
    if not r["ok"]:
        sys.exit("train start: %r" % r)
    wait_until(lambda: (training_now(srv)["step"] or 0) >= 2, "two training steps", 600, step=0.5)
    busy = latencies(srv, a.requests)
    s_busy = training_now(srv)["step"]
    # training alone in the server: steps over a window without requests
    wait_until(lambda: training_now(srv)["step"] > s_busy + 1, "a step without requests", 600, step=0.2)
    t0, s0 = time.time(), training_now(srv)["step"]
    time.sleep(a.window)
    s1 = training_now(srv)["step"]
    t1 = time.time()
    srv_tps = (s1 - s0) * S / (t1 - t0)
finally:
    srv.stop()
print("# server done; load %s" % load(), flush=True)

# llsrv train alone, the same settings and the same number of seconds of steps
rd = os.path.join(tmp, "run")
steps = max(5, int(a.window * srv_tps / S) + 3)
out = subprocess.run([LLSRV, "train", "--model", a.model, "--data", corpus, "--seq-len", str(S), "--batch", "1", "--steps", str(steps),
                      "--lora-rank", "16", "--lora-alpha", "32", "--lr", "1e-4", "--eval-every", "0", "--checkpoint-every", "0", "-t", str(T),
                      "--log-every", "1", "--restart", "-o", rd] + DEV, capture_output=True, text=True)
k0, k1 = 2, steps - 1
alone_tps = benchlib.train_tps(out.stdout, S, k0, k1)
if out.returncode != 0 or alone_tps is None:
    sys.exit("llsrv train failed:\n" + out.stdout[-1500:] + out.stderr[-1500:])
print("# after: load %s; read bandwidth %s GB/s" % (load(), readbw()), flush=True)
p50i, p50b = statistics.median(idle), statistics.median(busy)
print()
print("| GEN max_tokens=%d, one client, parallel 4 | p50 s | p90 s |" % a.max_tokens)
print("|---|---:|---:|")
print("| idle | %.3f | %.3f |" % (p50i, sorted(idle)[int(0.9 * (len(idle) - 1))]))
print("| while training | %.3f | %.3f |" % (p50b, sorted(busy)[int(0.9 * (len(busy) - 1))]))
print("| **ratio** (target <= 1.5) | **%.2fx** | |" % (p50b / p50i))
print()
print("| training, no requests | tok/s |")
print("|---|---:|")
print("| server (%d steps over %.0f s) | %.1f |" % (s1 - s0, t1 - t0, srv_tps))
print("| `llsrv train` alone (steps %d..%d) | %.1f |" % (k0, k1, alone_tps))
print("| **ratio** (target >= 0.9) | **%.2f** |" % (srv_tps / alone_tps))
shutil.rmtree(tmp, ignore_errors=True)
