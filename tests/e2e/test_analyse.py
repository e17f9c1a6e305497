"""The whole pipeline on tiny models: through Hydra's compose API, and as a subprocess."""

import csv
import hashlib
import json
import math
from collections import Counter

import numpy as np
import pytest

from emergence import measures
from emergence.core.config import compose_config
from emergence.main import analyse
from emergence.recipe.probe import baseline_positions, make_probe_batch
from emergence.recipe.screen import CLASSES, selectivity
from emergence.run.results import HEAD_COLUMNS, SCHEMA_VERSION, read_run
from tests.helpers.cli import SMALL_RUN, last_line, run_cli
from tests.helpers.reference_impl import (
    eager_model,
    eager_sink_importance,
    eager_targets,
    entropy_rank_svd,
    head_outputs_at_last,
    pr_centred_cov,
    reference_weight_circuits,
)
from tests.helpers.tiny_models import ARCHS


def compose_cfg(overrides):
    return compose_config(overrides)


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_csv_agrees_with_an_independent_eager_implementation(arch, tiny_dirs, tmp_path):
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_dirs[arch]}", *SMALL_RUN])
    summary = analyse(cfg, tmp_path)
    _, rows = read_run(tmp_path)
    chosen = [c.measure for c in measures.chosen(cfg.measures)]  # the default measures, in their order
    assert list(rows[0]) == [*HEAD_COLUMNS, *(c.name for c in measures.columns(chosen))] and len(rows) == 2 * 4

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
    circuits = reference_weight_circuits(model, arch)  # the weight-circuit measure (``measures.weight_circuits``)
    for name, grid in circuits.items():
        np.testing.assert_allclose(
            [[r[name] for r in rows if r["layer"] == l] for l in range(2)], grid, rtol=1e-7, err_msg=name
        )
    assert summary.measures["weight_circuits"] == {"copying_heads": float((circuits["ov_copying"] >= 0.5).sum())}
    assert summary.architecture == arch
    assert summary.n_layers == 2 and summary.n_heads == 4 and summary.head_dim == x.shape[-1]
    sinks = summary.measures["sink_importance"]
    assert sinks["epsilon"] == 0.3
    assert abs(sinks["fraction"] - (importance > 0.3).mean()) <= 1 / importance.size  # one flip at most
    assert sinks["fraction_ci"][0] <= sinks["fraction"] <= sinks["fraction_ci"][1]
    assert len(sinks["per_layer"]) == 2


def test_summary_fields_and_ablation_of_a_forced_circuit(tiny_dirs, tmp_path):
    model = ["model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", *SMALL_RUN]
    # A circuit threshold of 1e-6 puts every head in the circuit: no matched control can exist.
    analyse(compose_cfg([*model, "threshold.circuit=1e-6"]), tmp_path / "all")
    summary = json.loads((tmp_path / "all" / "summary.json").read_text())
    for key in (
        "model",
        "name_or_path",
        "revision",
        "step",
        "tokens",
        "architecture",
        "n_layers",
        "n_heads",
        "head_dim",
        "dtype",
        "probe",
        "thresholds",
        "class_counts",
        "bos_fraction",
        "bos_per_layer",
        "induction_circuit",
        "ablation",
        "timings",
        "versions",
    ):
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

    # A threshold just above each layer's third-best induction head: at most 2 of 4 per layer. Every
    # head of this random model is near 1x, so all would be near-circuit heads at the default
    # control_exclude (0.5): at 1 none is, and the other heads of each layer are the controls.
    third = max(sorted((r["sel_induction"] for r in rows if r["layer"] == l), reverse=True)[2] for l in range(2))
    analyse(
        compose_cfg([*model, f"threshold.circuit={third * 1.0001}", "ablate.mode=mean", "ablate.control_exclude=1"]),
        tmp_path / "some",
    )
    ab = json.loads((tmp_path / "some" / "summary.json").read_text())["ablation"]
    summary = json.loads((tmp_path / "some" / "summary.json").read_text())
    per_layer = Counter(int(h[1:].split("H")[0]) for h in summary["induction_circuit"])
    distinct = math.prod(math.comb(4 - k, k) for k in per_layer.values())  # other heads of each layer
    assert ab["mode"] == "mean" and ab["control_draw"]["set_aside"] == []
    assert ab["control_draw"]["in_layer"] == min(5, distinct)
    assert [c["drawn"] for c in ab["controls"]][: min(5, distinct)] == ["in-layer"] * min(5, distinct)
    widened = ab["control_draw"]["fallback"] if distinct < 3 else 0  # the fallback widens below 3 sets only
    assert len(ab["controls"]) == min(5, distinct) + widened
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
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL_RUN, "threshold.circuit=1e9"])
    summary = analyse(cfg, tmp_path)
    assert summary.induction_circuit == []
    assert summary.ablation.circuit is None and "empty" in summary.ablation.note
    assert summary.ablation.clean.loss > 0


