"""DGL's and PyG's partitions converted to sarc's format: same graph, same parts, same data.

DGL tests (``pytest.mark.dgl``) run ``dgl.distributed.partition_graph`` in the
DGL environment. PyG tests run the real ``torch_geometric.distributed.Partitioner``
in either environment; its METIS call (``ClusterData._metis``, which needs
pyg-lib or torch-sparse, installed in neither) is replaced by sarc's METIS or
random assignment, so everything PyG writes to disk is PyG's own code.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys

import pytest
import torch

from sarc.errors import PartitionError
from sarc.partition import (graph_fingerprint, load_partitions, metis_partition,
                            random_partition, read_dgl_partitions, read_pyg_partitions,
                            write_foreign)
from sarc.cli.partition import add_partition_parser
from sarc.partition.foreign import load_torch_file

from dgl_support import require_dgl
from partition_graphs import cora  # noqa: F401  (a fixture)
from test_partition_sharded import check_shards


def random_graph(n=300, e=1600, seed=0):
    """Duplicate edges, self loops and 20 isolated nodes; node and edge data of several dtypes."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 20, (e,), generator=g)
    dst = torch.randint(0, n - 20, (e,), generator=g)
    node_data = {"feat": torch.randn(n, 8, generator=g),
                 "label": torch.randint(0, 5, (n,), generator=g),
                 "train_mask": torch.rand(n, generator=g) < 0.3,
                 "val_mask": torch.rand(n, generator=g) < 0.2,
                 "test_mask": torch.rand(n, generator=g) < 0.2}
    edge_data = {"norm": torch.rand(e, 2, generator=g),
                 "etype": torch.randint(0, 3, (e,), generator=g)}
    return src, dst, n, node_data, edge_data


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="sarc")
    add_partition_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["partition", *argv])
    return args.func(args)


def check_converted(pset, graph, part_of):
    """``pset`` is ``graph`` (fingerprint, edges, data, degrees, exchanges) cut as ``part_of``."""
    src, dst, n, nd, ed = graph
    load_partitions(pset.path, fingerprint=graph_fingerprint(src, dst, n))
    shards = check_shards(pset, src, dst, n, nd, ed)
    for p, s in enumerate(shards):
        assert bool((part_of[s.orig_node_ids] == p).all())
    assert sum(s.num_local for s in shards) == n
    return shards


# --- DGL ----------------------------------------------------------------------------------

_DGL_RUNS = {}


def dgl_partition(tmp_path_factory, graph_name, graph, num_parts, method):
    """(config, orig_nids, orig_eids) of DGL's partition of ``graph``, made once per module run."""
    key = (graph_name, num_parts, method)
    if key not in _DGL_RUNS:
        dgl = require_dgl()
        src, dst, n, nd, ed = graph
        g = dgl.graph((src, dst), num_nodes=n)
        for k, v in nd.items():
            g.ndata[k] = v
        for k, v in ed.items():
            g.edata[k] = v
        out = tmp_path_factory.mktemp(f"dgl-{graph_name}-{num_parts}-{method}")
        dgl.seed(0)
        nids, eids = dgl.distributed.partition_graph(g, graph_name, num_parts, str(out),
                                                     part_method=method, return_mapping=True)
        _DGL_RUNS[key] = (out / f"{graph_name}.json", nids, eids)
    return _DGL_RUNS[key]


def dgl_part_of(config, nids):
    """DGL's assignment: part p owns the shuffled ids of node_map[p], orig_nids maps them back."""
    ranges = json.loads(config.read_text())["node_map"]["_N"]
    part_of = torch.empty(nids.numel(), dtype=torch.int64)
    for p, (lo, hi) in enumerate(ranges):
        part_of[nids[lo:hi]] = p
    return part_of


@pytest.mark.dgl
@pytest.mark.parametrize("graph_name, num_parts, method", [
    ("cora", 2, "metis"), ("cora", 3, "random"), ("rand", 4, "metis"), ("rand", 3, "random")])
