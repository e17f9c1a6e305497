import json

import pytest

from emergence.hub.revisions import between, parse_branches, propose_panel
from tests.helpers.cli import last_line, run_cli

PYTHIA_BRANCHES = [
    "main",
    "step0",
    *(f"step{2**k}" for k in range(10)),
    *(f"step{s}" for s in range(1000, 143001, 1000)),
]


def test_parse_branches_orders_by_step_and_skips_other_refs():
    entries = parse_branches(["main", "step2000-tokens4B", "step1000-tokens2B", "dev"], None, None)
    assert [(e.revision, e.step, e.tokens) for e in entries] == [
        ("step1000-tokens2B", 1000, 2 * 10**9),
        ("step2000-tokens4B", 2000, 4 * 10**9),
    ]
    pythia = parse_branches(PYTHIA_BRANCHES, r"step(?P<step>\d+)", 2_097_152)
    assert len(pythia) == 154 and pythia[-1].tokens == 143000 * 2_097_152


def test_propose_a_log_spaced_panel():
    entries = parse_branches(PYTHIA_BRANCHES, r"step(?P<step>\d+)", 2_097_152)
    panel = propose_panel(entries, 10, 2e6, 3e11)
    tokens = [e.tokens for e in panel]
    assert 8 <= len(panel) <= 10 and tokens == sorted(tokens)
    assert panel[0].revision == "step1" and panel[-1].revision == "step143000"
    ratios = [b / a for a, b in zip(tokens, tokens[1:])]
    assert max(ratios) < 8  # roughly log-spaced: no huge gaps


def test_between_two_revisions():
    entries = parse_branches(PYTHIA_BRANCHES, r"step(?P<step>\d+)", 2_097_152)
    found = between(entries, "step512", "step3000")
    assert [e.revision for e in found] == ["step1000", "step2000"]


def test_offline_listing_is_a_one_line_error():
    res = run_cli("olmo", module="emergence.revisions", env={"HF_HUB_OFFLINE": "1"}, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "needs the Hugging Face Hub" in last_line(res.stderr)


SMOLLM2_BRANCHES = ["main", *(f"step-{s}" for s in range(0, 2_000_001, 20_000))]


def test_a_preset_without_a_panel_proposes_one_from_the_hubs_branches_and_keeps_it(tmp_path, monkeypatch, capsys):
    from emergence.core.config import compose_config
    from emergence.hub import revisions
    from emergence.hub.checkpoints import resolve_revision

    monkeypatch.setattr(revisions, "list_branches", lambda repo: SMOLLM2_BRANCHES)
    cfg = compose_config(["model=smollm2", "revision=r0", f"cache_dir={tmp_path}"])
    first = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (first.name, first.step, first.tokens) == ("step-20000", 20_000, 20_000 * 1_048_576)
    printed = capsys.readouterr().out
    assert "proposed panel" in printed and "step-2000000" in printed
    kept = json.loads(revisions.panel_file(str(tmp_path), cfg.model.name_or_path).read_text())
    assert len(kept) == 10 and kept[-1]["revision"] == "step-2000000"
    steps = [e["step"] for e in kept]
    assert steps == sorted(steps) and max(b / a for a, b in zip(steps, steps[1:])) < 4  # log-spaced

    def offline(repo):
        raise ConnectionError("offline")

    monkeypatch.setattr(revisions, "list_branches", offline)  # the kept panel needs no Hub
    cfg.revision.index = 9
    assert resolve_revision(cfg.model, cfg.revision, cfg.cache_dir).name == "step-2000000"


def test_a_preset_without_a_panel_offline_names_the_propose_command(tmp_path, monkeypatch):
    from emergence.core.config import compose_config
    from emergence.core.errors import UsageError
    from emergence.hub.checkpoints import resolve_revision

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match="python -m emergence.revisions olmo2 --propose 10") as err:
        cfg = compose_config(["model=olmo2", "revision=r3", f"cache_dir={tmp_path}"])
        resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("given", ["/no/such/run", "./no-such-run", "~/no-such-run", "runs/no-such-run"])
def test_a_folder_that_is_not_there_is_named_as_one(given, capsys):
    """A path that names no directory is said to be one, not read as a preset's name (``model=<path>``)."""
    from emergence.hub.revisions import main

    with pytest.raises(SystemExit) as stop:
        main([given])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: python -m emergence.revisions: {given} is not a directory: give the folder")
