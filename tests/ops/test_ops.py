#!/usr/bin/env python3
"""Every operator of SPEC §3 against numpy, through `smelt run --device ref`.

The ops of causal LMs (state tensors, scatter, attention over a cache,
argmax, topk, arange) also run through `smelt run --device cpu` (the model
compiled for the CPU in memory): their cases name the devices they run on,
and a CPU run is reported as NAME@cpu.

For each case the test writes a one-node YAML model (SPEC §2) into a temporary
directory, saves random inputs as .npy, runs the reference interpreter through
the command line and compares what it writes with a numpy implementation of
the operator written here, independently of the C code.

Precision: numpy computes in float64 from exactly the values the model reads.
  f32   the interpreter also computes in double and rounds once, so results
        agree to f32 rounding: allclose(rtol 1e-5) and relative L2 <= 1e-5.
  f16   inputs are float16 .npy files; the expectation is the float64 result
        rounded to float16; tolerance about one f16 ulp.
  bf16  numpy has no bfloat16, so the model takes f32 inputs, casts them to
        bf16, applies the op and casts back to f32; the expectation rounds
        the inputs and the result to bf16 the same way (round to nearest even
        on the f32 bits); tolerance about one bf16 ulp.
Integer and bool results must match exactly.

Usage: test_ops.py --smelt PATH [-k SUBSTRING] [-v]
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

RNG = np.random.default_rng(20240607)

YAML_DTYPES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(np.float64): "f64",
    np.dtype(np.int64): "i64",
    np.dtype(np.int32): "i32",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8",
    np.dtype(np.bool_): "bool",
}

# --------------------------------------------------------------------------
# numpy helpers


def bf16_round(x):
    """Rounds to the nearest bfloat16 (ties to even), returned as float32."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + e^-x) without overflow


def gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def along(v, axis, rank):
    """Reshapes a 1-D parameter to broadcast along `axis` of a rank-`rank` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    return v.reshape(shape)


def layer_norm(x, gamma, beta=None, axis=-1, eps=1e-5):
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * along(gamma, axis, x.ndim)
    return y if beta is None else y + along(beta, axis, x.ndim)


def rms_norm(x, gamma, axis=-1, eps=1e-6):
    ms = (x * x).mean(axis=axis, keepdims=True)
    return x / np.sqrt(ms + eps) * along(gamma, axis, x.ndim)


def batch_norm(x, scale, bias, mean, var, eps=1e-5):
    r = x.ndim
    return (x - along(mean, 1, r)) / np.sqrt(along(var, 1, r) + eps) * along(scale, 1, r) + along(bias, 1, r)


def matmul(a, b, transpose_a=False, transpose_b=False):
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def conv2d(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    t, l, bo, r = pads
    sh, sw = strides
    dh, dw = dilations
    xp = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)))
    oh = (h + t + bo - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + l + r - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    if b is not None:
        out += b[None, :, None, None]
    return out


def pool2d(x, kernel, strides=None, pads=(0, 0, 0, 0), kind="max"):
    kh, kw = kernel
    sh, sw = strides if strides is not None else kernel
    t, l, bo, r = pads
    n, c, h, w = x.shape
    oh = (h + t + bo - kh) // sh + 1
    ow = (w + l + r - kw) // sw + 1
    pad = ((0, 0), (0, 0), (t, bo), (l, r))
    xp = np.pad(x, pad, constant_values=-np.inf if kind == "max" else 0.0)
    inside = np.pad(np.ones_like(x), pad)  # 1 where a real element is
    out = np.full((n, c, oh, ow), -np.inf) if kind == "max" else np.zeros((n, c, oh, ow))
    count = np.zeros((n, c, oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = (slice(None), slice(None), slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))
            if kind == "max":
                out = np.maximum(out, xp[win])
            else:
                out += xp[win]
                count += inside[win]
    return out if kind == "max" else out / count  # count_include_pad = false


def attention(q, k, v, mask=None, scale=None, causal=False):
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    k = np.repeat(k, h // hkv, axis=1)  # head i uses kv head i // (h / hkv)
    v = np.repeat(v, h // hkv, axis=1)
    sc = (q @ np.swapaxes(k, -1, -2)) * (1 / math.sqrt(d) if scale is None else scale)
    if mask is not None:
        sc = np.where(mask, sc, -np.inf) if mask.dtype == np.bool_ else sc + mask
    if causal:
        i = np.arange(s)[:, None]
        j = np.arange(t)[None, :]
        sc = np.where(j <= t - s + i, sc, -np.inf)
    return softmax(sc, -1) @ v


def rope(x, pos, rotary_dim=None, base=10000.0, style="half"):
    d = x.shape[-1]
    rd = d if rotary_dim is None else rotary_dim
    p = np.arange(rd // 2)
    theta = pos.astype(np.float64)[:, None] * base ** (-2.0 * p / rd)  # [S, rd/2]
    c, s = np.cos(theta), np.sin(theta)
    if style == "half":
        ia, ib = p, p + rd // 2
    else:
        ia, ib = 2 * p, 2 * p + 1
    y = x.copy()
    a, b = x[..., ia], x[..., ib]
    y[..., ia] = a * c - b * s
    y[..., ib] = b * c + a * s
    return y


def slice_ref(x, axis=0, start=0, end=2**63 - 1, step=1):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, end, step)
    return x[tuple(idx)]


def split_ref(x, axis=0, sizes=None, parts=None):
    if sizes is None:
        return np.split(x, parts, axis=axis)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def expand_ref(x, shape):
    return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape)))


# --------------------------------------------------------------------------
# random inputs


def normal(*shape, scale=1.0):
    return RNG.standard_normal(shape) * scale


def positive(*shape, lo=0.1, hi=4.0):
    return RNG.uniform(lo, hi, shape)


def away_from_zero(*shape, lo=0.3, hi=3.0):
    return RNG.uniform(lo, hi, shape) * RNG.choice([-1.0, 1.0], shape)


def small_ints(*shape, lo=-2, hi=3):
    """Floats drawn from a few integers, so comparisons hit equality too."""
    return RNG.integers(lo, hi, shape).astype(np.float64)


# --------------------------------------------------------------------------
# the model, the run and the comparison


def yaml_value(v):
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(e) for e in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def write_model(path, inputs, nodes, outputs, states=None):
    """inputs and states: [(name, dtype, shape)]; nodes: [(outs, op, ins, attrs)]."""
    lines = ["smelt: 1", "name: op_test", "inputs:"]
    for name, dt, shape in inputs:
        lines.append(f"  {name}: {{shape: {yaml_value(list(shape))}, dtype: {dt}}}")
    if states:
        lines.append("state:")
        for name, dt, shape in states:
            lines.append(f"  {name}: {{shape: {yaml_value(list(shape))}, dtype: {dt}}}")
    lines.append("nodes:")
    for outs, op, ins, attrs in nodes:
        out = outs[0] if len(outs) == 1 else yaml_value(outs)
        extra = "".join(f", {k}: {yaml_value(v)}" for k, v in attrs.items())
        lines.append(f"  - {{out: {out}, op: {op}, in: {yaml_value(ins)}{extra}}}")
    lines.append(f"outputs: {yaml_value(outputs)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


TOL = {"f32": (1e-5, 1e-5), "f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2)}


def compare(got, want, mode):
    """Returns None when got matches want, else a one-line reason."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, want {want.shape}"
    if mode == "exact" or want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
        if got.dtype != want.dtype and not (mode == "exact" and got.dtype.kind == want.dtype.kind):
            return f"dtype {got.dtype}, want {want.dtype}"
        same = got.reshape(-1) == want.reshape(-1)
        if got.dtype.kind == "f" and want.dtype.kind == "f":  # a NaN where the expectation has one matches
            same |= np.isnan(got.reshape(-1)) & np.isnan(want.reshape(-1))
        bad = np.flatnonzero(~same)
        if bad.size:
            i = bad[0]
            return f"{bad.size} element(s) differ, first at {i}: {got.reshape(-1)[i]} vs {want.reshape(-1)[i]}"
        return None
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return f"NaN pattern differs ({np.isnan(g).sum()} NaN, want {np.isnan(w).sum()})"
    finite = np.isfinite(w)
    if not np.array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)]):
        return "infinities differ"
    g, w = g[finite], w[finite]
    if g.size == 0:
        return None
    rtol, rel_l2_max = TOL[mode]
    scale = max(1.0, float(np.abs(w).max()))
    err = np.abs(g - w)
    if not np.all(err <= rtol * np.abs(w) + rtol * scale * 0.1):
        i = int(np.argmax(err - rtol * np.abs(w)))
        return f"max abs err {err.max():.3g} (element {i}: {g[i]!r} vs {w[i]!r})"
    rel = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
    if rel > rel_l2_max:
        return f"relative L2 error {rel:.3g} > {rel_l2_max:g}"
    return None


