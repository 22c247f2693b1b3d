"""A DGL partition trained on in place, and heterogeneous DGL / PyG partitions converted.

In place (``sarc train --partition DIR/NAME.json``): every worker's part is the
part the converted set holds, and two workers train on it exactly as on the
converted set. Heterogeneous partitions become the homogeneous graph with
type ids, and R-GCN on two workers matches one process on that graph built
directly. DGL tests run in the DGL environment; PyG's Partitioner runs in
either (its METIS call replaced by an assignment, as in test_foreign_formats).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from sarc.checkpoint import read_saved
from sarc.errors import PartitionError
from sarc.datasets import Dataset
from sarc.loader import load_model_file
from sarc.partition import (Part, load_partitions, open_partition, read_dgl_partitions,
                            read_pyg_partitions, write_foreign)
from sarc.partition.dgl_in_place import DglPartition
from sarc.partition.foreign import MissingDependencyError
from sarc.train import train

from dgl_support import require_dgl
from test_foreign_formats import random_graph, run_cli
from timeouts import run_or_show_stacks

ROOT = Path(__file__).resolve().parents[2]


def sarc_cli(*argv: str) -> subprocess.CompletedProcess:
    """``sarc ARGV`` as a user runs it (the runs pass ``--timeout 300``: a loaded machine
    must not stop a worker waiting for a slower peer)."""
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", *argv], cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def assert_same_part(a: Part, b: Part) -> None:
    for f in fields(Part):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            assert x.keys() == y.keys(), f.name
            for k in x:
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), (f.name, k)
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), f.name


def dgl_homogeneous(tmp_path, num_parts, *, ids_beside=True):
    dgl = require_dgl()
    src, dst, n, nd, ed = random_graph()
    nd["feat"] = nd["feat"].abs()  # rows that norm_features divides by a sum far from 0
    g = dgl.graph((src, dst), num_nodes=n)
    g.ndata.update(nd)
    g.edata.update(ed)
    out = tmp_path / "dgl"
    dgl.seed(0)
    nids, eids = dgl.distributed.partition_graph(g, "rand", num_parts, str(out),
                                                 part_method="metis", return_mapping=True)
    if ids_beside:
        torch.save(nids, out / "orig_nids.pt")
        torch.save(eids, out / "orig_eids.pt")
    return out / "rand.json"


def hetero_graph(seed=0):
    """Papers (6 features, labeled, split), authors (4 features), institutions (none);
    cites, writes, affiliated_with and their reverses in part."""
    g = torch.Generator().manual_seed(seed)
    num = {"author": 50, "institution": 8, "paper": 70}
    edges = {("author", "writes", "paper"): 160, ("paper", "cites", "paper"): 220,
             ("author", "affiliated_with", "institution"): 50,
             ("paper", "written_by", "author"): 160}
    graph = {k: (torch.randint(0, num[k[0]], (e,), generator=g),
                 torch.randint(0, num[k[2]], (e,), generator=g)) for k, e in edges.items()}
    feats = {"paper": torch.randn(70, 6, generator=g), "author": torch.randn(50, 4, generator=g)}
    label = torch.randint(0, 3, (70,), generator=g)
    masks = {k: torch.rand(70, generator=g) < p
             for k, p in (("train_mask", 0.5), ("val_mask", 0.2), ("test_mask", 0.2))}
    return num, graph, feats, label, masks


def direct_dataset(num, graph, feats, label, masks, ntypes, etypes) -> Dataset:
    """The homogeneous graph with type ids, built directly: nodes by ``ntypes``, edges by
    ``etypes`` (each in that order), features zero-padded, papers labeled."""
    offset, at = {}, 0
    for t in ntypes:
        offset[t], at = at, at + num[t]
    src = torch.cat([graph[k][0] + offset[k[0]] for k in etypes])
    dst = torch.cat([graph[k][1] + offset[k[2]] for k in etypes])
    etype = torch.cat([torch.full((graph[k][0].numel(),), i) for i, k in enumerate(etypes)])
    width = max(f.shape[1] for f in feats.values())
    feat = torch.zeros(at, width)
    full_label = torch.full((at,), -1)
    split = {k: torch.zeros(at, dtype=torch.bool) for k in masks}
    for t in ntypes:
        rows = slice(offset[t], offset[t] + num[t])
        if t in feats:
            feat[rows, :feats[t].shape[1]] = feats[t]
        if t == "paper":
            full_label[rows] = label
            for k in masks:
                split[k][rows] = masks[k]
    return Dataset("direct", at, src, dst, feat, full_label, split["train_mask"],
                   split["val_mask"], split["test_mask"], int(label.max()) + 1, etype=etype,
                   num_etypes=len(etypes))


def rgcn_matches_one_process(tmp_path, converted, dataset):
    out = tmp_path / "two.json"
    sarc_cli("train", "models/rgcn.py", "--partition", str(converted), "--workers", "2",
             "--epochs", "3", "--timeout", "300", "--json", str(out))
    two = json.loads(out.read_text())
    one = train(load_model_file(ROOT / "models/rgcn.py"), dataset, epochs=3, log=None)
    assert abs(two["final_loss"] - one["final_loss"]) <= 1e-4 * one["final_loss"]
    for k in ("train_acc", "val_acc", "test_acc"):
        assert abs(two[k] - one[k]) <= 1e-6, k


# --- joining the types' data -------------------------------------------------------------

def test_merge_typed_pads_fills_and_refuses():
    from sarc.partition.foreign import merge_typed
    rows = {"paper": 2, "author": 3, "venue": 1}
    data, shapes = merge_typed(rows, {
        "paper": {"feat": torch.ones(2, 3), "label": torch.tensor([4, 5], dtype=torch.int32),
                  "train_mask": torch.tensor([True, False]),
                  "flags": torch.tensor([7, 8], dtype=torch.uint8)},
        "author": {"feat": torch.full((3, 1), 2.0, dtype=torch.float64)}}, "node", "here")
    assert torch.equal(data["feat"], torch.tensor([[1., 1, 1], [1, 1, 1], [2, 0, 0], [2, 0, 0],
                                                   [2, 0, 0], [0, 0, 0]], dtype=torch.float64))
    assert torch.equal(data["label"], torch.tensor([4, 5, -1, -1, -1, -1], dtype=torch.int32))
    assert torch.equal(data["train_mask"], torch.tensor([True, False, False, False, False, False]))
    assert torch.equal(data["flags"], torch.tensor([7, 8, 0, 0, 0, 0], dtype=torch.uint8))
    assert shapes == {"feat": {"paper": [3], "author": [1]}, "flags": {"paper": []},
                      "label": {"paper": []}, "train_mask": {"paper": []}}
    for bad, message in (
            ({"paper": {"x": torch.ones(2)}, "author": {"x": torch.ones(3, 2)}},
             r"'x' has per-row shapes \[\] in 'paper', \[2\] in 'author'"),
            ({"paper": {"x": torch.ones(2, 2, 2)}, "author": {"x": torch.ones(3, 2, 3)}},
             "only floating point features of different widths"),
            ({"paper": {"x": torch.ones(2)}, "author": {"x": torch.ones(3, dtype=torch.bool)}},
             "torch.float32 in 'paper', torch.bool in 'author'"),
            ({"paper": {"x": torch.ones(3)}}, "'x' of type 'paper' has 3 rows for 2 nodes"),
            ({"paper": {"x": [1, 2]}}, "'x' of type 'paper' is list")):
        with pytest.raises(PartitionError, match=message):
            merge_typed(rows, bad, "node", "here")


# --- DGL in place -------------------------------------------------------------------------

@pytest.mark.dgl
@pytest.mark.parametrize("ids_beside", [True, False])
def test_dgl_in_place_parts_are_the_converted_parts(tmp_path, ids_beside):
    config = dgl_homogeneous(tmp_path, 3, ids_beside=ids_beside)
    pset = open_partition(config)
    assert isinstance(pset, DglPartition) and pset.num_parts == 3
    graph = read_dgl_partitions(config, **({} if ids_beside else {"shuffled_ids": True}))
    converted = write_foreign(graph, tmp_path / "out")
    assert pset.node_offsets.tolist() == converted.node_offsets.tolist()
    assert pset.meta["source"]["ids"] == ("original" if ids_beside else "dgl-shuffled")
    for p in range(3):
        assert_same_part(pset.load_part(p), converted.load_part(p))
    # the directory names the same partition
    assert open_partition(config.parent).fingerprint == pset.fingerprint


@pytest.mark.dgl
def test_dgl_in_place_trains_as_the_converted_set(tmp_path):
    config = dgl_homogeneous(tmp_path, 2)
    write_foreign(read_dgl_partitions(config), tmp_path / "converted")
    runs = {}
    for name, partition in (("in_place", config), ("converted", tmp_path / "converted")):
        proc = sarc_cli("train", "models/gcn.py", "--partition", str(partition), "--workers",
                        "2", "--epochs", "4", "--set", "dropout=0", "--timeout", "300", "--json",
                        str(tmp_path / f"{name}.json"), "--save", str(tmp_path / f"{name}.pt"))
        runs[name] = (json.loads((tmp_path / f"{name}.json").read_text()),
                      re.findall(r"loss (\d+\.\d+)", proc.stdout),
                      read_saved(tmp_path / f"{name}.pt")["state_dict"])
    (a, losses_a, state_a), (b, losses_b, state_b) = runs["in_place"], runs["converted"]
    assert len(losses_a) == 4 and losses_a == losses_b
    for k in ("final_loss", "train_acc", "val_acc", "test_acc", "best_epoch"):
        assert a[k] == b[k], k
    assert [w["epoch_bytes_sent"] for w in a["per_worker"]] == \
        [w["epoch_bytes_sent"] for w in b["per_worker"]]
    assert state_a.keys() == state_b.keys()
    for k in state_a:  # the same steps: the same gradients, every epoch
        assert torch.equal(state_a[k], state_b[k]), k


def test_dgl_in_place_without_dgl_says_to_convert(tmp_path, monkeypatch):
    config = tmp_path / "g.json"
    config.write_text(json.dumps({"num_parts": 1, "num_nodes": 3, "num_edges": 0,
                                  "node_map": {"_N": [[0, 3]]},
                                  "edge_map": {"_N:_E:_N": [[0, 0]]}}))
    monkeypatch.setitem(sys.modules, "dgl", None)  # import dgl raises ImportError
    with pytest.raises(MissingDependencyError,
                       match=rf"Convert it first: sarc partition --from-dgl {re.escape(str(config))}"):
        open_partition(config)
    # a sarc set is never taken for a DGL partition
    (tmp_path / "set").mkdir()
    with pytest.raises(PartitionError, match="metadata.json is missing"):
        open_partition(tmp_path / "set")


# --- heterogeneous DGL --------------------------------------------------------------------

def dgl_hetero(tmp_path, num_parts=2):
    dgl = require_dgl()
    num, graph, feats, label, masks = hetero_graph()
    g = dgl.heterograph(graph, num_nodes_dict=num)
    for t, f in feats.items():
        g.nodes[t].data["feat"] = f
    g.nodes["paper"].data["label"] = label
    for k, m in masks.items():
        g.nodes["paper"].data[k] = m
    g.edges["cites"].data["weight"] = torch.rand(g.num_edges("cites"))
    out = tmp_path / "dgl"
    dgl.seed(0)
    nids, eids = dgl.distributed.partition_graph(g, "mag", num_parts, str(out),
                                                 part_method="random", return_mapping=True)
    torch.save(nids, out / "orig_nids.pt")
    torch.save(eids, out / "orig_eids.pt")
    return out / "mag.json", g, (num, graph, feats, label, masks)


@pytest.mark.dgl
def test_dgl_heterogeneous_converts_to_the_homogeneous_graph(tmp_path, capsys):
    dgl = require_dgl()
    config, g, parts = dgl_hetero(tmp_path)
    graph = read_dgl_partitions(config)
    hg = dgl.to_homogeneous(g)
    src, dst = hg.edges(order="eid")
    assert torch.equal(graph.src, src) and torch.equal(graph.dst, dst)
    assert torch.equal(graph.node_data["ntype"], hg.ndata["_TYPE"].long())
    assert torch.equal(graph.edge_data["etype"], hg.edata["_TYPE"].long())
    direct = direct_dataset(*parts, g.ntypes, g.canonical_etypes)
    assert torch.equal(graph.node_data["feat"], direct.feat)
    assert torch.equal(graph.node_data["label"], direct.label)
    assert torch.equal(graph.node_data["train_mask"], direct.train_mask)
    cites = g.canonical_etypes.index(("paper", "cites", "paper"))
    weight = graph.edge_data["weight"]
    assert torch.equal(weight[graph.edge_data["etype"] == cites], g.edges["cites"].data["weight"])
    assert bool((weight[graph.edge_data["etype"] != cites] == 0).all())
    pset = write_foreign(graph, tmp_path / "out")
    types = load_partitions(tmp_path / "out").types
    assert types["ntypes"] == g.ntypes and types["num_etypes"] == len(g.canonical_etypes)
    assert types["etypes"] == [":".join(t) for t in g.canonical_etypes]
    assert types["node_data"]["feat"] == {"author": [4], "paper": [6]}
    assert types["node_data"]["label"] == {"paper": []}
    # the command line says what it made of the types
    assert run_cli(["--from-dgl", str(config), "--out", str(tmp_path / "cli")]) == 0
    assert ("node types (3): author, institution, paper; edge types (4): "
            "author:affiliated_with:institution, author:writes:paper, paper:cites:paper, "
            "paper:written_by:author (node data ntype, edge data etype)") in capsys.readouterr().out
    # in place, the same parts
    in_place = open_partition(config)
    assert in_place.types["num_etypes"] == 4
    for p in range(2):
        assert_same_part(in_place.load_part(p), pset.load_part(p))


@pytest.mark.dgl
def test_rgcn_on_a_converted_heterogeneous_dgl_partition(tmp_path):
    config, g, parts = dgl_hetero(tmp_path)
    write_foreign(read_dgl_partitions(config), tmp_path / "out")
    rgcn_matches_one_process(tmp_path, tmp_path / "out",
                             direct_dataset(*parts, g.ntypes, g.canonical_etypes))


# --- heterogeneous PyG --------------------------------------------------------------------

def pyg_hetero(monkeypatch, root, num_parts=2):
    """PyG's Partitioner on a HeteroData (features of one width, as its to_homogeneous
    keeps them), with the labels and splits of papers beside it."""
    pytest.importorskip("torch_geometric.distributed")
    from torch_geometric.data import HeteroData
    from torch_geometric.distributed import Partitioner
    from torch_geometric.loader import ClusterData

    num, graph, feats, label, masks = hetero_graph()
    feats = {"paper": feats["paper"], "author": torch.randn(50, 6),
             "institution": torch.randn(8, 6)}
    data = HeteroData()
    for t in ("paper", "author", "institution"):
        data[t].x = feats[t]
    for k, (s, d) in graph.items():
        data[k].edge_index = torch.stack([s, d])

    def assign(self, edge_index, num_nodes):
        return torch.randperm(num_nodes, generator=torch.Generator().manual_seed(1)) % \
            self.num_parts

    monkeypatch.setattr(ClusterData, "_metis", assign)
    Partitioner(data, num_parts, str(root)).generate_partition()
    name = root.name.removesuffix("-partitions")
    (root.parent / f"{name}-label").mkdir()
    torch.save(label, root.parent / f"{name}-label" / "label.pt")
    for split in ("train", "val", "test"):
        d = root.parent / f"{name}-{split}-partitions"
        d.mkdir()
        torch.save(masks[f"{split}_mask"].nonzero().flatten(), d / "partition0.pt")
    return (num, graph, feats, label, masks), data


def test_pyg_heterogeneous_converts_and_rgcn_trains_on_it(monkeypatch, tmp_path):
    root = tmp_path / "mag-partitions"
    parts, data = pyg_hetero(monkeypatch, root)
    graph = read_pyg_partitions(root)
    homo = data.to_homogeneous()
    assert torch.equal(torch.stack([graph.src, graph.dst]), homo.edge_index)
    assert torch.equal(graph.node_data["ntype"], homo.node_type)
    assert torch.equal(graph.edge_data["etype"], homo.edge_type)
    direct = direct_dataset(*parts, data.node_types, data.edge_types)
    for k in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(graph.node_data[k], getattr(direct, k)), k
    assert graph.source["target_type"] == "paper"
    pset = write_foreign(graph, tmp_path / "out")
    assert pset.types["etypes"] == ["__".join(t) for t in data.edge_types]
    assert pset.types["node_data"]["label"] == {"paper": []}
    rgcn_matches_one_process(tmp_path, tmp_path / "out", direct)
