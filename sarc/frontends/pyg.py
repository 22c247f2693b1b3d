"""PyG users keep their models: PyG convolutions as sarc layers, sarc layers as PyG convolutions.

- ``from_message_passing(conv)``: a ``sarc.Layer`` that holds ``conv`` (its parameters are
  the conv's own tensors, so training either trains both) and computes what
  ``conv(x, edge_index[, edge_attr])`` computes. The classes PyG ships with that sarc
  models (GCNConv, SAGEConv, GATConv, GATv2Conv, GINConv, GINEConv,
  RGCNConv, ResGatedGraphConv, TransformerConv) are converted one by one, from the
  conv's attributes (heads, concat, aggr, eps...), into the DSL, and so is a subclass
  of one that overrides none of its methods (a conv of K rounds, SGConv, APPNP, TAGConv
  or ChebConv, becomes K layers: ``pyg_rounds.PyGRounds``); any other ``MessagePassing`` has its own
  ``forward``, ``message`` and ``update`` traced (``TracedConv``); what its forward
  computes from ``edge_index`` alone runs on the real graph when the inputs are prepared
  (``pyg_prepare``). Whatever cannot be modelled exactly is a
  ``ConversionError`` naming the conv's class and the construct.
- ``as_conv(layer)``: a ``torch.nn.Module`` with PyG's calling convention,
  ``forward(x, edge_index[, edge_attr], size=None)``, that builds the ``sarc.Graph`` of
  an ``edge_index`` once (reused while the edge_index, the node count and the edge_attr
  hold the same values) and runs ``layer`` on it; it works inside ``torch_geometric.nn.Sequential``.

What a conv's ``forward`` does to the graph (self loops added or removed, GCN's
normalization, RGCN's per-relation mean) is done by PyG's own functions when the inputs
are prepared (``PyGLayer.prepare``): the prepared edge list is the graph the sarc layer
runs on, and the per-edge weights it needs are edge features. A distributed run
partitions that prepared graph (its edges and edge features), not the raw one.

PyG is imported inside the functions that need it, never when sarc is imported.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import operator
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .. import dsl
from ..dsl import INDEX, Layer
from ..errors import DSLError, GraphError, SarcError, class_loc
from ..graph import Graph
from ..interop import from_pyg
from ..ir.ops import Op
from ..ir.types import Domain
from ..trace import Proxy, RowCount, dropout, leaky_relu, user_loc
from ..trace_guards import builtins_take_tensor_proxies, code_namespaces, routed
from ..trace_torch import AcrossRowsError
from . import follow_mode, in_module
from . import pyg_prepare as pp
from .pyg_prepare import flat as _flat


class ConversionError(SarcError, TypeError):
    """A PyG conv, or a call of one, that sarc cannot model exactly; names the class and
    the construct."""


def _refuse(conv, construct: str, why: str = "") -> ConversionError:
    """``Conv: construct is not supported (why)``; for a user's own conv class, where it is
    defined (a PyG conv's is PyG's)."""
    name = conv if isinstance(conv, str) else type(conv).__name__
    text = f"{name}: {construct} is not supported" + (f" ({why})" if why else "")
    cls = None if isinstance(conv, str) else type(conv)
    if cls is not None and not cls.__module__.startswith("torch_geometric."):
        loc = class_loc(cls)
        if loc is not None:
            text += f"; {name} is defined at {loc}"
    return ConversionError(text)


@dataclass
class PyGInputs:
    """A conv's graph after its ``forward``'s graph preparation, and its edge features."""

    edge_index: torch.Tensor                 # [2, E'], the edges the layer aggregates over: row 0
                                             # the messages' sources, row 1 their targets
    num_nodes: int
    edge: dict[str, torch.Tensor] = field(default_factory=dict)   # in edge_index's order

    def graph(self) -> Graph:
        return from_pyg(self.edge_index, self.num_nodes)


def oriented(conv, inputs: PyGInputs) -> PyGInputs:
    """``inputs`` with row 0 the sources of messages and row 1 their targets, as a sarc
    graph has them: a conv with ``flow='target_to_source'`` aggregates at
    ``edge_index[0]`` (PyG's ``i``) what it computes at ``edge_index[1]`` (``j``), so
    its prepared edge list is flipped; the edges keep their order, and their features."""
    if _flows_to_sources(conv):
        return PyGInputs(inputs.edge_index.flip(0), inputs.num_nodes, inputs.edge)
    return inputs


def _flows_to_sources(conv) -> bool:
    return getattr(conv, "flow", "source_to_target") == "target_to_source"


class PyGLayer(Layer):
    """A PyG conv as a sarc layer: node feature ``x``, the conv as submodule ``conv``.

    ``prepare(edge_index, num_nodes, edge_attr[, dtype])`` gives the graph and edge
    features the layer runs on (``dtype``: x's, which a conv without parameters computes
    its edge weights in, as PyG's forward does), so that ``layer(inputs.graph(), x, **inputs.edge)`` equals
    ``conv(x, edge_index, edge_attr)``; ``run`` does both.
    """

    edge_input: str | None = None   # the conv's name of its third forward argument

    def __init__(self, conv: nn.Module, in_channels: int, edge: dict | None = None):
        type(self).check_conv(conv)
        super().__init__(node={"x": in_channels}, edge=edge)
        self.conv = conv
        self.train(conv.training)   # dropout follows the sarc layer's mode, from the conv's

    @classmethod
    def check_conv(cls, conv) -> None:
        """What the conversion refuses, refused again at each call (an attribute set since:
        the layer computes the conv as it was converted)."""
        _check_message_passing(conv)

    def forward(self, g, *args, **feats):
        follow_mode(self, self.conv)
        type(self).check_conv(self.conv)
        check_not_hooked(self.conv)
        return super().forward(g, *args, **feats)

    def prepare(self, edge_index, num_nodes: int, edge_attr=None, dtype=None) -> PyGInputs:
        return oriented(self.conv, self._prepare(edge_index, num_nodes, edge_attr, dtype))

    def _prepare(self, edge_index, num_nodes: int, edge_attr=None, dtype=None) -> PyGInputs:
        """What the conv's forward does to the graph, on ``edge_index`` as PyG numbers it."""
        if edge_attr is not None:
            raise _refuse(self.conv, f"the argument {self.edge_input or 'edge_attr'}",
                          "this conv takes x and edge_index only")
        return PyGInputs(edge_index, num_nodes)

    def display_name(self) -> str:
        return type(self.conv).__name__

    def trace(self):
        """The layer's IR; a DSL error while tracing the conv's code names the conv's class."""
        try:
            return super().trace()
        except DSLError as e:
            raise in_module(type(self.conv).__name__, e) from None

    def run(self, x, edge_index, edge_attr=None):
        """``conv(x, edge_index[, edge_attr])``, computed by the sarc layer."""
        inputs = self.prepare(_plain_edge_index(self.conv, edge_index), x.size(0), edge_attr,
                              x.dtype)
        return self(inputs.graph(), x, **inputs.edge)

    def reduce(self, msg):
        return _aggregate(self.conv, msg.m)


# --- checks shared by every conv --------------------------------------------------------------

def _check_message_passing(conv) -> None:
    from torch_geometric.nn import MessagePassing
    if not isinstance(conv, MessagePassing):
        raise ConversionError(f"from_message_passing takes a torch_geometric.nn.MessagePassing "
                              f"layer, got {type(conv).__name__}")
    if getattr(conv, "flow", "source_to_target") not in ("source_to_target",
                                                          "target_to_source"):
        raise _refuse(conv, f"flow={conv.flow!r}", "PyG's flows are 'source_to_target' and "
                      "'target_to_source'")
    if getattr(conv, "decomposed_layers", 1) != 1:
        raise _refuse(conv, f"decomposed_layers={conv.decomposed_layers}")
    if getattr(conv, "node_dim", -2) not in (0, -2):
        raise _refuse(conv, f"node_dim={conv.node_dim}")


def _check_node_axis(conv, value, what: str) -> None:
    """PyG gathers node values and aggregates messages along ``node_dim``; sarc along
    their rows. ``node_dim=-2`` (PyG's default) is the rows of a value of two dimensions
    only: on one of three or more, PyG works along its second axis (heads), so it is
    refused rather than computed along the rows."""
    if getattr(conv, "node_dim", -2) == -2 and isinstance(value, Proxy) and value.dim() > 2:
        raise _refuse(conv, f"node_dim=-2 with {what} of {value.dim()} dimensions",
                      "PyG gathers and aggregates them along their axis -2, not their rows: "
                      "set node_dim=0, as PyG's GATConv does")


_REDUCERS = {"add": dsl.sum, "sum": dsl.sum, "mean": dsl.mean, "max": dsl.max, "min": dsl.min}
_AGGREGATIONS = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
                 "MinAggregation": "min"}


# nn.Module's hooks of state dicts, which sarc's state dicts run as the conv's
_STATE_HOOKS = frozenset({"_state_dict_hooks", "_state_dict_pre_hooks",
                          "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})


def check_not_hooked(conv) -> None:
    """A conv with hooks on its calls (nn.Module's forward / backward hooks, PyG's
    propagate / message / aggregate / edge_update ones) or an explainer's edge mask
    (``torch_geometric.explain`` sets ``explain`` and ``_edge_mask`` on every conv) is
    refused: sarc computes the conv as a sarc layer and never calls it, so neither would
    act, and the result would silently differ from PyG's."""
    if getattr(conv, "explain", None) is True or getattr(conv, "_edge_mask", None) is not None:
        raise _refuse(conv, "an explainer's edge mask (conv.explain, set by "
                            "torch_geometric.explain)", "sarc does not apply it: explain the "
                            "model with its PyG convs")
    for name, hooks in vars(conv).items():
        if not (name.endswith("_hooks") and name not in _STATE_HOOKS
                and isinstance(hooks, dict) and hooks):
            continue
        maker = next((h for h in hooks.values() if type(h).__module__.startswith(
            "torch.nn.utils")), None)
        if maker is not None:   # weight_norm / spectral_norm / pruning of the conv's parameter
            raise _refuse(conv, f"{type(maker).__name__} on a parameter of the conv itself (a "
                                f"forward pre-hook that recomputes it at each call)",
                          "sarc computes the conv as a sarc layer and never calls it, so the "
                          "parameter would not be recomputed")
        registered = _HOOK_REGISTRATION.get(name, f"register{name[:-1]}")
        hint = ", or register a forward hook on the as_conv module" \
            if name in ("_forward_hooks", "_forward_pre_hooks") else ""
        raise _refuse(conv, f"a hook registered with {registered}",
                      f"sarc computes the conv as a sarc layer and never calls it, so the hook "
                      f"would not run; remove it{hint}")


_HOOK_REGISTRATION = {"_backward_hooks": "register_full_backward_hook (or register_backward_hook)",
                      "_backward_pre_hooks": "register_full_backward_pre_hook"}
"""nn.Module's registration methods whose names are not their dicts' (``register`` + the
dict's name less its ``s``)."""


def _aggr_name(conv) -> str:
    """What PyG aggregates with: ``aggr_module``, which ``aggregate`` calls (``aggr`` is the
    name it was built from; setting ``conv.aggr`` later changes nothing in PyG)."""
    aggr = getattr(conv, "aggr", None)
    module = getattr(conv, "aggr_module", None)
    kind = _AGGREGATIONS.get(type(module).__name__)
    if kind is not None and type(module).__module__.startswith("torch_geometric"):
        return kind
    if module is None and "aggr_module" not in vars(conv).get("_modules", {}) \
            and isinstance(aggr, str) and aggr in _REDUCERS:
        return aggr   # a MessagePassing built without aggr_module (not PyG's own)
    if isinstance(aggr, str):
        shown = f"aggr={aggr!r}" + ("" if module is None else f" ({type(module).__name__})")
    else:
        shown = f"aggr={type(module).__name__}"
    raise _refuse(conv, shown, "sarc aggregates with sum/add, mean, max and min, and in a "
                  "conv it traces with PyG's softmax, power mean, var and std aggregations, "
                  "their concatenation and PNA's degree scalers of them")


def _pygs(module, name: str) -> bool:
    """Whether ``module`` is PyG's own class ``name`` (not a user's of the same name)."""
    return type(module).__name__ == name and type(module).__module__.startswith("torch_geometric")


_SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")
_COMPUTED = ("SoftmaxAggregation", "PowerMeanAggregation", "VarAggregation", "StdAggregation",
             "MultiAggregation", "DegreeScalerAggregation")
"""PyG's aggregation classes a traced conv aggregates with, besides ``_AGGREGATIONS``."""


def _computed(module) -> bool:
    """Whether ``module`` is one of PyG's own aggregation classes that sarc computes."""
    name = type(module).__name__
    return _pygs(module, name) and (name in _AGGREGATIONS or name in _COMPUTED)


def _check_aggregation(conv) -> None:
    """A traced conv aggregates with its ``aggr_module`` (``_aggregate``): PyG's sum, mean,
    max, min, softmax, power mean, var and std, their combinations (``MultiAggregation``,
    ``aggr=["mean", "max"]``, in its modes but ``attn``) and PNA's degree scalers of them
    (``DegreeScalerAggregation``); anything else is refused, naming it."""
    module = getattr(conv, "aggr_module", None)
    if _computed(module):
        _check_module(conv, module)
    else:
        _aggr_name(conv)


def _check_module(conv, module) -> None:
    name = type(module).__name__
    if not _computed(module):
        raise _refuse(conv, f"aggr={name}", "sarc aggregates with PyG's sum, mean, max, min, "
                      "softmax, power mean, var and std aggregations, their concatenation "
                      "and PNA's degree scalers of them")
    if name == "PowerMeanAggregation":
        if module.learn and not (module.min_value is not None and module.min_value > 0):
            raise _refuse(conv, f"PowerMeanAggregation(learn=True, clamp_min="
                          f"{module.min_value})", "a learned power is taken of messages "
                          "clamped above 0 (clamp_min > 0, PyG's default 1e-4)")
    elif name == "MultiAggregation":
        names = [type(a).__name__ for a in module.aggrs]
        shown = f"aggr=MultiAggregation([{', '.join(names)}], mode={module.mode!r})"
        if module.mode not in _COMBINES:
            raise _refuse(conv, shown, f"sarc combines aggregations by "
                          f"{', '.join(map(repr, _COMBINES))}")
        for a in module.aggrs:
            if not _computed(a):
                raise _refuse(conv, shown, "sarc concatenates PyG's sum, mean, max, min, "
                              "softmax, power mean, var and std aggregations")
            _check_module(conv, a)
    elif name == "DegreeScalerAggregation":
        unknown = [s for s in module.scaler if s not in _SCALERS]
        if unknown:
            raise _refuse(conv, f"DegreeScalerAggregation(scaler={unknown})",
                          f"PyG's scalers are {', '.join(_SCALERS)}")
        _check_module(conv, module.aggr)


def _aggregate(conv, value):
    """``value`` aggregated over the edges into each node as the conv's ``aggr_module``
    does (``_check_aggregation``), or by its ``aggr`` name where it has none."""
    _check_aggregation(conv)
    _check_node_axis(conv, value, "messages")
    module = getattr(conv, "aggr_module", None)
    if not _computed(module):
        return _REDUCERS[_aggr_name(conv)](value)
    _check_channels(conv, module, value)
    return _aggregation(module, value)


def _check_channels(conv, module, value) -> None:
    """PyG's softmax and power mean aggregations with a value per channel
    (``channels != 1``) take messages of two dimensions only, and raise otherwise: so
    does sarc, rather than broadcast the channels over a value of more."""
    members = module.aggrs if type(module).__name__ == "MultiAggregation" else [module]
    for m in members:
        if getattr(m, "channels", 1) != 1 and isinstance(value, Proxy) and value.dim() != 2:
            raise _refuse(conv, f"{type(m).__name__}(channels={m.channels}) of messages of "
                          f"{value.dim()} dimensions", "PyG's aggregation requires "
                          "two-dimensional inputs where it has a value per channel")


def _aggregation(module, value):
    """What PyG's aggregation ``module`` computes of per-edge ``value`` (checked)."""
    name = type(module).__name__
    if name in _AGGREGATIONS:
        return _REDUCERS[_AGGREGATIONS[name]](value)
    if name == "SoftmaxAggregation":
        return _softmax_aggregate(module, value)
    if name == "PowerMeanAggregation":
        return _power_mean_aggregate(module, value)
    if name == "VarAggregation":
        return _variance(module, value)
    if name == "StdAggregation":   # as PyG: sqrt(clamp(var, 1e-5)), 0 at or below the clamp
        std = _variance(module.var_aggr, value).clamp(min=1e-5).sqrt()
        return std.masked_fill(std <= math.sqrt(1e-5), 0.0)
    if name == "MultiAggregation":
        return _combined(module, [_aggregation(a, value) for a in module.aggrs])
    return _degree_scaled(module, value)


_COMBINES = ("cat", "proj", "sum", "mean", "max", "min", "logsumexp", "std", "var")
"""The modes of PyG's ``MultiAggregation`` sarc computes (not ``attn``)."""


def _combined(module, outs: list):
    """PyG's ``MultiAggregation.combine`` of the aggregations' outputs: concatenated
    (``cat``), concatenated and projected (``proj``), or reduced over the aggregations
    as ``torch.<mode>(torch.stack(outs), dim=0)`` (max / min: the first output that
    attains it takes the gradient, as torch's indices of a reduction over a dim)."""
    if len(outs) == 1:
        return outs[0]
    mode = module.mode
    if mode in ("cat", "proj"):
        cat = torch.cat(outs, dim=-1)
        return module.lin(cat) if mode == "proj" else cat
    if mode in ("max", "min", "logsumexp"):
        best = outs[0]
        for x in outs[1:]:
            best = torch.where((x < best) if mode == "min" else (x > best), x, best)
        if mode != "logsumexp":
            return best
        top = best.detach()
        return top + torch.log(sum(torch.exp(x - top) for x in outs))
    total = outs[0]
    for x in outs[1:]:
        total = total + x
    if mode == "sum":
        return total
    mean = total / len(outs)
    if mode == "mean":
        return mean
    var = sum((x - mean) * (x - mean) for x in outs) / (len(outs) - 1)
    if mode == "var":
        return var
    flat = var <= 0   # torch.std's gradient where it is 0 (equal outputs): 0, not NaN
    return var.masked_fill(flat, 1.0).sqrt().masked_fill(flat, 0.0)


def _variance(module, value):
    """PyG's ``VarAggregation``: ``mean(x^2) - mean(x)^2`` (with ``semi_grad``, the mean of
    the squares gets no gradient: PyG computes it under ``no_grad``)."""
    mean, squares = dsl.mean(value), dsl.mean(value * value)
    return (squares.detach() if module.semi_grad else squares) - mean * mean


def _degree_scaled(module, value):
    """PyG's ``DegreeScalerAggregation`` (PNA's): the inner aggregation's output times each
    scaler of the node's in-edge count ``d`` (``log(d + 1) / avg_deg_log``, its inverse of
    ``d`` clamped to 1, ``d / avg_deg_lin`` and its inverse), concatenated in the order
    given."""
    out = _aggregation(module.aggr, value)
    deg = dsl.sum(torch.ones_like(value[..., :1]))
    scaled = {"identity": lambda: out,
              "amplification": lambda: out * (torch.log(deg + 1) / module.avg_deg_log),
              "attenuation": lambda: out * (module.avg_deg_log / torch.log(deg.clamp(min=1) + 1)),
              "linear": lambda: out * (deg / module.avg_deg_lin),
              "inverse_linear": lambda: out * (module.avg_deg_lin / deg.clamp(min=1))}
    outs = [scaled[s]() for s in module.scaler]
    return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


def _softmax_aggregate(module, value):
    """PyG's ``SoftmaxAggregation``: ``sum_e softmax_v(t * x_e) * x_e`` over the edges into
    each node, per feature channel, ``t`` its temperature (a number, or a parameter of one
    or ``channels`` values); with ``semi_grad`` the weights get no gradient (PyG computes
    them under ``no_grad``)."""
    t = module.t
    score = value if isinstance(t, (int, float)) and t == 1 else value * t
    weights = dsl.edge_softmax(score)
    if module.semi_grad and not module.learn:
        weights = weights.detach()
    return dsl.sum(value * weights)


def _power_mean_aggregate(module, value):
    """PyG's ``PowerMeanAggregation``: ``clamp(mean_e clamp(x_e)^p)^(1/p)`` over the edges
    into each node (``clamp``: to ``[clamp_min, clamp_max]``); a learned ``p`` (one or
    ``channels`` values) as ``x exp((p - 1) log x)``, of messages clamped above 0: exact
    at p = 1, where PyG starts a learned p and where p's gradient is a difference of
    nearly equal terms (``exp(p log x)``'s rounding made it off by 1e-3 in float32;
    torch's ``pow`` is exact there)."""
    p = module.p

    def power(x, e):
        x = x.clamp(min=module.min_value, max=module.max_value)
        return x.pow(e) if isinstance(e, (int, float)) else x * torch.exp((e - 1) * torch.log(x))
    if isinstance(p, (int, float)) and p == 1:
        return dsl.mean(value)
    return power(dsl.mean(power(value, p)), 1.0 / p)


def _by_the_convs_names(layer, edge_attr, others: dict):
    """``edge_attr`` and the keyword arguments ``as_conv`` is not given by position, as an
    imported conv's forward names them: its third argument by its own name
    (``conv(x, edge_index, edge_weight=w)``, as PyG's models call a GCNConv), another of
    its arguments given as its default None (``edge_attr=None``) as not given."""
    conv = getattr(layer, "conv", None) if _imported(layer) else None
    if conv is None or not others:
        return edge_attr, others
    params = inspect.signature(conv.forward).parameters
    third = list(params)[2:3]
    rest = {}
    for k, v in others.items():
        if third and k == third[0] and edge_attr is None:
            edge_attr = v
        elif k in params and v is None and params[k].default is None:
            continue
        else:
            rest[k] = v
    return edge_attr, rest


def _plain_edge_index(conv, edge_index) -> torch.Tensor:
    """``edge_index`` as a [2, E] int64 tensor (PyG's ``EdgeIndex`` as the ids it holds); a
    SparseTensor or sparse adjacency is refused."""
    if type(edge_index).__name__ == "SparseTensor":
        raise _refuse(conv, "a torch_sparse.SparseTensor adjacency",
                      "pass edge_index as a [2, E] tensor")
    if isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided:
        raise _refuse(conv, f"a sparse adjacency ({edge_index.layout})",
                      "pass edge_index as a [2, E] tensor")
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = (list(edge_index.shape) if isinstance(edge_index, torch.Tensor)
                 else type(edge_index).__name__)
        name = conv if isinstance(conv, str) else type(conv).__name__
        raise ConversionError(f"{name}: edge_index must be a [2, E] tensor, got {shape}")
    if type(edge_index) is not torch.Tensor:   # EdgeIndex, or another subclass of Tensor
        edge_index = (edge_index.as_tensor() if hasattr(edge_index, "as_tensor")
                      else edge_index.as_subclass(torch.Tensor))
    return edge_index


def _in_channels(conv, value=None) -> int:
    ch = getattr(conv, "in_channels", None) if value is None else value
    if isinstance(ch, int) and ch > 0:
        return ch
    if isinstance(ch, (tuple, list)):
        raise _refuse(conv, f"in_channels={tuple(ch)} (separate source and target features)",
                      "sarc's layer reads one node feature x on both ends of an edge")
    if ch is None and not hasattr(conv, "in_channels"):
        raise ConversionError(f"{type(conv).__name__} does not record its input width (no "
                              f"in_channels attribute): give it, as_conv(conv, in_channels=...) "
                              f"or from_message_passing(conv, in_channels=...)")
    if isinstance(ch, int) and ch < 0:
        raise _refuse(conv, f"in_channels={ch} (a lazy conv)", "sarc declares the layer's "
                      "input width when it imports the conv: build the conv with its input "
                      "width")
    raise _refuse(conv, f"in_channels={ch!r}", "give the width: from_message_passing(conv, "
                  "in_channels=...)")


def _require(conv, ok: bool, construct: str, why: str = "") -> None:
    if not ok:
        raise _refuse(conv, construct, why)


def _require_aggr(conv, allowed: tuple[str, ...], why: str = "") -> None:
    """The conv aggregates with one of ``allowed``, named as PyG aggregates now (its
    ``aggr_module``; ``conv.aggr`` keeps the name it was built with)."""
    name = _aggr_name(conv)
    _require(conv, name in allowed, f"aggr={name!r}", why)


def _ones(edge_index: torch.Tensor) -> torch.Tensor:
    return torch.ones(edge_index.size(1), device=edge_index.device)


# --- the classes PyG ships with -----------------------------------------------------------------

class GCNConvLayer(PyGLayer):
    """GCNConv: ``gcn_norm`` (PyG's own, with ``add_remaining_self_loops``) gives each
    edge its weight when the inputs are prepared; the layer sums ``w_uv * lin(x_u)``.
    ``cached=True``: ``as_conv`` keeps the first call's graph, as PyG does."""

    edge_input = "edge_weight"

    def __init__(self, conv):
        _aggr_name(conv)
        super().__init__(conv, _in_channels(conv), edge={"edge_weight": ()})

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        c = self.conv
        if c.normalize:
            from torch_geometric.nn.conv.gcn_conv import gcn_norm
            edge_index, weight = gcn_norm(edge_index, edge_attr, num_nodes, c.improved,
                                          c.add_self_loops, c.flow, c.lin.weight.dtype)
        else:
            weight = _ones(edge_index) if edge_attr is None else edge_attr
        weight = weight.reshape(-1).to(c.lin.weight.dtype)
        return PyGInputs(edge_index, num_nodes, {"edge_weight": weight})

    def message(self, src, dst, edge):
        return edge.edge_weight.unsqueeze(-1) * self.conv.lin(src.x)

    def update(self, dst, agg):
        return agg.agg + self.conv.bias if self.conv.bias is not None else agg.agg


class SAGEConvLayer(PyGLayer):
    """SAGEConv: ``lin_l(aggr_u x_u) + lin_r(x_v)``."""

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv))

    @classmethod
    def check_conv(cls, conv) -> None:
        super().check_conv(conv)
        _aggr_name(conv)
        _require(conv, not conv.project, "project=True")
        _require(conv, not conv.normalize, "normalize=True", "F.normalize of the output")

    def message(self, src, dst, edge):
        return src.x

    def update(self, dst, agg):
        out = self.conv.lin_l(agg.agg)
        return out + self.conv.lin_r(dst.x) if self.conv.root_weight else out


class GATConvLayer(PyGLayer):
    """GATConv: self loops as PyG's forward makes them (``remove_self_loops`` then
    ``add_self_loops``, edge features of the new loops by ``fill_value``), attention
    ``softmax(leaky_relu(a_s.z_u + a_d.z_v [+ a_e.W_e e_uv]))``. With ``edge_dim`` set,
    a call without ``edge_attr`` runs the layer's variant without the edge term (PyG skips
    it: ``lin_edge`` and ``att_edge`` get no gradient, not a zero one)."""

    edge_input = "edge_attr"

    def __init__(self, conv, edge_term: bool = True):
        edge_term = edge_term and conv.edge_dim is not None
        super().__init__(conv, _in_channels(conv), edge=_edge_attr(conv) if edge_term else None)
        self._edge_term = edge_term

    # GATConv's edge_update returns before the edge term on a graph without edges
    no_edge_term_without_edges = True

    @classmethod
    def check_conv(cls, conv) -> None:
        super().check_conv(conv)
        _require_aggr(conv, ("add", "sum"))

    def forward(self, g, *args, **feats):
        if self._edge_term and (not _given(self, "edge_attr", args, feats) or (
                self.no_edge_term_without_edges and isinstance(g, Graph)
                and g.num_edges == 0)):
            if len(args) == 1 and isinstance(args[0], dict):
                args = ({k: v for k, v in args[0].items() if k != "edge_attr"},)
            feats = {k: v for k, v in feats.items() if k != "edge_attr"}
            return self._without_edge_term()(g, *args[:len(self._sarc_node)], **feats)
        return super().forward(g, *args, **feats)

    def _without_edge_term(self) -> "GATConvLayer":
        """The layer without the edge term, traced and compiled once, sharing the conv
        (kept outside the module tree: no second copy of the parameters in state dicts)."""
        other = self.__dict__.get("_sarc_without_edge")
        if other is None:
            other = type(self)(self.conv, edge_term=False)
            object.__setattr__(self, "_sarc_without_edge", other)
        if other.training != self.training:
            other.train(self.training)
        if other._sarc_backend != self._sarc_backend:
            other.set_backend(self._sarc_backend)
        if other._sarc_autodiff != self._sarc_autodiff:
            other.set_autodiff(self._sarc_autodiff)
        return other

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        edge_index, edge_attr = _self_loops(self.conv, edge_index, edge_attr, num_nodes)
        return PyGInputs(edge_index, num_nodes, _edge_inputs(self.conv, edge_index, edge_attr))

    def _project(self, x, side: str):
        c = self.conv
        lin = c.lin if c.lin is not None else getattr(c, f"lin_{side}")
        return lin(x).view(-1, c.heads, c.out_channels)

    def message(self, src, dst, edge):
        c = self.conv
        z_u, z_v = self._project(src.x, "src"), self._project(dst.x, "dst")
        score = (z_u * c.att_src).sum(-1) + (z_v * c.att_dst).sum(-1)
        if self._edge_term:
            score = score + (_edge_heads(c, edge.edge_attr) * c.att_edge).sum(-1)
        return {"z": z_u, "score": leaky_relu(score, c.negative_slope)}

    def reduce(self, msg):
        alpha = dropout(dsl.edge_softmax(msg.score), self.conv.dropout)
        return dsl.sum(msg.z * alpha.unsqueeze(-1))

    def update(self, dst, agg):
        return _heads_out(self.conv, agg.agg, dst.x, getattr(self.conv, "res", None))


class GATv2ConvLayer(GATConvLayer):
    """GATv2Conv: attention ``softmax(a . leaky_relu(W_l x_u + W_r x_v [+ W_e e_uv]))``."""

    no_edge_term_without_edges = False

    def message(self, src, dst, edge):
        c = self.conv
        x_l = c.lin_l(src.x).view(-1, c.heads, c.out_channels)
        lin_r = c.lin_l if c.share_weights else c.lin_r
        x = lin_r(dst.x).view(-1, c.heads, c.out_channels) + x_l
        if self._edge_term:
            x = x + _edge_heads(c, edge.edge_attr)
        score = (leaky_relu(x, c.negative_slope) * c.att).sum(-1)
        return {"z": x_l, "score": score}


def _edge_attr(conv) -> dict | None:
    """The edge feature of a conv with ``edge_dim``: ``edge_attr`` [E, edge_dim]."""
    return None if conv.edge_dim is None else {"edge_attr": conv.edge_dim}


def _edge_inputs(conv, edge_index, edge_attr) -> dict:
    """``edge_attr`` as [E, edge_dim] (the conv's declared width, so a graph without edges
    has [0, edge_dim] features); without one, nothing: the layer then runs its variant
    without the edge term (``GATConvLayer.forward``), as PyG skips the term."""
    if conv.edge_dim is None:
        if edge_attr is not None:
            raise _refuse(conv, "an edge_attr argument", "edge_dim is None, so PyG ignores it")
        return {}
    if edge_attr is None:
        return {}
    rows = edge_index.size(1)
    if edge_attr.dim() == 0 or edge_attr.size(0) != rows \
            or edge_attr.numel() != rows * conv.edge_dim:
        raise ConversionError(f"{type(conv).__name__}: edge_attr of shape "
                              f"{list(edge_attr.shape)} for {rows} edges and "
                              f"edge_dim={conv.edge_dim}; give [E, {conv.edge_dim}]")
    return {"edge_attr": edge_attr.reshape(rows, conv.edge_dim)}


def _given(layer, name: str, args: tuple, feats: dict) -> bool:
    """Whether a layer call gives feature ``name`` (by name, positionally or in a mapping),
    not as None."""
    if len(args) == 1 and isinstance(args[0], dict):
        feats = {**args[0], **feats}
        args = ()
    order = [*layer._sarc_node, *layer._sarc_edge]
    given = dict(zip(order, args), **{k: v for k, v in feats.items() if k not in order[:len(args)]})
    return given.get(name) is not None


def _edge_heads(conv, edge_attr):
    return conv.lin_edge(edge_attr).view(-1, conv.heads, conv.out_channels)


def _self_loops(conv, edge_index, edge_attr, num_nodes):
    if not conv.add_self_loops:
        return edge_index, edge_attr
    from torch_geometric.utils import add_self_loops, remove_self_loops
    edge_index, edge_attr = remove_self_loops(edge_index, edge_attr)
    return add_self_loops(edge_index, edge_attr, fill_value=conv.fill_value, num_nodes=num_nodes)


def _heads_out(conv, out, x_dst, res):
    """Heads concatenated or averaged, then the residual and the bias (GAT, GATv2)."""
    out = out.flatten(1) if conv.concat else out.mean(1)
    if res is not None:
        out = out + res(x_dst)
    return out + conv.bias if conv.bias is not None else out


class GINConvLayer(PyGLayer):
    """GINConv: ``nn((1 + eps) x_v + sum_u x_u)``. A fixed ``eps`` (a buffer) is read
    when the layer compiles."""

    def __init__(self, conv):
        super().__init__(conv, _gin_in_channels(conv))

    @classmethod
    def check_conv(cls, conv) -> None:
        super().check_conv(conv)
        _require_aggr(conv, ("add", "sum"))

    def message(self, src, dst, edge):
        return src.x

    def update(self, dst, agg):
        return self.conv.nn(agg.agg + (1 + _eps(self.conv)) * dst.x)


class GINEConvLayer(GINConvLayer):
    """GINEConv: ``nn((1 + eps) x_v + sum_u relu(x_u + lin(e_uv)))``."""

    edge_input = "edge_attr"

    def __init__(self, conv):
        width = conv.lin.in_channels if conv.lin is not None else _gin_in_channels(conv)
        PyGLayer.__init__(self, conv, _gin_in_channels(conv), edge={"edge_attr": width})

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        if edge_attr is None:
            raise ConversionError("GINEConv: edge_attr is required (GINEConv's forward needs it)")
        return PyGInputs(edge_index, num_nodes, {"edge_attr": edge_attr})

    def message(self, src, dst, edge):
        e = self.conv.lin(edge.edge_attr) if self.conv.lin is not None else edge.edge_attr
        return (src.x + e).relu()


def _gin_in_channels(conv) -> int:
    first = conv.nn[0] if isinstance(conv.nn, nn.Sequential) else conv.nn
    width = getattr(first, "in_features", getattr(first, "in_channels", None))
    if not isinstance(width, int) or width <= 0:
        raise _refuse(conv, f"nn={type(conv.nn).__name__} without an input width",
                      "its first module needs in_features or in_channels")
    return width


def _eps(conv):
    if isinstance(conv.eps, nn.Parameter) or isinstance(conv.eps, Proxy):
        return conv.eps
    return float(conv.eps)


class RGCNConvLayer(PyGLayer):
    """RGCNConv: ``x_v @ root + sum_r aggr_{u -r-> v} x_u @ W_r + bias``; per-relation
    mean is a weight ``1 / |N_r(v)|`` per edge, computed when the inputs are prepared."""

    edge_input = "edge_type"

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv, conv.in_channels_l),
                         edge={"edge_type": INDEX, "norm": ()})

    @classmethod
    def check_conv(cls, conv) -> None:
        super().check_conv(conv)
        _require(conv, conv.num_blocks is None, f"num_blocks={conv.num_blocks}",
                 "block-diagonal decomposition")
        _require_aggr(conv, ("add", "sum", "mean"), "a per-relation max or min")

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        if edge_attr is None:
            raise ConversionError("RGCNConv: edge_type is required (RGCNConv's third argument)")
        etype = edge_attr.to(torch.int64)
        if _aggr_name(self.conv) == "mean":
            r = self.conv.num_relations   # PyG's mean is over each target's edges of a type
            key = edge_index[0 if _flows_to_sources(self.conv) else 1] * r + etype
            counts = torch.bincount(key, minlength=num_nodes * r).to(self.conv.weight.dtype)
            norm = 1.0 / counts[key]
        else:
            norm = _ones(edge_index).to(self.conv.weight.dtype)
        return PyGInputs(edge_index, num_nodes, {"edge_type": etype, "norm": norm})

    def _table(self):
        c = self.conv
        if c.num_bases is None:
            return c.weight
        flat = c.weight.reshape(c.num_bases, c.in_channels_l * c.out_channels)
        return (c.comp @ flat).reshape(c.num_relations, c.in_channels_l, c.out_channels)

    def message(self, src, dst, edge):
        x = src.x
        typed = x.tracer.emit(Op.TYPED_LINEAR, [x, self._table(), edge.edge_type])
        return typed * edge.norm.unsqueeze(-1)

    def reduce(self, msg):
        return dsl.sum(msg.m)   # the per-relation mean is in the edge weight

    def update(self, dst, agg):
        out = agg.agg
        if self.conv.root is not None:
            out = out + dst.x @ self.conv.root
        return out + self.conv.bias if self.conv.bias is not None else out


