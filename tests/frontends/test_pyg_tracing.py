"""A traced PyG conv (``TracedConv``) computes what the conv computes, or is refused.

The conv's ``forward`` runs on stand-ins: ``x`` (and the edge feature, the conv's
parameters and every value computed from them) are ``isinstance(..., Tensor)`` as PyG's
code expects, and ``edge_index`` is a tensor whose only use is being passed to
``propagate``. So a forward that prepares the graph under ``if isinstance(edge_index,
Tensor)`` (self loops, ``gcn_norm``) is refused instead of silently skipped, and PyG's
``if isinstance(x, Tensor): x = (x, x)`` runs. Each conv that imports is compared with
PyG's own: output, the gradient of x, of every parameter and of the edge features.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("torch_geometric")
from torch_geometric.nn import MessagePassing  # noqa: E402

from interop.interop_check import assert_all_close  # noqa: E402
from sarc.frontends.pyg import as_conv, from_message_passing  # noqa: E402

N, D = 7, 3


def graph() -> torch.Tensor:
    """Duplicates, a self loop, a node without in-edges (6) and one without any (5)."""
    return torch.tensor([[0, 1, 2, 3, 0, 4, 4, 2, 6], [1, 2, 3, 0, 2, 1, 1, 2, 0]])


def randomize_zeros(conv) -> None:
    with torch.no_grad():
        for p in conv.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape) * 0.5)


def check_same(run_sarc, run_pyg, conv, x, edge=None) -> None:
    """Outputs and gradients (x, parameters, edge features) of the two runs agree."""
    params = dict(conv.named_parameters())
    upstream = torch.randn(run_pyg(x, *([] if edge is None else [edge])).shape)

    def grads(run):
        xs = x.clone().requires_grad_(True)
        args = [xs]
        if edge is not None:
            args.append(edge.clone().requires_grad_(edge.is_floating_point()))
        for p in params.values():
            p.grad = None
        out = run(*args)
        (out * upstream).sum().backward()
        got = {k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
               for k, p in params.items()}
        if edge is not None and edge.is_floating_point():
            got["<edge>"] = args[1].grad
        return out.detach(), xs.grad, got

    out_s, xg_s, g_s = grads(run_sarc)
    out_p, xg_p, g_p = grads(run_pyg)
    assert set(g_s) == set(g_p)
    assert_all_close([("output", out_s, out_p), ("grad of x", xg_s, xg_p)]
                     + [(f"grad of {k}", g_s[k], g_p[k]) for k in g_p])


def check_both_paths(conv, edge=None, **options) -> None:
    """from_message_passing(...).run and as_conv(...) both equal the conv."""
    ei = graph()
    layer = from_message_passing(conv, **options)
    wrapped = as_conv(conv, **options)
    extra = [] if edge is None else [edge]
    for run in (lambda x, *e: layer.run(x, ei, *e), lambda x, *e: wrapped(x, ei, *e)):
        check_same(run, lambda x, *e: conv(x, ei, *e), conv, torch.randn(N, D), *extra)


# --- 3. the aggregation is PyG's aggr_module, not the aggr attribute -------------------------------

class Sum(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin = nn.Linear(D, 2)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))


def test_aggr_set_after_construction_is_what_pyg_uses():
    conv = Sum()
    conv.aggr = "mean"   # PyG keeps summing with aggr_module
    check_both_paths(conv)
