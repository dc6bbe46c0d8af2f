#!/usr/bin/env python3
"""Writes a random-weight Llama-family checkpoint in Hugging Face layout,
with numpy only: config.json plus model.safetensors, or shards
model-0000K-of-0000N.safetensors and model.safetensors.index.json.

    make_checkpoint.py OUT_DIR [--hidden 64 --heads 4 --kv-heads 2 ...]
                       [--arch llama|mistral|qwen2] [--dtype f32|f16|bf16]
                       [--tied] [--shards N] [--rope-layout top|parameters]
                       [--rope-scaling '{"rope_type": "linear", "factor": 2.0}']

The names, shapes and config keys are those transformers writes for
LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (Linear weights
[out, in]).  Weights are written one tensor at a time, so a checkpoint of
gigabytes (bench/gpu/w5_checkpoint.py) never sits in memory whole.

Weight scales keep activations near 1 through the layers (normal with std
1/sqrt(fan_in) for the projections, std 1 for the embedding, norms near 1),
so the logits of a tiny model have clear maxima and greedy decoding is a
stable thing to compare.
"""
import argparse
import json
import os
import sys

import numpy as np

ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
}
ST_DTYPE = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
TORCH_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def make_config(arch="llama", hidden=64, heads=4, kv_heads=2, head_dim=None, ffn=176, layers=2, vocab=256,
                max_pos=512, theta=10000.0, eps=1e-5, tied=False, dtype="f32", rope_layout="top",
                rope_scaling=None, attention_bias=False, mlp_bias=False, sliding_window=None):
    name, model_type = ARCHS[arch]
    cfg = {
        "architectures": [name],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": eps,
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "torch_dtype": TORCH_DTYPE[dtype],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if arch == "llama":
        cfg["attention_bias"] = attention_bias
        cfg["mlp_bias"] = mlp_bias
        cfg["pretraining_tp"] = 1
    if arch == "mistral":
        cfg["sliding_window"] = sliding_window
    if arch == "qwen2":
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = sliding_window
        cfg["max_window_layers"] = layers
    if rope_layout == "parameters":
        rp = {"rope_type": "default", "rope_theta": theta}
        if rope_scaling:
            rp.update({k: v for k, v in rope_scaling.items() if k != "type"})
            rp["rope_type"] = rope_scaling.get("rope_type", rope_scaling.get("type"))
        cfg["rope_parameters"] = rp
    else:
        cfg["rope_theta"] = theta
        cfg["rope_scaling"] = rope_scaling
    return cfg


def tensor_specs(cfg):
    """(name, shape, kind) of every tensor, in transformers' order; kind picks the init."""
    H, D = cfg["num_attention_heads"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    hid, kv, ffn = cfg["hidden_size"], cfg["num_key_value_heads"] * D, cfg["intermediate_size"]
    qwen2 = cfg["model_type"] == "qwen2"
    ab = qwen2 or cfg.get("attention_bias", False)
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], hid), "embed")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (hid,), "norm"),
            (p + "self_attn.q_proj.weight", (H * D, hid), "linear"),
            (p + "self_attn.k_proj.weight", (kv, hid), "linear"),
            (p + "self_attn.v_proj.weight", (kv, hid), "linear"),
            (p + "self_attn.o_proj.weight", (hid, H * D), "linear"),
        ]
        if ab:
            specs += [(p + "self_attn.q_proj.bias", (H * D,), "bias"), (p + "self_attn.k_proj.bias", (kv,), "bias"),
                      (p + "self_attn.v_proj.bias", (kv,), "bias")]
        if not qwen2 and cfg.get("attention_bias", False):
            specs.append((p + "self_attn.o_proj.bias", (hid,), "bias"))
        specs += [
            (p + "post_attention_layernorm.weight", (hid,), "norm"),
            (p + "mlp.gate_proj.weight", (ffn, hid), "linear"),
            (p + "mlp.up_proj.weight", (ffn, hid), "linear"),
            (p + "mlp.down_proj.weight", (hid, ffn), "linear"),
        ]
        if not qwen2 and cfg.get("mlp_bias", False):
            specs += [(p + "mlp.gate_proj.bias", (ffn,), "bias"), (p + "mlp.up_proj.bias", (ffn,), "bias"),
                      (p + "mlp.down_proj.bias", (hid,), "bias")]
    specs.append(("model.norm.weight", (hid,), "norm"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (cfg["vocab_size"], hid), "linear"))
    return specs


