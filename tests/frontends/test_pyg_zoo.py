"""PyG convs at the edges of what their forward does, through ``as_conv``, against PyG's own
conv in float64: the output, the gradient of x and of every parameter, ``None`` where PyG
leaves a parameter without one (an optimizer with weight decay moves a parameter whose
gradient is zero, never one whose gradient is ``None``).

- a graph without edges with ``edge_dim`` set (the edge features are [0, edge_dim]);
- GATConv / GATv2Conv with ``edge_dim`` called without ``edge_attr`` (PyG skips the edge
  term: ``lin_edge`` and ``att_edge`` get no gradient);
- the prepared graph cached by ``as_conv`` after in-place edits its version counter does
  not see (numpy sharing the memory, ``.data``);
- parameterless convs given float64 features compute in float64;
- PyG's ``softmax(alpha, index, ptr, size_i)`` in ``message`` is sarc's edge softmax.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.utils import softmax  # noqa: E402

import sarc  # noqa: E402
from sarc.frontends.pyg import ConversionError, as_conv  # noqa: E402

N, D = 7, 4
F64 = torch.float64


def graph() -> torch.Tensor:
    """Duplicates, a self loop, a node without in-edges (6) and one without any (5)."""
    return torch.tensor([[0, 1, 2, 3, 0, 4, 4, 2, 6], [1, 2, 3, 0, 2, 1, 1, 2, 0]])


def randomize(conv) -> nn.Module:
    """Parameters drawn at random (PyG zeroes biases: a zero term hides mistakes), f64."""
    conv = conv.to(F64)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * 0.5)
    return conv


def grads(run, conv, x, extra, upstream):
    for p in conv.parameters():
        p.grad = None
    x = x.clone().requires_grad_(True)
    out = run(x, *extra)
    (out * upstream).sum().backward()
    return out.detach(), x.grad, {k: None if p.grad is None else p.grad.clone()
                                  for k, p in conv.named_parameters()}


def close(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), (what, (a - b).abs().max().item())


def check(conv, ei, x, *extra, wrapped=None):
    """``as_conv(conv)(x, ei, *extra)`` equals ``conv(x, ei, *extra)``: output, x's gradient,
    each parameter's gradient (``None`` where PyG's is)."""
    wrapped = wrapped or as_conv(conv)
    upstream = torch.randn(conv(x, ei, *extra).shape, dtype=x.dtype)
    out_p, xg_p, g_p = grads(lambda x, *e: conv(x, ei, *e), conv, x, extra, upstream)
    out_s, xg_s, g_s = grads(lambda x, *e: wrapped(x, ei, *e), conv, x, extra, upstream)
    close(out_s, out_p, "output")
    close(xg_s, xg_p, "grad of x")
    for k in g_p:
        assert (g_s[k] is None) == (g_p[k] is None), (k, g_s[k], g_p[k])
        if g_p[k] is not None:
            close(g_s[k], g_p[k], f"grad of {k}")
    return wrapped


def flowing(conv, flow: str) -> nn.Module:
    """``conv`` with its ``flow`` set (PyG reads it at each call)."""
    conv.flow = flow
    return conv


def adam_losses(net, x, ei, y, steps: int = 3) -> list[float]:
    """The cross-entropy losses of ``steps`` Adam steps of ``net(x, ei)`` against ``y``."""
    opt = torch.optim.Adam(net.parameters(), lr=0.05, weight_decay=5e-4)
    run = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(x, ei), y)
        loss.backward()
        opt.step()
        run.append(loss.item())
    return run


def x64(n=N, d=D, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


# --- 1. a graph without edges, edge_dim set -------------------------------------------------------

EDGE_DIM_CONVS = {
    "res_gated": lambda: pyg.ResGatedGraphConv(D, 3, edge_dim=2),
    "transformer": lambda: pyg.TransformerConv(D, 3, heads=2, edge_dim=2),
    "gat_no_loops": lambda: pyg.GATConv(D, 3, heads=2, edge_dim=2, add_self_loops=False),
    "gat": lambda: pyg.GATConv(D, 3, heads=2, edge_dim=2),
    "gatv2_no_loops": lambda: pyg.GATv2Conv(D, 3, edge_dim=2, add_self_loops=False),
}


@pytest.mark.parametrize("name", EDGE_DIM_CONVS)
def test_edge_dim_conv_on_a_graph_without_edges(name):
    conv = randomize(EDGE_DIM_CONVS[name]())
    ei = torch.empty(2, 0, dtype=torch.long)
    check(conv, ei, x64(), torch.empty(0, 2, dtype=F64))


@pytest.mark.parametrize("name", EDGE_DIM_CONVS)
def test_edge_dim_conv_with_edges(name):
    conv = randomize(EDGE_DIM_CONVS[name]())
    ei = graph()
    check(conv, ei, x64(), torch.randn(ei.size(1), 2, dtype=F64))


def test_edge_attr_of_another_width_is_refused():
    conv = pyg.TransformerConv(D, 3, edge_dim=2)
    ei = graph()
    with pytest.raises(ConversionError, match=r"TransformerConv: edge_attr of shape \[9, 3\]"):
        as_conv(conv)(torch.randn(N, D), ei, torch.randn(ei.size(1), 3))


# --- 2. GAT / GATv2 with edge_dim, called without edge_attr ---------------------------------------

NO_ATTR = {
    "gat": lambda: pyg.GATConv(D, 3, heads=2, edge_dim=2),
    "gat_no_loops": lambda: pyg.GATConv(D, 3, heads=2, edge_dim=2, add_self_loops=False),
    "gatv2": lambda: pyg.GATv2Conv(D, 3, heads=2, edge_dim=2),
}


@pytest.mark.parametrize("name", NO_ATTR)
def test_gat_edge_dim_without_edge_attr_skips_the_edge_term(name):
    conv = randomize(NO_ATTR[name]())
    ei = graph()
    wrapped = check(conv, ei, x64())
    assert conv.lin_edge.weight.grad is None
    # the same wrapper, then with edge features, then without again
    check(conv, ei, x64(seed=1), torch.randn(ei.size(1), 2, dtype=F64), wrapped=wrapped)
    check(conv, ei, x64(seed=2), wrapped=wrapped)
    assert list(wrapped.state_dict()) == list(conv.state_dict())


def test_gat_edge_dim_without_edge_attr_trains_as_pyg():
    torch.manual_seed(0)
    plain = randomize(pyg.GATConv(D, 3, heads=2, edge_dim=2))
    wrapped = as_conv(copy.deepcopy(plain))
    x, ei = x64(), graph()
    for model in (plain, wrapped):
        opt = torch.optim.Adam(model.parameters(), lr=0.1, weight_decay=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(x, ei).square().sum().backward()
            opt.step()
    for (k, p), q in zip(plain.named_parameters(), wrapped.layer.conv.parameters()):
        close(q.detach(), p.detach(), k)


# --- 3. the prepared graph as_conv keeps is never stale -------------------------------------------

def test_cache_sees_edits_the_version_counter_misses():
    conv = randomize(pyg.GCNConv(D, 3))
    wrapped = as_conv(conv)
    x = x64()
    arr = np.array([[0, 1, 2, 3, 4], [1, 2, 3, 0, 0]])
    ei = torch.from_numpy(arr)
    ew = torch.rand(5, dtype=F64) + 0.5
    close(wrapped(x, ei, ew).detach(), conv(x, ei, ew).detach(), "first call")
    arr[1] = [2, 2, 4, 4, 6]                  # numpy writes into the tensor's memory
    close(wrapped(x, ei, ew).detach(), conv(x, ei, ew).detach(), "edge_index changed")
    ew.data.mul_(3.0)                         # .data: the version does not move
    close(wrapped(x, ei, ew).detach(), conv(x, ei, ew).detach(), "edge weights changed")
    check(conv, ei, x, ew, wrapped=wrapped)


def test_cache_reuses_the_graph_of_an_equal_edge_index():
    wrapped = as_conv(randomize(pyg.GCNConv(D, 3)))
    x, ei = x64(), graph()
    wrapped(x, ei)
    g = wrapped._cache.graph
    wrapped(x, ei.clone())                    # the same edges in another tensor
    assert wrapped._cache.graph is g


@pytest.mark.parametrize("make,options", [(lambda: pyg.GCNConv(D, 3), {}),
                                          (lambda: pyg.GraphConv(D, 3), {"edge_dim": ()})])
def test_cache_never_hands_a_call_edge_features_of_an_earlier_calls_graph(make, options):
    """Edge features prepared from an edge weight that needed a gradient belong to that
    call's autograd graph: a later call with equal weights that need none prepares its own
    (it neither backpropagates through the first call's graph again nor into its leaf)."""
    conv = randomize(make())
    wrapped = as_conv(copy.deepcopy(conv), **options)
    x, ei = x64(), graph()
    w = torch.rand(ei.shape[1], dtype=F64) + 0.5
    first = w.clone().requires_grad_()
    wrapped(x, ei, first).sum().backward()
    grad = first.grad.clone()
    wrapped(x, ei, first.detach().clone()).sum().backward()   # a second backward: no error
    wrapped(x, ei, first)                                      # forward only, then:
    out = wrapped(x, ei, w.clone())
    out.sum().backward()
    assert torch.equal(first.grad, grad), "a call's backward reached an earlier call's leaf"
    close(out, conv(x, ei, w), "output")


@pytest.mark.parametrize("make,option,value", [
    (lambda: pyg.GCNConv(D, 3), "add_self_loops", False),
    (lambda: pyg.APPNP(K=2, alpha=0.2), "normalize", False),
    (lambda: pyg.ChebConv(D, 3, K=2), "normalization", "rw")])
def test_cache_prepares_the_graph_again_after_an_option_is_set(make, option, value):
    """An option the conv's graph preparation reads, set after a call, is the next call's."""
    conv = randomize(make())
    wrapped = as_conv(conv, in_channels=D) if isinstance(conv, pyg.APPNP) else as_conv(conv)
    x, ei = x64(), graph()
    wrapped(x, ei)
    setattr(conv, option, value)
    close(wrapped(x, ei), conv(x, ei), f"output after {option}={value!r}")


@pytest.mark.parametrize("make,option,value,needle", [
    (lambda: pyg.SAGEConv(D, 3), "normalize", True, "normalize=True"),
    (lambda: pyg.SAGEConv(D, 3), "project", True, "project=True"),
    (lambda: pyg.TransformerConv(D, 3), "beta", True, "beta=True"),
    (lambda: pyg.SGConv(D, 3), "K", 2, "K=2")])
def test_an_option_sarc_refuses_set_after_conversion_is_refused_at_the_call(make, option, value,
                                                                           needle):
    """The conversion refused it, but set afterwards it was ignored: the conv as converted."""
    conv = randomize(make())
    wrapped, x, ei = as_conv(conv), x64(), graph()
    close(wrapped(x, ei), conv(x, ei), "output before")
    setattr(conv, option, value)
    with pytest.raises(ConversionError, match=needle):
        wrapped(x, ei)


@pytest.mark.parametrize("make", [lambda: pyg.GINConv(nn.Linear(D, 3)),
                                  lambda: pyg.GATConv(D, 3)], ids=["GINConv", "GATConv"])
def test_an_aggregation_replaced_after_conversion_is_refused_by_its_name(make):
    """``conv.aggr`` keeps the name the conv was built with; the refusal said aggr='add'."""
    from torch_geometric.nn.aggr import MeanAggregation
    conv = randomize(make())
    wrapped, x, ei = as_conv(conv), x64(), graph()
    wrapped(x, ei)
    conv.aggr_module = MeanAggregation()
    with pytest.raises(ConversionError, match=r"aggr='mean' is not supported"):
        wrapped(x, ei)


def _message_hook(conv):
    return conv.register_message_forward_hook(lambda m, inputs, out: out * 2)


def _forward_hook(conv):
    return conv.register_forward_hook(lambda m, inputs, out: out * 3)


def _pre_hook(conv):
    return conv.register_forward_pre_hook(lambda m, inputs: (inputs[0] * 2, *inputs[1:]))


def _aggregate_hook(conv):
    return conv.register_aggregate_forward_hook(lambda m, inputs, out: out + 1)


def _explainer_mask(conv):
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
    set_masks(conv, nn.Parameter(torch.randn(graph().size(1), dtype=F64)), graph(),
              apply_sigmoid=True)
    return type("Handle", (), {"remove": lambda self: clear_masks(conv)})()


def _backward_hook(conv):
    return conv.register_full_backward_hook(lambda m, gin, gout: tuple(
        None if g is None else 2 * g for g in gin))


def _weight_norm(conv):
    name = next(n for n, p in conv.named_parameters(recurse=False))
    torch.nn.utils.weight_norm(conv, name)
    with torch.no_grad():
        getattr(conv, f"{name}_g").mul_(3.0)   # the recomputed weight changes

    class Removed:
        def remove(self):
            torch.nn.utils.remove_weight_norm(conv, name)
    return Removed()


HOOK_NAMES = {_message_hook: "register_message_forward_hook",
              _forward_hook: "register_forward_hook", _pre_hook: "register_forward_pre_hook",
              _aggregate_hook: "register_aggregate_forward_hook",
              _explainer_mask: "an explainer's edge mask",
              _backward_hook: "register_full_backward_hook",
              _weight_norm: "WeightNorm on a parameter of the conv itself"}


@pytest.mark.parametrize("hook", [_message_hook, _forward_hook, _pre_hook, _aggregate_hook,
                                  _explainer_mask, _backward_hook, _weight_norm])
@pytest.mark.parametrize("make", [lambda: pyg.SAGEConv(D, 3), lambda: pyg.GATConv(D, 3, heads=2),
                                  lambda: pyg.APPNP(K=2, alpha=0.2)],
                         ids=["SAGEConv", "GATConv", "APPNP"])
def test_a_hooked_conv_is_refused_until_the_hook_is_removed(make, hook):
    """A hook on the conv or an explainer's edge mask changes PyG's result; sarc, which never
    calls the conv, ignored them and gave another."""
    conv = randomize(make())
    wrapped = as_conv(conv, in_channels=D) if isinstance(conv, pyg.APPNP) else as_conv(conv)
    x, ei = x64(), graph()
    plain = conv(x, ei)
    if hook is _weight_norm and not any(True for _ in conv.parameters(recurse=False)):
        pytest.skip("the conv has no parameter of its own")
    handle = hook(conv)
    if hook is not _backward_hook:
        assert not torch.allclose(conv(x, ei), plain)   # the hook acts in PyG
    with pytest.raises(ConversionError) as err:
        wrapped(x, ei)
    assert HOOK_NAMES[hook] in str(err.value), str(err.value)
    handle.remove()
    close(wrapped(x, ei), conv(x, ei), "output once the hook is removed")


def test_edge_weights_with_a_gradient_train_twice():
    conv = randomize(pyg.GCNConv(D, 3))
    wrapped = as_conv(conv)
    x, ei = x64(), graph()
    ew = (torch.rand(ei.size(1), dtype=F64) + 0.5).requires_grad_(True)
    for _ in range(2):                        # the second backward needs its own graph
        ew.grad = None
        wrapped(x, ei, ew).sum().backward()
        got = ew.grad.clone()
        ew.grad = None
        conv(x, ei, ew).sum().backward()
        close(got, ew.grad, "grad of the edge weights")


# --- 4. dtypes and what is not supported ----------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: pyg.SimpleConv(), lambda: pyg.SimpleConv(aggr="mean"),
                                  lambda: pyg.LGConv(normalize=False)],
                         ids=["simple_sum", "simple_mean", "lgconv_unnormalized"])
