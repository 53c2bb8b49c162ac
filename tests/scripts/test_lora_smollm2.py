#!/usr/bin/env python3
# test_lora_smollm2.py - SmolLM2-135M Q4_1 with a LoRA adapter against llama.cpp --lora.
# The adapter is made deterministically by `test_lora --make-adapter` (rank 16, alpha 32, all
# seven targets, A from PEFT's init with seed 42, B uniform +-0.02 from seed 43; its sha256 is
# checked so the reference belongs to these bytes); llama.cpp 0c1e5709 (AVX2 build) loaded it
# with llama_adapter_lora_init and produced tests/ref/smollm2_lora_greedy64.tsv (README: "LoRA").
# Asserts: the adapted greedy ids (64 per prompt) equal llama.cpp's on all four prompts, they
# differ from the base model's (the adapter is not trivial), and the server's GEN adapter=NAME
# gives the same ids as generate --adapter.
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import BIN, Checker, Server, escape, lora_ids_vs_llamacpp  # noqa: E402

SHA = "c990b10beba5c0bc7062caf74044e0f88a975dfdb75f9423d546f983170737b4"
check = Checker()
src = os.environ["LL_SOURCE_DIR"]
model = os.path.join(os.environ["LL_MODEL_CACHE"], "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.path.exists(model):
    print("SmolLM2 not cached (fetch_smollm2 failed?)")
    print("0 passed, 1 failed")
    sys.exit(1)
tmp = tempfile.mkdtemp(prefix="llsrv-lora-smol-")
ad = os.path.join(tmp, "smol-lora.gguf")
subprocess.run([os.path.join(os.environ["LL_BINARY_DIR"], "tests", "test_lora"), "--make-adapter", model, ad, "16", "32", "42", "0.02"],
               check=True)
sha = hashlib.sha256(open(ad, "rb").read()).hexdigest()
check(sha == SHA, "the generated adapter is the reference's (sha256 %s)" % sha)
for i, changed in enumerate(lora_ids_vs_llamacpp(check, model, ad, "smollm2_lora_greedy64.tsv")):
    check(changed > 0, "prompt %d: the adapter changes the output" % i)
prompts = [l.rstrip("\n").encode().decode("unicode_escape") for l in open(os.path.join(src, "tests/ref/smollm2_prompts.txt"))]
# The server, adapter chosen by name, two prompts at once (one adapted, one not).
srv = Server(tmp, ["--model", model, "--parallel", "2", "--ctx", "512", "--threads", "2", "--adapter", ad])
c1, c2 = srv.conn(), srv.conn()
c1.send("GEN id=a max_tokens=32 temperature=0 ignore_eos=1 adapter=smol-lora :%s\n" % escape(prompts[0]))
c2.send("GEN id=b max_tokens=32 temperature=0 ignore_eos=1 adapter=none :%s\n" % escape(prompts[0]))
ta, ea, _ = c1.collect("a")
tb, eb, _ = c2.collect("b")
ga = subprocess.run([BIN, "generate", "--model", model, "-p", prompts[0], "--temp", "0", "-n", "32", "--ignore-eos", "-t", "2", "--ctx", "512",
                     "--adapter", ad], capture_output=True, timeout=600).stdout
gb = subprocess.run([BIN, "generate", "--model", model, "-p", prompts[0], "--temp", "0", "-n", "32", "--ignore-eos", "-t", "2", "--ctx", "512"],
                    capture_output=True, timeout=600).stdout
check(ta is not None and ta.rstrip(b"\n") == ga.rstrip(b"\n"), "server adapter=smol-lora equals generate --adapter: %r vs %r" % (ta, ga))
check(tb is not None and tb.rstrip(b"\n") == gb.rstrip(b"\n"), "server adapter=none equals the base: %r vs %r" % (tb, gb))
c1.close(), c2.close()
check(srv.stop() == 0, "SIGTERM exits 0")
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
