"""The training loop of ``sarc train``, one for one process and for P workers.

    outcome = fit(model, opt, source, selection, epochs=200)                 # one process
    outcome = fit(model, opt, source, selection, epochs=200, reduction=...)  # a worker of P

An epoch is the steps of a step source (``StepSource.steps``). A step is a forward pass
on its ``Batch``, the loss over the worker's labeled training nodes of the batch,
backward, the gradients reduced over the workers (``Reduction.gradients``) and an
optimizer step. Evaluation runs the source's evaluation batches in eval mode and
reduces the counts of correct predictions and the validation loss the same way
(``Reduction.sum``); the model selection (``sarc.train.ModelSelection``) keeps the best
epoch and decides on early stopping. Checkpoints and resuming go through
``sarc.checkpoint.Checkpointer``, the per-epoch lines through ``log`` (rank 0's).

One process is the case P = 1 of this code, not a copy of it: its reduction
(``ONE_PROCESS``) leaves the gradients as they are and sums over one worker;
``sarc.distributed.train`` passes the all-reduce over its group. A step on P workers
is the single-process step because each worker's loss is the sum of its nodes'
cross-entropies divided by the step's training nodes over all workers
(``Batch.train_total``): the gradients summed over the workers are those of the mean.

Training modes are step sources. Full-batch training (``FullBatch``) is one step per
epoch on the whole graph or on the worker's shard. A mini-batch mode (MFGs, neighbour
sampling) is a source whose ``steps`` yields one ``Batch`` per seed batch of its data
loader (``graph``: the step's blocks; ``x``: the rows of their input nodes and
``node_ids`` those nodes' ids, for an embedding input; ``label`` and ``masks``: the
seeds'; ``train_total``: the step's seeds over all workers), and whose ``evaluation``
batches cover each labeled node once, so that their counts add up to
``StepSource.counts``. The loop does not change.

A task other than node classification brings its own step and evaluation: a source
with ``train_step(model, opt, batch, reduction)`` and ``evaluate(model, reduction)``
(as ``train_step`` and ``evaluate`` here) is stepped and scored by them
(``sarc.training.link``).
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import (CheckpointConfig, Checkpointer, Progress, injected_fault, save_model,
                          training_state)
from ..errors import SarcError
from .inputs import SPLITS, EmbeddingInput, TrainError, check_call, model_code_error
from .progress import progress_bar

if TYPE_CHECKING:
    from ..train import ModelSelection


@dataclass(frozen=True, eq=False)
class Batch:
    """What one forward pass runs on, ``model(graph, x, **edge_inputs)``, and the output
    rows its loss and counts cover."""

    graph: Any                          # a Graph, a DistGraph, or a step's blocks
    x: torch.Tensor                     # the input rows
    edge_inputs: dict[str, torch.Tensor]
    label: torch.Tensor                 # of the output rows
    masks: dict[str, torch.Tensor]      # "train" / "val" / "test": labeled output rows
    train_total: int                    # the step's training nodes over all workers
    node_ids: torch.Tensor | None = None  # the input rows' global ids; None: every node, in order


class StepSource(Protocol):
    """Where the loop's batches come from: a training mode."""

    counts: dict[str, int]
    """Labeled "train" / "val" / "test" nodes over all workers: the accuracies' divisors."""

    def steps(self, epoch: int) -> Iterable[Batch]:
        """The batches of ``epoch``'s steps, one optimizer step each. The loop asks for the
        next batch once the step before is done (its optimizer step included), so a
        generator may account for a step after its ``yield``."""

    def evaluation(self) -> Iterable[Batch]:
        """The batches an evaluation runs on, each labeled node in exactly one."""


class FullBatch:
    """Full-batch training: one step per epoch on ``batch`` (the whole graph, or the
    worker's shard), evaluated on the same batch."""

    def __init__(self, batch: Batch, counts: dict[str, int]):
        self.batch, self.counts = batch, dict(counts)

    def steps(self, epoch: int) -> Iterable[Batch]:
        return (self.batch,)

    def evaluation(self) -> Iterable[Batch]:
        return (self.batch,)


