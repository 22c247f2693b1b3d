"""A DGL partition trained on as it is: ``sarc train MODEL --partition DIR/NAME.json``.

Each worker reads only its own part's files (``dgl_format.read_dgl_part``)
and builds from them the ``Part`` that converting the partition
(``sarc partition --from-dgl``) would have written for it: the same node
range (DGL's shuffled ids are sarc's new ids), edges, order, data and
degrees, so its shard and training are those of the converted set.

A part's files hold its nodes and the edges into them. What else a part
holds is the other parts' to say, and the workers exchange it in two rounds
of ``gather`` (``all_gather_object`` in a run; without one, ``load_part``
reads every part, in one process):

1. each worker's halo (the sources of its edges in other parts) and how many
   of its edges leave each: the owners learn which of their rows each peer
   reads and their nodes' whole-graph out-degree;
2. each owner's out-degree of the rows it sends: the readers learn the
   whole-graph out-degree of their halo.

A worker that cannot read its part says so in the first round: it raises
its error, and the others ``PeerPartError``.

The original ids are those of ``orig_nids.pt`` / ``orig_eids.pt`` beside the
config, as ``--from-dgl`` reads them; without them, DGL's shuffled ids (as
DistDGL trains; ``--from-dgl --dgl-shuffled-ids``). The graph's fingerprint
is not the converted set's (``graph_fingerprint`` needs the whole graph): it
is the sha256 of the config and the id files; a part's digest is that of its
files' names and sizes (DGL records no digest of them).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import PartitionError, SarcError
from .dgl_format import (ORIG_IDS_FILES, DglLayout, DglPart, check_part_entries, dgl_layout,
                         import_dgl, read_dgl_part)
from .foreign import MissingDependencyError
from .parts import Part

Gather = Callable[[object], list]
"""``gather(obj)``: every worker's ``obj``, in rank order (collective)."""


def open_dgl_partition(config) -> "DglPartition":
    """The DGL partition whose config is ``config`` (or the directory holding it), to train
    on in place; a ``MissingDependencyError`` that says to convert it where DGL is missing."""
    layout = dgl_layout(config, default_shuffled=True)
    try:
        import_dgl()
    except MissingDependencyError as e:
        raise MissingDependencyError(
            f"{layout.config}: a DGL partition; training on it in place reads its graph.dgl "
            f"files with DGL, which this environment lacks ({e.__cause__ or e}). Convert it "
            f"first: sarc partition --from-dgl {layout.config} --out DIR, then train with "
            f"--partition DIR") from e
    check_part_entries(layout)
    return DglPartition(layout)


class DglPartition:
    """A DGL partition in place, read as a ``PartitionSet`` is: ``num_parts``,
    ``node_offsets``, ``fingerprint``, ``meta`` (the keys a run records) and ``load_part``."""

    def __init__(self, layout: DglLayout):
        self.layout = layout
        self.path = layout.config
        config = layout.config
        h = hashlib.sha256(config.read_bytes())
        if layout.ids == "original" and layout.num_parts > 1:
            for f in ORIG_IDS_FILES:
                if (config.parent / f).is_file():
                    h.update((config.parent / f).read_bytes())
        parts = []
        for p, (lo, hi) in enumerate(layout.part_ranges):
            files = layout.meta.get(f"part-{p}") or {}
            sizes = {k: _size(config.parent / v) for k, v in sorted(files.items())
                     if isinstance(v, str)}
            digest = hashlib.sha256(json.dumps([p, sizes], sort_keys=True).encode()).hexdigest()
            parts.append({"file": str(files.get("part_graph", f"part{p}")), "sha256": digest,
                          "nodes": [lo, hi]})
        self.meta = {"format": "dgl", "graph": {"fingerprint": "dgl:sha256:" + h.hexdigest(),
                                                "num_nodes": layout.num_nodes,
                                                "num_edges": layout.num_edges},
                     "method": layout.method, "source": layout.source(),
                     "num_parts": layout.num_parts,
                     "node_offsets": [lo for lo, _ in layout.part_ranges] + [layout.num_nodes],
                     "parts": parts,
                     **({"types": layout.types_record({}, {})} if layout.heterogeneous else {})}

    num_parts = property(lambda self: self.layout.num_parts)
    num_nodes = property(lambda self: self.layout.num_nodes)
    num_edges = property(lambda self: self.layout.num_edges)
    fingerprint = property(lambda self: self.meta["graph"]["fingerprint"])
    method = property(lambda self: self.layout.method)
    types = property(lambda self: self.meta.get("types"))
    dataset = None   # DGL's config names the graph, not a dataset sarc loads
    sizes = property(lambda self: {})  # nor its classes: the workers count them
    node_digests = property(lambda self: {})  # nor digests of its node data (a run's record
    #                                           then compares its parts' files)

    @property
    def node_offsets(self) -> torch.Tensor:
        return torch.tensor(self.meta["node_offsets"], dtype=torch.int64)

    def part_path(self, p: int) -> Path:
        return self.path.parent / self.meta["parts"][p]["file"]

    def load_part(self, p: int, gather: Gather | None = None) -> Part:
        """Part ``p``, as the converted set holds it; ``gather`` is the workers' (collective:
        every worker calls it, with its own ``p``), None to read every part here."""
        if not 0 <= p < self.num_parts:
            raise PartitionError(f"{self.path}: no part {p}; the partition has "
                                 f"{self.num_parts} parts (0..{self.num_parts - 1})")
        dgl = import_dgl()
        if gather is None:
            inner = [_Inner.of(self.layout, read_dgl_part(self.layout, dgl, q))
                     for q in range(self.num_parts)]
            halos = [(x.halo, x.halo_edges) for x in inner]
            sent = [x.sent_degrees(halos) for x in inner]
            return inner[p].part(halos, sent, p)
        try:
            mine, said = _Inner.of(self.layout, read_dgl_part(self.layout, dgl, p)), None
        except SarcError as e:
            mine, said = None, str(e)
        first = gather(("error", said) if mine is None else (mine.halo, mine.halo_edges))
        if said is not None:
            raise PartitionError(said)
        failed = [r for r, got in enumerate(first) if got[0] == "error"]
        if failed:
            raise PeerPartError(f"worker {failed[0]}: {first[failed[0]][1]}")
        return mine.part(first, gather(mine.sent_degrees(first)), p)


