"""Node-classification datasets: the embedded benchmarks and synthetic graphs.

``load_dataset(name)`` reads one ``.npz`` file in the layout of
``sarc/data/README.md``: Cora and AIFB ship inside the package; CiteSeer and
PubMed (structure only) are read from a directory given as ``root`` (or
``$SARC_DATA_DIR``). ``power_law_graph`` and ``sbm_graph`` make synthetic
graphs of any size for benchmarks and tests, deterministic given a seed.

Every dataset is a ``Dataset``: a directed edge list (an undirected edge is
stored in both directions), node features (``[N, 0]`` when the graph has none),
labels (``-1`` = unlabeled), train / val / test masks, and for relational
graphs an edge type per edge; for heterogeneous graphs a node type per node
(``ntype``), whose features of different widths are padded with zeros to the
widest in ``feat`` (``sarc.TypedInput`` reads each type's own columns). AIFB's node
types are derived from its ``node_is_literal`` array (``AIFB_NODE_TYPES``).

A dataset read from a file or built from arrays (``Dataset.from_arrays``) is
checked first (``check_arrays``), so a bad file stops with an error naming the
file and the array instead of training on garbage: arrays missing, of the wrong
dtype or shape, ids and labels out of range, NaN or Inf in the features. Masks
are boolean; an integer array whose values are all 0 or 1 is read as one (what a
0/1 mask means), any other (node ids, say) is refused.
"""
from __future__ import annotations

import os
import warnings
import zipfile
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .errors import GraphError, SarcError, SarcWarning

def _printable(name: str) -> str:
    """A dataset's name as headers and reports print it: non-printable characters (line
    breaks, terminal escapes) written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


EMBEDDED = ("cora", "aifb")
"""Datasets shipped in ``sarc/data``."""

FILE_NAMES = {"pubmed": ("pubmed.npz", "pubmed_nofeat.npz")}
"""Files tried for a dataset name (default: ``NAME.npz``)."""


MASKS = ("train_mask", "val_mask", "test_mask")
DATASET_KEYS = ("edge_src", "edge_dst", "label", *MASKS)
"""The arrays every dataset holds; ``feat``, ``num_nodes``, ``num_classes``, ``etype``,
``num_etypes``, ``ntype`` and ``num_ntypes`` are optional (no features; the sizes are then
inferred from the arrays)."""

AIFB_NODE_TYPES = ("entity", "literal")
"""AIFB's node types: an RDF entity (a URI or blank node: a subject, or an object that is
not a literal) or a literal (a string or number, only ever an object), from the file's
``node_is_literal``; every relation's destinations are of one of the two."""

UNLABELED = -1
"""The label of a node without a class."""


class DatasetError(SarcError):
    """A dataset could not be found, read, or used as it is."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """No dataset file by that name or path."""


class DatasetFormatError(DatasetError, ValueError):
    """A dataset's arrays are missing, of the wrong type or shape, or hold values out of range."""


class DatasetWarning(SarcWarning):
    """A dataset sarc trains on as given, though it is likely not what was meant."""


