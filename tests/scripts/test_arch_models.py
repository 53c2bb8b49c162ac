#!/usr/bin/env python3
"""Qwen3, Phi-3 and Mistral (llama + attention.sliding_window) against llama.cpp: the small random
models tests/scripts/make_arch_models.py writes (with the gguf package, in a venv made once under
the build directory: LL_BINARY_DIR/pyvenv-gguf) must be the bytes llama.cpp's references were made
from (sha256), and the engine's greedy ids on each prompt of tests/ref/archs_prompts.ids must be
llama.cpp's, every one (test_arch_ref --exact; F32 weights: the same sums as ggml's)."""
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
PKGS = ["gguf==0.19.0", "numpy>=1.26"]
# sha256 of the files llama.cpp's reference ids (tests/ref/archs_*_greedy64.tsv) were made from
SHA = {
    "qwen3": "a47a384b70e6315c87fefea5e38ab797f6f54f686cc4d0dba4d394cd79b4f323",
    "phi3": "165c79f4982a1deaf018b018f104e92ece47588c6cd106934930e292c6a4dfa4",
    "mistral": "258f5295e07f4c1a64dfd8be9a7a5570d08a277a03e7d8ee69c579f63ac1f3bf",
    "phi3_longrope": "c01d5818ffd9077f42927e4533837a815713b8a4a51927cd45d2438179e26f77",  # n_ctx 512: the short factors
}


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
passed = failed = 0
with tempfile.TemporaryDirectory(prefix="llsrv-archs-") as tmp:
    subprocess.run([sys.executable, os.path.join(SRC, "tests/scripts/make_arch_models.py"), tmp], check=True, capture_output=True)
    for name, sha in SHA.items():
        path = os.path.join(tmp, name + ".gguf")
        got = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if got != sha:
            print(f"FAIL: {name}.gguf has sha256 {got}, not the bytes the reference was made from ({sha})")
            failed += 1
            continue
        ref = os.path.join(SRC, f"tests/ref/archs_{name}_greedy64.tsv")
        r = subprocess.run([os.path.join(BUILD, "tests/test_arch_ref"), path, ref, "--exact", "--min-tf", "1.0"], capture_output=True, text=True)
        print(f"== {name}\n{r.stdout}{r.stderr}", end="")
        if r.returncode == 0:
            passed += 1
        else:
            failed += 1
            print(f"FAIL: {name}")
    # LoRA adapters: on qwen3 (q's B is (128, r): the q width, not C) and on phi3 (written as
    # llama.cpp names them: attn_qkv with q, k, v's B rows stacked under one A, ffn_up with gate's
    # and up's): llama.cpp --lora's ids, every one.
    for arch, sha in (("qwen3", "d14dbd29dd0e14180b3be59546c7a05cc3edb83920bbcb49231cd5697435c19e"),
                      ("phi3", "100567fc6f1fdfaf3e4ba9fa4e3e2e1d41812e7eff00fb62b0a3ba4777d6b1c2")):
        ad = os.path.join(tmp, f"{arch}-lora.gguf")
        r = subprocess.run([os.path.join(BUILD, "tests/test_lora"), "--make-adapter", os.path.join(tmp, f"{arch}.gguf"), ad, "4", "8", "7", "0.05"],
                           capture_output=True, text=True)
        got = hashlib.sha256(open(ad, "rb").read()).hexdigest() if r.returncode == 0 else r.stderr
        if got != sha:
            print(f"FAIL: the {arch} adapter is not the reference's bytes: {got}")
            failed += 1
        else:
            r = subprocess.run([os.path.join(BUILD, "tests/test_arch_ref"), os.path.join(tmp, f"{arch}.gguf"),
                                os.path.join(SRC, f"tests/ref/archs_{arch}_lora_greedy64.tsv"), "--exact", "--min-tf", "1.0", "--adapter", ad],
                               capture_output=True, text=True)
            print(f"== {arch} + LoRA\n{r.stdout}{r.stderr}", end="")
            passed, failed = passed + (r.returncode == 0), failed + (r.returncode != 0)
            # merged into the base (phi3: into row slices of attn_qkv and ffn_up): llama.cpp's
            # argmaxes with the adapter (W + s·B·A rounds otherwise than W·x + s·B(A·x): >= 99%)
            merged = os.path.join(tmp, f"{arch}-merged.gguf")
            r = subprocess.run([os.path.join(BUILD, "server/llsrv"), "export", "--model", os.path.join(tmp, f"{arch}.gguf"), "--merge", ad, merged],
                               capture_output=True, text=True)
            if r.returncode == 0:
                r = subprocess.run([os.path.join(BUILD, "tests/test_arch_ref"), merged, os.path.join(SRC, f"tests/ref/archs_{arch}_lora_greedy64.tsv"),
                                    "--min-tf", "0.99"], capture_output=True, text=True)
            print(f"== {arch} + LoRA merged\n{r.stdout}{r.stderr}", end="")
            passed, failed = passed + (r.returncode == 0), failed + (r.returncode != 0)
    # Phi-3's LongRoPE: at n_ctx 1024 (above rope.scaling.original_context_length 512) llama.cpp
    # takes rope_factors_long: its ids there, every one (the short factors give other ids: the
    # choice matters); the same on the OpenCL fast tier (PoCL: rope and the KV store fused,
    # agreement >= 99%); LoRA and full training through the long factors and the attention
    # factor (gradient against finite differences, loss falls); a factor of 0 is refused.
    lr, lr_ref = os.path.join(tmp, "phi3_longrope.gguf"), os.path.join(SRC, "tests/ref/archs_phi3_longrope_ctx1024_greedy64.tsv")
    for what, cmd in (("n_ctx 1024: the long factors", [lr, lr_ref, "--ctx", "1024", "--exact", "--min-tf", "1.0"]),
                      ("n_ctx 1024 on OpenCL", [lr, lr_ref, "--ctx", "1024", "--device", "opencl:0:0", "--min-tf", "0.99"])):
        r = subprocess.run([os.path.join(BUILD, "tests/test_arch_ref")] + cmd, capture_output=True, text=True)
        print(f"== phi3 LongRoPE, {what}\n{r.stdout}{r.stderr}", end="")
        passed, failed = passed + (r.returncode == 0), failed + (r.returncode != 0)
    r = subprocess.run([os.path.join(BUILD, "tests/test_arch_ref"), lr, lr_ref, "--ctx", "512"], capture_output=True, text=True)
    ok = r.returncode != 0 and "agreement" in r.stdout
    print(("ok" if ok else "FAIL") + ": the short factors (n_ctx 512) miss the long factors' reference: " +
          " ".join(l for l in r.stdout.splitlines() if "agreement" in l))
    passed, failed = passed + ok, failed + (not ok)
    r = subprocess.run([os.path.join(BUILD, "tests/test_arch_train"), lr, "--ctx", "1024"], capture_output=True, text=True)
    print(f"== phi3 LongRoPE training (long factors)\n{r.stdout}{r.stderr}", end="")
    passed, failed = passed + (r.returncode == 0), failed + (r.returncode != 0)
    import gguf  # the venv's
    t = next(t for t in gguf.GGUFReader(lr).tensors if t.name == "rope_factors_long.weight")
    data = bytearray(open(lr, "rb").read())
    data[t.data_offset + 12:t.data_offset + 16] = b"\0\0\0\0"
    bad = os.path.join(tmp, "phi3_longrope_bad.gguf")
    open(bad, "wb").write(data)
    r = subprocess.run([os.path.join(BUILD, "server/llsrv"), "generate", "--model", bad, "-p", "1 2", "-n", "1", "--no-bos"], capture_output=True, text=True)
    ok = r.returncode != 0 and "rope_factors_long.weight[3] = 0 is not a positive factor" in r.stderr
    print(("ok" if ok else "FAIL") + f": a LongRoPE factor of 0 refused: {r.stderr.strip()}")
    passed, failed = passed + ok, failed + (not ok)
    # LoRA training: gradient against finite differences (qwen3: the q/k norms' backward; phi3:
    # through the fused matrices' row slices, and the shared A of a fused module), loss falls;
    # phi3's validation loss falls and its exported adapter has llama.cpp's fused names.
    # phi3 on OpenCL (PoCL here): the same training there, its validation losses the CPU's.
    # gemma3: GeGLU, post-norms, embedding scale, local layers' RoPE base (tests/test_arch_train.c);
    # full-parameter too (each new weight gradient against finite differences, the checkpoint
    # served); on OpenCL both tiers' LoRA and full training past the window against the CPU's.
    for arch, dev in (("qwen3", []), ("phi3", []), ("phi3", ["opencl:0:0"]), ("gemma3", []), ("gemma3", ["opencl:0:0"])):
        r = subprocess.run([os.path.join(BUILD, "tests/test_arch_train"), os.path.join(tmp, f"{arch}.gguf")] + dev, capture_output=True, text=True)
        print(f"== {arch} LoRA training {' '.join(dev)}\n{r.stdout}{r.stderr}", end="")
        passed, failed = passed + (r.returncode == 0), failed + (r.returncode != 0)
    # Mistral's sliding window, exercised: with a window of 8 over 45 positions the greedy ids
    # change (against the 512 window), and the CPU and the OpenCL reference tier (PoCL) agree.
    P = " ".join(str(100 + i) for i in range(21))
    outs = {}
    for f in ("mistral", "mistral_w8"):
        for d in ("cpu", "opencl:0:0"):
            r = subprocess.run([os.path.join(BUILD, "server/llsrv"), "generate", "--model", os.path.join(tmp, f + ".gguf"), "--device", d, "-p", P,
                                "--no-bos", "-n", "24", "--temp", "0", "--ids"], capture_output=True, text=True, env=dict(os.environ, LL_OPENCL_REFERENCE="1"))
            outs[f, d] = r.stdout.split() if r.returncode == 0 else r.stderr
    ok = len(outs["mistral_w8", "cpu"]) == 24 and outs["mistral_w8", "cpu"] == outs["mistral_w8", "opencl:0:0"] and \
        outs["mistral", "cpu"] == outs["mistral", "opencl:0:0"] and outs["mistral_w8", "cpu"] != outs["mistral", "cpu"]
    print(("ok" if ok else "FAIL") + f": sliding window 8 (CPU {outs['mistral_w8', 'cpu']}, OpenCL {outs['mistral_w8', 'opencl:0:0']}) "
          f"differs from window 512 (CPU {outs['mistral', 'cpu']}, OpenCL {outs['mistral', 'opencl:0:0']})")
    passed, failed = passed + ok, failed + (not ok)
    # llsrv plan sizes the KV cache by the head width the engine uses (key_length 32, not C / H = 16):
    # 2 (k, v) x 4 layers x 2048 positions x 8 sequences x 64 (2 kv heads of 32) x 2 bytes = 16 MiB.
    r = subprocess.run([os.path.join(BUILD, "server/llsrv"), "plan", "--model", os.path.join(tmp, "qwen3.gguf"), "--device", "cpu",
                        "--ctx", "2048", "--parallel", "8"], capture_output=True, text=True)
    ok = r.returncode == 0 and any("KV cache" in l and " 16.0 MiB" in l for l in r.stdout.splitlines())
    print(("ok" if ok else "FAIL") + ": plan's KV cache for qwen3 (16.0 MiB): " + " ".join(l.strip() for l in r.stdout.splitlines() if "KV cache" in l) + r.stderr.strip())
    passed, failed = passed + ok, failed + (not ok)
    # An unknown architecture is refused, naming it and the supported ones.
    bad = os.path.join(tmp, "bad.gguf")
    data = open(os.path.join(tmp, "mistral.gguf"), "rb").read().replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00lxama", 1)
    data = data.replace(b"llama.", b"lxama.")
    open(bad, "wb").write(data)
    r = subprocess.run([os.path.join(BUILD, "server/llsrv"), "generate", "--model", bad, "-p", "1 2", "-n", "1"], capture_output=True, text=True)
    ok = r.returncode != 0 and "'lxama' is not supported" in r.stderr and "gemma3" in r.stderr and "qwen3" in r.stderr
    print(("ok" if ok else "FAIL") + f": unknown architecture refused: {r.stderr.strip()}")
    passed, failed = passed + ok, failed + (not ok)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
