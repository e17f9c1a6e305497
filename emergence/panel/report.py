"""``python -m emergence.report RUNS... | --reference [DIR]  --out DIR``: the panel findings F1-F5.

Reads run directories written by ``python -m emergence`` (a multirun directory or several
paths) or the reference study's per-head results (by default the copy installed with the
package, ``emergence/panel/reference_data/``), and writes ``findings.json``,
``report.md``, ``sensitivity.csv`` and figures into ``--out``, then logs a W&B panel run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from omegaconf import OmegaConf

from emergence.core.atomic import atomic_write_text
from emergence.core.config import WANDB_MODES, ThresholdConfig, WandbConfig
from emergence.core.errors import CommandParser, UsageError
from emergence.core.record import to_json
from emergence.panel import causal_threshold, edge_findings, figures, markdown, sensitivity, stage_findings
from emergence.panel.findings import panel_findings
from emergence.panel.records import Conclusion, Milestone, PanelFindings
from emergence.panel.runs import (
    REFERENCE_DATA,
    defective_checkpoints,
    load_reference,
    load_refined,
    load_runs,
    shared_thresholds,
)
from emergence.recipe import sinks
from emergence.run.tracking import check_login, tracked_run


def parse_args(argv=None):
    p = CommandParser("python -m emergence.report", __doc__)
    p.add_argument("runs", nargs="*", type=Path, help="run directories or folders holding them (e.g. a multirun)")
    p.add_argument(
        "--reference",
        type=Path,
        nargs="?",
        const=REFERENCE_DATA,
        metavar="DIR",
        help="the reference study's results (per_revision/, pr/); without DIR the copy shipped with the package",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument(
        "--class-threshold",
        type=float,
        default=None,
        help="class / BOS membership threshold (default: the runs' own if they agree, else 30)",
    )
    p.add_argument(
        "--circuit-threshold",
        type=float,
        default=None,
        help="induction circuit threshold (default: the runs' own if they agree, else 50)",
    )
    p.add_argument(
        "--sink-epsilon",
        type=float,
        default=sinks.EPSILON,
        help="Gu et al.'s sink level: key-0 importance above it counts as a sink (default %(default)s)",
    )
    p.add_argument(
        "--pr-estimator",
        choices=("pr", "pr_entropy_rank"),
        default="pr_entropy_rank",
        help="spectral column of run directories used for F5 (the reference used pr_entropy_rank)",
    )
    p.add_argument("--wandb-mode", choices=WANDB_MODES, default=None, help="default: $WANDB_MODE, else offline")
    p.add_argument("--wandb-project", default=None, help="default: $WANDB_PROJECT, else emergence")
    p.add_argument("--wandb-entity", default=None, help="default: $WANDB_ENTITY")
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.reference):
        p.error("give run directories or --reference [DIR] (exactly one of them)")
    for name, value in (("--class-threshold", args.class_threshold), ("--circuit-threshold", args.circuit_threshold)):
        if value is not None and not (math.isfinite(value) and value > 0):
            p.error(f"{name} {value} is invalid: a threshold must be a finite number > 0")
    if not 0 < args.sink_epsilon < 1:
        p.error("--sink-epsilon must be in (0, 1): a share of attention")
    p.check_output_folder(args.out, "report.md, findings.json and the figures")
    return args


@dataclass(frozen=True)
class SweepFacts:
    """What the panel's sweep directories hold besides their runs."""

    sweeps: Sequence[dict] = ()  # causal-threshold sweeps (``causal_threshold.load_sweeps``) among the runs
    refined: dict | None = None  # per model, the milestones ``python -m emergence.refine`` narrowed (``load_refined``)
    defective: dict | None = None  # the branches the sweeps' integrity checks found defective
    # per model, the spectral edge beside the runs (``edge_findings.load_edges``): (edge.json's path, the edge)
    edges: dict | None = None


def write_report(
    trajectories,
    out: Path,
    class_threshold: float,
    circuit_threshold: float,
    reference: bool,
    sink_epsilon: float = sinks.EPSILON,
    facts: SweepFacts = SweepFacts(),
) -> PanelFindings:
    """The report of the panel's ``trajectories`` in ``out``, with the sweeps' ``facts``."""
    sweeps, refined, defective = facts.sweeps, facts.refined, facts.defective
    out.mkdir(parents=True, exist_ok=True)
    findings = panel_findings(
        trajectories, class_threshold, circuit_threshold, sink_epsilon=sink_epsilon, refined=refined
    )
    findings = edge_findings.with_f6(findings, trajectories, circuit_threshold, facts.edges or {})
    findings = stage_findings.with_f7(findings, trajectories, circuit_threshold)
    grids = [sensitivity.dense(t) for t in trajectories.values()]
    rows = sensitivity.rows(grids)
    findings = dataclasses.replace(
        findings,
        causal_threshold=list(sweeps),
        sensitivity=sensitivity.conclusions(trajectories, grids, class_threshold, circuit_threshold),
        defective_checkpoints=defective or {},
    )
    made = [
        figures.bos_vs_tokens(findings, out),
        figures.recall_vs_tokens(findings, out),
        figures.trajectories(findings, out),
        figures.sensitivity(grids, class_threshold, circuit_threshold, out),
        figures.causal_threshold(findings.causal_threshold, out),
        figures.token_axis(findings, out),
        figures.task_capability(findings, out),
        figures.edge_axis(findings, out),
        figures.stages(findings, out),
    ]
    for model, f in findings.models.items():
        made += [figures.bos_heatmap(model, f, out), figures.head_trajectories(model, f, out)]
    findings = dataclasses.replace(findings, figures=[p.name for p in made if p is not None])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "sensitivity.csv", buf.getvalue())
    atomic_write_text(out / "report.md", markdown.render(findings, reference))
    atomic_write_text(out / "findings.json", json.dumps(findings.to_json(), indent=2) + "\n")  # last: marks completion
    return findings


