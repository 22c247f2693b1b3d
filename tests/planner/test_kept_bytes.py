"""The plan's bytes kept for backward are the bytes the compiled kernel keeps.

For every layer of the zoo (which has every layer class of ``models/``) and of every
model file as built, on a small random graph, the plan's "kept for backward" figure (``LayerPlan.saved["total"]``, the
cost model's ``saved_for_backward`` formula evaluated at the graph's sizes) equals what
autograd saves when the torch kernel runs the layer on a ``Graph``.

What autograd saves is measured with ``torch.autograd.graph.saved_tensors_hooks`` and
defined as the cost model defines it:

- each distinct storage once (views of one tensor, the dst rows of a src input, count
  once: the storage's bytes); a sparse matrix is its index and value storages;
- only tensors that grow with the graph, the node and edge tensors the cost model
  counts: storages of a multiple of N or E elements (N = 37 and E = 151 are primes no
  parameter shape here is a multiple of). Parameters, values computed from them alone
  and constants are not counted (they have the parameters' sizes), nor the graph's own
  tensors (its index and degrees live with the graph, not the step);
- the layer's inputs are counted when an op keeps them (a linear keeps its input for
  the weight's gradient), as every other value is; with ``inputs_need_grad`` the node
  features need a gradient, the edge features do not (the planner's assumption: a
  layer after the first reads the one before, the edge features come with the graph).

Tensors a custom autograd function keeps as attributes of ``ctx`` instead of saving them
are invisible to the hooks; the kernels keep only the graph and sizes that way.
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import sympy
import torch
from zoo import LAYERS, features

import sarc
from sarc.compiler import Target, compile_layer
from sarc.ir.types import E, N_DST, N_SRC

ROOT = Path(__file__).resolve().parent.parent.parent
D = 6
N, M = 37, 151


def _graph() -> sarc.Graph:
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N, (M,), generator=gen), torch.randint(0, N, (M,), generator=gen)
    return sarc.Graph.from_edges(src, dst, N)


def kept_by_kernel(layer: sarc.Layer, g: sarc.Graph, feats: dict) -> int:
    """Bytes of the distinct storages autograd saves for the layer's backward (see above)."""
    skip = {t.untyped_storage().data_ptr() for t in vars(g).values() if isinstance(t, torch.Tensor)}
    skip |= {p.untyped_storage().data_ptr() for p in layer.parameters()}
    kept: dict[int, int] = {}

    def keep(t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        elems = storage.nbytes() // t.element_size()
        grows = elems > 0 and (elems % g.num_src == 0 or elems % g.num_edges == 0)
        if grows and storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.layout is torch.sparse_csr:
            for part in (t.crow_indices(), t.col_indices(), t.values()):
                keep(part)
        else:
            keep(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(g, **feats)
    return sum(kept.values())


def kept_by_plan(layer: sarc.Layer, g: sarc.Graph, inputs_need_grad: bool) -> int:
    plan = compile_layer(layer, target=Target(inputs_need_grad=inputs_need_grad),
                         through="plan").plan
    return int(plan.saved["total"].subs({N_SRC: g.num_src, N_DST: g.num_dst, E: g.num_edges}))


def test_the_zoo_has_every_layer_class_of_the_models():
    zoo = {type(make(D)) for make in LAYERS.values()}
    for path in sorted((ROOT / "models").glob("*.py")):
        module = sys.modules.get(path.stem) or __import__(path.stem)
        classes = {c for _, c in inspect.getmembers(module, inspect.isclass)
                   if issubclass(c, sarc.Layer) and c.__module__ == module.__name__}
        assert classes and classes <= zoo, f"{path.name}: {classes - zoo} not in tests/zoo.py"


@pytest.mark.parametrize("inputs_need_grad", [True, False], ids=["input-grad", "no-input-grad"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_plan_keeps_what_the_kernel_keeps(name, inputs_need_grad):
    torch.manual_seed(0)
    g = _graph()
    layer = LAYERS[name](D).train()
    feats = features(layer, g, D)
    feats["h"].requires_grad_(inputs_need_grad)
    assert kept_by_plan(layer, g, inputs_need_grad) == kept_by_kernel(layer, g, feats)


@pytest.mark.parametrize("model", sorted(p.stem for p in (ROOT / "models").glob("*.py")))
def test_model_files_layers_plan_what_their_kernels_keep(model):
    """Each layer of each model file as ``build_model`` makes it (its hyperparameters and
    dataset's widths), the first one's input needing no gradient, as ``sarc compile`` plans."""
    from sarc.artifacts import find_layers
    from sarc.datasets import load_dataset
    from sarc.ir.printer import format_function
    from sarc.loader import load_model_file
    from sarc.train import DEFAULTS, build

    spec = load_model_file(str(ROOT / "models" / f"{model}.py"))
    hp = {**DEFAULTS, **spec.hparams}
    net = build(spec, load_dataset(hp["dataset"]), hp)
    g = _graph()
    seen = set()   # a layer traced as one already checked (hetero_sage's 180 relations)
    for k, (name, layer) in enumerate(find_layers(net)):
        key = (k > 0, format_function(layer.trace()))
        if key in seen:
            continue
        seen.add(key)
        torch.manual_seed(0)
        layer.train()
        feats = features(layer, g, layer._sarc_node["h"].shape[0])
        feats["h"].requires_grad_(k > 0)
        assert kept_by_plan(layer, g, k > 0) == kept_by_kernel(layer, g, feats), name


def test_rgcn_keeps_an_edge_weight_and_a_column_per_edge_not_the_messages():
    """RGCN's typed product is fused into the aggregate by the torch backend's pass, which
    runs before the plan: per edge its weight (4 bytes) and its column in the product
    (an int64), not a message (76 bytes per edge when the plan came before that pass)."""
    layer = LAYERS["rgcn"](D)
    plan = compile_layer(layer, target=Target(inputs_need_grad=False), through="plan").plan
    assert str(plan.saved["edge"]) == "12*E"


@pytest.mark.parametrize("inputs_need_grad", [True, False], ids=["input-grad", "no-input-grad"])
def test_rgcn_on_a_graph_with_fewer_edges_than_nodes_times_types(inputs_need_grad):
    """The typed product then runs per edge, not per (node, type): it keeps the same."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, N, (101,), generator=gen), torch.randint(0, N, (101,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, N)
    layer = LAYERS["rgcn"](D).train()
    assert g.num_src * layer.rel.weight.shape[0] > g.num_edges
    feats = features(layer, g, D)
    feats["h"].requires_grad_(inputs_need_grad)
    assert kept_by_plan(layer, g, inputs_need_grad) == kept_by_kernel(layer, g, feats)


def test_a_distributed_plan_keeps_the_dst_value_its_schedule_computes():
    """On a ``Graph`` the kernel takes GAT's ``lin(dst.h)`` as ``lin(src.h)``'s first rows
    and keeps one storage; a distributed schedule computes the dst value on the worker's
    own rows apart from the blocks' src values, and keeps both."""
    from sarc.ir.patterns import dst_rows_of_src
    layer = LAYERS["gat_4heads_concat"](D)
    on_graph = compile_layer(layer, target=Target(), through="plan")
    scheduled = compile_layer(layer, target=Target(distributed=True), through="plan").plan
    assert dst_rows_of_src(on_graph.optimized), "no dst value computed like a src value"
    heads, width, f32 = 4, 3, 4  # the dst value lin(dst.h): [N_dst, 4 heads x 3] float32
    assert sympy.expand(scheduled.saved["total"] - on_graph.plan.saved["total"]) == \
        heads * width * f32 * N_DST
