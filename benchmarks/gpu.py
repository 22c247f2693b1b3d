"""sarc's Triton backend on a CUDA GPU against sarc's PyTorch backend, PyG and DGL.

For each graph size (power-law graphs from ``sarc.datasets.power_law_graph``) and each
layer (GCN, GraphSAGE-mean, GAT 4x32, GAT 1x7 (a narrow output head), RGCN with 8
relations), every implementation that
imports here runs forward + backward on the same features; per cell:

- the median time of ``--repeat`` runs, each timed with CUDA events, after ``--warmup``
  runs that include Triton's compilation and autotuning;
- the peak memory above what was resident when the cell started
  (``torch.cuda.max_memory_allocated``, reset per cell);
- "OOM" where it does not fit, "error" (the reason on stderr) where it fails.

PyG runs its fastest path that works for the layer: a ``torch_sparse.SparseTensor``
adjacency where torch_sparse imports, else a ``torch.sparse_csr`` one, else
``edge_index`` (GAT and RGCN: ``edge_index``); the table names the one used.

For each fused Triton kernel the cost model's bytes (``sarc.planner.cost.fused_traffic``
evaluated at the graph's sizes, as benchmarks/triton_kernels.py part 1) divided by the
op's measured forward time (CUDA events around the op: its launches, its combine pass)
give the achieved bandwidth, and its fraction of the GPU's peak (``PEAK_BANDWIDTH``; left
blank for a GPU not listed). Then one training epoch of a 3-layer GAT on the Reddit-sized
graph (``--epoch-size``). Tables are printed as markdown and written with every cell
to ``--json`` (rewritten after each cell, so a run that is stopped keeps what it measured).
On a machine without a CUDA GPU it says so and exits 0.

    python benchmarks/gpu.py [--sizes 100k/2M,1M/40M,233k/114M] [--json gpu.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import re
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))

import sarc  # noqa: E402

DEFAULT_SIZES = "100k/2M,1M/40M,233k/114M"
REDDIT = "233k/114M"
LAYERS = ("GCN", "SAGE", "GAT", "GAT1x7", "RGCN")
IMPLS = ("sarc triton", "sarc torch", "PyG", "DGL")
PEERS = ("PyG", "DGL")

PEAK_BANDWIDTH = (
    # (pattern in torch.cuda.get_device_name(), bytes / s of HBM bandwidth)
    ("H100 80GB HBM3", 3.35e12),  # H100 SXM5
    ("H100 SXM", 3.35e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H200", 4.8e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100-SXM4-40GB", 1.555e12),
    ("A100-PCIE-40GB", 1.555e12),
)


def peak_bandwidth(device_name: str) -> float | None:
    """The GPU's peak memory bandwidth in bytes / s, None for a GPU not in the table."""
    for pattern, bps in PEAK_BANDWIDTH:
        if pattern.lower() in device_name.lower():
            return bps
    return None


# --- options ---------------------------------------------------------------------------

_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def _count(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a count (e.g. 100k, 2M, 114000000)")
    return int(round(float(m.group(1)) * _SCALE[m.group(2).lower()]))


def parse_size(text: str) -> tuple[int, int]:
    """``"233k/114M"`` -> (233000, 114000000): nodes / edges."""
    parts = text.split("/")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"size {text!r} is not NODES/EDGES (e.g. 100k/2M)")
    try:
        nodes, edges = _count(parts[0]), _count(parts[1])
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"size {text!r}: {e}") from None
    if nodes < 2 or edges < 2:
        raise argparse.ArgumentTypeError(f"size {text!r}: a graph needs at least 2 nodes and 2 edges")
    return nodes, edges


def parse_sizes(text: str) -> list[tuple[int, int]]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def size_label(nodes: int, edges: int) -> str:
    """(233000, 114000000) -> "233k/114M"."""
    def short(n: int) -> str:
        for suffix, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
            if n >= scale:
                return f"{n / scale:g}{suffix}"
        return str(n)
    return f"{short(nodes)}/{short(edges)}"


