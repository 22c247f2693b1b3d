"""PyG convs of K rounds of message passing (SGConv, APPNP, TAGConv, ChebConv) as K sarc layers.

A sarc layer is one round: on P workers one exchange of what its sources send, in a
mini-batch step one block. A conv whose ``forward`` propagates K times is converted into
``PyGRounds``: K round layers (``Propagate``: ``sum_u w_uv x_u``, PyG's ``w_uv * x_j``),
called in turn, and the conv's own arithmetic between them (SGConv's final ``lin``,
APPNP's teleport to ``x``, TAGConv's and ChebConv's linear per hop) as torch code on the
node rows, reading the conv's attributes at each call. The edge weights are those its
``forward`` computes (``gcn_norm``, ChebConv's scaled Laplacian: PyG's own functions),
made when the inputs are prepared (``prepare``), as for the one-round convs.

So a K-round conv in a model needs K blocks of a mini-batch step (K fanouts), and its
rounds run wherever a sarc layer runs: a ``Graph``, a worker's ``DistGraph``, a step's
blocks. In a step each round's output has the rows of the next block's sources, which
are the first rows of the round's input (a block's destinations are its first sources):
a term of an earlier round is cut to the rows of the later one (``rounds.later_rows``),
which on a whole graph is every row.
"""
from __future__ import annotations

import torch
from torch import nn

from ..dsl import Layer
from ..errors import GraphError
from .pyg import (ConversionError, PyGInputs, _REDUCERS, _aggr_name, _check_message_passing,
                  _in_channels, _plain_edge_index, _refuse, _require, check_not_hooked,
                  oriented, weighted_inputs, weights_dtype)
from . import follow_mode
from .rounds import later_rows


class Propagate(Layer):
    """One round of a K-round conv: ``aggr_u w_uv x_u`` over the prepared graph."""

    def __init__(self, width: int, aggr: str, owner: str = "Propagate"):
        super().__init__(node={"x": width}, edge={"edge_weight": ()})
        self.aggr, self.owner = aggr, owner

    def display_name(self) -> str:
        return f"{self.owner} (a round)"

    def message(self, src, dst, edge):
        return edge.edge_weight.unsqueeze(-1) * src.x

    def reduce(self, msg):
        return _REDUCERS[self.aggr](msg.m)

    def update(self, dst, agg):
        return agg.agg


class PyGRounds(nn.Module):
    """A K-round PyG conv: ``rounds`` sarc layers and the conv (``conv``, whose parameters
    these are) combining them. As a ``PyGLayer``: ``prepare(edge_index, num_nodes,
    edge_attr[, dtype])`` gives the graph and edge weights, ``self(g, x, edge_weight=...)``
    runs on it, ``run(x, edge_index[, edge_weight])`` equals ``conv(x, edge_index[,
    edge_weight])``."""

    edge_input = "edge_weight"

    def __init__(self, conv: nn.Module, in_channels: int, rounds: int):
        _check_message_passing(conv)
        aggr = _aggr_name(conv)
        super().__init__()
        self.conv, self.in_channels = conv, in_channels
        self.rounds = nn.ModuleList(Propagate(in_channels, aggr, type(conv).__name__)
                                    for _ in range(rounds))
        self.train(conv.training)

    def check(self) -> None:
        """What the conversion refused, refused again at a call (an attribute set since)."""

    def count(self) -> int:
        """How many rounds the conv's attributes ask for now."""
        raise NotImplementedError

    def prepare(self, edge_index, num_nodes: int, edge_attr=None, dtype=None) -> PyGInputs:
        """The graph and edge weights the rounds run on (``PyGLayer.prepare``'s)."""
        return oriented(self.conv, self._prepare(edge_index, num_nodes, edge_attr, dtype))

    def _prepare(self, edge_index, num_nodes: int, edge_attr=None, dtype=None) -> PyGInputs:
        raise NotImplementedError

    def combine(self, x: torch.Tensor, propagate) -> torch.Tensor:
        """The conv's forward after its graph preparation, ``propagate(h)`` its rounds."""
        raise NotImplementedError

    def forward(self, g, x, edge_weight=None):
        name = type(self.conv).__name__
        follow_mode(self, self.conv)
        if self.count() != len(self.rounds):
            raise ConversionError(f"{name}: it was converted for {len(self.rounds)} rounds and "
                                  f"now has {self.count()}; convert it again "
                                  f"(from_message_passing)")
        self.check()
        check_not_hooked(self.conv)
        if edge_weight is None and self.rounds:
            raise GraphError(f"{name}: its rounds read the edge weights its forward computes: "
                             f"give edge_weight=, the prepared inputs' (layer.prepare(edge_index, "
                             f"num_nodes)), or call it through as_conv")
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.in_channels:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise GraphError(f"{name}: x must be [nodes, {self.in_channels}], got {shape}")
        calls = iter(self.rounds)
        return self.combine(x, lambda h: next(calls)(g, x=h, edge_weight=edge_weight))

    def run(self, x, edge_index, edge_attr=None):
        """``conv(x, edge_index[, edge_attr])``, computed by the sarc layers."""
        inputs = self.prepare(_plain_edge_index(self.conv, edge_index), x.size(0), edge_attr,
                              x.dtype)
        return self(inputs.graph(), x, **inputs.edge)

    def _gcn_norm(self, edge_index, num_nodes, w, dtype, add_self_loops: bool) -> PyGInputs:
        from torch_geometric.nn.conv.gcn_conv import gcn_norm
        edge_index, w = gcn_norm(edge_index, w, num_nodes, False, add_self_loops,
                                 self.conv.flow, dtype=weights_dtype(self.conv, dtype))
        return weighted_inputs(self.conv, edge_index, num_nodes, w, dtype)


