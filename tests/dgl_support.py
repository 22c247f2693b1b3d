"""DGL availability for the tests that compare against DGL (imported by name, not as conftest)."""
from __future__ import annotations

import os

import pytest
import torch


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


def randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Every parameter random (DGL zero-initializes biases): gradients reach all of them."""
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module
