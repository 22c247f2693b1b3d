"""PyTorch backend: IR -> a readable Python module that runs on CPU and GPU.

Each IR value becomes one line of ordinary PyTorch, its IR instruction above it
as a comment (an add of a linear or a product takes in its line: one ``torch.addmm`` or
``torch.addcmul``; a sparse product takes in the scaling of its operand and of its
result by a number per node, at the line of the result's scaling); graph ops call the
CSR kernels of ``torch_ops``. The module
is rendered from a jinja2 template, written to a real file (so tracebacks and
debuggers show the generated code) and imported. Autograd gives the backward
pass, or, for a kernel compiled with a backward function (``autodiff="ir"``,
``sarc.ir.autodiff``), the generated code of that backward IR does, through a
``torch.autograd.Function``.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping

import torch

from ..amp import autocast_state
from ..backward_once import once_differentiable
from ..ir.function import Function, Region, Value, upstream
from ..ir.ops import Op
from ..ir import rng
from ..ir.autodiff import GRAD_PREFIX, reached_leaves
from ..ir.patterns import (ScaledProduct, accumulating_adds, contractions, dot_score,
                           dst_rows_of_src,
                           extremum_pattern, inplace_adds, lifted_extremum, region_sides,
                           region_width, scaled_products, softmax_value, spmm_pattern,
                           typed_spmm_pattern)
from ..ir.printer import format_value
from ..ir.types import Domain
from ..names import literal
from . import codegen


def _axis(v: Value) -> int:
    """The feature axis attribute as a torch dim (negative axes count from the end)."""
    axis = v.attr["axis"]
    return axis if v.type.domain is Domain.PARAM or axis < 0 else axis + 1


def _reshape(v: Value, a: list[str]) -> str:
    feat = ", ".join(str(d) for d in v.attr["feat"])
    if v.type.domain is Domain.PARAM:
        return f"{a[0]}.reshape({feat},)" if feat else f"{a[0]}.reshape(())"
    return f"{a[0]}.reshape({a[0]}.shape[0], {feat})" if feat else f"{a[0]}.reshape(-1)"


def number(x: float) -> str:
    """A float as Python code: ``repr`` where that is a literal, ``float("inf")`` and
    ``float("nan")`` where it is not."""
    x = float(x)
    return repr(x) if math.isfinite(x) else f'float("{x}")'


def dot_literal(dot: tuple[int, int, str | None, float]) -> str:
    """``patterns.dot_score``'s tuple as Python code."""
    src, dst, op, c = dot
    return f"({src}, {dst}, {literal(op) if op else None}, {number(c)})"


def _leaf(v: Value, a: list[str]) -> str:
    if v.op is Op.CONST:
        return f"torch.tensor({number(v.attr['value'])}, dtype={_dtype(v)}, device=g.device)"
    name = literal(v.attr["name"])  # the user's name: a string literal, never code
    if v.op is Op.PARAM:
        return f"params[{name}]"
    if v.type.domain is Domain.DST:
        return f"K.dst_rows(inputs[{name}], g)"
    return f"inputs[{name}]"


def _dtype(v: Value) -> str:
    return "torch." + {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                       "f64": "float64", "i64": "int64"}[v.type.dtype.value]


def _fused(v: Value, a: list[str], folds: tuple[tuple[int, int], ...] = ()) -> str:
    """Fused ops get their region functions' names first, then their operands; a result
    of half / bfloat16 in the IR is given in that dtype (``K.rounded``).

    Aggregates that are sparse matrix products (copy a source feature, maybe
    times an edge weight; attention over a source feature) run as CSR SpMM; the max / min
    of a source feature as a CSR extremum (``extremum_pattern``). ``folds``: an
    attention's operands given as a contraction's factor (``softmax_folds``).
    """
    code = _fused_call(v, a, folds)
    if v.type.dtype.value in ("f16", "bf16"):
        return f"K.rounded({code}, {_dtype(v)})"
    return code


