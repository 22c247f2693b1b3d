"""A model's inputs as the trainer's hyperparameters ask, for a whole graph
(``sarc.train.prepare``) and for a worker's shard (``sarc.distributed.prepare``) alike:

- ``self_loops``: refused on a graph with edge data (``check_self_loops``); the edges
  themselves get theirs from ``sarc.datasets.add_self_loops``;
- ``norm_features``: each node's features divided by their sum (``node_features``);
- the labeled train / val / test masks (``labeled_masks``);
- ``embedding_dim``: a learned input for featureless graphs (``EmbeddingInput``), its rows
  drawn by node id (``initial_embedding``) and trained by a sparse optimizer
  (``embedding_optimizer``, ``embedding_lr``) beside the dense parameters' Adam
  (``optimizer``): on one process an ``nn.Embedding(sparse=True)`` with torch's
  ``SparseAdam`` / ``Adagrad``, on P workers ``sarc.distributed.Embedding`` sharded with
  the partition, whose optimizers are those, exactly.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
from torch import nn

from ..errors import SarcError
from ..sampling.draws import EMBEDDING_INIT, uniform_rows
from .optim import EagerAdam

SPLITS = ("train", "val", "test")

EMBEDDING_OPTIMIZERS = ("sparse_adam", "sparse_adagrad")
"""``embedding_optimizer``: torch's ``SparseAdam``, or ``Adagrad`` on sparse gradients."""

EMBEDDING_SCALE = 1.0
"""A learned input's initial values are uniform in (-EMBEDDING_SCALE, EMBEDDING_SCALE)."""


class TrainError(SarcError):
    """The dataset and the model's hyperparameters do not fit together."""


def check_self_loops(edge_data: Iterable[str], graph: str) -> None:
    """Refuse ``self_loops=True`` on ``graph`` if its edges carry data (``edge_data``: its
    names): a self loop would have no edge type or weight."""
    names = sorted(set(edge_data))
    if names:
        raise TrainError(f"self_loops=True on {graph}, whose edges carry {', '.join(names)}: a "
                         f"self loop has no edge type or weight; model the self connection in "
                         f"the layer (R-GCN's root weight) instead")


def node_features(feat: torch.Tensor, hparams: dict[str, Any]) -> torch.Tensor:
    """The nodes' input rows: ``feat`` as a float32 matrix, each row divided by its sum
    when ``norm_features`` asks (a graph without features has ``[N, 0]``). That is for
    non-negative features (word counts, as Cora's): a row of mixed signs can sum to about
    0, and dividing by it would blow the row up, so negative features are refused."""
    x = feat if feat.dim() == 2 else feat.reshape(feat.shape[0], -1)
    x = x.to(torch.float32)
    if hparams["norm_features"] and x.shape[1] > 0:
        check_normalizable(x)
        x = x / x.sum(1, keepdim=True).clamp_min(1e-12)
    return x


def check_normalizable(feat: torch.Tensor) -> None:
    """Refuse negative features, which ``norm_features`` cannot divide by their sum."""
    if feat.numel() and bool((feat < 0).any()):
        raise TrainError(f"norm_features divides each node's features by their sum, which "
                         f"is for non-negative features (counts), and these have negative "
                         f"values (as low as {float(feat.min()):.4g}); set norm_features=False "
                         f"(--set norm_features=False, or in HPARAMS)")


def labeled_masks(label: torch.Tensor, train: torch.Tensor, val: torch.Tensor,
                  test: torch.Tensor) -> dict[str, torch.Tensor]:
    """The train / val / test masks, of labeled nodes only (a label < 0 is none)."""
    labeled = label >= 0
    return {k: m.to(torch.bool) & labeled for k, m in zip(SPLITS, (train, val, test))}


def labeled_training_nodes(data) -> int:
    """The dataset ``data``'s labeled training nodes: a mini-batch epoch's seeds."""
    masks = labeled_masks(data.label, data.train_mask, data.val_mask, data.test_mask)
    return int(masks["train"].sum())


