"""``sarc partition``: partition a dataset and write sarc's partition format.

    sarc partition --dataset cora --parts 4 --method metis --out DIR [--seed S] [--overwrite]
                   [--no-check-data]
    sarc partition --graph FILE.npz --parts 4 --out DIR
    sarc partition --from-dgl DIR/NAME.json --out DIR [--dgl-orig-ids N E | --dgl-shuffled-ids]
    sarc partition --from-pyg DIR --out DIR [--no-pyg-extras] [--pyg-target-type TYPE]

``--dataset`` names a dataset of ``sarc.datasets`` (``--data-dir`` for those not
embedded); ``--graph`` reads an ``.npz`` file with ``edge_src``, ``edge_dst``
and ``num_nodes``, carrying along its per-node arrays (first dimension N) and
per-edge arrays (named ``etype`` or ``edge_*``). Prints the edge cut and the
balance: per part the nodes, edges, halo rows and mask counts, then max, mean
and max / mean.

``--from-dgl`` and ``--from-pyg`` convert a partition DGL's
``partition_graph`` or PyG's ``Partitioner`` wrote, keeping its parts
(``dgl_format``, ``pyg_format``): ``--parts``, ``--method`` and ``--seed`` do
not apply (``--parts``, if given, must match). A heterogeneous partition
becomes the homogeneous graph with ``ntype`` / ``etype`` ids (``foreign``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .. import names
from ..distributed.supervise import stops_on_signals
from ..partition.graph_file import load_npz_graph
from ..partition.partitioners import PARTITIONERS
from ..partition.pipeline import partition_graph


def add_partition_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``partition`` to ``subparsers``; the parser's default ``func`` is ``partition_command``."""
    from .options import add_check_data_argument

    p = subparsers.add_parser("partition", help="partition a graph for distributed training",
                              description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="a dataset name (cora, aifb, citeseer, pubmed) or "
                                       "file (.npz, in the dataset layout: no num_nodes needed)")
    src.add_argument("--graph", metavar="FILE.npz",
                     help="an .npz file with edge_src, edge_dst, num_nodes (and node / edge data)")
    src.add_argument("--from-dgl", metavar="DIR/NAME.json",
                     help="convert the partition dgl.distributed.partition_graph wrote")
    src.add_argument("--from-pyg", metavar="DIR",
                     help="convert the partition torch_geometric.distributed.Partitioner wrote")
    p.add_argument("--data-dir", help="directory of dataset files not embedded in sarc")
    add_check_data_argument(p)
    p.add_argument("--parts", type=int, help="number of parts (required unless converting)")
    p.add_argument("--method", choices=sorted(PARTITIONERS),
                   help="how to partition (default metis)")
    p.add_argument("--out", required=True, help="directory to write the partitions to")
    p.add_argument("--seed", type=int, help="the partitioner's seed (default 0)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the partition set sarc wrote at --out (a folder sarc did not "
                        "write is never replaced)")
    ids = p.add_mutually_exclusive_group()
    ids.add_argument("--dgl-orig-ids", nargs=2, metavar=("NIDS", "EIDS"),
                     help="the original node and edge ids partition_graph(..., "
                          "return_mapping=True) returned, saved (.pt or .npy); default: "
                          "orig_nids.pt and orig_eids.pt beside the DGL config")
    ids.add_argument("--dgl-shuffled-ids", action="store_true",
                     help="take DGL's shuffled ids as the graph's own ids")
    p.add_argument("--no-pyg-extras", action="store_true",
                   help="do not read the labels and splits PyG's examples keep beside DIR "
                        "(NAME-label/, NAME-train-partitions/, ...)")
    p.add_argument("--pyg-target-type", metavar="TYPE",
                   help="a heterogeneous PyG partition: the node type its labels and splits "
                        "are of (default: the one type with as many nodes as labels)")
    p.set_defaults(func=partition_command)
    return p


