"""A layer that aggregates nothing over edges (its update reads only the destination's own
features: the optimizer drops the unread aggregate) runs node-wise on each worker's rows,
as it runs on one process: no exchange, no split. A training step of a model with such a
layer on P = 2 workers equals the one-process step (loss, output, input and parameter
gradients), in full-batch and MFG steps; ``sarc compile --workers 2`` plans it as local
and writes the other layers' schedules."""
from __future__ import annotations

import datetime
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import sarc

from .harness import spawn

N, E, F_IN, CLASSES = 50, 260, 5, 3
ROOT = Path(__file__).resolve().parents[2]
MODEL = '''
import torch
from torch import nn
import sarc


class SelfOnly(sarc.Layer):
    """Aggregates its in-neighbours, but its update reads only its own features (and its
    in-degree and an edge weight it declares)."""
    def __init__(self, i, o):
        super().__init__(node={"h": i}, edge={"edge_w": ()})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return src.h * edge.edge_w.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.lin(dst.h) / (1 + dst.in_degree.unsqueeze(-1))


class Sum(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.lin(agg.agg + dst.h)


class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.a, self.b = Sum(i, 8), SelfOnly(8, c)

    def forward(self, g, x, edge_w):
        return self.b(g, torch.relu(self.a(g, x)), edge_w)


HPARAMS = {"epochs": 3, "lr": 0.05, "self_loops": False}


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
'''


def _model():
    ns: dict = {"__name__": "node_wise_model"}
    exec(compile(MODEL, "node_wise_model.py", "exec"), ns)
    return ns


def _data():
    gen = torch.Generator().manual_seed(3)
    return {"src": torch.randint(0, N, (E,), generator=gen),
            "dst": torch.randint(0, N, (E,), generator=gen),
            "feat": torch.randn(N, F_IN, generator=gen),
            "w": torch.rand(E, generator=gen) + 0.5,
            "label": torch.randint(0, CLASSES, (N,), generator=gen),
            "train_mask": torch.rand(N, generator=gen) < 0.6}


def _worker(rank, port, q, size, partdir, state, total):
    from sarc.distributed import DistGraph
    from sarc.distributed.train import allreduce_gradients
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=60))
    try:
        shard = ShardedGraph.from_partitions(load_partitions(partdir, verify=False), rank)
        dg = DistGraph(shard, timeout=datetime.timedelta(seconds=60))
        model = _model()["Net"](F_IN, CLASSES)
        model.load_state_dict(state)
        x = shard.ndata["feat"].clone().requires_grad_(True)
        out = model(dg, x, dg.edge_data("w"))
        m = shard.ndata["train_mask"]
        loss = F.cross_entropy(out[m], shard.ndata["label"][m], reduction="sum") / total
        loss.backward()
        allreduce_gradients(model)
        buf = io.BytesIO()
        torch.save({"ids": shard.orig_node_ids, "out": out.detach(), "x_grad": x.grad,
                    "grads": {k: p.grad for k, p in model.named_parameters()},
                    "sent": dg.counter.total_sent, "planned": dg.planned_bytes_sent()}, buf)
        q.put((rank, buf.getvalue()))
    finally:
        dist.destroy_process_group()


def test_a_node_wise_layer_on_workers_equals_one_process(tmp_path):
    from sarc.partition import partition_graph
    data = _data()
    torch.manual_seed(0)
    model = _model()["Net"](F_IN, CLASSES)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = sarc.Graph.from_edges(data["src"], data["dst"], N)
    x = data["feat"].clone().requires_grad_(True)
    out = model(g, x, data["w"])
    m = data["train_mask"]
    loss = F.cross_entropy(out[m], data["label"][m], reduction="sum") / int(m.sum())
    loss.backward()
    partition_graph(data["src"], data["dst"], N, 2, tmp_path / "parts", method="random",
                    node_data={k: data[k] for k in ("feat", "label", "train_mask")},
                    edge_data={"w": data["w"]})
    codes, reports = spawn(_worker, 2, (2, str(tmp_path / "parts"), state, int(m.sum())),
                           timeout_s=120)
    assert codes == [0, 0], codes
    reports = [torch.load(io.BytesIO(r), weights_only=False) for r in reports]
    got_out, got_grad = torch.zeros_like(out), torch.zeros_like(x)
    for r in reports:
        got_out[r["ids"]] = r["out"]
        got_grad[r["ids"]] = r["x_grad"]
    torch.testing.assert_close(got_out, out.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, x.grad, rtol=1e-5, atol=1e-6)
    for k, p in model.named_parameters():
        torch.testing.assert_close(reports[0]["grads"][k], p.grad, rtol=1e-5, atol=1e-6)
    for r in reports:   # the first layer's exchange alone
        assert r["sent"] == r["planned"] > 0


@pytest.mark.once
def test_sarc_train_and_compile_with_a_node_wise_layer(tmp_path):
    """``sarc train --mode mfg --workers 2`` ends at one process's loss; ``sarc compile
    --workers 2 --emit schedule`` writes the aggregating layer's schedule alone."""
    from timeouts import run_or_show_stacks
    model = tmp_path / "node_wise.py"
    model.write_text(MODEL)
    data = _data()
    graph = tmp_path / "g.npz"
    np.savez(graph, edge_src=data["src"].numpy(), edge_dst=data["dst"].numpy(),
             num_nodes=np.int64(N), feat=data["feat"].numpy(), edge_w=data["w"].numpy(),
             label=data["label"].numpy(), train_mask=data["train_mask"].numpy(),
             val_mask=~data["train_mask"].numpy(), test_mask=~data["train_mask"].numpy(),
             num_classes=np.int64(CLASSES))
    losses = []
    for workers in (1, 2):
        out = tmp_path / f"run{workers}.json"
        cmd = [sys.executable, "-m", "sarc.cli", "train", str(model), "--dataset", str(graph),
               "--mode", "mfg", "--batch-size", "10", "--json", str(out)]
        if workers > 1:
            cmd += ["--workers", "2", "--method", "random"]
        proc = run_or_show_stacks(cmd, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses.append(json.loads(out.read_text())["final_loss"])
    assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[0])
    out = tmp_path / "compiled"
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "compile", str(model),
                               "--dataset", str(graph), "--workers", "2", "--emit",
                               "plan,schedule", "--out", str(out)], cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert [lp["exec_mode"] for lp in plan["layers"]] == ["sar", "local"]
    assert sorted(p.name for p in out.glob("*.schedule.py")) == ["a.schedule.py"]
