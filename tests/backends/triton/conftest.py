"""The Triton backend's tests run its kernels in Triton's interpreter on CPU tensors.

``TRITON_INTERPRET=1`` must be set before a kernel module is imported (the
``@triton.jit`` decorator reads it); generated modules are imported when a
layer is compiled, so setting it here, at collection, is early enough. Without
triton >= 3.0 (e.g. the DGL environment's triton 2.2) every test here is
skipped with the reason.
"""
from __future__ import annotations

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"

from sarc.backends import triton_backend  # noqa: E402

try:
    triton_backend.check_triton()
    SKIP = None
except triton_backend.TritonUnavailable as e:
    SKIP = str(e)


def pytest_configure(config):
    # Masked-off lanes of a tile compute on padding (exp of a large score, 0 * inf) and are
    # then discarded by tl.where; the interpreter's NumPy warns about them all the same.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


def pytest_collection_modifyitems(config, items):
    if SKIP is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=SKIP))


@pytest.fixture
def split_small(monkeypatch):
    """Tiny degree buckets and split length, so small graphs take every schedule path."""
    from sarc.backends import triton_runtime
    monkeypatch.setattr(triton_runtime, "SPLIT_EDGES", 4)
    monkeypatch.setattr(triton_runtime, "BUCKETS", (1, 2))
