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

Usage: python3 make_ops.py [NAME...]   (only the models named, e.g. mod_int;
                                        default: all)
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
NP = {F: np.float32, I64: np.int64, I32: np.int32}


def save(name, nodes, inputs, outputs, inits=(), opset=18, feeds=None):
    """inputs: (name, type, shape, array); outputs: (name, type)."""
    if len(sys.argv) > 1 and name not in sys.argv[1:]:
        return
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
    mod_int(np.random.default_rng(1))
    reduce_prod(np.random.default_rng(2))
    conv_3d(np.random.default_rng(3))


def mod_int(r):
    """Integer Mod: fmod=0 (the divisor's sign, Python's %) and fmod=1 (the
    dividend's, C's %), int64 and int32, every sign pair, b = +-1, a
    divisor larger than the dividend, broadcasting."""
    a = r.integers(-50, 51, (3, 4, 5))
    a[0, 0, :] = [0, 7, -7, 6, -6]
    b = r.integers(1, 9, (3, 4, 5)) * np.where(r.random((3, 4, 5)) < 0.5, -1, 1)
    b[0, 0, :] = [3, -1, 1, 3, -3]
    b[0, 1, :] = [-60, 60, 13, -13, 2]
    bb = np.array([3, -4, 7, -1, 2])  # broadcast along the last axis
    save("mod_int", [helper.make_node("Mod", ["a", "b"], ["py"]),
                     helper.make_node("Mod", ["a", "b"], ["c"], fmod=1),
                     helper.make_node("Mod", ["a", "bb"], ["py_b"]),
                     helper.make_node("Mod", ["a32", "b32"], ["py32"], fmod=0),
                     helper.make_node("Mod", ["a32", "b32"], ["c32"], fmod=1)],
         [("a", I64, [3, 4, 5], a), ("b", I64, [3, 4, 5], b), ("bb", I64, [5], bb),
          ("a32", I32, [3, 4, 5], a * 1000 + 3), ("b32", I32, [3, 4, 5], b * 7)],
         [("py", I64), ("c", I64), ("py_b", I64), ("py32", I32), ("c32", I32)])


def reduce_prod(r):
    """ReduceProd: one axis, several, all, with and without keepdims, odd
    and even extents (7 halves as 7 -> 4 -> 2 -> 1), zeros and negative
    signs; the axes attribute (opset 13) and input (18), integers."""
    x = (r.uniform(0.6, 1.5, (3, 4, 5)) * np.where(r.random((3, 4, 5)) < 0.3, -1, 1))
    x[1, 2, 3] = 0.0
    w = r.uniform(0.5, 1.6, (2, 7, 3)) * np.where(r.random((2, 7, 3)) < 0.4, -1, 1)
    save("reduce_prod", [helper.make_node("ReduceProd", ["x", "a1"], ["p1"], keepdims=0),
                         helper.make_node("ReduceProd", ["x", "a02"], ["p02"], keepdims=1),
                         helper.make_node("ReduceProd", ["w"], ["all"], keepdims=0),
                         helper.make_node("ReduceProd", ["x"], ["all_k"]),
                         helper.make_node("ReduceProd", ["x"], ["noop"], noop_with_empty_axes=1),
                         helper.make_node("ReduceProd", ["w", "am"], ["p7"], keepdims=0),
                         helper.make_node("ReduceProd", ["w", "a12"], ["p7_3"], keepdims=0)],
         [("x", F, [3, 4, 5], x), ("w", F, [2, 7, 3], w)],
         [("p1", F), ("p02", F), ("all", F), ("all_k", F), ("noop", F), ("p7", F), ("p7_3", F)],
         [("a1", np.array([1], np.int64)), ("a02", np.array([0, -1], np.int64)), ("am", np.array([-2], np.int64)),
          ("a12", np.array([2, 1], np.int64))], opset=18)
    i = r.integers(-3, 4, (3, 5, 2))
    save("reduce_prod_opset13", [helper.make_node("ReduceProd", ["x"], ["p"], axes=[1]),
                                 helper.make_node("ReduceProd", ["x"], ["q"], axes=[0, 2], keepdims=0),
                                 helper.make_node("ReduceProd", ["i"], ["pi"], axes=[1], keepdims=0),
                                 helper.make_node("ReduceProd", ["i"], ["qi"])],
         [("x", F, [3, 4, 5], x), ("i", I64, [3, 5, 2], i)], [("p", F), ("q", F), ("pi", I64), ("qi", I64)],
         opset=13)


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


