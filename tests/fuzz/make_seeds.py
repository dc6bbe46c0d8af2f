#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, tests/fuzz/corpus/NAME (committed).

    python3 tests/fuzz/make_seeds.py --smelt build/smelt

Run it again when a format changes (the bundle seeds carry the graph
encoding's version, so after a change of ir/serialize.c they stop at the
version check).  The seeds are small on purpose: libFuzzer mutates faster
and further from a few KB than from a model's weights.

  yaml         every model of examples/, tests/bad/cases, tests/passes/cases
               and tests/unit/models, plus models here that read the weights
               file fuzz_yaml puts beside each input (weights.safetensors)
  npy          numpy's own files of every dtype smelt reads, format versions
               1 to 3, and the refusals (Fortran order, big endian, ...)
  safetensors  small files of every dtype, with metadata, empty ones, and
               model.safetensors.index.json texts
  onnx         the two smallest models of tests/onnx/models and small graphs
               encoded here (shape arithmetic, conv/pool, attention, ...)
  bundle       tiny models compiled by smelt: CPU, CUDA (when NVRTC is
               there), both, specialisations, external weights, state
  elf          the CPU objects of those bundles
"""
import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def fresh(name):
    d = os.path.join(CORPUS, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def write(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors ----

def safetensors(tensors, metadata=None, pad=0):
    """tensors: list of (name, dtype string, shape, bytes)."""
    header, blob = {}, b""
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + blob


# The file fuzz_yaml writes beside every input (keep in step with fuzz_yaml.c).
def yaml_weights():
    f32 = lambda *shape: np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 10
    return safetensors([
        ("w", "F32", (4, 4), f32(4, 4).tobytes()),
        ("b", "F32", (4,), f32(4).tobytes()),
        ("emb", "F32", (8, 4), f32(8, 4).tobytes()),
        ("layers.0.w", "F32", (4, 4), f32(4, 4).tobytes()),
        ("layers.1.w", "F32", (4, 4), f32(4, 4).tobytes()),
        ("h", "BF16", (4,), (np.arange(4, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()),
        ("ids", "I64", (3,), np.arange(3, dtype=np.int64).tobytes()),
        ("u16", "U16", (2,), np.arange(2, dtype=np.uint16).tobytes()),
    ], metadata={"format": "pt"})


YAML_EXTRA = {
    "weights_from.yaml": """smelt: 1
name: wf
weights: weights.safetensors
inputs: {x: {shape: [2, 4]}}
params:
  w: {shape: [4, 4], from: w}
  b: {shape: [4], from: b}
nodes:
  - {out: m, op: matmul, in: [x, w]}
  - {out: y, op: add, in: [m, b]}
outputs: [y]
""",
    "weights_repeat.yaml": """smelt: 1
name: wr
dtype: f32
weights: [weights.safetensors]
dims: {n: 4}
inputs: {x: {shape: [2, n]}}
blocks:
  layer:
    inputs: [h]
    params: {w: {shape: [n, n], from: "layers.{i}.w"}}
    nodes:
      - {out: m, op: matmul, in: [h, w]}
      - {out: y, op: relu, in: [m]}
    outputs: [y]
nodes:
  - {out: z, repeat: layer, times: 2, in: [x]}
outputs: [z]
""",
    "weights_dtype.yaml": """smelt: 1
name: wd
dtype: bf16
weights: weights.safetensors
inputs: {ids: {shape: [3], dtype: i64}}
params:
  emb: {shape: [8, 4], dtype: f32, from: emb}
  h: {shape: [4], from: h}
  u: {shape: [2], dtype: i32, from: u16}
nodes:
  - {out: e, op: gather, in: [emb, ids], axis: 0}
  - {out: c, op: cast, in: [e], to: bf16}
  - {out: y, op: mul, in: [c, h]}
outputs: [y]
""",
    "anchors.yaml": """smelt: 1
name: an
inputs: {x: &s {shape: [2, 2]}, z: *s}
params:
  p: {shape: [2, 2], value: [[1, 2], [3, .inf]]}
  q: {shape: [2], dtype: i8, value: [-128, 127]}
  r: {shape: [], dtype: bool, value: true}
nodes:
  - {out: [a], op: add, in: [x, p]}
  - {out: y, op: mul, in: [a, z]}
outputs: [y, a]
""",
    "state.yaml": """smelt: 1
