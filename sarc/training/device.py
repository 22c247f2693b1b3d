"""Where a run trains: one device for the model and everything it reads, one backend for
every sarc layer of the model.

The inputs are prepared on the CPU and moved once, whole (``sarc.train.Prepared.to``,
``ShardedGraph.to``, ``WorkerData.to``); what a step creates later (a sampled block, an
exchange's buffer, a merge's partials) is made on the device of the tensors it reads.
"""
from __future__ import annotations

import torch
from torch import nn


def placed(model: nn.Module, device: torch.device | str = "cpu",
           backend: str = "torch") -> nn.Module:
    """``model`` on ``device``, every sarc layer in it compiled for ``backend`` ("torch",
    "triton"; an unknown name is an error naming the available ones)."""
    from ..dsl import Layer
    for m in model.modules():
        if isinstance(m, Layer):
            m.set_backend(backend)
    return model.to(device)
