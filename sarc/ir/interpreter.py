"""The reference interpreter: the meaning of every op, in plain torch.

``run(fn, g, inputs, params)`` evaluates a layer on a graph. It is written for
clarity, not speed (scatter-based reductions, a weight matrix gathered per edge
for typed linears); every backend and every distributed schedule is tested
against it. Autograd through it gives the reference gradients.

Inputs: node features have ``g.num_src`` rows (dst rows are the first
``g.num_dst``), edge features are in the graph's CSR edge order, and the
builtins ``in_degree`` / ``out_degree`` are supplied like any other input.
Dropout masks are a function of the call's ``seed`` (``sarc.ir.rng``).

``run_backward`` evaluates a backward function (``sarc.ir.autodiff.grad``) given
the forward call's inputs, params and seed and the outputs' cotangents.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from ..amp import autocast_state, cast_by_autocast
from ..graph import Graph
from .function import Function, Region, Value
from .ops import Op
from .reducers import reducer
from . import rng
from .softmax import edge_softmax_vjp
from .autodiff import GRAD_PREFIX
from .types import Domain


def _scatter(kind: str, x: torch.Tensor, g: Graph) -> torch.Tensor:
    """Reduce edge rows into destination rows with reducer ``kind`` (``ROW_REDUCE``)."""
    return ROW_REDUCE[kind](g, x)


def _degree(g: Graph) -> torch.Tensor:
    return torch.bincount(g.dst, minlength=g.num_dst)


def _linear(kind: str):
    """sum / mean: a scatter-add, finished by the reducer (mean divides by the degree)."""
    r = reducer(kind)

    def reduce_rows(g: Graph, x: torch.Tensor) -> torch.Tensor:
        out_shape = (g.num_dst, *x.shape[1:])
        s = torch.full(out_shape, r.unit, dtype=x.dtype, device=x.device).index_add(0, g.dst, x)
        return r.finalize(s, _degree(g))
    return reduce_rows


def _extremum(kind: str, pick: Callable[..., torch.Tensor]):
    """max / min over each destination's edges, 0 where it has none.

    The edges are laid out densely, ``[N_dst, max in-degree, ...]``, padded with the
    reducer's unit (-inf for max, +inf for min), and reduced with ``pick``
    (``torch.amax`` / ``amin``), whose gradient is split evenly among the edges that
    attain the extremum (ties: multi-edges, equal messages), the reducer's
    ``tie_shares`` rule. ``scatter_reduce`` is not used: with ``include_self=False`` its
    backward still counts the untouched initial value as a tie, halving the gradient
    wherever the extremum is exactly 0.
    """
    r = reducer(kind)

    def reduce_rows(g: Graph, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(g.num_edges, device=x.device) - g.rowptr[:-1][g.dst]
        width = int(pos.max()) + 1 if g.num_edges else 1
        dense = torch.full((g.num_dst, width, *x.shape[1:]), r.unit, dtype=x.dtype, device=x.device)
        dense = dense.index_put((g.dst, pos), x)
        return r.finalize(pick(dense, 1), g.rowptr[1:] - g.rowptr[:-1])
    return reduce_rows


def _softmax_rows(g: Graph, score: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """sum over each destination's edges of softmax_v(score) * value."""
    alpha = _edge_softmax(score, g)
    alpha = alpha.reshape(*alpha.shape, *([1] * (value.dim() - alpha.dim())))
    return _scatter("sum", alpha * value, g)


ROW_REDUCE: dict[str, Callable[..., torch.Tensor]] = {
    "sum": _linear("sum"),
    "mean": _linear("mean"),
    "max": _extremum("max", torch.amax),
    "min": _extremum("min", torch.amin),
    "softmax": _softmax_rows,
}
"""Each reducer (``sarc.ir.reducers``): (g, edge rows...) -> destination rows; softmax
reads (score, value)."""