def test_dgl_partition_converts(cora, tmp_path_factory, tmp_path, graph_name, num_parts, method):
    dgl = require_dgl()
    graph = cora if graph_name == "cora" else random_graph()
    config, nids, eids = dgl_partition(tmp_path_factory, graph_name, graph, num_parts, method)
    pset = write_foreign(read_dgl_partitions(config, orig_ids=(nids, eids)), tmp_path / "out")
    assert (pset.num_parts, pset.method) == (num_parts, f"dgl:{method}")
    assert pset.meta["source"]["format"] == "dgl" and pset.meta["source"]["ids"] == "original"
    assert pset.meta["seed"] is None
    shards = check_converted(pset, graph, dgl_part_of(config, nids))
    # sarc's new ids are DGL's shuffled ids: the same ranges, the same rows in the same order
    meta = json.loads(config.read_text())
    assert pset.node_offsets.tolist() == [lo for lo, _ in meta["node_map"]["_N"]] + [graph[2]]
    for p, s in enumerate(shards):
        lo, hi = s.local_range
        assert torch.equal(s.orig_node_ids, nids[lo:hi])
        _, node_feats, edge_feats, *_ = dgl.distributed.load_partition(str(config), p)
        for k, v in s.ndata.items():
            assert torch.equal(v, node_feats[f"_N/{k}"].to(v.dtype))
        elo, ehi = meta["edge_map"]["_N:_E:_N"][p]
        mine = torch.sort(torch.cat(s.orig_edge_ids)).values
        assert torch.equal(mine, torch.sort(eids[elo:ehi]).values)
    # bool masks come back bool (DGL stores them as uint8)
    assert pset.meta["node_data"]["train_mask"]["dtype"] == "bool"
    assert pset.stats.counts["train_mask"] == [int(s.ndata["train_mask"].sum()) for s in shards]