def parse_layers(text: str) -> list[str]:
    """``"GCN, GAT"`` -> ["GCN", "GAT"], each one of ``LAYERS``."""
    layers = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in layers if s not in LAYERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(LAYERS)}")
    return layers


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES),
                    help=f"NODES/EDGES,... (default {DEFAULT_SIZES})")
    ap.add_argument("--layers", type=parse_layers, default=",".join(LAYERS),
                    help=f"comma-separated subset of {','.join(LAYERS)}")
    ap.add_argument("--feats", type=int, default=128)
    ap.add_argument("--rels", type=int, default=8, help="RGCN's relations")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per cell (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first (autotuning)")
    ap.add_argument("--epoch-size", type=parse_size, default=parse_size(REDDIT),
                    help=f"graph of the 3-layer GAT training epoch (default {REDDIT})")
    ap.add_argument("--epoch-feats", type=int, default=602, help="input features (Reddit: 602)")
    ap.add_argument("--epoch-classes", type=int, default=41, help="classes (Reddit: 41)")
    ap.add_argument("--no-epoch", action="store_true", help="skip the training epoch")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new cell after this many seconds (the rest: 'skipped')")
    ap.add_argument("--json", type=Path, default=None, help="write every cell and table here")
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        ap.error("--repeat must be >= 1 and --warmup >= 0")
    return args


# --- tables ----------------------------------------------------------------------------

def md_table(head, rows) -> str:
    head = [str(c) for c in head]
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
             for r in [head, ["-" * w for w in widths], *rows]]
    return "\n".join(lines)


@dataclass
class Cell:
    """One implementation of one layer at one size."""
    size: str
    layer: str
    impl: str
    status: str                     # "ok", "OOM", "error", "skipped", "n/a"
    time_ms: float | None = None
    peak_mib: float | None = None
    path: str | None = None         # PyG's graph form
    note: str | None = None         # the error, or why skipped

    def shown(self) -> str:
        if self.status != "ok":
            return self.status
        mem = f", {self.peak_mib:.0f} MiB" if self.peak_mib is not None else ""
        path = f" ({self.path})" if self.path else ""
        return f"{self.time_ms:.2f} ms{mem}{path}"


@dataclass
class KernelBandwidth:
    size: str
    layer: str
    kernel: str                     # "%9 aggregate"
    predicted_bytes: int
    time_ms: float
    scope: str                      # "op" (events around the op), "layer" (whole layer)

    def gbps(self) -> float:
        return self.predicted_bytes / (self.time_ms / 1e3) / 1e9


def print_report(size: str, what: str, head, body, json_path: Path | None, **payload) -> None:
    """A script's table under the GPU's name, the size and ``what``; its rows, with the
    device and the size, to ``json_path`` where given."""
    device = torch.cuda.get_device_name()
    print(f"{device}, {size}, {what}\n")
    print(md_table(head, body))
    if json_path:
        json_path.write_text(json.dumps({"device": device, "size": size, **payload}, indent=1))


def gbps_text(gbps: float) -> str:
    return f"{gbps:.0f} GB/s" if gbps >= 100 else f"{gbps:.3g} GB/s"


def fraction_of_peak(bytes_per_s: float, peak: float | None) -> str:
    return "" if peak is None else f"{100 * bytes_per_s / peak:.0f}%"


def layer_rows(cells: list[Cell], kernels: list[KernelBandwidth], peak: float | None):
    """Rows of the layer table: one per (size, layer), one column per implementation,
    then the goals: Triton's time over the best peer's, its kernels' share of peak."""
    impls = [i for i in IMPLS if any(c.impl == i and c.status != "n/a" for c in cells)]
    keys = list(dict.fromkeys((c.size, c.layer) for c in cells))
    rows = []
    for size, layer in keys:
        by = {c.impl: c for c in cells if (c.size, c.layer) == (size, layer)}
        tri = by.get("sarc triton")
        peers = [by[p].time_ms for p in PEERS if p in by and by[p].status == "ok"]
        ratio = (f"{tri.time_ms / min(peers):.2f}x" if tri and tri.status == "ok" and peers
                 else "")
        bw = [k for k in kernels if (k.size, k.layer) == (size, layer)]
        shares = "; ".join(f"{k.kernel} {gbps_text(k.gbps())}"
                           + (f" ({fraction_of_peak(k.gbps() * 1e9, peak)})" if peak else "")
                           + (" [layer]" if k.scope == "layer" else "") for k in bw)
        rows.append([size, layer, *(by[i].shown() if i in by else "" for i in impls),
                     ratio, shares])
    head = ["size", "layer", *impls, "triton / best peer", "fused kernels: bandwidth (of peak)"]
    return head, rows


