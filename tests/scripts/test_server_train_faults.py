#!/usr/bin/env python3
# test_server_train_faults.py - what a server that trains does when the disk or the data fails
# under it (issue 11's bad-input list), on the demo model pre-training on a copy of man/:
#
# - A full disk during a checkpoint: the server's file-size limit is lowered (prlimit
#   RLIMIT_FSIZE on the running llsrv, an injected write failure: its writes past 1 MiB fail with
#   EFBIG as they would with ENOSPC; llsrv ignores SIGXFSZ). The checkpoint fails with a warning
#   event naming the file and the error, training goes on, requests are answered, last.ckpt is
#   still the last good checkpoint and no temporary file is left; with the limit lifted, the next
#   checkpoint is written.
# - The data path vanishing mid-run: a train_error event and the monitor's training.error name
#   the file, training stops in state "error", requests are answered, last.ckpt is untouched;
#   with the data back, `train start` goes on from where it stopped.
# - A restart after all this resumes from last.ckpt at its step (so it was intact and loadable).
# - A model that gives NaN in every step: train.max_skipped_steps (5) skipped steps in a row
#   end the job in state error with a train_error naming the count.
# - The checkpoint at shutdown failing (last.ckpt replaced by a directory, so the new one cannot
#   be published): the error is logged before "stopped" and the server exits non-zero.
import os
import re
import resource
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import Checker, Monitor, Server, wait_until  # noqa: E402

check = Checker()
tmp = tempfile.mkdtemp(prefix="llsrv-faults-")
os.chmod(tmp, 0o700)
data = os.path.join(tmp, "data")
shutil.copytree(os.path.join(os.environ["LL_SOURCE_DIR"], "man"), data)
args = ["--config", os.path.join(os.environ["LL_SOURCE_DIR"], "configs", "demo.yaml"), "--train-data", data, "--train-seq-len", "64",
        "--train-batch", "2", "--train-eval-every", "5", "--train-eval-seqs", "2", "--train-checkpoint-every", "5",
        "--train-steps", "100000", "--parallel", "2", "--threads", "2"]
LIMIT = 1 << 20  # a demo checkpoint (weights + AdamW moments, ~0.84 M parameters) is ~9 MiB


def answered(srv, what):
    c = srv.conn(timeout=300)
    text, kv, lines = c.generate("GEN max_tokens=4 temperature=0 :the server")
    c.close()
    check(text is not None and kv.get("reason") == "length", "GEN answered %s: %r" % (what, lines[-1:]))


def tmp_files(d):
    return [f for f in os.listdir(d) if ".tmp-" in f]