class ResGatedGraphConvLayer(PyGLayer):
    """ResGatedGraphConv: ``sum_u act(k_v + q_u) * v_u + W_s x_v + b``, the keys, queries
    and values ``W x`` (with ``edge_dim``: ``W [x, e_uv]`` per edge)."""

    edge_input = "edge_attr"

    def __init__(self, conv):
        _aggr_name(conv)
        super().__init__(conv, _in_channels(conv), edge=_edge_attr(conv))

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        if self.conv.edge_dim is not None and edge_attr is None:
            raise ConversionError("ResGatedGraphConv: edge_attr is required (edge_dim is set)")
        return PyGInputs(edge_index, num_nodes, _edge_inputs(self.conv, edge_index, edge_attr))

    def message(self, src, dst, edge):
        c = self.conv
        if c.edge_dim is None:
            k, q, v = c.lin_key(dst.x), c.lin_query(src.x), c.lin_value(src.x)
        else:
            e = edge.edge_attr
            k = c.lin_key(torch.cat([dst.x, e], dim=-1))
            q = c.lin_query(torch.cat([src.x, e], dim=-1))
            v = c.lin_value(torch.cat([src.x, e], dim=-1))
        return c.act(k + q) * v

    def update(self, dst, agg):
        c = self.conv
        out = agg.agg + c.lin_skip(dst.x) if c.root_weight else agg.agg
        return out + c.bias if c.bias is not None else out


