"""Bad input to every command the package installs or documents (README): one line naming the input
and the fix, exit status 2, no traceback, nothing written. A missing path, a garbage argument and an
unknown name for each; then the inputs that once escaped as tracebacks or a misleading line."""

import json
import re
from importlib.resources import files
from pathlib import Path

import pytest

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub.text_sources import load_tokenizer
from tests.helpers.cli import run_cli

ENV = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}  # no downloads, no W&B
ERROR_LINE = re.compile(r"error: \S")
PRESETS = sorted(
    p.name.removesuffix(".yaml")
    for p in files("emergence.conf").joinpath("model").iterdir()
    if p.name.endswith(".yaml")
)


def assert_one_line(res, *words) -> str:
    """Exit 2, no traceback, nothing on stdout, and one error line on stderr holding ``words``."""
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stdout == "", res.stdout[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), res.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


COMMANDS = (
    "emergence",
    "emergence.refine",
    "emergence.report",
    "emergence.revisions",
    "emergence.toy",
    "emergence.panel.seeds",
    "emergence.watch",
    "emergence.edge",
    "emergence.measures",
    "emergence.llc.calibrate",
    "benchmarks.bench",
)
INTERNAL = ("emergence.run.prefetch",)  # a sweep's downloader child process (docs/hub.md), not a user's command
CASES = [(module, case) for module in COMMANDS for case in ("missing path", "garbage", "unknown name")]


def command_cases(tmp) -> dict[tuple[str, str], tuple[list, list[str], list]]:
    """(module, case) -> (arguments, words the error line must hold, paths that must not exist
    afterwards); ``tmp`` holds the inputs."""
    missing = tmp / "missing"
    run = tmp / "run"  # python -m emergence's run directory
    report_out = tmp / "report"
    garbage = tmp / "garbage.json"
    garbage.write_text("not json\n")
    no_models = tmp / "findings.json"
    no_models.write_text(json.dumps({"models": {}}))
    return {
        ("emergence", "missing path"): (
            ["model=local", f"model.name_or_path={missing}", f"hydra.run.dir={run}"],
            [f"model.name_or_path='{missing}'"],
            [run],
        ),
        ("emergence", "garbage"): (
            ["model=pythia", "device=banana", f"hydra.run.dir={run}"],
            ["device='banana'"],
            [run],
        ),
        ("emergence", "unknown name"): (
            ["model=pythia", "revision=custom", "revision.name=nonsense", f"hydra.run.dir={run}"],
            ["revision.name='nonsense'", "step0"],
            [run],
        ),
        ("emergence.refine", "missing path"): ([missing], [str(missing)], []),
        ("emergence.refine", "garbage"): ([tmp, "--parallel", "abc"], ["--parallel", "abc"], []),
        ("emergence.refine", "unknown name"): ([tmp, "--milestones", "nope"], ["nope", "induction_onset"], []),
        ("emergence.report", "missing path"): ([missing, "--out", report_out], [str(missing)], [report_out]),
        ("emergence.report", "garbage"): (
            ["--reference", "--out", report_out, "--class-threshold", "abc"],
            ["--class-threshold", "abc"],
            [report_out],
        ),
        ("emergence.report", "unknown name"): (
            ["--reference", "--out", report_out, "--pr-estimator", "nope"],
            ["nope", "pr_entropy_rank"],
            [report_out],
        ),
        ("emergence.revisions", "missing path"): (["local", "--repo", missing], [str(missing), "HF_HUB_OFFLINE"], []),
        ("emergence.revisions", "garbage"): (["pythia", "--propose", "abc"], ["--propose", "abc"], []),
        ("emergence.revisions", "unknown name"): (["gpt5"], ["model=gpt5", *PRESETS], []),
        ("emergence.toy", "missing path"): (["--compare", missing, tmp / "also_missing"], [str(missing)], []),
        ("emergence.toy", "garbage"): (["toy_neox", "--override", "garbage"], ["garbage"], []),
        ("emergence.toy", "unknown name"): (["toy_gpt"], ["toy_gpt", "toy_neox"], []),
        ("emergence.panel.seeds", "missing path"): ([missing], [str(missing)], []),
        ("emergence.panel.seeds", "garbage"): ([garbage], [str(garbage), "not a panel report"], []),
        ("emergence.panel.seeds", "unknown name"): ([no_models, "--model", "nope"], ["--model nope"], []),
        ("emergence.watch", "missing path"): ([missing], [str(missing), "not a directory"], []),
        ("emergence.watch", "garbage"): ([tmp, "--poll", "abc"], ["--poll", "abc"], []),
        ("emergence.watch", "unknown name"): ([tmp, "--once", "probe=nope"], ["probe=nope", "quick"], []),
        ("emergence.edge", "missing path"): ([missing], [str(missing), "not a directory"], []),
        ("emergence.edge", "garbage"): (
            ["model=toy_neox", "edge.window=abc", "--out", tmp / "edge"],
            ["edge.window='abc'", "[10,20]"],
            [tmp / "edge"],
        ),
        ("emergence.edge", "unknown name"): (
            ["model=toy_neox", "edge.projection=nope", "--out", tmp / "edge"],
            ["edge.projection='nope'", "exact, sketch"],
            [tmp / "edge"],
        ),
        ("emergence.measures", "missing path"): ([missing], [str(missing), "No such file"], [missing]),
        ("emergence.measures", "garbage"): ([garbage], [str(garbage), "<!-- measures' columns"], []),
        ("emergence.measures", "unknown name"): (["--chek", garbage], ["--chek"], []),
        ("emergence.llc.calibrate", "missing path"): (
            ["model=local", f"model.name_or_path={missing}", "--out", tmp / "calibration"],
            [f"model.name_or_path='{missing}'"],
            [tmp / "calibration"],
        ),
        ("emergence.llc.calibrate", "garbage"): (["--lr", "abc"], ["--lr", "abc"], []),
        ("emergence.llc.calibrate", "unknown name"): (
            ["model=gpt5", "--out", tmp / "calibration"],
            ["model=gpt5", *PRESETS],
            [tmp / "calibration"],
        ),
        ("benchmarks.bench", "missing path"): (["--out", missing / "bench.json"], [str(missing)], [missing]),
        ("benchmarks.bench", "garbage"): (["--sequences", "abc"], ["--sequences", "abc"], []),
        ("benchmarks.bench", "unknown name"): (["--only", "nope"], ["nope"], []),
    }


