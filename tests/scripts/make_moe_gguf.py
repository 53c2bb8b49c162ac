#!/usr/bin/env python3
# Writes small random-weight mixture-of-experts GGUFs, one per layout llsrv serves, with the
# `gguf` package (the format's reference writer, PyPI). Tensor names, shapes and metadata keys
# are those llama.cpp's convert_hf_to_gguf.py writes for Mixtral (arch "llama" with
# ffn_gate_inp + 3-D ffn_*_exps), Qwen2-MoE (a shared expert with its own sigmoid gate),
# Qwen3-MoE (per-head q/k norms, expert_feed_forward_length) and OLMoE (whole-row q/k norms).
# The tokenizer is "none" with <arch>.vocab_size (llama.cpp then takes ids only; so does llsrv).
# Weights: F32 from numpy's legacy RandomState (its streams are frozen across numpy versions),
# so the same seed writes the same bytes; tests/ref/README.md records each file's sha256.
# Beside each model, moe-<layout>-lora.gguf: a random LoRA adapter on attn_q, attn_v and every
# expert's gate, up and down (the 3-D ffn_*_exps lora_a / lora_b tensors of llama.cpp's GGUF
# LoRA layout) - qwen2moe's also on its shared expert's ffn_{gate,up,down}_shexp (2-D) -, rank 4,
# alpha 8.
#
#   make_moe_gguf.py OUTDIR [layout...]     (layouts: mixtral qwen2moe qwen3moe olmoe; default all)
import os
import sys

import numpy as np
import gguf

LAYOUTS = {
    # name: arch, dims, experts, extras
    "mixtral": dict(arch="llama", C=64, L=2, H=4, Hkv=2, F=96, E=4, k=2, V=256, seed=1),
    "qwen2moe": dict(arch="qwen2moe", C=64, L=2, H=4, Hkv=2, F=128, Fe=64, Fs=128, E=4, k=2, V=256, seed=2, qkv_bias=True),
    "qwen3moe": dict(arch="qwen3moe", C=64, L=2, H=4, Hkv=2, F=128, Fe=48, E=8, k=2, V=256, seed=3, qk_norm="head"),
    "olmoe": dict(arch="olmoe", C=64, L=2, H=4, Hkv=4, F=36, E=8, k=2, V=256, seed=4, qk_norm="row"),
}