name: st
dims: {ctx: 4, d: 2}
inputs: {x: {shape: [1, d]}, pos: {shape: [1], dtype: i32}}
state: {cache: {shape: [ctx, d]}}
nodes:
  - {out: c2, op: scatter, in: [cache, pos, x], axis: 0}
  - {out: y, op: sum, in: [c2], axes: [0], keepdims: true}
outputs: [y]
""",
}


def seeds_yaml():
    d = fresh("yaml")
    for pattern in ("examples/*.yaml", "tests/bad/cases/*.yaml", "tests/passes/cases/*.yaml",
                    "tests/unit/models/*.yaml"):
        for p in sorted(glob.glob(os.path.join(ROOT, pattern))):
            tag = os.path.basename(os.path.dirname(p))
            shutil.copy(p, os.path.join(d, tag + "_" + os.path.basename(p)))
    for name, text in YAML_EXTRA.items():
        write(d, name, text)
    write(d, "deep_flow.yaml", "smelt: 1\nx: " + "[" * 300 + "]" * 300 + "\n")
    write(d, "empty.yaml", "")


# ---- .npy ----

def npy_bytes(arr, version=None):
    import io
    b = io.BytesIO()
    if version is None:
        np.save(b, arr)
    else:
        np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()


def seeds_npy():
    d = fresh("npy")
    for dt in ("<f4", "<f2", "<f8", "<i8", "<i4", "|i1", "|u1", "|b1"):
        a = (np.arange(6) % 2 if dt == "|b1" else np.arange(6)).astype(dt).reshape(2, 3)
        write(d, "a_%s.npy" % dt[1:], npy_bytes(a))
    write(d, "scalar.npy", npy_bytes(np.float32(1.5)))
    write(d, "empty.npy", npy_bytes(np.zeros((0, 3), np.float32)))
    write(d, "rank8.npy", npy_bytes(np.zeros((1, 2, 1, 2, 1, 1, 1, 2), np.int32)))
    write(d, "v2.npy", npy_bytes(np.arange(4, dtype=np.float32), version=(2, 0)))
    write(d, "v3.npy", npy_bytes(np.arange(4, dtype=np.float32), version=(3, 0)))
    write(d, "fortran.npy", npy_bytes(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))))
    write(d, "big_endian.npy", npy_bytes(np.arange(3, dtype=">f4")))
    write(d, "u16.npy", npy_bytes(np.arange(3, dtype="<u2")))


# ---- safetensors ----

def seeds_safetensors():
    d = fresh("safetensors")
    write(d, "weights.safetensors", yaml_weights())
    write(HERE, "weights.safetensors", yaml_weights())  # fuzz_yaml's side file
    dts = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64}
    write(d, "dtypes.safetensors", safetensors(
        [(k, k, (2,), np.arange(2).astype(v).tobytes()) for k, v in dts.items()] +
        [("bool", "BOOL", (3,), bytes([0, 1, 0])), ("bf16", "BF16", (1, 2), b"\x80\x3f\x00\x40"),
         ("f8", "F8_E4M3", (2,), b"\x01\x02")]))
    write(d, "scalar_and_empty.safetensors", safetensors([("s", "F32", (), b"\0\0\x80\x3f"),
                                                          ("z", "F32", (0, 4), b"")], metadata={}))
    write(d, "padded.safetensors", safetensors([("x", "F32", (2, 2), bytes(16))], pad=7))
    write(d, "none.safetensors", safetensors([]))
    write(d, "index.json", json.dumps({"metadata": {"total_size": 64}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
        "c": "model-00001-of-00002.safetensors"}}))


# ---- ONNX: a minimal protobuf encoder for the few messages a model needs ----

def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fv(field, v):  # varint field
    return varint(field << 3) + varint(v)


def fb(field, data):  # length-delimited field
    data = data.encode() if isinstance(data, str) else data
    return varint(field << 3 | 2) + varint(len(data)) + data


def ff(field, v):  # 32-bit float field
    return varint(field << 3 | 5) + struct.pack("<f", v)


FLOAT, UINT8, INT8, INT32, INT64, BOOL, FLOAT16, DOUBLE, BFLOAT16 = 1, 2, 3, 6, 7, 9, 10, 11, 16
NP = {FLOAT: np.float32, INT64: np.int64, INT32: np.int32, BOOL: np.bool_, FLOAT16: np.float16, UINT8: np.uint8,
      INT8: np.int8, DOUBLE: np.float64}


def tensor(name, dtype, array):
    a = np.asarray(array, dtype=NP[dtype])
    return b"".join(fv(1, d) for d in a.shape) + fv(2, dtype) + fb(8, name) + fb(9, a.tobytes())


def attr(name, v):
    if isinstance(v, float):
        return fb(1, name) + ff(2, v) + fv(20, 1)
    if isinstance(v, bool) or isinstance(v, int):
        return fb(1, name) + fv(3, int(v)) + fv(20, 2)
    if isinstance(v, str):
        return fb(1, name) + fb(4, v) + fv(20, 3)
    if isinstance(v, bytes):  # an encoded TensorProto
        return fb(1, name) + fb(5, v) + fv(20, 4)
    if isinstance(v, list) and all(isinstance(x, float) for x in v):
        return fb(1, name) + b"".join(ff(7, x) for x in v) + fv(20, 6)
    return fb(1, name) + b"".join(fv(8, x) for x in v) + fv(20, 7)


def node(op, ins, outs, name="", domain=None, **attrs):
    m = b"".join(fb(1, i) for i in ins) + b"".join(fb(2, o) for o in outs) + fb(3, name or op.lower()) + fb(4, op)
    if domain is not None:
        m += fb(7, domain)
    return m + b"".join(fb(5, attr(k, v)) for k, v in attrs.items())


def value_info(name, dtype, shape):
    dims = b"".join(fb(1, fb(2, s) if isinstance(s, str) else fv(1, s)) for s in shape or ())
    tt = fv(1, dtype) + (fb(2, dims) if shape is not None else b"")
    return fb(1, name) + fb(2, fb(1, tt))


def model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    g = b"".join(fb(1, n) for n in nodes) + fb(2, "g") + b"".join(fb(5, t) for t in inits)
    g += b"".join(fb(11, value_info(*i)) for i in inputs) + b"".join(fb(12, value_info(*o)) for o in outputs)
    return (fv(1, 8) + fb(2, "smelt-seeds") + fb(7, g) + fb(8, fb(1, "") + fv(2, opset)) +
            b"".join(fb(8, fb(1, dom) + fv(2, v)) for dom, v in domains))


def seeds_onnx():
    d = fresh("onnx")
    for m in ("cnn.ts17.onnx", "cnn.dyn18.onnx"):
        shutil.copy(os.path.join(ROOT, "tests", "onnx", "models", m), os.path.join(d, m))
    r = np.random.default_rng(0)
    w = lambda *s: r.standard_normal(s).astype(np.float32)
    write(d, "mlp.onnx", model(
        [node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), node("Relu", ["h"], ["a"]),
         node("MatMul", ["a", "w2"], ["m"]), node("Add", ["m", "b2"], ["s"]), node("Softmax", ["s"], ["y"], axis=-1)],
        [("x", FLOAT, ["batch", 4])], [("y", FLOAT, None)],
        [tensor("w1", FLOAT, w(8, 4)), tensor("b1", FLOAT, w(8)), tensor("w2", FLOAT, w(8, 3)),
         tensor("b2", FLOAT, w(3))]))
    write(d, "shape_arith.onnx", model(
        [node("Shape", ["x"], ["s"]), node("Gather", ["s", "i0"], ["n"], axis=0),
         node("Unsqueeze", ["n", "ax0"], ["n1"]), node("Concat", ["n1", "m1"], ["shp"], axis=0),
         node("Reshape", ["x", "shp"], ["r"]), node("Transpose", ["r"], ["t"], perm=[1, 0]),
         node("ConstantOfShape", ["shp"], ["c"], value=tensor("v", FLOAT, [1.0])),
         node("Range", ["z", "lim", "one"], ["rg"]), node("Cast", ["rg"], ["rgf"], to=FLOAT),
         node("Where", ["cond", "c", "r"], ["wh"]), node("Mul", ["wh", "rgf"], ["y"]), node("Sum", ["y", "t2"], ["y2"]),
         node("Identity", ["t"], ["t2"])],
        [("x", FLOAT, [2, 3, 2])], [("y2", FLOAT, None)],
        [tensor("i0", INT64, 0), tensor("ax0", INT64, [0]), tensor("m1", INT64, [-1]), tensor("z", INT64, 0),
         tensor("lim", INT64, 6), tensor("one", INT64, 1), tensor("cond", BOOL, np.ones((2, 6), bool))]))
    write(d, "conv_pool.onnx", model(
        [node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
         node("BatchNormalization", ["c", "g", "bt", "mu", "var"], ["bn"], epsilon=1e-5),
         node("LeakyRelu", ["bn"], ["l"], alpha=0.1), node("MaxPool", ["l"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         node("AveragePool", ["p"], ["ap"], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]),
         node("GlobalAveragePool", ["ap"], ["gp"]), node("Flatten", ["gp"], ["f"], axis=1),
         node("Pad", ["f", "pads"], ["pd"], mode="constant"), node("Clip", ["pd", "lo", "hi"], ["y"])],
        [("x", FLOAT, [1, 2, 4, 4])], [("y", FLOAT, None)],
        [tensor("cw", FLOAT, w(3, 2, 3, 3)), tensor("cb", FLOAT, w(3)), tensor("g", FLOAT, w(3)),
         tensor("bt", FLOAT, w(3)), tensor("mu", FLOAT, w(3)), tensor("var", FLOAT, np.ones(3)),
         tensor("pads", INT64, [0, 1, 0, 1]), tensor("lo", FLOAT, -1.0), tensor("hi", FLOAT, 1.0)]))
    write(d, "norm_reduce.onnx", model(
        [node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
         node("ReduceMean", ["ln", "axes"], ["rm"], keepdims=1), node("Sub", ["ln", "rm"], ["d"]),
         node("Pow", ["d", "two"], ["sq"]), node("ReduceSum", ["sq", "axes"], ["rs"], keepdims=0),
         node("Sqrt", ["rs"], ["sd"]), node("Erf", ["sd"], ["e"]), node("Gelu", ["ln"], ["ge"], approximate="tanh"),
         node("Slice", ["ge", "st", "en", "axes", "stp"], ["sl"]), node("Split", ["sl"], ["s0", "s1"], axis=1, num_outputs=2),
         node("Concat", ["s1", "s0"], ["cc"], axis=1), node("Expand", ["e", "eshape"], ["ex"]),
         node("Unsqueeze", ["ex", "axes"], ["y0"]), node("Add", ["y0", "cc"], ["y"])],
        [("x", FLOAT, [2, 4])], [("y", FLOAT, None)],
        [tensor("g", FLOAT, np.ones(4)), tensor("b", FLOAT, np.zeros(4)), tensor("axes", INT64, [-1]),
         tensor("two", FLOAT, 2.0), tensor("st", INT64, [0]), tensor("en", INT64, [4]), tensor("stp", INT64, [1]),
         tensor("eshape", INT64, [2])], opset=18))
    write(d, "attention.onnx", model(
        [node("MatMul", ["q", "kt"], ["s"]), node("Div", ["s", "scale"], ["sd"]),
         node("Trilu", ["sd"], ["tr"], upper=0), node("Softmax", ["tr"], ["p"], axis=-1), node("MatMul", ["p", "v"], ["o"]),
         node("Attention", ["q4", "k4", "v4"], ["a"], is_causal=1),
         node("ReduceMax", ["a"], ["y2"], keepdims=1), node("Tile", ["o", "reps"], ["y"])],
        [("q", FLOAT, [2, 3, 4]), ("kt", FLOAT, [2, 4, 3]), ("v", FLOAT, [2, 3, 4]),
         ("q4", FLOAT, [1, 2, 3, 4]), ("k4", FLOAT, [1, 2, 3, 4]), ("v4", FLOAT, [1, 2, 3, 4])],
        [("y", FLOAT, None), ("y2", FLOAT, None)],
        [tensor("scale", FLOAT, 2.0), tensor("reps", INT64, [1, 1, 2])], opset=23))
    write(d, "gather_cast.onnx", model(
        [node("Gather", ["emb", "ids"], ["e"], axis=0), node("Cast", ["e"], ["h"], to=FLOAT16),
         node("Cast", ["h"], ["f"], to=FLOAT), node("ArgMax", ["f"], ["am"], axis=-1, keepdims=0),
         node("Equal", ["am", "ids"], ["eq"]), node("Not", ["eq"], ["ne"]), node("CumSum", ["f", "ax"], ["cs"]),
         node("Squeeze", ["cs"], ["y"])],
        [("ids", INT64, ["seq"])], [("y", FLOAT, None), ("ne", BOOL, None)],
        [tensor("emb", FLOAT, w(10, 4)), tensor("ax", INT64, 1)]))
    # com.microsoft MatMulNBits: int4 in blocks of 16, packed zero points (3 blocks: a row's in 2 bytes), bias
    write(d, "matmul_nbits.onnx", model(
        [node("MatMulNBits", ["x", "B", "sc", "zp", "", "bias"], ["y"], domain="com.microsoft", K=48, N=4, bits=4,
              block_size=16)],
        [("x", FLOAT, [2, 48])], [("y", FLOAT, None)],
        [tensor("B", UINT8, r.integers(0, 256, (4, 3, 8))), tensor("sc", FLOAT, r.random((4, 3)) * 0.1),
         tensor("zp", UINT8, r.integers(0, 256, (4, 2))), tensor("bias", FLOAT, w(4))],
        domains=[("com.microsoft", 1)]))
    # external data: a side file the fuzzer does not have
    t = fv(1, 4) + fv(2, FLOAT) + fb(8, "w") + fb(13, fb(1, "location") + fb(2, "w.bin")) + fv(14, 1)
    write(d, "external.onnx", model([node("Add", ["x", "w"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)], [t]))
    # external data that is there: the first 16 bytes of the model itself
    # (fuzz_onnx writes each input as model.onnx)
    t = (fv(1, 4) + fv(2, FLOAT) + fb(8, "w") + fb(13, fb(1, "location") + fb(2, "model.onnx")) +
         fb(13, fb(1, "offset") + fb(2, "0")) + fb(13, fb(1, "length") + fb(2, "16")) + fv(14, 1))
    write(d, "external_self.onnx", model([node("Add", ["x", "w"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, None)],
                                         [t]))
    # ConvTranspose and Einsum, which the importer writes out in smelt ops
    write(d, "convt_einsum.onnx", model(
        [node("ConvTranspose", ["x", "tw", "tb"], ["c"], strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 1],
              group=2),
         node("Einsum", ["c", "c"], ["s"], equation="bhid,bhjd->bhij"),
         node("Einsum", ["s"], ["y"], equation="...ij->...j")],
        [("x", FLOAT, [1, 2, 3, 3])], [("y", FLOAT, None)],
        [tensor("tw", FLOAT, w(2, 2, 3, 3)), tensor("tb", FLOAT, w(4))], opset=17))


def regress_onnx():
    """tests/fuzz/regress/onnx/moves_*: converters that kept on_type's
    pointer into g->val while adding values, which moves the array.  Each
    model chains one op 40 times, with 0 to 2 idle initializers first, so
    that some application adds the value that grows the array (under ASan,
    which moves every realloc, the stale read is then reported)."""
    d = os.path.join(HERE, "regress", "onnx")
    os.makedirs(d, exist_ok=True)
    ops = {
        "trilu": (lambda a, b: node("Trilu", [a], [b], upper=1), [("x", FLOAT, [4, 4])], [], 17),
        "cumsum": (lambda a, b: node("CumSum", [a, "ax"], [b]), [("x", FLOAT, [3, 4])], [tensor("ax", INT64, 0)], 17),
        "gathernd": (lambda a, b: node("GatherND", [a, "idx"], [b]), [("x", FLOAT, [4, 3])],
                     [tensor("idx", INT64, [[1], [2], [0], [3]])], 17),
        "rotary": (lambda a, b: node("RotaryEmbedding", [a, "cos", "sin", "pos"], [b], interleaved=1),
                   [("x", FLOAT, [1, 2, 3, 4])],
                   [tensor("cos", FLOAT, np.ones((3, 2))), tensor("sin", FLOAT, np.zeros((3, 2))),
                    tensor("pos", INT64, [[0, 1, 2]])], 23),
        "convt": (lambda a, b: node("ConvTranspose", [a, "w"], [b], pads=[1, 1, 1, 1]), [("x", FLOAT, [1, 2, 3, 3])],
                  [tensor("w", FLOAT, np.ones((2, 2, 3, 3)) * 0.1)], 17),
        "einsum": (lambda a, b: node("Einsum", [a, "w"], [b], equation="bij,jk->bik"), [("x", FLOAT, [2, 3, 3])],
                   [tensor("w", FLOAT, np.eye(3))], 17),
    }
    for name, (make, inputs, inits, opset) in ops.items():
        for k in range(3):
            chain = [make("x" if i == 0 else "y%d" % (i - 1), "y%d" % i) for i in range(40)]
            idle = [tensor("idle%d" % j, FLOAT, [0.0]) for j in range(k)]
            write(d, "moves_%s_%d.onnx" % (name, k),
                  model(chain, inputs, [("y39", FLOAT, None)], idle + inits, opset=opset))
            write(d, "moves_%s_%d.onnx.expect" % (name, k), "ok\n")


# ---- bundles and their CPU objects ----

BUNDLE_MODELS = {
    "tiny": """smelt: 1