def _fused_call(v: Value, a: list[str], folds: tuple[tuple[int, int], ...]) -> str:
    n = len([1 for _, r in v.attrs if isinstance(r, Region)])
    regions, operands = a[:n], list(a[n:])
    differentiated = differentiated_args(v)
    for k, x in enumerate(operands):
        if k not in differentiated:   # read under detach() only: no gradient, None as torch
            operands[k] = f"{x}.detach()"
    sides = region_sides(v)
    typed = typed_spmm_pattern(v)
    if typed is not None:
        x, table, types, w = typed
        weight = f", {operands[w]}" if w is not None else ""
        return (f"K.typed_spmm({literal(v.attr['kind'])}, g, {operands[x]}, {operands[table]}, "
                f"{operands[types]}{weight})")
    pattern = spmm_pattern(v)
    if pattern is not None:
        x, w, side = pattern
        weight = f", {operands[w]}" if w is not None else ", None"
        return f"K.spmm({literal(v.attr['kind'])}, g, {operands[x]}{weight}, {literal(side)})"
    x = extremum_pattern(v)
    if x is not None:
        return f"K.extremum_spmm({literal(v.attr['kind'])}, g, {operands[x]})"
    lifted = lifted_extremum(v)
    if lifted is not None:
        x, extremum = lifted
        return (f"K.extremum_lifted({literal(v.attr['kind'])}, {regions[0]}, {sides!r}, "
                f"{region_width(v)}, {x}, {literal(extremum)}, g, {', '.join(operands)})")
    z = softmax_value(v)
    score = v.attr.get("score") if v.op is Op.SOFTMAX_AGGREGATE else None
    if z is not None and (score.values[score.result].type.dtype !=
                          v.attr["value"].values[v.attr["value"].result].type.dtype
                          or any(x.op is Op.CAST for x in score.values)):
        z = None   # scores converted, or weights of another dtype than z's: as written
    if z is not None:
        reads = tuple(sorted({a.attr["index"] for a in score.values if a.op is Op.ARG}))
        dot = dot_score(v) if not folds else None
        if dot is not None:   # the scores one SDDMM of the two ends' rows
            feat = score.values[score.result].type.feat
            return (f"K.softmax_dot_spmm({regions[0]}, {sides!r}, {z}, {reads!r}, "
                    f"{region_width(v, 'score')}, {dot_literal(dot)}, {feat!r}, g, "
                    f"{', '.join(operands)})")
        fold = f", folds={folds!r}" if folds else ""
        return (f"K.softmax_spmm({regions[0]}, {sides!r}, {z}, {reads!r}, "
                f"{region_width(v, 'score')}, g, {', '.join(operands)}{fold})")
    if v.op is Op.SDDMM:
        return f"K.sddmm({regions[0]}, {sides!r}, g, {', '.join(operands)})"
    head = f"{literal(v.attr['kind'])}, " if v.op is Op.AGGREGATE else ""
    return (f"K.{v.op.value}({head}{', '.join(regions)}, {sides!r}, {region_width(v)}, g, "
            f"{', '.join(operands)})")


def differentiated_args(v: Value) -> set[int]:
    """The operands of fused op ``v`` its regions' results depend on other than through
    ``detach`` (an operand read only under it gets no gradient: passed detached, so that
    a parameter read so has ``None`` for its gradient, as torch gives it)."""
    def live(x: Value) -> bool:
        return x.op is not Op.DETACH
    return {r.values[i].attr["index"] for _, r in v.attrs
            if isinstance(r, Region) and live(r.values[r.result])
            for i in upstream(r.values, [r.result], live) if r.values[i].op is Op.ARG}


def _torch_perm(v: Value) -> tuple[int, ...]:
    perm = tuple(int(p) for p in v.attr["perm"])
    return perm if v.type.domain is Domain.PARAM else (0, *(p + 1 for p in perm))


def _expand(v: Value, a: list[str]) -> str:
    feat = ", ".join(str(d) for d in v.attr["feat"])
    if v.type.domain is Domain.PARAM:
        return f"{a[0]}.expand({feat},)" if feat else f"{a[0]}.expand(())"
    return f"K.expand_rows({a[0]}, ({feat},))"


Lowering = Callable[[Value, list[str]], str]