def write(path, name):
    c = LAYOUTS[name]
    rs = np.random.RandomState(c["seed"])
    C, L, H, Hkv, V, E = c["C"], c["L"], c["H"], c["Hkv"], c["V"], c["E"]
    hd = C // H
    kvd = hd * Hkv
    Fe = c.get("Fe", c["F"])

    def mat(n, k, scale=None):  # (n rows, k columns): GGUF ne = {k, n}
        s = scale if scale is not None else 1.0 / np.sqrt(k)
        return (rs.standard_normal((n, k)) * s).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rs.standard_normal(n)).astype(np.float32)

    arch = c["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name("llsrv-moe-test-" + name)
    w.add_context_length(256)
    w.add_embedding_length(C)
    w.add_block_count(L)
    w.add_feed_forward_length(c["F"])
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(E)
    w.add_expert_used_count(c["k"])
    if arch == "llama":
        w.add_rope_dimension_count(hd)  # Mixtral's converter (LlamaModel) writes it
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(Fe)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c["Fs"])
    if arch == "qwen3moe":
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(V)
    w.add_tokenizer_model("none")

    w.add_tensor("token_embd.weight", mat(V, C, 1.0))
    w.add_tensor("output_norm.weight", norm(C))
    w.add_tensor("output.weight", mat(V, C))
    for l in range(L):
        p = "blk.%d." % l
        w.add_tensor(p + "attn_norm.weight", norm(C))
        w.add_tensor(p + "attn_q.weight", mat(C, C))
        w.add_tensor(p + "attn_k.weight", mat(kvd, C))
        w.add_tensor(p + "attn_v.weight", mat(kvd, C))
        if c.get("qkv_bias"):
            w.add_tensor(p + "attn_q.bias", (0.1 * rs.standard_normal(C)).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (0.1 * rs.standard_normal(kvd)).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (0.1 * rs.standard_normal(kvd)).astype(np.float32))
        if c.get("qk_norm") == "head":
            w.add_tensor(p + "attn_q_norm.weight", norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        elif c.get("qk_norm") == "row":
            w.add_tensor(p + "attn_q_norm.weight", norm(C))
            w.add_tensor(p + "attn_k_norm.weight", norm(kvd))
        w.add_tensor(p + "attn_output.weight", mat(C, C))
        w.add_tensor(p + "ffn_norm.weight", norm(C))
        # the router a little sharper than the rest, so that routes are decided by margins
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, C, 2.0 / np.sqrt(C)))
        # (E, N, K) arrays: ne = {K, N, E}, one (N, K) matrix per expert
        w.add_tensor(p + "ffn_gate_exps.weight", np.stack([mat(Fe, C) for _ in range(E)]))
        w.add_tensor(p + "ffn_up_exps.weight", np.stack([mat(Fe, C) for _ in range(E)]))
        w.add_tensor(p + "ffn_down_exps.weight", np.stack([mat(C, Fe) for _ in range(E)]))
        if arch == "qwen2moe":
            Fs = c["Fs"]
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rs.standard_normal(C) / np.sqrt(C)).astype(np.float32))
            w.add_tensor(p + "ffn_gate_shexp.weight", mat(Fs, C))
            w.add_tensor(p + "ffn_up_shexp.weight", mat(Fs, C))
            w.add_tensor(p + "ffn_down_shexp.weight", mat(C, Fs))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_lora(path, name):
    c = LAYOUTS[name]
    rs = np.random.RandomState(100 + c["seed"])
    C, L, E, r = c["C"], c["L"], c["E"], 4
    Fe = c.get("Fe", c["F"])
    w = gguf.GGUFWriter(path, c["arch"])
    w.add_name("llsrv-moe-test-%s-lora" % name)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 8.0)

    def ab(n_in, n_out, e=None):  # lora_a (r, in) and lora_b (out, r) as numpy arrays: ne {in, r}, {r, out}
        shape_a, shape_b = ((r, n_in), (n_out, r)) if e is None else ((e, r, n_in), (e, n_out, r))
        a = (rs.standard_normal(shape_a) / np.sqrt(n_in)).astype(np.float32)
        b = (rs.standard_normal(shape_b) * 0.5 / np.sqrt(r)).astype(np.float32)
        return a, b

    for l in range(L):
        p = "blk.%d." % l
        for stem, n_in, n_out, e in (("attn_q", C, C, None), ("attn_v", C, C // c["H"] * c["Hkv"], None), ("ffn_gate_exps", C, Fe, E),
                                     ("ffn_up_exps", C, Fe, E), ("ffn_down_exps", Fe, C, E)):
            a, b = ab(n_in, n_out, e)
            w.add_tensor(p + stem + ".weight.lora_a", a)
            w.add_tensor(p + stem + ".weight.lora_b", b)
    if c["arch"] == "qwen2moe":  # the shared expert's gate, up, down too (2-D pairs), drawn after the others
        Fs = c["Fs"]
        for l in range(L):
            p = "blk.%d." % l
            for stem, n_in, n_out in (("ffn_gate_shexp", C, Fs), ("ffn_up_shexp", C, Fs), ("ffn_down_shexp", Fs, C)):
                a, b = ab(n_in, n_out)
                w.add_tensor(p + stem + ".weight.lora_a", a)
                w.add_tensor(p + stem + ".weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) < 2:
        print(__doc__ or "usage: make_moe_gguf.py OUTDIR [layout...]", file=sys.stderr)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[2:] or list(LAYOUTS):
        if name not in LAYOUTS:
            print("unknown layout %s (%s)" % (name, ", ".join(LAYOUTS)), file=sys.stderr)
            sys.exit(2)
        write(os.path.join(out, "moe-%s.gguf" % name), name)
        write_lora(os.path.join(out, "moe-%s-lora.gguf" % name), name)


if __name__ == "__main__":
    main()
