"""The five panel findings of docs/method.md section 7, as pure functions of a Trajectory.

Definitions (thresholds are arguments; the defaults are docs/method.md section 4's):
* BOS fraction: heads with first-token selectivity >= ``class_threshold`` / all heads.
* Induction heads: induction selectivity >= ``circuit_threshold``.
* F1: layers with no BOS head at any revision.
* F2: largest adjacent rise of the BOS fraction, its share of the total rise (the final
  fraction: a model starts from none at initialisation), monotonicity, shape
  ("abrupt" when the largest jump is at least half of the total rise).
* F3: first revision with >= 3 induction heads (onset) and with BOS fraction >= 10, 30,
  50, 70 %; gap ratio = tokens(BOS 50 %) / tokens(onset).
* F4: recall of the final induction circuit (heads >= circuit threshold at the last
  revision): share of its heads whose induction selectivity is >= the class threshold.
  First revisions with recall >= 1/3, 2/3, 1; also top-k recall (k = circuit size).
* Sinks two ways (``sinks_gu``, where the runs measured it): Gu et al.'s Sink_0, the share
  of (sequence, layer, head) whose key-0 importance exceeds ``sink_epsilon``, per revision
  and per layer, with F1-F3 recomputed under it and the places where it and the BOS
  fraction disagree.
* F5: per final circuit head, the first revision where PR reaches 2x its first-revision
  value and the first where induction selectivity reaches the circuit threshold; the
  lead is the ratio of their token counts.

Every milestone carries ``bracket_tokens`` (it happened after the revision before and by
its own), F3 the range of its gap ratio over the brackets; from run directories, a
bootstrap over sequences (``uncertainty.py``) adds intervals and, per milestone, the
probability of each revision being it; F2 then calls a rise abrupt only if its share
holds at the interval's lower bound.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from emergence.config import StatsConfig, ThresholdConfig
from emergence.report.panel import Trajectory
from emergence.report.uncertainty import Replicates, bracket, first_crossing_probability, ratio_range, replicates
from emergence.screen import CLASSES, DTYPE_RELATIVE_ERROR, class_thresholds, head_name, near_threshold
from emergence.stats import NULL_RULES, interval

INDUCTION = CLASSES.index("induction")
BOS = CLASSES.index("bos")
ONSET_HEADS = 3
BOS_MILESTONES = (10, 30, 50, 70)
RECALL_MILESTONES = {"recall_33": Fraction(1, 3), "recall_67": Fraction(2, 3), "recall_100": Fraction(1)}
PR_RISE_FACTOR = 2.0
ABRUPT_SHARE = 0.5


def _milestone(traj: Trajectory, index: int | None, total_tokens: float | None = None,
               reached: np.ndarray | None = None) -> dict | None:
    """The milestone at revision ``index`` with its bracket; ``reached`` [replicates, revisions]
    (bool, from the bootstrap) adds the probability of each revision being the first crossing."""
    out = None
    if index is not None:
        c = traj.checkpoints[index]
        out = {"revision": c.revision, "tokens": c.tokens, "bracket_tokens": bracket(traj.tokens, index)}
        if total_tokens:
            out["fraction_of_training"] = c.tokens / total_tokens
    if reached is not None:
        probability = first_crossing_probability(reached, [c.revision for c in traj.checkpoints])
        out = {**(out or {"revision": None, "tokens": None, "bracket_tokens": None}), "probability": probability}
    return out


def _first(mask) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def bos_fractions(traj: Trajectory, class_threshold: float) -> np.ndarray:
    return (traj.sel[..., BOS] >= class_threshold).mean(axis=(1, 2))


def induction_counts(traj: Trajectory, circuit_threshold: float) -> np.ndarray:
    return (traj.sel[..., INDUCTION] >= circuit_threshold).sum(axis=(1, 2))


def final_circuit(traj: Trajectory, circuit_threshold: float) -> list[tuple[int, int]]:
    return [tuple(map(int, lh)) for lh in np.argwhere(traj.checkpoints[-1].sel[..., INDUCTION] >= circuit_threshold)]


def recall(traj: Trajectory, class_threshold: float, circuit_threshold: float) -> tuple[list, list]:
    """(recall, top-k recall) per revision, as Fractions (None when the final circuit is empty)."""
    circuit = final_circuit(traj, circuit_threshold)
    if not circuit:
        return [None] * len(traj.checkpoints), [None] * len(traj.checkpoints)
    k = len(circuit)
    members = set(circuit)
    rec, topk = [], []
    for c in traj.checkpoints:
        ind = c.sel[..., INDUCTION]
        rec.append(Fraction(sum(ind[l, h] >= class_threshold for l, h in circuit), k))
        order = np.argsort(-ind, axis=None, kind="stable")[:k]
        top = {tuple(map(int, np.unravel_index(i, ind.shape))) for i in order}
        topk.append(Fraction(len(top & members), k))
    return rec, topk


def sink_fractions(traj: Trajectory, epsilon: float) -> np.ndarray | None:
    """Gu et al.'s Sink_0 share per revision, or None unless every revision measured key-0 importance."""
    if any(c.sink_importance is None for c in traj.checkpoints):
        return None
    return np.array([(c.sink_importance > epsilon).mean() for c in traj.checkpoints])


