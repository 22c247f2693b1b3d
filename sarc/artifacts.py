"""A model's compiled artifacts: IR, plan, kernels and schedules (what ``sarc compile``,
``sarc.cli.compile``, prints and writes).

For every sarc layer call of the model's forward pass, in call order, with whether its
inputs need a gradient (``sarc.training.layer_calls``, as a training step runs them; without
the calls, every ``sarc.Layer`` in module order, the first one's input needing none),
``compile_model`` runs the compile pipeline (``sarc.compiler.compile_layer``: trace,
passes and the backend's passes, plan for the requested mode and worker count, the cut
at the exchange, kernel and schedule) and keeps every stage's result: what is printed
and written is what runs. ``write_artifacts`` writes the artifacts the user asks for
(``--emit``) to ``--out``:

- ``ir``:       ``<layer>.traced.ir`` and ``<layer>.ir`` (before / after passes)
- ``plan``:     ``plan.txt`` and ``plan.json``
- ``kernels``:  the generated code of each layer (``<layer>.<backend>.py``); with the
                Triton backend also each kernel as its own module (``<layer>.kernels/``)
- ``schedule``: ``schedule.txt``, the exchange rounds of each layer, forward and backward,
  and ``<layer>.schedule.py``, the generated distributed schedule of each layer
  (``sarc.backends.dist_backend``: its parts, forward and backward over torch.distributed)

``--out`` is written as a whole, through ``sarc.atomic`` (as ``sarc partition`` writes
its sets): into a temporary sibling, then swapped into place, so an error or a kill
leaves the old set or the new one. A missing or empty ``--out`` is written; a set an
earlier ``sarc compile`` wrote is replaced with ``--overwrite``; anything else (the
user's files, a file, another kind of set) is refused before the model is compiled.
File names come from the model's submodule names, made safe (``sarc.names.file_stem``);
layers whose files would share a name (``a`` and ``a.traced``: stems keep dots) take
stems that end in a digest of their names instead.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from torch import nn

from . import names
from .atomic import MANIFEST, atomic_directory
from .compiler import Compilation, Target, compile_layer
from .dsl import Layer, backends_named
from .errors import SarcError
from .hetero import call_blocks, relation_fetches
from .ir.function import Function
from .ir.ops import FUSED
from .ir.split import aggregates
from .ir.printer import format_function
from .planner.plan import (LayerPlan, Plan, fetches_once, format_plan, plan_minibatch,
                           share_step)
from .planner.stats import BlockSample, ShardStats

EMITS = ("ir", "plan", "kernels", "schedule")
SET_KIND = "compile"  # the kind of set in its manifest (``sarc.atomic``)


class CompileError(SarcError):
    """The compile command's arguments or inputs are wrong."""


@dataclass(frozen=True)
class CompiledLayer:
    """One layer's compilation, under its name in the model."""

    name: str
    compilation: Compilation

    @property
    def traced(self) -> Function:
        return self.compilation.traced

    @property
    def optimized(self) -> Function:
        return self.compilation.optimized  # the IR that runs

    @property
    def plan(self) -> LayerPlan:
        return self.compilation.plan

    @property
    def backend(self) -> str:
        return self.compilation.backend

    @property
    def kernel_source(self) -> str:
        return self.compilation.kernel.source

    @property
    def kernel_files(self) -> tuple[tuple[str, str], ...]:
        """(file name, text) of each separate kernel (the Triton backend's)."""
        kernel = self.compilation.kernel
        return tuple(kernel.kernel_files().items()) if hasattr(kernel, "kernel_files") else ()


@dataclass(frozen=True)
class ModelArtifacts:
    model_name: str
    backend: str
    layers: tuple[CompiledLayer, ...]
    plan: Plan
    seconds: float


def find_layers(model: nn.Module) -> list[tuple[str, Layer]]:
    """The model's sarc layers in module order (the documented convention)."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, Layer)]
    if not layers:
        raise CompileError(f"the model ({type(model).__name__}) contains no sarc.Layer")
    return layers


def _steps(model: nn.Module, calls) -> list[tuple[str, Layer, bool]]:
    """(name, layer, its inputs need a gradient) of each layer a step runs: the ``calls``
    (``sarc.training.layer_calls``), or without them the layers in module order, all but
    the first block's input needing a gradient (a first ``sarc.HeteroConv``'s relations'
    layers all read the model's input: ``call_blocks``)."""
    if calls is not None:
        return [(c.name, c.layer, c.inputs_need_grad) for c in calls]
    found = find_layers(model)
    blocks = call_blocks(model, [layer for _, layer in found])
    return [(name, layer, b > 0) for (name, layer), b in zip(found, blocks)]


