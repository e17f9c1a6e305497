"""``python -m emergence.revisions MODEL``: a repo's checkpoint branches, a proposed panel,
and the checkpoints between two revisions (to locate a milestone to one interval).

    python -m emergence.revisions olmo                            # list step/tokens of every branch
    python -m emergence.revisions olmo --propose 10 --from 1e9 --to 3e12
    python -m emergence.revisions olmo --between step56000-tokens117B step126000-tokens264B
    python -m emergence.revisions pythia --check                  # the panel's branches, before downloading them
    python -m emergence.revisions pythia --check step0 step1 --json
    python -m emergence.revisions pythia --check --all            # every branch of the repo
    python -m emergence.revisions out/                            # a training run's folder of checkpoints

Listing needs the Hub (``huggingface_hub.list_repo_refs``, at ``HF_ENDPOINT``); offline, or for a
repo the Hub does not have, it says so in one line and stops. A local folder of checkpoints (``series``:
``checkpoint-<step>/``, ``step<N>/``, ...) is listed from disk, and checked from disk too (``--check`` adds
truncated weight files). ``--check`` reads each branch's
weight files and their sha256 from the Hub's tree API (``integrity``; offline, from the cache) and
prints one verdict per branch: ok, duplicate of <branch>, foreign shard <file> from <branch>,
no weights, model_type <x> is not <family's>; it exits 1 if any branch is not ok.

Also the revision naming of a family, as its preset states it (``revision_pattern``,
``published_steps``): reading step and tokens from a branch name, refusing names that cannot
exist, and proposing (and keeping) a panel for a preset that states none.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np

from emergence.core.config import ModelConfig, PanelEntry, StepRange, compose_config
from emergence.core.errors import CommandParser, UsageError, first_line
from emergence.hub import integrity, series
from emergence.hub.endpoint import connection_lost, hub_endpoint, hub_reachable
from emergence.hub.revision_names import parse_revision_name


def published(ranges: list[StepRange]) -> list[int]:
    """The steps a family publishes, from its ranges (empty: not stated)."""
    steps: set[int] = set()
    for r in ranges:
        step = r.first
        while step <= r.last:
            steps.add(step)
            if r.every:
                step += r.every
            elif r.factor and step > 0:
                step *= r.factor
            else:
                break
    return sorted(steps)


def check_revision_name(name: str, model: ModelConfig, panel: list[PanelEntry]) -> None:
    """Refuse a branch name that cannot exist under the family's naming, naming the nearest valid ones."""
    if model.revision_pattern is None:
        return
    step, _ = parse_revision_name(name, model.revision_pattern, None)
    steps = published(model.published_steps)
    if step is not None and (not steps or step in steps):
        return
    guess = max((int(d) for d in re.findall(r"\d+", name)), default=0)
    if steps and model.revision_format:
        closest = sorted(sorted(steps, key=lambda s: abs(s - guess))[:2])
        nearest = [model.revision_format.format(step=s) for s in closest]
    else:
        nearest = [e.revision for e in sorted(panel, key=lambda e: abs(int(e.step) - guess))[:2]]
    why = (
        f"step {step} is not a published checkpoint of {model.key!r}"
        if step is not None
        else f"{model.key!r} names its checkpoint branches like {model.revision_pattern}"
    )
    raise UsageError(
        f"revision.name={name!r} is invalid: {why}" + (f"; nearest valid: {', '.join(nearest)}" if nearest else "")
    )


def parse_branches(names: list[str], pattern: str | None, tokens_per_step: int | None) -> list[PanelEntry]:
    """Branches named like the family's checkpoints, ordered by step."""
    entries = []
    for name in names:
        step, tokens = parse_revision_name(name, pattern, tokens_per_step)
        if step is not None:
            entries.append(PanelEntry(name, step, tokens))
    return sorted(entries, key=lambda e: e.step)


def training_progress(entry: PanelEntry) -> int:
    """Tokens seen, or the step where a family does not state tokens."""
    return entry.tokens if entry.tokens is not None else entry.step


