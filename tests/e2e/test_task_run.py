"""A task run (``probe=ioi``, ...) on tiny models with a word-level tokenizer in which the task words are
single tokens: every metric and screen score in summary.json and heads.csv against the study-style
eager reference (``tests/helpers/task_reference.py``), the prompts file, the ablation's conditions,
and a head list outside the model refused in one line."""

import itertools
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
from emergence.recipe.tasks.matched_random import matched_random, matched_random_seeds, spec_from_ranking
from emergence.run.results import RunSummary, read_run, task_lines
from emergence.toy.words import word_tokenizer
from tests.helpers.cli import run_cli
from tests.helpers.task_reference import reference_metrics, reference_screens
from tests.helpers.tiny_models import tiny_config

ARCHS = ("gpt_neox", "olmo", "llama")
SMALL = [
    "probe.n_sequences=32",
    "probe.seq_len=64",
    "probe.vocab_low=10",
    "probe.vocab_high=500",
    "probe.batch_size=8",
    "model.dtype=float32",
    "wandb.mode=disabled",
    "stats.n_boot=200",
    "ablate.sequences=all",
    "ablate.mr_seeds=2",
]
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
    cfg = compose_config(
        [
            "model=local",
            f"model.name_or_path={path}",
            f"probe={task}",
            *SMALL,
            f"probe.task_prompts={N_PROMPTS}",
            *extra,
        ]
    )
    return analyse(cfg, out)


@pytest.mark.parametrize("task", ["ioi", "greater_than", "successor", "binding"])
@pytest.mark.parametrize("arch", ARCHS)
def test_task_metrics_and_screens_equal_an_eager_reference(arch, task, task_dirs, tmp_path):
    summary = task_run(task_dirs[arch], tmp_path, task)
    _, rows = read_run(tmp_path)
    batch = build_task_batch(task, word_tokenizer(512), N_PROMPTS)
    eager = AutoModelForCausalLM.from_pretrained(task_dirs[arch], attn_implementation="eager").eval()
    per_prompt = reference_metrics(
        eager, task, batch.tokens, batch.target, batch.distractor, batch.decade, batch.answer_tokens
    )
    scores, ranked = reference_screens(eager, task, batch.tokens, {k: v.numpy() for k, v in batch.positions.items()})
    ours = summary.task.metrics.metrics
    means = {
        "ioi": {"top1": "top1", "frac_target_gt_distractor": "target_gt_distractor", "logit_diff_mean": "logit_diff"},
        "binding": {
            "top1": "top1",
            "frac_target_gt_distractor": "target_gt_distractor",
            "logit_diff_mean": "logit_diff",
        },
        "greater_than": {
            "top1_above": "top1_above",
            "prob_above": "prob_above",
            "prob_below": "prob_below",
            "logit_diff_above_below": "logit_diff_above_below",
        },
        "successor": {"top1": "top1", "target_logit_mean": "target_logit", "rank_mean": "target_rank"},
    }[task]
    for name, column in means.items():
        assert ours[name].value == pytest.approx(per_prompt[column].mean(), abs=1e-5), name
        assert ours[name].ci[0] <= ours[name].value <= ours[name].ci[1]
    assert summary.task.n_prompts == N_PROMPTS and summary.task.prompts_sha1 == batch.prompts_sha1()
    for name, values in scores.items():
        got = np.array([[r[name] for r in rows if r["layer"] == layer] for layer in range(values.shape[0])])
        np.testing.assert_allclose(got, values, rtol=1e-5, atol=1e-7, err_msg=name)
    assert summary.task.screens == {s: [f"L{l}H{h}" for l, h in heads] for s, heads in ranked.items()}
    other = [c for c in ("nm_sel", "gt_sel", "succ_sel", "vb_sel") if c not in scores]
    assert not any(c in rows[0] for c in other)  # no column of another task


