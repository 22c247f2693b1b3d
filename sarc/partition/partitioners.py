"""Node partitioners: which of ``num_parts`` parts owns each node.

Every partitioner has the signature of ``Partitioner`` and returns ``part``,
an int64 tensor with ``part[v]`` in ``0..num_parts-1`` for each node ``v``.
Parts may be empty (more parts than nodes, or METIS's choice).

- ``metis_partition``: METIS k-way, minimizing the edge cut of the symmetrized
  graph, with one balance constraint per node weight, as DistDGL balances its
  partitions: the node count, the in-degree (a part stores the edges into its
  nodes, so this balances edges) and one count per mask (train / val / test).
- ``random_partition``: a seeded, stratified deal: the nodes of each mask
  class are shuffled and dealt round-robin, so every part gets the same
  number of nodes, and of each class, up to one.
"""
from __future__ import annotations

import ctypes
from typing import Mapping, Protocol

import numpy as np
import torch

from ..errors import GraphError


class Partitioner(Protocol):
    def __call__(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int, num_parts: int, *,
                 masks: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> torch.Tensor: ...


def random_partition(src, dst, num_nodes: int, num_parts: int, *,
                     masks: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> torch.Tensor:
    """Balanced random parts: shuffle each mask class, deal the nodes round-robin.

    A node's class is the set of masks it belongs to. Classes are dealt one
    after the other, continuing the round-robin, so both the node count and
    the count of each class differ by at most one between parts.
    """
    src, dst, masks = check_graph_input(src, dst, num_nodes, num_parts, masks)
    gen = torch.Generator().manual_seed(int(seed))
    cls = torch.zeros(num_nodes, dtype=torch.int64)
    for i, m in enumerate(masks.values()):
        cls |= m.to(torch.int64) << i
    shuffled = torch.randperm(num_nodes, generator=gen)
    order = shuffled[torch.argsort(cls[shuffled], stable=True)]  # random within a class
    part = torch.empty(num_nodes, dtype=torch.int64)
    part[order] = torch.arange(num_nodes) % num_parts
    return part


def metis_partition(src, dst, num_nodes: int, num_parts: int, *,
                    masks: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> torch.Tensor:
    """METIS k-way parts of the symmetrized graph, balancing every node weight.

    The weights of node v (``ncon`` constraints, each balanced to within 3%,
    METIS's default ``ufactor``): 1, in_degree(v), then 1 if v is in mask m,
    for each mask. A weight that is zero on every node is dropped (nothing
    to balance). Edge directions, duplicates and self loops do not matter to
    the cut METIS minimizes.
    """
    src, dst, masks = check_graph_input(src, dst, num_nodes, num_parts, masks)
    if num_parts == 1 or num_nodes == 0:
        return torch.zeros(num_nodes, dtype=torch.int64)
    columns = [torch.ones(num_nodes, dtype=torch.int64),
               torch.bincount(dst, minlength=num_nodes),
               *(m.to(torch.int64) for m in masks.values())]
    weights = torch.stack([c for c in columns if bool(c.any())], 1)
    xadj, adjncy = _symmetric_csr(src, dst, num_nodes)
    return torch.from_numpy(_metis_part_graph_kway(xadj, adjncy, weights.numpy(), num_parts, seed))


PARTITIONERS: dict[str, Partitioner] = {"metis": metis_partition, "random": random_partition}
"""The partitioners by the name ``sarc partition --method`` and the metadata use."""


def check_graph_input(src, dst, num_nodes: int, num_parts: int,
                      masks: Mapping[str, torch.Tensor] | None):
    """The edge lists as int64 tensors in range and the masks as bool [N] tensors, or an error."""
    num_nodes = int(num_nodes)
    if num_nodes < 0:
        raise GraphError(f"num_nodes must be non-negative, got {num_nodes}")
    if int(num_parts) < 1:
        raise GraphError(f"num_parts must be at least 1, got {num_parts}")
    src = _index_tensor(src, "src", num_nodes)
    dst = _index_tensor(dst, "dst", num_nodes)
    if src.shape != dst.shape:
        raise GraphError(f"src has {src.numel()} edges but dst has {dst.numel()}")
    checked = {}
    for name, m in (masks or {}).items():
        m = torch.as_tensor(m)
        if m.dtype != torch.bool or m.shape != (num_nodes,):
            raise GraphError(f"mask {name!r} must be a bool tensor of shape [{num_nodes}], "
                             f"got {m.dtype} {list(m.shape)}")
        checked[name] = m
    return src, dst, checked


def _index_tensor(t, name: str, num_nodes: int) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise GraphError(f"{name} must be a 1-d tensor of integer node ids, "
                         f"got {t.dtype} {list(t.shape)}")
    t = t.to(torch.int64)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_nodes):
        bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
        raise GraphError(f"{name} node id {bad} is out of range: the graph has {num_nodes} "
                         f"nodes (ids 0..{num_nodes - 1})")
    return t


def _symmetric_csr(src: torch.Tensor, dst: torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """METIS's input: each undirected edge in both directions, once, no self loops."""
    u, v = torch.cat([src, dst]), torch.cat([dst, src])
    keep = u != v
    keys = torch.unique(u[keep] * n + v[keep])  # sorted, so grouped by u
    xadj = torch.zeros(n + 1, dtype=torch.int64)
    xadj[1:] = torch.cumsum(torch.bincount(keys // n, minlength=n), 0)
    return xadj.numpy(), (keys % n).numpy()


# --- METIS through the library pymetis ships ----------------------------------------------
#
# pymetis.part_graph (2025.2.2) takes ``vweights`` but passes METIS ncon = 1
# whatever their length (its wrapper divides by len(xadj), one more than the
# node count), so a second constraint is silently dropped. The METIS library
# inside pymetis handles ncon > 1 (tested: tests/partition), so sarc calls its
# METIS_PartGraphKway directly. tests/partition checks that the constraints
# take effect, so a pymetis that stops exporting METIS fails loudly there.

_METIS_OK = 1
_METIS_ERRORS = {-2: "input error", -3: "out of memory", -4: "error"}


def _metis_part_graph_kway(xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray,
                           num_parts: int, seed: int) -> np.ndarray:
    lib, idx, options_len, seed_index = _metis()
    n, ncon = weights.shape
    c_idx = ctypes.c_int64 if idx == np.int64 else ctypes.c_int32
    arrays = [np.ascontiguousarray(a, dtype=idx) for a in (xadj, adjncy, weights.reshape(-1))]
    part = np.zeros(n, dtype=idx)
    options = np.zeros(options_len, dtype=idx)
    ptr = ctypes.POINTER(c_idx)
    lib.METIS_SetDefaultOptions(options.ctypes.data_as(ptr))
    options[seed_index] = seed
    nvtxs, c_ncon, nparts, objval = c_idx(n), c_idx(ncon), c_idx(num_parts), c_idx(0)
    rc = lib.METIS_PartGraphKway(
        ctypes.byref(nvtxs), ctypes.byref(c_ncon), *(a.ctypes.data_as(ptr) for a in arrays),
        None, None, ctypes.byref(nparts), None, None, options.ctypes.data_as(ptr),
        ctypes.byref(objval), part.ctypes.data_as(ptr))
    if rc != _METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway failed ({_METIS_ERRORS.get(rc, rc)}) on a graph "
                           f"of {n} nodes, {len(adjncy)} adjacency entries, {ncon} constraints, "
                           f"{num_parts} parts")
    return part.astype(np.int64)


_METIS_LIB = None


def _metis():
    """(library, idx dtype, METIS_NOPTIONS, index of the seed option), loaded once."""
    global _METIS_LIB
    if _METIS_LIB is None:
        try:
            from pymetis import _internal
        except ImportError as e:
            raise ImportError("METIS partitioning needs pymetis (pip install pymetis, or "
                              "sarc[metis]); --method random needs nothing") from e
        lib = ctypes.CDLL(_internal.__file__)
        for fn in (lib.METIS_SetDefaultOptions, lib.METIS_PartGraphKway):
            fn.restype = ctypes.c_int
        idx = np.int64 if _internal._idx_type_width() == 64 else np.int32
        _METIS_LIB = (lib, idx, _internal.Options._len(), _internal.options_indices.SEED)
    return _METIS_LIB
