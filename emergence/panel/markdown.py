"""report.md: each finding in words next to its numbers (and the published ones, when the
reference study's data is the input).

One function per section, in the order report.md shows them, each reading the record
(``records.py``) it renders. ``study`` is the model's key in ``published.py`` where the
input is the study's own data and it published numbers for that model, else None.
"""

from __future__ import annotations

from emergence import measures
from emergence.panel import published
from emergence.panel.records import (
    F1,
    F3,
    F4,
    F5,
    F6,
    F7,
    BosShape,
    Conclusion,
    DtypeNote,
    EdgeDistance,
    Milestone,
    ModelFindings,
    NullFloor,
    PanelFindings,
    PrIntegralRanking,
    PublishedComparison,
    RevisionRow,
    SeedFamily,
    SinkFindings,
    TaskFindings,
    Thresholds,
    TokenAxis,
)
from emergence.panel.sensitivity import GRID_POINTS, GRID_RANGE
from emergence.recipe.tasks.ablation import sweep_text
from emergence.run.results import format_tokens


def milestone_text(milestone: Milestone | None) -> str:
    """A milestone with its bracket, and the bootstrap's most likely revision when there is one."""
    m = milestone or Milestone(None, None, None)
    if m.revision is None:
        text = "never"
    else:
        assert m.bracket_tokens is not None  # a milestone reached has its bracket
        low, high = m.bracket_tokens
        text = (
            f"{m.revision} ({format_tokens(m.tokens)}; in "
            f"{'[0' if low is None else '(' + format_tokens(low)}, {format_tokens(high)}])"
        )
    if m.probability is not None:
        text += f" [P = {m.probability.get(m.revision or 'never', 0):.2f}]"
    if m.near_threshold_heads:
        text += f" (depends on heads near a threshold: {', '.join(m.near_threshold_heads)})"
    return text


def _range(values, fmt) -> str:
    low, high = values
    return f"{'-' if low is None else fmt(low)} to {'open' if high is None else fmt(high)}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _signed(x) -> str:
    return "-" if x is None else f"{x:+.3f}"


def _heads(names: list[str] | None) -> str:
    return "-" if names is None else ", ".join(names) or "none"


def _times(x: float) -> str:
    return f"{x:.1f}x"


def header(findings: PanelFindings, reference: bool) -> list[str]:
    """The thresholds, the input, and how to read brackets and intervals."""
    th = findings.thresholds
    models = findings.models.values()
    intervals = findings.intervals
    return [
        "# Panel report\n",
        f"Thresholds: class / BOS membership >= {th.class_:g}x baseline, induction circuit >= "
        f"{th.circuit:g}x"
        + (f"; Gu et al.'s Sink_0 at key-0 importance > {th.sink_epsilon:g}" if any(f.sinks_gu for f in models) else "")
        + f". Input: {'the reference study data' if reference else 'run directories'}.\n",
        "How to read the numbers: a milestone first seen at a revision happened after the revision "
        "before it and by its own, so each comes with that bracket in tokens, `(before, at]`. "
        + (
            "Intervals need run directories (their per-sequence attentions): on this input only the brackets apply.\n"
            if not any(f.intervals for f in models)
            else f"Intervals are {intervals.ci:.0%} percentile bootstrap intervals over the probe's "
            f"sequences ({intervals.n_boot} replicates, one resample matrix for every "
            "revision); `P` is the share of replicates in which that revision is the milestone.\n"
        ),
    ]


def revisions_table(rows: list[RevisionRow], study: str | None) -> list[str]:
    """Per revision: tokens, BOS fraction, induction heads, recall (the study's numbers beside them,
    the measures' per-run numbers shown per revision, ``measures.run_columns``, e.g. the toys' copy loss
    drop, and the heads near a threshold where known)."""
    head = "| revision | tokens | BOS % | induction heads | recall | top-k recall |"
    sep = "|---|---|---|---|---|---|"
    if study:
        head += " published BOS % | published induction |"
        sep += "---|---|"
    shown = [col for _, col in measures.run_columns() if any(r.run_values.get(col.field) is not None for r in rows)]
    for col in shown:
        head += f" {col.label} |"
        sep += "---|"
    near = any(r.near_threshold is not None for r in rows)
    if near:
        head += " near a threshold |"
        sep += "---|"
    out = [head, sep]
    for i, r in enumerate(rows):
        row = (
            f"| {r.revision}{' (refinement)' if r.refined else ''} | {format_tokens(r.tokens)} | "
            f"{100 * r.bos_fraction:.1f} | {r.n_induction} | {_pct(r.induction_recall)} | {_pct(r.topk_recall)} |"
        )
        if study and i < len(published.BOS_FRACTION[study]):
            row += f" {published.BOS_FRACTION[study][i]} | {published.N_INDUCTION[study][i]} |"
        for col in shown:
            value = r.run_values.get(col.field)
            row += " - |" if value is None else f" {value:{col.fmt}} |"
        if near:
            row += f" {_heads(r.near_threshold)} |"
        out.append(row)
    return out


