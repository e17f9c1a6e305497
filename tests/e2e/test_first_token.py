"""``probe.first_token`` on tiny models: a model whose tokenizer puts a BOS before every input reads its
synthetic probes behind that BOS under ``auto`` (the batch otherwise the study's), the study's batch under
``random`` (with a warning), and a report refuses a panel whose runs differ in it."""

import logging
import shutil

import numpy as np
import pytest
import torch

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.main import analyse
from emergence.panel.runs import load_runs
from emergence.recipe.probe import baseline_positions, make_probe_batch, make_repeat_batch
from emergence.recipe.screen import CLASSES, selectivity
from emergence.run.results import read_run
from tests.helpers.hub_twin import save_tokenizer
from tests.helpers.reference_impl import eager_model, eager_targets

BOS_ID = 1  # save_tokenizer's "<s>", which its post-processor puts before every input
SMALL = [
    "probe=paper",
    "probe.n_sequences=16",
    "probe.seq_len=64",
    "probe.vocab_low=10",
    "probe.vocab_high=300",
    "probe.batch_size=8",
    "ablate.enabled=false",
    "wandb.mode=disabled",
    "reuse=false",
]


@pytest.fixture(scope="module")
def bos_model_dir(tiny_dirs, tmp_path_factory):
    """A tiny llama whose folder also holds a tokenizer that prepends ``<s>`` (a model trained behind a BOS)."""
    directory = tmp_path_factory.mktemp("bos") / "llama"
    shutil.copytree(tiny_dirs["llama"], directory)
    save_tokenizer(directory)
    return directory


def _run(directory, tmp_path, *overrides):
    cfg = compose_config(["model=local", f"model.name_or_path={directory}", *SMALL, *overrides])
    return analyse(cfg, tmp_path)


def test_auto_puts_the_tokenizers_bos_first_and_keeps_the_rest_of_the_study_batch(bos_model_dir, tmp_path):
    summary = _run(bos_model_dir, tmp_path)
    first = summary.probe.first
    assert (first.kind, first.bos_id) == ("bos_token", BOS_ID)
    assert "puts '<s>' (id 1) before every input" in first.reason
    with np.load(tmp_path / "per_sequence.npz") as npz:
        tokens = npz["tokens"]
    study = make_probe_batch(16, 64, 10, 300, 42).tokens.numpy()
    assert (tokens[:, 0] == BOS_ID).all() and (tokens[:, 1:] == study[:, 1:]).all()
    # the selectivities are those of an eager pass over that batch
    _, rows = read_run(tmp_path)
    study_batch = make_probe_batch(16, 64, 10, 300, 42)
    eager = eager_targets(
        eager_model(bos_model_dir), torch.from_numpy(tokens), study_batch.ab.numpy(), baseline_positions(64, 50)
    )
    sel = selectivity(eager.mean(0))
    for r in rows:
        np.testing.assert_allclose([r[f"sel_{c}"] for c in CLASSES], sel[r["layer"], r["head"]], rtol=2e-3)


def test_the_repeat_probe_follows_it_too(bos_model_dir, tmp_path):
    _run(
        bos_model_dir,
        tmp_path,
        "probe=repeat",
        "probe.n_sequences=8",
        "probe.seq_len=64",
        "probe.vocab_low=10",
        "probe.vocab_high=300",
    )
    with np.load(tmp_path / "per_sequence.npz") as npz:
        tokens = npz["tokens"]
    drawn = make_repeat_batch(8, 64, 10, 300, 42).tokens.numpy()
    assert (tokens[:, 0] == BOS_ID).all() and (tokens[:, 1:] == drawn[:, 1:]).all()


def test_random_keeps_the_study_batch_and_warns_once(bos_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        summary = _run(bos_model_dir, tmp_path, "probe.first_token=random")
    assert summary.probe.first.kind == "random"
    assert summary.probe.fingerprint == make_probe_batch(16, 64, 10, 300, 42).fingerprint()
    warnings = [r.message for r in caplog.records if "probe.first_token=random" in r.message]
    assert len(warnings) == 1 and "puts '<s>' before every input" in warnings[0]


def test_a_model_without_a_tokenizer_reads_random_and_cannot_be_asked_for_bos(tiny_dirs, tmp_path):
    summary = _run(tiny_dirs["llama"], tmp_path / "auto")
    assert summary.probe.first.kind == "random" and "holds no tokenizer files" in summary.probe.first.reason
    assert summary.probe.fingerprint == make_probe_batch(16, 64, 10, 300, 42).fingerprint()
    with pytest.raises(UsageError, match="probe.first_token=bos_token is invalid"):
        _run(tiny_dirs["llama"], tmp_path / "bos", "probe.first_token=bos_token")


def test_the_report_refuses_a_panel_whose_runs_differ_in_first_token(bos_model_dir, tmp_path):
    for revision, first in (("step1", "bos_token"), ("step2", "random")):
        cfg = compose_config(
            [
                "model=local",
                f"model.name_or_path={bos_model_dir}",
                *SMALL,
                f"probe.first_token={first}",
                "model.key=bosmodel",
            ]
        )
        cfg.revision.name, cfg.revision.index = revision, None
        cfg.model.revision_pattern = r"step(?P<step>\d+)"
        cfg.model.tokens_per_step = 1000
        analyse(cfg, tmp_path / revision)
    with pytest.raises(ValueError, match=r"differ in their first token \(bos_token: step1; random: step2\)"):
        load_runs([tmp_path])
