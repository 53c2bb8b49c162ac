#!/usr/bin/env python3
# test_opencl_server_train.py - the server's background trainer on the OpenCL serving device
# (PoCL's opencl:0:0, or $LL_TEST_OPENCL_DEVICE): `llsrv --device DEV` with LoRA training on a
# small model (stories260K's shape from `llsrv init`, this repository's man pages as data).
#
# Asserts: the start-up summary's trainer line and the monitor's training.backend /
# device_reason (and lltop) name the OpenCL device (a silent CPU fallback fails: no "on the CPU" line);
# the trainer's own instance counts device memory (memory.train_device_bytes > 0, included in
# device_used); training steps advance with a finite loss and a checkpoint is published
# (checkpoint_saved with an existing file); a GEN request over TCP - adapter=live, the adapter
# being trained - answers while training goes on; SIGTERM saves and exits 0. Then the
# fallback: with LL_OPENCL_FAULT=train the trainer's instance fails, the server still serves on
# the device, trains on the CPU and says why in one log line and in the monitor; that CPU
# run's first 8 losses equal the OpenCL run's within 1e-3 relative (the same seed and data).
# With LL_OPENCL_FAULT=train_alloc the instance opens but cannot hold a run's buffers: the run
# trains on the CPU, saying why in one log line and in the monitor, and GEN still answers.
# Last, full-parameter training on the device: steps, GEN answered meanwhile.
#
# No timed assertions: every wait is bounded far above the work (a step takes ~0.1 s here).
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import BIN, Checker, Monitor, Server, wait_until  # noqa: E402

DEV = os.environ.get("LL_TEST_OPENCL_DEVICE", "opencl:0:0")
check = Checker()
tmp = tempfile.mkdtemp(prefix="llsrv-ocl-train-")
os.chmod(tmp, 0o700)
env = {"XDG_STATE_HOME": os.path.join(tmp, "xdg")}  # nothing into the user's state
model = os.path.join(tmp, "m.ckpt")
data = os.path.join(os.environ["LL_SOURCE_DIR"], "man")


def args(run):
    return ["--model", model, "--device", DEV, "--threads", "2", "--parallel", "2", "--train-enabled", "--train-data", data,
            "--train-seq-len", "64", "--train-batch", "1", "--train-lora-rank", "4", "--train-lora-targets", "q,v,down",
            "--train-lr", "1e-2", "--train-steps", "100000", "--train-eval-every", "0", "--train-checkpoint-every", "5",
            "--train-checkpoint-dir", os.path.join(tmp, run)]


def gen_while_training(srv, mon, what, adapter="adapter=live "):
    """A GEN over TCP (with the live adapter in LoRA mode) answers, and training is still
    running after it."""
    s0 = mon.snapshot()["training"]["step"]
    c = srv.conn(timeout=120)
    text, kv, lines = c.generate("GEN %smax_tokens=8 temperature=0 :the server" % adapter)
    c.close()
    check(text is not None and kv.get("reason") == "length", "%s: GEN answered during training: %r" % (what, lines[-1:]))
    ok = wait_until(lambda: mon.snapshot()["training"]["step"] > s0, "%s: steps after the request" % what, 120)
    check(ok and mon.snapshot()["training"]["state"] == "running", "%s: training goes on around the request" % what)