class PeerPartError(PartitionError):
    """Another worker could not read its part (it raises its own error; the run's
    agreement stops every worker with that one's message)."""


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


@dataclass(frozen=True, eq=False)
class _Inner:
    """A part as its files give it, in sarc's order: edges by destination, then by
    original edge id; and its halo (sorted) with the number of its edges from each."""

    lo: int
    hi: int
    src: torch.Tensor
    dst: torch.Tensor
    orig_eid: torch.Tensor
    orig_nid: torch.Tensor
    node_data: dict
    edge_data: dict
    halo: torch.Tensor
    halo_edges: torch.Tensor
    local_out: torch.Tensor    # out-degree of its nodes counting its own edges only
    offsets: torch.Tensor

    @staticmethod
    def of(layout: DglLayout, part: DglPart) -> "_Inner":
        lo, hi = part.lo, part.hi
        orig_eid = layout.edge_orig(part.eid)
        by_eid = torch.argsort(orig_eid)
        order = by_eid[torch.argsort(part.dst[by_eid], stable=True)]
        src, dst = part.src[order], part.dst[order]
        outside = (src < lo) | (src >= hi)
        halo, halo_edges = torch.unique(src[outside], return_counts=True)
        local_out = torch.bincount(src[~outside] - lo, minlength=hi - lo)
        offsets = torch.tensor([a for a, _ in layout.part_ranges] + [layout.num_nodes])
        return _Inner(lo, hi, src, dst, orig_eid[order], layout.node_orig(torch.arange(lo, hi)),
                      part.node_data, {k: v[order] for k, v in part.edge_data.items()},
                      halo, halo_edges, local_out, offsets)

    def _read_from_me(self, halo: torch.Tensor) -> torch.Tensor:
        """The positions of ``halo`` (a peer's) that are this part's rows."""
        return ((halo >= self.lo) & (halo < self.hi)).nonzero().flatten()

    def out_degree(self, halos) -> torch.Tensor:
        deg = self.local_out.clone()
        for halo, count in halos:
            at = self._read_from_me(halo)
            deg.index_add_(0, halo[at] - self.lo, count[at])
        return deg

    def sent_degrees(self, halos) -> list[torch.Tensor]:
        """Per reader, the whole-graph out-degree of the rows it reads from this part."""
        deg = self.out_degree(halos)
        return [deg[halo[self._read_from_me(halo)] - self.lo] for halo, _ in halos]

    def part(self, halos, sent, p: int) -> Part:
        rows = [torch.zeros(0, dtype=torch.int64) if r == p else
                halo[self._read_from_me(halo)] - self.lo for r, (halo, _) in enumerate(halos)]
        send_offsets = torch.zeros(len(halos) + 1, dtype=torch.int64)
        send_offsets[1:] = torch.cumsum(torch.tensor([r.numel() for r in rows]), 0)
        owner = torch.searchsorted(self.offsets, self.halo, right=True) - 1
        halo_out = torch.empty_like(self.halo)
        for q, degrees in enumerate(sent):
            if q != p:
                halo_out[owner == q] = degrees[p]
        return Part(node_range=torch.tensor([self.lo, self.hi], dtype=torch.int64),
                    orig_node_ids=self.orig_nid, edge_src=self.src, edge_dst=self.dst,
                    orig_edge_ids=self.orig_eid, out_degree=self.out_degree(halos),
                    halo_nodes=self.halo, halo_out_degree=halo_out,
                    send_offsets=send_offsets, send_rows=torch.cat(rows),
                    ndata=dict(self.node_data), edata=self.edge_data)
