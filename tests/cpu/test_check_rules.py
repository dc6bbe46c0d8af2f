#!/usr/bin/env python3
"""`smelt run --check` on a reference that is exactly zero (issue 16 #8).

A layer_norm of constant rows has an all-zero reference; the CPU result is
rounding noise (the f32 error of each row's mean times 1/sqrt(eps)), which a
relative L2 error calls infinite.  Such a reference is judged by an absolute
floor, and every row of the table names the rule that decided.

--rtol/--atol (issue 13) replace the rules with numpy.allclose's elementwise
test for smelt run --check, --check=groups and smelt bench --check: the
zero reference fails --rtol alone and passes with an --atol above the
noise, random rows fail a tolerance below f32 rounding and pass one above
it, and the flags are refused without --check or with a negative value.

An f16 model is also compared with the same graph in f32 (issue 13): the
informational rows agree with numpy's float64 evaluation of the model.

Usage: test_check_rules.py --smelt PATH
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

MODEL = """smelt: 1
name: ln
inputs: {x: {shape: [8, 64]}}
params: {g: {shape: [64], init: ones}}
nodes:
  - {out: y, op: layer_norm, in: [x, g]}
outputs: [y]
"""
FAILS = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        print("    " + detail.replace("\n", "\n    "))
        FAILS.append(what)


F16_MODEL = """smelt: 1
name: f16ref
inputs: {x: {shape: [16, 256]}, w: {shape: [256, 64]}}
params: {b: {shape: [64], init: ones}}
nodes:
  - {out: h, op: matmul, in: [x, w]}
  - {out: hb, op: add, in: [h, b]}
  - {out: t, op: tanh, in: [hb]}
  - {out: y, op: softmax, in: [t]}