srv = Server(tmp, args)
try:
    mon = Monitor(srv.sock, timeout=300)
    ck = mon.wait_event("checkpoint_saved", 300)
    check(ck is not None, "a first checkpoint")
    run_dir = os.path.dirname(ck["path"])
    last = os.path.join(run_dir, "last.ckpt")
    good = ck

    # ---- full disk during a checkpoint
    hard = resource.prlimit(srv.p.pid, resource.RLIMIT_FSIZE)[1]
    resource.prlimit(srv.p.pid, resource.RLIMIT_FSIZE, (LIMIT, hard))

    def failed(e):
        global good
        if e.get("event") == "checkpoint_saved":  # one that was written before the limit took hold
            good = e
        return e.get("event") == "warning" and "checkpoint" in e.get("message", "")

    w = mon.wait_event(failed, 300)
    check(w is not None, "a warning event for the failed checkpoint")
    msg = w["message"] if w else ""
    check("failed" in msg and "File too large" in msg and "step-" in msg and run_dir in msg, "it names the file and the error: %r" % msg)
    check(os.stat(last).st_ino == os.stat(good["path"]).st_ino, "last.ckpt is still the last good checkpoint (step %d)" % good["step"])
    check(not tmp_files(run_dir), "no temporary file left: %r" % tmp_files(run_dir))
    snap = mon.snapshot()["training"]
    check(snap["state"] == "running" and snap["last_checkpoint"] == good["path"], "training goes on: %r" % {k: snap[k] for k in ("state", "step", "last_checkpoint")})
    answered(srv, "while checkpoints fail")
    s_fail = snap["step"]
    check(wait_until(lambda: mon.snapshot()["training"]["step"] > s_fail + 5, "steps after the failure", 300), "steps go on after the failure")
    mon.events = []  # from here on a checkpoint_saved is one written with room again
    resource.prlimit(srv.p.pid, resource.RLIMIT_FSIZE, (hard, hard))
    ck = mon.wait_event("checkpoint_saved", 300)
    check(ck is not None and os.path.exists(ck["path"]) and os.stat(last).st_ino == os.stat(ck["path"]).st_ino,
          "with room again the next checkpoint is written and published: %r" % ck)
    good = ck or good

    # ---- the data vanishes mid-run
    os.rename(data, data + ".gone")
    e = mon.wait_event("train_error", 300)
    msg = e["message"] if e else ""
    check(e is not None and "vanished" in msg and data + "/" in msg, "train_error names the vanished file: %r" % msg)
    snap = mon.snapshot()["training"]
    check(snap["state"] == "error" and "vanished" in (snap.get("error") or ""), "state error with the message: %r" % snap.get("error"))
    for ev in mon.events:  # checkpoints written between the last wait and the error
        if ev.get("event") == "checkpoint_saved":
            good = ev
    check(os.stat(last).st_ino == os.stat(good["path"]).st_ino and not tmp_files(run_dir), "last.ckpt untouched (step %d)" % good["step"])
    s_err = snap["step"]
    answered(srv, "after the data vanished")
    check(mon.snapshot()["training"]["step"] == s_err, "no steps without data")
    os.rename(data + ".gone", data)
    mon.events = []
    r = mon.cmd("train start")
    check(r["ok"], "train start after the error: %r" % r)
    check(wait_until(lambda: (lambda t: t["state"] == "running" and t["step"] > s_err + 2)(mon.snapshot()["training"]), "training again", 300),
          "training goes on once the data is back")
    ck = mon.wait_event("checkpoint_saved", 300)
    check(ck is not None, "checkpoints again")
    r = mon.cmd("train pause")  # so that no checkpoint is written while last.ckpt is read below
    check(r["ok"] and wait_until(lambda: mon.snapshot()["training"]["state"] == "paused", "paused", 300), "paused: %r" % r)
    mon.close()
    steps = [f for f in os.listdir(run_dir) if f.startswith("step-") and os.path.samefile(os.path.join(run_dir, f), last)]
    check(len(steps) == 1, "last.ckpt is one of the step checkpoints: %r" % steps)
    last_step = int(steps[0][5:13]) if steps else -1

    # ---- a restart resumes from last.ckpt (intact and loadable)
    srv.stop(signal.SIGKILL)
    srv2 = Server(tmp, args, name="srv2")
    wait_until(lambda: "resumed" in srv2.output(), "resume logged", 120)
    m = re.search(r"resumed \S+ at step (\d+)", srv2.output())
    check(m is not None and int(m.group(1)) == last_step, "the restart resumes at step %d: %s" % (last_step, srv2.output()[-400:]))
    answered(srv2, "after the restart")

    # ---- the checkpoint at shutdown fails (last.ckpt cannot be replaced: a directory stands
    # there): the error is logged before "stopped" and the server exits non-zero.
    def block_last():
        try:
            os.unlink(last)
        except FileNotFoundError:
            pass
        try:
            os.makedirs(os.path.join(last, "x"))
            return True
        except FileExistsError:  # a checkpoint published in between: again
            return os.path.isdir(last)

    check(wait_until(block_last, "last.ckpt a directory", 60), "last.ckpt replaced by a directory")
    rc = srv2.stop()
    out = srv2.output()
    i_err, i_stop = out.find("shutdown checkpoint failed"), out.rfind("stopped")
    check(rc not in (0, None), "a failed shutdown checkpoint exits non-zero (rc %r)" % rc)
    check(0 <= i_err < i_stop, "the error is logged, then stopped: %s" % out[-600:])

    # ---- a model that gives NaN in every step (its norm weights are 3e38: finite, so it
    # loads, and every forward overflows): train.max_skipped_steps skipped steps in a row end
    # the job in state error with a train_error naming the count, instead of skipping for ever.
    import struct
    import subprocess
    llsrv = os.path.join(os.environ["LL_BINARY_DIR"], "server", "llsrv")
    tiny, gguf, huge = (os.path.join(tmp, n) for n in ("tiny.ckpt", "tiny.gguf", "huge.gguf"))
    subprocess.run([llsrv, "init", "--dims", "32,2,4,2,64,128", "-o", tiny], check=True, capture_output=True)
    subprocess.run([llsrv, "convert", tiny, gguf], check=True, capture_output=True)
    b = bytearray(open(gguf, "rb").read())
    ones = struct.pack("<f", 1.0) * 32
    while b.find(ones) >= 0:
        i = b.find(ones)
        b[i:i + 128] = struct.pack("<f", 3e38) * 32
    open(huge, "wb").write(b)
    srv3 = Server(tmp, ["--model", huge, "--train-enabled", "--train-mode", "full", "--train-data", data, "--train-seq-len", "32",
                        "--train-batch", "1", "--train-eval-every", "0", "--train-checkpoint-every", "0", "--train-steps", "100000",
                        "--train-max-skipped-steps", "5", "--threads", "2"], name="srv3")
    mon = Monitor(srv3.sock, timeout=300)
    # The five steps of this tiny model may be over before the monitor attaches (and with them
    # the train_error event): the snapshot's training.error carries the same message.
    tr = wait_until(lambda: (lambda t: t if t["state"] == "error" else None)(mon.snapshot()["training"]), "training state error", 300)
    msg = (tr or {}).get("error", "")
    check("5 consecutive steps skipped" in msg and "max_skipped_steps 5" in msg, "the training error names the count: %r" % msg)
    snap = mon.snapshot()["training"]
    check(snap["state"] == "error" and snap["step"] == 5 and snap["skipped_steps"] == 5, "state error after 5 skipped steps: %r" %
          {k: snap.get(k) for k in ("state", "step", "skipped_steps", "error")})
    mon.close()
    check(srv3.stop() == 0, "the server exits 0 (a job in error saves nothing at shutdown)")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
