#!/usr/bin/env python3
# peft_train.py - the peer of `llsrv train` in tests/bench/train_vs_peft.sh: PyTorch + PEFT LoRA
# fine-tuning of the same GGUF model (transformers dequantizes it to fp32 with gguf_file=), the
# same hyperparameters (r 16, alpha 32, dropout 0, all seven targets, AdamW, clip 1, batch 1),
# on the same text files, with `--threads` intra-op threads. For benchmarks only: PyTorch is
# never a dependency of the project or its test suite.
#
#   python peft_train.py --gguf DIR/model.gguf --data FILE... [--seq-len 256] [--steps 30] [--warmup 3] [--threads 2]
#
# Prints one line of JSON: train tokens/s over the steps after the warm-up, forward-only tokens/s
# over the same sequences, losses, and the process's peak resident memory.
import argparse
import json
import os
import resource
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--gguf", required=True)
ap.add_argument("--data", nargs="+", required=True)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--lr", type=float, default=1e-4)
a = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(a.threads)
d, f = os.path.split(os.path.abspath(a.gguf))
t0 = time.time()
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
load_s = time.time() - t0
cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
model = get_peft_model(model, cfg)
n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)

text = "".join(open(p, encoding="utf-8", errors="replace").read() + "\n" for p in a.data)
ids = tok(text, return_tensors="pt")["input_ids"][0]
S = a.seq_len
n_seq = len(ids) // S
if n_seq < 1:
    raise SystemExit("peft_train.py: %d tokens of data, fewer than one sequence of %d" % (len(ids), S))
seqs = [ids[i * S:(i + 1) * S].unsqueeze(0) for i in range(n_seq)]

opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
model.train()
losses = []
t_start = None
for step in range(a.steps):
    if step == a.warmup:
        t_start = time.time()
    x = seqs[step % n_seq]
    out = model(input_ids=x, labels=x)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(out.loss.detach().item())
train_s = time.time() - t_start
train_tps = (a.steps - a.warmup) * S / train_s

model.eval()
with torch.no_grad():
    model(input_ids=seqs[0])  # warm-up
    t0 = time.time()
    n_fwd = min(8, a.steps)
    for i in range(n_fwd):
        model(input_ids=seqs[i % n_seq])
    fwd_s = time.time() - t0
fwd_tps = n_fwd * S / fwd_s

print(json.dumps({
    "peer": "pytorch %s + transformers + peft" % torch.__version__,
    "threads": a.threads, "seq_len": S, "steps": a.steps, "warmup": a.warmup, "lora_params": n_lora,
    "train_tok_s": round(train_tps, 2), "forward_tok_s": round(fwd_tps, 2), "step_over_forward": round(fwd_tps / train_tps, 3),
    "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
    "load_s": round(load_s, 1), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
}), flush=True)