@pytest.mark.dgl
def test_dgl_orig_ids_beside_the_config_and_cli(cora, tmp_path_factory, tmp_path, capsys):
    require_dgl()
    config, nids, eids = dgl_partition(tmp_path_factory, "cora", cora, 3, "random")
    part = tmp_path / "dgl"
    shutil.copytree(config.parent, part)
    with pytest.raises(PartitionError, match="does not store the original node and edge ids"):
        read_dgl_partitions(part / config.name)
    torch.save(nids, part / "orig_nids.pt")
    torch.save(eids, part / "orig_eids.pt")
    assert run_cli(["--from-dgl", str(part / config.name), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "3 parts (dgl:random)" in text and "edge cut: " in text
    assert "node data: feat, label, test_mask, train_mask, val_mask; edge data: etype, norm" in text
    check_converted(load_partitions(tmp_path / "out"), cora, dgl_part_of(config, nids))
    # the ids as .npy files on the command line, the directory instead of the .json
    import numpy as np
    np.save(tmp_path / "n.npy", nids.numpy())
    np.save(tmp_path / "e.npy", eids.numpy())
    assert run_cli(["--from-dgl", str(part), "--dgl-orig-ids", str(tmp_path / "n.npy"),
                    str(tmp_path / "e.npy"), "--out", str(tmp_path / "out"), "--overwrite"]) == 0
    check_converted(load_partitions(tmp_path / "out"), cora, dgl_part_of(config, nids))


@pytest.mark.dgl
def test_dgl_shuffled_ids_and_one_part(tmp_path_factory, tmp_path):
    require_dgl()
    graph = random_graph()
    src, dst, n, nd, ed = graph
    config, nids, eids = dgl_partition(tmp_path_factory, "rand", graph, 4, "metis")
    pset = write_foreign(read_dgl_partitions(config, shuffled_ids=True), tmp_path / "shuffled")
    assert pset.meta["source"]["ids"] == "dgl-shuffled"
    # the graph in DGL's ids: shuffled edge i is original edge eids[i], node v original nids[v]
    new_of = torch.empty(n, dtype=torch.int64)
    new_of[nids] = torch.arange(n)
    shuffled = (new_of[src[eids]], new_of[dst[eids]], n, {k: v[nids] for k, v in nd.items()},
                {k: v[eids] for k, v in ed.items()})
    ranges = json.loads(config.read_text())["node_map"]["_N"]
    part_of = torch.cat([torch.full((hi - lo,), p) for p, (lo, hi) in enumerate(ranges)])
    check_converted(pset, shuffled, part_of)
    # one part is never shuffled: no ids needed
    one = dgl_partition(tmp_path_factory, "rand", graph, 1, "random")[0]
    check_converted(write_foreign(read_dgl_partitions(one), tmp_path / "one"), graph,
                    torch.zeros(n, dtype=torch.int64))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def _edge_out_of_range(config):
    """Part 0's graph file with its first edge's destination overwritten by an id past its
    nodes (DGL loads the file unchecked: its COO arrays are stored as they are)."""
    import dgl
    graph = config.parent / "part0" / "graph.dgl"
    raw = graph.read_bytes()
    dst = dgl.load_graphs(str(graph))[0][0].edges(order="eid")[1].numpy().tobytes()
    at = raw.find(dst)
    assert at > 0
    graph.write_bytes(raw[:at] + (1 << 40).to_bytes(8, "little") + raw[at + 8:])


def _heterogeneous(config):
    meta = json.loads(config.read_text())
    meta["ntypes"] = {"user": 0, "item": 1}
    config.write_text(json.dumps(meta))


@pytest.mark.dgl
@pytest.mark.parametrize("damage, message", [
    (lambda c: c.unlink(), "no DGL partition config"),
    (lambda c: c.write_text("{"), "corrupt DGL partition config"),
    (lambda c: c.write_text(json.dumps({"num_parts": 3})), "lacks 'num_nodes'"),
    (lambda c: (c.parent / "part1" / "graph.dgl").unlink(),
     r"part1/graph\.dgl: the part's graph file is missing"),
    (lambda c: _truncate(c.parent / "part2" / "graph.dgl"), r"part2/graph\.dgl: cannot be read"),
    (_edge_out_of_range, r"part0/graph\.dgl: an edge's endpoints are outside its 0\.\."),
    (lambda c: _truncate(c.parent / "part0" / "node_feat.dgl"),
     r"part0/node_feat\.dgl: truncated or corrupt DGL tensor file"),
    (lambda c: (c.parent / "part1" / "edge_feat.dgl").unlink(), r"edge_feat\.dgl: .* missing"),
    (_heterogeneous, "node_map has no entry for type 'user'"),
])
def test_dgl_damage_is_named(cora, tmp_path_factory, tmp_path, damage, message):
    require_dgl()
    config, nids, eids = dgl_partition(tmp_path_factory, "cora", cora, 3, "random")
    part = tmp_path / "dgl"
    shutil.copytree(config.parent, part)
    damage(part / config.name)
    with pytest.raises(PartitionError, match=message):
        read_dgl_partitions(part / config.name, orig_ids=(nids, eids))
    assert not (tmp_path / "out").exists()


@pytest.mark.dgl
def test_dgl_tensor_files_read_as_dgl_reads_them(tmp_path):
    require_dgl()
    from dgl.data.utils import load_tensors, save_tensors
    from sarc.partition.dgl_format import read_dgl_tensors
    tensors = {"i8": torch.arange(-3, 3, dtype=torch.int8),
               "i16": torch.arange(4, dtype=torch.int16),
               "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
               "i64": torch.arange(24).reshape(2, 3, 4),
               "u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
               "f16": torch.randn(3, dtype=torch.float16), "f32": torch.randn(5, 2),
               "f64": torch.randn(2, dtype=torch.float64), "empty": torch.zeros(0, 7),
               "_N/mask": torch.tensor([True, False, True])}
    f = tmp_path / "t.dgl"
    save_tensors(str(f), tensors)
    want, got = load_tensors(str(f)), read_dgl_tensors(f)
    assert set(got) == set(want)  # DGL returns them in its own map order
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])
    save_tensors(str(f), {})
    assert read_dgl_tensors(f) == load_tensors(str(f)) == {}
    # every truncation is an error (DGL's own loader returns partial data or crashes)
    save_tensors(str(f), {"a": torch.arange(3), "b": torch.ones(2, 2)})
    data = f.read_bytes()
    for cut in range(len(data)):
        f.write_bytes(data[:cut])
        with pytest.raises(PartitionError, match="DGL tensor file"):
            read_dgl_tensors(f)
    f.write_bytes(data + b"\0")
    with pytest.raises(PartitionError, match="1 bytes after its last tensor"):
        read_dgl_tensors(f)


