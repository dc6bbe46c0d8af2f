#!/usr/bin/env python3
"""Bad ONNX input: every case must exit 1 with a located message, never
crash (the suite also runs under ASan+UBSan).  The files are made here
from a committed model by byte surgery and, where the onnx package is
present, from small graphs built with onnx.helper (an unsupported op, an
unsupported opset, an attribute value smelt refuses)."""
import argparse
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "models", "mlp.ts17.onnx")


def run(smelt, path, extra=()):
    return subprocess.run([smelt, "compile", path, "-o", os.devnull] + list(extra), capture_output=True, text=True, errors="replace",
                          timeout=120)


def crashed(r):
    return r.returncode < 0 or "AddressSanitizer" in r.stderr or "runtime error" in r.stderr


def helper_cases(tmp):
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        print("SKIP: onnx not installed: the onnx.helper cases are skipped (byte-level cases still run)")
        return []
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)

    def save(name, nodes, opset=17, domain_opsets=(), inits=(), xin=x):
        g = helper.make_graph(nodes, "g", [xin], [y], initializer=list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] +
                              [helper.make_opsetid(d, v) for d, v in domain_opsets])
        p = os.path.join(tmp, name + ".onnx")
        onnx.save(m, p)
        return p

    import numpy as np
    from onnx import numpy_helper
    x32 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])

    def nbits(name, b_shape=(4, 1, 16), n_scales=4, zp=None, g_idx=None, **attrs):
        """com.microsoft MatMulNBits over x [2, 32]: N=4, K=32, block 32 unless overridden."""
        a = dict(K=32, N=4, bits=4, block_size=32)
        a.update(attrs)
        inits = [numpy_helper.from_array(np.zeros(b_shape, np.uint8), "B"),
                 numpy_helper.from_array(np.ones(n_scales, np.float32), "scales")]
        ins = ["x", "B", "scales"]
        if zp is not None:
            inits.append(numpy_helper.from_array(np.zeros(zp, np.uint8), "zp"))
            ins.append("zp")
        if g_idx is not None:
            if zp is None:
                ins.append("")
            inits.append(numpy_helper.from_array(np.asarray(g_idx, np.int32), "g_idx"))
            ins.append("g_idx")
        node = helper.make_node("MatMulNBits", ins, ["y"], name="mnb", domain="com.microsoft", **a)
        return save(name, [node], domain_opsets=[("com.microsoft", 1)], inits=inits, xin=x32)

    def quant(name, scale, zp=None, opset=21, **attrs):
        inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "s")]
        if zp is not None:
            inits.append(numpy_helper.from_array(zp, "z"))
        node = helper.make_node("QuantizeLinear", ["x", "s"] + (["z"] if zp is not None else []), ["y"], name="q",
                                **attrs)
        return save(name, [node], opset=opset, inits=inits)

    xi = helper.make_tensor_value_info("x", TensorProto.INT64, [2, 3])
    x4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 2, 2])
    return [
        ("floating-point Mod fmod=0", save("mod_f0", [helper.make_node("Mod", ["x", "x"], ["y"], name="m")]),
         ["node 0 'm'", "floating-point Mod needs fmod=1"]),
        ("Mod of two types", save("mod_types", [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
                                                helper.make_node("Mod", ["x", "f"], ["y"], name="m2")], xin=xi),
         ["node 1 'm2'", "A is i64 and B is f32"]),
        ("ReduceProd axis twice", save("rprod_axes", [helper.make_node("ReduceProd", ["x"], ["y"], name="rp",
                                                                       axes=[1, -1])]),
         ["node 0 'rp'", "axis -1 is named twice"]),
        ("GroupNormalization groups", save("gn", [helper.make_node("GroupNormalization", ["x", "s", "s"], ["y"],
                                                                   name="gn", num_groups=4)], opset=21,
                                           inits=[numpy_helper.from_array(np.ones(6, np.float32), "s")], xin=x4),
         ["node 0 'gn'", "num_groups 4 must divide the 6 channels"]),
        ("DepthToSpace blocksize", save("d2s", [helper.make_node("DepthToSpace", ["x"], ["y"], name="d", blocksize=2)],
                                        xin=x4), ["node 0 'd'", "does not divide the 6 channels"]),
        ("TopK computed K", save("topk", [helper.make_node("ReduceMax", ["x"], ["k0"], keepdims=0),
                                          helper.make_node("Cast", ["k0"], ["k1"], to=TensorProto.INT64),
                                          helper.make_node("Reshape", ["k1", "one"], ["k"]),
                                          helper.make_node("TopK", ["x", "k"], ["y", "i"], name="t")],
                                 inits=[numpy_helper.from_array(np.array([1], np.int64), "one")]),
         ["node 3 't'", "K"]),
        ("QuantizeLinear blocked", quant("q_block", np.ones((2, 1)), block_size=3, axis=1),
         ["node 0 'q'", "blocked scales"]),
        ("QuantizeLinear to INT4", quant("q_int4", 0.1, output_dtype=TensorProto.INT4), ["node 0 'q'", "INT4"]),
        ("QuantizeLinear scale shape", quant("q_shape", np.ones(2), axis=1), ["node 0 'q'", "y_scale must be"]),
        ("QuantizeLinear zero point shape", quant("q_zshape", np.ones(3), np.zeros(1, np.uint8), axis=1),
         ["node 0 'q'", "y_zero_point's shape"]),
        ("MatMulNBits bits=2", nbits("nb_bits", bits=2), ["node 0 'mnb'", "MatMulNBits", "bits=2"]),
        ("MatMulNBits partial block", nbits("nb_part", K=32, block_size=64, b_shape=(4, 1, 32), n_scales=4),
         ["node 0 'mnb'", "K=32 is not a multiple of block_size 64"]),
        ("MatMulNBits K differs from A", nbits("nb_k", K=64, b_shape=(4, 2, 16), n_scales=8),
         ["node 0 'mnb'", "K=64 elements along its last axis"]),
        ("MatMulNBits B shape", nbits("nb_b", b_shape=(4, 2, 16)), ["node 0 'mnb'", "B must be uint8 [N"]),
        ("MatMulNBits scales", nbits("nb_s", n_scales=3), ["node 0 'mnb'", "scales must be floating point"]),
        ("MatMulNBits zero points", nbits("nb_z", zp=3), ["node 0 'mnb'", "zero_points must hold"]),
        ("MatMulNBits act-order g_idx", nbits("nb_g", block_size=16, b_shape=(4, 2, 8), n_scales=8,
                                              g_idx=[i % 2 for i in range(32)]),
         ["node 0 'mnb'", "act-order"]),
        ("MatMulNBits bad block_size", nbits("nb_bs", block_size=24), ["node 0 'mnb'", "power of 2"]),
        ("unsupported op", save("op", [helper.make_node("Det", ["x"], ["y"], name="my_det")]),
         ["node 0 'my_det'", "Det", "not supported", "opset 17"]),
        ("ConvTranspose computed weight",
         save("convt_w", [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                          helper.make_node("Add", ["w", "s"], ["wx"]),
                          helper.make_node("ConvTranspose", ["x", "wx"], ["y"], name="ct", strides=[2, 2])],
              inits=[numpy_helper.from_array(np.ones((6, 2, 3, 3), np.float32), "w")], xin=x4),
         ["node 2 'ct'", "ConvTranspose", "W ('wx') must be a constant at import time"]),
        ("ConvTranspose 4-D", save("convt_4d", [helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="ct4")],
                                   inits=[numpy_helper.from_array(np.ones((1, 1, 1, 1, 1, 1), np.float32), "w")],
                                   xin=helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2, 2, 2])),
         ["node 0 'ct4'", "4-D ConvTranspose (supported: 1-D, 2-D and 3-D)"]),
        ("Conv 4-D", save("conv_4d", [helper.make_node("Conv", ["x", "w"], ["y"], name="c4")],
                          inits=[numpy_helper.from_array(np.ones((1, 1, 1, 1, 1, 1), np.float32), "w")],
                          xin=helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2, 2, 2])),
         ["node 0 'c4'", "4-D convolution (supported: 1-D, 2-D and 3-D)"]),
        ("Conv 3-D kernel deeper than the input",
         save("conv_3d_deep", [helper.make_node("Conv", ["x", "w"], ["y"], name="c3")],
              inits=[numpy_helper.from_array(np.ones((1, 1, 3, 1, 1), np.float32), "w")],
              xin=helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2, 2])),
         ["node 0 'c3'", "no pixels along the depth axis"]),
        ("Einsum diagonal", save("einsum_diag", [helper.make_node("Einsum", ["x"], ["y"], name="ed",
                                                                  equation="abii->abi")], xin=x4),
         ["node 0 'ed'", "Einsum", "label 'i' appears twice in operand 1", "diagonals"]),
        ("Einsum 17 operands", save("einsum_17", [helper.make_node("Einsum", ["x"] * 17, ["y"], name="e17",
                                                                   equation=",".join(["ij"] * 17) + "->ij")]),
         ["node 0 'e17'", "Einsum of 17 operands (supported: 1 to 16)"]),
        ("Einsum 3 operands, terms", save("einsum_3t", [helper.make_node("Einsum", ["x", "x", "x"], ["y"], name="e3",
                                                                         equation="ij,ij->ij")]),
         ["node 0 'e3'", "has 2 terms for 3 operands"]),
        ("Einsum rank", save("einsum_rank", [helper.make_node("Einsum", ["x", "x"], ["y"], name="er",
                                                              equation="abcdefg,abcdefg->abcdefg")],
                             xin=helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 1, 1, 2, 3])),
         ["node 0 'er'", "7 batch and 0 free labels needs rank 9"]),
        ("Einsum sizes", save("einsum_size", [helper.make_node("Einsum", ["x", "x"], ["y"], name="es",
                                                               equation="ij,jk->ik")]),
         ["node 0 'es'", "label 'j' has size 3 and 2"]),
        ("old opset", save("opset", [helper.make_node("Relu", ["x"], ["y"])], opset=11), ["opset 11", "13 to 23"]),
        ("custom domain", save("dom", [helper.make_node("FusedMatMul", ["x", "x"], ["y"], name="fm",
                                                        domain="com.microsoft")],
                               domain_opsets=[("com.microsoft", 1)]), ["node 0 'fm'", "com.microsoft"]),
        ("bad attribute value", save("attr", [helper.make_node("Gelu", ["x"], ["y"], name="g0", approximate="fast")],
                                     opset=20), ["node 0 'g0'", "approximate 'fast'"]),
        ("unknown attribute", save("attr2", [helper.make_node("Relu", ["x"], ["y"], name="r0", frobnicate=1)]),
         ["node 0 'r0'", "attribute 'frobnicate'"]),
        ("undefined input", save("undef", [helper.make_node("Add", ["x", "nope"], ["y"], name="a0")]),
         ["node 0 'a0'", "'nope' is not defined"]),
        ("dynamic reshape", save("dyn", [helper.make_node("Cast", ["x"], ["s"], to=TensorProto.INT64),
                                         helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")]),
         ["node 1 'rs'", "constant at import time"]),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    a = ap.parse_args()
    r = run(a.smelt, MODEL)
    if "built without ONNX support" in r.stderr:
        print("SKIP: smelt was built without ONNX support")
        return 77  # 77: skipped as a whole (ctest's SKIP_RETURN_CODE)
    data = open(MODEL, "rb").read()
    failures, n = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for cut in (1, 7, len(data) // 3, len(data) // 2, len(data) - 3):
            p = os.path.join(tmp, f"trunc{cut}.onnx")
            open(p, "wb").write(data[:cut])
            cases.append((f"truncated at {cut}", p, ["error"]))
        p = os.path.join(tmp, "garbage.onnx")
        open(p, "wb").write(bytes(random.Random(1).randrange(256) for _ in range(4096)))
        cases.append(("garbage", p, ["not a valid ONNX file"]))
        p = os.path.join(tmp, "empty.onnx")
        open(p, "wb").write(b"")
        cases.append(("empty", p, ["error"]))
        rng = random.Random(7)
        for k in range(40):  # byte flips: any outcome but a crash; errors must say so
            b = bytearray(data)
            for _ in range(8):
                b[rng.randrange(len(b))] = rng.randrange(256)
            p = os.path.join(tmp, f"flip{k}.onnx")
            open(p, "wb").write(bytes(b))
            cases.append((f"byte flips {k}", p, None))
        cases += helper_cases(tmp)
        cases.append(("unknown --dim", MODEL, ["no dim 'zzz'"]))
        for name, path, want in cases:
            n += 1
            extra = ["--dim", "zzz=3"] if name == "unknown --dim" else []
            r = run(a.smelt, path, extra)
            if crashed(r):
                failures.append(f"{name}: crashed (rc {r.returncode}): {r.stderr[-600:]}")
            elif want is None:
                if r.returncode not in (0, 1) or (r.returncode == 1 and "error" not in r.stderr):
                    failures.append(f"{name}: rc {r.returncode}: {r.stderr[-300:]}")
            elif r.returncode != 1 or not all(w in r.stderr for w in want):
                failures.append(f"{name}: rc {r.returncode}, expected 1 and {want}: {r.stderr[-400:]}")
        # smelt import writes sizes computed from a dim as numbers: one value per dim
        bert = os.path.join(os.path.dirname(MODEL), "bert.ts17.onnx")
        for dim, want in (("sequence=4,16", "one value per dim"), ("sequence=4..16", "a range cannot be imported")):
            n += 1
            r = subprocess.run([a.smelt, "import", bert, "--dim", dim, "-o", os.path.join(tmp, "b.yaml")],
                               capture_output=True, text=True)
            if r.returncode != 2 or want not in r.stderr or os.path.exists(os.path.join(tmp, "b.yaml")):
                failures.append(f"import --dim {dim}: rc {r.returncode}, expected 2 and '{want}': {r.stderr[-300:]}")
    for f in failures:
        print("FAIL:", f)
    print(f"{n - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
