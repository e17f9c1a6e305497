"""A training run's folder of checkpoints as a model family (emergence/hub/series.py), and the probe fitted
to a model smaller than it (emergence/run/validation.py fit_probe), on a transformers Trainer run
(tests/helpers/trainer_run.py)."""

import json
import shutil

import pytest

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub import revisions
from emergence.hub.checkpoints import resolve_revision, source
from emergence.hub.revisions import discovered_panel, existing_checkpoints
from tests.helpers.cli import run_cli
from tests.helpers.trainer_run import SAVE_STEPS, STEPS, tokens_at

LOCAL = ["model=local"]


def cfg_of(folder, *overrides):
    return compose_config([*LOCAL, f"model.name_or_path={folder}", *overrides])


def test_each_trainer_checkpoint_has_its_step_and_tokens(trainer_run):
    entries = existing_checkpoints(cfg_of(trainer_run))
    steps = list(range(SAVE_STEPS, STEPS + 1, SAVE_STEPS))
    assert [e.revision for e in entries] == [f"checkpoint-{s}" for s in steps]
    assert [e.step for e in entries] == steps
    assert [e.tokens for e in entries] == [tokens_at(s) for s in steps]  # batch x sequence length per step
    for e in entries:  # and what the Trainer wrote
        state = json.loads((trainer_run / e.revision / "trainer_state.json").read_text())
        assert (e.step, e.tokens) == (state["global_step"], state["num_input_tokens_seen"])


def test_without_recorded_tokens_tokens_come_from_tokens_per_step_or_stay_unknown(trainer_run, tmp_path):
    run = tmp_path / "run"
    for name in ("checkpoint-10", "checkpoint-20"):
        shutil.copytree(trainer_run / name, run / name)
        state = json.loads((run / name / "trainer_state.json").read_text())
        state["num_input_tokens_seen"] = 0  # what a run without include_num_input_tokens_seen writes
        (run / name / "trainer_state.json").write_text(json.dumps(state))
    assert [e.tokens for e in existing_checkpoints(cfg_of(run))] == [None, None]
    assert [e.tokens for e in existing_checkpoints(cfg_of(run, "model.tokens_per_step=1000"))] == [10_000, 20_000]


def test_a_trainer_state_cut_mid_json_is_named_once_with_the_tokens_unknown(trainer_run, tmp_path, caplog):
    run = tmp_path / "run"
    for name in ("checkpoint-10", "checkpoint-20"):
        shutil.copytree(trainer_run / name, run / name)
    state = run / "checkpoint-20" / "trainer_state.json"
    state.write_text(state.read_text()[:40])  # the run was killed while writing it
    with caplog.at_level("WARNING"):
        for _ in range(2):  # a second listing (watch looks again) says nothing new
            entries = existing_checkpoints(cfg_of(run))
    assert [(e.revision, e.step, e.tokens) for e in entries] == [
        ("checkpoint-10", 10, tokens_at(10)),
        ("checkpoint-20", 20, None),
    ]
    named = [r.getMessage() for r in caplog.records if "trainer_state.json" in r.getMessage()]
    assert named == [
        f"warning: {state} does not parse (cut short, or still being written): step 20 from the folder's name, "
        "tokens unknown"
    ]


def test_step_folders_read_as_the_hub_families_branch_names(trainer_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trainer_run / "checkpoint-10", run / "step10", ignore=shutil.ignore_patterns("trainer_state.json"))
    shutil.copytree(trainer_run / "checkpoint-20", run / "step20-tokens3B")
    entries = existing_checkpoints(cfg_of(run))
    assert [(e.revision, e.step, e.tokens) for e in entries] == [
        ("step10", 10, None),
        ("step20-tokens3B", 20, 3 * 10**9),
    ]


def test_the_panel_is_ten_distinct_log_spaced_checkpoints_the_same_each_time(trainer_run):
    cfg = cfg_of(trainer_run)
    panel = discovered_panel(cfg.model, cfg.cache_dir)
    # targets 10 x 12^(k/9): 10, 13.2, 17.4, 22.9, 30.2, 39.8, 52.5, 69.2, 91.2, 120 tokens-per-512; each takes the
    # nearest checkpoint (in log) no earlier target took: 10, 20, 30, 40, 50, 60, 70, 80, 90, then 120
    assert [e.step for e in panel] == [10, 20, 30, 40, 50, 60, 70, 80, 90, 120]
    assert discovered_panel(cfg.model, cfg.cache_dir) == panel
    for k, entry in enumerate(panel):
        cfg = cfg_of(trainer_run, f"revision=r{k}")
        revision = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
        assert (revision.name, revision.step, revision.tokens) == (entry.revision, entry.step, tokens_at(entry.step))
    cfg = cfg_of(trainer_run, "revision=final")
    final = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (final.name, final.step) == ("checkpoint-120", 120)


def test_a_custom_revision_is_a_checkpoint_folder(trainer_run):
    cfg = cfg_of(trainer_run, "revision=custom", "revision.name=checkpoint-50")
    revision = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (revision.name, revision.step, revision.tokens) == ("checkpoint-50", 50, tokens_at(50))
    assert source(cfg.model, revision).path == str(trainer_run / "checkpoint-50")
    with pytest.raises(
        UsageError,
        match=r"revision.name='checkpoint-55' is invalid: .* nearest: checkpoint-50, "
        r"checkpoint-60",
    ):
        cfg = cfg_of(trainer_run, "revision=custom", "revision.name=checkpoint-55")
        resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)


