#!/usr/bin/env python3
"""The YAML frontend on huge, deep and long models (issue 16 #5, #6).

  - a 10^5-node chain loads in linear time (name lookup through hash tables;
    it took 94 s when every lookup scanned the scope), and errors about names
    in big scopes and mappings read as before;
  - nesting deeper than 256 levels, flow ([[[...) or block (- - - ...), is
    refused at once with a located error (libyaml's scanner is quadratic in
    depth: 4*10^4 levels took 7 s), and nesting just under the limit loads.

Usage: test_frontend_limits.py --smelt PATH
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def run(smelt, path, timeout):
    """(exit status, stderr, seconds); status None on a timeout."""
    t = time.monotonic()
    try:
        r = subprocess.run([smelt, "run", path, "--device", "ref"], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out", time.monotonic() - t
    return r.returncode, r.stderr, time.monotonic() - t


def write(d, name, text):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def chain(n, op="neg"):
    lines = ["smelt: 1", "name: chain", "inputs: {x: {shape: [4]}}", "nodes:"]
    prev = "x"
    for i in range(n):
        lines.append("  - {out: v%d, op: %s, in: [%s]}" % (i, op, prev))
        prev = "v%d" % i
    return "\n".join(lines + ["outputs: [%s]" % prev, ""])


def test_long(smelt, d):
    n = 100000
    rc, err, sec = run(smelt, write(d, "long.yaml", chain(n)), timeout=30)
    check(rc == 0 and sec < 10, "%d-node chain loads and runs in %.2f s (rc %s) %s" % (n, sec, rc, err[:200]))

    # a duplicate name and an undefined one at the end of a big scope: the same messages
    lines = chain(20000).splitlines()
    lines.insert(-1, "  - {out: v7, op: neg, in: [v19999]}")
    rc, err, _ = run(smelt, write(d, "dup.yaml", "\n".join(lines) + "\n"), timeout=30)
    check(rc == 1 and "dup.yaml:20005:11: error: duplicate name 'v7' (first defined at 12:11)" in err,
          "duplicate name in a big scope: %s" % err.strip()[:200])
    lines[-2] = "  - {out: w, op: neg, in: [nope]}"
    rc, err, _ = run(smelt, write(d, "undef.yaml", "\n".join(lines) + "\n"), timeout=30)
    check(rc == 1 and "undef.yaml:20005:28: error: node 'w' (neg): undefined name 'nope'" in err,
          "undefined name in a big scope: %s" % err.strip()[:200])

    # a duplicate key in a mapping of 20,000 params (hashed, not compared pairwise)
    params = ["  p%d: {shape: [1]}" % i for i in range(20000)] + ["  p123: {shape: [1]}"]
    text = "smelt: 1\ninputs: {x: {shape: [4]}}\nparams:\n" + "\n".join(params) + "\nnodes: []\noutputs: [x]\n"
    rc, err, _ = run(smelt, write(d, "dupkey.yaml", text), timeout=30)
    check(rc == 1 and "dupkey.yaml:20004:3: error: duplicate key 'p123' in params (first at 127:3)" in err,
          "duplicate key in a big mapping: %s" % err.strip()[:200])

    # duplicates in one `out` list, many names long
    names = ["o%d" % i for i in range(4000)] + ["o17"]
    text = ("smelt: 1\ninputs: {x: {shape: [4000]}}\nnodes:\n  - {out: [%s], op: split, in: [x], axis: 0, "
            "sizes: [%s]}\noutputs: [x]\n" % (", ".join(names), ", ".join(["1"] * len(names))))
    rc, err, _ = run(smelt, write(d, "dupout.yaml", text), timeout=30)
    check(rc == 1 and "duplicate name 'o17' in 'out'" in err, "duplicate in a long 'out': %s" % err.strip()[:200])


def test_deep(smelt, d):
    n = 40000
    head = "smelt: 1\nname: d\ninputs: {x: {shape: [4]}}\n"
    flow = head + "params: {p: {shape: [1], value: " + "[" * n + "1" + "]" * n + "}}\nnodes: []\noutputs: [x]\n"
    block = head + "blocks:\n  b:\n    " + "- " * n + "x\noutputs: [x]\n"
    for name, text, line in (("flow", flow, 4), ("block", block, 6)):
        rc, err, sec = run(smelt, write(d, "deep_%s.yaml" % name, text), timeout=60)
        want = "deep_%s.yaml:%d:" % (name, line)
        check(rc == 1 and want in err and "error: YAML nested more than 256 levels deep" in err and sec < 2,
              "%d-deep %s nesting refused in %.2f s: %s" % (n, name, sec, err.strip()[:200]))
    # just under the limit: the root mapping, params, p and 250 lists
    ok = head + "params: {p: {shape: [1], value: " + "[" * 250 + "1" + "]" * 250 + "}}\nnodes: []\noutputs: [x]\n"
    rc, err, _ = run(smelt, write(d, "deep_ok.yaml", ok), timeout=60)
    check(rc == 1 and "nested" not in err and "is not a valid f32" in err,
          "253 levels parse (then the value is refused as a value): %s" % err.strip()[:200])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    d = tempfile.mkdtemp(prefix="smelt_limits_")
    try:
        test_long(smelt, d)
        test_deep(smelt, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("test_frontend_limits: %d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
