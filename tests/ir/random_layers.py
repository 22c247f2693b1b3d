"""Random DSL layers for property tests (hypothesis), with random graphs and features.

``draw_case(draw)`` draws a recipe, builds a ``sarc.Layer`` that replays it when
traced, a graph (a full graph or a block: nodes without in-edges, self loops,
multi-edges) and its features. A recipe composes, across the edge and the dst
domain:

- unary math (relu, sigmoid, tanh, leaky_relu, elu, neg, clamp_min, clamp, pow, exp,
  log, rsqrt, gelu, silu, softplus, a tanh in float64 converted back), each kept finite
  on any input (exp of a tanh, log of 1.5 + tanh);
- binary math between values of one shape, and with parameters of every shape
  that broadcasts (per feature, ``[1, ...]`` over the row axis, per last axis,
  scalar), the parameter on either side, some through param-domain math;
- nn.Linear with and without bias, TypedLinear by edge type (with and without
  bases), a parameter table indexed by edge type, heads (reshape / flatten),
  sum over a feature axis, concat, dropout;
- reductions sum, mean, max, min and softmax-weighted sums over heads.

Features are multiples of 0.5, so max / min see exact ties (and relu / clamp_min
exact kinks) often. Everything is float64: the tests compare gradients computed
two ways and want no float32 cancellation noise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

import sarc

WIDTH = 4        # feature width of the inputs
NUM_TYPES = 3    # edge types
HEADS = 2
DTYPE = "f64"

UNARY = {
    "relu": lambda x: torch.relu(x),
    "sigmoid": lambda x: torch.sigmoid(x),
    "tanh": lambda x: torch.tanh(x),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": lambda x: F.elu(x, 0.7),
    "neg": lambda x: -x,
    "clamp_min": lambda x: x.clamp_min(0.5),
    "square": lambda x: x ** 2,
    "exp": lambda x: torch.exp(torch.tanh(x)),
    "log": lambda x: torch.log(1.5 + torch.tanh(x)),
    "rsqrt": lambda x: (1.0 + x * x).rsqrt(),
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": lambda x: F.silu(x),
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=1.0),
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "tanh_f64": lambda x: x.double().tanh().to(x.dtype),
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (1.5 + torch.tanh(b)),
}
REDUCE_KINDS = ("sum", "mean", "max", "min", "softmax")


@dataclass
class Recipe:
    """What a random layer computes; registers are indices into a list of values."""

    message: list[tuple] = field(default_factory=list)
    messages: list[tuple[int, str, int]] = field(default_factory=list)  # (reg, kind, score reg)
    update: list[tuple] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)
    modules: dict[str, tuple] = field(default_factory=dict)


def _draw_steps(draw, feats: list[tuple[int, ...]], recipe: Recipe, in_message: bool,
                n: int) -> list[tuple]:
    steps = []
    kinds = ["unary", "unary", "binary", "param", "linear", "heads", "flatten", "sum_axis",
             "concat", "dropout"]
    if in_message:
        kinds += ["typed", "table"]
    for _ in range(n):
        kind = draw(st.sampled_from(kinds))
        i = draw(st.integers(0, len(feats) - 1))
        f = feats[i]
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), i))
            feats.append(f)
        elif kind == "binary":
            same = [j for j, g in enumerate(feats) if g == f]
            j = draw(st.sampled_from(same))
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), i, j))
            feats.append(f)
        elif kind == "param":
            shapes = [f, (1, *f)]
            if len(f) >= 2:
                shapes.append(f[-1:])
            if f:
                shapes.append((1,))
            shape = draw(st.sampled_from(shapes))
            name = f"p{len(recipe.params)}"
            recipe.params[name] = shape
            op = draw(st.sampled_from(sorted(BINARY)))
            param_first = draw(st.booleans()) and op != "div"
            squash = draw(st.booleans())  # param-domain math before use
            steps.append(("param", op, i, name, param_first, squash))
            feats.append(f)
        elif kind == "linear" and f:
            out = draw(st.sampled_from([2, 3, 4, 6]))
            name = f"m{len(recipe.modules)}"
            recipe.modules[name] = ("linear", f[-1], out, draw(st.booleans()))
            steps.append(("module", name, i))
            feats.append((*f[:-1], out))
        elif kind == "typed" and len(f) == 1:
            out = draw(st.sampled_from([2, 3, 4]))
            name = f"m{len(recipe.modules)}"
            bases = draw(st.sampled_from([None, 2]))
            recipe.modules[name] = ("typed", f[0], out, bases)
            steps.append(("typed", name, i))
            feats.append((out,))
        elif kind == "table":
            name = f"p{len(recipe.params)}"
            recipe.params[name] = (NUM_TYPES, *f)
            steps.append(("table", name, i))
            feats.append(f)
        elif kind == "heads" and len(f) == 1 and f[0] % HEADS == 0:
            steps.append(("heads", i))
            feats.append((HEADS, f[0] // HEADS))
        elif kind == "flatten" and len(f) == 2:
            steps.append(("flatten", i))
            feats.append((f[0] * f[1],))
        elif kind == "sum_axis" and f:
            keep = draw(st.booleans())
            steps.append(("sum_axis", i, keep))
            feats.append((*f[:-1], 1) if keep else f[:-1])
        elif kind == "concat" and f:
            same = [j for j, g in enumerate(feats) if g[:-1] == f[:-1] and g]
            j = draw(st.sampled_from(same))
            steps.append(("concat", i, j))
            feats.append((*f[:-1], f[-1] + feats[j][-1]))
        elif kind == "dropout":
            steps.append(("dropout", i, draw(st.sampled_from([0.0, 0.3]))))
            feats.append(f)
    return steps


def draw_recipe(draw) -> Recipe:
    r = Recipe()
    # message registers: src.h, dst.h, edge.w (all per edge)
    feats: list[tuple[int, ...]] = [(WIDTH,), (WIDTH,), (WIDTH,)]
    r.message = _draw_steps(draw, feats, r, True, draw(st.integers(1, 6)))
    for _ in range(draw(st.integers(1, 2))):
        m = draw(st.integers(0, len(feats) - 1))
        kind = draw(st.sampled_from(REDUCE_KINDS))
        scores = [j for j, g in enumerate(feats) if g and feats[m] and g[:-1] == feats[m][:-1]]
        if kind == "softmax" and not scores:
            kind = "sum"
        score = draw(st.sampled_from(scores)) if kind == "softmax" else -1
        r.messages.append((m, kind, score))
    # update registers: the aggregates (flattened), then dst.h
    ufeats = []
    for m, _, _ in r.messages:
        f = feats[m]
        ufeats.append((f[0] * f[1],) if len(f) == 2 else f)
    ufeats.append((WIDTH,))
    r.update = _draw_steps(draw, ufeats, r, False, draw(st.integers(0, 4)))
    n = len(ufeats)
    r.outputs = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2))))
    return r


class RandomLayer(sarc.Layer):
    """Replays a ``Recipe`` when traced."""

    def __init__(self, recipe: Recipe):
        super().__init__(node={"h": sarc.Feature((WIDTH,), DTYPE)},
                         edge={"w": sarc.Feature((WIDTH,), DTYPE), "etype": sarc.INDEX})
        self.recipe = recipe
        self.tables = nn.ParameterDict({k: nn.Parameter(torch.randn(s) * 0.7)
                                        for k, s in recipe.params.items()})
        mods = {}
        for name, spec in recipe.modules.items():
            if spec[0] == "linear":
                mods[name] = nn.Linear(spec[1], spec[2], bias=spec[3])
            else:
                mods[name] = sarc.TypedLinear(spec[1], spec[2], NUM_TYPES, spec[3])
        self.mods = nn.ModuleDict(mods)
        self.double()

    def extra_repr(self) -> str:  # hypothesis prints failing cases with it
        return repr(self.recipe)

    def _replay(self, steps, regs, edge=None):
        for s in steps:
            kind = s[0]
            if kind == "unary":
                regs.append(UNARY[s[1]](regs[s[2]]))
            elif kind == "binary":
                regs.append(BINARY[s[1]](regs[s[2]], regs[s[3]]))
            elif kind == "param":
                _, op, i, name, param_first, squash = s
                p = self.tables[name]
                if squash:
                    p = torch.tanh(p) * 2.0
                a, b = (p, regs[i]) if param_first else (regs[i], p)
                regs.append(BINARY[op](a, b))
            elif kind == "module":
                regs.append(self.mods[s[1]](regs[s[2]]))
            elif kind == "typed":
                regs.append(self.mods[s[1]](regs[s[2]], edge.etype))
            elif kind == "table":
                regs.append(regs[s[2]] * self.tables[s[1]][edge.etype])
            elif kind == "heads":
                x = regs[s[1]]
                regs.append(x.view(-1, HEADS, x.shape[-1] // HEADS))
            elif kind == "flatten":
                regs.append(regs[s[1]].flatten(1))
            elif kind == "sum_axis":
                regs.append(regs[s[1]].sum(-1, keepdim=s[2]))
            elif kind == "concat":
                regs.append(torch.cat([regs[s[1]], regs[s[2]]], -1))
            elif kind == "dropout":
                regs.append(sarc.dropout(regs[s[1]], s[2]))
        return regs

    def message(self, src, dst, edge):
        regs = self._replay(self.recipe.message, [src.h, dst.h, edge.w], edge)
        msgs = {}
        for k, (m, kind, score) in enumerate(self.recipe.messages):
            msgs[f"m{k}"] = regs[m]
            if kind == "softmax":
                msgs[f"s{k}"] = regs[score].sum(-1, keepdim=True)
        return msgs

    def reduce(self, msg):
        aggs = {}
        for k, (_, kind, _) in enumerate(self.recipe.messages):
            m = msg[f"m{k}"]
            if kind == "softmax":
                a = sarc.sum(m * sarc.edge_softmax(msg[f"s{k}"]))
            else:
                a = {"sum": sarc.sum, "mean": sarc.mean, "max": sarc.max, "min": sarc.min}[kind](m)
            aggs[f"a{k}"] = a.flatten(1) if len(a.shape) == 3 else a
        return aggs

    def update(self, dst, agg):
        regs = [agg[f"a{k}"] for k in range(len(self.recipe.messages))] + [dst.h]
        regs = self._replay(self.recipe.update, regs)
        return {f"out{k}": regs[i] for k, i in enumerate(self.recipe.outputs)}


@st.composite
def graphs(draw, max_nodes: int = 7, max_edges: int = 14) -> sarc.Graph:
    """A graph or a block; some nodes without in-edges, self loops and repeated edges."""
    num_src = draw(st.integers(1, max_nodes))
    num_dst = draw(st.sampled_from([num_src, draw(st.integers(1, num_src))]))
    pairs = draw(st.lists(st.tuples(st.integers(0, num_src - 1), st.integers(0, num_dst - 1)),
                          max_size=max_edges))
    repeats = draw(st.lists(st.integers(0, max(0, len(pairs) - 1)), max_size=4)) if pairs else []
    pairs = pairs + [pairs[k] for k in repeats]
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    return sarc.Graph.from_edges(src, dst, num_src=num_src, num_dst=num_dst)


def features(g: sarc.Graph, seed: int) -> dict[str, torch.Tensor]:
    """Node and edge features in multiples of 0.5 (exact ties), edge types in range."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randint(-4, 5, (g.num_src, WIDTH), generator=gen).double() / 2
    w = torch.randint(-4, 5, (g.num_edges, WIDTH), generator=gen).double() / 2
    etype = torch.randint(0, NUM_TYPES, (g.num_edges,), generator=gen)
    return {"h": h, "w": w, "etype": etype}


@st.composite
def cases(draw):
    """(layer, graph, features, seed)."""
    recipe = draw_recipe(draw)
    seed = draw(st.integers(0, 2**16))
    torch.manual_seed(seed)
    layer = RandomLayer(recipe)
    g = draw(graphs())
    return layer, g, features(g, seed), seed
