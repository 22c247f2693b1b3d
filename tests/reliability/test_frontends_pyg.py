"""A PyG conv sarc cannot model exactly is refused with an error naming the conv's class and
the construct, never converted into something else (``sarc.frontends.pyg``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.utils import degree, scatter  # noqa: E402

import sarc  # noqa: E402
from sarc.frontends.pyg import ConversionError, as_conv, from_message_passing  # noqa: E402

from .catalogue import case  # noqa: E402

EDGE_INDEX = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 3, 3]])
X = torch.randn(4, 5)


def refused(make, *needles: str, error=ConversionError) -> str:
    with pytest.raises(error) as info:
        make()
    text = str(info.value)
    for n in needles:
        assert n in text, (n, text)
    return text


def run(conv):
    return from_message_passing(conv).run(X, EDGE_INDEX)


@case("dsl", "a PyG GATConv with separate source and target widths (in_channels=(5, 4))",
      "error")
def test_gat_bipartite_widths():
    refused(lambda: from_message_passing(pyg.GATConv((5, 4), 3)), "GATConv",
            "in_channels=(5, 4)")


@case("dsl", "a PyG SAGEConv with an aggregation sarc has not (aggr='median')", "error")
def test_sage_median_aggregation():
    refused(lambda: from_message_passing(pyg.SAGEConv(5, 3, aggr="median")), "SAGEConv",
            "aggr='median'")


class MedianOfMessages(MessagePassing):
    def __init__(self):
        super().__init__(aggr="median")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


@case("dsl", "a user's PyG conv with an aggregation sarc has not (aggr='median')", "error")
def test_own_conv_median_aggregation_names_where_the_class_is():
    import inspect
    line = inspect.getsourcelines(MedianOfMessages)[1]
    refused(lambda: run(MedianOfMessages()), "MedianOfMessages: aggr='median'",
            f"MedianOfMessages is defined at {__file__}:{line}")
    # PyG's own convs are named, not located in PyG's source
    assert " is defined at " not in refused(
        lambda: from_message_passing(pyg.SAGEConv(5, 3, aggr="median")))



@case("dsl", "a PyG TransformerConv with the gated skip (beta=True)", "error")
def test_transformer_beta():
    refused(lambda: from_message_passing(pyg.TransformerConv(5, 3, beta=True)),
            "TransformerConv", "beta=True")


@case("dsl", "a PyG RGCNConv with block-diagonal weights (num_blocks=5)", "error")
def test_rgcn_blocks():
    refused(lambda: from_message_passing(pyg.RGCNConv(5, 5, 2, num_blocks=5)), "RGCNConv",
            "num_blocks=5")


@case("dsl", "a PyG conv whose flow is set to neither of PyG's two", "error")
def test_flow_of_another_name():
    conv = pyg.GCNConv(5, 3)
    conv.flow = "both_ways"
    refused(lambda: from_message_passing(conv), "GCNConv", "flow='both_ways'")


class SoftmaxByIndex(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5
        self.att = nn.Linear(10, 1)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j, index, ptr, size_i):
        # PyG's softmax written out: index in a scatter, which sarc does not model (its
        # one use of index is softmax(alpha, index, ptr, size_i), sarc's edge softmax)
        alpha = self.att(torch.cat([x_i, x_j], -1)).exp()
        return alpha / scatter(alpha, index, 0, size_i, reduce="sum")[index] * x_j


@case("tracer", "a MessagePassing message that takes index/ptr (PyG's softmax)", "error")
def test_message_softmax_with_index():
    refused(lambda: run(SoftmaxByIndex()), "SoftmaxByIndex", "message's index used in",
            "test_frontends_pyg.py")


class PropagateTwice(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index):
        h = self.propagate(edge_index, x=x)
        return self.propagate(edge_index, x=h)  # the second round


@case("tracer", "a MessagePassing forward that calls propagate twice", "error")
def test_propagate_twice_names_the_second_call():
    refused(lambda: run(PropagateTwice()), "PropagateTwice", "calls propagate twice",
            "test_frontends_pyg.py:", "a conv of its own")


class OnlyMessageAndAggregate(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message_and_aggregate(self, adj_t, x):
        return adj_t @ x


@case("tracer", "a MessagePassing with message_and_aggregate and no message", "error")
def test_message_and_aggregate_only():
    refused(lambda: from_message_passing(OnlyMessageAndAggregate()), "OnlyMessageAndAggregate",
            "message_and_aggregate without message")


class DegreeScaledX(MessagePassing):
    """Graph code (the degrees) combined with x before propagate."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index):
        deg = degree(edge_index[1], x.size(0), dtype=x.dtype)
        return self.propagate(edge_index, x=x * deg.view(-1, 1))  # ERR:mixed

    def message(self, x_j):
        return x_j


@case("tracer", "a MessagePassing forward that combines the degrees it computes from "
                "edge_index with x before propagate", "error")
