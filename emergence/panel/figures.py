"""The panel report's figures (PNG, matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from emergence import measures  # noqa: E402
from emergence.panel.records import ModelFindings, PanelFindings, RevisionRow  # noqa: E402
from emergence.panel.sensitivity import CONCLUSIONS  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _all_tokens(findings: PanelFindings) -> list[float]:
    return [r.tokens for f in findings.models.values() for r in f.revisions]


def axis_label(units: set[str]) -> str:
    """What the x axis counts: training tokens, or steps for runs that recorded no tokens."""
    if units == {"steps"}:
        return "training steps (the runs recorded no tokens)"
    return "training tokens" + (" (steps for runs that recorded no tokens)" if "steps" in units else "")


def _units(findings: PanelFindings) -> set[str]:
    return {f.unit for f in findings.models.values()}


def _tokens_axis(ax, tokens: list[float], units: set[str]):
    """Log tokens (or steps, ``axis_label``); symlog when a revision has no tokens yet (step 0), so that it
    stays on the axis. Such an axis starts at 0: autoscaling's margin would run it into negative counts."""
    positive = [t for t in tokens if t > 0]
    if positive and len(positive) < len(tokens):
        ax.set_xscale("symlog", linthresh=min(positive))
        # 0, then whole decades from the first count on: the locator's own ticks in the linear part crowd 0
        decades = np.arange(np.ceil(np.log10(min(positive))), np.floor(np.log10(max(positive))) + 1)
        ax.set_xticks([0, *10.0**decades])
    elif positive:
        ax.set_xscale("log")
    if len(positive) < len(tokens):
        ax.set_xlim(left=0)
    ax.set_xlabel(axis_label(units))


@dataclass(frozen=True)
class Series:
    """What ``_line_with_band`` draws of each row (RevisionRow or SinkRow)."""

    value: Callable  # row -> its value
    ci: Callable  # row -> its bootstrap interval [low, high], or None
    scale: float = 1.0  # e.g. 100 for a share drawn in %
    refined: bool = True  # draw the rows analysed by refinement hollow


