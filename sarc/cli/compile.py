"""``sarc compile``: a model file -> IR, plan, kernels and schedules, printed and written.

The model is built and run once on its dataset's graph as ``sarc train`` feeds it
(``sarc.training.layer_calls``): for every sarc layer call of its forward pass, in call order,
with whether the call's inputs need a gradient, it runs the compile pipeline
(``sarc.compiler``: trace, passes, plan for the requested mode and worker count, the
cut at the exchange, the backend's code and the schedule; ``sarc.artifacts``), prints
a summary and the plan it compiled, and writes the artifacts the user asks for
(``--emit``) to ``--out`` (see ``sarc.artifacts`` for the files).

With ``--partition``, the dataset (``--dataset``, else the one the set records, else
the model's) must be the graph and node data partitioned there, as ``sarc train``
checks it, and the plan is made on the workers' shards as training builds them (the
model's ``self_loops`` added on every shard).

With ``--mode mfg`` or ``--mode sampling`` and ``--partition``, each layer is planned
on its own blocks: the first ``--batches`` steps of training's first epoch (fewer
where an epoch has fewer; the output says so), each of ``--batch-size`` seeds over all
workers as ``sarc train`` deals them (default, as ``sarc train``: all training seeds,
one step per epoch), are drawn with the sampler over the shards (every in-edge for mfg, ``--fanouts`` for
sampling; ``sarc.cli.block_sample``), and the plan prints per layer the blocks' sizes
and the bytes a step sends and keeps (mean / max over the batches). Without
``--partition`` the block sizes stay symbols.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..artifacts import (EMITS, SET_KIND, CompileError, compile_model, format_summary,
                         write_artifacts)
from ..atomic import check_target
from ..compiler import BACKENDS
from ..distributed.supervise import stops_on_signals
from ..errors import SarcError
from ..names import one_line
from ..planner.plan import fetches_once, format_plan
from ..planner.stats import ShardStats
from .options import (MEM_BUDGET_HELP, UsageError, add_mode_arguments, at_least,
                      check_input_dir, check_mode_arguments, check_output_dir, overrides,
                      parse_bytes, plural)

DEFAULT_BATCHES = 8
DEFAULT_EMIT = ",".join(EMITS)


def add_compile_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a model file and show its IR, plan, kernels, schedule",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the model file (defines build_model and HPARAMS)")
    add_mode_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="the kernels every sarc layer is compiled to: torch or triton; "
                        "default: each layer's own (its backend=, torch unless it says)")
    p.add_argument("--workers", type=int, default=1, metavar="P",
                   help="the workers to plan for (default 1; with --partition: its parts)")
    p.add_argument("--partition", help="a partition directory (real statistics for the plan)")
    p.add_argument("--dataset", help="the dataset whose sizes build the model (default: the model's)")
    p.add_argument("--data-dir", help="directory of datasets not embedded in sarc")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a hyperparameter the model is built with, as sarc train takes it "
                        "(repeatable), e.g. --set hidden=64")
    p.add_argument("--mem-budget", metavar="SIZE", help=MEM_BUDGET_HELP)
    p.add_argument("--fanouts", help="--mode sampling: in-edges sampled per node at each layer, "
                   "input layer first, e.g. 10,25 (-1: all)")
    p.add_argument("--batch-size", type=int, metavar="B",
                   help="--mode mfg|sampling: training seeds per step over all workers, as sarc "
                        "train takes it (default, as sarc train's: all of them, one step per "
                        "epoch)")
    p.add_argument("--batches", type=int, metavar="N",
                   help=f"--mode mfg|sampling with --partition: the first N steps of an epoch "
                        f"sampled to measure the blocks (default {DEFAULT_BATCHES}; fewer when an "
                        f"epoch has fewer)")
    p.add_argument("--baseline", action="store_true",
                   help="plan the SAR-equivalent schedule (no pushdown across the exchange, no online softmax)")
    p.add_argument("--emit", default=DEFAULT_EMIT, metavar="A,B,...",
                   help=f"comma-separated artifacts to write to --out (the plan is printed "
                        f"when it is among them): {', '.join(EMITS)} (default: all four, "
                        f"{DEFAULT_EMIT})")
    p.add_argument("--out", help="the directory to write the artifacts to: missing or empty, "
                   "or a set an earlier sarc compile wrote (with --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the set an earlier sarc compile wrote at --out")
    p.set_defaults(func=compile_command)


def check_compile_args(args) -> tuple[str, ...]:
    """Every value of ``sarc compile`` checked before any work; the artifacts to emit."""
    check_mode_arguments(args)
    check_input_dir("--data-dir", args.data_dir)
    emit = tuple(e.strip() for e in args.emit.split(",") if e.strip())
    bad = [e for e in emit if e not in EMITS]
    if bad:
        raise CompileError(f"--emit: unknown artifact {', '.join(bad)}; choose from {', '.join(EMITS)}")
    if not emit:
        raise CompileError(f"--emit {args.emit!r} names no artifact; choose from "
                           f"{', '.join(EMITS)}")
    if args.workers < 1:
        raise CompileError(f"--workers must be at least 1, got {args.workers}")
    if args.mem_budget is not None:
        parse_bytes(args.mem_budget)
    check_minibatch_args(args)
    check_output_dir("--out", args.out)
    if args.out:
        check_target(args.out, args.overwrite, SET_KIND)  # before the work, not only after it
    elif args.overwrite:
        raise CompileError("--overwrite applies to --out, which is not given")

    return emit


def parse_fanouts(text: str) -> tuple[int, ...]:
    """``--fanouts 10,25`` -> (10, 25): integers, >= 0 or -1 (every in-edge)."""
    parts = [t.strip() for t in text.split(",")]
    try:
        fanouts = tuple(int(t) for t in parts)
    except ValueError:
        raise UsageError(f"--fanouts {text}: give one integer per layer, comma-separated "
                         f"(e.g. 10,25)") from None
    bad = [f for f in fanouts if f < -1]
    if bad:
        raise UsageError(f"--fanouts {text}: a fanout is a number of neighbours >= 0, or -1 "
                         f"for all of them, got {bad[0]}")
    return fanouts


def check_minibatch_args(args) -> None:
    """The minibatch options fit the mode (``--fanouts`` only for sampling, none for full)."""
    given = [o for o, v in (("--fanouts", args.fanouts), ("--batch-size", args.batch_size),
                            ("--batches", args.batches)) if v is not None]
    if args.mode == "full" and given:
        raise UsageError(f"{', '.join(given)}: minibatch options, for --mode mfg or sampling "
                         f"(--mode full trains on every node each step)")
    if args.mode == "mfg" and args.fanouts is not None:
        raise UsageError("--fanouts is for --mode sampling; --mode mfg takes every in-edge")
    if args.fanouts is not None:
        parse_fanouts(args.fanouts)
    at_least("--batch-size", args.batch_size, 1)
    at_least("--batches", args.batches, 1)
    if args.batches is not None and not args.partition:
        raise UsageError("--batches: the batches sampled from the shards of --partition to plan "
                         "on; without --partition the plan is symbolic and samples none")
    if args.mode == "sampling" and args.partition and args.fanouts is None:
        raise UsageError("--mode sampling with --partition samples blocks to plan on: give "
                         "--fanouts (one per layer, e.g. 10,25)")


@stops_on_signals(workers=False)
def compile_command(args) -> int:
    from ..loader import load_model_file
    from ..training.layer_calls import layer_calls
    from ..train import build, hyperparameters, prepare

    emit = check_compile_args(args)
    spec = load_model_file(args.model)
    hparams = hyperparameters(spec, overrides(args))
    pset = None
    if args.partition:
        pset = _load_partitions(Path(args.partition))
        if pset.num_parts != args.workers:
            if args.workers != 1:
                raise CompileError(f"--partition has {pset.num_parts} parts but --workers is {args.workers}")
            args.workers = pset.num_parts
    data = _dataset(args, hparams, pset)
    if args.workers > max(data.num_nodes, 1):   # as sarc partition and sarc train refuse
        raise CompileError(f"--workers {args.workers} for {data.name}'s {data.num_nodes} "
                           f"nodes: a worker would own no node; give at most "
                           f"{data.num_nodes} workers")
    hparams["dataset"] = data.name
    model = build(spec, data, hparams)
    budget = parse_bytes(args.mem_budget) if args.mem_budget else None
    minibatch = args.mode != "full"
    # what the model's modules alone refuse, before its forward pass on the whole graph
    if minibatch and args.workers > 1:   # as the workers refuse it
        from ..training.minibatch import check_minibatch_budget
        try:
            check_minibatch_budget(model, budget)
        except SarcError as e:
            raise CompileError(str(e)) from None
    if minibatch and pset is not None:
        _check_blocks_sampled(args.mode, model, budget, args.baseline, args.exec_mode)
    # the layers in the order a training step calls them, each with its inputs' gradient
    # needs: the model run once on the graph and inputs sarc train feeds it
    prep = prepare(data, hparams, model)
    calls = layer_calls(model, prep.graph, prep.x, prep.edge_inputs)
    blocks = _blocks_taken(model, calls)
    if args.mode != "full":   # a step gives each sarc layer one block, as sarc train does
        from ..training.minibatch import graph_layers, never_called
        n = graph_layers(model)
        again = _again(calls, args.mode) if blocks > n else None
        if again:
            raise CompileError(again)
        if blocks != n:
            raise CompileError(f"{args.mode} mode: the model made {blocks} sarc layer "
                               f"call{'s' * (blocks != 1)} in one forward pass, but it has {n} sarc layer"
                               f"{'s' * (n != 1)} (one block each); a model in mfg or sampling "
                               f"mode calls each of its sarc layers once, input layer first"
                               + (never_called(model, {id(c.layer) for c in calls})
                                  if blocks < n else ""))
    fanouts = parse_fanouts(args.fanouts) if args.fanouts is not None else None
    if fanouts is not None:  # one per layer call, with or without --partition, as sarc train
        from ..sampling import SamplingError, SamplingSpec
        try:
            SamplingSpec.of(fanouts, layers=blocks)
        except SamplingError as e:
            raise UsageError(f"--fanouts {args.fanouts}: {e}") from None
    stats = sample = relation_stats = None
    batch_size = (args.batch_size or training_seeds(data)) if minibatch else None
    note = None
    if pset is not None:
        shards = _shards(pset, model, hparams)
        if minibatch:
            asked = args.batches or DEFAULT_BATCHES
            sample, steps = _block_sample(shards, blocks, args.mode, fanouts,
                                          args.batch_size, asked)
            batch_size = sample.batch_size
            note = sampled_note(len(sample.batches), steps, args.batches)
        else:
            stats = _full_stats(shards)
            if not fetches_once(budget, args.baseline, args.exec_mode):
                relation_stats, note = _relation_stats(shards, calls)
    if minibatch:   # after what refuses the options themselves
        _forward_on_blocks(args, data, prep, hparams, model, fanouts)
    art = compile_model(model, spec.name, mode=args.mode, backend=args.backend,
                        workers=args.workers, stats=stats,
                        mem_budget=budget, baseline=args.baseline, exec_mode=args.exec_mode,
                        schedules="schedule" in emit, sample=sample, batch_size=batch_size,
                        fanouts=fanouts, calls=calls, relation_stats=relation_stats)
    print(format_summary(art), end="")
    if note:
        print(note)
    if "plan" in emit:
        print(format_plan(art.plan), end="")
    if args.out:
        written = write_artifacts(art, Path(args.out), emit, overwrite=args.overwrite)
        print(f"wrote {len(written)} files to {one_line(args.out)}")
    elif args.emit != DEFAULT_EMIT and "plan" not in emit:   # asked for, written nowhere
        print(f"sarc compile: --emit {args.emit}: nothing is written without --out (the "
              f"artifacts go there; without it, sarc compile prints the plan)", file=sys.stderr)
    return 0


def _forward_on_blocks(args, data, prep, hparams, model, fanouts) -> None:
    """One forward pass of the model on a mini-batch step's blocks (a few seeds, one
    process), as ``sarc train --mode mfg|sampling`` runs it: what only blocks refuse (a
    value of every input row combined with a layer's output, which has its block's
    destination rows) is refused here too, at the model file's line."""
    import torch

    from ..train import minibatch_source
    from ..training.inputs import TrainError
    from ..training.loop import Batch, forward
    from ..training.minibatch import MiniBatchConfig
    counts = {k: int(m.sum()) for k, m in prep.masks.items()}
    if not counts["train"]:
        return   # nothing to sample from; sarc train refuses such a dataset itself
    mode = args.mode if fanouts is not None else "mfg"   # sampling planned without fanouts
    config = MiniBatchConfig(mode, fanouts, batch_size=min(8, counts["train"]))
    full = Batch(prep.graph, prep.x, prep.edge_inputs, prep.label, prep.masks,
                 train_total=counts["train"])
    steps = minibatch_source(data, prep, hparams, model, config, 0, full, counts).steps(1)
    try:
        batch = next(iter(steps))
        with torch.no_grad():
            forward(model, batch)
    except TrainError as e:
        raise CompileError(f"{args.mode} mode: {e}") from None
    finally:
        steps.close()   # the step source's sampling stops here


