"""Single-process, full-batch node classification.

``train(spec, dataset)`` loads the dataset, prepares the graph and the input
features as the model file's ``HPARAMS`` ask (self loops, row-normalized
features, a learned embedding for featureless graphs: ``sarc.training.inputs``),
trains with Adam on the labeled training nodes (a learned embedding with a sparse
optimizer: ``sarc.training.inputs.optimizer``), evaluates train / val / test
accuracy every epoch and returns a result dict. Its epochs are the loop the
distributed workers run too (``sarc.training.loop``), on one process. The model
is selected on the validation set: the reported ``test_acc`` is the one at the
epoch with the best validation accuracy (ties: the lower validation loss);
without a validation set, the last epoch. Runs are deterministic given the seed.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import math
import numbers
import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .checkpoint import CheckpointConfig, run_record, seed_all
from .datasets import Dataset, add_self_loops_with_data, check_dataset, load_dataset
from .dsl import edge_inputs_for
from .errors import SarcError
from .graph import Graph
from .loader import ModelSpec, exit_call, exits_raise
from .partition.fingerprint import dataset_digests, graph_fingerprint
from .training.inputs import (EMBEDDING_OPTIMIZERS, EmbeddingInput, TrainError,
                              check_self_loops, labeled_masks, node_features, optimizer)
from .sampling import Comm
from .training.device import kernels, placed
from .training.loop import Batch, FullBatch, epoch_line, fit, save_selected, score, timings
from .training.progress import plural
from .training.minibatch import (MiniBatchConfig, MiniBatchSteps, ShardRows, graph_layers,
                                 local_blocks, whole_graph_shard)

DEFAULTS: dict[str, Any] = {
    "dataset": "cora",       # the dataset a model file trains on by default
    "lr": 0.01,              # Adam learning rate
    "weight_decay": 5e-4,    # Adam's L2 penalty, on every parameter
    "epochs": 200,           # most epochs to train
    "patience": None,        # stop after this many epochs without a better val acc or loss
    "self_loops": False,     # add a self loop to every node (GCN, GAT)
    "norm_features": False,  # divide each node's features by their sum (Kipf & Welling)
    "embedding_dim": None,   # featureless graphs: width of a learned node embedding input
    "embedding_optimizer": "sparse_adam",  # its sparse optimizer: sparse_adam, sparse_adagrad
    "embedding_lr": None,    # its learning rate (None: lr)
}
"""The trainer's hyperparameters and their defaults; a model's ``HPARAMS`` override them."""

EMBEDDING_HPARAMS = ("embedding_dim", "embedding_optimizer", "embedding_lr")
"""The hyperparameters of a featureless graph's learned input: a graph with node features
has none, so setting one for it is refused (``check_features``), not ignored."""


class Hyperparameters(dict):
    """A run's hyperparameters (``hyperparameters``), and ``given``: the keys set for this
    run (``--set``, ``--epochs``, the options that stand for ``--set``), not by default or
    by the model file; an option that cannot apply to the run is refused by those."""

    def __init__(self, values: dict[str, Any], given=()):
        super().__init__(values)
        self.given = frozenset(given)


DATASET_FACTS = ("num_nodes", "num_etypes", "num_ntypes")
"""What ``build`` passes ``build_model`` from the dataset, beside the hyperparameters."""


def known_hparams(spec: ModelSpec) -> dict[str, Any]:
    """Every hyperparameter ``spec`` takes, with its default: the trainer's (``DEFAULTS``),
    the keywords of ``build_model`` after its two sizes, and the model file's ``HPARAMS``."""
    named, _ = spec.builder_keywords() or ([], None)
    known = {p.name: None if p.default is p.empty else p.default
             for p in named if p.name not in DATASET_FACTS}
    return {**known, **DEFAULTS, **spec.hparams}


