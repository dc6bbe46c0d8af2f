#!/usr/bin/env python3
"""Tensor parallelism on CPU ranks (smelt compile --tp N; issue 17).

For every example and N = 2 and 4:
  1. `smelt compile X.yaml --tp N --target cpu`, then `smelt run B --device
     cpu` on random inputs made here: N ranks on threads of one session,
     meeting at in-process all_reduce/all_gather;
  2. the outputs are compared with the reference interpreter's on the
     unsharded model (`smelt run X.yaml --device ref`, itself checked against
     numpy by test_examples.py): relative L2 error <= 1e-5 (f32; the ranks
     add their partial sums in another order), integer outputs equal;
  3. the split is real: the IR after the shard pass holds collectives and
     each rank's weights are its part (a [64, 64] wq is [64, 32] on rank 1
     of 2), and the KV caches of tiny_lm are stored split by kv heads.
Then tiny_lm, compiled for a ranged seq (1..4), generates 32 greedy tokens
with 1, 2 and 4 ranks (prefill and decode on the split KV cache): the same
ids.  `--tp N --target cuda` bundles hold their collectives as launches of
kind "collective" (no code: the runtime issues them through NCCL).  And bad
uses are errors: --tp 0, --tp 65, a pass list without fuse-attention, device
lists that do not parse or do not match the ranks.

With --cuda (the GPU machine: scripts/gpu-tp.sh), the same examples are
compiled with --target cuda and run on GPUs: one GPU a rank (NCCL) where the
machine has N, else every rank on cuda:0 (collectives through host memory),
against the interpreter (rel L2 <= 1e-4: the GPU's f32 sums run in other
orders), and tiny_lm's greedy ids on 1 and 2 ranks equal the CPU's.

Usage: test_tp.py --smelt PATH [--keep DIR] [--cuda]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EX = os.path.join(ROOT, "examples")

# inputs per example: name -> rng -> array
INPUTS = {
    "mlp": lambda rng: {"x": rng.standard_normal((8, 64)).astype(np.float32)},
    "gpt2_block": lambda rng: {"x": rng.standard_normal((16, 64)).astype(np.float32)},
    "cnn": lambda rng: {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)},
    "tiny_llama": lambda rng: {"x": rng.standard_normal((16, 64)).astype(np.float32),
                               "pos": np.arange(16, dtype=np.int32)},
    "tiny_lm": lambda rng: {"ids": rng.integers(0, 256, 16).astype(np.int32), "pos": np.arange(16, dtype=np.int32)},
}
OUTPUTS = {"mlp": ["y"], "gpt2_block": ["y"], "cnn": ["y"], "tiny_llama": ["y"], "tiny_lm": ["logits", "next"]}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def rel_l2(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def outputs_of(smelt, model, device, inputs, tmp, tag, outs):
    args = [smelt, "run", model, "--device", device]
    for name, arr in inputs.items():
        p = os.path.join(tmp, f"{tag}_in_{name}.npy")
        np.save(p, arr)
        args += ["--input", f"{name}={p}"]
    files = {o: os.path.join(tmp, f"{tag}_out_{o}.npy") for o in outs}
    for o, p in files.items():
        args += ["--output", f"{o}={p}"]
    r = run(args)
    if r.returncode != 0:
        check(False, f"{tag}: smelt run exited {r.returncode}: {r.stderr.strip()[-400:]}")
        return None
    return {o: np.load(p) for o, p in files.items()}


def gpu_count():
    r = run(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None
    return len([x for x in r.stdout.splitlines() if x.startswith("GPU ")]) if r and r.returncode == 0 else 0


def devices_for(n, gpus):
    """One GPU a rank where there are enough, else all on cuda:0."""
    return ",".join(f"cuda:{r if gpus >= n else 0}" for r in range(n))


def test_example(smelt, tmp, name, n, cuda=None):
    model = os.path.join(EX, f"{name}.yaml")
    target = "cuda" if cuda else "cpu"
    bundle = os.path.join(tmp, f"{name}_tp{n}_{target}.smelt")
    r = run([smelt, "compile", model, "--tp", str(n), "--target", target, "-o", bundle, "--no-cache"])
    check(r.returncode == 0, f"{name} --tp {n}: compile exited {r.returncode}: {r.stderr.strip()[-400:]}")
    if r.returncode != 0:
        return
    rng = np.random.default_rng(1000 + n)
    inputs = INPUTS[name](rng)
    ref = outputs_of(smelt, model, "ref", inputs, tmp, f"{name}_ref{n}", OUTPUTS[name])
    got = outputs_of(smelt, bundle, cuda or "cpu", inputs, tmp, f"{name}_tp{n}_{target}", OUTPUTS[name])
    if ref is None or got is None:
        return
    tol = 1e-4 if cuda else 1e-5
    where = f"{name:10s} tp{n} {cuda or 'cpu':22s}"
    for o in OUTPUTS[name]:
        a, b = got[o], ref[o]
        check(a.shape == b.shape and a.dtype == b.dtype, f"{where} {o}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        if a.shape != b.shape:
            continue
        if np.issubdtype(b.dtype, np.integer):
            check(np.array_equal(a, b), f"{where} {o}: integers differ")
            print(f"{where} {o:7s} equal: {np.array_equal(a, b)}")
        else:
            e = rel_l2(a, b)
            check(e <= tol, f"{where} {o}: rel L2 {e:.3g} > {tol}")
            print(f"{where} {o:7s} rel L2 {e:.2e}")


def test_ir(smelt, tmp):
    """The shard pass's result, printed after it: collectives and cut weights."""
    r = run([smelt, "compile", os.path.join(EX, "tiny_lm.yaml"), "--tp", "2", "--emit", "ir",
             "-o", os.path.join(tmp, "lm.ir"), "--print-ir-after=shard", "--verbose", "--no-cache"])
    check(r.returncode == 0, f"--print-ir-after=shard exited {r.returncode}: {r.stderr[-400:]}")
    err = r.stderr
    check("// ===== rank 1 of 2 =====" in err, "the IR dump names the ranks")
    check(len(re.findall(r"= all_reduce\(", err)) >= 2 * 5, "all_reduce after the row-parallel matmuls, per rank")
    check(re.search(r"layer\.0/wq/tp_part: f32\[64,32\]", err) is not None, "wq cut to [64,32] per rank")
    check(re.search(r"layer\.0/w_down/tp_part: f32\[88,64\]", err) is not None, "w_down cut by rows")
    check(re.search(r"state layer\.0/k_cache: f32\[1,1,128,16\]", err) is not None or
          re.search(r"layer\.0/k_cache: f32\[1,1,128,16\]", err) is not None, "the KV cache split by kv heads")
    check("1 embeddings by vocabulary" in err, "the embedding split by vocabulary")
    check("= all_gather(" in err, "the logits gathered for the output")


