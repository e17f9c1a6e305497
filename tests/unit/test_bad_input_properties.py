"""Bad values by the thousand (hypothesis): for every field of the run's configuration, a drawn value
of the wrong type, out of range, non-finite, empty, huge, not UTF-8, a list where a scalar goes or a
path that is not there either passes the checks made before any weights load, or is refused in one
line naming the field; nothing else escapes. The same through Hydra's override grammar
(``compose_config``) and, for a sample of the refused ones, through the command itself."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emergence.core.config import Config, compose_config
from emergence.core.errors import UsageError
from emergence.run.validation import validate

BASE = ["model=local", "model.name_or_path=/nonexistent/checkpoint", "wandb.mode=disabled"]


def leaf_fields(cls, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted name, annotated type) of every scalar or list field below the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        target = inner[0] if typing.get_origin(kind) is typing.Union and len(inner) == 1 else kind
        if dataclasses.is_dataclass(target) and typing.get_origin(target) is None:
            if f.name in ("toy",):  # the toy recipe is a preset's, checked by validate_recipe on its own fields
                continue
            out += leaf_fields(target, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", kind))
    return out


# model.key names the preset chosen; model.panel and published_steps are lists of records a preset writes
FIELDS = [
    (name, kind)
    for name, kind in leaf_fields(Config)
    if name not in ("model.key", "model.panel", "model.published_steps")
]
NUMBERS = st.one_of(
    st.integers(-(10**30), 10**30),
    st.sampled_from([0, -1, 1, 2, 10**6]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
TEXTS = st.one_of(
    st.just(""),
    st.text(max_size=20),
    st.just("x" * 5000),
    st.just("\udcff\udcfe not utf-8"),
    st.sampled_from(["/nonexistent/path", "/root/..", "null", "banana", "L99H99", "[1, 2]"]),
)
VALUES = st.one_of(NUMBERS, TEXTS, st.booleans(), st.none(), st.lists(st.one_of(NUMBERS, TEXTS), max_size=3))


@pytest.fixture(scope="module")
def base_config():
    return OmegaConf.structured(compose_config(BASE))


def is_numeric(kind) -> bool:
    return kind in (int, float) or set(typing.get_args(kind)) & {int, float} != set()


def is_non_finite(value) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def checked(base, name: str, value) -> str | None:
    """None where the value passes; the one line that refuses it otherwise. A value of the wrong
    type is refused by the schema (OmegaConf), which ``compose_config`` turns into one line."""
    cfg = base.copy()
    try:
        OmegaConf.update(cfg, name, value, merge=False)
        run_cfg = OmegaConf.to_object(cfg)
    except OmegaConfBaseException:
        return "refused by the schema"
    try:
        validate(run_cfg)
    except UsageError as err:
        return str(err)
    return None


@pytest.mark.parametrize(
    "examples", [pytest.param(300, id="fast"), pytest.param(3000, id="thousands", marks=pytest.mark.slow)]
)
def test_every_field_takes_a_bad_value_or_names_it_in_one_line(examples, base_config):
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(field=st.sampled_from(FIELDS), value=VALUES)
    def one(field, value):
        name, kind = field
        line = checked(base_config, name, value)
        if line is None:  # it passed: a number field then holds a finite number
            assert not (is_numeric(kind) and is_non_finite(value)), f"{name}={value!r} passed the checks"
            return
        assert "\n" not in line, line
        if line != "refused by the schema":
            assert line.split("=")[0].split("/")[0].startswith(name.rsplit(".", 1)[0].split(".")[0]), (name, line)

    one()


def test_non_finite_and_non_positive_thresholds_are_refused(base_config):
    for name in (
        "threshold.class_default",
        "threshold.circuit",
        "threshold.prev_token_circuit",
        "threshold.per_class.induction",
    ):
        for value in (math.nan, math.inf, -math.inf, 0.0, -1.0):
            line = checked(base_config, name, value)
            assert line is not None and line.startswith(f"{name}="), (name, value, line)
        assert checked(base_config, name, 12.5) is None


RAW = st.one_of(
    TEXTS,
    NUMBERS.map(str),
    st.sampled_from(
        ["[1,2]", "{a: 1}", "'quoted'", "${oc.env:NOPE}", "1e999", "-0", "true", "null", "=", "a=b", "[", "'unclosed"]
    ),
)


def composed(name: str, raw: str) -> str | None:
    """None where ``python -m emergence ... name=raw`` passes the checks before any weights load; the
    one line it is refused with otherwise."""
    try:
        validate(compose_config([*BASE, f"{name}={raw}"]))
    except UsageError as err:
        return str(err)
    return None


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(field=st.sampled_from(FIELDS), raw=RAW)
def test_every_override_as_typed_passes_or_is_one_line(field, raw):
    name, kind = field
    line = composed(name, raw)
    if line is not None:
        assert "\n" not in line and line.strip(), line


@pytest.mark.slow
def test_refused_overrides_are_one_line_and_exit_2_from_the_command(tmp_path):
    """A sample of refused overrides through ``python -m emergence``: the same line, exit 2, no run
    directory (the checks run before any weights load)."""
    from tests.e2e.test_bad_input import ENV, assert_one_line
    from tests.helpers.cli import run_cli

    cases = [
        ("threshold.circuit", "nan"),
        ("threshold.class_default", "inf"),
        ("probe.seq_len", "banana"),
        ("ablate.confidence", "1e999"),
        ("stats.n_boot", "-5"),
        ("probe.first_token", "'unclosed"),
        ("ablate.heads", "[L99]"),
        ("hub.prefetch", "[1,2]"),
    ]
    for name, raw in cases:
        line = composed(name, raw)
        assert line is not None, (name, raw)
        run = tmp_path / name
        res = run_cli(*BASE, f"{name}={raw}", f"hydra.run.dir={run}", env=ENV)
        assert assert_one_line(res) == f"error: {line}", (name, raw)
        assert not run.exists()


# The sibling commands, called as their ``python -m`` entry points are, on arguments drawn to be bad:
# no positional argument here names real work (a preset, a toy, a trained panel), so a run ends early.
def sibling_commands():
    from emergence.hub import revisions
    from emergence.panel import refine, report, seeds
    from emergence.toy import __main__ as toy

    return {
        "report": report.main,
        "revisions": revisions.main,
        "refine": refine.main,
        "toy": toy.main,
        "seeds": seeds.main,
    }


ARG_TEXT = st.one_of(TEXTS, NUMBERS.map(str), st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e999", "--", "-x"]))


def sibling_argv(empty: str) -> st.SearchStrategy:
    paths = st.sampled_from(["/nonexistent/path", empty, "", "no_such_preset"])
    value = st.one_of(ARG_TEXT, paths)
    options = {
        "report": [
            "--out",
            "--class-threshold",
            "--circuit-threshold",
            "--sink-epsilon",
            "--pr-estimator",
            "--wandb-mode",
            "--wandb-project",
            "--wandb-entity",
        ],
        "revisions": ["--tokens-per-step", "--repo", "--propose", "--from", "--to", "--between", "--check"],
        "refine": ["--milestones", "--parallel", "--sink-epsilon"],
        "toy": ["--override", "--compare"],
        "seeds": ["--model"],
    }
    flags = {"revisions": ["--all", "--json"], "refine": ["--scan"], "toy": ["--force", "--document"]}

    @st.composite
    def draw(data):
        command = data(st.sampled_from(sorted(options)))
        # toy: always a name that is no toy, so nothing trains
        argv = [data(paths if command != "toy" else st.sampled_from(["toy_none", "model=bogus", ""]))]
        for _ in range(data(st.integers(0, 4))):
            kind = data(st.sampled_from(["option", "flag", "stray"]))
            if kind == "option":
                argv += [data(st.sampled_from(options[command])), *data(st.lists(value, min_size=0, max_size=2))]
            elif kind == "flag" and command in flags:
                argv.append(data(st.sampled_from(flags[command])))
            else:
                argv.append(data(value))
        return command, argv

    return draw()


@pytest.mark.parametrize(
    "examples", [pytest.param(150, id="fast"), pytest.param(1500, id="thousands", marks=pytest.mark.slow)]
)
def test_every_sibling_command_ends_a_bad_argument_in_one_line(examples, tmp_path, monkeypatch):
    """``python -m emergence.report | revisions | refine | toy | panel.seeds`` on drawn arguments: each
    either runs or exits 2 (refine: 1 for a failed job) with one line on stderr; nothing escapes."""
    import contextlib
    import io

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no drawn argument reaches the network
    monkeypatch.setenv("WANDB_MODE", "disabled")
    empty = tmp_path / "empty"
    empty.mkdir()
    commands = sibling_commands()

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(call=sibling_argv(str(empty)))
    def one(call):
        command, argv = call
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ended:
            commands[command](argv)
        lines = err.getvalue().strip().splitlines()
        assert ended.value.code == 2 or (command == "refine" and ended.value.code == 1), (command, argv, lines)
        assert len(lines) == 1 and lines[0].startswith("error: "), (command, argv, lines)

    one()


def test_the_bos_token_is_not_the_bos_class(base_config):
    """``probe.first_token`` names the token at position 0 (``bos_token``); ``bos`` is the class of
    attention to position 0, and as a first token it is refused with a line naming the fix."""
    line = checked(base_config, "probe.first_token", "bos")
    assert line is not None and line.startswith("probe.first_token='bos' is invalid") and "use bos_token" in line
    assert "\n" not in line
    assert checked(base_config, "probe.first_token", "bos_token") is None
