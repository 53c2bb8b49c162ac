#!/usr/bin/env python3
"""Small random-weight GGUF models of the dense families llsrv knows besides llama/qwen2, written
with the `gguf` package (PyPI, the format's reference writer) with the tensor names and metadata
keys llama.cpp's converter (convert_hf_to_gguf.py / conversion/*.py at 0c1e5709) writes for them:

  qwen3   - per-head q/k RMSNorm, head_dim 32 with C = 64 and 4 heads (q width 128 != C)
  phi3    - fused attn_qkv and ffn_up (gate | up rows), NeoX rope over 16 of 16 head dims
  gemma3  - GeGLU, post-attention/post-FFN norms, per-head q/k norms, head_dim 32 (q width 128),
            tied output, 6 layers (5 local with window 64 and RoPE base 10000, 1 global at 1e6);
            for LoRA training (test_arch_train; no llama.cpp reference ids)
  phi3_longrope - Phi-3 128k's LongRoPE: rope_factors_long/short.weight (8 F32 divisors of theta
            each), phi3.rope.scaling.original_context_length 512 under context_length 4096, and
            phi3.rope.scaling.attn_factor as the converter computes it (sqrt(1 + ln 8 / ln 512));
            llama.cpp takes the short factors at n_ctx 512, the long ones at n_ctx 1024
  mistral - llama with llama.attention.sliding_window (llama.cpp 0c1e5709 ignores the key; llsrv
            honours it, so the references use a window longer than any sequence of the test)

No tokenizer: tokenizer.ggml.model = "no_vocab" with <arch>.vocab_size (llama.cpp's dummy
vocabulary); prompts are token ids. Weights F32, from numpy's PCG64 with a fixed seed per model, so
the files are the same bytes on every machine (the test regenerates them; tests/ref holds
llama.cpp's greedy ids on them).

usage: make_arch_models.py OUTDIR
"""
import math
import os
import sys

import gguf
import numpy as np

V, C, L, H, HKV, F, CTX = 256, 64, 4, 4, 2, 128, 512


def writer(path, arch, ctx=CTX):
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"llsrv-test-{os.path.basename(path)[:-5]}")
    w.add_type("model")
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(V)
    w.add_context_length(ctx)
    w.add_embedding_length(C)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    return w


def mat(rng, n, k, std):  # (n rows, k columns): GGUF ne = (k, n)
    return (rng.standard_normal((n, k)) * std).astype(np.float32)


def norm(rng, n):
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def common_head(w, rng, tied):
    w.add_tensor("token_embd.weight", mat(rng, V, C, 1.0))
    w.add_tensor("output_norm.weight", norm(rng, C))
    if not tied:
        w.add_tensor("output.weight", mat(rng, V, C, 0.5))


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3(path):
    rng = np.random.Generator(np.random.PCG64(3))
    hd = 32
    w = writer(path, "qwen3")
    w.add_rope_freq_base(1000000.0)
    w.add_key_length(hd)
    w.add_value_length(hd)
    common_head(w, rng, tied=False)
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(rng, H * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(rng, HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(rng, HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(rng, C, H * hd, 0.1))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", norm(rng, hd))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", norm(rng, hd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(rng, F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, C, F, 0.1))
    finish(w)


def phi3(path):
    rng = np.random.Generator(np.random.PCG64(5))
    hd = C // H
    w = writer(path, "phi3")
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_uint32(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch="phi3"), CTX)
    common_head(w, rng, tied=False)
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.attn_qkv.weight", mat(rng, C + 2 * HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(rng, C, C, 0.1))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, 2 * F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, C, F, 0.1))
    finish(w)


def phi3_longrope(path, orig=CTX):
    rng = np.random.Generator(np.random.PCG64(13))
    hd = C // H
    ctx = 8 * orig
    w = writer(path, "phi3", ctx)
    w.add_uint32(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch="phi3"), orig)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(0)
    # conversion/phi.py generate_extra_tensors: the attention factor, then the two factor tensors
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(ctx / orig) / math.log(orig)))
    w.add_tensor("rope_factors_long.weight", (np.geomspace(1.0, 40.0, hd // 2) * (1 + 0.05 * rng.random(hd // 2))).astype(np.float32))
    w.add_tensor("rope_factors_short.weight", (1 + 0.1 * rng.random(hd // 2)).astype(np.float32))
    common_head(w, rng, tied=False)
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.attn_qkv.weight", mat(rng, C + 2 * HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(rng, C, C, 0.1))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, 2 * F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, C, F, 0.1))
    finish(w)


def mistral(path, window=CTX):
    rng = np.random.Generator(np.random.PCG64(7))
    hd = C // H
    w = writer(path, "llama")
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(window)
    common_head(w, rng, tied=False)
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(rng, C, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(rng, HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(rng, HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(rng, C, C, 0.1))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(rng, F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, C, F, 0.1))
    finish(w)


def gemma3(path):
    rng = np.random.Generator(np.random.PCG64(11))
    hd, layers = 32, 6
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("llsrv-test-gemma3")
    w.add_type("model")
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(V)
    w.add_context_length(CTX)
    w.add_embedding_length(C)
    w.add_block_count(layers)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_sliding_window(64)
    common_head(w, rng, tied=True)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(rng, H * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(rng, HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(rng, HKV * hd, C, 0.15))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(rng, C, H * hd, 0.1))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", norm(rng, hd))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", norm(rng, hd))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(rng, C))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(rng, F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, F, C, 0.15))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, C, F, 0.1))
        w.add_tensor(f"blk.{i}.post_ffw_norm.weight", norm(rng, C))
    finish(w)


MODELS = {"qwen3": qwen3, "phi3": phi3, "mistral": mistral, "gemma3": gemma3,
          "phi3_longrope": phi3_longrope,
          # the same weights with an 8-position window (no llama.cpp reference: it ignores the key)
          "mistral_w8": lambda path: mistral(path, 8)}

if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, fn in MODELS.items():
        fn(os.path.join(out, f"{name}.gguf"))
        print(os.path.join(out, f"{name}.gguf"))
