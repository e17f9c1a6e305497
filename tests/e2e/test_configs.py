"""Every option of every config group composes into a valid run configuration, and the
defaults come from one place."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.utils import get_class

from emergence.core.config import compose_config, register_configs
from emergence.core.errors import UsageError
from emergence.hub import revisions
from emergence.hub.checkpoints import resolve_revision
from emergence.run.validation import validate
from tests.helpers.cli import run_fresh

CONF = Path(__file__).parents[2] / "conf"
GROUPS = ("model", "revision", "probe", "threshold")
# What an option needs from the user before it means anything (its ??? fields).
REQUIRED = {("model", "local"): ["model.name_or_path=/models/any"], ("revision", "custom"): ["revision.name=step64"]}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_validates(group, option, tmp_path):
    model = [] if group == "model" else ["model=pythia"]  # a model with a panel, for the revision options
    cfg = compose_config([*model, f"{group}={option}", *REQUIRED.get((group, option), []), f"cache_dir={tmp_path}"])
    validate(cfg)
    if cfg.model.key == "smollm2":  # its main holds no weights: revision=final is its (kept) panel's last branch
        kept = revisions.panel_file(cfg.cache_dir, cfg.model.name_or_path)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps([{"revision": f"step-{s}", "step": s, "tokens": s * 1048576} for s in (10, 2000)]))
    # revision=final: the last panel entry, or the checkpoint as it is without a panel
    rev = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    assert (rev.name is not None) == bool(cfg.model.panel or cfg.model.key == "smollm2"), (group, option)
    if cfg.model.key == "smollm2":
        assert (rev.name, rev.step) == ("step-2000", 2000)


def test_every_group_has_options_and_the_schema_knows_them():
    assert all(options(g) for g in GROUPS)
    with pytest.raises(Exception, match="no_such_key"):  # the schema refuses unknown keys
        compose_config(["probe.no_such_key=1"])


@pytest.mark.parametrize("launcher", sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml")))
def test_launcher_options_name_a_launcher_that_exists(launcher):
    register_configs()  # compose() below needs the schema
    with initialize_config_module(config_module="emergence.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert get_class(cfg.hydra.launcher._target_).__name__.endswith("Launcher")


def test_wandb_defaults_read_the_wandb_environment_and_overrides_win(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_PROJECT", "circuits")
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    monkeypatch.setenv("WANDB_DIR", "/tmp/wandb-here")
    w = compose_config([]).wandb
    assert (w.mode, w.project, w.entity, w.dir) == ("disabled", "circuits", "lab", "/tmp/wandb-here")
    w = compose_config(["wandb.mode=offline", "wandb.project=other"]).wandb
    assert (w.mode, w.project) == ("offline", "other")
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR"):
        monkeypatch.delenv(name)
    w = compose_config([]).wandb
    assert (w.mode, w.project, w.entity, w.dir) == ("offline", "emergence", None, None)
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    with pytest.raises(UsageError, match="wandb.mode='dryrun'.*WANDB_MODE"):
        validate(compose_config([]))


def test_the_schema_imports_no_step_and_registers_nothing_on_import():
    """config.py is the schema only: importing it loads no step of the recipe (nor torch) and puts
    nothing in Hydra's ConfigStore or OmegaConf's resolvers; ``register_configs`` does, idempotently."""
    code = (
        "import sys\n"
        "import emergence.core.config as config\n"
        "from hydra.core.config_store import ConfigStore\n"
        "from omegaconf import OmegaConf\n"
        "steps = sorted(m for m in sys.modules if m.startswith('emergence.')"
        " and m not in ('emergence.core', 'emergence.core.config'))\n"
        "assert not steps and 'torch' not in sys.modules, steps\n"
        "assert 'emergence_schema.yaml' not in ConfigStore.instance().repo, 'registered on import'\n"
        "assert not OmegaConf.has_resolver('emergence_cache_dir'), 'registered on import'\n"
        "config.register_configs()\n"
        "config.register_configs()\n"
        "assert 'emergence_schema.yaml' in ConfigStore.instance().repo\n"
        "assert OmegaConf.has_resolver('emergence_cache_dir')\n"
    )
    run_fresh(code)


def test_the_per_class_thresholds_are_the_screens_classes():
    from dataclasses import fields

    from emergence.core.config import PerClassThresholds
    from emergence.recipe.screen import CLASSES

    assert tuple(f.name for f in fields(PerClassThresholds)) == CLASSES
    overrides = PerClassThresholds(local=2.0, induction=1.0).overrides()
    assert list(overrides.items()) == [("induction", 1.0), ("local", 2.0)]


def restated(data: dict, node, where: str) -> list[str]:
    """Keys of a YAML mapping that set the value the schema ``node`` already defaults to."""
    from omegaconf import OmegaConf

    found = []
    for key, value in data.items():
        if key == "defaults" or key not in node or OmegaConf.is_missing(node, key):
            continue
        if isinstance(value, dict) and OmegaConf.is_dict(node[key]):
            found += restated(value, node[key], f"{where}.{key}")
        elif not (isinstance(value, dict) or OmegaConf.is_dict(node[key])) and node[key] == value:
            found.append(f"{where}.{key}")
    return found


def test_each_setting_has_one_default():
    """No YAML file sets a key to the value the structured config already gives it."""
    import yaml
    from omegaconf import OmegaConf

    from emergence.core.config import Config, ModelConfig, ProbeConfig, RevisionConfig, ThresholdConfig, ToyRecipe

    schema = {"model": ModelConfig, "revision": RevisionConfig, "probe": ProbeConfig, "threshold": ThresholdConfig}
    top = yaml.safe_load((CONF / "config.yaml").read_text())
    found = restated(top, OmegaConf.structured(Config), "config")
    for group, dataclass in schema.items():
        for option in options(group):
            data = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
            data = data.get(group, data)  # a @package _global_ preset (the toys) nests its keys
            found += restated(data, OmegaConf.structured(dataclass), f"{group}/{option}")
            if "toy" in data:
                found += restated(data["toy"], OmegaConf.structured(ToyRecipe), f"{group}/{option}.toy")
    assert not found, f"restated defaults: {found}"


@pytest.mark.slow
def test_the_installed_package_carries_every_config_file(tmp_path):
    """A wheel of the project holds each YAML under conf/, new folders included, and the reference data."""
    import subprocess
    import sys
    import zipfile

    extra = CONF / "zz_new_group"  # a config folder nobody listed anywhere
    extra.mkdir()
    try:
        (extra / "option.yaml").write_text("value: 1\n")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(tmp_path),
                str(CONF.parent),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    finally:
        (extra / "option.yaml").unlink()
        extra.rmdir()
    wheel = next(tmp_path.glob("emergence-*.whl"))
    packed = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("emergence/conf/")}
    expected = {f"emergence/conf/{p.relative_to(CONF)}" for p in CONF.rglob("*.yaml")}
    assert expected <= packed and "emergence/conf/zz_new_group/option.yaml" in packed
    data = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("emergence/panel/reference_data/")]
    assert len(data) == 34  # the study's results: SOURCE.md, 30 per_revision/ and 3 pr/ files


@pytest.mark.parametrize(
    "override,message",
    [
        ("ablate.sequences=some", "ablate.sequences='some' is invalid: use one of adaptive, all"),
        ("ablate.min_sequences=1", "ablate.min_sequences=1 is invalid: must be >= 2"),
        ("ablate.confidence=1.0", "ablate.confidence=1.0 is invalid: must be in (0, 1)"),
        ("ablate.confidence=0", "ablate.confidence=0.0 is invalid: must be in (0, 1)"),
    ],
)
def test_adaptive_ablation_settings_are_validated_in_one_line(override, message):
    cfg = compose_config([override])
    with pytest.raises(UsageError) as err:
        validate(cfg)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.toy.lr_schedule=linear", "model.toy.lr_schedule='linear' is invalid: use one of constant, cosine"),
        ("model.toy.min_lr_ratio=1.5", "model.toy.min_lr_ratio=1.5 is invalid: must be in [0, 1]"),
        ("model.toy.trigger_fraction=1.0", "model.toy.trigger_fraction=1.0 is invalid: must be in [0, 1)"),
        ("model.toy.save_every=0", "model.toy.save_every=0 is invalid: must be >= 1 step"),
        ("model.toy.numerics=fast", "model.toy.numerics='fast' is invalid: use one of native, portable"),
        ("model.toy.threads=0", "model.toy.threads=0 is invalid: must be >= 1"),
        ("model.toy.home_city_share=1.5", "model.toy.home_city_share=1.5 is invalid: must be in [0, 1]"),
        ("model.toy.tokenizer=bpe", "model.toy.tokenizer='bpe' is invalid: use words (emergence/toy/words.py) or null"),
        ("model.toy.task_fraction=1.5", "model.toy.task_fraction=1.5 is invalid: must be in [0, 1]"),
    ],
)
def test_toy_recipe_settings_are_validated_in_one_line(override, message):
    cfg = compose_config(["model=toy_olmo", override])
    with pytest.raises(UsageError) as err:
        validate(cfg)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_text_probes_loss_curve_is_sparse_by_default_and_validated_in_one_line():
    assert compose_config(["probe=text"]).probe.loss_curve == "sparse"
    validate(compose_config(["probe=text", "probe.loss_curve=all"]))
    with pytest.raises(UsageError) as err:
        validate(compose_config(["probe=text", "probe.loss_curve=some"]))
    assert str(err.value).startswith("probe.loss_curve='some' is invalid: use sparse") and "\n" not in str(err.value)


def test_adaptive_ablation_is_the_default_and_all_is_an_option():
    assert compose_config([]).ablate.sequences == "adaptive"
    validate(compose_config(["ablate.sequences=all", "ablate.min_sequences=2", "ablate.confidence=0.99"]))
