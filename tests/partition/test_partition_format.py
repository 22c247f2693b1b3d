"""The partition format: round trip, integrity checks, atomic and refusing writes."""
from __future__ import annotations

import json

import pytest
import torch

from sarc.errors import PartitionError
from sarc.partition import graph_fingerprint, load_partitions, partition_graph
from sarc import atomic
from sarc.atomic import DirectoryExistsError

from partition_graphs import cora  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def cora_set(cora, tmp_path_factory):
    src, dst, n, nd, ed = cora
    out = tmp_path_factory.mktemp("sets") / "cora4"
    return partition_graph(src, dst, n, 4, out, node_data=nd, edge_data=ed, seed=3)


def copy_set(pset, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    for f in pset.path.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def test_round_trip_keeps_every_node_and_edge_with_its_data(cora, cora_set):
    src, dst, n, nd, ed = cora
    pset = load_partitions(cora_set.path, fingerprint=graph_fingerprint(src, dst, n))
    assert (pset.num_parts, pset.num_nodes, pset.num_edges) == (4, n, src.numel())
    assert pset.method == "metis" and pset.meta["seed"] == 3
    assert pset.meta["node_data"]["feat"] == {"dtype": "float32", "shape": [1433]}
    parts = [pset.load_part(p) for p in range(4)]
    offsets = pset.node_offsets
    assert offsets[0] == 0 and offsets[-1] == n
    orig_nodes = torch.cat([p.orig_node_ids for p in parts])
    assert torch.equal(torch.sort(orig_nodes).values, torch.arange(n))
    new_of = torch.empty(n, dtype=torch.int64)
    new_of[orig_nodes] = torch.arange(n)
    for p, part in enumerate(parts):
        assert (part.lo, part.hi) == (int(offsets[p]), int(offsets[p + 1]))
        for k, v in nd.items():
            assert torch.equal(part.ndata[k], v[part.orig_node_ids])
        # edges: those into owned nodes, in new ids, sorted by destination
        assert bool(((part.edge_dst >= part.lo) & (part.edge_dst < part.hi)).all())
        assert bool((part.edge_dst[1:] >= part.edge_dst[:-1]).all())
        e = part.orig_edge_ids
        assert torch.equal(part.edge_src, new_of[src[e]])
        assert torch.equal(part.edge_dst, new_of[dst[e]])
        for k, v in ed.items():
            assert torch.equal(part.edata[k], v[e])
        assert torch.equal(part.in_degree(), torch.bincount(dst, minlength=n)[part.orig_node_ids])
        assert torch.equal(part.out_degree, torch.bincount(src, minlength=n)[part.orig_node_ids])
    assert torch.equal(torch.sort(torch.cat([p.orig_edge_ids for p in parts])).values,
                       torch.arange(src.numel()))
    stats = pset.stats
    assert stats.counts["nodes"] == [p.num_nodes for p in parts]
    assert stats.counts["edges"] == [p.num_edges for p in parts]
    assert stats.counts["halo"] == [p.halo_nodes.numel() for p in parts]
    part_of = torch.searchsorted(offsets, new_of, right=True) - 1
    assert stats.edge_cut == int((part_of[src] != part_of[dst]).sum())


def test_fingerprint_of_another_graph_is_refused(cora, cora_set):
    src, dst, n, _, _ = cora
    other = dst.clone()
    other[0] = (other[0] + 1) % n
    with pytest.raises(PartitionError, match="another graph"):
        load_partitions(cora_set.path, fingerprint=graph_fingerprint(src, other, n))
    with pytest.raises(PartitionError, match="another graph"):
        cora_set.check_graph(src, dst, n + 1)
    cora_set.check_graph(src, dst, n)


def test_corrupt_part_file_is_named(cora_set, tmp_path):
    out = copy_set(cora_set, tmp_path)
    f = out / "part-1.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=r"part-1\.pt: partition file is corrupt"):
        load_partitions(out)
    pset = load_partitions(out, verify=False)  # a worker that reads one part ...
    pset.load_part(0)
    with pytest.raises(PartitionError, match=r"part-1\.pt: partition file is corrupt"):
        pset.load_part(1)                      # ... still never reads a corrupt one


def test_missing_part_file_is_named(cora_set, tmp_path):
    out = copy_set(cora_set, tmp_path)
    (out / "part-2.pt").unlink()
    with pytest.raises(PartitionError, match=r"part-2\.pt is missing"):
        load_partitions(out, verify=False)


@pytest.mark.parametrize("damage, message", [
    (lambda meta_file: meta_file.unlink(), "metadata.json is missing"),
    (lambda meta_file: meta_file.write_text('{"format": "sarc-part'), "corrupt metadata"),
    (lambda meta_file: meta_file.write_text(
        meta_file.read_text().replace('"version": 1', '"version": 99')), "version 99"),
    (lambda meta_file: meta_file.write_text(json.dumps(
        {**json.loads(meta_file.read_text()), "num_parts": 3})), "num_parts=3"),
])
def test_bad_metadata_is_refused(cora_set, tmp_path, damage, message):
    out = copy_set(cora_set, tmp_path)
    damage(out / "metadata.json")
    with pytest.raises(PartitionError, match=message):
        load_partitions(out)



@pytest.mark.parametrize("change, message", [
    (lambda m: m["parts"][0].pop("sha256"), r"lacks parts\[0\]\.sha256"),
    (lambda m: m["parts"][1].pop("nodes"), r"lacks parts\[1\]\.nodes"),
    (lambda m: m["parts"][0].update(sha256=None), r"parts\[0\]\.sha256 must be a sha256"),
    (lambda m: m["parts"][2].update(file=7), r"parts\[2\]\.file must be a string, got 7"),
    (lambda m: m["parts"][0].update(file="part-1.pt"), r"bad part file name 'part-1\.pt'"),
    (lambda m: m["parts"][0].update(nodes=[0, 1]), r"parts\[0\]\.nodes is \[0, 1\], node_off"),
    (lambda m: m.update(parts=[1, 2, 3, 4]), r"parts\[0\] must be an object, got 1"),
    (lambda m: m.update(node_offsets=5), "node_offsets must be a list of non-negative int"),
    (lambda m: m.update(graph=[]), r"graph must be an object, got \[\]"),
    (lambda m: m["graph"].update(num_nodes="2708"), "graph.num_nodes must be a non-negative"),
    (lambda m: m.update(stats={}), "lacks stats.num_edges"),
    (lambda m: m["stats"]["counts"].pop("nodes"), "lacks stats.counts.nodes"),
    (lambda m: m["stats"]["counts"].update(halo=[1, 2]), "stats.counts.halo has 2 counts for 4"),
    (lambda m: m.update(num_parts=0), "num_parts must be a positive integer, got 0"),
    (lambda m: m.update(num_parts=True), "num_parts must be a positive integer, got True"),
    (lambda m: m.update(types=[]), "types must be an object"),
    (lambda m: m.update(sizes={"num_classes": None}), "sizes.num_classes must be a non-negative"),
])
def test_hand_edited_metadata_names_the_field(cora_set, tmp_path, change, message):
    out = copy_set(cora_set, tmp_path)
    meta = json.loads((out / "metadata.json").read_text())
    change(meta)  # valid JSON, the wrong shape
    (out / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="metadata.json: corrupt metadata.*" + message):
        load_partitions(out)

def test_load_part_range(cora_set):
    with pytest.raises(PartitionError, match="no part 4"):
        cora_set.load_part(4)


def small_graph():
    src = torch.tensor([0, 1, 2, 3, 4, 5, 1, 3])
    dst = torch.tensor([1, 2, 3, 4, 5, 0, 0, 0])
    return src, dst, 6, {"label": torch.arange(6)}


def fail_on_second_save(monkeypatch, exc):
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise exc
        return real_save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, exc):
    src, dst, n, nd = small_graph()
    out = tmp_path / "parts"
    fail_on_second_save(monkeypatch, exc)
    with pytest.raises(type(exc)):
        partition_graph(src, dst, n, 3, out, method="random", node_data=nd)
    assert list(tmp_path.iterdir()) == []  # no partition set, no temporary directory
    with pytest.raises(PartitionError, match="no partition set"):
        load_partitions(out)


