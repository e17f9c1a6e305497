"""A Hub twin: the seven model families of ``conf/model/*.yaml`` served by a local olah
(``hub_server.py``) under their real repo ids, each repo laid out as the real one is (branch
names, weight formats, shards, dtypes, which files sit on which branch) with tiny random
weights of the family's architecture, and with the real defects planted:

    def test_something(hub_twin, tmp_path):
        pythia = hub_twin.repos["pythia"]  # a TwinRepo: branches, files, weight sha256, planted verdicts
        run_cli(..., env=hub_twin.env(tmp_path / "hub"))

The twin is built once per session (per xdist worker) and shared by its tests: they must not
publish to it, nor stop its server. Every branch's weights are its own (a seed per checkpoint)
but for the planted defects; the rule a check applies to identical weights: they belong to the
latest branch (by step) that holds them, the earlier one is defective (the known cases are
early branches that serve later weights).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from tests.helpers.hub_server import LFS_SUFFIXES, HubServer, publish, serving
from tests.helpers.tiny_models import tiny_model

PRESETS = Path(__file__).resolve().parents[2] / "conf" / "model"
VOCAB_SIZE = 512  # the tokenizer's 303 ids fit
# The Hub's default .gitattributes, cut to the patterns of the files the twin holds: every repo
# created on the Hub has it on main, and branches made from main carry it.
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES)


@dataclass(frozen=True)
class TwinRepo:
    family: str  # the preset key (conf/model/<family>.yaml)
    repo_id: str  # the preset's name_or_path
    model_type: str  # the family's model_type (the preset's architecture)
    branches: list[str]  # checkpoint branches in step order (main excluded)
    files: dict[str, dict[str, int]]  # branch (and "main") -> {path: size} of every file
    weight_sha256: dict[str, dict[str, str]]  # branch (and "main") -> {root-level weight file: LFS sha256}
    planted: dict[str, str]  # branch -> the verdict a check must print for it (defects only; all others "ok")
    tokenizer_branches: list[str]  # branches (and/or "main") that carry tokenizer files


@dataclass(frozen=True)
class Weights:
    """How a checkpoint stores its weights."""

    format: str  # "bin" (a pickle by torch.save, zipfile format) or "safetensors"
    dtype: torch.dtype
    shards: int = 1


FP16_BIN = Weights("bin", torch.float16)


def is_weight_file(path: str) -> bool:
    """A root-level weight file, as a loader looks for them (not training_args.bin, nor DeepSpeed states)."""
    return re.fullmatch(r"[^/]*\.safetensors|pytorch_model[^/]*\.bin", path) is not None


def write_weights(state: dict[str, torch.Tensor], directory: Path, weights: Weights) -> None:
    """``state`` in ``weights``'s format and dtype, named as transformers names them; shards
    split the keys in order into ``shards`` groups, with the index JSON transformers reads."""
    state = {k: v.to(weights.dtype).contiguous() for k, v in state.items()}
    stem, ext = ("model", "safetensors") if weights.format == "safetensors" else ("pytorch_model", "bin")
    keys, n = list(state), weights.shards
    groups = [keys[i * len(keys) // n : (i + 1) * len(keys) // n] for i in range(n)]
    names = [f"{stem}.{ext}"] if n == 1 else [f"{stem}-{i + 1:05d}-of-{n:05d}.{ext}" for i in range(n)]
    for name, group in zip(names, groups):
        part = {k: state[k] for k in group}
        if weights.format == "safetensors":
            save_file(part, directory / name, metadata={"format": "pt"})
        else:
            torch.save(part, directory / name)
    if n > 1:
        index = {
            "metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
            "weight_map": {k: name for name, group in zip(names, groups) for k in group},
        }
        (directory / f"{stem}.{ext}.index.json").write_text(json.dumps(index, indent=2) + "\n")


def save_tokenizer(directory: Path) -> None:
    """The word-level tokenizer of the tests (``test_probes.py``'s corpus: ``<unk>``, ``<s>``,
    ``</s>``, w0..w299, BOS prepended). transformers 5 writes tokenizer.json and
    tokenizer_config.json; the special_tokens_map.json that transformers 4 wrote beside them
    (and the real branches carry) is written here."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(300)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(directory)
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


