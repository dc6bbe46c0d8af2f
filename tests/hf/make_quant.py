#!/usr/bin/env python3
"""Writes a random-weight Llama-family checkpoint whose linear weights are
quantised and packed as GPTQ or AutoAWQ checkpoints store them, with numpy
only, from the formats' descriptions:

  GPTQ (AutoGPTQ / GPTQModel / optimum), per linear [N out, K in]:
    qweight  int32 [K / (32/bits), N]  values of K packed per int32, value j
                                       of a word in bits bits*j .. bits*j+bits-1
    qzeros   int32 [K/G, N / (32/bits)] the zeros, packed the same way along N;
                                       checkpoint_format "gptq" (v1) stores
                                       zero - 1 (so 0 reads back as 2^bits),
                                       "gptq_v2" the zero itself
    scales   f16   [K/G, N]
    g_idx    int32 [K]                 the group of each input (act-order
                                       permutes it; otherwise k // G)
  AWQ (AutoAWQ GEMM):
    qweight  int32 [K, N/8]   8 values of N per int32: nibble i holds column
                              8c + [0, 2, 4, 6, 1, 3, 5, 7][i]
    qzeros   int32 [K/G, N/8] packed the same way; scales f16 [K/G, N]
  weight[n, k] = (q[n, k] - zero[group(k), n]) * scale[group(k), n]

The weights returned for the numpy reference are the dequantised ones (as
float64), under the float names ("...q_proj.weight"), so a float model
evaluated on them checks the import exactly.

    make_quant.py OUT_DIR --method gptq|awq [--bits 4] [--group 16] [--asym]
                  [--act-order] [--format gptq|gptq_v2]
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_checkpoint as mc  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # the column of each nibble of an AutoAWQ word
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quant_config(method, bits=4, group=16, sym=True, act_order=False, fmt="gptq", lm_head=False):
    if method == "gptq":
        q = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": sym,
             "checkpoint_format": fmt, "damp_percent": 0.01, "true_sequential": True, "static_groups": False,
             "model_name_or_path": None, "model_file_base_name": None}
        if lm_head:
            q["lm_head"] = True
        return q
    return {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}


def quantise(rng, w, bits, group, sym, act_order, v1=False, wide_zeros=False):
    """w [N, K] float32 -> (q [N, K], zeros [K/G, N], scales f16 [K/G, N], g_idx [K]), all ints but scales.
    v1: zeros of at least 1 (GPTQ v1 stores zero - 1); wide_zeros: some groups get the zero 2^bits (what
    GPTQ v1 reads from a stored 2^bits - 1)."""
    N, K = w.shape
    G = K if group == -1 else group
    ng, maxq = K // G, (1 << bits) - 1
    if act_order:
        perm = rng.permutation(K)
        g_idx = np.empty(K, np.int64)
        g_idx[perm] = np.arange(K) // G
    else:
        g_idx = np.arange(K) // G
    zeros = np.zeros((ng, N), np.int64)
    scales = np.zeros((ng, N), np.float16)
    for g in range(ng):
        wg = w[:, g_idx == g]
        if sym:
            s = 2 * np.abs(wg).max(axis=1) / maxq
            z = np.full(N, (maxq + 1) // 2)
        else:
            lo, hi = np.minimum(wg.min(axis=1), 0), np.maximum(wg.max(axis=1), 0)
            s = (hi - lo) / maxq
            z = np.clip(np.round(-lo / s), 0, maxq)
            if v1:
                z = np.maximum(z, 1)  # a v1 zero of 0 would be stored as -1, which reads back as 2^bits
            if wide_zeros:
                z[rng.random(N) < 0.1] = maxq + 1
        scales[g] = np.maximum(s, 1e-3).astype(np.float16)
        zeros[g] = z
    sk = scales.astype(np.float64)[g_idx].T  # [N, K]
    zk = zeros[g_idx].T
    q = np.clip(np.round(w / sk) + zk, 0, maxq).astype(np.int64)
    return q, zeros, scales, g_idx


def pack_along_rows(x, bits):
    """int array [R, C] -> int32 [R / (32/bits), C]: value j of each word in bits bits*j..."""
    pp = 32 // bits
    x = x.astype(np.uint64).reshape(x.shape[0] // pp, pp, x.shape[1])
    words = np.zeros((x.shape[0], x.shape[2]), np.uint64)
    for j in range(pp):
        words |= (x[:, j, :] & ((1 << bits) - 1)) << np.uint64(bits * j)
    return words.astype(np.uint32).view(np.int32)


def pack_along_cols(x, bits, order=None):
    """int array [R, C] -> int32 [R, C / (32/bits)]; order[i]: the column (of each pack) in nibble i."""
    pp = 32 // bits
    order = order or list(range(pp))
    x = x.astype(np.uint64).reshape(x.shape[0], x.shape[1] // pp, pp)
    words = np.zeros(x.shape[:2], np.uint64)
    for i in range(pp):
        words |= (x[:, :, order[i]] & ((1 << bits) - 1)) << np.uint64(bits * i)
    return words.astype(np.uint32).view(np.int32)


def pack_linear(method, q, zeros, scales, g_idx, bits, fmt):
    """The checkpoint tensors of one linear {suffix: array}."""
    if method == "gptq":
        stored = zeros - 1 if fmt == "gptq" else zeros
        return {"qweight": pack_along_rows(q.T, bits), "qzeros": pack_along_cols(stored & ((1 << bits) - 1), bits),
                "scales": scales, "g_idx": g_idx.astype(np.int32)}
    return {"qweight": pack_along_cols(q.T, 4, AWQ_ORDER), "qzeros": pack_along_cols(zeros, 4, AWQ_ORDER),
            "scales": scales}


ST = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}


def write_safetensors(path, tensors, float_dtype):
    """tensors: {name: array}; float32 arrays are stored in float_dtype (f32/f16/bf16), the rest as they are."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if a.dtype == np.float32:
            b, dt = mc.to_bytes(a, float_dtype), mc.ST_DTYPE[float_dtype]
        else:
            b, dt = np.ascontiguousarray(a).tobytes(), ST[a.dtype]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