def test_dgl_reader_without_dgl_says_so(tmp_path, monkeypatch):
    from sarc.partition.foreign import MissingDependencyError
    config = tmp_path / "g.json"
    config.write_text(json.dumps({"num_parts": 1, "num_nodes": 3, "num_edges": 0,
                                  "node_map": {"_N": [[0, 3]]},
                                  "edge_map": {"_N:_E:_N": [[0, 0]]}}))
    monkeypatch.setitem(sys.modules, "dgl", None)  # import dgl raises ImportError
    with pytest.raises(MissingDependencyError, match="reading DGL partitions needs DGL"):
        read_dgl_partitions(config)


@pytest.mark.dgl
def test_dgl_wrong_mapping_is_refused(cora, tmp_path_factory):
    require_dgl()
    config, nids, eids = dgl_partition(tmp_path_factory, "cora", cora, 3, "random")
    with pytest.raises(PartitionError, match="orig_nids has 2707 ids"):
        read_dgl_partitions(config, orig_ids=(nids[:-1], eids))
    bad = nids.clone()
    bad[0] = bad[1]
    with pytest.raises(PartitionError, match="every node exactly once"):
        read_dgl_partitions(config, orig_ids=(bad, eids))
    with pytest.raises(ValueError, match="contradict"):
        read_dgl_partitions(config, orig_ids=(nids, eids), shuffled_ids=True)


# --- PyG ----------------------------------------------------------------------------------

ASSIGN = {"metis": metis_partition, "random": random_partition}


def pyg_partition(monkeypatch, graph, num_parts, method, root, *, times=False):
    """Run PyG's Partitioner on ``graph`` into ``root``, with sarc's node assignment."""
    pytest.importorskip("torch_geometric.distributed")
    from torch_geometric.data import Data
    from torch_geometric.distributed import Partitioner
    from torch_geometric.loader import ClusterData

    src, dst, n, nd, ed = graph
    data = Data(x=nd["feat"], edge_index=torch.stack([src, dst]), edge_attr=edge_attr(ed),
                num_nodes=n)
    if times:
        data.time = torch.arange(n) * 10
        data.edge_time = torch.randint(0, 100, (src.numel(),))

    def assign(self, edge_index, num_nodes):
        return ASSIGN[method](edge_index[0], edge_index[1], num_nodes, self.num_parts)

    monkeypatch.setattr(ClusterData, "_metis", assign)
    Partitioner(data, num_parts, str(root)).generate_partition()
    return data


def edge_attr(edge_data):
    """PyG's edge_attr is 2-d."""
    return edge_data["norm"].reshape(edge_data["norm"].shape[0], -1)


