# benchlib.py - what the training benchmarks share: the machine line (CPU, ISA, load, read
# bandwidth measured now), the corpus (a copy of man/ + docs/), and the steady tokens/s of an
# `llsrv train` run read from its progress lines. Standard library only.
import os
import re
import shutil
import subprocess

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def machine():
    """(CPU model name, widest ISA the flags report)."""
    cpu = flags = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and cpu == "?":
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("flags") and flags == "?":
            fl = line.split()
            flags = "avx512f+vnni" if "avx512_vnni" in fl else "avx512f" if "avx512f" in fl else "avx2" if "avx2" in fl else "sse"
    return cpu, flags


def lltop_training_state(binary_dir, sock):
    """training.state as `lltop --json` reads it from the server's monitor socket."""
    import json
    out = subprocess.run([os.path.join(binary_dir, "tui", "lltop"), "--json", "--socket", sock], capture_output=True, text=True,
                         timeout=60).stdout
    return json.loads(out)["training"]["state"]


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def readbw(build, threads):
    """Read bandwidth in GB/s with 1..threads threads (tests/bench/readbw.c), as text: in 4 KiB
    pages, then in 2 MiB pages where the kernel grants them (llsrv's packed weights live there)."""
    out = subprocess.run([os.path.join(build, "tests", "readbw"), "-t", str(threads), "-m", "512", "-r", "5"], capture_output=True, text=True).stdout
    return " / ".join(re.findall(r"([\d.]+) GB/s", out))


def corpus(tmp):
    """A copy of the project's man pages and docs (the finetune test's corpus): (dir, files)."""
    d = os.path.join(tmp, "corpus")
    os.makedirs(d, exist_ok=True)
    files = []
    for sub in ("man", "docs"):
        for f in sorted(os.listdir(os.path.join(SRC, sub))):
            files.append(os.path.join(d, sub + "_" + f))
            shutil.copy(os.path.join(SRC, sub, f), files[-1])
    return d, files


def train_tps(out, seq_len, k0, k1):
    """Tokens/s of steps k0+1..k1 from `llsrv train --log-every 1` output. Each progress line
    "step k/N ... X tok/s" gives the average since the first step, so k*seq_len/X is the time
    to step k. None when the lines are missing."""
    el = {}
    for m in re.finditer(r"^step (\d+)/\d+ .*? (\d+) tok/s", out, re.M):
        k, x = int(m.group(1)), float(m.group(2))
        if x > 0:
            el[k] = k * seq_len / x
    if k0 not in el or k1 not in el or el[k1] <= el[k0]:
        return None
    return (k1 - k0) * seq_len / (el[k1] - el[k0])