def kernel_rows(kernels: list[KernelBandwidth], peak: float | None):
    head = ["size", "layer", "kernel (forward)", "predicted bytes", "time", "achieved",
            "of peak", "measured"]
    rows = [[k.size, k.layer, k.kernel, f"{k.predicted_bytes / 2**20:.1f} MiB",
             f"{k.time_ms:.3f} ms", gbps_text(k.gbps()),
             fraction_of_peak(k.gbps() * 1e9, peak),
             "events around the op" if k.scope == "op" else "whole layer (fwd bytes / fwd+bwd)"]
            for k in kernels]
    return head, rows


def epoch_rows(cells: list[Cell]):
    head = ["graph", "model", "implementation", "epoch (median)", "peak above resident"]
    rows = [[c.size, c.layer, c.impl,
             f"{c.time_ms:.1f} ms" if c.status == "ok" else c.status,
             f"{c.peak_mib:.0f} MiB" if c.peak_mib is not None else ""] for c in cells]
    return head, rows


# --- timing ----------------------------------------------------------------------------

class Clock:
    """CUDA events on a GPU (GPU time between two marks); wall time elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


def is_oom(err: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(err, oom)) or "out of memory" in str(err).lower()


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(step: Callable[[], None], device: torch.device, warmup: int, repeat: int):
    """(median seconds of ``repeat`` steps after ``warmup``, peak bytes above resident)."""
    clock = Clock(device)
    for _ in range(warmup):
        step()
    clock.sync()
    base = None
    if clock.cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(repeat):
        a = clock.mark()
        step()
        b = clock.mark()
        clock.sync()
        times.append(clock.seconds(a, b))
    peak = torch.cuda.max_memory_allocated(device) - base if clock.cuda else None
    return statistics.median(times), peak


def run_cell(cell: Cell, build: Callable[[], Callable[[], None]], device, args) -> Cell:
    """Fill ``cell`` from timing the step ``build()`` returns; OOM and errors recorded."""
    step = None
    try:
        step = build()
        seconds, peak = measure(step, device, args.warmup, args.repeat)
        cell.status, cell.time_ms = "ok", seconds * 1e3
        cell.peak_mib = peak / 2**20 if peak is not None else None
    except Exception as err:  # noqa: BLE001 - one cell's failure must not stop the others
        cell.status = "OOM" if is_oom(err) else "error"
        cell.note = f"{type(err).__name__}: {str(err)[:500]}"
        print(f"  {cell.size} {cell.layer} {cell.impl}: {cell.status}: {cell.note}",
              file=sys.stderr)
    finally:
        del step
        free_memory(device)
    return cell


# --- the graph and the layers ------------------------------------------------------------

@dataclass
class Bench:
    """One graph on the device and what every implementation needs to run on it."""
    label: str
    nodes: int
    edges: int
    g: sarc.Graph
    src: torch.Tensor               # edges in the order of ``etype`` / ``norm``
    dst: torch.Tensor
    x: torch.Tensor
    etype: torch.Tensor
    norm: torch.Tensor
    pyg: dict = field(default_factory=dict)   # graph form -> PyG's graph argument
    dgl: object = None


def make_graph(src, dst, n: int, device) -> sarc.Graph:
    """Built on the device (the sort is the slow part at 100M edges), on the CPU if that fails."""
    try:
        return sarc.Graph.from_edges(src.to(device), dst.to(device), n).to(device)
    except Exception as err:  # noqa: BLE001
        if is_oom(err):
            raise
        return sarc.Graph.from_edges(src.cpu(), dst.cpu(), n).to(device)


def build_bench(nodes: int, edges: int, args, device, data=None) -> Bench:
    from sarc.datasets import power_law_graph
    data = data if data is not None else power_law_graph(nodes, edges, seed=0)
    n = data.num_nodes
    src, dst = data.edge_src.to(device), data.edge_dst.to(device)
    g = make_graph(src, dst, n, device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, args.feats, generator=gen).to(device)
    e = src.numel()
    etype = torch.randint(0, args.rels, (e,), generator=gen).to(device)
    norm = (torch.rand(e, generator=gen) + 0.1).to(device)
    return Bench(size_label(nodes, edges), nodes, edges, g, src, dst, x, etype, norm)


def pyg_forms(b: Bench) -> dict:
    """PyG's graph arguments, fastest first: SparseTensor (torch_sparse), CSR, edge_index."""
    if b.pyg:
        return b.pyg
    forms = {}
    n = b.g.num_src
    try:
        from torch_geometric.typing import WITH_TORCH_SPARSE
        if WITH_TORCH_SPARSE:
            from torch_sparse import SparseTensor
            forms["SparseTensor"] = SparseTensor(row=b.dst, col=b.src, sparse_sizes=(n, n))
    except Exception as err:  # noqa: BLE001
        print(f"  PyG: no SparseTensor ({type(err).__name__}: {err})", file=sys.stderr)
    try:
        # adj_t: row = destination, column = source (PyG's convention for sparse inputs)
        rowptr, col = b.g.rowptr.to(b.g.device), b.g.src
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
            forms["CSR"] = torch.sparse_csr_tensor(rowptr, col, torch.ones(col.numel(), device=col.device),
                                                   size=(n, n))
    except Exception as err:  # noqa: BLE001
        print(f"  PyG: no CSR adjacency ({type(err).__name__}: {err})", file=sys.stderr)
    forms["edge_index"] = torch.stack([b.src, b.dst])
    b.pyg = forms
    return forms


