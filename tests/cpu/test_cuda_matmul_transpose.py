#!/usr/bin/env python3
"""Issue 16 finding 3: --target cuda refused a matmul followed by a
transpose that keeps its shape ([.., 8, 8] with perm [0, 1, 3, 2]): the
fuser puts the transpose into the matmul's epilogue, and the CUDA epilogue
read the matmul's result at the transposed coordinates ("value 'm' (matmul)
is needed at coordinates where the kernel does not compute it").  Now the
epilogue places a data-moving member by the forward walk (store where each
element lands).  Checks: the reproducer and a 2-D 8x8 form compile for
CUDA (NVRTC; skipped, exit 77, without it), and the stored index is the
transposed one (y[col][row] = m[row][col]) in the kernel's source.
Usage: test_cuda_matmul_transpose.py --smelt PATH
"""
import argparse, os, re, subprocess, sys, tempfile

MODELS = {
    "4d": """smelt: 1
name: cu
dtype: f32
inputs: {a: {shape: [1, 1, 8, 6]}, b: {shape: [1, 6, 8]}}
nodes:
  - {out: m, op: matmul, in: [a, b]}
  - {out: y, op: transpose, in: [m], perm: [0, 1, 3, 2]}
outputs: [y]
""",
    "2d": """smelt: 1
name: cu2
dtype: f32
inputs: {a: {shape: [8, 8]}, b: {shape: [8, 8]}}
nodes:
  - {out: m, op: matmul, in: [a, b]}
  - {out: y, op: transpose, in: [m], perm: [1, 0]}
outputs: [y]
""",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SMELT_CACHE_DIR=os.path.join(d, "cache"))
        for name, text in MODELS.items():
            y = os.path.join(d, name + ".yaml")
            out = os.path.join(d, name + ".smelt")
            open(y, "w").write(text)
            r = subprocess.run([args.smelt, "compile", y, "--target", "cuda", "-o", out], capture_output=True,
                               text=True, env=env, timeout=600)
            if r.returncode != 0 and re.search(r"NVRTC|nvrtc", r.stderr) and "needed at coordinates" not in r.stderr:
                print("SKIP: no NVRTC: " + r.stderr.strip().splitlines()[-1])
                return 77
            if r.returncode != 0:
                print(f"FAIL {name}: compile exited {r.returncode}: {r.stderr.strip()}")
                fails += 1
                continue
            src = subprocess.run([args.smelt, "inspect", out, "--source", "k00_m"], capture_output=True, text=True,
                                 env=env, timeout=120).stdout
            # the store of y: a2[(COL * 8 + ROW)] where m's row index is i / 8 and its column col
            m = re.search(r"const int (t\d+) = \(int\)\(n0 \+ col\), (t\d+) = i / 8;", src)
            st = re.search(r"a2\[\((t\d+) \* 8 \+ (t\d+)\)\] = [^;]*;  // y", src)
            if not st:
                print(f"FAIL {name}: no store of y in the source")
                fails += 1
            elif m and (st.group(1), st.group(2)) != (m.group(1), m.group(2)):
                print(f"FAIL {name}: y stored at {st.group(0)}, not transposed")
                fails += 1
            else:
                print(f"ok {name}: {st.group(0).strip()}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
