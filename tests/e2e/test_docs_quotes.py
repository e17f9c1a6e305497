"""The toy numbers the docs quote are what the tool prints: every quoted block of ``toy_neox`` (the toy
the suite trains) measured again by ``docs/quote.py`` on the suite's toy. The blocks of ``toy_olmo`` and
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
    other = [c for c in checked if not c.comparable]
    if other:
        pytest.skip(
            f"this machine trained another toy_neox (weights {other[0].weights}, the docs quote "
            f"{other[0].quote.weights}; python -m emergence.toy says why): its numbers are not the docs'"
        )
    assert [(c.quote.doc.name, c.quote.args, c.text) for c in checked if c.differs] == []

    # The check can fail: a doc whose quoted number is changed differs, and writing it restores it.
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("*.png", "*.py"))
    doc = docs / "adaptive-ablation.md"
    doc.write_text(doc.read_text().replace("| L1H3 | 64 (13%) |", "| L1H3 | 128 (26%) |", 1))
    edited = quote.check(runner, {"toy_neox"}, docs)
    assert [(c.quote.kind, c.quote.doc.name) for c in edited if c.differs] == [("head-sets", "adaptive-ablation.md")]
    quote.write(edited)
    assert doc.read_text() == (ROOT / "docs" / "adaptive-ablation.md").read_text()
