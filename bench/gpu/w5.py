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

  6. with --quantize MODE[,MODE]: the same model compiled with `smelt
     compile --quantize MODE` (int4: groups of 128; int8, fp8: a scale per
     output channel), generating at the same contexts: its decode time
     against the f16 bundle's (issue 14: INT4 >= 2.5x f16 tokens/s), and the
     cosine of its first logits (the prompt's last position) against f16's.

Usage: w5.py --smelt build/smelt [--dir /tmp/w5] [--steps 64] [--json OUT] [--no-peer] [--no-static]
       [--hf-modes eager,compiled] [--contexts 512,2048] [--quantize int4,int8,fp8]
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
                   "-n", str(args.steps + 1), "--json", "--quiet"])
        out[ctx] = json.loads(r.stdout)
        r, _ = sh([args.smelt, "generate", bundle, "--device", "cuda", "--prompt-ids", ",".join(map(str, p)),
                   "-n", "16", "--json", "--quiet", "--dump-logits", dump])
        out[ctx]["ids16"] = json.loads(r.stdout)["ids"]
        out[ctx]["logits16"] = np.load(dump)
    return out


def quant_side(args, d, prompts, sm):
    """Each --quantize mode's bundle generating as the f16 one did."""
    yml = os.path.join(d, "w5.yaml")
    res = {}
    for mode in [m for m in args.quantize.split(",") if m]:
        bundle = os.path.join(d, f"w5_{mode}.smelt")
        group = ["--group", "128"] if mode == "int4" else ["--group", "0"]
        _, tc = sh([args.smelt, "compile", yml, "--target", "cuda", "--dim", "seq=1,512", "--quantize", mode] + group +
                   ["-o", bundle])
        res[mode] = {"compile_s": tc}
        for ctx, p in prompts.items():
            r, _ = sh([args.smelt, "generate", bundle, "--device", "cuda", "--prompt-ids", ",".join(map(str, p)),
                       "-n", str(args.steps + 1), "--json", "--quiet"])
            out = json.loads(r.stdout)
            dump = os.path.join(d, f"logits{ctx}_{mode}.npy")
            sh([args.smelt, "generate", bundle, "--device", "cuda", "--prompt-ids", ",".join(map(str, p)),
                "-n", "1", "--json", "--quiet", "--dump-logits", dump])
            a, b = np.load(dump)[0].astype(np.float64), sm[ctx]["logits16"][0].astype(np.float64)
            out["cos_first"] = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
            res[mode][ctx] = out
    return res


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
    for mode in [m for m in args.hf_modes.split(",") if m]:
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


