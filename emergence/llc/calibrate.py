"""``python -m emergence.llc.calibrate [overrides] [--lr ...] [--nbeta ...] [--out DIR]``: the LLC's step size
and n*beta for a panel, from one checkpoint.

On the checkpoint the overrides name (``model=toy_neox revision=r9``: as ``python -m emergence`` composes
it, with ``measures.llc.*`` as the starting settings), estimates the model's LLC over the grid of step sizes
(``--lr``) and inverse temperatures (``--nbeta``; default: the settings'), and picks, for the largest
n*beta tried, the largest step size whose chains are stable: no diverged chain, a loss trace flat after
burn-in, a non-negative estimate, chains that agree (``measures.llc.diagnose``). Writes
``DIR/llc_calibration.json`` (every try, with its estimate or why it failed) and
``DIR/measures/llc_calibrated.yaml`` (the chosen settings as a preset of the ``measures`` group), and
prints the overrides that make every checkpoint of a sweep share them (they are part of the measure's
cache key). Bad input: one line, exit 2; no stable setting: exit 1, the tries saved.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from emergence import measures
from emergence.core.atomic import atomic_write_text
from emergence.core.config import compose_config
from emergence.core.errors import CommandParser, UsageError
from emergence.measures import llc
from emergence.run import steps
from emergence.run.validation import validate

CALIBRATION_FILE = "llc_calibration.json"
PRESET = "llc_calibrated"  # conf/measures/<PRESET>.yaml under --out
DEFAULT_LRS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


@dataclass(frozen=True)
class Trial:
    """One point of the grid."""

    lr: float
    nbeta: float
    llc: float | None
    std: float | None
    failed: str | None


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` tried on one checkpoint, and what it chose."""

    checkpoint: str  # model@revision
    data: str  # what the chains drew from
    settings: dict  # the starting settings (measures.llc)
    trials: list[Trial]
    chosen: Trial | None  # None: no stable setting

    def save(self, out: Path) -> Path:
        path = out / CALIBRATION_FILE
        atomic_write_text(path, json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        return path


def choose(trials: list[Trial]) -> Trial | None:
    """The largest stable step size at the largest n*beta that has one."""
    stable = [t for t in trials if t.failed is None]
    return max(stable, key=lambda t: (t.nbeta, t.lr)) if stable else None


def calibrate(overrides: list[str], lrs: list[float], nbetas: list[float] | None, out: Path) -> Calibration:
    chooses = any(o.startswith("measures=") for o in overrides)  # else the llc preset, so measures.llc.* apply
    cfg = compose_config([*([] if chooses else ["measures=[llc]"]), *overrides, "reuse=false"])
    if "llc" not in cfg.measures:
        raise UsageError("the overrides' measures leave out llc: add it (measures=[default,llc])")
    validate(cfg)
    (chosen,) = [c for c in measures.chosen(cfg.measures) if c.name == "llc"]
    base: llc.Settings = chosen.settings
    grid = [
        dataclasses.replace(base, lr=lr, nbeta=nbeta) for nbeta in (nbetas or [base.inverse_temperature]) for lr in lrs
    ]  # each checked as the run checks it (``Settings.__post_init__``)
    cfg.measures = {"llc": {}}  # load the model alone: the screen's pass is not needed here
    loaded = steps.load(cfg)
    assert loaded.subject is not None  # the measure needs the weights
    inputs = steps.measure_input(loaded, chosen, out)
    data, tokens = llc.sampling_data(inputs, base)
    trials = []
    for settings in grid:
        found = llc.estimate(loaded.subject.model, tokens, settings, loaded.device, scratch=inputs.scratch)
        trials.append(Trial(settings.lr, settings.inverse_temperature, found.llc, found.std, found.failed))
        logging.getLogger(__name__).info(
            f"lr={settings.lr:g} nbeta={settings.inverse_temperature:g}: "
            + (f"LLC {found.llc:.4g} +- {found.std:.2g}" if found.failed is None else f"failed: {found.failed}")
        )
    return Calibration(loaded.name, data, dataclasses.asdict(base), trials, choose(trials))


def write_preset(out: Path, calibration: Calibration) -> Path:
    """``out/measures/llc_calibrated.yaml``: the starting settings with the chosen step size and n*beta."""
    assert calibration.chosen is not None  # only a calibration that chose writes one
    settings = {**calibration.settings, "lr": calibration.chosen.lr, "nbeta": calibration.chosen.nbeta}
    path = out / "measures" / f"{PRESET}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# chosen by python -m emergence.llc.calibrate on {calibration.checkpoint} ({CALIBRATION_FILE})\n"
    atomic_write_text(path, header + OmegaConf.to_yaml({"llc": settings}))
    return path


def main(argv: list[str] | None = None) -> None:
    p = CommandParser("python -m emergence.llc.calibrate", __doc__)
    p.add_argument("overrides", nargs="*", help="Hydra overrides naming the checkpoint (model=..., revision=...)")
    p.add_argument("--lr", type=float, nargs="+", default=list(DEFAULT_LRS), help="step sizes to try")
    p.add_argument("--nbeta", type=float, nargs="+", default=None, help="n*beta values to try (default: the settings')")
    p.add_argument(
        "--out", type=Path, default=Path("outputs/llc_calibration"), help="where to write (default %(default)s)"
    )
    args = p.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if any(not lr > 0 for lr in args.lr) or any(not b > 0 for b in args.nbeta or []):
        p.error("--lr and --nbeta values must be > 0")
    p.check_output_folder(args.out, "llc_calibration.json and its measures preset")
    try:
        nbetas = sorted(set(args.nbeta)) if args.nbeta else None
        calibration = calibrate(args.overrides, sorted(set(args.lr)), nbetas, args.out)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    finally:
        shutil.rmtree(args.out / steps.SCRATCH, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = calibration.save(args.out)
    if calibration.chosen is None:
        print(f"error: no stable step size among {args.lr} (tries: {saved}); try smaller ones", file=sys.stderr)
        sys.exit(1)
    preset = write_preset(args.out, calibration)
    c = calibration.chosen
    print(f"chosen: lr={c.lr:g} nbeta={c.nbeta:g} (LLC {c.llc:.4g} on {calibration.checkpoint}); tries: {saved}")
    print(f"preset: {preset}")
    print(
        f"for the sweep: 'measures=[default,{PRESET}]' 'hydra.searchpath=[file://{args.out.resolve()}]' "
        f"(or measures.llc.lr={c.lr:g} measures.llc.nbeta={c.nbeta:g})"
    )


if __name__ == "__main__":
    main()