@pytest.mark.slow
@pytest.mark.parametrize("module,case", CASES)
def test_every_command_answers_bad_input_in_one_line(module, case, tmp_path):
    args, words, absent = command_cases(tmp_path)[module, case]
    res = run_cli(*args, module=module, env=ENV, timeout=300)
    assert_one_line(res, *words)
    assert not [p for p in absent if p.exists()]


def test_every_documented_command_is_guarded(tmp_path):
    """The commands the README and docs/ name (``python -m emergence...``, ``python -m benchmarks.bench``) are
    the ones guarded, each with its three cases."""
    root = Path(__file__).parents[2]
    text = "".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    documented = set(re.findall(r"python -m ((?:emergence|benchmarks)(?:\.\w+)*)", text)) - set(INTERNAL)
    assert documented == set(COMMANDS)
    assert sorted(command_cases(tmp_path)) == sorted(CASES)


# The inputs that escaped: each exits 2 with one line naming the input and the fix, and writes nothing.


@pytest.mark.slow
def test_a_text_file_that_is_not_utf8_names_the_file_and_the_first_bad_byte(tiny_dirs, tmp_path):
    text, run = tmp_path / "book.txt", tmp_path / "run"
    text.write_bytes(b"plain words, then \xff and more")
    res = run_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        "probe=text",
        f"probe.text_file={text}",
        "probe.tokenizer=bytes",
        "probe.seq_len=128",
        "probe.n_sequences=8",
        "probe.icl_positions=[10,100]",
        f"hydra.run.dir={run}",
        env=ENV,
    )
    assert_one_line(res, f"probe.text_file='{text}'", "not UTF-8", "byte 18 is 0xff")
    assert not run.exists()