def test_parameterless_conv_computes_in_its_features_dtype(make):
    conv = make()
    wrapped = as_conv(conv, in_channels=D)
    x, ei = x64(), graph()
    out = check(conv, ei, x, wrapped=wrapped)(x, ei)
    assert out.dtype == F64
    out32 = wrapped(x.float(), ei)            # and float32 on the next call
    assert out32.dtype == torch.float32
    assert torch.allclose(out32.double(), conv(x, ei), atol=1e-5)


def test_parameterless_conv_with_mixed_feature_dtypes_is_refused():
    conv = pyg.SimpleConv()
    wrapped = as_conv(conv, in_channels=D, edge_dim=())
    ei = graph()
    with pytest.raises(sarc.GraphError, match=r"'x' is torch.float64.*'edge_weight' is "
                                              r"torch.float32"):
        wrapped(x64(), ei, torch.rand(ei.size(1)))


def test_signed_conv_is_refused_plainly():
    with pytest.raises(ConversionError, match=r"SignedConv: forward\(x, pos_edge_index, "
                                              r"neg_edge_index\).*several edge lists"):
        as_conv(pyg.SignedConv(4, 3, first_aggr=True))
    with pytest.raises(ConversionError, match="several edge lists"):
        as_conv(pyg.SignedConv(4, 3, first_aggr=True), edge_dim=2)


