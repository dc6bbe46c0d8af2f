#!/usr/bin/env python3
"""Writes the weight-only quantised ONNX models that test_onnx_models.py's
check_quant runs (issue 14): dq_*.onnx are MatMul(x, DequantizeLinear(W,
scale, zero_point)) with W an initializer; mnb_*.onnx are ONNX Runtime's
com.microsoft MatMulNBits (4 and 8 bits, with and without packed or float
zero points, a bias, a batched x).  ONNX Runtime's output on a fixed input
is stored beside each (NAME.npz: in.x, out.y), so the test needs neither
onnx nor onnxruntime.  Needs onnx, onnxruntime and numpy.

Usage: python3 make_quant.py
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
K, N, M = 64, 24, 5


def raw(name, dtype, dims, data):
    return helper.make_tensor(name, dtype, dims, data, raw=True)


def int4_raw(vals, signed):
    """Two 4-bit values a byte, the first in the low nibble."""
    v = np.asarray(vals, np.int64).ravel() & 15
    if v.size % 2:
        v = np.append(v, 0)
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8).tobytes()


def model(name, opset, w, scale, zp, axis=None, block=None):
    inits = [w, scale] + ([zp] if zp is not None else [])
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if block is not None:
        attrs["block_size"] = block
    dq = helper.make_node("DequantizeLinear", [i.name for i in inits], ["wd"], **attrs)
    mm = helper.make_node("MatMul", ["x", "wd"], ["y"])
    g = helper.make_graph([dq, mm], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="smelt make_quant.py")
    m.ir_version = 10
    onnx.checker.check_model(m)
    path = os.path.join(HERE, name + ".onnx")
    onnx.save(m, path)
    run_ort(path, np.random.default_rng(1).standard_normal((M, K)).astype(np.float32), name)


def run_ort(path, x, name):
    # without graph optimisations: with them ORT fuses DequantizeLinear and
    # MatMul into a kernel that quantises x too (rel L2 ~6e-3 off the exact
    # (w - z) * s product this stores)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    y = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.savez_compressed(os.path.join(HERE, name + ".npz"), **{"in.x": x, "out.y": y})
    print(name, y.shape, float(np.abs(y).max()))
    return y


def nbits(name, rng, k, n, bits, block, zp=None, bias=False, xshape=None, scale_2d=False):
    """MatMulNBits: B uint8 [N, K/block, block*bits/8], codes in K order a
    row, two 4-bit codes a byte low nibble first; zp None (the default
    2^(bits-1)), "packed" (uint8, ceil(blocks*bits/8) bytes a row) or
    "float" (the scales' type)."""
    nb = k // block
    codes = rng.integers(0, 1 << bits, (n, k))
    if bits == 4:
        b = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).reshape(n, nb, block // 2)
    else:
        b = codes.astype(np.uint8).reshape(n, nb, block)
    scales = (rng.random((n, nb)) * 0.05 + 0.005).astype(np.float32)
    inits = [numpy_helper.from_array(b, "B"),
             numpy_helper.from_array(scales if scale_2d else scales.ravel(), "scales")]
    ins = ["x", "B", "scales"]
    zval = np.full((n, nb), float(1 << (bits - 1)))
    if zp == "packed":
        zc = rng.integers(0, 1 << bits, (n, nb))
        zval = zc.astype(np.float64)
        if bits == 4:
            zc = np.pad(zc, ((0, 0), (0, nb % 2)))
            zb = (zc[:, 0::2] | (zc[:, 1::2] << 4)).astype(np.uint8)
        else:
            zb = zc.astype(np.uint8)
        inits.append(numpy_helper.from_array(zb.ravel(), "zp"))
        ins.append("zp")
    elif zp == "float":
        zf = (rng.random((n, nb)) * 15).astype(np.float32)
        zval = zf.astype(np.float64)
        inits.append(numpy_helper.from_array(zf.ravel(), "zp"))
        ins.append("zp")
    bvals = np.zeros(n)
    if bias:
        bvals = rng.standard_normal(n).astype(np.float32)
        while len(ins) < 5:
            ins.append("")
        inits.append(numpy_helper.from_array(bvals, "bias"))
        ins.append("bias")
    xshape = xshape or [M, k]
    node = helper.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block)
    g = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, xshape[:-1] + [n])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          producer_name="smelt make_quant.py")
    m.ir_version = 10
    path = os.path.join(HERE, name + ".onnx")
    onnx.save(m, path)
    x = np.random.default_rng(2).standard_normal(xshape).astype(np.float32)
    y = run_ort(path, x, name)
    # the format as read here, in double: ORT must agree with it
    w = (codes - np.repeat(zval, block, axis=1)) * np.repeat(scales.astype(np.float64), block, axis=1)
    want = x.astype(np.float64) @ w.T + bvals
    err = np.linalg.norm(y - want) / np.linalg.norm(want)
    assert err < 1e-5, (name, err)


