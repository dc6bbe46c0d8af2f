#!/usr/bin/env python3
"""Every committed ONNX model (tests/onnx/models/*.onnx, made by
make_models.py from random-weight torch / transformers / torchvision models)
run by smelt and compared with ONNX Runtime on the same inputs.

For each model: `smelt run MODEL.onnx --device cpu` and `--device ref`
against ONNX Runtime (f32 rel L2 <= 1e-5), then `smelt import` to YAML plus
safetensors and `smelt run` of that YAML on the CPU, which must match the
direct run.  The transformer models also run with `--dim sequence=...`
different from the export's size, and `--print-ir-after=fuse-attention`
must find every layer's attention.  Each model is also compiled for CUDA
with NVRTC in f32 and f16, and where a GPU is, run there and compared with
ORT (f32 rel L2 <= 1e-5, f16 cosine >= 0.999).

Needs numpy.  ONNX Runtime's outputs are also committed, with the inputs
they were computed on (tests/onnx/refs/MODEL[.seqN].npz, written by
`--write-refs`, which needs onnxruntime): without onnxruntime (CI) every
model is compared with those; with it, with a live session, and the stored
outputs must equal the live ones.  The imported MLP is also recomputed in
numpy from the safetensors file `smelt import` wrote.
"""
import argparse
import glob
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-5
SEQ = {"bert": 8, "gpt2": 8, "llama": 8}  # export size; also run at ALT_SEQ
ALT_SEQ = 5
# Known failures outside the importer, reported as XFAIL (and XPASS once fixed).
# (mobilenetv2 on the CPU was one until the fuser stopped building groups
# the lowering refuses, issue 16 finding 4.)
KNOWN = {}
REFS = os.path.join(HERE, "refs")
LAYERS = 2  # the transformer models' layer count (make_models.py)
# SMELT_ONNX_CUDA_ONLY=1 (scripts/gpu-verify.sh, on a GPU machine whose smelt
# has no CPU backend): only --device ref and the CUDA runs
CUDA_ONLY = os.environ.get("SMELT_ONNX_CUDA_ONLY") == "1"


def smelt_cmd(smelt, args, timeout=600):
    return subprocess.run([smelt] + args, capture_output=True, text=True, timeout=timeout)


