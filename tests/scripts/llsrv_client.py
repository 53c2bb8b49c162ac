# llsrv_client.py - a small client for llsrv's line protocol (man 7 llsrv-protocol), used by
# the server tests and the serving benchmark. Standard library only.
import atexit
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

BIN = os.path.join(os.environ.get("LL_BINARY_DIR", "build"), "server", "llsrv")


def unescape(s):
    out = bytearray()
    i = 0
    b = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s
    while i < len(b):
        c = b[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        e = b[i + 1:i + 2]
        if e == b"n":
            out += b"\n"
        elif e == b"t":
            out += b"\t"
        elif e == b"r":
            out += b"\r"
        elif e == b"\\":
            out += b"\\"
        elif e == b"x":
            out.append(int(b[i + 2:i + 4], 16))
            i += 2
        else:
            raise ValueError("bad escape in server output: %r" % b[i:i + 2])
        i += 2
    return bytes(out)


def escape(data):
    if isinstance(data, str):
        data = data.encode()
    out = []
    for c in data:
        if c == 0x5C:
            out.append("\\\\")
        elif c == 10:
            out.append("\\n")
        elif c == 9:
            out.append("\\t")
        elif c == 13:
            out.append("\\r")
        elif c < 0x20 or c >= 0x7F:
            out.append("\\x%02X" % c)
        else:
            out.append(chr(c))
    return "".join(out)


def parse_line(line):
    """'KIND id k=v ... :text' -> (kind, id, {k: v}, text-bytes or None)."""
    text = None
    head = line
    m = line.find(" :")
    if m >= 0:
        head, text = line[:m], unescape(line[m + 2:])
    parts = head.split(" ")
    kind = parts[0]
    rid = parts[1] if len(parts) > 1 else None
    kv = {}
    for p in parts[2:]:
        if "=" in p:
            k, v = p.split("=", 1)
            kv[k] = v
        elif p:
            kv[p] = True
    return kind, rid, kv, text


class Conn:
    def __init__(self, port, host="127.0.0.1", timeout=60, rcvbuf=None):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(timeout)
        self.s.connect((host, port))
        self.buf = b""

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.s.sendall(data)

    def line(self):
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                if self.buf:
                    l, self.buf = self.buf, b""
                    return l.decode()
                return None
            self.buf += d
        l, self.buf = self.buf.split(b"\n", 1)
        return l.decode("utf-8")  # the server only sends valid UTF-8: a decode error fails the test

    def request(self, line):
        self.send(line + "\n")
        return self.line()

    def generate(self, line):
        """Send a GEN/CHAT line; collect (text bytes, END kv, all lines)."""
        self.send(line + "\n")
        return self.collect()

    def collect(self, rid=None):
        text = b""
        lines = []
        while True:
            l = self.line()
            if l is None:
                raise EOFError("connection closed before END; got %r" % lines[-3:])
            lines.append(l)
            kind, lid, kv, t = parse_line(l)
            if rid is not None and lid != rid:
                continue
            if kind == "TOK":
                text += t
            elif kind == "END":
                return text, kv, lines
            elif kind == "ERR":
                return None, {"err": kv, "line": l}, lines

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


_servers = []


def _stop_all():
    """Every server a test started is stopped on every exit path: a failed check, an uncaught
    exception (atexit), or the test process being killed (PR_SET_PDEATHSIG in the child)."""
    for p in _servers:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


atexit.register(_stop_all)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # ctest's timeout sends SIGTERM first
    signal.signal(_sig, lambda signo, frame: sys.exit(128 + signo))


def _die_with_parent():
    # Runs in the child between fork and exec: SIGKILL it when the test process dies, even by
    # SIGKILL (no atexit then), so no llsrv outlives its test.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def ensure_venv(pkgs, modules):
    """Re-runs the calling script under the test venv's python (LL_BINARY_DIR/pyvenv), making
    the venv with pkgs first when it cannot import `modules` (under a lock: two suites may
    share a build directory). Test-only Python packages live there, never in the system."""
    build = os.path.abspath(os.environ.get("LL_BINARY_DIR", "build"))
    venv = os.path.join(build, "pyvenv")
    vpy = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    import fcntl
    os.makedirs(build, exist_ok=True)
    with open(os.path.join(build, "pyvenv.lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        probe = [vpy, "-c", "import " + ", ".join(modules)]
        if not (os.path.exists(vpy) and subprocess.run(probe, capture_output=True).returncode == 0):
            print("-- making the test venv %s (%s)" % (venv, ", ".join(pkgs)), flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
            r = subprocess.run([vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + pkgs)
            if r.returncode != 0 or subprocess.run(probe).returncode != 0:
                print("FAILED: cannot install %s into %s (pip needs PyPI)" % (pkgs, venv), flush=True)
                sys.exit(1)
    os.execv(vpy, [vpy, "-u"] + sys.argv)


def wait_until(cond, what, timeout=60.0, step=0.05):
    """Polls cond() until it returns a true value or `timeout` seconds pass; returns the last
    value. Tests wait for events this way, with bounds far above the work's duration."""
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v or time.time() >= deadline:
            if not v:
                print("wait_until: %s not reached in %.0f s" % (what, timeout), file=sys.stderr, flush=True)
            return v
        time.sleep(step)


class Server:
    """llsrv on an ephemeral port with a private monitor socket and state dir."""

    def __init__(self, tmp, args, env=None, name="srv"):
        self.tmp = tmp
        self.sock = os.path.join(tmp, name + "-run", "llsrv.sock")
        self.log = open(os.path.join(tmp, name + ".log"), "w+")
        # The HTTP API on a free port too (its default, 8480, may be taken by a neighbour).
        cmd = [BIN, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--socket", self.sock, "--state-dir",
               os.path.join(tmp, "state")] + args
        e = dict(os.environ)
        # Under ASan, freed memory sits in a quarantine (256 MiB by default) and would read as
        # growth in the memory checks; a small one keeps them meaningful (no effect otherwise).
        e["ASAN_OPTIONS"] = e.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8"
        e.update(env or {})
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=e, preexec_fn=_die_with_parent)
        _servers.append(self.p)
        self.port = None
        self.http_port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            txt = open(self.log.name).read()
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", txt)
            if m:
                self.port = int(m.group(1))
                h = re.search(r"http +http://127\.0\.0\.1:(\d+)/v1", txt)
                self.http_port = int(h.group(1)) if h else None
                break
            if self.p.poll() is not None:
                raise RuntimeError("llsrv exited %d:\n%s" % (self.p.returncode, txt))
            time.sleep(0.05)
        if not self.port:
            raise RuntimeError("llsrv did not start:\n" + open(self.log.name).read())

    def conn(self, **kw):
        return Conn(self.port, **kw)

    def output(self):
        return open(self.log.name).read()

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None

    def stats(self):
        """STATS as a dict of strings (a fresh connection each time)."""
        c = self.conn(timeout=30)
        try:
            return parse_line(c.request("STATS"))[2]
        finally:
            c.close()

    def wait_idle(self, timeout=120.0):
        """Waits until no request is in flight (active, queued or with its END on the way)."""
        return wait_until(lambda: self.stats().get("inflight") == "0", "server idle", timeout)

    def nfds(self):
        return len(os.listdir("/proc/%d/fd" % self.p.pid))

    def rss(self):
        with open("/proc/%d/statm" % self.p.pid) as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Monitor:
    """A client of the monitor socket (man 7 llsrv-protocol): JSON lines of snapshots, events
    and replies. Events are kept as they arrive, so a wait sees one that came while the test
    was reading snapshots."""

    def __init__(self, path, timeout=60):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.s.settimeout(timeout)
        self.f = self.s.makefile()
        self.events = []

    def msg(self):
        line = self.f.readline()
        if not line:
            raise RuntimeError("monitor closed")
        j = json.loads(line)
        if j.get("type") == "event":
            self.events.append(j)
        return j

    def snapshot(self):
        while True:
            j = self.msg()
            if j.get("type") == "snapshot":
                return j

    def cmd(self, c):
        self.s.sendall((c + "\n").encode())
        while True:
            j = self.msg()
            if j.get("type") == "reply":
                return j

    def wait_event(self, which, timeout=120):
        """The first kept or coming event named `which` (or for which `which(event)` is true),
        removed from the kept ones; None after `timeout` seconds."""
        pred = which if callable(which) else (lambda e: e.get("event") == which)
        t0 = time.time()
        while time.time() - t0 < timeout:
            for e in self.events:
                if pred(e):
                    self.events.remove(e)
                    return e
            self.msg()
        return None

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def concurrent_generate(srv, lines, timeout=600):
    """Each request line on its own connection, all at once (one thread each).
    Returns ({index: (text, END kv)}, [errors])."""
    import threading
    results, errors = {}, []

    def one(i):
        try:
            c = srv.conn(timeout=timeout)
            t, e, _ = c.generate(lines[i])
            c.close()
            results[i] = (t, e)
        except Exception as ex:  # noqa: BLE001
            errors.append(repr(ex))

    ths = [threading.Thread(target=one, args=(i,)) for i in range(len(lines))]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return results, errors


class Checker:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("CHECK failed: " + what, file=sys.stderr, flush=True)
        return cond

    def summary(self):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


def lora_ids_vs_llamacpp(check, model, adapter, ref_name):
    """`llsrv generate --adapter ADAPTER --ids` (64 greedy ids, 2 threads) on each prompt of
    tests/ref/smollm2_prompts.txt that tests/ref/REF_NAME lists, against llama.cpp --lora's ids
    there. Checks all 64 equal per prompt; returns how many of llama.cpp's ids differ from its
    base-model ids (tests/ref/smollm2_greedy64.tsv), per prompt: > 0 shows the adapter matters."""
    ref_dir = os.path.join(os.environ["LL_SOURCE_DIR"], "tests", "ref")
    rows = lambda name: [l.rstrip("\n").split("\t") for l in open(os.path.join(ref_dir, name))][1:]  # noqa: E731
    prompts = [l.rstrip("\n").encode().decode("unicode_escape") for l in open(os.path.join(ref_dir, "smollm2_prompts.txt"))]
    base = {r[1]: r[3].split() for r in rows("smollm2_greedy64.tsv") if r[0] == "fa_off_f16kv"}
    changed = []
    for r in rows(ref_name):
        i = int(r[0])
        out = subprocess.run([BIN, "generate", "--model", model, "-p", prompts[i], "--temp", "0", "-n", "64", "--ids", "--ignore-eos", "-t", "2",
                              "--adapter", adapter], capture_output=True, text=True, timeout=600).stdout.split()
        want = r[2].split()
        n = 0
        while n < min(len(out), len(want)) and out[n] == want[n]:
            n += 1
        changed.append(sum(1 for a, b in zip(want, base[r[0]]) if a != b))
        print("prompt %d: %d/64 greedy ids equal llama.cpp --lora's (the adapter changes %d of 64 vs the base)" % (i, n, changed[-1]), flush=True)
        check(n == 64, "prompt %d: only %d of 64 ids equal llama.cpp's" % (i, n))
    return changed
