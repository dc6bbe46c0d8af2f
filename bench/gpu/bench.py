#!/usr/bin/env python3
"""smelt's GPU benchmark (SPEC §8): smelt against PyTorch, W1 to W4.

A benchmark, not a test: never run by CI; scripts/gpu-check.sh runs it on
the lent GPU machine after the GPU tests.  For every workload, in one run of
this script, on one GPU:

  1. inputs are made here (floats uniform in [-1, 1); integer inputs, the
     positions, count 0, 1, 2, ... along the last axis, except W4 decode's
     position, 2048; bools alternate) and saved as .npy;
  2. the weights: W2 and W4 make theirs here with numpy and write them to a
     safetensors file in the temporary directory, beside a copy of the
     model's YAML that reads them with `from:` (both sides compute with the
     same arrays, and no slow reference run is needed to dump them); W1 and
     the examples take smelt's seeded params from `smelt run MODEL --device
     ref --output NAME=FILE.npy` (for W1 at --dim rows=8: the same b and g,
     cheaply);
  3. smelt compiles the model for the GPU (`smelt compile --target cuda`,
     with --tune-table FILE when given and the binary has the flag);
     `smelt bench --device cuda --json` times it (the total is the replay
     of its CUDA graph: 10 replays queued back to back, median over --iters)
     and reports each kernel's variant and resources; `smelt run BUNDLE
     --device cuda` produces its output.  For W4 the compile is timed twice:
     cold (an empty SMELT_CACHE_DIR) and warm (the same cache again);
  4. the peers run the same computation on the same inputs and weights, on
     the GPU, timed with CUDA events the same way (10 calls back to back,
     median over --iters, after warm-up):
       W1, W2   written out in torch: eager and torch.compile (--compile-mode);
                W2 also the three matmuls alone (cuBLAS);
       W3       torch.nn.functional.scaled_dot_product_attention with the
                flash backend (the target), the math backend, and under
                torch.compile;
       W4       a LLaMA module written out in torch (weights as parameters,
                the KV caches as buffers, as a serving loop keeps them):
                eager, eager captured in a CUDA graph, and torch.compile
                with CUDA graphs (--w4-compile-mode, default
                reduce-overhead; when that fails, the default mode captured
                in a CUDA graph by hand);
       examples interpreted op by op with bench/cpu/torch_peer.py on the
                model read by bench/cpu/yaml_model.py (needs pyyaml).
       tf32     (optional: only with --only tf32) an f32 4096^3 GEMM that
                smelt compiles with --allow-tf32; torch's f32 GEMM (the
                reference) and the same with allow_tf32 (cuBLAS's TF32
                kernels, the peer: TFLOP/s and speed against it, no target).

Outputs are compared as relative L2 error (float64) against the first peer
(torch eager, or SDPA flash for W3), with a tolerance per workload; a
mismatch counts as a failure.  % of bandwidth: compulsory bytes (inputs and
params read once, outputs written once) over time, against the device's
copy bandwidth that `smelt bench` measured (a 1 GiB device-to-device copy
kernel timed with CUDA events, read + write bytes); torch's own copy
(dst.copy_(src), 1 GiB) is printed beside it.  TFLOP/s: W2's three GEMMs;
W3 prefill's causal FLOPs 2 * 2 * B*H*S*T*D / 2; W4's matmuls plus
attention (causal half in prefill).

The summary table gives per workload smelt's time, the peer SPEC §8 names
(cuBLAS, SDPA flash, torch.compile) and its time, smelt's speed against it
(peer ms / smelt ms: above 1, smelt is faster), % of copy bandwidth,
TFLOP/s, the target and whether it is met.

Usage: bench.py [--smelt PATH] [--only w1,w3_prefill,...] [--iters 20]
                [--keep DIR] [--tune-table FILE] [--compile-mode MODE]
                [--w4-compile-mode MODE] [--no-torch-compile] [--deadline S]
                [--compile-only] [--reuse-bundles]
       bench.py --prepare DIR   (writes the W2/W4 weights and YAML copies
                                 into DIR for running smelt by hand)
--compile-only compiles the bundles into --keep DIR and records the
compile times beside them (no GPU needed); a later run with --keep DIR
--reuse-bundles benches those bundles (scripts/gpu-check.sh dumps their
SASS in between).  Weights files already in --keep DIR are read, not made
again.  --deadline S skips torch.compile, then whole workloads, when the
time runs short, so that the summary still prints.
Exit status 0 when everything ran and matched (a slow result is not a
failure), 1 when smelt failed or mismatched on a workload.
"""
import argparse
import gc
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS = os.path.join(ROOT, "bench", "models")
sys.path.insert(0, os.path.join(ROOT, "bench", "cpu"))

NP_DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32,
             "i8": np.int8, "u8": np.uint8, "bool": np.bool_}
DT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i8": 1, "u8": 1, "bool": 1}
BATCH = 10  # calls queued back to back per timing sample, like smelt bench's graph replays
DEFAULT_ONLY = "w1,w2_m1,w2_m2048,w3_prefill,w3_decode,w4_decode,w4_prefill"
# Workloads run only when named in --only (not SPEC §8's).
OPTIONAL = ("tf32",)
EXAMPLES = ("mlp", "cnn", "gpt2_block", "tiny_llama")

W2_H, W2_I = 4096, 11008
W4_DIMS = {"hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 64, "kv_dim": 256, "ffn": 5632, "layers": 8,
           "ctx": 2048, "prefill": 512}
W4_EPS, W4_BASE = 1e-5, 10000.0

# SPEC §8 targets: (kind, value, peer).  kind "bw": % of copy bandwidth >=
# value; "speed": peer ms / smelt ms >= value.
TARGETS = {
    "w1": ("bw", 85.0, None),
    "w2_m1": ("bw", 80.0, None),
    "w2_m2048": ("speed", 0.95, "cuBLAS"),
    "w3_prefill": ("speed", 0.90, "sdpa-flash"),
    "w3_decode": ("bw", 80.0, None),
    "w4_decode": ("speed", 1.25, "torch.compile"),   # smelt time <= 0.8x torch.compile's
    "w4_prefill": ("speed", 1.25, "torch.compile"),
    "tf32": (None, None, "cuBLAS-TF32"),  # no target: smelt's speed against cuBLAS's TF32 GEMM, shown
}
# Relative L2 against the reference peer above which an output is wrong.
TOLERANCE = {"w1": 2e-3, "w2_m1": 5e-3, "w2_m2048": 5e-3, "w3_prefill": 5e-3, "w3_decode": 5e-3,
             "w4_decode": 2e-2, "w4_prefill": 2e-2,
             "tf32": 2e-3}  # TF32 operands (10-bit mantissas) against the f32 product