def check_declared(spec: ModelSpec) -> None:
    """Every key of the model file's ``HPARAMS`` is read by someone: the trainer (``DEFAULTS``),
    the link task (``LINK_DEFAULTS``) or a keyword ``build_model`` names. A builder taking
    ``**_`` drops the others, so a misspelt key would train on the default silently; one
    whose ``**options`` has a name may read any key, and none is refused."""
    from .training.link import LINK_DEFAULTS
    keywords = spec.builder_keywords()
    if keywords is None or (keywords[1] is not None and not keywords[1].name.startswith("_")):
        return   # a named **options may read any key
    named = [p.name for p in keywords[0]]
    read = set(named) | set(DEFAULTS) | set(LINK_DEFAULTS)
    for key in spec.hparams:
        if key in DATASET_FACTS or key in ("in_feats", "num_classes"):
            raise TrainError(f"{spec.hparams_at(key)}HPARAMS[{key!r}]: {key} is a size of "
                             f"the dataset, which build_model is given, not a hyperparameter")
        if key not in read:
            close = difflib.get_close_matches(str(key), sorted(read), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TrainError(f"{spec.hparams_at(key)}HPARAMS[{key!r}] is read by neither the "
                             f"trainer nor build_model (its keywords after the two sizes: "
                             f"{', '.join(named) or 'none'}){hint}")


def hyperparameters(spec: ModelSpec, overrides: dict[str, Any] | None = None, *,
                    epochs: int | None = None) -> Hyperparameters:
    """``DEFAULTS``, then the model file's ``HPARAMS``, then ``overrides`` (then ``epochs``),
    checked before any work.

    An override must name a known hyperparameter (``known_hparams``) and have the type of
    its default: an int for an int, an int or a float for a float (made a float), a bool
    for a bool, a string for a string; anything where the default is None. The trainer's
    own values must be in range (``epochs >= 1``, ``lr > 0``, ...).
    """
    check_declared(spec)
    known = known_hparams(spec)
    given = dict(overrides or {})
    if epochs is not None:
        if "epochs" in given and (given["epochs"] != epochs or isinstance(given["epochs"], bool)):
            raise TrainError(f"--epochs {epochs} and --set epochs={given['epochs']!r} disagree; "
                             f"give one")
        given["epochs"] = epochs
    for key, value in given.items():
        if key in DATASET_FACTS or key in ("in_feats", "num_classes"):
            raise TrainError(f"{key} is a size of the dataset, not a hyperparameter")
        if key not in known:
            raise TrainError(f"unknown hyperparameter {key}={value!r}; the known ones of "
                             f"{spec.name}: {', '.join(sorted(known))}")
        given[key] = _of_default_type(key, value, known[key])
    hp = Hyperparameters({**DEFAULTS, **spec.hparams, **given}, given)
    _check_trainer_hparams(hp)
    return hp


_NOT_A_NUMBER = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)
"""The floats ``float()`` reads that are not Python literals (``--set lr=nan``)."""


def _of_default_type(key: str, value: Any, default: Any) -> Any:
    if default is None:
        return value
    for kind, name in ((bool, "a bool"), (int, "an int"), (float, "a float"), (str, "a string"),
                       (list, "a list"), (tuple, "a tuple"), (dict, "a dict")):
        if isinstance(default, kind):
            break
    else:
        return value
    if kind is float and isinstance(value, str) and _NOT_A_NUMBER.fullmatch(value.strip()):
        value = float(value)   # not Python literals: read as the float the user wrote
    ok = (isinstance(value, bool) if kind is bool
          else isinstance(value, numbers.Integral) and not isinstance(value, bool) if kind is int
          else isinstance(value, numbers.Real) and not isinstance(value, bool) if kind is float
          else isinstance(value, kind))
    if not ok:
        hint = "; write True or False" if kind is bool else ""
        raise TrainError(f"hyperparameter {key}={value!r} is {_type_name(value)}, but {key} "
                         f"takes {name} (its default is {default!r}){hint}")
    if kind is float:
        try:
            return float(value)
        except OverflowError:
            raise TrainError(f"hyperparameter {key}={_short(value)} is too large for a float") \
                from None
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def _type_name(value: Any) -> str:
    if value is None:
        return "None"
    names = {bool: "a bool", int: "an int", float: "a float", str: "a string"}
    return names.get(type(value), f"a {type(value).__name__}")


