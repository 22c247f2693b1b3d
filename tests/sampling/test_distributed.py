"""The sampler, the loader and the row fetch on P = 1, 2, 3 gloo workers.

Each P runs once (one group of forked workers) and records what every worker built;
the tests compare the records across P, with the single process, with the whole
graph, and run sarc layers on the blocks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sarc.graph import Graph
from sarc.sampling import Comm, NeighbourSampler, SamplingSpec, SeedLoader, fetch_rows

from .graphs import run_workers, shards, tiny_graph
from .stats import chi2, chi2_critical

PARTS = (1, 2, 3)
SPECS = {
    "mfg": SamplingSpec.mfg(2),
    "sampled": SamplingSpec.of([2, 3], seed=4),
    "weighted": SamplingSpec.of([2, 2], replace=True, prob="w", seed=4),
    "mfg3": SamplingSpec.mfg(3),
}
SEEDS = [0, 4, 5, 9, 13, 21, 26, 28]   # original ids; 28 has no edges
EPOCHS = 200                            # draws for the distribution test
FANOUT = 2
FETCH = [3, 3, 0, 27, 14, 8, 3]


def _layer_record(block) -> dict:
    sh = block.shard
    edges = []
    for j, b in enumerate(sh.blocks):
        srcs = block.src_nodes if j == sh.rank else block.remote_src_nodes[j]
        eids = sh.orig_edge_ids[j].index_select(0, b.perm)
        edges.append(torch.stack([srcs[b.src], block.dst_nodes[b.dst], eids], 1))
    return {"rank": sh.rank, "src_nodes": block.src_nodes, "num_dst": block.num_dst,
            "offsets": sh.node_offsets,
            "needed": sh.needed_rows, "send": sh.send_rows, "remote": block.remote_src_nodes,
            "edges": torch.cat(edges), "orig": sh.orig_node_ids, "in_degree": sh.in_degree,
            "out_degree": sh.out_degree, "block_out_degree": [b.out_degree for b in sh.blocks],
            "sampled_in_degree": block.sampled_in_degree, "feat": sh.ndata["feat"],
            "edata_w": [(sh.orig_edge_ids[j], e["w"]) for j, e in enumerate(sh.edata)]}


def _exchanged_rows(block) -> list:
    """A pass of the distributed runtime's row exchange over the block: (peer, the global ids
    of the rows received, the rows) per remote piece."""
    from sarc.distributed import DistGraph
    from sarc.distributed.exchange import RowFetch
    sh = block.shard
    dg = DistGraph(sh, None, chunk_rows=2)
    peers = {j for j in range(sh.num_parts) if j != sh.rank}
    got = []
    for piece, rows in RowFetch(dg.exchanger, sh, sh.ndata["feat"], phase="forward", send_to=peers,
                                recv_from=peers, keep=set(), kept={}, pieces=dg.pieces,
                                chunk_rows=dg.chunk_rows):
        if piece.peer != sh.rank:
            got.append((block.remote_src_nodes[piece.peer][piece.lo:piece.hi], rows.clone()))
    return got


def _work(rank, group, g, parts):
    shs, rl = shards(g, parts)
    sh, comm = shs[rank], Comm(group)
    seeds = rl.orig_to_new[torch.tensor(SEEDS)]
    out = {"orig_to_new": rl.orig_to_new, "layers": {}, "exchanged": [], "counts": None}
    for name, spec in SPECS.items():
        sampler = NeighbourSampler(sh, spec, comm)
        mb = sampler.sample(seeds[rank::parts], epoch=3)    # seeds given to any worker
        out["layers"][name] = [_layer_record(b) for b in mb]
        if name == "mfg":
            out["exchanged"] = [_exchanged_rows(b) for b in mb]
    sampler = NeighbourSampler(sh, SamplingSpec.of([FANOUT], seed=9), comm)
    counts = torch.zeros(g.src.numel(), dtype=torch.int64)
    lo, hi = sh.local_range
    for epoch in range(EPOCHS):
        eids = _layer_record(sampler.sample(torch.arange(lo, hi), epoch).blocks[0])["edges"][:, 2]
        counts += torch.bincount(eids, minlength=counts.numel())
    out["counts"] = counts
    loader = SeedLoader(sh, "train_mask", batch_size=3, seed=5, comm=comm)
    out["loader"] = {"nodes": loader.nodes, "steps": len(loader), "lo_hi": (lo, hi),
                     "epochs": [list(loader.epoch(e)) for e in range(2)]}
    before = comm.rows_received.get("rows", 0)
    out["fetch"] = fetch_rows(sh, rl.orig_to_new[torch.tensor(FETCH[rank:])],
                              ["feat", "label", "uid", "train_mask"], comm)
    out["fetched_rows"] = comm.rows_received.get("rows", 0) - before
    out["owned_orig"] = sh.orig_node_ids
    return out


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


@pytest.fixture(scope="module")
def runs(graph, tmp_path_factory):
    return {p: run_workers(_work, p, tmp_path_factory.mktemp(f"p{p}"), graph, p) for p in PARTS}


def _edge_set(records) -> set:
    """Every worker's sampled edges of one layer as (dst, original edge id), original ids."""
    out = set()
    for rec, o2n in records:
        n2o = torch.argsort(o2n)
        for s, d, e in rec["edges"].tolist():
            out.add((int(n2o[d]), e))
    return out


