#!/usr/bin/env python3
# bench_http.py - the HTTP API against the line protocol on the same server, same run (issue 31's
# target: with N concurrent streaming clients, HTTP's aggregate tok/s >= 0.95x the line
# protocol's and its time to first token within 2 ms).
#
# Both protocols get the same conditions:
#   - one server, one client: a single-threaded epoll loop over raw sockets (no client library,
#     no Python threads and their GIL handoffs) with the same code for both but the framing;
#   - each stream's connection is opened and proven live before the timed request (line: PING ->
#     PONG; HTTP: GET /health -> 200 on the keep-alive connection the request then uses), so
#     neither protocol's accept is in its figures;
#   - the same prompt text and parameters (greedy, ignore_eos, max_tokens); the bench checks that
#     both report the same prompt and generated token counts;
#   - a run's requests are sent back to back while the server is paused (SIGSTOP, SIGCONT
#     after the last): on a 2-CPU machine the server's threads, woken by the first request,
#     would otherwise preempt this client, and how many requests make the first batch step
#     would depend on that scheduling rather than on the protocol (--no-pause sends without);
#   - TTFT is per stream from its request's send to the first byte of content (line: a TOK line;
#     HTTP: an SSE event with text), and a run's throughput is all streams' generated tokens over
#     the time from the first send to the last stream's final event (line: the END line; HTTP: the
#     chunked stream's last chunk), not to a connection's close;
#   - warm-up runs of both first; then --reps pairs, the order alternating (line-http,
#     http-line, ...) so that neither always follows the other; the figures are the medians over
#     the pairs of each pair's own ratio / difference, with their spread (min..max).
# Beside them, the event loop thread's CPU time per generated token (its run time from /proc
# schedstat, which a loaded machine inflates far less than wall time): what each protocol's
# encoding costs the thread that also admits every request.
# --aa runs line against line the same way: what the ratio and difference look like when the
# protocols are the same, i.e. the noise floor of this machine at its current load.
#   python3 tests/bench/bench_http.py [MODEL] [--streams 8] [--tokens 64] [--reps 5] [--threads 2] [--aa]
# Without MODEL: the embedded demo model (protocol overhead dominates: the harsher case).
import argparse
import json
import os
import platform
import selectors
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
sys.path.insert(0, os.path.dirname(__file__))
from benchlib import load, machine  # noqa: E402
from llsrv_client import Server  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model", nargs="?")
ap.add_argument("--streams", type=int, default=8)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=5, help="pairs of runs (one line, one HTTP each)")
ap.add_argument("--warmup", type=int, default=2, help="untimed pairs first")
ap.add_argument("--verbose", action="store_true", help="print each run")
ap.add_argument("--aa", action="store_true",
                help="control run: the 'http' side of each pair uses the line protocol too, so the ratio and difference show "
                     "the noise this machine adds")
ap.add_argument("--no-pause", dest="pause", action="store_false",
                help="send a run's requests without pausing the server (see run())")
a = ap.parse_args()
tmp = tempfile.mkdtemp(prefix="llsrv-bench-http-")
os.chmod(tmp, 0o700)
srv = Server(tmp, (["--model", a.model] if a.model else []) +
             ["--parallel", str(a.streams), "--ctx", "512", "--threads", str(a.threads)])


def prompt(i):
    return "Stream %d: once upon a time" % i


def http_response_complete(b):
    """A whole HTTP/1.1 response in b (Content-Length or chunked)?"""
    k = b.find(b"\r\n\r\n")
    if k < 0:
        return False
    head = b[:k].lower()
    if b"content-length: " in head:
        return len(b) >= k + 4 + int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
    return b.endswith(b"\r\n0\r\n\r\n")


