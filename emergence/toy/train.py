"""Train a toy panel model from scratch and save its checkpoints like a Hub repo's revisions.

``train(model_cfg)`` builds a tiny GPTNeoX / Olmo / Olmoe from ``model.toy`` (the
recipe), trains it on ``ToyCorpus`` (or, for the task toy, ``TaskMixCorpus``) with a fixed seed, and at
every panel step saves a Hugging Face checkpoint (safetensors + config, and the recipe's tokenizer if it
has one) in ``<name_or_path>/<revision>/``. The
per-step training losses go to ``losses.tsv``; the manifest (``manifest.json``: per checkpoint
step, tokens seen, training loss, copy loss drop (under its first name, ``icl_score``) and the
sha256 of its weights; the recipe; the numerical environment of the training; whether it
reproduces a documented panel) is written last, so a directory with a manifest holds a complete
panel. ``model.toy.numerics=portable`` (the default) trains in a fresh process with the kernels, oneMKL branch
and threads pinned (``emergence/toy/repro.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import cast

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    OlmoConfig,
    OlmoeConfig,
    OlmoeForCausalLM,
    OlmoForCausalLM,
    PreTrainedModel,
    get_cosine_with_min_lr_schedule_with_warmup,
)
from transformers.utils import logging as hf_logging

from emergence.core.atomic import atomic_write_text
from emergence.core.config import ModelConfig, PanelEntry
from emergence.hub.series import MANIFEST
from emergence.recipe import capture
from emergence.toy import repro
from emergence.toy.corpus import ToyCorpus, copy_eval_batch
from emergence.toy.task_corpus import TaskMixCorpus
from emergence.toy.words import word_tokenizer

log = logging.getLogger(__name__)

# The manifest's key for each checkpoint's copy loss drop: its first name, kept so that the panels
# trained before summary.json renamed it (in users' caches) still serve runs without retraining.
MANIFEST_COPY_LOSS_DROP = "icl_score"
COPY_SPAN = 16  # length of the copied span of the copy loss drop's evaluation
COPY_EVAL_SEED = 12345


def build_model(recipe):
    """A randomly initialised model of the recipe's architecture (seeded)."""
    torch.manual_seed(recipe.seed)
    common = dict(
        vocab_size=recipe.vocab_size,
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.n_layers,
        num_attention_heads=recipe.n_heads,
        intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.seq_len,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model: PreTrainedModel
    if recipe.architecture == "gpt_neox":
        model = GPTNeoXForCausalLM(GPTNeoXConfig(**common))
    elif recipe.architecture == "olmo":
        model = OlmoForCausalLM(OlmoConfig(**common, clip_qkv=recipe.clip_qkv))
    elif recipe.architecture == "olmoe":
        model = OlmoeForCausalLM(
            OlmoeConfig(
                **common,
                clip_qkv=recipe.clip_qkv,
                num_experts=recipe.n_experts,
                num_experts_per_tok=recipe.experts_per_token,
            )
        )
    else:
        raise ValueError(f"toy architecture {recipe.architecture!r}: use gpt_neox, olmo or olmoe")
    model.config._attn_implementation = "sdpa"
    return model


def build_tokenizer(recipe):
    """The recipe's tokenizer (``words``: ``emergence/toy/words.py``), or None for a toy of ids only."""
    return None if recipe.tokenizer is None else word_tokenizer(recipe.vocab_size)


def build_corpus(recipe, tokenizer):
    """The recipe's training corpus: ``ToyCorpus``, or with a tokenizer ``TaskMixCorpus`` (task sentences mixed
    with ``ToyCorpus`` over the filler tokens)."""
    synthetic = dict(
        repeat_fraction=recipe.repeat_fraction,
        skip_offsets=recipe.skip_offsets,
        skip_prob=recipe.skip_prob,
        trigger_fraction=recipe.trigger_fraction,
    )
    if tokenizer is None:
        return ToyCorpus(recipe.vocab_size, recipe.seq_len, recipe.seed, **synthetic)
    return TaskMixCorpus(
        tokenizer, recipe.seq_len, recipe.seed, recipe.task_fraction, synthetic, recipe.home_city_share
    )


HELD_OUT_FIRST_STEP = 10**9  # far past any training's last step: batches of the corpus no training saw


def held_out(recipe, n: int, seed: int) -> torch.Tensor:
    """[n, seq_len] int64: sequences of the recipe's training corpus from steps no training reaches."""
    return build_corpus(recipe, build_tokenizer(recipe)).batch(HELD_OUT_FIRST_STEP + seed, n)


def measure_copy_loss_drop(model, recipe) -> float:
    """Mean loss on the first copy of a random span minus on its second copy (nats).

    About 0 without in-context copying; large once induction heads copy the span."""
    tokens, first, second = copy_eval_batch(recipe.vocab_size, recipe.seq_len, 64, COPY_SPAN, COPY_EVAL_SEED)
    # Each copy's tokens but its first (it cannot be predicted from context): positions first+1 .. first+span-1.
    positions = torch.cat([torch.arange(start + 1, start + COPY_SPAN) for start in (first, second)])
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        hidden = model.base_model(tokens).last_hidden_state  # [n, T, d]: the output embeddings' input
        # column p-1: position p
        nll = capture.sequence_losses(capture.Unembedding.of(model), hidden, tokens, positions)
    model.train(was_training)
    return float(nll[:, first : first + COPY_SPAN - 1].mean() - nll[:, second : second + COPY_SPAN - 1].mean())


def lr_schedule(optimizer, recipe, steps: int):
    """Linear warmup, then a constant rate or transformers' cosine decay to ``min_lr_ratio`` x lr at ``steps``."""
    if recipe.lr_schedule == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, recipe.warmup_steps, steps, min_lr_rate=recipe.min_lr_ratio
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / recipe.warmup_steps))