def propose_panel(
    entries: list[PanelEntry], n: int, low: float = 1.0, high: float = float("inf"), distinct: bool = False
) -> list[PanelEntry]:
    """Up to ``n`` existing checkpoints nearest (in log tokens, or log steps where tokens are
    unknown) to n log-spaced targets in [low, high] (clipped to the checkpoints there are). ``distinct``:
    each target takes the nearest checkpoint no earlier target took, so that n checkpoints give n
    (evenly saved checkpoints are sparse where the targets are dense)."""
    usable = [e for e in entries if training_progress(e) > 0 and low <= training_progress(e) <= high]
    if not usable:
        return []
    logs = np.log([training_progress(e) for e in usable])
    targets = np.linspace(max(np.log(low), logs.min()), min(np.log(high), logs.max()), n)
    chosen: set[int] = set()
    for t in targets:
        order = np.argsort(np.abs(logs - t), kind="stable")
        chosen.add(int(next((i for i in order if i not in chosen), order[0]) if distinct else order[0]))
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


def local_series(model: ModelConfig) -> list[PanelEntry] | None:
    """The checkpoints of a local folder that holds a training run's checkpoints (``series``), ordered by
    step; None for a Hub repo, a toy, or a folder that is one checkpoint (a UsageError for a folder that
    is neither)."""
    path = Path(model.name_or_path).expanduser()
    if model.toy is not None or model.gguf_file or not path.is_dir() or (path / "config.json").exists():
        return None
    return series.checkpoints(path, model.tokens_per_step)


def existing_checkpoints(cfg) -> list[PanelEntry]:
    """Every checkpoint of ``cfg``'s model, ordered by step: a toy panel's saved checkpoints (its
    manifest), a local series' checkpoint folders, a Hub repo's branches named in the family's
    ``revision_pattern``."""
    if cfg.model.toy is not None:
        return series.saved_checkpoints(Path(cfg.model.name_or_path).expanduser())
    found = local_series(cfg.model)
    if found is not None:
        return found
    if Path(cfg.model.name_or_path).expanduser().is_dir():
        raise UsageError(
            f"model.name_or_path={cfg.model.name_or_path!r} is a local directory: one checkpoint, "
            "no revisions between which to refine; use a Hub repo, a toy model or the folder of a "
            "run's checkpoints"
        )
    try:
        names = list_branches(cfg.model.name_or_path)
    except HubUnavailable as err:
        raise UsageError(
            f"the checkpoints of {cfg.model.name_or_path} cannot be listed: {err}; run where the Hub is reachable"
        ) from None
    return parse_branches(names, cfg.model.revision_pattern, cfg.model.tokens_per_step)


class HubUnavailable(UsageError):
    """The Hub cannot be asked at all (offline, endpoint unreachable): the fix is a network,
    unlike a repo the Hub says does not exist."""


def list_branches(repo: str) -> list[str]:
    """The repo's branch names. A UsageError says why not: HubUnavailable when the endpoint
    cannot be asked, else what the endpoint answered (a repo that does not exist there)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise HubUnavailable("HF_HUB_OFFLINE=1")
    if not hub_reachable():
        raise HubUnavailable(f"the Hub endpoint {hub_endpoint()} is not reachable")
    from huggingface_hub import list_repo_refs
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        return [b.name for b in list_repo_refs(repo).branches]
    except HfHubHTTPError as err:
        # the Hub answers an unknown repo with RepositoryNotFoundError, olah with a plain 404
        if isinstance(err, RepositoryNotFoundError) or err.response.status_code == 404:
            raise UsageError(
                f"repo {repo} does not exist on {hub_endpoint()} (or is private); check the repo id "
                "(model.name_or_path)"
            ) from None
        raise UsageError(f"{hub_endpoint()} answered {first_line(err)}") from None
    except Exception as err:
        if connection_lost(err):  # the server went away since hub_reachable
            raise HubUnavailable(f"the Hub endpoint {hub_endpoint()} is not reachable") from None
        raise UsageError(f"{type(err).__name__}: {first_line(err) if str(err) else 'no answer'}") from None


def panel_file(cache_dir: str, repo: str) -> Path:
    return Path(cache_dir) / "panels" / f"{repo.replace('/', '--')}.json"


def discovered_panel(model: ModelConfig, cache_dir: str, n: int = 10) -> list[PanelEntry]:
    """The panel of a preset that states none: proposed from the repo's branches on first use
    (log-spaced, ``propose_panel``), printed, and kept under ``cache_dir`` for the next runs. A local
    series' panel is proposed from its checkpoints each time: the same for the same checkpoints."""
    found = local_series(model)
    if found is not None:
        return propose_panel(found, n, distinct=True) or found[-1:]  # checkpoints at step 0 alone: the last
    path = panel_file(cache_dir, model.name_or_path)
    if path.exists():
        return [PanelEntry(**e) for e in json.loads(path.read_text())]
    try:
        names = list_branches(model.name_or_path)
    except HubUnavailable as err:
        raise UsageError(
            f"revision=r0..r{n - 1} is unavailable: model {model.key!r} states no panel and its branches "
            f"cannot be listed ({err}); run python -m emergence.revisions {model.key} --propose {n} where "
            "the Hub is reachable and add the panel to the preset"
        ) from None
    except UsageError as err:  # the Hub answered: a panel cannot help
        raise UsageError(
            f"revision=r0..r{n - 1} is unavailable: the branches of model {model.key!r} cannot be listed: {err}"
        ) from None
    panel = propose_panel(parse_branches(names, model.revision_pattern, model.tokens_per_step), n)
    if not panel:
        raise UsageError(
            f"model.revision_pattern={model.revision_pattern!r} matches no branch of "
            f"{model.name_or_path}; fix the preset's pattern"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([vars(e) for e in panel], indent=1))
    print(f"proposed panel of {model.name_or_path} ({len(names)} branches; kept in {path}):")
    print_panel(panel)
    return panel


