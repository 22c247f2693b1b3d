"""Hypothesis strategies: random graphs and blocks, and random layers written in the DSL.

A random layer is a ``Spec`` (plain data, so hypothesis can shrink it) turned into
a ``sarc.Layer`` subclass by ``make_layer``. Its messages are expression trees
over gathered source / destination features, an edge weight, learnable linear
maps and parameters, and elementwise math; each message is reduced by a random
kind (sum, mean, max, min, or an edge_softmax-weighted sum, optionally with
several heads), and the update combines the aggregates with the destination's
own features.

Expressions (nested tuples) are edge values of width ``d``:

    ("src_lin", k)        lins[k](src.h)             ("dst_lin", k)   lins[k](dst.h)
                          (a leaf may reuse another leaf's lins[k], as GAT projects both ends
                          with one linear, and so may the update's lins[k](dst.h); a leaf
                          may be ("bin", op, ("src_lin", k), ("dst_lin", k)))
    ("src_x",)            src.x                      ("dst_x",)       dst.x
    ("src_typed", k)      typed[k](src.h, edge.t)    (RGCN's per-relation weight)
    ("un", name, e)       an elementwise unary op    ("bin", name, a, b)
    ("lin", k, e)         lins[k](e) on edges        ("param", k, e)  e * params[k]
    ("w", e)              e * edge.w                 ("scale", c, e)  c * e
    ("cat", k, a, b)      lins[k](cat([a, b], -1))   ("matmul", k, e) e @ params[k]
    ("rowsum", e)         e * e.sum(-1, keepdim)     ("rowmean", e)   e + e.mean(-1, keepdim)
    ("index", k, e)       e * params[k][edge.t]      ("typed", k, e)  typed[k](e, edge.t)
    ("deg", side, e)      e / sqrt(degree)           (src.out_degree or dst.in_degree)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

import sarc

NUM_TYPES = 3
REDUCERS = {"sum": sarc.sum, "mean": sarc.mean, "max": sarc.max, "min": sarc.min}
REDUCE_KINDS = (*REDUCERS, "softmax")
UNARY = ("relu", "tanh", "sigmoid", "neg", "leaky_relu", "elu", "exp_tanh", "log_sigmoid",
         "square", "clamp", "dropout", "gelu", "silu", "softplus", "clamp_both", "tanh_f64")
BINARY = ("add", "sub", "mul", "div")


@dataclass(frozen=True)
class Spec:
    din: int                           # width of node feature h
    d: int                             # width of every message value (and of node feature x)
    use_x: bool                        # node feature x [d] declared
    use_w: bool                        # edge feature w (a scalar per edge) declared
    use_t: bool                        # edge feature t (an int64 type in 0..NUM_TYPES-1) declared
    lins: tuple                        # (in, out, bias) of each nn.Linear
    params: tuple                      # shape of each extra parameter
    typed: tuple                       # (in, out, num_bases or None) of each sarc.TypedLinear
    messages: tuple                    # expression per message
    reduces: tuple                     # (kind, heads) per message
    update_self: int | None            # lins index applied to dst.h in update, or None
    update_act: str | None             # a unary op after the update, or None
    concat: int | None                 # lins index of a linear over the concatenated aggregates
    update_norm: bool                  # scale the update by in_degree ** -0.5 (as GCN)
    update_out: tuple | None = None    # (lins index, broadcast): a linear narrowing d over the
    #                                    aggregates (plus in_degree [N, 1] if broadcast)


class _Ctx:
    """Collects linear maps and parameters while an expression is drawn."""

    def __init__(self, din: int, d: int):
        self.din, self.d = din, d
        self.lins: list[tuple[int, int, bool]] = []
        self.params: list[tuple[int, ...]] = []
        self.typed: list[tuple[int, int, int | None]] = []
        self.projections: list[int] = []  # the lins of h the leaves read

    def projection(self, draw) -> int:
        """A linear map of h: one a leaf already reads (src and dst ends of one weight), or
        a new one."""
        if self.projections and draw(st.booleans()):
            return draw(st.sampled_from(self.projections))
        self.projections.append(self.lin(self.din, self.d, draw(st.booleans())))
        return self.projections[-1]

    def lin(self, i: int, o: int, bias: bool) -> int:
        self.lins.append((i, o, bias))
        return len(self.lins) - 1

    def param(self, shape: tuple[int, ...]) -> int:
        self.params.append(shape)
        return len(self.params) - 1

    def typed_linear(self, i: int, o: int, bases: int | None) -> int:
        self.typed.append((i, o, bases))
        return len(self.typed) - 1


def _expr(draw, ctx: _Ctx, depth: int, use_x: bool, use_w: bool, use_t: bool):
    leaves = ["src_lin", "dst_lin", "both_ends"] + (["src_x", "dst_x"] if use_x else []) + (
        ["src_typed"] if use_t else [])
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        leaf = draw(st.sampled_from(leaves))
        if leaf == "both_ends":  # one projection at both ends of the edge (GAT's lin)
            k = ctx.projection(draw)
            return ("bin", draw(st.sampled_from(BINARY)), ("src_lin", k), ("dst_lin", k))
        if leaf in ("src_lin", "dst_lin"):
            return (leaf, ctx.projection(draw))
        if leaf == "src_typed":
            return (leaf, ctx.typed_linear(ctx.din, ctx.d, draw(st.sampled_from([None, 2]))))
        return (leaf,)
    kinds = ["un", "bin", "lin", "param", "scale", "cat", "matmul", "rowsum", "rowmean", "deg"]
    kinds += (["w"] if use_w else []) + (["index", "typed"] if use_t else [])
    kind = draw(st.sampled_from(kinds))
    sub = lambda: _expr(draw, ctx, depth - 1, use_x, use_w, use_t)  # noqa: E731
    d = ctx.d
    if kind == "un":
        return ("un", draw(st.sampled_from(UNARY)), sub())
    if kind == "bin":
        return ("bin", draw(st.sampled_from(BINARY)), sub(), sub())
    if kind == "lin":
        return ("lin", ctx.lin(d, d, draw(st.booleans())), sub())
    if kind == "param":
        # [d] and [1, d] both broadcast against an edge value [E, d]
        return ("param", ctx.param(draw(st.sampled_from([(d,), (1, d), (1,)]))), sub())
    if kind == "scale":
        return ("scale", draw(st.sampled_from([-2.0, 0.5, 3.0])), sub())
    if kind == "cat":
        return ("cat", ctx.lin(2 * d, d, draw(st.booleans())), sub(), sub())
    if kind == "matmul":
        return ("matmul", ctx.param((d, d)), sub())
    if kind in ("rowsum", "rowmean"):
        return (kind, sub())
    if kind == "deg":
        return ("deg", draw(st.sampled_from(["src", "dst"])), sub())
    if kind == "index":
        return ("index", ctx.param((NUM_TYPES, d)), sub())
    if kind == "typed":
        return ("typed", ctx.typed_linear(d, d, draw(st.sampled_from([None, 2]))), sub())
    return ("w", sub())


@st.composite
def specs(draw, max_depth: int = 3, max_messages: int = 2,
          reduce_kinds: tuple[str, ...] = REDUCE_KINDS) -> Spec:
    din = draw(st.sampled_from([1, 2, 3, 5]))
    d = draw(st.sampled_from([1, 2, 3, 4]))
    use_x, use_w, use_t = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    ctx = _Ctx(din, d)
    n = draw(st.integers(1, max_messages))
    messages = tuple(_expr(draw, ctx, max_depth, use_x, use_w, use_t) for _ in range(n))
    reduces = []
    for _ in range(n):
        kind = draw(st.sampled_from(reduce_kinds))
        heads = draw(st.sampled_from([1, 2])) if kind == "softmax" and d % 2 == 0 else 1
        reduces.append((kind, heads))
    update_self = ctx.projection(draw) if draw(st.booleans()) else None
    update_act = draw(st.sampled_from((None,) + UNARY))
    concat = ctx.lin(n * d, d, True) if n > 1 and draw(st.booleans()) else None
    update_norm = draw(st.booleans())
    update_out = ((ctx.lin(d, d - 1, draw(st.booleans())), draw(st.booleans()))
                  if d > 1 and draw(st.booleans()) else None)
    return Spec(din, d, use_x, use_w, use_t, tuple(ctx.lins), tuple(ctx.params), tuple(ctx.typed),
                messages, tuple(reduces), update_self, update_act, concat, update_norm, update_out)


def _unary(name: str, x):
    if name == "relu":
        return torch.relu(x)
    if name == "tanh":
        return x.tanh()
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "neg":
        return -x
    if name == "leaky_relu":
        return F.leaky_relu(x, 0.2)
    if name == "elu":
        return F.elu(x)
    if name == "exp_tanh":
        return torch.exp(x.tanh())
    if name == "log_sigmoid":
        return (x.sigmoid() + 0.5).log()
    if name == "square":
        return x ** 2
    if name == "clamp":
        return x.clamp_min(-0.5)
    if name == "dropout":      # active in training mode only
        return sarc.dropout(x, 0.3)
    if name == "gelu":
        return F.gelu(x)
    if name == "silu":
        return F.silu(x)
    if name == "softplus":
        return F.softplus(x, beta=1.5, threshold=2.0)
    if name == "clamp_both":
        return x.clamp(-0.5, 0.5)
    if name == "tanh_f64":     # computed in float64, converted back (two casts; none in f64)
        return x.double().tanh().to(x.dtype)
    raise AssertionError(name)


def _binary(name: str, a, b):
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if name == "div":
        return a / (b.sigmoid() + 0.5)
    raise AssertionError(name)


class RandomLayer(sarc.Layer):
    """A layer that evaluates a ``Spec`` while it is traced (``make_layer`` names a subclass)."""

    spec: Spec

    def __init__(self):
        s = self.spec
        node = {"h": s.din, **({"x": s.d} if s.use_x else {})}
        edge = {**({"w": ()} if s.use_w else {}), **({"t": sarc.INDEX} if s.use_t else {})}
        super().__init__(node=node, edge=edge)
        self.lins = nn.ModuleList([nn.Linear(i, o, bias=b) for i, o, b in s.lins])
        self.params = nn.ParameterList([nn.Parameter(torch.randn(shape) / shape[-1] ** 0.5)
                                        for shape in s.params])
        self.typed = nn.ModuleList([sarc.TypedLinear(i, o, NUM_TYPES, b) for i, o, b in s.typed])
        self.att = nn.ParameterList([nn.Parameter(torch.randn(1, heads, s.d // heads))
                                     for _, heads in s.reduces])

    def _eval(self, e, src, dst, edge):
        tag = e[0]
        if tag == "src_lin":
            return self.lins[e[1]](src.h)
        if tag == "dst_lin":
            return self.lins[e[1]](dst.h)
        if tag == "src_x":
            return src.x
        if tag == "dst_x":
            return dst.x
        if tag == "src_typed":
            return self.typed[e[1]](src.h, edge.t)
        sub = [self._eval(a, src, dst, edge) for a in e[2:]] if tag in ("un", "bin", "cat") else None
        if tag == "un":
            return _unary(e[1], sub[0])
        if tag == "bin":
            return _binary(e[1], *sub)
        if tag == "cat":
            return self.lins[e[1]](torch.cat(sub, dim=-1))
        x = self._eval(e[-1], src, dst, edge)
        if tag == "lin":
            return self.lins[e[1]](x)
        if tag == "param":
            return x * self.params[e[1]]
        if tag == "scale":
            return e[1] * x
        if tag == "w":
            return x * edge.w.unsqueeze(-1)
        if tag == "matmul":
            return x @ self.params[e[1]]
        if tag == "rowsum":
            return x * x.sum(-1, keepdim=True)
        if tag == "rowmean":
            return x + x.mean(-1, keepdim=True)   # (x - mean would make rowsum 0)
        if tag == "deg":
            deg = src.out_degree if e[1] == "src" else dst.in_degree
            return x * deg.clamp_min(1).rsqrt().unsqueeze(-1)
        if tag == "index":
            return x * self.params[e[1]][edge.t]
        if tag == "typed":
            return self.typed[e[1]](x, edge.t)
        raise AssertionError(tag)

    def message(self, src, dst, edge):
        return {f"m{i}": self._eval(e, src, dst, edge) for i, e in enumerate(self.spec.messages)}

    def reduce(self, msg):
        aggs = {}
        for i, (kind, heads) in enumerate(self.spec.reduces):
            m = msg[f"m{i}"]
            if kind != "softmax":
                aggs[f"a{i}"] = REDUCERS[kind](m)
                continue
            z = m.view(-1, heads, self.spec.d // heads)
            alpha = sarc.edge_softmax(F.leaky_relu((z * self.att[i]).sum(-1), 0.2))
            aggs[f"a{i}"] = sarc.sum(z * alpha.unsqueeze(-1)).flatten(1)
        return aggs

    def update(self, dst, agg):
        s = self.spec
        parts = [agg[f"a{i}"] for i in range(len(s.messages))]
        if s.concat is not None:
            h = self.lins[s.concat](torch.cat(parts, dim=-1))
        else:
            h = parts[0]
            for p in parts[1:]:
                h = h + p
        if s.update_self is not None:
            h = h + self.lins[s.update_self](dst.h)
        if s.update_out is not None:
            k, broadcast = s.update_out
            h = self.lins[k](h + dst.in_degree.unsqueeze(-1) if broadcast else h)
        if s.update_norm:
            h = h * dst.in_degree.clamp_min(1).rsqrt().unsqueeze(-1)
        return _unary(s.update_act, h) if s.update_act else h


# A max over a message computed in float64 (tanh through a float64 cast), then added to a
# float32 value: a Triton kernel adds in float64, so an edge's value is finer than the
# float32 maximum; the backward's ties are found at the precision the region computes in.
MAX_OF_A_F64_REGION = Spec(
    din=1, d=1, use_x=True, use_w=False, use_t=True, lins=((1, 1, False),), params=(),
    typed=((1, 1, None),),
    messages=(("bin", "add", ("un", "tanh_f64", ("src_typed", 0)), ("src_x",)),),
    reduces=(("max", 1),), update_self=None, update_act=None, concat=None, update_norm=False)


def out_width(spec: Spec) -> int:
    """The width of the layer's output ``h``."""
    return spec.d - 1 if spec.update_out is not None else spec.d