def dtype_line(d: DtypeNote, study: str | None) -> str:
    """Which dtype the numbers come from, against the study's, and what rounding can move."""
    errors = "; ".join(f"{dtype} moves a selectivity by up to {100 * e:.2g}%" for dtype, e in d.relative_error.items())
    near = (
        f" ({errors}: heads within that of a threshold are listed as near a threshold, "
        "benchmarks/results/dtype_error_cpu.json)"
        if errors
        else ""
    )
    if study:
        return f"- **Dtype**: the study's numbers, computed in {d.reference_dtype}{near}."
    if d.differs:
        return (
            f"- **Dtype**: these runs used {', '.join(d.dtypes)}, the study {d.reference_dtype}: they match "
            f"its published numbers only up to both dtypes' rounding{near}."
        )
    return f"- **Dtype**: {', '.join(d.dtypes) or 'unknown'}" + (
        f", as the study ran it{near}." if d.reference_dtype else f"{near}."
    )


def identical_weights_line(same: list[str]) -> str:
    return (
        f"- **Identical weights**: {' = '.join(same)} have the same weights (weights_sha256): "
        "at most one of them is the checkpoint its name says; check the repo before reading trends."
    )


def null_floor_line(f: NullFloor, n_revisions: int) -> str:
    """The null floor the runs used (each run's ``summary.json`` ``null``): its rule, range and set-aside heads."""
    rules = "; ".join(
        f"`{rule}` at {len(r.revisions)} of {n_revisions} revisions ({r.definition})" for rule, r in f.rules.items()
    )
    floors = "none" if f.floor_range is None else _range(f.floor_range, lambda x: f"{x:.2f}x")
    set_aside = "; ".join(f"{head} at {', '.join(revisions)}" for head, revisions in f.set_aside.items())
    return (
        f"- **Null floor** (from the runs; the report computes none): rule {rules}; floors {floors}; "
        f"heads set aside for a degenerate baseline: {set_aside or 'none'}."
    )


def f1_line(f1: F1) -> str:
    return f"- **F1 zero-BOS layers**: layers with no BOS head at any revision: {f1.zero_bos_layers or 'none'}."


def f2_line(f2: BosShape, study: str | None) -> str:
    """The BOS fraction's rise (where something rose)."""
    share_ci = "" if f2.jump_share_ci is None else f" (CI {_range(f2.jump_share_ci, _pct)})"
    final_ci = "" if f2.final_fraction_ci is None else f" (CI {_range(f2.final_fraction_ci, _pct)})"
    assert f2.largest_jump is not None  # something rose
    text = (
        f"- **F2 shape**: {f2.shape}; largest adjacent rise {f2.largest_jump_pp:+.1f} pp "
        f"({f2.largest_jump[0]} -> {f2.largest_jump[1]}), {_pct(f2.jump_share)}{share_ci} of "
        f"the rise to the final {_pct(f2.final_fraction)}{final_ci}; "
        f"{'monotonic' if f2.monotonic else f'not monotonic (largest drop {f2.largest_drop_pp:.1f} pp)'}."
        + ("" if f2.shape_note is None else f" Note: {f2.shape_note}.")
    )
    if study:
        text += (
            f" Published: {published.SHAPE[study]}, {published.LARGEST_JUMP_PP[study]:+.1f} pp, "
            f"{published.JUMP_SHARE[study]:.0%} of the rise."
        )
    return text


