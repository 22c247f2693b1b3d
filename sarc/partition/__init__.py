"""Partitioning a graph for distributed training, and sarc's partition format.

    partition_graph(src, dst, N, P, out, method="metis")   assign -> relabel -> cut -> write
    load_partitions(out)                                    a checked PartitionSet
    PartitionSet.load_part(p)                               one Part, sha256-checked
    write_foreign(read_dgl_partitions(CONFIG.json), out)    convert DGL's partition_graph output
    write_foreign(read_pyg_partitions(ROOT), out)           convert PyG's Partitioner output
    open_partition(DIR or DGL's NAME.json)                  a set, or a DGL partition in place

Modules, in pipeline order: ``partitioners`` (METIS with multi-constraint
balancing, seeded random), ``relabel`` (contiguous id range per part),
``parts`` (what a part holds), ``stats`` (edge cut, balance),
``fingerprint`` (which graph), ``format`` (the directory layout, writing and
loading; written all or nothing through ``sarc.atomic``), ``pipeline``,
``foreign`` with ``dgl_format``, ``pyg_format`` and ``pyg_hetero`` (other
systems' partitions converted, heterogeneous ones as one graph with type ids),
``dgl_in_place`` and ``source`` (a DGL partition trained on without converting
it), ``cli``.
A worker's view of one part is ``sarc.runtime.sharded.ShardedGraph``.
"""
from .dgl_format import read_dgl_partitions
from .fingerprint import graph_fingerprint
from .foreign import ForeignGraph, write_foreign
from .format import PartitionSet, load_partitions, write_partitions
from .partitioners import PARTITIONERS, metis_partition, random_partition
from .parts import Part, cut_parts
from .pipeline import BALANCE_MASKS, partition_graph
from .pyg_format import read_pyg_partitions
from .source import open_partition
from .relabel import Relabeling, relabel
from .stats import PartitionStats, partition_stats

__all__ = ["partition_graph", "load_partitions", "write_partitions", "PartitionSet", "Part",
           "cut_parts", "metis_partition", "random_partition", "PARTITIONERS", "relabel",
           "Relabeling", "partition_stats", "PartitionStats", "graph_fingerprint",
           "BALANCE_MASKS", "ForeignGraph", "read_dgl_partitions", "read_pyg_partitions",
           "write_foreign", "open_partition"]
