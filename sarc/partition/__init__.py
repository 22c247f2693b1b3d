"""Partitioning a graph for distributed training, and sarc's partition format.

    partition_graph(src, dst, N, P, out, method="metis")   assign -> relabel -> cut -> write
    load_partitions(out)                                    a checked PartitionSet
    PartitionSet.load_part(p)                               one Part, sha256-checked

Modules, in pipeline order: ``partitioners`` (METIS with multi-constraint
balancing, seeded random), ``relabel`` (contiguous id range per part),
``parts`` (what a part holds), ``stats`` (edge cut, balance),
``fingerprint`` (which graph), ``atomic`` (all-or-nothing directory writes),
``format`` (the directory layout, writing and loading), ``pipeline``, ``cli``.
A worker's view of one part is ``sarc.runtime.sharded.ShardedGraph``.
"""
from .fingerprint import graph_fingerprint
from .format import PartitionSet, load_partitions, write_partitions
from .partitioners import PARTITIONERS, metis_partition, random_partition
from .parts import Part, cut_parts
from .pipeline import BALANCE_MASKS, partition_graph
from .relabel import Relabeling, relabel
from .stats import PartitionStats, partition_stats

__all__ = ["partition_graph", "load_partitions", "write_partitions", "PartitionSet", "Part",
           "cut_parts", "metis_partition", "random_partition", "PARTITIONERS", "relabel",
           "Relabeling", "partition_stats", "PartitionStats", "graph_fingerprint",
           "BALANCE_MASKS"]