def f3_line(f3: F3, study: str | None) -> str:
    text = (
        f"- **F3 separation**: induction onset (>= 3 heads) {milestone_text(f3.induction_onset)}; BOS "
        f"10/30/50/70%: {', '.join(milestone_text(m) for m in f3.bos_levels())}; gap BOS-50% / onset = "
        f"{'-' if f3.gap_ratio is None else _times(f3.gap_ratio)}"
        + ("" if f3.gap_ratio_range is None else f" (range over the brackets {_range(f3.gap_ratio_range, _times)})")
        + "."
    )
    if study:
        gap = published.GAP_RATIO[study]
        text += (
            f" Published: onset {format_tokens(published.ONSET_B[study] * 1e9)}, "
            f"BOS-50% {format_tokens(published.BOS_50_B[study] * 1e9)}"
            + (f", gap {gap}x." if gap else " (Pythia: both ~6B, below the panel's resolution).")
        )
    return text


def sinks_two_ways(g: SinkFindings, rows: list[RevisionRow]) -> list[str]:
    """The second sink definition (Gu et al.) beside the BOS fraction: per revision, then F1-F3 under
    it and where the two disagree."""
    out = [
        f"- **Sinks two ways**: Sink_0 = {g.definition.replace('epsilon', f'epsilon = {g.epsilon:g}')}; "
        "the BOS fraction uses the last query only and a ratio to the baseline.",
        "",
        "  | revision | BOS % | Sink_0 % | Sink_0 CI | Sink_0 per layer % |",
        "  |---|---|---|---|---|",
    ]
    for r, s in zip(rows, g.revisions):
        ci = "-" if s.sink_fraction_ci is None else _range(s.sink_fraction_ci, _pct)
        out.append(
            f"  | {r.revision} | {100 * r.bos_fraction:.1f} | {100 * s.sink_fraction:.1f} | {ci} | "
            + " / ".join(f"{100 * x:.0f}" for x in s.sink_per_layer)
            + " |"
        )
    f2, f3 = g.f2, g.f3
    shape = (
        "no rise"
        if not f2.largest_jump
        else f"{f2.shape}, largest adjacent rise {f2.largest_jump_pp:+.1f} pp ({f2.largest_jump[0]} -> "
        f"{f2.largest_jump[1]}), {_pct(f2.jump_share)} of the rise to the final "
        f"{_pct(f2.final_fraction)}" + ("" if f2.shape_note is None else f" (note: {f2.shape_note})")
    )
    gap = "-" if f3.gap_ratio is None else _times(f3.gap_ratio)
    if f3.gap_ratio_range is not None:
        gap += f" (range {_range(f3.gap_ratio_range, _times)})"
    out += [
        "",
        f"  Under Sink_0: F1 layers without sinks {g.f1.zero_sink_layers or 'none'}; F2 {shape}; "
        f"F3 Sink_0 10/30/50/70%: {', '.join(milestone_text(m) for m in f3.sink_levels())}; "
        f"gap Sink_0-50% / induction onset {gap}.",
        "  Where the two definitions disagree: " + ("; ".join(g.disagreements) or "nowhere on this panel") + ".",
    ]
    return out + [""]


def refined_milestones(refined: dict[str, dict]) -> list[str]:
    """The milestones ``python -m emergence.refine`` narrowed (its ``Refinement`` answers): panel
    bracket -> refined interval."""
    out = [
        "- **Refined milestones** (`refined.json`): each panel bracket narrowed by analysing checkpoints "
        "inside it; the answer is one interval between adjacent existing checkpoints.",
        "",
        "  | milestone | panel bracket | refined interval | tokens | evaluations / checkpoints inside | P | "
        "first crossing |",
        "  |---|---|---|---|---|---|---|",
    ]
    for name, r in refined.items():
        if r["panel_bracket"] is None:
            out.append(f"  | {name} | - | - | - | - | - | {r['reason']} |")
            continue
        interval = "in progress" if not r["complete"] else f"{r['interval'][0]} -> {r['interval'][1]}"
        tokens = "-" if not r["complete"] else f"({format_tokens(r['tokens'][0])}, {format_tokens(r['tokens'][1])}]"
        certainty = (
            "certain (every checkpoint below it analysed)"
            if r["first_crossing_guaranteed"]
            else f"assumed ({r['method']}: the metric taken not to cross and fall back)"
        )
        if r["monotone"] is False:
            certainty += "; the analysed points are not monotone"
        probability = "-" if r["probability"] is None else f"{r['probability']:.2f}"
        out.append(
            f"  | {name} | {r['panel_bracket'][0]} -> {r['panel_bracket'][1]} | {interval} | {tokens} | "
            f"{r['evaluations']} / {r['inside_bracket']} | {probability} | {certainty} |"
        )
    return out + [""]