def milestone_reached(traj: Trajectory, class_threshold: float, circuit_threshold: float,
                      sink_epsilon: float = ThresholdConfig.sink_epsilon) -> dict[str, np.ndarray]:
    """Per milestone (F3's ``induction_onset`` and ``bos_<p>``, F4's ``recall_<p>``, and Gu et al.'s
    ``sink_<p>`` where measured): whether each revision has reached it, [revisions] bool. A
    milestone is the first revision where this is true."""
    bos = bos_fractions(traj, class_threshold)
    rec, _ = recall(traj, class_threshold, circuit_threshold)
    reached = {"induction_onset": induction_counts(traj, circuit_threshold) >= ONSET_HEADS}
    reached.update({f"bos_{pct}": bos >= pct / 100 - 1e-12 for pct in BOS_MILESTONES})
    reached.update({name: np.array([r is not None and r >= level for r in rec], dtype=bool)
                    for name, level in RECALL_MILESTONES.items()})
    sink = sink_fractions(traj, sink_epsilon)
    if sink is not None:
        reached.update({f"sink_{pct}": sink >= pct / 100 - 1e-12 for pct in BOS_MILESTONES})
    return reached


def f2_shape(fractions: np.ndarray, revisions: list[str], replicated: np.ndarray | None = None,
             ci: float = StatsConfig.ci, name: str = "bos_fraction") -> dict:
    """The shape of a sink fraction's rise (``name``: which one, for the keys); with its bootstrap
    replicates ``replicated`` [replicates, revisions], "abrupt" needs the share's lower bound >= 1/2."""
    jumps = np.diff(fractions)
    total_rise = float(fractions[-1])
    if len(jumps) == 0 or total_rise <= 0:  # nothing rose: no jump to speak of
        return {"largest_jump_pp": None, "largest_jump": None, "jump_share": None, "monotonic": True,
                "shape": None, f"final_{name}": total_rise}
    i = int(np.argmax(jumps))
    share = float(jumps[i] / total_rise)
    out = {
        "largest_jump_pp": 100 * float(jumps[i]),
        "largest_jump": [revisions[i], revisions[i + 1]],
        "jump_share": share,
        "monotonic": bool((jumps >= 0).all()),
        "largest_drop_pp": 100 * float(min(0.0, jumps.min())),
        "shape": "abrupt" if share >= ABRUPT_SHARE else "gradual",
        f"final_{name}": total_rise,
    }
    if replicated is not None:
        final = replicated[:, -1]
        shares = (replicated[:, i + 1] - replicated[:, i]) / np.where(final > 0, final, np.nan)
        out["jump_share_ci"] = interval(np.nan_to_num(shares, nan=0.0), ci)  # no final rise: no share
        out[f"final_{name}_ci"] = interval(final, ci)
        if out["shape"] == "abrupt" and out["jump_share_ci"][0] < ABRUPT_SHARE:
            out["shape"] = "gradual"
            out["shape_note"] = (f"the largest rise is {share:.0%} of the total at the point estimate but "
                                 f"{out['jump_share_ci'][0]:.0%} at the lower bound of its interval: not called abrupt")
    return out


