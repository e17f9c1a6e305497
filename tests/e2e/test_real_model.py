"""A real pretrained model, end to end: SmolLM2-135M-Instruct from its GGUF file (``tests/helpers/real_model.py``),
30 layers x 9 heads, trained without a BOS before its inputs. Every per-head number and task metric is
checked against an eager computation on the same dequantized weights."""

import hashlib
import json

import numpy as np
import pytest
import torch

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub.text_sources import load_tokenizer
from emergence.main import analyse
from emergence.recipe.probe import RepeatLayout, baseline_positions, make_probe_batch
from emergence.recipe.screen import CLASSES, selectivity
from emergence.recipe.tasks.batches import build_task_batch
from emergence.run.results import read_run
from tests.helpers.cli import last_line, run_cli
from tests.helpers.reference_impl import eager_model, eager_targets
from tests.helpers.task_reference import reference_metrics

pytestmark = pytest.mark.slow
N_LAYERS, N_HEADS = 30, 9
IM_START = 1  # SmolLM2's BOS token, <|im_start|>: its tokenizer puts it before no input
QUICK = ["probe=quick", "probe.batch_size=8", "wandb.mode=disabled", "reuse=false"]


@pytest.fixture(scope="module")
def eager(smollm2):
    return eager_model(smollm2.hf_dir)


def _assert_selectivities_equal_eager(run_dir, eager, ab: np.ndarray, seq_len: int):
    """heads.csv's six selectivities per head against the eager patterns over the run's own tokens."""
    _, rows = read_run(run_dir)
    assert len(rows) == N_LAYERS * N_HEADS
    with np.load(run_dir / "per_sequence.npz") as npz:
        tokens = torch.from_numpy(npz["tokens"])
    sel = selectivity(eager_targets(eager, tokens, ab, baseline_positions(seq_len, 50)).mean(0))
    ours = np.array([[r[f"sel_{c}"] for c in CLASSES] for r in rows]).reshape(N_LAYERS, N_HEADS, len(CLASSES))
    np.testing.assert_allclose(ours, sel, rtol=1e-4, atol=1e-6)
    return tokens


def test_the_command_on_the_gguf_file_equals_the_eager_reference(smollm2, eager, tmp_path):
    """The issue's command, on the GGUF file as shipped: the numbers, the file's record, first token random."""
    run_dir = tmp_path / "run"
    done = run_cli(
        "model=local",
        f"model.name_or_path={smollm2.folder}",
        f"model.gguf_file={smollm2.gguf_file}",
        *QUICK,
        "probe.n_sequences=16",
        f"hydra.run.dir={run_dir}",
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["gguf"] == {
        "file": smollm2.gguf_file,
        "architecture": "llama",
        "quantization": {"F32": 61, "Q4_1": 210, "Q8_0": 1},
    }
    assert summary["weights_sha256"] == hashlib.sha256(smollm2.gguf_path.read_bytes()).hexdigest()
    assert summary["probe"]["first"]["kind"] == "random"
    assert "first token: random: probe.first_token=auto: its tokenizer puts no BOS before an input" in done.stderr
    batch = make_probe_batch(16, 256, 100, 10000, 42)
    tokens = _assert_selectivities_equal_eager(run_dir, eager, batch.ab.numpy(), 256)
    assert torch.equal(tokens, batch.tokens)  # random: the study's batch, as drawn
    assert summary["ablation"]["effect"] is not None


def test_first_token_bos_puts_im_start_first_and_its_numbers_equal_eager(smollm2, eager, tmp_path):
    cfg = compose_config(
        [
            "model=local",
            f"model.name_or_path={smollm2.hf_dir}",
            *QUICK,
            "probe.n_sequences=8",
            "probe.first_token=bos_token",
            "ablate.enabled=false",
        ]
    )
    summary = analyse(cfg, tmp_path)
    assert (summary.probe.first.kind, summary.probe.first.bos_id) == ("bos_token", IM_START)
    batch = make_probe_batch(8, 256, 100, 10000, 42)
    tokens = _assert_selectivities_equal_eager(tmp_path, eager, batch.ab.numpy(), 256)
    assert (tokens[:, 0] == IM_START).all() and torch.equal(tokens[:, 1:], batch.tokens[:, 1:])


def test_the_repeat_probe_copies_and_its_ablation_reports_a_verdict(smollm2, eager, tmp_path):
    """SmolLM2 copies a repeated random span (its loss on the copy falls far below the first reading's),
    every position's loss is the eager cross-entropy, and the induction circuit's ablation is measured."""
    cfg = compose_config(
        [
            "model=local",
            f"model.name_or_path={smollm2.hf_dir}",
            *QUICK,
            "probe=repeat",
            "probe.n_sequences=8",
            "ablate.sequences=all",
        ]
    )
    summary = analyse(cfg, tmp_path)
    with np.load(tmp_path / "per_sequence.npz") as npz:
        tokens, losses = torch.from_numpy(npz["tokens"]), npz["position_losses"]
    with torch.no_grad():
        logits = eager(tokens).logits.double()
    eager_losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
    ).numpy()
    # column j: the loss on token j+1. Our attention and eager's round differently in float32, and through
    # 30 layers whose residual holds a 16,000x massive activation that is a few 1e-4 nats
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-4, atol=1e-3)
    layout = RepeatLayout(256)
    first_reading = eager_losses[:, layout.prefix : layout.copy_start - 1].mean()
    copy = eager_losses[:, layout.copy_start :].mean()
    assert first_reading - copy > 3.0  # nats: induction on a real model
    effect = summary.ablation.effect
    assert summary.induction_circuit and effect.circuit_loss_increase > 1.0
    # a circuit that crowds its layers still gets a verdict: against controls drawn by the fallback if need be
    assert effect.controls_loss_increase_mean is not None and effect.causal is not None
    draw = summary.ablation.control_draw
    assert draw.in_layer + draw.fallback >= 3


