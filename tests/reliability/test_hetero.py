"""Heterogeneous models: a HeteroConv or TypedInput that cannot run as written, and node
types that do not fit the graph, are errors naming the relation or the type (at the
user's line for a model's construction), never a wrong result."""
from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import numpy as np
import pytest
import torch
from torch import nn

import sarc

from model_files import MEAN

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc
from .test_tracer import expect_error_at

THIS = Path(__file__).resolve()


class Mean(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.mean(msg.m)

    def update(self, dst, agg):
        return self.lin(agg.agg)


def expect(call, marker: str, *parts: str) -> sarc.DSLError:
    return expect_error_at(call, marker, *parts, path=THIS)


def two_widths():
    return sarc.HeteroConv({0: Mean(4, 8), 1: Mean(4, 6)}, "sum")  # ERR:widths


@case("dsl", "HeteroConv's relation layers of different output widths, aggregate sum",
      "error-at-line")
def test_layers_of_different_widths():
    expect(two_widths, "widths", "aggregate 'sum' combines outputs of one shape",
           "relation 0's layer returns [8]", "relation 1's [6]")


def by_unknown_name():
    return sarc.HeteroConv({"cites": Mean(4, 8)}, relations=["writes", "about"])  # ERR:name


@case("dsl", "a HeteroConv relation named by a name its relations=[...] lacks", "error-at-line")
def test_relation_name_not_among_the_relations():
    expect(by_unknown_name, "name", "relation 'cites' is not one of the 2 relation names")


def not_a_layer():
    return sarc.HeteroConv({0: Mean(4, 8), 1: nn.Linear(4, 8)})  # ERR:module


@case("dsl", "HeteroConv's `relations=` a string, or a list naming an edge type twice",
      "error-at-line")
def test_relations_a_string_or_a_name_twice():
    """A string's letters were taken for the names (an internal ValueError at its name's
    look-up); a name given twice named the first id."""
    expect(lambda: sarc.HeteroConv({"follows": Mean(4, 4)},  # ERR:relations-str
                                   relations="follows"),
           "relations-str", "relations= takes the edge types' names in id order, a "
           "list of str, got 'follows'")
    expect(lambda: sarc.HeteroConv({"a": Mean(4, 4)},  # ERR:relations-twice
                                   relations=["a", "b", "a"]),
           "relations-twice", "relations= names 'a' twice")


class ReadsEtype(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4}, edge={"etype": ()})

    def message(self, src, dst, edge):
        return src.h * edge.etype.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "a HeteroConv relation layer that declares the feature `etype`, which "
      "HeteroConv takes itself", "error-at-line")
def test_a_relation_layer_declaring_etype_is_refused():
    """It was refused at the call as a feature not given (HeteroConv keeps etype)."""
    expect(lambda: sarc.HeteroConv({0: ReadsEtype()}),  # ERR:etype-feature
           "etype-feature", "relation 0 declares feature 'etype', which HeteroConv takes "
           "itself")


@case("dsl", "a HeteroConv relation given a torch module, not a sarc.Layer", "error-at-line")
def test_relation_module_not_a_layer():
    expect(not_a_layer, "module", "the layer of relation 1 is a Linear, not a sarc.Layer")


def unknown_aggregate():
    return sarc.HeteroConv({0: Mean(4, 8)}, aggregate="stack")  # ERR:aggregate


@case("dsl", "HeteroConv with an aggregate it does not know (`stack`)", "error-at-line")
def test_unknown_aggregate():
    expect(unknown_aggregate, "aggregate", "unknown aggregate 'stack'", "sum, mean, max, min")


@case("dsl", "a relation whose destinations are of two node types", "error")
def test_relation_into_two_node_types():
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    conv = sarc.HeteroConv({0: Mean(2, 2)})
    with pytest.raises(sarc.GraphError, match=r"relation 0 has destinations of node types 0, 1"):
        conv(g, torch.randn(3, 2), etype=torch.zeros(3, dtype=torch.int64),
             ntype=torch.tensor([0, 1, 0]))


