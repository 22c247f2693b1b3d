"""Graphs and blocks as layers see them: edges from source to destination nodes.

A ``Graph`` is a bipartite block (``num_src`` source nodes, ``num_dst``
destination nodes; a full graph has ``num_src == num_dst``), with its edges
stored sorted by destination (CSR). Destination nodes are the first
``num_dst`` source nodes, the convention of DGL's message flow graphs, so a
node feature tensor has ``num_src`` rows and its first ``num_dst`` rows are
the destination rows.

A *split* block (``dst_in_src=False``) drops that convention: its source rows
are not its destination rows, so ``num_dst`` may exceed ``num_src`` and the
destination features are held apart from the source features. A worker's
block of edges from another shard's nodes into its own nodes is one (see
``sarc.runtime.sharded``); a layer does not run on it directly.

Edge data handed to a layer is in the order the edges were given;
``Graph.perm`` maps it to CSR order.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from .errors import GraphAttributeError, GraphError

T = TypeVar("T")

_MISSING_ATTRIBUTE_HOOKS: list[Callable[[object, str], None]] = []


def on_missing_attribute(hook: Callable[[object, str], None]) -> None:
    """Call ``hook(graph, name)`` when code reads an attribute a graph layers run on (a
    ``Graph``, a worker's ``DistGraph``) lacks, before the AttributeError: a front end's
    hint (``frontends.dgl.patch``: a DGLGraph method called on a sarc graph)."""
    if hook not in _MISSING_ATTRIBUTE_HOOKS:
        _MISSING_ATTRIBUTE_HOOKS.append(hook)


def off_missing_attribute(hook: Callable[[object, str], None]) -> None:
    """Stop calling ``hook`` (``on_missing_attribute``'s); a hook not installed is ignored."""
    if hook in _MISSING_ATTRIBUTE_HOOKS:
        _MISSING_ATTRIBUTE_HOOKS.remove(hook)


def missing_attribute(graph, name: str):
    """``__getattr__`` of the graphs layers run on: the hooks, then the AttributeError (the
    class's ``WHY_NOT`` reason for ``name`` where it gives one)."""
    for hook in _MISSING_ATTRIBUTE_HOOKS:
        hook(graph, name)
    why = getattr(type(graph), "WHY_NOT", {}).get(name)
    raise GraphAttributeError(why or f"{type(graph).__name__!r} object has no attribute {name!r}")


@dataclass(frozen=True, eq=False)
class Graph:
    num_src: int
    num_dst: int
    src: torch.Tensor        # [E] int64, CSR order
    dst: torch.Tensor        # [E] int64, CSR order (non-decreasing)
    perm: torch.Tensor       # [E] int64: CSR edge i is input edge perm[i]
    rowptr: torch.Tensor     # [num_dst + 1] int64
    in_degree: torch.Tensor  # [num_dst] float32, edges into each dst node
    out_degree: torch.Tensor  # [num_src] float32, edges out of each src node
    dst_in_src: bool = True  # dst nodes are the first num_dst src nodes (False: a split block)
    src_in_degree: torch.Tensor | None = None  # [num_src] float32, see source_in_degree

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    @property
    def source_in_degree(self) -> torch.Tensor | None:
        """[num_src] the in-degree of every source node (``src.in_degree``): ``in_degree``
        where every source is a destination, else what the block was built with (a
        mini-batch block: its sources' in-degrees in the whole graph), else None (not
        known: their in-edges are not in the block)."""
        if self.src_in_degree is not None:
            return self.src_in_degree
        return self.in_degree if self.num_src == self.num_dst and self.dst_in_src else None

    @property
    def input_dst(self) -> torch.Tensor:
        """[E] each edge's destination in the order the edges were given, the order of an
        edge input (``dst`` is in CSR order): what a per-edge quantity a model computes
        from ``g`` indexes, ``1 / g.in_degree[g.input_dst]``."""
        return torch.empty_like(self.dst).index_copy_(0, self.perm, self.dst)

    def input_edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` in the order the edges were given (their edge data's order), not
        CSR order."""
        order = torch.empty_like(self.perm)
        order[self.perm] = torch.arange(self.num_edges, device=self.perm.device)
        return self.src.index_select(0, order), self.dst.index_select(0, order)

    def num_src_nodes(self) -> int:
        """``num_src`` by DGL's name: a DGL user's mini-batch loop slices its features as
        ``h[:block.num_dst_nodes()]`` on the block it got from ``from_dgl``."""
        return self.num_src

    def num_dst_nodes(self) -> int:
        """``num_dst`` by DGL's name (``num_src_nodes``)."""
        return self.num_dst

    __getattr__ = missing_attribute

    def run_layer(self, layer, args: tuple, feats: dict):
        """``layer(g, ...)`` on this block: the layer's compiled kernel (``Layer.run_local``)."""
        return layer.run_local(self, args, feats)

    @staticmethod
    def from_edges(src, dst, num_nodes: int | None = None, *, num_src: int | None = None,
                   num_dst: int | None = None, out_degree=None, in_degree=None,
                   dst_in_src: bool = True, src_in_degree=None) -> "Graph":
        """Build a graph (``num_nodes``) or a block (``num_src``, ``num_dst``).

        ``out_degree``/``in_degree`` override the degrees counted on these edges,
        for a block cut from a larger graph whose layers normalize by the
        degrees of the whole graph; ``src_in_degree`` gives a block's sources'
        in-degrees there (``src.in_degree``, which the block's edges do not count).
        ``dst_in_src=False`` builds a split block, whose dst nodes are not among its
        src nodes (any ``num_dst``).
        """
        src = _as_index(src, "src")
        dst = _as_index(dst, "dst")
        if src.shape != dst.shape:
            raise GraphError(f"src has {src.numel()} edges but dst has {dst.numel()}")
        if num_nodes is not None:
            if num_src is not None or num_dst is not None:
                raise GraphError("give either num_nodes or num_src/num_dst, not both")
            num_src = num_dst = _count(num_nodes, "num_nodes")
        if num_src is None or num_dst is None:
            raise GraphError("the node counts are required: num_nodes, or num_src and num_dst")
        num_src, num_dst = _count(num_src, "num_src"), _count(num_dst, "num_dst")
        if dst_in_src and num_dst > num_src:
            raise GraphError(f"a block has at most as many dst nodes as src nodes "
                             f"(dst nodes are the first src nodes); got num_dst={num_dst} "
                             f"> num_src={num_src} (a block whose dst nodes are not src "
                             f"nodes is built with dst_in_src=False)")
        if num_src < 0 or num_dst < 0:
            raise GraphError("node counts must be non-negative")
        _check_range(src, num_src, "src")
        _check_range(dst, num_dst, "dst")
        if dst.numel() < 2 or bool((dst[1:] >= dst[:-1]).all()):  # already in CSR order
            # copies: the kernels index rows by these edges, checked in range above, so the
            # graph must not share them with the caller's tensors (changed afterwards)
            dst_sorted, perm = dst.clone(), torch.arange(dst.numel(), device=dst.device)
            src_sorted = src.clone()
        else:
            dst_sorted, perm = torch.sort(dst, stable=True)
            src_sorted = src[perm]
        counts = torch.bincount(dst_sorted, minlength=num_dst)
        rowptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=dst.device)
        rowptr[1:] = torch.cumsum(counts, 0)
        in_deg = counts.to(torch.float32) if in_degree is None else _degree(in_degree, num_dst, "in_degree")
        out_deg = (torch.bincount(src, minlength=num_src).to(torch.float32)
                   if out_degree is None else _degree(out_degree, num_src, "out_degree"))
        src_in = None if src_in_degree is None else _degree(src_in_degree, num_src,
                                                              "src_in_degree")
        return Graph(num_src, num_dst, src_sorted, dst_sorted, perm, rowptr, in_deg, out_deg,
                     bool(dst_in_src), src_in)

    def to(self, device) -> "Graph":
        tensors = (t.to(device) for t in (
            self.src, self.dst, self.perm, self.rowptr, self.in_degree, self.out_degree))
        src_in = None if self.src_in_degree is None else self.src_in_degree.to(device)
        return Graph(self.num_src, self.num_dst, *tensors, self.dst_in_src, src_in)

    @property
    def device(self) -> torch.device:
        return self.src.device

    def __repr__(self) -> str:
        split = "" if self.dst_in_src else ", dst_in_src=False"
        return f"Graph(num_src={self.num_src}, num_dst={self.num_dst}, num_edges={self.num_edges}{split})"


_DERIVED: "weakref.WeakKeyDictionary[Graph, dict]" = weakref.WeakKeyDictionary()


def derived(g: Graph, key, x: torch.Tensor, build: Callable[[], T]) -> T:
    """What ``build()`` makes of ``g`` and its tensor ``x`` (an edge input: type ids), kept
    with the graph under ``key`` while ``x`` is the same tensor, unchanged: one per key, so
    steps on one graph build it once and another tensor replaces it."""
    cache = _DERIVED.setdefault(g, {})
    hit = cache.get(key)
    if hit is None or hit[0] is not x or hit[1] != x._version:
        hit = cache[key] = (x, x._version, build())
    return hit[2]


def _as_index(t, name: str) -> torch.Tensor:
    t = t if isinstance(t, torch.Tensor) else torch.as_tensor(t)  # a tensor keeps its device
    if t.dim() != 1:
        raise GraphError(f"{name} must be a 1-d tensor of node ids, got shape {list(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise GraphError(f"{name} node ids must be integers, got {t.dtype}")
    t = t.to(torch.int64)
    if type(t) is not torch.Tensor:   # a subclass (PyG's EdgeIndex rows, torch_geometric.Index,
        plain = torch.empty(t.shape, dtype=t.dtype, device=t.device)  # wrappers whose
        t = plain.copy_(t)   # data_ptr() is 0): the graph's own plain copy of its ids
    return t


def _count(n, what: str) -> int:
    """A node count as an int: an integer (a Python, numpy or 0-d integer tensor one), never
    a float or a bool rounded to one."""
    if isinstance(n, bool) or not (isinstance(n, int) or _integral_scalar(n)):
        raise GraphError(f"{what} must be an integer node count, got {n!r}")
    return int(n)


def _integral_scalar(n) -> bool:
    if isinstance(n, torch.Tensor):
        return n.dim() == 0 and not n.is_floating_point() and not n.is_complex() \
            and n.dtype != torch.bool
    return type(n).__module__ == "numpy" and getattr(n, "shape", None) == () \
        and getattr(n.dtype, "kind", None) in ("i", "u")


def _check_range(ids: torch.Tensor, n: int, name: str) -> None:
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise GraphError(f"{name} node id {bad} is out of range: the graph has {n} "
                         f"{name} nodes (ids 0..{n - 1})")


def _degree(t, n: int, name: str) -> torch.Tensor:
    t = (t if isinstance(t, torch.Tensor) else torch.as_tensor(t)).to(torch.float32)
    if t.shape != (n,):
        raise GraphError(f"{name} must have one entry per node ({n}), got shape {list(t.shape)}")
    return t