class TransformerConvLayer(PyGLayer):
    """TransformerConv (beta=False): ``sum_u softmax_u(q_v . k_u / sqrt(C)) v_u`` per head,
    heads concatenated or averaged, plus ``lin_skip(x_v)``."""

    edge_input = "edge_attr"

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv), edge=_edge_attr(conv))

    @classmethod
    def check_conv(cls, conv) -> None:
        super().check_conv(conv)
        _require(conv, not conv.beta, "beta=True", "the gated skip connection")
        _require_aggr(conv, ("add", "sum"))

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        if self.conv.edge_dim is not None and edge_attr is None:
            raise ConversionError("TransformerConv: edge_attr is required (edge_dim is set)")
        return PyGInputs(edge_index, num_nodes, _edge_inputs(self.conv, edge_index, edge_attr))

    def message(self, src, dst, edge):
        c = self.conv
        H, C = c.heads, c.out_channels
        key = c.lin_key(src.x).view(-1, H, C)
        value = c.lin_value(src.x).view(-1, H, C)
        if c.edge_dim is not None:
            e = _edge_heads(c, edge.edge_attr)
            key, value = key + e, value + e
        query = c.lin_query(dst.x).view(-1, H, C)
        return {"v": value, "score": (query * key).sum(-1) / math.sqrt(C)}

    def reduce(self, msg):
        alpha = dropout(dsl.edge_softmax(msg.score), self.conv.dropout)
        return dsl.sum(msg.v * alpha.unsqueeze(-1))

    def update(self, dst, agg):
        c = self.conv
        out = agg.agg.flatten(1) if c.concat else agg.agg.mean(1)
        return out + c.lin_skip(dst.x) if c.root_weight else out


def weights_dtype(conv, dtype):
    """The dtype of a conv's edge weights: its parameters', or x's for a conv without (PyG's
    forward normalizes in x's dtype); float32 when neither is known."""
    floats = [p.dtype for p in conv.parameters() if p.is_floating_point()]
    return floats[0] if floats else (dtype or torch.float32)


def weighted_inputs(conv, edge_index, num_nodes: int, w, dtype) -> PyGInputs:
    """The prepared graph with its ``edge_weight``: ``w``, or 1 per edge where the forward
    has none (``x_j`` alone, which equals ``1 * x_j`` under every aggregation)."""
    dtype = weights_dtype(conv, dtype)
    if w is None:
        w = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    # a weight PyG computes in float32 multiplies float64 features exactly as its cast
    return PyGInputs(edge_index, num_nodes, {"edge_weight": w.reshape(-1).to(dtype)})


class _WeightedSum(PyGLayer):
    """A conv whose message is ``w_uv * x_u`` (PyG's ``edge_weight.view(-1, 1) * x_j``),
    its weights made when the inputs are prepared, as its forward makes them; 1 where the
    forward has none (``x_j`` alone, which equals ``1 * x_j`` under every aggregation)."""

    edge_input = "edge_weight"

    def __init__(self, conv, in_channels: int):
        _aggr_name(conv)
        super().__init__(conv, in_channels, edge={"edge_weight": ()})

    def _dtype(self, dtype):
        return weights_dtype(self.conv, dtype)

    def _weights(self, edge_index, num_nodes, w, dtype):
        return weighted_inputs(self.conv, edge_index, num_nodes, w, dtype)

    def message(self, src, dst, edge):
        return edge.edge_weight.unsqueeze(-1) * src.x


