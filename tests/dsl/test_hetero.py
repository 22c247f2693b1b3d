"""``sarc.HeteroConv`` and ``sarc.TypedInput`` against a plain-torch reference.

On random small typed graphs (several seeds): each relation's layer computed by hand on
that relation's edges alone (its mean over the relation's in-neighbours, its degrees),
the relations' outputs combined over the relations into each node's type; output, input
gradient and every parameter gradient equal sarc's.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import sarc
from hetero_layers import MaxLayer, MeanLayer, NormSumLayer

N, E, F_IN, F_OUT, TYPES = 40, 220, 6, 5, 2


def reference_layer(layer, src, dst, w, x, n):
    """``layer`` on the edges (src, dst) in plain torch, degrees counted on those edges."""
    out_deg = torch.bincount(src, minlength=n).float()
    in_deg = torch.bincount(dst, minlength=n).float()
    if isinstance(layer, MeanLayer):
        s = torch.zeros(n, x.shape[1]).index_add(0, dst, x[src])
        return layer.neigh(s / in_deg.clamp(min=1).unsqueeze(1)) + layer.root(x)
    if isinstance(layer, NormSumLayer):
        norm = (out_deg.clamp(min=1)[src] * in_deg.clamp(min=1)[dst]) ** -0.5
        m = layer.lin(x[src]) * (norm * w).unsqueeze(1)
        return torch.zeros(n, m.shape[1]).index_add(0, dst, m)
    m = torch.tanh(layer.lin(x[src]))
    out = torch.full((n, m.shape[1]), float("-inf")).scatter_reduce(
        0, dst.unsqueeze(1).expand_as(m), m, "amax")
    return torch.where(in_deg.unsqueeze(1) > 0, out, torch.zeros(()))


def reference(conv, src, dst, etype, w, x, ntype):
    n = x.shape[0]
    outs, counted = [], []
    for rid in conv.relation_ids:
        keep = etype == rid
        outs.append(reference_layer(conv.layers[str(rid)], src[keep], dst[keep], w[keep], x, n))
        if ntype is None:
            counted.append(torch.ones(n, dtype=torch.bool))
        else:
            into = conv.dst_types[rid] if not keep.any() else ntype[dst[keep][0]]
            counted.append(ntype == into)
    total = torch.zeros_like(outs[0])
    picked = []
    count = torch.zeros(n)
    for o, c in zip(outs, counted):
        total = total + torch.where(c.unsqueeze(1), o, torch.zeros(()))
        picked.append(torch.where(c.unsqueeze(1), o, torch.full((), float("-inf"))))
        count = count + c.float()
    best = torch.stack(picked).max(0).values  # ties: the first relation, as DGL
    if conv.aggregate == "sum":
        return total
    if conv.aggregate == "mean":
        return total / count.clamp(min=1).unsqueeze(1)
    return torch.where(count.unsqueeze(1) > 0, best, torch.zeros(()))


def typed_graph(seed: int, relations: int = 4):
    """A random graph of two node types whose relation r goes into node type r % 2 (so each
    relation has one destination type, as in a heterograph); the last 3 nodes are isolated."""
    gen = torch.Generator().manual_seed(seed)
    ntype = torch.randint(0, TYPES, (N,), generator=gen)
    ntype[:TYPES] = torch.arange(TYPES)
    etype = torch.randint(0, relations, (E,), generator=gen)
    src = torch.randint(0, N - 3, (E,), generator=gen)
    dst = torch.empty(E, dtype=torch.int64)
    for t in range(TYPES):
        into = torch.nonzero(ntype[:N - 3] == t).squeeze(1)
        rows = torch.nonzero(etype % TYPES == t).squeeze(1)
        dst[rows] = into[torch.randint(0, into.numel(), (rows.numel(),), generator=gen)]
    w = torch.rand(E, generator=gen)
    x = torch.randn(N, F_IN, generator=gen)
    return src, dst, etype, ntype, w, x


def make_conv(aggregate: str, relations: int = 4):
    kinds = [MeanLayer, NormSumLayer] if aggregate != "max" else [MeanLayer, MaxLayer]
    return sarc.HeteroConv({r: kinds[r % 2](F_IN, F_OUT) for r in range(relations)}, aggregate)


def grads(conv, out, x):
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    g = {k: p.grad.clone() for k, p in conv.named_parameters()}
    g["x"] = x.grad.clone()
    conv.zero_grad()
    x.grad = None
    return g


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("typed", [True, False])
def test_hetero_conv_equals_per_relation_reference(aggregate, seed, typed):
    src, dst, etype, ntype, w, x = typed_graph(seed)
    torch.manual_seed(seed)
    conv = make_conv(aggregate)
    g = sarc.Graph.from_edges(src, dst, N)
    types = ntype if typed else None
    feats = {"w": w} if aggregate != "max" else {}
    x1 = x.clone().requires_grad_(True)
    got = conv(g, x1, etype=etype, ntype=types, **feats)
    got_grads = grads(conv, got, x1)
    x2 = x.clone().requires_grad_(True)
    want = reference(conv, src, dst, etype, w, x2, types)
    want_grads = grads(conv, want, x2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert set(got_grads) == set(want_grads)
    for k in want_grads:
        torch.testing.assert_close(got_grads[k], want_grads[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_relation_sees_only_its_edges_and_degrees():
    """One relation's layer on the whole graph would differ: its mean and its degrees are
    the relation's (the test above would pass for a layer on every edge otherwise only by
    accident)."""
    src, dst, etype, ntype, w, x = typed_graph(3, relations=2)
    torch.manual_seed(0)
    layer, other = MeanLayer(F_IN, F_OUT), MeanLayer(F_IN, F_OUT)
    conv = sarc.HeteroConv({0: layer, 1: other}, "sum")
    g = sarc.Graph.from_edges(src, dst, N)
    ones = etype == 1
    got = conv(g, x, etype=etype) - other(sarc.Graph.from_edges(src[ones], dst[ones], N), x)
    keep = etype == 0
    whole = layer(g, x)
    alone = layer(sarc.Graph.from_edges(src[keep], dst[keep], N), x)
    torch.testing.assert_close(got, alone)
    assert not torch.allclose(got, whole)


def test_relations_by_name_and_sub_graphs_kept_with_the_graph():
    src, dst, etype, ntype, w, x = typed_graph(4, relations=2)
    torch.manual_seed(0)
    names = ["cites", "writes"]
    a = sarc.HeteroConv({"writes": MeanLayer(F_IN, F_OUT), "cites": MeanLayer(F_IN, F_OUT)},
                        relations=names)
    assert a.relation_ids == (1, 0)
    g = sarc.Graph.from_edges(src, dst, N)
    first = a(g, x, etype=etype, ntype=ntype)
    from sarc.hetero import relation_graphs
    rel = relation_graphs(g, etype, (0, 1), ntype)
    assert rel.edges[0].numel() == int((etype == 0).sum())
    assert not rel.graphs   # with node types one process runs the compact graphs alone
    untyped = relation_graphs(g, etype, (0, 1))
    assert untyped is rel and rel.graph(g, 0).num_edges == int((etype == 0).sum())
    assert relation_graphs(g, etype.clone(), (0, 1), ntype) is rel  # an equal etype: kept
    torch.testing.assert_close(a(g, x, etype=etype, ntype=ntype), first)


@pytest.mark.parametrize("seed", [0, 1])
def test_typed_input_equals_per_type_linear(seed):
    gen = torch.Generator().manual_seed(seed)
    widths = {0: 3, 1: 7, 2: 5}
    ntype = torch.randint(0, 3, (30,), generator=gen)
    x = torch.zeros(30, 7)
    for v in range(30):
        w = widths[int(ntype[v])]
        x[v, :w] = torch.randn(w, generator=gen)   # each type's own width, zero-padded
    torch.manual_seed(seed)
    proj = sarc.TypedInput(widths, 4)
    x1 = x.clone().requires_grad_(True)
    got = proj(x1, ntype)
    got.pow(2).sum().backward()
    x2 = x.clone().requires_grad_(True)
    want = torch.stack([proj.lins[str(int(t))](x2[v, :widths[int(t)]])
                        for v, t in enumerate(ntype)])
    want_grads = torch.autograd.grad(want.pow(2).sum(), [x2, *proj.parameters()])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x1.grad, want_grads[0])
    for p, g in zip(proj.parameters(), want_grads[1:]):
        torch.testing.assert_close(p.grad, g)
    assert proj.lins["0"].weight.shape == (4, 3) and proj.lins["1"].weight.shape == (4, 7)


def test_a_learned_input_hands_the_model_only_what_its_forward_takes():
    """On a featureless graph the trainer wraps the model in an ``EmbeddingInput``, whose
    ``forward(g, x, **edge_inputs)`` passes every keyword on: what it is handed is what the
    wrapped model's ``forward`` takes (a HeteroConv model without ``ntype`` got ``ntype``,
    a TypeError from the first step)."""
    from torch import nn

    from sarc.dsl import edge_inputs_for
    from sarc.training.inputs import EmbeddingInput

    class WithoutTypes(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = make_conv("max")

        def forward(self, g, x, etype):
            return self.conv(g, x, etype=etype)

    src, dst, etype, ntype, w, x = typed_graph(5)
    carried = {"etype": etype, "ntype": ntype, "w": w}
    model = WithoutTypes()
    assert set(edge_inputs_for(model, carried)) == {"etype"}
    wrapped = EmbeddingInput(model, N, F_IN)
    inputs = edge_inputs_for(wrapped, carried)
    assert set(inputs) == {"etype"}
    wrapped(sarc.Graph.from_edges(src, dst, N), x[:, :0], **inputs)


def test_an_etype_changed_in_place_gives_new_sub_graphs():
    """The sub-graphs are kept per etype's values, not per tensor: types changed in place,
    or a fresh tensor of the new values, give the new relations' outputs."""
    src, dst, etype, ntype, w, x = typed_graph(5, relations=2)
    torch.manual_seed(0)
    conv = sarc.HeteroConv({0: MeanLayer(F_IN, F_OUT), 1: MeanLayer(F_IN, F_OUT)})
    g = sarc.Graph.from_edges(src, dst, N)
    before = conv(g, x, etype=etype)
    etype[:7] = 1 - etype[:7]
    want = conv(sarc.Graph.from_edges(src, dst, N), x, etype=etype.clone())
    assert not torch.allclose(want, before)
    torch.testing.assert_close(conv(g, x, etype=etype), want)
    torch.testing.assert_close(conv(g, x, etype=etype.clone()), want)


