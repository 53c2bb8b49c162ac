#!/usr/bin/env python3
# bench_http.py - the HTTP API against the line protocol on the same server, same run: N
# concurrent greedy streams (HTTP: /v1/completions with stream=true, read as SSE on raw
# sockets; line: GEN), aggregate generated tok/s and the mean time to first token. The runs
# alternate (line, http, line, http, ...) and the best of --reps is kept for each. Beside them,
# the event loop thread's CPU time per generated token (its run time from /proc schedstat, which a
# loaded machine does not inflate the way it does wall time): what each protocol's encoding
# costs the thread that also admits every request.
#   python3 tests/bench/bench_http.py [MODEL] [--streams 8] [--tokens 64] [--threads 2]
# Without MODEL: the embedded demo model (protocol overhead dominates: the harsher case).
import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from llsrv_client import Server  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model", nargs="?")
ap.add_argument("--streams", type=int, default=8)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
tmp = tempfile.mkdtemp(prefix="llsrv-bench-http-")
os.chmod(tmp, 0o700)
srv = Server(tmp, (["--model", a.model] if a.model else []) + ["--parallel", str(a.streams), "--ctx", "512", "--threads",
                                                                 str(a.threads)])


def line_stream(i):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=600)
    t0 = time.perf_counter()
    s.sendall(b"GEN max_tokens=%d temperature=0 ignore_eos=1 :Stream %d: once upon a time\n" % (a.tokens, i))
    buf, first, n = b"", None, 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        if first is None and b"TOK " in d:
            first = time.perf_counter() - t0
        buf += d
        if b"\nEND " in b"\n" + buf or buf.startswith(b"ERR"):
            if b"\n" in buf[buf.rfind(b"END "):]:
                break
    s.close()
    end = buf[buf.rfind(b"END "):]
    n = int(end.split(b" tokens=")[1].split(b" ")[0])
    return n, first


def http_stream(i):
    body = json.dumps({"prompt": "Stream %d: once upon a time" % i, "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=600)
    t0 = time.perf_counter()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % len(body) + body)
    buf, first = b"", None
    while True:
        d = s.recv(65536)
        if not d:
            break
        if first is None and b"data: {" in d:
            first = time.perf_counter() - t0
        buf += d
    s.close()
    u = buf.rfind(b'"usage":{')
    n = json.loads(buf[u + 8:buf.index(b"}", u) + 1])["completion_tokens"]
    return n, first


TICK = os.sysconf("SC_CLK_TCK")


def loop_cpu():
    """CPU seconds of the server's main thread (the libuv loop: sockets, parsing, encoding):
    schedstat's run time in ns (stat's utime + stime count 10 ms ticks, too coarse here)."""
    try:
        with open("/proc/%d/task/%d/schedstat" % (srv.p.pid, srv.p.pid)) as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        with open("/proc/%d/task/%d/stat" % (srv.p.pid, srv.p.pid)) as f:
            st = f.read().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) / TICK


def run(fn):
    res = []
    ths = [threading.Thread(target=lambda i=i: res.append(fn(i))) for i in range(a.streams)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    dt = time.perf_counter() - t0
    return sum(n for n, _ in res) / dt, sum(f for _, f in res) / len(res) * 1e3, sum(n for n, _ in res)


run(line_stream), run(http_stream)  # warm-up
best = {"line": (0, 1e9), "http": (0, 1e9)}
cpu = {"line": [0.0, 0], "http": [0.0, 0]}  # loop CPU seconds, tokens
with open("/proc/loadavg") as f:
    load0 = f.read().split()[:3]
for _ in range(a.reps):
    for name, fn in (("line", line_stream), ("http", http_stream)):
        c0 = loop_cpu()
        tps, ttft, n = run(fn)
        cpu[name][0] += loop_cpu() - c0
        cpu[name][1] += n
        best[name] = (max(best[name][0], tps), min(best[name][1], ttft))
srv.stop()
with open("/proc/loadavg") as f:
    load1 = f.read().split()[:3]
print("| protocol | %d streams x %d tokens: aggregate tok/s | mean TTFT ms | loop thread CPU us/token |" % (a.streams, a.tokens))
print("|---------|------:|------:|------:|")
for name in ("line", "http"):
    print("| %s | %.1f | %.2f | %.1f |" % (name, best[name][0], best[name][1], cpu[name][0] / max(cpu[name][1], 1) * 1e6))
print("http/line throughput %.3f, TTFT difference %+.2f ms; load average %s before, %s after" %
      (best["http"][0] / best["line"][0], best["http"][1] - best["line"][1], "/".join(load0), "/".join(load1)))