PYG_FORMS = {"GCN": ("SparseTensor", "CSR", "edge_index"), "SAGE": ("SparseTensor", "CSR", "edge_index"),
             "GAT": ("edge_index",), "GAT1x7": ("edge_index",), "RGCN": ("edge_index",)}
"""The graph forms tried for each PyG layer, in order (GATConv and RGCNConv compute per edge)."""


def sarc_layer(name: str, f: int, rels: int):
    from gat import GATLayer
    from gcn import GCNLayer
    from rgcn import RGCNLayer
    from sage import SAGELayer
    return {"GCN": lambda: GCNLayer(f, f), "SAGE": lambda: SAGELayer(f, f),
            "GAT": lambda: GATLayer(f, 32, heads=4), "GAT1x7": lambda: GATLayer(f, 7, heads=1),
            "RGCN": lambda: RGCNLayer(f, f, rels)}[name]()


def pyg_layer(name: str, f: int, rels: int):
    import torch_geometric.nn as pyg
    return {"GCN": lambda: pyg.GCNConv(f, f, add_self_loops=False),
            "SAGE": lambda: pyg.SAGEConv(f, f, aggr="mean"),
            "GAT": lambda: pyg.GATConv(f, 32, heads=4, add_self_loops=False),
            "GAT1x7": lambda: pyg.GATConv(f, 7, heads=1, add_self_loops=False),
            "RGCN": lambda: pyg.RGCNConv(f, f, rels)}[name]()


def dgl_layer(name: str, f: int, rels: int):
    import dgl.nn as dglnn
    return {"GCN": lambda: dglnn.GraphConv(f, f, norm="both", allow_zero_in_degree=True),
            "SAGE": lambda: dglnn.SAGEConv(f, f, "mean"),
            "GAT": lambda: dglnn.GATConv(f, 32, 4, allow_zero_in_degree=True),
            "GAT1x7": lambda: dglnn.GATConv(f, 7, 1, allow_zero_in_degree=True),
            "RGCN": lambda: dglnn.RelGraphConv(f, f, rels)}[name]()


