"""The Hub twin (``hub_twin.py``) as a client sees it: one subprocess (HF_ENDPOINT is read when
huggingface_hub is imported) lists every repo's refs and every branch's files, reads the planted
config and downloads and loads the last branch and main of each family; the tests compare what
it saw with the TwinRepo records. Plus the records against the presets and the defect rule."""

import json
import os
import re
import subprocess
import sys
from itertools import combinations

import pytest
import yaml

from tests.helpers.hub_twin import LFS_SUFFIXES, OLMO1124, PRESETS, TwinRepo, is_weight_file

# The client's view of every repo, printed as JSON: {repo_id: {"refs": [...], "trees": {ref: {path:
# {"size", "sha256" (LFS) or None}}}, "configs": {branch: config.json}, "loads": {branch: loading info}}}.
SEE = r"""
import json, sys
from pathlib import Path
from huggingface_hub import HfApi, RepoFile, hf_hub_download, list_repo_refs, snapshot_download
from transformers import AutoModelForCausalLM

api, seen = HfApi(), {}
for repo_id, ask in json.load(sys.stdin).items():
    refs = sorted(b.name for b in list_repo_refs(repo_id).branches)
    trees = {ref: {f.path: {"size": f.size, "sha256": f.lfs.sha256 if f.lfs else None}
                   for f in api.list_repo_tree(repo_id, revision=ref, recursive=True) if isinstance(f, RepoFile)}
             for ref in refs}
    configs = {b: json.loads(Path(hf_hub_download(repo_id, "config.json", revision=b)).read_text())
               for b in ask["configs"]}
    loads = {}
    for branch, use_safetensors in ask["load"].items():
        local = snapshot_download(repo_id, revision=branch)
        _, info = AutoModelForCausalLM.from_pretrained(local, use_safetensors=use_safetensors, output_loading_info=True)
        loads[branch] = {k: sorted(map(str, info[k])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    seen[repo_id] = {"refs": refs, "trees": trees, "configs": configs, "loads": loads}
print(json.dumps(seen))
"""


def loaded(repo: TwinRepo) -> dict[str, bool]:
    """The branches the client loads: the last checkpoint branch and main (where it has weights),
    each with ``use_safetensors`` as its weight files say."""
    refs = [b for b in (repo.branches[-1], "main") if repo.weight_sha256[b] and b not in repo.planted]
    return {b: any(p.endswith(".safetensors") for p in repo.weight_sha256[b]) for b in refs}


