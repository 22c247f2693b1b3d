"""``torch.autocast`` as sarc reads it: whether it is on for a device type, and its dtype,
on every torch sarc runs on (one query per device type before torch 2.4)."""
from __future__ import annotations

import torch


def cast_by_autocast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """IR op ``cast(x, dtype, autocast=True)``: ``x`` in autocast's low dtype where autocast
    is on for its device (as autocast casts the operands of a matmul it runs low, a
    linear's bias among them; not a double), in ``dtype`` otherwise."""
    on, low = autocast_state(x.device.type)
    if on and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(low)
    return x.to(dtype)


def autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    """(enabled, dtype) of ``torch.autocast`` on ``device_type`` (``cpu``, ``cuda``): what a
    backward that recomputes a forward must run under to compute the same values."""
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # torch < 2.4
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