@case("dsl", "TypedInput on rows of a node type it has no width for", "error")
def test_typed_input_unknown_type():
    proj = sarc.TypedInput({0: 3, 1: 2}, 4)
    with pytest.raises(sarc.GraphError, match=r"no input width for node type 2 \(widths are "
                                              r"given for types 0, 1\)"):
        proj(torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1]))


MISSING_RELATION = "import torch.nn.functional as F\n" + MEAN + dedent("""
    class Net(nn.Module):
        def __init__(self, f, c):
            super().__init__()
            self.conv = sarc.HeteroConv({3: Mean(f, c), 95: Mean(f, c)})

        def forward(self, g, x, etype, ntype=None):
            return self.conv(g, x, etype=etype, ntype=ntype)

    HPARAMS = {"dataset": "aifb", "embedding_dim": 4, "epochs": 1}

    def build_model(in_feats, num_classes, **_):
        return Net(in_feats, num_classes)
""")


@case("cli", "`sarc train` of a HeteroConv over a relation id the graph lacks (95 on AIFB's "
      "90)", "error")
def test_relation_the_graph_lacks(tmp_path):
    model = tmp_path / "missing_relation.py"
    model.write_text(MISSING_RELATION)
    proc = run_sarc("train", model, "--threads", "1")
    assert_error(proc, "edges of edge types 0, 1, 2, 4",
                 "relation 95 has a layer but no edges in the graph")
    assert not any(line.startswith("epoch") for line in proc.stdout.splitlines()), proc.stdout


@case("dataset", "an `ntype` array with a node type >= `num_ntypes`", "error")
def test_node_type_out_of_range(tmp_path):
    with np.load(ROOT / "sarc" / "data" / "aifb.npz") as d:
        arrays = {k: d[k] for k in d.files}
    ntype = arrays["node_is_literal"].astype(np.int64)
    ntype[7] = 3
    np.savez(tmp_path / "bad.npz", **arrays, ntype=ntype, num_ntypes=np.int64(2))
    proc = run_sarc("train", ROOT / "models" / "hetero_sage.py", "--dataset",
                    tmp_path / "bad.npz", "--threads", "1")
    assert_error(proc, "bad.npz", "ntype of node 7 is 3, outside [0, 2) (num_ntypes = 2)")


@case("dsl", "`TypedInput(h, ntype)` between layers of a mini-batch step (ntype of the "
      "step's input rows, more than h's)", "error")
def test_typed_input_given_more_node_types_than_rows_says_how_to_cut_them():
    proj = sarc.TypedInput({0: 3, 1: 3}, 4)
    with pytest.raises(sarc.GraphError, match=r"ntype has shape \[5\], but x has 3 rows .* "
                                              r"ntype\[:h.shape\[0\]\]"):
        proj(torch.randn(3, 3), torch.tensor([0, 1, 0, 1, 0]))


@case("cli", "`sarc train` of a HeteroConv with a layer for every AIFB relation and one "
      "more (90), past every edge type the edges carry: a relation the graph lacks unless "
      "its node type is given", "error")
def test_a_relation_without_edges_and_node_types(tmp_path):
    model = tmp_path / "extra_relation.py"
    model.write_text(MISSING_RELATION.replace(
        "{3: Mean(f, c), 95: Mean(f, c)}", "{r: Mean(f, c) for r in range(91)}"))
    proc = run_sarc("train", model, "--threads", "1")
    assert_error(proc, "relation 90 is past every edge type the graph's edges carry (0..89): "
                 "a relation the graph lacks?", "dst_types={90: ...}")
    assert not any(line.startswith("epoch") for line in proc.stdout.splitlines()), proc.stdout
    given = tmp_path / "extra_relation_typed.py"
    given.write_text(model.read_text().replace("for r in range(91)}", "for r in range(91)}, "
                                               "dst_types={90: 0}"))
    proc = run_sarc("train", given, "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.startswith("epoch") for line in proc.stdout.splitlines()), proc.stdout
