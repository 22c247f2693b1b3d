"""What one part of a partitioned graph holds, and how the parts are cut from the graph.

Node ids are the new (relabeled) global ids, so part p owns the contiguous
range ``node_range = (lo, hi)``. A part holds:

- ``edge_src``, ``edge_dst``: the edges whose destination it owns, sorted by
  destination (stable, so in original order within a destination); sources
  anywhere. ``orig_edge_ids`` are their positions in the original edge list.
- ``orig_node_ids``: the original id of each owned node.
- ``out_degree``: the whole graph's out-degree of each owned node (the
  in-degree is the count of its edges here: a node's in-edges all live with it).
- ``halo_nodes``: the distinct sources it reads from other parts (sorted),
  with their whole-graph ``halo_out_degree``.
- ``send_rows``, grouped by peer (``send_offsets``, ``P + 1`` entries): the
  owned rows (local ids, ``id - lo``) each other part has among its halo nodes,
  each listed once, sorted, so a worker knows what to send without reading
  the other parts.
- ``ndata``: per-node data of the owned nodes; ``edata``: per-edge data of
  its edges, in the order above.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator, Mapping

import torch

from ..errors import PartitionError
from .relabel import Relabeling

INDEX_FIELDS = ("node_range", "orig_node_ids", "edge_src", "edge_dst", "orig_edge_ids", "out_degree",
                "halo_nodes", "halo_out_degree", "send_offsets", "send_rows")


@dataclass(frozen=True, eq=False)
class Part:
    node_range: torch.Tensor       # [2] int64: owns new ids lo .. hi-1
    orig_node_ids: torch.Tensor    # [n] int64
    edge_src: torch.Tensor         # [e] int64, new global ids
    edge_dst: torch.Tensor         # [e] int64, new global ids in [lo, hi), non-decreasing
    orig_edge_ids: torch.Tensor    # [e] int64
    out_degree: torch.Tensor       # [n] int64, whole-graph out-degree of the owned nodes
    halo_nodes: torch.Tensor       # [h] int64, sorted new global ids outside [lo, hi)
    halo_out_degree: torch.Tensor  # [h] int64
    send_offsets: torch.Tensor     # [P + 1] int64
    send_rows: torch.Tensor        # [s] int64, local row ids, grouped by peer
    ndata: dict[str, torch.Tensor]
    edata: dict[str, torch.Tensor]

    @property
    def lo(self) -> int:
        return int(self.node_range[0])

    @property
    def hi(self) -> int:
        return int(self.node_range[1])

    @property
    def num_nodes(self) -> int:
        return self.hi - self.lo

    @property
    def num_edges(self) -> int:
        return int(self.edge_src.numel())

    def in_degree(self) -> torch.Tensor:
        """The whole-graph in-degree of the owned nodes (int64)."""
        return torch.bincount(self.edge_dst - self.lo, minlength=self.num_nodes)

    def send_rows_to(self, peer: int) -> torch.Tensor:
        """The owned rows (local ids) part ``peer`` reads."""
        return self.send_rows[int(self.send_offsets[peer]):int(self.send_offsets[peer + 1])]

    def to_dict(self) -> dict:
        """The plain dict of tensors stored in a part file."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(d, where: str) -> "Part":
        """A part read back from a file, checked for the fields and dtypes it must have."""
        if not isinstance(d, dict):
            raise PartitionError(f"{where}: not a partition file (holds {type(d).__name__}, "
                                 f"expected a dict of tensors)")
        missing = [f.name for f in fields(Part) if f.name not in d]
        if missing:
            raise PartitionError(f"{where}: partition file lacks {', '.join(missing)}")
        for name in INDEX_FIELDS:
            t = d[name]
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1:
                raise PartitionError(f"{where}: {name} must be a 1-d int64 tensor")
        for group in ("ndata", "edata"):
            if not isinstance(d[group], dict) or not all(
                    isinstance(t, torch.Tensor) for t in d[group].values()):
                raise PartitionError(f"{where}: {group} must be a dict of tensors")
        return Part(**{f.name: d[f.name] for f in fields(Part)})


def cut_parts(src: torch.Tensor, dst: torch.Tensor, relabeling: Relabeling,
              node_data: Mapping[str, torch.Tensor], edge_data: Mapping[str, torch.Tensor]
              ) -> Iterator[Part]:
    """The parts of the graph (original ids ``src``, ``dst``) under ``relabeling``, in order.

    Node and edge data are in the original order; each part gets its rows.
    """
    n, num_parts = relabeling.num_nodes, relabeling.num_parts
    offsets = relabeling.offsets
    s, d = relabeling.orig_to_new[src], relabeling.orig_to_new[dst]
    order = torch.argsort(d, stable=True)  # edges grouped by the part owning dst
    s, d = s[order], d[order]
    edge_offsets = torch.searchsorted(d, offsets)
    out_degree = torch.bincount(s, minlength=n)
    halo_of, send_from = _halo_and_send(s, d, relabeling)
    for p in range(num_parts):
        lo, hi = int(offsets[p]), int(offsets[p + 1])
        e = slice(int(edge_offsets[p]), int(edge_offsets[p + 1]))
        # Slices are cloned: torch.save writes a view's whole storage.
        orig_nodes = relabeling.new_to_orig[lo:hi].clone()
        halo = halo_of[p].clone()
        sent = send_from[p]
        yield Part(
            node_range=torch.tensor([lo, hi], dtype=torch.int64),
            orig_node_ids=orig_nodes,
            edge_src=s[e].clone(), edge_dst=d[e].clone(), orig_edge_ids=order[e].clone(),
            out_degree=out_degree[lo:hi].clone(),
            halo_nodes=halo, halo_out_degree=out_degree[halo],
            send_offsets=sent[0], send_rows=sent[1] - lo,
            ndata={k: v.index_select(0, orig_nodes) for k, v in node_data.items()},
            edata={k: v.index_select(0, order[e]) for k, v in edge_data.items()},
        )


def halo_pairs(src: torch.Tensor, dst: torch.Tensor, part: torch.Tensor, num_nodes: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(reader, node): part ``reader`` reads ``node`` of another part, each pair once,
    sorted by (reader, node). ``part[v]`` is the part of node v."""
    cross = part[src] != part[dst]
    pairs = torch.unique(part[dst][cross] * num_nodes + src[cross])
    return pairs // num_nodes, pairs % num_nodes


def _halo_and_send(s: torch.Tensor, d: torch.Tensor, relabeling: Relabeling):
    """Per part: its halo nodes; and what it sends: (offsets by peer, global ids).

    Sorted by (reader j, node u), the halo pairs give each part's halo; sorted
    by (part of u, j, u), they give each part's send lists grouped by peer.
    """
    n, num_parts = relabeling.num_nodes, relabeling.num_parts
    j, u = halo_pairs(s, d, relabeling.part_of(torch.arange(n)), n)
    halo_of = torch.split(u, torch.bincount(j, minlength=num_parts).tolist())
    pu = relabeling.part_of(u)
    by_sender = torch.argsort((pu * num_parts + j) * n + u)
    j_sorted, u_sorted = j[by_sender], u[by_sender]
    sent_counts = torch.bincount(pu, minlength=num_parts).tolist()
    send_from = []
    for js, us in zip(torch.split(j_sorted, sent_counts), torch.split(u_sorted, sent_counts)):
        offsets = torch.zeros(num_parts + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.bincount(js, minlength=num_parts), 0)
        send_from.append((offsets, us))
    return halo_of, send_from
