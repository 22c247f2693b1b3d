"""Shared test setup: the model zoo on sys.path, DGL availability, a fixed seed."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))

# Generated modules go to a per-run temp dir, not the user's cache.
os.environ.setdefault("SARC_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"sarc-test-{os.getpid()}"))


def require_dgl():
    """Import DGL, or skip; in the DGL environment (SARC_REQUIRE_DGL=1) a failed import fails."""
    try:
        import dgl  # noqa: F401
        return dgl
    except Exception as e:  # ImportError, or DGL's own errors against a wrong torch
        if os.environ.get("SARC_REQUIRE_DGL") == "1":
            pytest.fail(f"DGL must import in the DGL environment: {e!r}")
        pytest.skip(f"DGL is not installed in this environment ({type(e).__name__}); "
                    f"the DGL tests run in .venv-dgl")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