W4_COMPILE_TARGET = (3.0, 0.2)  # seconds, cold and warm (SPEC §8)


def run_cmd(cmd, timeout=600, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip()).splitlines()
        raise RuntimeError(f"{' '.join(cmd[:3])}...: exit {p.returncode}: {' | '.join(msg[-3:])}")
    return p.stdout


def rel_l2(got, want):
    g = np.asarray(got, dtype=np.float64).ravel()
    w = np.asarray(want, dtype=np.float64).ravel()
    if g.shape != w.shape:
        return float("inf")
    d = np.linalg.norm(g - w)
    n = np.linalg.norm(w)
    return float(d / n) if n > 0 else (0.0 if d == 0 else float("inf"))


def make_input(shape, dt, rng):
    if dt in ("f32", "f16", "f64", "bf16"):
        a = rng.uniform(-1.0, 1.0, size=shape)
        return a.astype(np.float32 if dt == "bf16" else NP_DTYPES[dt])
    n = math.prod(shape)
    last = shape[-1] if shape and shape[-1] else 1
    if dt == "bool":
        return (np.arange(n) % 2 == 1).reshape(shape)
    return (np.arange(n) % last).astype(NP_DTYPES[dt]).reshape(shape)


class Workload:
    """What one row of the benchmark needs: the model, its inputs and
    params, how the peers run it, and the numbers that go with it."""

    def __init__(self, wid, path, inputs, params, outputs, cheap_dims=None, torch_fn=None, model=None):
        self.wid, self.path = wid, path
        self.inputs = inputs          # name -> (shape, dtype)
        self.params = params          # name -> (shape, dtype)
        self.outputs = outputs        # names
        self.cheap_dims = cheap_dims  # dims at which the params are the same and the ref run is cheap
        self.torch_fn = torch_fn      # (torch, inputs dict, params dict) -> list of outputs: eager + compile
        self.model = model            # yaml_model.Model, when read
        self.peers = None             # (torch, args, inputs, params) -> {name: result}: replaces torch_fn
        self.param_arrays = None      # made here (W2, W4) instead of dumped from smelt
        self.fixed_inputs = {}        # name -> array, instead of make_input's
        self.out_bytes = []
        self.flops = None             # for TFLOP/s
        self.extra_peers = {}         # name -> (torch, args, inputs, params) -> result, after torch_fn's
        self.time_compile = False     # W4: cold and warm compile times
        self.compile_flags = []       # smelt compile flags of this workload (tf32: --allow-tf32)
        self.note = None

    def compulsory_bytes(self):
        if self.model is not None:
            return self.model.compulsory_bytes()
        tot = sum(math.prod(s) * DT_BYTES[d] for s, d in list(self.inputs.values()) + list(self.params.values()))
        return tot + sum(self.out_bytes)


def time_torch(torch, call, iters, warmup=3):
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(BATCH):
            call()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / BATCH)
    return float(np.median(samples))  # ms


def to_np(ts):
    return [t.float().cpu().numpy() for t in ts]


def peer_error(e):
    """A peer that failed: a result, not a crash."""
    first = (str(e).strip().splitlines() or [""])[0]
    return {"error": f"{type(e).__name__}: {first[:100]}"}


def compile_allowed(args, need):
    """Whether torch.compile may start: it is on, and --deadline leaves
    about `need` seconds for it; else None and the reason."""
    if not args.torch_compile:
        return False, None
    left = args.deadline - (time.time() - args.t0) if args.deadline else float("inf")
    if left < need:
        return False, f"skipped: {left:.0f} s left of --deadline, torch.compile needs ~{need} s"
    return True, None


def torch_compile_timed(torch, fn, args_, mode):
    """(compiled fn, seconds of its first call); mode "default" = no mode."""
    kw = {} if mode in (None, "default") else {"mode": mode}
    cfn = torch.compile(fn, **kw)
    t0 = time.time()
    cfn(*args_)
    torch.cuda.synchronize()
    return cfn, time.time() - t0