def _blocks_taken(model, calls) -> int:
    """The blocks a step's layer ``calls`` take (``call_blocks``)."""
    from ..hetero import call_blocks
    return len(set(call_blocks(model, [c.layer for c in calls])))


def _check_blocks_sampled(mode: str, model, budget, baseline: bool, exec_mode) -> None:
    """Planning on sampled blocks (``--partition``) prices each layer call on its block. A
    ``sarc.HeteroConv`` fetches its inputs' rows of a block once for its relations where
    nothing bounds memory (``fetches_once``), which the block's statistics price; with a
    budget, ``sar`` / ``hybrid`` or the baseline its relations' layers run schedules of
    their own on their own edges of the block, whose statistics the sample does not
    have: refused, naming what plans it."""
    from ..hetero import HeteroConv
    if fetches_once(budget, baseline, exec_mode):
        return
    if any(isinstance(m, HeteroConv) for m in model.modules()):
        what = " and ".join(o for o, given in (("--mem-budget", budget is not None),
                                                ("--baseline", baseline),
                                                (f"--exec {exec_mode}", exec_mode is not None))
                            if given)
        raise CompileError(f"{mode} mode with --partition and {what}: the model has a "
                           f"sarc.HeteroConv, whose relations' layers then run on their own "
                           f"edges of a block, which the sampled blocks' statistics do not "
                           f"give; plan it without --partition (sarc train --mode {mode} "
                           f"--workers P reports the bytes each step sends, as planned on "
                           f"its blocks), or without {what}")


