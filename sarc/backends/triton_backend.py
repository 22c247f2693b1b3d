"""Triton backend: graph ops become generated Triton kernels, the rest stays PyTorch.

``compile(fn)`` turns an optimized layer into

- a layer module like the PyTorch backend's (one line per IR value, the IR
  instruction above it), in which every graph op calls a runtime op object
  (``ops[i]``, see ``triton_runtime``): an autograd function whose forward and
  backward launch generated kernels;
- the kernels themselves, one standalone module per kernel (``triton_source``),
  each with a header naming the IR op it implements, its launch grid and its
  autotune space. ``sarc compile --backend triton --emit kernels`` writes them.

Which kernels an IR op gets (``KERNEL_OPS``):

- ``aggregate`` (g-SpMM, CSR), ``sddmm``, ``softmax_aggregate`` (online
  softmax): a forward kernel with the region inlined (``triton_lower``), a
  merge kernel for split rows, and per float operand a gradient kernel: a CSR
  aggregate, a transposed (CSC) aggregate for operands read at the source, an
  SDDMM for edge operands (``triton_grad``); max / min also count ties, and
  softmax sums each row's score gradients (``sigma``, projected out);
- unfused graph ops get the same machinery with a one-value region: ``reduce``
  (an aggregate of an edge operand), ``gather_src`` / ``gather_dst`` (an SDDMM
  whose gradient is a transposed aggregate), ``scatter_src`` (a CSC aggregate);
  ``edge_softmax`` gets its own two kernels;
- ``typed_linear``: a segment GEMM over rows grouped by type, fusing the gather
  of its input when that input is a node value read per edge, plus the kernels
  of its backward;
- an aggregate of a typed linear's rows (``passes.fuse_typed_linear``, one of
  this backend's passes as of the PyTorch backend's): the aggregate over a node
  x type table (a batched GEMM computes the table), the aggregate over per-edge
  rows and those rows' segment GEMM; ``TypedAggregateOp`` takes the table where
  nodes x types are no more than edges, as the PyTorch backend's ``typed_spmm``.

Node-level ops (linear maps, elementwise math on nodes, reshapes) and dropout
run as PyTorch, exactly as in the PyTorch backend (its ``LOWERING`` table; an add
of a linear as one ``torch.addmm``, ``patterns.accumulating_adds``; a product stays its
own value, which its kernels may read; a dst value computed as a src value is, row by
row, is that value's first rows, ``patterns.dst_rows_of_src``: GAT's ``lin(dst.h)``).

No silent fallback: when a graph op cannot be lowered (``TritonLoweringError``,
e.g. a region that slices a feature axis), the op runs with the PyTorch
backend's kernels instead, a warning names the op and the reason, and the
compiled kernel lists it in ``fallbacks``; with ``SARC_TRITON_STRICT=1`` (or
``strict=True``) the error is raised.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

import torch

from ..errors import SarcError
from ..ir import rng
from ..ir.function import Function, Region, Value
from ..ir.ops import Op
from ..ir.patterns import (accumulating_adds, dst_rows_of_src, region_sides,
                           typed_spmm_pattern)
from ..ir.printer import format_value
from ..ir.types import Domain, TensorType
from ..names import literal, one_line
from . import codegen, torch_backend
from . import triton_source as TK
from .triton_grad import aggregate_grads, extra_types, sddmm_grads, softmax_grads
from .triton_lower import TritonLoweringError, compute_dtype

log = logging.getLogger("sarc.backends.triton")

MIN_TRITON = (3, 0)

KERNEL_OPS = frozenset({Op.AGGREGATE, Op.SDDMM, Op.SOFTMAX_AGGREGATE, Op.REDUCE,
                        Op.GATHER_SRC, Op.GATHER_DST, Op.SCATTER_SRC, Op.EDGE_SOFTMAX,
                        Op.TYPED_LINEAR})
"""IR ops that run as generated Triton kernels; every other op is a PyTorch line."""


class TritonUnavailable(SarcError):
    """Triton is missing or too old for the Triton backend."""


def check_triton() -> str:
    """Triton's version, or an error saying what is missing."""
    try:
        import triton
    except ImportError as e:
        raise TritonUnavailable(f"the Triton backend needs triton >= "
                                f"{'.'.join(map(str, MIN_TRITON))}, which is not installed ({e})") from None
    version = tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_TRITON:
        raise TritonUnavailable(f"the Triton backend needs triton >= "
                                f"{'.'.join(map(str, MIN_TRITON))}, found {triton.__version__}")
    return triton.__version__