def cuda_graph(torch, fn):
    """fn captured in a CUDA graph (after warm-up on a side stream, as the
    torch docs do it): (replay, the outputs the replays write)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize()
    return g.replay, out


# ---- W1 ----

def w1_torch(torch, x, p):
    F = torch.nn.functional
    h = F.gelu(x["x"] + p["b"], approximate="tanh") + x["r"]
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * p["g"].float()
    return [y.to(h.dtype)]


def w1_workload():
    rows, hidden = 16384, 4096
    w = Workload("w1", os.path.join(MODELS, "w1_gpu.yaml"),
                 {"x": ((rows, hidden), "f16"), "r": ((rows, hidden), "f16")},
                 {"b": ((hidden,), "f16"), "g": ((hidden,), "f16")}, ["y"], cheap_dims={"rows": 8},
                 torch_fn=w1_torch)
    w.out_bytes = [rows * hidden * 2]
    return w


# ---- weights files (W2, W4) ----

def write_safetensors(path, tensors):
    """A safetensors file of numpy arrays (f16/f32), tensors in the given order."""
    codes = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    header, off = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def read_safetensors(path):
    """The arrays of a safetensors file that write_safetensors wrote."""
    types = {"F16": np.float16, "F32": np.float32}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        # writable (torch.from_numpy warns about read-only arrays), read without a second copy
        data = bytearray(os.path.getsize(path) - 8 - n)
        f.readinto(data)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data, dtype=types[t["dtype"]], count=(b - a) // np.dtype(types[t["dtype"]]).itemsize,
                                  offset=a).reshape(t["shape"])
    return out


def weights_file(tmp, name, make):
    """tmp/NAME.safetensors, made by make() once per run; a file already
    there (bench.py --prepare, or --keep DIR from an earlier run) is read
    instead: the arrays are deterministic, so it holds the same ones."""
    if name not in _WEIGHTS:
        path = os.path.join(tmp, f"{name}.safetensors")
        if os.path.exists(path):
            _WEIGHTS[name] = read_safetensors(path)
        else:
            _WEIGHTS[name] = make()
            write_safetensors(path, _WEIGHTS[name])
    return _WEIGHTS[name]


def copy_model(name, tmp):
    """bench/models/NAME.yaml copied into tmp, beside the weights file it names."""
    path = os.path.join(tmp, f"{name}.yaml")
    shutil.copyfile(os.path.join(MODELS, f"{name}.yaml"), path)
    return path


_WEIGHTS = {}


def w2_params(tmp):
    """The W2 weights (numpy normal, std 1/sqrt(fan_in)) in tmp/w2.safetensors."""
    def make():
        rng = np.random.default_rng(2)
        p = {}
        for name, shape in (("w_gate", (W2_H, W2_I)), ("w_up", (W2_H, W2_I)), ("w_down", (W2_I, W2_H))):
            p[name] = (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[0])).astype(np.float16)
        return p
    return weights_file(tmp, "w2", make)


def w4_weights(dims, seed=4):
    """The W4 decoder's weights by their names in w4.safetensors: per layer
    the norms' gains uniform in [0.5, 1.5) and the linear layers, stored
    [out, in] as nn.Linear and the checkpoints keep them (the YAML's
    matmuls read them with transpose_b), uniform with std
    1/sqrt(fan_in) (uniform: ten times faster to draw than normal, and
    there are 352M of them); then the final norm's gain."""
    rng = np.random.default_rng(seed)
    h, kv, ffn = dims["hidden"], dims["kv_heads"] * dims["head_dim"], dims["ffn"]

    def linear(fan_in, fan_out):
        a = rng.random((fan_out, fan_in), dtype=np.float32)
        a -= 0.5
        a *= 2.0 * math.sqrt(3.0 / fan_in)
        return a.astype(np.float16)

    def gain(n):
        return (rng.random(n, dtype=np.float32) + 0.5).astype(np.float16)

    p = {}
    for i in range(dims["layers"]):
        p[f"layers.{i}.attn_norm"] = gain(h)
        p[f"layers.{i}.ffn_norm"] = gain(h)
        p[f"layers.{i}.wq"] = linear(h, h)
        p[f"layers.{i}.wk"] = linear(h, kv)
        p[f"layers.{i}.wv"] = linear(h, kv)
        p[f"layers.{i}.wo"] = linear(h, h)
        p[f"layers.{i}.w_gate"] = linear(h, ffn)
        p[f"layers.{i}.w_up"] = linear(h, ffn)
        p[f"layers.{i}.w_down"] = linear(ffn, h)
    p["final_norm"] = gain(h)
    return p


def w4_params(tmp):
    return weights_file(tmp, "w4", lambda: w4_weights(W4_DIMS))


# ---- W2 ----

def w2_torch(torch, x, p):
    F = torch.nn.functional
    return [(F.silu(x["x"] @ p["w_gate"]) * (x["x"] @ p["w_up"])) @ p["w_down"]]


def w2_cublas(torch, args, inputs, params):
    """The three matmuls of W2 alone in torch (cuBLAS): a timing-only peer."""
    x = torch.from_numpy(inputs["x"]).cuda()
    p = {k: torch.from_numpy(v).cuda() for k, v in params.items()}
    h = torch.empty((x.shape[0], W2_I), dtype=x.dtype, device="cuda")

    def mm():
        torch.matmul(x, p["w_gate"])
        torch.matmul(x, p["w_up"])
        return torch.matmul(h, p["w_down"])
    with torch.inference_mode():
        return {"ms": time_torch(torch, mm, args.iters)}


def w2_workload(wid, tmp):
    """W2 at M = 1 (decode) or 2048 (prefill)."""
    m = int(wid.split("_m")[1])
    params = w2_params(tmp)
    w = Workload(wid, copy_model(wid, tmp), {"x": ((m, W2_H), "f16")},
                 {k: (v.shape, "f16") for k, v in params.items()}, ["y"], torch_fn=w2_torch)
    w.param_arrays = params
    w.out_bytes = [m * W2_H * 2]
    w.flops = 2.0 * m * W2_H * W2_I * 3
    w.extra_peers = {"cuBLAS": w2_cublas}
    return w


# ---- W3 ----

def w3_peers(torch, args, w, inputs, params):
    """SDPA with the flash backend (the SPEC's FlashAttention), the math
    backend, and torch.compile of the same call (inductor picks the
    kernel).  torch's is_causal aligns the mask top-left, smelt's causal
    bottom-right (query i sees keys up to T - S + i): the same for S = T;
    for the decode's S = 1 smelt's query sees every key, which is torch
    without a mask."""
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.from_numpy(inputs[n]).cuda() for n in ("q", "k", "v"))
    s, t = q.shape[2], k.shape[2]
    assert s == t or s == 1, "W3 peers handle S = T and S = 1 only"
    causal = s == t and s > 1

    def call(q_, k_, v_):
        return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal)
    res = {}
    with torch.inference_mode():
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-math", SDPBackend.MATH)):
            try:
                with sdpa_kernel(backend):
                    res[name] = {"ms": time_torch(torch, lambda: call(q, k, v), args.iters),
                                 "outs": to_np([call(q, k, v)])}
            except Exception as e:
                res[name] = peer_error(e)
        ok, why = compile_allowed(args, 30)
        if why:
            res["torch.compile"] = {"error": why}
        if ok:
            try:
                cfn, cs = torch_compile_timed(torch, call, (q, k, v), args.compile_mode)
                res["torch.compile"] = {"ms": time_torch(torch, lambda: cfn(q, k, v), args.iters),
                                        "outs": to_np([cfn(q, k, v)]), "compile_s": cs}
            except Exception as e:
                res["torch.compile"] = peer_error(e)
    return res