def _step(module: torch.nn.Module, call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor):
    def step():
        module.zero_grad(set_to_none=True)
        xx = x.detach().requires_grad_()
        call(xx).sum().backward()
    return step


def sarc_edge_inputs(b: Bench, name: str) -> dict:
    """The edge inputs of sarc's layer ``name`` (RGCN's relations and norms)."""
    return {"etype": b.etype, "norm": b.norm} if name == "RGCN" else {}


def sarc_step(b: Bench, name: str, backend: str, args, device):
    layer = sarc_layer(name, args.feats, args.rels).to(device).train().set_backend(backend)
    edge = sarc_edge_inputs(b, name)
    return layer, _step(layer, lambda xx: layer(b.g, h=xx, **edge), b.x)


def one_layer(name: str, size: str, feats: int, backend: str, device: torch.device):
    """sarc's layer ``name`` at ``size`` ("100k/2M") on ``device``, for the scripts that
    measure one layer: its bench (graph, features), the layer, and a forward + backward
    step of it."""
    args = parse_args(["--layers", name, "--sizes", size, "--feats", str(feats)])
    b = build_bench(*args.sizes[0], args, device)
    layer, step = sarc_step(b, name, backend, args, device)
    return b, layer, step


def pyg_step(b: Bench, name: str, form: str, args, device):
    conv = pyg_layer(name, args.feats, args.rels).to(device).train()
    graph = pyg_forms(b)[form]
    if name == "RGCN":
        return _step(conv, lambda xx: conv(xx, graph, b.etype), b.x)
    return _step(conv, lambda xx: conv(xx, graph), b.x)


def dgl_step(b: Bench, name: str, args, device):
    import dgl
    if b.dgl is None:
        b.dgl = dgl.graph((b.src, b.dst), num_nodes=b.g.num_src).to(device)
    conv = dgl_layer(name, args.feats, args.rels).to(device).train()
    if name == "RGCN":
        return _step(conv, lambda xx: conv(b.dgl, xx, b.etype), b.x)
    return _step(conv, lambda xx: conv(b.dgl, xx), b.x)


def importable(module: str) -> str | None:
    """None if ``module`` imports, else why not."""
    try:
        __import__(module)
        return None
    except Exception as err:  # noqa: BLE001 - a broken install is reported, not raised
        return f"{type(err).__name__}: {err}"


# --- per-kernel bandwidth ----------------------------------------------------------------

class _TimedOp:
    """A runtime op whose calls are bracketed by clock marks (its forward launches)."""

    def __init__(self, op, clock: Clock, log: list):
        self._op, self._clock, self._log = op, clock, log

    def __call__(self, *a, **kw):
        start = self._clock.mark()
        out = self._op(*a, **kw)
        self._log.append((self._op.name, start, self._clock.mark()))
        return out

    def __getattr__(self, name):
        return getattr(self._op, name)


def _value_index(op_name: str) -> int | None:
    m = re.search(r"%(\d+)\b", op_name)
    return int(m.group(1)) if m else None


def fused_bytes(kernel, nodes: int, edges: int) -> dict[int, tuple[str, int]]:
    """Value index -> ("%i op", bytes) of each fused op of a compiled layer, at these sizes."""
    from sarc.ir.types import E, N_DST, N_SRC
    from sarc.planner.cost import fused_traffic
    sizes = {N_SRC: nodes, N_DST: nodes, E: edges}
    return {t.value: (f"%{t.value} {t.op}", int(t.fused.subs(sizes)))
            for t in fused_traffic(kernel.function)}