def f4_line(f4: F4, class_threshold: float, study: str | None) -> str:
    def at(m: Milestone | None) -> str:
        if m is None or m.fraction_of_training is None:
            return milestone_text(m)
        return milestone_text(m) + f", {100 * m.fraction_of_training:.1f}% of training"

    text = (
        f"- **F4 early convergence** (final circuit {', '.join(f4.final_circuit) or 'empty'}; recall = "
        f"share of it at >= {class_threshold:g}x): 1/3 at {at(f4.recall_33)}; 2/3 at {at(f4.recall_67)}; "
        f"all at {at(f4.recall_100)}; top-k recall 2/3 at {milestone_text(f4.topk_recall_67)}."
    )
    if study:
        text += (
            f" Published 67%: {format_tokens(published.RECALL_67_B[study] * 1e9)} (the study's 33% and 100% "
            f"rows follow no single definition; ours are the definition above)."
        )
    return text


def f5_line(f5: F5, circuit_threshold: float, study: str | None) -> str:
    lines = []
    for name, h in f5.heads.items():
        if h.lead is not None:
            lines.append(
                f"{name}: PR rise at {milestone_text(h.pr_rise)}, selectivity >= {circuit_threshold:g}x at "
                f"{milestone_text(h.selectivity_cross)}: lead {h.lead:.1f}x"
            )
        else:
            lines.append(f"{name}: no lead ({h.reason})")
    text = f"- **F5 PR leads selectivity** ({f5.pr_estimator or 'no PR'}): " + ("; ".join(lines) or "no heads.")
    if study in published.F5_LEAD:
        text += " Published: " + ", ".join(f"{h} ~{v}x" for h, v in published.F5_LEAD[study].items()) + "."
    return text


def _distance(d: EdgeDistance) -> str:
    if d.distance is None or d.range is None:
        return f"{d.milestone} not reached"
    when = "after" if d.distance > 0 else "before" if d.distance < 0 else "at"
    return (
        f"{d.milestone} {format_tokens(abs(d.distance))} {when} it (range "
        f"{_range(d.range, lambda x: ('-' if x < 0 else '+') + format_tokens(abs(x)))})"
    )


def f6_lines(f6: F6, circuit_threshold: float) -> list[str]:
    """F6 in words: the edge's phases against the milestones, and each crossing a measure declares
    against selectivity."""
    out = []
    if f6.edge is None:
        out.append(
            "- **F6 the parameter-space half**: no edge.json beside the runs "
            "(`python -m emergence.edge SWEEP_DIR` writes one)."
        )
    elif not f6.phases:
        out.append(
            f"- **F6 the spectral edge** (W={f6.window}, {f6.edge}): sigma_2/sigma_3 has no peak "
            "(no window with a ratio)."
        )
    else:
        phrases = []
        for phase in f6.phases:
            placed = [_distance(d) for d in f6.distances if d.phase == phase.name]
            words = "peaks" if phase.name == "r23_peak" else "collapses below 1.20"
            span = (
                ""
                if phase.first is None or phase.last is None
                else f"window {format_tokens(phase.first)}-{format_tokens(phase.last)}"
            )
            phrases.append(
                f"sigma_2/sigma_3 {words} in the {span} (steps {phase.first_step}-{phase.last_step}, "
                f"ratio {_value(phase.r23)}): " + "; ".join(placed)
            )
        if not any(p.name == "r23_collapse" for p in f6.phases):
            phrases.append("it does not collapse below 1.20 after its peak")
        out.append(f"- **F6 the spectral edge** (W={f6.window}, {f6.edge}): " + ". ".join(phrases) + ".")
    by_column: dict[str, list[str]] = {}
    for name, orders in f6.heads.items():
        for h in orders:
            by_column.setdefault(h.column, []).append(
                f"{name}: {h.column} >= {h.level:g} at {milestone_text(h.crossing)}, "
                f"selectivity >= {circuit_threshold:g}x at {milestone_text(h.selectivity_cross)}"
                + ("" if h.order is None else f": {h.order}")
            )
    for column, phrases in by_column.items():
        out.append(f"- **F6 {column} against selectivity**: " + "; ".join(phrases) + ".")
    return out


