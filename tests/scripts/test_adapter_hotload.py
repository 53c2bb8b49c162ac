#!/usr/bin/env python3
"""Adapters hot-loaded while the server serves (issue 33): the monitor's `adapter load NAME PATH` /
`adapter unload NAME` and a watched directory (adapter_dir), on the demo model.

- Two LoRA adapters trained here (llsrv train, two seeds) give greedy texts that differ from each
  other and from the base model's, so a text says which version computed it.
- `adapter load hot v1` serves v1 under `hot`; a long request starts on it; `adapter load hot v2`
  replaces it while that request streams: new requests get v2's text, the request in flight
  finishes with v1's full text (its version stays alive, `served: false` with 1 request in the
  monitor's adapter_versions), and v1 is released (logged) only after that request ends.
- `adapter unload hot`: requests naming it get ERR bad_adapter; unloading an unknown name, a
  truncated file, another model's adapter and bad syntax are refused with a message naming the
  problem, and the server keeps serving.
- adapter_dir: a file renamed into the directory is served under its stem, a new version renamed
  over it is served in its place, a damaged file is reported and the previous version stays,
  a removed file is unloaded.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llsrv_client import BIN, Monitor, Server, parse_line, wait_until  # noqa: E402

SRC = os.environ.get("LL_SOURCE_DIR", ".")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(*args):
    r = subprocess.run([BIN] + list(args), capture_output=True, text=True)
    check(r.returncode == 0, "llsrv %s: %s" % (" ".join(args[:1]), (r.stdout + r.stderr)[-400:]))


def gen(srv, adapter, n=48):
    c = srv.conn(timeout=120)
    text, end, lines = c.generate("GEN max_tokens=%d temperature=0 adapter=%s :The adapter" % (n, adapter))
    c.close()
    return text if text is not None else ("ERR", end.get("line", ""))


def install(src, dst):
    """Publishes src as dst the way a trainer does: a temporary name, then rename."""
    tmp = os.path.join(os.path.dirname(dst), ".incoming.tmp")
    shutil.copy(src, tmp)
    os.rename(tmp, dst)


def main():
    tmp = tempfile.mkdtemp(prefix="llsrv-hotload-")
    try:
        model = os.path.join(tmp, "demo.ckpt")
        run("init", "--preset", "tiny", "-o", model)
        common = ["--model", model, "--data", os.path.join(SRC, "man"), "--seq-len", "32", "--lora-rank", "4", "--steps", "6",
                  "--lr", "3e-2", "--eval-every", "0", "-t", "1"]
        for name, seed in (("v1", "1"), ("v2", "2")):
            run("train", *common, "--seed", seed, "-o", os.path.join(tmp, "run-" + name))
            run("export", os.path.join(tmp, "run-" + name, "last.ckpt"), os.path.join(tmp, name + ".gguf"))
        # another model's adapter (32 dims), and a truncated file
        other = os.path.join(tmp, "other.ckpt")
        run("init", "--dims", "32,2,4,2,64,128", "-o", other)
        run("train", "--model", other, "--data", os.path.join(SRC, "man"), "--seq-len", "32", "--lora-rank", "4", "--steps", "1", "--eval-every",
            "0", "-t", "1", "-o", os.path.join(tmp, "run-other"))
        run("export", os.path.join(tmp, "run-other", "last.ckpt"), os.path.join(tmp, "other.gguf"))
        data = open(os.path.join(tmp, "v1.gguf"), "rb").read()
        open(os.path.join(tmp, "trunc.gguf"), "wb").write(data[: len(data) // 2])
        v1, v2 = os.path.join(tmp, "v1.gguf"), os.path.join(tmp, "v2.gguf")

        adir = os.path.join(tmp, "adapters")
        os.mkdir(adir)
        srv = Server(tmp, ["--model", model, "--parallel", "2", "-t", "1", "--adapter-dir", adir, "--adapter-dir-poll", "0.2", "--monitor-hz", "50"])
        mon = Monitor(srv.sock)

        def load(name, path):
            return mon.cmd("adapter load %s %s" % (name, path))

        r1 = load("ref1", v1)
        check(r1.get("ok") and "version 1" in r1.get("message", ""), "adapter load ref1: %s" % r1)
        r2 = load("ref2", v2)
        check(r2.get("ok") and "version 2" in r2.get("message", ""), "adapter load ref2: %s" % r2)
        base, t1, t2 = gen(srv, "none"), gen(srv, "ref1"), gen(srv, "ref2")
        check(len({base, t1, t2}) == 3, "base, v1 and v2 give three different greedy texts: %r %r %r" % (base[:40], t1[:40], t2[:40]))
        long_req = "GEN id=long max_tokens=480 ignore_eos=1 temperature=0 adapter=%s :The adapter"
        cr = srv.conn(timeout=300)
        ref_long, _, _ = cr.generate(long_req % "ref1")
        cr.close()

        # ---- a new version while a request streams on the old one
        r = load("hot", v1)
        check(r.get("ok"), "adapter load hot v1: %s" % r)
        check(gen(srv, "hot") == t1, "hot serves v1")
        # The long request: its first token read on its own connection, then v2 loaded at once.
        result = {}
        c = srv.conn(timeout=300)
        c.send((long_req % "hot") + "\n")
        first = c.line()
        check(first is not None and first.startswith("TOK long"), "the long request streams on hot v1: %r" % first)

        def stream():
            try:
                text, end, _ = c.collect()
                result["text"], result["end"] = parse_line(first)[3] + text, end
            except Exception as ex:  # noqa: BLE001
                result["text"], result["end"] = None, {"error": repr(ex)}

        th = threading.Thread(target=stream)
        th.start()
        r = load("hot", v2)
        check(r.get("ok") and "version 4" in r.get("message", ""), "adapter load hot v2 while it streams: %s" % r)

        def versions():
            snap = mon.snapshot()["serving"]
            if not any(q.get("id") == "long" for q in snap["requests"]):
                return "ended"
            hot = sorted((a["version"], a["served"], a["requests"]) for a in snap["adapter_versions"] if a["name"] == "hot")
            return hot if hot == [(3, False, 1), (4, True, 0)] else None

        hot = wait_until(versions, "v1 kept, v2 served", 30, 0.01)
        check(hot == [(3, False, 1), (4, True, 0)], "monitor while it streams: v1 kept for its request (served: false), v2 served: %s" % hot)
        released_early = "adapter 'hot' version 3 released" in srv.output()
        check(gen(srv, "hot") == t2, "new requests on hot get v2's text")
        th.join(300)
        check(not released_early, "version 3 not released while its request streamed")
        check(result.get("text") == ref_long and result["end"].get("reason") == "length",
              "the request in flight finished on the version it began with (v1's full text): %r / %r, %s" % (
                  (result.get("text") or b"")[:60], ref_long[:60], result.get("end")))
        check(wait_until(lambda: "adapter 'hot' version 3 released" in srv.output(), "v1 released", 30), "v1 released after its last request")
        check(wait_until(lambda: not any(a["name"] == "hot" and a["version"] == 3 for a in mon.snapshot()["serving"]["adapter_versions"]),
                         "v1 gone from the monitor", 30, 0.01), "and gone from the monitor")

        # ---- unload and the refusals
        r = mon.cmd("adapter unload hot")
        check(r.get("ok"), "adapter unload hot: %s" % r)
        g = gen(srv, "hot")
        check(isinstance(g, tuple) and "bad_adapter" in g[1], "requests naming an unloaded adapter: ERR bad_adapter: %s" % (g,))
        r = mon.cmd("adapter unload nosuch")
        check(not r.get("ok") and "nosuch" in r.get("error", ""), "unloading an unknown name: %s" % r)
        r = load("bad", os.path.join(tmp, "trunc.gguf"))
        check(not r.get("ok") and "trunc.gguf" in r.get("error", ""), "a truncated file refused, named: %s" % r)
        r = load("bad", os.path.join(tmp, "other.gguf"))
        check(not r.get("ok") and r.get("error"), "another model's adapter refused: %s" % r)
        r = load("bad", os.path.join(tmp, "nofile.gguf"))
        check(not r.get("ok") and "nofile.gguf" in r.get("error", ""), "a missing file refused, named: %s" % r)
        for cmd in ("adapter", "adapter load onlyname", "adapter reload x y"):
            r = mon.cmd(cmd)
            check(not r.get("ok") and "adapter load NAME PATH" in r.get("error", ""), "%r refused with the syntax: %s" % (cmd, r))
        r = load("live", v1)
        check(not r.get("ok") and "cannot be used" in r.get("error", ""), "the reserved name live refused: %s" % r)
        check(gen(srv, "ref1") == t1, "still serving after the refusals")

        # ---- the watched directory
        dst = os.path.join(adir, "dirad.gguf")
        install(v1, dst)
        check(wait_until(lambda: gen(srv, "dirad") == t1, "dirad served", 30), "a file renamed into adapter_dir is served under its stem (v1's text)")
        install(v2, dst)
        check(wait_until(lambda: gen(srv, "dirad") == t2, "dirad v2", 30), "a new version renamed over it is served in its place")
        install(os.path.join(tmp, "trunc.gguf"), dst)
        check(wait_until(lambda: "adapter_dir: %s" % dst in srv.output() and "tried again when it changes" in srv.output(), "error logged", 30),
              "a damaged file in adapter_dir is reported")
        check(gen(srv, "dirad") == t2, "... and the version served before stays")
        os.unlink(dst)
        check(wait_until(lambda: isinstance(gen(srv, "dirad", 4), tuple), "dirad unloaded", 30), "a removed file is unloaded")
        mon.close()
        check(srv.stop() == 0, "SIGTERM: exit 0")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("adapter_hotload: %d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