@dataclass(frozen=True, eq=False)
class Dataset:
    name: str
    num_nodes: int
    edge_src: torch.Tensor    # [E] int64
    edge_dst: torch.Tensor    # [E] int64
    feat: torch.Tensor        # [N, F] float32; F == 0 when the graph has no features
    label: torch.Tensor       # [N] int64, -1 = unlabeled
    train_mask: torch.Tensor  # [N] bool
    val_mask: torch.Tensor    # [N] bool
    test_mask: torch.Tensor   # [N] bool
    num_classes: int
    etype: torch.Tensor | None = None  # [E] int64 edge type (relational graphs)
    num_etypes: int = 0
    ntype: torch.Tensor | None = None  # [N] int64 node type (heterogeneous graphs)
    num_ntypes: int = 0
    checked: bool = field(default=False, repr=False)
    """Built by ``from_arrays`` (``load_dataset``, the generators): the arrays passed
    ``check_arrays``; ``sarc.train`` checks a dataset built otherwise before using it."""
    file: str | None = field(default=None, repr=False)
    """The ``.npz`` path ``load_dataset`` was given (absolute), None for a name: what a
    run's records keep, since the arrays' own ``name`` may be another dataset's."""
    more_edge_data: dict = field(default_factory=dict, repr=False)
    """The file's other edge arrays (``edge_weight``...: numeric, one row per edge, named
    ``edge_*``), by name: edge data as a graph file's (``sarc partition --graph``)."""

    @property
    def recorded(self) -> str:
        """The dataset as a run's records (checkpoints, ``--save``, a partition set) keep it:
        its ``.npz`` file's path, else its name."""
        return self.file or self.name

    @property
    def num_edges(self) -> int:
        return int(self.edge_src.numel())

    @property
    def num_features(self) -> int:
        return int(self.feat.shape[1])

    @property
    def has_features(self) -> bool:
        return self.num_features > 0

    @property
    def node_data(self) -> dict[str, torch.Tensor]:
        """What a node of it holds for training: features, label and the three splits (what
        a partition set of it carries per node, and digests)."""
        return {"feat": self.feat, "label": self.label, "train_mask": self.train_mask,
                "val_mask": self.val_mask, "test_mask": self.test_mask}

    @property
    def edge_data(self) -> dict[str, torch.Tensor]:
        """What an edge of it holds: its type, where the graph is relational, and the file's
        other edge arrays (``more_edge_data``)."""
        return {**({"etype": self.etype} if self.etype is not None else {}),
                **self.more_edge_data}

    @property
    def sizes(self) -> dict[str, int]:
        """What the model is built for besides its features: the classes, and the edge and
        node types where the graph has them, as declared (a class or a relation no node or
        edge uses still has its output and weights); a partition set records them."""
        return {"num_classes": self.num_classes,
                **({"num_etypes": self.num_etypes} if self.etype is not None else {}),
                **({"num_ntypes": self.num_ntypes} if self.ntype is not None else {})}

    def __repr__(self) -> str:
        rel = f", num_etypes={self.num_etypes}" if self.etype is not None else ""
        rel += f", num_ntypes={self.num_ntypes}" if self.ntype is not None else ""
        return (f"Dataset({self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"num_features={self.num_features}, num_classes={self.num_classes}{rel}, "
                f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
                f"{int(self.test_mask.sum())})")

    @staticmethod
    def from_arrays(arrays: Mapping[str, Any], *, name: str | None = None,
                    source: str | None = None, check: bool = True) -> "Dataset":
        """A dataset from arrays (numpy, torch or lists) in the layout of ``load_dataset``'s
        files, checked by ``check_arrays``; ``source`` names them in errors."""
        name = _printable(name or (str(arrays["name"]) if "name" in arrays else "arrays"))
        a = check_arrays(arrays, source or f"dataset {name!r}", check=check)
        t = {k: torch.from_numpy(np.ascontiguousarray(a[k]))
             for k in ("edge_src", "edge_dst", "feat", "label", *MASKS)}
        etype = torch.from_numpy(np.ascontiguousarray(a["etype"])) if "etype" in a else None
        ntype = torch.from_numpy(np.ascontiguousarray(a["ntype"])) if "ntype" in a else None
        more = {k: torch.from_numpy(np.ascontiguousarray(a[k])) for k in more_edge_keys(a)}
        return Dataset(name=name, num_nodes=a["num_nodes"], num_classes=a["num_classes"],
                       etype=etype, num_etypes=a["num_etypes"] if etype is not None else 0,
                       ntype=ntype, num_ntypes=a["num_ntypes"] if ntype is not None else 0,
                       checked=True, more_edge_data=more, **t)


def more_edge_keys(arrays: Mapping[str, Any]) -> list[str]:
    """The edge data of ``arrays`` besides ``etype``: the numeric arrays named ``edge_*``,
    but for the edge list (``edge_src``, ``edge_dst``, and PyG's ``edge_index``, which
    files may carry too); other ``edge_*`` arrays (names, text) are not data."""
    return [k for k, a in arrays.items()
            if k.startswith("edge_") and k not in ("edge_src", "edge_dst", "edge_index")
            and np.asarray(a).dtype.kind in "biuf" and np.asarray(a).ndim > 0]


def check_dataset(data: Dataset, *, check: bool = True) -> Dataset:
    """``data`` checked as ``Dataset.from_arrays`` checks arrays (masks made boolean)."""
    arrays: dict[str, Any] = {k: getattr(data, k) for k in (*DATASET_KEYS, "feat", "num_nodes",
                                                             "num_classes")}
    arrays.update(data.more_edge_data)
    if data.etype is not None:
        arrays.update(etype=data.etype, num_etypes=data.num_etypes)
    if data.ntype is not None:
        arrays.update(ntype=data.ntype, num_ntypes=data.num_ntypes)
    return Dataset.from_arrays(arrays, name=data.name, check=check)