def strict_default() -> bool:
    return os.environ.get("SARC_TRITON_STRICT", "") not in ("", "0")


# --- planning the kernels of one op ----------------------------------------------------------

def _copy_region(t: TensorType, side: str) -> Region:
    """The one-value region reading operand 0 at ``side`` (an unfused graph op as a fused one)."""
    arg = Value(Op.ARG, (), (("index", 0), ("side", side)),
                t if side == "param" else t.with_(domain=Domain.EDGE))
    return Region((arg,), 0)


_VIEW = {"dst": "csr", "src": "csc"}
_OTHER = {"dst": "src", "src": "dst"}


@dataclass
class _Plan:
    """The kernels of one IR op and how to build its runtime object from their modules."""

    kernels: list[TK.KernelSource] = field(default_factory=list)

    def add(self, k: TK.KernelSource) -> str:
        self.kernels.append(k)
        return k.name


def _aggregate_kernels(plan: _Plan, origin, prefix: str, role: str, body: Region, kind: str,
                       view: str, types, feat, cdtype: str, show_body: bool):
    main = plan.add(TK.aggregate(origin, f"{prefix}", role, body, kind, view, types, show_body))
    comb = plan.add(TK.combine(origin, f"{prefix}_combine", kind, feat, cdtype))
    return ("aggregate", kind, view, feat, main, comb)


def _fused_plan(origin: TK.Origin, prefix: str, v: Value, kind: str, row_side: str,
                regions: dict, types: list[TensorType], sides: tuple[str, ...],
                acc: str | None = None):
    """Kernels of an aggregate / sddmm / softmax_aggregate; returns (plan, builder spec);
    ``acc``: a softmax's statistics (max, sum, weighted sum) in that dtype."""
    plan = _Plan()
    out = v.type
    cdtype = acc or TK.cdtype_of(types)
    grads_spec: dict[int, tuple] = {}
    row_sum_spec = None
    value_extra = 0
    fine = False   # max / min: the region computes in float64 (y kept so, for the ties)
    if kind == "sddmm":
        fwd = ("sddmm", out.feat, plan.add(TK.sddmm(origin, f"{prefix}.forward", "forward",
                                                     regions["body"], types)))
        grads = sddmm_grads(regions["body"], types, sides, out)
        ext = extra_types("sddmm", out)
    elif kind == "softmax":
        score, value = regions["score"], regions["value"]
        st = score.values[score.result].type
        vt = value.values[value.result].type
        value_extra = len(vt.feat) - len(st.feat)
        main = plan.add(TK.softmax_aggregate(origin, f"{prefix}.forward", score, value, types,
                                             acc))
        comb = plan.add(TK.softmax_combine(origin, f"{prefix}.forward_combine", st.feat, vt.feat,
                                           cdtype))
        fwd = ("softmax", st.feat, out.feat, main, comb)
        grads, sigma = softmax_grads(score, value, types, sides, out)
        ext = extra_types("softmax", out, st)
        row_sum_spec = _aggregate_kernels(plan, origin, f"{prefix}.sigma", "per-row sum of the "
                                        "score gradients (the backward projects it out: their "
                                        "rows sum to zero)", sigma, "sum", "csr", types + ext,
                                        st.feat, cdtype, True)
    else:
        body = regions["body"]
        fwd = _aggregate_kernels(plan, origin, f"{prefix}.forward", "forward", body, kind,
                                 _VIEW[row_side], types, out.feat, cdtype, False)
        grads, count = aggregate_grads(body, kind, row_side, types, sides, out)
        fine = count is not None and compute_dtype(body) == "tl.float64"
        ext = extra_types(kind, out)
        if count is not None:
            row_sum_spec = _aggregate_kernels(plan, origin, f"{prefix}.ties", "ties per row (the "
                                            "backward of max / min splits among them)", count,
                                            "sum", _VIEW[row_side], types + ext, out.feat, cdtype,
                                            True)
    all_types = types + ext
    for gr in grads:
        t = types[gr.operand]
        name = f"{prefix}.grad{gr.operand}"
        if gr.side == "edge":
            role = f"gradient of operand {gr.operand} (read per edge): an SDDMM"
            grads_spec[gr.operand] = ("edge", ("sddmm", t.feat, plan.add(
                TK.sddmm(origin, name, role, gr.region, all_types, show_body=True))))
            continue
        if gr.side == "param":
            view, feat = _VIEW[row_side], t.feat
            role = (f"gradient of parameter operand {gr.operand}: per-row sums over the edges "
                    f"(the rows are summed after)")
        else:
            view, feat = _VIEW[gr.side], t.feat
            how = "an aggregate over CSR" if view == "csr" else \
                "a transposed aggregate over CSC (rows = sources)"
            role = f"gradient of operand {gr.operand} (read at {gr.side}): {how}"
        grads_spec[gr.operand] = (gr.side, _aggregate_kernels(
            plan, origin, name, role, gr.region, "sum", view, all_types, feat, cdtype, True))
    return plan, ("fused", kind, row_side, fwd, grads_spec, row_sum_spec, value_extra, fine)


