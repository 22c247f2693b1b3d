"""Progress bars: ``sarc train`` shows its epochs (full batch) or each epoch's steps
(mini-batch modes) on a terminal's stderr, and nothing where stderr is not a terminal."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from sarc.loader import load_model_file
from sarc.train import train
from sarc.training import loop
from sarc.training.minibatch import MiniBatchConfig
from sarc.training.progress import progress_bar

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("tqdm")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_draws_on_a_terminal_only():
    term, pipe = Terminal(), io.StringIO()
    for stream in (term, pipe):
        with progress_bar(3, "work", "step", stream=stream, mininterval=0) as bar:
            for k in range(3):
                bar.advance(status=f"k {k}")
    assert "3/3" in term.getvalue() and "k 2" in term.getvalue()
    assert pipe.getvalue() == ""


def test_a_bar_of_nothing_or_disabled_draws_nothing():
    term = Terminal()
    with progress_bar(0, "none", "step", stream=term) as bar:
        bar.advance()
    with progress_bar(4, "off", "step", stream=term, enabled=False) as bar:
        bar.advance()
        assert not bar.shown
    assert term.getvalue() == ""


@pytest.fixture
def terminal(monkeypatch):
    """Every bar ``fit`` draws goes to one terminal."""
    term = Terminal()

    @contextlib.contextmanager
    def on_terminal(*args, **kwargs):
        with progress_bar(*args, stream=term, mininterval=0, **kwargs) as bar:
            yield bar
    monkeypatch.setattr(loop, "progress_bar", on_terminal)
    return term


def test_full_batch_training_shows_its_epochs(terminal):
    lines = []
    train(load_model_file(ROOT / "models" / "gcn.py"), "cora", epochs=3, log=lines.append)
    shown = terminal.getvalue()
    assert "train" in shown and "3/3" in shown and "epoch 1" not in shown
    assert any(line.startswith("epoch") for line in lines)  # the lines still reach the log


def test_sampling_shows_each_epochs_steps(terminal):
    config = MiniBatchConfig("sampling", (5, 5), batch_size=64)  # 140 seeds: 3 steps
    train(load_model_file(ROOT / "models" / "sage.py"), "cora", epochs=2, log=lambda s: None,
          minibatch=config)
    shown = terminal.getvalue()
    assert "epoch 1" in shown and "epoch 2" in shown and "3/3" in shown


def test_silent_training_draws_no_bar(terminal):
    train(load_model_file(ROOT / "models" / "gcn.py"), "cora", epochs=2, log=None)
    assert terminal.getvalue() == ""
