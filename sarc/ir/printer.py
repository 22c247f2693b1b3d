"""Stable, Python-like text form of the IR (what golden files hold).

    def GCN(src, dst, edge, params):
        %0: src f32[N_src,16] = input "h"                # gcn.py:21
        %1: edge f32[E,16] = gather_src(%0)              # gcn.py:21
        ...
        return {"h": %7}

Source locations print as ``file:line`` with the file's base name, so dumps do
not depend on where the project is checked out. Names from the user's code (features,
parameters, outputs, the layer's class, its file) print as string literals or plain
text without line breaks (``sarc.names``): generated code carries these lines as
comments, which a name must not end.
"""
from __future__ import annotations

import os

from ..names import literal, shown
from .function import Function, Region, Value
from .ops import Op
from .types import DType


def format_attr(v) -> str:
    if isinstance(v, str):
        return literal(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, DType):
        return v.value
    return str(v)


def format_region(r: Region, indent: str, with_loc: bool) -> list[str]:
    lines = []
    for i, v in enumerate(r.values):
        lines.append(indent + format_value(i, v, with_loc, sigil="^"))
    lines.append(f"{indent}yield ^{r.result}")
    return lines


def format_value(i: int, v: Value, with_loc: bool = True, sigil: str = "%",
                 indent: str = "    ") -> str:
    lhs = f"{sigil}{i}: {v.type}"
    regions = [(k, a) for k, a in v.attrs if isinstance(a, Region)]
    if v.op is Op.ARG:
        rhs = f"arg {v.attr['index']} @{v.attr['side']}"
    elif v.op in (Op.INPUT, Op.PARAM):
        rhs = f'{v.op.value} {literal(v.attr["name"])}'
    elif v.op is Op.CONST:
        rhs = f"const {v.attr['value']!r}"
    else:
        args = [f"{sigil}{j}" for j in v.inputs]
        args += [f"{k}={format_attr(a)}" for k, a in v.attrs if not isinstance(a, Region)]
        rhs = f"{v.op.value}({', '.join(args)})"
    line = f"{lhs} = {rhs}"
    if with_loc and v.loc is not None:
        line = f"{line:<64} # {shown(os.path.basename(v.loc.file))}:{v.loc.line}"
    for name, r in regions:
        line += f"\n{indent}    {name}:\n" + "\n".join(
            format_region(r, indent + "        ", with_loc))
    return line


def format_function(fn: Function, with_loc: bool = True) -> str:
    header = f"def {shown(fn.name)}(src, dst, edge, params):"
    if fn.role != "layer":  # layers print as they always did (golden files)
        header += f"  # {fn.role}"
    lines = [header]
    for i, v in enumerate(fn.values):
        lines.append("    " + format_value(i, v, with_loc))
    outs = ", ".join(f"{literal(k)}: %{i}" for k, i in fn.outputs)
    lines.append(f"    return {{{outs}}}")
    return "\n".join(lines) + "\n"