def f7_lines(f7: F7, circuit_threshold: float) -> list[str]:
    """F7 in words: the series' stage boundaries against the milestones, and each asked head's rise."""
    failed = [p for p in f7.series if p.failed]
    measured = [p for p in f7.series if p.value is not None]
    head = (
        f"- **F7 stages of the {f7.label}** ({len(measured)} of {len(f7.series)} revisions estimated"
        + (f"; left out as failed: {', '.join(f'{p.revision} ({p.failed})' for p in failed)}" if failed else "")
        + f"; a step over {f7.jump_multiple:g}x its chains' spread and {f7.relative_step:.0%} of its range is a "
        "rise or a fall, else flat): "
    )
    if not f7.boundaries:
        return [head + "no boundary: its slope keeps one class over the revisions."]
    phrases = []
    for b in f7.boundaries:
        near = [
            f"{name} {format_tokens(abs(d))} {'after' if d > 0 else 'before' if d < 0 else 'at'} it"
            + (" (brackets overlap)" if b.touches.get(name) else "")
            for name, d in b.distances.items()
            if d is not None
        ]
        phrases.append(
            f"{b.before} -> {b.after} at {b.revision} ({format_tokens(b.tokens)}, between "
            f"{format_tokens(b.bracket_tokens[0])} and {format_tokens(b.bracket_tokens[1])})"
            + (": " + "; ".join(near) if near else "")
        )
    out = [head + ". ".join(phrases) + "."]
    if f7.heads:
        orders = [
            f"{name}: rises at {milestone_text(h.rise)}, selectivity >= {circuit_threshold:g}x at "
            f"{milestone_text(h.selectivity_cross)}" + ("" if h.order is None else f": the rise {h.order}")
            for name, h in f7.heads.items()
        ]
        out.append(f"- **F7 refined {f7.label} per head against selectivity**: " + "; ".join(orders) + ".")
    return out


def pr_ranking_line(ranking: PrIntegralRanking) -> str:
    return (
        f"- **PR-integral ranking**: of the top {ranking.top_k} heads by the integral of PR over "
        f"log tokens, {_pct(ranking.classified_share)} are classified by the screen at the last "
        f"revision ({_pct(ranking.induction_share)} as induction members)."
    )


def model_section(model: str, f: ModelFindings, th: Thresholds, reference: bool) -> list[str]:
    study = model if reference and model in published.BOS_FRACTION else None
    out = [f"## {model}\n"]
    if f.unit == "steps":
        out.append(
            "Its runs recorded no token counts, so every **tokens** of this section counts training **steps** "
            "(and so does the figures' axis): save token counts (transformers' Trainer: "
            "include_num_input_tokens_seen=True) or give model.tokens_per_step=N for tokens.\n"
        )
    out += [*revisions_table(f.revisions, study), ""]
    if f.dtype:
        out.append(dtype_line(f.dtype, study))
    out += [identical_weights_line(same) for same in f.identical_weights]
    if f.null_floor:
        out.append(null_floor_line(f.null_floor, len(f.revisions)))
    out.append(f1_line(f.f1))
    if f.f2.largest_jump:
        out.append(f2_line(f.f2, study))
    out.append(f3_line(f.f3, study))
    if f.sinks_gu:
        out += sinks_two_ways(f.sinks_gu, f.revisions)
    if f.refined:
        out += refined_milestones(f.refined)
    out += [f4_line(f.f4, th.class_, study), f5_line(f.f5, th.circuit, study)]
    if f.pr_integral_ranking:
        out.append(pr_ranking_line(f.pr_integral_ranking))
    if f.f6 is not None:
        out += f6_lines(f.f6, th.circuit)
    if f.f7 is not None:
        out += f7_lines(f.f7, th.circuit)
    return out + [""]


