#!/usr/bin/env python3
"""The Python package on a CUDA GPU: numpy and torch CUDA tensors, zero-copy, streams.

Needs torch with CUDA and a GPU (else exit 77, skipped) and the smelt
package already installed (--site DIR, where `pip install --target DIR .`
put it; scripts/gpu-python.sh does that on the GPU machine); it installs
nothing itself.  Prints one `ok`/`FAIL` line per check, as test_python.py.

  1. examples/mlp.yaml compiled with target="cuda": Bundle.inputs from the
     bundle alone; a session's cuda_stream; numpy inputs give numpy outputs
     that match tests/e2e/reference.py (float64, on the weights `smelt run
     --device ref` dumps); torch CUDA inputs give CudaArray outputs that
     torch.from_dlpack takes without a copy (the same data_ptr) and with the
     same values; outputs given as torch CUDA tensors are written in place;
     a CudaArray outlives its session; smelt's device buffers are freed when
     their last owner goes (cudaMemGetInfo).
  2. Streams: an input written by torch on a side stream (after a long
     sleep kernel, so the write ends well after the run would have read it)
     and run at once inside `with torch.cuda.stream(side)`; the same on the
     default stream; an output tensor that the default stream still reads.
  3. Errors: CUDA tensors of the wrong dtype, shape, or not contiguous;
     a CUDA tensor into a CPU session (where this build can compile for the
     CPU; without LLVM that check is skipped with a note).
  4. f16: mlp compiled with dtype="f16" on numpy and torch f16 inputs.
  5. State on CUDA: examples/tiny_lm.yaml (KV caches), zero at first, a
     run through torch CUDA ids/pos and one through numpy agree, the caches
     fill, and the logits match `smelt run --device ref`.

Usage: test_python_cuda.py --smelt PATH [--site DIR]
"""
import argparse
import gc
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SKIPPED = 77
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return bool(cond)


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def raises(fn, cls, what, contains=None):
    import smelt
    try:
        fn()
    except smelt.Error as e:
        ok = isinstance(e, cls) and (contains is None or contains in str(e))
        check(ok, "%s raises %s: %s" % (what, type(e).__name__, e))
        return
    except Exception as e:  # noqa: BLE001
        check(False, "%s raises %s (%s), not smelt.%s" % (what, type(e).__name__, e, cls.__name__))
        return
    check(False, "%s raises nothing (expected smelt.%s)" % (what, cls.__name__))


def host(t):
    """A torch tensor or smelt.CudaArray as a numpy array (through torch)."""
    import torch
    if not isinstance(t, torch.Tensor):
        t = torch.from_dlpack(t)
    return t.detach().cpu().numpy()


# ---------------------------------------------------------------- 1. mlp