def plan_op(fn: Function, i: int, folded: dict[int, int], acc: str | None = None):
    """The kernels of value ``i`` (a ``KERNEL_OPS`` op) and the spec of its runtime object;
    ``acc``: a softmax aggregate's statistics in that dtype (``"tl.float64"``: a distributed
    block's), not the operands'."""
    v = fn.values[i]
    origin = TK.Origin(fn.name, codegen.source_of(fn),
                       tuple(format_value(i, v, with_loc=True).split("\n")))
    prefix = f"v{i}_{v.op.value}"
    types = [fn.values[j].type for j in v.inputs]
    if typed_spmm_pattern(v) is not None:
        return _typed_plan(origin, prefix, v, types)
    if v.op in (Op.AGGREGATE, Op.SDDMM, Op.SOFTMAX_AGGREGATE):
        regions = {k: r for k, r in v.attrs if isinstance(r, Region)}
        sides = region_sides(v)
        kind = {Op.SDDMM: "sddmm", Op.SOFTMAX_AGGREGATE: "softmax"}.get(v.op) or v.attr["kind"]
        return _fused_plan(origin, prefix, v, kind, "dst", regions, types, sides, acc)
    if v.op is Op.REDUCE:
        return _fused_plan(origin, prefix, v, v.attr["kind"], "dst",
                           {"body": _copy_region(types[0], "edge")}, types, ("edge",))
    if v.op is Op.SCATTER_SRC:
        return _fused_plan(origin, prefix, v, "sum", "src",
                           {"body": _copy_region(types[0], "edge")}, types, ("edge",))
    if v.op in (Op.GATHER_SRC, Op.GATHER_DST):
        side = "src" if v.op is Op.GATHER_SRC else "dst"
        return _fused_plan(origin, prefix, v, "sddmm", "dst",
                           {"body": _copy_region(types[0], side)}, types, (side,))
    if v.op is Op.EDGE_SOFTMAX:
        plan = _Plan()
        n = math.prod(v.type.feat)
        cd = TK.cdtype_of(types)
        f = plan.add(TK.edge_softmax(origin, f"{prefix}.forward", n, cd, grad=False))
        b = plan.add(TK.edge_softmax(origin, f"{prefix}.backward", n, cd, grad=True))
        return plan, ("edge_softmax", f, b)
    if v.op is Op.TYPED_LINEAR:
        plan = _Plan()
        x = fn.values[v.inputs[0]]
        gather = None
        if i in folded:
            gather = "src" if x.op is Op.GATHER_SRC else "dst"
        node_t = fn.values[x.inputs[0]].type if gather is not None else None
        return plan, _typed_linear_kernels(plan, origin, prefix, v.type.dtype, gather, node_t)
    raise AssertionError(f"{v.op} is not a kernel op")


