#!/usr/bin/env python3
"""W5: a causal LM with TinyLlama-1.1B's real shapes, generating with a KV
cache, smelt next to Hugging Face transformers in one run (SPEC §8, issue 12).

  1. writes a random-weight checkpoint in HF layout (tests/hf/make_checkpoint.py:
     22 layers, hidden 2048, 32 heads of 64, 4 KV heads, FFN 5632, vocab 32000,
     rope 10000, eps 1e-5, f16), unless DIR already holds one;
  2. smelt import hf DIR -o DIR/w5.yaml --ctx CTX, then
     smelt compile --target cuda --dim seq=1,512 (decode and 512-token prefill);
  3. smelt generate at contexts 512 and 2048 (prompts of 512 and 2048 tokens,
     the latter prefilled in 4 runs of 512), greedy, --json;
  4. transformers' LlamaForCausalLM on the same weights (f16, CUDA): generate
     with a static cache, eager and with the forward under torch.compile
     mode="reduce-overhead"; decode time per token = (time of N+1 tokens -
     time of 1 token) / N, prefill = time of generating 1 token;
  5. the logits of smelt's first 16 steps (--dump-logits) against
     transformers' forward over the same ids (cosine per step).
Prints one table; --json FILE writes the numbers.

Usage: w5.py --smelt build/smelt [--dir /tmp/w5] [--steps 64] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = ["--hidden", "2048", "--heads", "32", "--kv-heads", "4", "--ffn", "5632", "--layers", "22",
          "--vocab", "32000", "--max-pos", "4096", "--theta", "10000", "--eps", "1e-5", "--dtype", "f16"]


def sh(cmd, **kw):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(f"FAILED ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}\n")
        raise SystemExit(1)
    return r, time.time() - t0


def smelt_side(args, d, prompts):
    ck = os.path.join(d, "config.json")
    if not os.path.exists(ck):
        sh([sys.executable, os.path.join(ROOT, "tests", "hf", "make_checkpoint.py"), d] + SHAPES)
    yml = os.path.join(d, "w5.yaml")
    sh([args.smelt, "import", "hf", d, "-o", yml, "--ctx", str(args.ctx)])
    bundle = os.path.join(d, "w5.smelt")
    _, tc = sh([args.smelt, "compile", yml, "--target", "cuda", "--dim", "seq=1,512", "-o", bundle])
    out = {"compile_s": tc}
    for ctx, p in prompts.items():
        dump = os.path.join(d, f"logits{ctx}.npy")
        r, _ = sh([args.smelt, "generate", bundle, "--device", "cuda", "--prompt-ids", ",".join(map(str, p)),
                   "-n", str(args.steps), "--json", "--quiet"])
        out[ctx] = json.loads(r.stdout)
        r, _ = sh([args.smelt, "generate", bundle, "--device", "cuda", "--prompt-ids", ",".join(map(str, p)),
                   "-n", "16", "--json", "--quiet", "--dump-logits", dump])
        out[ctx]["ids16"] = json.loads(r.stdout)["ids"]
        out[ctx]["logits16"] = np.load(dump)
    return out


def cuda_time(fn, reps=3):
    import torch
    best = 1e30
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def hf_side(args, d, prompts, sm):
    import torch
    from transformers import LlamaForCausalLM
    res = {}
    model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float16).cuda().eval()
    # logits: transformers' forward over the prompt and smelt's first 15 generated ids
    for ctx, p in prompts.items():
        ids = torch.tensor([list(p) + sm[ctx]["ids16"][:15]], device="cuda")
        with torch.no_grad():
            ref = model(ids).logits[0, len(p) - 1:].float().cpu().numpy()
        got = sm[ctx]["logits16"]
        n = min(len(ref), len(got))
        cos = [float(np.dot(ref[i], got[i]) / (np.linalg.norm(ref[i]) * np.linalg.norm(got[i]))) for i in range(n)]
        res[f"cos{ctx}"] = cos
    for mode in ("eager", "compiled"):
        try:
            if mode == "compiled":
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            for ctx, p in prompts.items():
                ids = torch.tensor([list(p)], device="cuda")
                gen = lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,  # noqa: E731
                                               cache_implementation="static", pad_token_id=0)
                with torch.no_grad():
                    gen(4), gen(args.steps + 1)  # warm up (compile, graphs)
                    t1 = cuda_time(lambda: gen(1))
                    tn = cuda_time(lambda: gen(args.steps + 1))
                res[f"{mode}_prefill_ms{ctx}"] = 1e3 * t1
                res[f"{mode}_decode_ms{ctx}"] = 1e3 * (tn - t1) / args.steps
        except Exception as e:  # noqa: BLE001
            res[f"{mode}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--dir", default="/tmp/w5")
    ap.add_argument("--ctx", type=int, default=4096, help="KV cache capacity")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rng = np.random.default_rng(0)
    prompts = {512: rng.integers(3, 32000, 512).tolist(), 2048: rng.integers(3, 32000, 2048).tolist()}
    sm = smelt_side(args, args.dir, prompts)
    hf = {} if args.no_peer else hf_side(args, args.dir, prompts, sm)
    print(f"\nW5 (TinyLlama-1.1B shapes, f16, random weights), {args.steps} decode steps; compile {sm['compile_s']:.1f} s")
    print(f"{'context':>8} {'smelt ms/tok':>13} {'floor ms':>9} {'%floor':>7} {'HF eager':>9} {'HF compiled':>12} "
          f"{'x compiled':>11} {'prefill512 ms':>14} {'HF c. prefill':>14} {'min cos16':>10}")
    table = {"smelt": {}, "hf": hf}
    for ctx in prompts:
        r = sm[ctx]
        e, c = hf.get(f"eager_decode_ms{ctx}"), hf.get(f"compiled_decode_ms{ctx}")
        cos = hf.get(f"cos{ctx}")
        print(f"{ctx:>8} {r['decode_ms_per_token']:>13.4f} {r['floor_ms_per_token']:>9.4f} {100 * r['floor_fraction']:>6.1f}% "
              f"{e if e is None else round(e, 3)!s:>9} {c if c is None else round(c, 3)!s:>12} "
              f"{'-' if not c else round(c / r['decode_ms_per_token'], 2)!s:>11} "
              f"{r['prefill_ms'] / r['prefill_runs']:>14.3f} {hf.get(f'compiled_prefill_ms{ctx}', '-')!s:>14} "
              f"{'-' if not cos else round(min(cos), 5)!s:>10}")
        table["smelt"][ctx] = {k: v for k, v in r.items() if k not in ("logits16", "ids16")}
    for k in ("eager_error", "compiled_error"):
        if k in hf:
            print(f"{k}: {hf[k]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