@pytest.mark.parametrize("write", ["numpy", "data"])
def test_an_etype_changed_where_its_version_counter_misses_it_gives_new_sub_graphs(write):
    """A write through a numpy view or ``.data`` leaves the tensor's version counter as it
    was: the etype's values are compared, so the new relations run (they were the old)."""
    src, dst, etype, ntype, w, x = typed_graph(5, relations=2)
    torch.manual_seed(0)
    conv = sarc.HeteroConv({0: MeanLayer(F_IN, F_OUT), 1: MeanLayer(F_IN, F_OUT)})
    g = sarc.Graph.from_edges(src, dst, N)
    before = conv(g, x, etype=etype, ntype=ntype)
    version = etype._version
    if write == "numpy":
        view = etype.numpy()
        view[:] = 1 - view
    else:
        etype.data[:] = 1 - etype.data
    assert etype._version == version
    want = conv(sarc.Graph.from_edges(src, dst, N), x, etype=etype.clone(), ntype=ntype)
    assert not torch.allclose(want, before)
    torch.testing.assert_close(conv(g, x, etype=etype, ntype=ntype), want)


def test_node_types_changed_in_place_or_given_anew_give_the_new_types():
    """The relations' destination types are kept per node types' values, for every
    relation: types changed in place after a call, or other types given to a conv of some
    of the relations after a call with the first, give what a fresh graph gives."""
    src, dst, etype, ntype, w, x = typed_graph(6, relations=2)
    torch.manual_seed(0)
    conv = sarc.HeteroConv({0: MeanLayer(F_IN, F_OUT), 1: MeanLayer(F_IN, F_OUT)})
    swapped = ntype.clone()   # the isolated nodes (no relation into them) change type
    swapped[-3:] = 1 - swapped[-3:]

    def fresh(types):
        return conv(sarc.Graph.from_edges(src, dst, N), x, etype=etype, ntype=types.clone())

    g = sarc.Graph.from_edges(src, dst, N)
    types = ntype.clone()
    before = conv(g, x, etype=etype, ntype=types)
    types[:] = swapped
    assert not torch.allclose(fresh(swapped), before)
    torch.testing.assert_close(conv(g, x, etype=etype, ntype=types), fresh(swapped))

    g = sarc.Graph.from_edges(src, dst, N)
    only0 = sarc.HeteroConv({0: conv.layers["0"]})
    with pytest.raises(sarc.errors.GraphError, match="edge types 1, which no relation"):
        only0(g, x, etype=etype, ntype=ntype)
    conv(g, x, etype=etype, ntype=ntype)
    torch.testing.assert_close(conv(g, x, etype=etype, ntype=swapped), fresh(swapped))
    torch.testing.assert_close(conv(g, x, etype=etype), conv(
        sarc.Graph.from_edges(src, dst, N), x, etype=etype))


