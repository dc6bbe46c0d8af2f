#!/usr/bin/env python3
"""Pass tests: each tests/passes/cases/NAME.yaml is a small model whose
header says which passes to run (`# passes: const-fold,dce`, or `default`
for the default pipeline).  The test compiles it with
`smelt compile NAME.yaml -o OUT --passes ...` and compares OUT with the
expected IR in NAME.expected, printing a diff on mismatch.

A header line `# args: --onchip-bytes 64` adds options to that command.
Fusion groups print the on-chip budget they were checked against, which by
default is the L2 size of the machine; so that an expectation does not
depend on the machine running the test, every case gets
`--onchip-bytes %d` unless its args give a budget of their own.

    test_pass_cases.py --smelt build/smelt            # check every case
    test_pass_cases.py --smelt build/smelt NAME...    # check some cases
    test_pass_cases.py --smelt build/smelt --update   # rewrite expectations

--update writes whatever smelt prints now: read the new .expected files
(git diff) before accepting them.  A case without an .expected file fails
until one is written with --update.
"""
import argparse
import difflib
import os
import shlex
import subprocess
import sys
import tempfile

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")

# 1 MiB: a typical L2, and the budget every expectation was written with.
DEFAULT_ONCHIP_BYTES = 1048576
__doc__ = __doc__ % DEFAULT_ONCHIP_BYTES


def read_header(path, key):
    """The value of `# KEY: ...` in the header comment, or None."""
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            body = line[1:].strip()
            if body.startswith(key + ":"):
                return body[len(key) + 1:].strip()
    return None


def read_passes(path):
    """The pass list from the header comment, or None if there is none."""
    return read_header(path, "passes")


def read_args(path):
    """Extra command-line options from `# args:`, with the default budget."""
    args = shlex.split(read_header(path, "args") or "")
    if "--onchip-bytes" not in args:
        args += ["--onchip-bytes", str(DEFAULT_ONCHIP_BYTES)]
    return args


def compile_case(smelt, path, passes, out_path):
    cmd = [smelt, "compile", path, "-o", out_path, "--emit", "ir"]
    if passes != "default":
        cmd += ["--passes", passes]
    cmd += read_args(path)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def check_case(smelt, name, update, tmp):
    path = os.path.join(CASES, name + ".yaml")
    expected_path = os.path.join(CASES, name + ".expected")
    passes = read_passes(path)
    if not passes:
        return "no '# passes:' line in the header"
    out_path = os.path.join(tmp, name + ".ir")
    r = compile_case(smelt, path, passes, out_path)
    if r.returncode != 0:
        return "smelt compile exited with %d:\n%s" % (r.returncode, r.stderr)
    with open(out_path) as f:
        got = f.read()
    if update:
        with open(expected_path, "w") as f:
            f.write(got)
        return None
    if not os.path.exists(expected_path):
        return "no %s (write it with --update, then read it)" % os.path.relpath(expected_path)
    with open(expected_path) as f:
        want = f.read()
    if got == want:
        return None
    diff = difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                name + ".expected", "smelt output")
    return "IR differs from the expectation:\n" + "".join(diff)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smelt", required=True, help="path to the smelt binary")
    ap.add_argument("--update", action="store_true", help="rewrite the .expected files")
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    args = ap.parse_args()

    names = args.cases or sorted(f[:-5] for f in os.listdir(CASES) if f.endswith(".yaml"))
    if not names:
        print("no pass cases found in", CASES)
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            err = check_case(args.smelt, name, args.update, tmp)
            if err:
                failures += 1
                print("FAIL %s: %s" % (name, err))
            elif args.update:
                print("wrote %s.expected" % name)
    verb = "updated" if args.update else "passed"
    print("pass cases: %d of %d %s" % (len(names) - failures, len(names), verb))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