# --- checking a dataset's arrays ---------------------------------------------------------

MAX_NODES = 2**40
"""The most nodes a graph may have: a per-node int64 array of it is 8 TiB."""
MAX_CLASSES = 2**20
"""The most classes a dataset may declare: more than any node-classification dataset has
(ogbn-papers100M: 172), and the model's output holds a logit per node and class."""


def check_arrays(arrays: Mapping[str, Any], source: str, *,
                 required: Sequence[str] = DATASET_KEYS, check: bool = True) -> dict[str, Any]:
    """The arrays of a dataset or graph file, checked and in sarc's dtypes, or a
    ``DatasetFormatError`` naming ``source`` and the array.

    Every key of ``required`` must be there; the arrays of a dataset are checked
    whenever present (the others pass unchanged): ``edge_src`` / ``edge_dst`` integer
    ``[E]`` ids in ``[0, N)``; ``label`` integer ``[N]`` in ``0 .. C-1`` or ``-1``
    (unlabeled); each mask ``[N]`` boolean, or integers that are all 0 or 1 (read as
    False / True; anything else, such as node ids, is refused; a ``val_mask`` or
    ``test_mask`` sharing nodes with ``train_mask`` is warned of); ``feat`` numeric
    ``[N, F]`` without NaN or Inf; ``etype`` integer ``[E]`` in ``[0, num_etypes)``; ``ntype``
    integer ``[N]`` in ``[0, num_ntypes)``. N,
    C and the number of edge types are the file's ``num_nodes``, ``num_classes`` and
    ``num_etypes``, or else inferred (the label count, the largest label or edge type
    + 1). The result holds ``num_nodes``, ``num_classes`` and ``num_etypes`` as ints.
    ``check=False`` skips the two scans that cost more than a pass over the labels: the
    feature values (NaN / Inf) and the range of the edge ids and edge types.
    """
    missing = [k for k in required if k not in arrays]
    if missing:
        raise DatasetFormatError(
            f"{source}: missing {', '.join(missing)} (required: {', '.join(required)}); "
            f"it has: {', '.join(sorted(arrays)) or 'nothing'}")
    out = {k: _as_numpy(v) for k, v in arrays.items()}
    fail = lambda text: DatasetFormatError(f"{source}: {text}")  # noqa: E731

    if "num_nodes" in out:
        n = _count(out["num_nodes"], "num_nodes", fail, low=0)
        if n > MAX_NODES:
            raise fail(f"num_nodes is {n}: more than the {MAX_NODES} nodes (2**40) sarc "
                       f"holds per-node arrays for (8 bytes a node each)")
    elif "label" in out:
        n = len(_int_vector(out["label"], "label", "class ids", fail))
    else:
        raise fail("no num_nodes array, and no label array to count the nodes by")
    out["num_nodes"] = n

    if "edge_src" in out or "edge_dst" in out:
        for k in ("edge_src", "edge_dst"):
            if k not in out:
                raise fail(f"edge_src and edge_dst come together; there is no {k}")
            out[k] = _int_vector(out[k], k, "node ids", fail, unit="edges")
        if len(out["edge_src"]) != len(out["edge_dst"]):
            raise fail(f"edge_src has {len(out['edge_src'])} entries, edge_dst "
                       f"{len(out['edge_dst'])}; both hold one entry per edge")
        if check:
            for k in ("edge_src", "edge_dst"):
                _in_range(out[k], k, 0, n, "num_nodes", "edge", fail)

    if "label" in out:
        label = _int_vector(out["label"], "label", "class ids", fail, length=n)
        top = int(label.max()) if label.size else UNLABELED
        c = (_count(out["num_classes"], "num_classes", fail, low=1) if "num_classes" in out
             else max(1, top + 1))
        if "num_classes" not in out and c > max(n, 2):   # inferred: a class per node at most
            i = int(np.argmax(label))
            raise fail(f"label of node {i} is {label[i]}: more classes than the {_many(n, 'node')} "
                       f"(without a num_classes array, the classes are 0 .. the largest "
                       f"label); give num_classes where that many are meant")
        if c > MAX_CLASSES:
            what = f"num_classes is {c}" if "num_classes" in out else f"{c} classes"
            raise fail(f"{what}: more than the {MAX_CLASSES} classes (2**20) sarc trains a "
                       f"classifier over (its output holds a logit per node and class)")
        bad = (label < UNLABELED) | (label >= c)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise fail(f"label of node {i} is {label[i]}, outside 0 .. {c - 1} (num_classes = "
                       f"{c}; -1 = unlabeled); {_many(int(bad.sum()), 'node')} in all")
        out["label"], out["num_classes"] = label, c

    for k in MASKS:
        if k in out:
            out[k] = _mask(out[k], k, n, fail)
    _warn_training_nodes_scored(out, source)
    _warn_unlabeled_nodes_masked(out, source)

    if "feat" in out:
        out["feat"] = _features(out["feat"], n, fail, check)
    elif "label" in out:
        out["feat"] = np.zeros((n, 0), np.float32)

    if "etype" in out:
        if "edge_src" not in out:
            raise fail("etype without edge_src / edge_dst")
        etype = _int_vector(out["etype"], "etype", "edge types", fail,
                            length=len(out["edge_src"]), unit="edges")
        if "num_etypes" in out:
            r = _count(out["num_etypes"], "num_etypes", fail, low=1)
        else:
            r = int(etype.max()) + 1 if etype.size else 0
        if check:
            _in_range(etype, "etype", 0, r, "num_etypes", "edge", fail)
        out["etype"], out["num_etypes"] = etype, r
    else:
        out["num_etypes"] = 0

    for k in more_edge_keys(out):
        a = out[k]
        if "edge_src" not in out or a.shape[0] != len(out["edge_src"]):
            e = len(out["edge_src"]) if "edge_src" in out else "no"
            raise fail(f"edge array {k!r} has {a.shape[0]} rows, the graph has {e} edges "
                       f"(numeric arrays named edge_* are edge data, one row per edge)")
        if a.dtype.kind == "f":
            with np.errstate(over="ignore"):   # a float64 beyond float32's range: Inf, below
                x = a.astype(np.float32, copy=False)   # as the features: a model's precision
            if check and not np.isfinite(x).all():
                raise fail(f"edge array {k!r} holds NaN or Inf"
                           + (" once read as float32" if np.isfinite(a).all() else ""))
            out[k] = x

    if "ntype" in out:
        ntype = _int_vector(out["ntype"], "ntype", "node types", fail, length=n)
        if "num_ntypes" in out:
            t = _count(out["num_ntypes"], "num_ntypes", fail, low=1)
        else:
            t = int(ntype.max()) + 1 if ntype.size else 0
        _in_range(ntype, "ntype", 0, t, "num_ntypes", "node", fail)
        out["ntype"], out["num_ntypes"] = ntype, t
    return out


