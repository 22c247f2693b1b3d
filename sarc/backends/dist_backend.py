"""Distributed schedule backend: a split layer + its plan -> a readable Python module.

The module (rendered from ``templates/dist_layer.py.j2``, written to a real
file and imported, as the torch backend does) holds

- the layer's parts (``sarc.ir.split``) as functions, one line per IR value
  with the instruction above it (``codegen.emit_values``); the node parts lowered by
  the torch backend's table, the edge part by the layer's backend
  (``registry.Backend.edge_lowering``: on Triton its graph ops are Triton ops,
  ``ops[n]``); the edge part comes in variants, differing only in how aggregates
  and edge_softmax are lowered (to the backend's block ops, ``DK``):
  ``edge_partials`` (forward: partial aggregates), ``edge_surrogate``
  (backward: a scalar whose gradient is the block's share; only its gradient is
  read, so a sum's or mean's surrogate runs the aggregate's backward alone where the
  backend can, ``EdgeLowering.surrogate``), and, when a
  normalizer pass is needed, ``edge_normalizers`` / ``normalizer_surrogate``;
- ``forward(rt)`` and ``backward(rt, grad_out)``: the schedule, step by step,
  over the runtime ``rt`` (``sarc.distributed.schedule.Call``): the exchange in rounds,
  the passes over source blocks, the merges, the parts' autograd.

The header names the layer, the execution mode and the plan's choices, and, for a
backend other than torch, its ops and the edge part's fallbacks to the torch backend.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping, Sequence

from ..ir.function import Function, Value
from ..ir.ops import Op
from ..ir.reducers import reducer
from ..ir.split import X_PREFIX, refuse_nested_softmax
from ..names import literal
from ..planner.plan import LayerPlan
from . import codegen
from ..ir.patterns import accumulating_adds, region_sides, region_width, softmax_value
from .registry import EdgeLowering, get_backend
from .torch_backend import (LOWERING, accumulate_reads, accumulated, differentiated_args,
                            region_function)

Lower = Callable[[int, Value, codegen.RegionNames, list[str]], str]
"""(index, value, its region functions' names (written when called), operands) -> code."""


def _default(i: int, v: Value, regions: codegen.RegionNames, operands: list[str]) -> str:
    return LOWERING[v.op](v, regions() + operands)


def _needed(fn: Function, targets: list[int], reads: Mapping[int, Sequence[int]]) -> set[int]:
    need, stack = set(), list(targets)
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(reads.get(i, fn.values[i].inputs))
    return need


def emit_part(fn: Function, name: str, args: str, targets: list[int], lower: Lower = _default,
              tail: list[str] = (), reads: Mapping[int, Sequence[int]] | None = None
              ) -> tuple[list[list[str]], list[str]]:
    """Region functions and the body of ``def name(args)`` computing ``targets`` of ``fn``;
    ``tail``: the lines after the last value (the return); ``reads``: the values a value
    reads where ``lower`` writes it from others than its operands."""
    reads = reads or {}
    order = sorted(_needed(fn, targets, reads))
    regions, body = codegen.emit_values(
        fn, order, lambda i, v, operands, region_names: lower(i, v, region_names, operands),
        live_out=targets, region_function=region_function, region_prefix=f"_{name}",
        inputs={i: reads.get(i, fn.values[i].inputs) for i in order})
    return regions, [f"def {name}({args}):", *(f"    {line}" for line in [*body, *tail])]


def _node_lowering(fn: Function, fused: Mapping[int, tuple[int, int]]) -> Lower:
    """A node part's values on the torch backend's lines, the adds of ``fused``
    (``patterns.accumulating_adds``) as one op each."""
    return lambda i, v, regions, operands: (accumulated(fn, fused[i][1], operands) if i in fused
                                            else _default(i, v, regions, operands))


def _dict(items: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{literal(k)}: {v}" for k, v in items) + "}"


def _value_src_index(v: Value) -> int | None:
    """The operand a softmax aggregate's value is (a source feature, GAT's z) when the score
    does not read it: the block ops then weigh it in a sparse product, never per edge."""
    z = softmax_value(v)
    score_reads = {a.attr["index"] for a in v.attr["score"].values if a.op is Op.ARG}
    return None if z in score_reads else z


def _fused_args(v: Value, operands: list[str]) -> tuple[str, str, str]:
    """A fused op's sides, block width and operands (one read under detach() only,
    detached: ``torch_backend.differentiated_args``)."""
    kept = differentiated_args(v)
    operands = [x if k in kept else f"{x}.detach()" for k, x in enumerate(operands)]
    return repr(region_sides(v)), str(region_width(v)), ", ".join(operands)


@dataclass(frozen=True)
class _Names:
    """Value index in the edge part -> the aggregate / softmax-site name it produces."""

    aggs: dict[int, str]
    kinds: dict[int, str]
    sites: dict[int, str]


def _edge_lowering(mode: str, names: _Names, baseline: bool, backend: EdgeLowering) -> Lower:
    """How the edge part's aggregates and edge_softmax are lowered in variant ``mode``
    (``partials`` or ``surrogate``), on ``backend``'s ops and block ops."""
    def lower(i: int, v: Value, regions: codegen.RegionNames, ops: list[str]) -> str:
        def block(op: str, bodies: codegen.RegionNames = list) -> tuple[str, list[str]]:
            return backend.block_op(op, i, v, bodies)
        if v.op is Op.EDGE_SOFTMAX:
            f, extra = block("edge_softmax_global")
            return f"{f}({', '.join([ops[0], 'g', f'norms[{literal(names.sites[i])}]', *extra])})"
        name = names.aggs.get(i)
        if name is None:
            return backend.lower(i, v, regions, ops)
        kind = names.kinds[i]
        if v.op is Op.SOFTMAX_AGGREGATE:
            op = ("softmax_surrogate" if mode == "surrogate" else
                  "softmax_normalized" if baseline else "softmax_partial")
            f, (score, value) = block(op, regions)
            sides, width, operands = _fused_args(v, ops)
            value_index = _value_src_index(v)
            if value_index is not None:  # no value per edge: blocks as wide as the score
                width = str(region_width(v, "score"))
            head = f"{score}, {value}, {sides}, {width}, g, {value_index}"
            if mode == "surrogate":
                return f"{f}({head}, cot[{literal(name)}], {operands})"
            if baseline:
                return f"{f}({head}, norms[{literal(name)}], {operands})"
            return f"{f}({head}, {operands})"
        if reducer(kind).selects:
            if v.op is Op.REDUCE:
                if mode == "surrogate":
                    f, (how,) = block("reduce_extremum_select", lambda: [literal(kind)])
                    return (f"{f}({how}, {ops[0]}, g, cot[{literal(name)}][0], "
                            f"cot[{literal(name)}][1])")
                f, (how,) = block("reduce_extremum_partial", lambda: [literal(kind)])
                return f"{f}({how}, {ops[0]}, g)"
            sides, width, operands = _fused_args(v, ops)
            if mode == "surrogate":
                f, (body,) = block("extremum_select", regions)
                return (f"{f}({literal(kind)}, {body}, {sides}, {width}, g, "
                        f"cot[{literal(name)}][0], cot[{literal(name)}][1], {operands})")
            f, (body,) = block("extremum_partial", regions)
            return f"{f}({literal(kind)}, {body}, {sides}, {width}, g, {operands})"
        # sum (mean is a sum here): the block's aggregate; its surrogate sum(agg * cot)
        if mode == "surrogate":
            cot = f"cot[{literal(name)}]"
            own = backend.surrogate(i, v, regions, ops, cot)
            return own or f"({backend.lower(i, v, regions, ops)} * {cot}).sum()"
        return backend.lower(i, v, regions, ops)
    return lower


def _surrogate_term(name: str, kind: str, var: str) -> str:
    """The block's surrogate of aggregate ``name``, a scalar: the block ops' (the selects
    weighed by the cotangent's share of each tie, g / ties) and the backend's
    (``EdgeLowering.surrogate``) are already."""
    return f"{var}.sum()" if kind == "softmax" else var


@dataclass(frozen=True)
class Generated:
    """A schedule module; ``fallbacks``: the edge part's ops that run on the torch
    backend's kernels instead of ``backend``'s, each with the reason."""

    source: str
    path: Path
    module: ModuleType
    backend: str = "torch"
    fallbacks: tuple[str, ...] = ()


def generate(split, plan: LayerPlan, *, baseline: bool = False, layer_name: str | None = None,
             workers: int = 1, backend: str = "torch") -> str:
    """The schedule module's source for ``split`` (``sarc.ir.split.LayerSplit``)
    under ``plan``, its edge part on ``backend``'s kernels."""
    return _generate(split, plan, baseline, layer_name, workers, backend)[0]


def _generate(split, plan: LayerPlan, baseline: bool, layer_name: str | None, workers: int,
              backend: str) -> tuple[str, EdgeLowering]:
    be = get_backend(backend)
    lowering = be.edge_lowering(split.edge, layer_name or split.layer.name)
    edge = split.edge
    agg_index = {name: i for name, i in edge.outputs}
    names = _Names({agg_index[a.name]: a.name for a in split.aggregates},
                   {agg_index[a.name]: a.kind for a in split.aggregates},
                   {s.index: s.name for s in split.softmax_sites})
    parts: list[tuple[list[list[str]], list[str]]] = []
    sig = "g, inputs, params, training, seed"

    def node_part(fn: Function | None, name: str):
        if fn is not None:
            fused = accumulating_adds(fn)
            outs = _dict([(k, f"v{i}") for k, i in fn.outputs])
            parts.append(emit_part(fn, name, sig, [i for _, i in fn.outputs],
                                   _node_lowering(fn, fused), tail=[f"return {outs}"],
                                   reads=accumulate_reads(fn, fused)))

    node_part(split.src, "src_part")
    node_part(split.dst_pre, "dst_pre_part")
    targets = [agg_index[a.name] for a in split.aggregates]
    parts.append(emit_part(edge, "edge_partials", sig + ", norms", targets,
                           _edge_lowering("partials", names, baseline, lowering),
                           [f"return {_dict([(a.name, f'v{agg_index[a.name]}') for a in split.aggregates])}"]))
    terms = [_surrogate_term(a.name, a.kind, f"v{agg_index[a.name]}") for a in split.aggregates]
    parts.append(emit_part(edge, "edge_surrogate", sig + ", norms, cot", targets,
                           _edge_lowering("surrogate", names, baseline, lowering),
                           [f"return {' + '.join(terms)}"]))
    norm_aggs = [a for a in split.aggregates if a.kind == "softmax" and baseline]
    needs_norms = bool(split.softmax_sites or norm_aggs)
    if needs_norms:
        refuse_nested_softmax(edge, split.softmax_sites, [agg_index[a.name] for a in norm_aggs])
        site_inputs = [edge.values[s.index].inputs[0] for s in split.softmax_sites]
        agg_ops = [j for a in norm_aggs for j in edge.values[agg_index[a.name]].inputs]
        tail, regions = [], []
        for s, j in zip(split.softmax_sites, site_inputs):
            op, extra = lowering.block_op("score_normalizer", s.index, edge.values[s.index], list)
            tail.append(f"n_{s.name[1:]} = {op}({', '.join([f'v{j}', 'g', *extra])})")
        for a in norm_aggs:
            k = agg_index[a.name]
            v = edge.values[k]
            fname = f"_edge_normalizers_{a.name[1:]}_score"
            named = []   # the op's args name the score's region function (as it is, in a DotScore)
            op, (score,) = lowering.block_op("softmax_normalizer", k, v,
                                             lambda: named.append(fname) or [fname])
            if named:
                regions.append(region_function(fname, v.attr["score"], len(v.inputs)))
            sides, width, operands = _fused_args(v, [f"v{j}" for j in v.inputs])
            tail.append(f"n_{a.name[1:]} = {op}({score}, {sides}, {width}, g, {operands})")
        items = [(s.name, f"n_{s.name[1:]}") for s in split.softmax_sites] + \
                [(a.name, f"n_{a.name[1:]}") for a in norm_aggs]
        tail.append(f"return {_dict(items)}")
        r, body = emit_part(edge, "edge_normalizers", sig, site_inputs + agg_ops,
                            _plain(lowering), tail=tail)
        parts.append((r + regions, body))
    if split.softmax_sites:
        site_inputs = [edge.values[s.index].inputs[0] for s in split.softmax_sites]
        terms = []
        for s, j in zip(split.softmax_sites, site_inputs):
            op, extra = lowering.block_op("score_normalizer_surrogate", s.index,
                                          edge.values[s.index], list)
            args = [f"v{j}", "g", f"norms[{literal(s.name)}]", f"cot[{literal(s.name)}]", *extra]
            terms.append(f"{op}({', '.join(args)}).sum()")
        parts.append(emit_part(edge, "normalizer_surrogate", sig + ", norms, cot", site_inputs,
                               _plain(lowering), tail=[f"return {' + '.join(terms)}"]))
    node_part(split.dst_post, "dst_post_part")

    ex = plan.exchange
    layer = split.layer
    header = {
        "layer": layer_name or layer.name,
        "cls": layer.name,
        "source": codegen.source_of(layer),
        "exec_mode": plan.exec_mode,
        "workers": workers,
        "exchanged": (" + ".join(ex.names) + f" = {ex.width} x {ex.dtype_bytes} B/row"
                      + (", gradients sent back" if ex.needs_grad else "")) if ex else "nothing",
        "slots": ", ".join(f"{s.name} = %{s.index} {list(s.type.feat)}" for s in split.exchanged) or "-",
        "merges": ", ".join(f"{a.name} {a.kind}" + (" (online, one pass)" if a.kind == "softmax"
                                                      and not baseline else "")
                            for a in split.aggregates),
        "sites": ", ".join(s.name for s in split.softmax_sites),
        "fetch_passes": plan.fetch_passes,
        "backward_passes": plan.backward_passes,
        "baseline": baseline,
        "kept": plan.kept_peers,
        "bytes_sent": plan.bytes_sent,
        "backend": backend,
        "op_lines": lowering.op_lines,
        "fallbacks": lowering.fallbacks,
    }
    functions = ["\n".join(lines) for regions, body in parts for lines in (*regions, body)]
    package, module = be.blocks.__name__.rsplit(".", 1)
    source = codegen.render("dist_layer.py.j2", h=header, functions=functions,
                            blocks_package=package, blocks_module=module,
                            has_src=split.src is not None,
                            has_dst_pre=split.dst_pre is not None, needs_norms=needs_norms,
                            pre_reads_x=_reads_rows(split.dst_pre),
                            post_reads_x=_reads_rows(split.dst_post),
                            has_sites=bool(split.softmax_sites), exec_mode=plan.exec_mode)
    return source, lowering


def _reads_rows(fn: Function | None) -> bool:
    """Does a dst part read exchanged values on the worker's own rows (``$x<k>``)?"""
    return fn is not None and any(v.op is Op.INPUT and v.attr["name"].startswith(X_PREFIX)
                                  for v in fn.values)


def _plain(lowering: EdgeLowering) -> Lower:
    """The edge part's values on the backend's ops, no aggregate among them."""
    return lambda i, v, regions, operands: lowering.lower(i, v, regions, operands)


def compile(split, plan: LayerPlan, *, backend: str = "torch", baseline: bool = False,
            layer_name: str | None = None, workers: int = 1) -> Generated:
    """The schedule module of ``split`` under ``plan``, loaded; its edge part runs on
    ``backend``'s kernels (``sarc.backends.registry``)."""
    source, lowering = _generate(split, plan, baseline, layer_name, workers, backend)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path, module = codegen.load_module(f"{split.layer.name}_dist_{digest}", source)
    module.ops = lowering.ops()
    return Generated(source, path, module, backend, tuple(lowering.fallbacks))
