"""Triton's interpreter patches its language once per launch (``triton_interpreter``).

A kernel calling device functions (one of its module, seeing ``tl``; ``tl.zeros`` of
``triton.language.standard``, seeing ``tl.core``) in every program computes what it
should, launch after launch; the language is restored after each launch; and the walks
of the language a launch makes do not grow with its programs.
"""
from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import pytest
import torch

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x + x


@triton.jit
def kernel(x_ptr, out_ptr, N: tl.constexpr, REPEAT: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + pid * N + offs)
    acc = tl.zeros((N,), tl.float32)
    for _ in range(REPEAT):
        acc += _twice(x)
    tl.store(out_ptr + pid * N + offs, tl.maximum(acc, 0.0))
'''
N, REPEAT = 4, 3


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "patched_once.py"   # Triton reads a kernel's source from its file
    path.write_text(KERNEL)
    spec = importlib.util.spec_from_file_location("patched_once", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _launch(mod, programs: int) -> torch.Tensor:
    from sarc.backends.triton_runtime import run
    gen = torch.Generator().manual_seed(programs)
    x = torch.randn(programs, N, generator=gen)
    out = torch.empty_like(x)
    config = types.SimpleNamespace(kwargs={})
    run(mod.kernel, [config], [], lambda meta: (programs,), (x, out), {"N": N, "REPEAT": REPEAT},
        max_deg=None, d=None)
    assert torch.equal(out, (2 * REPEAT * x).clamp_min(0.0))
    return out


def _pinned() -> str:
    """The Triton version the main environment pins (its interpreter is the one
    ``triton_interpreter`` describes; another, e.g. a GPU machine's, may be left alone)."""
    text = (Path(__file__).resolve().parents[3] / "requirements" / "main.txt").read_text()
    return re.search(r"^triton==(\S+)$", text, re.M).group(1)


def test_device_calls_compute_the_same_launch_after_launch_and_the_language_is_restored(module):
    import triton
    import triton.language as tl

    from sarc.backends.triton_interpreter import skip_repeated_patches
    for programs in (1, 5, 2):
        _launch(module, programs)
    assert tl.core.is_builtin(tl.program_id) and tl.core.is_builtin(tl.load)
    if triton.__version__ == _pinned():
        assert skip_repeated_patches()


def test_a_launch_walks_the_language_as_often_whatever_its_programs(module, monkeypatch):
    import triton.runtime.interpreter as interp

    from sarc.backends.triton_interpreter import skip_repeated_patches
    if not skip_repeated_patches():
        pytest.skip("this Triton's interpreter patches otherwise: left as it is")
    _launch(module, 1)       # tl.core's patch by tl.zeros, kept for good by the interpreter
    walks = []
    walk = interp._patch_builtin
    monkeypatch.setattr(interp, "_patch_builtin", lambda *a: (walks.append(a[0]), walk(*a))[1])
    counts = []
    for programs in (1, 8):
        walks.clear()
        _launch(module, programs)
        counts.append(len(walks))
    assert counts[0] == counts[1] > 0, counts   # without the skip: more at each device call


def test_an_interpreter_other_than_expected_is_left_alone():
    from sarc.backends.triton_interpreter import _expected

    class Launch:
        def __call__(self):
            _patch_lang(self.fn).restore()  # noqa: F821 (source only)

    class Device:
        def __call__(self):
            with _patch_lang(self.fn) as scope:  # noqa: F821 (a device call that restores)
                scope.restore()

    assert not _expected(types.SimpleNamespace())
    assert not _expected(types.SimpleNamespace(GridExecutor=Launch, InterpretedFunction=Device,
                                               _patch_lang=lambda fn: None))
