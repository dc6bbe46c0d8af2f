#!/usr/bin/env python3
"""smelt import hf against transformers itself (LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM on CPU torch), run by hand:

    pip install torch --index-url https://download.pytorch.org/whl/cpu transformers
    tests/hf/compare_transformers.py --smelt build/smelt

Exits 77 (skip) when torch or transformers is not importable, so it is not
named test_*.py: scripts/test.sh fails on a skipped non-GPU test.

For each random checkpoint (make_checkpoint.py) it compares, in f32:
  - transformers' logits of every position of a prompt with smelt's
    --no-cache model on the reference interpreter (and the CPU backend);
  - the same logits with test_hf_import.py's numpy model, which CI uses in
    transformers' place;
  - the last position's logits of the KV-cache form's prefill on ref;
  - 16 greedy tokens of model.generate with `smelt generate` on the CPU,
    when this smelt has it and its CPU kernels for the cache ops.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_checkpoint as mc  # noqa: E402
import test_hf_import as t  # noqa: E402

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"SKIP: {e} (pip install torch --index-url https://download.pytorch.org/whl/cpu transformers)")
    sys.exit(77)

CASES = [
    ("llama_gqa", dict(arch="llama"), {}),
    ("llama_sharded", dict(arch="llama"), {"shards": 3}),
    ("qwen2_bias_tied", dict(arch="qwen2", tied=True, theta=1e6, eps=1e-6), {}),
    ("mistral_rope_parameters", dict(arch="mistral", kv_heads=4, rope_layout="parameters", theta=5e5,
                                     sliding_window=4096), {}),
    ("llama_bias_head_dim", dict(arch="llama", attention_bias=True, mlp_bias=True, head_dim=24), {}),
    ("llama3_scaling", dict(arch="llama", theta=500000.0,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), {}),
    ("linear_scaling", dict(arch="llama", rope_layout="parameters",
                            rope_scaling={"type": "linear", "factor": 4.0}), {}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--cpu", action="store_true", help="also run the --no-cache models on the CPU backend")
    a = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    tmp = tempfile.mkdtemp(prefix="smelt_hf_tf_")
    sm = t.Smelt(a.smelt, tmp)
    prompt = t.PROMPT
    try:
        for seed, (name, kw, wk) in enumerate(CASES):
            ck = os.path.join(tmp, name)
            cfg = mc.make_config(dtype="f32", **kw)
            mc.write_checkpoint(ck, cfg, "f32", wk.get("shards", 1), seed)
            model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32, attn_implementation="eager")
            model.eval()
            with torch.no_grad():
                ref = model(torch.tensor([prompt])).logits[0].double().numpy()
            mine = t.llama_logits(cfg, mc.read_checkpoint(ck), prompt)
            t.check(t.rel_l2(mine, ref) <= 1e-5,
                    f"{name}: {type(model).__name__}: the CI's numpy model vs transformers rel L2 "
                    f"{t.rel_l2(mine, ref):.2e}")
            y = os.path.join(tmp, name + ".yaml")
            r = sm.import_hf(ck, y, "--no-cache")
            if not t.check(r.returncode == 0, f"{name}: import hf --no-cache"):
                continue
            for dev in ["ref"] + (["cpu"] if a.cpu else []):
                got = sm.logits(y, prompt, dev)
                if got is None:
                    if "weights must be a string" in open(y).read() or wk.get("shards"):
                        t.skip(f"{name}: not run on {dev}: this smelt's loader takes one weights file")
                    else:
                        t.check(False, f"{name}: smelt run --device {dev}")
                    continue
                t.check(t.rel_l2(got, ref) <= 1e-5 and (got.argmax(-1) == ref.argmax(-1)).all(),
                        f"{name} on {dev}: smelt --no-cache vs transformers: logits {got.shape} rel L2 "
                        f"{t.rel_l2(got, ref):.2e}")
            # the cache form: prefill on ref, generation on cpu
            yc = os.path.join(tmp, name + "_cache.yaml")
            if sm.import_hf(ck, yc, "--ctx", "64").returncode != 0:
                t.check(False, f"{name}: import hf (cache)")
                continue
            d = tempfile.mkdtemp(dir=tmp)
            np.save(f"{d}/ids.npy", np.asarray(prompt, np.int32))
            np.save(f"{d}/pos.npy", np.arange(len(prompt), dtype=np.int32))
            r = sm.run("run", yc, "--device", "ref", "--dim", f"seq={len(prompt)}", "--input", f"ids={d}/ids.npy",
                       "--input", f"pos={d}/pos.npy", "--output", f"logits={d}/l.npy")
            if r.returncode == 0:
                got = np.load(f"{d}/l.npy")[0]
                t.check(t.rel_l2(got, ref[-1]) <= 1e-5,
                        f"{name}: KV-cache prefill on ref vs transformers: last logits rel L2 "
                        f"{t.rel_l2(got, ref[-1]):.2e}")
            elif wk.get("shards") and "weights must be a string" in r.stderr:
                t.skip(f"{name}: cache prefill not run: one weights file only")
            else:
                t.check(False, f"{name}: KV-cache prefill on ref: {r.stderr.strip()[:200]}")
            with torch.no_grad():
                gen = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                     eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
            r = sm.run("generate", yc, "--prompt-ids", ",".join(map(str, prompt)), "-n", "16", "--device", "cpu",
                       "--json", "--quiet")
            if r.returncode != 0:
                t.skip(f"{name}: smelt generate not compared: {(r.stderr.strip().splitlines() or ['?'])[-1][:160]}")
                continue
            ids = json.loads(r.stdout)["ids"]
            t.check(ids == gen, f"{name}: 16 greedy tokens, smelt generate (cpu) vs model.generate: "
                    f"{'equal' if ids == gen else f'{ids} vs {gen}'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if t.FAILED:
        print(f"{len(t.FAILED)} failed")
        return 1
    print(f"all passed{f' ({len(t.SKIPPED)} parts skipped)' if t.SKIPPED else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