def _line_with_band(ax, rows: list, series: Series, label: str, **style) -> str:
    """``series.value(row)`` per row against tokens; ``series.ci(row)`` as a band where every row has one.
    Returns the line's colour."""
    value, ci, scale, refined = series.value, series.ci, series.scale, series.refined
    tokens = [r.tokens for r in rows]
    (line,) = ax.plot(tokens, [scale * value(r) for r in rows], style.pop("fmt", "o-"), label=label, **style)
    if rows and all(ci(r) is not None for r in rows):
        low, high = np.array([ci(r) for r in rows]).T * scale
        ax.fill_between(tokens, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if refined:
        _refined_points(ax, rows, lambda r: scale * value(r), line.get_color())
    return line.get_color()


def _refined_note(findings: PanelFindings) -> str:
    """What hollow markers mean, for a title, where a model has refinement points."""
    refined = any(r.refined for f in findings.models.values() for r in f.revisions)
    return "hollow: checkpoints analysed by refinement" if refined else ""


def _refined_points(ax, rows: list[RevisionRow], value, colour) -> None:
    """Revisions analysed by ``python -m emergence.refine`` drawn hollow over a line of the panel's."""
    refined = [r for r in rows if r.refined]
    if refined:
        ax.plot(
            [r.tokens for r in refined], [value(r) for r in refined], "o", mfc="w", color=colour, label="_refined"
        )  # no legend entry of its own: the axis title says what hollow is


def bos_vs_tokens(findings: PanelFindings, out: Path) -> Path:
    """The BOS fraction per model, and beside it (dashed, same colour) Gu et al.'s Sink_0 where measured."""
    fig, ax = plt.subplots(figsize=(6, 4))
    both = False
    for model, f in findings.models.items():
        colour = _line_with_band(
            ax, f.revisions, Series(lambda r: r.bos_fraction, lambda r: r.bos_fraction_ci, 100), model
        )
        if f.sinks_gu:
            both = True
            _line_with_band(
                ax,
                f.sinks_gu.revisions,
                Series(lambda s: s.sink_fraction, lambda s: s.sink_fraction_ci, 100, refined=False),
                f"{model}: Sink_0",
                fmt="s--",
                color=colour,
            )
    _tokens_axis(ax, _all_tokens(findings), _units(findings))
    ax.set_ylabel("sinks, % (band: CI)")
    th = findings.thresholds
    title = f"BOS fraction (first-token selectivity >= {th.class_:g}x)"
    if both:
        title += f"\nand Sink_0 (key-0 importance > {th.sink_epsilon:g}, dashed)"
    if _refined_note(findings):
        title += f"\n{_refined_note(findings)}"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return _save(fig, out / "bos_fraction_vs_tokens.png")


def bos_heatmap(model: str, f: ModelFindings, out: Path) -> Path:
    """Per layer and revision: BOS heads (and, where measured, Sink_0's share beside it)."""
    panels = [(np.array([r.bos_per_layer for r in f.revisions]).T, "BOS heads per layer", "{:d}", "BOS heads")]
    if f.sinks_gu:
        panels.append(
            (
                np.array([s.sink_per_layer for s in f.sinks_gu.revisions]).T,
                f"Sink_0 per layer (eps {f.sinks_gu.epsilon:g})",
                "{:.2f}",
                "Sink_0 share (heads x sequences)",
            )
        )
    n_layers, n_revs = panels[0][0].shape
    fig, axes = plt.subplots(
        1, len(panels), figsize=(len(panels) * (1 + 0.7 * n_revs), 1.5 + 0.3 * n_layers), squeeze=False
    )
    for ax, (values, title, fmt, quantity) in zip(axes[0], panels):
        im = ax.imshow(values, aspect="auto", cmap="viridis", origin="lower")
        top = values.max() or 1
        for (l, r), v in np.ndenumerate(values):
            ax.text(r, l, fmt.format(v), ha="center", va="center", fontsize=6, color="w" if v < top / 2 else "k")
        ax.set_xticks(range(n_revs), [r.revision for r in f.revisions], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(n_layers))
        ax.set_ylabel("layer")
        ax.set_title(f"{model}: {title}", fontsize=9)
        fig.colorbar(im, ax=ax, label=quantity)
    return _save(fig, out / f"bos_per_layer_{model}.png")


def head_trajectories(model: str, f: ModelFindings, out: Path) -> Path | None:
    """F5's heads: induction selectivity and PR per revision."""
    heads = f.f5.heads
    if not heads:
        return None
    tokens = [r.tokens for r in f.revisions]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    for name, h in heads.items():
        top.plot(tokens, np.maximum(h.selectivity, 1e-3), "o-", label=name)
        if h.pr is not None:
            bottom.plot(tokens, h.pr, "o-", label=name)
    top.set_yscale("log")
    top.set_ylabel("induction selectivity (x baseline)")
    top.set_title(f"{model}: final induction circuit")
    top.legend(fontsize=7)
    bottom.set_ylabel(f.f5.pr_estimator or "PR")
    _tokens_axis(bottom, tokens, {f.unit})
    return _save(fig, out / f"induction_heads_{model}.png")


def recall_vs_tokens(findings: PanelFindings, out: Path) -> Path | None:
    if all(r.induction_recall is None for f in findings.models.values() for r in f.revisions):
        return None  # no model has a final circuit at these thresholds: nothing to recall
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, f in findings.models.items():
        rows = [r for r in f.revisions if r.induction_recall is not None]
        (line,) = ax.plot(
            [r.tokens for r in rows],
            np.array([r.induction_recall for r in rows], dtype=float),
            "o-",
            label=f"{model} recall",
        )
        _refined_points(ax, rows, lambda r: r.induction_recall, line.get_color())
        ax.plot(
            [r.tokens for r in rows], np.array([r.topk_recall for r in rows], dtype=float), "x:", label=f"{model} top-k"
        )
    ax.axhline(2 / 3, color="0.6", lw=0.8)
    _tokens_axis(ax, _all_tokens(findings), _units(findings))
    ax.set_ylabel("share of the final induction circuit")
    ax.set_title(_refined_note(findings), fontsize=8)
    ax.legend(fontsize=7)
    return _save(fig, out / "recall_vs_tokens.png")


def _run_value(field: str) -> Callable[[RevisionRow], float | None]:
    """A revision's per-run number ``field`` (``RevisionRow.run_values``); None where not measured."""
    return lambda r: r.run_values.get(field)


def trajectories(findings: PanelFindings, out: Path) -> Path:
    """Per revision: induction heads, BOS fraction and the measures' per-run numbers shown per revision
    (``measures.run_columns``: the toys' copy loss drop), where measured."""
    panels = [
        (f"induction heads (>= {findings.thresholds.circuit:g}x)", lambda r: r.n_induction, lambda r: r.n_induction_ci),
        ("BOS fraction", lambda r: r.bos_fraction, lambda r: r.bos_fraction_ci),
    ]
    for _, col in measures.run_columns():
        if any(r.run_values.get(col.field) is not None for f in findings.models.values() for r in f.revisions):
            panels.append((col.label, _run_value(col.field), lambda r: None))
    fig, axes = plt.subplots(len(panels), 1, figsize=(6, 2.4 * len(panels)), sharex=True)
    for ax, (label, value, ci) in zip(axes, panels):
        for model, f in findings.models.items():
            _line_with_band(ax, [r for r in f.revisions if value(r) is not None], Series(value, ci), model)
        ax.set_ylabel(label)
    _tokens_axis(axes[-1], _all_tokens(findings), _units(findings))
    axes[0].set_title(_refined_note(findings), fontsize=8)
    axes[0].legend(fontsize=7)
    return _save(fig, out / "trajectories.png")


TASK_PANEL = "task"  # the token axis's panel of the tasks' capability


def measure_labels() -> dict[str, str]:
    """The token axis's panel labels: the registry's per-run trajectories', then its columns' trajectories'."""
    return {
        **{t.key: t.label for _, t in measures.run_trajectories()},
        **{t.key: t.label for t in measures.trajectories()},
    }


def token_axis(findings: PanelFindings, out: Path) -> Path | None:
    """Every model's measures against tokens, one panel per measure and a line per probe, with the
    induction onset and BOS / Sink_eps 50 % of each probe marked; None without any."""
    if not findings.token_axis:
        return None
    drawn = list(dict.fromkeys(t.measure for axis in findings.token_axis.values() for t in axis.transitions))
    tasks = {
        model: task
        for model in findings.token_axis
        if model in findings.models and (task := findings.models[model].task) is not None
    }
    panels = drawn + ([TASK_PANEL] if tasks else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(6.5, 2.2 * len(panels)), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for model, t in tasks.items():  # each task's top-1 share (its last level: one scale for every task)
        ax, level = axes[-1], t.levels[-1]
        # the lambdas are called within this iteration, on its level
        colour = _line_with_band(
            ax,
            t.revisions,
            Series(
                lambda r: r.metrics[level.metric].value,  # noqa: B023
                lambda r: r.metrics[level.metric].ci,  # noqa: B023
            ),
            f"{model}: {level.metric}",
        )
        if t.emergence is not None:
            for each in axes:
                each.axvline(t.emergence.tokens, color=colour, lw=1.2)
    for model, axis in findings.token_axis.items():
        for tr in axis.transitions:
            ax = axes[drawn.index(tr.measure)]
            shown = [(x, v) for x, v in zip(tr.tokens, tr.values) if v is not None]
            ax.plot(*zip(*shown), "o-", ms=3, label=f"{model} ({tr.probe})")
            if tr.half_way is not None:
                ax.axvline(tr.half_way.tokens, color=ax.lines[-1].get_color(), lw=0.8, ls=":")
        for name, m in axis.events.items():
            if (
                m is not None
                and m.tokens is not None
                and name.split(" ")[0] in ("induction_onset", "bos_50", "sink_50")
            ):
                for ax in axes:
                    ax.axvline(
                        m.tokens,
                        color="0.5",
                        lw=0.6,
                        ls={"induction_onset": "-", "bos_50": "--", "sink_50": "-."}[name.split(" ")[0]],
                    )
    for ax, measure in zip(axes, panels):
        ax.set_ylabel(measure_labels().get(measure, "task capability"), fontsize=8)
        if measure in {t.key for _, t in measures.run_trajectories() if t.log_scale}:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
    _tokens_axis(
        axes[-1],
        [x for axis in findings.token_axis.values() for t in axis.transitions for x in t.tokens]
        + [r.tokens for t in tasks.values() for r in t.revisions],
        _units(findings),
    )
    axes[0].set_title(
        "grey: induction onset (solid), BOS 50% (dashed), Sink_eps 50% (dash-dot); "
        "dotted: a transition" + ("; coloured: a task's emergence" if tasks else ""),
        fontsize=7,
    )
    return _save(fig, out / "token_axis.png")


def _threshold_plane(ax, g, values, class_threshold: float, circuit_threshold: float, **style):
    """``values`` [class, circuit] over the log-spaced threshold plane, the report's thresholds marked."""
    mesh = ax.pcolormesh(g.circuit_grid, g.class_grid, values, shading="nearest", **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot([circuit_threshold], [class_threshold], "w*", ms=10, mec="k")
    ax.set_xlabel("circuit threshold (x)")
    ax.set_ylabel("class / BOS threshold (x)")
    return mesh


def sensitivity(grids: list, class_threshold: float, circuit_threshold: float, out: Path) -> Path:
    """Per model (rows): where each conclusion holds (yellow) or not (purple) over the
    (class, circuit) threshold plane, and the F3 gap; the star marks the report's thresholds."""
    names = list(CONCLUSIONS)
    fig, axes = plt.subplots(
        len(grids), len(names) + 1, figsize=(3.3 * (len(names) + 1), 3.0 * len(grids)), squeeze=False
    )
    for row, g in zip(axes, grids):
        held = g.conclusions()
        for ax, name in zip(row, names):
            _threshold_plane(
                ax, g, held[name].astype(float), class_threshold, circuit_threshold, cmap="viridis", vmin=0, vmax=1
            )
            ax.set_title(f"{g.model}: {CONCLUSIONS[name]}", fontsize=7)
        mesh = _threshold_plane(row[-1], g, np.log10(g.gap_ratio()), class_threshold, circuit_threshold, cmap="magma")
        row[-1].set_title(f"{g.model}: gap BOS-50% / onset", fontsize=7)
        fig.colorbar(mesh, ax=row[-1], label="log10 gap")
    return _save(fig, out / "sensitivity.png")


def causal_threshold(sweeps: list[dict], out: Path) -> Path | None:
    """Per swept checkpoint: the loss rise from ablating the circuit screened at each threshold,
    the control sets' mean change, the bar the circuit must clear (causal_factor x the
    controls' change) and T*; filled markers where the verdict is causal."""
    if not sweeps:
        return None
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.6 * len(sweeps), 3.8), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps):
        pts = [p for p in sweep["points"] if p["circuit_loss_increase"] is not None]
        x = [p["threshold"] for p in pts]
        ax.plot(x, [p["circuit_loss_increase"] for p in pts], "-", color="C0", label="circuit")
        for p in pts:
            ax.plot(p["threshold"], p["circuit_loss_increase"], "o", color="C0", mfc="C0" if p["causal"] else "w")
            ax.annotate(
                f"{len(p['circuit'])}h",
                (p["threshold"], p["circuit_loss_increase"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
            )
        controls = [
            (p["threshold"], p["controls_loss_increase_mean"])
            for p in pts
            if p["controls_loss_increase_mean"] is not None
        ]
        if controls:
            ax.plot(*zip(*controls), "s-", color="C1", label="controls (mean)")
            ax.plot(
                [t for t, _ in controls],
                [sweep["causal_factor"] * abs(c) for _, c in controls],
                ":",
                color="C1",
                label=f"{sweep['causal_factor']:g} x |controls|",
            )
        if sweep["t_star"] is not None:
            ax.axvline(sweep["t_star"], color="k", lw=0.8, ls="--", label=f"T* = {sweep['t_star']:g}x")
        ax.axhline(0, color="0.7", lw=0.6)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(x, [f"{t:g}" for t in x])  # the swept thresholds themselves
        ax.set_xlabel("circuit threshold (x)")
        ax.set_ylabel("loss of B: rise when ablated (nats)")
        ax.set_title(f"{sweep['model']} @ {sweep['revision']}", fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, out / "causal_threshold.png")


def task_capability(findings: PanelFindings, out: Path) -> Path | None:
    """Per trajectory of task runs (rows), each capability metric (columns) with its interval as a
    band, the emergence levels dashed and the emergence marked; None without a task."""
    tasks = {model: f.task for model, f in findings.models.items() if f.task is not None}
    if not tasks:
        return None
    n_metrics = max(len(t.revisions[0].metrics) for t in tasks.values())
    fig, axes = plt.subplots(len(tasks), n_metrics, figsize=(3.2 * n_metrics, 2.6 * len(tasks)), squeeze=False)
    for row, (model, t) in zip(axes, tasks.items()):
        levels = {level.metric: level.level for level in t.levels}
        for ax, metric in zip(row, t.revisions[0].metrics):
            _line_with_band(
                ax,
                t.revisions,
                Series(lambda r, m=metric: r.metrics[m].value, lambda r, m=metric: r.metrics[m].ci),
                model,
            )
            if metric in levels:
                ax.axhline(levels[metric], color="0.4", lw=0.8, ls="--")
            if t.emergence is not None:
                ax.axvline(t.emergence.tokens, color="0.4", lw=0.8)
            _tokens_axis(ax, [r.tokens for r in t.revisions], {findings.models[model].unit})
            ax.set_ylabel(metric, fontsize=8)
            ax.set_title(model, fontsize=8)
        for ax in row[len(t.revisions[0].metrics) :]:
            ax.axis("off")
    fig.suptitle("task capability (band: interval over prompts; dashed: emergence level; solid: emergence)", fontsize=8)
    return _save(fig, out / "task_capability.png")


EDGE_MILESTONE_STYLES = {"induction_onset": "-", "recall_67": ":", "bos_50": "--"}


def edge_axis(findings: PanelFindings, out: Path) -> Path | None:
    """F6: each model's spectral edge (the whole model's sigma_1/sigma_2 and sigma_2/sigma_3 at each window's
    last checkpoint, with its r23 peak and collapse shaded over their windows) on the panel's axis, with
    the activation milestones F6 measures it against; None where no edge lies beside the runs."""
    with_edge = {model: f for model, f in findings.models.items() if f.f6 is not None and f.f6.series}
    if not with_edge:
        return None
    fig, axes = plt.subplots(len(with_edge), 1, figsize=(6.5, 2.6 * len(with_edge)), squeeze=False)
    for ax, (model, f) in zip(axes[:, 0], with_edge.items()):
        f6 = f.f6
        assert f6 is not None  # with_edge
        x = [p.position for p in f6.series]
        for name, values in (("σ1/σ2", [p.r12 for p in f6.series]), ("σ2/σ3", [p.r23 for p in f6.series])):
            ax.plot(x, [np.nan if v is None else v for v in values], ".-", ms=3, label=name)
        ax.axhline(1.2, color="0.6", lw=0.6)
        for phase in f6.phases:
            if phase.first is not None and phase.last is not None:
                ax.axvspan(
                    phase.first,
                    phase.last,
                    color="tab:red" if "collapse" in phase.name else "tab:orange",
                    alpha=0.2,
                    label=phase.name,
                )
        for name, style in EDGE_MILESTONE_STYLES.items():
            m = f.milestones().get(name)
            if m is not None and m.tokens is not None:
                ax.axvline(m.tokens, color="0.3", lw=0.8, ls=style, label=name)
        ax.set_ylabel(f"{model}\nsingular value ratio", fontsize=8)
        _tokens_axis(
            ax,
            x + [m.tokens for m in f.milestones().values() if m is not None and m.tokens is not None],
            _units(findings),
        )
        ax.legend(fontsize=6)
    axes[0, 0].set_title("F6: the spectral edge and the activation milestones", fontsize=8)
    return _save(fig, out / "edge_vs_tokens.png")


def stages(findings: PanelFindings, out: Path) -> Path | None:
    """F7: each model's stage series (the LLC, with its chains' spread as error bars) against tokens, its
    boundaries' brackets shaded, and the activation milestones; a failed checkpoint is marked, not drawn;
    None where no run measured a series."""
    with_stages = {model: f for model, f in findings.models.items() if f.f7 is not None}
    if not with_stages:
        return None
    fig, axes = plt.subplots(len(with_stages), 1, figsize=(6.5, 2.6 * len(with_stages)), squeeze=False)
    for ax, (model, f) in zip(axes[:, 0], with_stages.items()):
        f7 = f.f7
        assert f7 is not None  # with_stages
        drawn = [p for p in f7.series if p.value is not None]
        ax.errorbar(
            [p.tokens for p in drawn],
            [p.value for p in drawn],
            yerr=[p.spread or 0.0 for p in drawn],
            fmt=".-",
            ms=4,
            capsize=2,
            label=f7.label,
        )
        for p in f7.series:
            if p.failed:
                ax.axvline(p.tokens, color="tab:red", lw=0.6, ls=":", label="failed estimate")
        for b in f7.boundaries:
            ax.axvspan(*b.bracket_tokens, color="tab:green", alpha=0.15, label=f"boundary ({b.before} -> {b.after})")
        for name, style in EDGE_MILESTONE_STYLES.items():
            m = f.milestones().get(name)
            if m is not None and m.tokens is not None:
                ax.axvline(m.tokens, color="0.3", lw=0.8, ls=style, label=name)
        ax.set_ylabel(f"{model}\n{f7.label}", fontsize=8)
        _tokens_axis(ax, [p.tokens for p in f7.series], _units(findings))
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=6)
    axes[0, 0].set_title("F7: stages of the learning coefficient and the activation milestones", fontsize=8)
    return _save(fig, out / "stages_vs_tokens.png")
