#!/usr/bin/env python3
# demo_minutes.py - the embedded tiny demo (configs/demo.yaml: ./setup.sh run's offline fallback)
# as a newcomer meets it, measured (issue 34): a byte-level Llama created from nothing and
# pre-trained on this repository's tracked files while it serves.
#   - the validation loss in bits per byte at each minute (the demo's vocabulary is one token per
#     byte, so bits/byte = nats/token / ln 2);
#   - at 1, 5 and 10 minutes (or --marks), a sample continuing a C prompt (temperature 0.6,
#     fixed seed) and how code-like it is: the share of its identifier-like words that occur as
#     words in the training files, and whether its brackets nest;
#   - at the end, lltop --json says the run is still `running`.
# Usage: python3 tests/bench/demo_minutes.py [--minutes 10] [--marks 1,5,10] [--config PATH]
# Prints a report; exits 1 when the run is not `running` at the end or the last sample's known-word
# share is under --min-known (default 0.6). A benchmark, not a suite test: it needs quiet minutes.
import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "scripts"))
os.environ.setdefault("LL_BINARY_DIR", os.path.join(ROOT, "build"))
from llsrv_client import Monitor, Server  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import lltop_training_state, machine  # noqa: E402

PROMPT = "static int "
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def corpus_words():
    """The words (3+ identifier characters) of the files the demo trains on: git's tracked files."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    words = set()
    for f in files:
        p = os.path.join(ROOT, f.decode("utf-8", "replace"))
        if not f or not os.path.isfile(p) or os.path.getsize(p) > (1 << 20):
            continue
        with open(p, "rb") as fh:
            words.update(WORD.findall(fh.read().decode("utf-8", "replace")))
    return words


def code_likeness(text, words):
    ws = WORD.findall(text)
    known = sum(1 for w in ws if w in words)
    depth, nests = 0, True
    for ch in text:
        depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(ch, 0)
        nests &= depth >= 0
    return (known / len(ws) if ws else 0.0), len(ws), nests


def sample(srv, seed):
    c = srv.conn(timeout=600)
    try:
        text, kv, _ = c.generate("GEN max_tokens=240 temperature=0.6 seed=%d :%s" % (seed, PROMPT))
        return PROMPT + (text or b"").decode("utf-8", "replace")
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--marks", default="1,5,10")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "demo.yaml"))
    ap.add_argument("--min-known", type=float, default=0.6)
    a = ap.parse_args()
    marks = sorted(float(m) for m in a.marks.split(","))
    words = corpus_words()
    os.chdir(ROOT)  # the demo trains on the tracked files of the directory llsrv runs in
    tmp = tempfile.mkdtemp(prefix="llsrv-demo-")
    os.chmod(tmp, 0o700)
    ok = True
    last_known = 0.0
    try:
        t0 = time.time()
        srv = Server(tmp, ["--config", a.config])
        print("machine: %s, %d cores; load at start %s" % (machine()[0], os.cpu_count(), open("/proc/loadavg").read().split()[:3]))
        print("server up in %.1f s; corpus: %d distinct words" % (time.time() - t0, len(words)))
        next_min = 1
        while True:
            el = time.time() - t0
            if marks and el >= marks[0] * 60:
                m = marks.pop(0)
                mon = Monitor(srv.sock, timeout=600)
                tr = mon.snapshot()["training"]
                mon.close()
                vals = [p[2] for p in tr["history"] if p[2] is not None]
                s = sample(srv, 7)
                known, nw, nests = code_likeness(s[len(PROMPT):], words)
                last_known = known
                bpb = vals[-1] / math.log(2) if vals else float("nan")
                print("\n== %g min: step %s, %.0f tok/s, val %.3f bits/byte (train loss %s), load %s" % (
                    m, tr["step"], tr.get("tokens_per_s") or 0, bpb, tr.get("loss"), open("/proc/loadavg").read().split()[0]))
                print("sample (temperature 0.6, seed 7): %d words, %.0f%% of them words of the sources; brackets %s" % (
                    nw, 100 * known, "nest" if nests else "do not nest"))
                print("-" * 72 + "\n" + s + "\n" + "-" * 72, flush=True)
                continue
            if el >= a.minutes * 60:
                break
            if el >= next_min * 60:
                mon = Monitor(srv.sock, timeout=600)
                tr = mon.snapshot()["training"]
                mon.close()
                vals = [p[2] for p in tr["history"] if p[2] is not None]
                if vals:
                    print("%2d min: step %s, val %.3f bits/byte" % (next_min, tr["step"], vals[-1] / math.log(2)), flush=True)
                next_min += 1
            time.sleep(1)
        st = lltop_training_state(os.environ["LL_BINARY_DIR"], srv.sock)
        print("lltop --json after %g min: training.state %s" % (a.minutes, st))
        ok &= st == "running"
        ok &= last_known >= a.min_known
        srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("targets %s" % ("met" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
