#!/usr/bin/env python3
"""Random valid smelt models for differential testing (issue 16, Deliver 2).

A model is grown one node at a time over a pool of live values.  Each step
picks an operator family, takes its operands from the pool (recent values
first) or makes new inputs and params of shapes that fit, and works out the
result's shape itself, the way ir/infer.c does; the model is written as
smelt YAML (format 1).  The families cover every op of `smelt ops` but
the quantised ones: unary math, casts, broadcasting binaries,
comparisons and where, reductions with and without keepdims, softmax and
the norms, batch_norm, matmul (transpose flags, batch broadcasting, 1-D
operands), conv2d (strides, pads, dilations, groups, bias), pools, every
data-movement op, attention (causal, grouped-query, masks, scale), rope
(both styles, partial rotary_dim), argmax, arange and a session state
updated in place by scatter; in f32, f16 and bf16.

What keeps a random model's comparison meaningful:
  - ops with a restricted domain get it: log/sqrt/rsqrt/reciprocal and
    divisors read abs(x) + 0.5, exp reads tanh(x) or x / 4, pow's base is
    positive and its exponent a param in [0.5, 2];
  - sums and means read positive values (abs(x) + 0.5), which cannot
    cancel; layer_norm reads rows with noise of their own (no constant
    rows) over at least four elements;
  - ops that are not continuous (comparisons, casts to integers or to a
    narrower float, argmax) read only inputs and params, whose values the
    kernels and the reference see bit for bit, so a rounding difference
    upstream cannot flip them;
  - a rough bound on each value's magnitude is tracked, and a value that
    may have grown large goes through tanh or a norm before it is used.

The generator is deterministic: model(seed, index) is the same model on
every machine (numpy's PCG64 stream).  Run it as a script to write models:
  gen_graphs.py --seed 1 --count 20 --out DIR
and test_random_graphs.py drives them through smelt.  Ops and their
operands are also kept as data (Model.nodes), so the driver's minimiser
can cut a failing model down (Model.cut, Model.drop_output).
"""
import argparse
import math
import os
import sys

import numpy as np

FLOATS = ("f32", "f16", "bf16")
UNARY_SAFE = ["neg", "abs", "tanh", "sigmoid", "relu", "gelu", "silu", "erf", "sin", "cos"]
UNARY_POS = ["log", "sqrt", "rsqrt", "reciprocal"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
COMPARE = ["less", "greater", "equal"]
REDUCE = ["sum", "mean", "max", "min"]
MAX_NUMEL = 2048
SMALL_DIMS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
WIDE_DIMS = [17, 33, 64, 100]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def bcast(a, b):
    """numpy's broadcast of two shapes, or None."""
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y) if x != 0 and y != 0 else 0)
    return tuple(reversed(out))


