"""The point-to-point ops of the exchanges outside a layer's passes pair up as NCCL runs them
(``harness.unpaired_ops``: by order, tags ignored, one stream per pair): the all-to-all of
mini-batch ids and sharded rows (``sampling.Comm.exchange``) and an exchange of every round
at once (``Exchanger.swap``: kept rows' gradients, a relation's counts and degrees), on 2,
3 and 4 gloo workers, with empty messages. (The layers' passes are checked case by case in
test_exactness.py.) Gloo matches untagged messages by order as NCCL does, so the values
received are checked too."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sampling.graphs import run_workers  # noqa: E402

from .harness import P2P, _recording, unpaired_ops  # noqa: E402


def _sizes(p: int, seed: int) -> torch.Tensor:
    """[P, P]: rows worker i sends worker j (some none)."""
    gen = torch.Generator().manual_seed(seed)
    n = torch.randint(0, 5, (p, p), generator=gen)
    n[torch.rand(p, p, generator=gen) < 0.3] = 0
    return n


def _message(i: int, j: int, rows: int, seed: int) -> torch.Tensor:
    return torch.full((rows, 2), float(1000 * seed + 10 * i + j))


def _work(rank, group, p):
    from sarc.distributed.exchange import GRADS_TAG, KEPT_GRADS_TAG, Exchanger
    from sarc.sampling import Comm
    dist.isend, dist.irecv = _recording(dist.isend, "send"), _recording(dist.irecv, "recv")
    P2P.clear()
    ex, comm = Exchanger(rank, p), Comm()
    for seed in range(3):
        n = _sizes(p, seed)
        got = comm.exchange([_message(rank, j, int(n[rank, j]), seed) for j in range(p)],
                            sizes=[int(n[j, rank]) for j in range(p)])
        for j in range(p):
            if j != rank:
                assert torch.equal(got[j], _message(j, rank, int(n[j, rank]), seed)), (seed, j)
        for tag in (GRADS_TAG, KEPT_GRADS_TAG, 100):
            out = {j: _message(rank, j, int(n[rank, j]), seed) for j in range(p) if j != rank}
            shapes = {j: (int(n[j, rank]), 2) for j in range(p) if j != rank}
            sends, recvs = ex.swap(out, shapes, torch.float32, torch.device("cpu"), tag, "test")
            for j, pending in recvs.items():
                assert torch.equal(pending.wait(), _message(j, rank, int(n[j, rank]), seed))
            assert set(recvs) == {j for j in shapes if shapes[j][0]}
            for s in sends:
                s.wait()
    return {"rank": dist.get_rank(), "p2p": list(P2P)}


@pytest.mark.parametrize("p", [2, 3, 4])
def test_exchanges_pair_up_as_nccl_runs_them(tmp_path, p):
    results = run_workers(_work, p, tmp_path, p)
    logs = {r["rank"]: r["p2p"] for r in results}
    assert sum(map(len, logs.values()))
    assert unpaired_ops(logs) == []