name: tiny
seed: 3
dims: {batch: 2, features: 4, hidden: 8}
inputs:
  x: {shape: [batch, features]}
params:
  w1: {shape: [features, hidden], init: {normal: 0.5}}
  b1: {shape: [hidden], init: {uniform: [-0.1, 0.1]}}
  w2: {shape: [hidden, features], init: {normal: 0.3}}
nodes:
  - {out: h, op: matmul, in: [x, w1]}
  - {out: hb, op: add, in: [h, b1]}
  - {out: a, op: gelu, in: [hb]}
  - {out: o, op: matmul, in: [a, w2]}
  - {out: y, op: softmax, in: [o], axis: -1}
outputs: [y]
""",
    "conv": """smelt: 1
name: conv
seed: 1
inputs: {x: {shape: [1, 2, 6, 6]}}
params:
  w: {shape: [3, 2, 3, 3], init: {normal: 0.3}}
  g: {shape: [3], init: ones}
nodes:
  - {out: c, op: conv2d, in: [x, w], pads: [1, 1, 1, 1]}
  - {out: r, op: relu, in: [c]}
  - {out: p, op: max_pool2d, in: [r], kernel: [2, 2], strides: [2, 2]}
  - {out: m, op: mean, in: [p], axes: [2, 3]}
  - {out: y, op: mul, in: [m, g]}
