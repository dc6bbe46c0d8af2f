#!/usr/bin/env python3
"""A program linked against libsmelt_runtime alone runs every example.

For each examples/*.yaml: `smelt compile` (CPU) into a bundle, run it with
build/run_bundle (tests/install/consumer/run_bundle.c: <smelt.h> only,
linked against libsmelt_runtime.so only), run the same bundle with
`smelt run` on the same inputs, and require bitwise-equal outputs.  Also:
`ldd libsmelt_runtime.so` shows neither libLLVM, libyaml nor libjansson;
a bundle whose CPU code needs a feature the machine lacks is refused with
the feature named (SMELT_FAKE_CPU_FEATURES fakes the host), and a bundle
with several CPU variants loads the one the (faked) host can run.

Usage: test_runtime_alone.py --smelt PATH
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, check_ldd, compare_with_smelt_run, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--device", default="cpu", help="cuda: the examples compiled for --target cuda, on the GPU "
                    "(scripts/gpu-check.sh); cpu also checks CPU features and --cpu")
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    build = os.path.dirname(smelt)
    consumer = os.path.join(build, "run_bundle")
    lib = os.path.join(build, "libsmelt_runtime.so")
    check_ldd(lib)
    linked = run(["ldd", consumer])
    if "libsmelt_runtime" not in linked or "libsmelt.so" in linked:
        raise SystemExit(f"FAIL: run_bundle should link libsmelt_runtime.so alone:\n{linked}")
    print(f"ok: {os.path.basename(lib)} needs no LLVM, libyaml or jansson; run_bundle links it alone")
    with tempfile.TemporaryDirectory() as tmp:
        for model in sorted(glob.glob(os.path.join(ROOT, "examples", "*.yaml"))):
            name = os.path.splitext(os.path.basename(model))[0]
            work = os.path.join(tmp, name)
            os.makedirs(work)
            bundle = os.path.join(work, name + ".smelt")
            run([smelt, "compile", model, "-o", bundle, "--target", args.device])
            n = compare_with_smelt_run(smelt, bundle, consumer, work, device=args.device)
            print(f"ok: {name} on {args.device}: {n} output(s) bitwise equal to smelt run")
        if args.device != "cpu":
            print(f"all runtime-alone checks on {args.device} passed")
            return

        # CPU features: a bundle for x86-64-v3 on a host that says it has only SSE2
        mlp = os.path.join(ROOT, "examples", "mlp.yaml")
        v3 = os.path.join(tmp, "v3.smelt")
        run([smelt, "compile", mlp, "-o", v3, "--cpu", "x86-64-v3"])
        env = dict(os.environ, SMELT_FAKE_CPU_FEATURES="x87,cmov,sse,sse2,cx8,fxsr,mmx")
        r = subprocess.run([consumer, v3, tmp], capture_output=True, text=True, env=env)
        if r.returncode == 0 or "avx2" not in r.stderr or "fma" not in r.stderr:
            raise SystemExit(f"FAIL: a v3 bundle on an SSE2-only host should be refused naming avx2 and fma:\n"
                             f"{r.stdout}{r.stderr}")
        print(f"ok: x86-64-v3 code refused on a faked SSE2 host: {r.stderr.strip().splitlines()[-1][:160]}")
        # several variants: the faked v2 host gets the v2 code, and the outputs agree with the real host's
        multi = os.path.join(tmp, "multi.smelt")
        run([smelt, "compile", mlp, "-o", multi, "--cpu", "x86-64-v2,x86-64-v3"])
        v2 = "x87,cmov,sse,sse2,cx8,fxsr,mmx,cx16,sse3,ssse3,sse4.1,sse4.2,popcnt,sahf,crc32"
        work = os.path.join(tmp, "multi")
        os.makedirs(work)
        n = compare_with_smelt_run(smelt, multi, consumer, work, env=dict(os.environ, SMELT_FAKE_CPU_FEATURES=v2))
        r = subprocess.run([consumer, v3, tmp], capture_output=True, text=True,
                           env=dict(os.environ, SMELT_FAKE_CPU_FEATURES=v2))
        if r.returncode == 0:
            raise SystemExit("FAIL: the v3-only bundle ran on a faked v2 host")
        print(f"ok: a bundle with x86-64-v2 and -v3 code runs on a faked v2 host ({n} outputs equal)")
        # --cpu is validated
        r = subprocess.run([smelt, "compile", mlp, "-o", os.path.join(tmp, "x.smelt"), "--cpu", "znver9"],
                           capture_output=True, text=True)
        if r.returncode != 2 or "znver9" not in r.stderr or "x86-64-v3" not in r.stderr:
            raise SystemExit(f"FAIL: --cpu znver9 should exit 2 listing the known names:\n{r.stderr}")
        print("ok: --cpu znver9 exits 2 with the known CPU names")
    print("all runtime-alone checks passed")


if __name__ == "__main__":
    main()
