"""Link prediction, DistDGL's edge-level task, on one process and on P workers.

    split = split_edges(src, dst, N, seed=0)        # train / val / test pairs, once
    source = LinkSteps(...)                          # the loop's step source
    fit(model, opt, source, LinkSelection(...), epochs=..., reduction=...)

**The split.** The graph's edges are undirected pairs {u, v} (self loops dropped);
a seeded shuffle puts 85 / 5 / 10 % of them in train / val / test, so both
directions of an edge land in the same split. The message-passing graph is both
directions of the training pairs (``LinkSplit.message_edges``); the val and test
pairs are not in it. The split holds original node ids, ``u < v``; a pair's id is
its position in its split, the key of its negatives' draws. With ``--workers P``
the message graph is what is partitioned, and the split is stored beside the parts
(``sarc.distributed.link``); each worker holds all of it and maps ids to its rows.

**A step** (full-batch, one per epoch): the model's forward on the graph gives
every node's embedding (on P workers, each worker its own rows); the embeddings of
the endpoints of the worker's positive training pairs (those whose ``v`` it owns)
and of their ``negatives_per_edge`` negatives (``sarc.sampling.negative``, drawn
by key, the same on any P) are fetched by global id (``rows``: indexing on one
process, a pull from the owners whose backward sends the rows' gradients back on
P workers), scored by the model's ``score(h_u, h_v)``, and the binary
cross-entropy with logits over positives (1) and negatives (0) is summed and
divided by the global count, so that the gradients summed over the workers are
the one-process gradient of the mean.

**Evaluation**: each val / test pair against ``eval_negatives`` negatives of its
own (fixed by the seed): the pair's rank among them (ties count half, as OGB's
``Evaluator``), MRR and Hits@K for K in ``HITS_AT``, summed over the workers. The
model is selected on validation MRR (``LinkSelection``).

``fit`` (``sarc.training.loop``) runs the epochs, checkpoints and epoch lines: a
``LinkSteps`` brings its own ``train_step`` and ``evaluate``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..records import Record, load_plain
from ..sampling.negative import NEGATIVE_SAMPLERS, eval_negatives, train_negatives
from .inputs import EmbeddingInput, TrainError, missing_edge_args, optimizer
from .loop import epoch_line, timings
from .loop import Batch, Reduction, forward
from .progress import plural

HITS_AT = (10, 50, 100)
"""The K of the Hits@K evaluation reports."""

SPLIT_FRACTIONS = {"val": 0.05, "test": 0.10}
"""The shares of the edges held out; the rest trains."""

EVAL_SPLITS = ("val", "test")

LINK_DEFAULTS: dict[str, Any] = {
    "negatives": "uniform",      # the negatives' distribution: uniform | degree
    "negatives_per_edge": 1,     # training negatives per positive pair and epoch
    "eval_negatives": 1000,      # negatives per val / test pair
}
"""The link task's hyperparameters; a link model file's ``HPARAMS`` declare them."""


_SPLIT_SCHEMA = {"num_nodes": "count", "train": "tensor", "val": "tensor", "test": "tensor"}
"""What a link split's file holds (``LinkSplit.to_dict``), checked when it is read back."""


@dataclass(frozen=True, eq=False)
class LinkSplit:
    """Undirected pairs ``[2, E]`` (original ids, ``u < v``) of each split."""

    num_nodes: int
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor

    def pairs(self, split: str) -> torch.Tensor:
        return getattr(self, split)

    def message_edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The message-passing graph: both directions of every training pair."""
        u, v = self.train
        return torch.cat([u, v]), torch.cat([v, u])

    def degree(self) -> torch.Tensor:
        """Each node's degree in the message-passing graph."""
        return torch.bincount(self.train.reshape(-1), minlength=self.num_nodes)

    def to_dict(self) -> dict:
        return {"num_nodes": self.num_nodes, "train": self.train, "val": self.val,
                "test": self.test}

    def save(self, path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.to_dict(), tmp)
        tmp.replace(path)

    @staticmethod
    def load(path) -> "LinkSplit":
        d = load_plain(path, f"{path}: not a link split sarc wrote", TrainError)
        Record(f"{path}: corrupt link split", TrainError).check_fields(d, _SPLIT_SCHEMA)
        for k in ("train", "val", "test"):
            if d[k].dim() != 2 or d[k].shape[0] != 2 or d[k].dtype != torch.int64:
                raise TrainError(f"{path}: corrupt link split: {k} must be a [2, n] int64 tensor "
                                 f"of node pairs, got {d[k].dtype} {list(d[k].shape)}")
        return LinkSplit(int(d["num_nodes"]), d["train"], d["val"], d["test"])