def _check_trainer_hparams(hp: dict[str, Any]) -> None:
    """The trainer's hyperparameters (``DEFAULTS``' keys) in type and range."""
    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    def is_real(v):
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

    rules = {
        "epochs": (lambda v: is_int(v) and v >= 1, "an integer >= 1"),
        "lr": (lambda v: is_real(v) and v > 0, "a finite number > 0"),
        "weight_decay": (lambda v: is_real(v) and v >= 0, "a finite number >= 0"),
        "patience": (lambda v: v is None or (is_int(v) and v >= 1), "None or an integer >= 1"),
        "self_loops": (lambda v: isinstance(v, bool), "True or False"),
        "norm_features": (lambda v: isinstance(v, bool), "True or False"),
        "embedding_dim": (lambda v: v is None or (is_int(v) and v >= 1),
                          "None or an integer >= 1"),
        "embedding_optimizer": (lambda v: v in EMBEDDING_OPTIMIZERS,
                                " or ".join(EMBEDDING_OPTIMIZERS)),
        "embedding_lr": (lambda v: v is None or (is_real(v) and v > 0),
                         "None or a finite number > 0"),
        "dataset": (lambda v: isinstance(v, str) and v != "", "a dataset name or .npz path"),
    }
    for key, (ok, want) in rules.items():
        if not ok(hp[key]):
            raise TrainError(f"hyperparameter {key}={hp[key]!r}: it must be {want}")
    _check_model_hparams(hp)


SIZE_HPARAMS = ("hidden", "heads", "out_heads", "num_heads", "num_layers", "layers", "out",
                "num_bases")
"""Model hyperparameters that are a count of something (units, heads, layers): an integer
value must be at least 1 (None, where a model takes it, is the model's to read)."""


def is_probability_name(key: str) -> bool:
    """A hyperparameter named as a dropout rate: ``dropout``, ``attn_drop``, ``feat_drop``,
    ``input_dropout``, ``alpha_dropout``, ``dropout_rate`` ..."""
    return any(t in ("drop", "dropout", "dropedge") for t in key.lower().split("_"))


def _check_model_hparams(hp: dict[str, Any]) -> None:
    """The model's hyperparameters whose range is known by their name, in range: a dropout
    rate a probability in [0, 1) (torch would raise mid-forward, or 1 drop everything), a
    count (``SIZE_HPARAMS``) at least 1. Values of other types are the model's own."""
    for key, v in hp.items():
        if isinstance(v, bool) and key not in DEFAULTS and (is_probability_name(key)
                                                             or key in SIZE_HPARAMS):
            # torch reads True as 1: a dropout of everything, a width of one
            wanted = ("a dropout rate, a number in [0, 1)," if is_probability_name(key)
                      else "a count, an integer >= 1,")
            raise TrainError(f"hyperparameter {key}={v!r}: a bool, where {wanted} is expected")
        if not isinstance(v, numbers.Real) or isinstance(v, bool) or key in DEFAULTS:
            continue
        if is_probability_name(key) and not (0 <= v < 1 and math.isfinite(v)):
            raise TrainError(f"hyperparameter {key}={_short(v)}: a dropout rate, it must be a "
                             f"probability in [0, 1)")
        if key in SIZE_HPARAMS and isinstance(v, numbers.Integral) and v < 1:
            raise TrainError(f"hyperparameter {key}={v!r}: a count, it must be an integer >= 1")


@dataclass(frozen=True, eq=False)
class Prepared:
    """What one training run feeds the model: ``model(graph, x, **edge_inputs)``."""

    graph: Graph
    x: torch.Tensor
    edge_inputs: dict[str, torch.Tensor]
    label: torch.Tensor
    masks: dict[str, torch.Tensor]  # "train" / "val" / "test", labeled nodes only

    def to(self, device) -> "Prepared":
        """The graph and every input on ``device``."""
        return Prepared(self.graph.to(device), self.x.to(device),
                        {k: v.to(device) for k, v in self.edge_inputs.items()},
                        self.label.to(device), {k: m.to(device) for k, m in self.masks.items()})


def prepare(data: Dataset, hparams: dict[str, Any], model: nn.Module | None = None) -> Prepared:
    """The graph and inputs of ``data`` as ``hparams`` (self_loops, norm_features) ask.

    With ``model``, the edge inputs are the edge data its layers declare and its forward
    takes (``sarc.dsl.edge_inputs_for``), and self loops give a float one
    ``sarc.datasets.SELF_LOOP_FILL``; without, all the edge data, and no self loops with it."""
    src, dst = data.edge_src, data.edge_dst
    carried = data.edge_data
    edge_inputs = edge_inputs_for(model, carried) if model is not None else carried
    if hparams["self_loops"]:
        if model is None:
            check_self_loops(edge_inputs, f"the relational graph {data.name}")
        src, dst, edge_inputs = add_self_loops_with_data(src, dst, data.num_nodes, edge_inputs)
    if model is not None and data.ntype is not None:  # node types, to a model that reads them
        edge_inputs = {**edge_inputs, **edge_inputs_for(model, {"ntype": data.ntype})}
    g = Graph.from_edges(src, dst, data.num_nodes)
    masks = labeled_masks(data.label, data.train_mask, data.val_mask, data.test_mask)
    return Prepared(g, node_features(data.feat, hparams), edge_inputs, data.label, masks)