def _warn_training_nodes_scored(arrays: Mapping[str, np.ndarray], source: str) -> None:
    """A validation or test mask holding training nodes scores them on what the model fit:
    said, not refused (DGL and PyG train on such a split, and random masks drawn one by one
    overlap). Validation and test may share nodes (a split without a validation set may
    score its test nodes for both)."""
    if "train_mask" not in arrays:
        return
    for k in ("val_mask", "test_mask"):
        if k in arrays:
            both = np.flatnonzero(arrays["train_mask"] & arrays[k])
            if both.size:
                warnings.warn(DatasetWarning(
                    f"{source}: {k} and train_mask share {_many(both.size, 'node')} (the first "
                    f"is node {int(both[0])}); their {k.removesuffix('_mask')} accuracy is "
                    f"measured on nodes the model trains on"), stacklevel=2)


def _warn_unlabeled_nodes_masked(arrays: Mapping[str, np.ndarray], source: str) -> None:
    """A mask holding unlabeled nodes (label -1): the loss or the accuracy leaves them out
    (the accuracies are over a split's labeled nodes), said, not refused."""
    if "label" not in arrays:
        return
    for k in MASKS:
        if k in arrays:
            unlabeled = np.flatnonzero(arrays[k] & (arrays["label"] == UNLABELED))
            if unlabeled.size:
                what = ("the loss" if k == "train_mask"
                        else f"its {k.removesuffix('_mask')} accuracy")
                warnings.warn(DatasetWarning(
                    f"{source}: {k} holds {_many(unlabeled.size, 'unlabeled node')} (label -1; "
                    f"the first is node {int(unlabeled[0])}), which {what} leaves out"),
                    stacklevel=2)


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    return np.asarray(value)


def _many(k: int, unit: str) -> str:
    return f"{k} {unit}" if k == 1 else f"{k} {unit}s"