def write_quant_checkpoint(out, cfg, method, bits=4, group=16, sym=True, act_order=False, fmt="gptq",
                           quant_head=False, dtype="f32", shards=1, seed=0, wide_zeros=False, g_idx=True,
                           float_linears=(), override=None, drop=()):
    """Writes config.json (with quantization_config) and the weights; returns {name: float64 array} of the model
    as the numpy reference evaluates it (dequantised linears under their float names).  act_order: True, or a
    name prefix ("model.layers.1.") for act-order in those modules only (the others get g_idx k // G);
    float_linears: module prefixes left unquantised; override {name: array} and drop (names) make bad
    checkpoints."""
    os.makedirs(out, exist_ok=True)
    cfg = dict(cfg)
    cfg["quantization_config"] = quant_config(method, bits, group, sym, bool(act_order), fmt, quant_head)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(seed)
    tensors, ref = {}, {}
    for name, shape, kind in mc.tensor_specs(cfg):
        x = mc.random_tensor(rng, shape, kind)
        prefix = name[:-len(".weight")]
        quantised = kind == "linear" and name.endswith(".weight") and prefix not in float_linears and \
            (prefix.split(".")[-1] in LINEARS or (quant_head and prefix == "lm_head"))
        if not quantised:
            tensors[name] = x
            ref[name] = mc.from_bytes(mc.to_bytes(x, dtype), mc.ST_DTYPE[dtype], x.shape)
            continue
        v1 = method == "gptq" and fmt == "gptq"
        act = act_order is True or (isinstance(act_order, str) and name.startswith(act_order))
        q, zeros, scales, gi = quantise(rng, x, bits, group, sym, act, v1, wide_zeros and v1)
        packed = pack_linear(method, q, zeros, scales, gi, bits, fmt)
        if not g_idx:
            packed.pop("g_idx", None)
        for k, v in packed.items():
            tensors[f"{prefix}.{k}"] = v
        # the reference dequantises the packed values as the format says: v1 reads stored + 1
        s64 = scales.astype(np.float64)[gi].T
        ref[name] = (q - zeros[gi].T) * s64
    for k, v in (override or {}).items():
        tensors[k] = v
    for k in drop:
        tensors.pop(k, None)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
        return ref
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(os.path.join(out, fname), part, dtype)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    return ref


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--method", choices=["gptq", "awq"], required=True)
    ap.add_argument("--arch", choices=sorted(mc.ARCHS), default="llama")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--asym", action="store_true", help="GPTQ sym=false (AWQ always has zeros)")
    ap.add_argument("--act-order", action="store_true")
    ap.add_argument("--format", choices=["gptq", "gptq_v2"], default="gptq")
    ap.add_argument("--quant-head", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    cfg = mc.make_config(a.arch)
    write_quant_checkpoint(a.out, cfg, a.method, a.bits, a.group, not a.asym and a.method == "gptq", a.act_order,
                           a.format, a.quant_head, seed=a.seed)
    print(f"wrote {a.out}: {a.method} {a.bits}-bit, group {a.group}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
