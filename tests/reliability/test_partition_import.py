"""Foreign partitions sarc cannot model, or cannot read here: refused by name.

Heterogeneous PyG partitions are written by hand in the layout of PyG's
``Partitioner`` (``write_pyg_hetero``), so the cases run without PyG; DGL
configs are read before DGL is needed, so those run without DGL too, except
the worker that cannot read its part in place (DGL environment).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

GCN = str(ROOT / "models" / "gcn.py")

NUM = {"paper": 4, "author": 3}
PART = {"paper": [0, 1, 0, 1], "author": [0, 1, 1]}
EDGES = {("author", "writes", "paper"): ([0, 1, 2, 2], [0, 1, 2, 3]),
         ("paper", "cites", "paper"): ([0, 1, 3], [1, 2, 0])}


def write_pyg_hetero(root: Path, feats: dict, *, drop_node: tuple | None = None) -> Path:
    """A 2-part heterogeneous partition in PyG's layout (``sarc.partition.pyg_hetero``);
    ``feats``: {type: x}; ``drop_node``: (type, id) left out of its part's node_feats.pt."""
    ntypes, etypes = list(NUM), list(EDGES)
    offset = {"paper": 0, "author": NUM["paper"]}
    (root / "node_map").mkdir(parents=True)
    (root / "edge_map").mkdir()
    for t in ntypes:
        torch.save(torch.tensor(PART[t]), root / "node_map" / f"{t}.pt")
    eoff = 0
    graphs = [{}, {}]
    for et in etypes:
        src, dst = (torch.tensor(x) for x in EDGES[et])
        part = torch.tensor(PART[et[2]])[dst]
        torch.save(part, root / "edge_map" / f"{'__'.join(et)}.pt")
        for p in range(2):
            m = part == p
            graphs[p][et] = {"edge_id": torch.nonzero(m).flatten() + eoff, "row": src[m],
                             "col": dst[m], "size": (NUM[et[0]], NUM[et[2]])}
        eoff += src.numel()
    for p in range(2):
        d = root / f"part_{p}"
        d.mkdir()
        torch.save(graphs[p], d / "graph.pt")
        nf = {}
        for t in ntypes:
            ids = torch.nonzero(torch.tensor(PART[t]) == p).flatten()
            if drop_node and drop_node[0] == t:
                ids = ids[ids != drop_node[1]]
            x = feats.get(t)
            nf[t] = {"global_id": ids + offset[t], "id": ids,
                     "feats": {"x": None if x is None else x[ids]}}
        torch.save(nf, d / "node_feats.pt")
        torch.save({}, d / "edge_feats.pt")
    (root / "META.json").write_text(json.dumps(
        {"num_parts": 2, "node_types": ntypes, "edge_types": [list(t) for t in etypes],
         "node_offset": [0, NUM["paper"]], "is_hetero": True, "is_sorted": True}))
    return root


@pytest.fixture
def sarc_here(capsys):
    """``sarc ARGV`` in this process (``sarc.cli.main``: what a user's command prints and
    returns, without a new interpreter per case), as a CompletedProcess."""
    from sarc.cli import main

    def run(*argv):
        capsys.readouterr()
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out.out, out.err)
    return run


def convert(sarc_here, tmp_path, root, *more):
    return sarc_here("partition", "--from-pyg", root, "--out", tmp_path / "out", *more)


@case("partition", "a heterogeneous PyG partition whose node type holds a complex-valued feature",
      "error")
def test_a_complex_feature_of_one_node_type_is_refused(sarc_here, tmp_path):
    root = write_pyg_hetero(tmp_path / "g-partitions",
                            {"paper": torch.randn(4, 2), "author": torch.randn(3, 2) * 1j})
    assert_error(convert(sarc_here, tmp_path, root), "node data 'feat' of type 'author' is torch.complex64",
                 "numeric tensors")
    assert not (tmp_path / "out").exists()


@case("partition", "a heterogeneous PyG partition whose parts leave a node out", "error")
def test_a_partition_that_does_not_cover_every_node_is_refused(sarc_here, tmp_path):
    root = write_pyg_hetero(tmp_path / "g-partitions", {"paper": torch.randn(4, 2)},
                            drop_node=("paper", 3))
    assert_error(convert(sarc_here, tmp_path, root), "do not hold every node exactly once",
                 "1 of 7 missing")
    assert not (tmp_path / "out").exists()