def initial_embedding(keys: torch.Tensor, dim: int, seed: int, scale: float,
                      dtype: torch.dtype = torch.float32, chunk: int = 1 << 14) -> torch.Tensor:
    """[len(keys), dim] initial rows, uniform in (-scale, scale): row i a pure function of
    (seed, keys[i]), so a worker draws its nodes' rows as one process draws the whole table
    (``keys``: the nodes' original ids). Drawn ``chunk`` rows at a time."""
    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
    out = torch.empty(keys.numel(), dim, dtype=dtype)
    for a in range(0, keys.numel(), chunk):
        u = uniform_rows(keys[a:a + chunk], dim, seed, EMBEDDING_INIT)
        out[a:a + chunk] = u.mul_(2.0).sub_(1.0).mul_(scale)
    return out


class EmbeddingInput(nn.Module):
    """A learned ``[num_nodes, dim]`` input for graphs without node features.

    ``table``: the rows (default: an ``nn.Embedding(sparse=True)`` drawn by
    ``initial_embedding`` from ``seed``); a worker passes its shard of the table
    (``sarc.distributed.Embedding``), looked up by global row ids. Its gradient is sparse:
    the rows a step reads. ``optimizer`` steps it with the sparse optimizer the
    hyperparameters name."""

    sarc_passes_inputs_to = "model"
    """Its ``forward`` hands the edge inputs on to ``self.model``, whose ``forward`` says
    which it takes (``sarc.dsl.edge_inputs_for``)."""

    def __init__(self, model: nn.Module, num_nodes: int, dim: int, table: nn.Module | None = None,
                 seed: int = 0):
        super().__init__()
        if table is None:
            table = nn.Embedding.from_pretrained(
                initial_embedding(torch.arange(num_nodes), dim, seed, EMBEDDING_SCALE),
                freeze=False, sparse=True)
        self.embedding = table
        self.model = model
        self.num_nodes = num_nodes

    def forward(self, g, x, **edge_inputs):
        return self.on_rows(g, torch.arange(self.num_nodes, device=x.device), **edge_inputs)

    def on_rows(self, g, node_ids: torch.Tensor, **edge_inputs):
        """The model on the embedding's rows of ``node_ids`` (global row ids: a shard's
        nodes, a step's input nodes)."""
        return self.model(g, self.embedding(node_ids), **edge_inputs)