def _count(a: np.ndarray, key: str, fail, low: int) -> int:
    if a.size != 1 or a.dtype.kind not in "iu":
        raise fail(f"{key} must be one integer, got a {a.dtype} array of shape {a.shape}")
    v = int(a.reshape(()))
    if v < low:
        raise fail(f"{key} is {v}; it must be at least {low}")
    return v


def _int_vector(a: np.ndarray, key: str, what: str, fail, length: int | None = None,
                unit: str = "nodes") -> np.ndarray:
    if a.ndim != 1:
        raise fail(f"{key} has shape {a.shape}; it must be a vector (one entry per "
                   f"{unit[:-1]})")
    if a.dtype.kind not in "iu":
        raise fail(f"{key} is {a.dtype}; {what} must be integers")
    if length is not None and len(a) != length:
        raise fail(f"{key} has {len(a)} entries, the graph has {length} {unit}")
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        i = int(np.argmax(a))
        raise fail(f"{key}[{i}] is {int(a[i])}, past the int64 {what} sarc holds")
    return a.astype(np.int64, copy=False)


def _in_range(a: np.ndarray, key: str, low: int, high: int, bound: str, unit: str, fail):
    bad = (a < low) | (a >= high)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise fail(f"{key} of {unit} {i} is {a[i]}, outside [{low}, {high}) ({bound} = {high}); "
                   f"{_many(int(bad.sum()), unit)} in all")


def _mask(a: np.ndarray, key: str, n: int, fail) -> np.ndarray:
    what = (f"a mask is a boolean vector of length num_nodes = {n} (True = the node is in "
            f"the split; integers that are all 0 or 1 are read as such)")
    if a.dtype == np.bool_ and a.shape == (n,):
        return a
    if a.dtype.kind in "iu" and a.ndim == 1:
        if len(a) == n and bool(((a == 0) | (a == 1)).all()):
            return a.astype(np.bool_)
        top = int(a.max()) if a.size else 0
        looks = "node ids, not a mask" if len(a) != n else "values other than 0 and 1"
        raise fail(f"{key} is an {a.dtype} vector of {len(a)} entries up to {top}: {looks}; "
                   f"{what}. From node ids: mask = np.zeros({n}, bool); mask[ids] = True")
    if a.dtype == np.bool_:
        raise fail(f"{key} has shape {a.shape}; {what}")
    raise fail(f"{key} is {a.dtype} of shape {a.shape}; {what}")


_SCAN_ELEMENTS = 1 << 24
"""Feature values scanned for NaN / Inf at a time (bounds the scan's temporary memory)."""