def split_edges(src, dst, num_nodes: int, *, seed: int = 0,
                fractions: dict[str, float] = SPLIT_FRACTIONS) -> LinkSplit:
    """The graph's undirected pairs, shuffled by ``seed`` and cut into train / val / test
    (each split's pairs sorted)."""
    src, dst = torch.as_tensor(src, dtype=torch.int64), torch.as_tensor(dst, dtype=torch.int64)
    keep = src != dst
    lo, hi = torch.minimum(src, dst)[keep], torch.maximum(src, dst)[keep]
    pairs = torch.unique(lo * num_nodes + hi)  # sorted: the shuffle alone decides the split
    n = pairs.numel()
    n_val, n_test = round(fractions["val"] * n), round(fractions["test"] * n)
    if n - n_val - n_test < 1 or n_val < 1 or n_test < 1:
        raise TrainError(f"the graph has {n} undirected edges: too few to split into train, "
                         f"val and test edges for link prediction")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    cuts = {"val": order[:n_val], "test": order[n_val:n_val + n_test],
            "train": order[n_val + n_test:]}

    def as_pairs(idx):
        p = pairs[idx].sort().values
        return torch.stack([p // num_nodes, p % num_nodes])
    return LinkSplit(num_nodes, as_pairs(cuts["train"]), as_pairs(cuts["val"]),
                     as_pairs(cuts["test"]))


def check_link_hparams(hp: dict[str, Any], num_nodes: int | None = None) -> None:
    """The link task's hyperparameters in range (for a graph of ``num_nodes`` nodes, where
    given)."""
    if hp["negatives"] not in NEGATIVE_SAMPLERS:
        raise TrainError(f"hyperparameter negatives={hp['negatives']!r}: it must be one of "
                         f"{', '.join(NEGATIVE_SAMPLERS)}")
    for key in ("negatives_per_edge", "eval_negatives"):
        v = hp[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise TrainError(f"hyperparameter {key}={v!r}: it must be an integer >= 1")
    if num_nodes is not None and hp["eval_negatives"] > num_nodes:
        raise TrainError(f"hyperparameter eval_negatives={hp['eval_negatives']} is more than "
                         f"the graph's {num_nodes} nodes; Hits@K and MRR rank each held-out "
                         f"edge among at most as many negatives as there are nodes")


def scorer_of(model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The model's ``score(h_u, h_v)``: an edge's logit from its endpoints' embeddings."""
    inner = model.model if isinstance(model, EmbeddingInput) else model
    score = getattr(inner, "score", None)
    if not callable(score):
        raise TrainError(f"the model ({type(inner).__name__}) has no score(h_u, h_v) method: "
                         f"link prediction scores an edge from its endpoints' embeddings "
                         f"(see models/sage_lp.py)")
    return score


def check_link_model(model: nn.Module) -> None:
    """The model has a ``score`` and its forward needs nothing but the graph and the node
    features: link prediction passes it no node types or edge data (its edge split
    carries none), so a forward that needs them is refused naming them, not as a dataset
    without them."""
    from ..dsl import input_taker
    scorer_of(model)
    needed, _, _ = missing_edge_args(model, {})
    if needed:
        raise TrainError(f"the model ({type(input_taker(model)).__name__})'s forward needs "
                         f"{', '.join(map(repr, needed))}, which link prediction does not pass: "
                         f"it trains on the graph and the node features alone (its edge split "
                         f"carries no node types or edge data); give the forward a default "
                         f"({needed[0]}=None) and call its layers without it then")


def ranks(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """The rank of each positive score ``pos`` [E] among its negatives ``neg`` [E, K]:
    1 + the negatives above it + half those equal to it."""
    above = (neg > pos.unsqueeze(1)).sum(1).to(torch.float64)
    ties = (neg == pos.unsqueeze(1)).sum(1).to(torch.float64)
    return 1.0 + above + 0.5 * ties


def rank_sums(r: torch.Tensor, hits_at: Iterable[int] = HITS_AT) -> list[float]:
    """[sum of 1 / rank, then per K the positives ranked at most K] of ranks ``r``."""
    return [float((1.0 / r).sum())] + [float((r <= k).sum()) for k in hits_at]


@dataclass(frozen=True)
class LinkStep:
    """An epoch's one full-batch step."""

    epoch: int


class LinkSteps:
    """Full-batch link prediction as the loop's step source, on one process or one worker.

    ``batch``: the model's forward on the message graph (its ``label`` and ``masks`` are
    unused). ``split``: all pairs, original ids; ``row_of``: each original id's global
    row (identity on one process); ``mine``: the worker's pair ids per split; ``rows``:
    ``rows(h, global_ids)`` with the gradient (collective on P workers); ``sampler``:
    the negatives' distribution.
    """

    def __init__(self, batch: Batch, split: LinkSplit, *, row_of: torch.Tensor,
                 mine: dict[str, torch.Tensor], rows: Callable, sampler, hparams: dict,
                 seed: int):
        self.batch, self.split, self.row_of, self.mine = batch, split, row_of, mine
        self.rows, self.sampler, self.seed = rows, sampler, seed
        self.k_train, self.k_eval = int(hparams["negatives_per_edge"]), int(hparams["eval_negatives"])
        self.train_total = split.train.shape[1] * (1 + self.k_train)
        self.counts = {s: int(split.pairs(s).shape[1]) for s in ("train", *EVAL_SPLITS)}

    def steps(self, epoch: int) -> Iterable[LinkStep]:
        return (LinkStep(epoch),)

    def evaluation(self) -> Iterable[Batch]:
        return (self.batch,)

    def _endpoint_rows(self, h, split: str, negatives: torch.Tensor):
        """(h_u, h_v, h_w): the worker's pairs' endpoint rows and those of their
        negatives ``[E, k]`` (one exchange)."""
        u, v = self.split.pairs(split)[:, self.mine[split]]
        ids = self.row_of[torch.cat([u, v, negatives.reshape(-1)])]
        got = self.rows(h, ids)
        e = u.numel()
        return got[:e], got[e:2 * e], got[2 * e:]

    def train_step(self, model: nn.Module, opt: torch.optim.Optimizer, step: LinkStep,
                   reduction: Reduction) -> float:
        """One optimizer step; the loss over all workers."""
        opt.zero_grad()
        loss = self.loss(model, step.epoch)
        loss.backward()
        reduction.gradients(model)
        opt.step()
        return float(reduction.sum(loss.detach().reshape(1)))

    def loss(self, model: nn.Module, epoch: int) -> torch.Tensor:
        """This worker's share of the mean binary cross-entropy of ``epoch``'s step."""
        score, k = scorer_of(model), self.k_train
        neg_nodes = train_negatives(self.sampler, self.mine["train"], k, seed=self.seed,
                                    epoch=epoch)
        h_u, h_v, h_w = self._endpoint_rows(forward(model, self.batch), "train", neg_nodes)
        pos = score(h_u, h_v)
        neg = score(h_u.repeat_interleave(k, 0), h_w)
        total = (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos), reduction="sum")
                 + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg),
                                                      reduction="sum"))
        return total / self.train_total

    def evaluate(self, model: nn.Module, reduction: Reduction) -> tuple[dict[str, float], float]:
        """MRR and Hits@K of the val and test pairs over all workers (``"val"`` / ``"test"``:
        the MRRs, as the model selection reads them); the second value is minus the
        validation MRR, the selection's tie-break."""
        score, k = scorer_of(model), self.k_eval
        h = forward(model, self.batch)
        sums = []
        for i, split in enumerate(EVAL_SPLITS):
            neg_nodes = eval_negatives(self.sampler, self.mine[split], k, seed=self.seed,
                                       split=i)
            h_u, h_v, h_w = self._endpoint_rows(h, split, neg_nodes)
            pos = score(h_u, h_v)
            neg = score(h_u.repeat_interleave(k, 0), h_w).reshape(-1, k)
            sums += rank_sums(ranks(pos, neg))
        total = reduction.sum(torch.tensor(sums, dtype=torch.float64).to(reduction.dtype)).cpu()
        out: dict[str, float] = {"train": math.nan}
        width = 1 + len(HITS_AT)
        for i, split in enumerate(EVAL_SPLITS):
            n = self.counts[split]
            part = [float(t) / n if n else math.nan for t in total[i * width:(i + 1) * width]]
            out[split] = out[f"{split}_mrr"] = part[0]
            # with k negatives a pair ranks at most k + 1: Hits@K for K > k says nothing
            out.update({f"{split}_hits@{kk}": part[1 + j] if kk <= k else math.nan
                        for j, kk in enumerate(HITS_AT)})
        return out, -out["val"]


def link_line(epoch: int, loss: float, acc: dict[str, float], seconds: float, *,
              of: int | None = None) -> str:
    """The progress line of a link-prediction epoch (``acc`` None: not evaluated)."""
    if acc is None:
        return epoch_line(epoch, loss, None, seconds, of=of)
    return (f"epoch {epoch:4d}{'' if of is None else f'/{of}'} | loss {loss:.4f} | "
            f"val mrr {acc['val_mrr']:.4f} | test mrr {acc['test_mrr']:.4f}{hits_text(acc)} | "
            f"{seconds * 1e3:.0f} ms")


def hits_text(metrics: dict[str, float]) -> str:
    """`` hits@K x`` for each test Hits@K measured (one past the negatives is NaN)."""
    return "".join(f" hits@{k} {metrics[f'test_hits@{k}']:.4f}" for k in HITS_AT
                   if not math.isnan(metrics[f"test_hits@{k}"]))


def metric_keys() -> list[str]:
    """The metrics a link run reports, per evaluation split."""
    return [f"{s}_{m}" for s in EVAL_SPLITS for m in ("mrr", *(f"hits@{k}" for k in HITS_AT))]


def link_selection(patience: int | None):
    """The model selection of link prediction: ``sarc.train.ModelSelection`` on validation
    MRR, keeping the selected epoch's MRR and Hits@K (``best["metrics"]``)."""
    from ..train import ModelSelection

    class LinkSelection(ModelSelection):
        def update(self, epoch, acc, val_loss, model):
            stop = super().update(epoch, acc, val_loss, model)
            if self.best["epoch"] == epoch:
                self.best["metrics"] = {k: acc[k] for k in metric_keys()}
            return stop

        def stop_message(self, epoch: int) -> str:
            return (f"early stop at epoch {epoch}: {plural(self.stale, 'epoch')} without a "
                    f"better val mrr")

        def restore(self, model, epochs: int, seconds: float) -> str:
            model.load_state_dict(self.best["state"])
            m = self.best["metrics"]
            return (f"selected epoch {self.best['epoch']} (best validation MRR): val mrr "
                    f"{m['val_mrr']:.4f} test mrr {m['test_mrr']:.4f}{hits_text(m)} | "
                    f"{plural(epochs, 'epoch')} in {seconds:.1f} s")

    return LinkSelection(True, patience)


def link_result(selection, out, **facts) -> dict[str, Any]:
    """A link run's result: the selected epoch's metrics and the run's facts."""
    best = selection.best
    return {**facts, "task": "link", "epochs": out.epochs, "best_epoch": best["epoch"],
            **best["metrics"], "final_loss": out.loss, "time_s": out.elapsed_s,
            "epoch_ms": out.elapsed_s / max(1, out.epochs) * 1e3, **timings(out)}


def train_links(spec, data, *, epochs: int | None = None, seed: int = 0,
                hparams: dict[str, Any] | None = None, log: Callable[[str], None] | None = print,
                log_every: int = 1, eval_every: int = 1, device: torch.device | str = "cpu",
                backend: str | None = None) -> dict[str, Any]:
    """Train ``spec``'s link model on ``data`` (a checked ``Dataset``) on one process, on
    ``device`` with ``backend``'s kernels (``sarc.training.device``); returns the selected
    epoch's val / test MRR and Hits@K."""
    from ..checkpoint import seed_all
    from ..datasets import add_self_loops
    from ..graph import Graph
    from ..sampling.negative import negative_sampler
    from ..train import build, hyperparameters
    from .device import placed
    from .inputs import node_features
    from .loop import fit

    hp = hyperparameters(spec, hparams, epochs=epochs)
    check_link_hparams(hp, data.num_nodes)
    if data.etype is not None:
        raise TrainError(f"link prediction on the relational graph {data.name} is not supported "
                         f"(its edge types would not follow the split)")
    split = split_edges(data.edge_src, data.edge_dst, data.num_nodes, seed=seed)
    src, dst = split.message_edges()
    if hp["self_loops"]:
        src, dst = add_self_loops(src, dst, data.num_nodes)
    g = Graph.from_edges(src, dst, data.num_nodes).to(device)
    seed_all(seed)
    model = placed(build(spec, data, hp, seed=seed), device, backend)
    check_link_model(model)
    opt = optimizer(model, hp)
    say = log or (lambda s: None)
    say(f"sarc train: {spec.name}, link prediction on {data.name} ({data.num_nodes} nodes; "
        f"{split.train.shape[1]} / {split.val.shape[1]} / {split.test.shape[1]} train / val / "
        f"test edges), {hp['negatives']} negatives, seed {seed}, "
        f"{sum(p.numel() for p in model.parameters())} parameters")
    empty = torch.zeros(0, dtype=torch.int64)
    batch = Batch(g, node_features(data.feat, hp).to(device), {}, empty, {}, train_total=0)
    mine = {s: torch.arange(split.pairs(s).shape[1]) for s in ("train", *EVAL_SPLITS)}
    source = LinkSteps(batch, split, row_of=torch.arange(data.num_nodes), mine=mine,
                       rows=lambda h, ids: h.index_select(0, ids.to(h.device)),
                       sampler=negative_sampler(hp["negatives"], data.num_nodes, split.degree()),
                       hparams=hp, seed=seed)
    selection = link_selection(hp["patience"])
    out = fit(model, opt, source, selection, epochs=int(hp["epochs"]), log=log,
              log_every=log_every, eval_every=eval_every, line=link_line)
    return {**link_result(selection, out, model=spec.name, dataset=data.recorded, seed=seed,
                          negatives=hp["negatives"], workers=1),
            "module": model}