def _backends(layers, backend: str | None) -> str:
    """The backends the layers compile for, named as ``sarc.training.device.kernels``
    names them: ``backend``, or (None) each layer's own."""
    return backend or backends_named(layer._sarc_backend for _, layer, _ in layers)


def compile_model(model: nn.Module, name: str, *, mode: str = "full", backend: str | None = None,
                  workers: int = 1, stats: ShardStats | None = None,
                  mem_budget: int | None = None, baseline: bool = False,
                  exec_mode: str | None = None, schedules: bool = True,
                  sample: BlockSample | None = None, batch_size: int | None = None,
                  fanouts: tuple[int, ...] | None = None,
                  calls=None, relation_stats: Sequence[ShardStats | None] | None = None
                  ) -> ModelArtifacts:
    """Compile every layer of ``model`` for the target; ``schedules``: also cut each layer
    at the exchange and generate its distributed schedule (always with ``workers > 1``).
    ``calls``: the layer calls of a training step (``sarc.training.layer_calls.layer_calls``), each
    planned for whether its inputs need a gradient; None: the layers in module order, the
    first one's input features needing no gradient. A minibatch mode with a block
    ``sample`` plans each call on its own blocks (``plan_minibatch``); ``batch_size`` and
    ``fanouts`` describe the minibatches of a plan without one. ``backend``: the kernels of
    every layer; None: each layer's own. ``relation_stats``: per layer call, the
    statistics of a ``sarc.HeteroConv`` relation layer's call (its relation's sub-graph of
    the shards; None: ``stats``), where each relation runs a schedule of its own (not
    ``fetches_once``)."""
    t0 = time.perf_counter()
    layers = _steps(model, calls)
    if sample is not None:
        return _compile_minibatch(model, name, layers, sample, mode=mode, backend=backend,
                                  workers=workers, mem_budget=mem_budget, baseline=baseline,
                                  exec_mode=exec_mode, schedules=schedules, t0=t0,
                                  calls=calls)
    shared = [None] * len(layers)
    sharing = mem_budget is not None and stats is not None and workers > 1 and \
        exec_mode in (None, "hybrid")
    seen: set[int] = set()
    again = [id(layer) in seen or seen.add(id(layer)) for _, layer, _ in layers]
    halo = workers > 1 and fetches_once(mem_budget, baseline, exec_mode)
    if sharing:
        # the budget is the whole step's: the layers share it (share_step), a share each,
        # priced as the workers price it before their first step (schedule.share_memory:
        # the layers in module order, the first block's input needing no gradient); a
        # layer's later calls run in sar (schedule.calls_again); where the HeteroConvs'
        # fetches fit it, they fetch once and the other layers share the rest
        mods = [layer for _, layer in find_layers(model)]
        fns = [(compile_layer(layer, backend or layer._sarc_backend,
                              through="optimize").optimized, b > 0)
               for layer, b in zip(mods, call_blocks(model, mods))]
        found = (relation_fetches(model, mods)
                 if mode == "full" and exec_mode is None and not baseline else None)
        kept, fetch = share_step(fns, found, stats, mem_budget, baseline)
        halo = halo or fetch
        kept_of = {id(layer): peers for layer, peers in zip(mods, kept)}
        for k, (_, layer, _) in enumerate(layers):
            if not again[k]:
                shared[k] = kept_of.get(id(layer))
    own = [None] * len(layers) if halo or relation_stats is None else list(relation_stats)
    compiled = []
    for k, (lname, layer, need) in enumerate(layers):
        sar = sharing and again[k]
        target = Target(mode=mode, workers=workers, stats=own[k] or stats,
                        exec_mode="sar" if sar else exec_mode,
                        mem_budget=None if sar else mem_budget, baseline=baseline,
                        inputs_need_grad=need, distributed=schedules, kept_peers=shared[k])
        compiled.append(CompiledLayer(lname, compile_layer(
            layer, backend or layer._sarc_backend, target=target, name=lname)))
    plans, fetches = tuple(c.plan for c in compiled), ()
    if halo:
        plans, fetches = _fetched_once(model, layers, plans, workers, stats, calls)
    plan = Plan(mode, workers, mem_budget, baseline, plans, stats, None, batch_size,
                None if fanouts is None else tuple(fanouts), fetches)
    return ModelArtifacts(name, _backends(layers, backend), tuple(compiled), plan,
                          time.perf_counter() - t0)


