#!/usr/bin/env python3
"""What the GPU really runs: a SASS summary of smelt's matmul and attention kernels.

For each directory written by `smelt inspect BUNDLE --dump-cubins DIR`
(cubins u0.sm_90a.cubin, ..., and kernels.tsv naming each kernel's unit,
symbol, kind and variant), runs NVIDIA's `cuobjdump -sass` and
`cuobjdump -res-usage` on every cubin and counts, per kernel function, the
instructions that say whether the variant did what it claims:

  HGMMA    Hopper warpgroup MMA (wgmma): the wgmma variants must have them
  HMMA     warp-level tensor-core MMA (mma.sync)
  LDSM     ldmatrix (shared memory to registers, for HMMA)
  LDGSTS   cp.async (global to shared without registers)
  UTMALDG  TMA tile loads
  LDL/STL  local memory loads/stores: register spills or a stack frame,
           which a tuned matmul or attention kernel should not have

next to the registers, stack and local bytes that -res-usage reports.  It
prints one line per matmul / attention / conv2d kernel, and any other
kernel that touches local memory, and flags the suspicious ones: local
memory in a contraction, a wgmma variant without HGMMA, an mma or flash
variant without HMMA (flashdec, gemv and simple run on CUDA cores).
cuobjdump ships with the CUDA toolkit (not with the driver): found on
PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin.

Usage: sass.py DIR [DIR...]      (exit 0; 1 only when cuobjdump is missing)
"""
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

COUNTED = ("HGMMA", "HMMA", "LDSM", "LDGSTS", "UTMALDG", "LDL", "STL")
HEAVY = ("matmul", "attention", "conv2d")
INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
RES_FUNC = re.compile(r"^\s*Function\s+(\S+):\s*$")
RES_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def find_cuobjdump():
    for d in [None, os.path.join(os.environ.get("CUDA_HOME", ""), "bin"), "/usr/local/cuda/bin"]:
        p = shutil.which("cuobjdump", path=d) if d is not None else shutil.which("cuobjdump")
        if p:
            return p
    return None


def dump(cuobjdump, cubin):
    """One `cuobjdump -sass -res-usage` of a cubin: ({function: Counter of
    opcodes (the part before the first '.')}, {function: {"REG": n,
    "STACK": n, "SHARED": n, "LOCAL": n, ...}})."""
    out = subprocess.run([cuobjdump, "-sass", "-res-usage", cubin], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "cuobjdump failed")
    funcs, res, cur, cur_res = {}, {}, None, None
    for line in out.stdout.splitlines():
        m = FUNC.match(line)  # "Function : NAME" opens a function's SASS
        if m:
            cur = funcs.setdefault(m.group(1), Counter())
            continue
        m = RES_FUNC.match(line)  # "Function NAME:" then its resource line
        if m:
            cur_res = res.setdefault(m.group(1), {})
            continue
        if cur_res is not None and "REG:" in line:
            cur_res.update({k: int(v) for k, v in RES_FIELD.findall(line)})
            cur_res = None
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur[m.group(1)] += 1
            cur["total"] += 1
    return funcs, res


def read_index(d):
    """kernels.tsv: {(unit, symbol): (kind, variant, name)}."""
    idx = {}
    path = os.path.join(d, "kernels.tsv")
    if not os.path.exists(path):
        return idx
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 9:
                idx[(parts[0], parts[1])] = (parts[2], parts[3], parts[8])
    return idx


def flags(kind, variant, c, r):
    out = []
    if kind in HEAVY and (c["LDL"] or c["STL"] or r.get("LOCAL", 0)):
        out.append("LOCAL MEMORY")
    family = variant.split(":")[0]  # "mma:bm=128,..." -> "mma"
    if family == "wgmma" and not c["HGMMA"]:
        out.append("wgmma variant without HGMMA")
    if family in ("mma", "flash") and not (c["HMMA"] or c["HGMMA"]):
        out.append("tensor-core variant without HMMA")
    return ", ".join(out)


def kernel_order(row):
    """Bundle, then kernel number (symbols start kNN_), then name."""
    m = re.match(r"k(\d+)_", row[2])
    return (row[0], int(m.group(1)) if m else 1 << 30, row[2])


def merge_copies(rows):
    """Kernels of one bundle with the same kind, variant, resources and
    counts (the layers of a repeated block) as one line: the first, "x N"."""
    seen, out = {}, []
    for r in rows:
        key = (r[0], tuple(r[3:]))
        if key in seen:
            seen[key][2] += 1
            continue
        seen[key] = [r, r[2], 1]
        out.append(key)
    merged = []
    for key in out:
        r, name, n = seen[key]
        merged.append([r[0], r[1], name + (f" (x{n})" if n > 1 else "")] + r[3:])
    return merged


def summarise(cuobjdump, dirs):
    head = ["bundle", "unit", "kernel", "kind", "variant", "REG", "STACK", "LOCAL"] + list(COUNTED) + ["insns", "flags"]
    rows = []
    for d in dirs:
        idx = read_index(d)
        label = os.path.basename(os.path.normpath(d))
        for cubin in sorted(f for f in os.listdir(d) if f.endswith(".cubin")):
            unit = cubin.split(".sm_")[0]  # "u3" or "s1.u3"
            arch = cubin[len(unit) + 1:-len(".cubin")]
            path = os.path.join(d, cubin)
            try:
                counts, res = dump(cuobjdump, path)
            except RuntimeError as e:
                rows.append([label, f"{unit}.{arch}", "(cuobjdump failed)", "", str(e)[:60]] + [""] * 12)
                continue
            for fn, c in counts.items():
                kind, variant, _ = idx.get((unit, fn), ("?", "-", fn))
                r = res.get(fn, {})
                touches_local = c["LDL"] or c["STL"] or r.get("LOCAL", 0)
                if kind not in HEAVY and not touches_local:
                    continue
                rows.append([label, f"{unit}.{arch}", fn[:40], kind, variant[:48], r.get("REG", "?"),
                             r.get("STACK", "?"), r.get("LOCAL", "?")] + [c[k] for k in COUNTED]
                            + [c["total"], flags(kind, variant, c, r)])
    if not rows:
        print("no matmul, attention or conv2d kernels, and no kernel uses local memory")
        return
    rows = merge_copies(sorted(rows, key=kernel_order))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for line in [head] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    bad = [r for r in rows if r[-1]]
    print(f"{len(rows)} distinct kernels; {len(bad)} flagged" + (": " + "; ".join(f"{r[2]} ({r[-1]})" for r in bad[:8])
                                                       if bad else ""))


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        print("sass.py: no cuobjdump (the CUDA toolkit's; PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
        return 1
    summarise(cuobjdump, argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
