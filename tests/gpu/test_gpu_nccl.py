"""A one-worker distributed training step over NCCL on the GPU, its edge blocks on compiled
Triton kernels, equals the same model's step on a ``Graph``: loss, parameter gradients and
input gradients (tests/backends/triton/test_triton_distributed.py is the gloo / interpreter
version). The worker is a spawned process (CUDA does not survive a fork), so a hung NCCL
call fails this test after ``TIMEOUT_S`` instead of stopping the run."""
from __future__ import annotations

import datetime
import multiprocessing
import socket
import traceback

import pytest
import torch
import torch.nn.functional as F
from gpu_check import CUDA, needs_gpu, on_backend

import sarc
from sarc.partition import partition_graph

pytestmark = [pytest.mark.gpu, needs_gpu]

TIMEOUT_S = 240
CLASSES = 3
PROCESS_GROUP = "nccl"


def _nccl_missing() -> bool:
    import torch.distributed as dist
    return not (dist.is_available() and dist.is_nccl_available())


def _models():
    from distributed.models import MODELS
    return MODELS


def _graph(n: int, e: int, feats: int, seed: int):
    """Random edges among all but the last 3 nodes (no edges there), features with ties."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 3, (e,), generator=gen)
    dst = torch.randint(0, n - 3, (e,), generator=gen)
    x = torch.randint(-2, 3, (n, feats), generator=gen).float()
    x = x + 0.25 * torch.randn(n, feats, generator=gen) * (torch.rand(n, 1, generator=gen) < 0.5)
    label = torch.randint(0, CLASSES, (n,), generator=gen)
    train = torch.rand(n, generator=gen) < 0.7
    return src, dst, x, label, train


GRAPHS = {"tiny": (24, 90, 5, 3), "medium": (5000, 60_000, 16, 4)}
"""name -> (nodes, edges, features, seed)."""


def _step(model, g, x, label, train):
    logits = model(g, x)
    loss = F.cross_entropy(logits[train], label[train], reduction="sum") / int(train.sum())
    loss.backward()
    return loss


def _worker(out_file: str, port: int, part_dir: str, name: str, feats: int, state_file: str,
            group: str, device: str):
    """The step of worker 0 of 1 on ``device``; saves what it computed (on the CPU)."""
    try:
        import torch.distributed as dist

        from sarc.distributed import DistGraph
        from sarc.partition import load_partitions
        from sarc.runtime.sharded import ShardedGraph
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev.index or 0)
        dist.init_process_group(group, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        try:
            shard = ShardedGraph.from_partitions(load_partitions(part_dir, verify=False), 0)
            shard = shard.to(dev)
            model = _model(name, feats)
            model.load_state_dict(torch.load(state_file))
            model.to(dev)
            dg = DistGraph(shard)
            x = shard.ndata["feat"].clone().requires_grad_()
            loss = _step(model, dg, x, shard.ndata["label"], shard.ndata["train_mask"])
            progs = list(dg.programs.values())
            torch.save({"loss": loss.item(), "ids": shard.orig_node_ids.cpu(),
                        "x_grad": x.grad.cpu(),
                        "param_grads": {k: p.grad.cpu() for k, p in model.named_parameters()},
                        "backends": [p.generated.backend for p in progs],
                        "fallbacks": [list(p.generated.fallbacks) for p in progs]}, out_file)
        finally:
            dist.destroy_process_group()
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out_file)


def _model(name: str, feats: int):
    """The model on the Triton backend; with attention dropout in eval mode (dropout off,
    the edge_softmax still unfused: its normalizer pass on the site op's kernels)."""
    model = on_backend(_models()[name](feats, CLASSES), "triton")
    return model.eval() if name == "gat_attn_drop" else model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _close(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()) + 1e-7,
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.skipif(_nccl_missing(), reason="this torch build has no NCCL")
@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
@pytest.mark.parametrize("name", ["gcn", "gat", "gat_attn_drop"])
def test_one_nccl_worker_step_on_triton_equals_the_graph_step(tmp_path, name, graph_name):
    n, e, feats, seed = GRAPHS[graph_name]
    src, dst, x, label, train = _graph(n, e, feats, seed)
    torch.manual_seed(0)
    model = _model(name, feats)
    torch.save(model.state_dict(), tmp_path / "state.pt")
    model.to(CUDA)
    g = sarc.Graph.from_edges(src, dst, n).to(CUDA)
    xr = x.to(CUDA, copy=True).requires_grad_()
    loss = _step(model, g, xr, label.to(CUDA), train.to(CUDA))

    pset = partition_graph(src, dst, n, 1, tmp_path / "parts", method="random",
                           node_data={"feat": x, "label": label, "train_mask": train})
    out_file = tmp_path / "step.pt"
    p = multiprocessing.get_context("spawn").Process(
        target=_worker, args=(str(out_file), _free_port(), str(pset.path), name, feats,
                              str(tmp_path / "state.pt"), PROCESS_GROUP, str(CUDA)))
    p.start()
    p.join(TIMEOUT_S)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"the NCCL worker did not finish in {TIMEOUT_S} s")
    assert out_file.exists(), f"the worker exited ({p.exitcode}) without a result"
    out = torch.load(out_file, weights_only=False)
    assert "error" not in out, out.get("error")

    assert out["backends"] and set(out["backends"]) == {"triton"}
    assert out["fallbacks"] == [[] for _ in out["fallbacks"]]
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-5)
    x_grad = torch.zeros(n, feats)
    x_grad[out["ids"]] = out["x_grad"]
    _close(x_grad, xr.grad.cpu(), "input gradient")
    for k, p_ in model.named_parameters():
        _close(out["param_grads"][k], p_.grad.cpu(), f"gradient of {k}")
