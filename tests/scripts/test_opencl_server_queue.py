#!/usr/bin/env python3
# test_opencl_server_queue.py - the server on the OpenCL device (PoCL, or $LL_TEST_OPENCL_DEVICE)
# with decode steps queued one behind the other (LL_OPENCL_QUEUE_AHEAD=1, the default on GPUs) against the same server stepping
# one at a time (LL_OPENCL_QUEUE_AHEAD=0), SmolLM2: two seeded top-k requests sharing the batch
# give the same texts; a greedy request ending on a stop string ends on the same text (the step
# queued past the stop is dropped with the sequence); a greedy request after them, on sequences
# freed with a step queued past their end, gives the same text as on a fresh server; the
# queued server's log counts the steps it queued behind the one before (its scheduler did).
import os
import re
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import BIN, Checker, Server, escape  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
    ["bash", os.path.join(os.environ["LL_SOURCE_DIR"], "tests", "fetch-smollm2.sh")], capture_output=True, text=True,
    check=True).stdout.strip()
check = Checker()
DEV = os.environ.get("LL_TEST_OPENCL_DEVICE") or "opencl:0:0"
# A cold PoCL cache (new kernels) builds the program for minutes: once here, with no time limit
# but the test's, so that the servers start within the client's 120 s.
subprocess.run([BIN, "generate", "--model", model, "-n", "1", "--device", DEV],
               capture_output=True, check=False)


def run(qa):
    tmp = tempfile.mkdtemp(prefix="llsrv-q-")
    os.chmod(tmp, 0o700)
    srv = Server(tmp, ["--model", model, "--parallel", "2", "--ctx", "256", "--threads", "2", "--device", DEV],
                 env={"LL_OPENCL_QUEUE_AHEAD": qa}, name="q" + qa)
    out = {}

    def one(key, line):
        c = srv.conn()
        t, e, _ = c.generate(line)
        c.close()
        out[key] = (t, e.get("reason"))

    ths = [threading.Thread(target=one, args=(k, "GEN max_tokens=8 temperature=0.8 seed=%d :%s" % (sd, escape(p))))
           for k, sd, p in (("a", 5, "Once upon a time"), ("b", 9, "The capital of France is"))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    # greedy: " to start with the basics.\n\n..." - the stop ends it after "the"
    one("stop", "GEN max_tokens=16 temperature=0 stop=basics :%s" % escape("The best way to learn C is"))
    one("after", "GEN max_tokens=8 temperature=0 :%s" % escape("Once upon a time"))
    srv.stop()  # the scheduler logs its queued steps as it stops
    log = open(srv.log.name).read()
    return out, log


q, qlog = run("1")
s, slog = run("0")
print("queued:       ", q)
print("one at a time:", s)
check("opencl" in qlog and "opencl" in slog, "not served on OpenCL:\n" + qlog[-2000:])
for k in ("a", "b", "stop", "after"):
    check(q.get(k) is not None and q.get(k) == s.get(k), "%s: queued %r, one at a time %r" % (k, q.get(k), s.get(k)))
m = re.search(r"scheduler: (\d+) decode steps queued behind", qlog)
print("queued server:", m.group(0) if m else "no queue line")
# 8 + 8 + 16 + 8 tokens: most steps queue behind the one before (a change of batch queues from the host's ids)
check(m is not None and int(m.group(1)) >= 16, "the queued server did not queue steps behind each other:\n" + qlog[-2000:])
check("queued behind" not in slog, "LL_OPENCL_QUEUE_AHEAD=0 still queued ahead")
check(q.get("a") != q.get("b"), "the two seeded requests gave the same text (rows swapped unnoticed)")
check(q.get("stop") == (b" to start with the ", "stop"), "the stop request did not end before its stop string: %r" % (q.get("stop"),))
sys.exit(check.summary())
