#!/usr/bin/env python3
"""CPU backend end to end, through the command line.

For every example, in f32 and f16, under the machine's on-chip budget and
under `--onchip-bytes 64` (which splits every fusion group): compile a
bundle, then `smelt run BUNDLE --device cpu --check` (outputs against the
reference interpreter: f32 rel L2 <= 1e-5, f16 <= 2e-3) and `--check=groups`
(every fused group against the unfused reference).  Checks too that the
small budget really gives more kernels, that `inspect --memory` reports an
arena no larger than the intermediates, and that corrupted and truncated
bundles are refused with exit status 1 and a message, never a crash.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

EXAMPLES = ["mlp", "cnn", "gpt2_block", "tiny_llama"]
TOL = {"f32": 1e-5, "f16": 2e-3}


def smelt_cmd(smelt, args, timeout=300):
    return subprocess.run([smelt] + args, capture_output=True, text=True, timeout=timeout)


def crashed(r):
    return r.returncode < 0 or "AddressSanitizer" in r.stderr or "runtime error" in r.stderr


def check_example(smelt, ex, dtype, budget, tmp, failures):
    out = os.path.join(tmp, f"{ex}_{dtype}_{budget or 'auto'}.smelt")
    args = ["compile", f"examples/{ex}.yaml", "-o", out, "--dtype", dtype]
    if budget:
        args += ["--onchip-bytes", str(budget)]
    r = smelt_cmd(smelt, args)
    if r.returncode != 0:
        failures.append(f"{ex} {dtype}: compile exited {r.returncode}: {r.stderr.strip()[-500:]}")
        return None
    r = smelt_cmd(smelt, ["run", out, "--device", "cpu", "--check"])
    errs = [float(m) for m in re.findall(r"^\s+\S+\s+\S+\s+\S+\s+(\S+)\s+\S+\s+(?:pass|FAIL)\s+\S.*$", r.stdout, re.M)]  # rel L2, then cosine
    if r.returncode != 0 or not errs or max(errs) > TOL[dtype]:
        failures.append(f"{ex} {dtype} budget={budget}: --check rc={r.returncode} errors={errs}\n{r.stdout}{r.stderr}")
    r2 = smelt_cmd(smelt, ["run", out, "--device", "cpu", "--check=groups"])
    if r2.returncode != 0 or "all groups match" not in r2.stdout:
        failures.append(f"{ex} {dtype} budget={budget}: --check=groups rc={r2.returncode}\n{r2.stdout[-1500:]}{r2.stderr}")
    kernels = len(re.findall(r"^\s+k\d+", r2.stdout, re.M))
    return out, (max(errs) if errs else float("nan")), kernels


def check_memory(smelt, bundle, failures):
    r = smelt_cmd(smelt, ["inspect", bundle, "--memory"])
    m = re.search(r"arena: (\d+) bytes for \d+ intermediates of (\d+) bytes", r.stdout)
    if r.returncode != 0 or not m or int(m.group(1)) > int(m.group(2)):
        failures.append(f"inspect --memory {bundle}: rc={r.returncode}\n{r.stdout[:500]}{r.stderr}")


def corruptions(data):
    """(name, bytes) pairs: each must be refused."""
    n = len(data)
    flip = lambda pos: data[:pos] + bytes([data[pos] ^ 0x40]) + data[pos + 1:]
    yield "empty", b""
    yield "magic", b"XMELT" + data[5:]
    yield "header only", data[:64]
    yield "truncated mid-table", data[:100]
    yield "truncated by one byte", data[:-1]
    yield "truncated at half", data[: n // 2]
    yield "one byte appended", data + b"\0"
    yield "version byte", flip(8)
    yield "section count", flip(12)
    yield "file size field", flip(16)
    yield "header checksum", flip(24)
    yield "table entry", flip(40)
    yield "payload start", flip(n // 3)
    yield "payload middle", flip(n // 2)
    yield "last byte", flip(n - 1)
    yield "garbage", bytes((i * 37 + 11) % 256 for i in range(n))


def check_corrupt(smelt, bundle, tmp, failures):
    data = open(bundle, "rb").read()
    count = 0
    for name, blob in corruptions(data):
        path = os.path.join(tmp, "bad.smelt")
        with open(path, "wb") as f:
            f.write(blob)
        for cmd in (["inspect", path], ["run", path, "--device", "cpu"]):
            r = smelt_cmd(smelt, cmd)
            if r.returncode != 1 or crashed(r) or "error" not in r.stderr:
                failures.append(f"corrupted bundle ({name}): smelt {cmd[0]} rc={r.returncode}: {r.stderr.strip()[:300]}")
        count += 1
    return count


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    if "cpu" not in smelt_cmd(smelt, ["run", "--help"]).stdout:
        print("SKIP: this smelt has no CPU backend")
        return 77  # 77: skipped as a whole (ctest's SKIP_RETURN_CODE)
    if not os.path.exists("examples/tiny_llama.safetensors"):
        subprocess.run([sys.executable, "examples/gen_weights.py"], check=True)
    failures = []
    print(f"{'example':12} {'dtype':5} {'budget':>8} {'kernels':>8} {'rel L2':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        first = None
        for ex in EXAMPLES:
            for dtype in ("f32", "f16"):
                counts = {}
                for budget in (0, 64):
                    res = check_example(smelt, ex, dtype, budget, tmp, failures)
                    if not res:
                        continue
                    bundle, err, kernels = res
                    counts[budget] = kernels
                    first = first or bundle
                    print(f"{ex:12} {dtype:5} {budget or 'auto':>8} {kernels:>8} {err:10.3g}")
                    if budget == 0:
                        check_memory(smelt, bundle, failures)
                if len(counts) == 2 and counts[64] <= counts[0] and ex != "cnn":
                    failures.append(f"{ex} {dtype}: --onchip-bytes 64 gave {counts[64]} kernels, "
                                    f"the default budget {counts[0]}: fusion did not stop")
        if first:
            n = check_corrupt(smelt, first, tmp, failures)
            print(f"{n} corrupted/truncated bundles: each refused by inspect and run")
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
