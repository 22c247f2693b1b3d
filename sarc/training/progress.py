"""Progress bars of long runs (``sarc train``'s epochs and steps, ``sarc partition``'s stages),
and ``plural``, the counts their lines print.

A bar is drawn with tqdm on stderr when stderr is a terminal; in pipes, logs and tests,
or where tqdm is not installed, it is a ``Bar`` that draws nothing, so what a command
prints on stdout stays its result either way. While a bar is drawn, the lines a command
prints go through ``Bar.printer`` so that they do not tear it.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, TextIO


class Bar:
    """A bar of ``total`` steps (drawn by ``tqdm`` where given one, else nothing)."""

    def __init__(self, tqdm_bar=None):
        self._bar = tqdm_bar

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def advance(self, n: int = 1, status: str | None = None) -> None:
        if self._bar is not None:
            if status is not None:
                self._bar.set_postfix_str(status, refresh=False)
            self._bar.update(n)

    def printer(self, log: Callable[[str], None]) -> Callable[[str], None]:
        """``log``, which while the bar is drawn clears it first and draws it again after."""
        bar = self._bar
        if bar is None:
            return log

        def write(text: str) -> None:
            with bar.external_write_mode(file=bar.fp):
                log(text)
        return write


def plural(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun for it, as the lines of a run print counts: ``1 step``, ``2 steps``
    (``many``: the plural where it is not ``one`` + s)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


@contextlib.contextmanager
def progress_bar(total: int, desc: str, unit: str, *, enabled: bool = True,
                 stream: TextIO | None = None, leave: bool = False,
                 mininterval: float = 0.2) -> Iterator[Bar]:
    """A ``Bar`` of ``total`` ``unit``s on ``stream`` (stderr) when it is a terminal and
    ``enabled``; one that draws nothing otherwise. Closed when the block ends.
    ``mininterval=0``: every step drawn (a few long ones)."""
    stream = sys.stderr if stream is None else stream
    tqdm = None
    if enabled and total > 0 and stream.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
    if tqdm is None:
        yield Bar()
        return
    bar = tqdm(total=total, desc=desc, unit=unit, file=stream, leave=leave,
               mininterval=mininterval, miniters=1 if mininterval == 0 else None,
               dynamic_ncols=True)
    try:
        yield Bar(bar)
    finally:
        bar.close()