def test_prompts_file_and_ablation_conditions(task_dirs, tmp_path):
    summary = task_run(task_dirs["gpt_neox"], tmp_path, "ioi", "ablate.heads=[L1H2,L0H3]")
    lines = (tmp_path / "prompts.jsonl").read_text().splitlines()
    assert len(lines) == N_PROMPTS
    first = json.loads(lines[0])
    # the first prompt (docs/tasks.md, check values)
    assert first["text"] == "When Sandra and Daniel went to the store, Daniel gave a book to"
    assert first["positions"] == {"io": 1, "s1": 3, "s2": 9, "end": 13}
    assert first["token_ids"][first["positions"]["io"]] == first["target"]
    # the toy's tokenizer has every study word as one token: auto reads the study's words, all kept
    written = json.loads((tmp_path / "summary.json").read_text())["task"]
    assert written["words"] == {
        "mode": "study",
        "kept": {"names": list(NAMES), "places": list(PLACES), "objects": list(OBJECTS)},
        "dropped": {"names": [], "places": [], "objects": []},
    }
    conditions = {c.name: c for c in summary.task.ablation.conditions}
    screen = summary.task.screens["name_mover"]
    spec = spec_from_ranking([parse_head_name(h) for h in screen])  # layers by first appearance (docs/tasks.md)
    assert conditions["screen:name_mover"].heads == [f"L{l}H{h}" for l, hs in spec.items() for h in hs]
    # seed 123's draw in the screen's layers, recomputed here (docs/tasks.md, Ablations)
    expected = matched_random(spec, 4, np.random.RandomState(123))
    assert conditions["matched_random:name_mover:123"].heads == [f"L{l}H{h}" for l, hs in expected.items() for h in hs]
    assert conditions["user"].heads == ["L1H2", "L0H3"]  # the user's spec, in the order given
    assert conditions["baseline"].delta == {k: 0.0 for k in conditions["baseline"].delta}
    sweep = {s.screen: s for s in summary.task.ablation.sweeps}["name_mover"]
    n = min(2, len(_all_controls(screen, 4)))  # distinct draws: as many as asked where the layers allow them
    assert sweep.seeds[0] == 0 and len(sweep.seeds) == sweep.n_distinct == len(sweep.sweeps["top1"].deltas) == n
    # the ablated screen's capability against an independent ablation: its heads' o_proj columns zeroed
    eager = AutoModelForCausalLM.from_pretrained(task_dirs["gpt_neox"], attn_implementation="eager").eval()
    head_dim = eager.config.hidden_size // eager.config.num_attention_heads
    with torch.no_grad():
        for layer, head in map(parse_head_name, screen):
            eager.gpt_neox.layers[layer].attention.dense.weight[:, head * head_dim : (head + 1) * head_dim] = 0
    batch = build_task_batch("ioi", word_tokenizer(512), N_PROMPTS)
    ablated = reference_metrics(eager, "ioi", batch.tokens, batch.target, batch.distractor)
    got = conditions["screen:name_mover"].metrics.metrics
    assert got["logit_diff_mean"].value == pytest.approx(ablated["logit_diff"].mean(), abs=1e-5)


@pytest.mark.slow
def test_a_head_outside_the_model_is_one_line_exit_2(task_dirs, tmp_path):
    done = run_cli(
        "model=local",
        f"model.name_or_path={task_dirs['gpt_neox']}",
        "probe=ioi",
        *SMALL,
        "ablate.heads=[L0H10]",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("ablate.heads='L0H10' is invalid: the model has 2 layers x 4 heads (L0H0..L1H3)")
    )
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.fixture(scope="module")
def pythia_grid(tmp_path_factory):
    """A GPT-NeoX of Pythia-1B's head grid (16 layers x 8 heads) with the word tokenizer, whose IOI answers
    never win: every name's unembedding row is zero, so its top-1 is 0 (a capability absent)."""
    path = tmp_path_factory.mktemp("pythia_grid")
    config = tiny_config("gpt_neox")
    config.num_hidden_layers, config.num_attention_heads, config.hidden_size = 16, 8, 64  # head_dim 8
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    names = build_task_batch("ioi", word_tokenizer(512), N_PROMPTS).target.unique()
    with torch.no_grad():
        model.get_output_embeddings().weight[names] = 0.0  # logit 0, below the largest of 500 random others
    model.save_pretrained(path, safe_serialization=True)
    word_tokenizer(512).save_pretrained(path)
    return path


