"""``sarc partition`` shows its progress on a terminal's stderr, and nowhere else."""
from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

from sarc.partition import partition_graph

from partition_graphs import CORA, cora  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_reports_each_stage_and_part(tmp_path, cora):
    src, dst, n, node_data, _ = cora
    done = []
    pset = partition_graph(src, dst, n, 3, tmp_path / "p", method="random", node_data=node_data,
                           progress=done.append)
    assert pset.num_parts == 3
    assert done == ["assign (random)", "relabel", "statistics", "part 0", "part 1", "part 2"]


def _partition(out: Path, stderr) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "sarc.cli", "partition", "--graph", str(CORA),
                           "--parts", "2", "--method", "random", "--out", str(out)],
                          stdout=subprocess.PIPE, stderr=stderr, env=env, timeout=300)


def test_progress_bar_on_a_terminal(tmp_path):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100
    try:
        proc = _partition(tmp_path / "p", slave)
        os.close(slave)
        slave = None
        shown = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0
    text = shown.decode(errors="replace")
    assert all(f"{k}/5" in text for k in range(6)) and "statistics" in text, text
    assert b"wrote " in proc.stdout and b"5/5" not in proc.stdout  # the bar stays on stderr


def test_no_progress_bar_in_a_pipe(tmp_path):
    proc = _partition(tmp_path / "p", subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert b"5/5" not in proc.stdout and b"\r" not in proc.stdout
