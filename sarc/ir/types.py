"""Types of IR values: a domain, a dtype and a shape.

Every value of a layer lives in one *domain*:

- ``src``   one row per source node   (rows = N_src)
- ``dst``   one row per destination node (rows = N_dst)
- ``edge``  one row per edge          (rows = E)
- ``param`` global, no row axis (learnable parameters, constants)

Graph sizes are symbolic (sympy symbols ``N_src``, ``N_dst``, ``E``) so that the
same IR describes every graph, every shard and every mini-batch block; feature
sizes are concrete integers.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import sympy

N_SRC = sympy.Symbol("N_src", integer=True, nonnegative=True)
N_DST = sympy.Symbol("N_dst", integer=True, nonnegative=True)
E = sympy.Symbol("E", integer=True, nonnegative=True)


class Domain(enum.Enum):
    SRC = "src"
    DST = "dst"
    EDGE = "edge"
    PARAM = "param"

    @property
    def rows(self) -> sympy.Expr | None:
        """The symbolic row count of the domain, None for ``param``."""
        return _ROWS[self]

    @property
    def article(self) -> str:
        """The domain's name with its article, for messages: "an edge", "a dst"."""
        return ("an " if self is Domain.EDGE else "a ") + self.value

    @property
    def is_node(self) -> bool:
        return self in (Domain.SRC, Domain.DST)


_ROWS = {Domain.SRC: N_SRC, Domain.DST: N_DST, Domain.EDGE: E, Domain.PARAM: None}


class DType(enum.Enum):
    """Element types. Floating values are differentiable; int64 values index."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F64 = "f64"
    I64 = "i64"

    @property
    def is_float(self) -> bool:
        return self is not DType.I64

    def to_torch(self):
        import torch

        return _TORCH[self](torch)

    @staticmethod
    def from_torch(dtype) -> "DType":
        import torch

        for d, get in _TORCH.items():
            if get(torch) == dtype:
                return d
        raise TypeError(f"sarc has no IR dtype for torch dtype {dtype}")


_TORCH = {
    DType.F32: lambda t: t.float32,
    DType.F16: lambda t: t.float16,
    DType.BF16: lambda t: t.bfloat16,
    DType.F64: lambda t: t.float64,
    DType.I64: lambda t: t.int64,
}


@dataclass(frozen=True)
class TensorType:
    """Type of one SSA value: domain, dtype and the per-row feature shape.

    ``feat`` excludes the row axis of graph domains; for ``param`` values it is
    the whole shape.
    """

    domain: Domain
    dtype: DType
    feat: tuple[int, ...]

    @property
    def shape(self) -> tuple:
        """Full shape, the row axis symbolic."""
        rows = self.domain.rows
        return self.feat if rows is None else (rows, *self.feat)

    def numel_expr(self) -> sympy.Expr:
        """Number of elements as a sympy expression of the graph sizes."""
        n = sympy.Integer(1)
        for d in self.shape:
            n = n * d
        return n

    def with_(self, *, domain: Domain | None = None, dtype: DType | None = None,
              feat: tuple[int, ...] | None = None) -> "TensorType":
        return TensorType(domain or self.domain, dtype or self.dtype,
                          self.feat if feat is None else tuple(feat))

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.domain.value} {self.dtype.value}[{dims}]"