def test_interrupted_overwrite_keeps_the_old_set(tmp_path, monkeypatch):
    src, dst, n, nd = small_graph()
    out = tmp_path / "parts"
    old = partition_graph(src, dst, n, 2, out, method="random", node_data=nd)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    fail_on_second_save(monkeypatch, OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        partition_graph(src, dst, n, 3, out, method="metis", node_data=nd, overwrite=True)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["parts"]
    assert load_partitions(out).meta == old.meta


def test_existing_directory_is_not_overwritten_unless_asked(tmp_path):
    src, dst, n, nd = small_graph()
    out = tmp_path / "parts"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DirectoryExistsError, match="not empty"):
        partition_graph(src, dst, n, 2, out, node_data=nd)
    assert [f.name for f in out.iterdir()] == ["notes.txt"]
    # only a set sarc wrote is replaced: the user's folder stays, even with overwrite
    with pytest.raises(DirectoryExistsError, match="not a set sarc wrote"):
        partition_graph(src, dst, n, 2, out, node_data=nd, overwrite=True)
    assert [f.name for f in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    partition_graph(src, dst, n, 2, out, node_data=nd)
    with pytest.raises(DirectoryExistsError, match="--overwrite"):
        partition_graph(src, dst, n, 3, out, node_data=nd)
    partition_graph(src, dst, n, 3, out, node_data=nd, overwrite=True)
    assert load_partitions(out).num_parts == 3
    assert [p.name for p in tmp_path.iterdir()] == ["parts"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_overwrite_replaces_the_set(tmp_path, monkeypatch, exchange):
    real_exchange, exchanged = atomic._exchange, []

    def spy(a, b):
        exchanged.append(exchange and real_exchange(a, b))
        return exchanged[-1]
    monkeypatch.setattr(atomic, "_exchange", spy)
    src, dst, n, nd = small_graph()
    out = tmp_path / "parts"
    partition_graph(src, dst, n, 2, out, method="random", node_data=nd)
    partition_graph(src, dst, n, 3, out, method="metis", node_data=nd, overwrite=True)
    if exchange and exchanged != [True]:
        pytest.skip("this file system has no renameat2 exchange; the rename-aside case ran")
    pset = load_partitions(out, fingerprint=graph_fingerprint(src, dst, n))
    assert (pset.num_parts, pset.method) == (3, "metis")
    assert sorted(f.name for f in out.iterdir()) == ["metadata.json", "part-0.pt", "part-1.pt",
                                                     "part-2.pt", "sarc-set.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["parts"]


def test_empty_directory_is_used_and_a_file_is_refused(tmp_path):
    src, dst, n, nd = small_graph()
    (tmp_path / "empty").mkdir()
    partition_graph(src, dst, n, 2, tmp_path / "empty", node_data=nd)
    assert load_partitions(tmp_path / "empty").num_parts == 2
    (tmp_path / "file").write_text("x")
    with pytest.raises(DirectoryExistsError, match="not a directory"):
        partition_graph(src, dst, n, 2, tmp_path / "file", node_data=nd, overwrite=True)
