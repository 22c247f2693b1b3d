"""Shared test setup: the model zoo and the test helpers on sys.path, a fixed seed."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(ROOT / "tests"))

# One intra-op thread in the test process: the distributed tests fork workers, and a child
# forked from a process whose OpenMP pool has run threads can hang in it (libgomp is not
# fork-safe). It also makes float results independent of the machine's core count.
torch.set_num_threads(1)

# Generated modules go to a per-run temp dir, not the user's cache.
os.environ.setdefault("SARC_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"sarc-test-{os.getpid()}"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