class Runner:
    def __init__(self, smelt, tmp, verbose, pattern):
        self.smelt, self.tmp, self.verbose, self.pattern = smelt, tmp, verbose, pattern
        self.passed, self.failed, self.count = 0, [], 0

    def run_model(self, name, inputs, nodes, outputs, arrays, want, mode, expect_error=None, states=None,
                  devices=("ref",)):
        """Writes and runs one model on each device; checks outputs (dict
        name -> expected)."""
        for dev in devices:
            self._run_model(name if dev == "ref" else f"{name}@{dev}", inputs, nodes, outputs, arrays, want, mode,
                            expect_error, states, dev)

    def _run_model(self, name, inputs, nodes, outputs, arrays, want, mode, expect_error, states, device):
        if self.pattern and self.pattern not in name:
            return
        self.count += 1
        d = os.path.join(self.tmp, f"{self.count:03d}")
        os.makedirs(d)
        model = os.path.join(d, "model.yaml")
        write_model(model, inputs, nodes, outputs, states)
        cmd = [self.smelt, "run", model, "--device", device]
        for k, a in arrays.items():
            p = os.path.join(d, f"in_{k}.npy")
            np.save(p, a)
            cmd += ["--input", f"{k}={p}"]
        for k in want:
            cmd += ["--output", f"{k}={os.path.join(d, f'out_{k}.npy')}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if expect_error is not None:
            if r.returncode != 1 or expect_error not in r.stderr:
                self.fail(name, f"expected exit 1 with '{expect_error}', got {r.returncode}: {r.stderr.strip()}")
            else:
                self.ok(name)
            return
        if r.returncode != 0:
            self.fail(name, f"exit {r.returncode}: {r.stderr.strip()[:400]}")
            return
        for k, w in want.items():
            got = np.load(os.path.join(d, f"out_{k}.npy"))
            why = compare(got, w, mode)
            if why:
                self.fail(name, f"output '{k}': {why}  [model: {model}]")
                return
        self.ok(name)

    def ok(self, name):
        self.passed += 1
        if self.verbose:
            print(f"ok    {name}")

    def fail(self, name, why):
        self.failed.append(name)
        print(f"FAIL  {name}: {why}")

    # ---- the three precisions ----

    def case(self, name, op, ins, ref, attrs=None, lowp=False, nout=1):
        """One op on inputs ins = [(name, float64-or-int array)], against
        ref(*arrays) (-> array or list of arrays for nout > 1)."""
        attrs = attrs or {}
        self._case(name, op, ins, ref, attrs, nout, "f32")
        if lowp:
            self._case(name + "/f16", op, ins, ref, attrs, nout, "f16")
            self._case(name + "/bf16", op, ins, ref, attrs, nout, "bf16")

    def _case(self, name, op, ins, ref, attrs, nout, mode):
        outs = ["y"] if nout == 1 else [f"y{i}" for i in range(nout)]
        inputs, arrays, vals, nodes, op_ins = [], {}, [], [], []
        for iname, a in ins:
            a = np.asarray(a)
            is_float = a.dtype.kind == "f"
            if is_float and mode == "f16":
                a = a.astype(np.float16)
            elif is_float:
                a = a.astype(np.float32)  # f32, and the f32 carrier of bf16
            if is_float and mode == "bf16":
                a = bf16_round(a)
                nodes.append(([f"{iname}_bf"], "cast", [iname], {"to": "bf16"}))
                op_ins.append(f"{iname}_bf")
            else:
                op_ins.append(iname)
            inputs.append((iname, YAML_DTYPES[a.dtype], a.shape))
            arrays[iname] = a
            vals.append(a.astype(np.float64) if is_float else a)
        want = ref(*vals)
        want = [want] if nout == 1 else list(want)
        if mode == "bf16":
            nodes.append(([o + "_bf" for o in outs], op, op_ins, attrs))
            for o in outs:
                nodes.append(([o], "cast", [o + "_bf"], {"to": "f32"}))
            want = [bf16_round(w) if np.asarray(w).dtype.kind == "f" else w for w in want]
        else:
            nodes.append((outs, op, op_ins, attrs))
            if mode == "f16":
                want = [np.asarray(w).astype(np.float16) if np.asarray(w).dtype.kind == "f" else w for w in want]
        self.run_model(name, inputs, nodes, outs, arrays, dict(zip(outs, want)), mode)


# --------------------------------------------------------------------------
# the cases


def unary_cases(t):
    x = normal(3, 17, scale=2.0)
    t.case("neg", "neg", [("x", x)], lambda a: -a, lowp=True)
    t.case("abs", "abs", [("x", x)], np.abs)
    t.case("exp", "exp", [("x", x)], np.exp, lowp=True)
    t.case("log", "log", [("x", positive(3, 17))], np.log)
    t.case("sqrt", "sqrt", [("x", positive(3, 17))], np.sqrt)
    t.case("rsqrt", "rsqrt", [("x", positive(3, 17))], lambda a: 1 / np.sqrt(a), lowp=True)
    t.case("reciprocal", "reciprocal", [("x", away_from_zero(3, 17))], lambda a: 1 / a)
    t.case("tanh", "tanh", [("x", x)], np.tanh)
    big = np.concatenate([x.reshape(-1), [-100.0, -40.0, 40.0, 100.0]])
    t.case("sigmoid", "sigmoid", [("x", big)], sigmoid, lowp=True)
    t.case("relu", "relu", [("x", x)], lambda a: np.maximum(a, 0))
    t.case("gelu_erf", "gelu", [("x", x)], gelu, lowp=True)
    t.case("gelu_default_attr", "gelu", [("x", x)], gelu, attrs={"approximate": "none"})
    t.case("gelu_tanh", "gelu", [("x", x)], lambda a: gelu(a, "tanh"), attrs={"approximate": "tanh"}, lowp=True)
    t.case("silu", "silu", [("x", big)], lambda a: a * sigmoid(a), lowp=True)
    t.case("erf", "erf", [("x", x)], _erf)
    t.case("sin", "sin", [("x", x)], np.sin)
    t.case("cos", "cos", [("x", x)], np.cos)
    # integers, exact halves (round: ties to even) and values either side of them
    r = np.concatenate([x.reshape(-1), [-3.0, -2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.0, 2.4999, -2.5001, 7.0]])
    t.case("floor", "floor", [("x", r)], np.floor)
    t.case("ceil", "ceil", [("x", r)], np.ceil)
    t.case("round", "round", [("x", r)], np.round)
    t.case("sign", "sign", [("x", r)], np.sign)


def cast_cases(t):
    x = np.concatenate([normal(20, scale=4.0), [-2.7, -0.5, 0.0, 0.5, 2.7, -3.0]])
    x32 = x.astype(np.float32)
    for to, npdt in [("i32", np.int32), ("i64", np.int64), ("i8", np.int8)]:
        t.run_model(f"cast_f32_{to}", [("x", "f32", x.shape)], [(["y"], "cast", ["x"], {"to": to})], ["y"],
                    {"x": x32}, {"y": x32.astype(npdt)}, "exact")  # truncation toward zero
    t.run_model("cast_f32_bool", [("x", "f32", x.shape)], [(["y"], "cast", ["x"], {"to": "bool"})], ["y"],
                {"x": x32}, {"y": x32.astype(np.bool_)}, "exact")
    t.run_model("cast_f32_f16", [("x", "f32", x.shape)], [(["y"], "cast", ["x"], {"to": "f16"})], ["y"],
                {"x": x32}, {"y": x32.astype(np.float16)}, "exact")
    t.run_model("cast_f32_f64", [("x", "f32", x.shape)], [(["y"], "cast", ["x"], {"to": "f64"})], ["y"],
                {"x": x32}, {"y": x32.astype(np.float64)}, "exact")
    i = RNG.integers(-1000, 1000, (4, 5)).astype(np.int32)
    t.run_model("cast_i32_f32", [("x", "i32", i.shape)], [(["y"], "cast", ["x"], {"to": "f32"})], ["y"],
                {"x": i}, {"y": i.astype(np.float32)}, "exact")
    t.run_model("cast_i32_bool", [("x", "i32", i.shape)], [(["y"], "cast", ["x"], {"to": "bool"})], ["y"],
                {"x": i % 3}, {"y": (i % 3).astype(np.bool_)}, "exact")
    b = RNG.integers(0, 2, (7,)).astype(np.bool_)
    t.run_model("cast_bool_f32", [("x", "bool", b.shape)], [(["y"], "cast", ["x"], {"to": "f32"})], ["y"],
                {"x": b}, {"y": b.astype(np.float32)}, "exact")
    # f32 -> bf16 rounds to nearest even; read back through a cast to f32
    t.run_model("cast_f32_bf16", [("x", "f32", x.shape)],
                [(["b"], "cast", ["x"], {"to": "bf16"}), (["y"], "cast", ["b"], {"to": "f32"})], ["y"],
                {"x": x32}, {"y": bf16_round(x32)}, "exact")


BROADCASTS = [
    ("same", (4, 5), (4, 5)),
    ("row", (3, 4, 5), (5,)),  # rank-mismatched
    ("outer", (3, 1), (1, 4)),
    ("rank3_vs_2", (2, 1, 4), (3, 1)),  # rank-mismatched, both sides stretch
    ("scalar", (), (2, 3)),
]


def binary_cases(t):
    fns = {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": np.divide,
        "maximum": np.maximum,
        "minimum": np.minimum,
    }
    for op, fn in fns.items():
        for bname, sa, sb in BROADCASTS:
            b = away_from_zero(*sb) if op == "div" else normal(*sb)
            lowp = bname == "rank3_vs_2" and op in ("add", "mul", "div")
            t.case(f"{op}_{bname}", op, [("a", normal(*sa)), ("b", b)], fn, lowp=lowp)
    for bname, sa, sb in BROADCASTS[1:3]:
        t.case(f"pow_{bname}", "pow", [("a", positive(*sa)), ("b", normal(*sb))], np.power)
    t.case("pow_int_exponent", "pow", [("a", normal(4, 5)), ("b", np.array([2.0, 3.0, 0.0, 1.0, -1.0]))], np.power)
    for op, fn in [("less", np.less), ("greater", np.greater), ("equal", np.equal)]:
        for bname, sa, sb in BROADCASTS[1:4]:
            t.case(f"{op}_{bname}", op, [("a", small_ints(*sa)), ("b", small_ints(*sb))], fn)
        ia = RNG.integers(-3, 3, (3, 4)).astype(np.int32)
        ib = RNG.integers(-3, 3, (4,)).astype(np.int32)
        t.case(f"{op}_i32", op, [("a", ia), ("b", ib)], fn)
    ia = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
    ib = RNG.integers(-50, 50, (4,)).astype(np.int32)
    t.case("add_i32", "add", [("a", ia), ("b", ib)], lambda a, b: (a + b).astype(np.int32))
    t.case("maximum_i32", "maximum", [("a", ia), ("b", ib)], np.maximum)
    nz = np.where(ib == 0, 7, ib).astype(np.int32)
    # integer division truncates toward zero (C, ONNX), unlike numpy's floor_divide
    t.case("div_i32_trunc", "div", [("a", ia), ("b", nz)], lambda a, b: (np.trunc(a / b)).astype(np.int32))


def where_cases(t):
    for name, sc, sa, sb in [
        ("same", (3, 4), (3, 4), (3, 4)),
        ("3way", (3, 1, 5), (4, 1), (5,)),
        ("scalar_b", (2, 3), (2, 3), ()),
    ]:
        cond = RNG.integers(0, 2, sc).astype(np.bool_)
        t.case(f"where_{name}", "where", [("c", cond), ("a", normal(*sa)), ("b", normal(*sb))], np.where,
               lowp=name == "3way")


def reduce_cases(t):
    x = normal(3, 4, 5)
    fns = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}
    for op, fn in fns.items():
        for axes in [None, [1], [-1], [0, 2], [-3, -1]]:
            for keep in (False, True):
                attrs = {"keepdims": keep}
                if axes is not None:
                    attrs["axes"] = axes
                ax = None if axes is None else tuple(axes)
                lowp = op in ("sum", "mean") and axes == [-1] and not keep
                t.case(f"{op}_axes{axes}_keep{int(keep)}".replace(" ", ""), op, [("x", x)],
                       lambda a, fn=fn, ax=ax, keep=keep: fn(a, axis=ax, keepdims=keep), attrs, lowp=lowp)
    xi = RNG.integers(-9, 9, (4, 6)).astype(np.int32)
    t.case("sum_i32", "sum", [("x", xi)], lambda a: a.sum(axis=1).astype(np.int32), {"axes": [1]})
    t.case("max_i32", "max", [("x", xi)], lambda a: a.max(axis=0, keepdims=True), {"axes": [0], "keepdims": True})


