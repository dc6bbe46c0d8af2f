#!/usr/bin/env python3
"""Quantised weights on the CPU (issue 14): smelt against ONNX Runtime on
the same ONNX files.

A benchmark, not a test: it is never run by CI.  The workload is W2 at CPU
size (bench/models/w2_swiglu.yaml's SwiGLU MLP, hidden 1024, FFN 2816; or
--hidden/--ffn), x [M, hidden] at M = 1 (decode: bound by the weight's
bytes) and M = 128 (prefill: bound by the multiply-adds), written as ONNX
three ways with the same random weights:
  - f32: three MatMuls;
  - mnb4: com.microsoft MatMulNBits, 4-bit, groups of 128, symmetric, as
    onnxruntime's MatMulNBitsQuantizer writes it (bench/nbits_onnx.py);
  - mnb8: the same with 8 bits.
ONNX Runtime runs each file (2 intra-op threads, all graph optimisations,
I/O bound once; MatMulNBits at its default accuracy level, f32 compute);
smelt imports the same file (`smelt compile FILE.onnx`: MatMulNBits becomes
dequantize + matmul, which the CPU backend runs with the weight kept packed,
codegen/llvm/qmatmul.c) and `smelt bench` times its whole run.  Each
smelt output is compared with ORT's on the same input (relative L2).  The
peers run in --rounds interleaved rounds, each keeping its best round's
median.

Usage: nbits.py [--smelt PATH] [--threads 2] [--rows 1,128] [--modes f32,mnb4,mnb8] [--keep DIR]
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench as B  # noqa: E402  (bench.py: threads, timing, ORT runner, table)
sys.path.insert(0, os.path.dirname(HERE))
import nbits_onnx as NB  # noqa: E402

import numpy as np  # noqa: E402


def w2_onnx(path, ws, mode, M):
    """W2 (silu(x @ w_gate) * (x @ w_up)) @ w_down as ONNX, x [M, hidden]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits = [], []

    def matmul(name, x, y):
        if mode == "f32":
            inits.append(numpy_helper.from_array(ws[name], name))
            nodes.append(helper.make_node("MatMul", [x, name], [y], name=name + "_matmul"))
        else:
            node, more = NB.nbits_node(ws[name], 4 if mode == "mnb4" else 8, False, x, y, prefix=name + "_")
            nodes.append(node)
            inits.extend(more)

    matmul("w_gate", "x", "g0")
    matmul("w_up", "x", "u")
    nodes += [helper.make_node("Sigmoid", ["g0"], ["sg"]), helper.make_node("Mul", ["g0", "sg"], ["g"]),
              helper.make_node("Mul", ["g", "u"], ["gu"])]
    matmul("w_down", "gu", "y")
    H, F = ws["w_gate"].shape
    gr = helper.make_graph(nodes, "w2_" + mode, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, H])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, H])], initializer=inits)
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, path)
    return m


def weight_bytes(mode, ws):
    n = sum(w.size for w in ws.values())
    groups = n // 128
    return {"f32": 4 * n, "mnb4": n // 2 + 4 * groups, "mnb8": n + 4 * groups}[mode]


def main():
    ap = argparse.ArgumentParser(description="smelt's quantised CPU kernels against ONNX Runtime's MatMulNBits")
    ap.add_argument("--smelt", default=os.environ.get("SMELT") or B.default_smelt())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--rows", default="1,128", help="comma-separated M values")
    ap.add_argument("--modes", default="f32,mnb4,mnb8")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", help="keep the ONNX files, inputs and bundles here")
    args = ap.parse_args()
    if not args.smelt:
        sys.exit("nbits.py: no smelt binary (build it, or pass --smelt)")
    tmp = args.keep or tempfile.mkdtemp(prefix="smelt-nbits-")
    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(7)
    H, F = args.hidden, args.ffn
    ws = {"w_gate": (rng.standard_normal((H, F)) / np.sqrt(H)).astype(np.float32),
          "w_up": (rng.standard_normal((H, F)) / np.sqrt(H)).astype(np.float32),
          "w_down": (rng.standard_normal((F, H)) / np.sqrt(F)).astype(np.float32)}
    smelt = B.SmeltCpu(args.smelt, args.threads, args.warmup, args.iters)
    bw = B.copy_bandwidth(args.threads)
    print(f"machine: {B.machine()}; copy bandwidth {bw:.1f} GB/s ({args.threads} threads); W2 hidden {H}, FFN {F}")
    rows = []
    for M in (int(v) for v in args.rows.split(",")):
        x = rng.standard_normal((M, H)).astype(np.float32)
        np.save(os.path.join(tmp, f"x{M}.npy"), x)
        for mode in args.modes.split(","):
            path = os.path.join(tmp, f"w2_{mode}_m{M}.onnx")
            proto = w2_onnx(path, ws, mode, M)
            run_ort, ort_out = B.ort_runner(proto, {"x": x}, (M, H), args.threads)
            run_ort()
            bundle = os.path.join(tmp, f"w2_{mode}_m{M}.smelt")
            proc = B.run_cmd([args.smelt, "compile", path, "-o", bundle, "--target", "cpu"])
            why, err, sm = "", None, None
            if proc.returncode != 0:
                why = "smelt compile: " + B.first_error(proc)
            else:
                out = os.path.join(tmp, "smelt_y.npy")
                proc = B.run_cmd([args.smelt, "run", bundle, "--input", f"x={os.path.join(tmp, f'x{M}.npy')}",
                                  "--output", f"y={out}"])
                if proc.returncode != 0:
                    why = "smelt run: " + B.first_error(proc)
                else:
                    err = B.rel_l2(np.load(out), ort_out)
            ort_ms = None
            for _ in range(args.rounds):
                t = B.time_calls(run_ort, args.warmup, args.iters, args.min_seconds)
                ort_ms = t if ort_ms is None else min(ort_ms, t)
                if not why:
                    t, why = smelt.time(bundle)
                    sm = t if sm is None or (t is not None and t < sm) else sm
            wb = weight_bytes(mode, ws)
            rows.append([f"M={M}", mode, B.fmt(ort_ms, ".3f"), B.fmt(sm, ".3f"),
                         B.fmt(ort_ms / sm if sm else None, ".2f"),
                         B.fmt(wb / (sm * 1e-3) / 1e9 / bw * 100 if sm and M == 1 else None, ".0f"),
                         B.fmt(2 * M * sum(w.size for w in ws.values()) / (sm * 1e-3) / 1e9 if sm else None, ".1f"),
                         B.fmt(err, ".1e"), why])
    B.print_table(["rows", "weights", "ORT ms", "smelt ms", "ORT/smelt", "% bw (M=1)", "smelt GFLOP/s",
                   "rel L2 vs ORT", "note"], rows)


if __name__ == "__main__":
    main()
