"""sarc's partition format: a directory with one metadata file and one file per part.

    DIR/metadata.json    format and version, the graph's fingerprint, the method
                         (and, for a converted DGL / PyG partition, its source),
                         the digests of its node data (``node_digests``),
                         num_parts, node_offsets (part p owns new ids
                         node_offsets[p] .. node_offsets[p+1]-1), the node and edge
                         data (dtype, per-row shape), the stats (edge cut, per-part
                         counts, balance), for a heterogeneous graph its types
                         (``foreign.types_record``), and per part: file, sha256,
                         bytes, node range, edge count
    DIR/part-P.pt        ``torch.save`` of ``Part.to_dict()`` (see ``parts``)
    DIR/sarc-set.json    the manifest of every set sarc writes (``sarc.atomic``)

The directory is written atomically (``sarc.atomic``): it appears complete or not
at all, and replaces only a partition set sarc wrote, with ``overwrite``. ``load_partitions`` checks the metadata, that every part file is
there, their sha256 (all up front with ``verify=True``; each file again
whenever it is read) and, given one, the graph's fingerprint. Every problem
is a ``PartitionError`` naming the directory or file.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import torch

from ..version import __version__
from ..errors import PartitionError
from ..atomic import atomic_directory
from ..records import Record, load_plain
from .fingerprint import graph_fingerprint
from .parts import Part
from .relabel import Relabeling
from .stats import PartitionStats

FORMAT = "sarc-partitions"
VERSION = 1
METADATA = "metadata.json"
SET_KIND = "partitions"  # the kind of set in its manifest (``sarc.atomic``)


def part_file_name(p: int) -> str:
    return f"part-{p}.pt"


def write_partitions(path, parts: Iterable[Part], *, relabeling: Relabeling, fingerprint: str,
                     num_edges: int, stats: PartitionStats, method: str, seed: int | None,
                     source: dict | None = None, types: dict | None = None,
                     sizes: Mapping[str, int] | None = None,
                     node_digests: Mapping[str, str] | None = None,
                     overwrite: bool = False) -> "PartitionSet":
    """Write ``parts`` (``relabeling.num_parts`` of them, in order) as a partition set at ``path``.

    ``seed`` is None where the partitioner's seed is unknown (a converted
    foreign set); ``source``, where given, records where a converted partition
    came from (its format and path) and is stored as is; so is ``types``, a
    heterogeneous graph's types (``foreign.types_record``); ``node_digests``, the
    digests of the node data in the original order (``node_data_digests``).
    """
    path = Path(path)
    entries = []
    with atomic_directory(path, kind=SET_KIND, overwrite=overwrite) as tmp:
        for p, part in enumerate(parts):
            buf = io.BytesIO()
            torch.save(part.to_dict(), buf)
            data = buf.getvalue()
            name = part_file_name(p)
            (tmp / name).write_bytes(data)
            entries.append({"file": name, "sha256": hashlib.sha256(data).hexdigest(),
                            "bytes": len(data), "nodes": [part.lo, part.hi],
                            "num_edges": part.num_edges})
            if p == 0:
                schema = {"node_data": _schema(part.ndata), "edge_data": _schema(part.edata)}
        if len(entries) != relabeling.num_parts:
            raise ValueError(f"got {len(entries)} parts for a relabeling into "
                             f"{relabeling.num_parts}")
        meta = {
            "format": FORMAT, "version": VERSION, "created_by": f"sarc {__version__}",
            "graph": {"fingerprint": fingerprint, "num_nodes": relabeling.num_nodes,
                      "num_edges": int(num_edges)},
            "method": method, "seed": None if seed is None else int(seed),
            **({"source": source} if source else {}),
            **({"types": types} if types else {}),
            **({"sizes": {k: int(v) for k, v in sizes.items()}} if sizes else {}),
            **({"node_digests": dict(node_digests)} if node_digests else {}),
            "num_parts": relabeling.num_parts,
            "node_offsets": relabeling.offsets.tolist(),
            **schema,
            "stats": stats.to_json(),
            "parts": entries,
        }
        # The metadata is written last, and the rename that follows is what publishes it all.
        (tmp / METADATA).write_text(json.dumps(meta, indent=1) + "\n")
    return PartitionSet(path, meta)


@dataclass(frozen=True, eq=False)
class PartitionSet:
    """A partition set on disk, its metadata checked; parts are read on demand."""

    path: Path
    meta: dict

    @property
    def num_parts(self) -> int:
        return int(self.meta["num_parts"])

    @property
    def num_nodes(self) -> int:
        return int(self.meta["graph"]["num_nodes"])

    @property
    def num_edges(self) -> int:
        return int(self.meta["graph"]["num_edges"])

    @property
    def fingerprint(self) -> str:
        return self.meta["graph"]["fingerprint"]

    @property
    def method(self) -> str:
        return self.meta["method"]

    @property
    def dataset(self) -> str | None:
        """The name of the dataset partitioned (``partition_graph(..., dataset=)``: ``sarc
        partition --dataset``, ``sarc train --workers P``); None where none was recorded."""
        source = self.meta.get("source")
        name = source.get("dataset") if isinstance(source, dict) else None
        return name if isinstance(name, str) else None

    @property
    def sizes(self) -> dict[str, int]:
        """The dataset's declared classes and types (``partition_graph(..., sizes=)``); empty
        where none were recorded (the workers then count them from the data)."""
        return dict(self.meta.get("sizes") or {})

    @property
    def node_digests(self) -> dict[str, str]:
        """The digests of the node data partitioned, in the original order (features,
        labels, splits: ``node_data_digests``); empty where none were recorded (a set of an
        older sarc, or converted from DGL or PyG)."""
        return dict(self.meta.get("node_digests") or {})

    @property
    def node_offsets(self) -> torch.Tensor:
        """[P + 1] int64: part p owns new ids node_offsets[p] .. node_offsets[p+1]-1."""
        return torch.tensor(self.meta["node_offsets"], dtype=torch.int64)

    @property
    def types(self) -> dict | None:
        """A heterogeneous graph's types (``foreign.types_record``); None for one type."""
        return self.meta.get("types")

    @property
    def stats(self) -> PartitionStats:
        return PartitionStats.from_json(self.meta["stats"])

    def part_path(self, p: int) -> Path:
        return self.path / self.meta["parts"][p]["file"]

    def load_part(self, p: int, gather=None) -> Part:
        """Part ``p``, its file checked against the sha256 in the metadata (a part file
        holds all a worker needs: ``gather``, for the sources that exchange, is unused)."""
        if not 0 <= p < self.num_parts:
            raise PartitionError(f"{self.path}: no part {p}; the set has {self.num_parts} parts "
                                 f"(0..{self.num_parts - 1})")
        entry = self.meta["parts"][p]
        file = self.part_path(p)
        data = _read_checked(file, entry["sha256"])
        # the sha256 matched: the writer wrote something torch.load rejects
        d = load_plain(io.BytesIO(data), f"{file}: cannot be read as a partition file",
                       PartitionError)
        part = Part.from_dict(d, str(file))
        if [part.lo, part.hi] != list(entry["nodes"]):
            raise PartitionError(f"{file}: holds nodes [{part.lo}, {part.hi}), the metadata says "
                                 f"{entry['nodes']}")
        if part.num_edges != entry.get("num_edges", part.num_edges):
            raise PartitionError(f"{file}: holds {part.num_edges} edges, the metadata says "
                                 f"{entry['num_edges']} (a part of another graph?)")
        return part

    def check_graph(self, src, dst, num_nodes: int) -> None:
        """Raise unless this set was cut from the graph (``src``, ``dst``, ``num_nodes``)."""
        check_fingerprint(self, graph_fingerprint(src, dst, num_nodes))


