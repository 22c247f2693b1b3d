"""Mistakes in a DSL layer are errors at the user's line, never tracebacks.

The same marker scheme as ``test_tracer.py``: each faulty line ends with ``# ERR:name``
and the ``sarc.DSLError`` must point at it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import sarc

from .catalogue import case
from .test_tracer import N, expect_error_at, graph

THIS = Path(__file__).resolve()


def expect(call, marker: str, *parts: str) -> sarc.DSLError:
    return expect_error_at(call, marker, *parts, path=THIS)


class AssignBeforeInit(sarc.Layer):
    def __init__(self):
        self.lin = nn.Linear(3, 3)  # ERR:assign-before-init
        super().__init__(node={"h": 3})


@case("dsl", "a Layer's __init__ assigns a module before calling super().__init__",
      "error-at-line")
def test_module_assigned_before_super_init():
    expect(AssignBeforeInit, "assign-before-init",
           "AssignBeforeInit.__init__ must call super().__init__(node=..., edge=...) "
           "before assigning self.lin")


class NeverInit(sarc.Layer):
    def __init__(self, width):  # ERR:no-init
        self.width = width

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "a Layer subclass whose __init__ never calls super().__init__, then called",
      "error-at-line")
def test_layer_called_without_super_init():
    expect(lambda: NeverInit(3)(graph(), torch.randn(N, 3)), "no-init",
           "NeverInit.__init__ must call super().__init__(node=..., edge=...) first")


class ReduceWithDim(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m, 1)  # ERR:reduce-dim


@case("dsl", "`sarc.sum(msg.m, 1)`: an extra argument to a graph reduction", "error-at-line")
def test_reduction_with_extra_argument():
    expect(lambda: ReduceWithDim().trace(), "reduce-dim", "sarc.sum: too many positional arguments")


class ReduceOfList(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.max([msg.m])  # ERR:reduce-list


@case("dsl", "`sarc.max([msg.m])`: a list where a traced edge value belongs", "error-at-line")
def test_reduction_of_a_list():
    expect(lambda: ReduceOfList().trace(), "reduce-list",
           "sarc.max takes a traced edge value, got list")


class DropoutTraining(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return sarc.dropout(src.h, 0.5, training=False)  # ERR:sarc-dropout

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "`sarc.dropout(x, p, training=False)` (sarc.dropout follows the layer's mode)",
      "error-at-line")
def test_sarc_dropout_has_no_training_argument():
    expect(lambda: DropoutTraining().trace(), "sarc-dropout",
           "sarc.dropout: got an unexpected keyword argument 'training'")


class LeakyInplace(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return sarc.leaky_relu(src.h, 0.2, inplace=True)  # ERR:sarc-inplace

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "`sarc.leaky_relu(x, 0.2, inplace=True)`", "error-at-line")
def test_sarc_function_checks_its_arguments():
    expect(lambda: LeakyInplace().trace(), "sarc-inplace",
           "sarc.leaky_relu: argument inplace=True is not supported in a sarc layer")


class TypedLinearConstantType(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"etype": sarc.INDEX})
        self.rel = sarc.TypedLinear(3, 2, 2)

    def message(self, src, dst, edge):
        return self.rel(src.h, 1)  # ERR:typed-const

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "`TypedLinear(src.h, 1)`: a constant where a per-row type id belongs",
      "error-at-line")
def test_typed_linear_needs_traced_types():
    expect(lambda: TypedLinearConstantType().trace(), "typed-const",
           "TypedLinear needs a traced value and a traced int64 type per row (e.g. edge.etype)",
           "got int")


class IndexNodeValue(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": (2, 3)}, edge={"etype": sarc.INDEX})

    def message(self, src, dst, edge):
        return src.h[edge.etype]  # ERR:index-graph

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "`src.h[edge.etype]`: a graph value indexed by a traced value", "error-at-line")
def test_indexing_a_graph_value_with_a_traced_value():
    expect(lambda: IndexNodeValue().trace(), "index-graph",
           "only parameter tables can be indexed per row; got an edge value")


class ModuleListByType(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"etype": sarc.INDEX})
        self.lins = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

    def message(self, src, dst, edge):
        return self.lins[edge.etype](src.h)  # ERR:modulelist

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "`self.lins[edge.etype]`: a Python list picked by a per-edge type",
      "error-at-line")
def test_python_list_indexed_by_a_traced_value():
    expect(lambda: ModuleListByType().trace(), "modulelist",
           "a traced value used as a Python int", "sarc.TypedLinear")


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_training_mode_is_restored_after_tracing(training):
    layer = ModuleListByType().train(training)
    with pytest.raises(sarc.DSLError):
        layer.trace()
    assert all(m.training is training for m in layer.modules())


MISSPELT_MODEL = """\
import sarc
from torch import nn


class Mean(sarc.Layer):
    def __init__(self, in_feats, out_feats):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats)

    def message(self, src, dst, edge):
        return self.lin(src.h)

    def reduce(self, msg):
        return sarc.meen(msg.m)


class Net(nn.Module):
    def __init__(self, in_feats, num_classes):
        super().__init__()
        self.conv = Mean(in_feats, num_classes)

    def forward(self, g, x):
        return self.conv(g, x)


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
"""


@case("dsl", "a misspelt name in reduce (`sarc.meen`), through `sarc compile` and `sarc train`",
      "error-at-line")
@pytest.mark.parametrize("command", ["compile", "train"])
def test_a_python_error_in_the_users_function_is_one_line_at_its_line(tmp_path, command):
    from .harness import assert_error, run_sarc
    model = tmp_path / "misspelt.py"
    model.write_text(MISSPELT_MODEL)
    argv = ["--out", tmp_path / "out"] if command == "compile" else ["--epochs", "1"]
    proc = run_sarc(command, model, *argv)
    assert_error(proc, "misspelt.py:14 (in reduce)", "AttributeError", "meen")
    assert not (tmp_path / "out").exists()


class EdgeDegree(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"in_degree": ()})  # ERR:edge-builtin

    def message(self, src, dst, edge):
        return src.h * edge.in_degree.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "an edge feature named `in_degree` or `out_degree` (sarc's built-in node "
             "degrees)", "error-at-line")
def test_edge_feature_named_like_a_builtin_degree():
    """It was bound to the node degrees: a wrong result where there are as many edges as
    nodes, an error in a kernel elsewhere."""
    expect(EdgeDegree, "edge-builtin", "edge feature 'in_degree'", "built-in")


class FeatureNamedG(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"g": ()})  # ERR:feature-g

    def message(self, src, dst, edge):
        return src.h * edge.g.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "a feature named `g` or `self` (the names of forward's own arguments)",
      "error-at-line")
def test_feature_named_like_an_argument_of_forward():
    expect(FeatureNamedG, "feature-g", "feature 'g'", "layer(g, ...)")


class ShadowsPrecision(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.precision = 0.5  # ERR:shadow

    def message(self, src, dst, edge):
        return src.h * self.precision

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "a layer attribute named like a method sarc calls (`self.precision = 0.5`)",
      "error-at-line")
def test_attribute_shadowing_a_layer_method():
    expect(ShadowsPrecision, "shadow", "self.precision", "sarc.Layer.precision")