def _again(calls, mode: str) -> str | None:
    """The refusal of the first call of a layer called before in ``calls`` (None where none
    is)."""
    from ..training.layer_calls import called_again
    first: dict[int, str] = {}
    for c in calls:
        if id(c.layer) in first:
            return called_again(first[id(c.layer)], c.loc, mode)
        first[id(c.layer)] = c.name
    return None


def _load_partitions(path: Path):
    from ..partition import load_partitions
    return load_partitions(path)


def _recorded(pset, hparams: dict) -> str | None:
    """The dataset ``pset`` records (a file's path, or a name); the model's dataset file
    where the set recorded that file by its name (older sets), as ``sarc.cli.worker``
    takes it (``sarc.datasets.same_dataset``)."""
    from ..datasets import same_dataset
    if pset is None or pset.dataset is None:
        return None
    return same_dataset(pset.dataset, str(hparams["dataset"])) or pset.dataset


def _dataset(args, hparams: dict, pset):
    """The dataset the model is built from and run on: ``--dataset``, else the one
    ``--partition`` records, else the model's; with ``--partition``, checked to be the
    graph and node data partitioned there, as ``sarc train --partition`` checks its
    ``--dataset`` (``sarc.distributed.launch.checked_dataset``): the workers train on
    the partition, so a plan of another graph is not what they run."""
    from types import SimpleNamespace

    from ..datasets import load_dataset
    from ..distributed.graph import DistError
    from ..distributed.launch import checked_dataset
    name = args.dataset or _recorded(pset, hparams) or hparams["dataset"]
    if pset is None or (pset.fingerprint.startswith("dgl:") and not args.dataset):
        return load_dataset(name, args.data_dir)
    given = SimpleNamespace(dataset=name, partition=args.partition, data_dir=args.data_dir,
                            check_data=True)
    try:
        checked_dataset(given, pset)
    except DistError as e:
        # what differs, as sarc train says it; what to do, as compile takes it
        what = str(e).split("; the workers train on the partition")[0]
        if not args.dataset:  # the model file's dataset, the set recording none
            what = (f"--partition {args.partition} records no dataset, and the model's "
                    f"({name}, its HPARAMS) is not the one partitioned there: "
                    f"{what.split(': ', 1)[-1]}")
        raise CompileError(f"{what}; the workers build the model from the partition: give "
                           f"--dataset, the dataset partitioned there") from None
    return load_dataset(name, args.data_dir)