class Layout:
    """One repo being laid out: a directory per branch (and main) under ``work/<family>``,
    published to the mirrors at the end. Each checkpoint gets a seed of its own, so no two hold
    the same weights unless a defect is planted."""

    def __init__(self, family: str, work: Path, tokenizer: Path):
        preset = yaml.safe_load((PRESETS / f"{family}.yaml").read_text())
        self.family, self.repo_id, self.model_type = family, preset["name_or_path"], preset["architecture"]
        self.pattern = preset["revision_pattern"]
        self.panel = [entry["revision"] for entry in preset.get("panel", [])]
        self.root, self.tokenizer = work / family, tokenizer
        self.dirs: dict[str, Path] = {}
        self.planted: dict[str, str] = {}

    def branch(self, name: str) -> Path:
        """A new branch's directory, with the Hub's .gitattributes."""
        directory = self.dirs[name] = self.root / name
        directory.mkdir(parents=True)
        (directory / ".gitattributes").write_text(GITATTRIBUTES)
        return directory

    def checkpoint(self, name: str, weights: Weights, tokenizer: bool = False, generation_config: bool = False) -> Path:
        """A branch with a fresh tiny model (the seed: the number of branches so far): its
        config.json as ``save_pretrained`` writes it for the stored dtype, the tensors it saves
        (tied ones once: GPT-2's lm_head is not stored), re-laid out as ``weights`` says."""
        directory = self.branch(name)
        model = tiny_model(self.model_type, seed=len(self.dirs), vocab_size=VOCAB_SIZE)
        model.to(weights.dtype).save_pretrained(directory)
        saved = directory / "model.safetensors"
        state = load_file(saved)
        saved.unlink()
        write_weights(state, directory, weights)
        if not generation_config:
            (directory / "generation_config.json").unlink()
        if tokenizer:
            self.add_tokenizer(name)
        return directory

    def add_tokenizer(self, name: str) -> None:
        shutil.copytree(self.tokenizer, self.dirs[name], dirs_exist_ok=True)

    def copy(self, name: str, source: str) -> Path:
        """A branch (main) that holds ``source``'s files, byte for byte."""
        self.dirs[name] = self.root / name
        return shutil.copytree(self.dirs[source], self.dirs[name])

    def transplant(self, name: str, path: str, source: str, verdict: str) -> None:
        """Plant a defect: ``name``'s ``path`` becomes a byte copy of ``source``'s."""
        shutil.copyfile(self.dirs[source] / path, self.dirs[name] / path)
        self.planted[name] = verdict

    def step(self, branch: str) -> int:
        return int(re.fullmatch(self.pattern, branch)["step"])

    def publish_to(self, mirrors: Path) -> TwinRepo:
        publish(mirrors, self.repo_id, self.dirs)
        branches = sorted((b for b in self.dirs if b != "main"), key=self.step)
        files = {
            b: {
                p.relative_to(self.dirs[b]).as_posix(): p.stat().st_size
                for p in sorted(self.dirs[b].rglob("*"))
                if p.is_file()
            }
            for b in [*branches, "main"]
        }
        tokenizer_files = {p.name for p in self.tokenizer.iterdir()}
        # the LFS oid publish stored each weight file under: the sha256 of its content
        sha256 = {
            b: {p: hashlib.sha256((self.dirs[b] / p).read_bytes()).hexdigest() for p in f if is_weight_file(p)}
            for b, f in files.items()
        }
        return TwinRepo(
            family=self.family,
            repo_id=self.repo_id,
            model_type=self.model_type,
            branches=branches,
            files=files,
            weight_sha256=sha256,
            planted=dict(self.planted),
            tokenizer_branches=[b for b, f in files.items() if tokenizer_files <= f.keys()],
        )