def test_forward_combines_graph_code_with_x():
    line = next(n for n, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.endswith("# ERR:mixed"))
    refused(lambda: run(DegreeScaledX()),
            "DegreeScaledX: a forward that computes from edge_index and x or an edge feature "
            "together (torch.Tensor.mul at ", f"test_frontends_pyg.py:{line})",
            "give each to propagate on its own and combine them in message")


class DegreePerNode(MessagePassing):
    """A value per node computed from edge_index given to propagate (read as deg_i)."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x, deg=degree(edge_index[1], x.size(0)))

    def message(self, x_j, deg_i):
        return x_j / deg_i.view(-1, 1)


@case("tracer", "a MessagePassing forward that gives propagate a value per node computed "
                "from edge_index", "error")
def test_forward_gives_propagate_a_node_value_of_graph_code():
    refused(lambda: run(DegreePerNode()),
            "DegreePerNode: propagate's argument 'deg' computed from edge_index",
            "one row per edge of the edge_index given to propagate (5)",
            "index a per-node value by edge_index's rows (deg[col]) in forward")


class LearnedGraphWeights(MessagePassing):
    """Graph code that reads a parameter: its gradient would be lost."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5
        self.temperature = nn.Parameter(torch.tensor(2.0))

    def forward(self, x, edge_index):
        deg = degree(edge_index[1], x.size(0), dtype=x.dtype)
        return self.propagate(edge_index, x=x, w=deg[edge_index[1]] * self.temperature)

    def message(self, x_j, w):
        return x_j * w.view(-1, 1)


@case("tracer", "a MessagePassing forward whose graph code reads a parameter", "error")
def test_graph_code_with_a_parameter():
    refused(lambda: run(LearnedGraphWeights()),
            "LearnedGraphWeights: a forward that computes from edge_index and a parameter "
            "together")


class BufferedGraphWeights(LearnedGraphWeights):
    """Graph code that reads a buffer (a traced value where the layer is traced: the
    tracer's own error about ``requires_grad`` came out)."""

    def __init__(self):
        super().__init__()
        del self.temperature
        self.register_buffer("p", torch.tensor(0.5))

    def forward(self, x, edge_index):
        deg = degree(edge_index[1], x.size(0), dtype=x.dtype).clamp(min=1)
        return self.propagate(edge_index, x=x, w=deg.pow(-self.p)[edge_index[1]])


@case("tracer", "a MessagePassing forward whose graph code reads a buffer", "error")
def test_graph_code_with_a_buffer():
    refused(lambda: run(BufferedGraphWeights()),
            "BufferedGraphWeights: a forward that computes from edge_index and a traced value "
            "(x, a parameter or a buffer) together")


class BranchOnValue(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_j):
        if x_j.sum() > 0:
            return x_j
        return -x_j


@case("tracer", "a MessagePassing message with Python control flow on a traced value", "error")
def test_message_control_flow():
    text = refused(lambda: run(BranchOnValue()), "BranchOnValue", error=sarc.DSLError)
    assert "test_frontends_pyg.py" in text   # at the user's line


class DropoutBeforePropagate(MessagePassing):
    def __init__(self):
        super().__init__(aggr="mean")
        self.in_channels = 5

    def forward(self, x, edge_index):
        x = nn.functional.dropout(x, 0.5, self.training)
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return x_j - x_i


@case("tracer", "a MessagePassing forward that draws dropout before propagate", "error")
def test_dropout_in_forward():
    refused(lambda: run(DropoutBeforePropagate()), "DropoutBeforePropagate",
            "dropout in forward before propagate")


@case("dsl", "a sparse adjacency instead of an edge_index given to an imported PyG conv",
      "error")
def test_sparse_adjacency():
    adj = torch.sparse_coo_tensor(EDGE_INDEX, torch.ones(5), (4, 4))
    refused(lambda: as_conv(pyg.GCNConv(5, 3))(X, adj), "GCNConv", "sparse adjacency")


@case("dsl", "a (x_src, x_dst) pair of node features given to an imported PyG conv", "error")
def test_bipartite_pair():
    refused(lambda: as_conv(pyg.SAGEConv(5, 3))((X, X[:2]), EDGE_INDEX), "SAGEConv",
            "(x_src, x_dst) pair")


class EdgeAttrOfUnknownWidth(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=x, edge_attr=edge_attr)

    def message(self, x_j, edge_attr):
        return x_j * edge_attr


@case("dsl", "a MessagePassing whose forward needs edge_attr, imported without its width",
      "error")
def test_edge_attr_width_unknown():
    refused(lambda: from_message_passing(EdgeAttrOfUnknownWidth()), "EdgeAttrOfUnknownWidth",
            "edge_attr of unknown width", "edge_dim=")


class TwoNodeFeatures(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 5, "pos": 3})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "as_conv of a sarc layer with two node features, neither named as PyG's x",
      "error")