class LGConvLayer(_WeightedSum):
    """LGConv: ``sum_u w_uv x_u``, ``w`` PyG's ``gcn_norm`` without self loops
    (``normalize=True``) or the edge weights given."""

    def __init__(self, conv, in_channels=None):
        super().__init__(conv, _in_channels(conv, in_channels))

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        c = self.conv
        if c.normalize:
            from torch_geometric.nn.conv.gcn_conv import gcn_norm
            edge_index, edge_attr = gcn_norm(edge_index, edge_attr, num_nodes,
                                             add_self_loops=False, flow=c.flow,
                                             dtype=self._dtype(dtype))
        return self._weights(edge_index, num_nodes, edge_attr, dtype)

    def update(self, dst, agg):
        return agg.agg


class SGConvLayer(_WeightedSum):
    """SGConv with ``K=1``: ``lin(sum_u w_uv x_u)``, ``w`` PyG's ``gcn_norm``."""

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv))

    @classmethod
    def check_conv(cls, conv) -> None:
        super().check_conv(conv)
        _require(conv, conv.K == 1, f"K={conv.K}",
                 "K rounds of message passing; a sarc layer is one round")
        _require(conv, not conv.cached, "cached=True",
                 "PyG reuses its first call's propagated features")

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        from torch_geometric.nn.conv.gcn_conv import gcn_norm
        c = self.conv
        edge_index, w = gcn_norm(edge_index, edge_attr, num_nodes, False, c.add_self_loops,
                                 c.flow, dtype=self._dtype(dtype))
        return self._weights(edge_index, num_nodes, w, dtype)

    def update(self, dst, agg):
        return self.conv.lin(agg.agg)


class ClusterGCNConvLayer(_WeightedSum):
    """ClusterGCNConv: ``lin_out(sum_u w_uv x_u) + lin_root(x_v)``, ``w_uv = 1 / deg(v)``
    plus ``diag_lambda / deg(v)`` on self loops, computed as its forward does."""

    def __init__(self, conv):
        super().__init__(conv, _in_channels(conv))

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        from torch_geometric.utils import add_self_loops, degree, remove_self_loops
        c = self.conv
        if edge_attr is not None:
            raise _refuse(c, "an edge weight argument", "its forward takes x and edge_index")
        if c.add_self_loops:
            edge_index, _ = remove_self_loops(edge_index)
            edge_index, _ = add_self_loops(edge_index, num_nodes=num_nodes)
        row, col = edge_index[0], edge_index[1]
        deg_inv = 1. / degree(col, num_nodes=num_nodes).clamp_(1.)
        w = deg_inv[col]
        loops = row == col
        if int(loops.sum()) != num_nodes:
            raise ConversionError(f"ClusterGCNConv: add_self_loops=False on a graph with "
                                  f"{int(loops.sum())} self loops for {num_nodes} nodes "
                                  f"(its forward adds diag_lambda / deg to one loop per node)")
        w[loops] += c.diag_lambda * deg_inv
        return self._weights(edge_index, num_nodes, w, dtype)

    def update(self, dst, agg):
        return self.conv.lin_out(agg.agg) + self.conv.lin_root(dst.x)


class SimpleConvLayer(_WeightedSum):
    """SimpleConv with ``combine_root='self_loop'``: the aggregate of ``w_uv x_u`` over the
    graph with a self loop per node (weight 1), as its forward's ``add_self_loops``."""

    def __init__(self, conv, in_channels=None):
        super().__init__(conv, _in_channels(conv, in_channels))

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        from torch_geometric.utils import add_self_loops
        edge_index, w = add_self_loops(edge_index, edge_attr, num_nodes=num_nodes)
        return self._weights(edge_index, num_nodes, w, dtype)

    def update(self, dst, agg):
        return agg.agg


def _sage_conv(conv, in_channels=None, edge_dim=None) -> PyGLayer:
    """SAGEConv of one aggregation, without ``project`` and ``normalize``: converted; any
    other (``aggr=["mean", "max"]``, ``project=True``, ``normalize=True``): traced."""
    try:
        SAGEConvLayer.check_conv(conv)
    except ConversionError:
        return TracedConv(conv, in_channels, edge_dim)
    return SAGEConvLayer(conv)


def _simple_conv(conv, in_channels=None, edge_dim=None) -> PyGLayer:
    if conv.combine_root == "self_loop":
        return SimpleConvLayer(conv, in_channels)
    return TracedConv(conv, in_channels, edge_dim)


def _converters() -> dict[type, Callable[..., PyGLayer]]:
    """Per stock class, its converter: ``convert(conv, in_channels, edge_dim)`` (the widths
    matter to convs that do not record them); a conv of K rounds is a ``PyGRounds``
    (``frontends.pyg_rounds``)."""
    from torch_geometric import nn as pyg
    fixed = {pyg.GCNConv: GCNConvLayer, pyg.SAGEConv: SAGEConvLayer, pyg.GATConv: GATConvLayer,
             pyg.GATv2Conv: GATv2ConvLayer, pyg.GINConv: GINConvLayer,
             pyg.GINEConv: GINEConvLayer, pyg.RGCNConv: RGCNConvLayer,
             pyg.ResGatedGraphConv: ResGatedGraphConvLayer,
             pyg.TransformerConv: TransformerConvLayer,
             pyg.ClusterGCNConv: ClusterGCNConvLayer}
    out: dict[type, Callable[..., PyGLayer]] = {
        cls: (lambda conv, in_channels=None, edge_dim=None, layer=layer: layer(conv))
        for cls, layer in fixed.items()}
    out[pyg.LGConv] = lambda conv, in_channels=None, edge_dim=None: LGConvLayer(conv, in_channels)
    out[pyg.SimpleConv] = _simple_conv
    out[pyg.SAGEConv] = _sage_conv
    from .pyg_rounds import rounds_converters
    out.update(rounds_converters(pyg))
    return out


# --- any other MessagePassing: its forward, message and update traced -----------------------------

_EDGE_INDEX_ARGS = ("index", "ptr", "size_i", "size_j", "dim_size", "size", "edge_index",
                    "edge_index_i", "edge_index_j", "adj_t")
_SOFTMAX_ARGS = ("index", "edge_index_i", "ptr", "size_i", "dim_size")
"""What PyG gives ``message`` for its ``softmax(alpha, index, ptr, size_i)``: the target
node of each edge, no CSR pointer (edge_index is a tensor), the number of targets. sarc
gives stand-ins whose only use is that call, which is sarc's edge softmax."""


class _Stop(BaseException):
    """Ends a traced ``forward`` at its ``propagate`` call (user code may catch Exception)."""

    def __init__(self, kwargs: dict):
        self.kwargs = kwargs


class _UpdaterStop(_Stop):
    """Ends a traced ``forward`` at its ``edge_updater`` call."""


class _EdgeUpdates:
    """``edge_updater`` while a conv's message is traced: PyG's ``edge_update`` computed once,
    per edge, from what the forward gives ``edge_updater`` at the edges' targets (a run of
    the forward on ``dst.x`` that stops there: ``targets``) and at their sources (the run
    on ``src.x``, which computes it); a later run is given the same value."""

    def __init__(self):
        self.targets: dict | None = None
        self.value = None


class _Origins:
    """Where a value traced in message comes from: ``x`` read at an end of the edge (a node
    value, which PyG would read per node), the edge feature (``edge``) or an edge_update
    (``updates``), whose values are per edge."""

    def __init__(self, builder, x: set, edge: set):
        self.builder, self.x, self.edge, self.updates = builder, x, edge, set()

    def of_x(self, value) -> bool:
        return _reaches(self.builder, value, self.x)

    def of_updates(self, value) -> bool:
        return bool(self.updates) and _reaches(self.builder, value, self.updates)

    def per_edge(self, value) -> bool:
        return _reaches(self.builder, value, self.edge) or self.of_updates(value)


class _EdgeIndex(torch.Tensor):
    """Stands for ``edge_index`` while a conv's forward is traced.

    It is a ``torch.Tensor``, so the forward takes the branches it takes for the real
    ``[2, E]`` tensor (``if isinstance(edge_index, Tensor): ...``). It stands in for a conv
    whose forward has no graph code (``pyg_prepare``: preparing the inputs found none) or
    has not been prepared (a call on a ``sarc.Graph``): what it may do with it is pass it to
    ``propagate`` or ask what every edge_index sarc runs on has (a strided, not sparse, 2-d
    tensor); any other use (its size, an index, ``add_self_loops``, ``gcn_norm``...) is
    recorded and refused, naming the function and the forward's line, even where the
    forward catches the error.
    """

    _FACTS = {"torch.Tensor.layout.__get__": torch.strided,
              "torch.Tensor.is_sparse.__get__": False,
              "torch.Tensor.is_sparse_csr.__get__": False,
              "torch.Tensor.ndim.__get__": 2, "torch.Tensor.dim": 2}

    @staticmethod
    def make(conv) -> "_EdgeIndex":
        t = torch.Tensor._make_subclass(_EdgeIndex, torch.empty(2, 0, dtype=torch.long))
        t._sarc_conv, t._sarc_refused = conv, []
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", repr(func))
        if name in cls._FACTS:
            return cls._FACTS[name]
        if name in ("torch.Tensor.__repr__", "torch.Tensor.__str__", "torch.Tensor.__format__"):
            return "edge_index"
        if name == "torch.Tensor.__hash__":
            return id(args[0])
        token = next((a for a in _flat((args, kwargs or {})) if isinstance(a, _EdgeIndex)), None)
        conv = token._sarc_conv if token is not None else "a MessagePassing"
        shown = name[:-len(".__get__")] if name.endswith(".__get__") else name
        if shown.startswith("torch.Tensor."):
            method = shown[len("torch.Tensor."):]
            shown = "edge_index[...]" if method == "__getitem__" else f"edge_index.{method}"
        error = _refuse(conv, f"a forward that reads or changes edge_index ({shown}"
                        f"{_forward_line(conv)})",
                        "sarc runs the conv's message and update on the graph as given, so "
                        "graph preparation in forward (self loops, normalization) would be "
                        "skipped; prepare the graph before the call, or import a conv that "
                        "passes edge_index to propagate unchanged")
        if token is not None:
            token._sarc_refused.append(error)
        raise error


def _def_loc(cls, method: str) -> str:
    """``Cls.method, at FILE:LINE`` (its ``def``); the name alone where there is no source."""
    fn = getattr(cls, method)
    name = f"{cls.__name__}.{method}"
    try:
        return f"{name}, at {inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return name


def _forward_line(conv, method: str = "forward", callee_named: bool = True) -> str:
    """`` at FILE:LINE``: the innermost line of the conv's ``method`` on the stack, and the
    function it called there where that is not the use itself (`` in add_self_loops(),
    at ...``: the call the user wrote; not with ``callee_named=False``, where the caller
    is the function refused)."""
    code = getattr(getattr(type(conv), method, None), "__code__", None)
    f, callee = sys._getframe(1), None
    while f is not None and code is not None:
        if f.f_code is code:
            called = ("" if callee is None or not callee_named
                      else f" in {callee.f_code.co_name}(),")
            return f"{called} at {f.f_code.co_filename}:{f.f_lineno}"
        if f.f_code.co_name != "__torch_function__" and not f.f_code.co_filename.startswith(
                (_TORCH_DIR, _SARC_DIR)):
            callee = f
        f = f.f_back
    return ""


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_SARC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class _SoftmaxArg(torch.Tensor):
    """Stands for message's (or edge_update's) ``index`` / ``edge_index_i`` (each edge's
    target node) or ``size_i`` / ``dim_size`` (the number of targets) while it is traced:
    its one use is ``torch_geometric.utils.softmax(alpha, index, ptr, size_i)``, sarc's
    edge softmax (``_pyg_softmax``), and ``index.numel()`` compared with 0
    (``_EdgeCount``); any other use is refused, naming the use and the method's line."""

    @staticmethod
    def make(conv, name: str, method: str = "message") -> "_SoftmaxArg":
        t = torch.Tensor._make_subclass(_SoftmaxArg, torch.empty(0, dtype=torch.long))
        t._sarc_conv, t._sarc_name, t._sarc_method = conv, name, method
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", repr(func))
        if name in ("torch.Tensor.__repr__", "torch.Tensor.__str__", "torch.Tensor.__format__"):
            return args[0]._sarc_name
        if name == "torch.Tensor.__hash__":
            return id(args[0])
        if name == "torch.Tensor.numel" and args[0]._sarc_name in ("index", "edge_index_i"):
            return _EdgeCount(args[0])
        token = next(a for a in _flat((args, kwargs or {})) if isinstance(a, _SoftmaxArg))
        shown = name[:-len(".__get__")] if name.endswith(".__get__") else name
        if shown.startswith("torch.Tensor."):
            shown = f"{token._sarc_name}.{shown[len('torch.Tensor.'):]}"
        why = (f"sarc reads {token._sarc_name} only in torch_geometric.utils.softmax(alpha, "
               f"index, ptr, size_i), its softmax over the edges into each destination")
        if _in_pyg_softmax():
            why += ("; this is PyG's softmax, reached where sarc does not route it (a closure): "
                    "call it by a name of a module, or hold it as an attribute of the conv")
        raise _refuse(token._sarc_conv, f"{token._sarc_method}'s {token._sarc_name} used in "
                      f"{shown}{_forward_line(token._sarc_conv, token._sarc_method)}", why)