def _fetched_once(model: nn.Module, layers, plans: tuple[LayerPlan, ...], workers: int,
                  stats: ShardStats | None, calls=None, sample: BlockSample | None = None,
                  blocks: list[int] | None = None
                  ) -> tuple[tuple[LayerPlan, ...], tuple[LayerPlan, ...]]:
    """A step without a memory budget as workers run it: each ``sarc.HeteroConv`` call
    fetches its node inputs' boundary rows once (``sarc.distributed.halo``: what the call's
    ``fetched_inputs`` are, as ``calls`` recorded them; without ``calls``, the first relation
    layer's node features, positionally), and its relations' layers run on them, exchanging
    nothing (``exec="halo"``). In a minibatch mode layer call k runs on block ``blocks[k]``
    of each batch of ``sample``: its conv's fetches and its own plan are priced on the
    block's largest figures and on every batch. Returns the layers' plans so changed and
    the fetches."""
    from .hetero import HeteroConv
    from .planner.plan import on_batches, on_halo, plan_fetch
    conv_of = {id(sub): c for c in model.modules() if isinstance(c, HeteroConv)
               for sub in c.layers.values()}

    def priced(k: int, plan) -> LayerPlan:   # plan(stats): on block k's largest, each batch
        if sample is None:
            return plan(stats)
        return on_batches(plan(sample.largest(blocks[k])), sample, blocks[k],
                          [plan(st) for st in sample.layer(blocks[k])])

    out, fetches = [], []
    for k, ((lname, layer, need), lp) in enumerate(zip(layers, plans)):
        conv = conv_of.get(id(layer))
        if conv is None:
            out.append(lp)
            continue
        if calls is not None:
            fetched = calls[k].fetches
        elif layer is next(iter(conv.layers.values())):
            fetched = conv.declared_fetches(need)
        else:
            fetched = ()
        base, _, again = lname.rpartition(".layers.")
        call = base + ("#" + again.split("#", 1)[1] if "#" in again else "")
        for label, width, size, grad in fetched:
            fetches.append(priced(k, lambda st, label=label, width=width, size=size, grad=grad:
                                  plan_fetch(f"{call}.{label}", [f"{label}[{width}]"], width,
                                             size, grad, workers=workers, stats=st)))
        out.append(priced(k, lambda st, lp=lp: on_halo(lp, st, workers)))
    return tuple(out), tuple(fetches)


def _compile_minibatch(model, name, layers, sample: BlockSample, *, mode, backend, workers,
                       mem_budget, baseline, exec_mode, schedules, t0, calls=None
                       ) -> ModelArtifacts:
    """Plan the minibatch step on the sample's blocks (layer call k on its block, a
    ``sarc.HeteroConv``'s relations' layers on their conv's: ``call_blocks``), then
    compile each layer for its plan: the layer's largest blocks, the plan's execution
    mode and kept peers. Without a memory budget a conv's inputs are fetched once for its
    relations (``_fetched_once``), as on workers."""
    blocks = call_blocks(model, [layer for _, layer, _ in layers])
    if sample.num_layers != len(set(blocks)):
        raise CompileError(f"the block sample has {sample.num_layers} layers but the model's "
                           f"step takes {len(set(blocks))} blocks")
    fns = [(lname, compile_layer(layer, backend or layer._sarc_backend,
                                 through="optimize").optimized) for lname, layer, _ in layers]
    plan = plan_minibatch(fns, sample, mode=mode, workers=workers, mem_budget=mem_budget,
                          baseline=baseline, exec_mode=exec_mode,
                          needs=[need for _, _, need in layers], blocks=blocks)
    compiled = []
    for k, ((lname, layer, need), lp) in enumerate(zip(layers, plan.layers)):
        target = Target(mode=mode, workers=workers, stats=sample.largest(blocks[k]),
                        exec_mode=None if lp.exec_mode == "local" else lp.exec_mode,
                        baseline=baseline, inputs_need_grad=need, distributed=schedules,
                        kept_peers=lp.kept_peers)
        compiled.append(CompiledLayer(lname, compile_layer(
            layer, backend or layer._sarc_backend, target=target, name=lname)))
    if workers > 1 and fetches_once(mem_budget, baseline, exec_mode):
        plans, fetches = _fetched_once(model, layers, plan.layers, workers, None, calls,
                                       sample, blocks)
        plan = replace(plan, layers=plans, fetches=fetches)
    return ModelArtifacts(name, _backends(layers, backend), tuple(compiled), plan,
                          time.perf_counter() - t0)