class Reduction(Protocol):
    """How the workers of a run combine their gradients and counts."""

    rank: int
    size: int
    dtype: torch.dtype
    """What evaluation sums its counts and validation loss in."""

    def gradients(self, model: nn.Module) -> None:
        """Sum every parameter's gradient over the workers (collective)."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the workers (collective; ``t`` may be reused)."""

    def gather(self, obj: Any) -> list:
        """``obj`` of every worker, by rank (collective)."""


class OneProcess:
    """The reduction of a run on one process: there is nothing to combine. Its sums are
    float32, so that the accuracies are what torch's float32 mean gives (the figures
    ``sarc train`` reports); across workers they are float64."""

    rank, size, dtype = 0, 1, torch.float32

    def gradients(self, model: nn.Module) -> None:
        return None

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather(self, obj: Any) -> list:
        return [obj]


ONE_PROCESS = OneProcess()


def global_cross_entropy(logits: torch.Tensor, label: torch.Tensor, mask: torch.Tensor,
                         total: int) -> torch.Tensor:
    """This worker's share of the mean cross-entropy over ``total`` nodes of all workers
    (on one process, the mean)."""
    return F.cross_entropy(logits[mask], label[mask], reduction="sum") / max(1, total)


def forward(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The model's output rows on ``batch``; an embedding input reads its rows of the
    batch's nodes. A step's blocks (``minibatch.MiniBatchGraph``) count the pass's layer
    calls."""
    g = batch.graph
    try:
        with g.forward_pass(model) if hasattr(g, "forward_pass") else contextlib.nullcontext():
            try:
                if batch.node_ids is not None and isinstance(model, EmbeddingInput):
                    return model.on_rows(g, batch.node_ids, **batch.edge_inputs)
                return model(g, batch.x, **batch.edge_inputs)
            except TypeError:   # the call checked against the forward that takes the inputs
                check_call(model, (g, batch.x), batch.edge_inputs)
                raise
    except SarcError:
        raise
    except Exception as e:   # the model's own code: its line, not a traceback through sarc
        err = model_code_error(e, "in the model's forward")
        if err is None:
            raise
        raise err from e


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: Batch,
               reduction: Reduction,
               check_output: Callable[[torch.Tensor, int], None] | None = None) -> float:
    """One optimizer step on ``batch``; the step's loss over all workers. ``check_output``
    sees the model's output and the rows the loss reads before it does (``fit``'s)."""
    opt.zero_grad()
    logits = forward(model, batch)
    if check_output is not None:
        check_output(logits, batch.label.shape[0])
    loss = global_cross_entropy(logits, batch.label, batch.masks["train"], batch.train_total)
    loss.backward()
    reduction.gradients(model)
    opt.step()
    return float(reduction.sum(loss.detach().reshape(1)))


def evaluate(model: nn.Module, source: StepSource,
             reduction: Reduction) -> tuple[dict[str, float], float]:
    """Train / val / test accuracies and the validation loss over all workers (in eval
    mode and without gradients, as the caller sets)."""
    sums = [0.0] * (len(SPLITS) + 1)  # correct predictions per split, the val loss's sum
    for batch in source.evaluation():
        logits = forward(model, batch)
        pred = logits.argmax(1)
        for i, k in enumerate(SPLITS):
            m = batch.masks[k]
            sums[i] += float((pred[m] == batch.label[m]).sum())
        val = batch.masks["val"]
        if bool(val.any()):
            sums[-1] += float(F.cross_entropy(logits[val], batch.label[val], reduction="sum"))
    total = reduction.sum(torch.tensor(sums, dtype=reduction.dtype)).cpu()
    counts = source.counts
    # divided in Python's double: the same accuracy whatever the reduction's dtype
    acc = {k: float(total[i]) / counts[k] if counts[k] else math.nan
           for i, k in enumerate(SPLITS)}
    val_loss = float(total[-1]) / counts["val"] if counts["val"] else math.nan
    return acc, val_loss


def score(value: float) -> str:
    """An accuracy as the progress lines print it: ``-`` for a split without nodes (NaN)."""
    return "-" if math.isnan(value) else f"{value:.4f}"


def epoch_line(epoch: int, loss: float, acc: dict[str, float] | None, seconds: float, *,
               of: int | None = None) -> str:
    """The progress line of an epoch (``of``: the number of epochs, shown as ``epoch/of``;
    ``acc`` None: an epoch without evaluation)."""
    scores = ("" if acc is None else
              f"train {score(acc['train'])} val {score(acc['val'])} test {score(acc['test'])} | ")
    return (f"epoch {epoch:4d}{'' if of is None else f'/{of}'} | loss {loss:.4f} | "
            f"{scores}{seconds * 1e3:.0f} ms")


@dataclass(frozen=True)
class Outcome:
    """Where a run ended: its last epoch, that epoch's loss and accuracies, and the seconds
    trained (over every resumed attempt); the model holds the selected epoch's weights."""

    epochs: int
    loss: float
    acc: dict = field(default_factory=dict)
    elapsed_s: float = 0.0
    step_s: tuple = ()       # this attempt's epochs: seconds of their steps (no evaluation)
    eval_s: tuple = ()       # and of their evaluations (0 where an epoch had none)


