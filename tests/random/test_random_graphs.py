#!/usr/bin/env python3
"""Random-graph differential testing: smelt's kernels against its reference
interpreter on random valid models (issue 16, Deliver 2).

First every regression case in tests/random/cases/ (minimised failures that
were found this way, each naming what it caught), then COUNT models from
gen_graphs.py.  Each model is compiled for the CPU twice, at the machine's
fusion budget and at `--onchip-bytes 64` (fusion stops almost everywhere:
every value goes to memory), and each bundle is run with `--check`
(outputs against the interpreter) and `--check=groups` (every fused
group's values against the unfused interpreter).  Every CUDA_EVERY-th model
(and every case) is also compiled with `--target cuda` at both budgets:
NVRTC only, no GPU needed; without NVRTC that part is skipped and the log
says so (SMELT_TEST_REQUIRE=nvrtc makes that a failure).  Every
TP_EVERY-th model (4) with a matmul is also compiled with `--tp 2` (the
shard pass) and run with both checks, against the interpreter running both
ranks' graphs with its own collectives.

A failure is reported with its class (invalid model: a generator bug; compile
error; check failure; crash; timeout), the command that shows it, and the
model, cut down by a minimiser (values replaced by inputs of their shape,
outputs dropped, while the same class of failure stays); with --keep DIR the
model and its minimised form are written there.

Modes:
  default (ctest)          400 models, ~2 min on 2 idle cores
  SMELT_RANDOM_LONG=1      5000 models (and CUDA every 10th)
  SMELT_RANDOM_COUNT=N, SMELT_RANDOM_SEED=S   override
Usage: test_random_graphs.py --smelt PATH [--count N] [--seed S] [--jobs J]
       [--cuda-every K] [--tp-every K] [--keep DIR] [--start I]
"""
import argparse
import collections
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_graphs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = 64  # --onchip-bytes of the second compile
TIMEOUT = 120


class Fail(Exception):
    def __init__(self, klass, cmd, out):
        super().__init__(klass)
        self.klass, self.cmd, self.out = klass, cmd, out


# LeakSanitizer's stop-the-world tracer itself sometimes dies at exit, in
# containers and CI (google/sanitizers#1353): the program had finished and
# no leak was reported. Only that signature is run again, at most twice, and
# the summary counts it; any other crash, or a third tracer crash, fails.
LSAN_TRACER = re.compile(r"Tracer caught signal \d+.*\n(?:.*\n)*?.*LeakSanitizer has encountered a fatal error")
LSAN_RETRIES = 2
lsan_retried = [0]
lsan_lock = threading.Lock()


def run(smelt, args, env):
    cmd = [smelt] + args
    for attempt in range(LSAN_RETRIES + 1):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            raise Fail("timeout", cmd, "")
        if attempt == LSAN_RETRIES or not LSAN_TRACER.search(r.stderr):
            break
        with lsan_lock:
            lsan_retried[0] += 1
    return r, cmd


def classify(r, step):
    """The class of a failed step: what the minimiser must keep."""
    out = r.stdout + r.stderr
    if r.returncode < 0 or r.returncode >= 128:
        return "crash"
    if re.search(r"\.yaml:\d+:\d+: error:", out):
        return "invalid model"
    if step.startswith("check") and "FAIL" in out:
        return step + " mismatch"
    return step + " error"


def signature(klass, out):
    """Class plus the first error line with names and numbers taken out:
    the minimiser keeps a cut only when this stays the same."""
    line = next((l for l in out.splitlines() if "error" in l or "FAIL" in l or "cannot" in l), "")
    line = re.sub(r"'[^']*'", "'_'", line)
    line = re.sub(r"\b[kvxp]\d+\w*", "_", line)
    line = re.sub(r"[-+]?\d[\d.e+-]*", "N", line)
    return klass + ": " + line.strip()[:160]


