"""DGL modules sarc's front end cannot lower, and what a DGL user's data does to training.

The front-end cases need DGL (.venv-dgl) and skip without it; every error names the
module class and the construct, at the line that used it.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import sarc
from sarc.errors import DSLError, GraphError

from .catalogue import case

IN = 5


def _dgl():
    return pytest.importorskip("dgl")


def _graph():
    return sarc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 0]), 4)


def _refused(module, *needles, node=IN, edge=None, **feats):
    from sarc.frontends.dgl import from_dgl_module
    layer = from_dgl_module(module, node={"feat": node}, edge=edge or {})
    with pytest.raises(DSLError) as err:
        layer(_graph(), torch.randn(4, node), **feats)
    text = str(err.value)
    assert f"{type(module).__name__}: " in text, text
    for n in (type(module).__name__, *needles):
        assert n in text, (n, text)
    return err.value


@case("tracer", "DGL `SAGEConv(aggregator_type='lstm')` (an LSTM over the mailbox)",
      "error-at-line")
def test_sage_lstm_is_refused_at_the_mailbox():
    _dgl()
    from dgl.nn.pytorch import SAGEConv
    err = _refused(SAGEConv(IN, 3, "lstm"), "nodes.mailbox['m']", "sum")
    assert err.loc is not None and err.loc.file.endswith("sageconv.py")


@case("tracer", "`dgl.to_homogeneous(g)` in a DGL module's forward", "error-at-line")
def test_to_homogeneous_is_refused():
    dgl = _dgl()

    class ToHomogeneous(nn.Module):
        def forward(self, g, feat):
            return feat + dgl.to_homogeneous(g).ndata["h"]

    err = _refused(ToHomogeneous(), "dgl.to_homogeneous")
    assert err.loc.file == __file__


@case("tracer", "`g.ndata[...]` written in a DGL module's forward", "error-at-line")
def test_ndata_is_refused():
    _dgl()

    class NData(nn.Module):
        def forward(self, g, feat):
            g.ndata["h"] = feat
            return feat

    err = _refused(NData(), "g.ndata", "srcdata")
    assert err.loc.file == __file__


@case("tracer", "`torch.rand` in a DGL module's forward", "error-at-line")
def test_random_draw_is_refused():
    dgl = _dgl()

    class Noisy(nn.Module):
        def forward(self, g, feat):
            with g.local_scope():
                g.srcdata["h"] = feat * torch.rand(IN)
                g.update_all(dgl.function.copy_u("h", "m"), dgl.function.sum("m", "h"))
                return g.dstdata["h"]

    _refused(Noisy(), "torch.rand")


@case("tracer", "a DGL module storing a tensor that is not computed from its inputs in "
      "`g.srcdata`", "error-at-line")
def test_plain_tensor_in_graph_data_is_refused():
    _dgl()

    class Constant(nn.Module):
        def forward(self, g, feat):
            g.srcdata["h"] = torch.ones(4, IN)
            return feat

    _refused(Constant(), "g.srcdata['h']", "Tensor")


@case("tracer", "DGL `RelGraphConv(regularizer='bdd')`", "error-at-line")
def test_block_diagonal_relgraphconv_is_refused():
    _dgl()
    from dgl.nn.pytorch import RelGraphConv
    _refused(RelGraphConv(4, 4, 2, regularizer="bdd", num_bases=2), "regularizer='bdd'",
             node=4, edge={"etypes": sarc.INDEX}, etypes=torch.zeros(4, dtype=torch.int64))


@case("tracer", "DGL `GATConv(...)(g, x, edge_weight=w)` (`Tensor.tile` on the weights)",
      "error-at-line")
def test_gat_edge_weight_is_refused():
    _dgl()
    from dgl.nn.pytorch import GATConv
    _refused(GATConv(IN, 3, 2, allow_zero_in_degree=True), "Tensor.tile",
             edge={"edge_weight": ()}, edge_weight=torch.ones(4))


@case("tracer", "a DGL module returning a tuple (`get_attention=True`)", "error-at-line")
def test_tuple_output_is_refused():
    _dgl()
    from dgl.nn.pytorch import GATConv
    from sarc.frontends.dgl import from_dgl_module

    class WithAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.gat = GATConv(IN, 3, 2, allow_zero_in_degree=True)

        def forward(self, g, feat):
            return self.gat(g, feat, get_attention=True)

    with pytest.raises(DSLError, match="WithAttention: forward returned a tuple"):
        from_dgl_module(WithAttention(), node={"feat": IN})(_graph(), torch.randn(4, IN))


@case("dsl", "a graph with a node without in-edges for DGL `GraphConv()` "
      "(`allow_zero_in_degree=False`)", "error")
def test_zero_in_degree_check_is_kept():
    _dgl()
    from dgl.nn.pytorch import GraphConv
    from sarc.frontends.dgl import from_dgl_module
    layer = from_dgl_module(GraphConv(IN, 3), node={"feat": IN})
    with pytest.raises(GraphError, match="GraphConv: there are nodes without incoming edges.*"
                                         "allow_zero_in_degree=True"):
        layer(_graph(), torch.randn(4, IN))   # node 3 has no in-edge
    loops = torch.arange(4)
    g = sarc.Graph.from_edges(torch.cat([torch.tensor([0, 1, 2]), loops]),
                              torch.cat([torch.tensor([1, 2, 0]), loops]), 4)
    assert layer(g, torch.randn(4, IN)).shape == (4, 3)
