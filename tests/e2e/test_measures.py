"""Measures chosen from the config: a user's measure by ``_target_`` (a copy of docs/measures.md's worked
example, ``tests/helpers/user_measure.py``) reaches heads.csv, W&B's head table and the panel report in
the run's one forward pass; each measure's results are cached on their own."""

import json

import numpy as np
import pytest

from emergence import measures
from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub import checkpoints
from emergence.main import analyse
from emergence.panel.report import main as report_main
from emergence.panel.runs import Checkpoint
from emergence.recipe.probe import make_probe_batch
from emergence.run import tracking
from emergence.run.results import read_run
from tests.helpers import user_measure
from tests.helpers.cli import SMALL_RUN, last_line, run_cli
from tests.helpers.reference_impl import eager_attention_entropy, eager_model
from tests.unit.test_report import write_checkpoint

USER = "+measures.head_entropy._target_=tests.helpers.user_measure.MEASURE"
PASS_ONLY = [*SMALL_RUN, "ablate.enabled=false"]  # no ablation: the probe pass is the run's only forward
BATCHES = 32 // 8  # probe.n_sequences / probe.batch_size
DISCOVERY = 1  # the short forward that finds the attention layers (``capture.discover``)


@pytest.fixture
def forwards(monkeypatch):
    """Counts the forward passes of every model a run loads."""
    calls = []
    load = checkpoints.load_model

    def counted(*args, **kwargs):
        model = load(*args, **kwargs)
        model.register_forward_pre_hook(lambda module, inputs: calls.append(1))
        return model

    monkeypatch.setattr(checkpoints, "load_model", counted)
    return calls


def local(tiny_dirs, arch="llama"):
    return ["model=local", f"model.name_or_path={tiny_dirs[arch]}"]


def test_a_users_measure_joins_the_one_probe_pass_and_equals_eager_attention(tiny_dirs, tmp_path, forwards):
    cfg = compose_config([*local(tiny_dirs), *PASS_ONLY, USER, "reuse=false"])
    summary = analyse(cfg, tmp_path / "with")
    assert len(forwards) == DISCOVERY + BATCHES  # the measure read the pass: no pass of its own
    _, rows = read_run(tmp_path / "with")
    grid = np.array([[r["head_entropy"] for r in rows if r["layer"] == layer] for layer in range(2)])
    batch = make_probe_batch(32, 64, 10, 500, 42)  # SMALL_RUN's probe
    expected = eager_attention_entropy(eager_model(tiny_dirs["llama"]), batch.tokens)
    np.testing.assert_allclose(grid, expected, rtol=1e-5)
    assert summary.measure_sources["head_entropy"] == "pass"
    # W&B's head table holds its column (every row of heads.csv, as written)
    table = tracking.checkpoint_metrics(summary, [r for r in rows], tmp_path / "with" / "classes.png")["heads"]
    assert "head_entropy" in table.columns
    assert [row[table.columns.index("head_entropy")] for row in table.data] == [r["head_entropy"] for r in rows]

    forwards.clear()
    analyse(compose_config([*local(tiny_dirs), *PASS_ONLY, "reuse=false"]), tmp_path / "without")
    assert len(forwards) == DISCOVERY + BATCHES  # the same passes without it


def test_the_panel_report_draws_a_registered_measures_trajectory(tmp_path, monkeypatch):
    """The copy registered as a contributor registers a measure: its trajectory is on the token axis."""
    monkeypatch.setitem(measures.REGISTRY, "head_entropy", user_measure.MEASURE)
    root = tmp_path / "multirun"
    means = []
    for k, tokens in enumerate((1e6, 1e7, 1e8)):
        entropy = np.full((2, 3), 0.5 * k)
        entropy[0, 0] = 3.0
        means.append(entropy.mean())
        write_checkpoint(
            root / f"r{k}",
            Checkpoint(f"r{k}", tokens, np.ones((2, 3, 6)), measure_columns={"head_entropy": entropy}),
            {"model": "m", "revision": f"r{k}", "tokens": tokens, "step": None, "n_layers": 2, "n_heads": 3},
        )
    report_main([str(root), "--out", str(tmp_path / "report")])
    findings = json.loads((tmp_path / "report" / "findings.json").read_text())
    drawn = {t["measure"]: t["values"] for t in findings["token_axis"]["m"]["transitions"]}
    assert drawn["head_entropy_mean"] == pytest.approx(means)