def crashed(r):
    return r.returncode < 0 or "AddressSanitizer" in r.stderr or "runtime error" in r.stderr


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_inputs(family, sess, seq):
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else seq for d in i.shape]
        if "int64" in i.type:
            if i.name == "attention_mask":
                v = np.ones(shape, np.int64)
                v[-1, -2:] = 0  # padding in the last sequence
            elif i.name == "token_type_ids":
                v = np.zeros(shape, np.int64)
                v[..., shape[-1] // 2:] = 1
            else:
                v = rng.integers(0, 100, shape).astype(np.int64)
        else:
            v = rng.standard_normal(shape).astype(np.float32)
        feeds[i.name] = v
    return feeds


def run_smelt(smelt, model, feeds, outs, device, tmp, extra=()):
    args = ["run", model, "--device", device] + list(extra)
    for k, v in feeds.items():
        p = os.path.join(tmp, f"in_{abs(hash(k))}.npy")
        np.save(p, v)
        args += ["--input", f"{k}={p}"]
    paths = {}
    for o in outs:
        p = os.path.join(tmp, f"out_{abs(hash(o))}_{device}.npy")
        paths[o] = p
        args += ["--output", f"{o}={p}"]
    r = smelt_cmd(smelt, args)
    if r.returncode != 0 or crashed(r):
        return None, r.stderr.strip()[-800:]
    return {o: np.load(p) for o, p in paths.items()}, None


def check_model(smelt, path, ort, tmp, failures, report, write_refs=False):
    base = os.path.basename(path)
    family = base.split(".")[0]
    seqs = [SEQ[family], ALT_SEQ] if family in SEQ else [None]
    for seq in seqs:
        dims = ["--dim", f"sequence={seq}"] if seq else []
        label = f"{base}" + (f" sequence={seq}" if seq else "")
        ref_path = os.path.join(REFS, base.replace(".onnx", "") + (f".seq{seq}" if seq else "") + ".npz")
        stored = None
        if os.path.exists(ref_path):
            with np.load(ref_path) as z:
                stored = {k: z[k] for k in z.files}
        if ort is not None:
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            feeds = make_inputs(family, sess, seq)
            outs = [o.name for o in sess.get_outputs()]
            want = dict(zip(outs, sess.run(None, feeds)))
            if write_refs:
                os.makedirs(REFS, exist_ok=True)
                np.savez_compressed(ref_path, **{"in." + k: v for k, v in feeds.items()},
                                    **{"out." + k: v for k, v in want.items()})
            elif stored is None:
                failures.append(f"{label}: no stored ORT outputs {ref_path} (write them with --write-refs)")
            else:
                same = all(np.array_equal(stored.get("in." + k), v) for k, v in feeds.items())
                e = max(rel_l2(stored["out." + o], want[o]) if "out." + o in stored else float("inf") for o in outs)
                report.append(f"{label:38s} the stored ORT outputs vs live ORT: inputs {'equal' if same else 'DIFFER'}, "
                              f"rel L2 {e:.1e}")
                if not (same and e <= 1e-6):
                    failures.append(f"{label}: {ref_path} is stale (inputs equal: {same}, rel L2 {e:.3e}); "
                                    "write it again with --write-refs")
        elif stored is None:
            failures.append(f"{label}: onnxruntime is not installed and there are no stored ORT outputs {ref_path}")
            continue
        else:
            feeds = {k[3:]: v for k, v in stored.items() if k.startswith("in.")}
            want = {k[4:]: v for k, v in stored.items() if k.startswith("out.")}
            outs = list(want)
        for dev in ("ref",) if CUDA_ONLY else ("cpu", "ref"):
            got, err = run_smelt(smelt, path, feeds, outs, dev, tmp, dims)
            known = KNOWN.get((family, dev))
            if got is None and known:
                report.append(f"{label:38s} {dev:4s} XFAIL: {known}")
                continue
            if got is None:
                failures.append(f"{label} --device {dev}: {err}")
                continue
            e = max(rel_l2(got[o], want[o]) for o in outs)
            report.append(f"{label:38s} {dev:4s} rel L2 vs ORT {e:.2e}" + ("" if ort else " (stored)"))
            if not e <= TOL:
                failures.append(f"{label} --device {dev}: rel L2 {e:.3e} > {TOL}")
        if seq not in (None, SEQ.get(family)):
            continue
        check_cuda(smelt, path, label, dims, feeds, outs, want, tmp, failures, report)
        if CUDA_ONLY:
            continue
        # import to YAML and run that: same numbers as the direct run
        yml = os.path.join(tmp, base.replace(".onnx", ".yaml"))
        r = smelt_cmd(smelt, ["import", path, "-o", yml] + dims)
        if r.returncode != 0:
            failures.append(f"{label}: smelt import exited {r.returncode}: {r.stderr[-800:]}")
            continue
        got, err = run_smelt(smelt, yml, feeds, outs, "cpu", tmp)
        if got is None and KNOWN.get((family, "cpu")):
            report.append(f"{label:38s} yaml XFAIL (imported; see cpu above)")
            continue
        if got is None:
            failures.append(f"{label}: run of the imported YAML: {err}")
            continue
        e = max(rel_l2(got[o], want[o]) for o in outs)
        report.append(f"{label:38s} yaml rel L2 vs ORT {e:.2e}")
        if not e <= TOL:
            failures.append(f"{label} imported YAML: rel L2 {e:.3e} > {TOL}")


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


def check_cuda(smelt, path, label, dims, feeds, outs, want, tmp, failures, report, dtypes=("f32", "f16")):
    """The CUDA path: compiled with NVRTC in f32 and f16 everywhere (no GPU
    needed); run and compared with ORT where a GPU is (f32: rel L2 <= 1e-5;
    f16, inputs rounded to f16: cosine >= 0.999).  Without NVRTC the part
    is skipped and says so (SMELT_TEST_REQUIRE=nvrtc: a failure)."""
    for dt in dtypes:
        bundle = os.path.join(tmp, f"{os.path.basename(path)}.{dt}.cuda.smelt")
        r = smelt_cmd(smelt, ["compile", path, "--target", "cuda", "--dtype", dt, "-o", bundle] + dims)
        if r.returncode != 0 and "NVRTC" in r.stderr and not crashed(r):
            report.append(f"{label:38s} cuda SKIP: NVRTC not available")
            if "nvrtc" in os.environ.get("SMELT_TEST_REQUIRE", "").split(","):
                failures.append(f"{label}: NVRTC not available (SMELT_TEST_REQUIRE=nvrtc): {r.stderr[-300:]}")
            return
        if r.returncode != 0 or crashed(r):
            failures.append(f"{label}: compile --target cuda --dtype {dt} exited {r.returncode}: {r.stderr[-800:]}")
            continue
        ins = {k: (v.astype(np.float16) if dt == "f16" and v.dtype == np.float32 else v) for k, v in feeds.items()}
        got, err = run_smelt(smelt, bundle, ins, outs, "cuda", tmp)
        if got is None and ("no CUDA driver" in err or "no CUDA device" in err):
            report.append(f"{label:38s} cuda {dt}: compiled (NVRTC); not run: no GPU here")
            continue
        if got is None:
            failures.append(f"{label} --device cuda ({dt}): {err}")
            continue
        if dt == "f32":
            e = max(rel_l2(got[o], want[o]) for o in outs)
            report.append(f"{label:38s} cuda f32 rel L2 vs ORT {e:.2e}")
            if not e <= TOL:
                failures.append(f"{label} --device cuda f32: rel L2 {e:.3e} > {TOL}")
        else:
            c = min(cosine(got[o], want[o]) for o in outs)
            report.append(f"{label:38s} cuda f16 cosine vs ORT f32 {c:.6f}")
            if not c >= 0.999:
                failures.append(f"{label} --device cuda f16: cosine {c:.6f} < 0.999")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": np.float32, "I64": np.int64, "F16": np.float16, "BOOL": np.bool_}
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dt[v["dtype"]]).reshape(v["shape"])
    return out