@pytest.fixture(scope="module")
def seen(hub_twin, tmp_path_factory) -> dict[str, dict]:
    ask = {
        r.repo_id: {"configs": [OLMO1124] if r.family == "olmo2" else [], "load": loaded(r)}
        for r in hub_twin.repos.values()
    }
    env = {**os.environ, **hub_twin.env(tmp_path_factory.mktemp("twin-cache")), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", SEE], input=json.dumps(ask), capture_output=True, text=True, timeout=600, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:] + hub_twin.server.log_tail()
    return json.loads(res.stdout.splitlines()[-1])


def test_the_twin_follows_the_presets(hub_twin):
    """Real repo ids, branch names of the preset's pattern in step order, every panel branch."""
    for family, repo in hub_twin.repos.items():
        preset = yaml.safe_load((PRESETS / f"{family}.yaml").read_text())
        assert (repo.repo_id, repo.model_type) == (preset["name_or_path"], preset["architecture"])
        steps = [int(re.fullmatch(preset["revision_pattern"], b)["step"]) for b in repo.branches]
        assert steps == sorted(set(steps)) and 6 <= len(steps) <= 14, (family, repo.branches)
        panel = {entry["revision"] for entry in preset.get("panel", [])}
        assert panel <= set(repo.branches), (family, panel - set(repo.branches))
        assert set(repo.files) == set(repo.weight_sha256) == {*repo.branches, "main"}


def test_identical_weights_are_the_planted_defects_only(hub_twin):
    """Two branches share a weight file only where a defect is planted, and the earlier one
    carries the verdict: a whole checkpoint (duplicate of) or one shard (foreign shard)."""
    for repo in hub_twin.repos.values():
        shared = {}
        for a, b in combinations(repo.branches, 2):  # a before b
            common = {p for p, sha in repo.weight_sha256[a].items() if repo.weight_sha256[b].get(p) == sha}
            if common:
                shared[a] = (b, common)
        expected = {}
        for branch, (later, paths) in shared.items():
            whole = paths == repo.weight_sha256[branch].keys()
            expected[branch] = f"duplicate of {later}" if whole else f"foreign shard {min(paths)} from {later}"
        expected |= {b: "no weights" for b in repo.branches if not repo.weight_sha256[b]}
        if repo.family == "olmo2":
            expected[OLMO1124] = "model_type olmo_1124 is not olmo2"
        assert repo.planted == expected, repo.family
    assert {f: r.planted for f, r in hub_twin.repos.items() if r.planted} == {
        "pythia": {"step0": "duplicate of step1", "step2000": "no weights"},
        "olmo2": {"stage1-step3000-tokens7B": "model_type olmo_1124 is not olmo2"},
        "amber": {"ckpt_128": "foreign shard pytorch_model-00001-of-00003.bin from ckpt_358"},
        "crfm_gpt2": {"checkpoint-300": "duplicate of checkpoint-1000"},
    }


def test_refs_are_the_branches_and_main(hub_twin, seen):
    for repo in hub_twin.repos.values():
        assert seen[repo.repo_id]["refs"] == sorted([*repo.branches, "main"]), repo.family


def test_every_branch_serves_its_files_with_weights_in_lfs(hub_twin, seen):
    for repo in hub_twin.repos.values():
        for ref, tree in seen[repo.repo_id]["trees"].items():
            assert {p: f["size"] for p, f in tree.items()} == repo.files[ref], (repo.family, ref)
            assert {p: f["sha256"] for p, f in tree.items() if is_weight_file(p)} == repo.weight_sha256[ref]
            in_lfs = {p for p, f in tree.items() if f["sha256"]}
            assert in_lfs == {p for p in tree if p.endswith(LFS_SUFFIXES)}, (repo.family, ref)


def test_the_planted_defects_as_served(hub_twin, seen):
    trees = {family: seen[repo.repo_id]["trees"] for family, repo in hub_twin.repos.items()}
    sha = {
        family: {ref: {p: f["sha256"] for p, f in tree.items()} for ref, tree in t.items()}
        for family, t in trees.items()
    }
    assert sha["pythia"]["step0"]["pytorch_model.bin"] == sha["pythia"]["step1"]["pytorch_model.bin"]
    assert {"config.json", "tokenizer.json"} <= trees["pythia"]["step2000"].keys()
    assert not any(is_weight_file(p) for p in trees["pythia"]["step2000"])
    gpt2 = sha["crfm_gpt2"]
    assert gpt2["checkpoint-300"]["pytorch_model.bin"] == gpt2["checkpoint-1000"]["pytorch_model.bin"]
    shards = [f"pytorch_model-0000{k}-of-00003.bin" for k in (1, 2, 3)]
    assert [sha["amber"]["ckpt_128"][s] == sha["amber"]["ckpt_358"][s] for s in shards] == [True, False, False]
    config = seen[hub_twin.repos["olmo2"].repo_id]["configs"][OLMO1124]
    assert (config["model_type"], config["architectures"]) == ("olmo_1124", ["Olmo1124ForCausalLM"])
    assert set(trees["smollm2"]["main"]) == {"README.md", ".gitattributes"}


def test_one_branch_and_main_of_each_family_load_without_missing_or_unexpected_keys(hub_twin, seen):
    for repo in hub_twin.repos.values():
        loads = seen[repo.repo_id]["loads"]
        assert loads.keys() == loaded(repo).keys() and repo.branches[-1] in loads, repo.family
        for branch, info in loads.items():
            assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}, (repo.family, branch)
