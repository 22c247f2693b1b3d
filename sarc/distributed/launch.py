"""``sarc train --workers P``: distributed training on this machine, through torchrun.

    sarc train MODEL.py --dataset cora --workers 4 [--exec sar|oneshot|hybrid]
               [--mode full|mfg|sampling --fanouts 10,25 --batch-size 256]
               [--partition DIR | --method metis|random] [--mem-budget 512M] [--baseline]
               [--master-port PORT] [--timeout S] [--device cpu|cuda] [--backend torch|triton]

Without ``--partition`` the dataset is partitioned first (``--method``, METIS
by default) into a temporary directory; with it, a ``--dataset`` must be the graph the set
holds (its fingerprint) with the node data it holds (their digests, where recorded), since
the workers train on the set and record that name. Then torchrun (``sarc.distributed.agent``,
``--nproc-per-node P``) starts the workers (``sarc.cli.worker``) with a
rendezvous on 127.0.0.1 at ``--master-port`` or a free port: gloo with ``--device
cpu``, NCCL with ``--device cuda`` (each worker on the GPU of its local rank).
Rank 0 prints the epochs, and at the end every
worker's peak memory and bytes sent.

Whatever ends the run (its end, a failed or killed worker or agent, SIGTERM or
Ctrl-C, SIGKILL of ``sarc train`` itself), no process of it is left and the
temporary directory goes; how, in ``sarc.distributed.supervise``. Where it seems
stuck, SIGUSR1 prints every thread's stack of each of its processes
(``sarc.distributed.stacks``).

Across machines, run the worker under torchrun on each (see ``sarc.cli.worker``).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

from ..checkpoint import check_launch, checkpoint_command_line
from .graph import DistError
from .stacks import printing_run
from .supervise import PortInUse, reserve_port, run_agent, run_directory, stops_on_signals


def worker_command_line(args, partition: str, json_path: str | None,
                        dataset: str | None = None) -> list[str]:
    """The worker's arguments, as ``sarc.cli.worker`` parses them. ``dataset``: the name of
    the dataset ``partition`` holds (checked: ``checked_dataset``), which the workers record;
    None where it is not known."""
    cmd = [args.model, "--partition", partition, "--seed", str(args.seed),
           "--log-every", str(max(1, args.log_every)), "--eval-every", str(args.eval_every),
           "--timeout", str(args.timeout),
           "--device", args.device]
    if args.backend is not None:
        cmd += ["--backend", args.backend]
    if args.exec_mode:
        cmd += ["--exec", args.exec_mode]
    if args.mode != "full":
        cmd += ["--mode", args.mode]
    for option, value in (("--batch-size", args.batch_size), ("--fanouts", args.fanouts),
                          ("--prob", args.prob)):
        if value is not None:
            cmd += [f"{option}={value}"]
    cmd += [flag for flag, on in (("--replace", args.replace), ("--drop-last", args.drop_last),
                                  ("--no-shuffle", not args.shuffle)) if on]
    if args.mem_budget:
        cmd += ["--mem-budget", args.mem_budget]
    if args.baseline:
        cmd.append("--baseline")
    if args.epochs is not None:
        cmd += ["--epochs", str(args.epochs)]
    for item in args.overrides:
        cmd += ["--set", item]
    if json_path:
        cmd += ["--json", json_path]
    if dataset:
        cmd += ["--dataset", dataset]
    return cmd + checkpoint_command_line(args)


def run_hparams(args) -> dict:
    """The run's hyperparameters (the model file's, ``--set``), as the workers take them."""
    from ..loader import load_model_file, parse_overrides
    from ..train import hyperparameters
    return hyperparameters(load_model_file(args.model), parse_overrides(args.overrides))


def load_run_dataset(args, name: str):
    """The dataset ``name`` as ``sarc train`` loads it (``--data-dir``, ``--no-check-data``)."""
    from ..datasets import load_dataset
    return load_dataset(name, args.data_dir, check=getattr(args, "check_data", True))


def checked_dataset(args, pset) -> str | None:
    """``--dataset`` as the run records it (``Dataset.recorded``: a file's path, or a
    name) where it is the graph the partition set ``pset`` (of ``--partition``) holds, the
    same edges over the same nodes (its recorded fingerprint), with the same features,
    labels, splits, node types and edge data where the set records their digests
    (``check_node_data``); None
    without ``--dataset``. The workers train on the partition and record this, so a
    dataset that is another graph, or the graph with other node data, is refused rather
    than recorded."""
    from ..datasets import same_dataset
    from ..partition import graph_fingerprint
    if not args.dataset:
        return None
    if pset.fingerprint.startswith("dgl:"):
        raise DistError(f"--dataset {args.dataset} with --partition {args.partition}: a DGL "
                        f"partition read in place does not record its whole graph, so sarc "
                        f"cannot check that it is {args.dataset}; leave --dataset out (the run "
                        f"then names the graph by its partition's fingerprint), or convert it "
                        f"with sarc partition --from-dgl")
    data = load_run_dataset(args, args.dataset)
    fingerprint = graph_fingerprint(data.edge_src, data.edge_dst, data.num_nodes)
    if fingerprint != pset.fingerprint:
        raise DistError(f"--dataset {args.dataset} is not the graph partitioned in --partition "
                        f"{args.partition}: {data.name} has {data.num_nodes} nodes and "
                        f"{data.num_edges} edges (graph {fingerprint[:19]}), the partition's "
                        f"graph {pset.num_nodes} nodes and {pset.num_edges} edges (graph "
                        f"{pset.fingerprint[:19]}); the workers train on the partition: leave "
                        f"--dataset out, or partition {data.name}")
    check_node_data(args, pset, data)
    # the same graph and node data: the workers record the file given (its path) or the
    # name, as the set records it where it records one (a copy of its file: the set's),
    # which they check their --dataset against (``sarc.cli.worker``)
    if pset.dataset is None:
        return data.recorded
    return same_dataset(pset.dataset, data.recorded) or pset.dataset


_DATA_KINDS = (("features", ("feat",)), ("labels", ("label",)),
               ("splits", ("train_mask", "val_mask", "test_mask")), ("node types", ("ntype",)))
"""The node data a partition set records digests of, by what a user calls them."""


def check_node_data(args, pset, data) -> None:
    """Refuse ``data`` (``--dataset``, the graph of ``pset``) where its features, labels,
    splits, node types or edge data are not those partitioned: compared by the digests
    the set records (one pass over each array; ``data_digests``); a set without them (an
    older sarc's, a DGL or PyG conversion) is checked by its graph alone, and one without
    the digests of node types and edge data by its node data."""
    from ..partition.fingerprint import EDGE_DATA, dataset_digests
    recorded = pset.node_digests
    if not recorded:
        return
    mine = dataset_digests(data)
    differ = {k for k, digest in recorded.items() if mine.get(k, digest) != digest}
    kinds = [kind for kind, keys in _DATA_KINDS if differ & set(keys)]
    if EDGE_DATA in recorded:
        arrays = set(filter(None, recorded[EDGE_DATA].split(","))) | set(data.edge_data)
        edges = sorted(name for name in arrays
                       if recorded.get(f"edge:{name}") != mine.get(f"edge:{name}"))
        if edges:
            kinds.append(f"edge data ({', '.join(edges)})")
    if not kinds:
        return
    splits = [k.removesuffix("_mask") for k in ("train_mask", "val_mask", "test_mask")
              if k in differ]
    what = ", ".join(f"{kind} ({', '.join(splits)})" if kind == "splits" else kind
                     for kind in kinds)
    raise DistError(f"--dataset {args.dataset} has the graph partitioned in --partition "
                    f"{args.partition} but other data: its {what} differ from those "
                    f"partitioned{f' (from {pset.dataset})' if pset.dataset else ''}; the "
                    f"workers train on the partition's data: leave --dataset out, or "
                    f"partition {data.name}")


def check_partition_features(args, pset, dataset: str | None, hp: dict) -> None:
    """A partition set without node features needs ``embedding_dim``, refused before any
    worker starts, as on one process (a DGL partition read in place: by its workers)."""
    from ..train import check_features
    schema = pset.meta.get("node_data")
    if isinstance(schema, dict) and "label" in schema:  # a sarc set of a node dataset
        feat = schema.get("feat")
        width = math.prod(feat.get("shape", ())) if isinstance(feat, dict) else 0
        check_features(dataset or f"partitioned at {args.partition}", width > 0, hp)


def check_run_on(data, args, hp: dict, minibatch) -> None:
    """Refuse here, once, before partitioning, what every worker would refuse of ``data``
    (the dataset loaded): negative features under ``norm_features``, more
    ``eval_negatives`` than nodes, ``--drop-last`` with no full batch."""
    from ..training.inputs import check_normalizable, labeled_training_nodes
    if hp.get("norm_features") and data.has_features:
        check_normalizable(data.feat)
    if getattr(args, "task", "node") == "link":
        from ..training.link import check_link_hparams
        check_link_hparams(hp, data.num_nodes)
    elif minibatch is not None:
        minibatch.check_steps(labeled_training_nodes(data))


DEFAULT_METHOD = "metis"
"""How ``--workers P`` partitions the dataset when neither ``--partition`` nor ``--method``
is given."""


def partition_dataset(args, data, out: Path, hp: dict) -> str:
    """Partition ``data`` (``--dataset``, or the model's) into ``out``; returns the
    directory. A dataset the model cannot train on (no features, no ``embedding_dim``) is
    refused first."""
    from ..partition import partition_graph
    from ..train import check_features

    check_features(data.name, data.has_features, hp)
    node_data = data.node_data
    if getattr(args, "task", "node") == "link":
        from .link import partition_link_dataset
        return partition_link_dataset(args, data, out, node_data)
    edge_data = data.edge_data
    if data.ntype is not None:
        node_data["ntype"] = data.ntype
    method = args.method or DEFAULT_METHOD
    pset = partition_graph(data.edge_src, data.edge_dst, data.num_nodes, args.workers, out,
                           method=method, node_data=node_data, edge_data=edge_data,
                           seed=args.seed, dataset=data.recorded, sizes=data.sizes)
    print(f"partitioned {data.name} ({data.num_nodes} nodes, {data.num_edges} edges) into "
          f"{args.workers} parts ({method}): edge cut {pset.stats.edge_cut}", flush=True)
    return str(out)


@stops_on_signals
def launch(args, minibatch=None) -> int:
    """Run ``args`` (a parsed ``sarc train``) on ``args.workers`` local processes;
    ``minibatch``: its ``MiniBatchConfig`` (None: full batch)."""
    from ..partition import open_partition

    p = args.workers
    if args.max_restarts < 0:
        raise DistError(f"--max-restarts must be at least 0, got {args.max_restarts}")
    with run_directory() as tmp, printing_run(tmp), rendezvous_port(args.master_port) as port:
        if args.partition:
            # complete and intact (a DGL partition: its config, and DGL here), before any worker starts
            pset = open_partition(args.partition)
            if pset.num_parts != p:
                raise DistError(f"--partition {args.partition} has {pset.num_parts} parts but "
                                f"--workers is {p}; one worker per part")
            partition = args.partition
            dataset = checked_dataset(args, pset)
            check_partition_features(args, pset, dataset, run_hparams(args))
        else:
            hp = run_hparams(args)
            data = load_run_dataset(args, args.dataset or hp["dataset"])
            check_run_on(data, args, hp, minibatch)
            # the workers record the dataset as one process does: an .npz file by its path
            partition = partition_dataset(args, data, Path(tmp) / "parts", hp)
            dataset = data.recorded
        check_launch(args, partition, minibatch, dataset)
        threads = args.threads or max(1, (os.cpu_count() or 1) // p)
        cmd = [sys.executable, "-m", "sarc.distributed.agent", "--nnodes", "1",
               "--nproc-per-node", str(p), "--master-addr", "127.0.0.1",
               "--master-port", str(port), "--max-restarts", str(args.max_restarts),
               "-m", "sarc.cli.worker",
               *worker_command_line(args, partition, args.json, dataset),
               "--threads", str(threads)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), **this_sarc_env()}
        outcome = run_agent(cmd, env, tmp)
    if outcome.returncode != 0 or outcome.survivors:
        raise DistError(f"distributed training failed: {outcome.summary()}")
    return 0


LAUNCHER_SARC = "SARC_LAUNCHER_PACKAGE"
"""The folder of the sarc package ``sarc train --workers P`` runs, which its workers run."""


def check_launchers_sarc() -> None:
    """This worker runs the sarc its launcher runs (where a launcher says which): with
    Python 3.10, which has no PYTHONSAFEPATH, ``python -m`` imports a ``sarc`` folder of the
    current directory first, another checkout's."""
    expected = os.environ.get(LAUNCHER_SARC)
    mine = Path(__file__).resolve().parents[1]
    if expected and Path(expected) != mine:
        raise DistError(f"this worker imported sarc from {mine}, but sarc train runs the one "
                        f"in {expected} (a sarc folder in the current directory?); run from "
                        f"another directory")


def this_sarc_env() -> dict[str, str]:
    """The environment in which torchrun and the workers (``python -m ...``) import the sarc
    this process runs: its folder first on their path, and not the current directory,
    which ``python -m`` puts first (``PYTHONSAFEPATH``, Python 3.11+): a ``sarc`` folder
    there, another checkout's, would run silently in the workers in its place (with Python
    3.10 the workers refuse it: ``check_launchers_sarc``)."""
    import site
    package = Path(__file__).resolve().parents[1]
    root = str(package.parent)
    env = {"PYTHONSAFEPATH": "1", LAUNCHER_SARC: str(package)}
    installed = {str(Path(d).resolve()) for d in (*site.getsitepackages(),
                                                  site.getusersitepackages())}
    if root in installed:   # found as any package is: not ahead of the standard library
        return env
    # a checkout's folder (an editable install, PYTHONPATH=. in it): first, as a relative
    # PYTHONPATH entry is the current directory's again
    given = os.environ.get("PYTHONPATH")
    return {**env, "PYTHONPATH": root if not given else os.pathsep.join([root, given])}


@contextlib.contextmanager
def rendezvous_port(port: int | None):
    """The rendezvous port (``--master-port``, else a free one), held until the run ends
    so that nothing else takes it before torchrun binds it (``supervise.reserve_port``)."""
    try:
        sock = reserve_port(port or 0)
    except PortInUse:
        raise DistError(f"--master-port {port} is in use on this machine; choose another "
                        f"port, or leave --master-port out to use a free one") from None
    with sock:
        yield sock.getsockname()[1]