def test_edges_of_an_edge_type_without_a_layer_are_refused():
    """As DGL's HeteroGraphConv (a KeyError there): the edges of a relation no layer is
    given for would be left out silently; whichever conv builds the sub-graphs first."""
    src, dst, etype, ntype, w, x = typed_graph(7, relations=3)
    torch.manual_seed(0)
    full = make_conv("sum", relations=3)
    part = sarc.HeteroConv({0: full.layers["0"], 2: full.layers["2"]})
    for first in (full, part):
        g = sarc.Graph.from_edges(src, dst, N)
        if first is full:
            full(g, x, etype=etype, w=w)
        with pytest.raises(sarc.errors.GraphError, match="the graph has edges of edge types "
                                                         "1, which no relation's layer"):
            part(g, x, etype=etype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_typed_input_refuses_node_types_that_are_not_integers(dtype):
    proj = sarc.TypedInput({0: 2, 1: 3}, 4)
    with pytest.raises(sarc.errors.GraphError, match=f"TypedInput: ntype must hold integer "
                                                     f"node types, got {dtype}"):
        proj(torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]).to(dtype))


def test_negative_edge_types_are_refused():
    src, dst, etype, ntype, w, x = typed_graph(8, relations=2)
    etype[3] = -1
    conv = sarc.HeteroConv({0: MeanLayer(F_IN, F_OUT), 1: MeanLayer(F_IN, F_OUT)})
    with pytest.raises(sarc.errors.GraphError, match="negative edge types \\(down to -1\\)"):
        conv(sarc.Graph.from_edges(src, dst, N), x, etype=etype)