@pytest.mark.slow
def test_cli_end_to_end_with_wandb_offline(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    res = run_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['olmoe']}",
        "probe=quick",
        "probe.n_sequences=24",
        "probe.seq_len=64",
        "probe.vocab_low=10",
        "probe.vocab_high=500",
        "wandb.mode=offline",
        f"hydra.run.dir={out}",
        env={"WANDB_DIR": str(tmp_path)},
    )
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
    (["probe.seq_len=4096", "probe.fit=off"], "probe.seq_len"),  # probe.fit=auto would fit it to the model
    (["probe.seq_len=64", "probe.vocab_high=100000", "probe.fit=off"], "probe.vocab_high"),
    (["ablate.n_controls=2"], "ablate.n_controls"),
    (["ablate.causal_factor=0"], "ablate.causal_factor"),
    (["ablate.control_exclude=0"], "ablate.control_exclude"),
    (["ablate.control_exclude=1.5"], "ablate.control_exclude"),
    (["threshold.per_class.bos=-1"], "threshold.per_class.bos"),
]


@pytest.mark.slow
@pytest.mark.parametrize("overrides,field", BAD)
def test_bad_configuration_exits_2_with_one_line(overrides, field, tiny_dirs, tmp_path):
    out = tmp_path / "run"
    res = run_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        "wandb.mode=disabled",
        f"hydra.run.dir={out}",
        *overrides,
    )
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
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_bloom(tmp_path / 'bloom')}", *SMALL_RUN])
    with pytest.raises(UsageError, match="'bloom' is not supported.*AttentionInterface.*llama"):
        analyse(cfg, tmp_path)
    assert not (tmp_path / "summary.json").exists()
    unknown = tmp_path / "unknown"  # a model type transformers has never heard of
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "zz_new_model", "architectures": ["ZzForCausalLM"]}')
    cfg = compose_cfg(["model=local", f"model.name_or_path={unknown}", *SMALL_RUN])
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
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_bloom(tmp_path / 'bloom')}", *SMALL_RUN])
    from emergence.core.errors import UsageError

    with pytest.raises(UsageError):  # from the config alone: from_pretrained is never reached
        analyse(cfg, tmp_path / "run")


@pytest.mark.slow
def test_unsupported_architecture_cli_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    res = run_cli(
        "model=local",
        f"model.name_or_path={tiny_bloom(tmp_path / 'bloom')}",
        "probe=quick",
        "wandb.mode=disabled",
        f"hydra.run.dir={out}",
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len([l for l in lines if l.startswith("error:")]) == 1 and "'bloom'" in lines[-1]
    assert not (out / "heads.csv").exists() and not (out / "summary.json").exists()


def test_ablating_a_chosen_head_set(tiny_dirs, tmp_path):
    cfg = compose_cfg(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL_RUN, "ablate.heads=[L1H2]"])
    summary = analyse(cfg, tmp_path)
    ab = summary.ablation
    assert ab.heads == ["L1H2"]
    assert sorted(c.heads for c in ab.controls) == [["L1H0"], ["L1H1"], ["L1H3"]]  # all 3 that exist
    from emergence.core.errors import UsageError

    with pytest.raises(UsageError, match="ablate.heads='L9H0'"):
        analyse(
            compose_cfg(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL_RUN, "ablate.heads=[L9H0]"]),
            tmp_path / "bad",
        )


