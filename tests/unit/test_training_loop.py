"""The recipe inside a training, in process: ``emergence.track`` leaves the model and the random streams as
it found them, a failure is one warning line and ``FAILED``; ``EmergenceCallback`` refuses a sharded model
once and runs on the main process only; ``series.unfinished`` tells a checkpoint being written; ``watch``'s
bad arguments end in one line. The Trainer end to end: tests/e2e/test_training_loop.py."""

import json
import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerControl, TrainerState

from emergence import track
from emergence.hub.series import unfinished
from emergence.integrations import EmergenceCallback
from emergence.integrations.watch import main as watch_main
from emergence.run.results import HEADS_FILE, SUMMARY_FILE, RunSummary
from emergence.run.sweep import FAILED_FILE

FAST = ["probe.n_sequences=48", "ablate.min_sequences=16"]  # the quick probe, smaller: these test bookkeeping


@pytest.fixture
def model():
    """A tiny Llama as a training holds it: train mode, SDPA attention, dropout that would draw random numbers."""
    torch.manual_seed(0)
    net = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
            attention_dropout=0.1,
            attn_implementation="sdpa",
        )
    )
    net.train()
    net.model.layers[1].eval()  # a module the training froze in eval mode stays so
    return net


def rng_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def test_track_writes_the_run_and_leaves_the_model_and_the_random_streams_as_they_were(model, tmp_path):
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    before = rng_states()
    summary = track(model, 40, 5120, out=tmp_path, overrides=FAST)
    assert isinstance(summary, RunSummary)
    assert (summary.model, summary.revision, summary.step, summary.tokens) == ("local", "step40", 40, 5120)
    assert summary.weights_sha256 is None and not summary.reused_measurements  # no file names a live model's weights
    assert summary.probe.seq_len == 64 and summary.probe_fit is not None  # fitted to the model, as the command's
    run = tmp_path / "emergence" / "step40"
    assert {p.name for p in run.iterdir()} >= {HEADS_FILE, SUMMARY_FILE, "per_sequence.npz", "classes.png"}
    assert RunSummary.read(run) == summary
    assert [m.training for m in model.modules()] == modes and not model.model.layers[1].training
    assert model.config._attn_implementation == "sdpa"
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    after = rng_states()
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1]) and before[2] == after[2]


def test_a_failure_is_one_warning_line_and_failed_and_the_next_call_clears_it(model, tmp_path, monkeypatch, caplog):
    def broken(cfg, loaded, out_dir):
        raise RuntimeError("the capture broke\nsecond line")

    monkeypatch.setattr("emergence.run.steps.measure", broken)
    with caplog.at_level(logging.WARNING):
        assert track(model, 10, out=tmp_path, overrides=FAST) is None
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("emergence: step 10 not analysed (RuntimeError: the capture broke); training goes on")
    run = tmp_path / "emergence" / "step10"
    failed = (run / FAILED_FILE).read_text()
    assert failed.startswith("RuntimeError: the capture broke\n") and "Traceback" in failed
    assert not (run / SUMMARY_FILE).exists() and not (run / HEADS_FILE).exists()
    assert model.training and model.config._attn_implementation == "sdpa"  # restored on the way out too

    monkeypatch.undo()
    assert track(model, 10, out=tmp_path, overrides=FAST) is not None
    assert not (run / FAILED_FILE).exists() and (run / SUMMARY_FILE).exists()


def test_a_bad_override_is_its_own_line(model, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert track(model, 10, out=tmp_path, overrides=["probe.fit=off"]) is None
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "probe.seq_len=256 is invalid: the model's context is 64 tokens" in line
    assert (tmp_path / "emergence" / "step10" / FAILED_FILE).read_text().startswith("probe.seq_len=256 is invalid")


def callback_args(tmp_path, fsdp=None):
    return SimpleNamespace(output_dir=str(tmp_path), fsdp=fsdp)


def test_the_callback_refuses_a_sharded_model_once_and_runs_on_the_main_process_only(model, tmp_path, caplog):
    callback = EmergenceCallback(overrides=FAST)
    state = TrainerState(global_step=10)
    with caplog.at_level(logging.WARNING):
        for step in (10, 20):
            state.global_step = step
            callback.on_save(callback_args(tmp_path, fsdp=["full_shard"]), state, TrainerControl(), model=model)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "sharded across ranks (FSDP) is not supported" in line and "training goes on" in line
    first = next(model.parameters())
    first.ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    assert EmergenceCallback().analyse(callback_args(tmp_path), state, model, None) is None
    del first.ds_id
    state.is_world_process_zero = False  # another rank: nothing
    callback.on_save(callback_args(tmp_path), state, TrainerControl(), model=model)
    assert not (tmp_path / "emergence").exists()
    for every in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"every_steps={every!r} is invalid: analyse every N >= 1 steps"):
            EmergenceCallback(every_steps=every)
    with pytest.raises(
        ValueError, match=r"overrides='probe=quick' is invalid: pass a list of overrides, e.g. \['probe"
    ):
        EmergenceCallback(overrides="probe=quick")