def f5_leads(traj: Trajectory, circuit_threshold: float, reps: Replicates | None = None) -> dict:
    heads = {}
    have_pr = all(c.pr is not None for c in traj.checkpoints)
    for layer, head in final_circuit(traj, circuit_threshold):
        sel = traj.sel[:, layer, head, INDUCTION]
        cross = _first(sel >= circuit_threshold)
        reached = None if reps is None else reps.induction_sel[:, :, layer, head] >= circuit_threshold
        entry = {"selectivity_cross": _milestone(traj, cross, reached=reached), "pr_rise": None, "lead": None,
                 "selectivity": sel.tolist()}
        if not have_pr:
            entry["reason"] = "no PR trajectory for this model"
        else:
            pr = np.array([c.pr[layer, head] for c in traj.checkpoints])
            entry["pr"] = pr.tolist()
            rise = _first(pr[1:] >= PR_RISE_FACTOR * pr[0])
            rise = None if rise is None else rise + 1
            entry["pr_rise"] = _milestone(traj, rise)
            if rise is None:
                entry["reason"] = (f"PR never reaches {PR_RISE_FACTOR:g}x its first-revision value "
                                   f"({pr[0]:.3g}): no measurable rise (already high at the first revision?)")
            elif cross == 0:
                entry["reason"] = "selectivity already above threshold at the first revision: no measurable lead"
            else:
                entry["lead"] = traj.checkpoints[cross].tokens / traj.checkpoints[rise].tokens
        heads[head_name(layer, head)] = entry
    return {"heads": heads, "pr_estimator": traj.pr_estimator, "rise_factor": PR_RISE_FACTOR}


def pr_integral_ranking(traj: Trajectory, class_threshold: float, top_k: int = 45) -> dict | None:
    """Heads ranked by the integral of PR over log10(tokens) (trapezoid); the share of the
    top-k that the screen classifies (any class >= threshold) at the last revision."""
    if any(c.pr is None for c in traj.checkpoints) or len(traj.checkpoints) < 2:
        return None
    pr = np.stack([c.pr for c in traj.checkpoints])  # [revisions, layers, heads]
    x = np.log10(np.maximum(traj.tokens, 1.0))
    integral = ((pr[1:] + pr[:-1]) / 2 * np.diff(x)[:, None, None]).sum(0)
    k = min(top_k, integral.size)
    order = np.argsort(-integral, axis=None, kind="stable")[:k]
    top = [tuple(map(int, np.unravel_index(i, integral.shape))) for i in order]
    final = traj.checkpoints[-1].sel
    classified = [bool((final[l, h] >= class_threshold).any()) for l, h in top]
    return {"top_k": k, "heads": [head_name(l, h) for l, h in top],
            "classified_share": float(np.mean(classified)),
            "induction_share": float(np.mean([final[l, h, INDUCTION] >= class_threshold for l, h in top]))}