def softmax_cases(t):
    x = normal(3, 4, 6, scale=3.0)
    for axis in (-1, 0, 1):
        t.case(f"softmax_axis{axis}", "softmax", [("x", x)], lambda a, ax=axis: softmax(a, ax), {"axis": axis},
               lowp=axis == -1)
        t.case(f"log_softmax_axis{axis}", "log_softmax", [("x", x)], lambda a, ax=axis: log_softmax(a, ax),
               {"axis": axis}, lowp=axis == -1)
    # large logits: a naive exp() would overflow
    t.case("softmax_large", "softmax", [("x", normal(2, 8, scale=300.0))], softmax)
    t.case("log_softmax_large", "log_softmax", [("x", normal(2, 8, scale=300.0))], log_softmax)


def norm_cases(t):
    x = normal(2, 3, 8, scale=2.0) + 0.5
    g8, b8 = normal(8), normal(8)
    t.case("layer_norm", "layer_norm", [("x", x), ("g", g8), ("b", b8)], layer_norm, lowp=True)
    t.case("layer_norm_no_beta", "layer_norm", [("x", x), ("g", g8)], layer_norm)
    t.case("layer_norm_eps", "layer_norm", [("x", x * 1e-2), ("g", g8), ("b", b8)],
           lambda a, g, b: layer_norm(a, g, b, eps=1e-3), {"eps": 1e-3})
    g3, b3 = normal(3), normal(3)
    t.case("layer_norm_axis1", "layer_norm", [("x", x), ("g", g3), ("b", b3)],
           lambda a, g, b: layer_norm(a, g, b, axis=1), {"axis": 1})
    t.case("rms_norm", "rms_norm", [("x", x), ("g", g8)], rms_norm, lowp=True)
    t.case("rms_norm_axis_neg2", "rms_norm", [("x", x), ("g", g3)], lambda a, g: rms_norm(a, g, axis=-2),
           {"axis": -2})
    t.case("rms_norm_eps", "rms_norm", [("x", x), ("g", g8)], lambda a, g: rms_norm(a, g, eps=0.5), {"eps": 0.5})
    for shape in [(2, 4, 3, 5), (6, 4)]:
        c = shape[1]
        t.case(f"batch_norm_rank{len(shape)}", "batch_norm",
               [("x", normal(*shape)), ("s", normal(c)), ("b", normal(c)), ("m", normal(c)), ("v", positive(c))],
               batch_norm, lowp=len(shape) == 4)


