#!/usr/bin/env python3
"""`smelt run --check` on a reference that is exactly zero (issue 16 #8).

A layer_norm of constant rows has an all-zero reference; the CPU result is
rounding noise (the f32 error of each row's mean times 1/sqrt(eps)), which a
relative L2 error calls infinite.  Such a reference is judged by an absolute
floor, and every row of the table names the rule that decided.

Usage: test_check_rules.py --smelt PATH
"""
import argparse
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
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("test_check_rules: %d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