class Stream:
    """One client stream: a connected socket, its request, and what came back."""

    def __init__(self, proto, i):
        self.proto, self.i = proto, i
        port = srv.port if proto == "line" else srv.http_port
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if proto == "line":
            self.s.sendall(b"PING\n")
            self._read_until(lambda b: b.endswith(b"PONG\n"))
            self.req = b"GEN max_tokens=%d temperature=0 ignore_eos=1 :%s\n" % (a.tokens, prompt(i).encode())
        else:
            self.s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            b = self._read_until(http_response_complete)
            if not b.startswith(b"HTTP/1.1 200"):
                raise RuntimeError("GET /health: %r" % b[:200])
            body = json.dumps({"prompt": prompt(i), "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True,
                               "stream": True, "stream_options": {"include_usage": True}}).encode()
            self.req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body)) + body
        self.s.setblocking(False)
        self.buf = bytearray()
        self.t_send = self.t_first = self.t_end = None

    def _read_until(self, done):
        b = b""
        while not done(b):
            d = self.s.recv(65536)
            if not d:
                raise RuntimeError("%s stream %d: connection closed during set-up" % (self.proto, self.i))
            b += d
        return b

    def send(self):
        self.t_send = time.perf_counter()
        self.s.sendall(self.req)  # small: fits the socket buffer at once

    def on_read(self, t):
        """Reads what is there; True once the final event is in."""
        d = self.s.recv(65536)
        if not d:
            raise RuntimeError("%s stream %d: closed before the end: %r" % (self.proto, self.i, bytes(self.buf[-300:])))
        old = len(self.buf)
        self.buf += d
        if self.t_first is None:
            # the first content: a TOK line / an SSE event with text (searched from a little
            # before the new bytes, so a marker split over two reads is found too)
            mark = b"TOK " if self.proto == "line" else b'"text":"'
            k = self.buf.find(mark, max(0, old - 16))
            if k >= 0 and (self.proto == "line" or self.buf[k + 8:k + 9] != b'"'):
                self.t_first = t
        tail = bytes(self.buf[max(0, old - 300):])
        if self.proto == "line":
            k = tail.rfind(b"END ")
            done = k >= 0 and (k == 0 or tail[k - 1:k] == b"\n") and tail.endswith(b"\n") or tail.startswith(b"ERR")
        else:
            done = tail.endswith(b"\r\n0\r\n\r\n")  # the chunked body's last chunk (after data: [DONE])
        if done:
            self.t_end = t
        return done

    def counts(self):
        """(prompt tokens, generated tokens) as the server reported them."""
        b = bytes(self.buf)
        if self.proto == "line":
            end = b[b.rfind(b"END "):].split(b"\n")[0].decode()
            if not end.startswith("END "):
                raise RuntimeError("line stream %d: %r" % (self.i, b[-300:]))
            kv = dict(p.split("=", 1) for p in end.split(" ")[2:] if "=" in p)
            return int(kv["prompt_tokens"]), int(kv["tokens"])
        u = b.rfind(b'"usage":{')
        if u < 0 or not b.startswith(b"HTTP/1.1 200"):
            raise RuntimeError("http stream %d: %r" % (self.i, b[:300] + b" ... " + b[-300:]))
        usage = json.loads(b[u + 8:b.index(b"}", u) + 1])
        return usage["prompt_tokens"], usage["completion_tokens"]


def loop_cpu():
    """CPU seconds of the server's main thread (the libuv loop: sockets, parsing, encoding):
    schedstat's run time in ns (stat's utime + stime count 10 ms ticks, too coarse here)."""
    with open("/proc/%d/task/%d/schedstat" % (srv.p.pid, srv.p.pid)) as f:
        return int(f.read().split()[0]) / 1e9


def stop_server():
    """SIGSTOP, and wait until the loop thread is stopped."""
    os.kill(srv.p.pid, signal.SIGSTOP)
    for _ in range(10000):
        with open("/proc/%d/task/%d/stat" % (srv.p.pid, srv.p.pid)) as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.0001)
    raise RuntimeError("the server did not stop on SIGSTOP")