def test_each_measure_is_cached_on_its_own(tiny_dirs, tmp_path, forwards, monkeypatch):
    """With a cached default run, adding a measure runs the probe pass once for it alone (the others are
    served); dropping one recomputes nothing and loads no model; a setting is part of its key."""
    base = [*local(tiny_dirs, "gpt_neox"), *PASS_ONLY, f"cache_dir={tmp_path / 'cache'}"]
    first = analyse(compose_config(base), tmp_path / "first")
    assert set(first.measure_sources.values()) == {"pass", "weights"}

    forwards.clear()
    added = analyse(compose_config([*base, "measures=[default,attention_entropy]"]), tmp_path / "added")
    assert added.measure_sources == {
        "sink_importance": "cache",
        "icl": "cache",
        "repeat_loss": "cache",
        "training_copy_loss": "cache",
        "value_drain": "cache",
        "prefix_matching": "cache",
        "weight_circuits": "cache",
        "massive_activations": "cache",
        "attention_entropy": "pass",
    }
    assert added.reused_measurements and len(forwards) == DISCOVERY + BATCHES  # one pass, for it
    _, a = read_run(tmp_path / "first")
    _, b = read_run(tmp_path / "added")
    for column in ("sel_induction", "pr", "value_norm_ratio", "ov_copying"):
        np.testing.assert_equal([r[column] for r in a], [r[column] for r in b])

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(checkpoints, "load_model", no_model)
    dropped = analyse(compose_config([*base, "~measures.prefix_matching"]), tmp_path / "dropped")
    assert dropped.measure_sources == {
        "sink_importance": "cache",
        "icl": "cache",
        "repeat_loss": "cache",
        "training_copy_loss": "cache",
        "value_drain": "cache",
        "weight_circuits": "cache",
        "massive_activations": "cache",
    }
    _, c = read_run(tmp_path / "dropped")
    assert "prefix_matching" not in c[0] and [r["ov_copying"] for r in c] == [r["ov_copying"] for r in a]
    with pytest.raises(AssertionError, match="the model was loaded"):  # another setting is another entry
        analyse(compose_config([*base, "measures.weight_circuits.copying=0.9"]), tmp_path / "copying")


@pytest.mark.parametrize(
    "override, says",
    [
        (
            "measures=[default,entropy]",
            "measures=entropy is invalid: no such preset in conf/measures; use one of attention_entropy, default",
        ),
        ("+measures.nothing={}", "measures.nothing: no such measure"),
        ("measures.weight_circuits.copying=2", "measures.weight_circuits: copying=2.0"),
        ("+measures.weight_circuits.level=1", "measures.weight_circuits.level: weight_circuits has no such setting"),
        ("measures=[default,attention_entropy]", None),
        ("+measures.head_entropy._target_=tests.helpers.nowhere.MEASURE", "measures.head_entropy._target_="),
        ("+measures.other._target_=tests.helpers.user_measure.MEASURE", "is the measure 'head_entropy'"),
    ],
)
def test_a_bad_measure_or_setting_is_one_line_before_any_weights_load(override, says):
    """Hydra refuses a preset conf/measures lacks; ``measures.chosen`` (which ``validate`` calls before any
    weights load) the rest."""
    with pytest.raises(UsageError, match="block=0: must be >= 1" if says is None else says):
        cfg = compose_config([override, "measures.attention_entropy.block=0"] if says is None else [override])
        measures.chosen(cfg.measures)


def test_the_command_line_refuses_an_unknown_measure_in_one_line(tmp_path):
    done = run_cli("+measures.entropy.block=8", f"hydra.run.dir={tmp_path / 'run'}", *SMALL_RUN)
    assert done.returncode == 2
    assert last_line(done.stderr) == (
        "error: measures.entropy: no such measure; use one of sink_importance, icl, repeat_loss, training_copy_loss, "
        "value_drain, prefix_matching, weight_circuits, massive_activations, attention_entropy, llc "
        "(or give your own with measures.entropy._target_=<module.MEASURE>)"
    )
    assert not (tmp_path / "run").exists()