def check_fingerprint(pset: PartitionSet, fingerprint: str) -> None:
    if pset.fingerprint != fingerprint:
        raise PartitionError(f"{pset.path}: the partitions are of another graph (their "
                             f"fingerprint is {pset.fingerprint}, the graph's is {fingerprint})")


PYG_META = "META.json"
"""PyG's ``Partitioner`` writes its partition's description here."""


def refuse_foreign(path: Path) -> None:
    """A PyG partition given where a sarc set is read: say so, and how to convert it."""
    if (path / PYG_META).is_file() and not (path / METADATA).exists():
        raise PartitionError(f"{path} is a PyG partition ({PYG_META}), not a sarc partition "
                             f"set: convert it with `sarc partition --from-pyg {path} --out "
                             f"SET`, then give SET")


def load_partitions(path, *, fingerprint: str | None = None, verify: bool = True) -> PartitionSet:
    """Open the partition set at ``path``, checking it is complete and intact.

    ``fingerprint``: the graph's (``graph_fingerprint``), checked against the
    set's. ``verify=False`` skips hashing every part file up front (a worker
    that reads one part); each file is still hashed when it is read.
    """
    path = Path(path)
    if not path.is_dir():
        raise PartitionError(f"{path}: no partition set here (not a directory)")
    meta_file = path / METADATA
    if not meta_file.is_file():
        refuse_foreign(path)
        raise PartitionError(f"{path}: not a partition set: {METADATA} is missing")
    try:
        meta = json.loads(meta_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise PartitionError(f"{meta_file}: corrupt metadata: {e}") from e
    _check_metadata(meta, meta_file)
    pset = PartitionSet(path, meta)
    for p, entry in enumerate(meta["parts"]):
        file = pset.part_path(p)
        if not file.is_file():
            raise PartitionError(f"{file}: partition file {entry['file']} is missing from {path}")
        if verify:
            _read_checked(file, entry["sha256"])
    if fingerprint is not None:
        check_fingerprint(pset, fingerprint)
    return pset


# What metadata.json holds, field by field: the kind each must be ("?": may be absent;
# ``sarc.records``). ``_check_metadata`` checks every field here before anything reads one.
_META_SCHEMA = {"graph": "object", "graph.fingerprint": "str", "graph.num_nodes": "count",
                "graph.num_edges": "count", "method": "str", "num_parts": "positive",
                "node_offsets": "counts", "parts": "list", "stats": "object",
                "stats.num_edges": "count", "stats.edge_cut": "count", "stats.counts": "object",
                "node_data": "object?", "edge_data": "object?", "source": "object?",
                "types": "object?", "sizes": "object?", "sizes.num_classes": "count?",
                "sizes.num_etypes": "count?", "sizes.num_ntypes": "count?",
                "node_digests": "object?", "node_digests.feat": "str?",
                "node_digests.label": "str?", "node_digests.train_mask": "str?",
                "node_digests.val_mask": "str?", "node_digests.test_mask": "str?"}
_PART_SCHEMA = {"file": "str", "sha256": "sha256", "nodes": "range", "num_edges": "count?",
                "bytes": "count?"}


def _check_metadata(meta, meta_file: Path) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PartitionError(f"{meta_file}: not a sarc partition set (format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != VERSION:
        raise PartitionError(f"{meta_file}: partition format version {meta.get('version')!r}; "
                             f"this sarc reads version {VERSION} (partition the graph again)")
    record = Record(f"{meta_file}: corrupt metadata", PartitionError)
    record.check_fields(meta, _META_SCHEMA)
    num_parts, offsets, parts = meta["num_parts"], meta["node_offsets"], meta["parts"]
    for p, entry in enumerate(parts):
        record.check_value(entry, "object", f"parts[{p}]")
        record.check_fields(entry, _PART_SCHEMA, f"parts[{p}].")
    if len(parts) != num_parts or len(offsets) != num_parts + 1:
        raise PartitionError(f"{meta_file}: corrupt metadata: num_parts={num_parts} but "
                             f"{len(parts)} part entries and {len(offsets)} node offsets")
    num_nodes = meta["graph"]["num_nodes"]
    if offsets[0] != 0 or offsets[-1] != num_nodes or any(
            a > b for a, b in zip(offsets, offsets[1:])):
        raise PartitionError(f"{meta_file}: corrupt metadata: node_offsets {offsets} do not "
                             f"cover 0..{num_nodes} in order")
    names = set()
    for p, entry in enumerate(parts):
        name = entry["file"]
        if not name or Path(name).name != name or name in (METADATA, "..") or name in names:
            raise PartitionError(f"{meta_file}: corrupt metadata: bad part file name {name!r} "
                                 f"(parts[{p}].file)")
        names.add(name)
        if entry["nodes"] != offsets[p:p + 2]:
            raise PartitionError(f"{meta_file}: corrupt metadata: parts[{p}].nodes is "
                                 f"{entry['nodes']}, node_offsets give part {p} "
                                 f"{offsets[p:p + 2]}")
    counts = meta["stats"]["counts"]
    if "nodes" not in counts:
        raise PartitionError(f"{meta_file}: corrupt metadata, lacks stats.counts.nodes")
    for key, c in counts.items():
        record.check_value(c, "counts", f"stats.counts.{key}")
        if len(c) != num_parts:
            raise PartitionError(f"{meta_file}: corrupt metadata: stats.counts.{key} has "
                                 f"{len(c)} counts for {num_parts} parts")


def _read_checked(file: Path, sha256: str) -> bytes:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise PartitionError(f"{file}: partition file is missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise PartitionError(f"{file}: partition file is corrupt (sha256 {digest}, the metadata "
                             f"says {sha256})")
    return data


def _schema(data: Mapping[str, torch.Tensor]) -> dict:
    """Each tensor's dtype and per-row shape."""
    return {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape[1:])}
            for k, t in data.items()}