LOWERING: dict[Op, Lowering] = {
    Op.INPUT: _leaf,
    Op.PARAM: _leaf,
    Op.CONST: _leaf,
    Op.GATHER_SRC: lambda v, a: f"K.gather_src({a[0]}, g)",
    Op.GATHER_DST: lambda v, a: f"K.gather_dst({a[0]}, g)",
    Op.REDUCE: lambda v, a: f"K.segment_reduce({literal(v.attr['kind'])}, {a[0]}, g)",
    Op.EDGE_SOFTMAX: lambda v, a: f"K.edge_softmax({a[0]}, g)",
    Op.INDEX: lambda v, a: f"{a[0]}.index_select(0, {a[1]})",
    Op.NEG: lambda v, a: f"-{a[0]}",
    Op.EXP: lambda v, a: f"torch.exp({a[0]})",
    Op.LOG: lambda v, a: f"torch.log({a[0]})",
    Op.RELU: lambda v, a: f"torch.relu({a[0]})",
    Op.SIGMOID: lambda v, a: f"torch.sigmoid({a[0]})",
    Op.TANH: lambda v, a: f"torch.tanh({a[0]})",
    Op.ERF: lambda v, a: f"torch.erf({a[0]})",
    Op.COS: lambda v, a: f"torch.cos({a[0]})",
    Op.SIN: lambda v, a: f"torch.sin({a[0]})",
    Op.LOG1P: lambda v, a: f"torch.log1p({a[0]})",
    Op.DETACH: lambda v, a: f"{a[0]}.detach()",
    Op.CAST: lambda v, a: (f"K.cast_by_autocast({a[0]}, {_dtype(v)})" if v.attr.get("autocast")
                           else f"{a[0]}.to({_dtype(v)})"),
    Op.POW: lambda v, a: f"torch.pow({a[0]}, {number(v.attr['exponent'])})",
    Op.CLAMP_MIN: lambda v, a: f"torch.clamp_min({a[0]}, {number(v.attr['min'])})",
    Op.LEAKY_RELU: lambda v, a: f"F.leaky_relu({a[0]}, {number(v.attr['slope'])})",
    Op.ELU: lambda v, a: f"F.elu({a[0]}, {number(v.attr['alpha'])})",
    Op.SOFTPLUS: lambda v, a: (f"F.softplus({a[0]}, {number(v.attr['beta'])}, "
                               f"{number(v.attr['threshold'])})"),
    Op.DROPOUT: lambda v, a: (f"K.dropout({a[0]}, {number(v.attr['p'])}, seed, "
                              f"{int(v.attr['key'])}, training)"),
    Op.ADD: lambda v, a: f"{a[0]} + {a[1]}",
    Op.SUB: lambda v, a: f"{a[0]} - {a[1]}",
    Op.MUL: lambda v, a: f"{a[0]} * {a[1]}",
    Op.DIV: lambda v, a: f"{a[0]} / {a[1]}",
    Op.LINEAR: lambda v, a: f"torch.matmul({a[0]}, {a[1]}.t())",
    Op.MATMUL: lambda v, a: f"torch.matmul({a[0]}, {a[1]})",
    Op.TYPED_LINEAR: lambda v, a: f"K.typed_linear({a[0]}, {a[1]}, {a[2]})",
    Op.RESHAPE: _reshape,
    Op.CONCAT: lambda v, a: f"torch.cat([{', '.join(a)}], {_axis(v)})",
    Op.SUM_AXIS: lambda v, a: f"{a[0]}.sum({_axis(v)})",
    Op.MAX_AXIS: lambda v, a: f"{a[0]}.a{v.attr['kind']}({_axis(v)})",
    Op.SLICE: lambda v, a: (f"{a[0]}.narrow({_axis(v)}, {v.attr['start']}, "
                            f"{v.attr['stop'] - v.attr['start']})"),
    Op.ARG: lambda v, a: f"a{v.attr['index']}",
    Op.AGGREGATE: _fused,
    Op.SDDMM: _fused,
    Op.SOFTMAX_AGGREGATE: _fused,
    # ops of backward functions
    Op.SCATTER_SRC: lambda v, a: f"K.scatter_src({a[0]}, g)",
    Op.DST_TO_SRC: lambda v, a: f"K.dst_to_src({a[0]}, g)",
    Op.DIV_EDGE_COUNT: lambda v, a: f"K.div_edge_count({a[0]}, g)",
    Op.SUM_ROWS: lambda v, a: f"{a[0]}.sum(0)",
    Op.ROW_OUTER: lambda v, a: f"K.row_outer({a[0]}, {a[1]})",
    Op.TYPED_OUTER: lambda v, a: f"K.typed_outer({a[0]}, {a[1]}, {a[2]}, {v.attr['num_types']})",
    Op.INDEX_ADD: lambda v, a: f"K.index_add({a[0]}, {a[1]}, {v.attr['num_rows']})",
    Op.TRANSPOSE: lambda v, a: f"{a[0]}.transpose(-1, -2)",
    Op.WHERE_POS: lambda v, a: f"torch.where({a[0]} > 0, {a[1]}, {a[2]})",
    Op.EQ_MASK: lambda v, a: f"({a[0]} == {a[1]}).to({_dtype(v)})",
    Op.EXPAND: _expand,
    Op.PERMUTE: lambda v, a: f"{a[0]}.permute{_torch_perm(v)!r}",
    Op.PAD: lambda v, a: f"K.pad_axis({a[0]}, {_axis(v)}, {v.attr['before']}, {v.attr['after']})",
}