def checkpoints_to_save(model_cfg) -> list[PanelEntry]:
    """The panel's revisions and, with ``save_every``, one ``step{N}`` every that many steps up to
    the panel's last step; ordered by step."""
    recipe = model_cfg.toy
    entries = {int(p.step): PanelEntry(p.revision, int(p.step), int(p.tokens)) for p in model_cfg.panel}
    if recipe.save_every:
        for step in range(0, max(entries) + 1, recipe.save_every):
            entries.setdefault(step, PanelEntry(f"step{step}", step, step * recipe.batch_size * recipe.seq_len))
    return [entries[s] for s in sorted(entries)]


# Recipe fields added after panels were trained and documented, at the value every earlier panel had: a
# weights recipe leaves them out at that value, so earlier manifests and documented panels still match.
LATER_FIELDS = {"task_fraction": 0.0, "tokenizer": None, "home_city_share": 0.0, "threads": 1}


def weights_recipe(recipe: dict) -> dict:
    """What determines the weights: a recipe (as a dict) without ``save_every``, which only adds checkpoints,
    and without the ``LATER_FIELDS`` at their earlier value (a manifest from before ``numerics`` existed
    was trained natively); a native training's ``threads`` are the process's own (its environment), not
    the recipe's."""
    weights = {
        "numerics": "native",
        **{k: v for k, v in recipe.items() if k != "save_every" and not (k in LATER_FIELDS and v == LATER_FIELDS[k])},
    }
    if weights["numerics"] == "native":
        weights.pop("threads", None)
    return weights


def is_complete(root: Path, model_cfg) -> bool:
    """The manifest is from this recipe and lists every checkpoint the config asks for (a panel
    trained with ``save_every`` also serves the same recipe without it)."""
    manifest = root / MANIFEST
    if not manifest.exists():
        return False
    saved = json.loads(manifest.read_text())
    return weights_recipe(saved.get("recipe") or {}) == weights_recipe(asdict(model_cfg.toy)) and {
        e.revision for e in checkpoints_to_save(model_cfg)
    } <= {c["revision"] for c in saved["checkpoints"]}


def train(model_cfg, root: Path | None = None) -> dict:
    """Train the toy model of ``model_cfg`` and save its panel; returns the manifest and logs whether the
    panel reproduces the documented one (``repro.compare_to_documented``)."""
    recipe = model_cfg.toy
    root = Path(root or model_cfg.name_or_path).expanduser()
    if recipe.numerics == "portable" and not repro.is_portable(repro.environment(), recipe.threads):
        manifest = _train_in_portable_process(model_cfg, root)
    else:
        manifest = _train_here(model_cfg, root)
    documented = manifest["documented"]
    (log.warning if documented["status"] == "differs" else log.info)(documented["message"])
    return manifest


def against_documented(model_cfg) -> dict:
    """The trained panel of ``model_cfg`` against the documented panels as they are now
    (``repro.compare_to_documented``), not as they were when it was trained."""
    manifest = json.loads((Path(model_cfg.name_or_path).expanduser() / MANIFEST).read_text())
    return repro.compare_to_documented(manifest, weights_recipe(asdict(model_cfg.toy)), repro.documented_panels())


def _train_in_portable_process(model_cfg, root: Path) -> dict:
    """``_train_here`` in a new Python process whose kernels, oneMKL branch and threads are pinned from its
    start (they cannot change once this process has run an operation)."""
    import emergence

    threads = str(model_cfg.toy.threads)
    env = {**os.environ, **repro.PORTABLE_ENV, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(emergence.__file__).parent.parent), env.get("PYTHONPATH")])
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg_file = Path(tmp) / "model.yaml"
        cfg_file.write_text(OmegaConf.to_yaml(OmegaConf.structured(model_cfg)))
        code = (
            "import sys; from emergence.toy.train import portable_process; portable_process(sys.argv[1], sys.argv[2])"
        )
        done = subprocess.run([sys.executable, "-c", code, str(cfg_file), str(root)], env=env)
    if done.returncode != 0:
        raise RuntimeError(
            f"the portable training of {model_cfg.key} failed (exit status {done.returncode}; its error is above)"
        )
    return json.loads((root / MANIFEST).read_text())