def generate_ids(smelt, tmp, n, cuda=None):
    target = "cuda" if cuda else "cpu"
    bundle = os.path.join(tmp, f"lm_gen_tp{n}_{target}.smelt")
    # one ranged specialisation (seq 1 to 4): the prompt's 3 and decode's 1
    r = run([smelt, "compile", os.path.join(EX, "tiny_lm.yaml"), "--dim", "seq=1..4", "--tp", str(n), "-o", bundle,
             "--target", target, "--no-cache"])
    check(r.returncode == 0, f"tiny_lm seq=1..4 --tp {n}: compile exited {r.returncode}: {r.stderr[-400:]}")
    dev = ["--devices", cuda] if cuda and "," in cuda else ["--device", cuda or "cpu"]
    r = run([smelt, "generate", bundle, "--prompt-ids", "1,2,3", "-n", "32", "--greedy", "--json"] + dev)
    check(r.returncode == 0, f"generate --tp {n} exited {r.returncode}: {r.stderr[-400:]}")
    if r.returncode != 0:
        return None
    out = json.loads(r.stdout.strip().splitlines()[-1])
    check(out.get("ranks") == n, f"generate --json reports its {n} ranks: {out.get('ranks')}")
    return out["ids"]


def test_generate(smelt, tmp):
    ids = {n: generate_ids(smelt, tmp, n) for n in (1, 2, 4)}
    check(ids[1] is not None and len(ids[1]) == 32, "32 ids generated on one rank")
    check(ids[1] == CPU_IDS, f"the CPU's greedy ids are the ones test_generate_cuda expects: {ids[1]}")
    for n in (2, 4):
        check(ids[n] == ids[1], f"greedy ids with {n} ranks equal one rank's: {ids[n]} vs {ids[1]}")
    print(f"tiny_lm generate: 1, 2 and 4 ranks give {ids[1][:8]}... ({'equal' if ids[2] == ids[1] == ids[4] else 'DIFFER'})")