def pythia(repo: Layout) -> None:
    """EleutherAI/pythia-1b: every branch a pickled fp16 ``pytorch_model.bin`` with config and
    tokenizer, ``generation_config.json`` on the later ones; main also ``model.safetensors``
    (added by the Hub's conversion bot) of the final weights. Branches: the panel, step0
    (pythia#83: it serves step1's weights), step1000 and step2000 (pythia#202: config and tokenizer,
    no weights)."""
    for name in [*repo.panel, "step1000"]:
        repo.checkpoint(name, FP16_BIN, tokenizer=True, generation_config=repo.step(name) >= 10000)
    repo.checkpoint("step0", FP16_BIN, tokenizer=True)
    repo.transplant("step0", "pytorch_model.bin", "step1", "duplicate of step1")
    (repo.checkpoint("step2000", FP16_BIN, tokenizer=True) / "pytorch_model.bin").unlink()
    repo.planted["step2000"] = "no weights"
    main = repo.copy("main", repo.panel[-1])
    write_weights(torch.load(main / "pytorch_model.bin"), main, Weights("safetensors", torch.float16))


def olmo(repo: Layout) -> None:
    """allenai/OLMo-1B-0724-hf: main holds 2 fp32 safetensors shards with their index, the
    tokenizer and ``revisions.txt`` (the branch names, one a line). The branches' layout is not
    documented: main's, without tokenizer. Branches: the panel; main holds the last one's weights."""
    for name in repo.panel:
        repo.checkpoint(name, Weights("safetensors", torch.float32, shards=2))
    repo.copy("main", repo.panel[-1])
    repo.add_tokenizer("main")
    (repo.dirs["main"] / "revisions.txt").write_text("".join(f"{b}\n" for b in repo.panel))


def olmoe(repo: Layout) -> None:
    """allenai/OLMoE-1B-7B-0924: 3 bf16 safetensors shards with their index; the tokenizer on
    main only (branches: main's layout, not documented). Branches: the panel; main holds the last
    one's weights (the real main is the annealed model, not step1220000)."""
    for name in repo.panel:
        repo.checkpoint(name, Weights("safetensors", torch.bfloat16, shards=3))
    repo.copy("main", repo.panel[-1])
    repo.add_tokenizer("main")


# stage1-step{N}-tokens{M}B: 2,097,152 tokens a step, M rounded up (stage1-step1000000-tokens2098B)
OLMO2_BRANCHES = [
    "stage1-step1000-tokens3B",
    "stage1-step3000-tokens7B",
    "stage1-step10000-tokens21B",
    "stage1-step30000-tokens63B",
    "stage1-step100000-tokens210B",
    "stage1-step300000-tokens630B",
    "stage1-step1000000-tokens2098B",
    "stage1-step1900000-tokens3985B",
]
OLMO1124 = "stage1-step3000-tokens7B"


def olmo2(repo: Layout) -> None:
    """allenai/OLMo-2-0425-1B: every branch 2 fp32 safetensors shards with their index, config
    and tokenizer; main holds the last branch's files. Branch stage1-step3000-tokens7B's config
    names the pre-release model_type olmo_1124 (OLMo#813), its weights a valid olmo2 checkpoint."""
    for name in OLMO2_BRANCHES:
        repo.checkpoint(name, Weights("safetensors", torch.float32, shards=2), tokenizer=True)
    path = repo.dirs[OLMO1124] / "config.json"
    config = json.loads(path.read_text())
    config.update(model_type="olmo_1124", architectures=["Olmo1124ForCausalLM"])
    path.write_text(json.dumps(config, indent=2) + "\n")
    repo.planted[OLMO1124] = "model_type olmo_1124 is not olmo2"
    repo.copy("main", OLMO2_BRANCHES[-1])


def amber(repo: Layout) -> None:
    """LLM360/Amber: branches ckpt_000..ckpt_358 of 3 pickled fp32 shards
    ``pytorch_model-0000k-of-00003.bin`` with their index, config and eval_*.json results; the
    final model is main (no ckpt_359): 3 bf16 safetensors shards, config dtype bfloat16, the
    tokenizer. Branches: the panel; ckpt_128's first shard is ckpt_358's (the pythia#206 pattern)."""
    for name in repo.panel:
        directory = repo.checkpoint(name, Weights("bin", torch.float32, shards=3))
        for task in ("mmlu", "arc", "hellaswag", "truthfulqa"):
            (directory / f"eval_{task}.json").write_text(json.dumps({task: {"acc": 0.25, "step": repo.step(name)}}))
    shard = "pytorch_model-00001-of-00003.bin"
    repo.transplant("ckpt_128", shard, "ckpt_358", f"foreign shard {shard} from ckpt_358")
    repo.checkpoint("main", Weights("safetensors", torch.bfloat16, shards=3), tokenizer=True)