def wandb_settings(args) -> WandbConfig:
    """The W&B settings of the panel run: the command line's, else the schema's ($WANDB_* or its defaults)."""
    given = {"mode": args.wandb_mode, "project": args.wandb_project, "entity": args.wandb_entity}
    return cast(
        WandbConfig,
        OmegaConf.to_object(
            OmegaConf.merge(
                OmegaConf.structured(WandbConfig),
                {k: v for k, v in given.items() if v is not None},
                {"group": "panel", "tags": ["panel"]},
            )
        ),
    )


def log_panel(findings: PanelFindings, out: Path, cfg: WandbConfig) -> None:
    with tracked_run(cfg, "panel", {"thresholds": to_json(findings.thresholds)}, out, job_type="panel") as run:
        if run is None:
            return
        import wandb

        for model, f in findings.models.items():
            run.define_metric(f"{model}/tokens")
            run.define_metric(f"{model}/*", step_metric=f"{model}/tokens")
            sinks = f.sinks_gu.revisions if f.sinks_gu else [None] * len(f.revisions)
            for r, s in zip(f.revisions, sinks):
                run.log(
                    {
                        f"{model}/tokens": r.tokens,
                        f"{model}/bos_fraction": r.bos_fraction,
                        **({} if s is None else {f"{model}/sink_fraction": s.sink_fraction}),
                        f"{model}/n_induction": r.n_induction,
                        **({} if r.induction_recall is None else {f"{model}/induction_recall": r.induction_recall}),
                    }
                )
            columns = ["revision", "tokens", "bos_fraction", "n_induction", "induction_recall", "topk_recall"]
            run.log(
                {
                    f"{model}/revisions": wandb.Table(
                        columns=[*columns], data=[[getattr(r, c) for c in columns] for r in f.revisions]
                    )
                }
            )
        run.log({f"figures/{Path(n).stem}": wandb.Image(str(out / n)) for n in findings.figures})
        columns = [field.name for field in dataclasses.fields(Conclusion)]
        run.log(
            {
                "sensitivity": wandb.Table(
                    columns=[*columns], data=[[getattr(c, k) for k in columns] for c in findings.sensitivity]
                )
            }
        )


def _revision(milestone: Milestone | None) -> str | None:
    return None if milestone is None else milestone.revision


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        wandb_cfg = wandb_settings(args)
        check_login(wandb_cfg)
        trajectories = load_reference(args.reference) if args.reference else load_runs(args.runs, args.pr_estimator)
        sweeps = [] if args.reference else causal_threshold.load_sweeps(args.runs)
        refined = {} if args.reference else load_refined(args.runs)
        defective = {} if args.reference else defective_checkpoints(args.runs)
        edges = {} if args.reference else edge_findings.load_edges(args.runs)
    except (FileNotFoundError, ValueError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    # docs/method.md section 4's thresholds (ThresholdConfig's defaults) unless the runs agree on others
    screened = shared_thresholds(trajectories) or (ThresholdConfig.class_default, ThresholdConfig.circuit)
    class_threshold = args.class_threshold if args.class_threshold is not None else screened[0]
    circuit_threshold = args.circuit_threshold if args.circuit_threshold is not None else screened[1]
    findings = write_report(
        trajectories,
        args.out,
        class_threshold,
        circuit_threshold,
        reference=args.reference is not None,
        sink_epsilon=args.sink_epsilon,
        facts=SweepFacts(sweeps, refined, defective, edges),
    )
    log_panel(findings, args.out, wandb_cfg)
    for model, f in findings.models.items():
        print(
            f"{model}: final BOS {100 * f.f2.final_fraction:.1f}% ({f.f2.shape}), onset "
            f"{_revision(f.f3.induction_onset)}, BOS-50% {_revision(f.f3.bos_50)}"
            + (
                ""
                if not f.sinks_gu
                else f"; Sink_0 final {100 * f.sinks_gu.f2.final_fraction:.1f}%, "
                f"Sink_0-50% {_revision(f.sinks_gu.f3.sink_50)}"
            )
        )
    for sweep in findings.causal_threshold:
        print(
            f"{sweep['model']} @ {sweep['revision']}: causal threshold T* = "
            f"{'none' if sweep['t_star'] is None else format(sweep['t_star'], 'g') + 'x'}"
        )
    print(f"report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