def second_sink_definition(traj: Trajectory, epsilon: float, bos_findings: dict, onset: int | None,
                           reps: Replicates | None = None) -> dict | None:
    """Gu et al.'s Sink_0 (``emergence/sinks.py``) beside the BOS fraction: its trajectory, F1-F3
    under it, and where the two definitions disagree (``bos_findings``: the BOS fraction's f1, f2
    and f3). None unless every revision measured it (run directories)."""
    fraction = sink_fractions(traj, epsilon)
    if fraction is None:
        return None
    per_layer = np.array([(c.sink_importance > epsilon).mean(axis=(0, 2)) for c in traj.checkpoints])  # [revisions, layers]
    rep = None if reps is None else reps.sink_fraction
    names = [c.revision for c in traj.checkpoints]
    f3, crossings = {}, {}
    for pct in BOS_MILESTONES:
        crossings[pct] = _first(fraction >= pct / 100 - 1e-12)
        f3[f"sink_{pct}"] = _milestone(traj, crossings[pct], reached=None if rep is None else
                                       rep >= pct / 100 - 1e-12)
    f3["gap_ratio"] = (f3["sink_50"]["tokens"] / traj.checkpoints[onset].tokens
                       if crossings[50] is not None and onset is not None else None)
    f3["gap_ratio_range"] = ratio_range(crossings[50], onset, traj.tokens, traj.tokens)
    out = {
        "epsilon": float(epsilon),
        "definition": "share of (sequence, layer, head) whose key-0 importance (mean attention to key 0 over "
                      "every query that sees it) exceeds epsilon (Gu et al. 2024)",
        "revisions": [{"revision": c.revision, "tokens": c.tokens, "sink_fraction": float(fraction[i]),
                       "sink_per_layer": per_layer[i].tolist(),
                       **({} if rep is None else {"sink_fraction_ci": interval(rep[:, i], reps.ci)})}
                      for i, c in enumerate(traj.checkpoints)],
        "f1": {"zero_sink_layers": [int(l) for l in np.flatnonzero(per_layer.sum(0) == 0)]},
        "f2": f2_shape(fraction, names, name="sink_fraction") if rep is None else
        f2_shape(fraction, names, rep, reps.ci, name="sink_fraction"),
        "f3": f3,
    }
    out["disagreements"] = definitions_disagree(bos_findings, out)
    return out


def definitions_disagree(bos: dict, sink: dict) -> list[str]:
    """Where the BOS fraction (``bos``: a model's f1-f3) and Sink_0 (``sink``) tell different stories."""
    out = []
    if bos["f1"]["zero_bos_layers"] != sink["f1"]["zero_sink_layers"]:
        out.append(f"F1: layers without sinks at any revision are {bos['f1']['zero_bos_layers'] or 'none'} by the BOS "
                   f"fraction but {sink['f1']['zero_sink_layers'] or 'none'} by Sink_0")
    if bos["f2"]["shape"] != sink["f2"]["shape"]:
        out.append(f"F2: the rise is {bos['f2']['shape'] or 'absent'} by the BOS fraction but "
                   f"{sink['f2']['shape'] or 'absent'} by Sink_0")
    for pct in BOS_MILESTONES:
        at_bos, at_sink = ((m or {}).get("revision") for m in (bos["f3"][f"bos_{pct}"], sink["f3"][f"sink_{pct}"]))
        if at_bos != at_sink:
            out.append(f"F3: {pct}% is first reached at {at_bos or 'no revision'} by the BOS fraction but at "
                       f"{at_sink or 'no revision'} by Sink_0")
    return out


def identical_weights(traj: Trajectory) -> list[list[str]]:
    """Groups of revisions whose weights fingerprints (``weights_sha256``) are equal: at most one
    of each group can be the checkpoint its name says (Pythia-2.8b, BLOOM and OLMo have served such)."""
    groups: dict[str, list[str]] = {}
    for c in traj.checkpoints:
        if c.extras.get("weights_sha256"):
            groups.setdefault(c.extras["weights_sha256"], []).append(c.revision)
    return [revisions for revisions in groups.values() if len(revisions) > 1]


def near_threshold_heads(c, class_threshold: float, circuit_threshold: float) -> list[str] | None:
    """The heads of checkpoint ``c`` that its dtype's rounding could flip at these thresholds
    (``screen.near_threshold``); None when its dtype is not known."""
    if c.extras.get("dtype") not in DTYPE_RELATIVE_ERROR:
        return None
    near = near_threshold(c.sel, class_thresholds(class_threshold), circuit_threshold,
                          DTYPE_RELATIVE_ERROR[c.extras["dtype"]])
    return [head_name(l, h) for l, h in np.argwhere(near)]


def dtype_note(revisions: list[dict]) -> dict | None:
    """The dtypes the revisions ran in against the study's (None: neither known)."""
    used = sorted({r["dtype"] for r in revisions if "dtype" in r})
    reference = sorted({r["reference_dtype"] for r in revisions if "reference_dtype" in r})
    if not used and not reference:
        return None
    return {"dtypes": used, "reference_dtype": reference[0] if len(reference) == 1 else None,
            "differs": bool(reference) and used != reference,
            "relative_error": {d: DTYPE_RELATIVE_ERROR[d] for d in used if d in DTYPE_RELATIVE_ERROR}}


