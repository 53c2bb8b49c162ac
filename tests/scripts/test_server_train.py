#!/usr/bin/env python3
# test_server_train.py - training in the server on the demo model (full-parameter pre-training on
# this repository's man pages): the monitor's training object fills in and its loss falls, the
# history holds the curve from step 0, train_eval / checkpoint_saved events arrive, requests are
# answered while it trains, train pause|resume|stop and save do what they say (and refuse what
# does not fit the state), SIGTERM saves a checkpoint, and a restart resumes from it at that
# step (kill -9 then restarts from the last periodic checkpoint).
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import Checker, Monitor, Server, wait_until  # noqa: E402

check = Checker()
tmp = tempfile.mkdtemp(prefix="llsrv-train-")
os.chmod(tmp, 0o700)
data = os.path.join(os.environ["LL_SOURCE_DIR"], "man")
args = ["--config", os.path.join(os.environ["LL_SOURCE_DIR"], "configs", "demo.yaml"), "--train-data", data, "--train-seq-len", "64",
        "--train-batch", "2", "--train-eval-every", "5", "--train-eval-seqs", "4", "--train-checkpoint-every", "10", "--train-steps", "100000",
        "--train-lr", "3e-3", "--train-warmup", "2", "--parallel", "2", "--threads", "2"]



srv = Server(tmp, args)
try:
    mon = Monitor(srv.sock)
    ev = mon.wait_event("train_eval")
    check(ev is not None and ev["step"] % 5 == 0, "a train_eval event: %r" % ev)
    snap = mon.snapshot()
    tr = snap["training"]
    check(tr["state"] == "running" and tr["step"] >= 5 and tr["total_steps"] == 100000, "running: %r" % {k: tr[k] for k in ("state", "step")})
    check(tr["run_dir"].endswith("/runs/demo") and isinstance(snap["memory"]["train_bytes"], int), "run_dir and train_bytes")
    check(tr["history"] and tr["history"][0][0] == 0 and tr["history"][0][2] is not None, "history starts with the step-0 validation")
    v0 = tr["history"][0][2]
    # requests are answered while it trains
    c = srv.conn(timeout=120)
    text, kv, lines = c.generate("GEN max_tokens=8 temperature=0 :the model")
    check(text is not None and kv.get("reason") == "length", "GEN answered during training: %r" % lines[-1:])
    ck = mon.wait_event("checkpoint_saved")
    check(ck is not None and os.path.exists(ck["path"]), "checkpoint_saved event with an existing file: %r" % ck)
    # the loss falls (the model starts untrained: ln 260 = 5.56)
    wait_until(lambda: mon.snapshot()["training"]["step"] >= 40, "40 steps", 300)
    tr = mon.snapshot()["training"]
    vals = [p[2] for p in tr["history"] if p[2] is not None]
    check(vals[-1] < 0.8 * v0, "validation loss falls by 20%%: %.3f -> %.3f" % (v0, vals[-1]))
    # control
    r = mon.cmd("train pause")
    check(r["ok"], "pause: %r" % r)
    wait_until(lambda: mon.snapshot()["training"]["state"] == "paused", "paused", 60)
    s1 = mon.snapshot()["training"]["step"]
    time.sleep(1.0)
    check(mon.snapshot()["training"]["step"] == s1, "no steps while paused")
    r = mon.cmd("train pause")
    check(not r["ok"] and "not running" in r.get("error", ""), "pause twice refused: %r" % r)
    mon.events = []
    r = mon.cmd("save")
    check(r["ok"], "save: %r" % r)
    ck = mon.wait_event("checkpoint_saved")
    while ck is not None and ck["step"] != s1:  # a periodic one from before the pause
        ck = mon.wait_event("checkpoint_saved")
    check(ck is not None and ck["step"] == s1, "save writes the paused step: %r" % ck)
    r = mon.cmd("train resume")
    check(r["ok"], "resume: %r" % r)
    wait_until(lambda: mon.snapshot()["training"]["step"] > s1, "steps after resume", 60)
    r = mon.cmd("train start")
    check(not r["ok"] and "already running" in r.get("error", ""), "start while running refused: %r" % r)
    r = mon.cmd("train fly")
    check(not r["ok"], "unknown train command refused")
    # SIGTERM: a checkpoint at the step reached
    rc = srv.stop(signal.SIGTERM)
    log = srv.output()
    check(rc == 0 and "at shutdown" in log, "SIGTERM saves (rc %r): %s" % (rc, log[-300:]))
    step_saved = int(log.split("step-")[-1].split(".ckpt at shutdown")[0])
    # restart: resumes at that step
    srv2 = Server(tmp, args, name="srv2")
    mon2 = Monitor(srv2.sock)
    wait_until(lambda: mon2.snapshot()["training"]["step"] is not None, "the run reopened", 60)
    tr = mon2.snapshot()["training"]
    check(tr["state"] == "running" and tr["step"] >= step_saved, "resumed at %d (%r)" % (step_saved, tr["step"]))
    wait_until(lambda: "resumed" in srv2.output(), "resume logged", 60)
    check(("at step %d" % step_saved) in srv2.output(), "resumed from the shutdown checkpoint")
    # kill -9: the restart goes on from the last periodic checkpoint (intact)
    srv2.stop(signal.SIGKILL)
    srv3 = Server(tmp, args, name="srv3")
    mon3 = Monitor(srv3.sock)
    wait_until(lambda: "resumed" in srv3.output(), "resume after kill -9", 60)
    wait_until(lambda: mon3.snapshot()["training"]["state"] == "running", "running again after kill -9", 60)
    check(mon3.snapshot()["training"]["step"] >= 10, "from a periodic checkpoint")
    srv3.stop()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
