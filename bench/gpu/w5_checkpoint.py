#!/usr/bin/env python3
"""The W5 benchmark checkpoint: TinyLlama-1.1B's real shapes with random
weights, in Hugging Face layout, f16 (about 2.2 GB; never made in CI).

    bench/gpu/w5_checkpoint.py OUT_DIR [--shards N] [--dtype f16|bf16|f32] [--seed S]
    smelt import hf OUT_DIR -o w5.yaml [--ctx 2048]
    smelt generate w5.yaml --prompt-ids 1,2,3 -n 128 --device cuda

Shapes (TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json): 22 layers,
hidden 2048, 32 heads of 64, 4 KV heads (GQA 8:1), FFN 5632, vocab 32000,
rope_theta 10000, rms eps 1e-5, max_position_embeddings 2048, untied LM
head: 1,100,048,384 parameters.  tests/hf/make_checkpoint.py writes it
one tensor at a time, so memory stays at the largest tensor (the embedding,
262 MB in f32 before rounding).
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "hf"))
import make_checkpoint as mc  # noqa: E402

TINYLLAMA = dict(arch="llama", hidden=2048, heads=32, kv_heads=4, ffn=5632, layers=22, vocab=32000, max_pos=2048,
                 theta=10000.0, eps=1e-5, tied=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f16", "bf16", "f32"], default="f16")
    ap.add_argument("--shards", type=int, default=1, help="split into N files with model.safetensors.index.json")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = mc.make_config(dtype=a.dtype, **TINYLLAMA)
    n = sum(int(mc.np.prod(s)) for _, s, _ in mc.tensor_specs(cfg))
    t = time.time()
    mc.write_checkpoint(a.out, cfg, a.dtype, a.shards, a.seed)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"wrote {a.out}: TinyLlama-1.1B shapes, {n:,} parameters, {a.dtype}, {size / 1e9:.2f} GB "
          f"in {time.time() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
