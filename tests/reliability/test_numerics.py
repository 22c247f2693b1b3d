"""Attention gradients at large scores: every backend against float64.

The case: GAT (``models/gat.py``, two layers, fused attention or, with attention
dropout in eval mode, an unfused ``edge_softmax``) on a random graph whose
features are scaled so the first layer's attention scores reach 1e2, 1e3 or
1e4. One training step's gradients (every parameter and the input features)
are compared with the same step in float64: a plain-torch GAT (a dense
``torch.softmax`` over each node's in-edges), the yardstick.

What "error" means. A gradient's error is ``||got - float64||``. Plain torch in
float32 (the same plain GAT) is the reference implementation: sarc's error must
be at most ``FACTOR`` times torch's, plus one float32 rounding of the gradient's
size. Torch's own error is large exactly where a gradient cancels: the
destination attention vector's gradient is, per node, a sum over its in-edges of
softmax score gradients, which sum to zero (softmax is shift invariant) but for
the edges on the other side of the leaky_relu; at large scores its true value is
tiny or 0 and torch's float32 result is rounding noise of the size of the
*other* terms. So a second criterion holds sarc to what a well-conditioned
evaluation gives: its error in ``att_dst``'s gradient is at most ``TERMS``
roundings of the sum of the magnitudes of the true terms that make it up,
``sum_e |d raw_e| |z_dst(e)|`` (``raw_e = el[u] + er[v]``, from the float64
run). Torch's float32 backward misses that bound at 1e3 and 1e4 (by 10x and
450x here; checked below, so the bound is not vacuous).

The distributed case: the same model trained for a few Adam steps (weight decay
as ``sarc train``'s) by 2 workers equals the single-process run. Adam divides by
the gradient's running size, so rounding noise in a gradient that should be 0
becomes a full step: with the noisy backward a 2- or 3-worker run drifts from
the single-process run within a few steps.
"""
from __future__ import annotations

import copy
import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gat import GAT, GATLayer

import sarc
from sarc.ir import interpreter

from .catalogue import case

# Triton runs on a GPU, or in its interpreter on CPU tensors; the interpreter must be chosen
# before triton is imported (as tests/backends/triton does).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if TRITON_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

EPS = torch.finfo(torch.float32).eps
FACTOR = 4.0
TERMS = 2.0
SCORES = (1e2, 1e3, 1e4)

N, E, FEATS, CLASSES = 48, 320, 12, 3
HEADS, HIDDEN, OUT_HEADS = 2, 4, 2
VARIANTS = {"fused": 0.0, "unfused": 0.5}  # attention dropout (eval mode: inactive)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- the problem and its float64 reference ----------------------------------------------

def _graph():
    gen = torch.Generator().manual_seed(11)
    src = torch.cat([torch.randint(0, N, (E,), generator=gen), torch.arange(N)])
    dst = torch.cat([torch.randint(0, N, (E,), generator=gen), torch.arange(N)])
    feat = torch.randn(N, FEATS, generator=gen)
    label = torch.randint(0, CLASSES, (N,), generator=gen)
    train = torch.rand(N, generator=gen) < 0.6
    return src, dst, feat, label, train


def _model(attn_drop: float) -> GAT:
    torch.manual_seed(0)
    model = GAT(FEATS, HIDDEN, CLASSES, HEADS, OUT_HEADS, dropout=0.0, attn_drop=attn_drop)
    return model.eval() if attn_drop else model