def build(spec: ModelSpec, data: Dataset, hparams: dict[str, Any], *, seed: int = 0,
          table: Callable[[int, int], nn.Module] | None = None) -> nn.Module:
    """``spec.build_model`` on the dataset's sizes, with an embedding input if featureless:
    ``table(num_nodes, dim)`` (a worker's shard of it) or an ``nn.Embedding`` drawn from
    ``seed`` (``sarc.training.inputs.EmbeddingInput``)."""
    in_feats = data.num_features
    check_features(data.name, data.has_features, hparams)
    if not data.has_features:
        in_feats = int(hparams["embedding_dim"])
    types = {"num_ntypes": data.num_ntypes} if data.ntype is not None else {}
    try:
        with exits_raise():
            model = spec.call_builder(in_feats, data.num_classes, num_nodes=data.num_nodes,
                                     num_etypes=data.num_etypes, **types, **hparams)
    except SarcError:
        raise
    except (Exception, SystemExit) as e:  # the model file's code, on the user's hyperparameters
        what = (f"called {exit_call(e)}" if isinstance(e, SystemExit)
                else f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0]}")
        raise TrainError(f"building the model with {_chosen(spec, hparams)} failed (dataset "
                         f"{data.name}{_where_in(spec, e)}): {what}") from e
    if not isinstance(model, nn.Module):
        raise TrainError(f"{spec.path or spec.name}: build_model returned a "
                         f"{type(model).__name__}, not a torch.nn.Module")
    if not data.has_features:
        model = EmbeddingInput(model, data.num_nodes, in_feats,
                               table(data.num_nodes, in_feats) if table else None, seed=seed)
    if not any(True for _ in model.parameters()):
        raise TrainError(f"{spec.path or spec.name}: the model has no parameters to train")
    return model


def output_check(spec: ModelSpec, model: nn.Module, num_classes: int,
                 dataset: str) -> Callable[[torch.Tensor, int], None]:
    """``fit``'s check of the model's output at a step whose loss reads ``rows`` nodes:
    [rows, ``num_classes``] floating-point logits of the classes of ``dataset`` (its name,
    in the error) that depend on the parameters. Another width would train silently (more
    columns: a classifier over classes that do not exist) or fail in the loss (fewer), as
    would other rows, another kind of output or one without a gradient."""
    where = spec.path or spec.name

    def check(logits: torch.Tensor, rows: int) -> None:
        if not isinstance(logits, torch.Tensor):
            raise TrainError(f"{where}: the model's output is {_kind_of(logits)}, not a tensor "
                             f"of logits (one row per node, num_classes ({num_classes}) "
                             f"columns)")
        if not logits.is_floating_point():
            raise TrainError(f"{where}: the model's output is of dtype {logits.dtype}; logits "
                             f"are floating-point")
        if logits.dim() == 2 and logits.shape[1] == num_classes:
            if logits.shape[0] != rows:
                raise TrainError(f"{where}: the model's output has {logits.shape[0]} rows, but "
                                 f"the step's graph has {rows} nodes: one row of logits per "
                                 f"node, in the graph's order")
            if torch.is_grad_enabled() and not logits.requires_grad:
                raise TrainError(f"{where}: the model's output has no gradient (detached, or "
                                 f"computed without the model's parameters): nothing would "
                                 f"be trained")
            return
        got = (f"{logits.shape[1]} columns per node" if logits.dim() == 2
               else f"shape {list(logits.shape)}")
        fix = (f"{spec.path or spec.name} looks like a link-prediction model (it has "
               f"score(h_u, h_v) or the link task's HPARAMS): train it with --task link"
               if looks_like_link_model(spec, model) else
               f"build_model's output must have num_classes ({num_classes}) columns, one "
               f"logit per class")
        raise TrainError(f"{spec.path or spec.name}: the model's output has {got}, but "
                         f"dataset {dataset} has {num_classes} classes; {fix}")
    return check


