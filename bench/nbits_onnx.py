"""ONNX com.microsoft MatMulNBits weights as onnxruntime's
MatMulNBitsQuantizer writes them: shared by bench/gpu/quant.py and
bench/cpu/nbits.py, which time smelt on such files against ONNX Runtime."""
import numpy as np


def nbits_node(w, bits, zp, x, y, prefix="", group=128):
    """The MatMulNBits node computing y = x @ w (w [K, N]) and its
    initializers: W^T in groups of `group` along K, rounded to nearest;
    with zp, asymmetric (scale (max - min) / (2^bits - 1), zero point
    round(-min / scale), packed uint8), else symmetric (scale amax /
    (2^(bits-1) - 1), the default zero point)."""
    from onnx import helper, numpy_helper
    K, N = w.shape
    g = w.astype(np.float64).T.reshape(N, K // group, group)
    top = (1 << bits) - 1
    if zp:
        lo, hi = np.minimum(g.min(axis=2), 0), np.maximum(g.max(axis=2), 0)
        sc = np.maximum((hi - lo) / top, 1e-8)
        z = np.clip(np.rint(-lo / sc), 0, top)
    else:
        sc = np.maximum(np.abs(g).max(axis=2) / ((1 << (bits - 1)) - 1), 1e-8)
        z = np.full(sc.shape, 1 << (bits - 1))
    q = np.clip(np.rint(g / sc[:, :, None]) + z[:, :, None], 0, top).astype(np.uint8).reshape(N, K)
    b = (q[:, 0::2] | (q[:, 1::2] << 4)) if bits == 4 else q
    inits = [numpy_helper.from_array(b.reshape(N, K // group, -1).astype(np.uint8), prefix + "B"),
             numpy_helper.from_array(sc.astype(np.float32).ravel(), prefix + "scales")]
    if zp:
        zz = z.astype(np.uint8)
        if bits == 4:
            zz = np.pad(zz, ((0, 0), (0, zz.shape[1] % 2)))
            zz = zz[:, 0::2] | (zz[:, 1::2] << 4)
        inits.append(numpy_helper.from_array(zz.astype(np.uint8).ravel(), prefix + "zp"))
    node = helper.make_node("MatMulNBits", [x] + [i.name for i in inits], [y], name=prefix + "matmul",
                            domain="com.microsoft", K=K, N=N, bits=bits, block_size=group)
    return node, inits
