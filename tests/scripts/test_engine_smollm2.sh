#!/usr/bin/env bash
# SmolLM2-135M-Instruct Q4_1 against llama.cpp's reference outputs (tests/ref/README.md says how
# they were made). The engine reproduces llama.cpp's CPU arithmetic bit for bit (AVX2 ggml, fa
# off, f16 KV; docs/PERFORMANCE.md "Agreement with llama.cpp"), so this asserts:
#  - prompt token ids identical to llama.cpp's (exact);
#  - the 5 largest logits after each prompt equal to the reference's 6 printed decimals
#    (|difference| <= 1e-5), the top token equal;
#  - greedy continuation: all 64 tokens identical for every prompt;
#  - perplexity on tests/ref/ppl.txt equal to llama-perplexity's 4 printed decimals (and well
#    within the issue's 0.5%);
#  - Q4_0 (llama.cpp's repacked order on x86): the file `llsrv convert --quant q4_0` makes from
#    the Q4_1 one (sha256 checked: the reference belongs to those bytes) gives llama.cpp's 64
#    greedy tokens on every prompt too (tests/ref/smollm2_q4_0_greedy64.tsv).
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
M=$LL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
REF=$LL_SOURCE_DIR/tests/ref
[ -f "$M" ] || { echo "SmolLM2 not cached (fetch_smollm2 failed?)"; echo "0 passed, 1 failed"; exit 1; }
python3 - "$LLSRV" "$M" "$REF" <<'PY'
import subprocess, sys, re
llsrv, model, ref = sys.argv[1:4]
prompts = [l.rstrip("\n").encode().decode("unicode_escape") for l in open(f"{ref}/smollm2_prompts.txt")]
rows = [l.rstrip("\n").split("\t") for l in open(f"{ref}/smollm2_greedy64.tsv")][1:]
tops = {(r[0], r[1]): r[2] for r in (l.rstrip("\n").split("\t") for l in open(f"{ref}/smollm2_logits_top5.tsv")) if r[0] != "variant"}
passed = failed = 0
def check(ok, what):
    global passed, failed
    if ok: passed += 1
    else: failed += 1; print("FAIL:", what)
for r in rows:
    if r[0] != "fa_off_f16kv": continue
    i = int(r[1]); p = prompts[i]
    d = subprocess.run([llsrv, "generate", "--model", model, "-p", p, "--temp", "0", "--dump-logits", "5", "-t", "2"],
                       capture_output=True, text=True).stderr.splitlines()
    pid = [l for l in d if l.startswith("prompt_ids:")][0].split()[1:]
    ours = [x.split(":") for x in [l for l in d if l.startswith("top_logits:")][0].split()[1:]]
    theirs = [x.split(":") for x in tops[(r[0], r[1])].split()]
    check(pid == r[2].split(), f"prompt {i}: ids {pid} != llama.cpp {r[2]}")
    check(ours[0][0] == theirs[0][0], f"prompt {i}: top token {ours[0][0]} != {theirs[0][0]}")
    diff = max(abs(float(a[1]) - float(b[1])) for a, b in zip(ours, theirs) if a[0] == b[0]) if ours[0][0] == theirs[0][0] else 99
    check(diff <= 1e-5, f"prompt {i}: top-5 logits differ by {diff:.6f} > 1e-5")
    out = subprocess.run([llsrv, "generate", "--model", model, "-p", p, "--temp", "0", "-n", "64", "--ids", "--ignore-eos", "-t", "2"],
                         capture_output=True, text=True).stdout.split()
    want = r[3].split(); n = 0
    while n < min(len(out), len(want)) and out[n] == want[n]: n += 1
    print(f"prompt {i}: {n}/64 greedy tokens identical to llama.cpp, top-5 logit max diff {diff:.4f}")
    check(n == 64, f"prompt {i}: only {n} of 64 greedy tokens identical")
# The llama-perplexity run with flash attention off (our attention follows that path), c = 128.
txt = open(f"{ref}/smollm2_ppl.txt").read()
m = re.search(r"-c 128 -b 128 -t 2 -fa off[^\n]*\n(?:[^\n]*\n)*?Final estimate: PPL = ([0-9.]+)", txt)
if m:
    out = subprocess.run([llsrv, "perplexity", "--model", model, "-f", f"{ref}/ppl.txt", "--ctx", "128", "-t", "2"],
                         capture_output=True, text=True).stdout
    ours = float(re.search(r"PPL = ([0-9.]+)", out).group(1)); theirs = float(m.group(1))
    print(f"perplexity (ctx 128): ours {ours:.4f}, llama-perplexity (fa off) {theirs:.4f}, ratio {ours/theirs:.5f}")
    check(abs(ours - theirs) <= 0.00015, f"perplexity {ours} vs {theirs}: not llama-perplexity's value")
else:
    check(False, "tests/ref/smollm2_ppl.txt lacks the -c 128 -fa off run")
# Q4_0: convert (Q4_1 -> dequantize -> Q4_0, deterministic) to .ckpt and back to GGUF.
import hashlib, os, tempfile
with tempfile.TemporaryDirectory() as td:
    ck, gg = os.path.join(td, "q4_0.ckpt"), os.path.join(td, "q4_0.gguf")
    rc = subprocess.run([llsrv, "convert", model, ck, "--quant", "q4_0"], capture_output=True).returncode
    rc = rc or subprocess.run([llsrv, "convert", ck, gg], capture_output=True).returncode
    check(rc == 0, "llsrv convert to Q4_0 failed")
    digest = hashlib.sha256(open(gg, "rb").read()).hexdigest() if rc == 0 else ""
    want_sha = "dc51cbdc90dfb5c74a00a173bbc5ff4609f0df10a2a535040d484246c347da16"
    check(digest == want_sha, f"converted Q4_0 file sha256 {digest} != {want_sha} (the reference's file)")
    for r in [l.rstrip("\n").split("\t") for l in open(f"{ref}/smollm2_q4_0_greedy64.tsv")][1:]:
        i = int(r[1])
        out = subprocess.run([llsrv, "generate", "--model", gg, "-p", prompts[i], "--temp", "0", "-n", "64", "--ids", "--ignore-eos", "-t", "2"],
                             capture_output=True, text=True).stdout.split()
        want = r[3].split(); n = 0
        while n < min(len(out), len(want)) and out[n] == want[n]: n += 1
        print(f"Q4_0 prompt {i}: {n}/64 greedy tokens identical to llama.cpp")
        check(n == 64, f"Q4_0 prompt {i}: only {n} of 64 greedy tokens identical")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