try:
    r = subprocess.run([BIN, "init", "--dims", "64,5,8,4,172,512", "-o", model], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "llsrv init: %s" % r.stderr[-300:])

    # --- the trainer on the OpenCL device
    srv = Server(tmp, args("run1"), env=env)
    log = srv.output()
    check(("  trainer   opencl: " in log) and (DEV + ": the serving device") in log, "start-up names the OpenCL trainer: %s" % log[-1500:])
    check("training: on the CPU" not in log, "no CPU fallback: %s" % log[-800:])
    mon = Monitor(srv.sock)
    snap = mon.snapshot()
    tr, mem = snap["training"], snap["memory"]
    check(snap["device"]["backend"] == "opencl", "serving on OpenCL: %r" % snap["device"].get("reason"))
    check(tr["backend"] == "opencl" and tr["device_reason"].startswith(DEV + ":") and tr["device"] == snap["device"]["name"],
          "monitor: the trainer on %s: %r" % (DEV, {k: tr.get(k) for k in ("backend", "device", "device_reason")}))
    # The trainer's instance holds its buffers once its run has opened (it shares the served
    # weights, so before that it may hold nothing): after the first step.
    wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 1, "a first step", 300)
    mem = mon.snapshot()["memory"]
    tdb = mem.get("train_device_bytes")
    check(isinstance(tdb, int) and tdb > 0 and mem["device_used"] > tdb,
          "device memory: trainer %r within device_used %r" % (tdb, mem["device_used"]))
    ck = mon.wait_event("checkpoint_saved", timeout=300)
    check(ck is not None and os.path.exists(ck["path"]) and ck["path"].startswith(os.path.join(tmp, "run1")),
          "a checkpoint published: %r" % ck)
    ok = wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 8, "8 steps", 300)
    tr = mon.snapshot()["training"]
    check(ok and tr["state"] == "running" and isinstance(tr["loss"], float), "steps advance with a loss: %r" % {k: tr[k] for k in ("state", "step", "loss")})
    gen_while_training(srv, mon, "opencl")
    lt = subprocess.run([os.path.join(os.environ["LL_BINARY_DIR"], "tui", "lltop"), "--once", "--socket", srv.sock], capture_output=True,
                        text=True, timeout=60)
    check(lt.returncode == 0 and ("on opencl: " + snap["device"]["name"]) in lt.stdout, "lltop --once names the trainer's device: %s" % lt.stdout[-600:])
    curve_cl = {p[0]: p[1] for p in mon.snapshot()["training"]["history"] if p[1] is not None}
    rc = srv.stop(signal.SIGTERM, timeout=60)
    check(rc == 0 and "at shutdown" in srv.output(), "SIGTERM saves and exits 0 (rc %r): %s" % (rc, srv.output()[-300:]))
    mon.close()

    # --- fallback: the trainer's instance fails, serving goes on on the device
    env2 = dict(env, LL_OPENCL_FAULT="train")
    srv = Server(tmp, args("run2"), env=env2, name="srv2")
    log = srv.output()
    check("training: on the CPU: the serving device " + DEV in log and "LL_OPENCL_FAULT=train" in log,
          "the fallback says why in one line: %s" % log[-1500:])
    check("  trainer   cpu: " in log, "start-up names the CPU trainer")
    mon = Monitor(srv.sock)
    snap = mon.snapshot()
    tr = snap["training"]
    check(snap["device"]["backend"] == "opencl" and tr["backend"] == "cpu" and tr["device_reason"].startswith("cpu: " + DEV),
          "monitor: serving on OpenCL, training on the CPU: %r" % {k: tr.get(k) for k in ("backend", "device_reason")})
    check(snap["memory"].get("train_device_bytes") is None, "no trainer device memory on the CPU")
    ok = wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 3, "3 steps on the CPU", 300)
    check(ok, "the CPU trainer steps")
    gen_while_training(srv, mon, "fallback")
    # The same run on both devices: the per-step losses agree as `llsrv train`'s do
    # (test_opencl_train.sh: rounding only, 1e-3 relative), so the device trained the
    # same model - its own copies of the weights, the adapter the server publishes.
    wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 8, "8 steps on the CPU", 300)
    curve_cpu = {p[0]: p[1] for p in mon.snapshot()["training"]["history"] if p[1] is not None}
    common = sorted(set(curve_cl) & set(curve_cpu))[:8]
    bad = [(st, curve_cpu[st], curve_cl[st]) for st in common if not abs(curve_cpu[st] - curve_cl[st]) <= 1e-3 * abs(curve_cpu[st])]
    print("step, loss (cpu trainer), loss (opencl trainer):", [(st, curve_cpu[st], curve_cl[st]) for st in common], flush=True)
    check(len(common) == 8 and not bad, "the OpenCL trainer's losses equal the CPU trainer's within 1e-3: %d common steps, off: %r" % (len(common), bad))
    rc = srv.stop(signal.SIGTERM, timeout=60)
    check(rc == 0, "fallback server exits 0 (rc %r)" % rc)
    mon.close()

    # --- the trainer's instance opens, but the device cannot hold the run's buffers
    # (LL_OPENCL_FAULT=train_alloc): the run trains on the CPU, one line says why, serving goes on
    srv = Server(tmp, args("run4"), env=dict(env, LL_OPENCL_FAULT="train_alloc"), name="srv4")
    mon = Monitor(srv.sock)
    ok = wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 2, "train_alloc: 2 steps", 300)
    tr = mon.snapshot()["training"]
    log = srv.output()
    check(ok and tr["backend"] == "cpu" and tr["device_reason"].startswith("cpu: the serving device cannot hold the training buffers: trainer: out of device memory"),
          "train_alloc: the run trains on the CPU and says why: %r" % {k: tr.get(k) for k in ("backend", "step", "device_reason")})
    check("training: on the CPU: the serving device cannot hold the training buffers" in log, "train_alloc: one log line: %s" % log[-800:])
    check(mon.snapshot()["memory"].get("train_device_bytes") is None, "train_alloc: no trainer device memory on the CPU")
    gen_while_training(srv, mon, "train_alloc")
    rc = srv.stop(signal.SIGTERM, timeout=60)
    check(rc == 0, "train_alloc server exits 0 (rc %r)" % rc)
    mon.close()

    # --- full-parameter training on the device: the trainer computes on f32 copies of its own,
    # which the server serves (its weights' table without device copies: nothing uploaded)
    srv = Server(tmp, [a if a != "1e-2" else "3e-3" for a in args("run3")] + ["--train-mode", "full"], env=env, name="srv3")
    check("training: on the CPU" not in srv.output(), "full: no CPU fallback")
    mon = Monitor(srv.sock)
    ok = wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 3, "full: 3 steps", 300)
    tr = mon.snapshot()["training"]
    check(ok and tr["backend"] == "opencl" and isinstance(tr["loss"], float), "full: steps on the device: %r" % {k: tr.get(k) for k in ("backend", "step", "loss")})
    gen_while_training(srv, mon, "full", adapter="")
    rc = srv.stop(signal.SIGTERM, timeout=60)
    check(rc == 0, "full: exits 0 (rc %r)" % rc)
    mon.close()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
