"""Counter-based random draws: a uniform number is a pure function of its key.

A draw is ``splitmix64`` chained over the fields of its key (the run's seed, the
epoch, the layer, a node's original id, an edge rank or a draw index, and a tag that
tells the kinds of draws apart), so the sample of a node does not depend on which
worker draws it, in which order, or how many workers there are. Integers are hashed
as unsigned 64-bit words (numpy's ``uint64`` arithmetic wraps, as the hash wants).
"""
from __future__ import annotations

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

NEIGHBOUR_KEY, REPLACEMENT_DRAW, SHUFFLE_KEY, TRAIN_NEGATIVE, EVAL_NEGATIVE = 1, 2, 3, 4, 5
EMBEDDING_INIT = 6
"""Tags of the kinds of draws, so that two kinds never share a key."""


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _words(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.int64).numpy()
    return np.asarray(x, dtype=np.int64).astype(np.uint64)


def hash_keys(*fields) -> np.ndarray:
    """The 64-bit hash of each key (``fields``: ints or equally long 1-d tensors/arrays,
    broadcast against each other)."""
    with np.errstate(over="ignore"):
        h = np.zeros((), dtype=np.uint64)
        for f in fields:
            h = _mix((h + _GOLDEN) ^ _words(f))
    return np.atleast_1d(h)


def uniform(*fields) -> torch.Tensor:
    """A float64 uniform in (0, 1) per key: the top 53 bits of its hash, centred in their cell."""
    h = hash_keys(*fields)
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    return torch.from_numpy(u)


def _mix_in_place(z: np.ndarray, tmp: np.ndarray) -> None:
    """``_mix`` without temporaries (``tmp``: scratch of ``z``'s shape)."""
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        np.right_shift(z, np.uint64(shift), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
        if mult is not None:
            np.multiply(z, mult, out=z)


def uniform_rows(keys, width: int, *fields, chunk: int = 1 << 16) -> torch.Tensor:
    """[len(keys), width] float64 uniforms in (0, 1): row i a pure function of (``fields``,
    ``keys[i]``), its column j the j-th number of a splitmix64 stream seeded by the row's
    hash (a learned embedding's initial rows, drawn by node id on any worker). Computed
    about ``chunk`` numbers at a time, in place."""
    keys = _words(keys).reshape(-1)
    rows = hash_keys(*fields, keys)[:keys.size]
    out = torch.empty(keys.size, width, dtype=torch.float64)
    cols = np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN
    step = max(1, chunk // max(1, width))
    with np.errstate(over="ignore"):
        for a in range(0, keys.size, step):
            z = (rows[a:a + step, None] + cols[None, :]).reshape(-1)
            _mix_in_place(z, np.empty_like(z))
            np.right_shift(z, np.uint64(11), out=z)
            out[a:a + step] = torch.from_numpy(z.astype(np.float64).reshape(-1, width))
    return out.add_(0.5).mul_(2.0 ** -53)