def pyg_dataset_layout(graph, parent, name, num_parts):
    """Labels and splits beside ``NAME-partitions`` as PyG's distributed example writes them."""
    _, _, n, nd, _ = graph
    (parent / f"{name}-label").mkdir()
    torch.save(nd["label"], parent / f"{name}-label" / "label.pt")
    for split in ("train", "val", "test"):
        ids = torch.nonzero(nd[f"{split}_mask"]).flatten()
        d = parent / f"{name}-{split}-partitions"
        d.mkdir()
        for i, chunk in enumerate(ids.split(max(1, ids.numel() // num_parts))):
            torch.save(chunk, d / f"partition{i}.pt")


@pytest.mark.parametrize("graph_name, num_parts, method", [
    ("cora", 2, "metis"), ("cora", 4, "random"), ("rand", 3, "metis")])
def test_pyg_partition_converts(cora, monkeypatch, tmp_path, graph_name, num_parts, method):
    graph = cora if graph_name == "cora" else random_graph()
    src, dst, n, nd, ed = graph
    root = tmp_path / f"{graph_name}-partitions"
    pyg_partition(monkeypatch, graph, num_parts, method, root)
    pyg_dataset_layout(graph, tmp_path, graph_name, num_parts)
    pset = write_foreign(read_pyg_partitions(root), tmp_path / "out")
    assert (pset.num_parts, pset.method) == (num_parts, "pyg:metis")
    assert pset.meta["source"]["format"] == "pyg"
    assert pset.meta["source"]["extras"] == ["label", "test_mask", "train_mask", "val_mask"]
    node_map = torch.load(root / "node_map.pt")
    node_data = {"feat": nd["feat"], "label": nd["label"],
                 **{k: nd[k] for k in ("train_mask", "val_mask", "test_mask")}}
    shards = check_converted(pset, (src, dst, n, node_data, {"edge_attr": edge_attr(ed)}), node_map)
    for p, s in enumerate(shards):  # relabeled as sarc does: original order within a part
        assert torch.equal(s.orig_node_ids, torch.nonzero(node_map == p).flatten())
    assert pset.stats.counts["train_mask"] == [int(s.ndata["train_mask"].sum()) for s in shards]


def test_pyg_times_no_extras_and_cli(monkeypatch, tmp_path, capsys):
    graph = random_graph()
    src, dst, n, nd, ed = graph
    root = tmp_path / "rand-partitions"
    data = pyg_partition(monkeypatch, graph, 3, "random", root, times=True)
    pyg_dataset_layout(graph, tmp_path, "rand", 3)
    assert run_cli(["--from-pyg", str(root), "--no-pyg-extras", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "3 parts (pyg:metis)" in text
    assert "node data: feat, time; edge data: edge_attr, edge_time" in text
    check_converted(load_partitions(tmp_path / "out"),
                    (src, dst, n, {"feat": nd["feat"], "time": data.time},
                     {"edge_attr": edge_attr(ed), "edge_time": data.edge_time}),
                    torch.load(root / "node_map.pt"))
    assert run_cli(["--from-pyg", str(root), "--out", str(tmp_path / "out"), "--overwrite"]) == 0
    assert "label, train_mask, val_mask, test_mask" in capsys.readouterr().out


def pyg_by_hand(root, parts):
    """PyG's documented on-disk layout, written by hand: ``parts`` is [(nodes, edge ids)]."""
    src = torch.tensor([0, 1, 2, 3, 4, 5, 1, 3])
    dst = torch.tensor([1, 2, 3, 4, 5, 0, 0, 0])
    n, e = 6, 8
    node_map = torch.empty(n, dtype=torch.int64)
    edge_map = torch.empty(e, dtype=torch.int64)
    root.mkdir()
    for p, (nodes, eids) in enumerate(parts):
        nodes, eids = torch.tensor(nodes), torch.tensor(eids, dtype=torch.int64)
        node_map[nodes], edge_map[eids] = p, p
        (root / f"part_{p}").mkdir()
        torch.save({"edge_id": eids, "row": src[eids], "col": dst[eids], "size": (n, n)},
                   root / f"part_{p}" / "graph.pt")
        torch.save({"global_id": nodes, "feats": {"x": nodes.float()[:, None]}},
                   root / f"part_{p}" / "node_feats.pt")
        torch.save({}, root / f"part_{p}" / "edge_feats.pt")
    torch.save(node_map, root / "node_map.pt")
    torch.save(edge_map, root / "edge_map.pt")
    (root / "META.json").write_text(json.dumps(
        {"num_parts": len(parts), "node_types": None, "edge_types": None, "node_offset": None,
         "is_hetero": False, "is_sorted": True}))
    return src, dst, n


GOOD = [([0, 2, 4], [1, 3, 5, 6, 7]), ([1, 3, 5], [0, 2, 4])]  # edges go with their destination


def test_pyg_by_hand(tmp_path):
    src, dst, n = pyg_by_hand(tmp_path / "p", GOOD)
    pset = write_foreign(read_pyg_partitions(tmp_path / "p"), tmp_path / "out")
    part_of = torch.tensor([0, 1, 0, 1, 0, 1])
    check_converted(pset, (src, dst, n, {"feat": torch.arange(6.0)[:, None]}, {}), part_of)


def test_pyg_extras_and_given_node_data(tmp_path):
    root = tmp_path / "g-partitions"
    src, dst, n = pyg_by_hand(root, GOOD)
    got = read_pyg_partitions(root, node_data={"label": torch.arange(6)})
    assert torch.equal(got.node_data["label"], torch.arange(6))
    with pytest.raises(PartitionError, match="'feat' is both in the partition and given"):
        read_pyg_partitions(root, node_data={"feat": torch.zeros(6)})
    (tmp_path / "g-label").mkdir()
    torch.save(torch.zeros(8), tmp_path / "g-label" / "label.pt")  # edge-level labels
    with pytest.raises(PartitionError, match=r"label\.pt .*'label' must have 6 rows, got \[8\]"):
        read_pyg_partitions(root)
    assert "label" not in read_pyg_partitions(root, dataset_extras=False).node_data
    torch.save(torch.arange(6), tmp_path / "g-label" / "label.pt")
    (tmp_path / "g-test-partitions").mkdir()
    torch.save(torch.tensor([5, 1]), tmp_path / "g-test-partitions" / "partition0.pt")
    torch.save(torch.tensor([2]), tmp_path / "g-test-partitions" / "partition1.pt")
    got = read_pyg_partitions(root)
    assert torch.equal(got.node_data["test_mask"], torch.tensor([0, 1, 1, 0, 0, 1]).bool())
    assert sorted(got.node_data) == ["feat", "label", "test_mask"]


class NotATensor:
    pass


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "META.json").unlink(), "META.json is missing"),
    (lambda r: (r / "META.json").write_text("{"), "corrupt PyG metadata"),
    (lambda r: (r / "META.json").write_text(json.dumps({"num_parts": 2, "is_hetero": True,
                                                        "node_types": ["a", "b"]})),
     "PyG's metadata lacks 'edge_types'"),
    (lambda r: shutil.rmtree(r / "part_1"), r"part_1: part 1's directory is missing"),
    (lambda r: (r / "node_map.pt").write_bytes(b"not a torch file"),
     r"node_map\.pt: PyG's node map cannot be read"),
    (lambda r: torch.save(torch.tensor([0, 1, 0, 1, 0, 2]), r / "node_map.pt"), "part ids outside"),
    (lambda r: torch.save({"global_id": torch.tensor([1, 3, 5]), "feats": {"x": NotATensor()}},
                          r / "part_1" / "node_feats.pt"), "NotATensor is not allowed"),
    (lambda r: torch.save({"edge_id": torch.tensor([0, 2]), "row": torch.tensor([0, 2]),
                           "col": torch.tensor([1, 3])}, r / "part_1" / "graph.pt"),
     "every edge exactly once"),
])
def test_pyg_damage_is_named(tmp_path, damage, message):
    pyg_by_hand(tmp_path / "p", GOOD)
    damage(tmp_path / "p")
    with pytest.raises(PartitionError, match=message):
        read_pyg_partitions(tmp_path / "p")


def test_pyg_edges_with_the_wrong_part_are_refused(tmp_path):
    pyg_by_hand(tmp_path / "p", GOOD)
    edge_map = torch.load(tmp_path / "p" / "edge_map.pt")
    edge_map[2] = 0  # says part 0, but part 1's graph.pt holds it
    torch.save(edge_map, tmp_path / "p" / "edge_map.pt")
    with pytest.raises(PartitionError, match="holds edges edge_map.pt gives other parts"):
        read_pyg_partitions(tmp_path / "p")


def test_restricted_load_reads_plain_containers_only(tmp_path):
    from collections import defaultdict
    f = tmp_path / "feats.pt"
    torch.save(defaultdict(None, {"global_id": torch.arange(3)}), f)  # as PyG writes edge_feats.pt
    assert torch.equal(load_torch_file(f, "x")["global_id"], torch.arange(3))
    torch.save({"x": argparse.Namespace(a=1)}, f)
    with pytest.raises(PartitionError, match="argparse.Namespace is not allowed"):
        load_torch_file(f, "x")



def _with_pickle(path, pkl):
    """A torch.save zip archive at ``path`` whose object pickle is ``pkl``."""
    import io
    import zipfile
    buf = io.BytesIO()
    torch.save({}, buf)
    with zipfile.ZipFile(buf) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            zout.writestr(item, pkl if item.filename.endswith("/data.pkl") else data)


def test_restricted_load_changes_no_class_and_runs_nothing(tmp_path):
    import collections
    import pickle
    import struct

    def text(s):
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def build_on_class(module, name, attr, value_pickle):  # BUILD(cls, (None, {attr: value}))
        return (f"c{module}\n{name}\n".encode() + b"N}" + text(attr) + value_pickle
                + b"s\x86b0")

    f = tmp_path / "node_map.pt"
    _with_pickle(f, b"\x80\x02" + build_on_class("collections", "Counter", "most_common",
                                                  b"cbuiltins\nset\n") + b"}.")
    # (torch 2.2's allowlist lacks Counter: refused before its BUILD)
    with pytest.raises(PartitionError, match="not allowed in a partition file"):
        load_torch_file(f, "x")
    assert collections.Counter("aab").most_common() == [("a", 2), ("b", 1)]
    _with_pickle(f, b"\x80\x02" + build_on_class("torch.storage", "UntypedStorage", "pwned",
                                                  text("yes")) + b"}.")
    with pytest.raises(PartitionError, match="BUILD on the class torch.storage.UntypedStorage"
                                             "|UntypedStorage is not allowed"):
        load_torch_file(f, "x")
    assert not hasattr(torch.storage.UntypedStorage, "pwned")
    # filling a global instead of a fresh object: SETITEM on an allowlisted singleton
    _with_pickle(f, b"\x80\x02ctorch\nfloat32\n" + text("k") + text("v") + b"s.")
    with pytest.raises(PartitionError, match="SETITEM on a torch.dtype|does not support item"):
        load_torch_file(f, "x")

    class RunsCode:
        def __reduce__(self):
            return (open, (str(tmp_path / "ran"), "w"))  # creates the file

    f.write_bytes(pickle.dumps(RunsCode(), protocol=2))  # not a zip: torch's legacy format
    with pytest.raises(PartitionError, match="cannot be read"):
        load_torch_file(f, "x")
    assert not (tmp_path / "ran").exists()

def test_cli_options_that_do_not_apply(tmp_path):
    from sarc.cli import UsageError
    pyg_by_hand(tmp_path / "p", GOOD)
    out = str(tmp_path / "out")
    with pytest.raises(UsageError, match="--method do not apply"):
        run_cli(["--from-pyg", str(tmp_path / "p"), "--method", "random", "--out", out])
    with pytest.raises(UsageError, match="--parts 3, but"):
        run_cli(["--from-pyg", str(tmp_path / "p"), "--parts", "3", "--out", out])
    with pytest.raises(UsageError, match="only apply with --from-dgl"):
        run_cli(["--from-pyg", str(tmp_path / "p"), "--dgl-shuffled-ids", "--out", out])
    with pytest.raises(UsageError, match="--parts is required"):
        run_cli(["--dataset", "cora", "--out", out])
    with pytest.raises(PartitionError, match="not a directory"):
        run_cli(["--from-pyg", str(tmp_path / "nothing"), "--out", out])
    assert not (tmp_path / "out").exists()
    assert run_cli(["--from-pyg", str(tmp_path / "p"), "--parts", "2", "--out", out]) == 0
