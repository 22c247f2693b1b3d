"""The tracer never silently gives a wrong answer.

A torch argument the tracer records is honoured exactly (checked against plain torch
and the interpreter); one it does not model, Python control flow on a traced value, an
in-place op and a random draw outside sarc's dropout are each a ``sarc.DSLError`` at the
user's line. Faulty lines carry a ``# ERR:name`` marker; ``expect_error_at`` checks that
the error points there (``.loc``, and ``test_tracer.py:LINE`` in its text).
"""
from __future__ import annotations

import inspect
import os
import random
from pathlib import Path
from random import uniform as draw_uniform

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from difftest import assert_close, check_layer
from torch import nn

import sarc

from .catalogue import case

THIS = Path(__file__).resolve()


def line_of(path: Path, marker: str) -> int:
    """The 1-based line of ``path`` carrying ``# ERR:<marker>`` (exactly one)."""
    tag = f"# ERR:{marker}"
    hits = [i + 1 for i, text in enumerate(path.read_text().splitlines())
            if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {tag!r} found {len(hits)} times in {path.name}"
    return hits[0]


def expect_error_at(call, marker: str, *parts: str, path: Path = THIS) -> sarc.DSLError:
    """``call()`` raises a DSLError located at the marked line whose text has ``parts``."""
    with pytest.raises(sarc.DSLError) as info:
        call()
    err, line = info.value, line_of(path, marker)
    text = str(err)
    assert err.loc is not None, f"no location in: {text}"
    assert os.path.samefile(err.loc.file, path), f"located in {err.loc.file}: {text}"
    assert err.loc.line == line, f"points at line {err.loc.line}, the fault is at {line}: {text}"
    assert f"{path.name}:{line}" in text, text
    for part in parts:
        assert part in text, f"{part!r} not in: {text}"
    return err


# A small graph, its edges as given, and plain torch's sum of per-edge values into dst.
SRC = torch.tensor([0, 1, 2, 3, 1, 2])
DST = torch.tensor([1, 2, 3, 0, 0, 0])
N = 4


def graph() -> sarc.Graph:
    return sarc.Graph.from_edges(SRC, DST, N)


def sum_into_dst(per_edge: torch.Tensor) -> torch.Tensor:
    return torch.zeros(N, *per_edge.shape[1:]).index_add_(0, DST, per_edge)


class Edgewise(sarc.Layer):
    """``message`` is ``fn(src.h, dst.h)``; the aggregate is its sum into dst."""

    def __init__(self, fn, width=(3,)):
        super().__init__(node={"h": sarc.Feature(tuple(width))})
        self.fn = fn

    def message(self, src, dst, edge):
        return self.fn(src.h, dst.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def check_against_torch(fn, width=(3,), layer=None):
    """The layer computing ``fn`` per edge equals plain torch's ``fn`` on the edges'
    endpoint rows, and its compiled code equals the interpreter (outputs and gradients)."""
    layer = layer or Edgewise(fn, width)
    h = torch.randn(N, *width)
    expected = sum_into_dst(fn(h[SRC], h[DST]))
    actual = check_layer(layer, graph(), {"h": h})["h"]
    assert_close(actual, expected, what="sarc vs torch")


# --- modeled arguments: honoured exactly --------------------------------------------------------

@case("tracer", "`torch.add(a, b, alpha=3)` (and `a.add(b, alpha=)`) in a message", "exact")
def test_add_alpha_is_honoured():
    check_against_torch(lambda a, b: torch.add(a, b, alpha=3) + a.add(b, alpha=-0.5))


@case("tracer", "`torch.sub(a, b, alpha=2)` in a message", "exact")
def test_sub_alpha_is_honoured():
    check_against_torch(lambda a, b: torch.sub(a, b, alpha=2))


@case("tracer", "`F.dropout(x, p, training=False)` in a layer that trains", "exact")
def test_dropout_training_false_is_the_identity():
    layer = Edgewise(lambda a, b: F.dropout(a, 0.5, training=False) * b).train()
    check_against_torch(lambda a, b: a * b, layer=layer)


class DropoutFollowsMode(sarc.Layer):
    def __init__(self, p, functional):
        super().__init__(node={"h": 3})
        self.p, self.functional = p, functional
        self.drop = nn.Dropout(p)

    def message(self, src, dst, edge):
        if self.functional:
            return F.dropout(src.h, self.p, self.training)
        return self.drop(src.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class SarcDropout(sarc.Layer):
    def __init__(self, p):
        super().__init__(node={"h": 3})
        self.p = p

    def message(self, src, dst, edge):
        return sarc.dropout(src.h, self.p)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("functional", [True, False], ids=["F.dropout", "nn.Dropout"])
@case("tracer", "`F.dropout(x, p, self.training)` / `nn.Dropout` traced first in eval mode",
      "exact")
def test_dropout_follows_the_layers_mode_whenever_it_was_traced(functional):
    g, h = graph(), torch.randn(N, 3)
    layer = DropoutFollowsMode(0.5, functional).eval()
    assert_close(layer(g, h), sum_into_dst(h[SRC]), what="eval")
    layer.train()
    torch.manual_seed(7)
    trained = layer(g, h)
    torch.manual_seed(7)
    assert_close(trained, SarcDropout(0.5).train()(g, h), what="train")
    assert not torch.allclose(trained, sum_into_dst(h[SRC]))


@case("tracer", "`h.mean((1, 2))` / `h.sum((-1, 1), keepdim=True)` over several feature axes",
      "exact")
def test_reduction_over_several_axes():
    check_against_torch(lambda a, b: a.mean((1, 2)) + torch.sum(b, (-1, 1)), width=(2, 3))
    check_against_torch(lambda a, b: a.sum((-1, 1), keepdim=True) * b
                        + torch.mean(a, dim=[2], keepdim=True), width=(2, 3))


@case("tracer", "`abs(h)`, `torch.abs(h)`, `h.abs()` in a message", "exact")
def test_abs():
    check_against_torch(lambda a, b: abs(a - b) + torch.abs(a) * b.abs())


@case("tracer", "`2 ** h` and `torch.pow(3.0, h)` (a traced exponent)", "exact")
def test_constant_base_to_a_traced_power():
    check_against_torch(lambda a, b: 2 ** a + torch.pow(3.0, b) * 0.5 ** a)


class GradModeInMessage(sarc.Layer):
    """``s = lin(src.h) * 2`` computed under ``context()`` (no gradient through it), then
    ``s * lin(src.h) + s``: as torch, the gradient flows through the second factor only."""

    def __init__(self, context):
        super().__init__(node={"h": 3})
        self.lin = nn.Linear(3, 3)
        self.context = context

    def message(self, src, dst, edge):
        h = self.lin(src.h)
        with self.context():
            s = h * 2.0
        return s * h + s

    def reduce(self, msg):
        return sarc.sum(msg.m)


GRAD_MODES = {"no_grad": torch.no_grad, "set_grad_enabled(False)":
              lambda: torch.set_grad_enabled(False), "inference_mode": torch.inference_mode}


@case("tracer", "`with torch.no_grad()` / `set_grad_enabled(False)` / `inference_mode()` "
      "in a message", "exact")
@pytest.mark.parametrize("context", GRAD_MODES.values(), ids=GRAD_MODES.keys())
@pytest.mark.parametrize("first_call_without_grad", [False, True])
def test_no_gradient_flows_through_values_computed_without_grad(context, first_call_without_grad):
    torch.manual_seed(0)
    layer = GradModeInMessage(context)
    x = torch.randn(N, 3)
    if first_call_without_grad:  # traced in an evaluation under no_grad: the same program
        with torch.no_grad():
            layer(graph(), x)
    out = layer(graph(), x)
    out.sum().backward()
    actual = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    h = layer.lin(x[SRC])
    s = (h * 2.0).detach()
    expected = sum_into_dst(s * h + s)
    expected.sum().backward()
    assert_close(out, expected, what="output")
    for a, e in zip(actual, [p.grad for p in layer.parameters()]):
        assert_close(a, e, what="parameter gradient")
    check_layer(layer, graph(), {"h": x})


class VectorProducts(sarc.Layer):
    """``x @ w``, ``torch.matmul`` and ``torch.linalg.matmul`` by a vector parameter: torch
    contracts x's last axis (per row, and per head of a [rows, heads, d] value)."""

    def __init__(self):
        super().__init__(node={"h": 4})
        self.w = nn.Parameter(torch.randn(4))
        self.v = nn.Parameter(torch.randn(2))

    def message(self, src, dst, edge):
        a = src.h @ self.w
        b = torch.matmul(src.h.view(-1, 2, 2), self.v)
        c = torch.linalg.matmul(dst.h, self.w)
        return (a + c).unsqueeze(-1) * b

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`x @ w`, `torch.matmul`, `torch.linalg.matmul` with a 1-d parameter w",
      "exact")
def test_a_product_by_a_vector_parameter_contracts_the_last_axis():
    layer, h = VectorProducts(), torch.randn(N, 4)
    a, c = h[SRC] @ layer.w, h[DST] @ layer.w
    expected = sum_into_dst((a + c).unsqueeze(-1) * (h[SRC].view(-1, 2, 2) @ layer.v))
    assert_close(check_layer(layer, graph(), {"h": h})["h"], expected, what="sarc vs torch")


# --- arguments the tracer does not model: errors at the line ----------------------------------------

class DivRounding(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return torch.div(src.h, dst.h, rounding_mode="floor")  # ERR:rounding

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`torch.div(a, b, rounding_mode=\"floor\")` in a message", "error-at-line")
def test_div_rounding_mode_is_refused():
    expect_error_at(lambda: DivRounding().trace(), "rounding",
                    "torch.div: argument rounding_mode='floor' is not supported in a sarc layer",
                    "only rounding_mode=None")


class InPlaceArgument(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return F.elu(src.h, 1.0, True)  # ERR:inplace-arg

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`F.elu(h, 1.0, True)`: an argument sarc does not model (in place)",
      "error-at-line")
def test_unmodeled_keyword_is_refused():
    expect_error_at(lambda: InPlaceArgument().trace(), "inplace-arg",
                    "argument inplace=True is not supported in a sarc layer")


class TorchModuleInUpdate(sarc.Layer):
    """A torch module sarc does not trace, in update: nn.GRU (a sequence) or
    nn.MultiheadAttention (which first reads Tensor.is_nested)."""

    def __init__(self, module: nn.Module, states: int):
        super().__init__(node={"h": 4})
        self.module, self.states = module, states

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        out = self.module(agg.agg, *[dst.h] * self.states)  # ERR:torch-module
        return out[0] if isinstance(out, tuple) else out


@case("tracer", "`nn.GRU` / `nn.MultiheadAttention` called in update", "error-at-line")
@pytest.mark.parametrize("module, states, op", [
    (nn.GRU(4, 4), 1, "cannot create weak reference to 'Proxy' object"),
    (nn.MultiheadAttention(4, 2), 2, "Tensor.is_nested is not supported in a sarc layer"),
], ids=["GRU", "MultiheadAttention"])
def test_a_torch_module_sarc_does_not_trace_is_named(module, states, op):
    """Refused by sarc (MultiheadAttention) or failing as Python inside torch's code (GRU's
    weak references to its weights): either way the module is named."""
    expect_error_at(lambda: TorchModuleInUpdate(module, states).trace(), "torch-module",
                    f"{op} (called inside nn.{type(module).__name__}, which sarc does not "
                    f"trace")


class PerEdgeMatrix(sarc.Layer):
    """NNConv's message: each source row times a matrix computed from the edge's features,
    by ``torch.bmm``, ``@`` or ``torch.einsum``."""

    def __init__(self, product: str):
        super().__init__(node={"h": 3}, edge={"e": 2})
        self.net = nn.Linear(2, 9)
        self.product = product

    def message(self, src, dst, edge):
        w = self.net(edge.e).view(-1, 3, 3)
        if self.product == "bmm":
            return torch.bmm(src.h.unsqueeze(1), w).squeeze(1)  # ERR:per-edge-bmm
        if self.product == "matmul":
            return src.h @ w  # ERR:per-edge-matmul
        return torch.einsum("ei,eio->eo", src.h, w)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`torch.bmm` / `@` with a matrix per edge computed in the layer (NNConv)",
      "error-at-line")
@pytest.mark.parametrize("product", ["bmm", "matmul"])
def test_a_matrix_per_edge_is_refused_with_the_product_that_traces(product):
    expect_error_at(lambda: PerEdgeMatrix(product).trace(), f"per-edge-{product}",
                    "a matrix per row", "torch.einsum('ei,eio->eo', x, w)")
    einsum = PerEdgeMatrix("einsum")
    h, e = torch.randn(N, 3), torch.randn(len(SRC), 2)
    w = einsum.net(e).view(-1, 3, 3)
    expected = sum_into_dst(torch.bmm(h[SRC].unsqueeze(1), w).squeeze(1))
    assert_close(check_layer(einsum, graph(), {"h": h, "e": e})["h"], expected, what="einsum")


class UnknownKeyword(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return F.leaky_relu(src.h, slope=0.2)  # ERR:unknown-kw

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`F.leaky_relu(h, slope=0.2)`: a keyword torch does not have", "error-at-line")
def test_unknown_keyword_is_refused():
    expect_error_at(lambda: UnknownKeyword().trace(), "unknown-kw",
                    "leaky_relu() got an unexpected keyword argument 'slope'")


class DropoutAlwaysOn(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return F.dropout(src.h, 0.5)  # ERR:dropout-eval

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`F.dropout(h, p)`: torch's default training=True drops in eval too",
      "error-at-line")
def test_dropout_in_evaluation_is_refused():
    expect_error_at(lambda: DropoutAlwaysOn().trace(), "dropout-eval",
                    "F.dropout with training=True drops in evaluation too",
                    "training=self.training")


class CatRows(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return torch.cat([src.h, dst.h])  # ERR:cat-rows

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`torch.cat([a, b])` without dim (torch's default dim=0 is the row axis)",
      "error-at-line")
def test_cat_defaults_to_the_row_axis_as_torch_does():
    expect_error_at(lambda: CatRows().trace(), "cat-rows", "dim 0 is the row axis")


class FlattenRows(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": (2, 3)})

    def message(self, src, dst, edge):
        return src.h.flatten()  # ERR:flatten-rows

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`h.flatten()` without start_dim (torch's default 0 merges the rows)",
      "error-at-line")
def test_flatten_defaults_to_the_row_axis_as_torch_does():
    expect_error_at(lambda: FlattenRows().trace(), "flatten-rows", "dim 0 is the row axis")


# --- Python control flow and comparisons on traced values ------------------------------------------

class CompareBranch(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        if src.h == dst.h:  # ERR:compare
            return src.h
        return dst.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`if src.h == dst.h:` (a comparison of traced values steering a branch)",
      "error-at-line")
def test_comparison_is_refused():
    expect_error_at(lambda: CompareBranch().trace(), "compare",
                    "a traced value used as a Python bool",
                    "data-dependent control flow cannot be traced", "torch.where(x > 0, a, b)")


class MaskIndex(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h[src.h > 0]  # ERR:mask

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`src.h[src.h > 0]` (indexing by a condition: as many entries as hold)",
      "error-at-line")
def test_indexing_by_a_condition_is_refused():
    expect_error_at(lambda: MaskIndex().trace(), "mask", "indexing by a condition",
                    "torch.where(mask, x, 0.0)")


class CompareTypes(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"etype": sarc.INDEX})

    def message(self, src, dst, edge):
        return torch.where((edge.etype == 1).unsqueeze(-1), src.h, dst.h)  # ERR:types

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`edge.etype == 1` (a comparison of integer type ids)", "error-at-line")
def test_comparing_type_ids_is_refused_with_what_to_write():
    expect_error_at(lambda: CompareTypes().trace(), "types",
                    "comparing (==) an integer (i64) value (edge.etype)", "W[edge.etype]")


class WhereIndices(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h * torch.where(src.h > 0)[0]  # ERR:where

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`torch.where(src.h > 0)` (the indices where a condition holds)",
      "error-at-line")
def test_where_of_a_condition_alone_is_refused():
    expect_error_at(lambda: WhereIndices().trace(), "where", "gives the indices where it holds",
                    "torch.where(condition, a, b)")


class IntOfValue(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h * [1.0, 2.0][dst.h.sum(-1)]  # ERR:index

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "a traced value used as a Python index (`[1.0, 2.0][h.sum(-1)]`)",
      "error-at-line")
def test_traced_value_as_python_index_is_refused():
    expect_error_at(lambda: IntOfValue().trace(), "index",
                    "a traced value used as a Python int",
                    "data-dependent control flow cannot be traced")


class LoopOverRows(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        for row in src.h:  # ERR:iter
            return row

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`for row in src.h:` (a Python loop over a traced value's rows)",
      "error-at-line")
def test_iterating_a_traced_value_is_refused():
    expect_error_at(lambda: LoopOverRows().trace(), "iter", "iterating over a traced value",
                    "data-dependent control flow cannot be traced")


class FlattenedRows(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 6})

    def message(self, src, dst, edge):
        return src.h.view(-1)  # ERR:view-rows

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`src.h.view(-1)` of a [rows, 6] value (flattens the row axis in torch)",
      "error-at-line")
def test_a_view_into_the_row_axis_names_the_row_axis():
    expect_error_at(lambda: FlattenedRows().trace(), "view-rows",
                    "reshape to [-1]: the first dim is the row axis",
                    "features [6] must fit []", "x.flatten(1) or x.view(-1, 6)")


class RowCountBranch(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        if src.h.shape[0] == 1:  # ERR:row-count
            return src.h
        return dst.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`if h.shape[0] == 1:` (the row count, the same symbol for every graph)",
      "error-at-line")
def test_branch_on_the_row_count_is_refused():
    expect_error_at(lambda: RowCountBranch().trace(), "row-count",
                    "the row count E of a traced value is not known while tracing")


class RowCountCarried(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        self.n = src.h.shape[0]  # ERR:taken
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m) / self.n  # ERR:used


@case("tracer", "a row count taken on one line (`n = h.shape[0]`) and computed with on "
                "another", "error-at-line")
def test_a_row_count_used_elsewhere_names_where_it_was_taken():
    """The error named only the line that used it (PyG's ``propagate(..., n=x.size(0))``
    read in ``message``)."""
    err = expect_error_at(lambda: RowCountCarried().trace(), "used",
                          "the row count E of a traced value is not known while tracing")
    assert str(err).splitlines()[0].endswith(f"; it was taken at {THIS}:{line_of(THIS, 'taken')}")


class ItemOfParam(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.scale = nn.Parameter(torch.tensor(2.0))

    def message(self, src, dst, edge):
        return src.h * self.scale.item()  # ERR:item-param

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`p.item()` on a parameter inside a message (its value baked in)",
      "error-at-line")
def test_item_is_refused():
    expect_error_at(lambda: ItemOfParam().trace(), "item-param",
                    "Tensor.item reads the value of a traced tensor")


class TrainingBranch(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        if self.training:  # ERR:training
            return src.h * 2.0
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`if self.training:` in a message (one kernel serves train and eval)",
      "error-at-line")
def test_branch_on_the_training_mode_is_refused():
    expect_error_at(lambda: TrainingBranch().trace(), "training",
                    "self.training is not known while tracing",
                    "sarc.dropout")


# --- in-place ops ------------------------------------------------------------------------------------

class SetItem(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        h = src.h * 1.0
        h[:, 0] = 0  # ERR:setitem
        return h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`h[:, 0] = 0` on a traced value", "error-at-line")
def test_item_assignment_is_refused():
    expect_error_at(lambda: SetItem().trace(), "setitem",
                    "assigning into a traced value (h[...] = ...) is not supported")


class AugmentedAdd(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        h = src.h
        alias = h
        h += 1  # ERR:iadd
        return alias

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`h += 1` on a traced value (in place: every alias of h would change)",
      "error-at-line")
def test_augmented_assignment_is_refused():
    expect_error_at(lambda: AugmentedAdd().trace(), "iadd",
                    "in-place += on a traced value is not supported", "h = h + ...")


class InplaceMethod(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h.add_(1)  # ERR:add_

    def reduce(self, msg):
        return sarc.sum(msg.m)


class InplaceRelu(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        h = src.h * 2.0
        F.relu(h, inplace=True)  # ERR:inplace
        return h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`h.add_(1)` / `F.relu(h, inplace=True)` (in-place torch ops)", "error-at-line")
def test_inplace_ops_are_refused():
    expect_error_at(lambda: InplaceMethod().trace(), "add_",
                    "Tensor.add_ is an in-place op", "use Tensor.add")
    expect_error_at(lambda: InplaceRelu().trace(), "inplace",
                    "torch.nn.functional.relu: argument inplace=True is not supported")


# --- randomness outside sarc's dropout ------------------------------------------------------------

RANDOM, NP_RAND = random.random, np.random.rand


class PyRandom(sarc.Layer):
    def __init__(self, how):
        super().__init__(node={"h": 3})
        self.how = how

    def message(self, src, dst, edge):
        if self.how == "module":
            return src.h * random.random()  # ERR:random
        if self.how == "imported":
            return src.h * draw_uniform(0.5, 1.5)  # ERR:from-random
        return src.h * np.random.rand()  # ERR:numpy

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("how, marker, name", [
    ("module", "random", "random.random()"),
    ("imported", "from-random", "random.uniform()"),
    ("numpy", "numpy", "numpy.random.rand()"),
], ids=["random.random", "from-import", "numpy"])
@case("tracer", "`random.random()` / `np.random.rand()` in a message (a draw baked in as a "
      "constant)", "error-at-line")
def test_python_and_numpy_randomness_is_refused(how, marker, name):
    expect_error_at(lambda: PyRandom(how).trace(), marker,
                    f"{name} draws a random number while the layer is traced",
                    "baked into the compiled layer as a constant")
    # put back after the trace, in the modules and in this file's globals
    assert random.random is RANDOM and np.random.rand is NP_RAND
    assert globals()["draw_uniform"] is random.uniform


MODULE_RNG = np.random.default_rng(3)


class GeneratorObject(sarc.Layer):
    """A generator made before the trace, kept on the layer or in the module."""

    def __init__(self, how):
        super().__init__(node={"h": 3})
        self.how = how
        self.py_rng, self.sys_rng = random.Random(0), random.SystemRandom()
        self.np_rng, self.np_state = np.random.default_rng(0), np.random.RandomState(0)

    def message(self, src, dst, edge):
        if self.how == "random.Random":
            return src.h * self.py_rng.uniform(0.5, 1.5)  # ERR:py-rng
        if self.how == "random.SystemRandom":
            return src.h * self.sys_rng.random()  # ERR:sys-rng
        if self.how == "numpy.random.Generator":
            return src.h * self.np_rng.random()
        if self.how == "numpy.random.RandomState":
            return src.h * self.np_state.rand()
        return src.h * MODULE_RNG.normal()

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("how, marker", [
    ("random.Random", "py-rng"), ("random.SystemRandom", "sys-rng"),
    ("numpy.random.Generator", None), ("numpy.random.RandomState", None), ("module", None)])
@case("tracer", "a random generator object (`random.Random`, `np.random.default_rng()`) "
      "drawn from in a message", "error")
def test_a_generator_objects_draw_is_refused(how, marker):
    """Its draw was a constant of the compiled layer: every call gave the first one."""
    layer = GeneratorObject(how)
    if marker is not None:   # a Python generator: refused at the draw
        expect_error_at(layer.trace, marker, "draws a random number while the layer is traced")
        assert layer.py_rng.random() == random.Random(0).random()   # and put back
        return
    name = {"module": "MODULE_RNG"}.get(how, "np_rng" if "Generator" in how else "np_state")
    kind = "numpy.random.Generator" if how == "module" else how
    with pytest.raises(sarc.DSLError, match=rf"{name} \({kind}\) drew a random number while "
                                            rf"the layer was traced"):
        layer.trace()


class TorchRandom(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return src.h * torch.rand(())  # ERR:torch-rand

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("tracer", "`torch.rand(())` in a message (a draw baked in as a constant)", "error-at-line")
def test_torch_randomness_is_refused():
    expect_error_at(lambda: TorchRandom().trace(), "torch-rand",
                    "torch.rand() draws a random number while the layer is traced")
    assert torch.rand(()).shape == ()   # no mode left behind


# --- the table itself ------------------------------------------------------------------------------

def test_traced_python_functions_have_torchs_signature():
    """Every traced torch function written in Python (F.dropout, F.leaky_relu, Tensor.__rsub__,
    ...) is recorded with exactly torch's parameters, so none can be dropped. (torch parses the
    arguments of its C functions itself before ``__torch_function__``: an argument the
    recorder lacks is refused there, never dropped.)"""
    from sarc.trace import TORCH_FUNCTIONS, Fixed
    checked = 0
    for func, traced in TORCH_FUNCTIONS.items():
        try:
            theirs = list(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            continue
        ours = list(traced.signature.parameters)
        assert ours[1:] == theirs[1:], (func, ours, theirs)
        checked += 1
    assert checked >= 8
    assert TORCH_FUNCTIONS[F.dropout].fixed == {"inplace": False}
    assert isinstance(inspect.signature(TORCH_FUNCTIONS[torch.div].record)
                      .parameters["rounding_mode"].default, Fixed)


def test_generated_modules_are_not_searched_for_the_users_names():
    """A trace looks for drawing functions the user's modules hold by name (this file's
    ``draw_uniform``); sarc's generated modules, thousands in a long run, are sarc's code
    and are left out (each trace scanned every one of them)."""
    from sarc.backends.codegen import load_module
    from sarc.trace_guards import code_namespaces

    _, generated = load_module("trace_guard_probe", "import random\nfrom random import uniform\n")
    spaces = code_namespaces([])
    assert any(ns is vars(inspect.getmodule(test_generated_modules_are_not_searched_for_the_users_names))
               for ns in spaces)
    assert not any(ns is vars(generated) for ns in spaces)


def test_a_module_loaded_or_replaced_between_traces_is_searched(tmp_path):
    """What a trace remembers of ``sys.modules`` (which modules are the user's) follows it:
    a module of the user's loaded after one trace, or put in another's place under its
    name, is searched by the next."""
    import sys
    import types

    from sarc.trace_guards import code_namespaces

    def users_module(tag):
        mod = types.ModuleType("sarc_probe_users_module")
        mod.__file__ = str(tmp_path / f"{tag}.py")
        return mod

    code_namespaces([])
    first, second = users_module("first"), users_module("second")
    sys.modules[first.__name__] = first
    try:
        assert any(ns is vars(first) for ns in code_namespaces([]))
        sys.modules[first.__name__] = second
        spaces = code_namespaces([])
        assert any(ns is vars(second) for ns in spaces)
        assert not any(ns is vars(first) for ns in spaces)
    finally:
        del sys.modules[first.__name__]
    assert not any(ns is vars(second) for ns in code_namespaces([]))


class EvalRRelu(sarc.Layer):
    """``F.rrelu`` out of training (its default) is a leaky ReLU of slope (lower + upper) / 2:
    no draw."""

    def __init__(self, training: bool):
        super().__init__(node={"h": 3})
        self.draws = training

    def message(self, src, dst, edge):
        return F.rrelu(src.h, 0.1, 0.3, training=self.draws)  # ERR:rrelu

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_rrelu_out_of_training_is_a_leaky_relu_and_in_training_a_draw():
    g = sarc.Graph.from_edges([0, 1, 2], [1, 2, 0], 3)
    h = torch.randn(3, 3)
    got = EvalRRelu(False)(g, h)
    want = torch.zeros(3, 3).index_add_(0, torch.tensor([1, 2, 0]),
                                        F.leaky_relu(h[[0, 1, 2]], 0.2))
    torch.testing.assert_close(got, want)
    expect_error_at(lambda: EvalRRelu(True).trace(), "rrelu", "rrelu() draws a random number")
