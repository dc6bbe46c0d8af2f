#!/usr/bin/env python3
"""Imported real models on the CPU (issue 11): BERT-base, ResNet-50 and
ViT-B/16 exported from transformers and torchvision, run by smelt straight
from the .onnx file and by its peers, side by side in one run.

A benchmark, not a test: CI never runs it (it needs torch, torchvision,
transformers and onnxruntime: pip install torch torchvision transformers
onnx onnxruntime).

  1. The models are built with random weights (seeded), in eval mode:
     BERT-base (transformers BertModel with BertConfig's defaults: 12
     layers, hidden 768, 12 heads) at batch 1, sequence --seq (128), with an
     all-ones attention mask; ResNet-50 and ViT-B/16 (torchvision,
     weights=None; --only vit) at batch 1, 224x224.  Each is exported
     with torch.onnx.export's TorchScript exporter at opset 17 (static shapes), into --keep DIR or a temporary
     directory (an existing file there is reused).
  2. ONNX Runtime (CPUExecutionProvider, --threads intra-op threads, all
     graph optimisations, I/O bound once with IOBinding) gives the reference
     output.  PyTorch eager and torch.compile (inductor) run the same module
     under torch.inference_mode with torch.set_num_threads(--threads).
  3. smelt compiles the .onnx for the CPU (`smelt compile M.onnx --target
     cpu`), `smelt run BUNDLE --device cpu` computes the output
     on the same inputs for the check (relative L2 against ORT), and
     `smelt bench BUNDLE --threads N --json` times the whole run.

Times are medians of repeated calls after warm-up; every peer is timed in
--rounds interleaved rounds and keeps its best round, so a burst of other
work on a shared machine does not land on one column.  The header prints
the load average: run it on a quiet machine.

With --device cuda (the GPU machine) the peers are PyTorch eager and
torch.compile on the GPU (TF32 off in f32), timed with a synchronize after
each call, ORT only when its CUDA provider is installed, and smelt compiles
with --target cuda (its bench replays the CUDA graph).  --dtype f16 runs
every side in f16 (the check is then against ORT's f32 output, by cosine).

Usage: onnx_models.py [--smelt PATH] [--threads 2] [--only bert,resnet,vit]
                      [--seq 128] [--rounds 3] [--keep DIR] [--no-compile]
                      [--device cpu|cuda] [--dtype f32|f16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench as cpu_bench  # noqa: E402  (sets the BLAS thread count from --threads first)

import numpy as np  # noqa: E402


def build(name, seq):
    """(module, example inputs as a dict of numpy arrays, output name)."""
    import torch
    torch.manual_seed(0)
    if name == "bert":
        from transformers import BertConfig, BertModel
        m = BertModel(BertConfig(), add_pooling_layer=False).eval()

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

        rng = np.random.default_rng(0)
        ins = {"input_ids": rng.integers(0, 30522, (1, seq)).astype(np.int64),
               "attention_mask": np.ones((1, seq), np.int64),
               "token_type_ids": np.zeros((1, seq), np.int64)}
        return Wrap().eval(), ins, "last_hidden_state"
    import torchvision
    m = (torchvision.models.vit_b_16 if name == "vit" else torchvision.models.resnet50)(weights=None).eval()
    if name == "vit":
        # torchvision starts ViT's head at zero: logits of 0 would check nothing
        torch.nn.init.normal_(m.heads.head.weight, std=0.02)
    ins = {"x": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    return m, ins, "logits"


def export(name, module, ins, out_name, path):
    import torch
    if os.path.exists(path):
        return
    args = tuple(torch.from_numpy(v) for v in ins.values())
    kw = {"dynamo": False} if "dynamo" in torch.onnx.export.__code__.co_varnames else {}
    torch.onnx.export(module, args, path, input_names=list(ins), output_names=[out_name], opset_version=17, **kw)


def bench_total_ms(text):
    """smelt bench --json's whole-run median in ms: on CUDA the graph
    replay ("total (CUDA graph replay)"), on the CPU "total (whole run)"."""
    try:
        totals = json.loads(text).get("totals", [])
    except ValueError:
        return None
    for want in ("total (CUDA graph replay)", "total (whole run)"):
        for row in totals:
            if row.get("name") == want and "median_us" in row:
                return float(row["median_us"]) * 1e-3
    return None


def ort_runner(path, ins, out_shape, threads, device):
    """A call that runs ORT with bound I/O and the array it writes; None
    on cuda without ORT's CUDA provider."""
    import onnxruntime as ort
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CUDAExecutionProvider" if device == "cuda" else
                                                     "CPUExecutionProvider"])
    io = sess.io_binding()
    for k, v in ins.items():
        io.bind_cpu_input(k, np.ascontiguousarray(v))
    result = np.empty(out_shape, np.float32)
    io.bind_ortvalue_output(sess.get_outputs()[0].name, ort.OrtValue.ortvalue_from_numpy(result))
    return (lambda: sess.run_with_iobinding(io)), result


