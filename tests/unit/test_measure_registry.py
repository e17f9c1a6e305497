"""The measure registry: the probe pass's sites reach a measure's accumulator (attention entropy against
eager patterns), what a measure declares is checked, and docs/outputs.md's table is what they declare."""

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from emergence import measures
from emergence.measures import attention_entropy
from emergence.measures.__main__ import main as docs_main
from emergence.measures.plugin import Column, Measure, MeasureInput, MeasureResult
from emergence.recipe.ablation import metrics_per_sequence
from emergence.recipe.capture import Architecture, PassOptions, Subject, register_attention, run_probe
from emergence.recipe.probe import baseline_positions, make_probe_batch
from tests.helpers.reference_impl import eager_attention_entropy, eager_model
from tests.helpers.tiny_models import ARCHS, VOCAB

DOCS = Path(__file__).parents[2] / "docs"


@pytest.mark.parametrize("arch", ARCHS)  # fused qkv, GQA, soft-caps, sliding windows among them
@pytest.mark.parametrize("block", [1, 7, 64])
def test_attention_entropy_equals_eager_patterns(arch, block, tiny_dirs):
    batch = make_probe_batch(6, 48, 10, VOCAB, 3)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_dirs[arch], dtype=torch.float32, attn_implementation=register_attention()
    ).eval()
    arch_info = Architecture.of(model)
    settings = attention_entropy.Settings(block=block)
    inputs = MeasureInput(model, 2, arch_info.n_heads, batch, "synthetic", None, torch.device("cpu"), settings)
    summed = attention_entropy.EntropySums(inputs)
    run_probe(
        Subject(model, arch_info, batch, 4), PassOptions(baseline_positions(48, 20), 6), metrics_per_sequence, [summed]
    )
    got = attention_entropy.MEASURE.checked(summed.result(), (2, arch_info.n_heads)).per_head["attention_entropy"]
    np.testing.assert_allclose(got, eager_attention_entropy(eager_model(tiny_dirs[arch]), batch.tokens), rtol=1e-5)


def test_a_measure_declares_one_way_to_compute_and_returns_what_it_declares():
    def result(inputs):
        return MeasureResult({"x": np.zeros((2, 3))}, {})

    with pytest.raises(TypeError, match="exactly one of compute and accumulate"):
        Measure("m", 1, frozenset({"weights"}), (), (), ())
    with pytest.raises(TypeError, match="an accumulate, and only it, needs the pass"):
        Measure("m", 1, frozenset({"pass"}), (), (), (), compute=result)
    m = Measure("m", 1, frozenset({"weights"}), (Column("y", "why"),), (), (), compute=result)
    with pytest.raises(RuntimeError, match=r"returned columns, fields and per-sequence arrays \(\['x'\], \[\], \[\]\)"):
        m.checked(result(None), (2, 3))
    s = Measure("s", 1, frozenset({"weights"}), (Column("x", "x"),), (), (), compute=result, sequences=("per_seq",))
    with pytest.raises(RuntimeError, match=r"it declares \(\['x'\], \[\], \['per_seq'\]\)"):
        s.checked(result(None), (2, 3))
    n = Measure("n", 1, frozenset({"weights"}), (Column("x", "x"),), (), (), compute=result)
    with pytest.raises(RuntimeError, match=r"not \[layers, heads\] \(2, 4\)"):
        n.checked(result(None), (2, 4))


def test_docs_outputs_table_is_the_registrys_declared_columns(tmp_path):
    assert docs_main(["--check", str(DOCS / "outputs.md")]) == 0
    stale = tmp_path / "outputs.md"
    text = (DOCS / "outputs.md").read_text()
    stale.write_text(text.replace("`attention_entropy` |", "`entropy` |"))
    assert docs_main(["--check", str(stale)]) == 1 and docs_main([str(stale)]) == 0
    assert stale.read_text() == text
    every = {c.name for c in measures.columns()}
    assert all(f"| `{name}` |" in text for name in every)