def check_model(smelt, path, tmp, env, cuda, nvrtc, tp=False, split=None):
    """Runs every step on one model; raises Fail at the first that fails.
    Returns the number of CUDA compiles done; split[0] says whether the
    shard pass split anything (tp)."""
    ncuda = 0
    split = split if split is not None else [False]
    if tp:
        # split over 2 tensor-parallel ranks (passes/shard.c): the ranks'
        # kernels and in-process collectives against the reference
        # interpreter running every rank's graph with its own collectives
        bundle = os.path.join(tmp, "tp2.smelt")
        for step, args in (("tp compile", ["compile", path, "-o", bundle, "--no-cache", "--tp", "2", "--verbose"]),
                           ("check tp", ["run", bundle, "--device", "cpu", "--check"]),
                           ("check=groups tp", ["run", bundle, "--device", "cpu", "--check=groups"])):
            r, cmd = run(smelt, args, env)
            if r.returncode != 0:
                raise Fail(classify(r, step), cmd, r.stdout + r.stderr)
            if step == "tp compile":
                split[0] = not re.search(r"shard: rank 0 of 2: 0 matmuls split by columns, 0 by rows, 0 embeddings",
                                         r.stderr)
    for budget in (None, TINY):
        extra = ["--onchip-bytes", str(budget)] if budget else []
        bundle = os.path.join(tmp, "cpu%s.smelt" % (budget or ""))
        steps = [("compile", ["compile", path, "-o", bundle, "--no-cache"] + extra),
                 ("check", ["run", bundle, "--device", "cpu", "--check"]),
                 ("check=groups", ["run", bundle, "--device", "cpu", "--check=groups"])]
        for step, args in steps:
            r, cmd = run(smelt, args, env)
            if r.returncode != 0:
                raise Fail(classify(r, step), cmd, r.stdout + r.stderr)
        # --target cuda fuses by the CUDA-only rules (layout epilogues,
        # merged siblings); cpu,cuda hands the CPU's groups to the CUDA
        # lowering too
        for target in (["cuda"] if budget else ["cuda", "cpu,cuda"]):
            if not (cuda and nvrtc[0]):
                break
            args = ["compile", path, "-o", os.path.join(tmp, "cuda.smelt"), "--target", target, "--no-cache"] + extra
            r, cmd = run(smelt, args, env)
            out = r.stdout + r.stderr
            if r.returncode != 0 and re.search(r"no NVRTC|NVRTC library lacks|nvrtcVersion failed", out):
                nvrtc[0] = False
                nvrtc[1] = out.strip().splitlines()[-1] if out.strip() else "NVRTC missing"
            elif r.returncode != 0:
                raise Fail("crash" if r.returncode < 0 or r.returncode >= 128 else "cuda compile error", cmd, out)
            else:
                ncuda += 1
    return ncuda


def still_fails(smelt, m, sig, env, cuda):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.yaml")
        with open(path, "w") as f:
            f.write(m.yaml())
        try:
            check_model(smelt, path, tmp, env, cuda, [True, ""], tp="tp" in sig)
        except Fail as e:
            return signature(e.klass, e.out) == sig
    return False


def minimise(smelt, m, sig, env, cuda, budget_s=60):
    """Greedy: drop outputs, then replace values by inputs, from the first
    node on, as long as the failure keeps its signature."""
    t0 = time.monotonic()
    changed = True
    while changed and time.monotonic() - t0 < budget_s:
        changed = False
        for o in list(m.outputs):
            c = m.drop_output(o)
            if c is not None and still_fails(smelt, c, sig, env, cuda):
                m, changed = c, True
        for n in list(m.nodes):
            if time.monotonic() - t0 > budget_s:
                break
            outs = n["out"] if isinstance(n["out"], list) else [n["out"]]
            for o in outs:
                if o not in m.vals or not any(o in k["in"] for k in m.nodes):
                    continue
                c = m.cut(o)
                if c is not None and c.nodes and still_fails(smelt, c, sig, env, cuda):
                    m, changed = c, True
                    break
    return m


