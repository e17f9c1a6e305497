"""The toy panel: corpus, a reduced training run (few steps), determinism, and the same
loading path as real checkpoints."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from emergence.core.config import PanelEntry, compose_config
from emergence.hub.series import MANIFEST
from emergence.main import analyse
from emergence.toy.corpus import ToyCorpus, copy_eval_batch
from emergence.toy.train import (
    MANIFEST_COPY_LOSS_DROP,
    ensure_trained,
    is_complete,
    measure_copy_loss_drop,
    train,
)
from tests.helpers.cli import run_cli


def reduced(key: str, cache_dir, *overrides) -> "Config":  # noqa: F821
    """The real toy config with a 3-step panel, trained in this process (native numerics), so training takes a
    second."""
    cfg = compose_config(
        [
            f"model={key}",
            f"cache_dir={cache_dir}",
            "wandb.mode=disabled",
            "probe.n_sequences=64",
            "model.toy.numerics=native",
            *overrides,
        ]
    )
    cfg.model.panel = [PanelEntry(f"step{s}", s, s * 32 * 128) for s in (0, 2, 4)]
    cfg.revision.index = -1
    return cfg


def test_corpus_is_a_pure_function_of_seed_and_step():
    corpus = ToyCorpus(256, 128, seed=0)
    a, b = corpus.batch(5, 8), ToyCorpus(256, 128, seed=0).batch(5, 8)
    assert torch.equal(a, b) and not torch.equal(a, corpus.batch(6, 8))
    assert a.shape == (8, 128) and a.min() >= 0 and a.max() < 256
    repeats = a[: int(8 * corpus.repeat_fraction)]
    for seq in repeats:  # one span repeated end to end: periodic
        period = next(p for p in range(1, 128) if torch.equal(seq[p:], seq[:-p]))
        assert corpus.span_min <= period <= 2 * corpus.span_max


def test_skips_repeat_the_token_k_back():
    chain = ToyCorpus(256, 128, seed=0, skip_offsets=(3,), skip_prob=1.0)._bigram_chain(np.random.default_rng(0), 4)
    assert np.array_equal(chain[:, 3:], chain[:, :-3])  # always skipped: period 3
    half = ToyCorpus(256, 128, seed=0, skip_offsets=(2,), skip_prob=0.5)._bigram_chain(np.random.default_rng(0), 64)
    share = (half[:, 2:] == half[:, :-2]).mean()
    assert 0.45 < share < 0.6  # half of the tokens, plus the chain's own chance repeats


def test_the_token_after_a_trigger_repeats_the_token_before_it():
    corpus = ToyCorpus(256, 128, seed=0, skip_offsets=(2, 3), skip_prob=0.25, trigger_fraction=0.1)
    assert corpus.is_trigger.sum() == 26  # round(0.1 x 256)
    chain = corpus._bigram_chain(np.random.default_rng(0), 64)
    after = corpus.is_trigger[chain[:, 1:-1]]  # after[:, i]: token i + 1 is a trigger
    assert after.mean() > 0.05
    assert np.array_equal(chain[:, 2:][after], chain[:, :-2][after])
    # Elsewhere the token two back is repeated only by the skips (25%) and by chance.
    assert (chain[:, 2:][~after] == chain[:, :-2][~after]).mean() < 0.4
    # No triggers: the corpus the toy panel has always been trained on, draw for draw.
    plain = ToyCorpus(256, 128, seed=0, skip_offsets=(2, 3), skip_prob=0.25)
    assert torch.equal(
        plain.batch(3, 8),
        ToyCorpus(256, 128, seed=0, skip_offsets=(2, 3), skip_prob=0.25, trigger_fraction=0.0).batch(3, 8),
    )
    assert not plain.is_trigger.any()


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_learning_rate_warms_up_then_holds_or_follows_a_cosine_to_its_floor(schedule):
    import math

    from emergence.toy.train import lr_schedule

    recipe = compose_config(["model=toy_olmo", f"model.toy.lr_schedule={schedule}"]).model.toy
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=recipe.lr)
    schedule_ = lr_schedule(optimizer, recipe, steps=1000)
    rates = []
    for _ in range(1001):
        rates.append(optimizer.param_groups[0]["lr"] / recipe.lr)
        optimizer.step()
        schedule_.step()
    warmup = recipe.warmup_steps
    assert rates[warmup] == pytest.approx(1.0) and all(a < b for a, b in zip(rates[: warmup - 1], rates[1:warmup]))
    if schedule == "constant":
        assert rates[warmup:] == [1.0] * (1001 - warmup)
    else:  # half a cosine from 1 at the end of warmup to min_lr_ratio at the last step
        floor, middle = recipe.min_lr_ratio, (warmup + 1000) // 2
        assert rates[1000] == pytest.approx(floor)
        expected = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (middle - warmup) / (1000 - warmup)))
        assert rates[middle] == pytest.approx(expected)
        assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1 :]))


def test_copy_eval_batch_has_one_copied_span():
    tokens, first, second = copy_eval_batch(256, 128, 4, 16, 0)
    assert torch.equal(tokens[:, first : first + 16], tokens[:, second : second + 16])


@pytest.mark.slow
@pytest.mark.parametrize("key", ["toy_neox", "toy_olmo", "toy_olmoe", "toy_olmo_sinks"])
def test_reduced_training_is_deterministic_and_loads_like_a_checkpoint(key, tmp_path):
    cfg = reduced(key, tmp_path / "a")
    manifest = train(cfg.model)
    root = tmp_path / "a" / "toy" / key / "seed0"
    assert [c["revision"] for c in manifest["checkpoints"]] == ["step0", "step2", "step4"]
    assert [c["tokens"] for c in manifest["checkpoints"]] == [0, 2 * 4096, 4 * 4096]
    assert is_complete(root, cfg.model)
    again = reduced(key, tmp_path / "b")
    train(again.model)
    for rev in ("step0", "step4"):
        first = (root / rev / "model.safetensors").read_bytes()
        assert first == (tmp_path / "b" / "toy" / key / "seed0" / rev / "model.safetensors").read_bytes()
    summary = analyse(cfg, tmp_path / "run")
    assert summary.revision == "step4" and summary.tokens == 4 * 4096
    assert summary.architecture == cfg.model.toy.architecture
    assert summary.probe.seq_len == 128 and summary.probe.vocab_high == 256


@pytest.mark.slow
def test_three_training_seeds_keep_their_own_panels_and_are_aggregated_in_the_report(tmp_path):
    from emergence.panel.report import write_report
    from emergence.panel.runs import load_runs

    stamps = {}
    for seed in (0, 1, 2):
        cfg = reduced("toy_neox", tmp_path / "cache", f"model.toy.seed={seed}", "stats.n_null=20")
        train(cfg.model)
        stamps[seed] = (tmp_path / "cache" / "toy" / "toy_neox" / f"seed{seed}" / MANIFEST).stat().st_mtime_ns
        for index in range(3):
            cfg.revision.index = index
            summary = analyse(cfg, tmp_path / "runs" / f"seed{seed}" / f"r{index}")
            assert summary.training_seed == seed
    for seed in (0, 1, 2):  # no seed's training overwrote another's
        ensure_trained(reduced("toy_neox", tmp_path / "cache", f"model.toy.seed={seed}").model)
        assert (tmp_path / "cache" / "toy" / "toy_neox" / f"seed{seed}" / MANIFEST).stat().st_mtime_ns == stamps[seed]

    trajectories = load_runs([tmp_path / "runs"])
    assert sorted(trajectories) == ["toy_neox-seed0", "toy_neox-seed1", "toy_neox-seed2"]
    # A class threshold low enough that the barely trained models cross the BOS milestones.
    findings = write_report(trajectories, tmp_path / "report", 1.0, 1.5, reference=False)
    seeds = findings.seeds["toy_neox"]
    assert seeds.seeds == sorted(trajectories)
    for milestone in ("induction_onset", "bos_10", "bos_50", "recall_67"):
        reached_at = [findings.models[n].milestones()[milestone] for n in sorted(trajectories)]
        per_seed = [None if m is None else m.tokens for m in reached_at]
        spread = seeds.milestones()[milestone]
        assert spread.per_seed == dict(zip(sorted(trajectories), per_seed))
        reached = [t for t in per_seed if t is not None]
        assert spread.reached == len(reached)
        if reached:
            assert spread.median == np.median(reached)
            assert spread.range == [min(reached), max(reached)]
    assert any(seeds.milestones()[m].reached for m in ("bos_10", "bos_50"))  # the check above compared real numbers
    assert all(findings.models[n].intervals for n in trajectories)  # run directories: bootstrap
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Across training seeds" in text and "toy_neox" in text


def test_save_every_adds_checkpoints_without_changing_the_panel(tmp_path):
    plain = reduced("toy_neox", tmp_path / "plain")
    train(plain.model)
    dense = reduced("toy_neox", tmp_path / "dense", "model.toy.save_every=1")
    manifest = train(dense.model)
    assert [c["revision"] for c in manifest["checkpoints"]] == ["step0", "step1", "step2", "step3", "step4"]
    assert [c["tokens"] for c in manifest["checkpoints"]] == [s * 32 * 128 for s in range(5)]
    dense_root, plain_root = (tmp_path / d / "toy" / "toy_neox" / "seed0" for d in ("dense", "plain"))
    for revision in ("step0", "step2", "step4"):  # the panel's checkpoints, bit for bit
        assert (dense_root / revision / "model.safetensors").read_bytes() == (
            plain_root / revision / "model.safetensors"
        ).read_bytes()
    # A dense panel serves the recipe without save_every; a plain one does not serve a dense request.
    plain.model.name_or_path = str(dense_root)
    assert is_complete(dense_root, plain.model)
    dense.model.name_or_path = str(plain_root)
    assert not is_complete(plain_root, dense.model)
    dense.revision.index, dense.revision.name = None, "step3"  # revision=custom revision.name=step3
    dense.model.name_or_path = str(dense_root)
    summary = analyse(dense, tmp_path / "run")
    assert (summary.revision, summary.step, summary.tokens) == ("step3", 3, 3 * 32 * 128)
    recorded = summary.measures["training_copy_loss"]["copy_loss_drop"]
    assert recorded == manifest["checkpoints"][3][MANIFEST_COPY_LOSS_DROP]


def test_missing_or_outdated_panel_is_retrained(tmp_path):
    cfg = reduced("toy_neox", tmp_path)
    root = tmp_path / "toy" / "toy_neox" / "seed0"
    ensure_trained(cfg.model)
    stamp = (root / MANIFEST).stat().st_mtime_ns
    ensure_trained(cfg.model)  # complete: nothing to do
    assert (root / MANIFEST).stat().st_mtime_ns == stamp
    cfg.model.toy.lr = 1e-3  # another recipe: retrain
    ensure_trained(cfg.model)
    assert json.loads((root / MANIFEST).read_text())["recipe"]["lr"] == 1e-3


def test_the_copy_loss_drop_separates_a_copier_from_a_uniform_model():
    class Copier(torch.nn.Module):  # predicts the token that followed the previous occurrence
        training = False
        config = type("Config", (), {})()  # no final soft-cap

        def __init__(self):
            super().__init__()
            self.unembedding = torch.nn.Linear(256, 256, bias=False)  # the identity: hidden states are the logits
            with torch.no_grad():
                self.unembedding.weight.copy_(torch.eye(256))

        def train(self, mode=True):
            return self

        def eval(self):
            return self

        def get_output_embeddings(self):
            return self.unembedding

        def base_model(self, tokens):
            hidden = torch.zeros(*tokens.shape, 256)
            for b, seq in enumerate(tokens.tolist()):
                for t, tok in enumerate(seq):
                    prev = [i for i in range(t) if seq[i] == tok]
                    if prev and prev[-1] + 1 < len(seq):
                        hidden[b, t, seq[prev[-1] + 1]] = 20.0
            return type("Out", (), {"last_hidden_state": hidden})

    class Uniform(Copier):
        def base_model(self, tokens):
            return type("Out", (), {"last_hidden_state": torch.zeros(*tokens.shape, 256)})

    recipe = reduced("toy_neox", "/unused").model.toy
    assert measure_copy_loss_drop(Uniform(), recipe) == 0.0
    # Chance repeats of uniform tokens mislead a last-occurrence copier, but it still gains nats.
    assert measure_copy_loss_drop(Copier(), recipe) > 2


@pytest.mark.slow
def test_the_real_default_finds_toy_neox_s_induction_circuit(toy_panel, tmp_path):
    """`python -m emergence` with no arguments, on the real toy_neox (trained by the session's
    ``toy_panel`` sweep; only its trained panel is copied, not the sweep's cached measurements)."""
    from tests.helpers.cli import run_cli

    shutil.copytree(Path(toy_panel[1]["EMERGENCE_CACHE"]) / "toy", tmp_path / "cache" / "toy")
    env = {"EMERGENCE_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}

    def run(name, *args):
        res = run_cli(f"hydra.run.dir={tmp_path / name}", *args, env=env, timeout=1200)
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads((tmp_path / name / "summary.json").read_text())

    final = run("default")
    assert final["model"] == "toy_neox" and final["revision"] == "step2048"
    assert final["induction_circuit"], "the trained toy model has induction heads"
    assert final["measures"]["training_copy_loss"]["copy_loss_drop"] > 2  # and copies in context
    ab = final["ablation"]
    circuit_rise = ab["circuit"]["loss"] - ab["clean"]["loss"]
    control_rise = sum(r["metrics"]["loss"] for r in ab["controls"]) / len(ab["controls"]) - ab["clean"]["loss"]
    assert circuit_rise > 0.5 and circuit_rise > 3 * max(control_rise, 0)  # far more than its controls
    assert ab["effect"]["causal"] is True
    # One of its heads alone has a clear verdict: adaptive ablation decides it on a quarter of
    # the probe at most, and agrees with ablation over every sequence.
    head = f"ablate.heads=[{final['induction_circuit'][-1]}]"
    adaptive, every = run("adaptive", head)["ablation"], run("all", head, "ablate.sequences=all")["ablation"]
    assert adaptive["stopped_early"] and adaptive["sequences_used"] <= 0.25 * final["probe"]["n_sequences"]
    assert every["sequences_used"] == final["probe"]["n_sequences"]
    assert adaptive["effect"]["causal"] is every["effect"]["causal"] is True
    untrained = run("r0", "revision=r0")
    assert untrained["induction_circuit"] == [] and untrained["member_counts"]["induction"] == 0


# --- what determines the bits, and the documented panels ----------------------------------------


def test_manifest_records_the_numerical_environment_each_checkpoints_sha256_and_the_step_losses(tmp_path):
    import hashlib

    from emergence.toy import repro
    from emergence.toy.repro import LOSSES

    cfg = reduced("toy_olmo", tmp_path)
    manifest = train(cfg.model)
    root = tmp_path / "toy" / "toy_olmo" / "seed0"
    env = manifest["environment"]
    assert env == json.loads((root / MANIFEST).read_text())["environment"]
    assert env["numerics"] == "native" and env["torch"] == torch.__version__
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["threads"] == torch.get_num_threads()
    assert env["mkl_cbwr"] == repro.mkl_branch()
    assert (env["mkl_cbwr"] is None) == (not torch.backends.mkl.is_available())
    for c in manifest["checkpoints"]:
        assert c["sha256"] == hashlib.sha256((root / c["revision"] / "model.safetensors").read_bytes()).hexdigest()
    header, *rows = (root / LOSSES).read_text().splitlines()
    losses = repro.read_losses(root)
    assert header == "step\tloss" and [int(r.split("\t")[0]) for r in rows] == [0, 1, 2, 3] and len(losses) == 4
    # A checkpoint's training loss is that of the last step before it, bit for bit.
    assert [c["train_loss"] for c in manifest["checkpoints"]] == [None, losses[1], losses[3]]
    assert manifest["documented"]["status"] == "undocumented"  # a 4-step panel is documented nowhere


def test_a_retrain_says_whether_it_reproduces_the_documented_panel_and_how_it_differs(tmp_path, monkeypatch):
    from dataclasses import asdict

    from emergence.toy import repro
    from emergence.toy.train import weights_recipe

    cfg = reduced("toy_neox", tmp_path / "a")
    manifest = train(cfg.model)
    weights = weights_recipe(asdict(cfg.model.toy))
    documented = tmp_path / "documented_panels.json"
    repro.document(manifest, weights, documented)
    assert repro.document(manifest, weights, documented)  # documenting again replaces the entry
    assert len(repro.documented_panels(documented)) == 1
    monkeypatch.setattr(repro, "DOCUMENTED", documented)
    again = train(reduced("toy_neox", tmp_path / "b").model)  # the same recipe in the same process
    assert again["documented"]["status"] == "reproduces", again["documented"]["message"]
    assert "reproduces the documented panel" in again["documented"]["message"]

    panels = repro.documented_panels(documented)
    step4 = panels[0]["checkpoints"]["step4"]
    step4["sha256"] = "0" * 64  # the documented run parted after step 2
    step4["train_loss"] += 0.5
    same_env = repro.compare_to_documented(manifest, weights, panels)
    assert same_env["status"] == "differs" and same_env["differing"] == ["step4"]
    assert same_env["compared"] == ["step0", "step2", "step4"] and same_env["environment_differs"] == []
    assert "from step4 on" in same_env["message"] and "CPU is" in same_env["message"]
    panels[0]["environment"] = {**panels[0]["environment"], "cpu_capability": "DEFAULT", "threads": 64}
    other_env = repro.compare_to_documented(manifest, weights, panels)
    assert other_env["environment_differs"] == ["cpu_capability", "threads"]
    assert f"cpu_capability {manifest['environment']['cpu_capability']} (documented DEFAULT)" in other_env["message"]
    assert "threads" in other_env["message"] and "training loss at step4" in other_env["message"]
    # Of two documented panels of the recipe, the one reproduced is named, not the closest other.
    both = repro.compare_to_documented(manifest, weights, panels + repro.documented_panels(documented))
    assert both["status"] == "reproduces"
    assert repro.compare_to_documented(manifest, {**weights, "seed": 1}, panels)["status"] == "undocumented"


def test_a_run_on_a_toy_whose_bits_differ_from_the_documented_panel_says_so_in_one_line(tmp_path, monkeypatch, caplog):
    """Where the panel a run reads is not the documented one, the run's output names what differs (here the
    CPU capability), not only the manifest; the documented panel itself passes without a word."""
    import logging
    from dataclasses import asdict

    from emergence.toy import repro
    from emergence.toy.train import ensure_trained, weights_recipe

    cfg = reduced("toy_neox", tmp_path)
    manifest = train(cfg.model)
    documented = tmp_path / "documented_panels.json"
    repro.document(manifest, weights_recipe(asdict(cfg.model.toy)), documented)
    monkeypatch.setattr(repro, "DOCUMENTED", documented)

    def warnings() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="emergence"):
            ensure_trained(cfg.model)  # complete: nothing to train
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    assert warnings() == []
    panels = json.loads(documented.read_text())
    panels["panels"][0]["checkpoints"]["step4"]["sha256"] = "0" * 64
    panels["panels"][0]["environment"]["cpu_capability"] = "DEFAULT"
    documented.write_text(json.dumps(panels))
    (line,) = warnings()
    assert "differs from the documented panel from step4 on" in line
    assert f"cpu_capability {manifest['environment']['cpu_capability']} (documented DEFAULT)" in line


def test_first_divergence_and_the_comparison_of_two_trainings(tmp_path):
    from emergence.toy import repro

    assert repro.first_divergence([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) is None
    assert repro.first_divergence([1.0, 2.0, 3.0, 4.0], [1.0, 2.0 + 1e-7, 3.5, 4.0]) == 1
    assert repro.first_divergence([1.0, 2.0, 3.0], [1.0, 2.0 + 1e-7, 3.5], tolerance=1e-3) == 2
    train(reduced("toy_neox", tmp_path / "a").model)
    train(reduced("toy_neox", tmp_path / "b", "model.toy.lr=1e-2").model)  # parts at the first update
    a, b = (tmp_path / d / "toy" / "toy_neox" / "seed0" for d in ("a", "b"))
    text = repro.compare_trainings(a, b)
    assert "first step with |loss difference| > 0: 1" in text
    assert "step0: identical" in text and "step4: differs" in text
    assert "first step with |loss difference| > 0: none (of 4)" in repro.compare_trainings(a, a)


def test_numerics_is_part_of_the_recipe_and_old_manifests_were_native(tmp_path):
    assert compose_config(["model=toy_neox"]).model.toy.numerics == "portable"  # every toy's default
    cfg = reduced("toy_neox", tmp_path)
    root = tmp_path / "toy" / "toy_neox" / "seed0"
    train(cfg.model)
    assert is_complete(root, cfg.model)
    portable = reduced("toy_neox", tmp_path, "model.toy.numerics=portable")
    assert not is_complete(root, portable.model)  # a native panel does not serve a portable request
    manifest = json.loads((root / MANIFEST).read_text())
    del manifest["recipe"]["numerics"]  # a manifest written before numerics existed
    (root / MANIFEST).write_text(json.dumps(manifest))
    assert is_complete(root, cfg.model) and not is_complete(root, portable.model)


@pytest.mark.parametrize("model", ["toy_neox", "model=toy_tasks"])  # a toy named bare, or as Hydra names it
def test_a_bad_toy_recipe_is_one_line_exit_2_and_trains_nothing(tmp_path, model):
    done = run_cli(
        model, "--override", f"cache_dir={tmp_path}", "--override", "model.toy.numerics=fast", module="emergence.toy"
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: model.toy.numerics='fast' is invalid: use one of native, portable (portable: the same bits on any "
        "x86 CPU with AVX2)"
    ]
    assert not (tmp_path / "toy").exists()


@pytest.mark.slow
def test_portable_numerics_train_in_a_pinned_process_whatever_this_one_runs(tmp_path, monkeypatch):
    """ATen's AVX2 kernels, oneMKL's COMPATIBLE branch and the recipe's threads, however the caller was
    started; the thread count is part of the recipe (docs/toy-reproducibility.md: it moves the bits)."""
    from dataclasses import asdict

    from emergence.toy import repro
    from emergence.toy.train import weights_recipe

    first = train(reduced("toy_olmo", tmp_path / "a", "model.toy.numerics=portable").model)
    env = first["environment"]
    assert env["numerics"] == "portable" and repro.is_portable(env, 2)
    assert (env["cpu_capability"], env["mkl_cbwr"], env["threads"]) == ("AVX2", "COMPATIBLE,STRICT", 2)
    for key, value in {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)  # what the caller's environment says is overridden
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # and so are the caller's own threads
        second = train(reduced("toy_olmo", tmp_path / "b", "model.toy.numerics=portable").model)
    finally:
        torch.set_num_threads(threads)
    assert second["environment"] == env
    assert [c["sha256"] for c in second["checkpoints"]] == [c["sha256"] for c in first["checkpoints"]]
    one = reduced("toy_olmo", tmp_path / "c", "model.toy.numerics=portable", "model.toy.threads=1").model
    assert train(one)["environment"]["threads"] == 1
    assert weights_recipe(asdict(one.toy)) != weights_recipe(asdict(reduced("toy_olmo", tmp_path / "b").model.toy))


def test_documented_panels_are_of_the_current_recipes_and_panels():
    """Each documented panel is what its model's config trains now (a recipe change needs new ones)."""
    from dataclasses import asdict

    from emergence.toy import repro
    from emergence.toy.train import checkpoints_to_save, weights_recipe

    panels = repro.documented_panels()
    assert panels, "emergence/toy/documented_panels.json documents no panel"
    for panel in panels:
        recipe = panel["recipe"]
        cfg = compose_config(
            [f"model={panel['model']}", f"model.toy.seed={recipe['seed']}", f"model.toy.numerics={recipe['numerics']}"]
        )
        assert weights_recipe(asdict(cfg.model.toy)) == recipe, panel["model"]
        assert {e.revision for e in checkpoints_to_save(cfg.model)} <= set(panel["checkpoints"])
        assert all(len(c["sha256"]) == 64 for c in panel["checkpoints"].values())
        assert set(repro.BITS_FIELDS) <= set(panel["environment"])
        if recipe["numerics"] == "portable":  # trained on the threads its recipe pins
            assert panel["environment"]["threads"] == cfg.model.toy.threads, panel["model"]


def test_the_per_seed_sink_summary_reads_the_panel_report():
    from emergence.panel.records import PanelFindings
    from emergence.panel.seeds import seed_rows, seeds_markdown

    def model(bos_per_layer, onset, bos_10, sink0):
        revs = [
            {
                "revision": f"step{s}",
                "tokens": s,
                "bos_fraction": sum(layers) / 16,
                "bos_per_layer": layers,
                "n_induction": 3 * (s >= 2),
            }
            for s, layers in zip(range(4), bos_per_layer)
        ]
        return {
            "revisions": revs,
            "f3": {"induction_onset": onset and {"revision": onset}, "bos_10": bos_10 and {"revision": bos_10}},
            "sinks_gu": {"revisions": [{"sink_fraction": 0.0}] * 3 + [{"sink_fraction": sink0}]},
        }

    findings = PanelFindings.from_json(
        {
            "models": {
                "toy_olmo_sinks-seed10": model([[0] * 4, [0] * 4, [1, 0, 0, 0], [1, 0, 0, 0]], "step2", None, 0.01),
                "toy_olmo_sinks-seed2": model([[0] * 4, [0] * 4, [0, 0, 1, 1], [0, 0, 1, 2]], "step2", "step2", 0.02),
                "toy_olmo_sinks-seed1": model([[0] * 4, [0, 0, 0, 1], [0] * 4, [0, 0, 1, 1]], "step2", "step3", 0.03),
                "toy_neox": model([[0] * 4] * 4, None, None, 0.0),
            }
        }
    )
    rows = seed_rows(findings, "toy_olmo_sinks")
    assert [r.seed for r in rows] == [1, 2, 10]  # by seed, not by name
    assert [r.final_bos for r in rows] == [12.5, 18.75, 6.25]
    assert [r.final_layers for r in rows] == ["L2+L3", "L2+L3", "L0"]
    assert [r.sinks_in_layers_ge_2_only for r in rows] == [True, True, False]
    assert [r.bos_10_after_onset for r in rows] == [True, False, None]
    assert rows[0].bos[1] == ("step1", 6.25, "L3") and rows[1].final_sink0 == 2.0
    text = seeds_markdown(findings, "toy_olmo_sinks")
    assert "median 12.5, range 6.2-18.8, 3 seeds" in text
    assert "only in layers >= 2: 2 of 3" in text and "first after the induction onset: 1 of 3" in text
