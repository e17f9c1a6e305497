"""Every preset family end to end against the Hub twin (``tests/helpers/hub_twin.py``: the seven
repositories laid out as the real ones are, with tiny weights): ``revisions --check`` finds exactly
the planted defects; a sweep over a few branches reads each revision in its published format and
downloads only what the run reads; refinement and the report run on the sweep; a hostile pickle and
``model.weights_format=safetensors`` on a pickle-only branch end in one line."""

import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from emergence.hub.weights import fingerprint
from tests.helpers.cli import last_line, run_cli

QUICK = [
    "probe=quick",
    "probe.n_sequences=16",
    "probe.seq_len=64",
    "probe.vocab_high=500",
    "model.dtype=float32",
    "ablate.enabled=false",
    "wandb.mode=disabled",
]
WORDS = [f"w{i}" for i in range(300)]  # the twin's word-level tokenizer: ids 3..302

# Per family: the branches a sweep analyses, whether it runs the text probe with the checkpoint's
# tokenizer, and its extra overrides. Amber's and CRFM's branches carry no tokenizer (main's is
# read), olmo2's second branch is the olmo_1124 config; CRFM's sweep is over panel revisions
# (r2, r3, r4), of which checkpoint-300 duplicates checkpoint-1000.
SWEEPS = {
    "pythia": (["step1", "step512", "step1000"], True, []),
    "olmo": (["step1000-tokens2B", "step2000-tokens4B", "step5000-tokens10B"], False, []),
    "olmoe": (["step5000-tokens20B", "step10000-tokens41B", "step25000-tokens104B"], False, []),
    "olmo2": (["stage1-step1000-tokens3B", "stage1-step3000-tokens7B", "stage1-step10000-tokens21B"], True, []),
    "amber": (["ckpt_001", "ckpt_002", "ckpt_004"], True, []),
    "smollm2": (["step-20000", "step-40000", "step-80000"], True, []),
    "crfm_gpt2": (["checkpoint-100", "checkpoint-300", "checkpoint-1000"], False, ["model.tokens_per_step=1000"]),
}
# What a run may download of a revision besides its config and weight files: the tokenizer (first token, text probe).
TOKENIZER = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """Documents over the tokenizer's words, Zipf-like (a window's last word often occurred before)."""
    rs = np.random.RandomState(0)
    weights = 1 / np.arange(1, len(WORDS) + 1)
    docs = [" ".join(rs.choice(WORDS, size=rs.randint(20, 120), p=weights / weights.sum())) for _ in range(200)]
    path = tmp_path_factory.mktemp("text") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def cached_files(hub_cache: Path, repo_id: str) -> dict[str, set[str]]:
    """{revision: the files its snapshot in the Hugging Face cache holds (paths, folders included)}."""
    root = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commits = {(root / "refs" / ref).read_text(): ref for ref in os.listdir(root / "refs")}
    return {
        commits[s.name]: {str(p.relative_to(s)) for p in s.rglob("*") if not p.is_dir()}
        for s in (root / "snapshots").iterdir()
    }


@pytest.mark.slow
def test_check_reports_exactly_the_planted_defects_and_downloads_no_weights(hub_twin, tmp_path):
    for family, repo in hub_twin.repos.items():
        cache = tmp_path / family
        res = run_cli(
            family, "--check", "--all", "--json", module="emergence.revisions", env=hub_twin.env(cache), timeout=300
        )
        assert res.returncode == (1 if repo.planted else 0), res.stderr[-2000:]
        branches = json.loads(res.stdout)["branches"]
        assert list(branches) == repo.branches
        assert {b: v["line"] for b, v in branches.items() if v["verdict"] != "ok"} == repo.planted, family
        # the fingerprints come from the tree API's LFS sha256; only configs are downloaded
        assert {b: v["weights_sha256"] for b, v in branches.items() if repo.weight_sha256[b]} == {
            b: fingerprint(sha) for b, sha in repo.weight_sha256.items() if sha and b != "main"
        }
        assert set().union(*cached_files(cache, repo.repo_id).values()) <= {"config.json"}
    text = run_cli(
        "pythia",
        "--check",
        "step0",
        "step1",
        "step512",
        module="emergence.revisions",
        env=hub_twin.env(tmp_path / "text"),
    )
    assert text.stdout.splitlines() == [
        "step0    duplicate of step1",
        "step1    ok",
        "step512  ok",
        "# 2 of 3 branches of EleutherAI/pythia-1b ok",
    ]