def test_a_folder_of_one_checkpoint_works_as_before(trainer_run):
    cfg = cfg_of(trainer_run / "checkpoint-30")
    assert revisions.local_series(cfg.model) is None
    assert resolve_revision(cfg.model, cfg.revision, cfg.cache_dir).name is None
    with pytest.raises(UsageError, match="one checkpoint"):
        existing_checkpoints(cfg)


def test_a_folder_without_checkpoints_is_refused_in_one_line(tmp_path):
    (tmp_path / "logs").mkdir()
    with pytest.raises(UsageError, match=r"model.name_or_path=.* is invalid: it holds neither a checkpoint"):
        existing_checkpoints(cfg_of(tmp_path))


def test_revisions_lists_the_folder_with_its_panel_and_the_sweep(trainer_run):
    res = run_cli(trainer_run, module="emergence.revisions")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"# 12 checkpoint folders of {trainer_run}"
    assert lines[1:13] == [
        f"  - {{revision: checkpoint-{s}, step: {s}, tokens: {tokens_at(s)}}}" for s in range(10, 121, 10)
    ]
    assert lines[13].startswith("# its panel, revision=r0..r9: checkpoint-10, checkpoint-20,")
    assert lines[14] == f"python -m emergence -m model=local model.name_or_path={trainer_run} 'revision=glob(r*)'"
    between = run_cli(trainer_run, "--between", "checkpoint-20", "checkpoint-60", module="emergence.revisions")
    assert between.stdout.splitlines()[-1] == (
        f"python -m emergence -m model=local model.name_or_path={trainer_run} "
        "revision=custom revision.name=checkpoint-30,checkpoint-40,checkpoint-50"
    )


def test_check_names_missing_truncated_and_identical_weights(trainer_run, tmp_path):
    run = tmp_path / "run"
    for s in (10, 20, 30, 40, 50):
        shutil.copytree(trainer_run / f"checkpoint-{s}", run / f"checkpoint-{s}")
    (run / "checkpoint-20" / "model.safetensors").unlink()  # missing
    weights = run / "checkpoint-30" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # cut short
    shutil.copy(run / "checkpoint-50" / "model.safetensors", run / "checkpoint-40" / "model.safetensors")  # identical
    res = run_cli(run, "--check", *[f"checkpoint-{s}" for s in (10, 20, 30, 40, 50)], module="emergence.revisions")
    assert res.returncode == 1, res.stderr
    verdicts = dict(line.split(None, 1) for line in res.stdout.splitlines() if not line.startswith("#"))
    assert verdicts == {
        "checkpoint-10": "ok",
        "checkpoint-20": "no weights",
        "checkpoint-30": "truncated model.safetensors",
        "checkpoint-40": "duplicate of checkpoint-50",
        "checkpoint-50": "ok",
    }


def test_checkpoints_of_two_models_end_in_one_line_naming_two_of_them(trainer_run, tmp_path):
    run = tmp_path / "run"
    for s in (10, 20):
        shutil.copytree(trainer_run / f"checkpoint-{s}", run / f"checkpoint-{s}")
    config = json.loads((run / "checkpoint-20" / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (run / "checkpoint-20" / "config.json").write_text(json.dumps(config))
    for res in (
        run_cli(run, module="emergence.revisions"),
        run_cli(
            *LOCAL,
            f"model.name_or_path={run}",
            "revision=r0",
            "wandb.mode=disabled",
            f"hydra.run.dir={tmp_path / 'out'}",
        ),
    ):
        assert res.returncode == 2
        errors = [line for line in res.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].endswith(
            f"model.name_or_path='{run}' is invalid: its checkpoints are not one model: checkpoint-10 and "
            "checkpoint-20 differ (num_hidden_layers 2 vs 3); give the folder of one run"
        )


def test_the_probe_is_fitted_to_a_smaller_model_with_scaled_thresholds(trainer_run):
    from transformers import AutoConfig

    from emergence.run.validation import fit_probe, validate_for_model

    hf_config = AutoConfig.from_pretrained(trainer_run / "checkpoint-10")
    cfg = cfg_of(trainer_run, "threshold.per_class.bos=40")
    fitted, record = fit_probe(cfg, hf_config)
    # context 64 < 256, vocabulary 128 < 10000: seq_len and vocab_high become them, vocab_low half the vocabulary
    assert (fitted.probe.seq_len, fitted.probe.vocab_low, fitted.probe.vocab_high) == (64, 64, 128)
    assert record.fitted == {"seq_len": [256, 64], "vocab_high": [10000, 128], "vocab_low": [100, 64]}
    assert record.threshold_scale == 64 / 256
    assert record.thresholds == {
        "class_default": 30 * 64 / 256,
        "circuit": 50 * 64 / 256,
        "prev_token_circuit": 100 * 64 / 256,
        "per_class.bos": 40 * 64 / 256,
    }
    assert fitted.threshold.class_default == 7.5 and fitted.threshold.per_class.bos == 10.0
    validate_for_model(fitted, hf_config)  # the fitted probe fits
    off = cfg_of(trainer_run, "probe.fit=off")
    assert fit_probe(off, hf_config) == (off, None)
    with pytest.raises(UsageError, match=r"probe.seq_len=256 is invalid: the model's context is 64 tokens"):
        validate_for_model(off, hf_config)
    # a probe that already fits is left as it is
    small = cfg_of(trainer_run, "probe.seq_len=60", "probe.vocab_low=0", "probe.vocab_high=100")
    assert fit_probe(small, hf_config) == (small, None)


def test_probe_fit_takes_auto_or_off():
    from emergence.run.validation import validate

    with pytest.raises(UsageError, match=r"probe.fit='maybe' is invalid: use one of auto, off"):
        validate(compose_config(["probe.fit=maybe"]))
