#!/usr/bin/env python3
"""A compile-cache hit of a large bundle is a hard link, not a copy.

With SMELT_CACHE_LINK_MIN=0 (the threshold is 64 MiB otherwise) a second
`smelt compile` of the same model and options links the cache entry to the
output: same inode, two links, read-only (0444), bytes equal to a fresh
compile.  Compiling something else to the same output path replaces the
file (rename) and leaves the entry alone: the next hit gives the first
bundle's bytes again.  The bundle runs.

Usage: test_cache_link.py --smelt PATH
"""
import argparse
import filecmp
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def compile_(smelt, env, *args):
    r = subprocess.run([smelt, "compile", *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: smelt compile {' '.join(args)}: {r.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    mlp = os.path.join(ROOT, "examples", "mlp.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SMELT_CACHE_DIR=os.path.join(tmp, "cache"), SMELT_CACHE_LINK_MIN="0")
        ref, out = os.path.join(tmp, "ref.smelt"), os.path.join(tmp, "out.smelt")
        compile_(smelt, env, mlp, "-o", ref, "--no-cache")
        compile_(smelt, env, mlp, "-o", out)          # miss: stored
        compile_(smelt, env, mlp, "-o", out)          # hit: linked
        st = os.stat(out)
        if st.st_nlink < 2 or st.st_mode & 0o777 != 0o444:
            sys.exit(f"FAIL: the hit should be a read-only hard link (links {st.st_nlink}, mode {oct(st.st_mode)})")
        if not filecmp.cmp(ref, out, shallow=False):
            sys.exit("FAIL: the linked bundle differs from a fresh compile")
        print(f"ok: the hit is a hard link ({st.st_nlink} links, mode 0444), bytes equal to a fresh compile")
        compile_(smelt, env, mlp, "-o", out, "--dim", "batch=3")   # another bundle over the same path
        compile_(smelt, env, mlp, "-o", out)
        if not filecmp.cmp(ref, out, shallow=False):
            sys.exit("FAIL: overwriting the output changed the cache entry")
        r = subprocess.run([smelt, "run", out, "--device", "cpu", "--check"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"FAIL: the linked bundle does not run: {r.stderr}")
        print("ok: compiling another bundle to that path leaves the entry intact; the bundle runs and checks")
    print("test_cache_link: ok")


if __name__ == "__main__":
    main()