def qdq(name, rng):
    """QDQ activations: y = Relu(DQ(Q(x)) @ DQ(W)) quantised again, as
    onnxruntime.quantization's static QDQ format writes it: x per tensor to
    uint8 (zero point 128), the weight int8 per output channel, the Relu's
    result per tensor to int8 (zero point -3); then x per axis to int8."""
    f = TensorProto.FLOAT
    w = rng.integers(-127, 128, (K, N)).astype(np.int8)
    inits = [numpy_helper.from_array(np.float32(0.02), "xs"), numpy_helper.from_array(np.uint8(128), "xz"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array((rng.random(N) * 0.01 + 0.002).astype(np.float32), "ws"),
             numpy_helper.from_array(np.float32(0.05), "rs"), numpy_helper.from_array(np.int8(-3), "rz"),
             numpy_helper.from_array((rng.random(K) * 0.03 + 0.01).astype(np.float32), "as"),
             numpy_helper.from_array(rng.integers(-4, 5, K).astype(np.int8), "az"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"]),
             helper.make_node("QuantizeLinear", ["x", "as", "az"], ["aq"], axis=1),
             helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["ad"], axis=1),
             helper.make_node("ReduceSum", ["ad", "ax1"], ["sm"], keepdims=1),
             helper.make_node("Add", ["rd", "sm"], ["y"])]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", f, [M, K])],
                          [helper.make_tensor_value_info("y", f, [M, N])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="smelt make_quant.py")
    m.ir_version = 10
    onnx.checker.check_model(m)
    path = os.path.join(HERE, name + ".onnx")
    onnx.save(m, path)
    # x on the quantisation grid's half steps too: ties must round to even
    x = np.random.default_rng(4).standard_normal((M, K)).astype(np.float32) * 1.5
    x[0, :8] = np.array([0.01, 0.03, -0.01, -0.03, 0.05, 2.6, -2.6, 0.0], np.float32)
    run_ort(path, x, name)


def main():
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    # int8, per output channel (axis 1 of a [K, N] MatMul weight), with zero points
    w8 = rng.integers(-128, 128, (K, N)).astype(np.int8)
    model("dq_int8_axis1", 13, numpy_helper.from_array(w8, "w"),
          numpy_helper.from_array((rng.random(N) * 0.02 + 0.001).astype(np.float32), "s"),
          numpy_helper.from_array(rng.integers(-5, 5, N).astype(np.int8), "z"), axis=1)
    # int8, per input row (axis 0), no zero point
    model("dq_int8_axis0", 13, numpy_helper.from_array(w8, "w"),
          numpy_helper.from_array((rng.random(K) * 0.02 + 0.001).astype(np.float32), "s"), None, axis=0)
    # uint8, per tensor, zero point 128
    wu = rng.integers(0, 256, (K, N)).astype(np.uint8)
    model("dq_uint8_tensor", 13, numpy_helper.from_array(wu, "w"), numpy_helper.from_array(np.float32(0.01), "s"),
          numpy_helper.from_array(np.uint8(128), "z"))
    # int4, blocked along K (opset 21): groups of 32, scales and zero points [K/32, N]
    w4 = rng.integers(-8, 8, (K, N))
    z4 = rng.integers(-2, 3, (K // 32, N))
    model("dq_int4_block32", 21, raw("w", TensorProto.INT4, [K, N], int4_raw(w4, True)),
          numpy_helper.from_array((rng.random((K // 32, N)) * 0.1 + 0.01).astype(np.float32), "s"),
          raw("z", TensorProto.INT4, [K // 32, N], int4_raw(z4, True)), axis=0, block=32)
    # uint4, per output channel
    wq = rng.integers(0, 16, (K, N))
    model("dq_uint4_axis1", 21, raw("w", TensorProto.UINT4, [K, N], int4_raw(wq, False)),
          numpy_helper.from_array((rng.random(N) * 0.1 + 0.01).astype(np.float32), "s"),
          raw("z", TensorProto.UINT4, [N], int4_raw(np.full(N, 8), False)), axis=1)
    # float8 e4m3fn, per tensor (opset 19)
    wf = (rng.standard_normal((K, N)) * 2).astype(np.float32)
    t = helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [K, N], wf.ravel().tolist())
    t8 = raw("w", TensorProto.FLOAT8E4M3FN, [K, N], numpy_helper.to_array(t).view(np.uint8).tobytes()
             if hasattr(numpy_helper.to_array(t), "view") else bytes(t.int32_data))
    model("dq_f8e4m3_tensor", 19, t8, numpy_helper.from_array(np.float32(0.05), "s"), None)
    qdq("qdq_mlp", np.random.default_rng(5))
    # com.microsoft MatMulNBits
    r = np.random.default_rng(3)
    nbits("mnb_int4_b32", r, 128, 40, 4, 32)
    nbits("mnb_int4_b16_zp_odd", r, 48, 24, 4, 16, zp="packed", scale_2d=True)  # 3 blocks: a row's zeros in 2 bytes
    nbits("mnb_int4_b64_zp_bias", r, 128, 24, 4, 64, zp="packed", bias=True, xshape=[2, 3, 128])
    nbits("mnb_int4_b32_fzp", r, 64, 16, 4, 32, zp="float")
    nbits("mnb_int8_b32_zp", r, 64, 24, 8, 32, zp="packed")
    nbits("mnb_int8_b16", r, 64, 24, 8, 16)


if __name__ == "__main__":
    main()
