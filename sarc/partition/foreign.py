"""Partitions written by other systems, converted to sarc's format.

A reader (``dgl_format``, ``pyg_format``) turns a foreign partition directory
back into a ``ForeignGraph``: the whole graph in its original ids and edge
order, the foreign partitioner's node assignment as a ``Relabeling``, and the
node and edge data in the original order. ``write_foreign`` then cuts and
writes it like any sarc partition set (``cut_parts``, ``write_partitions``,
atomically), so the result loads with ``load_partitions`` and carries the
fingerprint of the original graph.

    read_dgl_partitions(CONFIG.json, orig_ids=...)  -> ForeignGraph
    read_pyg_partitions(ROOT)                       -> ForeignGraph
    write_foreign(graph, OUT)                       -> PartitionSet

A heterogeneous partition (several node or edge types) becomes one
homogeneous graph with type ids, as ``dgl.to_homogeneous`` and PyG's
``HeteroData.to_homogeneous`` number it: nodes by type (in the foreign
format's type order), then by their id within the type; edges likewise. The
node data gains ``ntype`` and the edge data ``etype`` (int64 type ids), and
``merge_typed`` joins each type's data of one name into one tensor:

- a type without the data gets a filler row: 0 for floating point data,
  False for bool (masks), -1 for signed integers (``label``: unlabeled, so a
  type without labels is never trained or evaluated on), 0 for unsigned ones;
- floating point data of different widths per type (``feat`` of 128 columns
  for papers, 64 for authors) is zero-padded to the widest, and the width of
  each type is recorded in the set's ``types`` metadata;
- anything else that differs between types (integer data of different
  widths, a float in one type and an integer in another, per-row shapes of
  different ranks) and data that is not a numeric tensor are refused, naming
  the data and the types.

The set's metadata keeps the types (``types``: ``ntypes``, ``etypes``,
``num_ntypes``, ``num_etypes``, and per data name the shape each type had).

``load_torch_file`` reads the ``.pt`` files of a foreign directory without
running arbitrary code: ``torch.load(weights_only=True)``, or, for files it
rejects only because of a plain container it does not allowlist (PyG writes
``collections.defaultdict``), an unpickler that admits torch's weights-only
globals and those containers, nothing else, and that fills in only objects the
file itself made (never a class or a global, so loading changes no state).
"""
from __future__ import annotations

import collections
import functools
import pickle
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from ..errors import PartitionError, SarcError
from ..atomic import check_target
from ..records import load_problem
from .fingerprint import graph_fingerprint
from .format import SET_KIND, PartitionSet, write_partitions
from .parts import cut_parts
from .pipeline import BALANCE_MASKS
from .relabel import Relabeling
from .stats import partition_stats


class MissingDependencyError(SarcError, ImportError):
    """Reading a foreign format needs a package this environment lacks."""


@dataclass(frozen=True, eq=False)
class ForeignGraph:
    """A graph read back from a foreign partition directory, with that partition.

    ``src``, ``dst``: the edge list in original node ids and original edge
    order; ``relabeling``: the foreign partition (part p owns new ids
    ``offsets[p] .. offsets[p+1]-1``); ``node_data`` / ``edge_data`` in the
    original node / edge order; ``method`` as recorded in sarc's metadata
    (``dgl:metis``, ``pyg:metis``, ...); ``source``: where it came from.
    """

    src: torch.Tensor
    dst: torch.Tensor
    num_nodes: int
    relabeling: Relabeling
    node_data: dict[str, torch.Tensor]
    edge_data: dict[str, torch.Tensor]
    method: str
    source: dict = field(default_factory=dict)
    types: dict | None = None  # a heterogeneous graph's types (``merge_typed``); None: one type

    @property
    def num_parts(self) -> int:
        return self.relabeling.num_parts

    @property
    def fingerprint(self) -> str:
        return graph_fingerprint(self.src, self.dst, self.num_nodes)

    def part_of(self) -> torch.Tensor:
        """[N]: the part of each original node."""
        r = self.relabeling
        return r.part_of(r.orig_to_new)