def has_cpu(smelt):
    r = subprocess.run([smelt, "run", "--help"], capture_output=True, text=True)
    return "cpu" in r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True)
    long_mode = os.environ.get("SMELT_RANDOM_LONG", "") not in ("", "0")
    ap.add_argument("--count", type=int, default=int(os.environ.get("SMELT_RANDOM_COUNT", 5000 if long_mode else 400)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SMELT_RANDOM_SEED", 1)))
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--cuda-every", type=int, default=10 if long_mode else 6)
    ap.add_argument("--tp-every", type=int, default=4)
    ap.add_argument("--keep", help="write failing models (and their minimised form) here")
    ap.add_argument("--no-minimise", action="store_true")
    ap.add_argument("--no-cases", action="store_true", help="skip tests/random/cases")
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    if not has_cpu(smelt):
        print("SKIP: this smelt has no CPU backend")
        return 77
    root = tempfile.mkdtemp(prefix="smelt_random_")
    env = dict(os.environ, SMELT_CACHE_DIR=os.path.join(root, "cache"))
    nvrtc = [True, ""]  # [available, why not]
    t0 = time.monotonic()
    fails = []
    stats = collections.Counter()
    ops = collections.Counter()
    lock = threading.Lock()

    def one(job):
        kind, name, make, idx = job
        tmp = os.path.join(root, name)
        os.makedirs(tmp, exist_ok=True)
        try:
            m = make()
            text = open(m).read() if kind == "case" else m.yaml()
        except Exception as e:  # a generator bug: reported like a failure
            with lock:
                fails.append(("generator", name, None, "", Fail("generator error", ["gen_graphs.model", name],
                                                               repr(e))))
            return
        path = os.path.join(tmp, name + ".yaml")
        with open(path, "w") as f:
            f.write(text)
        cuda = kind == "case" or args.cuda_every > 0 and idx % args.cuda_every == 0
        # the shard pass splits matmuls with constant weights and what follows
        tp = kind == "model" and args.tp_every > 0 and idx % args.tp_every == 0 and "matmul" in m.ops()
        split = [False]
        try:
            nc = check_model(smelt, path, tmp, env, cuda, nvrtc, tp, split)
            with lock:
                stats[kind] += 1
                stats["tp"] += tp
                stats["tp split"] += split[0]
                stats["cuda compiles"] += nc
                if kind == "model":
                    stats[m.dtype] += 1
                    ops.update(m.ops())
        except Fail as e:
            with lock:
                fails.append((kind, name, m, text, e))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    jobs = []
    if not args.no_cases:
        for c in sorted(glob.glob(os.path.join(HERE, "cases", "*.yaml"))):
            jobs.append(("case", os.path.basename(c)[:-5], (lambda c=c: c), 0))
    for i in range(args.start, args.start + args.count):
        jobs.append(("model", "rg%d_%d" % (args.seed, i), (lambda i=i: gen_graphs.model(args.seed, i)), i))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        list(ex.map(one, jobs))

    for kind, name, m, text, e in sorted(fails, key=lambda f: f[1]):
        sig = signature(e.klass, e.out)
        print("FAIL %s %s: %s\n  command: %s\n  %s" % (kind, name, e.klass, " ".join(e.cmd),
                                                       e.out.strip()[-1500:].replace("\n", "\n  ")))
        small = None
        if kind == "model" and not args.no_minimise:
            cuda = "cuda" in e.klass or "--target" in e.cmd
            small = minimise(smelt, m, sig, env, cuda)
            print("  minimised (%d of %d nodes), same failure (%s):" % (len(small.nodes), len(m.nodes), sig))
            print("    " + small.yaml().replace("\n", "\n    "))
        else:
            print("  model:\n    " + text.replace("\n", "\n    "))
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            with open(os.path.join(args.keep, name + ".yaml"), "w") as f:
                f.write(text)
            if small is not None:
                with open(os.path.join(args.keep, name + ".min.yaml"), "w") as f:
                    f.write("# %s\n" % sig + small.yaml())
    shutil.rmtree(root, ignore_errors=True)

    sec = time.monotonic() - t0
    print("cases: %d passed" % stats["case"])
    print("random models (seed %d, %d from %d): %d passed at both budgets (--onchip-bytes default, %d); "
          "f32 %d, f16 %d, bf16 %d" % (args.seed, args.count, args.start, stats["model"], TINY, stats["f32"],
                                       stats["f16"], stats["bf16"]))
    print("tensor parallel: %d models (every %d-th with a matmul) compiled with --tp 2 passed --check and "
          "--check=groups; the shard pass split %d of them" % (stats["tp"], args.tp_every, stats["tp split"]))
    if nvrtc[0]:
        print("CUDA (NVRTC, no GPU): %d compiles passed (every %d-th model and every case: cuda at both budgets, "
              "cpu,cuda)"
              % (stats["cuda compiles"], args.cuda_every))
    else:
        print("SKIPPED: CUDA compiles (%s)" % nvrtc[1])
    print("ops covered: " + ", ".join("%s %d" % kv for kv in sorted(ops.items())))
    missing = sorted(set(re.findall(r"^(\w+) ", subprocess.run([smelt, "ops"], capture_output=True,
                                                                 text=True).stdout, re.M)) - set(ops))
    if missing and args.count >= 100:
        print("ops no model used: " + ", ".join(missing))
    if lsan_retried[0]:
        print("LeakSanitizer's tracer crashed at exit and the step was run again: %d time(s)" % lsan_retried[0])
    by = collections.Counter(f[4].klass for f in fails)
    print("%d failure(s)%s in %.0f s" % (len(fails), " (" + ", ".join("%s %d" % kv for kv in by.items()) + ")"
                                         if fails else "", sec))
    if not nvrtc[0] and "nvrtc" in os.environ.get("SMELT_TEST_REQUIRE", "").split(","):
        print("FAIL: NVRTC required (SMELT_TEST_REQUIRE=nvrtc) but not available")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