def _kind_of(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def looks_like_link_model(spec: ModelSpec, model: nn.Module) -> bool:
    """A model file made for ``--task link``: its module scores edges (``score``) or its
    ``HPARAMS`` declare the link task's (``sarc.training.link.LINK_DEFAULTS``)."""
    from .training.link import LINK_DEFAULTS
    inner = model.model if isinstance(model, EmbeddingInput) else model
    return callable(getattr(inner, "score", None)) or any(k in spec.hparams for k in LINK_DEFAULTS)


def check_features(dataset: str, has_features: bool, hparams: dict[str, Any]) -> None:
    """A graph without node features trains only on a learned embedding: ``embedding_dim``
    set. A graph with them has no learned input: an embedding hyperparameter given for the
    run (``Hyperparameters.given``: ``--set embedding_dim``, ``--embedding-lr``,
    ``--embedding-optimizer``) is refused, not ignored; the model file's may serve its
    featureless datasets. ``dataset``: its name in the error (``sarc train --workers P``
    checks it before partitioning, ``build`` on every path)."""
    if not has_features and not hparams["embedding_dim"]:
        raise TrainError(f"dataset {dataset} has no node features; set embedding_dim "
                         f"(in HPARAMS, or --set embedding_dim=64) to learn a node "
                         f"embedding as the model's input")
    given = [k for k in EMBEDDING_HPARAMS if k in getattr(hparams, "given", ())]
    if has_features and given:
        shown = ", ".join(f"{k}={hparams[k]!r}" for k in given)
        raise TrainError(f"{shown}: dataset {dataset} has node features, which are the "
                         f"model's input; {'these set' if len(given) > 1 else 'it sets'} a "
                         f"featureless graph's learned node embedding, which this run has "
                         f"not: leave {'them' if len(given) > 1 else 'it'} out")



def _chosen(spec: ModelSpec, hparams: dict[str, Any]) -> str:
    """The model's hyperparameters that differ from the model file's (its own if none do);
    the trainer's (``DEFAULTS``) do not build the model."""
    ref = {**DEFAULTS, **spec.hparams}

    def same(k, v):
        try:
            return k in ref and bool(ref[k] == v)
        except Exception:  # a value without a plain ==
            return False
    changed = [f"{k}={v!r}" for k, v in hparams.items() if k not in DEFAULTS and not same(k, v)]
    return ", ".join(changed) if changed else f"the HPARAMS of {spec.path or spec.name}"


def _where_in(spec: ModelSpec, e: BaseException) -> str:
    """``, at FILE:LINE``: the innermost line of the model file in ``e``'s traceback."""
    if not spec.path:
        return ""
    path = os.path.abspath(spec.path)
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if os.path.abspath(f.filename) == path]
    return f", at {spec.path}:{frames[-1].lineno}" if frames else ""