def portable_process(cfg_file: str, root: str) -> None:
    """The new process of a portable training: check that the numerics are the pinned ones, then train."""
    model_cfg = cast(
        ModelConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(cfg_file)))
    )
    assert model_cfg.toy is not None  # a toy's config holds its recipe
    threads = model_cfg.toy.threads
    torch.set_num_threads(threads)
    env = repro.environment("portable")
    if not repro.is_portable(env, threads):
        raise SystemExit(
            f"model.toy.numerics=portable needs {repro.PORTABLE} (ATen's AVX2 kernels, oneMKL's "
            f"COMPATIBLE branch) on {threads} thread(s); this machine gives {env}"
        )
    _train_here(model_cfg, Path(root))


def _train_here(model_cfg, root: Path) -> dict:
    """Train in this process, with its numerics (recorded in the manifest)."""
    recipe = model_cfg.toy
    save_at = {e.step: e for e in checkpoints_to_save(model_cfg)}
    steps = max(save_at)
    tokenizer = build_tokenizer(recipe)
    corpus = build_corpus(recipe, tokenizer)
    model = build_model(recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay)
    schedule = lr_schedule(optimizer, recipe, steps)
    hf_logging.disable_progress_bar()  # one bar for the training, not one per saved checkpoint
    if root.exists():
        shutil.rmtree(root)  # an incomplete or outdated panel: start over
    root.mkdir(parents=True)
    checkpoints, loss, losses = [], None, []  # no training loss before the first step
    model.train()
    bar = tqdm(range(steps + 1), desc=f"training {model_cfg.key}", unit="step")
    for step in bar:
        if step in save_at:
            entry = save_at[step]
            model.save_pretrained(root / entry.revision, safe_serialization=True)
            if tokenizer is not None:  # AutoTokenizer.from_pretrained(checkpoint) loads it offline
                tokenizer.save_pretrained(root / entry.revision)
            assert entry.tokens is not None  # a toy's panel states its tokens
            checkpoints.append(
                {
                    "revision": entry.revision,
                    "step": step,
                    "tokens": int(entry.tokens),
                    "train_loss": loss,
                    MANIFEST_COPY_LOSS_DROP: measure_copy_loss_drop(model, recipe),
                    "sha256": repro.sha256_file(root / entry.revision / "model.safetensors"),
                }
            )
            bar.set_postfix(copy_loss_drop=f"{checkpoints[-1][MANIFEST_COPY_LOSS_DROP]:.2f}")
        if step == steps:
            break
        batch = corpus.batch(step, recipe.batch_size)
        out = model(batch, labels=batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        loss = out.loss.item()
        losses.append(loss)
    atomic_write_text(root / repro.LOSSES, "step\tloss\n" + "".join(f"{s}\t{v!r}\n" for s, v in enumerate(losses)))
    manifest = {
        "model": model_cfg.key,
        "recipe": asdict(recipe),
        "checkpoints": checkpoints,
        "environment": repro.environment(recipe.numerics),
        "torch": torch.__version__,
    }
    weights = weights_recipe(asdict(recipe))
    manifest["documented"] = repro.compare_to_documented(manifest, weights, repro.documented_panels())
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def recorded(model_cfg, revision: str | None) -> dict[str, float]:
    """What a toy's training recorded at the checkpoint ``revision`` (its manifest): ``train_loss`` and
    ``copy_loss_drop`` (``measure_copy_loss_drop``); empty for other models and checkpoints."""
    manifest = Path(model_cfg.name_or_path).expanduser() / MANIFEST
    if model_cfg.toy is None or not manifest.exists():
        return {}
    records = json.loads(manifest.read_text())["checkpoints"]
    entry = next((c for c in records if c["revision"] == revision), None)
    if entry is None:
        return {}
    return {"train_loss": entry["train_loss"], "copy_loss_drop": entry[MANIFEST_COPY_LOSS_DROP]}


def ensure_trained(model_cfg) -> dict:
    """Train the toy panel if it is missing, incomplete or from another recipe; returns the panel against the
    documented ones (``repro.compare_to_documented``). A trained panel whose bits are not the documented
    panel's is one warning line: the docs' numbers are not what it gives."""
    root = Path(model_cfg.name_or_path).expanduser()
    if not is_complete(root, model_cfg):
        log.info(f"toy panel {model_cfg.key} not found in {root}: training it (once)")
        return train(model_cfg, root)["documented"]
    documented = against_documented(model_cfg)
    if documented["status"] == "differs":
        log.warning(documented["message"])
    return documented