outputs: [y]
"""


def stats(x, r):
    """max abs, rel L2 and cosine of x against r, in float64."""
    x, r = x.astype(np.float64).ravel(), r.astype(np.float64).ravel()
    return (float(np.max(np.abs(x - r))), float(np.linalg.norm(x - r) / np.linalg.norm(r)),
            float(x @ r / (np.linalg.norm(x) * np.linalg.norm(r))))


def check_f32_reference(smelt, d):
    """An f16 model is also compared with the f32 reference (issue 13): the
    printed and JSON numbers equal numpy's float64 evaluation of the model on
    the same f16 inputs, against smelt's own f16 output."""
    model = os.path.join(d, "f16.yaml")
    with open(model, "w") as f:
        f.write(F16_MODEL)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((16, 256)) * 2).astype(np.float16)
    w = (rng.standard_normal((256, 64)) * 0.5).astype(np.float16)
    np.save(os.path.join(d, "x16.npy"), x)
    np.save(os.path.join(d, "w16.npy"), w)
    ins = ["--input", "x=" + os.path.join(d, "x16.npy"), "--input", "w=" + os.path.join(d, "w16.npy")]
    out = os.path.join(d, "y16.npy")
    r = subprocess.run([smelt, "run", model, "--dtype", "f16", "--device", "cpu", "--check", *ins, "--output",
                        "y=" + out], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    at = [i for i, l in enumerate(lines) if l.startswith("against the f32 reference")]
    row = lines[at[0] + 1].split() if at and len(lines) > at[0] + 1 else []
    h = x.astype(np.float64) @ w.astype(np.float64) + 1.0
    t = np.tanh(h)
    e = np.exp(t - t.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    ok = r.returncode == 0 and len(row) >= 7 and row[0] == "y" and os.path.exists(out)
    if ok:
        y = np.load(out)
        mabs, rl2, cos = stats(y, ref)
        got_abs, got_rl2, got_cos = float(row[1]), float(row[3]), float(row[4])
        ok = (y.dtype == np.float16 and abs(got_abs - mabs) <= 0.02 * mabs + 1e-7 and
              abs(got_rl2 - rl2) <= 0.02 * rl2 + 1e-9 and abs(got_cos - cos) <= 2e-6 and row[5] == "ok" and
              rl2 > 1e-4)  # the f16 loss is visible: well above f32 rounding
        detail = "numpy: max abs %.4g rel L2 %.4g cosine %.8f; smelt row %s" % (mabs, rl2, cos, row)
    else:
        detail = r.stdout + r.stderr
    check(ok, "--check --dtype f16: the f32-reference row equals numpy's float64 model (max abs, rel L2, cosine)",
          detail)
    r = subprocess.run([smelt, "bench", model, "--dtype", "f16", "--threads", "1", "--iters", "1", "--warmup", "0",
                        "--check", "--json"], capture_output=True, text=True)
    try:
        vs = json.loads(r.stdout)["check"]["outputs"][0]["vs_f32"]
    except (ValueError, KeyError, IndexError):
        vs = {}
    check(r.returncode == 0 and vs.get("ok") is True and 0.999 < vs.get("cosine", 0) < 1 and vs.get("rel_l2", 0) > 1e-4,
          "bench --check --json --dtype f16: vs_f32 per output", r.stdout + r.stderr)
    r = subprocess.run([smelt, "run", model, "--device", "cpu", "--check"], capture_output=True, text=True)
    check(r.returncode == 0 and "against the f32 reference" not in r.stdout,
          "--check on an f32 model: no f32-reference section", r.stdout + r.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    d = tempfile.mkdtemp(prefix="smelt_check_")
    try:
        model = os.path.join(d, "ln.yaml")
        with open(model, "w") as f:
            f.write(MODEL)
        x = np.repeat(np.linspace(-3.7, 5.3, 8, dtype=np.float32)[:, None], 64, axis=1)
        np.save(os.path.join(d, "x.npy"), x)
        for mode, row in (("--check", "  y "), ("--check=groups", "  k0")):
            r = subprocess.run([smelt, "run", model, "--device", "cpu", mode, "--input", "x=" + os.path.join(d, "x.npy")],
                               capture_output=True, text=True)
            rows = [l for l in r.stdout.splitlines() if l.startswith(row)]
            check(r.returncode == 0 and rows and all(" pass " in l and l.endswith("max abs <= 0.01, reference ~0")
                                                     for l in rows),
                  "%s: constant rows (zero reference) pass by the absolute floor" % mode, r.stdout + r.stderr)
        r = subprocess.run([smelt, "run", model, "--device", "cpu", "--check"], capture_output=True, text=True)
        rows = [l for l in r.stdout.splitlines() if l.startswith("  y ")]
        check(r.returncode == 0 and rows and rows[0].endswith(" pass   rel L2 <= 1e-05"),
              "--check: random rows pass by rel L2", r.stdout + r.stderr)
        r = subprocess.run([smelt, "run", model, "--device", "cpu", "--check", "--dtype", "f16"], capture_output=True,
                           text=True)
        rows = [l for l in r.stdout.splitlines() if l.startswith("  y ")]
        check(r.returncode == 0 and rows and rows[0].endswith(" pass   cosine >= 0.999"),
              "--check --dtype f16: by cosine", r.stdout + r.stderr)
        xin = "x=" + os.path.join(d, "x.npy")

        def run(*args):
            r = subprocess.run([smelt, *args], capture_output=True, text=True)
            return r, [l for l in r.stdout.splitlines() if l.startswith("  y ") or l.startswith("  k0")]

        r, rows = run("run", model, "--device", "cpu", "--check", "--input", xin, "--rtol", "1e-3")
        check(r.returncode == 1 and rows and " FAIL " in rows[0] and
              rows[0].endswith("|x-ref| <= 0 + 0.001*|ref| (--atol, --rtol), worst inf"),
              "--rtol alone: a zero reference with rounding noise fails, worst inf", r.stdout + r.stderr)
        for mode in ("--check", "--check=groups"):
            r, rows = run("run", model, "--device", "cpu", mode, "--input", xin, "--atol", "0.01", "--rtol", "1e-3")
            check(r.returncode == 0 and rows and all(" pass " in l and "|x-ref| <= 0.01 + 0.001*|ref|" in l for l in rows),
                  "%s --atol 0.01: the zero reference passes by the user's tolerance" % mode, r.stdout + r.stderr)
        r, rows = run("run", model, "--device", "cpu", "--check", "--rtol", "1e-12")
        worst = float(rows[0].rsplit("worst ", 1)[1]) if rows and "worst " in rows[0] else 0
        check(r.returncode == 1 and rows and " FAIL " in rows[0] and 1 < worst < float("inf"),
              "--rtol 1e-12: random rows fail below f32 rounding (worst %g)" % worst, r.stdout + r.stderr)
        r, rows = run("run", model, "--device", "cpu", "--check", "--rtol", "1e-4", "--atol", "1e-6")
        check(r.returncode == 0 and rows and " pass " in rows[0], "--rtol 1e-4 --atol 1e-6: random rows pass",
              r.stdout + r.stderr)
        r, rows = run("bench", model, "--threads", "1", "--iters", "1", "--warmup", "0", "--check", "--rtol", "1e-12")
        check(r.returncode == 1 and "check FAILED: nothing timed" in r.stdout and "median(us)" not in r.stdout,
              "bench --check --rtol 1e-12: the mismatch is reported and nothing timed", r.stdout + r.stderr)
        r, _ = run("bench", model, "--threads", "1", "--iters", "1", "--warmup", "0", "--check", "--json")
        try:
            rep = json.loads(r.stdout)
        except ValueError:
            rep = {}
        chk = rep.get("check", {})
        check(r.returncode == 0 and chk.get("pass") is True and chk["outputs"][0]["rule"] == "rel L2 <= 1e-05" and
              rep.get("kernels"), "bench --check --json: the check's findings, then the timings", r.stdout + r.stderr)
        check_f32_reference(smelt, d)
        for args, why in ((["run", model, "--device", "cpu", "--rtol", "1e-3"], "--rtol without --check"),
                          (["run", model, "--device", "cpu", "--check", "--atol", "-1"], "a negative --atol"),
                          (["run", model, "--device", "cpu", "--check", "--rtol", "x"], "--rtol x"),
                          (["bench", model, "--atol", "1e-3"], "bench --atol without --check")):
            r, _ = run(*args)
            check(r.returncode == 2 and ("--rtol" in r.stderr or "--atol" in r.stderr), why + ": usage error (exit 2)",
                  r.stdout + r.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("test_check_rules: %d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
