"""Bad input to every command the package installs or documents (README): one line naming the input
and the fix, exit status 2, no traceback, nothing written. A missing path, a garbage argument and an
unknown name for each; then the inputs that once escaped as tracebacks or a misleading line."""

import json
import re
from importlib.resources import files
from pathlib import Path

import pytest
from tests.helpers.cli import run_cli

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.recipe.text import checkpoint_tokenizer

ENV = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}  # no downloads, no W&B
# The error line: ours ("error: ...") or argparse's ("python -m emergence.x: error: ...").
ERROR_LINE = re.compile(r"(python -m (emergence|benchmarks)[.\w]*: )?error: \S")
PRESETS = sorted(p.name.removesuffix(".yaml") for p in files("emergence.conf").joinpath("model").iterdir()
                 if p.name.endswith(".yaml"))


def error_lines(stderr: str) -> list[str]:
    """stderr without argparse's usage block (``usage: ...`` and its indented continuation lines),
    which argparse prints above its error line: its standard form."""
    lines = stderr.strip().splitlines()
    if lines and lines[0].startswith("usage: "):
        lines = [line for line in lines[1:] if not line.startswith(" ")]
    return lines


def assert_one_line(res, *words) -> str:
    """Exit 2, no traceback, nothing on stdout, and one error line on stderr holding ``words``."""
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stdout == "", res.stdout[-2000:]
    lines = error_lines(res.stderr)
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), res.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


COMMANDS = ("emergence", "emergence.refine", "emergence.report", "emergence.revisions", "emergence.toy",
            "emergence.panel.seeds", "benchmarks.bench")
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
        ("emergence", "missing path"): (["model=local", f"model.name_or_path={missing}", f"hydra.run.dir={run}"],
                                        [f"model.name_or_path='{missing}'"], [run]),
        ("emergence", "garbage"): (["model=pythia", "device=banana", f"hydra.run.dir={run}"], ["device='banana'"],
                                   [run]),
        ("emergence", "unknown name"): (["model=pythia", "revision=custom", "revision.name=nonsense",
                                         f"hydra.run.dir={run}"], ["revision.name='nonsense'", "step0"], [run]),
        ("emergence.refine", "missing path"): ([missing], [str(missing)], []),
        ("emergence.refine", "garbage"): ([tmp, "--parallel", "abc"], ["--parallel", "abc"], []),
        ("emergence.refine", "unknown name"): ([tmp, "--milestones", "nope"], ["nope", "induction_onset"], []),
        ("emergence.report", "missing path"): ([missing, "--out", report_out], [str(missing)], [report_out]),
        ("emergence.report", "garbage"): (["--reference", "--out", report_out, "--class-threshold", "abc"],
                                          ["--class-threshold", "abc"], [report_out]),
        ("emergence.report", "unknown name"): (["--reference", "--out", report_out, "--pr-estimator", "nope"],
                                               ["nope", "pr_entropy_rank"], [report_out]),
        ("emergence.revisions", "missing path"): (["local", "--repo", missing], [str(missing), "HF_HUB_OFFLINE"], []),
        ("emergence.revisions", "garbage"): (["pythia", "--propose", "abc"], ["--propose", "abc"], []),
        ("emergence.revisions", "unknown name"): (["gpt5"], ["model=gpt5", *PRESETS], []),
        ("emergence.toy", "missing path"): (["--compare", missing, tmp / "also_missing"], [str(missing)], []),
        ("emergence.toy", "garbage"): (["toy_neox", "--override", "garbage"], ["garbage"], []),
        ("emergence.toy", "unknown name"): (["toy_gpt"], ["toy_gpt", "toy_neox"], []),
        ("emergence.panel.seeds", "missing path"): ([missing], [str(missing)], []),
        ("emergence.panel.seeds", "garbage"): ([garbage], [str(garbage), "not a panel report"], []),
        ("emergence.panel.seeds", "unknown name"): ([no_models, "--model", "nope"], ["--model nope"], []),
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
    """The commands the README and docs/ name (``python -m emergence...``, ``python -m benchmarks.bench``) are the ones guarded,
    each with its three cases."""
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
    res = run_cli("model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", "probe=text",
                  f"probe.text_file={text}", "probe.tokenizer=bytes", "probe.seq_len=128", "probe.n_sequences=8",
                  "probe.icl_positions=[10,100]", f"hydra.run.dir={run}", env=ENV)
    assert_one_line(res, f"probe.text_file='{text}'", "not UTF-8", "byte 18 is 0xff")
    assert not run.exists()


@pytest.mark.slow
def test_a_checkpoint_without_tokenizer_files_is_told_so_not_that_the_text_is_short(tiny_dirs, tmp_path):
    """A GPTNeoX directory with its config and weights only: transformers builds an empty tokenizer
    for it, which once made a 155 kB text "0 windows ... use a larger text"."""
    text, run = tmp_path / "book.txt", tmp_path / "run"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 3500)
    res = run_cli("model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", "probe=text",
                  f"probe.text_file={text}", "probe.seq_len=128", "probe.n_sequences=8",
                  "probe.icl_positions=[10,100]", f"hydra.run.dir={run}", env=ENV)
    assert_one_line(res, str(tiny_dirs["gpt_neox"]), "has no tokenizer", "probe.tokenizer=bytes")
    assert not run.exists()


@pytest.mark.parametrize("arch", ["gpt_neox", "gpt2", "qwen2", "gemma2", "llama"])
def test_no_tokenizer_files_is_a_usage_error_whatever_transformers_builds(arch, tiny_dirs):
    """An empty tokenizer of the model type's class (gpt_neox, gpt2, qwen2, gemma2) or none (llama)."""
    with pytest.raises(UsageError, match="has no tokenizer.*probe.tokenizer=bytes"):
        checkpoint_tokenizer(str(tiny_dirs[arch]), f"{tiny_dirs[arch]}@main", False)


@pytest.mark.slow
def test_compare_of_folders_that_do_not_exist_names_them(tmp_path):
    res = run_cli("--compare", tmp_path / "a", tmp_path / "b", module="emergence.toy", env=ENV)
    assert_one_line(res, f"--compare {tmp_path / 'a'}", "manifest.json", "not a trained panel")


@pytest.mark.slow
def test_an_unknown_model_key_lists_the_presets():
    assert_one_line(run_cli("gpt5", module="emergence.revisions", env=ENV), "model=gpt5", ", ".join(PRESETS))


@pytest.mark.parametrize("override,words", [
    ("model=gpt5", ["model=gpt5 is invalid", ", ".join(PRESETS)]),
    ("probe=nope", ["probe=nope is invalid", "binding, greater_than, ioi, paper, quick, repeat, successor, text"]),
    ("probe.seq_len=abc", ["probe.seq_len=abc", "could not be converted to Integer"]),
    ("model.nope=1", ["model.nope", "not in 'ModelConfig'"]),
    ("garbage", ["garbage", "missing EQUAL"]),
])
def test_compose_config_refuses_an_override_in_one_line(override, words):
    """What every command that composes a config (revisions, toy, refine) prints."""
    with pytest.raises(UsageError) as caught:
        compose_config([override])
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message
