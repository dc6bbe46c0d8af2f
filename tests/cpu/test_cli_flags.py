#!/usr/bin/env python3
""""Did you mean" for misspelled flags and commands (issue 13).

Every subcommand that refuses an unknown flag names the nearest flag of its
own --help (cli/flags.c): a dropped, doubled or swapped letter, a prefix of
one flag, a spelled-out value (--check=group).  A flag far from every known
one gets no suggestion, and a misspelled command gets the nearest command.
Each refusal is a usage error: exit 2, the message on stderr.  Also: every
suggestion the test expects is a flag the command's --help lists, and
docs/cli.md documents every flag each --help lists.

Usage: test_cli_flags.py --smelt PATH
"""
import argparse
import os
import re
import subprocess
import sys

FAILS = []

# (command words, typo, expected suggestion or None)
CASES = [
    (["run", "m.yaml"], "--chek", "--check"),
    (["run", "m.yaml"], "--devcie", "--device"),       # swapped neighbours
    (["run", "m.yaml"], "--outptu=x=y.npy", "--output"),  # with a value
    (["run", "m.yaml"], "--thr", "--threads"),          # a prefix of one flag
    (["run", "m.yaml"], "--check=group", "--check=groups"),
    (["run", "m.yaml"], "--rtoll", "--rtol"),
    (["run", "m.yaml"], "--xyzzy", None),
    (["bench", "m.yaml"], "--iter", "--iters"),
    (["bench", "m.yaml"], "--jsno", "--json"),
    (["compile", "m.yaml"], "--explain-fusoin", "--explain-fusion"),
    (["compile", "m.yaml"], "--print-ir-after-al", "--print-ir-after-all"),
    (["compile", "m.yaml"], "--targte", "--target"),
    (["inspect", "b.smelt"], "--kernel", "--kernels"),
    (["tune", "m.yaml"], "--dryrun", "--dry-run"),
    (["import", "m.onnx"], "--dtpye", "--dtype"),
    (["import", "hf", "d"], "--no-cahce", "--no-cache"),
    (["bench", "m.yaml"], "--zzzzzzzz", None),
]


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        print("    " + detail.replace("\n", "\n    "))
        FAILS.append(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    helps = {}
    for words, typo, want in CASES:
        r = subprocess.run([smelt, *words, typo], capture_output=True, text=True)
        cmd = " ".join(w for w in words if not w.endswith((".yaml", ".smelt", ".onnx")) and w != "d")
        unknown = f"smelt {cmd}: unknown flag '{typo}'"
        if want:
            ok = r.returncode == 2 and f"{unknown} (did you mean '{want}'?)" in r.stderr
            if cmd not in helps:
                helps[cmd] = subprocess.run([smelt, *cmd.split(), "--help"], capture_output=True, text=True).stdout
            listed = want in helps[cmd]
            check(ok and listed, f"smelt {cmd} {typo}: did you mean '{want}'" + ("" if listed else " (not in --help!)"),
                  r.stderr)
        else:
            ok = r.returncode == 2 and unknown in r.stderr and "did you mean" not in r.stderr
            check(ok, f"smelt {cmd} {typo}: no suggestion", r.stderr)
    for typo, want in (("complie", "compile"), ("runn", "run"), ("inspcet", "inspect"), ("frobnicate", None)):
        r = subprocess.run([smelt, typo], capture_output=True, text=True)
        first = r.stderr.splitlines()[0] if r.stderr else ""
        expect = f"smelt: unknown command '{typo}'" + (f" (did you mean '{want}'?)" if want else "")
        check(r.returncode == 2 and first == expect, f"smelt {typo}: {expect}", r.stderr)
    # docs/cli.md documents every flag each command's --help lists
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    doc = open(os.path.join(root, "docs", "cli.md")).read()
    for cmd in ("compile", "run", "inspect", "bench", "tune", "import", "generate"):
        h = subprocess.run([smelt, *cmd.split(), "--help"], capture_output=True, text=True).stdout
        flags = sorted(set(re.findall(r"(?:(?<=\s)|(?<=,))(--[a-z][a-z0-9-]*|-[a-z])\b", h)))
        missing = [f for f in flags if f"`{f}" not in doc]
        check(flags and not missing, f"docs/cli.md documents the {len(flags)} flags of smelt {cmd} --help",
              "missing: " + " ".join(missing))
    print("test_cli_flags: %d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