@pytest.mark.slow
def test_a_checkpoint_without_tokenizer_files_is_told_so_not_that_the_text_is_short(tiny_dirs, tmp_path):
    """A GPTNeoX directory with its config and weights only: transformers builds an empty tokenizer
    for it, which once made a 155 kB text "0 windows ... use a larger text"."""
    text, run = tmp_path / "book.txt", tmp_path / "run"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 3500)
    res = run_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        "probe=text",
        f"probe.text_file={text}",
        "probe.seq_len=128",
        "probe.n_sequences=8",
        "probe.icl_positions=[10,100]",
        f"hydra.run.dir={run}",
        env=ENV,
    )
    assert_one_line(res, str(tiny_dirs["gpt_neox"]), "has no tokenizer", "probe.tokenizer=bytes")
    assert not run.exists()


@pytest.mark.parametrize("arch", ["gpt_neox", "gpt2", "qwen2", "gemma2", "llama"])
def test_no_tokenizer_files_is_a_usage_error_whatever_transformers_builds(arch, tiny_dirs):
    """An empty tokenizer of the model type's class (gpt_neox, gpt2, qwen2, gemma2) or none (llama)."""
    with pytest.raises(UsageError, match="has no tokenizer.*probe.tokenizer=bytes"):
        load_tokenizer(
            str(tiny_dirs[arch]),
            f"{tiny_dirs[arch]}@main",
            False,
            "for a model that reads bytes use probe.tokenizer=bytes",
        )


@pytest.mark.slow
def test_compare_of_folders_that_do_not_exist_names_them(tmp_path):
    res = run_cli("--compare", tmp_path / "a", tmp_path / "b", module="emergence.toy", env=ENV)
    assert_one_line(res, f"--compare {tmp_path / 'a'}", "manifest.json", "not a trained panel")


@pytest.mark.slow
def test_an_unknown_model_key_lists_the_presets():
    assert_one_line(run_cli("gpt5", module="emergence.revisions", env=ENV), "model=gpt5", ", ".join(PRESETS))


@pytest.mark.parametrize(
    "override,words",
    [
        ("model=gpt5", ["model=gpt5 is invalid", ", ".join(PRESETS)]),
        ("probe=nope", ["probe=nope is invalid", "binding, greater_than, ioi, paper, quick, repeat, successor, text"]),
        ("probe.seq_len=abc", ["probe.seq_len=abc", "could not be converted to Integer"]),
        ("model.nope=1", ["model.nope", "not in 'ModelConfig'"]),
        ("garbage", ["garbage", "missing EQUAL"]),
    ],
)
def test_compose_config_refuses_an_override_in_one_line(override, words):
    """What every command that composes a config (revisions, toy, refine) prints."""
    with pytest.raises(UsageError) as caught:
        compose_config([override])
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


