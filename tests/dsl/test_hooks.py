"""Hooks: one on a layer's own calls acts at each call, as on any module; one on a
submodule's calls is refused, whenever it is registered (the compiled kernels never call
the submodule, so it acted once, in the trace, and stayed in the kernel after its
removal, or, registered after the first call, was ignored)."""
from __future__ import annotations

import pytest
import torch
from gcn import GCNLayer

import sarc
from sarc.errors import DSLError

G = sarc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)


def _double(module, inputs, output):
    return output * 2


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward"])
def test_a_hook_on_a_submodule_is_refused_before_and_after_the_first_call(kind):
    hook = {"forward": _double, "forward_pre": lambda m, i: None,
            "full_backward": lambda m, gi, go: None}[kind]
    x = torch.randn(3, 4)
    layer = GCNLayer(4, 2)
    handle = getattr(layer.lin, f"register_{kind}_hook")(hook)
    with pytest.raises(DSLError, match=f"submodule 'lin' \\(Linear\\) of layer GCNLayer has a "
                                       f"hook registered with register_{kind}"):
        layer(G, x)
    handle.remove()
    plain = layer(G, x)
    handle = getattr(layer.lin, f"register_{kind}_hook")(hook)   # after a call: not ignored
    with pytest.raises(DSLError, match="submodule 'lin'"):
        layer(G, x)
    handle.remove()
    assert torch.equal(layer(G, x), plain)


def test_a_hook_on_the_layer_itself_acts_at_each_call():
    x = torch.randn(3, 4)
    layer = GCNLayer(4, 2)
    plain = layer(G, x)
    handle = layer.register_forward_hook(_double)
    assert torch.equal(layer(G, x), plain * 2)
    handle.remove()
    assert torch.equal(layer(G, x), plain)
