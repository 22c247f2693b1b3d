"""The sarc layers a model's forward pass calls, in call order, and whether each call's
node inputs need a gradient: what a training step runs.

A trainer runs the layers in the order the model's ``forward`` calls them, not the
order its ``__init__`` declares them (a minibatch step runs the k-th call on block k,
``sarc.training.minibatch.MiniBatchGraph``), and plans each call for whether its node
inputs need a gradient (``input_needs_grad``, as ``sarc.distributed.schedule.run_layer``
decides): every layer after the first, and the first one too when its input is
learned (a featureless graph's embedding). ``layer_calls`` finds both by running the
model once on the graph and inputs a trainer feeds it (``sarc.train.prepare``), so a
plan made ahead of training (``sarc compile``) is the one the step runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from ..dsl import Layer
from ..errors import GraphError, SarcError, SourceLoc
from ..hetero import HeteroConv
from ..trace import user_loc
from .inputs import check_call, model_code_error


class LayerCallError(SarcError):
    """The model's forward pass could not be run to find its layer calls."""


@dataclass(frozen=True, eq=False)
class LayerCall:
    """One call of a sarc layer in the forward pass: the layer's name in the model (a
    layer called again: ``name#2``, ...), the layer, whether its node inputs need a
    gradient, and the model file's line that calls it."""

    name: str
    layer: Layer
    inputs_need_grad: bool
    loc: SourceLoc | None = None
    # the first relation layer's call of a sarc.HeteroConv call: what the conv's call fetches
    # on a worker (its HeteroConv.fetched_inputs: label, values a row, bytes a value, whether
    # it needs a gradient)
    fetches: tuple[tuple[str, int, int, bool], ...] = ()
    # a relation layer's call: the relation it ran for, and the edge types its conv's call
    # was given (one per edge of the graph the model was called on)
    relation: int | None = None
    etype: torch.Tensor | None = None


def input_needs_grad(layer: Layer, given: Mapping[str, Any]) -> bool:
    """Whether a call of ``layer`` with the features ``given`` (by name,
    ``sarc.runtime.bind.resolve_features``) sends gradients to its node inputs."""
    return any(isinstance(t, torch.Tensor) and t.requires_grad
               for k, t in given.items() if k in layer._sarc_node)


def layer_calls(model: nn.Module, graph, x: torch.Tensor,
                edge_inputs: Mapping[str, torch.Tensor] | None = None) -> list[LayerCall]:
    """The sarc layer calls of one training forward pass ``model(graph, x, **edge_inputs)``
    (a ``sarc.Graph``), in call order. The pass runs with autograd on, in training mode,
    on a fork of torch's random state (so it draws nothing from the caller's stream);
    the model is left in the mode it was in."""
    from ..runtime.bind import resolve_features
    layers = _named_layers(model, graph, x, edge_inputs)
    calls: list[LayerCall] = []
    seen: dict[int, int] = {}

    # the HeteroConv call under way: the conv, its etype, its fetches (the first relation's
    # call takes them), the relations it has yet to call (in relation_ids order: HeteroConv._run)
    conv_call: dict = {}

    def record(layer, args: tuple, feats: dict) -> None:
        # every call, on whatever graph it gets (``sarc.HeteroConv``'s relation subgraphs)
        try:
            given = resolve_features(layer, args[1:], feats)
        except GraphError:
            return  # the call itself raises it, saying where the layer was called
        n = seen[id(layer)] = seen.get(id(layer), 0) + 1
        name = layers[id(layer)][0]
        left = conv_call.get("left")
        ours = bool(left) and conv_call["conv"].layers[str(left[0])] is layer
        calls.append(LayerCall(name if n == 1 else f"{name}#{n}", layer,
                               input_needs_grad(layer, given), user_loc(),
                               conv_call.pop("fetches", ()) if ours else (),
                               left.pop(0) if ours else None,
                               conv_call["etype"] if ours else None))

    def record_conv(conv, args: tuple, feats: dict) -> None:
        nodes = {k: v for k, v in feats.items() if k not in conv.sarc_inputs}
        fetches = tuple((label, math.prod(t.shape[1:]), t.element_size(), t.requires_grad)
                        for label, t in conv.fetched_inputs(args[1:], nodes))
        conv_call.update(conv=conv, etype=feats.get("etype"), fetches=fetches,
                         left=list(conv.relation_ids))

    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for _, m in layers.values()]
    hooks += [m.register_forward_pre_hook(record_conv, with_kwargs=True)
              for m in model.modules() if isinstance(m, HeteroConv)]
    try:
        _run_once(model, graph, x, edge_inputs)
    finally:
        for h in hooks:
            h.remove()
    if not calls:
        raise LayerCallError(f"the model ({type(model).__name__}) called no sarc.Layer in its "
                             f"forward pass")
    return calls


def _run_once(model: nn.Module, graph, x, edge_inputs) -> None:
    """One training forward pass of ``model``, on a fork of torch's random state, the model
    left in the mode it was in. A mistake in the model file's code is said as training says
    it (``loop.forward``): at its line, or as the call that does not fit the forward."""
    was_training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            model.train()
            model(graph, x, **dict(edge_inputs or {}))
    except SarcError:
        raise
    except Exception as e:
        if isinstance(e, TypeError):
            check_call(model, (graph, x), dict(edge_inputs or {}))
        err = model_code_error(e, "in the model's forward, run once to find its layer calls")
        if err is None:   # sarc's or torch's code below the user's: a bug, with its traceback
            raise
        raise err from e
    finally:
        model.train(was_training)


def _named_layers(model: nn.Module, graph, x, edge_inputs) -> dict[int, tuple[str, Layer]]:
    """The model's sarc layers by id, each with its name: its modules that are layers, and
    the layers that a library conv running through sarc by itself (DGL's after ``patch()``:
    ``forward._sarc_held``) made at its calls, named after the conv. Those are made by a
    first forward pass, run here when the model has such convs."""
    layers = {id(m): (n, m) for n, m in model.named_modules() if isinstance(m, Layer)}
    routed = [(n, m) for n, m in model.named_modules()
              if getattr(type(m).forward, "_sarc_routed", False)]
    if routed:
        _run_once(model, graph, x, edge_inputs)
    for owner, conv in routed:
        for name, layer in type(conv).forward._sarc_held(conv):
            full = owner + name if not name or name.startswith("~") else f"{owner}.{name}"
            layers.setdefault(id(layer), (full or type(conv).__name__, layer))
    return layers


def called_again(name: str, loc: SourceLoc | None, mode: str | None = None) -> str:
    """What a minibatch mode says of a sarc layer called a second time in a forward pass
    (weight sharing: a step has one block per layer), at the line that calls it."""
    modes = f"{mode} mode" if mode else "mfg and sampling modes"
    what = (f"the forward calls the sarc layer {name} again: in {modes} a step has a "
            f"block per sarc layer, each layer called once per forward pass, input layer "
            f"first (use a layer per call, or --mode full)")
    return loc.located(what) if loc is not None else what
