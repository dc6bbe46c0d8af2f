#!/usr/bin/env python3
"""`smelt generate` on the CPU against an independent numpy model.

examples/tiny_lm.yaml keeps its KV cache as session state: generate prefills
the prompt in one run (seq = prompt length), then decodes one token per run
(seq = 1) against the cache it updates in place.  The numpy model here has
no cache at all: for every new token it runs the whole sequence again with
causal attention, so it checks the cache (positions written, valid lengths
read, nothing lost between runs) rather than re-implementing it.

Checked:
  1. greedy ids for 64 steps equal numpy's (f32);
  2. the same ids from a bundle with prefill chunks of 4 and 1
     (--dim seq=1,4: the prompt of 7 is prefilled as 4 + 1 + 1 + 1);
  3. --json reports the timings and the bandwidth floor;
  4. sampling with a seed is reproducible, and differs from greedy;
  5. bad input: a prompt longer than the cache, an id outside the vocabulary,
     a model without state, unknown flags -> exit 1 or 2 with a message.

Usage: test_generate.py --smelt PATH
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import reference  # noqa: E402

MODEL = os.path.join(ROOT, "examples", "tiny_lm.yaml")
WEIGHTS = os.path.join(ROOT, "examples", "tiny_llama.safetensors")
PROMPT = [4, 44, 208, 166, 233, 128, 155]  # greedy visits 46 distinct ids in 64 steps
STEPS = 64

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def numpy_lm(w, ids, layers=2, n_heads=4, n_kv=2):
    """Logits of the last position of ids, the whole sequence recomputed."""
    x = w["embed"][np.asarray(ids)].astype(np.float64)
    pos = np.arange(len(ids))
    for i in range(layers):
        p = lambda n: w[f"layers.{i}.{n}"].astype(np.float64)  # noqa: E731
        h = reference.rms_norm(x, np.ones(64), eps=1e-6)
        q = reference.rope(reference.heads(h @ p("wq"), n_heads), pos)
        k = reference.rope(reference.heads(h @ p("wk"), n_kv), pos)
        v = reference.heads(h @ p("wv"), n_kv)
        x = x + reference.merge_heads(reference.attention(q, k, v, causal=True)) @ p("wo")
        h2 = reference.rms_norm(x, np.ones(64), eps=1e-6)
        x = x + (reference.silu(h2 @ p("w_gate")) * (h2 @ p("w_up"))) @ p("w_down")
    last = reference.rms_norm(x[-1:], np.ones(64), eps=1e-6)
    return (last @ w["lm_head"].astype(np.float64).T)[0]


def numpy_greedy(w, prompt, n):
    ids, out = list(prompt), []
    for _ in range(n):
        t = int(np.argmax(numpy_lm(w, ids)))
        out.append(t)
        ids.append(t)
    return out


def smelt(exe, args):
    return subprocess.run([exe] + args, capture_output=True, text=True, cwd=ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    exe = os.path.abspath(ap.parse_args().smelt)
    if not os.path.exists(WEIGHTS):
        print("FAIL examples/tiny_llama.safetensors missing (run examples/gen_weights.py)")
        return 1
    w = reference.read_safetensors(WEIGHTS)
    want = numpy_greedy(w, PROMPT, STEPS)
    ids = ",".join(map(str, PROMPT))

    r = smelt(exe, ["generate", MODEL, "--prompt-ids", ids, "-n", str(STEPS), "--json", "--threads", "2"])
    check(r.returncode == 0, f"generate tiny_lm -n {STEPS} (rc {r.returncode}: {r.stderr.strip()[-300:]})")
    got = json.loads(r.stdout) if r.returncode == 0 else {}
    check(got.get("ids") == want, f"greedy ids equal numpy's for {STEPS} steps "
          f"(first difference at {next((i for i, (a, b) in enumerate(zip(got.get('ids', []), want)) if a != b), None)})")
    check(got.get("prefill_runs") == 1, "a YAML model's prompt is prefilled in one run")
    for key in ("prefill_ms", "ttft_ms", "decode_ms_per_token", "decode_tokens_per_s", "floor_fraction",
                "copy_bandwidth_gbs", "weight_bytes"):
        check(isinstance(got.get(key), (int, float)) and got.get(key) > 0, f"--json reports {key} > 0")

    with tempfile.TemporaryDirectory() as d:
        b = os.path.join(d, "lm.smelt")
        r = smelt(exe, ["compile", MODEL, "-o", b, "--dim", "seq=1,4"])
        check(r.returncode == 0, f"compile tiny_lm --dim seq=1,4 ({r.stderr.strip()[-200:]})")
        r = smelt(exe, ["generate", b, "--prompt-ids", ids, "-n", "24", "--json"])
        got = json.loads(r.stdout) if r.returncode == 0 else {}
        check(got.get("ids") == want[:24], f"a bundle of seq=1,4 gives the same 24 ids ({r.stderr.strip()[-200:]})")
        check(got.get("prefill_runs") == 4, "the prompt of 7 is prefilled in chunks 4+1+1+1")
        r = smelt(exe, ["generate", b, "--prompt-ids", ids, "-n", "4"])
        lines = r.stdout.strip().split("\n")
        check(r.returncode == 0 and lines[0] == " ".join(map(str, want[:4])) and "tokens/s" in r.stdout,
              "plain output: the ids on the first line, then the timings")

        # sampling
        s1 = smelt(exe, ["generate", b, "--prompt-ids", ids, "-n", "16", "--temperature", "1.5", "--seed", "5", "--json"])
        s2 = smelt(exe, ["generate", b, "--prompt-ids", ids, "-n", "16", "--temperature", "1.5", "--seed", "5", "--json"])
        s3 = smelt(exe, ["generate", b, "--prompt-ids", ids, "-n", "16", "--temperature", "1.5", "--top-k", "1", "--json"])
        i1 = json.loads(s1.stdout)["ids"] if s1.returncode == 0 else None
        i2 = json.loads(s2.stdout)["ids"] if s2.returncode == 0 else None
        i3 = json.loads(s3.stdout)["ids"] if s3.returncode == 0 else None
        check(i1 is not None and i1 == i2, "sampling with the same seed gives the same ids")
        check(i1 != want[:16], "sampling at temperature 1.5 differs from greedy")
        check(i3 == want[:16], "top-k 1 is greedy")

        # bad input
        r = smelt(exe, ["generate", b, "--prompt-ids", ids, "-n", "200"])
        check(r.returncode == 1 and "positions" in r.stderr and "128" in r.stderr,
              f"more tokens than the cache holds: exit 1 ({r.stderr.strip()[:160]})")
        r = smelt(exe, ["generate", b, "--prompt-ids", "1,256", "-n", "2"])
        check(r.returncode == 1 and "vocabulary" in r.stderr, "an id outside the vocabulary: exit 1")
        r = smelt(exe, ["generate", b, "--prompt-ids", "1,x", "-n", "2"])
        check(r.returncode == 2, "a malformed prompt: exit 2")
        r = smelt(exe, ["generate", b, "-n", "2"])
        check(r.returncode == 2 and "prompt" in r.stderr, "no prompt: exit 2")
        r = smelt(exe, ["generate", b, "--prompt-ids", "1", "--bogus"])
        check(r.returncode == 2, "an unknown flag: exit 2")
        r = smelt(exe, ["generate", os.path.join(ROOT, "examples", "mlp.yaml"), "--prompt-ids", "1", "-n", "2"])
        check(r.returncode == 1 and "cannot generate" in r.stderr, f"a model that is not an LM: exit 1 ({r.stderr.strip()[:160]})")
        r = smelt(exe, ["generate", "--help"])
        check(r.returncode == 0 and "--prompt-ids" in r.stdout, "--help")
    print(f"test_generate: {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
