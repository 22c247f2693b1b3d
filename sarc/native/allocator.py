"""Freed memory kept for the next mini-batch step (glibc's malloc).

A mini-batch step allocates and frees the same large tensors (the input rows, each
layer's activations and gradients) a hundred times an epoch. glibc serves an allocation
over its mmap threshold (which it raises to 32 MiB at most) with fresh pages from the
kernel and unmaps them when freed, and gives the top of its heap back past its trim
threshold: every step then pays a page fault and a zeroed page per 4 KiB of each such
tensor. On a 2-core CPU that was a quarter of a sampled GraphSAGE epoch's time
(``benchmarks/sampling.py``). ``kept_between_steps()`` raises both thresholds for an
epoch's steps, so freed blocks are reused, and afterwards sets them back and returns the
free memory to the system (``malloc_trim``). Elsewhere than glibc, or with
``SARC_KEEP_FREED_MEMORY=0``, it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import platform
import threading

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT = 1 << 30
"""Allocations up to this size come from the heap, and this much free memory stays in it."""
AFTER = 32 << 20
"""The thresholds afterwards: glibc's largest dynamic mmap threshold."""

_lock = threading.Lock()
_depth = 0


def _libc():
    """glibc with its malloc tunables, or None (switched off, or another C library)."""
    return None if os.environ.get("SARC_KEEP_FREED_MEMORY", "1") == "0" else _glibc()


@functools.cache
def _glibc():
    """Looked up once: ``platform.libc_ver`` reads the interpreter's binary."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextlib.contextmanager
def kept_between_steps():
    """Within: freed memory up to ``KEPT`` is reused by the next allocations instead of
    being unmapped. Nested uses keep it until the outermost ends."""
    global _depth
    libc = _libc()
    if libc is None:
        yield
        return
    with _lock:
        if _depth == 0:
            libc.mallopt(M_MMAP_THRESHOLD, KEPT)
            libc.mallopt(M_TRIM_THRESHOLD, KEPT)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(M_MMAP_THRESHOLD, AFTER)
                libc.mallopt(M_TRIM_THRESHOLD, 2 * AFTER)
                libc.malloc_trim(0)
