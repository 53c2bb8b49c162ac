#!/usr/bin/env python3
# Mixture-of-experts models against llama.cpp (tests/ref/moe_greedy32.tsv, README section 6):
# make_moe_gguf.py writes the four random-weight layouts (Mixtral's llama, qwen2moe with its
# shared expert, qwen3moe, olmoe) with the `gguf` package - each file's sha256 must be the one
# llama.cpp ran on - then for each of 4 prompts:
#   - `llsrv generate` on the CPU: the 32 greedy ids equal llama.cpp's, all of them (F32
#     weights; llsrv sums in llama.cpp's AVX2 order, expert products in mul_mat_id's);
#   - the 5 largest logits after the prompt: the same ids, values within 1e-3 (printed: the
#     largest difference seen; the reference build is GGML_NATIVE on an AVX-512 machine, whose
#     F32 dot products sum in 16 lanes where llsrv keeps the AVX2 order: up to ~2e-4 here);
#   - converted to Q8_0 (`llsrv convert`, the 3-D expert stacks too): the same first id (random
#     weights make later ids sensitive: 3 of 16 pairs part within 4 ids);
#   - on the OpenCL device (PoCL, or $LL_TEST_OPENCL_DEVICE; reference tier): the same 32 ids
#     as the CPU, the device named on stderr (a silent CPU fallback would compare the CPU
#     with itself).
# Then with each layout's random LoRA adapter on attention and on every expert (make_moe_gguf.py's
# moe-<layout>-lora.gguf, 3-D ffn_*_exps lora_a/lora_b; tests/ref/moe_lora_greedy32.tsv, README
# section 7): `llsrv generate --adapter` gives llama.cpp's 32 ids and its top-5 logits within
# 1e-3 on the CPU, and the CPU's ids on the OpenCL device.
# The gguf and numpy packages come from a venv the test makes once under the build directory
# (LL_BINARY_DIR/pyvenv-gguf).
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile

