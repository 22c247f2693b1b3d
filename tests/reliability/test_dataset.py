"""Bad dataset files and arrays: refused with the file and the array named, before any
training, partitioning or launching; 0/1 integer masks read as the masks they are."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from sarc.datasets import Dataset, DatasetError, DatasetWarning, load_dataset
from sarc.loader import load_model_file
from sarc.train import train

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

CORA = ROOT / "sarc" / "data" / "cora.npz"
AIFB = ROOT / "sarc" / "data" / "aifb.npz"
GCN = ROOT / "models" / "gcn.py"


def write_variant(path: Path, base: Path = CORA, **changes) -> Path:
    """``base``'s arrays with ``changes`` (a value of None removes the array), saved at ``path``."""
    with np.load(base) as d:
        arrays = {k: d[k] for k in d.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    np.savez(path, **arrays)
    return path


def cora(key: str) -> np.ndarray:
    with np.load(CORA) as d:
        return d[key]


def train_refused(proc, *needles: str) -> str:
    """``sarc train`` failed with one error line naming ``needles``, before any epoch."""
    err = assert_error(proc, *needles)
    assert not any(line.startswith("epoch") for line in proc.stdout.splitlines()), proc.stdout
    return err


@case("dataset", "`train_mask` holding node ids (int64 index array) instead of a mask", "error")
def test_index_array_as_mask(tmp_path):
    ids = np.flatnonzero(cora("train_mask"))
    bad = write_variant(tmp_path / "ids.npz", train_mask=ids)
    err = train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                        str(bad), "train_mask", "boolean", "2708")
    assert "node ids" in err


@case("dataset", "masks stored as int64 or uint8 0/1 arrays", "exact")
def test_integer_01_masks_are_the_masks(tmp_path):
    ints = write_variant(tmp_path / "ints.npz",
                         train_mask=cora("train_mask").astype(np.int64),
                         val_mask=cora("val_mask").astype(np.uint8),
                         test_mask=cora("test_mask").astype(np.int32))
    results = []
    for data in (CORA, ints):
        out = tmp_path / f"{data.stem}.json"
        proc = run_sarc("train", GCN, "--dataset", data, "--epochs", "3", "--quiet",
                        "--json", out)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(out.read_text()))
    keys = ("train_acc", "val_acc", "test_acc", "final_loss", "best_epoch")
    assert [results[1][k] for k in keys] == [results[0][k] for k in keys]
    d = load_dataset(str(ints))
    for m in ("train_mask", "val_mask", "test_mask"):
        assert getattr(d, m).dtype == torch.bool
        assert torch.equal(getattr(d, m), torch.from_numpy(cora(m)))


@case("dataset", "a float mask (0.0 / 1.0)", "error")
def test_float_mask(tmp_path):
    bad = write_variant(tmp_path / "f.npz", test_mask=cora("test_mask").astype(np.float32))
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "test_mask", "float32", "boolean")


