#!/usr/bin/env python3
"""Bad input is an error, never a crash (SPEC §2).

Runs `smelt run CASE --device ref` and `smelt compile CASE -o OUT` on every
model in tests/bad/cases/ and on a few generated ones (an empty file, a
binary file), and checks that each
  - exits with status exactly 1,
  - prints `CASE:LINE:COL: error: ` followed (somewhere) by the expected
    message, or `CASE: error: ` for faults with no place in the file,
  - shows no sign of a crash (sanitizer reports, signals, core dumps).

Each case file starts with comment lines:
  # expect: LINE:COL: MESSAGE-SUBSTRING     (or `# expect: MESSAGE` if unlocated)
  # args: EXTRA COMMAND-LINE ARGUMENTS      (optional)
The safetensors files the cases refer to are generated here, with the
stdlib only, into the temporary directory the cases are copied to.

Usage: test_bad_inputs.py --smelt PATH [-k SUBSTRING] [-v]
"""
import argparse
import json
import os
import random
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "cases")
CRASH_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error",
                 "core dumped", "Segmentation fault", "Aborted", "internal error")


def safetensors_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, data, off = {}, b"", 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def make_fixtures(d):
    good = safetensors_bytes([
        ("layers.0.wq", "F32", [4, 4], struct.pack("<16f", *range(16))),
        ("half", "F16", [4, 4], struct.pack("<16e", *range(16))),
        ("shorts", "I16", [4], struct.pack("<4h", 1, 2, 3, 4)),
    ], {"format": "pt"})
    files = {
        "good.safetensors": good,
        # data cut short: the header promises more than the file holds
        "truncated.safetensors": good[:-10],
        # the header itself cut short
        "truncated_header.safetensors": good[:40],
        "corrupt.safetensors": struct.pack("<Q", 24) + b'{"layers.0.wq": {"dtype"',
    }
    for name, raw in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(raw)


def generated_cases(d):
    """Cases that cannot carry a comment header: (file, expect, args)."""
    out = []
    p = os.path.join(d, "empty.yaml")
    open(p, "wb").close()
    out.append((p, "1:1: empty model file", []))
    rng = random.Random(7)
    p = os.path.join(d, "binary.yaml")
    with open(p, "wb") as f:
        f.write(bytes([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]) + bytes(rng.randrange(256) for _ in range(512)))
    out.append((p, "1:1: not a valid text file", []))
    p = os.path.join(d, "latin1.yaml")
    with open(p, "wb") as f:
        f.write(b"smelt: 1\nname: caf\xe9\noutputs: []\n")
    out.append((p, "2:11: not a valid text file", []))
    return out


def read_header(path):
    expect, args = None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            m = re.match(r"#\s*expect:\s*(.*\S)", line)
            if m:
                expect = m.group(1)
            m = re.match(r"#\s*args:\s*(.*\S)", line)
            if m:
                args = shlex.split(m.group(1))
    return expect, args


def check(smelt, path, expect, args, tmp, verbose):
    m = re.match(r"(\d+):(\d+):\s*(.*)", expect)
    if m:
        want_prefix = "%s:%s:%s: error: " % (path, m.group(1), m.group(2))
        want_msg = m.group(3)
    else:
        want_prefix = "%s: error: " % path
        want_msg = expect
    problems = []
    commands = [
        [smelt, "run", path, "--device", "ref"] + args,
        [smelt, "compile", path, "-o", os.path.join(tmp, "out.ir")] + args,
    ]
    for cmd in commands:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120)
        except subprocess.TimeoutExpired:
            problems.append("%s: timed out" % cmd[1])
            continue
        err = r.stderr
        if verbose:
            print("  %s -> %d: %s" % (cmd[1], r.returncode, err.strip()))
        if r.returncode != 1:
            problems.append("%s: exit status %d, expected 1" % (cmd[1], r.returncode))
        for marker in CRASH_MARKERS:
            if marker in err:
                problems.append("%s: stderr shows '%s'" % (cmd[1], marker))
        pos = err.find(want_prefix)
        if pos < 0:
            problems.append("%s: stderr lacks '%s'" % (cmd[1], want_prefix))
        elif want_msg not in err[pos:]:
            problems.append("%s: stderr lacks '%s' after the location" % (cmd[1], want_msg))
        if problems and not verbose:
            problems.append("%s: stderr was: %s" % (cmd[1], err.strip()[:400]))
            break
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("-k", default="", help="only cases whose file name contains this")
    ap.add_argument("-v", action="store_true")
    opts = ap.parse_args()
    smelt = os.path.abspath(opts.smelt)
    tmp = tempfile.mkdtemp(prefix="smelt_bad_")
    failures, count = 0, 0
    try:
        make_fixtures(tmp)
        cases = []
        for name in sorted(os.listdir(CASES)):
            if not name.endswith(".yaml"):
                continue
            dst = os.path.join(tmp, name)
            shutil.copyfile(os.path.join(CASES, name), dst)
            expect, args = read_header(dst)
            if expect is None:
                print("FAIL %s: no '# expect:' line" % name)
                failures += 1
                continue
            cases.append((dst, expect, args))
        cases += generated_cases(tmp)
        for path, expect, args in cases:
            name = os.path.basename(path)
            if opts.k not in name:
                continue
            count += 1
            problems = check(smelt, path, expect, args, tmp, opts.v)
            if problems:
                failures += 1
                print("FAIL %s (expect %s)" % (name, expect))
                for p in problems:
                    print("    " + p)
            elif opts.v:
                print("ok   %s" % name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_bad_inputs: %d cases, %d failed" % (count, failures))
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
