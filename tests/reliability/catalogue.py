"""The reliability catalogue: every bad-input and fault test, with its input and outcome.

A test in ``tests/reliability/`` marks itself a catalogue case with ``@case(area,
bad_input, outcome)``; ``outcome`` is one of ``OUTCOMES``. ``python
tests/reliability/catalogue.py`` writes the table of ``docs/reliability.md`` (between
its markers) from the cases, and ``test_catalogue_table_is_current`` checks that the
document is current, so the table is the tests.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

AREAS = ("dsl", "tracer", "names", "files", "dataset", "partition", "cli", "faults",
         "numerics", "checkpoint")

OUTCOMES = {
    "error": "a one-line error naming the problem (exit 2, no traceback)",
    "error-at-line": "an error naming the problem and the user's file and line",
    "nothing-lost": "refused before anything is written; what was there is untouched",
    "old-or-new": "after a kill, the old set or the new one is in place; leftovers go on the next run",
    "literal": "the name reaches generated code only as a literal, or is refused; nothing runs",
    "no-orphans": "every process stops and temporary files are removed",
    "exact": "the result equals the reference",
    "warning": "runs as given, with a one-line warning naming the input and the likely mistake",
    "stacks": "the stuck process's stacks, under its name (worker R), before the run stops",
}

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- catalogue: begin -->", "<!-- catalogue: end -->"


def case(area: str, bad_input: str, outcome: str):
    """Mark a test as the catalogue case ``bad_input`` (in ``area``) -> ``outcome``."""
    if area not in AREAS:
        raise ValueError(f"unknown area {area!r}; one of {AREAS}")
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; one of {tuple(OUTCOMES)}")

    def mark(fn):
        fn.catalogue = (area, bad_input, outcome)
        return fn
    return mark


def collect() -> list[tuple[str, str, str, str]]:
    """(area, bad input, outcome, test id) of every case, in area order then file order."""
    pkg = importlib.import_module(__package__ or "reliability")
    rows = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not info.name.startswith("test_"):
            continue
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            cat = getattr(obj, "catalogue", None)
            if cat is not None and name.startswith("test_"):
                rows.append((*cat, f"{info.name}.py::{name}"))
    return sorted(rows, key=lambda r: AREAS.index(r[0]))


def table(rows) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")
    lines = ["| # | area | bad input or fault | outcome | test |", "|---|---|---|---|---|"]
    for i, (area, bad, outcome, test) in enumerate(rows, 1):
        lines.append(f"| {i} | {area} | {cell(bad)} | {cell(OUTCOMES[outcome])} | `{test}` |")
    return "\n".join(lines)


def render(doc: str, rows) -> str:
    head, sep1, rest = doc.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep1 and sep2):
        raise ValueError(f"{DOC} has no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{table(rows)}\n{END}{tail}"


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "models")]  # as tests/conftest.py does
    __package__ = "reliability"
    DOC.write_text(render(DOC.read_text(), collect()))
    print(f"wrote {DOC.relative_to(ROOT)}")
