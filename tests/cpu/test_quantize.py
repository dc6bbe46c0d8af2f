#!/usr/bin/env python3
"""`smelt compile --quantize` against numpy: the same quantised arithmetic.

The quantisation scheme (passes/quantize.c) is written out again here in
numpy: per group of G elements along K (or per output channel), the scale
amax / 127 (int8), amax / 7 (int4) or amax / 448 (fp8 e4m3), rounded to the
weight's dtype; the weight divided by it and rounded to nearest even
(np.rint; e4m3 by nearest code, ties to the even code, saturating at 448),
clamped to the integer range; the dequantised weight q * s rounded to the
weight's dtype.  A model with two matmuls (a [K, N] weight with a bias and
silu epilogue, an [N, K] weight read with transpose_b) is compiled for the
CPU with each mode and run (`smelt run --device cpu`, and the reference
interpreter on the bundle), and its outputs must be numpy's on the same
inputs: relative L2 1e-5 in f32 (accumulation order only), 4e-3 in f16.

Also: examples/tiny_llama.yaml quantises with every mode, its report lists
all 14 matmuls with their cosine and is stored in the bundle (smelt inspect
--quant); int8 layers are all above 0.9999, int4 below 0.999 is flagged,
--keep-below keeps flagged layers in float, --quantize-only picks layers;
bad input: a group that does not divide K (located error, exit 1), options
without --quantize (exit 2).  The pass's threads change nothing: one thread
and the default give the same bundle and report.

Usage: test_quantize.py --smelt PATH
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TINY = os.path.join(ROOT, "examples", "tiny_llama.yaml")

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# ---- numpy: the quantisation scheme ----


def e4m3_values():
    """The 127 non-negative finite e4m3 values, by code 0..126."""
    out = []
    for c in range(127):
        e, m = c >> 3, c & 7
        out.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(out)


E4M3 = e4m3_values()


def e4m3_round(v):
    """Round to the nearest e4m3 value, ties to the even code, saturating."""
    a = np.minimum(np.abs(v), 448.0)
    hi = np.clip(np.searchsorted(E4M3, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(v) * E4M3[code]


def dequantised(w, mode, group, kaxis):
    """The weight the quantised kernels compute with, in float64."""
    dt = w.dtype
    wk = (w if kaxis == 0 else w.T).astype(np.float64)  # [K, N]
    K, N = wk.shape
    G = group or K
    g = wk.reshape(K // G, G, N)
    qmax = {"int8": 127.0, "int4": 7.0, "fp8": 448.0}[mode]
    s = (np.abs(g).max(axis=1) / qmax).astype(dt).astype(np.float64)[:, None, :]
    v = np.divide(g, s, out=np.zeros_like(g), where=s > 0)
    if mode == "fp8":
        q = e4m3_round(v)
    else:
        lo, hi = (-127, 127) if mode == "int8" else (-8, 7)
        q = np.clip(np.rint(v), lo, hi)
    wq = (q * s).reshape(K, N).astype(dt).astype(np.float64)
    return wq if kaxis == 0 else wq.T


def silu(x):
    return x / (1 + np.exp(-x))


def safetensors_bytes(tensors):
    header, offset = {}, 0
    names = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16"}
    for name, arr in tensors:
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return b"".join([struct.pack("<Q", len(text)), text] + [np.ascontiguousarray(a).tobytes() for _, a in tensors])


MODEL = """smelt: 1
name: qmm
dtype: {dt}
dims: {{m: 4, k: 64, n: 48}}
weights: w.safetensors
inputs:
  x: {{shape: [m, k]}}
params:
  w:  {{shape: [k, n], from: w}}
  wt: {{shape: [n, k], from: wt}}
  b:  {{shape: [n], from: b}}
nodes:
  - {{out: y0, op: matmul, in: [x, w]}}
  - {{out: y1, op: add, in: [y0, b]}}
  - {{out: y, op: silu, in: [y1]}}
  - {{out: z, op: matmul, in: [x, wt], transpose_b: true}}
