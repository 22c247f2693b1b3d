"""What ``sarc train --partition`` names: a sarc partition set, or a DGL partition in place.

    open_partition(DIR)              a sarc partition set (``load_partitions``)
    open_partition(DIR/NAME.json)    the DGL partition of that config, read in place by
                                     each worker (``dgl_in_place``); also DIR itself when
                                     it holds the config and no sarc metadata.json

Both answer ``num_parts``, ``node_offsets``, ``fingerprint``, ``meta`` and
``load_part(p, gather)``.
"""
from __future__ import annotations

from pathlib import Path

from ..atomic import MANIFEST
from .format import METADATA, PYG_META, PartitionSet, load_partitions


def open_partition(path, *, verify: bool = True):
    """The partition at ``path``: a ``PartitionSet``, or a ``DglPartition`` (DGL imported
    only then); ``verify`` hashes a sarc set's part files up front."""
    if is_dgl_partition(path):
        from .dgl_in_place import open_dgl_partition
        return open_dgl_partition(path)
    return load_partitions(path, verify=verify)


def is_dgl_partition(path) -> bool:
    """Whether ``path`` names a DGL partition: a ``.json`` file, or a directory with a
    ``.json`` file (its config) and neither a sarc ``metadata.json`` nor PyG's
    ``META.json`` (``load_partitions`` says what such a one is)."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".json"
    return (path.is_dir() and not (path / METADATA).exists()
            and not (path / PYG_META).exists()
            and any(f.name != MANIFEST for f in path.glob("*.json")))


__all__ = ["open_partition", "is_dgl_partition", "PartitionSet"]