@pytest.mark.parametrize("make", [
    lambda: pyg.HGTConv({"a": 4}, 3, (["a"], [("a", "to", "a")]), heads=1),
    lambda: pyg.HANConv({"a": 4}, 3, (["a"], [("a", "to", "a")]), heads=1)],
    ids=["hgt", "han"])
def test_heterogeneous_convs_are_refused_plainly(make):
    conv = make()
    with pytest.raises(ConversionError, match=f"{type(conv).__name__}: a heterogeneous conv"):
        as_conv(conv)


# --- 5. PyG's softmax over each destination's edges is sarc's edge softmax ------------------------

class DotAttention(MessagePassing):
    """A user's attention conv, PyG's idiom: scores per edge from both ends, normalized with
    ``softmax(alpha, index, ptr, size_i)``, heads averaged, plus a root term."""

    def __init__(self, in_channels, out_channels, heads=2):
        super().__init__(aggr="add", node_dim=0)
        self.in_channels, self.heads, self.out_channels = in_channels, heads, out_channels
        self.lin = nn.Linear(in_channels, heads * out_channels)
        self.att = nn.Parameter(torch.randn(1, heads, 2 * out_channels))
        self.root = nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, self.heads, self.out_channels)
        return self.propagate(edge_index, h=h).mean(1) + self.root(x)

    def message(self, h_i, h_j, index, ptr, size_i):
        alpha = F.leaky_relu((torch.cat([h_i, h_j], -1) * self.att).sum(-1), 0.2)
        alpha = softmax(alpha, index, ptr, size_i)
        return h_j * alpha.unsqueeze(-1)


