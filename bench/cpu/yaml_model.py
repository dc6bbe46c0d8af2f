"""smelt's YAML model format (SPEC §2), read in Python for the benchmark peers.

The YAML is parsed with pyyaml and flattened the way smelt's frontend
(frontend/yaml.c) does it, so that every value carries the name it has in
smelt's IR: dims are substituted, `repeat: B, times: N` is unrolled into N
copies whose names are prefixed `B.c/` (copy numbers continue when a scope
repeats the same block again; nested repeats compose), and a repeat node's
`out` names become aliases of the last copy's outputs.  Shapes are inferred
node by node (numpy / ONNX rules, as in SPEC §3), which the exporters need
for ranks and sizes and the benchmark needs for its FLOP and byte counts.

This is not a validator: smelt rejects bad models with located errors; here
a model smelt accepts is assumed, and anything else fails with a plain
exception.
"""
import math

import yaml

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
          "i64": "int64", "i32": "int32", "i8": "int8", "u8": "uint8", "bool": "bool"}
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i8": 1, "u8": 1,
               "bool": 1}

# Ops that only move or reinterpret data: no arithmetic in the FLOP count.
DATA_MOVEMENT = {"reshape", "transpose", "concat", "slice", "split", "gather", "expand", "squeeze",
                 "unsqueeze", "cast"}
COMPARISONS = {"less", "greater", "equal"}


class Node:
    """One operator application with IR names: outs, op, ins, attrs (dims
    already substituted)."""

    def __init__(self, outs, op, ins, attrs):
        self.outs, self.op, self.ins, self.attrs = outs, op, ins, attrs

    def __repr__(self):
        return f"Node({self.outs} = {self.op}({', '.join(self.ins)}) {self.attrs})"


class Model:
    """A flattened model: `inputs` and `params` map IR names to (shape,
    dtype); `nodes` are in execution order; `outputs` are the graph outputs
    as the YAML names them, `alias` maps a name to the IR value it stands
    for; `shape` and `dtype` hold every value's."""

    def __init__(self, name, dims, dtype):
        self.name, self.dims, self.default_dtype = name, dims, dtype
        self.inputs, self.params, self.nodes, self.outputs = {}, {}, [], []
        self.alias, self.shape, self.dtype = {}, {}, {}

    def resolve(self, name):
        while name in self.alias:
            name = self.alias[name]
        return name

    def nbytes(self, name):
        name = self.resolve(name)
        return math.prod(self.shape[name]) * DTYPE_BYTES[self.dtype[name]]

    def compulsory_bytes(self):
        """What any implementation must move at least: read every input and
        param once, write every output once."""
        names = list(self.inputs) + list(self.params)
        return sum(self.nbytes(n) for n in names) + sum(self.nbytes(o) for o in self.outputs)

    def flops(self):
        """Contraction FLOPs (2 per multiply-add; attention counts both of
        its matmuls over the full S x T scores, causal or not) plus one per
        output element of every other arithmetic op."""
        total = 0
        for n in self.nodes:
            out = self.shape[n.outs[0]]
            if n.op == "matmul":
                a = self.shape[n.ins[0]]
                k = a[-2] if n.attrs.get("transpose_a") and len(a) >= 2 else a[-1]
                total += 2 * math.prod(out) * k
            elif n.op == "conv2d":
                w = self.shape[n.ins[1]]
                total += 2 * math.prod(out) * w[1] * w[2] * w[3]
            elif n.op == "attention":
                b, h, s, d = self.shape[n.ins[0]]
                t = self.shape[n.ins[1]][2]
                total += 2 * b * h * s * t * (d + self.shape[n.ins[2]][3])
            elif n.op not in DATA_MOVEMENT:
                total += math.prod(out)
        return total


def _size(v, dims):
    if isinstance(v, str):
        if v not in dims:
            raise ValueError(f"unknown dim '{v}'")
        return int(dims[v])
    return int(v)


def _attr(v, dims):
    """Attribute values: a dim name stands for its size inside int lists
    (reshape and expand shapes); other strings are enum values."""
    if isinstance(v, list):
        return [_size(x, dims) if isinstance(x, str) and x in dims else x for x in v]
    return v