class SGConvRounds(PyGRounds):
    """SGConv: ``lin(A^K x)``, ``A`` PyG's ``gcn_norm`` (with self loops by default)."""

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv), conv.K)
        self.check()

    def check(self):
        _require(self.conv, not self.conv.cached, "cached=True",
                 "PyG reuses its first call's propagated features")

    def count(self):
        return self.conv.K

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        return self._gcn_norm(edge_index, num_nodes, edge_attr, dtype, self.conv.add_self_loops)

    def combine(self, x, propagate):
        for _ in self.rounds:
            x = propagate(x)
        return self.conv.lin(x)


class APPNPRounds(PyGRounds):
    """APPNP: ``h <- (1 - alpha) A h + alpha x``, K times, ``A`` PyG's ``gcn_norm``
    (``normalize=True``) or the edge weights given. ``cached=True``: ``as_conv`` keeps the
    first call's normalized graph, as PyG does (the normalization, not the features)."""

    def __init__(self, conv, in_channels=None):
        super().__init__(conv, _in_channels(conv, in_channels), conv.K)
        self.check()

    def check(self):
        _require(self.conv, self.conv.dropout == 0, f"dropout={self.conv.dropout}",
                 "PyG drops the edge weights again at each round, so a round's weights carry "
                 "the masks of every round before it; sarc draws each layer's own")

    def count(self):
        return self.conv.K

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        c = self.conv
        if c.normalize:
            return self._gcn_norm(edge_index, num_nodes, edge_attr, dtype, c.add_self_loops)
        return weighted_inputs(c, edge_index, num_nodes, edge_attr, dtype)

    def combine(self, x, propagate):
        alpha, h = self.conv.alpha, x
        for _ in self.rounds:
            x = propagate(x)
            x = x * (1 - alpha)
            x = x + alpha * later_rows(h, x)
        return x


class TAGConvRounds(PyGRounds):
    """TAGConv: ``sum_k lins[k](A^k x) + bias``, ``A`` PyG's ``gcn_norm`` without self loops
    (``normalize=True``) or the edge weights given."""

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv), conv.K)

    def count(self):
        return len(self.conv.lins) - 1

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        c = self.conv
        if c.normalize:
            return self._gcn_norm(edge_index, num_nodes, edge_attr, dtype, False)
        return weighted_inputs(c, edge_index, num_nodes, edge_attr, dtype)

    def combine(self, x, propagate):
        lins = self.conv.lins
        out = lins[0](x)
        for lin in lins[1:]:
            x = propagate(x)
            out = later_rows(out, x) + lin(x)
        return out if self.conv.bias is None else out + self.conv.bias


class ChebConvRounds(PyGRounds):
    """ChebConv: ``sum_k lins[k](T_k)``, ``T_0 = x``, ``T_1 = L x``, ``T_k = 2 L T_{k-1} -
    T_{k-2}``, ``L`` the scaled Laplacian its forward computes (PyG's ``__norm__``: the
    normalized Laplacian over ``lambda_max = 2 max(weight)``, a self loop per node)."""

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv), len(conv.lins) - 1)

    def count(self):
        return len(self.conv.lins) - 1

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        c = self.conv
        edge_index, w = c.__norm__(edge_index, num_nodes, edge_attr, c.normalization,
                                   None, dtype=weights_dtype(c, dtype))
        return weighted_inputs(c, edge_index, num_nodes, w, dtype)

    def combine(self, x, propagate):
        lins = self.conv.lins
        out = lins[0](x)
        if len(lins) > 1:
            t0, t1 = x, propagate(x)
            out = later_rows(out, t1) + lins[1](t1)
            for lin in lins[2:]:
                t2 = propagate(t1)
                t2 = 2. * t2 - later_rows(t0, t2)
                out = later_rows(out, t2) + lin(t2)
                t0, t1 = t1, t2
        return out if self.conv.bias is None else out + self.conv.bias


def rounds_converters(pyg) -> dict:
    """Per K-round stock class (``pyg``: ``torch_geometric.nn``), its converter
    ``convert(conv, in_channels, edge_dim)``; SGConv with ``K=1`` is one sarc layer."""
    from .pyg import SGConvLayer

    def sgconv(conv, in_channels=None, edge_dim=None):
        return SGConvLayer(conv) if conv.K == 1 else SGConvRounds(conv)

    return {pyg.SGConv: sgconv,
            pyg.APPNP: lambda conv, in_channels=None, edge_dim=None: APPNPRounds(conv, in_channels),
            pyg.TAGConv: lambda conv, in_channels=None, edge_dim=None: TAGConvRounds(conv),
            pyg.ChebConv: lambda conv, in_channels=None, edge_dim=None: ChebConvRounds(conv)}


__all__ = ["PyGRounds", "Propagate", "SGConvRounds", "APPNPRounds", "TAGConvRounds",
           "ChebConvRounds"]