def _layers(runs, p, name):
    return [[(r["layers"][name][k], r["orig_to_new"]) for r in runs[p]]
            for k in range(len(runs[p][0]["layers"][name]))]


@pytest.mark.parametrize("name", list(SPECS))
def test_same_samples_whatever_the_number_of_workers(runs, name):
    one = [_edge_set(layer) for layer in _layers(runs, 1, name)]
    assert all(one)
    for p in PARTS[1:]:
        assert [_edge_set(layer) for layer in _layers(runs, p, name)] == one, p


def test_mfg_is_every_in_edge_of_the_k_hop_frontiers(runs, graph):
    frontier = set(SEEDS)
    for k in (2, 1):
        edges = {(v, e) for v in frontier for e in (graph.dst == v).nonzero().squeeze(1).tolist()}
        for p in PARTS:
            assert _edge_set(_layers(runs, p, "mfg")[k - 1]) == edges
        frontier |= {int(graph.src[e]) for _, e in edges}


@pytest.mark.parametrize("p", PARTS)
def test_blocks_are_shards_whose_rows_fit(runs, p):
    """Worker j's local rows, read at worker r's needed_rows[j], are r's block's sources;
    what r needs from j is what j sends r; the destinations are a prefix of the sources;
    degrees are the whole graph's; sampled_in_degree counts the sample."""
    for name in SPECS:
        for k in range(len(runs[p][0]["layers"][name])):
            recs = [r["layers"][name][k] for r in runs[p]]
            counts = torch.tensor([int(rec["src_nodes"].numel()) for rec in recs])
            for r, rec in enumerate(recs):
                assert torch.equal(rec["offsets"][1:] - rec["offsets"][:-1], counts)
                for j in range(p):
                    if j == r:
                        continue
                    assert torch.equal(recs[j]["src_nodes"][rec["needed"][j]], rec["remote"][j])
                    assert torch.equal(recs[j]["send"][r], rec["needed"][j])
                    assert torch.equal(rec["needed"][j], torch.sort(rec["needed"][j]).values)
            if k + 1 < len(runs[p][0]["layers"][name]):   # layer k's sources = layer k+1's dsts
                up = [r["layers"][name][k + 1] for r in runs[p]]
                for rec, u in zip(recs, up):
                    assert torch.equal(rec["src_nodes"][:rec["num_dst"]], u["src_nodes"])