# tiny_lm's 32 greedy ids after 1,2,3 on the CPU (test_generate checks them
# on 1, 2 and 4 CPU ranks): the GPU machine's smelt is built without LLVM
CPU_IDS = [64, 2, 50, 191, 88, 100, 245, 130, 39, 171, 171, 191, 116, 144, 90, 34, 28, 144, 90, 34, 28, 93, 234, 15,
           170, 170, 170, 170, 170, 170, 170, 170]


def test_generate_cuda(smelt, tmp, gpus):
    for n in (1, 2, 4):
        got = generate_ids(smelt, tmp, n, devices_for(n, gpus))
        check(got == CPU_IDS, f"greedy ids on {devices_for(n, gpus)} equal the CPU's: {got} vs {CPU_IDS}")
        print(f"tiny_lm generate on {devices_for(n, gpus)}: {'equal to the CPU' if got == CPU_IDS else 'DIFFERS'}")


def test_cuda_bundle(smelt, tmp):
    """--tp with --target cuda: the collectives are launches of their own kind."""
    b = os.path.join(tmp, "lm_tp2_cuda_table.smelt")
    r = run([smelt, "compile", os.path.join(EX, "tiny_lm.yaml"), "--tp", "2", "--target", "cuda", "-o", b,
             "--no-cache"])
    check(r.returncode == 0, f"tiny_lm --tp 2 --target cuda: compile exited {r.returncode}: {r.stderr[-400:]}")
    if r.returncode != 0:
        return
    d = os.path.join(tmp, "lm_tp2_cubins")
    r = run([smelt, "inspect", b, "--dump-cubins", d])
    check(r.returncode == 0, f"inspect --dump-cubins: {r.stderr[-300:]}")
    rows = [ln.split("\t") for ln in open(os.path.join(d, "kernels.tsv")).read().splitlines()[1:]] \
        if r.returncode == 0 else []
    colls = [x for x in rows if len(x) > 2 and x[2] == "collective"]
    # 2 layers x (attention out + down) all_reduces, the embedding's all_reduce, the logits' all_gather
    sums = [x for x in colls if x[-1].endswith("_tp_sum")]
    check(len(colls) == 6 and len(sums) == 5, f"collective launches in the CUDA table: {colls}")
    print(f"tiny_lm --tp 2 --target cuda: {len(colls)} collective launches of {len(rows)}")


