#!/usr/bin/env python3
"""Matmuls with few rows (decoding, M = 1) split over their columns on the
CPU, against numpy.

A matmul with fewer than CG_MM_SPLIT_ROWS (64) output rows and more than
CG_MM_COLS (128) columns gets rows x ceil(N / 128) tasks (codegen/lower.h,
cg_matmul_space), which the thread pool spreads over threads: each thread
computes a range of column blocks.  Each case here is compiled for the CPU;
its kernel table must show the split task count, and its output, run on 1,
2 and 3 threads (3: ranges that cut column blocks unevenly), must match
numpy on the same weights (dumped by the reference interpreter's --output,
the weights only: the expected result is computed here).  Cases: M = 1
with a plain and a transposed weight, fused epilogues (bias + silu, the
SwiGLU product of two matmuls), a ragged N (last block partial, last panel
padded), small M > 1 (partial column blocks at range ends) and a batched
A, f32 throughout.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

COLS = 128  # CG_MM_COLS


def case_yaml(name, m, k, n, kind):
    dims = f"dims: {{m: {m}, k: {k}, n: {n}}}"
    head = ["smelt: 1", f"name: {name}", "seed: 7", "dtype: f32", dims, "inputs:"]
    if kind == "batched":
        head.append("  x: {shape: [2, m, k]}")
    else:
        head.append("  x: {shape: [m, k]}")
    head.append("params:")
    if kind == "transposed":
        head.append("  w: {shape: [n, k], init: {normal: 0.1}}")
        nodes = ["  - {out: y, op: matmul, in: [x, w], transpose_b: true}"]
    elif kind == "bias_silu":
        head += ["  w: {shape: [k, n], init: {normal: 0.1}}", "  b: {shape: [n], init: {normal: 0.5}}"]
        nodes = ["  - {out: h, op: matmul, in: [x, w]}", "  - {out: hb, op: add, in: [h, b]}",
                 "  - {out: y, op: silu, in: [hb]}"]
    elif kind == "swiglu":
        head += ["  w: {shape: [k, n], init: {normal: 0.1}}", "  u: {shape: [k, n], init: {normal: 0.1}}"]
        nodes = ["  - {out: g0, op: matmul, in: [x, w]}", "  - {out: g, op: silu, in: [g0]}",
                 "  - {out: h, op: matmul, in: [x, u]}", "  - {out: y, op: mul, in: [g, h]}"]
    else:
        head.append("  w: {shape: [k, n], init: {normal: 0.1}}")
        nodes = ["  - {out: y, op: matmul, in: [x, w]}"]
    return "\n".join(head + ["nodes:"] + nodes + ["outputs: [y]", ""])


def silu(v):
    return v / (1.0 + np.exp(-v))


def expected(kind, x, p):
    x = x.astype(np.float64)
    w = p["w"].astype(np.float64)
    if kind == "transposed":
        return x @ w.T
    if kind == "bias_silu":
        return silu(x @ w + p["b"].astype(np.float64))
    if kind == "swiglu":
        return silu(x @ w) * (x @ p["u"].astype(np.float64))
    return x @ w


CASES = [  # name, m, k, n, kind
    ("m1", 1, 256, 1000, "plain"),
    ("m1_t", 1, 200, 777, "transposed"),
    ("m1_bias_silu", 1, 96, 515, "bias_silu"),
    ("m1_swiglu", 1, 128, 640, "swiglu"),
    ("m1_wide", 1, 64, 4100, "plain"),
    ("m3", 3, 70, 300, "plain"),
    ("m9_t", 9, 33, 260, "transposed"),
    ("m5_batched", 5, 40, 390, "batched"),
]


def run(smelt, args, **kw):
    return subprocess.run([smelt] + args, capture_output=True, text=True, timeout=300, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    if "cpu" not in run(smelt, ["run", "--help"]).stdout:
        print("SKIP: this smelt has no CPU backend")
        return 77
    probe = run(smelt, ["compile", "--help"])
    if "--target" not in probe.stdout + probe.stderr:
        print("SKIP: this smelt cannot compile for a target")
        return 77
    failures, ran = 0, 0
    with tempfile.TemporaryDirectory(prefix="smelt-decode-split-") as tmp:
        for name, m, k, n, kind in CASES:
            yaml_path = os.path.join(tmp, name + ".yaml")
            with open(yaml_path, "w") as f:
                f.write(case_yaml(name, m, k, n, kind))
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            shape = (2, m, k) if kind == "batched" else (m, k)
            x = rng.standard_normal(shape).astype(np.float32)
            xin = os.path.join(tmp, name + "_x.npy")
            np.save(xin, x)
            pnames = ["w"] + (["b"] if kind == "bias_silu" else []) + (["u"] if kind == "swiglu" else [])
            cmd = ["run", yaml_path, "--device", "ref", "--input", f"x={xin}"]
            for p in pnames:
                cmd += ["--output", f"{p}={os.path.join(tmp, name + '_' + p + '.npy')}"]
            r = run(smelt, cmd)
            if r.returncode != 0:
                print(f"FAIL {name}: dumping the weights: {r.stderr.strip()[-500:]}")
                failures += 1
                continue
            params = {p: np.load(os.path.join(tmp, name + "_" + p + ".npy")) for p in pnames}
            want = expected(kind, x, params)

            bundle = os.path.join(tmp, name + ".smelt")
            r = run(smelt, ["compile", yaml_path, "-o", bundle, "--target", "cpu"])
            if r.returncode != 0:
                print(f"FAIL {name}: compile: {r.stderr.strip()[-500:]}")
                failures += 1
                continue
            # the task count of the matmul kernels: rows x column blocks
            r = run(smelt, ["inspect", bundle, "--kernels"])
            rows = m * (2 if kind == "batched" else 1)
            split = rows * -(-n // COLS)
            tasks = [int(line.split()[4]) for line in r.stdout.splitlines()
                     if line.strip() and line.split()[0].isdigit() and line.split()[2] == "contraction"]
            if not tasks or any(t != split for t in tasks):
                print(f"FAIL {name}: contraction kernels have tasks {tasks}, want {split} "
                      f"({rows} rows x {-(-n // COLS)} column blocks)\n{r.stdout}")
                failures += 1
            for threads in (1, 2, 3):
                out = os.path.join(tmp, f"{name}_y{threads}.npy")
                r = run(smelt, ["run", bundle, "--device", "cpu", "--threads", str(threads),
                                "--input", f"x={xin}", "--output", f"y={out}"])
                ran += 1
                if r.returncode != 0:
                    print(f"FAIL {name} threads={threads}: run: {r.stderr.strip()[-500:]}")
                    failures += 1
                    continue
                got = np.load(out).astype(np.float64)
                err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
                ok = got.shape == want.shape and err <= 1e-5
                print(f"{'ok  ' if ok else 'FAIL'} {name} M={m} K={k} N={n} {kind} threads={threads}: "
                      f"tasks {tasks}, rel L2 {err:.2e}")
                failures += not ok
    print(f"{ran - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
