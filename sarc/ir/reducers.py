"""The reducers: what each reduction over a destination's edges means, in one place.

A reducer is data (``Reducer``), in the manner of DGL's builtin reducer descriptors:
its name, the value a row without edges gets, whether it commutes with a linear map
(passes move a linear over it), whether it selects (the gradient goes to the edges
attaining the extremum, split evenly over ties), whether it divides by the degree,
how two partial results combine and how partials of several edge blocks merge. The
small math every backend shares is here too: ``finalize`` (the interpreter and the
PyTorch kernels call it), ``combine`` and ``beats`` (the distributed merges: softmax's
online rescaling, the extrema's comparison), the Triton accumulator's start value
(``unit``) and ``tie_share`` (the one rule for splitting a selecting reducer's gradient; the Triton
runtime and the distributed merges call it with counts their kernels made).

Each backend implements the reducers in one table keyed by name:
``sarc.ir.interpreter.ROW_REDUCE``, ``sarc.backends.torch_ops.SEGMENT_REDUCE``,
``sarc.backends.triton_source.ROW_REDUCE`` and ``triton_grad.EXTRAS``,
``sarc.distributed.merge.MERGES``, ``sarc.planner.cost.SAVED_BY_REDUCER`` and
``sarc.ir.autodiff.REDUCE_VJPS``. Adding a reducer is one entry in ``REDUCERS`` and
one per table; tests/ir/test_reducer_table.py names a table that lacks one.

``softmax`` is the reducer of a fused ``softmax_aggregate``
(``y[v] = sum_e softmax_v(score)(e) * value(e)``): it has a score as well as a
value, so it is not a kind of ``REDUCE`` / ``AGGREGATE`` (``node_level`` False).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

NEG_INF = float("-inf")

Tensor = torch.Tensor
RowSum = Callable[[Tensor], Tensor]
AtEdges = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Reducer:
    """One reduction over the edges into each destination."""

    name: str
    unit: float
    """The combine's identity: what an accumulator starts at, and what pads a row."""
    linear: bool
    """Commutes with a linear map of the edge values (``f(xW) = f(x) W``)."""
    selects: bool
    """Picks one edge value: the gradient goes to the edges attaining it (``tie_shares``)."""
    by_degree: bool
    """Divides a sum by the row's in-degree (at least 1)."""
    node_level: bool
    """A kind of ``REDUCE`` / ``AGGREGATE`` (softmax is only a fused softmax_aggregate)."""
    combine: Callable
    """Two partial results of the same rows -> one (for softmax: ``(m, s, acc...)`` tuples)."""
    vjp: str
    """The gradient of an edge value given the output's cotangent ``g``."""
    merge: str
    """How the partials of several edge blocks of a row merge."""
    beats: Callable | None = None
    """Selecting reducers: where an edge value strictly beats another (``torch.gt`` for max)."""
    empty: float = 0.0
    """The value of a row without edges (DGL's and PyG's: 0 for every reducer)."""

    def finalize(self, acc: Tensor, degree: Tensor) -> Tensor:
        """The reduction of each row from its combined accumulator (rows of ``acc``) and
        its in-degree: mean divides, a selecting reducer puts ``empty`` on empty rows.
        softmax's accumulator is a tuple ``(m, s, acc)`` that finishes as ``acc / s``
        (``sarc.distributed.merge.SoftmaxMerge``), not through this."""
        if not self.node_level:
            raise ValueError(f"reducer {self.name!r} finishes its (m, s, acc) partials itself")
        if self.by_degree:
            return acc / _rowwise(degree.clamp(min=1).to(acc.dtype), acc)
        if self.selects:
            return torch.where(_rowwise(degree > 0, acc), acc,
                               torch.full((), self.empty, dtype=acc.dtype, device=acc.device))
        return acc


def _rowwise(per_row: Tensor, like: Tensor) -> Tensor:
    return per_row.reshape(per_row.shape[0], *([1] * (like.dim() - 1)))


