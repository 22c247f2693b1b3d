"""Where a run trains: one device for the model and everything it reads, and the backend
of the model's sarc layers (one for all of them, or each layer's own).

The inputs are prepared on the CPU and moved once, whole (``sarc.train.Prepared.to``,
``ShardedGraph.to``, ``WorkerData.to``); what a step creates later (a sampled block, an
exchange's buffer, a merge's partials) is made on the device of the tensors it reads.
"""
from __future__ import annotations

import torch
from torch import nn


def placed(model: nn.Module, device: torch.device | str = "cpu",
           backend: str | None = None) -> nn.Module:
    """``model`` on ``device``, every sarc layer in it compiled for ``backend`` ("torch",
    "triton"; an unknown name is an error naming the available ones), or, None, each for
    its own (the ``backend=`` it was made with): those it holds, and those a library conv
    running through sarc by itself (DGL's after ``patch()``) makes at its calls, which read
    the backend it is given here (``BACKEND_OF_MADE_LAYERS``)."""
    from ..dsl import BACKEND_OF_MADE_LAYERS, Layer, backends_named
    for m in model.modules() if backend is not None else ():
        if isinstance(m, Layer):
            m.set_backend(backend)
        held = getattr(type(m).forward, "_sarc_held", None)
        if held is not None:
            for _, layer in held(m):
                layer.set_backend(backend)
            m.__dict__[BACKEND_OF_MADE_LAYERS] = backend
    return model.to(device)



def kernels(model: nn.Module) -> str:
    """The backends of ``model``'s sarc layers, as a run logs and records them: "torch",
    "triton", or "torch+triton" where its layers differ."""
    from ..dsl import BACKEND_OF_MADE_LAYERS, Layer, backends_named
    found = set()
    for m in model.modules():
        if isinstance(m, Layer):
            found.add(m._sarc_backend)
        if getattr(type(m).forward, "_sarc_held", None) is not None:
            found.add(m.__dict__.get(BACKEND_OF_MADE_LAYERS, "torch"))
    return backends_named(found)
