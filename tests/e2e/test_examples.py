#!/usr/bin/env python3
"""End-to-end runs of every model in examples/, checked against numpy.

For each example:
  1. `smelt run examples/X.yaml --device ref --dtype D`, D = f32 and f16,
     on random inputs made here,
     dumping the output and every parameter (`--output NAME=FILE.npy` takes
     any value, so the numpy model uses exactly smelt's initialised weights;
     tiny_llama's matrices are read straight from its safetensors file);
     each dumped parameter is also checked against what its YAML `init:` or
     `value:` says, so a frontend that initialises wrongly cannot hide
     behind a self-consistent comparison;
  2. compares smelt's output with tests/e2e/reference.py (float64, on the
     same weights) at relative L2 error <= 1e-5 in f32, <= 5e-3 in f16;
  3. `smelt compile examples/X.yaml --print-ir-after-all`: exit 0, an IR dump
     after each of the eight default passes on stderr, and the YAML names
     (e.g. layer.1/q) in the IR.

Usage: test_examples.py --smelt PATH [--keep DIR] [EXAMPLE...]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES_DIR = os.path.join(ROOT, "examples")
# f32 against a float64 model: smelt's reference interpreter computes each
# op in double and rounds once per value, so the error is a few ulps per op.
# f16 rounds every value to 11 bits: ~5e-4 per op, well under 5e-3 over a model.
DTYPES = {"f32": np.float32, "f16": np.float16}
TOLERANCE = {"f32": 1e-5, "f16": 5e-3}
DEFAULT_PASSES = ["canonicalize", "const-fold", "simplify", "cse", "dce", "fuse-attention", "fuse",
                  "plan-memory"]

# What each parameter's YAML source says, to check the dumped values against.
ONES, ZEROS = ("ones",), ("zeros",)


def normal(std):
    return ("normal", std)


def uniform(lo, hi):
    return ("uniform", lo, hi)


def value(v):
    return ("value", np.asarray(v, dtype=np.float64))


def gpt2_mask(seq):
    return np.where(np.arange(seq)[None, :] <= np.arange(seq)[:, None], 0.0, -1.0e9)


class Example:
    def __init__(self, name, inputs, params, model, ir_names, file_params=None):
        self.name = name
        self.inputs = inputs            # rng -> {name: array}
        self.params = params            # {name: source}, dumped from smelt
        self.model = model              # (inputs, params) -> output array
        self.ir_names = ir_names        # names the IR dumps must show
        self.file_params = file_params  # () -> {name: array}, not dumped


def mlp_example():
    return Example(
        "mlp",
        lambda rng: {"x": rng.standard_normal((8, 64))},
        {"w1": normal(0.125), "b1": uniform(-0.1, 0.1), "w2": normal(0.088), "b2": ZEROS,
         "w3": normal(0.088)},
        lambda i, p: reference.mlp(i["x"], p),
        ["h1b", "a1", "logits", "w3"])


def cnn_example():
    return Example(
        "cnn",
        lambda rng: {"x": rng.standard_normal((1, 3, 32, 32))},
        {"conv1_w": normal(0.27), "conv1_b": uniform(-0.1, 0.1),
         "bn1_scale": value([1.0, 0.9, 1.1, 0.8, 1.2, 1.0, 0.95, 1.05,
                             0.85, 1.15, 1.0, 0.9, 1.1, 0.75, 1.25, 1.0]),
         "bn1_bias": value([0.0, 0.1, -0.1, 0.05, -0.05, 0.2, -0.2, 0.0,
                            0.15, -0.15, 0.1, -0.1, 0.0, 0.05, -0.05, 0.0]),
         "bn1_mean": normal(0.1), "bn1_var": uniform(0.5, 1.5),
         "conv2_w": normal(0.17),
         "bn2_scale": uniform(0.8, 1.2), "bn2_bias": uniform(-0.1, 0.1),
         "bn2_mean": normal(0.1), "bn2_var": uniform(0.5, 1.5),
         "fc_w": normal(0.18), "fc_b": ZEROS},
        lambda i, p: reference.cnn(i["x"], p),
        ["conv1", "conv2", "logits"])


def gpt2_example():
    return Example(
        "gpt2_block",
        lambda rng: {"x": rng.standard_normal((16, 64))},
        {"ln1_g": ONES, "ln1_b": ZEROS,
         "w_q": normal(0.125), "b_q": uniform(-0.1, 0.1),
         "w_k": normal(0.125), "b_k": uniform(-0.1, 0.1),
         "w_v": normal(0.125), "b_v": uniform(-0.1, 0.1),
         "w_o": normal(0.125), "b_o": ZEROS,
         "ln2_g": uniform(0.9, 1.1), "ln2_b": uniform(-0.05, 0.05),
         "w_fc": normal(0.125), "b_fc": uniform(-0.1, 0.1),
         "w_proj": normal(0.0625), "b_proj": ZEROS,
         "scale": value(0.25), "causal_mask": value(gpt2_mask(16))},
        lambda i, p: reference.gpt2_block(i["x"], p),
        ["scores", "probs", "ctx_m", "x1"])


def tiny_llama_weights():
    path = os.path.join(EXAMPLES_DIR, "tiny_llama.safetensors")
    out = {}
    for name, arr in reference.read_safetensors(path).items():
        m = re.fullmatch(r"layers\.(\d+)\.(\w+)", name)
        if m:  # embed and lm_head are tiny_lm's, not tiny_llama's
            out[f"layer.{m.group(1)}/{m.group(2)}"] = arr
    return out


def tiny_llama_example():
    params = {"final_norm": ONES}
    for i in range(2):
        params[f"layer.{i}/attn_norm"] = ONES
        params[f"layer.{i}/ffn_norm"] = ONES
    return Example(
        "tiny_llama",
        lambda rng: {"x": rng.standard_normal((16, 64)), "pos": np.arange(16, dtype=np.int32)},
        params,
        lambda i, p: reference.tiny_llama(i["x"], i["pos"], p),
        ["layer.0/q", "layer.1/q", "layer.1/att", "layer.1/w_down"],
        file_params=tiny_llama_weights)


EXAMPLES = [mlp_example(), cnn_example(), gpt2_example(), tiny_llama_example()]


# ------------------------------------------------------------------ helpers

class Failure(Exception):
    def __init__(self, message, err=None):
        super().__init__(message)
        self.err = err  # the relative error, when the run got that far


def run_smelt(smelt, args, what):
    cmd = [smelt] + args
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise Failure(f"{what}: exit {proc.returncode}\n  $ {' '.join(cmd)}\n"
                      + indent(proc.stderr.strip()[-3000:] or "(no stderr)"))
    return proc


def indent(text):
    return "\n".join("    " + line for line in text.splitlines())


def file_for(tmp, name):
    return os.path.join(tmp, name.replace("/", "__") + ".npy")


def check_param(name, arr, source, dt):
    """Raises Failure when a dumped parameter does not look like its source.
    dt is the numpy dtype the model was run in."""
    a = np.asarray(arr, dtype=np.float64)
    kind = source[0]
    if kind != "value" and not np.all(np.isfinite(a)):
        raise Failure(f"param {name}: non-finite values")
    if kind == "ones" and not np.all(a == 1.0):
        raise Failure(f"param {name}: init ones, got values in [{a.min()}, {a.max()}]")
    if kind == "zeros" and not np.all(a == 0.0):
        raise Failure(f"param {name}: init zeros, got values in [{a.min()}, {a.max()}]")
    if kind == "uniform":
        # Rounding to dt may carry a draw just past a bound.
        lo, hi = (float(np.asarray(b, dtype=dt)) for b in source[1:3])
        if a.min() < lo or a.max() > hi or (a.size > 4 and np.all(a == a.flat[0])):
            raise Failure(f"param {name}: init uniform [{lo}, {hi}], got [{a.min()}, {a.max()}]")
    if kind == "normal":
        std = source[1]
        if a.size > 4 and np.all(a == a.flat[0]):
            raise Failure(f"param {name}: init normal {std}, got a constant")
        # Loose on purpose: only sizes large enough for a stable estimate.
        if a.size >= 256 and not 0.8 * std < a.std() < 1.2 * std:
            raise Failure(f"param {name}: init normal {std}, sample std {a.std():.4g}")
    if kind == "value":
        # In f16 the mask's -1e9 becomes -inf, as it should: compare in dt.
        with np.errstate(over="ignore"):
            want = source[1].astype(dt).astype(np.float64)
        if a.shape != want.shape or not np.array_equal(a, want):
            raise Failure(f"param {name}: value differs from the YAML (shape {a.shape} vs {want.shape})")


def rel_l2(got, want):
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def has_name(text, name):
    """name appears as a whole IR name, not as part of a longer one."""
    return re.search(r"(?<![\w./])" + re.escape(name) + r"(?![\w./])", text) is not None


# -------------------------------------------------------------------- tests

def check_run(smelt, ex, tmp, dtype):
    """Runs the example on the reference device with every input and param in
    `dtype`; returns the relative L2 error of its output."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(2024)
    inputs = ex.inputs(rng)
    args = ["run", os.path.join("examples", ex.name + ".yaml"), "--device", "ref", "--dtype", dtype]
    for name, arr in inputs.items():
        if arr.dtype.kind == "f":
            arr = arr.astype(dt)
        inputs[name] = arr
        np.save(file_for(tmp, "in_" + name), arr)
        args += ["--input", f"{name}={file_for(tmp, 'in_' + name)}"]
    args += ["--output", f"y={file_for(tmp, 'out_y')}"]
    for name in ex.params:
        args += ["--output", f"{name}={file_for(tmp, name)}"]
    run_smelt(smelt, args, f"smelt run ({dtype})")

    params = {}
    for name, source in ex.params.items():
        params[name] = np.load(file_for(tmp, name))
        if params[name].dtype != dt:
            raise Failure(f"param {name}: dtype {params[name].dtype}, expected {np.dtype(dt)}")
        check_param(name, params[name], source, dt)
    if ex.file_params:
        # The file holds F32; --dtype converts it (round to nearest even, as numpy).
        params.update({k: v.astype(dt) for k, v in ex.file_params().items()})

    got = np.load(file_for(tmp, "out_y"))
    want = ex.model({k: (v.astype(np.float64) if v.dtype.kind == "f" else v)
                     for k, v in inputs.items()}, params)
    if got.dtype != dt:
        raise Failure(f"output y: dtype {got.dtype}, expected {np.dtype(dt)}")
    if got.shape != want.shape:
        raise Failure(f"output y: shape {got.shape}, reference {want.shape}")
    if not np.all(np.isfinite(got)):
        raise Failure("output y: non-finite values")
    err = rel_l2(got.astype(np.float64), want)
    if not err <= TOLERANCE[dtype]:
        raise Failure(f"output y ({dtype}): relative L2 error {err:.3g} > {TOLERANCE[dtype]:g}", err)
    return err