def test_degrees_are_whole_graph_and_sampled(runs, graph):
    in_deg = torch.bincount(graph.dst, minlength=graph.num_nodes).float()
    out_deg = torch.bincount(graph.src, minlength=graph.num_nodes).float()
    for p in PARTS:
        for r in runs[p]:
            n2o = torch.argsort(r["orig_to_new"])
            for name in SPECS:
                for rec in r["layers"][name]:
                    assert torch.equal(rec["in_degree"], in_deg[rec["orig"]])
                    assert torch.equal(rec["out_degree"], out_deg[rec["orig"]])
                    for j, deg in enumerate(rec["block_out_degree"]):
                        srcs = rec["src_nodes"] if j == rec["rank"] else rec["remote"][j]
                        assert torch.equal(deg, out_deg[n2o[srcs]])
                    dst = rec["edges"][:, 1]
                    got = torch.zeros(rec["num_dst"])
                    index = {int(v): i for i, v in enumerate(rec["src_nodes"][:rec["num_dst"]])}
                    for d in dst.tolist():
                        got[index[d]] += 1
                    assert torch.equal(rec["sampled_in_degree"], got)
                    for eids, w in rec["edata_w"]:
                        assert torch.equal(w, graph.edata["w"][eids])


def test_row_exchange_of_the_runtime_runs_on_the_blocks(runs, graph):
    """The distributed runtime's RowFetch (DistGraph's exchange, messages of 2 rows) moves
    to each worker exactly the features of its blocks' remote sources."""
    moved = 0
    for p in PARTS:
        for r in runs[p]:
            n2o = torch.argsort(r["orig_to_new"])
            for layer in r["exchanged"]:
                for ids, rows in layer:
                    assert torch.equal(rows, graph.ndata["feat"][n2o[ids]])
                    moved += int(ids.numel())
    assert moved > 0


def test_neighbour_distribution_matches_the_single_process_and_the_expected(runs, graph):
    one = runs[1][0]["counts"]
    for p in PARTS[1:]:
        assert torch.equal(sum(r["counts"] for r in runs[p]), one)
    stat, dof = 0.0, 0
    for v in range(graph.num_nodes):
        e = (graph.dst == v).nonzero().squeeze(1)
        if e.numel() > FANOUT:  # each in-edge in the sample with probability FANOUT / deg
            expected = torch.full((e.numel(),), EPOCHS * FANOUT / e.numel(), dtype=torch.float64)
            stat += chi2(one[e], expected)
            dof += e.numel() - 1
        else:
            assert (one[e] == EPOCHS).all()
    assert dof > 50 and stat < chi2_critical(dof)