class GatedByDestination(MessagePassing):
    """``softmax(score, edge_index_i, num_nodes=size_i)`` of one score per edge, mean-free."""

    def __init__(self, in_channels):
        super().__init__(aggr="add")
        self.in_channels = in_channels
        self.score = nn.Linear(2 * in_channels, 1)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j, edge_index_i, size_i):
        alpha = softmax(self.score(torch.cat([x_i, x_j], -1)).squeeze(-1), edge_index_i,
                        num_nodes=size_i)
        return x_j * alpha.view(-1, 1)


class HeldSoftmax(MessagePassing):
    """PyG's softmax held as an attribute (``self.normalize = softmax``): not found by its
    name in a module, it ran as PyG's own and was refused as a use of ``index``."""

    def __init__(self, in_channels, normalize=softmax):
        super().__init__(aggr="add")
        self.in_channels = in_channels
        self.score = nn.Linear(2 * in_channels, 1)
        self.normalize = normalize

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j, index, ptr, size_i):
        alpha = self.normalize(self.score(torch.cat([x_i, x_j], -1)).squeeze(-1), index, ptr,
                               size_i)
        return x_j * alpha.view(-1, 1)


SOFTMAX_CONVS = {
    "agnn": (lambda: pyg.AGNNConv(add_self_loops=False), {"in_channels": D}),
    "agnn_self_loops": (lambda: pyg.AGNNConv(), {"in_channels": D}),
    "agnn_fixed_beta": (lambda: pyg.AGNNConv(requires_grad=False, add_self_loops=False),
                        {"in_channels": D}),
    "general": (lambda: pyg.GeneralConv(D, 3), {}),
    "general_attention": (lambda: pyg.GeneralConv(D, 3, heads=2, attention=True), {}),
    "general_dot_product": (lambda: pyg.GeneralConv(D, 3, heads=2, attention=True,
                                                    attention_type="dot_product"), {}),
    "user_dot_attention": (lambda: DotAttention(D, 3), {}),
    "user_edge_index_i": (lambda: GatedByDestination(D), {}),
    "user_held_softmax": (lambda: HeldSoftmax(D), {}),
}


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("name", SOFTMAX_CONVS)
def test_pyg_softmax_in_message_equals_pyg(name, flow):
    """With ``flow='target_to_source'`` the softmax is over the edges of each
    ``edge_index[0]``, where the messages go."""
    make, options = SOFTMAX_CONVS[name]
    conv = flowing(randomize(make()), flow)
    check(conv, graph(), x64(), wrapped=as_conv(conv, **options))


