"""The whole pipeline on tiny models: through Hydra's compose API, and as a subprocess."""

import csv
import hashlib
import json
import math
from collections import Counter

import numpy as np
import pytest
from tests.helpers.cli import last_line, run_cli
from tests.helpers.reference_impl import (
    eager_model,
    eager_sink_importance,
    eager_targets,
    entropy_rank_svd,
    head_outputs_at_last,
    pr_centred_cov,
)
from tests.helpers.tiny_models import ARCHS

from emergence.core.config import compose_config
from emergence.main import analyse
from emergence.recipe.probe import baseline_positions, make_probe_batch
from emergence.recipe.screen import CLASSES, selectivity
from emergence.run.results import HEAD_COLUMNS, SCHEMA_VERSION, read_run

SMALL = ["probe=paper", "probe.n_sequences=32", "probe.seq_len=64", "probe.vocab_low=10",
         "probe.vocab_high=500", "probe.batch_size=8", "model.dtype=float32", "wandb.mode=disabled"]


def compose_cfg(overrides):
    return compose_config(overrides)


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_csv_agrees_with_an_independent_eager_implementation(arch, tiny_dirs, tmp_path):
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_dirs[arch]}", *SMALL])
    summary = analyse(cfg, tmp_path)
    _, rows = read_run(tmp_path)
    assert list(rows[0]) == HEAD_COLUMNS and len(rows) == 2 * 4

    batch = make_probe_batch(32, 64, 10, 500, 42)
    model = eager_model(tiny_dirs[arch])
    sel = selectivity(eager_targets(model, batch.tokens, batch.ab.numpy(), baseline_positions(64, 50)).mean(0))
    x = head_outputs_at_last(model, arch, batch.tokens, 4)
    importance = eager_sink_importance(model, batch.tokens)  # [n, layers, heads]
    for r in rows:
        l, h = r["layer"], r["head"]
        ours = np.array([r[f"sel_{c}"] for c in CLASSES])
        np.testing.assert_allclose(ours, sel[l, h], rtol=2e-3)
        assert r["sink_importance"] == pytest.approx(importance[:, l, h].mean(), abs=1e-5)
        assert r["pr"] == pytest.approx(pr_centred_cov(x[:, l, h]), rel=2e-2)
        assert r["pr_entropy_rank"] == pytest.approx(entropy_rank_svd(x[:, l, h]), rel=2e-2)
    assert summary.architecture == arch
    assert summary.n_layers == 2 and summary.n_heads == 4 and summary.head_dim == x.shape[-1]
    sinks = summary.sink_metric
    assert sinks.epsilon == 0.3
    assert abs(sinks.fraction - (importance > 0.3).mean()) <= 1 / importance.size  # one flip at most
    assert sinks.fraction_ci[0] <= sinks.fraction <= sinks.fraction_ci[1]
    assert len(sinks.per_layer) == 2


def test_summary_fields_and_ablation_of_a_forced_circuit(tiny_dirs, tmp_path):
    model = ["model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", *SMALL]
    # A circuit threshold of 1e-6 puts every head in the circuit: no matched control can exist.
    analyse(compose_cfg([*model, "threshold.circuit=1e-6"]), tmp_path / "all")
    summary = json.loads((tmp_path / "all" / "summary.json").read_text())
    for key in ("model", "name_or_path", "revision", "step", "tokens", "architecture", "n_layers", "n_heads",
                "head_dim", "dtype", "probe", "thresholds", "class_counts", "bos_fraction", "bos_per_layer",
                "induction_circuit", "ablation", "timings", "versions"):
        assert key in summary, key
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["model"] == "local" and summary["step"] is None
    weights = (tiny_dirs["gpt_neox"] / "model.safetensors").read_bytes()
    assert summary["weights_sha256"] == hashlib.sha256(weights).hexdigest()
    _, rows = read_run(tmp_path / "all")
    assert summary["induction_circuit"] == [f"L{r['layer']}H{r['head']}" for r in rows if r["sel_induction"] >= 1e-6]
    ab = summary["ablation"]
    assert ab["circuit"]["loss"] != ab["clean"]["loss"] and ab["controls"] == []
    assert "no control set" in ab["note"] and ab["effect"]["ratio"] is None

    # A threshold just above each layer's third-best induction head: at most 2 of 4 per layer.
    third = max(sorted((r["sel_induction"] for r in rows if r["layer"] == l), reverse=True)[2] for l in range(2))
    analyse(compose_cfg([*model, f"threshold.circuit={third * 1.0001}", "ablate.mode=mean"]), tmp_path / "some")
    ab = json.loads((tmp_path / "some" / "summary.json").read_text())["ablation"]
    summary = json.loads((tmp_path / "some" / "summary.json").read_text())
    per_layer = Counter(int(h[1:].split("H")[0]) for h in summary["induction_circuit"])
    distinct = math.prod(math.comb(4 - k, k) for k in per_layer.values())  # other heads of each layer
    assert ab["mode"] == "mean" and len(ab["controls"]) == min(5, distinct)
    assert len({tuple(r["heads"]) for r in ab["controls"]}) == len(ab["controls"])
    for block in (ab["clean"], ab["circuit"], *(r["metrics"] for r in ab["controls"])):
        assert set(block) == {"loss", "top1", "top5", "logit_b"}
    rises = [r["metrics"]["loss"] - ab["clean"]["loss"] for r in ab["controls"]]
    assert ab["effect"]["circuit_loss_increase"] == pytest.approx(ab["circuit"]["loss"] - ab["clean"]["loss"])
    assert ab["effect"]["controls_loss_increase_mean"] == pytest.approx(np.mean(rises))
    ci = ab["effect"]["intervals"]  # paired bootstrap over the same sequences (checked against scipy in test_stats)
    assert ci["circuit_loss_increase"][0] <= ci["circuit_loss_increase"][1] and 0 <= ci["p_causal"] <= 1
    assert (tmp_path / "some" / "classes.png").stat().st_size > 0


