#!/usr/bin/env python3
# bench_server.py - serving throughput through real sockets: aggregate generation tok/s of
# N concurrent greedy streams vs one stream, same server, same run.
#   python3 tests/bench/bench_server.py MODEL [--streams 8] [--tokens 64] [--threads 2]
import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from llsrv_client import Server  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--streams", type=int, default=8)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=2)
a = ap.parse_args()
tmp = tempfile.mkdtemp(prefix="llsrv-bench-")
os.chmod(tmp, 0o700)
srv = Server(tmp, ["--model", a.model, "--parallel", str(a.streams), "--ctx", "512", "--threads", str(a.threads)])


def run(n):
    done = []

    def one(i):
        c = srv.conn(timeout=600)
        t, e, _ = c.generate("GEN max_tokens=%d temperature=0 ignore_eos=1 :Stream %d: once upon a time" % (a.tokens, i))
        c.close()
        done.append(int(e["tokens"]))

    ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


run(1)  # warm-up
one = max(run(1) for _ in range(a.reps))
many = max(run(a.streams) for _ in range(a.reps))
srv.stop()
print("| streams | aggregate tok/s | vs 1 stream |")
print("|--------:|----------------:|------------:|")
print("| 1 | %.1f | 1.00 |" % one)
print("| %d | %.1f | %.2f |" % (a.streams, many, many / one))