def test_general_conv_attention_with_edge_features_equals_pyg():
    conv = randomize(pyg.GeneralConv(D, 3, in_edge_channels=2, heads=2, attention=True))
    ei = graph()
    check(conv, ei, x64(), torch.randn(ei.size(1), 2, dtype=F64),
          wrapped=as_conv(conv, edge_dim=2))


class Net(nn.Module):
    def __init__(self, first, second, wrap):
        super().__init__()
        self.conv1, self.conv2 = wrap(first), wrap(second)
        self.out = nn.Linear(3, 2, dtype=F64)

    def forward(self, x, edge_index):
        return self.out(self.conv2(self.conv1(x, edge_index).relu(), edge_index))


PAIRS = {
    "general_agnn": lambda: (pyg.GeneralConv(D, 3, heads=2, attention=True),
                             pyg.AGNNConv()),
    "general_gated": lambda: (pyg.GeneralConv(D, 3, heads=2, attention=True),
                              GatedByDestination(3)),
    "user_general_dot": lambda: (DotAttention(D, 3),
                                 pyg.GeneralConv(3, 3, heads=2, attention=True,
                                                 attention_type="dot_product")),
}


@pytest.mark.parametrize("pair", PAIRS)
def test_attention_convs_train_three_steps_as_pyg(pair):
    def convs():
        torch.manual_seed(0)
        return tuple(randomize(c) for c in PAIRS[pair]())

    def wrap(conv):
        return as_conv(conv, in_channels=3) if isinstance(conv, pyg.AGNNConv) else as_conv(conv)

    x, ei = x64(), graph()
    y = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(2))
    losses = []
    for model in (Net(*convs(), lambda c: c), Net(*convs(), wrap)):
        with torch.no_grad():
            model.out.weight.copy_(torch.linspace(-1, 1, 6, dtype=F64).view(2, 3))
        losses.append(adam_losses(model, x, ei, y))
    assert losses[1] == pytest.approx(losses[0], rel=1e-10, abs=1e-12)
    assert losses[0][2] != losses[0][0]


class SoftmaxOverSources(GatedByDestination):
    def message(self, x_i, x_j, edge_index_i, size_i):
        return x_j * softmax(x_j.sum(-1), edge_index_i, dim=1).view(-1, 1)


class IndexInScatter(GatedByDestination):
    def message(self, x_j, index):
        return x_j / index.bincount()[index].view(-1, 1)


class SourceIndex(GatedByDestination):
    def message(self, x_j, edge_index_j):
        return softmax(x_j, edge_index_j)


def test_other_uses_of_the_destination_index_are_refused():
    x, ei = torch.randn(N, D), graph()
    with pytest.raises(ConversionError, match=r"IndexInScatter: message's index used in "
                                              r"index.bincount at .*test_pyg_zoo.py:\d+"):
        as_conv(IndexInScatter(D))(x, ei)
    with pytest.raises(ConversionError, match=r"SoftmaxOverSources: "
                                              r"torch_geometric.utils.softmax\(..., dim=1\)"):
        as_conv(SoftmaxOverSources(D))(x, ei)
    with pytest.raises(ConversionError, match=r"SourceIndex: message argument 'edge_index_j'"):
        as_conv(SourceIndex(D))(x, ei)


def test_pyg_softmax_held_in_a_closure_is_refused_saying_so():
    def conv_with(normalize):
        class Closed(HeldSoftmax):
            def message(self, x_i, x_j, index, ptr, size_i):
                return x_j * normalize(x_j.sum(-1), index, ptr, size_i).view(-1, 1)
        return Closed(D, None)

    with pytest.raises(ConversionError, match=r"this is PyG's softmax, reached where sarc does "
                                              r"not route it \(a closure\)"):
        as_conv(conv_with(softmax))(torch.randn(N, D), graph())


