"""OPTIONAL PyTorch CPU peer: eager and torch.compile.

Runs only where `import torch` works.  On the machines this project is
developed on it does not: PyPI's default torch wheel is the CUDA build
(several GiB of CUDA libraries), and the CPU wheel lives on PyTorch's own
index, which these machines cannot reach.  bench.py calls it when torch
imports and reports the peer as not installed otherwise.  What has run:
the op interpreter (_node) under torch 2.11 eager on the GPU machine, for
the four examples, through bench/gpu/bench.py (matching smelt's reference
to ~1e-7); the CPU path below (runners, torch.compile on the CPU) has not.
Every tensor made here is made on its inputs' device, so nothing depends
on torch.set_default_device: under it, torch.compile of tiny_llama failed
on the GPU machine with a fake-tensor error in rope/attention (before this
change; whether it was the cause is untested).

It interprets the flattened model of yaml_model.py op by op with torch
functions (so "eager" is exactly per-op eager execution, and
torch.compile traces the same loop into one graph), on the params dumped
from smelt, with the semantics of SPEC §3 (those of tests/e2e/reference.py).
"""
import math

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
          "i64": torch.int64, "i32": torch.int32, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}

UNARY = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
         "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "tanh": torch.tanh,
         "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu, "erf": torch.erf,
         "sin": torch.sin, "cos": torch.cos}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
          "maximum": torch.maximum, "minimum": torch.minimum, "less": torch.lt, "greater": torch.gt,
          "equal": torch.eq}
REDUCE = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}


def _pad(x, pads, value=0.0):
    top, left, bottom, right = pads
    return F.pad(x, (left, right, top, bottom), value=value) if any(pads) else x