def _expand(a: Tensor, like: Tensor) -> Tensor:
    return a.reshape(*a.shape, *([1] * (like.dim() - a.dim())))


def rescale(m: Tensor, new_m: Tensor, dtype: torch.dtype) -> Tensor:
    """``exp(m - new_m)`` in ``dtype``, 0 where ``m`` is -inf (no edges there yet)."""
    return torch.where(m == NEG_INF, torch.zeros((), dtype=dtype),
                       torch.exp(m.to(dtype) - new_m.to(dtype)))


def softmax_combine(a: tuple, b: tuple) -> tuple:
    """Two online-softmax partials ``(m, s, acc...)`` -> one: the running max ``m``, the
    normalizer ``s`` and each weighted sum ``acc`` rescaled to ``max(m_a, m_b)``
    (FlashAttention's rescaling; ``s`` and ``acc`` in ``s``'s dtype)."""
    (m1, s1, *acc1), (m2, s2, *acc2) = a, b
    m = torch.maximum(m1, m2)
    x1, x2 = rescale(m1, m, s2.dtype), rescale(m2, m, s2.dtype)
    return (m, s1 * x1 + s2 * x2,
            *(p * _expand(x1, p) + q * _expand(x2, q) for p, q in zip(acc1, acc2)))


def tie_share(g: Tensor, count: Tensor) -> Tensor:
    """What each of the ``count`` edges attaining a row's extremum gets of the row's
    cotangent ``g``: ``g / count`` (a row without edges passes nothing on)."""
    return g / count.clamp(min=1)


def tie_shares(tie: Tensor, g: Tensor, row_sum: RowSum, at_edges: AtEdges) -> Tensor:
    """A selecting reducer's gradient: each edge attaining its row's extremum (``tie``,
    1.0 / 0.0 per edge) gets ``tie_share`` of its row's ``g``."""
    return tie * at_edges(tie_share(g, row_sum(tie)))


SUM = Reducer(
    "sum", unit=0.0, linear=True, selects=False, by_degree=False, node_level=True,
    combine=torch.add, vjp="g at each edge", merge="add the blocks' sums")
MEAN = Reducer(
    "mean", unit=0.0, linear=True, selects=False, by_degree=True, node_level=True,
    combine=torch.add, vjp="g / max(1, in-degree) at each edge",
    merge="add the blocks' sums, divide by the whole graph's in-degree")
MAX = Reducer(
    "max", unit=NEG_INF, linear=False, selects=True, by_degree=False, node_level=True,
    combine=torch.maximum, beats=torch.gt, vjp="g / C at each of the C edges attaining the max, 0 elsewhere",
    merge="keep the larger extremum over blocks with edges, adding tie counts on equality")
MIN = Reducer(
    "min", unit=math.inf, linear=False, selects=True, by_degree=False, node_level=True,
    combine=torch.minimum, beats=torch.lt, vjp="g / C at each of the C edges attaining the min, 0 elsewhere",
    merge="keep the smaller extremum over blocks with edges, adding tie counts on equality")
SOFTMAX = Reducer(
    "softmax", unit=NEG_INF, linear=False, selects=False, by_degree=False, node_level=False,
    combine=softmax_combine,
    vjp="dvalue = a g; dscore = a (<g, value> - <g, y>), projected so each row sums to 0 "
        "(sarc.ir.softmax)",
    merge="online: running max M, normalizer S and weighted sum rescaled block by block; "
          "y = acc / S")

REDUCERS: dict[str, Reducer] = {r.name: r for r in (SUM, MEAN, MAX, MIN, SOFTMAX)}

REDUCE_KINDS: tuple[str, ...] = tuple(n for n, r in REDUCERS.items() if r.node_level)
"""The kinds of ``REDUCE`` / ``AGGREGATE``."""


def reducer(kind: str) -> Reducer:
    """The reducer named ``kind``; an unknown name is an error that lists the known ones."""
    try:
        return REDUCERS[kind]
    except KeyError:
        raise ValueError(f"unknown reduction {kind!r}; expected one of "
                         f"{', '.join(REDUCERS)}") from None