def null_floors(traj: Trajectory) -> dict | None:
    """The null floors the runs report (``summary.json`` ``null``; the panel computes none): per
    rule its definition and revisions, the floors' range, and each set-aside head's revisions.
    None without runs' nulls (the reference study's data)."""
    nulls = {c.revision: c.extras["null"] for c in traj.checkpoints if "null" in c.extras}
    if not nulls:
        return None
    rules: dict[str, list[str]] = {}
    set_aside: dict[str, list[str]] = {}
    for revision, null in nulls.items():
        # a summary without a rule was written before stats.null_rule: the reference rule made its floor
        rules.setdefault(null.get("rule", "reference"), []).append(revision)
        for head in null.get("set_aside", {}):
            set_aside.setdefault(head, []).append(revision)
    floors = [null["floor"] for null in nulls.values() if null["floor"] is not None]
    return {"rules": {rule: {"definition": NULL_RULES[rule], "revisions": revisions} for rule, revisions in rules.items()},
            "floor_range": [min(floors), max(floors)] if floors else None, "set_aside": set_aside}


def mark_near_threshold(milestone: dict | None, revisions: list[dict]) -> None:
    """Add to a milestone the heads near a threshold (``near_threshold``, by the runs' dtypes) at its
    revision or the one before: a rounding of them could move it by a revision. Nothing where
    the milestone was not reached or the dtypes are not known."""
    if not milestone or milestone["revision"] is None:
        return
    k = next(i for i, r in enumerate(revisions) if r["revision"] == milestone["revision"])
    near = [r["near_threshold"] for r in revisions[max(k - 1, 0):k + 1] if r["near_threshold"] is not None]
    heads = sorted(set().union(*near))
    if heads:
        milestone["near_threshold_heads"] = heads


def model_findings(traj: Trajectory, class_threshold: float = ThresholdConfig.class_default,
                   circuit_threshold: float = ThresholdConfig.circuit, reps: Replicates | None = None,
                   sink_epsilon: float = ThresholdConfig.sink_epsilon) -> dict:
    """F1-F5 of one trajectory, and the sink findings under Gu et al.'s definition where the runs
    measured it; ``reps`` (its bootstrap at these thresholds) adds the intervals."""
    names = [c.revision for c in traj.checkpoints]
    total_tokens = traj.checkpoints[-1].tokens
    bos = bos_fractions(traj, class_threshold)
    per_layer = (traj.sel[..., BOS] >= class_threshold).sum(axis=2)  # [revisions, layers]
    n_ind = induction_counts(traj, circuit_threshold)
    rec, topk = recall(traj, class_threshold, circuit_threshold)
    revisions = [
        {"revision": c.revision, "tokens": c.tokens, "bos_fraction": float(bos[i]),
         "bos_per_layer": per_layer[i].tolist(), "n_induction": int(n_ind[i]),
         "induction_recall": None if rec[i] is None else float(rec[i]),
         "topk_recall": None if topk[i] is None else float(topk[i]), "refined": c.refined,
         "near_threshold": near_threshold_heads(c, class_threshold, circuit_threshold), **c.extras}
        for i, c in enumerate(traj.checkpoints)
    ]
    circuit = final_circuit(traj, circuit_threshold)
    if reps is not None:
        for i, r in enumerate(revisions):
            r["bos_fraction_ci"] = reps.interval(reps.bos_fraction[:, i])
            r["n_induction_ci"] = reps.interval(reps.n_induction[:, i])
        # Recall of the final circuit in each replicate: the share of its heads above the class threshold.
        rep_recall = (np.stack([reps.induction_sel[:, :, l, h] for l, h in circuit], -1) >= class_threshold
                      ).mean(-1) if circuit else None
    reached = milestone_reached(traj, class_threshold, circuit_threshold, sink_epsilon)
    onset = _first(reached["induction_onset"])
    f3 = {"induction_onset": _milestone(traj, onset, reached=None if reps is None else
                                        reps.n_induction >= ONSET_HEADS)}
    crossings = {}
    for pct in BOS_MILESTONES:
        crossings[pct] = _first(reached[f"bos_{pct}"])
        f3[f"bos_{pct}"] = _milestone(traj, crossings[pct], reached=None if reps is None else
                                      reps.bos_fraction >= pct / 100 - 1e-12)
    f3["gap_ratio"] = (f3["bos_50"]["tokens"] / f3["induction_onset"]["tokens"]
                       if crossings[50] is not None and onset is not None else None)
    f3["gap_ratio_range"] = ratio_range(crossings[50], onset, traj.tokens, traj.tokens)
    f4 = {name: _milestone(traj, _first(reached[name]), total_tokens,
                           reached=None if reps is None or not circuit else rep_recall >= float(level) - 1e-12)
          for name, level in RECALL_MILESTONES.items()}
    f4["topk_recall_67"] = _milestone(traj, _first([r is not None and r >= Fraction(2, 3) for r in topk]),
                                      total_tokens)
    f4["final_circuit"] = [head_name(l, h) for l, h in circuit]
    for milestone in [*(f3[k] for k in f3 if not k.startswith("gap")), *(f4[k] for k in RECALL_MILESTONES)]:
        mark_near_threshold(milestone, revisions)
    f1 = {"zero_bos_layers": [int(l) for l in np.flatnonzero(per_layer.sum(0) == 0)]}
    f2 = f2_shape(bos, names) if reps is None else f2_shape(bos, names, reps.bos_fraction, reps.ci)
    return {
        "revisions": revisions,
        "f1": f1,
        "f2": f2,
        "f3": f3,
        "sinks_gu": second_sink_definition(traj, sink_epsilon, {"f1": f1, "f2": f2, "f3": f3}, onset, reps),
        "f4": f4,
        "f5": f5_leads(traj, circuit_threshold, reps),
        "pr_integral_ranking": pr_integral_ranking(traj, class_threshold),
        "intervals": reps is not None,
        "identical_weights": identical_weights(traj),
        "dtype": dtype_note(revisions),
        "null_floor": null_floors(traj),
    }