def w3_workload(wid):
    path = os.path.join(MODELS, f"{wid}.yaml")
    b, h, d = 1, 32, 128
    s, t = (2048, 2048) if wid == "w3_prefill" else (1, 4096)
    w = Workload(wid, path, {"q": ((b, h, s, d), "f16"), "k": ((b, h, t, d), "f16"), "v": ((b, h, t, d), "f16")},
                 {}, ["y"])
    w.out_bytes = [b * h * s * d * 2]
    # QK^T and PV over the scores a causal mask leaves (S = T: half)
    w.flops = 2.0 * 2 * b * h * s * t * d / (2 if s == t else 1)
    w.peers = w3_peers
    return w


# ---- W4 ----

def w4_torch_model(torch, params, dims, caches):
    """The decoder of bench/models/w4_*.yaml as a torch module: weights as
    parameters (static addresses for CUDA graphs), the KV caches (decode)
    as buffers, as a serving loop keeps them.  Attention is SDPA with
    grouped-query heads (enable_gqa, else repeat_interleave on older
    torch); rope angles in f32 like Hugging Face's LLaMA."""
    nn, F = torch.nn, torch.nn.functional
    H, HKV, D = dims["heads"], dims["kv_heads"], dims["head_dim"]

    def weight(a):
        return nn.Parameter(torch.from_numpy(a).cuda(), requires_grad=False)

    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + W4_EPS)).to(x.dtype) * g

    def rope(x, cos, sin):
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    try:
        probe = torch.zeros(1, H, 2, D, dtype=torch.float16, device="cuda")
        F.scaled_dot_product_attention(probe, probe[:, :HKV], probe[:, :HKV], enable_gqa=True)
        gqa = True
    except (TypeError, RuntimeError):
        gqa = False

    def attention(q, k, v, causal):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        k = k.repeat_interleave(H // HKV, dim=1)
        v = v.repeat_interleave(H // HKV, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    class Layer(nn.Module):
        def __init__(self, i):
            super().__init__()
            for n in ("attn_norm", "ffn_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
                setattr(self, n, weight(params[f"layers.{i}.{n}"]))
            self.cached = caches is not None
            if self.cached:
                self.register_buffer("k_cache", torch.from_numpy(caches[f"k_cache_{i}"]).cuda())
                self.register_buffer("v_cache", torch.from_numpy(caches[f"v_cache_{i}"]).cuda())

        def forward(self, x, cos, sin):
            s = x.shape[0]
            h = rms(x, self.attn_norm)
            q = F.linear(h, self.wq).view(1, s, H, D).transpose(1, 2)
            k = F.linear(h, self.wk).view(1, s, HKV, D).transpose(1, 2)
            v = F.linear(h, self.wv).view(1, s, HKV, D).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if self.cached:
                # smelt's causal with S = 1 sees every key: no mask
                k = torch.cat([self.k_cache, k], dim=2)
                v = torch.cat([self.v_cache, v], dim=2)
            att = attention(q, k, v, causal=not self.cached and s > 1)
            x = x + F.linear(att.transpose(1, 2).reshape(s, H * D), self.wo)
            h2 = rms(x, self.ffn_norm)
            return x + F.linear(F.silu(F.linear(h2, self.w_gate)) * F.linear(h2, self.w_up), self.w_down)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer(i) for i in range(dims["layers"]))
            self.final_norm = weight(params["final_norm"])
            self.register_buffer("inv_freq", 1.0 / (W4_BASE ** (torch.arange(0, D, 2, dtype=torch.float32,
                                                                             device="cuda") / D)))

        def forward(self, x, pos):
            ang = pos.float()[:, None] * self.inv_freq[None, :]
            cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return rms(x, self.final_norm)

    return Decoder().eval(), gqa


def w4_peers(torch, args, w, inputs, params):
    """Eager, eager in a CUDA graph, and torch.compile with CUDA graphs."""
    caches = {k: v for k, v in inputs.items() if "cache" in k} or None
    res = {}
    model, gqa = w4_torch_model(torch, params, W4_DIMS, caches)
    x = torch.from_numpy(inputs["x"]).cuda()
    pos = torch.from_numpy(inputs["pos"]).cuda()
    gqa_note = "" if gqa else " (SDPA without enable_gqa: repeat_interleave)"
    with torch.inference_mode():
        try:
            res["eager"] = {"ms": time_torch(torch, lambda: model(x, pos), args.iters),
                            "outs": to_np([model(x, pos)]), "note": gqa_note}
        except Exception as e:
            res["eager"] = peer_error(e)
        try:
            replay, out = cuda_graph(torch, lambda: model(x, pos))
            res["eager+graph"] = {"ms": time_torch(torch, replay, args.iters), "outs": to_np([out])}
        except Exception as e:
            res["eager+graph"] = peer_error(e)
        ok, why = compile_allowed(args, 90)
        if why:
            res["torch.compile"] = {"error": why}
        if ok:
            mode = args.w4_compile_mode
            try:
                cfn, cs = torch_compile_timed(torch, model, (x, pos), mode)
                res["torch.compile"] = {"ms": time_torch(torch, lambda: cfn(x, pos), args.iters),
                                        "outs": to_np([cfn(x, pos)]), "compile_s": cs, "note": f"mode {mode}"}
            except Exception as e:
                first = peer_error(e)["error"]
                # the same graph without torch's CUDA-graph trees, captured by hand
                try:
                    torch._dynamo.reset()
                    cfn, cs = torch_compile_timed(torch, model, (x, pos), "default")
                    replay, out = cuda_graph(torch, lambda: cfn(x, pos))
                    res["torch.compile"] = {"ms": time_torch(torch, replay, args.iters), "outs": to_np([out]),
                                            "compile_s": cs,
                                            "note": f"mode {mode} failed ({first[:60]}); default mode + "
                                                    "manual CUDA graph"}
                except Exception as e2:
                    res["torch.compile"] = {"error": f"mode {mode}: {first[:60]}; default+graph: "
                                                     f"{peer_error(e2)['error'][:60]}"}
    return res


def w4_workload(wid, tmp):
    d = W4_DIMS
    params = w4_params(tmp)
    decode = wid == "w4_decode"
    s = 1 if decode else d["prefill"]
    inputs = {"x": ((s, d["hidden"]), "f16"), "pos": ((s,), "i32")}
    w = Workload(wid, copy_model(wid, tmp), inputs, {k: (v.shape, "f16") for k, v in params.items()}, ["y"])
    t = s
    if decode:
        for i in range(d["layers"]):
            for kv in "kv":
                inputs[f"{kv}_cache_{i}"] = ((1, d["kv_heads"], d["ctx"], d["head_dim"]), "f16")
        # the new token sits after the cache
        w.fixed_inputs["pos"] = np.array([d["ctx"]], dtype=np.int32)
        t = d["ctx"] + 1
    w.param_arrays = params
    w.out_bytes = [s * d["hidden"] * 2]
    kvd = d["kv_heads"] * d["head_dim"]
    per_layer = 2 * s * d["hidden"] * (2 * d["hidden"] + 2 * kvd + 3 * d["ffn"])
    att = 2 * 2 * d["heads"] * s * t * d["head_dim"] / (1 if decode else 2)
    w.flops = float(d["layers"] * (per_layer + att))
    w.peers = w4_peers
    w.time_compile = True
    return w


# ---- TF32 (optional) ----

TF32_N = 4096


def tf32_params(tmp):
    """The weight w [n, k] (numpy normal, std 1/sqrt(k), f32) in tmp/tf32.safetensors."""
    def make():
        rng = np.random.default_rng(5)
        return {"w": rng.standard_normal((TF32_N, TF32_N), dtype=np.float32) / np.float32(math.sqrt(TF32_N))}
    return weights_file(tmp, "tf32", make)


def tf32_peers(torch, args, w, inputs, params):
    """torch's f32 GEMM with TF32 off (the exact reference), then with
    torch.backends.cuda.matmul.allow_tf32 = True: cuBLAS's TF32 kernels,
    the peer smelt's --allow-tf32 GEMM is set against."""
    x = torch.from_numpy(inputs["x"]).cuda()
    wt = torch.from_numpy(params["w"]).cuda()
    res = {}
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        with torch.inference_mode():
            for name, tf32 in (("f32", False), ("cuBLAS-TF32", True)):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                try:
                    res[name] = {"ms": time_torch(torch, lambda: x @ wt.T, args.iters), "outs": to_np([x @ wt.T])}
                    res[name]["note"] = f"{w.flops / (res[name]['ms'] * 1e-3) * 1e-12:.0f} TFLOP/s"
                except Exception as e:
                    res[name] = peer_error(e)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return res


def tf32_workload(tmp):
    params = tf32_params(tmp)
    w = Workload("tf32", copy_model("tf32", tmp), {"x": ((TF32_N, TF32_N), "f32")},
                 {k: (v.shape, "f32") for k, v in params.items()}, ["y"])
    w.param_arrays = params
    w.out_bytes = [TF32_N * TF32_N * 4]
    w.flops = 2.0 * TF32_N ** 3
    w.peers = tf32_peers
    w.compile_flags = ["--allow-tf32"]
    return w


# ---- the examples ----

def example_workload(name):
    path = os.path.join(ROOT, "examples", f"{name}.yaml")
    try:
        import yaml_model
        m = yaml_model.load(path)
    except ImportError as e:
        w = Workload(name, path, None, None, None)
        w.note = f"cannot read the YAML in python ({e})"
        return w
    w = Workload(name, path, dict(m.inputs), dict(m.params), list(m.outputs), model=m)
    w.out_bytes = [m.nbytes(o) for o in m.outputs]
    return w


def make_workload(wid, tmp):
    if wid == "w1":
        return w1_workload()
    if wid in ("w2_m1", "w2_m2048"):
        return w2_workload(wid, tmp)
    if wid in ("w3_prefill", "w3_decode"):
        return w3_workload(wid)
    if wid in ("w4_decode", "w4_prefill"):
        return w4_workload(wid, tmp)
    if wid in EXAMPLES:
        return example_workload(wid)
    if wid == "tf32":
        return tf32_workload(tmp)
    raise ValueError(f"unknown workload '{wid}' (known: {DEFAULT_ONLY},{','.join(EXAMPLES + OPTIONAL)})")


# ---- the two sides ----

def torch_copy_bandwidth(torch):
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * n / float(np.median(times))


def compile_flags(args):
    """--tune-table FILE when asked for, the file exists and this smelt
    compile has the flag (it is new); else none, and why."""
    if not args.tune_table:
        return [], None
    if not os.path.isfile(args.tune_table):
        return [], f"no tuning table at {args.tune_table}: heuristics"
    helptext = subprocess.run([args.smelt, "compile", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True).stdout
    if "--tune-table" not in helptext:
        return [], "smelt compile has no --tune-table: heuristics"
    return ["--tune-table", args.tune_table], None


COMPILE_KEYS = ("smelt_compile_s", "compile_cold_s", "compile_warm_s")


def smelt_compile(args, w, bundle, row):
    """Compiles w for CUDA; for W4 twice, cold (an empty cache) then warm.
    With --reuse-bundles, a bundle that an earlier --compile-only run left
    is taken as it is, with the compile times that run recorded beside it."""
    times = bundle + ".compile.json"
    if args.reuse_bundles and os.path.exists(bundle) and os.path.exists(times):
        with open(times) as f:
            row.update(json.load(f))
        row["reused"] = True
        return
    cmd = [args.smelt, "compile", w.path, "-o", bundle, "--target", "cuda"] + args.flags + w.compile_flags
    if not w.time_compile:
        t0 = time.time()
        run_cmd(cmd)
        row["smelt_compile_s"] = time.time() - t0
    else:
        cache = tempfile.mkdtemp(prefix=f"smelt-cache-{w.wid}-", dir=os.path.dirname(bundle))
        env = dict(os.environ, SMELT_CACHE_DIR=cache)
        for key in ("compile_cold_s", "compile_warm_s"):
            t0 = time.time()
            run_cmd(cmd, env=env)
            row[key] = time.time() - t0
        row["smelt_compile_s"] = row["compile_warm_s"]
        shutil.rmtree(cache, ignore_errors=True)
    with open(times, "w") as f:
        json.dump({k: row[k] for k in COMPILE_KEYS if k in row}, f)


def smelt_side(args, w, tmp, in_files, row, phase):
    """Compiles, benches and runs the workload with smelt; returns (bench
    json, {output: array})."""
    bundle = os.path.join(tmp, f"{w.wid}.smelt")
    with phase("smelt compile"):
        smelt_compile(args, w, bundle, row)
    if args.compile_only:
        return None, None
    with phase("smelt bench"):
        bench = json.loads(run_cmd([args.smelt, "bench", bundle, "--device", "cuda", "--json",
                                    "--iters", str(args.iters)]))
    if w.outputs is None:
        return bench, None
    cmd = [args.smelt, "run", bundle, "--device", "cuda"]
    for n, f in in_files.items():
        cmd += ["--input", f"{n}={f}"]
    outs = {}
    for i, o in enumerate(w.outputs):
        f = os.path.join(tmp, f"{w.wid}_smelt_out{i}.npy")
        cmd += ["--output", f"{o}={f}"]
        outs[o] = f
    with phase("smelt run"):
        run_cmd(cmd)
    return bench, {o: np.load(f) for o, f in outs.items()}


def dump_params(args, w, tmp):
    if not w.params:
        return {}
    cmd = [args.smelt, "run", w.path, "--device", "ref"]
    for k, v in (w.cheap_dims or {}).items():
        cmd += ["--dim", f"{k}={v}"]
    files = {}
    for i, p in enumerate(w.params):
        f = os.path.join(tmp, f"{w.wid}_param{i}.npy")
        cmd += ["--output", f"{p}={f}"]
        files[p] = f
    run_cmd(cmd, timeout=900)
    return {p: np.load(f) for p, f in files.items()}


def generic_peers(torch, args, w, inputs, params):
    """Eager and torch.compile of w.torch_fn, or of the op-by-op
    interpreter of the model (the examples)."""
    if w.torch_fn is not None:
        def fn(x, p):
            return w.torch_fn(torch, x, p)
    else:
        import torch_peer

        def fn(x, p):
            env = dict(p)
            env.update(x)
            for n in w.model.nodes:
                res = torch_peer._node(n, [env[i] for i in n.ins], w.model)
                for o, r in zip(n.outs, res if len(n.outs) > 1 else [res]):
                    env[o] = r
            return [env[w.model.resolve(o)] for o in w.model.outputs]

    x = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in inputs.items()}
    p = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in params.items()}
    res = {}
    with torch.inference_mode():
        try:
            res["eager"] = {"ms": time_torch(torch, lambda: fn(x, p), args.iters), "outs": to_np(fn(x, p))}
        except Exception as e:
            res["eager"] = peer_error(e)
        ok, why = compile_allowed(args, 30)
        if why:
            res["torch.compile"] = {"error": why}
        if ok:
            try:
                cfn, cs = torch_compile_timed(torch, fn, (x, p), args.compile_mode)
                res["torch.compile"] = {"ms": time_torch(torch, lambda: cfn(x, p), args.iters),
                                        "outs": to_np(cfn(x, p)), "compile_s": cs}
            except Exception as e:
                res["torch.compile"] = peer_error(e)
    for name, peer in w.extra_peers.items():
        try:
            res[name] = peer(torch, args, inputs, params)
        except Exception as e:
            res[name] = peer_error(e)
    return res


# ---- reporting ----

def fmt(v, spec, unit=""):
    return "n/a" if v is None else format(v, spec) + unit


def kernel_lines(bench, top=8):
    """smelt's costliest kernels with their variant and resources (the
    resource report of `smelt bench`).  The kernels of repeated layers
    (k05_layer_0_att, k17_layer_1_att, ...) are summed under one name
    (layer_*_att, with their count), so that a model's time splits by
    what each kernel does."""
    groups = {}
    for k in bench.get("kernels", []):
        name = re.sub(r"^k\d+_", "", k["name"])
        name = re.sub(r"layer[._]\d+", "layer_*", name)
        g = groups.setdefault(name, {"us": 0.0, "n": 0, "k": k})
        g["us"] += k.get("median_us", 0)
        g["n"] += 1
    total = sum(g["us"] for g in groups.values()) or 1.0
    lines = []
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["us"])[:top]:
        k = g["k"]
        res = ""
        if "registers" in k and k["registers"] >= 0:
            res = (f" {k['registers']} regs, {k['local_bytes']} B local, smem {k['smem_static']}+"
                   f"{k['smem_dynamic']} B")
        var = k.get("variant") or "-"
        count = f" x{g['n']}" if g["n"] > 1 else ""
        lines.append(f"    {(name + count)[:40]:40s} {g['us']:9.2f} us {100 * g['us'] / total:5.1f}%  "
                     f"{var}{';' if res else ''}{res}")
    return lines