class _EdgeUpdated(torch.Tensor):
    """What ``edge_updater`` gives while the forward is traced for ``update`` (at the
    nodes): sarc computes edge_update per edge in message, so its value may be passed to
    propagate, for message, and nothing else; any use is refused, naming it."""

    @staticmethod
    def make(conv, misused: list) -> "_EdgeUpdated":
        t = torch.Tensor._make_subclass(_EdgeUpdated, torch.empty(0))
        t._sarc_conv, t._sarc_misused = conv, misused
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", repr(func))
        if name in ("torch.Tensor.__repr__", "torch.Tensor.__str__", "torch.Tensor.__format__"):
            return "edge_updater's value"
        if name == "torch.Tensor.__hash__":
            return id(args[0])
        token = next(a for a in _flat((args, kwargs or {})) if isinstance(a, _EdgeUpdated))
        shown = name[:-len(".__get__")] if name.endswith(".__get__") else name
        error = _refuse(token._sarc_conv, f"edge_updater's value used in {shown} in forward "
                        f"or update{_forward_line(token._sarc_conv, 'forward')}",
                        "sarc computes edge_update per edge, in message: give its value to "
                        "propagate, for message, and use it there")
        token._sarc_misused.append(error)
        raise error


class _EdgeCount:
    """``index.numel()`` in a traced message or edge_update: the number of edges, which is
    known only when the layer runs. Compared with 0 it is not 0: where a graph has no edges
    every per-edge value is empty whichever way the code goes (GATConv's ``if
    index.numel() == 0: return alpha``). Any other use is refused."""

    __hash__ = None

    def __init__(self, index: _SoftmaxArg):
        self._index = index

    def _zero(self, other, what: str) -> None:
        if isinstance(other, bool) or not isinstance(other, int) or other != 0:
            ix = self._index
            raise _refuse(ix._sarc_conv, f"{ix._sarc_name}.numel() {what} {other!r}"
                          f"{_forward_line(ix._sarc_conv, ix._sarc_method)}",
                          "the number of edges is known when the layer runs; sarc reads it "
                          "only compared with 0")

    def __eq__(self, other):
        self._zero(other, "==")
        return False

    def __ne__(self, other):
        self._zero(other, "!=")
        return True

    def __gt__(self, other):
        self._zero(other, ">")
        return True

    def __bool__(self):
        return True


