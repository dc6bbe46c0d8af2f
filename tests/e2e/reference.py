"""numpy reference implementations of the example models.

Written from the operator semantics of SPEC §3 (ONNX / numpy conventions),
independently of smelt's C reference kernels, so that a mistake in either
shows up as a disagreement.  Everything is computed in float64 from the
float32 parameters smelt used; the e2e test compares smelt's f32 outputs with
these at a relative L2 tolerance.

Each model function takes its inputs and a dict of parameters keyed by the
names the values have in smelt's IR (`w1`, `layer.0/attn_norm`, ...).
"""
import json
import math
import struct

import numpy as np

# ---------------------------------------------------------------- operators

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x, approximate="none"):
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def relu(x):
    return np.maximum(x, 0.0)


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def layer_norm(x, gamma, beta=None, eps=1e-5, axis=-1):
    mu = np.mean(x, axis=axis, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=axis, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * gamma
    return y if beta is None else y + beta


def rms_norm(x, gamma, eps=1e-6, axis=-1):
    ms = np.mean(x * x, axis=axis, keepdims=True)
    return x / np.sqrt(ms + eps) * gamma


def batch_norm(x, scale, bias, mean, var, eps=1e-5):
    """Inference form over NCHW: the per-channel vectors act on axis 1."""
    c = (slice(None),) + (None,) * (x.ndim - 2)
    return (x - mean[c]) / np.sqrt(var[c] + eps) * scale[c] + bias[c]


def conv2d(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1):
    """NCHW input, OIHW weights; pads are [top, left, bottom, right] (ONNX)."""
    n, cin, _, _ = x.shape
    cout, cin_g, kh, kw = w.shape
    assert cin == cin_g * groups and cout % groups == 0
    sh, sw = strides
    dh, dw = dilations
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    hp, wp = xp.shape[2], xp.shape[3]
    oh = (hp - dh * (kh - 1) - 1) // sh + 1
    ow = (wp - dw * (kw - 1) - 1) // sw + 1
    cout_g = cout // groups
    y = np.zeros((n, cout, oh, ow))
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        ws = w[g * cout_g:(g + 1) * cout_g]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                # patch [n, cin_g, oh, ow] times weights [cout_g, cin_g]
                y[:, g * cout_g:(g + 1) * cout_g] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    if b is not None:
        y += b[None, :, None, None]
    return y


def _pool2d(x, kernel, strides, pads, reduce, pad_value):
    kh, kw = kernel
    sh, sw = strides
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=pad_value)
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    windows = np.stack([xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                        for i in range(kh) for j in range(kw)])
    return reduce(windows, axis=0)


def max_pool2d(x, kernel, strides, pads=(0, 0, 0, 0)):
    return _pool2d(x, kernel, strides, pads, np.max, -np.inf)


def avg_pool2d(x, kernel, strides, pads=(0, 0, 0, 0)):
    # ONNX's default count_include_pad=0: padding is not counted in the divisor.
    total = _pool2d(x, kernel, strides, pads, np.sum, 0.0)
    count = _pool2d(np.ones_like(x), kernel, strides, pads, np.sum, 0.0)
    return total / count


def global_avg_pool(x):
    return np.mean(x, axis=(2, 3), keepdims=True)


