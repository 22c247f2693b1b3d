"""Freed memory kept between mini-batch steps (``sarc.native.allocator``): a large tensor
freed and allocated again within ``kept_between_steps`` reuses its pages (no page
faults), and afterwards the thresholds are back and the memory returned."""
import platform
import resource

import pytest
import torch

from sarc.native import allocator

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

SIZE = 64 << 20


def _faults_of_a_step() -> int:
    """Minor page faults of allocating, filling and freeing a SIZE-byte tensor, after one
    such step has run before."""
    torch.ones(SIZE // 4)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(SIZE // 4)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_step_reuses_the_pages_the_last_step_freed():
    pages = SIZE // 4096
    assert _faults_of_a_step() > pages // 2          # glibc unmaps a freed 64 MiB block
    with allocator.kept_between_steps():
        assert _faults_of_a_step() < pages // 20
    assert _faults_of_a_step() > pages // 2          # the thresholds are back afterwards


def test_nested_uses_keep_until_the_outermost_ends():
    pages = SIZE // 4096
    with allocator.kept_between_steps():
        with allocator.kept_between_steps():
            pass
        assert _faults_of_a_step() < pages // 20
    assert _faults_of_a_step() > pages // 2


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("SARC_KEEP_FREED_MEMORY", "0")
    pages = SIZE // 4096
    with allocator.kept_between_steps():
        assert _faults_of_a_step() > pages // 2
