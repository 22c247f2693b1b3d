"""sarc.training: the one training loop (``fit``) and its seams, the step source and the
reduction, and the input rules both trainers share."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sarc.checkpoint import seed_all
from sarc.datasets import load_dataset
from sarc.errors import GraphError
from sarc.loader import load_model_file
from sarc.partition import partition_graph
from sarc.runtime.sharded import ShardedGraph
from sarc.train import ModelSelection, TrainError, build, hyperparameters, prepare
from sarc.training.inputs import check_self_loops
from sarc.training.loop import ONE_PROCESS, Batch, FullBatch, fit

MODELS = Path(__file__).resolve().parents[2] / "models"


def _setup(hparams: dict, epochs: int):
    """GCN on Cora as ``sarc.train.train`` sets it up: prepared inputs, model, optimizer."""
    spec = load_model_file(MODELS / "gcn.py")
    hp = hyperparameters(spec, hparams, epochs=epochs)
    data = load_dataset("cora")
    seed_all(0)
    prep = prepare(data, hp)
    model = build(spec, data, hp)
    opt = torch.optim.Adam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    return prep, model, opt


def _counts(masks: dict) -> dict:
    return {k: int(m.sum()) for k, m in masks.items()}


def _batch(prep, masks: dict, train_total: int) -> Batch:
    return Batch(prep.graph, prep.x, prep.edge_inputs, prep.label, masks, train_total)


class Halves:
    """A mode of two steps per epoch: the training nodes in two halves, each step the
    mean loss over its half; evaluation on the whole graph."""

    def __init__(self, prep):
        train = prep.masks["train"]
        idx = train.nonzero().squeeze(1)
        first = torch.zeros_like(train)
        first[idx[: len(idx) // 2]] = True
        self.halves = [first, train & ~first]
        self.counts = _counts(prep.masks)
        self.batches = [_batch(prep, {**prep.masks, "train": m}, int(m.sum())) for m in self.halves]
        self.whole = _batch(prep, prep.masks, self.counts["train"])

    def steps(self, epoch):
        return iter(self.batches)

    def evaluation(self):
        return (self.whole,)


def test_a_step_source_of_two_steps_per_epoch_plugs_in():
    prep, model, opt = _setup({"dropout": 0.0}, 3)
    source = Halves(prep)
    lines = []
    out = fit(model, opt, source, ModelSelection(False, None), epochs=3, log=lines.append)

    prep, ref, ref_opt = _setup({"dropout": 0.0}, 3)
    losses = []
    for _ in range(3):
        step_losses = []
        for m in source.halves:
            ref_opt.zero_grad()
            loss = F.cross_entropy(ref(prep.graph, prep.x)[m], prep.label[m])
            loss.backward()
            ref_opt.step()
            step_losses.append(float(loss.detach()))
        losses.append(sum(step_losses) / 2)

    # no validation set for the selection: it keeps the last epoch's weights
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
        assert opt.state[p]["step"] == 6
    assert out.epochs == 3 and out.loss == losses[-1]
    assert [line.split("|")[1].strip() for line in lines[:3]] == [
        f"loss {x:.4f}" for x in losses]


class TwoSameWorkers:
    """A reduction over two workers that hold the same nodes: every sum doubles."""

    rank, size, dtype = 0, 2, torch.float64

    def gradients(self, model):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(2)

    def sum(self, t):
        return t * 2

    def gather(self, obj):
        return [obj, obj]


def test_the_loop_reduces_gradients_loss_and_counts_over_the_workers():
    """Two workers with the same nodes, each loss divided by twice the training nodes:
    the gradients summed by the reduction are the one-process gradients, bit for bit."""
    prep, one, one_opt = _setup({}, 4)  # dropout on: both runs draw the same masks
    counts = _counts(prep.masks)
    single = fit(one, one_opt, FullBatch(_batch(prep, prep.masks, counts["train"]), counts),
                 ModelSelection(True, None), epochs=4, log=None, reduction=ONE_PROCESS)

    prep, two, two_opt = _setup({}, 4)
    doubled = {k: 2 * n for k, n in counts.items()}
    pair = fit(two, two_opt, FullBatch(_batch(prep, prep.masks, doubled["train"]), doubled),
               ModelSelection(True, None), epochs=4, log=None, reduction=TwoSameWorkers())

    for (name, p), q in zip(one.named_parameters(), two.parameters()):
        assert torch.equal(p, q), name
    assert pair.loss == single.loss
    for k in ("train", "val", "test"):
        assert pair.acc[k] == pytest.approx(single.acc[k], abs=1e-7)


def test_a_step_source_without_steps_is_an_error():
    prep, model, opt = _setup({}, 1)
    counts = _counts(prep.masks)

    class NoSteps(FullBatch):
        def steps(self, epoch):
            return ()

    with pytest.raises(TrainError, match="epoch 1: the step source \\(NoSteps\\) gave no step"):
        fit(model, opt, NoSteps(_batch(prep, prep.masks, counts["train"]), counts),
            ModelSelection(True, None), epochs=1, log=None)


def test_self_loops_are_refused_on_edge_data_alike_on_a_shard(tmp_path):
    """One rule for a dataset and a worker's shard: a self loop has no edge type (the shard:
    when the model reads it; ``sarc.datasets.add_self_loops_with_data``)."""
    with pytest.raises(TrainError, match="whose edges carry etype, weight: a self loop has no "
                                         "edge type"):
        check_self_loops(["weight", "etype"], "the graph g")
    check_self_loops([], "the graph g")  # no edge data: self loops are fine

    from sarc.distributed.prepare import with_self_loops
    gen = torch.Generator().manual_seed(0)
    src, dst = (torch.randint(0, 40, (200,), generator=gen) for _ in range(2))
    pset = partition_graph(src, dst, 40, 2, tmp_path / "parts", method="random",
                           edge_data={"etype": torch.randint(0, 3, (200,), generator=gen)})
    shard = ShardedGraph.from_partitions(pset, 0)
    # on a shard, the edge data the model reads: an edge type has no value for a loop
    with pytest.raises(GraphError, match="edge feature 'etype' .* a self loop has no edge type"):
        with_self_loops(shard, ex=None, reads=("etype",))  # refused before any exchange


class Recorded(ModelSelection):
    """A model selection that records the epochs it is shown."""

    def __init__(self):
        super().__init__(True, None)
        self.seen = []

    def update(self, epoch, acc, val_loss, model):
        self.seen.append(epoch)
        return super().update(epoch, acc, val_loss, model)


def test_evaluation_every_n_epochs_trains_the_same_and_selects_among_evaluated_epochs():
    runs = {}
    for every in (1, 3):
        prep, model, opt = _setup({}, 7)  # dropout on: evaluation draws no mask
        counts = _counts(prep.masks)
        lines, selection = [], Recorded()
        out = fit(model, opt, FullBatch(_batch(prep, prep.masks, counts["train"]), counts),
                  selection, epochs=7, log=lines.append, eval_every=every)
        runs[every] = (out, selection, lines, model)
    (one, sel1, lines1, m1), (three, sel3, lines3, m3) = runs[1], runs[3]
    assert sel1.seen == list(range(1, 8)) and sel3.seen == [3, 6, 7]
    assert sel3.best["epoch"] in (3, 6, 7)
    assert three.loss == one.loss and three.acc == one.acc  # epoch 7 is evaluated
    assert len(three.step_s) == len(three.eval_s) == 7
    assert [t > 0 for t in three.eval_s] == [e in (3, 6, 7) for e in range(1, 8)]
    scored = ["val" in line for line in lines3 if line.startswith("epoch")]
    assert scored == [e in (3, 6, 7) for e in range(1, 8)]
    # the epoch lines agree on the losses; the weights after each epoch are the same
    assert [ln.split("|")[1] for ln in lines1[:7]] == [ln.split("|")[1] for ln in lines3[:7]]


def test_eval_every_below_one_is_a_usage_error(tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "sarc.cli", "train", str(MODELS / "gcn.py"),
                           "--dataset", "cora", "--eval-every", "0"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "--eval-every" in proc.stderr and "Traceback" not in proc.stderr


def test_norm_features_refuses_negative_features():
    """Dividing a row by its sum is for non-negative features: a row of mixed signs sums to
    about 0 and would blow up (a loss of 1e11), so it is an error saying what to set."""
    from sarc.training.inputs import TrainError, node_features
    x = torch.tensor([[1.0, -0.999], [0.5, 0.5]])
    with pytest.raises(TrainError, match=r"negative values \(as low as -0.999\); set "
                                         r"norm_features=False"):
        node_features(x, {"norm_features": True})
    assert torch.equal(node_features(x, {"norm_features": False}), x)
    counts = torch.tensor([[2.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    assert torch.equal(node_features(counts, {"norm_features": True}),
                       torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]))