def main():
    ap = argparse.ArgumentParser(description="BERT-base and ResNet-50 from ONNX: smelt against ORT and PyTorch")
    ap.add_argument("--smelt", default=os.environ.get("SMELT") or cpu_bench.default_smelt())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="bert,resnet")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--min-seconds", type=float, default=3.0)
    ap.add_argument("--keep", help="directory for the .onnx files, inputs and bundles (reused when present)")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (it takes minutes)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile's mode; on cuda reduce-overhead replays CUDA graphs, as smelt does")
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    tdt = torch.float16 if a.dtype == "f16" else torch.float32
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    import onnxruntime
    tmp = a.keep or tempfile.mkdtemp(prefix="smelt_onnx_bench_")
    os.makedirs(tmp, exist_ok=True)
    smelt = os.path.abspath(a.smelt)
    git = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    where = torch.cuda.get_device_name(0) if a.device == "cuda" else f"{cpu_bench.machine()}, {a.threads} threads"
    print(f"# {where}; {a.dtype}; torch.compile mode {a.compile_mode}; load average {os.getloadavg()[0]:.2f}; commit {git.strip()}; "
          f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}")
    rows, checks, bad = [], [], False
    for name in a.only.split(","):
        module, ins, out_name = build(name, a.seq)
        label = f"bert-base seq {a.seq}" if name == "bert" else "vit-b-16 224x224" if name == "vit" else "resnet-50 224x224"
        path = os.path.join(tmp, f"{name}{a.seq if name == 'bert' else ''}.onnx")
        export(name, module, ins, out_name, path)
        with torch.inference_mode():
            want_t = module(*[torch.from_numpy(v) for v in ins.values()]).numpy()
        cpu_call, cpu_out = ort_runner(path, ins, want_t.shape, a.threads, "cpu")
        cpu_call()
        want = cpu_out.copy()  # the reference: ORT on the CPU, f32
        ort_call, _ = ort_runner(path, ins, want_t.shape, a.threads, a.device)
        module = module.to(dev, tdt)
        # smelt: compile from the .onnx, run for the check, bench for the time
        bundle = os.path.join(tmp, f"{name}.smelt")
        r = cpu_bench.run_cmd([smelt, "compile", path, "--target", a.device, "--dtype", a.dtype, "-o", bundle])
        if r.returncode != 0:
            print(f"{label}: smelt compile failed: {cpu_bench.first_error(r)}")
            bad = True
            continue
        args = [smelt, "run", bundle, "--device", a.device, "--threads", str(a.threads)]
        for k, v in ins.items():
            v = v.astype(np.float16) if a.dtype == "f16" and v.dtype == np.float32 else v
            p = os.path.join(tmp, f"{name}.{k}.npy")
            np.save(p, v)
            args += ["--input", f"{k}={p}"]
        outp = os.path.join(tmp, f"{name}.out.npy")
        r = cpu_bench.run_cmd(args + ["--output", f"{out_name}={outp}"])
        got = np.load(outp) if r.returncode == 0 else None
        x = [torch.from_numpy(v).to(device=dev, dtype=tdt if v.dtype == np.float32 else None) for v in ins.values()]
        with torch.inference_mode():
            out_t = module(*x).float().cpu().numpy()
        if got is None:
            print(f"{label}: smelt run failed: {cpu_bench.first_error(r)}")
        if a.dtype == "f32":
            e_smelt = cpu_bench.rel_l2(got, want) if got is not None else float("inf")
            checks.append((label, "rel L2", f"{e_smelt:.2e}", f"{cpu_bench.rel_l2(out_t, want):.2e}"))
            bad |= not e_smelt <= 1e-4
        else:
            def cos(u, w):
                u, w = np.asarray(u, np.float64).ravel(), np.asarray(w, np.float64).ravel()
                return float(u @ w / (np.linalg.norm(u) * np.linalg.norm(w)))
            c_smelt = cos(got, want) if got is not None else 0.0
            checks.append((label, "cosine", f"{c_smelt:.6f}", f"{cos(out_t, want):.6f}"))
            bad |= not c_smelt >= 0.999
        peers = {"ort": ort_call} if ort_call else {}

        def eager():
            with torch.inference_mode():
                module(*x)
            sync()
        peers["torch eager"] = eager
        if not a.no_compile:
            compiled = torch.compile(module, mode=None if a.compile_mode == "default" else a.compile_mode)

            def comp():
                with torch.inference_mode():
                    compiled(*x)
                sync()
            comp()  # compiles here, outside the timing
            comp()  # reduce-overhead records its CUDA graph on a later call
            peers["torch.compile"] = comp
        best = {}
        for _ in range(a.rounds):
            for peer, fn in peers.items():
                t = cpu_bench.time_calls(fn, a.warmup, a.iters, a.min_seconds / a.rounds)
                best[peer] = min(best.get(peer, float("inf")), t)
            r = cpu_bench.run_cmd([smelt, "bench", bundle, "--device", a.device, "--threads", str(a.threads), "--json",
                                   "--warmup",
                                   str(a.warmup), "--iters", str(max(a.iters, 10))])
            t = bench_total_ms(r.stdout) if r.returncode == 0 else None
            if t is not None:
                best["smelt"] = min(best.get("smelt", float("inf")), t)
        s = best.get("smelt")
        rows.append([label] + [cpu_bench.fmt(best.get(p), ".2f") for p in ("smelt", "ort", "torch eager", "torch.compile")]
                    + [cpu_bench.fmt(best[p] / s if s and p in best else None, ".2f")
                       for p in ("ort", "torch eager", "torch.compile")])
    print()
    cpu_bench.print_table(["model", "smelt ms", "ORT ms", "eager ms", "compile ms", "ORT/smelt", "eager/smelt",
                           "compile/smelt"], rows)
    print()
    cpu_bench.print_table(["model", "against ORT f32 (CPU)", "smelt", "torch"], checks)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
