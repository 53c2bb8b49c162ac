#!/usr/bin/env python3
# lltop_fake_server.py - a stand-in llsrv monitor socket for lltop's tests (and for trying
# lltop by hand): speaks the schema of man/llsrv-protocol.7, MONITOR SOCKET.
#   lltop_fake_server.py SOCKET RECORD train     a training run: full history on attach, then
#                                                one step every 0.2 s in snapshot tails
#   lltop_fake_server.py SOCKET RECORD silent    one snapshot on attach, then nothing (stale)
#   lltop_fake_server.py SOCKET RECORD hostile   valid snapshots between hostile lines (bad
#                                                JSON, a 10 MB line, escape sequences and control
#                                                characters in strings, huge numbers, deep nesting)
#   lltop_fake_server.py SOCKET RECORD busy      30 active requests (ids req-01..req-30) and 40
#                                                events (busy-ev-01..40) on attach, then live
#                                                snapshots; the file RECORD.nreq (a number) sets
#                                                the request count, RECORD.more (a number) sends
#                                                that many more events (busy-late-NN) once
#   lltop_fake_server.py SOCKET RECORD wide      double-width and combining characters: a CJK
#                                                model name, emoji request ids, a CJK event
# Every control command received is appended to RECORD, one per line. `pause` is accepted
# (state becomes paused), `resume` likewise; `save` and `train ...` are refused with a reason.
import json
import math
import os
import socket
import sys
import threading
import time

path, record, mode = sys.argv[1], sys.argv[2], sys.argv[3]
lock = threading.Lock()
state = {"step": 300, "paused": False, "pid": os.getpid()}


def loss_at(step):
    return 1.2 + 2.0 * math.exp(-step / 120.0) + 0.02 * math.sin(step)


def val_at(step):
    return 1.35 + 2.0 * math.exp(-step / 120.0)


def history(upto, tail):
    first = max(1, upto - 15) if tail else 1
    return [[s, round(loss_at(s), 4), round(val_at(s), 4) if s % 25 == 0 else None] for s in range(first, upto + 1)]


def snapshot(tail, device="FakeGPU 9000", model="fake-model"):
    with lock:
        step, paused = state["step"], state["paused"]
    return {
        "type": "snapshot", "time": time.time(), "uptime_s": 1234.5, "version": "0.0-fake", "pid": state["pid"],
        "device": {"name": device, "type": "gpu", "backend": "opencl", "compute_units": 48, "threads": 2, "reason": "fake"},
        "memory": {"device_total": 8 << 30, "device_used": 3 << 30, "host_rss": 900 << 20, "host_total": 24 << 30,
                   "weights": 300 << 20, "kv_bytes": 200 << 20, "kv_blocks_used": 10, "kv_blocks_total": 128,
                   "train_bytes": 150 << 20},
        "model": {"name": model, "path": "/x/fake.gguf", "arch": "llama", "quant": "q4_1", "n_params": 135000000,
                  "n_ctx": 2048, "n_vocab": 49152},
        "serving": {"listen": "127.0.0.1:1", "clients": 1, "active": 1, "queued": 0, "parallel": 4,
                    "requests_total": 5, "requests_done": 4, "tokens_generated": 999, "tokens_prefilled": 100,
                    "decode_tps": 42.0, "prefill_tps": 300.0, "clients_dropped": 0,
                    "requests": [{"id": "r1", "state": "decode", "prompt_tokens": 12, "prefilled": 12, "tokens": 7,
                                  "max_tokens": 64, "client": "127.0.0.1:5555", "tok_s": 20.5, "age_s": 3.2,
                                  "adapter": "none"}]},
        "training": {"state": "paused" if paused else "running", "step": step, "total_steps": 1000,
                     "epoch": step / 500.0, "loss": round(loss_at(step), 4), "val_loss": round(val_at(step - step % 25), 4),
                     "lr": 1e-3, "grad_norm": 0.75, "tokens_per_s": 1500.0, "eta_s": (1000 - step) * 0.2,
                     "last_checkpoint": "/x/run/step-000250.ckpt", "skipped_steps": 0, "run_dir": "/x/run",
                     "history": history(step, tail), "history_tail": tail},
    }


WIDE_MODEL = "模型名称大语言模型测试用的很长的名字一二三四五六七八九十百千万"  # 31 CJK: 93 bytes
WIDE_IDS = ["😀日本-1",              # fits its 10 columns: emoji, CJK
            "a🚀🚀🚀🚀🚀z",  # 1+10+1 columns: cut before the 5th rocket
            "éx‍y️z",                # combining acute, ZWJ and VS16 (dropped)
            "bidi‮X"]                           # an override: '?'


def wide_snapshot(tail):
    s = snapshot(tail, model=WIDE_MODEL)
    r0 = s["serving"]["requests"][0]
    s["serving"]["requests"] = [dict(r0, id=i, client="127.0.0.1:%d" % (6000 + k)) for k, i in enumerate(WIDE_IDS)]
    s["serving"]["active"] = len(WIDE_IDS)
    return s