def _in_pyg_softmax() -> bool:
    """Whether PyG's own ``softmax`` (not sarc's route of it, which its name holds while a
    conv is traced) is running."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "softmax" and \
                f.f_code.co_filename.endswith(os.path.join("torch_geometric", "utils",
                                                           "_softmax.py")):
            return True
        f = f.f_back
    return False


def _pyg_softmax(src, index=None, ptr=None, num_nodes=None, dim=0):
    """``torch_geometric.utils.softmax`` while a conv's message is traced: over the edges
    into each destination (``index`` message's ``index`` / ``edge_index_i``) it is
    ``sarc.edge_softmax``; any other grouping is refused."""
    conv = getattr(index, "_sarc_conv", None) or getattr(num_nodes, "_sarc_conv", None) \
        or "a MessagePassing"
    by_dst = isinstance(index, _SoftmaxArg) and index._sarc_name in ("index", "edge_index_i")
    sized = num_nodes is None or (isinstance(num_nodes, _SoftmaxArg)
                                  and num_nodes._sarc_name in ("size_i", "dim_size"))
    method = getattr(index, "_sarc_method", "message")
    line = _forward_line(conv, method) if not isinstance(conv, str) else ""
    if not (by_dst and ptr is None and sized):
        shown = ("a ptr" if ptr is not None else "num_nodes other than size_i" if not sized
                 else f"index {getattr(index, '_sarc_name', type(index).__name__)}")
        raise _refuse(conv, f"torch_geometric.utils.softmax with {shown}{line}",
                      "sarc's edge softmax normalizes over the edges into each destination: "
                      "softmax(alpha, index, ptr, size_i) with message's index / edge_index_i")
    if not isinstance(src, Proxy) or src.type.domain is not Domain.EDGE:
        raise _refuse(conv, f"torch_geometric.utils.softmax of a "
                      f"{type(src).__name__ if not isinstance(src, Proxy) else src.type.domain.value + ' value'}"
                      f"{line}", "sarc's edge softmax takes a value per edge")
    if dim not in (0, -1 - len(src.type.feat)):
        raise _refuse(conv, f"torch_geometric.utils.softmax(..., dim={dim}){line}",
                      "sarc's edge softmax is over the edges (dim=0)")
    return dsl.edge_softmax(src)


def _pyg_softmax_routed(conv):
    """While ``conv``'s message is traced, ``torch_geometric.utils.softmax`` is
    ``_pyg_softmax``: in ``torch_geometric.utils``, in every module defining a class of the
    conv's tree and in the user's code (``trace_guards.code_namespaces``) that imported it
    by name."""
    import torch_geometric.utils as utils
    from torch_geometric.utils import _softmax
    return routed({_softmax.softmax: _pyg_softmax},
                  lambda: [vars(utils), vars(_softmax)] + code_namespaces([conv]))


class _TensorProxy(Proxy):
    """A traced value that ``isinstance(value, torch.Tensor)`` accepts, as the conv's code
    sees a real tensor (``if isinstance(x, Tensor): x = (x, x)``); it traces as a Proxy."""

    __slots__ = ()

    @property
    def __class__(self):
        return torch.Tensor

    def size(self, dim: int | None = None):
        """As ``shape``: a feature size is a number, the row count has no value."""
        return tuple(self.shape) if dim is None else self.shape[dim]


class _StandInProxy(_TensorProxy):
    """A ``_TensorProxy`` while a conv whose forward prepares the graph is traced: its row
    count (``x.size(0)``) is also the stand-in graph's node count where the graph code needs
    a number (``pyg_prepare.GraphRows``)."""

    __slots__ = ()

    def _fresh(name: str):
        def make(self, *args, **kwargs):
            made = pp.fresh(self, name, args, kwargs)
            return getattr(_TensorProxy, name)(self, *args, **kwargs) if made is None else made
        make.__name__ = name
        return make

    new_ones, new_zeros, new_full = _fresh("new_ones"), _fresh("new_zeros"), _fresh("new_full")
    del _fresh

    @property
    def shape(self) -> tuple:
        shape = Proxy.shape.fget(self)
        if shape and isinstance(shape[0], RowCount):
            rows = shape[0]
            return (pp.GraphRows(rows.symbol, rows.tracer, rows.taken), *shape[1:])
        return shape


def _as_tensor(value):
    if type(value) is Proxy:
        return value.tracer.proxy_type(value.tracer, value.index)
    return value


@contextlib.contextmanager
def _conv_code(conv, tracer, proxy_type: type = _TensorProxy):
    """While the conv's forward, message and update run: its traced values, parameters
    among them, are ``isinstance(..., Tensor)`` as PyG's code expects (the tracer makes
    ``_TensorProxy`` values)."""
    if tracer.proxy_type is not Proxy:   # already inside (or a tracer with values of its own)
        yield
        return
    saved = []
    tracer.proxy_type = proxy_type
    try:
        for mod in conv.modules():
            for table in (mod._parameters, mod._buffers):
                for name, value in list(table.items()):
                    if type(value) is Proxy:
                        saved.append((table, name, value))
                        table[name] = _as_tensor(value)
        with builtins_take_tensor_proxies(lambda: code_namespaces([conv])):
            yield
    finally:
        tracer.proxy_type = Proxy
        for table, name, value in saved:
            table[name] = value


class TracedConv(PyGLayer):
    """A user's ``MessagePassing`` subclass, traced from its own code.

    Its ``forward(x, edge_index[, edge_attr])`` runs on sarc's traced values, with
    ``self.propagate`` standing in for PyG's: the node values it passes are read at the
    source (``name_j``) and target (``name_i``) of each edge, ``message`` and ``update``
    are traced as written, and the aggregation is the conv's ``aggr_module``. The forward
    runs once per end of an edge and once for the result, so it must pass ``edge_index``
    (``_EdgeIndex``) to ``propagate`` unchanged, call it once, and draw no dropout before
    it; the values it sees (``_TensorProxy``) are ``isinstance(..., Tensor)``.
    """

    def __init__(self, conv, in_channels: int | None = None, edge_dim=None):
        from torch_geometric.nn import MessagePassing
        cls = type(conv)
        _check_aggregation(conv)
        if cls.message is MessagePassing.message and \
                cls.message_and_aggregate is not MessagePassing.message_and_aggregate:
            raise _refuse(conv, "message_and_aggregate without message",
                          "sarc traces message, then aggregates with aggr")
        if cls.aggregate is not MessagePassing.aggregate or _overrides(cls, "propagate"):
            hook = "propagate" if _overrides(cls, "propagate") else "aggregate"
            raise _refuse(conv, f"an overridden {hook}", "sarc aggregates with the conv's aggr")
        if _overrides(cls, "edge_updater"):
            raise _refuse(conv, "an overridden edge_updater", "sarc computes edge_update per "
                          "edge, in message: change its value in edge_update")
        # forward(x, edge_index[, e]): e (edge_attr, edge_weight...) is an edge feature of
        # that name, of width edge_dim (() for one number per edge); without edge_dim, an
        # optional e is traced as None.
        params = list(inspect.signature(conv.forward).parameters.values())
        _check_forward_signature(conv, params)
        third = params[2:3]
        edge_dim = edge_dim if edge_dim is not None else getattr(conv, "edge_dim", None)
        self._takes_edge_attr = bool(third) and edge_dim is not None
        if self._takes_edge_attr and ("edge_index" in third[0].name
                                      or third[0].name in ("adj", "adj_t")):
            raise _refuse(conv, f"edge_dim for {third[0].name}",
                          "an edge list, not an edge feature: sarc calls forward(x, "
                          "edge_index) and leaves it at its default")
        self.edge_input = third[0].name if third else None
        if third and edge_dim is None and third[0].default is inspect.Parameter.empty:
            raise _refuse(conv, f"{third[0].name} of unknown width",
                          "give it: from_message_passing(conv, edge_dim=...), () for one "
                          "number per edge")
        edge = {self.edge_input: edge_dim} if self._takes_edge_attr else None
        super().__init__(conv, _in_channels(conv, in_channels), edge=edge)
        self._message_args = _per_edge_arguments(conv, "message")
        self._update_args = list(inspect.signature(conv.update).parameters)[1:]
        # edge_update's arguments, where the conv has one its forward may call edge_updater for
        self._updater_args = (_per_edge_arguments(conv, "edge_update")
                              if cls.edge_update is not MessagePassing.edge_update else None)
        self._given_edge = dict(self._sarc_edge)
        self._prepares: tuple | None = None   # (the conv's options, whether its forward does)
        # the forward's graph code (pyg_prepare), None where it has none: (whether the edge
        # feature forward is given is read by it, ((name, shape) of each per-edge value))
        self.graph_code: tuple | None = None

    def _prepare(self, edge_index, num_nodes, edge_attr=None, dtype=None):
        inputs = self._given(edge_index, num_nodes, edge_attr, dtype)
        options = _options(self)
        if self._prepares == (options, False):
            return inputs
        given = inputs.edge.get(self.edge_input)
        with _says_why_traced(self.conv):
            prepared = self._prepared(edge_index, num_nodes, given, dtype, False)
            reads_edge = isinstance(prepared, Exception)   # the graph code reads the edge feature
            if reads_edge:
                prepared = self._prepared(edge_index, num_nodes, given, dtype, True)
        self._prepares = (options, prepared is not None)   # (options, False): no graph code
        if prepared is None:
            self._declare(None)
            return inputs
        if self._takes_edge_attr and not reads_edge \
                and prepared.edge_index.size(1) != edge_index.size(1):
            raise _refuse(self.conv, f"an edge feature {self.edge_input} with a forward that "
                          f"changes the edges ({edge_index.size(1)} edges given, "
                          f"{prepared.edge_index.size(1)} given to propagate)",
                          f"{self.edge_input} has a value per edge of the graph given")
        self._declare((reads_edge, tuple((k, tuple(v.shape[1:]))
                                         for k, v in prepared.edge.items())))
        edge = prepared.edge if reads_edge else {**inputs.edge, **prepared.edge}
        return PyGInputs(prepared.edge_index, num_nodes, edge)

    def _declare(self, graph_code: tuple | None) -> None:
        """The layer's edge features: the per-edge values of the forward's graph code
        (``pyg_prepare``), and the edge feature forward is given where the graph code does
        not read it."""
        if graph_code != self.graph_code:
            self.graph_code = graph_code
            given = {} if graph_code is not None and graph_code[0] else self._given_edge
            values = {} if graph_code is None else dict(graph_code[1])
            self._sarc_edge = {**given, **dsl._declared(values, "edge")}

    def _prepared(self, edge_index, num_nodes, edge_attr, dtype, graph_reads_edge: bool):
        """The graph and per-edge values the forward's graph code gives propagate, run on
        the real graph (``pyg_prepare``); None where the forward has no graph code. With
        ``graph_reads_edge`` the edge feature forward is given is graph code's to read,
        else a value it may not meet (where it does: the error, returned)."""
        conv = self.conv
        watch = _graph_watch(conv)
        dtype = dtype or next((p.dtype for p in conv.parameters() if p.is_floating_point()),
                              torch.get_default_dtype())
        x = watch.tagged(torch.zeros(num_nodes, self._sarc_node["x"].shape[-1], dtype=dtype,
                                     device=edge_index.device), pp.NodeValue)
        args = [x, watch.tagged(edge_index, pp.Structure)]
        if self._takes_edge_attr:
            args.append(watch.tagged(edge_attr, pp.Structure if graph_reads_edge
                                     else pp.EdgeValue))
        grad = graph_reads_edge and edge_attr.requires_grad

        def propagate(edge_index, size=None, **kwargs):
            raise _Stop({"edge_index": edge_index, **kwargs})

        updated = {}   # what the forward gives edge_updater

        def edge_updater(edge_index, size=None, **kwargs):
            updated.update(kwargs, edge_index=edge_index)
            # its value is traced in message; here a stand-in of no graph values
            return watch.tagged(torch.zeros(pp.plain(edge_index).size(1), dtype=dtype),
                                pp.EdgeValue)

        object.__setattr__(conv, "propagate", propagate)
        object.__setattr__(conv, "edge_updater", edge_updater)
        given, failed = None, None
        try:
            with pp.quiet_run(conv.modules(), grad):
                _call_conv(conv, "forward", conv.forward, *args)
        except _Stop as s:
            given = s.kwargs
        except Exception as e:   # noqa: BLE001 - said where the layer is traced, unless graph code
            failed = e
        finally:
            del conv.__dict__["propagate"], conv.__dict__["edge_updater"]
        if watch.refused and watch.met_edge and not graph_reads_edge:
            return watch.refused[0]
        watch.check()   # what the graph code met, even where the forward caught the error
        if failed is not None:
            if watch.used:
                raise failed
            return None
        if given is None:
            if watch.used:   # returned before propagate on this graph (an empty one)
                raise _refuse(conv, f"a forward that returns before propagate on this graph "
                              f"({num_nodes} nodes, {edge_index.size(1)} edges)",
                              "the sarc layer is the conv's propagate, message and update")
            return None   # no propagate at all: refused where the layer is traced
        ei = given.pop("edge_index")
        graph = {k: v for k, v in given.items()
                 if any(isinstance(t, pp.Structure) for t in _flat(v))}
        if updated:
            graph = self._with_updaters_graph_values(graph, updated, ei)
        if not watch.used and not graph:
            return None
        given_edge = () if graph_reads_edge else self._given_edge
        return pp.Prepared(self._graph_edges(ei), {
            k: self._per_edge(k, v, ei.size(1), given_edge, dtype) for k, v in graph.items()})

    def _with_updaters_graph_values(self, graph: dict, updated: dict, ei) -> dict:
        """``graph`` (propagate's values of graph code) and those the forward gives
        ``edge_updater``, which edge_update reads per edge of the same edge list."""
        updater_ei = updated.pop("edge_index")
        if updater_ei is not ei and not (
                isinstance(updater_ei, torch.Tensor) and updater_ei.shape == ei.shape
                and torch.equal(pp.plain(updater_ei), pp.plain(ei))):
            raise _refuse(self.conv, "a forward that gives edge_updater and propagate "
                          "different edge lists", "sarc computes edge_update per edge of "
                          "the graph propagate runs on")
        for k, v in updated.items():
            if any(isinstance(t, pp.Structure) for t in _flat(v)):
                if k in graph and graph[k] is not v:
                    raise _refuse(self.conv, f"edge_updater and propagate given different "
                                  f"values named {k!r} computed from edge_index",
                                  "each per-edge value of the graph code has one name")
                graph[k] = v
        return graph

    def _graph_edges(self, ei) -> torch.Tensor:
        if not (isinstance(ei, pp.Structure) and ei.dim() == 2 and ei.size(0) == 2
                and ei.dtype == torch.long):
            raise _refuse(self.conv, f"propagate given {type(ei).__name__} "
                          f"{list(ei.shape) if isinstance(ei, torch.Tensor) else ''} as its "
                          f"edge_index", "sarc runs the conv on an edge list [2, E] the forward "
                          "computes from the call's edge_index, not on one kept from an "
                          "earlier call (cached=True)")
        return pp.plain(ei)

    def _per_edge(self, name: str, value, edges: int, given_edge, dtype) -> torch.Tensor:
        """A value propagate is given that the graph code computed: one float per edge, in
        x's dtype (``dtype``) where it is narrower (``degree`` without ``dtype=`` of a
        float64 conv), as torch promotes it where message meets x."""
        if not isinstance(value, pp.Structure):
            raise _refuse(self.conv, f"propagate's argument {name!r} holding several values "
                          f"computed from edge_index", "give propagate each on its own")
        if value.dim() == 0 or value.size(0) != edges or not value.is_floating_point():
            raise _refuse(self.conv, f"propagate's argument {name!r} computed from edge_index "
                          f"({value.dtype}, shape {list(value.shape)})",
                          f"sarc reads a value the graph code computes as an edge feature: "
                          f"floats, one row per edge of the edge_index given to propagate "
                          f"({edges}); index a per-node value by edge_index's rows "
                          f"(deg[col]) in forward")
        if name in self._sarc_node or name in given_edge:
            raise _refuse(self.conv, f"propagate's argument {name!r}",
                          "it is named as the conv's node or edge feature")
        if value.dtype != dtype:
            if torch.promote_types(value.dtype, dtype) != dtype:
                raise _refuse(self.conv, f"propagate's argument {name!r} computed from "
                              f"edge_index in {value.dtype}, wider than x's {dtype}",
                              f"PyG would compute the conv's output in {value.dtype}; compute "
                              f"it in x's dtype (dtype=x.dtype)")
            value = value.to(dtype)
        return pp.plain(value)

    def _given(self, edge_index, num_nodes, edge_attr, dtype) -> PyGInputs:
        """The graph as given, and the edge feature forward is given."""
        if not self._takes_edge_attr:
            if edge_attr is not None:
                width = tuple(edge_attr.shape[1:]) if isinstance(edge_attr, torch.Tensor) \
                    else "..."
                raise _refuse(self.conv, f"the argument {self.edge_input or 'edge_attr'}",
                              f"imported without edge_dim, its forward was traced without it: "
                              f"from_message_passing(conv, edge_dim={width}) for this one "
                              f"(edge_dim=() is one number per edge)")
            return super()._prepare(edge_index, num_nodes, edge_attr, dtype)
        if edge_attr is None:
            raise _refuse(self.conv, f"a call without {self.edge_input}",
                          f"it was imported with edge_dim for {self.edge_input}")
        if (isinstance(edge_attr, torch.Tensor) and not edge_attr.is_floating_point()
                and self._sarc_edge[self.edge_input].dtype is None):
            raise _refuse(self.conv, f"{self.edge_input} of {edge_attr.dtype} (ids, as relation "
                          f"types) imported as a float feature",
                          f"import it as one id per edge: from_message_passing(conv, "
                          f"edge_dim=sarc.INDEX)")
        return PyGInputs(edge_index, num_nodes, {self.edge_input: edge_attr})

    def _forward(self, x, edge_attr, on_propagate, edge=None, on_update=None) -> Any:
        """The forward traced up to ``on_propagate(kwargs)``; ``edge``: the edge side, whose
        features stand for the values the graph code gives propagate (in message);
        ``on_update(kwargs)``: what ``edge_updater`` gives (outside message: a value only
        propagate may be given, ``_EdgeUpdated``)."""
        conv = self.conv
        calls = []
        builder = x.tracer.builder
        drops = sum(1 for v in builder.values if v.op is Op.DROPOUT)
        if self.graph_code is not None:   # the graph code runs on the stand-in graph
            watch = _graph_watch(conv)
            token = watch.tagged(pp.stand_in_edges(), pp.Structure)
            refused = watch.check
            if self._graph_reads_edge():
                edge_attr = watch.tagged(pp.stand_in_edge_values(
                    self._given_edge[self.edge_input].shape, x.dtype), pp.Structure)
        else:
            token = _EdgeIndex.make(conv)

            def refused():   # what the forward did to edge_index, even if it caught the error
                if token._sarc_refused:
                    raise token._sarc_refused[0]

        def propagate(edge_index, size=None, **kwargs):
            refused()
            if self.graph_code is not None:
                kwargs = self._graph_values_read(kwargs, edge)
            elif edge_index is not token:
                raise _refuse(conv, f"a forward that changes edge_index before propagate"
                              f"{_forward_line(conv)}", "prepare the graph before the call")
            if size is not None:
                raise _refuse(conv, "propagate(..., size=...)")
            calls.append(kwargs)
            if len(calls) > 1:
                raise _refuse(conv, f"a forward that calls propagate twice (the second call"
                              f"{_forward_line(conv)})", "one sarc layer is one round of "
                              "messages: make each propagate a conv of its own")
            if sum(1 for v in builder.values if v.op is Op.DROPOUT) > drops:
                raise _refuse(conv, "dropout in forward before propagate",
                              "each end of an edge would draw its own mask")
            return on_propagate(kwargs)

        misused = []   # uses of edge_updater's value outside message (torch turns the
        # refusal, a TypeError, into NotImplemented in an operator: raised after the run)

        def edge_updater(edge_index, size=None, **kwargs):
            nonlocal drops
            refused()
            if self.graph_code is not None:
                kwargs = self._graph_values_read(kwargs, edge)
            elif edge_index is not token:
                raise _refuse(conv, f"a forward that changes edge_index before edge_updater"
                              f"{_forward_line(conv, 'forward', False)}",
                              "prepare the graph before the call")
            if size is not None:
                raise _refuse(conv, "edge_updater(..., size=...)")
            if on_update is None:
                return _EdgeUpdated.make(conv, misused)
            value = on_update(kwargs)
            # edge_update's own dropout (GAT's attention dropout) is drawn once, per edge
            drops = sum(1 for v in builder.values if v.op is Op.DROPOUT)
            return value

        x, edge_attr = _as_tensor(x), _as_tensor(edge_attr)
        args = (x, token, edge_attr) if self._takes_edge_attr else (x, token)
        object.__setattr__(conv, "propagate", propagate)
        object.__setattr__(conv, "edge_updater", edge_updater)
        with _says_why_traced(conv), self._graph_code_routes():
            try:
                out = _call_conv(conv, "forward", conv.forward, *args)
            except ConversionError:
                if misused:
                    raise misused[0] from None
                raise
            except AcrossRowsError as e:   # said of the rows it is traced at: an edge's end
                raise DSLError(f"{e.operation} works across the nodes of the forward's values "
                               f"(x and what it computes, a row per node): sarc traces the "
                               f"forward at each node and each end of an edge, so nothing in "
                               f"it reads across nodes; compute that before the conv (in the "
                               f"model's forward) and pass it in", e.loc) from None
            finally:
                del conv.__dict__["propagate"], conv.__dict__["edge_updater"]
            refused()
        if not calls:
            raise _refuse(conv, "a forward that never calls propagate")
        return out

    def _captured(self, x, edge_attr, edge, on_update=None, at_updater: bool = False):
        """What the forward gives ``propagate`` (``at_updater``: ``edge_updater``, None if
        it reaches propagate first); ``on_update(kwargs)``: edge_updater's value."""
        def stop(kwargs):
            raise _Stop(kwargs)

        def stop_at_updater(kwargs):
            raise _UpdaterStop(kwargs)
        try:
            self._forward(x, edge_attr, stop, edge, stop_at_updater if at_updater else on_update)
        except _UpdaterStop as s:
            return s.kwargs
        except _Stop as s:
            return None if at_updater else s.kwargs
        raise AssertionError("unreachable: _forward returns only through propagate")

    def message(self, src, dst, edge):
        with _conv_code(self.conv, src.x.tracer, self._proxy_type()):
            return self._message(src, dst, edge)

    def _message(self, src, dst, edge):
        conv = self.conv
        ea = edge[self.edge_input] if self._takes_edge_attr and not self._graph_reads_edge() \
            else None
        x_src = src.x
        reads_dst = any(a.endswith("_i") for a in self._message_args)
        updates = None
        if self._updater_args is not None:   # the forward may call edge_updater
            updates = _EdgeUpdates()
            reads_dst = reads_dst or any(a.endswith("_i") for a in self._updater_args)
        x_dst = dst.x if reads_dst else None
        # Inside message the node values given to forward are read per edge already, so
        # what forward computed from x is per edge too: PyG reads it per node. Where a
        # value comes from says which it is.
        origins = _Origins(x_src.tracer.builder,
                           {x_src.index} | ({x_dst.index} if reads_dst else set()),
                           {ea.index} if isinstance(ea, Proxy) else set())
        on_update = None
        if updates is not None:
            updates.targets = self._captured(x_dst, ea, edge, at_updater=True)

            def on_update(kwargs):
                return self._edge_update(updates, origins, kwargs)
        at_src = self._captured(x_src, ea, edge, on_update)
        at_dst = self._captured(x_dst, ea, edge, on_update) if reads_dst else {}
        args = self._arguments("message", self._message_args, at_src, at_dst, origins)
        with _pyg_softmax_routed(conv):
            return _call_conv(conv, "message", conv.message, **args)

    def _edge_update(self, updates: "_EdgeUpdates", origins: "_Origins", kwargs: dict):
        """PyG's ``edge_update`` on what the forward gave ``edge_updater``: ``kwargs`` at the
        edges' sources, ``updates.targets`` at their targets; a value per edge."""
        conv = self.conv
        if updates.value is None:
            if updates.targets is None:
                raise _refuse(conv, "edge_updater called in one run of the forward and not "
                              "in another", "sarc runs the forward at each end of an edge")
            args = self._arguments("edge_update", self._updater_args, kwargs, updates.targets,
                                   origins)
            with _pyg_softmax_routed(conv):
                value = _call_conv(conv, "edge_update", conv.edge_update, **args)
            if not isinstance(value, Proxy) or value.type.domain is not Domain.EDGE:
                raise _refuse(conv, f"an edge_update that returns "
                              f"{'a node value' if isinstance(value, Proxy) else type(value).__name__}",
                              "sarc computes it per edge, in message")
            updates.value = value
            origins.updates.add(value.index)
        return updates.value

    def _arguments(self, what: str, names: list, at_src: dict, at_dst: dict,
                   origins: "_Origins") -> dict:
        """The arguments of ``message`` or ``edge_update`` (``what``), as PyG collects them
        from what the forward gives ``propagate`` / ``edge_updater``: ``at_src`` in the run
        at the edges' sources, ``at_dst`` at their targets."""
        conv = self.conv
        sig = inspect.signature(getattr(conv, what)).parameters
        args = {}
        for name in names:
            base, end = name[:-2], name[-2:]
            if name in _SOFTMAX_ARGS:
                args[name] = None if name == "ptr" else _SoftmaxArg.make(conv, name, what)
            elif end in ("_j", "_i") and base in (at_src if end == "_j" else at_dst):
                # a pair's first value is read at the messages' sources, the second at
                # their targets, whatever the flow in PyG's generated collect; its
                # fallback reads them at rows 0 and 1 of edge_index
                side = 0 if end == "_j" else 1
                if _flows_to_sources(conv) and not _generated_collect(
                        conv, "propagate" if what == "message" else "edge_updater"):
                    side = 1 - side
                value = _end(conv, (at_src if end == "_j" else at_dst)[base], side, name)
                _check_node_axis(conv, value, f"node values ({name})")
                row = (end == "_j") == _flows_to_sources(conv)   # PyG's j or i: 0 or 1
                if not isinstance(value, Proxy) or not origins.of_x(value) \
                        or origins.per_edge(value):
                    read = ("edge values" if isinstance(value, Proxy) and origins.per_edge(value)
                            else "values that are not computed from x"
                            if isinstance(value, Proxy) else f"a {type(value).__name__}")
                    raise _refuse(conv, f"{what} argument {name!r} on {read}",
                                  f"PyG reads {name} as row edge_index[{int(row)}]"
                                  f" of {base}; sarc reads node values computed from x at the "
                                  f"ends of an edge")
                args[name] = value
            elif name in at_src:
                value = at_src[name]
                if isinstance(value, (tuple, list)) and any(isinstance(v, Proxy) for v in value):
                    raise _refuse(conv, f"{what} argument {name!r} holding a pair of node "
                                  f"values", f"read them per edge as {name}_j or {name}_i")
                if isinstance(value, Proxy) and origins.of_x(value) \
                        and not origins.of_updates(value):
                    raise _refuse(conv, f"{what} argument {name!r} holding node values",
                                  f"PyG passes {what} the whole [N, ...] tensor; read them "
                                  f"per edge as {name}_j or {name}_i")
                args[name] = value   # per edge, or the same for every edge (a parameter)
            elif sig[name].default is not inspect.Parameter.empty:
                args[name] = sig[name].default
            else:
                raise _refuse(conv, f"{what} argument {name!r}",
                              f"{'propagate' if what == 'message' else 'edge_updater'} is not "
                              f"given it")
        return args

    def _graph_values_read(self, kwargs: dict, edge) -> dict:
        """propagate's arguments with each value of the graph code replaced by the edge
        feature the prepared inputs give it (in message; in update, which reads none,
        by nothing)."""
        names = dict(self.graph_code[1])
        out = {}
        for k, v in kwargs.items():
            if any(isinstance(t, pp.Structure) for t in _flat(v)):
                if k not in names:
                    raise _refuse(self.conv, f"propagate's argument {k!r} computed from "
                                  f"edge_index on one graph and not on another",
                                  "the graph code gives propagate the same arguments on "
                                  "every graph")
                v = edge[k] if edge is not None else None
            out[k] = v
        return out

    def _graph_code_routes(self):
        """While the forward's graph code runs on the stand-in graph: ``torch.arange`` takes
        its node count (``x.size(0)``, a ``GraphRows``)."""
        if self.graph_code is None:
            return contextlib.nullcontext()
        from ..trace_torch import valued_route
        return routed({torch.arange: valued_route(torch.arange)},
                      lambda: [vars(torch)] + code_namespaces([self.conv]))

    def _proxy_type(self) -> type:
        return _StandInProxy if self.graph_code is not None else _TensorProxy

    def _graph_reads_edge(self) -> bool:
        """Whether the edge feature forward is given is read by its graph code (and so
        computed with it when the inputs are prepared, not traced)."""
        return self.graph_code is not None and self.graph_code[0]

    def update(self, dst, agg):
        with _conv_code(self.conv, dst.x.tracer, self._proxy_type()):
            return self._update(dst, agg)

    def _update(self, dst, agg):
        conv = self.conv
        ea = None
        if self._takes_edge_attr and not self._graph_reads_edge():
            # what forward may compute on edge_attr before propagate
            edge = dsl._Side(self, dst._tracer, Domain.EDGE, None, "edge", dst._precision)
            ea = edge[self.edge_input]

        def finish(kwargs):
            extra = {n: kwargs[n] for n in self._update_args if n in kwargs}   # as PyG: as given
            return _call_conv(conv, "update", conv.update, _as_tensor(agg.agg), **extra)

        out = self._forward(dst.x, ea, finish)
        if isinstance(out, (tuple, list)):
            raise _refuse(conv, f"a forward that returns a {type(out).__name__} of {len(out)} "
                          f"({_def_loc(type(conv), 'forward')})",
                          "a sarc layer's output is the conv's output alone, a value per node; "
                          "return it alone, and compute anything else (attention weights, "
                          "another node value) outside the conv")
        return out


