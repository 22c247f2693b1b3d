"""sarc.datasets: the embedded benchmarks and the synthetic generators."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sarc.datasets import (DatasetError, add_self_loops, load_dataset, power_law_graph,
                           same_dataset, sbm_graph)

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"


def test_cora_shapes_and_split():
    d = load_dataset("cora")
    assert (d.name, d.num_nodes, d.num_edges, d.num_features, d.num_classes) == (
        "cora", 2708, 10556, 1433, 7)
    assert d.feat.shape == (2708, 1433) and d.feat.dtype == torch.float32
    assert d.edge_src.dtype == d.edge_dst.dtype == d.label.dtype == torch.int64
    assert [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)] == [140, 500, 1000]
    assert not (d.train_mask & d.val_mask).any() and not (d.val_mask & d.test_mask).any()
    assert d.etype is None and d.num_etypes == 0
    # undirected: every edge stored in both directions, no self loops
    n = d.num_nodes
    fwd = set((d.edge_src * n + d.edge_dst).tolist())
    assert fwd == set((d.edge_dst * n + d.edge_src).tolist())
    assert not (d.edge_src == d.edge_dst).any()
    assert torch.bincount(d.label).tolist() == [351, 217, 418, 818, 426, 298, 180]


def test_aifb_is_relational_and_featureless():
    d = load_dataset("aifb")
    assert (d.num_nodes, d.num_edges, d.num_classes, d.num_etypes) == (8285, 58086, 4, 90)
    assert d.etype.shape == (58086,) and int(d.etype.max()) == 89
    assert not d.has_features and d.feat.shape == (8285, 0)
    assert [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)] == [140, 0, 36]
    assert (d.label[d.train_mask | d.test_mask] >= 0).all()


@pytest.mark.parametrize("given", (None, 5))
@pytest.mark.parametrize("ntype", (False, True))
def test_edge_types_are_kept_with_and_without_node_types(given, ntype):
    from sarc.datasets import Dataset
    arrays = {"edge_src": [0, 1, 2], "edge_dst": [1, 2, 0], "etype": [0, 2, 1],
              "label": [0, 1, 1], "train_mask": [1, 1, 0], "val_mask": [0, 0, 1],
              "test_mask": [0, 0, 0]}
    if given is not None:
        arrays["num_etypes"] = given
    if ntype:
        arrays["ntype"] = [0, 1, 1]
    d = Dataset.from_arrays(arrays)
    assert d.num_etypes == (given or 3) and d.etype.tolist() == [0, 2, 1]
    assert d.num_ntypes == (2 if ntype else 0)


def test_unknown_dataset_names_the_places_looked(tmp_path):
    with pytest.raises(DatasetError, match="citeseer.*embedded datasets: cora, aifb"):
        load_dataset("citeseer", root=tmp_path)


@pytest.mark.skipif(not (SHARED / "citeseer.npz").is_file(), reason="shared datasets absent")
def test_citeseer_and_pubmed_from_a_directory():
    c = load_dataset("citeseer", root=SHARED)
    assert (c.num_nodes, c.num_classes, int(c.train_mask.sum())) == (3327, 6, 120)
    p = load_dataset("pubmed", root=SHARED)  # pubmed_nofeat.npz: structure only
    assert (p.num_nodes, p.num_edges, p.has_features) == (19717, 88648, False)


def test_load_by_file_path():
    path = Path(__file__).resolve().parents[2] / "sarc" / "data" / "cora.npz"
    assert load_dataset(str(path)).num_nodes == 2708


def _cora_arrays():
    from sarc.datasets import read_npz
    return read_npz(Path(__file__).resolve().parents[2] / "sarc" / "data" / "cora.npz")


def test_a_file_with_another_suffix_or_a_directory(tmp_path):
    """An existing file is read whatever its suffix (its path as given, not lower-cased);
    a directory is said to be one."""
    import numpy as np
    path = tmp_path / "Base.NPZ"
    with open(path, "wb") as f:
        np.savez(f, **_cora_arrays())
    data = load_dataset(str(path))
    assert data.num_nodes == 2708 and data.file == str(path.resolve())
    with pytest.raises(DatasetError, match="is a directory, not a dataset .npz file"):
        load_dataset(str(tmp_path))


def test_a_files_other_edge_arrays_are_edge_data(tmp_path):
    """``edge_*`` arrays besides the edge list are edge data, as a graph file's
    (``sarc partition --graph``); one of the wrong length or kind is refused by name."""
    import numpy as np
    arrays = _cora_arrays()
    e = len(arrays["edge_src"])
    w = np.random.default_rng(0).random(e).astype(np.float32)
    np.savez(tmp_path / "w.npz", **arrays, edge_weight=w)
    data = load_dataset(str(tmp_path / "w.npz"))
    assert list(data.edge_data) == ["edge_weight"]
    assert torch.equal(data.edge_data["edge_weight"], torch.from_numpy(w))
    np.savez(tmp_path / "bad.npz", **arrays, edge_weight=w[:-1])
    with pytest.raises(DatasetError, match=rf"edge array 'edge_weight' has {e - 1} rows, the "
                                           rf"graph has {e} edges"):
        load_dataset(str(tmp_path / "bad.npz"))
    # float64 weights are float32, as the features; PyG's edge_index and names are not data
    np.savez(tmp_path / "more.npz", **arrays, edge_weight=w.astype(np.float64),
             edge_index=np.stack([arrays["edge_src"], arrays["edge_dst"]]),
             edge_names=np.array(["a"] * e))
    data = load_dataset(str(tmp_path / "more.npz"))
    assert list(data.edge_data) == ["edge_weight"]
    assert data.edge_data["edge_weight"].dtype == torch.float32


def test_a_partition_sets_dataset_and_the_one_a_run_is_given(tmp_path):
    """What a worker records of ``--dataset`` beside a set that records a dataset: the
    set's own (a name, or a file's path) where they are the same, the file's path where
    an older set recorded only its name, None where they differ."""
    f = tmp_path / "mine.npz"
    f.write_bytes(b"")
    assert same_dataset("cora", "cora") == "cora"
    assert same_dataset(str(f), str(f)) == str(f)
    assert same_dataset(str(f), str(tmp_path / "." / "mine.npz")) == str(f)
    assert same_dataset("mine", str(f)) == str(f)                # an older set: the name
    assert same_dataset("mine", "elsewhere/mine.npz") == "mine"  # no such file here
    assert same_dataset("cora", str(f)) is None
    assert same_dataset(str(f), "mine") is None
    assert same_dataset(str(tmp_path / "other.npz"), str(f)) is None


def test_add_self_loops_replaces_existing_loops():
    src, dst = add_self_loops(torch.tensor([0, 1, 1]), torch.tensor([1, 1, 0]), 3)
    pairs = sorted(zip(src.tolist(), dst.tolist()))
    assert pairs == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 2)]


def _pairs(d):
    return d.edge_src * d.num_nodes + d.edge_dst


@pytest.mark.parametrize("n,e", [(100, 400), (5000, 100_000)])
def test_power_law_exact_size_simple_symmetric(n, e):
    d = power_law_graph(n, e, num_features=8, num_classes=3, seed=1)
    assert (d.num_nodes, d.num_edges, d.feat.shape, d.num_classes) == (n, e, (n, 8), 3)
    keys = _pairs(d)
    assert keys.unique().numel() == e  # no duplicates
    assert not (d.edge_src == d.edge_dst).any()
    assert torch.equal(keys.sort().values, (d.edge_dst * n + d.edge_src).sort().values)
    assert int(d.label.max()) < 3 and (d.train_mask & d.test_mask).sum() == 0


def test_power_law_is_heavy_tailed():
    d = power_law_graph(20_000, 200_000, seed=0)
    deg = torch.bincount(d.edge_dst, minlength=d.num_nodes).float()
    assert deg.max() > 20 * deg.mean()  # hubs
    assert deg.median() < deg.mean()


def test_power_law_deterministic_given_seed():
    a, b = power_law_graph(3000, 30_000, num_features=4, seed=7), power_law_graph(
        3000, 30_000, num_features=4, seed=7)
    c = power_law_graph(3000, 30_000, num_features=4, seed=8)
    assert torch.equal(a.edge_src, b.edge_src) and torch.equal(a.edge_dst, b.edge_dst)
    assert torch.equal(a.feat, b.feat) and torch.equal(a.train_mask, b.train_mask)
    assert not torch.equal(_pairs(a).sort().values, _pairs(c).sort().values)


@pytest.mark.slow
def test_power_law_large_is_quick():
    import time
    t = time.perf_counter()
    d = power_law_graph(500_000, 10_000_000, seed=0)
    assert d.num_edges == 10_000_000
    assert time.perf_counter() - t < 30


def test_sbm_sizes_labels_homophily_and_determinism():
    d = sbm_graph([300, 200, 100], p_in=0.05, p_out=0.002, num_features=16, seed=3)
    assert d.num_nodes == 600 and d.num_classes == 3
    assert torch.bincount(d.label).tolist() == [300, 200, 100]
    expected = 0.05 * (300 * 299 + 200 * 199 + 100 * 99) / 2 + 0.002 * (300 * 200 + 300 * 100 + 200 * 100)
    assert abs(d.num_edges / 2 - expected) < 0.1 * expected
    same = (d.label[d.edge_src] == d.label[d.edge_dst]).float().mean()
    assert same > 0.8
    assert not (d.edge_src == d.edge_dst).any()
    assert _pairs(d).unique().numel() == d.num_edges
    e = sbm_graph([300, 200, 100], p_in=0.05, p_out=0.002, num_features=16, seed=3)
    assert torch.equal(d.edge_src, e.edge_src) and torch.equal(d.feat, e.feat)


@pytest.mark.parametrize("bad", [dict(block_sizes=[0, 5]), dict(p_in=1.5)])
def test_sbm_rejects_bad_arguments(bad):
    args = dict(block_sizes=[5, 5], p_in=0.1, p_out=0.01) | bad
    with pytest.raises(ValueError):
        sbm_graph(**args)