def print_panel(entries: list[PanelEntry]) -> None:
    for e in entries:
        print(f"  - {{revision: {e.revision}, step: {e.step}, tokens: {'null' if e.tokens is None else e.tokens}}}")


def check_command(cfg, entries: list[PanelEntry], names: list[str], every: bool, as_json: bool) -> int:
    """``--check``: the integrity verdicts of the named branches (default: the model's panel; ``every``:
    every branch of the repo), printed; 1 if any is not ok."""

    repo = cfg.model.name_or_path
    step_of = {e.revision: e.step for e in entries}
    if every:
        names = [e.revision for e in entries]
    elif not names:
        names = [e.revision for e in (cfg.model.panel or discovered_panel(cfg.model, cfg.cache_dir))]
    unknown = [n for n in names if n not in step_of]
    if unknown:
        raise UsageError(f"{unknown[0]} is not a checkpoint branch of {repo}; list them: {listing_command(cfg.model)}")
    checks = integrity.check(repo, {n: step_of[n] for n in names}, cfg.model.architecture)
    if as_json:
        print(
            json.dumps(
                {"repo": repo, "branches": {b: {**c.to_json(), "line": c.line} for b, c in checks.items()}}, indent=1
            )
        )
    else:
        width = max(map(len, checks), default=0)
        for branch, verdict in checks.items():
            print(f"{branch:<{width}}  {verdict.line}")
        print(f"# {sum(c.verdict == 'ok' for c in checks.values())} of {len(checks)} branches of {repo} ok")
    return int(any(c.verdict != "ok" for c in checks.values()))


def listing_command(model: ModelConfig) -> str:
    """The command that lists (and checks, with --check) the checkpoints of ``model``."""
    if Path(model.name_or_path).expanduser().is_dir():
        return f"python -m emergence.revisions {model.name_or_path}"
    return f"python -m emergence.revisions {model.key} --repo {model.name_or_path}"


def sweep_command(model: ModelConfig, names: list[str]) -> str:
    """The sweep that analyses the checkpoints ``names`` of ``model``."""
    which = (
        f"model=local model.name_or_path={model.name_or_path}"
        if Path(model.name_or_path).expanduser().is_dir()
        else f"model={model.key}"
    )
    return f"python -m emergence -m {which} revision=custom revision.name={','.join(names)}"