class Plain:
    """The GAT of ``models/gat.py`` in plain torch, any dtype: a dense softmax per node."""

    def __init__(self, g: sarc.Graph):
        self.g = g
        self.pos = torch.arange(g.num_edges) - g.rowptr[:-1][g.dst]
        self.width = int(self.pos.max()) + 1
        self.raw: list[torch.Tensor] = []
        self.z: list[torch.Tensor] = []

    def layer(self, x, p, pre: str, layer: GATLayer):
        g, h, c = self.g, layer.heads, layer.out_feats
        z = (x @ p[pre + "lin.weight"].t()).view(-1, h, c)
        raw = (z * p[pre + "att_src"]).sum(-1)[g.src] + (z * p[pre + "att_dst"]).sum(-1)[g.dst]
        if raw.requires_grad:
            raw.retain_grad()
        self.raw.append(raw)
        self.z.append(z)
        sc = F.leaky_relu(raw, layer.negative_slope)
        dense = torch.full((g.num_dst, self.width, h), float("-inf"), dtype=x.dtype)
        alpha = torch.softmax(dense.index_put((g.dst, self.pos), sc), 1)[g.dst, self.pos]
        agg = torch.zeros(g.num_dst, h, c, dtype=x.dtype).index_add(
            0, g.dst, z[g.src] * alpha.unsqueeze(-1))
        out = agg.flatten(1) if layer.concat else agg.mean(1)
        return out + p[pre + "bias"]

    def __call__(self, model: GAT, x, p):
        self.raw, self.z = [], []
        h = F.elu(self.layer(x, p, "conv1.", model.conv1))
        return self.layer(h, p, "conv2.", model.conv2)


def _plain_grads(model, plain, x, label, train, dtype):
    p = {k: v.detach().to(dtype).requires_grad_() for k, v in model.named_parameters()}
    x = x.detach().to(dtype).clone().requires_grad_()
    F.cross_entropy(plain(model, x, p)[train], label[train]).backward()
    return {**{k: t.grad for k, t in p.items()}, "x": x.grad}


def _problem(score: float, attn_drop: float):
    """(graph, model, features scaled to first-layer scores of ``score``, labels, mask, plain)."""
    src, dst, feat, label, train = _graph()
    g = sarc.Graph.from_edges(src, dst, N)
    model = _model(attn_drop)
    plain = Plain(g)
    with torch.no_grad():
        plain(model, feat.double(), {k: v.double() for k, v in model.named_parameters()})
    x = feat * (score / float(plain.raw[0].abs().max()))
    return g, model, x, label, train, plain


def _terms(plain: Plain, layer: int, att_dst: torch.Tensor) -> torch.Tensor:
    """sum_e |d raw_e| |z_dst(e)| (float64 run): the magnitude of the terms of d att_dst."""
    raw, z = plain.raw[layer], plain.z[layer].detach()
    return (raw.grad.abs().unsqueeze(-1) * z[plain.g.dst].abs()).sum(0).reshape(att_dst.shape)


def _sarc_grads(model, g, x, label, train):
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    F.cross_entropy(model(g, x)[train], label[train]).backward()
    return {**{k: p.grad for k, p in model.named_parameters()}, "x": x.grad}


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm())


def check_gradients(run, score: float, attn_drop: float) -> None:
    """``run(model, g, x, label, train)`` -> gradients: against float64, as the module doc says."""
    g, model, x, label, train, plain = _problem(score, attn_drop)
    want = _plain_grads(model, plain, x, label, train, torch.float64)
    terms = [_terms(plain, i, want[f"conv{i + 1}.att_dst"]) for i in range(2)]
    torch32 = _plain_grads(model, plain, x, label, train, torch.float32)
    got = run(copy.deepcopy(model), g, x, label, train)
    assert set(got) == set(want)
    for k in want:
        assert torch.isfinite(got[k]).all(), k
        bound = FACTOR * _err(torch32[k], want[k]) + EPS * float(want[k].norm())
        assert _err(got[k], want[k]) <= bound, (
            f"{k}: error {_err(got[k], want[k]):.3e} > {bound:.3e} (plain torch float32: "
            f"{_err(torch32[k], want[k]):.3e}, |grad| {float(want[k].norm()):.3e})")
    for i, t in enumerate(terms):
        k = f"conv{i + 1}.att_dst"
        bound = TERMS * EPS * float(t.norm())
        assert _err(got[k], want[k]) <= bound, (
            f"{k}: error {_err(got[k], want[k]):.3e} > {TERMS:g} roundings of its terms "
            f"{float(t.norm()):.3e} (plain torch float32: {_err(torch32[k], want[k]):.3e})")
    if score >= 1e3:  # the bound has teeth: plain torch misses it
        assert any(_err(torch32[f"conv{i + 1}.att_dst"], want[f"conv{i + 1}.att_dst"])
                   > TERMS * EPS * float(t.norm()) for i, t in enumerate(terms))


