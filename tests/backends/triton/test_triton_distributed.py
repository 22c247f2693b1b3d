"""A Triton layer's distributed schedule runs its edge blocks on Triton kernels and computes
what the layer computes on a ``Graph``.

One worker (P = 1, gloo) runs a training step of a two-layer model on the Triton backend
over a ``DistGraph``; the same model on a ``Graph`` gives the reference: loss, parameter
gradients and input gradients agree to 1e-5. The schedules say which ops run on Triton
(``ops[n]``) and which fall back to the torch backend (``Generated.fallbacks``).
"""
from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import re
import traceback

import pytest
import torch
import torch.nn.functional as F

import sarc
from sarc.backends import dist_backend
from sarc.backends.triton_lower import TritonLoweringError
from sarc.compiler import compile_layer
from sarc.ir.split import split_layer
from sarc.partition import partition_graph
from sarc.planner.plan import plan_layer

from distributed.harness import free_port
from test_triton_codegen import ConcatLayer

N, E, FEATS, CLASSES = 24, 90, 5, 3
TIMEOUT_S = 240


def _models():
    from distributed.models import MODELS
    return MODELS


def _graph():
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, N - 3, (E,), generator=gen)   # the last 3 nodes have no edges
    dst = torch.randint(0, N - 3, (E,), generator=gen)
    x = torch.randint(-2, 3, (N, FEATS), generator=gen).float()  # ties for max / min
    x = x + 0.25 * torch.randn(N, FEATS, generator=gen) * (torch.rand(N, 1, generator=gen) < 0.5)
    label = torch.randint(0, CLASSES, (N,), generator=gen)
    train = torch.rand(N, generator=gen) < 0.7
    return src, dst, x, label, train


RELATIONS = {"rgcn": 3, "rgcn_per_edge": 5}
"""Relational cases: their relation counts. N x 3 <= E: R-GCN's typed product over the node
x relation table; N x 5 > E: per edge."""


def _model(case: str):
    if case in RELATIONS:
        return _models()["rgcn"](FEATS, CLASSES, num_etypes=RELATIONS[case])
    return _models()[case.removesuffix("_baseline")](FEATS, CLASSES)


def _etype(name: str) -> dict:
    if name not in RELATIONS:
        return {}
    return {"etype": torch.randint(0, RELATIONS[name], (E,),
                                   generator=torch.Generator().manual_seed(5))}


def _on_triton(model, name):
    """The model with every layer on the Triton backend; with attention dropout, in eval
    mode (dropout off, edge_softmax still unfused) so both steps compute the same."""
    for m in model.modules():
        if isinstance(m, sarc.Layer):
            m.set_backend("triton")
    return model.eval() if name == "gat_attn_drop" else model


def _step(model, g, x, label, train, **edge_inputs):
    logits = model(g, x, **edge_inputs)
    loss = F.cross_entropy(logits[train], label[train], reduction="sum") / int(train.sum())
    loss.backward()
    return loss


def _spy_softmax_reads(reads: list) -> None:
    """Record the dtypes of the floating operands every softmax kernel and softmax gradient
    kernel is given (this forked worker's classes are patched, not the test process's)."""
    from sarc.backends import triton_runtime as rt

    def floats(xs):
        return [str(x.dtype) for x in xs if x.is_floating_point()]

    real_call, real_grads = rt.SoftmaxKernel.__call__, rt.FusedOp.operand_grads

    def call(self, g, xs, dtype):
        reads.append(("forward", str(dtype), floats(xs)))
        return real_call(self, g, xs, dtype)

    def grads(self, g, xs, feeds, needs, dtype=None):
        if self.kind == "softmax":
            reads.append(("backward", str(dtype), floats(xs)))
        return real_grads(self, g, xs, feeds, needs, dtype)

    rt.SoftmaxKernel.__call__, rt.FusedOp.operand_grads = call, grads


