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
    # adapter=live in a full-parameter run: refused, saying what is true (the model itself is trained)
    c3 = srv3.conn(timeout=120)
    r = c3.request("GEN max_tokens=2 adapter=live :x")
    check(r.startswith("ERR") and "bad_adapter" in r and "served model itself" in r and "not running" not in r,
          "adapter=live in full mode says the weights are the model: %r" % r)
    c3.close()
    srv3.stop()

    # A LoRA run with long steps (32 x 256 tokens): pause waits for the step in flight and says
    # so (pausing); a resume in that window cancels the pause; adapter=live serves the adapter
    # while the run runs, is withdrawn by train stop (bad_adapter, saying why) and comes back
    # with train start.
    lora_args = ["--config", os.path.join(os.environ["LL_SOURCE_DIR"], "configs", "demo.yaml"), "--train-mode", "lora", "--train-data", data,
                 "--train-seq-len", "256", "--train-batch", "32", "--train-eval-every", "0", "--train-checkpoint-every", "0",
                 "--train-steps", "100000", "--train-checkpoint-dir", os.path.join(tmp, "lora-run"), "--parallel", "2", "--threads", "2",
                 "--idle-timeout", "3600"]
    srv4 = Server(tmp, lora_args, name="srv4")
    mon4 = Monitor(srv4.sock)
    wait_until(lambda: (mon4.snapshot()["training"]["step"] or 0) >= 1, "the LoRA run's first step", 300)
    c4 = srv4.conn(timeout=300)
    t, kv, lines = c4.generate("GEN max_tokens=3 adapter=live :x")
    check(t is not None and kv.get("reason") in ("length", "stop"), "adapter=live answers while the LoRA run runs: %r" % lines[-1:])
    r = mon4.cmd("train pause")
    check(r["ok"], "pause: %r" % r)
    st = mon4.snapshot()["training"]["state"]
    check(st in ("pausing", "paused"), "after pause the state is pausing or paused, never running: %r" % st)
    r = mon4.cmd("train pause")
    check(r["ok"] or "paused" in r.get("error", ""), "pause again while pausing is the same answer: %r" % r)
    r = mon4.cmd("train resume")
    check(r["ok"], "resume right after pause (the step still in flight) is accepted: %r" % r)
    s0 = mon4.snapshot()["training"]["step"]
    wait_until(lambda: mon4.snapshot()["training"]["step"] > s0 + 1, "steps go on after a cancelled pause", 300)
    check(mon4.snapshot()["training"]["state"] == "running", "running after the cancelled pause")
    r = mon4.cmd("train pause")
    wait_until(lambda: mon4.snapshot()["training"]["state"] == "paused", "paused once the step ended", 300)
    t, kv, lines = c4.generate("GEN max_tokens=3 adapter=live :x")
    check(t is not None, "adapter=live answers while paused: %r" % lines[-1:])
    r = mon4.cmd("train stop")
    check(r["ok"], "stop: %r" % r)
    wait_until(lambda: mon4.snapshot()["training"]["state"] == "stopped", "stopped", 300)
    r = c4.request("GEN max_tokens=3 adapter=live :x")
    check(r.startswith("ERR") and "bad_adapter" in r and "stopped" in r, "adapter=live after train stop: bad_adapter saying why: %r" % r)
    t, kv, lines = c4.generate("GEN max_tokens=3 :x")
    check(t is not None, "the base model still answers after train stop")
    r = mon4.cmd("train start")
    check(r["ok"], "start again: %r" % r)
    wait_until(lambda: mon4.snapshot()["training"]["state"] == "running", "running again", 300)
    t, kv, lines = c4.generate("GEN max_tokens=3 adapter=live :x")
    check(t is not None, "adapter=live answers again after train start: %r" % lines[-1:])
    c4.close()
    check(srv4.stop() == 0, "the LoRA server exits 0")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