def pickled_checkpoint(source: Path, path: Path, shards: int) -> Path:
    """``source``'s model saved as pickled ``pytorch_model.bin`` (one file), or as that many pickled
    shards with their index, as Pythia's and Amber's branches hold them."""
    import shutil

    import torch
    from safetensors.torch import load_file

    path.mkdir()
    shutil.copy(source / "config.json", path / "config.json")
    state = load_file(source / "model.safetensors")
    if shards == 1:
        torch.save(state, path / "pytorch_model.bin")
        return path
    names = list(state)
    weight_map = {}
    for i in range(shards):
        shard = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = names[i::shards]
        torch.save({k: state[k] for k in part}, path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "shards,broken,cut",
    [
        (1, "pytorch_model.bin", 0.5),  # torch reads an mmap past the end: OSError
        (1, "pytorch_model.bin", 0.05),  # no zip directory left: RuntimeError (PytorchStreamReader)
        (3, "pytorch_model-00002-of-00003.bin", 0.5),  # one shard of three cut short
        (1, "pytorch_model.bin", None),  # not a pickle at all: UnpicklingError, not a refused global
    ],
)
def test_a_truncated_or_corrupt_pickle_names_the_file_and_the_fix(shards, broken, cut, tiny_dirs, tmp_path):
    ckpt = pickled_checkpoint(tiny_dirs["gpt_neox"], tmp_path / "ckpt", shards)
    whole = (ckpt / broken).read_bytes()
    (ckpt / broken).write_bytes(b"garbage " * 64 if cut is None else whole[: int(len(whole) * cut)])
    run = tmp_path / "run"
    res = run_cli(
        "model=local",
        f"model.name_or_path={ckpt}",
        "probe=quick",
        "probe.n_sequences=8",
        "probe.seq_len=64",
        "probe.vocab_low=10",
        "probe.vocab_high=500",
        f"hydra.run.dir={run}",
        env=ENV,
    )
    line = assert_one_line(
        res, f"model.name_or_path='{ckpt}'", f"{ckpt / broken} is truncated or corrupt", "replace the file"
    )
    assert "would call code" not in line
    assert not run.exists()


def test_a_broken_pickle_in_the_hub_cache_is_deleted_and_downloaded_again(tiny_dirs, tmp_path):
    """In the Hugging Face cache the fix names the blob behind the snapshot's link, and the download."""
    from emergence.hub.checkpoints import Source, _broken_pickle

    blob = tmp_path / "blobs" / "ab12"
    blob.parent.mkdir()
    blob.write_bytes(b"cut")
    snapshot = tmp_path / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "pytorch_model.bin").symlink_to(blob)
    src = Source("EleutherAI/pythia-1b", "step512", local_only=True, cached_before=True)
    err = _broken_pickle(src, snapshot, ("pytorch_model.bin", "PytorchStreamReader failed"))
    assert str(err) == (
        f"model.name_or_path='EleutherAI/pythia-1b@step512' cannot be loaded: {snapshot / 'pytorch_model.bin'} is "
        f"truncated or corrupt (PytorchStreamReader failed); delete it from the Hugging Face cache ({blob}) and "
        "download it again: hf download EleutherAI/pythia-1b --revision step512 --force-download"
    )


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after its magic", "inside its header", "inside its tensor data"])
def test_a_gguf_file_cut_short_is_one_line(where, tmp_path):
    from tests.helpers.tiny_models import save_tiny_gguf

    save_tiny_gguf(tmp_path / "whole.gguf")
    data = (tmp_path / "whole.gguf").read_bytes()
    size = {"after its magic": 4, "inside its header": 60, "inside its tensor data": len(data) - 100}[where]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "m.gguf").write_bytes(data[:size])
    res = run_cli(
        "model=local",
        f"model.name_or_path={tmp_path / 'model'}",
        "model.gguf_file=m.gguf",
        f"hydra.run.dir={tmp_path / 'run'}",
        env=ENV,
    )
    assert_one_line(
        res, "model.gguf_file='m.gguf' cannot be read", "is truncated or not a GGUF file", "download it again"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "command, args, holds",
    [
        ("emergence.edge", ["model=toy_neox"], "edge.json and edge.png"),
        ("emergence.llc.calibrate", ["model=toy_neox"], "llc_calibration.json and its measures preset"),
        ("emergence.panel.report", ["RUNS"], "report.md, findings.json and the figures"),
    ],
)
def test_an_output_folder_that_is_a_file_is_one_line_before_any_work(command, args, holds, tmp_path, capsys):
    import importlib

    in_the_way = tmp_path / "out.txt"
    in_the_way.write_text("a file")
    (tmp_path / "runs").mkdir()
    argv = [str(tmp_path / "runs") if a == "RUNS" else a for a in args]
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(command).main([*argv, "--out", str(in_the_way)])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--out {in_the_way} is a file: give a folder for {holds}" in line and line.startswith("error: ")
    assert in_the_way.read_text() == "a file"