class Optimizers:
    """The dense parameters' optimizer and an embedding's sparse one, stepped as one (the
    loop's ``opt``); their states side by side in ``state_dict``."""

    def __init__(self, dense: torch.optim.Optimizer | None, embedding):
        self.dense, self.embedding = dense, embedding

    def _each(self):
        return [o for o in (self.dense, self.embedding) if o is not None]

    def zero_grad(self) -> None:
        for o in self._each():
            o.zero_grad()

    def step(self) -> None:
        for o in self._each():
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {"dense": None if self.dense is None else self.dense.state_dict(),
                "embedding": self.embedding.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dense is not None:
            self.dense.load_state_dict(state["dense"])
        self.embedding.load_state_dict(state["embedding"])


def embedding_optimizer(table: nn.Module, name: str, lr: float):
    """The sparse optimizer ``name`` (``EMBEDDING_OPTIMIZERS``) of an embedding table: torch's
    for an ``nn.Embedding``, the sharded table's own (``sparse_optimizer``) otherwise."""
    if name not in EMBEDDING_OPTIMIZERS:
        raise TrainError(f"hyperparameter embedding_optimizer={name!r}: it must be one of "
                         f"{', '.join(EMBEDDING_OPTIMIZERS)}")
    if isinstance(table, nn.Embedding):
        kind = torch.optim.SparseAdam if name == "sparse_adam" else _SparseAdagrad
        return kind(table.parameters(), lr=lr)
    return table.sparse_optimizer(name, lr)


class _SparseAdagrad(torch.optim.Adagrad):
    """torch's Adagrad on an embedding's sparse gradients, torch's invariant checks of the
    sparse tensors it makes explicitly off, as they are by default (left implicit, torch
    warns at every step)."""

    def step(self, closure=None):
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            return super().step(closure)


def optimizer(model: nn.Module, hparams: dict[str, Any]):
    """The run's optimizer: Adam (``lr``, ``weight_decay``) on the dense parameters and, for
    an embedding input, ``embedding_optimizer`` (learning rate ``embedding_lr``, else
    ``lr``; no weight decay) on its rows, updating only the rows a step read."""
    def adam(params):
        return EagerAdam(params, lr=hparams["lr"], weight_decay=hparams["weight_decay"])
    if not isinstance(model, EmbeddingInput):
        return adam(model.parameters())
    table = {id(p) for p in model.embedding.parameters()}
    dense = [p for p in model.parameters() if id(p) not in table]
    lr = hparams.get("embedding_lr") or hparams["lr"]
    return Optimizers(adam(dense) if dense else None,
                      embedding_optimizer(model.embedding,
                                          hparams.get("embedding_optimizer", "sparse_adam"), lr))


def check_call(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """A ``TrainError`` where ``model(*args, **kwargs)`` does not fit the forward that takes
    the inputs (``dsl.input_taker``: the user's model inside a learned input); a TypeError
    raised inside a forward that does fit is the model's own. Training and ``sarc compile``
    run the model alike, and say the same."""
    from ..dsl import input_taker
    model = input_taker(model)
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        absent, undeclared, declared = missing_edge_args(model, kwargs)
        if absent:   # declared, so the trainer would pass it: the dataset has none of it
            raise TrainError(f"the model ({type(model).__name__})'s forward needs the edge data "
                             f"{', '.join(map(repr, absent))}, which its sarc layers read, but "
                             f"the dataset has no edge data of that name: train on a dataset "
                             f"that has it, or give the forward a default ({absent[0]}=None) "
                             f"and call its layers without it then") from None
        edge = "".join(f", {k}=..." for k in kwargs)
        why = ""
        if undeclared:   # the trainer passes only declared edge data (``edge_inputs_for``)
            why = (f"; no sarc layer of the model declares an edge feature "
                   f"{', '.join(map(repr, undeclared))} (declared: "
                   f"{', '.join(sorted(declared)) or 'none'}), and the trainer passes only "
                   f"declared edge data: declare it under that name "
                   f"(edge={{{undeclared[0]!r}: ...}}) or name it in the model's sarc_inputs")
        raise TrainError(f"the model ({type(model).__name__}) cannot be called as "
                         f"model(graph, x{edge}): {e}; build_model must return a module whose "
                         f"forward takes the graph, the node features and the edge data its "
                         f"sarc layers read by name{why}") from None


def missing_edge_args(model: nn.Module, kwargs: dict) -> tuple[list[str], list[str], set[str]]:
    """The arguments of ``forward`` after (graph, x) that have no default and are not given,
    split by whether a sarc layer declares them: (declared ones, which the trainer would have
    passed had the dataset held them; the others, which the trainer never passes: a layer that
    names its feature otherwise, ``edge={"w": ()}`` called ``w=edge_weight``, leaves the
    dataset's array behind; every declared name). None of either for library convs, which
    declare their edge data at their first call."""
    from ..dsl import declared_edge_inputs, input_taker, routes_library_convs
    if routes_library_convs(model):
        return [], [], set()
    declared = set(declared_edge_inputs(model))
    params = list(inspect.signature(input_taker(model).forward).parameters.values())[2:]
    missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return ([n for n in missing if n in declared], [n for n in missing if n not in declared],
            declared)


def model_code_error(e: Exception, during: str) -> TrainError | None:
    """``e``, raised by the model file's own code (plain torch between its layers), as a
    TrainError at the user's line (``trace_guards.raised_at``); None where it was not
    raised there (sarc's or torch's code below the user's: a bug, with its traceback)."""
    from ..names import one_line
    from ..trace_guards import raised_at
    where = raised_at(e)
    if where is None:
        return None
    return TrainError(f"{where}: {type(e).__name__}: {one_line(e) or '-'} ({during})")