def conv_3d(r):
    """Conv and ConvTranspose 3-D (a sum of conv2d over the depth taps):
    strides, pads, dilations, groups, auto_pad, output_padding and
    output_shape along the depth as along height and width."""
    def cv(name, op, xshape, cases):
        """cases: (output, W shape, bias?, attributes)."""
        nodes, inits, outs = [], [], []
        for out, wshape, bias, attrs in cases:
            ins = ["x", out + ".w"]
            inits.append((out + ".w", (r.standard_normal(wshape) * 0.5).astype(np.float32)))
            if bias:
                m = wshape[0] if op == "Conv" else wshape[1] * attrs.get("group", 1)
                inits.append((out + ".b", r.standard_normal(m).astype(np.float32)))
                ins.append(out + ".b")
            nodes.append(helper.make_node(op, ins, [out], **attrs))
            outs.append((out, F))
        save(name, nodes, [("x", F, list(xshape), r.standard_normal(xshape))], outs, inits)

    cv("conv_3d", "Conv", (2, 4, 5, 6, 7), [
        ("plain", (3, 4, 3, 3, 3), True, {}),
        ("stride_pad", (6, 4, 2, 3, 2), True, dict(strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1], dilations=[1, 2, 1])),
        ("group", (4, 2, 3, 1, 3), False, dict(group=2, dilations=[2, 1, 1], strides=[1, 2, 1])),
        ("same", (3, 4, 3, 3, 3), True, dict(auto_pad="SAME_UPPER", strides=[2, 2, 2])),
    ])
    cv("conv_transpose_3d", "ConvTranspose", (1, 4, 3, 4, 5), [
        ("s2", (4, 3, 3, 3, 3), True, dict(strides=[2, 2, 2], pads=[1, 0, 1, 1, 1, 0], output_padding=[1, 1, 0])),
        ("g2_d2", (4, 2, 2, 3, 2), False, dict(group=2, dilations=[2, 1, 2], strides=[1, 2, 1])),
        ("crop", (4, 2, 2, 2, 3), True, dict(strides=[3, 2, 1], pads=[3, 0, 2, 1, 2, 0])),  # depth pad > d*(k-1)
        ("same", (4, 2, 3, 3, 3), False, dict(auto_pad="SAME_LOWER", strides=[2, 1, 2])),
        ("oshape", (4, 3, 3, 3, 3), False, dict(strides=[2, 2, 2], output_shape=[6, 8, 9])),
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
    # three and more operands: contracted pairwise from the left
    es("einsum_multi", {"a": (3, 4), "b": (4, 5), "c": (5, 2), "d": (2, 6), "u": (2, 3), "v": (2, 4), "w": (2, 5),
                        "p": (4,), "s": (4, 3, 5), "e1": (2, 3, 4), "e2": (1, 4, 5)}, [
        ("chain", "ij,jk,kl->il", ["a", "b", "c"]),
        ("chain4", "ij,jk,kl,lm->im", ["a", "b", "c", "d"]),
        ("chain_implicit", "ij,jk,kl", ["a", "b", "c"]),
        ("outer3", "bi,bj,bk->bijk", ["u", "v", "w"]),
        ("dot3", "i,i,i->", ["p", "p", "p"]),
        ("elem3", "ij,ij,ij->ij", ["a", "a", "a"]),
        ("bilinear", "ij,jkl,bl->bik", ["a", "s", "w"]),
        ("skip", "ij,kl,jk->il", ["a", "c", "b"]),  # the first two share no label: an outer product, then contracted
        ("sum_one", "ij,jk,kl->i", ["a", "b", "c"]),  # l only in c and not the output: summed first
        ("ell", "...k,kl,lm->...m", ["s", "c", "d"]),
        ("ell_bcast", "...ij,...jk,kl->...il", ["e1", "e2", "c"]),  # e2's ellipsis [1] broadcasts to e1's [2]
    ])


if __name__ == "__main__":
    main()