@pytest.mark.slow
def test_a_published_head_list_gets_the_published_control_and_an_absent_capability_no_verdict(pythia_grid, tmp_path):
    """Pythia's published name movers given as `ablate.heads` on the command line get the study's seed-123
    control ({13: [2], 10: [0, 2, 7], 11: [4]}: docs/tasks.md, Re-running a published row), distinct fresh
    draws, and, with IOI's top-1 at 0, "capability absent" instead of a verdict: in summary.json and in the
    printed lines."""
    done = run_cli(
        "model=local",
        f"model.name_or_path={pythia_grid}",
        "probe=ioi",
        *SMALL,
        f"probe.task_prompts={N_PROMPTS}",
        "ablate.heads=[L13H1,L10H6,L10H5,L10H4,L11H7]",
        "ablate.mr_seeds=3",
        f"hydra.run.dir={tmp_path}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = RunSummary.read(tmp_path)
    ablation = summary.task.ablation
    conditions = {c.name: c for c in ablation.conditions}
    assert conditions["user"].heads == ["L13H1", "L10H6", "L10H5", "L10H4", "L11H7"]
    assert conditions["matched_random:user:123"].heads == ["L13H2", "L10H0", "L10H2", "L10H7", "L11H4"]
    spec = {13: [1], 10: [6, 5, 4], 11: [7]}
    for seed, control in zip(range(3), matched_random_seeds(spec, 8, range(3))):  # distinct: the study's seeds
        assert conditions[f"matched_random_seed:user:{seed}"].heads == [
            f"L{l}H{h}" for l, hs in control.items() for h in hs
        ]
    assert summary.task.metrics.metrics["top1"].value == 0.0
    assert ablation.chance_top1 == 1 / 512 and ablation.capability_absent == "baseline top1 0.000 below chance 0.00195"
    user = {s.screen: s for s in ablation.sweeps}["user"]
    assert (user.seeds, user.n_distinct, user.screen_heads, user.control_heads) == ([0, 1, 2], 3, 5, 5)
    assert (user.verdict, user.verdict_metric) == ("capability_absent", "logit_diff_mean")
    random = [conditions[f"matched_random_seed:user:{s}"].delta["logit_diff_mean"] for s in range(3)]
    assert user.sweeps["logit_diff_mean"].deltas == random
    assert user.sweeps["logit_diff_mean"].screen_delta == conditions["user"].delta["logit_diff_mean"]
    assert all(s.verdict == "capability_absent" for s in ablation.sweeps)
    (line,) = [line for line in done.stderr.splitlines() if "task ablation user: " in line]
    assert line.endswith(
        "over 3 distinct draws; capability absent: no verdict (baseline top1 0.000 below chance 0.00195)"
    )
    assert line.split("task ablation user: ")[1] == task_lines(summary.task)[-1].split("task ablation user: ")[1]


def _all_controls(heads: list[str], n_heads: int) -> set[frozenset]:
    """Every matched-random control of a head list, enumerated: per layer each choice of as many of its
    other heads (fewer where it has fewer), combined over the layers."""
    spec = spec_from_ranking([parse_head_name(h) for h in heads])
    per_layer = [
        list(
            itertools.combinations([h for h in range(n_heads) if h not in picks], min(len(picks), n_heads - len(picks)))
        )
        for picks in spec.values()
    ]
    return {
        frozenset((layer, h) for layer, chosen in zip(spec, combo) for h in chosen)
        for combo in itertools.product(*per_layer)
    }


def test_ten_seeds_on_a_4_head_model_count_distinct_draws(task_dirs, tmp_path):
    """Binding's top-5 of a 2 x 4-head model leaves its layers room for fewer distinct controls than the 10
    seeds asked: the summary counts them, and gives no std, ratio or verdict over fewer than 3."""
    summary = task_run(task_dirs["gpt_neox"], tmp_path, "binding", "ablate.mr_seeds=10")
    screen = summary.task.screens["binding"]
    allowed = _all_controls(screen, 4)
    (sweep,) = summary.task.ablation.sweeps
    assert len(allowed) < 3  # the case this test is about
    assert (sweep.n_distinct, sweep.all_drawn) == (len(allowed), True)
    drawn = {
        frozenset(map(parse_head_name, c.heads))
        for c in summary.task.ablation.conditions
        if c.kind == "matched_random_seed"
    }
    assert drawn == allowed and len(sweep.seeds) == len(allowed)
    control_heads = len(next(iter(allowed)))
    assert (sweep.screen_heads, sweep.control_heads, sweep.smaller) == (5, control_heads, control_heads < 5)
    assert sweep.smaller  # 5 heads in 8 leave a layer too few others
    for s in sweep.sweeps.values():
        assert s.std is None and s.ratio is None
        assert (
            s.why == f"{len(allowed)} distinct matched-random draw{'s' if len(allowed) > 1 else ''}: no std or "
            "ratio over fewer than 3"
        )
    assert sweep.verdict in ("too_few_draws", "capability_absent")
    line = next(line for line in task_lines(summary.task) if line.startswith("task ablation binding: "))
    draws = f"{len(allowed)} distinct draw{'s' if len(allowed) > 1 else ''}"
    assert f"over {draws} (every one the layers allow); {control_heads} heads against the screen's 5: smaller" in line
    assert " +- - " in line  # no std printed
