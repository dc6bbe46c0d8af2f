#!/usr/bin/env python3
"""examples/tiny_lm.yaml on the CPU target, one session, against numpy.

The model is compiled with `smelt compile --target cpu --dim seq=1,5` (a
bundle of two specialisations: the prefill of a 5-token prompt and the
decode step) and driven through the C API of libsmelt_runtime.so (ctypes),
since the KV caches are session state that must persist across runs (a
`smelt run` process runs once).  The session picks the specialisation from
the shapes bound (smelt_session_bind_input_shaped).

The check is an independent numpy transcription of the same model
(tests/e2e/reference.py: rms_norm, rope, causal attention), in float64, with
no cache at all: step t recomputes the whole sequence so far and takes the
last row.  What must hold:
  - prefill of the prompt (pos 0..4), then 8 greedy decode steps feeding
    `next` back (pos 5, 6, ...): every `next` equals numpy's argmax, every
    logits row is close to numpy's (rtol/atol 1e-4; f32 against f64);
  - the caches, read with smelt_session_read_state, hold numpy's rotated
    keys / values at positions 0..12 and zeros beyond;
  - smelt_session_reset_state zeroes them: the prefill again gives the
    same logits bit for bit, and a decode step after a reset differs from
    the one with the cache (the state is really read).
Exits 77 (skip) when the runtime library is not next to the smelt binary.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import reference as ref  # noqa: E402

PROMPT = [17, 200, 3, 99, 42]
STEPS = 8
LAYERS, HEADS, KV_HEADS, HEAD_DIM, CTX = 2, 4, 2, 16, 128


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * 8)]


class Smelt:
    def __init__(self, path):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
        import asan_preload  # noqa: E402
        asan_preload.reexec_if_sanitized(path)
        L = ctypes.CDLL(path)
        P = ctypes.c_void_p
        L.smelt_status_message.restype = ctypes.c_char_p
        L.smelt_status_message.argtypes = [P]
        L.smelt_status_free.argtypes = [P]
        L.smelt_bundle_open.restype = P
        L.smelt_bundle_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
        L.smelt_bundle_close.argtypes = [P]
        L.smelt_bundle_num_specialisations.argtypes = [P]
        L.smelt_session_create.restype = P
        L.smelt_session_create.argtypes = [P, ctypes.c_char_p, P, ctypes.POINTER(P)]
        L.smelt_session_destroy.argtypes = [P]
        L.smelt_session_bind_input_shaped.restype = P
        L.smelt_session_bind_input_shaped.argtypes = [P, ctypes.c_char_p, P, ctypes.c_int,
                                                      ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
        L.smelt_session_bind_output.restype = P
        L.smelt_session_bind_output.argtypes = [P, ctypes.c_char_p, P, ctypes.c_size_t]
        L.smelt_session_run.restype = P
        L.smelt_session_run.argtypes = [P]
        L.smelt_session_specialisation.argtypes = [P]
        L.smelt_session_num_states.argtypes = [P]
        L.smelt_session_state_info.argtypes = [P, ctypes.c_int, ctypes.POINTER(TensorInfo)]
        L.smelt_session_reset_state.restype = P
        L.smelt_session_reset_state.argtypes = [P]
        L.smelt_session_read_state.restype = P
        L.smelt_session_read_state.argtypes = [P, ctypes.c_char_p, P, ctypes.c_size_t]
        self.L = L

    def ok(self, st, what):
        if st:
            msg = self.L.smelt_status_message(st).decode()
            self.L.smelt_status_free(st)
            raise RuntimeError(f"{what}: {msg}")


class Session:
    def __init__(self, sm, bundle_path):
        self.sm, L = sm, sm.L
        self.bundle, self.sess = ctypes.c_void_p(), ctypes.c_void_p()
        sm.ok(L.smelt_bundle_open(bundle_path.encode(), ctypes.byref(self.bundle)), "smelt_bundle_open")
        sm.ok(L.smelt_session_create(self.bundle, b"cpu", None, ctypes.byref(self.sess)), "smelt_session_create")
        self.logits = np.zeros((1, 256), np.float32)
        self.next = np.zeros((1,), np.int32)
        self.keep = []

    def close(self):
        self.sm.L.smelt_session_destroy(self.sess)
        self.sm.L.smelt_bundle_close(self.bundle)

    def bind(self, name, a):
        dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        self.keep.append(a)
        self.sm.ok(self.sm.L.smelt_session_bind_input_shaped(self.sess, name.encode(), a.ctypes.data, a.ndim, dims,
                                                             a.nbytes), f"bind {name}")

    def run(self, ids, pos):
        ids = np.ascontiguousarray(ids, np.int32)
        pos = np.ascontiguousarray(pos, np.int32)
        self.keep = []
        self.bind("ids", ids)
        self.bind("pos", pos)
        L = self.sm.L
        self.sm.ok(L.smelt_session_bind_output(self.sess, b"logits", self.logits.ctypes.data, self.logits.nbytes),
                   "bind logits")
        self.sm.ok(L.smelt_session_bind_output(self.sess, b"next", self.next.ctypes.data, self.next.nbytes),
                   "bind next")
        self.sm.ok(L.smelt_session_run(self.sess), "smelt_session_run")
        return self.logits.copy(), int(self.next[0])

    def states(self):
        L = self.sm.L
        out = {}
        for i in range(L.smelt_session_num_states(self.sess)):
            info = TensorInfo()
            L.smelt_session_state_info(self.sess, i, ctypes.byref(info))
            a = np.zeros(tuple(info.dims[:info.rank]), np.float32)
            self.sm.ok(L.smelt_session_read_state(self.sess, info.name, a.ctypes.data, a.nbytes), "read state")
            out[info.name.decode()] = a
        return out

    def reset(self):
        self.sm.ok(self.sm.L.smelt_session_reset_state(self.sess), "reset state")


# ---------------------------------------------------------------- numpy model


def load_params():
    w = ref.read_safetensors(os.path.join(ROOT, "examples", "tiny_llama.safetensors"))
    p = {"embed": w["embed"], "lm_head": w["lm_head"], "final_norm": np.ones(64)}
    for i in range(LAYERS):
        for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            p[f"layer.{i}/{n}"] = w[f"layers.{i}.{n}"]
        p[f"layer.{i}/attn_norm"] = np.ones(64)
        p[f"layer.{i}/ffn_norm"] = np.ones(64)
    return {k: np.asarray(v, np.float64) for k, v in p.items()}


def numpy_lm(tokens, p):
    """Logits of the last position and every layer's rotated keys and values
    [KV_HEADS, len, HEAD_DIM], recomputing the whole sequence (no cache)."""
    pos = np.arange(len(tokens))
    x = p["embed"][np.asarray(tokens)]
    kv = {}
    for i in range(LAYERS):
        w = lambda name: p[f"layer.{i}/{name}"]  # noqa: E731
        h = ref.rms_norm(x, w("attn_norm"), eps=1e-6)
        q = ref.rope(ref.heads(h @ w("wq"), HEADS), pos, style="half")
        k = ref.rope(ref.heads(h @ w("wk"), KV_HEADS), pos, style="half")
        v = ref.heads(h @ w("wv"), KV_HEADS)
        kv[f"layer.{i}/k_cache"], kv[f"layer.{i}/v_cache"] = k[0], v[0]
        x = x + ref.merge_heads(ref.attention(q, k, v, causal=True)) @ w("wo")
        h2 = ref.rms_norm(x, w("ffn_norm"), eps=1e-6)
        x = x + (ref.silu(h2 @ w("w_gate")) * (h2 @ w("w_up"))) @ w("w_down")
    hn = ref.rms_norm(x[-1:], p["final_norm"], eps=1e-6)
    return hn @ p["lm_head"].T, kv


# ---------------------------------------------------------------- the test


class Checks:
    def __init__(self):
        self.failures = 0

    def check(self, cond, what):
        if not cond:
            self.failures += 1
            print(f"FAIL  {what}")
        return cond


def close(got, want):
    return np.allclose(got, want, rtol=1e-4, atol=1e-4), float(np.max(np.abs(got - want)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    smelt = os.path.abspath(args.smelt)
    lib = os.path.join(os.path.dirname(smelt), "libsmelt_runtime.so")
    if not os.path.exists(lib):
        print(f"SKIP: no {lib}")
        return 77
    sm = Smelt(lib)
    p = load_params()
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="smelt_tiny_lm_") as tmp:
        bundle = os.path.join(tmp, "tiny_lm.smelt")
        r = subprocess.run([smelt, "compile", os.path.join(ROOT, "examples", "tiny_lm.yaml"), "-o", bundle,
                            "--target", "cpu", "--dim", "seq=1,5"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            print(f"FAIL  smelt compile: exit {r.returncode}: {r.stderr.strip()[:600]}")
            return 1
        s = Session(sm, bundle)
        try:
            tokens = list(PROMPT)
            logits, nxt = s.run(tokens, np.arange(len(tokens)))
            c.check(sm.L.smelt_session_specialisation(s.sess) >= 0, "a specialisation was chosen")
            first_prefill = logits.copy()
            gen = []
            worst = 0.0
            for step in range(STEPS + 1):
                want, _ = numpy_lm(tokens, p)
                ok, err = close(logits, want)
                worst = max(worst, err)
                c.check(ok, f"step {step} (len {len(tokens)}): logits max abs err {err:.3g}")
                top = np.sort(want[0])[-2:]
                c.check(nxt == int(np.argmax(want[0])),
                        f"step {step}: next {nxt}, numpy argmax {int(np.argmax(want[0]))} (top-2 gap {top[1] - top[0]:.3g})")
                c.check(nxt == int(np.argmax(logits[0])), f"step {step}: next {nxt} is not the argmax of its logits")
                gen.append(nxt)
                if step == STEPS:
                    break
                tokens.append(nxt)
                logits, nxt = s.run([nxt], [len(tokens) - 1])
            print(f"generated {gen}; logits max abs err over {STEPS + 1} runs {worst:.3g}")
            # the caches: numpy's keys and values at positions 0..len-1, zeros beyond
            _, kv = numpy_lm(tokens, p)
            st = s.states()
            c.check(sorted(st) == sorted(kv), f"states {sorted(st)}, want {sorted(kv)}")
            n = len(tokens)
            for name, want in kv.items():
                got = st.get(name)
                if got is None:
                    continue
                ok, err = close(got[0, :, :n], want)
                c.check(ok, f"state {name}[:, :{n}] max abs err {err:.3g}")
                c.check(not np.any(got[0, :, n:]), f"state {name}: slots {n}.. are not zero")
            # reset: the same prefill again, bit for bit; a decode without the cache differs
            s.reset()
            c.check(all(not np.any(a) for a in s.states().values()), "reset_state left a nonzero state")
            again, _ = s.run(list(PROMPT), np.arange(len(PROMPT)))
            c.check(np.array_equal(again, first_prefill), "the prefill after a reset differs from the first")
            with_cache, _ = s.run([tokens[len(PROMPT)]], [len(PROMPT)])
            s.reset()
            without, _ = s.run([tokens[len(PROMPT)]], [len(PROMPT)])
            c.check(not np.allclose(with_cache, without), "a decode step gives the same logits with and without the cache")
        finally:
            s.close()
    print(f"test_tiny_lm: {'FAILED' if c.failures else 'ok'} ({c.failures} failure(s))")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