def kernel_bandwidth(layer, step, b: Bench, name: str, device, passes: int = 3):
    """Each fused op's predicted bytes / its forward time, the median of ``passes`` steps
    with clock marks around every op of the compiled layer."""
    kernel = layer.compiled()
    predicted = fused_bytes(kernel, b.g.num_src, b.g.num_edges)
    clock, ops = Clock(device), kernel.ops
    times: dict[int, list[float]] = {}
    try:
        for _ in range(passes):
            log: list = []
            kernel.ops = tuple(_TimedOp(op, clock, log) for op in ops)
            step()
            clock.sync()
            for op_name, a, z in log:
                i = _value_index(op_name)
                if i in predicted:
                    times.setdefault(i, []).append(clock.seconds(a, z))
    finally:
        kernel.ops = ops
    return [KernelBandwidth(b.label, name, predicted[i][0], predicted[i][1],
                            statistics.median(ts) * 1e3, "op") for i, ts in sorted(times.items())]


def layer_bandwidth(layer, b: Bench, name: str, time_ms: float) -> list[KernelBandwidth]:
    """The fallback: the layer's forward bytes over its forward + backward time."""
    predicted = fused_bytes(layer.compiled(), b.g.num_src, b.g.num_edges)
    total = sum(v for _, v in predicted.values())
    return [KernelBandwidth(b.label, name, "all fused ops", total, time_ms, "layer")] if total else []


# --- the 3-layer GAT epoch ---------------------------------------------------------------

class GAT3(torch.nn.Module):
    """Three GAT layers (4 heads x ``hidden``, then one averaged output head), ELU between,
    feature dropout 0.5; attention without dropout (its fused form)."""

    def __init__(self, in_feats: int, hidden: int, classes: int, heads: int = 4):
        super().__init__()
        from gat import GATLayer
        self.convs = torch.nn.ModuleList([
            GATLayer(in_feats, hidden, heads), GATLayer(hidden * heads, hidden, heads),
            GATLayer(hidden * heads, classes, 1, concat=False)])

    def forward(self, g, x):
        for i, conv in enumerate(self.convs):
            x = torch.nn.functional.dropout(x, 0.5, self.training)
            x = conv(g, x)
            if i < len(self.convs) - 1:
                x = torch.nn.functional.elu(x)
        return x


def epoch_step(b: Bench, backend: str, args, device):
    gen = torch.Generator(device="cpu").manual_seed(1)
    n = b.g.num_src
    x = torch.randn(n, args.epoch_feats, generator=gen).to(device)
    y = torch.randint(0, args.epoch_classes, (n,), generator=gen).to(device)
    train = (torch.rand(n, generator=gen) < 0.66).to(device)   # Reddit: 66% train nodes
    model = GAT3(args.epoch_feats, 32, args.epoch_classes).to(device).train()
    for m in model.modules():
        if isinstance(m, sarc.Layer):
            m.set_backend(backend)
    opt = torch.optim.Adam(model.parameters(), lr=0.005)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(b.g, x)
        torch.nn.functional.cross_entropy(out[train], y[train]).backward()
        opt.step()
    return step


# --- the run -------------------------------------------------------------------------------

