"""``sarc partition``: partition a dataset and write sarc's partition format.

    sarc partition --dataset cora --parts 4 --method metis --out DIR [--seed S] [--overwrite]
    sarc partition --graph FILE.npz --parts 4 --out DIR

``--dataset`` names a dataset of ``sarc.datasets`` (``--data-dir`` for those not
embedded); ``--graph`` reads an ``.npz`` file with ``edge_src``, ``edge_dst``
and ``num_nodes``, carrying along its per-node arrays (first dimension N) and
per-edge arrays (named ``etype`` or ``edge_*``). Prints the edge cut and the
balance: per part the nodes, edges, halo rows and mask counts, then max, mean
and max / mean.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from ..errors import GraphError
from .partitioners import PARTITIONERS
from .pipeline import partition_graph

EDGE_LIST = ("edge_src", "edge_dst")


def add_partition_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``partition`` to ``subparsers``; the parser's default ``func`` is ``partition_command``."""
    p = subparsers.add_parser("partition", help="partition a graph for distributed training",
                              description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="a dataset name (cora, aifb, citeseer, pubmed)")
    src.add_argument("--graph", metavar="FILE.npz",
                     help="an .npz file with edge_src, edge_dst, num_nodes (and node / edge data)")
    p.add_argument("--data-dir", help="directory of dataset files not embedded in sarc")
    p.add_argument("--parts", type=int, required=True, help="number of parts")
    p.add_argument("--method", choices=sorted(PARTITIONERS), default="metis")
    p.add_argument("--out", required=True, help="directory to write the partitions to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=partition_command)
    return p


def partition_command(args) -> int:
    """Run ``sarc partition`` with parsed ``args``; prints the partition's quality."""
    if args.graph:
        name = args.graph
        src, dst, num_nodes, node_data, edge_data = load_npz_graph(args.graph)
    else:
        from ..datasets import load_dataset
        ds = load_dataset(args.dataset, args.data_dir)
        name = ds.name
        src, dst, num_nodes = ds.edge_src, ds.edge_dst, ds.num_nodes
        node_data = {"feat": ds.feat, "label": ds.label, "train_mask": ds.train_mask,
                     "val_mask": ds.val_mask, "test_mask": ds.test_mask}
        edge_data = {"etype": ds.etype} if ds.etype is not None else {}
    pset = partition_graph(src, dst, num_nodes, args.parts, args.out, method=args.method,
                           node_data=node_data, edge_data=edge_data, seed=args.seed,
                           overwrite=args.overwrite)
    print(f"{name}: {num_nodes} nodes, {src.numel()} edges -> {args.parts} parts "
          f"({args.method}, seed {args.seed})")
    print(f"node data: {', '.join(node_data) or '-'}; edge data: {', '.join(edge_data) or '-'}")
    print(pset.stats.format())
    print(f"wrote {pset.path}")
    return 0


def load_npz_graph(path):
    """(src, dst, num_nodes, node_data, edge_data) of an ``.npz`` graph file."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    missing = [k for k in (*EDGE_LIST, "num_nodes") if k not in arrays]
    if missing:
        raise GraphError(f"{path}: a graph file needs {', '.join(missing)}")
    src, dst = (torch.from_numpy(arrays[k]).to(torch.int64) for k in EDGE_LIST)
    num_nodes = int(arrays["num_nodes"])
    node_data, edge_data = {}, {}
    for k, a in arrays.items():
        if k in EDGE_LIST or a.ndim == 0 or a.dtype.kind not in "biuf":
            continue
        if k == "etype" or k.startswith("edge_"):
            if a.shape[0] != src.numel():
                raise GraphError(f"{path}: edge array {k!r} has {a.shape[0]} rows, "
                                 f"the graph has {src.numel()} edges")
            edge_data[k] = torch.from_numpy(a)
        elif a.shape[0] == num_nodes:
            node_data[k] = torch.from_numpy(a)
    return src, dst, num_nodes, node_data, edge_data