def busy_snapshot(tail, n):
    s = snapshot(tail)
    r0 = s["serving"]["requests"][0]
    s["serving"]["requests"] = [dict(r0, id="req-%02d" % (k + 1), client="127.0.0.1:%d" % (7000 + k), tokens=k)
                                for k in range(n)]
    s["serving"]["active"] = n
    s["serving"]["parallel"] = 32
    return s


def read_number(p):
    """The number in file p (written by the test), or None."""
    try:
        with open(p) as f:
            v = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return v


def line(obj):
    return (json.dumps(obj) + "\n").encode()


def hostile_lines():
    s = evil_snapshot(False)
    yield line(s)
    yield b"{this is not json\n"
    yield b'{"type":"snapshot","memory":{"device_total":99999999999999999999999999999}}\n'  # over int64
    yield b'{"type":"snapshot","device":{"name":"\xff\xfe\x1b[2J raw bytes"}}\n'  # invalid UTF-8
    yield b"[" * 100000 + b"]" * 100000 + b"\n"  # deep nesting
    yield b'{"type":"warp","x":1}\n'
    yield b"\x1b[2J\x1b]0;pwned-raw\x07 raw escapes outside JSON\n"
    yield b'{"type":"snapshot","a":"' + b"A" * (10 << 20) + b'"}\n'  # a 10 MB line
    yield line({"type": "event", "event": "warning", "message": "evil\x1b]0;pwned-event\x07tail"})
    yield line({"type": "event", "event": "request_finished", "id": "\x1b[H", "reason": "length", "prompt_tokens": 1,
                "tokens": 2, "prefill_ms": 1e308, "decode_ms": -5})
    yield b'{"type":"reply","command":"\x1b[2J","ok":"yes"}\n'
    yield line({"type": "event", "event": "warning", "message": "nul\x00byte"})  # \u0000: refused by the parser


EVIL_DEVICE = "Evil\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eGPU"


def evil_snapshot(tail):
    s = snapshot(tail, device=EVIL_DEVICE, model="m\x1b[5mblink\r\n")
    s["memory"]["device_total"] = 1e308
    s["memory"]["host_rss"] = -1e300
    s["serving"]["requests"][0]["id"] = "\x1b[31mred"
    s["serving"]["requests"][0]["tokens"] = 1e300
    return s


def handle(c):
    f = c.makefile("rb")

    def reader():
        try:
            serve_commands()
        except OSError:
            pass

    def serve_commands():
        for raw in f:
            cmd = raw.decode(errors="replace").strip()
            with open(record, "a") as r:
                r.write(cmd + "\n")
            if cmd in ("pause", "resume"):
                with lock:
                    state["paused"] = cmd == "pause"
                rep = {"type": "reply", "command": cmd, "ok": True}
            elif cmd == "snapshot":
                c.sendall(line(snapshot(False)))
                continue
            else:
                rep = {"type": "reply", "command": cmd.split(" ")[0], "ok": False,
                       "error": "fake server: no checkpoint for '%s' (refused on purpose)" % cmd}
            try:
                c.sendall(line(rep))
            except OSError:
                return

    threading.Thread(target=reader, daemon=True).start()
    try:
        c.sendall(line(snapshot(False)))
        if mode == "silent":
            while True:
                time.sleep(1)
        if mode == "hostile":
            for l in hostile_lines():
                c.sendall(l)
                time.sleep(0.05)
            while True:  # then live: the evil strings stay on screen, the step keeps moving
                time.sleep(0.2)
                with lock:
                    state["step"] = min(state["step"] + 1, 1000)
                big = evil_snapshot(True)
                big["pad"] = "x" * 150000  # valid lines longer than one read of the client
                c.sendall(line(big))
        if mode == "wide":
            c.sendall(line(wide_snapshot(False)))
            c.sendall(line({"type": "event", "event": "warning", "message": "学习率 🔥 é wide"}))
            while True:
                time.sleep(0.2)
                c.sendall(line(wide_snapshot(True)))
        if mode == "busy":
            nreq = 30
            c.sendall(line(busy_snapshot(False, nreq)))
            for k in range(1, 41):
                c.sendall(line({"type": "event", "event": "warning", "message": "busy-ev-%02d" % k}))
            late = 0
            while True:
                time.sleep(0.2)
                v = read_number(record + ".nreq")
                if v is not None:
                    nreq = max(0, min(v, 300))
                more = read_number(record + ".more")
                if more:
                    os.unlink(record + ".more")
                    for _ in range(min(more, 100)):
                        late += 1
                        c.sendall(line({"type": "event", "event": "warning", "message": "busy-late-%02d" % late}))
                c.sendall(line(busy_snapshot(True, nreq)))
        while True:
            time.sleep(0.2)
            with lock:
                if not state["paused"]:
                    state["step"] = min(state["step"] + 1, 1000)
            c.sendall(line(snapshot(True)))
    except OSError:
        pass
    finally:
        c.close()


def main():
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


main()