def matmul_cases(t):
    cases = [
        ("2d", (5, 7), (7, 3), {}),
        ("batch", (2, 5, 7), (2, 7, 3), {}),
        ("batch_bcast", (2, 1, 5, 7), (4, 7, 3), {}),  # [2,1] x [4] -> [2,4]
        ("rhs_2d", (3, 5, 7), (7, 4), {}),
        ("lhs_1d", (7,), (2, 7, 3), {}),
        ("rhs_1d", (2, 5, 7), (7,), {}),
        ("both_1d", (7,), (7,), {}),
        ("ta", (7, 5), (7, 3), {"transpose_a": True}),
        ("tb", (5, 7), (3, 7), {"transpose_b": True}),
        ("ta_tb_batch", (2, 7, 5), (1, 3, 7), {"transpose_a": True, "transpose_b": True}),
    ]
    for name, sa, sb, attrs in cases:
        t.case(f"matmul_{name}", "matmul", [("a", normal(*sa)), ("b", normal(*sb))],
               lambda a, b, at=attrs: matmul(a, b, **at), attrs, lowp=name in ("batch_bcast", "tb"))


def conv_cases(t):
    cases = [
        ("plain", (2, 3, 7, 6), (4, 3, 3, 3), {}),
        ("strided", (1, 2, 9, 8), (3, 2, 3, 2), {"strides": [2, 3]}),
        ("padded", (1, 2, 5, 5), (2, 2, 3, 3), {"pads": [1, 2, 0, 1]}),
        ("dilated", (1, 2, 9, 9), (2, 2, 3, 3), {"dilations": [2, 3]}),
        ("grouped", (2, 6, 5, 5), (4, 3, 3, 3), {"groups": 2}),
        ("depthwise", (1, 4, 6, 6), (4, 1, 3, 3), {"groups": 4, "pads": [1, 1, 1, 1]}),
        ("all", (2, 4, 10, 9), (6, 2, 3, 2),
         {"groups": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ]
    for name, sx, sw, attrs in cases:
        ins = [("x", normal(*sx)), ("w", normal(*sw))]
        t.case(f"conv2d_{name}", "conv2d", ins, lambda x, w, at=attrs: conv2d(x, w, **at), attrs,
               lowp=name == "all")
    t.case("conv2d_bias", "conv2d", [("x", normal(1, 3, 6, 6)), ("w", normal(2, 3, 3, 3)), ("b", normal(2))],
           lambda x, w, b: conv2d(x, w, b, pads=(1, 1, 1, 1)), {"pads": [1, 1, 1, 1]})


def pool_cases(t):
    x = normal(2, 3, 7, 6)
    cases = [
        ("k2", {"kernel": [2, 2]}),
        ("k3s1", {"kernel": [3, 3], "strides": [1, 1]}),
        ("k3s2_pad", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("asym_pad", {"kernel": [2, 3], "strides": [1, 2], "pads": [1, 0, 0, 2]}),
    ]
    for name, attrs in cases:
        kw = dict(kernel=attrs["kernel"], strides=attrs.get("strides"), pads=attrs.get("pads", (0, 0, 0, 0)))
        t.case(f"max_pool2d_{name}", "max_pool2d", [("x", x)], lambda a, kw=kw: pool2d(a, kind="max", **kw), attrs)
        t.case(f"avg_pool2d_{name}", "avg_pool2d", [("x", x)], lambda a, kw=kw: pool2d(a, kind="avg", **kw), attrs,
               lowp=name == "k3s2_pad")
    t.case("global_avg_pool", "global_avg_pool", [("x", x)], lambda a: a.mean(axis=(2, 3), keepdims=True),
           lowp=True)


def movement_cases(t):
    x = normal(2, 3, 4)
    t.case("reshape", "reshape", [("x", x)], lambda a: a.reshape(4, 6), {"shape": [4, 6]})
    t.case("reshape_infer", "reshape", [("x", x)], lambda a: a.reshape(2, -1, 2), {"shape": [2, -1, 2]})
    t.case("transpose_perm", "transpose", [("x", x)], lambda a: a.transpose(1, 2, 0), {"perm": [1, 2, 0]},
           lowp=True)
    t.case("transpose_neg_perm", "transpose", [("x", x)], lambda a: a.transpose(2, 0, 1), {"perm": [-1, 0, 1]})
    t.case("transpose_default", "transpose", [("x", x)], lambda a: a.transpose())
    y, z = normal(2, 5, 4), normal(2, 1, 4)
    t.case("concat_axis1", "concat", [("a", x), ("b", y), ("c", z)], lambda a, b, c: np.concatenate([a, b, c], 1),
           {"axis": 1})
    t.case("concat_neg_axis", "concat", [("a", x), ("b", normal(2, 3, 2))],
           lambda a, b: np.concatenate([a, b], -1), {"axis": -1})
    t.case("concat_one", "concat", [("a", x)], lambda a: a, {"axis": 0})
    xs = normal(3, 10)
    for name, sa in [
        ("basic", dict(axis=1, start=2, end=7)),
        ("step", dict(axis=1, start=1, end=9, step=3)),
        ("neg_start_end", dict(axis=-1, start=-6, end=-1)),
        ("neg_step", dict(axis=1, start=8, end=1, step=-2)),
        ("reverse", dict(axis=1, start=-1, end=-(2**63), step=-1)),
        ("neg_step_from_neg", dict(axis=-1, start=-2, end=-9, step=-3)),
        ("clamped", dict(axis=0, start=-100, end=100)),
        ("empty", dict(axis=1, start=5, end=2)),
        ("end_default", dict(axis=1, start=4)),
    ]:
        t.case(f"slice_{name}", "slice", [("x", xs)], lambda a, sa=sa: slice_ref(a, **sa), sa)
    t.case("split_equal", "split", [("x", normal(6, 4))], lambda a: split_ref(a, 0, parts=3), {"axis": 0}, nout=3)
    t.case("split_sizes", "split", [("x", normal(2, 7))], lambda a: split_ref(a, -1, sizes=[2, 4, 1]),
           {"axis": -1, "sizes": [2, 4, 1]}, nout=3, lowp=True)
    t.case("split_zero_part", "split", [("x", normal(3, 4))], lambda a: split_ref(a, 1, sizes=[4, 0]),
           {"axis": 1, "sizes": [4, 0]}, nout=2)
    emb = normal(10, 6)
    idx = np.array([[0, 9, -1], [3, -10, 5]], dtype=np.int32)
    t.case("gather_embedding", "gather", [("d", emb), ("i", idx)], lambda d, i: np.take(d, i, axis=0), lowp=True)
    idx64 = np.array([-1, 0, 2, -3], dtype=np.int64)
    t.case("gather_axis_neg", "gather", [("d", x), ("i", idx64)], lambda d, i: np.take(d, i, axis=-1),
           {"axis": -1})
    t.case("gather_axis1_scalar", "gather", [("d", x), ("i", np.array(2, dtype=np.int64))],
           lambda d, i: np.take(d, i, axis=1), {"axis": 1})
    for name, sx, shape in [
        ("row", (4,), [3, 4]),
        ("middle", (3, 1), [2, 3, 5]),
        ("onnx_smaller_shape", (2, 3), [1, 3]),  # shape broadcasts with the input (ONNX)
        ("scalar", (), [2, 2]),
    ]:
        t.case(f"expand_{name}", "expand", [("x", normal(*sx))], lambda a, s=shape: expand_ref(a, s),
               {"shape": shape}, lowp=name == "middle")
    x1 = normal(1, 3, 1, 4)
    t.case("squeeze_all", "squeeze", [("x", x1)], np.squeeze)
    t.case("squeeze_axes", "squeeze", [("x", x1)], lambda a: np.squeeze(a, axis=(0, -2)), {"axes": [0, -2]})
    t.case("unsqueeze", "unsqueeze", [("x", x)], lambda a: np.expand_dims(a, (0, 4)), {"axes": [0, 4]})
    t.case("unsqueeze_neg", "unsqueeze", [("x", x)], lambda a: np.expand_dims(a, (-1, 1)), {"axes": [-1, 1]})


def attention_cases(t):
    b, h, hkv, s, tt, d = 2, 4, 2, 3, 5, 8
    q, k, v = normal(b, h, s, d), normal(b, hkv, tt, d), normal(b, hkv, tt, d)
    t.case("attention_mha", "attention", [("q", q), ("k", normal(b, h, tt, d)), ("v", normal(b, h, tt, d))],
           attention, lowp=True)
    t.case("attention_gqa", "attention", [("q", q), ("k", k), ("v", v)], attention)
    t.case("attention_gqa_causal_offset", "attention", [("q", q), ("k", k), ("v", v)],
           lambda a, b_, c: attention(a, b_, c, causal=True), {"causal": True}, lowp=True)
    t.case("attention_mqa_scale", "attention", [("q", q), ("k", k[:, :1]), ("v", v[:, :1])],
           lambda a, b_, c: attention(a, b_, c, scale=0.3), {"scale": 0.3})
    t.case("attention_causal_square", "attention",
           [("q", normal(1, 2, 4, d)), ("k", normal(1, 1, 4, d)), ("v", normal(1, 1, 4, d))],
           lambda a, b_, c: attention(a, b_, c, causal=True), {"causal": True})
    t.case("attention_decode", "attention",
           [("q", normal(1, 4, 1, d)), ("k", normal(1, 2, 9, d)), ("v", normal(1, 2, 9, d))],
           lambda a, b_, c: attention(a, b_, c, causal=True), {"causal": True})
    # an additive mask broadcast from [S,T], with -inf holes (never a whole row)
    m = normal(s, tt)
    m[RNG.random((s, tt)) < 0.3] = -np.inf
    m[:, 0] = 0.0
    t.case("attention_gqa_mask", "attention", [("q", q), ("k", k), ("v", v), ("m", m)], attention, lowp=True)
    # a [B,1,S,T] mask together with causal: the last key of each row stays open
    m4 = normal(b, 1, s, tt)
    m4[RNG.random((b, 1, s, tt)) < 0.3] = -np.inf
    m4[..., tt - s:] = np.where(np.eye(s, dtype=bool), 0.0, m4[..., tt - s:])
    t.case("attention_gqa_mask_causal", "attention", [("q", q), ("k", k), ("v", v), ("m", m4)],
           lambda a, b_, c, mm: attention(a, b_, c, mm, causal=True), {"causal": True})
    bm = RNG.random((b, h, s, tt)) < 0.6
    bm[..., 1] = True
    t.case("attention_bool_mask", "attention", [("q", q), ("k", k), ("v", v), ("m", bm)], attention)
    dv = normal(b, hkv, tt, 3)
    t.case("attention_dv_differs", "attention", [("q", q), ("k", k), ("v", dv)], attention)


def rope_cases(t):
    x = normal(2, 3, 6, 8)  # [B, H, S, D]
    pos = RNG.integers(0, 512, (6,)).astype(np.int32)
    for style in ("half", "interleaved"):
        t.case(f"rope_{style}", "rope", [("x", x), ("p", pos)], lambda a, p, st=style: rope(a, p, style=st),
               {"style": style}, lowp=True)
        t.case(f"rope_{style}_partial", "rope", [("x", x), ("p", pos)],
               lambda a, p, st=style: rope(a, p, rotary_dim=4, style=st), {"style": style, "rotary_dim": 4},
               lowp=style == "half")
    pos64 = np.arange(6, dtype=np.int64) + 100
    t.case("rope_base_i64_rank2", "rope", [("x", normal(6, 10)), ("p", pos64)],
           lambda a, p: rope(a, p, rotary_dim=6, base=500.0, style="interleaved"),
           {"style": "interleaved", "rotary_dim": 6, "base": 500.0})


def lm_numpy_scatter(dst, idx, src, axis):
    """dst with src[..., i, ...] written at idx[i] along axis, in order (a
    repeated index: the last write wins)."""
    out = dst.copy()
    for i, k in enumerate(idx):
        o = [slice(None)] * dst.ndim
        o[axis] = int(k)
        s = [slice(None)] * dst.ndim
        s[axis] = i
        out[tuple(o)] = src[tuple(s)]
    return out


def cache_attention(q, k, v, pos, scale=None):
    """attention with cache: true: query i attends cache slots 0..pos[i]."""
    t = k.shape[2]
    m = np.where(np.arange(t)[None, :] <= np.asarray(pos)[:, None], 0.0, -np.inf)
    return attention(q, k, v, mask=m, scale=scale)


LM_DEVICES = ("ref", "cpu")


def topk_ref(x, k, axis=-1, largest=True):
    """numpy's topk: (values, i32 indices) of the k best along axis, best
    first; NaN counts as the largest, equal values go to the lower index.
    One lexsort (an argsort on several keys) per row: NaN-ness, then the
    value (negated for largest), then the index."""
    xm = np.moveaxis(np.asarray(x), axis, -1)
    v = xm.astype(np.float64)
    nan = np.isnan(v)
    val = np.where(nan, 0.0, v)
    idx = np.broadcast_to(np.arange(v.shape[-1]), v.shape)
    keys = (idx, -val, ~nan) if largest else (idx, val, nan)
    order = np.lexsort(keys, axis=-1)[..., :k]
    values = np.take_along_axis(xm, order, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(order.astype(np.int32), -1, axis)


def lm_cases(t):
    """scatter, attention with cache: true, argmax, topk, arange, on ref and cpu."""
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    # scatter out of place (the destination is an input): a copy, then the rows
    dst, src = f32(normal(6, 4)), f32(normal(3, 4))
    idx = np.array([4, 0, 2], dtype=np.int32)
    t.run_model("scatter_axis0", [("d", "f32", dst.shape), ("i", "i32", idx.shape), ("s", "f32", src.shape)],
                [(["y"], "scatter", ["d", "i", "s"], {})], ["y"], {"d": dst, "i": idx, "s": src},
                {"y": lm_numpy_scatter(dst, idx, src, 0)}, "exact", devices=LM_DEVICES)
    dst, src = f32(normal(2, 3, 7, 4)), f32(normal(2, 3, 3, 4))
    idx = np.array([6, 1, 6], dtype=np.int64)  # repeated: the last write wins
    t.run_model("scatter_axis2_i64_repeated", [("d", "f32", dst.shape), ("i", "i64", idx.shape),
                                               ("s", "f32", src.shape)],
                [(["y"], "scatter", ["d", "i", "s"], {"axis": 2})], ["y"], {"d": dst, "i": idx, "s": src},
                {"y": lm_numpy_scatter(dst, idx, src, 2)}, "exact", devices=LM_DEVICES)
    dst, src = f32(normal(5, 6)), f32(normal(5, 2))
    idx = np.array([5, 0], dtype=np.int32)
    t.run_model("scatter_last_axis", [("d", "f32", dst.shape), ("i", "i32", idx.shape), ("s", "f32", src.shape)],
                [(["y"], "scatter", ["d", "i", "s"], {"axis": -1})], ["y"], {"d": dst, "i": idx, "s": src},
                {"y": lm_numpy_scatter(dst, idx, src, 1)}, "exact", devices=LM_DEVICES)
    # scatter in place into a state (zero at the start of the run); the
    # result is read by an add (a state's update is not an output)
    cache = (1, 2, 8, 4)
    k, b = f32(normal(1, 2, 3, 4)), f32(normal(*cache))
    p = np.array([2, 5, 7], dtype=np.int32)
    t.run_model("scatter_state", [("p", "i32", p.shape), ("k", "f32", k.shape), ("b", "f32", cache)],
                [(["kc"], "scatter", ["k_cache", "p", "k"], {"axis": 2}), (["y"], "add", ["kc", "b"], {})], ["y"],
                {"p": p, "k": k, "b": b}, {"y": lm_numpy_scatter(np.zeros(cache), p, k, 2) + b}, "f32",
                states=[("k_cache", "f32", cache)], devices=LM_DEVICES)
    bad = np.array([1, 8, 0], dtype=np.int32)
    t.run_model("scatter_state_index_outside_is_an_error", [("p", "i32", p.shape), ("k", "f32", k.shape),
                                                             ("b", "f32", cache)],
                [(["kc"], "scatter", ["k_cache", "p", "k"], {"axis": 2}), (["y"], "add", ["kc", "b"], {})], ["y"],
                {"p": bad, "k": k, "b": b}, {"y": None}, "f32", expect_error="node 'kc' (scatter)",
                states=[("k_cache", "f32", cache)], devices=LM_DEVICES)
    # attention over caches given as inputs: query i sees slots 0..pos[i]
    q, kc, vc = f32(normal(2, 4, 3, 8)), f32(normal(2, 2, 10, 8)), f32(normal(2, 2, 10, 8))
    for name, pos in [("i32", np.array([4, 5, 9], dtype=np.int32)), ("i64_ties", np.array([0, 2, 2], dtype=np.int64))]:
        dt = "i32" if pos.dtype == np.int32 else "i64"
        t.run_model(f"attention_cache_{name}", [("q", "f32", q.shape), ("k", "f32", kc.shape),
                                                ("v", "f32", vc.shape), ("p", dt, pos.shape)],
                    [(["y"], "attention", ["q", "k", "v", "p"], {"cache": True})], ["y"],
                    {"q": q, "k": kc, "v": vc, "p": pos}, {"y": cache_attention(q, kc, vc, pos)}, "f32",
                    devices=LM_DEVICES)
    t.run_model("attention_cache_scale_dv", [("q", "f32", q.shape), ("k", "f32", kc.shape),
                                             ("v", "f32", (2, 2, 10, 3)), ("p", "i32", (3,))],
                [(["y"], "attention", ["q", "k", "v", "p"], {"cache": True, "scale": 0.2})], ["y"],
                {"q": q, "k": kc, "v": f32(vc[..., :3]), "p": np.array([9, 0, 3], dtype=np.int32)},
                {"y": cache_attention(q, kc, vc[..., :3], [9, 0, 3], scale=0.2)}, "f32", devices=LM_DEVICES)
    # the layer of a causal LM: this run's rotated keys and values scattered
    # into state caches, attention over them (slots 0..2 are still zero)
    cache = (1, 2, 12, 8)
    q, k, v = f32(normal(1, 4, 3, 8)), f32(normal(1, 2, 3, 8)), f32(normal(1, 2, 3, 8))
    p = np.array([3, 4, 5], dtype=np.int32)
    kr = rope(k.astype(np.float64), p)
    want = cache_attention(rope(q.astype(np.float64), p), lm_numpy_scatter(np.zeros(cache), p, kr, 2),
                           lm_numpy_scatter(np.zeros(cache), p, v, 2), p)
    t.run_model("attention_cache_state_rope",
                [("q", "f32", q.shape), ("k", "f32", k.shape), ("v", "f32", v.shape), ("p", "i32", p.shape)],
                [(["qr"], "rope", ["q", "p"], {}), (["kr"], "rope", ["k", "p"], {}),
                 (["kc"], "scatter", ["k_cache", "p", "kr"], {"axis": 2}),
                 (["vc"], "scatter", ["v_cache", "p", "v"], {"axis": 2}),
                 (["y"], "attention", ["qr", "kc", "vc", "p"], {"cache": True})], ["y"],
                {"q": q, "k": k, "v": v, "p": p}, {"y": want}, "f32",
                states=[("k_cache", "f32", cache), ("v_cache", "f32", cache)], devices=LM_DEVICES)
    # argmax: the first index of the maximum, the first NaN wins; i32
    x = f32(small_ints(3, 5, 7))  # ties
    for axis, keep in [(-1, False), (1, True), (0, False)]:
        t.run_model(f"argmax_axis{axis}_keep{int(keep)}", [("x", "f32", x.shape)],
                    [(["y"], "argmax", ["x"], {"axis": axis, "keepdims": keep})], ["y"], {"x": x},
                    {"y": np.argmax(x, axis=axis, keepdims=keep).astype(np.int32)}, "exact", devices=LM_DEVICES)
    xn = f32(normal(4, 6))
    xn[0, 3] = np.nan
    xn[1, 0] = np.nan
    xn[1, 4] = np.nan
    xn[2, 5] = np.inf
    xn[3, :] = -np.inf
    t.run_model("argmax_nan_inf", [("x", "f32", xn.shape)], [(["y"], "argmax", ["x"], {})], ["y"], {"x": xn},
                {"y": np.argmax(xn, axis=-1).astype(np.int32)}, "exact", devices=LM_DEVICES)
    xi = RNG.integers(-4, 4, (5, 9)).astype(np.int32)
    t.run_model("argmax_i32", [("x", "i32", xi.shape)], [(["y"], "argmax", ["x"], {"axis": 1})], ["y"], {"x": xi},
                {"y": np.argmax(xi, axis=1).astype(np.int32)}, "exact", devices=LM_DEVICES)
    xl = f32(normal(1, 300))
    t.run_model("argmax_vocab", [("x", "f32", xl.shape)], [(["y"], "argmax", ["x"], {"axis": -1})], ["y"],
                {"x": xl}, {"y": np.argmax(xl, axis=-1).astype(np.int32)}, "exact", devices=LM_DEVICES)
    # topk: (values, i32 indices) of the k largest (or smallest), best first
    def topk_case(name, x, k, axis=-1, largest=True, outs=("v", "i"), dt=None):
        dt = dt or YAML_DTYPES[x.dtype]
        v, i = topk_ref(x, k, axis, largest)
        want = {o: w for o, w in (("v", v), ("i", i)) if o in outs}
        attrs = {"k": k} | ({"axis": axis} if axis != -1 else {}) | ({} if largest else {"largest": False})
        t.run_model(name, [("x", dt, x.shape)], [(["v", "i"], "topk", ["x"], attrs)], list(outs), {"x": x}, want,
                    "exact", devices=LM_DEVICES)

    x = f32(small_ints(3, 5, 7))  # ties
    topk_case("topk_ties_axis-1_k3", x, 3)
    topk_case("topk_ties_axis1_k2_smallest", x, 2, axis=1, largest=False)
    topk_case("topk_ties_axis0_whole_axis", x, 3, axis=0)
    xs = f32(normal(4, 8))
    xs[0, [1, 5, 6]] = np.nan
    xs[1, 2], xs[1, 6], xs[1, 7] = np.inf, -np.inf, np.inf
    xs[2, :4] = 0.0
    xs[2, 4:] = -0.0
    xs[3, :] = -np.inf
    for largest in (True, False):
        topk_case(f"topk_nan_inf_zeros_largest{int(largest)}", xs, 5, largest=largest)
    xi = RNG.integers(-4, 4, (5, 9)).astype(np.int32)
    topk_case("topk_i32_axis0", xi, 4, axis=0)
    xu = RNG.integers(0, 6, (3, 10)).astype(np.uint8)
    topk_case("topk_u8_smallest", xu, 4, largest=False)
    xh = normal(2, 300).astype(np.float16)  # f16 ties among 300 values
    topk_case("topk_f16_vocab_k50", xh, 50)
    xv = f32(normal(2, 32000))
    topk_case("topk_vocab_32000_k50", xv, 50)
    topk_case("topk_indices_only", xv, 40, outs=("i",))
    topk_case("topk_values_only", f32(normal(3, 4, 6)), 2, axis=1, outs=("v",))
    t.run_model("topk_k_beyond_cpu_limit", [("x", "f32", (1, 5000))], [(["v", "i"], "topk", ["x"], {"k": 4097})],
                ["v", "i"], {"x": f32(normal(1, 5000))}, {"v": None, "i": None}, "exact",
                expect_error="keeps at most 4096 per row", devices=("cpu",))
    # arange: start[0] + [0, size) in start's dtype
    for name, start in [("i32", np.array([5], dtype=np.int32)), ("i64_negative", np.array([-3], dtype=np.int64))]:
        dt = YAML_DTYPES[start.dtype]
        t.run_model(f"arange_{name}", [("s", dt, start.shape)], [(["y"], "arange", ["s"], {"size": 7})], ["y"],
                    {"s": start}, {"y": (start[0] + np.arange(7)).astype(start.dtype)}, "exact", devices=LM_DEVICES)


def error_cases(t):
    d = normal(4, 3).astype(np.float32)
    i = np.array([1, 4], dtype=np.int32)
    t.run_model("gather_out_of_range_is_an_error", [("d", "f32", d.shape), ("i", "i32", i.shape)],
                [(["emb"], "gather", ["d", "i"], {})], ["emb"], {"d": d, "i": i}, {"emb": None}, "exact",
                expect_error="node 'emb' (gather)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", required=True, help="path to the smelt binary")
    ap.add_argument("-k", default="", help="run only cases whose name contains this")
    ap.add_argument("-v", action="store_true", help="print every case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="smelt_ops_") as tmp:
        t = Runner(os.path.abspath(args.smelt), tmp, args.v, args.k)
        for group in (unary_cases, cast_cases, binary_cases, where_cases, reduce_cases, softmax_cases, norm_cases,
                      matmul_cases, conv_cases, pool_cases, movement_cases, attention_cases, rope_cases,
                      lm_cases, error_cases):
            group(t)
        total = t.passed + len(t.failed)
        print(f"test_ops: {t.passed}/{total} cases passed")
        if total == 0:
            print("test_ops: no case ran")
            return 1
        return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