def _worker(out_file, port, part_dir, name, state, record=False):
    """One worker's step on its shard (the whole graph: P = 1); saves what it computed and,
    with ``record``, the kernel launches (``gpu_compile``)."""
    try:
        recording = contextlib.nullcontext()
        if record:
            import gpu_compile
            recording = gpu_compile.record()
        import torch.distributed as dist

        from sarc.distributed import DistGraph
        from sarc.partition import load_partitions
        from sarc.runtime.sharded import ShardedGraph
        torch.set_num_threads(1)
        softmax_reads: list = []
        _spy_softmax_reads(softmax_reads)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        # The group is left by this forked process's exit, never destroyed: torch 2.2's
        # ProcessGroupGloo destructor can block for good holding the GIL.
        shard = ShardedGraph.from_partitions(load_partitions(part_dir, verify=False), 0)
        model = _on_triton(_model(name), name)
        model.load_state_dict(state)
        dg = DistGraph(shard, baseline=name.endswith("_baseline"))
        x = shard.ndata["feat"].clone().requires_grad_()
        edge_inputs = {"etype": dg.edge_data("etype")} if name in RELATIONS else {}
        with recording as rec:
            loss = _step(model, dg, x, shard.ndata["label"], shard.ndata["train_mask"],
                         **edge_inputs)
        progs = list(dg.programs.values())
        torch.save({"loss": loss.item(), "ids": shard.orig_node_ids, "x_grad": x.grad,
                    "param_grads": {k: p.grad for k, p in model.named_parameters()},
                    "backends": [p.generated.backend for p in progs],
                    "fallbacks": [p.generated.fallbacks for p in progs],
                    "sources": [p.source for p in progs],
                    "softmax_reads": softmax_reads,
                    "launches": gpu_compile.jobs(rec) if record else None}, out_file)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out_file)


def _distributed_step(tmp_path, name, state, src, dst, x, label, train, record=False) -> dict:
    pset = partition_graph(src, dst, N, 1, tmp_path / "parts", method="random",
                           node_data={"feat": x, "label": label, "train_mask": train},
                           edge_data=_etype(name))
    out_file = tmp_path / "step.pt"
    p = multiprocessing.get_context("fork").Process(
        target=_worker, args=(str(out_file), free_port(), str(pset.path), name, state, record))
    p.start()
    p.join(TIMEOUT_S)
    if p.is_alive():
        p.kill()
        pytest.fail(f"the worker did not finish in {TIMEOUT_S} s")
    assert out_file.exists(), f"the worker exited ({p.exitcode}) without a result"
    out = torch.load(out_file, weights_only=False)
    assert "error" not in out, out.get("error")
    return out


def _close(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()) + 1e-7,
                               msg=lambda m: f"{what}: {m}")