# --- the backends ------------------------------------------------------------------------

def _compiled(backend: str, autodiff: str = "torch", device: str = "cpu"):
    def run(model, g, x, label, train):
        for layer in (model.conv1, model.conv2):
            layer.set_backend(backend).set_autodiff(autodiff)
        model.to(device)
        grads = _sarc_grads(model, g.to(device), x.to(device), label.to(device),
                            train.to(device))
        return {k: t.cpu() for k, t in grads.items()}
    return run


def _interpreted(model, g, x, label, train):
    for layer in (model.conv1, model.conv2):
        fn = layer.trace()
        layer.forward = (lambda layer, fn: lambda g, h: interpreter.run(
            fn, g, {"h": h}, dict(layer.named_parameters()), layer.training)["h"])(layer, fn)
    return _sarc_grads(model, g, x, label, train)


CASES = [(s, v) for s in SCORES for v in VARIANTS]
IDS = [f"{s:g}-{v}" for s, v in CASES]


@case("numerics", "attention scores of 1e2..1e4 (GAT, features x1e3), reference interpreter",
      "exact")
@pytest.mark.parametrize("score,variant", CASES, ids=IDS)
def test_interpreter_attention_gradients_at_large_scores(score, variant):
    check_gradients(_interpreted, score, VARIANTS[variant])


@case("numerics", "attention scores of 1e2..1e4 (GAT, features x1e3), PyTorch backend", "exact")
@pytest.mark.parametrize("score,variant", CASES, ids=IDS)
def test_torch_attention_gradients_at_large_scores(score, variant):
    check_gradients(_compiled("torch"), score, VARIANTS[variant])


@case("numerics", "attention scores of 1e2..1e4 (GAT, features x1e3), gradients from the "
      "backward IR", "exact")
@pytest.mark.parametrize("score,variant", CASES, ids=IDS)
def test_ir_backward_attention_gradients_at_large_scores(score, variant):
    check_gradients(_compiled("torch", "ir"), score, VARIANTS[variant])


@case("numerics", "attention scores of 1e2..1e4 (GAT, features x1e3), Triton backend "
      "(interpreter)", "exact")
@pytest.mark.parametrize("score,variant", CASES, ids=IDS)
# the interpreter's NumPy warns about the padding lanes of a tile (see tests/backends/triton)
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
def test_triton_attention_gradients_at_large_scores(score, variant):
    from sarc.backends import triton_backend
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as e:
        pytest.skip(str(e))
    check_gradients(_compiled("triton", device=TRITON_DEVICE), score, VARIANTS[variant])


# --- the distributed schedules ----------------------------------------------------------

WORKERS = 2
STEPS = 5
ADAM = {"lr": 0.005, "weight_decay": 5e-4}  # as sarc train (models/gat.py's lr)


def _train(model, g, x, label, train, total: int, steps: int, group=None):
    """``steps`` Adam steps; returns (first step's gradients, losses, final parameters)."""
    from sarc.distributed.train import allreduce_gradients
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    x = x.detach().clone().requires_grad_()
    first, losses = None, []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(g, x)[train], label[train], reduction="sum") / total
        loss.backward()
        if group is not None:
            allreduce_gradients(model, group)
            loss = loss.detach().clone()
            torch.distributed.all_reduce(loss, group=group)
        if first is None:
            first = {**{k: p.grad.clone() for k, p in model.named_parameters()}, "x": x.grad}
        losses.append(float(loss))
        opt.step()
    return first, losses, {k: p.detach().clone() for k, p in model.named_parameters()}