# --- 6. one-round convs whose forward normalizes: PyG's preparation, then the round ---------------

PREPARED = {
    "lgconv_normalized": (lambda: pyg.LGConv(), {"in_channels": D}, False),
    "lgconv_normalized_weighted": (lambda: pyg.LGConv(), {"in_channels": D}, True),
    "lgconv_unnormalized_weighted": (lambda: pyg.LGConv(normalize=False), {"in_channels": D},
                                     True),
    "sgconv": (lambda: pyg.SGConv(D, 3, K=1), {}, False),
    "sgconv_weighted": (lambda: pyg.SGConv(D, 3, K=1), {}, True),
    "sgconv_no_loops": (lambda: pyg.SGConv(D, 3, K=1, add_self_loops=False), {}, False),
    "cluster_gcn": (lambda: pyg.ClusterGCNConv(D, 3, diag_lambda=0.7), {}, False),
    "feast": (lambda: pyg.FeaStConv(D, 3, heads=2), {}, False),
    "feast_no_loops": (lambda: pyg.FeaStConv(D, 3, heads=2, add_self_loops=False), {}, False),
    "simple_self_loop": (lambda: pyg.SimpleConv(combine_root="self_loop"),
                         {"in_channels": D}, False),
    "simple_self_loop_mean_weighted": (lambda: pyg.SimpleConv("mean", combine_root="self_loop"),
                                       {"in_channels": D}, True),
    "simple_self_loop_max": (lambda: pyg.SimpleConv("max", combine_root="self_loop"),
                             {"in_channels": D}, False),
}


def check_prepared(make, options: dict, weighted: bool) -> None:
    """``check`` of a conv whose forward prepares the graph, with or without edge weights,
    called twice (the second time on the graph ``as_conv`` kept)."""
    conv = randomize(make())
    ei = graph()
    extra = [torch.rand(ei.size(1), dtype=F64) + 0.5] if weighted else []
    wrapped = check(conv, ei, x64(), *extra, wrapped=as_conv(conv, **options))
    check(conv, ei, x64(seed=3), *extra, wrapped=wrapped)   # the prepared graph reused


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("name", PREPARED)
def test_one_round_normalizing_conv_equals_pyg(name, flow):
    make, options, weighted = PREPARED[name]
    check_prepared(lambda: flowing(make(), flow), options, weighted)


def test_one_round_normalizing_convs_train_three_steps_as_pyg():
    def model(wrap):
        torch.manual_seed(0)
        first = randomize(pyg.ClusterGCNConv(D, 3))
        second = randomize(pyg.SGConv(3, 3, K=1))
        return Net(first, second, wrap)

    x, ei = x64(), graph()
    y = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(2))
    losses = [adam_losses(net, x, ei, y) for net in (model(lambda c: c), model(as_conv))]
    assert losses[1] == pytest.approx(losses[0], rel=1e-10, abs=1e-12)




# --- PyG's own calling conventions ----------------------------------------------------------------

@pytest.mark.parametrize("make, options", [(lambda: pyg.GraphConv(D, 3), {}),
                                           (lambda: pyg.LEConv(D, 3), {}),
                                           (lambda: pyg.GCNConv(D, 3), {})],
                         ids=["graphconv", "leconv", "gcn"])
def test_an_edge_index_object_is_read_as_its_ids(make, options):
    """A traced conv given PyG's EdgeIndex failed inside sarc (a tensor subclass met the
    graph code's own); it is read as the [2, E] ids it holds."""
    from torch_geometric import EdgeIndex
    conv = randomize(make())
    ei = EdgeIndex(graph(), sparse_size=(N, N))
    check(conv, ei, x64(), wrapped=as_conv(conv, **options))


@pytest.mark.parametrize("model", ["GCN", "GAT", "GraphSAGE", "GIN"])
def test_pygs_models_with_their_convs_wrapped_equal_pyg(model):
    """PyG's models call each conv by keyword (``conv(x, edge_index, edge_weight=w)``,
    ``edge_weight=None`` when not given): the conv's third argument by its name, and
    another given as its default None; ``reset_parameters()`` reaches each conv."""
    from torch_geometric.nn import models
    torch.manual_seed(0)
    ref = getattr(models, model)(D, 8, num_layers=2, out_channels=3,
                                 **({"heads": 2} if model == "GAT" else {})).to(F64).eval()
    mine = copy.deepcopy(ref)
    mine.convs = nn.ModuleList(as_conv(c) for c in mine.convs)
    x, ei = x64(), graph()
    extra = {"edge_weight": torch.rand(ei.size(1), dtype=F64) + 0.5} if model == "GCN" else {}
    close(mine(x, ei, **extra), ref(x, ei, **extra), "output")
    close(mine(x, ei), ref(x, ei), "output without edge weights")
    torch.manual_seed(1)
    mine.reset_parameters()
    torch.manual_seed(1)
    ref.reset_parameters()
    close(mine(x, ei), ref(x, ei), "output after reset_parameters")


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("make, options", [(lambda: pyg.GCNConv(D, 3, cached=True), {}),
                                           (lambda: pyg.APPNP(K=2, alpha=0.1, cached=True),
                                            {"in_channels": D})], ids=["gcn", "appnp"])