def check_compile(smelt, ex, tmp):
    """Compiles with the default pipeline printing the IR after every pass;
    returns notes on what the passes did to this example."""
    out = os.path.join(tmp, ex.name + ".out")
    proc = run_smelt(smelt, ["compile", os.path.join("examples", ex.name + ".yaml"), "-o", out,
                             "--emit", "ir", "--print-ir-after-all"], "smelt compile")
    err = proc.stderr
    missing = [p for p in DEFAULT_PASSES if p not in err]
    if missing:
        raise Failure("smelt compile --print-ir-after-all: no IR dump after pass(es) "
                      + ", ".join(missing) + "\n" + indent(err[-2000:]))
    missing = [n for n in ex.ir_names if not has_name(err, n)]
    if missing:
        raise Failure("IR dumps do not show the YAML name(s) " + ", ".join(missing))
    if not os.path.exists(out) or os.path.getsize(out) == 0:
        raise Failure(f"smelt compile -o {out}: nothing written")
    # What the example is there to show; reported, not required (the pass
    # tests hold the passes to it).
    with open(out, encoding="utf-8", errors="replace") as f:
        final = f.read()
    notes = []
    if ex.name == "cnn":
        notes.append("batch_norm " + ("left" if re.search(r"\bbatch_norm\b", final) else "folded"))
    if ex.name == "gpt2_block":
        notes.append("attention " + ("fused" if re.search(r"\battention\b", final) else "not fused"))
    return notes


