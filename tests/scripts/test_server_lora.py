#!/usr/bin/env python3
# test_server_lora.py - LoRA adapters behind the server (stories260K, ids as prompts): adapters
# loaded at start by file stem (`--adapter a.gguf,b.gguf,...`), the first one the default;
# GEN adapter=none|NAME gives `llsrv generate --adapter` 's greedy ids; requests with different
# adapters at once each get their own output; a corrupt (NaN), mismatched (another model's
# shapes), truncated or missing adapter is reported at start and left out, and requests naming
# it, or an unknown name, or `live` without training, end with ERR bad_adapter while the server
# keeps serving; the monitor shows each request's adapter.
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import BIN, Checker, Server  # noqa: E402

check = Checker()
model = os.path.join(os.environ.get("LL_SHARED_DIR", ""), "testdata", "models", "stories260K.bin")
if not os.path.exists(model):
    print("stories260K.bin absent (../shared/testdata): nothing to test the adapters on")
    sys.exit(check.summary())
maker = os.path.join(os.environ["LL_BINARY_DIR"], "tests", "test_lora")
tmp = tempfile.mkdtemp(prefix="llsrv-lora-")
os.chmod(tmp, 0o700)


def make(name, amp, seed=5, rank=4):
    p = os.path.join(tmp, name)
    subprocess.run([maker, "--make-adapter", model, p, str(rank), "8", str(seed), amp], check=True)
    return p


good, other, bad = make("good.gguf", "0.3"), make("other.gguf", "0.3", seed=9, rank=2), make("bad.gguf", "nan")
trunc = os.path.join(tmp, "trunc.gguf")
with open(good, "rb") as f, open(trunc, "wb") as g:
    g.write(f.read()[:3000])
prompt = "400 261"


def gen_ids(adapter=None, n=16):
    cmd = [BIN, "generate", "--model", model, "-p", prompt, "--temp", "0", "-n", str(n), "-t", "1", "--ctx", "256"]
    if adapter:
        cmd += ["--adapter", adapter]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.stdout.split()


want = {"none": gen_ids(), "good": gen_ids(good), "other": gen_ids(other)}
check(want["good"] != want["none"] and want["other"] != want["good"], "the adapters change the greedy ids: %r" % want)

srv = Server(tmp, ["--model", model, "--parallel", "4", "--ctx", "256", "--threads", "1",
                   "--adapter", ",".join([good, bad, trunc, other, os.path.join(tmp, "missing.gguf")])])
log = srv.output()
check("adapter 'good'" in log and "default for requests that name none" in log, "good loaded as the default")
check("bad.gguf" in log and "NaN" in log, "the NaN adapter is reported at start")
check("trunc.gguf" in log and "serving without it" in log, "the truncated adapter is reported at start")
check("missing.gguf" in log, "the missing adapter is reported")


def run(line):
    c = srv.conn()
    t, e, lines = c.generate(line)
    c.close()
    return (t.decode().split() if t is not None else None), e


for name, line in [("good", "GEN max_tokens=16 temperature=0 :" + prompt),
                   ("good", "GEN max_tokens=16 temperature=0 adapter=good :" + prompt),
                   ("none", "GEN max_tokens=16 temperature=0 adapter=none :" + prompt),
                   ("other", "GEN max_tokens=16 temperature=0 adapter=other :" + prompt)]:
    ids, e = run(line)
    check(ids == want[name], "%s: server %r, generate --adapter %r" % (line, ids, want[name]))

# Four at once, three adapters and none, in one batch: each gets its own ids.
res = {}


def one(i, name):
    res[i] = (name, run("GEN id=r%d max_tokens=16 temperature=0 adapter=%s :%s" % (i, name, prompt))[0])


ths = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(["good", "none", "other", "good", "none", "other", "other"])]
[t.start() for t in ths]
[t.join() for t in ths]
check(all(ids == want[n] for n, ids in res.values()), "concurrent requests with different adapters: %r" % res)

for name, what in [("bad", "unknown adapter 'bad'"), ("trunc", "unknown adapter 'trunc'"), ("nope", "unknown adapter 'nope'"),
                   ("live", "no live adapter")]:
    ids, e = run("GEN max_tokens=4 adapter=%s :%s" % (name, prompt))
    check(ids is None and "bad_adapter" in e.get("line", "") and what in e.get("line", ""), "adapter=%s: %r" % (name, e))
c = srv.conn()
r = c.request("GEN adapter=../x :1")
check(r.startswith("ERR") and "bad_param" in r and "adapter" in r, "adapter=../x: %r" % r)
check(c.request("PING").startswith("PONG"), "still serving after the bad adapters")
c.close()

# Monitor: requests[].adapter while one runs.
c = srv.conn()
c.send("GEN id=slow max_tokens=200 ignore_eos=1 adapter=other :%s\n" % prompt)
m = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
m.settimeout(60)
m.connect(srv.sock)
buf, seen = b"", None
while seen is None:
    d = m.recv(65536)
    if not d:
        break
    buf += d
    while b"\n" in buf:
        l, buf = buf.split(b"\n", 1)
        try:
            o = json.loads(l)
        except ValueError:
            continue
        for r in (o.get("serving") or {}).get("requests") or []:
            if r.get("id") == "slow":
                seen = r.get("adapter")
        if o.get("type") == "event" and o.get("event") == "request_finished" and seen is None:
            seen = "finished before a snapshot"
m.close()
c.collect("slow")
c.close()
print("monitor: adapter of the running request: %r" % seen)
check(seen in ("other", "finished before a snapshot"), "monitor shows the request's adapter: %r" % seen)
check(srv.stop() == 0, "SIGTERM exits 0")

# Two adapters with the same file stem (a/dup.gguf, b/dup.gguf): the second is served as dup-2,
# the log says so, and each name gives its own adapter's ids.
os.makedirs(os.path.join(tmp, "a"))
os.makedirs(os.path.join(tmp, "b"))
shutil.copy(good, os.path.join(tmp, "a", "dup.gguf"))
shutil.copy(other, os.path.join(tmp, "b", "dup.gguf"))
srv = Server(tmp, ["--model", model, "--parallel", "2", "--ctx", "256", "--threads", "1",
                   "--adapter", os.path.join(tmp, "a", "dup.gguf") + "," + os.path.join(tmp, "b", "dup.gguf")], name="dup")
log = srv.output()
check("name 'dup' is already taken by " + os.path.join(tmp, "a", "dup.gguf") in log and "as 'dup-2'" in log,
      "the second dup is renamed dup-2 and the log says so: %r" % log[-600:])
for name, ref in (("dup", "good"), ("dup-2", "other")):
    ids, e = run("GEN max_tokens=16 temperature=0 adapter=%s :%s" % (name, prompt))
    check(ids == want[ref], "adapter=%s gives %s's ids: %r (want %r)" % (name, ref, ids, want[ref]))
check(srv.stop() == 0, "the dup server exits 0")
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