def test_a_cached_conv_called_by_pyg_first_keeps_pygs_graph(make, options, flow):
    """PyG's call cached graph A; the wrapper then normalized graph B, where PyG keeps
    A's (and wrote B's into the conv's cache). Two wrappers of one conv share its cache."""
    conv = flowing(randomize(make()), flow)
    x = x64()
    a = graph()
    b = torch.randint(0, N, (2, 12), generator=torch.Generator().manual_seed(4))
    conv(x, a)
    first, second = as_conv(conv, **options), as_conv(conv, **options)
    check(conv, b, x, wrapped=first)
    check(conv, b, x64(seed=2), wrapped=second)
    conv.reset_parameters()   # PyG forgets its graph: the next call's is kept
    randomize(conv)
    check(conv, b, x, wrapped=first)
    check(conv, a, x, wrapped=second)


def test_a_tensor_option_replaced_or_changed_in_place_prepares_the_graph_again():
    """GATConv's fill_value as a tensor: the graph kept by as_conv was reused after it
    changed (only plain-valued options were compared)."""
    conv = randomize(pyg.GATConv(D, 3, heads=2, edge_dim=2,
                                 fill_value=torch.tensor([0.5, -1.0], dtype=F64)))
    wrapped = as_conv(conv)
    ei, attr = graph(), torch.randn(graph().size(1), 2, dtype=F64)
    check(conv, ei, x64(), attr, wrapped=wrapped)
    conv.fill_value = torch.tensor([2.0, 3.0], dtype=F64)
    check(conv, ei, x64(), attr, wrapped=wrapped)
    conv.fill_value.mul_(-4.0)
    check(conv, ei, x64(), attr, wrapped=wrapped)


class _SoftmaxAggregated(MessagePassing):
    """DeeperGCN's message ``relu(x_j) + eps`` under the conv's aggregation."""

    def __init__(self, aggr):
        super().__init__(aggr=aggr)
        self.in_channels, self.lin = D, nn.Linear(D, D)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j):
        return x_j.relu() + 1e-7


@pytest.mark.parametrize("make", [
    lambda: _SoftmaxAggregated("softmax"),
    lambda: _SoftmaxAggregated(pyg.aggr.SoftmaxAggregation(t=0.5)),
    lambda: _SoftmaxAggregated(pyg.aggr.SoftmaxAggregation(learn=True)),
    lambda: _SoftmaxAggregated(pyg.aggr.SoftmaxAggregation(learn=True, channels=D)),
    lambda: _SoftmaxAggregated(pyg.aggr.SoftmaxAggregation(t=2.0, semi_grad=True)),
    lambda: pyg.GENConv(D, 3, norm=None),
    lambda: pyg.GENConv(D, 3, norm=None, learn_t=True, msg_norm=True, learn_msg_scale=True),
], ids=["softmax", "t", "learned-t", "t-per-channel", "semi-grad", "genconv", "genconv-learned"])
def test_pygs_softmax_aggregation_equals_pyg(make):
    """PyG's SoftmaxAggregation (GENConv's default: ``sum_e softmax_v(t x_e) x_e``, per
    channel, a learned temperature among the parameters; semi_grad's weights without a
    gradient) in a traced conv; it was refused as an aggregation sarc has not."""
    conv = randomize(make())
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(2), dtype=F64)
    check(conv, graph(), x)


def test_genconv_with_edge_features_equals_pyg():
    conv = randomize(pyg.GENConv(D, 3, norm=None, learn_t=True, edge_dim=2))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(N, D, generator=gen, dtype=F64)
    check(conv, graph(), x, torch.randn(graph().size(1), 2, generator=gen, dtype=F64),
          wrapped=as_conv(conv, edge_dim=2))


@pytest.mark.parametrize("make", [
    lambda: _SoftmaxAggregated("powermean"),
    lambda: _SoftmaxAggregated(pyg.aggr.PowerMeanAggregation(p=2.5)),
    lambda: _SoftmaxAggregated(pyg.aggr.PowerMeanAggregation(p=0.5, clamp_min=None)),
    lambda: _SoftmaxAggregated(pyg.aggr.PowerMeanAggregation(learn=True)),
    lambda: _SoftmaxAggregated(pyg.aggr.PowerMeanAggregation(learn=True, channels=D)),
    lambda: pyg.GENConv(D, 3, aggr="powermean", p=3.0, norm=None),
    lambda: pyg.GENConv(D, 3, aggr="powermean", learn_p=True, norm=None),
], ids=["powermean", "p", "p-no-min", "learned-p", "p-per-channel", "genconv", "genconv-learned"])
def test_pygs_power_mean_aggregation_equals_pyg(make):
    """PyG's PowerMeanAggregation (GENConv's ``aggr='powermean'``): ``clamp(mean_e
    clamp(x_e)^p)^(1/p)``, a learned power among the parameters."""
    conv = randomize(make())
    with torch.no_grad():   # a power of 0 is no mean; PyG learns p from 1
        for name, p in conv.named_parameters():
            if name.endswith("aggr_module.p"):
                p.copy_(torch.linspace(0.7, 2.2, p.numel(), dtype=F64))
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(2), dtype=F64)
    check(conv, graph(), x)