def _broadcast(*shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        sizes = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _axis(a, rank):
    return a + rank if a < 0 else a


def _window(size, pad, k, stride, dilation=1):
    return (size + pad - dilation * (k - 1) - 1) // stride + 1


def infer(op, shapes, dtypes, attrs, nout):
    """(output shapes, output dtypes) of one node."""
    x, dt = shapes[0], dtypes[0]
    if op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum") or op in COMPARISONS:
        return [_broadcast(*shapes)], ["bool" if op in COMPARISONS else dt]
    if op == "where":
        return [_broadcast(*shapes)], [dtypes[1]]
    if op == "cast":
        return [x], [attrs["to"]]
    if op in ("sum", "mean", "max", "min"):
        axes = attrs.get("axes")
        axes = set(range(len(x))) if axes is None else {_axis(a, len(x)) for a in axes}
        keep = attrs.get("keepdims", False)
        out = [1 if i in axes else d for i, d in enumerate(x) if keep or i not in axes]
        return [tuple(out)], [dt]
    if op == "matmul":
        a, b = list(shapes[0]), list(shapes[1])
        if attrs.get("transpose_a"):
            a[-2:] = a[-1:-3:-1]
        if attrs.get("transpose_b"):
            b[-2:] = b[-1:-3:-1]
        a1, b1 = len(a) == 1, len(b) == 1
        a = [1] + a if a1 else a
        b = b + [1] if b1 else b
        if a[-1] != b[-2]:
            raise ValueError(f"matmul: {shapes[0]} x {shapes[1]}")
        out = list(_broadcast(tuple(a[:-2]), tuple(b[:-2]))) + [a[-2], b[-1]]
        if a1:
            del out[-2]
        if b1:
            del out[-1]
        return [tuple(out)], [dt]
    if op == "conv2d":
        n, _, h, w = x
        o, _, kh, kw = shapes[1]
        st, pd, dl = attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0]), attrs.get("dilations", [1, 1])
        return [(n, o, _window(h, pd[0] + pd[2], kh, st[0], dl[0]),
                 _window(w, pd[1] + pd[3], kw, st[1], dl[1]))], [dt]
    if op in ("max_pool2d", "avg_pool2d"):
        k = attrs["kernel"]
        st, pd = attrs.get("strides", k), attrs.get("pads", [0, 0, 0, 0])
        return [(x[0], x[1], _window(x[2], pd[0] + pd[2], k[0], st[0]),
                 _window(x[3], pd[1] + pd[3], k[1], st[1]))], [dt]
    if op == "global_avg_pool":
        return [tuple(x[:2]) + (1,) * (len(x) - 2)], [dt]
    if op == "reshape":
        want = list(attrs["shape"])
        if -1 in want:
            i = want.index(-1)
            want[i] = math.prod(x) // math.prod(d for d in want if d != -1)
        if math.prod(want) != math.prod(x):
            raise ValueError(f"reshape {x} -> {attrs['shape']}")
        return [tuple(want)], [dt]
    if op == "transpose":
        perm = attrs.get("perm") or list(range(len(x)))[::-1]
        return [tuple(x[p] for p in perm)], [dt]
    if op == "concat":
        ax = _axis(attrs.get("axis", 0), len(x))
        out = list(x)
        out[ax] = sum(s[ax] for s in shapes)
        return [tuple(out)], [dt]
    if op == "slice":
        ax = _axis(attrs.get("axis", 0), len(x))
        r = range(x[ax])[slice(attrs.get("start", 0), attrs.get("end"), attrs.get("step", 1))]
        out = list(x)
        out[ax] = len(r)
        return [tuple(out)], [dt]
    if op == "split":
        ax = _axis(attrs.get("axis", 0), len(x))
        sizes = attrs.get("sizes") or [x[ax] // nout] * nout
        return [tuple(x[:ax]) + (s,) + tuple(x[ax + 1:]) for s in sizes], [dt] * nout
    if op == "gather":
        ax = _axis(attrs.get("axis", 0), len(x))
        return [tuple(x[:ax]) + tuple(shapes[1]) + tuple(x[ax + 1:])], [dt]
    if op == "expand":
        return [_broadcast(x, tuple(attrs["shape"]))], [dt]
    if op == "squeeze":
        axes = attrs.get("axes")
        axes = {i for i, d in enumerate(x) if d == 1} if axes is None else {_axis(a, len(x)) for a in axes}
        return [tuple(d for i, d in enumerate(x) if i not in axes)], [dt]
    if op == "unsqueeze":
        rank = len(x) + len(attrs["axes"])
        axes = {_axis(a, rank) for a in attrs["axes"]}
        it = iter(x)
        return [tuple(1 if i in axes else next(it) for i in range(rank))], [dt]
    if op == "attention":
        return [tuple(x[:3]) + (shapes[2][3],)], [dt]
    # unary elementwise, softmax, norms, batch_norm, rope: the shape of x
    return [x], [dt]


class _Loader:
    def __init__(self, doc, dims):
        self.doc, self.dims = doc, dims
        self.blocks = doc.get("blocks") or {}

    def param(self, m, name, spec):
        shape = tuple(_size(d, self.dims) for d in spec["shape"])
        dt = spec.get("dtype", m.default_dtype)
        m.params[name] = (shape, dt)
        m.shape[name], m.dtype[name] = shape, dt

    def nodes(self, m, prefix, scope, node_list, copies):
        """Adds node_list's nodes; scope maps local names to IR names (and is
        extended with the results); copies counts this scope's block copies."""
        for spec in node_list:
            outs = spec["out"] if isinstance(spec["out"], list) else [spec["out"]]
            ins = [scope[i] for i in spec.get("in", [])]
            if "repeat" in spec:
                block = self.blocks[spec["repeat"]]
                res = self.repeat(m, prefix, spec["repeat"], block, _size(spec.get("times", 1), self.dims),
                                  ins, copies)
                for o, r in zip(outs, res):
                    scope[o] = r  # later nodes read the IR value itself
                    m.alias[prefix + o] = r
                continue
            attrs = {k: _attr(v, self.dims) for k, v in spec.items() if k not in ("out", "op", "in")}
            node = Node([prefix + o for o in outs], spec["op"], ins, attrs)
            shapes, dts = infer(node.op, [m.shape[i] for i in ins], [m.dtype[i] for i in ins], attrs, len(outs))
            for o, s, d in zip(node.outs, shapes, dts):
                m.shape[o], m.dtype[o] = s, d
            m.nodes.append(node)
            for o in outs:
                scope[o] = prefix + o

    def repeat(self, m, prefix, bname, block, times, ins, copies):
        first = copies.get(bname, 0)
        copies[bname] = first + times
        cur = list(ins)
        nout = len(block["outputs"])
        for c in range(times):
            p = f"{prefix}{bname}.{first + c}/"
            scope = dict(zip(block["inputs"], cur))
            for pname, pspec in (block.get("params") or {}).items():
                self.param(m, p + pname, pspec)
                scope[pname] = p + pname
            self.nodes(m, p, scope, block["nodes"], {})
            res = [m.resolve(scope[o]) for o in block["outputs"]]
            cur = res + cur[nout:]
        return res


def load(path, dims=None):
    """Reads a smelt YAML model; dims overrides sizes like `--dim k=v`."""
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    all_dims = dict(doc.get("dims") or {})
    for k, v in (dims or {}).items():
        if k not in all_dims:
            raise ValueError(f"{path}: --dim {k}: the model has no such dim")
        all_dims[k] = int(v)
    m = Model(doc.get("name", ""), all_dims, doc.get("dtype", "f32"))
    ld = _Loader(doc, all_dims)
    scope = {}
    for name, spec in (doc.get("inputs") or {}).items():
        shape = tuple(_size(d, all_dims) for d in spec["shape"])
        dt = spec.get("dtype", m.default_dtype)
        m.inputs[name] = (shape, dt)
        m.shape[name], m.dtype[name] = shape, dt
        scope[name] = name
    for name, spec in (doc.get("params") or {}).items():
        ld.param(m, name, spec)
        scope[name] = name
    ld.nodes(m, "", scope, doc["nodes"], {})
    m.outputs = list(doc["outputs"])
    for o in m.outputs:
        m.shape.setdefault(o, m.shape[m.resolve(o)])
        m.dtype.setdefault(o, m.dtype[m.resolve(o)])
    return m