def fit(model: nn.Module, opt: torch.optim.Optimizer, source: StepSource,
        selection: ModelSelection, *,
        epochs: int, reduction: Reduction = ONE_PROCESS,
        checkpoint: CheckpointConfig | None = None, run: dict | None = None,
        log: Callable[[str], None] | None = print, log_every: int = 1, eval_every: int = 1,
        line: Callable[[int, float, dict | None, float], str] = epoch_line,
        check_output: Callable[[torch.Tensor, int], None] | None = None) -> Outcome:
    """Train ``model`` for up to ``epochs`` epochs of ``source``'s steps (collective over
    ``reduction``'s workers), then load the epoch ``selection`` chose into it. An epoch's
    loss is the mean of its steps' losses.

    ``checkpoint``: save the training state there every ``checkpoint.every`` epochs, on an
    early stop and at the end, and resume from it first; ``run`` is what the checkpoint
    belongs to (``sarc.checkpoint.run_record``). Rank 0 prints ``line(...)`` every
    ``log_every`` epochs (and the first and last) to ``log``; ``log=None`` is silent.
    ``eval_every``: evaluate (and let ``selection`` see the epoch) every N-th epoch and
    the last; on a large graph a sampled epoch costs less than one full-graph evaluation.
    ``check_output(logits)``: raises where the model's output rows cannot be the classes'
    logits (``sarc.train.output_check``), called on the first epoch's steps' outputs before
    their loss, so before any optimizer step: every worker's model is the same, so all
    raise there alike.
    """
    speak = bool(log) and reduction.rank == 0

    def say(text: str) -> None:
        if speak:
            log(text)

    ckpt = None
    if checkpoint is not None:
        ckpt = Checkpointer(checkpoint, run, rank=reduction.rank, world_size=reduction.size,
                            gather=reduction.gather, log=log)
    try:
        at = ckpt.resume(model, opt, selection) if ckpt is not None else Progress()
        epoch, loss, acc, stop, before = at.epoch, at.loss, at.acc, at.stopped_early, at.elapsed_s
        if epoch >= epochs and not stop and epoch > 0:   # resumed past the epochs asked for
            say(f"the checkpoint's epoch {epoch} is at or past --epochs {epochs}: nothing left "
                f"to train (a longer run resumes it with more epochs)")
        t_start = time.perf_counter()
        step_s, eval_s = [], []
        # on a terminal, a bar: of the epochs, or of each epoch's steps where it has several
        per_epoch = getattr(source, "steps_per_epoch", 1)
        with progress_bar(0 if stop else epochs - epoch, "train", "epoch",
                          enabled=speak and per_epoch == 1) as run_bar:
            show = run_bar.printer(say)
            for epoch in range(epoch + 1, 0 if stop else epochs + 1):
                injected_fault(reduction.rank, epoch)
                t0 = time.perf_counter()
                model.train()
                step = getattr(source, "train_step", None)  # a task's own step (link.py)
                if step is None:
                    step = functools.partial(train_step, check_output=check_output)
                    check_output = None  # checked once: the first step of this run
                losses = []
                with progress_bar(per_epoch, f"epoch {epoch}", "step",
                                  enabled=speak and per_epoch > 1) as bar:
                    for batch in source.steps(epoch):
                        losses.append(step(model, opt, batch, reduction))
                        bar.advance(status=f"loss {losses[-1]:.4f}")
                if not losses:
                    raise TrainError(f"epoch {epoch}: the step source ({type(source).__name__}) "
                                     f"gave no step")
                loss = sum(losses) / len(losses)
                if not math.isfinite(loss):   # the same on every worker (all-reduced)
                    raise TrainError(f"epoch {epoch}: the training loss is {loss}: the model's "
                                     f"parameters or outputs are no longer finite numbers, and "
                                     f"nothing would be learned from here (a learning rate too "
                                     f"large, --set lr=..., features of non-finite values, or "
                                     f"a softmax over a node's edges whose scores are all -inf, "
                                     f"NaN as in torch); "
                                     f"the run stops without saving")
                t1 = time.perf_counter()
                step_s.append(t1 - t0)
                evaluated = epoch % max(1, eval_every) == 0 or epoch == epochs
                if evaluated:
                    model.eval()
                    with torch.no_grad():
                        acc, val_loss = (source.evaluate(model, reduction)
                                         if hasattr(source, "evaluate")
                                         else evaluate(model, source, reduction))
                eval_s.append(time.perf_counter() - t1 if evaluated else 0.0)
                seconds = time.perf_counter() - t0
                run_bar.advance(status=f"loss {loss:.4f}")
                if speak and (epoch % max(1, log_every) == 0 or epoch == 1 or epoch == epochs):
                    show(line(epoch, loss, acc if evaluated else None, seconds))
                stop = evaluated and selection.update(epoch, acc, val_loss, model)
                if stop:
                    show(selection.stop_message(epoch))
                if ckpt is not None and ckpt.due(epoch, stop, epochs):
                    elapsed_s = before + time.perf_counter() - t_start
                    ckpt.save(epoch, training_state(model, opt, selection, loss=loss, acc=acc,
                                                    stopped_early=stop, elapsed_s=elapsed_s))
                if stop:
                    break
    except BaseException:
        if ckpt is not None:   # nothing saved yet: a directory this run made goes
            ckpt.discard_if_unused()
        raise
    elapsed = before + time.perf_counter() - t_start
    say(selection.restore(model, epoch, elapsed))
    return Outcome(epoch, loss, acc, elapsed, tuple(step_s), tuple(eval_s))