def make_layer(spec: Spec) -> sarc.Layer:
    """A fresh layer class for ``spec`` (so each program is its own DSL class)."""
    cls = type("RandomLayer", (RandomLayer,), {"spec": spec})
    return cls()


def features(layer: RandomLayer, g: sarc.Graph, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    s = layer.spec
    feats = {"h": torch.randn(g.num_src, s.din, generator=gen)}
    if s.use_x:
        feats["x"] = torch.randn(g.num_src, s.d, generator=gen)
    if s.use_w:
        feats["w"] = torch.randn(g.num_edges, generator=gen)
    if s.use_t:
        feats["t"] = torch.randint(0, NUM_TYPES, (g.num_edges,), generator=gen)
    return feats


@st.composite
def graphs(draw, max_nodes: int = 30, max_edges: int = 60, blocks: bool = True) -> sarc.Graph:
    """Random graphs and blocks: duplicate edges, self loops, isolated nodes, no edges."""
    num_src = draw(st.integers(1, max_nodes))
    num_dst = draw(st.integers(1, num_src)) if blocks and draw(st.booleans()) else num_src
    pairs = draw(st.lists(st.tuples(st.integers(0, num_src - 1), st.integers(0, num_dst - 1)),
                          max_size=max_edges))
    if pairs and draw(st.booleans()):       # repeat some edges: multi-edges
        pairs += draw(st.lists(st.sampled_from(pairs), max_size=10))
    if draw(st.booleans()):                 # self loops on every dst node
        pairs += [(v, v) for v in range(num_dst)]
    src = torch.tensor([u for u, _ in pairs], dtype=torch.int64)
    dst = torch.tensor([v for _, v in pairs], dtype=torch.int64)
    return sarc.Graph.from_edges(src, dst, num_src=num_src, num_dst=num_dst)