class Report:
    """Everything measured so far; printed as markdown, written as JSON after every cell."""

    def __init__(self, args, device_name: str, peak: float | None):
        self.args, self.device_name, self.peak = args, device_name, peak
        self.cells: list[Cell] = []
        self.kernels: list[KernelBandwidth] = []
        self.epoch: list[Cell] = []
        self.notes: list[str] = []

    def tables(self) -> dict[str, str]:
        out = {}
        if self.cells:
            out["layers"] = md_table(*layer_rows(self.cells, self.kernels, self.peak))
        if self.kernels:
            out["kernels"] = md_table(*kernel_rows(self.kernels, self.peak))
        if self.epoch:
            out["epoch"] = md_table(*epoch_rows(self.epoch))
        return out

    def to_json(self) -> dict:
        a = self.args
        return {"device": self.device_name, "peak_bandwidth_bytes_per_s": self.peak,
                "torch": torch.__version__, "triton": _version("triton"),
                "torch_geometric": _version("torch_geometric"), "dgl": _version("dgl"),
                "options": {"sizes": [size_label(*s) for s in a.sizes], "layers": a.layers,
                            "feats": a.feats, "rels": a.rels, "repeat": a.repeat,
                            "warmup": a.warmup, "epoch_size": size_label(*a.epoch_size),
                            "epoch": not a.no_epoch},
                "cells": [asdict(c) for c in self.cells],
                "kernels": [{**asdict(k), "achieved_gb_per_s": k.gbps(),
                             "fraction_of_peak": (k.gbps() * 1e9 / self.peak if self.peak else None)}
                            for k in self.kernels],
                "epoch": [asdict(c) for c in self.epoch],
                "notes": self.notes, "tables": self.tables(),
                # what benchmarks/report.py reads from docs/benchmarks/gpu.json
                "machine": f"{self.device_name}, torch {torch.__version__}, "
                           f"triton {_version('triton')}",
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": "python " + " ".join(sys.argv),
                "markdown": "\n\n".join(f"### {k}\n\n{v}" for k, v in self.tables().items())}

    def save(self) -> None:
        if self.args.json is not None:
            tmp = self.args.json.with_name(self.args.json.name + ".tmp")
            tmp.write_text(json.dumps(self.to_json(), indent=1))
            tmp.replace(self.args.json)

    def markdown(self) -> str:
        titles = {"layers": "Forward + backward per layer (median; peak memory above resident)",
                  "kernels": "Fused Triton kernels: cost-model bytes / measured forward time",
                  "epoch": "3-layer GAT, one training epoch"}
        head = (f"{self.device_name}; {self.args.feats} features, median of {self.args.repeat} "
                f"after {self.args.warmup} warm-up runs; peak bandwidth "
                f"{self.peak / 1e12:.2f} TB/s" if self.peak else
                f"{self.device_name} (peak bandwidth unknown: no fraction of peak)")
        parts = [head] + [f"### {titles[k]}\n\n{t}" for k, t in self.tables().items()]
        return "\n\n".join(parts + [f"- {n}" for n in self.notes])


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001
        return None


def bench_size(b: Bench, report: Report, args, device, out_of_time: Callable[[], bool]) -> None:
    missing = {"PyG": importable("torch_geometric"), "DGL": importable("dgl")}
    for lib, why in missing.items():
        note = f"{lib}: not timed ({why})"
        if why and note not in report.notes:
            report.notes.append(note)
    for name in args.layers:
        for impl in IMPLS:
            cell = Cell(b.label, name, impl, "skipped")
            report.cells.append(cell)
            if impl in missing and missing[impl]:
                cell.status = "n/a"
                continue
            if out_of_time():
                cell.note = "time budget spent"
                continue
            print(f"  {b.label} {name} {impl} ...", file=sys.stderr, flush=True)
            if impl.startswith("sarc"):
                backend = impl.split()[1]
                holder = {}

                def build(backend=backend, holder=holder):
                    holder["layer"], step = sarc_step(b, name, backend, args, device)
                    holder["step"] = step
                    return step
                run_cell(cell, build, device, args)
                if backend == "triton" and cell.status == "ok":
                    report.kernels.extend(_bandwidth(holder, b, name, cell, device, report))
                holder.clear()
            elif impl == "PyG":
                _pyg_cell(cell, b, name, args, device)
            else:
                run_cell(cell, lambda: dgl_step(b, name, args, device), device, args)
            free_memory(device)
            report.save()


def _bandwidth(holder: dict, b: Bench, name: str, cell: Cell, device,
               report: "Report") -> list[KernelBandwidth]:
    try:
        return kernel_bandwidth(holder["layer"], holder["step"], b, name, device)
    except Exception as err:  # noqa: BLE001 - fall back to the whole layer, labelled
        print(f"  per-op timing failed ({type(err).__name__}: {err}); whole layer instead",
              file=sys.stderr)
    try:
        return layer_bandwidth(holder["layer"], b, name, cell.time_ms)
    except Exception as err:  # noqa: BLE001
        report.notes.append(f"{b.label} {name}: no bandwidth ({type(err).__name__}: {err})")
        return []