def result_json(result: dict) -> str:
    """A run's ``--json`` report as strict JSON text: its result without the trained
    module, a metric without a value (the accuracy of an empty split, a loss that is
    not finite: NaN or infinite) as ``null``, which every JSON parser reads (Python's
    ``json`` would write ``NaN``, which is not JSON); anything else not JSON as its
    ``repr``."""
    import json
    body = {k: v for k, v in result.items() if k != "module"}
    return json.dumps(_finite_or_null(body), indent=2, default=repr, allow_nan=False) + "\n"


def write_result(path: str, result: dict) -> None:
    """A run's ``--json`` report (``result_json``), written whole or not at all, as
    ``open(path, "w")`` would write it: a pipe or a terminal (``/dev/stdout``) in place, a
    link's file through it (``checkpoint.write_atomic``)."""
    import os
    import stat

    from ..checkpoint import write_atomic
    text = result_json(result)
    try:
        kind = os.stat(path).st_mode   # through links: /dev/stdout's is a pipe's or a tty's
    except FileNotFoundError:
        kind = None
    if kind is not None and not stat.S_ISREG(kind):   # /dev/stdout, a pipe: written in place
        with open(path, "w", encoding="utf-8") as f:   # by its name: a pipe's resolved path names no entry
            f.write(text)
        return
    write_atomic(Path(path), text.encode())


def _finite_or_null(value):
    if isinstance(value, np.generic):  # a numpy scalar: its Python value
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return _finite_or_null(value.item())
    return value


def timings(out: Outcome) -> dict[str, list[float]]:
    """A run report's per-epoch seconds: of the steps, and of the evaluations."""
    return {"epoch_times_s": list(out.step_s), "eval_times_s": list(out.eval_s)}


def save_selected(path, selection: ModelSelection, *, run: dict, hparams: dict,
                  sizes: dict) -> None:
    """Write the epoch ``selection`` chose as a trained model (``sarc.load_trained``)."""
    best = selection.best
    save_model(path, best["state"], run=run, hparams=hparams, sizes=sizes,
               metrics={k: best[k] for k in ("epoch", "train_acc", "val_acc", "test_acc")})
