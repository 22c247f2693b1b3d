"""``sarc partition``: the parser hook and the command, from a dataset and from an .npz file."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from sarc.partition import graph_fingerprint, load_partitions
from sarc.atomic import DirectoryExistsError
from sarc.cli.partition import add_partition_parser
from sarc.partition.graph_file import load_npz_graph

from partition_graphs import CORA


def run(argv):
    parser = argparse.ArgumentParser(prog="sarc")
    add_partition_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["partition", *argv])
    return args.func(args)


def test_partition_graph_file(tmp_path, capsys):
    out = tmp_path / "cora"
    assert run(["--graph", str(CORA), "--parts", "4", "--method", "metis", "--out", str(out),
                "--seed", "2"]) == 0
    text = capsys.readouterr().out
    assert "edge cut: " in text and "max/mean" in text
    for column in ("nodes", "edges", "train_mask"):
        assert column in text
    src, dst, n, node_data, _ = load_npz_graph(CORA)
    assert {"feat", "label", "train_mask"} <= set(node_data)
    pset = load_partitions(out, fingerprint=graph_fingerprint(src, dst, n))
    assert (pset.num_parts, pset.method, pset.meta["seed"]) == (4, "metis", 2)
    assert f"edge cut: {pset.stats.edge_cut} of {src.numel()}" in text
    with pytest.raises(DirectoryExistsError):
        run(["--graph", str(CORA), "--parts", "2", "--out", str(out)])
    assert run(["--graph", str(CORA), "--parts", "2", "--method", "random", "--out", str(out),
                "--overwrite"]) == 0
    assert load_partitions(out).num_parts == 2


def test_partition_dataset_keeps_edge_types(tmp_path, capsys):
    pytest.importorskip("sarc.datasets")
    out = tmp_path / "aifb"
    assert run(["--dataset", "aifb", "--parts", "3", "--method", "random", "--out", str(out)]) == 0
    assert "edge data: etype" in capsys.readouterr().out
    pset = load_partitions(out)
    part = pset.load_part(1)
    with np.load(CORA.parent / "aifb.npz") as d:
        etype = torch.from_numpy(d["etype"])
    assert torch.equal(part.edata["etype"], etype[part.orig_edge_ids])


def test_npz_without_an_edge_list(tmp_path):
    f = tmp_path / "bad.npz"
    np.savez(f, edge_src=np.zeros(2, np.int64), num_nodes=np.int64(3))
    with pytest.raises(ValueError, match="edge_dst"):
        load_npz_graph(f)