def write_foreign(graph: ForeignGraph, out, *, overwrite: bool = False) -> PartitionSet:
    """Write ``graph`` as a sarc partition set at ``out``, under its foreign partition.

    The masks of ``BALANCE_MASKS`` present as bool node data are counted per
    part in the stats, as ``partition_graph`` counts them.
    """
    check_target(Path(out), overwrite, SET_KIND)
    masks = {k: graph.node_data[k] for k in BALANCE_MASKS
             if k in graph.node_data and graph.node_data[k].dtype == torch.bool}
    stats = partition_stats(graph.src, graph.dst, graph.relabeling, masks)
    parts = cut_parts(graph.src, graph.dst, graph.relabeling, graph.node_data, graph.edge_data)
    return write_partitions(out, parts, relabeling=graph.relabeling, fingerprint=graph.fingerprint,
                            num_edges=graph.src.numel(), stats=stats, method=graph.method,
                            seed=None, source=graph.source, types=graph.types,
                            overwrite=overwrite)


# --- heterogeneous graphs -----------------------------------------------------------------

NTYPE, ETYPE = "ntype", "etype"
"""The node data and edge data that hold a heterogeneous graph's type ids."""


def types_record(ntypes, etypes, node_shapes: dict, edge_shapes: dict) -> dict:
    """The ``types`` metadata of a heterogeneous graph: type names in id order, and per
    data name the per-row shape each type had (types without it are absent)."""
    return {"ntypes": list(ntypes), "etypes": list(etypes), "num_ntypes": len(ntypes),
            "num_etypes": len(etypes), "node_data": node_shapes, "edge_data": edge_shapes}


def merge_typed(rows_of: Mapping[str, int], data_of: Mapping[str, Mapping[str, torch.Tensor]],
                what: str, where) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """Each type's data joined into one tensor per name, the types' rows in the order of
    ``rows_of`` ({type: rows}); ``data_of`` is {type: {name: [rows, ...]}}. Returns the
    tensors and, per name, each type's per-row shape (the module's docstring has the rules)."""
    names = sorted({k for d in data_of.values() for k in d})
    out, shapes = {}, {}
    for name in names:
        have = {t: data_of[t][name] for t in rows_of if name in data_of.get(t, {})}
        for t, x in have.items():
            if not isinstance(x, torch.Tensor) or x.dtype.is_complex or x.dim() == 0:
                desc = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) \
                    else type(x).__name__
                raise PartitionError(f"{where}: {what} data {name!r} of type {t!r} is {desc}; "
                                     f"sarc reads numeric tensors with a row per {what}")
            if x.shape[0] != rows_of[t]:
                raise PartitionError(f"{where}: {what} data {name!r} of type {t!r} has "
                                     f"{x.shape[0]} rows for {rows_of[t]} {what}s")
        out[name], shapes[name] = _join_types(name, rows_of, have, what, where)
    return out, shapes


def _join_types(name, rows_of, have, what, where):
    kinds = {t: "bool" if x.dtype == torch.bool else "float" if x.dtype.is_floating_point
             else "integer" for t, x in have.items()}
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{have[t].dtype} in {t!r}" for t in have)
        raise PartitionError(f"{where}: {what} data {name!r} is {listed}; sarc joins the types' "
                             f"data only where all are floating point, all integer or all bool")
    kind = next(iter(kinds.values()))
    ranks = {x.dim() for x in have.values()}
    widths = {tuple(x.shape[1:]) for x in have.values()}
    if len(ranks) > 1 or (len(widths) > 1 and (kind != "float" or ranks != {2})):
        listed = ", ".join(f"{list(x.shape[1:])} in {t!r}" for t, x in have.items())
        raise PartitionError(f"{where}: {what} data {name!r} has per-row shapes {listed}; "
                             f"only floating point features of different widths are joined "
                             f"(zero-padded to the widest)")
    dtype = functools.reduce(torch.promote_types, (x.dtype for x in have.values()))
    row = max(widths)
    fill = {"float": 0, "bool": False, "integer": -1 if dtype.is_signed else 0}[kind]
    out = torch.full((sum(rows_of.values()), *row), fill, dtype=dtype)
    start = 0
    for t, count in rows_of.items():
        if t in have:
            x = have[t]
            if x.dim() == 2:
                out[start:start + count, :x.shape[1]] = x
            else:
                out[start:start + count] = x
        start += count
    return out, {t: list(x.shape[1:]) for t, x in have.items()}