def region_function(name: str, r: Region, n_operands: int) -> list[str]:
    """A region as a Python function of the graph block and the per-edge operands."""
    args = ", ".join(f"a{k}" for k in range(n_operands))
    lines = [f"def {name}(g, {args}):"]
    for j, v in enumerate(r.values):
        lines.append(f"    # {format_value(j, v, with_loc=True, sigil='^')}")
        lines.append(f"    r{j} = {LOWERING[v.op](v, [f'r{i}' for i in v.inputs])}")
    lines.append(f"    return r{r.result}")
    return lines


def lower(i: int, v: Value, operands: list[str], regions: codegen.RegionNames) -> str:
    """Value ``v`` as a PyTorch expression (``codegen.Lower``): its regions' functions, then
    its operands, through ``LOWERING``."""
    return LOWERING[v.op](v, regions() + operands)


def emit(fn: Function, indices, lower: codegen.Lower = lower, **kw):
    """``codegen.emit_values`` with this backend's region functions."""
    return codegen.emit_values(fn, indices, lower, region_function=region_function, **kw)


class EdgeLowering:
    """The torch backend's lowering of a distributed schedule's edge part
    (``registry.EdgeLowering``): ``LOWERING``'s lines, ``torch_blocks``' block ops on the
    values' region functions."""

    def __init__(self, edge: Function, layer: str):
        self.fallbacks: list[str] = []
        self.op_lines: list[str] = []

    def lower(self, i: int, v: Value, regions: codegen.RegionNames, operands: list[str]) -> str:
        return LOWERING[v.op](v, regions() + operands)

    def surrogate(self, i: int, v: Value, regions: codegen.RegionNames, operands: list[str],
                  cot: str) -> str | None:
        pattern = spmm_pattern(v) if typed_spmm_pattern(v) is None else None
        if pattern is None:
            return None
        x, w, side = pattern
        weight = operands[w] if w is not None else "None"
        return (f"K.spmm_surrogate({cot}, {literal(v.attr['kind'])}, g, {operands[x]}, {weight}, "
                f"{literal(side)})")

    def block_op(self, name: str, i: int, v: Value,
                 bodies: codegen.RegionNames) -> tuple[str, list[str]]:
        if name in ("extremum_partial", "extremum_select"):
            source = extremum_pattern(v)
            if source is not None:  # its message a source feature as it is: no region function
                return f"DK.{name}", [f"DK.SourceRow({source})"]
            lifted = lifted_extremum(v)
            if lifted is not None:  # a source feature plus destination terms: at its extremum
                (body,) = bodies()
                return f"DK.{name}", [f"DK.LiftedRow({lifted[0]}, {literal(lifted[1])}, {body})"]
        dot = dot_score(v)
        if dot is not None:  # the scores one SDDMM of the two ends' rows
            score, *rest = bodies()
            feat = v.attr["score"].values[v.attr["score"].result].type.feat
            return f"DK.{name}", [f"DK.DotScore({score}, {dot_literal(dot)}, {feat!r})", *rest]
        return f"DK.{name}", bodies()

    def ops(self) -> tuple:
        return ()


