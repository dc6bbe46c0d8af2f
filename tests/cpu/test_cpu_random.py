#!/usr/bin/env python3
"""Random graphs through the CPU backend, fused and unfused, against the
reference interpreter.

Each graph is a random chain over a [M, N] activation mixing every fusion
class: elementwise and broadcast ops (params as broadcast operands),
row reductions (softmax, rms_norm, layer_norm, sum/max with keepdims),
contractions (matmul with a weight, optionally transposed), injective ops
(transpose + reshape round trips), and residual adds that reuse an earlier
value (so values escape groups).  Every graph is compiled under the
machine's budget (fused) and under `--onchip-bytes 64` (fusion stops almost
everywhere) and run with `--check` and `--check=groups`.  The seed is fixed:
a failure names the graph and keeps its YAML.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

UNARY = ["exp", "tanh", "sigmoid", "relu", "silu", "neg", "abs", "gelu", "erf", "sin", "cos"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


def make_graph(rng, idx):
    m = rng.choice([1, 3, 8, 17])
    n = rng.choice([4, 16, 33, 64])
    lines = ["smelt: 1", f"name: rand{idx}", f"seed: {idx}", f"dims: {{m: {m}, n: {n}}}",
             "inputs:", "  x: {shape: [m, n]}", "params:"]
    params, nodes = [], []
    cur, width, live = "x", n, ["x"]
    for k in range(rng.randint(3, 9)):
        out = f"v{k}"
        kind = rng.random()
        if kind < 0.3:
            op = rng.choice(UNARY)
            extra = ", approximate: tanh" if op == "gelu" and rng.random() < 0.5 else ""
            src = f"mul_{out}" if op == "exp" else cur
            if op == "exp":  # keep exp's input small
                params.append(f"  s_{out}: {{shape: [], value: 0.25}}")
                nodes.append(f"  - {{out: mul_{out}, op: mul, in: [{cur}, s_{out}]}}")
            nodes.append(f"  - {{out: {out}, op: {op}, in: [{src}]{extra}}}")
        elif kind < 0.55:
            op = rng.choice(BINARY)
            other = rng.choice(live[-3:])
            if rng.random() < 0.5 or other == cur or width != n:
                params.append(f"  p_{out}: {{shape: [{width}], init: {{uniform: [0.5, 1.5]}}}}")
                other = f"p_{out}"
            nodes.append(f"  - {{out: {out}, op: {op}, in: [{cur}, {other}]}}")
        elif kind < 0.75:
            op = rng.choice(["softmax", "rms_norm", "layer_norm", "sum", "max"])
            if op in ("rms_norm", "layer_norm"):
                params.append(f"  g_{out}: {{shape: [{width}], init: {{uniform: [0.5, 1.5]}}}}")
                nodes.append(f"  - {{out: {out}, op: {op}, in: [{cur}, g_{out}]}}")
            elif op == "softmax":
                nodes.append(f"  - {{out: {out}, op: softmax, in: [{cur}], axis: -1}}")
            else:
                nodes.append(f"  - {{out: r_{out}, op: {op}, in: [{cur}], axes: [-1], keepdims: true}}")
                nodes.append(f"  - {{out: {out}, op: sub, in: [{cur}, r_{out}]}}")
        elif kind < 0.9:
            n2 = rng.choice([8, 16, 40])
            tb = rng.random() < 0.3
            shape = f"[{n2}, {width}]" if tb else f"[{width}, {n2}]"
            params.append(f"  w_{out}: {{shape: {shape}, init: {{normal: 0.2}}}}")
            tail = ", transpose_b: true" if tb else ""
            nodes.append(f"  - {{out: {out}, op: matmul, in: [{cur}, w_{out}]{tail}}}")
            width = n2
        else:
            nodes.append(f"  - {{out: t_{out}, op: transpose, in: [{cur}], perm: [1, 0]}}")
            nodes.append(f"  - {{out: {out}, op: reshape, in: [t_{out}], shape: [m, {width}]}}")
        cur = out
        live.append(out)
    if not params:
        lines[-1] = "params: {}"
    return "\n".join(lines + params + ["nodes:"] + nodes + [f"outputs: [{cur}]", ""])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--count", type=int, default=24)
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    if "cpu" not in subprocess.run([smelt, "run", "--help"], capture_output=True, text=True).stdout:
        print("SKIP: this smelt has no CPU backend")
        return 77  # 77: skipped as a whole (ctest's SKIP_RETURN_CODE)
    rng = random.Random(1234)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.count):
            text = make_graph(rng, i)
            path = os.path.join(tmp, f"rand{i}.yaml")
            with open(path, "w") as f:
                f.write(text)
            for budget in (None, 64):
                extra = ["--onchip-bytes", str(budget)] if budget else []
                bundle = os.path.join(tmp, f"rand{i}.smelt")
                runs = [["compile", path, "-o", bundle] + extra,
                        ["run", bundle, "--device", "cpu", "--check"],
                        ["run", bundle, "--device", "cpu", "--check=groups"]]
                for cmd in runs:
                    r = subprocess.run([smelt] + cmd, capture_output=True, text=True, timeout=120)
                    if r.returncode != 0:
                        failures += 1
                        print(f"FAIL rand{i} budget={budget}: smelt {' '.join(cmd[:1] + cmd[2:])} -> {r.returncode}")
                        print(text)
                        print(r.stdout[-2000:], r.stderr[-2000:])
                        break
    print(f"{args.count} random graphs x 2 budgets: {'ok' if not failures else f'{failures} failure(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