# --- checks shared by the readers ---------------------------------------------------------

def check_cover(ids: torch.Tensor, count: int, what: str, where) -> None:
    """Raise unless ``ids`` lists each of ``0 .. count-1`` exactly once."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= count):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise PartitionError(f"{where}: {what} id {bad} is out of range (the graph has "
                             f"{count} {what}s)")
    seen = torch.bincount(ids, minlength=count)
    if ids.numel() != count or bool((seen != 1).any()):
        missing = int((seen == 0).sum())
        twice = int((seen > 1).sum())
        raise PartitionError(f"{where}: the parts do not hold every {what} exactly once "
                             f"({missing} of {count} missing, {twice} held more than once)")


def permutation_relabeling(offsets: torch.Tensor, new_to_orig: torch.Tensor, where) -> Relabeling:
    """The relabeling with these ranges and this new -> original map, checked."""
    n = int(new_to_orig.numel())
    check_cover(new_to_orig, n, "node", where)
    orig_to_new = torch.empty_like(new_to_orig)
    orig_to_new[new_to_orig] = torch.arange(n)
    return Relabeling(offsets, new_to_orig, orig_to_new)


def scatter_rows(chunks: list[tuple[torch.Tensor, torch.Tensor]], count: int, name: str, where
                 ) -> torch.Tensor:
    """One ``[count, ...]`` tensor from (ids, rows) chunks whose ids cover ``0..count-1``."""
    first = chunks[0][1]
    out = torch.empty((count, *first.shape[1:]), dtype=first.dtype)
    for ids, rows in chunks:
        if rows.shape[1:] != first.shape[1:] or rows.dtype != first.dtype:
            raise PartitionError(f"{where}: data {name!r} is {rows.dtype} {list(rows.shape[1:])} "
                                 f"per row in one part and {first.dtype} {list(first.shape[1:])} "
                                 f"in another")
        if rows.shape[0] != ids.numel():
            raise PartitionError(f"{where}: data {name!r} has {rows.shape[0]} rows in a part "
                                 f"holding {ids.numel()}")
        out[ids] = rows
    return out


def as_index(t, what: str, where) -> torch.Tensor:
    """A 1-d int64 tensor, or an error naming the file."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point \
            or t.dtype in (torch.bool, torch.complex64, torch.complex128):
        desc = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise PartitionError(f"{where}: {what} must be a 1-d integer tensor, got {desc}")
    return t.to(torch.int64)


# --- reading foreign .pt files ------------------------------------------------------------

_CONTAINERS = {("collections", "defaultdict"): collections.defaultdict,
               ("collections", "OrderedDict"): collections.OrderedDict,
               # a defaultdict's factory (PyG's heterogeneous edge_feats.pt: defaultdict(dict))
               ("builtins", "dict"): dict, ("__builtin__", "dict"): dict}


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], object]:
    allowed = dict(_CONTAINERS)
    try:  # torch's own weights-only allowlist (tensor rebuild functions, dtypes, ...)
        from torch import _weights_only_unpickler as wou
        for key, obj in wou._get_allowed_globals().items():
            mod, _, name = key.rpartition(".")
            allowed[(mod, name)] = obj
    except (ImportError, AttributeError):  # a torch without it: tensors only
        from torch import _utils
        allowed[("torch._utils", "_rebuild_tensor_v2")] = _utils._rebuild_tensor_v2
    return allowed