@stops_on_signals(workers=False)
def partition_command(args) -> int:
    """Run ``sarc partition`` with parsed ``args``; prints the partition's quality."""
    _check_options(args)
    if args.from_dgl or args.from_pyg:
        return convert_command(args)
    if args.graph:
        name = args.graph
        src, dst, num_nodes, node_data, edge_data = load_npz_graph(args.graph,
                                                                   check=args.check_data)
    else:
        from ..datasets import load_dataset
        ds = load_dataset(args.dataset, args.data_dir, check=args.check_data)
        name = ds.name
        src, dst, num_nodes = ds.edge_src, ds.edge_dst, ds.num_nodes
        node_data = ds.node_data
        edge_data = ds.edge_data
        if ds.ntype is not None:
            node_data["ntype"] = ds.ntype
    method, seed = args.method or "metis", args.seed or 0
    from ..training.progress import progress_bar
    with progress_bar(3 + args.parts, "partition", "step", mininterval=0) as bar:
        pset = partition_graph(src, dst, num_nodes, args.parts, args.out, method=method,
                               node_data=node_data, edge_data=edge_data, seed=seed,
                               overwrite=args.overwrite,
                               dataset=None if args.graph else ds.recorded,
                               sizes=None if args.graph else ds.sizes,
                               progress=(lambda stage: bar.advance(1, stage)) if bar.shown else None)
    print(f"{names.one_line(name)}: {num_nodes} nodes, {src.numel()} edges -> {args.parts} parts "
          f"({method}, seed {seed})")
    _print_result(pset, node_data, edge_data)
    return 0


def convert_command(args) -> int:
    """``sarc partition --from-dgl`` / ``--from-pyg``: convert a foreign partition."""
    from .options import UsageError
    from ..partition.foreign import write_foreign

    if args.from_dgl:
        from ..partition.dgl_format import read_dgl_partitions
        graph = read_dgl_partitions(args.from_dgl, orig_ids=args.dgl_orig_ids,
                                    shuffled_ids=args.dgl_shuffled_ids)
    else:
        from ..partition.pyg_format import read_pyg_partitions
        graph = read_pyg_partitions(args.from_pyg, dataset_extras=not args.no_pyg_extras,
                                    target_type=args.pyg_target_type)
    if args.parts is not None and args.parts != graph.num_parts:
        raise UsageError(f"--parts {args.parts}, but {args.from_dgl or args.from_pyg} has "
                         f"{graph.num_parts} parts")
    pset = write_foreign(graph, args.out, overwrite=args.overwrite)
    print(f"{names.one_line(args.from_dgl or args.from_pyg)}: {graph.num_nodes} nodes, "
          f"{graph.src.numel()} edges, "
          f"{graph.num_parts} parts ({graph.method}"
          + (", DGL's shuffled ids" if graph.source.get("ids") == "dgl-shuffled" else "")
          + ")")
    if graph.types:
        t = graph.types
        print(f"node types ({t['num_ntypes']}): {_listed(t['ntypes'])}; edge types "
              f"({t['num_etypes']}): {_listed(t['etypes'])} (node data ntype, edge data etype)")
    _print_result(pset, graph.node_data, graph.edge_data)
    return 0


def _check_options(args) -> None:
    """Every value checked before any work (nothing read, nothing written); options that
    belong to the other kind of run (partitioning vs converting) are errors."""
    from .options import (UsageError, at_least, check_input_dir, check_output_dir,
                       check_seed)
    from ..atomic import check_target

    at_least("--parts", args.parts, 1)
    check_seed("--seed", args.seed)
    check_input_dir("--data-dir", args.data_dir)
    check_output_dir("--out", args.out)
    check_target(Path(args.out), args.overwrite)

    converting = bool(args.from_dgl or args.from_pyg)
    if converting:
        given = [f for f, v in (("--method", args.method), ("--seed", args.seed),
                                ("--data-dir", args.data_dir)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} do not apply when converting a partition "
                             f"(--from-dgl / --from-pyg keep the foreign parts)")
    elif args.parts is None:
        raise UsageError("--parts is required with --dataset and --graph")
    dgl_only = [f for f, v in (("--dgl-orig-ids", args.dgl_orig_ids),
                               ("--dgl-shuffled-ids", args.dgl_shuffled_ids)) if v]
    if dgl_only and not args.from_dgl:
        raise UsageError(f"{', '.join(dgl_only)} only apply with --from-dgl")
    pyg_only = [f for f, v in (("--no-pyg-extras", args.no_pyg_extras),
                               ("--pyg-target-type", args.pyg_target_type)) if v]
    if pyg_only and not args.from_pyg:
        raise UsageError(f"{', '.join(pyg_only)} only apply with --from-pyg")


def _listed(items) -> str:
    """Names from the graph's files, for the terminal (``names.one_line``)."""
    return ", ".join(map(names.one_line, items)) or "-"


def _print_result(pset, node_data, edge_data) -> None:
    print(f"node data: {_listed(node_data)}; edge data: {_listed(edge_data)}")
    print(pset.stats.format())
    print(f"wrote {names.one_line(pset.path)}")
