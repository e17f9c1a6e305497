"""``python -m emergence.toy [toy_neox toy_olmo toy_olmoe toy_olmo_sinks toy_tasks] [--force]
[--override cache_dir=DIR]``: train toy panels.

With no model named it trains the four of ``DEFAULT_TOY_MODELS``; ``toy_tasks`` (the task toy, longer to
train) only when named, as ``toy_tasks`` or ``model=toy_tasks``.

``python -m emergence.toy --compare DIR_A DIR_B``: where two trained panels part (environment, the
first step whose training loss differs, each checkpoint's sha256). ``--document`` records trained
panels in the documented ones (``emergence/toy/documented_panels.json``), which every training
is compared with."""

import json
import sys
from dataclasses import asdict
from pathlib import Path

from emergence.core.config import compose_config
from emergence.core.errors import CommandParser, UsageError
from emergence.hub.series import MANIFEST
from emergence.toy.repro import LOSSES, compare_trainings, document
from emergence.toy.train import ensure_trained, train, weights_recipe
from emergence.toy.validation import validate_recipe

DEFAULT_TOY_MODELS = ("toy_neox", "toy_olmo", "toy_olmoe", "toy_olmo_sinks")
TOY_MODELS = (*DEFAULT_TOY_MODELS, "toy_tasks")


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser("python -m emergence.toy", __doc__)
    parser.add_argument(
        "models",
        nargs="*",
        help=f"any of {', '.join(TOY_MODELS)}, also as model=NAME (default: {', '.join(DEFAULT_TOY_MODELS)})",
    )
    parser.add_argument("--force", action="store_true", help="retrain even if a complete panel exists")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override for the composed config, e.g. cache_dir=/tmp/toy or model.toy.seed=1",
    )
    parser.add_argument(
        "--document",
        action="store_true",
        help="record the trained panels as documented (emergence/toy/documented_panels.json)",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar="DIR",
        type=Path,
        help="compare two trained panels (their folders with manifest.json and losses.tsv)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        for folder in args.compare:
            missing = [name for name in (MANIFEST, LOSSES) if not (folder / name).is_file()]
            if missing:
                parser.error(
                    f"--compare {folder}: not a trained panel (no {' or '.join(missing)}); give the "
                    "folders a training wrote, e.g. <cache_dir>/toy/toy_neox/seed0"
                )
        print(compare_trainings(*args.compare))
        return
    models = [name.removeprefix("model=") for name in args.models]  # the Hydra spelling is accepted too
    unknown = set(models) - set(TOY_MODELS)
    if unknown:
        parser.error(f"unknown toy model(s) {sorted(unknown)}: choose from {', '.join(TOY_MODELS)}")
    for key in models or DEFAULT_TOY_MODELS:
        try:
            cfg = compose_config([f"model={key}", *args.override])
            recipe = cfg.model.toy
            assert recipe is not None  # a toy model's preset holds its recipe
            validate_recipe(recipe)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        documented = train(cfg.model)["documented"] if args.force else ensure_trained(cfg.model)
        print(f"{key}: {cfg.model.name_or_path}")
        print(f"  {documented['message']}")
        if args.document:
            manifest = json.loads((Path(cfg.model.name_or_path).expanduser() / MANIFEST).read_text())
            print(f"  documented in {document(manifest, weights_recipe(asdict(recipe)))}")


if __name__ == "__main__":
    main()
