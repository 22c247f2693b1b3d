"""DGL convs of K rounds of message passing (SGConv, TAGConv, APPNPConv with k > 1) as K
sarc layers.

A sarc layer is one round (one exchange on P workers, one block of a mini-batch step), and
the DGL front end traces a module's ``forward`` into one layer, so a module that sends what
an ``update_all`` computed is refused there. These three stock convs are converted instead:
``DGLRounds`` holds the module (whose parameters these are) and K ``DegreeNormRound``
layers, each DGL's round ``d_v * sum_u s_u h_u`` with ``s`` and ``d`` the degrees^-1/2 the
module scales by (in-degrees at both ends for SGConv and TAGConv, out-degrees at the
sources and in-degrees at the destinations for APPNPConv, whose ``edge_drop`` is a dropout
of each round's edge weights), and runs the module's own arithmetic between rounds (SGConv's
``norm`` and ``fc``, TAGConv's ``lin`` of the stacked hops and ``activation``, APPNPConv's
teleport to ``feat``) as torch code on the node rows, reading the module's attributes at
each call. An earlier round's value is cut to a later round's rows (``_rows``), as for PyG
(``sarc.frontends.pyg_rounds``): every row on a whole graph.

Not converted: an ``edge_weight`` argument (DGL normalizes it with ``EdgeWeightNorm``, a
weighted degree per node), SGConv's ``cached=True``.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import dsl
from ..dsl import Layer
from ..errors import DSLError, GraphError
from ..trace import user_loc
from . import follow_mode
from .rounds import later_rows


class DegreeNormRound(Layer):
    """One round: ``dst_scale_v * sum_u src_scale_u * w_uv * h_u``, the scales the node's
    degree^-1/2 (``src_degree`` / ``dst_degree``: ``in_degree`` or ``out_degree``, clamped
    at 1, as DGL), ``w`` ``edge_drop`` of ones (the module's own ``nn.Dropout``, so a
    probability set on it later is the next call's)."""

    def __init__(self, width: int, src_degree: str, dst_degree: str, edge_drop: nn.Module,
                 owner: str):
        super().__init__(node={"h": width})
        self.src_degree, self.dst_degree, self.owner = src_degree, dst_degree, owner
        self.edge_drop = edge_drop

    def display_name(self) -> str:
        return f"{self.owner} (a round)"

    def message(self, src, dst, edge):
        h = src.h * getattr(src, self.src_degree).clamp_min(1).pow(-0.5).unsqueeze(-1)
        if self.edge_drop.p > 0:
            h = h * self.edge_drop(torch.ones(h.shape[0], 1))
        return h

    def reduce(self, msg):
        return dsl.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg * getattr(dst, self.dst_degree).clamp_min(1).pow(-0.5).unsqueeze(-1)


class DGLRounds(nn.Module):
    """A K-round DGL conv: ``rounds`` sarc layers and the module (``module``) combining them;
    called as the module is, ``rounds(g, feat)`` on a ``sarc.Graph`` or a worker's
    ``DistGraph``."""

    _sarc_converted = True  # ``module`` runs through ``rounds``, never routed by itself

    def __init__(self, module: nn.Module, width: int, src_degree: str, dst_degree: str,
                 edge_drop: nn.Module | None = None):
        super().__init__()
        self.module, self.width = module, width
        drop = edge_drop if edge_drop is not None else nn.Dropout(0.0)
        self.rounds = nn.ModuleList(DegreeNormRound(width, src_degree, dst_degree, drop,
                                                    type(module).__name__)
                                    for _ in range(module._k))
        self.train(module.training)

    @property
    def module_name(self) -> str:
        return type(self.module).__name__

    def combine(self, feat: torch.Tensor, propagate) -> torch.Tensor:
        """The module's forward after its normalization, ``propagate(h)`` its rounds."""
        raise NotImplementedError

    def forward(self, g, feat, edge_weight=None):
        name = self.module_name
        follow_mode(self, self.module)
        if edge_weight is not None:
            raise GraphError(f"{name} with k={self.module._k}: an edge_weight argument is not "
                             f"supported (DGL normalizes it with EdgeWeightNorm, a weighted "
                             f"degree per node); call it without, or with k=1")
        if self.module._k != len(self.rounds):
            raise GraphError(f"{name}: it was converted for {len(self.rounds)} rounds and now "
                             f"has k={self.module._k}; convert it again (from_dgl_module)")
        if not isinstance(feat, torch.Tensor) or feat.dim() != 2 or feat.shape[1] != self.width:
            shape = list(feat.shape) if isinstance(feat, torch.Tensor) else type(feat).__name__
            raise GraphError(f"{name}: feat must be [nodes, {self.width}], got {shape}")
        if not getattr(self.module, "_allow_zero_in_degree", True):
            from .dgl import refuse_zero_in_degree
            refuse_zero_in_degree(name, g)
        calls = iter(self.rounds)
        return self.combine(feat, lambda h: next(calls)(g, h))


class SGConvRounds(DGLRounds):
    """SGConv: ``fc(norm(A^k feat))``, ``A = D^-1/2 A D^-1/2`` over in-degrees."""

    def __init__(self, module, width):
        if module._cached:
            raise DSLError("SGConv: cached=True is not supported (DGL reuses its first call's "
                           "propagated features)", user_loc())
        super().__init__(module, width, "in_degree", "in_degree")

    def combine(self, feat, propagate):
        for _ in self.rounds:
            feat = propagate(feat)
        if self.module.norm is not None:
            feat = self.module.norm(feat)
        return self.module.fc(feat)


class TAGConvRounds(DGLRounds):
    """TAGConv: ``activation(lin([feat, A feat, ..., A^k feat]))``, ``A`` as SGConv's."""

    def __init__(self, module, width):
        super().__init__(module, width, "in_degree", "in_degree")

    def combine(self, feat, propagate):
        stack = [feat]
        for _ in self.rounds:
            stack.append(propagate(stack[-1]))
        last = stack[-1]
        out = self.module.lin(torch.cat([later_rows(h, last) for h in stack], dim=-1))
        act = self.module._activation
        return out if act is None else act(out)


class APPNPConvRounds(DGLRounds):
    """APPNPConv: ``h <- (1 - alpha) A h + alpha feat``, k times, ``A = D_in^-1/2 A
    D_out^-1/2``, each round's edges dropped with ``edge_drop``'s probability."""

    def __init__(self, module, width):
        super().__init__(module, width, "out_degree", "in_degree", module.edge_drop)

    def combine(self, feat, propagate):
        alpha, h = self.module._alpha, feat
        for _ in self.rounds:
            h = propagate(h)
            h = (1 - alpha) * h + alpha * later_rows(feat, h)
        return h


def round_count(module: nn.Module) -> int:
    """The sarc layers ``module`` runs as: ``k`` for a stock K-round conv with k > 1
    (``rounds_of``), else one."""
    from dgl.nn.pytorch import APPNPConv, SGConv, TAGConv
    return module._k if type(module) in (SGConv, TAGConv, APPNPConv) and module._k > 1 else 1


def rounds_of(module: nn.Module, node: dict, edge: dict) -> DGLRounds | None:
    """The ``DGLRounds`` of a stock K-round conv with k > 1 (``from_dgl_module``'s ``node``
    declaring its ``feat`` width), None for another module."""
    from dgl.nn.pytorch import APPNPConv, SGConv, TAGConv
    make = next((m for cls, m in ((SGConv, SGConvRounds), (TAGConv, TAGConvRounds),
                                  (APPNPConv, APPNPConvRounds)) if type(module) is cls), None)
    if make is None or module._k <= 1:
        return None
    name = type(module).__name__
    if set(node) != {"feat"} or not isinstance(node["feat"], int):
        raise DSLError(f"{name} with k={module._k}: declare its input as node={{'feat': "
                       f"width}} (an int)", user_loc())
    if edge:
        raise DSLError(f"{name} with k={module._k}: edge features ({', '.join(edge)}) are not "
                       f"supported (DGL normalizes an edge_weight with EdgeWeightNorm, a "
                       f"weighted degree per node)", user_loc())
    return make(module, node["feat"])


__all__ = ["DGLRounds", "DegreeNormRound", "round_count", "SGConvRounds", "TAGConvRounds", "APPNPConvRounds"]