def plan_softmax_site(fn: Function, i: int):
    """The kernels of an unfused edge_softmax (value ``i``) on a distributed block: its
    normalizer pass, global weights and their gradients (``triton_blocks``), and the spec
    of its runtime object."""
    v = fn.values[i]
    assert v.op is Op.EDGE_SOFTMAX, v.op
    origin = TK.Origin(fn.name, codegen.source_of(fn),
                       tuple(format_value(i, v, with_loc=True).split("\n")))
    plan, n = _Plan(), math.prod(v.type.feat)
    parts = {part: plan.add(TK.softmax_site(origin, f"v{i}_edge_softmax_site.{part}", part, n))
             for part in TK.SITE_PARTS}
    return plan, ("softmax_site", parts)


def _typed_linear_kernels(plan: _Plan, origin, prefix: str, dt, gather: str | None,
                          node_t: TensorType | None) -> tuple:
    """The segment GEMM's kernels (forward, input and weight gradients, and the scatter of
    the input gradient to the node rows when the input is gathered at ``gather``)."""
    f = plan.add(TK.typed_linear(origin, f"{prefix}.forward", "forward", dt))
    gx = plan.add(TK.typed_linear(origin, f"{prefix}.grad_x", "input gradient: "
                                  "dx[i] = dy[i] @ W[t_i]^T (per row, before the scatter)", dt))
    gw = plan.add(TK.typed_outer(origin, f"{prefix}.grad_w", dt))
    scatter = None
    if gather is not None:
        edge_t = node_t.with_(domain=Domain.EDGE)
        scatter = _aggregate_kernels(
            plan, origin, f"{prefix}.grad_x_scatter",
            f"input gradient: the per-edge dx summed into the {gather} rows it was gathered "
            f"from ({'a transposed aggregate over CSC' if gather == 'src' else 'CSR'})",
            _copy_region(edge_t, "edge"), "sum", _VIEW[gather], [edge_t], node_t.feat,
            TK.cdtype_of([edge_t]), True)
    return ("typed_linear", gather, f, gx, gw, scatter)


def _rows_region(body: Region, drop: tuple[int, ...], side: str) -> Region:
    """``body`` with its typed linear read as operand 0 at ``side`` (the typed rows) and its
    other operands renumbered after it; the linear's own operands ``drop`` are gone."""
    rest = [k for k in sorted({a.attr["index"] for a in body.values if a.op is Op.ARG})
            if k not in drop]
    values: list[Value] = []
    remap: dict[int, int] = {}
    for r, rv in enumerate(body.values):
        if rv.op is Op.ARG and rv.attr["index"] in drop:
            continue
        remap[r] = len(values)
        if rv.op is Op.TYPED_LINEAR:
            values.append(Value(Op.ARG, (), (("index", 0), ("side", side)), rv.type, rv.loc))
        elif rv.op is Op.ARG:
            attrs = dict(rv.attrs, index=1 + rest.index(rv.attr["index"]))
            values.append(replace(rv, attrs=tuple(attrs.items())))
        else:
            values.append(replace(rv, inputs=tuple(remap[q] for q in rv.inputs)))
    return Region(tuple(values), remap[body.result])