def test_mlp(smelt_bin, tmp, tp, reference):
    import smelt
    import torch
    model = os.path.join(ROOT, "examples", "mlp.yaml")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 64)).astype(np.float32)

    b = smelt.compile(model, target="cuda")
    check(b.inputs == (smelt.TensorInfo("x", "f32", (8, 64)),) and
          b.outputs == (smelt.TensorInfo("y", "f32", (8, 10)),),
          "a CUDA-only bundle describes its tensors: %s -> %s" % (b.inputs, b.outputs))
    s = b.session("cuda")
    check(isinstance(s.cuda_stream, int) and s.cuda_stream not in (0, 1, 2),
          "Session.cuda_stream is the session's own CUstream (%s)" % (hex(s.cuda_stream)
                                                                     if isinstance(s.cuda_stream, int) else s.cuda_stream))

    y = s.run({"x": x})["y"]
    check(isinstance(y, np.ndarray) and y.shape == (8, 10) and y.dtype == np.float32,
          "numpy input on CUDA: a numpy output (%s)" % type(y).__name__)
    params = ["w1", "b1", "w2", "b2", "w3"]
    ref = tp.cli_run(smelt_bin, model, "ref", {"x": x}, ["y"] + params, tmp, "cuda-mlp-ref")
    want = reference.mlp(x.astype(np.float64), {p: ref[p] for p in params})
    e = rel_l2(y, want)
    check(e <= 1e-5, "mlp on CUDA (numpy in/out) vs numpy reference (float64): rel L2 %.2e <= 1e-5" % e)

    # torch CUDA input: a CudaArray out, zero-copy into torch
    xt = torch.from_numpy(x).cuda()
    r = s.run({"x": xt})
    ya = r["y"]
    check(isinstance(ya, smelt.CudaArray) and ya.shape == (8, 10) and ya.dtype == "f32" and ya.device == "cuda:0"
          and ya.__dlpack_device__() == (2, 0), "torch CUDA input: the output is a CudaArray on cuda:0 (%r)" % (ya,))
    yt = torch.from_dlpack(ya)
    check(yt.is_cuda and yt.dtype == torch.float32 and tuple(yt.shape) == (8, 10) and yt.data_ptr() == ya.data_ptr,
          "torch.from_dlpack(CudaArray) takes it without a copy (data_ptr %#x == %#x)" % (yt.data_ptr(), ya.data_ptr))
    e = rel_l2(host(yt), y)
    check(e <= 1e-6, "torch CUDA in, CudaArray out: same values as the numpy run (rel L2 %.2e)" % e)
    yt2 = torch.from_dlpack(ya)
    check(yt2.data_ptr() == yt.data_ptr(), "a CudaArray exports to DLPack more than once, the same memory")

    # outputs given as torch CUDA tensors: written in place
    ot = torch.full((8, 10), float("nan"), device="cuda")
    p = ot.data_ptr()
    r = s.run({"x": xt}, outputs={"y": ot})
    check(r["y"] is ot and ot.data_ptr() == p and rel_l2(host(ot), y) <= 1e-6,
          "outputs={'y': torch CUDA tensor}: written in place (same tensor, data_ptr, values)")
    ot.fill_(float("nan"))
    s.run({"x": x}, outputs={"y": ot})
    check(rel_l2(host(ot), y) <= 1e-6, "numpy input, torch CUDA output tensor: written in place")
    on = np.zeros((8, 10), np.float32)
    r = s.run({"x": xt}, outputs={"y": on})
    check(r["y"] is on and rel_l2(on, y) <= 1e-6, "torch CUDA input, numpy output array: copied back")

    # a CudaArray outlives its session and bundle; dropping every owner frees the memory
    keep = s.run({"x": xt})["y"]
    kt = torch.from_dlpack(keep)
    del s, b, r
    gc.collect()
    torch.cuda.synchronize()
    check(rel_l2(host(kt), y) <= 1e-6, "a CudaArray (and its torch tensor) stays valid after its session is gone")
    del keep, kt
    s = smelt.compile(model, target="cuda").session("cuda")
    s.run({"x": xt})
    torch.cuda.synchronize()
    n = 256 << 20
    free0 = torch.cuda.mem_get_info()[0]
    big, ptr = s._s.alloc_cuda([n], "u8")
    free1 = torch.cuda.mem_get_info()[0]
    bt = torch.from_dlpack(big)
    check(bt.data_ptr() == ptr and bt.numel() == n, "smelt's device buffer through DLPack: the same pointer")
    del big
    gc.collect()
    free2 = torch.cuda.mem_get_info()[0]
    del bt
    gc.collect()
    free3 = torch.cuda.mem_get_info()[0]
    mib = 1 << 20
    check(free0 - free1 >= n - 4 * mib and free0 - free2 >= n - 4 * mib and free3 - free2 >= n - 4 * mib,
          "a 256 MiB buffer is held while a tensor made from it lives and freed after (free MiB %d, %d, %d, %d)"
          % (free0 // mib, free1 // mib, free2 // mib, free3 // mib))
    return y


# ---------------------------------------------------------------- 2. streams

def test_streams(tmp):
    import smelt
    import torch
    model = os.path.join(ROOT, "examples", "mlp.yaml")
    batch = 1 << 16
    s = smelt.compile(model, target="cuda", dims={"batch": batch}).session("cuda")
    rng = np.random.default_rng(12)
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    want = s.run({"x": x})["y"]                      # the numpy path: staged and copied, no streams involved
    src = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    # about 50 ms of GPU time: far longer than smelt needs to read a 16 MiB input (a run without the wait
    # reads the input while the sleep still runs, before the copy below writes it)
    cycles = int(1e8)

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        xs = torch.zeros((batch, 64), device="cuda")
        torch.cuda._sleep(cycles)
        xs.copy_(src)
        y = s.run({"x": xs})["y"]                    # at once: the protocol makes smelt's stream wait for `side`
        got = host(y)
    e = rel_l2(got, want)
    check(e <= 1e-6, "an input written on a side torch stream (after a 1e8-cycle sleep), run at once inside "
          "`with torch.cuda.stream(side)`: rel L2 %.2e vs the numpy run" % e)

    torch.cuda.synchronize()
    xd = torch.zeros((batch, 64), device="cuda")
    torch.cuda._sleep(cycles)                        # on the current (default) stream
    xd.copy_(src)
    y = s.run({"x": xd})["y"]
    e = rel_l2(host(y), want)
    check(e <= 1e-6, "an input written on torch's default stream after a sleep, run at once (smelt's stream "
          "is non-blocking, so only the DLPack stream wait orders it): rel L2 %.2e" % e)

    # an output the current stream is still reading: smelt must not write it before that read is done
    torch.cuda.synchronize()
    out = torch.full((batch, 10), 7.0, device="cuda")
    torch.cuda._sleep(cycles)
    before = out.clone()                             # queued after the sleep: reads the 7s
    s.run({"x": xd}, outputs={"y": out})
    check(bool((before == 7.0).all().item()) and rel_l2(host(out), want) <= 1e-6,
          "an output tensor still being read on torch's stream is written after the read (write-after-read)")

    # a producer whose __dlpack__ takes no stream: the context is synchronised instead
    class NoStream:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self):
            return self.t.__dlpack__()

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        xn = torch.zeros((batch, 64), device="cuda")
        torch.cuda._sleep(cycles)
        xn.copy_(src)
        y = s.run({"x": NoStream(xn)})["y"]
        got = host(y)
    e = rel_l2(got, want)
    check(e <= 1e-6, "a producer whose __dlpack__ takes no stream argument: synchronised, rel L2 %.2e" % e)
    torch.cuda.synchronize()


# ---------------------------------------------------------------- 3. errors

def test_errors(tmp):
    import smelt
    import torch
    model = os.path.join(ROOT, "examples", "mlp.yaml")
    s = smelt.compile(model, target="cuda").session("cuda")
    xt = torch.randn((8, 64), device="cuda")
    raises(lambda: s.run({"x": xt.double()}), smelt.InvalidInputError, "a CUDA f64 tensor for an f32 input", "f64")
    raises(lambda: s.run({"x": xt[:7]}), smelt.InvalidInputError, "a CUDA tensor of shape (7, 64)")
    xnc = torch.randn((64, 8), device="cuda").T
    raises(lambda: s.run({"x": xnc}), smelt.InvalidInputError, "a non-contiguous CUDA tensor", "contiguous")
    raises(lambda: s.run({"x": xt}, outputs={"y": torch.empty((8, 10), dtype=torch.float16, device="cuda")}),
           smelt.InvalidInputError, "a CUDA f16 output tensor for an f32 output", "f16")
    try:
        cpu = smelt.compile(model, target="cpu").session("cpu")
    except smelt.Error as e:
        print("note: this build cannot compile for the CPU (%s): the CPU-session checks are skipped"
              % str(e).splitlines()[0][:120])
        cpu = None
    if cpu is not None:
        raises(lambda: cpu.run({"x": xt}), smelt.InvalidInputError, "a CUDA tensor into a CPU session", "CUDA")
        check(cpu.cuda_stream is None, "a CPU session has no cuda_stream")
        y = cpu.run({"x": xt.cpu()})["y"]
        e = rel_l2(y, host(s.run({"x": xt})["y"]))
        check(e <= 1e-5, "CPU session vs CUDA session on the same input: rel L2 %.2e" % e)


# ---------------------------------------------------------------- 4. f16

def test_f16(y32):
    import smelt
    import torch
    model = os.path.join(ROOT, "examples", "mlp.yaml")
    b = smelt.compile(model, target="cuda", dtype="f16")
    check(b.inputs[0].dtype == "f16" and b.outputs[0].dtype == "f16", "dtype='f16': f16 inputs and outputs (%s)"
          % (b.inputs + b.outputs,))
    s = b.session("cuda")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    y = s.run({"x": x.astype(np.float16)})["y"]
    check(isinstance(y, np.ndarray) and y.dtype == np.float16, "f16 numpy in, f16 numpy out")
    yt = s.run({"x": torch.from_numpy(x).half().cuda()})["y"]
    t = torch.from_dlpack(yt)
    check(t.dtype == torch.float16 and t.data_ptr() == yt.data_ptr, "f16 torch CUDA in, f16 CudaArray out "
          "(zero-copy into torch)")
    e = rel_l2(host(t), y)
    check(e <= 1e-3, "f16: the torch path and the numpy path agree (rel L2 %.2e)" % e)
    e = rel_l2(y, y32)
    check(e <= 2e-2, "f16 mlp vs the f32 CUDA run: rel L2 %.2e <= 2e-2" % e)


# ---------------------------------------------------------------- 5. state

def test_state(smelt_bin, tmp, tp):
    import smelt
    import torch
    model = os.path.join(ROOT, "examples", "tiny_lm.yaml")
    if not os.path.exists(os.path.join(ROOT, "examples", "tiny_llama.safetensors")):
        check(False, "tiny_lm: examples/tiny_llama.safetensors is missing (run python3 examples/gen_weights.py)")
        return
    b = smelt.compile(model, target="cuda")
    s1, s2 = b.session("cuda"), b.session("cuda")
    names = [t.name for t in s1.states]
    check(len(names) == 4, "tiny_lm on CUDA: Session.states %s" % (s1.states,))
    check(all(not s1.read_state(n).any() for n in names), "CUDA states are zero in a new session")
    ids = np.array([3, 141, 59, 26, 53, 58, 97, 93, 238, 46, 26, 43, 38, 32, 79, 50], np.int32)
    pos = np.arange(16, dtype=np.int32)
    r1 = s1.run({"ids": ids, "pos": pos})
    r2 = s2.run({"ids": torch.from_numpy(ids).cuda(), "pos": torch.from_numpy(pos).cuda()})
    outs = sorted(r1)
    check(all(isinstance(r1[n], np.ndarray) for n in outs) and all(isinstance(r2[n], smelt.CudaArray) for n in outs),
          "tiny_lm: numpy in -> numpy out, torch CUDA in -> CudaArray out (%s)" % outs)
    for n in outs:
        a, c = r1[n], host(r2[n])
        if a.dtype.kind == "f":
            e = rel_l2(c, a)
            check(e <= 1e-5, "tiny_lm output %r: the torch CUDA path vs the numpy path: rel L2 %.2e" % (n, e))
        else:
            check(np.array_equal(a, c), "tiny_lm output %r: the torch CUDA path equals the numpy path" % n)
    check(all(s1.read_state(n).any() for n in names), "a run fills the CUDA KV caches")
    check(all(np.array_equal(s1.read_state(n), s2.read_state(n)) for n in names),
          "both sessions' caches are the same after the same run")
    ref = tp.cli_run(smelt_bin, model, "ref", {"ids": ids, "pos": pos}, outs, tmp, "cuda-tiny-lm-ref")
    for n in outs:
        if r1[n].dtype.kind == "f":
            e = rel_l2(r1[n], ref[n])
            check(e <= 1e-3, "tiny_lm %r on CUDA vs `smelt run --device ref`: rel L2 %.2e <= 1e-3" % (n, e))
        else:
            same = np.array_equal(r1[n], ref[n])
            if not same and n == "next" and "logits" in ref:  # a near-tie of the top two logits may flip
                lg = ref["logits"].reshape(-1)
                same = abs(float(lg[int(r1[n].reshape(-1)[0])]) - float(lg.max())) <= 1e-4 * max(1.0, abs(lg).max())
            check(same, "tiny_lm %r on CUDA equals `smelt run --device ref` (%s vs %s)"
                  % (n, r1[n].reshape(-1)[:4], ref[n].reshape(-1)[:4]))


def test_tp(y32):
    """A bundle compiled with tp=2 on a device list: every rank on cuda:0 here
    (host collectives; one GPU a rank through NCCL where there are two)."""
    import smelt
    import torch
    model = os.path.join(ROOT, "examples", "mlp.yaml")
    x = np.random.default_rng(11).standard_normal((8, 64)).astype(np.float32)
    n = torch.cuda.device_count()
    dev = "cuda:0,cuda:1" if n >= 2 else "cuda:0,cuda:0"
    b = smelt.compile(model, target="cuda", tp=2)
    s = b.session(dev)
    y = s.run({"x": x})["y"]
    e = rel_l2(y, y32)
    check(isinstance(y, np.ndarray) and e <= 1e-5, "mlp tp=2 on %s equals one rank: rel L2 %.2e" % (dev, e))
    ya = s.run({"x": torch.from_numpy(x).cuda()})["y"]
    check(getattr(ya, "device", None) == "cuda:0", "a tp session's CUDA outputs are rank 0's: %r" % ya)
    try:
        b.session("cuda:0,cuda:0,cuda:0")
        check(False, "3 devices for 2 ranks is refused")
    except smelt.Error as ex:
        check("3 devices" in str(ex), "3 devices for 2 ranks: %s" % ex)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True, help="the smelt binary (for `smelt run --device ref`)")
    ap.add_argument("--site", help="a directory the smelt package is installed in (pip install --target)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return SKIPPED
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU (torch.cuda.is_available() is False)")
        return SKIPPED
    if args.site:
        sys.path.insert(0, os.path.abspath(args.site))
    try:
        import smelt
    except ImportError as e:
        print("SKIP: the smelt package cannot be imported (%s); pass --site DIR where it is installed "
              "(scripts/gpu-python.sh installs it and runs this test)" % e)
        return SKIPPED
    print("smelt %s from %s; torch %s on %s" % (smelt.version, os.path.dirname(smelt.__file__), torch.__version__,
                                                 torch.cuda.get_device_name(0)), flush=True)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    import reference
    import test_python as tp
    smelt_bin = os.path.abspath(args.smelt)
    def part(name, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  one part failing must not hide the others
            import traceback
            traceback.print_exc()
            check(False, "%s: raised %s: %s" % (name, type(e).__name__, e))
            return None

    with tempfile.TemporaryDirectory() as tmp:
        y32 = part("mlp", lambda: test_mlp(smelt_bin, tmp, tp, reference))
        part("streams", lambda: test_streams(tmp))
        part("errors", lambda: test_errors(tmp))
        if y32 is not None:
            part("f16", lambda: test_f16(y32))
            part("tp", lambda: test_tp(y32))
        part("state", lambda: test_state(smelt_bin, tmp, tp))
    if FAILURES:
        print("test_python_cuda: %d FAILED:" % len(FAILURES))
        for f in FAILURES:
            print("  " + f)
        return 1
    print("test_python_cuda: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