def training_seeds(data) -> int:
    """The dataset's labeled training nodes: ``sarc train``'s seeds of an epoch, and its
    default batch size (one step per epoch)."""
    from ..training.inputs import labeled_training_nodes
    return max(1, labeled_training_nodes(data))


def sampled_note(drawn: int, steps: int, asked: int | None) -> str | None:
    """The line that says the sample has fewer batches than ``--batches`` asked for (an
    epoch has only ``steps``); None when it has them all or ``--batches`` was not given."""
    if asked is None or drawn >= asked:
        return None
    return (f"minibatch: {plural(drawn, 'sampled batch', 'sampled batches')} (an epoch has "
            f"{steps}; --batches {asked} asked for more)")


def _shards(pset, model, hparams: dict) -> list:
    """The P workers' shards of ``pset`` as a training run builds them: with the model's
    ``self_loops``, every self loop replaced by one per node (``block_sample.with_self_loops``:
    the workers' own code), keeping the edge data the model reads."""
    from ..dsl import edge_inputs_for
    from ..runtime.sharded import ShardedGraph
    from .block_sample import with_self_loops
    shards = [ShardedGraph.from_partitions(pset, r) for r in range(pset.num_parts)]
    if not hparams["self_loops"]:
        return shards
    reads = tuple(edge_inputs_for(model, {k: None for e in shards[0].edata for k in e}))
    return with_self_loops(shards, reads)