def run(proto):
    """One run: N streams at once. Returns a dict of its figures."""
    if a.aa:
        proto = "line"
    ss = [Stream(proto, i) for i in range(a.streams)]
    sel = selectors.DefaultSelector()
    for st in ss:
        sel.register(st.s, selectors.EVENT_READ, st)
    c0 = loop_cpu()
    # The requests go out while the server is paused (see the top; each request's TTFT still
    # counts from its own send, the pause included).
    if a.pause:
        stop_server()
    for st in ss:
        st.send()
    if a.pause:
        os.kill(srv.p.pid, signal.SIGCONT)
    left = len(ss)
    deadline = time.perf_counter() + 600
    while left:
        ev = sel.select(timeout=5)
        t = time.perf_counter()
        if t > deadline:
            raise RuntimeError("%s: no end after 600 s" % proto)
        for key, _ in ev:
            st = key.data
            if st.t_end is None and st.on_read(t):
                sel.unregister(st.s)
                left -= 1
    cpu = loop_cpu() - c0
    sel.close()
    cnt = [st.counts() for st in ss]
    for st in ss:
        st.s.close()
    t0 = min(st.t_send for st in ss)
    t1 = max(st.t_end for st in ss)
    gen = sum(n for _, n in cnt)
    if any(n != a.tokens for _, n in cnt):
        raise RuntimeError("%s: generated %r tokens, asked for %d each" % (proto, [n for _, n in cnt], a.tokens))
    ttft = [(st.t_first - st.t_send) * 1e3 for st in ss]
    return {"tps": gen / (t1 - t0), "ttft": statistics.mean(ttft), "ttft_min": min(ttft), "ttft_max": max(ttft), "prompt": [p for p, _ in cnt],
            "cpu_us_tok": cpu / gen * 1e6}


def fmt_spread(xs, f="%.3f"):
    return (f + " (" + f + ".." + f + ")") % (statistics.median(xs), min(xs), max(xs))


cpu_name, isa = machine()
load0 = load()
t_begin = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
for k in range(a.warmup):
    for p in ("line", "http"):
        r = run(p)
res = {"line": [], "http": []}
for k in range(a.reps):
    order = ("line", "http") if k % 2 == 0 else ("http", "line")
    for p in order:
        res[p].append(run(p))
        if a.verbose:
            x = res[p][-1]
            print("rep %d %-4s %8.1f tok/s  TTFT mean %.2f ms (streams %.2f..%.2f)  loop %.1f us/token  load %s" %
                  (k, p, x["tps"], x["ttft"], x["ttft_min"], x["ttft_max"], x["cpu_us_tok"], load()), flush=True)
load1 = load()
srv.stop()
shutil.rmtree(tmp, ignore_errors=True)
if res["line"][0]["prompt"] != res["http"][0]["prompt"]:
    raise RuntimeError("prompt tokens differ: line %r, http %r" % (res["line"][0]["prompt"], res["http"][0]["prompt"]))

ratio = [h["tps"] / l["tps"] for l, h in zip(res["line"], res["http"])]
dttft = [h["ttft"] - l["ttft"] for l, h in zip(res["line"], res["http"])]
print("machine: %s, %s, %d CPUs, %s; %s" % (cpu_name, isa, os.cpu_count(), platform.release(), t_begin))
print("model: %s; %d streams x %d tokens (prompt %d tokens each), --threads %d; %d warm-up + %d timed pairs, order alternating; "
      "requests sent %s" % (a.model or "embedded demo", a.streams, a.tokens, res["line"][0]["prompt"][0], a.threads, a.warmup, a.reps,
                            "while the server is paused" if a.pause else "to a running server (--no-pause)"))
print("load average (1/5/15 min): %s before, %s after" % (load0, load1))
if a.aa:
    print("CONTROL RUN (--aa): the 'http' side below is the line protocol again; its ratio and difference are this machine's noise")
print()
print("| protocol | aggregate tok/s: median (min..max) | mean TTFT ms: median (min..max) | loop thread CPU us/token (median) |")
print("|---|---:|---:|---:|")
for p in ("line", "http"):
    print("| %s | %s | %s | %.1f |" % (p, fmt_spread([x["tps"] for x in res[p]], "%.1f"), fmt_spread([x["ttft"] for x in res[p]], "%.2f"),
                                     statistics.median(x["cpu_us_tok"] for x in res[p])))
print("the streams' first tokens within a run: max - min, median over the runs: line %.2f ms, http %.2f ms (a run whose streams did not all "
      "start in the same batch step shows as a whole prefill step here)" %
      tuple(statistics.median(x["ttft_max"] - x["ttft_min"] for x in res[p]) for p in ("line", "http")))
print()
verdict = (lambda ok: "control run, no verdict") if a.aa else (lambda ok: "met" if ok else "NOT met")
print("http/line throughput, per pair: median %s; target >= 0.95: %s" % (fmt_spread(ratio), verdict(statistics.median(ratio) >= 0.95)))
print("TTFT http - line, per pair, ms: median %s; target <= +2 ms: %s" % (fmt_spread(dttft, "%+.2f"), verdict(statistics.median(dttft) <= 2.0)))
