#!/usr/bin/env python3
"""The compile side of the tuning table, without a GPU (NVRTC only).

`smelt compile --target cuda --arch sm_90a` of a small f16 model:
- with --no-tune-table each matmul gets the heuristic's variant (a GEMV for
  M = 4), recorded in the bundle: `inspect --kernels` shows it;
- with a table that has a row for one matmul's shape (interval on M, the
  shape's fields in any order), that kernel gets the row's variant and the
  other kernel's miss is noted on stderr naming its shape;
- a row whose M interval does not hold M is a miss;
- a table with an error fails with file:line:col and exit status 1;
- `inspect --dump-cubins DIR` writes the unit's cubin and kernels.tsv with
  each kernel's variant.
"""
import argparse
import os
import subprocess
import sys
import tempfile

MODEL = """smelt: 1
name: two_gemvs
seed: 5
dtype: f16
inputs:
  x: {shape: [4, 64]}
params:
  w1: {shape: [64, 96], init: {normal: 0.1}}
  w2: {shape: [96, 32], init: {normal: 0.1}}
nodes:
  - {out: h, op: matmul, in: [x, w1]}
  - {out: y, op: matmul, in: [h, w2]}
outputs: [y]
"""


def smelt_cmd(smelt, args, env=None):
    e = dict(os.environ)
    e.pop("SMELT_TUNE_TABLE", None)
    e.update(env or {})
    return subprocess.run([smelt] + args, capture_output=True, text=True, timeout=300, env=e)


class Checker:
    def __init__(self):
        self.failures, self.count = [], 0

    def check(self, what, ok, detail=""):
        self.count += 1
        crashed = "AddressSanitizer" in detail or "runtime error" in detail
        if not ok or crashed:
            self.failures.append(what)
            print(f"FAIL {what}\n{detail}")
        else:
            print(f"ok   {what}")
        return ok and not crashed


def variants(smelt, bundle):
    """kernel name -> CUDA variant, from `inspect --kernels`."""
    r = smelt_cmd(smelt, ["inspect", bundle, "--kernels"])
    out = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 10 and f[0].isdigit():
            out[f[1]] = f[-1]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "two_gemvs.yaml")
        with open(model, "w") as f:
            f.write(MODEL)
        base = ["compile", model, "--target", "cuda", "--arch", "sm_90a"]
        b0 = os.path.join(tmp, "plain.smelt")
        r = smelt_cmd(smelt, base + ["-o", b0, "--no-tune-table"])
        if "NVRTC" in r.stderr and r.returncode != 0:
            print(f"SKIP: no NVRTC here: {r.stderr.strip()}")
            return 77  # 77: skipped as a whole (ctest's SKIP_RETURN_CODE)
        if not c.check("compile without a table", r.returncode == 0, r.stderr):
            return 1
        c.check("no table: no notes", "note:" not in r.stderr, r.stderr)
        v0 = variants(smelt, b0)
        c.check("no table: the heuristic's GEMV for both", len(v0) == 2 and all(x.startswith("gemv:") for x in v0.values()),
                str(v0))

        # a row for h's shape (w1 stored [96, 64] by the layout pass), fields in another order
        table = os.path.join(tmp, "t.table")
        with open(table, "w") as f:
            f.write("# a hand-made table\n"
                    "matmul f16 sm_90a m=3..4 tb=1 ta=0 N=96 K=64 Z=1 simple  # chosen by hand\n"
                    "matmul f16 sm_80  m=1..8 K=96 N=32 Z=1 ta=0 tb=1 simple  # another arch\n")
        b1 = os.path.join(tmp, "tuned.smelt")
        r = smelt_cmd(smelt, base + ["-o", b1, "--tune-table", table])
        c.check("compile with a table", r.returncode == 0, r.stderr)
        v1 = variants(smelt, b1)
        h = [k for k in v1 if k.endswith("_h")]
        y = [k for k in v1 if k.endswith("_y")]
        c.check("the row's variant is used and recorded", h and v1[h[0]] == "simple", str(v1))
        c.check("the other kernel keeps the heuristic", y and v1[y[0]].startswith("gemv:"), str(v1))
        c.check("the miss is noted with its shape",
                "note: no tuned variant for matmul f16 sm_90a m=4 K=96 N=32 Z=1 ta=0 tb=1" in r.stderr, r.stderr)
        r = smelt_cmd(smelt, base + ["-o", b1], env={"SMELT_TUNE_TABLE": table})
        c.check("$SMELT_TUNE_TABLE names the default table",
                r.returncode == 0 and variants(smelt, b1).get(h[0] if h else "") == "simple", r.stderr)

        # an interval that does not hold M = 4
        with open(table, "w") as f:
            f.write("matmul f16 sm_90a m=5..8 K=64 N=96 Z=1 ta=0 tb=1 simple\n")
        r = smelt_cmd(smelt, base + ["-o", b1, "--tune-table", table])
        v2 = variants(smelt, b1)
        c.check("M outside the row's interval is a miss",
                r.returncode == 0 and all(x.startswith("gemv:") for x in v2.values()) and
                "m=4 K=64 N=96" in r.stderr, r.stderr + str(v2))

        # a broken table
        with open(table, "w") as f:
            f.write("matmul f16 sm_90a m=1..4 K=64 N=96 Z=1 ta=0 tb=1 simple\nmatmul f16 sm_90a m=9..2 K=1 simple\n")
        r = smelt_cmd(smelt, base + ["-o", b1, "--tune-table", table])
        c.check("a bad table: file:line:col and exit 1",
                r.returncode == 1 and f"{table}:2:" in r.stderr and "error" in r.stderr, r.stderr)
        r = smelt_cmd(smelt, base + ["-o", b1, "--tune-table", os.path.join(tmp, "missing.table")])
        c.check("a missing table: exit 1", r.returncode == 1 and "missing.table" in r.stderr, r.stderr)
        r = smelt_cmd(smelt, base + ["-o", b1, "--tune-table", table, "--no-tune-table"])
        c.check("--tune-table with --no-tune-table: usage error", r.returncode == 2, r.stderr)

        # the cubins for cuobjdump
        d = os.path.join(tmp, "cubins")
        r = smelt_cmd(smelt, ["inspect", b0, "--dump-cubins", d])
        files = sorted(os.listdir(d)) if os.path.isdir(d) else []
        c.check("--dump-cubins writes the cubin and kernels.tsv",
                r.returncode == 0 and "kernels.tsv" in files and any(x.endswith(".sm_90a.cubin") for x in files),
                r.stderr + str(files))
        if "kernels.tsv" in files:
            with open(os.path.join(d, "kernels.tsv")) as f:
                tsv = f.read()
            c.check("kernels.tsv names each kernel's variant", tsv.count("gemv:") == 2, tsv)
            cubin = [x for x in files if x.endswith(".cubin")]
            with open(os.path.join(d, cubin[0]), "rb") as f:
                c.check("the cubin is an ELF file", f.read(4) == b"\x7fELF")
    print(f"test_tune_compile: {c.count - len(c.failures)} of {c.count} checks passed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