def main(argv=None) -> None:
    p = CommandParser("python -m emergence.revisions", __doc__)
    p.add_argument(
        "model",
        help="a model preset (conf/model: pythia, olmo2, smollm2, ...), local with --repo, or "
        "the folder of a training run's checkpoints (checkpoint-<step>/, step<N>/, ...)",
    )
    p.add_argument(
        "--tokens-per-step",
        type=int,
        metavar="N",
        help="a folder of checkpoints: tokens = step x N where its checkpoints do not state them",
    )
    p.add_argument("--repo", help="Hub repo id (default: the model config's name_or_path)")
    p.add_argument("--propose", type=int, metavar="N", help="propose a log-spaced panel of N revisions")
    p.add_argument("--from", dest="low", type=float, default=1.0, help="lowest token count for --propose")
    p.add_argument("--to", dest="high", type=float, default=float("inf"), help="highest token count")
    p.add_argument("--between", nargs=2, metavar=("REV_A", "REV_B"), help="list the checkpoints between two")
    p.add_argument(
        "--check",
        nargs="*",
        metavar="BRANCH",
        help="check branches before downloading them (default: the model's panel): duplicates, foreign "
        "shards, no weights, model_type",
    )
    p.add_argument("--all", action="store_true", help="with --check: every checkpoint branch of the repo")
    p.add_argument("--json", action="store_true", help="with --check: machine-readable output")
    args = p.parse_args(argv)
    if args.tokens_per_step is not None and args.tokens_per_step <= 0:
        p.error(f"--tokens-per-step {args.tokens_per_step} is invalid: tokens per step must be > 0")
    if args.propose is not None and args.propose < 1:
        p.error(f"--propose {args.propose} is invalid: propose at least 1 revision")
    if not (0 < args.low < args.high):  # also refuses nan
        p.error(f"--from {args.low:g} --to {args.high:g} is invalid: need 0 < --from < --to (token counts)")
    folder = Path(args.model).expanduser().is_dir()
    if not folder and (os.sep in args.model or args.model.startswith((".", "~"))):  # a path, not a preset's name
        p.error(
            f"{args.model} is not a directory: give the folder of a training run's checkpoints, or a model "
            "preset (conf/model: pythia, olmo2, ...)"
        )
    overrides = ([f"model.tokens_per_step={args.tokens_per_step}"] if args.tokens_per_step else []) + (
        ["model=local", f"model.name_or_path={args.model}"]
        if folder
        else [f"model={args.model}"] + ([f"model.name_or_path={args.repo}"] if args.repo else [])
    )
    try:
        cfg = compose_config(overrides)
        series = local_series(cfg.model) if folder else None
        if folder and series is None:
            raise UsageError(f"{args.model} is one checkpoint (it holds config.json): no revisions to list")
    except UsageError as err:  # no such preset (it names the ones there are), no checkpoints, mixed models
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    repo = cfg.model.name_or_path
    try:
        # a folder's entries are its series (None only off a folder)
        entries = (
            series
            if series is not None
            else parse_branches(list_branches(repo), cfg.model.revision_pattern, cfg.model.tokens_per_step)
        )
    except HubUnavailable as err:
        if args.check and not args.all:  # named branches: the check reads what the cache holds of them
            entries = parse_branches(args.check, cfg.model.revision_pattern, cfg.model.tokens_per_step)
        else:
            print(
                f"error: listing the revisions of {repo} needs the Hugging Face Hub ({err}); run it where the Hub is "
                "reachable",
                file=sys.stderr,
            )
            sys.exit(2)
    except UsageError as err:  # the Hub answered, e.g. no such repo
        print(f"error: the revisions of {repo} cannot be listed: {err}", file=sys.stderr)
        sys.exit(2)
    if args.check is not None:
        try:
            sys.exit(check_command(cfg, entries, args.check, args.all, args.json))
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
    if args.between:
        try:
            found = between(entries, *args.between)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(f"{len(found)} checkpoints between {args.between[0]} and {args.between[1]}; analyse them with:")
        print(sweep_command(cfg.model, [e.revision for e in found]))
        return
    shown = propose_panel(entries, args.propose, args.low, args.high) if args.propose else entries
    print("panel:" if args.propose else f"# {len(entries)} checkpoint {'folders' if folder else 'branches'} of {repo}")
    print_panel(shown)
    if folder and not args.propose:
        panel = discovered_panel(cfg.model, cfg.cache_dir)
        print(f"# its panel, revision=r0..r{len(panel) - 1}: {', '.join(e.revision for e in panel)}; analyse it with:")
        print(
            f"python -m emergence -m model=local model.name_or_path={repo} 'revision=glob(r*)'"
            if len(panel) == 10
            else sweep_command(cfg.model, [e.revision for e in panel])
        )


if __name__ == "__main__":
    main()
