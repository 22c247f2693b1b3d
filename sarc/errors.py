"""Errors sarc raises, each naming the problem and where it is."""
from __future__ import annotations

import contextlib
import linecache
from dataclasses import dataclass, field

PASSES_ON: set = set()
"""The code of functions that pass a call on (``passes_on``): the tracer takes an error
raised in one for its caller's (``sarc.trace_guards``)."""


def passes_on(fn):
    """Mark ``fn`` as a pass-through: an error raised in it is its caller's
    (``sarc.__getattr__``'s AttributeError is the user's misspelt ``sarc.meen``)."""
    PASSES_ON.add(fn.__code__)
    return fn


@dataclass(frozen=True)
class SourceLoc:
    """A line of the user's model file; ``end_line``: the last line of the expression that
    starts there, where it spans several (``(y\n + 1.0\n + src.h)``), shown whole."""

    file: str
    line: int
    func: str = ""
    end_line: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def source_line(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def located(self, message: str) -> str:
        """``message`` as said at this line: ``file:line (in func): message``, then the line
        (the expression's lines, where it spans several)."""
        where = f"{self}" + (f" (in {self.func})" if self.func else "")
        last = min(max(self.end_line, self.line), self.line + MAX_SHOWN_LINES - 1)
        lines = [linecache.getline(self.file, n).rstrip() for n in range(self.line, last + 1)]
        if not lines[0].strip():
            return f"{where}: {message}"
        indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
        more = "\n    ..." if self.end_line > last else ""
        return (f"{where}: {message}" + "".join(f"\n    {l[indent:]}" for l in lines if l.strip())
                + more)


def class_loc(cls) -> SourceLoc | None:
    """The line of ``cls``'s ``class`` statement (None where its source cannot be read)."""
    import inspect
    try:
        return SourceLoc(inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1],
                         cls.__name__)
    except (OSError, TypeError):
        return None


MAX_SHOWN_LINES = 6  # of an expression spanning lines, in an error


class SarcWarning(UserWarning):
    """Base class of what sarc says of input it runs but that is likely a mistake; the
    command line prints it as ``sarc COMMAND: warning: ...``."""


class SarcError(Exception):
    """Base class of sarc's errors."""

    # Raised on every worker of a run at one collective, an agreement on a problem one of
    # them found (``agreed``): each worker says it, and none leaves before all have said it,
    # since torchrun stops the others as soon as one exits.
    agreed = False


def agreed(e: SarcError) -> SarcError:
    """``e``, marked as raised on every worker at the same collective."""
    e.agreed = True
    return e


class OutputError(SarcError):
    """An output cannot be written where the checks before the work allowed it (a full disk,
    a file system that refuses what ``os.access`` allowed, such as /proc as root)."""


def cannot_write(path, e: OSError) -> OutputError:
    """The OutputError of writing ``path`` (a file or a set) that failed with ``e``."""
    return OutputError(f"{path}: cannot be written: {e.strerror or e}"
                       + (f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""))


class DSLError(SarcError):
    """A mistake in a layer written in the DSL, located at the user's line."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.problem = message
        self.loc = loc
        super().__init__(message if loc is None else loc.located(message))
        if _MADE:
            _MADE[-1].append(self)


_MADE: list[list[DSLError]] = []


@contextlib.contextmanager
def dsl_errors_made():
    """The ``DSLError`` s made meanwhile, raised or not: what a trace refused, even where the
    traced code's own ``try / except`` caught it (``trace_guards.tracing``)."""
    made: list[DSLError] = []
    _MADE.append(made)
    try:
        yield made
    finally:
        _MADE.pop()


class GraphError(SarcError, ValueError):
    """A graph or its data is malformed (ids out of range, row counts off).

    ``layer`` and ``loc``: the layer whose call found it and the user's line that called
    it (``Layer.forward`` adds them: a model of several layers says which one)."""

    def __init__(self, message: str, layer: str | None = None, loc: SourceLoc | None = None):
        self.problem, self.layer, self.loc = message, layer, loc
        text = message if layer is None else f"calling {layer}: {message}"
        super().__init__(text if loc is None else loc.located(text))

    def at_call(self, layer: str, loc: SourceLoc | None) -> "GraphError":
        """This error as found by the call of ``layer`` at the user's line ``loc``."""
        return type(self)(self.problem, layer, loc)


class GraphAttributeError(AttributeError):
    """What a graph a model runs on has not (``DistGraph.src``): the user's line asked for
    it, so a model's error names that line (``trace_guards.raised_at``), though sarc's
    ``__getattr__`` raised it."""


class PartitionError(SarcError, ValueError):
    """A partition set on disk is missing, incomplete, corrupt, or of another graph."""
