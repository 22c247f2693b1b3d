"""The sharded store and sharded embeddings, on real gloo workers.

- ``ShardedTensor.pull`` returns the rows of any global ids (repeats, any order,
  other workers' rows) as indexing the whole tensor would; ``push`` adds (sets)
  them; each distinct row crosses the wire once (bytes counted);
- ``Embedding`` + ``SparseAdagrad`` / ``SparseAdam`` over several steps, P in {1, 2, 3},
  each worker looking up its own ids (overlapping, repeated, some empty): the table
  equals one process with ``nn.Embedding(sparse=True)`` + ``torch.optim.Adagrad`` /
  ``torch.optim.SparseAdam`` on the union of the lookups; each worker holds 1/P of the
  table and of the optimizer state.
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sarc.distributed.embedding import Embedding, SparseAdagrad, SparseAdam
from sarc.distributed.store import ShardedTensor, StoreError
from sarc.sampling import Comm

from .harness import spawn

N, DIM, STEPS = 23, 4, 4


def _offsets(p: int) -> torch.Tensor:
    cuts = [0, 9, 15, N] if p == 3 else ([0, 10, N] if p == 2 else [0, N])
    return torch.tensor(cuts)


def _lookups(step: int, rank: int, p: int) -> torch.Tensor:
    """Worker ``rank``'s ids at ``step``: random, repeated, across shards; none sometimes."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    if (step + rank) % 4 == 3:
        return torch.zeros(0, dtype=torch.int64)
    return torch.randint(0, N, (7,), generator=gen)


def _loss(rows: torch.Tensor, step: int, rank: int) -> torch.Tensor:
    w = torch.linspace(-1, 1, DIM) * (step + 1) + rank
    return (rows * w).sin().sum()


def _join(rank: int, port: int, p: int):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=p, timeout=datetime.timedelta(seconds=30))
    return Comm(timeout=datetime.timedelta(seconds=30))


def _store_worker(rank, port, q, p):
    ex = _join(rank, port, p)
    offsets = _offsets(p)
    whole = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
    lo, hi = int(offsets[rank]), int(offsets[rank + 1])
    st = ShardedTensor(whole[lo:hi].clone(), offsets, rank, ex, "x")
    ids = torch.tensor([N - 1, 0, 5, 5, N - 1, 12, 12, 12])[rank::p].flip(0)
    got = st.pull(ids)
    ex.rows_received.clear()
    st.pull(torch.tensor([N - 1, N - 1, N - 1, 0]))
    received = dict(ex.rows_received)
    st.push(torch.tensor([1, 1, N - 2]), torch.ones(3, 3))
    dist.barrier()
    q.put((rank, {"ids": ids.tolist(), "got": got.tolist(), "received": received,
                  "local": st.local.tolist()}))
    dist.destroy_process_group()


@pytest.mark.parametrize("p", [2, 3])
def test_pull_and_push_across_workers(p):
    codes, reports = spawn(_store_worker, p, (p,))
    assert codes == [0] * p, reports
    whole = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
    for r in reports:
        assert torch.equal(torch.tensor(r["got"]).reshape(-1, 3), whole[torch.tensor(r["ids"])])
    offsets = _offsets(p)
    after = whole.clone()
    after[1] += 2 * p
    after[N - 2] += p
    assert torch.equal(torch.tensor([row for r in reports for row in r["local"]]), after)
    # ids N-1 and 0 asked for: each distinct row from another worker arrives once, and each
    # row of mine is asked for once by every other worker
    for rank, r in enumerate(reports):
        lo, hi = int(offsets[rank]), int(offsets[rank + 1])
        remote = sum(1 for i in (N - 1, 0) if not lo <= i < hi)
        asked_of_me = sum(1 for i in (N - 1, 0) if lo <= i < hi) * (p - 1)
        assert r["received"].get("pull", 0) == remote
        assert r["received"].get("pull ids", 0) == asked_of_me


def _embedding_worker(rank, port, q, p, opt_name):
    comm = _join(rank, port, p) if p > 1 else None
    emb = Embedding(N, DIM, offsets=_offsets(p), rank=rank, comm=comm, seed=7)
    opt = (SparseAdagrad(emb, lr=0.3) if opt_name == "adagrad" else SparseAdam(emb, lr=0.1))
    for step in range(STEPS):
        opt.zero_grad()
        rows = emb(_lookups(step, rank, p))
        _loss(rows, step, rank).backward()
        opt.step()
    q.put((rank, {"local": emb.local.tolist(),
                  "state": {k: tuple(v.shape) for k, v in opt.state[0].items()}}))
    if p > 1:
        dist.barrier()


def _reference_worker(rank, port, q, p, opt_name):
    # in a child as well: sparse optimizer steps in the test process would enter its OpenMP
    # pool, and the workers forked after that can hang in it (libgomp is not fork-safe)
    q.put((rank, _reference(p, opt_name).tolist()))


