"""Node-classification datasets: the embedded benchmarks and synthetic graphs.

``load_dataset(name)`` reads one ``.npz`` file in the layout of
``sarc/data/README.md``: Cora and AIFB ship inside the package; CiteSeer and
PubMed (structure only) are read from a directory given as ``root`` (or
``$SARC_DATA_DIR``). ``power_law_graph`` and ``sbm_graph`` make synthetic
graphs of any size for benchmarks and tests, deterministic given a seed.

Every dataset is a ``Dataset``: a directed edge list (an undirected edge is
stored in both directions), node features (``[N, 0]`` when the graph has none),
labels (``-1`` = unlabeled), train / val / test masks, and for relational
graphs an edge type per edge.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from .errors import SarcError

EMBEDDED = ("cora", "aifb")
"""Datasets shipped in ``sarc/data``."""

FILE_NAMES = {"pubmed": ("pubmed.npz", "pubmed_nofeat.npz")}
"""Files tried for a dataset name (default: ``NAME.npz``)."""


class DatasetError(SarcError, FileNotFoundError):
    """A dataset could not be found or read."""


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

    @property
    def num_edges(self) -> int:
        return int(self.edge_src.numel())

    @property
    def num_features(self) -> int:
        return int(self.feat.shape[1])

    @property
    def has_features(self) -> bool:
        return self.num_features > 0

    def __repr__(self) -> str:
        rel = f", num_etypes={self.num_etypes}" if self.etype is not None else ""
        return (f"Dataset({self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"num_features={self.num_features}, num_classes={self.num_classes}{rel}, "
                f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
                f"{int(self.test_mask.sum())})")


# --- the benchmark files ---------------------------------------------------------------

def dataset_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """The ``.npz`` file of dataset ``name``: in ``root``, else ``$SARC_DATA_DIR``, else embedded.

    ``name`` may also be the path of an ``.npz`` file in the same layout.
    """
    if name.endswith(".npz"):
        p = Path(name)
        if p.is_file():
            return p
        raise DatasetError(f"dataset file {name} does not exist")
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
    raise DatasetError(f"dataset {name!r} not found: looked for {' or '.join(files)} in {where}; "
                       f"embedded datasets: {', '.join(EMBEDDED)} (pass a directory with "
                       f"--data-dir / root=, e.g. the shared datasets folder)")


def load_dataset(name: str, root: str | os.PathLike | None = None) -> Dataset:
    """Load a benchmark: ``'cora'``, ``'aifb'`` (embedded), ``'citeseer'``, ``'pubmed'`` (from ``root``)."""
    path = dataset_path(name, root)
    with np.load(path) as d:
        arrays = {k: d[k] for k in d.files}
    n = int(arrays["num_nodes"])
    if "feat" in arrays and arrays["feat"].size:
        feat = torch.from_numpy(np.ascontiguousarray(arrays["feat"], dtype=np.float32))
    else:  # PubMed without features, AIFB: no input features
        feat = torch.zeros(n, 0)
    etype = torch.from_numpy(arrays["etype"]) if "etype" in arrays else None
    return Dataset(
        name=str(arrays.get("name", Path(path).stem)),
        num_nodes=n,
        edge_src=torch.from_numpy(arrays["edge_src"]).to(torch.int64),
        edge_dst=torch.from_numpy(arrays["edge_dst"]).to(torch.int64),
        feat=feat,
        label=torch.from_numpy(arrays["label"]).to(torch.int64),
        train_mask=torch.from_numpy(arrays["train_mask"]),
        val_mask=torch.from_numpy(arrays["val_mask"]),
        test_mask=torch.from_numpy(arrays["test_mask"]),
        num_classes=int(arrays["num_classes"]),
        etype=etype,
        num_etypes=int(arrays["num_etypes"]) if "num_etypes" in arrays else 0,
    )


# --- graph helpers -----------------------------------------------------------------------

def add_self_loops(src: torch.Tensor, dst: torch.Tensor, num_nodes: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The edges without their self loops, then one self loop per node (as DGL / PyG)."""
    keep = src != dst
    loops = torch.arange(num_nodes, dtype=src.dtype)
    return torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])


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
                   train_mask=train, val_mask=val, test_mask=test, num_classes=num_classes)


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