def _typed_plan(origin: TK.Origin, prefix: str, v: Value, types: list[TensorType]):
    """An aggregate of a typed linear's rows (``passes.fuse_typed_linear``): the aggregate
    over a node x type table and the one over per-edge rows, and the segment GEMM's kernels
    for the latter (``triton_runtime.TypedAggregateOp`` picks one per graph)."""
    x, table, tids, _ = typed_spmm_pattern(v)
    body = v.attr["body"]
    rows_t = next(rv.type for rv in body.values if rv.op is Op.TYPED_LINEAR)
    rest = [t for k, t in enumerate(types) if k not in (x, table, tids)]
    plan = _Plan()
    specs = []
    for name, side, domain in (("table", "src", types[x].domain), ("edges", "edge", Domain.EDGE)):
        region = _rows_region(body, (x, table, tids), side)
        part_types = [rows_t.with_(domain=domain), *rest]
        sides = {a.attr["index"]: a.attr["side"] for a in region.values if a.op is Op.ARG}
        part, spec = _fused_plan(origin, f"{prefix}.{name}", v, v.attr["kind"], "dst",
                                 {"body": region}, part_types,
                                 tuple(sides[k] for k in range(len(part_types))))
        plan.kernels.extend(part.kernels)
        specs.append(spec)
    linear = _typed_linear_kernels(plan, origin, f"{prefix}.rows", rows_t.dtype, "src", types[x])
    return plan, ("typed_aggregate", x, table, tids, *specs, linear)


def build_op(spec, name: str, mods: dict[str, ModuleType], dtype):
    """The runtime object of one op from its spec and loaded kernel modules."""
    from . import triton_runtime as T

    def agg(s):
        _, kind, view, feat, main, comb = s
        return T.AggregateKernel(kind, view, feat, mods[main], mods[comb])

    def kernel(s):
        if s[0] == "sddmm":
            return T.SddmmKernel(s[1], mods[s[2]])
        return agg(s)

    if spec[0] == "fused":
        _, kind, row_side, fwd, grads, row_sum, value_extra, fine = spec
        if fwd[0] == "softmax":
            forward = T.SoftmaxKernel(fwd[1], fwd[2], mods[fwd[3]], mods[fwd[4]])
        else:
            forward = kernel(fwd)
        return T.FusedOp(name, kind, row_side, dtype, forward,
                         {k: T.Grad(k, side, kernel(s)) for k, (side, s) in grads.items()},
                         agg(row_sum) if row_sum is not None else None, value_extra,
                         torch.float64 if fine else None)
    if spec[0] == "edge_softmax":
        return T.EdgeSoftmaxOp(name, mods[spec[1]], mods[spec[2]])
    if spec[0] == "softmax_site":
        return T.SoftmaxSiteOp(name, {part: mods[k] for part, k in spec[1].items()})
    if spec[0] == "typed_aggregate":
        _, x, table, tids, by_table, by_edge, linear = spec
        return T.TypedAggregateOp(name, x, table, tids, build_op(by_table, name, mods, dtype),
                                  build_op(by_edge, name, mods, dtype),
                                  build_op(linear, name, mods, dtype))
    _, gather, f, gx, gw, scatter = spec
    return T.TypedLinearOp(name, gather, mods[f], mods[gx], mods[gw],
                           agg(scatter) if scatter is not None else None)


# --- the layer module --------------------------------------------------------------------

def _folded_gathers(fn: Function) -> dict[int, int]:
    """typed_linear value -> the gather it reads when that gather has no other user."""
    users = fn.users()
    outputs = {j for _, j in fn.outputs}
    out = {}
    for i, v in enumerate(fn.values):
        if v.op is Op.TYPED_LINEAR:
            x = v.inputs[0]
            if fn.values[x].op in (Op.GATHER_SRC, Op.GATHER_DST) and users[x] == [i] \
                    and x not in outputs:
                out[i] = x
    return out