def target_text(wid):
    if wid not in TARGETS or TARGETS[wid][0] is None:
        return ""
    kind, val, peer = TARGETS[wid]
    if kind == "bw":
        return f">= {val:.0f}% bw"
    if wid.startswith("w4"):
        return f"time <= {1 / val:.1f}x {peer}"
    return f">= {val:.2f}x {peer}"


def evaluate(row):
    """Fills the summary's peer, speed and met fields of a finished row."""
    kind, val, peer = TARGETS.get(row["id"], (None, None, None))
    peers = row.get("peers", {})
    if peer is None:  # the strongest torch peer that ran, for the table
        for name in ("sdpa-flash", "torch.compile", "eager"):
            if peers.get(name, {}).get("ms"):
                peer = name
                break
    s = row.get("smelt_ms")
    if peer and peers.get(peer, {}).get("ms") and s:
        row["peer"], row["peer_ms"] = peer, peers[peer]["ms"]
        row["speed"] = peers[peer]["ms"] / s
    if kind == "bw" and row.get("pct_bw") is not None:
        row["met"] = row["pct_bw"] >= val
    elif kind == "speed" and row.get("peer") == peer and row.get("speed") is not None:
        row["met"] = row["speed"] >= val


def print_table(head, table):
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    for line in [head] + table:
        print("  ".join(str(x).ljust(wd) for x, wd in zip(line, widths)).rstrip())


