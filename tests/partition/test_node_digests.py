"""A partition set records digests of the node data it was cut with (features, labels,
splits, in the original order), and ``sarc train --partition DIR --dataset X`` refuses an X
with the set's graph but other node data; a set without them keeps the graph-only check."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sarc.datasets import load_dataset
from sarc.distributed.graph import DistError
from sarc.distributed.launch import checked_dataset
from sarc.partition import load_partitions, partition_graph
from sarc.partition.fingerprint import dataset_digests, node_data_digests


def small_arrays(seed: int = 0, n: int = 12) -> dict:
    """A small node-classification dataset in ``load_dataset``'s .npz layout: a ring."""
    rng = np.random.default_rng(seed)
    src = np.arange(n, dtype=np.int64)
    return {"edge_src": src, "edge_dst": (src + 1) % n,
            "feat": rng.random((n, 4), dtype=np.float32),
            "label": rng.integers(0, 3, n).astype(np.int64),
            "train_mask": np.arange(n) % 3 == 0, "val_mask": np.arange(n) % 3 == 1,
            "test_mask": np.arange(n) % 3 == 2, "num_nodes": np.int64(n),
            "num_classes": np.int64(3)}


def write_npz(path, arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


def node_data(data) -> dict:
    return {"feat": data.feat, "label": data.label, "train_mask": data.train_mask,
            "val_mask": data.val_mask, "test_mask": data.test_mask}


def partitioned(tmp_path, arrays, *, with_node_data: bool = True):
    """``arrays`` partitioned as ``sarc partition --dataset`` cuts them: node data with the
    node types, edge data."""
    data = load_dataset(write_npz(tmp_path / "a.npz", arrays))
    nodes = node_data(data)
    if data.ntype is not None:
        nodes["ntype"] = data.ntype
    return partition_graph(data.edge_src, data.edge_dst, data.num_nodes, 2, tmp_path / "parts",
                           method="random", node_data=nodes if with_node_data else None,
                           edge_data=data.edge_data if with_node_data else None,
                           dataset=data.name, sizes=data.sizes)


def check(tmp_path, pset, arrays, name: str = "b") -> str | None:
    path = write_npz(tmp_path / f"{name}.npz", arrays)
    args = SimpleNamespace(dataset=path, partition=str(pset.path), data_dir=None,
                           check_data=True)
    return checked_dataset(args, pset)


def test_recorded_digests_are_those_of_the_dataset_in_its_order(tmp_path):
    arrays = small_arrays()
    pset = partitioned(tmp_path, arrays)
    digests = load_partitions(pset.path).node_digests
    assert set(digests) == {"feat", "label", "train_mask", "val_mask", "test_mask", "ntype",
                            "edge data"}
    assert digests == dataset_digests(load_dataset(str(tmp_path / "a.npz")))
    assert digests["ntype"] == "none" and digests["edge data"] == ""
    assert json.loads((pset.path / "metadata.json").read_text())["node_digests"] == digests


def test_digests_see_values_and_shapes_not_the_stored_dtype():
    base = node_data_digests({"feat": torch.ones(3, 2), "val_mask": torch.zeros(3, dtype=torch.bool),
                              "label": torch.arange(3)})
    # the dtype a dataset file stores them in is not what the data is
    assert node_data_digests({"feat": torch.ones(3, 2, dtype=torch.float64),
                              "val_mask": torch.zeros(3, dtype=torch.uint8),
                              "label": torch.arange(3, dtype=torch.int32)}) == base
    assert node_data_digests({"feat": torch.ones(2, 3)})["feat"] != base["feat"]
    assert node_data_digests({"feat": torch.ones(6)})["feat"] != base["feat"]
    assert node_data_digests({"val_mask": torch.ones(3, dtype=torch.bool)})["val_mask"] \
        != base["val_mask"]
    # each key its own: the same values as another key's are not that key's digest
    same = node_data_digests({"train_mask": torch.zeros(3, dtype=torch.bool)})
    assert same["train_mask"] != base["val_mask"]
    # a featureless graph (F = 0) has a digest; keys= picks
    assert set(node_data_digests({"feat": torch.zeros(3, 0), "label": torch.arange(3)},
                                 keys={"feat"})) == {"feat"}


def test_the_same_data_under_another_name_passes(tmp_path):
    arrays = small_arrays()
    pset = partitioned(tmp_path, arrays)
    assert check(tmp_path, pset, arrays) == "a"  # the name the set was partitioned under


@pytest.mark.parametrize("change,named,unnamed", [
    (lambda a: a.update(feat=a["feat"] + 1), ["its features differ"], ["labels", "splits"]),
    (lambda a: a.update(label=(a["label"] + 1) % 3), ["its labels differ"],
     ["features", "splits"]),
    (lambda a: a.update(val_mask=np.zeros_like(a["val_mask"])), ["its splits (val) differ"],
     ["features", "labels"]),
    (lambda a: a.update(train_mask=a["test_mask"], test_mask=a["train_mask"],
                        label=np.zeros_like(a["label"])),
     ["its labels, splits (train, test) differ"], ["features"]),
])
def test_same_edges_other_node_data_is_refused(tmp_path, change, named, unnamed):
    pset = partitioned(tmp_path, small_arrays())
    other = small_arrays()
    change(other)
    with pytest.raises(DistError) as e:
        check(tmp_path, pset, other)
    msg = str(e.value)
    for needle in (*named, "--dataset", "b.npz", "has the graph partitioned in --partition",
                   "(from a)", "leave --dataset out, or partition b"):
        assert needle in msg, (needle, msg)
    for kind in unnamed:
        assert kind not in msg.split("other data:")[1].split("differ")[0], msg


def typed_arrays() -> dict:
    """``small_arrays`` with node types, edge types and an edge weight."""
    a = small_arrays()
    n = len(a["label"])
    a.update(ntype=np.arange(n) % 2, num_ntypes=np.int64(2), etype=np.arange(n) % 3,
             num_etypes=np.int64(3), edge_weight=np.linspace(0.1, 1, n).astype(np.float32))
    return a


@pytest.mark.parametrize("change,named", [
    (lambda a: a.update(etype=a["etype"][::-1].copy()), "its edge data (etype) differ"),
    (lambda a: a.update(edge_weight=a["edge_weight"] * 2), "its edge data (edge_weight) differ"),
    (lambda a: a.pop("edge_weight"), "its edge data (edge_weight) differ"),
    (lambda a: a.update(edge_score=a["edge_weight"]), "its edge data (edge_score) differ"),
    (lambda a: a.update(ntype=1 - a["ntype"]), "its node types differ"),
])
def test_same_edges_other_edge_data_or_node_types_is_refused(tmp_path, change, named):
    """The workers train on the set's edge types, edge weights (``--prob``, a layer's edge
    feature) and node types: a dataset with others is not the set's."""
    pset = partitioned(tmp_path, typed_arrays())
    assert {"ntype", "edge:etype", "edge:edge_weight"} <= set(pset.node_digests)
    assert check(tmp_path, pset, typed_arrays()) == "a"
    other = typed_arrays()
    change(other)
    with pytest.raises(DistError, match=named.replace("(", "\\(").replace(")", "\\)")):
        check(tmp_path, pset, other)


def test_a_set_without_the_record_keeps_the_graph_check(tmp_path):
    """A set of an older sarc, or a conversion: the edges alone are compared."""
    pset = partitioned(tmp_path, small_arrays(), with_node_data=False)
    assert pset.node_digests == {}
    other = small_arrays()
    other["feat"] = other["feat"] + 1
    assert check(tmp_path, pset, other) == "a"
    # an older set: its metadata without node_digests reads as before
    pset = load_partitions(pset.path)
    meta = json.loads((pset.path / "metadata.json").read_text())
    assert "node_digests" not in meta


def test_a_corrupt_digest_record_is_refused(tmp_path):
    from sarc.errors import PartitionError
    pset = partitioned(tmp_path, small_arrays())
    meta_file = pset.path / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["node_digests"]["feat"] = 7
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="node_digests.feat"):
        load_partitions(pset.path)
