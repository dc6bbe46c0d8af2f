"""smelt YAML model -> ONNX graph, for ONNX Runtime as a benchmark peer.

The model is read and flattened by yaml_model.py (IR names such as
`layer.0/wq`, dims substituted, shapes known); each smelt node becomes one
ONNX operator where ONNX has it (opset 23: Gelu with either approximation,
LayerNormalization, RMSNormalization, Softmax, Conv, ...) and a few
primitives where it does not:

  silu        x * Sigmoid(x)
  rsqrt       Reciprocal(Sqrt(x))
  matmul      Transpose of the last two axes for transpose_a / transpose_b
  attention   MatMul(q, k^T) * scale (+ mask) (+ causal mask) -> Softmax
              -> MatMul(., v); grouped-query k and v are widened from Hkv to
              H heads by Reshape-Expand-Reshape (query head h reads kv head
              h // (H / Hkv), as in SPEC §3).  The causal mask is a constant
              [S, T] of 0 and -1e30 (query i sees keys up to T - S + i).
  rope        angles = Cast(pos) * inv_freq computed in the graph (so pos
              stays an input), then Cos / Sin and the rotation of the first
              rotary_dim features, `half` (LLaMA) or `interleaved` (GPT-J)
  avg_pool2d  AveragePool with count_include_pad = 0 (SPEC: ONNX default)

Value names are smelt's IR names, so an ONNX intermediate can be compared
with `smelt run --output NAME=...`.  Weights are not invented here: the
caller passes every param's array (the benchmark dumps them from smelt),
so both sides compute with identical numbers.

Usage as a tool:
  onnx_export.py MODEL.yaml -o OUT.onnx --weights-dir DIR [--dim k=v]...
(DIR holds NAME.npy per param, '/' in NAME written as '__').
"""
import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import yaml_model  # noqa: E402

OPSET = 23  # RMSNormalization appeared in 23; Gelu's approximate in 20
ONNX_DTYPE = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16,
              "f64": TensorProto.DOUBLE, "i64": TensorProto.INT64, "i32": TensorProto.INT32,
              "i8": TensorProto.INT8, "u8": TensorProto.UINT8, "bool": TensorProto.BOOL}
NP_DTYPE = {"f32": np.float32, "f16": np.float16, "f64": np.float64}
UNARY = {"neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
         "reciprocal": "Reciprocal", "tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu",
         "erf": "Erf", "sin": "Sin", "cos": "Cos"}
BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max",
          "minimum": "Min", "less": "Less", "greater": "Greater", "equal": "Equal"}
REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin"}


class Unsupported(Exception):
    pass


