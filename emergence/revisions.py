"""``python -m emergence.revisions MODEL``: a repo's checkpoint branches, a proposed panel,
and the checkpoints between two revisions (to locate a milestone to one interval).

    python -m emergence.revisions olmo                            # list step/tokens of every branch
    python -m emergence.revisions olmo --propose 10 --from 1e9 --to 3e12
    python -m emergence.revisions olmo --between step56000-tokens117B step126000-tokens264B

Listing needs the Hub (``huggingface_hub.list_repo_refs``); offline it says so and stops.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from emergence.checkpoints import parse_revision_name
from emergence.config import PanelEntry, compose_config


def parse_branches(names: list[str], tokens_per_step: int | None) -> list[PanelEntry]:
    """Branches named like checkpoints (``step{N}`` / ``step{N}-tokens{M}B``), ordered by step."""
    entries = []
    for name in names:
        step, tokens = parse_revision_name(name, tokens_per_step)
        if step is not None:
            entries.append(PanelEntry(name, step, tokens if tokens is not None else -1))
    return sorted(entries, key=lambda e: e.step)


def propose_panel(entries: list[PanelEntry], n: int, low: float, high: float) -> list[PanelEntry]:
    """Up to ``n`` existing checkpoints nearest (in log tokens) to n log-spaced targets in [low, high]."""
    usable = [e for e in entries if e.tokens > 0 and low <= e.tokens <= high]
    if not usable:
        return []
    logs = np.log([e.tokens for e in usable])
    chosen = {int(np.argmin(np.abs(logs - t))) for t in np.linspace(np.log(low), np.log(high), n)}
    return [usable[i] for i in sorted(chosen)]


def between(entries: list[PanelEntry], first: str, last: str) -> list[PanelEntry]:
    """The checkpoints strictly between two revisions: probing them locates a milestone
    to one checkpoint interval instead of the panel's spacing."""
    steps = {e.revision: e.step for e in entries}
    missing = [r for r in (first, last) if r not in steps]
    if missing:
        raise ValueError(f"revision {missing[0]!r} is not a branch of this repo")
    lo, hi = sorted((steps[first], steps[last]))
    return [e for e in entries if lo < e.step < hi]


def list_branches(repo: str) -> list[str]:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ConnectionError("HF_HUB_OFFLINE=1")
    from huggingface_hub import list_repo_refs

    return [b.name for b in list_repo_refs(repo).branches]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m emergence.revisions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a model config key (pythia, olmo, olmoe) or local with --repo")
    p.add_argument("--repo", help="Hub repo id (default: the model config's name_or_path)")
    p.add_argument("--propose", type=int, metavar="N", help="propose a log-spaced panel of N revisions")
    p.add_argument("--from", dest="low", type=float, default=1.0, help="lowest token count for --propose")
    p.add_argument("--to", dest="high", type=float, default=float("inf"), help="highest token count")
    p.add_argument("--between", nargs=2, metavar=("REV_A", "REV_B"), help="list the checkpoints between two")
    args = p.parse_args(argv)
    cfg = compose_config([f"model={args.model}"] + ([f"model.name_or_path={args.repo}"] if args.repo else []))
    repo = cfg.model.name_or_path
    try:
        entries = parse_branches(list_branches(repo), cfg.model.tokens_per_step)
    except Exception as err:  # no route, offline, unknown repo: one line, not a traceback
        print(f"error: listing the revisions of {repo} needs the Hugging Face Hub ({type(err).__name__}: "
              f"{str(err).splitlines()[0] if str(err) else 'no network'}); run it where the Hub is reachable",
              file=sys.stderr)
        sys.exit(2)
    if args.between:
        try:
            found = between(entries, *args.between)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(f"{len(found)} checkpoints between {args.between[0]} and {args.between[1]}; analyse them with:")
        print(f"python -m emergence -m model={args.model} revision=custom "
              f"revision.name={','.join(e.revision for e in found)}")
        return
    shown = propose_panel(entries, args.propose, args.low, args.high) if args.propose else entries
    print("panel:" if args.propose else f"# {len(entries)} checkpoint branches of {repo}")
    for e in shown:
        print(f"  - {{revision: {e.revision}, step: {e.step}, tokens: {e.tokens}}}")


if __name__ == "__main__":
    main()