outputs: [y]
""",
    "state": """smelt: 1
name: st
dims: {ctx: 4, d: 2}
inputs: {x: {shape: [1, d]}, pos: {shape: [1], dtype: i32}}
state: {cache: {shape: [ctx, d]}}
nodes:
  - {out: c2, op: scatter, in: [cache, pos, x], axis: 0}
  - {out: y, op: sum, in: [c2], axes: [0], keepdims: true}
outputs: [y]
""",
    # tensor parallelism: a column- and a row-parallel matmul around a state
    # split by heads (an all_reduce, the manifest's tp and tp_states)
    "tp": """smelt: 1
name: tp
seed: 1
dims: {ctx: 4}
inputs: {x: {shape: [1, 8]}, pos: {shape: [1], dtype: i32}}
params:
  wk: {shape: [8, 8], init: {normal: 0.3}}
  wo: {shape: [8, 8], init: {normal: 0.3}}
state: {cache: {shape: [1, 2, ctx, 4]}}
nodes:
  - {out: k0, op: matmul, in: [x, wk]}
  - {out: k1, op: reshape, in: [k0], shape: [1, 1, 2, 4]}
  - {out: k, op: transpose, in: [k1], perm: [0, 2, 1, 3]}
  - {out: c2, op: scatter, in: [cache, pos, k], axis: 2}
  - {out: s, op: sum, in: [c2], axes: [2]}
  - {out: m, op: reshape, in: [s], shape: [1, 8]}
  - {out: y, op: matmul, in: [m, wo]}
