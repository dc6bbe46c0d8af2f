#!/usr/bin/env python3
"""smelt's GPU benchmark (SPEC §8): smelt against PyTorch eager and torch.compile.

A benchmark, not a test: never run by CI; scripts/gpu-check.sh runs it on the
lent GPU machine after the GPU tests.  For every workload, in one run of
this script, on one GPU:

  1. inputs are made here (floats uniform in [-1, 1); integer inputs, the
     positions, count 0, 1, 2, ... along the last axis; bools alternate) and
     saved as .npy;
  2. the params come from smelt: `smelt run MODEL --device ref --output
     NAME=FILE.npy` (params are seeded by name, so for W1 a run at
     --dim rows=8 gives the same b and g cheaply), so every peer computes
     with exactly smelt's weights;
  3. smelt compiles the model for the GPU (`smelt compile --target cuda`),
     `smelt bench --device cuda --json` times it (the total is the replay of
     its CUDA graph: 10 replays queued back to back, median over --iters),
     and `smelt run BUNDLE --device cuda` produces its output;
  4. PyTorch eager and torch.compile run the same model on the same inputs
     and weights, on the GPU, timed with CUDA events the same way (10 calls
     back to back, median over --iters, after warm-up).
     W1 is written out in torch by hand; the examples are interpreted op by
     op with bench/cpu/torch_peer.py on the model read by
     bench/cpu/yaml_model.py (which needs pyyaml: without it the torch
     columns of the examples say n/a and smelt is still timed).

Outputs are compared as relative L2 error (float64) against torch eager.
% of bandwidth: compulsory bytes (every input and param read once, every
output written once) over time, against the device's copy bandwidth that
`smelt bench` measured (a 1 GiB device-to-device copy kernel timed with
CUDA events, read + write bytes); torch's own copy (dst.copy_(src), 1 GiB)
is printed beside it.

W2 (w2_m1, w2_m2048: the SwiGLU MLP at H 4096, I 11008, f16) is the
exception to 2.: its 3 x 86 MiB of weights are made here with numpy and
written to a safetensors file in the temporary directory, beside a copy of
bench/models/w2_m*.yaml that reads them with `from:`.  Its note also gives
TFLOP/s and the time of the three matmuls alone in torch (cuBLAS).

Usage: bench.py [--smelt PATH] [--only w1,mlp,...] [--iters 20] [--keep DIR]
                [--compile-mode default|reduce-overhead|max-autotune]
Exit status 0 when everything ran (a slow result is not a failure), 1 when
smelt failed on a workload.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "cpu"))

NP_DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32,
             "i8": np.int8, "u8": np.uint8, "bool": np.bool_}
BATCH = 10  # calls queued back to back per timing sample, like smelt bench's graph replays


def run_cmd(cmd, timeout=600):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
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
    def __init__(self, wid, path, inputs, params, outputs, dims=None, cheap_dims=None, torch_fn=None,
                 model=None):
        self.wid, self.path = wid, path
        self.inputs = inputs          # name -> (shape, dtype)
        self.params = params          # name -> (shape, dtype)
        self.outputs = outputs        # names
        self.dims = dims or {}
        self.cheap_dims = cheap_dims  # dims at which the params are the same and the ref run is cheap
        self.torch_fn = torch_fn      # (torch, inputs dict, params dict) -> list of outputs
        self.model = model            # yaml_model.Model, when read

    def compulsory_bytes(self):
        if self.model is not None:
            return self.model.compulsory_bytes()
        size = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i8": 1, "u8": 1, "bool": 1}
        tot = sum(math.prod(s) * size[d] for s, d in list(self.inputs.values()) + list(self.params.values()))
        return tot + sum(self.out_bytes)


def w1_torch(torch, x, p):
    F = torch.nn.functional
    h = F.gelu(x["x"] + p["b"], approximate="tanh") + x["r"]
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * p["g"].float()
    return [y.to(h.dtype)]


def w1_workload():
    rows, hidden = 16384, 4096
    w = Workload("w1", os.path.join(ROOT, "bench", "models", "w1_gpu.yaml"),
                 {"x": ((rows, hidden), "f16"), "r": ((rows, hidden), "f16")},
                 {"b": ((hidden,), "f16"), "g": ((hidden,), "f16")}, ["y"], cheap_dims={"rows": 8},
                 torch_fn=lambda torch, x, p: w1_torch(torch, x, p))
    w.out_bytes = [rows * hidden * 2]
    return w


W2_H, W2_I = 4096, 11008


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


def w2_params(tmp, cache={}):
    """The W2 weights (numpy normal, std 1/sqrt(fan_in)), written once per
    run to tmp/w2.safetensors: smelt reads them with `from:`, torch gets the
    same arrays."""
    if "p" not in cache:
        rng = np.random.default_rng(2)
        p = {}
        for name, shape in (("w_gate", (W2_H, W2_I)), ("w_up", (W2_H, W2_I)), ("w_down", (W2_I, W2_H))):
            p[name] = (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[0])).astype(np.float16)
        write_safetensors(os.path.join(tmp, "w2.safetensors"), p)
        cache["p"] = p
    return cache["p"]


def w2_torch(torch, x, p):
    F = torch.nn.functional
    return [(F.silu(x["x"] @ p["w_gate"]) * (x["x"] @ p["w_up"])) @ p["w_down"]]


def w2_workload(wid, tmp):
    """W2 at M = 1 (decode) or 2048 (prefill); the YAML is copied beside the
    weights file it names."""
    m = int(wid.split("_m")[1])
    src = os.path.join(ROOT, "bench", "models", f"{wid}.yaml")
    path = os.path.join(tmp, f"{wid}.yaml")
    shutil.copyfile(src, path)
    params = w2_params(tmp)
    w = Workload(wid, path, {"x": ((m, W2_H), "f16")},
                 {k: (v.shape, "f16") for k, v in params.items()}, ["y"],
                 torch_fn=lambda torch, x, p: w2_torch(torch, x, p))
    w.param_arrays = params
    w.out_bytes = [m * W2_H * 2]
    w.m = m
    return w


def w2_cublas(torch, inputs, params, iters):
    """The three matmuls of W2 alone in torch (cuBLAS), ms."""
    x = torch.from_numpy(inputs["x"]).cuda()
    p = {k: torch.from_numpy(v).cuda() for k, v in params.items()}
    h = torch.empty((x.shape[0], W2_I), dtype=x.dtype, device="cuda")

    def mm():
        torch.matmul(x, p["w_gate"])
        torch.matmul(x, p["w_up"])
        return torch.matmul(h, p["w_down"])
    with torch.inference_mode():
        return time_torch(torch, mm, iters)


def example_workload(name):
    path = os.path.join(ROOT, "examples", f"{name}.yaml")
    try:
        import yaml_model
        m = yaml_model.load(path)
    except ImportError as e:
        return Workload(name, path, None, None, None), f"cannot read the YAML in python ({e})"
    w = Workload(name, path, dict(m.inputs), dict(m.params), list(m.outputs), model=m)
    w.out_bytes = [m.nbytes(o) for o in m.outputs]
    return w, None


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


def smelt_side(args, w, tmp, in_files):
    """Compiles, benches and runs the workload with smelt; returns (bench
    json, {output: array})."""
    bundle = os.path.join(tmp, f"{w.wid}.smelt")
    t0 = time.time()
    run_cmd([args.smelt, "compile", w.path, "-o", bundle, "--target", "cuda"])
    compile_s = time.time() - t0
    out = run_cmd([args.smelt, "bench", bundle, "--device", "cuda", "--json", "--iters", str(args.iters)])
    bench = json.loads(out)
    bench["compile_s"] = compile_s
    cmd = [args.smelt, "run", bundle, "--device", "cuda"]
    for n, f in in_files.items():
        cmd += ["--input", f"{n}={f}"]
    outs = {}
    for i, o in enumerate(w.outputs):
        f = os.path.join(tmp, f"{w.wid}_smelt_out{i}.npy")
        cmd += ["--output", f"{o}={f}"]
        outs[o] = f
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


def torch_side(torch, args, w, inputs, params):
    """{'eager': (ms, outputs), 'compile': (ms, outputs)} or a reason string."""
    if w.torch_fn is not None:
        fn = lambda x, p: w.torch_fn(torch, x, p)
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

    dev = "cuda"
    # the op interpreter makes tensors of its own (rope's frequencies): on the GPU too
    torch.set_default_device(dev)
    x = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in inputs.items()}
    p = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in params.items()}
    res = {}
    with torch.inference_mode():
        ms = time_torch(torch, lambda: fn(x, p), args.iters)
        res["eager"] = (ms, [t.float().cpu().numpy() for t in fn(x, p)])
        try:
            kw = {} if args.compile_mode == "default" else {"mode": args.compile_mode}
            cfn = torch.compile(fn, **kw)
            t0 = time.time()
            cfn(x, p)
            torch.cuda.synchronize()
            res["compile_s"] = time.time() - t0
            ms = time_torch(torch, lambda: cfn(x, p), args.iters)
            res["compile"] = (ms, [t.float().cpu().numpy() for t in cfn(x, p)])
        except Exception as e:  # a compiler failure is a result, not a crash
            res["compile"] = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return res


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", default=os.path.join(ROOT, "build-gpu", "smelt"))
    ap.add_argument("--only", default="w1,w2_m1,w2_m2048,mlp,cnn,gpt2_block,tiny_llama")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--compile-mode", default="default")
    ap.add_argument("--keep", default=None, help="keep the .npy and bundles in this directory")
    args = ap.parse_args()
    if not os.access(args.smelt, os.X_OK):
        print(f"bench.py: no smelt binary at {args.smelt} (--smelt PATH)")
        return 1
    try:
        import torch
        torch_ok = torch.cuda.is_available()
        torch_note = f"torch {torch.__version__}" if torch_ok else "torch without a usable GPU"
    except ImportError as e:
        torch, torch_ok, torch_note = None, False, f"no torch ({e})"
    print(f"smelt GPU benchmark: {torch_note}" + (f", {torch.cuda.get_device_name(0)}" if torch_ok else ""))
    tcopy = torch_copy_bandwidth(torch) if torch_ok else None
    tmp = args.keep or tempfile.mkdtemp(prefix="smelt-gpu-bench-")
    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(0)
    rows, failed, copy_bw = [], 0, None
    for wid in args.only.split(","):
        note = None
        if wid == "w1":
            w = w1_workload()
        elif wid in ("w2_m1", "w2_m2048"):
            w = w2_workload(wid, tmp)
        else:
            w, note = example_workload(wid)
        row = {"id": wid}
        try:
            if w.inputs is None:
                # without the model in python: smelt's own numbers only
                bundle = os.path.join(tmp, f"{wid}.smelt")
                run_cmd([args.smelt, "compile", w.path, "-o", bundle, "--target", "cuda"])
                bench = json.loads(run_cmd([args.smelt, "bench", bundle, "--device", "cuda", "--json",
                                            "--iters", str(args.iters)]))
                row["smelt_ms"] = bench["totals"][-1]["median_us"] * 1e-3
                copy_bw = bench["copy_bandwidth_gbs"] * 1e9 or copy_bw
                row["note"] = note
                rows.append(row)
                continue
            inputs = {n: make_input(s, d, rng) for n, (s, d) in w.inputs.items()}
            in_files = {}
            for n, a in inputs.items():
                f = os.path.join(tmp, f"{wid}_in_{len(in_files)}.npy")
                np.save(f, a)
                in_files[n] = f
            params = getattr(w, "param_arrays", None) or dump_params(args, w, tmp)
            bench, souts = smelt_side(args, w, tmp, in_files)
            graph = [t for t in bench["totals"] if "graph" in t["name"]]
            row["smelt_ms"] = (graph or bench["totals"])[-1]["median_us"] * 1e-3
            row["kernels"] = len(bench["kernels"])
            row["smelt_compile_s"] = bench["compile_s"]
            copy_bw = bench["copy_bandwidth_gbs"] * 1e9 or copy_bw
            row["bytes"] = w.compulsory_bytes()
            if torch_ok:
                t = torch_side(torch, args, w, inputs, params)
                ems, eouts = t["eager"]
                row["eager_ms"] = ems
                row["err_smelt"] = max(rel_l2(souts[o], eouts[i]) for i, o in enumerate(w.outputs))
                if isinstance(t["compile"], str):
                    row["note"] = t["compile"]
                else:
                    cms, couts = t["compile"]
                    row["compile_ms"] = cms
                    row["compile_s"] = t.get("compile_s")
                    row["err_compile"] = max(rel_l2(couts[i], eouts[i]) for i in range(len(w.outputs)))
                if wid.startswith("w2"):
                    flop = 2.0 * w.m * W2_H * W2_I * 3
                    row["tflops"] = flop / (row["smelt_ms"] * 1e-3) * 1e-12
                    cub = w2_cublas(torch, inputs, params, args.iters)
                    row["cublas_ms"] = cub
                    extra = (f"{row['tflops']:.1f} TFLOP/s; cuBLAS 3 matmuls {cub:.4f} ms "
                             f"({flop / (cub * 1e-3) * 1e-12:.1f} TFLOP/s): smelt at {cub / row['smelt_ms']:.2f}x cuBLAS")
                    row["note"] = (row.get("note") + "; " if row.get("note") else "") + extra
            else:
                row["note"] = torch_note
        except Exception as e:
            failed += 1
            row["note"] = f"FAILED: {str(e)[:160]}"
        rows.append(row)
        # as it goes, so that a run cut short by a timeout still says something
        print(f"{wid}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in row.items() if k != "id"), flush=True)

    print(f"\ndevice copy bandwidth: {fmt(copy_bw and copy_bw * 1e-9, '.0f')} GB/s (smelt bench: copy kernel, "
          f"CUDA events, read + write); torch dst.copy_(src) of 1 GiB: {fmt(tcopy and tcopy * 1e-9, '.0f')} GB/s")
    print(f"times: median over {args.iters} samples of {BATCH} calls back to back (smelt: CUDA graph replays); "
          f"torch.compile mode: {args.compile_mode}")
    head = ["workload", "kernels", "smelt ms", "eager ms", "compile ms", "eager/smelt", "compile/smelt",
            "smelt %copy", "relL2 smelt", "relL2 compile", "note"]
    table = []
    for r in rows:
        s, e, c = r.get("smelt_ms"), r.get("eager_ms"), r.get("compile_ms")
        pct = None
        if s and r.get("bytes") and copy_bw:
            pct = 100.0 * r["bytes"] / (s * 1e-3) / copy_bw
        table.append([r["id"], fmt(r.get("kernels"), "d"), fmt(s, ".4f"), fmt(e, ".4f"), fmt(c, ".4f"),
                      fmt(e / s if s and e else None, ".2f") + ("x" if s and e else ""),
                      fmt(c / s if s and c else None, ".2f") + ("x" if s and c else ""),
                      fmt(pct, ".1f") + ("%" if pct else ""), fmt(r.get("err_smelt"), ".2e"),
                      fmt(r.get("err_compile"), ".2e"), r.get("note") or ""])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    for line in [head] + table:
        print("  ".join(str(x).ljust(wd) for x, wd in zip(line, widths)).rstrip())
    print("(ratios > 1: smelt is faster; relL2 against torch eager in float64; %copy: compulsory bytes over "
          "time against the copy bandwidth above)")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