# model -> the block ops its schedules run on the torch backend (the rest: Triton kernels);
# GAT with attention dropout (in eval mode) keeps an unfused edge_softmax: a normalizer pass;
CASES = {
    "gcn": set(),
    "sage": set(),
    "max": set(),
    "gat": set(),
    "gat_attn_drop": set(),
    # baseline mode: a normalizer pass, blocks normalized with the global (M, S)
    "gat_baseline": set(),
    # the typed product over the node x relation table, and per edge
    "rgcn": set(),
    "rgcn_per_edge": set(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_worker_step_on_triton_equals_the_graph_step(tmp_path, name):
    src, dst, x, label, train = _graph()
    torch.manual_seed(0)
    model = _on_triton(_model(name), name)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = sarc.Graph.from_edges(src, dst, N)
    xr = x.clone().requires_grad_()
    loss = _step(model, g, xr, label, train, **_etype(name))  # edge data in the input order

    out = _distributed_step(tmp_path, name, state, src, dst, x, label, train)

    assert out["backends"] and set(out["backends"]) == {"triton"}
    assert all("ops[0](g, " in s or "ops[0], " in s for s in out["sources"])
    fell_back = {r.split("block op ")[1].split(":")[0] for fb in out["fallbacks"] for r in fb}
    assert fell_back == CASES[name]
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-5)
    x_grad = torch.zeros_like(xr.grad)
    x_grad[out["ids"]] = out["x_grad"]
    _close(x_grad, xr.grad, "input gradient")
    for k, p in model.named_parameters():
        _close(out["param_grads"][k], p.grad, f"gradient of {k}")
    if name in ("gat", "gat_baseline"):
        # the blocks' kernels, statistics in float64, read the float32 operands themselves:
        # no float64 copy of z or the scores per block
        reads = out["softmax_reads"]
        assert {(way, dtype) for way, dtype, _ in reads} >= {("forward", "torch.float64"),
                                                              ("backward", "torch.float64")}
        assert all(d == "torch.float32" for *_, ds in reads for d in ds), reads


# --- the no-silent-fallback rule ----------------------------------------------------------

def _schedule(layer, name: str):
    from sarc.planner.stats import ShardStats
    fn = compile_layer(layer.trace(), "triton", through="optimize").optimized
    lp = plan_layer(name, fn, workers=2, stats=ShardStats(2, (10, 8), (40, 30), ((0, 3), (2, 0))),
                    exec_mode="sar", inputs_need_grad=True)
    return dist_backend.compile(split_layer(fn, lp.exchange.values), lp, layer_name=name,
                                workers=2, backend="triton")


def test_an_unfused_edge_softmax_runs_its_block_ops_on_triton_kernels():
    """GAT with attention dropout: its normalizer pass, global weights and their gradients
    are the site op's kernels, passed after the torch block ops' arguments."""
    from gat import GATLayer
    gen = _schedule(GATLayer(6, 4, heads=2, attn_drop=0.5), "gat")
    assert gen.fallbacks == ()
    header = gen.source.split("import torch")[0]
    site = re.search(r"ops\[(\d+)\]: %\d+ edge_softmax \(block ops\) -> kernels (.*)", header)
    assert site, header
    for part in ("normalizer", "weights", "scaled_weights", "row_sums", "row_shares"):
        assert f"edge_softmax_site.{part}" in site.group(2)
    n = site.group(1)
    for call in (rf"DK\.score_normalizer\(v\d+, g, ops\[{n}\]\)",
                 rf"DK\.edge_softmax_global\(v\d+, g, norms\[.*\], ops\[{n}\]\)",
                 rf"DK\.score_normalizer_surrogate\(v\d+, g, norms\[.*\], cot\[.*\], ops\[{n}\]\)"):
        assert re.search(call, gen.source), call


def test_an_op_without_a_triton_kernel_is_listed_and_named_in_the_header(caplog):
    gen = _schedule(ConcatLayer(3), "concat")
    assert gen.backend == "triton"
    assert [re.sub(r"^%\d+", "%i", f.split(": ", 1)[0]) for f in gen.fallbacks] == ["%i aggregate"]
    assert all("concat cannot run inside a Triton kernel" in f for f in gen.fallbacks)
    header = gen.source.split("import torch")[0]
    for f in gen.fallbacks:
        assert f"fallback to the PyTorch backend: {f}" in header
    logged = [r.getMessage() for r in caplog.records]
    assert any("concat" in m and "PyTorch backend's kernels" in m for m in logged)


def test_strict_mode_raises_on_an_op_without_a_triton_kernel(monkeypatch):
    monkeypatch.setenv("SARC_TRITON_STRICT", "1")
    with pytest.raises(TritonLoweringError, match=r"layer concat, %\d+ aggregate: concat "
                                                  r"cannot run inside a Triton kernel"):
        _schedule(ConcatLayer(3), "concat")


def test_a_torch_schedule_names_no_triton_op():
    from gcn import GCNLayer
    from sarc.planner.stats import ShardStats
    fn = compile_layer(GCNLayer(6, 4).trace(), "torch", through="optimize").optimized
    lp = plan_layer("gcn", fn, workers=2, stats=ShardStats(2, (10, 8), (40, 30), ((0, 3), (2, 0))),
                    exec_mode="sar", inputs_need_grad=True)
    gen = dist_backend.compile(split_layer(fn, lp.exchange.values), lp, layer_name="gcn", workers=2)
    assert gen.backend == "torch" and gen.fallbacks == () and gen.module.ops == ()
    assert "ops[" not in gen.source and "import torch_blocks as DK" in gen.source
    assert os.path.exists(gen.path)


def test_sarc_compile_writes_the_schedules_of_the_layers_backend(tmp_path):
    import sys

    from timeouts import run_or_show_stacks
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    out = tmp_path / "art"
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "compile", "models/gcn.py",
                               "--backend", "triton", "--workers", "2", "--emit", "schedule",
                               "--out", str(out)], cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("conv1", "conv2"):
        text = (out / f"{name}.schedule.py").read_text()
        assert "# Edge blocks on the triton backend's kernels:" in text
        assert "import triton_blocks as DK" in text and "ops[0](g, " in text


