"""A task run (``probe=ioi``, ...) on tiny models with a word-level tokenizer in which the task words are
single tokens: every metric and screen score in summary.json and heads.csv against the study-style
eager reference (``tests/helpers/task_reference.py``), the prompts file, the ablation's conditions,
and a head list outside the model refused in one line."""

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from emergence.core.config import compose_config
from emergence.main import analyse
from emergence.recipe.screen import parse_head_name
from emergence.recipe.tasks.batches import NAMES, OBJECTS, PLACES, build_task_batch
from emergence.recipe.tasks.matched_random import matched_random, spec_from_ranking
from emergence.run.results import read_run
from emergence.toy.words import word_tokenizer
from tests.helpers.cli import run_cli
from tests.helpers.task_reference import reference_metrics, reference_screens

ARCHS = ("gpt_neox", "olmo", "llama")
SMALL = ["probe.n_sequences=32", "probe.seq_len=64", "probe.vocab_low=10", "probe.vocab_high=500",
         "probe.batch_size=8", "model.dtype=float32", "wandb.mode=disabled", "stats.n_boot=200",
         "ablate.sequences=all", "ablate.mr_seeds=2"]
N_PROMPTS = 24


@pytest.fixture(scope="module")
def task_dirs(tiny_dirs, tmp_path_factory):
    """The tiny models (vocabulary 512) with the toy's word-level tokenizer saved beside them."""
    root = tmp_path_factory.mktemp("task_models")
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = root / arch
        shutil.copytree(tiny_dirs[arch], dirs[arch])
        word_tokenizer(512).save_pretrained(dirs[arch])
    return dirs


def task_run(path, out, task: str, *extra):
    cfg = compose_config(["model=local", f"model.name_or_path={path}", f"probe={task}", *SMALL,
                          f"probe.task_prompts={N_PROMPTS}", *extra])
    return analyse(cfg, out)


@pytest.mark.parametrize("task", ["ioi", "greater_than", "successor", "binding"])
@pytest.mark.parametrize("arch", ARCHS)
def test_task_metrics_and_screens_equal_an_eager_reference(arch, task, task_dirs, tmp_path):
    summary = task_run(task_dirs[arch], tmp_path, task)
    _, rows = read_run(tmp_path)
    batch = build_task_batch(task, word_tokenizer(512), N_PROMPTS)
    eager = AutoModelForCausalLM.from_pretrained(task_dirs[arch], attn_implementation="eager").eval()
    per_prompt = reference_metrics(eager, task, batch.tokens, batch.target, batch.distractor, batch.decade,
                                   batch.answer_tokens)
    scores, ranked = reference_screens(eager, task, batch.tokens, {k: v.numpy() for k, v in batch.positions.items()})
    ours = summary.task.metrics.metrics
    means = {"ioi": {"top1": "top1", "frac_target_gt_distractor": "target_gt_distractor",
                     "logit_diff_mean": "logit_diff"},
             "binding": {"top1": "top1", "frac_target_gt_distractor": "target_gt_distractor",
                         "logit_diff_mean": "logit_diff"},
             "greater_than": {"top1_above": "top1_above", "prob_above": "prob_above", "prob_below": "prob_below",
                              "logit_diff_above_below": "logit_diff_above_below"},
             "successor": {"top1": "top1", "target_logit_mean": "target_logit", "rank_mean": "target_rank"}}[task]
    for name, column in means.items():
        assert ours[name].value == pytest.approx(per_prompt[column].mean(), abs=1e-5), name
        assert ours[name].ci[0] <= ours[name].value <= ours[name].ci[1]
    assert summary.task.n_prompts == N_PROMPTS and summary.task.prompts_sha1 == batch.prompts_sha1()
    for name, values in scores.items():
        got = np.array([[r[name] for r in rows if r["layer"] == layer] for layer in range(values.shape[0])])
        np.testing.assert_allclose(got, values, rtol=1e-5, atol=1e-7, err_msg=name)
    assert summary.task.screens == {s: [f"L{l}H{h}" for l, h in heads] for s, heads in ranked.items()}
    other = [c for c in ("nm_sel", "gt_sel", "succ_sel", "vb_sel") if c not in scores]
    assert all(np.isnan(r[c]) for r in rows for c in other)  # the other tasks' columns stay empty


def test_prompts_file_and_ablation_conditions(task_dirs, tmp_path):
    summary = task_run(task_dirs["gpt_neox"], tmp_path, "ioi", "ablate.heads=[L1H2,L0H3]")
    lines = (tmp_path / "prompts.jsonl").read_text().splitlines()
    assert len(lines) == N_PROMPTS
    first = json.loads(lines[0])
    assert first["text"] == "When Sandra and Daniel went to the store, Daniel gave a book to"  # TASKS.md 12
    assert first["positions"] == {"io": 1, "s1": 3, "s2": 9, "end": 13}
    assert first["token_ids"][first["positions"]["io"]] == first["target"]
    # the toy's tokenizer has every study word as one token: auto reads the study's words, all kept
    written = json.loads((tmp_path / "summary.json").read_text())["task"]
    assert written["words"] == {"mode": "study", "kept": {"names": list(NAMES), "places": list(PLACES),
                                                          "objects": list(OBJECTS)},
                                "dropped": {"names": [], "places": [], "objects": []}}
    conditions = {c.name: c for c in summary.task.ablation.conditions}
    screen = summary.task.screens["name_mover"]
    spec = spec_from_ranking([parse_head_name(h) for h in screen])  # layers by first appearance (TASKS.md 0.3)
    assert conditions["screen:name_mover"].heads == [f"L{l}H{h}" for l, hs in spec.items() for h in hs]
    # seed 123's draw in the screen's layers, recomputed here (TASKS.md 0.4)
    expected = matched_random(spec, 4, np.random.RandomState(123))
    assert conditions["matched_random:name_mover:123"].heads == [f"L{l}H{h}" for l, hs in expected.items() for h in hs]
    assert conditions["user"].heads == ["L1H2", "L0H3"]  # the user's spec, in the order given
    assert conditions["baseline"].delta == {k: 0.0 for k in conditions["baseline"].delta}
    sweep = {s.screen: s for s in summary.task.ablation.sweeps}["name_mover"]
    assert sweep.seeds == [0, 1] and len(sweep.sweeps["top1"].deltas) == 2
    # the ablated screen's capability against an independent ablation: its heads' o_proj columns zeroed
    eager = AutoModelForCausalLM.from_pretrained(task_dirs["gpt_neox"], attn_implementation="eager").eval()
    head_dim = eager.config.hidden_size // eager.config.num_attention_heads
    with torch.no_grad():
        for layer, head in map(parse_head_name, screen):
            eager.gpt_neox.layers[layer].attention.dense.weight[:, head * head_dim:(head + 1) * head_dim] = 0
    batch = build_task_batch("ioi", word_tokenizer(512), N_PROMPTS)
    ablated = reference_metrics(eager, "ioi", batch.tokens, batch.target, batch.distractor)
    got = conditions["screen:name_mover"].metrics.metrics
    assert got["logit_diff_mean"].value == pytest.approx(ablated["logit_diff"].mean(), abs=1e-5)


@pytest.mark.slow
def test_a_head_outside_the_model_is_one_line_exit_2(task_dirs, tmp_path):
    done = run_cli("model=local", f"model.name_or_path={task_dirs['gpt_neox']}", "probe=ioi", *SMALL,
                   "ablate.heads=[L0H10]", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "ablate.heads='L0H10' is invalid: the model has 2 layers x 4 heads (L0H0..L1H3)")
    assert not (tmp_path / "run" / "summary.json").exists()
