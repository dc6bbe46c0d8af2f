#!/usr/bin/env python3
"""Writes examples/tiny_llama.safetensors, the weights tiny_llama.yaml and tiny_lm.yaml read.

The file is generated rather than committed: it is a few hundred KB of random
numbers that a fixed seed reproduces exactly.  numpy only, so it runs on any
machine that runs the tests.

The safetensors layout (https://github.com/huggingface/safetensors):
  8 bytes   little-endian u64 N, the length of the header
  N bytes   JSON {name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}}
            padded with spaces so the data starts 8-byte aligned
  rest      the tensors' bytes, each at [b, e) relative to the end of the header

Idempotent: the same bytes every run, and an existing identical file is left
untouched (so its timestamp does not trigger rebuilds).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

SEED = 1234
# Must agree with the dims of tiny_llama.yaml and tiny_lm.yaml.
DIMS = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=176, layers=2, vocab=256)


def tiny_llama_tensors():
    """The tensors in file order: (name, float32 array)."""
    rng = np.random.default_rng(SEED)
    hidden, ffn = DIMS["hidden"], DIMS["ffn"]
    kv_dim = DIMS["kv_heads"] * DIMS["head_dim"]
    shapes = [
        ("wq", (hidden, DIMS["heads"] * DIMS["head_dim"])),
        ("wk", (hidden, kv_dim)),
        ("wv", (hidden, kv_dim)),
        ("wo", (DIMS["heads"] * DIMS["head_dim"], hidden)),
        ("w_gate", (hidden, ffn)),
        ("w_up", (hidden, ffn)),
        ("w_down", (ffn, hidden)),
    ]
    out = []
    for i in range(DIMS["layers"]):
        for short, shape in shapes:
            # std 1/sqrt(fan_in) keeps activations of order 1 through the
            # layers, so the end-to-end comparison checks real numbers rather
            # than values that have collapsed towards zero.
            w = rng.standard_normal(shape) / np.sqrt(shape[0])
            out.append((f"layers.{i}.{short}", w.astype("<f4")))
    # tiny_lm.yaml (the causal LM around the same layers): the token
    # embedding and the LM head, HF layout [vocab, hidden], from a generator
    # of their own so that the layers' weights above stay as they were.
    rng_lm = np.random.default_rng(SEED + 1)
    out.append(("embed", rng_lm.standard_normal((DIMS["vocab"], hidden)).astype("<f4")))
    out.append(("lm_head", (rng_lm.standard_normal((DIMS["vocab"], hidden)) / np.sqrt(hidden)).astype("<f4")))
    return out


def safetensors_bytes(tensors):
    header = {}
    offset = 0
    for name, arr in tensors:
        n = arr.nbytes
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"generator": "smelt examples/gen_weights.py", "seed": str(SEED)}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-len(text)) % 8)
    parts = [struct.pack("<Q", len(text)), text]
    parts += [np.ascontiguousarray(arr).tobytes() for _, arr in tensors]
    return b"".join(parts)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=os.path.join(here, "tiny_llama.safetensors"))
    args = ap.parse_args()

    data = safetensors_bytes(tiny_llama_tensors())
    try:
        with open(args.output, "rb") as f:
            if f.read() == data:
                print(f"{args.output}: up to date")
                return 0
    except FileNotFoundError:
        pass
    tmp = args.output + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, args.output)  # never leave a half-written file behind
    print(f"{args.output}: wrote {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