def report_compile(args, rows):
    cold_t, warm_t = W4_COMPILE_TARGET
    print(f"\nsmelt compile --target cuda (whole process: reading the weights, passes, NVRTC, writing the bundle; "
          f"flags: {' '.join(args.flags) or '(none)'}" + (f"; {args.flags_note}" if args.flags_note else "") + "):")
    for r in rows:
        if "compile_cold_s" in r:
            ok = r["compile_cold_s"] <= cold_t and r["compile_warm_s"] <= warm_t
            print(f"  {r['id']}: cold (empty SMELT_CACHE_DIR) {r['compile_cold_s']:.2f} s, warm (same cache) "
                  f"{r['compile_warm_s']:.2f} s: {'met' if ok else 'NOT met'} (target cold <= {cold_t:g} s, "
                  f"warm <= {warm_t:g} s)")
        elif "smelt_compile_s" in r:
            print(f"  {r['id']}: {r['smelt_compile_s']:.2f} s")
        else:
            print(f"  {r['id']}: {r.get('note') or 'not compiled'}")


def report(args, rows, copy_bw, tcopy, phases):
    if args.compile_only:
        report_compile(args, rows)
        print("\nphases (s): " + ", ".join(f"{n} {t:.1f}" for n, t in phases))
        return
    print(f"\ndevice copy bandwidth: {fmt(copy_bw and copy_bw * 1e-9, '.0f')} GB/s (smelt bench: copy kernel, "
          f"CUDA events, read + write); torch dst.copy_(src) of 1 GiB: {fmt(tcopy and tcopy * 1e-9, '.0f')} GB/s")
    print(f"times: median over {args.iters} samples of {BATCH} calls back to back (smelt: CUDA graph replays); "
          f"torch.compile mode: {args.compile_mode} (W4: {args.w4_compile_mode})"
          + ("" if args.torch_compile else " -- skipped (--no-torch-compile)"))
    print(f"smelt compile flags: {' '.join(args.flags) or '(none)'}" + (f" ({args.flags_note})" if args.flags_note
                                                                        else ""))

    print("\nall peers (ms; relL2 against the first peer listed, float64):")
    for r in rows:
        parts = []
        for name, p in r.get("peers", {}).items():
            if "error" in p:
                parts.append(f"{name} FAILED ({p['error']})")
                continue
            s = f"{name} {p['ms']:.4f}"
            if p.get("err") is not None:
                s += f" (relL2 {p['err']:.1e})"
            if p.get("compile_s") is not None:
                s += f" [compiled in {p['compile_s']:.1f} s]"
            if p.get("note"):
                s += f" [{p['note'].strip()}]"
            parts.append(s)
        if parts:
            print(f"  {r['id']}: " + "; ".join(parts))

    report_compile(args, rows)

    head = ["workload", "kernels", "smelt ms", "peer", "peer ms", "x peer", "%copy bw", "TFLOP/s", "relL2",
            "target", "met?"]
    table = []
    for r in rows:
        met = r.get("met")
        table.append([r["id"], fmt(r.get("kernels"), "d"), fmt(r.get("smelt_ms"), ".4f"), r.get("peer") or "",
                      fmt(r.get("peer_ms"), ".4f"), fmt(r.get("speed"), ".2f", "x"), fmt(r.get("pct_bw"), ".1f", "%"),
                      fmt(r.get("tflops"), ".1f"),
                      fmt(r.get("err_smelt"), ".1e") + (" MISMATCH" if r.get("mismatch") else ""),
                      target_text(r["id"]), "" if met is None else ("yes" if met else "NO")])
    print()
    print_table(head, table)
    print("(x peer = peer ms / smelt ms: above 1, smelt is faster; relL2: smelt against the reference peer; "
          "%copy bw: compulsory bytes over time against the copy bandwidth above)")
    notes = [f"  {r['id']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        print("notes:\n" + "\n".join(notes))
    print("\nphases (s): " + ", ".join(f"{n} {t:.1f}" for n, t in phases))


class Phases:
    """Wall time per phase, summed by name: `with phases("torch"): ...`."""

    def __init__(self):
        self.items = []

    def __call__(self, name):
        outer = self

        class Ctx:
            def __enter__(self):
                self.t0 = time.time()

            def __exit__(self, *exc):
                outer.items.append((name, time.time() - self.t0))
        return Ctx()

    def summary(self):
        tot = {}
        for n, t in self.items:
            tot[n] = tot.get(n, 0.0) + t
        return list(tot.items())


def run_workload(args, wid, tmp, rng, torch, torch_ok, torch_note, phase):
    row = {"id": wid}
    t_start = time.time()
    with phase("weights and inputs"):
        w = make_workload(wid, tmp)
    if w.inputs is None:
        # without the model in python: smelt's own numbers only
        bench, _ = smelt_side(args, w, tmp, {}, row, phase)
        if bench:
            row["smelt_ms"] = bench["totals"][-1]["median_us"] * 1e-3
            row["copy_bw"] = bench["copy_bandwidth_gbs"] * 1e9
        row["note"] = w.note
        return row
    with phase("weights and inputs"):
        inputs = {n: w.fixed_inputs.get(n) if n in w.fixed_inputs else make_input(s, d, rng)
                  for n, (s, d) in w.inputs.items()}
        in_files = {}
        for n, a in inputs.items():
            f = os.path.join(tmp, f"{wid}_in_{len(in_files)}.npy")
            np.save(f, a)
            in_files[n] = f
    if not args.compile_only:
        with phase("param dump (smelt run --device ref)"):
            params = w.param_arrays if w.param_arrays is not None else dump_params(args, w, tmp)
    bench, souts = smelt_side(args, w, tmp, in_files, row, phase)
    if bench is None:
        return row
    graph = [t for t in bench["totals"] if "graph" in t["name"]]
    row["smelt_ms"] = (graph or bench["totals"])[-1]["median_us"] * 1e-3
    row["kernels"] = len(bench["kernels"])
    row["copy_bw"] = bench["copy_bandwidth_gbs"] * 1e9
    row["kernel_lines"] = kernel_lines(bench)
    row["bytes"] = w.compulsory_bytes()
    if row["copy_bw"]:
        row["pct_bw"] = 100.0 * row["bytes"] / (row["smelt_ms"] * 1e-3) / row["copy_bw"]
    if w.flops:
        row["tflops"] = w.flops / (row["smelt_ms"] * 1e-3) * 1e-12
    if torch_ok:
        with phase("torch"):
            peers = (w.peers or generic_peers)(torch, args, w, inputs, params)
            # the peer's weights, compiled graphs and graph pools go before the next workload
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
        row["peers"] = peers
        # the first peer with outputs is the reference (eager, SDPA flash)
        ref = next((p for p in peers.values() if p.get("outs")), None)
        if ref is not None:
            for p in peers.values():
                if p.get("outs") and p is not ref:
                    p["err"] = max(rel_l2(a, b) for a, b in zip(p["outs"], ref["outs"]))
            row["err_smelt"] = max(rel_l2(souts[o], ref["outs"][i]) for i, o in enumerate(w.outputs))
            tol = TOLERANCE.get(wid, 1e-4)
            row["mismatch"] = not row["err_smelt"] <= tol
            if row["mismatch"]:
                row["note"] = f"smelt's output differs: relL2 {row['err_smelt']:.2e} > {tol:g}"
        else:
            row["note"] = "no torch peer produced an output"
        for p in peers.values():
            p.pop("outs", None)
    else:
        row["note"] = torch_note
    evaluate(row)
    row["seconds"] = time.time() - t_start
    return row


def prepare(directory):
    """--prepare: the weights files and YAML copies, for running smelt by hand."""
    os.makedirs(directory, exist_ok=True)
    w2_params(directory)
    w4_params(directory)
    for name in ("w2_m1", "w2_m2048", "w4_decode", "w4_prefill"):
        copy_model(name, directory)
    for name in ("w1_gpu", "w3_prefill", "w3_decode"):
        shutil.copyfile(os.path.join(MODELS, f"{name}.yaml"), os.path.join(directory, f"{name}.yaml"))
    print(f"wrote w2.safetensors, w4.safetensors and the W1-W4 models into {directory}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", default=os.path.join(ROOT, "build-gpu", "smelt"))
    ap.add_argument("--only", default=DEFAULT_ONLY, help=f"workloads (also: {','.join(EXAMPLES + OPTIONAL)})")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode for W1-W3 and the examples")
    ap.add_argument("--w4-compile-mode", default="reduce-overhead",
                    help="torch.compile mode for W4 (reduce-overhead: CUDA graphs)")
    ap.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                    help="skip torch.compile (its compiles are the slow part of a run)")
    ap.add_argument("--tune-table", default=None, help="passed to smelt compile when it has the flag")
    ap.add_argument("--compile-only", action="store_true",
                    help="only smelt compile (W4 cold and warm timed); no GPU needed")
    ap.add_argument("--reuse-bundles", action="store_true",
                    help="with --keep DIR: take the bundles (and compile times) an earlier --compile-only left there")
    ap.add_argument("--keep", default=None, help="keep the .npy, weights and bundles in this directory")
    ap.add_argument("--deadline", type=float, default=None, metavar="S",
                    help="finish within about S seconds: torch.compile and then whole workloads are skipped "
                         "(and say so) when the time runs short, so the summary still prints")
    ap.add_argument("--prepare", default=None, metavar="DIR", help="write the W2/W4 weights and models, then exit")
    args = ap.parse_args()
    args.t0 = time.time()
    if args.reuse_bundles and not args.keep:
        ap.error("--reuse-bundles needs --keep DIR (where the bundles are)")
    if args.prepare:
        return prepare(args.prepare)
    if not os.access(args.smelt, os.X_OK):
        print(f"bench.py: no smelt binary at {args.smelt} (--smelt PATH)")
        return 1
    torch, torch_ok, torch_note = None, False, "torch not used (--compile-only)"
    if not args.compile_only:
        try:
            import torch
            torch_ok = torch.cuda.is_available()
            torch_note = f"torch {torch.__version__}" if torch_ok else "torch without a usable GPU"
        except ImportError as e:
            torch_note = f"no torch ({e})"
    print(f"smelt GPU benchmark: {torch_note}" + (f", {torch.cuda.get_device_name(0)}" if torch_ok else ""),
          flush=True)
    args.flags, args.flags_note = compile_flags(args)
    if args.flags_note:
        print(f"  {args.flags_note}")
    tcopy = torch_copy_bandwidth(torch) if torch_ok else None
    tmp = args.keep or tempfile.mkdtemp(prefix="smelt-gpu-bench-")
    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(0)
    rows, failed, copy_bw = [], 0, None
    phase = Phases()
    t0 = args.t0
    for wid in args.only.split(","):
        # W4 moves 705 MB of weights through numpy, smelt and torch: ~1 min without torch.compile
        need = 60 if wid.startswith("w4") else 20
        if args.deadline and time.time() - t0 > args.deadline - need:
            rows.append({"id": wid, "note": f"skipped: --deadline {args.deadline:g} s reached"})
            print(f"{wid}: skipped (--deadline)", flush=True)
            continue
        try:
            row = run_workload(args, wid, tmp, rng, torch, torch_ok, torch_note, phase)
            if row.get("mismatch"):
                failed += 1
        except Exception as e:
            failed += 1
            row = {"id": wid, "note": f"FAILED: {str(e)[:200]}"}
        copy_bw = row.get("copy_bw") or copy_bw
        rows.append(row)
        # as it goes, so that a run cut short by a timeout still says something
        keys = ("reused", "smelt_ms", "kernels", "compile_cold_s", "compile_warm_s", "smelt_compile_s", "pct_bw", "tflops",
                "err_smelt", "peer", "peer_ms", "speed", "seconds", "note")
        print(f"{wid}: " + ", ".join(f"{k} {row[k]:.4g}" if isinstance(row[k], float) else f"{k} {row[k]}"
                                     for k in keys if row.get(k) is not None), flush=True)
        for line in row.get("kernel_lines", []):
            print(line)
        print(f"  ({time.time() - t0:.0f} s so far)", flush=True)
    report(args, rows, copy_bw, tcopy, phase.summary())
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
