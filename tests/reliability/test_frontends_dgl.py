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


@case("tracer", "`dgl.mean_nodes(g, ...)` (a readout over batched graphs) in a DGL module's "
      "forward", "error-at-line")
def test_a_dgl_function_reading_the_graph_is_named():
    """It said only "g.nodes is not supported": an attribute the user never wrote."""
    dgl = _dgl()

    class Readout(nn.Module):
        def forward(self, g, feat):
            with g.local_scope():
                g.ndata["h"] = feat
                return feat + dgl.mean_nodes(g, "h")

    err = _refused(Readout(), "g.nodes, which dgl.readout.mean_nodes reads",
                   "DGL's batched graphs, heterographs and graph internals are not modelled")
    assert err.loc.file == __file__


@case("tracer", "`g.ndata[...]` an update_all wrote, sent again by a second update_all (a "
      "second hop in one DGL module)", "error-at-line")
def test_second_hop_is_refused():
    dgl = _dgl()

    class TwoHops(nn.Module):
        def forward(self, g, feat):
            g.ndata["h"] = feat
            g.update_all(dgl.function.copy_u("h", "m"), dgl.function.sum("m", "h"))
            g.update_all(dgl.function.copy_u("h", "m"), dgl.function.sum("m", "h"))
            return g.ndata["h"]

    err = _refused(TwoHops(), "second round of message passing")
    assert err.loc.file == __file__


@case("tracer", "`dgl.reverse(g)` in a DGL module's forward (the graph is not a block)",
      "error-at-line")
def test_reverse_is_refused_as_a_graph_rewrite():
    """Not DGL's own "Reversing a block graph" error: the user's graph is no block."""
    dgl = _dgl()

    class Reversed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(IN, 3)

        def forward(self, g, feat):
            rg = dgl.reverse(g)
            rg.ndata["h"] = self.lin(feat)
            rg.update_all(dgl.function.copy_u("h", "m"), dgl.function.sum("m", "h"))
            return rg.ndata["h"]

    err = _refused(Reversed(), "dgl.reverse is not supported")
    assert "block" not in str(err).split("(")[0]
    assert err.loc.file == __file__


@case("tracer", "`torch.arange(g.num_edges())` in a DGL module's forward (edge ids over a "
      "graph size)", "error-at-line")
def test_arange_over_a_graph_size_is_refused_at_its_line():
    """A torch call sarc passes on unchanged (no traced value among its arguments) that
    torch refuses is the user's line's error, with the graph-size hint, not a TypeError
    from sarc's wrapper."""
    dgl = _dgl()
    from dgl.nn.functional import edge_softmax

    class EdgeIds(nn.Module):
        def forward(self, g, feat):
            with g.local_scope():
                g.ndata["h"] = feat
                g.apply_edges(dgl.function.u_dot_v("h", "h", "s"))
                g.edata["a"] = edge_softmax(g, g.edata["s"],
                                            eids=torch.arange(g.num_edges()))
                g.update_all(dgl.function.u_mul_e("h", "a", "m"), dgl.function.sum("m", "h"))
                return g.ndata["h"]

    err = _refused(EdgeIds(), "arange", "graph size")
    assert err.loc.file == __file__ and "torch.arange" in err.loc.source_line()


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


@case("tracer", "DGL `GATConv(...)(g, x, edge_weight=w)` with two weights per edge "
                 "(`Tensor.tile` over the rows; an [E] weight runs)", "error-at-line")
def test_gat_edge_weight_is_refused():
    """An [E] weight is traced (``tests/frontends/test_dgl_zoo.py``); one of 2 values per edge
    would be tiled over the rows (DGL's own call fails on it too)."""
    _dgl()
    from dgl.nn.pytorch import GATConv
    _refused(GATConv(IN, 3, 2, allow_zero_in_degree=True), "tile(1, 2, 1) repeats the rows of "
             "an edge value", edge={"edge_weight": (2,)}, edge_weight=torch.ones(4, 2))


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

    with pytest.raises(DSLError, match=r"WithAttention: forward returned an edge value \[2, 1\] "
                                       r"as output 2 of 2, not a value per destination node; "
                                       r".*get_attention=True's attention"):
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


# --- a user's edge data and the trainer --------------------------------------------------------
# (a) self loops need a value per edge feature the model reads; (b) a model is given the edge
# features its layers declare, whatever else the graph or partition carries.

@case("partition", "a float edge feature (`edge_weight`) on a graph that gets self loops",
      "exact")
def test_self_loops_fill_a_float_edge_feature_with_one():
    from sarc.datasets import SELF_LOOP_FILL, add_self_loops_with_data
    src, dst = torch.tensor([0, 1, 1, 2]), torch.tensor([1, 1, 2, 0])
    w = torch.tensor([0.5, 7.0, 2.0, 3.0])
    s, d, data = add_self_loops_with_data(src, dst, 3, {"edge_weight": w})
    assert s.tolist() == [0, 1, 2, 0, 1, 2] and d.tolist() == [1, 2, 0, 0, 1, 2]
    assert SELF_LOOP_FILL == 1.0
    assert data["edge_weight"].tolist() == [0.5, 2.0, 3.0, 1.0, 1.0, 1.0]  # old loop dropped


@case("partition", "an integer edge feature (edge types) read by a model on a graph that "
      "gets self loops", "error")
def test_self_loops_refuse_an_integer_edge_feature_by_name():
    from sarc.datasets import add_self_loops_with_data
    with pytest.raises(GraphError, match="'etype'.*self loop has no edge type.*self_loops=False"):
        add_self_loops_with_data(torch.tensor([0]), torch.tensor([1]), 2,
                                 {"etype": torch.tensor([1])})


