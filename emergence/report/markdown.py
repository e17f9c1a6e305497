"""report.md: each finding in words next to its numbers (and the published ones, when
the reference study's data is the input)."""

from __future__ import annotations

from emergence.report import published
from emergence.report.sensitivity import GRID_POINTS, GRID_RANGE
from emergence.results import format_tokens


def _m(milestone) -> str:
    """A milestone with its bracket, and the bootstrap's most likely revision when there is one."""
    milestone = milestone or {"revision": None}
    if milestone["revision"] is None:
        text = "never"
    else:
        low, high = milestone["bracket_tokens"]
        text = (f"{milestone['revision']} ({format_tokens(milestone['tokens'])}; in "
                f"{'[0' if low is None else '(' + format_tokens(low)}, {format_tokens(high)}])")
    if "probability" in milestone:
        text += f" [P = {milestone['probability'].get(milestone['revision'] or 'never', 0):.2f}]"
    if milestone.get("near_threshold_heads"):
        text += f" (depends on heads near a threshold: {', '.join(milestone['near_threshold_heads'])})"
    return text


def _range(values, fmt) -> str:
    low, high = values
    return f"{'-' if low is None else fmt(low)} to {'open' if high is None else fmt(high)}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _signed(x) -> str:
    return "-" if x is None else f"{x:+.3f}"


def causal_threshold(sweeps: list[dict]) -> list[str]:
    """The causal-threshold section: per swept checkpoint, each threshold's circuit and verdict, and T*."""
    out = ["## Causal threshold (T*)\n",
           "Each checkpoint's circuit screened at several thresholds, ablated against control sets "
           "(docs/method.md section 9). T* is the smallest swept threshold from which on every threshold with a verdict "
           "is causal; it lies between the next lower swept threshold with a verdict and T*.\n"]
    for sweep in sweeps:
        bracket = ("none: the highest threshold with a verdict is not causal" if sweep["t_star"] is None else
                   f"{sweep['t_star']:g}x" + ("" if sweep["below"] is None else f" (in ({sweep['below']:g}x, "
                                                                              f"{sweep['t_star']:g}x])"))
        out.append(f"**{sweep['model']} @ {sweep['revision']}** ({format_tokens(sweep['tokens'])} tokens): "
                   f"T* = {bracket}{'' if sweep['monotone'] else '; the verdicts are not monotone in the threshold'}.\n")
        out += ["| threshold | circuit | circuit rise | controls' mean | causal | sequences |",
                "|---|---|---|---|---|---|"]
        for p in sweep["points"]:
            verdict = {True: "yes", False: "no", None: p["note"] or "-"}[p["causal"]]
            out.append(f"| {p['threshold']:g}x | {', '.join(p['circuit']) or 'empty'} | "
                       f"{_signed(p['circuit_loss_increase'])} | {_signed(p['controls_loss_increase_mean'])} | {verdict} | "
                       f"{p['sequences_used'] if p['sequences_used'] is not None else '-'} |")
        out.append("")
    return out


def null_floor(f: dict, n_revisions: int) -> str:
    """The null floor the runs used (each run's ``summary.json`` ``null``): its rule, range and set-aside heads."""
    rules = "; ".join(f"`{rule}` at {len(r['revisions'])} of {n_revisions} revisions ({r['definition']})"
                      for rule, r in f["rules"].items())
    floors = "none" if f["floor_range"] is None else _range(f["floor_range"], lambda x: f"{x:.2f}x")
    set_aside = "; ".join(f"{head} at {', '.join(revisions)}" for head, revisions in f["set_aside"].items())
    return (f"- **Null floor** (from the runs; the report computes none): rule {rules}; floors {floors}; "
            f"heads set aside for a degenerate baseline: {set_aside or 'none'}.")


