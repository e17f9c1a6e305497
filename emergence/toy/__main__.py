"""``python -m emergence.toy [toy_neox toy_olmo toy_olmoe toy_olmo_sinks] [--force] [--override cache_dir=DIR]``: train toy panels."""

import argparse

from emergence.config import compose_config
from emergence.toy.train import ensure_trained, train

TOY_MODELS = ("toy_neox", "toy_olmo", "toy_olmoe", "toy_olmo_sinks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(TOY_MODELS)} (default: all four)")
    parser.add_argument("--force", action="store_true", help="retrain even if a complete panel exists")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for the composed config, e.g. cache_dir=/tmp/toy")
    args = parser.parse_args()
    unknown = set(args.models) - set(TOY_MODELS)
    if unknown:
        parser.error(f"unknown toy model(s) {sorted(unknown)}: choose from {', '.join(TOY_MODELS)}")
    for key in args.models or TOY_MODELS:
        cfg = compose_config([f"model={key}", *args.override])
        if args.force:
            train(cfg.model)
        else:
            ensure_trained(cfg.model)
        print(f"{key}: {cfg.model.name_or_path}")


if __name__ == "__main__":
    main()
