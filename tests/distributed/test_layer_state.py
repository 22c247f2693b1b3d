"""A layer's distributed program follows what its trace read, as the layer on a ``Graph``
does (``Layer.compiled``): P = 2 workers run the layer, its buffers are changed (values:
the same program), then a number on the layer (a new program); every output equals the
single-process layer's at the same state."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from .harness import spawn

P = 2
N = 40


def _problem():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "dsl"))
    from test_module import Scaled
    gen = torch.Generator().manual_seed(2)
    src, dst = torch.randint(0, N, (160,), generator=gen), torch.randint(0, N, (160,), generator=gen)
    torch.manual_seed(0)
    return src, dst, torch.randn(N, 3, generator=gen), Scaled()


def _changes(layer, k: int) -> None:
    """Change k: 0 nothing, 1 the buffers' values, 2 a number on the layer."""
    if k == 1:
        layer.temp.fill_(4.0)
        layer.mask.mul_(-2.0)
    if k == 2:
        layer.alpha = 3.0


def _worker(rank, port, q, parts, state):
    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=P, timeout=datetime.timedelta(seconds=60))
    *_, layer = _problem()
    layer.load_state_dict(state)
    shard = ShardedGraph.from_partitions(load_partitions(parts, verify=False), rank)
    dg = DistGraph(shard)
    outs, programs = [], []
    for k in range(3):
        _changes(layer, k)
        with torch.no_grad():
            outs.append(layer(dg, shard.ndata["feat"]))
        programs.append(next(iter(dg.programs.values())))  # kept: distinct objects
    q.put((rank, {"ids": shard.orig_node_ids.tolist(), "outs": [o.tolist() for o in outs],
                  "same": [p is programs[0] for p in programs]}))
    dist.barrier()


def test_distributed_program_follows_the_layers_state(tmp_path):
    import sarc
    from sarc.partition import partition_graph
    src, dst, x, layer = _problem()
    parts = partition_graph(src, dst, N, P, tmp_path / "parts", method="random",
                            node_data={"feat": x}).path
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    codes, reports = spawn(_worker, P, (str(parts), state), timeout_s=120)
    assert codes == [0] * P, reports
    g = sarc.Graph.from_edges(src, dst, N)
    for k in range(3):
        _changes(layer, k)
        with torch.no_grad():
            want = layer(g, x)
        for r in reports:
            torch.testing.assert_close(torch.tensor(r["outs"][k]), want[r["ids"]],
                                       rtol=1e-5, atol=1e-6)
    for r in reports:
        assert r["same"] == [True, True, False]  # buffers' values: no new program