def sinks_two_ways(g: dict, revisions: list[dict]) -> list[str]:
    """The second sink definition (Gu et al.) beside the BOS fraction: per revision, then F1-F3 under
    it and where the two disagree."""
    eps = g["epsilon"]
    out = [f"- **Sinks two ways**: Sink_0 = {g['definition'].replace('epsilon', f'epsilon = {eps:g}')}; "
           "the BOS fraction uses the last query only and a ratio to the baseline.", "",
           "  | revision | BOS % | Sink_0 % | Sink_0 CI | Sink_0 per layer % |", "  |---|---|---|---|---|"]
    for r, s in zip(revisions, g["revisions"]):
        ci = _range(s["sink_fraction_ci"], _pct) if "sink_fraction_ci" in s else "-"
        out.append(f"  | {r['revision']} | {100 * r['bos_fraction']:.1f} | {100 * s['sink_fraction']:.1f} | {ci} | "
                   + " / ".join(f"{100 * x:.0f}" for x in s["sink_per_layer"]) + " |")
    f2, f3 = g["f2"], g["f3"]
    shape = ("no rise" if not f2["largest_jump"] else
             f"{f2['shape']}, largest adjacent rise {f2['largest_jump_pp']:+.1f} pp ({f2['largest_jump'][0]} -> "
             f"{f2['largest_jump'][1]}), {_pct(f2['jump_share'])} of the rise to the final "
             f"{_pct(f2['final_sink_fraction'])}" + (f" (note: {f2['shape_note']})" if "shape_note" in f2 else ""))
    gap = "-" if f3["gap_ratio"] is None else f"{f3['gap_ratio']:.1f}x"
    if f3["gap_ratio_range"] is not None:
        gap += f" (range {_range(f3['gap_ratio_range'], lambda x: f'{x:.1f}x')})"
    out += ["", f"  Under Sink_0: F1 layers without sinks {g['f1']['zero_sink_layers'] or 'none'}; F2 {shape}; "
                f"F3 Sink_0 10/30/50/70%: {', '.join(_m(f3[f'sink_{p}']) for p in (10, 30, 50, 70))}; "
                f"gap Sink_0-50% / induction onset {gap}.",
            "  Where the two definitions disagree: " + ("; ".join(g["disagreements"]) or "nowhere on this panel")
            + "."]
    return out + [""]


def refined_milestones(refined: dict) -> list[str]:
    """The milestones ``python -m emergence.refine`` narrowed: panel bracket -> refined interval."""
    out = ["- **Refined milestones** (`refined.json`): each panel bracket narrowed by analysing checkpoints "
           "inside it; the answer is one interval between adjacent existing checkpoints.", "",
           "  | milestone | panel bracket | refined interval | tokens | evaluations / checkpoints inside | P | "
           "first crossing |", "  |---|---|---|---|---|---|---|"]
    for name, r in refined.items():
        if r["panel_bracket"] is None:
            out.append(f"  | {name} | - | - | - | - | - | {r['reason']} |")
            continue
        interval = "in progress" if not r["complete"] else f"{r['interval'][0]} -> {r['interval'][1]}"
        tokens = "-" if not r["complete"] else f"({format_tokens(r['tokens'][0])}, {format_tokens(r['tokens'][1])}]"
        certainty = ("certain (every checkpoint below it analysed)" if r["first_crossing_guaranteed"] else
                     f"assumed ({r['method']}: the metric taken not to cross and fall back)")
        if r["monotone"] is False:
            certainty += "; the analysed points are not monotone"
        probability = "-" if r["probability"] is None else f"{r['probability']:.2f}"
        out.append(f"  | {name} | {r['panel_bracket'][0]} -> {r['panel_bracket'][1]} | {interval} | {tokens} | "
                   f"{r['evaluations']} / {r['inside_bracket']} | {probability} | {certainty} |")
    return out + [""]


def _heads(names: list[str] | None) -> str:
    return "-" if names is None else ", ".join(names) or "none"


def dtype_line(d: dict, published_here: bool) -> str:
    """Which dtype the numbers come from, against the study's, and what rounding can move."""
    errors = "; ".join(f"{dtype} moves a selectivity by up to {100 * e:.2g}%" for dtype, e in d["relative_error"].items())
    near = (f" ({errors}: heads within that of a threshold are listed as near a threshold, docs/dtype_error_cpu.json)"
            if errors else "")
    if published_here:
        return f"- **Dtype**: the study's numbers, computed in {d['reference_dtype']}{near}."
    if d["differs"]:
        return (f"- **Dtype**: these runs used {', '.join(d['dtypes'])}, the study {d['reference_dtype']}: they match "
                f"its published numbers only up to both dtypes' rounding{near}.")
    return f"- **Dtype**: {', '.join(d['dtypes']) or 'unknown'}" + (
        f", as the study ran it{near}." if d["reference_dtype"] else f"{near}.")


