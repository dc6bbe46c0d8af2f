#!/usr/bin/env python3
"""Ranged dims on the CPU (SPEC §2, issue 12 item 2): one bundle compiled
for a range (`--dim seq=1..16`, or `seq: {max: 16}` in the YAML) runs any
value of it, and gives what a bundle compiled for that exact value gives.

The exact-shape compiles are the oracle here: they are themselves checked
against the reference interpreter and numpy elsewhere (test_cpu_examples,
test_generate).  Also: generation from a ranged bundle gives the same ids,
the state a ranged prefill writes is the same, and bad lengths and models
a range cannot serve are clear errors.

With --device cuda (the GPU machine: scripts/gpu-check.sh) every bundle is
compiled with --target cuda and run on the GPU, ranged against exact there.
On the CPU run the ranged models are also compiled for CUDA (NVRTC, no GPU).

usage: test_ranged.py --smelt SMELT [--device cpu|cuda] (from the repository root)
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import argparse

ap = argparse.ArgumentParser()
ap.add_argument("--smelt", default="build/smelt")
ap.add_argument("--examples", default="examples")
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
opts = ap.parse_args()
SMELT, EXAMPLES, DEVICE = os.path.abspath(opts.smelt), opts.examples, opts.device
TARGET = ["--target", "cuda"] if DEVICE == "cuda" else []
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures += 1


def smelt(*args, ok=True):
    r = subprocess.run([SMELT, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise SystemExit(f"smelt {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


tmp = tempfile.mkdtemp(prefix="smelt_ranged_")


def path(name):
    return os.path.join(tmp, name)


def compile_(model, dims, out):
    smelt("compile", os.path.join(EXAMPLES, model), "--dim", dims, "-o", path(out), "--no-cache", *TARGET)
    return path(out)


def run(bundle, inputs, outputs):
    args = ["run", bundle, "--device", DEVICE]
    for name, arr in inputs.items():
        f = path(f"in_{name}_{arr.shape}.npy".replace(" ", ""))
        np.save(f, arr)
        args += ["--input", f"{name}={f}"]
    for name in outputs:
        args += ["--output", f"{name}={path('out_' + name + '.npy')}"]
    smelt(*args)
    return {name: np.load(path("out_" + name + ".npy")) for name in outputs}


def same(a, b, what, exact=False):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        check(False, f"{what}: shapes {a.shape} and {b.shape}")
        return
    if exact or not np.issubdtype(a.dtype, np.floating):
        check(np.array_equal(a, b), f"{what}: equal")
    else:
        err = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
        check(np.allclose(a, b, rtol=1e-5, atol=1e-5), f"{what}: max abs diff {err:.3g}")


rng = np.random.default_rng(7)

# ---- tiny_lm: the generating model, ranged seq over its prefill and decode ----
ranged = compile_("tiny_lm.yaml", "seq=1..16", "lm_range.smelt")
ir = smelt("compile", os.path.join(EXAMPLES, "tiny_lm.yaml"), "--dim", "seq=1..16", "--emit", "ir", "-o", path("lm.ir"),
           *TARGET)
text = open(path("lm.ir")).read()
check("range seq: 1..16" in text and "input ids: i32[<=16]" in text, "IR shows the range and the ranged inputs")
for n in (1, 2, 7, 16):
    exact = compile_("tiny_lm.yaml", f"seq={n}", f"lm_{n}.smelt")
    ids = rng.integers(0, 256, n).astype(np.int32)
    pos = np.arange(n, dtype=np.int32)
    a = run(ranged, {"ids": ids, "pos": pos}, ["logits", "next"])
    b = run(exact, {"ids": ids, "pos": pos}, ["logits", "next"])
    same(a["logits"], b["logits"], f"tiny_lm seq={n}: logits of the ranged bundle vs the seq={n} bundle")
    same(a["next"], b["next"], f"tiny_lm seq={n}: next token")

# ---- the same range declared in the model ----
src = open(os.path.join(EXAMPLES, "tiny_lm.yaml")).read()
declared = re.sub(r"dims: \{seq: 16,", "dims: {seq: {max: 16},", src)
assert declared != src
model = path("tiny_lm_declared.yaml")
open(model, "w").write(declared)
os.symlink(os.path.join(os.path.abspath(EXAMPLES), "tiny_llama.safetensors"), path("tiny_llama.safetensors"))
smelt("compile", model, "-o", path("declared.smelt"), "--no-cache", *TARGET)
ids = rng.integers(0, 256, 5).astype(np.int32)
pos = np.arange(5, dtype=np.int32)
a = run(path("declared.smelt"), {"ids": ids, "pos": pos}, ["logits"])
b = run(compile_("tiny_lm.yaml", "seq=5", "lm_5.smelt"), {"ids": ids, "pos": pos}, ["logits"])
same(a["logits"], b["logits"], "seq: {max: 16} in the YAML: seq=5 vs the seq=5 bundle")
r = smelt("compile", model, "--dim", "seq=4", "--emit", "ir", "-o", path("d4.ir"))
check("range" not in open(path("d4.ir")).read(), "--dim seq=4 makes a declared range exact")

# ---- generation: a ranged bundle (one specialisation for prefill and decode) ----
g1 = smelt("generate", ranged, "--prompt-ids", "4,44,208,166,9", "-n", "24", "--json", "--device", DEVICE).stdout
g2 = smelt("generate", os.path.join(EXAMPLES, "tiny_lm.yaml"), "--prompt-ids", "4,44,208,166,9", "-n", "24",
           "--json", "--device", DEVICE).stdout
ids1 = re.search(r'"ids":\s*\[([^\]]*)\]', g1).group(1)
ids2 = re.search(r'"ids":\s*\[([^\]]*)\]', g2).group(1)
check(ids1 == ids2 and ids1.count(",") == 23, "generate: a seq=1..16 bundle gives the ids of exact compiles")
mixed = compile_("tiny_lm.yaml", "seq=1,2..16", "lm_mixed.smelt")
g3 = smelt("generate", mixed, "--prompt-ids", "4,44,208,166,9", "-n", "24", "--json", "--device", DEVICE).stdout
check(re.search(r'"ids":\s*\[([^\]]*)\]', g3).group(1) == ids2, "generate: seq=1 exact plus a 2..16 range")

# ---- other models: a ranged batch and a ranged sequence ----
for model, dim, name, n, shape_of in [
    ("mlp.yaml", "batch", "x", 3, lambda n: (n, 64)),
    ("cnn.yaml", "batch", "x", 2, lambda n: (n, 3, 32, 32)),
    ("tiny_llama.yaml", "seq", "x", 5, lambda n: (n, 64)),
]:
    hi = {"batch": 8 if model == "mlp.yaml" else 4, "seq": 16}[dim]
    rb = compile_(model, f"{dim}=1..{hi}", f"{model}_r.smelt")
    eb = compile_(model, f"{dim}={n}", f"{model}_{n}.smelt")
    ins = smelt("inspect", eb).stdout
    feed = {name: rng.standard_normal(shape_of(n)).astype(np.float32)}
    if model == "tiny_llama.yaml":
        feed["pos"] = np.arange(n, dtype=np.int32)
    outs = re.findall(r"^\s*output\s+(\S+):", ins, re.M) or ["y"]
    try:
        a = run(rb, feed, outs)
        b = run(eb, feed, outs)
        for o in outs:
            same(a[o], b[o], f"{model} {dim}={n}: '{o}' of the {dim}=1..{hi} bundle vs the exact one")
    except SystemExit as e:
        check(False, f"{model}: {e}")

# ---- bad input ----
np.save(path("ids20.npy"), np.zeros(20, np.int32))
r = smelt("run", ranged, "--device", DEVICE, "--input", f"ids={path('ids20.npy')}", ok=False)
check(r.returncode == 1 and "i32[<=16]" in r.stderr and "[20]" in r.stderr,
      "a length beyond the range is a clear error: " + r.stderr.strip().splitlines()[-1][:120])
r = smelt("compile", os.path.join(EXAMPLES, "tiny_lm.yaml"), "--dim", "seq=9..3", "-o", path("bad.smelt"), ok=False)
check(r.returncode != 0 and "9..3" in r.stderr, "an empty range is refused: " + r.stderr.strip()[:100])
r = smelt("compile", os.path.join(EXAMPLES, "gpt2_block.yaml"), "--dim", "seq=1..16", "-o", path("bad.smelt"), *TARGET,
          ok=False)
check(r.returncode == 1 and "gpt2_block.yaml:" in r.stderr and "seq" in r.stderr,
      "a model whose constants follow the dim is refused, located: " + r.stderr.strip()[:110])
reduce_model = path("reduce.yaml")
open(reduce_model, "w").write("""smelt: 1
name: reduce
dtype: f32
dims: {seq: {max: 8}}
inputs: {x: {shape: [seq, 4]}}
nodes:
  - {out: y, op: sum, in: [x], axes: [0]}
