"""The catalogue is large enough, and docs/reliability.md's table is generated from it."""
from __future__ import annotations

from .catalogue import DOC, collect, render


def test_catalogue_table_is_current():
    rows = collect()
    assert len(rows) >= 40, f"the catalogue has {len(rows)} cases"
    doc = DOC.read_text()
    assert render(doc, rows) == doc, "regenerate it: python tests/reliability/catalogue.py"
