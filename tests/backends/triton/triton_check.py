"""The Triton backend against the PyTorch backend: graphs, layers and the comparison.

``compare`` compiles one layer with both backends and checks the outputs and
the gradients of every parameter and float feature under one random
cotangent. The PyTorch backend is itself tested against the reference
interpreter (tests/backends/test_torch_vs_interpreter.py). Graphs are small:
the kernels run in Triton's interpreter, one Python-level program at a time.
"""
from __future__ import annotations

import copy
from typing import Mapping

import torch
from difftest import CANCEL_FLOOR, assert_close, block, random_block

import sarc


def set_backend(module: torch.nn.Module, backend: str) -> torch.nn.Module:
    for m in module.modules():
        if isinstance(m, sarc.Layer):
            m.set_backend(backend)
    return module


def power_law_block(num_nodes: int = 24, seed: int = 3) -> sarc.Graph:
    """A graph with a hub of in-degree ~n and one of out-degree ~n/2, many degree-1
    nodes and a few empty rows: every degree bucket, split rows in CSR and CSC."""
    gen = torch.Generator().manual_seed(seed)
    w = 1.0 / torch.arange(1, num_nodes + 1, dtype=torch.float64) ** 1.2
    dst = torch.multinomial(w, 3 * num_nodes, replacement=True, generator=gen)
    src = torch.randint(0, num_nodes, (3 * num_nodes,), generator=gen)
    hub_out = torch.full((num_nodes // 2,), 1, dtype=torch.int64)
    src = torch.cat([src, hub_out])
    dst = torch.cat([dst, torch.randint(0, num_nodes, (num_nodes // 2,), generator=gen)])
    keep = dst != num_nodes - 1  # the last node has no in-edges
    return sarc.Graph.from_edges(src[keep], dst[keep], num_nodes)


def graphs() -> dict[str, sarc.Graph]:
    gen = torch.Generator().manual_seed(1)
    return {
        "random": random_block(gen, 9, 9, 30),
        # nodes 0, 4, 5 have no in-edges; 5 has no edges at all
        "zero_in_degree": block([0, 0, 1, 2, 4], [1, 2, 3, 3, 1], 6),
        # the same edge several times: exact ties in max / min
        "multi_edges": block([0, 0, 0, 1, 1, 2, 3, 3], [1, 1, 1, 2, 2, 2, 0, 0], 4),
        "one_node": block([], [], 1),
        "one_node_self_loop": block([0, 0], [0, 0], 1),
        "no_edges": block([], [], 5),
        # a block: 7 source nodes, 3 destination nodes
        "block": block([0, 3, 4, 5, 6, 6, 2, 1, 6], [0, 0, 1, 1, 1, 2, 2, 0, 0], 7, 3),
        "power_law": power_law_block(),
    }


GRAPHS = graphs()


def _fresh(feats: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in feats.items()}


def _outputs(out, layer) -> dict[str, torch.Tensor]:
    return dict(out) if isinstance(out, Mapping) else {"h": out}


def run(layer: torch.nn.Module, g: sarc.Graph, feats: Mapping[str, torch.Tensor],
        cot_seed: int = 7):
    """Outputs, and gradients of (params, float features) under a seeded random cotangent."""
    fs = _fresh(feats)
    out = _outputs(layer(g, **fs), layer)
    gen = torch.Generator().manual_seed(cot_seed)
    cot = {k: torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in sorted(out.items())}
    loss = sum(((out[k] * cot[k]).float().sum() for k in cot), torch.zeros(()))
    params = [p for _, p in layer.named_parameters() if p.requires_grad]
    wrt = params + [fs[k] for k in sorted(fs) if fs[k].is_floating_point()]
    names = [n for n, p in layer.named_parameters() if p.requires_grad]
    names += [f"feature {k}" for k in sorted(fs) if fs[k].is_floating_point()]
    if not loss.requires_grad:
        return out, dict(zip(names, [torch.zeros_like(w) for w in wrt]))
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return out, {n: torch.zeros_like(w) if gr is None else gr
                 for n, w, gr in zip(names, wrt, grads)}


def compare(layer: sarc.Layer, g: sarc.Graph, feats: Mapping[str, torch.Tensor],
            rtol: float = 1e-5, reference: sarc.Layer | None = None,
            ref_feats: Mapping[str, torch.Tensor] | None = None,
            allow_fallback: bool = False) -> sarc.Layer:
    """Triton == PyTorch backend, outputs and every gradient; returns the Triton layer.

    ``reference`` (default: a copy of ``layer``) runs on the PyTorch backend, on
    ``ref_feats`` (default: ``feats``): a float32 twin checks a half-precision layer.
    Every op must run as Triton kernels unless ``allow_fallback``.
    """
    tri = set_backend(copy.deepcopy(layer), "triton")
    ref = set_backend(copy.deepcopy(layer if reference is None else reference), "torch")
    torch.manual_seed(1234)  # the same dropout seeds for both (sarc.ir.rng)
    out_t, grads_t = run(tri, g, feats)
    torch.manual_seed(1234)
    out_r, grads_r = run(ref, g, feats if ref_feats is None else ref_feats)
    assert allow_fallback or tri.compiled().fallbacks == (), tri.compiled().fallbacks
    for k in out_r:
        assert_close(out_t[k].to(out_r[k].dtype), out_r[k], rtol, f"output {k!r}")
    floor = CANCEL_FLOOR * max([t.abs().max().item() for t in grads_r.values() if t.numel()]
                               + [t.abs().max().item() for t in out_r.values() if t.numel()] + [0.0])
    assert sorted(grads_t) == sorted(grads_r)
    for name in grads_r:
        assert_close(grads_t[name].to(grads_r[name].dtype), grads_r[name], rtol,
                     f"grad of {name}", floor)
    return tri
