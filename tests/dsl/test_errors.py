"""Bad layers and bad data give clear errors that point at the user's code.

The bad layers are written in this file, each faulty line tagged with a marker
comment (``# ERR:name``); ``line_of`` finds the line, and each test checks that
the ``sarc.DSLError`` carries that line (``.loc``) and that its text names
``test_errors.py:LINE``. Graph and feature errors are ``sarc.GraphError``, a
``ValueError``, raised before any kernel runs.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from difftest import BACKENDS
from torch import nn

import sarc

THIS = Path(__file__).resolve()
SOURCE = THIS.read_text().splitlines()


def line_of(marker: str) -> int:
    """The 1-based line carrying ``# ERR:<marker>`` (exactly one)."""
    tag = f"# ERR:{marker}"
    hits = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {tag!r} found {len(hits)} times"
    return hits[0]


def expect_dsl_error(layer_or_call, marker: str, *phrases: str) -> sarc.DSLError:
    """Tracing (or calling) raises a DSLError at the marked line whose text has ``phrases``."""
    with pytest.raises(sarc.DSLError) as info:
        layer_or_call()
    err = info.value
    line = line_of(marker)
    assert err.loc is not None, f"no location in: {err}"
    assert os.path.samefile(err.loc.file, THIS), f"located in {err.loc.file}, not the user's file"
    assert err.loc.line == line, f"points at line {err.loc.line}, the fault is at {line}: {err}"
    text = str(err)
    assert f"test_errors.py:{line}" in text
    assert SOURCE[line - 1].strip() in text, "the message should quote the user's line"
    for phrase in phrases:
        assert re.search(phrase, text), f"{phrase!r} not in: {text}"
    return err


def graph(n: int = 4) -> sarc.Graph:
    return sarc.Graph.from_edges([0, 1, 2, 3, 1], [1, 2, 3, 0, 0], n)


# --- layers with mistakes ---------------------------------------------------------------------

class MixInReduce(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m) + msg.m  # ERR:mix-reduce