def test_node_split_is_balanced_and_covers_every_training_node_once(runs, graph):
    train = set(graph.ndata["train_mask"].nonzero().squeeze(1).tolist())
    for p in PARTS:
        loads = [r["loader"] for r in runs[p]]
        n2o = torch.argsort(runs[p][0]["orig_to_new"])
        sizes = [int(x["nodes"].numel()) for x in loads]
        assert max(sizes) - min(sizes) <= 1
        assert len({x["steps"] for x in loads}) == 1
        owned = sum(int(((x["nodes"] >= x["lo_hi"][0]) & (x["nodes"] < x["lo_hi"][1])).sum())
                    for x in loads)
        # only the spill over a part's share moves: worker t keeps its training nodes that
        # fall in run t of the split (runs of n // p or n // p + 1, in id order)
        new = runs[p][0]["orig_to_new"][sorted(train)]
        counts = [int(((new >= x["lo_hi"][0]) & (new < x["lo_hi"][1])).sum()) for x in loads]
        n, first = len(train), [sum(counts[:t]) for t in range(p + 1)]
        run = [t * (n // p) + min(t, n % p) for t in range(p + 1)]
        assert owned == sum(max(0, min(first[t + 1], run[t + 1]) - max(first[t], run[t]))
                            for t in range(p))
        for e in range(2):
            seen = [int(n2o[v]) for x in loads for batch in x["epochs"][e] for v in batch.tolist()]
            assert sorted(seen) == sorted(train)
            assert all(len(x["epochs"][e]) == x["steps"] for x in loads)
            assert all(int(b.numel()) <= 3 for x in loads for b in x["epochs"][e])
        assert [b.tolist() for b in loads[0]["epochs"][0]] != [b.tolist() for b in loads[0]["epochs"][1]]


def test_fetch_gives_each_worker_the_rows_it_asked_for(runs, graph):
    assert sum(r["fetched_rows"] for r in runs[3]) > 0
    for p in PARTS:
        for rank, r in enumerate(runs[p]):
            ids = torch.tensor(FETCH[rank:])
            assert torch.equal(r["fetch"]["feat"], graph.ndata["feat"][ids])
            for name in ("label", "uid", "train_mask"):
                assert torch.equal(r["fetch"][name], graph.ndata[name][ids]), name
            # each row once, and only the rows of other workers cross
            remote = set(FETCH[rank:]) - set(r["owned_orig"].tolist())
            assert r["fetched_rows"] == len(remote)


# --- sarc layers on the blocks ------------------------------------------------------------

def _global_blocks(runs, p, name):
    """Each layer's blocks of every worker as one bipartite Graph over new global ids:
    (graph, its src ids, its dst ids), the destinations first among the sources."""
    out = []
    for k in range(len(runs[p][0]["layers"][name])):
        recs = [r["layers"][name][k] for r in runs[p]]
        dst = torch.cat([rec["src_nodes"][:rec["num_dst"]] for rec in recs])
        src = torch.cat([dst, *[rec["src_nodes"][rec["num_dst"]:] for rec in recs]])
        where = {int(v): i for i, v in enumerate(src.tolist())}
        edges = torch.cat([rec["edges"] for rec in recs])
        s = torch.tensor([where[int(v)] for v in edges[:, 0]], dtype=torch.int64)
        d = torch.tensor([where[int(v)] for v in edges[:, 1]], dtype=torch.int64)
        out_deg = torch.zeros(src.numel())
        for rec in recs:  # whole-graph degrees, as each worker's block holds them
            rows = torch.tensor([where[int(v)] for v in rec["src_nodes"]], dtype=torch.int64)
            out_deg[rows] = rec["out_degree"]
        in_deg = torch.cat([rec["in_degree"][:rec["num_dst"]] for rec in recs])
        out.append((Graph.from_edges(s, d, num_src=src.numel(), num_dst=dst.numel(),
                                     in_degree=in_deg, out_degree=out_deg), src, dst))
    return out


def _model(kind: str):
    import gat
    import gcn
    import sage
    torch.manual_seed(1)
    make = {"sage": lambda i, o: sage.SAGELayer(i, o), "gcn": lambda i, o: gcn.GCNLayer(i, o),
            "gat": lambda i, o: gat.GATLayer(i, o, heads=2, concat=o != 3)}[kind]
    return torch.nn.ModuleList([make(5, 4), make(8 if kind == "gat" else 4, 3)])


def _forward(model, blocks, x, n):
    """The layers over the per-layer blocks (ids: new global); the last layer's output rows."""
    h = x
    for i, (layer, (g, src, dst)) in enumerate(zip(model, blocks)):
        y = layer(g, h.index_select(0, src))
        if i + 1 < len(model):
            y = F.relu(y)
        h = torch.zeros(n, y.shape[1]).index_copy(0, dst, y)
    return y, dst


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("p", PARTS)
def test_layers_on_the_mfg_blocks_equal_the_full_graph_at_the_seeds(runs, graph, kind, p):
    o2n = runs[p][0]["orig_to_new"]
    n = graph.num_nodes
    x = torch.zeros(n, 5).index_copy(0, o2n, graph.ndata["feat"])
    full_g = Graph.from_edges(o2n[graph.src], o2n[graph.dst], n)
    weights = torch.randn(n, 3, generator=torch.Generator().manual_seed(2))
    ref = _model(kind)
    h = F.relu(ref[0](full_g, x))
    full = ref[1](full_g, h)
    seeds = o2n[torch.tensor(SEEDS)]
    (full[seeds] * weights[seeds]).sum().backward()
    model = _model(kind)
    out, dst = _forward(model, _global_blocks(runs, p, "mfg"), x, n)
    assert sorted(dst.tolist()) == sorted(seeds.tolist())
    torch.testing.assert_close(out, full[dst].detach(), rtol=1e-5, atol=1e-6)
    (out * weights[dst]).sum().backward()
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
