"""Freed memory kept between mini-batch steps (``sarc.native.allocator``): within
``kept_between_steps`` a step reuses the pages of the large tensor the step before freed
(no page faults); afterwards the free memory is given back to the system. Each case runs
in a fresh interpreter: glibc's heap carries the history of whatever ran before, here what
a mini-batch run has (``sarc.training.minibatch`` and the compiler it imports)."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

ROOT = Path(__file__).resolve().parents[2]
MIB = 64
PROGRAM = f"""
import json, os, resource, sys, torch
import sarc.training.minibatch
from sarc.native.allocator import kept_between_steps

def step():                     # allocate, fill, free: a step's largest tensor
    torch.ones({MIB} << 18)

def faults():                   # minor page faults of a step in steady state: the fewest
    counts = []                 # of 4 (the heap may take a few steps to grow in place)
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(counts)

def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

out = {{"outside": faults()}}
with kept_between_steps():
    with kept_between_steps():
        out["nested"] = faults()
    out["within"] = faults()
    out["held"] = resident_mib()
out["after"] = resident_mib()
print(json.dumps(out))
"""


def _run(**env) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_steps_reuse_the_pages_the_step_before_freed_and_give_them_back_after():
    pages = (MIB << 20) // 4096
    got = _run()
    assert got["outside"] > pages // 2          # glibc unmaps a freed 64 MiB block
    assert got["nested"] < pages // 20 and got["within"] < pages // 20
    assert got["held"] - got["after"] > MIB / 2  # the kept block is returned at the end


def test_switched_off_by_the_environment():
    pages = (MIB << 20) // 4096
    got = _run(SARC_KEEP_FREED_MEMORY="0")
    assert got["within"] > pages // 2
