"""sarc.distributed.SyncBatchNorm over 3 real workers equals torch.nn.BatchNorm1d on the whole data.

Rows are dealt unevenly (one worker holds a single row); two training steps check the
output, the input gradient, the (summed) gamma / beta gradients and the running
statistics, then an eval-mode step.
"""
from __future__ import annotations

import datetime
import io

import torch
import torch.distributed as dist
from torch import nn

from sarc.distributed.batchnorm import SyncBatchNorm
from sarc.distributed.train import allreduce_gradients

from .harness import spawn

P, C = 3, 5
SPLITS = (20, 1, 13)


def _data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(sum(SPLITS), C, generator=gen) * 3 + 1
    w = torch.randn(sum(SPLITS), C, generator=gen)  # the loss is sum(y * w)
    return x, w


def _steps(bn, xs, ws):
    outs = []
    for step in range(2):
        bn.zero_grad()
        x = xs.clone().requires_grad_(True)
        y = bn(x * (1 + step))
        (y * ws).sum().backward()
        outs.append((y.detach(), x.grad))
    return outs


def _worker(rank, port, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=P, timeout=datetime.timedelta(seconds=30))
    x, w = _data()
    lo = sum(SPLITS[:rank])
    rows = slice(lo, lo + SPLITS[rank])
    bn = SyncBatchNorm(C)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 2, C))
        bn.bias.copy_(torch.linspace(-1, 1, C))
    outs = []
    for step in range(2):
        bn.zero_grad()
        xr = (x[rows] * (1 + step)).clone().requires_grad_(True)
        y = bn(xr)
        (y * w[rows]).sum().backward()
        allreduce_gradients(bn)
        outs.append((y.detach(), xr.grad, bn.weight.grad.clone(), bn.bias.grad.clone()))
    bn.eval()
    y_eval = bn(x[rows]).detach()
    buf = io.BytesIO()  # bytes, not tensors: a queued tensor is shared through this process
    torch.save({"outs": outs, "running": (bn.running_mean, bn.running_var), "eval": y_eval}, buf)
    queue.put((rank, buf.getvalue()))


def test_sync_batchnorm_equals_batchnorm1d_on_all_rows():
    codes, reports = spawn(_worker, P, timeout_s=120)
    assert codes == [0] * P, codes
    got = [torch.load(io.BytesIO(r)) for r in reports]
    x, w = _data()
    ref = nn.BatchNorm1d(C)
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(0.5, 2, C))
        ref.bias.copy_(torch.linspace(-1, 1, C))
    want = []
    for step in range(2):
        ref.zero_grad()
        xr = (x * (1 + step)).clone().requires_grad_(True)
        y = ref(xr)
        (y * w).sum().backward()
        want.append((y.detach(), xr.grad, ref.weight.grad.clone(), ref.bias.grad.clone()))
    ref.eval()
    want_eval = ref(x).detach()
    for step in range(2):
        y = torch.cat([g["outs"][step][0] for g in got])
        gx = torch.cat([g["outs"][step][1] for g in got])
        torch.testing.assert_close(y, want[step][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gx, want[step][1], rtol=1e-5, atol=1e-5)
        for g in got:  # gamma / beta gradients: summed over the workers
            torch.testing.assert_close(g["outs"][step][2], want[step][2], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(g["outs"][step][3], want[step][3], rtol=1e-5, atol=1e-5)
    for g in got:
        torch.testing.assert_close(g["running"][0], ref.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g["running"][1], ref.running_var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([g["eval"] for g in got]), want_eval, rtol=1e-5, atol=1e-5)


def test_without_a_process_group_it_is_batchnorm1d():
    x, w = _data()
    bn, ref = SyncBatchNorm(C), nn.BatchNorm1d(C)
    for (y, gx), (ry, rgx) in zip(_steps(bn, x, w), _steps(ref, x, w)):
        assert torch.equal(y, ry) and torch.equal(gx, rgx)


def test_a_workers_plain_batch_norms_become_sync_batch_norms():
    """``sync_batch_norms``: each plain BatchNorm1d (in a Sequential, shared, without
    affine or running statistics) is replaced by a SyncBatchNorm with its settings, state
    and mode, one module used twice stays one; other modules are left as they are."""
    from sarc.distributed.batchnorm import sync_batch_norms

    class Own(nn.BatchNorm1d):
        """A subclass: the user's own forward, not replaced."""

    shared = nn.BatchNorm1d(C, eps=1e-3, momentum=0.3)
    with torch.no_grad():
        shared.weight.uniform_(0.5, 1.5)
        shared.running_mean.uniform_(-1, 1)
    shared.num_batches_tracked += 7
    model = nn.Module()
    model.a, model.b = shared, shared
    model.seq = nn.Sequential(nn.Linear(C, C), nn.BatchNorm1d(C, affine=False).eval(),
                              nn.BatchNorm1d(C, track_running_stats=False))
    model.own, model.synced = Own(C), SyncBatchNorm(C)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    names = sync_batch_norms(model)
    assert names == ["a", "seq.1", "seq.2"]
    assert type(model.a) is SyncBatchNorm and model.a is model.b
    assert (model.a.eps, model.a.momentum) == (1e-3, 0.3)
    assert not model.seq[1].affine and not model.seq[1].training
    assert not model.seq[2].track_running_stats
    assert type(model.own) is Own and type(model.seq[0]) is nn.Linear
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