class _Builder:
    def __init__(self, model):
        self.m = model
        self.nodes, self.inits = [], []
        self.count = 0
        self.cache = {}  # shared constants and rope tables

    def fresh(self, hint):
        self.count += 1
        return f"_{hint}_{self.count}"

    def op(self, op_type, ins, hint="t", outs=None, **attrs):
        outs = outs or [self.fresh(hint)]
        self.nodes.append(helper.make_node(op_type, ins, outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def const(self, array, hint="c"):
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.cache:
            name = self.fresh(hint)
            self.inits.append(numpy_helper.from_array(array, name))
            self.cache[key] = name
        return self.cache[key]

    def i64(self, values):
        return self.const(np.asarray(values, dtype=np.int64), "i64")

    def scalar(self, value, dt):
        return self.const(np.asarray(value, dtype=NP_DTYPE[dt]), "s")

    # ---------------------------------------------------------------- ops

    def emit(self, n):
        m, a = self.m, n.attrs
        ins, out = n.ins, n.outs[0]
        shape = [m.shape[i] for i in ins]
        dt = m.dtype[ins[0]] if ins else "f32"
        if n.op in UNARY:
            self.op(UNARY[n.op], ins, outs=[out])
        elif n.op == "rsqrt":
            self.op("Reciprocal", [self.op("Sqrt", ins)], outs=[out])
        elif n.op == "gelu":
            self.op("Gelu", ins, outs=[out], approximate=a.get("approximate", "none"))
        elif n.op == "silu":
            self.op("Mul", [ins[0], self.op("Sigmoid", ins)], outs=[out])
        elif n.op == "cast":
            self.op("Cast", ins, outs=[out], to=ONNX_DTYPE[a["to"]])
        elif n.op in BINARY:
            self.op(BINARY[n.op], ins, outs=[out])
        elif n.op == "where":
            self.op("Where", ins, outs=[out])
        elif n.op in REDUCE:
            extra = [self.i64(a["axes"])] if a.get("axes") is not None else []
            self.op(REDUCE[n.op], ins + extra, outs=[out], keepdims=int(bool(a.get("keepdims", False))))
        elif n.op in ("softmax", "log_softmax"):
            self.op("Softmax" if n.op == "softmax" else "LogSoftmax", ins, outs=[out], axis=a.get("axis", -1))
        elif n.op in ("layer_norm", "rms_norm"):
            ax = a.get("axis", -1)
            if ax not in (-1, len(shape[0]) - 1):
                # ONNX normalises over axes [axis, rank); smelt over one axis.
                raise Unsupported(f"{n.op} over axis {ax}, not the last")
            eps = a.get("eps", 1e-5 if n.op == "layer_norm" else 1e-6)
            self.op("LayerNormalization" if n.op == "layer_norm" else "RMSNormalization", ins, outs=[out],
                    axis=-1, epsilon=float(eps))
        elif n.op == "batch_norm":
            self.op("BatchNormalization", ins, outs=[out], epsilon=float(a.get("eps", 1e-5)))
        elif n.op == "matmul":
            x, y = ins
            if a.get("transpose_a"):
                x = self.swap_last(x, len(shape[0]))
            if a.get("transpose_b"):
                y = self.swap_last(y, len(shape[1]))
            self.op("MatMul", [x, y], outs=[out])
        elif n.op == "conv2d":
            k = shape[1][2:]
            self.op("Conv", ins, outs=[out], kernel_shape=list(k), strides=a.get("strides", [1, 1]),
                    pads=a.get("pads", [0, 0, 0, 0]), dilations=a.get("dilations", [1, 1]),
                    group=a.get("groups", 1))
        elif n.op in ("max_pool2d", "avg_pool2d"):
            kw = dict(kernel_shape=a["kernel"], strides=a.get("strides", a["kernel"]),
                      pads=a.get("pads", [0, 0, 0, 0]))
            if n.op == "avg_pool2d":
                kw["count_include_pad"] = 0
            self.op("MaxPool" if n.op == "max_pool2d" else "AveragePool", ins, outs=[out], **kw)
        elif n.op == "global_avg_pool":
            self.op("GlobalAveragePool", ins, outs=[out])
        elif n.op == "reshape":
            # The inferred shape, not the attribute: ONNX reads 0 as "copy".
            self.op("Reshape", [ins[0], self.i64(m.shape[out])], outs=[out])
        elif n.op == "transpose":
            perm = a.get("perm") or list(range(len(shape[0])))[::-1]
            self.op("Transpose", ins, outs=[out], perm=perm)
        elif n.op == "concat":
            self.op("Concat", ins, outs=[out], axis=a.get("axis", 0))
        elif n.op == "slice":
            end = a.get("end", 2**63 - 1)
            self.op("Slice", [ins[0], self.i64([a.get("start", 0)]), self.i64([end]),
                              self.i64([a.get("axis", 0)]), self.i64([a.get("step", 1)])], outs=[out])
        elif n.op == "split":
            ax = a.get("axis", 0)
            sizes = [m.shape[o][ax] for o in n.outs]
            self.op("Split", [ins[0], self.i64(sizes)], outs=list(n.outs), axis=ax)
        elif n.op == "gather":
            self.op("Gather", ins, outs=[out], axis=a.get("axis", 0))
        elif n.op == "expand":
            self.op("Expand", [ins[0], self.i64(m.shape[out])], outs=[out])
        elif n.op == "squeeze":
            extra = [self.i64(a["axes"])] if a.get("axes") is not None else []
            self.op("Squeeze", ins + extra, outs=[out])
        elif n.op == "unsqueeze":
            self.op("Unsqueeze", [ins[0], self.i64(a["axes"])], outs=[out])
        elif n.op == "attention":
            self.attention(n, shape, dt)
        elif n.op == "rope":
            self.rope(n, shape[0], dt)
        else:
            raise Unsupported(f"op '{n.op}' (node {out})")

    def swap_last(self, x, rank):
        if rank < 2:
            raise Unsupported("transpose_a/transpose_b of a vector")
        perm = list(range(rank))
        perm[-2:] = perm[-1:-3:-1]
        return self.op("Transpose", [x], "tr", perm=perm)

    def attention(self, n, shape, dt):
        q, k, v = n.ins[:3]
        b, h, s, d = shape[0]
        hkv, t = shape[1][1], shape[1][2]
        if h != hkv:
            g = h // hkv
            k, v = (self.widen(x, b, hkv, g, t, sh[3]) for x, sh in ((k, shape[1]), (v, shape[2])))
        scale = n.attrs.get("scale")
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        scores = self.op("MatMul", [q, self.op("Transpose", [k], "kt", perm=[0, 1, 3, 2])], "scores")
        scores = self.op("Mul", [scores, self.scalar(scale, dt)], "scaled")
        if len(n.ins) > 3:
            scores = self.op("Add", [scores, n.ins[3]], "masked")
        if n.attrs.get("causal"):
            allowed = np.arange(t)[None, :] <= (t - s + np.arange(s))[:, None]
            mask = np.where(allowed, 0.0, -1e30).astype(NP_DTYPE[dt])
            scores = self.op("Add", [scores, self.const(mask, "causal")], "causal")
        probs = self.op("Softmax", [scores], "probs", axis=-1)
        self.op("MatMul", [probs, v], outs=[n.outs[0]])

    def widen(self, x, b, hkv, g, t, d):
        """[B, Hkv, T, D] -> [B, Hkv * g, T, D], each kv head repeated g times
        in a row (np.repeat on axis 1)."""
        x = self.op("Reshape", [x, self.i64([b, hkv, 1, t, d])], "kv5")
        x = self.op("Expand", [x, self.i64([b, hkv, g, t, d])], "kvx")
        return self.op("Reshape", [x, self.i64([b, hkv * g, t, d])], "kvh")

    def rope(self, n, shape, dt):
        x, pos = n.ins
        a = n.attrs
        d = shape[-1]
        rd = a.get("rotary_dim") or d
        base = float(a.get("base", 10000.0))
        style = a.get("style", "half")
        key = ("rope", pos, rd, base)
        if key not in self.cache:
            inv_freq = base ** (-np.arange(0, rd // 2) * 2.0 / rd)
            p = self.op("Cast", [pos], "posf", to=ONNX_DTYPE[dt])
            p = self.op("Unsqueeze", [p, self.i64([1])], "pos2")
            ang = self.op("Mul", [p, self.const(inv_freq[None, :].astype(NP_DTYPE[dt]), "inv_freq")], "ang")
            self.cache[key] = (self.op("Cos", [ang], "cos"), self.op("Sin", [ang], "sin"))
        cos, sin = self.cache[key]

        def sl(start, end, step=1):
            return self.op("Slice", [x, self.i64([start]), self.i64([end]), self.i64([-1]), self.i64([step])], "sl")

        if style == "half":
            x1, x2 = sl(0, rd // 2), sl(rd // 2, rd)
        else:
            x1, x2 = sl(0, rd, 2), sl(1, rd, 2)
        y1 = self.op("Sub", [self.op("Mul", [x1, cos]), self.op("Mul", [x2, sin])], "y1")
        y2 = self.op("Add", [self.op("Mul", [x2, cos]), self.op("Mul", [x1, sin])], "y2")
        if style == "half":
            parts = [y1, y2]
        else:
            # interleave back: [..., rd/2, 2] -> [..., rd]
            pair = self.op("Concat", [self.op("Unsqueeze", [y, self.i64([-1])], "u") for y in (y1, y2)],
                           "pair", axis=-1)
            parts = [self.op("Reshape", [pair, self.i64(list(shape[:-1]) + [rd])], "inter")]
        if rd < d:
            parts.append(sl(rd, d))
        self.op("Concat", parts, outs=[n.outs[0]], axis=-1)


def export(model, weights):
    """An onnx.ModelProto of model (yaml_model.Model); weights maps every
    param's IR name to its array."""
    b = _Builder(model)
    for name in model.params:
        if name not in weights:
            raise KeyError(f"no array for param '{name}'")
        want = model.params[name][0]
        arr = np.asarray(weights[name])
        if tuple(arr.shape) != tuple(want):
            raise ValueError(f"param '{name}': array of shape {arr.shape}, the model says {want}")
        b.inits.append(numpy_helper.from_array(arr, name))
    for n in model.nodes:
        b.emit(n)
    outputs = []
    for o in model.outputs:
        src = model.resolve(o)
        if src != o:
            b.op("Identity", [src], outs=[o])
        outputs.append(helper.make_tensor_value_info(o, ONNX_DTYPE[model.dtype[o]], list(model.shape[o])))
    inputs = [helper.make_tensor_value_info(k, ONNX_DTYPE[dt], list(s)) for k, (s, dt) in model.inputs.items()]
    graph = helper.make_graph(b.nodes, model.name or "smelt", inputs, outputs, initializer=b.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="smelt bench/cpu/onnx_export.py")
    proto.ir_version = min(proto.ir_version, 10)  # what current ONNX Runtime releases read
    onnx.checker.check_model(proto)
    return proto


def npy_name(name):
    """A value name as a file name: '/' cannot appear in one."""
    return name.replace("/", "__")


def main():
    ap = argparse.ArgumentParser(description="export a smelt YAML model to ONNX")
    ap.add_argument("model")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--weights-dir", required=True, help="NAME.npy per param ('/' as '__')")
    ap.add_argument("--dim", action="append", default=[], help="k=v, as smelt's --dim")
    args = ap.parse_args()
    dims = dict(kv.split("=", 1) for kv in args.dim)
    m = yaml_model.load(args.model, dims)
    weights = {p: np.load(os.path.join(args.weights_dir, npy_name(p) + ".npy")) for p in m.params}
    onnx.save(export(m, weights), args.output)
    print(f"{args.output}: {len(m.nodes)} smelt nodes, opset {OPSET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