def check_mlp_numpy(smelt, tmp, failures, report):
    """numpy only: the imported MLP's weights, recomputed in numpy."""
    from math import erf
    path = os.path.join(HERE, "models", "mlp.ts17.onnx")
    yml = os.path.join(tmp, "mlp_np.yaml")
    r = smelt_cmd(smelt, ["import", path, "-o", yml])
    if r.returncode != 0:
        failures.append(f"mlp import: {r.stderr[-500:]}")
        return
    w = read_safetensors(yml.replace(".yaml", ".safetensors"))
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    got, err = run_smelt(smelt, path, {"x": x}, ["y"], "cpu", tmp)
    if got is None:
        failures.append(f"mlp numpy check: {err}")
        return
    h = np.maximum(x @ w["l1.weight"].T + w["l1.bias"], 0).astype(np.float64)
    h = h @ w["l2.weight"].T + w["l2.bias"]
    h = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))
    z = h @ w["l3.weight"].T + w["l3.bias"]
    z = z - z.max(-1, keepdims=True)
    want = z - np.log(np.exp(z).sum(-1, keepdims=True))
    e = rel_l2(got["y"], want)
    report.append(f"{'mlp.ts17.onnx (numpy from safetensors)':38s} cpu  rel L2 {e:.2e}")
    if not e <= TOL:
        failures.append(f"mlp vs numpy: rel L2 {e:.3e}")


def check_attention_found(smelt, failures, report):
    for path in sorted(glob.glob(os.path.join(HERE, "models", "*.onnx"))):
        fam = os.path.basename(path).split(".")[0]
        if fam not in ("bert", "gpt2", "llama", "vit"):
            continue
        args = ["compile", path, "-o", os.devnull, "--print-ir-after=fuse-attention"]
        if CUDA_ONLY:
            args += ["--target", "cuda"]
        if fam in SEQ:
            args += ["--dim", f"sequence={SEQ[fam]}"]
        r = smelt_cmd(smelt, args)
        n = len(re.findall(r"= attention\(", r.stderr))
        report.append(f"{os.path.basename(path):38s} fuse-attention: {n} attention op(s)")
        if n != LAYERS:  # every layer's attention is found (make_models.py: 2 layers each)
            failures.append(f"{path}: fuse-attention found {n} attention op(s), want one per layer ({LAYERS})")
        if r.returncode != 0:
            failures.append(f"{path}: compile --print-ir-after=fuse-attention exited {r.returncode}: {r.stderr[-500:]}")


