#!/usr/bin/env python3
"""Writes one small ONNX model per operator that smelt builds from its own
ops at import (frontend/onnx_ops.c's composites: Elu, Selu, Celu,
ThresholdedRelu, Mish, Shrink, Mod, InstanceNormalization,
GroupNormalization, DepthToSpace, SpaceToDepth, ReduceLogSumExp,
ReduceLogSum, ReduceL1, LpNormalization, TopK, OneHot, ConvTranspose,
Einsum; and Floor, Ceil, Round, Sign), with ONNX Runtime's output on fixed inputs stored beside it
(NAME.npz: in.NAME for each graph input, out.NAME for each output), so
that test_onnx_models.py's check_ops needs neither onnx nor onnxruntime.
Needs onnx, onnxruntime and numpy.

Usage: python3 make_ops.py
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
F, I64 = TensorProto.FLOAT, TensorProto.INT64
NP = {F: np.float32, I64: np.int64}


def save(name, nodes, inputs, outputs, inits=(), opset=18, feeds=None):
    """inputs: (name, type, shape, array); outputs: (name, type)."""
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s, _ in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          initializer=[numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="smelt make_ops.py")
    m.ir_version = 10
    path = os.path.join(HERE, name + ".onnx")
    onnx.save(m, path)
    feeds = {n: a.astype(NP[t]) for n, t, _, a in inputs}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run([n for n, _ in outputs], feeds)
    arrays = {"in." + k: v for k, v in feeds.items()}
    arrays.update({"out." + n: v for (n, _), v in zip(outputs, got)})
    np.savez_compressed(os.path.join(HERE, name + ".npz"), **arrays)
    print(name, [v.shape for v in got])


def main():
    r = np.random.default_rng(0)
    x = r.standard_normal((3, 4, 5)) * 2
    x[0, 0, :] = [-2.5, -0.5, 0.5, 1.5, 2.5]  # ties: Round is to even
    x1 = [("x", F, [3, 4, 5], x)]
    n = lambda op, **a: [helper.make_node(op, ["x"], ["y"], **a)]
    save("elu", n("Elu", alpha=0.7), x1, [("y", F)])
    save("selu", n("Selu"), x1, [("y", F)])
    save("celu", n("Celu", alpha=1.3), x1, [("y", F)])
    save("thresholded_relu", n("ThresholdedRelu", alpha=0.4), x1, [("y", F)])
    save("mish", n("Mish"), x1, [("y", F)])
    save("shrink", n("Shrink", lambd=0.6, bias=0.2), x1, [("y", F)])
    save("rounding", [helper.make_node("Floor", ["x"], ["f"]), helper.make_node("Ceil", ["x"], ["c"]),
                      helper.make_node("Round", ["x"], ["r"]), helper.make_node("Sign", ["x"], ["s"])],
         x1, [("f", F), ("c", F), ("r", F), ("s", F)])
    b = r.standard_normal((3, 4, 5)) * 1.5 + np.sign(r.standard_normal((3, 4, 5))) * 0.3
    save("mod_fmod", [helper.make_node("Mod", ["x", "b"], ["y"], fmod=1)], x1 + [("b", F, [3, 4, 5], b)], [("y", F)])
    img = r.standard_normal((2, 6, 4, 3)) * 3 + 1
    xi = [("x", F, [2, 6, 4, 3], img)]
    save("instance_norm", [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)], xi,
         [("y", F)], [("s", r.standard_normal(6).astype(np.float32)), ("b", r.standard_normal(6).astype(np.float32))])
    save("group_norm", [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4, num_groups=3)],
         xi, [("y", F)], [("s", r.standard_normal(6).astype(np.float32)), ("b", r.standard_normal(6).astype(np.float32))],
         opset=21)
    d = [("x", F, [2, 8, 3, 2], r.standard_normal((2, 8, 3, 2)))]
    save("depth_to_space_dcr", n("DepthToSpace", blocksize=2), d, [("y", F)])
    save("depth_to_space_crd", n("DepthToSpace", blocksize=2, mode="CRD"), d, [("y", F)])
    save("space_to_depth", n("SpaceToDepth", blocksize=2), [("x", F, [2, 3, 4, 6], r.standard_normal((2, 3, 4, 6)))],
         [("y", F)])
    big = x * 20  # exp overflows without the max subtracted
    save("reduce_log", [helper.make_node("ReduceLogSumExp", ["x", "ax"], ["lse"], keepdims=0),
                        helper.make_node("ReduceLogSumExp", ["x"], ["lse_all"], keepdims=1),
                        helper.make_node("Abs", ["x"], ["a"]),
                        helper.make_node("ReduceLogSum", ["a", "ax"], ["ls"], keepdims=1),
                        helper.make_node("ReduceL1", ["x", "ax2"], ["l1"], keepdims=0)],
         [("x", F, [3, 4, 5], big)], [("lse", F), ("lse_all", F), ("ls", F), ("l1", F)],
         [("ax", np.array([1], np.int64)), ("ax2", np.array([0, 2], np.int64))])
    save("lp_norm", [helper.make_node("LpNormalization", ["x"], ["l2"], axis=1, p=2),
                     helper.make_node("LpNormalization", ["x"], ["l1"], axis=-1, p=1)], x1, [("l2", F), ("l1", F)])
    save("topk", [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
                  helper.make_node("TopK", ["x", "k2"], ["vs", "is"], axis=-1, largest=0)],
         x1, [("v", F), ("i", I64), ("vs", F), ("is", I64)],
         [("k", np.array([3], np.int64)), ("k2", np.array([2], np.int64))])
    save("one_hot", [helper.make_node("OneHot", ["ids", "depth", "vals"], ["y"], axis=1),
                     helper.make_node("OneHot", ["ids", "depth", "vals"], ["z"])],
         [("ids", I64, [2, 3], np.array([[0, 4, -1], [2, -5, 3]]))], [("y", F), ("z", F)],
         [("depth", np.array(5, np.int64)), ("vals", np.array([-1.0, 3.0], np.float32))])
    conv_transpose(r)
    einsum(r)


def conv_transpose(r):
    """ConvTranspose: one model per group of attributes, a node per case."""
    def ct(name, xshape, cases):
        """cases: (output, W shape, bias?, attributes)."""
        nodes, inits, outs = [], [], []
        for out, wshape, bias, attrs in cases:
            ins = ["x", out + ".w"]
            inits.append((out + ".w", (r.standard_normal(wshape) * 0.5).astype(np.float32)))
            if bias:
                m = wshape[1] * attrs.get("group", 1)
                inits.append((out + ".b", r.standard_normal(m).astype(np.float32)))
                ins.append(out + ".b")
            nodes.append(helper.make_node("ConvTranspose", ins, [out], **attrs))
            outs.append((out, F))
        save(name, nodes, [("x", F, list(xshape), r.standard_normal(xshape))], outs, inits)

    ct("conv_transpose_stride", (2, 4, 5, 6), [
        ("s2_op", (4, 3, 3, 3), True, dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
        ("s3x2", (4, 2, 2, 4), False, dict(strides=[3, 2], output_padding=[2, 0])),
        ("s1", (4, 5, 3, 3), True, {}),
    ])
    ct("conv_transpose_1d", (2, 3, 7), [
        ("s2", (3, 4, 3), True, dict(strides=[2], pads=[1, 0], output_padding=[1])),
        ("g3", (3, 2, 4), False, dict(group=3, dilations=[2])),
    ])
    ct("conv_transpose_groups", (1, 6, 5, 4), [
        ("g2_d2", (6, 2, 3, 3), True, dict(group=2, dilations=[2, 2])),
        ("g3_s2_d3", (6, 1, 2, 3), False, dict(group=3, strides=[3, 2], dilations=[3, 1], output_padding=[2, 1])),
        ("dw", (6, 1, 3, 3), True, dict(group=6, strides=[2, 1], pads=[1, 1, 1, 1])),
    ])
    ct("conv_transpose_pads", (2, 3, 4, 5), [
        ("asym", (3, 4, 3, 3), True, dict(strides=[2, 2], pads=[0, 2, 1, 0])),
        ("crop", (3, 2, 2, 3), False, dict(strides=[2, 3], pads=[2, 1, 1, 3])),  # pads beyond d*(k-1): cropped
        ("valid", (3, 2, 3, 3), False, dict(strides=[2, 2], auto_pad="VALID")),
    ])
    ct("conv_transpose_auto_pad", (1, 4, 5, 6), [
        ("upper", (4, 3, 3, 3), True, dict(strides=[2, 2], auto_pad="SAME_UPPER")),
        ("lower", (4, 3, 3, 3), True, dict(strides=[2, 2], auto_pad="SAME_LOWER")),
        ("upper_odd", (4, 2, 4, 2), False, dict(strides=[3, 1], auto_pad="SAME_UPPER")),
        ("oshape", (4, 3, 3, 3), False, dict(strides=[2, 2], output_shape=[10, 12])),
        ("oshape_odd", (4, 3, 3, 3), False, dict(strides=[2, 2], output_shape=[9, 10])),
    ])


def einsum(r):
    """Einsum: the equations exporters write for attention and linear layers,
    and transposes, sums, ellipses, broadcasting and implicit outputs."""
    def es(name, inputs, cases):
        """inputs: name -> shape; cases: (output, equation, operand names)."""
        nodes = [helper.make_node("Einsum", ins, [out], equation=eq) for out, eq, ins in cases]
        save(name, nodes, [(n, F, list(s), r.standard_normal(s)) for n, s in inputs.items()],
             [(out, F) for out, _, _ in cases], opset=18)

    es("einsum_attention", {"q": (2, 3, 4, 8), "k": (2, 3, 5, 8), "p": (2, 3, 4, 5)}, [
        ("scores", "bhid,bhjd->bhij", ["q", "k"]),
        ("ctx", "bhij,bhjd->bhid", ["p", "k"]),
        ("ctx_t", "bhij,bhjd->bihd", ["p", "k"]),  # context straight to [b, s, h, d]
        ("kq", "bhjd,bhid->bhij", ["k", "q"]),
    ])
    es("einsum_matmul", {"a": (3, 4, 5), "b": (3, 5, 6), "m": (4, 5), "n": (5, 6), "w": (7, 5), "b1": (1, 5, 6)}, [
        ("bik", "bij,bjk->bik", ["a", "b"]),
        ("ik", "ij,jk->ik", ["m", "n"]),
        ("linear", "bsd,od->bso", ["a", "w"]),  # nn.Linear: x @ W^T
        ("ell", "...ij,...jk->...ik", ["a", "b"]),
        ("ell_bcast", "...ij,...jk->...ik", ["a", "b1"]),  # b1's ellipsis [1] broadcasts to a's [3]
        ("implicit", "ij,jk", ["m", "n"]),
        ("outer", "bi,bj->bij", ["m", "m"]),
        ("dot", "bij,bij->b", ["a", "a"]),
    ])
    es("einsum_unary", {"x": (3, 4, 5), "y": (3, 5, 2)}, [
        ("kji", "ijk->kji", ["x"]),
        ("sum_j", "ijk->ik", ["x"]),
        ("sum_all", "ijk->", ["x"]),
        ("ell_t", "...ij->...ji", ["x"]),
        ("implicit_t", "kji", ["x"]),  # implicit output: sorted labels, "ijk"
        ("only_a", "aij,ajk->ak", ["x", "y"]),  # i in x only: summed before the matmul
    ])
    es("einsum_2d", {"m": (4, 5)}, [("mt", "ij->ji", ["m"]), ("rows", "ij->i", ["m"])])


if __name__ == "__main__":
    main()