def test_errors(smelt, tmp):
    model = os.path.join(EX, "mlp.yaml")
    out = os.path.join(tmp, "bad.smelt")
    for args, want in ((["--tp", "0"], "--tp needs a number of ranks"), (["--tp", "65"], "--tp needs a number of ranks"),
                       (["--tp", "x"], "--tp needs a number of ranks"),
                       (["--tp", "2", "--passes", "canonicalize,fuse,plan-memory"], "shard pass")):
        r = run([smelt, "compile", model, "-o", out] + args)
        check(r.returncode != 0 and want in r.stderr, f"compile {' '.join(args)}: exit {r.returncode}, {r.stderr!r}")
    # run, bench and generate take --tp for a model they compile, not for a bundle
    r = run([smelt, "run", model, "--device", "cpu", "--tp", "2", "--seed", "3", "--output",
             "y=" + os.path.join(tmp, "mlp_run_tp2.npy")])
    check(r.returncode == 0, f"run mlp.yaml --tp 2: exit {r.returncode}: {r.stderr[-300:]}")
    r1 = run([smelt, "run", model, "--device", "cpu", "--seed", "3", "--output",
              "y=" + os.path.join(tmp, "mlp_run_tp1.npy")])
    if r.returncode == 0 and r1.returncode == 0:
        e = rel_l2(np.load(os.path.join(tmp, "mlp_run_tp2.npy")), np.load(os.path.join(tmp, "mlp_run_tp1.npy")))
        check(e <= 1e-5, f"run mlp.yaml --tp 2 against one rank: rel L2 {e:.3g}")
    tp2 = os.path.join(tmp, "mlp_tp2_cpu.smelt")
    r = run([smelt, "run", tp2, "--tp", "2"])
    check(r.returncode == 2 and "--tp applies when compiling" in r.stderr, f"run BUNDLE --tp: {r.stderr!r}")
    r = run([smelt, "generate", os.path.join(tmp, "lm_gen_tp2_cpu.smelt"), "--tp", "2", "--prompt-ids", "1"])
    check(r.returncode == 2 and "--tp applies when compiling" in r.stderr, f"generate BUNDLE --tp: {r.stderr!r}")
    # device lists: malformed, or not one device a rank
    for cmd, want in ((["run", model, "--devices", "cuda:0,"], "--devices needs a list"),
                      (["run", model, "--devices", "cuda:0,cpu"], "--devices needs a list"),
                      (["bench", model, "--devices", "cuda"], None),
                      (["run", model, "--devices", "cuda:0,cuda:1", "--tp", "4"], "--tp 4 with 2 devices"),
                      (["bench", model, "--devices", "cuda:0,cuda:1", "--tp", "4"], "--tp 4 with 2 devices"),
                      (["generate", os.path.join(EX, "tiny_lm.yaml"), "--devices", "cuda:0,cuda:1", "--tp", "4",
                        "--prompt-ids", "1"], "--tp 4 with 2 devices")):
        r = run([smelt] + cmd)
        if want is None:  # a single "cuda" is a device list of one: no usage error
            check(r.returncode != 2, f"{' '.join(cmd[2:])}: usage error {r.stderr!r}")
            continue
        check(r.returncode == 2 and want in r.stderr, f"{' '.join(cmd)}: exit {r.returncode}, {r.stderr!r}")
    r = run([smelt, "run", tp2, "--devices", "cuda:0,cuda:1,cuda:2"])
    check(r.returncode == 1 and "3 devices" in r.stderr and "2 tensor-parallel ranks" in r.stderr,
          f"run a 2-rank bundle on 3 devices: exit {r.returncode}, {r.stderr!r}")
    # the interpreter runs one rank's graph: a clear error, not a wrong answer
    b = os.path.join(tmp, "mlp_tp2_ref.smelt")
    r = run([smelt, "compile", model, "--tp", "2", "-o", b, "--no-cache"])
    r = run([smelt, "run", b, "--device", "ref"])
    check(r.returncode != 0, f"run --device ref on a tp bundle: exit {r.returncode}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--keep")
    ap.add_argument("--cuda", action="store_true", help="run the bundles on the GPUs (scripts/gpu-tp.sh)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(EX, "tiny_llama.safetensors")):
        print("SKIP: examples/tiny_llama.safetensors is missing (python3 examples/gen_weights.py writes it)")
        sys.exit(77)
    tmp = a.keep or tempfile.mkdtemp(prefix="smelt_tp_")
    os.makedirs(tmp, exist_ok=True)
    if a.cuda:
        gpus = gpu_count()
        print(f"{gpus} GPU(s): {'NCCL between them' if gpus >= 2 else 'every rank on cuda:0, host collectives'}")
        for name in INPUTS:
            for n in (2, 4):
                test_example(a.smelt, tmp, name, n, devices_for(n, gpus))
        test_generate_cuda(a.smelt, tmp, gpus)
        if failures:
            print(f"test_tp --cuda: {len(failures)} failure(s)")
            sys.exit(1)
        print("test_tp --cuda: all passed")
        return
    for name in INPUTS:
        for n in (2, 4):
            test_example(a.smelt, tmp, name, n)
    test_cuda_bundle(a.smelt, tmp)
    test_ir(a.smelt, tmp)
    test_generate(a.smelt, tmp)
    test_errors(a.smelt, tmp)
    if failures:
        print(f"test_tp: {len(failures)} failure(s)")
        sys.exit(1)
    print("test_tp: all passed")


if __name__ == "__main__":
    main()
