#!/usr/bin/env python3
"""smelt's CPU benchmark (SPEC §8, C1): smelt against ONNX Runtime and numpy.

A benchmark, not a test: it is never run by CI.  For every workload, in one
run of this script:

  1. random inputs are made here (floats ~ N(0, 1); integer inputs, the
     positions, count 0, 1, 2, ...) and saved as .npy;
  2. `smelt run MODEL.yaml --device ref` runs the reference interpreter on
     them and dumps the output and every param (`--output NAME=FILE.npy`
     takes any value), so every peer computes with exactly smelt's weights
     and is checked against the same oracle;
  3. ONNX Runtime runs the graph that onnx_export.py builds from the same
     YAML (2 intra-op threads by default, all graph optimisations), numpy
     runs the models of tests/e2e/reference.py (float64, as that file is
     written) or, for the bench/models workloads, the same reference
     operators on float32 arrays, and PyTorch eager / torch.compile run
     when `import torch` works (torch_peer.py; not installable here);
  4. smelt compiles the model for the CPU and `smelt bench` times it, and
     `smelt run BUNDLE --device cpu` produces its output for the check.
     Until the CPU backend exists this part prints n/a with the reason.

Each output is compared with the reference interpreter's (relative L2; the
ONNX export must agree to <= 1e-4, which checks the exporter).  Times are
medians over repeated calls after warm-up: for ORT with I/O bound once
(IOBinding), so the per-call Python overhead is a few microseconds; for
smelt as `smelt bench` reports its whole run.  The peers are timed in
--rounds interleaved rounds and each keeps its best round, so a burst of
other work on a shared machine does not land on one peer's whole column.

Achieved GB/s counts the compulsory traffic (every input and param read
once, every output written once: the least any implementation must move),
so % of bandwidth is against the machine's copy bandwidth measured here
(numpy copy of 256 MiB split over --threads threads, best of 5, read +
write bytes; the one-thread figure is printed too).  Models whose bytes fit
in the caches can exceed 100 %.  GFLOP/s counts 2 per multiply-add of matmul,
conv2d and attention (full S x T) plus 1 per element of other arithmetic.

Usage: bench.py [--smelt PATH] [--threads 2] [--only W,...] [--rounds 3] [--keep DIR]
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib


def _early_threads():
    """BLAS reads its thread count when numpy is imported, so --threads is
    looked at before that."""
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, _early_threads())

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import reference as ref  # noqa: E402
import yaml_model  # noqa: E402

EXPORT_TOLERANCE = 1e-4  # ONNX export and smelt CPU against the reference interpreter
NUMPY_TOLERANCE = 1e-4


# ---------------------------------------------------------------- workloads

class Workload:
    def __init__(self, wid, yaml_path, dims, numpy_fn, what):
        self.id, self.yaml, self.dims, self.numpy_fn, self.what = wid, yaml_path, dims, numpy_fn, what


def _w1(i, p):
    # reference.gelu's x**3 takes numpy's general float power (~50x slower
    # than two multiplies on f32), so the tanh form is spelt out here.
    h = i["x"] + p["b"]
    a = 0.5 * h * (1.0 + np.tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))
    return ref.rms_norm(a + i["r"], p["g"], eps=1e-6)


def _w2(i, p):
    x = i["x"]
    return (ref.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def _f64(inputs):
    return {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}


EX = os.path.join(ROOT, "examples")
MODELS = os.path.join(ROOT, "bench", "models")
WORKLOADS = [
    Workload("mlp", os.path.join(EX, "mlp.yaml"), {}, lambda i, p: ref.mlp(_f64(i)["x"], p),
             "examples/mlp.yaml, x [8,64]"),
    Workload("cnn", os.path.join(EX, "cnn.yaml"), {}, lambda i, p: ref.cnn(_f64(i)["x"], p),
             "examples/cnn.yaml, x [1,3,32,32]"),
    Workload("gpt2_block", os.path.join(EX, "gpt2_block.yaml"), {},
             lambda i, p: ref.gpt2_block(_f64(i)["x"], p), "examples/gpt2_block.yaml, seq 16"),
    Workload("tiny_llama", os.path.join(EX, "tiny_llama.yaml"), {},
             lambda i, p: ref.tiny_llama(_f64(i)["x"], i["pos"], p), "examples/tiny_llama.yaml, seq 16"),
    Workload("w1_norm_gelu", os.path.join(MODELS, "w1_norm_gelu.yaml"), {}, _w1,
             "W1 rms_norm(gelu_tanh(x+b)+r, g), x r [2048,1024]"),
    Workload("w2_swiglu_m1", os.path.join(MODELS, "w2_swiglu.yaml"), {"m": 1}, _w2,
             "W2 SwiGLU MLP H 1024 I 2816, M 1"),
    Workload("w2_swiglu_m128", os.path.join(MODELS, "w2_swiglu.yaml"), {"m": 128}, _w2,
             "W2 SwiGLU MLP H 1024 I 2816, M 128"),
    # The two above fit this class of machine's caches (24 MiB and 34.6 MB
    # against 32 MiB of L3), so repeated calls run from L3; these sizes do
    # not, and measure the DRAM roofline SPEC §8 sets W1 and W2 M=1 against.
    Workload("w1_norm_gelu_8k", os.path.join(MODELS, "w1_norm_gelu.yaml"), {"rows": 8192}, _w1,
             "W1, x r [8192,1024] (96 MiB, past the caches)"),
    Workload("w2_swiglu_m1_2k", os.path.join(MODELS, "w2_swiglu.yaml"),
             {"m": 1, "hidden": 2048, "inter": 5632}, _w2, "W2, H 2048 I 5632, M 1 (138 MB of weights)"),
    Workload("matmul_512", os.path.join(MODELS, "matmul.yaml"), {}, lambda i, p: i["x"] @ p["w"],
             "matmul 512x512x512"),
]


# ------------------------------------------------------------------ helpers

def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def npy(tmp, name):
    return os.path.join(tmp, name.replace("/", "__") + ".npy")


def first_error(proc):
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return (lines[0] if lines else f"exit {proc.returncode}")[:160]


def run_cmd(cmd, timeout=900):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def time_calls(fn, warmup, min_iters, min_seconds):
    """Median milliseconds of fn() over at least min_iters calls and
    min_seconds, after warmup calls."""
    for _ in range(warmup):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e6)
        if len(times) >= 100000:
            break
    return statistics.median(times)


def copy_bandwidth(threads):
    """GB/s of a numpy copy of 256 MiB (read + write bytes), best of 5, the
    array split over `threads` Python threads (np.copyto releases the GIL)."""
    n = (256 << 20) // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)  # touched, so no page faults are timed
    step = -(-n // threads)
    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=np.copyto, args=(dst[i:i + step], src[i:i + step]))
                   for i in range(0, n, step)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def machine():
    model, cpus = "unknown CPU", os.cpu_count()
    try:
        out = run_cmd(["lscpu"]).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        model = m.group(1).strip() if m else model
    except OSError:
        pass
    return f"{model}, {cpus} CPUs"


def make_inputs(model, wid):
    rng = np.random.default_rng(zlib.crc32(wid.encode()))
    out = {}
    for name, (shape, dt) in model.inputs.items():
        if dt in ("f32", "f16", "f64"):
            out[name] = rng.standard_normal(shape).astype(yaml_model.DTYPES[dt])
        else:  # positions: 0, 1, 2, ... along the last axis
            out[name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(yaml_model.DTYPES[dt])
    return out


# ------------------------------------------------------------------- smelt

def parse_bench_total(text):
    """The median total time in ms from `smelt bench` output: with --json
    (cli/bench.c) the `totals` row named "total (whole run)"; as a table,
    the header names the unit (`kernel tasks median(us) GB/s ...`) and the
    row `total (whole run)  <median> <GB/s> ...` has an empty tasks cell.
    None when no total is found."""
    text = text.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        # cli/bench.c: "totals": [{"name": "total (whole run)", "median_us": ..}, ..]
        for row in doc.get("totals", []):
            if row.get("name", "").startswith("total (whole run)") and "median_us" in row:
                return float(row["median_us"]) * 1e-3
        total = doc.get("total", doc.get("total_ms"))
        if isinstance(total, dict):
            for key, scale in (("median_ms", 1.0), ("median_us", 1e-3), ("median", 1.0), ("ms", 1.0)):
                if key in total:
                    return float(total[key]) * scale
        return float(total) if isinstance(total, (int, float)) else None
    to_ms = {"s": 1e3, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}
    unit = None
    num = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"
    for line in text.splitlines():
        m = re.search(r"median\s*\((s|ms|us|µs|ns)\)", line)
        if m:
            unit = m.group(1)
        if re.match(r"\s*total\b", line, re.I):
            rest = re.sub(r"^\s*total\s*(\([^)]*\))?", "", line, flags=re.I)
            m = re.search(num + r"\s*(ms|us|µs|ns|s)\b", rest)
            if m:
                return float(m.group(1)) * to_ms[m.group(2)]
            m = re.search(num, rest)
            if m and unit:
                return float(m.group(1)) * to_ms[unit]
    return None


class SmeltCpu:
    """smelt's CPU backend through the command line.  bench_error says why
    `smelt bench` cannot run (None when it can); compile and run are tried
    regardless, so the output check works as soon as they do."""

    def __init__(self, smelt, threads, warmup, iters):
        self.smelt, self.threads, self.warmup, self.iters = smelt, threads, warmup, iters
        proc = run_cmd([smelt, "bench", "--help"])
        self.bench_error = None if proc.returncode == 0 else "smelt bench: " + first_error(proc)
        self.json = "--json" in proc.stdout

    def prepare(self, wl, out_name, tmp, inputs):
        """Compiles the bundle and runs it once on the inputs: (bundle or
        None, output or None, why what is missing is)."""
        bundle = os.path.join(tmp, wl.id + ".smelt")
        dims = [a for k, v in wl.dims.items() for a in ("--dim", f"{k}={v}")]
        proc = run_cmd([self.smelt, "compile", wl.yaml, "-o", bundle, "--target", "cpu"] + dims)
        if proc.returncode != 0:
            return None, None, "smelt compile --target cpu: " + first_error(proc)
        cmd = [self.smelt, "run", bundle, "--device", "cpu", "--output", f"{out_name}={npy(tmp, 'smelt_out')}"]
        for name in inputs:
            cmd += ["--input", f"{name}={npy(tmp, 'in_' + name)}"]
        proc = run_cmd(cmd)
        if proc.returncode != 0:
            return bundle, None, "smelt run --device cpu: " + first_error(proc)
        return bundle, np.load(npy(tmp, "smelt_out")), ""

    def time(self, bundle):
        """(median ms of `smelt bench`'s whole run, or None and why)."""
        if self.bench_error:
            return None, self.bench_error
        cmd = [self.smelt, "bench", bundle, "--device", "cpu", "--threads", str(self.threads),
               "--iters", str(self.iters), "--warmup", str(self.warmup)] + (["--json"] if self.json else [])
        proc = run_cmd(cmd)
        if proc.returncode != 0:
            return None, "smelt bench: " + first_error(proc)
        ms = parse_bench_total(proc.stdout)
        return ms, "" if ms is not None else "smelt bench: no total time found in its output"


def smelt_reference(smelt, wl, model, tmp, inputs):
    """Runs the reference interpreter; returns (output y, {param: array})."""
    cmd = [smelt, "run", wl.yaml, "--device", "ref"]
    for k, v in wl.dims.items():
        cmd += ["--dim", f"{k}={v}"]
    for name in inputs:
        cmd += ["--input", f"{name}={npy(tmp, 'in_' + name)}"]
    out = model.outputs[0]
    cmd += ["--output", f"{out}={npy(tmp, 'ref_' + out)}"]
    for p in model.params:
        cmd += ["--output", f"{p}={npy(tmp, 'param_' + p)}"]
    proc = run_cmd(cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(shlex.quote, cmd))}\n{proc.stderr.strip()[-2000:]}")
    return np.load(npy(tmp, "ref_" + out)), {p: np.load(npy(tmp, "param_" + p)) for p in model.params}


