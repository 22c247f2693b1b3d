"""Messages singular at a node no edge reads: finite gradients, torch's per-edge ones.

Node 3 has no out-edges and node 4 no in-edges, and node 3's features are 0: a message
that divides by ``src.out_degree``, takes ``sqrt`` of ``src.h`` or divides by
``dst.out_degree`` is finite on every edge, as torch computes it per edge. Computed once
per node (``pushdown``) it was infinite at the unread rows, and the 0 gradient there
became NaN, through the linear before it in every weight's gradient.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import sarc
from difftest import BACKENDS, assert_close

SRC = torch.tensor([0, 1, 2, 0, 4, 1])
DST = torch.tensor([1, 2, 0, 2, 0, 0])
N = 5   # node 3: no edges at all; node 4: out-edges only

MESSAGES = {
    "rsqrt-out-degree": lambda s, src, dst: s.lin(src.h) * src.out_degree.rsqrt().unsqueeze(-1),
    "divide-by-out-degree": lambda s, src, dst: s.lin(src.h) / src.out_degree.unsqueeze(-1),
    "sqrt-of-feature": lambda s, src, dst: s.lin(src.h.abs().sqrt()),
    "log-of-feature": lambda s, src, dst: s.lin(src.h.abs().log().clamp_min(-5.0)),
    "pow-of-feature": lambda s, src, dst: s.lin(src.h.abs() ** 0.75),
    "divide-by-dst": lambda s, src, dst: s.lin(src.h) + s.lin(dst.h) / dst.out_degree.unsqueeze(-1),
}


class Singular(sarc.Layer):
    def __init__(self, fn):
        super().__init__(node={"h": 3})
        self.fn = fn
        self.lin = nn.Linear(3, 2)

    def message(self, src, dst, edge):
        return self.fn(self, src, dst)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def _per_edge(layer, x):
    """The message as torch computes it: on each edge's rows, never on the others."""
    class Ends:
        def __init__(self, rows):
            self.h = x[rows]
            self.out_degree = torch.bincount(SRC, minlength=N).to(x.dtype)[rows]
    m = layer.fn(layer, Ends(SRC), Ends(DST))
    return torch.zeros(N, m.shape[1], dtype=m.dtype).index_add(0, DST, m)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_a_message_singular_at_unread_rows_has_torchs_gradient(name, backend):
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(SRC, DST, N)
    layer = Singular(MESSAGES[name]).double().set_backend(backend)
    x = torch.randn(N, 3, dtype=torch.float64)
    x[3] = 0.0
    cot = torch.randn(N, 2, dtype=torch.float64)
    got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = layer(g, got_x)
    grads = torch.autograd.grad((got * cot).sum(), [got_x, *layer.parameters()])
    want = _per_edge(layer, want_x)
    wants = torch.autograd.grad((want * cot).sum(), [want_x, *layer.parameters()])
    assert_close(got, want, what="output")
    for k, (a, b) in enumerate(zip(grads, wants)):
        assert torch.isfinite(a).all(), f"gradient {k} is not finite: {a}"
        assert_close(a, b, what=f"gradient {k}")
