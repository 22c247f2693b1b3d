"""What the catalogue's tests share: running ``sarc`` as a user does and judging its outcome."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from timeouts import run_or_show_stacks

ROOT = Path(__file__).resolve().parents[2]


def run_sarc(*argv, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    """``python -m sarc.cli ARGV`` in a subprocess: the CompletedProcess (text); past
    ``timeout`` the test fails with its stacks."""
    return run_or_show_stacks([sys.executable, "-m", "sarc.cli", *map(str, argv)],
                              cwd=cwd or ROOT, timeout=timeout,
                              env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def on_workers(workers) -> list[str]:
    """``--workers P``, and a random partition where P > 1 (one process partitions nothing:
    ``--method`` is refused there)."""
    return ["--workers", str(workers), *(["--method", "random"] if int(workers) > 1 else [])]


def assert_error(proc, *needles: str) -> str:
    """``proc`` failed with exit 2 and one ``sarc ...: error: ...`` line naming ``needles``."""
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert "Traceback" not in err, err
    lines = [l for l in err.splitlines() if l.startswith("sarc")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err
