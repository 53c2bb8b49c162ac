#!/usr/bin/env python3
"""Two llsrv replicas behind HAProxy with configs/haproxy.cfg (issue 33): clients see one service.

- HAProxy starts from the committed config (addresses from the environment, as the file says) and
  its health checks (PING on the line protocol, GET /health on HTTP) mark both replicas UP.
- Line protocol (TCP mode): sessions through the front port are spread over both replicas (INFO's
  path tells them apart: each replica serves its own copy of the demo model) and answer GEN.
- HTTP (HTTP mode): /v1/completions through the front port, requests spread over both replicas.
- A replica killed (SIGKILL) while sessions stream on both: every session on the other replica
  finishes with END and the same text a lone request gets; only sessions on the killed one end
  early. HAProxy marks it DOWN, and every later request (line and HTTP) is answered by the other.
- The replica restarted on its address comes back UP and takes sessions again.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llsrv_client import BIN, Conn, Server, parse_line, wait_until, _die_with_parent  # noqa: E402

SRC = os.environ.get("LL_SOURCE_DIR", ".")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def haproxy_stat(sock):
    """{(backend, server): status} from HAProxy's stats socket."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"show stat\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    out = {}
    for line in data.decode().splitlines():
        f = line.split(",")
        if len(f) > 17 and not line.startswith("#"):
            out[(f[0], f[1])] = f[17]
    return out


def replica_of(port):
    """A session through the front port: which replica answered (INFO path) and the connection."""
    c = Conn(port, timeout=120)
    kind, _, kv, _ = parse_line(c.request("INFO"))
    return os.path.basename(kv.get("path", "?")), c


def http_completion(port, prompt, n):
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = h.getresponse()
    body = r.read()
    h.close()
    return r.status, body


