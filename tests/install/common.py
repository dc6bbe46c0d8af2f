"""Shared by the install tests: running the runtime-only consumer and
comparing it with the compiler-side `smelt run` on the same inputs."""
import os
import subprocess

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32,
          "i8": np.int8, "u8": np.uint8, "bool": np.bool_}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(map(str, cmd))} (exit {r.returncode})\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_tensors(listing, outdir):
    """run_bundle's lines ("input x f32 4x64") and its raw files, as arrays."""
    tensors = []
    for line in listing.splitlines():
        kind, name, dt, shape = line.split()
        dims = [] if shape == "scalar" else [int(d) for d in shape.split("x")]
        fname = os.path.join(outdir, f"{'in' if kind == 'input' else 'out'}_{name.replace('/', '~')}.bin")
        a = np.fromfile(fname, dtype=DTYPES[dt]).reshape(dims)
        tensors.append((kind, name, a))
    return tensors


def compare_with_smelt_run(smelt, bundle, consumer, workdir, env=None, device="cpu"):
    """Runs the bundle through the consumer (runtime library alone) and
    through `smelt run` on the same inputs; returns the number of outputs,
    which must be bitwise equal (the same kernels: on the CPU on one thread,
    on CUDA the same cubins)."""
    outdir = os.path.join(workdir, "out")
    os.makedirs(outdir, exist_ok=True)
    listing = run([consumer, bundle, outdir, "--threads", "1", "--device", device], env=env)
    tensors = read_tensors(listing, outdir)
    cmd = [smelt, "run", bundle, "--device", device, "--threads", "1"]
    for kind, name, a in tensors:
        f = os.path.join(workdir, f"{kind}_{name.replace('/', '~')}.npy")
        if kind == "input":
            np.save(f, a)
            cmd += ["--input", f"{name}={f}"]
        else:
            cmd += ["--output", f"{name}={f}"]
    run(cmd, env=env)
    n = 0
    for kind, name, a in tensors:
        if kind != "output":
            continue
        ref = np.load(os.path.join(workdir, f"output_{name.replace('/', '~')}.npy"))
        if ref.shape != a.shape or not np.array_equal(ref, a, equal_nan=True):
            raise SystemExit(f"FAIL: {bundle}: output {name} differs between the runtime-only program and "
                             f"smelt run (max abs {np.max(np.abs(ref.astype(np.float64) - a)):.3g})")
        n += 1
    if n == 0:
        raise SystemExit(f"FAIL: {bundle}: no outputs")
    return n


def check_ldd(lib):
    """The runtime library must not pull in the compiler's dependencies."""
    out = run(["ldd", lib])
    bad = [w for w in ("libLLVM", "libyaml", "libjansson", "libprotobuf") if w in out]
    if bad:
        raise SystemExit(f"FAIL: {lib} depends on {', '.join(bad)}:\n{out}")
    return out
