#!/usr/bin/env python3
"""Bundle size, external weights and the compile cache, through the CLI.

- Specialisations share constants: tiny_llama with --dim seq=1,16 has one
  constants section the size of the single-specialisation bundle's.
- Dead constants are not stored: a param nothing uses (no dce in --passes)
  adds nothing to the constants section.
- --external-weights: the bundle has no weights in it (smaller by about the
  safetensors file) and a weights section; run outputs equal the embedded
  bundle's, bit for bit; the bundle still loads when copied with the weights
  file into another directory (found beside the bundle); a weights file
  changed by one byte (same size) is refused naming the file; a missing one
  is refused as not found.
- A corrupted constants section is refused when a session starts (its
  checksum is checked then); a corrupted weights section (its recipes) is
  refused at open.
- The compile cache: compiling again gives identical bytes from the cache
  (one entry); a changed weights file or another option misses (a second,
  third entry); --no-cache neither reads nor writes it.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(smelt, args, env=None):
    return subprocess.run([smelt] + args, capture_output=True, text=True, timeout=600, env=env)


def sections(path):
    """{(kind, name): (offset, size)} from the bundle's section table."""
    with open(path, "rb") as f:
        data = f.read()
    count = struct.unpack_from("<I", data, 12)[0]
    out = {}
    for i in range(count):
        e = 32 + 88 * i
        kind = struct.unpack_from("<I", data, e)[0]
        name = data[e + 8:e + 64].split(b"\0")[0].decode()
        off, size = struct.unpack_from("<QQ", data, e + 64)
        out[(kind, name)] = (off, size)
    return out


CONSTANTS, WEIGHTS = 4, 13