@case("dataset", "a test or validation mask sharing nodes with the train mask", "warning")
@pytest.mark.parametrize("other", ["test_mask", "val_mask"])
def test_masks_sharing_training_nodes(tmp_path, other):
    """Trained on as DGL and PyG do, and said once, naming the file, both masks and the nodes."""
    leaked = cora(other) | cora("train_mask")        # the 140 training nodes in `other` too
    path = write_variant(tmp_path / "leak.npz", **{other: leaked})
    proc = run_sarc("train", GCN, "--dataset", path, "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    said = [l for l in proc.stderr.splitlines() if "warning" in l]
    first = int(np.flatnonzero(cora("train_mask"))[0])
    assert said == [f"sarc train: warning: {path}: {other} and train_mask share 140 nodes (the "
                    f"first is node {first}); their {other[:-5]} accuracy is measured on nodes "
                    f"the model trains on"], proc.stderr
    assert sum(line.startswith("epoch") for line in proc.stdout.splitlines()) == 2


@case("dataset", "a mask holding unlabeled nodes (label -1)", "warning")
@pytest.mark.parametrize("mask", ["train_mask", "test_mask"])
def test_unlabeled_nodes_in_a_mask_are_said_to_be_left_out(tmp_path, mask):
    """The loss and the accuracies are over a split's labeled nodes: a mask's unlabeled
    ones were left out without a word (train accuracy over 139 of the 140 nodes)."""
    label = cora("label").copy()
    nodes = np.flatnonzero(cora(mask))[[3, 7]]
    label[nodes] = -1
    path = write_variant(tmp_path / "unlabeled.npz", label=label)
    proc = run_sarc("train", GCN, "--dataset", path, "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    said = [l for l in proc.stderr.splitlines() if "warning" in l]
    what = "the loss" if mask == "train_mask" else "its test accuracy"
    assert said == [f"sarc train: warning: {path}: {mask} holds 2 unlabeled nodes (label -1; "
                    f"the first is node {nodes[0]}), which {what} leaves out"], proc.stderr
    assert sum(line.startswith("epoch") for line in proc.stdout.splitlines()) == 2


def test_mask_overlap_warned_in_python_and_val_test_overlap_is_not():
    """Only the train mask must be apart: a split that scores its test nodes as validation too
    (aifb has no val split) is the user's to choose."""
    arrays = {"edge_src": [0, 1, 2], "edge_dst": [1, 2, 3], "label": [0, 1, 0, 1],
              "train_mask": [1, 1, 0, 0], "val_mask": [0, 0, 1, 1], "test_mask": [0, 0, 1, 1]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = Dataset.from_arrays(arrays, name="tiny")
    assert torch.equal(d.val_mask, d.test_mask)
    with pytest.warns(DatasetWarning, match=r"dataset 'tiny': test_mask and train_mask share "
                                            r"1 node \(the first is node 1\)"):
        Dataset.from_arrays({**arrays, "test_mask": [0, 1, 1, 1]}, name="tiny")


@case("dataset", "NaN in the node features", "error")
def test_nan_features(tmp_path):
    feat = cora("feat").copy()
    feat[17, 3] = np.nan
    feat[400, 0] = np.nan
    bad = write_variant(tmp_path / "nan.npz", feat=feat)
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "feat", "NaN", "row 17", "2 rows")


@case("dataset", "Inf in the node features, given to `sarc partition`", "error")
def test_inf_features_partition(tmp_path):
    feat = cora("feat").copy()
    feat[2000, 5] = -np.inf
    bad = write_variant(tmp_path / "inf.npz", feat=feat)
    out = tmp_path / "parts"
    assert_error(run_sarc("partition", "--dataset", bad, "--parts", "2", "--out", out),
                 str(bad), "feat", "row 2000")
    assert not out.exists()


@case("dataset", "float64 edge data beyond float32's range, given to `sarc partition`", "error")
def test_edge_data_infinite_as_float32_partition(tmp_path):
    """It was checked before the cast to float32 and written as Inf into the parts."""
    weights = np.ones(len(cora("edge_src")))
    weights[3] = 1e300
    bad = write_variant(tmp_path / "huge.npz", edge_weight=weights)
    out = tmp_path / "parts"
    assert_error(run_sarc("partition", "--dataset", bad, "--parts", "2", "--out", out),
                 str(bad), "edge array 'edge_weight' holds NaN or Inf once read as float32")
    assert not out.exists()


@case("dataset", "a `num_nodes` of 2**62, given to `sarc partition`", "error")
def test_an_absurd_node_count_is_refused(tmp_path):
    """It was a torch traceback from the partitioner's per-node arrays."""
    graph = tmp_path / "huge.npz"
    np.savez(graph, edge_src=np.array([0, 1]), edge_dst=np.array([1, 0]),
             num_nodes=np.int64(2**62))
    out = tmp_path / "parts"
    assert_error(run_sarc("partition", "--graph", graph, "--parts", "2", "--out", out,
                          "--method", "random"),
                 "num_nodes is 4611686018427387904: more than the 1099511627776 nodes")
    assert not out.exists()


@case("dataset", "a `num_classes` of 100,000,000 on Cora (labels 0 .. 6)", "error")
def test_an_absurd_class_count_is_refused(tmp_path):
    """It built the model and its [N, C] outputs until the process was killed for memory
    (exit 137, no message)."""
    bad = write_variant(tmp_path / "classes.npz", num_classes=np.int64(100_000_000))
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "1"), str(bad),
                  "num_classes is 100000000: more than the 1048576 classes (2**20)")
    wide = write_variant(tmp_path / "wide.npz", num_classes=np.int64(50))   # unused classes
    proc = run_sarc("train", GCN, "--dataset", wide, "--epochs", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]


@case("dataset", "a named pipe given as `--dataset`", "error")
def test_a_pipe_as_the_dataset_is_named_so(tmp_path):
    """It was said not to exist."""
    import os
    pipe = tmp_path / "data.npz"
    os.mkfifo(pipe)
    assert_error(run_sarc("train", ROOT / "models" / "gcn.py", "--dataset", pipe,
                          "--epochs", "1"), f"dataset file {pipe} is not a regular file")


def test_no_check_data_skips_the_value_scans(tmp_path):
    feat = cora("feat").copy()
    feat[17, 3] = np.nan
    bad = write_variant(tmp_path / "nan.npz", feat=feat)
    assert torch.isnan(load_dataset(str(bad), check=False).feat[17, 3])
    with pytest.raises(DatasetError, match="row 17"):
        load_dataset(str(bad))


@case("dataset", "a label >= num_classes", "error")
def test_label_out_of_range(tmp_path):
    label = cora("label").copy()
    label[5] = 7
    bad = write_variant(tmp_path / "c.npz", label=label)
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "label", "num_classes = 7", "node 5")


@case("dataset", "a label of 10**9 in a dataset without `num_classes`", "error")
def test_a_label_beyond_the_node_count_without_num_classes(tmp_path):
    """num_classes was taken as 10**9 + 1: the model's output layer failed to allocate
    64 GB, an error said to be the model file's."""
    label = cora("label").copy()
    label[5] = 10**9
    bad = write_variant(tmp_path / "huge.npz", label=label, num_classes=None)
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "label of node 5 is 1000000000", "more classes than the 2708 nodes",
                  "num_classes")