outputs: [y, z]
"""


def constants_bytes(smelt, bundle):
    """The size of the bundle's constants section (smelt inspect)."""
    r = run([smelt, "inspect", bundle])
    mm = re.search(r"^\s+constants\s+(\d+) bytes", r.stdout, re.M)
    return int(mm.group(1)) if mm else -1


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_numpy_oracle(smelt, tmp):
    rng = np.random.default_rng(14)
    sizes = {}
    for dts in ("f32", "f16"):
        npdt = np.float32 if dts == "f32" else np.float16
        w = (rng.standard_normal((64, 48)) * 0.05).astype(npdt)
        wt = (rng.standard_normal((48, 64)) * 0.05).astype(npdt)
        b = (rng.standard_normal(48) * 0.1).astype(npdt)
        d = os.path.join(tmp, dts)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "w.safetensors"), "wb") as f:
            f.write(safetensors_bytes([("w", w), ("wt", wt), ("b", b)]))
        with open(os.path.join(d, "qmm.yaml"), "w") as f:
            f.write(MODEL.format(dt=dts))
        tol = 1e-5 if dts == "f32" else 4e-3
        for mode, group in (("int8", 0), ("int8", 32), ("int4", 32), ("int4", 16), ("fp8", 0)):
            for m in (1, 4):
                label = f"{dts} {mode} group {group} m={m}"
                x = rng.uniform(-1, 1, (m, 64)).astype(npdt)
                xp = os.path.join(d, "x.npy")
                np.save(xp, x)
                out = os.path.join(d, f"q_{mode}_{group}_{m}.smelt")
                r = run([smelt, "compile", os.path.join(d, "qmm.yaml"), "-o", out, "--dim", f"m={m}", "--quantize", mode,
                         "--group", str(group)])
                if r.returncode != 0:
                    check(False, f"{label}: compile: {r.stderr.strip()}")
                    continue
                xd = x.astype(np.float64)
                want_y = silu(xd @ dequantised(w, mode, group, 0) + b.astype(np.float64))
                want_z = xd @ dequantised(wt, mode, group, 1).T
                for dev in ("cpu", "ref"):
                    yp, zp = os.path.join(d, "y.npy"), os.path.join(d, "z.npy")
                    r = run([smelt, "run", out, "--device", dev, "--input", f"x={xp}", "--output", f"y={yp}",
                             "--output", f"z={zp}"])
                    if r.returncode != 0:
                        check(False, f"{label} on {dev}: run: {r.stderr.strip()}")
                        continue
                    ey, ez = rel_l2(np.load(yp).astype(np.float64), want_y), rel_l2(np.load(zp).astype(np.float64), want_z)
                    check(ey <= tol and ez <= tol, f"{label} on {dev}: rel L2 {ey:.2e} (epilogue), {ez:.2e} (transpose_b) <= {tol}")
                if m == 1:
                    sizes[(dts, mode, group)] = constants_bytes(smelt, out)
        # int4's weights take half of int8's bytes (2 x 64 x 48 elements; the
        # scales of groups of 32 add 2 x 2 x 48 of the weight's dtype)
        half = 64 * 48
        scales = 2 * 2 * 48 * np.dtype(npdt).itemsize
        shrink = sizes[(dts, "int8", 32)] - sizes[(dts, "int4", 32)]
        check(half - 128 <= shrink <= half + 128,
              f"{dts}: the int4 bundle's constants are {shrink} bytes fewer than int8's (the weights' half: {half}; "
              f"scales {scales} in each)")


def parse_report(text):
    rows = {}
    for line in text.splitlines():
        mm = re.match(r"\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.e+-]+)(.*)$", line)
        if mm:
            rows[mm.group(1)] = (float(mm.group(6)), float(mm.group(7)), mm.group(8))
    return rows