def random_tensor(rng, shape, kind):
    """float32 values of one tensor."""
    if kind == "embed":
        return rng.standard_normal(shape, dtype=np.float32)
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "bias":
        return (0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(1.0 / np.sqrt(shape[-1]))
    return x


def to_bytes(x, dtype):
    """The little-endian bytes of float32 array x stored as dtype (bf16 rounded to nearest even)."""
    if dtype == "f32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if dtype == "f16":
        return np.ascontiguousarray(x, dtype="<f2").tobytes()
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def from_bytes(b, st_dtype, shape):
    """float64 array of safetensors bytes (F32, F16, BF16)."""
    if st_dtype == "F32":
        a = np.frombuffer(b, dtype="<f4")
    elif st_dtype == "F16":
        a = np.frombuffer(b, dtype="<f2")
    elif st_dtype == "BF16":
        a = (np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(st_dtype)
    return a.astype(np.float64).reshape(shape)


def write_safetensors(path, entries, dtype):
    """entries: list of (name, shape, make) where make() gives the float32 array.
    The header is written first (it needs only shapes), then each tensor's data."""
    esize = 4 if dtype == "f32" else 2
    header, off = {}, 0
    for name, shape, _ in entries:
        n = int(np.prod(shape)) * esize
        header[name] = {"dtype": ST_DTYPE[dtype], "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for name, shape, make in entries:
            x = make()
            assert x.shape == tuple(shape), (name, x.shape, shape)
            f.write(to_bytes(x, dtype))
    return off


def write_checkpoint(out, cfg, dtype="f32", shards=1, seed=0, override=None):
    """Writes config.json and the weights; returns {name: float64 array of the stored values} unless the
    model is large (then None).  override: {name: array} replaces a tensor (tests make bad files with it)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    specs = tensor_specs(cfg)
    rng = np.random.default_rng(seed)
    total = sum(int(np.prod(s)) for _, s, _ in specs)
    keep = total <= 50_000_000
    stored = {} if keep else None
    override = override or {}

    def maker(name, shape, kind):
        def make():
            x = random_tensor(rng, shape, kind)
            if name in override:
                x = np.asarray(override[name], dtype=np.float32)
            if keep:
                stored[name] = from_bytes(to_bytes(x, dtype), ST_DTYPE[dtype], x.shape)
            return x
        return make

    entries = [(n, override[n].shape if n in override else s, maker(n, s, k)) for n, s, k in specs]
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), entries, dtype)
        return stored
    # split in order into shards of about equal size, as transformers' max_shard_size does
    sizes = [int(np.prod(s)) for _, s, _ in entries]
    per = sum(sizes) / shards
    groups, cur, acc = [], [], 0
    for e, n in zip(entries, sizes):
        if cur and acc + n > per * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
        cur.append(e)
        acc += n
    groups.append(cur)
    weight_map, total_bytes = {}, 0
    for k, g in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        total_bytes += write_safetensors(os.path.join(out, fname), g, dtype)
        for name, _, _ in g:
            weight_map[name] = fname
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, f, indent=2)
    return stored


def read_checkpoint(d):
    """{name: float64 array} of a checkpoint directory (single file or sharded), read independently of smelt."""
    files = ["model.safetensors"]
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        with open(os.path.join(d, fn), "rb") as f:
            b = f.read()
        n = int.from_bytes(b[:8], "little")
        hdr = json.loads(b[8:8 + n])
        base = 8 + n
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            s, t = e["data_offsets"]
            out[name] = from_bytes(b[base + s:base + t], e["dtype"], e["shape"])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=176)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--dtype", choices=sorted(ST_DTYPE), default="f32")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--attention-bias", action="store_true", help="llama: biases on q/k/v/o (qwen2 always has q/k/v)")
    ap.add_argument("--mlp-bias", action="store_true")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope-layout", choices=["top", "parameters"], default="top",
                    help="rope_theta at the top level, or a rope_parameters object")
    ap.add_argument("--rope-scaling", type=json.loads, default=None, help="a rope_scaling object, as JSON")
    ap.add_argument("--sliding-window", type=int, default=None)
    a = ap.parse_args(argv)
    cfg = make_config(a.arch, a.hidden, a.heads, a.kv_heads, a.head_dim, a.ffn, a.layers, a.vocab, a.max_pos,
                      a.theta, a.eps, a.tied, a.dtype, a.rope_layout, a.rope_scaling, a.attention_bias, a.mlp_bias,
                      a.sliding_window)
    write_checkpoint(a.out, cfg, a.dtype, a.shards, a.seed)
    print(f"wrote {a.out}: {cfg['architectures'][0]}, {a.layers} layers, hidden {a.hidden}, {a.dtype}"
          f"{f', {a.shards} shards' if a.shards > 1 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