# --- max / min of a message from both ends, in half precision ---------------------------------

class _MaxOfBothEnds(sarc.Layer):
    """max (or min) of lin(h_u) + lin(h_v): a per-edge value the kernels recompute in float32
    in the backward, where they pick the edges attaining the merged extremum."""

    def __init__(self, kind: str):
        super().__init__(node={"h": FEATS})
        self.lin, self.kind = torch.nn.Linear(FEATS, 4), kind

    def message(self, src, dst, edge):
        return self.lin(src.h) + self.lin(dst.h)

    def reduce(self, msg):
        return sarc.max(msg.m) if self.kind == "max" else sarc.min(msg.m)


def _half_worker(out_file, port, part_dir, kind, dtype, state):
    try:
        import torch.distributed as dist

        from sarc.distributed import DistGraph
        from sarc.partition import load_partitions
        from sarc.runtime.sharded import ShardedGraph
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        shard = ShardedGraph.from_partitions(load_partitions(part_dir, verify=False), 0)
        layer = _MaxOfBothEnds(kind).to(dtype)
        layer.load_state_dict(state)
        layer.set_backend("triton")
        x = shard.ndata["feat"].to(dtype).requires_grad_()
        out = layer(DistGraph(shard), x)
        (out.float() * shard.ndata["w"]).sum().backward()
        torch.save({"ids": shard.orig_node_ids, "out": out.detach(), "x_grad": x.grad,
                    "w_grad": layer.lin.weight.grad}, out_file)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out_file)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_precision_extremum_schedule_equals_the_graph_step(tmp_path, kind, dtype):
    """The blocks' partials give the exact (float32) extremum, which the merge rounds for the
    output only: the backward kernels compare each edge with the exact one. With the rounded
    one, no recomputed edge matched and every gradient was near 0."""
    src, dst, x, _, _ = _graph()
    w = torch.randn(N, 4, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    layer = _MaxOfBothEnds(kind).to(dtype)
    layer.set_backend("triton")
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    xr = x.to(dtype).requires_grad_()
    want = layer(sarc.Graph.from_edges(src, dst, N), xr)
    (want.float() * w).sum().backward()

    pset = partition_graph(src, dst, N, 1, tmp_path / "parts", method="random",
                           node_data={"feat": x, "w": w})
    out_file = tmp_path / "step.pt"
    p = multiprocessing.get_context("fork").Process(
        target=_half_worker, args=(str(out_file), free_port(), str(pset.path), kind, dtype, state))
    p.start()
    p.join(TIMEOUT_S)
    assert not p.is_alive() and out_file.exists(), "the worker did not finish"
    got = torch.load(out_file, weights_only=False)
    assert "error" not in got, got.get("error")
    x_grad = torch.zeros_like(xr.grad)
    x_grad[got["ids"]] = got["x_grad"]
    out = torch.zeros_like(want)
    out[got["ids"]] = got["out"]
    assert got["out"].dtype == dtype
    torch.testing.assert_close(out, want.detach())
    scale = float(xr.grad.abs().max())
    assert scale > 0.1
    torch.testing.assert_close(x_grad.float(), xr.grad.float(), rtol=0, atol=2e-2 * scale)
    torch.testing.assert_close(got["w_grad"].float(), layer.lin.weight.grad.float(), rtol=0,
                               atol=2e-2 * float(layer.lin.weight.grad.abs().max()))