def render(findings: dict, conclusions: list[dict], figures: list[str], reference: bool) -> str:
    th = findings["thresholds"]
    out = [f"# Panel report\n",
           f"Thresholds: class / BOS membership >= {th['class']:g}x baseline, induction circuit >= "
           f"{th['circuit']:g}x" + (f"; Gu et al.'s Sink_0 at key-0 importance > {th['sink_epsilon']:g}"
                                    if any(f.get("sinks_gu") for f in findings["models"].values()) else "")
           + f". Input: {'the reference study data' if reference else 'run directories'}.\n",
           "How to read the numbers: a milestone first seen at a revision happened after the revision "
           "before it and by its own, so each comes with that bracket in tokens, `(before, at]`. "
           + ("Intervals need run directories (their per-sequence attentions): on this input only the "
              "brackets apply.\n" if not any(f.get("intervals") for f in findings["models"].values()) else
              f"Intervals are {findings['intervals']['ci']:.0%} percentile bootstrap intervals over the probe's "
              f"sequences ({findings['intervals']['n_boot']} replicates, one resample matrix for every "
              "revision); `P` is the share of replicates in which that revision is the milestone.\n")]
    for model, f in findings["models"].items():
        pub = reference and model in published.BOS_FRACTION
        out.append(f"## {model}\n")
        head = "| revision | tokens | BOS % | induction heads | recall | top-k recall |"
        sep = "|---|---|---|---|---|---|"
        if pub:
            head += " published BOS % | published induction |"
            sep += "---|---|"
        if any("icl_score" in r for r in f["revisions"]):
            head += " in-context score |"
            sep += "---|"
        near = any(r["near_threshold"] is not None for r in f["revisions"])
        if near:
            head += " near a threshold |"
            sep += "---|"
        out += [head, sep]
        for i, r in enumerate(f["revisions"]):
            row = (f"| {r['revision']}{' (refinement)' if r['refined'] else ''} | {format_tokens(r['tokens'])} | {100 * r['bos_fraction']:.1f} | {r['n_induction']} | "
                   f"{_pct(r['induction_recall'])} | {_pct(r['topk_recall'])} |")
            if pub and i < len(published.BOS_FRACTION[model]):
                row += f" {published.BOS_FRACTION[model][i]} | {published.N_INDUCTION[model][i]} |"
            if "icl_score" in r:
                row += f" {r['icl_score']:.2f} |"
            if near:
                row += f" {_heads(r['near_threshold'])} |"
            out.append(row)
        f1, f2, f3, f4 = f["f1"], f["f2"], f["f3"], f["f4"]
        out.append("")
        if f["dtype"]:
            out.append(dtype_line(f["dtype"], pub))
        for same in f["identical_weights"]:
            out.append(f"- **Identical weights**: {' = '.join(same)} have the same weights (weights_sha256): "
                       "at most one of them is the checkpoint its name says; check the repo before reading trends.")
        if f["null_floor"]:
            out.append(null_floor(f["null_floor"], len(f["revisions"])))
        out.append(f"- **F1 zero-BOS layers**: layers with no BOS head at any revision: "
                   f"{f1['zero_bos_layers'] or 'none'}.")
        if f2["largest_jump"]:
            share_ci = f" (CI {_range(f2['jump_share_ci'], _pct)})" if "jump_share_ci" in f2 else ""
            final_ci = f" (CI {_range(f2['final_bos_fraction_ci'], _pct)})" if "final_bos_fraction_ci" in f2 else ""
            text = (f"- **F2 shape**: {f2['shape']}; largest adjacent rise {f2['largest_jump_pp']:+.1f} pp "
                    f"({f2['largest_jump'][0]} -> {f2['largest_jump'][1]}), {_pct(f2['jump_share'])}{share_ci} of "
                    f"the rise to the final {_pct(f2['final_bos_fraction'])}{final_ci}; "
                    f"{'monotonic' if f2['monotonic'] else 'not monotonic (largest drop %.1f pp)' % f2['largest_drop_pp']}."
                    + (f" Note: {f2['shape_note']}." if "shape_note" in f2 else ""))
            if pub:
                text += (f" Published: {published.SHAPE[model]}, {published.LARGEST_JUMP_PP[model]:+.1f} pp, "
                         f"{published.JUMP_SHARE[model]:.0%} of the rise.")
            out.append(text)
        text = (f"- **F3 separation**: induction onset (>= 3 heads) {_m(f3['induction_onset'])}; BOS 10/30/50/70%: "
                f"{', '.join(_m(f3[f'bos_{p}']) for p in (10, 30, 50, 70))}; gap BOS-50% / onset = "
                f"{'-' if f3['gap_ratio'] is None else '%.1fx' % f3['gap_ratio']}"
                + ("" if f3["gap_ratio_range"] is None else
                   f" (range over the brackets {_range(f3['gap_ratio_range'], lambda x: f'{x:.1f}x')})") + ".")
        if pub:
            gap = published.GAP_RATIO[model]
            text += (f" Published: onset {format_tokens(published.ONSET_B[model] * 1e9)}, "
                     f"BOS-50% {format_tokens(published.BOS_50_B[model] * 1e9)}"
                     + (f", gap {gap}x." if gap else " (Pythia: both ~6B, below the panel's resolution)."))
        out.append(text)
        if f.get("sinks_gu"):
            out += sinks_two_ways(f["sinks_gu"], f["revisions"])
        if f.get("refined"):
            out += refined_milestones(f["refined"])
        frac = lambda m: "" if m is None else f", {100 * m['fraction_of_training']:.1f}% of training"  # noqa: E731
        text = (f"- **F4 early convergence** (final circuit {', '.join(f4['final_circuit']) or 'empty'}; recall = "
                f"share of it at >= {th['class']:g}x): 1/3 at {_m(f4['recall_33'])}{frac(f4['recall_33'])}; "
                f"2/3 at {_m(f4['recall_67'])}{frac(f4['recall_67'])}; all at {_m(f4['recall_100'])}"
                f"{frac(f4['recall_100'])}; top-k recall 2/3 at {_m(f4['topk_recall_67'])}.")
        if pub:
            text += (f" Published 67%: {format_tokens(published.RECALL_67_B[model] * 1e9)} (the study's 33% and 100% rows follow no "
                     f"single definition; ours are the definition above).")
        out.append(text)
        f5 = f["f5"]
        lines = []
        for name, h in f5["heads"].items():
            if h["lead"] is not None:
                lines.append(f"{name}: PR rise at {_m(h['pr_rise'])}, selectivity >= {th['circuit']:g}x at "
                             f"{_m(h['selectivity_cross'])}: lead {h['lead']:.1f}x")
            else:
                lines.append(f"{name}: no lead ({h.get('reason')})")
        text = f"- **F5 PR leads selectivity** ({f5['pr_estimator'] or 'no PR'}): " + ("; ".join(lines) or "no heads.")
        if pub and model in published.F5_LEAD:
            text += " Published: " + ", ".join(f"{h} ~{v}x" for h, v in published.F5_LEAD[model].items()) + "."
        out.append(text)
        ranking = f["pr_integral_ranking"]
        if ranking:
            out.append(f"- **PR-integral ranking**: of the top {ranking['top_k']} heads by the integral of PR over "
                       f"log tokens, {_pct(ranking['classified_share'])} are classified by the screen at the last "
                       f"revision ({_pct(ranking['induction_share'])} as induction members).")
        out.append("")
    for family, entry in findings.get("seeds", {}).items():
        out.append(f"## Across training seeds: {family} ({len(entry['seeds'])} seeds)\n")
        out += ["| milestone | reached in | median | range | per seed |", "|---|---|---|---|---|"]
        for milestone, m in entry.items():
            if milestone == "seeds":
                continue
            per_seed = ", ".join(f"{name.rsplit('-', 1)[-1]}: {format_tokens(t) if t is not None else 'never'}"
                                 for name, t in m["per_seed"].items())
            span = "-" if m["range"] is None else f"{format_tokens(m['range'][0])} to {format_tokens(m['range'][1])}"
            median = "-" if m["median"] is None else format_tokens(m["median"])
            out.append(f"| {milestone} | {m['reached']}/{len(entry['seeds'])} | {median} | {span} | {per_seed} |")
        out.append("")
    out.append("## Threshold sensitivity\n")
    out.append(f"Recomputed from the stored per-head selectivities at {GRID_POINTS} x {GRID_POINTS} "
               f"(class / BOS, circuit) thresholds, log-spaced over {GRID_RANGE[0]:g}-{GRID_RANGE[1]:g}x on both "
               "axes (`sensitivity.csv`: what each finding gives and concludes at every setting; "
               "`sensitivity.png`: where each conclusion holds). *Flips*: where the conclusion changes along "
               "each axis through the report's thresholds.\n")
    out += ["| model | conclusion | at the report's thresholds | share of the grid | flips |", "|---|---|---|---|---|"]
    out += [f"| {c['model']} | {c['conclusion']} | {'yes' if c['holds_at_report_thresholds'] else 'no'} | "
            f"{_pct(c['share'])} | {c['flips']} |" for c in conclusions]
    if findings.get("causal_threshold"):
        out += ["", *causal_threshold(findings["causal_threshold"])]
    out.append("\n## Figures\n")
    out += [f"![{name}]({name})" for name in figures]
    return "\n".join(out) + "\n"