def fmt(v):
    """A YAML flow value: lists, bools, ints, floats with a point, words."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        s = repr(float(v))
        if "e" in s and "." not in s:
            return s.replace("e", ".0e")
        return s if "." in s or "e" in s else s + ".0"
    return str(v)


class Value:
    def __init__(self, name, shape, dt, kind, mag):
        self.name, self.shape, self.dt, self.kind, self.mag = name, tuple(shape), dt, kind, mag

    @property
    def leaf(self):
        return self.kind in ("input", "param")


class Model:
    """A model under construction; nodes are dicts {out, op, in, attrs}."""

    def __init__(self, seed, index, dtype=None):
        self.rng = np.random.default_rng([seed, index])
        self.seed, self.index = seed, index
        r = self.rng.random()
        self.dtype = dtype or ("f32" if r < 0.7 else "f16" if r < 0.85 else "bf16")
        self.vals = {}  # name -> Value
        self.inputs, self.params, self.nodes = [], [], []  # names; params: (name, init); nodes: dicts
        self.states = []  # session state tensors, each updated by one scatter
        self.pool = []  # float values computed from inputs: operands for later nodes
        self.outputs = []
        self.families = []  # the families used, in order (for the driver's counts)
        self.k = 0

    # ---- small helpers ----
    def ri(self, lo, hi):
        """An int in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def chance(self, p):
        return self.rng.random() < p

    def choice(self, xs):
        return xs[int(self.rng.integers(len(xs)))]

    def fresh(self, prefix):
        self.k += 1
        return "%s%d" % (prefix, self.k)

    def new_input(self, shape, dt=None, mag=1.0):
        name = self.fresh("x")
        self.vals[name] = Value(name, shape, dt or self.dtype, "input", mag)
        self.inputs.append(name)
        return name

    def new_param(self, shape, init, dt=None, mag=1.5):
        """init: 'ones', 'zeros', ('normal', std), ('uniform', lo, hi), ('value', v)"""
        name = self.fresh("p")
        self.vals[name] = Value(name, shape, dt or self.dtype, "param", mag)
        self.params.append((name, init))
        return name

    def add(self, op, ins, oshape, dt=None, mag=1.0, pool=True, outs=None, **attrs):
        """Appends a node; returns its result's name (a list for several)."""
        names = outs or [self.fresh("v")]
        shapes = oshape if outs else [oshape]
        for nm, sh in zip(names, shapes):
            self.vals[nm] = Value(nm, sh, dt or self.vals[ins[0]].dt, "node", mag)
            if pool and self.vals[nm].dt in FLOATS and numel(sh) > 0:
                self.pool.append(nm)
        self.nodes.append({"out": names if outs else names[0], "op": op, "in": list(ins), "attrs": attrs})
        return names if outs else names[0]

    def shape(self, v):
        return self.vals[v].shape

    def pick(self, ok=lambda v: True):
        """A pool value that satisfies ok, recent ones more likely, or None."""
        cands = [v for v in self.pool if ok(self.vals[v])]
        if not cands:
            return None
        w = np.arange(1, len(cands) + 1, dtype=float) ** 2
        return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]

    def rand_shape(self, rank=None, cap=512):
        rank = self.ri(1, 4) if rank is None else rank
        while True:
            s = tuple(self.choice(SMALL_DIMS) for _ in range(rank))
            if self.chance(0.4):  # a long row: several vectors and a tail
                s = s[:-1] + (self.choice(WIDE_DIMS),)
            if numel(s) <= cap:
                return s

    def tame(self, v, limit=8.0):
        """v, or v brought back to a small magnitude (tanh or a norm)."""
        if self.vals[v].mag <= limit:
            return v
        if self.chance(0.5) or len(self.shape(v)) == 0 or self.shape(v)[-1] < 2:
            return self.add("tanh", [v], self.shape(v), mag=1.0)
        d = self.shape(v)[-1]
        g = self.new_param((d,), ("uniform", 0.5, 1.5))
        return self.add("rms_norm", [v, g], self.shape(v), mag=4.0 * math.sqrt(d), eps=1e-5)

    def positive(self, v, offset=0.5):
        """abs(v) + offset: a value in a positive domain, at least offset."""
        a = self.add("abs", [v], self.shape(v), mag=self.vals[v].mag)
        h = self.new_param((), ("value", offset), mag=offset)
        return self.add("add", [a, h], self.shape(v), mag=self.vals[v].mag + offset)

    def operand(self, ok=lambda v: True, shape=None):
        """A pool value (tamed), else a new input."""
        v = self.pick(ok) if shape is None else self.pick(lambda x: x.shape == shape and ok(x))
        if v is None:
            return self.new_input(shape if shape is not None else self.rand_shape())
        return self.tame(v)

    def bshape(self, s):
        """A random shape that broadcasts against s to s."""
        out = [1 if self.chance(0.4) else d for d in s]
        drop = self.ri(0, len(out)) if self.chance(0.4) else 0
        return tuple(out[drop:])

    # ---- op families: each returns True when it added something ----
    def f_unary(self):
        x = self.operand()
        op = self.choice(UNARY_SAFE + UNARY_POS + ["exp"])
        attrs = {}
        if op in UNARY_POS:
            # log near 1 is near 0: an f16/bf16 argument's rounding (2^-8
            # of it) is then a large part of the result (seed 3, graph 3379:
            # cosine 0.99897 over values ~0.1); from 2.5 on it is not
            x = self.positive(x, 2.5 if op == "log" and self.dtype != "f32" else 0.5)
        elif op == "exp":
            if self.chance(0.5):
                x = self.add("tanh", [x], self.shape(x), mag=1.0)
            else:
                q = self.new_param((), ("value", 0.25), mag=0.25)
                x = self.add("mul", [x, q], self.shape(x), mag=self.vals[x].mag / 4)
        elif op == "gelu" and self.chance(0.5):
            attrs["approximate"] = "tanh"
        m = self.vals[x].mag
        mag = {"exp": math.exp(min(m, 30)), "log": math.log(m + 1) + 1, "sqrt": math.sqrt(m) + 1,
               "rsqrt": 1.5, "reciprocal": 2.0, "sigmoid": 1.0, "tanh": 1.0, "erf": 1.0, "sin": 1.0,
               "cos": 1.0}.get(op, m)
        self.add(op, [x], self.shape(x), mag=mag, **attrs)
        return True

    def f_binary(self):
        x = self.operand()
        s = self.shape(x)
        op = self.choice(BINARY)
        r = self.rng.random()
        if r < 0.45:  # a param that broadcasts to x
            init = ("uniform", 0.5, 1.5) if op in ("div", "pow") or self.chance(0.5) else ("normal", 1.0)
            if op == "pow":
                init = ("uniform", 0.5, 2.0)
            y = self.new_param(self.bshape(s), init)
        elif r < 0.75:  # another computed value of a shape that broadcasts
            y = self.pick(lambda v: v.name != x and bcast(v.shape, s) is not None
                          and numel(bcast(v.shape, s)) <= MAX_NUMEL)
            y = self.tame(y) if y else self.new_input(self.bshape(s))
        else:  # an input of a larger shape that x broadcasts to
            big = list(s)
            for i, d in enumerate(big):
                if d == 1 and self.chance(0.7):
                    big[i] = self.choice([2, 3, 4])
            if self.chance(0.5) or big == list(s):
                big = [self.choice([2, 3])] + big
            if numel(big) > MAX_NUMEL or len(big) > 6:
                big = list(s)
            y = self.new_input(tuple(big))
        if op == "pow":
            x = self.positive(x)
            if self.vals[y].kind != "param":
                t = self.add("tanh", [y], self.shape(y), mag=1.0)
                y = self.add("add", [t, self.new_param((), ("value", 1.0))], self.shape(y), mag=2.0)
        if op == "div" and self.vals[y].kind != "param":
            y = self.positive(y)
        if self.chance(0.3):
            x, y = y, x  # the param or the larger input first
            if op in ("div", "pow"):
                x, y = y, x
        out = bcast(self.shape(x), self.shape(y))
        mx, my = self.vals[x].mag, self.vals[y].mag
        mag = {"add": mx + my, "sub": mx + my, "mul": mx * my, "div": mx * 2, "pow": (mx + 0.5) ** 2 + 1}.get(
            op, max(mx, my))
        self.add(op, [x, y], out, mag=mag)
        return True

    def f_where(self):
        """cond = compare(input, param); where(cond, a, b); conditions only
        on leaves, so that kernels and reference agree on every element."""
        a = self.operand()
        s = self.shape(a)
        c0 = self.new_input(self.bshape(s) if self.chance(0.5) else s)
        c1 = self.new_param(self.bshape(self.shape(c0)), ("uniform", -0.5, 0.5)) if self.chance(0.7) else \
            self.new_input(self.bshape(self.shape(c0)))
        op = self.choice(COMPARE)
        if op == "equal":  # equal on random floats is false: compare a rounded copy
            c1 = c0
        cond = self.add(op, [c0, c1], bcast(self.shape(c0), self.shape(c1)), dt="bool", pool=False)
        if self.chance(0.15):
            self.outputs.append(cond)  # a bool output: checked exactly
        b = self.pick(lambda v: v.name != a and bcast(v.shape, s) is not None and numel(bcast(v.shape, s)) <= MAX_NUMEL)
        b = self.tame(b) if b else self.new_param(self.bshape(s), ("normal", 1.0))
        out = bcast(bcast(self.shape(cond), self.shape(a)), self.shape(b))
        if out is None:
            return False
        self.add("where", [cond, a, b], out, mag=max(self.vals[a].mag, self.vals[b].mag), dt=self.vals[a].dt)
        return True

    def f_reduce(self):
        x = self.operand(lambda v: len(v.shape) >= 1)
        s = self.shape(x)
        op = self.choice(REDUCE)
        if op in ("sum", "mean"):
            # a sum of values of both signs may cancel, and then its
            # relative error is that of the terms times sum|x| / |sum x|
            # (seed 6: graphs 916 and 1201, a sum of rope's output; 1106,
            # the mean of a layer_norm's result over its own axis)
            x = self.positive(x)
        attrs = {}
        rank = len(s)
        if self.chance(0.15):
            axes = list(range(rank))  # absent: every axis
        else:
            k = self.ri(1, rank)
            axes = sorted(int(a) for a in self.rng.choice(rank, size=k, replace=False))
            attrs["axes"] = [a - rank if self.chance(0.3) else a for a in axes]
        keep = self.chance(0.6)
        if keep or self.chance(0.5):
            attrs["keepdims"] = keep
        out = tuple(1 if i in axes else d for i, d in enumerate(s) if keep or i not in axes)
        red = numel([s[i] for i in axes])
        mag = self.vals[x].mag * (red if op == "sum" else 1)
        r = self.add(op, [x], out, mag=mag, **attrs)
        if keep and self.chance(0.5):  # x - reduce(x): the reduction broadcast back
            self.add("sub", [x, r], s, mag=mag + self.vals[x].mag)
        return True

    def f_softmax(self):
        x = self.operand(lambda v: len(v.shape) >= 1)
        rank = len(self.shape(x))
        ax = self.ri(-rank, rank - 1)
        op = self.choice(["softmax", "log_softmax"])
        mag = 1.0 if op == "softmax" else 2 * self.vals[x].mag + math.log(max(self.shape(x)[ax], 1)) + 1
        self.add(op, [x], self.shape(x), mag=mag, axis=ax)
        return True

    def f_norm(self):
        # a norm over one element makes +-gamma, values that a later norm
        # turns into rounding noise over sqrt(eps) (ill-conditioned: found
        # as a "mismatch" of 3e-5 rel L2 by seed 2, graph 488)
        x = self.operand(lambda v: len(v.shape) >= 1 and max(v.shape) >= 2)
        s = self.shape(x)
        rank = len(s)
        axes = [a - rank for a in range(rank) if s[a] >= 2]
        if not axes:
            return False
        ax = -1 if -1 in axes and self.chance(0.6) else self.choice(axes)
        d = s[ax]
        # layer_norm of two elements is +-1 scaled by |a - b| / sqrt((a - b)^2
        # + 4 eps): steep where a and b nearly agree (seed 4, graph 1171)
        ops = ["rms_norm"] + (["layer_norm"] if d >= 4 else []) + (["batch_norm"] if rank >= 2 else [])
        op = self.choice(ops)
        if op == "batch_norm":  # per channel, no reduction: any channel count
            c = s[1]
            ins = [x, self.new_param((c,), ("uniform", 0.5, 1.5)), self.new_param((c,), ("normal", 0.5)),
                   self.new_param((c,), ("normal", 0.5)), self.new_param((c,), ("uniform", 0.5, 1.5))]
            self.add(op, ins, s, mag=3 * self.vals[x].mag + 1)
            return True
        if op == "layer_norm":
            # a row that is constant (a broadcast operand, a saturated tanh)
            # has a variance of rounding noise, which layer_norm divides by
            # sqrt(eps): the result is noise, different in kernel and
            # reference (seed 3, graphs 1891, 2158, 4859; the errors sat
            # only on rows of std ~1e-7).  A little noise of its own keeps
            # every row's std above ~0.07.
            n = self.new_input(s)
            q = self.new_param((), ("value", 0.25), mag=0.25)
            x = self.add("add", [x, self.add("mul", [n, q], s, mag=0.25)], s, mag=self.vals[x].mag + 0.25)
        ins = [x, self.new_param((d,), ("uniform", 0.5, 1.5))]
        if op == "layer_norm" and self.chance(0.5):
            ins.append(self.new_param((d,), ("normal", 0.5)))
        attrs = {"eps": self.choice([1e-5, 1e-6])}
        if ax != -1 or self.chance(0.3):
            attrs["axis"] = ax
        self.add(op, ins, s, mag=2.0 * math.sqrt(d) + 1, **attrs)
        return True

    def f_matmul(self):
        a = self.operand(lambda v: 1 <= len(v.shape) <= 4)
        sa = self.shape(a)
        ta = len(sa) >= 2 and self.chance(0.25)
        if len(sa) == 1:
            batch, m, k = (), None, sa[0]
        else:
            batch = sa[:-2]
            m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
        n = self.choice([1, 2, 3, 5, 8, 16, 24])
        b1 = self.chance(0.1)  # a 1-D right operand
        tb = not b1 and self.chance(0.35)
        std = 1.0 / math.sqrt(max(k, 1))
        if self.chance(0.55) or b1:  # a weight
            bshape = (k,) if b1 else ((n, k) if tb else (k, n))
            if not b1 and batch and self.chance(0.3):  # a batched weight that broadcasts
                bshape = self.bshape(batch) + bshape
            b = self.new_param(bshape, ("normal", std))
        else:  # an activation: batch dims broadcast against a's
            bb = list(self.bshape(batch)) if batch else []
            if self.chance(0.3) and len(bb) + len(batch) < 4:
                bb = [self.choice([2, 3])] + [d for d in batch]  # b has more batch dims
            mat = (n, k) if tb else (k, n)
            b = self.new_input(tuple(bb) + mat)
            if self.chance(0.5):
                t = self.add("tanh", [b], self.shape(b), mag=1.0)
                b = t
        sb = self.shape(b)
        bbatch = sb[:-2] if len(sb) >= 2 else ()
        ob = bcast(batch, bbatch)
        if ob is None:
            return False
        out = tuple(ob) + ((m,) if m is not None else ()) + ((n,) if not b1 else ())
        if numel(out) > MAX_NUMEL * 2:
            return False
        attrs = {}
        if ta:
            attrs["transpose_a"] = True
        if tb:
            attrs["transpose_b"] = True
        mag = self.vals[a].mag * self.vals[b].mag * math.sqrt(max(k, 1)) * 1.5
        if self.vals[b].kind == "param":
            mag = self.vals[a].mag * 3
        r = self.add("matmul", [a, b], out, mag=mag, **attrs)
        if len(out) >= 1 and self.chance(0.4):  # a bias: the usual epilogue
            bias = self.new_param((out[-1],) if self.chance(0.7) else (1,), ("normal", 0.5))
            self.add("add", [r, bias], out, mag=mag + 1)
        return True

    def image(self):
        """A 4-D pool value, or a new [N, C, H, W] input."""
        x = self.pick(lambda v: len(v.shape) == 4 and v.shape[1] <= 16 and numel(v.shape) <= 1024)
        if x is None or self.chance(0.3):
            return self.new_input((self.ri(1, 2), self.choice([1, 2, 3, 4, 6, 8]), self.ri(1, 9), self.ri(1, 9)))
        return self.tame(x)

    def f_conv(self):
        x = self.image()
        n, c, h, w = self.shape(x)
        groups = self.choice([g for g in (1, 2, 3, 4, c) if c % g == 0]) if self.chance(0.3) else 1
        o = groups * self.choice([1, 2, 3, 4])
        kh, kw = self.ri(1, min(3, h + 2)), self.ri(1, min(3, w + 2))
        st = [self.ri(1, 2), self.ri(1, 2)]
        pd = [self.ri(0, 1) for _ in range(4)] if self.chance(0.5) else [0, 0, 0, 0]
        dl = [self.ri(1, 2), self.ri(1, 2)] if self.chance(0.2) else [1, 1]

        def win(i, p, k, s, d):
            span = d * (k - 1) + 1
            return 0 if i + p < span else (i + p - span) // s + 1

        oh, ow = win(h, pd[0] + pd[2], kh, st[0], dl[0]), win(w, pd[1] + pd[3], kw, st[1], dl[1])
        if oh < 1 or ow < 1:
            return False
        fan = c // groups * kh * kw
        wt = self.new_param((o, c // groups, kh, kw), ("normal", 1.0 / math.sqrt(fan)))
        ins = [x, wt]
        if self.chance(0.5):
            ins.append(self.new_param((o,), ("normal", 0.5)))
        attrs = {}
        if st != [1, 1] or self.chance(0.2):
            attrs["strides"] = st
        if pd != [0, 0, 0, 0]:
            attrs["pads"] = pd
        if dl != [1, 1]:
            attrs["dilations"] = dl
        if groups != 1:
            attrs["groups"] = groups
        self.add("conv2d", ins, (n, o, oh, ow), mag=self.vals[x].mag * 3 + 1, **attrs)
        return True

    def f_pool(self):
        x = self.image()
        n, c, h, w = self.shape(x)
        op = self.choice(["max_pool2d", "avg_pool2d", "global_avg_pool"])
        if op == "global_avg_pool":
            self.add(op, [x], (n, c, 1, 1), mag=self.vals[x].mag)
            return True
        k = [self.ri(1, min(3, h)), self.ri(1, min(3, w))]
        st = [self.ri(1, 2), self.ri(1, 2)] if self.chance(0.6) else None
        pd = [self.ri(0, k[0] - 1), self.ri(0, k[1] - 1), self.ri(0, k[0] - 1), self.ri(0, k[1] - 1)] \
            if self.chance(0.4) else [0, 0, 0, 0]
        s = st or k
        oh = (h + pd[0] + pd[2] - k[0]) // s[0] + 1
        ow = (w + pd[1] + pd[3] - k[1]) // s[1] + 1
        if oh < 1 or ow < 1:
            return False
        attrs = {"kernel": k}
        if st:
            attrs["strides"] = st
        if pd != [0, 0, 0, 0]:
            attrs["pads"] = pd
        self.add(op, [x], (n, c, oh, ow), mag=self.vals[x].mag, **attrs)
        return True

    def factor(self, total, rank):
        """A shape of `rank` dims with `total` elements."""
        primes, t, p = [], total, 2
        while t > 1 and p * p <= t:
            while t % p == 0:
                primes.append(p)
                t //= p
            p += 1
        if t > 1:
            primes.append(t)
        dims = [1] * rank
        for q in primes:
            dims[self.ri(0, rank - 1)] *= q
        return tuple(dims)

    def f_move(self):
        x = self.operand()
        s = self.shape(x)
        rank = len(s)
        op = self.choice(["reshape", "transpose", "slice", "concat", "split", "expand", "squeeze", "unsqueeze",
                          "gather"])
        mag = self.vals[x].mag
        if op == "reshape":
            shape = self.factor(numel(s), self.ri(1, 4))
            attr = list(shape)
            if self.chance(0.3):
                attr[self.ri(0, len(attr) - 1)] = -1
            self.add("reshape", [x], shape, mag=mag, shape=attr)
        elif op == "transpose":
            if rank < 2:
                return False
            perm = [int(i) for i in self.rng.permutation(rank)]
            if self.chance(0.2):
                self.add("transpose", [x], tuple(reversed(s)), mag=mag)
            else:
                self.add("transpose", [x], tuple(s[p] for p in perm), mag=mag,
                         perm=[p - rank if self.chance(0.2) else p for p in perm])
        elif op == "slice":
            if rank < 1:
                return False
            ax = self.ri(0, rank - 1)
            d = s[ax]
            for _ in range(8):  # most random bounds select nothing: try a few
                step = self.choice([1, 1, 2, 3, -1, -2])
                start = self.ri(-d, d - 1) if d > 0 else 0
                end = self.ri(-d - 1, d + 1)
                length = len(range(*slice(start, end, step).indices(d)))
                if length >= 1:
                    break
            if length < 1:
                return False
            attrs = {"axis": ax - rank if self.chance(0.3) else ax, "start": start, "end": end}
            if step != 1:
                attrs["step"] = step
            out = tuple(length if i == ax else e for i, e in enumerate(s))
            self.add("slice", [x], out, mag=mag, **attrs)
        elif op == "concat":
            if rank < 1:
                return False
            ax = self.ri(0, rank - 1)
            parts = [x]
            for _ in range(self.ri(1, 2)):
                y = self.pick(lambda v: len(v.shape) == rank and all(i == ax or v.shape[i] == s[i] for i in range(rank)))
                if y is None or self.chance(0.3):
                    sh = tuple(self.ri(1, 4) if i == ax else e for i, e in enumerate(s))
                    y = self.new_input(sh) if self.chance(0.6) else self.new_param(sh, ("normal", 1.0))
                parts.append(self.tame(y))
            out = tuple(sum(self.shape(p)[ax] for p in parts) if i == ax else e for i, e in enumerate(s))
            if numel(out) > MAX_NUMEL:
                return False
            self.add("concat", parts, out, mag=max(self.vals[p].mag for p in parts), axis=ax - rank if self.chance(0.3) else ax)
        elif op == "split":
            axs = [i for i in range(rank) if s[i] >= 2]
            if not axs:
                return False
            ax = self.choice(axs)
            d = s[ax]
            k = self.ri(2, min(3, d))
            attrs = {"axis": ax}
            if d % k == 0 and self.chance(0.5):
                sizes = [d // k] * k
            else:
                cuts = sorted(int(c) for c in self.rng.choice(np.arange(1, d), size=k - 1, replace=False))
                sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
                attrs["sizes"] = sizes
            outs = [self.fresh("v") for _ in sizes]
            shapes = [tuple(z if i == ax else e for i, e in enumerate(s)) for z in sizes]
            self.add("split", [x], shapes, mag=mag, outs=outs, **attrs)
        elif op == "expand":
            big = [self.choice([2, 3]) if d == 1 and self.chance(0.7) else d for d in s]
            if self.chance(0.4):
                big = [self.choice([1, 2, 3])] + big
            if numel(big) > MAX_NUMEL or len(big) > 6:
                return False
            self.add("expand", [x], tuple(big), mag=mag, shape=big)
        elif op == "squeeze":
            ones = [i for i, d in enumerate(s) if d == 1]
            if not ones:
                return False
            if self.chance(0.3):
                self.add("squeeze", [x], tuple(d for d in s if d != 1), mag=mag)
            else:
                axes = sorted(int(a) for a in self.rng.choice(ones, size=self.ri(1, len(ones)), replace=False))
                self.add("squeeze", [x], tuple(d for i, d in enumerate(s) if i not in axes), mag=mag,
                         axes=[a - rank if self.chance(0.3) else a for a in axes])
        elif op == "unsqueeze":
            k = self.ri(1, 2)
            if rank + k > 6:
                return False
            nr = rank + k
            axes = sorted(int(a) for a in self.rng.choice(nr, size=k, replace=False))
            it = iter(s)
            out = tuple(1 if i in axes else next(it) for i in range(nr))
            self.add("unsqueeze", [x], out, mag=mag, axes=[a - nr if self.chance(0.3) else a for a in axes])
        else:  # gather: ids from a new integer input, random in range (smelt run)
            if rank < 1:
                return False
            ax = self.ri(0, rank - 1)
            ishape = self.choice([(), (self.ri(1, 5),), (self.ri(1, 3), self.ri(1, 3))])
            out = s[:ax] + ishape + s[ax + 1:]
            if len(out) > 6 or numel(out) > MAX_NUMEL or s[ax] < 1:
                return False
            idx = self.new_input(ishape, dt=self.choice(["i32", "i64"]))
            self.add("gather", [x, idx], out, mag=mag, axis=ax - rank if self.chance(0.3) else ax)
        return True

    def f_attention(self):
        b, hkv = self.ri(1, 2), self.ri(1, 2)
        h = hkv * self.choice([1, 1, 2, 4])
        s, d = self.ri(1, 8), self.choice([4, 8, 16])
        causal = self.chance(0.5)
        t = s + self.ri(0, 4) if causal else self.ri(1, 10)
        dv = d if self.chance(0.8) else self.choice([4, 8])

        def qkv(shape):
            # an activation of the same size reshaped (a projection's result), or an input
            src = self.pick(lambda v: numel(v.shape) == numel(shape))
            if src is not None and self.chance(0.6):
                return self.add("reshape", [self.tame(src, 4.0)], shape, mag=min(self.vals[src].mag, 4.0),
                                shape=list(shape))
            if self.chance(0.3):  # [B, S, H, D] transposed to [B, H, S, D], as models do
                x = self.new_input((shape[0], shape[2], shape[1], shape[3]))
                return self.add("transpose", [x], shape, mag=1.0, perm=[0, 2, 1, 3])
            return self.new_input(shape)

        q = qkv((b, h, s, d))
        k = qkv((b, hkv, t, d))
        v = qkv((b, hkv, t, dv))
        ins = [q, k, v]
        attrs = {}
        if causal:
            attrs["causal"] = True
        if self.chance(0.3):
            attrs["scale"] = self.choice([0.25, 0.5, 1.0])
        if self.chance(0.3):
            if self.chance(0.5) and t >= 2 and not causal:
                ins.append(self.new_input(self.choice([(s, t), (1, 1, s, t), (b, 1, s, t)]), dt="bool"))
            else:
                ins.append(self.new_param(self.choice([(s, t), (1, h, s, t), (b, 1, 1, t)]), ("normal", 1.0)))
        self.add("attention", ins, (b, h, s, dv), mag=max(self.vals[v].mag, 1.0), **attrs)
        return True

    def f_rope(self):
        x = self.pick(lambda v: len(v.shape) >= 2 and v.shape[-1] >= 2)
        if x is None or self.chance(0.3):
            x = self.new_input(self.rand_shape(self.ri(2, 4))[:-1] + (self.choice([2, 4, 8, 16]),))
        x = self.tame(x)
        s = self.shape(x)
        dd = s[-1]
        evens = [r for r in range(2, dd + 1, 2)]
        if not evens:
            return False
        pos = self.new_input((s[-2],), dt=self.choice(["i32", "i64"]))  # positions 0, 1, 2, ...
        attrs = {}
        if self.chance(0.4) or dd % 2:
            attrs["rotary_dim"] = self.choice(evens)
        if self.chance(0.5):
            attrs["style"] = self.choice(["half", "interleaved"])
        if self.chance(0.3):
            attrs["base"] = self.choice([100.0, 10000.0, 500000.0])
        self.add("rope", [x, pos], s, mag=self.vals[x].mag * 1.5, **attrs)
        return True

    def f_cast(self):
        """Casts of leaves (exact on both sides): to a narrower float and
        back, or x * 8 to an integer and back; and a widening of a computed
        value in an f16/bf16 model."""
        r = self.rng.random()
        if r < 0.35 and self.dtype != "f32":
            # from an input: an f32 value computed from computed bf16 values
            # is only as close as bf16, but --check judges it as f32
            x = self.new_input(self.rand_shape())
            w = self.add("cast", [x], self.shape(x), dt="f32", mag=self.vals[x].mag, pool=False, to="f32")
            u = self.add("sigmoid", [w], self.shape(x), dt="f32", mag=1.0, pool=False)
            self.add("cast", [u], self.shape(x), dt=self.dtype, mag=1.0, to=self.dtype)
            return True
        x = self.new_input(self.rand_shape())
        if r < 0.7:
            narrow = self.choice([d for d in FLOATS if d != self.dtype] + ["f64"])
            c = self.add("cast", [x], self.shape(x), dt=narrow, pool=False, to=narrow)
        else:
            e = self.new_param((), ("value", 8.0), mag=8.0)
            m = self.add("mul", [x, e], self.shape(x), mag=8.0, pool=False)
            it = self.choice(["i32", "i64", "i8"])
            c = self.add("cast", [m], self.shape(x), dt=it, pool=False, to=it)
        self.add("cast", [c], self.shape(x), dt=self.dtype, mag=8.0, to=self.dtype)
        return True

    def f_index(self):
        """argmax of an input (exact: an output of its own), or arange made
        into a float ramp added to a value."""
        if self.chance(0.5):
            x = self.new_input(self.rand_shape())
            rank = len(self.shape(x))
            ax = self.ri(-rank, rank - 1)
            keep = self.chance(0.5)
            a = ax % rank
            out = tuple(1 if i == a else d for i, d in enumerate(self.shape(x)) if keep or i != a)
            attrs = {"axis": ax}
            if keep:
                attrs["keepdims"] = True
            self.outputs.append(self.add("argmax", [x], out, dt="i32", pool=False, **attrs))
            return True
        x = self.operand(lambda v: len(v.shape) >= 1)
        n = self.shape(x)[-1]
        start = self.new_input(self.choice([(), (1,)]), dt="i32")  # 0 (smelt run: 0, 1, 2, ...)
        ar = self.add("arange", [start], (n,), dt="i32", pool=False, size=n)
        f = self.add("cast", [ar], (n,), dt=self.dtype, pool=False, to=self.dtype)
        sc = self.new_param((), ("value", 0.125), mag=0.125)
        ramp = self.add("mul", [f, sc], (n,), mag=n / 8.0, pool=False)
        self.add("add", [x, ramp], self.shape(x), mag=self.vals[x].mag + n / 8.0)
        return True

    def f_state(self):
        """A session state [T, D] updated in place: scatter(state, pos, x)
        writes the rows of x at positions 0..S-1 (smelt run gives integer
        inputs 0, 1, 2, ...); the state starts zeroed, so the other rows
        read as zero."""
        x = self.pick(lambda v: len(v.shape) == 2 and v.shape[0] <= 8)
        x = self.tame(x) if x is not None and self.chance(0.7) else self.new_input((self.ri(1, 4), self.choice([4, 8, 16])))
        s, d = self.shape(x)
        t = s + self.ri(0, 4)
        name = self.fresh("s")
        self.vals[name] = Value(name, (t, d), self.vals[x].dt, "state", 0.0)
        self.states.append(name)
        pos = self.new_input((s,), dt=self.choice(["i32", "i64"]))
        c = self.add("scatter", [name, pos, x], (t, d), mag=self.vals[x].mag, pool=False, axis=self.choice([0, -2]))
        # the update lives in the state's memory and is no model output:
        # what the model makes of it is
        if self.chance(0.5):
            self.add("sum", [c], (1, d), mag=self.vals[x].mag * t, axes=[0], keepdims=True)
        else:
            self.add("mul", [c, self.new_param((d,), ("uniform", 0.5, 1.5))], (t, d), mag=self.vals[x].mag * 1.5)
        return True

    FAMILIES = [("unary", f_unary, 14), ("binary", f_binary, 16), ("where", f_where, 4), ("reduce", f_reduce, 8),
                ("softmax", f_softmax, 5), ("norm", f_norm, 6), ("matmul", f_matmul, 12), ("conv", f_conv, 5),
                ("pool", f_pool, 4), ("move", f_move, 16), ("attention", f_attention, 4), ("rope", f_rope, 3),
                ("cast", f_cast, 3), ("index", f_index, 2), ("state", f_state, 2)]

    def grow(self, steps):
        names = [f[0] for f in self.FAMILIES]
        w = np.array([f[2] for f in self.FAMILIES], dtype=float)
        done = 0
        while done < steps:
            i = int(self.rng.choice(len(names), p=w / w.sum()))
            if self.FAMILIES[i][1](self):
                self.families.append(names[i])
                done += 1
        return self

    def finish(self):
        """Outputs: the last value and a few values nothing reads."""
        used = {i for n in self.nodes for i in n["in"]}
        loose = [v for v in self.pool if v not in used and v not in self.outputs]
        outs = [v for v in self.outputs if v in self.vals]
        if loose:
            outs.append(loose[-1])
            for v in loose[:-1]:
                if self.chance(0.5) and len(outs) < 4:
                    outs.append(v)
        if not outs:
            outs.append(self.nodes[-1]["out"] if isinstance(self.nodes[-1]["out"], str) else self.nodes[-1]["out"][0])
        seen = []
        for v in outs:
            if v not in seen:
                seen.append(v)
        self.outputs = seen
        return self

    # ---- for the minimiser ----
    def live(self):
        """Drop nodes, inputs and params that no output needs."""
        need = set(self.outputs)
        keep = []
        for n in reversed(self.nodes):
            outs = n["out"] if isinstance(n["out"], list) else [n["out"]]
            if any(o in need for o in outs):
                keep.append(n)
                need.update(n["in"])
        self.nodes = list(reversed(keep))
        self.inputs = [x for x in self.inputs if x in need]
        self.states = [x for x in self.states if x in need]
        self.params = [p for p in self.params if p[0] in need]
        return self

    def copy(self):
        m = Model.__new__(Model)
        m.__dict__.update(self.__dict__)
        m.vals = dict(self.vals)
        m.inputs, m.params, m.outputs = list(self.inputs), list(self.params), list(self.outputs)
        m.states = list(self.states)
        m.nodes = [dict(n, **{"in": list(n["in"])}) for n in self.nodes]
        return m

    def cut(self, name):
        """A copy where value `name` (a node's result) becomes an input of
        its shape and dtype: everything above it that nothing else reads
        goes away."""
        m = self.copy()
        v = m.vals[name]
        idx = [i for i, n in enumerate(m.nodes) if n["out"] == name or (isinstance(n["out"], list) and name in n["out"])]
        if not idx or isinstance(m.nodes[idx[0]]["out"], list) or v.dt == "bool":
            return None
        m.nodes.pop(idx[0])
        m.vals[name] = Value(name, v.shape, v.dt, "input", v.mag)
        m.inputs.append(name)
        return m.live()

    def drop_output(self, name):
        if len(self.outputs) < 2:
            return None
        m = self.copy()
        m.outputs.remove(name)
        return m.live()

    # ---- YAML ----
    def yaml(self):
        init_txt = {"ones": "ones", "zeros": "zeros"}
        lines = ["smelt: 1", "name: rg%d_%d" % (self.seed, self.index), "seed: %d" % self.index,
                 "dtype: %s" % self.dtype]
        lines.append("inputs:")
        for x in self.inputs:
            v = self.vals[x]
            dt = "" if v.dt == self.dtype else ", dtype: %s" % v.dt
            lines.append("  %s: {shape: %s%s}" % (x, fmt(list(v.shape)), dt))
        if self.states:
            lines.append("state:")
            for x in self.states:
                lines.append("  %s: {shape: %s}" % (x, fmt(list(self.vals[x].shape))))
        if self.params:
            lines.append("params:")
            for p, init in self.params:
                v = self.vals[p]
                if isinstance(init, str):
                    src = "init: " + init_txt[init]
                elif init[0] == "normal":
                    src = "init: {normal: %s}" % fmt(round(init[1], 6))
                elif init[0] == "uniform":
                    src = "init: {uniform: [%s, %s]}" % (fmt(init[1]), fmt(init[2]))
                else:
                    src = "value: %s" % fmt(init[1])
                dt = "" if v.dt == self.dtype else ", dtype: %s" % v.dt
                lines.append("  %s: {shape: %s, %s%s}" % (p, fmt(list(v.shape)), src, dt))
        else:
            lines.append("params: {}")
        lines.append("nodes:")
        for n in self.nodes:
            out = fmt(n["out"]) if isinstance(n["out"], list) else n["out"]
            extra = "".join(", %s: %s" % (k, fmt(a)) for k, a in n["attrs"].items())
            lines.append("  - {out: %s, op: %s, in: %s%s}" % (out, n["op"], fmt(n["in"]), extra))
        lines.append("outputs: %s" % fmt(self.outputs))
        return "\n".join(lines) + "\n"

    def ops(self):
        return sorted({n["op"] for n in self.nodes})


def model(seed, index, steps=None, dtype=None):
    """The index-th random model of a seed."""
    m = Model(seed, index, dtype)
    return m.grow(steps if steps is not None else m.ri(2, 9)).finish().live()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--out", help="directory to write rg<seed>_<index>.yaml into (default: print)")
    args = ap.parse_args()
    for i in range(args.start, args.start + args.count):
        text = model(args.seed, i).yaml()
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "rg%d_%d.yaml" % (args.seed, i)), "w") as f:
                f.write(text)
        else:
            print("# ---- model %d" % i)
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