@pytest.mark.parametrize("task", ["ioi", "binding", "successor"])
def test_the_task_probes_run_on_its_tokenizer_with_the_words_it_keeps(smollm2, eager, task, tmp_path):
    cfg = compose_config(
        [
            "model=local",
            f"model.name_or_path={smollm2.hf_dir}",
            *QUICK,
            "probe.n_sequences=8",
            f"probe={task}",
            "probe.task_prompts=24",
            "probe.batch_size=8",
            "ablate.mr_seeds=3",
            "ablate.sequences=all",
            "stats.n_boot=200",
        ]
    )
    summary = analyse(cfg, tmp_path)
    task_summary = summary.task
    tokenizer = load_tokenizer(str(smollm2.hf_dir), "smollm2", False, "")
    batch = build_task_batch(task, tokenizer, 24, words="auto")
    assert task_summary.fingerprint == batch.fingerprint()
    # SmolLM2 splits ' Donna' and ' Bangkok', and writes numbers digit by digit: auto filters them out
    dropped = {"ioi": ("names", "Donna"), "binding": ("cities", "Bangkok"), "successor": ("numbers", "33")}[task]
    assert task_summary.words.mode == "filtered" and dropped[1] in task_summary.words.dropped[dropped[0]]
    per_prompt = reference_metrics(eager, task, batch.tokens, batch.target, batch.distractor)
    ours = task_summary.metrics.metrics
    names = {
        "ioi": {"top1": "top1", "logit_diff_mean": "logit_diff"},
        "binding": {"top1": "top1", "logit_diff_mean": "logit_diff"},
        "successor": {"top1": "top1", "target_logit_mean": "target_logit"},
    }[task]
    for name, column in names.items():
        assert ours[name].value == pytest.approx(per_prompt[column].mean(), abs=1e-4), name


def test_greater_than_cannot_be_posed_on_its_digit_tokenizer(smollm2, tmp_path):
    cfg = compose_config(
        ["model=local", f"model.name_or_path={smollm2.hf_dir}", *QUICK, "probe.n_sequences=8", "probe=greater_than"]
    )
    with pytest.raises(UsageError, match="greater_than cannot be posed"):
        analyse(cfg, tmp_path)


def test_a_truncated_gguf_file_is_one_line(smollm2, tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    with open(smollm2.gguf_path, "rb") as whole:
        (folder / smollm2.gguf_file).write_bytes(whole.read(50_000_000))
    done = run_cli(
        "model=local",
        f"model.name_or_path={folder}",
        f"model.gguf_file={smollm2.gguf_file}",
        *QUICK,
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last_line(done.stderr).endswith(
        "is truncated or not a GGUF file (cannot reshape array of size 399424 into shape (576,960)); download it again"
    )
    assert not (tmp_path / "run").exists()


def test_two_quantizations_in_one_folder_are_measured_each_on_its_own(smollm2, tmp_path):
    """Two GGUF files of one model in one folder, as GGUF repositories keep their quantizations: with
    reuse=true the second is measured afresh (its layers 0-3 differ from the first's), and the
    first, run again, is served from the cache."""
    from gguf import GGUFReader

    folder = tmp_path / "quantizations"
    folder.mkdir()
    data = bytearray(smollm2.gguf_path.read_bytes())
    (folder / "a.gguf").write_bytes(data)
    for tensor in GGUFReader(smollm2.gguf_path).tensors:  # b: attention norms of layers 0-3 halved
        if tensor.name in {f"blk.{layer}.attn_norm.weight" for layer in range(4)}:
            start = int(tensor.data_offset)
            halved = np.frombuffer(bytes(data[start : start + tensor.n_bytes]), dtype=np.float32) / 2
            data[start : start + tensor.n_bytes] = halved.tobytes()
    (folder / "b.gguf").write_bytes(data)
    base = [
        "model=local",
        f"model.name_or_path={folder}",
        "probe=quick",
        "probe.batch_size=8",
        "probe.n_sequences=8",
        "wandb.mode=disabled",
        "ablate.enabled=false",
        f"cache_dir={tmp_path / 'cache'}",
    ]

    a = analyse(compose_config([*base, "model.gguf_file=a.gguf"]), tmp_path / "a")
    b = analyse(compose_config([*base, "model.gguf_file=b.gguf"]), tmp_path / "b")
    again = analyse(compose_config([*base, "model.gguf_file=a.gguf"]), tmp_path / "again")
    assert (a.reused_measurements, b.reused_measurements, again.reused_measurements) == (False, False, True)
    sel = {
        run: np.array([r["sel_bos"] for r in read_run(tmp_path / run)[1]]).reshape(N_LAYERS, N_HEADS)
        for run in ("a", "b", "again")
    }
    np.testing.assert_array_equal(sel["again"], sel["a"])
    assert (np.abs(sel["b"][:4] - sel["a"][:4]) > 1e-3).any()
    assert b.weights_sha256 == hashlib.sha256(data).hexdigest() != a.weights_sha256