def _graph_watch(conv):
    """A ``pyg_prepare.Watch`` of one run of ``conv``'s forward: graph code meeting x, an
    edge feature or a parameter is refused at the forward's line."""
    return pp.Watch(lambda func, met: _refuse(
        conv, f"a forward that computes from edge_index and {met} together ({func}"
              f"{_forward_line(conv)})", pp.MIXED))


def _per_edge_arguments(conv, method: str) -> list[str]:
    """The arguments of the conv's ``message`` or ``edge_update``; per-edge graph structure
    other than the destination index PyG's softmax reads is refused."""
    names = list(inspect.signature(getattr(conv, method)).parameters)
    for name in names:
        if name in _EDGE_INDEX_ARGS and name not in _SOFTMAX_ARGS:
            raise _refuse(conv, f"{method} argument {name!r}",
                          f"per-edge graph structure; sarc's {method} reads the edge's "
                          f"destination index (index, edge_index_i) only for "
                          f"torch_geometric.utils.softmax, its edge softmax")
    return names


def _reaches(builder, value, targets: set) -> bool:
    """Whether the traced ``value`` is computed from one of the values ``targets``."""
    return builder.reaches(value.index, lambda i, v: i in targets)


def _check_forward_signature(conv, params) -> None:
    """sarc calls ``forward(x, edge_index[, edge_attr])``: refuse another signature."""
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    shown = f"forward({', '.join(names)})"
    if any(n.endswith("_dict") for n in names[:2]) or isinstance(
            getattr(conv, "in_channels", None), dict):
        raise _refuse(conv, f"a heterogeneous conv ({shown})",
                      "sarc imports convs of one node and one edge type; a heterogeneous "
                      "graph runs as a homogeneous one with type ids (sarc.HeteroConv, "
                      "RGCNConv)")
    edge_lists = [p.name for p in params[1:] if p.name in names
                  and ("edge_index" in p.name or p.name in ("adj", "adj_t"))
                  and (p is params[1] or p.default is inspect.Parameter.empty)]
    if len(edge_lists) > 1:
        raise _refuse(conv, f"{shown}, which takes several edge lists "
                      f"({', '.join(edge_lists)})",
                      "a sarc layer runs on one graph, the edge_index of "
                      "forward(x, edge_index[, edge_attr])")
    if len(names) < 2:
        raise _refuse(conv, shown, "sarc calls forward(x, edge_index[, edge_attr])")
    if names[1] != "edge_index" and ("edge_index" in names[2:] or "adj_t" in names[2:]):
        raise _refuse(conv, f"{shown}, edge_index not its second argument",
                      "sarc calls forward(x, edge_index[, edge_attr]); its second argument "
                      "would be taken for edge_index and the third for an edge feature")
    required = [p.name for p in params[3:] if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if required:
        raise _refuse(conv, f"{shown}, which requires {', '.join(required)}",
                      "sarc calls forward(x, edge_index[, edge_attr])")


def _call_conv(conv, what: str, fn, *args, **kwargs):
    """The conv's ``forward``, ``message`` or ``update`` on traced values; an error from
    inside it is a ConversionError naming the conv, the method and its line."""
    try:
        return fn(*args, **kwargs)
    except (_Stop, SarcError):
        raise
    except Exception as e:
        cls = type(conv).__name__
        raise ConversionError(f"{cls}.{what} cannot be traced{_where(conv, e, what)}: "
                              f"{type(e).__name__}{': ' if str(e) else ''}{e} (sarc traces "
                              f"a forward that computes on x, and on edge_index alone, and "
                              f"passes both to self.propagate, and message and update on the "
                              f"values propagate is given)") from e


def _where(conv, error: Exception, what: str = "forward") -> str:
    """`` at FILE:LINE (`code`)``: the conv's own line that the error came through."""
    try:
        file = inspect.getsourcefile(getattr(type(conv), what))
    except TypeError:
        return ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == file]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno} ({(f.line or '').strip()})"


def _end(conv, value, end: int, name: str):
    """The source (0) or target (1) side of a value given to propagate, as PyG reads it."""
    if isinstance(value, (tuple, list)):
        value = value[end]
    if value is None:
        raise _refuse(conv, f"message argument {name!r} with no value at that end of the edge")
    return value


# --- the two entry points -------------------------------------------------------------------------

def from_message_passing(conv, *, in_channels: int | None = None, edge_dim=None):
    """A sarc layer computing ``conv(x, edge_index[, edge_attr])``, sharing ``conv``'s
    parameters (a ``PyGLayer``; for a conv of K rounds, a ``PyGRounds`` of K layers).
    ``in_channels`` / ``edge_dim`` give the widths of a user's conv that does not record
    them (``conv.in_channels``, ``conv.edge_dim``)."""
    convert = _converter(type(conv))
    if convert is not None:
        return convert(conv, in_channels, edge_dim)
    return TracedConv(conv, in_channels, edge_dim)


# What a subclass may define and still be the stock conv the converter models.
_NOT_MODELLED = frozenset({"__init__", "reset_parameters", "__repr__", "extra_repr",
                           "__module__", "__qualname__", "__doc__", "__annotations__",
                           "__dict__", "__weakref__", "__firstlineno__", "__static_attributes__",
                           "_orig_propagate", "_jinja_propagate", "_orig_edge_updater",
                           "_jinja_edge_updater"})


def _converter(cls) -> Callable[[nn.Module], PyGLayer] | None:
    """The converter of a stock class, or of a subclass of one that overrides none of its
    methods (a subclass that changes ``message``, ``update``, ``forward``... is traced
    from its own code instead, as any other MessagePassing)."""
    from torch_geometric.nn import MessagePassing
    stock = _stock(cls)
    if stock is None or _overridden(cls, stock):
        return None
    return _converters()[stock]


def _stock(cls) -> type | None:
    """The first class in ``cls``'s MRO that sarc converts (None: none is)."""
    converters = _converters()
    return next((c for c in cls.__mro__ if c in converters), None)


def _overridden(cls, stock) -> list[str]:
    """The methods of ``stock`` (a converted class in ``cls``'s MRO) that ``cls`` or a class
    between them defines, propagate included."""
    names = []
    for sub in cls.__mro__[:cls.__mro__.index(stock)]:
        # PyG generates propagate and collect on each class from its code (the class's
        # own propagate is kept as _orig_propagate, checked below), and edge_updater and
        # edge_collect for a conv with an edge_update (GATConv's), unless it has its own
        generated = {"propagate", "collect"} if "_orig_propagate" in vars(sub) else set()
        updater = vars(sub).get("edge_updater")
        if "_orig_edge_updater" in vars(sub) and getattr(updater, "__module__", "").startswith(
                f"{sub.__module__}_{sub.__name__}"):
            generated |= {"edge_updater", "edge_collect"}
        names += [name for name in vars(sub) if name not in _NOT_MODELLED
                  and name not in generated and hasattr(stock, name) and name not in names]
    for name in ("propagate", "edge_updater"):
        if _overrides(cls, name) and name not in names:
            names.append(name)
    return names


def _why_traced(cls) -> str | None:
    """Why a subclass of a converted conv is traced from its code instead (None for any
    other class): its refusals come from the stock conv's forward, not the user's code."""
    stock = _stock(cls)
    if stock is None or stock is cls:
        return None
    names = _overridden(cls, stock)
    if not names:
        return None
    s, name = stock.__name__, cls.__name__
    loc = class_loc(cls)
    return (f"{name} overrides {s}'s {', '.join(names)}"
            + (f" ({name} is defined at {loc})" if loc is not None else "")
            + f", so sarc traces {name}'s code, {s}.forward included; a subclass that "
            f"overrides none of {s}'s methods is converted as a {s}")


@contextlib.contextmanager
def _says_why_traced(conv):
    """A refusal while a subclass of a converted conv is traced says why it was traced."""
    try:
        yield
    except (DSLError, ConversionError) as e:
        why = _why_traced(type(conv))
        if why is None or type(e) not in (DSLError, ConversionError) or why in str(e):
            raise
        if type(e) is DSLError:
            raise DSLError(f"{e.problem}; {why}", e.loc) from e.__cause__
        loc = class_loc(type(conv))
        text = str(e).removesuffix(f"; {type(conv).__name__} is defined at {loc}")
        raise ConversionError(f"{text}; {why}") from e.__cause__


def _overrides(cls, method: str) -> bool:
    """Whether a class in ``cls``'s MRO defines its own ``method`` (``propagate`` or
    ``edge_updater``). PyG replaces each class's method by code it generates
    (``_jinja_<method>``) and keeps what it replaced as ``_orig_<method>``: PyG's own, or
    the generated one of a parent (a class with its own method is not generated: both
    name its function)."""
    from torch_geometric.nn import MessagePassing
    jinja, orig = f"_jinja_{method}", f"_orig_{method}"
    pyg = {getattr(MessagePassing, method)} | {
        vars(c)[jinja] for c in cls.__mro__
        if jinja in vars(c) and vars(c)[jinja] is not vars(c).get(orig)}
    return any(vars(c)[name] not in pyg for c in cls.__mro__
               for name in (method, orig) if name in vars(c))


def _generated_collect(conv, method: str) -> bool:
    """Whether PyG collects the arguments of ``conv.<method>`` (``propagate`` or
    ``edge_updater``, not overridden) with the code it generated for the class, or with
    ``MessagePassing._collect``, its fallback where it could not generate it (an
    unannotated ``ptr`` in ``message`` is enough). They read a pair ``(a, b)`` given
    for ``x_j`` / ``x_i`` differently under ``flow='target_to_source'``: the generated
    code reads ``a`` at ``x_j`` whatever the flow, the fallback ``b``."""
    from torch_geometric.nn import MessagePassing
    return getattr(type(conv), method) is not getattr(MessagePassing, method)