outputs: [y]
""")
r = smelt("compile", reduce_model, "-o", path("bad.smelt"), *TARGET, ok=False)
check(r.returncode == 1 and "reduce.yaml:7:" in r.stderr and "reduces along a ranged axis" in r.stderr,
      "a reduction along the range is refused at its node: " + r.stderr.strip()[:120])
if DEVICE == "cpu":
    # the same ranged models compile for CUDA (NVRTC; they run in --device cuda mode on the GPU machine)
    for model, dims in [("tiny_lm.yaml", "seq=1..16"), ("tiny_lm.yaml", "seq=1,2..16"), ("mlp.yaml", "batch=1..8"),
                        ("cnn.yaml", "batch=1..4"), ("tiny_llama.yaml", "seq=1..16")]:
        r = smelt("compile", os.path.join(EXAMPLES, model), "--dim", dims, "--target", "cuda", "-o", path("cu.smelt"),
                  "--no-cache", ok=False)
        if r.returncode != 0 and ("NVRTC" in r.stderr or "nvrtc" in r.stderr) and "not found" in r.stderr:
            print("SKIP: CUDA compiles of ranges: no NVRTC")
            break
        check(r.returncode == 0, f"{model} --dim {dims} compiles for CUDA" + ("" if r.returncode == 0 else ": " + r.stderr[-300:]))

print(f"test_ranged: {failures} failure(s)")
sys.exit(1 if failures else 0)