def _full_stats(shards: list) -> ShardStats:
    """The planner's statistics of full-batch shards, as the workers gather them."""
    import dataclasses
    stats = ShardStats.from_shards(shards)
    return dataclasses.replace(stats, dst_nodes=None) if stats.dst_nodes == stats.nodes else stats


def _relation_stats(shards: list, calls) -> tuple[list, str | None]:
    """Per layer call, the statistics a ``sarc.HeteroConv`` relation layer's call is
    planned on where each relation runs a schedule of its own (None for another call):
    its relation's sub-graph of the workers' full-batch ``shards``, of the edge types the
    conv's call was given (``LayerCall.etype``, on the whole graph: each shard's edges
    take theirs by their original ids), made as the workers make it
    (``sarc.distributed.relations.edge_subshards``, on P threads). And a note where a
    call's edge types are not one per edge of the partitioned graph (its relations are
    then planned on the whole shards')."""
    import torch

    from ..distributed.relations import edge_subshards
    from .block_sample import ThreadExchanger, run_threads
    ids = [torch.cat(list(shard.orig_edge_ids)).to(torch.int64) for shard in shards]
    edges = int(sum(int((i >= 0).sum()) for i in ids))
    wanted: dict[int, tuple] = {}   # id(etype) -> (etype, its relations), in first-call order
    unusable = []
    for c in calls:
        if c.relation is None:
            continue
        etype = c.etype
        if (not isinstance(etype, torch.Tensor) or etype.shape != (edges,)
                or etype.dtype.is_floating_point or any(bool((i < 0).any()) for i in ids)):
            unusable.append(c.name)
            continue
        wanted.setdefault(id(etype), (etype, []))[1].append(c.relation)
    keys = [(key, rid) for key, (_, rids) in wanted.items() for rid in dict.fromkeys(rids)]

    def work(rank: int, comm) -> list:
        mine = {key: etype.to(torch.int64)[ids[rank]] for key, (etype, _) in wanted.items()}
        return edge_subshards(shards[rank], [mine[key] == rid for key, rid in keys],
                              ThreadExchanger(comm))

    subs = run_threads(len(shards), work) if keys else []
    found = {k: _full_stats([subs[rank][i] for rank in range(len(shards))])
             for i, k in enumerate(keys)}
    out = [None if c.relation is None or c.name in unusable
           else found[(id(c.etype), c.relation)] for c in calls]
    note = None
    if unusable:
        note = (f"compile: {len(unusable)} relation layer call(s) ({unusable[0]}, ...) were "
                f"given edge types that are not one per edge of the partitioned graph: "
                f"planned on the whole shards' statistics, which overstates what they send")
    return out, note


def _block_sample(shards: list, layers: int, mode: str, fanouts, batch_size: int | None,
                  batches: int):
    """The blocks of the first ``batches`` steps of a training run's first epoch sampled
    over the workers' ``shards`` (``block_sample``) for a step of ``layers`` blocks (a
    layer call's each, a ``sarc.HeteroConv`` call's one for its relations),
    and the steps of an epoch; ``batch_size`` None: every training seed in one step, as
    ``sarc train``."""
    from ..sampling import SamplingSpec
    from .block_sample import sample_epoch
    spec = SamplingSpec.mfg(layers) if mode == "mfg" else SamplingSpec.of(fanouts, layers=layers)
    return sample_epoch(shards, spec, batch_size=batch_size, batches=batches)