def _reference(p: int, opt_name: str) -> torch.Tensor:
    emb = nn.Embedding(N, DIM, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(Embedding(N, DIM, seed=7).initial_table())
    opt = (torch.optim.Adagrad(emb.parameters(), lr=0.3) if opt_name == "adagrad"
           else torch.optim.SparseAdam(emb.parameters(), lr=0.1))
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(_loss(emb(_lookups(step, r, p)), step, r) for r in range(p))
        loss.backward()
        opt.step()
    return emb.weight.detach()


@pytest.mark.parametrize("opt_name", ["adagrad", "adam"])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_sharded_embedding_training_equals_one_process(p, opt_name):
    codes, reports = spawn(_embedding_worker, p, (p, opt_name))
    assert codes == [0] * p, reports
    got = torch.tensor([row for r in reports for row in r["local"]])
    _, (want,) = spawn(_reference_worker, 1, (p, opt_name))
    want = torch.tensor(want)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), (got - want).abs().max()
    assert not torch.equal(want, Embedding(N, DIM, seed=7).initial_table())  # it trained
    offsets = _offsets(p)
    for rank, r in enumerate(reports):  # each worker holds its rows and their state only
        rows = int(offsets[rank + 1] - offsets[rank])
        assert len(r["local"]) == rows and len(r["local"][0]) == DIM
        assert all(s == (rows, DIM) for s in r["state"].values())


ORDERS = {
    # where zero_grad stands: after the step's lookup (before its backward), or nowhere in
    # a step (gradients accumulate over the steps: each step applies them all again)
    "zero_grad after the lookup": ("lookup", "zero_grad", "backward", "step"),
    "no zero_grad": ("lookup", "backward", "step"),
    "two lookups, one backward": ("zero_grad", "lookup", "lookup", "backward", "step"),
    "two steps per backward": ("zero_grad", "lookup", "backward", "step", "step"),
    "an empty lookup": ("zero_grad", "empty lookup", "backward", "step"),
}


def _order_worker(rank, port, q, p, opt_name, order):
    """sarc's table and torch's ``nn.Embedding(sparse=True)`` through ``order``; in a child,
    as ``_reference_worker``."""
    ours, theirs = Embedding(N, DIM, seed=7), nn.Embedding(N, DIM, sparse=True)
    with torch.no_grad():
        theirs.weight.copy_(ours.initial_table())
    opts = ((SparseAdagrad(ours, lr=0.3), torch.optim.Adagrad(theirs.parameters(), lr=0.3))
            if opt_name == "adagrad" else
            (SparseAdam(ours, lr=0.1), torch.optim.SparseAdam(theirs.parameters(), lr=0.1)))
    for step in range(STEPS):
        for emb, opt in zip((ours, theirs), opts):
            losses = []
            for i, what in enumerate(ORDERS[order]):
                if what == "lookup":
                    losses.append(_loss(emb(_lookups(step + i, 0, 1)), step, 0))
                elif what == "empty lookup":   # a step of no rows (torch's steps count it)
                    ids = _lookups(step, 0, 1) if step % 2 else torch.zeros(0, dtype=torch.int64)
                    losses.append(_loss(emb(ids), step, 0))
                elif what == "backward":
                    sum(losses).backward()
                else:
                    getattr(opt, what)()
    q.put((rank, (ours.local - theirs.weight.detach()).abs().max().item()))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("opt_name", ["adagrad", "adam"])
def test_the_sparse_optimizers_see_gradients_as_torchs_do(opt_name, order):
    """A sparse optimizer applies what a backward gave the lookups since its zero_grad,
    whenever they were made, and keeps it over a step, as torch's optimizers keep a
    parameter's .grad (zero_grad after a lookup dropped it: the table never trained)."""
    codes, (diff,) = spawn(_order_worker, 1, (1, opt_name, order))
    assert codes == [0]
    assert diff < 1e-6, diff


def test_initial_rows_do_not_depend_on_the_split():
    whole = Embedding(40000, 3, seed=2).initial_table()
    offsets = torch.tensor([0, 16383, 16385, 40000])
    parts = [Embedding(None, 3, offsets=offsets, rank=r, comm=_FakeComm(3), seed=2).local
             for r in range(3)]
    assert torch.equal(torch.cat(parts), whole)


class _FakeComm:
    """Enough of a comm to build a shard's table without a process group."""

    def __init__(self, size):
        self.size = size


def test_bad_ids_and_shapes_are_errors_naming_the_tensor():
    st = ShardedTensor(torch.zeros(5, 2), torch.tensor([0, 5]), 0, None, "feat")
    with pytest.raises(StoreError, match=r"id 5 is out of range for 'feat' \(5 rows\)"):
        st.pull(torch.tensor([0, 5]))
    with pytest.raises(StoreError, match="1-D integer tensor"):
        st.pull(torch.tensor([0.5]))
    with pytest.raises(StoreError, match=r"push to 'feat': 2 ids with values of shape \[2, 3\]"):
        st.push(torch.tensor([0, 1]), torch.zeros(2, 3))
    with pytest.raises(StoreError, match="has 2 shards but the process group is missing"):
        ShardedTensor(torch.zeros(5, 2), torch.tensor([0, 5, 9]), 0, None, "feat")