def _features(a: np.ndarray, n: int, fail, check: bool) -> np.ndarray:
    if a.ndim != 2 or a.shape[0] != n:
        raise fail(f"feat has shape {a.shape}; node features are [num_nodes, F] = [{n}, F]")
    if a.dtype.kind not in "biuf":
        raise fail(f"feat is {a.dtype}; node features must be numbers")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range: Inf, found below
        x = a.astype(np.float32, copy=False)
    if check and x.size:
        rows = max(1, _SCAN_ELEMENTS // x.shape[1])
        first, count = None, 0
        for lo in range(0, n, rows):
            bad = ~np.isfinite(x[lo:lo + rows]).all(axis=1)
            if first is None and bad.any():
                first = lo + int(np.flatnonzero(bad)[0])
            count += int(bad.sum())
        if first is not None:
            col = int(np.flatnonzero(~np.isfinite(x[first]))[0])
            kind = "NaN" if np.isnan(x[first, col]) else "Inf"
            raise fail(f"feat row {first} holds {kind} (column {col}); {_many(count, 'row')} "
                       f"{'holds' if count == 1 else 'hold'} NaN or Inf"
                       + (" once read as float32" if x is not a else ""))
    return x


# --- the benchmark files ---------------------------------------------------------------

def dataset_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """The ``.npz`` file of dataset ``name``: in ``root``, else ``$SARC_DATA_DIR``, else embedded.

    ``name`` may also be the path of an ``.npz`` file in the same layout.
    """
    p = Path(name)
    if name.endswith(".npz") or (_looks_like_a_path(name) and p.exists()):
        if p.is_file():
            return p
        if p.is_dir():
            raise DatasetNotFoundError(f"{name} is a directory, not a dataset .npz file (give "
                                       f"the file, or a dataset name and --data-dir {name})")
        if p.exists():   # a pipe, a device: np.load seeks in what it reads
            raise DatasetNotFoundError(f"dataset file {name} is not a regular file (a pipe "
                                       f"or a device); give the .npz file itself")
        raise DatasetNotFoundError(f"dataset file {name} does not exist")
    key = name.lower()
    files = FILE_NAMES.get(key, (f"{key}.npz",))
    dirs = [Path(d) for d in (root, os.environ.get("SARC_DATA_DIR")) if d]
    for d in dirs:
        for f in files:
            if (d / f).is_file():
                return d / f
    if key in EMBEDDED:
        with resources.as_file(resources.files("sarc") / "data" / f"{key}.npz") as p:
            return Path(p)
    where = ", ".join(str(d) for d in dirs) or "no directory given"
    raise DatasetNotFoundError(f"dataset {name!r} not found: looked for {' or '.join(files)} in {where}; "
                       f"embedded datasets: {', '.join(EMBEDDED)} (pass a directory with "
                       f"--data-dir / root=, e.g. the shared datasets folder)")


def load_dataset(name: str, root: str | os.PathLike | None = None, *,
                 check: bool = True) -> Dataset:
    """Load a benchmark: ``'cora'``, ``'aifb'`` (embedded), ``'citeseer'``, ``'pubmed'`` (from
    ``root``), or an ``.npz`` path; its arrays checked (``check_arrays``, whose value scans
    ``check=False`` skips)."""
    file = npz_file(name)
    path = dataset_path(name, root)
    arrays = read_npz(path)
    # a name printed in headers and reports: its non-printable characters escaped
    name = _printable(str(arrays["name"]) if "name" in arrays else Path(path).stem)
    if "node_is_literal" in arrays and "ntype" not in arrays:  # AIFB: AIFB_NODE_TYPES
        arrays.update(ntype=np.asarray(arrays["node_is_literal"]).astype(np.int64),
                      num_ntypes=np.int64(len(AIFB_NODE_TYPES)))
    data = Dataset.from_arrays(arrays, name=name, source=str(path), check=check)
    return data if file is None else replace(data, file=file)


def npz_file(name: str) -> str | None:
    """The absolute path of a dataset given as an existing file, None for a name: what a
    run records of it (``Dataset.file``)."""
    p = Path(str(name))
    return str(p.resolve()) if (p.suffix == ".npz" or _looks_like_a_path(str(name))) \
        and p.is_file() else None


def same_dataset(recorded: str, given: str) -> str | None:
    """What a run on ``given`` (``--dataset``) records where a partition set records
    ``recorded`` (``PartitionSet.dataset``), if they are the same dataset; else None.
    ``given`` is the file ``recorded`` names, or ``recorded`` itself; a set that recorded a
    file's name (``sarc partition --dataset FILE.npz`` before it kept the path) is that file
    (``FILE`` its name), recorded by its path where it exists."""
    file = npz_file(given)
    if given == recorded or (file is not None and file == recorded):
        return recorded
    if not _looks_like_a_path(recorded) and Path(given).suffix == ".npz" \
            and Path(given).stem == recorded:
        return file or recorded
    return None


def _looks_like_a_path(name: str) -> bool:
    """A dataset argument that is a file's path rather than a name: it has a directory or
    a suffix (``data/graph.NPZ``); a bare name (``cora``) is looked up."""
    p = Path(name)
    return bool(p.suffix) or len(p.parts) > 1


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file at ``path`` (pickled objects refused), or a
    ``DatasetFormatError`` naming the file and the array."""
    try:
        f = np.load(path)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"{path} does not exist") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = "" if isinstance(e, ValueError) else f" ({e})"
        raise DatasetFormatError(f"{path}: not an .npz archive (numpy.savez's zip of "
                                 f"arrays){why}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise DatasetFormatError(f"{path}: a single array (.npy), not an .npz archive of "
                                 f"named arrays")
    with f:
        arrays = {}
        for k in f.files:
            try:
                arrays[k] = f[k]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                raise DatasetFormatError(f"{path}: cannot read array {k!r}: {e}") from None
    return arrays


# --- graph helpers -----------------------------------------------------------------------

def add_self_loops(src: torch.Tensor, dst: torch.Tensor, num_nodes: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The edges without their self loops, then one self loop per node (as DGL / PyG)."""
    keep = src != dst
    loops = torch.arange(num_nodes, dtype=src.dtype, device=src.device)
    return torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])


SELF_LOOP_FILL = 1.0
"""A float edge feature's value on an added self loop: a unit weight, as PyG's
``add_self_loops(fill_value=1.0)`` gives and as a weighted GCN counts a node's own row."""