@case("partition", "integer node data of different widths in two node types", "error")
def test_integer_data_of_different_widths_is_refused(sarc_here, tmp_path):
    root = write_pyg_hetero(tmp_path / "g-partitions",
                            {"paper": torch.ones(4, 2, dtype=torch.int64),
                             "author": torch.ones(3, 5, dtype=torch.int64)})
    assert_error(convert(sarc_here, tmp_path, root), "node data 'feat' has per-row shapes [2] in 'paper', "
                 "[5] in 'author'", "only floating point features of different widths")


@case("partition", "a float feature in one node type and an integer one in another", "error")
def test_a_float_and_an_integer_feature_are_refused(sarc_here, tmp_path):
    root = write_pyg_hetero(tmp_path / "g-partitions",
                            {"paper": torch.randn(4, 2), "author": torch.ones(3, 2, dtype=torch.int32)})
    assert_error(convert(sarc_here, tmp_path, root), "torch.float32 in 'paper', torch.int32 in 'author'")


@case("partition", "PyG labels beside a heterogeneous partition that fit no node type", "error")
def test_labels_of_no_node_type_ask_for_the_target_type(sarc_here, tmp_path):
    root = write_pyg_hetero(tmp_path / "g-partitions", {"paper": torch.randn(4, 2)})
    (tmp_path / "g-label").mkdir()
    torch.save(torch.arange(5), tmp_path / "g-label" / "label.pt")
    assert_error(convert(sarc_here, tmp_path, root), "5 labels; no node type has as many nodes",
                 "--pyg-target-type TYPE")
    assert not (tmp_path / "out").exists()
    # named, the labels must fit it
    assert_error(convert(sarc_here, tmp_path, root, "--pyg-target-type", "paper"),
                 "'label' must have 4 rows, got [5]")


def _dgl_hetero_config(path: Path, node_map: dict) -> Path:
    path.mkdir()
    config = path / "g.json"
    config.write_text(json.dumps({
        "graph_name": "g", "num_nodes": 6, "num_edges": 2, "num_parts": 2,
        "node_map": node_map,
        "edge_map": {"a:r:b": [[0, 1], [1, 2]]},
        "ntypes": {"a": 0, "b": 1}, "etypes": {"a:r:b": 0},
        **{f"part-{p}": {"node_feats": f"part{p}/node_feat.dgl",
                         "edge_feats": f"part{p}/edge_feat.dgl",
                         "part_graph": f"part{p}/graph.dgl"} for p in range(2)}}))
    return config


@case("partition", "a heterogeneous DGL partition book that leaves shuffled node ids unowned",
      "error")
def test_a_dgl_partition_book_with_a_gap_is_refused(sarc_here, tmp_path):
    config = _dgl_hetero_config(tmp_path / "dgl", {"a": [[0, 1], [3, 4]], "b": [[1, 2], [4, 6]]})
    proc = sarc_here("partition", "--from-dgl", config, "--dgl-shuffled-ids",
                    "--out", tmp_path / "out")
    assert_error(proc, "corrupt node_map: its ranges do not tile 0..6 (a gap or an overlap at 2)")
    assert not (tmp_path / "out").exists()


@case("partition", "one tensor of original node ids for a heterogeneous DGL partition", "error")
def test_one_id_tensor_for_several_types_is_refused(sarc_here, tmp_path):
    config = _dgl_hetero_config(tmp_path / "dgl", {"a": [[0, 1], [3, 4]], "b": [[1, 3], [4, 6]]})
    torch.save(torch.arange(6), tmp_path / "n.pt")
    torch.save(torch.arange(2), tmp_path / "e.pt")
    proc = sarc_here("partition", "--from-dgl", config, "--dgl-orig-ids", tmp_path / "n.pt",
                    tmp_path / "e.pt", "--out", tmp_path / "out")
    assert_error(proc, "orig_nids is one tensor, the partition has the types a, b",
                 "the dict of per-type ids")


@case("partition", "a DGL partition config whose `part-1` names no graph file "
      "(`\"part_graph\": null`)", "error")
@pytest.mark.dgl
def test_a_dgl_part_entry_naming_no_file_is_refused(sarc_here, tmp_path):
    """A worker died in a TypeError reading it, the others in a failed collective. (Checked
    where DGL is found: without it, the error says DGL is needed.)"""
    from dgl_support import require_dgl
    require_dgl()
    config = _dgl_hetero_config(tmp_path / "dgl", {"a": [[0, 1], [3, 4]], "b": [[1, 3], [4, 6]]})
    meta = json.loads(config.read_text())
    meta["part-1"]["part_graph"] = None
    config.write_text(json.dumps(meta))
    proc = sarc_here("partition", "--from-dgl", config, "--dgl-shuffled-ids",
                    "--out", tmp_path / "out")
    assert_error(proc, "part-1's part_graph holds None, expected the name of a file")
    assert not (tmp_path / "out").exists()