SEED_MILESTONES = {"induction_onset": ("f3", "induction_onset"), **{f"bos_{p}": ("f3", f"bos_{p}")
                                                                     for p in BOS_MILESTONES},
                   **{name: ("f4", name) for name in RECALL_MILESTONES}}


def across_seeds(trajectories: dict[str, Trajectory], models: dict[str, dict]) -> dict:
    """Per model trained from several seeds: each milestone's median and range over the seeds."""
    families: dict[str, list[str]] = {}
    for name, traj in trajectories.items():
        if traj.family is not None:
            families.setdefault(traj.family, []).append(name)
    out = {}
    for family, names in families.items():
        entry = {"seeds": names}
        for milestone, (finding, key) in SEED_MILESTONES.items():
            tokens = {n: (models[n][finding][key] or {}).get("tokens") for n in names}
            reached = [t for t in tokens.values() if t is not None]
            entry[milestone] = {"per_seed": tokens, "reached": len(reached),
                                "median": float(np.median(reached)) if reached else None,
                                "range": [min(reached), max(reached)] if reached else None}
        out[family] = entry
    return out


def panel_findings(trajectories: dict[str, Trajectory], class_threshold: float = ThresholdConfig.class_default,
                   circuit_threshold: float = ThresholdConfig.circuit, intervals: bool = True,
                   sink_epsilon: float = ThresholdConfig.sink_epsilon) -> dict:
    """F1-F5 per trajectory (with the bootstrap where run directories allow it) and across seeds."""
    models = {m: model_findings(t, class_threshold, circuit_threshold,
                                replicates(t, class_threshold, circuit_threshold, sink_epsilon) if intervals else None,
                                sink_epsilon)
              for m, t in trajectories.items()}
    return {"thresholds": {"class": class_threshold, "circuit": circuit_threshold, "sink_epsilon": sink_epsilon},
            "intervals": {"n_boot": StatsConfig.n_boot, "ci": StatsConfig.ci, "seed": StatsConfig.seed,
                          "method": "percentile bootstrap over sequences, one resample matrix for all revisions"},
            "models": models, "seeds": across_seeds(trajectories, models)}