def _edge_softmax(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """Under autocast, a half / bfloat16 score's softmax in float32, as CUDA's autocast
    computes torch.softmax, on every device (every backend's: ``torch_ops.accumulates``)."""
    if x.dtype in (torch.float16, torch.bfloat16) and autocast_state(x.device.type)[0]:
        x = x.float()
    return _EdgeSoftmax.apply(x, g)


class _EdgeSoftmax(torch.autograd.Function):
    """softmax over each destination's edges, max-shifted; the backward is the
    cancellation-free form every backend computes (``sarc.ir.softmax``)."""

    @staticmethod
    def forward(ctx, x, g):
        idx = g.dst.view(-1, *([1] * (x.dim() - 1))).expand_as(x)
        m = torch.full((g.num_dst, *x.shape[1:]), float("-inf"), dtype=x.dtype, device=x.device)
        m = m.scatter_reduce(0, idx, x, "amax", include_self=True)
        ex = torch.exp(x - m[g.dst])
        s = torch.zeros_like(m).index_add(0, g.dst, ex)
        p = ex / s[g.dst]
        ctx.g = g
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, dp):
        (p,) = ctx.saved_tensors
        g = ctx.g
        return edge_softmax_vjp(p, dp, lambda t: _scatter("sum", t, g), lambda t: t[g.dst]), None


def _graph_axis(v: Value, axis: int) -> int:
    """A feature axis as a torch dim: shifted past the row axis; negative ones count
    from the end, the same in both."""
    return axis if v.type.domain is Domain.PARAM or axis < 0 else axis + 1


def _reshape(v: Value, x: torch.Tensor) -> torch.Tensor:
    feat = v.attr["feat"]
    return x.reshape(feat) if v.type.domain is Domain.PARAM else x.reshape(x.shape[0], *feat)


def per_edge(x: torch.Tensor, side: str, g: Graph) -> torch.Tensor:
    """A fused op's operand as its region reads it: one row per edge (params as is)."""
    if side == "src":
        return x[g.src]
    if side == "dst":
        return x[g.dst]
    return x


def run_region(r: Region, g: Graph, ctx, operands) -> torch.Tensor:
    """Evaluate a fused op's per-edge region on its (not yet gathered) operands."""
    env: list[torch.Tensor] = []
    for v in r.values:
        if v.op is Op.ARG:
            env.append(per_edge(operands[v.attr["index"]], v.attr["side"], g))
        elif v.op is Op.CONST:
            env.append(torch.tensor(v.attr["value"], dtype=v.type.dtype.to_torch(),
                                    device=g.device))
        else:
            env.append(IMPLS[v.op](v, g, ctx, *(env[j] for j in v.inputs)))
    return env[r.result]


def _softmax_aggregate(v: Value, g: Graph, ctx, *xs) -> torch.Tensor:
    score = run_region(v.attr["score"], g, ctx, xs)
    value = run_region(v.attr["value"], g, ctx, xs)
    return ROW_REDUCE["softmax"](g, score, value)


def _zeros(v: Value, g: Graph) -> torch.Tensor:
    """Zeros of ``v``'s type on ``g``."""
    rows = {Domain.SRC: g.num_src, Domain.DST: g.num_dst, Domain.EDGE: g.num_edges,
            Domain.PARAM: None}[v.type.domain]
    shape = v.type.feat if rows is None else (rows, *v.type.feat)
    return torch.zeros(shape, dtype=v.type.dtype.to_torch(), device=g.device)