BUILD = os.path.abspath(os.environ.get("LL_BINARY_DIR", "build"))
SRC = os.path.abspath(os.environ.get("LL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
VENV = os.path.join(BUILD, "pyvenv-gguf")
VPY = os.path.join(VENV, "bin", "python")
PKGS = ["gguf>=0.10", "numpy>=1.24"]


def ensure_venv():
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    os.makedirs(BUILD, exist_ok=True)
    with open(os.path.join(BUILD, "pyvenv-gguf.lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        probe = [VPY, "-c", "import gguf, numpy"]
        if not (os.path.exists(VPY) and subprocess.run(probe, capture_output=True).returncode == 0):
            print("-- making the test venv %s (%s)" % (VENV, ", ".join(PKGS)), flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
            r = subprocess.run([VPY, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + PKGS)
            if r.returncode != 0 or subprocess.run(probe).returncode != 0:
                print("FAILED: cannot install %s into %s (pip needs PyPI)" % (PKGS, VENV), flush=True)
                sys.exit(1)
    os.execv(VPY, [VPY, "-u"] + sys.argv)


ensure_venv()

LLSRV = os.path.join(BUILD, "server", "llsrv")
DEV = os.environ.get("LL_TEST_OPENCL_DEVICE", "opencl:0:0")
failed = passed = 0


def check(ok, what):
    global failed, passed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + what, flush=True)


def generate(model, prompt, device, n, extra=()):
    r = subprocess.run([LLSRV, "generate", "--model", model, "-p", prompt, "--no-bos", "--ids", "-n", str(n), "--temp", "0", "-t", "1",
                        "--device", device] + list(extra), capture_output=True, text=True, timeout=600)
    return r


def main():
    rows = []
    with open(os.path.join(SRC, "tests", "ref", "moe_greedy32.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            layout, sha, idx, prompt, gen, top = line.rstrip("\n").split("\t")
            rows.append((layout, sha, int(idx), prompt, gen.split(), top.split()))
    tmp = tempfile.mkdtemp()
    os.environ["XDG_STATE_HOME"] = tmp  # the OpenCL binary cache goes here
    layouts = sorted(set(r[0] for r in rows))
    subprocess.run([sys.executable, os.path.join(SRC, "tests", "scripts", "make_moe_gguf.py"), tmp] + layouts, check=True)
    worst = 0.0
    for layout, sha, idx, prompt, want, top in rows:
        model = os.path.join(tmp, "moe-%s.gguf" % layout)
        with open(model, "rb") as f:
            got_sha = hashlib.sha256(f.read()).hexdigest()
        check(got_sha == sha, "%s: the written model's sha256 %s is not the reference's %s (gguf or numpy wrote other bytes)" % (layout, got_sha, sha))
        if got_sha != sha:
            continue
        r = generate(model, prompt, "cpu", len(want))
        got = r.stdout.split()
        same = 0
        while same < min(len(got), len(want)) and got[same] == want[same]:
            same += 1
        print("%-9s prompt %d (%d ids): %d/%d greedy ids equal llama.cpp's" % (layout, idx, len(prompt.split()), same, len(want)), flush=True)
        check(got == want, "%s prompt %d: ids differ from llama.cpp's at %d: %s vs %s (%s)" % (layout, idx, same, got, want, r.stderr.strip()[-300:]))
        r = generate(model, prompt, "cpu", 1, ["--dump-logits", "5"])
        tl = [l for l in r.stderr.splitlines() if l.startswith("top_logits:")]
        check(len(tl) == 1, "%s prompt %d: no top_logits line: %s" % (layout, idx, r.stderr[-300:]))
        if tl:
            ours = [p.split(":") for p in tl[0].split()[1:]]
            ref = [p.split(":") for p in top]
            check([o[0] for o in ours] == [x[0] for x in ref], "%s prompt %d: top-5 ids %s vs llama.cpp's %s" % (layout, idx, ours, ref))
            d = max(abs(float(o[1]) - float(x[1])) for o, x in zip(ours, ref))
            worst = max(worst, d)
            print("%-9s prompt %d: top-5 logits within %.2g of llama.cpp's" % (layout, idx, d), flush=True)
            check(d <= 1e-3, "%s prompt %d: top-5 logits differ from llama.cpp's by %g" % (layout, idx, d))
        # Q8_0 experts (llsrv convert quantizes the 3-D stacks): the same first greedy ids
        q8 = os.path.join(tmp, "moe-%s-q8_0.ckpt" % layout)
        if not os.path.exists(q8):
            c = subprocess.run([LLSRV, "convert", model, q8, "--quant", "q8_0"], capture_output=True, text=True)
            check(c.returncode == 0 and "q8_0" in c.stderr, "%s: convert --quant q8_0: %s" % (layout, c.stderr[-300:]))
            # the experts are most of the bytes: quantized, the file is well under half the F32 one
            check(os.path.getsize(q8) < 0.45 * os.path.getsize(model), "%s: the Q8_0 file is %d bytes of the F32 one's %d (experts not quantized?)" %
                  (layout, os.path.getsize(q8), os.path.getsize(model)))
        r = generate(q8, prompt, "cpu", 1)
        check(r.stdout.split() == want[:1], "%s prompt %d: Q8_0's first id %s, F32's %s" % (layout, idx, r.stdout.split(), want[:1]))
        r = generate(model, prompt, DEV, len(want))
        dev_line = [l for l in r.stderr.splitlines() if l.startswith("llsrv generate: device")]
        check(bool(dev_line) and dev_line[0].startswith("llsrv generate: device opencl"),
              "%s prompt %d: %s did not run on OpenCL: %s" % (layout, idx, DEV, r.stderr.strip()[-300:]))
        check(r.stdout.split() == got, "%s prompt %d: OpenCL ids %s differ from the CPU's %s" % (layout, idx, r.stdout.split(), got))
    print("largest top-5 logit difference from llama.cpp: %g" % worst)
    worst = 0.0
    with open(os.path.join(SRC, "tests", "ref", "moe_lora_greedy32.tsv")) as f:
        lrows = [l.rstrip("\n").split("\t") for l in f if l.strip() and not l.startswith("#")]
    for layout, msha, asha, idx, prompt, gen, top in lrows:
        model, adapter = os.path.join(tmp, "moe-%s.gguf" % layout), os.path.join(tmp, "moe-%s-lora.gguf" % layout)
        with open(adapter, "rb") as f:
            got_sha = hashlib.sha256(f.read()).hexdigest()
        check(got_sha == asha, "%s: the written adapter's sha256 %s is not the reference's %s" % (layout, got_sha, asha))
        if got_sha != asha:
            continue
        want, top = gen.split(), top.split()
        r = generate(model, prompt, "cpu", len(want), ["--adapter", adapter])
        got = r.stdout.split()
        same = 0
        while same < min(len(got), len(want)) and got[same] == want[same]:
            same += 1
        print("%-9s + expert adapter, prompt %s: %d/%d greedy ids equal llama.cpp's" % (layout, idx, same, len(want)), flush=True)
        check(got == want, "%s + adapter prompt %s: ids differ from llama.cpp's at %d: %s vs %s (%s)" % (layout, idx, same, got, want, r.stderr.strip()[-300:]))
        r = generate(model, prompt, "cpu", 1, ["--adapter", adapter, "--dump-logits", "5"])
        tl = [l for l in r.stderr.splitlines() if l.startswith("top_logits:")]
        check(len(tl) == 1, "%s + adapter prompt %s: no top_logits line: %s" % (layout, idx, r.stderr[-300:]))
        if tl:
            ours = [p.split(":") for p in tl[0].split()[1:]]
            ref = [p.split(":") for p in top]
            check([o[0] for o in ours] == [x[0] for x in ref], "%s + adapter prompt %s: top-5 ids %s vs llama.cpp's %s" % (layout, idx, ours, ref))
            d = max(abs(float(o[1]) - float(x[1])) for o, x in zip(ours, ref))
            worst = max(worst, d)
            check(d <= 1e-3, "%s + adapter prompt %s: top-5 logits differ from llama.cpp's by %g" % (layout, idx, d))
        if idx == "0":  # the device path of the experts' adapters (its own buffers, axpy): one prompt per layout
            r = generate(model, prompt, DEV, len(want), ["--adapter", adapter])
            check(r.returncode == 0 and r.stdout.split() == got,
                  "%s + adapter prompt %s: OpenCL ids %s differ from the CPU's %s (%s)" % (layout, idx, r.stdout.split(), got, r.stderr.strip()[-300:]))
    print("with adapters on the experts: largest top-5 logit difference from llama.cpp: %g" % worst)
    subprocess.run(["rm", "-rf", tmp])
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
