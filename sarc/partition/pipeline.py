"""Partitioning a graph, top to bottom: assign -> relabel -> cut -> write."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from ..errors import GraphError
from ..atomic import check_target
from .fingerprint import data_digests, graph_fingerprint
from .format import SET_KIND, PartitionSet, write_partitions
from .partitioners import PARTITIONERS, check_graph_input
from .parts import cut_parts
from .relabel import relabel
from .stats import partition_stats

BALANCE_MASKS = ("train_mask", "val_mask", "test_mask")
"""The node masks whose counts METIS balances (and random partitioning deals evenly)."""


def partition_graph(src, dst, num_nodes: int, num_parts: int, out, *, method: str = "metis",
                    node_data: Mapping[str, torch.Tensor] | None = None,
                    edge_data: Mapping[str, torch.Tensor] | None = None,
                    balance: Sequence[str] = BALANCE_MASKS, seed: int = 0,
                    overwrite: bool = False,
                    progress: Callable[[str], None] | None = None,
                    dataset: str | None = None,
                    sizes: Mapping[str, int] | None = None) -> PartitionSet:
    """Partition the graph (edges ``src[i] -> dst[i]``) into ``num_parts`` and write it to ``out``.

    ``node_data`` (``[N, ...]`` each) and ``edge_data`` (``[E, ...]``) are in
    the original order and travel with the nodes and edges. ``balance`` names
    the bool node masks in ``node_data`` to balance across parts (those
    present). ``progress``, where given, is called as each stage ends (the
    assignment, the relabeling, the statistics, then each part written: 3 +
    ``num_parts`` calls) with the stage's name. ``dataset``: the name of the dataset the
    graph is, recorded (``source.dataset``) so that a worker given another ``--dataset``
    refuses the set (``PartitionSet.dataset``); ``sizes``: its ``Dataset.sizes`` (the
    declared classes and types), recorded so that the workers build the model one process
    builds (``PartitionSet.sizes``), not one sized by the largest label or type. The
    digests of ``node_data`` and ``edge_data`` (``data_digests``, in the
    original order) are recorded too (``PartitionSet.node_digests``), so that a dataset
    with this graph but other node data is not taken for it. Returns the written set, as
    ``load_partitions(out)`` would. More parts than nodes is an error (a ``GraphError``
    before any work): those parts could own nothing; METIS may still leave a part empty.
    """
    done = progress or (lambda stage: None)
    if int(num_parts) > max(int(num_nodes), 1):  # one part of an empty graph is its whole
        idle = int(num_parts) - int(num_nodes)
        raise GraphError(f"{num_parts} parts for a graph of {num_nodes} nodes: at least "
                         f"{idle} part{'s' * (idle != 1)} would own no node, and "
                         f"{'their workers' if idle != 1 else 'its worker'} nothing to train "
                         f"on; give at most {num_nodes} parts (a part METIS leaves empty "
                         f"trains, its worker idle)")
    check_target(Path(out), overwrite, SET_KIND)  # before the work, not only after it
    if method not in PARTITIONERS:
        raise ValueError(f"unknown partitioning method {method!r}; available: "
                         f"{', '.join(PARTITIONERS)}")
    node_data = {k: torch.as_tensor(v) for k, v in (node_data or {}).items()}
    edge_data = {k: torch.as_tensor(v) for k, v in (edge_data or {}).items()}
    masks = {k: node_data[k] for k in balance if k in node_data}
    src, dst, masks = check_graph_input(src, dst, num_nodes, num_parts, masks)
    _check_rows(node_data, num_nodes, "node")
    _check_rows(edge_data, src.numel(), "edge")

    digests = data_digests(node_data, edge_data) if node_data or edge_data else {}

    part = PARTITIONERS[method](src, dst, num_nodes, num_parts, masks=masks, seed=seed)
    done(f"assign ({method})")
    relabeling = relabel(part, num_parts)
    done("relabel")
    stats = partition_stats(src, dst, relabeling, masks)
    done("statistics")
    parts = _each_reported(cut_parts(src, dst, relabeling, node_data, edge_data), done)
    return write_partitions(out, parts, relabeling=relabeling,
                            fingerprint=graph_fingerprint(src, dst, num_nodes),
                            num_edges=src.numel(), stats=stats, method=method, seed=seed,
                            source={"dataset": dataset} if dataset else None,
                            sizes=sizes, node_digests=digests,
                            overwrite=overwrite)


def _each_reported(parts: Iterable, done: Callable[[str], None]) -> Iterator:
    """``parts``, calling ``done`` once the consumer asks past each (it has written it)."""
    for p, part in enumerate(parts):
        yield part
        done(f"part {p}")


def _check_rows(data: Mapping[str, torch.Tensor], rows: int, what: str) -> None:
    for name, t in data.items():
        if t.dim() == 0 or t.shape[0] != rows:
            got = t.shape[0] if t.dim() else "no"
            raise GraphError(f"{what} data {name!r} has {got} rows, the graph has {rows} {what}s")