@dataclass
class _Generated:
    source: str
    specs: list
    kernels: list[TK.KernelSource]
    fallbacks: list[str]


def generate(fn: Function, strict: bool | None = None) -> _Generated:
    strict = strict_default() if strict is None else strict
    folded = _folded_gathers(fn)
    skipped = set(folded.values())
    inputs = {i: [] if i in skipped else list(v.inputs) for i, v in enumerate(fn.values)}
    for i, x in folded.items():
        inputs[i][0] = fn.values[x].inputs[0]
    # a dst value computed as a src value is, row by row, is its rows (as the torch
    # backend's: GAT's lin(dst.h), EdgeConv's theta(h_v)), not a product of its own
    twins = dst_rows_of_src(fn)
    for i, j in twins.items():
        inputs[i] = [j]
    rows_read = {twins[i] for i in torch_backend.live_values(fn, inputs) if i in twins}
    fused = {i: pair for i, pair in accumulating_adds(fn, ops=(Op.LINEAR,)).items()
             if not {i, pair[1]} & twins.keys() and pair[1] not in rows_read}
    inputs.update(torch_backend.accumulate_reads(fn, fused))
    fused_linears = {linear for _, linear in fused.values()}
    specs, kernels, fallbacks, op_lines = [], [], [], []

    def lower(i: int, v: Value, args: list[str], region_names) -> str | tuple[str, ...]:
        if i in skipped:
            return (f"# (read row by row inside the typed_linear kernel of %{_user(folded, i)})",)
        if i in twins:
            return f"K.dst_rows({args[0]}, g)"
        if i in fused:
            return torch_backend.accumulated(fn, fused[i][1], args)
        if v.op not in KERNEL_OPS:
            return torch_backend.lower(i, v, args, region_names)
        try:
            plan, spec = plan_op(fn, i, folded)
        except TritonLoweringError as e:
            fallback(fn.name, i, v, e, strict, fallbacks)
            if i in folded:  # the folded gather must exist after all
                side = "src" if fn.values[folded[i]].op is Op.GATHER_SRC else "dst"
                args = [f"K.gather_{side}({args[0]}, g)", *args[1:]]
            return (f"# fallback to the PyTorch backend: {one_line(e)}",
                    f"v{i} = {torch_backend.lower(i, v, args, region_names)}")
        n = len(specs)
        specs.append((i, spec, v.type.dtype))
        kernels.extend(plan.kernels)
        op_lines.append(f"ops[{n}]: %{i} {v.op.value} -> kernels "
                        + ", ".join(k.name for k in plan.kernels))
        return f"ops[{n}](g, {', '.join(args)})"

    live = torch_backend.live_values(fn, inputs)
    emitted = [i for i in range(len(fn.values)) if i not in fused_linears and i in live]
    regions, body = torch_backend.emit(fn, emitted, lower, inputs=inputs,
                                       live_out=[j for _, j in fn.outputs])
    outputs = ", ".join(f"{literal(k)}: v{i}" for k, i in fn.outputs)
    source = codegen.render("triton_layer.py.j2", fn=fn, body=body, outputs=outputs,
                            regions=regions, source=codegen.source_of(fn), op_lines=op_lines)
    return _Generated(source, specs, kernels, fallbacks)


def fallback(layer: str, i: int, v: Value, error: TritonLoweringError, strict: bool,
             fallbacks: list[str]) -> None:
    """The no-silent-fallback rule: under ``strict`` the error is raised; otherwise a warning
    names the op and the reason, and the reason is listed in ``fallbacks``."""
    reason = f"%{i} {v.op.value}: {error}"
    if strict:
        raise TritonLoweringError(f"layer {layer}, {reason}") from None
    log.warning("sarc triton backend: %s; running it with the PyTorch backend's kernels "
                "instead", reason)
    fallbacks.append(reason)


def _user(folded: dict[int, int], x: int) -> int:
    return next(i for i, j in folded.items() if j == x)