def attention(q, k, v, mask=None, scale=None, causal=False):
    """q [B,H,S,D]; k, v [B,Hkv,T,D] with Hkv dividing H (grouped-query:
    query head h reads key/value head h // (H/Hkv)); causal: query i sees
    keys 0 .. T-S+i."""
    _, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    assert h % hkv == 0
    k = np.repeat(k, h // hkv, axis=1)
    v = np.repeat(v, h // hkv, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    if causal:
        allowed = np.arange(t)[None, :] <= (t - s + np.arange(s))[:, None]
        scores = np.where(allowed, scores, -np.inf)
    return np.matmul(softmax(scores, axis=-1), v)


def rope(x, pos, base=10000.0, style="half", rotary_dim=None):
    """Rotates feature pairs of x [..., S, D] by angle pos * base^(-2i/rd).
    half (LLaMA/NeoX): pairs (i, i + rd/2); interleaved (GPT-J): (2i, 2i+1)."""
    d = x.shape[-1]
    rd = d if rotary_dim is None else rotary_dim
    inv_freq = base ** (-np.arange(0, rd // 2) * 2.0 / rd)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [S, rd/2]
    cos, sin = np.cos(ang), np.sin(ang)
    y = np.array(x, dtype=np.float64, copy=True)
    if style == "half":
        x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]
        y[..., :rd // 2] = x1 * cos - x2 * sin
        y[..., rd // 2:rd] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        y[..., 0:rd:2] = x1 * cos - x2 * sin
        y[..., 1:rd:2] = x2 * cos + x1 * sin
    return y


def heads(x, n_heads):
    """[S, n*D] -> [1, n, S, D], as reshape then transpose(0, 2, 1, 3)."""
    s = x.shape[0]
    return x.reshape(1, s, n_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x):
    """[1, H, S, D] -> [S, H*D]."""
    _, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(s, h * d)


# ------------------------------------------------------------------- models

def _f64(p):
    return {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}


def mlp(x, p):
    p = _f64(p)
    a1 = gelu(x @ p["w1"] + p["b1"])
    a2 = relu(a1 @ p["w2"] + p["b2"])
    return softmax(a2 @ p["w3"], axis=-1)


def cnn(x, p):
    p = _f64(p)
    h = conv2d(x, p["conv1_w"], p["conv1_b"], pads=(1, 1, 1, 1))
    h = relu(batch_norm(h, p["bn1_scale"], p["bn1_bias"], p["bn1_mean"], p["bn1_var"], eps=1e-5))
    h = max_pool2d(h, kernel=(2, 2), strides=(2, 2))
    h = conv2d(h, p["conv2_w"], None, strides=(2, 2), pads=(1, 1, 1, 1), groups=2)
    h = relu(batch_norm(h, p["bn2_scale"], p["bn2_bias"], p["bn2_mean"], p["bn2_var"], eps=1e-5))
    f = global_avg_pool(h).reshape(x.shape[0], -1)
    return f @ p["fc_w"] + p["fc_b"]


def gpt2_block(x, p, n_heads=4):
    p = _f64(p)
    h = layer_norm(x, p["ln1_g"], p["ln1_b"], eps=1e-5)
    q = heads(h @ p["w_q"] + p["b_q"], n_heads)
    k = heads(h @ p["w_k"] + p["b_k"], n_heads)
    v = heads(h @ p["w_v"] + p["b_v"], n_heads)
    att = attention(q, k, v, mask=p["causal_mask"], scale=float(p["scale"]))
    x1 = x + merge_heads(att) @ p["w_o"] + p["b_o"]
    h2 = layer_norm(x1, p["ln2_g"], p["ln2_b"], eps=1e-5)
    f = gelu(h2 @ p["w_fc"] + p["b_fc"], approximate="tanh")
    return x1 + f @ p["w_proj"] + p["b_proj"]


def tiny_llama(x, pos, p, layers=2, n_heads=4, n_kv_heads=2):
    p = _f64(p)
    for i in range(layers):
        w = lambda name: p[f"layer.{i}/{name}"]  # noqa: E731
        h = rms_norm(x, w("attn_norm"), eps=1e-6)
        q = rope(heads(h @ w("wq"), n_heads), pos, style="half")
        k = rope(heads(h @ w("wk"), n_kv_heads), pos, style="half")
        v = heads(h @ w("wv"), n_kv_heads)
        x = x + merge_heads(attention(q, k, v, causal=True)) @ w("wo")
        h2 = rms_norm(x, w("ffn_norm"), eps=1e-6)
        x = x + (silu(h2 @ w("w_gate")) * (h2 @ w("w_up"))) @ w("w_down")
    return rms_norm(x, p["final_norm"], eps=1e-6)


# -------------------------------------------------------------- safetensors

_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I64": "<i8",
              "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """{name: array} from a safetensors file (8-byte LE header length, JSON
    header, then the data each tensor's data_offsets point into)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(blob[base + b:base + e], dtype=_ST_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out
