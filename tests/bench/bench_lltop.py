#!/usr/bin/env python3
# bench_lltop.py - what watching costs: lltop's own CPU at its default interval, and the
# server's monitor cost with 8 lltop clients attached (server CPU with 8 monitors minus
# without, same idle server, same run). CPU = utime + stime from /proc/PID/stat over a window.
#   python3 tests/bench/bench_lltop.py [--seconds 30] [--clients 8]
# Phases: (1) idle llsrv (embedded demo model, no training), no monitor; (2) the same with N
# lltop in tmux panes; (3) one lltop while two clients generate continuously (request rows,
# events); (4) one lltop on a fake server streaming a training run (the loss chart redrawn).
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from llsrv_client import Server  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=30)
ap.add_argument("--clients", type=int, default=8)
a = ap.parse_args()
BIN_DIR = os.environ.get("LL_BINARY_DIR", "build")
LLTOP = os.path.abspath(os.path.join(BIN_DIR, "tui", "lltop"))
TCK = os.sysconf("SC_CLK_TCK")
tmp = tempfile.mkdtemp(prefix="lltop-bench-")
os.chmod(tmp, 0o700)
TMUX = ["tmux", "-S", os.path.join(tmp, "tmux.sock"), "-f", "/dev/null"]
srv = None
fake = None


def cpu(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK  # utime, stime


def measure(pids, seconds):
    t0, c0 = time.time(), [cpu(p) for p in pids]
    time.sleep(seconds)
    t1, c1 = time.time(), [cpu(p) for p in pids]
    return [100.0 * (y - x) / (t1 - t0) for x, y in zip(c0, c1)]


def lltop(name, sock):
    subprocess.run(TMUX + ["new-session", "-d", "-s", name, "-x", "80", "-y", "24",
                           "exec env LANG=C.UTF-8 %s --socket %s" % (LLTOP, sock)], check=True)
    time.sleep(0.5)
    return int(subprocess.run(TMUX + ["display-message", "-p", "-t", name, "#{pane_pid}"], stdout=subprocess.PIPE,
                              text=True).stdout.strip())


try:
    srv = Server(tmp, ["--threads", "1", "--parallel", "4"])
    time.sleep(2)
    base = measure([srv.p.pid], a.seconds)[0]
    pids = [lltop("m%d" % i, srv.sock) for i in range(a.clients)]
    time.sleep(2)
    r = measure([srv.p.pid] + pids, a.seconds)
    print("idle llsrv, no monitor:              server %.2f%% of a core" % base)
    print("idle llsrv, %d lltop attached:        server %.2f%% of a core -> monitor cost %.2f%%" % (a.clients, r[0], r[0] - base))
    print("  each lltop (default interval 1000 ms, idle server): %s %% (mean %.2f%%)"
          % (" ".join("%.2f" % x for x in r[1:]), sum(r[1:]) / len(r[1:])))
    for i in range(1, a.clients):
        subprocess.run(TMUX + ["kill-session", "-t", "m%d" % i])
    stop = threading.Event()

    def load():
        while not stop.is_set():
            c = srv.conn(timeout=120)
            while not stop.is_set():
                c.generate("GEN max_tokens=200 ignore_eos=1 :Once upon a time")
            c.close()

    th = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for t in th:
        t.start()
    time.sleep(2)
    r = measure([pids[0]], a.seconds)
    stop.set()
    print("lltop while 2 clients generate:      %.2f%% of a core" % r[0])
    for t in th:
        t.join(60)
    fs = os.path.join(tmp, "fake.sock")
    fake = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "scripts", "lltop_fake_server.py"), fs,
                             os.path.join(tmp, "rec"), "train"])
    while not os.path.exists(fs):
        time.sleep(0.1)
    p = lltop("train", fs)
    time.sleep(2)
    r = measure([p], a.seconds)
    print("lltop on a training run (chart of 300+ points, 5 snapshots/s): %.2f%% of a core" % r[0])
finally:
    subprocess.run(TMUX + ["kill-server"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if fake:
        fake.kill()
        fake.wait()
    if srv:
        srv.stop(signal.SIGTERM)
    shutil.rmtree(tmp, ignore_errors=True)