def test_as_conv_ambiguous_node_feature():
    refused(lambda: as_conv(TwoNodeFeatures()), "TwoNodeFeatures", "2 node features",
            "as_conv(layer, node=...)")
    assert as_conv(TwoNodeFeatures(), node="h").node == "h"


@case("dsl", "as_conv of a module that is neither a sarc layer nor a MessagePassing, with "
      "the widths a MessagePassing takes", "error")
def test_as_conv_of_another_module_names_what_it_wraps():
    for kw in ({}, {"in_channels": 5}, {"edge_dim": 2}):
        refused(lambda: as_conv(nn.Linear(5, 4), **kw), "sarc.Layer or a PyG MessagePassing",
                "got Linear")
    refused(lambda: as_conv(TwoNodeFeatures(), node="h", in_channels=5),
            "in_channels= and edge_dim= are for a PyG MessagePassing", "TwoNodeFeatures")


class _NoWidth(MessagePassing):
    """A user's conv that does not record its input width (PyG's tutorial EdgeConv)."""

    def __init__(self):
        super().__init__(aggr="max")
        self.mlp = nn.Linear(10, 3)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return self.mlp(torch.cat([x_i, x_j - x_i], dim=-1))


@case("dsl", "a user's PyG conv without an in_channels attribute, converted without the width",
      "error")
def test_conv_without_its_width_says_to_give_it():
    refused(lambda: as_conv(_NoWidth())(X, EDGE_INDEX),
            "_NoWidth does not record its input width (no in_channels attribute)",
            "as_conv(conv, in_channels=...)")
    out = as_conv(_NoWidth(), in_channels=5)(X, EDGE_INDEX)
    assert out.shape == (4, 3)


class _ReturnsItsAttention(MessagePassing):
    """Returns its output and what its message stored on it, as GATConv's attention."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = 5

    def forward(self, x, edge_index):
        out = self.propagate(edge_index, x=x)
        return out, self._alpha

    def message(self, x_j):
        self._alpha = x_j.sum(-1)
        return x_j


@case("dsl", "a user's PyG conv whose forward returns a tuple (its output and its attention "
      "weights)", "error")
def test_conv_returning_a_tuple_is_refused_at_its_forward():
    import inspect
    line = inspect.getsourcelines(_ReturnsItsAttention.forward)[1]
    refused(lambda: as_conv(_ReturnsItsAttention())(X, EDGE_INDEX),
            "_ReturnsItsAttention: a forward that returns a tuple of 2 "
            f"(_ReturnsItsAttention.forward, at {__file__}:{line}) is not supported",
            "return it alone")


@pytest.mark.parametrize("x", [None, torch.arange(5)], ids=["none", "ids"])
@case("dsl", "a featureless PyG RGCNConv (x=None or node ids, as PyG's R-GCN example)", "error")
def test_featureless_rgcn(x):
    conv = pyg.RGCNConv(5, 4, num_relations=3)
    refused(lambda: as_conv(conv)(x, torch.tensor([[0, 1, 2], [1, 2, 0]]),
                                  torch.tensor([0, 1, 2])),
            "RGCNConv: x=", "(a featureless conv, as RGCNConv's x=None or node ids)")


@case("dsl", "a lazy PyG conv (in_channels=-1)", "error")
def test_lazy_conv():
    refused(lambda: from_message_passing(pyg.SAGEConv(-1, 3)),
            "SAGEConv: in_channels=-1 (a lazy conv) is not supported", "build the conv with "
            "its input width")


@case("dsl", "a conv called through as_conv with a fourth argument that is not PyG's size "
      "(RGATConv's edge_attr after edge_type)", "error")
@pytest.mark.parametrize("size", [torch.randn(4, 2), torch.tensor([4.0, 4.0]), "4", (4, 4, 4)])
def test_a_fourth_argument_that_is_no_size_is_refused_by_name(size):
    refused(lambda: as_conv(pyg.GCNConv(5, 3))(X, EDGE_INDEX, None, size), "GCNConv",
            "is not a node count or a (num_src, num_dst) pair", "forward(x, edge_index")


def test_a_size_as_a_pair_or_a_tensor_of_two_is_the_node_count():
    conv = pyg.GCNConv(5, 3)
    want = as_conv(conv)(X, EDGE_INDEX)
    for size in (4, (4, 4), [4, 4], torch.tensor([4, 4]), (np.int64(4), 4)):
        torch.testing.assert_close(as_conv(conv)(X, EDGE_INDEX, None, size), want)


@case("dsl", "node features of another shape than the conv reads (DNAConv's [N, layers, C])",
      "error")
def test_node_features_of_another_shape_are_refused_before_the_trace():
    refused(lambda: as_conv(pyg.DNAConv(5, heads=1), in_channels=5)(torch.randn(4, 2, 5),
                                                                     EDGE_INDEX),
            "DNAConv", "x of shape [4, 2, 5]", "[num_nodes, 5]")