def check_edge_ops(smelt, tmp, failures, report):
    """edge/edge_ops.onnx (make_edge.py): Softplus at |x| up to 100 against
    numpy's logaddexp (no overflow to inf), LessOrEqual/GreaterOrEqual
    false where an operand is NaN, as ONNX and numpy say, and IsNaN and IsInf
    (both signs, and positive only) as numpy's isnan/isinf/isposinf."""
    path = os.path.join(HERE, "edge", "edge_ops.onnx")
    x = np.array([-100, -20, -1, 0, 0.5, 20, 88, 100], np.float32)
    a = np.array([1, 2, np.nan, 3, np.nan, -1], np.float32)
    b = np.array([1, 1, 0, 4, np.nan, -2], np.float32)
    c = np.array([np.inf, -np.inf, 1, np.nan, -3], np.float32)
    want_sp = np.logaddexp(0, x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        want_le, want_ge = a <= b, a >= b
    want_b = {"nan": np.isnan(a), "inf": np.isinf(c), "pinf": np.isposinf(c)}
    for dev in ("cpu", "ref"):
        got, err = run_smelt(smelt, path, {"x": x, "a": a, "b": b, "c": c}, ["sp", "le", "ge", "nan", "inf", "pinf"],
                             dev, tmp)
        if got is None:
            failures.append(f"edge_ops --device {dev}: {err}")
            continue
        # within f32 rounding of log(1 + y) (no log1p op): 1e-6 relative or 1e-7 absolute
        e = float(np.max(np.abs(got["sp"] - want_sp) / (1e-6 * np.abs(want_sp) + 1e-7)))
        ok = e <= 1 and np.array_equal(got["le"], want_le) and np.array_equal(got["ge"], want_ge) and all(
            np.array_equal(got[k], w) for k, w in want_b.items())
        report.append(f"{'edge_ops.onnx':38s} {dev:4s} Softplus error/bound {e:.2f}, <=/>=/IsNaN/IsInf "
                      f"{'as numpy' if ok else 'WRONG'}")
        if not ok:
            failures.append(f"edge_ops --device {dev}: softplus {got['sp']} (want {want_sp}), le {got['le']} "
                            f"(want {want_le}), ge {got['ge']} (want {want_ge}), "
                            + ", ".join(f"{k} {got[k]} (want {w})" for k, w in want_b.items()))


def check_quant(smelt, tmp, failures, report):
    """quant/*.onnx (make_quant.py): MatMul over a DequantizeLinear'd
    weight, int8/uint8/int4/uint4/float8, per tensor, per axis and blocked,
    and com.microsoft MatMulNBits (4 and 8 bits, zero points packed, float
    or absent, a bias), against ONNX Runtime's stored output (computed without graph
    optimisations: exact); the compiled bundle must keep the weight in its
    quantised dtype, dequantized inside the matmul's kernel."""
    for path in sorted(glob.glob(os.path.join(HERE, "quant", "*.onnx"))):
        label = os.path.basename(path)
        with np.load(path[:-5] + ".npz") as z:
            feeds, want = {"x": z["in.x"]}, {"y": z["out.y"]}
        for dev in ("ref",) if CUDA_ONLY else ("cpu", "ref"):
            got, err = run_smelt(smelt, path, feeds, ["y"], dev, tmp)
            if got is None:
                failures.append(f"{label} --device {dev}: {err}")
                continue
            e = rel_l2(got["y"], want["y"])
            report.append(f"{label:38s} {dev:4s} rel L2 vs ORT {e:.2e} (stored)")
            if not e <= TOL:
                failures.append(f"{label} --device {dev}: rel L2 {e:.3e} > {TOL}")
        if not CUDA_ONLY:
            bundle = os.path.join(tmp, label + ".smelt")
            r = smelt_cmd(smelt, ["compile", path, "-o", bundle])
            ir = smelt_cmd(smelt, ["inspect", bundle, "--ir"]).stdout if r.returncode == 0 else ""
            q = re.search(r"const ([\w.]+): (i8|u8|i4|u4|f8e4m3|f8e5m2)\[", ir)
            kept = q and "dequantize(" + q.group(1) in ir
            report.append(f"{label:38s} weight kept quantised: {'yes' if kept else 'NO'}")
            if not kept:
                failures.append(f"{label}: the compiled weight is not quantised any more: {ir[-600:]} {r.stderr[-300:]}")
            # smelt import writes the quantised weights (I4/U4/F8 too) into its safetensors file
            yml = os.path.join(tmp, label[:-5] + ".yaml")
            r = smelt_cmd(smelt, ["import", path, "-o", yml])
            got, err = run_smelt(smelt, yml, feeds, ["y"], "cpu", tmp) if r.returncode == 0 else (None, r.stderr[-500:])
            e = rel_l2(got["y"], want["y"]) if got is not None else float("nan")
            report.append(f"{label:38s} import + run cpu rel L2 vs ORT {e:.2e}")
            if not e <= TOL:
                failures.append(f"{label}: smelt import, then run: {err or f'rel L2 {e:.3e}'}")
        check_cuda(smelt, path, label, [], feeds, ["y"], want, tmp, failures, report)


# ops/*.onnx whose results jump (rounding, fmod, the order of equal
# values): f16 inputs may land on the other side of a step, so their CUDA
# check is f32 only
STEP_OPS = ("rounding", "mod_fmod", "topk")


def check_ops(smelt, tmp, failures, report):
    """ops/*.onnx (make_ops.py): one model per ONNX operator that the
    importer builds from smelt's ops, against ONNX Runtime's stored outputs
    (computed without graph optimisations), on the CPU and the reference
    interpreter: floats within rel L2 1e-5, integers (TopK's indices)
    exactly; and on CUDA (compiled with NVRTC here, run where a GPU is)."""
    for path in sorted(glob.glob(os.path.join(HERE, "ops", "*.onnx"))):
        label = os.path.basename(path)
        with np.load(path[:-5] + ".npz") as z:
            feeds = {k[3:]: z[k] for k in z.files if k.startswith("in.")}
            want = {k[4:]: z[k] for k in z.files if k.startswith("out.")}
        outs = sorted(want)
        for dev in ("ref",) if CUDA_ONLY else ("cpu", "ref"):
            got, err = run_smelt(smelt, path, feeds, outs, dev, tmp)
            if got is None:
                failures.append(f"{label} --device {dev}: {err}")
                continue
            bad = []
            for o in outs:
                if want[o].dtype.kind in "iub":
                    if got[o].shape != want[o].shape or not np.array_equal(got[o], want[o]):
                        bad.append(f"{o}: {got[o].ravel()[:8]} want {want[o].ravel()[:8]}")
                elif not rel_l2(got[o], want[o]) <= TOL:
                    bad.append(f"{o}: rel L2 {rel_l2(got[o], want[o]):.3e}")
            e = max((rel_l2(got[o], want[o]) for o in outs if want[o].dtype.kind == "f"), default=0.0)
            report.append(f"{label:38s} {dev:4s} rel L2 vs ORT {e:.2e} (stored){', integers exact' if len(bad) == 0 and any(want[o].dtype.kind in 'iub' for o in outs) else ''}")
            if bad:
                failures.append(f"{label} --device {dev}: " + "; ".join(bad))
        floats = [o for o in outs if want[o].dtype.kind == "f"] or outs  # an all-integer model: its integers
        check_cuda(smelt, path, label, [], feeds, floats, want, tmp, failures, report,
                   ("f32",) if label[:-5] in STEP_OPS else ("f32", "f16"))


def check_bench(smelt, failures, report):
    """smelt bench takes an ONNX file as it takes YAML, with valid random
    ids for the embeddings (token types: 2 rows) and --check."""
    path = os.path.join(HERE, "models", "bert.ts17.onnx")
    r = smelt_cmd(smelt, ["bench", path, "--dim", "sequence=8", "--threads", "1", "--iters", "2", "--warmup", "0",
                          "--check", "--json"])
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        rep = {}
    ok = r.returncode == 0 and rep.get("check", {}).get("pass") is True and rep.get("kernels")
    report.append(f"{'bert.ts17.onnx':38s} smelt bench --check: {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append(f"smelt bench {path} --check exited {r.returncode}: {r.stdout[-300:]} {r.stderr[-500:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--write-refs", action="store_true", help="write tests/onnx/refs from ONNX Runtime")
    a = ap.parse_args()
    r = smelt_cmd(a.smelt, ["import", os.path.join(HERE, "models", "mlp.ts17.onnx"), "-o", "/nonexistent/x.yaml"])
    if "built without ONNX support" in r.stderr:
        print("SKIP: smelt was built without ONNX support (install libprotobuf-c-dev protobuf-c-compiler)")
        return 77  # 77: skipped as a whole (ctest's SKIP_RETURN_CODE)
    try:
        import onnxruntime as ort
        ort.set_default_logger_severity(3)
    except ImportError:
        ort = None
        if a.write_refs:
            print("error: --write-refs needs onnxruntime (pip install onnxruntime)")
            return 2
        print("onnxruntime is not installed: every model is compared with ONNX Runtime's stored outputs "
              "(tests/onnx/refs)")
    failures, report = [], []
    models = sorted(glob.glob(os.path.join(HERE, "models", "*.onnx")))
    with tempfile.TemporaryDirectory() as tmp:
        if not CUDA_ONLY:
            check_mlp_numpy(a.smelt, tmp, failures, report)
        for m in models:
            check_model(a.smelt, m, ort, tmp, failures, report, a.write_refs)
        check_attention_found(a.smelt, failures, report)
        check_quant(a.smelt, tmp, failures, report)
        check_ops(a.smelt, tmp, failures, report)
        if not CUDA_ONLY:
            check_bench(a.smelt, failures, report)
            check_edge_ops(a.smelt, tmp, failures, report)
    print("\n".join(report))
    for f in failures:
        print("FAIL:", f)
    print(f"{len(models)} models: {'FAIL' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
