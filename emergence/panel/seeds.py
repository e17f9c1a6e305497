"""``python -m emergence.panel.seeds REPORT_DIR [--model toy_olmo_sinks]``: a toy's sink findings per training seed.

Reads the panel report's ``findings.json`` (``python -m emergence.report SWEEP --out REPORT_DIR``
over a multirun with ``model.toy.seed=0,1,2``) and prints, per seed, the BOS fraction at every
revision with the layers holding BOS heads, the final BOS fraction, the induction onset, the first
revision with a BOS fraction of at least 10%, and Sink_0 (Gu et al.) at the last revision; then
the spread across seeds and how many seeds meet each finding.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emergence.core.errors import CommandParser, UsageError
from emergence.panel.records import ModelFindings, PanelFindings


@dataclass(frozen=True)
class SeedRow:
    """One training seed's sink findings, from its panel's ``ModelFindings``."""

    seed: int | None  # None: runs of one seed, whose trajectory is named by the model
    bos: list[tuple[str, float, str]]  # per revision: (revision, BOS %, layers with BOS heads: "L2+L3" or "-")
    final_bos: float  # BOS % at the last revision
    final_layers: str
    final_heads: list[int]  # BOS heads per layer at the last revision
    onset: str | None  # the induction onset's revision (>= 3 heads at the circuit threshold)
    bos_10: str | None  # the first revision with BOS >= 10 %
    sinks_in_layers_ge_2_only: bool  # BOS heads at some revision, and never below layer 2
    bos_10_after_onset: bool | None  # None: either milestone not reached
    max_bos: float  # the highest BOS % over the panel
    final_sink0: float | None  # Sink_0 % (Gu et al.) at the last revision; None: not measured


def _layers(per_layer: list[int]) -> str:
    return "+".join(f"L{i}" for i, n in enumerate(per_layer) if n) or "-"


def _row(seed: int | None, m: ModelFindings) -> SeedRow:
    revs = m.revisions
    position = {r.revision: i for i, r in enumerate(revs)}
    onset_milestone, bos_10_milestone = m.f3.induction_onset, m.f3.bos_10
    onset = onset_milestone.revision if onset_milestone else None
    bos_10 = bos_10_milestone.revision if bos_10_milestone else None
    bos_layers = {i for r in revs for i, n in enumerate(r.bos_per_layer) if n}
    return SeedRow(
        seed=seed,
        bos=[(r.revision, 100 * r.bos_fraction, _layers(r.bos_per_layer)) for r in revs],
        final_bos=100 * revs[-1].bos_fraction,
        final_layers=_layers(revs[-1].bos_per_layer),
        final_heads=revs[-1].bos_per_layer,
        onset=onset,
        bos_10=bos_10,
        sinks_in_layers_ge_2_only=bool(bos_layers) and min(bos_layers) >= 2,
        bos_10_after_onset=None if not (onset and bos_10) else position[bos_10] > position[onset],
        max_bos=max(100 * r.bos_fraction for r in revs),
        final_sink0=None if m.sinks_gu is None else 100 * m.sinks_gu.revisions[-1].sink_fraction,
    )


def seed_rows(findings: PanelFindings, model: str) -> list[SeedRow]:
    """One row per training seed of ``model`` (trajectories ``<model>-seed<N>``), ordered by seed; the
    trajectory ``<model>`` (seed None) where the runs are of one seed."""
    names = sorted(
        (n for n in findings.models if re.fullmatch(rf"{re.escape(model)}-seed\d+", n)),
        key=lambda n: int(n.rsplit("seed", 1)[1]),
    )
    if names:
        return [_row(int(n.rsplit("seed", 1)[1]), findings.models[n]) for n in names]
    return [_row(None, findings.models[model])] if model in findings.models else []


def seeds_markdown(findings: PanelFindings, model: str) -> str:
    rows = seed_rows(findings, model)
    if not rows:
        raise UsageError(
            f"--model {model}: no trajectories {model}-seed<N> or {model} in these findings; they hold "
            f"{', '.join(sorted(findings.models)) or 'no models'}"
        )
    revisions = [r for r, _, _ in rows[0].bos]
    lines = [
        f"{model}: BOS % by revision (layers with BOS heads), per training seed",
        "",
        "| seed | " + " | ".join(revisions) + " | induction onset (>= 3 heads) | BOS >= 10% from | final Sink_0 % |",
        "|---" * (len(revisions) + 4) + "|",
    ]
    for row in rows:
        cells = [f"{v:.1f}" + (f" ({layers})" if layers != "-" else "") for _, v, layers in row.bos]
        sink0 = "-" if row.final_sink0 is None else f"{row.final_sink0:.1f}"
        lines.append(
            f"| {row.seed} | " + " | ".join(cells) + f" | {row.onset or 'never'} | {row.bos_10 or 'never'} | {sink0} |"
        )
    final = np.array([r.final_bos for r in rows])
    n = len(rows)
    lines += [
        "",
        f"final BOS %: {', '.join(f'{v:.1f}' for v in final)} (median {np.median(final):.1f}, "
        f"range {final.min():.1f}-{final.max():.1f}, {n} seeds)",
        f"final BOS heads per layer: {'; '.join(str(r.final_heads) for r in rows)}",
        "highest BOS % over the panel: " + ", ".join(f"{r.max_bos:.1f}" for r in rows),
        f"seeds with BOS heads only in layers >= 2: {sum(r.sinks_in_layers_ge_2_only for r in rows)} of {n}",
        f"seeds reaching BOS >= 10%: {sum(r.bos_10 is not None for r in rows)} of {n}; "
        f"first after the induction onset: {sum(bool(r.bos_10_after_onset) for r in rows)} of {n}",
        f"induction onset: {', '.join(str(r.onset) for r in rows)}",
    ]
    if all(r.final_sink0 is not None for r in rows):
        lines.append("final Sink_0 %: " + ", ".join(f"{r.final_sink0:.1f}" for r in rows))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser("python -m emergence.panel.seeds", __doc__)
    parser.add_argument("report", type=Path, help="a panel report folder (findings.json) or the file itself")
    parser.add_argument("--model", default="toy_olmo_sinks")
    args = parser.parse_args(argv)
    path = args.report / "findings.json" if args.report.is_dir() else args.report
    if not path.is_file():
        parser.error(
            f"{path}: no such file; give a panel report folder (python -m emergence.report ... --out DIR) "
            "or its findings.json"
        )
    try:
        data = json.loads(path.read_text())
    except ValueError as err:  # not UTF-8, or not JSON
        parser.error(f"{path} is not a panel report's findings.json ({type(err).__name__}: {err})")
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        parser.error(f"{path} is not a panel report's findings.json (it has no models)")
    try:
        print(seeds_markdown(PanelFindings.from_json(data), args.model))
    except UsageError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