def _value(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _with_interval(value: float | None, ci: list[float] | None) -> str:
    return _value(value) + ("" if ci is None else f" [{_value(ci[0])}, {_value(ci[1])}]")


def _share_of(heads: list[str], screen: list[str]) -> str:
    return f"{len(heads)}/{len(screen)}" + (f" ({', '.join(heads)})" if heads else "")


def task_section(model: str, t: TaskFindings) -> list[str]:
    """One trajectory of task runs: its capability per revision, when it emerges, the screens'
    overlaps and first entries, the final screen-vs-random verdicts and the study's numbers."""
    levels = " and ".join(f"`{level.metric}` {level.level:g}" for level in t.levels)
    coverage = "the runs'" if t.ci_level is None else f"the {t.ci_level:.0%}"
    metrics = list(t.revisions[0].metrics)
    out = [
        f"### {model}: {t.task}\n",
        f"- **Emergence** (`task_{t.task}`: the first revision where the low end of {coverage} interval over "
        f"prompts is above every level, {levels}): {milestone_text(t.emergence)}.",
        "",
        "| revision | tokens | " + " | ".join(metrics) + " | clears the levels |",
        "|---|---|" + "---|" * (len(metrics) + 1),
    ]
    out += [
        f"| {r.revision}{' (refinement)' if r.refined else ''} | {format_tokens(r.tokens)} | "
        + " | ".join(_with_interval(r.metrics[m].value, r.metrics[m].ci) for m in metrics)
        + f" | {'yes' if r.cleared else 'no'} |"
        for r in t.revisions
    ]
    for screen, entries in t.first_entry.items():
        out += [
            "",
            f"Screen `{screen}`: its top-k, and how many of them are in the run's induction circuit, its "
            "previous-token circuit and the BOS heads (sinks) of the same revision:",
            "",
            "| revision | top-k | induction | previous token | sinks |",
            "|---|---|---|---|---|",
        ]
        for r in t.revisions:
            heads, o = r.screens.get(screen, []), r.overlaps.get(screen)
            out.append(
                f"| {r.revision} | {', '.join(heads) or 'none'} | "
                + (
                    "- | - | - |"
                    if o is None
                    else f"{_share_of(o.induction, heads)} | {_share_of(o.previous_token, heads)} | "
                    f"{_share_of(o.sink, heads)} |"
                )
            )
        out += [
            "",
            "First entry into the top-k of each head of the final one: "
            + ("; ".join(f"{e.head} (rank {e.rank}) {milestone_text(e.entered)}" for e in entries) or "no heads")
            + ".",
        ]
    if t.verdicts:
        out += [
            "",
            "- **Screen vs matched random** at the final revision (specific: the screen's change of the "
            "logit measure is below every distinct matched-random draw's; top-1 beside it):",
        ]
        out += [f"  - `{s.screen}`: {sweep_text(s)}." for s in t.verdicts]
    if t.published:
        out += published_section(t.published)
    return out + [""]


def published_section(c: PublishedComparison) -> list[str]:
    """Our final numbers beside the study's (``published.json``), its invalid rows named."""
    out = [
        "",
        f"- **Beside the study** ({c.study_model} at {c.revision}; published values are the study's, "
        "run on Apple MPS in its dtype (docs/tasks.md), ours carry their interval):",
        "",
        "  | experiment | condition | metric | published | ours | published heads | our heads |",
        "  |---|---|---|---|---|---|---|",
    ]
    shown = set()  # the conditions whose heads a row above gave
    for r in c.rows:
        ours = "not run" if r.ours is None else _with_interval(r.value, r.ci)
        published = _value(r.published) if r.valid else f"{_value(r.published)} (invalid)"
        heads = (
            "(as above) | (as above)"
            if (r.experiment, r.condition) in shown
            else f"{', '.join(r.published_heads) or '-'} | {'-' if r.heads is None else ', '.join(r.heads) or '-'}"
        )
        shown.add((r.experiment, r.condition))
        out.append(f"  | {r.experiment} | {r.condition} | {r.metric} | {published} | {ours} | {heads} |")
    invalid = {(r.experiment, r.condition): r.why for r in c.invalid()}
    out += [
        "",
        "  Invalid published rows (compare nothing with them): "
        + ("; ".join(f"{experiment} {condition}: {why}" for (experiment, condition), why in invalid.items()) or "none")
        + ".",
    ]
    for s in c.screens:
        out.append(
            f"  Screen `{s.screen}`: published top-5 {', '.join(s.published)}; "
            f"ours {', '.join(s.ours) or 'none'}; shared {_share_of(s.shared, s.ours)}."
        )
    for sw in c.sweeps:
        p = sw.published
        ours = (
            "not swept"
            if sw.ours is None
            else f"ours {sw.ours.screen_delta:+.1f} pp vs {sw.ours.mean:+.2f} +- "
            f"{'-' if sw.ours.std is None else format(sw.ours.std, '.2f')} pp over {len(sw.ours.deltas)} distinct "
            "draws"
        )
        out.append(
            f"  Sweep `{sw.screen}` {p.top1_metric}: published {p.screen_delta_top1_pp:+.1f} pp vs "
            f"{p.mr_delta_top1_mean_pp:+.2f} +- {p.mr_delta_top1_std_pp:.2f} pp; {ours}."
        )
    return out


def token_axis_section(model: str, axis: TokenAxis) -> list[str]:
    """The probes' measures side by side: each transition, the events in token order, every
    pair's separation, and where the random-token and text probes disagree about sinks."""
    out = [
        f"## {model}: measures on one token axis\n",
        f"Probes: {', '.join(axis.probes)} (docs/probes.md). A transition is a measure's largest change "
        "between adjacent revisions; its milestone is the first revision past half of it.",
        "",
    ]
    if axis.transitions:  # none: a task's emergence is the only measure beside the probe's milestones
        out += ["| measure (probe) | per revision | largest change | transition |", "|---|---|---|---|"]
    for t in axis.transitions:
        change = "-" if t.largest_jump is None else f"{t.jump:+.4g} ({t.largest_jump[0]} -> {t.largest_jump[1]})"
        out.append(
            f"| {t.measure} ({t.probe}) | {' / '.join(_value(v) for v in t.values)} | {change} | "
            f"{milestone_text(t.half_way)} |"
        )
    out += [
        "",
        "Events in token order: "
        + "; ".join(
            f"{name} {milestone_text(m)}"
            for name, m in sorted(
                axis.events.items(),
                key=lambda item: (
                    item[1] is None or item[1].tokens is None,
                    item[1].tokens if item[1] and item[1].tokens else 0,
                ),
            )
        )
        + ".",
        "",
    ]
    if axis.separations:
        out += ["| earlier | later | tokens later / earlier | range over the brackets |", "|---|---|---|---|"]
        out += [
            f"| {s.earlier} | {s.later} | {'-' if s.gap_ratio is None else _times(s.gap_ratio)} | "
            f"{'-' if s.gap_ratio_range is None else _range(s.gap_ratio_range, _times)} |"
            for s in axis.separations
        ]
        out.append("")
    if axis.sinks:
        out += [
            "Sinks on random tokens and on text (Sink_eps; BOS fraction):",
            "",
            "| revision | Sink_eps synthetic | Sink_eps text | BOS synthetic | BOS text |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {s.revision} | {_pct(s.sink_fraction['synthetic'])} | {_pct(s.sink_fraction['text'])} | "
            f"{_pct(s.bos_fraction['synthetic'])} | {_pct(s.bos_fraction['text'])} |"
            for s in axis.sinks
        ]
        out += [
            "",
            "Where the probes disagree (Sink_eps >= 50% on one, below on the other): "
            + (", ".join(axis.disagreements()) or "nowhere on this panel")
            + ".",
            "",
        ]
    return out


def seeds_section(family: str, entry: SeedFamily) -> list[str]:
    """One model trained from several seeds: each milestone over them."""
    out = [
        f"## Across training seeds: {family} ({len(entry.seeds)} seeds)\n",
        "| milestone | reached in | median | range | per seed |",
        "|---|---|---|---|---|",
    ]
    for milestone, m in entry.milestones().items():
        per_seed = ", ".join(
            f"{name.rsplit('-', 1)[-1]}: {format_tokens(t) if t is not None else 'never'}"
            for name, t in m.per_seed.items()
        )
        span = "-" if m.range is None else f"{format_tokens(m.range[0])} to {format_tokens(m.range[1])}"
        median = "-" if m.median is None else format_tokens(m.median)
        out.append(f"| {milestone} | {m.reached}/{len(entry.seeds)} | {median} | {span} | {per_seed} |")
    return out + [""]


def sensitivity_section(conclusions: list[Conclusion]) -> list[str]:
    """Where each conclusion holds over the threshold grid (``sensitivity.py``)."""
    out = [
        "## Threshold sensitivity\n",
        f"Recomputed from the stored per-head selectivities at {GRID_POINTS} x {GRID_POINTS} "
        f"(class / BOS, circuit) thresholds, log-spaced over {GRID_RANGE[0]:g}-{GRID_RANGE[1]:g}x on both "
        "axes (`sensitivity.csv`: what each finding gives and concludes at every setting; "
        "`sensitivity.png`: where each conclusion holds). *Flips*: where the conclusion changes along "
        "each axis through the report's thresholds.\n",
        "| model | conclusion | at the report's thresholds | share of the grid | flips |",
        "|---|---|---|---|---|",
    ]
    return out + [
        f"| {c.model} | {c.conclusion} | {'yes' if c.holds_at_report_thresholds else 'no'} | "
        f"{_pct(c.share)} | {c.flips} |"
        for c in conclusions
    ]


def causal_threshold(sweeps: list[dict]) -> list[str]:
    """The causal-threshold section (``causal_threshold.load_sweeps``): per swept checkpoint, each threshold's
    circuit and verdict, and T*."""
    out = [
        "## Causal threshold (T*)\n",
        "Each checkpoint's circuit screened at several thresholds, ablated against control sets "
        "(docs/method.md section 9). T* is the smallest swept threshold from which on every threshold with a "
        "verdict is causal; it lies between the next lower swept threshold with a verdict and T*.\n",
    ]
    for sweep in sweeps:
        bracket = (
            "none: the highest threshold with a verdict is not causal"
            if sweep["t_star"] is None
            else f"{sweep['t_star']:g}x"
            + ("" if sweep["below"] is None else f" (in ({sweep['below']:g}x, {sweep['t_star']:g}x])")
        )
        out.append(
            f"**{sweep['model']} @ {sweep['revision']}** ({format_tokens(sweep['tokens'])} tokens): "
            f"T* = {bracket}{'' if sweep['monotone'] else '; the verdicts are not monotone in the threshold'}"
            ".\n"
        )
        out += [
            "| threshold | circuit | circuit rise | controls' mean | control sets | causal | sequences |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in sweep["points"]:
            verdict = {True: "yes", False: "no", None: p["note"] or "-"}[p["causal"]]
            sets = f"{p['n_controls']}" + (f" ({p['n_fallback']} by the fallback)" if p["n_fallback"] else "")
            out.append(
                f"| {p['threshold']:g}x | {', '.join(p['circuit']) or 'empty'} | "
                f"{_signed(p['circuit_loss_increase'])} | {_signed(p['controls_loss_increase_mean'])} | "
                f"{sets} | "
                f"{verdict} | {p['sequences_used'] if p['sequences_used'] is not None else '-'} |"
            )
        out.append("")
    return out


def defective_section(defective: dict[str, dict[str, str]]) -> list[str]:
    """The branches the integrity check found defective: left out of the trajectories (a duplicate is
    analysed once, at the branch whose weights it serves)."""
    if not defective:
        return []
    out = [
        "",
        "## Defective checkpoints",
        "",
        "Found by the integrity check before the sweep (python -m emergence.revisions MODEL --check); "
        "none of them is a point of the trajectories above.",
        "",
    ]
    for repo, branches in defective.items():
        out += [f"- {repo}@{branch}: {verdict}" for branch, verdict in branches.items()]
    return out


def render(findings: PanelFindings, reference: bool) -> str:
    out = header(findings, reference)
    for model, f in findings.models.items():
        out += model_section(model, f, findings.thresholds, reference)
    tasks = {model: f.task for model, f in findings.models.items() if f.task is not None}
    if tasks:
        out += [
            "## Task circuits\n",
            "Trajectories of task runs (docs/tasks.md), one per model and task; their F1-F5 above are the "
            "synthetic probe's of the same runs. A task emerges at the first revision whose metrics' intervals "
            "clear the stated levels; the screens' heads are compared with the same run's capability circuits "
            "and with the BOS heads at the report's class threshold.\n",
        ]
        for model, t in tasks.items():
            out += task_section(model, t)
    for model, axis in findings.token_axis.items():
        out += token_axis_section(model, axis)
    for family, entry in findings.seeds.items():
        out += seeds_section(family, entry)
    out += sensitivity_section(findings.sensitivity)
    out += defective_section(findings.defective_checkpoints)
    if findings.causal_threshold:
        out += ["", *causal_threshold(findings.causal_threshold)]
    out += ["\n## Figures\n", *(f"![{name}]({name})" for name in findings.figures)]
    return "\n".join(out) + "\n"
