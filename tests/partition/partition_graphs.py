"""The partition tests' graph: the embedded Cora, as a fixture to import.

Not a conftest.py: test directories have no __init__.py, so every conftest.py
is imported as the module ``conftest`` and ``from conftest import ...`` in
other directories would find this one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

CORA = Path(__file__).resolve().parents[2] / "sarc" / "data" / "cora.npz"
MASKS = ("train_mask", "val_mask", "test_mask")


@pytest.fixture(scope="session")
def cora():
    """(src, dst, num_nodes, node_data, edge_data) of Cora, with edge data ``norm`` and ``etype``."""
    with np.load(CORA) as d:
        src, dst = torch.from_numpy(d["edge_src"]), torch.from_numpy(d["edge_dst"])
        node_data = {k: torch.from_numpy(d[k]) for k in ("feat", "label", *MASKS)}
        n = int(d["num_nodes"])
    edge_data = {"norm": torch.rand(src.numel(), generator=torch.Generator().manual_seed(1)),
                 "etype": torch.arange(src.numel()) % 3}
    return src, dst, n, node_data, edge_data