def test_tiny_llama(smelt, tmp):
    reports = {}
    for mode, extra in (("int8", []), ("int4", ["--group", "16"]), ("fp8", [])):
        out = os.path.join(tmp, f"tl_{mode}.smelt")
        r = run([smelt, "compile", TINY, "-o", out, "--quantize", mode] + extra)
        check(r.returncode == 0, f"tiny_llama --quantize {mode}: compiles ({r.stderr.strip()[:200]})")
        if r.returncode != 0:
            continue
        rows = parse_report(r.stdout)
        reports[mode] = rows
        check(len(rows) == 14, f"tiny_llama {mode}: the report lists 14 matmuls (got {len(rows)})")
        check(f"14 of 14 matmuls quantised" in r.stdout, f"tiny_llama {mode}: all 14 quantised")
        ins = run([smelt, "inspect", out, "--quant"])
        check(ins.returncode == 0 and ins.stdout == r.stdout, f"tiny_llama {mode}: the bundle's quant-report is what compile printed")
        rr = run([smelt, "run", out, "--device", "cpu", "--check"])
        check(rr.returncode == 0 and " pass " in rr.stdout, f"tiny_llama {mode}: runs on the CPU and matches the reference")
        cos = [c for c, _, _ in rows.values()]
        flagged = [n for n, (c, _, tail) in rows.items() if "FLAGGED" in tail]
        check(all((c < 0.999) == (n in flagged) for n, (c, _, _) in rows.items()), f"tiny_llama {mode}: flagged exactly below 0.999")
        if mode == "int8":
            check(min(cos) > 0.9999, f"tiny_llama int8: every layer's cosine > 0.9999 (min {min(cos):.6f})")
        if mode == "fp8":
            check(min(cos) > 0.999, f"tiny_llama fp8: every layer's cosine > 0.999 (min {min(cos):.6f})")
        if mode == "int4":
            check(0.99 < min(cos) < 0.999, f"tiny_llama int4 g16: cosines in (0.99, 0.999) on random weights (min {min(cos):.6f})")
    # the ordering of the modes' errors: int8 < fp8 < int4 in every layer
    if len(reports) == 3:
        check(all(reports["int8"][n][1] < reports["fp8"][n][1] < reports["int4"][n][1] for n in reports["int8"]),
              "tiny_llama: relative error int8 < fp8 < int4 in every layer")
    out = os.path.join(tmp, "tl_keep.smelt")
    r = run([smelt, "compile", TINY, "-o", out, "--quantize", "int4", "--group", "16", "--keep-below", "0.999"])
    check(r.returncode == 0 and "0 of 14 matmuls quantised" in r.stdout and r.stdout.count("kept in float") == 14,
          "tiny_llama int4 --keep-below 0.999: every flagged layer kept in float")
    rr = run([smelt, "run", out, "--device", "cpu", "--check"])
    check(rr.returncode == 0, "tiny_llama with every layer kept runs")
    r = run([smelt, "compile", TINY, "-o", out, "--quantize", "int8", "--quantize-only", "layer.0/*"])
    rows = parse_report(r.stdout)
    check(r.returncode == 0 and len(rows) == 7 and all(n.startswith("layer.0/") for n in rows),
          f"--quantize-only 'layer.0/*': the 7 matmuls of layer 0 ({sorted(rows)})")
    r = run([smelt, "compile", TINY, "-o", out, "--quantize", "int4"])
    check(r.returncode == 1 and re.search(r"tiny_llama\.yaml:\d+:\d+: error: node 'layer\.0/q0' \(matmul\): --quantize group 128 "
                                          r"does not divide K = 64", r.stderr) is not None,
          f"group 128 on K = 64: a located error ({r.stderr.strip()[:160]})")
    r = run([smelt, "compile", TINY, "-o", out, "--group", "32"])
    check(r.returncode == 2 and "apply to --quantize" in r.stderr, "--group without --quantize: usage error")
    r = run([smelt, "compile", TINY, "-o", out, "--quantize", "int3"])
    check(r.returncode == 2 and "int8, int4 or fp8" in r.stderr, "--quantize int3: usage error")


THREADS_YAML = """smelt: 1
name: qthreads
seed: 5
dtype: f32
dims: {m: 4, k: 1024, n: 2048}
inputs:
  x: {shape: [m, k]}
params:
  w1: {shape: [k, n], init: {normal: 0.05}}
  w2: {shape: [n, k], init: {normal: 0.05}}
  w3: {shape: [k, n], init: {normal: 0.05}}
nodes:
  - {out: h, op: matmul, in: [x, w1]}
  - {out: y, op: matmul, in: [h, w2]}
  - {out: z, op: matmul, in: [y, w3]}
outputs: [z]
"""


def test_threads(smelt, tmp):
    """The quantize pass quantises weights and measures layers on threads
    (format/parallel.c: one per 4 MiB of weights, at most one a core; 24 MiB
    here): one thread and the default give the same bundle, byte for byte,
    and the same report, whatever the threads' order."""
    yml = os.path.join(tmp, "qthreads.yaml")
    with open(yml, "w") as f:
        f.write(THREADS_YAML)
    outs = {}
    for n in ("1", ""):
        env = dict(os.environ, SMELT_FMT_THREADS=n)
        for mode, extra in (("int4", ["--group", "64"]), ("int8", []), ("fp8", [])):
            out = os.path.join(tmp, f"qt_{mode}_{n or 'default'}.smelt")
            r = run([smelt, "compile", yml, "-o", out, "--no-cache", "--quantize", mode] + extra, env=env)
            check(r.returncode == 0, f"threads {n or 'default'}, {mode}: compiles ({r.stderr.strip()[:200]})")
            if r.returncode == 0:
                with open(out, "rb") as f:
                    outs[(n, mode)] = (f.read(), r.stdout)
    for mode in ("int4", "int8", "fp8"):
        a, b = outs.get(("1", mode)), outs.get(("", mode))
        check(a is not None and b is not None and a[0] == b[0], f"{mode}: one thread and the default give the same bundle")
        check(a is not None and b is not None and a[1] == b[1] and "3 of 3 matmuls quantised" in a[1],
              f"{mode}: and the same report")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        test_numpy_oracle(args.smelt, tmp)
        test_tiny_llama(args.smelt, tmp)
        test_threads(args.smelt, tmp)
    print(f"test_quantize: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
