"""The toy numbers the docs quote are what the tool prints: every quoted block of ``toy_neox`` (the toy
the suite trains, as the README's set-up line does, with portable numerics: the docs' weights on any
x86 CPU) measured again by ``docs/quote.py`` on the suite's toy. The blocks of ``toy_olmo`` and
``toy_olmoe`` are checked by ``python docs/quote.py --check``, which trains them (docs/testing.md)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_quote_script():
    spec = importlib.util.spec_from_file_location("docs_quote", ROOT / "docs" / "quote.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_docs_quote_what_the_tool_prints(toy_panel, tmp_path):
    quote = load_quote_script()
    sweep, env = toy_panel
    runner = quote.Runner(tmp_path / "work", env, sweeps={"toy_neox": sweep})
    checked = quote.check(runner, {"toy_neox"})
    assert {c.quote.kind for c in checked} == {"ablation", "head-sets", "trajectory"}
    assert {c.quote.doc.name for c in checked} == {"adaptive-ablation.md", "toy-panel.md"}
    # Portable numerics: the suite's toy is the docs' toy wherever it trains (python -m emergence.toy says
    # why where it is not).
    assert [(c.quote.weights, c.weights) for c in checked if not c.comparable] == []
    assert [(c.quote.doc.name, c.quote.args, c.text) for c in checked if c.differs] == []

    # The check can fail: a doc whose quoted number is changed differs, and writing it restores it.
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("*.png", "*.py"))
    doc = docs / "adaptive-ablation.md"
    (head_sets,) = [c for c in checked if c.quote.kind == "head-sets"]
    first_row = head_sets.quote.text.splitlines()[2]  # under the header and its rule: the first head set's row
    cells = first_row.split(" | ")
    cells[1] = "999 (99%)"  # sequences the adaptive run used: no run of 500 uses 999
    doc.write_text(doc.read_text().replace(first_row, " | ".join(cells), 1))
    edited = quote.check(runner, {"toy_neox"}, docs)
    assert [(c.quote.kind, c.quote.doc.name) for c in edited if c.differs] == [("head-sets", "adaptive-ablation.md")]
    quote.write(edited)
    assert doc.read_text() == (ROOT / "docs" / "adaptive-ablation.md").read_text()
