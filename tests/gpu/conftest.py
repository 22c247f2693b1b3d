"""The GPU tests run Triton's compiler, never its CPU interpreter.

tests/backends/triton/conftest.py sets ``TRITON_INTERPRET=1`` in ``os.environ`` when it is
collected, and a whole-suite run collects it before this directory. Triton reads the
variable when a kernel is decorated (a generated module is imported; sarc keys its module
cache on it), so each test here runs with it removed, and restored after. Triton's own
library is decorated when Triton is imported: where that happened under the interpreter,
the tests here skip and say so (gpu_check.interpreted_library).
"""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _compiled_triton(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