class MixSrcDstNodes(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + sarc.max(dst.h)  # ERR:reduce-node


class LinearMismatch(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(5, 3)

    def message(self, src, dst, edge):
        return self.lin(src.h)  # ERR:linear

    def reduce(self, msg):
        return sarc.sum(msg.m)


class Undeclared(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"w": ()})

    def message(self, src, dst, edge):
        return src.hh  # ERR:undeclared

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UndeclaredEdge(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h * edge.weight  # ERR:undeclared-edge

    def reduce(self, msg):
        return sarc.sum(msg.m)


class EdgeFeatureAtTheNodes(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"w": ()})

    def message(self, src, dst, edge):
        return src.h * edge.w.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg * dst.w.unsqueeze(-1)  # ERR:edge-at-node


class NodeFeatureOnTheEdges(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return edge.h  # ERR:node-on-edge

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UnusedMessage(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        used = src.h
        unused = dst.h * 2.0  # ERR:unused
        return {"used": used, "unused": unused}

    def reduce(self, msg):
        return sarc.sum(msg.used)


class NonEdgeMessage(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.p = nn.Parameter(torch.ones(3))

    def message(self, src, dst, edge):
        return self.p * 2.0  # ERR:non-edge

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UnsupportedTorch(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return torch.cumsum(src.h, dim=-1)  # ERR:torch-fn

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UnsupportedFunctional(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return F.local_response_norm(src.h, 2)  # ERR:functional

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UnsupportedMethod(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h.cumsum(-1)  # ERR:method

    def reduce(self, msg):
        return sarc.sum(msg.m)


class DataDependentIf(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        if src.h.sum(-1):  # ERR:if
            return src.h
        return dst.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


class ForeignTensor(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.scale = torch.ones(3)   # a plain tensor, not a parameter

    def message(self, src, dst, edge):
        return src.h * self.scale  # ERR:foreign

    def reduce(self, msg):
        return sarc.sum(msg.m)


class ForeignArray(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.scale = np.ones(3)   # a numpy array, not a buffer

    def message(self, src, dst, edge):
        return self.scale * src.h  # ERR:foreign-numpy

    def reduce(self, msg):
        return sarc.sum(msg.m)


class SoftmaxNotAggregated(sarc.Layer):
    """Returns the attention weights instead of aggregating the messages they weigh: it was
    reported as "message 'v' is never used", at the message."""

    def __init__(self):
        super().__init__(node={"h": 6})

    def message(self, src, dst, edge):
        return {"v": src.h, "s": src.h.sum(-1)}

    def reduce(self, msg):
        return sarc.edge_softmax(msg.s)  # ERR:softmax-result


class MisspeltAutodiff(sarc.Layer):
    """Accepted when made; a ValueError traceback from the compiler at the first call."""

    def __init__(self):
        super().__init__(node={"h": 3}, autodiff="IR")  # ERR:autodiff

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


class MisspeltBackend(MisspeltAutodiff):
    def __init__(self):
        sarc.Layer.__init__(self, node={"h": 3}, backend="trition")  # ERR:backend


class FeatureList(MisspeltAutodiff):
    """An AttributeError traceback ('list' object has no attribute 'items')."""

    def __init__(self):
        sarc.Layer.__init__(self, node=["h"])  # ERR:node-list


class FeatureNumberKey(MisspeltAutodiff):
    """Accepted; the call then said feature 'h' was not given."""

    def __init__(self):
        sarc.Layer.__init__(self, node={1: 4, "h": 3})  # ERR:node-key


class Slicing(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h[0]  # ERR:slice

    def reduce(self, msg):
        return sarc.sum(msg.m)


class WrongMessageName(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return {"z": src.h}

    def reduce(self, msg):
        return sarc.sum(msg.zz)  # ERR:no-message


class ReduceOverRows(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h.sum(0)  # ERR:row-axis

    def reduce(self, msg):
        return sarc.sum(msg.m)


class SumOverAllAxes(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h * src.h.mean()  # ERR:all-axes

    def reduce(self, msg):
        return sarc.sum(msg.m)


class WriteToSide(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        src.h = dst.h  # ERR:write
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


class NonStringMessageKey(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        m = src.h * 2.0
        return {0: m}  # ERR:message-key

    def reduce(self, msg):
        return sarc.sum(msg.m)


class PrivateAggregateKey(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return {"_agg": sarc.sum(msg.m)}  # ERR:reduce-key


class NumberMessage(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return {"m": src.h, "scale": 2.0}  # ERR:number-message

    def reduce(self, msg):
        return sarc.sum(msg.m)


class NumpyReduction(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return np.sum(src.h, axis=-1)  # ERR:numpy

    def reduce(self, msg):
        return sarc.sum(msg.m)


class NegativeViewSize(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h.view(-1, -2, -2).sum(-1)  # ERR:view-negative

    def reduce(self, msg):
        return sarc.sum(msg.m)


class AmbiguousView(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h.view(-1, 0, -1)  # ERR:view-zero

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UpdateReturnsParam(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(4, 4)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.lin.weight  # ERR:update-param


class ReduceWithoutAggregating(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h * 2.0

    def reduce(self, msg):
        return msg.m  # ERR:no-aggregate


class ModuleCalledWrongly(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(4, 4)

    def message(self, src, dst, edge):
        return self.lin(src.h, 3)  # ERR:module-call

    def reduce(self, msg):
        return sarc.sum(msg.m)


class IntegerArithmetic(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4}, edge={"etype": sarc.INDEX})

    def message(self, src, dst, edge):
        return src.h * edge.etype.unsqueeze(-1)  # ERR:integer

    def reduce(self, msg):
        return sarc.sum(msg.m)


class FloatToInteger(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4}, edge={"etype": sarc.INDEX})

    def message(self, src, dst, edge):
        return src.h * src.h.long()  # ERR:to-integer

    def reduce(self, msg):
        return sarc.sum(msg.m)


class MisspeltDSLFunction(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.meen(msg.m)  # ERR:misspelt


class ArangeOverRows(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h * torch.arange(src.h.shape[0]).unsqueeze(-1)  # ERR:arange-rows

    def reduce(self, msg):
        return sarc.sum(msg.m)


class UndefinedName(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h * scale  # noqa: F821  # ERR:undefined

    def reduce(self, msg):
        return sarc.sum(msg.m)


CASES = [
    (MixInReduce, "mix-reduce", [r"cannot combine a dst value \[N_dst, 3\] with an edge value \[E, 3\]",
                                 "without a gather"]),
    (MixSrcDstNodes, "reduce-node", ["reduce aggregates edge values", "its input is a dst value"]),
    (LinearMismatch, "linear", ["linear: input has 4 features but the weight expects 5"]),
    (Undeclared, "undeclared", [r"src\.hh", "no node feature 'hh'", r"declared: h\b"]),
    (UndeclaredEdge, "undeclared-edge", [r"edge\.weight", "no edge feature 'weight'",
                                         "declared: none"]),
    (EdgeFeatureAtTheNodes, "edge-at-node", [r"dst\.w", "no node feature 'w'",
                                             "'w' is declared an edge feature",
                                             r"message reads it as edge\.w"]),
    (NodeFeatureOnTheEdges, "node-on-edge", [r"edge\.h", "'h' is declared a node feature",
                                             r"src\.h or dst\.h"]),
    (UnusedMessage, "unused", ["message 'unused' is never used by reduce"]),
    (SoftmaxNotAggregated, "softmax-result", ["reduce result 'agg' is an edge value",
                                              "sarc.edge_softmax gives each edge a weight",
                                              r"sarc\.sum\(msg\.v \* a"]),
    (NonEdgeMessage, "non-edge", ["message 'm' must be a per-edge value", "param value"]),
    (UnsupportedTorch, "torch-fn", ["torch function torch.cumsum is not supported"]),
    (UnsupportedFunctional, "functional", ["torch function torch.nn.functional.local_response_norm is not supported"]),
    (UnsupportedMethod, "method", ["Tensor.cumsum is not supported"]),
    (DataDependentIf, "if", ["data-dependent control flow"]),
    (MisspeltAutodiff, "autodiff", ["unknown autodiff 'IR'", "available: torch, ir"]),
    (MisspeltBackend, "backend", ["unknown backend 'trition'", "available: torch, triton"]),
    (FeatureList, "node-list", [r"node= takes a dict of feature names", r"got \['h'\]"]),
    (FeatureNumberKey, "node-key", [r"node= takes a dict of feature names"]),
    (ForeignTensor, "foreign", ["not a parameter of the layer", "nn.Parameter",
                                "self.register_buffer"]),
    (ForeignArray, "foreign-numpy", [r"a numpy array of shape \[3\]", "self.register_buffer",
                                     r"torch\.as_tensor"]),
    (Slicing, "slice", ["the rows of an edge value are taken whole", r"x\[:, 0\]"]),
    (WrongMessageName, "no-message", ["no message named 'zz'", "there are: z"]),
    (ReduceOverRows, "row-axis", ["row axis", "sarc.sum"]),
    (SumOverAllAxes, "all-axes", ["mean over all axes is not supported"]),
    (WriteToSide, "write", ["read-only"]),
    (NonStringMessageKey, "message-key", ["message returned a dict with the key 0",
                                          r"read in reduce as msg\.<key>", "Python identifier"]),
    (PrivateAggregateKey, "reduce-key", ["reduce returned a dict with the key '_agg'",
                                         "not starting with '_'"]),
    (NumberMessage, "number-message", ["message returned 'scale' as a float, not a traced value"]),
    (NumpyReduction, "numpy", ["unexpected keyword argument 'axis'", "numpy.sum called it",
                               "numpy functions are not traced"]),
    (NegativeViewSize, "view-negative", [r"reshape to \[-1, -2, -2\]: invalid size -2"]),
    (AmbiguousView, "view-zero", [r"reshape to \[-1, 0, -1\]: the -1 is ambiguous"]),
    (UpdateReturnsParam, "update-param", [r"update result 'h' must be a dst value, got a param "
                                          r"value \[4, 4\]"]),
    (ReduceWithoutAggregating, "no-aggregate", ["reduce result 'agg' is an edge value",
                                                "sarc.sum/mean/max/min"]),
    (ModuleCalledWrongly, "module-call", [r"Linear.forward\(\) takes 2 positional arguments"]),
    (IntegerArithmetic, "integer", [r"edge\.etype is an integer feature \(i64\)",
                                    "sarc.TypedLinear", r"convert it first \(x\.float\(\)",
                                    "declare the feature as a float"]),
    (FloatToInteger, "to-integer", [r"Tensor\.long to torch\.int64: a sarc layer converts "
                                    r"values to float dtypes only",
                                    r"sarc\.Feature\(shape, dtype=\"i64\"\)"]),
    (MisspeltDSLFunction, "misspelt", ["AttributeError", "meen"]),
    (UndefinedName, "undefined", ["NameError", "'scale' is not defined"]),
    (ArangeOverRows, "arange-rows", [r"arange\(\): argument 'end' \(position 1\) must be Number",
                                     "the argument is a graph size", "torch.ones / zeros / full / empty"]),
]


@pytest.mark.parametrize("cls, marker, phrases", CASES, ids=[c[1] for c in CASES])
def test_dsl_error_at_the_users_line(cls, marker, phrases):
    expect_dsl_error(lambda: cls().trace(), marker, *phrases)


@pytest.mark.parametrize("cls, marker, phrases", CASES[:4], ids=[c[1] for c in CASES[:4]])
def test_calling_the_layer_reports_the_same_error(cls, marker, phrases):
    """The first call traces and compiles: the error is the same as from trace()."""
    g = graph()
    layer = cls()
    d = layer._sarc_node["h"].shape[0]
    expect_dsl_error(lambda: layer(g, torch.randn(4, d)), marker, *phrases)


class MultiLineExpression(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(4, 3)

    def message(self, src, dst, edge):
        y = self.lin(src.h)
        return (y  # ERR:multi-line
                + 1.0
                + src.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="an instruction's end line is Python 3.11's")
def test_an_expression_over_several_lines_is_quoted_whole():
    """The error is at the expression's first line (Python's line of the operation), and
    quotes every line of it: the mismatched operand is on the last."""
    err = expect_dsl_error(lambda: MultiLineExpression().trace(), "multi-line",
                           r"feature shapes \[3\] and \[4\] do not broadcast")
    line = line_of("multi-line")
    assert str(err).endswith("\n".join(["", "    return (y  # ERR:multi-line",
                                         "            + 1.0", "            + src.h)"])), str(err)
    assert err.loc.line == line


def test_dsl_error_is_a_sarc_error():
    with pytest.raises(sarc.SarcError):
        MixInReduce().trace()


class NoSuperInit(sarc.Layer):
    def __init__(self):
        nn.Module.__init__(self)

    def message(self, src, dst, edge):
        return src.h


def test_layer_without_super_init():
    with pytest.raises(sarc.DSLError, match=r"NoSuperInit.__init__ must call super\(\).__init__"):
        NoSuperInit().trace()


class NoMessage(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_layer_without_message_is_named_at_its_class():
    """The error had no file and line."""
    with pytest.raises(sarc.DSLError) as e:
        NoMessage().trace()
    problem = str(e.value).splitlines()[0]
    assert re.match(r".*test_errors\.py:\d+ \(in NoMessage\): layer NoMessage defines no "
                    r"message\(src, dst, edge\)", problem), problem


def test_feature_declared_as_node_and_edge():
    with pytest.raises(sarc.DSLError, match="'h' is declared both as a node and an edge feature"):
        sarc.Layer(node={"h": 3}, edge={"h": ()})


def test_bad_feature_declaration():
    with pytest.raises(sarc.DSLError, match="feature 'h' must be declared as an int"):
        sarc.Layer(node={"h": "wide"})


def test_feature_dtypes_are_checked_where_declared():
    """A torch dtype names the same dtype as its string; one sarc does not compute with (a
    bool mask, int32) or a misspelled name is refused at the declaring line, not at the
    layer's first call."""
    assert sarc.Feature((), torch.int64) == sarc.INDEX
    assert sarc.Feature((3,), torch.float16) == sarc.Feature((3,), "f16")
    expect_dsl_error(lambda: sarc.Feature((), torch.bool),  # ERR:bool-feature
                     "bool-feature", "torch.bool is not one sarc computes with", "'i64'",
                     "float 0 / 1")
    expect_dsl_error(lambda: sarc.Feature((), "float"),  # ERR:named-dtype
                     "named-dtype", "dtype 'float'", "'f32'")
    expect_dsl_error(lambda: sarc.Feature((-1,)),  # ERR:feature-shape
                     "feature-shape", "non-negative ints")


class TableByType(sarc.Layer):
    """W[edge.etype] beside TypedLinear(src.h, edge.etype): both index tables of 3 types."""

    def __init__(self, typed: bool):
        super().__init__(node={"h": 4}, edge={"etype": sarc.INDEX})
        self.typed = typed
        self.lin = sarc.TypedLinear(4, 3, 3) if typed else nn.Linear(4, 3)
        self.bias = nn.Parameter(torch.randn(3, 3))

    def message(self, src, dst, edge):
        h = self.lin(src.h, edge.etype) if self.typed else self.lin(src.h)
        return {"m": h + self.bias[edge.etype]}

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("typed", [False, True], ids=["table", "typed-linear"])
@pytest.mark.parametrize("ids", [[0, -1, 2, 1, 0], [0, 3, 2, 1, 0]], ids=["minus-one", "num-types"])
@pytest.mark.parametrize("backend", ["interpreter", *BACKENDS])
def test_type_ids_outside_the_table_are_refused(backend, ids, typed):
    """An id outside 0..R-1 is an error naming the feature and the table on every backend
    (torch would wrap -1 to the last type; a Triton kernel would read past the table)."""
    from difftest import reference
    layer, g = TableByType(typed), graph()
    feats = {"h": torch.randn(4, 4), "etype": torch.tensor(ids)}
    with pytest.raises(sarc.GraphError, match=r"feature 'etype' holds type ids in "
                       r"\[-?\d, \d\], but it indexes parameter '[\w.]+' of 3 rows \(ids 0..2\)"):
        if backend == "interpreter":
            reference(layer, g, feats)
        else:
            layer.set_backend(backend)
            layer(g, **feats)


def test_the_interpreter_refuses_ids_outside_the_table():
    """The oracle itself: a negative id is not wrapped to the last row."""
    from sarc.ir import interpreter
    layer, g = TableByType(False), graph()
    fn = layer.trace()
    inputs = {"h": torch.randn(4, 4), "etype": torch.tensor([0, -1, 2, 1, 0])}
    with pytest.raises(ValueError, match=r"type id out of range: the table has 3 rows"):
        interpreter.run(fn, g, inputs, layer.leaf_tensors(), False)


def test_library_code_is_never_the_users_line():
    """numpy's, the standard library's and installed packages' frames are skipped when the
    user's line is looked for; the user's own file is not."""
    import functools

    from sarc.trace import _is_library
    assert _is_library(np.__file__) and _is_library(functools.__file__)
    assert _is_library(torch.__file__) and _is_library(sarc.__file__)
    assert _is_library(os.path.join(os.sep, "opt", "py", "site-packages", "pkg", "mod.py"))
    assert _is_library(os.path.join(os.sep, "usr", "lib", "python3", "dist-packages", "m.py"))
    assert not _is_library(str(THIS))


def test_a_layer_installed_as_a_package_is_the_users_code(tmp_path, monkeypatch):
    """A layer whose file is under site-packages (a pip-installed model package, a PyG or DGL
    module converted by sarc's frontends) is the code its errors point into."""
    pkg = tmp_path / "site-packages" / "installed_models"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text(
        "import sarc\n\n\n"
        "class Bad(sarc.Layer):\n"
        "    def __init__(self):\n"
        "        super().__init__(node={'h': 3})\n\n"
        "    def message(self, src, dst, edge):\n"
        "        return src.h.cumsum(-1)\n\n"
        "    def reduce(self, msg):\n"
        "        return sarc.sum(msg.m)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    from installed_models.bad import Bad
    with pytest.raises(sarc.DSLError) as info:
        Bad().trace()
    assert os.path.samefile(info.value.loc.file, pkg / "bad.py") and info.value.loc.line == 9


def test_an_installed_profiler_is_left_alone():
    """The line a result was returned from is read through a profile hook only where none is
    installed; with one, the error names the function's def line, and the hook stays."""
    import sys

    def profiler(frame, event, arg):
        pass

    sys.setprofile(profiler)
    try:
        with pytest.raises(sarc.DSLError) as info:
            ReduceWithoutAggregating().trace()
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert info.value.loc.line == ReduceWithoutAggregating.reduce.__code__.co_firstlineno


# --- graph construction errors -----------------------------------------------------------------

def test_out_of_range_src_id():
    with pytest.raises(sarc.GraphError, match=r"src node id 7 is out of range: the graph has 5 "
                                              r"src nodes \(ids 0\.\.4\)"):
        sarc.Graph.from_edges([0, 7], [1, 2], 5)


def test_out_of_range_dst_id_in_a_block():
    with pytest.raises(ValueError, match=r"dst node id 3 is out of range.*3 dst nodes \(ids 0\.\.2\)"):
        sarc.Graph.from_edges([0, 5], [1, 3], num_src=6, num_dst=3)


def test_negative_id():
    with pytest.raises(sarc.GraphError, match="src node id -1 is out of range"):
        sarc.Graph.from_edges([-1, 0], [0, 0], 2)


def test_graph_error_is_a_value_error():
    assert issubclass(sarc.GraphError, ValueError)
    assert issubclass(sarc.GraphError, sarc.SarcError)


@pytest.mark.parametrize("src", [torch.tensor([0.0, 1.0]), [0.5, 1.0], torch.tensor([True, False])])
def test_non_integer_ids(src):
    with pytest.raises(sarc.GraphError, match="src node ids must be integers"):
        sarc.Graph.from_edges(src, [0, 1], 2)


def test_edge_lists_of_different_lengths():
    with pytest.raises(sarc.GraphError, match="src has 3 edges but dst has 2"):
        sarc.Graph.from_edges([0, 1, 1], [0, 1], 2)


def test_ids_must_be_one_dimensional():
    with pytest.raises(sarc.GraphError, match=r"src must be a 1-d tensor.*\[2, 2\]"):
        sarc.Graph.from_edges(torch.zeros(2, 2, dtype=torch.int64), [0, 1, 1, 0], 2)


def test_block_with_more_dst_than_src_nodes():
    with pytest.raises(sarc.GraphError, match="num_dst=4 > num_src=3"):
        sarc.Graph.from_edges([0], [0], num_src=3, num_dst=4)


def test_node_counts_required():
    with pytest.raises(sarc.GraphError, match="node counts are required"):
        sarc.Graph.from_edges([0], [0])


@pytest.mark.parametrize("count", [3.7, 3.0, True, torch.tensor(3.0), np.float64(3)])
def test_node_counts_are_integers(count):
    with pytest.raises(sarc.GraphError, match="must be an integer node count"):
        sarc.Graph.from_edges([0], [1], count)
    with pytest.raises(sarc.GraphError, match="num_dst must be an integer node count"):
        sarc.Graph.from_edges([0], [1], num_src=3, num_dst=count)


@pytest.mark.parametrize("count", [3, np.int64(3), torch.tensor(3)])
def test_integer_node_counts_of_any_kind(count):
    g = sarc.Graph.from_edges([0], [1], count)
    assert (g.num_src, g.num_dst) == (3, 3) and type(g.num_src) is int


# --- feature binding errors: raised before any kernel runs ---------------------------------

class _NoKernel:
    """Stands in for a compiled module: the test fails if the kernel is reached."""

    @staticmethod
    def forward(*args, **kwargs):
        raise AssertionError("the kernel ran before the inputs were checked")


def _guarded(layer: sarc.Layer, monkeypatch) -> sarc.Layer:
    monkeypatch.setattr(layer.compiled(), "module", _NoKernel)
    return layer


@pytest.fixture
def gcn(monkeypatch):
    from gcn import GCNLayer
    return _guarded(GCNLayer(3, 2), monkeypatch)


@pytest.fixture
def rgcn(monkeypatch):
    from rgcn import RGCNLayer
    return _guarded(RGCNLayer(3, 2, 2), monkeypatch)


def test_the_guard_works(gcn):
    with pytest.raises(AssertionError, match="the kernel ran"):
        gcn(graph(), torch.randn(4, 3))


def test_wrong_row_count(gcn):
    with pytest.raises(ValueError, match="feature 'h' has 3 rows but the graph has 4 source nodes"):
        gcn(graph(), torch.randn(3, 3))


def test_more_node_rows_than_sources_says_how_a_block_takes_them(gcn):
    """An initial residual made before the first layer of a mini-batch step has the first
    block's rows: the message says to cut it to the layer's sources."""
    with pytest.raises(sarc.GraphError, match=r"feature 'h' has 6 rows but the graph has 4 "
                                              r"source nodes; in a mini-batch step .*"
                                              r"\(h\[:h\.shape\[0\]\]"):
        gcn(graph(), torch.randn(6, 3))


def test_wrong_edge_row_count(rgcn):
    g = graph()
    with pytest.raises(sarc.GraphError, match="feature 'norm' has 4 rows but the graph has 5 edges"):
        rgcn(g, torch.randn(4, 3), etype=torch.zeros(5, dtype=torch.int64), norm=torch.rand(4))


def test_wrong_feature_width(gcn):
    with pytest.raises(sarc.GraphError, match=r"feature 'h' has per-row shape \[5\], declared \[3\]"):
        gcn(graph(), torch.randn(4, 5))


class TwoLayers(nn.Module):
    """The second layer declared one feature wider than the first makes."""

    def __init__(self):
        super().__init__()
        from gcn import GCNLayer
        self.first, self.second = GCNLayer(3, 4), GCNLayer(5, 2)

    def forward(self, g, x):
        return self.second(g, self.first(g, x))  # ERR:second-layer


def test_a_data_error_names_the_layer_and_the_line_that_called_it():
    """In a model of several layers, which one was given the wrong data, and where."""
    model = TwoLayers()
    with pytest.raises(sarc.GraphError) as info:
        model(graph(), torch.randn(4, 3))
    err = info.value
    assert err.layer == "GCNLayer" and err.loc is not None and err.loc.line == line_of("second-layer")
    text = str(err)
    assert f"test_errors.py:{line_of('second-layer')} (in forward): calling GCNLayer: feature " \
           f"'h' has per-row shape [4], declared [5]" in text, text
    assert SOURCE[line_of("second-layer") - 1].strip() in text


def test_missing_feature(rgcn):
    with pytest.raises(sarc.GraphError, match="RGCNLayer reads feature 'norm', which was not given"):
        rgcn(graph(), torch.randn(4, 3), etype=torch.zeros(5, dtype=torch.int64))


def test_unknown_feature(gcn):
    with pytest.raises(sarc.GraphError, match="declares no feature 'x'"):
        gcn(graph(), h=torch.randn(4, 3), x=torch.randn(4, 3))


def test_scalar_feature(gcn):
    with pytest.raises(sarc.GraphError, match="feature 'h' has no rows"):
        gcn(graph(), torch.tensor(1.0))


def test_feature_of_the_wrong_dtype(gcn):
    with pytest.raises(sarc.GraphError, match="feature 'h' is torch.float64"):
        gcn(graph(), torch.randn(4, 3, dtype=torch.float64))


def test_float_edge_types(rgcn):
    with pytest.raises(sarc.GraphError, match="feature 'etype' is torch.float32, expected torch.int64"):
        rgcn(graph(), torch.randn(4, 3), etype=torch.zeros(5), norm=torch.rand(5))


def test_feature_that_is_not_a_tensor(gcn):
    with pytest.raises(sarc.GraphError, match="feature 'h' must be a torch.Tensor, got list"):
        gcn(graph(), [[0.0] * 3] * 4)


def test_not_a_graph(gcn):
    with pytest.raises(sarc.GraphError, match="runs on a sarc.Graph, got tuple"):
        gcn(([0, 1], [1, 0]), torch.randn(2, 3))


def test_edge_feature_the_graph_lacks(rgcn):
    """A model passing on an edge input it was not given (forward(g, x, norm=None)) gives the
    layer None: the error says the data has no such edge data."""
    with pytest.raises(sarc.GraphError, match="feature 'norm' is None: RGCNLayer reads the edge "
                                              "feature 'norm', .* has no edge data 'norm'"):
        rgcn(graph(), torch.randn(4, 3), etype=torch.zeros(5, dtype=torch.int64), norm=None)


def test_a_type_error_inside_sarc_is_not_the_users(monkeypatch):
    """A TypeError from sarc's own code (a bug) is not made a DSLError at the user's line,
    whereas one from a library the user called wrongly is (ModuleCalledWrongly)."""
    import sarc.trace_torch

    class SumFeatures(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": 3})

        def message(self, src, dst, edge):
            return src.h.sum(-1)

        def reduce(self, msg):
            return sarc.sum(msg.m)

    # sarc calling one of its functions wrongly: Python raises in sarc's frame
    monkeypatch.setattr(sarc.trace_torch, "_sum_axes", sarc.trace_torch._is_int)
    with pytest.raises(TypeError, match="takes 1 positional argument") as info:
        SumFeatures().trace()
    assert not isinstance(info.value, sarc.DSLError)


def test_type_ids_changed_in_place_are_checked_again():
    """The check remembers a tensor found in range (no scan per call) until it changes."""
    layer, g = TableByType(False), graph()
    ids = torch.tensor([0, 1, 2, 1, 0])
    feats = {"h": torch.randn(4, 4), "etype": ids}
    layer(g, **feats)
    layer(g, **feats)
    ids[1] = 5  # in place: a new version of the same tensor
    with pytest.raises(sarc.GraphError, match=r"holds type ids in \[0, 5\]"):
        layer(g, **feats)


class CatchesTheRefusal(sarc.Layer):
    """Eager torch sorts; sarc refuses the sort, and the code's own except would trace the
    other branch: a layer computing something else than its code, were it not refused."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        try:
            y = src.h.sort(-1).values  # ERR:caught
        except Exception:
            y = src.h
        return y

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_refusal_the_code_catches_still_refuses_the_trace():
    err = expect_dsl_error(lambda: CatchesTheRefusal().trace(), "caught", "sort",
                           "try / except")
    assert "caught" in err.problem, err


class ToNumpy(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h * float(np.asarray(src.h).mean())  # ERR:asarray

    def reduce(self, msg):
        return sarc.sum(msg.m)


class SetsData(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        y = src.h * 2
        y.data = src.h  # ERR:setdata
        return y

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_traced_tensor_made_a_numpy_array_is_refused_at_its_line():
    expect_dsl_error(lambda: ToNumpy().trace(), "asarray", "numpy array")


def test_setting_an_attribute_of_a_traced_tensor_is_refused_at_its_line():
    expect_dsl_error(lambda: SetsData().trace(), "setdata", r"x\.data = \.\.\.")


class BranchOnASum(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h if src.h.sum() > 0 else dst.h


def test_control_flow_on_a_sum_over_all_axes_names_the_rows_and_the_branch():
    """``if h.sum() > 0:`` was refused as a sum over all axes only; it says the rows are among
    them and that such control flow is not modelled."""
    with pytest.raises(sarc.DSLError, match=r"sum over all axes.*rows are among all axes.*"
                                       r"control flow on one, `if h.sum\(\) > 0:`"):
        BranchOnASum().trace()
