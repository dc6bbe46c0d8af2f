#!/usr/bin/env python3
"""CPU decode of examples/tiny_lm.yaml: smelt generate next to PyTorch and
ONNX Runtime on the same weights, per-token time at a fixed thread count
(issue 12 part 6, SPEC §8 row C1).

The peers run the same model as a plain torch transcription with a static
KV cache (the gpt-fast recipe): one decode step writes the new key and value
at the position (index_copy_) and attends over the cache with a mask up to
the position.  ONNX Runtime runs that step exported with torch.onnx (the
caches are inputs and outputs, as ORT has no session state; IOBinding keeps
them as OrtValues between steps).  Every peer is checked to produce the
same greedy ids as smelt.

Usage: lm_peer.py --smelt build/smelt [--threads 2] [--prompt 16] [--steps 64]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import reference  # noqa: E402

H, NH, NKV, HD, FFN, L, V, CTX = 64, 4, 2, 16, 176, 2, 256, 128


def torch_model(w, torch):
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            t = lambda a: nn.Parameter(torch.tensor(np.asarray(a, np.float32)), requires_grad=False)  # noqa: E731
            self.embed, self.lm_head = t(w["embed"]), t(w["lm_head"])
            self.p = nn.ParameterList([t(w[f"layers.{i}.{n}"]) for i in range(L)
                                       for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")])
            inv = 10000.0 ** (-np.arange(0, HD // 2) * 2.0 / HD)
            ang = np.arange(CTX)[:, None] * inv[None, :]
            self.register_buffer("cos", torch.tensor(np.cos(ang), dtype=torch.float32))
            self.register_buffer("sin", torch.tensor(np.sin(ang), dtype=torch.float32))

        def rope(self, x, pos):
            c, s = self.cos[pos][None, None], self.sin[pos][None, None]
            x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

        @staticmethod
        def rms(x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

        def forward(self, ids, pos, kc, vc):
            """ids, pos [S]; kc, vc [L, 1, NKV, CTX, HD] (updated in place)."""
            s = ids.shape[0]
            x = self.embed[ids]
            mask = torch.arange(CTX)[None, :] <= pos[:, None]
            ks, vs = [], []
            for i in range(L):
                wq, wk, wv, wo, wg, wu, wd = self.p[7 * i:7 * i + 7]
                h = self.rms(x)
                q = self.rope((h @ wq).view(1, s, NH, HD).transpose(1, 2), pos)
                k = self.rope((h @ wk).view(1, s, NKV, HD).transpose(1, 2), pos)
                v = (h @ wv).view(1, s, NKV, HD).transpose(1, 2)
                if self.functional:  # for the ONNX export: new caches as outputs
                    ks.append(kc[i].index_copy(2, pos, k))
                    vs.append(vc[i].index_copy(2, pos, v))
                    kci, vci = ks[-1], vs[-1]
                else:  # in place, as a static cache runs in PyTorch
                    kc[i].index_copy_(2, pos, k)
                    vc[i].index_copy_(2, pos, v)
                    kci, vci = kc[i], vc[i]
                kk = kci.repeat_interleave(NH // NKV, 1)
                vv = vci.repeat_interleave(NH // NKV, 1)
                a = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
                x = x + a.transpose(1, 2).reshape(s, H) @ wo
                h2 = self.rms(x)
                x = x + (torch.nn.functional.silu(h2 @ wg) * (h2 @ wu)) @ wd
            logits = self.rms(x[-1:]) @ self.lm_head.T
            if self.functional:
                return logits, torch.stack(ks), torch.stack(vs)
            return logits, kc, vc

    m = LM().eval()
    m.functional = False
    return m


def time_torch(model, torch, prompt, steps, compiled=False):
    kc = torch.zeros(L, 1, NKV, CTX, HD)
    vc = torch.zeros(L, 1, NKV, CTX, HD)
    fn = torch.compile(model) if compiled else model
    with torch.no_grad():
        ids = torch.tensor(prompt)
        logits, _, _ = fn(ids, torch.arange(len(prompt)), kc, vc)
        out = [int(logits.argmax())]
        p = len(prompt)
        # warm (compile) on a throwaway copy of the caches
        kw, vw = kc.clone(), vc.clone()
        for j in range(3):
            fn(torch.tensor([out[-1]]), torch.tensor([p + j]), kw, vw)
        t0 = time.perf_counter()
        for _ in range(steps):
            logits, _, _ = fn(torch.tensor([out[-1]]), torch.tensor([p]), kc, vc)
            out.append(int(logits.argmax()))
            p += 1
        dt = time.perf_counter() - t0
    return out, 1e3 * dt / steps


def time_ort(model, torch, prompt, steps, threads, d):
    import onnxruntime as ort
    path = os.path.join(d, "lm_step.onnx")
    kc = torch.zeros(L, 1, NKV, CTX, HD)
    vc = torch.zeros(L, 1, NKV, CTX, HD)
    model.functional = True
    with torch.no_grad():
        torch.onnx.export(model, (torch.tensor([1]), torch.tensor([0]), kc.clone(), vc.clone()), path,
                          input_names=["ids", "pos", "kc", "vc"], output_names=["logits", "kc_out", "vc_out"],
                          dynamic_axes={"ids": {0: "s"}, "pos": {0: "s"}}, opset_version=17, dynamo=False)
    model.functional = False
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    k, v = np.zeros(kc.shape, np.float32), np.zeros(vc.shape, np.float32)
    lg, k, v = sess.run(None, {"ids": np.array(prompt, np.int64), "pos": np.arange(len(prompt), dtype=np.int64),
                               "kc": k, "vc": v})
    out, p = [int(lg.argmax())], len(prompt)
    t0 = time.perf_counter()
    for _ in range(steps):
        lg, k, v = sess.run(None, {"ids": np.array([out[-1]], np.int64), "pos": np.array([p], np.int64), "kc": k, "vc": v})
        out.append(int(lg.argmax()))
        p += 1
    return out, 1e3 * (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    w = reference.read_safetensors(os.path.join(ROOT, "examples", "tiny_llama.safetensors"))
    prompt = np.random.default_rng(0).integers(0, V, args.prompt).tolist()
    r = subprocess.run([args.smelt, "generate", os.path.join(ROOT, "examples", "tiny_lm.yaml"), "--prompt-ids",
                        ",".join(map(str, prompt)), "-n", str(args.steps + 1), "--json", "--threads", str(args.threads)],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit("smelt generate failed: " + r.stderr)
    sm = json.loads(r.stdout)
    model = torch_model(w, torch)
    rows = [("smelt", sm["ids"], sm["decode_ms_per_token"])]
    rows.append(("torch eager",) + time_torch(model, torch, prompt, args.steps))
    if not args.no_compile:
        try:
            rows.append(("torch.compile",) + time_torch(model, torch, prompt, args.steps, compiled=True))
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}")
    with tempfile.TemporaryDirectory() as d:
        try:
            rows.append(("onnxruntime",) + time_ort(model, torch, prompt, args.steps, args.threads, d))
        except Exception as e:  # noqa: BLE001
            print(f"onnxruntime failed: {type(e).__name__}: {str(e)[:300]}")
    print(f"\ntiny_lm decode on the CPU, {args.threads} threads, prompt {args.prompt}, {args.steps} steps")
    print(f"{'runner':<14} {'ms/token':>9} {'smelt speed-up':>15} {'same ids':>9}")
    for name, ids, ms in rows:
        same = ids[:args.steps] == sm["ids"][:args.steps]
        print(f"{name:<14} {ms:>9.4f} {ms / sm['decode_ms_per_token']:>14.2f}x {str(same):>9}")


if __name__ == "__main__":
    main()