@pytest.mark.parametrize("channels", [1, D])
def test_a_learned_power_of_one_has_pygs_gradient_in_float32(channels):
    """At p = 1 (where PyG starts a learned p) the gradient of p is a difference of nearly
    equal terms: ``exp(p log x)``'s rounding (torch's ``pow`` is exact at 1) made it off by
    1e-3 in float32. x^p is ``x exp((p - 1) log x)``, exact at p = 1."""
    conv = randomize(_SoftmaxAggregated(pyg.aggr.PowerMeanAggregation(learn=True,
                                                                      channels=channels)))
    conv = conv.float()
    with torch.no_grad():
        conv.aggr_module.p.fill_(1.0)
    x = torch.rand(N, D, generator=torch.Generator().manual_seed(5)) * 3
    up = torch.randn(N, D, generator=torch.Generator().manual_seed(6))
    ours = as_conv(conv)
    (ours(x, graph()) * up).sum().backward()
    got = conv.aggr_module.p.grad.clone()
    exact = copy.deepcopy(conv).double()
    exact.aggr_module.p.grad = None
    (exact(x.double(), graph()) * up.double()).sum().backward()
    want = exact.aggr_module.p.grad.float()
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max())), \
        (got, want)


def test_a_learned_power_of_unclamped_messages_is_refused():
    """``exp(p log x)`` is x^p for x > 0 only: a learned power without ``clamp_min`` is
    refused, naming the option."""
    conv = _SoftmaxAggregated(pyg.aggr.PowerMeanAggregation(learn=True, clamp_min=None))
    with pytest.raises(ConversionError, match=r"PowerMeanAggregation\(learn=True, clamp_min="
                                              r"None\).*clamp_min > 0"):
        as_conv(conv)(torch.randn(N, D), graph())


@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
@pytest.mark.parametrize("root_weight", [True, False])
def test_nnconv_equals_pyg(aggr, root_weight):
    """NNConv: a weight per edge from its edge features (``nn``), ``x_j.unsqueeze(1) @ w``:
    a matrix product per edge (it was refused as a product by a non-parameter)."""
    net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, D * 5))
    conv = randomize(pyg.NNConv(D, 5, net, aggr=aggr, root_weight=root_weight))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(N, D, generator=gen, dtype=F64)
    check(conv, graph(), x, torch.randn(graph().size(1), 3, generator=gen, dtype=F64),
          wrapped=as_conv(conv, edge_dim=3))


PNA = {
    "mean-min-max-std": dict(aggregators=["mean", "min", "max", "std"],
                             scalers=["identity", "amplification", "attenuation"]),
    "towers": dict(aggregators=["sum", "var"], scalers=["linear", "inverse_linear"], towers=2,
                   divide_input=True),
    "towers-repeated": dict(aggregators=["mean", "max"], scalers=["identity"], towers=2,
                            divide_input=False, pre_layers=2, post_layers=2),
    "edges-train-norm": dict(aggregators=["mean", "std"], scalers=["amplification"], edge_dim=3,
                             train_norm=True),
}


@pytest.mark.parametrize("name", sorted(PNA))
def test_pnaconv_equals_pyg(name):
    """PNAConv: several aggregations (std and var among them) concatenated, each scaled by
    the node's in-edge count as PNA's ``DegreeScalerAggregation`` does (towers, edge
    features, learned average degrees); it was refused as an aggregation sarc has not."""
    options = PNA[name]
    conv = randomize(pyg.PNAConv(D, 6, deg=torch.tensor([1, 3, 2, 1]), **options))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(N, D, generator=gen, dtype=F64)
    if "edge_dim" not in options:
        check(conv, graph(), x)
        return
    check(conv, graph(), x, torch.randn(graph().size(1), 3, generator=gen, dtype=F64),
          wrapped=as_conv(conv, edge_dim=3))


@pytest.mark.parametrize("aggr", ["std", "var", ["std", "softmax"]], ids=str)
def test_sage_conv_of_the_aggregations_pna_uses_equals_pyg(aggr):
    """SAGEConv with PyG's std or var aggregation (traced from its own code)."""
    conv = randomize(pyg.SAGEConv(D, 3, aggr=aggr))
    check(conv, graph(), torch.randn(N, D, generator=torch.Generator().manual_seed(6),
                                     dtype=F64))
