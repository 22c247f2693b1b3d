"""A DistGraph's memory budget is the step's: after ``dg.share_memory(model)`` the layers'
programs keep, summed, no more than the budget on every worker (a layer planned alone
would take it all), and the step is the unbudgeted step (which rows are kept changes
the traffic, not the result). Without ``share_memory`` a layer gets what the layers
called before it left (which cannot reserve what later layers keep of their own shard:
the trainer shares), with the same result."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .harness import spawn

P = 3


def _problem():
    from gat import build_model
    gen = torch.Generator().manual_seed(4)
    n = 90
    src, dst = torch.randint(0, n, (600,), generator=gen), torch.randint(0, n, (600,), generator=gen)
    x = torch.randn(n, 12, generator=gen)
    torch.manual_seed(1)
    model = build_model(12, 7, hidden=8, heads=2)
    return src, dst, n, x, model.state_dict()


def _worker(rank, port, q, parts, budget_kind):
    from gat import build_model

    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.planner.plan import plan_layer
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=P, timeout=datetime.timedelta(seconds=60))
    _, _, _, _, state = _problem()
    model = build_model(12, 7, hidden=8, heads=2)
    model.load_state_dict(state)
    model.eval()
    shard = ShardedGraph.from_partitions(load_partitions(parts, verify=False), rank)
    dg = DistGraph(shard)
    budget = None
    if budget_kind != "none":
        from sarc.compiler import compile_layer
        from sarc.dsl import Layer
        layers = [m for m in model.modules() if isinstance(m, Layer)]
        sar = [plan_layer("x", compile_layer(l, through="optimize").optimized, workers=P,
                          stats=dg.stats, exec_mode="sar", inputs_need_grad=k > 0)
               for k, l in enumerate(layers)]
        floor = max(sum(lp.bytes_kept[r] for lp in sar) for r in range(P))
        row = max(lp.exchange.row_bytes for lp in sar)
        smallest = min(b for row_ in dg.stats.boundary for b in row_ if b > 0)
        budget = floor + smallest * row  # room for a little of the remote rows, not all
        dg.mem_budget = budget
        if budget_kind == "shared":
            dg.share_memory(model)
    x = shard.ndata["feat"]
    logits = model(dg, x)
    loss = F.cross_entropy(logits, shard.ndata["label"], reduction="sum")
    loss.backward()
    kept = [sum(p.plan.bytes_kept[r] for p in dg.training_programs.values()) for r in range(P)]
    modes = [p.plan.exec_mode for p in dg.training_programs.values()]
    q.put((rank, {"logits": logits.detach().tolist(), "kept": kept, "budget": budget,
                  "modes": modes,
                  "grads": {k: p.grad.tolist() for k, p in model.named_parameters()}}))
    dist.barrier()


def _run(tmp_path, kind):
    from sarc.partition import partition_graph
    src, dst, n, x, _ = _problem()
    label = torch.arange(n) % 7
    parts = partition_graph(src, dst, n, P, tmp_path / kind, method="random",
                            node_data={"feat": x, "label": label}).path
    codes, reports = spawn(_worker, P, (str(parts), kind), timeout_s=120)
    assert codes == [0] * P, reports
    return reports


def test_shared_budget_fits_the_step_and_changes_no_result(tmp_path):
    free = _run(tmp_path, "none")
    for kind in ("shared", "first_come"):
        got = _run(tmp_path, kind)
        budget = got[0]["budget"]
        for rank in range(P):
            if kind == "shared":
                assert max(got[rank]["kept"]) <= budget, (got[rank]["kept"], budget)
            assert torch.allclose(torch.tensor(got[rank]["logits"]),
                                  torch.tensor(free[rank]["logits"]), rtol=1e-5, atol=1e-6)
            for k, g in free[rank]["grads"].items():
                assert torch.allclose(torch.tensor(got[rank]["grads"][k]), torch.tensor(g),
                                      rtol=1e-4, atol=1e-6), k
        assert {m for r in got for m in r["modes"]} & {"hybrid", "oneshot"}, kind