def test_with_node_types_a_relation_computes_for_its_destination_type_alone():
    """A relation's layer runs on a graph of the nodes of its destination type, then the
    other sources its edges read: not on every node (its output elsewhere is left out)."""
    from sarc.hetero import relation_graphs
    src, dst, etype, ntype, w, x = typed_graph(8)
    conv = make_conv("sum")
    g = sarc.Graph.from_edges(src, dst, N)
    rel = relation_graphs(g, etype, conv.relation_ids, ntype)
    for r in conv.relation_ids:
        sub, edges, dst_rows, rows = rel.compact_graph(g, r)
        assert torch.equal(dst_rows, torch.nonzero(ntype == r % TYPES).squeeze(1))
        assert torch.equal(rows[:dst_rows.numel()], dst_rows)
        read = set(src[etype == r].tolist())
        assert set(rows.tolist()) == set(dst_rows.tolist()) | read
        assert rows.numel() == len(set(rows.tolist())) < N
        assert (sub.num_dst, sub.num_src) == (dst_rows.numel(), rows.numel())
        assert torch.equal(edges, torch.nonzero(etype == r).squeeze(1))


def test_a_relation_layer_is_traced_once_for_the_width_check_and_its_calls(monkeypatch):
    """HeteroConv's construction traces each relation's layer (its output width); the first
    call compiles that trace, not a second one. A change the trace reads traces again."""
    traced = []
    trace = sarc.Layer._trace
    monkeypatch.setattr(sarc.Layer, "_trace", lambda self: traced.append(self) or trace(self))
    src, dst, etype, ntype, w, x = typed_graph(0)
    conv = make_conv("sum")
    assert len(traced) == 4
    g = sarc.Graph.from_edges(src, dst, N)
    out = conv(g, x, etype=etype, w=w)
    assert len(traced) == 4
    layer = conv.layers["0"]
    layer.neigh = nn.Linear(F_IN, F_OUT, bias=False)   # no bias: traced again
    again = conv(g, x, etype=etype, w=w)
    assert len(traced) == 5 and traced[-1] is layer
    assert not torch.equal(out, again)


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max"])
@pytest.mark.parametrize("typed", [True, False])
def test_a_relation_without_edges_runs_as_dgls_does(aggregate, typed):
    """A relation no edge has (relation 4 of 5) runs, as DGL's HeteroGraphConv runs a
    relation with no edges: its layer's terms of the destinations alone (a mean layer's
    root and bias; a max's 0) count for the nodes of its type (``dst_types``), or every
    node without node types."""
    src, dst, etype, ntype, w, x = typed_graph(5)
    torch.manual_seed(5)
    kinds = [MeanLayer, NormSumLayer] if aggregate != "max" else [MeanLayer, MaxLayer]
    conv = sarc.HeteroConv({r: kinds[r % 2](F_IN, F_OUT) for r in range(4)}
                           | {4: MeanLayer(F_IN, F_OUT)}, aggregate, dst_types={4: 1})
    types = ntype if typed else None
    feats = {"w": w} if aggregate != "max" else {}
    x1 = x.clone().requires_grad_(True)
    got = conv(sarc.Graph.from_edges(src, dst, N), x1, etype=etype, ntype=types, **feats)
    got_grads = grads(conv, got, x1)
    x2 = x.clone().requires_grad_(True)
    want = reference(conv, src, dst, etype, w, x2, types)
    want_grads = grads(conv, want, x2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for k in want_grads:
        torch.testing.assert_close(got_grads[k], want_grads[k], rtol=1e-5, atol=1e-6, msg=k)
    assert want_grads["layers.4.root.weight"].abs().sum() > 0   # the empty relation counted


def test_a_relation_without_edges_needs_its_type_with_node_types():
    src, dst, etype, ntype, w, x = typed_graph(5)
    g = sarc.Graph.from_edges(src, dst, N)
    layers = {r: MeanLayer(F_IN, F_OUT) for r in range(5)}
    names = [f"r{r}" for r in range(5)]   # relation 4 named: one of the graph's, no edges
    with pytest.raises(sarc.GraphError, match=r"relation 4 \('r4'\) has no edges in the graph, "
                       r"so the node type it counts for is not known: give it, "
                       r"HeteroConv\(\.\.\., dst_types=\{4: "):
        sarc.HeteroConv(layers, relations=names)(g, x, etype=etype, ntype=ntype)
    for types in (ntype, None):   # unnamed, past every edge type: a relation the graph lacks
        with pytest.raises(sarc.GraphError, match=r"relation 4 is past every edge type the "
                           r"graph's edges carry \(0\.\.3\): a relation the graph lacks\?"):
            sarc.HeteroConv(layers)(g, x, etype=etype, ntype=types)
    untyped = sarc.HeteroConv(layers, relations=names)(g, x, etype=etype)   # named: it runs
    assert untyped.shape == (N, F_OUT)
    with pytest.raises(sarc.GraphError, match=r"relation 1 is given destination node type 0 "
                       r"\(dst_types\), but its edges go into nodes of type 1"):
        sarc.HeteroConv(layers, dst_types={1: 0, 4: 0})(g, x, etype=etype, ntype=ntype)
    with pytest.raises(sarc.DSLError, match=r"dst_types gives relation 7, which has no layer"):
        sarc.HeteroConv(layers, dst_types={7: 0})
    with pytest.raises(sarc.DSLError, match=r"dst_types gives relation 4 node type -1; a node "
                       r"type is an int >= 0"):
        sarc.HeteroConv(layers, dst_types={4: -1})


class _Tanh(sarc.Layer):
    """A sum of tanh(h_u): no product, so float32 under autocast."""

    def __init__(self):
        super().__init__(node={"h": F_IN})

    def message(self, src, dst, edge):
        return torch.tanh(src.h[:, :F_OUT])

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("typed", [True, False])
def test_relations_of_several_dtypes_under_autocast_combine_in_the_promoted_dtype(aggregate,
                                                                                   typed):
    """Under autocast a layer ending in a product returns bfloat16 and one without float32:
    combined in float32, as DGL's stack of them (the typed sum failed in index_add_, the
    untyped one rounded to the first relation's dtype)."""
    src, dst, etype, ntype, w, x = typed_graph(6, relations=2)
    torch.manual_seed(6)
    conv = sarc.HeteroConv({0: MeanLayer(F_IN, F_OUT), 1: _Tanh()}, aggregate)
    g = sarc.Graph.from_edges(src, dst, N)
    types = ntype if typed else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = conv(g, x, etype=etype, ntype=types)
        alone = [conv.layers[str(r)](sarc.Graph.from_edges(src[etype == r], dst[etype == r], N),
                                     x) for r in (0, 1)]
    assert [a.dtype for a in alone] == [torch.bfloat16, torch.float32]
    assert got.dtype == torch.float32
    counted = [None if types is None else ntype == r % TYPES for r in (0, 1)]
    want = sarc.hetero.combine([a.float() for a in alone], counted, aggregate)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("aggregate", ["sum", "max"])
def test_an_inference_mode_call_then_a_training_step(aggregate):
    """An evaluation under ``torch.inference_mode()`` first (the relations' graphs and the
    nodes they count for are made then, and kept), then a training step, which saves them
    for its backward: the step's output and gradients are those of a conv never called
    under inference mode (inference tensors kept failed the step), and the evaluation's
    output is the step's (a max over edges read a version counter inference mode has not)."""
    src, dst, etype, ntype, w, x = typed_graph(3)
    g = sarc.Graph.from_edges(src, dst, N)
    torch.manual_seed(0)
    conv = make_conv(aggregate)
    state = {k: v.clone() for k, v in conv.state_dict().items()}
    kw = {"w": w} if aggregate != "max" else {}   # the max conv's layers read no weight
    with torch.inference_mode():
        seen = conv(g, x, etype=etype, ntype=ntype, **kw)
    xs = x.clone().requires_grad_(True)
    out = conv(g, xs, etype=etype, ntype=ntype, **kw)
    got = grads(conv, out, xs)
    fresh = make_conv(aggregate)
    fresh.load_state_dict(state)
    xs = x.clone().requires_grad_(True)
    want_out = fresh(g, xs, etype=etype, ntype=ntype, **kw)
    want = grads(fresh, want_out, xs)
    torch.testing.assert_close(out.detach(), want_out.detach())
    torch.testing.assert_close(seen, want_out.detach())
    for k in want:
        torch.testing.assert_close(got[k], want[k])
