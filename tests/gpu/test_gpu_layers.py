"""Every layer of the model zoo on the Triton backend, compiled for the GPU, equals the
PyTorch backend on the same GPU in float32: outputs and every gradient, to the tolerance of
the interpreter's tests (tests/backends/triton)."""
from __future__ import annotations

import functools

import pytest
import torch
from gpu_check import CUDA, compare, graph, needs_gpu, on_gpu
from zoo import LAYERS, features

import sarc

pytestmark = [pytest.mark.gpu, needs_gpu]

D = 24


def _mixed(num_nodes: int = 3000, seed: int = 5) -> sarc.Graph:
    """Power-law in-degrees; node 0 a hub of 2500 in-edges (split into segments: more than
    SPLIT_EDGES), node 1 a hub of 1500 out-edges, repeated edges, and the last 50 nodes
    without in-edges (25 of them without any edge)."""
    gen = torch.Generator().manual_seed(seed)
    body = num_nodes - 50
    w = 1.0 / torch.arange(1, body + 1, dtype=torch.float64) ** 1.1
    dst = torch.multinomial(w, 8 * num_nodes, replacement=True, generator=gen)
    src = torch.randint(0, num_nodes - 25, (8 * num_nodes,), generator=gen)
    hub_in_src = torch.randint(0, num_nodes - 25, (2500,), generator=gen)
    hub_out_dst = torch.randint(0, body, (1500,), generator=gen)
    repeated = torch.tensor([7, 7, 7, 8, 8])
    src = torch.cat([src, hub_in_src, torch.ones(1500, dtype=torch.long), repeated])
    dst = torch.cat([dst, torch.zeros(2500, dtype=torch.long), hub_out_dst, repeated + 1])
    return graph(src, dst, num_nodes)


@functools.lru_cache(maxsize=None)
def _graphs() -> dict[str, sarc.Graph]:
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, 300, (2000,), generator=gen), torch.randint(0, 100, (2000,), generator=gen)
    return {
        "mixed": _mixed(),
        # a block: 300 source nodes, the first 100 of them destinations
        "block": sarc.Graph.from_edges(src, dst, num_src=300, num_dst=100).to(CUDA),
        "no_edges": graph(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 5),
    }


@pytest.mark.parametrize("graph_name", ["mixed", "block", "no_edges"])
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_zoo_layer_on_gpu_equals_the_torch_backend(model, graph_name):
    g = _graphs()[graph_name]
    layer = LAYERS[model](D).to(CUDA)
    compare(layer, g, on_gpu(features(layer, g, D)))



@pytest.mark.parametrize("fill,shift", [(-1e9, 0.0), (-30.0, 1e5)], ids=["masked", "shifted"])
def test_attention_of_scores_far_from_zero_on_gpu(fill, shift):
    """Masked (-1e9) and shifted (1e5) scores, rows of several edges all masked among them:
    the gradient kernels weigh each edge as the forward did (``triton_grad``: the row's max
    and sum kept apart), on the hub's split rows too."""
    from attention_layers import MaskedAttention, masked_attention_feats
    g = _graphs()["mixed"]
    compare(MaskedAttention(4, fill, shift).to(CUDA), g, on_gpu(masked_attention_feats(g)))