def accumulated(fn: Function, added: int, a: list[str]) -> str:
    """``a[0]`` plus the value ``added`` computes, in one op, for an add of
    ``patterns.accumulating_adds`` reading the values ``accumulate_reads`` gives: a
    linear's GEMM accumulating into ``a[0]`` (``torch.addmm``, beta = 1), a product's
    ``torch.addcmul``."""
    if fn.values[added].op is Op.LINEAR:
        return f"torch.addmm({a[0]}, {a[1]}, {a[2]}.t())"
    return f"torch.addcmul({a[0]}, {a[1]}, {a[2]})"


def scaled_product(p: ScaledProduct, a: list[str]) -> str:
    """The call of a scaled sparse product reading ``p.reads()`` (names ``a``)."""
    names = dict(zip(p.reads(), a))
    scales = "".join(f", {side}_scale={names[j]}" for side, j in
                     (("src", p.src_scale), ("dst", p.dst_scale)) if j is not None)
    weight = names[p.weight] if p.weight is not None else "None"
    return f"K.spmm({literal(p.kind)}, g, {names[p.x]}, {weight}, \"src\"{scales})"


def accumulate_reads(fn: Function, fused: Mapping[int, tuple[int, int]]) -> dict[int, list[int]]:
    """What each add of ``fused`` reads as one op: its other operand and the operands of
    the value it adds (a linear's x and W, a product's factors), which is read no more."""
    return {i: [other, *fn.values[added].inputs] for i, (other, added) in fused.items()}


def live_values(fn: Function, reads: dict[int, list[int]]) -> set[int]:
    """The values the outputs need, each value reading ``reads[i]``."""
    live = {j for _, j in fn.outputs}
    for i in reversed(range(len(fn.values))):
        if i in live:
            live.update(reads[i])
    return live


def softmax_folds(fn: Function, contracted: Mapping[int, tuple[int, int]],
                  twins: Mapping[int, int]) -> dict[int, dict[int, tuple[int, int]]]:
    """attention value -> {operand k: (its contraction's param factor, the sum's torch
    dim)} for a score operand that is ``contract(z's rows, p)``, z the attention's
    value (its dst rows: a dst twin of z), p a param, read by the attention alone: the
    attention computes it from z and p, and its backward adds the contraction's
    gradient to z's in place (``torch_ops.softmax_spmm``'s ``folds``)."""
    users, outputs = fn.users(), {j for _, j in fn.outputs}
    found: dict[int, dict[int, tuple[int, int]]] = {}
    for i, v in enumerate(fn.values):
        zi = softmax_value(v)
        if zi is None:
            continue
        z, sides = v.inputs[zi], region_sides(v)
        for k, c in enumerate(v.inputs):
            if k == zi or c not in contracted or users[c] != [i] or c in outputs \
                    or v.inputs.count(c) != 1 or sides[k] not in ("src", "dst"):
                continue
            for a, p in (contracted[c], contracted[c][::-1]):
                rows_of_z = a == z if sides[k] == "src" else twins.get(a) == z
                if rows_of_z and fn.values[p].op is Op.PARAM:
                    found.setdefault(i, {})[k] = (p, _axis(fn.values[c]))
                    break
    return found


