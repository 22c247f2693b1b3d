"""The Triton backend's code generation: per-op tables, tiling, the kernel files and their
headers, ``sarc compile --emit kernels``, golden kernels, explicit fallbacks, schedules.

Golden kernels live in ``golden/`` beside this file; after an intended change
rewrite them with ``SARC_UPDATE_GOLDEN=1 python -m pytest tests/backends/triton`` and
read the diff before committing it.
"""
from __future__ import annotations

import ast
import difflib
import logging
import os
from pathlib import Path

import pytest
import torch
from difftest import check_layer
from edgeconv import EdgeConvLayer
from gat import GATLayer
from gcn import GCNLayer
from rgcn import RGCNLayer
from sage import SAGELayer
from triton_check import GRAPHS, compare, power_law_block, set_backend

import sarc
from sarc.backends import triton_backend, triton_runtime
from sarc.backends.torch_backend import LOWERING
from sarc.backends.triton_lower import (NOT_IN_KERNELS, TL_LOWERING, TritonLoweringError,
                                        layout_compatible, plan_tiling)
from sarc.compiler import compile_function, compile_layer, optimize
from sarc.ir.ops import Op

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SARC_UPDATE_GOLDEN") == "1"
ROOT = Path(__file__).resolve().parents[3]


# --- tables --------------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(Op), ids=lambda op: op.value)
def test_every_op_is_lowered_or_says_why_not(op):
    """In a kernel (TL_LOWERING) or not, with the reason (NOT_IN_KERNELS); never both."""
    assert (op in TL_LOWERING) != (op in NOT_IN_KERNELS), op
    # in the layer module: a kernel op, or a PyTorch line
    assert op in triton_backend.KERNEL_OPS or op in LOWERING


# --- tiling and layouts ------------------------------------------------------------------------

def _region(layer, op=Op.AGGREGATE, attr="body"):
    fn = optimize(layer.trace())
    v = next(v for v in fn.values if v.op is op)
    return v.attr[attr]


def test_tiling_follows_the_last_axis():
    r = _region(GATLayer(4, 8, heads=2, attn_drop=0.3))  # z[src] * alpha.reshape(H, 1)
    tiled = plan_tiling(r)
    root = r.values[r.result]
    assert r.result in tiled and root.type.feat == (2, 8)
    # the attention weight [E, 2] -> [E, 2, 1] broadcasts along the tiled axis: not tiled
    assert all(r.values[j].type.feat[-1] == 8 for j in tiled)