def format_schedule(art: ModelArtifacts) -> str:
    plan = art.plan
    lines = [f"schedule: {art.model_name}, mode={plan.mode}, workers={plan.workers}"]
    for lp in plan.layers:
        lines.append(f"layer {lp.name} ({lp.exec_mode})")
        if lp.exec_mode == "halo":
            lines.append("  forward: aggregate its relation's edges on the worker's rows and the "
                         "boundary rows its HeteroConv fetched; backward: autograd there")
            continue
        if plan.workers == 1 or lp.exchange is None:
            lines.append("  forward: aggregate the local block; backward: autograd on the local block")
            continue
        x = " + ".join(lp.exchange.names)
        lines.append("  forward:")
        lines.append(f"    compute {x} on owned rows")
        for k, rnd in enumerate(plan.rounds, 1):
            pairs = ", ".join(f"{r}->{s}" for r, s, _ in rnd)
            lines.append(f"    round {k}: send boundary rows of {x} ({pairs}); "
                         f"aggregate the received shard into local rows"
                         f"{'; free it' if lp.exec_mode != 'oneshot' else '; keep it'}"
                         f"{' (next round prefetched)' if k < len(plan.rounds) else ''}")
        lines.append("    aggregate the local shard; update")
        lines.append("  backward:")
        for k, rnd in enumerate(plan.rounds, 1):
            refetch = "re-fetch the shard's rows (rematerialize), " if lp.exec_mode != "oneshot" else ""
            grad = "send their gradients back to the owners" if lp.exchange.needs_grad else \
                "no gradient leaves (the exchanged rows need none)"
            lines.append(f"    round {k}: {refetch}recompute the edge values, {grad}")
        lines.append("    all-reduce parameter gradients")
    for lp in plan.fetches:
        x = " + ".join(lp.exchange.names)
        lines.append(f"fetch {lp.name} ({lp.exec_mode})")
        lines.append(f"  forward: send the boundary rows of {x} to their readers, every round at "
                     f"once; keep them for its relations' layers")
        lines.append("  backward: " + ("send each boundary row's gradient to its owner, which "
                                       "adds it" if lp.exchange.needs_grad else
                                       "no gradient leaves (the fetched rows need none)"))
    return "".join(names.one_line(line) + "\n" for line in lines)  # names stay on their line


def schedule_sources(art: ModelArtifacts) -> dict[str, str]:
    """Each layer's generated distributed schedule (the module ``sarc train --workers`` runs),
    for the plan's mode and workers."""
    missing = [c.name for c in art.layers if c.compilation.schedule is None
               and aggregates(c.optimized)]
    if missing:
        raise CompileError(f"layers {', '.join(missing)} were compiled without their "
                           f"schedules (compile_model(..., schedules=True))")
    # a layer that aggregates nothing over edges runs on each worker's rows: no schedule
    return {c.name: c.compilation.schedule.source for c in art.layers
            if c.compilation.schedule is not None}


def format_summary(art: ModelArtifacts) -> str:
    head = ["layer", "class", "ops traced", "ops optimized", "fused", "exec", "exchanged",
            "width", "sent/worker"]
    rows = []
    for c, lp in zip(art.layers, art.plan.layers):
        fused = ", ".join(v.op.value for v in c.optimized.values if v.op in FUSED) or "-"
        if lp.exchange is None:
            exch, width, sent = "-", "-", "-"
        else:
            exch, width, sent = " + ".join(lp.exchange.names), str(lp.exchange.width), _sent(lp)
        rows.append([names.one_line(x) for x in (c.name, c.traced.name, str(len(c.traced)),
                     str(len(c.optimized)), fused, lp.exec_mode, exch, width, sent)])
    for lp in art.plan.fetches:   # a HeteroConv's input, fetched once for its relations
        rows.append([names.one_line(x) for x in (
            lp.name, lp.layer_class, "-", "-", "-", lp.exec_mode, " + ".join(lp.exchange.names),
            str(lp.exchange.width), _sent(lp))])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()
    out = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)]
    out.append(f"compiled {len(art.layers)} layer(s) for mode={art.plan.mode}, "
               f"backend={art.backend}, workers={art.plan.workers} in {art.seconds:.2f} s")
    return "\n".join(out) + "\n"