def model_tensors(path):
    """{name: (file offset, nbytes)} of the safetensors tensors tiny_llama.yaml
    reads ("layers.*"; the file also holds tiny_lm.yaml's lm_head and
    embeddings, which tiny_llama does not use)."""
    import json
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: (8 + n + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
            for k, v in header.items() if k.startswith("layers.")}


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    model = os.path.join(ROOT, "examples", "tiny_llama.yaml")
    weights = os.path.join(ROOT, "examples", "tiny_llama.safetensors")
    if not os.path.exists(weights):
        print("SKIP: examples/tiny_llama.safetensors missing (run examples/gen_weights.py)")
        return 77  # 77: skipped as a whole (ctest's SKIP_RETURN_CODE)
    tmp = tempfile.mkdtemp(prefix="smelt-weights-")
    env = dict(os.environ, SMELT_CACHE_DIR=os.path.join(tmp, "cache"))
    try:
        # ---- dedup across specialisations
        one, two = os.path.join(tmp, "one.smelt"), os.path.join(tmp, "two.smelt")
        r1 = run(smelt, ["compile", model, "-o", one, "--no-cache"], env)
        r2 = run(smelt, ["compile", model, "-o", two, "--dim", "seq=1,16", "--no-cache"], env)
        check(r1.returncode == 0 and r2.returncode == 0, "compile tiny_llama, once and with --dim seq=1,16")
        c1 = sections(one)[(CONSTANTS, "")][1]
        c2 = sections(two)[(CONSTANTS, "")][1]
        used = model_tensors(weights)
        wbytes = sum(n for _, n in used.values())
        check(c1 >= wbytes * 0.9 and c2 == c1,
              f"one constants section for both specialisations: {c2} bytes, as for one ({c1}); weights used {wbytes}")
        check(not any(k == CONSTANTS and n for (k, n) in sections(two)),
              "no per-specialisation constants sections")

        # ---- dead constants
        dead_model = os.path.join(tmp, "dead.yaml")
        with open(dead_model, "w") as f:
            f.write("smelt: 1\nname: dead\ninputs:\n  x: {shape: [4, 16]}\nparams:\n"
                    "  w: {shape: [16, 16], init: ones}\n  unused: {shape: [128, 128], init: ones}\n"
                    "nodes:\n  - {out: y, op: matmul, in: [x, w]}\noutputs: [y]\n")
        dead = os.path.join(tmp, "dead.smelt")
        r = run(smelt, ["compile", dead_model, "-o", dead, "--passes", "canonicalize", "--no-cache"], env)
        check(r.returncode == 0, "compile a model with an unused param, without dce: " + r.stderr.strip())
        if r.returncode == 0:
            size = sections(dead)[(CONSTANTS, "")][1]
            check(16 * 16 * 4 <= size < 128 * 128 * 4, f"the unused param is not stored (constants: {size} bytes)")
            rr = run(smelt, ["run", dead, "--device", "cpu", "--check"], env)
            check(rr.returncode == 0 and "pass" in rr.stdout, "and the bundle runs and checks")

        # ---- external weights
        d = os.path.join(tmp, "ext")
        os.makedirs(d)
        m2 = os.path.join(d, "tiny_llama.yaml")
        shutil.copy(model, m2)
        w2 = os.path.join(d, "tiny_llama.safetensors")
        shutil.copy(weights, w2)
        emb, ext = os.path.join(d, "emb.smelt"), os.path.join(d, "ext.smelt")
        r1 = run(smelt, ["compile", m2, "-o", emb, "--no-cache"], env)
        r2 = run(smelt, ["compile", m2, "-o", ext, "--external-weights", "--no-cache"], env)
        check(r1.returncode == 0 and r2.returncode == 0, "compile with and without --external-weights")
        se = sections(ext)
        check((WEIGHTS, "") in se and se.get((CONSTANTS, ""), (0, 0))[1] < 4096,
              f"external: a weights section, constants {se.get((CONSTANTS, ''), (0, 0))[1]} bytes")
        check(os.path.getsize(emb) - os.path.getsize(ext) > wbytes * 0.9,
              f"external bundle smaller by about the weights: {os.path.getsize(emb)} -> {os.path.getsize(ext)}")
        outs = {}
        for name, b in (("emb", emb), ("ext", ext)):
            o = os.path.join(d, name + "_y.npy")
            r = run(smelt, ["run", b, "--device", "cpu", "--output", "y=" + o], env)
            check(r.returncode == 0, f"run the {name} bundle: {r.stderr.strip()}")
            if r.returncode == 0:
                outs[name] = np.load(o)
        if len(outs) == 2:
            check(np.array_equal(outs["emb"], outs["ext"]), "external weights give the embedded bundle's outputs")
        # moved together: found beside the bundle
        moved = os.path.join(tmp, "moved")
        os.makedirs(moved)
        shutil.copy(ext, os.path.join(moved, "ext.smelt"))
        shutil.copy(w2, os.path.join(moved, "tiny_llama.safetensors"))
        os.rename(w2, w2 + ".away")
        r = run(smelt, ["run", os.path.join(moved, "ext.smelt"), "--device", "cpu", "--check"], env)
        check(r.returncode == 0, "bundle and weights copied elsewhere: the file is found beside the bundle " +
              r.stderr.strip())
        # missing
        os.remove(os.path.join(moved, "tiny_llama.safetensors"))
        r = run(smelt, ["run", os.path.join(moved, "ext.smelt"), "--device", "cpu"], env)
        check(r.returncode != 0 and "tiny_llama.safetensors" in r.stderr and "not found" in r.stderr,
              "a missing weights file is refused: " + r.stderr.strip())
        os.rename(w2 + ".away", w2)
        # changed by one byte, same size
        flip(w2, os.path.getsize(w2) - 5)
        r = run(smelt, ["run", ext, "--device", "cpu"], env)
        check(r.returncode != 0 and w2 in r.stderr and "not the one the bundle was compiled with" in r.stderr,
              "a weights file changed by one byte is refused by name: " + r.stderr.strip())
        flip(w2, os.path.getsize(w2) - 5)
        r = run(smelt, ["run", ext, "--device", "cpu", "--check"], env)
        check(r.returncode == 0, "restored, it runs again")

        # ---- corrupted constants and weights sections
        bad = os.path.join(d, "bad_consts.smelt")
        shutil.copy(emb, bad)
        off, size = sections(bad)[(CONSTANTS, "")]
        flip(bad, off + size // 2)
        r = run(smelt, ["run", bad, "--device", "cpu"], env)
        check(r.returncode != 0 and "constants" in r.stderr and "checksum mismatch" in r.stderr,
              "a corrupted constants section is refused: " + r.stderr.strip())
        bad = os.path.join(d, "bad_weights.smelt")
        shutil.copy(ext, bad)
        off, size = sections(bad)[(WEIGHTS, "")]
        flip(bad, off + size - 3)
        r = run(smelt, ["run", bad, "--device", "cpu"], env)
        check(r.returncode != 0 and "weights" in r.stderr and "checksum mismatch" in r.stderr,
              "a corrupted weights section is refused: " + r.stderr.strip())

        # ---- the compile cache
        cache = os.path.join(tmp, "cache", "bundles")
        a, b = os.path.join(d, "a.smelt"), os.path.join(d, "b.smelt")
        r1 = run(smelt, ["compile", m2, "-o", a], env)
        r2 = run(smelt, ["compile", m2, "-o", b], env)
        check(r1.returncode == 0 and r2.returncode == 0, "compile twice through the cache")
        check(open(a, "rb").read() == open(b, "rb").read(), "a cache hit gives identical bytes")
        entries = lambda: sorted(os.listdir(cache)) if os.path.isdir(cache) else []
        check(len(entries()) == 1, f"one cache entry ({len(entries())})")
        wq = used["layers.0.wq"][0] + 4  # a byte the model reads
        flip(w2, wq)
        r = run(smelt, ["compile", m2, "-o", b], env)
        check(r.returncode == 0 and len(entries()) == 2 and open(a, "rb").read() != open(b, "rb").read(),
              "a changed weights file misses the cache")
        flip(w2, wq)
        r = run(smelt, ["compile", m2, "-o", b, "--passes",
                        "canonicalize,const-fold,simplify,cse,dce,fuse,plan-memory"], env)
        check(r.returncode == 0 and len(entries()) == 3, "another option misses the cache")
        r = run(smelt, ["compile", m2, "-o", b, "--external-weights"], env)
        check(r.returncode == 0 and len(entries()) == 4, "--external-weights is part of the key")
        r = run(smelt, ["compile", m2, "-o", b, "--no-cache", "--dtype", "f16"], env)
        check(r.returncode == 0 and len(entries()) == 4, "--no-cache does not store")
        r = run(smelt, ["compile", m2, "-o", b], env)
        check(r.returncode == 0 and open(a, "rb").read() == open(b, "rb").read() and len(entries()) == 4,
              "the first key still hits")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"test_bundle_weights: {len(failures)} failure(s)")
        return 1
    print("test_bundle_weights: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