def expected_tokenizer(repo, branch: str) -> str:
    """The revision whose tokenizer the text probe reads: the branch's, main's, or the first branch's with one."""
    if branch in repo.tokenizer_branches:
        return branch
    return (
        "main" if "main" in repo.tokenizer_branches else next(b for b in repo.branches if b in repo.tokenizer_branches)
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", list(SWEEPS))
def test_a_sweep_refinement_and_report_of_each_family_read_its_real_layout(family, hub_twin, text_file, tmp_path):
    repo = hub_twin.repos[family]
    branches, text, extra = SWEEPS[family]
    env = {**hub_twin.env(tmp_path / "hub"), "EMERGENCE_CACHE": str(tmp_path / "emergence")}
    probe = (
        [
            "probe=text",
            f"probe.text_file={text_file}",
            "probe.icl_positions=[5,50]",
            "probe.batch_size=8",
            "probe.n_sequences=16",
            "probe.seq_len=64",
        ]
        if text
        else []
    )
    sweep = tmp_path / "sweep"
    revisions = (
        ["revision=custom", f"revision.name={','.join(branches)}"] if family != "crfm_gpt2" else ["revision=r2,r3,r4"]
    )  # the panel's checkpoint-100, checkpoint-300 and checkpoint-1000
    res = run_cli("-m", f"model={family}", *revisions, *QUICK, *probe, *extra, f"hydra.sweep.dir={sweep}", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = {s["revision"]: s for s in (json.loads(p.read_text()) for p in sweep.rglob("summary.json"))}
    assert set(summaries) == set(branches)
    for branch, summary in summaries.items():
        assert summary["weights_sha256"] == fingerprint(repo.weight_sha256[branch])  # the LFS sha256 of its weights
        if repo.planted.get(branch, "").startswith("duplicate of"):
            assert summary["duplicate_of"] == repo.planted[branch].removeprefix("duplicate of ")
            continue
        assert summary["architecture"] == repo.model_type and summary["name_or_path"] == repo.repo_id
        assert summary["model_type_mapped_from"] == (
            "olmo_1124" if "olmo_1124" in repo.planted.get(branch, "") else None
        )
        if text:
            assert summary["measures"]["icl"]["tokenizer"] == f"{repo.repo_id}@{expected_tokenizer(repo, branch)}"
    # only the config, the weight files of the format read, and the tokenizer (probe.first_token=auto reads
    # whether it puts a BOS first; the text probe encodes with it) were downloaded
    for revision, files in cached_files(tmp_path / "hub", repo.repo_id).items():
        weight_files = {
            f for f in repo.files[revision] if f in repo.weight_sha256[revision] or f.endswith(".index.json")
        }
        if revision in branches and not repo.planted.get(revision):
            assert weight_files <= files, (revision, files)
        assert files <= {"config.json", *weight_files, *TOKENIZER}, (revision, files)
        read_format = ".safetensors" if any(f.endswith(".safetensors") for f in files) else ".bin"
        assert not any(f.endswith((".bin", ".safetensors")) and not f.endswith(read_format) for f in files)

    # offline, the check reads the cached snapshots' blob names: the same fingerprints
    analysed = [b for b in branches if "duplicate_of" not in summaries[b]]
    offline = run_cli(
        family, "--check", *analysed, "--json", module="emergence.revisions", env={**env, "HF_HUB_OFFLINE": "1"}
    )
    assert {b: v["weights_sha256"] for b, v in json.loads(offline.stdout)["branches"].items()} == {
        b: summaries[b]["weights_sha256"] for b in analysed
    }, offline.stderr[-2000:]

    res = run_cli(sweep, module="emergence.refine", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    refined = json.loads((sweep / "refined.json").read_text())
    duplicates = {b for b, v in repo.planted.items() if v.startswith("duplicate")}
    panel_name = family + ("-text" if text else "")  # the report's and refinement's name of the panel
    for answer in refined[panel_name].values():
        assert not set(answer["interval"] or ()) & duplicates and not set(answer["evaluated"]) & duplicates

    res = run_cli(
        sweep, "--out", tmp_path / "report", "--wandb-mode", "disabled", module="emergence.report", env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((tmp_path / "report" / "findings.json").read_text())
    assert [r["revision"] for r in findings["models"][panel_name]["revisions"]] == [
        b for b in branches if b not in duplicates
    ]
    assert findings["defective_checkpoints"] == (
        {repo.repo_id: {b: repo.planted[b] for b in branches if b in repo.planted}}
        if any(b in repo.planted for b in branches)
        else {}
    )


def test_a_branch_holding_another_checkpoints_shard_fails_its_job_in_one_line(hub_twin, tmp_path):
    """Amber's ckpt_128 carries ckpt_358's first shard (the pythia#206 pattern): its job fails naming
    that branch, before anything of it is downloaded; the other job is analysed."""
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        "model=amber",
        "revision=custom",
        "revision.name=ckpt_128,ckpt_358",
        *QUICK,
        f"hydra.sweep.dir={sweep}",
        env={**hub_twin.env(tmp_path / "hub"), "EMERGENCE_CACHE": str(tmp_path / "emergence")},
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    failed = list(sweep.rglob("FAILED"))
    assert [f.read_text() for f in failed] == [
        "error: revision=ckpt_128 of LLM360/Amber is defective: foreign shard pytorch_model-00001-of-00003.bin from "
        "ckpt_358 (python -m emergence.revisions amber --repo LLM360/Amber --check); leave it out of the sweep\n"
    ]
    assert [json.loads(p.read_text())["revision"] for p in sweep.rglob("summary.json")] == ["ckpt_358"]
    assert set(cached_files(tmp_path / "hub", "LLM360/Amber")["ckpt_128"]) == {"config.json"}  # the check's


def test_a_pickle_that_calls_code_ends_in_one_line_and_never_runs(tmp_path):
    """A .bin whose pickle would create a file (``__reduce__``): torch's restricted unpickler refuses it."""
    from tests.helpers.tiny_models import tiny_model

    marker = tmp_path / "PWNED"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    model = tiny_model("gpt_neox")
    ckpt = tmp_path / "ckpt"
    model.config.save_pretrained(ckpt)
    torch.save({**model.state_dict(), "hostile": Hostile()}, ckpt / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError):  # the pickle really calls code: the guard is what stops it
        torch.load(ckpt / "pytorch_model.bin", weights_only=True)
    run = tmp_path / "run"
    res = run_cli(
        "model=local", f"model.name_or_path={ckpt}", *QUICK, f"hydra.run.dir={run}", env={"WANDB_MODE": "disabled"}
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert last_line(res.stderr) == (
        f"error: model.name_or_path='{ckpt}' cannot be loaded: pytorch_model.bin is refused: its pickle would call "
        "code (global posix.system), which weights_only=True never runs; use a checkpoint in safetensors, or one "
        "from a source you trust"
    )
    assert not marker.exists() and not run.exists()


def test_weights_format_safetensors_refuses_a_pickle_only_branch(hub_twin, tmp_path):
    run = tmp_path / "run"
    res = run_cli(
        "model=pythia",
        "revision=custom",
        "revision.name=step512",
        "model.weights_format=safetensors",
        *QUICK,
        f"hydra.run.dir={run}",
        env={**hub_twin.env(tmp_path / "hub"), "EMERGENCE_CACHE": str(tmp_path / "emergence")},
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and not run.exists()
    assert last_line(res.stderr) == (
        "error: model.weights_format=safetensors refuses EleutherAI/pythia-1b@step512: it holds only pickled weights "
        "(pytorch_model.bin); use model.weights_format=auto to read them through torch's restricted unpickler "
        "(weights_only=True)"
    )
    files = cached_files(tmp_path / "hub", "EleutherAI/pythia-1b")
    assert "pytorch_model.bin" not in set().union(*files.values())


def test_a_task_on_a_step_branch_reads_mains_tokenizer_and_refuses_a_name_it_splits(hub_twin, tmp_path):
    """probe=ioi on Amber's ckpt_001, which carries no tokenizer: the task's batch is built on main's (as the
    text probe's is), whose words are w0..w299, so the study's first name is not one token: with the study's
    words (probe.task_words=study), one line naming the word and the tokenizer, exit 2, no run directory."""
    run = tmp_path / "run"
    res = run_cli(
        "model=amber",
        "revision=custom",
        "revision.name=ckpt_001",
        "probe=ioi",
        "probe.task_words=study",
        *QUICK[1:],
        f"hydra.run.dir={run}",
        env={**hub_twin.env(tmp_path / "hub"), "EMERGENCE_CACHE": str(tmp_path / "emergence")},
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and not run.exists()
    line = last_line(res.stderr)
    assert re.fullmatch(
        r"error: ioi: ' [A-Z][a-z]+' is (the unknown token|\d+ tokens) in the tokenizer .+, not one "
        r"token; run ioi with a model whose tokenizer has it as one token, or leave ioi out",
        line,
    ), line
    files = cached_files(tmp_path / "hub", "LLM360/Amber")
    assert TOKENIZER & set(files["main"]) and not TOKENIZER & set(files["ckpt_001"])  # main's tokenizer was read
