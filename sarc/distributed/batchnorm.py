"""Batch normalization over the nodes of every worker: global statistics.

``SyncBatchNorm(C)`` normalizes a worker's rows ``x: [n_local, C]`` with the mean
and variance of the rows of *all* workers, as ``torch.nn.BatchNorm1d`` on the
whole graph would:

    forward:  one all-reduce of (sum x, sum x^2, n);  mean, biased var;
              y = gamma (x - mean) / sqrt(var + eps) + beta
    backward: one all-reduce of (sum dxh, sum dxh * xh), dxh = dy gamma:
              dx = (dxh - (sum dxh + xh sum dxh xh) / N) / sqrt(var + eps)

gamma's and beta's gradients are this worker's sums; the trainer's gradient
all-reduce (``sarc.distributed.train.allreduce_gradients``) adds them up. The running
statistics follow BatchNorm1d (momentum, the unbiased variance) and are the same
on every worker; eval mode uses them and communicates nothing. Without an
initialized process group it is a plain BatchNorm1d, so one model file serves
single-process and distributed training. A worker's trainer makes every plain
``nn.BatchNorm1d`` of the model one (``sync_batch_norms``): over a worker's rows alone
its statistics would be another's than the whole graph's, and P workers would not train
as one process.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..backward_once import once_differentiable
from .graph import comm_device


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    dev = comm_device(group)
    buf = t.to(dev)
    dist.all_reduce(buf, group=group)
    return buf.to(t.device)


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, group):
        c = x.shape[1]
        stats = torch.cat([x.sum(0), (x * x).sum(0),
                           torch.tensor([float(x.shape[0])], dtype=x.dtype, device=x.device)])
        stats = _all_reduce(stats, group)
        n = stats[-1]
        mean = stats[:c] / n.clamp(min=1)
        var = (stats[c:2 * c] / n.clamp(min=1) - mean * mean).clamp(min=0)
        invstd = torch.rsqrt(var + eps)
        xh = (x - mean) * invstd
        ctx.save_for_backward(xh, invstd, weight)
        ctx.n, ctx.group = n, group
        y = xh * weight + bias if weight is not None else xh
        unbiased = var * n / (n - 1).clamp(min=1)
        ctx.mark_non_differentiable(mean, unbiased)
        return y, mean, unbiased

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _mean, _var):
        xh, invstd, weight = ctx.saved_tensors
        dxh = dy * weight if weight is not None else dy
        sums = _all_reduce(torch.cat([dxh.sum(0), (dxh * xh).sum(0)]), ctx.group)
        c = xh.shape[1]
        dx = (dxh - (sums[:c] + xh * sums[c:]) / ctx.n.clamp(min=1)) * invstd
        dw = (dy * xh).sum(0) if weight is not None else None
        db = dy.sum(0) if weight is not None else None
        return dx, dw, db, None, None


class SyncBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d whose batch is the rows of every worker of ``group`` (default: the world)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not dist.is_available() or not dist.is_initialized() or x.dim() != 2:
            return super().forward(x)
        if not self.training and self.track_running_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        y, mean, var = _SyncBN.apply(x, self.weight, self.bias, self.eps, self.group)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(mean, alpha=m)
                self.running_var.mul_(1 - m).add_(var, alpha=m)
        return y


def sync_batch_norms(model: nn.Module, group=None) -> list[str]:
    """Each plain ``nn.BatchNorm1d`` of ``model`` replaced, in place, by a ``SyncBatchNorm``
    over ``group`` with its settings, parameters, running statistics and mode (one
    module used in two places stays one); the names of those replaced."""
    made: dict[int, SyncBatchNorm] = {}
    names = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent._modules.items()):  # a shared module at each name
            if type(child) is not nn.BatchNorm1d:
                continue
            if id(child) not in made:
                sync = SyncBatchNorm(child.num_features, child.eps, child.momentum,
                                     child.affine, child.track_running_stats, group=group)
                sync.load_state_dict(child.state_dict())
                made[id(child)] = sync.train(child.training)
                names.append(f"{parent_name}.{name}" if parent_name else name)
            setattr(parent, name, made[id(child)])
    return names