def main():
    if not shutil.which("haproxy"):
        print("FAIL haproxy is not installed (setup.sh installs it)")
        return 1
    tmp = tempfile.mkdtemp(prefix="llsrv-replicas-")
    hp = None
    try:
        model = os.path.join(tmp, "demo.ckpt")
        r = subprocess.run([BIN, "init", "--preset", "tiny", "-o", model], capture_output=True, text=True)
        check(r.returncode == 0, "llsrv init: " + r.stdout + r.stderr)
        for n in ("a", "b"):
            shutil.copy(model, os.path.join(tmp, n + ".ckpt"))
        ports = {n: (free_port(), free_port()) for n in ("a", "b")}

        def start(n):
            tcp, web = ports[n]
            return Server(tmp, ["--model", os.path.join(tmp, n + ".ckpt"), "--parallel", "2", "--listen", "127.0.0.1:%d" % tcp,
                                "--http", "127.0.0.1:%d" % web], name=n)

        reps = {n: start(n) for n in ("a", "b")}
        check(all(reps[n].port == ports[n][0] for n in reps), "replicas listen on their addresses")
        front_tcp, front_http = free_port(), free_port()
        stats_sock = os.path.join(tmp, "haproxy.sock")
        env = dict(os.environ, LL_TCP_BIND="127.0.0.1:%d" % front_tcp, LL_HTTP_BIND="127.0.0.1:%d" % front_http,
                   LL_A_TCP="127.0.0.1:%d" % ports["a"][0], LL_B_TCP="127.0.0.1:%d" % ports["b"][0],
                   LL_A_HTTP="127.0.0.1:%d" % ports["a"][1], LL_B_HTTP="127.0.0.1:%d" % ports["b"][1], LL_HAPROXY_STATS=stats_sock)
        cfg = os.path.join(SRC, "configs", "haproxy.cfg")
        r = subprocess.run(["haproxy", "-c", "-f", cfg], env=env, capture_output=True, text=True)
        check(r.returncode == 0, "haproxy -c accepts configs/haproxy.cfg: " + r.stdout + r.stderr)
        hlog = open(os.path.join(tmp, "haproxy.log"), "w+")
        hp = subprocess.Popen(["haproxy", "-db", "-f", cfg], env=env, stdout=hlog, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

        def all_up(want):
            try:
                st = haproxy_stat(stats_sock)
            except OSError:
                return False
            got = {k: v for k, v in st.items() if k[1] in ("a", "b")}
            return got if got and all(v.startswith(want.get(k[1], "UP")) for k, v in got.items()) and len(got) == 4 else False

        st = wait_until(lambda: all_up({}), "both replicas UP in both backends", 60)
        check(bool(st), "health checks mark both replicas UP (line and HTTP backends): %s" % (st or haproxy_stat(stats_sock)))

        # ---- line protocol through the front port
        seen = {}
        lone = None
        for i in range(8):
            who, c = replica_of(front_tcp)
            text, end, _ = c.generate("GEN id=g%d max_tokens=24 temperature=0 :The replicas" % i)
            c.close()
            seen[who] = seen.get(who, 0) + 1
            check(lone is None or text == lone, "session %d on %s: the same greedy text as the others" % (i, who))
            lone = lone if lone is not None else text
        check(set(seen) == {"a.ckpt", "b.ckpt"}, "line sessions spread over both replicas: %s" % seen)

        # ---- HTTP through the front port
        before = {n: reps[n].stats().get("requests_total", "0") for n in reps}
        codes = [http_completion(front_http, "The replicas", 8)[0] for _ in range(6)]
        after = {n: reps[n].stats().get("requests_total", "0") for n in reps}
        check(codes == [200] * 6, "HTTP completions through the front: %s" % codes)
        check(all(int(after[n]) > int(before[n]) for n in reps), "HTTP requests reached both replicas: %s -> %s" % (before, after))

        # ---- kill a replica while sessions stream on both
        results = {}

        def session(i):
            who, c = replica_of(front_tcp)
            results[i] = [who, None, None]
            try:
                text, end, _ = c.generate("GEN id=k%d max_tokens=400 ignore_eos=1 temperature=0 :The replicas" % i)
                results[i][1:] = [text, end]
            except (EOFError, OSError) as ex:
                results[i][1] = ex
            c.close()

        ths = [threading.Thread(target=session, args=(i,)) for i in range(6)]
        for t in ths:
            t.start()
        # Every session has reached its replica (INFO answered) and both replicas are generating.
        busy = wait_until(lambda: len(results) == 6 and all(int(reps[n].stats().get("inflight", "0")) > 0 for n in reps), "both replicas busy",
                          60, 0.01)
        check(bool(busy), "sessions in flight on both replicas")
        reps["a"].p.send_signal(signal.SIGKILL)
        reps["a"].p.wait()
        for t in ths:
            t.join(300)
        on_b = [r for r in results.values() if r[0] == "b.ckpt"]
        on_a = [r for r in results.values() if r[0] == "a.ckpt"]
        check(len(results) == 6 and on_a and on_b, "sessions on both: %d on a, %d on b" % (len(on_a), len(on_b)))
        check(all(isinstance(r[1], bytes) and r[2] and r[2].get("reason") == "length" for r in on_b),
              "every session on the surviving replica finished (END reason=length): %s" % [(r[2] or {}).get("reason") if r[2] else repr(r[1])[:300] for r in on_b])
        ref = on_b[0][1] if on_b else None
        check(all(r[1] == ref for r in on_b), "... with the same text")
        check(all(not isinstance(r[1], bytes) for r in on_a), "the sessions on the killed replica ended early: %s" % [type(r[1]).__name__ for r in on_a])
        down = wait_until(lambda: all_up({"a": "DOWN"}), "replica a DOWN", 30)
        check(bool(down), "HAProxy marks the killed replica DOWN: %s" % haproxy_stat(stats_sock))
        whos = []
        for i in range(6):
            who, c = replica_of(front_tcp)
            text, end, _ = c.generate("GEN id=p%d max_tokens=24 temperature=0 :The replicas" % i)
            c.close()
            whos.append(who)
            check(text == lone, "after the kill, session %d answered (%s)" % (i, who))
        check(set(whos) == {"b.ckpt"}, "... all by the other replica: %s" % whos)
        codes = [http_completion(front_http, "The replicas", 8)[0] for _ in range(4)]
        check(codes == [200] * 4, "after the kill, HTTP completions through the front: %s" % codes)

        # ---- the replica comes back
        reps["a"] = start("a")
        up = wait_until(lambda: all_up({}), "replica a UP again", 60)
        check(bool(up), "the restarted replica is UP again: %s" % haproxy_stat(stats_sock))
        whos = set()
        for i in range(8):
            who, c = replica_of(front_tcp)
            c.close()
            whos.add(who)
        check(whos == {"a.ckpt", "b.ckpt"}, "sessions reach both replicas again: %s" % whos)
    finally:
        if hp and hp.poll() is None:
            hp.terminate()
            hp.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print("replicas: %d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
