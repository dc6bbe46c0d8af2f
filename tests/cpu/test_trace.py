#!/usr/bin/env python3
"""`smelt bench --trace FILE.json`: a Chrome-trace/Perfetto timeline.

Checks the file's schema (traceEvents of complete "X" events with name, ts,
dur, pid, tid; metadata "M" events naming the tracks), that the kernel
events are those `smelt bench --json` reports, in table order, ordered in
time and not overlapping on their track, that each carries bytes, FLOPs and
tasks, and that they fit in the whole run's event.  Bad use: --trace
without a file, a file that cannot be written.  Also that --json stays
valid JSON for a model path with a quote, a backslash and a tab, and that
--perf-map writes perf's /tmp/perf-PID.map: one "START SIZE NAME" line
(hexadecimal) per function of the loaded CPU object, every kernel that
--json reports among them, in address order without overlaps; refused on
cuda.

Usage: test_trace.py --smelt PATH
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def perf_map(exe):
    r = subprocess.run([exe, "bench", "examples/tiny_llama.yaml", "--threads", "1", "--iters", "1", "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    kernels = [k["name"] for k in json.loads(r.stdout)["kernels"]] if r.returncode == 0 else []
    r = subprocess.run([exe, "bench", "examples/tiny_llama.yaml", "--threads", "1", "--iters", "1", "--perf-map"],
                       capture_output=True, text=True, cwd=ROOT)
    path = next((l.split(": ", 1)[1].strip() for l in r.stdout.splitlines() if l.startswith("perf map: ")), None)
    check(r.returncode == 0 and path is not None and os.path.basename(path).startswith("perf-"),
          f"bench --perf-map names its map ({path})")
    rows = []
    if path and os.path.exists(path):
        with open(path) as fp:
            for line in fp:
                a, n, name = line.split(None, 2)
                rows.append((int(a, 16), int(n, 16), name.strip()))
        os.remove(path)
    names = {n for _, _, n in rows}
    check(len(kernels) > 1 and all(k in names for k in kernels),
          f"the map names every kernel of the bench ({len(kernels)} kernels, {len(rows)} lines)")
    check(all(n > 0 for _, n, _ in rows) and all(a + n <= b for (a, n, _), (b, _, _) in zip(rows, rows[1:])),
          "the map's functions are in address order, sized, not overlapping")
    r = subprocess.run([exe, "bench", "examples/mlp.yaml", "--device", "cuda", "--perf-map"], capture_output=True,
                       text=True, cwd=ROOT)
    check(r.returncode == 2 and "--perf-map" in r.stderr, "--perf-map on cuda: exit 2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    exe = os.path.abspath(ap.parse_args().smelt)
    with tempfile.TemporaryDirectory() as d:
        tr = os.path.join(d, "t.json")
        r = subprocess.run([exe, "bench", "examples/mlp.yaml", "--threads", "2", "--iters", "3", "--json", "--trace", tr],
                           capture_output=True, text=True, cwd=ROOT)
        check(r.returncode == 0, f"bench --json --trace (rc {r.returncode}: {r.stderr.strip()[-200:]})")
        if r.returncode:
            return 1
        rep = json.loads(r.stdout)
        t = json.load(open(tr))
        ev = t.get("traceEvents")
        check(isinstance(ev, list) and ev, "traceEvents is a non-empty list")
        xs = [e for e in ev if e.get("ph") == "X"]
        ms = [e for e in ev if e.get("ph") == "M"]
        check(all(isinstance(e.get(k), (int, float)) for e in xs for k in ("ts", "dur", "pid", "tid")) and
              all(isinstance(e.get("name"), str) for e in xs), "every X event has name, ts, dur, pid, tid")
        check(all(e["dur"] >= 0 and e["ts"] >= 0 for e in xs), "times are non-negative")
        check({e["args"]["name"] for e in ms if e["name"] == "thread_name"} == {"kernels", "whole run"},
              "the tracks are named")
        kern = [e for e in xs if e.get("cat") == "kernel"]
        check([e["name"] for e in kern] == [k["name"] for k in rep["kernels"]],
              "one event per kernel, under the kernels' names, in order")
        check(all(all(k in e["args"] for k in ("bytes", "flops", "tasks")) for e in kern), "kernels carry bytes, flops, tasks")
        check(all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(kern, kern[1:])), "kernels do not overlap, in time order")
        run = [e for e in xs if e.get("cat") == "run"]
        check(len(run) == 1 and kern[-1]["ts"] + kern[-1]["dur"] <= run[0]["dur"] + 1e-3, "the kernels fit in the run")
        r = subprocess.run([exe, "bench", "examples/mlp.yaml", "--trace"], capture_output=True, text=True, cwd=ROOT)
        check(r.returncode == 2, "--trace without a file: exit 2")
        r = subprocess.run([exe, "bench", "examples/mlp.yaml", "--iters", "1", "--trace", os.path.join(d, "no", "t.json")],
                           capture_output=True, text=True, cwd=ROOT)
        check(r.returncode == 1 and "cannot write the trace" in r.stderr, "an unwritable trace file: exit 1")
        # --json is written by a JSON library: a model path with a quote, a
        # backslash and a tab still gives valid JSON that names it exactly
        odd = os.path.join(d, 'my "mlp"\\\tv1.yaml')
        with open(os.path.join(ROOT, "examples", "mlp.yaml")) as src, open(odd, "w") as dst:
            dst.write(src.read())
        r = subprocess.run([exe, "bench", odd, "--threads", "1", "--iters", "1", "--warmup", "0", "--json"],
                           capture_output=True, text=True, cwd=ROOT)
        try:
            got = json.loads(r.stdout).get("model")
        except ValueError as e:
            got = f"invalid JSON ({e})"
        check(r.returncode == 0 and got == odd, f"--json names a model path with a quote, backslash and tab exactly ({got!r})")
    perf_map(exe)
    print("test_trace: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