@case("partition", "a DGL partition with `orig_nids.pt` beside its config but no "
      "`orig_eids.pt`", "error")
def test_half_a_saved_dgl_id_mapping_is_refused(sarc_here, tmp_path):
    """Trained on in place, the half mapping was left out silently: the run took DGL's
    shuffled ids (in sampling mode, another run than one process's)."""
    config = _dgl_hetero_config(tmp_path / "dgl", {"a": [[0, 1], [3, 4]], "b": [[1, 3], [4, 6]]})
    torch.save({"a": torch.arange(2), "b": torch.arange(4)}, config.parent / "orig_nids.pt")
    proc = sarc_here("partition", "--from-dgl", config, "--out", tmp_path / "out")
    assert_error(proc, "orig_nids.pt is beside it but orig_eids.pt is not")
    assert not (tmp_path / "out").exists()


@case("partition", "sarc train --partition NAME.json (a DGL partition) where DGL is not installed",
      "error")
def test_training_on_a_dgl_partition_without_dgl_says_to_convert_it(tmp_path):
    config = _dgl_hetero_config(tmp_path / "dgl", {"a": [[0, 1], [3, 4]], "b": [[1, 3], [4, 6]]})
    fake = tmp_path / "no-dgl" / "dgl"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named dgl')\n")
    import os
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = run_sarc("train", GCN, "--partition", config, "--workers", "2", env=env)
    assert_error(proc, f"{config}: a DGL partition", "which this environment lacks",
                 f"Convert it first: sarc partition --from-dgl {config} --out DIR")


@case("partition", "a DGL partition trained on in place whose part 1 graph file is truncated",
      "error")
@pytest.mark.dgl
def test_a_worker_that_cannot_read_its_dgl_part_stops_every_worker(tmp_path):
    from dgl_support import require_dgl
    dgl = require_dgl()
    g = dgl.graph((torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 3, 4, 5, 0])))
    g.ndata["feat"] = torch.randn(6, 3)
    g.ndata["label"] = torch.tensor([0, 1, 0, 1, 0, 1])
    for k in ("train_mask", "val_mask", "test_mask"):
        g.ndata[k] = torch.ones(6, dtype=torch.bool)
    # DGL's random partitioner can leave a part of 6 nodes empty and then fails
    # inside DGL (KeyError / DGLError): seed it, as the other DGL partition tests do.
    dgl.seed(0)
    dgl.distributed.partition_graph(g, "g", 2, str(tmp_path / "dgl"), part_method="random")
    graph = tmp_path / "dgl" / "part1" / "graph.dgl"
    graph.write_bytes(graph.read_bytes()[:100])
    proc = run_sarc("train", GCN, "--partition", tmp_path / "dgl" / "g.json", "--workers", "2",
                    "--epochs", "1", "--timeout", "30", env={"TMPDIR": str(tmp_path)},
                    timeout=180)
    from .test_faults import same_error_from_every_worker
    message = same_error_from_every_worker(proc, 2)
    assert message.startswith(f"{graph}: cannot be read as a DGL graph"), message


@case("partition", "a PyG partition directory (its META.json) given to `sarc train "
                   "--partition` or `sarc compile --partition`", "error")
@pytest.mark.parametrize("command", ["train", "compile"])
def test_a_pyg_partition_given_as_a_set_says_to_convert_it(tmp_path, command):
    """It was taken for a DGL partition (a directory with a .json file): "the DGL
    partition config lacks 'num_nodes'", and sarc compile said metadata.json is missing."""
    pyg = tmp_path / "g-partitions"
    pyg.mkdir()
    (pyg / "META.json").write_text(json.dumps({"num_parts": 2, "is_hetero": False,
                                               "node_types": None, "edge_types": None}))
    extra = ("--workers", "2") if command == "train" else ()
    proc = run_sarc(command, ROOT / "models" / "gcn.py", "--partition", pyg, *extra)
    assert_error(proc, f"{pyg} is a PyG partition (META.json)", "sarc partition --from-pyg")