def _rope(x, pos, a):
    d = x.shape[-1]
    rd = a.get("rotary_dim") or d
    base = float(a.get("base", 10000.0))
    inv_freq = base ** (-torch.arange(0, rd // 2, dtype=torch.float64, device=x.device) * 2.0 / rd)
    ang = (pos.to(torch.float64)[:, None] * inv_freq[None, :]).to(x.dtype)
    cos, sin = torch.cos(ang), torch.sin(ang)
    if a.get("style", "half") == "half":
        x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]
        rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        rot = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([rot, x[..., rd:]], dim=-1) if rd < d else rot


def _attention(xs, a):
    q, k, v = xs[:3]
    h, hkv = q.shape[1], k.shape[1]
    if h != hkv:
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    s, t = q.shape[2], k.shape[2]
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    mask = xs[3] if len(xs) > 3 else None
    if a.get("causal"):
        allowed = (torch.arange(t, device=q.device)[None, :]
                   <= (t - s + torch.arange(s, device=q.device))[:, None])
        causal = torch.zeros(s, t, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
        mask = causal if mask is None else mask + causal
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _node(n, xs, m):
    a, op = n.attrs, n.op
    out_shape = list(m.shape[n.outs[0]])
    if op in UNARY:
        return UNARY[op](xs[0])
    if op == "gelu":
        return F.gelu(xs[0], approximate=a.get("approximate", "none"))
    if op == "cast":
        return xs[0].to(DTYPES[a["to"]])
    if op in BINARY:
        return BINARY[op](xs[0], xs[1])
    if op == "where":
        return torch.where(*xs)
    if op in REDUCE:
        axes = a.get("axes")
        dims = tuple(range(xs[0].dim())) if axes is None else tuple(axes)
        return REDUCE[op](xs[0], dim=dims, keepdim=bool(a.get("keepdims", False)))
    if op == "softmax":
        return torch.softmax(xs[0], dim=a.get("axis", -1))
    if op == "log_softmax":
        return torch.log_softmax(xs[0], dim=a.get("axis", -1))
    if op == "layer_norm":
        x = xs[0]
        return F.layer_norm(x, (x.shape[-1],), xs[1], xs[2] if len(xs) > 2 else None, eps=a.get("eps", 1e-5))
    if op == "rms_norm":
        x = xs[0]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.get("eps", 1e-6)) * xs[1]
    if op == "batch_norm":
        x, scale, bias, mean, var = xs
        return F.batch_norm(x, mean, var, scale, bias, training=False, eps=a.get("eps", 1e-5))
    if op == "matmul":
        x, y = xs
        x = x.transpose(-1, -2) if a.get("transpose_a") else x
        y = y.transpose(-1, -2) if a.get("transpose_b") else y
        return torch.matmul(x, y)
    if op == "conv2d":
        x = _pad(xs[0], a.get("pads", [0, 0, 0, 0]))
        return F.conv2d(x, xs[1], xs[2] if len(xs) > 2 else None, stride=a.get("strides", [1, 1]),
                        dilation=a.get("dilations", [1, 1]), groups=a.get("groups", 1))
    if op == "max_pool2d":
        x = _pad(xs[0], a.get("pads", [0, 0, 0, 0]), float("-inf"))
        return F.max_pool2d(x, a["kernel"], a.get("strides", a["kernel"]))
    if op == "avg_pool2d":
        # count_include_pad = false: window sums over counts of real elements
        k, st, pads = a["kernel"], a.get("strides", a["kernel"]), a.get("pads", [0, 0, 0, 0])
        total = F.avg_pool2d(_pad(xs[0], pads), k, st, divisor_override=1)
        count = F.avg_pool2d(_pad(torch.ones_like(xs[0][:1, :1]), pads), k, st, divisor_override=1)
        return total / count
    if op == "global_avg_pool":
        return xs[0].mean(dim=tuple(range(2, xs[0].dim())), keepdim=True)
    if op in ("reshape", "squeeze", "unsqueeze"):
        return xs[0].reshape(out_shape)
    if op == "expand":
        return torch.broadcast_to(xs[0], out_shape)
    if op == "transpose":
        return xs[0].permute(a.get("perm") or list(range(xs[0].dim()))[::-1])
    if op == "concat":
        return torch.cat(xs, dim=a.get("axis", 0))
    if op == "slice":
        ax = a.get("axis", 0) % xs[0].dim()
        idx = [slice(None)] * xs[0].dim()
        idx[ax] = slice(a.get("start", 0), a.get("end"), a.get("step", 1))
        return xs[0][tuple(idx)]
    if op == "split":
        ax = a.get("axis", 0)
        return torch.split(xs[0], [m.shape[o][ax] for o in n.outs], dim=ax)
    if op == "gather":
        x, idx = xs
        ax = a.get("axis", 0) % x.dim()
        idx = torch.where(idx < 0, idx + x.shape[ax], idx).to(torch.int64)
        return x.index_select(ax, idx.reshape(-1)).reshape(out_shape)
    if op == "attention":
        return _attention(xs, a)
    if op == "rope":
        return _rope(xs[0], xs[1], a)
    raise NotImplementedError(f"torch peer: op '{op}'")


def make_fn(model, weights):
    """fn(inputs: dict of tensors) -> list of output tensors, closing over
    the params as tensors."""
    params = {k: torch.from_numpy(v.copy()) for k, v in weights.items() if k in model.params}

    def fn(inputs):
        env = dict(params)
        env.update(inputs)
        for n in model.nodes:
            res = _node(n, [env[i] for i in n.ins], model)
            for o, r in zip(n.outs, res if len(n.outs) > 1 else [res]):
                env[o] = r
        return [env[model.resolve(o)] for o in model.outputs]

    return fn


def setup(threads):
    torch.set_num_threads(threads)
    return torch.__version__


def runners(model, weights, inputs_np):
    """{'torch eager': call, 'torch.compile': call}, each call returning the
    first output as numpy."""
    fn = make_fn(model, weights)
    inputs = {k: torch.from_numpy(v.copy()) for k, v in inputs_np.items()}
    compiled = torch.compile(fn)

    def eager():
        with torch.inference_mode():
            return fn(inputs)[0].numpy()

    def comp():
        with torch.inference_mode():
            return compiled(inputs)[0].numpy()

    return {"torch eager": eager, "torch.compile": comp}