# --------------------------------------------------------------------- ORT

def ort_runner(proto, inputs, output_shape, threads):
    """A no-argument call that runs the session with bound I/O, and the
    array the output lands in."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    for name, arr in inputs.items():
        io.bind_cpu_input(name, np.ascontiguousarray(arr))
    out_name = sess.get_outputs()[0].name
    result = np.empty(output_shape, dtype=np.float32)
    io.bind_ortvalue_output(out_name, ort.OrtValue.ortvalue_from_numpy(result))
    return (lambda: sess.run_with_iobinding(io)), result


# -------------------------------------------------------------------- main

def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def print_table(head, rows):
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def default_smelt():
    for d in ("build", "build-bench", "build-lead"):
        p = os.path.join(ROOT, d, "smelt")
        if os.access(p, os.X_OK):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description="smelt CPU benchmark against ONNX Runtime and numpy")
    ap.add_argument("--smelt", default=os.environ.get("SMELT") or default_smelt(), help="the smelt binary")
    ap.add_argument("--threads", type=int, default=2, help="threads for smelt, ORT, BLAS and torch")
    ap.add_argument("--only", help="comma-separated workload ids (default: all)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20, help="at least this many timed calls")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="and at least this long in all, per peer")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best round's median counts")
    ap.add_argument("--keep", help="keep inputs, weights, ONNX files and bundles in this directory")
    ap.add_argument("--smelt-base", help="a second smelt binary (an earlier build), timed in the same rounds: "
                    "adds a `base ms` column and base/smelt")
    args = ap.parse_args()
    if not args.smelt or not os.access(args.smelt, os.X_OK):
        print("no smelt binary: build it (cmake) and pass --smelt PATH")
        return 2
    args.smelt = os.path.abspath(args.smelt)
    chosen = WORKLOADS
    if args.only:
        want = args.only.split(",")
        chosen = [w for w in WORKLOADS if w.id in want]
        unknown = set(want) - {w.id for w in chosen}
        if unknown:
            print("unknown workload(s): " + ", ".join(sorted(unknown)) + "; known: "
                  + ", ".join(w.id for w in WORKLOADS))
            return 2
    if not os.path.exists(os.path.join(EX, "tiny_llama.safetensors")):
        subprocess.run([sys.executable, os.path.join(EX, "gen_weights.py")], check=True)

    import onnx
    import onnxruntime
    import onnx_export
    try:
        import torch_peer
        torch_note = "torch " + torch_peer.setup(args.threads)
    except ImportError:
        torch_peer, torch_note = None, "torch: not installed (pip install torch), peer skipped"

    bw1, bw = copy_bandwidth(1), copy_bandwidth(args.threads)
    rev = run_cmd(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).stdout.strip() or "?"
    print(f"# smelt CPU benchmark, {run_cmd(['date']).stdout.strip()}")
    print(f"machine: {machine()}; threads: {args.threads}; load average at start: {os.getloadavg()[0]:.2f}"
          " (other work on the machine skews every column)")
    print(f"copy bandwidth (numpy copy of 256 MiB, best of 5, read+write bytes): {bw:.1f} GB/s with "
          f"{args.threads} threads (the %bw denominator), {bw1:.1f} GB/s with 1")
    print(f"smelt {args.smelt} (git {rev}); onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}"
          f" (opset {onnx_export.OPSET}); numpy {np.__version__}; {torch_note}")
    print(f"command: {' '.join(map(shlex.quote, [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]))}")
    print()
    sys.stdout.flush()

    scpu = SmeltCpu(args.smelt, args.threads, args.warmup, args.iters)
    sbase = None
    if args.smelt_base:
        sbase = SmeltCpu(os.path.abspath(args.smelt_base), args.threads, args.warmup, args.iters)
        print(f"base: smelt {sbase.smelt} (timed in the same rounds: `base ms`, base/smelt > 1 = faster now)")
    timing, checks, notes, failed, tcols = [], [], {}, False, []
    for wl in chosen:
        model = yaml_model.load(wl.yaml, wl.dims)
        nbytes, flops = model.compulsory_bytes(), model.flops()
        ctx = None
        if args.keep:
            tmp = os.path.join(args.keep, wl.id)
            os.makedirs(tmp, exist_ok=True)
        else:
            ctx = tempfile.TemporaryDirectory(prefix=f"smelt-bench-{wl.id}-")
            tmp = ctx.name
        try:
            errs = {}
            inputs = make_inputs(model, wl.id)
            for name, arr in inputs.items():
                np.save(npy(tmp, "in_" + name), arr)
            want, params = smelt_reference(args.smelt, wl, model, tmp, inputs)

            proto = onnx_export.export(model, params)
            if args.keep:
                onnx.save(proto, os.path.join(tmp, wl.id + ".onnx"))
            ort_call, ort_out = ort_runner(proto, inputs, want.shape, args.threads)
            ort_call()
            ort_err = rel_l2(ort_out, want)
            np_err = rel_l2(wl.numpy_fn(inputs, params), want)
            peers = {"ORT": ort_call, "numpy": lambda: wl.numpy_fn(inputs, params)}
            if torch_peer:
                for tname, call in torch_peer.runners(model, params, inputs).items():
                    errs[tname] = rel_l2(call(), want)
                    peers[tname] = call
            bundle, s_out, why = scpu.prepare(wl, model.outputs[0], tmp, inputs)
            s_err = None if s_out is None else rel_l2(s_out, want)
            b_bundle = None
            if sbase:
                btmp = os.path.join(tmp, "base")
                os.makedirs(btmp, exist_ok=True)
                for name, arr in inputs.items():
                    np.save(npy(btmp, "in_" + name), arr)
                b_bundle, b_out, bwhy = sbase.prepare(wl, model.outputs[0], btmp, inputs)
                if b_out is not None and rel_l2(b_out, want) > EXPORT_TOLERANCE:
                    bwhy = f"base output off by {rel_l2(b_out, want):.1e}"
                if bwhy:
                    notes.setdefault("base: " + bwhy, []).append(wl.id)

            # Rounds interleave the peers, and each keeps its best round's
            # median, so a burst of other work on the machine hits one
            # round of one peer rather than the whole column.
            best = {}
            for _ in range(args.rounds):
                for pname, call in peers.items():
                    slow = pname == "numpy"  # float64 examples: a few calls suffice
                    ms = time_calls(call, 1 if slow else args.warmup, 3 if slow else args.iters,
                                    args.min_seconds / args.rounds)
                    best[pname] = min(best.get(pname, ms), ms)
                if bundle:
                    ms, twhy = scpu.time(bundle)
                    if ms is not None:
                        best["smelt"] = min(best.get("smelt", ms), ms)
                    elif twhy not in why:
                        why = "; ".join(filter(None, [why, twhy]))
                if b_bundle:
                    ms, _ = sbase.time(b_bundle)
                    if ms is not None:
                        best["base"] = min(best.get("base", ms), ms)
            if why:
                notes.setdefault(why, []).append(wl.id)
        finally:
            if ctx:
                ctx.cleanup()

        ok = ort_err <= EXPORT_TOLERANCE and np_err <= NUMPY_TOLERANCE and (s_err is None or s_err <= EXPORT_TOLERANCE)
        failed |= not ok
        s_ms, ort_ms = best.get("smelt"), best["ORT"]
        tcols = [t for t in peers if t.startswith("torch")]
        row = [wl.id, fmt(s_ms, ".3f"), f"{ort_ms:.3f}", f"{best['numpy']:.3f}"]
        row += [f"{best[t]:.3f}" for t in tcols]
        if sbase:
            b_ms = best.get("base")
            row += [fmt(b_ms, ".3f"), fmt(b_ms / s_ms if b_ms and s_ms else None, ".2f")]
        row += [fmt(ort_ms / s_ms if s_ms else None, ".2f")]
        row += [fmt(best[t] / s_ms if s_ms else None, ".2f") for t in tcols]
        row += [
                fmt(nbytes / s_ms / 1e6 if s_ms else None, ".1f"),
                fmt(flops / s_ms / 1e6 if s_ms else None, ".1f"),
                fmt(100 * nbytes / s_ms / 1e6 / bw if s_ms else None, ".0f"),
                f"{nbytes / ort_ms / 1e6:.1f}", f"{flops / ort_ms / 1e6:.1f}", f"{100 * nbytes / ort_ms / 1e6 / bw:.0f}"]
        timing.append(row)
        checks.append([wl.id, wl.what, f"{nbytes / 1e6:.3f}", f"{flops / 1e6:.1f}", f"{ort_err:.1e}",
                       f"{np_err:.1e}"] + [f"{errs[t]:.1e}" for t in tcols]
                      + [fmt(s_err, ".1e"), "ok" if ok else "FAIL"])
        print(f"  {wl.id}: done", file=sys.stderr)

    print("## times (median ms) and smelt's roofline")
    print_table(["workload", "smelt ms", "ORT ms", "numpy ms"] + [f"{t} ms" for t in tcols]
                + (["base ms", "base/smelt"] if sbase else [])
                + ["ORT/smelt"] + [f"{t}/smelt" for t in tcols] + ["smelt GB/s", "smelt GFLOP/s", "smelt %bw", "ORT GB/s", "ORT GFLOP/s", "ORT %bw"],
                timing)
    print()
    print(f"## checks: relative L2 error against `smelt run --device ref` (<= {EXPORT_TOLERANCE:g})")
    print_table(["workload", "what", "MB moved", "MFLOP", "ORT (onnx_export)", "numpy"] + tcols
                + ["smelt cpu", "result"], checks)
    if notes:
        print()
        print("smelt n/a:")
        for why, ids in notes.items():
            print(f"  {', '.join(ids)}: {why}")
    print()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("numpy: examples run tests/e2e/reference.py as written (float64, a sanity baseline, not a "
          "speed target); W1, W2 and matmul run its operators on float32 arrays.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