def _worker(rank, port, queue, parts: str, state: dict, attn_drop: float, total: int,
            steps: int):
    import torch.distributed as dist

    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORKERS, timeout=datetime.timedelta(seconds=60))
    try:
        shard = ShardedGraph.from_partitions(load_partitions(parts, verify=False), rank)
        model = _model(attn_drop)
        model.load_state_dict(state)
        dg = DistGraph(shard, timeout=datetime.timedelta(seconds=60))
        nd = shard.ndata
        result = _train(model, dg, nd["feat"], nd["label"], nd["train_mask"], total, steps,
                        dist.group.WORLD)
        torch.save((shard.orig_node_ids, *result), Path(parts) / f"result.r{rank}.pt")
        queue.put((rank, "ok"))
    finally:
        dist.destroy_process_group()


def _distributed(steps: int, tmp: Path):
    """A run function for ``check_gradients``: ``steps`` steps on ``WORKERS`` workers (a random
    partition of the graph); returns the first step's gradients, whole, in node order."""
    from distributed.harness import spawn

    from sarc.partition import partition_graph

    def run(model, g, x, label, train):
        parts = partition_graph(g.src, g.dst, g.num_src, WORKERS, tmp / "parts", method="random",
                                node_data={"feat": x, "label": label, "train_mask": train}).path
        state = {k: v.clone() for k, v in model.state_dict().items()}
        codes, reports = spawn(_worker, WORKERS, (str(parts), state, float(model.conv1.attn_drop),
                                                  int(train.sum()), steps), timeout_s=240)
        assert codes == [0] * WORKERS and reports == ["ok"] * WORKERS, (codes, reports)
        ranks = [torch.load(parts / f"result.r{r}.pt", weights_only=False)
                 for r in range(WORKERS)]
        first = dict(ranks[0][1])
        first["x"] = torch.zeros_like(x)
        for ids, grads, *_ in ranks:
            first["x"][ids] = grads["x"]
        run.losses, run.final = ranks[0][2], ranks[0][3]
        return first
    return run


@case("numerics", f"attention scores of 1e2..1e4 (GAT, features x1e3), {WORKERS} workers",
      "exact")
@pytest.mark.parametrize("score,variant", CASES, ids=IDS)
def test_distributed_attention_gradients_at_large_scores(score, variant, tmp_path):
    check_gradients(_distributed(1, tmp_path), score, VARIANTS[variant])


@case("numerics", f"GAT trained {STEPS} Adam steps at attention scores of 1e4 on {WORKERS} "
      "workers vs one process", "exact")
@pytest.mark.parametrize("variant", VARIANTS)
def test_distributed_training_at_large_scores_equals_one_process(variant, tmp_path):
    """P workers sum in another order than one process: a gradient that cancels (the bias's,
    a sum over every row of the output's cotangent) differs in its last digits, and Adam,
    dividing by its root mean square, makes that a difference in the step. One process
    renumbering its nodes sums in another order too: P workers may differ from one process
    by 1e-5 of a parameter's norm, or by as much as that renumbered run does, twice over."""
    g, model, x, label, train, _ = _problem(1e4, VARIANTS[variant])
    run = _distributed(STEPS, tmp_path)
    run(copy.deepcopy(model), g, x, label, train)
    renumbered = _train(copy.deepcopy(model), *_renumbered(g, x, label, train),
                        int(train.sum()), STEPS)[2]
    _, losses, final = _train(model, g, x, label, train, int(train.sum()), STEPS)
    assert run.losses == pytest.approx(losses, rel=1e-5)
    for k, want in final.items():
        allowed = max(1e-5 * float(want.norm()), 2 * _err(renumbered[k], want))
        assert _err(run.final[k], want) <= allowed, (
            f"{k} after {STEPS} steps: {WORKERS} workers differ from one process by "
            f"{_err(run.final[k], want) / float(want.norm()):.2e} (relative), one process "
            f"renumbered by {_err(renumbered[k], want) / float(want.norm()):.2e}")


def _renumbered(g: sarc.Graph, x, label, train):
    """The same problem with its nodes numbered in reverse: node i is node n - 1 - i."""
    n = g.num_src
    new = torch.arange(n - 1, -1, -1)
    g2 = sarc.Graph.from_edges(new[g.src], new[g.dst], n)
    return g2, x.flip(0), label.flip(0), train.flip(0)
