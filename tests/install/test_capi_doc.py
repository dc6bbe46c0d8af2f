#!/usr/bin/env python3
"""The example program of docs/c-api.md compiles and does what it says,
and the page names every function and type of the public headers.

Extracts the first ```c block of docs/c-api.md, compiles it with
-std=c11 -Wall -Wextra -Werror against the source tree's headers and the
build's libsmelt and libsmelt_runtime, runs it on examples/mlp.yaml (it
compiles the model, runs it on made-up f32 inputs, prints every output
element) and checks its numbers against `smelt run` of the bundle it wrote,
given the same inputs: bitwise, both on one CPU thread.

Usage: test_capi_doc.py --smelt PATH   (the build directory is PATH's)
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(map(str, cmd))} (exit {r.returncode})\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    build = os.path.dirname(smelt)
    cc = shutil.which("cc")
    if not cc:
        print("SKIP: no C compiler")
        return 77
    doc = open(os.path.join(ROOT, "docs", "c-api.md")).read()
    # every function and type the public headers declare is documented
    missing = []
    for h in ("smelt.h", "smelt_compile.h"):
        text = open(os.path.join(ROOT, "include", h)).read()
        names = set(re.findall(r"\b(smelt_[a-z_0-9]+)\s*\(", text)) | set(re.findall(r"\}\s*(smelt_[a-z_0-9]+);", text))
        names |= set(re.findall(r"typedef [^;]*?\(\*(smelt_[a-z_0-9]+)\)", text))
        missing += sorted(f"{h}: {n}" for n in names if f"`{n}" not in doc and f"{n}(" not in doc)
    if missing:
        raise SystemExit("FAIL: docs/c-api.md does not document " + ", ".join(missing))
    print("ok: docs/c-api.md names every function and type of smelt.h and smelt_compile.h")
    m = re.search(r"```c\n(.*?)```", doc, re.S)
    if not m:
        raise SystemExit("FAIL: docs/c-api.md has no ```c block")
    san = ["-fsanitize=address,undefined"] if "SMELT_SANITIZE:BOOL=ON" in open(os.path.join(build, "CMakeCache.txt")).read() else []
    with tempfile.TemporaryDirectory() as d:
        src, exe, bundle = os.path.join(d, "app.c"), os.path.join(d, "app"), os.path.join(d, "mlp.smelt")
        with open(src, "w") as f:
            f.write(m.group(1))
        run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", *san, "-I", os.path.join(ROOT, "include"), src, "-o", exe,
             "-L", build, "-lsmelt", "-lsmelt_runtime", "-Wl,-rpath," + build])
        print("ok: the example of docs/c-api.md compiles warning-free")
        env = dict(os.environ, SMELT_CACHE_DIR=os.path.join(d, "cache"))
        out = run([exe, os.path.join(ROOT, "examples", "mlp.yaml"), bundle], env=env)
        got = {}
        for line in out.splitlines():
            name, i, v = line.split()
            got.setdefault(name, []).append((int(i), float(v)))
        # the same inputs: element e of every f32 input is (e % 17) / 16 - 0.5
        x = ((np.arange(8 * 64) % 17) / np.float32(16) - np.float32(0.5)).astype(np.float32).reshape(8, 64)
        np.save(os.path.join(d, "x.npy"), x)
        run([smelt, "run", bundle, "--device", "cpu", "--threads", "1", "--input", "x=" + os.path.join(d, "x.npy"),
             "--output", "y=" + os.path.join(d, "y.npy")], env=env)
        want = np.load(os.path.join(d, "y.npy")).reshape(-1)
        vals = [v for _, v in sorted(got.get("y", []))]
        if list(got) != ["y"] or len(vals) != want.size:
            raise SystemExit(f"FAIL: the example printed {list(got)} with {len(vals)} values, want y with {want.size}")
        # %.9g round-trips an f32 exactly
        if not np.array_equal(np.array(vals, dtype=np.float32), want):
            raise SystemExit(f"FAIL: the example's y differs from smelt run's (max abs "
                             f"{np.max(np.abs(np.array(vals) - want)):.3g})")
        print(f"ok: its {want.size} outputs equal smelt run's on the same inputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