class PyGConv(nn.Module):
    """A sarc layer with PyG's calling convention: ``forward(x, edge_index[, edge_attr],
    size=None)``. The ``sarc.Graph`` of an ``edge_index`` is built once and reused while the
    call's edge_index, node count and edge_attr hold the same values (``_inputs``);
    ``edge_attr`` is the layer's edge feature (``edge``: its name, needed when it declares
    several). A ``PyGLayer`` (``from_message_passing``) prepares the graph as its conv does.

    The wrapper is transparent in state dicts: a wrapped conv saves and loads under the
    conv's own keys (``conv1.lin.weight``, not ``conv1.layer.conv.lin.weight``), so a PyG
    model's checkpoints load into the model whose convs are wrapped, and back.
    """

    def __init__(self, layer: Layer, *, node: str | None = None, edge: str | None = None):
        super().__init__()
        if not isinstance(layer, Layer) and not _imported(layer):
            raise ConversionError(f"as_conv wraps a sarc.Layer or a PyG MessagePassing, got "
                                  f"{type(layer).__name__}")
        self.layer = layer
        self.node = node or ("x" if _imported(layer) else
                             _only(layer._sarc_node, "node", type(layer).__name__))
        self.edge = edge
        if edge is None and not _imported(layer) and layer._sarc_edge:
            self.edge = _only(layer._sarc_edge, "edge", type(layer).__name__)
        self._cache: _Prepared | None = None
        self._register_state_dict_hook(_without_inner_prefix)
        self._register_load_state_dict_pre_hook(_with_inner_prefix, with_module=True)

    def reset_parameters(self) -> None:
        """The conv's own ``reset_parameters`` (PyG's models call each conv's); the graph
        kept of the last call is prepared again at the next."""
        target = self.layer.conv if _imported(self.layer) else self.layer
        reset = getattr(target, "reset_parameters", None)
        if reset is None:
            raise AttributeError(f"{type(target).__name__} has no reset_parameters")
        reset()
        self._cache = None

    def inner_prefix(self) -> str:
        """Where the wrapped parameters sit below this module: ``layer.`` or, for an
        imported conv, ``layer.conv.``; state dicts leave it out."""
        return "layer.conv." if _imported(self.layer) else "layer."

    def forward(self, x, edge_index, edge_attr=None, size=None, **others):
        name = type(getattr(self.layer, "conv", self.layer)).__name__
        edge_attr, others = _by_the_convs_names(self.layer, edge_attr, others)
        if others:
            raise ConversionError(f"{name}: argument {next(iter(others))}= is not supported "
                                  f"through as_conv, which calls a conv as forward(x, "
                                  f"edge_index[, edge_attr], size=None)")
        if isinstance(x, (tuple, list)):
            raise _refuse(name, "a (x_src, x_dst) pair of node features",
                          "sarc's layers read one node feature tensor")
        if not isinstance(x, torch.Tensor) or (_imported(self.layer)
                                               and not x.is_floating_point()):
            shown = type(x).__name__ if not isinstance(x, torch.Tensor) else f"{x.dtype} ids"
            raise _refuse(name, f"x={shown} (a featureless conv, as RGCNConv's x=None or "
                          f"node ids)", "sarc's layers read a float node feature tensor: give "
                          "the nodes features, as an nn.Embedding's rows")
        declared = getattr(self.layer, "_sarc_node", {}).get(self.node)   # (rounds: none)
        if declared is not None and tuple(x.shape[1:]) != tuple(declared.shape):
            raise _refuse(name, f"x of shape {list(x.shape)}", f"the layer reads node features "
                          f"[num_nodes{''.join(f', {d}' for d in declared.shape)}]")
        edge_index = _plain_edge_index(self.layer.conv if _imported(self.layer) else name,
                                       edge_index)
        num = x.size(0) if size is None else _size(name, size, x.size(0))
        try:
            g, edge = self._inputs(edge_index, num, edge_attr, x.dtype)
        except GraphError as e:  # the call's edge_index (ids out of range): at the user's line
            if e.loc is not None:
                raise
            raise e.at_call(name, user_loc()) from None
        return self.layer(g, **{self.node: x}, **edge)

    def _inputs(self, edge_index, num, edge_attr, x_dtype=None):
        """The graph and edge features of a call. Those of the last call are reused while
        its edge_index, node count and edge_attr hold the same values, compared with copies
        kept of them (O(E), as building the graph is): so an edit the tensor's version
        counter does not see (numpy writing into a ``torch.from_numpy`` tensor, ``.data``)
        is seen, and an equal edge_index in a new tensor reuses the graph. Edge features
        computed from an ``edge_attr`` that needs a gradient are prepared again at each
        call (each backward needs its own), on the same graph; so are those of a call after
        such a call, whose kept features belong to that call's autograd graph."""
        dtypes = (str(x_dtype), *sorted({str(p.dtype) for p in self.layer.parameters()}),
                  *_options(self.layer))
        c = self._cache
        g = None
        if _cached_by_the_conv(self.layer):
            kept = self.layer.conv._cached_edge_index
            if c is None or c.pygs_cache is not kept:   # PyG's call, or another wrapper's
                ei, w = kept
                inputs = oriented(self.layer.conv, PyGInputs(
                    ei, num, {} if w is None else {self.layer.edge_input: w}))
                c = self._cache = _Prepared(None, num, None, dtypes, inputs.graph(),
                                            inputs.edge, kept)
            return c.graph, c.edge
        if c is not None and c.num == num and c.dtypes == dtypes \
                and _same_values(c.edge_index, edge_index):
            if _same_values(c.edge_attr, edge_attr) and not (
                    edge_attr is not None and edge_attr.requires_grad) and not any(
                    t.requires_grad for t in c.edge.values()):
                return c.graph, c.edge
            g = c.graph   # the same edges: only the edge features are prepared again
        if _imported(self.layer):
            if isinstance(num, tuple):
                raise _refuse(self.layer.conv, f"size={num} (a bipartite block)",
                              "an imported conv runs on a graph whose nodes are its sources "
                              "and targets")
            prepared = self.layer.prepare(edge_index, num, edge_attr, x_dtype)
            g, edge = prepared.graph() if g is None else g, prepared.edge
            if _keeps_pygs_cache(self.layer):
                # what PyG's forward caches (its reset_parameters forgets it): the normalized
                # edges, numbered as PyG's, and their weights, read by this conv's next
                # call, or PyG's
                self.layer.conv._cached_edge_index = (
                    oriented(self.layer.conv, prepared).edge_index,
                    next(iter(edge.values()), None))
        else:
            g = from_pyg(edge_index, num) if g is None else g
            if edge_attr is not None and self.edge is None:
                raise ConversionError(f"{type(self.layer).__name__} declares no edge feature; "
                                      f"it takes no edge_attr")
            edge = {} if edge_attr is None else {self.edge: edge_attr}
        pygs = self.layer.conv._cached_edge_index if _keeps_pygs_cache(self.layer) else None
        self._cache = _Prepared(_kept(edge_index), num, _kept(edge_attr), dtypes, g, edge, pygs)
        return g, edge

    def __getstate__(self):
        state = dict(super().__getstate__())
        state["_cache"] = None
        return state


@dataclass
class _Prepared:
    """What ``PyGConv`` keeps of its last call: copies of the inputs the graph and edge
    features were prepared from, and those."""

    edge_index: torch.Tensor
    num: Any
    edge_attr: torch.Tensor | None
    dtypes: tuple
    graph: Graph
    edge: dict
    pygs_cache: Any = None   # the conv's _cached_edge_index the graph is (cached=True)


_OPTION_TYPES = (bool, int, float, str, type(None))


def _options(layer) -> tuple:
    """An imported conv's options its graph preparation may read (``add_self_loops``,
    ``normalize``, ``K``, ``normalization``...: its public attributes of plain values), so
    that the graph kept by ``as_conv`` is prepared again when one is set."""
    if not _imported(layer):
        return ()
    traced = isinstance(layer, TracedConv)   # its graph code may read private ones too
    return tuple(sorted((k, _option_value(v)) for k, v in vars(layer.conv).items()
                        if isinstance(v, _OPTION_TYPES + (torch.Tensor,))
                        and (traced or not k.startswith("_"))
                        and k not in _PER_CALL and not k.startswith("_sarc")))


def _option_value(v) -> str:
    """An option as compared between calls: a plain value's repr; a tensor's (GATConv's
    ``fill_value``) values, so that one replaced or changed in place is seen (a larger one
    than 4096 numbers: its identity and version)."""
    if isinstance(v, torch.Tensor):
        if v.numel() > 4096:
            return f"tensor@{id(v)}:{v._version}"
        return f"tensor{tuple(v.shape)}:{v.dtype}:{v.detach().flatten().tolist()}"
    return repr(v)


_PER_CALL = frozenset({"_alpha", "_cached_edge_index", "_cached_adj_t", "_cached_x",
                       "_explain", "_edge_mask", "_loop_mask", "_apply_sigmoid"})
"""PyG's attributes of a conv its calls set (or None until they do): not options."""


def _cached_by_the_conv(layer) -> bool:
    """An imported conv with ``cached=True`` that has been called (and not reset since): PyG
    uses its first call's normalized graph at every later call, whatever ``edge_index`` it
    is given."""
    return (_keeps_pygs_cache(layer)
            and getattr(layer.conv, "_cached_edge_index", None) is not None)


def _keeps_pygs_cache(layer) -> bool:
    """A converted conv with ``cached=True`` (GCNConv's): as_conv keeps its graph where PyG
    does. A traced conv's forward reads its own cache (the graph code refuses one kept
    from an earlier call), so nothing is stored there."""
    return (_imported(layer) and not isinstance(layer, TracedConv)
            and getattr(layer.conv, "cached", False) is True)


def _imported(layer) -> bool:
    """Whether ``layer`` holds a PyG conv it prepares the graph for: a ``PyGLayer``, or the
    ``PyGRounds`` of a conv of K rounds."""
    from .pyg_rounds import PyGRounds
    return isinstance(layer, (PyGLayer, PyGRounds))


def _kept(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


def _same_values(kept: torch.Tensor | None, t: torch.Tensor | None) -> bool:
    if kept is None or t is None:
        return kept is None and t is None
    return (kept.shape == t.shape and kept.dtype == t.dtype and kept.device == t.device
            and torch.equal(kept, t))


def _without_inner_prefix(module: PyGConv, state_dict, prefix, local_metadata) -> None:
    inner = prefix + module.inner_prefix()
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        state_dict[prefix + key[len(inner):] if key.startswith(inner) else key] = value


def _with_inner_prefix(module: PyGConv, state_dict, prefix, *args) -> None:
    inner = prefix + module.inner_prefix()
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


def _only(feats: dict, kind: str, layer: str) -> str:
    if len(feats) != 1:
        raise ConversionError(f"{layer} declares {len(feats)} {kind} features "
                              f"({', '.join(feats) or 'none'}); name the one PyG's "
                              f"{'x' if kind == 'node' else 'edge_attr'} is: "
                              f"as_conv(layer, {kind}=...)")
    return next(iter(feats))


def _count(n) -> int | None:
    """``n`` as a node count (an int, numpy's too; not a bool or a tensor), else None."""
    if isinstance(n, (bool, torch.Tensor)):
        return None
    try:
        return operator.index(n)
    except TypeError:
        return None


def _size(name: str, size, rows: int):
    """PyG's ``size``: the node count, or ``(num_src, num_dst)``. Anything else, as a conv's
    further argument given by position (RGATConv's ``edge_attr`` after ``edge_type``),
    is refused, naming what was given."""
    if (n := _count(size)) is not None:
        return n
    pair = (size.tolist() if isinstance(size, torch.Tensor) and size.dim() == 1
            and not size.is_floating_point() else size)
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(_count(s) is not None for s in pair)):
        shown = (f"a {size.dtype} tensor of shape {list(size.shape)}"
                 if isinstance(size, torch.Tensor) else repr(size))
        raise ConversionError(f"{name}: size={shown} is not a node count or a (num_src, "
                              f"num_dst) pair: as_conv calls a conv as forward(x, edge_index"
                              f"[, edge_attr], size=None), so a fourth argument by position is "
                              f"PyG's size; a conv that takes more arguments is not supported "
                              f"through as_conv")
    num_src, num_dst = map(_count, pair)
    if num_src != rows:
        raise ConversionError(f"{name}: size={tuple(size)} but x has {rows} rows")
    return num_src if num_src == num_dst else (num_src, num_dst)


def as_conv(layer, *, node: str | None = None, edge: str | None = None,
            in_channels: int | None = None, edge_dim=None) -> PyGConv:
    """``layer`` (a sarc layer, or a PyG ``MessagePassing`` imported first with
    ``from_message_passing(layer, in_channels=..., edge_dim=...)``) as a module PyG code
    calls like a conv; ``node`` / ``edge`` name a sarc layer's features PyG's ``x`` and
    ``edge_attr`` are."""
    if not isinstance(layer, Layer) and isinstance(layer, nn.Module):
        from torch_geometric.nn import MessagePassing
        if isinstance(layer, MessagePassing):
            layer = from_message_passing(layer, in_channels=in_channels, edge_dim=edge_dim)
            in_channels = edge_dim = None
    if (in_channels is not None or edge_dim is not None) and isinstance(layer, Layer):
        raise ConversionError(f"as_conv: in_channels= and edge_dim= are for a PyG "
                              f"MessagePassing (from_message_passing's), not a "
                              f"{type(layer).__name__}, which declares its features")
    return PyGConv(layer, node=node, edge=edge)


__all__ = ["from_message_passing", "as_conv", "PyGConv", "PyGLayer", "PyGInputs", "TracedConv",
           "ConversionError"]
