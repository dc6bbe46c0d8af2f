#!/usr/bin/env python3
"""External weights are checked when the first session starts, not at open.

Through the C API of libsmelt_runtime.so (ctypes), on tiny_llama compiled
with --external-weights for the CPU and for CUDA (the CUDA part needs NVRTC
at compile time only; no GPU is used):

- intact weights: smelt_bundle_open and smelt_session_create succeed, and
  the CPU run equals the embedded bundle's outputs (bit for bit);
- a weights file changed by one byte (same size): smelt_bundle_open still
  succeeds for the CUDA bundle (nothing is read at open), and
  smelt_session_create is refused with a message naming the file and
  "not the one the bundle was compiled with"; a second session is refused
  the same way (the answer is kept); `smelt inspect`, which opens without
  code, refuses the bundle at open; for the CPU bundle (whose packed
  weights are made at open) smelt_bundle_open itself refuses it;
- a weights file of another size is refused at open, naming the file;
- the file at the recorded path changed, an intact copy beside the bundle:
  the session uses the intact copy (outputs equal).

Usage: test_weights_deferred.py --smelt PATH
"""
import argparse
import ctypes
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


class Api:
    def __init__(self, path):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
        import asan_preload  # noqa: E402
        asan_preload.reexec_if_sanitized(path)
        L = ctypes.CDLL(path)
        P = ctypes.c_void_p
        L.smelt_status_message.restype = ctypes.c_char_p
        L.smelt_status_message.argtypes = [P]
        L.smelt_status_free.argtypes = [P]
        for f in ("smelt_bundle_open", "smelt_session_create", "smelt_session_bind_input", "smelt_session_bind_output",
                  "smelt_session_run"):
            getattr(L, f).restype = P
        L.smelt_bundle_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
        L.smelt_bundle_close.argtypes = [P]
        L.smelt_session_create.argtypes = [P, ctypes.c_char_p, P, ctypes.POINTER(P)]
        L.smelt_session_destroy.argtypes = [P]
        L.smelt_session_bind_input.argtypes = [P, ctypes.c_char_p, P, ctypes.c_size_t]
        L.smelt_session_bind_output.argtypes = [P, ctypes.c_char_p, P, ctypes.c_size_t]
        L.smelt_session_run.argtypes = [P]
        self.L = L

    def err(self, st):
        """None for success, else the message (the status freed)."""
        if not st:
            return None
        msg = self.L.smelt_status_message(st).decode()
        self.L.smelt_status_free(st)
        return msg

    def open(self, path):
        b = ctypes.c_void_p()
        return b, self.err(self.L.smelt_bundle_open(path.encode(), ctypes.byref(b)))

    def session(self, b, device=b"cpu"):
        s = ctypes.c_void_p()
        return s, self.err(self.L.smelt_session_create(b, device, None, ctypes.byref(s)))

    def run(self, s, x, pos, out):
        for name, a in (("x", x), ("pos", pos)):
            e = self.err(self.L.smelt_session_bind_input(s, name.encode(), a.ctypes.data, a.nbytes))
            if e:
                return e
        e = self.err(self.L.smelt_session_bind_output(s, b"y", out.ctypes.data, out.nbytes))
        return e or self.err(self.L.smelt_session_run(s))


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    smelt = os.path.abspath(ap.parse_args().smelt)
    lib = os.path.join(os.path.dirname(smelt), "libsmelt_runtime.so")
    weights = os.path.join(ROOT, "examples", "tiny_llama.safetensors")
    if not os.path.exists(weights) or not os.path.exists(lib):
        print("SKIP: examples/tiny_llama.safetensors or libsmelt_runtime.so missing")
        return 77
    api = Api(lib)
    tmp = tempfile.mkdtemp(prefix="smelt-wdefer-")
    try:
        d = os.path.join(tmp, "m")
        os.makedirs(d)
        model = os.path.join(d, "tiny_llama.yaml")
        shutil.copy(os.path.join(ROOT, "examples", "tiny_llama.yaml"), model)
        w = os.path.join(d, "tiny_llama.safetensors")
        shutil.copy(weights, w)
        seq = 4
        emb, ext, cu = (os.path.join(d, n + ".smelt") for n in ("emb", "ext", "cu"))
        args = ["--dim", f"seq={seq}", "--no-cache"]
        rs = [subprocess.run([smelt, "compile", model, "-o", o, *args, *f], capture_output=True, text=True)
              for o, f in ((emb, []), (ext, ["--external-weights"]))]
        check(all(r.returncode == 0 for r in rs), "compile embedded and --external-weights: " +
              " ".join(r.stderr.strip() for r in rs))
        rc = subprocess.run([smelt, "compile", model, "-o", cu, "--target", "cuda", "--external-weights", *args],
                            capture_output=True, text=True)
        have_cuda = rc.returncode == 0
        print("note: no CUDA bundle (" + rc.stderr.strip()[:200] + "); its part is skipped" if not have_cuda
              else "ok   compile --target cuda --external-weights")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((seq, 64)).astype(np.float32)
        pos = np.arange(seq, dtype=np.int32)

        def outputs(path):
            b, e = api.open(path)
            if e:
                return None, "open: " + e
            s, e = api.session(b)
            y = np.zeros((seq, 64), np.float32)
            if not e:
                e = api.run(s, x, pos, y)
                api.L.smelt_session_destroy(s)
            api.L.smelt_bundle_close(b)
            return (None, e) if e else (y, None)

        ye, e1 = outputs(emb)
        yx, e2 = outputs(ext)
        check(ye is not None and yx is not None and np.array_equal(ye, yx),
              f"intact weights: open, session and run; external equals embedded ({e1 or ''}{e2 or ''})")

        # ---- one byte changed, same size
        off = os.path.getsize(w) // 3
        flip(w, off)
        if have_cuda:
            b, e = api.open(cu)
            check(e is None, "changed weights, CUDA bundle: smelt_bundle_open succeeds (nothing read at open): " +
                  str(e))
            if e is None:
                for k in range(2):
                    s, e = api.session(b, b"cuda")
                    check(e is not None and w in e and "not the one the bundle was compiled with" in e,
                          f"and session {k + 1} is refused naming the file: {e}")
                    if e is None:
                        api.L.smelt_session_destroy(s)
                api.L.smelt_bundle_close(b)
            r = subprocess.run([smelt, "inspect", cu], capture_output=True, text=True)
            check(r.returncode != 0 and "not the one the bundle was compiled with" in r.stderr,
                  "smelt inspect (opened without code) refuses it at open: " + r.stderr.strip()[:300])
        b, e = api.open(ext)
        if e is None:  # no packed weights: refused by the session
            s, e = api.session(b)
            if e is None:
                api.L.smelt_session_destroy(s)
            api.L.smelt_bundle_close(b)
        check(e is not None and w in e and "not the one the bundle was compiled with" in e,
              "changed weights, CPU bundle: refused (at open or session) naming the file: " + str(e))
        flip(w, off)

        # ---- another size: refused at open
        with open(w, "ab") as f:
            f.write(b"\0" * 8)
        b, e = api.open(cu if have_cuda else ext)
        check(e is not None and "tiny_llama.safetensors" in e and "bytes" in e,
              "a weights file of another size is refused at open: " + str(e))
        if e is None:
            api.L.smelt_bundle_close(b)
        with open(w, "r+b") as f:
            f.truncate(os.path.getsize(w) - 8)

        # ---- recorded path changed, an intact copy beside the bundle
        moved = os.path.join(tmp, "moved")
        os.makedirs(moved)
        shutil.copy(ext, os.path.join(moved, "ext.smelt"))
        shutil.copy(w, os.path.join(moved, "tiny_llama.safetensors"))
        flip(w, off)
        y, e = outputs(os.path.join(moved, "ext.smelt"))
        check(y is not None and np.array_equal(y, ye),
              "the recorded file changed, an intact copy beside the bundle: that one is used: " + str(e))
        flip(w, off)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"test_weights_deferred: {len(failures)} failure(s)")
        return 1
    print("test_weights_deferred: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