def _sent(lp: LayerPlan) -> str:
    """A plan's bytes sent by the busiest worker, or its formula."""
    return (f"{max(lp.bytes_sent) / 2**20:.2f} MiB" if lp.bytes_sent is not None
            else f"{lp.bytes_sent_expr} bytes")


def write_artifacts(art: ModelArtifacts, out: Path, emit: tuple[str, ...], *,
                    overwrite: bool = False) -> list[Path]:
    """Write the chosen artifacts as the set at ``out``, all at once (``sarc.atomic``);
    ``overwrite`` replaces a set an earlier compile wrote there."""
    schedules = schedule_sources(art) if "schedule" in emit else {}
    stems = _layer_stems(art)
    files: dict[str, str] = {}
    for c in art.layers:
        files.update(_layer_files(art, c, stems[c.name], emit, schedules))
    if "plan" in emit:
        files["plan.txt"] = format_plan(art.plan)
        files["plan.json"] = art.plan.dumps()
    if "schedule" in emit:
        files["schedule.txt"] = format_schedule(art)
    with atomic_directory(out, kind=SET_KIND, overwrite=overwrite) as tmp:
        for rel, text in files.items():
            path = names.inside(tmp, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return [Path(out) / rel for rel in files]


_SET_FILES = ("plan.txt", "plan.json", "schedule.txt")  # the set's files besides the layers'


def _layer_files(art: ModelArtifacts, c: CompiledLayer, stem: str, emit: tuple[str, ...],
                 schedules: dict[str, str]) -> dict[str, str]:
    """Layer ``c``'s files, named from ``stem``."""
    files: dict[str, str] = {}
    if "ir" in emit:
        files[f"{stem}.traced.ir"] = format_function(c.traced)
        files[f"{stem}.ir"] = format_function(c.optimized)
    if "kernels" in emit:
        files[f"{stem}.{c.backend}.py"] = c.kernel_source
        for name, text in c.kernel_files:
            files[f"{stem}.kernels/{_python_file(name)}"] = text
    if c.name in schedules:
        files[f"{stem}.schedule.py"] = schedules[c.name]
    return files


def _layer_stems(art: ModelArtifacts) -> dict[str, str]:
    """Each layer's file stem: ``names.file_stem`` of its name; but where a layer's file
    would have the name of another layer's (stems keep dots: layer ``a``'s traced IR
    ``a.traced.ir`` is layer ``a.traced``'s optimized IR), each layer of the clash takes
    the stem that ends in a digest of its name. Clashes are found among the files of every
    kind, emitted or not, so a layer's files have the same names whatever ``--emit``."""
    stems = {c.name: names.file_stem(c.name) for c in art.layers}
    stems.update((name, names.file_stem(name, digest=True)) for name in _clashing(art, stems))
    clashing = _clashing(art, stems)
    if clashing:  # two names of one digest
        raise CompileError(f"layers {', '.join(sorted(map(repr, clashing)))} would write files "
                           f"of the same name")
    return stems


def _clashing(art: ModelArtifacts, stems: dict[str, str]) -> set[str]:
    """The layers that would write a file (or folder) another layer or the set writes."""
    every_schedule = dict.fromkeys(stems, "")
    owner = dict.fromkeys((*_SET_FILES, MANIFEST), "")  # top-level entry -> its layer
    clashing = set()
    for c in art.layers:
        for rel in _layer_files(art, c, stems[c.name], EMITS, every_schedule):
            top = rel.split("/")[0]
            if owner.setdefault(top, c.name) != c.name:
                clashing |= {c.name, owner[top]} - {""}
    return clashing


def _python_file(name: str) -> str:
    """A kernel's file name (``NAME.py``, NAME maybe from the layer's class) made safe."""
    return f"{names.file_stem(name.removesuffix('.py'))}.py"