def test_empty_circuit_is_reported_not_an_error(tiny_dirs, tmp_path):
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL, "threshold.circuit=1e9"])
    summary = analyse(cfg, tmp_path)
    assert summary.induction_circuit == []
    assert summary.ablation.circuit is None and "empty" in summary.ablation.note
    assert summary.ablation.clean.loss > 0


@pytest.mark.slow
def test_cli_end_to_end_with_wandb_offline(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    res = run_cli("model=local", f"model.name_or_path={tiny_dirs['olmoe']}", "probe=quick", "probe.n_sequences=24",
                  "probe.seq_len=64", "probe.vocab_low=10", "probe.vocab_high=500", "wandb.mode=offline",
                  f"hydra.run.dir={out}", env={"WANDB_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"results: {out}" in res.stderr  # the run's report lines ...
    assert f"results: {out}" in (out / "main.log").read_text()  # ... are also in Hydra's job log
    with open(out / "heads.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert json.loads((out / "summary.json").read_text())["probe"]["n_sequences"] == 24
    assert list(tmp_path.glob("wandb/offline-run-*")), "an offline W&B run was recorded in $WANDB_DIR"
    assert not (out / "wandb").exists()


BAD = [
    (["threshold.class_default=0"], "threshold.class_default"),
    (["threshold.circuit=-5"], "threshold.circuit"),
    (["threshold.prev_token_circuit=0"], "threshold.prev_token_circuit"),
    (["probe.seq_len=40"], "probe.seq_len"),
    (["probe.seq_len=4096"], "probe.seq_len"),
    (["probe.seq_len=64", "probe.vocab_high=100000"], "probe.vocab_high"),
    (["ablate.n_controls=2"], "ablate.n_controls"),
    (["ablate.causal_factor=0"], "ablate.causal_factor"),
    (["threshold.per_class.bos=-1"], "threshold.per_class.bos"),
]


@pytest.mark.slow
@pytest.mark.parametrize("overrides,field", BAD)
def test_bad_configuration_exits_2_with_one_line(overrides, field, tiny_dirs, tmp_path):
    out = tmp_path / "run"
    res = run_cli("model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", "wandb.mode=disabled",
                  f"hydra.run.dir={out}", *overrides)
    assert res.returncode == 2
    last = last_line(res.stderr)
    assert last.startswith("error: ") and field in last
    assert "Traceback" not in res.stderr
    assert not out.exists()  # nothing written, not even Hydra's own files


def test_panel_index_out_of_range_and_unknown_architecture(tiny_dirs, tmp_path):
    from emergence.core.errors import UsageError

    cfg = compose_cfg(["model=pythia", "revision=r3"])
    cfg.revision.index = 10
    with pytest.raises(UsageError, match="revision.index=10"):
        analyse(cfg, tmp_path)
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_bloom(tmp_path / 'bloom')}", *SMALL])
    with pytest.raises(UsageError, match="'bloom' is not supported.*AttentionInterface.*llama"):
        analyse(cfg, tmp_path)
    assert not (tmp_path / "summary.json").exists()
    unknown = tmp_path / "unknown"  # a model type transformers has never heard of
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "zz_new_model", "architectures": ["ZzForCausalLM"]}')
    cfg = compose_cfg(["model=local", f"model.name_or_path={unknown}", *SMALL])
    with pytest.raises(UsageError, match="'zz_new_model' is not supported.*does not know it.*tested: .*llama") as err:
        analyse(cfg, tmp_path)
    assert "\n" not in str(err.value)


def tiny_bloom(path):
    """A BLOOM directory: its attention bypasses AttentionInterface (ALiBi inside the module)."""
    from transformers import BloomConfig, BloomForCausalLM

    BloomForCausalLM(BloomConfig(vocab_size=600, hidden_size=16, n_layer=1, n_head=2)).save_pretrained(path)
    return path


def test_unsupported_architecture_exits_2_before_loading_weights(tmp_path, monkeypatch):
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_bloom(tmp_path / 'bloom')}", *SMALL])
    from emergence.core.errors import UsageError

    with pytest.raises(UsageError):  # from the config alone: from_pretrained is never reached
        analyse(cfg, tmp_path / "run")


@pytest.mark.slow
def test_unsupported_architecture_cli_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    res = run_cli("model=local", f"model.name_or_path={tiny_bloom(tmp_path / 'bloom')}", "probe=quick",
                  "wandb.mode=disabled", f"hydra.run.dir={out}")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len([l for l in lines if l.startswith("error:")]) == 1 and "'bloom'" in lines[-1]
    assert not (out / "heads.csv").exists() and not (out / "summary.json").exists()


def test_ablating_a_chosen_head_set(tiny_dirs, tmp_path):
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL, "ablate.heads=[L1H2]"])
    summary = analyse(cfg, tmp_path)
    ab = summary.ablation
    assert ab.heads == ["L1H2"]
    assert sorted(c.heads for c in ab.controls) == [["L1H0"], ["L1H1"], ["L1H3"]]  # all 3 that exist
    from emergence.core.errors import UsageError

    with pytest.raises(UsageError, match="ablate.heads='L9H0'"):
        analyse(compose_cfg(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL,
                             "ablate.heads=[L9H0]"]), tmp_path / "bad")
