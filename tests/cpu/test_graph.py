#!/usr/bin/env python3
"""Graphviz output: `smelt inspect BUNDLE --graph FILE.dot|FILE.svg` and
`smelt compile --graph-after=PASS FILE`.

Checks that the DOT has one cluster per fusion group of the final IR (the
count `smelt inspect` prints), each titled with its kernel, footprint and
budget; one node per IR node labelled with its YAML name; edges labelled
with shapes and bytes; the state drawn with its in-place update; that
`dot -Tsvg` renders it (scripts/setup.sh installs graphviz), and the SVG
path; that --graph-after=canonicalize has no clusters (nothing is fused
yet); and the errors: an unknown file directory, --graph without a file.

Usage: test_graph.py --smelt PATH
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    exe = os.path.abspath(ap.parse_args().smelt)
    run = lambda *a: subprocess.run([exe] + list(a), capture_output=True, text=True, cwd=ROOT)  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        b = os.path.join(d, "lm.smelt")
        after = os.path.join(d, "canon.dot")
        r = run("compile", "examples/tiny_lm.yaml", "-o", b, "--graph-after=canonicalize", after)
        check(r.returncode == 0, f"compile --graph-after=canonicalize ({r.stderr.strip()[-200:]})")
        canon = open(after).read() if os.path.exists(after) else ""
        check(canon.startswith("digraph smelt {") and "cluster_" not in canon, "before fuse: a graph without clusters")
        dot = os.path.join(d, "lm.dot")
        r = run("inspect", b, "--graph", dot)
        check(r.returncode == 0, f"inspect --graph FILE.dot ({r.stderr.strip()[-200:]})")
        text = open(dot).read() if os.path.exists(dot) else ""
        ir = run("inspect", b, "--ir").stdout
        ngroups = len(re.findall(r"^\s*group ", ir, re.M))
        check(ngroups > 0 and text.count("subgraph cluster_") == ngroups, f"one cluster per fusion group ({ngroups})")
        check(re.search(r'label="k\d\d_[^"]*\\n\w+, footprint [\d.]+ [KM]?i?B of [\d.]+ [KM]?i?B"', text) is not None,
              "a cluster shows its kernel, kind, footprint and budget")
        check('"layer.1/att\\nattention' in text, "nodes carry their YAML names and ops")
        check(re.search(r'-> n\d+ \[label="f32\[16,64\]\\n4.0 KiB"', text) is not None, "edges carry type and bytes")
        check('label="state layer.0/k_cache' in text and 'label="in place"' in text, "state and its in-place update")
        check('shape=doubleoctagon, label="output next"' in text, "outputs are marked")
        if shutil.which("dot"):
            r = subprocess.run(["dot", "-Tsvg", dot, "-o", os.path.join(d, "x.svg")], capture_output=True, text=True)
            check(r.returncode == 0, f"dot -Tsvg renders it ({r.stderr.strip()[:200]})")
            svg = os.path.join(d, "lm.svg")
            r = run("inspect", b, "--graph", svg)
            check(r.returncode == 0 and open(svg).read().lstrip().startswith("<?xml"), "inspect --graph FILE.svg")
        else:
            check(False, "graphviz's dot is not installed (scripts/setup.sh installs it)")
        r = run("inspect", b, "--graph", os.path.join(d, "no", "g.dot"))
        check(r.returncode == 1 and "cannot write the graph" in r.stderr, "an unwritable file: exit 1")
        r = run("inspect", b, "--graph")
        check(r.returncode == 2, "--graph without a file: exit 2")
    print("test_graph: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