@case("dataset", "a negative label other than -1 (unlabeled)", "error")
def test_negative_label(tmp_path):
    label = cora("label").copy()
    label[9] = -3
    bad = write_variant(tmp_path / "neg.npz", label=label)
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "label", "-3", "-1 = unlabeled")


@case("dataset", "float labels", "error")
def test_float_labels(tmp_path):
    bad = write_variant(tmp_path / "fl.npz", label=cora("label").astype(np.float64))
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "label", "float64", "integer")


@case("dataset", "an array missing from the `.npz` file", "error")
def test_missing_array(tmp_path):
    bad = write_variant(tmp_path / "m.npz", val_mask=None)
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "val_mask", "edge_src", "train_mask")


@case("dataset", "an edge id >= num_nodes, in a distributed run", "error")
def test_edge_out_of_range_distributed(tmp_path):
    src = cora("edge_src").copy()
    src[3] = 2708
    bad = write_variant(tmp_path / "e.npz", edge_src=src)
    proc = run_sarc("train", GCN, "--dataset", bad, "--workers", "2", "--epochs", "2")
    train_refused(proc, str(bad), "edge_src", "2708", "[0, 2708)", "edge 3")
    assert "partitioned" not in proc.stdout


@case("dataset", "an edge type >= num_etypes", "error")
def test_etype_out_of_range(tmp_path):
    with np.load(AIFB) as d:
        etype = d["etype"].copy()
    etype[11] = 90
    bad = write_variant(tmp_path / "et.npz", base=AIFB, etype=etype)
    train_refused(run_sarc("train", ROOT / "models" / "rgcn.py", "--dataset", bad,
                           "--epochs", "2"), str(bad), "etype", "num_etypes = 90", "edge 11")


@case("dataset", "features with a row count other than num_nodes", "error")
def test_feature_rows(tmp_path):
    bad = write_variant(tmp_path / "rows.npz", feat=cora("feat")[:-1])
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"),
                  str(bad), "feat", "2707", "2708")


@case("dataset", "a `.npz` file that is not a zip archive", "error")
def test_corrupt_file(tmp_path):
    bad = tmp_path / "junk.npz"
    bad.write_bytes(b"not a zip archive at all")
    train_refused(run_sarc("train", GCN, "--dataset", bad, "--epochs", "2"), str(bad))


@case("dataset", "`sarc partition --graph` file with an index array as a mask", "error")
def test_graph_file_index_mask(tmp_path):
    bad = write_variant(tmp_path / "g.npz", test_mask=np.flatnonzero(cora("test_mask")))
    out = tmp_path / "parts"
    assert_error(run_sarc("partition", "--graph", bad, "--parts", "2", "--out", out),
                 str(bad), "test_mask", "node ids")
    assert not out.exists()


@case("dataset", "a Dataset built in Python with out-of-range labels, given to `train`", "error")
def test_python_dataset_is_checked():
    d = load_dataset("cora")
    label = d.label.clone()
    label[0] = 99
    bad = Dataset(d.name, d.num_nodes, d.edge_src, d.edge_dst, d.feat, label, d.train_mask,
                  d.val_mask, d.test_mask, d.num_classes)
    seen = []
    with pytest.raises(DatasetError, match=r"label.*99.*num_classes = 7"):
        train(load_model_file(GCN), bad, epochs=1, log=seen.append)
    assert seen == []


def test_from_arrays_converts_01_masks_and_infers_sizes():
    n = 4
    with pytest.warns(DatasetWarning, match=r"dataset 'tiny': val_mask holds 1 unlabeled node "
                                            r"\(label -1; the first is node 2\)"):
        d = Dataset.from_arrays({"edge_src": [0, 1, 2], "edge_dst": [1, 2, 3],
                                 "label": [0, 1, -1, 2], "train_mask": [1, 1, 0, 0],
                                 "val_mask": np.array([0, 0, 1, 0], np.uint8),
                                 "test_mask": [False, False, False, True]}, name="tiny")
    assert (d.num_nodes, d.num_classes, d.num_features) == (n, 3, 0)
    assert d.train_mask.dtype == torch.bool and d.train_mask.tolist() == [True, True, False, False]
    assert d.edge_src.dtype == d.label.dtype == torch.int64


@case("dataset", "a 2-d `edge_src`, or uint64 node ids past int64", "error")
@pytest.mark.parametrize("value,needle", [
    (lambda: cora("edge_src")[None, :], r"it must be a vector \(one entry per edge\)"),
    (lambda: np.where(np.arange(len(cora("edge_src"))) == 3, np.uint64(2**63 + 5),
                      cora("edge_src").astype(np.uint64)),
     r"edge_src\[3\] is 9223372036854775813, past the int64 node ids")])
def test_edge_ids_of_another_shape_or_range(tmp_path, value, needle):
    path = write_variant(tmp_path / "d.npz", edge_src=value())
    with pytest.raises(DatasetError, match=needle):
        load_dataset(str(path))
