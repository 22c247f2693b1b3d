"""The Triton backend's lowering of a distributed schedule's edge part.

The edge part (``sarc.ir.split``) is an IR function whose outputs are the
layer's aggregates on one source block. Its graph ops get the Triton backend's kernels
(``triton_backend.plan_op``) and run as ``ops[n](g, ...)``, as in a layer module: sum and
mean aggregates (the block's partial; the surrogate ``sum(agg * cot)`` differentiates
through the op's gradient kernels), sddmm, gathers, typed_linear, unfused sum reduces.
The max / min aggregates and reduces hand their op to the block ops of ``triton_blocks``
(partials and select surrogates on its kernels), the softmax aggregates their op with its
statistics in float64 (the distributed softmax's: each row's max, sum and weighted sum),
its score and value computed in the layer's dtype, as on one process. The rest follows the backend's
no-silent-fallback rule: an op the backend cannot lower, and every block op without a
Triton kernel (``triton_blocks.FALLBACKS``), runs on the torch backend's kernels, with a
warning naming the op and the reason, listed in ``fallbacks``; under
``SARC_TRITON_STRICT=1`` the error is raised.
"""
from __future__ import annotations

from ..ir.function import Function, Value
from ..ir.ops import Op
from ..ir.types import DType
from . import torch_backend, triton_blocks
from .codegen import RegionNames
from .triton_backend import (KERNEL_OPS, fallback, load_ops, plan_op, plan_softmax_site,
                             strict_default)
from .triton_lower import TritonLoweringError


class EdgeLowering:
    """``registry.EdgeLowering`` for the Triton backend (see the module doc)."""

    def __init__(self, edge: Function, layer: str, strict: bool | None = None):
        self.edge, self.layer = edge, layer
        self.strict = strict_default() if strict is None else strict
        self.fallbacks: list[str] = []
        self.op_lines: list[str] = []
        self._index: dict[tuple[int, bool], int | None] = {}  # value -> its op's place in ops
        self._specs: list = []
        self._kernels: list = []
        self._reported: set[tuple[str, int]] = set()

    def _op(self, i: int, how: str = "") -> int | None:
        """The position of value ``i``'s op in ``ops`` (planned once), or None: it falls
        back to the torch backend. ``how``: "" (the op itself), "stats" (the op with its
        statistics and output in ``STATS``, float64, as the distributed softmax's are, its
        regions in the layer's dtype) or "site" (an unfused edge_softmax's block kernels)."""
        key = (i, how)
        if key not in self._index:
            v = self.edge.values[i]
            try:
                plan, spec = (plan_softmax_site(self.edge, i) if how == "site" else
                              plan_op(self.edge, i, {},
                                      acc="tl.float64" if how == "stats" else None))
            except TritonLoweringError as e:
                fallback(self.layer, i, v, e, self.strict, self.fallbacks)
                self._index[key] = None
            else:
                self._index[key] = len(self._specs)
                said = {"stats": " in float64", "site": " (block ops)"}.get(how, "")
                self.op_lines.append(f"ops[{len(self._specs)}]: %{i} {v.op.value}{said} -> "
                                     "kernels " + ", ".join(k.name for k in plan.kernels))
                self._specs.append((i, spec, DType.F64 if how == "stats" else v.type.dtype))
                self._kernels.extend(plan.kernels)
        return self._index[key]

    def lower(self, i: int, v: Value, regions: RegionNames, operands: list[str]) -> str:
        if v.op in KERNEL_OPS and v.op is not Op.EDGE_SOFTMAX:
            n = self._op(i)
            if n is not None:
                return f"ops[{n}](g, {', '.join(operands)})"
        return torch_backend.LOWERING[v.op](v, regions() + operands)

    def surrogate(self, i: int, v: Value, regions: RegionNames, operands: list[str],
                  cot: str) -> str | None:
        n = self._op(i) if v.op is Op.AGGREGATE else None
        if n is None:
            return None
        return f"ops[{n}].surrogate(g, {cot}, {', '.join(operands)})"

    def block_op(self, name: str, i: int, v: Value,
                 bodies: RegionNames) -> tuple[str, list[str]]:
        why = triton_blocks.FALLBACKS.get(name)
        if why is not None:
            if (name, i) not in self._reported:
                self._reported.add((name, i))
                fallback(self.layer, i, v, TritonLoweringError(f"block op {name}: {why}"),
                         self.strict, self.fallbacks)
            return f"DK.{name}", bodies()
        how = ("site" if v.op is Op.EDGE_SOFTMAX else
               "stats" if v.op is Op.SOFTMAX_AGGREGATE else "")
        n = self._op(i, how)
        if n is None:
            return f"DK.{name}", bodies()
        if v.op is Op.EDGE_SOFTMAX:  # the site's kernels follow the op's torch arguments
            return f"DK.{name}", [f"ops[{n}]"]
        if v.op is Op.SOFTMAX_AGGREGATE:  # the op holds the score (and the value)
            return f"DK.{name}", [f"ops[{n}]", "None"][:len(bodies())]
        return f"DK.{name}", [f"ops[{n}]"]

    def ops(self) -> tuple:
        return load_ops(self.edge, self._specs, self._kernels)
