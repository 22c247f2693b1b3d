"""Deterministic dropout: a mask is a function of (seed, key, shape, device).

A layer call in training draws one integer seed (``draw_seed``, from torch's
global RNG, so ``torch.manual_seed`` still governs it); every DROPOUT value
carries a ``key`` attribute, set when it is traced, that passes keep. The mask
of a dropout is drawn from a generator seeded with the pair (seed, key). So
recomputing a dropout regenerates its mask, which is what lets a backward
function rematerialize the forward values it needs (``sarc.ir.autodiff``), and
the interpreter and every backend agree given the same seed.

    keep = uniform[0, 1) >= p          (a float32 draw, whatever the value's dtype)
    y    = x * (keep / (1 - p))

The backward of a dropout is the same dropout of the cotangent (same key, same
seed): ``dx = dy * (keep / (1 - p))``.
"""
from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finalizer: nearby inputs give unrelated outputs."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def mask_seed(seed: int, key: int) -> int:
    """The generator seed of dropout ``key`` in a call seeded ``seed`` (63 bits)."""
    return _mix(_mix(int(seed)) ^ int(key)) >> 1


def draw_seed() -> int:
    """One call's seed, drawn from torch's global RNG."""
    return int(torch.randint(0, 2**62, (1,)).item())


def draws_masks(fn) -> bool:
    """Whether function ``fn`` (its fused ops' regions included) has a dropout: a training
    call of a layer without one draws no seed, so the script's random stream (its own
    dropout between layers) is what it would be with the library's layers."""
    from .function import Region
    from .ops import Op
    todo = [fn.values]
    while todo:
        for v in todo.pop():
            if v.op is Op.DROPOUT:
                return True
            todo.extend(r.values for r in v.attr.values() if isinstance(r, Region))
    return False


def call_seed(draws: bool, training: bool, seed: int | None) -> int | None:
    """A call's seed: the one given, else, for a training call of a function with dropout
    (``draws``: ``draws_masks``), one drawn from torch's RNG; a call that draws no mask
    draws none."""
    return draw_seed() if training and seed is None and draws else seed


def dropout_scale(shape, p: float, seed: int, key: int, device, dtype) -> torch.Tensor:
    """The multiplier of dropout ``key``: ``keep / (1 - p)`` with ``keep ~ Bernoulli(1 - p)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(mask_seed(seed, key))
    keep = torch.rand(tuple(shape), generator=gen, device=device, dtype=torch.float32) >= p
    return keep.to(dtype) / (1.0 - p)


def dropout(x: torch.Tensor, p: float, seed: int | None, key: int, training: bool) -> torch.Tensor:
    """Dropout of ``x`` with rate ``p``; the identity when not training or ``p == 0``."""
    if not training or p == 0.0:
        return x
    if seed is None:
        raise ValueError("dropout in training needs the call's seed (sarc.ir.rng.draw_seed)")
    return x * dropout_scale(x.shape, p, seed, key, x.device, x.dtype)