def generate(fn: Function) -> str:
    """Python source of ``forward(g, inputs, params, training, seed)`` for ``fn``.

    A dst value that is the first rows of a src value computed the same way
    (``patterns.dst_rows_of_src``) is that value's rows, not computed again. An add of a
    linear or a product (``patterns.accumulating_adds``) is one ``torch.addmm`` or
    ``torch.addcmul`` where both are computed as themselves and nothing else reads the
    added value (a dst value may be the rows of a src one). A sparse product scaled by a
    number per node (``patterns.scaled_products``) scales as it reads and writes. A sum
    of a product read by nothing else (``patterns.contractions``) is one contraction, or,
    read by an attention of z whose factor is z, part of it (``softmax_folds``). An
    add whose operand nothing reads after it is written over that operand where autograd
    allows (``patterns.inplace_adds``, ``torch_ops.add_``)."""
    twins = dst_rows_of_src(fn)
    reads = {i: [twins[i]] if i in twins else list(v.inputs) for i, v in enumerate(fn.values)}
    # a scaled operand is not computed: not where a dst value would be its rows
    scaled = {i: p for i, p in scaled_products(fn).items()
              if not {i, p.aggregate} & twins.keys()
              and not set(fn.values[p.aggregate].inputs) & set(twins.values())}
    reads.update({i: p.reads() for i, p in scaled.items()})
    contracted = {i: ab for i, ab in contractions(fn).items()
                  if not {i, fn.values[i].inputs[0]} & twins.keys()}
    reads.update({i: list(ab) for i, ab in contracted.items()})
    folds = softmax_folds(fn, contracted, twins)
    for i, fold in folds.items():
        reads[i] = [fold[k][0] if k in fold else j for k, j in enumerate(fn.values[i].inputs)]
    live = live_values(fn, reads)
    rows_read = {twins[i] for i in live if i in twins}
    fused = {i: (other, added) for i, (other, added) in accumulating_adds(fn).items()
             if not {i, added} & twins.keys() and added not in rows_read | scaled.keys()}
    reads.update(accumulate_reads(fn, fused))
    # not over a value whose rows a dst value is (``K.dst_rows``: a view of it)
    inplace = {i: k for i, (k, chain) in inplace_adds(fn).items()
               if not ({i, *chain} & (fused.keys() | twins.keys() | set(twins.values())))}

    def lower_rows(i: int, v: Value, operands: list[str], regions: codegen.RegionNames) -> str:
        if i in twins:
            return f"K.dst_rows({operands[0]}, g)"
        if i in scaled:
            return scaled_product(scaled[i], operands)
        if i in contracted:
            return f"K.contract({operands[0]}, {operands[1]}, {_axis(v)})"
        if i in folds:
            return _fused(v, regions() + operands,
                          tuple((k, dim) for k, (_, dim) in sorted(folds[i].items())))
        if i in inplace:
            k = inplace[i]
            return f"K.add_({operands[k]}, {operands[1 - k]})"
        return (accumulated(fn, fused[i][1], operands) if i in fused
                else lower(i, v, operands, regions))
    regions, body = emit(fn, sorted(live_values(fn, reads)), lower_rows,
                         live_out=[j for _, j in fn.outputs], inputs=reads)
    outputs = ", ".join(f"{literal(k)}: v{i}" for k, i in fn.outputs)
    return codegen.render("torch_layer.py.j2", fn=fn, body=body, outputs=outputs, regions=regions,
                          source=codegen.source_of(fn))


@dataclass
class TorchKernel:
    """A compiled layer: the IR it came from, its source, the loaded module.

    ``backward``, when set, is the compiled backward function of the layer
    (``sarc.ir.autodiff.grad``): calls that need gradients then run through
    ``_IRBackward``, whose backward runs it instead of torch autograd.
    """

    function: Function
    source: str
    path: Path
    module: ModuleType
    backward: "TorchKernel | None" = field(default=None)
    draws: bool = field(init=False)   # the layer has a dropout (``rng.draws_masks``)
    # per output, the ("param" | "input", name) leaves a gradient may reach from it
    reaches: tuple[frozenset, ...] = field(init=False)

    def __post_init__(self):
        self.draws = rng.draws_masks(self.function)
        self.reaches = output_reaches(self.function)

    def __call__(self, g, inputs, params, training: bool, seed: int | None = None):
        """Run the layer; a training call of a layer with dropout draws its seed
        (``sarc.ir.rng``) unless given."""
        seed = rng.call_seed(self.draws, training, seed)
        if self.backward is not None and torch.is_grad_enabled():
            return run_with_ir_backward(self, g, inputs, params, training, seed)
        return self.module.forward(g, inputs, params, training, seed)


def output_reaches(fn: Function) -> tuple[frozenset, ...]:
    """Per output of layer ``fn``, the leaves (``("param" | "input", name)``) a gradient
    may reach from it (``autodiff.reached_leaves``)."""
    reaches = []
    for _, i in fn.outputs:
        params, inputs = reached_leaves(fn, [i])
        reaches.append(frozenset({("param", n) for n in params} | {("input", n) for n in inputs}))
    return tuple(reaches)