@dataclass
class TritonKernel:
    """A compiled layer: the IR, the layer module, its runtime ops and kernel sources.

    ``backward``, when set, is the compiled backward function of the layer
    (``autodiff="ir"``): gradients then come from its generated code, run as the
    PyTorch backend runs it (``torch_backend.run_with_ir_backward``), instead of
    the ops' own backward kernels.
    """

    function: Function
    source: str
    path: Path
    module: ModuleType
    ops: tuple
    kernels: tuple[TK.KernelSource, ...]
    fallbacks: tuple[str, ...]
    backward: "TritonKernel | None" = None
    draws: bool = field(init=False)   # the layer has a dropout (``rng.draws_masks``)

    def __post_init__(self):
        self.draws = rng.draws_masks(self.function)

    def __call__(self, g, inputs, params, training: bool, seed: int | None = None):
        seed = rng.call_seed(self.draws, training, seed)
        if self.backward is not None and torch.is_grad_enabled():
            return torch_backend.run_with_ir_backward(self.bound(), g, inputs, params,
                                                       training, seed)
        return self.module.forward(g, inputs, params, training, seed, ops=self.ops)

    def bound(self) -> "_Bound":
        """This kernel as the PyTorch backend's IR-backward runner sees a kernel."""
        return _Bound(self.function, _BoundModule(self.module, self.ops),
                      self.backward.bound() if self.backward is not None else None,
                      torch_backend.output_reaches(self.function))

    def kernel_files(self) -> dict[str, str]:
        """Each kernel's module text by file name (``sarc compile --emit kernels``)."""
        files = {f"{k.name}.py": k.source for k in self.kernels}
        if self.backward is not None:
            files[f"{self.backward.function.name}.triton.py"] = self.backward.source
            files.update({f"{self.backward.function.name}.{n}": t
                          for n, t in self.backward.kernel_files().items()})
        return files


@dataclass(frozen=True)
class _BoundModule:
    module: ModuleType
    ops: tuple

    def forward(self, g, inputs, params, training, seed=None):
        return self.module.forward(g, inputs, params, training, seed, ops=self.ops)


@dataclass(frozen=True)
class _Bound:
    function: Function
    module: _BoundModule
    backward: "_Bound | None"
    reaches: tuple = ()   # torch_backend.output_reaches of function


def load_ops(fn: Function, specs, kernels: list[TK.KernelSource]) -> tuple:
    """The runtime objects of ``fn``'s values ``specs`` (``(index, spec, dtype)``, from
    ``plan_op``), their ``kernels`` imported."""
    version = check_triton()
    interp = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    # the kernels are decorated when imported: interpreted or compiled depends on the
    # environment then, so it is part of the cache key
    salt = f"triton {version} interpret={interp}"
    mods: dict[str, ModuleType] = {}
    for k in kernels:
        digest = hashlib.sha256((salt + k.source).encode()).hexdigest()[:16]
        _, mods[k.name] = codegen.load_module(f"{fn.name}_{k.name.replace('.', '_')}_{digest}",
                                              k.source)
    return tuple(build_op(spec, f"{fn.name} %{i} {fn.values[i].op.value}", mods, dt.to_torch())
                 for i, spec, dt in specs)


def compile(fn: Function, backward: Function | None = None,
            strict: bool | None = None) -> TritonKernel:
    """Compile layer ``fn``; with ``backward`` (its optimized backward function) the
    gradients come from that IR, compiled by this backend too."""
    check_triton()
    gen = generate(fn, strict)
    ops = load_ops(fn, gen.specs, gen.kernels)
    digest = hashlib.sha256(gen.source.encode()).hexdigest()[:16]
    path, module = codegen.load_module(f"{fn.name}_triton_{digest}", gen.source)
    bwd = compile(backward, strict=strict) if backward is not None else None
    return TritonKernel(fn, gen.source, path, module, ops, tuple(gen.kernels),
                        tuple(gen.fallbacks), bwd)