def _pyg_cell(cell: Cell, b: Bench, name: str, args, device) -> None:
    """The first of the layer's PyG graph forms that runs; the failures noted."""
    tried = []
    try:
        forms = pyg_forms(b)
    except Exception as err:  # noqa: BLE001
        cell.status, cell.note = ("OOM" if is_oom(err) else "error"), f"{type(err).__name__}: {err}"
        return
    for form in PYG_FORMS[name]:
        if form not in forms:
            continue
        cell.path = form
        run_cell(cell, lambda form=form: pyg_step(b, name, form, args, device), device, args)
        if cell.status != "error":
            break
        tried.append(f"{form}: {cell.note}")
    if tried:
        cell.note = "; ".join(tried)


def run(args, device: torch.device, device_name: str) -> Report:
    """Every cell at every size, then the epoch; ``report`` saved as it fills."""
    report = Report(args, device_name, peak_bandwidth(device_name) if device.type == "cuda" else None)
    t0 = time.monotonic()

    def out_of_time() -> bool:
        return args.budget_s is not None and time.monotonic() - t0 > args.budget_s

    epoch_done = args.no_epoch
    for nodes, edges in args.sizes:
        label = size_label(nodes, edges)
        if out_of_time():
            report.notes.append(f"{label}: not run (time budget spent)")
            continue
        print(f"{label}: building the graph", file=sys.stderr, flush=True)
        try:
            b = build_bench(nodes, edges, args, device)
        except Exception as err:  # noqa: BLE001
            kind = "does not fit in memory (OOM)" if is_oom(err) else f"failed ({type(err).__name__}: {err})"
            report.notes.append(f"{label}: the graph {kind}; size skipped")
            print(f"{label}: the graph {kind}; size skipped", file=sys.stderr)
            free_memory(device)
            report.save()
            continue
        bench_size(b, report, args, device, out_of_time)
        print(f"\n{label}:\n\n" + md_table(*layer_rows([c for c in report.cells if c.size == label],
                                                         report.kernels, report.peak)), flush=True)
        if not epoch_done and (nodes, edges) == tuple(args.epoch_size):
            run_epoch(b, report, args, device, out_of_time)
            epoch_done = True
        del b
        free_memory(device)
    if not epoch_done:
        if out_of_time():
            report.notes.append("epoch: not run (time budget spent)")
        else:
            try:
                b = build_bench(*args.epoch_size, args, device)
                run_epoch(b, report, args, device, out_of_time)
                del b
            except Exception as err:  # noqa: BLE001
                kind = "OOM" if is_oom(err) else f"{type(err).__name__}: {err}"
                report.notes.append(f"epoch: the graph could not be built ({kind})")
            free_memory(device)
    report.save()
    return report


def run_epoch(b: Bench, report: Report, args, device, out_of_time) -> None:
    for backend in ("triton", "torch"):
        cell = Cell(b.label, "GAT 3 layers", f"sarc {backend}", "skipped")
        report.epoch.append(cell)
        if out_of_time():
            cell.note = "time budget spent"
            continue
        print(f"  {b.label} epoch sarc {backend} ...", file=sys.stderr, flush=True)
        run_cell(cell, lambda backend=backend: epoch_step(b, backend, args, device), device, args)
        report.save()


def gpu_unavailable() -> str | None:
    """Why the GPU comparison cannot run here, or None."""
    if not torch.cuda.is_available():
        return ("No CUDA GPU on this machine: the GPU benchmark was skipped (the Triton "
                "kernels are verified in Triton's interpreter by tests/backends/triton; "
                "tests/gpu and this benchmark run on a GPU: scripts/gpu_session.sh).")
    try:
        from sarc.backends.triton_backend import check_triton
        check_triton()
    except Exception as err:  # noqa: BLE001
        return f"The Triton backend cannot run here ({err}): the GPU benchmark was skipped."
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    why = gpu_unavailable()
    if why:
        print(why)
        return 0
    torch.manual_seed(0)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    report = run(args, device, name)
    print(report.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