def add_self_loops_with_data(src: torch.Tensor, dst: torch.Tensor, num_nodes: int,
                             edge_data: Mapping[str, torch.Tensor]
                             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``add_self_loops`` with the edge features the model reads: the kept edges' values,
    then ``SELF_LOOP_FILL`` on every loop for a float feature. An integer feature (an edge
    type) has no value a loop could take: a ``GraphError`` naming it. Pass only the features
    the model reads (``sarc.dsl.edge_inputs_for``): the others need no fill."""
    keep = src != dst
    out = {}
    for name, values in edge_data.items():
        if not values.is_floating_point():
            raise GraphError(
                f"edge feature {name!r} ({values.dtype}) is read by the model and the graph "
                f"gets self loops (self_loops=True), but a self loop has no edge type or other "
                f"integer value; set self_loops=False, or model the self connection in the "
                f"layer (R-GCN's root weight)")
        fill = values.new_full((num_nodes, *values.shape[1:]), SELF_LOOP_FILL)
        out[name] = torch.cat([values[keep], fill])
    return (*add_self_loops(src, dst, num_nodes), out)


# --- synthetic graphs --------------------------------------------------------------------

def power_law_graph(num_nodes: int, num_edges: int, *, exponent: float = 2.5,
                    num_features: int = 0, num_classes: int = 2, seed: int = 0,
                    split: tuple[float, float, float] = (0.1, 0.1, 0.2)) -> Dataset:
    """An undirected Chung-Lu graph with a power-law degree distribution.

    Node i gets the weight ``w_i = integral_i^(i+1) (x + i0)^-a dx`` with
    ``a = 1 / (exponent - 1)`` (so degrees follow ``P(k) ~ k^-exponent``) and
    each edge picks both endpoints with probability proportional to the
    weights (by inverting the closed-form CDF: O(1) per endpoint). Self loops and duplicates are
    dropped and resampled, so the graph has exactly ``num_edges // 2``
    undirected edges, stored in both directions (``num_edges`` rounded down
    to even). Node ids are shuffled so hubs are spread over the id range.
    Features are standard normal, labels uniform (no signal: for speed and
    scaling runs, not accuracy).
    """
    if num_nodes < 2:
        raise ValueError("a power-law graph needs at least 2 nodes")
    if exponent <= 2.0:
        raise ValueError(f"exponent must be > 2 (finite mean degree), got {exponent}")
    pairs = num_edges // 2
    if pairs > num_nodes * (num_nodes - 1) // 4:
        raise ValueError(f"{num_edges} edges are too many for a sparse graph on {num_nodes} nodes")
    rng = np.random.default_rng(seed)
    # The offset i0 puts the largest expected degree near sqrt(2 * pairs) (the
    # "natural cutoff" of Chung-Lu graphs), which keeps duplicate hub-hub pairs,
    # and so the resampling, rare: with W = sum_i w_i ~ N^(1-a) / (1-a),
    # d_0 = 2 pairs i0^-a / W = sqrt(2 pairs) gives the formula below.
    alpha = 1.0 / (exponent - 1.0)
    beta = 1.0 - alpha
    i0 = max(1.0, (np.sqrt(2.0 * pairs) * beta / num_nodes ** beta) ** (1.0 / alpha))
    lo_mass, hi_mass = i0 ** beta, (num_nodes + i0) ** beta
    relabel = rng.permutation(num_nodes)

    def endpoints(k: int) -> np.ndarray:
        # x = F^-1(r) for F(x) = ((x + i0)^b - i0^b) / ((N + i0)^b - i0^b); node floor(x)
        x = (lo_mass + rng.random(k) * (hi_mass - lo_mass)) ** (1.0 / beta) - i0
        return relabel[np.clip(x.astype(np.int64), 0, num_nodes - 1)]

    def sample(k: int) -> np.ndarray:
        u, v = endpoints(k), endpoints(k)
        lo, hi = np.minimum(u, v), np.maximum(u, v)
        return (lo * num_nodes + hi)[lo != hi]

    keys = _unique_keys(sample, pairs, rng)
    src, dst = _undirected(keys, num_nodes)
    return _synthetic("power_law", num_nodes, src, dst, num_features, num_classes,
                      rng.integers(0, num_classes, num_nodes), split, rng, signal=0.0)


def sbm_graph(block_sizes, p_in: float, p_out: float, *, num_features: int = 0,
              feature_signal: float = 1.0, seed: int = 0,
              split: tuple[float, float, float] = (0.1, 0.1, 0.2)) -> Dataset:
    """An undirected stochastic block model: an edge within a block with probability
    ``p_in``, between blocks with ``p_out``. Labels are the blocks.

    Edge counts per block pair are binomial; the endpoints are then drawn
    uniformly in the two blocks (duplicates dropped, negligible for sparse
    graphs), so generation costs O(edges), not O(nodes^2). Features are
    ``feature_signal * c[block] + noise`` with a random centroid ``c`` per
    block and standard normal noise.
    """
    sizes = np.asarray(block_sizes, dtype=np.int64)
    if sizes.ndim != 1 or len(sizes) < 1 or (sizes <= 0).any():
        raise ValueError(f"block_sizes must be positive ints, got {block_sizes!r}")
    for p, what in ((p_in, "p_in"), (p_out, "p_out")):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{what} must be a probability, got {p}")
    rng = np.random.default_rng(seed)
    n = int(sizes.sum())
    start = np.concatenate([[0], np.cumsum(sizes)])
    keys = []
    for a in range(len(sizes)):
        for b in range(a, len(sizes)):
            if a == b:
                slots, p = sizes[a] * (sizes[a] - 1) // 2, p_in
            else:
                slots, p = sizes[a] * sizes[b], p_out
            k = int(rng.binomial(slots, p)) if slots else 0
            if k == 0:
                continue
            u = start[a] + rng.integers(0, sizes[a], k)
            v = start[b] + rng.integers(0, sizes[b], k)
            lo, hi = np.minimum(u, v), np.maximum(u, v)
            keys.append((lo * n + hi)[lo != hi])
    keys = _sorted_unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    src, dst = _undirected(keys, n)
    label = np.repeat(np.arange(len(sizes)), sizes)
    return _synthetic("sbm", n, src, dst, num_features, len(sizes), label, split, rng,
                      signal=feature_signal)


def _unique_keys(sample, pairs: int, rng: np.random.Generator) -> np.ndarray:
    """``pairs`` distinct pair keys: sample, drop duplicates, top up, trim at random."""
    keys = np.zeros(0, np.int64)
    for _ in range(50):
        missing = pairs - len(keys)
        if missing <= 0:
            break
        keys = _sorted_unique(np.concatenate([keys, sample(int(missing * 1.1) + 16)]))
    if len(keys) < pairs:
        raise ValueError(f"could not draw {pairs} distinct edges; the graph is too dense")
    if len(keys) > pairs:
        keys = np.sort(rng.choice(keys, pairs, replace=False))
    return keys


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    # Sort-based: numpy 2's hash-based np.unique is several times slower on 10M ints.
    keys = np.sort(keys)
    if len(keys) == 0:
        return keys
    first = np.empty(len(keys), dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return keys[first]


def _undirected(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = keys // n, keys % n
    return np.concatenate([lo, hi]), np.concatenate([hi, lo])


def _synthetic(name: str, n: int, src: np.ndarray, dst: np.ndarray, num_features: int,
               num_classes: int, label: np.ndarray, split, rng: np.random.Generator,
               signal: float) -> Dataset:
    if num_features:
        feat = rng.standard_normal((n, num_features), dtype=np.float32)
        if signal:
            centroids = rng.standard_normal((num_classes, num_features), dtype=np.float32)
            feat += np.float32(signal) * centroids[label]
    else:
        feat = np.zeros((n, 0), np.float32)
    train, val, test = _random_split(n, split, rng)
    return Dataset(name=name, num_nodes=n, edge_src=torch.from_numpy(src),
                   edge_dst=torch.from_numpy(dst), feat=torch.from_numpy(feat),
                   label=torch.from_numpy(label.astype(np.int64)),
                   train_mask=train, val_mask=val, test_mask=test, num_classes=num_classes,
                   checked=True)


def _random_split(n: int, split, rng: np.random.Generator):
    fractions = np.asarray(split, dtype=np.float64)
    if fractions.shape != (3,) or (fractions < 0).any() or fractions.sum() > 1.0 + 1e-9:
        raise ValueError(f"split must be three fractions (train, val, test) summing to <= 1, "
                         f"got {split!r}")
    order = torch.from_numpy(rng.permutation(n))
    ends = np.cumsum(np.floor(fractions * n).astype(np.int64))
    masks = []
    for lo, hi in zip([0, *ends[:-1]], ends):
        m = torch.zeros(n, dtype=torch.bool)
        m[order[lo:hi]] = True
        masks.append(m)
    return masks