class DotLayer(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": (2, 8)})

    def message(self, src, dst, edge):
        return (src.h * dst.h).sum(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_tiling_stops_at_a_reduction_over_the_last_axis():
    assert plan_tiling(_region(DotLayer())) == frozenset()  # sum over the 8: whole rows
    r = _region(GATLayer(4, 8, heads=2, attn_drop=0.3), Op.SDDMM)  # leaky_relu(el + er)
    assert plan_tiling(r) == frozenset(range(len(r.values)))   # elementwise: tiled by head


@pytest.mark.parametrize("a, b, ok", [
    ((4, 8), (32,), True),      # merge: the inner axis is a power of two
    ((3, 8), (24,), True),      # the outer axis may be padded
    ((4, 3), (12,), False),     # a padded inner axis would move elements
    ((4,), (4, 1), True),       # size-1 axes come and go
    ((1, 5), (5,), True),
    ((2, 2, 6), (4, 6), True),
    ((6, 4), (4, 6), False),
])
def test_layout_compatible(a, b, ok):
    assert layout_compatible(a, b) is ok
    assert layout_compatible(b, a) is ok


# --- generated files ---------------------------------------------------------------------------

def _kernel(layer):
    return compile_function(layer.trace(), backend="triton")


KERNELS_OF = {
    # model layer -> the kernels the Triton backend generates for it (the note of issue 5)
    "gcn": (lambda: GCNLayer(16, 8), ["v9_aggregate.forward", "v9_aggregate.forward_combine",
                                      "v9_aggregate.grad0", "v9_aggregate.grad0_combine"]),
    "gat": (lambda: GATLayer(16, 8, heads=4),
            ["v14_softmax_aggregate.forward", "v14_softmax_aggregate.forward_combine",
             "v14_softmax_aggregate.sigma", "v14_softmax_aggregate.sigma_combine",
             *(f"v14_softmax_aggregate.grad{k}{c}" for k in range(3) for c in ("", "_combine"))]),
    # the typed product (fuse_typed_linear): the aggregate over a node x type table, the one
    # over per-edge rows and the segment GEMM of those rows; edge operands' gradients: SDDMMs
    "rgcn": (lambda: RGCNLayer(16, 8, 4),
             [*(f"v6_aggregate.{part}.{k}" for part in ("table", "edges") for k in (
                 "forward", "forward_combine", "grad0", *(("grad0_combine",) if part == "table"
                                                          else ()), "grad1")),
              "v6_aggregate.rows.forward", "v6_aggregate.rows.grad_x", "v6_aggregate.rows.grad_w",
              "v6_aggregate.rows.grad_x_scatter", "v6_aggregate.rows.grad_x_scatter_combine"]),
}


@pytest.mark.parametrize("model", sorted(KERNELS_OF))
def test_kernels_of_each_model(model):
    make, names = KERNELS_OF[model]
    kernel = _kernel(make())
    assert [k.name for k in kernel.kernels] == names
    assert kernel.fallbacks == ()


@pytest.mark.parametrize("model", sorted(KERNELS_OF))
def test_kernel_files_are_standalone_and_say_what_they_are(model):
    make, _ = KERNELS_OF[model]
    kernel = _kernel(make())
    for k in kernel.kernels:
        tree = ast.parse(k.source)
        doc = ast.get_docstring(tree)
        assert doc.startswith("Generated by sarc: layer ")
        assert f"Kernel {k.name}: " in doc
        assert "Launch grid: (" in doc and "Autotune space" in doc
        assert "%" in doc  # the IR op it implements, printed
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
        assert {"kernel", "launch", "CONFIGS", "KEY"} <= defined
        imports = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        assert imports == {"triton", "triton.language"}  # nothing of sarc's
        assert len(kernel.ops) >= 1


GOLDEN_KERNELS = {
    "gcn_aggregate_forward.py": (lambda: GCNLayer(16, 8), "v9_aggregate.forward"),
    "gat_softmax_aggregate_forward.py": (lambda: GATLayer(16, 8, heads=4),
                                         "v14_softmax_aggregate.forward"),
    "gat_softmax_aggregate_grad0.py": (lambda: GATLayer(16, 8, heads=4),
                                       "v14_softmax_aggregate.grad0"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_KERNELS))
def test_golden_kernels(name):
    make, kname = GOLDEN_KERNELS[name]
    text = next(k.source for k in _kernel(make()).kernels if k.name == kname)
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    want = path.read_text()
    assert text == want, "generated kernel differs from its golden file:\n" + "".join(
        difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "generated"))


def test_compile_command_writes_each_kernel(tmp_path):
    from sarc.cli import main
    out = tmp_path / "gat"
    assert main(["compile", str(ROOT / "models" / "gat.py"), "--backend", "triton",
                 "--emit", "kernels", "--out", str(out)]) == 0
    layer_files = sorted(p.name for p in out.glob("*.triton.py"))
    assert layer_files == ["conv1.triton.py", "conv2.triton.py"]
    kernels = sorted(p.name for p in (out / "conv1.kernels").iterdir())
    assert "v15_edge_softmax.forward.py" in kernels and "v17_aggregate.forward.py" in kernels
    for p in (out / "conv1.kernels").iterdir():
        head = p.read_text().split('"""')[1]
        assert "(gat.py)" in head and "Launch grid" in head and "Autotune space" in head
    assert "ops[0]" in (out / "conv1.triton.py").read_text()


# --- no silent fallbacks ---------------------------------------------------------------------

class ConcatLayer(sarc.Layer):
    """A message concatenating two features: no register-tile concat, so no kernel."""

    def __init__(self, d: int):
        super().__init__(node={"h": d})

    def message(self, src, dst, edge):
        return sarc.concat([src.h, dst.h.relu()], -1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_unlowerable_op_falls_back_explicitly(caplog):
    g = GRAPHS["random"]
    layer = set_backend(ConcatLayer(3), "triton")
    with caplog.at_level(logging.WARNING, logger="sarc.backends.triton"):
        kernel = layer.compiled()
    assert len(kernel.fallbacks) == 1 and "concat" in kernel.fallbacks[0]
    assert "aggregate" in kernel.fallbacks[0]
    assert any("concat" in r.getMessage() and "PyTorch" in r.getMessage() for r in caplog.records)
    assert "# fallback to the PyTorch backend" in kernel.source
    h = torch.randn(g.num_src, 3)
    ref = set_backend(ConcatLayer(3), "torch")
    assert torch.allclose(layer(g, h=h), ref(g, h=h))


def test_unlowerable_op_raises_in_strict_mode(monkeypatch):
    monkeypatch.setenv("SARC_TRITON_STRICT", "1")
    with pytest.raises(TritonLoweringError, match=r"aggregate: concat cannot run inside a Triton kernel"):
        set_backend(ConcatLayer(3), "triton").compiled()


class TableLayer(sarc.Layer):
    """A parameter table read per edge: its gradient (index_add) has no kernel."""

    def __init__(self, d: int):
        super().__init__(node={"h": d}, edge={"etype": sarc.INDEX})
        self.emb = torch.nn.Parameter(torch.randn(3, d))

    def message(self, src, dst, edge):
        return src.h * self.emb[edge.etype]

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_gradient_without_a_kernel_falls_back(caplog):
    g = GRAPHS["random"]
    layer = TableLayer(4)
    with caplog.at_level(logging.WARNING, logger="sarc.backends.triton"):
        tri = set_backend(layer, "triton")
        assert "index_add" in tri.compiled().fallbacks[0]
    feats = {"h": torch.randn(g.num_src, 4), "etype": torch.randint(0, 3, (g.num_edges,))}
    with pytest.raises(AssertionError):  # compare insists on no fallback...
        compare(TableLayer(4), g, feats)


def test_an_add_of_a_linear_is_one_addmm_as_in_the_torch_backend():
    """SAGE's ``lin_neigh(mean) + b + lin_self(h)``: two ``torch.addmm`` lines beside the
    aggregate's kernel, values and gradients as the interpreter's."""
    g = GRAPHS["random"]
    layer = set_backend(SAGELayer(4, 8), "triton")
    code = [line.strip() for line in layer.compiled().source.splitlines()
            if not line.strip().startswith("#")]
    assert sum("torch.addmm(" in line for line in code) == 2, code
    assert not any("torch.matmul(" in line or " + " in line for line in code), code
    check_layer(layer, g, {"h": torch.randn(g.num_src, 4)})


def test_missing_or_old_triton_is_an_error(monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "2.2.0")
    with pytest.raises(triton_backend.TritonUnavailable, match=r"triton >= 3.0, found 2.2.0"):
        compile_function(GCNLayer(4, 2).trace(), backend="triton")


def test_cpu_tensors_without_the_interpreter_are_an_error():
    class Compiled:  # a kernel compiled for a GPU (not an InterpretedFunction)
        pass
    with pytest.raises(triton_runtime.TritonRuntimeError, match="TRITON_INTERPRET=1"):
        triton_runtime.check_device("layer %9 aggregate", Compiled(), [torch.zeros(2)])


# --- schedules -----------------------------------------------------------------------------------

@pytest.mark.parametrize("view", ["csr", "csc"])
def test_schedule_covers_every_edge_once(view, split_small):
    g = power_law_block(40)
    v = triton_runtime.graph_view(g, view)
    deg = (v.ptr[1:] - v.ptr[:-1])
    covered = torch.zeros(g.num_edges, dtype=torch.int64)
    for items in v.buckets:
        assert (items.hi - items.lo <= items.max_deg).all()
        assert torch.equal(items.row, items.slot)
        assert (items.hi - items.lo).tolist() == sorted((items.hi - items.lo).tolist(), reverse=True)
        for lo, hi in zip(items.lo.tolist(), items.hi.tolist()):
            covered[lo:hi] += 1
    assert v.split is not None  # the hubs
    segs = v.split.segs
    assert (segs.hi - segs.lo <= triton_runtime.SPLIT_EDGES).all()
    assert (deg[v.split.rows] > triton_runtime.SPLIT_EDGES).all()
    for lo, hi in zip(segs.lo.tolist(), segs.hi.tolist()):
        covered[lo:hi] += 1
    assert (covered == 1).all()
    rows = torch.cat([items.row for items in v.buckets] + [v.split.rows])
    assert sorted(rows.tolist()) == (deg > 0).nonzero().squeeze(1).tolist()
    if view == "csc":  # each CSC edge is a CSR edge: same endpoints
        row_of = torch.repeat_interleave(torch.arange(v.num_rows), deg)
        assert torch.equal(g.src[v.eid], row_of) and torch.equal(g.dst[v.eid], v.other)


def test_schedule_is_cached_per_graph():
    g = power_law_block(10)
    assert triton_runtime.graph_view(g, "csr") is triton_runtime.graph_view(g, "csr")


# --- the cost model's traffic table (benchmarks/triton_kernels.py) ------------------------------

@pytest.mark.parametrize("model", sorted(KERNELS_OF))
def test_fused_kernels_move_fewer_bytes_than_the_naive_plan(model):
    from sarc.ir.types import E, N_DST, N_SRC
    from sarc.planner.cost import fused_traffic
    make, names = KERNELS_OF[model]
    traffic = fused_traffic(_kernel(make()).function)  # the backend's IR, its passes included
    assert traffic
    for t in traffic:  # each entry is an op with kernels
        assert any(n.startswith(f"v{t.value}_{t.op}.") and n.endswith(".forward") for n in names)
        assert t.fused.free_symbols <= {E, N_DST, N_SRC}
        for n, e in ((100, 1000), (10**5, 2 * 10**6)):
            sizes = {N_SRC: n, N_DST: n, E: e}
            assert 0 < t.fused.subs(sizes) < t.naive.subs(sizes)


@pytest.mark.parametrize("model", ["gat", "edgeconv"])
def test_a_dst_linear_is_the_rows_of_its_src_twin(model):
    """GAT's ``lin(dst.h)`` and EdgeConv's ``theta(h_v)`` are the rows of the source linear
    (``patterns.dst_rows_of_src``), as on the PyTorch backend: one product per weight;
    values and gradients as the PyTorch backend's."""
    layer, products = ((GATLayer(8, 4, heads=2), 1) if model == "gat"
                       else (EdgeConvLayer(8, 8), 2))
    code = [line for line in compile_layer(layer, backend="triton").kernel.source.splitlines()
            if not line.lstrip().startswith("#")]
    assert sum("torch.matmul(" in line or "torch.addmm(" in line for line in code) == \
        products, "\n".join(code)
    assert any("= K.dst_rows(v" in line for line in code), "\n".join(code)
    g = power_law_block(40, seed=3)
    compare(layer, g, {"h": torch.randn(g.num_src, 8)})
