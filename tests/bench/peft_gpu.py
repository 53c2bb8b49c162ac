#!/usr/bin/env python3
# peft_gpu.py - the PyTorch peer of issue 30's GPU training figures (tests/bench/gpu_train.sh):
# a Llama of a given shape built from transformers.LlamaConfig (random weights, as llsrv's
# same-shape models there are: no download), trained on a GPU with
#   --mode lora: PEFT LoRA r 16, alpha 32, dropout 0 on all seven targets, the base in --dtype
#                (bf16 or fp32), AdamW lr 1e-4, gradient clip 1 - as `llsrv train`'s LoRA;
#   --mode full: every weight in fp32 with bf16 autocast, AdamW - as `llsrv train --mode full`.
# Sequences of random token ids (speed does not depend on the text), batch --batch, timed with
# torch.cuda.synchronize() around the steps after the warm-up. For benchmarks only: PyTorch is
# never a dependency of the project or its test suite.
#
#   python3 peft_gpu.py --dims 576,30,9,3,1536,2048 --vocab 49152 --mode lora --dtype bf16 \
#       [--batch 1] [--seq-len 256] [--steps 30] [--warmup 5] [--device cuda] [--untied]
#
# --dims: DIM,LAYERS,HEADS,KV_HEADS,FFN,CTX as `llsrv init --dims`. Prints one line of JSON:
# train tokens/s, peak GPU memory (torch.cuda.max_memory_allocated), losses.
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--dims", required=True)
ap.add_argument("--vocab", type=int, required=True)
ap.add_argument("--mode", choices=("lora", "full"), default="lora")
ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--device", default="cuda")
ap.add_argument("--untied", action="store_true", help="a separate output head (llsrv init ties it)")
a = ap.parse_args()

dim, n_layers, n_heads, n_kv, ffn, ctx = (int(x) for x in a.dims.split(","))
if a.seq_len > ctx:
    raise SystemExit("peft_gpu.py: --seq-len %d over the shape's context %d" % (a.seq_len, ctx))
dev = torch.device(a.device)
cuda = dev.type == "cuda"
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=n_layers,
                  num_attention_heads=n_heads, num_key_value_heads=n_kv, max_position_embeddings=ctx,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=not a.untied)
lora = a.mode == "lora"
dtype = torch.bfloat16 if (lora and a.dtype == "bf16") else torch.float32
model = LlamaForCausalLM(cfg).to(device=dev, dtype=dtype)
if lora:
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
params = [p for p in model.parameters() if p.requires_grad]
n_train = sum(p.numel() for p in params)
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0 if lora else 0.01)
g = torch.Generator().manual_seed(1)
batches = [torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g).to(dev) for _ in range(8)]
autocast = (not lora) and a.dtype == "bf16"


def sync():
    if cuda:
        torch.cuda.synchronize()


model.train()
losses = []
if cuda:
    torch.cuda.reset_peak_memory_stats()
t0 = None
for step in range(a.steps):
    if step == a.warmup:
        sync()
        t0 = time.time()
    x = batches[step % len(batches)]
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.detach())
sync()
dt = time.time() - t0
print(json.dumps({
    "peer": "pytorch %s%s" % (torch.__version__, " + peft" if lora else ""),
    "device": torch.cuda.get_device_name(dev) if cuda else "cpu", "mode": a.mode,
    "dtype": a.dtype + (" autocast" if autocast else ""), "dims": a.dims, "vocab": a.vocab, "batch": a.batch, "seq_len": a.seq_len,
    "steps": a.steps, "warmup": a.warmup, "trained_params": n_train,
    "train_tok_s": round((a.steps - a.warmup) * a.batch * a.seq_len / dt, 1),
    "peak_mem_mib": round(torch.cuda.max_memory_allocated(dev) / 1048576.0, 1) if cuda else None,
    "loss_first": round(float(losses[0]), 4), "loss_last": round(float(losses[-1]), 4),
}), flush=True)
