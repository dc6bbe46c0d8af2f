#!/usr/bin/env python3
"""The Python package (python/smelt): pip-installed, checked against numpy and the CLI.

  1. `pip install .` of this tree into a temporary target directory (and
     `pip wheel .`, checked to hold the package and its extension).  The
     CMake build directory of the package is kept in BUILD/python-pkg (BUILD
     being the directory of the --smelt binary), so a second run rebuilds
     only what changed.  With nanobind and scikit-build-core importable here
     the build uses them (--no-build-isolation, no network); otherwise pip
     fetches them from PyPI.  A pip that cannot run is a failure (exit 1),
     not a skip.
  2. examples/mlp.yaml compiled by smelt.compile and run from Python on
     numpy arrays, compared with tests/e2e/reference.py (float64 numpy, on
     the weights `smelt run --device ref` dumps) and with `smelt run --device
     cpu` on the same input; a bundle written by `smelt compile` opened with
     smelt.load; specialisations (dims={"batch": [1, 8]}) chosen by input
     shape; torch CPU tensors through DLPack (skipped with a note where torch
     is not installed); preallocated outputs; non-contiguous inputs.
  3. Every example compiled and run through the Python API against `smelt
     run BUNDLE --device cpu` on the same bundle and inputs (every output).
  4. Errors: dtype and shape mismatches, unknown and missing inputs, a bad
     device, a missing file (smelt.IOError), and every case of tests/bad/cases
     that needs no generated fixture, each raising the smelt.Error subclass
     with `CASE:LINE:COL: error: MESSAGE` as its case file expects.
  5. State on examples/tiny_lm.yaml: the session's KV caches listed, zero at
     first, write_state/read_state round trip, reset_state; a run fills the
     cache rows of its positions only; a cache read from one session and
     written into another makes the next decode step give the same logits;
     prefill then decode (dims seq=[1,16], shared state) equals the
     16-token run's last logits.
  6. The GIL is released during a run (another Python thread progresses).

Usage: test_python.py --smelt PATH [--site DIR] [--fresh-clone]
  --site DIR      use a package already installed in DIR (skips step 1)
  --fresh-clone   also `git clone` this repository and `pip install` from the clone (slow: a full build)
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import reference  # noqa: E402

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def fail_now(msg):
    print("FAIL " + msg, flush=True)
    sys.exit(1)


# ---------------------------------------------------------------- 1. install

def pip_env():
    env = dict(os.environ)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def pip(args, what):
    cmd = [sys.executable, "-m", "pip"] + args
    print("run  " + " ".join(cmd), flush=True)
    t = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-6000:])
        fail_now("%s: pip exited %d" % (what, r.returncode))
    print("ok   %s (%.0f s)" % (what, time.time() - t), flush=True)


def build_args(build_dir):
    try:
        import nanobind  # noqa: F401
        import scikit_build_core  # noqa: F401
        isolation = ["--no-build-isolation"]
    except ImportError:
        print("note: nanobind/scikit-build-core not installed here: pip fetches them (PyPI)")
        isolation = []
    return isolation + ["--no-deps", "-Cbuild-dir=" + build_dir]


def install(build_root, tmp, fresh_clone):
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        fail_now("pip cannot run with %s (%s): the package cannot be built here" % (sys.executable, r.stdout.strip()))
    build_dir = os.path.join(build_root, "python-pkg")
    site = os.path.join(tmp, "site")
    pip(["install", "--target", site] + build_args(build_dir) + ["."], "pip install . (into %s)" % site)
    wheels = os.path.join(tmp, "wheels")
    pip(["wheel", "-w", wheels] + build_args(build_dir) + ["."], "pip wheel .")
    found = glob.glob(os.path.join(wheels, "smelt-*.whl"))
    if check(len(found) == 1, "pip wheel . wrote one smelt wheel (%s)" % [os.path.basename(f) for f in found]):
        names = zipfile.ZipFile(found[0]).namelist()
        check("smelt/__init__.py" in names and any(re.match(r"smelt/_smelt\..*\.so$", n) for n in names)
              and "smelt/py.typed" in names, "the wheel holds smelt/__init__.py, py.typed and the extension")
        check(not any(n.startswith(("bin/", "include/", "lib/")) or "/bin/" in n for n in names),
              "the wheel holds the package only (no tool, headers or libraries)")
    if fresh_clone:
        clone = os.path.join(tmp, "clone")
        subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
        cmd = [sys.executable, "-m", "pip", "install", "--target", os.path.join(tmp, "clone-site")] + \
            build_args(os.path.join(tmp, "clone-build")) + ["."]
        r = subprocess.run(cmd, cwd=clone, env=pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            print(r.stdout[-6000:])
        check(r.returncode == 0, "pip install . from a fresh clone of HEAD")
    return site


# ---------------------------------------------------------------- helpers

def cli(smelt_bin, *args):
    r = subprocess.run([smelt_bin] + list(args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise RuntimeError("smelt %s: exit %d" % (" ".join(args), r.returncode))
    return r


def cli_run(smelt_bin, model, device, inputs, outputs, tmp, tag):
    """`smelt run model --device D --input ... --output ...` -> {name: array}."""
    args = ["run", model, "--device", device]
    for name, x in inputs.items():
        p = os.path.join(tmp, "%s-in-%s.npy" % (tag, name.replace("/", "_")))
        np.save(p, x)
        args += ["--input", "%s=%s" % (name, p)]
    paths = {}
    for name in outputs:
        paths[name] = os.path.join(tmp, "%s-out-%s.npy" % (tag, name.replace("/", "_")))
        args += ["--output", "%s=%s" % (name, paths[name])]
    cli(smelt_bin, *args)
    return {name: np.load(p) for name, p in paths.items()}


def raises(fn, cls, what, contains=None):
    import smelt
    try:
        fn()
    except smelt.Error as e:
        ok = isinstance(e, cls) and (contains is None or contains in str(e))
        check(ok, "%s raises %s: %s" % (what, type(e).__name__, e))
        return e
    except Exception as e:  # noqa: BLE001
        check(False, "%s raises %s (%s), not smelt.%s" % (what, type(e).__name__, e, cls.__name__))
        return None
    check(False, "%s raises nothing (expected smelt.%s)" % (what, cls.__name__))
    return None


# ---------------------------------------------------------------- 2. mlp

def test_mlp(smelt_bin, tmp):
    import smelt
    model = os.path.join(ROOT, "examples", "mlp.yaml")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 64)).astype(np.float32)

    b = smelt.compile(model, target="cpu")
    check(b.inputs == (smelt.TensorInfo("x", "f32", (8, 64)),) and
          b.outputs == (smelt.TensorInfo("y", "f32", (8, 10)),),
          "Bundle.inputs/outputs: %s -> %s" % (b.inputs, b.outputs))
    check(b.num_specialisations == 1 and b.specialisations[0].dims == "", "one specialisation, dims ''")
    s = b.session(threads=2)
    check(s.states == (), "mlp has no state")
    y = s.run({"x": x})
    check(set(y) == {"y"} and isinstance(y["y"], np.ndarray) and y["y"].dtype == np.float32 and
          y["y"].shape == (8, 10), "run returns {'y': float32 ndarray (8, 10)}")
    y = y["y"]

    params = ["w1", "b1", "w2", "b2", "w3"]
    ref = cli_run(smelt_bin, model, "ref", {"x": x}, ["y"] + params, tmp, "mlp-ref")
    want = reference.mlp(x.astype(np.float64), {p: ref[p] for p in params})
    e = rel_l2(y, want)
    check(e <= 1e-5, "mlp from Python vs numpy reference (float64): rel L2 %.2e <= 1e-5" % e)
    cpu = cli_run(smelt_bin, model, "cpu", {"x": x}, ["y"], tmp, "mlp-cpu")["y"]
    e = rel_l2(y, cpu)
    check(e <= 1e-6, "mlp from Python vs `smelt run --device cpu`: rel L2 %.2e <= 1e-6" % e)

    # a bundle file from the CLI, opened from Python
    path = os.path.join(tmp, "mlp.smelt")
    cli(smelt_bin, "compile", model, "-o", path)
    lb = smelt.load(path)
    check(lb.path == path and lb.inputs == b.inputs, "smelt.load: path and inputs")
    e = rel_l2(lb.session().run({"x": x})["y"], want)
    check(e <= 1e-5, "smelt.load(smelt compile's bundle): rel L2 %.2e vs numpy" % e)
    saved = os.path.join(tmp, "mlp-saved.smelt")
    b.save(saved)
    r = cli(smelt_bin, "inspect", saved)
    check("model=" in r.stdout, "Bundle.save writes a file `smelt inspect` reads")

    # non-contiguous, array-like and read-only inputs
    xt = np.asfortranarray(x)
    check(rel_l2(s.run({"x": xt})["y"], y) == 0.0, "a Fortran-ordered input gives the same output")
    check(rel_l2(s.run({"x": x.tolist()})["y"], y) == 0.0, "a nested list input gives the same output")
    xr = x.copy()
    xr.setflags(write=False)
    check(rel_l2(s.run({"x": xr})["y"], y) == 0.0, "a read-only array input gives the same output")
    # preallocated outputs and output selection
    out = np.zeros((8, 10), np.float32)
    r = s.run({"x": x}, outputs={"y": out})
    check(r["y"] is out and rel_l2(out, y) == 0.0, "outputs={'y': array} writes into the given array")
    check(list(s.run({"x": x}, outputs=["y"])) == ["y"], "outputs=['y'] returns that output")
    check(rel_l2(s({"x": x})["y"], y) == 0.0, "a session is callable")

    # torch through DLPack
    try:
        import torch
    except ImportError:
        print("note: torch is not installed: the DLPack check with torch CPU tensors is skipped")
        torch = None
    if torch is not None:
        xt = torch.from_numpy(x.copy())
        check(rel_l2(s.run({"x": xt})["y"], y) == 0.0, "torch CPU tensor input (DLPack)")
        xnc = torch.from_numpy(np.ascontiguousarray(x.T)).T  # a transposed view: not contiguous
        check(not xnc.is_contiguous() and rel_l2(s.run({"x": xnc})["y"], y) == 0.0,
              "non-contiguous torch CPU tensor input (copied once)")
        ot = torch.zeros((8, 10), dtype=torch.float32)
        s.run({"x": xt}, outputs={"y": ot})
        check(rel_l2(ot.numpy(), y) == 0.0, "torch CPU tensor as a preallocated output (zero-copy)")
        raises(lambda: s.run({"x": xt.double()}), smelt.InvalidInputError, "torch f64 tensor for an f32 input",
               "f64")
        # an object with __dlpack__ only (not a tensor or ndarray)
        class Wrapped:
            def __init__(self, t):
                self.t = t

            def __dlpack__(self, **kw):
                return self.t.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.t.__dlpack_device__()
        check(rel_l2(s.run({"x": Wrapped(xt)})["y"], y) == 0.0, "any object with __dlpack__ as an input")

    # specialisations picked by input shapes
    bs = smelt.compile(model, dims={"batch": [1, 8]})
    check(bs.num_specialisations == 2 and [sp.dims for sp in bs.specialisations] == ["batch=1", "batch=8"] and
          bs.inputs[0].shape == (None, 64) and bs.specialisations[0].outputs[0].shape == (1, 10),
          "dims={'batch': [1, 8]}: two specialisations, x (None, 64)")
    ss = bs.session()
    y1 = ss.run({"x": x[:1]})["y"]
    check(y1.shape == (1, 10) and ss.specialisation == 0 and rel_l2(y1, want[:1]) <= 1e-5,
          "batch 1 runs specialisation 0, matches numpy (rel L2 %.2e)" % rel_l2(y1, want[:1]))
    y8 = ss.run({"x": x})["y"]
    check(y8.shape == (8, 10) and ss.specialisation == 1 and rel_l2(y8, want) <= 1e-5,
          "batch 8 runs specialisation 1, matches numpy")
    raises(lambda: ss.run({"x": x[:3]}), smelt.InvalidInputError, "batch 3 on a bundle of batch=1,8", "batch=1,8")

    # errors
    raises(lambda: s.run({"x": x.astype(np.float64)}), smelt.InvalidInputError, "f64 array for an f32 input",
           "f64")
    raises(lambda: s.run({"x": x[:7]}), smelt.InvalidInputError, "x of shape (7, 64)", "x")
    raises(lambda: s.run({"x": x, "z": x}), smelt.InvalidInputError, "an unknown input 'z'", "'z'")
    raises(lambda: s.run({}), smelt.InvalidInputError, "no inputs", "missing input")
    raises(lambda: s.run({"x": x}, outputs=["q"]), smelt.InvalidInputError, "an unknown output", "'q'")
    raises(lambda: s.run({"x": x}, outputs={"y": np.zeros((8, 10), np.float64)}), smelt.InvalidInputError,
           "an f64 output array", "f64")
    raises(lambda: b.session(device="tpu"), smelt.UnsupportedError, "device 'tpu'", "tpu")
    raises(lambda: smelt.load(os.path.join(tmp, "nowhere.smelt")), smelt.IOError, "a missing bundle file",
           "nowhere.smelt")
    raises(lambda: smelt.compile(os.path.join(tmp, "nowhere.yaml")), smelt.Error, "a missing model file",
           "nowhere.yaml")
    junk = os.path.join(tmp, "junk.smelt")
    with open(path, "rb") as f:
        data = f.read()
    with open(junk, "wb") as f:
        f.write(data[: len(data) // 2])
    raises(lambda: smelt.load(junk), smelt.Error, "a truncated bundle", "junk.smelt")
    raises(lambda: smelt.compile(model, dims={"nodim": 3}), smelt.InvalidInputError, "an unknown dim", "nodim")
    try:
        smelt.compile(model, frobnicate=True)
        check(False, "an unknown compile option raises TypeError")
    except TypeError as e:
        check("frobnicate" in str(e), "an unknown compile option raises TypeError: %s" % e)

    # the GIL is released during a run: another Python thread keeps counting
    big = smelt.compile(model, dims={"batch": 4096}).session(threads=1)
    xb = rng.standard_normal((4096, 64)).astype(np.float32)
    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    big.run({"x": xb})
    t0 = time.perf_counter()
    for _ in range(5):
        big.run({"x": xb})
    run_s = (time.perf_counter() - t0) / 5
    th = threading.Thread(target=count)
    th.start()
    time.sleep(0.02)
    before = ticks[0]
    time.sleep(0.05)                   # sleep drops the GIL: the thread's own rate
    rate = (ticks[0] - before) / 0.05
    # With the GIL held through a run, the counting thread gets at most a
    # switch interval (0.1 ms) at either end of it; released, it counts for the
    # whole run. A fifth of the run's worth of counting is far above the
    # first. The best run is kept: on a loaded machine (CI runs two tests at
    # once on two cores) the thread may get no core at all during some runs.
    sys.setswitchinterval(1e-4)
    need = max(1000, 0.2 * rate * run_s, 4 * rate * 1e-4)
    t0 = time.time()
    n = 0
    during = 0
    while time.time() - t0 < 5.0 and during <= need:
        before = ticks[0]
        big.run({"x": xb})
        during = max(during, ticks[0] - before)
        n += 1
    stop.set()
    th.join()
    sys.setswitchinterval(5e-3)
    check(during > need, "another thread counted %d during the best of %d runs of %.1f ms (needs > %d: GIL released)"
          % (during, n, run_s * 1e3, need))


# ---------------------------------------------------------------- 3. every example vs the CLI

def example_inputs(bundle, rng):
    out = {}
    for t in bundle.inputs:
        if t.dtype in ("i32", "i64"):
            n = int(np.prod(t.shape))
            out[t.name] = (np.arange(n) % 16).reshape(t.shape).astype(t.numpy_dtype)  # valid ids and positions
        else:
            out[t.name] = rng.standard_normal(t.shape).astype(t.numpy_dtype)
    return out


def test_examples(smelt_bin, tmp):
    import smelt
    rng = np.random.default_rng(7)
    for model in sorted(glob.glob(os.path.join(ROOT, "examples", "*.yaml"))):
        name = os.path.basename(model)
        try:
            b = smelt.compile(model)
        except smelt.Error as e:
            check(False, "%s: smelt.compile: %s" % (name, e))
            continue
        ins = example_inputs(b, rng)
        got = b.session().run(ins)
        # the CLI runs the bundle compiled here (compiling each example once keeps this fast; the
        # compiler itself is checked against numpy by tests/e2e and test_mlp above)
        path = os.path.join(tmp, name + ".smelt")
        b.save(path)
        try:
            want = cli_run(smelt_bin, path, "cpu", ins, list(got), tmp, name)
        except RuntimeError as e:
            check(False, "%s: %s" % (name, e))
            continue
        for k in got:
            if got[k].dtype.kind == "f":
                e = rel_l2(got[k], want[k])
                check(got[k].shape == want[k].shape and e <= 1e-6,
                      "%s: output %s from Python vs `smelt run --device cpu`: rel L2 %.2e" % (name, k, e))
            else:
                check(np.array_equal(got[k], want[k]), "%s: output %s (%s) equals the CLI's" % (name, k, got[k].dtype))


# ---------------------------------------------------------------- 4. bad models

def test_bad_cases(tmp):
    import smelt
    n = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "bad", "cases", "*.yaml"))):
        text = open(path, encoding="utf-8", errors="replace").read()
        if ".safetensors" in text:
            continue  # its fixtures are generated by tests/bad/test_bad_inputs.py
        expect = re.search(r"^#\s*expect:\s*(.*\S)", text, re.M)
        args = re.search(r"^#\s*args:\s*(.*\S)", text, re.M)
        dims = {}
        if args:
            m = re.fullmatch(r"--dim (\w+)=(\d+)", args.group(1))
            if not m:
                continue
            dims[m.group(1)] = int(m.group(2))
        if not expect:
            continue
        m = re.match(r"(\d+):(\d+):\s*(.*)", expect.group(1))
        name = os.path.relpath(path, ROOT)
        try:
            smelt.compile(path, dims=dims or None)
            check(False, "%s: smelt.compile raises nothing" % name)
            continue
        except smelt.Error as e:
            msg = str(e)
            if m:
                line, col, want = int(m.group(1)), int(m.group(2)), m.group(3)
                ok = msg.startswith("%s:%d:%d: error: " % (path, line, col)) and want in msg and \
                    (e.line, e.column) == (line, col) and e.file == path
            else:
                want = expect.group(1)
                ok = msg.startswith("%s: error: " % path) and want in msg
            ok = ok and isinstance(e, smelt.InvalidInputError) and e.code == 1
            if not ok:
                check(False, "%s: smelt.compile raised %s %r (expected %s)" % (name, type(e).__name__, msg,
                                                                               expect.group(1)))
            n += 1
    check(n >= 30, "%d bad models raise smelt.InvalidInputError with the located message their case expects" % n)


# ---------------------------------------------------------------- 5. state (tiny_lm)

def test_state(smelt_bin, tmp):
    import smelt
    model = os.path.join(ROOT, "examples", "tiny_lm.yaml")
    try:
        b = smelt.compile(model, dims={"seq": [1, 16]})
    except smelt.Error as e:
        check(False, "tiny_lm: smelt.compile: %s" % e)
        return
    s = b.session(threads=2)
    names = [t.name for t in s.states]
    check(len(names) == 4 and all(t.shape == (1, 2, 128, 16) and t.dtype == "f32" for t in s.states),
          "tiny_lm: Session.states: %s" % (s.states,))
    k0 = names[0]
    check(all(not s.read_state(n).any() for n in names), "states are zero in a new session")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1, 2, 128, 16)).astype(np.float32)
    s.write_state(k0, w)
    check(np.array_equal(s.read_state(k0), w), "write_state then read_state gives the array back")
    s.reset_state()
    check(not s.read_state(k0).any(), "reset_state zeroes the state")
    raises(lambda: s.read_state("nope"), smelt.InvalidInputError, "read_state of an unknown state", "nope")
    raises(lambda: s.write_state(k0, w[:, :1]), smelt.InvalidInputError, "write_state of the wrong size")
    raises(lambda: s.write_state(k0, w.astype(np.float64)), smelt.InvalidInputError, "write_state of f64", "f64")

    ids = np.array([3, 141, 59, 26, 53, 58, 97, 93, 238, 46, 26, 43, 38, 32, 79, 50], np.int32)
    pos = np.arange(16, dtype=np.int32)
    full = s.run({"ids": ids, "pos": pos})
    kc = s.read_state(k0)
    check(np.abs(kc[:, :, :16]).min() > 0 and not kc[:, :, 16:].any(),
          "a 16-token run fills cache rows 0..15 only")

    # prefill 15 tokens, then decode the 16th on the same state: the logits of the full run
    s.reset_state()
    a = np.zeros(16, np.int32)
    a[:15] = ids[:15]
    # seq=16 run of the first 15 tokens and a pad at position 15 ...
    s.run({"ids": a, "pos": pos})
    # ... whose row 15 the decode step overwrites
    dec = s.run({"ids": ids[15:], "pos": pos[15:]})
    e = rel_l2(dec["logits"], full["logits"])
    check(e <= 1e-4 and s.specialisation == 0,
          "prefill (seq=16) then decode (seq=1) on the shared state = the full run's last logits: rel L2 %.2e" % e)

    # a cache copied to another session through read_state/write_state continues the same sequence
    s.reset_state()
    s.run({"ids": a, "pos": pos})
    t = b.session(threads=1)
    for n in names:
        t.write_state(n, s.read_state(n))
    d1 = s.run({"ids": ids[15:], "pos": pos[15:]})
    d2 = t.run({"ids": ids[15:], "pos": pos[15:]})
    check(np.array_equal(d1["logits"], d2["logits"]) and rel_l2(d2["logits"], full["logits"]) <= 1e-4,
          "a cache written into a second session gives the same decode step")
    # without the cache, the decode step differs
    u = b.session(threads=1)
    d3 = u.run({"ids": ids[15:], "pos": pos[15:]})
    check(rel_l2(d3["logits"], full["logits"]) > 1e-2, "without the cache the decode step differs (rel L2 %.2e)"
          % rel_l2(d3["logits"], full["logits"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--site", help="a directory where the package is already installed")
    ap.add_argument("--fresh-clone", action="store_true")
    opts = ap.parse_args()
    smelt_bin = os.path.abspath(opts.smelt)
    tmp = tempfile.mkdtemp(prefix="smelt-python-")
    try:
        site = opts.site or install(os.path.dirname(smelt_bin), tmp, opts.fresh_clone)
        sys.path.insert(0, site)
        import smelt
        check(os.path.dirname(os.path.abspath(smelt.__file__)) == os.path.join(os.path.abspath(site), "smelt"),
              "smelt imported from the installed package (%s), version %s" % (smelt.__file__, smelt.__version__))
        for section, fn in (("mlp", lambda: test_mlp(smelt_bin, tmp)),
                            ("examples", lambda: test_examples(smelt_bin, tmp)),
                            ("bad models", lambda: test_bad_cases(tmp)),
                            ("state", lambda: test_state(smelt_bin, tmp))):
            t = time.time()
            fn()
            print("---- %s: %.1f s" % (section, time.time() - t), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