@functools.cache
def _buildable_types() -> frozenset[type]:
    """The allowlisted classes whose fresh instances BUILD may fill in (a tensor, a storage)."""
    return frozenset(v for v in _allowed_globals().values() if isinstance(v, type))


class _RestrictedUnpickler(pickle._Unpickler):
    """pickle's unpickler with its globals limited to ``_allowed_globals()`` and, like torch's
    weights-only unpickler, every opcode that changes an object already on the stack limited
    to plain targets: BUILD to an instance of an allowlisted class (never a class, whose
    attributes are process-wide state, nor an allowlisted global itself), SETITEM(S) to a
    dict, APPEND(S) to a list, ADDITEMS to a set. It is pickle's Python unpickler because
    the C one's opcode table cannot be overridden."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module, name):
        obj = _allowed_globals().get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a partition file")
        return obj

    def _check_target(self, obj, allowed: tuple[type, ...], opcode: str) -> None:
        if type(obj) not in allowed or any(obj is g for g in _allowed_globals().values()):
            what = f"the class {obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) \
                else f"a {type(obj).__module__}.{type(obj).__qualname__}"
            raise pickle.UnpicklingError(f"{opcode} on {what} is not allowed in a partition file")

    def load_build(self):
        self._check_target(self.stack[-2], tuple(_buildable_types()), "BUILD")
        super().load_build()
    dispatch[pickle.BUILD[0]] = load_build

    _DICTS = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)

    def load_setitem(self):
        self._check_target(self.stack[-3], self._DICTS, "SETITEM")
        super().load_setitem()
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        self._check_target(self.metastack[-1][-1], self._DICTS, "SETITEMS")
        super().load_setitems()
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_append(self):
        self._check_target(self.stack[-2], (list,), "APPEND")
        super().load_append()
    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self):
        self._check_target(self.metastack[-1][-1], (list,), "APPENDS")
        super().load_appends()
    dispatch[pickle.APPENDS[0]] = load_appends

    def load_additems(self):
        self._check_target(self.metastack[-1][-1], (set,), "ADDITEMS")
        super().load_additems()
    dispatch[pickle.ADDITEMS[0]] = load_additems


def _restricted_load(file, **kwargs):
    return _RestrictedUnpickler(file, **kwargs).load()


# torch.load calls both: the Unpickler for the object, load for a legacy file's headers
_RESTRICTED_PICKLE = types.SimpleNamespace(Unpickler=_RestrictedUnpickler, load=_restricted_load,
                                           __name__="sarc_restricted_pickle")


def load_torch_file(path: Path, what: str):
    """The object ``torch.save`` wrote at ``path``, loaded without running code from it and
    without changing any object that existed before (a class, a module's global)."""
    if not path.is_file():
        raise PartitionError(f"{path}: {what} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's weights-only unpickler refuses a defaultdict (PyG's edge_feats.pt) even
        # with add_safe_globals: it fills only dict, OrderedDict and Counter. Only a zip
        # archive, what torch.save writes, gets the second reader.
        if not zipfile.is_zipfile(path):
            raise PartitionError(f"{path}: {what} cannot be read: {load_problem(e)}") from None
    except Exception as e:
        raise PartitionError(f"{path}: {what} cannot be read: {load_problem(e)}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False,
                          pickle_module=_RESTRICTED_PICKLE)
    except Exception as e:
        raise PartitionError(f"{path}: {what} cannot be read: {e}") from e


def require_keys(d, keys, what: str, where) -> None:
    if not isinstance(d, Mapping):
        raise PartitionError(f"{where}: {what} holds {type(d).__name__}, expected a dict")
    missing = [k for k in keys if k not in d]
    if missing:
        raise PartitionError(f"{where}: {what} lacks {', '.join(map(repr, missing))}")