class ModelSelection:
    """Which epoch's model to keep, and when to stop.

    Keeps the epoch of best validation accuracy (ties: the lower validation loss;
    every epoch when there is no validation set) and, as GAT's early stopping,
    counts epochs in which neither the validation accuracy nor the validation loss
    reached a new best.
    """

    def __init__(self, has_val: bool, patience: int | None):
        self.has_val, self.patience = has_val, patience
        self.best = {"epoch": 0, "val_acc": -1.0, "val_loss": float("inf"),
                     "test_acc": float("nan"), "train_acc": float("nan"), "state": None}
        self.max_val_acc, self.min_val_loss, self.stale = -1.0, float("inf"), 0

    def update(self, epoch: int, acc: dict[str, float], val_loss: float, model: nn.Module) -> bool:
        """Record an epoch; True when training should stop early."""
        best = self.best
        if (not self.has_val or acc["val"] > best["val_acc"]
                or (acc["val"] == best["val_acc"] and val_loss < best["val_loss"])):
            best.update(epoch=epoch, val_acc=acc["val"], val_loss=val_loss, test_acc=acc["test"],
                        train_acc=acc["train"], state=copy.deepcopy(model.state_dict()))
        if self.has_val and (acc["val"] > self.max_val_acc or val_loss < self.min_val_loss):
            self.max_val_acc = max(self.max_val_acc, acc["val"])
            self.min_val_loss = min(self.min_val_loss, val_loss)
            self.stale = 0
        else:
            self.stale += 1
        return bool(self.patience and self.has_val and self.stale >= self.patience)

    def state_dict(self) -> dict[str, Any]:
        """The selection so far as plain data (a checkpoint's)."""
        return {"best": dict(self.best), "max_val_acc": self.max_val_acc,
                "min_val_loss": self.min_val_loss, "stale": self.stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best.update(state["best"])  # in place: callers hold ``best``
        self.max_val_acc, self.min_val_loss = state["max_val_acc"], state["min_val_loss"]
        self.stale = state["stale"]

    def stop_message(self, epoch: int) -> str:
        return (f"early stop at epoch {epoch}: {plural(self.stale, 'epoch')} without a better "
                f"val acc or loss")

    def restore(self, model: nn.Module, epochs: int, seconds: float) -> str:
        """Load the selected epoch's weights into ``model``; returns the summary line."""
        best = self.best
        model.load_state_dict(best["state"])
        how = "best validation accuracy" if self.has_val else "last epoch, no validation set"
        return (f"selected epoch {best['epoch']} ({how}): val {score(best['val_acc'])} "
                f"test {score(best['test_acc'])} | {plural(epochs, 'epoch')} in {seconds:.1f} s")


def train(spec: ModelSpec, dataset: str | Dataset | None = None, *, epochs: int | None = None,
          seed: int = 0, hparams: dict[str, Any] | None = None, data_root: str | None = None,
          log: Callable[[str], None] | None = print, log_every: int = 1, eval_every: int = 1,
          checkpoint: CheckpointConfig | None = None, save: str | None = None,
          minibatch: MiniBatchConfig | None = None, device: torch.device | str = "cpu",
          backend: str | None = None) -> dict[str, Any]:
    """Train ``spec``'s model on ``dataset``; returns accuracies, epochs and timings.

    ``hparams`` override the model file's ``HPARAMS``, which override
    ``DEFAULTS``; ``epochs`` overrides all three (checked by ``hyperparameters``).
    A ``Dataset`` not built by ``Dataset.from_arrays`` or ``load_dataset`` is checked
    first (``check_dataset``). ``log=None`` is silent. ``checkpoint``: save the training
    state there and resume from it (``sarc.checkpoint``); ``save``: write the selected
    model to that path. ``minibatch``: train in mfg or sampling mode
    (``sarc.training.minibatch``), evaluating on the whole graph. ``device``: where the
    model and its inputs live; ``backend``: the kernels of all its sarc layers
    (``sarc.training.device``; None: each layer's own).
    """
    hp = hyperparameters(spec, hparams, epochs=epochs)
    data = (dataset if isinstance(dataset, Dataset) and dataset.checked
            else check_dataset(dataset) if isinstance(dataset, Dataset)
            else load_dataset(dataset or hp["dataset"], data_root))
    hp["dataset"] = data.name  # what it trains on (the model file's default or not): recorded
    say = log or (lambda s: None)

    seed_all(seed)
    model = build(spec, data, hp, seed=seed)
    prep = prepare(data, hp, model).to(device)
    model = placed(model, device, backend)
    backend = kernels(model)
    opt = optimizer(model, hp)
    counts = {k: int(m.sum()) for k, m in prep.masks.items()}
    if not counts["train"]:
        raise TrainError(f"dataset {data.recorded} has no labeled training nodes")
    say(f"sarc train: {spec.name} on {data.name} ({data.num_nodes} nodes, {prep.graph.num_edges} "
        f"edges{', self loops added' if hp['self_loops'] else ''}), seed {seed}, "
        f"{sum(p.numel() for p in model.parameters())} parameters, on {prep.x.device} "
        f"({backend} kernels)")

    selection = ModelSelection(counts["val"] > 0, hp["patience"])
    run = None
    if checkpoint is not None or save:
        recorded = minibatch.recorded(hp) if minibatch else hp
        run = run_record(spec, recorded, seed=seed, dataset=data.recorded,
                         graph=graph_fingerprint(data.edge_src, data.edge_dst, data.num_nodes),
                         node_data=dataset_digests(data), eval_every=eval_every)
    full = Batch(prep.graph, prep.x, prep.edge_inputs, prep.label, prep.masks,
                 train_total=counts["train"])
    source, line = FullBatch(full, counts), epoch_line
    if minibatch is not None:
        source = minibatch_source(data, prep, hp, model, minibatch, seed, full, counts)
        say(f"{minibatch.mode} mode: {plural(source.seeds.steps, 'step')} per epoch, fanouts "
            f"{', '.join(map(str, source.spec.fanouts))}")
        line = source.epoch_line
    out = fit(model, opt, source, selection, epochs=int(hp["epochs"]), checkpoint=checkpoint,
              run=run, log=log, log_every=log_every, eval_every=eval_every, line=line,
              check_output=output_check(spec, model, data.num_classes, data.name))
    if save:
        sizes = {"in_feats": data.num_features, "num_classes": data.num_classes,
                 "num_nodes": data.num_nodes, "num_etypes": data.num_etypes,
                 "num_ntypes": data.num_ntypes}
        save_selected(save, selection, run=run, hparams=hp, sizes=sizes)
    best = selection.best
    return {
        "model": spec.name, "dataset": data.recorded, "workers": 1,   # as workers record it
        **MiniBatchConfig.report(minibatch), "seed": seed,
        "device": str(prep.x.device), "backend": backend,
        "epochs": out.epochs, "best_epoch": best["epoch"],
        "train_acc": best["train_acc"], "val_acc": best["val_acc"], "test_acc": best["test_acc"],
        "final_test_acc": out.acc["test"], "final_loss": out.loss,
        "time_s": out.elapsed_s, "epoch_ms": out.elapsed_s / out.epochs * 1e3, **timings(out),
        "hparams": {k: v for k, v in hp.items()},
        "module": model,
    }


NODE_INPUTS = ("ntype",)
"""The node data the trainer hands a model that reads it (``sarc.dsl.edge_inputs_for``:
``sarc.HeteroConv``'s and ``sarc.TypedInput``'s node types); in a mini-batch step, the
input rows'."""


def minibatch_inputs(edge_inputs) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of ``edge_inputs`` (what the trainer hands the model) that are edge data
    and node data, which a mini-batch step takes of its blocks' edges and input rows."""
    return (tuple(k for k in edge_inputs if k not in NODE_INPUTS),
            tuple(k for k in edge_inputs if k in NODE_INPUTS))


def minibatch_source(data: Dataset, prep: Prepared, hp: dict[str, Any], model: nn.Module,
                     config: MiniBatchConfig, seed: int, full: Batch,
                     counts: dict[str, int]) -> MiniBatchSteps:
    """``config``'s steps on one process: the graph as one part, sampled on the CPU, each
    layer on its block's ``Graph`` on the inputs' device; evaluated on the whole graph
    (``full``)."""
    edge_names, node_names = minibatch_inputs(prep.edge_inputs)
    # the dataset's own edge data (prep's holds the self loops it added), and the weights
    # of the draws, which the model may not read
    carried = config.carried(data.edge_data,
                             [k for k in prep.edge_inputs if k in data.edge_data])
    on_cpu = {k: v.cpu() for k, v in carried.items()}  # sampled on the CPU
    shard = whole_graph_shard(data.edge_src, data.edge_dst, data.num_nodes, on_cpu,
                              self_loops=hp["self_loops"],
                              node_data={k: prep.edge_inputs[k].cpu() for k in node_names})
    return MiniBatchSteps(shard, config, layers=graph_layers(model), seed=seed, comm=Comm(),
                          rows=ShardRows(prep.x, prep.label, prep.masks["train"]),
                          evaluation=full, counts=counts,
                          graphs_of=lambda blocks: local_blocks(blocks, prep.x.device),
                          edge_names=edge_names, node_names=node_names)  # what the model is given


def script_main(namespace: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """``python models/gcn.py --dataset cora``: train the calling model file.

    A model file ends with ``if __name__ == "__main__": script_main(globals())``.
    """
    path = namespace.get("__file__")
    spec = ModelSpec.from_namespace(Path(path).stem if path else "model", namespace, path)
    p = argparse.ArgumentParser(description=f"Train {spec.name} (sarc, single process).")
    p.add_argument("--dataset", default=None, help="dataset name or .npz path "
                   f"(default: {spec.hparams.get('dataset', DEFAULTS['dataset'])})")
    p.add_argument("--data-dir", default=None, help="directory with more datasets")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=1)
    args = p.parse_args(argv)
    return train(spec, args.dataset, epochs=args.epochs, seed=args.seed,
                 data_root=args.data_dir, log_every=args.log_every)