def save_checkpoint(model, folder):
    model.save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    return folder


def test_a_checkpoint_is_whole_once_config_weights_at_their_declared_size_and_trainer_state_are(model, tmp_path):
    folder = save_checkpoint(model, tmp_path / "checkpoint-10")
    assert unfinished(folder) is None
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # half written
    assert unfinished(folder) == "model.safetensors is shorter than its header declares"
    (folder / "model.safetensors").write_bytes(weights[:6])  # not even its header
    assert unfinished(folder) == "model.safetensors is shorter than its header declares"
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "trainer_state.json").write_text('{"global_st')  # the Trainer writes it after the weights
    assert unfinished(folder) == "no whole trainer_state.json yet"
    (folder / "trainer_state.json").unlink()
    assert unfinished(folder) == "no whole trainer_state.json yet"
    (folder / "config.json").write_text("{")
    assert unfinished(folder) == "no whole config.json yet"
    step = save_checkpoint(model, tmp_path / "step10")  # no Trainer: no trainer_state.json to wait for
    (step / "trainer_state.json").unlink()
    assert unfinished(step) is None
    (step / "model.safetensors").rename(step / "model-00001-of-00002.safetensors")
    (step / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    assert unfinished(step) == "not every shard model.safetensors.index.json names is there yet"
    (tmp_path / "empty").mkdir()
    assert unfinished(tmp_path / "empty") == "no whole config.json yet"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["{dir}/nowhere"], "is not a directory"),
        (["{dir}/one"], "is one checkpoint (it holds config.json)"),
        (["{dir}", "revision=r3"], "revision=r3 is invalid here: watch names each checkpoint itself"),
        (["{dir}", "model.name_or_path=x"], "model.name_or_path=x is invalid here"),
        (["{dir}", "--poll", "0"], "--poll 0.0 is invalid"),
        (["{dir}", "--poll", "nan"], "--poll nan is invalid"),
        (["{dir}", "--every", "3"], "unrecognized arguments: --every 3"),
    ],
)
def test_watch_ends_bad_arguments_in_one_line_exit_2(argv, says, tmp_path, capsys):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        watch_main([a.format(dir=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: python -m emergence.watch: ") and says in err


def test_watch_ends_a_refused_override_in_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        watch_main([str(tmp_path), "probe=nope", "--once"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: probe=nope is invalid: no such preset in conf/probe")


COUNT = "an int >= 0"


@pytest.mark.parametrize(
    "step, tokens, overrides, says",
    [
        (-1, None, FAST, f"step=-1 is invalid: pass the training step, {COUNT}"),
        (True, None, FAST, f"step=True is invalid: pass the training step, {COUNT}"),
        (2.0, None, FAST, f"step=2.0 is invalid: pass the training step, {COUNT}"),
        (5, -10, FAST, f"tokens=-10 is invalid: pass the tokens seen so far, {COUNT}, or None"),
        (5, 1.5, FAST, f"tokens=1.5 is invalid: pass the tokens seen so far, {COUNT}, or None"),
        (5, None, "probe=quick", "overrides='probe=quick' is invalid: pass a list of overrides, e.g. ['probe=quick']"),
    ],
)
def test_a_bad_argument_is_one_line_and_writes_nothing(step, tokens, overrides, says, model, tmp_path, caplog):
    """A step, a token count or overrides that are no such thing: one line, nothing in the user's folder."""
    with caplog.at_level(logging.WARNING):
        assert track(model, step, tokens, out=tmp_path, overrides=overrides) is None
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line == f"emergence: {says}; nothing analysed"
    assert list(tmp_path.iterdir()) == []


def test_numpy_counts_are_counts_and_a_file_in_the_way_is_one_warning(model, tmp_path, caplog):
    summary = track(model, np.int64(5), np.int64(640), out=tmp_path / "ok", overrides=FAST)
    assert summary is not None and (summary.step, summary.tokens) == (5, 640)
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        assert track(model, 5, out=in_the_way, overrides=FAST) is None  # no exception into the training
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("emergence: step 5 not analysed (") and "training goes on (no FAILED file either" in line
    assert in_the_way.read_text() == "not a folder"


def test_watch_ends_a_bad_setting_in_one_line_exit_2_before_any_checkpoint(tmp_path, capsys):
    """A setting the run would refuse (a negative probe size) is refused once, before a checkpoint is read:
    nothing is written into the training's folder."""
    (tmp_path / "checkpoint-10").mkdir()
    with pytest.raises(SystemExit) as exit_:
        watch_main([str(tmp_path), "probe.n_sequences=-3", "--once"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: probe.n_sequences=-3 is invalid")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]