def static_peer(model, prompts, steps, torch):
    """gpt-fast's recipe on transformers' weights: a plain torch decode step
    with static KV buffers written in place (index_copy_) and attention over
    the cache under a mask, compiled with mode="reduce-overhead" (CUDA
    graphs); the prefill of 512 runs the same code compiled for that shape.
    transformers' own generate under reduce-overhead fails with
    "accessing tensor output of CUDAGraphs that has been overwritten"."""
    import torch.nn.functional as F
    cfg = model.config
    L, H, KV = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    D = cfg.hidden_size // H
    C = 4096
    layers = [(l.input_layernorm.weight, l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight,
               l.self_attn.o_proj.weight, l.post_attention_layernorm.weight, l.mlp.gate_proj.weight,
               l.mlp.up_proj.weight, l.mlp.down_proj.weight) for l in model.model.layers]
    emb, norm, head = model.model.embed_tokens.weight, model.model.norm.weight, model.lm_head.weight
    theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
    ang = torch.arange(C, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1).half(), torch.cat([ang.sin()] * 2, -1).half()
    kc = torch.zeros(L, 1, KV, C, D, device="cuda", dtype=torch.float16)
    vc = torch.zeros_like(kc)
    eps = cfg.rms_norm_eps

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).half() * w

    def rot(x):
        return torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)

    def fwd(ids, pos):
        s = ids.shape[0]
        x = emb[ids]
        c, sn = cos[pos][None, None], sin[pos][None, None]
        mask = torch.arange(C, device="cuda")[None, :] <= pos[:, None]
        for i, (n1, wq, wk, wv, wo, n2, wg, wu, wd) in enumerate(layers):
            h = rms(x, n1)
            q = (h @ wq.T).view(1, s, H, D).transpose(1, 2)
            k = (h @ wk.T).view(1, s, KV, D).transpose(1, 2)
            v = (h @ wv.T).view(1, s, KV, D).transpose(1, 2)
            q, k = q * c + rot(q) * sn, k * c + rot(k) * sn
            kc[i].index_copy_(2, pos, k)
            vc[i].index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc[i], vc[i], attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(s, H * D) @ wo.T
            h2 = rms(x, n2)
            x = x + (F.silu(h2 @ wg.T) * (h2 @ wu.T)) @ wd.T
        return rms(x[-1:], norm) @ head.T

    step = torch.compile(fwd, mode="reduce-overhead", fullgraph=True)
    res = {}
    with torch.no_grad():
        for ctx, p in prompts.items():
            ids = torch.tensor(p, device="cuda")
            pos = torch.arange(len(p), device="cuda")
            pre = torch.compile(fwd, mode="reduce-overhead", fullgraph=True) if len(p) == 512 else None
            if pre:
                for _ in range(3):
                    pre(ids, pos)
                res["static_prefill_ms512"] = 1e3 * cuda_time(lambda: pre(ids, pos))
            else:
                for j in range(0, len(p), 512):
                    fwd(ids[j:j + 512], pos[j:j + 512])
            tok = torch.tensor([1], device="cuda")
            for j in range(5):  # warm up the step (compile, capture)
                step(tok, torch.tensor([len(p) + j], device="cuda"))
            pbuf = [torch.tensor([len(p) + j], device="cuda") for j in range(steps)]

            def decode():
                t = tok
                for j in range(steps):
                    t = step(t, pbuf[j]).argmax(-1).to(torch.int64)
            res[f"static_decode_ms{ctx}"] = 1e3 * cuda_time(decode) / steps
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--dir", default="/tmp/w5")
    ap.add_argument("--ctx", type=int, default=4096, help="KV cache capacity")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-static", action="store_true",
                    help="leave out the compiled static-cache torch peer (static_peer)")
    ap.add_argument("--hf-modes", default="eager,compiled",
                    help="transformers' generate modes to time (eager, compiled; '' for none)")
    ap.add_argument("--contexts", default="512,2048", help="prompt lengths (512 and/or 2048)")
    ap.add_argument("--quantize", default="", help="also the model compiled with --quantize MODE[,MODE] (int4, int8, fp8)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rng = np.random.default_rng(0)
    prompts = {512: rng.integers(3, 32000, 512).tolist(), 2048: rng.integers(3, 32000, 2048).tolist()}
    want = {int(c) for c in args.contexts.split(",") if c}
    prompts = {c: p for c, p in prompts.items() if c in want}
    sm = smelt_side(args, args.dir, prompts)
    qs = quant_side(args, args.dir, prompts, sm) if args.quantize else {}
    hf = {} if args.no_peer else hf_side(args, args.dir, prompts, sm)
    if not args.no_peer and not args.no_static:
        import torch
        from transformers import LlamaForCausalLM
        try:
            model = LlamaForCausalLM.from_pretrained(args.dir, torch_dtype=torch.float16).cuda().eval()
            hf.update(static_peer(model, prompts, args.steps, torch))
        except Exception as e:  # noqa: BLE001
            hf["static_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(f"\nW5 (TinyLlama-1.1B shapes, f16, random weights), {args.steps} decode steps; compile {sm['compile_s']:.1f} s")
    print(f"{'context':>8} {'smelt ms/tok':>13} {'floor ms':>9} {'%floor':>7} {'HF eager':>9} {'HF compiled':>12} "
          f"{'torch static c.':>16} {'x best peer':>12} {'prefill512 ms':>14} {'peer prefill':>13} {'min cos16':>10}")
    table = {"smelt": {}, "hf": hf}
    for ctx in prompts:
        r = sm[ctx]
        e, c = hf.get(f"eager_decode_ms{ctx}"), hf.get(f"compiled_decode_ms{ctx}")
        st_ = hf.get(f"static_decode_ms{ctx}")
        peers = [x for x in (e, c, st_) if x]
        best = min(peers) if peers else None
        cos = hf.get(f"cos{ctx}")
        pp = hf.get("static_prefill_ms512") if ctx == 512 else None
        rnd = lambda x: '-' if x is None else round(x, 3)  # noqa: E731
        print(f"{ctx:>8} {r['decode_ms_per_token']:>13.4f} {r['floor_ms_per_token']:>9.4f} {100 * r['floor_fraction']:>6.1f}% "
              f"{rnd(e)!s:>9} {rnd(c)!s:>12} {rnd(st_)!s:>16} "
              f"{'-' if not best else round(best / r['decode_ms_per_token'], 2)!s:>12} "
              f"{r['prefill_ms'] / r['prefill_runs']:>14.3f} {rnd(pp)!s:>13} "
              f"{'-' if not cos else round(min(cos), 5)!s:>10}")
        table["smelt"][ctx] = {k: v for k, v in r.items() if k not in ("logits16", "ids16")}
    for mode, q in qs.items():
        print(f"\nW5 with --quantize {mode} (compile {q['compile_s']:.1f} s)")
        print(f"{'context':>8} {'ms/tok':>9} {'f16 ms/tok':>11} {'x f16':>7} {'%floor':>7} {'cos first logits':>17}")
        for ctx in prompts:
            r, f = q[ctx], sm[ctx]
            print(f"{ctx:>8} {r['decode_ms_per_token']:>9.4f} {f['decode_ms_per_token']:>11.4f} "
                  f"{f['decode_ms_per_token'] / r['decode_ms_per_token']:>7.2f} {100 * r['floor_fraction']:>6.1f}% "
                  f"{r['cos_first']:>17.6f}")
        table[f"smelt_{mode}"] = {ctx: {k: v for k, v in q[ctx].items()} for ctx in prompts}
    for k in ("eager_error", "compiled_error", "static_error"):
        if k in hf:
            print(f"{k}: {hf[k]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