@case("cli", "a graph carrying `etype` for a model whose layers read no edge feature (GCN)",
      "exact")
def test_a_model_is_given_only_the_edge_features_its_layers_declare():
    from gcn import build_model as gcn
    from rgcn import build_model as rgcn
    from sarc.dsl import edge_inputs_for
    carried = {"etype": torch.zeros(3, dtype=torch.int64), "edge_weight": torch.ones(3),
               "norm": torch.ones(3)}
    assert edge_inputs_for(gcn(4, 2), carried) == {}
    # R-GCN's layers declare etype and norm; its forward takes etype and computes norm
    assert list(edge_inputs_for(rgcn(4, 2, num_etypes=2), carried)) == ["etype"]


def _train(*argv):
    from .harness import run_sarc
    return run_sarc("train", "models/gcn.py", "--dataset", "aifb", "--epochs", "1",
                    "--set", "embedding_dim=4", *argv, timeout=600)


def test_gcn_trains_on_a_relational_graph_without_self_loops():
    proc = _train("--set", "self_loops=False")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_gcn_trains_on_a_relational_graph_with_self_loops():
    proc = _train()   # GCN's HPARAMS add self loops; the edge types are not GCN's input
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_gcn_trains_on_two_workers_of_a_relational_graph():
    proc = _train("--workers", "2", "--method", "random")
    assert proc.returncode == 0, proc.stderr[-2000:]


@case("tracer", "the indices of a DGL reduce UDF's `nodes.mailbox[...].max(1)`, unpacked and "
      "used", "error-at-line")
def test_mailbox_argmax_indices_are_refused_where_used():
    dgl = _dgl()

    def reduce(nodes):
        values, indices = nodes.mailbox["m"].max(1)
        return {"h": values * indices}

    class ArgMax(nn.Module):
        def forward(self, g, feat):
            with g.local_scope():
                g.srcdata["h"] = feat
                g.update_all(dgl.function.copy_u("h", "m"), reduce)
                return g.dstdata["h"]

    err = _refused(ArgMax(), "the arg-max / arg-min indices")
    assert err.loc.file == __file__


class _FeatAndWeight(nn.Module):
    def forward(self, g, feat, w, scale=1.0):
        return feat * scale


@case("dsl", "`from_dgl_module(module, node=..., edge=...)` naming no argument of the module's "
      "forward, or leaving a required one undeclared", "error-at-line")
def test_features_that_are_not_forward_arguments_are_refused():
    _dgl()
    from sarc.frontends.dgl import from_dgl_module
    with pytest.raises(DSLError, match=r"_FeatAndWeight: node=\{'x': \.\.\.\} is not an argument "
                                       r"of its forward\(graph, feat, w, scale\)") as err:
        from_dgl_module(_FeatAndWeight(), node={"x": IN}, edge={"w": ()})
    assert err.value.loc.file == __file__
    with pytest.raises(DSLError, match=r"_FeatAndWeight: forward's argument 'w' \(no default\) "
                                       r"is declared in neither node= nor edge="):
        from_dgl_module(_FeatAndWeight(), node={"feat": IN})


class _ReturnsSrcData(nn.Module):
    """Reads update_all's result back through g.srcdata (the sources' own 'h' on a block)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        import dgl.function as fn
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            return g.srcdata["h"]


@case("tracer", "a DGL module returning update_all's result through `g.srcdata` (a block "
      "keeps the sources' own value there)", "error-at-line")
def test_update_alls_result_read_through_srcdata_says_to_read_dstdata():
    _dgl()
    err = _refused(_ReturnsSrcData(), "g.srcdata['h'] reads per source node what update_all "
                   "computed per destination node", "on a block", "read it as g.dstdata['h']")
    assert err.loc is not None and err.loc.file == __file__ and "return g.srcdata" in str(err)


class _HoldsItsGraph(nn.Module):
    """DGL's GAT tutorial style: the graph kept on the module, forward(h)."""

    def __init__(self, g):
        super().__init__()
        self.g = g
        self.lin = nn.Linear(4, 2)

    def forward(self, h):
        return self.lin(h)


@case("dsl", "a DGL module whose forward takes no graph (forward(h), the graph on self.g)",
      "error")
def test_a_module_holding_its_graph():
    pytest.importorskip("dgl")
    from sarc.frontends.dgl import from_dgl_module
    with pytest.raises(DSLError, match=r"_HoldsItsGraph: forward\(h\) takes the feature 'h' "
                                       r"first, where sarc gives it the graph"):
        from_dgl_module(_HoldsItsGraph(None), node={"h": 4})


class _ByEdgeCount(nn.Module):
    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = feat
            g.update_all(_dgl().function.copy_u("h", "m"), _dgl().function.sum("m", "o"))
            return g.dstdata["o"] / g.num_edges()


class _ByNodeCount(nn.Module):
    def forward(self, g, feat):
        return feat / g.num_nodes()


@case("tracer", "a DGL module dividing by `g.num_edges()` (a graph size as a number)",
      "error-at-line")
def test_a_graph_size_as_a_number_is_named_as_written():
    _dgl()
    err = _refused(_ByEdgeCount(), "g.num_edges() used as a number", "torch.ones(g.num_edges(), 1)")
    assert err.loc.file == __file__


@case("tracer", "`g.num_nodes()` in a DGL module (a block has two node counts)",
      "error-at-line")
def test_num_nodes_says_which_count_to_write():
    _dgl()
    err = _refused(_ByNodeCount(), "g.num_nodes()", "g.num_src_nodes()", "g.num_dst_nodes()")
    assert err.loc.file == __file__