def run_with_ir_backward(kernel: TorchKernel, g, inputs, params, training, seed):
    # The gradient outputs of the backward function say which leaves it differentiates.
    wanted = {name[len(GRAD_PREFIX):] for name, _ in kernel.backward.function.outputs}
    keys = [("param", k) for k in params if k in wanted]
    keys += [("input", k) for k in inputs if k in wanted]
    tensors = [params[k] if kind == "param" else inputs[k] for kind, k in keys]
    if not any(t.requires_grad for t in tensors):
        return kernel.module.forward(g, inputs, params, training, seed)
    names = [name for name, _ in kernel.function.outputs]
    outs = _IRBackward.apply(kernel, g, dict(inputs), dict(params), training, seed, keys,
                             *tensors)
    return dict(zip(names, outs))


class _IRBackward(torch.autograd.Function):
    """A layer call whose backward pass is the generated code of its backward IR.

    The backward function recomputes the forward values it needs from the
    leaves (rematerialization), so only the leaves are saved; the dropout seed
    of the call is kept, so recomputed dropouts draw the forward's masks, and so is
    the forward's autocast, under which it recomputes them (autograd runs a backward
    without it: a low cotangent then met a float32 weight in a matmul).
    """

    @staticmethod
    def forward(ctx, kernel, g, inputs, params, training, seed, keys, *tensors):
        inputs, params = _with_leaves(inputs, params, keys, tensors)
        out = kernel.module.forward(g, inputs, params, training, seed)
        ctx.kernel, ctx.g, ctx.inputs, ctx.params = kernel, g, inputs, params
        ctx.training, ctx.seed, ctx.keys, ctx.names = training, seed, keys, list(out)
        ctx.autocast = (g.device.type, *autocast_state(g.device.type))
        ctx.save_for_backward(*tensors)
        # an output that is a view (GAT's heads flattened) would be a view out of a custom
        # Function, which torch forbids writing in place (a residual ``h += x``): its own
        outs = tuple(t.clone() if t._base is not None else t for t in out.values())
        ctx.outs = [(t.shape, t.dtype) for t in outs]
        # as torch's autograd: an output no leaf needing a gradient reaches has no grad_fn,
        # and an output the loss does not read gives its leaves no gradient (None)
        tracked = {key for key, t in zip(keys, tensors) if t.requires_grad}
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(t for t, reach in zip(outs, kernel.reaches)
                                      if not reach & tracked))
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *cotangents):
        used = [c is not None for c in cotangents]
        if not any(used):
            return (None,) * (7 + len(ctx.keys))
        cotangents = [c if c is not None else torch.zeros(shape, dtype=dtype, device=ctx.g.device)
                      for c, (shape, dtype) in zip(cotangents, ctx.outs)]
        reached = frozenset().union(*(r for r, u in zip(ctx.kernel.reaches, used) if u))
        inputs, params = _with_leaves(ctx.inputs, ctx.params, ctx.keys, ctx.saved_tensors)
        feeds = {**inputs, **{GRAD_PREFIX + k: c for k, c in zip(ctx.names, cotangents)}}
        device_type, enabled, dtype = ctx.autocast
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            grads = ctx.kernel.backward.module.forward(ctx.g, feeds, params, ctx.training,
                                                       ctx.seed)
        return (None,) * 7 + tuple(grads.get(GRAD_PREFIX + key[1]) if key in reached else None
                                   for key in ctx.keys)


def _with_leaves(inputs, params, keys, tensors):
    """The call's inputs and params with the tracked tensors put in place."""
    inputs, params = dict(inputs), dict(params)
    for (kind, k), t in zip(keys, tensors):
        (params if kind == "param" else inputs)[k] = t
    return inputs, params


def compile(fn: Function, backward: Function | None = None) -> TorchKernel:
    """Compile layer ``fn``; with ``backward`` (its optimized backward function) the
    kernel's gradients come from that IR instead of torch autograd."""
    source = generate(fn)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path, module = codegen.load_module(f"{fn.name}_torch_{digest}", source)
    bwd = compile(backward) if backward is not None else None
    return TorchKernel(fn, source, path, module, bwd)