SMOLLM2_BRANCHES = [
    "step-20000",
    "step-40000",
    "step-80000",
    "step-160000",
    "step-320000",
    "step-640000",
    "step-1280000",
    "step-2000000",
]


def smollm2(repo: Layout) -> None:
    """HuggingFaceTB/SmolLM2-135M-intermediate-checkpoints: every branch one ``model.safetensors``
    (bf16: the dtype is assumed, not checked on the real repo) with config and tokenizer; main
    holds README.md and .gitattributes only, no weights and no config."""
    for name in SMOLLM2_BRANCHES:
        repo.checkpoint(name, Weights("safetensors", torch.bfloat16), tokenizer=True)
    readme = "---\nlicense: apache-2.0\n---\n# SmolLM2-135M intermediate checkpoints\n"
    (repo.branch("main") / "README.md").write_text(readme)


def crfm_gpt2(repo: Layout) -> None:
    """stanford-crfm/alias-gpt2-small-x21: every branch checkpoint-N a Hugging Face Trainer +
    DeepSpeed save: pickled ``pytorch_model.bin`` (fp32 at checkpoint-0, fp16 later), config,
    ``trainer_state.json``, ``training_args.bin`` (a pickle), ``latest`` (naming the DeepSpeed
    folder) and ``global_stepN/`` (model states and the 2 ranks' ZeRO optimizer partitions); the
    tokenizer on main only, which holds checkpoint-400000's files. Branches: checkpoint-0 and the
    panel; checkpoint-300 serves checkpoint-1000's weights."""
    for name in ["checkpoint-0", *repo.panel]:
        step = repo.step(name)
        directory = repo.checkpoint(name, Weights("bin", torch.float32 if step == 0 else torch.float16))
        deepspeed = directory / f"global_step{step}"
        deepspeed.mkdir()
        state = torch.load(directory / "pytorch_model.bin")
        torch.save({"module": state, "global_steps": step}, deepspeed / "mp_rank_00_model_states.pt")
        flat = torch.cat([v.float().flatten() for v in state.values()])
        for rank, part in enumerate(flat.chunk(2)):
            torch.save(
                {"optimizer_state_dict": {"single_partition_of_fp32_groups": [part.clone()]}},
                deepspeed / f"zero_pp_rank_{rank}_mp_rank_00optim_states.pt",
            )
        (directory / "latest").write_text(f"global_step{step}")
        (directory / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}, indent=2))
        torch.save({"output_dir": "alias-gpt2-small-x21", "seed": 21, "fp16": True}, directory / "training_args.bin")
    repo.transplant("checkpoint-300", "pytorch_model.bin", "checkpoint-1000", "duplicate of checkpoint-1000")
    repo.copy("main", repo.panel[-1])
    repo.add_tokenizer("main")


FAMILIES = {
    "pythia": pythia,
    "olmo": olmo,
    "olmoe": olmoe,
    "olmo2": olmo2,
    "amber": amber,
    "smollm2": smollm2,
    "crfm_gpt2": crfm_gpt2,
}


def build_twin(mirrors: Path, work: Path) -> dict[str, TwinRepo]:
    """Lay out the seven repos (staged under ``work``) and publish them to ``mirrors``; by family."""
    save_tokenizer(work / "tokenizer")
    repos = {}
    for family, lay_out in FAMILIES.items():
        layout = Layout(family, work, work / "tokenizer")
        lay_out(layout)
        repos[family] = layout.publish_to(mirrors)
    return repos


@dataclass(frozen=True)
class HubTwin:
    server: HubServer
    repos: dict[str, TwinRepo]  # by family

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def env(self, cache: Path | None = None) -> dict[str, str]:
        """As ``HubServer.env``: a subprocess's environment that talks to the twin."""
        return self.server.env(cache)


@pytest.fixture(scope="session")
def hub_twin(tmp_path_factory) -> Iterator[HubTwin]:
    """The Hub twin, built once per session (per xdist worker) and served by its own olah."""
    root = tmp_path_factory.mktemp("hub-twin")
    with serving(root) as server:
        yield HubTwin(server, build_twin(server.mirrors, root / "work"))