outputs: [y]
""",
    "weights": """smelt: 1
name: wt
weights: weights.safetensors
inputs: {x: {shape: [2, 4]}}
params:
  w: {shape: [4, 4], from: w}
  b: {shape: [4], from: b}
nodes:
  - {out: m, op: matmul, in: [x, w]}
  - {out: y, op: add, in: [m, b]}
outputs: [y]
""",
}

# (seed name, model, extra compile flags)
BUNDLES = [
    ("cpu_tiny", "tiny", ["--cpu", "x86-64-v2"]),
    ("cpu_two_variants", "tiny", ["--cpu", "x86-64-v3,x86-64-v2"]),
    ("cpu_conv", "conv", ["--cpu", "x86-64-v2"]),
    ("cpu_state", "state", ["--cpu", "x86-64-v2"]),
    ("cpu_spec", "tiny", ["--cpu", "x86-64-v2", "--dim", "batch=1,3"]),
    ("cpu_external_weights", "weights", ["--cpu", "x86-64-v2", "--external-weights"]),
    ("ref_only", "tiny", ["--cpu", "x86-64-v2", "--passes", "canonicalize"]),
    ("cpu_tp2", "tp", ["--cpu", "x86-64-v2", "--tp", "2"]),
    ("cuda_tiny", "tiny", ["--target", "cuda", "--arch", "sm_80"]),
    ("cpu_cuda_state", "state", ["--target", "cpu,cuda", "--arch", "sm_80", "--cpu", "x86-64-v2"]),
]


def bundle_sections(data):
    """(kind, name, payload) of each section of a bundle (format/bundle.h)."""
    count = struct.unpack_from("<I", data, 12)[0]
    out = []
    for i in range(count):
        e = 32 + 88 * i
        kind = struct.unpack_from("<I", data, e)[0]
        name = data[e + 8:e + 64].split(b"\0")[0].decode()
        off, size = struct.unpack_from("<QQ", data, e + 64)
        out.append((kind, name, data[off:off + size]))
    return out


def seeds_bundles(smelt):
    d, de = fresh("bundle"), fresh("elf")
    # a fixed directory: a bundle with external weights records their path
    tmp = os.path.join(tempfile.gettempdir(), "smelt-fuzz-seeds")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        for name, text in BUNDLE_MODELS.items():
            write(tmp, name + ".yaml", text)
        write(tmp, "weights.safetensors", yaml_weights())
        env = dict(os.environ, SMELT_CACHE_DIR=os.path.join(tmp, "cache"))
        objects = set()
        for seed, m, flags in BUNDLES:
            out = os.path.join(tmp, seed + ".smelt")
            # relative names: the manifest records the model's path
            r = subprocess.run([smelt, "compile", m + ".yaml", "-o", seed + ".smelt", "--no-cache"] + flags,
                               capture_output=True, text=True, env=env, cwd=tmp)
            if r.returncode != 0:
                print("make_seeds: %s not made: %s" % (seed, r.stderr.strip().splitlines()[-1:]), file=sys.stderr)
                continue
            data = open(out, "rb").read()
            write(d, seed + ".smelt", data)
            for kind, sname, payload in bundle_sections(data):
                if kind == 6 and payload not in objects:  # cpu-object
                    objects.add(payload)
                    write(de, "%s_%s.o" % (seed, sname.replace("/", "_")), payload)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- dictionaries: tokens a mutation should be able to insert whole ----

def dict_file(name, tokens):
    def quote(t):
        t = t.encode() if isinstance(t, str) else t
        return '"' + "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else "\\x%02x" % c for c in t) + '"'
    with open(os.path.join(HERE, "dict", name + ".dict"), "w") as f:
        f.write("# libFuzzer dictionary for fuzz_%s (made by make_seeds.py)\n" % name)
        for t in sorted(set(tokens), key=lambda x: (x.encode() if isinstance(x, str) else x)):
            f.write(quote(t) + "\n")


def ops_and_attrs():
    """Op names and attribute names/values from ir/ops.def."""
    import re
    text = open(os.path.join(ROOT, "ir", "ops.def")).read()
    ops, attrs = [], []
    for m in re.finditer(r'^OP\(\w+,\s*"(\w+)",[^"]*"([^"]*)"', text, re.M):
        ops.append(m.group(1))
        for a in m.group(2).split():
            name, _, rest = a.partition(":")
            attrs.append(name)
            attrs += re.findall(r"\w+", rest.partition("(")[2].partition(")")[0])
    return ops, attrs


DTYPES = ["f32", "f16", "bf16", "f64", "i64", "i32", "i8", "u8", "bool"]
ONNX_OPS = ("Abs Add And ArgMax ArgMin Attention AveragePool BatchNormalization Cast CastLike Clip Concat Constant "
            "ConstantOfShape Conv Cos CumSum Div Dropout Equal Erf Exp Expand Flatten Gather GatherElements GatherND "
            "Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual HardSigmoid HardSwish Identity "
            "LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax MatMul Max MaxPool Mean Min Mul Neg Not Or "
            "PRelu Pad Pow RMSNormalization Range Reciprocal ReduceMax ReduceMean ReduceMin ReduceSum ReduceSumSquare "
            "Relu Reshape Resize RotaryEmbedding ScatterND Shape Sigmoid Sin Size Slice Softmax Softplus Split Sqrt "
            "Squeeze Sub Sum Tanh Tile Transpose Trilu Unsqueeze Where Xor ConvTranspose Einsum").split()
ONNX_ATTRS = ("axis axes keepdims perm to value alpha beta gamma epsilon transA transB kernel_shape pads strides "
              "dilations group auto_pad ceil_mode count_include_pad mode upper is_causal scale num_outputs split "
              "approximate exclusive reverse allowzero noop_with_empty_axes select_last_index coordinate_transformation_mode "
              "q_num_heads kv_num_heads interleaved num_heads rotary_embedding_dim stash_type output_padding "
              "output_shape equation").split()


def dicts():
    os.makedirs(os.path.join(HERE, "dict"), exist_ok=True)
    ops, attrs = ops_and_attrs()
    keys = ["smelt", "name", "seed", "dtype", "dims", "weights", "inputs", "params", "state", "blocks", "nodes",
            "outputs", "shape", "init", "value", "from", "out", "op", "in", "repeat", "times", "zeros", "ones",
            "normal", "uniform", "{i}", "max", "min"]
    syntax = ["{", "}", "[", "]", ": ", ", ", "- ", "\n  ", "&a ", "*a", "!!str ", "'", '"', "~", "null", "true",
              "false", ".inf", "-.inf", ".nan", "---", "...", "%YAML 1.1", "? ", "|", ">", "1e308", "-1",
              "9223372036854775807", "weights.safetensors", "layers.{i}.w"]
    dict_file("yaml", ops + attrs + keys + syntax + DTYPES)
    dict_file("npy", ["\x93NUMPY", "\x01\x00", "\x02\x00", "\x03\x00", "{'descr': ", "'fortran_order': ",
                      "'shape': ", "True", "False", "(", ")", ",", "<f4", "<f2", "<f8", "<i8", "<i4", "|i1", "|u1",
                      "|b1", ">f4", "<u2", "L", "9223372036854775807"])
    dict_file("safetensors", ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"weight_map"', "[", "]",
                              "{", "}", ":", ",", "18446744073709551615", "-1", "\\u0000"] +
              ['"%s"' % d for d in ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "U16",
                                    "U32", "U64", "F8_E4M3", "F8_E5M2"]])
    dict_file("onnx", ONNX_OPS + ONNX_ATTRS + ["ai.onnx", "com.microsoft", "location", "offset", "length"])
    dict_file("bundle", ["SMELT\0BN", "\x01\x00\x00\x00", "\x58\x00\x00\x00", "smelt-specialisations",
                         "s0/", "s1/", "u0", "u1", "sm_80/u0", "sm_90a/u0", "x86_64-pc-linux-gnu/x86-64-v2",
                         "cpu_features:", "x86-64-v2", "smelt_version=", "bundle_format=", "graph_format=",
                         "kernel_table_format=", "=", "\n", "\t", "r0/", "r1/", "r1/s0/", "tp=", "tp_states="])
    dict_file("elf", ["\x7fELF\x02\x01\x01", ".text", ".rela.text", ".rodata", ".rodata.cst16", ".data",
                      ".data.rel.ro", ".bss", ".eh_frame", ".rela.eh_frame", ".symtab", ".strtab", ".shstrtab",
                      ".comment", ".note.GNU-stack", ".llvm_addrsig", ".text.k00", "expf", "memcpy", "memset",
                      "sincosf", "__prepack", "\x3e\x00", "\x01\x00"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smelt", default=os.path.join(ROOT, "build", "smelt"))
    ap.add_argument("--out", help="write the corpora here instead of tests/fuzz/corpus (dictionaries stay)")
    ap.add_argument("--regress-only", action="store_true", help="only the generated regression inputs")
    args = ap.parse_args()
    global CORPUS
    if args.out:
        CORPUS = os.path.abspath(args.out)
    regress_onnx()
    if args.regress_only:
        return
    seeds_yaml()
    seeds_npy()
    seeds_safetensors()
    seeds_onnx()
    seeds_bundles(os.path.abspath(args.smelt))
    dicts()
    for name in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, name))
        size = sum(os.path.getsize(os.path.join(CORPUS, name, f)) for f in files)
        print("%-12s %3d seeds, %7d bytes" % (name, len(files), size))


if __name__ == "__main__":
    main()