def main():
    ap = argparse.ArgumentParser(description="end-to-end runs of examples/ against numpy")
    ap.add_argument("--smelt", required=True, help="path to the smelt binary")
    ap.add_argument("--keep", help="keep the .npy and IR files in this directory")
    ap.add_argument("examples", nargs="*", help="only these (default: all)")
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    if not os.access(smelt, os.X_OK):
        print(f"{smelt}: not an executable (build smelt first)")
        return 1

    weights = os.path.join(EXAMPLES_DIR, "tiny_llama.safetensors")
    if not os.path.exists(weights):
        subprocess.run([sys.executable, os.path.join(EXAMPLES_DIR, "gen_weights.py")], check=True)

    chosen = [e for e in EXAMPLES if not args.examples or e.name in args.examples]
    if not chosen:
        print("no such example: " + ", ".join(args.examples))
        return 2
    rows, failures = [], []
    for ex in chosen:
        if args.keep:
            tmp = os.path.join(args.keep, ex.name)
            os.makedirs(tmp, exist_ok=True)
            ctx = None
        else:
            ctx = tempfile.TemporaryDirectory(prefix=f"smelt-e2e-{ex.name}-")
            tmp = ctx.name
        # Each check runs even when an earlier one failed, so one report
        # shows everything that is wrong with an example.
        cells, notes, ok = [], [], True
        for dtype in DTYPES:
            try:
                cells.append(f"{check_run(smelt, ex, tmp, dtype):.2e}")
            except (Failure, subprocess.TimeoutExpired) as e:
                err = getattr(e, "err", None)
                cells.append("FAIL" if err is None else f"FAIL {err:.1e}")
                failures.append(f"{ex.name}: {e}")
                ok = False
        try:
            notes = check_compile(smelt, ex, tmp)
            cells.append("ok")
        except (Failure, subprocess.TimeoutExpired) as e:
            cells.append("FAIL")
            failures.append(f"{ex.name}: {e}")
            ok = False
        if ctx:
            ctx.cleanup()
        rows.append([ex.name] + cells + ["pass" if ok else "FAIL", "; ".join(notes)])

    head = ["example"] + [f"{d} rel L2" for d in DTYPES] + ["compile", "result", "notes"]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    for f in failures:
        print("\n" + f)
    tol = ", ".join(f"{d} <= {t:g}" for d, t in TOLERANCE.items())
    npass = sum(r[-2] == "pass" for r in rows)
    print(f"\n{npass}/{len(rows)} examples pass (relative L2 error {tol})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