def test_a_layer_full_of_ablated_heads_gets_a_verdict_against_fallback_controls(
    tiny_dirs, tmp_path, caplog, monkeypatch
):
    """Every head of the last layer ablated: no control fits in that layer, so the fallback draws
    the set from the layer below (all its 4 heads: the one set there is), and the verdict is
    against it; the summary and the printed lines say so. The printed verdict line is over the
    same sequences as summary.json's numbers: the adaptive run is made to stop at its first look
    (8 of 64 sequences), where the clean loss differs from the whole probe's."""
    import logging
    import re

    from emergence.recipe import ablation

    monkeypatch.setattr(ablation.verdict, "decided", lambda interval: True)
    full = [f"L1H{h}" for h in range(4)]
    cfg = compose_cfg(
        [
            "model=local",
            f"model.name_or_path={tiny_dirs['olmo']}",
            *SMALL_RUN,
            "probe.n_sequences=64",
            f"ablate.heads=[{','.join(full)}]",
            "ablate.min_sequences=8",
        ]
    )
    with caplog.at_level(logging.INFO, logger="emergence.main"):
        analyse(cfg, tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    ab = data["ablation"]
    assert [c["heads"] for c in ab["controls"]] == [["L0H0", "L0H1", "L0H2", "L0H3"]]
    assert [c["drawn"] for c in ab["controls"]] == ["fallback"]
    draw = ab["control_draw"]
    assert (draw["asked"], draw["in_layer"], draw["fallback"], draw["fallback_layers"]) == (5, 0, 1, {"L1": "L0"})
    assert draw["note"] == "0 distinct in-layer sets exist; the verdict rests on 1 (fewer than 3)"
    assert ab["effect"]["causal"] is not None and ab["interval"] is not None  # a verdict, against that set
    assert ab["sequences_used"] == 8 and round(ab["clean_loss_used"], 3) != round(ab["clean"]["loss"], 3)
    printed = [r.getMessage() for r in caplog.records]
    line = next(m for m in printed if m.startswith("ablation ("))
    found = re.fullmatch(
        r"ablation \(zero, (\d+) sequences\): loss of B (\d+\.\d{3}) -> (\d+\.\d{3}) "
        r"\(([+-]\d+\.\d{3})\); controls ([+-]\d+\.\d{3}): (not )?causal at 3x",
        line,
    )
    assert found, line
    n, clean, ablated, rise, controls = found.groups()[:5]
    assert int(n) == ab["sequences_used"]
    assert float(clean) == round(ab["clean_loss_used"], 3) and float(ablated) == round(ab["circuit"]["loss"], 3)
    assert float(rise) == round(ab["effect"]["circuit_loss_increase"], 3)
    assert abs(float(ablated) - float(clean) - float(rise)) <= 0.0011  # the line adds up, to its rounding
    # the controls' rise over the same sequences: their mean loss there, from the per-set means
    control_rise = ab["controls"][0]["metrics"]["loss"] - ab["clean_loss_used"]
    assert float(controls) == round(control_rise, 3)
    assert (found.group(6) is None) == ab["effect"]["causal"]
    draw_line = next(m for m in printed if m.startswith("control sets: "))
    assert draw_line == (
        "control sets: 0 in-layer, 1 by the fallback (L1 -> L0), 5 asked; never a control "
        f"(induction >= 25x): {', '.join(draw['set_aside']) or 'none'}; {draw['note']}"
    )


def test_a_head_near_the_circuit_level_is_never_a_control_set_member(tiny_dirs, tmp_path):
    """The tiny model's own selectivities, read from a first run, plant the second run's circuit
    level: half of it falls between the most induction-selective layer-1 head (besides the ablated
    L1H2) and every other head, so that head alone is above half: set aside, named in the summary,
    in no control set, while the other two layer-1 heads (2 in-layer sets, widened by the fallback)
    are controls."""
    base = ["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL_RUN, "ablate.heads=[L1H2]"]
    analyse(compose_cfg(base), tmp_path / "first")
    _, rows = read_run(tmp_path / "first")
    sel = {(r["layer"], r["head"]): r["sel_induction"] for r in rows if (r["layer"], r["head"]) != (1, 2)}
    near = max((h for h in range(4) if h != 2), key=lambda h: sel[1, h])
    second = max(s for head, s in sel.items() if head != (1, near))
    assert second < sel[1, near]
    level = sel[1, near] + second  # half of it lies between them
    summary = analyse(compose_cfg([*base, f"threshold.circuit={level!r}"]), tmp_path / "second")
    ab = summary.ablation
    assert ab.control_draw.set_aside_level == pytest.approx(level / 2) and ab.control_draw.set_aside == [f"L1H{near}"]
    assert (ab.control_draw.in_layer, ab.control_draw.fallback, ab.control_draw.fallback_layers) == (2, 3, {"L1": "L0"})
    in_layer = sorted(c.heads for c in ab.controls if c.drawn == "in-layer")
    assert in_layer == [[f"L1H{h}"] for h in range(4) if h not in (2, near)]
    assert all(c.heads[0].startswith("L0") for c in ab.controls if c.drawn == "fallback")