def _rowwise(per_row: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return per_row.view(-1, *([1] * (like.dim() - 1)))


def _edge_count(g: Graph) -> torch.Tensor:
    """Edges into each destination of this block, at least 1 (a mean reduce's divisor)."""
    return torch.bincount(g.dst, minlength=g.num_dst).clamp(min=1)


def _expand(v: Value, x: torch.Tensor) -> torch.Tensor:
    feat = tuple(v.attr["feat"])
    if v.type.domain is Domain.PARAM:
        return x.expand(feat)
    lead = len(feat) - (x.dim() - 1)
    return x.reshape(x.shape[0], *([1] * lead), *x.shape[1:]).expand(x.shape[0], *feat)


def _torch_perm(v: Value) -> tuple[int, ...]:
    """A PERMUTE's feature-axis permutation as torch dims (the row axis stays first)."""
    perm = tuple(v.attr["perm"])
    return perm if v.type.domain is Domain.PARAM else (0, *(p + 1 for p in perm))


def _pad(x: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
    shape = list(x.shape)
    parts = []
    for n, part in ((before, None), (None, x), (after, None)):
        if part is not None:
            parts.append(part)
        elif n:
            shape[dim] = n
            parts.append(x.new_zeros(shape))
    return torch.cat(parts, dim)


Impl = Callable[..., torch.Tensor]

# Each implementation takes (value, graph, ctx, *operand tensors).

def _ids_of(idx: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``idx`` where every id is a row of ``table``; torch would wrap a negative one."""
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= table.shape[0]):
        raise ValueError(f"type id out of range: the table has {table.shape[0]} rows, got ids "
                         f"in [{int(idx.min())}, {int(idx.max())}]")
    return idx

IMPLS: dict[Op, Impl] = {
    Op.GATHER_SRC: lambda v, g, c, x: x[g.src],
    Op.GATHER_DST: lambda v, g, c, x: x[g.dst],
    Op.REDUCE: lambda v, g, c, x: _scatter(v.attr["kind"], x, g),
    Op.EDGE_SOFTMAX: lambda v, g, c, x: _edge_softmax(x, g),
    Op.INDEX: lambda v, g, c, table, idx: table[_ids_of(idx, table)],
    Op.NEG: lambda v, g, c, x: -x,
    Op.EXP: lambda v, g, c, x: torch.exp(x),
    Op.LOG: lambda v, g, c, x: torch.log(x),
    Op.RELU: lambda v, g, c, x: torch.relu(x),
    Op.SIGMOID: lambda v, g, c, x: torch.sigmoid(x),
    Op.TANH: lambda v, g, c, x: torch.tanh(x),
    Op.ERF: lambda v, g, c, x: torch.erf(x),
    Op.COS: lambda v, g, c, x: torch.cos(x),
    Op.SIN: lambda v, g, c, x: torch.sin(x),
    Op.LOG1P: lambda v, g, c, x: torch.log1p(x),
    Op.DETACH: lambda v, g, c, x: x.detach(),
    Op.CAST: lambda v, g, c, x: (cast_by_autocast if v.attr.get("autocast") else torch.Tensor.to)(
        x, v.attr["dtype"].to_torch()),
    Op.POW: lambda v, g, c, x: torch.pow(x, v.attr["exponent"]),
    Op.CLAMP_MIN: lambda v, g, c, x: torch.clamp_min(x, v.attr["min"]),
    Op.LEAKY_RELU: lambda v, g, c, x: F.leaky_relu(x, v.attr["slope"]),
    Op.ELU: lambda v, g, c, x: F.elu(x, v.attr["alpha"]),
    Op.SOFTPLUS: lambda v, g, c, x: F.softplus(x, v.attr["beta"], v.attr["threshold"]),
    Op.DROPOUT: lambda v, g, c, x: rng.dropout(x, v.attr["p"], c["seed"], v.attr["key"],
                                               c["training"]),
    Op.ADD: lambda v, g, c, a, b: a + b,
    Op.SUB: lambda v, g, c, a, b: a - b,
    Op.MUL: lambda v, g, c, a, b: a * b,
    Op.DIV: lambda v, g, c, a, b: a / b,
    Op.LINEAR: lambda v, g, c, x, w: x @ w.t(),
    Op.MATMUL: lambda v, g, c, a, b: a @ b,
    Op.TYPED_LINEAR: lambda v, g, c, x, w, idx: torch.bmm(x.unsqueeze(1),
                                                          w[_ids_of(idx, w)]).squeeze(1),
    Op.RESHAPE: lambda v, g, c, x: _reshape(v, x),
    Op.CONCAT: lambda v, g, c, *xs: torch.cat(xs, _graph_axis(v, v.attr["axis"])),
    Op.SUM_AXIS: lambda v, g, c, x: x.sum(_graph_axis(v, v.attr["axis"])),
    Op.MAX_AXIS: lambda v, g, c, x: (x.amax if v.attr["kind"] == "max" else x.amin)(
        _graph_axis(v, v.attr["axis"])),
    Op.SLICE: lambda v, g, c, x: x.narrow(_graph_axis(v, v.attr["axis"]), v.attr["start"],
                                          v.attr["stop"] - v.attr["start"]),
    Op.AGGREGATE: lambda v, g, c, *xs: _scatter(v.attr["kind"], run_region(v.attr["body"], g, c, xs), g),
    Op.SDDMM: lambda v, g, c, *xs: run_region(v.attr["body"], g, c, xs),
    Op.SOFTMAX_AGGREGATE: _softmax_aggregate,
    # ops of backward functions
    Op.SCATTER_SRC: lambda v, g, c, x: _zeros(v, g).index_add(0, g.src, x),
    Op.DST_TO_SRC: lambda v, g, c, x: torch.cat([x, _zeros(v, g)[g.num_dst:]], 0),
    Op.DIV_EDGE_COUNT: lambda v, g, c, x: x / _rowwise(_edge_count(g).to(x.dtype), x),
    Op.SUM_ROWS: lambda v, g, c, x: x.sum(0),
    Op.ROW_OUTER: lambda v, g, c, a, b: (a.reshape(-1, a.shape[-1]).t()
                                         @ b.reshape(-1, b.shape[-1])),
    Op.TYPED_OUTER: lambda v, g, c, x, ct, idx: _zeros(v, g).index_add(
        0, idx, x.unsqueeze(2) * ct.unsqueeze(1)),
    Op.INDEX_ADD: lambda v, g, c, x, idx: _zeros(v, g).index_add(0, idx, x),
    Op.TRANSPOSE: lambda v, g, c, x: x.transpose(-1, -2),
    Op.WHERE_POS: lambda v, g, c, cond, a, b: torch.where(cond > 0, a, b),
    Op.EQ_MASK: lambda v, g, c, a, b: (a == b).to(v.type.dtype.to_torch()),
    Op.EXPAND: lambda v, g, c, x: _expand(v, x),
    Op.PERMUTE: lambda v, g, c, x: x.permute(*_torch_perm(v)),
    Op.PAD: lambda v, g, c, x: _pad(x, _graph_axis(v, v.attr["axis"]), v.attr["before"],
                                    v.attr["after"]),
}


def _leaf(v: Value, g: Graph, inputs: Mapping, params: Mapping) -> torch.Tensor:
    if v.op is Op.CONST:
        return torch.tensor(v.attr["value"], dtype=v.type.dtype.to_torch(), device=g.device)
    name = v.attr["name"]
    if v.op is Op.PARAM:
        return params[name]
    x = inputs[name]
    return x[: g.num_dst] if v.type.domain is Domain.DST else x


def run(fn: Function, g: Graph, inputs: Mapping[str, torch.Tensor],
        params: Mapping[str, torch.Tensor], training: bool = False,
        seed: int | None = None) -> dict[str, torch.Tensor]:
    """Evaluate ``fn`` on ``g``; returns the named outputs.

    ``seed`` fixes the dropout masks of a training call (``sarc.ir.rng``); when it
    is None one is drawn from torch's RNG, where ``fn`` has a dropout.
    """
    env: list[torch.Tensor] = []
    seed = rng.call_seed(rng.draws_masks(fn), training, seed)
    ctx = {"training": training, "seed": seed}
    for v in fn.values:
        if v.op in (Op.INPUT, Op.PARAM, Op.CONST):
            env.append(_leaf(v, g, inputs, params))
        else:
            env.append(IMPLS[v.op](v, g, ctx, *(env[j] for j in v.inputs)))
    return {name: env[i] for name, i in fn.outputs}


def run_backward(bwd: Function, g: Graph, inputs: Mapping[str, torch.Tensor],
                 params: Mapping[str, torch.Tensor], cotangents: Mapping[str, torch.Tensor],
                 training: bool = False, seed: int | None = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Evaluate a backward function (``sarc.ir.autodiff.grad``).

    ``inputs`` and ``params`` are the forward call's, ``cotangents`` maps each
    forward output's name to its cotangent (``N_dst`` rows); ``seed`` must be the
    forward call's when dropout is active. Returns the gradients of the params and
    of the inputs, by name (leaves without a path to an output are absent).
    """
    if bwd.role != "backward":
        raise ValueError(f"{bwd.name} is a {bwd.role}, not a backward function")
    feeds = {**inputs, **{GRAD_PREFIX + k: v for k, v in cotangents.items()}}
    out = run(bwd, g, feeds, params, training, seed)
    param_grads, input_grads = {}, {}
    for name, i in bwd.outputs:
        side = param_grads if bwd.values[i].type.domain is Domain.PARAM else input_grads
        side[name[len(GRAD_PREFIX):]] = out[name]
    return param_grads, input_grads

